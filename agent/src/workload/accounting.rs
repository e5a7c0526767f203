//! Per-container series from the workload side: seconds sampled
//! (`ember_container_cpu_seconds_total`), seconds off CPU and the info series. The cgroup's
//! own CPU counter of the same containers is the USE readings' (one reader of it:
//! `ember_container_cpu_usage_seconds_total`, [`crate::readings`]), which names a container
//! by the same labels.
//!
//! In: each window's samples per container ([`Accounting::add`]: labels, cgroup, seconds)
//! and the window's close ([`Accounting::end_window`]). Out: the series in
//! [`ContainerMetrics`], bounded in number and in bytes
//! ([`MAX_BYTES`]; containers beyond either cap are counted in
//! `ember_cache_dropped_total{cache="accounting"}`) and forgotten when a container stays idle.

use std::collections::HashMap;

use crate::metrics::containers::{
    ContainerInfoLabels, ContainerLabels, ContainerMetrics, ContainerOffCpuLabels,
};
use crate::metrics::{Cache, Metrics};
use crate::model::{Labels, OffState};

struct Tracked {
    labels: ContainerLabels,
    info: ContainerInfoLabels,
    last_window: u64,
    /// What the entry and its series are charged against [`MAX_BYTES`].
    bytes: usize,
}

/// Keeps the per-container series up to date and bounded: a container unseen for
/// [`FORGET_AFTER_WINDOWS`] windows loses its series.
pub struct Accounting {
    metrics: ContainerMetrics,
    /// Where containers left out (over a cap) are counted.
    dropped: Metrics,
    node: String,
    tracked: HashMap<String, Tracked>,
    window: u64,
    max: usize,
    /// Bytes charged by `tracked`, and their cap.
    bytes: usize,
    max_bytes: usize,
}

/// Windows after which an idle container's series are removed.
pub const FORGET_AFTER_WINDOWS: u64 = 30;

/// Bytes the tracked containers and their series may hold: label strings come from cgroup
/// paths and pod metadata, so the entry cap alone does not bound them. A container costs
/// about 2 KiB (5 KiB with the longest names Kubernetes allows), so 8 MiB holds some 1,700
/// to 4,000 containers seen within [`FORGET_AFTER_WINDOWS`] windows; it is part of the
/// memory limit's baseline (deploy/README.md).
pub const MAX_BYTES: usize = 8 << 20;

impl Accounting {
    /// Accounting into `metrics.containers`, for at most `max` containers and `max_bytes`
    /// bytes at a time; containers left out are counted in `metrics`.
    pub fn new(metrics: &Metrics, node: String, max: usize, max_bytes: usize) -> Self {
        Self {
            metrics: metrics.containers.clone(),
            dropped: metrics.clone(),
            node,
            tracked: HashMap::new(),
            window: 0,
            max,
            bytes: 0,
            max_bytes,
        }
    }

    /// Bytes charged by the tracked containers and their series.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Adds one window's samples of a container (`seconds` = samples × period).
    pub fn add(&mut self, labels: &Labels, seconds: f64) {
        if let Some(t) = self.track(labels) {
            let key = t.labels.clone();
            self.metrics.sampled.get_or_create(&key).inc_by(seconds);
        }
    }

    /// Adds time a container's threads were off CPU, in `state`.
    pub fn add_offcpu(&mut self, labels: &Labels, state: OffState, seconds: f64) {
        if let Some(t) = self.track(labels) {
            let key = offcpu_labels(&t.labels, state);
            self.metrics.offcpu.get_or_create(&key).inc_by(seconds);
        }
    }

    /// Adds time a container's threads waited for locks (futex waits, kernel locks).
    pub fn add_lock(&mut self, labels: &Labels, seconds: f64) {
        if let Some(key) = self.track(labels).map(|t| t.labels.clone()) {
            self.metrics.lock_wait.get_or_create(&key).inc_by(seconds);
        }
    }

    /// The container's entry, made (within the caps) or refreshed for this window. A
    /// container that does not fit is counted and left out; one whose labels grew past
    /// the byte cap (its pod arrived) loses its series.
    fn track(&mut self, labels: &Labels) -> Option<&Tracked> {
        if labels.container_id.is_empty() {
            return None;
        }
        let need = entry_bytes(labels, &self.node);
        let held = self.tracked.get(&labels.container_id).map(|t| t.bytes);
        let fits = self.bytes - held.unwrap_or(0) + need <= self.max_bytes;
        match held {
            None if self.tracked.len() >= self.max || !fits => {
                self.dropped.dropped(Cache::Accounting, 1);
                return None;
            }
            Some(_) if !fits => {
                if let Some(t) = self.tracked.remove(&labels.container_id) {
                    remove_series(&self.metrics, &t);
                    self.bytes -= t.bytes;
                }
                self.dropped.dropped(Cache::Accounting, 1);
                return None;
            }
            _ => {}
        }
        self.bytes = self.bytes - held.unwrap_or(0) + need;
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
                last_window: window,
                bytes: 0,
            });
        t.bytes = need;
        // Pod metadata may arrive after the container's first window: move its series then.
        if t.labels.pod.is_empty() && !labels.pod.is_empty() {
            remove_series(&self.metrics, t);
            t.labels.namespace = labels.namespace.clone();
            t.labels.pod = labels.pod.clone();
            t.labels.container = labels.container.clone();
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
        Some(t)
    }

    /// Forgets at once the containers of pods the API no longer has (`pod_gone(pod_uid)`)
    /// that had no sample in the window now closing. A deleted pod's series then leave
    /// /metrics (and go stale in Prometheus) a window after its last sample rather than
    /// [`FORGET_AFTER_WINDOWS`] windows later; a container still sampled keeps its series
    /// until it stops. Call before [`Accounting::end_window`].
    pub fn forget_deleted_pods(&mut self, pod_gone: impl Fn(&str) -> bool) {
        let (m, now, bytes) = (&self.metrics, self.window, &mut self.bytes);
        self.tracked.retain(|_, t| {
            let gone =
                t.last_window < now && !t.info.pod_uid.is_empty() && pod_gone(&t.info.pod_uid);
            if gone {
                remove_series(m, t);
                *bytes -= t.bytes;
            }
            !gone
        });
    }

    /// Closes a window: sets the info series and forgets containers idle for too long.
    pub fn end_window(&mut self) {
        let (m, now, bytes) = (&self.metrics, self.window, &mut self.bytes);
        self.tracked.retain(|_, t| {
            if now.saturating_sub(t.last_window) > FORGET_AFTER_WINDOWS {
                remove_series(m, t);
                *bytes -= t.bytes;
                return false;
            }
            m.info.get_or_create(&t.info).set(1);
            true
        });
        self.window += 1;
    }
}

/// What a container's entry and its series hold, estimated from its strings: the entry
/// (key, series labels, info labels) and one label set per series (CPU from samples,
/// info, off-CPU per state), each with its counter and hash table share.
fn entry_bytes(labels: &Labels, node: &str) -> usize {
    const STRING: usize = std::mem::size_of::<String>();
    const SERIES: usize = 64;
    let names = labels.namespace.len()
        + labels.pod.len()
        + labels.container.len()
        + labels.container_id.len();
    let series_labels = 4 * STRING + names;
    let info_labels = 6 * STRING + names + labels.pod_uid.len() + node.len();
    let entry = std::mem::size_of::<(String, Tracked)>()
        + labels.container_id.len()
        + names
        + (names + labels.pod_uid.len() + node.len());
    let series = (series_labels + SERIES)
        + (info_labels + SERIES)
        + OffState::ALL.len() * (series_labels + SERIES);
    entry + series
}

/// The off-CPU series of a container in `state`.
fn offcpu_labels(l: &ContainerLabels, state: OffState) -> ContainerOffCpuLabels {
    ContainerOffCpuLabels {
        namespace: l.namespace.clone(),
        pod: l.pod.clone(),
        container: l.container.clone(),
        container_id: l.container_id.clone(),
        state,
    }
}

/// Removes every series of a container (it moved to its pod's labels, or went idle).
fn remove_series(m: &ContainerMetrics, t: &Tracked) {
    m.sampled.remove(&t.labels);
    m.lock_wait.remove(&t.labels);
    m.info.remove(&t.info);
    for &state in OffState::ALL {
        m.offcpu.remove(&offcpu_labels(&t.labels, state));
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{cg_in_pod, pod_labels};
    use super::*;

    #[test]
    fn accounting_moves_series_when_the_pod_appears_and_forgets_idle_containers() {
        let all = Metrics::new();
        let metrics = all.containers.clone();
        let mut acc = Accounting::new(&all, "node-1".into(), 10, MAX_BYTES);
        let cg = cg_in_pod();
        let bare = Labels::new(&cg, None);
        acc.add(&bare, 1.0);
        acc.end_window();
        let key = |l: &Labels| ContainerLabels {
            namespace: l.namespace.clone(),
            pod: l.pod.clone(),
            container: l.container.clone(),
            container_id: l.container_id.clone(),
        };
        assert_eq!(metrics.sampled.get_or_create(&key(&bare)).get(), 1.0);
        let named = pod_labels("prod", "web", "web");
        acc.add(&named, 2.0);
        acc.end_window();
        assert_eq!(metrics.sampled.get_or_create(&key(&named)).get(), 2.0);
        for _ in 0..=FORGET_AFTER_WINDOWS + 1 {
            acc.end_window();
        }
        assert!(acc.tracked.is_empty());
        assert_eq!(acc.bytes(), 0, "forgotten containers give their bytes back");
        // Host processes are not containers.
        acc.add(&Labels::default(), 1.0);
        assert!(acc.tracked.is_empty());
    }

    #[test]
    fn a_deleted_pods_series_go_a_window_after_its_last_sample() {
        let all = Metrics::new();
        let mut acc = Accounting::new(&all, "node-1".into(), 10, MAX_BYTES);
        let web = pod_labels("prod", "web", "web");
        let mut db = pod_labels("prod", "db", "db");
        db.container_id = format!("{:064x}", 7);
        db.pod_uid = "uid-db".into();
        let has = |container: &str| {
            let want = format!("container=\"{container}\"");
            all.encode()
                .lines()
                .any(|l| l.starts_with("ember_container_cpu_seconds_total{") && l.contains(&want))
        };
        acc.add(&web, 1.0);
        acc.add(&db, 1.0);
        // Gone from the API but sampled in this window: kept until it stops.
        acc.forget_deleted_pods(|_| true);
        acc.end_window();
        assert!(has("web") && has("db"));
        // A window without samples: only the deleted pod's series go.
        acc.forget_deleted_pods(|uid| uid == "uid-db");
        acc.end_window();
        assert!(has("web"), "{}", all.encode());
        assert!(!has("db"), "{}", all.encode());
        assert!(!all.encode().contains("uid-db"), "the info series goes too");
        assert_eq!(acc.tracked.len(), 1);
        assert_eq!(acc.bytes(), entry_bytes(&web, "node-1"));
    }

    /// Labels of a container with the longest names Kubernetes allows (253-byte pod and
    /// node names) and a distinct id.
    fn long_labels(i: usize) -> Labels {
        let mut l = pod_labels(&"n".repeat(63), &"c".repeat(63), "app");
        l.pod = "p".repeat(253);
        l.container_id = format!("{i:064x}");
        l.pod_uid = format!("{i:036}");
        l
    }

    #[test]
    fn accounting_is_bounded_in_bytes_and_counts_what_it_leaves_out() {
        let all = Metrics::new();
        let cap = 256 << 10;
        // The entry cap alone would let 100,000 containers in.
        let mut acc = Accounting::new(&all, "n".repeat(253), 100_000, cap);
        for i in 0..1000 {
            acc.add(&long_labels(i), 1.0);
        }
        let kept = acc.tracked.len();
        println!("{kept} containers in {} bytes", acc.bytes());
        assert!(acc.bytes() <= cap, "{} bytes", acc.bytes());
        assert!(kept > 10 && kept < 1000, "{kept} kept");
        let text = all.encode();
        assert!(
            text.contains(&format!(
                "ember_cache_dropped_total{{cache=\"accounting\"}} {}",
                1000 - kept
            )),
            "{text}"
        );
        // The series left out are not made either.
        let series = text
            .lines()
            .filter(|l| l.starts_with("ember_container_cpu_seconds_total{"))
            .count();
        assert_eq!(series, kept);
        // Room is made as idle containers are forgotten.
        for _ in 0..=FORGET_AFTER_WINDOWS + 1 {
            acc.end_window();
        }
        assert_eq!(acc.bytes(), 0);
        acc.add(&long_labels(5000), 1.0);
        assert_eq!(acc.tracked.len(), 1);
    }

    #[test]
    fn a_container_whose_labels_outgrow_the_cap_loses_its_series() {
        let all = Metrics::new();
        let cg = cg_in_pod();
        let bare = Labels::new(&cg, None);
        let small = entry_bytes(&bare, "node");
        let mut acc = Accounting::new(&all, "node".into(), 10, small + 100);
        acc.add(&bare, 1.0);
        assert_eq!(acc.tracked.len(), 1);
        let mut named = long_labels(0);
        named.container_id = bare.container_id.clone();
        acc.add(&named, 1.0);
        assert!(acc.tracked.is_empty());
        assert_eq!(acc.bytes(), 0);
        let text = all.encode();
        assert!(
            text.contains("ember_cache_dropped_total{cache=\"accounting\"} 1"),
            "{text}"
        );
        assert!(
            !text.contains("ember_container_cpu_seconds_total{"),
            "{text}"
        );
    }
}
