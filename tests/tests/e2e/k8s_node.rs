//! ember deployed as a user deploys it: the Helm chart, rendered by tests/deploy/helmrender with
//! the values a user sets, applied with kubectl to a real one-node Kubernetes 1.20 cluster
//! (tests/k8s/start-node.sh: etcd, apiserver, controller-manager, scheduler, kubelet,
//! kube-proxy, containerd + runc + CNI bridge), ember's image made from `EMBER_BIN` with
//! buildah (tests/k8s/build-images.sh).
//!
//! Checked against the cluster's own answers: the DaemonSet's pod Ready within 60 s; the agent
//! process (found on the host by the pod's uid in its cgroup) has exactly the capabilities the
//! DaemonSet declares, a seccomp filter and no_new_privs. The seccomp profile is installed by
//! the chart's init container (`seccompInstaller`), not by the test: the node's kubelet
//! seccomp directory is empty before, holds deploy/seccomp/ember.json after. The Pyroscope
//! sink's bearer token is in a Secret (`existingSecret`) that `bearer_token_file` names: a
//! receiver on the node's address ([`sink`]) must get pushes with exactly that token. A real Prometheus (Debian's; see
//! [`prom`] for why its targets come from the pod list and not `kubernetes_sd_configs`)
//! scrapes the pod by the chart's `prometheus.io/*` annotations with deploy/README.md's
//! relabelling: the target is up at `http://<pod IP>:9464/metrics`, and its per-container
//! series name three workload pods in two namespaces (namespace, pod, container, container id
//! from the API), none renamed `exported_*`. The windows carry their service names
//! (`<namespace>/<Deployment>`, `<namespace>/<pod>`) and functions: the C burner's, and a
//! Python pod's (Debian's python3.11 in an image of its own) with `runtime="python"`. The
//! Deployment's sampled CPU over five windows is within 10 % of its container's own
//! `cpuacct.usage`. A workload pod deleted: every series Prometheus had for it goes stale
//! (an instant query returns nothing) within 60 s; meanwhile the host spawns 20 `find`s a
//! second for 60 s ([`churn`]) and every window still closes on time and is written within
//! 10 s. The ember pod deleted: the DaemonSet's new pod profiles and is scraped again, the
//! old agent is gone; stop-node.sh leaves nothing running or mounted.
//!
//! Needs what `make k8s-node` builds (tests/k8s/build-apiserver.sh node) and Debian's
//! containerd, runc, containernetworking-plugins, buildah, iptables, prometheus, python3.11.
//! Without them the test
//! skips, saying what is missing; `EMBER_REQUIRE_K8S_NODE=1` turns that skip into a failure.
//! `make test` builds them (`make k8s-node`, ~8 minutes on 2 cores, cached outside the tree)
//! and `.ci/run` sets `EMBER_REQUIRE_K8S_NODE=1`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use ember_tests::*;

mod churn;
mod prom;
mod sink;

fn cache() -> PathBuf {
    PathBuf::from(
        std::env::var("EMBER_K8S_CACHE").unwrap_or_else(|_| "/var/cache/ember-k8s".into()),
    )
}

/// What this machine lacks to run the cluster, if anything.
fn missing_parts() -> Vec<String> {
    let mut missing = Vec::new();
    for b in [
        "kube-apiserver",
        "kubelet",
        "kube-controller-manager",
        "kube-scheduler",
        "kube-proxy",
        "kubectl",
        "pause",
    ] {
        if !cache().join(b).exists() {
            missing.push(format!("{} (make k8s-node)", cache().join(b).display()));
        }
    }
    for t in [
        "containerd",
        "runc",
        "ctr",
        "buildah",
        "iptables",
        "etcd",
        "go",
        "prometheus",
        "promtool",
    ] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !found {
            missing.push(format!("{t} on PATH"));
        }
    }
    for p in [
        "/usr/lib/cni/bridge",
        "/usr/share/gocode/src/github.com/Masterminds/sprig",
        "/usr/share/gocode/src/github.com/xeipuuv/gojsonschema",
        "/usr/bin/python3.11",
    ] {
        if !Path::new(p).exists() {
            missing.push(p.to_owned());
        }
    }
    missing
}

fn run(cmd: &mut Command, timeout: Duration) -> Output {
    let shown = format!("{cmd:?}");
    let out = output_with_timeout(cmd, timeout).unwrap_or_else(|e| panic!("{shown}: {e:#}"));
    assert!(
        out.status.success(),
        "{shown} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A cluster from tests/k8s/start-node.sh, stopped on drop.
struct Node {
    dir: PathBuf,
    kubeconfig: PathBuf,
    env: BTreeMap<String, String>,
    stopped: bool,
}

impl Node {
    fn start(dir: &Path, images: &Path) -> Self {
        let port = free_port().to_string();
        let mut cmd = Command::new(workspace_root().join("tests/k8s/start-node.sh"));
        cmd.arg(dir).arg(&port).env("EMBER_K8S_IMAGES", images);
        let out = run(&mut cmd, Duration::from_secs(240));
        let kubeconfig = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let env = fs::read_to_string(dir.join("env"))
            .expect("cluster env file")
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Node {
            dir: dir.to_path_buf(),
            kubeconfig,
            env,
            stopped: false,
        }
    }

    fn var(&self, k: &str) -> &str {
        self.env
            .get(k)
            .unwrap_or_else(|| panic!("{k} missing from the cluster env"))
    }

    fn kubectl_output(&self, args: &[&str]) -> Output {
        output_with_timeout(
            Command::new(cache().join("kubectl"))
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(args),
            Duration::from_secs(60),
        )
        .expect("kubectl")
    }

    /// kubectl ARGS; its stdout, panics on failure.
    fn kubectl(&self, args: &[&str]) -> String {
        let out = self.kubectl_output(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&a)).expect("kubectl -o json")
    }

    /// Applies a YAML stream.
    fn apply(&self, yaml: &str, name: &str) {
        let f = self.dir.join(format!("{name}.yaml"));
        fs::write(&f, yaml).expect("writing manifest");
        self.kubectl(&["apply", "-f", &f.to_string_lossy()]);
    }

    /// Polls until one pod matching `selector` in `ns` is Ready (and, if given, is not
    /// `other_than`); returns it, or panics after `limit`.
    fn wait_ready(
        &self,
        ns: &str,
        selector: &str,
        other_than: Option<&str>,
        limit: Duration,
    ) -> serde_json::Value {
        let deadline = Instant::now() + limit;
        let mut last = serde_json::Value::Null;
        while Instant::now() < deadline {
            let list = self.json(&["-n", ns, "get", "pods", "-l", selector]);
            for pod in list["items"].as_array().into_iter().flatten() {
                let ready = pod["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                let name = pod["metadata"]["name"].as_str().unwrap_or("");
                if ready
                    && other_than != Some(name)
                    && pod["metadata"]["deletionTimestamp"].is_null()
                {
                    return pod.clone();
                }
            }
            last = list;
            std::thread::sleep(Duration::from_millis(500));
        }
        let events = self.kubectl_output(&["-n", ns, "get", "events"]);
        panic!(
            "no Ready pod {selector} in {ns} within {limit:?}; pods: {}\nevents:\n{}",
            last["items"],
            String::from_utf8_lossy(&events.stdout)
        );
    }

    fn stop(&mut self) -> Output {
        self.stopped = true;
        output_with_timeout(
            Command::new(workspace_root().join("tests/k8s/stop-node.sh")).arg(&self.dir),
            Duration::from_secs(120),
        )
        .expect("stop-node.sh")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = self.stop();
        }
    }
}

/// The host pid of the ember process in the pod with this uid.
fn agent_pid(pod_uid: &str) -> Option<u32> {
    fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        (cmdline.starts_with(b"/usr/local/bin/ember\0") && cgroup.contains(pod_uid)).then_some(pid)
    })
}

/// A field of /proc/PID/status.
fn status_field(pid: u32, key: &str) -> String {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    s.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

/// Capability names (as in a pod spec) to their bit numbers (linux/capability.h).
fn cap_bit(name: &str) -> u32 {
    match name {
        "DAC_READ_SEARCH" => 2,
        "SYS_PTRACE" => 19,
        "SYS_RESOURCE" => 24,
        "SYSLOG" => 34,
        "PERFMON" => 38,
        "BPF" => 39,
        "CHECKPOINT_RESTORE" => 40,
        other => panic!("capability {other} not in the test's table"),
    }
}

/// Per sample of the newest window: string labels and function names.
type Sampled = Vec<(BTreeMap<String, String>, BTreeSet<String>)>;

fn newest_window(windows: &Path, after: Option<&Path>) -> Option<(PathBuf, Sampled)> {
    let mut files: Vec<PathBuf> = fs::read_dir(windows)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| ember_tests::is_cpu_window(p))
        .collect();
    files.sort();
    let newest = files.pop()?;
    if Some(newest.as_path()) == after {
        return None;
    }
    let p = read_profile(&newest).ok()?;
    let funcs: HashMap<u64, String> = p
        .function
        .iter()
        .map(|f| (f.id, string(&p, f.name)))
        .collect();
    let locs: HashMap<u64, Vec<String>> = p
        .location
        .iter()
        .map(|l| {
            let names = l
                .line
                .iter()
                .filter_map(|ln| funcs.get(&ln.function_id).cloned());
            (l.id, names.collect())
        })
        .collect();
    let samples = p
        .sample
        .iter()
        .map(|s| {
            let labels = s
                .label
                .iter()
                .filter(|l| l.str != 0)
                .map(|l| (string(&p, l.key), string(&p, l.str)))
                .collect();
            let names = s
                .location_id
                .iter()
                .filter_map(|id| locs.get(id))
                .flatten()
                .cloned()
                .collect();
            (labels, names)
        })
        .collect();
    Some((newest, samples))
}

/// A workload's sample as a window must hold it.
#[derive(Debug)]
struct Want<'a> {
    namespace: &'a str,
    pod: &'a str,
    container: &'a str,
    service_name: &'a str,
    /// Functions that must all be on the sample's stack.
    functions: &'a [&'a str],
    /// The sample's `runtime` label, where one is expected.
    runtime: Option<&'a str>,
}

/// The C burner in a pod.
fn burner<'a>(namespace: &'a str, pod: &'a str, container: &'a str, service: &'a str) -> Want<'a> {
    Want {
        namespace,
        pod,
        container,
        service_name: service,
        functions: &["ember_burn_inner", "ember_burn_outer"],
        runtime: None,
    }
}

/// Waits for a window (newer than `after`) with a sample of each of `want`; returns that
/// window's path.
fn wait_window_with(windows: &Path, after: Option<&Path>, want: &[Want]) -> PathBuf {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = after.map(Path::to_path_buf);
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Some((path, samples)) = newest_window(windows, seen.as_deref()) {
            let found = |w: &Want| {
                samples.iter().any(|(l, names)| {
                    let get = |k: &str| l.get(k).map(String::as_str);
                    get("namespace") == Some(w.namespace)
                        && get("pod") == Some(w.pod)
                        && get("container") == Some(w.container)
                        && get("service_name") == Some(w.service_name)
                        && w.runtime.is_none_or(|r| get("runtime") == Some(r))
                        && w.functions.iter().all(|f| names.contains(*f))
                })
            };
            if want.iter().all(found) {
                return path;
            }
            let pods: BTreeSet<_> = samples
                .iter()
                .filter_map(|(l, names)| {
                    let leaf = names.iter().find(|n| n.starts_with("ember_"));
                    Some(format!(
                        "{}/{} {:?} {:?} {leaf:?}",
                        l.get("namespace")?,
                        l.get("pod")?,
                        l.get("service_name"),
                        l.get("runtime"),
                    ))
                })
                .collect();
            last = format!("{}: pods {pods:?}", path.display());
            seen = Some(path);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!("no window with samples of {want:?} within 60 s; last: {last}");
}

/// The cpuacct.usage file of a container's own cgroup, found by its id under the kubelet's root.
fn cgroup_cpu_file(container_id: &str) -> PathBuf {
    let root = Path::new("/sys/fs/cgroup/cpuacct/ember-k8s");
    let out = Command::new("find")
        .arg(root)
        .args(["-type", "d", "-name", container_id])
        .output()
        .expect("find");
    let dir = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(PathBuf::from);
    dir.unwrap_or_else(|| panic!("no cgroup {container_id} under {}", root.display()))
        .join("cpuacct.usage")
}

/// Seconds in a cpuacct.usage file.
fn cgroup_cpu(file: &Path) -> f64 {
    let ns: f64 = fs::read_to_string(file)
        .expect("cpuacct.usage")
        .trim()
        .parse()
        .expect("cpuacct.usage number");
    ns / 1e9
}

/// Wall-clock nanoseconds since the epoch (the clock of pprof's `time_nanos`).
fn now_ns() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as f64
}

/// ember's sampled CPU of a container against its cgroup's counter over the same five
/// windows. The counter is read every 50 ms with a timestamp and interpolated at each window's
/// start and end (`time_nanos`, `duration_nanos`), so neither side depends on when ember
/// finishes a window or when /metrics is scraped (under load that lag varied by seconds).
fn compare_cpu(windows: &Path, container_id: &str) -> (f64, f64) {
    // Found once: a `find` every 50 ms is 20 new processes a second for ember to follow,
    // and at its 500m CPU limit that held its windows back for over a minute.
    let file = cgroup_cpu_file(container_id);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    // The first reading is taken here, before `begun`, so every picked window has one below.
    let mut readings = vec![(now_ns(), cgroup_cpu(&file))];
    let reader = std::thread::spawn(move || {
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            readings.push((now_ns(), cgroup_cpu(&file)));
            std::thread::sleep(Duration::from_millis(50));
        }
        readings
    });
    let begun = now_ns();
    // Windows that start after the reader began; the first five of them (single windows
    // were seen up to 20 % apart, window edges and sample times not matching exactly).
    let mut seen: BTreeSet<PathBuf> = BTreeSet::new();
    let mut picked: Vec<(f64, f64, f64)> = Vec::new(); // (start ns, end ns, sampled s)
    let mut skipped: Vec<(f64, usize)> = Vec::new(); // (start - begun in s, samples): for messages
    let deadline = Instant::now() + Duration::from_secs(120);
    while picked.len() < 5 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        let mut files: Vec<PathBuf> = fs::read_dir(windows)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| ember_tests::is_cpu_window(p))
            .collect();
        files.sort();
        for f in files {
            if seen.contains(&f) {
                continue;
            }
            let Ok(p) = read_profile(&f) else { continue };
            seen.insert(f);
            let start = p.time_nanos as f64;
            skipped.push(((start - begun) / 1e9, p.sample.len()));
            if start < begun + 1e8 {
                continue;
            }
            let id_key = p.string_table.iter().position(|x| x == "container_id");
            let id_val = p.string_table.iter().position(|x| x == container_id);
            let ns: i64 = p
                .sample
                .iter()
                .filter(|s| {
                    s.label
                        .iter()
                        .any(|l| Some(l.key as usize) == id_key && Some(l.str as usize) == id_val)
                })
                .map(|s| s.value.get(1).copied().unwrap_or(0))
                .sum();
            picked.push((start, start + p.duration_nanos as f64, ns as f64 / 1e9));
        }
    }
    // A window's file can be read within one reading period of its end: keep the reader
    // going until a reading lies past the last end, or `at` has nothing to interpolate to.
    if let Some(last_end) = picked.iter().map(|w| w.1).reduce(f64::max) {
        while now_ns() < last_end + 3e8 {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let readings = reader.join().expect("cgroup reader");
    assert!(
        picked.len() >= 5,
        "fewer than 5 windows within 120 s: {picked:?}; windows read (start - begin s, samples): {skipped:?}"
    );
    picked.truncate(5);
    let at = |t: f64| -> f64 {
        let i = readings.partition_point(|r| r.0 < t);
        assert!(i > 0 && i < readings.len(), "no cgroup reading around {t}");
        let ((t0, v0), (t1, v1)) = (readings[i - 1], readings[i]);
        v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    };
    let sampled: f64 = picked.iter().map(|w| w.2).sum();
    let counted: f64 = picked.iter().map(|w| at(w.1) - at(w.0)).sum();
    println!(
        "per window (sampled s, cgroup s): {:?}",
        picked
            .iter()
            .map(|w| (w.2, at(w.1) - at(w.0)))
            .collect::<Vec<_>>()
    );
    (sampled, counted)
}

const WORKLOADS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Namespace
metadata: {name: billing}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: cart, namespace: shop}
spec:
  replicas: 1
  selector: {matchLabels: {app: cart}}
  template:
    metadata: {labels: {app: cart}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
        - name: burn
          image: localhost/ember-k8s/burner:1
          imagePullPolicy: Never
          resources: {limits: {cpu: 300m, memory: 16Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: ledger, namespace: billing, labels: {app: ledger}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
    - name: tally
      image: localhost/ember-k8s/burner:1
      imagePullPolicy: Never
      resources: {limits: {cpu: 200m, memory: 16Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: quote, namespace: shop, labels: {app: quote}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
    - name: py
      image: localhost/ember-k8s/python:1
      imagePullPolicy: Never
      resources: {limits: {cpu: 200m, memory: 32Mi}}
"#;

#[test]
fn helm_chart_on_a_one_node_cluster() {
    if !require_privileged() {
        return;
    }
    let missing = missing_parts();
    if !missing.is_empty() {
        assert!(
            std::env::var("EMBER_REQUIRE_K8S_NODE").as_deref() != Ok("1"),
            "EMBER_REQUIRE_K8S_NODE=1 but the cluster cannot be built here; missing: {missing:?}"
        );
        println!("skipped: the one-node cluster needs {missing:?} (make k8s-node)");
        return;
    }
    let _lock = sampling_lock();
    let begun = Instant::now();
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = workspace_root();

    // The images, ember's from the binary under test.
    let images = tmp.path().join("images");
    run(
        Command::new(root.join("tests/k8s/build-images.sh"))
            .arg(&images)
            .arg(ember_bin()),
        Duration::from_secs(300),
    );
    // The chart as a user renders it: image, the cluster's version; and, on a host whose
    // runtime cannot grant CAP_SYS_RESOURCE (not in this process's bounding set), without it.
    let helmrender = tmp.path().join("helmrender");
    let gopath = tmp.path().join("gopath");
    run(
        Command::new("go")
            .args(["build", "-o"])
            .arg(&helmrender)
            .arg("./tests/deploy/helmrender")
            .current_dir(&root)
            .env("GO111MODULE", "off")
            .env("GOFLAGS", "")
            .env("GOPATH", format!("{}:/usr/share/gocode", gopath.display()))
            .env("GOCACHE", tmp.path().join("gocache")),
        Duration::from_secs(300),
    );
    let mut node = Node::start(&tmp.path().join("node"), &images);
    // Issue 54: the chart installs the seccomp profile itself (seccompInstaller, into this
    // node's kubelet seccomp directory), and the Pyroscope sink's token comes from a Secret
    // (existingSecret) through bearer_token_file, sent to a receiver on the node's address.
    let seccomp_dir = node.var("K8S_SECCOMP_DIR").to_owned();
    let seccomp = Path::new(&seccomp_dir).join("ember.json");
    assert!(
        !seccomp.exists(),
        "the seccomp profile is there before the chart installs it"
    );
    let receiver = sink::Receiver::start(node.var("K8S_NODE_IP"));
    let token = format!(
        "ember-test-{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos()
    );
    let bounding =
        u64::from_str_radix(&status_field(std::process::id(), "CapBnd"), 16).expect("CapBnd");
    let mut values = format!(
        "image:\n  repository: localhost/ember\n\
         seccompInstaller:\n  enabled: true\n  hostPath: {seccomp_dir}\n\
         existingSecret: ember-sinks\n\
         config:\n  sinks:\n    pyroscope:\n      enabled: true\n\
         \x20     url: http://{}:{}\n\
         \x20     bearer_token_file: /var/run/secrets/ember/pyroscope-token\n",
        node.var("K8S_NODE_IP"),
        receiver.port
    );
    if bounding & (1 << cap_bit("SYS_RESOURCE")) == 0 {
        values.push_str("excludeCapabilities: [SYS_RESOURCE]\n");
    }
    let values_file = tmp.path().join("values.yaml");
    fs::write(&values_file, &values).expect("values");
    let rendered = run(
        Command::new(&helmrender)
            .args(["-strict", "-chart"])
            .arg(root.join("helm/ember"))
            .args([
                "-name",
                "ember",
                "-namespace",
                "ember",
                "-kube-version",
                "v1.20.2",
                "-f",
            ])
            .arg(&values_file),
        Duration::from_secs(60),
    );

    node.apply(WORKLOADS, "workloads");
    let cart = node.wait_ready("shop", "app=cart", None, Duration::from_secs(60));
    let ledger = node.wait_ready("billing", "app=ledger", None, Duration::from_secs(60));
    let quote = node.wait_ready("shop", "app=quote", None, Duration::from_secs(60));

    node.kubectl(&["create", "namespace", "ember"]);
    node.kubectl(&[
        "-n",
        "ember",
        "create",
        "secret",
        "generic",
        "ember-sinks",
        &format!("--from-literal=pyroscope-token={token}"),
    ]);
    node.apply(&String::from_utf8_lossy(&rendered.stdout), "chart");
    let applied = Instant::now();
    let selector = "app.kubernetes.io/name=ember";
    let agent = node.wait_ready("ember", selector, None, Duration::from_secs(60));
    println!(
        "ember pod Ready {:?} after kubectl apply",
        applied.elapsed()
    );
    let agent_uid = agent["metadata"]["uid"].as_str().expect("uid").to_owned();
    let ip = agent["status"]["podIP"]
        .as_str()
        .expect("pod IP")
        .to_owned();

    // The agent as the chart declares it: these capabilities exactly, seccomp, no_new_privs.
    let pid = agent_pid(&agent_uid).expect("the agent's process on the host");
    let ds = node.json(&["-n", "ember", "get", "daemonset", "ember"]);
    let sc = &ds["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    let declared: u64 = sc["capabilities"]["add"]
        .as_array()
        .expect("capabilities.add")
        .iter()
        .map(|c| 1u64 << cap_bit(c.as_str().expect("cap name")))
        .sum();
    let eff = u64::from_str_radix(&status_field(pid, "CapEff"), 16).expect("CapEff");
    assert_eq!(
        eff, declared,
        "agent CapEff {eff:#x}, DaemonSet declares {declared:#x} ({})",
        sc["capabilities"]
    );
    assert_eq!(sc["seccompProfile"]["type"], "Localhost");
    assert_eq!(
        fs::read(&seccomp).expect("the installer's seccomp profile"),
        fs::read(root.join("deploy/seccomp/ember.json")).expect("deploy/seccomp/ember.json"),
        "the profile the chart's init container installed is not deploy/seccomp/ember.json"
    );
    assert_eq!(
        status_field(pid, "Seccomp"),
        "2",
        "agent not under a seccomp filter"
    );
    assert_eq!(
        status_field(pid, "NoNewPrivs"),
        "1",
        "allowPrivilegeEscalation: false not in force"
    );

    // The agent pushes to the sink with the Secret's token, read from the mounted file.
    let t = Instant::now();
    let (request, auth) = receiver.until(Duration::from_secs(90), |(r, _)| {
        r.starts_with("POST /push.v1.PusherService/Push ")
    });
    assert_eq!(
        auth,
        format!("Bearer {token}"),
        "{request}: not the Secret's token"
    );
    println!(
        "Pyroscope push with the Secret's token after {:?}",
        t.elapsed()
    );
    drop(receiver);

    // A real Prometheus finds the pod through the API, as the chart's annotations ask.
    let t = Instant::now();
    let deploy_readme =
        fs::read_to_string(root.join("deploy/README.md")).expect("deploy/README.md");
    assert!(
        deploy_readme.contains(prom::RELABEL),
        "deploy/README.md's scrape job lost the relabelling the test uses:\n{}",
        prom::RELABEL
    );
    let targets = tmp.path().join("pods.json");
    prom::write_targets(&targets, &node.json(&["get", "pods", "-A"]));
    let prom = prom::Prometheus::start(
        &tmp.path().join("prometheus"),
        &prom::scrape_config(&targets),
    );
    let agent_name = agent["metadata"]["name"].as_str().expect("name").to_owned();
    let label = |l: &serde_json::Map<String, serde_json::Value>, k: &str| -> String {
        l.get(k).and_then(|v| v.as_str()).unwrap_or("").to_owned()
    };
    prom.until(
        r#"up{job="kubernetes-pods"}"#,
        Duration::from_secs(60),
        |r| {
            r.len() == 1
                && r[0].1 == 1.0
                && label(&r[0].0, "namespace") == "ember"
                && label(&r[0].0, "pod") == agent_name
        },
    );
    let scraped = prom.api("/api/v1/targets");
    let active = scraped["activeTargets"].as_array().expect("activeTargets");
    assert_eq!(active.len(), 1, "only ember's pod is annotated: {active:?}");
    assert_eq!(
        active[0]["scrapeUrl"],
        format!("http://{ip}:9464/metrics"),
        "the scrape URL from the pod IP and the prometheus.io/port, path annotations"
    );
    println!("Prometheus: ember's pod up after {:?}", t.elapsed());

    // Per-container series of all three workload pods, named from the API.
    let id_of = |pod: &serde_json::Value| -> String {
        let id = pod["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .expect("containerID");
        id.trim_start_matches("containerd://").to_owned()
    };
    let cart_pod = cart["metadata"]["name"].as_str().expect("name").to_owned();
    let (cart_id, ledger_id, quote_id) = (id_of(&cart), id_of(&ledger), id_of(&quote));
    let want: BTreeSet<[String; 4]> = [
        ["shop", cart_pod.as_str(), "burn", cart_id.as_str()],
        ["billing", "ledger", "tally", ledger_id.as_str()],
        ["shop", "quote", "py", quote_id.as_str()],
    ]
    .iter()
    .map(|w| w.map(str::to_owned))
    .collect();
    let took = prom.until(
        r#"ember_container_cpu_seconds_total{job="kubernetes-pods"} > 0"#,
        Duration::from_secs(60),
        |r| {
            let got: BTreeSet<[String; 4]> = r
                .iter()
                .map(|(l, _)| {
                    ["namespace", "pod", "container", "container_id"].map(|k| label(l, k))
                })
                .collect();
            want.is_subset(&got)
        },
    );
    println!("Prometheus: sampled CPU of the three pods after {took:?} more");
    let renamed = prom.query(r#"{exported_namespace!=""}"#);
    assert!(renamed.is_empty(), "labels renamed exported_*: {renamed:?}");

    // Windows: the pods' labels, service names (Deployment / bare pod), functions, runtime.
    let t = Instant::now();
    let windows = PathBuf::from(format!("/proc/{pid}/root/var/lib/ember/windows"));
    wait_window_with(
        &windows,
        None,
        &[
            burner("shop", &cart_pod, "burn", "shop/cart"),
            burner("billing", "ledger", "tally", "billing/ledger"),
            Want {
                namespace: "shop",
                pod: "quote",
                container: "py",
                service_name: "shop/quote",
                functions: &["ember_py_leaf", "ember_py_outer", "<module>"],
                runtime: Some("python"),
            },
        ],
    );
    println!(
        "window with the three pods' samples after {:?}",
        t.elapsed()
    );

    // Sampled CPU against the cgroup's own counter, over the same five windows.
    let t = Instant::now();
    let (sampled, counted) = compare_cpu(&windows, &cart_id);
    println!(
        "cart: sampled {sampled:.2} s, cgroup {counted:.2} s over five windows ({:?})",
        t.elapsed()
    );
    assert!(
        counted > 1.0,
        "the burner hardly ran ({counted:.2} s in five windows)"
    );
    assert!(
        (sampled - counted).abs() <= 0.10 * counted,
        "sampled CPU {sampled:.2} s vs cgroup {counted:.2} s: more than 10 % apart"
    );

    // Process churn on the host (20 short `find`s a second, 60 s) while a workload pod is
    // deleted: its series go stale in Prometheus, and every window still closes on time.
    let t = Instant::now();
    let ledger_sel = r#"{namespace="billing",pod="ledger"}"#;
    let names = |r: &[(serde_json::Map<String, serde_json::Value>, f64)]| -> BTreeSet<String> {
        r.iter().map(|(l, _)| label(l, "__name__")).collect()
    };
    let before = names(&prom.query(ledger_sel));
    for n in [
        "ember_container_cpu_seconds_total",
        "ember_container_cpu_usage_seconds_total",
        "ember_container_info",
    ] {
        assert!(
            before.contains(n),
            "{n} of billing/ledger not in Prometheus: {before:?}"
        );
    }
    let churn = churn::Churn::start(pid, Duration::from_secs(60), &prom);
    node.kubectl(&["-n", "billing", "delete", "pod", "ledger", "--wait=true"]);
    let deleted = t.elapsed();
    let stale = prom.until(ledger_sel, Duration::from_secs(60), |r| r.is_empty());
    println!(
        "billing/ledger deleted after {deleted:?}; its {} series ({before:?}) stale in Prometheus {stale:?} later",
        before.len()
    );
    let report = churn.finish(&windows, &prom);
    println!("{report}");
    report.check();
    println!("deletion and churn: {:?}", t.elapsed());

    // The ember pod deleted: the DaemonSet's next pod takes over; the old agent is gone.
    let t = Instant::now();
    node.kubectl(&["-n", "ember", "delete", "pod", &agent_name, "--wait=false"]);
    let next = node.wait_ready(
        "ember",
        selector,
        Some(&agent_name),
        Duration::from_secs(90),
    );
    let next_uid = next["metadata"]["uid"].as_str().expect("uid").to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            Instant::now() < deadline,
            "the deleted pod's agent (pid {pid}) still runs after 30 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let next_pid = agent_pid(&next_uid).expect("the new agent's process");
    wait_window_with(
        &PathBuf::from(format!("/proc/{next_pid}/root/var/lib/ember/windows")),
        None,
        &[burner("shop", &cart_pod, "burn", "shop/cart")],
    );
    let next_name = next["metadata"]["name"].as_str().expect("name").to_owned();
    prom::write_targets(&targets, &node.json(&["get", "pods", "-A"]));
    prom.until(
        r#"up{job="kubernetes-pods"} == 1"#,
        Duration::from_secs(60),
        |r| r.len() == 1 && label(&r[0].0, "pod") == next_name,
    );
    println!(
        "the next ember pod profiling and scraped after {:?}",
        t.elapsed()
    );
    drop(prom);

    let t = Instant::now();
    let out = node.stop();
    assert!(
        out.status.success(),
        "stop-node.sh left something behind:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!(
        "node stopped in {:?}; whole test {:?}",
        t.elapsed(),
        begun.elapsed()
    );
}
