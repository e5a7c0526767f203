//! ember under a spawn storm inside a CPU-limited cgroup (issue 30: a `find` every 50 ms held
//! the chart's pod, limited to 500m, without a window for over 80 s). Functional, not timed:
//! windows keep coming at their length while hundreds of processes a second start, and the
//! storm's own CPU burners are named (process and function).
//!
//! Needs root and a `cpu` cgroup controller (v1 `cpu.cfs_quota_us`, or v2 `cpu.max` that can
//! be enabled under the root); without the controller the test says so and skips, even with
//! EMBER_REQUIRE_PRIVILEGED=1 (a CI container may not delegate it).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ember_tests::*;

/// Window length of the agent under test.
const WINDOW: Duration = Duration::from_secs(2);
/// How long the storm lasts.
const STORM: Duration = Duration::from_secs(14);

/// A cgroup with half a core of CPU (the chart's limit), removed on drop.
struct CpuLimit {
    dir: PathBuf,
}

impl CpuLimit {
    fn create(name: &str) -> Option<Self> {
        let v1 = Path::new("/sys/fs/cgroup/cpu");
        if v1.join("cpu.cfs_quota_us").exists() {
            let dir = v1.join(name);
            fs::create_dir_all(&dir).ok()?;
            let limit = CpuLimit { dir };
            fs::write(limit.dir.join("cpu.cfs_period_us"), "100000").ok()?;
            fs::write(limit.dir.join("cpu.cfs_quota_us"), "50000").ok()?;
            return Some(limit);
        }
        let v2 = Path::new("/sys/fs/cgroup");
        let controllers = fs::read_to_string(v2.join("cgroup.controllers")).ok()?;
        if !controllers.split_whitespace().any(|c| c == "cpu") {
            return None;
        }
        fs::write(v2.join("cgroup.subtree_control"), "+cpu").ok()?;
        let dir = v2.join(name);
        fs::create_dir_all(&dir).ok()?;
        let limit = CpuLimit { dir };
        fs::write(limit.dir.join("cpu.max"), "50000 100000").ok()?;
        Some(limit)
    }

    /// Moves process `pid` (all its threads) in.
    fn add(&self, pid: u32) {
        fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", self.dir.display()));
    }
}

impl Drop for CpuLimit {
    fn drop(&mut self) {
        // Empty once the agent is gone; retried briefly while it exits.
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Starts `/bin/true` every 5 ms (200 a second) and a `short_lived` burning 20 ms in
/// `hot_short` every 50 ms (20 a second) until `stop`; returns how many of each started.
fn storm(stop: Arc<AtomicBool>) -> (u64, u64) {
    let (mut trues, mut burners) = (0u64, 0u64);
    let mut children: Vec<Child> = Vec::new();
    let started = Instant::now();
    let mut tick = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let mut cmd = if tick.is_multiple_of(10) {
            let mut c = Command::new(SHORT_LIVED);
            c.args(["--seconds", "0.02"]);
            burners += 1;
            c
        } else {
            trues += 1;
            Command::new("/bin/true")
        };
        if let Ok(c) = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn() {
            children.push(c);
        }
        children.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
        tick += 1;
        let next = started + Duration::from_millis(5 * tick);
        thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    for mut c in children {
        let _ = c.wait();
    }
    (trues, burners)
}

#[test]
fn windows_keep_closing_and_the_storm_is_named_under_a_cpu_limit() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let Some(limit) = CpuLimit::create(&format!("ember-test-churn-{}", std::process::id())) else {
        skip("no cpu cgroup controller to limit the agent with");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let addr = format!("127.0.0.1:{}", free_port());
    let window = format!("{}s", WINDOW.as_secs());
    let mut ember = EmberRun::run(dir.path())
        .args([
            "--window",
            &window,
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--listen",
            addr.as_str(),
        ])
        .try_spawn()
        .expect("starting ember run");
    limit.add(ember.pid());
    if ember.wait_attached(Duration::from_secs(20)).is_none() {
        panic!("ember did not attach\n--- stderr ---\n{}", ember.stderr());
    }

    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let begun = Instant::now();
    let spawner = thread::spawn(move || storm(stop2));
    // When each window file appeared (polled every 100 ms).
    let mut seen: Vec<(Instant, PathBuf)> = Vec::new();
    let until = begun + STORM + 2 * WINDOW;
    while Instant::now() < until {
        if begun.elapsed() >= STORM {
            stop.store(true, Ordering::Relaxed);
        }
        let mut files: Vec<PathBuf> = fs::read_dir(&data)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| ember_tests::is_cpu_window(p))
            .collect();
        files.sort();
        for f in files {
            if !seen.iter().any(|(_, p)| *p == f) {
                seen.push((Instant::now(), f));
            }
        }
        thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    let (trues, burners) = spawner.join().expect("spawner");
    ember.signal(libc::SIGTERM);
    ember.wait(Duration::from_secs(30));

    // Windows: one per WINDOW all through the storm; never a gap of three.
    let times: Vec<Instant> = std::iter::once(begun)
        .chain(seen.iter().map(|(t, _)| *t).filter(|t| *t > begun))
        .chain(std::iter::once(until))
        .collect();
    let gaps: Vec<f64> = times
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .collect();
    let worst = gaps.iter().copied().fold(0.0, f64::max);
    println!(
        "storm: {trues} /bin/true and {burners} short_lived in {:.1} s; {} windows, gaps {gaps:.1?} s",
        STORM.as_secs_f64(),
        times.len() - 2
    );
    assert!(
        worst <= 3.0 * WINDOW.as_secs_f64(),
        "no window for {worst:.1} s under the storm (windows of {WINDOW:?}); gaps {gaps:.1?}\n\
         --- stderr ---\n{}",
        ember.stderr()
    );

    // The storm's burners: sampled under their name, and in hot_short.
    let mut n = 0;
    let mut named = 0;
    for (_, f) in seen.iter().filter(|(t, _)| *t > begun) {
        let Ok(p) = read_profile(f) else { continue };
        for s in stacks(&p)
            .iter()
            .filter(|s| s.comm.as_deref() == Some("short_lived"))
        {
            n += s.count();
            if s.has("hot_short") {
                named += s.count();
            }
        }
    }
    println!("short_lived: {n} samples, {named} in hot_short");
    assert!(
        n >= 50,
        "only {n} samples of short_lived ({burners} started, 20 ms of CPU each)"
    );
    assert!(
        2 * named >= n,
        "only {named} of {n} samples of the storm's short_lived name hot_short"
    );
}
