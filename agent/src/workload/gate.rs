//! The gate: which processes' samples are kept. At each window's close the processes of
//! the window are judged ([`Gate::judge`]: their labels, then the filter's verdict); an
//! excluded one is denied in BPF, by container where it has a cgroup v2 of its own, else by
//! pid, so its samples stop at the source; the denials are reviewed every window and
//! lifted once the process or container is gone or no longer excluded.
//!
//! The orders go to the sampler through a bounded queue; one the queue refuses is counted
//! (`ember_cache_dropped_total{cache="control_queue"}`) and sent again later: a deny when
//! the process's next samples are judged, an allow at the next window's close.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use super::kube::Metadata;
use super::{labels_for, Cgroup, Filter, Verdict};
use crate::metrics::{Cache, Metrics};
use crate::model::Labels;

/// An order for the sampler's BPF deny maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Drop the samples of this pid in BPF.
    DenyPid(u32),
    /// Sample this pid again.
    AllowPid(u32),
    /// Drop the samples of this cgroup v2 id in BPF.
    DenyCgroup(u64),
    /// Sample this cgroup again.
    AllowCgroup(u64),
}

/// Queues an order for the sampler; false when the queue was full.
pub type Orders = Box<dyn FnMut(Order) -> bool + Send>;

/// A process the filter let through: its labels for this window.
pub type Judged = Arc<Labels>;

/// One process to judge: its pid, cgroup and name.
pub struct Candidate {
    /// Its pid.
    pub pid: u32,
    /// Its cgroup, read when it was first seen.
    pub cgroup: Arc<Cgroup>,
    /// Its name.
    pub name: Arc<str>,
}

/// A cgroup denied in BPF: the directory that tells whether it still exists, and the
/// cgroup its labels are judged from again each window.
struct DeniedCgroup {
    dir: Option<PathBuf>,
    cgroup: Arc<Cgroup>,
}

/// Verdicts, the BPF deny and allow orders they lead to, and their retries.
pub struct Gate {
    /// Kubernetes pod metadata, when enabled.
    metadata: Option<Metadata>,
    filter: Filter,
    orders: Option<Orders>,
    /// The BPF cgroup deny map's entries.
    max_cgroups: usize,
    metrics: Metrics,
    /// Excluded processes whose samples may still be in flight.
    denied: HashSet<u32>,
    /// Cgroups denied in BPF (at most `max_cgroups`): allowed again once their directory is
    /// gone or their workload no longer excluded (its pod's labels changed), so the BPF map
    /// never fills with dead containers nor keeps out live ones.
    denied_cgroups: HashMap<u64, DeniedCgroup>,
    /// Cgroups to allow in BPF whose order found the queue full: sent again at the next
    /// window's close. Still in the BPF map, so they count toward its entries.
    allow_cgroups: Vec<u64>,
}

impl Gate {
    /// A gate judging by `filter` (with pod `metadata`), sending its orders to `orders`
    /// (none: nothing is denied in BPF, excluded samples are still dropped here), with
    /// room for `max_cgroups` denied cgroups in BPF.
    pub fn new(
        metadata: Option<Metadata>,
        filter: Filter,
        orders: Option<Orders>,
        max_cgroups: usize,
        metrics: Metrics,
    ) -> Self {
        Self {
            metadata,
            filter,
            orders,
            max_cgroups,
            metrics,
            denied: HashSet::new(),
            denied_cgroups: HashMap::new(),
            allow_cgroups: Vec::new(),
        }
    }

    /// The pod metadata, when Kubernetes is enabled.
    pub fn metadata(&self) -> Option<&Metadata> {
        self.metadata.as_ref()
    }

    /// Whether `pid` was excluded: its samples still in flight are dropped.
    pub fn denied(&self, pid: u32) -> bool {
        self.denied.contains(&pid)
    }

    /// Labels of every process in the window, in the order of `candidates`, `None` for the
    /// ones the filter excludes (those are also denied in BPF from now on).
    pub fn judge(
        &mut self,
        candidates: impl IntoIterator<Item = Candidate>,
    ) -> Vec<Option<Judged>> {
        let fresh = self.metadata.as_ref().is_some_and(|m| m.fresh());
        self.metrics.kubernetes_fresh.set(i64::from(fresh));
        let mut out = Vec::new();
        for c in candidates {
            let labels = labels_for(&c.cgroup, self.metadata.as_ref());
            if self.filter.verdict(&c.name, &labels) == Verdict::Exclude {
                // Excluded by its process name: its container's other processes may be wanted.
                let whole = self.filter.workload_verdict(&labels) == Verdict::Exclude;
                self.deny(c.pid, &c.cgroup, whole);
                out.push(None);
            } else {
                out.push(Some(Arc::new(labels)));
            }
        }
        out
    }

    /// At a window's close: allows the pids of processes that are `gone` if they were
    /// denied, then reviews the denied cgroups ([`Gate::review_denied_cgroups`]).
    pub fn end_window(&mut self, gone: impl IntoIterator<Item = u32>) {
        self.allow_gone(gone);
        self.review_denied_cgroups();
    }

    /// Allows the pids of processes that are `gone` if they were denied: another process
    /// may take the pid.
    pub fn allow_gone(&mut self, gone: impl IntoIterator<Item = u32>) {
        for pid in gone {
            if self.denied.remove(&pid) {
                self.send(Order::AllowPid(pid));
            }
        }
    }

    /// Denies an excluded process in BPF: its whole container (`whole`, the workload rules
    /// exclude it) where it has a cgroup v2 of its own, else the pid.
    fn deny(&mut self, pid: u32, cg: &Arc<Cgroup>, whole: bool) {
        self.denied.insert(pid);
        // A container in its own cgroup v2 is denied as a whole (its future processes too);
        // elsewhere (cgroup v1, hybrid hosts where every task reads the root id), beyond the
        // map's entries, or when only this process is excluded, by pid.
        let by_cgroup = whole
            && cg.v2_id > 1
            && cg.info.container_id.is_some()
            && (self.denied_cgroups.contains_key(&cg.v2_id)
                || self.denied_cgroups.len() + self.allow_cgroups.len() < self.max_cgroups);
        if !by_cgroup {
            self.send(Order::DenyPid(pid));
            return;
        }
        if self.denied_cgroups.contains_key(&cg.v2_id) {
            return;
        }
        // Remembered only once the order is queued: a dropped one is sent again when the
        // cgroup's next samples are judged.
        if self.send(Order::DenyCgroup(cg.v2_id)) {
            let dir = cg
                .cpu_usage_file
                .as_ref()
                .and_then(|f| f.parent())
                .map(|d| d.to_path_buf());
            self.denied_cgroups.insert(
                cg.v2_id,
                DeniedCgroup {
                    dir,
                    cgroup: cg.clone(),
                },
            );
            self.allow_cgroups.retain(|&id| id != cg.v2_id);
        }
    }

    /// Allows the denied cgroups whose directory is gone (the container ended; ids are not
    /// reused) or whose workload the filter no longer excludes (its pod's labels changed).
    /// One stat and one verdict per denied cgroup per window.
    fn review_denied_cgroups(&mut self) {
        let metadata = self.metadata.as_ref();
        let filter = &self.filter;
        let allowed: Vec<u64> = self
            .denied_cgroups
            .iter()
            .filter(|(_, d)| {
                let gone = d.dir.as_ref().is_some_and(|dir| !dir.exists());
                gone || {
                    let labels = labels_for(&d.cgroup, metadata);
                    // Undecided (its pod unknown again) stays denied: only a clear Include
                    // is a change of mind.
                    filter.workload_verdict(&labels) == Verdict::Include
                }
            })
            .map(|(id, _)| *id)
            .collect();
        for id in allowed {
            self.denied_cgroups.remove(&id);
            self.allow_cgroups.push(id);
        }
        let pending = std::mem::take(&mut self.allow_cgroups);
        for id in pending {
            if !self.send(Order::AllowCgroup(id)) {
                self.allow_cgroups.push(id);
            }
        }
    }

    /// Queues an order for the sampler; false (counted) when the queue was full.
    fn send(&mut self, order: Order) -> bool {
        let Some(orders) = &mut self.orders else {
            return true;
        };
        if !orders(order) {
            self.metrics.dropped(Cache::ControlQueue, 1);
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{Receiver, SyncSender};

    use super::*;

    /// The BPF cgroup deny map's entries in these tests.
    const MAX_CGROUPS: usize = 16;

    /// A container's cgroup v2 (id 77) whose directory exists, and the pod that runs it.
    fn container(
        dir: &std::path::Path,
        app: &str,
    ) -> (Arc<Cgroup>, k8s_openapi::api::core::v1::Pod) {
        const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let text = format!(
            "0::/kubepods.slice/kubepods-pod1b2c3d4e_0000_1111_2222_333344445555.slice/cri-containerd-{ID}.scope\n"
        );
        let mut cg = Cgroup::from_text(&text, std::path::Path::new("/nonexistent"));
        cg.v2_id = 77;
        cg.cpu_usage_file = Some(dir.join("cpu.stat"));
        let pod = k8s_openapi::serde_json::from_value(k8s_openapi::serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "shop",
                         "uid": "1b2c3d4e-0000-1111-2222-333344445555",
                         "labels": {"app": app}},
            "status": {"containerStatuses": [{"name": "web", "containerID": format!("containerd://{ID}"),
                "image": "web", "imageID": "", "ready": true, "restartCount": 0}]}
        }))
        .expect("pod json");
        (Arc::new(cg), pod)
    }

    /// Orders into a queue of two.
    fn queue() -> (Orders, Receiver<Order>) {
        let (tx, rx): (SyncSender<Order>, _) = std::sync::mpsc::sync_channel(2);
        (Box::new(move |o| tx.try_send(o).is_ok()), rx)
    }

    fn gate(rules: crate::config::Filters, metadata: Option<Metadata>) -> (Gate, Receiver<Order>) {
        let (orders, rx) = queue();
        let filter = Filter::new(&rules).expect("filter");
        let g = Gate::new(metadata, filter, Some(orders), MAX_CGROUPS, Metrics::new());
        (g, rx)
    }

    fn batch() -> crate::config::Filters {
        crate::config::Filters {
            exclude_pod_selector: "app=batch".into(),
            ..Default::default()
        }
    }

    #[test]
    fn an_excluded_process_is_judged_out_and_denied_until_gone() {
        let dir = tempfile::tempdir().expect("tmp");
        let (cg, _) = container(dir.path(), "web");
        let rules = crate::config::Filters {
            exclude_processes: vec!["sleep".into()],
            ..Default::default()
        };
        let (mut g, rx) = gate(rules, None);
        let judged = g.judge([
            Candidate {
                pid: 1,
                cgroup: cg.clone(),
                name: "sleep".into(),
            },
            Candidate {
                pid: 2,
                cgroup: cg.clone(),
                name: "web".into(),
            },
        ]);
        assert!(matches!(judged.as_slice(), [None, Some(_)]));
        assert!(g.denied(1) && !g.denied(2));
        assert_eq!(rx.try_recv(), Ok(Order::DenyPid(1)));
        g.end_window([]);
        assert!(g.denied(1), "still running: still denied");
        g.end_window([1]);
        assert_eq!(rx.try_recv(), Ok(Order::AllowPid(1)));
        assert!(!g.denied(1));
    }

    #[test]
    fn denied_cgroups_are_allowed_again_once_gone() {
        let live = tempfile::tempdir().expect("tmp");
        let dead = tempfile::tempdir().expect("tmp");
        let (cg, pod) = container(live.path(), "batch");
        let (mut g, rx) = gate(batch(), Some(Metadata::with_test_pods(vec![pod])));
        let denied = |dir: &std::path::Path| DeniedCgroup {
            dir: Some(dir.to_path_buf()),
            cgroup: cg.clone(),
        };
        g.denied_cgroups.insert(41, denied(live.path()));
        g.denied_cgroups.insert(42, denied(dead.path()));
        g.end_window([]);
        assert!(rx.try_recv().is_err(), "both still exist");
        drop(dead);
        g.end_window([]);
        assert_eq!(rx.try_recv(), Ok(Order::AllowCgroup(42)));
        assert!(rx.try_recv().is_err());
        assert_eq!(g.denied_cgroups.len(), 1);
    }

    #[test]
    fn a_process_excluded_by_name_denies_its_pid_not_its_container() {
        let dir = tempfile::tempdir().expect("tmp");
        let (cg, pod) = container(dir.path(), "web");
        let rules = crate::config::Filters {
            exclude_processes: vec!["sleep".into()],
            ..Default::default()
        };
        let (mut g, rx) = gate(rules, Some(Metadata::with_test_pods(vec![pod])));
        let labels = labels_for(&cg, g.metadata());
        assert_eq!(g.filter.verdict("sleep", &labels), Verdict::Exclude);
        let whole = g.filter.workload_verdict(&labels) == Verdict::Exclude;
        g.deny(1234, &cg, whole);
        assert_eq!(rx.try_recv(), Ok(Order::DenyPid(1234)));
        assert!(
            g.denied_cgroups.is_empty(),
            "the container's other processes stay sampled"
        );
    }

    #[test]
    fn a_denied_cgroup_is_allowed_again_when_its_pod_no_longer_matches() {
        let dir = tempfile::tempdir().expect("tmp");
        let (cg, pod) = container(dir.path(), "batch");
        let metadata = Metadata::with_test_pods(vec![pod]);
        let (mut g, rx) = gate(batch(), Some(metadata.clone()));
        let labels = labels_for(&cg, Some(&metadata));
        assert_eq!(g.filter.workload_verdict(&labels), Verdict::Exclude);
        g.deny(1234, &cg, true);
        assert_eq!(rx.try_recv(), Ok(Order::DenyCgroup(77)));
        g.end_window([]);
        assert!(rx.try_recv().is_err(), "still excluded: stays denied");
        // The pod is relabelled: the filter no longer excludes it.
        let (_, relabelled) = container(dir.path(), "web");
        metadata.set_test_pods(vec![relabelled]);
        g.end_window([]);
        assert_eq!(rx.try_recv(), Ok(Order::AllowCgroup(77)));
        assert!(g.denied_cgroups.is_empty());
    }

    #[test]
    fn cgroup_orders_the_control_queue_refused_are_sent_again() {
        let dir = tempfile::tempdir().expect("tmp");
        let (cg, pod) = container(dir.path(), "batch");
        let (mut g, rx) = gate(batch(), Some(Metadata::with_test_pods(vec![pod])));
        // The queue (2 orders) is full: the deny is not remembered, so it is sent again
        // when the cgroup's next samples are judged.
        g.send(Order::DenyPid(1));
        g.send(Order::DenyPid(2));
        g.deny(1234, &cg, true);
        assert!(g.denied_cgroups.is_empty());
        let _ = (rx.try_recv(), rx.try_recv());
        g.deny(1234, &cg, true);
        assert_eq!(rx.try_recv(), Ok(Order::DenyCgroup(77)));
        // The cgroup is gone while the queue is full: the allow waits for room.
        g.send(Order::DenyPid(1));
        g.send(Order::DenyPid(2));
        let path = dir.path().to_path_buf();
        drop(dir);
        assert!(!path.exists());
        g.end_window([]);
        assert!(g.denied_cgroups.is_empty());
        assert_eq!(g.allow_cgroups, vec![77]);
        let _ = (rx.try_recv(), rx.try_recv());
        g.end_window([]);
        assert_eq!(rx.try_recv(), Ok(Order::AllowCgroup(77)));
        assert!(g.allow_cgroups.is_empty());
        let text = g.metrics.encode();
        assert!(
            text.contains("ember_cache_dropped_total{cache=\"control_queue\"} 2"),
            "{text}"
        );
    }

    #[test]
    fn denied_cgroups_are_capped_at_the_bpf_map_entries() {
        let dir = tempfile::tempdir().expect("tmp");
        let (cg, _) = container(dir.path(), "batch");
        let (mut g, rx) = gate(crate::config::Filters::default(), None);
        for id in 0..MAX_CGROUPS as u64 {
            g.denied_cgroups.insert(
                1000 + id,
                DeniedCgroup {
                    dir: Some(dir.path().to_path_buf()),
                    cgroup: cg.clone(),
                },
            );
        }
        g.deny(1234, &cg, true);
        assert_eq!(rx.try_recv(), Ok(Order::DenyPid(1234)), "full: by pid");
        assert_eq!(g.denied_cgroups.len(), MAX_CGROUPS);
    }
}
