//! Resource (USE) readings end to end, checked by third-party tools on this machine:
//!
//! - the same run of Debian's `prometheus-node-exporter` agrees with ember on CPU seconds
//!   per CPU and mode, MemAvailable, disk io time and network bytes (within 2 %);
//! - `promtool check metrics` accepts ember's /metrics (only the lints node_exporter's own
//!   names and the OpenMetrics HELP placement cause);
//! - a real Prometheus scrapes ember, a query returns ember's series, and every rule of
//!   deploy/alerts.yaml evaluates without error on them;
//! - containers in kubelet-shaped cgroups (v1 controllers and v2) get their cAdvisor-named
//!   series, throttling included.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use ember_tests::*;

/// How often ember reads its sources in these tests.
const INTERVAL: Duration = Duration::from_millis(500);

/// A daemon started for a test: killed and reaped on drop.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn daemon(bin: &str, args: &[String], log: &Path) -> Daemon {
    let out = fs::File::create(log).expect("log file");
    let err = out.try_clone().expect("log file");
    let child = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("starting {bin}: {e} (installed by `make test-deps`: Debian packages prometheus, prometheus-node-exporter)")
        });
    Daemon(child)
}

/// Waits until `addr` answers `path` with 200; panics with `log` after `timeout`.
fn wait_http(addr: &str, path: &str, timeout: Duration, log: &Path) -> String {
    let start = Instant::now();
    loop {
        if let Ok((200, body)) = http_get(addr, path) {
            return body;
        }
        if start.elapsed() > timeout {
            panic!(
                "{addr}{path} did not answer within {timeout:?}\n{}",
                fs::read_to_string(log).unwrap_or_default()
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Starts `ember run` with a short readings interval; returns once a second reading (which
/// carries the ratios) is on /metrics.
fn start_ember(dir: &Path) -> Ember {
    let mut ember = EmberRun::run(dir)
        .config(format!(
            "kubernetes:\n  enabled: false\nreadings:\n  interval: {}ms\n",
            INTERVAL.as_millis()
        ))
        .data_dir(dir.join("windows"))
        .listen()
        .spawn();
    ember.scrape_until("the readings", Duration::from_secs(30), |body| {
        body.contains("ember_use_ratio{resource=\"cpu\",kind=\"utilization\"}")
    });
    ember
}

fn by_labels(exposition: &str, name: &str, keys: &[&str]) -> BTreeMap<Vec<String>, f64> {
    family(exposition, name)
        .into_iter()
        .map(|(l, v)| {
            (
                keys.iter()
                    .map(|k| l.get(*k).cloned().unwrap_or_default())
                    .collect(),
                v,
            )
        })
        .collect()
}

/// Compares a counter read by node_exporter between two ember scrapes (`before` was read
/// before it, `after` after it): node_exporter's value must lie in
/// [before − 2 %, after + 2 %]. Returns, over the series compared, the largest relative
/// distance of node_exporter's value outside [before, after] and to `before`, and how many
/// series were compared.
fn bracket(
    what: &str,
    before: &BTreeMap<Vec<String>, f64>,
    node: &BTreeMap<Vec<String>, f64>,
    after: &BTreeMap<Vec<String>, f64>,
) -> (f64, f64, usize) {
    let (mut outside, mut to_before, mut n): (f64, f64, usize) = (0.0, 0.0, 0);
    for (k, nv) in node {
        let (Some(b), Some(a)) = (before.get(k), after.get(k)) else {
            continue;
        };
        n += 1;
        let tol = 0.02 * nv.abs();
        assert!(
            *nv >= b - tol && *nv <= a + tol,
            "{what} {k:?}: node_exporter {nv} is not within 2% of ember's [{b}, {a}]"
        );
        let scale = nv.abs().max(f64::MIN_POSITIVE);
        outside = outside.max((b - nv).max(nv - a).max(0.0) / scale);
        if *nv != 0.0 {
            to_before = to_before.max((nv - b).abs() / scale);
        }
    }
    assert!(n > 0, "{what}: no series in common with node_exporter");
    (outside, to_before, n)
}

#[test]
fn agrees_with_node_exporter_in_the_same_run() {
    if !require_privileged() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let node_addr = format!("127.0.0.1:{}", free_port());
    let node_log = dir.path().join("node_exporter.log");
    let _node = daemon(
        "prometheus-node-exporter",
        &[
            format!("--web.listen-address={node_addr}"),
            "--collector.disable-defaults".into(),
            "--collector.cpu".into(),
            "--collector.meminfo".into(),
            "--collector.diskstats".into(),
            // ember's default (newer node_exporters' default, which also leaves out zram).
            format!(
                "--collector.diskstats.device-exclude={}",
                ember::config::Config::default().readings.disk_exclude
            ),
            "--collector.netdev".into(),
        ],
        &node_log,
    );
    let ember = start_ember(dir.path());
    wait_http(&node_addr, "/metrics", Duration::from_secs(20), &node_log);

    // ember shows its latest reading (at most INTERVAL old): one scrape before
    // node_exporter reads, one after ember has surely read again.
    let before = ember.scrape();
    let (status, node) = http_get(&node_addr, "/metrics").expect("node_exporter scrape");
    assert_eq!(status, 200);
    thread::sleep(INTERVAL * 2 + Duration::from_millis(200));
    let after = ember.scrape();

    let mut report = Vec::new();
    for (what, ember_name, node_name, keys) in [
        (
            "CPU seconds",
            "ember_node_cpu_seconds_total",
            "node_cpu_seconds_total",
            &["cpu", "mode"][..],
        ),
        (
            "disk io time",
            "ember_node_disk_io_time_seconds_total",
            "node_disk_io_time_seconds_total",
            &["device"][..],
        ),
        (
            "network receive bytes",
            "ember_node_network_receive_bytes_total",
            "node_network_receive_bytes_total",
            &["device"][..],
        ),
        (
            "network transmit bytes",
            "ember_node_network_transmit_bytes_total",
            "node_network_transmit_bytes_total",
            &["device"][..],
        ),
    ] {
        let b = by_labels(&before, ember_name, keys);
        let a = by_labels(&after, ember_name, keys);
        let n = by_labels(&node, node_name, keys);
        // Every series node_exporter has, ember has too (ember also keeps `lo`).
        let missing: BTreeSet<_> = n.keys().filter(|k| !a.contains_key(*k)).collect();
        assert!(missing.is_empty(), "{what}: ember lacks {missing:?}");
        let (outside, to_before, count) = bracket(what, &b, &n, &a);
        report.push(format!(
            "{what}: {count} series; largest delta outside ember's before/after readings \
             {:.4}%, to the reading before {:.4}%",
            outside * 100.0,
            to_before * 100.0
        ));
    }
    // A gauge: within 2% of either ember reading.
    let n = metric_value(&node, "node_memory_MemAvailable_bytes").expect("node MemAvailable");
    let e: Vec<f64> = [&before, &after]
        .iter()
        .filter_map(|t| metric_value(t, "ember_node_memory_MemAvailable_bytes"))
        .collect();
    let delta = e
        .iter()
        .map(|v| (v - n).abs() / n)
        .fold(f64::INFINITY, f64::min);
    assert!(
        delta <= 0.02,
        "MemAvailable: node_exporter {n}, ember {e:?}"
    );
    report.push(format!(
        "MemAvailable: relative delta {:.4}%",
        delta * 100.0
    ));
    println!(
        "cross-check with node_exporter:\n  {}\nscrape size: {} bytes, {} samples",
        report.join("\n  "),
        after.len(),
        after
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .count()
    );
    drop(ember);
}

#[test]
fn promtool_accepts_the_exposition() {
    if !require_privileged() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let ember = start_ember(dir.path());
    let text = ember.scrape();
    let file = dir.path().join("metrics.txt");
    fs::write(&file, &text).expect("write");
    let out = output_with_timeout(
        Command::new("sh")
            .arg("-c")
            .arg("promtool check metrics < \"$0\"")
            .arg(&file),
        Duration::from_secs(60),
    )
    .expect("running promtool (Debian package prometheus, installed by make test-deps)");
    let code = out.status.code();
    let lints =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    // 0: clean, 3: lint only; anything else is a parse error.
    assert!(
        matches!(code, Some(0) | Some(3)),
        "promtool check metrics failed ({code:?}):\n{lints}"
    );
    for line in lints.lines().filter(|l| !l.trim().is_empty()) {
        let (name, problem) = line.split_once(' ').unwrap_or((line, ""));
        let ok = match problem {
            // promtool 2.42 reads the classic text format, where a counter's HELP is on
            // `x_total`; OpenMetrics (which ember serves) puts it on the family `x`.
            "no help text" => text.contains(&format!(
                "# HELP {} ",
                name.strip_suffix("_total").unwrap_or(name)
            )),
            // node_exporter's own names (MemAvailable, Tcp_RetransSegs), kept so that
            // dashboards port by a prefix swap.
            p if p.contains("camelCase") => {
                name.starts_with("ember_node_memory_") || name.starts_with("ember_node_netstat_")
            }
            _ => false,
        };
        assert!(ok, "unexpected promtool lint: {line}");
    }
    assert!(text.contains("ember_node_cpu_seconds_total{cpu=\"0\",mode=\"user\"}"));
    assert!(text.contains("ember_use_ratio{resource=\"memory\",kind=\"utilization\"}"));
}

#[test]
fn prometheus_scrapes_ember_and_evaluates_the_alert_rules() {
    if !require_privileged() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let ember = start_ember(dir.path());
    let addr = ember.addr().to_owned();
    let rules = workspace_root().join("deploy/alerts.yaml");
    let prom_cfg = dir.path().join("prometheus.yml");
    fs::write(
        &prom_cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: ember\n    static_configs:\n      - targets: ['{addr}']\n",
            rules.display()
        ),
    )
    .expect("prometheus config");
    let prom_addr = format!("127.0.0.1:{}", free_port());
    let log = dir.path().join("prometheus.log");
    let _prom = daemon(
        "prometheus",
        &[
            format!("--config.file={}", prom_cfg.display()),
            format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()),
            format!("--web.listen-address={prom_addr}"),
        ],
        &log,
    );
    wait_http(&prom_addr, "/-/ready", Duration::from_secs(60), &log);
    let query = format!(
        "/api/v1/query?query={}",
        url_encode("ember_use_ratio{resource=\"cpu\",kind=\"utilization\"}")
    );
    let start = Instant::now();
    let body = loop {
        let (status, body) = http_get(&prom_addr, &query).expect("query");
        assert_eq!(status, 200, "{body}");
        if body.contains("\"resource\":\"cpu\"") {
            break body;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "Prometheus has no ember_use_ratio after 60 s: {body}\n{}",
            fs::read_to_string(&log).unwrap_or_default()
        );
        thread::sleep(Duration::from_millis(500));
    };
    assert!(body.contains("\"job\":\"ember\""), "{body}");
    // Every rule of deploy/alerts.yaml has been evaluated on ember's series without error.
    let start = Instant::now();
    loop {
        let (_, rules) = http_get(&prom_addr, "/api/v1/rules").expect("rules");
        let evaluated = rules.matches("\"health\":\"ok\"").count();
        assert!(
            !rules.contains("\"health\":\"err\""),
            "a rule failed to evaluate: {rules}"
        );
        if evaluated >= 11 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "rules not evaluated after 30 s: {rules}"
        );
        thread::sleep(Duration::from_millis(500));
    }
    // "health: ok" only says that a rule's query ran: a rule on a metric ember never writes
    // runs as well, and never fires. Every metric a rule names is one ember declares, and every
    // selector but the per-workload ones (no container or pod runs here) matches a series
    // that Prometheus scraped from ember.
    // A family without series is not written: the golden exposition has every family of the
    // agent's own metrics, the live one the readings'.
    let exposition = ember.scrape()
        + &fs::read_to_string(workspace_root().join("agent/src/metrics/testdata/exposition.txt"))
            .expect("the golden exposition");
    let selectors = alert_selectors(&fs::read_to_string(&rules).expect("reading alerts.yaml"));
    assert!(
        selectors.len() >= 10,
        "selectors read from the rules: {selectors:?}"
    );
    for sel in &selectors {
        let name = sel.split('{').next().unwrap_or(sel);
        if PER_WORKLOAD.contains(&name) {
            continue;
        }
        assert!(
            declared(&exposition, name),
            "deploy/alerts.yaml names {name}, which ember does not declare"
        );
        if EVENT_ONLY.contains(&name) || sel.contains("!=") || sel.contains("=\"\"") {
            continue;
        }
        let query = format!(
            "/api/v1/query?query={}",
            url_encode(&format!("count({sel})"))
        );
        let (status, body) = http_get(&prom_addr, &query).expect("query");
        assert_eq!(status, 200, "{body}");
        assert!(
            !body.contains("\"result\":[]"),
            "the alert rules select {sel}, but Prometheus has no such series from ember: {body}"
        );
    }
}

/// Metrics of the alert rules whose series appear at their first event (a failed read), or
/// per network sink (none is configured here; `sinks::` asserts the export series):
/// declared, but without a series on a healthy host.
const EVENT_ONLY: &[&str] = &["ember_readings_errors_total", "ember_export_dropped_total"];

/// Metrics of the alert rules whose families exist only once a container or pod does (none
/// runs here): `containers_in_v1_and_v2_cgroups_get_cadvisor_series` asserts the CFS series,
/// `counters::oversubscribed_cpus_show_a_higher_runqueue_p99` the run-queue histogram.
const PER_WORKLOAD: &[&str] = &[
    "ember_container_cpu_cfs_periods_total",
    "ember_container_cpu_cfs_throttled_periods_total",
    "ember_runqueue_latency_seconds_bucket",
];

/// The `ember_*` selectors (`name{matchers}`) in the `expr:` of the rules in `yaml`.
fn alert_selectors(yaml: &str) -> BTreeSet<String> {
    let mut exprs = String::new();
    let mut in_expr = false;
    for line in yaml.lines() {
        let t = line.trim_start();
        if t.starts_with("expr:") {
            in_expr = true;
        } else if t.starts_with("for:") || t.starts_with("labels:") || t.starts_with("- alert:") {
            in_expr = false;
        }
        if in_expr {
            exprs.push_str(t);
            exprs.push('\n');
        }
    }
    let mut out = BTreeSet::new();
    let mut rest = exprs.as_str();
    while let Some(i) = rest.find("ember_") {
        rest = &rest[i..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let mut sel = rest[..end].to_owned();
        if rest[end..].starts_with('{') {
            if let Some(close) = rest[end..].find('}') {
                sel.push_str(&rest[end..end + close + 1]);
            }
        }
        out.insert(sel);
        rest = &rest[end..];
    }
    out
}

/// Whether the exposition declares the family of series `name` (`# TYPE` of the name, or of
/// the name without its counter or histogram suffix).
fn declared(exposition: &str, name: &str) -> bool {
    exposition.lines().any(|l| {
        l.strip_prefix("# TYPE ")
            .and_then(|r| r.split_whitespace().next())
            .is_some_and(|family| {
                name == family
                    || ["_total", "_bucket", "_count", "_sum"]
                        .iter()
                        .any(|suffix| name.strip_suffix(suffix) == Some(family))
            })
    })
}

/// A cgroup made for the test in several hierarchies; its processes go back to each root
/// and the directories are removed on drop.
struct TestCgroup {
    dirs: Vec<(PathBuf, PathBuf)>,
}

impl TestCgroup {
    fn create(roots: &[PathBuf], rel: &str) -> Self {
        let dirs = roots
            .iter()
            .map(|r| {
                let leaf = r.join(rel);
                fs::create_dir_all(&leaf)
                    .unwrap_or_else(|e| panic!("creating {}: {e}", leaf.display()));
                (r.clone(), leaf)
            })
            .collect();
        Self { dirs }
    }

    fn add(&self, pid: u32) {
        for (_, leaf) in &self.dirs {
            fs::write(leaf.join("cgroup.procs"), pid.to_string())
                .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", leaf.display()));
        }
    }

    fn leaf(&self, root: &str) -> PathBuf {
        self.dirs
            .iter()
            .find(|(r, _)| r.ends_with(root))
            .map(|(_, l)| l.clone())
            .expect("hierarchy")
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for (root, leaf) in &self.dirs {
            if let Ok(procs) = fs::read_to_string(leaf.join("cgroup.procs")) {
                for pid in procs.lines() {
                    let _ = fs::write(root.join("cgroup.procs"), pid);
                }
            }
            let mut dir = leaf.clone();
            while dir != *root {
                if fs::remove_dir(&dir).is_err() {
                    break;
                }
                if !dir.pop() {
                    break;
                }
            }
        }
    }
}

const ID_V1: &str = "5eed00005eed00005eed00005eed00005eed00005eed00005eed00005eed0001";
const ID_V2: &str = "5eed11115eed11115eed11115eed11115eed11115eed11115eed11115eed1112";

#[test]
fn containers_in_v1_and_v2_cgroups_get_cadvisor_series() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let cg = Path::new("/sys/fs/cgroup");
    let v2 = ["unified", ""]
        .iter()
        .map(|d| cg.join(d))
        .find(|p| p.join("cgroup.controllers").exists())
        .expect("a cgroup v2 hierarchy");
    let v1: Vec<PathBuf> = ["cpu", "cpuacct", "memory"]
        .iter()
        .map(|c| cg.join(c))
        .filter(|p| p.join("cgroup.procs").exists())
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");

    // v1 (cgroupfs driver), where the host has the controllers: a hog limited to 10% of
    // a CPU, so that it is throttled in most periods.
    let v1_cg = (v1.len() == 3).then(|| {
        let cgroup = TestCgroup::create(
            &v1,
            &format!("kubepods/burstable/pod5eed5eed-0000-1111-2222-333333333333/{ID_V1}"),
        );
        let cpu = cgroup.leaf("cpu");
        fs::write(cpu.join("cpu.cfs_period_us"), "100000").expect("period");
        fs::write(cpu.join("cpu.cfs_quota_us"), "10000").expect("quota");
        cgroup
    });
    let v2_cg = TestCgroup::create(
        std::slice::from_ref(&v2),
        &format!(
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod5eed5eed_4444_5555_6666_777777777777.slice/cri-containerd-{ID_V2}.scope"
        ),
    );
    let mut hog_v1 = v1_cg.as_ref().map(|c| {
        let f = Fixture::spawn(CPU_HOG, &["--wait-start", "--seconds", "30"]).expect("fixture");
        c.add(f.pid);
        f
    });
    let mut hog_v2 =
        Fixture::spawn(CPU_HOG, &["--wait-start", "--seconds", "30"]).expect("fixture");
    v2_cg.add(hog_v2.pid);
    hog_v2.start().expect("start");
    if let Some(h) = hog_v1.as_mut() {
        h.start().expect("start");
    }
    let ember = start_ember(dir.path());
    thread::sleep(Duration::from_secs(3));
    let text = ember.scrape();
    let get = |name: &str, id: &str| -> Option<f64> {
        family(&text, name)
            .into_iter()
            .find(|(l, _)| l.get("container_id").map(String::as_str) == Some(id))
            .map(|(_, v)| v)
    };

    // v2: the hog's PSI is the container's; its CPU usage comes from cpu.stat.
    assert!(
        get("ember_container_pressure_cpu_waiting_seconds_total", ID_V2).is_some(),
        "no PSI series for the v2 container:\n{text}\n{}",
        ember.stderr()
    );
    assert!(get("ember_container_cpu_usage_seconds_total", ID_V2).is_some());

    if let Some(c) = &v1_cg {
        let usage = get("ember_container_cpu_usage_seconds_total", ID_V1).expect("v1 usage");
        let direct: f64 = fs::read_to_string(c.leaf("cpuacct").join("cpuacct.usage"))
            .expect("cpuacct.usage")
            .trim()
            .parse::<f64>()
            .expect("number")
            / 1e9;
        // ember's reading is at most one interval older than this read of the file.
        assert!(
            usage > 0.0 && usage <= direct,
            "usage {usage} vs cpuacct.usage {direct}"
        );
        let periods = get("ember_container_cpu_cfs_periods_total", ID_V1).expect("periods");
        let throttled =
            get("ember_container_cpu_cfs_throttled_periods_total", ID_V1).expect("throttled");
        assert!(periods > 0.0, "a quota was set, so periods count");
        assert!(
            throttled > 0.0 && throttled <= periods,
            "a hog at 10% of a CPU is throttled: {throttled} of {periods}"
        );
        assert!(get("ember_container_cpu_cfs_throttled_seconds_total", ID_V1).expect("time") > 0.0);
        let ws = get("ember_container_memory_working_set_bytes", ID_V1).expect("working set");
        let usage_bytes: f64 = fs::read_to_string(c.leaf("memory").join("memory.usage_in_bytes"))
            .expect("usage_in_bytes")
            .trim()
            .parse()
            .expect("number");
        // Usage minus inactive file pages, read an interval earlier: not above today's usage
        // by more than the hog could have freed (it allocates nothing after start).
        assert!(
            ws <= usage_bytes + 1048576.0,
            "working set {ws} vs usage {usage_bytes}"
        );
        assert!(get("ember_container_oom_events_total", ID_V1).is_some());
    }
    drop(ember);
    drop(hog_v1);
    drop(hog_v2);
}
