//! The few things the compiler needs from an ELF object: its CFI sections, the bases
//! their pointer encodings may be relative to, and where its code is.
//!
//! The `object` crate reads the headers; every offset and size it returns has been checked
//! against the bytes, so a hostile header costs an error, never a read out of bounds.

use object::elf::{FileHeader64, PF_X, PT_LOAD, SHF_COMPRESSED, SHT_NOBITS};
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader, SectionTable};
use object::LittleEndian;

use super::error::UnwindError;

/// A CFI section: its virtual address and bytes.
#[derive(Debug, Clone, Copy)]
pub struct CfiSection<'a> {
    /// `sh_addr`: where the section is in the object's address space.
    pub addr: u64,
    /// The section's bytes.
    pub data: &'a [u8],
}

/// What the table compiler reads from an object.
#[derive(Debug)]
pub struct ElfParts<'a> {
    /// `.eh_frame`, when present and not empty.
    pub eh_frame: Option<CfiSection<'a>>,
    /// `.debug_frame`, when present, not empty and not compressed.
    pub debug_frame: Option<CfiSection<'a>>,
    /// `.debug_frame` is present but compressed (`SHF_COMPRESSED`): not read.
    pub debug_frame_compressed: bool,
    /// `.text`'s address: the base of `DW_EH_PE_textrel` pointers.
    pub text_addr: Option<u64>,
    /// `.got`'s address: the base of `DW_EH_PE_datarel` pointers.
    pub got_addr: Option<u64>,
    /// Address ranges of the executable `PT_LOAD` segments, sorted, overlaps merged.
    pub code: Vec<(u64, u64)>,
    /// Executable segments as (address, file offset, bytes in the file), to read code.
    pub code_file: Vec<(u64, u64, u64)>,
    /// The object's bytes.
    pub bytes: &'a [u8],
    /// `e_entry`: where the kernel (or, for the dynamic loader, the loader itself) starts
    /// the program, 0 for most shared objects.
    pub entry: u64,
}

/// Reads the parts of an x86-64 ELF64 executable or shared object.
pub fn parse(bytes: &[u8]) -> Result<ElfParts<'_>, UnwindError> {
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
        entry: header.e_entry(endian),
        text_addr: section(&sections, b".text").map(|s| s.sh_addr(endian)),
        got_addr: section(&sections, b".got").map(|s| s.sh_addr(endian)),
        eh_frame: None,
        debug_frame: None,
        debug_frame_compressed: false,
    };
    parts.eh_frame = cfi_section(&sections, b".eh_frame", bytes)?;
    if let Some(s) = section(&sections, b".debug_frame") {
        if s.sh_flags(endian) & u64::from(SHF_COMPRESSED) != 0 {
            parts.debug_frame_compressed = true;
        } else {
            parts.debug_frame = cfi_section(&sections, b".debug_frame", bytes)?;
        }
    }
    Ok(parts)
}

impl<'a> ElfParts<'a> {
    /// The file bytes of code at `[start, end)`, if one executable segment holds them
    /// all in the file.
    pub fn code_bytes(&self, start: u64, end: u64) -> Option<&'a [u8]> {
        self.code_file.iter().find_map(|&(addr, offset, size)| {
            let from = start.checked_sub(addr)?;
            let to = end.checked_sub(addr)?;
            if to > size {
                return None;
            }
            let from = usize::try_from(offset.checked_add(from)?).ok()?;
            let to = usize::try_from(offset.checked_add(to)?).ok()?;
            self.bytes.get(from..to)
        })
    }
}

type Sections<'a> = SectionTable<'a, FileHeader64<LittleEndian>, &'a [u8]>;

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
    bytes: &'a [u8],
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
