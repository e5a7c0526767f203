//! Symbolization stage: names every frame of a window, in batches per object file.
//!
//! In: an aggregated [`Window`] (normalized frames, workload labels per stack). Out: a
//! [`Symbolized`] window: the same stacks, each frame resolved to its mapping (kernel,
//! object file with build id, region, JIT source), address and functions. The encoders
//! read only this; nothing downstream touches the process table or an open file.
//!
//! User code is named from each object's ELF symbol tables ([`table::SymTable`]): read
//! once per file (by `fstat` identity of the file opened, [`FileId`]: device, inode, size,
//! mtime and ctime — a container can write any build id, not another file's inode, and a
//! file on a freed and reused inode has a new ctime) through the safe reader of
//! [`crate::process::object`], kept between windows under `symbols.cache_bytes` and shared
//! by every process that maps the file. `.symtab` comes from the object itself or from a
//! debug file found by build id in `symbols.debug_dirs` on the host, else in
//! `symbols.root_debug_dirs` inside the root of the process the object came from (opened
//! like a mapped object: confined to that root, no symlinks, non-blocking, regular files
//! only); `.gnu_debuglink` and other paths named inside an object are never followed.
//! Inlined frames and source lines come from the DWARF of the object or of that debug file
//! ([`dwarf`]: read only for a window's new addresses of an object, within
//! `symbols.dwarf_bytes`, and dropped once they are looked up). Names are demangled (Rust, C++) when first looked up, within a byte cap ([`demangle`]). The kernel
//! is named from a compact kallsyms table, reloaded when the module list changes. Results
//! are cached by `(file identity, file offset)`; a file opened for a mapping must be the
//! inode the mapping names. What is cached of a file outlives its last process for a few
//! minutes ([`GONE_PERIODS`]: a program run again is not read again), found only by the
//! whole identity: a new file on a freed inode has a new ctime, and is named from itself. Addresses with no name keep a placeholder (`libc.so.6+0x1a2b`) and count in
//! `ember_symbol_misses_total{reason}`; objects refused (unreadable, malformed, over a cap,
//! a parser panic, not the mapped inode) count in `ember_object_refusals_total{reason}`.

pub mod debuginfod;
mod dwarf;
#[cfg(test)]
mod golden_names;
mod kallsyms;
use ember_parse::symbols::packed;
pub use ember_parse::symbols::{demangle, table};
mod offcpu;
mod period;
mod table_cache;

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Weak};

use crate::aggregate::{Frame, Window};
use crate::config::Symbols;
use crate::metrics::{Cache, Metrics, NameCap, ProcRead, SymbolMiss, SymbolSource};
use crate::model::{
    FileId, Func, JitSource, Mapping, ObjectFile, SymFrame, Symbolized, KERNEL_MAPPING,
    PYTHON_MAPPING, WAKE_SEPARATOR,
};
use crate::os::file_id::FileTime;
use crate::process::elf_file::{ElfReader, Limits};
use crate::process::object::{refusal, Object};
use crate::process::python::PyFrame;
use crate::process::table::UserAddr;
use crate::symbolize::debuginfod::Debuginfod;
use crate::symbolize::demangle::Outcome;
use crate::symbolize::kallsyms::Kallsyms;
use crate::symbolize::table::{Miss, SymTable};
use crate::symbolize::table_cache::Tables;
use offcpu::trim_off_cpu;

/// What one frame resolved to: functions innermost (inlined) first, and whether a
/// symbol was found at all (if not, `funcs` holds one placeholder like `libc.so.6+0x1a2b`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// Functions, innermost first.
    pub funcs: Arc<[Func]>,
    /// A real symbol was found.
    pub named: bool,
}

/// Cache key of a frame: kernel address, or object plus file offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameKey {
    /// Kernel address.
    Kernel(u64),
    /// Offset in an object file, by the identity of the file opened (not the device and
    /// inode of the mapping, which a new file takes over once the old one is freed).
    Object(FileId, u64),
    /// Offset in the vDSO (every process maps the same image).
    Vdso(u64),
}

// Hashed per frame of a window, twice: only the parts of a file's identity that tell files
// apart (equal keys hash alike all the same).
impl Hash for FrameKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self {
            FrameKey::Kernel(a) => (0u8, a).hash(state),
            FrameKey::Object(id, off) => (1u8, file_hash(id), off).hash(state),
            FrameKey::Vdso(off) => (2u8, off).hash(state),
        }
    }
}

/// What of a file's identity hashes: its inode and ctime, which the kernel sets (two files
/// share them only on two devices, by chance), not the 56 bytes of [`FileId`].
fn file_hash(id: &FileId) -> (u64, FileTime) {
    (id.ino, id.ctime)
}

/// Key of the frame cache: a [`FrameKey`] with the file by the serial number the symbolizer
/// gave its identity ([`Live`]): the cache holds up to `limits.symbol_cache_entries` keys,
/// and a [`FileId`] is 56 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum CacheKey {
    Kernel(u64),
    Object(u64, u64),
    Vdso(u64),
}

/// A [`FileId`] as a map key, hashed like a [`FrameKey`]'s file ([`file_hash`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileKey(FileId);

impl Hash for FileKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        file_hash(&self.0).hash(state);
    }
}

/// A file whose names may be cached: the last object of it seen, its serial number, and
/// the last period an object of it was held.
struct Live {
    object: Weak<Object>,
    serial: u64,
    held: u64,
}

/// Periods a file's names are kept once no object of it is held: a program run again
/// (a probe, a cron job, a shell's commands) is named from them, not read again. Off-CPU
/// sees nearly every short-lived process (each blocks), so without this each run of the
/// same binary rebuilt its symbol table and read its DWARF again.
const GONE_PERIODS: u64 = 30;

/// Files kept with no object held, at most: past it the least recently held go first.
const MAX_GONE: usize = 512;

/// The path column of the vDSO's mapping, the label of its frames.
const VDSO: &str = "[vdso]";

/// Long-lived symbolizer with bounded caches.
pub struct Symbolizer {
    tables: Tables,
    lines: dwarf::Lines,
    settings: Symbols,
    kernel: Kallsyms,
    modules: u64,
    cache: HashMap<CacheKey, Resolved>,
    cap: usize,
    window: u64,
    metrics: Metrics,
    /// The vDSO's symbols, from the agent's own image; built on the first vDSO frame
    /// (`Some(None)`: the agent has none, or it did not parse).
    vdso: Option<Option<SymTable>>,
    /// Every file whose names are cached, with the last object of it seen: once no object
    /// of a file has been held (by the process table or a window) for [`GONE_PERIODS`], its
    /// table and frames go.
    live: HashMap<FileKey, Live>,
    /// The serial number the next file gets.
    serial: u64,
    /// The debuginfod client, when servers are configured.
    debuginfod: Option<Debuginfod>,
}

impl Symbolizer {
    /// A symbolizer whose frame cache holds at most `cache_entries` frames, with the
    /// default `symbols:` settings.
    pub fn new(cache_entries: usize, metrics: Metrics) -> Self {
        Self::with_settings(cache_entries, Symbols::default(), metrics)
    }

    /// A symbolizer with the `symbols:` settings `settings`.
    pub fn with_settings(cache_entries: usize, settings: Symbols, metrics: Metrics) -> Self {
        Self {
            tables: Tables::new(settings.cache_bytes),
            lines: dwarf::Lines::new(&settings),
            settings,
            kernel: load_kallsyms(&metrics),
            modules: modules_fingerprint(),
            cache: HashMap::new(),
            vdso: None,
            live: HashMap::new(),
            serial: 0,
            cap: cache_entries.max(1),
            window: 0,
            metrics,
            debuginfod: None,
        }
    }

    /// Names stripped objects also from debug files fetched by `client`.
    pub fn with_debuginfod(mut self, client: Option<Debuginfod>) -> Self {
        self.settings.fetched_dir = client.as_ref().map(|c| c.dir().to_owned());
        self.debuginfod = client;
        self
    }

    /// Forgets what was cached of files whose debug file arrived since the last window.
    fn take_arrivals(&mut self) {
        let files = self.debuginfod.as_mut().map(|d| d.arrived());
        for file in files.unwrap_or_default() {
            self.tables.remove(&file);
            self.lines.forget(&file);
            if let Some(serial) = self.live.get(&FileKey(file)).map(|l| l.serial) {
                self.cache
                    .retain(|k, _| !matches!(k, CacheKey::Object(s, _) if *s == serial));
            }
        }
    }

    /// Names every frame of `window` (from cache where possible).
    pub fn symbolize(&mut self, window: Window) -> Symbolized {
        let names = self.resolve(&window);
        let out = assemble(window, &names);
        drop(names);
        // Hand large freed buffers (section reads) back to the kernel rather than keeping
        // them in malloc's pools: steady RSS is what users budget for.
        crate::os::trim_heap();
        out
    }

    /// Resolves every distinct frame of `window` (from cache where possible).
    fn resolve(&mut self, window: &Window) -> HashMap<FrameKey, Resolved> {
        self.resolve_all(std::slice::from_ref(window))
    }

    /// Resolves every distinct frame of `windows` (from cache where possible).
    fn resolve_all(&mut self, windows: &[Window]) -> HashMap<FrameKey, Resolved> {
        self.window += 1;
        self.lines.start_window();
        self.refresh_kernel();
        self.take_arrivals();
        let mut kernel: Vec<u64> = Vec::new();
        let mut vdso: Vec<u64> = Vec::new();
        let mut by_object: HashMap<FileId, (Arc<Object>, Vec<u64>)> = HashMap::new();
        let mut out: HashMap<FrameKey, Resolved> = HashMap::new();
        // Frames not in the cache, with their cache keys.
        let mut misses: Vec<(FrameKey, CacheKey)> = Vec::new();
        for frame in period::frames(windows) {
            let key = match frame {
                Frame::Kernel(a) => FrameKey::Kernel(*a),
                Frame::User(UserAddr::Object(o, off)) => FrameKey::Object(o.id, *off),
                Frame::User(UserAddr::Region(label, off)) if &**label == VDSO => {
                    FrameKey::Vdso(*off)
                }
                Frame::User(_) => continue,
            };
            let std::collections::hash_map::Entry::Vacant(slot) = out.entry(key) else {
                continue;
            };
            let cached = match (key, frame) {
                (FrameKey::Object(_, off), Frame::User(UserAddr::Object(o, _))) => {
                    CacheKey::Object(self.hold(o), off)
                }
                (FrameKey::Kernel(a), _) => CacheKey::Kernel(a),
                (FrameKey::Vdso(off), _) => CacheKey::Vdso(off),
                // An object's key is made from an object's frame.
                (FrameKey::Object(..), _) => continue,
            };
            if let Some(r) = self.cache.get(&cached) {
                slot.insert(r.clone());
                continue;
            }
            // Placeholder until resolved; also dedups the batch.
            slot.insert(unnamed(frame));
            misses.push((key, cached));
            match frame {
                Frame::Kernel(a) => kernel.push(*a),
                Frame::User(UserAddr::Object(o, off)) => by_object
                    .entry(o.id)
                    .or_insert_with(|| (o.clone(), Vec::new()))
                    .1
                    .push(*off),
                Frame::User(UserAddr::Region(_, off)) => vdso.push(*off),
                Frame::User(_) => {}
            }
        }
        self.forget_gone();
        let kernel_misses = kernel.len();
        for addr in kernel {
            let resolved = match self.kernel.resolve(addr) {
                Some(name) => named(Arc::from(name.as_str())),
                None => Resolved {
                    funcs: vec![Func {
                        name: Arc::from(self.kernel.unnamed(addr)),
                        file: None,
                        line: 0,
                    }]
                    .into(),
                    named: false,
                },
            };
            out.insert(FrameKey::Kernel(addr), resolved);
        }
        tracing::debug!(
            "window {}: {} kernel and {} object lookups missed the cache",
            self.window,
            kernel_misses,
            by_object.values().map(|v| v.1.len()).sum::<usize>()
        );
        // Addresses that got no name, by reason, counted once per batch.
        let mut missed: HashMap<SymbolMiss, u64> = HashMap::new();
        if !vdso.is_empty() {
            let metrics = self.metrics.clone();
            match self.vdso_table() {
                Some(table) => {
                    for off in vdso {
                        match table.lookup(off) {
                            Ok(name) => {
                                let name = demangle_counted(&name, &metrics);
                                out.insert(FrameKey::Vdso(off), named(name));
                            }
                            Err(m) => *missed.entry(miss(m)).or_default() += 1,
                        }
                    }
                }
                None => *missed.entry(SymbolMiss::Error).or_default() += vdso.len() as u64,
            }
        }
        let transient = self.name_objects(by_object, &mut out, &mut missed);
        for (reason, n) in missed {
            self.metrics.symbol_missed(reason, n);
        }
        self.remember(&out, &misses, &transient);
        self.metrics
            .symbol_table_bytes
            .set(self.tables.bytes as i64);
        out
    }

    /// Names the frames of each object of `by_object` (offsets not in the frame cache) into
    /// `out`, counting misses into `missed` and sources in `ember_symbols_total`. Returns the
    /// frames of objects paused over the budget: not kept in the frame cache, so they are
    /// named once the object is parsed again.
    fn name_objects(
        &mut self,
        by_object: HashMap<FileId, (Arc<Object>, Vec<u64>)>,
        out: &mut HashMap<FrameKey, Resolved>,
        missed: &mut HashMap<SymbolMiss, u64>,
    ) -> HashSet<FrameKey> {
        let mut transient: HashSet<FrameKey> = HashSet::new();
        // Addresses of objects, by where their name came from, counted once per batch.
        let mut sources: HashMap<SymbolSource, u64> = HashMap::new();
        for (key, (obj, offsets)) in by_object {
            let Some(named_by) = self.table(&obj) else {
                *missed.entry(SymbolMiss::Error).or_default() += offsets.len() as u64;
                *sources.entry(SymbolSource::Unnamed).or_default() += offsets.len() as u64;
                if self.tables.over_budget.contains_key(&obj.id) {
                    transient.extend(offsets.iter().map(|&off| FrameKey::Object(key, off)));
                }
                continue;
            };
            let found = (self.lines).chains(&obj, &offsets, &self.settings, &self.metrics);
            let mut chains = found.chains;
            // Named without lines for now: not kept, so the next window asks for its lines.
            transient.extend(found.deferred.iter().map(|&off| FrameKey::Object(key, off)));
            for off in offsets {
                let name = (named_by.table)
                    .lookup(off)
                    .map(|n| demangle_counted(&n, &self.metrics));
                let (resolved, source) = match (name, chains.remove(&off)) {
                    (Ok(name), None) => (named(name), named_by.source),
                    (name, Some(chain)) => {
                        let source = if name.is_ok() {
                            named_by.source
                        } else {
                            SymbolSource::Dwarf
                        };
                        let funcs = dwarf::merge(chain, name.ok()).into();
                        (Resolved { funcs, named: true }, source)
                    }
                    (Err(m), None) => {
                        *missed.entry(miss(m)).or_default() += 1;
                        *sources.entry(SymbolSource::Unnamed).or_default() += 1;
                        continue;
                    }
                };
                *sources.entry(source).or_default() += 1;
                out.insert(FrameKey::Object(key, off), resolved);
            }
        }
        for (source, n) in sources {
            self.metrics.symbols_from(source, n);
        }
        transient
    }

    /// Marks the file of `o` as held by this window (its cache stays); its serial number
    /// (given now if it has none).
    fn hold(&mut self, o: &Arc<Object>) -> u64 {
        let next = &mut self.serial;
        let live = self.live.entry(FileKey(o.id)).or_insert_with(|| {
            *next += 1;
            Live {
                object: Weak::new(),
                serial: *next,
                held: 0,
            }
        });
        // Most frames are of the object already noted: no reference count to touch.
        if live.object.as_ptr() != Arc::as_ptr(o) {
            live.object = Arc::downgrade(o);
        }
        live.serial
    }

    /// The frame cache's key for `key` (`None` for a file not held in this window).
    fn cache_key(&self, key: &FrameKey) -> Option<CacheKey> {
        Some(match *key {
            FrameKey::Kernel(a) => CacheKey::Kernel(a),
            FrameKey::Vdso(off) => CacheKey::Vdso(off),
            FrameKey::Object(id, off) => CacheKey::Object(self.live.get(&FileKey(id))?.serial, off),
        })
    }

    /// Drops the tables and frames of files no object has been held of (every process
    /// mapping them gone, and no window carrying them) for [`GONE_PERIODS`], and of the
    /// least recently held past [`MAX_GONE`]. What is kept is found only by the whole
    /// [`FileId`]: a file on a freed and reused inode has a new ctime, so it is another
    /// file and is named from its own bytes. Files seen in this window were marked held
    /// before this runs.
    fn forget_gone(&mut self) {
        let window = self.window;
        let mut idle: Vec<(u64, FileKey)> = Vec::new();
        for (id, live) in &mut self.live {
            if live.object.strong_count() > 0 {
                live.held = window;
            } else {
                idle.push((live.held, *id));
            }
        }
        let stale = window.saturating_sub(GONE_PERIODS);
        // Newest first: what is past the cap, or held too long ago, goes.
        idle.sort_unstable_by_key(|a| std::cmp::Reverse(a.0));
        let mut gone: HashSet<u64> = HashSet::new();
        for (i, (held, id)) in idle.into_iter().enumerate() {
            if held > stale && i < MAX_GONE {
                continue;
            }
            if let Some(live) = self.live.remove(&id) {
                gone.insert(live.serial);
            }
            self.tables.remove(&id.0);
            self.lines.forget(&id.0);
        }
        if !gone.is_empty() {
            self.cache
                .retain(|k, _| !matches!(k, CacheKey::Object(s, _) if gone.contains(s)));
        }
    }

    /// Keeps this window's new results (`misses`) for the next ones, within the cap;
    /// `transient` ones (of an object whose table is paused over the budget) are asked
    /// again next time.
    fn remember(
        &mut self,
        results: &HashMap<FrameKey, Resolved>,
        misses: &[(FrameKey, CacheKey)],
        transient: &HashSet<FrameKey>,
    ) {
        let new: Vec<(CacheKey, &Resolved)> = misses
            .iter()
            .filter(|(k, _)| !transient.contains(k))
            .filter_map(|(k, c)| Some((*c, results.get(k)?)))
            .collect();
        let keep: Vec<(CacheKey, &Resolved)> = if self.cache.len() + new.len() > self.cap {
            // Whole-cache reset: O(1) bookkeeping, and this window's frames refill it (the
            // next ones refill what else is hot).
            self.metrics
                .dropped(Cache::Symbols, self.cache.len() as u64);
            self.cache.clear();
            results
                .iter()
                .filter(|(k, _)| !transient.contains(k))
                .filter_map(|(k, v)| Some((self.cache_key(k)?, v)))
                .collect()
        } else {
            new
        };
        for (k, v) in keep {
            if self.cache.len() >= self.cap {
                self.metrics.dropped(Cache::Symbols, 1);
                break;
            }
            self.cache.entry(k).or_insert_with(|| v.clone());
        }
    }

    /// The vDSO's symbol table, built once from the agent's own image (the kernel maps
    /// the same one into every process).
    fn vdso_table(&mut self) -> Option<&SymTable> {
        let metrics = &self.metrics;
        self.vdso
            .get_or_insert_with(|| {
                let image = crate::os::procfs::own_vdso()?;
                let limits = Limits {
                    max_read_bytes: 1 << 20,
                    max_section_bytes: 1 << 20,
                };
                let table = ElfReader::new(&image[..], limits)
                    .and_then(|mut elf| SymTable::build::<[u8], [u8]>(&mut elf, None));
                match table {
                    Ok((t, _)) => Some(t),
                    Err(e) => {
                        metrics.object_refused(refusal(&e));
                        None
                    }
                }
            })
            .as_ref()
    }

    /// kallsyms changes when modules load or unload: then reload it.
    fn refresh_kernel(&mut self) {
        let now = modules_fingerprint();
        if now != self.modules {
            self.modules = now;
            self.kernel = load_kallsyms(&self.metrics);
            self.cache.retain(|k, _| !matches!(k, CacheKey::Kernel(_)));
        }
    }
}

/// A frame named `name`.
fn named(name: Arc<str>) -> Resolved {
    Resolved {
        funcs: vec![Func {
            name,
            file: None,
            line: 0,
        }]
        .into(),
        named: true,
    }
}

/// A symbol name as people read it ([`demangle::demangle`]), counting names kept as
/// stored because their demangled form was over the cap or a demangler panicked.
fn demangle_counted(raw: &[u8], metrics: &Metrics) -> Arc<str> {
    let (name, outcome) = demangle::demangle(raw);
    match outcome {
        Outcome::TooLong => metrics.name_capped(NameCap::DemangleOutput, 1),
        Outcome::Panicked => metrics.name_capped(NameCap::DemanglePanic, 1),
        Outcome::Demangled | Outcome::AsStored => {}
    }
    Arc::from(name)
}

/// A symbol name as people read it (uncounted: tests).
#[cfg(test)]
fn demangle(raw: &[u8]) -> Arc<str> {
    Arc::from(demangle::demangle(raw).0)
}

fn load_kallsyms(metrics: &Metrics) -> Kallsyms {
    Kallsyms::load().unwrap_or_else(|e| {
        tracing::warn!("cannot read /proc/kallsyms, kernel frames stay unnamed: {e}");
        metrics.proc_read_error(ProcRead::Kallsyms, 1);
        Kallsyms::default()
    })
}

fn modules_fingerprint() -> u64 {
    let text = crate::os::procfs::read_capped(std::path::Path::new("/proc/modules"), 1 << 20)
        .unwrap_or_default();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    // Name and load address of each module; the use counts in between change all the time.
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.first(), f.get(5)).hash(&mut h);
    }
    h.finish()
}

/// The metric reason of a lookup miss.
fn miss(m: Miss) -> SymbolMiss {
    match m {
        Miss::InvalidFileOffset => SymbolMiss::InvalidFileOffset,
        Miss::MissingSyms => SymbolMiss::MissingSyms,
        Miss::UnknownAddr => SymbolMiss::UnknownAddr,
    }
}

/// Where a frame is, as far as naming it goes: equal sites name alike in one window.
#[derive(PartialEq, Eq)]
enum Site {
    Kernel(u64),
    Object(FileId, u64),
    Region(Arc<str>, u64),
    Unknown(u64),
    Jit(JitSource, u64, Arc<str>, Option<Arc<str>>, u32),
    Python(Arc<PyFrame>),
}

impl Hash for Site {
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self {
            Site::Kernel(a) => (0u8, a).hash(state),
            Site::Object(id, off) => (1u8, file_hash(id), off).hash(state),
            Site::Region(label, off) => (2u8, label, off).hash(state),
            Site::Unknown(a) => (3u8, a).hash(state),
            Site::Jit(source, addr, name, file, line) => {
                (4u8, source, addr, name, file, line).hash(state)
            }
            Site::Python(f) => (5u8, f).hash(state),
        }
    }
}

/// Builds the symbolized window from `window` and the names of its frames (`names`;
/// a frame missing there is unnamed). Consumes the window stack by stack, so its frames
/// are freed as their resolved ones are made; equal frames are made once.
pub(crate) fn assemble(mut window: Window, names: &HashMap<FrameKey, Resolved>) -> Symbolized {
    let mut frames: HashMap<Site, Arc<SymFrame>> = HashMap::new();
    let mut objects: HashMap<FileId, Arc<ObjectFile>> = HashMap::new();
    let mut frame = |f: &Frame| -> Arc<SymFrame> {
        let site = match f {
            Frame::Kernel(a) => Site::Kernel(*a),
            Frame::User(UserAddr::Object(o, off)) => Site::Object(o.id, *off),
            Frame::User(UserAddr::Region(label, off)) => Site::Region(label.clone(), *off),
            Frame::User(UserAddr::Unknown(a)) => Site::Unknown(*a),
            Frame::User(UserAddr::Jit(j)) => {
                Site::Jit(j.source, j.addr, j.name.clone(), j.file.clone(), j.line)
            }
            Frame::User(UserAddr::Python(p)) => Site::Python(p.clone()),
        };
        frames
            .entry(site)
            .or_insert_with(|| Arc::new(sym_frame(f, names, &mut objects)))
            .clone()
    };
    let stacks = std::mem::take(&mut window.stacks)
        .into_iter()
        .map(|s| {
            let frames = match s.off_cpu {
                Some(_) => trim_off_cpu(s.frames.iter().map(&mut frame).collect()),
                None => s.frames.iter().map(&mut frame).collect(),
            };
            s.with_frames(frames)
        })
        .collect();
    window.with_stacks(stacks)
}

/// One frame, resolved: its mapping (objects named by the first path seen in the
/// window, as `objects` remembers), address and functions.
fn sym_frame(
    frame: &Frame,
    names: &HashMap<FrameKey, Resolved>,
    objects: &mut HashMap<FileId, Arc<ObjectFile>>,
) -> SymFrame {
    let (mapping, address, key) = match frame {
        // No kernel address leaves the agent (it gives away the KASLR slide): a kernel
        // frame is its name, an unnamed one its offset from the text start (in its name).
        Frame::Kernel(a) => (Mapping::Kernel, 0, Some(FrameKey::Kernel(*a))),
        Frame::User(UserAddr::Object(o, off)) => {
            let file = objects.entry(o.id).or_insert_with(|| {
                Arc::new(ObjectFile {
                    key: o.key,
                    id: o.id,
                    path: o.path.clone(),
                    build_id: o.build_id.clone(),
                })
            });
            (
                Mapping::Object(file.clone()),
                *off,
                Some(FrameKey::Object(o.id, *off)),
            )
        }
        Frame::User(UserAddr::Region(label, _)) if &**label == WAKE_SEPARATOR => {
            return offcpu::separator(label)
        }
        Frame::User(UserAddr::Region(label, off)) => (
            Mapping::Region(label.clone()),
            *off,
            (&**label == VDSO).then_some(FrameKey::Vdso(*off)),
        ),
        Frame::User(UserAddr::Unknown(a)) => (Mapping::Unknown, *a, None),
        Frame::User(UserAddr::Python(p)) => return python_frame(p),
        Frame::User(UserAddr::Jit(j)) => {
            return SymFrame {
                mapping: Mapping::Jit(j.source),
                address: j.addr,
                funcs: vec![Func {
                    name: j.name.clone(),
                    file: j.file.clone(),
                    line: j.line,
                }]
                .into(),
                named: true,
            }
        }
    };
    let resolved = key
        .and_then(|k| names.get(&k))
        .cloned()
        .unwrap_or_else(|| unnamed(frame));
    SymFrame {
        mapping,
        address,
        funcs: resolved.funcs,
        named: resolved.named,
    }
}

/// A Python frame: its function, file and line, or `[python]+0x…` (the code object's
/// address) when it could not be named.
fn python_frame(p: &PyFrame) -> SymFrame {
    let named = p.name.is_some();
    let name = match &p.name {
        Some(n) => n.clone(),
        None => Arc::from(format!("{PYTHON_MAPPING}+{:#x}", p.code)),
    };
    SymFrame {
        mapping: Mapping::Python,
        address: p.code,
        funcs: vec![Func {
            name,
            file: p.file.clone(),
            line: p.line,
        }]
        .into(),
        named,
    }
}

/// The name of a frame that has no symbol: `libc.so.6+0x1a2b`, `[vdso]+0x10`, `[unknown]`.
fn unnamed(frame: &Frame) -> Resolved {
    let name = match frame {
        // Placeholder only: `resolve_all` names every kernel frame without its address.
        Frame::Kernel(_) => KERNEL_MAPPING.to_owned(),
        Frame::User(UserAddr::Object(o, off)) => format!("{}+{off:#x}", o.base_name()),
        Frame::User(UserAddr::Region(label, off)) => format!("{label}+{off:#x}"),
        Frame::User(UserAddr::Unknown(_)) => "[unknown]".to_owned(),
        // Named already (`sym_frame` uses the name); only reached by mistake.
        Frame::User(UserAddr::Jit(j)) => j.name.to_string(),
        Frame::User(UserAddr::Python(p)) => format!("{PYTHON_MAPPING}+{:#x}", p.code),
    };
    Resolved {
        funcs: vec![Func {
            name: Arc::from(name),
            file: None,
            line: 0,
        }]
        .into(),
        named: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::Stack;
    use crate::model::{FrameCounts, ObjectKey, ProfileKind};
    use crate::process::jit;
    use crate::symbolize::table_cache::{NEGATIVE_BYTES, OVER_BUDGET_WINDOWS};
    use std::time::{Duration, SystemTime};

    #[inline(never)]
    fn a_very_distinct_function_name() -> u64 {
        std::hint::black_box(42)
    }

    fn window(frames: Vec<Frame>) -> Window {
        Window {
            start: SystemTime::now(),
            duration: Duration::from_secs(1),
            period_ns: 1,
            kind: Default::default(),
            stacks: vec![Stack {
                pid: 1,
                tid: 1,
                comm: "t".into(),
                process: Arc::from("t"),
                labels: Arc::default(),
                frames,
                count: 1,
                off_cpu: None,
                runtime: None,
            }],
        }
    }

    #[test]
    fn names_vdso_functions_from_the_agents_own_image() {
        // glibc registers the vDSO as a loaded object: dlsym gives its functions'
        // addresses without ember's ELF reader.
        // SAFETY: RTLD_NOLOAD only looks the already mapped vDSO up; the names are C strings.
        let f = unsafe {
            let h = libc::dlopen(
                c"linux-vdso.so.1".as_ptr(),
                libc::RTLD_NOLOAD | libc::RTLD_LAZY,
            );
            assert!(!h.is_null(), "no vDSO registered with the dynamic loader");
            libc::dlsym(h, c"__vdso_clock_gettime".as_ptr()) as u64
        };
        assert_ne!(f, 0);
        let mut table = crate::process::table::ProcessTable::new(
            &crate::config::Limits::default(),
            Metrics::new(),
        );
        let pid = std::process::id();
        table.touch(pid, pid, &[0; 16], 1, 0);
        // A few bytes into the function, as a sampled instruction pointer is.
        let ua = table.normalize(pid, 0, f + 4);
        let UserAddr::Region(ref label, off) = ua else {
            panic!("not the vDSO: {ua:?}")
        };
        assert_eq!(&**label, VDSO);
        let mut s = Symbolizer::new(1000, Metrics::new());
        let r = s.resolve(&window(vec![Frame::User(ua.clone())]));
        let got = &r[&FrameKey::Vdso(off)];
        assert!(got.named, "{got:?}");
        assert!(got.funcs[0].name.contains("clock_gettime"), "{got:?}");
        // The assembled frame keeps the vDSO as its mapping and carries the name.
        let sym = assemble(window(vec![Frame::User(ua)]), &r);
        let frame = &sym.stacks[0].frames[0];
        assert_eq!(frame.mapping, Mapping::Region(Arc::from(VDSO)));
        assert!(frame.named);
    }

    #[test]
    fn names_own_function_once_per_file() {
        let _ = a_very_distinct_function_name();
        let mut table = crate::process::table::ProcessTable::new(
            &crate::config::Limits {
                max_processes: 4,
                max_objects: 64,
                ..Default::default()
            },
            Metrics::new(),
        );
        let pid = std::process::id();
        table.touch(pid, pid, &[0; 16], 1, 0);
        let addr = a_very_distinct_function_name as *const () as u64;
        let ua = table.normalize(pid, 0, addr);
        let UserAddr::Object(obj, off) = ua.clone() else {
            panic!("not normalized: {ua:?}")
        };
        let mut s = Symbolizer::new(1000, Metrics::new());
        let w = window(vec![Frame::User(ua), Frame::User(UserAddr::Unknown(5))]);
        let r = s.resolve(&w);
        let got = &r[&FrameKey::Object(obj.id, off)];
        assert!(got.named);
        // Innermost first: whatever got inlined into our function comes before it.
        let outer = got.funcs.last().expect("one function at least");
        assert!(
            outer.name.contains("a_very_distinct_function_name"),
            "{got:?}"
        );
        assert_eq!(
            &*outer.name, "ember::symbolize::tests::a_very_distinct_function_name",
            "demangled, no hash"
        );
        assert_eq!(s.tables.map.len(), 1);
        // Second window comes from the cache, same answer.
        let again = s.resolve(&w);
        assert_eq!(again[&FrameKey::Object(obj.id, off)], *got);
        // A new address of the same file reuses its table: no second parse.
        s.cache.clear();
        let _ = s.resolve(&w);
        assert_eq!(s.tables.map.len(), 1);
    }

    #[test]
    fn a_periods_windows_are_named_in_one_pass() {
        let _ = a_very_distinct_function_name();
        let mut table = crate::process::table::ProcessTable::new(
            &crate::config::Limits::default(),
            Metrics::new(),
        );
        let pid = std::process::id();
        table.touch(pid, pid, &[0; 16], 1, 0);
        let addr = a_very_distinct_function_name as *const () as u64;
        let (ua, ua2) = (
            table.normalize(pid, 0, addr),
            table.normalize(pid, 0, addr + 1),
        );
        let kinds = [ProfileKind::Cpu, ProfileKind::OffCpu, ProfileKind::OffWake];
        let windows: Vec<Window> = kinds
            .iter()
            .zip([&ua, &ua2, &ua])
            .map(|(&kind, f)| Window {
                kind,
                ..window(vec![Frame::User(f.clone())])
            })
            .collect();
        let mut s = Symbolizer::new(1000, Metrics::new());
        let named = s.symbolize_all(windows);
        let got: Vec<(ProfileKind, bool)> = named
            .iter()
            .map(|w| (w.kind, w.stacks[0].frames[0].named))
            .collect();
        assert_eq!(
            got,
            kinds.map(|k| (k, true)),
            "every window, in order, named"
        );
        let name = |w: &Symbolized| w.stacks[0].frames[0].funcs.last().map(|f| f.name.clone());
        assert!(name(&named[1]).is_some_and(|n| n.contains("a_very_distinct_function_name")));
        // One pass: the table parsed once, and the caches aged by one (not one per window).
        assert_eq!((s.tables.map.len(), s.window), (1, 1));
    }

    #[test]
    fn names_kernel_frames_from_kallsyms() {
        let text = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
        let addr = text.lines().find_map(|l| {
            let mut f = l.split_whitespace();
            let a = u64::from_str_radix(f.next()?, 16).ok()?;
            let _t = f.next()?;
            (f.next()? == "schedule" && a != 0).then_some(a)
        });
        let Some(addr) = addr else {
            eprintln!("skipped: kallsyms addresses are hidden (not root)");
            return;
        };
        let mut s = Symbolizer::new(1000, Metrics::new());
        let r = s.resolve(&window(vec![Frame::Kernel(addr + 1)]));
        let got = &r[&FrameKey::Kernel(addr + 1)];
        assert!(got.named);
        assert_eq!(&*got.funcs[0].name, "schedule");
    }

    #[test]
    fn unnamed_frames_keep_where_they_were() {
        assert_eq!(
            &*unnamed(&Frame::User(UserAddr::Unknown(9))).funcs[0].name,
            "[unknown]"
        );
        let r = unnamed(&Frame::User(UserAddr::Region(Arc::from("[vdso]"), 0x10)));
        assert_eq!(&*r.funcs[0].name, "[vdso]+0x10");
        assert!(!r.named);
    }

    #[test]
    fn assembles_shared_typed_frames() {
        let jit = Arc::new(jit::JitFrame {
            source: JitSource::PerfMap,
            name: Arc::from("LazyCompile:hot"),
            file: None,
            line: 0,
            addr: 0x7f00,
        });
        let frames = vec![
            Frame::Kernel(0xffff_0010),
            Frame::User(UserAddr::Jit(jit)),
            Frame::User(UserAddr::Region(Arc::from("[vdso]"), 0x10)),
            Frame::User(UserAddr::Unknown(0x42)),
        ];
        let mut w = window(frames);
        w.stacks.push(w.stacks[0].clone());
        let mut names = HashMap::new();
        let schedule = Resolved {
            funcs: vec![Func {
                name: Arc::from("schedule"),
                file: None,
                line: 0,
            }]
            .into(),
            named: true,
        };
        names.insert(FrameKey::Kernel(0xffff_0010), schedule.clone());
        let s = assemble(w, &names);
        assert_eq!(s.samples(), 2);
        let [a, b] = &s.stacks[..] else {
            panic!("two stacks: {s:?}")
        };
        for (x, y) in a.frames.iter().zip(&b.frames) {
            assert!(Arc::ptr_eq(x, y), "equal frames are made once");
        }
        let f = &a.frames;
        assert_eq!(
            (&f[0].mapping, f[0].address),
            // A named kernel frame leaves without its address (no KASLR slide off the host).
            (&Mapping::Kernel, 0)
        );
        assert_eq!(f[0].funcs, schedule.funcs);
        assert!(f[1].is_jit() && f[1].named);
        assert_eq!(f[1].mapping.file_name(), "[perf-map]");
        assert_eq!(&*f[1].funcs[0].name, "LazyCompile:hot");
        assert_eq!(f[2].mapping, Mapping::Region(Arc::from("[vdso]")));
        assert_eq!(&*f[2].funcs[0].name, "[vdso]+0x10");
        assert!(!f[2].named);
        assert_eq!((&f[3].mapping, f[3].address), (&Mapping::Unknown, 0x42));
        assert_eq!(
            s.frame_counts(),
            FrameCounts {
                named: 2,
                unnamed: 4,
                jit: 2
            }
        );
    }

    #[test]
    fn misses_are_counted_by_reason() {
        let m = Metrics::new();
        let mut s = Symbolizer::new(1000, m.clone());
        let count = |reason| {
            m.symbol_misses
                .get_or_create(&crate::metrics::ReasonLabel { reason })
                .get()
        };
        // Not an ELF file: the call fails, and every address asked about counts.
        let dir = tempfile::tempdir().expect("tempdir");
        let junk = dir.path().join("junk.so");
        std::fs::write(&junk, b"not an ELF file").expect("write");
        let obj = Arc::new(Object::open_local(&junk).expect("open"));
        let frames = vec![
            Frame::User(UserAddr::Object(obj.clone(), 0x10)),
            Frame::User(UserAddr::Object(obj.clone(), 0x20)),
        ];
        let r = s.resolve(&window(frames.clone()));
        assert!(!r[&FrameKey::Object(obj.id, 0x10)].named);
        assert_eq!(count(SymbolMiss::Error), 2);
        // Cached: the same addresses are not asked about (or counted) again.
        let _ = s.resolve(&window(frames));
        assert_eq!(count(SymbolMiss::Error), 2);
        // Our own binary, far past its end: no segment holds the offset.
        let exe =
            Arc::new(Object::open_local(&std::env::current_exe().expect("exe")).expect("open"));
        let r = s.resolve(&window(vec![Frame::User(UserAddr::Object(
            exe.clone(),
            u64::MAX >> 8,
        ))]));
        assert!(!r[&FrameKey::Object(exe.id, u64::MAX >> 8)].named);
        assert_eq!(count(SymbolMiss::InvalidFileOffset), 1, "{}", m.encode());
        assert!(m.encode().contains("# TYPE ember_symbol_misses counter"));
        assert!(m
            .encode()
            .contains("ember_object_refusals_total{reason=\"malformed\"} 1"));
    }

    #[test]
    fn table_cache_evicts_past_its_budget() {
        let mut t = Tables::new(1000);
        let id = |ino| FileId {
            dev: 1,
            ino,
            size: 0,
            mtime: Default::default(),
            ctime: Default::default(),
        };
        for i in 0..10 {
            assert_eq!(t.insert(id(i), None, i), 0);
        }
        assert_eq!(t.bytes, 10 * NEGATIVE_BYTES);
        let _ = t.get(&id(0), 20);
        let evicted: u64 = (10..20).map(|i| t.insert(id(i), None, 20 + i)).sum();
        assert!(evicted > 0 && t.bytes <= 1000);
        assert!(t.get(&id(0), 40).is_some(), "recently used is kept");
        assert!(
            t.get(&id(1), 40).is_none(),
            "least recently used went first"
        );
    }

    #[test]
    fn a_table_over_the_budget_is_not_parsed_in_every_window() {
        let _ = a_very_distinct_function_name();
        let metrics = Metrics::new();
        let mut table = crate::process::table::ProcessTable::new(
            &crate::config::Limits::default(),
            metrics.clone(),
        );
        let pid = std::process::id();
        table.touch(pid, pid, &[0; 16], 1, 0);
        let ua = table.normalize(pid, 0, a_very_distinct_function_name as *const () as u64);
        let UserAddr::Object(obj, off) = ua.clone() else {
            panic!("not normalized: {ua:?}")
        };
        let settings = Symbols {
            cache_bytes: 1,
            ..Symbols::default()
        };
        let mut s = Symbolizer::with_settings(1000, settings, metrics.clone());
        let key = FrameKey::Object(obj.id, off);
        let refusals =
            |m: &Metrics| counter(m, "ember_object_refusals_total{reason=\"over_budget\"}");
        let w = window(vec![Frame::User(ua)]);
        assert!(s.resolve(&w)[&key].named, "the first window is named");
        assert_eq!(refusals(&metrics), 1);
        // The frame cache would answer the same address: each window asks for the table
        // as a window with new addresses in the object does.
        for _ in 1..OVER_BUDGET_WINDOWS {
            s.cache.clear();
            assert!(!s.resolve(&w)[&key].named, "then unnamed, not parsed again");
        }
        assert_eq!(refusals(&metrics), 1);
        s.cache.clear();
        assert!(s.resolve(&w)[&key].named, "parsed again after the pause");
        assert_eq!(refusals(&metrics), 2);
    }

    /// A file in `dir` holding an object whose one function `name` spans 0x1000..0x1100,
    /// opened as an object of the mapping `key` (as the process table opens one).
    fn object_named(dir: &std::path::Path, file: &str, name: &str, key: ObjectKey) -> Arc<Object> {
        let mut strtab = vec![0u8];
        strtab.extend_from_slice(name.as_bytes());
        strtab.push(0);
        let elf = table::test_object(&table::test_symtab([(1, 0x1000, 0x100)]), &strtab);
        let path = dir.join(file);
        std::fs::write(&path, elf).expect("write object");
        let f = std::fs::File::open(&path).expect("open object");
        Arc::new(Object::new(key, path.display().to_string(), f, None))
    }

    fn key_of(path: &std::path::Path) -> ObjectKey {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).expect("stat");
        ObjectKey {
            dev: (libc::major(m.dev()), libc::minor(m.dev())),
            inode: m.ino(),
        }
    }

    /// The value of the counter `series` (name and labels) in `m`'s exposition, 0 if absent.
    fn counter(m: &Metrics, series: &str) -> u64 {
        m.encode()
            .lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    }

    fn name_of(r: &HashMap<FrameKey, Resolved>, o: &Object, off: u64) -> String {
        r[&FrameKey::Object(o.id, off)].funcs[0].name.to_string()
    }

    /// Tenant A's binary is named and cached, then freed; tenant B's binary takes over the
    /// same device and inode (as a reused inode does: the mapping's key is all the old
    /// caches went by) with its own function at the same offsets. B is named from B.
    #[test]
    fn a_reused_inode_is_named_from_the_new_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = Metrics::new();
        let mut s = Symbolizer::new(1000, m.clone());
        let a_path = dir.path().join("a");
        std::fs::write(&a_path, b"").expect("touch");
        let key = key_of(&a_path);
        let a = object_named(dir.path(), "a", "tenant_a_secret_fn", key);
        let w = |o: &Arc<Object>| window(vec![Frame::User(UserAddr::Object(o.clone(), 0x1010))]);
        assert_eq!(
            name_of(&s.resolve(&w(&a)), &a, 0x1010),
            "tenant_a_secret_fn"
        );
        let a_id = a.id;
        let a_serial = s.live[&FileKey(a_id)].serial;
        assert!(s.cache.contains_key(&CacheKey::Object(a_serial, 0x1010)));
        drop(a);
        std::fs::remove_file(&a_path).expect("rm a");
        // B on the same inode, as ext4 reuses a freed one at once (on a filesystem that
        // does not, B only shows that its own names are found).
        let b_path = dir.path().join("b");
        std::fs::write(&b_path, b"").expect("touch");
        let reused = key_of(&b_path) == key;
        let b = object_named(dir.path(), "b", "tenant_b_public_fn", key_of(&b_path));
        println!("inode reused: {reused}; A {a_id:?}, B {:?}", b.id);
        assert_ne!(a_id, b.id, "the file identity tells A from B");
        let r = s.resolve(&w(&b));
        assert_eq!(name_of(&r, &b, 0x1010), "tenant_b_public_fn");
        // B has its own serial and table: nothing of A's names it.
        assert!(s.tables.map.contains_key(&b.id));
        let b_serial = s.live[&FileKey(b.id)].serial;
        assert_ne!(a_serial, b_serial);
        assert!(s.cache.contains_key(&CacheKey::Object(b_serial, 0x1010)));
        // A's names are kept a while after it is gone, then forgotten.
        assert!(s.live.contains_key(&FileKey(a_id)));
        for _ in 0..GONE_PERIODS {
            let _ = s.resolve(&w(&b));
        }
        assert!(!s.tables.map.contains_key(&a_id));
        assert!(!s.live.contains_key(&FileKey(a_id)));
        assert!(!s.cache.contains_key(&CacheKey::Object(a_serial, 0x1010)));
        assert!(s.cache.contains_key(&CacheKey::Object(b_serial, 0x1010)));
    }

    /// A program run again soon after its last process exited is named from what was kept:
    /// no table is built again. Past [`MAX_GONE`] files with no process, the least recently
    /// held go first.
    #[test]
    fn a_program_run_again_is_named_from_what_was_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = Metrics::new();
        let mut s = Symbolizer::new(1000, m.clone());
        let path = dir.path().join("probe");
        std::fs::write(&path, b"").expect("touch");
        let first = object_named(dir.path(), "probe", "probe_main", key_of(&path));
        let w = |o: &Arc<Object>| window(vec![Frame::User(UserAddr::Object(o.clone(), 0x1010))]);
        let from_symtab = |m: &Metrics| counter(m, "ember_symbols_total{source=\"symtab\"}");
        assert_eq!(
            name_of(&s.resolve(&w(&first)), &first, 0x1010),
            "probe_main"
        );
        assert_eq!(from_symtab(&m), 1);
        drop(first);
        let _ = s.resolve(&window(Vec::new()));
        // The same file, opened again for a new process.
        let f = std::fs::File::open(&path).expect("open object");
        let again = Arc::new(Object::new(
            key_of(&path),
            path.display().to_string(),
            f,
            None,
        ));
        assert_eq!(
            name_of(&s.resolve(&w(&again)), &again, 0x1010),
            "probe_main"
        );
        assert_eq!(
            from_symtab(&m),
            1,
            "named from the frames kept, not looked up again"
        );
        drop(again);
        // Many other files gone since: the probe, held longest ago, goes first.
        let others: Vec<Arc<Object>> = (0..MAX_GONE)
            .map(|i| {
                let name = format!("other{i}");
                let p = dir.path().join(&name);
                std::fs::write(&p, b"").expect("touch");
                object_named(dir.path(), &name, "other_fn", key_of(&p))
            })
            .collect();
        let frames = others
            .iter()
            .map(|o| Frame::User(UserAddr::Object(o.clone(), 0x1010)))
            .collect();
        let _ = s.resolve(&window(frames));
        let probe = key_of(&path);
        assert!(s.live.keys().any(|k| k.0.ino == probe.inode));
        drop(others);
        let _ = s.resolve(&window(Vec::new()));
        assert_eq!(s.live.len(), MAX_GONE);
        assert!(!s.live.keys().any(|k| k.0.ino == probe.inode));
    }

    /// A file opened for a mapping that is not the mapping's inode (a path opened where
    /// `map_files` was refused, after the file was replaced) is not read.
    #[test]
    fn a_file_that_is_not_the_mapped_inode_is_not_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = Metrics::new();
        let mut s = Symbolizer::new(1000, m.clone());
        let o = object_named(
            dir.path(),
            "other",
            "someone_elses_fn",
            ObjectKey {
                dev: (0, 0),
                inode: 1,
            },
        );
        let frames = vec![Frame::User(UserAddr::Object(o.clone(), 0x1010))];
        let r = s.resolve(&window(frames.clone()));
        assert!(!r[&FrameKey::Object(o.id, 0x1010)].named);
        s.cache.clear();
        let _ = s.resolve(&window(frames));
        assert!(
            m.encode()
                .contains("ember_object_refusals_total{reason=\"mismatch\"} 1"),
            "counted once: {}",
            m.encode()
        );
    }

    /// A nesting C++ name in an object: shown as stored, counted, never demangled whole.
    #[test]
    fn a_name_whose_demangled_form_is_over_the_cap_is_shown_as_stored() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = Metrics::new();
        let mut s = Symbolizer::new(1000, m.clone());
        let path = dir.path().join("nest");
        std::fs::write(&path, b"").expect("touch");
        let name = demangle::nesting_name(34);
        let o = object_named(dir.path(), "nest", &name, key_of(&path));
        let r = s.resolve(&window(vec![Frame::User(UserAddr::Object(
            o.clone(),
            0x1010,
        ))]));
        assert_eq!(name_of(&r, &o, 0x1010), name);
        assert!(
            m.encode()
                .contains("ember_symbol_names_capped_total{reason=\"demangle_output\"} 1"),
            "{}",
            m.encode()
        );
    }

    #[test]
    fn cache_is_capped() {
        let mut s = Symbolizer::new(2, Metrics::new());
        let frames = (0..5u64)
            .map(|i| Frame::Kernel(0xffff_ffff_0000_0000 + i))
            .collect();
        let _ = s.resolve(&window(frames));
        assert!(s.cache.len() <= 2);
    }
}
