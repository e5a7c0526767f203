//! Capped ELF reading from a file ember does not trust: the few pieces of an object that
//! ember needs (section and program headers, notes, symbol tables), read with `pread` into
//! buffers ember owns, never through a mapping.
//!
//! A container can truncate, grow or rewrite the file while it is read: a short read is an
//! error, never a `SIGBUS`. Every byte read (stored or inflated) counts against one budget
//! per object ([`Limits::max_read_bytes`]) and no one section may exceed
//! [`Limits::max_section_bytes`], so memory is bounded by configuration, not by the biggest
//! binary on the host. `SHF_COMPRESSED` sections are inflated only after their declared size
//! passes the cap, and inflating stops one byte past the declared size (zlib bombs).
//!
//! Nothing here follows a path named in the file (`.gnu_debuglink`, `.gnu_debugaltlink`):
//! it reads no file names at all. Pure over [`ReadAt`], so the fuzz targets run it on bytes.

use std::fmt;
use std::io::Read;

use object::elf;
use object::read::elf::{CompressionHeader, FileHeader, ProgramHeader, SectionHeader, Sym};
use object::{Endianness, Pod};

/// Random-access reads of a file (or a byte slice, in tests and fuzzing).
pub trait ReadAt {
    /// Size of the file when it was opened.
    fn size(&self) -> u64;
    /// Fills `buf` from `offset`; a short read (a truncated file) is an error.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

impl ReadAt for [u8] {
    fn size(&self) -> u64 {
        self.len() as u64
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let start = usize::try_from(offset).map_err(|_| eof())?;
        let end = start.checked_add(buf.len()).ok_or_else(eof)?;
        buf.copy_from_slice(self.get(start..end).ok_or_else(eof)?);
        Ok(())
    }
}

/// A file read with `pread`, no further than `size` (its size when opened).
#[derive(Debug, Clone, Copy)]
pub struct FileAt<'a> {
    file: &'a std::fs::File,
    size: u64,
}

impl<'a> FileAt<'a> {
    /// Reads `file`, no further than `size`.
    pub fn new(file: &'a std::fs::File, size: u64) -> Self {
        Self { file, size }
    }
}

impl ReadAt for FileAt<'_> {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self.file, buf, offset)
    }
}

fn eof() -> std::io::Error {
    std::io::ErrorKind::UnexpectedEof.into()
}

/// Caps of one object's read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes read from the file or inflated, all sections of the object together.
    pub max_read_bytes: u64,
    /// Bytes of one section, as stored and (if compressed) as declared and inflated.
    pub max_section_bytes: u64,
}

/// Default caps: enough for the symbol tables of a several-hundred-MB binary.
pub const DEFAULT_LIMITS: Limits = Limits {
    max_read_bytes: 64 << 20,
    max_section_bytes: 48 << 20,
};

/// Why an object could not be read; each maps to one metric reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElfError {
    /// A read failed or came up short (the file was truncated under ember).
    Io,
    /// Not an ELF file, or headers that contradict each other or the file.
    Malformed(&'static str),
    /// More bytes than [`Limits`] allow.
    TooLarge,
    /// A compressed section declares more than [`Limits::max_section_bytes`].
    CompressedSize,
    /// A compressed section inflates past its declared size (or is not valid zlib).
    Inflate,
    /// A compression format ember does not inflate (zstd).
    Unsupported,
}

impl fmt::Display for ElfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ElfError::Io => f.write_str("read failed or short (file truncated?)"),
            ElfError::Malformed(what) => write!(f, "malformed ELF: {what}"),
            ElfError::TooLarge => f.write_str("over the read cap"),
            ElfError::CompressedSize => f.write_str("compressed section declares too large a size"),
            ElfError::Inflate => f.write_str("compressed section inflates past its size"),
            ElfError::Unsupported => f.write_str("unsupported section compression"),
        }
    }
}

impl std::error::Error for ElfError {}

/// One section header, widened to 64 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    /// Offset of the name in `.shstrtab`.
    pub name: u32,
    /// `sh_type`.
    pub kind: u32,
    /// `sh_flags`.
    pub flags: u64,
    /// `sh_addr`.
    pub addr: u64,
    /// `sh_offset`.
    pub offset: u64,
    /// `sh_size`.
    pub size: u64,
    /// `sh_link`.
    pub link: u32,
}

/// One `PT_LOAD` segment: where file offsets land in the object's address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// `p_offset`.
    pub offset: u64,
    /// `p_vaddr`.
    pub vaddr: u64,
    /// `p_filesz`.
    pub filesz: u64,
    /// `p_flags` has `PF_X`.
    pub exec: bool,
}

/// A function symbol: address, size and name bytes (not demangled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FuncSym<'a> {
    /// `st_value`.
    pub addr: u64,
    /// `st_size` (0 for symbols of unknown size).
    pub size: u64,
    /// `STB_GLOBAL` (preferred over local and weak aliases at one address).
    pub global: bool,
    /// Name as stored, at most [`MAX_SYMBOL_NAME`] bytes.
    pub name: &'a [u8],
    /// `st_name`: where the name starts in the string table (symbols naming one offset
    /// share one name: what a table interns by).
    pub name_at: u32,
}

/// Any defined symbol (functions, data, thread-local): what finding an object's named
/// variables needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Symbol<'a> {
    /// `st_value` (for `STT_TLS`, the offset in the object's TLS block).
    pub value: u64,
    /// `st_size`.
    pub size: u64,
    /// `st_info`'s type (`STT_FUNC`, `STT_OBJECT`, `STT_TLS`...).
    pub kind: u8,
    /// `STB_GLOBAL`.
    pub global: bool,
    /// Name as stored, at most [`MAX_SYMBOL_NAME`] bytes.
    pub name: &'a [u8],
}

/// Longest symbol name read, in bytes. A name runs to its NUL, and one without a NUL runs
/// to the end of the string table: every symbol pointing at it would be megabytes (and
/// finding its end a scan of the whole table per symbol). Longer names are cut here. 4 KiB:
/// the longest name the demangler takes; rustc's own `librustc_driver` has names of 1.2 KB.
pub const MAX_SYMBOL_NAME: usize = 4096;

/// The name at `at` in string table `strs`, cut at [`MAX_SYMBOL_NAME`] bytes, and whether
/// it was cut (no NUL within the cap). `None` past the end of the table.
pub fn symbol_name(strs: &[u8], at: u32) -> Option<(&[u8], bool)> {
    let rest = strs.get(at as usize..)?;
    // Never looks further than the cap for the NUL (`CStr`'s search goes a word at a time:
    // a table of millions of symbols can make this run once per symbol).
    let head = &rest[..rest.len().min(MAX_SYMBOL_NAME + 1)];
    Some(match std::ffi::CStr::from_bytes_until_nul(head) {
        Ok(name) => (name.to_bytes(), false),
        Err(_) => (
            &head[..head.len().min(MAX_SYMBOL_NAME)],
            head.len() > MAX_SYMBOL_NAME,
        ),
    })
}

/// A symbol table (`SHT_SYMTAB` or `SHT_DYNSYM`) and its string table, read within the
/// caps: the names its symbols give are slices of the string table, found on request.
pub struct SymbolData {
    syms: Vec<u8>,
    strs: Vec<u8>,
    is_64: bool,
    endian: Endianness,
}

impl SymbolData {
    /// Calls `f` for each defined function symbol with a name.
    pub fn functions(&self, mut f: impl FnMut(FuncSym<'_>)) {
        if self.is_64 {
            each_func::<elf::Sym64<Endianness>>(&self.syms, &self.strs, self.endian, &mut f)
        } else {
            each_func::<elf::Sym32<Endianness>>(&self.syms, &self.strs, self.endian, &mut f)
        }
    }

    /// Calls `f` for each defined symbol with a name, of any type.
    pub fn symbols(&self, mut f: impl FnMut(Symbol<'_>)) {
        if self.is_64 {
            each_symbol::<elf::Sym64<Endianness>>(&self.syms, &self.strs, self.endian, &mut f)
        } else {
            each_symbol::<elf::Sym32<Endianness>>(&self.syms, &self.strs, self.endian, &mut f)
        }
    }

    /// The name at `at` in the string table ([`symbol_name`]).
    pub fn name(&self, at: u32) -> Option<(&[u8], bool)> {
        symbol_name(&self.strs, at)
    }
}

/// What the file header and the program headers other than `PT_LOAD` say about the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ObjectInfo {
    /// `e_type` (`ET_EXEC`, `ET_DYN`...).
    pub e_type: u16,
    /// `e_machine`.
    pub machine: u16,
    /// ELFCLASS64, little-endian.
    pub is_64_le: bool,
    /// Has a `PT_INTERP` (an executable, or a library that can run as one).
    pub interp: bool,
    /// The `PT_TLS` segment's (`p_vaddr`, `p_memsz`, `p_align`).
    pub tls: Option<(u64, u64, u64)>,
}

/// Most sections ember looks at; more are malformed for its purposes.
pub const MAX_SECTIONS: u64 = 1 << 16;
/// Most program headers read.
pub const MAX_SEGMENTS: u64 = 1 << 12;
/// Longest build id kept (SHA-1 is 20 bytes; some linkers write up to 32).
const MAX_BUILD_ID: usize = 64;

/// An ELF object opened for reading: its headers are read, its sections on request.
pub struct ElfReader<'a, R: ReadAt + ?Sized> {
    src: &'a R,
    limits: Limits,
    used: u64,
    is_64: bool,
    endian: Endianness,
    sections: Vec<Section>,
    segments: Vec<Segment>,
    shstrtab: Vec<u8>,
    info: ObjectInfo,
    /// Every range read, `(file offset, bytes)` in the order read, when opened with
    /// [`ElfReader::keeping`]; `None` otherwise.
    kept: Option<Vec<(u64, Vec<u8>)>>,
}

impl<'a, R: ReadAt + ?Sized> ElfReader<'a, R> {
    /// Reads the file, section and program headers of `src`, within `limits`.
    pub fn new(src: &'a R, limits: Limits) -> Result<Self, ElfError> {
        Self::open(src, limits, None)
    }

    /// As [`ElfReader::new`], and keeps every range it reads (headers, section names, and
    /// what [`ElfReader::keep`] reads) for a reader that parses them again by file offset:
    /// the unwind table compiler ([`crate::unwind::sparse`]). Headers are held twice while
    /// the reader lives (parsed and kept), within the header caps.
    pub fn keeping(src: &'a R, limits: Limits) -> Result<Self, ElfError> {
        Self::open(src, limits, Some(Vec::new()))
    }

    fn open(
        src: &'a R,
        limits: Limits,
        kept: Option<Vec<(u64, Vec<u8>)>>,
    ) -> Result<Self, ElfError> {
        let mut ident = [0u8; 16];
        src.read_exact_at(&mut ident, 0)
            .map_err(|_| ElfError::Malformed("too short"))?;
        if ident[..4] != elf::ELFMAG {
            return Err(ElfError::Malformed("no ELF magic"));
        }
        let mut r = ElfReader {
            src,
            limits,
            used: 0,
            is_64: false,
            endian: Endianness::Little,
            sections: Vec::new(),
            segments: Vec::new(),
            shstrtab: Vec::new(),
            info: ObjectInfo::default(),
            kept,
        };
        match ident[4] {
            elf::ELFCLASS64 => r.headers::<elf::FileHeader64<Endianness>>()?,
            elf::ELFCLASS32 => r.headers::<elf::FileHeader32<Endianness>>()?,
            _ => return Err(ElfError::Malformed("ELF class")),
        }
        Ok(r)
    }

    fn headers<E: FileHeader<Endian = Endianness>>(&mut self) -> Result<(), ElfError> {
        let hbytes = self.read(0, std::mem::size_of::<E>() as u64)?;
        let header = pod::<E>(&hbytes)?;
        let endian = header
            .endian()
            .map_err(|_| ElfError::Malformed("endianness"))?;
        self.endian = endian;
        self.is_64 = header.is_type_64();
        self.info.e_type = header.e_type(endian);
        self.info.machine = header.e_machine(endian);
        self.info.is_64_le = self.is_64 && endian == Endianness::Little;
        // Section headers (section 0 holds the real count when e_shnum overflows).
        let shoff: u64 = header.e_shoff(endian).into();
        let shsize = std::mem::size_of::<E::SectionHeader>() as u64;
        if shoff != 0 {
            if u64::from(header.e_shentsize(endian)) != shsize {
                return Err(ElfError::Malformed("e_shentsize"));
            }
            let mut shnum = u64::from(header.e_shnum(endian));
            if shnum == 0 {
                let s0 = self.read(shoff, shsize)?;
                shnum = pod::<E::SectionHeader>(&s0)?.sh_size(endian).into();
            }
            if shnum > MAX_SECTIONS {
                return Err(ElfError::Malformed("section count"));
            }
            let bytes = self.read(shoff, shnum * shsize)?;
            for chunk in bytes.chunks_exact(shsize as usize) {
                let s = pod::<E::SectionHeader>(chunk)?;
                self.sections.push(Section {
                    name: s.sh_name(endian),
                    kind: s.sh_type(endian),
                    flags: s.sh_flags(endian).into(),
                    addr: s.sh_addr(endian).into(),
                    offset: s.sh_offset(endian).into(),
                    size: s.sh_size(endian).into(),
                    link: s.sh_link(endian),
                });
            }
            let mut strndx = u32::from(header.e_shstrndx(endian));
            if strndx == u32::from(elf::SHN_XINDEX) {
                strndx = self.sections.first().map_or(0, |s| s.link);
            }
            if strndx != 0 {
                self.shstrtab = self.section_data(strndx as usize)?;
            }
        }
        let phoff: u64 = header.e_phoff(endian).into();
        let phsize = std::mem::size_of::<E::ProgramHeader>() as u64;
        let phnum = u64::from(header.e_phnum(endian));
        if phoff != 0 && phnum != 0 {
            if u64::from(header.e_phentsize(endian)) != phsize || phnum > MAX_SEGMENTS {
                return Err(ElfError::Malformed("program headers"));
            }
            let bytes = self.read(phoff, phnum * phsize)?;
            for chunk in bytes.chunks_exact(phsize as usize) {
                let p = pod::<E::ProgramHeader>(chunk)?;
                match p.p_type(endian) {
                    elf::PT_INTERP => self.info.interp = true,
                    elf::PT_TLS => {
                        let tls = (p.p_vaddr(endian), p.p_memsz(endian), p.p_align(endian));
                        self.info.tls = Some((tls.0.into(), tls.1.into(), tls.2.into()));
                    }
                    _ => {}
                }
                if p.p_type(endian) == elf::PT_LOAD {
                    self.segments.push(Segment {
                        offset: p.p_offset(endian).into(),
                        vaddr: p.p_vaddr(endian).into(),
                        filesz: p.p_filesz(endian).into(),
                        exec: p.p_flags(endian) & elf::PF_X != 0,
                    });
                }
            }
        }
        Ok(())
    }

    /// Bytes read (or inflated) so far.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// The section headers.
    pub fn sections(&self) -> &[Section] {
        &self.sections
    }

    /// The `PT_LOAD` segments.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The file header's kind and the `PT_INTERP` and `PT_TLS` program headers.
    pub fn info(&self) -> ObjectInfo {
        self.info
    }

    /// Whether the object is little-endian (how its DWARF is read).
    pub fn little_endian(&self) -> bool {
        self.endian == Endianness::Little
    }

    /// The `len` bytes the file holds at address `vaddr` (through the `PT_LOAD` segment
    /// whose file part holds them all), charged to the budget. An address past a
    /// segment's file part (`.bss`) or in none is [`ElfError::Malformed`].
    pub fn read_vaddr(&mut self, vaddr: u64, len: u64) -> Result<Vec<u8>, ElfError> {
        let end = vaddr.checked_add(len).ok_or(ElfError::Malformed("range"))?;
        let seg = self
            .segments
            .iter()
            .find(|s| vaddr >= s.vaddr && end <= s.vaddr.saturating_add(s.filesz))
            .copied()
            .ok_or(ElfError::Malformed("address not in the file"))?;
        if len > self.limits.max_section_bytes {
            return Err(ElfError::TooLarge);
        }
        self.read(seg.offset.saturating_add(vaddr - seg.vaddr), len)
    }

    /// The name of `section` (empty if unnamed or out of `.shstrtab`).
    pub fn section_name(&self, section: &Section) -> &[u8] {
        let rest = self
            .shstrtab
            .get(section.name as usize..)
            .unwrap_or_default();
        &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())]
    }

    /// The index of the first section named `name`.
    pub fn find_section(&self, name: &[u8]) -> Option<usize> {
        self.sections
            .iter()
            .position(|s| self.section_name(s) == name)
    }

    /// The contents of section `index`, inflated if `SHF_COMPRESSED`; empty for `SHT_NOBITS`.
    pub fn section_data(&mut self, index: usize) -> Result<Vec<u8>, ElfError> {
        let s = *self
            .sections
            .get(index)
            .ok_or(ElfError::Malformed("section index"))?;
        if s.kind == elf::SHT_NOBITS || s.kind == elf::SHT_NULL {
            return Ok(Vec::new());
        }
        if s.size > self.limits.max_section_bytes {
            return Err(ElfError::TooLarge);
        }
        let raw = self.read(s.offset, s.size)?;
        if s.flags & u64::from(elf::SHF_COMPRESSED) == 0 {
            return Ok(raw);
        }
        if self.is_64 {
            self.inflate::<elf::CompressionHeader64<Endianness>>(&raw)
        } else {
            self.inflate::<elf::CompressionHeader32<Endianness>>(&raw)
        }
    }

    /// `len` bytes at `offset` inside section `index` (cut at the section's end), charged
    /// to the budget like any read; refused ([`ElfError::Unsupported`]) for a compressed
    /// section, which can only be inflated whole ([`ElfReader::section_data`]).
    pub fn section_range(
        &mut self,
        index: usize,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, ElfError> {
        let s = *self
            .sections
            .get(index)
            .ok_or(ElfError::Malformed("section index"))?;
        if s.kind == elf::SHT_NOBITS || s.kind == elf::SHT_NULL || offset >= s.size {
            return Ok(Vec::new());
        }
        if s.flags & u64::from(elf::SHF_COMPRESSED) != 0 {
            return Err(ElfError::Unsupported);
        }
        let len = len.min(s.size - offset);
        let at = s
            .offset
            .checked_add(offset)
            .ok_or(ElfError::Malformed("range"))?;
        self.read(at, len)
    }

    fn inflate<C: CompressionHeader<Endian = Endianness> + Pod>(
        &mut self,
        raw: &[u8],
    ) -> Result<Vec<u8>, ElfError> {
        let hsize = std::mem::size_of::<C>();
        let header = pod::<C>(
            raw.get(..hsize)
                .ok_or(ElfError::Malformed("compression header"))?,
        )?;
        if header.ch_type(self.endian) != elf::ELFCOMPRESS_ZLIB {
            return Err(ElfError::Unsupported);
        }
        let declared: u64 = header.ch_size(self.endian).into();
        if declared > self.limits.max_section_bytes {
            return Err(ElfError::CompressedSize);
        }
        self.charge(declared)?;
        // Grown as it inflates (never sized from the header): a lying small stream costs
        // what it really inflates to, at most one byte past the declared size.
        let mut out = Vec::new();
        flate2::read::ZlibDecoder::new(&raw[hsize..])
            .take(declared + 1)
            .read_to_end(&mut out)
            .map_err(|_| ElfError::Inflate)?;
        if out.len() as u64 != declared {
            return Err(ElfError::Inflate);
        }
        Ok(out)
    }

    /// The GNU build id, from the first `SHT_NOTE` section that has one.
    pub fn build_id(&mut self) -> Result<Option<Vec<u8>>, ElfError> {
        for i in 0..self.sections.len() {
            let s = self.sections[i];
            // Build-id notes are tiny; skip big note sections rather than read them.
            if s.kind != elf::SHT_NOTE || s.size > 4096 {
                continue;
            }
            let data = self.section_data(i)?;
            if let Some(id) = find_build_id(&data, self.endian) {
                return Ok(Some(id));
            }
        }
        Ok(None)
    }

    /// Reads the symbol table of type `kind` (`SHT_SYMTAB` or `SHT_DYNSYM`) and its string
    /// table. `None` if there is no such table.
    pub fn symbol_data(&mut self, kind: u32) -> Result<Option<SymbolData>, ElfError> {
        let Some(index) = self.sections.iter().position(|s| s.kind == kind) else {
            return Ok(None);
        };
        let link = self.sections[index].link as usize;
        if link == 0 || link >= self.sections.len() {
            return Err(ElfError::Malformed("symbol table link"));
        }
        let syms = self.section_data(index)?;
        let strs = self.section_data(link)?;
        Ok(Some(SymbolData {
            syms,
            strs,
            is_64: self.is_64,
            endian: self.endian,
        }))
    }

    /// Reads the symbol table of type `kind` (`SHT_SYMTAB` or `SHT_DYNSYM`) and calls `f`
    /// for each defined function symbol. `false` if there is no such table.
    pub fn function_symbols(
        &mut self,
        kind: u32,
        f: impl FnMut(FuncSym<'_>),
    ) -> Result<bool, ElfError> {
        let Some(data) = self.symbol_data(kind)? else {
            return Ok(false);
        };
        data.functions(f);
        Ok(true)
    }

    /// Charges `bytes` that the caller builds out of what it read (names copied out of a
    /// string table) to the read budget, so that what an object makes ember hold is capped
    /// like what it makes ember read. [`ElfError::TooLarge`] once over.
    pub fn charge(&mut self, bytes: u64) -> Result<(), ElfError> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.limits.max_read_bytes {
            return Err(ElfError::TooLarge);
        }
        Ok(())
    }

    /// Reads `len` bytes at `offset`, charged to the budget, into the kept ranges (a
    /// reader opened with [`ElfReader::keeping`]; others read and drop them).
    pub fn keep(&mut self, offset: u64, len: u64) -> Result<(), ElfError> {
        let buf = self.read_fresh(offset, len)?;
        if let Some(kept) = &mut self.kept {
            kept.push((offset, buf));
        }
        Ok(())
    }

    /// The ranges read, `(file offset, bytes)` in the order read (empty unless opened with
    /// [`ElfReader::keeping`]).
    pub fn into_kept(self) -> Vec<(u64, Vec<u8>)> {
        self.kept.unwrap_or_default()
    }

    /// Reads `len` bytes at `offset`, charged to the budget (and kept when keeping).
    fn read(&mut self, offset: u64, len: u64) -> Result<Vec<u8>, ElfError> {
        let buf = self.read_fresh(offset, len)?;
        if let Some(kept) = &mut self.kept {
            kept.push((offset, buf.clone()));
        }
        Ok(buf)
    }

    fn read_fresh(&mut self, offset: u64, len: u64) -> Result<Vec<u8>, ElfError> {
        let end = offset
            .checked_add(len)
            .ok_or(ElfError::Malformed("range"))?;
        if end > self.src.size() {
            return Err(ElfError::Malformed("range past the end of the file"));
        }
        self.charge(len)?;
        let mut buf = vec![0u8; len as usize];
        self.src
            .read_exact_at(&mut buf, offset)
            .map_err(|_| ElfError::Io)?;
        Ok(buf)
    }
}

/// A plain-old-data header at the start of `bytes`.
fn pod<T: Pod>(bytes: &[u8]) -> Result<&T, ElfError> {
    object::pod::from_bytes::<T>(bytes)
        .map(|(t, _)| t)
        .map_err(|_| ElfError::Malformed("short header"))
}

fn each_func<S: Sym<Endian = Endianness> + Pod>(
    syms: &[u8],
    strs: &[u8],
    endian: Endianness,
    f: &mut impl FnMut(FuncSym<'_>),
) {
    let size = std::mem::size_of::<S>();
    for chunk in syms.chunks_exact(size) {
        let Ok(s) = pod::<S>(chunk) else { continue };
        let kind = s.st_type();
        if !(kind == elf::STT_FUNC || kind == elf::STT_GNU_IFUNC)
            || s.st_shndx(endian) == elf::SHN_UNDEF
        {
            continue;
        }
        let name_at = s.st_name(endian);
        let Some((name, _)) = symbol_name(strs, name_at) else {
            continue;
        };
        if name.is_empty() {
            continue;
        }
        f(FuncSym {
            addr: s.st_value(endian).into(),
            size: s.st_size(endian).into(),
            global: s.st_bind() == elf::STB_GLOBAL,
            name,
            name_at,
        });
    }
}

fn each_symbol<S: Sym<Endian = Endianness> + Pod>(
    syms: &[u8],
    strs: &[u8],
    endian: Endianness,
    f: &mut impl FnMut(Symbol<'_>),
) {
    for chunk in syms.chunks_exact(std::mem::size_of::<S>()) {
        let Ok(s) = pod::<S>(chunk) else { continue };
        if s.st_shndx(endian) == elf::SHN_UNDEF {
            continue;
        }
        let Some((name, _)) = symbol_name(strs, s.st_name(endian)) else {
            continue;
        };
        if !name.is_empty() {
            f(Symbol {
                value: s.st_value(endian).into(),
                size: s.st_size(endian).into(),
                kind: s.st_type(),
                global: s.st_bind() == elf::STB_GLOBAL,
                name,
            });
        }
    }
}

/// The descriptor of the first `NT_GNU_BUILD_ID` note named "GNU" in a note section.
fn find_build_id(data: &[u8], endian: Endianness) -> Option<Vec<u8>> {
    let mut at = 0usize;
    let word = |at: usize| -> Option<u32> {
        let b: [u8; 4] = data.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(match endian {
            Endianness::Little => u32::from_le_bytes(b),
            Endianness::Big => u32::from_be_bytes(b),
        })
    };
    while at.checked_add(12)? <= data.len() {
        let namesz = word(at)? as usize;
        let descsz = word(at + 4)? as usize;
        let kind = word(at + 8)?;
        let name_at = at + 12;
        let desc_at = name_at.checked_add(namesz.checked_next_multiple_of(4)?)?;
        let next = desc_at.checked_add(descsz.checked_next_multiple_of(4)?)?;
        let name = data.get(name_at..name_at.checked_add(namesz)?)?;
        if kind == elf::NT_GNU_BUILD_ID && name == b"GNU\0" {
            let desc = data.get(desc_at..desc_at.checked_add(descsz)?)?;
            return (!desc.is_empty() && desc.len() <= MAX_BUILD_ID).then(|| desc.to_vec());
        }
        at = next;
    }
    None
}

/// Maps a file offset of executable code to the object's address (as symbols are given),
/// through the `PT_LOAD` segment holding it.
pub fn offset_to_vaddr(segments: &[Segment], offset: u64) -> Option<u64> {
    // Executable segments first: a file offset can fall in two overlapping segments'
    // page-rounded ranges, and frames are code.
    let in_seg = |s: &&Segment| offset >= s.offset && offset - s.offset < s.filesz;
    segments
        .iter()
        .filter(|s| s.exec)
        .find(in_seg)
        .or_else(|| segments.iter().find(in_seg))
        .map(|s| s.vaddr.wrapping_add(offset - s.offset))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const LIMITS: Limits = Limits {
        max_read_bytes: 4 << 20,
        max_section_bytes: 1 << 20,
    };

    /// Our own executable with its `.strtab` replaced by a compressed section declaring
    /// `declared` bytes over `stream`, appended at the end.
    fn own_exe() -> &'static [u8] {
        static EXE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        EXE.get_or_init(|| std::fs::read("/proc/self/exe").expect("read exe"))
    }

    fn with_compressed_strtab(declared: u64, stream: &[u8]) -> Vec<u8> {
        let mut f = own_exe().to_vec();
        let elf = ElfReader::new(&f[..], DEFAULT_LIMITS).expect("parse");
        let index = elf.find_section(b".strtab").expect(".strtab");
        let shoff = u64::from_le_bytes(f[0x28..0x30].try_into().expect("8")) as usize;
        let h = shoff + index * 64;
        let at = f.len();
        f.extend_from_slice(&1u32.to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        f.extend_from_slice(&declared.to_le_bytes());
        f.extend_from_slice(&1u64.to_le_bytes());
        f.extend_from_slice(stream);
        let flags = u64::from_le_bytes(f[h + 8..h + 16].try_into().expect("8"))
            | u64::from(elf::SHF_COMPRESSED);
        let size = (f.len() - at) as u64;
        f[h + 8..h + 16].copy_from_slice(&flags.to_le_bytes());
        f[h + 24..h + 32].copy_from_slice(&(at as u64).to_le_bytes());
        f[h + 32..h + 40].copy_from_slice(&size.to_le_bytes());
        f
    }

    fn zeros(n: usize) -> Vec<u8> {
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(&vec![0u8; n]).expect("deflate");
        z.finish().expect("deflate")
    }

    fn strtab(bytes: &[u8]) -> Result<Vec<u8>, ElfError> {
        let mut elf = ElfReader::new(bytes, LIMITS)?;
        let i = elf.find_section(b".strtab").expect(".strtab");
        elf.section_data(i)
    }

    #[test]
    fn compressed_sections_are_capped() {
        // ch_size = 2^62: refused before any allocation.
        let huge = with_compressed_strtab(1 << 62, &zeros(4096));
        assert_eq!(strtab(&huge), Err(ElfError::CompressedSize));
        // A bomb: declares 4 KiB, inflates to 32 MiB; stopped one byte past 4 KiB.
        let bomb = with_compressed_strtab(4096, &zeros(32 << 20));
        assert_eq!(strtab(&bomb), Err(ElfError::Inflate));
        // Honest and small: inflated.
        let ok = with_compressed_strtab(4096, &zeros(4096));
        assert_eq!(strtab(&ok), Ok(vec![0u8; 4096]));
    }

    #[test]
    fn truncated_and_junk_files_are_errors() {
        let exe = own_exe();
        for cut in [0, 3, 16, 63, 64, 200, exe.len() / 2, exe.len() - 1] {
            let r = ElfReader::new(&exe[..cut], DEFAULT_LIMITS).and_then(|mut e| {
                let i = e
                    .find_section(b".symtab")
                    .ok_or(ElfError::Malformed("none"))?;
                e.section_data(i)
            });
            assert!(r.is_err(), "cut at {cut}");
        }
        assert!(ElfReader::new(&b"not an ELF file at all"[..], LIMITS).is_err());
        // A budget smaller than the symbol table: refused, not read.
        let tiny = Limits {
            max_read_bytes: 1 << 16,
            max_section_bytes: 1 << 16,
        };
        let mut e = ElfReader::new(exe, tiny).expect("headers fit");
        let i = e.find_section(b".symtab").expect(".symtab");
        assert_eq!(e.section_data(i), Err(ElfError::TooLarge));
        assert!(e.used() <= 1 << 16);
    }

    #[test]
    fn file_offsets_map_through_exec_segments() {
        let segs = [
            Segment {
                offset: 0,
                vaddr: 0,
                filesz: 0x1000,
                exec: false,
            },
            Segment {
                offset: 0x1000,
                vaddr: 0x401000,
                filesz: 0x2000,
                exec: true,
            },
        ];
        assert_eq!(offset_to_vaddr(&segs, 0x1010), Some(0x401010));
        assert_eq!(offset_to_vaddr(&segs, 0x10), Some(0x10));
        assert_eq!(offset_to_vaddr(&segs, 0x3000), None);
    }
}
