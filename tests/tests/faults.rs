//! Fault tests: the real agent against hostile or broken surroundings, each with its
//! expected outcome asserted (issue 13). More fault tests live beside the code they
//! exercise, with real processes too: JVM attach against a listener that never accepts,
//! one that dribbles and a socket swapped for a symlink (normalize/jit/jvm.rs), nested
//! perf-map lines (normalize/jit/perfmap.rs), renames and non-UTF-8 names
//! (normalize/process.rs), `Retry-After: u64::MAX` (export/delivery.rs), a full,
//! read-only or removed window directory and a clock stepped back a day
//! (export/files.rs).
//!
//! Every test here samples, so each holds [`sampling_lock`] and needs root.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use ember_tests::*;

/// Path of the fixture `jit_hog` (see `tests/fixtures/jit_hog.c`).
const JIT_HOG: &str = env!("FIXTURE_JIT_HOG");

/// Value of the series `line_prefix` (name and labels) in an exposition, 0 if absent.
fn series(metrics: &str, line_prefix: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(line_prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `ember run` with 1 s windows on `pids` (all if empty), its data dir and HTTP port.
fn run(dir: &Path, data: &Path, config: &str, pids: &[u32]) -> (Ember, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let cfg = dir.join("ember.yaml");
    fs::write(&cfg, config).expect("config");
    let pid_args: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
    let mut args = vec![
        "run",
        "--config",
        cfg.to_str().expect("utf-8"),
        "--window",
        "1s",
        "--data-dir",
        data.to_str().expect("utf-8"),
        "--listen",
        addr.as_str(),
    ];
    for p in &pid_args {
        args.extend(["--pid", p.as_str()]);
    }
    let mut ember = Ember::spawn(&args, dir).expect("starting ember run");
    if ember.wait_attached(Duration::from_secs(20)).is_none() && !ember.running() {
        panic!("ember run exited early\n--- stderr ---\n{}", ember.stderr());
    }
    (ember, addr)
}

/// Peak resident memory of `pid`, in bytes (`VmHWM`).
fn peak_rss(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// Polls `/metrics` until `done` holds or `timeout` passes; returns the last scrape.
fn metrics_until(addr: &str, timeout: Duration, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let text = http_get(addr, "/metrics")
            .map(|(_, t)| t)
            .unwrap_or_default();
        if done(&text) || Instant::now() >= deadline {
            return text;
        }
        thread::sleep(Duration::from_millis(250));
    }
}

/// Four processes whose perf maps hold 64 MB each of 64 KiB names: ember keeps its JIT
/// tables within the byte budget (counted refusals), still names the real JIT frames,
/// and its peak RSS stays far below what reading the maps whole would take.
#[test]
fn four_64mb_perf_maps_stay_within_the_jit_byte_budget() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let tmp = tempfile::tempdir().expect("tmp");
    let mut hogs = Vec::new();
    for _ in 0..4 {
        let mut hog = Fixture::spawn(JIT_HOG, &["--perf-map", "--seconds", "30", "--wait-start"])
            .expect("jit_hog");
        let _ = hog
            .next_line(Duration::from_secs(10))
            .expect("hostpid line");
        let map = format!("/tmp/perf-{}.map", hog.pid);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !Path::new(&map).exists() {
            assert!(Instant::now() < deadline, "{map} not written");
            thread::sleep(Duration::from_millis(20));
        }
        // Appended after the real lines: 1,000 lines of 64 KiB names (64 MB), at low
        // addresses that overlap no real code.
        let mut f = fs::OpenOptions::new().append(true).open(&map).expect("map");
        let name = "n".repeat((64 << 10) - 64);
        for i in 0..1000u64 {
            writeln!(f, "{:x} 10 {name}{i}", 0x10_0000 + i * 0x1000).expect("append");
        }
        drop(f);
        hogs.push((hog, map));
    }
    let pids: Vec<u32> = hogs.iter().map(|(h, _)| h.pid).collect();
    let config = "jit:\n  max_file_bytes: 134217728\n  max_bytes_per_process: 4194304\n  \
                  max_total_bytes: 8388608\n";
    let (mut ember, addr) = run(tmp.path(), &tmp.path().join("data"), config, &pids);
    for (hog, _) in &mut hogs {
        hog.start().expect("go");
    }
    let metrics = metrics_until(&addr, Duration::from_secs(30), |m| {
        series(m, "ember_jit_rejects_total{reason=\"bytes\"} ") >= 4.0
            && series(m, "ember_frames_total{result=\"jit\"} ") > 0.0
    });
    let peak = peak_rss(ember.pid());
    let held = series(&metrics, "ember_jit_bytes ");
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(20));
    for (_, map) in &hogs {
        let _ = fs::remove_file(map);
    }
    println!("jit bytes held {held}, peak RSS {} MiB", peak >> 20);
    assert!(
        status.success(),
        "ember exited {status}\n{}",
        ember.stderr()
    );
    assert!(
        held > 0.0 && held <= 8388608.0,
        "ember_jit_bytes {held}\n{metrics}"
    );
    assert!(
        series(&metrics, "ember_jit_rejects_total{reason=\"bytes\"} ") >= 4.0,
        "{metrics}"
    );
    assert!(
        series(&metrics, "ember_frames_total{result=\"jit\"} ") > 0.0,
        "JIT frames still named\n{metrics}"
    );
    // Reading the four maps whole would take 256 MB at once; chunked reads and the
    // byte budget keep the agent well under that.
    assert!(peak < 160 << 20, "peak RSS {} MiB", peak >> 20);
}

fn mount(args: &[&str]) {
    let st = Command::new("mount").args(args).status().expect("mount");
    assert!(st.success(), "mount {args:?}");
}

/// Window files that exist in `dir`.
fn windows(dir: &Path) -> usize {
    fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with(".pb.gz"))
                .count()
        })
        .unwrap_or(0)
}

/// The window directory fills up, turns read-only and is removed under a running agent:
/// each fault is counted and shown by `/healthz`, and windows resume once it is gone.
#[test]
fn a_full_read_only_or_removed_data_dir_is_counted_and_survived() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let tmp = tempfile::tempdir().expect("tmp");
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).expect("mkdir");
    mount(&[
        "-t",
        "tmpfs",
        "-o",
        "size=4m",
        "tmpfs",
        mnt.to_str().expect("utf-8"),
    ]);
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mnt.clone());
    let data = mnt.join("windows");
    let (mut ember, addr) = run(tmp.path(), &data, "", &[]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while windows(&data) < 1 {
        assert!(Instant::now() < deadline, "no window\n{}", ember.stderr());
        thread::sleep(Duration::from_millis(100));
    }

    // Full: a filler takes every free byte.
    let filler = mnt.join("filler");
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=64k"])
        .arg(format!("of={}", filler.display()))
        .stderr(std::process::Stdio::null())
        .status();
    let m = metrics_until(&addr, Duration::from_secs(15), |m| {
        series(m, "ember_window_write_errors_total{reason=\"no_space\"} ") > 0.0
    });
    assert!(
        series(&m, "ember_window_write_errors_total{reason=\"no_space\"} ") > 0.0,
        "{m}"
    );
    let (code, body) = http_get(&addr, "/healthz").expect("healthz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("no space left"), "{body}");
    fs::remove_file(&filler).expect("rm filler");

    // Read-only.
    mount(&["-o", "remount,ro", mnt.to_str().expect("utf-8")]);
    let m = metrics_until(&addr, Duration::from_secs(15), |m| {
        series(m, "ember_window_write_errors_total{reason=\"read_only\"} ") > 0.0
    });
    assert!(
        series(&m, "ember_window_write_errors_total{reason=\"read_only\"} ") > 0.0,
        "{m}"
    );
    let (code, body) = http_get(&addr, "/healthz").expect("healthz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("read-only"), "{body}");
    mount(&["-o", "remount,rw", mnt.to_str().expect("utf-8")]);

    // Removed.
    fs::remove_dir_all(&data).expect("rm data dir");
    let m = metrics_until(&addr, Duration::from_secs(15), |m| {
        series(
            m,
            "ember_window_write_errors_total{reason=\"dir_recreated\"} ",
        ) > 0.0
    });
    assert!(
        series(
            &m,
            "ember_window_write_errors_total{reason=\"dir_recreated\"} "
        ) > 0.0,
        "{m}"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while windows(&data) < 2 {
        assert!(Instant::now() < deadline, "windows did not resume");
        thread::sleep(Duration::from_millis(100));
    }
    let (code, body) = http_get(&addr, "/healthz").expect("healthz");
    assert_eq!(code, 200, "healthy again: {body}");
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(20));
    assert!(
        status.success(),
        "ember exited {status}\n{}",
        ember.stderr()
    );
}
