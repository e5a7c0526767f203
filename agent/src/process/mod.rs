//! The process room: what ember knows of each process, and the one thread that owns it.
//!
//! In: pids, threads and user addresses from [`crate::capture`] (through the aggregator's
//! asks), and the kernel's task records and the sampler's asks (through the unwind
//! loader). Out: [`table::UserAddr`]s — an object file and a file offset, a named region
//! (`[vdso]`, `[anon]`), a named JIT frame or Python frame — plus each process's name,
//! cgroup and runtime, and exit events ([`registry::Exit`]).
//! [`registry`] owns the [`table::ProcessTable`] and is served by one thread, the unwind
//! loader's ([`unwind`]), which also owns the sampler's ranges and Python attach state: every
//! `/proc` read, process-memory read, exit and PID reuse decision runs there, once, never on
//! the counting thread. [`object`] is the one safe way any stage opens and reads a file out
//! of a process, [`fs`] what keeps it off FUSE and network file systems; [`elf_file`] its
//! capped ELF reading. [`snapshot`] is the one reader of a process from `/proc`, for the
//! unwind loader and the process table alike. [`unwind`] builds the sampler's unwind tables
//! (a table may take a while to compile) and hands each process it reads to the table.

pub use ember_parse::elf_file;
pub mod fs;
pub(crate) mod jit;
pub mod object;
pub mod python;
pub mod registry;
pub mod snapshot;
pub(crate) mod table;
pub mod unwind;
