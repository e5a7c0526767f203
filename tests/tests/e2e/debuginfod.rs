//! debuginfod (issue 29): a stripped program's frames are named from its debug file, served
//! by a real `debuginfod` (Debian's package) over a directory, within a few windows; the
//! servers asked before it are hostile: one accepts and never answers, one returns another
//! program's debug file (a wrong build id), one streams zeros without end, one port has
//! nothing listening (a stopped server). Windows keep closing on time, every hostile answer
//! is counted, nothing is named from the wrong file, and the disk cache stays under its
//! cap. The real server is then stopped: names stay, windows go on.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ember_tests::*;

/// Loops in a `static` function, named only in `.symtab` (gone once stripped).
const PROGRAM: &str = r#"
#include <stdio.h>
#include <unistd.h>
static unsigned long __attribute__((noinline)) NAME(unsigned long n) {
  volatile unsigned long x = 0;
  for (unsigned long i = 0; i < n; i++) x += i * 7;
  return x;
}
int main(void) {
  printf("pid %d\nready\n", (int)getpid());
  fflush(stdout);
  for (;;) NAME(1000000);
}
"#;

/// The hostile servers: `hang` accepts and never answers; `wrong` answers every request
/// with the file given; `zeros` streams zeros (1 GiB, no length) to whoever asks.
const SERVER: &str = r#"
import http.server, socket, sys, time
mode, port = sys.argv[1], int(sys.argv[2])
if mode == "record":
    class R(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def do_GET(self):
            with open(sys.argv[3], "a") as f:
                f.write(self.path + "\n")
            self.send_response(404)
            self.end_headers()
    http.server.ThreadingHTTPServer.allow_reuse_address = True
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), R)
    print("ready", flush=True)
    srv.serve_forever()
if mode == "hang":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(64)
    print("ready", flush=True)
    held = []
    while True:
        c, _ = s.accept()
        held.append(c)
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        try:
            if mode == "wrong":
                self.wfile.write(open(sys.argv[3], "rb").read())
            else:
                block = bytes(1 << 20)
                for _ in range(1024):
                    self.wfile.write(block)
        except OSError:
            pass
http.server.ThreadingHTTPServer.allow_reuse_address = True
srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
print("ready", flush=True)
srv.serve_forever()
"#;

/// Builds the program with `NAME` as its hot function; the stripped binary and its debug
/// file (`objcopy --only-keep-debug`).
fn build(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let src = dir.join(format!("{name}.c"));
    fs::write(&src, PROGRAM).expect("write source");
    let bin = dir.join(name);
    let debug = dir.join(format!("{name}.debug"));
    let run = |cmd: &mut Command| {
        let out = cmd.output().expect("run a build tool");
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(Command::new("gcc")
        .args([
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-Wl,--build-id=sha1",
        ])
        .arg(format!("-DNAME={name}"))
        .arg("-o")
        .arg(&bin)
        .arg(&src));
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&bin)
        .arg(&debug));
    run(Command::new("strip").arg("--strip-all").arg(&bin));
    (bin, debug)
}

/// The build id of `path` in hex, as `readelf -n` prints it.
fn build_id(path: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-n")
        .arg(path)
        .output()
        .expect("readelf");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| Some(l.split("Build ID:").nth(1)?.trim().to_owned()))
        .expect("a build id")
}

/// A child that is killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a hostile server; returns once it listens.
fn hostile(mode: &str, port: u16, file: &Path) -> Server {
    let mut child = Command::new("python3")
        .args(["-c", SERVER, mode, &port.to_string()])
        .arg(file)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    let out = child.stdout.take().expect("stdout");
    BufReader::new(out)
        .read_line(&mut line)
        .expect("ready line");
    assert_eq!(line.trim(), "ready", "{mode} server");
    Server(child)
}

/// The window files of `dir` that name `function` in the stacks of `pid`, and all of them.
fn windows_naming(dir: &Path, pid: u32, function: &str) -> (usize, usize) {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| ember_tests::is_cpu_window(p));
    let naming = files
        .iter()
        .filter_map(|p| read_profile(p).ok())
        .filter(|p| stacks_of(p, pid).iter().any(|s| s.has(function)))
        .count();
    (naming, files.len())
}

/// The distinct addresses of frames named `function` in `pid`'s stacks, over every window
/// of `dir`.
fn addresses_naming(dir: &Path, pid: u32, function: &str) -> std::collections::BTreeSet<u64> {
    fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default()
        .iter()
        .filter(|p| p.to_string_lossy().ends_with(".pb.gz"))
        .filter_map(|p| read_profile(p).ok())
        .flat_map(|p| stacks_of(&p, pid))
        .flat_map(|s| s.frames)
        .filter(|f| f.name == function)
        .map(|f| f.address)
        .collect()
}

#[test]
fn stripped_frames_are_named_from_debuginfod_past_hostile_servers() {
    if !require_privileged() {
        return;
    }
    if Command::new("debuginfod")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var("EMBER_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
            "debuginfod is not installed (make test-deps installs it)"
        );
        println!("skipped: debuginfod is not installed");
        return;
    }
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().expect("tempdir");
    let serve = dir.path().join("serve");
    fs::create_dir_all(&serve).expect("serve dir");
    let (bin, debug) = build(dir.path(), "debuginfod_hot_a");
    let (_, other_debug) = build(dir.path(), "wrongly_named_b");
    fs::rename(&debug, serve.join("a.debug")).expect("move the debug file");
    let id = build_id(&bin);

    // The real server, over the directory with the right debug file.
    let port = free_port();
    let real = Server(
        Command::new("debuginfod")
            .args(["-F", "-p", &port.to_string(), "--disable-source-scan", "-d"])
            .arg(dir.path().join("db.sqlite"))
            .arg(&serve)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("debuginfod"),
    );
    let real_addr = format!("127.0.0.1:{port}");
    let path = format!("/buildid/{id}/debuginfo");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(http_get(&real_addr, &path), Ok((200, _))) {
        assert!(Instant::now() < deadline, "debuginfod never served {path}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let _hang = hostile("hang", ports[0], &other_debug);
    let _wrong = hostile("wrong", ports[1], &other_debug);
    let _zeros = hostile("zeros", ports[2], &other_debug);
    // ports[3]: nothing listens (a stopped server).

    let data = dir.path().join("data");
    let cap: u64 = 32 << 20;
    let config = dir.path().join("ember.yaml");
    let urls: Vec<String> = ports
        .iter()
        .chain([&port])
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    fs::write(
        &config,
        format!(
            "symbols:\n  debuginfod_urls: {urls:?}\n  debuginfod_allow_http: true\n  \
             debuginfod_timeout: 2s\n  \
             debuginfod_max_file_bytes: 8388608\n  debuginfod_cache_bytes: {cap}\n"
        ),
    )
    .expect("config");
    let mut program = Fixture::spawn(bin.to_str().expect("utf-8"), &[]).expect("program");
    program
        .wait_for("ready", Duration::from_secs(10))
        .expect("ready");
    let addr = format!("127.0.0.1:{}", free_port());
    let started = Instant::now();
    let pid = program.pid.to_string();
    let mut ember = EmberRun::run(dir.path())
        .args([
            "-c",
            config.to_str().expect("utf-8"),
            "--pid",
            &pid,
            "--window",
            "2s",
            "--listen",
            &addr,
            "--data-dir",
            data.to_str().expect("utf-8"),
        ])
        .try_spawn()
        .expect("ember run");
    let fetched = r#"ember_debuginfod_requests_total{result="fetched"}"#;
    let text = metrics_until(&addr, Duration::from_secs(60), |t| {
        series_value(t, fetched) >= 1.0
    });
    // Named from the next window on: wait for two windows that name the function.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut naming, mut total) = (0, 0);
    while naming < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        (naming, total) = windows_naming(&data, program.pid, "debuginfod_hot_a");
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "fetched after the hostile servers; {naming} of {total} windows in {elapsed:.1} s name the function"
    );
    for result in ["timeout", "wrong_build_id", "too_large", "connect_error"] {
        let s = format!("ember_debuginfod_requests_total{{result=\"{result}\"}}");
        println!("{result}: {}", series_value(&text, &s));
        assert!(
            series_value(&text, &s) >= 1.0,
            "no {result} counted:\n{text}"
        );
    }
    assert!(
        naming >= 2,
        "the function is not named in two windows ({naming} of {total})"
    );
    // Windows kept closing while the worker waited on the silent server (2 s windows).
    assert!(
        total as f64 >= elapsed / 2.0 - 3.0,
        "{total} windows in {elapsed:.1} s: a window waited for the network"
    );
    let (wrong, _) = windows_naming(&data, program.pid, "wrongly_named_b");
    assert_eq!(
        wrong, 0,
        "a name came from the file with the wrong build id"
    );
    // Every address named after the file arrived was looked up once in its table, counted
    // as named by debuginfod; before, the stripped object's addresses were unnamed.
    let text = http_get(&addr, "/metrics").expect("metrics").1;
    let from = |source: &str| {
        series_value(
            &text,
            &format!("ember_symbols_total{{source=\"{source}\"}}"),
        )
    };
    let named = addresses_naming(&data, program.pid, "debuginfod_hot_a");
    println!(
        "symbols by source: debuginfod {}, none {}, symtab {}, dynsym {}; {} distinct \
         addresses named debuginfod_hot_a",
        from("debuginfod"),
        from("none"),
        from("symtab"),
        from("dynsym"),
        named.len()
    );
    assert!(
        !named.is_empty() && from("debuginfod") >= named.len() as f64,
        "ember_symbols_total{{source=\"debuginfod\"}} is {} for {} addresses named from it",
        from("debuginfod"),
        named.len()
    );
    assert!(
        from("none") >= 1.0,
        "no address was unnamed before the file arrived"
    );
    let held = series_value(&text, "ember_debuginfod_cache_bytes");
    assert!(
        held > 0.0 && held <= cap as f64,
        "disk cache holds {held} bytes (cap {cap})"
    );

    // The real server stops: windows go on, the names stay (from the disk cache).
    drop(real);
    let before = windows_naming(&data, program.pid, "debuginfod_hot_a");
    std::thread::sleep(Duration::from_secs(5));
    let after = windows_naming(&data, program.pid, "debuginfod_hot_a");
    assert!(
        after.1 > before.1,
        "no window closed after the server stopped"
    );
    assert!(after.0 > before.0, "the names went with the server");
    let (code, _) = http_get(&addr, "/healthz").expect("healthz");
    assert_eq!(code, 200);
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(20));
    assert!(
        status.success(),
        "ember exited {status}:\n{}",
        ember.stderr()
    );
}

/// `ember run` on a stripped program, its environment carrying `DEBUGINFOD_URLS` of a
/// server that records what it is asked, with `config`; how long it ran to see requests
/// (or none), the paths the server was asked, and ember's stderr.
fn run_with_env_urls(config: &str) -> (Vec<String>, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bin, _) = build(dir.path(), "env_urls_hot");
    let port = free_port();
    let asked = dir.path().join("asked");
    let _server = hostile("record", port, &asked);
    let cfg = dir.path().join("ember.yaml");
    fs::write(&cfg, config).expect("config");
    let mut program = Fixture::spawn(bin.to_str().expect("utf-8"), &[]).expect("program");
    program
        .wait_for("ready", Duration::from_secs(10))
        .expect("ready");
    let addr = format!("127.0.0.1:{}", free_port());
    let data = dir.path().join("data");
    let pid = program.pid.to_string();
    let ember = EmberRun::run(dir.path())
        .args([
            "-c",
            cfg.to_str().expect("utf-8"),
            "--pid",
            &pid,
            "--window",
            "1s",
        ])
        .listen_on(&addr)
        .data_dir(&data)
        .env("DEBUGINFOD_URLS", format!("http://127.0.0.1:{port}/"))
        .try_spawn()
        .expect("ember run");
    // Several windows with the stripped program's frames: time for a request to go out.
    let deadline = Instant::now() + Duration::from_secs(8);
    while Instant::now() < deadline && fs::read_to_string(&asked).is_err() {
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(1));
    let stderr = ember.stderr();
    drop(ember);
    let paths = fs::read_to_string(&asked)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect();
    (paths, stderr)
}

/// Issue 58 (3): `DEBUGINFOD_URLS` in ember's environment sends nothing unless the config
/// asks (`symbols.debuginfod_urls_from_env`, and `debuginfod_allow_http` for its
/// `http://`); when asked, the requests arrive and the start log names the server.
#[test]
fn the_environment_alone_sends_no_build_id() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let (paths, stderr) = run_with_env_urls("kubernetes:\n  enabled: false\n");
    assert!(
        paths.is_empty(),
        "asked without a config key: {paths:?}\n{stderr}"
    );
    assert!(
        stderr.contains("DEBUGINFOD_URLS is set but ignored"),
        "{stderr}"
    );
    // https:// only: the key alone does not admit an http:// server.
    let (paths, stderr) = run_with_env_urls(
        "kubernetes:\n  enabled: false\nsymbols:\n  debuginfod_urls_from_env: true\n",
    );
    assert!(paths.is_empty(), "asked over http://: {paths:?}\n{stderr}");
    let (paths, stderr) = run_with_env_urls(
        "kubernetes:\n  enabled: false\nsymbols:\n  debuginfod_urls_from_env: true\n  \
         debuginfod_allow_http: true\n",
    );
    println!("asked: {paths:?}");
    assert!(
        paths
            .iter()
            .any(|p| p.starts_with("/buildid/") && p.ends_with("/debuginfo")),
        "no request arrived: {paths:?}\n{stderr}"
    );
    let named = stderr
        .lines()
        .find(|l| l.contains("build ids of stripped objects"))
        .unwrap_or_else(|| panic!("no start line naming the servers:\n{stderr}"));
    assert!(named.contains("http://127.0.0.1:"), "{named}");
}
