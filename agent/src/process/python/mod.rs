//! Python frames: which processes run a CPython the sampler can walk (`attach`, which
//! writes the sampler's `py_procs` entry), and the names of the frames it recorded, read
//! from the process's memory while it lives (`names`, kept by the process table). Both run
//! on the process registry's thread (the unwind loader's), and both are freed by the
//! registry's exit events ([`crate::process::registry::Exit`]) alone. The pure parsing of what both read
//! (ELF symbols, layouts per version, code objects, strings, line tables) is
//! [`ember_parse::python`]'s; here are the reads, the caches and their counts.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use ember_parse::python::layout::Layout;
use ember_parse::python::Version;

use crate::metrics::Metrics;
use attach::Attacher;

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
pub mod check;
pub mod members;
pub mod memory;
pub mod names;

/// What the names side needs of a process whose interpreter is attached.
#[derive(Debug)]
pub struct PyProcess {
    /// The interpreter's version.
    pub version: Version,
    /// Where its objects keep what is read.
    pub layout: Layout,
    /// `PyCode_Type`, `PyUnicode_Type` and `PyBytes_Type` in the process.
    pub code_type: u64,
    /// See `code_type`.
    pub unicode_type: u64,
    /// See `code_type`.
    pub bytes_type: u64,
}

/// The unwind loader's Python state: who is attached, who waits for their runtime.
pub struct Interp {
    pub(crate) attacher: Attacher,
    /// Processes to look at again: when, and how many looks so far.
    pub(crate) pending: HashMap<u32, (Instant, u32)>,
    /// Processes with a `py_procs` entry, with their start time: an exit event of another
    /// process on the pid leaves the entry alone.
    pub(crate) attached: HashMap<u32, u64>,
    pub(crate) metrics: Metrics,
}

impl Interp {
    /// Python frames walked (`interpreters.python.enabled`), counting in `metrics`.
    pub fn new(metrics: Metrics) -> Self {
        Self {
            attacher: Attacher::new(metrics.clone()),
            pending: HashMap::new(),
            attached: HashMap::new(),
            metrics,
        }
    }

    /// The earliest time a pending process is due.
    pub fn next_retry(&self) -> Option<Instant> {
        self.pending.values().map(|&(at, _)| at).min()
    }

    /// Pending processes due at `now`.
    pub fn due(&self, now: Instant) -> Vec<u32> {
        self.pending
            .iter()
            .filter(|(_, &(at, _))| at <= now)
            .map(|(&pid, _)| pid)
            .collect()
    }
}
