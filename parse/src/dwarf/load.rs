//! Loading one compilation unit's share of an object's DWARF: the unit's own bytes of
//! `.debug_info`, its abbreviation table, its line program, the strings, range lists,
//! addresses and string offsets its functions and files refer to. Nothing else of the
//! sections is read. Every read is a `pread` through the capped ELF reader, into
//! [`Spans`]; every structure read partially ends at a zero where the span ends.

use std::sync::Arc;

use addr2line::gimli;
use gimli::{AttributeValue, Reader, RunTimeEndian, SectionId};

use super::sparse::{Spans, Sparse};
use super::{MAX_DIE_DEPTH, MAX_NAME};
use crate::elf_file::{ElfReader, ReadAt};

/// Bytes after a string, range list or address referred to that are read with it (a name
/// is cut at [`MAX_NAME`]; a longer list is cut at a zero).
const TAIL: u64 = MAX_NAME as u64 + 1;

/// Offsets closer than this are read in one `pread`.
const GAP: u64 = 4096;

/// The abbreviation table is read in growing pieces up to this (real tables are a few KB).
const MAX_ABBREV: u64 = 4 << 20;

/// Why a unit was not loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitSkip {
    /// Its bytes would take the object over its cap.
    OverCap,
    /// Not started: the lookup had read its budget (the caller's share for now); tried
    /// again later.
    Deferred,
    /// DIEs nested deeper than [`MAX_DIE_DEPTH`].
    TooDeep,
    /// Its header, DIEs or line program do not parse, or a read failed.
    Malformed,
}

impl From<gimli::Error> for UnitSkip {
    fn from(_: gimli::Error) -> Self {
        UnitSkip::Malformed
    }
}

/// Where one DWARF section is in the object, and what of it is loaded.
pub struct Section {
    /// Which section.
    pub id: SectionId,
    /// Its index in the object's section headers (`None`: the object has none).
    pub index: Option<usize>,
    /// The bytes loaded.
    pub spans: Spans,
}

/// What a unit's DIEs refer to in other sections.
#[derive(Default)]
struct Refs {
    strs: Vec<u64>,
    line_strs: Vec<u64>,
    strx: Vec<u64>,
    addrx: Option<u64>,
    ranges: Vec<u64>,
    rnglistx: Vec<u64>,
    stmt_list: Option<u64>,
    str_offsets_base: Option<u64>,
    addr_base: Option<u64>,
    rnglists_base: Option<u64>,
    /// DIEs of other units referred to (`DW_FORM_ref_addr`: where an inlined function's
    /// name is, for a compiler that inlines across units).
    others: Vec<u64>,
}

/// A unit loaded.
pub struct Loaded {
    /// Its length in `.debug_info`.
    pub len: u64,
    /// Bytes read for it.
    pub bytes: u64,
    /// Offsets in `.debug_info` outside it that its DIEs refer to.
    pub others: Vec<u64>,
}

/// Reads the parts of one unit into `sections`, within `budget` bytes more.
pub struct Loader<'a, 'e, R: ReadAt + ?Sized> {
    /// The object (or debug file) the sections are in.
    pub elf: &'a mut ElfReader<'e, R>,
    /// The object's DWARF sections.
    pub sections: &'a mut [Section],
    /// Byte order.
    pub endian: RunTimeEndian,
    /// Bytes this load may add.
    pub budget: u64,
}

impl<R: ReadAt + ?Sized> Loader<'_, '_, R> {
    fn section(&mut self, id: SectionId) -> Option<&mut Section> {
        self.sections.iter_mut().find(|s| s.id == id)
    }

    /// A reader over what is loaded of `id` now.
    fn reader(&self, id: SectionId) -> Sparse {
        let spans = self
            .sections
            .iter()
            .find(|s| s.id == id)
            .map(|s| s.spans.clone())
            .unwrap_or_default();
        Sparse::new(Arc::new(spans), self.endian)
    }

    fn dwarf(&self) -> gimli::Dwarf<Sparse> {
        match gimli::Dwarf::load(|id| Ok::<_, std::convert::Infallible>(self.reader(id))) {
            Ok(d) => d,
            Err(never) => match never {},
        }
    }

    /// Loads `[start, end)` of `id` (what is not loaded yet), charged to the budget.
    fn fetch(&mut self, id: SectionId, start: u64, end: u64) -> Result<u64, UnitSkip> {
        let Some(section) = self.section(id) else {
            return Ok(0);
        };
        let Some(index) = section.index else {
            return Ok(0);
        };
        let missing = section.spans.missing(start, end);
        let want: u64 = missing.iter().map(|(a, b)| b - a).sum();
        if want > self.budget {
            return Err(UnitSkip::OverCap);
        }
        let mut got = Vec::with_capacity(missing.len());
        for (a, b) in missing {
            let data = self
                .elf
                .section_range(index, a, b - a)
                .map_err(|e| match e {
                    crate::elf_file::ElfError::TooLarge => UnitSkip::OverCap,
                    _ => UnitSkip::Malformed,
                })?;
            got.push((a, data));
        }
        self.budget -= want;
        if let Some(section) = self.section(id) {
            for (a, data) in got {
                section.spans.insert(a, data);
            }
        }
        Ok(want)
    }

    /// Loads each offset of `offsets` of `id` with [`TAIL`] bytes after it, nearby ones
    /// together.
    fn fetch_around(&mut self, id: SectionId, mut offsets: Vec<u64>) -> Result<u64, UnitSkip> {
        offsets.sort_unstable();
        offsets.dedup();
        let mut total = 0;
        let mut run: Option<(u64, u64)> = None;
        for o in offsets {
            let end = o.saturating_add(TAIL);
            run = match run {
                Some((a, b)) if o <= b.saturating_add(GAP) => Some((a, b.max(end))),
                Some((a, b)) => {
                    total += self.fetch(id, a, b)?;
                    Some((o, end))
                }
                None => Some((o, end)),
            };
        }
        if let Some((a, b)) = run {
            total += self.fetch(id, a, b)?;
        }
        Ok(total)
    }

    /// The offset of every unit of `.debug_info`, from their headers (one small read each).
    pub fn unit_starts(&mut self) -> Vec<u64> {
        let Some(s) = self.sections.iter().find(|s| s.id == SectionId::DebugInfo) else {
            return Vec::new();
        };
        let (Some(index), size) = (s.index, s.spans.size()) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut at = 0u64;
        while at < size {
            let Ok(head) = self.elf.section_range(index, at, 12) else {
                break;
            };
            let mut r = gimli::EndianSlice::new(&head, self.endian);
            let Ok((len, _)) = r.read_initial_length() else {
                break;
            };
            out.push(at);
            let next = at.saturating_add((head.len() - r.len()) as u64 + len as u64);
            if next <= at {
                break;
            }
            at = next;
        }
        out
    }

    /// Loads the rest of the range list at `offset` of `id` when [`TAIL`] bytes did not
    /// hold it (a unit's own list names every function of it): read in growing pieces
    /// until its end-of-list entry is in bytes loaded, not in zeros past them.
    fn whole_list(&mut self, id: SectionId, offset: u64, addr_size: u64) -> Result<u64, UnitSkip> {
        let mut total = 0;
        let mut piece = TAIL;
        loop {
            let mut r = self.reader(id);
            r.skip(usize::try_from(offset).map_err(|_| UnitSkip::Malformed)?)?;
            let before = r.len();
            if id == SectionId::DebugRanges {
                skip_ranges(&mut r, addr_size)?;
            } else {
                skip_rnglist(&mut r, addr_size)?;
            }
            let end = offset + (before - r.len()) as u64;
            let section = self.sections.iter().find(|s| s.id == id);
            let size = section.map_or(0, |s| s.spans.size());
            if section.is_none_or(|s| s.spans.missing(offset, end).is_empty()) || end >= size {
                return Ok(total);
            }
            piece = piece.saturating_mul(4);
            total += self.fetch(id, offset, offset.saturating_add(piece))?;
        }
    }

    /// The length of the unit or contribution whose initial length is at `offset` of `id`,
    /// the initial length included.
    fn initial_length(&mut self, id: SectionId, offset: u64) -> Result<u64, UnitSkip> {
        self.fetch(id, offset, offset.saturating_add(12))?;
        let mut r = self.reader(id);
        r.skip(usize::try_from(offset).map_err(|_| UnitSkip::Malformed)?)?;
        let before = r.len();
        let (len, _) = r.read_initial_length()?;
        Ok((before - r.len()) as u64 + len as u64)
    }

    /// Loads the unit at `offset` of `.debug_info` and what it refers to; the bytes added.
    /// On an error, what was loaded stays (it is charged) but the unit is not used.
    pub fn unit(&mut self, offset: u64) -> Result<Loaded, UnitSkip> {
        let len = self.initial_length(SectionId::DebugInfo, offset)?;
        let mut total = self.fetch(SectionId::DebugInfo, offset, offset.saturating_add(len))?;
        let info = gimli::DebugInfo::from(self.reader(SectionId::DebugInfo));
        let header = info.header_from_offset(gimli::DebugInfoOffset(
            usize::try_from(offset).map_err(|_| UnitSkip::Malformed)?,
        ))?;
        if header.length_including_self() as u64 != len {
            return Err(UnitSkip::Malformed);
        }
        let abbrev_at = header.debug_abbrev_offset().0 as u64;
        let mut piece = 16 << 10;
        let mut refs = loop {
            total += self.fetch(SectionId::DebugAbbrev, abbrev_at, abbrev_at + piece)?;
            let abbrevs = header.abbreviations(&gimli::DebugAbbrev::from(
                self.reader(SectionId::DebugAbbrev),
            ))?;
            match scan(&header, &abbrevs) {
                // A table cut by the piece's end: read more of it.
                Err(UnitSkip::Malformed) if piece < MAX_ABBREV => piece *= 4,
                other => break other?,
            }
        };
        let end = offset.saturating_add(len);
        let mut others = std::mem::take(&mut refs.others);
        others.retain(|&o| o < offset || o >= end);
        others.sort_unstable();
        others.dedup();
        total += self.refs(&header, refs)?;
        Ok(Loaded {
            len,
            bytes: total,
            others,
        })
    }

    /// Loads what the unit's DIEs refer to.
    fn refs(
        &mut self,
        header: &gimli::UnitHeader<Sparse>,
        mut refs: Refs,
    ) -> Result<u64, UnitSkip> {
        let word = u64::from(header.format().word_size());
        let addr_size = u64::from(header.address_size());
        let mut total = 0;
        if let (Some(base), false) = (refs.str_offsets_base, refs.strx.is_empty()) {
            let max = refs.strx.iter().max().copied().unwrap_or(0);
            let end = base.saturating_add(max.saturating_add(1).saturating_mul(word));
            total += self.fetch(SectionId::DebugStrOffsets, base, end)?;
            let dwarf = self.dwarf();
            for &i in &refs.strx {
                let o = dwarf.debug_str_offsets.get_str_offset(
                    header.format(),
                    gimli::DebugStrOffsetsBase(base as usize),
                    gimli::DebugStrOffsetsIndex(i as usize),
                )?;
                refs.strs.push(o.0 as u64);
            }
        }
        if let (Some(base), Some(max)) = (refs.addr_base, refs.addrx) {
            let end = base.saturating_add(max.saturating_add(1).saturating_mul(addr_size));
            total += self.fetch(SectionId::DebugAddr, base, end)?;
        }
        if let (Some(base), false) = (refs.rnglists_base, refs.rnglistx.is_empty()) {
            let max = refs.rnglistx.iter().max().copied().unwrap_or(0);
            let end = base.saturating_add(max.saturating_add(1).saturating_mul(word));
            total += self.fetch(SectionId::DebugRngLists, base, end)?;
            let dwarf = self.dwarf();
            for &i in &refs.rnglistx {
                let o = dwarf.ranges.get_offset(
                    header.encoding(),
                    gimli::DebugRngListsBase(base as usize),
                    gimli::DebugRngListsIndex(i as usize),
                )?;
                refs.ranges.push(o.0 as u64);
            }
        }
        let ranges = if header.version() >= 5 {
            SectionId::DebugRngLists
        } else {
            SectionId::DebugRanges
        };
        let lists = std::mem::take(&mut refs.ranges);
        total += self.fetch_around(ranges, lists.clone())?;
        for o in lists {
            total += self.whole_list(ranges, o, addr_size)?;
        }
        if let Some(at) = refs.stmt_list {
            let len = self.initial_length(SectionId::DebugLine, at)?;
            total += self.fetch(SectionId::DebugLine, at, at.saturating_add(len))?;
            let line = gimli::DebugLine::from(self.reader(SectionId::DebugLine));
            let program = line.program(
                gimli::DebugLineOffset(at as usize),
                header.address_size(),
                None,
                None,
            )?;
            let h = program.header();
            let paths = h
                .include_directories()
                .iter()
                .cloned()
                .chain(h.file_names().iter().map(|f| f.path_name()));
            for v in paths {
                match v {
                    AttributeValue::DebugStrRef(o) => refs.strs.push(o.0 as u64),
                    AttributeValue::DebugLineStrRef(o) => refs.line_strs.push(o.0 as u64),
                    _ => {}
                }
            }
        }
        total += self.fetch_around(SectionId::DebugStr, refs.strs)?;
        total += self.fetch_around(SectionId::DebugLineStr, refs.line_strs)?;
        Ok(total)
    }
}

/// Reads past one `.debug_ranges` list (pairs of addresses up to a `(0, 0)` pair).
fn skip_ranges(r: &mut Sparse, addr_size: u64) -> Result<(), UnitSkip> {
    let size = u8::try_from(addr_size).map_err(|_| UnitSkip::Malformed)?;
    loop {
        let (a, b) = (r.read_address(size)?, r.read_address(size)?);
        if a == 0 && b == 0 {
            return Ok(());
        }
    }
}

/// Reads past one `.debug_rnglists` list (entries up to `DW_RLE_end_of_list`).
fn skip_rnglist(r: &mut Sparse, addr_size: u64) -> Result<(), UnitSkip> {
    let size = u8::try_from(addr_size).map_err(|_| UnitSkip::Malformed)?;
    loop {
        match r.read_u8()? {
            0 => return Ok(()),
            1 => {
                r.read_uleb128()?;
            }
            2..=4 => {
                r.read_uleb128()?;
                r.read_uleb128()?;
            }
            5 => {
                r.read_address(size)?;
            }
            6 => {
                r.read_address(size)?;
                r.read_address(size)?;
            }
            7 => {
                r.read_address(size)?;
                r.read_uleb128()?;
            }
            _ => return Err(UnitSkip::Malformed),
        }
    }
}

/// Walks the unit's DIEs once: refuses nesting deeper than [`MAX_DIE_DEPTH`] (addr2line
/// recurses per inline level) and collects what the lookup will read elsewhere.
fn scan(
    header: &gimli::UnitHeader<Sparse>,
    abbrevs: &gimli::Abbreviations,
) -> Result<Refs, UnitSkip> {
    let mut refs = Refs::default();
    let mut entries = header.entries_raw(abbrevs, None)?;
    let mut root = true;
    while !entries.is_empty() {
        if entries.next_depth() > MAX_DIE_DEPTH {
            return Err(UnitSkip::TooDeep);
        }
        let Some(abbrev) = entries.read_abbreviation()? else {
            continue;
        };
        let named = matches!(
            abbrev.tag(),
            gimli::DW_TAG_subprogram
                | gimli::DW_TAG_inlined_subroutine
                | gimli::DW_TAG_compile_unit
                | gimli::DW_TAG_partial_unit
                | gimli::DW_TAG_skeleton_unit
        );
        for spec in abbrev.attributes() {
            let attr = entries.read_attribute(*spec)?;
            note(&mut refs, attr.name(), attr.value(), named, root);
        }
        root = false;
    }
    Ok(refs)
}

/// Notes one attribute's reference to another section.
fn note(
    refs: &mut Refs,
    name: gimli::DwAt,
    value: AttributeValue<Sparse>,
    named: bool,
    root: bool,
) {
    let is_name = matches!(
        name,
        gimli::DW_AT_name
            | gimli::DW_AT_linkage_name
            | gimli::DW_AT_MIPS_linkage_name
            | gimli::DW_AT_comp_dir
    );
    match value {
        AttributeValue::DebugStrRef(o) if named && is_name => refs.strs.push(o.0 as u64),
        AttributeValue::DebugLineStrRef(o) if named && is_name => refs.line_strs.push(o.0 as u64),
        AttributeValue::DebugStrOffsetsIndex(i) if named && is_name => refs.strx.push(i.0 as u64),
        AttributeValue::DebugInfoRef(o) if named => refs.others.push(o.0 as u64),
        AttributeValue::DebugAddrIndex(i) => {
            refs.addrx = Some(refs.addrx.unwrap_or(0).max(i.0 as u64))
        }
        AttributeValue::RangeListsRef(o) => refs.ranges.push(o.0 as u64),
        AttributeValue::DebugRngListsIndex(i) => refs.rnglistx.push(i.0 as u64),
        AttributeValue::DebugLineRef(o) if root => refs.stmt_list = Some(o.0 as u64),
        AttributeValue::DebugStrOffsetsBase(b) if root => refs.str_offsets_base = Some(b.0 as u64),
        AttributeValue::DebugAddrBase(b) if root => refs.addr_base = Some(b.0 as u64),
        AttributeValue::DebugRngListsBase(b) if root => refs.rnglists_base = Some(b.0 as u64),
        _ => {}
    }
}

/// The `.debug_info` addr2line is given: the units loaded (offset, length, sorted, not
/// overlapping) at their offsets, and before each a made-up DWARF 4 unit header spanning
/// the gap, whose abbreviation offset no section has, so the gap is skipped as a unit that
/// does not parse. Units a gap too short for a header leaves no room for are left out.
pub fn info_with_gaps(real: &Spans, units: &[(u64, u64)], little: bool) -> (Spans, Vec<u64>) {
    let end = units.last().map_or(0, |&(o, l)| o + l);
    let mut out = Spans::new(end);
    let mut left_out = Vec::new();
    let mut at = 0u64;
    for &(o, l) in units {
        let gap = o.saturating_sub(at);
        if o < at || (gap > 0 && gap < 11) {
            left_out.push(o);
            continue;
        }
        gap_headers(&mut out, at, gap, little);
        real.copy_within(o, o + l, &mut out);
        at = o + l;
    }
    (out, left_out)
}

/// Made-up unit headers covering `[at, at + gap)` (`gap` is 0 or at least 11 bytes).
fn gap_headers(out: &mut Spans, mut at: u64, mut gap: u64, little: bool) {
    while gap > 0 {
        // A header's length field holds at most 0xffff_ffef; longer gaps take several,
        // none shorter than a header.
        let mut piece = gap.min(0xffff_0000);
        if gap - piece > 0 && gap - piece < 11 {
            piece -= 11;
        }
        let len = (piece - 4) as u32;
        let mut h = Vec::with_capacity(11);
        if little {
            h.extend_from_slice(&len.to_le_bytes());
            h.extend_from_slice(&4u16.to_le_bytes());
        } else {
            h.extend_from_slice(&len.to_be_bytes());
            h.extend_from_slice(&4u16.to_be_bytes());
        }
        h.extend_from_slice(&u32::MAX.to_le_bytes());
        h.push(8);
        out.insert(at, h);
        at += piece;
        gap -= piece;
    }
}
