//! The per-container CPU series: seconds from samples beside seconds from the cgroup, and
//! `ember_container_info` for joins. [`crate::workload`] keeps them up to date.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::table::metric_table;

/// Label set of the per-container CPU series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerLabels {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// Container id, so that containers without API metadata stay apart.
    pub container_id: String,
}

/// Label set of `ember_container_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerInfoLabels {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// Container id.
    pub container_id: String,
    /// Pod uid.
    pub pod_uid: String,
    /// Node name.
    pub node: String,
}

/// Label set of `ember_container_offcpu_seconds_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerOffCpuLabels {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// Container id.
    pub container_id: String,
    /// Why its threads were off CPU.
    pub state: super::OffState,
}

metric_table! {
    /// Per-container CPU series: seconds from samples beside seconds from the cgroup itself.
    #[derive(Clone)]
    pub struct ContainerMetrics {
        /// CPU time of each container estimated from samples (samples / frequency).
        pub sampled: Family<ContainerLabels, Counter<f64, AtomicU64>> = metric(
            "container_cpu",
            unit Seconds,
            labels ["namespace", "pod", "container", "container_id"]
        ),
        /// CPU time of each container as its cgroup counts it (cpuacct.usage or cpu.stat
        /// usage_usec).
        pub cgroup: Family<ContainerLabels, Counter<f64, AtomicU64>> = metric(
            "container_cgroup_cpu",
            unit Seconds,
            labels ["namespace", "pod", "container", "container_id"]
        ),
        /// Time the threads of each container were off CPU, by why (sleep, disk, runnable;
        /// offcpu.enabled).
        pub offcpu: Family<ContainerOffCpuLabels, Counter<f64, AtomicU64>> = metric(
            "container_offcpu",
            unit Seconds,
            labels ["namespace", "pod", "container", "container_id", "state"]
        ),
        /// Container identity and placement, for joins (always 1).
        pub info: Family<ContainerInfoLabels, Gauge> = metric(
            "container_info",
            labels ["namespace", "pod", "container", "container_id", "pod_uid", "node"]
        ),
    }
}
