//! Aggregation stage: counts samples per (process, thread, stack) for one window, then
//! has the process registry name every distinct stack's user addresses.
//!
//! In: sample batches from capture. Out: one [`Window`] per window length (to symbolize)
//! and [`Control`] orders back to capture. [`Aggregator::run`] is the stage's thread loop.
//! It only counts: it opens no file and holds no process table; what a process is (its
//! name, cgroup, mappings, runtime) it asks of [`crate::process::registry`], whose thread
//! reads `/proc` (`tests/modgraph.py` checks that this room names no file API).

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant, SystemTime};

use crate::capture::{Batch, Control, QueueBytes, CGROUP_DENY_ENTRIES};
use crate::config::{Limits, Python};
use crate::metrics::{Cache, Loss, Metrics};
use crate::model::{
    self, LockWait, OffCpu, OffState, ProfileKind, PyFrameRef, PyWalk, Sample, StackEnd,
};
use crate::process::registry::{Exit, Named, Processes, Touch};
use crate::process::table::UserAddr;

mod closes;
mod frames;
mod offwindows;
use closes::until_boundary;
pub use closes::Closes;
use frames::{frames_of, Lookups, Slot};
use offwindows::OffWindows;

/// How often the aggregator's loop goes round while no samples arrive (and no window is
/// due): it tells the progress watch it is alive.
const IDLE_POLL: Duration = Duration::from_secs(2);
/// Samples of a batch added between two looks at the window's deadline (a look is one
/// clock read).
const CLOSE_CHECK: usize = 64;
use crate::workload::gate::{Candidate, Gate, Judged, Order, Orders};
use crate::workload::kube::Metadata;
use crate::workload::{Accounting, Filter};

/// One frame of a normalized stack. The user side holds the open object file it is in
/// ([`UserAddr`]): the symbolizer reads it after the process is gone.
#[derive(Debug, Clone)]
pub enum Frame {
    /// A kernel address.
    Kernel(u64),
    /// A user address, normalized.
    User(UserAddr),
}

/// A distinct stack of one thread, its frames normalized.
pub type Stack = model::Stack<Frame>;

/// One closed window, ready to symbolize.
pub type Window = model::Window<Frame>;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    pid: u32,
    /// [`Sample::start_time`]: two processes on one pid in a window are two stacks.
    start_time: u64,
    tid: u32,
    comm: [u8; 16],
    kernel: Box<[u64]>,
    user: Box<[u64]>,
    /// [`Sample::user_exact`].
    user_exact: u128,
    /// [`Sample::user_eval`].
    user_eval: u128,
    /// [`Sample::python`].
    python: Box<[PyFrameRef]>,
    /// [`Sample::py_result`].
    py: Option<PyWalk>,
    end: StackEnd,
    /// `None` for CPU samples.
    off: Option<OffState>,
    /// The window the stack goes to.
    kind: ProfileKind,
    /// Off-CPU stacks: the lock waited for, if any (it picks the `lock` window).
    lock: Option<LockWait>,
    /// `offwake` and `lock` stacks: the thread that woke the block (every off-CPU stack
    /// while counted: see [`Aggregator::fan_out`]).
    waker: Option<Box<WakerKey>>,
}

/// A window's counts by stack.
type Counts = HashMap<Key, Tally, foldhash::quality::RandomState>;

/// The waker of an off-CPU block, as its stack's key holds it (its tid left out: wakers
/// are told apart by process, name and stack).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct WakerKey {
    pid: u32,
    start_time: u64,
    comm: [u8; 16],
    kernel: Box<[u64]>,
    user: Box<[u64]>,
    user_exact: u128,
}

/// What the samples of one key add up to.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    count: u64,
    /// Off-CPU nanoseconds.
    ns: u64,
}

/// What the aggregator needs to attribute samples to workloads and filter them.
#[derive(Default)]
pub struct Workloads {
    /// Kubernetes pod metadata, when enabled.
    pub metadata: Option<Metadata>,
    /// The include/exclude rules.
    pub filter: Filter,
    /// Per-container CPU series.
    pub accounting: Option<Accounting>,
    /// Where to send BPF deny orders for excluded workloads.
    pub control: Option<SyncSender<Control>>,
}

/// Per-window sample counts, named at the window's end by the process registry.
///
/// Each field has one job: the counting is `tallies` (the CPU window) and `off` (the
/// off-CPU windows), the verdicts and BPF orders are the `gate`'s (`crate::workload`), the
/// per-container series `accounting`'s, what a process is the registry's (`processes`).
pub struct Aggregator {
    /// The registry that names the stacks' processes and addresses (on its own thread).
    processes: Processes,
    /// The current window's counts, under the stack and byte caps.
    tallies: Tallies,
    /// The off-CPU kinds made beside the CPU windows, and their stacks until their window
    /// (`offcpu.window`) ends.
    off: Off,
    /// When the current period began, and what a sample stands for.
    period: Period,
    /// See [`Python::keep_eval_frames`].
    keep_eval_frames: bool,
    metrics: Metrics,
    /// Which processes' samples are kept; the BPF deny and allow orders and their retries.
    gate: Gate,
    /// Per-container CPU series.
    accounting: Option<Accounting>,
    /// The sample queue's byte budget, given back as batches arrive.
    queue_bytes: Option<QueueBytes>,
}

/// A window's counts by stack, under its two caps.
struct Tallies {
    counts: Counts,
    max_stacks: usize,
    /// Bytes of the distinct stacks in `counts`, and their cap.
    bytes: u64,
    max_bytes: u64,
}

/// The off-CPU windows: the kinds made, and their stacks summed since their window began.
struct Off {
    kinds: Vec<ProfileKind>,
    windows: OffWindows,
}

/// The current period of the CPU window.
struct Period {
    /// Windows end on multiples of their length on the wall clock (`run`).
    align: bool,
    /// Nanoseconds one sample stands for (`sampling.frequency_hz`).
    ns: u64,
    start: SystemTime,
    started: Instant,
}

/// What an aggregator is made of: its settings, where it counts, and what it attributes
/// samples to workloads with.
pub struct Parts {
    /// `sampling.frequency_hz`: the CPU time one sample stands for.
    pub frequency_hz: u64,
    /// `limits:`: the stacks of a window.
    pub limits: Limits,
    /// The process registry's handle ([`crate::process::registry::start`]).
    pub processes: Processes,
    /// `offcpu.enabled`: an off-CPU window is made beside each CPU window.
    pub offcpu: bool,
    /// `offcpu.wakers` (with `offcpu`): an `offwake` window too.
    pub offwake: bool,
    /// `offcpu.locks` (with `offcpu`): a `lock` window too.
    pub lock: bool,
    /// `offcpu.window`: the off-CPU windows' length.
    pub offcpu_window: Duration,
    /// `interpreters.python`: eval loop frames kept or not.
    pub python: Python,
    /// The sample queue's byte budget, given back as batches arrive (see [`QueueBytes`]).
    pub queue_bytes: Option<QueueBytes>,
    /// Where it counts.
    pub metrics: Metrics,
    /// Pod metadata, filters, per-container accounting, and the orders to capture.
    pub workloads: Workloads,
}

impl Aggregator {
    /// A new aggregator for samples taken at `parts.frequency_hz`, keeping at most
    /// `limits.max_stacks_per_window` stacks.
    pub fn new(parts: Parts) -> Self {
        let Parts {
            frequency_hz,
            limits,
            processes,
            offcpu,
            offwake,
            lock,
            offcpu_window,
            python,
            queue_bytes,
            metrics,
            workloads,
        } = parts;
        let Workloads {
            metadata,
            filter,
            accounting,
            control,
        } = workloads;
        let orders =
            control.map(|tx| -> Orders { Box::new(move |o| tx.try_send(control_of(o)).is_ok()) });
        let gate = Gate::new(
            metadata,
            filter,
            orders,
            CGROUP_DENY_ENTRIES as usize,
            metrics.clone(),
        );
        Self {
            processes,
            tallies: Tallies {
                counts: HashMap::default(),
                max_stacks: limits.max_stacks_per_window,
                bytes: 0,
                max_bytes: limits.max_stack_bytes_per_window,
            },
            queue_bytes,
            off: Off {
                kinds: [
                    (offcpu, ProfileKind::OffCpu),
                    (offcpu && offwake, ProfileKind::OffWake),
                    (offcpu && lock, ProfileKind::Lock),
                ]
                .into_iter()
                .filter_map(|(on, k)| on.then_some(k))
                .collect(),
                windows: OffWindows::new(
                    offcpu_window,
                    limits.max_stacks_per_window,
                    limits.max_stack_bytes_per_window,
                ),
            },
            period: Period {
                align: false,
                ns: 1_000_000_000 / frequency_hz.max(1),
                start: SystemTime::now(),
                started: Instant::now(),
            },
            keep_eval_frames: python.keep_eval_frames,
            metrics,
            gate,
            accounting,
        }
    }

    /// Counts one sample; its thread (and its waker's) is told to the process registry,
    /// which reads a process it does not know.
    pub fn add(&mut self, s: Sample) {
        if let Some(gone) = self.processes.tick() {
            self.gate.allow_gone(gone.into_iter().map(|e| e.pid));
        }
        if self.gate.denied(s.pid) {
            self.metrics.samples_filtered.inc();
            return;
        }
        let mut touches = [
            Some(Touch {
                pid: s.pid,
                tid: s.tid,
                comm: s.comm,
                cgroup_id: s.cgroup_id,
                start_time: s.start_time,
            }),
            None,
        ];
        if let Some(r) = s.py_result {
            self.metrics.python_walked(r, 1);
        }
        let (ns, blocks) = s.off_cpu.map_or((0, 1), |o| (o.ns, o.blocks.max(1)));
        let waker = s.waker.map(|w| {
            touches[1] = Some(Touch {
                pid: w.pid,
                tid: w.tid,
                comm: w.comm,
                cgroup_id: w.cgroup_id,
                start_time: w.start_time,
            });
            Box::new(WakerKey {
                pid: w.pid,
                start_time: w.start_time,
                comm: w.comm,
                kernel: w.kernel.into_boxed_slice(),
                user: w.user.into_boxed_slice(),
                user_exact: w.user_exact,
            })
        });
        // An off-CPU sample is counted once, with its waker and lock wait; the windows it
        // goes to are told apart at the close, once per distinct stack
        // ([`Aggregator::fan_out`]), not at every sample: a host with a thousand blocks a
        // second hashed and copied each stack three times.
        let kind = if s.off_cpu.is_some() {
            ProfileKind::OffCpu
        } else {
            ProfileKind::Cpu
        };
        let key = Key {
            pid: s.pid,
            start_time: s.start_time,
            tid: s.tid,
            comm: s.comm,
            kernel: s.kernel.into_boxed_slice(),
            user: s.user.into_boxed_slice(),
            user_exact: s.user_exact,
            user_eval: s.user_eval,
            python: s.python.into_boxed_slice(),
            py: s.py_result,
            end: s.user_end,
            off: s.off_cpu.map(|o| o.state),
            kind,
            lock: s.off_cpu.and(s.lock),
            waker,
        };
        // Its threads are told to the registry with the first sample of a stack in the
        // window, not with every sample: the same stack again names the same threads (and
        // the registry hears of each thread once a window anyway).
        if self.count(key, ns, blocks) {
            for t in touches.into_iter().flatten() {
                self.processes.touch(t);
            }
        }
    }

    /// The windows an off-CPU stack counted in `counts` goes to, and whether with its
    /// waker: to the off-CPU window (without it); its blocked time with its waker to
    /// `offwake` (the runnable part after the wakeup is not the waker's doing); a futex
    /// wait (both parts, with the waker if any) to `lock`; kernel lock contention to `lock`
    /// only. Only the kinds configured.
    fn kinds_of(&self, key: &Key) -> Vec<(ProfileKind, bool)> {
        let on = |k| self.off.kinds.contains(&k);
        if key.lock == Some(LockWait::Kernel) {
            return [(ProfileKind::Lock, false)]
                .into_iter()
                .filter(|(k, _)| on(*k))
                .collect();
        }
        let woken = key.waker.is_some() && key.off != Some(OffState::Runnable);
        [
            (ProfileKind::OffCpu, true, false),
            (ProfileKind::OffWake, woken, true),
            (ProfileKind::Lock, key.lock == Some(LockWait::Futex), true),
        ]
        .into_iter()
        .filter(|&(k, wanted, _)| wanted && on(k))
        .map(|(k, _, joined)| (k, joined))
        .collect()
    }

    /// Spreads the off-CPU stacks of `counts` over the windows they go to
    /// ([`Aggregator::kinds_of`]): stacks that differ only by their waker are one in the
    /// off-CPU window. CPU stacks stay as they are.
    fn fan_out(&self, counts: Counts) -> Counts {
        let mut out = Counts::with_capacity_and_hasher(counts.len(), Default::default());
        for (key, tally) in counts {
            if key.kind == ProfileKind::Cpu {
                out.insert(key, tally);
                continue;
            }
            let kinds = self.kinds_of(&key);
            let mut key = Some(key);
            for (i, &(kind, joined)) in kinds.iter().enumerate() {
                let Some(k) = (if i + 1 == kinds.len() {
                    key.take()
                } else {
                    key.clone()
                }) else {
                    break;
                };
                let waker = if joined { k.waker } else { None };
                // The lock waited for only picks the window: not part of a stack.
                let t = out
                    .entry(Key {
                        kind,
                        waker,
                        lock: None,
                        ..k
                    })
                    .or_default();
                t.count += tally.count;
                t.ns += tally.ns;
            }
        }
        out
    }

    /// Adds `blocks` samples of `key` (and their off-CPU nanoseconds), within the window's
    /// caps, which the off-CPU stacks summed since their window began count toward too:
    /// everything the stage holds stays under one window's caps. Whether the stack is new
    /// in the window (counted, or lost to a cap).
    fn count(&mut self, key: Key, ns: u64, blocks: u64) -> bool {
        let bytes = stack_bytes(&key);
        let t = &mut self.tallies;
        let full = t.counts.len() + self.off.windows.len() >= t.max_stacks
            || t.bytes
                .saturating_add(self.off.windows.bytes())
                .saturating_add(bytes)
                > t.max_bytes;
        match t.counts.get_mut(&key) {
            Some(t) => {
                t.count += blocks;
                t.ns += ns;
                return false;
            }
            None if full => self.metrics.lost(Loss::StackCap, blocks),
            None => {
                t.counts.insert(key, Tally { count: blocks, ns });
                t.bytes += bytes;
            }
        }
        true
    }

    /// Closes the window: normalizes its stacks and starts the next one. Returns the CPU
    /// window (off-CPU stacks, if any, are dropped: see [`Aggregator::close_windows`]).
    pub fn close(&mut self) -> Window {
        let mut windows = self.close_windows();
        windows.swap_remove(0)
    }

    /// Closes the window: the CPU window, then (with `offcpu.enabled`) the off-CPU ones,
    /// however long they have been open (see [`Aggregator::close_period`]).
    pub fn close_windows(&mut self) -> Vec<Window> {
        self.close_period(true)
    }

    /// Closes the CPU window and starts the next; its off-CPU stacks join the off-CPU
    /// windows, which close too when `off_due`. Returns the CPU window, then the off-CPU
    /// windows if they closed.
    fn close_period(&mut self, off_due: bool) -> Vec<Window> {
        let counts = self.take_counts();
        let verdicts = self.judge(&counts);
        let kept = self.keep(counts, &verdicts);
        let (stacks, off_stacks, gone) = self.stacks_of(kept);
        for (kind, v) in off_stacks {
            self.off.windows.add(kind, v, &self.metrics);
        }
        self.end_accounting();
        self.gate.end_window(gone.into_iter().map(|e| e.pid));
        self.take_windows(stacks, off_due)
    }

    /// Takes the window's counts, spread over the windows they go to; the next window's
    /// counts start empty.
    fn take_counts(&mut self) -> Counts {
        let counts = std::mem::take(&mut self.tallies.counts);
        self.tallies.bytes = 0;
        self.fan_out(counts)
    }

    /// The gate's verdict on every process (pid and start time) with a stack in `counts`,
    /// judged by what the registry knows of it.
    fn judge(&mut self, counts: &Counts) -> HashMap<(u32, u64), Option<Judged>> {
        let procs: HashSet<(u32, u64)> = counts.keys().map(|k| (k.pid, k.start_time)).collect();
        let procs: Vec<(u32, u64)> = procs.into_iter().collect();
        let facts = self.processes.facts(procs.clone());
        let verdicts = self
            .gate
            .judge(procs.iter().zip(facts).map(|(&(pid, _), f)| Candidate {
                pid,
                cgroup: f.cgroup,
                name: f.name,
            }));
        procs.into_iter().zip(verdicts).collect()
    }

    /// The stacks of `counts` the gate let through, with their labels; the others' samples
    /// count as filtered.
    fn keep(
        &self,
        counts: Counts,
        verdicts: &HashMap<(u32, u64), Option<Judged>>,
    ) -> Vec<(Key, Tally, Judged)> {
        let mut kept = Vec::with_capacity(counts.len());
        for (key, tally) in counts {
            match verdicts.get(&(key.pid, key.start_time)) {
                Some(Some(labels)) => kept.push((key, tally, labels.clone())),
                _ => {
                    self.metrics.samples_filtered.inc_by(tally.count);
                }
            }
        }
        kept
    }

    /// The `kept` stacks, their user frames named by the registry (which ends its window
    /// with them) and labelled: the CPU ones in a stable order, the off-CPU ones by kind;
    /// and the processes the registry's window end forgot.
    fn stacks_of(
        &mut self,
        kept: Vec<(Key, Tally, Judged)>,
    ) -> (Vec<Stack>, HashMap<ProfileKind, Vec<Stack>>, Vec<Exit>) {
        let mut lookups = Lookups::default();
        let plans: Vec<Vec<Slot>> = kept
            .iter()
            .map(|(key, ..)| self.plan(key, &mut lookups))
            .collect();
        let closed = self.processes.close(lookups.into_ask());
        let mut stacks = Vec::with_capacity(kept.len());
        let mut off_stacks: HashMap<ProfileKind, Vec<Stack>> = HashMap::new();
        for (((key, tally, labels), slots), named) in kept.into_iter().zip(plans).zip(closed.stacks)
        {
            let kind = key.kind;
            let frames = frames_of(slots, &closed.addrs);
            let stack = self.stack_of(key, tally, labels, frames, named);
            if kind == ProfileKind::Cpu {
                stacks.push(stack);
            } else {
                off_stacks.entry(kind).or_default().push(stack);
            }
        }
        // Stable order makes output deterministic and diffable.
        stacks.sort_by(|a, b| (a.pid, a.tid, b.count).cmp(&(b.pid, b.tid, a.count)));
        (stacks, off_stacks, closed.gone)
    }

    /// One distinct stack of the window, made of `slots` with the registry's answers
    /// (`named`): counted toward its container and the stack-end metrics.
    fn stack_of(
        &mut self,
        key: Key,
        tally: Tally,
        labels: Judged,
        frames: Vec<Frame>,
        named: Named,
    ) -> Stack {
        let Named {
            runtime,
            name_before,
            name,
        } = named;
        let count = tally.count;
        let off_cpu = key.off.map(|state| OffCpu {
            state,
            ns: tally.ns,
            blocks: count,
        });
        self.account(
            &key,
            (count, off_cpu),
            &labels,
            runtime.as_ref(),
            &name_before,
        );
        let comm_len = key
            .comm
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(key.comm.len());
        Stack {
            pid: key.pid,
            tid: key.tid,
            comm: String::from_utf8_lossy(&key.comm[..comm_len]).into_owned(),
            process: name,
            labels,
            frames,
            count,
            off_cpu,
            runtime,
        }
    }

    /// Counts a stack (`count` samples, off-CPU or not) toward its container's series (CPU
    /// seconds, off-CPU and lock time) and, for CPU stacks, the stack-end metrics of its
    /// process `name`.
    fn account(
        &mut self,
        key: &Key,
        (count, off_cpu): (u64, Option<OffCpu>),
        labels: &Judged,
        runtime: Option<&crate::model::Runtime>,
        name: &str,
    ) {
        match off_cpu {
            None => {
                if let Some(acc) = &mut self.accounting {
                    acc.add(labels, (count * self.period.ns) as f64 / 1e9);
                }
                let workload = self.metrics.workload_label(labels.workload(name));
                self.metrics.stacks_ended(&workload, key.end, count);
                if let (Some(rt), Some(r)) = (runtime, key.py) {
                    self.metrics
                        .interpreter_stacks_ended(&workload, rt.name, r, count);
                }
            }
            Some(o) => {
                if let Some(acc) = &mut self.accounting {
                    match key.kind {
                        ProfileKind::OffCpu => acc.add_offcpu(labels, o.state, o.ns as f64 / 1e9),
                        ProfileKind::Lock => acc.add_lock(labels, o.ns as f64 / 1e9),
                        ProfileKind::Cpu | ProfileKind::OffWake => {}
                    }
                }
            }
        }
    }

    /// Ends the window of the per-container series; pods a synced watch no longer lists are
    /// forgotten (only a synced watch tells a deleted pod from one not listed yet).
    fn end_accounting(&mut self) {
        if let Some(acc) = &mut self.accounting {
            if let Some(md) = self.gate.metadata().filter(|m| m.fresh()) {
                acc.forget_deleted_pods(|uid| md.by_pod_uid(uid).is_empty());
            }
            acc.end_window();
        }
    }

    /// The period's windows: the CPU window of `stacks`, then the off-CPU windows when
    /// `off_due`. The next period starts now.
    fn take_windows(&mut self, stacks: Vec<Stack>, off_due: bool) -> Vec<Window> {
        let now = SystemTime::now();
        let p = &mut self.period;
        let mut windows = vec![Window {
            start: p.start,
            duration: p.started.elapsed(),
            period_ns: p.ns,
            kind: ProfileKind::Cpu,
            stacks,
        }];
        if off_due && !self.off.kinds.is_empty() {
            let next = until_boundary(self.off.windows.length(), p.align);
            windows.extend(self.off.windows.take(&self.off.kinds, p.ns, next));
        }
        p.start = now;
        p.started = Instant::now();
        windows
    }
}

impl Aggregator {
    /// The stage's thread: adds every batch from `rx` and sends the windows of a period
    /// (CPU, then the off-CPU kinds) into `tx` at each boundary `closes` sets, together, so
    /// they are named in one pass (a full queue drops them and counts them); when capture
    /// stops and `rx` is drained, sends the last period and returns. With
    /// [`Closes::AtEnd`] that last period is the only one.
    ///
    /// A window closes at its boundary whatever waits in `rx`: the deadline is checked
    /// before each receive and every [`CLOSE_CHECK`] samples of a batch, never only when the
    /// queue runs dry. A host that keeps this thread busy (a spawn storm: every new process
    /// sampled was a `/proc` read here before the registry took them, and under a CPU limit
    /// the queue never empties) used to hold the window until the queue drained, for over a
    /// minute; now samples that arrive late go to the next window and the window closes on
    /// time.
    pub fn run(mut self, rx: Receiver<Batch>, tx: SyncSender<Vec<Window>>, closes: Closes) {
        self.period.align = matches!(closes, Closes::Every { align: true, .. });
        let mut deadline = closes.next();
        self.off.windows.deadline =
            Instant::now() + until_boundary(self.off.windows.length(), self.period.align);
        // Some(window) exactly when a boundary has passed.
        let due = |deadline: Option<Instant>| {
            deadline
                .filter(|&d| Instant::now() >= d)
                .and(closes.window())
        };
        loop {
            self.metrics.progress.tick(crate::metrics::Stage::Aggregate);
            if let Some(window) = due(deadline) {
                self.close_into(&tx, window);
                deadline = closes.next();
                continue;
            }
            let left = deadline.map_or(IDLE_POLL, |d| {
                d.saturating_duration_since(Instant::now()).min(IDLE_POLL)
            });
            match rx.recv_timeout(left) {
                Ok(batch) => {
                    if let Some(budget) = &self.queue_bytes {
                        budget.give(crate::capture::batch_bytes(&batch));
                    }
                    for (i, s) in batch.into_iter().enumerate() {
                        if i % CLOSE_CHECK == CLOSE_CHECK - 1 {
                            if let Some(window) = due(deadline) {
                                self.close_into(&tx, window);
                                deadline = closes.next();
                            }
                        }
                        self.add(s);
                    }
                    // The batch's new processes are read now, while they live.
                    self.processes.flush();
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    // Capture has stopped and drained: the last window is complete.
                    let _ = tx.send(self.close_windows());
                    return;
                }
            }
        }
    }

    /// Closes the period's windows and hands them on together; a full queue drops them,
    /// counted. The off-CPU windows close at the first boundary of a `window` at or after
    /// their deadline (half a window early counts: both are the same wall-clock boundary).
    fn close_into(&mut self, tx: &SyncSender<Vec<Window>>, window: Duration) {
        let off_due = Instant::now() + window / 2 >= self.off.windows.deadline;
        let windows = self.close_period(off_due);
        let n: u64 = windows.iter().map(Window::samples).sum();
        if let Err(TrySendError::Full(w)) = tx.try_send(windows) {
            self.metrics.dropped(Cache::WindowQueue, w.len() as u64);
            self.metrics.lost(Loss::WindowQueue, n);
        }
    }
}

/// The sampler's order for a gate's order.
fn control_of(order: Order) -> Control {
    match order {
        Order::DenyPid(pid) => Control::DenyPid(pid),
        Order::AllowPid(pid) => Control::AllowPid(pid),
        Order::DenyCgroup(id) => Control::DenyCgroup(id),
        Order::AllowCgroup(id) => Control::AllowCgroup(id),
    }
}

/// The bytes one distinct stack holds in a window's table: the key, its frames and the
/// hash table's share.
fn stack_bytes(key: &Key) -> u64 {
    let python = std::mem::size_of::<PyFrameRef>() * key.python.len();
    let waker = key.waker.as_ref().map_or(0, |w| {
        std::mem::size_of::<WakerKey>() + 8 * (w.kernel.len() + w.user.len())
    });
    (std::mem::size_of::<Key>() + 16 + 8 * (key.kernel.len() + key.user.len()) + python + waker)
        as u64
}

/// The address to name frame `i` of a stack side by: the leaf is where the CPU was, as
/// is an `exact` frame (see [`Sample::user_exact`]); every other frame is a return
/// address, one past its call instruction.
fn caller(i: usize, addr: u64, exact: bool) -> u64 {
    if i == 0 || exact {
        addr
    } else {
        addr.saturating_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    fn sample(pid: u32, tid: u32, user: &[u64]) -> Sample {
        Sample {
            time_ns: 0,
            cgroup_id: 1,
            pid,
            start_time: 0,
            tid,
            cpu: 0,
            comm: *b"worker\0\0\0\0\0\0\0\0\0\0",
            kernel: vec![0xffff_ffff_8100_0010, 0xffff_ffff_8100_0020],
            user: user.to_vec(),
            user_exact: 0,
            user_eval: 0,
            python: Vec::new(),
            py_result: None,
            user_end: StackEnd::Complete,
            off_cpu: None,
            waker: None,
            lock: None,
        }
    }

    fn limits(max_stacks: usize) -> Limits {
        Limits {
            max_processes: 16,
            max_objects: 16,
            max_stacks_per_window: max_stacks,
            ..Default::default()
        }
    }

    /// An aggregator of samples at 99 Hz within `limits`, with the default JIT settings.
    fn parts(limits: Limits, workloads: Workloads) -> Parts {
        Parts {
            frequency_hz: 99,
            processes: processes(&limits),
            limits,
            offcpu: false,
            offwake: false,
            lock: false,
            offcpu_window: Duration::from_secs(10),
            python: Python::default(),
            queue_bytes: None,
            metrics: Metrics::new(),
            workloads,
        }
    }

    /// A process registry within `limits` (its own thread, ending with the aggregator).
    fn processes(limits: &Limits) -> Processes {
        let (jit, python) = (crate::config::Jit::default(), Python::default());
        let started = crate::process::registry::start(limits, &jit, &python, Metrics::new());
        started.expect("registry thread").0
    }

    fn agg(max_stacks: usize) -> Aggregator {
        Aggregator::new(parts(limits(max_stacks), Workloads::default()))
    }

    #[test]
    fn return_addresses_are_named_at_their_call_exact_frames_at_themselves() {
        assert_eq!(caller(0, 0x1000, false), 0x1000);
        assert_eq!(caller(1, 0x1000, false), 0xfff);
        assert_eq!(caller(1, 0x1000, true), 0x1000);
        assert_eq!(caller(2, 0, false), 0);
    }

    #[test]
    fn aligned_boundaries_land_on_multiples() {
        let w = Duration::from_secs(10);
        let left = until_boundary(w, true);
        assert!(
            left >= Duration::from_secs(1) && left <= Duration::from_secs(11),
            "{left:?}"
        );
        let end = SystemTime::now() + left;
        let ms = end
            .duration_since(UNIX_EPOCH)
            .expect("after epoch")
            .as_millis()
            % 10_000;
        assert!(!(50..9_950).contains(&ms), "ends {ms} ms past a boundary");
        assert_eq!(until_boundary(w, false), w);
    }

    #[test]
    fn blocks_go_to_their_windows_with_the_waker_on_top() {
        let mut a = Aggregator::new(Parts {
            offcpu: true,
            offwake: true,
            lock: true,
            ..parts(limits(100), Workloads::default())
        });
        let pid = std::process::id();
        let off = |state, ns| {
            Some(OffCpu {
                state,
                ns,
                blocks: 1,
            })
        };
        let waker = Sample {
            kernel: vec![0xffff_ffff_8100_0100],
            ..sample(pid, pid + 9, &[0x50, 0x60])
        };
        // A futex wait woken by `waker`: its sleep and its runnable part.
        let asleep = Sample {
            off_cpu: off(OffState::Sleep, 700),
            waker: Some(Box::new(waker.clone())),
            lock: Some(LockWait::Futex),
            ..sample(pid, pid, &[0x10])
        };
        let runnable = Sample {
            off_cpu: off(OffState::Runnable, 300),
            ..asleep.clone()
        };
        // A nanosleep woken by a timer, and a kernel lock wait.
        let timer = Sample {
            off_cpu: off(OffState::Sleep, 50),
            waker: Some(Box::new(waker.clone())),
            ..sample(pid, pid, &[0x20])
        };
        // The same wait again, woken by another stack: one off-CPU stack, two wakers.
        let timer_too = Sample {
            off_cpu: off(OffState::Sleep, 40),
            waker: Some(Box::new(Sample {
                kernel: vec![0xffff_ffff_8100_0200],
                ..waker
            })),
            ..sample(pid, pid, &[0x20])
        };
        let klock = Sample {
            off_cpu: off(OffState::Sleep, 5),
            lock: Some(LockWait::Kernel),
            ..sample(pid, pid, &[0x30])
        };
        // The same stack asleep outside a futex: one off-CPU stack with the futex wait.
        let plain = Sample {
            off_cpu: off(OffState::Sleep, 100),
            waker: None,
            lock: None,
            ..asleep.clone()
        };
        for s in [asleep, runnable, timer, timer_too, klock, plain] {
            a.add(s);
        }
        let windows = a.close_windows();
        let kinds: Vec<_> = windows.iter().map(|w| w.kind).collect();
        assert_eq!(kinds, ProfileKind::ALL);
        let ns = |w: &Window| -> Vec<u64> {
            w.stacks
                .iter()
                .map(|s| s.off_cpu.map_or(0, |o| o.ns))
                .collect()
        };
        assert_eq!(ns(&windows[1]), [800, 300, 90], "off-CPU: every block part");
        assert_eq!(
            ns(&windows[2]),
            [700, 50, 40],
            "offwake: blocked time with a waker"
        );
        assert_eq!(
            ns(&windows[3]),
            [700, 300, 5],
            "lock: futex waits, kernel locks"
        );
        // The waker's frames outermost first, its kernel leaf, `--`, the blocked stack.
        let wake = &windows[2].stacks[0];
        let shape: Vec<String> = wake
            .frames
            .iter()
            .map(|f| match f {
                Frame::Kernel(a) => format!("k{a:x}"),
                Frame::User(UserAddr::Unknown(a)) => format!("u{a:x}"),
                Frame::User(UserAddr::Region(l, _)) => l.to_string(),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            shape,
            [
                "u5f",
                "u50",
                "kffffffff81000100",
                "--",
                "kffffffff81000010",
                "kffffffff8100001f",
                "u10"
            ]
        );
        assert!(
            windows[1].stacks.iter().all(|s| s.frames.len() == 3),
            "off-CPU stacks carry no waker"
        );
    }

    #[test]
    fn off_cpu_windows_sum_their_periods_within_the_cap() {
        let mut a = Aggregator::new(Parts {
            offcpu: true,
            offwake: true,
            ..parts(limits(3), Workloads::default())
        });
        let pid = std::process::id();
        // An address in this binary: an object frame, as real stacks have.
        let here = sample as *const () as u64;
        let block = |ns, user: &[u64]| Sample {
            off_cpu: Some(OffCpu {
                state: OffState::Sleep,
                ns,
                blocks: 1,
            }),
            ..sample(pid, pid, user)
        };
        a.add(block(100, &[here]));
        a.add(block(20, &[0x20]));
        a.add(sample(pid, pid, &[here]));
        let first = a.close_period(false);
        let kinds: Vec<_> = first.iter().map(|w| w.kind).collect();
        assert_eq!(kinds, [ProfileKind::Cpu], "off-CPU windows still open");
        // The same wait again, and two more stacks: the two held since the off-CPU window
        // began count toward the cap of 3, so only the first of the three is kept.
        a.add(block(50, &[here]));
        a.add(block(7, &[0x30]));
        a.add(block(9, &[0x40]));
        let second = a.close_period(true);
        let kinds: Vec<_> = second.iter().map(|w| w.kind).collect();
        assert_eq!(
            kinds,
            [ProfileKind::Cpu, ProfileKind::OffCpu, ProfileKind::OffWake]
        );
        assert!(second[0].stacks.is_empty(), "no CPU sample this period");
        let off = &second[1];
        let sums: Vec<(u64, u64)> = off
            .stacks
            .iter()
            .map(|s| (s.count, s.off_cpu.map_or(0, |o| o.ns)))
            .collect();
        assert_eq!(sums, [(2, 150), (1, 20)], "summed, then by time");
        assert!(
            off.duration >= first[0].duration + second[0].duration,
            "the off-CPU window spans both periods"
        );
        assert!(second[2].stacks.is_empty(), "no waker");
        let text = a.metrics.encode();
        assert!(
            text.contains("ember_samples_lost_total{reason=\"stack_cap\"} 2"),
            "{text}"
        );
        // The next off-CPU window starts empty.
        let third = a.close_period(true);
        assert!(third[1].stacks.is_empty());
    }

    /// Issue 53: two processes on one pid in a window are two stacks, each named from its
    /// own process: the one the registry holds (this one) from its mappings, the one it
    /// replaced (an older start time) unknown and unnamed, never from this one's.
    #[test]
    fn a_pid_two_processes_had_in_a_window_is_two_stacks() {
        let mut a = agg(100);
        let pid = std::process::id();
        let start = crate::os::procfs::start_time(std::path::Path::new("/proc"), pid)
            .expect("/proc/self/stat");
        let here = sample as *const () as u64;
        for start_time in [start, start - 1, start] {
            a.add(Sample {
                start_time,
                ..sample(pid, pid, &[here])
            });
        }
        let w = a.close();
        assert_eq!(w.stacks.len(), 2, "{:?}", w.stacks);
        let of = |n: u64| w.stacks.iter().find(|s| s.count == n).expect("a stack");
        let (this, replaced) = (of(2), of(1));
        assert!(matches!(
            this.frames.last(),
            Some(Frame::User(UserAddr::Object(..)))
        ));
        assert!(!this.process.is_empty());
        assert!(
            matches!(
                replaced.frames.last(),
                Some(Frame::User(UserAddr::Unknown(_)))
            ),
            "{:?}",
            replaced.frames
        );
        assert_eq!(replaced.process.as_ref(), "");
    }

    #[test]
    fn counts_identical_stacks_together() {
        let mut a = agg(100);
        let pid = std::process::id();
        for _ in 0..5 {
            a.add(sample(pid, pid, &[0x10, 0x20]));
        }
        a.add(sample(pid, pid + 1, &[0x10, 0x20]));
        a.add(sample(pid, pid, &[0x30]));
        let w = a.close();
        assert_eq!(w.samples(), 7);
        assert_eq!(w.stacks.len(), 3);
        assert_eq!(w.period_ns, 10_101_010);
        let top = &w.stacks[0];
        assert_eq!((top.tid, top.count, top.comm.as_str()), (pid, 5, "worker"));
        assert_eq!(top.frames.len(), 4);
        // Return addresses move back one byte; leaves do not.
        assert!(matches!(
            top.frames[0],
            Frame::Kernel(0xffff_ffff_8100_0010)
        ));
        assert!(matches!(
            top.frames[1],
            Frame::Kernel(0xffff_ffff_8100_001f)
        ));
        assert!(matches!(
            top.frames[2],
            Frame::User(UserAddr::Unknown(0x10))
        ));
        assert!(matches!(
            top.frames[3],
            Frame::User(UserAddr::Unknown(0x1f))
        ));
        assert_eq!(a.close().samples(), 0, "the next window starts empty");
    }

    #[test]
    fn python_frames_go_before_their_eval_frame_which_is_hidden() {
        let pid = std::process::id();
        let py = |before, code| PyFrameRef {
            before,
            code,
            unit: 0,
            fingerprint: 0,
        };
        // Leaf first: native 0x10, eval 0x20 (two Python frames before it), caller 0x30.
        let s = Sample {
            user_eval: 0b010,
            python: vec![py(1, 0xa0), py(1, 0xb0)],
            ..sample(pid, pid, &[0x10, 0x20, 0x30])
        };
        let user = |a: &mut Aggregator, s: Sample| -> Vec<String> {
            a.add(s);
            let w = a.close();
            w.stacks[0].frames[2..]
                .iter()
                .map(|f| match f {
                    Frame::User(UserAddr::Python(p)) => format!("py {:#x}", p.code),
                    Frame::User(UserAddr::Unknown(x)) => format!("{x:#x}"),
                    other => format!("{other:?}"),
                })
                .collect()
        };
        let mut a = agg(100);
        assert_eq!(
            user(&mut a, s.clone()),
            ["0x10", "py 0xa0", "py 0xb0", "0x2f"]
        );
        let mut a = Aggregator::new(Parts {
            python: Python {
                keep_eval_frames: true,
                ..Python::default()
            },
            ..parts(limits(100), Workloads::default())
        });
        assert_eq!(
            user(&mut a, s),
            ["0x10", "py 0xa0", "py 0xb0", "0x1f", "0x2f"]
        );
    }

    #[test]
    fn stack_cap_counts_what_it_drops() {
        let mut a = agg(2);
        let pid = std::process::id();
        for i in 0..5u64 {
            a.add(sample(pid, pid, &[0x100 + i]));
        }
        a.add(sample(pid, pid, &[0x100]));
        let w = a.close();
        assert_eq!(w.stacks.len(), 2);
        assert_eq!(w.samples(), 3, "existing stacks keep counting");
        let text = a.metrics.encode();
        assert!(
            text.contains("ember_samples_lost_total{reason=\"stack_cap\"} 3"),
            "{text}"
        );
    }

    #[test]
    fn stack_bytes_are_capped() {
        let limits = Limits {
            max_stack_bytes_per_window: 1 << 20,
            ..limits(1_000_000)
        };
        let mut a = Aggregator::new(parts(limits, Workloads::default()));
        let pid = std::process::id();
        // 254-frame stacks, each ~2 KiB: about 500 fit in 1 MiB.
        for i in 0..2000u64 {
            let user: Vec<u64> = (0..254).map(|f| 0x1000 + i * 0x10000 + f).collect();
            a.add(sample(pid, pid, &user));
        }
        assert!(a.tallies.bytes <= 1 << 20);
        let w = a.close();
        assert!(
            w.stacks.len() > 100 && w.stacks.len() < 1000,
            "{}",
            w.stacks.len()
        );
        let lost = 2000 - w.stacks.len() as u64;
        let text = a.metrics.encode();
        assert!(
            text.contains(&format!(
                "ember_samples_lost_total{{reason=\"stack_cap\"}} {lost}"
            )),
            "{text}"
        );
        assert_eq!(a.tallies.bytes, 0, "the next window starts empty");
    }

    #[test]
    fn the_sample_queue_is_bounded_in_bytes() {
        let budget = crate::capture::QueueBytes::new(1000);
        assert!(budget.try_take(5000), "an empty queue takes any one batch");
        assert!(!budget.try_take(1));
        budget.give(5000);
        assert!(budget.try_take(600));
        assert!(!budget.try_take(600));
        assert!(budget.try_take(400));
        // The aggregator gives a batch's bytes back as it arrives.
        let (tx, rx) = std::sync::mpsc::sync_channel(4);
        let (wtx, _wrx) = std::sync::mpsc::sync_channel(4);
        let budget = crate::capture::QueueBytes::new(1 << 20);
        let batch = vec![sample(1, 1, &[0x10; 100])];
        let bytes = crate::capture::batch_bytes(&batch);
        assert!(bytes >= 800);
        assert!(budget.try_take(bytes));
        tx.send(batch).expect("send");
        drop(tx);
        let a = Aggregator::new(Parts {
            queue_bytes: Some(budget.clone()),
            ..parts(limits(10), Workloads::default())
        });
        a.run(rx, wtx, every(Duration::from_secs(60)));
        assert_eq!(budget.held(), 0);
    }

    fn every(window: Duration) -> Closes {
        Closes::Every {
            window,
            align: false,
        }
    }

    #[test]
    fn a_recording_closes_its_one_window_when_capture_stops() {
        // `record`: no boundary, however long it runs; the one window holds every sample.
        let (tx, rx) = std::sync::mpsc::sync_channel(4);
        let (wtx, wrx) = std::sync::mpsc::sync_channel(16);
        let a = agg(1 << 20);
        let stage = std::thread::spawn(move || a.run(rx, wtx, Closes::AtEnd));
        tx.send(vec![sample(1, 1, &[0x10])]).expect("send");
        std::thread::sleep(Duration::from_millis(300));
        tx.send(vec![sample(1, 1, &[0x10])]).expect("send");
        std::thread::sleep(Duration::from_millis(300));
        assert!(wrx.try_recv().is_err(), "no window closes before the end");
        drop(tx);
        stage.join().expect("stage");
        let periods: Vec<Vec<Window>> = wrx.try_iter().collect();
        assert_eq!(periods.len(), 1, "one period, at the end");
        let counted: u64 = periods[0].iter().map(|w| w.samples()).sum();
        assert_eq!(counted, 2);
    }

    #[test]
    fn windows_close_on_time_while_the_queue_never_runs_dry() {
        // A queue that never runs dry (a host the aggregator cannot keep up with): all the
        // batches wait before the aggregator starts, each sample a pid it has never seen
        // (a /proc read). Windows of 100 ms must close while it works through them, not
        // once at the end.
        let batches = 600u32;
        let (tx, rx) = std::sync::mpsc::sync_channel(batches as usize);
        let (wtx, wrx) = std::sync::mpsc::sync_channel(4096);
        for b in 0..batches {
            // Pids above the kernel's limit (2^22): never a process, read and not found.
            let batch = (0..256)
                .map(|t| sample(5_000_000 + b * 256 + t, 1, &[0x10]))
                .collect();
            tx.send(batch).expect("send");
        }
        drop(tx);
        let started = Instant::now();
        agg(1 << 20).run(rx, wtx, every(Duration::from_millis(100)));
        let took = started.elapsed();
        // One period (the CPU window, and the off-CPU kinds when on) per boundary.
        let periods: Vec<Vec<Window>> = wrx.try_iter().collect();
        assert!(
            took >= Duration::from_millis(400),
            "the queue took {took:?} to work through: too little to tell (more batches)"
        );
        let want = (took.as_millis() / 200) as usize;
        assert!(
            periods.len() >= want,
            "{} periods closed in {took:?} with a full queue (windows of 100 ms)",
            periods.len()
        );
        let counted: u64 = periods.iter().flatten().map(|w| w.samples()).sum();
        assert_eq!(
            counted,
            u64::from(batches) * 256,
            "every sample in some window"
        );
    }

    /// An aggregator excluding processes named `name`, and the BPF orders its gate sends.
    fn excluding(name: String) -> (Aggregator, std::sync::mpsc::Receiver<Control>) {
        let (tx, rx) = std::sync::mpsc::sync_channel(8);
        let rules = crate::config::Filters {
            exclude_processes: vec![name],
            ..Default::default()
        };
        let workloads = Workloads {
            filter: Filter::new(&rules).expect("filter"),
            control: Some(tx),
            ..Default::default()
        };
        (Aggregator::new(parts(limits(100), workloads)), rx)
    }

    #[test]
    fn excluded_processes_are_dropped_and_denied_in_bpf() {
        let stat = std::fs::read_to_string("/proc/self/stat").expect("stat");
        let own = crate::os::procfs::parse_stat(&stat).expect("parse").comm;
        let (mut a, rx) = excluding(own);
        let pid = std::process::id();
        a.add(sample(pid, pid, &[0x10]));
        let w = a.close();
        assert!(w.stacks.is_empty());
        assert_eq!(rx.try_recv(), Ok(Control::DenyPid(pid)));
        a.add(sample(pid, pid, &[0x10]));
        assert_eq!(
            a.metrics.samples_filtered.get(),
            2,
            "in-flight samples are dropped too"
        );
    }

    #[test]
    fn an_excluded_process_pid_is_allowed_again_once_it_exits() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = child.id();
        let (mut a, rx) = excluding("sleep".into());
        a.add(sample(pid, pid, &[0x10]));
        assert!(a.close().stacks.is_empty());
        assert_eq!(rx.try_recv(), Ok(Control::DenyPid(pid)));
        child.kill().expect("kill");
        child.wait().expect("reap");
        // The registry forgets it at the end of a window that did not sample it; the gate
        // hears of it at a later close, or sooner, from the samples counted meanwhile.
        let own = std::process::id();
        let mut orders = Vec::new();
        for _ in 0..4 {
            for _ in 0..crate::process::registry::TICK {
                a.add(sample(own, own, &[0x10]));
            }
            a.close();
            std::thread::sleep(Duration::from_millis(20));
            orders.extend(rx.try_iter());
        }
        assert_eq!(orders, [Control::AllowPid(pid)]);
    }
}
