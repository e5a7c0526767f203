//! The per-container CPU series: seconds from samples beside seconds from the cgroup, and
//! `ember_container_info` for joins. [`crate::workload`] keeps them up to date.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

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

/// Per-container CPU series: seconds from samples beside seconds from the cgroup itself.
#[derive(Clone, Default)]
pub struct ContainerMetrics {
    /// `ember_container_cpu_seconds_total`: samples / Hz.
    pub sampled: Family<ContainerLabels, Counter<f64, AtomicU64>>,
    /// `ember_container_cgroup_cpu_seconds_total`: the cgroup's own usage counter.
    pub cgroup: Family<ContainerLabels, Counter<f64, AtomicU64>>,
    /// `ember_container_info`: 1 per container, for joins.
    pub info: Family<ContainerInfoLabels, Gauge>,
    /// `ember_container_offcpu_seconds_total{state}`: time its threads were off CPU
    /// (`offcpu.enabled`), summed over threads.
    pub offcpu: Family<ContainerOffCpuLabels, Counter<f64, AtomicU64>>,
}
