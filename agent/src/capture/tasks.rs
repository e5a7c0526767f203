//! Every process's executable mappings from the moment it execs, from the kernel itself.
//!
//! perf's own mechanism: one dummy software event per online CPU (pid -1) with `mmap2`,
//! `comm`/`comm_exec` and `task` set. The kernel writes `PERF_RECORD_MMAP2` (executable
//! mappings only: no `mmap_data`), `COMM` (exec), `FORK`, `EXIT` and `LOST` records into each
//! event's ring as they happen, in the mapping process's context, so a process that lives
//! 30 ms is known before its first sample is symbolized, and after it is gone. Times are
//! CLOCK_MONOTONIC, as the BPF sampler's `bpf_ktime_get_ns`.
//!
//! Why this and not BPF (`sched_process_exec` + a VMA iterator, `bpf_find_vma`): the records
//! come for free with the exact (dev, inode, offset) of every executable mapping, including
//! the ones `dlopen` and JITs add later, with no BPF program or map to size, and the kernel
//! counts what it drops (`PERF_RECORD_LOST`).
//!
//! Each ring wakes its reader on every record (`watermark` = 1 byte): the dummy event has no
//! samples, and without a byte watermark the kernel would wake the reader only when half
//! the ring is full. The reader then lets records gather for a few milliseconds before it
//! drains them (see [`GATHER`]).

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::TrySendError;
use std::sync::Arc;
use std::time::{Duration, Instant};

use libbpf_rs::libbpf_sys;
use tracing::{debug, warn};

use super::{Work, WorkSender};
use crate::metrics::{Cache, Metrics, ProcRead};

use super::perf_record::{parse, take_record, Record};
pub use super::perf_record::{Mmap, Reject, TaskEvent};

/// Most data pages per CPU ring (4 MiB with 4 KiB pages).
pub const MAX_RING_PAGES: usize = 1024;

/// Errors of [`TaskWatch`].
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// `ring_pages` is not a power of two between 1 and [`MAX_RING_PAGES`].
    #[error("ring pages must be a power of two from 1 to {MAX_RING_PAGES}, not {0}")]
    RingPages(usize),
    /// The system page size could not be read.
    #[error("cannot read the page size")]
    PageSize,
    /// No CPU could be watched; the error of the last CPU tried.
    #[error("cannot watch tasks on any CPU (cpu {cpu}: {source})")]
    NoCpu {
        /// The last CPU tried.
        cpu: u32,
        /// Its error (`perf_event_open` or `mmap`).
        #[source]
        source: std::io::Error,
    },
    /// The list of CPUs was empty.
    #[error("no CPU to watch")]
    NoCpus,
    /// The online CPUs could not be read from sysfs.
    #[error("cannot read the online CPUs")]
    OnlineCpus,
}

/// What one [`TaskWatch::drain`] read besides the events.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Records read, of every type (reported or not).
    pub records: u64,
    /// Records the kernel dropped because a ring was full (`PERF_RECORD_LOST`).
    pub lost: u64,
    /// Times a ring's framing made no sense and its reader skipped to the kernel's head.
    pub malformed: u64,
    /// Records the parser refused.
    pub rejected: u64,
}

/// One dummy perf event per CPU and its mmap'd ring.
pub struct TaskWatch {
    rings: BTreeMap<u32, Ring>,
    ring_pages: usize,
    page_size: usize,
    /// One record, copied out of a ring (records can wrap around its end).
    scratch: Vec<u8>,
}

impl TaskWatch {
    /// Opens a ring of `ring_pages` data pages (a power of two) on each of `cpus`. Fails only
    /// when no CPU could be watched; the others are logged.
    pub fn open(cpus: &[u32], ring_pages: usize) -> Result<Self, TaskError> {
        if !ring_pages.is_power_of_two() || ring_pages > MAX_RING_PAGES {
            return Err(TaskError::RingPages(ring_pages));
        }
        // SAFETY: sysconf has no preconditions.
        let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let page_size = usize::try_from(page_size)
            .ok()
            .filter(|p| p.is_power_of_two())
            .ok_or(TaskError::PageSize)?;
        let mut watch = Self {
            rings: BTreeMap::new(),
            ring_pages,
            page_size,
            scratch: Vec::with_capacity(usize::from(u16::MAX)),
        };
        watch.sync_cpus(cpus)?;
        Ok(watch)
    }

    /// [`TaskWatch::open`] on every online CPU.
    pub fn open_online(ring_pages: usize) -> Result<Self, TaskError> {
        let cpus = crate::os::procfs::online_cpus().ok_or(TaskError::OnlineCpus)?;
        Self::open(&cpus, ring_pages)
    }

    /// Attaches to CPUs that came online and lets go of those that went away (drain first:
    /// a dropped ring's unread records are gone). Fails only when no CPU is watched.
    pub fn sync_cpus(&mut self, online: &[u32]) -> Result<(), TaskError> {
        self.rings.retain(|cpu, _| online.contains(cpu));
        let mut last_err = None;
        for &cpu in online {
            if self.rings.contains_key(&cpu) {
                continue;
            }
            match Ring::open(cpu, self.ring_pages, self.page_size) {
                Ok(ring) => {
                    self.rings.insert(cpu, ring);
                }
                Err(e) => last_err = Some((cpu, e)),
            }
        }
        match (self.rings.is_empty(), last_err) {
            (true, Some((cpu, source))) => Err(TaskError::NoCpu { cpu, source }),
            (true, None) => Err(TaskError::NoCpus),
            (false, Some((cpu, e))) => {
                warn!("task records are not watched on cpu {cpu}: {e}");
                Ok(())
            }
            (false, None) => Ok(()),
        }
    }

    /// The CPUs watched.
    pub fn cpus(&self) -> impl Iterator<Item = u32> + '_ {
        self.rings.keys().copied()
    }

    /// Waits until the kernel signals a new record on some ring (each record signals at
    /// once) or `timeout` passes (or a signal arrives). perf's poll reports signals since
    /// the last poll, not unread bytes: it may return with nothing left to drain, and it
    /// returns within microseconds while processes keep starting, so a caller that wants
    /// records to accumulate (e.g. a new program's libraries) should sleep, not wait.
    pub fn wait(&self, timeout: Duration) -> std::io::Result<()> {
        let mut fds: Vec<libc::pollfd> = self
            .rings
            .values()
            .map(|r| libc::pollfd {
                fd: r.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // Round up, so a short timeout does not turn into a busy loop.
        let ms = timeout.as_nanos().div_ceil(1_000_000);
        let ms = libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX);
        // SAFETY: fds is a valid array of fds.len() pollfd structs for the whole call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Appends every whole record now in the rings to `out`, advancing each ring's tail: at
    /// most one event per 40 bytes of ring (the shortest record reported), so `out` grows by
    /// a bounded amount per call.
    /// Events are sorted by time across CPUs within one call (stable: a CPU's own order
    /// is kept for equal times), so a child's FORK, read on its parent's CPU, comes before
    /// its EXEC, read on its own.
    pub fn drain(&mut self, out: &mut Vec<TaskEvent>) -> Drained {
        let from = out.len();
        let mut drained = Drained::default();
        for ring in self.rings.values_mut() {
            ring.drain(&mut self.scratch, out, &mut drained);
        }
        out[from..].sort_by_key(TaskEvent::time_ns);
        drained
    }
}

/// One CPU's event: its fd and its mapping (`perf_event_mmap_page`, then the data pages).
struct Ring {
    /// Closed after the mapping is unmapped (fields drop after `Drop::drop`).
    fd: OwnedFd,
    base: NonNull<u8>,
    map_len: usize,
    /// Offset of the data area in the mapping (one page).
    data_off: usize,
    /// Bytes of the data area, a power of two.
    data_size: usize,
}

// SAFETY: the mapping belongs to this Ring alone (nothing else has its address) and is
// only touched through `&mut self` or atomics, so moving it to another thread is sound.
unsafe impl Send for Ring {}

impl Ring {
    fn open(cpu: u32, pages: usize, page_size: usize) -> std::io::Result<Self> {
        let fd = open_dummy_event(cpu)?;
        let map_len = (pages + 1) * page_size;
        // SAFETY: a fresh shared mapping of a perf fd; the kernel checks the length (1 + 2^n
        // pages). PROT_WRITE lets ember publish data_tail, so the kernel never overwrites
        // records not yet read.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = NonNull::new(base.cast::<u8>()).ok_or_else(std::io::Error::last_os_error)?;
        Ok(Self {
            fd,
            base,
            map_len,
            data_off: page_size,
            data_size: pages * page_size,
        })
    }

    /// A u64 of the header page: [`HEAD`] or [`TAIL`].
    fn header_word(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: the header page is mapped for as long as self lives; data_head and
        // data_tail are 8-byte aligned u64s in it (offsets 1024 and 1032 of a page-aligned
        // mapping), which the kernel and ember access only as whole, aligned words.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(offset).cast::<u64>()) }
    }

    fn drain(&mut self, buf: &mut Vec<u8>, out: &mut Vec<TaskEvent>, drained: &mut Drained) {
        // Acquire: the record bytes before data_head are visible once data_head is.
        let head = self.header_word(HEAD).load(Ordering::Acquire);
        let mut tail = self.header_word(TAIL).load(Ordering::Relaxed);
        let data = self.base.as_ptr().wrapping_add(self.data_off);
        let copy = |off: usize, dst: &mut [u8]| {
            // SAFETY: take_record asks only for off + dst.len() <= data_size: inside the data
            // area, which is mapped for as long as self lives. Bytes between tail and head
            // are the kernel's finished records, which it does not write again until the
            // tail passes them.
            unsafe { std::ptr::copy_nonoverlapping(data.add(off), dst.as_mut_ptr(), dst.len()) }
        };
        while tail != head {
            match take_record(self.data_size as u64, head, tail, copy, buf) {
                Ok(len) => {
                    drained.records += 1;
                    match parse(buf) {
                        Ok(Some(Record::Task(event))) => out.push(event),
                        Ok(Some(Record::Lost(n))) => drained.lost += n,
                        Ok(None) => {}
                        Err(_) => drained.rejected += 1,
                    }
                    tail = tail.wrapping_add(len as u64);
                }
                Err(_) => {
                    drained.malformed += 1;
                    tail = head;
                }
            }
        }
        // Release: the kernel may reuse the space only after ember is done reading it.
        self.header_word(TAIL).store(tail, Ordering::Release);
    }
}

/// Offsets of `data_head` and `data_tail` in `perf_event_mmap_page`.
const HEAD: usize = std::mem::offset_of!(libbpf_sys::perf_event_mmap_page, data_head);
const TAIL: usize = std::mem::offset_of!(libbpf_sys::perf_event_mmap_page, data_tail);
const _: () = assert!(HEAD == 1024 && TAIL == 1032);

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: base and map_len are the mapping made in Ring::open, unmapped only here;
        // no reference into it outlives self.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.map_len) };
    }
}

/// A dummy software event on `cpu` for every task, writing task records only.
fn open_dummy_event(cpu: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: perf_event_attr is a plain C struct for which all-zero is a valid value.
    let mut attr: libbpf_sys::perf_event_attr = unsafe { std::mem::zeroed() };
    attr.size = std::mem::size_of::<libbpf_sys::perf_event_attr>() as u32;
    attr.type_ = libbpf_sys::PERF_TYPE_SOFTWARE;
    attr.config = u64::from(libbpf_sys::PERF_COUNT_SW_DUMMY);
    attr.sample_type = u64::from(libbpf_sys::PERF_SAMPLE_TID | libbpf_sys::PERF_SAMPLE_TIME);
    attr.set_mmap(1);
    attr.set_mmap2(1);
    attr.set_comm(1);
    attr.set_comm_exec(1);
    attr.set_task(1);
    attr.set_sample_id_all(1);
    attr.set_use_clockid(1);
    attr.clockid = libc::CLOCK_MONOTONIC;
    // Wake the reader as soon as one byte is written: these records are not samples, so
    // wakeup_events would not count them.
    attr.set_watermark(1);
    attr.__bindgen_anon_2.wakeup_watermark = 1;
    crate::os::perf_event::open(&attr, cpu, None)
}

/// How often the task record reader checks for CPUs brought online.
const CPU_CHECK_EVERY: Duration = Duration::from_secs(5);
/// The longest the task record reader sleeps: every record wakes it at once, so this only
/// bounds how late it sees CPUs brought online and the stop flag (nothing waits for it to
/// end). Every wakeup of an idle thread costs; the loader itself sleeps until work comes.
const READER_WAIT: Duration = CPU_CHECK_EVERY;
/// How long the reader lets records gather after a wake-up before it drains them. Every
/// record wakes it (and each wake-up used to wake the loader): a process that forks, execs,
/// maps its libraries and exits is about ten records, so a host spawning 200 processes a
/// second cost thousands of wake-ups of two threads a second (4 % of a core in this thread
/// alone, bench/churn.py). The loader waits 2 ms after an exec for the libraries anyway
/// (its SETTLE), and the exec hook writes a new program's ranges at once, so 4 ms more
/// delays nothing the sampler needs; at most 250 wake-ups a second. A process sampled
/// before the loader read it does not wait for its records either: the sample asks the
/// loader through the sampler's ring, which wakes it at once (`Ask::Unread`).
const GATHER: Duration = Duration::from_millis(4);

/// What the task record reader (`ember-tasks`) and the unwind loader share: the loader
/// stops the reader when it ends, and the reader tells the loader that records were lost
/// (an exit may be among them: the loader sweeps).
#[derive(Debug, Clone, Default)]
pub struct TaskLink {
    stop: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
}

impl TaskLink {
    /// Makes the reader return (within [`READER_WAIT`]).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Whether records were lost since the last call.
    pub fn take_lost(&self) -> bool {
        self.lost.swap(false, Ordering::Relaxed)
    }

    fn lose(&self) {
        self.lost.store(true, Ordering::Relaxed);
    }
}

/// The task record reader's thread (`ember-tasks`): only copies records out of the
/// kernel's rings into the loader's queue `tx`, so a loader busy compiling a large table
/// never lets a ring overflow. Returns when `link` is stopped or the loader is gone.
pub fn forward(mut watch: TaskWatch, tx: WorkSender, metrics: Metrics, link: TaskLink) {
    let mut events = Vec::new();
    let mut last_sync = Instant::now();
    while !link.stop.load(Ordering::Relaxed) {
        if let Err(e) = watch.wait(READER_WAIT) {
            debug!("task records: poll failed: {e}");
            std::thread::sleep(READER_WAIT);
        }
        std::thread::sleep(GATHER);
        let d = watch.drain(&mut events);
        if d.lost > 0 {
            metrics.dropped(Cache::TaskRecords, d.lost);
            link.lose();
        }
        if d.malformed + d.rejected > 0 {
            metrics.proc_read_error(ProcRead::TaskRecord, d.malformed + d.rejected);
        }
        for ev in events.drain(..) {
            match tx.try_send(Work::Task(ev)) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    metrics.dropped(Cache::TaskRecords, 1);
                    link.lose();
                }
                Err(TrySendError::Disconnected(_)) => return,
            }
        }
        if last_sync.elapsed() >= CPU_CHECK_EVERY {
            last_sync = Instant::now();
            if let Some(online) = crate::os::procfs::online_cpus() {
                if let Err(e) = watch.sync_cpus(&online) {
                    debug!("task records: {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;
    use std::process::Command;
    use std::time::Instant;

    use super::*;

    /// True when this test can open system-wide perf events (root). Otherwise it is skipped,
    /// or fails under `EMBER_REQUIRE_PRIVILEGED=1`, as tests/src/lib.rs `require_privileged`.
    fn privileged() -> bool {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            return true;
        }
        assert!(
            std::env::var("EMBER_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
            "needs root (system-wide perf events) and EMBER_REQUIRE_PRIVILEGED=1 forbids skipping"
        );
        eprintln!("skipped: needs root");
        false
    }

    fn monotonic_ns() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: ts is a valid timespec to write to.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    /// (major, minor, inode) of a file, as MMAP2 reports them.
    fn dev_inode(path: &str) -> ((u32, u32), u64) {
        let m = std::fs::metadata(path).expect("stat");
        ((libc::major(m.dev()), libc::minor(m.dev())), m.ino())
    }

    /// The dynamic loader a binary asks for (`PT_INTERP`).
    fn interpreter(path: &str) -> String {
        use object::read::elf::{FileHeader, ProgramHeader};
        let data = std::fs::read(path).expect("read");
        let elf = object::elf::FileHeader64::<object::Endianness>::parse(&*data).expect("elf");
        let endian = elf.endian().expect("endian");
        let interp = elf
            .program_headers(endian, &*data)
            .expect("program headers")
            .iter()
            .find_map(|ph| ph.interpreter(endian, &*data).ok().flatten())
            .expect("PT_INTERP");
        String::from_utf8_lossy(interp).into_owned()
    }

    #[test]
    fn rejects_bad_ring_sizes() {
        for pages in [0, 3, MAX_RING_PAGES * 2] {
            assert!(matches!(
                TaskWatch::open(&[0], pages),
                Err(TaskError::RingPages(p)) if p == pages
            ));
        }
    }

    /// A process that execs `true` and exits at once: its exec, its mappings (the binary
    /// and the loader, with the dev/inode `stat` sees) and its exit all arrive. Runs a few
    /// times, with a 2-page ring so the records wrap around its end, and prints how long
    /// after the exec the mappings were readable.
    #[test]
    fn sees_a_short_process_from_exec_to_exit() {
        if !privileged() {
            return;
        }
        let cpus = crate::os::procfs::online_cpus().expect("online cpus");
        let mut watch = TaskWatch::open(&cpus, 2).expect("open");
        assert_eq!(watch.cpus().count(), cpus.len());
        let true_path = std::fs::canonicalize("/bin/true").expect("true");
        let true_path = true_path.to_str().expect("utf-8");
        let binary = dev_inode(true_path);
        let loader = dev_inode(&interpreter(true_path));

        let (mut after_exec, mut after_write) = (Vec::new(), Vec::new());
        let mut totals = Drained::default();
        for run in 0..7 {
            let mut child = Command::new("/bin/sh")
                .args(["-c", &format!("exec {true_path}")])
                .spawn()
                .expect("spawn sh");
            let pid = child.id();
            let mut events = Vec::new();
            let mut seen_binary_at = None;
            let deadline = Instant::now() + Duration::from_secs(10);
            while !events
                .iter()
                .any(|e| matches!(e, TaskEvent::Exit { pid: p, .. } if *p == pid))
            {
                assert!(Instant::now() < deadline, "run {run}: no exit of {pid}");
                watch.wait(Duration::from_secs(1)).expect("wait");
                let from = events.len();
                let d = watch.drain(&mut events);
                let now = monotonic_ns();
                totals.records += d.records;
                totals.lost += d.lost;
                totals.malformed += d.malformed;
                totals.rejected += d.rejected;
                for e in &events[from..] {
                    if let TaskEvent::Mmap(m) = e {
                        if m.pid == pid && m.path == true_path && seen_binary_at.is_none() {
                            seen_binary_at = Some((now, m.time_ns));
                        }
                    }
                }
            }
            child.wait().expect("wait for sh");
            events.retain(|e| match e {
                TaskEvent::Exec { pid: p, .. } | TaskEvent::Exit { pid: p, .. } => *p == pid,
                TaskEvent::Fork { pid: p, .. } => *p == pid,
                TaskEvent::Mmap(m) => m.pid == pid,
            });
            let me = std::process::id();
            assert!(
                matches!(events.first(), Some(TaskEvent::Fork { ppid, .. }) if *ppid == me),
                "run {run}: the fork does not come first: {events:#?}"
            );
            let exec = events
                .iter()
                .rposition(
                    |e| matches!(e, TaskEvent::Exec { comm, .. } if comm.starts_with(b"true\0")),
                )
                .unwrap_or_else(|| panic!("run {run}: no exec of true: {events:#?}"));
            let exec_time = events[exec].time_ns();
            let maps: Vec<&Mmap> = events[exec..]
                .iter()
                .filter_map(|e| match e {
                    TaskEvent::Mmap(m) => Some(m),
                    _ => None,
                })
                .collect();
            for (what, (dev, inode)) in [("binary", binary), ("loader", loader)] {
                assert!(
                    maps.iter().any(|m| m.dev == dev
                        && m.inode == inode
                        && m.prot & libc::PROT_EXEC as u32 != 0
                        && m.len > 0),
                    "run {run}: no executable mapping of the {what}: {maps:#?}"
                );
            }
            assert!(maps.iter().any(|m| m.path == true_path));
            let (read_at, written_at) = seen_binary_at.expect("binary mapping seen");
            after_exec.push(read_at.saturating_sub(exec_time));
            after_write.push(read_at.saturating_sub(written_at));
        }
        after_exec.sort_unstable();
        after_write.sort_unstable();
        eprintln!(
            "MMAP2 of the binary readable after its exec: median {} µs (all {:?} µs); after \
             being written: median {} µs; {totals:?}",
            after_exec[after_exec.len() / 2] / 1000,
            after_exec.iter().map(|n| n / 1000).collect::<Vec<_>>(),
            after_write[after_write.len() / 2] / 1000,
        );
        assert_eq!((totals.malformed, totals.rejected), (0, 0));
    }

    /// Records per second and the reader's CPU time on this host, for
    /// `EMBER_TASKS_SECONDS` (default 10): run it beside a workload (e.g. `make -j2`).
    /// `EMBER_TASKS_BATCH_MS` sleeps that long after each wake-up, to batch records.
    #[test]
    #[ignore = "a measurement: run by hand with --ignored --nocapture"]
    fn measure_record_rate() {
        if !privileged() {
            return;
        }
        let secs: u64 = std::env::var("EMBER_TASKS_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10);
        let batch: u64 = std::env::var("EMBER_TASKS_BATCH_MS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let cpus = crate::os::procfs::online_cpus().expect("online cpus");
        let mut watch = TaskWatch::open(&cpus, 64).expect("open");
        let cpu_time = || {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: ts is a valid timespec to write to.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
            ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
        };
        let (start, cpu0) = (Instant::now(), cpu_time());
        let mut totals = Drained::default();
        let (mut execs, mut mmaps, mut forks, mut exits, mut wakeups) =
            (0u64, 0u64, 0u64, 0u64, 0u64);
        let mut events = Vec::new();
        while start.elapsed() < Duration::from_secs(secs) {
            watch.wait(Duration::from_millis(200)).expect("wait");
            wakeups += 1;
            std::thread::sleep(Duration::from_millis(batch));
            events.clear();
            let d = watch.drain(&mut events);
            totals.records += d.records;
            totals.lost += d.lost;
            totals.malformed += d.malformed;
            totals.rejected += d.rejected;
            for e in &events {
                match e {
                    TaskEvent::Exec { .. } => execs += 1,
                    TaskEvent::Mmap(_) => mmaps += 1,
                    TaskEvent::Fork { .. } => forks += 1,
                    TaskEvent::Exit { .. } => exits += 1,
                }
            }
        }
        let wall = start.elapsed().as_secs_f64();
        let cpu = (cpu_time() - cpu0) as f64 / 1e9;
        eprintln!(
            "{wall:.1} s: {:.0} records/s ({:.0} exec, {:.0} mmap, {:.0} fork, {:.0} exit /s), \
             {:.0} wakeups/s, reader CPU {:.3} % of a core; {totals:?}",
            totals.records as f64 / wall,
            execs as f64 / wall,
            mmaps as f64 / wall,
            forks as f64 / wall,
            exits as f64 / wall,
            wakeups as f64 / wall,
            100.0 * cpu / wall,
        );
    }
}
