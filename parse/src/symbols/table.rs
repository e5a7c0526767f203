//! A compact symbol table of one object: sorted address ranges → interned names.
//!
//! Built once per object from its ELF symbol tables (`.symtab`, from the object or from a
//! separate debug file found by build id, and `.dynsym`), then shared by every process that
//! maps the object until the byte budget evicts it. Lookups follow the rules the old
//! blazesym path used, so names do not change: `.symtab` first, where a symbol of unknown
//! size covers the addresses up to the next one; then `.dynsym`, where such a symbol
//! names only its exact address; among symbols at one address the largest wins.
//!
//! Names are stored as the file has them (mangled), at most
//! [`MAX_SYMBOL_NAME`](crate::elf_file::MAX_SYMBOL_NAME) bytes each, interned by
//! their offset in the string table (symbols pointing at one offset share one copy) and
//! packed ([`PackedNames`]: a Rust binary's 2.9 MB of names in 1.0 MB); every byte copied
//! out of a string table is charged to the object's read budget, so a table cannot build
//! more than its caps whatever its symbols point at. The caller demangles the few it shows.
//! Pure over [`ElfReader`], so the fuzz target builds tables from arbitrary bytes.

use super::packed::{PackedNames, Packer};
use crate::elf_file::{offset_to_vaddr, ElfError, ElfReader, ReadAt, Segment};

use object::elf::{SHT_DYNSYM, SHT_SYMTAB};

/// One named range: start address, size (0: unknown) and the index of its name among the
/// table's (interned) names.
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
    /// The names, each once per string-table offset: `Entry::name` indexes them.
    names: PackedNames,
}

/// What building a table left out.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Built {
    /// A symbol table had more than [`MAX_ENTRIES`] function symbols: the rest are left out.
    pub truncated: bool,
    /// Names longer than [`MAX_SYMBOL_NAME`](crate::elf_file::MAX_SYMBOL_NAME)
    /// (or with no NUL before the end of their table), kept cut; each counted once.
    pub names_cut: u64,
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

/// Builds tables: the names of every symbol table read go into one packer as they are
/// interned, so no table's sections outlive its own pass.
#[derive(Default)]
struct Builder {
    names: Packer,
    built: Built,
}

impl Builder {
    /// The function symbols of table `kind` of `elf`, sorted and one per start address;
    /// their names (once per string-table offset) go to the packer, charged to `elf`'s
    /// read budget.
    fn table<R: ReadAt + ?Sized>(
        &mut self,
        elf: &mut ElfReader<'_, R>,
        kind: u32,
    ) -> Result<Vec<Entry>, ElfError> {
        let Some(data) = elf.symbol_data(kind)? else {
            return Ok(Vec::new());
        };
        // Address, size, global, name offset: no name is copied yet.
        let mut raw: Vec<(u64, u64, bool, u32)> = Vec::new();
        let mut full = false;
        data.functions(|s| {
            if raw.len() >= MAX_ENTRIES {
                full = true;
                return;
            }
            raw.push((s.addr, s.size, s.global, s.name_at));
        });
        self.built.truncated |= full;
        let name = |at: u32| data.name(at).map_or(&[][..], |(n, _)| n);
        // By start; at one start the largest first, then globals, then by name, so the
        // choice among aliases does not depend on the order in the file.
        raw.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0)
                .then(b.1.cmp(&a.1))
                .then(b.2.cmp(&a.2))
                .then_with(|| name(a.3).cmp(name(b.3)))
        });
        raw.dedup_by_key(|e| e.0);
        // Interned by offset: each name the kept symbols point at is copied once, in the
        // order of first use by address (neighbours in the code share prefixes, which packs
        // best). `index[i]` is the name of `offsets[i]` once copied.
        let mut offsets: Vec<u32> = raw.iter().map(|e| e.3).collect();
        offsets.sort_unstable();
        offsets.dedup();
        let mut index: Vec<u32> = vec![u32::MAX; offsets.len()];
        let mut entries = Vec::with_capacity(raw.len());
        for (start, size, _, at) in raw {
            let slot = offsets.binary_search(&at).unwrap_or(0);
            if index[slot] == u32::MAX {
                let (n, cut) = data.name(at).unwrap_or_default();
                elf.charge(n.len() as u64 + 1)?;
                self.built.names_cut += u64::from(cut);
                index[slot] = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
                // Past 4 GiB of packed names (the caps keep them far below) the rest are
                // missing, as if the symbols were.
                self.names.push(n);
            }
            entries.push(Entry {
                start,
                size: u32::try_from(size).unwrap_or(u32::MAX),
                name: index[slot],
            });
        }
        Ok(entries)
    }
}

impl SymTable {
    /// Builds the table of `object`; `debug` is a separate debug file (found by build id)
    /// whose `.symtab` replaces the object's own when it has none. [`Built`] tells what was
    /// left out.
    pub fn build<R: ReadAt + ?Sized, D: ReadAt + ?Sized>(
        object: &mut ElfReader<'_, R>,
        debug: Option<&mut ElfReader<'_, D>>,
    ) -> Result<(SymTable, Built), ElfError> {
        let mut b = Builder::default();
        let mut full = b.table(object, SHT_SYMTAB)?;
        if full.is_empty() {
            if let Some(debug) = debug {
                // A broken debug file costs its names, not the object's own.
                full = b.table(debug, SHT_SYMTAB).unwrap_or_default();
            }
        }
        let dynamic = b.table(object, SHT_DYNSYM)?;
        let mut t = SymTable {
            segments: object.segments().to_vec(),
            full,
            dynamic,
            names: b.names.finish(),
        };
        t.full.shrink_to_fit();
        t.dynamic.shrink_to_fit();
        Ok((t, b.built))
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
        let e = find(&self.full, addr, true)
            .map(|i| self.full[i])
            .or_else(|| find(&self.dynamic, addr, false).map(|j| self.dynamic[j]))
            .ok_or(Miss::UnknownAddr)?;
        // Names past the packing's cap are missing, as if the symbol were.
        self.names.get(e.name as usize).ok_or(Miss::UnknownAddr)
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

/// A `.symtab` of function symbols `(name offset, address, size)` (ELF64 little-endian),
/// after the null symbol. For the tests.
#[cfg(any(test, feature = "testing"))]
pub fn test_symtab(syms: impl IntoIterator<Item = (u32, u64, u64)>) -> Vec<u8> {
    let mut out = vec![0u8; 24];
    for (name, addr, size) in syms {
        out.extend_from_slice(&name.to_le_bytes());
        out.push(0x12); // STB_GLOBAL, STT_FUNC
        out.push(0);
        out.extend_from_slice(&1u16.to_le_bytes()); // defined (section 1)
        out.extend_from_slice(&addr.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
    }
    out
}

/// An object (see `elf_builder`) with `.symtab` `symtab` over `.strtab` `strtab`.
#[cfg(any(test, feature = "testing"))]
pub fn test_object(symtab: &[u8], strtab: &[u8]) -> Vec<u8> {
    crate::elf_builder::elf(&crate::elf_builder::Parts {
        symtab,
        strtab,
        dynsym: &[],
        dynstr: &[],
        compressed: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf_file::{Limits, DEFAULT_LIMITS, MAX_SYMBOL_NAME};

    /// A string table of one NUL, then 1 MiB of `A` with no NUL: a name starting at 1 runs
    /// to the end of the table.
    fn unterminated() -> Vec<u8> {
        let mut strtab = vec![0u8];
        strtab.resize(1 + (1 << 20), b'A');
        strtab
    }

    /// 1,000 symbols all naming one unterminated 1 MiB name: the old builder copied the name
    /// per symbol (1 GB for a 1 MB object, and again when packing). Now one copy, cut at
    /// 4 KiB, counted once; the bytes read and built stay within the object's own size.
    #[test]
    fn one_unterminated_name_shared_by_many_symbols_is_copied_once_and_cut() {
        let symtab = test_symtab((0..1000).map(|i| (1, 0x1000 + 16 * i, 16)));
        let object = test_object(&symtab, &unterminated());
        let mut elf = ElfReader::new(&object[..], DEFAULT_LIMITS).expect("parse");
        let (t, built) = SymTable::build::<[u8], [u8]>(&mut elf, None).expect("build");
        println!(
            "{} symbols over a {} byte object: {} bytes held, {} read and built",
            t.len(),
            object.len(),
            t.bytes(),
            elf.used()
        );
        assert_eq!(t.len(), 1000);
        assert_eq!(built.names_cut, 1, "one name, cut once");
        assert_eq!(t.names.count(), 1, "interned by offset");
        assert!(t.bytes() < 64 << 10, "{} bytes held", t.bytes());
        assert!(
            elf.used() < object.len() as u64 + (8 << 10),
            "{} bytes read and built",
            elf.used()
        );
        let name = t.lookup(0x1000 + 16 * 999 + 3).expect("named");
        assert_eq!(name.len(), MAX_SYMBOL_NAME);
        assert!(name.iter().all(|&b| b == b'A'));
    }

    /// Symbols each naming a different offset into one unterminated name: every name is
    /// 4 KiB, and the copies are charged to the read budget: past it the object is refused.
    #[test]
    fn copies_of_distinct_names_are_charged_to_the_read_budget() {
        let n = 10_000u64;
        let symtab = test_symtab((0..n).map(|i| (1 + i as u32 * 50, 0x1000 + 16 * i, 16)));
        let object = test_object(&symtab, &unterminated());
        let small = Limits {
            max_read_bytes: 16 << 20,
            max_section_bytes: 8 << 20,
        };
        let mut elf = ElfReader::new(&object[..], small).expect("parse");
        assert_eq!(
            SymTable::build::<[u8], [u8]>(&mut elf, None),
            Err(ElfError::TooLarge),
            "41 MB of names from a 1.3 MB object"
        );
        assert!(elf.used() <= small.max_read_bytes + MAX_SYMBOL_NAME as u64 + 1);
        // Within a budget that holds them: built, each name cut and counted once.
        let mut elf = ElfReader::new(&object[..], DEFAULT_LIMITS).expect("parse");
        let (t, built) = SymTable::build::<[u8], [u8]>(&mut elf, None).expect("build");
        assert_eq!(built.names_cut, n);
        assert_eq!(t.len() as u64, n);
        assert!(elf.used() <= DEFAULT_LIMITS.max_read_bytes);
        assert_eq!(t.lookup(0x1000).map(|n| n.len()), Ok(MAX_SYMBOL_NAME));
    }

    #[test]
    fn names_are_interned_by_offset_and_kept_apart_otherwise() {
        let strtab = b"\0alpha\0beta\0".to_vec();
        // Two symbols on "alpha", one on "lpha" (a suffix: its own offset), one on "beta".
        let symtab = test_symtab([(1, 0x100, 8), (1, 0x200, 8), (2, 0x300, 8), (7, 0x400, 8)]);
        let object = test_object(&symtab, &strtab);
        let mut elf = ElfReader::new(&object[..], DEFAULT_LIMITS).expect("parse");
        let (t, built) = SymTable::build::<[u8], [u8]>(&mut elf, None).expect("build");
        assert_eq!(built, Built::default());
        assert_eq!(t.names.count(), 3);
        for (addr, name) in [
            (0x100, "alpha"),
            (0x207, "alpha"),
            (0x300, "lpha"),
            (0x404, "beta"),
        ] {
            assert_eq!(t.lookup(addr).as_deref(), Ok(name.as_bytes()), "{addr:#x}");
        }
        assert_eq!(t.lookup(0x208), Err(Miss::UnknownAddr));
    }

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
        let mut elf = ElfReader::new(&exe[..], crate::elf_file::DEFAULT_LIMITS).expect("parse");
        let (t, built) = SymTable::build::<[u8], [u8]>(&mut elf, None).expect("build");
        assert!(!built.truncated);
        // Rust has names over 4 KiB (`drop_in_place` of deep tower types: up to 21 KB):
        // kept cut, each counted.
        assert!(built.names_cut < 100, "{} names cut", built.names_cut);
        assert!(t.len() > 1000, "{} symbols", t.len());
        assert!(t.bytes() > t.len() * std::mem::size_of::<Entry>());
        // Packed: well under the names themselves.
        let plain: usize = (0..t.names.count())
            .filter_map(|i| t.names.get(i))
            .map(|n| n.len() + 1)
            .sum();
        assert!(
            t.names.bytes() < plain / 2,
            "{} of {plain}",
            t.names.bytes()
        );
        eprintln!(
            "{} symbols: {plain} bytes of names packed in {}; {} names cut",
            t.len(),
            t.names.bytes(),
            built.names_cut
        );
        assert_eq!(t.lookup(u64::MAX >> 4), Err(Miss::InvalidFileOffset));
        assert_eq!(SymTable::default().lookup(0), Err(Miss::MissingSyms));
    }
}
