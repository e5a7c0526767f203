use super::*;
use crate::elf_builder;
use crate::elf_file::{Limits, DEFAULT_LIMITS};

#[inline(never)]
fn a_distinct_outer_function() -> u64 {
    std::hint::black_box(7)
}

fn own_exe() -> Vec<u8> {
    std::fs::read("/proc/self/exe").expect("read exe")
}

/// A DWARF 4 unit of `depth` nested DIEs (each an inlined subroutine with children and no
/// attributes: one byte per level), and its abbreviations.
fn nested_unit(depth: usize) -> (Vec<u8>, Vec<u8>) {
    let abbrev = vec![1, 0x11, 1, 0, 0, 2, 0x1d, 1, 0, 0, 0];
    let mut body = vec![4, 0, 0, 0, 0, 0, 8]; // version 4, abbrev offset 0, address size 8
    body.push(1);
    body.extend(std::iter::repeat_n(2u8, depth));
    body.extend(std::iter::repeat_n(0u8, depth + 1));
    let mut info = (body.len() as u32).to_le_bytes().to_vec();
    info.extend_from_slice(&body);
    (info, abbrev)
}

fn read(bytes: &[u8], limits: Limits) -> Result<Dwarf, DwarfError> {
    let mut elf = ElfReader::new(bytes, limits)?;
    Dwarf::read(&mut elf)
}

#[test]
fn names_and_lines_of_our_own_code() {
    let exe = own_exe();
    let mut elf = ElfReader::new(&exe[..], DEFAULT_LIMITS).expect("headers");
    let dwarf = Dwarf::read(&mut elf).expect("tests build with debug info");
    assert!(dwarf.bytes() > 0);
    // The function's address in the object: its runtime address less the load bias.
    let f = a_distinct_outer_function as *const () as u64;
    let base = own_base();
    let mut got = Vec::new();
    dwarf
        .lookup(&[f - base], |_, chain| got = chain)
        .expect("lookup");
    let outer = got.last().expect("a chain");
    let name = String::from_utf8_lossy(outer.name.as_deref().unwrap_or_default()).into_owned();
    assert!(name.contains("a_distinct_outer_function"), "{got:?}");
    assert!(
        outer
            .file
            .as_deref()
            .is_some_and(|f| f.ends_with("dwarf/tests.rs")),
        "{got:?}"
    );
    assert!(outer.line > 0, "{got:?}");
}

/// The load bias of our own executable (from `/proc/self/maps`: the first mapping of it is
/// at file offset 0, address 0 in a PIE).
fn own_base() -> u64 {
    let exe = std::fs::read_link("/proc/self/exe").expect("exe");
    let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
    maps.lines()
        .find(|l| l.ends_with(exe.to_str().expect("utf-8")))
        .and_then(|l| l.split('-').next())
        .and_then(|a| u64::from_str_radix(a, 16).ok())
        .expect("our mapping")
}

#[test]
fn deep_nesting_is_refused_before_lookup() {
    let (info, abbrev) = nested_unit(100_000);
    let obj =
        elf_builder::with_sections(&[(".debug_info", 0, &info), (".debug_abbrev", 0, &abbrev)]);
    let dwarf = read(&obj, DEFAULT_LIMITS).expect("sections read");
    assert_eq!(dwarf.lookup(&[0x10], |_, _| {}), Err(DwarfError::TooDeep));
    // Shallow: accepted, and an address no unit covers has an empty chain.
    let (info, abbrev) = nested_unit(8);
    let obj =
        elf_builder::with_sections(&[(".debug_info", 0, &info), (".debug_abbrev", 0, &abbrev)]);
    let dwarf = read(&obj, DEFAULT_LIMITS).expect("sections read");
    let mut chains = Vec::new();
    dwarf
        .lookup(&[0x10], |_, c| chains.push(c))
        .expect("lookup");
    assert_eq!(chains, vec![Vec::new()]);
}

#[test]
fn missing_compressed_and_oversized_dwarf_are_refused() {
    let none = elf_builder::with_sections(&[(".text", 0, &[0xc3])]);
    assert_eq!(read(&none, DEFAULT_LIMITS).err(), Some(DwarfError::NoDwarf));
    let gnu = elf_builder::with_sections(&[(".zdebug_info", 0, b"ZLIB\0\0\0\0\0\0\x10\0junk")]);
    assert_eq!(
        read(&gnu, DEFAULT_LIMITS).err(),
        Some(DwarfError::Compressed)
    );
    // SHF_COMPRESSED with zstd (ch_type 2): refused by the reader.
    let mut zstd = 2u32.to_le_bytes().to_vec();
    zstd.extend_from_slice(&[0; 4]);
    zstd.extend_from_slice(&64u64.to_le_bytes());
    zstd.extend_from_slice(&1u64.to_le_bytes());
    zstd.extend_from_slice(&[0x28, 0xb5, 0x2f, 0xfd]);
    let z = elf_builder::with_sections(&[(".debug_info", 0x800, &zstd)]);
    assert_eq!(read(&z, DEFAULT_LIMITS).err(), Some(DwarfError::Compressed));
    let (info, abbrev) = nested_unit(1 << 16);
    let big =
        elf_builder::with_sections(&[(".debug_info", 0, &info), (".debug_abbrev", 0, &abbrev)]);
    let tight = Limits {
        max_read_bytes: 1 << 20,
        max_section_bytes: 1 << 12,
    };
    assert_eq!(read(&big, tight).err(), Some(DwarfError::OverCap));
}

#[test]
fn garbage_sections_are_errors_or_empty_never_panics() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for len in [0usize, 1, 7, 11, 64, 300, 4096] {
        let junk: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        let obj = elf_builder::with_sections(&[
            (".debug_info", 0, &junk),
            (".debug_abbrev", 0, &junk),
            (".debug_line", 0, &junk),
        ]);
        if let Ok(d) = read(&obj, DEFAULT_LIMITS) {
            let _ = d.lookup(&[0, 1, 0x1000], |_, _| {});
        }
    }
}
