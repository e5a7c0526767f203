//! Unwind tables: an object's call frame information compiled into compact rows the BPF
//! sampler can walk, so stacks through code built without frame pointers (Debian's libc,
//! python3, most `-O2` C and C++) reach `main`.
//!
//! **In:** the bytes of one x86-64 ELF executable or shared object, which ember read
//! itself (never a path: the object may come from a container's root, and a hostile one
//! must cost a counted error, never a panic, a hang or a huge allocation).
//! **Out:** an [`UnwindTable`] — rows sorted by address, cut into 64 KiB pages — built
//! from `.eh_frame`, and from `.debug_frame` where `.eh_frame` has no FDE. Addresses are
//! the object's own virtual addresses; the sampler subtracts the mapping's bias first, so
//! one table serves every process that maps the object, wherever it is mapped.
//!
//! **Row layout** (`struct ember_unwind_row` in `agent/bpf/ember.h`, mirrored by
//! [`UnwindRow`] and checked against the skeleton at compile time): 8 bytes,
//! `{u16 pc_low, u8 cfa_rule, u8 rbp_rule, u16 cfa_offset, i16 rbp_offset}`.
//! - Unwinding x86-64 needs only three things per address: where the caller's frame
//!   (the CFA) is, where the caller's rbp is, and where the return address is — always
//!   CFA - 8 in code the sampler can follow. Other registers' rules are dropped.
//! - The high bits of an address live once per 64 KiB page ([`UnwindPage`]: first row,
//!   row count), so a row keeps 16 bits of it; every page starts with a row at offset 0
//!   and holds at most 65,536 rows, so the sampler's binary search always ends on a row
//!   in at most 17 steps. The page index costs 8 bytes per 64 KiB of code.
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
//!
//! **Loading** ([`Loader`], on its own thread): `loader.rs` composes the decisions, each in
//! a file of its own and tested against an in-memory fake of the sampler's maps (`fake.rs`,
//! `loader_tests.rs`): `files.rs` (file identity), `procs.rs` (processes and the inodes
//! they map), `slots.rs` (slots and generations of table ids), `budget.rs` (the byte
//! budget and its LRU); `follow.rs` is the thread's loop over task records and asks. The map
//! writes themselves are [`crate::capture::unwind`]'s.

mod abi;
mod budget;
mod compile;
mod elf;
mod error;
mod files;
mod follow;
mod loader;
mod procs;
pub mod row;
mod slots;
mod sparse;
mod store;

pub use compile::{compile, Limits, Stats, UnwindTable, DEFAULT_LIMITS};
pub use error::{ErrorReason, SkipReason, UnsupportedReason, UnwindError};
pub use loader::{Loader, Settings};
pub use row::{CfaRule, RbpRule, Rule, UnwindPage, UnwindRow};

#[cfg(test)]
mod fake;
#[cfg(test)]
mod loader_tests;
#[cfg(test)]
mod tests;
