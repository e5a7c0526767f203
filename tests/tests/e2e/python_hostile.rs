//! A Python process whose frame chain is forged: the walker must stay bounded and say so.
//!
//! Two CPython 3.12 processes rewrite the `previous` pointer of their running frame (through
//! ctypes) and then spin in C (`zlib.compress`, the GIL released) forever: one points it at
//! the frame itself (a cycle), the other at an unmapped address. The sampler walks their
//! chains at every sample. It must stop at its frame cap on the cycle (`truncated`) and at
//! the failed read (`read_error`), keep the frame it did read named, and the agent must stay
//! healthy, small and stoppable. A third process gives its caller's frame a string for a
//! code object: the attach check refuses it (`code_check_failed`) and walks nothing of it.

use std::time::Duration;

use ember_tests::{
    family_sum, free_port, http_get, is_cpu_window, metrics_until, peak_rss, read_profile,
    require_privileged, sampling_lock, series_value, skip, stacks_of, EmberRun, Fixture,
};

const PYTHON: &str = "/root/.pyenv/versions/3.12.1/bin/python3";

/// Forges the running frame's `previous` (3.12: `PyFrameObject.f_frame` at 24,
/// `_PyInterpreterFrame.previous` at 8), then compresses in a loop.
const FORGER: &str = r#"
import ctypes, os, sys, zlib
print("pid", os.getpid(), flush=True)
mode = sys.argv[1]
data = bytes((i * 7919 >> 5) % 23 + 97 for i in range(1 << 20))
def victim():
    f = sys._getframe()
    iframe = ctypes.c_void_p.from_address(id(f) + 24).value
    prev = ctypes.c_void_p.from_address(iframe + 8)
    if mode == "code":
        # The caller's frame (never resumed: this one loops forever) gets a string for
        # its code object: the attach check must refuse the process.
        ctypes.c_void_p.from_address(prev.value).value = id("not a code object")
    else:
        prev.value = iframe if mode == "cycle" else 0xdead0000
    print("forged", flush=True)
    while True:
        zlib.compress(data, 9)
victim()
"#;

#[test]
fn a_forged_frame_chain_costs_a_counted_walk_not_the_agent() {
    if !require_privileged() {
        return;
    }
    if !std::path::Path::new(PYTHON).exists() {
        skip(&format!(
            "{PYTHON} is not on this machine (pyenv's CPython 3.12)"
        ));
        return;
    }
    let _lock = sampling_lock();
    let mut cycle = Fixture::spawn(PYTHON, &["-c", FORGER, "cycle"]).expect("cycle forger");
    let mut unmapped = Fixture::spawn(PYTHON, &["-c", FORGER, "unmapped"]).expect("forger");
    let mut code = Fixture::spawn(PYTHON, &["-c", FORGER, "code"]).expect("code forger");
    for f in [&mut cycle, &mut unmapped, &mut code] {
        f.wait_for("forged", Duration::from_secs(20))
            .expect("forged");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = format!("127.0.0.1:{}", free_port());
    let data = dir.path().join("data");
    let (a, b, c) = (
        cycle.pid.to_string(),
        unmapped.pid.to_string(),
        code.pid.to_string(),
    );
    let mut ember = EmberRun::run(dir.path())
        .args([
            "--pid",
            &a,
            "--pid",
            &b,
            "--pid",
            &c,
            "--window",
            "2s",
            "--listen",
            &addr,
            "--data-dir",
            data.to_str().expect("utf-8"),
        ])
        .try_spawn()
        .expect("ember run");
    let truncated = r#"ember_python_walks_total{result="truncated"}"#;
    let read_error = r#"ember_python_walks_total{result="read_error"}"#;
    let named = r#"ember_python_code_reads_total{result="read"}"#;
    let refused = r#"ember_python_attaches_total{result="code_check_failed"}"#;
    let attached = r#"ember_python_attaches_total{result="attached"}"#;
    let text = metrics_until(&addr, Duration::from_secs(40), |t| {
        series_value(t, truncated) >= 10.0
            && series_value(t, read_error) >= 10.0
            && series_value(t, named) >= 1.0
            && series_value(t, refused) >= 1.0
            && family_sum(t, "ember_interpreter_frames_total", &[("result", "named")]) >= 1.0
    });
    // Per workload (a host process's is its name): the walks and the frames written.
    let stacks = |result: &str| {
        family_sum(
            &text,
            "ember_interpreter_stacks_total",
            &[
                ("workload", "python3"),
                ("runtime", "python"),
                ("result", result),
            ],
        )
    };
    let (health, _) = http_get(&addr, "/healthz").expect("healthz");
    let rss = peak_rss(ember.pid());
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(20));
    println!(
        "walks: truncated {}, read_error {}, ok {}; code objects read {}; agent peak RSS {} MiB",
        series_value(&text, truncated),
        series_value(&text, read_error),
        series_value(&text, r#"ember_python_walks_total{result="ok"}"#),
        series_value(&text, named),
        rss >> 20
    );
    assert!(
        series_value(&text, truncated) >= 10.0,
        "the cycle's walks should end at the frame cap, counted:\n{text}"
    );
    assert!(
        series_value(&text, read_error) >= 10.0,
        "the unmapped frame's walks should end at the read, counted:\n{text}"
    );
    assert!(
        series_value(&text, named) >= 1.0,
        "the forged frame itself is a real code object, named:\n{text}"
    );
    assert!(
        stacks("truncated") >= 1.0 && stacks("read_error") >= 1.0,
        "the walks' results per workload:\n{text}"
    );
    assert!(
        series_value(&text, refused) >= 1.0,
        "a caller frame whose code is a string should fail the attach check:\n{text}"
    );
    assert!(
        series_value(&text, attached) >= 2.0,
        "the cycle and the unmapped chain pass the check (their code objects are real), \
         the forged code does not:\n{text}"
    );
    assert_eq!(health, 200, "/healthz while walking forged chains");
    assert!(rss < 200 << 20, "agent peak RSS {} MiB", rss >> 20);
    assert!(
        status.success(),
        "ember exited {status}:\n{}",
        ember.stderr()
    );
    // The profile, not only the counters: the forged frame of the cycle and of the unmapped
    // chain is a real code object, named in their samples (`victim`); the process refused by
    // the attach check is sampled but carries no Python frame (`victim`, `<module>`) at all.
    let windows = cpu_windows(&data);
    let python_frames = |pid: u32| -> (i64, i64, Vec<String>) {
        let (mut total, mut named) = (0, 0);
        let mut names = Vec::new();
        for p in &windows {
            for s in stacks_of(p, pid) {
                total += s.count();
                let py: Vec<String> = s
                    .frames
                    .iter()
                    .filter(|f| f.name == "victim" || f.name == "<module>")
                    .map(|f| f.name.clone())
                    .collect();
                if s.has("victim") {
                    named += s.count();
                }
                names.extend(py);
            }
        }
        (total, named, names)
    };
    for (what, pid) in [("cycle", cycle.pid), ("unmapped", unmapped.pid)] {
        let (total, named, _) = python_frames(pid);
        assert!(
            total > 0 && named > 0,
            "the {what} forger's samples name its real frame `victim`: {named} of {total}"
        );
    }
    let (total, _, names) = python_frames(code.pid);
    assert!(total > 0, "the refused process was not sampled at all");
    assert!(
        names.is_empty(),
        "the refused process was walked: Python frames {names:?}"
    );
}

/// Every CPU window profile under `data`.
fn cpu_windows(data: &std::path::Path) -> Vec<ember::proto::Profile> {
    let mut out = Vec::new();
    let mut dirs = vec![data.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if is_cpu_window(&p) {
                out.push(read_profile(&p).expect("window profile"));
            }
        }
    }
    out
}

/// The append: a Python process whose leaf is machine code in anonymous memory
/// (`tests/fixtures/py_anon_leaf.py`), recorded with `sampling.unwind: dwarf`, where the native
/// walk stops at that leaf (no table). Without the append those samples would carry no Python
/// frame at all; with it they carry the fixture's fixed chain `<module> -> main -> outer ->
/// spin` (each at its call line, read from the script's `# at:` markers), after the native
/// frames, and `ember_python_walks_total{result="appended"}` counts them.
#[test]
fn python_frames_are_appended_where_the_native_walk_stops() {
    const DEBIAN: &str = "/usr/bin/python3.11";
    if !require_privileged() {
        return;
    }
    if !std::path::Path::new(DEBIAN).exists() {
        skip(&format!("{DEBIAN} is not on this machine"));
        return;
    }
    let _lock = sampling_lock();
    let script = ember_tests::workspace_root().join("tests/fixtures/py_anon_leaf.py");
    let source = std::fs::read_to_string(&script).expect("fixture");
    let line_of = |f: &str| {
        let marker = format!("# at: {f}");
        let i = source.lines().position(|l| l.ends_with(&marker));
        i.map(|i| i + 1).expect("marker")
    };
    // Root first, as folded stacks are written.
    let want = ["<module>", "main", "outer", "spin"];
    for f in want {
        // pprof carries the lines in `Line` entries; the names are checked here, and that
        // each function is the one the script defines.
        assert!(line_of(f) > 0);
    }
    let fx = Fixture::spawn(
        DEBIAN,
        &[script.to_str().expect("utf-8"), "--seconds", "40"],
    )
    .expect("fixture");
    let pid = fx.pid.to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("dwarf.yaml");
    std::fs::write(&config, "sampling:\n  unwind: dwarf\n").expect("config");
    let addr = format!("127.0.0.1:{}", free_port());
    let data = dir.path().join("data");
    let mut ember = EmberRun::run(dir.path())
        .args([
            "--config",
            config.to_str().expect("utf-8"),
            "--pid",
            &pid,
            "--window",
            "5s",
            "--listen",
            &addr,
            "--data-dir",
            data.to_str().expect("utf-8"),
        ])
        .try_spawn()
        .expect("ember run");
    let appended = r#"ember_python_walks_total{result="appended"}"#;
    let text = metrics_until(&addr, Duration::from_secs(40), |t| {
        series_value(t, appended) >= 200.0
    });
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(20));
    drop(fx);
    assert!(
        status.success(),
        "ember exited {status}:\n{}",
        ember.stderr()
    );
    let mut files = Vec::new();
    let mut dirs = vec![data.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if ember_tests::is_cpu_window(&p) {
                files.push(p);
            }
        }
    }
    let pid: i64 = pid.parse().expect("pid");
    let (mut total, mut chained) = (0, 0);
    for f in &files {
        let profile = ember_tests::read_profile(f).expect("window profile");
        for s in ember_tests::stacks(&profile)
            .iter()
            .filter(|s| s.pid == Some(pid))
        {
            total += s.count();
            let root_first: Vec<&str> = s.frames.iter().rev().map(|f| f.name.as_str()).collect();
            if root_first.starts_with(&want) {
                chained += s.count();
            }
        }
    }
    let share = chained as f64 / total.max(1) as f64;
    println!(
        "walks: appended {}, ok {}, no_state {}; {chained} of {total} samples ({:.1} %) \
         start with {want:?}",
        series_value(&text, appended),
        series_value(&text, r#"ember_python_walks_total{result="ok"}"#),
        series_value(&text, r#"ember_python_walks_total{result="no_state"}"#),
        100.0 * share
    );
    assert!(
        series_value(&text, appended) >= 200.0,
        "samples stopped at the anonymous leaf should get their Python frames appended:\n{text}"
    );
    // The counting loop takes milliseconds a call, Python microseconds around it.
    assert!(
        total >= 200 && share >= 0.8,
        "{chained} of {total} samples start with {want:?} (want >= 80 %)"
    );
}
