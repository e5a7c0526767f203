//! An object read for its unwind table only, so that building the table of a 150 MB
//! binary does not cost 150 MB: the ELF header, the program and section headers, the
//! section names and the call frame sections are read (`pread`), each into a buffer of its
//! own sized by what was read, never one as long as the file; the compiler reads them by
//! file offset through [`Bytes::Pieces`]. The few code bytes the compiler looks at (the
//! padding between two functions) are read when it asks ([`super::elf::CodeReader`]).
//!
//! Every size comes from the file's own headers, so each is capped before anything is
//! allocated: the program headers by their 16-bit count (3.5 MiB), the section headers at
//! [`MAX_SECTIONS`] (4 MiB), the section names at [`MAX_NAMES_BYTES`], the CFI sections
//! together at [`super::Limits::max_cfi_bytes`]; an object over a cap is refused
//! ([`UnwindError::SectionTooLarge`], counted) before that part is read. A sparse
//! 1,000 MiB file whose `.eh_frame` claimed all of it once took the agent to 1 GB.
//!
//! The table's key is the SHA-256 of what was read (each range's offset, length and bytes,
//! in the order read): the inputs of the table, not the forgeable build id. The padding bytes
//! read later are not in it: a file rewritten in between can only change whether a gap
//! between two FDEs is taken for padding (never executed) or gets a row of its own.

use std::fs::File;
use std::os::unix::fs::FileExt;

use object::elf::{FileHeader64, SHT_NOBITS};
use object::read::elf::{FileHeader, SectionHeader};
use object::LittleEndian;
use ring::digest::{Context, SHA256};

use super::elf::Bytes;
use super::error::UnwindError;
use super::TableKey;

/// Sections the compiler reads (the others are only named).
const CFI_SECTIONS: [&[u8]; 2] = [b".eh_frame", b".debug_frame"];
/// Most section headers read: real objects have a few dozen (64 bytes each, so 4 MiB).
pub const MAX_SECTIONS: u64 = 1 << 16;
/// Most bytes of section names read: real ones are a few hundred bytes.
pub const MAX_NAMES_BYTES: u64 = 1 << 20;
/// Bytes of one ELF64 program header and section header: the `object` crate refuses an
/// object whose headers say another size, so nothing else is worth reading.
const PHDR_BYTES: u64 = 56;
const SHDR_BYTES: u64 = 64;
/// Most bytes of headers and names read: the ELF header, 65,535 program headers, section 0
/// (as long as the header says a section header is, at most 64 KiB), [`MAX_SECTIONS`]
/// section headers and [`MAX_NAMES_BYTES`] of names. About 8.6 MiB; what one object can
/// hold at once is this plus its CFI cap.
pub const MAX_HEADER_BYTES: u64 =
    64 + 0xffff * PHDR_BYTES + 0xffff + MAX_SECTIONS * SHDR_BYTES + MAX_NAMES_BYTES;

/// Where the bytes come from: a file, or an image in memory (tests, fuzzing).
pub trait Source {
    /// Fills `buf` from `offset`; a short read (the file was truncated) is an error.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

impl Source for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}

impl Source for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let bytes = usize::try_from(offset)
            .ok()
            .and_then(|at| self.get(at..)?.get(..buf.len()))
            .ok_or(std::io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(bytes);
        Ok(())
    }
}

/// Why a sparse read gave nothing to compile.
#[derive(Debug, thiserror::Error)]
pub enum SparseError {
    /// A read failed or came up short.
    #[error("read failed: {0}")]
    Io(#[from] std::io::Error),
    /// A part of the object is over its cap ([`UnwindError::SectionTooLarge`]).
    #[error("{0}")]
    Refused(UnwindError),
}

/// An object's headers and call frame sections, each in its own buffer.
pub struct Sparse {
    /// The file's length.
    len: u64,
    /// What was read: (file offset, bytes), in the order read.
    pieces: Vec<(u64, Vec<u8>)>,
    key: Context,
    /// Bytes actually read (and held).
    pub read: u64,
}

impl Sparse {
    /// Reads what the table compiler needs of `src`, `len` bytes long, holding at most
    /// `max_cfi` bytes of CFI. A file that is not an ELF object is read no further than its
    /// first 64 bytes, and one whose headers the compiler would refuse no further than
    /// them (the compiler then says why).
    pub fn read<S: Source + ?Sized>(src: &S, len: u64, max_cfi: u64) -> Result<Self, SparseError> {
        let mut s = Sparse {
            len,
            pieces: Vec::new(),
            key: Context::new(&SHA256),
            read: 0,
        };
        let endian = LittleEndian;
        s.fill(src, 0, 64)?;
        let Ok(&header) = FileHeader64::<LittleEndian>::parse(s.bytes()) else {
            return Ok(s);
        };
        // A count of 16 bits: at most 3.5 MiB.
        let phnum = u64::from(header.e_phnum(endian));
        if phnum > 0 && u64::from(header.e_phentsize(endian)) != PHDR_BYTES {
            return Ok(s);
        }
        s.fill(src, header.e_phoff(endian), phnum * PHDR_BYTES)?;
        // Section 0 holds the real count and string table index when they overflow 16 bits.
        let shentsize = u64::from(header.e_shentsize(endian)).max(1);
        s.fill(src, header.e_shoff(endian), shentsize)?;
        let count = match header.shnum(endian, s.bytes()) {
            Ok(0) => return Ok(s),
            Ok(n) => n as u64,
            Err(_) => return Ok(s),
        };
        if shentsize != SHDR_BYTES {
            return Ok(s);
        }
        if count > MAX_SECTIONS {
            return Err(refused(
                "section headers",
                count.saturating_mul(SHDR_BYTES),
                MAX_SECTIONS * SHDR_BYTES,
            ));
        }
        s.fill(src, header.e_shoff(endian), count * SHDR_BYTES)?;
        let strings = header.sections(endian, s.bytes()).ok().and_then(|table| {
            let i = header.shstrndx(endian, s.bytes()).ok()?;
            let h = table.section(object::SectionIndex(i as usize)).ok()?;
            Some((h.sh_offset(endian), h.sh_size(endian)))
        });
        if let Some((offset, size)) = strings {
            let size = s.clip(offset, size);
            if size > MAX_NAMES_BYTES {
                return Err(refused("section names", size, MAX_NAMES_BYTES));
            }
            s.fill(src, offset, size)?;
        }
        let wanted: Vec<(u64, u64)> = match header.sections(endian, s.bytes()) {
            Ok(table) => CFI_SECTIONS
                .iter()
                .filter_map(|name| table.section_by_name(endian, name))
                .filter(|(_, h)| h.sh_type(endian) != SHT_NOBITS)
                .map(|(_, h)| {
                    (
                        h.sh_offset(endian),
                        s.clip(h.sh_offset(endian), h.sh_size(endian)),
                    )
                })
                .collect(),
            Err(_) => return Ok(s),
        };
        // Checked before any is read: both sections, as much as the file holds of them.
        let cfi = wanted
            .iter()
            .fold(0u64, |sum, &(_, n)| sum.saturating_add(n));
        if cfi > max_cfi {
            return Err(refused("call frame information", cfi, max_cfi));
        }
        for (offset, size) in wanted {
            s.fill(src, offset, size)?;
        }
        debug_assert!(s.read <= MAX_HEADER_BYTES.saturating_add(max_cfi));
        Ok(s)
    }

    /// The bytes read, by file offset, for the compiler.
    pub fn bytes(&self) -> Bytes<'_> {
        Bytes::Pieces {
            len: self.len,
            pieces: &self.pieces,
        }
    }

    /// How many of `len` bytes from `offset` the file holds.
    fn clip(&self, offset: u64, len: u64) -> u64 {
        let start = offset.min(self.len);
        offset.saturating_add(len).min(self.len) - start
    }

    /// Reads `[offset, offset + len)` (clipped to the file) into a buffer of its own and
    /// into the key. Every caller has capped `len`.
    fn fill<S: Source + ?Sized>(&mut self, src: &S, offset: u64, len: u64) -> std::io::Result<()> {
        let n = self.clip(offset, len);
        if n == 0 {
            return Ok(());
        }
        let size = usize::try_from(n).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        let mut buf = vec![0u8; size];
        src.read_exact_at(&mut buf, offset)?;
        self.key.update(&offset.to_le_bytes());
        self.key.update(&n.to_le_bytes());
        self.key.update(&buf);
        self.read += n;
        self.pieces.push((offset, buf));
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

fn refused(what: &'static str, bytes: u64, max: u64) -> SparseError {
    SparseError::Refused(UnwindError::SectionTooLarge { what, bytes, max })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind::{compile, DEFAULT_LIMITS};

    const MAX_CFI: u64 = DEFAULT_LIMITS.max_cfi_bytes;

    /// libc's table from the sparse read equals the one from all its bytes, and the read
    /// is a small part of the file.
    #[test]
    fn sparse_read_compiles_the_same_table() {
        let path = "/lib/x86_64-linux-gnu/libc.so.6";
        let file = File::open(path).expect("libc");
        let len = file.metadata().expect("stat").len();
        let sparse = Sparse::read(&file, len, MAX_CFI).expect("sparse read");
        let whole = std::fs::read(path).expect("libc");
        let limits = DEFAULT_LIMITS;
        let a = super::super::compile::compile_with(sparse.bytes(), Some(&file), &limits)
            .expect("sparse compile");
        let b = compile(&whole, &limits).expect("compile");
        assert_eq!(a.rows, b.rows);
        assert_eq!(a.pages, b.pages);
        assert!(sparse.read * 4 < len, "read {} of {len} bytes", sparse.read);
        // The same file gives the same key; a different object another.
        let again = Sparse::read(&file, len, MAX_CFI).expect("again");
        assert_eq!(sparse.key(), again.key());
        let other = File::open("/proc/self/exe").expect("self");
        let olen = other.metadata().expect("stat").len();
        assert_ne!(
            Sparse::read(&other, olen, MAX_CFI).expect("self").key(),
            sparse.key()
        );
        // The key means what it meant when every range was read into one file-sized
        // buffer: the SHA-256 of (offset, length, bytes) of the same ranges, in the same
        // order (tables cached on disk under it stay valid).
        let mut key = Context::new(&SHA256);
        for (offset, bytes) in &sparse.pieces {
            key.update(&offset.to_le_bytes());
            key.update(&(bytes.len() as u64).to_le_bytes());
            key.update(bytes);
        }
        assert_eq!(sparse.key()[..], key.finish().as_ref()[..16]);
        let offsets: Vec<u64> = sparse.pieces.iter().map(|p| p.0).collect();
        let h = object::read::elf::ElfFile64::<LittleEndian>::parse(&whole[..]).expect("elf");
        let hdr = h.elf_header();
        let e = LittleEndian;
        assert_eq!(
            offsets[..4],
            [0, hdr.e_phoff(e), hdr.e_shoff(e), hdr.e_shoff(e)],
            "header, program headers, section 0, section headers"
        );
    }

    /// Not an ELF, or headers pointing past the end: read no further, no error.
    #[test]
    fn junk_is_read_no_further() {
        let mut bytes = vec![0x41u8; 4096];
        bytes[..4].copy_from_slice(b"\x7fELF");
        let s = Sparse::read(&bytes[..], 4096, MAX_CFI).expect("read");
        assert!(s.read <= 64 + 4096);
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

    impl Source for SparseFile<'_> {
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
        match Sparse::read(&src, len, MAX_CFI) {
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
        let s = Sparse::read(&src, len, MAX_CFI).expect("under the cap");
        let held: usize = s.pieces.iter().map(|p| p.1.len()).sum();
        assert!(held as u64 <= MAX_CFI + MAX_HEADER_BYTES, "held {held}");
        assert_eq!(held as u64, s.read);
        // A section past the end of a small file: clipped to the file, and the compiler
        // finds it does not fit.
        let image = libc_with_eh_frame(1 << 40);
        let s = Sparse::read(&image[..], image.len() as u64, MAX_CFI).expect("clipped");
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
        match Sparse::read(&src, len, MAX_CFI) {
            Err(SparseError::Refused(e)) => assert!(e.to_string().contains("section headers")),
            other => panic!("{:?}", other.map(|s| s.read)),
        }
        // Section names of 900 MiB.
        let mut names = bytes.clone();
        let at = shoff + hdr.e_shstrndx(e) as usize * 64;
        names[at + 24..at + 32].copy_from_slice(&0u64.to_le_bytes());
        names[at + 32..at + 40].copy_from_slice(&(900u64 << 20).to_le_bytes());
        let src = SparseFile { image: &names, len };
        match Sparse::read(&src, len, MAX_CFI) {
            Err(SparseError::Refused(e)) => assert!(e.to_string().contains("section names")),
            other => panic!("{:?}", other.map(|s| s.read)),
        }
    }
}
