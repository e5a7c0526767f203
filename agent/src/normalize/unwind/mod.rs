//! Unwind tables in the sampler: each mapped object's table, compiled by
//! [`ember_parse::unwind`] (its row layout, rules and caps are documented there), loaded
//! into the BPF maps the sampler walks ([`Loader`]), kept on disk between restarts
//! (`store`), and its rows checked against the skeleton's types at compile time (`abi`).
//!
//! The compiler reads only bytes ember read itself (never a path: the object may come from a
//! container's root); a hostile object costs a counted error, never a panic, a hang or a
//! huge allocation.

mod abi;
mod loader;
mod store;

// The compiler and its sparse reader: pure over bytes, in ember-parse (fuzzed there).
pub use ember_parse::unwind::{compile, elf, error, row, sparse};
pub use ember_parse::unwind::{CfaRule, RbpRule, Rule, UnwindPage, UnwindRow};
pub use ember_parse::unwind::{ErrorReason, SkipReason, UnsupportedReason, UnwindError};
pub use ember_parse::unwind::{Limits, Stats, UnwindTable, DEFAULT_LIMITS};
pub use loader::{Loader, Settings};
