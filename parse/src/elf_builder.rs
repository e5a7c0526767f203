//! A small ELF64 little-endian builder for the symbol fuzz targets: a shared object with one
//! R+X `PT_LOAD` segment over its first MiB and the sections `.symtab`, `.strtab`,
//! `.dynsym`, `.dynstr` and `.shstrtab`, whose contents (and, for the string tables,
//! `SHF_COMPRESSED`) the fuzzer chooses. So the fuzzer spends its time in the symbol
//! reading, not in finding the ELF magic. [`with_sections`] builds one with any named
//! sections (DWARF).

const EHDR: usize = 64;
const PHDR: usize = 56;
const SHDR: usize = 64;
/// "", ".symtab", ".strtab", ".dynsym", ".dynstr", ".shstrtab".
const SHSTRTAB: &[u8] = b"\0.symtab\0.strtab\0.dynsym\0.dynstr\0.shstrtab\0";
const SHF_COMPRESSED: u64 = 0x800;

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}

/// The section contents and flags chosen by the fuzzer.
pub struct Parts<'a> {
    /// `.symtab` bytes (24-byte `Elf64_Sym` records).
    pub symtab: &'a [u8],
    /// `.strtab` bytes.
    pub strtab: &'a [u8],
    /// `.dynsym` bytes.
    pub dynsym: &'a [u8],
    /// `.dynstr` bytes.
    pub dynstr: &'a [u8],
    /// Mark `.strtab` and `.dynstr` `SHF_COMPRESSED` (their bytes then start with a `Chdr`).
    pub compressed: bool,
}

/// Splits `data` into [`Parts`]: the first byte sets the flags, the next four the split points.
pub fn parts(data: &[u8]) -> Option<Parts<'_>> {
    let (head, rest) = data.split_at_checked(5)?;
    let cut = |b: u8| usize::from(b) * rest.len() / 255;
    let mut cuts = [cut(head[1]), cut(head[2]), cut(head[3]), cut(head[4])];
    cuts.sort_unstable();
    Some(Parts {
        symtab: &rest[..cuts[0]],
        strtab: &rest[cuts[0]..cuts[1]],
        dynsym: &rest[cuts[1]..cuts[2]],
        dynstr: &rest[cuts[2]..cuts[3]],
        compressed: head[0] & 1 == 1,
    })
}

fn section(name: u32, kind: u32, flags: u64, offset: usize, size: usize, link: u32) -> [u8; SHDR] {
    let mut s = [0u8; SHDR];
    put(&mut s, 0, &name.to_le_bytes());
    put(&mut s, 4, &kind.to_le_bytes());
    put(&mut s, 8, &flags.to_le_bytes());
    put(&mut s, 24, &(offset as u64).to_le_bytes());
    put(&mut s, 32, &(size as u64).to_le_bytes());
    put(&mut s, 40, &link.to_le_bytes());
    put(&mut s, 48, &8u64.to_le_bytes());
    put(&mut s, 56, &24u64.to_le_bytes());
    s
}

/// The object.
pub fn elf(p: &Parts<'_>) -> Vec<u8> {
    let mut f = vec![0u8; EHDR + PHDR];
    let place = |bytes: &[u8], f: &mut Vec<u8>| {
        let at = f.len();
        f.extend_from_slice(bytes);
        at
    };
    let symtab = place(p.symtab, &mut f);
    let strtab = place(p.strtab, &mut f);
    let dynsym = place(p.dynsym, &mut f);
    let dynstr = place(p.dynstr, &mut f);
    let shstr = place(SHSTRTAB, &mut f);
    let sh_off = f.len().next_multiple_of(8);
    f.resize(sh_off + 6 * SHDR, 0);
    put(&mut f, 0, b"\x7fELF\x02\x01\x01");
    put(&mut f, 16, &3u16.to_le_bytes()); // ET_DYN
    put(&mut f, 18, &62u16.to_le_bytes()); // EM_X86_64
    put(&mut f, 20, &1u32.to_le_bytes());
    put(&mut f, 32, &(EHDR as u64).to_le_bytes()); // e_phoff
    put(&mut f, 40, &(sh_off as u64).to_le_bytes()); // e_shoff
    put(&mut f, 52, &(EHDR as u16).to_le_bytes());
    put(&mut f, 54, &(PHDR as u16).to_le_bytes());
    put(&mut f, 56, &1u16.to_le_bytes()); // e_phnum
    put(&mut f, 58, &(SHDR as u16).to_le_bytes());
    put(&mut f, 60, &6u16.to_le_bytes()); // e_shnum
    put(&mut f, 62, &5u16.to_le_bytes()); // e_shstrndx
    put(&mut f, EHDR, &1u32.to_le_bytes()); // PT_LOAD
    put(&mut f, EHDR + 4, &5u32.to_le_bytes()); // PF_R | PF_X
    put(&mut f, EHDR + 32, &(1u64 << 20).to_le_bytes()); // p_filesz
    put(&mut f, EHDR + 40, &(1u64 << 20).to_le_bytes()); // p_memsz
    let z = if p.compressed { SHF_COMPRESSED } else { 0 };
    let sections = [
        [0u8; SHDR],
        section(1, 2, 0, symtab, p.symtab.len(), 2),
        section(9, 3, z, strtab, p.strtab.len(), 0),
        section(17, 11, 2, dynsym, p.dynsym.len(), 4),
        section(25, 3, 2 | z, dynstr, p.dynstr.len(), 0),
        section(33, 3, 0, shstr, SHSTRTAB.len(), 0),
    ];
    for (i, s) in sections.iter().enumerate() {
        put(&mut f, sh_off + i * SHDR, s);
    }
    f
}

/// An ELF64 LE object with one R+X segment and the `SHT_PROGBITS` sections `parts` (name,
/// `sh_flags`, bytes), then `.shstrtab`: DWARF for the tests and the fuzz target.
pub fn with_sections(parts: &[(&str, u64, &[u8])]) -> Vec<u8> {
    let mut shstr = vec![0u8];
    let mut names = Vec::new();
    for (name, _, _) in parts.iter().chain([&(".shstrtab", 0, &[][..])]) {
        names.push(shstr.len() as u32);
        shstr.extend_from_slice(name.as_bytes());
        shstr.push(0);
    }
    let mut f = vec![0u8; 64 + 56];
    let mut at = Vec::new();
    for (_, _, bytes) in parts {
        at.push(f.len());
        f.extend_from_slice(bytes);
    }
    let shstr_at = f.len();
    f.extend_from_slice(&shstr);
    let shoff = f.len().next_multiple_of(8);
    f.resize(shoff, 0);
    let count = parts.len() + 2;
    f[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
    f[16..18].copy_from_slice(&3u16.to_le_bytes());
    f[18..20].copy_from_slice(&62u16.to_le_bytes());
    f[32..40].copy_from_slice(&64u64.to_le_bytes());
    f[40..48].copy_from_slice(&(shoff as u64).to_le_bytes());
    f[52..54].copy_from_slice(&64u16.to_le_bytes());
    f[54..56].copy_from_slice(&56u16.to_le_bytes());
    f[56..58].copy_from_slice(&1u16.to_le_bytes());
    f[58..60].copy_from_slice(&64u16.to_le_bytes());
    f[60..62].copy_from_slice(&(count as u16).to_le_bytes());
    f[62..64].copy_from_slice(&((count - 1) as u16).to_le_bytes());
    f[64..68].copy_from_slice(&1u32.to_le_bytes());
    f[68..72].copy_from_slice(&5u32.to_le_bytes());
    let header = |name: u32, flags: u64, offset: usize, size: usize| {
        let mut s = [0u8; 64];
        s[0..4].copy_from_slice(&name.to_le_bytes());
        s[4..8].copy_from_slice(&1u32.to_le_bytes()); // SHT_PROGBITS
        s[8..16].copy_from_slice(&flags.to_le_bytes());
        s[24..32].copy_from_slice(&(offset as u64).to_le_bytes());
        s[32..40].copy_from_slice(&(size as u64).to_le_bytes());
        s
    };
    let mut headers = vec![[0u8; 64]];
    for (i, (_, flags, bytes)) in parts.iter().enumerate() {
        headers.push(header(names[i], *flags, at[i], bytes.len()));
    }
    headers.push(header(names[parts.len()], 0, shstr_at, shstr.len()));
    for h in headers {
        f.extend_from_slice(&h);
    }
    f
}
