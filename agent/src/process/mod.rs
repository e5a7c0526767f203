//! Normalization: turns the absolute addresses of a sample into stable ones while the
//! process still exists.
//!
//! In: pids and user addresses from [`crate::capture`]. Out: [`process::UserAddr`]s — an
//! object file and a file offset, a named region (`[vdso]`, `[anon]`), or a named JIT frame —
//! plus each process's name and cgroup, kept by the [`process::ProcessTable`] that the
//! aggregation stage owns. [`object`] is the one safe way any stage opens and reads a file
//! out of a process, [`fs`] what keeps it off FUSE and network file systems; [`elf_file`] its
//! capped ELF reading. [`snapshot`] is the one reader of a process from `/proc`, for the
//! unwind loader and the process table alike.

pub use ember_parse::elf_file;
pub mod fs;
pub(crate) mod jit;
pub mod object;
pub(crate) mod table;
pub mod python;
pub mod snapshot;
pub mod unwind;
