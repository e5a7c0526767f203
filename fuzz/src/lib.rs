//! ember's JIT symbol parsers, its unwind table compiler and its perf task record parser,
//! compiled here straight from the agent's sources: they are pure functions over bytes, so the fuzz build needs none
//! of the agent's dependencies (BPF, Kubernetes, ...) beyond their own: gimli, object
//! and thiserror for the compiler.

#[path = "../../agent/src/normalize/jit/names.rs"]
pub mod names;

#[path = "../../agent/src/normalize/jit/perfmap.rs"]
pub mod perfmap;

#[path = "../../agent/src/normalize/jit/jitdump.rs"]
pub mod jitdump;

#[path = "../../agent/src/capture/perf_record.rs"]
pub mod perf_record;

pub mod unwind;
