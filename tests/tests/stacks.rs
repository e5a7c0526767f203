//! Complete stacks without frame pointers (issue 11), measured against
//! `perf record --call-graph dwarf` run on the same process at the same time.
//!
//! For each workload: start it, start `ember record --pid PID` and, once ember samples,
//! `perf record -F 99 --call-graph dwarf,16384 -p PID -- sleep 8`; then read both
//! profiles and compare, for that process:
//! - the share of samples whose stack reaches the program's start (`main`, or libc's
//!   start frames for a stripped binary: see [`START_ROOTS`]): ember needs ≥ 99 %;
//! - inclusive shares of the workload's own functions (the fraction of samples whose
//!   stack holds the function): ember within 2 points of perf. The two profilers take
//!   different samples, so this holds as such only where the fixture sets the share by
//!   its clock (~1 ms rounds, see cpu_hog.c); elsewhere, and whenever the machine is
//!   busy, the tolerance is 3 sigma of the binomial noise between two samplers if that
//!   is larger (see [`share_tolerance`] and [`Check::locked`]). Each row of the table
//!   shows its tolerance.
//!
//! perf's side is checked too (it must reach the start in ≥ 99 % of its samples and
//! see the time split the fixture is built to have): a failure there means the fixture
//! or the machine is wrong, not ember. A test prints its side-by-side table
//! ([`Comparison::table`]) when it passes; when it fails, the table, the failed checks
//! (tagged `[ember]`, `[perf]` or `[fixture]`) and both sides' heaviest stacks are the
//! panic message, so a failure explains itself.
//!
//! Workloads: the no-frame-pointer fixtures (C with libc's qsort/memcpy, C++ exceptions
//! through a deep recursion, a Rust release build, a SIGPROF handler), Debian's stock
//! `/usr/bin/python3`, the stripped distro binary `xz -9`, and a loop of fresh 30 ms
//! processes for 15 s (ember then records the whole host; ≥ 95 % of those processes'
//! samples must have a named leaf and reach main).
//!
//! Every test samples, so each holds [`sampling_lock`]; they need root (BPF, perf
//! events) and perf (Debian: linux-perf, in `make deps`). About 100 s in all.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use ember_tests::completeness::{
    describe, from_ember, from_perf, measure, outside_main, share_tolerance, Comparison, NStack,
    Side, Target, START_ROOTS,
};
use ember_tests::perf::{self, PerfRecord};
use ember_tests::*;

/// perf's recording window per workload, in seconds (ember's is one more, around it).
const SECONDS: u32 = 8;
/// The issue's bar for ember: samples reaching the program's start.
const REACH_MIN: f64 = 99.0;
/// perf must do at least this well, else the fixture is broken.
const PERF_REACH_MIN: f64 = 99.0;
/// The issue's bar on |ember − perf| for a function's share, in points.
const SHARE_POINTS: f64 = 2.0;
/// Fewer samples than this on either side means the run tells nothing.
const MIN_SAMPLES: u64 = 200;

/// One workload: what to call it and what to look at.
struct Spec {
    title: &'static str,
    /// Frames that mean "reached the program's start".
    roots: Vec<&'static str>,
    reach_label: &'static str,
    /// Share targets.
    checks: Vec<Check>,
}

/// One share target.
struct Check {
    target: Target,
    /// The range perf's share must fall in (the fixture behaves as built).
    range: Option<(f64, f64)>,
    /// The share is set by the fixture's clock-driven rounds (~1 ms slots against the
    /// samplers' 10.1 ms period), so both samplers step evenly through it and agree
    /// with little noise; otherwise (a callee interleaved with its caller at
    /// sub-microsecond grain, a natural workload) two samplers differ by binomial noise,
    /// and the tolerance is 3 sigma of it when that exceeds 2 points (see
    /// `share_tolerance`).
    locked: bool,
}

/// A function whose share is set by the fixture's rounds.
fn locked(name: &str, range: Option<(f64, f64)>) -> Check {
    Check {
        target: Target::func(name),
        range,
        locked: true,
    }
}

/// A function whose share is a random mix.
fn func(name: &str, range: Option<(f64, f64)>) -> Check {
    Check {
        target: Target::func(name),
        range,
        locked: false,
    }
}

/// Any frame of an object (by file-name prefix); its share is a random mix.
fn object(prefix: &str, range: Option<(f64, f64)>) -> Check {
    Check {
        target: Target::object(prefix),
        range,
        locked: false,
    }
}

/// What "complete" means for a workload, and how much of it each side needs.
struct Bar {
    /// Count a sample only when its leaf is named as well as reaching a root.
    named_leaf: bool,
    /// ember's minimum, in percent of its samples.
    ember_min: f64,
    /// perf's minimum: below it the reference (the fixture) is at fault.
    perf_min: f64,
    /// Hold ember's function shares to perf's (off where the bar itself is below perf's).
    compare_shares: bool,
}

/// The issue's bar for long-running workloads.
const REACH_BAR: Bar = Bar {
    named_leaf: false,
    ember_min: REACH_MIN,
    perf_min: PERF_REACH_MIN,
    compare_shares: true,
};

/// Present in every sample.
const ALL: Option<(f64, f64)> = Some((99.0, 100.0));

/// Root and perf gates; `false` means skip (or panic under EMBER_REQUIRE_PRIVILEGED=1).
fn ready_to_run() -> bool {
    if !require_privileged() {
        return false;
    }
    if let Some(why) = perf::unavailable() {
        if std::env::var("EMBER_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
            panic!("these tests compare ember with perf, which cannot run: {why}");
        }
        println!("skipped: {why}");
        return false;
    }
    true
}

/// Starts `ember record ARGS -o OUT` and waits until it samples.
fn start_ember(dir: &Path, out: &Path, args: &[&str]) -> Ember {
    let mut full = vec!["record"];
    full.extend_from_slice(args);
    full.extend_from_slice(&["-o", out.to_str().expect("utf-8 path")]);
    let mut ember = Ember::spawn(&full, dir).expect("starting ember record");
    match ember.wait_attached(Duration::from_secs(15)) {
        Some(t) => println!("ember attached its perf events after {t:.2?}"),
        None if !ember.running() => panic!(
            "ember {full:?} exited before sampling\n--- stderr ---\n{}",
            ember.stderr()
        ),
        None => println!("note: no perf event fds seen on ember after 15 s; going on"),
    }
    ember
}

/// Waits for `ember record` to exit 0 and reads its profile.
fn finish_ember(mut ember: Ember, out: &Path) -> ember::proto::Profile {
    let status = ember.wait(Duration::from_secs(90));
    let stderr = ember.stderr();
    assert!(
        status.success(),
        "ember record exited with {status}\n--- stderr ---\n{stderr}"
    );
    read_profile(out).unwrap_or_else(|e| panic!("reading ember's profile: {e:#}\n{stderr}"))
}

/// Records `fx` with ember and perf at once and compares them (see the module docs).
/// Panics, after printing the table, when any check fails.
fn compare(fx: &Fixture, spec: &Spec) {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("ember.pb.gz");
    let pid = fx.pid;
    let pid_s = pid.to_string();
    let ember_window = format!("{}s", SECONDS + 1);
    let ember = start_ember(
        dir.path(),
        &out,
        &["--duration", ember_window.as_str(), "--pid", pid_s.as_str()],
    );
    let ticks0 = cpu_ticks(pid).expect("cpu ticks");
    let t0 = Instant::now();
    let rec = PerfRecord::start(pid, SECONDS, dir.path()).expect("starting perf record");
    let data = rec
        .finish(Duration::from_secs(u64::from(SECONDS) + 30))
        .expect("perf record");
    let wall = t0.elapsed().as_secs_f64();
    let cpu_s = cpu_ticks(pid).expect("cpu ticks").saturating_sub(ticks0) as f64 / clk_tck() as f64;
    let profile = finish_ember(ember, &out);

    let e_stacks = from_ember(&stacks_of(&profile, pid));
    let perf_samples = perf::script(&data).expect("perf script");
    let p_stacks = from_perf(perf_samples.iter().filter(|s| s.pid == pid));

    // A fixture that got much less than a CPU was preempted at random moments: its
    // rounds no longer line up with the samplers, and shares carry binomial noise.
    let contended = cpu_s < 0.9 * wall;
    let mut notes = String::new();
    if contended {
        let _ = writeln!(
            notes,
            "note: the workload got {:.0} % of a CPU (the machine is busy); share tolerances \
             are 3 sigma of binomial noise where that exceeds {SHARE_POINTS} points",
            100.0 * cpu_s / wall
        );
    }
    let (c, failures) = evaluate(spec, &e_stacks, &p_stacks, !contended, &REACH_BAR);
    report(&c, &failures, &notes, &e_stacks, &p_stacks);
}

/// Measures both sides and lists every check that fails, each tagged with who is at
/// fault: `[ember]`, `[perf]` (the reference fell short: fix the fixture) or `[fixture]`.
fn evaluate(
    spec: &Spec,
    e_stacks: &[NStack],
    p_stacks: &[NStack],
    rounds_hold: bool,
    bar: &Bar,
) -> (Comparison, Vec<String>) {
    let targets: Vec<Target> = spec.checks.iter().map(|c| c.target.clone()).collect();
    let e = measure(e_stacks, &spec.roots, &targets);
    let p = measure(p_stacks, &spec.roots, &targets);
    let tolerances = p
        .shares
        .iter()
        .zip(&spec.checks)
        .map(|(&share, check)| {
            let locked = check.locked && rounds_hold;
            share_tolerance(SHARE_POINTS, locked, share, e.samples, p.samples)
        })
        .collect();
    let c = Comparison {
        title: spec.title.to_string(),
        reach_label: spec.reach_label.to_string(),
        targets,
        ember: e,
        perf: p,
        tolerances,
    };

    let mut failures = Vec::new();
    let (e, p) = (&c.ember, &c.perf);
    if p.samples < MIN_SAMPLES {
        failures.push(format!(
            "[perf] only {} samples (< {MIN_SAMPLES}): did the workload run?",
            p.samples
        ));
    }
    let what = if bar.named_leaf {
        format!("have a named leaf and reach {}", spec.reach_label)
    } else {
        format!("reach {}", spec.reach_label)
    };
    let complete = |side: &Side| {
        side.pct(if bar.named_leaf {
            side.named_and_reach
        } else {
            side.reach
        })
    };
    if complete(p) < bar.perf_min {
        failures.push(format!(
            "[perf] only {:.2} % of perf's samples {what} (< {} %): the reference itself is \
             incomplete, fix the fixture",
            complete(p),
            bar.perf_min
        ));
    }
    for (i, check) in spec.checks.iter().enumerate() {
        if let Some((lo, hi)) = check.range {
            let s = p.shares[i];
            if s < lo || s > hi {
                failures.push(format!(
                    "[fixture] perf sees {} at {s:.2} %, outside the {lo}..{hi} % the fixture \
                     is built for",
                    check.target.label()
                ));
            }
        }
    }
    if e.samples < MIN_SAMPLES {
        failures.push(format!(
            "[ember] only {} samples (< {MIN_SAMPLES})",
            e.samples
        ));
    }
    if complete(e) < bar.ember_min {
        failures.push(format!(
            "[ember] {:.2} % of ember's samples {what} (needs >= {} %; perf {:.2} %; ember: \
             named leaf {:.2} %, reaching {:.2} %)",
            complete(e),
            bar.ember_min,
            complete(p),
            e.pct(e.named_leaf),
            e.pct(e.reach)
        ));
    }
    for (label, d, tol) in c
        .share_failures()
        .into_iter()
        .filter(|_| bar.compare_shares)
    {
        failures.push(format!(
            "[ember] share of {label}: ember {:+.2} points from perf (tolerance {tol:.2})",
            d
        ));
    }
    (c, failures)
}

/// Prints the table when every check passes; else panics with it and the failures.
fn report(c: &Comparison, failures: &[String], notes: &str, e: &[NStack], p: &[NStack]) {
    let table = c.table();
    if failures.is_empty() {
        println!("{table}{notes}");
        return;
    }
    let mut msg = format!(
        "{}: {} check(s) failed\n{table}{notes}",
        c.title,
        failures.len()
    );
    for f in failures {
        let _ = writeln!(msg, "  - {f}");
    }
    let _ = write!(
        msg,
        "--- ember's heaviest stacks ---\n{}--- perf's heaviest stacks ---\n{}",
        describe(e, 8),
        describe(p, 8)
    );
    panic!("{msg}");
}

/// Starts one of our fixtures and waits until it works.
fn start_fixture(path: &str, args: &[&str]) -> Fixture {
    let mut fx = Fixture::spawn(path, args).unwrap_or_else(|e| panic!("starting {path}: {e:#}"));
    fx.wait_for("ready", Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{path} not ready: {e:#}"));
    fx
}

/// Long enough for ember's start, both windows and a margin; killed on drop anyway.
const FIXTURE_SECONDS: &str = "40";

#[test]
fn nofp_qsort_matches_perf_dwarf() {
    if !ready_to_run() {
        return;
    }
    let _lock = sampling_lock();
    let fx = start_fixture(NOFP_QSORT, &["--seconds", FIXTURE_SECONDS]);
    compare(
        &fx,
        &Spec {
            title: "nofp_qsort (C -O2 -fomit-frame-pointer; libc qsort 30 %, memcpy 20 %)",
            roots: START_ROOTS.to_vec(),
            reach_label: "main",
            checks: vec![
                func("main", ALL),
                func("run", ALL),
                locked("sort_round", Some((23.0, 37.0))),
                func("cmp_items", Some((3.0, 25.0))),
                locked("copy_round", Some((13.0, 27.0))),
                locked("hash_round", Some((43.0, 57.0))),
            ],
        },
    );
}

#[test]
fn nofp_cxx_exceptions_deep_recursion_match_perf_dwarf() {
    if !ready_to_run() {
        return;
    }
    let _lock = sampling_lock();
    let fx = start_fixture(NOFP_CXX, &["--seconds", FIXTURE_SECONDS]);
    compare(
        &fx,
        &Spec {
            title: "nofp_cxx (C++ -O2, no frame pointers; exceptions through 48 levels)",
            roots: START_ROOTS.to_vec(),
            reach_label: "main",
            checks: vec![
                func("main", ALL),
                func("nofp::run", ALL),
                func("nofp::dive_a", ALL),
                func("nofp::dive_b", ALL),
                func("nofp::dive_c", ALL),
                locked("nofp::burn_bottom", Some((75.0, 99.5))),
                object("libgcc_s.so", Some((0.5, 25.0))),
            ],
        },
    );
}

#[test]
fn nofp_rust_release_matches_perf_dwarf() {
    if !ready_to_run() {
        return;
    }
    let _lock = sampling_lock();
    let fx = start_fixture(NOFP_RUST, &["--seconds", FIXTURE_SECONDS]);
    compare(
        &fx,
        &Spec {
            title: "nofp_rust (rustc -C opt-level=3, default codegen: no frame pointers)",
            roots: START_ROOTS.to_vec(),
            reach_label: "main",
            checks: vec![
                func("main", ALL),
                func("nofp_rust::main", ALL),
                func("nofp_rust::run", ALL),
                func("nofp_rust::round", ALL),
                locked("nofp_rust::crunch", Some((53.0, 67.0))),
                locked("nofp_rust::sort_batch", Some((33.0, 47.0))),
                func("nofp_rust::key_of", Some((5.0, 35.0))),
            ],
        },
    );
}

#[test]
fn nofp_signal_handler_matches_perf_dwarf() {
    if !ready_to_run() {
        return;
    }
    let _lock = sampling_lock();
    let fx = start_fixture(NOFP_SIGNAL, &["--seconds", FIXTURE_SECONDS]);
    compare(
        &fx,
        &Spec {
            title: "nofp_signal (SIGPROF handler burning 30 %, through __restore_rt)",
            roots: START_ROOTS.to_vec(),
            reach_label: "main",
            checks: vec![
                func("main", ALL),
                func("run", ALL),
                // Every handler run interrupts main_burn: the signal frame must lead back to it.
                func("main_burn", ALL),
                func("on_prof", Some((23.0, 37.0))),
                func("handler_burn", Some((23.0, 37.0))),
            ],
        },
    );
}

/// A CPU loop for Debian's own python3 (3.11: stripped, no frame pointers).
const PYTHON_LOOP: &str = r#"
import os
print("pid", os.getpid(), flush=True)
def leaf(n):
    s = 0
    for i in range(n):
        s += i * i
    return s
def middle(n):
    return sorted([leaf(n) % 97 for _ in range(50)])
while True:
    middle(2000)
"#;

#[test]
fn debian_python3_matches_perf_dwarf() {
    if !ready_to_run() {
        return;
    }
    let python = "/usr/bin/python3";
    if !Path::new(python).exists() {
        // Debian's python3 is part of the test image; without it there is nothing to measure.
        panic!("{python} is missing: these tests measure Debian's stock python3");
    }
    let _lock = sampling_lock();
    let fx = Fixture::spawn(python, &["-c", PYTHON_LOOP]).expect("starting python3");
    // Python 3.11 runs nested Python calls in one _PyEval_EvalFrameDefault, so the C stack
    // is main (unnamed: stripped) -> Py_BytesMain -> Py_RunMain -> ... -> PyEval_EvalCode
    // -> _PyEval_EvalFrameDefault [-> PyObject_Malloc/Free...], under libc's start frames.
    thread::sleep(Duration::from_millis(300));
    compare(
        &fx,
        &Spec {
            title: "python3 (Debian's /usr/bin/python3.11, stripped, a CPU loop)",
            roots: [START_ROOTS, &["Py_BytesMain"]].concat(),
            reach_label: "Py_BytesMain / libc start",
            checks: vec![
                func("Py_BytesMain", ALL),
                func("Py_RunMain", ALL),
                func("PyEval_EvalCode", ALL),
                func("_PyEval_EvalFrameDefault", Some((95.0, 100.0))),
                func("PyObject_Free", None),
                func("PyObject_Malloc", None),
            ],
        },
    );
}

/// Writes `mb` MiB of compressible but not trivial text: words from a small vocabulary
/// and numbers, picked by an LCG.
fn write_text(path: &Path, mb: usize) {
    const WORDS: &[&str] = &[
        "ember", "stack", "frame", "unwind", "sample", "perf", "dwarf", "table", "libc", "qsort",
        "memcpy", "signal", "python", "kernel", "process", "thread", "symbol",
    ];
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut out = Vec::with_capacity(mb << 20);
    while out.len() < mb << 20 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let w = WORDS[(x >> 59) as usize % WORDS.len()];
        let _ = write!(out, "{w} {} ", (x >> 40) % 10_000);
        if (x >> 20).is_multiple_of(11) {
            out.push(b'\n');
        }
    }
    fs::write(path, out).expect("writing xz's input");
}

#[test]
fn stripped_xz_matches_perf_dwarf() {
    if !ready_to_run() {
        return;
    }
    let xz = "/usr/bin/xz";
    if !Path::new(xz).exists() {
        panic!("{xz} is missing: this test measures Debian's stripped xz (package xz-utils)");
    }
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("input.txt");
    write_text(&input, 64);
    // `exec` keeps the shell's pid, so the pid it prints is xz's. -T1: one thread.
    let script = format!(
        "echo pid $$; exec {xz} -9 -T1 -c {} > /dev/null",
        input.display()
    );
    let fx = Fixture::spawn("/bin/sh", &["-c", script.as_str()]).expect("starting xz");
    // Let xz allocate its -9 dictionary (~700 MB of page faults) before measuring.
    thread::sleep(Duration::from_millis(1500));
    compare(
        &fx,
        &Spec {
            title: "xz -9 (Debian's stripped /usr/bin/xz and liblzma)",
            roots: START_ROOTS.to_vec(),
            // xz's own main and _start have no symbol (stripped); see START_ROOTS.
            reach_label: "libc start (binary stripped)",
            checks: vec![
                func("lzma_code", Some((95.0, 100.0))),
                object("liblzma.so", Some((95.0, 100.0))),
                object("xz", ALL),
                func("__libc_start_call_main", ALL),
            ],
        },
    );
}

/// A loop of fresh ~30 ms processes for 15 s: ember records the whole host (a
/// `--pid` filter cannot name processes that do not exist yet), perf follows the
/// launcher's children. Over the samples of those children: ≥ 95 % must have a named
/// leaf and reach main.
#[test]
fn short_processes_loop_named_and_complete() {
    if !ready_to_run() {
        return;
    }
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("ember.pb.gz");
    let run_s = 15;
    let run_arg = run_s.to_string();
    let mut launcher = Fixture::spawn(
        BURST_LAUNCHER,
        &[
            "--seconds",
            run_arg.as_str(),
            "--wait-start",
            "--linger",
            "--",
            NOFP_BURST,
            "--ms",
            "30",
        ],
    )
    .expect("starting burst_launcher");
    let ember_window = format!("{}s", run_s + 3);
    let ember = start_ember(dir.path(), &out, &["--duration", ember_window.as_str()]);
    let rec = PerfRecord::start(launcher.pid, run_s + 2, dir.path()).expect("starting perf");
    // perf attaches to the launcher before it runs `sleep`; give it a moment.
    thread::sleep(Duration::from_millis(500));
    launcher.start().expect("starting the loop");

    let mut children: HashSet<u32> = HashSet::new();
    let mut reported: Option<u64> = None;
    loop {
        let line = launcher
            .next_line(Duration::from_secs(u64::from(run_s) + 15))
            .expect("burst_launcher output");
        if let Some(p) = line.strip_prefix("pid ") {
            children.insert(p.trim().parse().expect("child pid"));
        } else if let Some(n) = line.strip_prefix("children ") {
            reported = n.trim().parse().ok();
        } else if line == "done" {
            break;
        }
    }
    let data = rec
        .finish(Duration::from_secs(u64::from(run_s) + 30))
        .expect("perf record");
    let profile = finish_ember(ember, &out);

    let e_stacks = from_ember(
        &stacks(&profile)
            .into_iter()
            .filter(|s| {
                s.pid
                    .and_then(|p| u32::try_from(p).ok())
                    .is_some_and(|p| children.contains(&p))
            })
            .collect::<Vec<_>>(),
    );
    let perf_samples = perf::script(&data).expect("perf script");
    let p_stacks = from_perf(perf_samples.iter().filter(|s| children.contains(&s.pid)));
    // ember samples every CPU at any moment, so it also catches a child while the kernel
    // loads it, while ld.so relocates it and while it exits (~3 % of a 30 ms life); perf,
    // whose inherited counters first fire a period into a child's life, hardly does. Those
    // stacks are complete but cannot reach main: they are counted and set aside.
    let outside =
        |v: &[NStack]| -> u64 { v.iter().filter(|s| outside_main(s)).map(|s| s.count).sum() };
    let (e_outside, p_outside) = (outside(&e_stacks), outside(&p_stacks));
    let e_stacks: Vec<NStack> = e_stacks.into_iter().filter(|s| !outside_main(s)).collect();
    let p_stacks: Vec<NStack> = p_stacks.into_iter().filter(|s| !outside_main(s)).collect();

    let spec = Spec {
        title: "nofp_burst loop (fresh 30 ms processes for 15 s, no frame pointers)",
        roots: START_ROOTS.to_vec(),
        reach_label: "main",
        checks: vec![
            func("main", Some((95.0, 100.0))),
            func("burst_child", Some((95.0, 100.0))),
            func("burst_sort", Some((25.0, 55.0))),
            func("burst_cmp", Some((2.0, 30.0))),
            func("burst_spin", Some((45.0, 75.0))),
        ],
    };
    // The issue's bar: 95 % with a named leaf and reaching main, for ember and perf. A
    // child's ranges are in the sampler before its first instruction (the exec hook), and
    // libraries ld.so maps are found by the walker in the child's memory map.
    // Shares are printed, not compared: ember's cpu-clock events run on every CPU and
    // sample a child from its first millisecond, perf's inherited per-task counters start
    // a period late in each child, so each weighs the children's phases differently.
    let bar = Bar {
        named_leaf: true,
        ember_min: 95.0,
        perf_min: 95.0,
        compare_shares: false,
    };
    let (c, mut failures) = evaluate(&spec, &e_stacks, &p_stacks, true, &bar);
    let (e, p) = (&c.ember, &c.perf);
    if 2 * e.samples < p.samples {
        failures.push(format!(
            "[ember] {} samples of the children against perf's {}: ember loses most of them",
            e.samples, p.samples
        ));
    }
    let n_children = children.len();
    if n_children < 200 {
        failures.push(format!(
            "[fixture] only {n_children} children started in {run_s} s (expected ~450)"
        ));
    }
    let notes = format!(
        "{n_children} children seen (launcher reports {}); ember recorded the whole host, \
         perf followed the launcher; samples outside main (exec, ld.so, exit) set aside: \
         ember {e_outside}, perf {p_outside}\n",
        reported.map_or("nothing".to_string(), |n| n.to_string())
    );
    report(&c, &failures, &notes, &e_stacks, &p_stacks);
}
