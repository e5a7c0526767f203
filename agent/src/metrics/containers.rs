//! The per-container series of sampled workloads: CPU and off-CPU seconds from samples, and
//! `ember_container_info` for joins. [`crate::workload`] keeps them up to date. The cgroup's
//! own CPU counter of every container is a reading (`ember_container_cpu_usage_seconds_total`,
//! [`crate::readings`]) under the same labels.

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
    pub state: crate::model::OffState,
}

metric_table! {
    /// Per-container series of the sampled workloads: CPU and off-CPU seconds from samples,
    /// and the info series.
    #[derive(Clone)]
    pub struct ContainerMetrics {
        /// CPU time of each container estimated from samples (samples / frequency).
        pub sampled: Family<ContainerLabels, Counter<f64, AtomicU64>> = metric(
            "container_cpu",
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
        /// Time the threads of each container waited for locks: futex waits and kernel lock
        /// contention (offcpu.locks).
        pub lock_wait: Family<ContainerLabels, Counter<f64, AtomicU64>> = metric(
            "container_lock_wait",
            unit Seconds,
            labels ["namespace", "pod", "container", "container_id"]
        ),
        /// Container identity and placement, for joins (always 1).
        pub info: Family<ContainerInfoLabels, Gauge> = metric(
            "container_info",
            labels ["namespace", "pod", "container", "container_id", "pod_uid", "node"]
        ),
    }
}
