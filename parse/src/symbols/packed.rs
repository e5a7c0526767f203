//! Names held compressed (LZ4), in blocks of [`BLOCK`] in the order they are indexed: a
//! Rust binary's 2.9 MB of mangled names take 1.0 MB, kallsyms' 3 MB 1.2 MB, and a lookup
//! decompresses one block of a few KB. LZ4 rather than deflate: packing kallsyms took 20 ms
//! less (deflate at its fastest level packed 10 % smaller), which `ember record` pays at
//! every start. The symbolizer's frame cache in front of the tables makes lookups rare once
//! the first windows are named.

/// Names per block: larger compresses better, smaller inflates faster.
const BLOCK: usize = 64;

/// Names by index, compressed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PackedNames {
    /// Where block `i` starts in `packed`; the last entry is the end of the last block.
    starts: Vec<u32>,
    /// The blocks: each the names of its indexes, each name ended by a NUL.
    packed: Vec<u8>,
    len: usize,
}

impl PackedNames {
    /// Packs `names` (none may hold a NUL: they are C strings) under indexes 0, 1, ….
    /// Names past 4 GiB of packed bytes are left out (`get` finds none for them).
    pub fn new<'a>(names: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut p = Packer::default();
        for name in names {
            if !p.push(name) {
                break;
            }
        }
        p.finish()
    }

    /// Compresses one block; false once the packed bytes would pass 4 GiB.
    fn push_block(&mut self, plain: &[u8], names: usize) -> bool {
        let Ok(at) = u32::try_from(self.packed.len()) else {
            return false;
        };
        let block = lz4_flex::block::compress_prepend_size(plain);
        if u32::try_from(self.packed.len() + block.len()).is_err() {
            return false;
        }
        self.packed.extend_from_slice(&block);
        self.starts.push(at);
        self.len += names;
        true
    }

    fn finish(mut self) -> Self {
        if let Ok(end) = u32::try_from(self.packed.len()) {
            self.starts.push(end);
        }
        self.starts.shrink_to_fit();
        self.packed.shrink_to_fit();
        self
    }

    /// The name at index `i`.
    pub fn get(&self, i: usize) -> Option<Vec<u8>> {
        if i >= self.len {
            return None;
        }
        let b = i / BLOCK;
        let (from, to) = (*self.starts.get(b)?, *self.starts.get(b + 1)?);
        let plain = lz4_flex::block::decompress_size_prepended(
            self.packed.get(from as usize..to as usize)?,
        )
        .ok()?;
        plain.split(|&c| c == 0).nth(i % BLOCK).map(<[u8]>::to_vec)
    }

    /// Names held.
    pub fn count(&self) -> usize {
        self.len
    }

    /// Heap bytes held.
    pub fn bytes(&self) -> usize {
        self.starts.capacity() * 4 + self.packed.capacity()
    }
}

/// Packs names one at a time (what [`PackedNames::new`] does with an iterator), so a caller
/// can drop what it read names from between batches.
#[derive(Debug, Default)]
pub struct Packer {
    out: PackedNames,
    /// The names of the block being filled, each ended by a NUL.
    plain: Vec<u8>,
    in_block: usize,
    pushed: usize,
    /// Past 4 GiB of packed bytes: nothing more is kept.
    full: bool,
}

impl Packer {
    /// Adds `name` (no NUL inside) at the next index; false (and not kept) once the packed
    /// bytes would pass 4 GiB.
    pub fn push(&mut self, name: &[u8]) -> bool {
        if self.full {
            return false;
        }
        self.plain.extend_from_slice(name);
        self.plain.push(0);
        self.in_block += 1;
        self.pushed += 1;
        if self.in_block == BLOCK {
            self.full = !self.out.push_block(&self.plain, self.in_block);
            self.plain.clear();
            self.in_block = 0;
        }
        !self.full
    }

    /// Names pushed so far: the index the next one gets.
    pub fn len(&self) -> usize {
        self.pushed
    }

    /// Whether no name was pushed yet.
    pub fn is_empty(&self) -> bool {
        self.pushed == 0
    }

    /// The packed names.
    pub fn finish(mut self) -> PackedNames {
        if self.in_block > 0 && !self.full {
            self.out.push_block(&self.plain, self.in_block);
        }
        self.out.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gives_back_every_name_by_index() {
        let names: Vec<Vec<u8>> = (0..1000)
            .map(|i| format!("name_{i}").into_bytes())
            .collect();
        let p = PackedNames::new(names.iter().map(|n| &n[..]));
        assert_eq!(p.count(), 1000);
        for (i, n) in names.iter().enumerate() {
            assert_eq!(p.get(i).as_ref(), Some(n));
        }
        assert_eq!(p.get(1000), None);
        let plain: usize = names.iter().map(|n| n.len() + 1).sum();
        assert!(p.bytes() < plain / 2, "{} of {plain}", p.bytes());
    }

    #[test]
    fn empty_and_partial_blocks() {
        assert_eq!(PackedNames::new([]).get(0), None);
        let p = PackedNames::new([&b"a"[..], b"", b"c"]);
        assert_eq!(p.get(1), Some(Vec::new()));
        assert_eq!(p.get(2), Some(b"c".to_vec()));
    }

    #[test]
    fn a_packer_gives_the_same_names_one_at_a_time() {
        let names: Vec<Vec<u8>> = (0..200).map(|i| format!("f{i}").into_bytes()).collect();
        let mut p = Packer::default();
        assert_eq!(p.len(), 0);
        for n in &names {
            assert!(p.push(n));
        }
        assert_eq!(p.len(), 200);
        assert_eq!(p.finish(), PackedNames::new(names.iter().map(|n| &n[..])));
    }
}
