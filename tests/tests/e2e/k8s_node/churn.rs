//! Process churn while ember runs under the chart's CPU limit: the host spawns a short
//! `find` every 50 ms (20 new processes a second, each exec'ed, each a whole process read
//! for ember) and every window must still close at its deadline and be written at once.
//! A previous run of this test saw no new window for over 80 s under that load.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ember_tests::*;

use super::prom::Prometheus;

/// Longest a window may last (the chart's `window.duration` is 10 s).
const MAX_DURATION_S: f64 = 12.0;
/// Longest from a window's end to its file (seen 0.2-3 s under load, see tests/k8s/README.md).
const MAX_LAG_S: f64 = 10.0;

/// The churn under way: a thread spawning `find`, and what it is measured against.
pub struct Churn {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<(u64, u64)>,
    agent: u32,
    started: Instant,
    start_ns: f64,
    ticks: u64,
    throttled: Option<(u64, u64)>,
    prom_windows: f64,
}

/// What one churn did and what ember did meanwhile.
pub struct Report {
    spawned: u64,
    failed: u64,
    secs: f64,
    agent_cpu: f64,
    /// (periods throttled, seconds throttled) of the agent's cgroup, if readable.
    throttled: Option<(u64, f64)>,
    /// Windows whose end fell in the churn, and the one after: (start s from churn start,
    /// duration s, lag from end to file s).
    windows: Vec<(f64, f64, f64)>,
    /// `ember_windows_total` moved by this much in Prometheus.
    prom_windows: f64,
}

fn now_ns() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_nanos() as f64)
}

/// (nr_throttled, throttled_time ns) of the cpu controller's cgroup of `pid`.
fn throttled(pid: u32) -> Option<(u64, u64)> {
    let cg = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let (ctrl, path) = cg.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let (_, ctrl, path) = (it.next()?, it.next()?, it.next()?);
        ctrl.split(',').any(|c| c == "cpu").then_some((ctrl, path))
    })?;
    let stat = fs::read_to_string(format!("/sys/fs/cgroup/{ctrl}{path}/cpu.stat")).ok()?;
    let field = |k: &str| -> Option<u64> {
        stat.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(' ')?.trim().parse().ok())
    };
    Some((field("nr_throttled")?, field("throttled_time")?))
}

fn windows_total(prom: &Prometheus) -> f64 {
    prom.query(r#"ember_windows_total{job="kubernetes-pods"}"#)
        .first()
        .map_or(f64::NAN, |r| r.1)
}

/// CPU window files (not `.offcpu.`, `.offwake.`, `.lock.`): (start ns, duration ns, written).
fn cpu_windows(dir: &Path) -> Vec<(f64, f64, f64)> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| ember_tests::is_cpu_window(p))
        .collect();
    files.sort();
    files
        .iter()
        .filter_map(|f| {
            let written = fs::metadata(f).ok()?.modified().ok()?;
            let written = written.duration_since(UNIX_EPOCH).ok()?.as_nanos() as f64;
            let p = read_profile(f).ok()?;
            Some((p.time_nanos as f64, p.duration_nanos as f64, written))
        })
        .collect()
}

impl Churn {
    /// Starts spawning for `secs`, measuring the agent `agent` (host pid).
    pub fn start(agent: u32, secs: Duration, prom: &Prometheus) -> Self {
        let prom_windows = windows_total(prom);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut spawned, mut failed) = (0, 0);
            let begun = Instant::now();
            while begun.elapsed() < secs && !stop2.load(Ordering::Relaxed) {
                let ok = Command::new("find")
                    .args([
                        "/sys/fs/cgroup/cpuacct/ember-k8s",
                        "-type",
                        "d",
                        "-name",
                        "x",
                    ])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok();
                spawned += 1;
                failed += u64::from(!ok);
                std::thread::sleep(Duration::from_millis(50));
            }
            (spawned, failed)
        });
        Churn {
            stop,
            thread,
            agent,
            started: Instant::now(),
            start_ns: now_ns(),
            ticks: cpu_ticks(agent).unwrap_or(0),
            throttled: throttled(agent),
            prom_windows,
        }
    }

    /// Waits for the churn to end and for the window after it; measures.
    pub fn finish(self, windows: &Path, prom: &Prometheus) -> Report {
        let (spawned, failed) = self.thread.join().unwrap_or((0, 0));
        self.stop.store(true, Ordering::Relaxed);
        let secs = self.started.elapsed().as_secs_f64();
        let end_ns = now_ns();
        let agent_cpu = cpu_ticks(self.agent)
            .unwrap_or(0)
            .saturating_sub(self.ticks) as f64
            / clk_tck() as f64;
        let throttled = match (self.throttled, throttled(self.agent)) {
            (Some(a), Some(b)) => Some((b.0 - a.0, (b.1 - a.1) as f64 / 1e9)),
            _ => None,
        };
        // The window holding the churn's end, written: at most a window and a lag away.
        let deadline = Instant::now() + Duration::from_secs_f64(MAX_DURATION_S + MAX_LAG_S);
        let mut all = cpu_windows(windows);
        while !all.iter().any(|w| w.0 + w.1 >= end_ns) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(250));
            all = cpu_windows(windows);
        }
        let windows = all
            .iter()
            .filter(|w| w.0 + w.1 >= self.start_ns)
            .map(|w| {
                (
                    (w.0 - self.start_ns) / 1e9,
                    w.1 / 1e9,
                    (w.2 - (w.0 + w.1)) / 1e9,
                )
            })
            .collect();
        Report {
            spawned,
            failed,
            secs,
            agent_cpu,
            throttled,
            windows,
            prom_windows: windows_total(prom) - self.prom_windows,
        }
    }
}

impl Report {
    /// Fails unless the windows covered the churn without a gap, each closed at its
    /// deadline and was written within [`MAX_LAG_S`].
    pub fn check(&self) {
        assert!(
            self.spawned as f64 >= 10.0 * self.secs && self.failed == 0,
            "the churn did not run: {self}"
        );
        let last = self.windows.last().map_or(f64::NEG_INFINITY, |w| w.0 + w.1);
        assert!(
            last >= self.secs,
            "no window closed after the churn's end: a stall. {self}"
        );
        for pair in self.windows.windows(2) {
            let gap = pair[1].0 - (pair[0].0 + pair[0].1);
            assert!(
                gap.abs() < 0.5,
                "windows not contiguous ({gap:.2} s): {self}"
            );
        }
        for w in &self.windows {
            assert!(
                w.1 <= MAX_DURATION_S && w.2 <= MAX_LAG_S,
                "a window {:.1} s long, written {:.1} s after its end: {self}",
                w.1,
                w.2
            );
        }
        assert!(
            self.prom_windows >= self.secs / 10.0 - 2.0,
            "ember_windows_total moved by {} in Prometheus: {self}",
            self.prom_windows
        );
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "churn: {} finds in {:.1} s ({:.1}/s, {} failed); agent CPU {:.2} s ({:.0} % of a \
             CPU; chart limit 500m); throttled {:?} (periods, s); ember_windows_total +{}",
            self.spawned,
            self.secs,
            self.spawned as f64 / self.secs,
            self.failed,
            self.agent_cpu,
            100.0 * self.agent_cpu / self.secs,
            self.throttled,
            self.prom_windows
        )?;
        write!(
            f,
            "windows (start s from churn start, duration s, written s after end):"
        )?;
        for w in &self.windows {
            write!(f, " ({:.1}, {:.2}, {:.2})", w.0, w.1, w.2)?;
        }
        Ok(())
    }
}
