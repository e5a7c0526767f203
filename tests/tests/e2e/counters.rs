//! Perf counters, run-queue latency and OTLP metrics, end to end: ember runs with a short
//! `readings.interval`, fixtures run in container-shaped cgroups on the hierarchy that
//! holds `perf_event`, and the values are read back from /metrics (and from a real OTLP
//! receiver built on the official protos).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ember_tests::*;

const ID_A: &str = "5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b01";
const ID_B: &str = "5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b02";

/// A container-shaped cgroup (`system.slice/docker-<id>.scope`) on the perf_event
/// hierarchy; its processes go back to the root and the directory is removed on drop.
struct ContainerCgroup {
    root: PathBuf,
    dir: PathBuf,
}

impl ContainerCgroup {
    fn create(id: &str) -> Self {
        let root = ember::workload::walk::perf_event_root().expect("a perf_event hierarchy");
        let dir = root.join(format!("system.slice/docker-{id}.scope"));
        fs::create_dir_all(&dir).expect("creating the test cgroup");
        Self { root, dir }
    }

    fn add(&self, pid: u32) {
        fs::write(self.dir.join("cgroup.procs"), pid.to_string()).expect("moving the fixture");
    }
}

impl Drop for ContainerCgroup {
    fn drop(&mut self) {
        if let Ok(procs) = fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = fs::write(self.root.join("cgroup.procs"), pid);
            }
        }
        let _ = fs::remove_dir(&self.dir);
    }
}

/// `ember run` with a short readings interval and perf counters on, plus `extra` config.
fn start_ember(dir: &Path, extra: &str) -> Ember {
    let addr = format!("127.0.0.1:{}", free_port());
    EmberRun::run(dir)
        .config(format!(
            "kubernetes:\n  enabled: false\n  node_name: node-5b\nserver:\n  listen: {addr}\nreadings:\n  interval: 500ms\ncounters:\n  perf: true\n{extra}"
        ))
        .serves_at(&addr)
        .data_dir(dir.join("windows"))
        .spawn()
}

/// Whether `perf_event_open` can count hardware cycles here (what ember should report).
fn cycles_supported() -> bool {
    // perf_event_attr: type (u32), size (u32), config (u64), ...; 128 zeroed bytes is a
    // valid version-7+ attr with type 0 = PERF_TYPE_HARDWARE, config 0 = CPU_CYCLES.
    let mut attr = [0u8; 128];
    attr[4..8].copy_from_slice(&128u32.to_ne_bytes());
    // SAFETY: attr is a valid, initialised buffer that outlives the call.
    let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, attr.as_ptr(), -1, 0, -1, 0) };
    if fd >= 0 {
        // SAFETY: fd was just returned to us.
        unsafe { libc::close(fd as i32) };
    }
    fd >= 0
}

#[test]
fn software_counters_per_cpu_and_container_and_pmc_support_probed_once() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().unwrap();
    let cg = ContainerCgroup::create(ID_A);
    // Four threads on fewer CPUs keep being preempted: context switches in the container.
    let mut hog = Fixture::spawn(
        env!("FIXTURE_CPU_HOG"),
        &["--seconds", "30", "--threads", "4", "--wait-start"],
    )
    .unwrap();
    cg.add(hog.pid);
    hog.start().unwrap();
    let mut ember = start_ember(dir.path(), "");
    let want = format!(
        "ember_container_perf_events_total{{namespace=\"\",pod=\"\",container=\"\",container_id=\"{ID_A}\",event=\"context-switches\"}}"
    );
    let text = ember.scrape_until(
        "the container's context switches",
        Duration::from_secs(30),
        |t| series(t, &want).is_some_and(|v| v > 0.0),
    );
    let first = series(&text, &want).unwrap();

    // Hardware support is what the kernel says, probed once, logged once.
    let hw = cycles_supported();
    assert_eq!(
        series(&text, "ember_pmc_supported{event=\"cycles\"}"),
        Some(if hw { 1.0 } else { 0.0 }),
        "{text}"
    );
    assert_eq!(
        series(&text, "ember_pmc_supported{event=\"context-switches\"}"),
        Some(1.0)
    );
    // Every CPU counts context switches.
    let cpus = online_cpus();
    for cpu in 0..cpus {
        let s = format!("ember_perf_events_total{{cpu=\"{cpu}\",event=\"context-switches\"}}");
        assert!(series(&text, &s).is_some_and(|v| v > 0.0), "{s}\n{text}");
        let r =
            format!("ember_perf_events_scaling_ratio{{cpu=\"{cpu}\",event=\"context-switches\"}}");
        assert_eq!(
            series(&text, &r),
            Some(1.0),
            "software events never multiplex"
        );
    }
    // fds: supported events × CPUs × (host + containers counted).
    let supported = text
        .lines()
        .filter(|l| l.starts_with("ember_pmc_supported{") && l.ends_with(" 1.0"))
        .count();
    let containers = series(&text, "ember_perf_containers").unwrap();
    assert!(containers >= 1.0);
    assert_eq!(
        series(&text, "ember_perf_event_fds"),
        Some((supported * cpus) as f64 * (1.0 + containers)),
        "{text}"
    );
    // The counter keeps counting; several scrapes later the log line is still alone.
    let text = ember.scrape_until("more context switches", Duration::from_secs(30), |t| {
        series(t, &want).is_some_and(|v| v > first)
    });
    std::thread::sleep(Duration::from_millis(1500));
    let lines = ember
        .stderr()
        .lines()
        .filter(|l| l.contains("not available on this machine"))
        .count();
    assert_eq!(lines, usize::from(!hw), "{}", ember.stderr());
    if !hw {
        assert!(
            !text.contains("ember_perf_events_total{cpu=\"0\",event=\"cycles\"}"),
            "an unsupported event is not counted"
        );
    }
    // The container's own run-queue latency histogram counts its waits.
    let count = format!(
        "ember_runqueue_latency_seconds_count{{namespace=\"\",pod=\"\",container=\"\",container_id=\"{ID_A}\"}}"
    );
    assert!(
        series(&text, &count).is_some_and(|v| v > 0.0),
        "{count}\n{text}"
    );
    drop(hog);
    drop(cg);
    // The container's cgroup is gone: its counters are closed and its series go away.
    // (Only the counter and run-queue series: the sample-based container CPU series keep
    // their own 30-window retention.)
    ember.scrape_until(
        "the container's series to go",
        Duration::from_secs(30),
        |t| {
            !t.lines().any(|l| {
                (l.starts_with("ember_container_perf_events")
                    || l.starts_with("ember_container_instructions_per_cycle")
                    || l.starts_with("ember_runqueue_latency"))
                    && l.contains(ID_A)
            })
        },
    );
    ember.signal(libc::SIGTERM);
    assert!(ember.wait(Duration::from_secs(20)).success());
}

/// The container's cumulative run-queue latency buckets in an exposition, by `le`.
fn histogram(text: &str, id: &str) -> BTreeMap<String, f64> {
    let want = format!("container_id=\"{id}\"");
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("ember_runqueue_latency_seconds_bucket{")?;
            let (labels, v) = rest.split_once("} ")?;
            if !labels.split(',').any(|kv| kv == want) {
                return None;
            }
            let le = labels
                .split(',')
                .find_map(|kv| kv.strip_prefix("le=\""))?
                .trim_end_matches('"');
            Some((le.to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

/// p99 (the upper bound of the bucket holding it) of the observations between two
/// cumulative histograms; `0` when nothing was observed.
fn p99(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> (f64, f64) {
    let mut buckets: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, v)| {
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().expect("numeric le")
            };
            (bound, v - before.get(le).copied().unwrap_or(0.0))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last().map_or(0.0, |b| b.1);
    if total <= 0.0 {
        return (0.0, 0.0);
    }
    let q = buckets
        .iter()
        .find(|(_, cum)| *cum >= 0.99 * total)
        .map_or(f64::INFINITY, |b| b.0);
    (q, total)
}

/// Scrapes the container's histogram before and after `secs` of `work`.
fn measure(ember: &mut Ember, id: &str, threads: &str) -> (f64, f64) {
    let cg = ContainerCgroup::create(id);
    let mut hog = Fixture::spawn(
        env!("FIXTURE_CPU_HOG"),
        &["--seconds", "30", "--threads", threads, "--wait-start"],
    )
    .expect("starting cpu_hog");
    cg.add(hog.pid);
    let text = ember.scrape_until("the container's histogram", Duration::from_secs(30), |t| {
        !histogram(t, id).is_empty()
    });
    let before = histogram(&text, id);
    hog.start().expect("cpu_hog starts");
    std::thread::sleep(Duration::from_secs(4));
    // Two intervals, so the snapshot holds the whole run.
    std::thread::sleep(Duration::from_millis(1100));
    let after = ember.scrape();
    drop(hog);
    p99(&before, &histogram(&after, id))
}

#[test]
fn oversubscribed_cpus_show_a_higher_runqueue_p99() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().unwrap();
    let mut ember = start_ember(dir.path(), "");
    // One busy thread leaves a CPU free; four per CPU must queue.
    let busy = (2 * online_cpus()).max(8).to_string();
    let (idle_p99, idle_n) = measure(&mut ember, ID_A, "1");
    let (busy_p99, busy_n) = measure(&mut ember, ID_B, &busy);
    println!("run-queue p99: 1 thread {idle_p99}s ({idle_n} waits), {busy} threads {busy_p99}s ({busy_n} waits)");
    assert!(busy_n > 0.0, "the oversubscribed fixture waited");
    assert!(
        busy_p99 > idle_p99,
        "p99 with {busy} threads ({busy_p99}s) not above 1 thread ({idle_p99}s)"
    );
    ember.signal(libc::SIGTERM);
    assert!(ember.wait(Duration::from_secs(20)).success());
}

/// The OTLP receiver (tests/otlp/receiver.py) in the venv `make` builds, or `None` to skip.
fn receiver_python() -> Option<PathBuf> {
    let py = std::env::var_os("EMBER_OTLP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/otlp-venv/bin/python"));
    if py.exists() {
        return Some(py);
    }
    if std::env::var("EMBER_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
        panic!("{} missing: run `make otlp-venv`", py.display());
    }
    println!("skipped: {} missing (make otlp-venv)", py.display());
    None
}

struct Receiver(Child);

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn otlp_metrics_reach_a_real_receiver() {
    if !require_privileged() {
        return;
    }
    let Some(python) = receiver_python() else {
        return;
    };
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let out = dir.path().join("received.jsonl");
    let mut child = Command::new(python)
        .arg(workspace_root().join("tests/otlp/receiver.py"))
        .arg(port.to_string())
        .arg(&out)
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the receiver");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let _receiver = Receiver(child);
    assert_eq!(line.trim(), "listening");
    // kubernetes.node_name without the watcher: k8s.node.name is known, nothing is watched.
    let extra = format!(
        "otlp_metrics:\n  enabled: true\n  endpoint: http://127.0.0.1:{port}\n  interval: 1s\n  \
         headers:\n    x-scope-orgid: tenant-5b\n"
    );
    let mut ember = start_ember(dir.path(), &extra);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = String::new();
    while Instant::now() < deadline {
        seen = fs::read_to_string(&out).unwrap_or_default();
        if seen.contains("ember_runqueue_latency_seconds_bucket")
            && seen.contains("ember_perf_events_total")
        {
            break;
        }
        assert!(ember.running(), "{}", ember.stderr());
        std::thread::sleep(Duration::from_millis(300));
    }
    let prom = ember.scrape();
    ember.signal(libc::SIGTERM);
    assert!(
        ember.wait(Duration::from_secs(20)).success(),
        "{}",
        ember.stderr()
    );
    let last = seen
        .lines()
        .rev()
        .find(|l| l.contains("ember_perf_events_total"))
        .unwrap_or_else(|| panic!("no metrics arrived\n{seen}\n{}", ember.stderr()));
    let v: serde_json::Value = serde_json::from_str(last).expect("receiver wrote JSON");
    // gRPC metadata from otlp_metrics.headers.
    assert_eq!(v["metadata"]["x-scope-orgid"], "tenant-5b");
    let rm = &v["request"]["resourceMetrics"][0];
    let attrs: BTreeMap<&str, &str> = rm["resource"]["attributes"]
        .as_array()
        .expect("resource attributes")
        .iter()
        .filter_map(|a| Some((a["key"].as_str()?, a["value"]["stringValue"].as_str()?)))
        .collect();
    assert_eq!(attrs.get("service.name"), Some(&"ember"), "{attrs:?}");
    let host = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(attrs.get("host.name"), Some(&host.trim()), "{attrs:?}");
    assert_eq!(attrs.get("k8s.node.name"), Some(&"node-5b"), "{attrs:?}");
    // Every instrument of the Prometheus snapshot arrives under the same name.
    let metrics: Vec<&serde_json::Value> = rm["scopeMetrics"]
        .as_array()
        .expect("scope metrics")
        .iter()
        .flat_map(|s| s["metrics"].as_array().into_iter().flatten())
        .collect();
    let names: Vec<&str> = metrics.iter().filter_map(|m| m["name"].as_str()).collect();
    for name in [
        "ember_pmc_supported",
        "ember_perf_events_total",
        "ember_perf_events_scaling_ratio",
        "ember_perf_event_fds",
        "ember_runqueue_latency_seconds_bucket",
        "ember_runqueue_latency_seconds_count",
        "ember_runqueue_latency_seconds_sum",
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
        let stem = name
            .trim_end_matches("_bucket")
            .trim_end_matches("_count")
            .trim_end_matches("_sum");
        assert!(prom.contains(stem), "{stem} also on /metrics");
    }
    // The context-switch counter is a cumulative monotonic sum with cpu/event attributes.
    let perf = metrics
        .iter()
        .find(|m| m["name"] == "ember_perf_events_total")
        .unwrap();
    assert_eq!(perf["sum"]["isMonotonic"], true, "{perf}");
    assert_eq!(
        perf["sum"]["aggregationTemporality"],
        "AGGREGATION_TEMPORALITY_CUMULATIVE"
    );
    let keys: Vec<&str> = perf["sum"]["dataPoints"][0]["attributes"]
        .as_array()
        .expect("attributes")
        .iter()
        .filter_map(|a| a["key"].as_str())
        .collect();
    assert!(keys.contains(&"cpu") && keys.contains(&"event"), "{keys:?}");
}

#[test]
fn containers_beyond_the_cap_are_counted_as_dropped() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().unwrap();
    let _a = ContainerCgroup::create(ID_A);
    let _b = ContainerCgroup::create(ID_B);
    let mut ember = start_ember(dir.path(), "  max_containers: 1\n");
    let text = ember.scrape_until("both caches' drops", Duration::from_secs(30), |t| {
        t.contains("ember_cache_dropped_total{cache=\"perf_containers\"}")
            && t.contains("ember_cache_dropped_total{cache=\"runqueue_containers\"}")
    });
    assert_eq!(series(&text, "ember_perf_containers"), Some(1.0), "{text}");
    assert_eq!(
        series(&text, "ember_runqueue_containers"),
        Some(1.0),
        "{text}"
    );
    for cache in ["perf_containers", "runqueue_containers"] {
        let s = format!("ember_cache_dropped_total{{cache=\"{cache}\"}}");
        assert!(series(&text, &s).is_some_and(|v| v >= 1.0), "{s}\n{text}");
    }
    // One fd set for the host and one for the single counted container.
    let cpus = online_cpus() as f64;
    let supported = text
        .lines()
        .filter(|l| l.starts_with("ember_pmc_supported{") && l.ends_with(" 1.0"))
        .count() as f64;
    assert_eq!(
        series(&text, "ember_perf_event_fds"),
        Some(2.0 * supported * cpus)
    );
    ember.signal(libc::SIGTERM);
    assert!(ember.wait(Duration::from_secs(20)).success());
}
