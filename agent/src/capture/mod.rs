//! Capture stage: loads the BPF sampler, attaches it to every online CPU and turns
//! ring buffer records into [`Sample`](crate::model::Sample) batches for the aggregator.
//!
//! Runs on its own thread because libbpf's ring buffer is polled synchronously: this file
//! starts it and runs its drain loop. Its parts: `sampler.rs`, the loaded BPF object and
//! its perf event links; `record.rs`, a ring buffer record turned into samples;
//! `counters.rs`, the BPF counters mirrored into the metrics; `queue.rs`, the batches'
//! byte budget and the unwind loader's work queue. Beside it: [`unwind`], the sampler's
//! unwind maps and the one code that writes them (for the unwind loader); [`tasks`], the
//! kernel's exec/mmap/fork/exit records and their reader thread; `kept.rs`, the off-CPU
//! records kept for the kernel's sums (read at every drain); `abi.rs`, the
//! compile-time check of every struct `bpf/ember.h` shares with Rust.
//! Batches go out with `try_send`: a full queue drops the batch and counts it, so the
//! sampler never waits on a slow stage.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use libbpf_rs::{RingBuffer, RingBufferBuilder};
use tracing::warn;

use crate::config::{OffCpu as OffCpuSettings, Sampling};
use crate::metrics::{Cache, Loss, Metrics, OffCpuEvent};
use kept::Kept;

mod abi;
mod counters;
mod features;
mod kept;
mod plan;
mod queue;
mod record;
mod sampler;
pub use ember_parse::perf_record;
pub mod tasks;
pub mod unwind;
pub use features::{kernel_release, Feature, FeatureState, LoadReport, ProgramStat, Reason};
pub use queue::{
    batch_bytes, work_queue, Ask, Batch, QueueBytes, Work, WorkReceiver, WorkSender, WORK_QUEUE,
};
pub use record::{parse_offcpu_record, parse_record, OffCpuScale, OffRecord, MAX_FRAMES};
pub use tasks::{Drained, Mmap, TaskError, TaskEvent, TaskWatch};
pub use unwind::UnwindMaps;

#[allow(missing_docs, clippy::all, clippy::unwrap_used, unsafe_op_in_unsafe_fn)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/ember.skel.rs"));
}
use counters::CounterSync;
use record::{REC_RANGE_MISS, REC_UNKNOWN_PROCESS, REC_UNREAD};
use sampler::Sampler;
use skel::types::ember_offcpu_sum;

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
    /// The kernel refused the sampler itself (the one part with no simpler variant).
    #[error("the kernel {kernel} refused {part}: {line}")]
    Refused {
        /// The program or map.
        part: String,
        /// `uname -r`.
        kernel: String,
        /// The verifier's (or libbpf's) last line about it.
        line: String,
    },
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
    report: LoadReport,
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
            Ok(Ok((maps, report))) => Ok((
                Self {
                    stop,
                    thread: Some(thread),
                    report,
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

    /// What loaded on this kernel: each feature's state, each program's verifier cost.
    pub fn report(&self) -> &LoadReport {
        &self.report
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
    ready: SyncSender<Result<(Option<UnwindMaps>, LoadReport), CaptureError>>,
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
    let (mut sampler, report) = match Sampler::load(&settings, &offcpu) {
        Ok(s) => s,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    report.publish(&metrics);
    if let Err(e) = sampler.sync_cpus(&settings, &metrics) {
        let _ = ready.send(Err(e));
        return;
    }

    let maps = match sampler.unwind_maps() {
        Ok(m) => m,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let batch: Rc<RefCell<Batch>> = Rc::default();
    let malformed = Rc::new(RefCell::new(0u64));
    // Records kept for the kernel's off-CPU sums: twice the keys it counts, two periods.
    let kept = Rc::new(RefCell::new(Kept::new(2 * offcpu.max_stacks as usize)));
    let scale = OffCpuScale::of(&offcpu);
    let ring = match ring_buffer(&sampler, scale, asks, &batch, &malformed, &kept, &metrics) {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(CaptureError::Load(e)));
            return;
        }
    };
    let _ = ready.send(Ok((maps, report)));

    let mut counters = CounterSync::default();
    let (mut last_sync, mut last_cpu_check) = (Instant::now(), Instant::now());
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
    let (mut poll_errors, mut sums_read) = (0u64, None);
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
        if sums_due(windows, &mut sums_read) {
            drain_sums(&sampler, &ring, &kept, scale, &batch, &metrics);
        }
        flush(false);
        apply_orders(&mut sampler, &control, &metrics);
        if due(&mut last_sync, Duration::from_secs(1)) {
            counters.sync(&sampler, &metrics);
        }
        if due(&mut last_cpu_check, CPU_CHECK_EVERY) {
            if let Err(e) = sampler.sync_cpus(&settings, &metrics) {
                warn!("CPU hotplug check failed: {e}");
            }
        }
    }
    // Detach first so nothing new arrives, then take everything still buffered.
    sampler.links.clear();
    sampler.offcpu_links.clear();
    let _ = ring.consume();
    drain_sums(&sampler, &ring, &kept, scale, &batch, &metrics);
    flush(true);
    counters.sync(&sampler, &metrics);
}

/// Loads the BPF object as `run` and `record` would with these settings, attaches nothing
/// to CPUs, and says what loaded (`ember features`).
pub fn probe_features(
    sampling: &Sampling,
    offcpu: &OffCpuSettings,
) -> Result<LoadReport, CaptureError> {
    Sampler::load(sampling, offcpu).map(|(_, report)| report)
}

/// Entries of `offcpu_sums` read and deleted per syscall.
const SUMS_BATCH: u32 = 256;

/// Reads and deletes the kernel's off-CPU sums (`offcpu_sums`) into `batch`, as copies of
/// the records kept for their keys. The ring is drained first (in the caller) and again
/// right after the read: an entry is made just after its key's record is sent.
fn drain_sums(
    sampler: &Sampler<'_>,
    ring: &RingBuffer<'_>,
    kept: &RefCell<Kept>,
    scale: OffCpuScale,
    batch: &RefCell<Batch>,
    metrics: &Metrics,
) {
    use libbpf_rs::{MapCore, MapFlags};
    if sampler.offcpu_links.is_empty() {
        return;
    }
    let sums: Vec<(u64, ember_offcpu_sum)> = match sampler
        .skel
        .maps
        .offcpu_sums
        .lookup_and_delete_batch(SUMS_BATCH, MapFlags::ANY, MapFlags::ANY)
    {
        Ok(entries) => entries.filter_map(|(k, v)| parse_sum(&k, &v)).collect(),
        Err(e) => {
            warn!("reading the off-CPU sums failed: {e}");
            Vec::new()
        }
    };
    let _ = ring.consume();
    let samples = kept
        .borrow_mut()
        .sums(sums, scale, &mut |e, n| metrics.offcpu(e, n));
    batch.borrow_mut().extend(samples);
}

/// One `offcpu_sums` entry as the batch read returns it.
fn parse_sum(key: &[u8], value: &[u8]) -> Option<(u64, ember_offcpu_sum)> {
    let key = u64::from_ne_bytes(key.try_into().ok()?);
    if value.len() != std::mem::size_of::<ember_offcpu_sum>() {
        return None;
    }
    // SAFETY: the length was checked; ember_offcpu_sum is plain old data.
    let sum = unsafe { std::ptr::read_unaligned(value.as_ptr().cast::<ember_offcpu_sum>()) };
    Some((key, sum))
}

/// Reads the ring buffers (samples, and off-CPU samples when those programs are attached)
/// into `batch`, counting the records too short to parse in `malformed`; a record naming a
/// process the walker holds no ranges for asks the unwind loader at once, through `asks`.
fn ring_buffer(
    sampler: &Sampler<'_>,
    scale: OffCpuScale,
    asks: WorkSender,
    batch: &Rc<RefCell<Batch>>,
    malformed: &Rc<RefCell<u64>>,
    kept: &Rc<RefCell<Kept>>,
    metrics: &Metrics,
) -> Result<RingBuffer<'static>, libbpf_rs::Error> {
    let mut builder = RingBufferBuilder::new();
    let (cb_batch, cb_bad, cb_metrics) = (batch.clone(), malformed.clone(), metrics.clone());
    // Asked at once, not at the next batch: the process may live 30 ms.
    // `at`: when the record was taken (CLOCK_MONOTONIC ns).
    let ask = move |pid: u32, flags: u8, at: u64, metrics: &Metrics| {
        let ask = match flags {
            f if f & REC_UNREAD != 0 => Some(Ask::Unread { pid, at }),
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
                    cb_ask(s.pid, flags, s.time_ns, &cb_metrics);
                    cb_batch.borrow_mut().push(s)
                }
                None => *cb_bad.borrow_mut() += 1,
            }
            0
        })
        .map(|_| ());
    if !sampler.offcpu_links.is_empty() {
        if sampler.klocks_unsupported {
            metrics.offcpu(OffCpuEvent::KernelLockUnsupported, 1);
        }
        let (cb_batch, cb_metrics, cb_kept) = (batch.clone(), metrics.clone(), kept.clone());
        added = added.and_then(|()| {
            builder
                .add(&sampler.skel.maps.offcpu_samples, move |data: &[u8]| {
                    match parse_offcpu_record(data, scale) {
                        Some((record, flags)) => {
                            // Off-CPU records never ask for an unread process.
                            ask(record.pid(), flags, u64::MAX, &cb_metrics);
                            let samples = cb_kept
                                .borrow_mut()
                                .take(data, record, &mut |e| cb_metrics.offcpu(e, 1));
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
fn apply_orders(sampler: &mut Sampler<'_>, control: &Receiver<Control>, metrics: &Metrics) {
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

/// How far past [`BEFORE_BOUNDARY`] a drain still counts as the one before the boundary.
const SUMS_SLACK: Duration = Duration::from_millis(25);

/// The window whose end a drain at `now` reads the kernel's off-CPU sums for: the kernel
/// counts a key's repeats from one read to the next, so reading once a window (at its
/// last drain, or the first drain past its end if that one was late) sends each key's
/// record once a window, not once a second; and a full read walks every bucket of the
/// map (~100 µs for 8192), whether it holds anything or not. `None` (no wall-clock
/// windows, as in `ember record`): every drain reads them.
fn sums_window(windows: Option<Duration>, now: SystemTime) -> Option<u128> {
    let w = windows?.as_nanos().max(1);
    let soon = now + BEFORE_BOUNDARY + SUMS_SLACK;
    Some(
        soon.duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
            / w,
    )
}

/// Whether this drain reads the off-CPU sums (see [`sums_window`]); notes the window read.
fn sums_due(windows: Option<Duration>, read: &mut Option<u128>) -> bool {
    let window = sums_window(windows, SystemTime::now());
    let due = window.is_none() || window != *read;
    *read = window;
    due
}

/// Whether `every` has passed since `last` (then `last` is now).
fn due(last: &mut Instant, every: Duration) -> bool {
    let due = last.elapsed() >= every;
    if due {
        *last = Instant::now();
    }
    due
}

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

    /// Issue 53: the sampler's records carry their process's start time as
    /// `/proc/PID/stat` field 22 shows it: the thread group leader's (not the sampled
    /// thread's, started later), in clock ticks. Needs root (the sampler is loaded).
    #[test]
    fn records_carry_the_start_time_proc_shows() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var("EMBER_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
                "needs root (the sampler) and EMBER_REQUIRE_PRIVILEGED=1 forbids skipping"
            );
            eprintln!("skipped: needs root");
            return;
        }
        let pid = std::process::id();
        let (batches_tx, batches) = mpsc::sync_channel(1024);
        let (_control_tx, control) = mpsc::sync_channel(1);
        let parts = Parts {
            sampling: Sampling {
                frequency_hz: 997,
                pids: vec![pid],
                unwind: crate::config::UnwindMode::FramePointer,
                ..Default::default()
            },
            offcpu: OffCpuSettings {
                enabled: false,
                ..Default::default()
            },
            windows: None,
            batches: batches_tx,
            budget: QueueBytes::new(256 << 20),
            control,
            metrics: Metrics::new(),
        };
        let (capture, _link) = Capture::start(parts).expect("the sampler loads");
        // A thread started well after its process (ticks are 10 ms), spinning.
        std::thread::sleep(Duration::from_millis(50));
        let stop = Arc::new(AtomicBool::new(false));
        let (tid_tx, tid_rx) = mpsc::channel();
        let spin = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                // SAFETY: gettid has no preconditions.
                let _ = tid_tx.send(unsafe { libc::gettid() } as u32);
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
                }
            })
        };
        let tid = tid_rx.recv().expect("the spinning thread's id");
        let task_dir = format!("/proc/{pid}/task");
        let thread_start = crate::os::procfs::start_time(std::path::Path::new(&task_dir), tid);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = Vec::new();
        while seen.len() < 5 && Instant::now() < deadline {
            if let Ok(batch) = batches.recv_timeout(Duration::from_millis(200)) {
                seen.extend(
                    batch
                        .iter()
                        .filter(|s| s.pid == pid && s.tid == tid)
                        .map(|s| s.start_time),
                );
            }
        }
        stop.store(true, Ordering::Relaxed);
        let _ = spin.join();
        capture.stop();
        let proc_start = crate::os::procfs::start_time(std::path::Path::new("/proc"), pid)
            .expect("/proc/self/stat");
        assert_ne!(thread_start, Some(proc_start), "the thread started later");
        assert!(seen.len() >= 5, "samples of the spinning thread: {seen:?}");
        let other: Vec<u64> = seen.iter().copied().filter(|&t| t != proc_start).collect();
        assert!(
            other.is_empty(),
            "{} of {} records: start time {:?}, /proc/{pid}/stat: {proc_start}",
            other.len(),
            seen.len(),
            other.first()
        );
    }

    #[test]
    fn reads_the_sums_once_a_window_at_its_last_drain() {
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(1_800_000_000_000 + ms);
        assert_eq!(sums_window(None, at(500)), None);
        let w = Some(Duration::from_secs(10));
        // Every drain of a window but the last falls in the same turn; the last one (20 ms
        // before the boundary, or a little later) and any late one after it, in the next.
        let drains = [980, 1_980, 8_980, 9_980, 9_990, 10_500, 10_980, 19_981];
        let turns: Vec<u128> = drains
            .iter()
            .map(|&d| sums_window(w, at(d)).expect("windows"))
            .collect();
        let first = turns[0];
        assert_eq!(
            turns.iter().map(|t| t - first).collect::<Vec<_>>(),
            [0, 0, 0, 1, 1, 1, 1, 2]
        );
    }
}
