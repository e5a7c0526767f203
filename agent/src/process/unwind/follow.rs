//! The loader's thread (`ember-unwind`): follows processes as the kernel's task records
//! (exec, mmap, fork, exit; read by `ember-tasks`, [`crate::capture::tasks::forward`]) and
//! the sampler's asks arrive on one queue, and sweeps out processes that are gone. It is
//! the process registry's thread too ([`crate::process::registry`]): the aggregator's asks
//! are served between two pieces of work, and every exit (a record, a sweep, a window's
//! end) goes through [`Loader::exited`] or the registry's exit events, once.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::Ordering;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use super::budget::{now_ns, PROC_COST};
use super::loader::{bias, Loader};
use super::procs::{with_mapping, Proc, Procs, Range};
use crate::capture::tasks::{Mmap, TaskEvent, TaskLink};
use crate::capture::unwind::UnwindIo;
use crate::capture::{Ask, Work, WorkReceiver};
use crate::metrics::Cache;
use crate::os::procfs;

/// How often processes that exited are looked for when the kernel's task records are
/// followed: their exit records are the first way, and a lost record triggers a sweep at
/// once, so this only bounds what a missed one costs (each sweep reads the `stat` of every
/// process with ranges).
const SWEEP_EVERY: Duration = Duration::from_secs(30);
/// The same without task records, where sweeps are the only way to see exits.
const SWEEP_EVERY_UNFOLLOWED: Duration = Duration::from_secs(2);
/// How long after an exec or mmap the loader waits for more before reading the process.
const SETTLE: Duration = Duration::from_millis(2);
/// Processes whose asks wait for the loader.
const MAX_ASKED: usize = 4_096;
/// The sampler's asks served per round of the loader's loop.
const ASKS_PER_ROUND: usize = 4;
/// Full reads of new processes (exec, new executable mappings) started per second at most,
/// and as many at once after a quiet spell. A read is `/proc/PID/{stat,maps,cgroup}`, an
/// open of every mapped file and the snapshot for the process table: 0.25-0.5 ms of CPU
/// each (bench/churn.py), so a host spawning hundreds of processes a second would cost a
/// fleet agent a third of its 500m limit. Past the rate, processes wait their turn, and
/// most of a spawn storm's exit before it comes (their exit record takes them out of the
/// queue, unread); the ones that live are read a little later. Until then the exec hook's
/// ranges (files already known) or frame pointers walk them. The rate never applies to a
/// process being sampled: a sample of one the exec hook wrote and the loader has not read
/// asks for it (`Ask::Unread`), and the loader reads it before anything else (asks are
/// not limited: they come at most once a second per process, at most at the sampling
/// rate). Without that, a 30 ms process waiting its turn was gone before its read, and
/// its samples could not be named.
pub(super) const READS_PER_SEC: f64 = 100.0;
/// Processes waiting for their full read; more are not queued (counted in
/// `cache_dropped_total{cache="process_reads"}`, as are the waiting ones that exit while
/// the rate holds them back).
const MAX_DIRTY: usize = 4_096;

/// The rate of full reads ([`READS_PER_SEC`]): a token bucket.
pub(super) struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Default for Bucket {
    fn default() -> Self {
        Self {
            tokens: READS_PER_SEC,
            at: Instant::now(),
        }
    }
}

impl Bucket {
    fn refill(&mut self) {
        let now = Instant::now();
        let earned = now.saturating_duration_since(self.at).as_secs_f64() * READS_PER_SEC;
        self.tokens = (self.tokens + earned).min(READS_PER_SEC);
        self.at = now;
    }

    /// Takes one read if the rate allows it now.
    pub(super) fn try_take(&mut self) -> bool {
        self.refill();
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return true;
        }
        false
    }

    /// How long until the next read is allowed (zero: now).
    fn next(&mut self) -> Duration {
        self.refill();
        Duration::from_secs_f64(((1.0 - self.tokens) / READS_PER_SEC).max(0.0))
    }
}

/// Stops the task record reader when the loader returns.
struct StopOnDrop(Option<TaskLink>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(link) = &self.0 {
            link.stop();
        }
    }
}

/// What waits to be loaded: processes whose records came (`dirty`), the sampler's asks
/// (`asked`) and its asks for processes sampled before they were read (`unread`), one
/// entry per process.
#[derive(Default)]
pub(super) struct Queued {
    pub(super) dirty: BTreeSet<u32>,
    pub(super) asked: BTreeSet<u32>,
    /// Sampled processes the exec hook wrote and the loader has not read, with when the
    /// latest ask's sample was taken: read before anything else, whatever the rate (the
    /// sampler asks at most once a second per process, so the sampling rate bounds them).
    pub(super) unread: BTreeMap<u32, u64>,
    /// Processes read from `unread` since their exec (at most [`MAX_ASKED`]): a library
    /// they map later is read at once too, not at the rate.
    pub(super) sampled: HashSet<u32>,
    /// The processes named in the config, if any: only they (and with
    /// `sampling.subprocesses`, their `children`) are followed.
    pub(super) only: HashSet<u32>,
    /// Processes forked by followed ones, followed too with `sampling.subprocesses` (at
    /// most [`MAX_CHILDREN`]; each leaves with its exit).
    pub(super) children: HashSet<u32>,
    /// The rate of full reads of `dirty` processes.
    pub(super) reads: Bucket,
    /// Since when (CLOCK_MONOTONIC ns) every executable mapping has come as a task record:
    /// the reader started, or last lost records. `None` when records are not followed.
    pub(super) whole_since: Option<u64>,
}

/// Children of the processes named in the config followed at most (the sampler's
/// `pid_filter` holds as many).
const MAX_CHILDREN: usize = 65_536;

impl Queued {
    /// Whether `pid`'s records and asks are followed: every process, or only those named in
    /// the config and their children.
    fn follows(&self, pid: u32) -> bool {
        self.only.is_empty() || self.only.contains(&pid) || self.children.contains(&pid)
    }

    /// Whether a read of `pid` would tell nothing its last one did not: it was read in full
    /// since task records are whole, so a new executable mapping would have come as one
    /// (mmap and mprotect both write it). Asks for a pc outside its ranges are then a
    /// frame-pointer chain gone astray in code built without them, or a pc in an object
    /// that was refused; served, each cost a full read a second per such process.
    fn read_covers(&self, pid: u32, procs: &Procs) -> bool {
        self.whole_since
            .is_some_and(|since| procs.get(pid).is_some_and(|p| p.read_ns > since))
    }
}

impl<M: UnwindIo> Loader<M> {
    /// The loader's thread: loads `preload` (the processes named in the config, so their
    /// first samples already find their ranges), then follows the kernel's task records
    /// (`tasks`, when a reader forwards them: a process is loaded as it starts, before its
    /// first sample) and serves the sampler's asks (processes that were running before
    /// the agent), until capture stops or [`Loader::halt_handle`] is set.
    pub fn run(mut self, preload: &[u32], work: WorkReceiver, tasks: Option<TaskLink>) {
        self.follow(preload, work, tasks);
        // Capture has stopped: the aggregator's last window is still to be named.
        if let Some(registry) = self.registry.take() {
            registry.run();
        }
    }

    /// Serves the process registry's waiting asks (this thread is its one writer) and
    /// applies the exit events its window ends decided to the loader's own state.
    pub(super) fn serve_registry(&mut self) {
        let Some(registry) = self.registry.as_mut() else {
            return;
        };
        // The aggregator gone (the agent stopping) leaves nothing to serve.
        let _ = registry.serve();
        for e in registry.exits() {
            self.drop_python(e.pid, Some(e.start_time));
        }
    }

    /// [`Loader::run`] until capture stops or the loader is halted.
    fn follow(&mut self, preload: &[u32], work: WorkReceiver, tasks: Option<TaskLink>) {
        for &pid in preload {
            self.serve_registry();
            self.load(pid);
        }
        let mut q = Queued {
            only: preload.iter().copied().collect(),
            whole_since: tasks.is_some().then(now_ns),
            ..Default::default()
        };
        let every = if tasks.is_some() {
            SWEEP_EVERY
        } else {
            SWEEP_EVERY_UNFOLLOWED
        };
        let lost = |t: &Option<TaskLink>| t.as_ref().is_some_and(TaskLink::take_lost);
        let _stop_reader = StopOnDrop(tasks.clone());
        let mut last_sweep = Instant::now();
        // What the aggregator asked before this thread started (later asks wake it).
        self.serve_registry();
        while !self.halted() {
            // Asleep until work comes or a sweep is due; never while asks wait.
            let wait = if q.asked.is_empty() && q.unread.is_empty() {
                let sweep = every.saturating_sub(last_sweep.elapsed());
                let retry = self.python.as_ref().and_then(|p| p.next_retry());
                let wait = retry.map_or(sweep, |at| {
                    sweep.min(at.saturating_duration_since(Instant::now()))
                });
                // Processes held back by the rate: until the next read is allowed.
                if q.dirty.is_empty() {
                    wait
                } else {
                    wait.min(q.reads.next())
                }
            } else {
                Duration::ZERO
            };
            match work.recv_timeout(wait) {
                Ok(w) => {
                    let task = matches!(w, Work::Task(_));
                    self.take(w, &mut q);
                    // ld.so maps a program's libraries within a millisecond or two of
                    // its exec: take those too, so a process is read once, not per library.
                    let settle = Instant::now() + SETTLE;
                    while let Some(w) = task
                        .then(|| {
                            work.recv_timeout(settle.saturating_duration_since(Instant::now()))
                        })
                        .and_then(Result::ok)
                    {
                        self.take(w, &mut q);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            loop {
                if self.halted() {
                    return;
                }
                // Records first: each is a few microseconds and may be a new process about
                // to be sampled, or the exit of one waiting here (never read, then).
                while let Ok(w) = work.try_recv() {
                    self.take(w, &mut q);
                }
                // Then the processes being sampled: their samples are named from this read
                // (a 30 ms process is gone if it waits behind the aggregator's asks).
                if !self.read_unread(&mut q) {
                    return;
                }
                // Then the aggregator's asks: it waits for them (each one wakes this loop).
                self.serve_registry();
                if q.dirty.is_empty() || !q.reads.try_take() {
                    break;
                }
                let Some(pid) = q.dirty.pop_first() else {
                    break;
                };
                q.unread.remove(&pid);
                self.load(pid);
            }
            // A few asks a round: they may compile tables (tens of ms for a big object), and
            // new processes' records come first.
            for _ in 0..ASKS_PER_ROUND {
                if self.halted() {
                    return;
                }
                let Some(pid) = q.asked.pop_first() else {
                    break;
                };
                self.serve_registry();
                self.load(pid);
            }
            self.retry_python();
            let lost = lost(&tasks);
            if lost {
                q.whole_since = Some(now_ns());
            }
            if lost || last_sweep.elapsed() >= every {
                last_sweep = Instant::now();
                self.sweep();
            }
        }
    }

    fn halted(&self) -> bool {
        self.halt.load(Ordering::Relaxed)
    }

    /// Reads every sampled process that waits in `unread` (not a read of the rate: these
    /// are processes the sampler is naming, a few hundred a second at most), unless a read
    /// since its sample covers it; false if the loader was halted meanwhile.
    pub(super) fn read_unread(&mut self, q: &mut Queued) -> bool {
        while let Some((pid, at)) = q.unread.pop_first() {
            if self.halted() {
                return false;
            }
            if self.procs.get(pid).is_some_and(|p| p.read_ns >= at) {
                continue;
            }
            // This read covers its exec and mmap records too.
            q.dirty.remove(&pid);
            if q.sampled.len() < MAX_ASKED {
                q.sampled.insert(pid);
            }
            self.load(pid);
        }
        true
    }

    /// Files one piece of work: a task record is applied, an ask waits in `asked` (one per
    /// process, at most [`MAX_ASKED`]; more are dropped, counted, and asked again later).
    pub(super) fn take(&mut self, w: Work, q: &mut Queued) {
        match w {
            Work::Task(ev) => self.on_task(ev, q),
            Work::Ask(Ask::Remap(pid)) if q.read_covers(pid, &self.procs) => {
                self.metrics.unwind_remaps_skipped.inc();
            }
            Work::Ask(Ask::Process(pid)) | Work::Ask(Ask::Remap(pid)) => {
                if q.asked.len() < MAX_ASKED || q.asked.contains(&pid) {
                    q.asked.insert(pid);
                } else {
                    self.metrics.dropped(Cache::UnwindRequests, 1);
                }
            }
            Work::Ask(Ask::Unread { pid, at }) => {
                if !q.follows(pid) {
                    return;
                }
                if q.unread.len() < MAX_ASKED || q.unread.contains_key(&pid) {
                    let latest = q.unread.entry(pid).or_insert(at);
                    *latest = (*latest).max(at);
                } else {
                    self.metrics.dropped(Cache::UnwindRequests, 1);
                }
            }
            Work::Wake => {}
        }
    }

    /// Applies one task record: exits and execs drop a process's ranges at once (its pid may
    /// be reused), forks copy the parent's, new executable mappings of known objects are
    /// added at once, and execs and mappings mark the process to be read in full.
    pub(super) fn on_task(&mut self, ev: TaskEvent, q: &mut Queued) {
        let pid = match &ev {
            TaskEvent::Exec { pid, .. }
            | TaskEvent::Fork { pid, .. }
            | TaskEvent::Exit { pid, .. } => *pid,
            TaskEvent::Mmap(m) => m.pid,
        };
        if let TaskEvent::Fork { pid, ppid, .. } = &ev {
            self.adopt_child(*pid, *ppid, q);
        }
        if pid == std::process::id() || !q.follows(pid) {
            return;
        }
        // A record older than the loader's last full read of the process (an ask for it
        // came first): that read saw what the record tells.
        let stamp = match &ev {
            TaskEvent::Exec { time_ns, .. } => Some(*time_ns),
            TaskEvent::Mmap(m) => Some(m.time_ns),
            TaskEvent::Fork { .. } | TaskEvent::Exit { .. } => None,
        };
        if stamp.is_some_and(|t| self.procs.get(pid).is_some_and(|p| p.read_ns > t)) {
            return;
        }
        match ev {
            TaskEvent::Exit { pid, .. } => {
                q.children.remove(&pid);
                q.unread.remove(&pid);
                q.sampled.remove(&pid);
                if q.dirty.remove(&pid) && q.reads.next() > Duration::ZERO {
                    // Exited while the rate held its read back.
                    self.metrics.dropped(Cache::ProcessReads, 1);
                }
                self.exited(pid, None);
                if self.io.exec_hook() {
                    // The exec hook may have made an entry this loader never read.
                    self.io.delete_proc(pid);
                }
            }
            TaskEvent::Exec { pid, .. } => {
                // Another program: sampled or not, it is read afresh.
                q.sampled.remove(&pid);
                if self.io.exec_hook() {
                    // The hook already replaced the entry with the new program's ranges.
                    self.procs.take(pid);
                    self.procs.forget_empty(pid);
                } else {
                    self.forget(pid);
                }
                self.mark_dirty(pid, q);
            }
            TaskEvent::Fork { pid, ppid, .. } => self.fork(pid, ppid),
            TaskEvent::Mmap(m) => {
                if m.prot & libc::PROT_EXEC as u32 != 0 {
                    // With the exec hook, the walker finds a new library itself (and this
                    // loader's partial view of the process would overwrite the hook's ranges).
                    if !self.io.exec_hook() {
                        self.fast_mmap(&m);
                    }
                    if q.sampled.contains(&m.pid) {
                        // Being sampled: its samples in the library are named from the read.
                        let at = q.unread.entry(m.pid).or_insert(m.time_ns);
                        *at = (*at).max(m.time_ns);
                    } else {
                        self.mark_dirty(m.pid, q);
                    }
                }
            }
        }
    }

    /// With `sampling.subprocesses`, follows `pid` if its parent `ppid` is followed and
    /// not every process is (the sampler samples it: `ember_fork` put it in `pid_filter`).
    fn adopt_child(&self, pid: u32, ppid: u32, q: &mut Queued) {
        if !self.subprocesses || q.only.is_empty() || !q.follows(ppid) || q.follows(pid) {
            return;
        }
        if q.children.len() < MAX_CHILDREN {
            q.children.insert(pid);
        } else {
            self.metrics.dropped(Cache::UnwindProcesses, 1);
        }
    }

    /// Queues `pid` for a full read, unless [`MAX_DIRTY`] wait already (counted).
    fn mark_dirty(&self, pid: u32, q: &mut Queued) {
        if q.dirty.len() < MAX_DIRTY || q.dirty.contains(&pid) {
            q.dirty.insert(pid);
        } else {
            self.metrics.dropped(Cache::ProcessReads, 1);
        }
    }

    /// A child starts with its parent's mappings: the same ranges, no /proc read.
    fn fork(&mut self, pid: u32, ppid: u32) {
        let Some(parent) = self.procs.get(ppid) else {
            return;
        };
        let ranges = parent.ranges.clone();
        let Some(start_time) = procfs::start_time(&self.proc_root, pid) else {
            return;
        };
        if !self.make_room(PROC_COST) {
            self.metrics.dropped(Cache::UnwindProcesses, 1);
            return;
        }
        // The exec hook may already have written the child's new program (this record can
        // come after the exec): never overwrite that with the parent's ranges.
        let only_new = self.io.exec_hook();
        if self.write_proc(pid, &ranges, only_new) {
            self.procs.put(
                pid,
                Proc {
                    start_time,
                    ranges,
                    read_ns: 0,
                },
            );
        }
    }

    /// The one way an exit is applied, decided by an exit record (`start_time` `None`: of
    /// whichever process runs on `pid`) or a sweep (of the process started at
    /// `start_time`, whose pid names another or none now): its ranges, its Python attach
    /// state, and the registry's table, which forgets it after its last window.
    pub(super) fn exited(&mut self, pid: u32, start_time: Option<u64>) {
        let known = self.procs.get(pid).map(|p| p.start_time);
        self.forget(pid);
        self.drop_python(pid, start_time);
        if let Some(registry) = self.registry.as_mut() {
            registry.exited(pid, start_time.or(known));
        }
    }

    /// Drops a process's ranges (it exited, or exec'd into another program).
    pub(super) fn forget(&mut self, pid: u32) {
        self.procs.forget_empty(pid);
        if self.procs.take(pid).is_some() {
            self.io.delete_proc(pid);
        }
    }

    /// Adds a new executable mapping of a known object to its process's ranges straight from
    /// its mmap record, so the sampler can walk it within microseconds of the mmap; false if
    /// the object is not known yet (the full read after the process settles handles it).
    pub(super) fn fast_mmap(&mut self, m: &Mmap) -> bool {
        let file = (m.dev, m.inode);
        let Some(key) = self.procs.inode_table(&file) else {
            return false;
        };
        let Some(table) = self.slots.table(&key).filter(|t| t.id.is_some()) else {
            return false;
        };
        let Ok(len) = u32::try_from(m.len) else {
            return false;
        };
        let bias = bias(&table.segments, m.start, m.pgoff);
        let (start_time, ranges, read_ns) = match self.procs.get(m.pid) {
            Some(p) => (p.start_time, p.ranges.clone(), p.read_ns),
            None => {
                let Some(start_time) = procfs::start_time(&self.proc_root, m.pid) else {
                    return false;
                };
                if !self.make_room(PROC_COST) {
                    return false;
                }
                (start_time, Vec::new(), 0)
            }
        };
        let new = Range {
            start: m.start,
            len,
            bias,
            table: Some(key),
            file: Some(file),
        };
        let ranges = with_mapping(&ranges, new);
        let ok = self.write_proc(m.pid, &ranges, false);
        if ok {
            self.procs.put(
                m.pid,
                Proc {
                    start_time,
                    ranges,
                    read_ns,
                },
            );
        } else {
            self.procs.take(m.pid);
        }
        ok
    }

    /// Forgets processes that exited (or whose pid now names another process).
    pub fn sweep(&mut self) {
        let root = self.proc_root.clone();
        for (pid, start_time) in self.procs.gone(&root) {
            self.exited(pid, Some(start_time));
        }
        if self.io.exec_hook() {
            // Entries the exec hook made for processes that ended before this loader read
            // them (their exit record lost to a full ring).
            let stale: Vec<u32> = self
                .io
                .proc_pids()
                .into_iter()
                .filter(|&pid| !self.procs.contains(pid) && !root.join(pid.to_string()).exists())
                .collect();
            for pid in stale {
                self.io.delete_proc(pid);
            }
        }
        self.procs.sweep_empty(&root);
        self.report();
    }
}
