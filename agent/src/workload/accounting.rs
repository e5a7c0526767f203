//! Per-container CPU series from the workload side: seconds sampled
//! (`ember_container_cpu_seconds_total`), the cgroup's own CPU time
//! (`ember_container_cgroup_cpu_seconds_total`) and the info series.
//!
//! In: each window's samples per container ([`Accounting::add`]: labels, cgroup, seconds)
//! and the window's close ([`Accounting::end_window`], which reads each container's cgroup
//! CPU usage file). Out: the series in [`ContainerMetrics`], bounded in number and forgotten
//! when a container stays idle.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::metrics::containers::{
    ContainerInfoLabels, ContainerLabels, ContainerMetrics, ContainerOffCpuLabels,
};
use crate::metrics::OffState;

use super::cgroup::{read_cpu_seconds, Cgroup};
use super::labels::Labels;

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
        if let Some(t) = self.track(labels, cg) {
            let key = t.labels.clone();
            self.metrics.sampled.get_or_create(&key).inc_by(seconds);
        }
    }

    /// Adds time a container's threads were off CPU, in `state`.
    pub fn add_offcpu(&mut self, labels: &Labels, cg: &Cgroup, state: OffState, seconds: f64) {
        if let Some(t) = self.track(labels, cg) {
            let key = offcpu_labels(&t.labels, state);
            self.metrics.offcpu.get_or_create(&key).inc_by(seconds);
        }
    }

    /// The container's entry, made (within the cap) or refreshed for this window.
    fn track(&mut self, labels: &Labels, cg: &Cgroup) -> Option<&Tracked> {
        if labels.container_id.is_empty() {
            return None;
        }
        if !self.tracked.contains_key(&labels.container_id) && self.tracked.len() >= self.max {
            return None;
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
            remove_series(&self.metrics, t);
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
        Some(t)
    }

    /// Closes a window: reads each container's cgroup usage, sets the info series and
    /// forgets containers idle for too long.
    pub fn end_window(&mut self) {
        let (m, now) = (&self.metrics, self.window);
        self.tracked.retain(|_, t| {
            if now.saturating_sub(t.last_window) > FORGET_AFTER_WINDOWS {
                remove_series(m, t);
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
    m.cgroup.remove(&t.labels);
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
