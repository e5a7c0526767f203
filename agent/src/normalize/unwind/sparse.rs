//! An object read for its unwind table only, so that building the table of a 150 MB
//! binary does not cost 150 MB: the ELF header, the program and section headers, the
//! section names and the call frame sections are read (`pread`) to their file offsets in a
//! buffer as long as the file, whose other pages are never touched and so never become
//! resident; the few code bytes the compiler looks at (the padding between two functions)
//! are read when it asks ([`CodeReader`]).
//!
//! The table's key is the SHA-256 of what was read (each range's offset, length and bytes):
//! the inputs of the table, not the forgeable build id. The padding bytes read later are
//! not in it: a file rewritten in between can only change whether a gap between two FDEs
//! is taken for padding (never executed) or gets a row of its own.

use std::fs::File;
use std::os::unix::fs::FileExt;

use object::elf::{FileHeader64, SHT_NOBITS};
use object::read::elf::{FileHeader, SectionHeader};
use object::LittleEndian;
use ring::digest::{Context, SHA256};

use super::store::TableKey;

/// Sections the compiler reads (the others are only named).
const CFI_SECTIONS: [&[u8]; 2] = [b".eh_frame", b".debug_frame"];
/// An object with more section headers than this is read no further than its headers
/// (the compiler then finds no CFI): real ones have a few dozen.
const MAX_SECTIONS: u64 = 1 << 16;

/// An object's headers and call frame sections at their offsets.
pub struct Sparse {
    /// As long as the file; zero where nothing was read.
    pub bytes: Vec<u8>,
    key: Context,
    /// Bytes actually read.
    pub read: u64,
}

impl Sparse {
    /// Reads what the table compiler needs of `file`, `len` bytes long. A file that is not
    /// an ELF object is read no further than its first 64 bytes (the compiler then says so).
    pub fn read(file: &File, len: u64) -> std::io::Result<Self> {
        let size = usize::try_from(len).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        // Zeroed by the allocator's fresh mapping: pages never written cost nothing.
        let mut s = Sparse {
            bytes: vec![0u8; size],
            key: Context::new(&SHA256),
            read: 0,
        };
        s.fill(file, 0, 64)?;
        let endian = LittleEndian;
        let Ok(&header) = FileHeader64::<LittleEndian>::parse(&s.bytes[..]) else {
            return Ok(s);
        };
        let phdrs = u64::from(header.e_phnum(endian)) * u64::from(header.e_phentsize(endian));
        s.fill(file, header.e_phoff(endian), phdrs)?;
        let shentsize = u64::from(header.e_shentsize(endian)).max(1);
        // Section 0 holds the real count and string table index when they overflow 16 bits.
        s.fill(file, header.e_shoff(endian), shentsize)?;
        let count = match header.shnum(endian, &s.bytes[..]) {
            Ok(n) => (n as u64).min(MAX_SECTIONS),
            Err(_) => return Ok(s),
        };
        s.fill(file, header.e_shoff(endian), count * shentsize)?;
        let strings = header
            .sections(endian, &s.bytes[..])
            .ok()
            .and_then(|table| {
                let i = header.shstrndx(endian, &s.bytes[..]).ok()?;
                let h = table.section(object::SectionIndex(i as usize)).ok()?;
                Some((h.sh_offset(endian), h.sh_size(endian)))
            });
        if let Some((offset, size)) = strings {
            s.fill(file, offset, size)?;
        }
        let wanted: Vec<(u64, u64)> = match header.sections(endian, &s.bytes[..]) {
            Ok(table) => CFI_SECTIONS
                .iter()
                .filter_map(|name| table.section_by_name(endian, name))
                .filter(|(_, h)| h.sh_type(endian) != SHT_NOBITS)
                .map(|(_, h)| (h.sh_offset(endian), h.sh_size(endian)))
                .collect(),
            Err(_) => return Ok(s),
        };
        for (offset, size) in wanted {
            s.fill(file, offset, size)?;
        }
        Ok(s)
    }

    /// Reads `[offset, offset + len)` (clipped to the file) into place and into the key.
    fn fill(&mut self, file: &File, offset: u64, len: u64) -> std::io::Result<()> {
        let total = self.bytes.len() as u64;
        let start = offset.min(total);
        let end = offset.saturating_add(len).min(total);
        if end <= start {
            return Ok(());
        }
        // Both fit in usize: they are at most the buffer's length.
        let (from, to) = (start as usize, end as usize);
        file.read_exact_at(&mut self.bytes[from..to], start)?;
        self.key.update(&start.to_le_bytes());
        self.key.update(&(end - start).to_le_bytes());
        self.key.update(&self.bytes[from..to]);
        self.read += end - start;
        Ok(())
    }

    /// The table key: SHA-256 of every range read, in order.
    pub fn key(&self) -> TableKey {
        let d = self.key.clone().finish();
        let mut k = [0u8; 16];
        k.copy_from_slice(&d.as_ref()[..16]);
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libc's table from the sparse read equals the one from all its bytes, and the read
    /// is a small part of the file.
    #[test]
    fn sparse_read_compiles_the_same_table() {
        let path = "/lib/x86_64-linux-gnu/libc.so.6";
        let file = File::open(path).expect("libc");
        let len = file.metadata().expect("stat").len();
        let sparse = Sparse::read(&file, len).expect("sparse read");
        let whole = std::fs::read(path).expect("libc");
        let limits = super::super::DEFAULT_LIMITS;
        let a = super::super::compile::compile_with(&sparse.bytes, Some(&file), &limits)
            .expect("sparse compile");
        let b = super::super::compile(&whole, &limits).expect("compile");
        assert_eq!(a.rows, b.rows);
        assert_eq!(a.pages, b.pages);
        assert!(sparse.read * 4 < len, "read {} of {len} bytes", sparse.read);
        // The same file gives the same key; a different object another.
        let again = Sparse::read(&file, len).expect("again");
        assert_eq!(sparse.key(), again.key());
        let other = File::open("/proc/self/exe").expect("self");
        let olen = other.metadata().expect("stat").len();
        assert_ne!(
            Sparse::read(&other, olen).expect("self").key(),
            sparse.key()
        );
    }

    /// Not an ELF, or headers pointing past the end: read no further, no error.
    #[test]
    fn junk_is_read_no_further() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("junk");
        let mut bytes = vec![0x41u8; 4096];
        bytes[..4].copy_from_slice(b"\x7fELF");
        std::fs::write(&p, &bytes).expect("write");
        let f = File::open(&p).expect("open");
        let s = Sparse::read(&f, 4096).expect("read");
        assert!(s.read <= 64 + 4096);
    }
}
