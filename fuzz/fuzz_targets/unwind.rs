//! Unwind table compiler: never panics, hangs or outgrows its caps, and every table it
//! returns is one the sampler can search.
//!
//! Odd first bytes hand the rest over as a whole object (the ELF reader's turn); even
//! ones wrap it, as CFI, in a valid x86-64 ELF whose one executable segment covers the
//! first MiB of addresses, so the fuzzer spends its time in gimli and the compiler: the
//! second byte says how much of it is `.eh_frame`, the rest is `.debug_frame`.
//!
//! With bit 2 of the first byte, the object is read as the loader reads a file, by the
//! sparse reader: as a file extended by (bits 3 to 7) × 64 MiB of zeros never written, as
//! a sparse file on disk is. It holds no more than its caps (whatever the headers claim),
//! refuses with the cap's reason, and, on a file of just the object, compiles the table
//! the whole object compiles to.
#![no_main]

use ember_parse::unwind::elf::CodeReader;
use ember_parse::elf_file::{ElfError, ReadAt};
use ember_parse::unwind::sparse::{Sparse, SparseError, MAX_HEADER_BYTES};
use ember_parse::unwind::{compile, Limits, DEFAULT_LIMITS};
use libfuzzer_sys::fuzz_target;

/// Small caps, so the fuzzer also reaches them.
const LIMITS: Limits = Limits {
    max_object_bytes: 1 << 20,
    max_rows: 1 << 14,
    max_entries: 1 << 12,
    max_pages: 64,
    max_cies: 16,
    max_cie_bytes: 256,
    work_factor: 8,
    work_base: 1 << 16,
    max_inflated_bytes: 1 << 20,
    max_cfi_bytes: 1 << 16,
};

/// `image` followed by zeros up to `len` bytes: a sparse file.
#[derive(Debug)]
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

impl CodeReader for SparseFile<'_> {
    fn read_code(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.read_exact_at(&mut buf, offset).ok()?;
        Some(buf)
    }
}

/// The sparse reader on `object` extended to `len` bytes.
fn sparse(object: &[u8], len: u64, limits: &Limits) {
    let file = SparseFile { image: object, len };
    let s = match Sparse::read(&file, limits.max_cfi_bytes) {
        Ok(s) => s,
        Err(SparseError::Refused(e)) => {
            assert_eq!(e.reason().as_str(), "section_too_large", "{e}");
            return;
        }
        Err(SparseError::Elf(ElfError::Io)) => panic!("reads stay inside the file"),
        Err(SparseError::Elf(_)) => return,
    };
    assert!(
        s.read <= MAX_HEADER_BYTES + limits.max_cfi_bytes,
        "held {} bytes",
        s.read
    );
    let got = ember_parse::unwind::compile::compile_with(s.bytes(), Some(&file), limits);
    if let Ok(table) = &got {
        assert_eq!(table.validate(), Ok(()));
    }
    if len == object.len() as u64 {
        // What the compiler reads of the whole object is what the sparse read took.
        if let (Ok(a), Ok(b)) = (&got, compile(object, limits)) {
            assert_eq!(a.rows, b.rows);
            assert_eq!(a.pages, b.pages);
        }
    }
}

const EH_ADDR: u64 = 0x8_0000;
const EHDR: usize = 64;
const PHDR: usize = 56;
const SHDR: usize = 64;
/// Section names: "", ".eh_frame", ".debug_frame", ".shstrtab".
const SHSTRTAB: &[u8] = b"\0.eh_frame\0.debug_frame\0.shstrtab\0";

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}

fn section(name: u32, addr: u64, offset: u64, size: u64, kind: u32) -> [u8; SHDR] {
    let mut s = [0u8; SHDR];
    put(&mut s, 0, &name.to_le_bytes());
    put(&mut s, 4, &kind.to_le_bytes());
    put(&mut s, 8, &2u64.to_le_bytes()); // SHF_ALLOC
    put(&mut s, 16, &addr.to_le_bytes());
    put(&mut s, 24, &offset.to_le_bytes());
    put(&mut s, 32, &size.to_le_bytes());
    put(&mut s, 48, &1u64.to_le_bytes()); // sh_addralign
    s
}

/// An ELF64 x86-64 shared object: one R+X `PT_LOAD` mapping the file at address 0 with
/// 1 MiB of memory; `.eh_frame` at address 512 KiB, so the pc-relative addresses of a
/// real `.eh_frame` (its code a few KiB before it) land in that MiB.
fn elf(eh: &[u8], debug: &[u8]) -> Vec<u8> {
    let eh_off = EHDR + PHDR;
    let debug_off = eh_off + eh.len();
    let str_off = debug_off + debug.len();
    let sh_off = (str_off + SHSTRTAB.len()).next_multiple_of(8);
    let mut f = vec![0u8; sh_off + 4 * SHDR];
    put(&mut f, 0, b"\x7fELF\x02\x01\x01");
    put(&mut f, 16, &3u16.to_le_bytes()); // ET_DYN
    put(&mut f, 18, &62u16.to_le_bytes()); // EM_X86_64
    put(&mut f, 20, &1u32.to_le_bytes());
    put(&mut f, 24, &0x100u64.to_le_bytes()); // e_entry
    put(&mut f, 32, &(EHDR as u64).to_le_bytes()); // e_phoff
    put(&mut f, 40, &(sh_off as u64).to_le_bytes()); // e_shoff
    put(&mut f, 52, &(EHDR as u16).to_le_bytes());
    put(&mut f, 54, &(PHDR as u16).to_le_bytes());
    put(&mut f, 56, &1u16.to_le_bytes()); // e_phnum
    put(&mut f, 58, &(SHDR as u16).to_le_bytes());
    put(&mut f, 60, &4u16.to_le_bytes()); // e_shnum
    put(&mut f, 62, &3u16.to_le_bytes()); // e_shstrndx
    let ph = EHDR;
    put(&mut f, ph, &1u32.to_le_bytes()); // PT_LOAD
    put(&mut f, ph + 4, &5u32.to_le_bytes()); // PF_R | PF_X
    put(&mut f, ph + 32, &(sh_off as u64).to_le_bytes()); // p_filesz
    put(&mut f, ph + 40, &(1u64 << 20).to_le_bytes()); // p_memsz
    put(&mut f, eh_off, eh);
    put(&mut f, debug_off, debug);
    put(&mut f, str_off, SHSTRTAB);
    let (eh_off, debug_off, str_off) = (eh_off as u64, debug_off as u64, str_off as u64);
    let sections = [
        [0u8; SHDR],
        section(1, EH_ADDR, eh_off, eh.len() as u64, 1),
        section(11, debug_off, debug_off, debug.len() as u64, 1),
        section(24, 0, str_off, SHSTRTAB.len() as u64, 3),
    ];
    for (i, s) in sections.iter().enumerate() {
        put(&mut f, sh_off + i * SHDR, s);
    }
    f
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let object = if mode & 1 == 1 {
        rest.to_vec()
    } else {
        let Some((&split, cfi)) = rest.split_first() else {
            return;
        };
        let cut = usize::from(split).saturating_mul(cfi.len()) / 255;
        elf(&cfi[..cut], &cfi[cut..])
    };
    let limits = if mode & 2 == 2 {
        LIMITS
    } else {
        DEFAULT_LIMITS
    };
    if mode & 4 == 4 {
        let len = object.len() as u64 + u64::from(mode >> 3) * (64 << 20);
        sparse(&object, len, &limits);
        return;
    }
    let Ok(table) = compile(&object, &limits) else {
        return;
    };
    assert_eq!(table.validate(), Ok(()));
    assert!(table.rows.len() <= limits.max_rows);
    assert!(table.pages.len() as u64 <= limits.max_pages);
    // Every address of every page finds a row; none outside them does.
    let first = table.first_page << 16;
    let end = first.checked_add((table.pages.len() as u64) << 16);
    for addr in (first..end.unwrap_or(u64::MAX)).step_by(97) {
        assert!(table.lookup(addr).is_some());
    }
    if let Some(end) = end {
        assert!(table.lookup(end).is_none());
    }
    assert!(first == 0 || table.lookup(first - 1).is_none());
});
