//! ember: an always-on eBPF continuous profiler.
//!
//! The folders are the data flow. Samples go left to right, each stage on its own
//! thread, owning its state, passing owned batches to the next over bounded channels:
//!
//! ```text
//!  capture ──▶ aggregate ──────────────▶ symbolize ──▶ encode ──▶ export
//!  (BPF →      (per window; counts      (ELF/DWARF,   (pprof,     (window files,
//!   samples)    only: asks process)       kallsyms)     flame       Pyroscope,
//!   │  ▲         │ touches,    ▲                        graphs)     OTLP profiles)
//!   │  │         ▼ windows     │ names, exits
//!   │  │        process registry (process::registry, ember-process: the process table,
//!   │  │         ▲ snapshots    objects, JIT frames, Python names; reads /proc)
//!   │  │ tables, │              workload (cgroup → container, pod, filters,
//!   │  │ ranges  │              per-container CPU; judged in aggregate)
//!   │  └────────── unwind loader (process::unwind: reads /proc, builds tables,
//!   │ asks          ▲  ▲          fills the sampler's maps through capture::unwind)
//!   └───────────────┘  │ exec, mmap, fork, exit
//!                      tasks (capture::tasks: the kernel's task records)
//!
//!  readings (USE, perf counters, run-queue latency) ──▶ snapshot ──▶ /metrics, OTLP metrics
//!  server (/metrics, /healthz, windows, flame graphs)
//!  agent: the one place that starts and stops every thread, in order (ember-capture,
//!         ember-process, ember-aggregate, ember-output, ember-unwind, ember-tasks, ...)
//! ```
//!
//! What the stages hand each other (samples, windows of stacks, symbolized frames, labels)
//! is declared once, in [`model`].
//!
//! Leaves that import no stage: [`model`], [`config`], [`metrics`], [`os`], `tls`. A module
//! imports only modules before it in this order, and no two rooms import each other
//! (checked by `tests/modgraph.py` in `make test`): leaves, workload, capture, process,
//! aggregate, symbolize, encode, export, readings, server, agent.
//!
//! Each network sink keeps its code in one folder, `export/<sink>/`: encoding, transport
//! and error classes. Its settings are plain types in [`config`] (which imports no stage);
//! the sink converts them.
//!
//! The parsers of bytes a container can write (perf maps, jitdump, perf task records, call
//! frame information, ELF objects and their symbol tables, mountinfo) are the workspace
//! crate `ember-parse` (`parse/`): pure, tested and fuzzed without BPF or Kubernetes; the
//! stages re-export them where they use them (`process::elf_file`, `os::mountinfo`, ...).

pub mod agent;
pub mod aggregate;
pub mod capture;
pub mod cli;
pub mod config;
pub mod encode;
pub(crate) mod export;
pub mod metrics;
pub mod model;
pub(crate) mod os;
pub mod process;
pub use os::one_malloc_arena;
/// The processes `ember record` runs and follows.
pub use os::watch;
pub mod readings;
pub(crate) mod server;
pub mod symbolize;
pub(crate) mod tls;
pub mod workload;

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
