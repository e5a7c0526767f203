//! An object read for its unwind table only, so that building the table of a 150 MB
//! binary does not cost 150 MB: the ELF header, the program and section headers, the
//! section names and the call frame sections are read (`pread`), each into a buffer of its
//! own sized by what was read, never one as long as the file; the compiler reads them by
//! file offset through [`Bytes::Pieces`]. The few code bytes the compiler looks at (the
//! padding between two functions) are read when it asks ([`super::elf::CodeReader`]).
//!
//! The headers are read by ember's one capped ELF reader ([`ElfReader::keeping`]), which
//! keeps the ranges it read for the compiler. Every size comes from the file's own headers,
//! so each is capped before anything is allocated: the program and section headers by
//! [`MAX_SEGMENTS`] and [`MAX_SECTIONS`], the section names at [`MAX_NAMES_BYTES`], the
//! CFI sections together at [`super::Limits::max_cfi_bytes`]; an object over a cap is
//! refused (counted) before that part is read. A sparse 1,000 MiB file whose `.eh_frame`
//! claimed all of it once took the agent to 1 GB.
//!
//! The table's key is the SHA-256 of what was read (each range's offset, length and bytes,
//! in the order read): the inputs of the table, not the forgeable build id. The padding bytes
//! read later are not in it: a file rewritten in between can only change whether a gap
//! between two FDEs is taken for padding (never executed) or gets a row of its own.

use object::elf::SHT_NOBITS;
use ring::digest::{Context, SHA256};

use super::elf::Bytes;
use super::error::UnwindError;
use super::TableKey;
use crate::elf_file::{ElfError, ElfReader, Limits, ReadAt, MAX_SECTIONS, MAX_SEGMENTS};

/// Sections the compiler reads (the others are only named).
const CFI_SECTIONS: [&[u8]; 2] = [b".eh_frame", b".debug_frame"];
/// Most bytes of section names read: real ones are a few hundred bytes.
pub const MAX_NAMES_BYTES: u64 = 1 << 20;
/// Most bytes of headers and names read: the ELF header, the program and section headers
/// under [`ElfReader`]'s caps and [`MAX_NAMES_BYTES`] of names.
/// About 5.3 MiB; what one object can hold at once is this plus its CFI cap.
pub const MAX_HEADER_BYTES: u64 = 64 + MAX_SEGMENTS * 56 + 64 + MAX_SECTIONS * 64 + MAX_NAMES_BYTES;

/// Why a sparse read gave nothing to compile.
#[derive(Debug, thiserror::Error)]
pub enum SparseError {
    /// The headers could not be read ([`ElfError`]: malformed, short, or over their caps).
    #[error("ELF headers: {0}")]
    Elf(ElfError),
    /// The call frame sections are over their cap ([`UnwindError::SectionTooLarge`]).
    #[error("{0}")]
    Refused(UnwindError),
}

/// An object's headers and call frame sections, each in its own buffer.
pub struct Sparse {
    /// The file's length.
    len: u64,
    /// What was read: (file offset, bytes), in the order read.
    pieces: Vec<(u64, Vec<u8>)>,
    /// Bytes actually read (and held).
    pub read: u64,
}

impl Sparse {
    /// Reads what the table compiler needs of `src` through the one capped ELF reader
    /// ([`ElfReader::keeping`]), holding at most `max_cfi` bytes of CFI besides
    /// [`MAX_HEADER_BYTES`] of headers.
    pub fn read<S: ReadAt + ?Sized>(src: &S, max_cfi: u64) -> Result<Self, SparseError> {
        let len = src.size();
        let limits = Limits {
            max_read_bytes: MAX_HEADER_BYTES.saturating_add(max_cfi),
            // What ElfReader reads as a whole section here: the section names.
            max_section_bytes: MAX_NAMES_BYTES,
        };
        let mut elf = ElfReader::keeping(src, limits).map_err(SparseError::Elf)?;
        let clip = |offset: u64, size: u64| offset.saturating_add(size).min(len) - offset.min(len);
        let wanted: Vec<(u64, u64)> = CFI_SECTIONS
            .iter()
            .filter_map(|name| elf.find_section(name))
            .map(|i| elf.sections()[i])
            .filter(|s| s.kind != SHT_NOBITS)
            // A section claiming more than the file is read as far as the file goes, and
            // the compiler finds it does not fit.
            .map(|s| (s.offset, clip(s.offset, s.size)))
            .collect();
        // Checked before any is read: both sections, as much as the file holds of them.
        let cfi = wanted
            .iter()
            .fold(0u64, |sum, &(_, n)| sum.saturating_add(n));
        if cfi > max_cfi {
            return Err(SparseError::Refused(UnwindError::SectionTooLarge {
                what: "call frame information",
                bytes: cfi,
                max: max_cfi,
            }));
        }
        for (offset, size) in wanted.into_iter().filter(|w| w.1 > 0) {
            elf.keep(offset, size).map_err(SparseError::Elf)?;
        }
        let pieces = elf.into_kept();
        let read = pieces.iter().map(|p| p.1.len() as u64).sum();
        Ok(Sparse { len, pieces, read })
    }

    /// The bytes read, by file offset, for the compiler.
    pub fn bytes(&self) -> Bytes<'_> {
        Bytes::Pieces {
            len: self.len,
            pieces: &self.pieces,
        }
    }

    /// The table key: SHA-256 of every range read (its offset, length and bytes), in
    /// order: the inputs of the table, not the forgeable build id.
    pub fn key(&self) -> TableKey {
        let mut key = Context::new(&SHA256);
        for (offset, bytes) in &self.pieces {
            key.update(&offset.to_le_bytes());
            key.update(&(bytes.len() as u64).to_le_bytes());
            key.update(bytes);
        }
        let d = key.finish();
        let mut k = [0u8; 16];
        k.copy_from_slice(&d.as_ref()[..16]);
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf_file::FileAt;
    use crate::unwind::{compile, DEFAULT_LIMITS};
    use object::read::elf::{FileHeader, SectionHeader};
    use object::LittleEndian;
    use std::fs::File;

    const MAX_CFI: u64 = DEFAULT_LIMITS.max_cfi_bytes;

    /// libc's table from the sparse read equals the one from all its bytes, and the read
    /// is a small part of the file.
    #[test]
    fn sparse_read_compiles_the_same_table() {
        let path = "/lib/x86_64-linux-gnu/libc.so.6";
        let file = File::open(path).expect("libc");
        let len = file.metadata().expect("stat").len();
        let sparse = Sparse::read(&FileAt::new(&file, len), MAX_CFI).expect("sparse read");
        let whole = std::fs::read(path).expect("libc");
        let limits = DEFAULT_LIMITS;
        let a = super::super::compile::compile_with(sparse.bytes(), Some(&file), &limits)
            .expect("sparse compile");
        let b = compile(&whole, &limits).expect("compile");
        assert_eq!(a.rows, b.rows);
        assert_eq!(a.pages, b.pages);
        assert!(sparse.read * 4 < len, "read {} of {len} bytes", sparse.read);
        // The same file gives the same key; a different object another.
        let again = Sparse::read(&FileAt::new(&file, len), MAX_CFI).expect("again");
        assert_eq!(sparse.key(), again.key());
        let other = File::open("/proc/self/exe").expect("self");
        let olen = other.metadata().expect("stat").len();
        assert_ne!(
            Sparse::read(&FileAt::new(&other, olen), MAX_CFI)
                .expect("self")
                .key(),
            sparse.key()
        );
        // Read by the one ELF reader, in its order: the header, the section headers (then
        // the names), the program headers, then the call frame sections.
        let offsets: Vec<u64> = sparse.pieces.iter().map(|p| p.0).collect();
        let h = object::read::elf::ElfFile64::<LittleEndian>::parse(&whole[..]).expect("elf");
        let hdr = h.elf_header();
        let e = LittleEndian;
        assert_eq!(offsets[..2], [0, hdr.e_shoff(e)], "header, section headers");
        assert!(offsets.contains(&hdr.e_phoff(e)), "program headers read");
        let eh = h
            .elf_section_table()
            .section_by_name(e, b".eh_frame")
            .expect(".eh_frame")
            .1;
        assert_eq!(sparse.pieces.last().map(|p| p.0), Some(eh.sh_offset(e)));
    }

    /// Not an ELF, or headers pointing past the end: the ELF reader's error, nothing kept.
    #[test]
    fn junk_is_refused_by_the_elf_reader() {
        let mut bytes = vec![0x41u8; 4096];
        bytes[..4].copy_from_slice(b"\x7fELF");
        match Sparse::read(&bytes[..], MAX_CFI) {
            Err(SparseError::Elf(ElfError::Malformed(_))) => {}
            other => panic!("{:?}", other.map(|s| s.read)),
        }
    }

    /// A libc image whose section header makes `.eh_frame` start at 0 and run for
    /// `size` bytes (the file "is" `len` bytes: what a sparse file on disk would be).
    fn libc_with_eh_frame(size: u64) -> Vec<u8> {
        let mut bytes = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").expect("libc");
        let file = object::read::elf::ElfFile64::<LittleEndian>::parse(&bytes[..]).expect("elf");
        let e = LittleEndian;
        let shoff = file.elf_header().e_shoff(e) as usize;
        let index = file
            .elf_section_table()
            .section_by_name(e, b".eh_frame")
            .expect(".eh_frame")
            .0
             .0;
        let at = shoff + index * 64;
        bytes[at + 24..at + 32].copy_from_slice(&0u64.to_le_bytes());
        bytes[at + 32..at + 40].copy_from_slice(&size.to_le_bytes());
        bytes
    }

    /// A source `len` bytes long whose bytes past `image` read as zeros: a sparse file.
    struct SparseFile<'a> {
        image: &'a [u8],
        len: u64,
    }

    impl ReadAt for SparseFile<'_> {
        fn size(&self) -> u64 {
            self.len
        }

        fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            if offset.saturating_add(buf.len() as u64) > self.len {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buf.fill(0);
            let from = usize::try_from(offset)
                .unwrap_or(usize::MAX)
                .min(self.image.len());
            let n = (self.image.len() - from).min(buf.len());
            buf[..n].copy_from_slice(&self.image[from..from + n]);
            Ok(())
        }
    }

    /// A 1,000 MiB file whose `.eh_frame` claims all of it: refused before a byte of it is
    /// read (main read all of it into a file-sized buffer: 1 GB resident), with its reason;
    /// just under the cap it is read and held at its own size, and a section claiming more
    /// than the file is read only as far as the file goes.
    #[test]
    fn cfi_over_its_cap_is_refused_before_it_is_read() {
        let len = 1000u64 << 20;
        let image = libc_with_eh_frame(len);
        let src = SparseFile { image: &image, len };
        match Sparse::read(&src, MAX_CFI) {
            Err(SparseError::Refused(e)) => {
                assert_eq!(e.reason(), super::super::ErrorReason::SectionTooLarge);
                assert!(e.to_string().contains("call frame information"), "{e}");
            }
            Err(e) => panic!("{e}"),
            Ok(s) => panic!("read {} bytes", s.read),
        }
        // Just under the cap: read, its buffer no larger than the section.
        let image = libc_with_eh_frame(MAX_CFI - (1 << 20));
        let src = SparseFile { image: &image, len };
        let s = Sparse::read(&src, MAX_CFI).expect("under the cap");
        let held: usize = s.pieces.iter().map(|p| p.1.len()).sum();
        assert!(held as u64 <= MAX_CFI + MAX_HEADER_BYTES, "held {held}");
        assert_eq!(held as u64, s.read);
        // A section past the end of a small file: clipped to the file, and the compiler
        // finds it does not fit.
        let image = libc_with_eh_frame(1 << 40);
        let s = Sparse::read(&image[..], MAX_CFI).expect("clipped");
        assert!(s.read <= 2 * image.len() as u64);
        assert_eq!(
            super::super::compile::compile_with(
                s.bytes(),
                Some(&File::open("/dev/null").expect("null")),
                &DEFAULT_LIMITS
            )
            .map_err(|e| e.reason())
            .err(),
            Some(super::super::ErrorReason::BadElf)
        );
    }

    /// Section headers or names beyond their caps are refused before they are read.
    #[test]
    fn headers_over_their_caps_are_refused() {
        let bytes = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").expect("libc");
        let file = object::read::elf::ElfFile64::<LittleEndian>::parse(&bytes[..]).expect("elf");
        let e = LittleEndian;
        let hdr = *file.elf_header();
        let shoff = hdr.e_shoff(e) as usize;
        let len = 1000u64 << 20;
        // e_shnum 0: the count is section 0's sh_size, here 2^64 - 1.
        let mut many = bytes.clone();
        many[60..62].copy_from_slice(&0u16.to_le_bytes());
        many[shoff + 32..shoff + 40].copy_from_slice(&u64::MAX.to_le_bytes());
        let src = SparseFile { image: &many, len };
        match Sparse::read(&src, MAX_CFI) {
            Err(SparseError::Elf(ElfError::Malformed(why))) => assert_eq!(why, "section count"),
            other => panic!("{:?}", other.map(|s| s.read)),
        }
        // Section names of 900 MiB.
        let mut names = bytes.clone();
        let at = shoff + hdr.e_shstrndx(e) as usize * 64;
        names[at + 24..at + 32].copy_from_slice(&0u64.to_le_bytes());
        names[at + 32..at + 40].copy_from_slice(&(900u64 << 20).to_le_bytes());
        let src = SparseFile { image: &names, len };
        match Sparse::read(&src, MAX_CFI) {
            Err(SparseError::Elf(ElfError::TooLarge)) => {}
            other => panic!("{:?}", other.map(|s| s.read)),
        }
    }
}
