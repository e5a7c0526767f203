//! The unwind loader: fills the sampler's maps so it can walk a process's stack by tables.
//!
//! It owns every table and range the sampler holds. The sampler asks for a process the
//! first time it samples one it has no ranges for ([`Ask::Process`]), and again when a pc
//! falls outside them ([`Ask::Remap`], a library loaded since); the loader reads the
//! process's executable mappings, finds or builds each object's table and writes the
//! process's ranges in one map update.
//!
//! - **Objects** are read inside the process's root (`/proc/PID/map_files`, else
//!   `openat2(RESOLVE_IN_ROOT)`; the shared [`crate::normalize::object::open_mapped`]), non-blocking, regular files only, at most
//!   `Limits::max_object_bytes`, and only if the file opened is the inode the mapping names;
//!   a file seen before (same device, inode, size, mtime and ctime: an inode freed and
//!   reused by another file differs at least in its ctime, which no one can set) is not
//!   read again. What is read of it is its headers and CFI, each part capped
//!   ([`super::sparse`]).
//! - **Files by inode**, as the kernel names them (mmap records, the sampler's
//!   `unwind_files`), can name another file once the inode is freed: the loader's map from
//!   inode to table holds only files some process it knows still maps (a mapped inode
//!   cannot be freed), and each `unwind_files` entry carries the file's size and ctime,
//!   which the sampler checks against the inode it finds.
//! - **Tables** are keyed by the SHA-256 of the object's bytes, not its build id: a build
//!   id is whatever the file says, and a container could otherwise name its own table for
//!   the host's libc. One table serves every process mapping the object. Compiled tables
//!   are kept on disk ([`Store`]) across restarts.
//! - **Kernel memory** (tables plus per-process ranges) stays under
//!   `sampling.unwind_max_bytes`: the least recently used tables (the sampler stamps each
//!   table's slot when it walks it) are evicted, after every process range naming them is
//!   rewritten to the frame pointer, so a slot is never reused under a walker.
//! - A table is one array map created at its exact size with `BPF_F_MMAPABLE` and filled
//!   through mmap: one syscall per table, never one per row.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use libbpf_rs::{libbpf_sys, MapCore, MapFlags, MapHandle, MapType};
use tracing::{debug, warn};

use super::compile::{compile_with, Limits, UnwindTable, DEFAULT_LIMITS};
use super::elf::{Bytes, CodeReader};
use super::error::UnwindError;
use super::sparse::{Sparse, SparseError};
use super::store::{key_of, row_bytes, Store, StoreError, TableKey};
use crate::capture::tasks::{Mmap, TaskEvent, TaskWatch};
use crate::capture::{Ask, UnwindMaps, Work, WorkReceiver, WorkSender};
use crate::metrics::{Cache, Metrics, ProcRead, TableBuild};
use crate::normalize::snapshot::{self, Mapped, ReadError, ReadOptions, Region, Snapshot};
use crate::os::file_id::{FileId, FileTime};
use crate::os::procfs::{self, RegionKind};

/// Bits of a table id that are its slot (`EMBER_UNWIND_SLOT_BITS`), and the slots
/// (`EMBER_UNWIND_TABLES`).
const SLOT_BITS: u32 = 12;
const SLOTS: usize = 1 << SLOT_BITS;
/// Generations of a slot before its ids repeat: below 2^20 - 1, so that no id is
/// [`TABLE_NONE`]. At the wrap the walker's row caches are emptied.
const GENERATIONS: u32 = (1 << (32 - SLOT_BITS)) - 1;
/// 8-byte slots per element of a table's array (`EMBER_UNWIND_CHUNK_SLOTS`): the walker
/// looks up one 4 KiB chunk and searches inside it.
pub(super) const CHUNK_SLOTS: usize = 512;
/// Bytes of one element (`struct ember_unwind_chunk`).
pub(super) const CHUNK_BYTES: usize = CHUNK_SLOTS * 8;
/// Entries of `unwind_files` (`EMBER_UNWIND_FILES`) and segments per entry.
const FILES: usize = 8192;
const FILE_SEGMENTS: usize = 4;
/// Bytes of one `struct ember_unwind_file`.
pub(super) const FILE_BYTES: usize = 32 + FILE_SEGMENTS * 24;
/// Ranges per process (`EMBER_UNWIND_RANGES`).
const RANGES: usize = 64;
/// `EMBER_TABLE_NONE`: walk this range by the frame pointer.
const TABLE_NONE: u32 = u32::MAX;
/// Bytes of one `struct ember_unwind_range` and of a whole `struct ember_unwind_proc`.
const RANGE_BYTES: usize = 24;
const PROC_BYTES: usize = 8 + RANGES * RANGE_BYTES;
/// What the kernel spends on one hash element besides its value (approximate).
const PROC_OVERHEAD: u64 = 64;
/// File identities remembered (each is a few dozen bytes).
const MAX_FILES: usize = 65_536;
/// How often processes that exited are looked for when the kernel's task records are
/// followed: their exit records are the first way, and a lost record triggers a sweep at
/// once, so this only bounds what a missed one costs (each sweep reads the `stat` of every
/// process with ranges).
const SWEEP_EVERY: Duration = Duration::from_secs(30);
/// The same without task records, where sweeps are the only way to see exits.
const SWEEP_EVERY_UNFOLLOWED: Duration = Duration::from_secs(2);
/// How often the task record reader checks for CPUs brought online.
const CPU_CHECK_EVERY: Duration = Duration::from_secs(5);
/// The longest the task record reader sleeps: every record wakes it at once, so this only
/// bounds how late it sees CPUs brought online and the stop flag (nothing waits for it to
/// end). Every wakeup of an idle thread costs; the loader itself sleeps until work comes.
const READER_WAIT: Duration = CPU_CHECK_EVERY;
/// How long after an exec or mmap the loader waits for more before reading the process.
const SETTLE: Duration = Duration::from_millis(2);
/// Processes whose asks wait for the loader.
const MAX_ASKED: usize = 4_096;
/// The sampler's asks served per round of the loader's loop.
const ASKS_PER_ROUND: usize = 4;
/// A table walked this recently is in use: never evicted to make room for another (a host
/// whose working set is over the cap would otherwise evict and rebuild tables endlessly).
const IN_USE: Duration = Duration::from_millis(500);
/// A table refused for want of room is not built or installed again for this long.
const RETRY_REFUSED: Duration = Duration::from_secs(10);
/// A table larger than this share of the cap (1/`MAX_SHARE`) is never installed: it would
/// evict most others.
const MAX_SHARE: u64 = 2;

/// The loader's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Cap on tables plus ranges in kernel memory.
    pub max_bytes: u64,
    /// Where compiled tables are kept; `None`: nowhere.
    pub cache_dir: Option<PathBuf>,
}

/// A mapped file as `/proc/PID/maps` and the kernel's mmap records name it: device
/// (major, minor) and inode.
type Inode = ((u32, u32), u64);

/// What an `unwind_files` entry says of a file besides its table, for the sampler to check
/// against the inode it finds: the inode may since have been freed and given to another file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Published {
    key: TableKey,
    size: u64,
    ctime: FileTime,
}

/// A table's id as the sampler's maps name it (`EMBER_UNWIND_SLOT` in `bpf/ember.h`): its
/// slot in the low [`SLOT_BITS`] and the slot's generation above them. The walker's row
/// cache is keyed by id, so a slot given to another table never serves the rows of the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TableId(u32);

impl TableId {
    /// The id of the table a slot holds after `held` others.
    fn new(slot: u32, held: u64) -> Self {
        // Below GENERATIONS, so it fits in the bits above the slot.
        let generation = (held % u64::from(GENERATIONS)) as u32;
        Self(slot | generation << SLOT_BITS)
    }
}

#[derive(Debug)]
struct Table {
    /// Id in the sampler's maps while loaded.
    id: Option<TableId>,
    /// Kernel bytes while loaded.
    bytes: u64,
    /// Executable segments (address, file offset, bytes), for the bias of each mapping.
    segments: Vec<(u64, u64, u64)>,
}

#[derive(Debug, Clone)]
struct Range {
    start: u64,
    len: u32,
    bias: u64,
    table: Option<TableKey>,
    /// The file mapped, when the range has a table: while a process maps it, its inode
    /// names it and no other file.
    file: Option<Inode>,
}

#[derive(Debug)]
struct Proc {
    start_time: u64,
    ranges: Vec<Range>,
}

/// The loader's state; see the module documentation.
pub struct Loader {
    maps: UnwindMaps,
    used: UsedView,
    settings: Settings,
    limits: Limits,
    metrics: Metrics,
    store: Option<Store>,
    /// Files already identified: their table, or `None` (no table: frame pointers).
    files: HashMap<FileId, Option<TableKey>>,
    /// Tables by inode only, as mmap records name a file: lets a new process's ranges be
    /// written from its records at once (its full read follows a moment later). Only files
    /// that a process in `procs` maps, with how many of their ranges: an inode no one maps
    /// may be freed and reused by another file, so the entry goes with its last range.
    inodes: HashMap<Inode, (TableKey, u32)>,
    tables: HashMap<TableKey, Table>,
    /// What `unwind_files` holds: the kernel's (dev, inode) → table, size and ctime.
    published: HashMap<(u64, u64), Published>,
    slots: Vec<Option<TableKey>>,
    /// Per slot: how many tables it has held (the next one's generation, modulo
    /// [`GENERATIONS`]).
    held: Vec<u64>,
    procs: HashMap<u32, Proc>,
    /// Processes without executable mappings (kernel threads), by start time.
    empty: HashMap<u32, u64>,
    /// Kernel bytes of the loaded tables.
    table_bytes: u64,
    proc_root: PathBuf,
    vdso: Option<Option<TableKey>>,
    /// Tables filled but not yet in `unwind_tables`: put there in one batch, since every
    /// update of a map of maps waits for an RCU grace period (~10 ms here).
    pending: Vec<(u32, MapHandle)>,
    /// Where what was read of each process goes, for the symbolizer (the process may be
    /// gone before its samples are handled).
    snapshots: Option<SyncSender<Snapshot>>,
    /// Tables refused for want of room, and until when they stay refused.
    refused: HashMap<TableKey, Instant>,
    /// Objects whose bytes compile to no table (no CFI, malformed, over a cap): the same
    /// bytes fail the same way, so they are never parsed again (and counted once). A
    /// process reloaded at each of its mmaps re-parsed them every time.
    unbuildable: HashSet<TableKey>,
    /// Set when the agent stops: `run` returns between two pieces of work.
    halt: Arc<AtomicBool>,
}

impl Loader {
    /// A loader filling `maps`.
    pub fn new(maps: UnwindMaps, settings: Settings, metrics: Metrics) -> std::io::Result<Self> {
        let used = UsedView::map(&maps.used)?;
        let store = settings
            .cache_dir
            .as_deref()
            .and_then(|dir| match Store::open(dir) {
                Ok(s) => Some(s),
                Err(e) => {
                    warn!(
                        "unwind table cache {} not usable ({e}); tables are compiled every start",
                        dir.display()
                    );
                    None
                }
            });
        Ok(Self {
            maps,
            used,
            settings,
            limits: DEFAULT_LIMITS,
            metrics,
            store,
            files: HashMap::new(),
            inodes: HashMap::new(),
            tables: HashMap::new(),
            published: HashMap::new(),
            slots: vec![None; SLOTS],
            held: vec![0; SLOTS],
            procs: HashMap::new(),
            empty: HashMap::new(),
            table_bytes: 0,
            proc_root: PathBuf::from("/proc"),
            vdso: None,
            pending: Vec::new(),
            snapshots: None,
            refused: HashMap::new(),
            unbuildable: HashSet::new(),
            halt: Arc::new(AtomicBool::new(false)),
        })
    }

    /// A flag that, once set, makes [`Loader::run`] return between two pieces of work.
    pub fn halt_handle(&self) -> Arc<AtomicBool> {
        self.halt.clone()
    }

    /// Sends what is read of each process to the process table too.
    pub fn send_snapshots(&mut self, tx: SyncSender<Snapshot>) {
        self.snapshots = Some(tx);
    }

    /// The loader's thread: loads `preload` (the processes named in the config, so their
    /// first samples already find their ranges), then follows the kernel's task records
    /// (`watch`: exec, mmap, fork, exit — a process is loaded as it starts, before its
    /// first sample) and serves the sampler's asks (processes that were running before
    /// the agent), until capture stops.
    pub fn run(
        mut self,
        preload: &[u32],
        (work, sender): (WorkReceiver, WorkSender),
        watch: Option<TaskWatch>,
    ) {
        for &pid in preload {
            self.load(pid);
        }
        let only: HashSet<u32> = preload.iter().copied().collect();
        let stop = Arc::new(AtomicBool::new(false));
        let _stop_reader = StopOnDrop(stop.clone());
        let lost = Arc::new(AtomicBool::new(false));
        let followed = watch
            .and_then(|w| spawn_reader(w, sender, self.metrics.clone(), stop, lost.clone()))
            .is_some();
        let every = if followed {
            SWEEP_EVERY
        } else {
            SWEEP_EVERY_UNFOLLOWED
        };
        let mut dirty = BTreeSet::new();
        let mut asked = BTreeSet::new();
        let mut last_sweep = Instant::now();
        while !self.halt.load(Ordering::Relaxed) {
            // Asleep until work comes or a sweep is due; never while asks wait.
            let wait = if asked.is_empty() {
                every.saturating_sub(last_sweep.elapsed())
            } else {
                Duration::ZERO
            };
            match work.recv_timeout(wait) {
                Ok(w) => {
                    let task = matches!(w, Work::Task(_));
                    self.take(w, &mut dirty, &mut asked, &only);
                    // ld.so maps a program's libraries within a millisecond or two of
                    // its exec: take those too, so a process is read once, not per library.
                    let settle = Instant::now() + SETTLE;
                    while let Some(w) = task
                        .then(|| {
                            work.recv_timeout(settle.saturating_duration_since(Instant::now()))
                        })
                        .and_then(Result::ok)
                    {
                        self.take(w, &mut dirty, &mut asked, &only);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            while let Some(pid) = dirty.pop_first() {
                if self.halt.load(Ordering::Relaxed) {
                    return;
                }
                // Records first: each is a few microseconds and may be a new process about
                // to be sampled; a full read takes a millisecond or more.
                while let Ok(w) = work.try_recv() {
                    self.take(w, &mut dirty, &mut asked, &only);
                }
                self.load(pid);
            }
            // A few asks a round: they may compile tables (tens of ms for a big object), and
            // new processes' records come first.
            for _ in 0..ASKS_PER_ROUND {
                if self.halt.load(Ordering::Relaxed) {
                    return;
                }
                let Some(pid) = asked.pop_first() else {
                    break;
                };
                self.load(pid);
            }
            if lost.swap(false, Ordering::Relaxed) || last_sweep.elapsed() >= every {
                last_sweep = Instant::now();
                self.sweep();
            }
        }
    }

    /// Files one piece of work: a task record is applied, an ask waits in `asked` (one per
    /// process, at most [`MAX_ASKED`]; more are dropped, counted, and asked again later).
    fn take(
        &mut self,
        w: Work,
        dirty: &mut BTreeSet<u32>,
        asked: &mut BTreeSet<u32>,
        only: &HashSet<u32>,
    ) {
        match w {
            Work::Task(ev) => self.on_task(ev, dirty, only),
            Work::Ask(Ask::Process(pid)) | Work::Ask(Ask::Remap(pid)) => {
                if asked.len() < MAX_ASKED || asked.contains(&pid) {
                    asked.insert(pid);
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
    fn on_task(&mut self, ev: TaskEvent, dirty: &mut BTreeSet<u32>, only: &HashSet<u32>) {
        let pid = match &ev {
            TaskEvent::Exec { pid, .. }
            | TaskEvent::Fork { pid, .. }
            | TaskEvent::Exit { pid, .. } => *pid,
            TaskEvent::Mmap(m) => m.pid,
        };
        if pid == std::process::id() || (!only.is_empty() && !only.contains(&pid)) {
            return;
        }
        match ev {
            TaskEvent::Exit { pid, .. } => {
                dirty.remove(&pid);
                self.forget(pid);
                if self.maps.exec_hook {
                    // The exec hook may have made an entry this loader never read.
                    let _ = self.maps.procs.delete(&pid.to_ne_bytes());
                }
            }
            TaskEvent::Exec { pid, .. } => {
                if self.maps.exec_hook {
                    // The hook already replaced the entry with the new program's ranges.
                    self.take_proc(pid);
                    self.empty.remove(&pid);
                } else {
                    self.forget(pid);
                }
                dirty.insert(pid);
            }
            TaskEvent::Fork { pid, ppid, .. } => self.fork(pid, ppid),
            TaskEvent::Mmap(m) => {
                if m.prot & libc::PROT_EXEC as u32 != 0 {
                    // With the exec hook, the walker finds a new library itself (and this
                    // loader's partial view of the process would overwrite the hook's ranges).
                    if !self.maps.exec_hook {
                        self.fast_mmap(&m);
                    }
                    dirty.insert(m.pid);
                }
            }
        }
    }

    /// A child starts with its parent's mappings: the same ranges, no /proc read.
    fn fork(&mut self, pid: u32, ppid: u32) {
        let Some(parent) = self.procs.get(&ppid) else {
            return;
        };
        let ranges = parent.ranges.clone();
        let Some(start_time) = procfs::start_time(&self.proc_root, pid) else {
            return;
        };
        if !self.make_room(PROC_BYTES as u64 + PROC_OVERHEAD) {
            self.metrics.dropped(Cache::UnwindProcesses, 1);
            return;
        }
        let proc = Proc { start_time, ranges };
        // The exec hook may already have written the child's new program (this record can
        // come after the exec): never overwrite that with the parent's ranges.
        let flags = if self.maps.exec_hook {
            MapFlags::NO_EXIST
        } else {
            MapFlags::ANY
        };
        if self.write_proc_with(pid, &proc, flags) {
            self.put_proc(pid, proc);
        }
    }

    /// Drops a process's ranges (it exited, or exec'd into another program).
    fn forget(&mut self, pid: u32) {
        self.empty.remove(&pid);
        if self.take_proc(pid).is_some() {
            let _ = self.maps.procs.delete(&pid.to_ne_bytes());
        }
    }

    /// Keeps `proc` as `pid`'s ranges (replacing any), counting the files its ranges map.
    fn put_proc(&mut self, pid: u32, proc: Proc) {
        for r in &proc.ranges {
            if let (Some(f), Some(key)) = (r.file, r.table) {
                let e = self.inodes.entry(f).or_insert((key, 0));
                // The newest read wins (a file rewritten in place while mapped).
                e.0 = key;
                e.1 = e.1.saturating_add(1);
            }
        }
        // Counted before the old ranges are let go: a file both map keeps its entry.
        if let Some(old) = self.procs.insert(pid, proc) {
            self.release(&old);
        }
    }

    /// Lets go of `pid`'s ranges.
    fn take_proc(&mut self, pid: u32) -> Option<Proc> {
        let p = self.procs.remove(&pid)?;
        self.release(&p);
        Some(p)
    }

    /// Uncounts the files of `p`'s ranges: the entry of a file no known process maps goes.
    fn release(&mut self, p: &Proc) {
        for f in p
            .ranges
            .iter()
            .filter(|r| r.table.is_some())
            .filter_map(|r| r.file)
        {
            if let Some(e) = self.inodes.get_mut(&f) {
                e.1 = e.1.saturating_sub(1);
                if e.1 == 0 {
                    self.inodes.remove(&f);
                }
            }
        }
    }

    /// Reads `pid`'s executable mappings and writes its ranges, loading the tables they need.
    pub fn load(&mut self, pid: u32) {
        let started = Instant::now();
        self.load_ranges(pid);
        debug!(
            "unwind ranges of pid {pid} loaded in {:?}",
            started.elapsed()
        );
    }

    fn load_ranges(&mut self, pid: u32) {
        let opts = ReadOptions {
            exe: false,
            unless_started_at: self.empty.get(&pid).copied(),
        };
        let dir = self.proc_root.join(pid.to_string());
        let snap = match snapshot::read(&self.proc_root, pid, opts, &self.metrics, |_| true) {
            Ok(s) if s.maps_read => s,
            Ok(_) | Err(ReadError::Known) => return,
            Err(ReadError::Stat) => {
                // A process that already exited is not an error (most short ones have).
                if dir.exists() {
                    self.metrics.proc_read_error(ProcRead::Stat, 1);
                }
                return;
            }
        };
        let start_time = snap.start_time;
        let mut ranges = Vec::new();
        let mut files = Vec::new();
        for Region { map: e, file } in &snap.regions {
            let Ok(len) = u32::try_from(e.end.saturating_sub(e.start)) else {
                continue;
            };
            let file = match file {
                Mapped::Open(f) => Some(f),
                Mapped::Refused(err) => {
                    if dir.exists() {
                        debug!("pid {pid}: {} not opened: {err}", e.path);
                        self.metrics.table_built(TableBuild::Unreadable);
                    }
                    None
                }
                Mapped::NotOpened => None,
            };
            let (table, file_id) = match file {
                _ if e.kind == RegionKind::Vdso => (self.vdso_table(), None),
                Some(f) => match self.file_table(f, e.inode) {
                    Some((key, id)) => (Some(key), Some(id)),
                    None => (None, None),
                },
                None => (None, None), // anonymous (JIT code): the frame pointer
            };
            let bias = table
                .and_then(|k| self.tables.get(&k))
                .map(|t| bias(&t.segments, e.start, e.offset))
                .unwrap_or(0);
            if let (Some(key), Some(fid)) = (table, file_id) {
                let id = (kernel_dev(e.dev), e.inode);
                let p = Published {
                    key,
                    size: fid.size,
                    ctime: fid.ctime,
                };
                if self.published.get(&id) != Some(&p) {
                    files.push((id, p));
                }
            }
            ranges.push(Range {
                start: e.start,
                len,
                bias,
                table,
                file: file_id.map(|_| (e.dev, e.inode)),
            });
        }
        if let Some(tx) = &self.snapshots {
            if tx.try_send(snap).is_err() {
                self.metrics.dropped(Cache::ProcessSnapshots, 1);
            }
        }
        if ranges.is_empty() {
            self.empty.insert(pid, start_time);
            if self.empty.len() > MAX_FILES {
                self.empty.clear();
            }
            return;
        }
        ranges.sort_by_key(|r| r.start);
        if ranges.len() > RANGES {
            // Ranges without a table cost nothing to drop: they are walked by frame pointers anyway.
            let dropped = ranges.len() - RANGES;
            ranges.retain(|r| r.table.is_some());
            ranges.truncate(RANGES);
            self.metrics.dropped(Cache::UnwindRanges, dropped as u64);
        }
        self.commit();
        for (id, p) in files {
            self.publish_file(id, p);
        }
        let new = !self.procs.contains_key(&pid);
        if new && !self.make_room(PROC_BYTES as u64 + PROC_OVERHEAD) {
            self.metrics.dropped(Cache::UnwindProcesses, 1);
            return;
        }
        let proc = Proc { start_time, ranges };
        if self.write_proc(pid, &proc) {
            self.put_proc(pid, proc);
        } else {
            self.take_proc(pid);
        }
        self.publish();
    }

    /// Tells the sampler which table a file has, so a process that maps it is walked from
    /// its own memory map before this loader has read the process (a process that exec'd a
    /// moment ago). Call after `commit`: the sampler must find the slot filled.
    fn publish_file(&mut self, id: (u64, u64), p: Published) {
        let Some(t) = self.tables.get(&p.key) else {
            return;
        };
        let Some(table_id) = t.id else {
            return;
        };
        if self.published.len() >= FILES && !self.published.contains_key(&id) {
            self.metrics.dropped(Cache::UnwindFiles, 1);
            return;
        }
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&id.0.to_ne_bytes());
        k[8..].copy_from_slice(&id.1.to_ne_bytes());
        let mut v = [0u8; FILE_BYTES];
        let segs = &t.segments[..t.segments.len().min(FILE_SEGMENTS)];
        v[..4].copy_from_slice(&table_id.0.to_ne_bytes());
        v[4..8].copy_from_slice(&(segs.len() as u32).to_ne_bytes());
        v[8..16].copy_from_slice(&p.size.to_ne_bytes());
        v[16..24].copy_from_slice(&p.ctime.sec.to_ne_bytes());
        v[24..28].copy_from_slice(&p.ctime.nsec.to_ne_bytes());
        for (i, &(vaddr, offset, bytes)) in segs.iter().enumerate() {
            let at = 32 + i * 24;
            v[at..at + 8].copy_from_slice(&vaddr.to_ne_bytes());
            v[at + 8..at + 16].copy_from_slice(&offset.to_ne_bytes());
            v[at + 16..at + 24].copy_from_slice(&bytes.to_ne_bytes());
        }
        match self.maps.files.update(&k, &v, MapFlags::ANY) {
            Ok(()) => {
                self.published.insert(id, p);
            }
            Err(_) => self.metrics.dropped(Cache::UnwindFiles, 1),
        }
    }

    /// Takes a table's files out of `unwind_files` (before its slot is freed).
    fn unpublish(&mut self, key: TableKey) {
        let files = &self.maps.files;
        self.published.retain(|&(dev, ino), p| {
            if p.key != key {
                return true;
            }
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&dev.to_ne_bytes());
            id[8..].copy_from_slice(&ino.to_ne_bytes());
            let _ = files.delete(&id);
            false
        });
    }

    /// Forgets processes that exited (or whose pid now names another process).
    pub fn sweep(&mut self) {
        let root = self.proc_root.clone();
        let gone: Vec<u32> = self
            .procs
            .iter()
            .filter(|(&pid, p)| procfs::start_time(&root, pid) != Some(p.start_time))
            .map(|(&pid, _)| pid)
            .collect();
        for pid in gone {
            self.take_proc(pid);
            let _ = self.maps.procs.delete(&pid.to_ne_bytes());
        }
        if self.maps.exec_hook {
            // Entries the exec hook made for processes that ended before this loader read
            // them (their exit record lost to a full ring).
            let stale: Vec<Vec<u8>> = self
                .maps
                .procs
                .keys()
                .filter(|k| {
                    let pid = k
                        .get(..4)
                        .and_then(|b| b.try_into().ok())
                        .map(u32::from_ne_bytes);
                    pid.is_some_and(|pid| {
                        !self.procs.contains_key(&pid) && !root.join(pid.to_string()).exists()
                    })
                })
                .collect();
            for k in stale {
                let _ = self.maps.procs.delete(&k);
            }
        }
        self.empty
            .retain(|&pid, t| procfs::start_time(&root, pid) == Some(*t));
        self.publish();
    }

    fn publish(&self) {
        let loaded = self.slots.iter().filter(|s| s.is_some()).count();
        self.metrics.unwind_tables.set(loaded as i64);
        self.metrics.unwind_processes.set(self.procs.len() as i64);
        self.metrics
            .unwind_map_bytes
            .set(i64::try_from(self.used_bytes()).unwrap_or(i64::MAX));
    }

    fn used_bytes(&self) -> u64 {
        self.table_bytes + self.procs.len() as u64 * (PROC_BYTES as u64 + PROC_OVERHEAD)
    }

    /// The table of a mapped file (opened inside its process's root), loading it if needed,
    /// with the identity of the file it was read from. `inode` is the one the mapping names:
    /// a file opened by its path inside the root (`map_files` refused) may be another.
    fn file_table(&mut self, file: &File, inode: u64) -> Option<(TableKey, FileId)> {
        let meta = file.metadata().ok()?;
        if !meta.is_file() {
            self.metrics.table_built(TableBuild::Unreadable);
            return None;
        }
        // The device is not compared: btrfs and overlayfs stat a file with another device
        // number than the mapping shows for it.
        if meta.ino() != inode {
            self.metrics.table_built(TableBuild::OtherFile);
            return None;
        }
        let id = FileId::of(&meta);
        let known = self.files.get(&id).copied();
        if let Some(key) = known {
            let key = key?;
            if self.tables.get(&key).is_some_and(|t| t.id.is_some()) {
                return Some((key, id));
            }
            if self.is_refused(&key) || self.unbuildable.contains(&key) {
                return None;
            }
            // Evicted: the disk cache has it, or it is compiled again below.
            if let Some(t) = self.cached(&key) {
                return self.install(key, &t).then_some((key, id));
            }
        }
        if meta.len() > self.limits.max_object_bytes {
            self.metrics.table_built(TableBuild::TooLarge);
            self.remember(id, None);
            return None;
        }
        // Headers and CFI only, each in a buffer of its own: the table of a 150 MB binary
        // costs its few MB of CFI, and a file whose headers claim more is refused.
        let sparse = match Sparse::read(file, meta.len(), self.limits.max_cfi_bytes) {
            Ok(s) => s,
            Err(SparseError::Refused(e)) => {
                debug!("unwind table refused: {e}");
                self.metrics.table_built(build_result(&e));
                self.remember(id, None);
                return None;
            }
            Err(SparseError::Io(_)) => {
                self.metrics.table_built(TableBuild::Unreadable);
                return None;
            }
        };
        let key = sparse.key();
        self.remember(id, Some(key));
        self.table_from_bytes(key, sparse.bytes(), Some(file))
            .map(|key| (key, id))
    }

    fn remember(&mut self, id: FileId, key: Option<TableKey>) {
        if self.files.len() >= MAX_FILES {
            self.files.clear();
            self.metrics.dropped(Cache::UnwindObjects, MAX_FILES as u64);
        }
        self.files.insert(id, key);
    }

    /// Adds a new executable mapping of a known object to its process's ranges straight from
    /// its mmap record, so the sampler can walk it within microseconds of the mmap; false if
    /// the object is not known yet (the full read after the process settles handles it).
    fn fast_mmap(&mut self, m: &Mmap) -> bool {
        let file = (m.dev, m.inode);
        let Some(&(key, _)) = self.inodes.get(&file) else {
            return false;
        };
        let Some(table) = self.tables.get(&key).filter(|t| t.id.is_some()) else {
            return false;
        };
        let Ok(len) = u32::try_from(m.len) else {
            return false;
        };
        let bias = bias(&table.segments, m.start, m.pgoff);
        let mut proc = match self.procs.get(&m.pid) {
            Some(p) => Proc {
                start_time: p.start_time,
                ranges: p.ranges.clone(),
            },
            None => {
                let Some(start_time) = procfs::start_time(&self.proc_root, m.pid) else {
                    return false;
                };
                if !self.make_room(PROC_BYTES as u64 + PROC_OVERHEAD) {
                    return false;
                }
                Proc {
                    start_time,
                    ranges: Vec::new(),
                }
            }
        };
        let end = m.start + m.len;
        // A mapping replaces whatever it overlaps (ld.so maps a library's segments over
        // its first, whole-file mapping).
        proc.ranges
            .retain(|r| r.start + u64::from(r.len) <= m.start || r.start >= end);
        proc.ranges.push(Range {
            start: m.start,
            len,
            bias,
            table: Some(key),
            file: Some(file),
        });
        proc.ranges.sort_by_key(|r| r.start);
        proc.ranges.truncate(RANGES);
        let ok = self.write_proc(m.pid, &proc);
        if ok {
            self.put_proc(m.pid, proc);
        } else {
            self.take_proc(m.pid);
        }
        ok
    }

    /// The vDSO's table: every process maps the same image, read from the agent's own.
    fn vdso_table(&mut self) -> Option<TableKey> {
        if let Some(v) = self.vdso {
            if let Some(key) = v {
                if self.tables.get(&key).is_some_and(|t| t.id.is_some()) {
                    return Some(key);
                }
            } else {
                return None;
            }
        }
        let bytes = procfs::own_vdso()?;
        let key = key_of(&bytes);
        let got = self.table_from_bytes(key, Bytes::Whole(&bytes), None);
        self.vdso = Some(got);
        got
    }

    /// Loads the table of an object whose bytes are `bytes` (and key `key`); `code` reads
    /// the code bytes `bytes` leaves out (a sparse read).
    fn table_from_bytes(
        &mut self,
        key: TableKey,
        bytes: Bytes<'_>,
        code: Option<&File>,
    ) -> Option<TableKey> {
        if self.tables.get(&key).is_some_and(|t| t.id.is_some()) {
            return Some(key);
        }
        if self.is_refused(&key) || self.unbuildable.contains(&key) {
            return None;
        }
        let table = match self.cached(&key) {
            Some(t) => t,
            None => match compile_with(bytes, code.map(|f| f as &dyn CodeReader), &self.limits) {
                Ok(t) => {
                    self.metrics.table_built(TableBuild::Compiled);
                    if let Some(store) = &self.store {
                        if let Err(e) = store.save(&key, &t) {
                            debug!("unwind cache write failed: {e}");
                        }
                    }
                    t
                }
                Err(e) => {
                    self.metrics.table_built(build_result(&e));
                    if self.unbuildable.len() >= MAX_FILES {
                        self.unbuildable.clear();
                    }
                    self.unbuildable.insert(key);
                    return None;
                }
            },
        };
        self.install(key, &table).then_some(key)
    }

    fn cached(&mut self, key: &TableKey) -> Option<UnwindTable> {
        match self.store.as_ref()?.load(key) {
            Ok(t) => {
                self.metrics.table_built(TableBuild::Cached);
                Some(t)
            }
            Err(StoreError::Missing) => None,
            Err(StoreError::Corrupt(why)) => {
                warn!("unwind cache file failed its check ({why}); compiling again");
                self.metrics.table_built(TableBuild::CacheCorrupt);
                None
            }
            Err(e) => {
                debug!("{e}");
                None
            }
        }
    }

    /// Puts `table` in a free slot, evicting least recently used tables to make room.
    fn install(&mut self, key: TableKey, table: &UnwindTable) -> bool {
        let entries = 1 + table.pages.len() + table.rows.len();
        let bytes = (entries.div_ceil(CHUNK_SLOTS) * CHUNK_BYTES) as u64;
        if bytes > self.settings.max_bytes / MAX_SHARE || !self.make_room(bytes) {
            self.metrics.table_built(TableBuild::OverBudget);
            self.refuse(key);
            return false;
        }
        let Some(slot) = self.free_slot() else {
            self.metrics.table_built(TableBuild::MapFailed);
            return false;
        };
        match fill(table, entries) {
            Ok(inner) => self.pending.push((slot, inner)),
            Err(e) => {
                debug!("unwind table map: {e}");
                self.metrics.table_built(TableBuild::MapFailed);
                return false;
            }
        }
        self.used.stamp(slot as usize, now_ns());
        self.slots[slot as usize] = Some(key);
        let held = self.held[slot as usize];
        self.held[slot as usize] = held + 1;
        if held != 0 && held % u64::from(GENERATIONS) == 0 {
            // The slot's ids start over: a row cached for this id GENERATIONS tables ago
            // could still be in the walker's caches.
            self.clear_row_cache();
        }
        self.table_bytes += bytes;
        self.tables.insert(
            key,
            Table {
                id: Some(TableId::new(slot, held)),
                bytes,
                segments: table.segments.clone(),
            },
        );
        true
    }

    /// Puts the tables filled since the last call into their slots, in one batch update.
    fn commit(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        let keys: Vec<u8> = pending.iter().flat_map(|(s, _)| s.to_ne_bytes()).collect();
        let fds: Vec<u8> = pending
            .iter()
            .flat_map(|(_, m)| m.as_fd().as_raw_fd().to_ne_bytes())
            .collect();
        let batch = self.maps.tables.update_batch(
            &keys,
            &fds,
            pending.len() as u32,
            MapFlags::ANY,
            MapFlags::ANY,
        );
        if batch.is_ok() {
            return;
        }
        // One by one, to learn which the kernel refused; those slots are freed again.
        for (slot, inner) in pending {
            let fd = inner.as_fd().as_raw_fd();
            if self
                .maps
                .tables
                .update(&slot.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY)
                .is_err()
            {
                self.metrics.table_built(TableBuild::MapFailed);
                if let Some(key) = self.slots[slot as usize].take() {
                    if let Some(t) = self.tables.get_mut(&key) {
                        t.id = None;
                        self.table_bytes -= t.bytes;
                    }
                }
            }
        }
    }

    fn free_slot(&mut self) -> Option<u32> {
        if let Some(i) = self.slots.iter().position(|s| s.is_none()) {
            return u32::try_from(i).ok();
        }
        self.evict_one()?;
        self.free_slot_once()
    }

    fn free_slot_once(&self) -> Option<u32> {
        self.slots
            .iter()
            .position(|s| s.is_none())
            .and_then(|i| u32::try_from(i).ok())
    }

    /// Evicts least recently used tables until `bytes` more fit under the cap.
    /// Whether `key` was refused for want of room a moment ago.
    fn is_refused(&mut self, key: &TableKey) -> bool {
        match self.refused.get(key) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                self.refused.remove(key);
                false
            }
            None => false,
        }
    }

    fn refuse(&mut self, key: TableKey) {
        if self.refused.len() >= MAX_FILES {
            self.refused.clear();
        }
        self.refused.insert(key, Instant::now() + RETRY_REFUSED);
    }

    /// Evicts tables not walked in the last [`IN_USE`] until `bytes` more fit under the cap;
    /// false (nothing evicted past what was idle) when they cannot.
    fn make_room(&mut self, bytes: u64) -> bool {
        while self.used_bytes() + bytes > self.settings.max_bytes {
            if self.evict_one().is_none() {
                return false;
            }
        }
        true
    }

    /// Empties the walker's row caches, every CPU's (the sampler's, and off-CPU's when on).
    fn clear_row_cache(&self) {
        let Ok(cpus) = libbpf_rs::num_possible_cpus() else {
            return;
        };
        let zeros = vec![vec![0u8; self.maps.row_cache.value_size() as usize]; cpus];
        for key in 0..self.maps.row_cache.max_entries() {
            if let Err(e) =
                self.maps
                    .row_cache
                    .update_percpu(&key.to_ne_bytes(), &zeros, MapFlags::ANY)
            {
                warn!("could not empty the unwind row cache: {e}");
            }
        }
    }

    /// Evicts the least recently walked table; `None` if every loaded table was walked in
    /// the last [`IN_USE`] (or none is loaded).
    fn evict_one(&mut self) -> Option<()> {
        let idle_before = now_ns().saturating_sub(IN_USE.as_nanos() as u64);
        let (slot, key) = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, k)| k.map(|k| (i, k)))
            .filter(|(i, _)| !self.pending.iter().any(|(s, _)| *s as usize == *i))
            .map(|(i, k)| (i, k, self.used.get(i)))
            .filter(|&(_, _, used)| used < idle_before)
            .min_by_key(|&(_, _, used)| used)
            .map(|(i, k, _)| (i, k))?;
        // First point every range at the frame pointer, then free the slot: the sampler
        // never finds a slot that holds another object's table.
        let users: Vec<u32> = self
            .procs
            .iter()
            .filter(|(_, p)| p.ranges.iter().any(|r| r.table == Some(key)))
            .map(|(&pid, _)| pid)
            .collect();
        self.unpublish(key);
        self.slots[slot] = None;
        if let Some(t) = self.tables.get_mut(&key) {
            t.id = None;
            self.table_bytes -= t.bytes;
        }
        for pid in users {
            let written = self.procs.get(&pid).map(|p| self.write_proc(pid, p));
            if written == Some(false) {
                self.take_proc(pid);
            }
        }
        let _ = self.maps.tables.delete(&(slot as u32).to_ne_bytes());
        self.metrics.dropped(Cache::UnwindTables, 1);
        Some(())
    }
}

/// Creates a table's array at its exact size and fills it through mmap.
fn fill(t: &UnwindTable, entries: usize) -> Result<MapHandle, String> {
    let first_page = u32::try_from(t.first_page).map_err(|_| "page number over 32 bits")?;
    let page_count = u32::try_from(t.pages.len()).map_err(|_| "too many pages")?;
    let chunks = entries.div_ceil(CHUNK_SLOTS);
    let n = u32::try_from(chunks).map_err(|_| "too many rows")?;
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
        map_flags: libbpf_sys::BPF_F_INNER_MAP | libbpf_sys::BPF_F_MMAPABLE,
        ..Default::default()
    };
    let inner = MapHandle::create(
        MapType::Array,
        Some("ember_unwind"),
        4,
        CHUNK_BYTES as u32,
        n,
        &opts,
    )
    .map_err(|e| e.to_string())?;
    let len = chunks * CHUNK_BYTES;
    // Unmapped below; nothing else refers to it.
    let ptr = map_shared(&inner, len).map_err(|e| format!("mmap: {e}"))?;
    {
        // SAFETY: ptr is valid for len >= entries * 8 writable bytes until munmap.
        let out = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u8>(), entries * 8) };
        let mut chunks = out.chunks_exact_mut(8);
        let mut put = |b: [u8; 8]| {
            if let Some(c) = chunks.next() {
                c.copy_from_slice(&b);
            }
        };
        put(pair(first_page, page_count));
        for p in &t.pages {
            put(pair(p.first_row, p.row_count));
        }
        for r in &t.rows {
            put(row_bytes(r));
        }
    }
    // SAFETY: unmaps exactly the mapping made above.
    unsafe { libc::munmap(ptr, len) };
    Ok(inner)
}

impl Loader {
    /// Writes a process's ranges in one update; false if the kernel refused (map full).
    fn write_proc(&self, pid: u32, p: &Proc) -> bool {
        self.write_proc_with(pid, p, MapFlags::ANY)
    }

    /// `write_proc` with the update's flags; false if the kernel refused.
    fn write_proc_with(&self, pid: u32, p: &Proc, flags: MapFlags) -> bool {
        let mut value = vec![0u8; PROC_BYTES];
        let mut count = 0u32;
        for r in p.ranges.iter().take(RANGES) {
            let table = r
                .table
                .and_then(|k| self.tables.get(&k))
                .and_then(|t| t.id)
                .map_or(TABLE_NONE, |id| id.0);
            let at = 8 + count as usize * RANGE_BYTES;
            value[at..at + 8].copy_from_slice(&r.start.to_ne_bytes());
            value[at + 8..at + 16].copy_from_slice(&r.bias.to_ne_bytes());
            value[at + 16..at + 20].copy_from_slice(&r.len.to_ne_bytes());
            value[at + 20..at + 24].copy_from_slice(&table.to_ne_bytes());
            count += 1;
        }
        value[..4].copy_from_slice(&count.to_ne_bytes());
        match self.maps.procs.update(&pid.to_ne_bytes(), &value, flags) {
            Ok(()) => true,
            Err(e) if e.kind() == libbpf_rs::ErrorKind::AlreadyExists => false,
            Err(_) => {
                self.metrics.dropped(Cache::UnwindProcesses, 1);
                false
            }
        }
    }
}

/// Sets the reader's stop flag when the loader returns.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Starts the thread that only copies task records out of the kernel's rings into a queue,
/// so a loader busy compiling a large table never lets a ring overflow.
fn spawn_reader(
    mut watch: TaskWatch,
    tx: WorkSender,
    metrics: Metrics,
    stop: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
) -> Option<()> {
    let spawned = std::thread::Builder::new()
        .name("ember-tasks".into())
        .spawn(move || {
            let mut events = Vec::new();
            let mut last_sync = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = watch.wait(READER_WAIT) {
                    debug!("task records: poll failed: {e}");
                    std::thread::sleep(READER_WAIT);
                }
                let d = watch.drain(&mut events);
                if d.lost > 0 {
                    metrics.dropped(Cache::TaskRecords, d.lost);
                    // An exit may be among them: the loader sweeps.
                    lost.store(true, Ordering::Relaxed);
                }
                if d.malformed + d.rejected > 0 {
                    metrics.proc_read_error(ProcRead::TaskRecord, d.malformed + d.rejected);
                }
                for ev in events.drain(..) {
                    match tx.try_send(Work::Task(ev)) {
                        Ok(()) => {}
                        Err(TrySendError::Full(_)) => {
                            metrics.dropped(Cache::TaskRecords, 1);
                            lost.store(true, Ordering::Relaxed);
                        }
                        Err(TrySendError::Disconnected(_)) => return,
                    }
                }
                if last_sync.elapsed() >= CPU_CHECK_EVERY {
                    last_sync = Instant::now();
                    if let Some(online) = procfs::online_cpus() {
                        if let Err(e) = watch.sync_cpus(&online) {
                            debug!("task records: {e}");
                        }
                    }
                }
            }
        });
    match spawned {
        Ok(_) => Some(()),
        Err(e) => {
            warn!("cannot start the task record reader ({e}): processes load at first sample");
            None
        }
    }
}

/// `pc - bias` is the object's own address for a mapping of its file at `offset` from `start`.
fn bias(segments: &[(u64, u64, u64)], start: u64, offset: u64) -> u64 {
    let seg = segments
        .iter()
        .find(|&&(_, off, size)| {
            let first = off & !0xfff;
            offset >= first && offset < off + size.max(1)
        })
        .or(segments.first());
    match seg {
        Some(&(vaddr, off, _)) => start
            .wrapping_sub(offset)
            .wrapping_add(off)
            .wrapping_sub(vaddr),
        None => start.wrapping_sub(offset),
    }
}

fn build_result(e: &UnwindError) -> TableBuild {
    match e {
        UnwindError::NoCfi => TableBuild::NoCfi,
        UnwindError::TooLarge { .. } => TableBuild::TooLarge,
        UnwindError::SectionTooLarge { .. } => TableBuild::SectionTooLarge,
        UnwindError::BadElf(_) | UnwindError::NotX86_64 | UnwindError::NotLoadable(_) => {
            TableBuild::BadElf
        }
        UnwindError::TooManyRows { .. }
        | UnwindError::TooManyEntries { .. }
        | UnwindError::SpanTooLarge { .. }
        | UnwindError::TooMuchWork { .. } => TableBuild::OverCap,
    }
}

fn pair(a: u32, b: u32) -> [u8; 8] {
    let mut out = [0u8; 8];
    out[..4].copy_from_slice(&a.to_ne_bytes());
    out[4..].copy_from_slice(&b.to_ne_bytes());
    out
}

/// The kernel's own encoding of a device number (`MKDEV`), as the sampler reads it from
/// `inode->i_sb->s_dev`; `/proc/PID/maps` prints its major and minor.
fn kernel_dev((major, minor): (u32, u32)) -> u64 {
    (u64::from(major) << 20) | u64::from(minor)
}

fn round_page(n: u64) -> u64 {
    n.div_ceil(4096) * 4096
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; CLOCK_MONOTONIC is what bpf_ktime_get_ns reads.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

/// A read-write shared mapping of the first `len` bytes of an mmapable array map (the
/// kernel rounds the array up to whole pages, so `len` may be page-rounded).
fn map_shared(map: &MapHandle, len: usize) -> std::io::Result<*mut libc::c_void> {
    // SAFETY: a fresh mapping of a map fd we hold; the caller unmaps it.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            map.as_fd().as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(ptr)
}

/// `unwind_used` mapped into the agent: the sampler stamps a slot each time it walks it.
struct UsedView {
    ptr: *mut u64,
    len: usize,
}

// SAFETY: the mapping is owned by the view and only read/written as plain u64s.
unsafe impl Send for UsedView {}

impl UsedView {
    fn map(map: &MapHandle) -> std::io::Result<Self> {
        let len = round_page((SLOTS * 8) as u64) as usize;
        // Unmapped in Drop.
        let ptr = map_shared(map, len)?;
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }

    fn get(&self, slot: usize) -> u64 {
        if slot >= SLOTS {
            return 0;
        }
        // SAFETY: slot < SLOTS, inside the mapping; BPF writes whole u64s.
        unsafe { std::ptr::read_volatile(self.ptr.add(slot)) }
    }

    fn stamp(&self, slot: usize, t: u64) {
        if slot < SLOTS {
            // SAFETY: as in get.
            unsafe { std::ptr::write_volatile(self.ptr.add(slot), t) }
        }
    }
}

impl Drop for UsedView {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn table_ids_of_a_slot_differ_until_they_wrap_and_are_never_none() {
        let slot = SLOTS as u32 - 1;
        let ids: Vec<u32> = (0..4).map(|held| TableId::new(slot, held).0).collect();
        for (i, id) in ids.iter().enumerate() {
            // The walker looks tables up by the low bits (EMBER_UNWIND_SLOT).
            assert_eq!(id & (SLOTS as u32 - 1), slot);
            assert!(!ids[..i].contains(id), "{ids:x?}");
        }
        let last = u64::from(GENERATIONS) - 1;
        assert_ne!(TableId::new(slot, last).0, TABLE_NONE);
        assert_eq!(TableId::new(slot, last).0 >> SLOT_BITS, GENERATIONS - 1);
        // Where the ids start over (and the loader empties the row caches).
        assert_eq!(TableId::new(slot, last + 1), TableId::new(slot, 0));
        assert_eq!(TableId::new(7, 0).0, 7);
    }

    /// The sampler's unwind maps, made like the BPF object's (root only).
    fn test_maps() -> UnwindMaps {
        let opts = |flags: u32| libbpf_sys::bpf_map_create_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
            map_flags: flags,
            ..Default::default()
        };
        let create = |kind, name: &str, key: usize, value: usize, n: usize, o| {
            MapHandle::create(kind, Some(name), key as u32, value as u32, n as u32, &o).expect(name)
        };
        let inner = create(
            MapType::Array,
            "t_inner",
            4,
            CHUNK_BYTES,
            1,
            opts(libbpf_sys::BPF_F_INNER_MAP | libbpf_sys::BPF_F_MMAPABLE),
        );
        let mut outer = opts(0);
        outer.inner_map_fd = inner.as_fd().as_raw_fd() as u32;
        let no_prealloc = libbpf_sys::BPF_F_NO_PREALLOC;
        UnwindMaps {
            tables: create(MapType::ArrayOfMaps, "t_tables", 4, 4, SLOTS, outer),
            procs: create(
                MapType::Hash,
                "t_procs",
                4,
                PROC_BYTES,
                256,
                opts(no_prealloc),
            ),
            used: create(
                MapType::Array,
                "t_used",
                4,
                8,
                SLOTS,
                opts(libbpf_sys::BPF_F_MMAPABLE),
            ),
            files: create(
                MapType::Hash,
                "t_files",
                16,
                FILE_BYTES,
                FILES,
                opts(no_prealloc),
            ),
            row_cache: create(MapType::PercpuArray, "t_rows", 4, 24 << 10, 1, opts(0)),
            exec_hook: true,
        }
    }

    /// Root, or (under `EMBER_REQUIRE_PRIVILEGED=1`) a failure: BPF maps need it.
    fn privileged() -> bool {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            return true;
        }
        assert!(
            std::env::var("EMBER_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
            "needs root (BPF maps) and EMBER_REQUIRE_PRIVILEGED=1 forbids skipping"
        );
        eprintln!("skipped: needs root");
        false
    }

    /// A running copy of `sleep` at `path`: its pid once its exec is in its maps.
    fn run_copy(path: &Path) -> std::process::Child {
        let child = std::process::Command::new(path)
            .arg("60")
            .spawn()
            .expect("spawn");
        let maps = format!("/proc/{}/maps", child.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&maps)
            .unwrap_or_default()
            .contains(path.to_str().expect("utf-8"))
        {
            assert!(
                Instant::now() < deadline,
                "{} did not start",
                path.display()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        child
    }

    /// The table of the range of `pid` that maps inode `ino`.
    fn table_of(loader: &Loader, pid: u32, ino: u64) -> Option<TableKey> {
        let p = loader.procs.get(&pid).expect("process loaded");
        let r = p.ranges.iter().find(|r| r.file.is_some_and(|f| f.1 == ino));
        r.and_then(|r| r.table)
    }

    /// Tenant A's program is loaded, exits and is deleted; tenant B's program, the same
    /// size and mtime but other CFI, gets A's inode: B gets its own table, not A's, and
    /// the inode's entries of A are gone (the loader's) or no longer match B (the
    /// sampler's `unwind_files`: size and ctime). On main B was handed A's table: its
    /// identity (dev, inode, size, mtime) was A's.
    #[test]
    fn an_inode_reused_by_another_file_gets_its_own_table() {
        use std::os::unix::fs::PermissionsExt;
        if !privileged() {
            return;
        }
        let sleep = std::fs::read("/bin/sleep").expect("sleep");
        // B: the same program with the second half of its .eh_frame zeroed (fewer FDEs).
        let mut other = sleep.clone();
        {
            use object::{Object, ObjectSection};
            let f = object::File::parse(&sleep[..]).expect("elf");
            let (at, size) = f
                .section_by_name(".eh_frame")
                .and_then(|s| s.file_range())
                .expect(".eh_frame");
            let (at, size) = (at as usize, size as usize);
            other[at + size / 2..at + size].fill(0);
        }
        // The filesystem of the temp dir, else the target dir's, must reuse freed inodes.
        let dirs = [
            tempfile::tempdir().expect("tmp"),
            tempfile::tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).expect("tmp"),
        ];
        let metrics = Metrics::new();
        let mut loader = Loader::new(
            test_maps(),
            Settings {
                max_bytes: 32 << 20,
                cache_dir: None,
            },
            metrics.clone(),
        )
        .expect("loader");
        for dir in &dirs {
            let a_path = dir.path().join("tenant-a");
            std::fs::write(&a_path, &sleep).expect("write a");
            std::fs::set_permissions(&a_path, std::fs::Permissions::from_mode(0o755))
                .expect("chmod");
            let a_meta = std::fs::metadata(&a_path).expect("stat a");
            let ino = a_meta.ino();
            let mut a = run_copy(&a_path);
            let a_pid = a.id();
            loader.load(a_pid);
            let key_a = table_of(&loader, a_pid, ino).expect("A has a table");
            let file = loader
                .procs
                .get(&a_pid)
                .and_then(|p| p.ranges.iter().find_map(|r| r.file.filter(|f| f.1 == ino)))
                .expect("A's range");
            assert_eq!(loader.inodes.get(&file).map(|e| e.0), Some(key_a));
            let kernel_id = (kernel_dev(file.0), ino);
            assert_eq!(loader.published.get(&kernel_id).map(|p| p.key), Some(key_a));

            // A exits: the loader's inode entry goes with its last range.
            let _ = a.kill();
            let _ = a.wait();
            loader.sweep();
            assert!(!loader.procs.contains_key(&a_pid));
            assert!(
                !loader.inodes.contains_key(&file),
                "A's inode still names A's table after A is gone"
            );
            std::fs::remove_file(&a_path).expect("rm a");

            // B takes A's inode if this filesystem gives it out again.
            let mut held = Vec::new();
            let mut b_path = None;
            for i in 0..1000 {
                let p = dir.path().join(format!("tenant-b{i}"));
                std::fs::write(&p, &other).expect("write b");
                if std::fs::metadata(&p).expect("stat b").ino() == ino {
                    b_path = Some(p);
                    break;
                }
                held.push(p);
            }
            let Some(b_path) = b_path else {
                eprintln!(
                    "{}: inode {ino} not reused, next place",
                    dir.path().display()
                );
                continue;
            };
            let b_file = std::fs::File::options()
                .write(true)
                .open(&b_path)
                .expect("open b");
            b_file
                .set_modified(a_meta.modified().expect("mtime"))
                .expect("set mtime");
            drop(b_file);
            std::fs::set_permissions(&b_path, std::fs::Permissions::from_mode(0o755))
                .expect("chmod");
            let b_meta = std::fs::metadata(&b_path).expect("stat b");
            assert_eq!(
                (
                    b_meta.ino(),
                    b_meta.len(),
                    b_meta.mtime(),
                    b_meta.mtime_nsec()
                ),
                (ino, a_meta.len(), a_meta.mtime(), a_meta.mtime_nsec()),
                "B looks like A but for its ctime"
            );
            // What the sampler would find for B's inode before the loader reads B: nothing,
            // or an entry whose ctime is not B's (it walks B by the frame pointer).
            if let Some(p) = loader.published.get(&kernel_id) {
                assert_ne!(
                    (p.ctime.sec, i64::from(p.ctime.nsec)),
                    (b_meta.ctime(), b_meta.ctime_nsec()),
                    "unwind_files would give B A's table"
                );
            }

            let mut b = run_copy(&b_path);
            let b_pid = b.id();
            loader.load(b_pid);
            let key_b = table_of(&loader, b_pid, ino);
            let _ = b.kill();
            let _ = b.wait();
            assert!(key_b.is_some(), "B has a table of its own");
            assert_ne!(key_b, Some(key_a), "B was given A's table");
            assert_eq!(
                loader
                    .published
                    .get(&kernel_id)
                    .map(|p| (p.key, (p.ctime.sec, i64::from(p.ctime.nsec)))),
                Some((key_b.expect("B"), (b_meta.ctime(), b_meta.ctime_nsec())))
            );

            // A file opened that is not the inode the mapping names is not read.
            let f = std::fs::File::open(&b_path).expect("open b");
            assert!(loader.file_table(&f, ino + 1).is_none());
            let text = metrics.encode();
            assert!(
                text.contains("ember_unwind_tables_built_total{result=\"other_file\"} 1"),
                "{text}"
            );
            return;
        }
        eprintln!("no filesystem here reuses freed inodes: the case cannot occur");
    }

    #[test]
    fn kernel_dev_is_mkdev() {
        // /proc/PID/maps prints "fe:01"; the kernel's s_dev is MKDEV(0xfe, 1).
        assert_eq!(kernel_dev((0xfe, 1)), (0xfe << 20) | 1);
        assert_eq!(kernel_dev((8, 0x12)), 0x0080_0012);
    }

    #[test]
    fn bias_maps_pc_to_object_address() {
        // A PIE's text: file offset 0x1000 at address 0x1000, mapped at 0x5555_0000_1000.
        let segs = [(0x1000, 0x1000, 0x5000)];
        assert_eq!(bias(&segs, 0x5555_0000_1000, 0x1000), 0x5555_0000_0000);
        // A non-PIE executable linked at 0x400000: text at file offset 0x1000.
        let segs = [(0x401000, 0x1000, 0x2000)];
        assert_eq!(0x401234 - bias(&segs, 0x401000, 0x1000), 0x401234);
        // A segment whose offset is not page-aligned is mapped from its page start.
        let segs = [(0x2a5e0, 0x295e0, 0x1000)];
        let b = bias(&segs, 0x7f00_0002_9000, 0x29000);
        assert_eq!(0x7f00_0002_95e0 - b, 0x2a5e0);
    }
}
