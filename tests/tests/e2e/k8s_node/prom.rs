//! A real Prometheus (Debian's `prometheus`) for the cluster test, scraping ember's pod as a
//! user's Prometheus does: the pods as the API lists them, kept and pointed at their port
//! and path by the chart's `prometheus.io/*` annotations ([`RELABEL`]). Its HTTP API is the
//! oracle for what a scrape of ember gives.
//!
//! Debian builds Prometheus without Kubernetes service discovery (`kubernetes_sd_configs`:
//! "field kubernetes_sd_configs not found"; its client-go is not packaged), so the test
//! discovers the pods itself: [`pod_targets`] turns `kubectl get pods -o json` into the
//! target groups, with the `__meta_kubernetes_*` labels, that `kubernetes_sd_configs` role
//! `pod` makes, and Prometheus reads them with `file_sd_configs`. The relabelling is the
//! users' own, unchanged: deploy/README.md shows it under `kubernetes_sd_configs`, and the
//! test checks that it is this text.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ember_tests::*;

/// Seconds between scrapes (users: 15-60 s). ember's series move once a window (10 s).
pub const SCRAPE_SECS: u64 = 2;

/// The relabelling for the chart's annotations, as deploy/README.md gives it (indented for a
/// scrape job). `honor_labels: true` goes with it: ember's own `namespace`, `pod`,
/// `container` and `node` labels name the profiled workload, and without it Prometheus
/// renames them `exported_*` in favour of the target labels set here (ember's own pod).
pub const RELABEL: &str = r#"    honor_labels: true
    relabel_configs:
      - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scrape]
        action: keep
        regex: "true"
      - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_path]
        regex: (.+)
        target_label: __metrics_path__
      - source_labels: [__address__, __meta_kubernetes_pod_annotation_prometheus_io_port]
        regex: ([^:]+)(?::\d+)?;(\d+)
        replacement: $1:$2
        target_label: __address__
      - source_labels: [__meta_kubernetes_namespace]
        target_label: namespace
      - source_labels: [__meta_kubernetes_pod_name]
        target_label: pod
      - source_labels: [__meta_kubernetes_pod_node_name]
        target_label: node
"#;

/// The scrape job: the pods from `targets` (written by [`write_targets`]), [`RELABEL`].
pub fn scrape_config(targets: &Path) -> String {
    format!(
        "global:\n  scrape_interval: {SCRAPE_SECS}s\nscrape_configs:\n  - job_name: kubernetes-pods\n\
         {RELABEL}    file_sd_configs:\n      - files: [{}]\n        refresh_interval: 5s\n",
        targets.display()
    )
}

/// A label name as Kubernetes SD makes it from an annotation or label key.
fn sanitize(k: &str) -> String {
    k.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The target groups `kubernetes_sd_configs` role `pod` makes of a pod list: one target per
/// declared container port (`podIP:port`), or one at the pod IP for a pod without ports;
/// only pods with an IP.
pub fn pod_targets(pods: &serde_json::Value) -> serde_json::Value {
    let mut groups = Vec::new();
    for pod in pods["items"].as_array().into_iter().flatten() {
        let Some(ip) = pod["status"]["podIP"].as_str() else {
            continue;
        };
        let md = &pod["metadata"];
        let mut labels = serde_json::Map::new();
        let mut set = |k: String, v: &serde_json::Value| {
            labels.insert(k, v.as_str().unwrap_or("").into());
        };
        set("__meta_kubernetes_namespace".into(), &md["namespace"]);
        set("__meta_kubernetes_pod_name".into(), &md["name"]);
        set("__meta_kubernetes_pod_uid".into(), &md["uid"]);
        set("__meta_kubernetes_pod_ip".into(), &pod["status"]["podIP"]);
        set(
            "__meta_kubernetes_pod_node_name".into(),
            &pod["spec"]["nodeName"],
        );
        for (kind, key) in [("annotation", "annotations"), ("label", "labels")] {
            for (k, v) in md[key].as_object().into_iter().flatten() {
                set(format!("__meta_kubernetes_pod_{kind}_{}", sanitize(k)), v);
                set(
                    format!("__meta_kubernetes_pod_{kind}present_{}", sanitize(k)),
                    &"true".into(),
                );
            }
        }
        let mut targets = Vec::new();
        for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
            for p in c["ports"].as_array().into_iter().flatten() {
                if let Some(port) = p["containerPort"].as_u64() {
                    targets.push(format!("{ip}:{port}"));
                }
            }
        }
        if targets.is_empty() {
            targets.push(ip.to_owned());
        }
        groups.push(serde_json::json!({"targets": targets, "labels": labels}));
    }
    serde_json::Value::Array(groups)
}

/// Writes [`pod_targets`] of `pods` to `path` at once (renamed into place: file SD may
/// read it any time).
pub fn write_targets(path: &Path, pods: &serde_json::Value) {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, pod_targets(pods).to_string()).expect("targets file");
    fs::rename(&tmp, path).expect("targets file");
}

/// A Prometheus on a free loopback port, killed on drop.
pub struct Prometheus {
    child: Child,
    /// host:port of its HTTP API.
    pub addr: String,
    log: PathBuf,
}

impl Prometheus {
    /// Starts Prometheus in `dir` with this configuration; returns once it is ready.
    pub fn start(dir: &Path, config: &str) -> Self {
        fs::create_dir_all(dir).expect("prometheus dir");
        let cfg = dir.join("prometheus.yml");
        fs::write(&cfg, config).expect("prometheus.yml");
        let check = output_with_timeout(
            Command::new("promtool")
                .arg("check")
                .arg("config")
                .arg(&cfg),
            Duration::from_secs(30),
        )
        .expect("promtool (Debian package prometheus, installed by make test-deps)");
        assert!(
            check.status.success(),
            "promtool check config: {}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        let addr = format!("127.0.0.1:{}", free_port());
        let log = dir.join("prometheus.log");
        let out = fs::File::create(&log).expect("prometheus log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .expect("starting prometheus (Debian package prometheus, installed by make test-deps)");
        let p = Prometheus { child, addr, log };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !matches!(http_get(&p.addr, "/-/ready"), Ok((200, _))) {
            assert!(
                Instant::now() < deadline,
                "Prometheus not ready in 60 s\n{}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    /// Its log, for failure messages.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET an API path; its `data` (panics unless `status` is `success`).
    pub fn api(&self, path: &str) -> serde_json::Value {
        let (code, body) = http_get(&self.addr, path).expect("Prometheus API");
        let v: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
        assert!(
            code == 200 && v["status"] == "success",
            "{path}: {code} {body}"
        );
        v["data"].clone()
    }

    /// An instant query's result vector: each element's labels and value.
    pub fn query(&self, promql: &str) -> Vec<(serde_json::Map<String, serde_json::Value>, f64)> {
        let data = self.api(&format!("/api/v1/query?query={}", url_encode(promql)));
        data["result"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                let labels = r["metric"].as_object().cloned().unwrap_or_default();
                let value = r["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(f64::NAN);
                (labels, value)
            })
            .collect()
    }

    /// Polls `promql` until `done` holds for its result; panics after `limit`.
    pub fn until(
        &self,
        promql: &str,
        limit: Duration,
        done: impl Fn(&[(serde_json::Map<String, serde_json::Value>, f64)]) -> bool,
    ) -> Duration {
        let start = Instant::now();
        loop {
            let r = self.query(promql);
            if done(&r) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < limit,
                "Prometheus: {promql} not as expected within {limit:?}; last: {r:?}\n\
                 targets: {}\nlog tail: {}",
                self.api("/api/v1/targets"),
                tail(&self.log(), 20)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
