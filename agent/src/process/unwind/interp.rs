//! The loader's part in Python frames: when it reads a process, it also asks the
//! [`Attacher`] whether the process runs a CPython and writes (or removes) the sampler's
//! `py_procs` entry; the snapshot it hands the process table carries what the names side
//! needs. An interpreter whose runtime is not up yet (a process read at its exec) is
//! looked at again a little later, a bounded number of times.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::loader::Loader;
use crate::capture::unwind::UnwindIo;
use crate::metrics::PyAttach;
use crate::process::python::attach::{Attach, PyProcess};
use crate::process::snapshot::Snapshot;

/// How long after a look that found the runtime not initialized the process is read again.
const RETRY_EVERY: Duration = Duration::from_millis(200);
/// Looks at a process whose runtime stays uninitialized (~10 s of retries).
const MAX_TRIES: u32 = 50;
/// Processes waiting for their runtime at once; more are dropped (counted never_ready).
const MAX_PENDING: usize = 1024;

impl<M: UnwindIo> Loader<M> {
    /// Attaches to `snap`'s interpreter, if any, writing its `py_procs` entry; what the names
    /// side needs of it goes with the snapshot.
    pub(super) fn attach_python(&mut self, snap: &Snapshot) -> Option<Arc<PyProcess>> {
        let py = self.python.as_mut()?;
        let pid = snap.pid;
        let verdict = py.attacher.attach(snap);
        match verdict {
            Attach::Attached(entry, process) => {
                py.pending.remove(&pid);
                if let Err(e) = self.io.write_py(pid, &entry) {
                    tracing::debug!("pid {pid}: py_procs entry refused: {e}");
                    py.metrics.python_attached(PyAttach::MapFull);
                    return None;
                }
                py.attached.insert(pid, snap.start_time);
                py.metrics.python_processes.set(py.attached.len() as i64);
                Some(process)
            }
            Attach::NotReady => {
                let tries = py.pending.get(&pid).map_or(0, |&(_, n)| n) + 1;
                if tries > MAX_TRIES || (tries == 1 && py.pending.len() >= MAX_PENDING) {
                    py.pending.remove(&pid);
                    py.metrics.python_attached(PyAttach::NeverReady);
                } else {
                    py.pending
                        .insert(pid, (Instant::now() + RETRY_EVERY, tries));
                }
                None
            }
            Attach::NotPython | Attach::Refused(_) => {
                py.pending.remove(&pid);
                if py.attached.remove(&pid).is_some() {
                    // It exec'd into another program.
                    self.io.delete_py(pid);
                }
                None
            }
        }
    }

    /// Whether `pid` has a `py_procs` entry: its ranges then tell the walker to look there.
    pub(super) fn python_attached(&self, pid: u32) -> bool {
        self.python
            .as_ref()
            .is_some_and(|py| py.attached.contains_key(&pid))
    }

    /// Forgets `pid`'s interpreter on an exit event: of the process started at
    /// `start_time` when the event names one (a window's end), else whichever runs on the
    /// pid (an exit record, or a sweep that found the pid gone).
    pub(super) fn drop_python(&mut self, pid: u32, start_time: Option<u64>) {
        let Some(py) = self.python.as_mut() else {
            return;
        };
        let other = |t: &u64| start_time.is_some_and(|s| s != *t);
        if py.attached.get(&pid).is_some_and(other) {
            return;
        }
        py.pending.remove(&pid);
        if py.attached.remove(&pid).is_some() {
            self.io.delete_py(pid);
            py.metrics.python_processes.set(py.attached.len() as i64);
        }
    }

    /// Reads the processes whose interpreter was not ready and are due again.
    pub(super) fn retry_python(&mut self) {
        let due = match &self.python {
            Some(py) => py.due(Instant::now()),
            None => return,
        };
        for pid in due {
            self.load(pid);
        }
    }
}
