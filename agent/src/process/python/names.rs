//! Names of Python frames, read from the process's memory by the process registry's thread
//! at window close (while the process lives): each code object once, checked against the
//! type and first line the walker saw, kept in a cache bounded in bytes and keyed by
//! (pid, start time, code address, first line), so a freed and reused address never names
//! another function and an exited process's entries go with it.

use std::collections::HashMap;
use std::sync::Arc;

use ember_parse::python::code::{read_code, Code, CodeError, MemError, Memory, Types};

use super::attach::PyProcess;
use super::memory::ProcMem;
use super::PyFrame;
use crate::metrics::{Cache, Metrics, PyCodeRead};
use crate::model::{PyFrameRef, Runtime};

/// Bytes charged per entry beyond its strings and table (key, map slot, Arc headers).
const ENTRY_OVERHEAD: usize = 96;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    pid: u32,
    start_time: u64,
    code: u64,
    fingerprint: u32,
}

/// A named code object, as frames use it.
struct Named {
    name: Arc<str>,
    file: Arc<str>,
    code: Code,
    bytes: usize,
    last_used: u64,
}

/// The attached processes and the named code objects of their frames.
pub struct PyNames {
    procs: HashMap<u32, (u64, Arc<PyProcess>)>,
    cache: HashMap<Key, Named>,
    bytes: usize,
    cap: usize,
    tick: u64,
    metrics: Metrics,
}

/// [`Memory`] over `process_vm_readv`, its errors as the parser's.
struct Mem(ProcMem);

impl Memory for Mem {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.0.read(addr, buf).map_err(|e| match e.raw_os_error() {
            Some(libc::ESRCH) => MemError::Gone,
            Some(libc::EPERM) | Some(libc::EACCES) => MemError::Denied,
            Some(libc::EFAULT) | None => MemError::Unmapped {
                addr,
                len: buf.len(),
            },
            Some(errno) => MemError::Other(errno),
        })
    }
}

impl PyNames {
    /// Names kept within `cap` bytes, counting in `metrics`.
    pub fn new(cap: u64, metrics: Metrics) -> Self {
        Self {
            procs: HashMap::new(),
            cache: HashMap::new(),
            bytes: 0,
            cap: usize::try_from(cap).unwrap_or(usize::MAX),
            tick: 0,
            metrics,
        }
    }

    /// `pid` (started at `start_time`) runs the interpreter `process`. A process gone or
    /// replaced on its pid is [`PyNames::forget`]ed by the registry's exit events first.
    pub fn attach(&mut self, pid: u32, start_time: u64, process: Arc<PyProcess>) {
        self.procs.insert(pid, (start_time, process));
    }

    /// The interpreter `pid` runs, if attached.
    pub fn runtime(&self, pid: u32) -> Option<Runtime> {
        self.procs.get(&pid).map(|(_, p)| Runtime {
            name: "python",
            version: Arc::from(p.version.to_string()),
        })
    }

    /// Forgets `pid` and its names (it exited, or its pid names another process now).
    pub fn forget(&mut self, pid: u32) {
        if self.procs.remove(&pid).is_none() {
            return;
        }
        let mut freed = 0;
        self.cache.retain(|k, v| {
            let keep = k.pid != pid;
            if !keep {
                freed += v.bytes;
            }
            keep
        });
        self.bytes -= freed;
        self.report();
    }

    /// The frame `f` of `pid`, named if its code object can be read.
    pub fn frame(&mut self, pid: u32, f: &PyFrameRef) -> PyFrame {
        let Some((start_time, process)) = self.procs.get(&pid).cloned() else {
            self.metrics.python_code_read(PyCodeRead::NoProcess, 1);
            return PyFrame::unnamed(f.code);
        };
        let key = Key {
            pid,
            start_time,
            code: f.code,
            fingerprint: f.fingerprint,
        };
        self.tick += 1;
        let tick = self.tick;
        if let Some(n) = self.cache.get_mut(&key) {
            n.last_used = tick;
            self.metrics.python_code_read(PyCodeRead::Hit, 1);
            return frame_of(n, f, &process);
        }
        let types = Types {
            code: process.code_type,
            unicode: process.unicode_type,
            bytes: process.bytes_type,
        };
        let mut mem = Mem(ProcMem::new(pid));
        let code = match read_code(
            &mut mem,
            &process.layout,
            process.version,
            &types,
            f.code,
            f.fingerprint,
        ) {
            Ok(c) => c,
            Err(e) => {
                self.metrics.python_code_read(read_result(&e), 1);
                return PyFrame::unnamed(f.code);
            }
        };
        self.metrics.python_code_read(PyCodeRead::Read, 1);
        let named = Named {
            name: Arc::from(code.qualname.as_str()),
            file: Arc::from(code.filename.as_str()),
            bytes: code.bytes() + ENTRY_OVERHEAD,
            code,
            last_used: tick,
        };
        let out = frame_of(&named, f, &process);
        self.make_room(named.bytes);
        if named.bytes <= self.cap {
            self.bytes += named.bytes;
            self.cache.insert(key, named);
        }
        self.report();
        out
    }

    /// Evicts the least recently used names until `more` bytes fit.
    fn make_room(&mut self, more: usize) {
        let mut evicted = 0;
        while self.bytes + more > self.cap && !self.cache.is_empty() {
            let Some((&k, _)) = self.cache.iter().min_by_key(|(_, v)| v.last_used) else {
                break;
            };
            if let Some(v) = self.cache.remove(&k) {
                self.bytes -= v.bytes;
                evicted += 1;
            }
        }
        if evicted > 0 {
            self.metrics.dropped(Cache::PythonCode, evicted);
        }
    }

    fn report(&self) {
        self.metrics.python_code_cache_bytes.set(self.bytes as i64);
    }
}

/// The counter of a failed read.
fn read_result(e: &CodeError) -> PyCodeRead {
    match e {
        CodeError::Read { .. } | CodeError::Pointer { .. } => PyCodeRead::Memory,
        CodeError::TypeMismatch { .. } => PyCodeRead::Type,
        CodeError::Fingerprint { .. } => PyCodeRead::Fingerprint,
        _ => PyCodeRead::Refused,
    }
}

/// Frame `f` named from `n`: the line of its instruction.
fn frame_of(n: &Named, f: &PyFrameRef, process: &PyProcess) -> PyFrame {
    // ≤3.9 record f_lasti in bytes; later versions in code units.
    let unit = if process.version.minor <= 9 {
        f.unit / 2
    } else {
        f.unit
    };
    PyFrame {
        code: f.code,
        name: Some(n.name.clone()),
        file: Some(n.file.clone()),
        first_line: n.code.first_line,
        line: n.code.line(unit).unwrap_or(0),
    }
}
