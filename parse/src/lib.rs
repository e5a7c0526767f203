//! ember's parsers of hostile bytes: everything a container can write that the agent reads,
//! as pure functions over bytes (the agent opens the files, confines the reads and counts
//! what these return). They need none of the agent's dependencies (BPF, Kubernetes,
//! metrics), so they build, test and fuzz (`fuzz/`) on their own.
//!
//! - [`jit`]: perf maps (`/tmp/perf-PID.map`) and jitdump files, their names interned.
//! - [`perf_record`]: perf task records (`fork`, `exit`, `mmap2`) and the ring's framing.
//! - [`unwind`]: an object's call frame information compiled into the sampler's rows.
//! - [`elf_file`]: the capped ELF reader (headers, notes, symbol and string tables).
//! - [`dwarf`]: inline chains and source lines of addresses, from an object's DWARF.
//! - [`libc`]: where musl keeps a thread's pthread keys.
//! - [`symbols`]: symbol tables with packed names, and demangling.
//! - [`python`]: CPython versions, layouts, line tables, strings and code objects.
//! - [`mountinfo`]: `/proc/PID/mountinfo` and file system kinds.

pub mod dwarf;
pub mod elf_file;
pub mod jit;
pub mod libc;
pub mod mountinfo;
pub mod perf_record;
pub mod python;
pub mod symbols;
pub mod unwind;

// Hostile objects for tests and fuzz targets.
#[cfg(any(test, feature = "testing"))]
pub mod elf_builder;
