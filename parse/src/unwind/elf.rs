//! The few things the compiler needs from an ELF object: its CFI sections, the bases
//! their pointer encodings may be relative to, and where its code is.
//!
//! The `object` crate reads the headers; every offset and size it returns has been checked
//! against the bytes, so a hostile header costs an error, never a read out of bounds.
//! The bytes are an object's by file offset ([`Bytes`]): all of it, or only the pieces a
//! sparse read took ([`super::sparse`]), each in a buffer of its own; a read outside the
//! pieces is an error, as one past the end of a whole object is.

use std::ops::Range;

use object::elf::{FileHeader64, PF_X, PT_LOAD, SHF_COMPRESSED, SHT_NOBITS};
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader, SectionTable};
use object::{LittleEndian, ReadRef};

use super::error::UnwindError;

/// Reads code bytes for the compiler: `len` bytes at file offset `offset`.
pub trait CodeReader: std::fmt::Debug {
    /// The bytes, or `None` when they cannot be read in full.
    fn read_code(&self, offset: u64, len: usize) -> Option<Vec<u8>>;
}

impl CodeReader for std::fs::File {
    fn read_code(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        std::os::unix::fs::FileExt::read_exact_at(self, &mut buf, offset).ok()?;
        Some(buf)
    }
}

/// An object's bytes by file offset.
#[derive(Debug, Clone, Copy)]
pub enum Bytes<'a> {
    /// The whole object.
    Whole(&'a [u8]),
    /// Ranges of an object `len` bytes long, each `(file offset, bytes)`: what a sparse
    /// read took (headers, section names, CFI sections), never a buffer as long as the file.
    Pieces {
        /// The object's length (what [`Limits::max_object_bytes`](super::Limits) caps).
        len: u64,
        /// The ranges read; a read must fall inside one of them.
        pieces: &'a [(u64, Vec<u8>)],
    },
}

impl<'a> Bytes<'a> {
    /// The object's length in bytes.
    pub fn object_len(self) -> u64 {
        match self {
            Self::Whole(b) => b.len() as u64,
            Self::Pieces { len, .. } => len,
        }
    }

    /// The piece holding all of `[start, end)`, as a slice of exactly that range.
    fn range(self, start: u64, end: u64) -> Option<&'a [u8]> {
        if end < start {
            return None;
        }
        match self {
            Self::Whole(b) => b.get(usize::try_from(start).ok()?..usize::try_from(end).ok()?),
            Self::Pieces { pieces, .. } => pieces.iter().find_map(|(at, bytes)| {
                let from = usize::try_from(start.checked_sub(*at)?).ok()?;
                let to = usize::try_from(end - at).ok()?;
                bytes.get(from..to)
            }),
        }
    }
}

impl<'a> ReadRef<'a> for Bytes<'a> {
    fn len(self) -> Result<u64, ()> {
        Ok(self.object_len())
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        if size == 0 {
            return Ok(&[]);
        }
        self.range(offset, offset.checked_add(size).ok_or(())?)
            .ok_or(())
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        let bytes = self.range(range.start, range.end).ok_or(())?;
        let len = bytes.iter().position(|&b| b == delimiter).ok_or(())?;
        Ok(&bytes[..len])
    }
}

/// A CFI section: its virtual address and bytes.
#[derive(Debug, Clone, Copy)]
pub struct CfiSection<'a> {
    /// `sh_addr`: where the section is in the object's address space.
    pub addr: u64,
    /// The section's bytes.
    pub data: &'a [u8],
}

/// A zlib-compressed section: the stream after its ELF compression header.
#[derive(Debug, Clone, Copy)]
pub struct Compressed<'a> {
    /// The zlib stream.
    pub stream: &'a [u8],
    /// The size the header declares for the inflated bytes (not trusted: capped).
    pub size: u64,
}

/// What the table compiler reads from an object.
#[derive(Debug)]
pub struct ElfParts<'a> {
    /// `.eh_frame`, when present and not empty.
    pub eh_frame: Option<CfiSection<'a>>,
    /// `.debug_frame`, when present, not empty and not compressed.
    pub debug_frame: Option<CfiSection<'a>>,
    /// `.debug_frame` compressed with zlib (`SHF_COMPRESSED`, as Go's linker writes it):
    /// the stream and its declared size, for [`inflate`].
    pub debug_frame_zlib: Option<Compressed<'a>>,
    /// `.debug_frame` is present but compressed in a way ember does not read (zstd).
    pub debug_frame_compressed: bool,
    /// `.text`'s address: the base of `DW_EH_PE_textrel` pointers.
    pub text_addr: Option<u64>,
    /// `.got`'s address: the base of `DW_EH_PE_datarel` pointers.
    pub got_addr: Option<u64>,
    /// Address ranges of the executable `PT_LOAD` segments, sorted, overlaps merged.
    pub code: Vec<(u64, u64)>,
    /// Executable segments as (address, file offset, bytes in the file), to read code.
    pub code_file: Vec<(u64, u64, u64)>,
    /// The object's bytes (only some pieces of it after a sparse read: see `reader`).
    pub bytes: Bytes<'a>,
    /// Where code bytes are read from when `bytes` holds only the headers and CFI
    /// ([`super::sparse`]); `None`: `bytes` is the whole object.
    pub reader: Option<&'a dyn CodeReader>,
    /// `e_entry`: where the kernel (or, for the dynamic loader, the loader itself) starts
    /// the program, 0 for most shared objects.
    pub entry: u64,
}

/// Reads the parts of an x86-64 ELF64 executable or shared object.
pub fn parse(bytes: Bytes<'_>) -> Result<ElfParts<'_>, UnwindError> {
    let header =
        FileHeader64::<LittleEndian>::parse(bytes).map_err(|_| UnwindError::BadElf("header"))?;
    if !header.is_class_64() || !header.is_little_endian() {
        return Err(UnwindError::NotX86_64);
    }
    let endian = LittleEndian;
    if header.e_machine(endian) != object::elf::EM_X86_64 {
        return Err(UnwindError::NotX86_64);
    }
    let e_type = header.e_type(endian);
    if e_type != object::elf::ET_EXEC && e_type != object::elf::ET_DYN {
        return Err(UnwindError::NotLoadable(e_type));
    }

    let mut code = Vec::new();
    let mut code_file = Vec::new();
    let segments = header
        .program_headers(endian, bytes)
        .map_err(|_| UnwindError::BadElf("program headers"))?;
    for ph in segments {
        if ph.p_type(endian) != PT_LOAD || ph.p_flags(endian) & PF_X == 0 {
            continue;
        }
        let start = ph.p_vaddr(endian);
        code_file.push((start, ph.p_offset(endian), ph.p_filesz(endian)));
        if let Some(end) = start.checked_add(ph.p_memsz(endian)) {
            if end > start {
                code.push((start, end));
            }
        }
    }
    code.sort_unstable();
    code.dedup_by(|next, prev| {
        // Merge overlapping or touching segments into `prev`.
        if next.0 <= prev.1 {
            prev.1 = prev.1.max(next.1);
            true
        } else {
            false
        }
    });

    let sections = header
        .sections(endian, bytes)
        .map_err(|_| UnwindError::BadElf("section headers"))?;
    let mut parts = ElfParts {
        code,
        code_file,
        bytes,
        reader: None,
        entry: header.e_entry(endian),
        text_addr: section(&sections, b".text").map(|s| s.sh_addr(endian)),
        got_addr: section(&sections, b".got").map(|s| s.sh_addr(endian)),
        eh_frame: None,
        debug_frame: None,
        debug_frame_zlib: None,
        debug_frame_compressed: false,
    };
    parts.eh_frame = cfi_section(&sections, b".eh_frame", bytes)?;
    if let Some(s) = section(&sections, b".debug_frame") {
        if s.sh_flags(endian) & u64::from(SHF_COMPRESSED) != 0 {
            // The object crate checks the header and the stream's bounds against the bytes.
            match s.compression(endian, bytes) {
                Ok(Some((header, offset, size)))
                    if header.ch_type.get(endian) == object::elf::ELFCOMPRESS_ZLIB =>
                {
                    let stream = bytes
                        .read_bytes_at(offset, size)
                        .map_err(|_| UnwindError::BadElf("compressed section"))?;
                    parts.debug_frame_zlib = Some(Compressed {
                        stream,
                        size: header.ch_size.get(endian),
                    });
                }
                Ok(_) => parts.debug_frame_compressed = true,
                Err(_) => return Err(UnwindError::BadElf("compression header")),
            }
        } else {
            parts.debug_frame = cfi_section(&sections, b".debug_frame", bytes)?;
        }
    }
    Ok(parts)
}

impl<'a> ElfParts<'a> {
    /// The file bytes of code at `[start, end)`, if one executable segment holds them
    /// all in the file.
    pub fn code_bytes(&self, start: u64, end: u64) -> Option<std::borrow::Cow<'a, [u8]>> {
        self.code_file.iter().find_map(|&(addr, offset, size)| {
            let from = start.checked_sub(addr)?;
            let to = end.checked_sub(addr)?;
            if to > size {
                return None;
            }
            let from = offset.checked_add(from)?;
            let to = offset.checked_add(to)?;
            match self.reader {
                Some(r) => r
                    .read_code(from, usize::try_from(to - from).ok()?)
                    .map(std::borrow::Cow::Owned),
                None => self.bytes.range(from, to).map(std::borrow::Cow::Borrowed),
            }
        })
    }
}

type Sections<'a> = SectionTable<'a, FileHeader64<LittleEndian>, Bytes<'a>>;

fn section<'a>(
    sections: &Sections<'a>,
    name: &[u8],
) -> Option<&'a <FileHeader64<LittleEndian> as FileHeader>::SectionHeader> {
    sections
        .section_by_name(LittleEndian, name)
        .map(|(_, header)| header)
}

/// A CFI section's address and bytes; `None` when absent, empty or `SHT_NOBITS` (a
/// separate debug file keeps the headers of the sections it moved out).
fn cfi_section<'a>(
    sections: &Sections<'a>,
    name: &[u8],
    bytes: Bytes<'a>,
) -> Result<Option<CfiSection<'a>>, UnwindError> {
    let Some(header) = section(sections, name) else {
        return Ok(None);
    };
    if header.sh_type(LittleEndian) == SHT_NOBITS {
        return Ok(None);
    }
    let data = header
        .data(LittleEndian, bytes)
        .map_err(|_| UnwindError::BadElf("section data"))?;
    if data.is_empty() {
        return Ok(None);
    }
    Ok(Some(CfiSection {
        addr: header.sh_addr(LittleEndian),
        data,
    }))
}

/// Inflates a zlib-compressed section into bytes ember owns, refusing a declared size over
/// `max` before allocating and never producing more than the declared size (a zlib bomb
/// stops there); a stream that ends short of it, or is corrupt, is an error.
pub fn inflate(section: Compressed<'_>, max: u64) -> Result<Vec<u8>, UnwindError> {
    use std::io::Read as _;
    if section.size > max {
        return Err(UnwindError::TooLarge {
            bytes: section.size,
            max,
        });
    }
    let size = usize::try_from(section.size).map_err(|_| UnwindError::BadElf("compressed size"))?;
    let mut out = Vec::with_capacity(size);
    flate2::read::ZlibDecoder::new(section.stream)
        .take(section.size)
        .read_to_end(&mut out)
        .map_err(|_| UnwindError::BadElf("zlib stream"))?;
    if out.len() != size {
        return Err(UnwindError::BadElf("zlib stream shorter than declared"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn zlib(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(bytes).expect("compress");
        e.finish().expect("compress")
    }

    #[test]
    fn inflate_is_capped_and_checked() {
        let data = vec![7u8; 4096];
        let stream = zlib(&data);
        let ok = Compressed {
            stream: &stream,
            size: 4096,
        };
        assert_eq!(inflate(ok, 1 << 20).expect("inflates"), data);
        // A declared size over the cap is refused before anything is allocated.
        let bomb = Compressed {
            stream: &stream,
            size: 1 << 62,
        };
        assert!(matches!(
            inflate(bomb, 1 << 20),
            Err(UnwindError::TooLarge { .. })
        ));
        // A stream that inflates to more than declared stops at the declared size.
        let zeros = zlib(&vec![0u8; 8 << 20]);
        let under = Compressed {
            stream: &zeros,
            size: 1000,
        };
        assert_eq!(inflate(under, 1 << 20).expect("stops at 1000").len(), 1000);
        // Shorter than declared, or not zlib at all: errors.
        let short = Compressed {
            stream: &stream,
            size: 5000,
        };
        assert!(inflate(short, 1 << 20).is_err());
        let junk = Compressed {
            stream: b"not a zlib stream",
            size: 10,
        };
        assert!(inflate(junk, 1 << 20).is_err());
    }
}
