//! A compact symbol table of one object: sorted address ranges → interned names.
//!
//! Built once per object from its ELF symbol tables (`.symtab`, from the object or from a
//! separate debug file found by build id, and `.dynsym`), then shared by every process that
//! maps the object until the byte budget evicts it. Lookups follow the rules the old
//! blazesym path used, so names do not change: `.symtab` first, where a symbol of unknown
//! size covers the addresses up to the next one; then `.dynsym`, where such a symbol
//! names only its exact address; among symbols at one address the largest wins.
//!
//! Names are stored as the file has them (mangled), packed ([`PackedNames`]: a Rust
//! binary's 2.9 MB of names in 1.0 MB); the caller demangles the few it shows.
//! Pure over [`ElfReader`], so the fuzz target builds tables from arbitrary bytes.

use crate::normalize::elf_file::{offset_to_vaddr, ElfError, ElfReader, ReadAt, Segment};
use crate::symbolize::packed::PackedNames;

use object::elf::{SHT_DYNSYM, SHT_SYMTAB};

/// One named range: start address, size (0: unknown) and, while the table is built, the
/// name's offset among the builder's names (a built table names entries by position).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    start: u64,
    size: u32,
    name: u32,
}

/// Most function symbols one table keeps (a huge C++ binary has a few million).
const MAX_ENTRIES: usize = 4 << 20;

/// Symbols of one object, ready for lookups by file offset.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SymTable {
    /// `PT_LOAD` segments of the object (file offset → address).
    segments: Vec<Segment>,
    /// `.symtab` entries, by start.
    full: Vec<Entry>,
    /// `.dynsym` entries, by start.
    dynamic: Vec<Entry>,
    /// The name of `full[i]` at index `i`, of `dynamic[j]` at `full.len() + j`.
    names: PackedNames,
}

/// Why a lookup found no name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// The offset is in no loadable segment.
    InvalidFileOffset,
    /// The object has no symbols at all.
    MissingSyms,
    /// No symbol covers the address.
    UnknownAddr,
}

/// Builds tables, holding the names of the object's symbol tables until they are packed.
/// Not interned: a map of names cost twice their bytes again at build time (a 150 MB
/// library holds 20 MB of names), and packing makes repeats cheap anyway.
struct Builder {
    names: Vec<u8>,
    truncated: bool,
}

impl Builder {
    fn push_name(&mut self, name: &[u8]) -> Option<u32> {
        let at = u32::try_from(self.names.len()).ok()?;
        // Names stay under 4 GiB in total; the caps keep them far below.
        u32::try_from(self.names.len() + name.len() + 1).ok()?;
        self.names.extend_from_slice(name);
        self.names.push(0);
        Some(at)
    }

    /// The function symbols of table `kind` of `elf`, sorted and one per start address.
    fn table<R: ReadAt + ?Sized>(
        &mut self,
        elf: &mut ElfReader<'_, R>,
        kind: u32,
    ) -> Result<Vec<Entry>, ElfError> {
        let mut raw: Vec<(u64, u64, bool, u32)> = Vec::new();
        let mut full = false;
        elf.function_symbols(kind, |s| {
            if raw.len() >= MAX_ENTRIES {
                full = true;
                return;
            }
            if let Some(name) = self.push_name(s.name) {
                raw.push((s.addr, s.size, s.global, name));
            }
        })?;
        self.truncated |= full;
        // By start; at one start the largest first, then globals, then by name, so the
        // choice among aliases does not depend on the order in the file.
        raw.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0)
                .then(b.1.cmp(&a.1))
                .then(b.2.cmp(&a.2))
                .then_with(|| self.name(a.3).cmp(self.name(b.3)))
        });
        raw.dedup_by_key(|e| e.0);
        Ok(raw
            .into_iter()
            .map(|(start, size, _, name)| Entry {
                start,
                size: u32::try_from(size).unwrap_or(u32::MAX),
                name,
            })
            .collect())
    }

    fn name(&self, at: u32) -> &[u8] {
        name_at(&self.names, at)
    }
}

fn name_at(names: &[u8], at: u32) -> &[u8] {
    let rest = names.get(at as usize..).unwrap_or_default();
    &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())]
}

impl SymTable {
    /// Builds the table of `object`; `debug` is a separate debug file (found by build id)
    /// whose `.symtab` replaces the object's own when it has none. `truncated` tells whether
    /// a table hit [`MAX_ENTRIES`].
    pub fn build<R: ReadAt + ?Sized, D: ReadAt + ?Sized>(
        object: &mut ElfReader<'_, R>,
        debug: Option<&mut ElfReader<'_, D>>,
    ) -> Result<(SymTable, bool), ElfError> {
        let mut b = Builder {
            names: Vec::new(),
            truncated: false,
        };
        let mut full = b.table(object, SHT_SYMTAB)?;
        if full.is_empty() {
            if let Some(debug) = debug {
                // A broken debug file costs its names, not the object's own.
                full = b.table(debug, SHT_SYMTAB).unwrap_or_default();
            }
        }
        let dynamic = b.table(object, SHT_DYNSYM)?;
        let names = PackedNames::new(full.iter().chain(&dynamic).map(|e| b.name(e.name)));
        let mut t = SymTable {
            segments: object.segments().to_vec(),
            full,
            dynamic,
            names,
        };
        t.full.shrink_to_fit();
        t.dynamic.shrink_to_fit();
        Ok((t, b.truncated))
    }

    /// Heap bytes the table holds (what the cache budget counts).
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.segments.capacity() * std::mem::size_of::<Segment>()
            + (self.full.capacity() + self.dynamic.capacity()) * std::mem::size_of::<Entry>()
            + self.names.bytes()
    }

    /// Function symbols held.
    pub fn len(&self) -> usize {
        self.full.len() + self.dynamic.len()
    }

    /// Whether the table holds no symbol.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The (mangled) name of the function at file offset `offset`.
    pub fn lookup(&self, offset: u64) -> Result<Vec<u8>, Miss> {
        if self.is_empty() {
            return Err(Miss::MissingSyms);
        }
        let addr = offset_to_vaddr(&self.segments, offset).ok_or(Miss::InvalidFileOffset)?;
        let i = find(&self.full, addr, true)
            .or_else(|| find(&self.dynamic, addr, false).map(|j| self.full.len() + j))
            .ok_or(Miss::UnknownAddr)?;
        // Names past the packing's cap are missing, as if the symbol were.
        self.names.get(i).ok_or(Miss::UnknownAddr)
    }
}

/// The index of the entry covering `addr`: the last one starting at or before it, if its
/// size covers `addr` (or, `sizeless_extends`, if its size is unknown).
fn find(entries: &[Entry], addr: u64, sizeless_extends: bool) -> Option<usize> {
    let i = entries
        .partition_point(|e| e.start <= addr)
        .checked_sub(1)?;
    let e = entries.get(i)?;
    let hit = if e.size == 0 {
        sizeless_extends || addr == e.start
    } else {
        addr - e.start < u64::from(e.size)
    };
    hit.then_some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(start: u64, size: u32, name: u32) -> Entry {
        Entry { start, size, name }
    }

    #[test]
    fn find_follows_sizes() {
        let e = [entry(0x100, 0x10, 0), entry(0x200, 0, 1)];
        assert_eq!(find(&e, 0x100, true), Some(0));
        assert_eq!(find(&e, 0x10f, true), Some(0));
        assert_eq!(find(&e, 0x110, true), None);
        assert_eq!(find(&e, 0xff, true), None);
        // Sizeless: extends in .symtab, exact in .dynsym.
        assert_eq!(find(&e, 0x250, true), Some(1));
        assert_eq!(find(&e, 0x250, false), None);
        assert_eq!(find(&e, 0x200, false), Some(1));
    }

    #[test]
    fn names_own_functions_like_the_symbol_table_says() {
        let exe = std::fs::read("/proc/self/exe").expect("read exe");
        let mut elf =
            ElfReader::new(&exe[..], crate::normalize::elf_file::DEFAULT_LIMITS).expect("parse");
        let (t, truncated) = SymTable::build::<[u8], [u8]>(&mut elf, None).expect("build");
        assert!(!truncated);
        assert!(t.len() > 1000, "{} symbols", t.len());
        assert!(t.bytes() > t.len() * std::mem::size_of::<Entry>());
        // Packed: well under the names themselves.
        let plain: usize = (0..t.len())
            .filter_map(|i| t.names.get(i))
            .map(|n| n.len() + 1)
            .sum();
        assert!(
            t.names.bytes() < plain / 2,
            "{} of {plain}",
            t.names.bytes()
        );
        eprintln!(
            "{} symbols: {plain} bytes of names packed in {}",
            t.len(),
            t.names.bytes()
        );
        assert_eq!(t.lookup(u64::MAX >> 4), Err(Miss::InvalidFileOffset));
        assert_eq!(SymTable::default().lookup(0), Err(Miss::MissingSyms));
    }
}
