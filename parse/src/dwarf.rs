//! Inline chains and source lines of code addresses, from an object's DWARF
//! (`.debug_info`, `.debug_line` and the sections they refer to), read through the capped
//! ELF reader.
//!
//! The lookup itself is gimli's `addr2line` crate (gimli-rs, the symbolizer Rust's own
//! backtraces use): it parses units, line programs and inlined-subroutine trees lazily, one
//! unit at a time, over byte slices ember owns. blazesym's DWARF support does the same over
//! gimli but wants to open and map files itself, and ember reads hostile files only with
//! `pread` into its own buffers ([`crate::elf_file`]), so the crate that takes plain
//! sections is the fit. No loader, no `.gnu_debuglink`, no split DWARF (`.dwo`) and no
//! supplementary file is followed: every split-DWARF load is skipped.
//!
//! Hostile input: every section is read within the reader's [`Limits`] (one section, and
//! all together); `SHF_COMPRESSED` zlib sections inflate under the same caps (the reader
//! stops a bomb one byte past its declared size) and zstd or GNU `.zdebug_*` ones are
//! refused ([`DwarfError::Compressed`]). addr2line recurses once per level of nested
//! inlined subroutines, so a file whose DIE tree nests deeper than [`MAX_DIE_DEPTH`] is
//! refused before any lookup ([`DwarfError::TooDeep`]): a few bytes of `.debug_info` per
//! level would otherwise overflow the stack, which is an abort, not a catchable panic.
//! Chains are cut at [`MAX_INLINE_DEPTH`] levels and names at [`MAX_NAME`] bytes.
//!
//! [`Limits`]: crate::elf_file::Limits

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use addr2line::gimli;
use gimli::{Reader, RunTimeEndian, SectionId};

use crate::elf_file::{ElfError, ElfReader, ReadAt};
use load::UnitSkip;
use sparse::{Spans, Sparse};

mod load;
mod sparse;

/// Deepest DIE nesting accepted (real C++ with heavy templates stays under ~200).
pub const MAX_DIE_DEPTH: isize = 1024;

/// Most levels of one address's chain kept (the innermost ones are kept).
pub const MAX_INLINE_DEPTH: usize = 64;

/// Longest function name or file path kept, in bytes (longer ones are cut).
pub const MAX_NAME: usize = 4096;

/// The sections a lookup reads; others (`.debug_loclists`, `.debug_types`...) stay unread.
const WANTED: [SectionId; 10] = [
    SectionId::DebugAbbrev,
    SectionId::DebugAddr,
    SectionId::DebugAranges,
    SectionId::DebugInfo,
    SectionId::DebugLine,
    SectionId::DebugLineStr,
    SectionId::DebugRanges,
    SectionId::DebugRngLists,
    SectionId::DebugStr,
    SectionId::DebugStrOffsets,
];

/// Why an object's DWARF was not used; each maps to one metric reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DwarfError {
    /// No `.debug_info` (stripped, or never built with `-g`).
    NoDwarf,
    /// Compressed sections ember does not inflate (zstd, GNU `.zdebug_*`), or zlib ones
    /// that declare more than the cap or inflate past their size.
    Compressed,
    /// The sections are over the caps.
    OverCap,
    /// DIEs nested deeper than [`MAX_DIE_DEPTH`].
    TooDeep,
    /// Sections gimli cannot parse, or a read that failed.
    Malformed,
}

impl fmt::Display for DwarfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DwarfError::NoDwarf => "no DWARF",
            DwarfError::Compressed => "compressed DWARF refused",
            DwarfError::OverCap => "DWARF over the cap",
            DwarfError::TooDeep => "DWARF DIEs nested too deep",
            DwarfError::Malformed => "malformed DWARF",
        })
    }
}

impl std::error::Error for DwarfError {}

impl From<ElfError> for DwarfError {
    fn from(e: ElfError) -> Self {
        match e {
            ElfError::TooLarge => DwarfError::OverCap,
            ElfError::CompressedSize | ElfError::Inflate | ElfError::Unsupported => {
                DwarfError::Compressed
            }
            ElfError::Io | ElfError::Malformed(_) => DwarfError::Malformed,
        }
    }
}

impl From<gimli::Error> for DwarfError {
    fn from(_: gimli::Error) -> Self {
        DwarfError::Malformed
    }
}

/// One level of an address's inline chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InlineFrame {
    /// The function's name as stored (linkage name when there is one, else `DW_AT_name`),
    /// at most [`MAX_NAME`] bytes; not demangled.
    pub name: Option<Vec<u8>>,
    /// Source file (directory joined), at most [`MAX_NAME`] bytes.
    pub file: Option<String>,
    /// Source line (for an outer level, the line of the call inlined there), or 0.
    pub line: u32,
}

/// Addresses of one lookup that got no chain though their object has DWARF, by reason.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Skipped {
    /// The unit covering it did not fit under the object's cap.
    pub over_cap: u64,
    /// The unit covering it nests DIEs deeper than [`MAX_DIE_DEPTH`].
    pub too_deep: u64,
    /// The unit covering it does not parse.
    pub malformed: u64,
    /// No unit covers it (`.debug_aranges` has no range holding it).
    pub no_unit: u64,
    /// The unit covering it was over what the reader could still read: it may be read
    /// in a later lookup.
    pub deferred: u64,
}

/// What one [`Dwarf::lookup`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Looked {
    /// Units read from the file for it.
    pub units_read: u64,
    /// Bytes read from the file for it.
    pub bytes_read: u64,
    /// Units whose loading started (loaded or not: each start scans the unit's entries).
    pub units_tried: u64,
    /// Whether the units held before were let go to make room for this lookup's.
    pub reset: bool,
    /// Addresses left without a chain, by reason.
    pub skipped: Skipped,
    /// Indexes (into the addresses looked up) of those [`Skipped::deferred`]: worth asking
    /// again, unlike the others.
    pub deferred: Vec<usize>,
}

/// One range of `.debug_aranges`: `[begin, end)` is in the unit at `unit`.
#[derive(Debug, Clone, Copy)]
struct Arange {
    begin: u64,
    end: u64,
    unit: u64,
}

/// Bytes of parsed state (addr2line's line rows, function and inline trees) charged per
/// byte of DWARF loaded: with it, what is charged matched the agent's RSS with DWARF on
/// less off, on a host running ember's own debug build (`bench/overhead.py --dwarf-compare`).
const PARSED_PER_BYTE: u64 = 3;

/// Units loaded in one lookup because a unit loaded refers to them (for an inlined
/// function's name), at most.
const MAX_FOLLOWED: usize = 256;

/// What ember holds of one object's DWARF between lookups: where its sections are, which
/// unit covers which addresses (from `.debug_aranges`), the units loaded so far and an
/// addr2line context per unit asked for (which keeps what it parsed: a unit loaded later
/// leaves it alone).
pub struct Dwarf {
    endian: RunTimeEndian,
    sections: Vec<load::Section>,
    /// `None`: every section was read whole (no `.debug_aranges`, or compressed sections).
    index: Option<Vec<Arange>>,
    /// Units loaded: (offset, length), sorted.
    units: Vec<(u64, u64)>,
    /// Units not loaded for good, and why (not over the cap: those are [`Dwarf::tight`]).
    refused: HashMap<u64, UnitSkip>,
    /// Units that did not fit in this lookup, and why (over the cap, or deferred).
    over: HashMap<u64, UnitSkip>,
    /// Units asked for that did not fit under the cap, with what was held when they were
    /// tried: tried again only once less is held. A try scans the whole unit (megabytes
    /// for a big one) before its references take it over, which repeated at every lookup
    /// that asks for it cost more than every unit that loads.
    tight: HashMap<u64, u64>,
    /// addr2line's context over every section, when they were read whole.
    ctx: Option<addr2line::Context<Sparse>>,
    /// addr2line's context per unit asked for, over that unit and the units it refers to:
    /// loading another unit leaves what each parsed (its line rows and functions) alone.
    groups: HashMap<u64, addr2line::Context<Sparse>>,
    /// The units each loaded unit refers to (for names of functions inlined across units).
    refs: HashMap<u64, Vec<u64>>,
    /// Estimate of what addr2line parsed of the units loaded.
    parsed: u64,
    /// Where every unit starts, read once the first time a unit refers to another.
    starts: Option<Vec<u64>>,
    max_bytes: u64,
}

impl Dwarf {
    /// Opens the DWARF of `elf`: reads `.debug_aranges` only, when it has one and its
    /// sections are not compressed; else every section whole (at most `max_bytes`).
    pub fn open<R: ReadAt + ?Sized>(
        elf: &mut ElfReader<'_, R>,
        max_bytes: u64,
    ) -> Result<Dwarf, DwarfError> {
        let names: Vec<&[u8]> = elf.sections().iter().map(|s| elf.section_name(s)).collect();
        let info = names.iter().position(|n| *n == b".debug_info");
        let zdebug = names.iter().any(|n| n.starts_with(b".zdebug_"));
        match info {
            Some(i) if elf.sections()[i].kind != object::elf::SHT_NOBITS => {}
            _ if zdebug => return Err(DwarfError::Compressed),
            _ => return Err(DwarfError::NoDwarf),
        }
        let endian = if elf.little_endian() {
            RunTimeEndian::Little
        } else {
            RunTimeEndian::Big
        };
        let mut compressed = false;
        let sections: Vec<load::Section> = WANTED
            .iter()
            .map(|&id| {
                let index = names.iter().position(|n| *n == id.name().as_bytes());
                let header = index.and_then(|i| elf.sections().get(i));
                compressed |=
                    header.is_some_and(|h| h.flags & u64::from(object::elf::SHF_COMPRESSED) != 0);
                load::Section {
                    id,
                    index,
                    spans: Spans::new(header.map_or(0, |h| h.size)),
                }
            })
            .collect();
        let mut dwarf = Dwarf {
            endian,
            sections,
            index: None,
            units: Vec::new(),
            refused: HashMap::new(),
            over: Default::default(),
            tight: HashMap::new(),
            ctx: None,
            groups: HashMap::new(),
            refs: HashMap::new(),
            parsed: 0,
            starts: None,
            max_bytes,
        };
        let aranges = names.iter().position(|n| *n == b".debug_aranges");
        if let (Some(i), false) = (aranges, compressed) {
            let index = dwarf.read_aranges(elf, i)?;
            if !index.is_empty() {
                dwarf.index = Some(index);
                return Ok(dwarf);
            }
        }
        dwarf.read_whole(elf)?;
        Ok(dwarf)
    }

    /// The ranges of `.debug_aranges`, sorted, neighbours of one unit merged.
    fn read_aranges<R: ReadAt + ?Sized>(
        &self,
        elf: &mut ElfReader<'_, R>,
        i: usize,
    ) -> Result<Vec<Arange>, DwarfError> {
        let size = elf.sections().get(i).map_or(0, |s| s.size);
        if size > self.max_bytes / 2 {
            return Err(DwarfError::OverCap);
        }
        let data = elf.section_data(i)?;
        let aranges = gimli::DebugAranges::new(&data, self.endian);
        let mut out = Vec::new();
        let mut headers = aranges.headers();
        while let Some(h) = headers.next()? {
            let unit = h.debug_info_offset().0 as u64;
            let mut entries = h.entries();
            while let Some(e) = entries.next().transpose() {
                // An entry whose range overflows is skipped, as addr2line does.
                let Ok(e) = e else { continue };
                if e.length() > 0 {
                    let r = e.range();
                    out.push(Arange {
                        begin: r.begin,
                        end: r.end,
                        unit,
                    });
                }
            }
            if out.len() as u64 * 24 > self.max_bytes / 2 {
                return Err(DwarfError::OverCap);
            }
        }
        out.sort_unstable_by_key(|a| (a.begin, a.end));
        let mut merged: Vec<Arange> = Vec::with_capacity(out.len());
        for a in out {
            match merged.last_mut() {
                Some(m) if m.unit == a.unit && a.begin <= m.end => m.end = m.end.max(a.end),
                _ => merged.push(a),
            }
        }
        merged.shrink_to_fit();
        Ok(merged)
    }

    /// Reads every section whole and checks the depth of every unit.
    fn read_whole<R: ReadAt + ?Sized>(
        &mut self,
        elf: &mut ElfReader<'_, R>,
    ) -> Result<(), DwarfError> {
        let mut total = 0u64;
        for s in &mut self.sections {
            let Some(i) = s.index else { continue };
            let data = elf.section_data(i)?;
            total += data.len() as u64;
            // Charged as a unit is: its bytes and what addr2line will parse of them.
            if total.saturating_mul(1 + PARSED_PER_BYTE) > self.max_bytes {
                return Err(DwarfError::OverCap);
            }
            s.spans = Spans::new(data.len() as u64);
            s.spans.insert(0, data);
        }
        let dwarf = self.gimli(None);
        check_depth(&dwarf)?;
        self.parsed = total.saturating_mul(PARSED_PER_BYTE);
        self.ctx = Some(addr2line::Context::from_dwarf(dwarf)?);
        Ok(())
    }

    /// gimli's view of the sections loaded; `.debug_info` replaced by `info` if given.
    fn gimli(&self, info: Option<Spans>) -> gimli::Dwarf<Sparse> {
        let mut info = info.map(Arc::new);
        let section = |id: SectionId| -> Arc<Spans> {
            if id == SectionId::DebugInfo {
                if let Some(i) = &info {
                    return i.clone();
                }
            }
            // addr2line is given no `.debug_aranges`: ember's own index picked the units,
            // and their root DIEs say what they cover.
            if id == SectionId::DebugAranges && self.index.is_some() {
                return Arc::default();
            }
            Arc::new(
                self.sections
                    .iter()
                    .find(|s| s.id == id)
                    .map(|s| s.spans.clone())
                    .unwrap_or_default(),
            )
        };
        let loaded = gimli::Dwarf::load(|id| {
            Ok::<_, std::convert::Infallible>(Sparse::new(section(id), self.endian))
        });
        info.take();
        match loaded {
            Ok(d) => d,
            Err(never) => match never {},
        }
    }

    /// Bytes held: the sections' bytes loaded, the unit index, and an estimate of what
    /// addr2line parsed of them.
    pub fn bytes(&self) -> u64 {
        let spans: u64 = self.sections.iter().map(|s| s.spans.bytes()).sum();
        let index = self.index.as_ref().map_or(0, |i| i.capacity() as u64 * 24);
        let starts = self.starts.as_ref().map_or(0, |s| s.capacity() as u64 * 8);
        let tight = self.tight.capacity() as u64 * 16;
        spans + index + starts + tight + self.parsed
    }

    /// The unit covering `addr`, by the index.
    fn unit_of(index: &[Arange], addr: u64) -> Option<u64> {
        let i = index.partition_point(|a| a.begin <= addr);
        let a = index.get(i.checked_sub(1)?)?;
        (addr < a.end).then_some(a.unit)
    }

    /// Calls `f(i, chain)` for each `addrs[i]` (an address as the object's symbols give
    /// them): its chain innermost first, empty when no unit loaded covers it. Loads from
    /// `elf` (the file [`Dwarf::open`] read) the units those addresses fall in that are not
    /// loaded yet, starting a unit only while fewer than `read_budget` bytes were read (so
    /// it can be passed by one unit); units not started are [`Skipped::deferred`]. What
    /// addr2line parsed of units loaded before is kept.
    pub fn lookup<R: ReadAt + ?Sized>(
        &mut self,
        elf: &mut ElfReader<'_, R>,
        addrs: &[u64],
        read_budget: u64,
        mut f: impl FnMut(usize, Vec<InlineFrame>),
    ) -> Result<Looked, DwarfError> {
        let mut looked = Looked::default();
        self.over.clear();
        if self.index.is_some() {
            self.load_units(elf, addrs, read_budget, &mut looked)?;
        }
        for (i, &addr) in addrs.iter().enumerate() {
            if let Some(index) = &self.index {
                let Some(unit) = Self::unit_of(index, addr) else {
                    looked.skipped.no_unit += 1;
                    f(i, Vec::new());
                    continue;
                };
                let why = self.over.get(&unit).or_else(|| self.refused.get(&unit));
                if let Some(why) = why {
                    match why {
                        UnitSkip::OverCap => looked.skipped.over_cap += 1,
                        UnitSkip::Deferred => {
                            looked.skipped.deferred += 1;
                            looked.deferred.push(i);
                        }
                        UnitSkip::TooDeep => looked.skipped.too_deep += 1,
                        UnitSkip::Malformed => looked.skipped.malformed += 1,
                    }
                    f(i, Vec::new());
                    continue;
                }
            }
            let ctx = match self
                .index
                .as_ref()
                .and_then(|index| Self::unit_of(index, addr))
            {
                Some(unit) => self.group(unit),
                None => self.ctx.as_ref(),
            };
            f(i, ctx.map_or_else(Vec::new, |ctx| chain(ctx, addr)));
        }
        Ok(looked)
    }

    /// Loads the units `addrs` fall in that are not loaded (their addr2line contexts are
    /// built when first asked for). When one does not fit, the units
    /// held are let go (once) to make room for this lookup's.
    fn load_units<R: ReadAt + ?Sized>(
        &mut self,
        elf: &mut ElfReader<'_, R>,
        addrs: &[u64],
        read_budget: u64,
        looked: &mut Looked,
    ) -> Result<(), DwarfError> {
        let Some(index) = &self.index else {
            return Ok(());
        };
        let mut wanted: Vec<u64> = addrs
            .iter()
            .filter_map(|&a| Self::unit_of(index, a))
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut loaded = 0usize;
        let mut queue: std::collections::VecDeque<u64> = wanted.iter().copied().collect();
        let mut followed = 0;
        while let Some(u) = queue.pop_front() {
            if self.units.binary_search_by_key(&u, |x| x.0).is_ok() || self.refused.contains_key(&u)
            {
                continue;
            }
            // A unit holding an address asked for waits once the budget is read, but the
            // first of a pass loads whatever its size (under the cap), so a lookup with any
            // budget makes progress. Units it refers to load with it: without them its
            // chains do not resolve.
            let asked = wanted.binary_search(&u).is_ok();
            if self.tight.get(&u).is_some_and(|&held| self.bytes() >= held) {
                self.over.insert(u, UnitSkip::OverCap);
                continue;
            }
            if asked && (read_budget == 0 || (loaded > 0 && looked.bytes_read >= read_budget)) {
                self.over.insert(u, UnitSkip::Deferred);
                continue;
            }
            let held = self.bytes();
            looked.units_tried += 1;
            let result = self.load_one(elf, u);
            let others = self
                .units
                .iter()
                .any(|x| wanted.binary_search(&x.0).is_err());
            // Only a unit holding an address asked for makes room; one followed for the
            // name of a function inlined across units does not.
            if matches!(result, Err(UnitSkip::OverCap)) && !looked.reset && others && asked {
                self.reset();
                looked.reset = true;
                // Units of this lookup loaded before the reset are loaded again.
                return self.load_units(elf, addrs, read_budget, looked);
            }
            match result {
                Ok(unit) => {
                    loaded += usize::from(asked);
                    looked.units_read += 1;
                    looked.bytes_read += unit.bytes;
                    self.parsed = self
                        .parsed
                        .saturating_add(unit.bytes.saturating_mul(PARSED_PER_BYTE));
                    let at = self.units.partition_point(|x| x.0 < u);
                    self.units.insert(at, (u, unit.len));
                    let mut refs = Vec::new();
                    for o in unit.others {
                        let Some(start) = self.unit_containing(elf, o) else {
                            continue;
                        };
                        if start != u && !refs.contains(&start) {
                            refs.push(start);
                        }
                        let known = self.units.binary_search_by_key(&start, |x| x.0).is_ok()
                            || self.refused.contains_key(&start)
                            || queue.contains(&start);
                        if !known && followed < MAX_FOLLOWED {
                            followed += 1;
                            queue.push_back(start);
                        }
                    }
                    self.refs.insert(u, refs);
                }
                Err(why @ (UnitSkip::OverCap | UnitSkip::Deferred)) => {
                    if why == UnitSkip::OverCap && asked {
                        self.tight.insert(u, held);
                    }
                    self.over.insert(u, why);
                }
                Err(why) => {
                    self.refused.insert(u, why);
                }
            }
        }
        Ok(())
    }

    /// The start of the unit holding `.debug_info` offset `at` (unit starts are read from
    /// the file the first time this is asked).
    fn unit_containing<R: ReadAt + ?Sized>(
        &mut self,
        elf: &mut ElfReader<'_, R>,
        at: u64,
    ) -> Option<u64> {
        if let Some(i) = self.units.iter().position(|&(o, l)| o <= at && at < o + l) {
            return self.units.get(i).map(|u| u.0);
        }
        if self.starts.is_none() {
            let mut loader = load::Loader {
                elf,
                sections: &mut self.sections,
                endian: self.endian,
                budget: 0,
            };
            self.starts = Some(loader.unit_starts());
        }
        let starts = self.starts.as_ref()?;
        let i = starts.partition_point(|&s| s <= at);
        starts.get(i.checked_sub(1)?).copied()
    }

    /// Loads one unit within what is left of the cap.
    fn load_one<R: ReadAt + ?Sized>(
        &mut self,
        elf: &mut ElfReader<'_, R>,
        unit: u64,
    ) -> Result<load::Loaded, UnitSkip> {
        // What addr2line will parse of it is charged too.
        let budget = self.max_bytes.saturating_sub(self.bytes()) / (1 + PARSED_PER_BYTE);
        let mut loader = load::Loader {
            elf,
            sections: &mut self.sections,
            endian: self.endian,
            budget,
        };
        loader.unit(unit)
    }

    /// Lets every unit go (the index stays).
    fn reset(&mut self) {
        self.ctx = None;
        self.groups.clear();
        self.refs.clear();
        self.units.clear();
        self.over.clear();
        self.parsed = 0;
        for s in &mut self.sections {
            s.spans = Spans::new(s.spans.size());
        }
    }

    /// addr2line's context for addresses in `unit` (built the first time it is asked for):
    /// over `unit` and, following what each refers to, the loaded units it needs (at most
    /// [`MAX_FOLLOWED`]). `None` when `unit` is not loaded or does not parse.
    fn group(&mut self, unit: u64) -> Option<&addr2line::Context<Sparse>> {
        if !self.groups.contains_key(&unit) {
            let ctx = self.build_group(unit)?;
            self.groups.insert(unit, ctx);
        }
        self.groups.get(&unit)
    }

    /// Builds [`Dwarf::group`]'s context for `unit`.
    fn build_group(&mut self, unit: u64) -> Option<addr2line::Context<Sparse>> {
        let mut members: Vec<(u64, u64)> = Vec::new();
        let mut todo = vec![unit];
        while let Some(u) = todo.pop() {
            if members.len() > MAX_FOLLOWED || members.iter().any(|m| m.0 == u) {
                continue;
            }
            let Ok(i) = self.units.binary_search_by_key(&u, |x| x.0) else {
                continue;
            };
            members.extend(self.units.get(i).copied());
            todo.extend(self.refs.get(&u).into_iter().flatten().copied());
        }
        if !members.iter().any(|m| m.0 == unit) {
            return None;
        }
        members.sort_unstable();
        let real = self
            .sections
            .iter()
            .find(|s| s.id == SectionId::DebugInfo)
            .map(|s| s.spans.clone())
            .unwrap_or_default();
        let (info, left_out) =
            load::info_with_gaps(&real, &members, self.endian == RunTimeEndian::Little);
        if left_out.contains(&unit) {
            self.refused.insert(unit, UnitSkip::Malformed);
            return None;
        }
        let dwarf = self.gimli(Some(info));
        match addr2line::Context::from_dwarf(dwarf) {
            Ok(ctx) => Some(ctx),
            Err(_) => {
                self.refused.insert(unit, UnitSkip::Malformed);
                None
            }
        }
    }

    /// Units loaded.
    pub fn units(&self) -> usize {
        self.units.len()
    }
}

/// The chain of `addr`, innermost first; empty if no unit loaded covers it.
fn chain(ctx: &addr2line::Context<Sparse>, addr: u64) -> Vec<InlineFrame> {
    // addr2line probes `[addr, addr + 1)`, which overflows at the top (a panic where overflow
    // checks are on); no code is there.
    if addr == u64::MAX {
        return Vec::new();
    }
    // A unit that does not parse costs its addresses, not the object's.
    let Ok(mut frames) = ctx.find_frames(addr).skip_all_loads() else {
        return Vec::new();
    };
    let mut chain = Vec::new();
    while let Ok(Some(frame)) = frames.next() {
        if chain.len() == MAX_INLINE_DEPTH {
            break;
        }
        let location = frame.location;
        chain.push(InlineFrame {
            name: frame
                .function
                .and_then(|n| n.name.to_slice().ok().map(|s| cut(&s).to_vec())),
            file: location
                .as_ref()
                .and_then(|l| l.file)
                .map(|p| String::from_utf8_lossy(cut(p.as_bytes())).into_owned()),
            line: location.as_ref().and_then(|l| l.line).unwrap_or(0),
        });
    }
    chain
}

/// At most [`MAX_NAME`] bytes of `b`.
fn cut(b: &[u8]) -> &[u8] {
    &b[..b.len().min(MAX_NAME)]
}

/// Refuses DIE trees nested deeper than [`MAX_DIE_DEPTH`] (addr2line recurses per level of
/// nested inlined subroutines). One pass over `.debug_info`, skipping attributes.
fn check_depth(dwarf: &gimli::Dwarf<Sparse>) -> Result<(), DwarfError> {
    let mut units = dwarf.units();
    while let Some(header) = units.next()? {
        let abbrevs = dwarf.abbreviations(&header)?;
        let mut entries = header.entries_raw(&abbrevs, None)?;
        while !entries.is_empty() {
            if entries.next_depth() > MAX_DIE_DEPTH {
                return Err(DwarfError::TooDeep);
            }
            if let Some(abbrev) = entries.read_abbreviation()? {
                entries.skip_attributes(abbrev.attributes())?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
