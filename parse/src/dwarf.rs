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

use std::fmt;

use addr2line::gimli;
use gimli::{EndianSlice, RunTimeEndian, SectionId};

use crate::elf_file::{ElfError, ElfReader, ReadAt};

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

/// The DWARF sections of one object, read within its reader's caps.
pub struct Dwarf {
    sections: Vec<(SectionId, Vec<u8>)>,
    little: bool,
}

impl Dwarf {
    /// Reads the DWARF sections of `elf` (charged to its caps).
    pub fn read<R: ReadAt + ?Sized>(elf: &mut ElfReader<'_, R>) -> Result<Dwarf, DwarfError> {
        let names: Vec<&[u8]> = elf.sections().iter().map(|s| elf.section_name(s)).collect();
        let info = names.iter().position(|n| *n == b".debug_info");
        let zdebug = names.iter().any(|n| n.starts_with(b".zdebug_"));
        match info {
            Some(i) if elf.sections()[i].kind != object::elf::SHT_NOBITS => {}
            _ if zdebug => return Err(DwarfError::Compressed),
            _ => return Err(DwarfError::NoDwarf),
        }
        let wanted: Vec<(SectionId, usize)> = WANTED
            .iter()
            .filter_map(|id| {
                let i = names.iter().position(|n| *n == id.name().as_bytes())?;
                Some((*id, i))
            })
            .collect();
        let mut sections = Vec::with_capacity(wanted.len());
        for (id, i) in wanted {
            sections.push((id, elf.section_data(i)?));
        }
        Ok(Dwarf {
            sections,
            little: elf.little_endian(),
        })
    }

    /// Bytes of section data held.
    pub fn bytes(&self) -> u64 {
        self.sections.iter().map(|(_, d)| d.len() as u64).sum()
    }

    fn section(&self, id: SectionId) -> &[u8] {
        self.sections
            .iter()
            .find(|(s, _)| *s == id)
            .map_or(&[][..], |(_, d)| d.as_slice())
    }

    /// Calls `f(i, chain)` for each `addrs[i]` (an address as the object's symbols give
    /// them): its chain innermost first, empty when no unit covers it. Parses only the
    /// units those addresses fall in; everything parsed is dropped on return.
    pub fn lookup(
        &self,
        addrs: &[u64],
        mut f: impl FnMut(usize, Vec<InlineFrame>),
    ) -> Result<(), DwarfError> {
        let endian = if self.little {
            RunTimeEndian::Little
        } else {
            RunTimeEndian::Big
        };
        let dwarf = gimli::Dwarf::load(|id| {
            Ok::<_, DwarfError>(EndianSlice::new(self.section(id), endian))
        })?;
        check_depth(&dwarf)?;
        let ctx = addr2line::Context::from_dwarf(dwarf)?;
        for (i, &addr) in addrs.iter().enumerate() {
            // A unit that does not parse costs its addresses, not the object's.
            let Ok(mut frames) = ctx.find_frames(addr).skip_all_loads() else {
                f(i, Vec::new());
                continue;
            };
            let mut chain = Vec::new();
            while let Ok(Some(frame)) = frames.next() {
                if chain.len() == MAX_INLINE_DEPTH {
                    break;
                }
                let location = frame.location;
                chain.push(InlineFrame {
                    name: frame.function.map(|n| cut(n.name.slice()).to_vec()),
                    file: location
                        .as_ref()
                        .and_then(|l| l.file)
                        .map(|p| String::from_utf8_lossy(cut(p.as_bytes())).into_owned()),
                    line: location.as_ref().and_then(|l| l.line).unwrap_or(0),
                });
            }
            f(i, chain);
        }
        Ok(())
    }
}

/// At most [`MAX_NAME`] bytes of `b`.
fn cut(b: &[u8]) -> &[u8] {
    &b[..b.len().min(MAX_NAME)]
}

/// Refuses DIE trees nested deeper than [`MAX_DIE_DEPTH`] (addr2line recurses per level of
/// nested inlined subroutines). One pass over `.debug_info`, skipping attributes.
fn check_depth(dwarf: &gimli::Dwarf<EndianSlice<'_, RunTimeEndian>>) -> Result<(), DwarfError> {
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
