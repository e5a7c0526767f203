//! Unwind tables in the sampler: each mapped object's table, compiled by
//! [`ember_parse::unwind`] (its row layout, rules and caps are documented there), loaded
//! into the BPF maps the sampler walks ([`Loader`]), kept on disk between restarts
//! (`store`), and its rows checked against the skeleton's types at compile time (`abi`).
//!
//! The compiler reads only bytes ember read itself (never a path: the object may come from a
//! container's root); a hostile object costs a counted error, never a panic, a hang or a
//! huge allocation.
//!
//! **Loading** ([`Loader`], on its own thread): `loader.rs` composes the decisions, each in
//! a file of its own and tested against an in-memory fake of the sampler's maps (`fake.rs`,
//! `loader_tests.rs`): `files.rs` (file identity), `procs.rs` (processes and the inodes
//! they map), `slots.rs` (slots and generations of table ids), `budget.rs` (the byte
//! budget and its LRU); `follow.rs` is the thread's loop over task records and asks. The map
//! writes themselves are [`crate::capture::unwind`]'s.

mod abi;
mod budget;
mod files;
mod follow;
mod interp;
mod loader;
mod procs;
mod slots;
mod store;

// The compiler and its sparse reader: pure over bytes, in ember-parse (fuzzed there).
pub use ember_parse::unwind::{compile, elf, error, row, sparse};
pub use ember_parse::unwind::{CfaRule, RbpRule, Rule, UnwindPage, UnwindRow};
pub use ember_parse::unwind::{ErrorReason, SkipReason, UnsupportedReason, UnwindError};
pub use ember_parse::unwind::{Limits, Stats, UnwindTable, DEFAULT_LIMITS};
pub use loader::{Loader, Settings};

#[cfg(test)]
mod fake;
#[cfg(test)]
mod loader_tests;
