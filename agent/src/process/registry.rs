//! The process registry: the one thread (`ember-process`) that owns the process table.
//!
//! Every `/proc` read, process-memory read (Python names), perf map and jitdump read for
//! naming runs here, never on the counting thread: the aggregator only counts, and asks.
//! What it asks comes in one queue, in the order it was sent, beside what the unwind
//! loader read of a process ([`Snapshot`]s):
//! - [`Processes::touch`]: a thread of a process was sampled (batched, sent at the end of
//!   each batch). The registry decides here, once, whether the pid is a process it knows,
//!   a new one, one that exec'd, or another process on a reused pid (its start time).
//! - [`Processes::facts`]: the name and cgroup of the processes a window holds (the gate
//!   judges them).
//! - [`Processes::close`]: every user address and interpreter frame of the window's stacks,
//!   named against the table in the order asked, and the window's end: the processes gone
//!   (exited, or their pid taken by another) come back as exit events, their JIT tables and
//!   Python names freed with them.
//!
//! The aggregator is held back while the registry works through its touches: at most
//! [`TOUCHES_OUT`] messages of [`TOUCH_BATCH`] touches wait, so a window's end (which waits
//! behind them) is never late by more than those reads, as when the aggregator read `/proc`
//! itself between two looks at the clock. A snapshot the loader cannot queue is dropped and
//! counted (`ember_cache_drops_total{cache="process_snapshots"}`), as before.

use std::collections::HashSet;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::config::{Jit, Limits, Python};
use crate::metrics::{Cache, Metrics};
use crate::model::{PyFrameRef, Runtime};
use crate::process::snapshot::Snapshot;
use crate::process::table::{ProcessTable, UserAddr};
use crate::workload::Cgroup;

/// Touches buffered by the aggregator before they are sent, at most (as many samples as
/// the aggregator adds between two looks at the clock).
const TOUCH_BATCH: usize = 64;
/// Messages of touches sent and not yet worked through, at most: the aggregator waits for
/// the registry beyond.
const TOUCHES_OUT: usize = 2;
/// Messages queued to the registry: the unwind loader's snapshots (as many as their own
/// queue held before the registry had one) and the aggregator's touches and windows.
const QUEUE: usize = 1024;

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
}

/// One thing to name in a stack, with the process it belongs to.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// A user address (already moved back into its call for return addresses).
    Addr {
        /// Process id.
        pid: u32,
        /// The address.
        addr: u64,
    },
    /// An interpreter frame.
    Python {
        /// Process id.
        pid: u32,
        /// The frame as the sampler recorded it.
        frame: PyFrameRef,
    },
}

/// The lookups of one stack of process `pid`.
#[derive(Debug, Clone)]
pub struct StackAsk {
    /// The stack's process.
    pub pid: u32,
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
    /// One answer per lookup, in order.
    pub addrs: Vec<UserAddr>,
    /// The process name after them (a lookup may have read the process again).
    pub name: Arc<str>,
}

/// What a closed window comes back as.
#[derive(Debug, Default)]
pub struct Closed {
    /// One per [`StackAsk`], in order.
    pub stacks: Vec<Named>,
    /// The processes the window's end forgot (exit events).
    pub gone: Vec<u32>,
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
    Snapshot(Box<Snapshot>),
    Touch(Vec<Touch>),
    Facts(Vec<u32>, SyncSender<Vec<Facts>>),
    Close(Vec<StackAsk>, SyncSender<Closed>),
}

/// The unwind loader's way in: what it read of a process.
#[derive(Clone)]
pub struct Inbox {
    tx: SyncSender<Msg>,
    metrics: Metrics,
}

impl Inbox {
    /// Queues `snap` for the table; a full queue drops it, counted.
    pub fn snapshot(&self, snap: Snapshot) {
        match self.tx.try_send(Msg::Snapshot(Box::new(snap))) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => {}
            Err(TrySendError::Full(_)) => self.metrics.dropped(Cache::ProcessSnapshots, 1),
        }
    }
}

/// The aggregator's handle on the registry: it asks, the registry's thread reads.
pub struct Processes {
    tx: SyncSender<Msg>,
    /// One message from the registry per message of touches it worked through.
    done: Receiver<()>,
    /// Messages of touches sent and not worked through yet.
    out: usize,
    /// Touches not sent yet.
    touches: Vec<Touch>,
    /// What this window's touches told the registry, by (pid, leader or not, comm, cgroup):
    /// the same again changes nothing (only the leader's name and the cgroup matter), so
    /// it is sent once a window, not once a sample.
    sent: HashSet<(u32, bool, [u8; 16], u64)>,
}

/// Starts the registry's thread (`ember-process`) with a process table capped by `limits`,
/// naming JIT code as `jit` says and keeping `python.cache_bytes` of Python names. Returns
/// the aggregator's handle, the unwind loader's, and the thread, which ends once both
/// handles are dropped.
pub fn start(
    limits: &Limits,
    jit: &Jit,
    python: &Python,
    metrics: Metrics,
) -> std::io::Result<(Processes, Inbox, JoinHandle<()>)> {
    let mut table = ProcessTable::new(limits, metrics.clone());
    table.set_jit(jit.clone());
    table.set_python_cache(python.cache_bytes);
    let (tx, rx) = mpsc::sync_channel(QUEUE);
    let (done_tx, done) = mpsc::sync_channel(TOUCHES_OUT);
    let thread = std::thread::Builder::new()
        .name("ember-process".into())
        .spawn(move || run(table, rx, done_tx))?;
    let inbox = Inbox {
        tx: tx.clone(),
        metrics,
    };
    let processes = Processes {
        tx,
        done,
        out: 0,
        touches: Vec::new(),
        sent: HashSet::new(),
    };
    Ok((processes, inbox, thread))
}

/// The registry's thread: takes every message in order until both handles are gone; tells
/// `done` each message of touches worked through.
fn run(mut table: ProcessTable, rx: Receiver<Msg>, done: SyncSender<()>) {
    while let Ok(msg) = rx.recv() {
        match msg {
            Msg::Snapshot(snap) => table.adopt(*snap),
            Msg::Touch(touches) => {
                for t in touches {
                    table.touch(t.pid, t.tid, &t.comm, t.cgroup_id);
                }
                // Never full: the aggregator has at most TOUCHES_OUT out.
                let _ = done.try_send(());
            }
            Msg::Facts(pids, reply) => {
                let facts = pids
                    .into_iter()
                    .map(|pid| Facts {
                        cgroup: table.cgroup(pid),
                        name: table.name(pid),
                    })
                    .collect();
                let _ = reply.send(facts);
            }
            Msg::Close(asks, reply) => {
                let stacks = asks
                    .into_iter()
                    .map(|a| name_stack(&mut table, a))
                    .collect();
                let gone = table.end_window();
                let _ = reply.send(Closed { stacks, gone });
            }
        }
    }
}

/// Names one stack's lookups against `table`.
fn name_stack(table: &mut ProcessTable, ask: StackAsk) -> Named {
    let runtime = table.runtime(ask.pid);
    let name_before = table.name(ask.pid);
    let addrs = ask
        .lookups
        .iter()
        .map(|l| match l {
            Lookup::Addr { pid, addr } => table.normalize(*pid, *addr),
            Lookup::Python { pid, frame } => table.python(*pid, frame),
        })
        .collect();
    Named {
        runtime,
        name_before,
        addrs,
        name: table.name(ask.pid),
    }
}

impl Processes {
    /// Notes a sampled thread; sent with the batch ([`Processes::flush`]).
    pub fn touch(&mut self, t: Touch) {
        if self.sent.len() >= SENT_CAP {
            self.sent.clear();
        }
        if !self
            .sent
            .insert((t.pid, t.tid == t.pid, t.comm, t.cgroup_id))
        {
            return;
        }
        self.touches.push(t);
        if self.touches.len() >= TOUCH_BATCH {
            self.flush();
        }
    }

    /// Sends the touches buffered, first waiting while [`TOUCHES_OUT`] messages of them
    /// are not worked through.
    pub fn flush(&mut self) {
        if self.touches.is_empty() {
            return;
        }
        // Those the registry is done with, then (if still too many) wait for one.
        while self.out > 0 && self.done.try_recv().is_ok() {
            self.out -= 1;
        }
        if self.out >= TOUCHES_OUT {
            match self.done.recv() {
                Ok(()) => self.out -= 1,
                // The registry is gone: nothing waits any more.
                Err(_) => self.out = 0,
            }
        }
        let touches = std::mem::replace(&mut self.touches, Vec::with_capacity(TOUCH_BATCH));
        if self.tx.send(Msg::Touch(touches)).is_ok() {
            self.out += 1;
        }
    }

    /// The facts of `pids`, in order (defaults if the registry is gone).
    pub fn facts(&mut self, pids: Vec<u32>) -> Vec<Facts> {
        self.flush();
        let n = pids.len();
        let (reply, rx) = mpsc::sync_channel(1);
        let got = self.tx.send(Msg::Facts(pids, reply)).ok();
        got.and_then(|()| rx.recv().ok())
            .filter(|f| f.len() == n)
            .unwrap_or_else(|| vec![Facts::default(); n])
    }

    /// Names the window's stacks and ends the window; the next touches are the next
    /// window's. A registry gone answers every address unknown.
    pub fn close(&mut self, asks: Vec<StackAsk>) -> Closed {
        self.flush();
        self.sent.clear();
        let (reply, rx) = mpsc::sync_channel(1);
        let shape: Vec<usize> = asks.iter().map(|a| a.lookups.len()).collect();
        match self.tx.send(Msg::Close(asks, reply)).ok() {
            Some(()) => match rx.recv() {
                Ok(c) if c.stacks.len() == shape.len() => c,
                _ => gone_registry(&shape),
            },
            None => gone_registry(&shape),
        }
    }
}

/// A window's answer when the registry's thread is gone (it only ends with its handles):
/// stacks of `shape[i]` lookups each, every one unknown.
fn gone_registry(shape: &[usize]) -> Closed {
    tracing::error!("the process registry is gone: stacks go unnamed");
    let stacks = shape
        .iter()
        .map(|&n| Named {
            runtime: None,
            name_before: Arc::from(""),
            addrs: vec![UserAddr::Unknown(0); n],
            name: Arc::from(""),
        })
        .collect();
    Closed {
        stacks,
        gone: Vec::new(),
    }
}
