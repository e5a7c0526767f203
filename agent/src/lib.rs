//! ember: an always-on eBPF continuous profiler.
//!
//! Samples flow through one stage per module, each owning its state and
//! passing owned batches to the next over bounded channels:
//!
//! `capture` (BPF → [`capture::Sample`]) → `aggregate` (per window, with the
//! `process` table that normalizes addresses while processes live) →
//! `symbolize` → `pprof` (encode) → `sink` (window files) — wired by `pipeline`.

pub mod aggregate;
pub mod capture;
pub mod cgroup;
pub mod config;
pub mod container_cgroups;
pub mod flamegraph;
pub mod jit;
pub mod jitdump;
pub mod jvm;
pub mod kallsyms;
pub mod kube;
pub mod metrics;
pub mod otlp_metrics;
pub mod perfmap;
pub mod pipeline;
pub mod pmc;
pub mod pprof;
pub mod privileges;
pub mod process;
pub mod procfs;
pub mod readings;
pub mod resources;
pub mod runqlat;
pub mod server;
pub mod sink;
pub mod symbolize;
pub mod workload;

#[cfg(test)]
mod golden;

/// The pprof protobuf types, generated from `proto/profile.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

/// The Pyroscope push API types, generated from `proto/push.proto`.
#[allow(missing_docs, clippy::all)]
pub mod push_proto {
    include!(concat!(env!("OUT_DIR"), "/push.v1.rs"));
}
