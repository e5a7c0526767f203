//! The process registry: the one owner of what ember knows of each process.
//!
//! One thread writes it: the unwind loader's (`ember-unwind`), which already follows the
//! kernel's task records (exec, mmap, fork, exit), serves the sampler's asks and reads
//! `/proc`; the [`Registry`] is served on that thread between two pieces of the loader's
//! work ([`Registry::serve`]), and what the loader reads of a process goes straight into the
//! table ([`Registry::adopt`]). Without a loader (tables off) the registry runs on a thread
//! of its own ([`Registry::spawn`], `ember-process`). Either way, exits and PID reuse are
//! decided on one thread, once: the task records' exits, the sweeps' and the window ends'
//! come back as exit events ([`Exit`], by pid and start time) that free the process's
//! Python attach state, its Python names and its JIT tables.
//!
//! The aggregator only counts, reads, and asks ([`Processes`]). It reads the table through
//! a read-only view (a read lock: the registry's thread is the only writer), which never
//! reads `/proc` or a process's memory and never changes a process. Its asks come in one
//! queue, in the order they were sent:
//! - [`Processes::touch`]: a thread of a process was sampled (batched, sent at the end of
//!   each batch, or at once while the registry is idle). The registry decides here, once,
//!   whether the pid is a process it knows, a new one, one that exec'd, or another process
//!   on a reused pid (its start time).
//! - [`Processes::facts`]: the name and cgroup of the processes a window holds (the gate
//!   judges them), read from the view once the touches sent are worked through.
//! - [`Processes::close`]: the window's stacks named. An address in a file or a named
//!   region is named from the view, a pure function of the process's mappings; only the
//!   rest (JIT code, interpreter frames, an address a new mapping may hold) goes to the
//!   registry, with the window's end, and the aggregator waits for the answer; a window
//!   the view named whole ends without a wait. The processes gone (exited, or their pid
//!   taken by another) come back as exit events, taken at the next close or
//!   [`Processes::tick`].
//!
//! The aggregator is held back while the registry works through its touches: at most
//! [`TOUCHES_OUT`] messages of [`TOUCH_BATCH`] touches wait, so a window's end (which waits
//! behind them) is never late by more than those reads. Each message wakes the loader's
//! thread ([`Registry::wake_with`]) if it sleeps.

use std::collections::HashSet;
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;

use crate::capture::{Work, WorkSender};
use crate::config::{Jit, Limits, Python};
use crate::metrics::Metrics;
use crate::model::{PyFrameRef, Runtime};
use crate::process::snapshot::Snapshot;
pub use crate::process::table::Exit;
use crate::process::table::{ProcessTable, UserAddr};
use crate::workload::Cgroup;

/// Touches buffered by the aggregator before they are sent, at most (as many samples as
/// the aggregator adds between two looks at the clock).
const TOUCH_BATCH: usize = 64;
/// Messages of touches sent and not yet worked through, at most: the aggregator waits for
/// the registry beyond.
const TOUCHES_OUT: usize = 2;
/// Messages queued to the registry: the aggregator's touches (at most [`TOUCHES_OUT`]) and
/// one ask it waits for, with room to spare.
const QUEUE: usize = 64;

/// Distinct touches the aggregator remembers sending in a window, at most (then it forgets
/// them and sends again: a touch sent twice changes nothing).
const SENT_CAP: usize = 16_384;

/// One sampled thread, as [`ProcessTable::touch`] takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Touch {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// The thread's `comm`.
    pub comm: [u8; 16],
    /// The sample's cgroup v2 id (0 when unknown).
    pub cgroup_id: u64,
    /// The process's start time (`/proc/PID/stat` field 22, the sample's; 0 when unknown).
    pub start_time: u64,
}

/// One thing to name in a stack, with the process it belongs to.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// A user address (already moved back into its call for return addresses).
    Addr {
        /// Process id.
        pid: u32,
        /// The process's start time (0: whichever process has the pid).
        start_time: u64,
        /// The address.
        addr: u64,
    },
    /// An interpreter frame.
    Python {
        /// Process id.
        pid: u32,
        /// The process's start time (0: whichever process has the pid).
        start_time: u64,
        /// The frame as the sampler recorded it.
        frame: PyFrameRef,
    },
}

/// One stack of a window, as the registry names it: its process, and how many of the
/// window's lookups it adds (the next ones in [`WindowAsk::lookups`]; an address an earlier
/// stack of the window asked for already is not asked again).
#[derive(Debug, Clone, Copy)]
pub struct StackAsk {
    /// The stack's process.
    pub pid: u32,
    /// Its start time (0: whichever process has the pid).
    pub start_time: u64,
    /// The lookups it adds, in order.
    pub lookups: usize,
}

/// A window's stacks and what to name in them, each user address once per process: the
/// window goes to the registry in one message and comes back in one.
#[derive(Debug, Clone, Default)]
pub struct WindowAsk {
    /// The stacks, in order.
    pub stacks: Vec<StackAsk>,
    /// What to name, in the order named.
    pub lookups: Vec<Lookup>,
}

/// What one [`StackAsk`] comes back as.
#[derive(Debug, Clone)]
pub struct Named {
    /// The interpreter the process runs, if its frames are walked (before its lookups).
    pub runtime: Option<Runtime>,
    /// The process name before its lookups were named.
    pub name_before: Arc<str>,
    /// The process name after them (a lookup may have read the process again).
    pub name: Arc<str>,
}

/// What a closed window comes back as.
#[derive(Debug, Default)]
pub struct Closed {
    /// One per [`StackAsk`], in order.
    pub stacks: Vec<Named>,
    /// One answer per lookup of the [`WindowAsk`], in order.
    pub addrs: Vec<UserAddr>,
    /// Exit events of window ends not taken yet: this window's end's when the registry
    /// named the misses (the aggregator waited), else earlier ends' (this one's come later).
    pub gone: Vec<Exit>,
}

/// A process's facts the gate judges by.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// Its cgroup when first seen.
    pub cgroup: Arc<Cgroup>,
    /// Its name.
    pub name: Arc<str>,
}

/// What the registry's queue carries.
enum Msg {
    Touch(Vec<Touch>),
    /// What the view could not name, then the window's end.
    Close(Misses, SyncSender<Resolved>),
    /// The window's end, when the view named everything: nobody waits for it.
    End,
}

/// The lookups of a window the view could not answer, and the processes whose names the
/// registry tells after naming them (a miss may read a process again).
#[derive(Debug, Default)]
struct Misses {
    lookups: Vec<Lookup>,
    /// Each by pid and start time.
    pids: Vec<(u32, u64)>,
}

/// The registry's answer to [`Misses`].
#[derive(Debug, Default)]
struct Resolved {
    /// One per lookup, in order.
    addrs: Vec<UserAddr>,
    /// One per pid, in order.
    names: Vec<Arc<str>>,
}

/// The process table, shared: changed by the registry's thread alone, read by the
/// aggregator (only through `&ProcessTable`, see [`Processes::name_from_view`]). A mutex,
/// not a read-write lock: two parties, and the table holds channel ends that are `Send`
/// but not `Sync`. A panic while holding it (there should be none) leaves what was written.
type Shared = Arc<Mutex<ProcessTable>>;

fn write<T>(shared: &Mutex<T>) -> MutexGuard<'_, T> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

/// The exit events of window ends, from the registry to the aggregator, which takes them
/// at its next look ([`Processes::tick`]) or close. Bounded by what one window's end
/// forgets (at most the table's `max_processes`): the aggregator takes them all at every
/// close, and a window's end comes only with a close.
type Gone = Arc<Mutex<Vec<Exit>>>;

/// The aggregator's handle on the registry: it asks, the registry's thread reads.
pub struct Processes {
    tx: SyncSender<Msg>,
    /// One message from the registry per message of touches it worked through.
    done: Receiver<()>,
    /// Messages of touches sent and not worked through yet.
    out: usize,
    /// Touches not sent yet.
    touches: Vec<Touch>,
    /// What this window's touches told the registry, by (pid, start time, leader or not,
    /// comm, cgroup): the same again changes nothing (only the leader's name, the cgroup and
    /// the process matter), so it is sent once a window, not once a sample.
    sent: HashSet<(u32, u64, bool, [u8; 16], u64), foldhash::fast::RandomState>,
    /// Wakes the thread that serves the registry, once it is set.
    wake: Arc<OnceLock<WorkSender>>,
    /// The read-only view of the table.
    table: Shared,
    /// Exit events not taken yet.
    gone: Gone,
    /// Samples since the last look at the registry's acknowledgements ([`Processes::tick`]).
    ticks: u32,
}

/// The registry itself: the process table and the aggregator's queue into it. Whichever
/// thread holds it is the one writer of every process's state.
pub struct Registry {
    table: Shared,
    rx: Receiver<Msg>,
    /// One message per message of touches worked through.
    done: SyncSender<()>,
    wake: Arc<OnceLock<WorkSender>>,
    /// Exit events decided since the last [`Registry::exits`].
    exits: Vec<Exit>,
    /// Exit events for the aggregator.
    gone: Gone,
}

/// A registry with a process table capped by `limits`, naming JIT code as `jit` says and
/// keeping `python.cache_bytes` of Python names, and the aggregator's handle on it. The
/// registry is served by the unwind loader's thread ([`Registry::serve`]) or by a thread
/// of its own ([`Registry::spawn`]).
pub fn channel(
    limits: &Limits,
    jit: &Jit,
    python: &Python,
    metrics: Metrics,
) -> (Processes, Registry) {
    let mut table = ProcessTable::new(limits, metrics);
    table.set_jit(jit.clone());
    table.set_python_cache(python.cache_bytes);
    let table = Arc::new(Mutex::new(table));
    let (tx, rx) = mpsc::sync_channel(QUEUE);
    let (done_tx, done) = mpsc::sync_channel(TOUCHES_OUT);
    let wake = Arc::new(OnceLock::new());
    let gone = Gone::default();
    let processes = Processes {
        tx,
        done,
        out: 0,
        touches: Vec::new(),
        sent: HashSet::default(),
        wake: wake.clone(),
        table: table.clone(),
        gone: gone.clone(),
        ticks: 0,
    };
    let registry = Registry {
        table,
        rx,
        done: done_tx,
        wake,
        exits: Vec::new(),
        gone,
    };
    (processes, registry)
}

/// [`channel`], served by a thread of its own (`ember-process`), which ends once the
/// aggregator's handle is dropped: for tests, benches and agents without an unwind loader.
pub fn start(
    limits: &Limits,
    jit: &Jit,
    python: &Python,
    metrics: Metrics,
) -> std::io::Result<(Processes, JoinHandle<()>)> {
    let (processes, registry) = channel(limits, jit, python, metrics);
    Ok((processes, registry.spawn()?))
}

impl Registry {
    /// Has the aggregator's messages wake the thread that serves this registry by sending
    /// `tx` a [`Work::Wake`] (the loader sleeps on its work queue).
    pub fn wake_with(&self, tx: WorkSender) {
        let _ = self.wake.set(tx);
    }

    /// Serves the registry on a thread of its own (`ember-process`) until the aggregator's
    /// handle is gone.
    pub fn spawn(self) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("ember-process".into())
            .spawn(move || self.run())
    }

    /// Serves every message until the aggregator's handle is gone (the loader's thread
    /// does this once it stops following processes: the last window is still named).
    pub fn run(mut self) {
        while let Ok(msg) = self.rx.recv() {
            self.handle(msg);
            // No loader reads them here ([`Registry::exits`]): kept, they would pile up.
            self.exits.clear();
        }
    }

    /// Serves the messages waiting, without waiting for more; false once the aggregator's
    /// handle is gone.
    pub fn serve(&mut self) -> bool {
        loop {
            match self.rx.try_recv() {
                Ok(msg) => self.handle(msg),
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
    }

    /// Takes what the unwind loader read of a process (on this same thread).
    pub fn adopt(&mut self, snap: Snapshot) {
        write(&self.table).adopt(snap);
    }

    /// Notes an exit the loader learned of (a task record, or its sweep): the table keeps
    /// the process's mappings until the window that sampled it is named, then forgets it.
    pub fn exited(&mut self, pid: u32, start_time: Option<u64>) {
        write(&self.table).exited(pid, start_time);
    }

    /// The exit events decided since the last call (window ends), for the loader's own
    /// per-process state.
    pub fn exits(&mut self) -> Vec<Exit> {
        std::mem::take(&mut self.exits)
    }

    /// Serves one message.
    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Touch(touches) => {
                let mut table = write(&self.table);
                for t in touches {
                    table.touch(t.pid, t.tid, &t.comm, t.cgroup_id, t.start_time);
                }
                drop(table);
                // Never full: the aggregator has at most TOUCHES_OUT out.
                let _ = self.done.try_send(());
            }
            Msg::Close(misses, reply) => {
                let mut table = write(&self.table);
                let addrs = misses
                    .lookups
                    .iter()
                    .map(|l| match l {
                        Lookup::Addr {
                            pid,
                            start_time,
                            addr,
                        } => table.normalize(*pid, *start_time, *addr),
                        Lookup::Python {
                            pid,
                            start_time,
                            frame,
                        } => table.python(*pid, *start_time, frame),
                    })
                    .collect();
                let names = misses
                    .pids
                    .iter()
                    .map(|&(pid, start_time)| table.name(pid, start_time))
                    .collect();
                drop(table);
                self.end_window();
                let _ = reply.send(Resolved { addrs, names });
            }
            Msg::End => self.end_window(),
        }
    }

    /// Ends the registry's window: its exit events go to the loader's state and to the
    /// aggregator (the gate allows again the pids it denied).
    fn end_window(&mut self) {
        let gone = write(&self.table).end_window();
        if gone.is_empty() {
            return;
        }
        self.exits.extend_from_slice(&gone);
        write(&self.gone).extend(gone);
    }
}

/// Samples between two looks at the registry's acknowledgements ([`Processes::tick`]).
pub const TICK: u32 = 64;

impl Processes {
    /// Called once per sample: every [`TICK`] samples, sends the touches buffered if the
    /// registry is idle (so a window's close rarely waits for them), and returns the exit
    /// events of a window end not taken yet (the gate allows those pids again at once, not
    /// a window later).
    pub fn tick(&mut self) -> Option<Vec<Exit>> {
        self.ticks += 1;
        if self.ticks < TICK {
            return None;
        }
        self.ticks = 0;
        if !self.touches.is_empty() && self.idle() {
            self.flush();
        }
        self.take_gone()
    }

    /// The exit events not taken yet, if any.
    fn take_gone(&self) -> Option<Vec<Exit>> {
        let mut gone = write(&self.gone);
        (!gone.is_empty()).then(|| std::mem::take(&mut *gone))
    }

    /// Notes a sampled thread; sent with the batch ([`Processes::flush`]), or at once
    /// when the registry is idle: a new process is read while the aggregator counts on.
    pub fn touch(&mut self, t: Touch) {
        if self.sent.len() >= SENT_CAP {
            self.sent.clear();
        }
        if !self
            .sent
            .insert((t.pid, t.start_time, t.tid == t.pid, t.comm, t.cgroup_id))
        {
            return;
        }
        self.touches.push(t);
        if self.touches.len() >= TOUCH_BATCH || self.idle() {
            self.flush();
        }
    }

    /// Whether every message of touches sent has been worked through.
    fn idle(&mut self) -> bool {
        while self.out > 0 && self.done.try_recv().is_ok() {
            self.out -= 1;
        }
        self.out == 0
    }

    /// Sends the touches buffered, first waiting while [`TOUCHES_OUT`] messages of them
    /// are not worked through.
    pub fn flush(&mut self) {
        if self.touches.is_empty() {
            return;
        }
        // Those the registry is done with, then (if still too many) wait for one.
        self.idle();
        if self.out >= TOUCHES_OUT {
            match self.done.recv() {
                Ok(()) => self.out -= 1,
                // The registry is gone: nothing waits any more.
                Err(_) => self.out = 0,
            }
        }
        let touches = std::mem::replace(&mut self.touches, Vec::with_capacity(TOUCH_BATCH));
        if self.send(Msg::Touch(touches)) {
            self.out += 1;
        }
    }

    /// Queues `msg` and wakes the registry's thread; false if the registry is gone.
    fn send(&self, msg: Msg) -> bool {
        let sent = self.tx.send(msg).is_ok();
        if let Some(w) = self.wake.get() {
            // A full work queue wakes the loader anyway.
            let _ = w.try_send(Work::Wake);
        }
        sent
    }

    /// Waits until every touch sent is worked through (or the registry is gone), so the
    /// view knows every process sampled so far.
    fn settle(&mut self) {
        self.flush();
        while self.out > 0 {
            match self.done.recv() {
                Ok(()) => self.out -= 1,
                Err(_) => self.out = 0,
            }
        }
    }

    /// The facts of `procs` (each by pid and start time), in order, read from the view
    /// once the touches sent are worked through.
    pub fn facts(&mut self, procs: Vec<(u32, u64)>) -> Vec<Facts> {
        self.settle();
        let guard = write(&self.table);
        let table: &ProcessTable = &guard;
        procs
            .into_iter()
            .map(|(pid, start_time)| Facts {
                cgroup: table.cgroup(pid, start_time),
                name: table.name(pid, start_time),
            })
            .collect()
    }

    /// Names the window's stacks and ends the window; the next touches are the next
    /// window's. What the view names is named here; the rest goes to the registry, with
    /// the window's end, and the aggregator waits for the answer. When the view named it
    /// all, the window's end is sent and not waited for: its exit events come at the next
    /// [`Processes::tick`] or close (the steady state of a host: a round trip to the
    /// registry's thread per window saved). A registry gone answers unknown.
    pub fn close(&mut self, ask: WindowAsk) -> Closed {
        self.settle();
        self.sent.clear();
        let (mut closed, misses, missed) = self.name_from_view(ask);
        if misses.lookups.is_empty() && misses.pids.is_empty() {
            // Exit events of an earlier window's end not taken yet.
            closed.gone = self.take_gone().unwrap_or_default();
            if !self.send(Msg::End) {
                tracing::error!("the process registry is gone");
            }
            return closed;
        }
        let (n_lookups, n_pids) = (misses.lookups.len(), misses.pids.len());
        let (reply, rx) = mpsc::sync_channel(1);
        let resolved = self
            .send(Msg::Close(misses, reply))
            .then(|| answer(&rx))
            .flatten()
            .filter(|r| r.addrs.len() == n_lookups && r.names.len() == n_pids);
        let Some(resolved) = resolved else {
            tracing::error!("the process registry is gone: stacks go unnamed");
            return closed;
        };
        for (&i, a) in missed.addrs.iter().zip(resolved.addrs) {
            closed.addrs[i] = a;
        }
        for (&i, name) in missed.stacks.iter().zip(resolved.names) {
            closed.stacks[i].name = name;
        }
        closed.gone = self.take_gone().unwrap_or_default();
        closed
    }

    /// What the view names of `ask` (the misses standing as unknown addresses), the
    /// misses to ask the registry, and where their answers go.
    fn name_from_view(&self, ask: WindowAsk) -> (Closed, Misses, Missed) {
        let guard = write(&self.table);
        let table: &ProcessTable = &guard;
        let mut closed = Closed {
            stacks: Vec::with_capacity(ask.stacks.len()),
            addrs: Vec::with_capacity(ask.lookups.len()),
            gone: Vec::new(),
        };
        let (mut misses, mut missed) = (Misses::default(), Missed::default());
        let mut lookups = ask.lookups.into_iter();
        for a in &ask.stacks {
            let before = misses.lookups.len();
            for l in lookups.by_ref().take(a.lookups) {
                let found = match &l {
                    Lookup::Addr {
                        pid,
                        start_time,
                        addr,
                    } => table.find(*pid, *start_time, *addr),
                    Lookup::Python { .. } => None,
                };
                closed.addrs.push(found.unwrap_or_else(|| {
                    missed.addrs.push(closed.addrs.len());
                    misses.lookups.push(l);
                    UserAddr::Unknown(0)
                }));
            }
            if misses.lookups.len() > before {
                missed.stacks.push(closed.stacks.len());
                misses.pids.push((a.pid, a.start_time));
            }
            let name = table.name(a.pid, a.start_time);
            closed.stacks.push(Named {
                runtime: table.runtime(a.pid, a.start_time),
                name_before: name.clone(),
                name,
            });
        }
        (closed, misses, missed)
    }
}

/// Where the registry's answers to [`Misses`] go in a [`Closed`]: the index of each
/// lookup's answer, and of each stack whose name it tells.
#[derive(Debug, Default)]
struct Missed {
    addrs: Vec<usize>,
    stacks: Vec<usize>,
}

/// The registry's answer on `rx`; `None` if the registry is gone.
fn answer<T>(rx: &Receiver<T>) -> Option<T> {
    rx.recv().ok()
}
