//! ember's end-to-end tests, one binary: each suite is a module, so that the agent's test
//! helpers (`ember_tests`, with [`ember_tests::EmberRun`] to start and scrape an agent) link
//! once, and a test is named `suite::test`. `cargo test --release --workspace --test e2e --
//! record::` runs one suite (`--workspace` keeps the features of `make build`: with
//! `-p ember-tests` cargo would build ember a second time).
//!
//! Tests that sample hold [`ember_tests::sampling_lock`]: the suites share one process now, so
//! the lock also keeps one suite's measurements away from another suite's load.

mod churn;
mod cli;
mod containers;
mod counters;
mod debuginfod;
mod dwarf;
mod explorer;
mod faults;
mod features;
mod http_limits;
mod jit;
mod k8s_node;
mod kernels;
mod kubernetes;
mod offcpu;
mod python;
mod python_hostile;
mod record;
mod report;
mod resources;
mod run;
mod sinks;
mod stacks;
mod symbols;
mod top;
mod unwind_faults;
mod wakers;
