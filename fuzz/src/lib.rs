//! ember's JIT symbol parsers, compiled here straight from the agent's sources: they are
//! pure functions over bytes with no dependencies, so the fuzz build needs none of the
//! agent's (BPF, Kubernetes, ...).

#[path = "../../agent/src/normalize/jit/perfmap.rs"]
pub mod perfmap;

#[path = "../../agent/src/normalize/jit/jitdump.rs"]
pub mod jitdump;
