//! Inlined frames and source lines of an object's sampled addresses, from its DWARF (in the
//! object itself, else in the debug file found by its build id, like its symbols).
//!
//! The DWARF is read only for a window's frame-cache misses of an object, through
//! [`ember_parse::dwarf`]: `.debug_aranges` tells which unit covers each address, and only
//! those units are loaded (their DIEs, line program, and the strings and range lists they
//! refer to), with an addr2line context per unit asked for. What is loaded and parsed of an
//! object is kept between windows, by the identity of the object's file, so a window with new
//! addresses in a unit seen before parses nothing again; everything held, all objects
//! together, stays under `symbols.dwarf_bytes` (the least recently used object goes first,
//! and an object whose units a window needs do not fit lets its other units go), counted in
//! `ember_cache_dropped_total{cache="dwarf"}` and `ember_dwarf_cache_bytes`. Addresses
//! left without a chain count in `ember_dwarf_skipped_total{reason}`. An object that gives
//! no lines (no DWARF, over the cap, refused, a caught panic) is remembered while its file
//! lives and not read again; each outcome counts once in `ember_dwarf_objects_total{result}`.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ember_parse::dwarf::{Dwarf, DwarfError, InlineFrame, Looked};

use crate::config::Symbols;
use crate::metrics::{Cache, DwarfRead, DwarfSkip, Metrics};
use crate::model::{FileId, Func};
use crate::process::elf_file::{offset_to_vaddr, ElfReader, Limits};
use crate::process::object::{find_debug_file, FileAt, Object};
use crate::symbolize::demangle_counted;

/// Files remembered as giving no lines; past it the memory starts afresh.
const MAX_SKIPPED: usize = 4096;

/// Objects whose DWARF is kept, at most (each also holds its debug file open).
const MAX_OBJECTS: usize = 256;

/// Shown for a level of a chain whose function has no name in the DWARF.
const NO_NAME: &str = "??";

/// One object's DWARF kept between windows.
struct Held {
    dwarf: Dwarf,
    /// The debug file the DWARF is in (`None`: in the object itself).
    debug: Option<(File, u64)>,
    /// The window it was last used in.
    used: u64,
}

/// The DWARF side of the symbolizer: the switch, the caps, the DWARF kept, and the files
/// not to read again.
pub(super) struct Lines {
    enabled: bool,
    limits: Limits,
    budget: u64,
    held: HashMap<FileId, Held>,
    skipped: HashSet<FileId>,
    window: u64,
    /// Bytes of DWARF that may still be read (a token bucket: refilled with time at
    /// [`REFILL_SECONDS`], up to [`BURST_SHARE`] of the budget). A lookup starts a unit
    /// only while some is left, so one unit may take it below zero, down to minus the
    /// budget: what reading and parsing cost stays bounded on average whatever the host
    /// runs (units not started are deferred: counted, not kept in the frame cache, and
    /// asked for again next window), a unit of any size under the cap still loads in
    /// time, and a steady host, whose units stay held, reads nothing.
    tokens: i64,
    /// When the bucket was last refilled.
    refilled: Option<Instant>,
}

/// The bucket fills with the whole of `symbols.dwarf_bytes` in this many seconds: 38 KiB a
/// second by default, 384 KiB per 10 s window. Loading a unit costs about 6.5 ns per byte
/// (`parse/benches/dwarf.rs`, units of ember's own binary with the units they refer to), so
/// a host whose addresses never settle costs at most about 0.025 % of a core in DWARF reads.
/// By time rather than per window, so that short windows do not read more.
const REFILL_SECONDS: u64 = 320;

/// What a byte of the bucket stands for in time, in tenths of a nanosecond: the bench's
/// 6.5 ns per byte. A lookup is charged its bytes or its time at this rate, whichever is
/// more ([`cost`]): in an agent, lookups that let units go and load them again, or try units
/// that do not fit, cost 100–200 ns per byte read (traced on a host with off-CPU on), and
/// charging bytes alone let DWARF take 0.3 % of a core instead of 0.025 %.
const TENTHS_NS_PER_BYTE: u128 = 65;

/// The share of `symbols.dwarf_bytes` that may be read at once after quiet windows (and at
/// start): a half (6 MiB by default).
const BURST_SHARE: u64 = 2;

/// What a lookup that read `bytes` in `took` is charged to the bucket: its bytes, or its
/// time at [`TENTHS_NS_PER_BYTE`] if more.
fn cost(bytes: u64, took: Duration) -> u64 {
    let by_time = took.as_nanos() * 10 / TENTHS_NS_PER_BYTE;
    bytes.max(u64::try_from(by_time).unwrap_or(u64::MAX))
}

/// An object's chains by file offset: functions innermost first, each with its file and
/// line (for an outer level, where the inner one was inlined).
pub(super) type Chains = HashMap<u64, Vec<Func>>;

/// What [`Lines::chains`] found for a batch of an object's offsets.
#[derive(Default)]
pub(super) struct Found {
    /// The chains of the offsets that have one.
    pub(super) chains: Chains,
    /// Offsets whose DWARF this window could not read any more: to ask again next window.
    pub(super) deferred: Vec<u64>,
}

impl Lines {
    /// Reads DWARF per `settings` (`symbols.dwarf`, `symbols.dwarf_bytes`).
    pub(super) fn new(settings: &Symbols) -> Self {
        Self {
            enabled: settings.dwarf,
            limits: Limits {
                max_read_bytes: settings.dwarf_bytes,
                max_section_bytes: settings.dwarf_bytes.min(settings.max_section_bytes),
            },
            budget: settings.dwarf_bytes,
            held: HashMap::new(),
            skipped: HashSet::new(),
            window: 0,
            tokens: burst(settings.dwarf_bytes),
            refilled: None,
        }
    }

    /// A new window: what may be read grows with the time since the last one.
    pub(super) fn start_window(&mut self) {
        self.window += 1;
        let now = Instant::now();
        let full = Duration::from_secs(REFILL_SECONDS);
        let elapsed = self
            .refilled
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t))
            .min(full);
        self.refilled = Some(now);
        let refill = u128::from(self.budget) * elapsed.as_millis() / full.as_millis();
        let refill = i64::try_from(refill).unwrap_or(i64::MAX);
        self.tokens = self.tokens.saturating_add(refill).min(burst(self.budget));
    }

    /// Takes `bytes` read from what may be read (down to minus the budget).
    fn spend(&mut self, bytes: u64) {
        let floor = -i64::try_from(self.budget).unwrap_or(i64::MAX);
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        self.tokens = self.tokens.saturating_sub(bytes).max(floor);
    }

    /// Forgets `id` (its file is gone: a new file on its inode is another file; or its
    /// debug file just arrived).
    pub(super) fn forget(&mut self, id: &FileId) {
        self.skipped.remove(id);
        self.held.remove(id);
    }

    /// Bytes of DWARF held, all objects together.
    pub(super) fn bytes(&self) -> u64 {
        self.held.values().map(|h| h.dwarf.bytes()).sum()
    }

    /// The chains of `offsets` in `obj` that its DWARF covers (none when it has none, or
    /// DWARF is off), and the offsets deferred to a later window.
    pub(super) fn chains(
        &mut self,
        obj: &Object,
        offsets: &[u64],
        settings: &Symbols,
        metrics: &Metrics,
    ) -> Found {
        if !self.enabled || offsets.is_empty() || self.skipped.contains(&obj.id) {
            return Found::default();
        }
        if self.tokens <= 0 && !self.held.contains_key(&obj.id) {
            // Opening it reads its index at least: that waits for the next window's share.
            metrics.dwarf_skipped(DwarfSkip::Deferred, offsets.len() as u64);
            return Found {
                chains: Chains::new(),
                deferred: offsets.to_vec(),
            };
        }
        // A parser bug on a hostile file costs that file's lines, not the agent.
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.read_chains(obj, offsets, settings, metrics)
        }));
        let result = match read {
            Ok(Ok(found)) => {
                self.evict(&obj.id, metrics);
                return found;
            }
            Ok(Err(e)) => {
                tracing::debug!("no lines for {}: {e}", obj.path);
                outcome(&e)
            }
            Err(_) => {
                tracing::warn!("the DWARF reader panicked on {}; names only", obj.path);
                DwarfRead::Panic
            }
        };
        metrics.dwarf_read(result);
        self.held.remove(&obj.id);
        if self.skipped.len() >= MAX_SKIPPED {
            self.skipped.clear();
        }
        self.skipped.insert(obj.id);
        metrics.dwarf_cache_bytes.set(self.bytes() as i64);
        Found::default()
    }

    /// Lets the least recently used objects other than `keep` go until what is held is
    /// under the budget (and at most [`MAX_OBJECTS`] are).
    fn evict(&mut self, keep: &FileId, metrics: &Metrics) {
        let mut total = self.bytes();
        while total > self.budget || self.held.len() > MAX_OBJECTS {
            let oldest = self
                .held
                .iter()
                .filter(|(id, _)| *id != keep)
                .min_by_key(|(_, h)| h.used)
                .map(|(id, _)| *id);
            let Some(id) = oldest else { break };
            if let Some(h) = self.held.remove(&id) {
                tracing::debug!("DWARF over the budget: let go of {} bytes", h.dwarf.bytes());
                total = total.saturating_sub(h.dwarf.bytes());
                metrics.dropped(Cache::Dwarf, 1);
            }
        }
        metrics.dwarf_cache_bytes.set(total as i64);
    }

    /// Opens the DWARF of `obj` (or of its debug file, when the object has none), or
    /// takes the one kept, and looks `offsets` up.
    fn read_chains(
        &mut self,
        obj: &Object,
        offsets: &[u64],
        settings: &Symbols,
        metrics: &Metrics,
    ) -> Result<Found, DwarfError> {
        let started = Instant::now();
        let mut opened = 0;
        let src = obj.reader();
        let mut elf = ElfReader::new(&src, self.limits)?;
        let addrs: Vec<(u64, u64)> = offsets
            .iter()
            .filter_map(|&off| Some((off, offset_to_vaddr(elf.segments(), off)?)))
            .collect();
        let vaddrs: Vec<u64> = addrs.iter().map(|&(_, a)| a).collect();
        // Taken before opening: the lookup that opens an object loads a unit too.
        let read_budget = u64::try_from(self.tokens).unwrap_or(0);
        let mut held = match self.held.remove(&obj.id) {
            Some(h) => h,
            None => {
                let h = self.open(obj, &mut elf, settings, metrics)?;
                // Its index (or, without one, all of it) is read too.
                opened = h.dwarf.bytes();
                self.spend(opened);
                metrics.dwarf_read(DwarfRead::Lines);
                h
            }
        };
        held.used = self.window;
        let mut files: HashMap<String, Arc<str>> = HashMap::new();
        let mut chains = Chains::new();
        let mut found = |i: usize, chain: Vec<InlineFrame>| {
            if chain.is_empty() {
                return;
            }
            if let Some(&(off, _)) = addrs.get(i) {
                chains.insert(off, funcs(chain, &mut files, metrics));
            }
        };
        drop(elf);
        let looked = match &held.debug {
            None => {
                let mut elf = ElfReader::new(&src, self.limits)?;
                held.dwarf
                    .lookup(&mut elf, &vaddrs, read_budget, &mut found)
            }
            Some((file, size)) => {
                let debug_src = FileAt::new(file, *size);
                let mut debug = ElfReader::new(&debug_src, self.limits)?;
                held.dwarf
                    .lookup(&mut debug, &vaddrs, read_budget, &mut found)
            }
        }?;
        let took = started.elapsed();
        let charged = cost(opened + looked.bytes_read, took);
        tracing::debug!(
            "lines of {}: {} addresses, {opened} bytes opened, {} read, {} deferred, in {took:?}",
            obj.path,
            offsets.len(),
            looked.bytes_read,
            looked.deferred.len(),
        );
        self.spend(charged.saturating_sub(opened));
        count(&looked, metrics);
        let deferred = looked
            .deferred
            .iter()
            .filter_map(|&i| addrs.get(i).map(|a| a.0))
            .collect();
        self.held.insert(obj.id, held);
        Ok(Found { chains, deferred })
    }

    /// The DWARF of `obj`, or of its debug file by build id when the object has none.
    fn open(
        &self,
        obj: &Object,
        elf: &mut ElfReader<'_, FileAt<'_>>,
        settings: &Symbols,
        metrics: &Metrics,
    ) -> Result<Held, DwarfError> {
        match Dwarf::open(elf, self.budget) {
            Err(DwarfError::NoDwarf) => {}
            other => {
                return Ok(Held {
                    dwarf: other?,
                    debug: None,
                    used: 0,
                })
            }
        }
        let (file, _) = find_debug_file(
            obj,
            &settings.debug_dirs,
            &settings.root_debug_dirs,
            settings.fetched_dir.as_deref(),
            metrics,
        )
        .ok_or(DwarfError::NoDwarf)?;
        let size = FileId::of_file(&file)
            .map_err(|_| DwarfError::Malformed)?
            .size;
        let debug_src = FileAt::new(&file, size);
        let mut debug = ElfReader::new(&debug_src, self.limits)?;
        // The file is named by the build id; a file that says otherwise is not it.
        if debug.build_id().ok().flatten() != obj.build_id {
            return Err(DwarfError::NoDwarf);
        }
        let dwarf = Dwarf::open(&mut debug, self.budget)?;
        drop(debug);
        Ok(Held {
            dwarf,
            debug: Some((file, size)),
            used: 0,
        })
    }
}

/// Counts what a lookup read and skipped.
fn count(looked: &Looked, metrics: &Metrics) {
    metrics.dwarf_read_bytes.inc_by(looked.bytes_read);
    if looked.reset {
        metrics.dropped(Cache::Dwarf, 1);
    }
    let s = looked.skipped;
    for (reason, n) in [
        (DwarfSkip::OverCap, s.over_cap),
        (DwarfSkip::TooDeep, s.too_deep),
        (DwarfSkip::Malformed, s.malformed),
        (DwarfSkip::NoUnit, s.no_unit),
        (DwarfSkip::Deferred, s.deferred),
    ] {
        if n > 0 {
            metrics.dwarf_skipped(reason, n);
        }
    }
}

/// What may be read at once: [`BURST_SHARE`] of `budget`.
fn burst(budget: u64) -> i64 {
    i64::try_from(budget / BURST_SHARE).unwrap_or(i64::MAX)
}

/// The metric result of a refusal.
fn outcome(e: &DwarfError) -> DwarfRead {
    match e {
        DwarfError::NoDwarf => DwarfRead::NoDwarf,
        DwarfError::Compressed => DwarfRead::Compressed,
        DwarfError::OverCap => DwarfRead::OverCap,
        DwarfError::TooDeep => DwarfRead::TooDeep,
        DwarfError::Malformed => DwarfRead::Malformed,
    }
}

/// A chain as the symbolizer's functions: names demangled like symbols, file names shared
/// within the batch.
fn funcs(
    chain: Vec<InlineFrame>,
    files: &mut HashMap<String, Arc<str>>,
    metrics: &Metrics,
) -> Vec<Func> {
    chain
        .into_iter()
        .map(|f| Func {
            name: match &f.name {
                Some(raw) => demangle_counted(raw, metrics),
                None => Arc::from(NO_NAME),
            },
            file: f.file.map(|p| {
                files
                    .entry(p)
                    .or_insert_with_key(|p| Arc::from(p.as_str()))
                    .clone()
            }),
            line: f.line,
        })
        .collect()
}

/// Merges a frame's chain with its symbol name: the chain gives the levels, files and
/// lines; the outermost level keeps the symbol table's name when there is one (what ember
/// names that function without DWARF, so a frame is named alike with or without it).
pub(super) fn merge(mut chain: Vec<Func>, symbol: Option<Arc<str>>) -> Vec<Func> {
    if let (Some(outer), Some(name)) = (chain.last_mut(), symbol) {
        outer.name = name;
    }
    chain
}

#[cfg(test)]
mod tests {
    use super::*;

    fn func(name: &str, line: u32) -> Func {
        Func {
            name: Arc::from(name),
            file: Some(Arc::from("/src/a.cc")),
            line,
        }
    }

    #[test]
    fn the_outermost_level_keeps_the_symbol_name() {
        let chain = vec![func("inner", 8), func("outer(int)", 27)];
        let merged = merge(chain.clone(), Some(Arc::from("outer")));
        assert_eq!(&*merged[0].name, "inner");
        assert_eq!(&*merged[1].name, "outer");
        assert_eq!(merged[1].line, 27);
        assert_eq!(merge(chain.clone(), None), chain);
    }

    #[test]
    fn a_lookup_is_charged_its_bytes_or_its_time_whichever_is_more() {
        // 1 MB parsed at the bench's pace: its bytes.
        assert_eq!(cost(1_000_000, Duration::from_micros(6_000)), 1_000_000);
        // 400 KB that took 80 ms (units let go and loaded again): its time, 12.3 MB.
        assert_eq!(cost(400_000, Duration::from_millis(80)), 12_307_692);
        assert_eq!(cost(0, Duration::ZERO), 0);
        assert_eq!(cost(7, Duration::from_secs(u64::MAX)), u64::MAX);
    }

    #[test]
    fn reads_refill_with_time_not_windows() {
        let settings = Symbols::default();
        let mut lines = Lines::new(&settings);
        lines.start_window();
        lines.tokens = 0;
        // Windows in quick succession add (almost) nothing.
        for _ in 0..100 {
            lines.start_window();
        }
        assert!(lines.tokens < 1 << 10, "{}", lines.tokens);
        // 10 s add 10/320 of the budget; a long pause at most half of it.
        lines.tokens = 0;
        lines.refilled = lines.refilled.map(|t| t - Duration::from_secs(10));
        lines.start_window();
        let ten = i64::try_from(settings.dwarf_bytes / 32).expect("fits");
        assert!(
            (lines.tokens - ten).abs() < ten / 10,
            "{} vs {ten}",
            lines.tokens
        );
        lines.refilled = lines.refilled.map(|t| t - Duration::from_secs(3600));
        lines.start_window();
        assert_eq!(lines.tokens, burst(settings.dwarf_bytes));
    }

    #[test]
    fn names_and_lines_of_the_agents_own_code() {
        let obj = Object::open_local(std::path::Path::new("/proc/self/exe")).expect("open");
        let metrics = Metrics::new();
        // The test binary holds ~100 MB of DWARF; the unit of this crate's code and those it
        // refers to take ~6 MB, charged 4× (over the default 12 MiB: names only there).
        let settings = Symbols {
            dwarf_bytes: 64 << 20,
            ..Symbols::default()
        };
        let mut lines = Lines::new(&settings);
        // A file offset in our own text: where this function's code is.
        let f = names_and_lines_of_the_agents_own_code as *const () as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let off = maps
            .lines()
            .find_map(|l| {
                let mut it = l.split_whitespace();
                let (range, _, offset) = (it.next()?, it.next()?, it.next()?);
                let (lo, hi) = range.split_once('-')?;
                let (lo, hi) = (
                    u64::from_str_radix(lo, 16).ok()?,
                    u64::from_str_radix(hi, 16).ok()?,
                );
                (lo <= f && f < hi).then(|| f - lo + u64::from_str_radix(offset, 16).unwrap_or(0))
            })
            .expect("our text");
        // A window whose share is spent defers it, and the next window reads it.
        lines.tokens = 0;
        let later = lines.chains(&obj, &[off], &settings, &metrics);
        assert!(later.chains.is_empty());
        assert_eq!(later.deferred, [off]);
        // The next window, 10 s later.
        lines.refilled = Some(Instant::now() - Duration::from_secs(10));
        lines.start_window();
        assert!(lines.tokens > 0);
        let chains = lines.chains(&obj, &[off], &settings, &metrics).chains;
        let chain = chains.get(&off).expect("a chain for our own code");
        let outer = chain.last().expect("levels");
        assert!(
            outer
                .name
                .contains("names_and_lines_of_the_agents_own_code"),
            "{chain:?}"
        );
        assert!(outer
            .file
            .as_deref()
            .is_some_and(|p| p.ends_with("symbolize/dwarf.rs")));
        assert!(outer.line > 0);
        // Kept for the next window: asked again, nothing more is read.
        let read = metrics.dwarf_read_bytes.get();
        assert!(read > 0 && lines.bytes() > 0);
        assert_eq!(
            lines.chains(&obj, &[off], &settings, &metrics).chains,
            chains
        );
        assert_eq!(metrics.dwarf_read_bytes.get(), read, "read again");
        // Under a cap too small for its unit index: refused, counted once, not read again.
        let small = Symbols {
            dwarf_bytes: 64 << 10,
            ..Symbols::default()
        };
        let mut capped = Lines::new(&small);
        for _ in 0..2 {
            assert!(capped
                .chains(&obj, &[off], &small, &metrics)
                .chains
                .is_empty());
        }
        let over = metrics
            .dwarf_objects
            .get_or_create(&crate::metrics::ResultLabel {
                result: DwarfRead::OverCap,
            });
        assert_eq!(over.get(), 1);
        // Off: nothing read.
        let off_settings = Symbols {
            dwarf: false,
            ..Symbols::default()
        };
        let mut none = Lines::new(&off_settings);
        let nothing = none.chains(&obj, &[off], &off_settings, &metrics);
        assert!(nothing.chains.is_empty() && nothing.deferred.is_empty());
    }
}
