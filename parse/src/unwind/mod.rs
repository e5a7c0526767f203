//! The unwind table compiler: an object's call frame information compiled into compact
//! rows the BPF sampler can walk (the agent's `normalize::unwind` loads them), and the
//! sparse reader that reads only what the compiler needs of an object.

pub mod compile;
pub mod elf;
pub mod error;
pub mod row;
pub mod sparse;

pub use compile::{compile, Limits, Stats, UnwindTable, DEFAULT_LIMITS};
pub use error::{ErrorReason, SkipReason, UnsupportedReason, UnwindError};
pub use row::{CfaRule, RbpRule, Rule, UnwindPage, UnwindRow};

/// Identity of a table: the first 16 bytes of the SHA-256 of what it was compiled from.
pub type TableKey = [u8; 16];

#[cfg(test)]
mod tests;
