//! ember's JIT symbol parsers and its unwind table compiler, compiled here straight from
//! the agent's sources: they are pure functions over bytes, so the fuzz build needs none
//! of the agent's dependencies (BPF, Kubernetes, ...) beyond their own: gimli, object
//! and thiserror for the compiler.

#[path = "../../agent/src/normalize/jit/perfmap.rs"]
pub mod perfmap;

#[path = "../../agent/src/normalize/jit/jitdump.rs"]
pub mod jitdump;

pub mod unwind;
