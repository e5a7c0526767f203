//! The unwind table compiler (`agent/src/normalize/unwind`) without its skeleton checks
//! (`abi.rs` needs the BPF build), and its sparse object reader: the files they are made
//! of, under the same names, so their `super::` paths resolve as they do in the agent.

#[path = "../../../agent/src/normalize/unwind/compile.rs"]
pub mod compile;
#[path = "../../../agent/src/normalize/unwind/elf.rs"]
pub mod elf;
#[path = "../../../agent/src/normalize/unwind/error.rs"]
pub mod error;
#[path = "../../../agent/src/normalize/unwind/row.rs"]
pub mod row;
#[path = "../../../agent/src/normalize/unwind/sparse.rs"]
pub mod sparse;

/// The one name the sparse reader takes from the table store.
pub mod store {
    /// Identity of a table: the first 16 bytes of a SHA-256.
    pub type TableKey = [u8; 16];
}

pub use compile::{compile, Limits, UnwindTable, DEFAULT_LIMITS};
pub use row::{CfaRule, UnwindRow};
