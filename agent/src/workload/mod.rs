//! Which workload each process belongs to — container, pod, cgroup — and what follows from
//! it: the labels samples carry, the include/exclude filters, per-container CPU series, and
//! the inventory of container cgroups the readings read.
//!
//! - [`cgroup`]: `/proc/PID/cgroup`, read once per process into a [`Cgroup`] (container, pod,
//!   unit, CPU usage file, v2 id);
//! - [`walk`]: the one bounded walker of the cgroup hierarchies, one [`walk::Inventory`] of
//!   container directories per readings interval;
//! - [`kube`]: the pod watch ([`kube::Metadata`]: pods by container id and uid);
//! - [`labels`]: cgroup + pod → [`Labels`](crate::model::Labels), and the readings' container labels;
//! - [`filter`]: process name + labels → [`Verdict`];
//! - [`gate`]: the verdicts on a window's processes, the BPF deny and allow orders they
//!   lead to, and their retries (the aggregator asks it at each window's close);
//! - [`accounting`]: per-window samples → per-container CPU and off-CPU series.
//!
//! A process's cgroup is read once, when the process table first sees it. Kubernetes
//! metadata is looked up at every window close instead, because a pod often reaches the
//! watcher's store a moment after its first process has already been sampled.

pub(crate) mod accounting;
pub(crate) mod cgroup;
pub(crate) mod filter;
pub(crate) mod gate;
pub(crate) mod kube;
pub(crate) mod labels;
pub mod walk;

pub use accounting::{Accounting, FORGET_AFTER_WINDOWS};
pub use cgroup::Cgroup;
pub use filter::{Filter, Verdict};
pub use labels::labels_for;

/// A container in a pod and helpers to label it, shared by the tests of the modules above.
#[cfg(test)]
mod fixtures {
    use super::Cgroup;
    use crate::model::Labels;
    use std::path::Path;

    pub const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    pub fn cg_in_pod() -> Cgroup {
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_0000_1111_2222_333344445555.slice/cri-containerd-{ID}.scope\n"
        );
        Cgroup::from_text(&text, Path::new("/nonexistent"))
    }

    pub fn pod_labels(ns: &str, container: &str, app: &str) -> Labels {
        let mut l = Labels::new(&cg_in_pod(), None);
        l.namespace = ns.into();
        l.pod = "web-1".into();
        l.container = container.into();
        l.pod_labels.insert("app".into(), app.into());
        l
    }
}
