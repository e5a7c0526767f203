//! Capture stage: loads the BPF sampler, attaches it to every online CPU and turns
//! ring buffer records into [`Sample`] batches for the aggregator.
//!
//! Runs on its own thread because libbpf's ring buffer is polled synchronously. Beside it:
//! [`unwind`], the sampler's unwind maps and the one code that writes them (for the unwind
//! loader); [`tasks`], the kernel's exec/mmap/fork/exit records and their reader thread;
//! `abi.rs`, the compile-time check of every struct `bpf/ember.h` shares with Rust.
//! Batches go out with `try_send`: a full queue drops the batch and counts it, so the
//! sampler never waits on a slow stage.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use libbpf_rs::libbpf_sys;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, RingBuffer, RingBufferBuilder};
use tracing::{info, warn};

use crate::config::{OffCpu as OffCpuSettings, SampleEvent, Sampling, UnwindMode};
use crate::metrics::{Cache, Loss, Metrics, OffCpuEvent, RowLookup, StackSide};
use crate::model::{OffCpu, OffState, Sample, StackEnd};

mod abi;
pub use ember_parse::perf_record;
pub mod tasks;
pub mod unwind;
pub use tasks::{Drained, Mmap, TaskError, TaskEvent, TaskWatch};
pub use unwind::UnwindMaps;

#[allow(missing_docs, clippy::all, clippy::unwrap_used, unsafe_op_in_unsafe_fn)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/ember.skel.rs"));
}
use skel::types::{
    ember_counter, ember_offcpu_counter, ember_offcpu_head, ember_offcpu_state, ember_record,
    ember_unwind_result,
};
use skel::EmberSkelBuilder;

/// Frames per stack side, as `EMBER_MAX_FRAMES` in `bpf/ember.h` (below 128: one bit
/// each in [`Sample::user_exact`]).
pub const MAX_FRAMES: usize = 127;
/// `EMBER_IP_EXACT`: the walker's mark on a user frame to be named at its own address.
const IP_EXACT: u64 = 1 << 63;
const HEADER: usize = std::mem::size_of::<ember_record>();
// The header is the contract: the ips must start 8-byte aligned right after it.
const _: () = assert!(HEADER % 8 == 0);
const OFFCPU_HEAD: usize = std::mem::size_of::<ember_offcpu_head>();
const _: () = assert!(OFFCPU_HEAD % 8 == 0);

/// What the sampler asks the unwind loader for, on behalf of a sampled process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// The sampler holds no ranges for this process yet: read its mappings and load them.
    Process(u32),
    /// A pc of this process is in none of its ranges (a library loaded since): read them again.
    Remap(u32),
}

/// Record flags (`EMBER_REC_*` in `bpf/ember.h`).
const REC_UNKNOWN_PROCESS: u8 = 1;
const REC_RANGE_MISS: u8 = 2;

/// Samples moved between stages together.
pub type Batch = Vec<Sample>;

/// The bytes a batch holds (samples and their frames), as charged to [`QueueBytes`].
pub fn batch_bytes(b: &Batch) -> u64 {
    let frames: usize = b
        .iter()
        .map(|s| s.kernel.capacity() + s.user.capacity())
        .sum();
    (b.capacity() * std::mem::size_of::<Sample>() + frames * 8) as u64
}

/// The byte budget of the sample queue, shared by its two ends: capture takes a batch's
/// bytes before sending it (or drops it, counted), aggregation gives them back on receipt.
/// The queue's batch count alone would let 1,024 batches of a ring buffer's size each pile
/// up behind a slow aggregator.
#[derive(Debug, Clone)]
pub struct QueueBytes {
    held: Arc<std::sync::atomic::AtomicU64>,
    cap: u64,
}

impl QueueBytes {
    /// A budget of `cap` bytes.
    pub fn new(cap: u64) -> Self {
        Self {
            held: Arc::default(),
            cap,
        }
    }

    /// Takes `n` bytes if they fit (an empty queue takes any one batch).
    pub fn try_take(&self, n: u64) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held == 0 || held.saturating_add(n) <= self.cap).then(|| held.saturating_add(n))
            })
            .is_ok()
    }

    /// Takes `n` bytes whether or not they fit (a blocking send).
    pub fn take(&self, n: u64) {
        self.held.fetch_add(n, Ordering::AcqRel);
    }

    /// Gives back `n` bytes (a batch received, or one that was not sent after all).
    pub fn give(&self, n: u64) {
        let _ = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held.saturating_sub(n))
            });
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }
}

/// Entries of the BPF `cgroup_deny` map (set before load): the aggregator denies at most
/// this many cgroups at once and denies further excluded processes by pid.
pub const CGROUP_DENY_ENTRIES: u32 = 16384;

/// Orders from the aggregator to the sampler: stop (or resume) sampling a workload in BPF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Drop this process's samples in BPF.
    DenyPid(u32),
    /// Forget a denied pid (its process exited; the pid may be reused).
    AllowPid(u32),
    /// Drop samples of this cgroup v2 id in BPF.
    DenyCgroup(u64),
    /// Forget a denied cgroup id.
    AllowCgroup(u64),
}

/// Errors that stop the capture stage from starting.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// libbpf could not open, size or load the BPF object.
    #[error("loading the BPF sampler: {0}")]
    Load(#[source] libbpf_rs::Error),
    /// No CPU could be sampled.
    #[error("could not open a sampling perf event on any CPU: {0}")]
    Attach(String),
    /// The list of online CPUs could not be read.
    #[error("cannot read /sys/devices/system/cpu/online")]
    Cpus,
    /// The capture thread died before saying whether it started.
    #[error("the capture thread exited during start-up")]
    Thread,
}

/// Work waiting for the unwind loader (asks and task records); more is dropped (counted):
/// an ask is asked again a second later, a lost task record makes the loader sweep.
pub const WORK_QUEUE: usize = 16_384;

/// What the unwind loader is sent, in one queue so that it sleeps until either comes.
#[derive(Debug)]
pub enum Work {
    /// From the sampler, on behalf of a sampled process.
    Ask(Ask),
    /// From the kernel's task records (exec, mmap, fork, exit).
    Task(TaskEvent),
    /// Nothing to do: look at the halt flag (sent when the agent stops).
    Wake,
}

/// The sending side of the loader's queue: bounded by a count, while its memory grows
/// only as it fills (a `sync_channel` of [`WORK_QUEUE`] task records would hold 1.7 MB
/// from the start).
#[derive(Debug, Clone)]
pub struct WorkSender {
    tx: mpsc::Sender<Work>,
    queued: Arc<AtomicUsize>,
    cap: usize,
}

/// The receiving side of the loader's queue.
#[derive(Debug)]
pub struct WorkReceiver {
    rx: Receiver<Work>,
    queued: Arc<AtomicUsize>,
}

/// A queue of at most `cap` pieces of work for the unwind loader.
pub fn work_queue(cap: usize) -> (WorkSender, WorkReceiver) {
    let (tx, rx) = mpsc::channel();
    let queued = Arc::new(AtomicUsize::new(0));
    (
        WorkSender {
            tx,
            queued: queued.clone(),
            cap,
        },
        WorkReceiver { rx, queued },
    )
}

impl WorkSender {
    /// Queues `work` unless `cap` pieces are waiting.
    pub fn try_send(&self, work: Work) -> Result<(), TrySendError<Work>> {
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.cap {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(TrySendError::Full(work));
        }
        self.tx.send(work).map_err(|e| {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            TrySendError::Disconnected(e.0)
        })
    }
}

impl WorkReceiver {
    /// The next piece of work, waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Work, mpsc::RecvTimeoutError> {
        let work = self.rx.recv_timeout(timeout)?;
        self.queued.fetch_sub(1, Ordering::AcqRel);
        Ok(work)
    }

    /// The next piece of work if one is waiting.
    pub fn try_recv(&self) -> Result<Work, mpsc::TryRecvError> {
        let work = self.rx.try_recv()?;
        self.queued.fetch_sub(1, Ordering::AcqRel);
        Ok(work)
    }
}

/// What the unwind loader needs from capture: the maps to fill and its queue, which the
/// sampler's asks arrive on.
pub struct UnwindLink {
    /// The maps, `None` with `sampling.unwind: frame_pointer` (nothing to load).
    pub maps: Option<UnwindMaps>,
    /// The loader's queue.
    pub work: WorkReceiver,
    /// A sender into it, for the task record reader and for waking the loader to stop.
    pub sender: WorkSender,
}

/// What the capture stage is made of: its settings, and the queues to and from the
/// aggregator.
pub struct Parts {
    /// `sampling:`.
    pub sampling: Sampling,
    /// `offcpu:`.
    pub offcpu: OffCpuSettings,
    /// The wall-clock period of the windows, when they are aligned on it: a batch is also
    /// sent just before each boundary.
    pub windows: Option<Duration>,
    /// Where batches go.
    pub batches: SyncSender<Batch>,
    /// The sample queue's byte budget, taken before each batch is sent.
    pub budget: QueueBytes,
    /// The aggregator's [`Control`] orders.
    pub control: Receiver<Control>,
    /// Where it counts.
    pub metrics: Metrics,
}

/// A running capture stage.
pub struct Capture {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Capture {
    /// Loads and attaches the sampler, then streams batches into `parts.batches` until
    /// [`Capture::stop`], applying the [`Control`] orders that arrive on `parts.control`.
    /// Returns once the program is attached (or failed to attach).
    pub fn start(parts: Parts) -> Result<(Self, UnwindLink), CaptureError> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let thread_stop = stop.clone();
        let (work_tx, work_rx) = work_queue(WORK_QUEUE);
        let ask_tx = work_tx.clone();
        let thread = std::thread::Builder::new()
            .name("ember-capture".into())
            .spawn(move || run(parts, ask_tx, thread_stop, ready_tx))
            .map_err(|_| CaptureError::Thread)?;
        match ready_rx.recv() {
            Ok(Ok(maps)) => Ok((
                Self {
                    stop,
                    thread: Some(thread),
                },
                UnwindLink {
                    maps,
                    work: work_rx,
                    sender: work_tx,
                },
            )),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(CaptureError::Thread),
        }
    }

    /// Drains what the ring buffer still holds, sends it, detaches and returns.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The capture thread: loads and attaches the sampler, says so on `ready` (with the unwind
/// maps), then drains the ring buffers into batches until `stop`, and once more after.
fn run(
    parts: Parts,
    asks: WorkSender,
    stop: Arc<AtomicBool>,
    ready: SyncSender<Result<Option<UnwindMaps>, CaptureError>>,
) {
    let Parts {
        sampling: settings,
        offcpu,
        windows,
        batches: tx,
        budget,
        control,
        metrics,
    } = parts;
    let mut open_object = MaybeUninit::<OpenObject>::uninit();
    let mut sampler = match Sampler::load(&settings, &offcpu, &mut open_object) {
        Ok(s) => s,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    if let Err(e) = sampler.sync_cpus(&settings, &metrics) {
        let _ = ready.send(Err(e));
        return;
    }

    let maps = match sampler.unwind_maps(&settings) {
        Ok(m) => m,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let batch: Rc<RefCell<Batch>> = Rc::default();
    let malformed = Rc::new(RefCell::new(0u64));
    let ring = match ring_buffer(&sampler, &offcpu, asks, &batch, &malformed, &metrics) {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(CaptureError::Load(e)));
            return;
        }
    };
    let _ = ready.send(Ok(maps));

    let mut counters = CounterSync::default();
    let mut last_sync = Instant::now();
    let mut last_cpu_check = Instant::now();
    let flush = |blocking: bool| {
        let out = std::mem::take(&mut *batch.borrow_mut());
        let bad = std::mem::take(&mut *malformed.borrow_mut());
        if bad > 0 {
            metrics.lost(Loss::Malformed, bad);
        }
        if out.is_empty() {
            return;
        }
        let n = out.len() as u64;
        metrics.samples.inc_by(n);
        let bytes = batch_bytes(&out);
        let sent = if blocking {
            // The last flush on stop waits for room instead; its bytes are still charged,
            // as the receiver gives them back.
            budget.take(bytes);
            tx.send(out).is_ok()
        } else if !budget.try_take(bytes) {
            false
        } else {
            match tx.try_send(out) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                    budget.give(bytes);
                    false
                }
            }
        };
        if !sent {
            metrics.lost(Loss::QueueFull, n);
        }
    };
    let mut poll_errors = 0u64;
    while !stop.load(Ordering::SeqCst) {
        metrics.progress.tick(crate::metrics::Stage::Capture);
        // The program wakes us only when the buffer fills up (or a record asks for a
        // process's tables); otherwise drain on this timer.
        if let Err(e) = ring
            .poll(next_drain(windows, SystemTime::now()))
            .and_then(|_| ring.consume())
        {
            poll_errors += 1;
            if poll_errors == 1 {
                warn!("ring buffer poll failed (counted, retrying): {e}");
            }
        }
        flush(false);
        apply_orders(&sampler, &control, &metrics);
        if last_sync.elapsed() >= Duration::from_secs(1) {
            last_sync = Instant::now();
            counters.sync(&sampler, &metrics);
        }
        if last_cpu_check.elapsed() >= CPU_CHECK_EVERY {
            last_cpu_check = Instant::now();
            if let Err(e) = sampler.sync_cpus(&settings, &metrics) {
                warn!("CPU hotplug check failed: {e}");
            }
        }
    }
    // Detach first so nothing new arrives, then take everything still buffered.
    sampler.links.clear();
    sampler.offcpu_links.clear();
    let _ = ring.consume();
    flush(true);
    counters.sync(&sampler, &metrics);
}

/// Reads the ring buffers (samples, and off-CPU samples when those programs are attached)
/// into `batch`, counting the records too short to parse in `malformed`; a record naming a
/// process the walker holds no ranges for asks the unwind loader at once, through `asks`.
fn ring_buffer(
    sampler: &Sampler<'_>,
    offcpu: &OffCpuSettings,
    asks: WorkSender,
    batch: &Rc<RefCell<Batch>>,
    malformed: &Rc<RefCell<u64>>,
    metrics: &Metrics,
) -> Result<RingBuffer<'static>, libbpf_rs::Error> {
    let mut builder = RingBufferBuilder::new();
    let (cb_batch, cb_bad, cb_metrics) = (batch.clone(), malformed.clone(), metrics.clone());
    // Asked at once, not at the next batch: the process may live 30 ms.
    let ask = move |pid: u32, flags: u8, metrics: &Metrics| {
        let ask = match flags {
            f if f & REC_UNKNOWN_PROCESS != 0 => Some(Ask::Process(pid)),
            f if f & REC_RANGE_MISS != 0 => Some(Ask::Remap(pid)),
            _ => None,
        };
        if let Some(ask) = ask {
            if asks.try_send(Work::Ask(ask)).is_err() {
                metrics.dropped(Cache::UnwindRequests, 1);
            }
        }
    };
    let cb_ask = ask.clone();
    let mut added = builder
        .add(&sampler.skel.maps.samples, move |data: &[u8]| {
            match parse_record(data) {
                Some((s, flags)) => {
                    cb_ask(s.pid, flags, &cb_metrics);
                    cb_batch.borrow_mut().push(s)
                }
                None => *cb_bad.borrow_mut() += 1,
            }
            0
        })
        .map(|_| ());
    if !sampler.offcpu_links.is_empty() {
        let (cb_batch, cb_metrics) = (batch.clone(), metrics.clone());
        let scale = 1.0 / offcpu.sample_rate;
        added = added.and_then(|()| {
            builder
                .add(&sampler.skel.maps.offcpu_samples, move |data: &[u8]| {
                    match parse_offcpu_record(data, scale) {
                        Some((samples, flags)) => {
                            if let Some(s) = samples.first() {
                                ask(s.pid, flags, &cb_metrics);
                            }
                            cb_batch.borrow_mut().extend(samples);
                        }
                        None => cb_metrics.offcpu(OffCpuEvent::Malformed, 1),
                    }
                    0
                })
                .map(|_| ())
        });
    }
    added.and_then(|()| builder.build())
}

/// Applies the aggregator's queued [`Control`] orders to the BPF maps.
fn apply_orders(sampler: &Sampler<'_>, control: &Receiver<Control>, metrics: &Metrics) {
    while let Ok(order) = control.try_recv() {
        // A refused deny leaves the workload sampled (dropped in userspace); a failed
        // delete of a cgroup leaves its entry taking room. A delete of an entry that
        // is not there (a pid LRU already dropped, a deny the map refused) is harmless.
        let counted = match (order, sampler.apply(order)) {
            (_, Ok(())) => false,
            (Control::DenyPid(_) | Control::DenyCgroup(_), Err(_)) => true,
            (Control::AllowCgroup(_), Err(e)) => e.kind() != libbpf_rs::ErrorKind::NotFound,
            (Control::AllowPid(_), Err(_)) => false,
        };
        if counted {
            metrics.dropped(Cache::DenyMaps, 1);
        }
    }
}

/// The longest samples wait in the ring buffer: every wakeup of an idle agent costs, and
/// the aggregator needs them only by the window's end (the program wakes the thread as
/// soon as the buffer is a quarter full).
const DRAIN_EVERY: Duration = Duration::from_secs(1);
/// How often CPUs brought online are attached to (and offline ones let go): reading sysfs
/// at every drain was a tenth of the thread's steady cost.
const CPU_CHECK_EVERY: Duration = Duration::from_secs(5);
/// How long before a window boundary the buffer is drained, so that a window's last
/// samples are in it (those of these last milliseconds go to the next window).
const BEFORE_BOUNDARY: Duration = Duration::from_millis(20);

/// How long to sleep before the next drain at `now`: [`DRAIN_EVERY`], or less to drain
/// [`BEFORE_BOUNDARY`] ahead of the next boundary of wall-clock windows of `windows`.
fn next_drain(windows: Option<Duration>, now: SystemTime) -> Duration {
    let Some(w) = windows.map(|w| w.as_nanos().max(1)) else {
        return DRAIN_EVERY;
    };
    let now = now
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let (left, before) = (w - now % w, BEFORE_BOUNDARY.as_nanos());
    // Just drained for this boundary: the next one's.
    let until = if left > before {
        left - before
    } else {
        left + w - before
    };
    Duration::from_nanos(u64::try_from(until).unwrap_or(u64::MAX)).min(DRAIN_EVERY)
}

/// The loaded BPF object and one perf event link per sampled CPU.
struct Sampler<'obj> {
    skel: skel::EmberSkel<'obj>,
    links: BTreeMap<u32, Link>,
    /// `ember_exec` on sched_process_exec, when unwinding by tables with kernel BTF.
    exec: Option<Link>,
    /// The off-CPU programs on sched_switch and sched_wakeup (`offcpu.enabled`).
    offcpu_links: Vec<Link>,
    event: SampleEvent,
}

impl<'obj> Sampler<'obj> {
    fn load(
        settings: &Sampling,
        offcpu: &OffCpuSettings,
        object: &'obj mut MaybeUninit<OpenObject>,
    ) -> Result<Self, CaptureError> {
        let mut open = EmberSkelBuilder::default()
            .open(object)
            .map_err(CaptureError::Load)?;
        if let Some(rodata) = open.maps.rodata_data.as_deref_mut() {
            rodata.ember_cfg.filter_pids = u32::from(!settings.pids.is_empty());
            rodata.ember_cfg.include_idle = u32::from(settings.include_idle);
            rodata.ember_cfg.wakeup_bytes = u64::from(settings.ring_buffer_bytes / 4);
            rodata.ember_cfg.unwind_mode = match settings.unwind {
                UnwindMode::FramePointer => 0,
                UnwindMode::Auto => 1,
                UnwindMode::Dwarf => 2,
            };
            rodata.ember_cfg.task_regs = u32::from(kernel_btf());
            rodata.ember_offcpu_cfg.min_block_ns =
                u64::try_from(offcpu.min_block.as_nanos()).unwrap_or(u64::MAX);
            rodata.ember_offcpu_cfg.sample_threshold = sample_threshold(offcpu.sample_rate);
        }
        // The off-CPU programs are BTF tracepoints too; off, their maps are kept minimal.
        let offcpu_on = offcpu.enabled && kernel_btf();
        if offcpu.enabled && !offcpu_on {
            warn!("off-CPU profiling needs the kernel's BTF (/sys/kernel/btf/vmlinux): off");
        }
        open.progs.ember_offcpu_switch.set_autoload(offcpu_on);
        open.progs.ember_offcpu_wakeup.set_autoload(offcpu_on);
        open.maps
            .offcpu_threads
            .set_max_entries(if offcpu_on { offcpu.max_threads } else { 1 })
            .map_err(CaptureError::Load)?;
        open.maps
            .offcpu_samples
            .set_max_entries(if offcpu_on {
                offcpu.ring_buffer_bytes
            } else {
                4096
            })
            .map_err(CaptureError::Load)?;
        // The walker's row caches, per CPU: the sampler's, and off-CPU's when it is on.
        open.maps
            .row_cache
            .set_max_entries(if offcpu_on { 2 } else { 1 })
            .map_err(CaptureError::Load)?;
        // The exec hook is a BTF tracepoint: without kernel BTF it would fail the whole load.
        let exec_hook = settings.unwind != UnwindMode::FramePointer && kernel_btf();
        open.progs.ember_exec.set_autoload(exec_hook);
        open.maps
            .samples
            .set_max_entries(settings.ring_buffer_bytes)
            .map_err(CaptureError::Load)?;
        open.maps
            .unwind_procs
            .set_max_entries(settings.unwind_max_processes)
            .map_err(CaptureError::Load)?;
        open.maps
            .cgroup_deny
            .set_max_entries(CGROUP_DENY_ENTRIES)
            .map_err(CaptureError::Load)?;
        let skel = open.load().map_err(CaptureError::Load)?;
        for pid in &settings.pids {
            skel.maps
                .pid_filter
                .update(&pid.to_ne_bytes(), &[1u8], MapFlags::ANY)
                .map_err(CaptureError::Load)?;
        }
        let exec = if exec_hook {
            match skel.progs.ember_exec.attach() {
                Ok(link) => Some(link),
                Err(e) => {
                    warn!("exec hook not attached ({e}): new processes are unwound once the agent has read them");
                    None
                }
            }
        } else {
            None
        };
        let mut offcpu_links = Vec::new();
        if offcpu_on {
            for prog in [
                &skel.progs.ember_offcpu_switch,
                &skel.progs.ember_offcpu_wakeup,
            ] {
                offcpu_links.push(prog.attach().map_err(CaptureError::Load)?);
            }
        }
        Ok(Self {
            skel,
            links: BTreeMap::new(),
            exec,
            offcpu_links,
            event: settings.event,
        })
    }

    /// Handles on the unwind maps for the loader (none when only frame pointers are used).
    fn unwind_maps(&self, settings: &Sampling) -> Result<Option<UnwindMaps>, CaptureError> {
        if settings.unwind == UnwindMode::FramePointer {
            return Ok(None);
        }
        let maps = &self.skel.maps;
        Ok(Some(UnwindMaps {
            tables: libbpf_rs::MapHandle::try_from(&maps.unwind_tables)
                .map_err(CaptureError::Load)?,
            procs: libbpf_rs::MapHandle::try_from(&maps.unwind_procs)
                .map_err(CaptureError::Load)?,
            used: libbpf_rs::MapHandle::try_from(&maps.unwind_used).map_err(CaptureError::Load)?,
            files: libbpf_rs::MapHandle::try_from(&maps.unwind_files)
                .map_err(CaptureError::Load)?,
            row_cache: libbpf_rs::MapHandle::try_from(&maps.row_cache)
                .map_err(CaptureError::Load)?,
            exec_hook: self.exec.is_some(),
        }))
    }

    /// Applies an order to the deny maps. A failed update (a full map) leaves a workload
    /// sampled and dropped in userspace (never a loss); the caller counts it.
    fn apply(&self, order: Control) -> Result<(), libbpf_rs::Error> {
        let maps = &self.skel.maps;
        match order {
            Control::DenyPid(pid) => maps
                .pid_deny
                .update(&pid.to_ne_bytes(), &[1], MapFlags::ANY),
            Control::AllowPid(pid) => maps.pid_deny.delete(&pid.to_ne_bytes()),
            Control::DenyCgroup(id) => {
                maps.cgroup_deny
                    .update(&id.to_ne_bytes(), &[1], MapFlags::ANY)
            }
            Control::AllowCgroup(id) => maps.cgroup_deny.delete(&id.to_ne_bytes()),
        }
    }

    /// Attaches to CPUs that came online and lets go of CPUs that went away.
    fn sync_cpus(&mut self, settings: &Sampling, metrics: &Metrics) -> Result<(), CaptureError> {
        let online = crate::os::procfs::online_cpus().ok_or(CaptureError::Cpus)?;
        self.links.retain(|cpu, _| online.contains(cpu));
        let mut last_err = None;
        for cpu in online {
            if self.links.contains_key(&cpu) {
                continue;
            }
            match self.attach(cpu, settings.frequency_hz) {
                Ok(link) => {
                    self.links.insert(cpu, link);
                }
                Err(e) => last_err = Some(format!("cpu {cpu}: {e}")),
            }
        }
        metrics.cpus_sampled.set(self.links.len() as i64);
        match (self.links.is_empty(), last_err) {
            (true, Some(e)) => Err(CaptureError::Attach(e)),
            (false, Some(e)) => {
                warn!("some CPUs are not sampled: {e}");
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn attach(&mut self, cpu: u32, hz: u64) -> std::io::Result<Link> {
        let fd = match open_perf_event(cpu, self.event, hz) {
            Ok(fd) => fd,
            Err(e) if self.event == SampleEvent::Cycles => {
                info!(
                    "hardware cycles are not available here ({e}); sampling on cpu-clock instead"
                );
                self.event = SampleEvent::CpuClock;
                open_perf_event(cpu, self.event, hz)?
            }
            Err(e) => return Err(e),
        };
        match self.skel.progs.ember_sample.attach_perf_event(fd) {
            Ok(link) => Ok(link), // the link now owns the perf fd
            Err(e) => {
                // SAFETY: fd was returned by perf_event_open above and is owned by nobody else.
                unsafe { libc::close(fd) };
                Err(std::io::Error::other(e.to_string()))
            }
        }
    }
}

fn open_perf_event(cpu: u32, event: SampleEvent, hz: u64) -> std::io::Result<i32> {
    // SAFETY: perf_event_attr is a plain C struct for which all-zero is a valid value.
    let mut attr: libbpf_sys::perf_event_attr = unsafe { std::mem::zeroed() };
    attr.size = std::mem::size_of::<libbpf_sys::perf_event_attr>() as u32;
    (attr.type_, attr.config) = match event {
        SampleEvent::CpuClock => (
            libbpf_sys::PERF_TYPE_SOFTWARE,
            libbpf_sys::PERF_COUNT_SW_CPU_CLOCK as u64,
        ),
        SampleEvent::Cycles => (
            libbpf_sys::PERF_TYPE_HARDWARE,
            libbpf_sys::PERF_COUNT_HW_CPU_CYCLES as u64,
        ),
    };
    attr.__bindgen_anon_1.sample_freq = hz;
    attr.set_freq(1);
    // SAFETY: attr is initialised and outlives the call; pid -1 + cpu = every task on that CPU.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const libbpf_sys::perf_event_attr,
            -1,
            cpu as libc::c_int,
            -1,
            libbpf_sys::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd as i32)
}

/// Turns one ring buffer record into a sample and its `EMBER_REC_*` flags; `None` if it is
/// shorter than it claims.
pub fn parse_record(data: &[u8]) -> Option<(Sample, u8)> {
    if data.len() < HEADER {
        return None;
    }
    // SAFETY: the slice holds at least HEADER bytes; ember_record is plain old data.
    let hdr: ember_record = unsafe { std::ptr::read_unaligned(data.as_ptr().cast()) };
    let (k, u) = (usize::from(hdr.kern_frames), usize::from(hdr.user_frames));
    if k > MAX_FRAMES || u > MAX_FRAMES || data.len() < HEADER + 8 * (k + u) {
        return None;
    }
    let mut ips = data[HEADER..HEADER + 8 * (k + u)]
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]));
    let kernel: Vec<u64> = ips.by_ref().take(k).collect();
    let walked = hdr.user_result != ember_unwind_result::EMBER_UNWIND_FRAME_POINTER.0 as u8;
    let mut user_exact = 0u128;
    let user: Vec<u64> = ips
        .enumerate()
        .map(|(i, ip)| {
            // Only the table walker sets the bit; the kernel's frame-pointer walk copies
            // whatever the stack holds.
            if walked && ip & IP_EXACT != 0 {
                user_exact |= 1 << i;
                ip & !IP_EXACT
            } else {
                ip
            }
        })
        .collect();
    let user_end = stack_end(hdr.user_result, user.is_empty());
    let sample = Sample {
        time_ns: hdr.time_ns,
        cgroup_id: hdr.cgroup_id,
        pid: hdr.pid,
        tid: hdr.tid,
        cpu: hdr.cpu,
        comm: hdr.comm.map(|c| c as u8),
        kernel,
        user,
        user_exact,
        user_end,
        off_cpu: None,
    };
    Some((sample, hdr.user_flags))
}

/// `offcpu.sample_rate` as the BPF program's threshold on a random u32 (2^32: every one).
fn sample_threshold(rate: f64) -> u64 {
    if rate >= 1.0 {
        1 << 32
    } else {
        (rate.max(0.0) * (1u64 << 32) as f64) as u64
    }
}

/// Turns one off-CPU record into its samples (the time in its state, then the time
/// runnable after a wakeup, if any; times scaled by `scale` = 1 / sample rate) and its
/// `EMBER_REC_*` flags; `None` if it is malformed.
pub fn parse_offcpu_record(data: &[u8], scale: f64) -> Option<(Vec<Sample>, u8)> {
    if data.len() < OFFCPU_HEAD {
        return None;
    }
    // SAFETY: the slice holds at least OFFCPU_HEAD bytes; ember_offcpu_head is plain old data.
    let head: ember_offcpu_head = unsafe { std::ptr::read_unaligned(data.as_ptr().cast()) };
    let (sample, flags) = parse_record(&data[OFFCPU_HEAD..])?;
    type S = ember_offcpu_state;
    let state = match ember_offcpu_state(head.state) {
        S::EMBER_OFFCPU_SLEEP => OffState::Sleep,
        S::EMBER_OFFCPU_DISK => OffState::Disk,
        S::EMBER_OFFCPU_RUNNABLE => OffState::Runnable,
        _ => return None,
    };
    let scaled = |ns: u64| (ns as f64 * scale).round() as u64;
    let mut out = Vec::with_capacity(2);
    if head.runnable_ns > 0 && state != OffState::Runnable {
        let mut woken = sample.clone();
        woken.off_cpu = Some(OffCpu {
            state: OffState::Runnable,
            ns: scaled(head.runnable_ns),
        });
        out.push(woken);
    }
    out.insert(
        0,
        Sample {
            off_cpu: Some(OffCpu {
                state,
                ns: scaled(head.off_ns),
            }),
            ..sample
        },
    );
    Some((out, flags))
}

/// The metric label of a record's `enum ember_unwind_result`.
fn stack_end(result: u8, empty: bool) -> StackEnd {
    type R = ember_unwind_result;
    match ember_unwind_result(u32::from(result)) {
        R::EMBER_UNWIND_FRAME_POINTER if empty => StackEnd::NoUserStack,
        R::EMBER_UNWIND_FRAME_POINTER => StackEnd::FramePointer,
        R::EMBER_UNWIND_COMPLETE => StackEnd::Complete,
        R::EMBER_UNWIND_TRUNCATED => StackEnd::Truncated,
        R::EMBER_UNWIND_FP_END => StackEnd::FramePointerEnd,
        R::EMBER_UNWIND_ERR_UNSUPPORTED => StackEnd::Unsupported,
        R::EMBER_UNWIND_ERR_READ => StackEnd::ReadFault,
        R::EMBER_UNWIND_ERR_BAD_FRAME => StackEnd::BadFrame,
        R::EMBER_UNWIND_ERR_RBP_UNKNOWN => StackEnd::RbpUnknown,
        R::EMBER_UNWIND_ERR_NO_TABLE => StackEnd::NoTable,
        _ => StackEnd::TableMissing,
    }
}

/// Where the increase of one BPF counter is counted.
#[derive(Clone, Copy)]
enum Counted {
    /// Whole samples lost: `ember_samples_lost_total{reason}`.
    Lost(Loss),
    /// A stack not walked, the sample kept: `ember_stack_errors_total{side}`.
    StackError(StackSide),
    /// Samples a filter excluded in BPF: `ember_samples_filtered_total`.
    Filtered,
    /// Entries a map had no room for: `ember_cache_dropped_total{cache}`.
    Dropped(Cache),
    /// Frames walked by a table: `ember_unwind_row_lookups_total{result}`.
    Row(RowLookup),
}

/// Mirrors the BPF per-CPU counters into the metrics, by difference since the last read.
#[derive(Default)]
struct CounterSync {
    last: [u64; ember_counter::EMBER_CNT_MAX.0 as usize],
    offcpu_last: [u64; ember_offcpu_counter::EMBER_OFFCPU_CNT_MAX.0 as usize],
}

impl CounterSync {
    fn sync(&mut self, sampler: &Sampler<'_>, metrics: &Metrics) {
        self.sync_offcpu(sampler, metrics);
        // Each BPF counter and the series its increase goes to.
        for (idx, into) in [
            (
                ember_counter::EMBER_CNT_LOST_RINGBUF,
                Counted::Lost(Loss::RingbufFull),
            ),
            (
                ember_counter::EMBER_CNT_NO_SCRATCH,
                Counted::Lost(Loss::NoScratch),
            ),
            (
                ember_counter::EMBER_CNT_KERN_STACK_ERR,
                Counted::StackError(StackSide::Kernel),
            ),
            (
                ember_counter::EMBER_CNT_USER_STACK_ERR,
                Counted::StackError(StackSide::User),
            ),
            (ember_counter::EMBER_CNT_FILTERED, Counted::Filtered),
            (
                ember_counter::EMBER_CNT_TAIL_CALL,
                Counted::StackError(StackSide::User),
            ),
            (
                ember_counter::EMBER_CNT_EXEC_FAILED,
                Counted::Dropped(Cache::UnwindProcesses),
            ),
            (
                ember_counter::EMBER_CNT_ROW_CACHED,
                Counted::Row(RowLookup::Cached),
            ),
            (
                ember_counter::EMBER_CNT_ROW_SEARCHED,
                Counted::Row(RowLookup::Searched),
            ),
            (
                ember_counter::EMBER_CNT_ROW_EVICTED,
                Counted::Dropped(Cache::UnwindRowCache),
            ),
        ] {
            let i = idx.0 as usize;
            let Some(now) = read_counter(sampler, idx.0) else {
                continue;
            };
            let delta = now.saturating_sub(self.last[i]);
            self.last[i] = now;
            if delta == 0 {
                continue;
            }
            match into {
                Counted::Lost(reason) => metrics.lost(reason, delta),
                Counted::StackError(side) => metrics.stack_error(side, delta),
                Counted::Filtered => {
                    metrics.samples_filtered.inc_by(delta);
                }
                Counted::Dropped(cache) => metrics.dropped(cache, delta),
                Counted::Row(result) => metrics.row_lookups(result, delta),
            }
        }
    }
}

impl CounterSync {
    /// The off-CPU counters and the number of threads held, when the programs are attached.
    fn sync_offcpu(&mut self, sampler: &Sampler<'_>, metrics: &Metrics) {
        if sampler.offcpu_links.is_empty() {
            return;
        }
        type C = ember_offcpu_counter;
        for (idx, event) in [
            (C::EMBER_OFFCPU_CNT_SWITCHES, OffCpuEvent::Switch),
            (C::EMBER_OFFCPU_CNT_TAKEN, OffCpuEvent::Taken),
            (C::EMBER_OFFCPU_CNT_MAP_FULL, OffCpuEvent::MapFull),
            (C::EMBER_OFFCPU_CNT_SHORT, OffCpuEvent::Short),
            (C::EMBER_OFFCPU_CNT_SENT, OffCpuEvent::Sent),
            (C::EMBER_OFFCPU_CNT_LOST_RINGBUF, OffCpuEvent::RingbufFull),
            (C::EMBER_OFFCPU_CNT_NO_SCRATCH, OffCpuEvent::NoScratch),
            (C::EMBER_OFFCPU_CNT_FILTERED, OffCpuEvent::Filtered),
        ] {
            let i = idx.0 as usize;
            let Some(now) = read_percpu(&sampler.skel.maps.offcpu_counters, idx.0) else {
                continue;
            };
            // Every series exists from the start (at zero), so alerts have one to read.
            metrics.offcpu(event, now.saturating_sub(self.offcpu_last[i]));
            self.offcpu_last[i] = now;
        }
        if let Some(bss) = sampler.skel.maps.bss_data.as_deref() {
            // SAFETY: the mmapped .bss is written by BPF atomics; a volatile read sees a whole u64.
            let live = unsafe { std::ptr::read_volatile(&bss.ember_offcpu_live) };
            metrics
                .offcpu_threads
                .set(i64::try_from(live).unwrap_or(i64::MAX));
        }
    }
}

/// Kernel BTF, which typed tracepoints, `bpf_task_pt_regs` and CO-RE field reads need.
fn kernel_btf() -> bool {
    std::path::Path::new("/sys/kernel/btf/vmlinux").exists()
}

fn read_counter(sampler: &Sampler<'_>, idx: u32) -> Option<u64> {
    read_percpu(&sampler.skel.maps.counters, idx)
}

/// The sum over CPUs of slot `idx` of a per-CPU array of u64 counters.
fn read_percpu(map: &impl MapCore, idx: u32) -> Option<u64> {
    let per_cpu = map
        .lookup_percpu(&idx.to_ne_bytes(), MapFlags::ANY)
        .ok()??;
    Some(
        per_cpu
            .iter()
            .filter_map(|v| {
                v.get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_ne_bytes)
            })
            .sum(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_just_before_each_window_boundary() {
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(1_800_000_000_000 + ms);
        let ms = |d: Duration| d.as_millis();
        // No windows (`ember record`): every DRAIN_EVERY.
        assert_eq!(next_drain(None, at(500)), DRAIN_EVERY);
        let w = Some(Duration::from_secs(10));
        // Far from a boundary: the usual period.
        assert_eq!(next_drain(w, at(2_000)), DRAIN_EVERY);
        // 500 ms before a boundary: 480 ms, then the next boundary's turn.
        assert_eq!(ms(next_drain(w, at(9_500))), 480);
        assert_eq!(ms(next_drain(w, at(9_990))), 1000);
        // Windows shorter than DRAIN_EVERY drain once each, 20 ms before its end.
        let short = Some(Duration::from_millis(500));
        assert_eq!(ms(next_drain(short, at(100))), 380);
        assert_eq!(ms(next_drain(short, at(490))), 490);
    }

    #[test]
    fn the_loader_queue_is_bounded_and_gives_room_back() {
        let (tx, rx) = work_queue(2);
        assert!(tx.try_send(Work::Wake).is_ok());
        assert!(tx.clone().try_send(Work::Ask(Ask::Process(1))).is_ok());
        assert!(matches!(
            tx.try_send(Work::Wake),
            Err(TrySendError::Full(Work::Wake))
        ));
        assert!(matches!(rx.try_recv(), Ok(Work::Wake)));
        assert!(tx.try_send(Work::Wake).is_ok());
        assert!(matches!(
            rx.recv_timeout(Duration::ZERO),
            Ok(Work::Ask(Ask::Process(1)))
        ));
        drop(rx);
        assert!(matches!(
            tx.try_send(Work::Wake),
            Err(TrySendError::Disconnected(_))
        ));
    }

    fn record(kernel: &[u64], user: &[u64]) -> Vec<u8> {
        record_ended(
            ember_unwind_result::EMBER_UNWIND_FRAME_POINTER,
            kernel,
            user,
        )
    }

    fn record_ended(result: ember_unwind_result, kernel: &[u64], user: &[u64]) -> Vec<u8> {
        let mut hdr = ember_record {
            user_result: result.0 as u8,
            time_ns: 7,
            cgroup_id: 9,
            pid: 100,
            tid: 101,
            cpu: 1,
            kern_frames: kernel.len() as u16,
            user_frames: user.len() as u16,
            ..Default::default()
        };
        hdr.comm[..4].copy_from_slice(&[b'h' as i8, b'o' as i8, b'g' as i8, 0]);
        // SAFETY: test-only view of a repr(C) POD struct as bytes.
        let mut out = unsafe {
            std::slice::from_raw_parts((&hdr as *const ember_record).cast::<u8>(), HEADER)
        }
        .to_vec();
        for ip in kernel.iter().chain(user) {
            out.extend_from_slice(&ip.to_ne_bytes());
        }
        out
    }

    #[test]
    fn parses_both_sides() {
        let (s, flags) = parse_record(&record(
            &[0xffff_0001, 0xffff_0002],
            &[0x401000, 0x402000, 0x403000],
        ))
        .expect("valid");
        assert_eq!(flags, 0);
        assert_eq!(s.user_end, StackEnd::FramePointer);
        assert_eq!(s.kernel, [0xffff_0001, 0xffff_0002]);
        assert_eq!(s.user, [0x401000, 0x402000, 0x403000]);
        assert_eq!(
            (s.pid, s.tid, s.cpu, s.cgroup_id, s.time_ns),
            (100, 101, 1, 9, 7)
        );
        assert_eq!(&s.comm[..3], b"hog");
    }

    #[test]
    fn the_walkers_exact_frames_are_marked_and_their_bit_cleared() {
        const EXACT: u64 = 1 << 63;
        // A handler's stack: leaf, the trampoline, the interrupted frame, its caller.
        let user = [
            0x401005 | EXACT,
            0x7f12_3403_c050 | EXACT,
            0x402000 | EXACT,
            0x403000,
        ];
        let (s, _) = parse_record(&record_ended(
            ember_unwind_result::EMBER_UNWIND_COMPLETE,
            &[],
            &user,
        ))
        .expect("valid");
        assert_eq!(s.user, [0x401005, 0x7f12_3403_c050, 0x402000, 0x403000]);
        assert_eq!(s.user_exact, 0b0111);
        // The kernel's frame-pointer walk copies the stack's words: nothing is read into them.
        let (s, _) = parse_record(&record(&[], &user)).expect("valid");
        assert_eq!(s.user, user);
        assert_eq!(s.user_exact, 0);
    }

    #[test]
    fn rejects_short_or_lying_records() {
        let mut r = record(&[1, 2], &[3]);
        r.truncate(r.len() - 1);
        assert_eq!(parse_record(&r), None);
        assert_eq!(parse_record(&[0u8; 10]), None);
        let mut r = record(&[], &[]);
        r[28] = 200; // kern_frames > MAX_FRAMES
        assert_eq!(parse_record(&r), None);
    }

    fn offcpu_record(state: u32, off_ns: u64, runnable_ns: u64) -> Vec<u8> {
        let head = ember_offcpu_head {
            off_ns,
            runnable_ns,
            state,
            pad: 0,
        };
        // SAFETY: test-only view of a repr(C) POD struct as bytes.
        let mut out = unsafe {
            std::slice::from_raw_parts(
                (&head as *const ember_offcpu_head).cast::<u8>(),
                OFFCPU_HEAD,
            )
        }
        .to_vec();
        out.extend(record(&[0xffff_0001], &[0x401000]));
        out
    }

    #[test]
    fn offcpu_records_split_at_the_wakeup_and_scale() {
        let (samples, _) = parse_offcpu_record(&offcpu_record(0, 700, 300), 1.0).expect("valid");
        let got: Vec<_> = samples.iter().map(|s| s.off_cpu).collect();
        assert_eq!(
            got,
            [
                Some(OffCpu {
                    state: OffState::Sleep,
                    ns: 700
                }),
                Some(OffCpu {
                    state: OffState::Runnable,
                    ns: 300
                }),
            ]
        );
        assert_eq!(samples[1].user, [0x401000], "both halves keep the stack");
        let (samples, _) = parse_offcpu_record(&offcpu_record(1, 1000, 0), 2.0).expect("valid");
        assert_eq!(
            samples.iter().map(|s| s.off_cpu).collect::<Vec<_>>(),
            [Some(OffCpu {
                state: OffState::Disk,
                ns: 2000
            })],
            "no wakeup part; scaled by 1 / sample rate"
        );
        assert!(
            parse_offcpu_record(&offcpu_record(9, 1, 0), 1.0).is_none(),
            "unknown state"
        );
        let mut short = offcpu_record(2, 5, 0);
        short.truncate(OFFCPU_HEAD + 8);
        assert!(parse_offcpu_record(&short, 1.0).is_none());
        assert_eq!(sample_threshold(1.0), 1 << 32);
        assert_eq!(sample_threshold(0.5), 1 << 31);
    }

    #[test]
    fn header_matches_c_layout() {
        // time_ns, cgroup_id, pid, tid, cpu, kern_frames, user_frames, comm[16],
        // user_result, user_flags, pad0, pad1
        assert_eq!(HEADER, 8 + 8 + 4 + 4 + 4 + 2 + 2 + 16 + 1 + 1 + 2 + 4);
    }
}
