//! The unwind table compiler: an object's call frame information compiled into compact
//! rows the BPF sampler can walk (the agent's `normalize::unwind` loads them), so stacks
//! through code built without frame pointers (Debian's libc, python3, most `-O2` C and C++)
//! reach `main`.
//!
//! **In:** the bytes of one x86-64 ELF executable or shared object, which ember read
//! itself (never a path: the object may come from a container's root, and a hostile one
//! must cost a counted error, never a panic, a hang or a huge allocation), whole or as the
//! [`sparse`] reader took them (headers and call frame sections only).
//! **Out:** an [`UnwindTable`] — rows sorted by address, cut into 4 KiB pages — built
//! from `.eh_frame`, and from `.debug_frame` where `.eh_frame` has no FDE. Addresses are
//! the object's own virtual addresses; the sampler subtracts the mapping's bias first, so
//! one table serves every process that maps the object, wherever it is mapped.
//!
//! **Row layout** (`struct ember_unwind_row` in `agent/bpf/ember.h`, mirrored by
//! [`UnwindRow`] and checked against the skeleton at compile time by the agent's
//! `normalize/unwind/abi.rs`): 8 bytes,
//! `{u16 pc_low, u8 cfa_rule, u8 rbp_rule, u16 cfa_offset, i16 rbp_offset}`.
//! - Unwinding x86-64 needs only three things per address: where the caller's frame
//!   (the CFA) is, where the caller's rbp is, and where the return address is — always
//!   CFA - 8 in code the sampler can follow. Other registers' rules are dropped.
//! - The high bits of an address live once per 4 KiB page ([`UnwindPage`]: first row,
//!   row count), so a row keeps 12 bits of it; every page starts with a row at offset 0
//!   and holds at most 4,096 rows, so the sampler's binary search always ends on a row
//!   in at most 13 steps. The page index costs 8 bytes per 4 KiB of code. Small pages
//!   because a sample pays for each cold page of memory it reads: a page's rows then sit
//!   in one 4 KiB chunk of the BPF table, where 64 KiB pages spread them over several.
//! - Offsets fit 16 bits in practice (the rare frame larger than 64 KiB becomes an
//!   unsupported row, counted); 8-byte rows keep the table at half the size of 16-byte
//!   `{u64 pc, ...}` ones and need no alignment padding in an array map.
//! - A row repeating the rule before it is dropped: a rule holds until the next row.
//!   The alignment padding between two functions gets no row of its own (it is never
//!   executed), which lets the next function's first row go too when it repeats the
//!   previous one's last: 18 % fewer rows for libc.
//! - Besides rsp/rbp + offset, rows carry the cases an x86-64 walk meets: PLT stubs
//!   (the linker's CFA expression), gcc's realigned frames (CFA = *(rbp - 8)), signal
//!   trampolines (the registers are in the `rt_sigframe`), the outermost frame (the
//!   entry point's FDE, or CFI that marks the return address undefined: stop cleanly),
//!   code no FDE covers (use the frame pointer), and what cannot be expressed (stop,
//!   counted by reason).
//!
//! Bounds: [`Limits`] caps the object's size, the rows, the CIE/FDE entries, the pages,
//! each CIE's length and the total CFA program interpreted; gimli bounds each row's
//! register rules (192) and `DW_CFA_remember_state` depth (4) itself.

pub mod compile;
pub mod elf;
pub mod error;
pub mod row;
mod rules;
pub mod sparse;

pub use compile::{compile, Limits, Stats, UnwindTable, DEFAULT_LIMITS};
pub use error::{ErrorReason, SkipReason, UnsupportedReason, UnwindError};
pub use row::{CfaRule, RbpRule, Rule, UnwindPage, UnwindRow};

/// Identity of a table: the first 16 bytes of the SHA-256 of what it was compiled from.
pub type TableKey = [u8; 16];

#[cfg(test)]
mod tests;
