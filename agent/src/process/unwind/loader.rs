//! The unwind loader: fills the sampler's maps so it can walk a process's stack by tables.
//!
//! It owns every table and range the sampler holds. The sampler asks for a process the
//! first time it samples one it has no ranges for ([`Ask::Process`]), and again when a pc
//! falls outside them ([`Ask::Remap`], a library loaded since); the kernel's task records
//! tell it of every exec, mmap, fork and exit ([`super::follow`]). The loader reads the
//! process ([`crate::process::snapshot`]), finds or builds each object's table and writes
//! the process's ranges in one map update.
//!
//! The decisions live in a file each, tested against an in-memory fake of the maps
//! ([`UnwindIo`], written by [`crate::capture::unwind`]):
//! - [`super::files`]: file identity. Objects are read inside the process's root
//!   ([`crate::process::object::open_mapped`]), at most `Limits::max_object_bytes`, only
//!   if the file opened is the inode the mapping names, and a file seen before is not read
//!   again. What is read of it is its headers and CFI, each part capped ([`super::sparse`]).
//! - [`super::procs`]: processes, and the files by inode they map.
//! - [`super::slots`]: which slot holds which table, and the generations of its ids.
//! - [`super::budget`]: kernel memory (tables plus per-process ranges) under
//!   `sampling.unwind_max_bytes`; the least recently used tables are evicted, after every
//!   process range naming them is rewritten to the frame pointer, so a slot is never
//!   reused under a walker.
//!
//! **Tables** are keyed by the SHA-256 of the object's bytes, not its build id: a build id
//! is whatever the file says, and a container could otherwise name its own table for the
//! host's libc. One table serves every process mapping the object. Compiled tables are
//! kept on disk ([`Store`]) across restarts.
//!
//! [`Ask::Process`]: crate::capture::Ask::Process
//! [`Ask::Remap`]: crate::capture::Ask::Remap

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, warn};

use super::abi::{bpf_pages, bpf_rows};
use super::budget::{lru_victim, now_ns, Budget, PROC_COST};
use super::compile::{compile_with, Limits, UnwindTable, DEFAULT_LIMITS};
use super::elf::{Bytes, CodeReader};
use super::error::UnwindError;
use super::files::{identify, kernel_dev, Files, KernelFile, Published};
use super::procs::{proc_value, Proc, Procs, Range};
use super::slots::Slots;
use super::sparse::{Sparse, SparseError};
use super::store::{key_of, Store, StoreError, TableKey};
use crate::capture::unwind::{
    ember_proc_flag, ember_unwind_header, ember_unwind_proc, table_bytes, table_slots, MapError,
    MapIo, TableImage, UnwindIo, UnwindMaps, RANGES,
};
use crate::metrics::{Cache, Metrics, ProcRead, TableBuild};
use crate::os::file_id::FileId;
use crate::os::procfs::{self, RegionKind};
use crate::process::elf_file::{ElfError, FileAt};
use crate::process::python::Interp;
use crate::process::registry::Registry;
use crate::process::snapshot::{self, Mapped, ReadError, ReadOptions, Region, Snapshot};

/// The loader's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Cap on tables plus ranges in kernel memory.
    pub max_bytes: u64,
    /// Where compiled tables are kept; `None`: nowhere.
    pub cache_dir: Option<PathBuf>,
    /// `interpreters.python.enabled`: Python processes get their `py_procs` entries.
    pub python: bool,
    /// `sampling.subprocesses`: with `sampling.pids`, a child forked by a followed process
    /// is followed too (the sampler samples it: `ember_fork`).
    pub subprocesses: bool,
}

/// The loader's state; see the module documentation. `M` writes the sampler's maps.
pub struct Loader<M: UnwindIo = MapIo> {
    pub(super) io: M,
    limits: Limits,
    pub(super) metrics: Metrics,
    store: Option<Store>,
    pub(super) slots: Slots,
    pub(super) budget: Budget,
    pub(super) procs: Procs,
    pub(super) files: Files,
    pub(super) proc_root: PathBuf,
    vdso: Option<Option<TableKey>>,
    /// The process registry, served on this thread ([`Loader::own_registry`]): what is
    /// read of each process goes into its table here, for the symbolizer (the process may
    /// be gone before its samples are handled).
    pub(super) registry: Option<Registry>,
    /// Python processes and their `py_procs` entries (`None`: Python frames are off).
    pub(super) python: Option<Interp>,
    /// Set when the agent stops: `run` returns between two pieces of work.
    pub(super) halt: Arc<AtomicBool>,
    /// [`Settings::subprocesses`].
    pub(super) subprocesses: bool,
}

impl Loader<MapIo> {
    /// A loader filling `maps`.
    pub fn new(maps: UnwindMaps, settings: Settings, metrics: Metrics) -> std::io::Result<Self> {
        Ok(Self::with_io(MapIo::open(maps)?, settings, metrics))
    }
}

impl<M: UnwindIo> Loader<M> {
    /// A loader writing through `io`.
    pub(super) fn with_io(io: M, settings: Settings, metrics: Metrics) -> Self {
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
        let python = settings.python.then(|| Interp::new(metrics.clone()));
        Self {
            io,
            limits: DEFAULT_LIMITS,
            metrics,
            store,
            slots: Slots::new(),
            budget: Budget::new(settings.max_bytes),
            procs: Procs::default(),
            files: Files::default(),
            proc_root: PathBuf::from("/proc"),
            vdso: None,
            registry: None,
            python,
            halt: Arc::new(AtomicBool::new(false)),
            subprocesses: settings.subprocesses,
        }
    }

    /// A flag that, once set, makes [`Loader::run`] return between two pieces of work.
    pub fn halt_handle(&self) -> Arc<AtomicBool> {
        self.halt.clone()
    }

    /// Makes this loader's thread the one that owns every process: it serves `registry`
    /// between two pieces of its own work, hands it what it reads of each process, and
    /// keeps serving it after it stops following processes, until the aggregator is gone.
    pub fn own_registry(&mut self, registry: Registry) {
        self.registry = Some(registry);
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
        // Before the read: a record or ask stamped later may tell of something it missed.
        let read_ns = now_ns();
        let opts = ReadOptions {
            exe: false,
            unless_started_at: self.procs.known_empty(pid),
        };
        let dir = self.proc_root.join(pid.to_string());
        let mut snap = match snapshot::read(&self.proc_root, pid, opts, &self.metrics, |_| true) {
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
        let (ranges, files) = self.ranges_of(&snap);
        snap.python = self.attach_python(&snap);
        if let Some(registry) = &mut self.registry {
            registry.adopt(snap);
        }
        self.write_ranges(pid, (start_time, read_ns), ranges, files);
    }

    /// The ranges of the process `snap` tells of, loading their tables, and the files whose
    /// `unwind_files` entries are to be written.
    fn ranges_of(&mut self, snap: &Snapshot) -> (Vec<Range>, Vec<(KernelFile, Published)>) {
        let pid = snap.pid;
        let dir = self.proc_root.join(pid.to_string());
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
                .and_then(|k| self.slots.table(&k))
                .map(|t| bias(&t.segments, e.start, e.offset))
                .unwrap_or(0);
            if let (Some(key), Some(fid)) = (table, file_id) {
                let kfile = (kernel_dev(e.dev), e.inode);
                let p = Published::new(key, &fid);
                if self.files.published(&kfile) != Some(&p) {
                    files.push((kfile, p));
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
        (ranges, files)
    }

    /// Writes `pid`'s `ranges` (its tables loaded) after committing their tables and
    /// publishing `files`.
    /// `times`: the process's start time and when its read started.
    fn write_ranges(
        &mut self,
        pid: u32,
        (start_time, read_ns): (u64, u64),
        mut ranges: Vec<Range>,
        files: Vec<(KernelFile, Published)>,
    ) {
        if ranges.is_empty() {
            self.procs.mark_empty(pid, start_time);
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
        for (file, p) in files {
            self.publish_file(file, p);
        }
        let new = !self.procs.contains(pid);
        if new && !self.make_room(PROC_COST) {
            self.metrics.dropped(Cache::UnwindProcesses, 1);
            return;
        }
        let proc = Proc {
            start_time,
            ranges,
            read_ns,
        };
        if self.write_proc(pid, &proc.ranges, false) {
            self.procs.put(pid, proc);
        } else {
            self.procs.take(pid);
        }
        self.report();
    }

    /// Tells the sampler which table a file has. Call after `commit`: the sampler must
    /// find the slot filled.
    fn publish_file(&mut self, file: KernelFile, p: Published) {
        let Some(t) = self.slots.table(&p.key) else {
            return;
        };
        let Some(id) = t.id else {
            return;
        };
        let table = (id, t.segments.as_slice());
        self.files
            .publish(&mut self.io, file, p, table, &self.metrics);
    }

    /// Sets the gauges: tables and processes loaded, kernel bytes.
    pub(super) fn report(&self) {
        let loaded = self.slots.loaded();
        self.metrics.unwind_tables.set(loaded as i64);
        self.metrics.unwind_processes.set(self.procs.len() as i64);
        self.metrics
            .unwind_map_bytes
            .set(i64::try_from(self.used_bytes()).unwrap_or(i64::MAX));
    }

    fn used_bytes(&self) -> u64 {
        Budget::used(self.slots.bytes(), self.procs.len())
    }

    /// The table of a mapped file (opened inside its process's root), loading it if needed,
    /// with the identity of the file it was read from. `inode` is the one the mapping names:
    /// a file opened by its path inside the root (`map_files` refused) may be another.
    pub(super) fn file_table(&mut self, file: &File, inode: u64) -> Option<(TableKey, FileId)> {
        let (id, meta) = match identify(file, inode)? {
            Ok(found) => found,
            Err(refused) => {
                self.metrics.table_built(refused);
                return None;
            }
        };
        if let Some(key) = self.files.known(&id) {
            let key = key?;
            if self.slots.id(&key).is_some() {
                return Some((key, id));
            }
            if self.budget.is_refused(&key) || self.files.is_unbuildable(&key) {
                return None;
            }
            // Evicted: the disk cache has it, or it is compiled again below.
            if let Some(t) = self.cached(&key) {
                return self.install(key, &t).then_some((key, id));
            }
        }
        if meta.len() > self.limits.max_object_bytes {
            self.metrics.table_built(TableBuild::TooLarge);
            self.files.remember(id, None, &self.metrics);
            return None;
        }
        // Headers and CFI only, each in a buffer of its own: the table of a 150 MB binary
        // costs its few MB of CFI, and a file whose headers claim more is refused.
        let sparse = match Sparse::read(&FileAt::new(file, meta.len()), self.limits.max_cfi_bytes) {
            Ok(s) => s,
            Err(SparseError::Refused(e)) => {
                debug!("unwind table refused: {e}");
                self.metrics.table_built(build_result(&e));
                self.files.remember(id, None, &self.metrics);
                return None;
            }
            Err(SparseError::Elf(ElfError::Io)) => {
                self.metrics.table_built(TableBuild::Unreadable);
                return None;
            }
            Err(SparseError::Elf(e)) => {
                debug!("unwind table refused: ELF headers: {e}");
                self.metrics.table_built(elf_result(&e));
                self.files.remember(id, None, &self.metrics);
                return None;
            }
        };
        let key = sparse.key();
        self.files.remember(id, Some(key), &self.metrics);
        self.table_from_bytes(key, sparse.bytes(), Some(file))
            .map(|key| (key, id))
    }

    /// The vDSO's table: every process maps the same image, read from the agent's own.
    fn vdso_table(&mut self) -> Option<TableKey> {
        if let Some(v) = self.vdso {
            match v {
                Some(key) if self.slots.id(&key).is_some() => return Some(key),
                Some(_) => {}
                None => return None,
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
        if self.slots.id(&key).is_some() {
            return Some(key);
        }
        if self.budget.is_refused(&key) || self.files.is_unbuildable(&key) {
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
                    self.files.unbuildable(key);
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
    pub(super) fn install(&mut self, key: TableKey, table: &UnwindTable) -> bool {
        let bytes = table_bytes(table_slots(table.pages.len(), table.rows.len()));
        if !self.budget.admits(bytes) || !self.make_room(bytes) {
            self.metrics.table_built(TableBuild::OverBudget);
            self.budget.refuse(key);
            return false;
        }
        let Some(slot) = self.free_slot() else {
            self.metrics.table_built(TableBuild::MapFailed);
            return false;
        };
        let written = image_header(table).and_then(|header| {
            let image = TableImage {
                header,
                pages: bpf_pages(&table.pages),
                rows: bpf_rows(&table.rows),
            };
            self.io.write_table(slot, image)
        });
        if let Err(e) = written {
            debug!("unwind table map: {e}");
            self.metrics.table_built(TableBuild::MapFailed);
            return false;
        }
        self.io.mark_used(slot, now_ns());
        let (_, wrapped) = self.slots.put(slot, key, bytes, table.segments.clone());
        if wrapped {
            self.io.clear_row_cache();
        }
        true
    }

    /// Puts the tables filled since the last call into their slots; those the kernel
    /// refused are freed again.
    pub(super) fn commit(&mut self) {
        if !self.slots.has_pending() {
            return;
        }
        let refused = self.io.commit_tables();
        self.slots.committed();
        for slot in refused {
            self.metrics.table_built(TableBuild::MapFailed);
            self.slots.free(slot);
        }
    }

    fn free_slot(&mut self) -> Option<u32> {
        if let Some(slot) = self.slots.free_slot() {
            return Some(slot);
        }
        self.evict_one()?;
        self.slots.free_slot()
    }

    /// Evicts tables not walked in the last [`super::budget::IN_USE`] until `bytes` more
    /// fit under the cap; false (nothing evicted past what was idle) when they cannot.
    pub(super) fn make_room(&mut self, bytes: u64) -> bool {
        while !self.budget.fits(self.used_bytes(), bytes) {
            if self.evict_one().is_none() {
                return false;
            }
        }
        true
    }

    /// Evicts the least recently walked table; `None` if every loaded table was walked in
    /// the last [`super::budget::IN_USE`] (or none is loaded).
    pub(super) fn evict_one(&mut self) -> Option<()> {
        let (slot, key) = lru_victim(&self.slots, &self.io, now_ns())?;
        // First point every range at the frame pointer, then free the slot: the sampler
        // never finds a slot that holds another object's table.
        let users = self.procs.users(&key);
        self.files.unpublish(&mut self.io, key);
        self.slots.free(slot);
        for pid in users {
            let value = self.procs.get(pid).map(|p| self.proc_value(&p.ranges));
            let written = value.map(|v| self.write_value(pid, &v, false));
            if written == Some(false) {
                self.procs.take(pid);
            }
        }
        self.io.evict_table(slot);
        self.metrics.dropped(Cache::UnwindTables, 1);
        Some(())
    }

    /// The value the walker reads for `ranges`, with the ids of their tables now.
    fn proc_value(&self, ranges: &[Range]) -> ember_unwind_proc {
        proc_value(ranges, |k| self.slots.id(k))
    }

    /// Writes a process's ranges in one update (with `only_new`, only if the sampler has
    /// none for it); false if the kernel refused (a full map is counted).
    pub(super) fn write_proc(&mut self, pid: u32, ranges: &[Range], only_new: bool) -> bool {
        let value = self.proc_value(ranges);
        self.write_value(pid, &value, only_new)
    }

    fn write_value(&mut self, pid: u32, value: &ember_unwind_proc, only_new: bool) -> bool {
        let mut value = *value;
        if self.python_attached(pid) {
            value.flags |= ember_proc_flag::EMBER_PROC_PYTHON.0;
        }
        match self.io.write_proc(pid, &value, only_new) {
            Ok(()) => true,
            Err(MapError::Exists) => false,
            Err(_) => {
                self.metrics.dropped(Cache::UnwindProcesses, 1);
                false
            }
        }
    }
}

/// The header slot of `t` as the walker reads it.
fn image_header(t: &UnwindTable) -> Result<ember_unwind_header, MapError> {
    Ok(ember_unwind_header {
        first_page: u32::try_from(t.first_page)
            .map_err(|_| MapError::TooLarge("page number over 32 bits"))?,
        page_count: u32::try_from(t.pages.len())
            .map_err(|_| MapError::TooLarge("too many pages"))?,
    })
}

/// `pc - bias` is the object's own address for a mapping of its file at `offset` from `start`.
pub(super) fn bias(segments: &[(u64, u64, u64)], start: u64, offset: u64) -> u64 {
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

/// The ELF reader's refusal of an object's headers.
fn elf_result(e: &ElfError) -> TableBuild {
    match e {
        ElfError::Io => TableBuild::Unreadable,
        ElfError::TooLarge | ElfError::CompressedSize => TableBuild::SectionTooLarge,
        ElfError::Malformed(_) | ElfError::Inflate | ElfError::Unsupported => TableBuild::BadElf,
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
