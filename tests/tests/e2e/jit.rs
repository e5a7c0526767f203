//! JIT frames named from perf maps and jitdumps, with the real BPF program sampling real
//! JIT code: a synthetic C JIT in its own pid and mount namespaces, Node, and the JVM
//! (perf map written on ember's request over the attach protocol).
//!
//! Every test samples, so each holds [`sampling_lock`] and needs root (it returns early,
//! or fails under EMBER_REQUIRE_PRIVILEGED=1, without it).

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant};

use ember::proto::Profile;
use ember_tests::*;

/// Path of the fixture `jit_hog` (see `tests/fixtures/jit_hog.c`).
const JIT_HOG: &str = env!("FIXTURE_JIT_HOG");

/// A child whose stdout lines are read on a thread; killed on drop.
struct Spawned {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Spawned {
    fn new(cmd: &mut Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Self {
            child,
            stdin,
            lines,
        }
    }

    /// Waits for a line starting with `prefix`; returns the rest of it.
    fn wait_for(&self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    if let Some(rest) = l.strip_prefix(prefix) {
                        return rest.trim().to_owned();
                    }
                }
                Err(e) => panic!("no line starting {prefix:?} within {timeout:?}: {e}"),
            }
        }
    }

    fn go(&mut self) {
        let stdin = self.stdin.as_mut().expect("stdin");
        stdin.write_all(b"go\n").expect("write go");
        stdin.flush().expect("flush");
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `ember run` on a few pids with 2 s windows, an HTTP port and an optional config.
struct Run {
    ember: Ember,
    addr: String,
    data: PathBuf,
}

impl Run {
    fn start(dir: &Path, pids: &[u32], config: &str) -> Self {
        let data = dir.join("data");
        let ember = EmberRun::run(dir)
            .config(config)
            .args(["--window", "2s"])
            .data_dir(&data)
            .listen()
            .pids(pids)
            .spawn_attached(Duration::from_secs(15));
        let addr = ember.addr().to_owned();
        Self { ember, addr, data }
    }

    /// Scrapes /metrics, stops ember, and returns every window (each checked by
    /// pprof's CheckValid) and the metrics.
    fn finish(mut self) -> (Vec<Profile>, String) {
        let (status, metrics) = http_get(&self.addr, "/metrics").expect("scraping /metrics");
        assert_eq!(status, 200, "{metrics}");
        self.ember.signal(libc::SIGTERM);
        let status = self.ember.wait(Duration::from_secs(15));
        let stderr = self.ember.stderr();
        println!("--- ember stderr ---\n{stderr}---");
        assert!(status.success(), "ember exited {status}\n{stderr}");
        let mut files: Vec<PathBuf> = fs::read_dir(&self.data)
            .expect("data dir")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| ember_tests::is_cpu_window(p))
            .collect();
        files.sort();
        let profiles = files
            .iter()
            .map(|f| {
                pprofcheck(f);
                read_profile(f).expect("profile")
            })
            .collect();
        (profiles, metrics)
    }
}

/// Samples of `pid` over all windows whose stack has a frame matching `pred`, by the
/// first matching frame's (name, mapping).
fn frames_matching(
    profiles: &[Profile],
    pid: u32,
    pred: impl Fn(&str) -> bool,
) -> (HashMap<(String, String), i64>, i64) {
    let mut by = HashMap::new();
    let mut all = 0;
    for p in profiles {
        for s in stacks_of(p, pid) {
            all += s.count();
            if let Some(f) = s.frames.iter().find(|f| pred(&f.name)) {
                *by.entry((f.name.clone(), f.mapping.clone())).or_default() += s.count();
            }
        }
    }
    (by, all)
}

/// The tolerance on a 70/30 split measured over `n` samples: 5 points, or 3 sigma of the
/// binomial noise when that is more (a busy machine preempts the fixture at random, so its
/// time-sliced split is no longer locked to the sampling period).
fn split_tolerance(n: i64) -> f64 {
    let sigma = 100.0 * (0.7 * 0.3 / n.max(1) as f64).sqrt();
    (3.0 * sigma).max(5.0)
}

fn share(by: &HashMap<(String, String), i64>, pred: impl Fn(&str) -> bool) -> (i64, f64) {
    let total: i64 = by.values().sum();
    let n: i64 = by
        .iter()
        .filter(|((name, _), _)| pred(name))
        .map(|(_, v)| *v)
        .sum();
    (n, 100.0 * n as f64 / total.max(1) as f64)
}

/// Starts `jit_hog MODE` in new pid and mount namespaces with its own /tmp.
/// Returns the process and its host pid; its namespace pid is checked to differ.
fn namespaced_jit_hog(mode: &str) -> (Spawned, u32) {
    // The fresh tmpfs is filled on /mnt and then moved onto /tmp: mounting it on /tmp
    // directly would hide the fixture itself when the checkout lives under /tmp.
    let script = format!(
        "mount -t tmpfs ember-test /mnt && cp {JIT_HOG} /mnt/jit_hog && mount --move /mnt /tmp \
         && exec /tmp/jit_hog {mode} --seconds 8 --wait-start --linger"
    );
    let hog = Spawned::new(Command::new("unshare").args([
        "--pid",
        "--mount",
        "--fork",
        "--kill-child",
        "sh",
        "-c",
        &script,
    ]));
    let nspid: u32 = hog
        .wait_for("pid ", Duration::from_secs(10))
        .parse()
        .expect("pid");
    let hostpid: u32 = hog
        .wait_for("hostpid ", Duration::from_secs(5))
        .parse()
        .expect("hostpid");
    assert_ne!(nspid, hostpid, "the fixture runs in its own pid namespace");
    let status = fs::read_to_string(format!("/proc/{hostpid}/status")).expect("status");
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("NSpid:") && l.ends_with(&format!("\t{nspid}"))),
        "{status}"
    );
    // Its files are in its own /tmp, not the host's.
    for f in [
        format!("/tmp/perf-{nspid}.map"),
        format!("/tmp/perf-{hostpid}.map"),
    ] {
        let host = fs::read_to_string(&f).unwrap_or_default();
        assert!(!host.contains("hot_a"), "{f} on the host has our names");
    }
    (hog, hostpid)
}

/// Synthetic JIT in its own namespaces: perf map and jitdump names, 70/30 shares, the
/// `[perf-map]`/`[jitdump]` mappings, jitdump's file:line, stacks walking through JIT code.
#[test]
fn synthetic_jit_in_namespaces_is_named_from_perf_map_and_jitdump() {
    if !require_privileged() {
        return;
    }
    if !cfg!(target_arch = "x86_64") {
        skip("the synthetic JIT emits x86-64 code");
        return;
    }
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut map_hog, map_pid) = namespaced_jit_hog("--perf-map");
    let (mut dump_hog, dump_pid) = namespaced_jit_hog("--jitdump");
    let run = Run::start(dir.path(), &[map_pid, dump_pid], "");
    map_hog.go();
    dump_hog.go();
    for h in [&map_hog, &dump_hog] {
        h.wait_for("done", Duration::from_secs(30));
    }
    // Let the last window with work close.
    thread::sleep(Duration::from_millis(2500));
    let (profiles, metrics) = run.finish();

    for (pid, prefix, mapping) in [
        (map_pid, "perfmap::", "[perf-map]"),
        (dump_pid, "jitdump::", "[jitdump]"),
    ] {
        let (by, all) = frames_matching(&profiles, pid, |n| n.starts_with(prefix));
        println!("pid {pid}: {all} samples; JIT frames {by:?}");
        let jit: i64 = by.values().sum();
        assert!(all > 150, "too few samples of pid {pid}: {all}");
        assert!(
            jit as f64 >= 0.9 * all as f64,
            "only {jit} of {all} samples of pid {pid} have a {prefix} frame: {by:?}"
        );
        assert!(
            by.keys().all(|(_, m)| m == mapping),
            "JIT frames of pid {pid} are not all in {mapping}: {by:?}"
        );
        let (_, a) = share(&by, |n| n == format!("{prefix}hot_a"));
        let tol = split_tolerance(jit);
        println!("pid {pid}: hot_a {a:.1}% (70 ± {tol:.1})");
        assert!(
            (a - 70.0).abs() <= tol,
            "{prefix}hot_a has {a:.1}%, not 70 ± {tol:.1}"
        );
        // The stack walks through the jitted frame into its C callers.
        let through = profiles
            .iter()
            .flat_map(|p| stacks_of(p, pid))
            .filter(|s| s.leaf().starts_with(prefix))
            .filter(|s| s.has("call_jit") && s.has("main"))
            .map(|s| s.count())
            .sum::<i64>();
        assert!(
            through as f64 >= 0.8 * jit as f64,
            "only {through} of {jit} JIT samples of pid {pid} reach call_jit and main"
        );
    }
    // jitdump's DEBUG_INFO: hot_a is hot.js line 7.
    let with_line = profiles.iter().any(|p| {
        p.location.iter().any(|l| {
            l.line.iter().any(|ln| {
                let f = &p.function[ln.function_id as usize - 1];
                string(p, f.name) == "jitdump::hot_a"
                    && string(p, f.filename) == "hot.js"
                    && ln.line == 7
            })
        })
    });
    assert!(with_line, "jitdump::hot_a has no hot.js:7 line");
    let jit_frames = series_value(&metrics, r#"ember_frames_total{result="jit"}"#);
    assert!(jit_frames > 0.0, "ember_frames_total{{result=\"jit\"}} = 0");
    // The perf map's garbage line was counted.
    assert!(series_value(&metrics, r#"ember_jit_rejects_total{reason="malformed"}"#) >= 1.0);
}

/// Node with --perf-basic-prof: JS function names and their 70/30 shares.
#[test]
fn node_functions_are_named_with_their_shares() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().expect("tempdir");
    let script = workspace_root().join("tests/fixtures/jit_hot.js");
    // In the tempdir: --perf-basic-prof also leaves a V8 log in the working directory.
    let node = Spawned::new(Command::new("node").current_dir(dir.path()).args([
        "--perf-basic-prof",
        "--interpreted-frames-native-stack",
        // Else TurboFan inlines both into the script's loop and they vanish as frames
        // (for any profiler): the test is about naming frames, not about V8's inliner.
        "--no-turbo-inlining",
        script.to_str().expect("utf-8"),
        "12",
    ]));
    let pid = node.child.id();
    node.wait_for("ready", Duration::from_secs(10));
    let run = Run::start(dir.path(), &[pid], "");
    // Sample about 8 s of the warm work.
    thread::sleep(Duration::from_secs(9));
    let (profiles, metrics) = run.finish();
    let _ = fs::remove_file(format!("/tmp/perf-{pid}.map"));
    // `JS:*hotA /path/jit_hot.js:8:14` (Node 20) or `LazyCompile:*hotA ...` (Node 18).
    let is_hot = |n: &str| n.contains("hotA ") || n.contains("hotB ");
    let (by, all) = frames_matching(&profiles, pid, is_hot);
    println!("node pid {pid}: {all} samples; {by:?}");
    let mut leaves: HashMap<String, i64> = HashMap::new();
    for s in profiles.iter().flat_map(|p| stacks_of(p, pid)) {
        let top: Vec<String> = s
            .frames
            .iter()
            .take(3)
            .map(|f| format!("{}@{}", f.name, f.mapping))
            .collect();
        *leaves.entry(top.join(" <- ")).or_default() += s.count();
    }
    let mut leaves: Vec<_> = leaves.into_iter().collect();
    leaves.sort_by_key(|l| -l.1);
    for (l, n) in leaves.iter().take(12) {
        println!("{n:6} {l}");
    }
    let jit: i64 = by.values().sum();
    assert!(
        jit as f64 >= 0.8 * all as f64,
        "only {jit} of {all} Node samples are in hotA/hotB: {by:?}"
    );
    assert!(by.keys().all(|(_, m)| m == "[perf-map]"), "{by:?}");
    let (_, a) = share(&by, |n| n.contains("hotA "));
    let tol = split_tolerance(jit);
    println!("hotA {a:.1}% (70 ± {tol:.1})");
    assert!(
        (a - 70.0).abs() <= tol,
        "hotA has {a:.1}%, not 70 ± {tol:.1}"
    );
    assert!(series_value(&metrics, r#"ember_frames_total{result="jit"}"#) > 0.0);
}

/// Compiles the Java fixture into `dir` with javac.
fn compile_java(dir: &Path) {
    let src = workspace_root().join("tests/fixtures/JitHot.java");
    let out = output_with_timeout(
        Command::new("javac").arg("-d").arg(dir).arg(&src),
        Duration::from_secs(60),
    )
    .expect("running javac (install openjdk-17-jdk-headless: make test-deps)");
    assert!(
        out.status.success(),
        "javac failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs the Java fixture under ember with `config`, as `uid` (through setpriv) when given;
/// returns the Java method frames found, all samples of the JVM, and ember's metrics.
fn java_frames(config: &str, uid: Option<u32>) -> (HashMap<(String, String), i64>, i64, String) {
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().expect("tempdir");
    compile_java(dir.path());
    let mut cmd = match uid {
        Some(uid) => {
            // The JVM must read its classes.
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
            let mut c = Command::new("setpriv");
            c.args([
                format!("--reuid={uid}"),
                format!("--regid={uid}"),
                "--clear-groups".into(),
                "java".into(),
            ]);
            c
        }
        None => Command::new("java"),
    };
    let java = Spawned::new(
        cmd.args(["-XX:+PreserveFramePointer", "-cp"])
            .arg(dir.path())
            .args(["JitHot", "14"]),
    );
    let pid = java.child.id();
    java.wait_for("ready", Duration::from_secs(20));
    let run = Run::start(dir.path(), &[pid], config);
    thread::sleep(Duration::from_secs(10));
    let (profiles, metrics) = run.finish();
    let _ = fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let (by, all) = frames_matching(&profiles, pid, |n| n.contains("JitHot.hot"));
    println!("java pid {pid}: {all} samples; {by:?}");
    (by, all, metrics)
}

/// The JVM rewrites its perf map when ember asks over the attach protocol: Java method
/// names appear with the refresh on, and not with it off. The JVM runs as an unprivileged
/// user (nobody), so ember must attach with the JVM's own uid/gid, as the JVM demands.
#[test]
fn java_methods_are_named_only_with_jvm_refresh_on() {
    if !require_privileged() {
        return;
    }
    let (by, all, metrics) = java_frames("jit:\n  jvm_perfmap_refresh: 2s\n", Some(65534));
    let ok = series_value(
        &metrics,
        r#"ember_jvm_perfmap_refreshes_total{result="ok"}"#,
    );
    assert!(ok >= 1.0, "no successful JVM refresh:\n{metrics}");
    let named: i64 = by.values().sum();
    assert!(
        named as f64 >= 0.5 * all as f64,
        "only {named} of {all} Java samples named JitHot.hotA/hotB: {by:?}"
    );
    assert!(by.keys().all(|(_, m)| m == "[perf-map]"), "{by:?}");
    assert!(by.keys().any(|(n, _)| n.contains("JitHot.hotA")), "{by:?}");

    let (by, all, _) = java_frames("", None);
    assert!(all > 100, "the JVM was sampled ({all} samples)");
    assert!(
        by.is_empty(),
        "Java methods named without the refresh: {by:?}"
    );
}
