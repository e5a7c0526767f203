//! The unwind table compiler (`agent/src/normalize/unwind`) without its skeleton checks
//! (`abi.rs` needs the BPF build): the files it is made of, under the same names, so
//! their `super::` paths resolve as they do in the agent.

#[path = "../../../agent/src/normalize/unwind/compile.rs"]
pub mod compile;
#[path = "../../../agent/src/normalize/unwind/elf.rs"]
pub mod elf;
#[path = "../../../agent/src/normalize/unwind/error.rs"]
pub mod error;
#[path = "../../../agent/src/normalize/unwind/row.rs"]
pub mod row;

pub use compile::{compile, Limits, UnwindTable, DEFAULT_LIMITS};
pub use row::{CfaRule, UnwindRow};
