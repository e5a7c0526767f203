//! Python frames: which processes run a CPython the sampler can walk (`attach`, on the
//! unwind loader's thread, which writes the sampler's `py_procs` entry), and the names of
//! the frames it recorded, read from the process's memory while it lives (`names`, on the
//! aggregation thread, beside the process table). The pure parsing of what both read
//! (ELF symbols, layouts per version, code objects, strings, line tables) is
//! [`ember_parse::python`]'s; here are the reads, the caches and their counts.

use std::sync::Arc;

/// An interpreter frame, named (or not) while its process lived.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PyFrame {
    /// The code object's address in the process (a per-process value).
    pub code: u64,
    /// Qualified function name (`Class.method`), or `None` when the code object could not
    /// be read or was not the one the walker saw.
    pub name: Option<Arc<str>>,
    /// Source file as the code object names it.
    pub file: Option<Arc<str>>,
    /// The function's first line.
    pub first_line: u32,
    /// The line of the sampled instruction (0: unknown).
    pub line: u32,
}

impl PyFrame {
    /// A frame that could not be named: only its code address is known.
    pub fn unnamed(code: u64) -> PyFrame {
        PyFrame {
            code,
            name: None,
            file: None,
            first_line: 0,
            line: 0,
        }
    }
}

pub mod attach;
pub mod memory;
pub mod names;
