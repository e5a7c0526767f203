//! ember's JIT symbol parsers, its unwind table compiler, its perf task record parser, its
//! object reader, symbol-table builder and demangling, its mountinfo parser,
//! compiled here straight from the agent's sources: they are pure functions over bytes, so the fuzz build needs none
//! of the agent's dependencies (BPF, Kubernetes, ...) beyond their own: gimli, object
//! and thiserror for the compiler.

#[path = "../../agent/src/normalize/jit/names.rs"]
pub mod names;

#[path = "../../agent/src/normalize/jit/perfmap.rs"]
pub mod perfmap;

#[path = "../../agent/src/normalize/jit/jitdump.rs"]
pub mod jitdump;

#[path = "../../agent/src/capture/perf_record.rs"]
pub mod perf_record;

#[path = "../../agent/src/os/mountinfo.rs"]
pub mod mountinfo;

pub mod unwind;

pub mod elf_builder;

// The agent's object reader and symbol-table builder, by file. Their `#[path]` is given
// here, at the crate root: inside an inline `mod normalize { .. }` it would be resolved from
// `src/normalize/`, a directory that does not exist, so the open of `../..` fails.
#[path = "../../agent/src/normalize/elf_file.rs"]
pub mod elf_file;

#[path = "../../agent/src/symbolize/table.rs"]
pub mod table;

#[path = "../../agent/src/symbolize/packed.rs"]
pub mod packed;

#[path = "../../agent/src/symbolize/demangle.rs"]
pub mod demangle;

/// The safe object reader, at the path the symbol table imports it from.
pub mod normalize {
    pub use crate::elf_file;
}

/// The symbol-table builder, its packed names and the demangling.
pub mod symbolize {
    pub use crate::demangle;
    pub use crate::packed;
    pub use crate::table;
}
