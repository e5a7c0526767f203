//! ember's pod watcher against a real kube-apiserver (v1.20, built from Debian's source by
//! tests/k8s/build-apiserver.sh) with etcd, both on 127.0.0.1.
//!
//! A cpu_hog runs in a cgroup shaped like a kubelet's; a pod whose status carries that
//! container id is created on the watched node. ember's windows must name the pod, follow a
//! change of its service-name annotation, drop the pod labels after the pod is deleted, and
//! keep profiling (host mode, container id only) after the API server is stopped.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ember_tests::*;

const ID: &str = "feed0000feed0000feed0000feed0000feed0000feed0000feed0000feed0003";
const UID: &str = "12345678-1234-1234-1234-123456789abc";
const NODE: &str = "test-node";

fn apiserver_built() -> bool {
    let cache = std::env::var("EMBER_K8S_CACHE").unwrap_or_else(|_| "/var/cache/ember-k8s".into());
    Path::new(&cache).join("kube-apiserver").exists()
}

/// A cluster from tests/k8s/start-cluster.sh, stopped on drop.
struct Cluster {
    dir: PathBuf,
    server: String,
    ca: String,
    token: String,
}

impl Cluster {
    fn start(dir: &Path) -> Self {
        let script = workspace_root().join("tests/k8s/start-cluster.sh");
        let port = free_port().to_string();
        let out = output_with_timeout(
            Command::new(&script).arg(dir).arg(&port),
            Duration::from_secs(120),
        )
        .expect("running start-cluster.sh");
        assert!(
            out.status.success(),
            "start-cluster.sh failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let env = fs::read_to_string(dir.join("env")).expect("cluster env file");
        let var = |k: &str| -> String {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .map(|v| v.trim_matches(|c| c == '"' || c == '\'').to_owned())
                .unwrap_or_else(|| panic!("{k} missing from the env file:\n{env}"))
        };
        Cluster {
            dir: dir.to_path_buf(),
            server: var("K8S_SERVER"),
            ca: var("K8S_CA"),
            token: var("K8S_TOKEN"),
        }
    }

    /// One REST call with curl; returns the body, panics on an HTTP error.
    fn call(&self, method: &str, path: &str, content_type: &str, body: &str) -> String {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--fail-with-body", "--max-time", "20", "-X", method])
            .args(["--cacert", &self.ca])
            .args(["-H", &format!("Authorization: Bearer {}", self.token)]);
        if !body.is_empty() {
            cmd.args(["-H", &format!("Content-Type: {content_type}"), "-d", body]);
        }
        cmd.arg(format!("{}{path}", self.server));
        let out = output_with_timeout(&mut cmd, Duration::from_secs(30)).expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{method} {path} failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    }

    fn stop(&self) {
        let script = workspace_root().join("tests/k8s/stop-cluster.sh");
        let _ = output_with_timeout(Command::new(script).arg(&self.dir), Duration::from_secs(60));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Pod-level string labels of the newest window's samples of `pid`, once one has samples.
fn newest_labels(
    windows: &Path,
    pid: u32,
    after: &mut Option<PathBuf>,
) -> Option<BTreeMap<String, String>> {
    let mut files: Vec<PathBuf> = fs::read_dir(windows)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| ember_tests::is_cpu_window(p))
        .collect();
    files.sort();
    let newest = files.pop()?;
    if after.as_ref() == Some(&newest) {
        return None;
    }
    let profile = read_profile(&newest).ok()?;
    *after = Some(newest);
    let sample = profile.sample.iter().find(|s| {
        s.label
            .iter()
            .any(|l| string(&profile, l.key) == "pid" && l.num == i64::from(pid))
    })?;
    Some(
        sample
            .label
            .iter()
            .filter(|l| l.str != 0)
            .map(|l| (string(&profile, l.key), string(&profile, l.str)))
            .collect(),
    )
}

/// Polls new windows until `want` holds for one of them (or 40 s pass).
fn wait_for_window(
    windows: &Path,
    pid: u32,
    what: &str,
    want: impl Fn(&BTreeMap<String, String>) -> bool,
) -> BTreeMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut seen = None;
    let mut last = BTreeMap::new();
    while Instant::now() < deadline {
        if let Some(labels) = newest_labels(windows, pid, &mut seen) {
            if want(&labels) {
                return labels;
            }
            last = labels;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    panic!("no window where {what} within 40 s; last labels: {last:?}");
}

#[test]
fn pod_labels_follow_the_api_server() {
    if !require_privileged() {
        return;
    }
    if !apiserver_built() {
        assert!(
            std::env::var("EMBER_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
            "no kube-apiserver: run tests/k8s/build-apiserver.sh (make test does)"
        );
        println!("skipped: no kube-apiserver built (tests/k8s/build-apiserver.sh)");
        return;
    }
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(&dir.path().join("cluster"));

    // The workload, in a cgroup the way the cgroupfs driver lays it out (a v1 hierarchy on
    // hybrid hosts, else v2).
    let root = [
        "/sys/fs/cgroup/cpuacct",
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.join("cgroup.procs").exists())
    .expect("a cgroup hierarchy");
    let leaf = root.join(format!("kubepods/besteffort/pod{UID}/{ID}"));
    fs::create_dir_all(&leaf).expect("creating the cgroup");
    let mut hog = Fixture::spawn(CPU_HOG, &["--wait-start", "--seconds", "90"]).expect("fixture");
    fs::write(leaf.join("cgroup.procs"), hog.pid.to_string()).expect("moving the fixture");
    hog.start().expect("start");

    let json = "application/json";
    cluster.call(
        "POST",
        "/api/v1/namespaces",
        json,
        r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"shop"}}"#,
    );
    let pod = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"cart-7d4b9c","uid":"{UID}","labels":{{"app":"cart"}}}},
        "spec":{{"nodeName":"{NODE}","containers":[{{"name":"main","image":"busybox"}}]}}}}"#
    );
    cluster.call("POST", "/api/v1/namespaces/shop/pods", json, &pod);
    let status = format!(
        r#"{{"status":{{"phase":"Running","containerStatuses":[{{"name":"main","image":"busybox","imageID":"",
        "ready":true,"restartCount":0,"containerID":"containerd://{ID}","state":{{"running":{{}}}}}}]}}}}"#
    );
    cluster.call(
        "PATCH",
        "/api/v1/namespaces/shop/pods/cart-7d4b9c/status",
        "application/merge-patch+json",
        &status,
    );

    let cfg = dir.path().join("ember.yaml");
    fs::write(
        &cfg,
        format!(
            "kubernetes:\n  enabled: true\n  node_name: {NODE}\n  kubeconfig: {}\n",
            cluster.dir.join("kubeconfig").display()
        ),
    )
    .expect("config");
    let windows = dir.path().join("windows");
    let addr = format!("127.0.0.1:{}", free_port());
    let pid = hog.pid.to_string();
    let args = [
        "--config",
        cfg.to_str().expect("utf-8"),
        "--window",
        "1s",
        "--data-dir",
        windows.to_str().expect("utf-8"),
        "--listen",
        &addr,
        "--pid",
        &pid,
    ];
    let mut ember = EmberRun::run(dir.path())
        .args(args)
        .try_spawn()
        .expect("ember run");

    // 1. The pod's labels reach the samples.
    let labels = wait_for_window(&windows, hog.pid, "the pod is named", |l| {
        l.get("pod").map(String::as_str) == Some("cart-7d4b9c")
    });
    println!("labels with the pod: {labels:?}");
    assert_eq!(labels.get("namespace").map(String::as_str), Some("shop"));
    assert_eq!(labels.get("container").map(String::as_str), Some("main"));
    assert_eq!(labels.get("container_id").map(String::as_str), Some(ID));
    assert_eq!(labels.get("pod_uid").map(String::as_str), Some(UID));
    assert_eq!(
        labels.get("service_name").map(String::as_str),
        Some("shop/cart-7d4b9c")
    );
    let (_, metrics) = http_get(&addr, "/metrics").expect("scrape");
    assert_eq!(
        metric_value(&metrics, "ember_kubernetes_metadata_fresh"),
        Some(1.0),
        "{metrics}"
    );
    assert!(metrics
        .lines()
        .any(|l| l.starts_with("ember_container_cpu_seconds_total{")
            && l.contains("namespace=\"shop\"")
            && l.contains("pod=\"cart-7d4b9c\"")
            && l.contains("container=\"main\"")));

    // 2. A change to the pod follows: the service-name annotation wins over the default.
    cluster.call(
        "PATCH",
        "/api/v1/namespaces/shop/pods/cart-7d4b9c",
        "application/merge-patch+json",
        r#"{"metadata":{"annotations":{"ember.io/service-name":"checkout"}}}"#,
    );
    wait_for_window(&windows, hog.pid, "the annotation is followed", |l| {
        l.get("service_name").map(String::as_str) == Some("shop/checkout")
    });

    // 3. After deletion the pod labels go; the container id stays (it comes from the cgroup).
    cluster.call(
        "DELETE",
        "/api/v1/namespaces/shop/pods/cart-7d4b9c?gracePeriodSeconds=0",
        "",
        "",
    );
    let labels = wait_for_window(&windows, hog.pid, "the deleted pod is forgotten", |l| {
        !l.contains_key("pod")
    });
    assert_eq!(labels.get("container_id").map(String::as_str), Some(ID));

    // 4. Without the API server, profiling goes on and the metric says metadata is stale.
    cluster.stop();
    let before = fs::read_dir(&windows).expect("windows").count();
    std::thread::sleep(Duration::from_secs(6));
    let after = fs::read_dir(&windows).expect("windows").count();
    assert!(
        after >= before + 3,
        "windows kept coming: {before} → {after}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, metrics) = http_get(&addr, "/metrics").expect("scrape");
        if metric_value(&metrics, "ember_kubernetes_metadata_fresh") == Some(0.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "metadata still reported fresh 60 s after the API server stopped"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        ember.running(),
        "ember must outlive its API server:\n{}",
        ember.stderr()
    );
    ember.signal(libc::SIGTERM);
    assert!(
        ember.wait(Duration::from_secs(10)).success(),
        "{}",
        ember.stderr()
    );

    drop(hog);
    let _ = fs::remove_dir(&leaf);
    for up in [leaf.parent(), leaf.parent().and_then(Path::parent)]
        .into_iter()
        .flatten()
    {
        let _ = fs::remove_dir(up);
    }
    let _ = fs::remove_dir(root.join("kubepods/besteffort"));
    let _ = fs::remove_dir(root.join("kubepods"));
}
