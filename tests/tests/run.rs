//! `ember run`: window files, the HTTP endpoints, and a clean exit on SIGTERM.

use std::fs;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use ember_tests::*;

/// (f) Windows are written and valid, /metrics is served, SIGTERM exits 0 promptly.
#[test]
fn run_writes_windows_serves_metrics_and_stops_on_sigterm() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let addr = format!("127.0.0.1:{}", free_port());

    let mut hog = Fixture::spawn(CPU_HOG, &["--seconds", "60"]).expect("starting cpu_hog");
    hog.wait_for("ready", Duration::from_secs(10))
        .expect("ready");

    let mut ember = Ember::spawn(
        &[
            "run",
            "--window",
            "2s",
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--listen",
            addr.as_str(),
        ],
        dir.path(),
    )
    .expect("starting ember run");
    let started = Instant::now();
    if ember.wait_attached(Duration::from_secs(15)).is_none() && !ember.running() {
        panic!("ember run exited early\n--- stderr ---\n{}", ember.stderr());
    }

    // /healthz answers once the server is up.
    let health = loop {
        match http_get(&addr, "/healthz") {
            Ok(r) => break r,
            Err(e) if started.elapsed() > Duration::from_secs(10) => panic!(
                "no answer on http://{addr}/healthz after 10 s: {e}\n--- stderr ---\n{}",
                ember.stderr()
            ),
            Err(_) => thread::sleep(Duration::from_millis(100)),
        }
    };
    assert_eq!(health.0, 200, "/healthz: {health:?}");

    // Let two windows close, then scrape.
    let until = started + Duration::from_secs(5);
    thread::sleep(until.saturating_duration_since(Instant::now()));
    let (status, metrics) = http_get(&addr, "/metrics").expect("scraping /metrics");
    assert_eq!(status, 200, "/metrics status\n{metrics}");
    let samples = metric_value(&metrics, "ember_samples_total");
    println!(
        "ember_samples_total = {samples:?}; samples_lost {:?}; frames {:?}",
        metrics
            .lines()
            .filter(|l| l.starts_with("ember_samples_lost_total"))
            .collect::<Vec<_>>(),
        metrics
            .lines()
            .filter(|l| l.starts_with("ember_frames_total"))
            .collect::<Vec<_>>()
    );
    assert!(
        samples.is_some_and(|v| v > 0.0),
        "/metrics has no positive ember_samples_total:\n{metrics}"
    );
    let (status, index) = http_get(&addr, "/").expect("GET /");
    assert_eq!(status, 200, "GET / status\n{index}");

    let until = started + Duration::from_secs(7);
    thread::sleep(until.saturating_duration_since(Instant::now()));
    ember.signal(libc::SIGTERM);
    let t = Instant::now();
    let status = ember.wait(Duration::from_secs(5));
    let stderr = ember.stderr();
    println!("--- ember run stderr ---\n{stderr}---");
    println!(
        "ember run exited {status} {:.2?} after SIGTERM",
        t.elapsed()
    );
    assert!(
        status.success(),
        "ember run exited with {status} after SIGTERM\n{stderr}"
    );
    drop(hog);

    let mut windows: Vec<PathBuf> = fs::read_dir(&data)
        .unwrap_or_else(|e| panic!("reading {}: {e}", data.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| ember_tests::is_cpu_window(p))
        .collect();
    windows.sort();
    println!("windows: {windows:?}");
    assert!(
        windows.len() >= 2,
        "expected at least 2 window files in {} after ~7 s with --window 2s, got {windows:?}",
        data.display()
    );
    let mut all = 0;
    for w in &windows {
        let name = w.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        assert!(
            name.starts_with("20"),
            "window file {name} should be named by its UTC timestamp"
        );
        let n = pprofcheck(w);
        let p = read_profile(w).expect("decoding a window");
        assert_eq!(
            n as usize,
            p.sample.len(),
            "pprofcheck and prost agree on {name}"
        );
        all += total(&stacks(&p));
    }
    assert!(all > 0, "no samples in any window");
}
