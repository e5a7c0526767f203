//! Helpers shared by ember's end-to-end tests.
//!
//! The tests drive the real `ember` binary (`EMBER_BIN`, else
//! `target/release/ember`) against the fixture workloads in `tests/fixtures/`
//! (built by `build.rs`, paths in `FIXTURE_*`), and read what it writes with
//! [`ember::proto::Profile`].
//!
//! Agents are started with [`EmberRun`] and their `/metrics` read with [`series`] and
//! [`family`]; a test that cannot run here calls [`skip`].
//!
//! Tests that sample must hold [`sampling_lock`]: the CI machine has 2 cores and
//! sampling tests measure CPU shares and sample counts, so they run one at a time.

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use ember::proto::Profile;
use prost::Message;

pub mod completeness;
mod metrics;
pub mod perf;
mod run;

pub use metrics::*;
pub use run::{token_for, Ember, EmberRun};

/// Path of the fixture `cpu_hog` (see `tests/fixtures/cpu_hog.c`).
pub const CPU_HOG: &str = env!("FIXTURE_CPU_HOG");
/// Path of the fixture `syscall_hog`.
pub const SYSCALL_HOG: &str = env!("FIXTURE_SYSCALL_HOG");
/// Path of the fixture `short_lived`.
pub const SHORT_LIVED: &str = env!("FIXTURE_SHORT_LIVED");
/// No frame pointers, time in libc's qsort and memcpy (`tests/fixtures/nofp_qsort.c`).
pub const NOFP_QSORT: &str = env!("FIXTURE_NOFP_QSORT");
/// No frame pointers, C++ exceptions through a deep recursion (`nofp_cxx.cc`).
pub const NOFP_CXX: &str = env!("FIXTURE_NOFP_CXX");
/// Rust release build with rustc's default codegen (`nofp_rust.rs`).
pub const NOFP_RUST: &str = env!("FIXTURE_NOFP_RUST");
/// No frame pointers, a SIGPROF handler that burns CPU (`nofp_signal.c`).
pub const NOFP_SIGNAL: &str = env!("FIXTURE_NOFP_SIGNAL");
/// No frame pointers, half of its time in the vDSO's `clock_gettime` (`nofp_vdso.c`).
pub const NOFP_VDSO: &str = env!("FIXTURE_NOFP_VDSO");
/// No frame pointers, one ~30 ms process (`nofp_burst.c`), run in a loop by [`BURST_LAUNCHER`].
pub const NOFP_BURST: &str = env!("FIXTURE_NOFP_BURST");
/// Static launcher running a program again and again (`burst_launcher.c`).
pub const BURST_LAUNCHER: &str = env!("FIXTURE_BURST_LAUNCHER");

/// The sampling frequency ember uses by default.
pub const DEFAULT_HZ: f64 = 99.0;

/// Whether `path` names a CPU window file (`<start>Z.pb.gz`), not an off-CPU kind's
/// (`<start>Z.offcpu.pb.gz`, `.offwake.`, `.lock.`) or a file still being written (`.name`).
pub fn is_cpu_window(path: impl AsRef<Path>) -> bool {
    path.as_ref()
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with("Z.pb.gz") && !n.starts_with('.'))
}

/// Root of the Cargo workspace.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The ember binary under test: `$EMBER_BIN`, else `target/release/ember`.
pub fn ember_bin() -> PathBuf {
    let p = match std::env::var_os("EMBER_BIN") {
        Some(p) => PathBuf::from(p),
        None => workspace_root().join("target/release/ember"),
    };
    assert!(
        p.exists(),
        "ember binary {} does not exist: build it first (`make build`, or \
         `cargo build --release -p ember`) or set EMBER_BIN",
        p.display()
    );
    p
}

/// The Go pprof checker: `$EMBER_PPROFCHECK`, else `target/pprofcheck` (built by `make test`).
pub fn pprofcheck_bin() -> PathBuf {
    let p = match std::env::var_os("EMBER_PPROFCHECK") {
        Some(p) => PathBuf::from(p),
        None => workspace_root().join("target/pprofcheck"),
    };
    assert!(
        p.exists(),
        "the Go pprof checker {} does not exist: run `make test` (it builds \
         tests/pprofcheck) or set EMBER_PPROFCHECK",
        p.display()
    );
    p
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Whether `EMBER_REQUIRE_PRIVILEGED=1` (CI sets it): then a test that cannot run fails.
pub fn skips_forbidden() -> bool {
    std::env::var("EMBER_REQUIRE_PRIVILEGED").as_deref() == Ok("1")
}

/// Says that the calling test cannot run here and why; the caller returns at once.
///
/// Prints `skipped: WHY`, so that a pass that ran nothing shows in the output; under
/// `EMBER_REQUIRE_PRIVILEGED=1` it panics instead, so that CI cannot pass a test that never
/// ran.
pub fn skip(why: &str) {
    if skips_forbidden() {
        panic!("test could not run: {why} (EMBER_REQUIRE_PRIVILEGED=1 forbids skipping it)");
    }
    println!("skipped: {why}");
}

/// Gate for tests that need root (BPF, perf events).
///
/// Returns true when running as root. Otherwise it [`skip`]s with "needs root" (a panic under
/// `EMBER_REQUIRE_PRIVILEGED=1`) and returns false, and the caller returns early.
pub fn require_privileged() -> bool {
    if is_root() {
        return true;
    }
    skip("needs root (BPF and perf events)");
    false
}

static SAMPLING: Mutex<()> = Mutex::new(());

/// Serializes tests that sample (see the module docs). A panicking holder does not
/// poison the lock for the tests after it.
pub fn sampling_lock() -> MutexGuard<'static, ()> {
    SAMPLING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Clock ticks per second, the unit of utime/stime in `/proc/PID/stat`.
pub fn clk_tck() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// Number of online CPUs.
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as usize
    } else {
        1
    }
}

/// utime + stime of a process (all its threads), in clock ticks.
pub fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("malformed /proc/{pid}/stat"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime 15 (1-based).
    let utime: u64 = f.get(11).ok_or_else(|| anyhow!("no utime"))?.parse()?;
    let stime: u64 = f.get(12).ok_or_else(|| anyhow!("no stime"))?.parse()?;
    Ok(utime + stime)
}

/// A running fixture workload. Killed (and reaped) on drop.
pub struct Fixture {
    child: Child,
    /// The fixture's pid, as it printed it.
    pub pid: u32,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Fixture {
    /// Starts `path` with `args` and waits for its "pid N" line.
    pub fn spawn(path: &str, args: &[&str]) -> Result<Self> {
        let mut child = Command::new(path)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting fixture {path}"))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let stdin = child.stdin.take();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut f = Fixture {
            child,
            pid: 0,
            stdin,
            lines: rx,
        };
        let first = f.next_line(Duration::from_secs(10))?;
        f.pid = first
            .strip_prefix("pid ")
            .and_then(|p| p.trim().parse().ok())
            .ok_or_else(|| anyhow!("fixture {path} printed {first:?}, expected \"pid N\""))?;
        assert_eq!(f.pid, f.child.id(), "fixture pid line matches the child");
        Ok(f)
    }

    /// Next line from the fixture's stdout.
    pub fn next_line(&mut self, timeout: Duration) -> Result<String> {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => Ok(l),
            Err(RecvTimeoutError::Timeout) => bail!("fixture printed nothing for {timeout:?}"),
            Err(RecvTimeoutError::Disconnected) => bail!("fixture closed its stdout"),
        }
    }

    /// Waits until the fixture prints `line`.
    pub fn wait_for(&mut self, line: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let got = self
                .next_line(left)
                .with_context(|| format!("waiting for {line:?}"))?;
            if got == line {
                return Ok(());
            }
        }
    }

    /// Tells a fixture started with `--wait-start` to begin, and waits for "ready".
    pub fn start(&mut self) -> Result<()> {
        let stdin = self.stdin.as_mut().ok_or_else(|| anyhow!("stdin gone"))?;
        stdin.write_all(b"go\n")?;
        stdin.flush()?;
        self.wait_for("ready", Duration::from_secs(10))
    }

    /// Writes `line` to the fixture's stdin (without waiting for anything).
    pub fn send_line(&mut self, line: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().ok_or_else(|| anyhow!("stdin gone"))?;
        stdin.write_all(line.as_bytes())?;
        stdin.write_all(b"\n")?;
        stdin.flush()?;
        Ok(())
    }

    /// utime + stime so far, in clock ticks.
    pub fn cpu_ticks(&self) -> Result<u64> {
        cpu_ticks(self.pid)
    }

    /// Waits for the fixture to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        wait_timeout(&mut self.child, timeout)?
            .ok_or_else(|| anyhow!("fixture {} still running after {timeout:?}", self.pid))
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `child` until it exits or `timeout` passes (then `None`; the child keeps running).
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(Some(s));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// What the JSON Schema `schema` has against the JSON document `doc`, as the `jsonschema`
/// package of `python` (a reader of the schema's own project, not ours) says it; `None` when
/// the document is valid.
pub fn json_schema_refusal(
    python: impl AsRef<std::ffi::OsStr>,
    doc: &Path,
    schema: impl AsRef<std::ffi::OsStr>,
) -> Option<String> {
    let check = "import json, sys, jsonschema; \
        jsonschema.validate(json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))); \
        print('valid')";
    let res = output_with_timeout(
        Command::new(python)
            .args(["-c", check])
            .arg(doc)
            .arg(schema),
        Duration::from_secs(60),
    )
    .expect("running jsonschema");
    (!res.status.success()).then(|| String::from_utf8_lossy(&res.stderr).into_owned())
}

/// Runs `cmd` to completion, killing it after `timeout`.
pub fn output_with_timeout(cmd: &mut Command, timeout: Duration) -> Result<Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {cmd:?}"))?;
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let t_out = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t_err = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let status = match wait_timeout(&mut child, timeout)? {
        Some(s) => s,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{cmd:?} did not finish within {timeout:?}");
        }
    };
    Ok(Output {
        status,
        stdout: t_out.join().unwrap_or_default(),
        stderr: t_err.join().unwrap_or_default(),
    })
}

/// Reads a pprof profile written by ember (gzip-compressed, or raw protobuf).
pub fn read_profile(path: &Path) -> Result<Profile> {
    let raw = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut v = Vec::new();
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_end(&mut v)
            .with_context(|| format!("gunzipping {}", path.display()))?;
        v
    } else {
        raw
    };
    Profile::decode(&bytes[..]).with_context(|| format!("decoding {}", path.display()))
}

/// One frame of a decoded stack.
#[derive(Clone, Debug)]
pub struct Frame {
    /// Function name ("" when the location has no function).
    pub name: String,
    /// File name of the location's mapping ("" when it has none).
    pub mapping: String,
    /// The location's address.
    pub address: u64,
}

/// One pprof sample, with its stack resolved to names and its labels decoded.
#[derive(Clone, Debug)]
pub struct Stack {
    /// Leaf first; inlined functions appear as their own frames, innermost first.
    pub frames: Vec<Frame>,
    /// The sample's values (`[count, nanoseconds]` for ember).
    pub values: Vec<i64>,
    /// Label `pid`, if present.
    pub pid: Option<i64>,
    /// Label `tid`, if present.
    pub tid: Option<i64>,
    /// Label `comm`, if present.
    pub comm: Option<String>,
}

impl Stack {
    /// Number of samples this entry stands for (`values[0]`).
    pub fn count(&self) -> i64 {
        self.values.first().copied().unwrap_or(0)
    }

    /// Whether a frame is named exactly `name`.
    pub fn has(&self, name: &str) -> bool {
        self.frames.iter().any(|f| f.name == name)
    }

    /// Leaf function name.
    pub fn leaf(&self) -> &str {
        self.frames.first().map(|f| f.name.as_str()).unwrap_or("")
    }

    /// The names, root first, joined with `;` (for messages).
    pub fn folded(&self) -> String {
        let mut names: Vec<&str> = self
            .frames
            .iter()
            .rev()
            .map(|f| {
                if f.name.is_empty() {
                    "?"
                } else {
                    f.name.as_str()
                }
            })
            .collect();
        if names.is_empty() {
            names.push("<no frames>");
        }
        names.join(";")
    }
}

/// A string from the profile's string table (empty when out of range).
pub fn string(p: &Profile, idx: i64) -> String {
    usize::try_from(idx)
        .ok()
        .and_then(|i| p.string_table.get(i))
        .cloned()
        .unwrap_or_default()
}

/// Every sample of `p`, resolved.
pub fn stacks(p: &Profile) -> Vec<Stack> {
    let functions: HashMap<u64, String> = p
        .function
        .iter()
        .map(|f| (f.id, string(p, f.name)))
        .collect();
    let mappings: HashMap<u64, String> = p
        .mapping
        .iter()
        .map(|m| (m.id, string(p, m.filename)))
        .collect();
    let locations: HashMap<u64, Vec<Frame>> = p
        .location
        .iter()
        .map(|l| {
            let mapping = mappings.get(&l.mapping_id).cloned().unwrap_or_default();
            let mut frames: Vec<Frame> = l
                .line
                .iter()
                .map(|line| Frame {
                    name: functions
                        .get(&line.function_id)
                        .cloned()
                        .unwrap_or_default(),
                    mapping: mapping.clone(),
                    address: l.address,
                })
                .collect();
            if frames.is_empty() {
                frames.push(Frame {
                    name: String::new(),
                    mapping,
                    address: l.address,
                });
            }
            (l.id, frames)
        })
        .collect();
    p.sample
        .iter()
        .map(|s| {
            let frames = s
                .location_id
                .iter()
                .flat_map(|id| locations.get(id).cloned().unwrap_or_default())
                .collect();
            let mut st = Stack {
                frames,
                values: s.value.clone(),
                pid: None,
                tid: None,
                comm: None,
            };
            for l in &s.label {
                match string(p, l.key).as_str() {
                    "pid" => st.pid = Some(l.num),
                    "tid" => st.tid = Some(l.num),
                    "comm" => st.comm = Some(string(p, l.str)),
                    _ => {}
                }
            }
            st
        })
        .collect()
}

/// Samples of `p` whose `pid` label is `pid`.
pub fn stacks_of(p: &Profile, pid: u32) -> Vec<Stack> {
    stacks(p)
        .into_iter()
        .filter(|s| s.pid == Some(i64::from(pid)))
        .collect()
}

/// Sum of counts.
pub fn total(stacks: &[Stack]) -> i64 {
    stacks.iter().map(Stack::count).sum()
}

/// The heaviest stacks, for failure messages.
pub fn describe(stacks: &[Stack], n: usize) -> String {
    let mut by: HashMap<String, i64> = HashMap::new();
    for s in stacks {
        *by.entry(s.folded()).or_default() += s.count();
    }
    let mut v: Vec<(String, i64)> = by.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut out = format!(
        "{} samples in {} distinct stacks:\n",
        total(stacks),
        v.len()
    );
    for (stack, n) in v.into_iter().take(n) {
        out.push_str(&format!("  {n:6} {stack}\n"));
    }
    out
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

/// A minimal HTTP/1.1 GET, with the token of an ember this process started on `addr`
/// ([`token_for`]); returns (status code, body).
pub fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    let auth = token_for(addr)
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    http_get_with(addr, path, &auth)
}

/// A minimal HTTP/1.1 GET with extra header lines (each ending in `\r\n`), no token;
/// returns (status code, body).
pub fn http_get_with(addr: &str, path: &str, headers: &str) -> Result<(u16, String)> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAccept: */*\r\n{headers}\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("no HTTP header end in {text:?}"))?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("bad status line in {head:?}"))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Runs the Go checker on `path`; panics with its output unless it prints "ok N samples".
/// Returns N.
pub fn pprofcheck(path: &Path) -> u64 {
    let out = output_with_timeout(
        Command::new(pprofcheck_bin()).arg(path),
        Duration::from_secs(60),
    )
    .expect("running pprofcheck");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pprofcheck rejected {}: {}{}",
        path.display(),
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .trim()
        .strip_prefix("ok ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected pprofcheck output {stdout:?}"))
}

/// Percent-encodes a URL query parameter (a PromQL query for Prometheus's HTTP API).
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A cgroup directory made for a test; its processes go back to the root and the
/// directories are removed on drop.
pub struct TestCgroup {
    root: PathBuf,
    leaf: PathBuf,
}

impl TestCgroup {
    /// Creates `root/rel` (and its parents).
    pub fn create(root: &Path, rel: &str) -> std::io::Result<Self> {
        let leaf = root.join(rel);
        fs::create_dir_all(&leaf)?;
        Ok(Self {
            root: root.to_path_buf(),
            leaf,
        })
    }

    /// Moves `pid` into the cgroup.
    pub fn add(&self, pid: u32) -> std::io::Result<()> {
        fs::write(self.leaf.join("cgroup.procs"), pid.to_string())
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if let Ok(procs) = fs::read_to_string(self.leaf.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = fs::write(self.root.join("cgroup.procs"), pid);
            }
        }
        let mut dir = self.leaf.clone();
        while dir != self.root {
            if fs::remove_dir(&dir).is_err() || !dir.pop() {
                break;
            }
        }
    }
}

/// The cgroup v2 mount: `/sys/fs/cgroup` on v2 hosts, `/sys/fs/cgroup/unified` on hybrid ones.
pub fn v2_root() -> Option<PathBuf> {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.controllers").exists())
}

/// Peak resident memory of `pid`, in bytes (`VmHWM`); 0 if it cannot be read.
pub fn peak_rss(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}
