//! CPython frames named by ember, checked against py-spy on real interpreters.
//!
//! Each test runs `tests/fixtures/py_hot.py` on one interpreter (every pyenv build 3.8 to
//! 3.13 with its shared libpython, Debian's static `python3.11` without frame pointers, one
//! interpreter in its own pid and mount namespace, Debian sid's static `python3.14` in its
//! own root, pid and mount namespace, and a 3.11 built against musl, shared and static), and records it with
//! `ember record` and `py-spy record` over the same seconds (py-spy pausing the process for
//! each sample, see [`record_both`]). Free-threaded 3.13t and 3.14t, which py-spy cannot
//! read, are checked against the fixture's own clock and source instead (see
//! [`free_threaded`]). Then:
//! 1. at least 99 % of ember's samples reach their thread's root (`<module>` in the main
//!    thread, see [`reaches_root`]);
//! 2. each Python function's inclusive share is within 3 points of py-spy's;
//! 3. each function's hottest line is py-spy's (where py-spy's is clear, see [`TOP_LINE_CLEAR`]);
//! 4. the C call shows `deflate` under `leaf_c`, and the callback shows `key_fn` above
//!    `sorted`'s C frames (see [`sorts`] for Debian's binary, stripped of local symbols).
//!
//! An interpreter absent from this machine skips its test with a message (interpreters are
//! not privileges: that holds under EMBER_REQUIRE_PRIVILEGED=1 too). Root is needed (BPF).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ember_tests::*;

/// Seconds each profiler records.
const RECORD_SECS: u64 = 20;

/// Samples per second, both profilers. At ember's default 99 Hz, 20 s give ~2,000 samples
/// each (fewer on a busy machine), and two profilers' shares of a 30 % function then differed
/// by up to 2.3 points in repeated runs: a 3-point bar would fail now and then on noise alone.
/// At 3 x 99 Hz they stayed within 1.9 points (19 runs over all the interpreters). The rate
/// is not a multiple of the kernel's tick nor of the fixture's 100 ms rounds.
const HZ: u32 = 297;

/// The fixture outlives both recordings by this much (ember's start-up on a busy machine).
const SLACK_SECS: u64 = 25;

/// Bar 2: a function's inclusive share, in points, against py-spy's.
const SHARE_POINTS: f64 = 3.0;

/// Bar 2 needs this many samples of the busy threads from each profiler: [`SHARE_POINTS`] was
/// sized on ~2,000 samples (above), and shares of a few hundred samples agree by chance or
/// disagree by noise. A third of what 20 s at [`HZ`] gives a thread that always runs.
const MIN_SHARE_SAMPLES: u64 = HZ as u64 * RECORD_SECS / 3;

/// Bar 3 applies to a function only when py-spy puts at least this share of the function's
/// samples on its top line. Below that, the top line is a coin flip between two lines of the
/// same loop (`leaf_py`'s `for` and its body, `run_for`'s test and its call), and two honest
/// profilers may disagree.
const TOP_LINE_CLEAR: f64 = 0.60;

/// The fixture's Python functions, leaf-most last.
const FUNCTIONS: &[&str] = &[
    "<module>", "main", "mid", "run_for", "leaf_py", "leaf_c", "leaf_cb", "key_fn",
];

const PYENV: &str = "/root/.pyenv/versions";

fn pyenv(version: &str) -> String {
    format!("{PYENV}/{version}/bin/python3")
}

fn fixture_script() -> PathBuf {
    workspace_root().join("tests/fixtures/py_hot.py")
}

/// py-spy from the venv `make pyspy-venv` builds (`$EMBER_PYSPY`), or `None` to skip.
fn pyspy() -> Option<PathBuf> {
    let p = std::env::var_os("EMBER_PYSPY")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/pyspy-venv/bin/py-spy"));
    if p.exists() {
        return Some(p);
    }
    if std::env::var("EMBER_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
        panic!("{} missing: run `make pyspy-venv`", p.display());
    }
    println!("skipped: {} missing (make pyspy-venv)", p.display());
    None
}

#[test]
fn python_3_8() {
    compare(&pyenv("3.8.18"), "3.8.18", Launch::Plain, true);
}

#[test]
fn python_3_9() {
    compare(&pyenv("3.9.18"), "3.9.18", Launch::Plain, true);
}

#[test]
fn python_3_10() {
    compare(&pyenv("3.10.13"), "3.10.13", Launch::Plain, true);
}

#[test]
fn python_3_11() {
    compare(&pyenv("3.11.7"), "3.11.7", Launch::Plain, true);
}

#[test]
fn python_3_12() {
    compare(&pyenv("3.12.1"), "3.12.1", Launch::Plain, true);
}

#[test]
fn python_3_13() {
    compare(&pyenv("3.13.0"), "3.13.0", Launch::Plain, true);
}

/// Debian's own build: static (no libpython), stripped locals, no frame pointers.
#[test]
fn python_debian_3_11() {
    compare("/usr/bin/python3.11", "Debian 3.11", Launch::Plain, false);
}

/// A container's view: own pid and mount namespace, shared libpython read from there.
#[test]
fn python_in_pid_and_mount_namespace() {
    let Some(python) = ["3.12.1", "3.11.7", "3.13.0", "3.10.13", "3.9.18", "3.8.18"]
        .iter()
        .map(|v| pyenv(v))
        .find(|p| Path::new(p).exists())
    else {
        if require_privileged() {
            skip(&format!(
                "no pyenv interpreter under {PYENV} for the namespace run"
            ));
        }
        return;
    };
    let label = format!(
        "{} in pid+mount ns",
        python
            .trim_start_matches(PYENV)
            .split('/')
            .nth(1)
            .unwrap_or("?")
    );
    compare(&python, &label, Launch::Namespaced, true);
}

/// Debian sid's python3.14 (static, stripped, no frame pointers, sid's own glibc) in its own
/// root, pid and mount namespace: everything ember reads of it comes from the process's root.
/// The root is `make python314-root`'s (`$EMBER_PYTHON314_ROOT`).
#[test]
fn python_3_14_debian_in_chroot() {
    let root = std::env::var_os("EMBER_PYTHON314_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/python314/root"));
    if !root.join(".complete").exists() {
        if require_privileged() {
            skip(&format!(
                "{} not built (make python314-root)",
                root.display()
            ));
        }
        return;
    }
    compare(
        "/usr/bin/python3.14",
        "Debian 3.14 in chroot+pid+mount ns",
        Launch::Chroot(&root),
        false,
    );
}

/// CPython 3.11 built against musl libc with a shared libpython, as Alpine ships it
/// (`make python-musl`, `$EMBER_PYTHON_MUSL`): thread states are found through musl's
/// `self->tsd[key]`, whose offset ember decodes from musl's own `pthread_getspecific`.
#[test]
fn python_musl_3_11() {
    let build = std::env::var_os("EMBER_PYTHON_MUSL")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/python-musl"));
    if !build.join(".complete").exists() {
        if require_privileged() {
            skip(&format!("{} not built (make python-musl)", build.display()));
        }
        return;
    }
    let python = build.join("build/python");
    compare(
        python.to_str().expect("utf-8 path"),
        "musl 3.11 (shared libpython)",
        Launch::Plain,
        true,
    );
}

/// The same musl 3.11 linked fully static (`$EMBER_PYTHON_MUSL/static/python`): no C
/// library is mapped, so ember takes musl from the binary's own `pthread_getspecific` and
/// finds `self->tsd` there.
#[test]
fn python_musl_static_3_11() {
    let build = std::env::var_os("EMBER_PYTHON_MUSL")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/python-musl"));
    let python = build.join("static/python");
    if !build.join(".complete").exists() || !python.exists() {
        if require_privileged() {
            skip(&format!(
                "{} not built (make python-musl)",
                python.display()
            ));
        }
        return;
    }
    compare(
        python.to_str().expect("utf-8 path"),
        "musl 3.11 (static)",
        Launch::Plain,
        true,
    );
}

/// Free-threaded CPython 3.13t (`make python-ft`, `$EMBER_PYTHON_FT`313): see
/// [`free_threaded`].
#[test]
fn python_3_13_free_threaded() {
    free_threaded("313", "3.13t");
}

/// Free-threaded CPython 3.14t, whose threads run their own copies of the bytecode.
#[test]
fn python_3_14_free_threaded() {
    free_threaded("314", "3.14t");
}

/// The fixture on a free-threaded build (static, with symbols, built from source: no archive
/// here ships one), with a second thread (`work` under `_bootstrap`) running the same rounds
/// as the main thread, at the same time: no GIL. py-spy 0.4.3 cannot read these builds (it
/// panics), so the oracles are the fixture's own clock and source:
/// 1. at least [`FT_ROOTED`] of ember's samples reach their thread's root;
/// 2. in each of the two busy threads, each leaf's inclusive share is within 3 points of the
///    time the fixture's rounds give it by the clock (40/30/30: see `py_hot.py`);
/// 3. the hottest line of `leaf_c`, `leaf_cb` and `key_fn` is the line of their one
///    statement in the fixture's source, in both threads, and every function's hottest line
///    in the second thread is the main thread's: on 3.14t that thread runs a copy of each
///    code object's bytecode (`co_tlbc`), so its offsets count from the copy;
/// 4. the interleaving bars of [`check_interleaving`], per thread.
fn free_threaded(minor: &str, label: &str) {
    if !require_privileged() {
        return;
    }
    let dir = std::env::var_os("EMBER_PYTHON_FT")
        .map(|p| PathBuf::from(format!("{}{minor}", p.to_string_lossy())))
        .unwrap_or_else(|| workspace_root().join(format!("target/python-ft{minor}")));
    if !dir.join(".complete").exists() {
        skip(&format!("{} not built (make python-ft)", dir.display()));
        return;
    }
    let python = dir.join("build/python");
    let python = python.to_str().expect("utf-8 path");
    let _lock = sampling_lock();
    let tmp = tempfile::tempdir().expect("tempdir");
    let fixture = start_fixture(python, Launch::Plain, 2);
    thread::sleep(Duration::from_secs(1));
    let out = tmp.path().join("ember.folded");
    let (pid, hz, secs) = (
        fixture.host_pid.to_string(),
        HZ.to_string(),
        format!("{RECORD_SECS}s"),
    );
    let mut ember = EmberRun::record(tmp.path())
        .args([
            "--pid",
            &pid,
            "--frequency",
            &hz,
            "-d",
            &secs,
            "-o",
            out.to_str().expect("utf-8 path"),
        ])
        .try_spawn()
        .expect("starting ember record");
    let status = ember.wait(Duration::from_secs(RECORD_SECS + 90));
    assert!(
        status.success(),
        "ember record exited with {status}\n{}",
        ember.stderr()
    );
    drop(fixture);
    let text = fs::read_to_string(&out).expect("ember's folded output");
    let samples = parse_folded(&text, "ember");
    let failures = check_free_threaded(label, &samples);
    assert!(
        failures.is_empty(),
        "{label}: {} bar(s) failed:\n{}\n--- ember's heaviest stacks ---\n{}",
        failures.len(),
        failures.join("\n"),
        heaviest(&samples, 15)
    );
    println!("{label}: all bars hold");
}

/// Bar 1 of the free-threaded runs, in percent. Runs here reach 99.7 to 99.95 %, but one
/// 3.13t run in five lost 3.2 % (about 1.3 s of both busy threads) to samples with neither
/// native callers nor Python frames (`[unknown];[unknown];_PyEval_EvalFrameDefault`), not
/// explained yet: the bar is 95 % until it is, so that a walk that loses a thread still fails.
const FT_ROOTED: f64 = 95.0;

/// The share of a round each leaf gets by the fixture's clock (`mid` in `py_hot.py`).
const CLOCK_SPLIT: &[(&str, f64)] = &[("leaf_py", 40.0), ("leaf_c", 30.0), ("leaf_cb", 30.0)];

/// The line of the fixture's source holding `needle` (1-based).
fn source_line(needle: &str) -> u32 {
    let src = fs::read_to_string(fixture_script()).expect("reading py_hot.py");
    let i = src
        .lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("py_hot.py has no line with {needle:?}"));
    u32::try_from(i + 1).expect("line number")
}

/// The bars of [`free_threaded`]; prints the table, returns the failures.
fn check_free_threaded(label: &str, ember: &[Sample]) -> Vec<String> {
    let mut failures = Vec::new();
    let n = total_count(ember);
    let rooted: u64 = ember
        .iter()
        .filter(|s| reaches_root(s))
        .map(|s| s.count)
        .sum();
    println!(
        "{label}: ember {n} samples, {:.2} % reach their thread's root",
        pct(rooted, n)
    );
    if pct(rooted, n) < FT_ROOTED {
        let example = ember
            .iter()
            .filter(|s| !reaches_root(s))
            .max_by_key(|s| s.count)
            .map(|s| s.frames.join(";"));
        failures.push(format!(
            "bar 1: {rooted} of {n} samples reach their thread's root, want >= {FT_ROOTED} %; \
             e.g. {example:?}"
        ));
    }
    let threads: [(&str, Vec<Sample>); 2] = [
        (
            "main",
            ember
                .iter()
                .filter(|s| s.has_python("<module>"))
                .cloned()
                .collect(),
        ),
        (
            "second",
            ember
                .iter()
                .filter(|s| s.has_python("work") && !s.has_python("<module>"))
                .cloned()
                .collect(),
        ),
    ];
    let expected_lines = [
        ("leaf_c", source_line("zlib.compress(")),
        ("leaf_cb", source_line("sorted(items")),
        ("key_fn", source_line("2654435761")),
    ];
    let mut main_top: BTreeMap<&str, (u32, bool)> = BTreeMap::new();
    for (thread, samples) in &threads {
        let total = total_count(samples);
        if total < 1000 {
            failures.push(format!(
                "{thread} thread: {total} samples, want >= 1000 (is the second thread running?)"
            ));
            continue;
        }
        for &(leaf, want) in CLOCK_SPLIT {
            let share = pct(inclusive(samples, leaf), total);
            println!("{label}: {thread} thread ({total}): {leaf} {share:.2} % (clock {want:.0} %)");
            if (share - want).abs() > SHARE_POINTS {
                failures.push(format!(
                    "bar 2: {thread} thread: {leaf} {share:.2} % of {total}, the clock gives \
                     {want:.0} %: want within {SHARE_POINTS} points"
                ));
            }
        }
        for &f in FUNCTIONS {
            let lines = lines_of(samples, f);
            let Some((top, count)) = top_line(&lines) else {
                continue;
            };
            let clear = count as f64 >= TOP_LINE_CLEAR * inclusive(samples, f) as f64;
            println!("{label}: {thread} thread: {f} hottest line {top} (lines {lines:?})");
            if let Some(&(_, want)) = expected_lines.iter().find(|(name, _)| *name == f) {
                if top != want {
                    failures.push(format!(
                        "bar 3: {thread} thread: {f}'s hottest line {top}, its statement is on \
                         {want} (lines {lines:?})"
                    ));
                }
            }
            match main_top.get(f) {
                None => {
                    main_top.insert(f, (top, clear));
                }
                Some(&(main_line, true)) if main_line != top => failures.push(format!(
                    "bar 3: {thread} thread: {f}'s hottest line {top}, the main thread's \
                     {main_line} (lines {lines:?})"
                )),
                Some(_) => {}
            }
        }
        failures.extend(check_interleaving(
            &format!("{label} {thread}"),
            samples,
            true,
        ));
    }
    failures
}

/// How the fixture's interpreter is started.
#[derive(Clone, Copy)]
enum Launch<'a> {
    /// As a child of the test.
    Plain,
    /// Under `unshare`, in new pid and mount namespaces.
    Namespaced,
    /// As `Namespaced`, chrooted into this root (the interpreter's path is inside it).
    Chroot(&'a Path),
}

/// Runs the fixture on `python`, records it with both profilers, and checks the bars.
/// `local_symbols`: whether the interpreter's binary keeps its local function symbols
/// (`sorted`'s C functions are local: see [`check_interleaving`]).
fn compare(python: &str, label: &str, how: Launch, local_symbols: bool) {
    if !require_privileged() {
        return;
    }
    let on_host = match how {
        Launch::Chroot(root) => root.join(python.trim_start_matches('/')),
        _ => PathBuf::from(python),
    };
    if !on_host.exists() {
        skip(&format!("{label}: {python} is not on this machine"));
        return;
    }
    let Some(pyspy) = pyspy() else { return };
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().expect("tempdir");
    let run = record_both(python, how, &pyspy, dir.path());
    let ember = parse_folded(&run.ember_folded, "ember");
    let spy = parse_folded(&run.pyspy_raw, "py-spy");
    let failures = check(label, &ember, &spy, local_symbols);
    assert!(
        failures.is_empty(),
        "{label}: {} bar(s) failed:\n{}\n--- ember's heaviest stacks ---\n{}\n--- py-spy's ---\n{}",
        failures.len(),
        failures.join("\n"),
        heaviest(&ember, 15),
        heaviest(&spy, 10)
    );
    println!("{label}: all bars hold");
}

/// The two profiles of one run, as text.
struct Run {
    ember_folded: String,
    pyspy_raw: String,
}

/// The fixture under test. Killed (with its `unshare` parent, if any) on drop.
struct PyFixture {
    child: Child,
    /// The interpreter's pid as the host sees it.
    host_pid: u32,
}

impl Drop for PyFixture {
    fn drop(&mut self) {
        if self.host_pid != self.child.id() {
            // SAFETY: kill has no memory-safety preconditions; the pid is our grandchild,
            // kept from reuse by its parent `unshare`, which we have not reaped yet.
            unsafe { libc::kill(self.host_pid as libc::pid_t, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts py_hot.py as `how` says and waits for the pid it prints, which it does once the
/// interpreter runs the script.
fn start_fixture(python: &str, how: Launch, threads: u32) -> PyFixture {
    let mut script = fixture_script();
    let secs = (RECORD_SECS + SLACK_SECS).to_string();
    let threads = threads.to_string();
    let unshare = ["--pid", "--fork", "--mount", "--mount-proc"];
    let mut cmd = match how {
        Launch::Plain => Command::new(python),
        Launch::Namespaced => {
            let mut c = Command::new("unshare");
            c.args(unshare).arg(python);
            c
        }
        Launch::Chroot(root) => {
            // The script must be inside the root: copied to its /tmp.
            let inside = Path::new("/tmp/ember-py_hot.py");
            fs::copy(
                &script,
                root.join(inside.strip_prefix("/").expect("absolute")),
            )
            .expect("copying the fixture into the root");
            script = inside.to_path_buf();
            let mut c = Command::new("unshare");
            c.args(unshare).arg("--root").arg(root).arg(python);
            c
        }
    };
    let namespaced = !matches!(how, Launch::Plain);
    let mut child = cmd
        .arg(&script)
        .args(["--seconds", secs.as_str(), "--threads", threads.as_str()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {python} {}: {e}", script.display()));
    let stdout = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let mut fx = PyFixture {
        host_pid: child.id(),
        child,
    };
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{python} printed no pid within 30 s: {e}"));
    let own_pid: u32 = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{python} printed {line:?}, expected its pid"));
    if namespaced {
        fx.host_pid = child_of(fx.child.id()).expect("the interpreter under unshare");
        // The pid it printed is its own namespace's: if it were the host's, nothing here
        // would test the namespace translation.
        assert_ne!(
            own_pid, fx.host_pid,
            "the interpreter under unshare sees its host pid: no new pid namespace"
        );
        println!(
            "fixture: host pid {}, pid {own_pid} in its own namespace",
            fx.host_pid
        );
    } else {
        assert_eq!(own_pid, fx.host_pid, "the pid the fixture printed");
    }
    fx
}

/// The single child of `parent`, from the ppid field of `/proc/*/stat`.
fn child_of(parent: u32) -> Option<u32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let found = fs::read_dir("/proc")
            .ok()?
            .filter_map(|e| e.ok())
            .find_map(|e| {
                let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                let stat = fs::read_to_string(e.path().join("stat")).ok()?;
                // Fields after the command name, which is in parentheses and may hold spaces.
                let ppid: u32 = stat
                    .rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .nth(1)?
                    .parse()
                    .ok()?;
                (ppid == parent).then_some(pid)
            });
        if found.is_some() {
            return found;
        }
        thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Starts the fixture, then ember, then (once ember samples) py-spy, on the same pid for the
/// same number of seconds; waits for both and returns what they wrote.
fn record_both(python: &str, how: Launch, pyspy: &Path, dir: &Path) -> Run {
    let fixture = start_fixture(python, how, 1);
    // The interpreter is up (it printed); let it settle into its rounds.
    thread::sleep(Duration::from_secs(1));
    let pid = fixture.host_pid.to_string();
    let secs = RECORD_SECS.to_string();
    let hz = HZ.to_string();
    let ember_out = dir.join("ember.folded");
    let pyspy_out = dir.join("py.txt");
    let mut ember = EmberRun::record(dir)
        .args([
            "--pid",
            pid.as_str(),
            "--frequency",
            hz.as_str(),
            "-d",
            format!("{secs}s").as_str(),
            "-o",
            ember_out.to_str().expect("utf-8 path"),
        ])
        .try_spawn()
        .expect("starting ember record");
    // ember's duration runs from its attachment: starting py-spy then lines the windows up.
    if ember.wait_attached(Duration::from_secs(30)).is_none() {
        println!("note: no perf event fds seen on ember after 30 s; starting py-spy anyway");
    }
    // py-spy pauses the process for each sample (no --nonblocking). Without the pause it reads
    // the frame chain while the interpreter changes it, and loses the short-lived frames: on
    // 3.12, `key_fn` (~2,000 calls of a microsecond per sort) came out 1.5 to 2.7 points lower
    // than a pausing py-spy's in the same seconds (4 runs; ember within 1.5 of the pausing one),
    // and up to 3.7 points below ember. The pauses cost the fixture some CPU, not its shares:
    // its rounds are timed by the clock.
    let mut spy = Command::new(pyspy)
        .args(["record", "--pid", pid.as_str(), "--duration", secs.as_str()])
        .args(["--rate", hz.as_str(), "-f", "raw", "-o"])
        .arg(&pyspy_out)
        .stdin(Stdio::null())
        .stdout(fs::File::create(dir.join("py-spy.stdout")).expect("py-spy stdout file"))
        .stderr(fs::File::create(dir.join("py-spy.stderr")).expect("py-spy stderr file"))
        .spawn()
        .expect("starting py-spy");
    let status = ember.wait(Duration::from_secs(RECORD_SECS + 90));
    let ember_err = ember.stderr();
    assert!(
        status.success(),
        "ember record exited with {status}\n--- stderr ---\n{ember_err}"
    );
    let spy_status =
        wait_timeout(&mut spy, Duration::from_secs(RECORD_SECS + 60)).expect("waiting for py-spy");
    let spy_err = fs::read_to_string(dir.join("py-spy.stderr")).unwrap_or_default()
        + &fs::read_to_string(dir.join("py-spy.stdout")).unwrap_or_default();
    match spy_status {
        Some(s) if s.success() => {}
        Some(s) => panic!("py-spy exited with {s}\n{spy_err}"),
        None => {
            let _ = spy.kill();
            let _ = spy.wait();
            panic!("py-spy did not finish\n{spy_err}");
        }
    }
    drop(fixture);
    for line in ember_err.lines().filter(|l| l.starts_with("ember:")) {
        println!("{line}");
    }
    for line in spy_err.lines().filter(|l| l.contains("Samples:")) {
        println!("{}", line.trim());
    }
    let read =
        |p: &Path| fs::read_to_string(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    Run {
        ember_folded: read(&ember_out),
        pyspy_raw: read(&pyspy_out),
    }
}

/// A Python frame: `name (file.py:line)`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct PyFrame {
    name: String,
    line: u32,
}

/// One folded stack with its count.
#[derive(Clone)]
struct Sample {
    /// Every frame, root first, as written.
    frames: Vec<String>,
    /// For each frame, its Python name and line if it is a Python frame.
    python: Vec<Option<PyFrame>>,
    count: u64,
}

impl Sample {
    fn python_frames(&self) -> impl Iterator<Item = &PyFrame> {
        self.python.iter().flatten()
    }

    fn has_python(&self, name: &str) -> bool {
        self.python_frames().any(|f| f.name == name)
    }

    /// The Python frames only, root first, for messages.
    fn projected(&self) -> String {
        let v: Vec<String> = self
            .python_frames()
            .map(|f| format!("{}:{}", f.name, f.line))
            .collect();
        v.join(";")
    }
}

/// Parses `name (file:line)` as py-spy and ember write Python frames: the file is a base name
/// without parentheses or colons, the line a number. Anything else is a native frame.
fn python_frame(frame: &str) -> Option<PyFrame> {
    let inner = frame.strip_suffix(')')?;
    let (name, loc) = inner.rsplit_once(" (")?;
    let (file, line) = loc.rsplit_once(':')?;
    let plain = |s: &str| !s.is_empty() && !s.contains(['(', ')', ':']);
    if name.is_empty()
        || !plain(file)
        || line.is_empty()
        || !line.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    Some(PyFrame {
        name: name.to_string(),
        line: line.parse().ok()?,
    })
}

/// Parses folded stacks (`a;b;c N` per line, root first).
fn parse_folded(text: &str, who: &str) -> Vec<Sample> {
    let samples: Vec<Sample> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (stack, n) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("{who}: folded line without a count: {l:?}"));
            let count = n
                .parse()
                .unwrap_or_else(|_| panic!("{who}: bad count in {l:?}"));
            let frames: Vec<String> = stack.split(';').map(str::to_string).collect();
            let python = frames.iter().map(|f| python_frame(f)).collect();
            Sample {
                frames,
                python,
                count,
            }
        })
        .collect();
    assert!(
        samples.iter().map(|s| s.count).sum::<u64>() > 0,
        "{who} wrote no samples"
    );
    samples
}

fn total_count(samples: &[Sample]) -> u64 {
    samples.iter().map(|s| s.count).sum()
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// Samples (by count) whose stack holds the Python function `name`.
fn inclusive(samples: &[Sample], name: &str) -> u64 {
    samples
        .iter()
        .filter(|s| s.has_python(name))
        .map(|s| s.count)
        .sum()
}

/// Samples per line of the Python function `name` (a sample counts once per line).
fn lines_of(samples: &[Sample], name: &str) -> BTreeMap<u32, u64> {
    let mut by = BTreeMap::new();
    for s in samples {
        let lines: BTreeSet<u32> = s
            .python_frames()
            .filter(|f| f.name == name)
            .map(|f| f.line)
            .collect();
        for l in lines {
            *by.entry(l).or_default() += s.count;
        }
    }
    by
}

/// The line with the most samples, ties to the lowest line.
fn top_line(lines: &BTreeMap<u32, u64>) -> Option<(u32, u64)> {
    lines
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .map(|(l, n)| (*l, *n))
}

/// Whether a sample reaches its thread's root: `<module>` in the main thread, the threading
/// module's `_bootstrap` (`Thread._bootstrap` from 3.11, qualified names) in `idle` and in
/// the free-threaded runs' second thread (`work`).
///
/// The idle thread is on a CPU now and then: waking from its sleep, and each time py-spy stops
/// it for a sample (ptrace's signal-delivery path in the kernel). Those samples are right when
/// they end in `_bootstrap`.
fn reaches_root(s: &Sample) -> bool {
    s.has_python("<module>")
        || ((s.has_python("idle") || s.has_python("work"))
            && s.python_frames()
                .any(|f| f.name == "_bootstrap" || f.name.ends_with("._bootstrap")))
}

/// The samples outside the fixture's sleeping thread, `idle`.
fn main_thread(samples: &[Sample]) -> Vec<Sample> {
    samples
        .iter()
        .filter(|s| !s.has_python("idle"))
        .cloned()
        .collect()
}

/// All four bars; prints the table, returns the failures.
fn check(label: &str, ember: &[Sample], spy: &[Sample], local_symbols: bool) -> Vec<String> {
    let mut failures = Vec::new();
    let (n_e, n_s) = (total_count(ember), total_count(spy));

    // 1. Stacks reach their thread's root.
    let rooted: u64 = ember
        .iter()
        .filter(|s| reaches_root(s))
        .map(|s| s.count)
        .sum();
    let rooted_pct = pct(rooted, n_e);
    let main_e = main_thread(ember);
    let main_rooted = pct(inclusive(&main_e, "<module>"), total_count(&main_e));
    println!(
        "{label}: ember {n_e} samples, py-spy {n_s}; {rooted_pct:.2} % of ember's reach their \
         thread's root ({main_rooted:.2} % of the main thread's reach <module>); outside the \
         idle thread: ember {}, py-spy {}",
        total_count(&main_e),
        total_count(&main_thread(spy))
    );
    if rooted_pct < 99.0 {
        let example = ember
            .iter()
            .filter(|s| !reaches_root(s))
            .max_by_key(|s| s.count)
            .map(|s| s.frames.join(";"))
            .unwrap_or_default();
        failures.push(format!(
            "bar 1: {rooted} of {n_e} ember samples ({rooted_pct:.2} %) reach their thread's \
             root, want >= 99 %; e.g. {example}"
        ));
    }

    // 2 and 3: per-function shares and hot lines, over the samples outside the fixture's
    // sleeping thread (`idle`). py-spy does not always see that it sleeps and then samples it
    // as if it ran: up to 15 % of py-spy's samples here, half of them in a pid namespace (where
    // the thread ids it reads are not the host's), which would shrink every share accordingly.
    // ember samples threads on a CPU only (see [`reaches_root`] for when that one is).
    let (ember, spy) = (main_thread(ember), main_thread(spy));
    let (ember, spy) = (ember.as_slice(), spy.as_slice());
    let (n_e, n_s) = (total_count(ember), total_count(spy));
    if n_e.min(n_s) < MIN_SHARE_SAMPLES {
        failures.push(format!(
            "bar 2: shares over ember's {n_e} and py-spy's {n_s} samples of the busy threads, \
             want at least {MIN_SHARE_SAMPLES} each"
        ));
    }
    let mut table = format!(
        "{label}: {:<9} {:>8} {:>8} {:>6} {:>6} {:>6}  {:>12} {:>12}\n",
        "function", "ember %", "py-spy %", "diff", "ember", "py-spy", "ember line", "py-spy line"
    );
    for &f in FUNCTIONS {
        let (ie, is) = (inclusive(ember, f), inclusive(spy, f));
        let (pe, ps) = (pct(ie, n_e), pct(is, n_s));
        let (le, ls) = (lines_of(ember, f), lines_of(spy, f));
        let (te, ts) = (top_line(&le), top_line(&ls));
        let show = |t: Option<(u32, u64)>, n: u64| match t {
            Some((l, c)) => format!("{l} ({:.0}%)", pct(c, n)),
            None => "-".to_string(),
        };
        let _ = writeln!(
            table,
            "{label}: {f:<9} {pe:>8.2} {ps:>8.2} {:>+6.2} {ie:>6} {is:>6}  {:>12} {:>12}",
            pe - ps,
            show(te, ie),
            show(ts, is)
        );
        if (pe - ps).abs() > SHARE_POINTS {
            failures.push(format!(
                "bar 2: {f}: ember {pe:.2} % ({ie} of {n_e}), py-spy {ps:.2} % ({is} of {n_s}): \
                 {:+.2} points, want within {SHARE_POINTS}",
                pe - ps
            ));
        }
        if let Some((spy_line, spy_n)) = ts {
            let clear = spy_n as f64 >= TOP_LINE_CLEAR * is as f64;
            if clear && te.map(|t| t.0) != Some(spy_line) {
                failures.push(format!(
                    "bar 3: {f}: ember's hottest line {:?} (lines {le:?}), py-spy's {spy_line} \
                     (lines {ls:?})",
                    te.map(|t| t.0)
                ));
            }
        }
    }
    print!("{table}");
    failures.extend(check_interleaving(label, ember, local_symbols));
    failures
}

/// Bar 4, native frames where they belong: `deflate` leaf-ward of `leaf_c`, and `sort`'s C
/// frames between `leaf_cb` and `key_fn`.
fn check_interleaving(label: &str, ember: &[Sample], local_symbols: bool) -> Vec<String> {
    let mut failures = Vec::new();
    // Samples whose innermost Python frame is leaf_c, and of them those with deflate after it.
    let (mut in_c, mut deflate) = (0, 0);
    let mut c_example = None;
    for s in ember {
        let Some(last) = s.python.iter().rposition(Option::is_some) else {
            continue;
        };
        if s.python[last].as_ref().map(|f| f.name.as_str()) != Some("leaf_c") {
            continue;
        }
        in_c += s.count;
        if s.frames[last + 1..]
            .iter()
            .any(|f| f.starts_with("deflate"))
        {
            deflate += s.count;
        } else if c_example.as_ref().is_none_or(|(n, _)| *n < s.count) {
            c_example = Some((s.count, s.frames.join(";")));
        }
    }
    // Samples holding key_fn, and of them those with a `sort` frame between leaf_cb and key_fn.
    let (mut in_key, mut sorted) = (0, 0);
    let mut key_example = None;
    for s in ember {
        let pos = |name: &str| {
            s.python
                .iter()
                .position(|f| f.as_ref().is_some_and(|f| f.name == name))
        };
        let Some(k) = pos("key_fn") else { continue };
        in_key += s.count;
        let between = pos("leaf_cb")
            .filter(|&cb| cb < k)
            .is_some_and(|cb| sorts(&s.frames[cb + 1..k], local_symbols));
        if between {
            sorted += s.count;
        } else if key_example.as_ref().is_none_or(|(n, _)| *n < s.count) {
            key_example = Some((s.count, s.frames.join(";")));
        }
    }
    let (pd, pk) = (pct(deflate, in_c), pct(sorted, in_key));
    println!(
        "{label}: interleaving: deflate under leaf_c in {deflate} of {in_c} ({pd:.1} %); \
         sort's C frames between leaf_cb and key_fn in {sorted} of {in_key} ({pk:.1} %)"
    );
    if in_c == 0 || pd < 50.0 {
        failures.push(format!(
            "bar 4: {deflate} of {in_c} samples in leaf_c ({pd:.1} %) show deflate after it, \
             want >= 50 %; e.g. {c_example:?}"
        ));
    }
    if in_key == 0 || pk < 90.0 {
        failures.push(format!(
            "bar 4: {sorted} of {in_key} samples in key_fn ({pk:.1} %) have a `sort` frame \
             between leaf_cb and key_fn, want >= 90 %; e.g. {key_example:?}"
        ));
    }
    failures
}

/// Whether the native frames between `leaf_cb` and `key_fn` are `sorted`'s.
///
/// `builtin_sorted`, `list_sort` and `list_sort_impl` are local symbols: where the binary keeps
/// them, a frame must name one. Debian strips local symbols from its `python3.11` (and ships
/// no separate debug file for it), so there they can only be unnamed frames of the binary: then
/// the frames must hold such an unnamed frame and `PyObject_CallOneArg`, the exported function
/// through which `list_sort_impl` calls the key function.
fn sorts(between: &[String], local_symbols: bool) -> bool {
    if between.iter().any(|f| f.contains("sort")) {
        return true;
    }
    !local_symbols
        && between.iter().any(|f| f == "PyObject_CallOneArg")
        && between.iter().any(|f| f.contains("+0x"))
}

/// The heaviest stacks projected on their Python frames, for failure messages.
fn heaviest(samples: &[Sample], n: usize) -> String {
    let mut by: BTreeMap<String, u64> = BTreeMap::new();
    for s in samples {
        *by.entry(s.projected()).or_default() += s.count;
    }
    let mut v: Vec<(String, u64)> = by.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v.into_iter()
        .take(n)
        .map(|(s, c)| format!("  {c:6} {s}\n"))
        .collect()
}
