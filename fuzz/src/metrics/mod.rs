//! ember's metric label enums (`agent/src/metrics/reasons.rs`): the JIT parsers report
//! their rejects as `JitReject`, found at `crate::metrics` as in the agent.

#[path = "../../../agent/src/metrics/reasons.rs"]
mod reasons;

pub use reasons::*;
