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
//! events) and perf (Debian: linux-perf, in `make test-deps`). About 100 s in all.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use ember_tests::completeness::{
    describe, from_ember, from_perf, measure, outside_main, share_tolerance, Comparison, NFrame,
    NStack, Side, Target, START_ROOTS,
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
    let mut full = Vec::new();
    full.extend_from_slice(args);
    full.extend_from_slice(&["-o", out.to_str().expect("utf-8 path")]);
    let mut ember = EmberRun::record(dir)
        .args(full.iter().copied())
        .try_spawn()
        .expect("starting ember record");
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
/// Runs ember and perf dwarf on the fixture at once and checks `spec`; returns ember's stacks.
fn compare(fx: &Fixture, spec: &Spec) -> Vec<NStack> {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("ember.pb.gz");
    let pid = fx.pid;
    let pid_s = pid.to_string();
    let ember_window = format!("{}s", SECONDS + 1);
    // The native walk against perf's: Python frames (checked against py-spy in
    // tests/python.rs) would add frames perf does not have and hide the eval loop's.
    let config = dir.path().join("native.yaml");
    fs::write(&config, "interpreters:\n  python:\n    enabled: false\n").expect("config");
    let ember = start_ember(
        dir.path(),
        &out,
        &[
            "--duration",
            ember_window.as_str(),
            "--pid",
            pid_s.as_str(),
            "--config",
            config.to_str().expect("utf-8"),
        ],
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
    e_stacks
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
                // Not below the first levels of each round's dive, nor run()'s catch:
                // perf has seen dive_c in 98.99 % of its samples.
                func("nofp::dive_b", Some((97.0, 100.0))),
                func("nofp::dive_c", Some((97.0, 100.0))),
                // Not phase-locked: how long each round's throw takes varies, and with
                // it the round's share of burning (83-88 % over runs); ember minus perf
                // measured -1.2 to +2.6 points over 6 runs: sampling noise, not a 2-point bar.
                func("nofp::burn_bottom", Some((75.0, 99.5))),
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
    let ember = compare(
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
    // The handler's caller is the trampoline, named at its first byte (the handler's
    // return address, which no call precedes; the byte before it is libc's padding, where
    // perf leaves it `[unknown]`).
    let (mut handler, mut through) = (0u64, 0u64);
    for s in &ember {
        let names: Vec<&str> = s.frames.iter().map(|f| f.name.as_str()).collect();
        if let Some(at) = names.iter().position(|&n| n == "on_prof") {
            handler += s.count;
            if names.get(at + 1) == Some(&"__restore_rt") {
                through += s.count;
            }
        }
    }
    println!("on_prof samples {handler}, called from a named __restore_rt {through}");
    assert!(
        handler > 0 && through as f64 >= 0.97 * handler as f64,
        "on_prof samples {handler}, called from a named __restore_rt {through}"
    );
}

#[test]
fn nofp_vdso_matches_perf_dwarf() {
    if !ready_to_run() {
        return;
    }
    let _lock = sampling_lock();
    let fx = start_fixture(NOFP_VDSO, &["--seconds", FIXTURE_SECONDS]);
    compare(
        &fx,
        &Spec {
            title: "nofp_vdso (clock_gettime in the vDSO 50 %, no frame pointers)",
            roots: START_ROOTS.to_vec(),
            reach_label: "main",
            checks: vec![
                func("main", ALL),
                func("run", ALL),
                // Every sample in the vDSO must lead back through libc to clock_round.
                locked("clock_round", Some((43.0, 57.0))),
                object("[vdso]", Some((30.0, 57.0))),
                // Named from the agent's own vDSO image, as perf names it.
                func("__vdso_clock_gettime", Some((30.0, 57.0))),
                locked("spin_round", Some((43.0, 57.0))),
            ],
        },
    );
}

/// Builds `fixtures/go_hot.go` with Debian's go toolchain into `dir`.
fn build_go_hot(dir: &Path) -> std::path::PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/go_hot.go");
    let bin = dir.join("go_hot");
    let out = std::process::Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg(&src)
        .env("GO111MODULE", "off")
        .env("GOFLAGS", "")
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPATH", dir.join("gopath"))
        .output()
        .expect("running go (Debian: golang-go, in make test-deps)");
    assert!(
        out.status.success(),
        "go build go_hot.go failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

/// Where a Go goroutine's stack (`runtime.goexit`) or an M's system stack (`runtime.clone`
/// and `runtime.mstart` for a new thread, `runtime.rt0_go` for the first) begins.
const GO_ENTRIES: &[&str] = &[
    "runtime.goexit.abi0",
    "runtime.goexit",
    "runtime.clone.abi0",
    "runtime.clone",
    "runtime.mstart.abi0",
    "runtime.mstart",
    "runtime.rt0_go.abi0",
    "runtime.rt0_go",
];

/// Where Go switches a thread to its system stack (g0) for the scheduler, stack growth or
/// runtime work: ember walks the system stack to the switch and no further (README, limits).
const GO_SWITCHES: &[&str] = &[
    "runtime.mcall",
    "runtime.systemstack.abi0",
    "runtime.systemstack",
    "runtime.morestack.abi0",
    "runtime.morestack",
];

/// A Go binary: frame pointers, no `.eh_frame` (its call frame information is only in
/// `.debug_frame`), frameless leaf functions, goroutine stacks from `runtime.goexit`.
///
/// perf is no reference here: on this very binary `perf record --call-graph dwarf`
/// gives one-frame stacks (its DWARF unwinder does not walk Go's frames), and its
/// frame-pointer walk loses the caller of every frameless leaf. The truth is the
/// program's structure: every sample reaches `main.main`, and `main.keyOf` (a leaf with
/// no frame of its own) is only ever called by the sort's closure.
#[test]
fn go_binary_reaches_main_through_frameless_leaves() {
    if !ready_to_run() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = build_go_hot(dir.path());
    let bin = bin.to_str().expect("utf-8 path");
    let _lock = sampling_lock();
    let fx = start_fixture(bin, &["--seconds", FIXTURE_SECONDS]);
    let out = dir.path().join("ember.pb.gz");
    let pid_s = fx.pid.to_string();
    let window = format!("{SECONDS}s");
    let ember = start_ember(
        dir.path(),
        &out,
        &["--duration", window.as_str(), "--pid", pid_s.as_str()],
    );
    let profile = finish_ember(ember, &out);
    let is = |f: &NFrame, names: &[&str]| names.contains(&f.name.as_str());
    let from_entry = |s: &NStack| s.frames.last().is_some_and(|f| is(f, GO_ENTRIES));
    // The runtime's own goroutines and threads (GC workers, the scavenger, sysmon, the
    // scheduler) never run main.main, and how much they run varies from run to run: they
    // are left out when whole, that is, walked down to a goroutine's or thread's entry.
    // So is the runtime's work on a system stack (preemption, scheduling), walked to the
    // stack switch, which Go's own profiler does not give to main.main either; at most
    // 2.5 %: it was 1-3 samples in ~800 in local runs, and 9 in 816 (1.1 %) in a fresh
    // clone's CI run on a busy host (sysmon preempts a goroutine running 10 ms, more often
    // when the host's CPUs are shared).
    // A stack cut short anywhere else stays in.
    let (runtime, e): (Vec<NStack>, Vec<NStack>) = from_ember(&stacks_of(&profile, fx.pid))
        .into_iter()
        .partition(|s| {
            !s.frames.iter().any(|f| f.name.starts_with("main."))
                && (from_entry(s) || s.frames.iter().any(|f| is(f, GO_SWITCHES)))
        });
    let runtime_samples: u64 = runtime.iter().map(|s| s.count).sum();
    let switched: u64 = runtime
        .iter()
        .filter(|s| !from_entry(s))
        .map(|s| s.count)
        .sum();
    let targets = [
        Target::func("main.main"),
        Target::func("main.run"),
        Target::func("main.sortRound"),
        Target::func("main.keyOf"),
        Target::func("main.spinRound"),
    ];
    let side = measure(&e, &["main.main"], &targets);
    // Samples whose leaf is keyOf, and of those, the ones whose next frame is its caller.
    let (mut leaf_key, mut leaf_key_caller) = (0u64, 0u64);
    for s in &e {
        if s.frames.first().is_some_and(|f| f.name == "main.keyOf") {
            leaf_key += s.count;
            if s.frames
                .get(1)
                .is_some_and(|f| f.name == "main.sortRound.func1")
            {
                leaf_key_caller += s.count;
            }
        }
    }
    let mut table = format!(
        "go_hot: {} samples ({runtime_samples} more of the runtime's own, left out, \
         {switched} of them on a system stack), {:.2} % reach main.main; keyOf as leaf \
         {leaf_key}, with its caller {leaf_key_caller}\n",
        side.samples,
        side.pct(side.reach)
    );
    for (t, share) in targets.iter().zip(&side.shares) {
        let _ = writeln!(table, "  {:<20} {share:6.2} %", t.label());
    }
    let mut failures = Vec::new();
    if side.samples < MIN_SAMPLES {
        failures.push(format!("only {} samples", side.samples));
    }
    if switched as f64 > 0.025 * side.samples as f64 {
        failures.push(format!("{switched} samples on a system stack (> 2.5 %)"));
    }
    if side.pct(side.reach) < REACH_MIN {
        failures.push(format!(
            "{:.2} % reach main.main (< {REACH_MIN} %)",
            side.pct(side.reach)
        ));
    }
    // The fixture predates ember: its first samples, before its table is loaded, are
    // walked by the frame pointer (reaching main.main, losing a frameless leaf's caller).
    if leaf_key == 0 || (leaf_key_caller as f64) < 0.95 * leaf_key as f64 {
        failures.push("keyOf's caller is lost (frameless leaf walked as if it had a frame)".into());
    }
    // main.run is the caller of spinRound, itself a frameless leaf: like keyOf's caller,
    // it is lost in the samples taken before the fixture's table is loaded, walked by the
    // frame pointer (a few in a thousand).
    for (i, (lo, hi)) in [
        (1, (REACH_MIN - 1.0, 100.0)),
        (2, (20.0, 60.0)),
        (4, (40.0, 80.0)),
    ] {
        let share = side.shares[i];
        if share < lo || share > hi {
            failures.push(format!(
                "{} at {share:.2} %, not in {lo}..{hi} %",
                targets[i].label()
            ));
        }
    }
    let short: Vec<NStack> = e
        .iter()
        .filter(|s| !s.frames.iter().any(|f| f.name == "main.run"))
        .cloned()
        .collect();
    assert!(
        failures.is_empty(),
        "{table}failures: {failures:?}\n--- heaviest stacks ---\n{}\n--- those not reaching \
         main.run ---\n{}",
        describe(&e, 8),
        describe(&short, 12)
    );
    println!("{table}");
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

/// Busy python for about a second, then exit.
const PYTHON_SECOND: &str = r#"
import time
def leaf(n):
    s = 0
    for i in range(n):
        s += i * i
    return s
end = time.monotonic() + 1.0
while time.monotonic() < end:
    leaf(2000)
"#;

/// The table byte cap (`sampling.unwind_max_bytes`): a host with more executables than
/// the cap holds keeps walking the hot ones by their tables, evicts the cold ones
/// (counted), and the map memory never goes over the cap.
///
/// Six copies of Debian's python3, each made distinct by a few bytes appended (so each
/// gets its own ~470 KiB table), run one after another for a second each, while
/// nofp_qsort runs throughout; the cap (1.25 MiB) holds about two python tables beside
/// libc's and the fixture's. `ember run` is scraped every 200 ms for
/// `ember_unwind_map_bytes` and the evictions. Tables walked in the last 500 ms are never
/// evicted, so a new one that does not fit beside them is refused (`over_budget`) rather
/// than evicting the hot ones.
/// A shell that runs each of `copies` (python3 copies) with [`PYTHON_SECOND`], one after
/// another, once a line comes on its stdin, printing each one's pid.
fn copies_launcher(copies: &[String]) -> std::process::Child {
    let script = r#"read go; for c in "$@"; do "$c" -c "$PROG" & p=$!; echo "$p"; wait "$p" || exit 1; done"#;
    std::process::Command::new("sh")
        .args(["-c", script, "sh"])
        .args(copies)
        .env("PROG", PYTHON_SECOND)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("starting the copies' launcher")
}

/// Starts the copies of [`copies_launcher`] and waits for the last one: their pids.
fn run_copies(mut launcher: std::process::Child) -> HashSet<u32> {
    use std::io::BufRead as _;
    let mut stdin = launcher.stdin.take().expect("launcher stdin");
    writeln!(stdin, "go").expect("starting the copies");
    let out = launcher.stdout.take().expect("launcher stdout");
    let pids: HashSet<u32> = std::io::BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let status = wait_timeout(&mut launcher, Duration::from_secs(30))
        .expect("waiting for the launcher")
        .expect("the python copies did not finish");
    assert!(status.success(), "a python copy failed: {status}");
    pids
}

/// Waits (at most `limit`) for a CPU window of `data` in which `pid`'s samples reach `main`
/// (its unwind table is loaded); the windows written until then.
fn hot_windows_reaching_main(data: &Path, pid: u32, limit: Duration) -> HashSet<PathBuf> {
    let deadline = Instant::now() + limit;
    let mut seen = HashSet::new();
    loop {
        let mut fresh: Vec<PathBuf> = fs::read_dir(data)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        fresh.retain(|p| ember_tests::is_cpu_window(p) && !seen.contains(p));
        for w in fresh {
            let hot: Vec<_> = read_profile(&w)
                .map(|p| stacks(&p))
                .unwrap_or_default()
                .into_iter()
                .filter(|s| s.pid == Some(i64::from(pid)))
                .collect();
            seen.insert(w);
            let m = measure(&from_ember(&hot), START_ROOTS, &[]);
            if m.samples >= 20 && m.pct(m.reach) >= 95.0 {
                return seen;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no window in {limit:?} where the hot process reaches main: its table never loaded"
        );
        thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn table_byte_cap_keeps_hot_tables_and_evicts_cold_ones() {
    if !ready_to_run() {
        return;
    }
    let python = fs::canonicalize("/usr/bin/python3").expect("Debian's python3 (make test-deps)");
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().expect("tempdir");
    let cap: u64 = 1_310_720;
    let copies: Vec<String> = (0..6u8)
        .map(|i| {
            let path = dir.path().join(format!("python3-copy{i}"));
            let mut bytes = fs::read(&python).expect("reading python3");
            // A padding byte of the ELF header (e_ident[EI_NIDENT - 1], ignored by the
            // kernel): the program is unchanged, but the header is an input of its unwind
            // table's key, so each copy needs a table of its own.
            bytes[15] = i + 1;
            fs::write(&path, bytes).expect("writing a python copy");
            fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .expect("chmod");
            path.to_str().expect("utf-8").to_string()
        })
        .collect();
    let hot = start_fixture(NOFP_QSORT, &["--seconds", "60"]);
    let launcher = copies_launcher(&copies);
    // Only the hot process and the copies (children of the launcher): the other processes
    // of a busy host, this test's included, would hold tables of their own under so small
    // a cap.
    let config = dir.path().join("ember.yaml");
    fs::write(
        &config,
        format!(
            "sampling:\n  unwind_max_bytes: {cap}\n  unwind_cache_dir: \"\"\n  pids: [{}, {}]\n  \
             subprocesses: true\n",
            hot.pid,
            launcher.id()
        ),
    )
    .expect("writing the config");
    let data = dir.path().join("data");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut ember = EmberRun::run(dir.path())
        .args([
            "--config",
            config.to_str().expect("utf-8"),
            "--window",
            "2s",
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--listen",
            addr.as_str(),
        ])
        .try_spawn()
        .expect("starting ember run");
    if ember.wait_attached(Duration::from_secs(15)).is_none() && !ember.running() {
        panic!("ember run exited early\n--- stderr ---\n{}", ember.stderr());
    }

    // Scrape while the cold processes come and go.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scraper = {
        let (addr, stop) = (addr.clone(), stop.clone());
        thread::spawn(move || {
            let (mut max_bytes, mut scrapes) = (0f64, 0u32);
            let mut last = String::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok((200, text)) = http_get(&addr, "/metrics") {
                    if let Some(b) = metric_value(&text, "ember_unwind_map_bytes") {
                        max_bytes = max_bytes.max(b);
                        scrapes += 1;
                    }
                    last = text;
                }
                thread::sleep(Duration::from_millis(200));
            }
            (max_bytes, scrapes, last)
        })
    };
    // The hot process's table loads first (on a loaded host the loader's first reads of
    // every process take a while): the cap is then tested against tables it already holds.
    let warm = hot_windows_reaching_main(&data, hot.pid, Duration::from_secs(30));
    let cold_pids = run_copies(launcher);
    // Two more windows of the hot process alone.
    thread::sleep(Duration::from_secs(4));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (max_bytes, scrapes, metrics) = scraper.join().expect("scraper thread");
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(20));
    assert!(
        status.success(),
        "ember run exited {status}\n{}",
        ember.stderr()
    );

    let counter = |family: &str, label: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("{family}{{")) && l.contains(label))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let evicted = counter("ember_cache_dropped_total", "cache=\"unwind_tables\"");
    let refused = counter("ember_unwind_tables_built_total", "result=\"over_budget\"");
    let cached = counter("ember_unwind_row_lookups_total", "result=\"cached\"");
    let searched = counter("ember_unwind_row_lookups_total", "result=\"searched\"");
    let procs = metric_value(&metrics, "ember_unwind_processes").unwrap_or(0.0);
    let mut hot_stacks = Vec::new();
    let mut cold_stacks = Vec::new();
    let mut windows: Vec<_> = fs::read_dir(&data)
        .expect("window dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| ember_tests::is_cpu_window(p))
        .collect();
    windows.sort();
    for w in &windows {
        let p = read_profile(w).expect("reading a window");
        for s in stacks(&p) {
            match s.pid.and_then(|p| u32::try_from(p).ok()) {
                Some(p) if p == hot.pid && !warm.contains(w) => hot_stacks.push(s),
                Some(p) if cold_pids.contains(&p) => cold_stacks.push(s),
                _ => {}
            }
        }
    }
    let hot_side = measure(&from_ember(&hot_stacks), START_ROOTS, &[]);
    let cold_roots = [START_ROOTS, &["Py_BytesMain"]].concat();
    let cold_side = measure(&from_ember(&cold_stacks), &cold_roots, &[]);
    let summary = format!(
        "cap {cap} B: map bytes at most {max_bytes} over {scrapes} scrapes; tables evicted \
         {evicted}, refused {refused}; rows {cached} cached, {searched} searched; {procs} processes \
         with ranges at the end; hot nofp_qsort {} samples, {:.2} % reach main; the \
         python copies {} samples, {:.2} % reach Py_BytesMain / libc start",
        hot_side.samples,
        hot_side.pct(hot_side.reach),
        cold_side.samples,
        cold_side.pct(cold_side.reach)
    );
    println!("{summary}");
    assert!(scrapes >= 10, "too few scrapes: {summary}");
    assert!(max_bytes > 0.0, "no unwind map memory seen: {summary}");
    assert!(max_bytes <= cap as f64, "over the cap: {summary}");
    // The cap acted: a table was evicted, or refused beside tables still in use (on a
    // quiet host the copies follow each other within the 500 ms "in use" window).
    assert!(evicted + refused >= 1.0, "the cap never acted: {summary}");
    assert!(hot_side.samples >= MIN_SAMPLES, "{summary}");
    // The fixture predates ember: its first samples, before its table loads, are walked by
    // the frame pointer; a hot process whose table was evicted falls far below this.
    assert!(
        hot_side.pct(hot_side.reach) >= 97.0,
        "hot process lost its table: {summary}"
    );
    // The walker's row cache: a hot process's frames repeat, so most rows come from it.
    assert!(searched > 0.0 && cached > searched, "row cache: {summary}");
    // How many of the cold copies' samples are complete depends on what else the host
    // runs (tables walked in the last 500 ms are never evicted for them): printed only.
}

/// A program with no call frame information at all: `.eh_frame` removed after linking.
const NO_CFI_SRC: &str = r#"
#include <time.h>
static volatile unsigned long sink;
int main(void) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        for (int i = 0; i < 100000; i++) sink += i;
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < 300);
    return 0;
}
"#;

/// An object that compiles to no unwind table is parsed once, not at every process that
/// maps it: five short runs of one no-CFI program count one `no_cfi` build (each used to
/// read and parse the file again, and count again).
#[test]
fn an_object_without_cfi_is_parsed_once() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("nocfi.c");
    let bin = dir.path().join("nocfi");
    fs::write(&src, NO_CFI_SRC).expect("writing the source");
    let out = std::process::Command::new("clang")
        .args([
            "-O2",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
            "-o",
        ])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("running clang (make deps)");
    assert!(
        out.status.success(),
        "clang: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new("objcopy")
        .args([
            "--remove-section",
            ".eh_frame",
            "--remove-section",
            ".eh_frame_hdr",
        ])
        .arg(&bin)
        .output()
        .expect("running objcopy");
    assert!(
        out.status.success(),
        "objcopy: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let data = dir.path().join("data");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut ember = EmberRun::run(dir.path())
        .args([
            "--window",
            "2s",
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--listen",
            addr.as_str(),
        ])
        .try_spawn()
        .expect("starting ember run");
    if ember.wait_attached(Duration::from_secs(15)).is_none() && !ember.running() {
        panic!("ember run exited early\n--- stderr ---\n{}", ember.stderr());
    }
    let no_cfi = || {
        let (code, text) = http_get(&addr, "/metrics").expect("scraping ember");
        assert_eq!(code, 200);
        text.lines()
            .find(|l| l.starts_with("ember_unwind_tables_built_total{") && l.contains("\"no_cfi\""))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    thread::sleep(Duration::from_secs(1));
    let before = no_cfi();
    const RUNS: usize = 5;
    for _ in 0..RUNS {
        let status = std::process::Command::new(&bin)
            .status()
            .expect("running the no-CFI program");
        assert!(status.success());
        // Its exec record has been read and the process loaded.
        thread::sleep(Duration::from_millis(200));
    }
    thread::sleep(Duration::from_secs(1));
    let counted = no_cfi() - before;
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(20));
    assert!(
        status.success(),
        "ember run exited {status}\n{}",
        ember.stderr()
    );
    println!("{RUNS} runs of one no-CFI program: {counted} no_cfi builds counted");
    // One for the program (another object without CFI on a busy host may add one).
    assert!(counted >= 1.0, "the no-CFI program was never seen");
    assert!(
        counted <= 2.0,
        "parsed again for each process: {counted} builds for {RUNS} runs"
    );
}
