//! Which workload each process belongs to — container, pod, cgroup — and what follows from
//! it: the labels samples carry, the include/exclude filters, and per-container CPU series.
//!
//! A process's cgroup is read once, when the process table first sees it. Kubernetes
//! metadata is looked up at every window close instead, because a pod often reaches the
//! watcher's store a moment after its first process has already been sampled.

pub mod cgroup;
pub mod kube;
pub mod walk;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::config::selector::{Selector, SelectorError};
use crate::config::Filters;
use crate::metrics::containers::{ContainerInfoLabels, ContainerLabels, ContainerMetrics};
use cgroup::CgroupInfo;
use kube::{Metadata, PodMeta};

/// Where a process runs, as read from `/proc/PID/cgroup` when it was first seen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cgroup {
    /// Container, pod and unit parsed from the cgroup paths.
    pub info: CgroupInfo,
    /// The cgroup file that counts this process's cgroup's CPU time: v1 `cpuacct.usage`
    /// (nanoseconds) or v2 `cpu.stat` (`usage_usec`).
    pub cpu_usage_file: Option<PathBuf>,
    /// The v2 cgroup id as BPF sees it (0 when unknown); non-root ids can be filtered in BPF.
    pub v2_id: u64,
}

impl Cgroup {
    /// Reads `/proc/<pid>/cgroup`; an unreadable file gives an empty answer (counted by the caller).
    pub fn read(pid: u32) -> Option<Self> {
        let path = PathBuf::from(format!("/proc/{pid}/cgroup"));
        let text = crate::os::procfs::read_capped(&path, cgroup::MAX_CGROUP_FILE_BYTES).ok()?;
        Some(Self::from_text(&text, Path::new("/sys/fs/cgroup")))
    }

    /// Parses the text of a `/proc/PID/cgroup` file, resolving files under `root`.
    pub fn from_text(text: &str, root: &Path) -> Self {
        let info = cgroup::parse_proc_cgroup(text);
        Self {
            cpu_usage_file: cpu_usage_file(text, root, &info.path),
            info,
            v2_id: 0,
        }
    }
}

/// The file counting the CPU time of a process's own cgroup: v1 `cpuacct.usage` or v2
/// `cpu.stat`. Only a cgroup below the root counts (the root's file is the whole host's), and
/// the one at the path that names the container (`chosen`) is preferred; between v1 and v2,
/// cpuacct wins, since hybrid hosts account CPU in v1 and leave v2's `usage_usec` at 0.
fn cpu_usage_file(text: &str, root: &Path, chosen: &str) -> Option<PathBuf> {
    let mut best: Option<(u8, PathBuf)> = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let path = path.trim_end_matches(" (deleted)");
        let rel = path.trim_start_matches('/');
        if rel.is_empty() || rel.split('/').any(|c| c == "..") {
            continue;
        }
        let candidates: Vec<PathBuf> = if controllers.split(',').any(|c| c == "cpuacct") {
            [controllers, "cpuacct", "cpu,cpuacct"]
                .iter()
                .map(|m| root.join(m).join(rel).join("cpuacct.usage"))
                .collect()
        } else if controllers.is_empty() {
            [root.to_path_buf(), root.join("unified")]
                .iter()
                .filter(|base| base.join("cgroup.controllers").exists())
                .map(|base| base.join(rel).join("cpu.stat"))
                .collect()
        } else {
            continue;
        };
        let score = 2 * u8::from(path == chosen) + u8::from(!controllers.is_empty());
        if let Some(file) = candidates.into_iter().find(|f| f.exists()) {
            if best.as_ref().is_none_or(|(s, _)| score > *s) {
                best = Some((score, file));
            }
        }
    }
    best.map(|(_, f)| f)
}

/// Reads a cgroup CPU usage file as seconds.
pub fn read_cpu_seconds(file: &Path) -> Option<f64> {
    let text = crate::os::procfs::read_capped(file, 4096).ok()?;
    if file.file_name()? == "cpuacct.usage" {
        return text.trim().parse::<u64>().ok().map(|ns| ns as f64 / 1e9);
    }
    text.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|us| us as f64 / 1e6)
}

/// The workload labels of one process in one window, as samples and metrics carry them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels {
    /// Container id (64 hex), empty outside containers.
    pub container_id: String,
    /// Pod uid, empty outside pods.
    pub pod_uid: String,
    /// Pod namespace (from the API), empty when unknown.
    pub namespace: String,
    /// Pod name (from the API).
    pub pod: String,
    /// Container name (from the API).
    pub container: String,
    /// Service name: annotation, or `<namespace>/<owner>`.
    pub service_name: String,
    /// Cgroup path, for processes outside containers.
    pub cgroup: String,
    /// systemd unit, when the cgroup names one.
    pub systemd_unit: String,
    /// Pod labels (for selectors; not exported as sample labels).
    pub pod_labels: BTreeMap<String, String>,
}

impl Labels {
    /// Builds the labels from a process's cgroup and, when known, its pod.
    pub fn new(cg: &Cgroup, pod: Option<&PodMeta>) -> Self {
        let info = &cg.info;
        let mut l = Labels {
            container_id: info.container_id.clone().unwrap_or_default(),
            pod_uid: info.pod_uid.clone().unwrap_or_default(),
            systemd_unit: info.systemd_unit.clone().unwrap_or_default(),
            ..Default::default()
        };
        if l.container_id.is_empty() {
            l.cgroup = info.path.clone();
        }
        if let Some(p) = pod {
            l.namespace = p.namespace.clone();
            l.pod = p.pod.clone();
            l.container = p.container.clone();
            l.service_name = p.service_name.clone();
            l.pod_labels = p.labels.clone();
            if l.pod_uid.is_empty() {
                l.pod_uid = p.pod_uid.clone();
            }
        }
        l
    }

    /// `(key, value)` pairs for pprof sample labels, empty values left out.
    pub fn sample_labels(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("container_id", self.container_id.as_str()),
            ("pod_uid", self.pod_uid.as_str()),
            ("namespace", self.namespace.as_str()),
            ("pod", self.pod.as_str()),
            ("container", self.container.as_str()),
            ("service_name", self.service_name.as_str()),
            ("cgroup", self.cgroup.as_str()),
            ("systemd_unit", self.systemd_unit.as_str()),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
    }
}

/// Looks up the labels of a process at window close.
pub fn labels_for(cg: &Cgroup, metadata: Option<&Metadata>) -> Labels {
    let pod = match (&cg.info.container_id, metadata) {
        (Some(id), Some(m)) => m.by_container_id(id),
        _ => None,
    };
    Labels::new(cg, pod.as_deref())
}

/// The include/exclude rules, compiled once.
#[derive(Debug, Default)]
pub struct Filter {
    rules: Filters,
    include_selector: Option<Selector>,
    exclude_selector: Option<Selector>,
}

/// What the filter says of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Profile it.
    Include,
    /// Drop it (and stop sampling it in BPF).
    Exclude,
    /// It is in a container whose pod is not known yet and a pod rule applies: ask again later.
    Undecided,
}

impl Filter {
    /// Compiles the `filters:` section.
    pub fn new(rules: &Filters) -> Result<Self, SelectorError> {
        let sel = |s: &str| -> Result<Option<Selector>, SelectorError> {
            if s.trim().is_empty() {
                Ok(None)
            } else {
                Selector::parse(s).map(Some)
            }
        };
        Ok(Self {
            include_selector: sel(&rules.include_pod_selector)?,
            exclude_selector: sel(&rules.exclude_pod_selector)?,
            rules: rules.clone(),
        })
    }

    /// Whether any rule needs Kubernetes metadata.
    fn needs_pods(&self) -> bool {
        let r = &self.rules;
        !(r.include_namespaces.is_empty()
            && r.exclude_namespaces.is_empty()
            && r.include_containers.is_empty()
            && r.exclude_containers.is_empty()
            && self.include_selector.is_none()
            && self.exclude_selector.is_none())
    }

    /// Whether nothing is filtered at all.
    pub fn is_empty(&self) -> bool {
        !self.needs_pods()
            && self.rules.include_processes.is_empty()
            && self.rules.exclude_processes.is_empty()
    }

    /// Judges a process by its name and workload labels.
    pub fn verdict(&self, process: &str, labels: &Labels) -> Verdict {
        let r = &self.rules;
        let listed = |list: &[String], v: &str| list.iter().any(|x| x == v);
        if listed(&r.exclude_processes, process) {
            return Verdict::Exclude;
        }
        if !r.include_processes.is_empty() && !listed(&r.include_processes, process) {
            return Verdict::Exclude;
        }
        if !self.needs_pods() {
            return Verdict::Include;
        }
        let in_pod = !labels.pod.is_empty();
        if !in_pod && !labels.container_id.is_empty() {
            // A container whose pod we have not seen (yet): pod rules cannot be judged.
            return Verdict::Undecided;
        }
        if in_pod {
            if listed(&r.exclude_namespaces, &labels.namespace)
                || listed(&r.exclude_containers, &labels.container)
                || self
                    .exclude_selector
                    .as_ref()
                    .is_some_and(|s| s.matches(&labels.pod_labels))
            {
                return Verdict::Exclude;
            }
            let included = (r.include_namespaces.is_empty()
                || listed(&r.include_namespaces, &labels.namespace))
                && (r.include_containers.is_empty()
                    || listed(&r.include_containers, &labels.container))
                && self
                    .include_selector
                    .as_ref()
                    .is_none_or(|s| s.matches(&labels.pod_labels));
            return if included {
                Verdict::Include
            } else {
                Verdict::Exclude
            };
        }
        // A host process: it is in no namespace, container or pod, so any include rule on
        // those leaves it out, and no exclude rule on them can match it.
        let pod_includes = !r.include_namespaces.is_empty()
            || !r.include_containers.is_empty()
            || self.include_selector.is_some();
        if pod_includes {
            Verdict::Exclude
        } else {
            Verdict::Include
        }
    }
}

struct Tracked {
    labels: ContainerLabels,
    info: ContainerInfoLabels,
    usage_file: Option<PathBuf>,
    last_usage: Option<f64>,
    last_window: u64,
}

/// Keeps the per-container series up to date and bounded: a container unseen for
/// [`FORGET_AFTER_WINDOWS`] windows loses its series.
pub struct Accounting {
    metrics: ContainerMetrics,
    node: String,
    tracked: HashMap<String, Tracked>,
    window: u64,
    max: usize,
}

/// Windows after which an idle container's series are removed.
pub const FORGET_AFTER_WINDOWS: u64 = 30;

impl Accounting {
    /// Accounting into `metrics`, for at most `max` containers at a time.
    pub fn new(metrics: ContainerMetrics, node: String, max: usize) -> Self {
        Self {
            metrics,
            node,
            tracked: HashMap::new(),
            window: 0,
            max,
        }
    }

    /// Adds one window's samples of a container (`seconds` = samples × period).
    pub fn add(&mut self, labels: &Labels, cg: &Cgroup, seconds: f64) {
        if labels.container_id.is_empty() {
            return;
        }
        if !self.tracked.contains_key(&labels.container_id) && self.tracked.len() >= self.max {
            return;
        }
        let window = self.window;
        let t = self
            .tracked
            .entry(labels.container_id.clone())
            .or_insert_with(|| Tracked {
                labels: ContainerLabels {
                    namespace: String::new(),
                    pod: String::new(),
                    container: String::new(),
                    container_id: labels.container_id.clone(),
                },
                info: ContainerInfoLabels {
                    namespace: String::new(),
                    pod: String::new(),
                    container: String::new(),
                    container_id: labels.container_id.clone(),
                    pod_uid: String::new(),
                    node: String::new(),
                },
                usage_file: cg.cpu_usage_file.clone(),
                last_usage: None,
                last_window: window,
            });
        // Pod metadata may arrive after the container's first window: move its series then.
        if t.labels.pod.is_empty() && !labels.pod.is_empty() {
            self.metrics.sampled.remove(&t.labels);
            self.metrics.cgroup.remove(&t.labels);
            self.metrics.info.remove(&t.info);
            t.labels.namespace = labels.namespace.clone();
            t.labels.pod = labels.pod.clone();
            t.labels.container = labels.container.clone();
            t.last_usage = None;
        }
        t.info = ContainerInfoLabels {
            namespace: t.labels.namespace.clone(),
            pod: t.labels.pod.clone(),
            container: t.labels.container.clone(),
            container_id: labels.container_id.clone(),
            pod_uid: labels.pod_uid.clone(),
            node: self.node.clone(),
        };
        t.last_window = window;
        self.metrics
            .sampled
            .get_or_create(&t.labels)
            .inc_by(seconds);
    }

    /// Closes a window: reads each container's cgroup usage, sets the info series and
    /// forgets containers idle for too long.
    pub fn end_window(&mut self) {
        let (m, now) = (&self.metrics, self.window);
        self.tracked.retain(|_, t| {
            if now.saturating_sub(t.last_window) > FORGET_AFTER_WINDOWS {
                m.sampled.remove(&t.labels);
                m.cgroup.remove(&t.labels);
                m.info.remove(&t.info);
                return false;
            }
            m.info.get_or_create(&t.info).set(1);
            // A reading of 0 means "not accounted here" (cgroup v2 on hybrid hosts), not idle.
            let usage = t
                .usage_file
                .as_deref()
                .and_then(read_cpu_seconds)
                .filter(|u| *u > 0.0);
            if let Some(usage) = usage {
                let counter = m.cgroup.get_or_create(&t.labels);
                match t.last_usage {
                    // The first reading carries the cgroup's whole history, as cAdvisor reports it.
                    None => {
                        counter.inc_by(usage);
                    }
                    Some(prev) if usage >= prev => {
                        counter.inc_by(usage - prev);
                    }
                    Some(_) => {} // a recreated cgroup: wait for it to pass the old total
                }
                if t.last_usage.is_none_or(|prev| usage >= prev) {
                    t.last_usage = Some(usage);
                }
            }
            true
        });
        self.window += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn cg_in_pod() -> Cgroup {
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_0000_1111_2222_333344445555.slice/cri-containerd-{ID}.scope\n"
        );
        Cgroup::from_text(&text, Path::new("/nonexistent"))
    }

    fn pod_labels(ns: &str, container: &str, app: &str) -> Labels {
        let mut l = Labels::new(&cg_in_pod(), None);
        l.namespace = ns.into();
        l.pod = "web-1".into();
        l.container = container.into();
        l.pod_labels.insert("app".into(), app.into());
        l
    }

    fn filter(f: Filters) -> Filter {
        Filter::new(&f).expect("valid filters")
    }

    #[test]
    fn cgroup_labels_without_api() {
        let l = Labels::new(&cg_in_pod(), None);
        assert_eq!(l.container_id, ID);
        assert_eq!(l.pod_uid, "1b2c3d4e-0000-1111-2222-333344445555");
        assert!(l.cgroup.is_empty(), "containers are named by id, not path");
        let keys: Vec<_> = l.sample_labels().map(|(k, _)| k).collect();
        assert_eq!(keys, ["container_id", "pod_uid"]);
        let host = Labels::new(
            &Cgroup::from_text("0::/system.slice/ssh.service\n", Path::new("/x")),
            None,
        );
        assert_eq!(host.cgroup, "/system.slice/ssh.service");
        assert_eq!(host.systemd_unit, "ssh.service");
    }

    #[test]
    fn usage_files_v1_and_v2() {
        let root = tempfile::tempdir().expect("tempdir");
        let v1 = root.path().join("cpuacct/kubepods/pod1/abc");
        std::fs::create_dir_all(&v1).expect("mkdir");
        std::fs::write(v1.join("cpuacct.usage"), "2500000000\n").expect("write");
        let unified = root.path().join("unified");
        std::fs::create_dir_all(unified.join("a.slice")).expect("mkdir");
        std::fs::write(unified.join("cgroup.controllers"), "").expect("write");
        std::fs::write(
            unified.join("a.slice/cpu.stat"),
            "usage_usec 1500000\nuser_usec 1\n",
        )
        .expect("write");

        std::fs::write(root.path().join("cpuacct/cpuacct.usage"), "9\n").expect("write");
        let text = "2:cpuacct:/kubepods/pod1/abc\n0::/\n";
        let f = cpu_usage_file(text, root.path(), "/kubepods/pod1/abc");
        assert_eq!(read_cpu_seconds(&f.expect("v1 file")), Some(2.5));
        // The root's cpuacct.usage is the whole host's: never a container's.
        let f = cpu_usage_file("2:cpuacct:/\n0::/a.slice\n", root.path(), "/a.slice");
        assert_eq!(read_cpu_seconds(&f.expect("v2 file")), Some(1.5));
        assert_eq!(
            cpu_usage_file("2:cpuacct:/\n0::/\n", root.path(), "/"),
            None
        );
        assert_eq!(
            cpu_usage_file("2:cpuacct:/../../etc\n", root.path(), ""),
            None
        );
    }

    #[test]
    fn no_rules_include_everything() {
        let f = filter(Filters::default());
        assert!(f.is_empty());
        assert_eq!(f.verdict("bash", &Labels::default()), Verdict::Include);
        assert_eq!(
            f.verdict("x", &Labels::new(&cg_in_pod(), None)),
            Verdict::Include
        );
    }

    #[test]
    fn process_rules_need_no_metadata() {
        let f = filter(Filters {
            exclude_processes: vec!["noisy".into()],
            ..Default::default()
        });
        assert_eq!(f.verdict("noisy", &Labels::default()), Verdict::Exclude);
        assert_eq!(f.verdict("quiet", &Labels::default()), Verdict::Include);
        let f = filter(Filters {
            include_processes: vec!["only".into()],
            ..Default::default()
        });
        assert_eq!(f.verdict("other", &Labels::default()), Verdict::Exclude);
        assert_eq!(f.verdict("only", &Labels::default()), Verdict::Include);
    }

    #[test]
    fn pod_rules() {
        let f = filter(Filters {
            include_namespaces: vec!["prod".into()],
            exclude_containers: vec!["sidecar".into()],
            exclude_pod_selector: "app=debug".into(),
            ..Default::default()
        });
        assert_eq!(
            f.verdict("p", &pod_labels("prod", "web", "web")),
            Verdict::Include
        );
        assert_eq!(
            f.verdict("p", &pod_labels("dev", "web", "web")),
            Verdict::Exclude
        );
        assert_eq!(
            f.verdict("p", &pod_labels("prod", "sidecar", "web")),
            Verdict::Exclude
        );
        assert_eq!(
            f.verdict("p", &pod_labels("prod", "web", "debug")),
            Verdict::Exclude
        );
        assert_eq!(
            f.verdict("p", &Labels::new(&cg_in_pod(), None)),
            Verdict::Undecided
        );
        assert_eq!(
            f.verdict("p", &Labels::default()),
            Verdict::Exclude,
            "host process, namespace include"
        );
        let f = filter(Filters {
            exclude_namespaces: vec!["kube-system".into()],
            include_pod_selector: "app in (web)".into(),
            ..Default::default()
        });
        assert_eq!(
            f.verdict("p", &pod_labels("prod", "web", "web")),
            Verdict::Include
        );
        assert_eq!(
            f.verdict("p", &pod_labels("prod", "web", "api")),
            Verdict::Exclude
        );
        assert_eq!(
            f.verdict("p", &pod_labels("kube-system", "web", "web")),
            Verdict::Exclude
        );
    }

    #[test]
    fn bad_selector_is_an_error() {
        assert!(Filter::new(&Filters {
            include_pod_selector: "app in (".into(),
            ..Default::default()
        })
        .is_err());
    }

    #[test]
    fn accounting_moves_series_when_the_pod_appears_and_forgets_idle_containers() {
        let metrics = ContainerMetrics::default();
        let mut acc = Accounting::new(metrics.clone(), "node-1".into(), 10);
        let cg = cg_in_pod();
        let bare = Labels::new(&cg, None);
        acc.add(&bare, &cg, 1.0);
        acc.end_window();
        let key = |l: &Labels| ContainerLabels {
            namespace: l.namespace.clone(),
            pod: l.pod.clone(),
            container: l.container.clone(),
            container_id: l.container_id.clone(),
        };
        assert_eq!(metrics.sampled.get_or_create(&key(&bare)).get(), 1.0);
        let named = pod_labels("prod", "web", "web");
        acc.add(&named, &cg, 2.0);
        acc.end_window();
        assert_eq!(metrics.sampled.get_or_create(&key(&named)).get(), 2.0);
        for _ in 0..=FORGET_AFTER_WINDOWS + 1 {
            acc.end_window();
        }
        assert!(acc.tracked.is_empty());
        // Host processes are not containers.
        acc.add(&Labels::default(), &Cgroup::default(), 1.0);
        assert!(acc.tracked.is_empty());
    }
}
