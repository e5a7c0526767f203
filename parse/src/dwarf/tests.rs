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
    Dwarf::open(&mut elf, limits.max_read_bytes)
}

/// Looks `addrs` up in `bytes`'s DWARF; the chains.
fn chains(dwarf: &mut Dwarf, bytes: &[u8], addrs: &[u64]) -> Vec<Vec<InlineFrame>> {
    let mut elf = ElfReader::new(bytes, DEFAULT_LIMITS).expect("headers");
    let mut out = vec![Vec::new(); addrs.len()];
    dwarf
        .lookup(&mut elf, addrs, u64::MAX, |i, c| out[i] = c)
        .expect("lookup");
    out
}

#[test]
fn names_and_lines_of_our_own_code() {
    let exe = own_exe();
    let mut elf = ElfReader::new(&exe[..], DEFAULT_LIMITS).expect("headers");
    let mut dwarf = Dwarf::open(&mut elf, 64 << 20).expect("tests build with debug info");
    // The function's address in the object: its runtime address less the load bias.
    let f = a_distinct_outer_function as *const () as u64;
    let base = own_base();
    let got = chains(&mut dwarf, &exe, &[f - base]).remove(0);
    // Its unit, and the few it refers to for names of functions inlined across units.
    println!("{} units, {} bytes held", dwarf.units(), dwarf.bytes());
    assert!((1..=32).contains(&dwarf.units()), "{} units", dwarf.units());
    assert!(dwarf.bytes() > 0);
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
    assert_eq!(read(&obj, DEFAULT_LIMITS).err(), Some(DwarfError::TooDeep));
    // Shallow: accepted, and an address no unit covers has an empty chain.
    let (info, abbrev) = nested_unit(8);
    let obj =
        elf_builder::with_sections(&[(".debug_info", 0, &info), (".debug_abbrev", 0, &abbrev)]);
    let mut dwarf = read(&obj, DEFAULT_LIMITS).expect("sections read");
    assert_eq!(chains(&mut dwarf, &obj, &[0x10]), vec![Vec::new()]);
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
        if let Ok(mut d) = read(&obj, DEFAULT_LIMITS) {
            let mut elf = ElfReader::new(&obj[..], DEFAULT_LIMITS).expect("headers");
            let _ = d.lookup(&mut elf, &[0, 1, 0x1000], u64::MAX, |_, _| {});
        }
    }
}

/// Function addresses of our own executable, from its symbol table: every `step`-th one.
fn own_functions(exe: &[u8], step: usize) -> Vec<u64> {
    let mut elf = ElfReader::new(exe, DEFAULT_LIMITS).expect("headers");
    let mut addrs = Vec::new();
    elf.function_symbols(object::elf::SHT_SYMTAB, |f| {
        if f.size > 4 {
            addrs.push(f.addr + f.size / 2);
        }
    })
    .expect("symbols");
    addrs.sort_unstable();
    addrs.dedup();
    addrs.into_iter().step_by(step).collect()
}

/// Loading only the units the addresses fall in gives what reading every section whole
/// gives (addr2line over all of it, the reader before units were loaded one by one), over
/// a few hundred functions of our own executable, in several lookups as windows do.
#[test]
fn units_loaded_one_by_one_answer_as_the_whole_dwarf_does() {
    let exe = own_exe();
    let addrs = own_functions(&exe, 13);
    assert!(addrs.len() > 100, "{} functions", addrs.len());
    let mut elf = ElfReader::new(&exe[..], DEFAULT_LIMITS).expect("headers");
    let mut by_unit = Dwarf::open(&mut elf, 256 << 20).expect("open");
    assert!(by_unit.index.is_some(), "rustc writes .debug_aranges");
    let mut whole = Dwarf::open(&mut elf, 256 << 20).expect("open");
    whole.index = None;
    let big = Limits {
        max_read_bytes: 1 << 30,
        max_section_bytes: 1 << 30,
    };
    let mut elf = ElfReader::new(&exe[..], big).expect("headers");
    whole.read_whole(&mut elf).expect("whole");
    let theirs = chains(&mut whole, &exe, &addrs);
    let mut ours = Vec::new();
    let mut elf = ElfReader::new(&exe[..], DEFAULT_LIMITS).expect("headers");
    for part in addrs.chunks(addrs.len() / 3 + 1) {
        let mut got = vec![Vec::new(); part.len()];
        let looked = by_unit
            .lookup(&mut elf, part, u64::MAX, |i, c| got[i] = c)
            .expect("lookup");
        println!("{looked:?}");
        ours.extend(got);
    }
    let named = ours.iter().filter(|c| !c.is_empty()).count();
    let differ: Vec<_> = addrs
        .iter()
        .zip(&ours)
        .zip(&theirs)
        .filter(|((_, o), t)| o != t)
        .collect();
    for ((a, o), t) in differ.iter().take(5) {
        println!("{a:#x}: {o:?}\n  whole: {}", t.len());
    }
    println!(
        "{named} of {} with a chain, {} differ",
        addrs.len(),
        differ.len()
    );
    assert!(
        named * 3 >= addrs.len(),
        "{named} of {} with a chain",
        addrs.len()
    );
    assert!(differ.is_empty());
    let held = by_unit.bytes();
    println!(
        "{} units loaded, {held} bytes held; whole: {} bytes",
        by_unit.units(),
        whole.bytes()
    );
    assert!(held < whole.bytes());
}

/// Under a cap too small for every unit asked for, units are let go and counted; what is
/// looked up stays right.
#[test]
fn a_cap_lets_units_go_and_counts_what_did_not_fit() {
    let exe = own_exe();
    let addrs = own_functions(&exe, 29);
    let mut elf = ElfReader::new(&exe[..], DEFAULT_LIMITS).expect("headers");
    let mut small = Dwarf::open(&mut elf, 8 << 20).expect("open");
    let mut large = Dwarf::open(&mut elf, 256 << 20).expect("open");
    let (mut skipped, mut resets) = (0, 0);
    for part in addrs.chunks(8) {
        let mut got = vec![Vec::new(); part.len()];
        let looked = small
            .lookup(&mut elf, part, u64::MAX, |i, c| got[i] = c)
            .expect("lookup");
        skipped += looked.skipped.over_cap;
        resets += u64::from(looked.reset);
        assert!(small.bytes() <= 8 << 20, "{} held", small.bytes());
        let want = chains(&mut large, &exe, part);
        for (g, w) in got.iter().zip(&want) {
            assert!(g.is_empty() || g == w);
        }
    }
    println!("{skipped} addresses over the cap, {resets} resets");
    assert!(resets > 0 || skipped > 0);
}

/// A unit that does not fit under the cap is not tried again (each try scans all of it)
/// while as much is held: asking for it in every window cost more than loading every other.
#[test]
fn a_unit_over_the_cap_is_tried_again_only_once_less_is_held() {
    let exe = own_exe();
    let addrs = own_functions(&exe, 7);
    let cap = 4 << 20;
    // The first address whose unit (with what it refers to) does not fit alone.
    let (addr, first) = addrs
        .iter()
        .find_map(|&a| {
            // A reader per try: a reader caps what it reads.
            let mut elf = ElfReader::new(&exe[..], DEFAULT_LIMITS).expect("headers");
            let mut d = Dwarf::open(&mut elf, cap).expect("open");
            let looked = d.lookup(&mut elf, &[a], u64::MAX, |_, _| {}).ok()?;
            (looked.skipped.over_cap == 1).then_some((a, looked))
        })
        .expect("a unit over the cap");
    assert!(first.units_tried >= 1, "{first:?}");
    let mut elf = ElfReader::new(&exe[..], DEFAULT_LIMITS).expect("headers");
    let mut d = Dwarf::open(&mut elf, cap).expect("open");
    let once = d
        .lookup(&mut elf, &[addr], u64::MAX, |_, c| assert!(c.is_empty()))
        .expect("lookup");
    assert_eq!(once.skipped.over_cap, 1);
    for _ in 0..3 {
        let again = d
            .lookup(&mut elf, &[addr], u64::MAX, |_, c| assert!(c.is_empty()))
            .expect("lookup");
        assert_eq!(again.skipped.over_cap, 1, "{again:?}");
        assert_eq!(
            again.units_tried, 0,
            "tried again with as much held: {again:?}"
        );
    }
    // It did not fit with nothing else held: letting the units go changes nothing.
    d.reset();
    let later = d
        .lookup(&mut elf, &[addr], u64::MAX, |_, _| {})
        .expect("lookup");
    assert_eq!(
        (later.units_tried, later.skipped.over_cap),
        (0, 1),
        "{later:?}"
    );
    assert!(d.bytes() <= cap, "{} held", d.bytes());
}

/// `.debug_aranges` naming `units` (offsets in `.debug_info`), each covering 0x100 bytes
/// from `0x1000 * (i + 1)`.
fn aranges(units: &[u32]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, &u) in units.iter().enumerate() {
        let mut body = 2u16.to_le_bytes().to_vec();
        body.extend_from_slice(&u.to_le_bytes());
        body.extend_from_slice(&[8, 0, 0, 0, 0, 0]);
        body.extend_from_slice(&(0x1000 * (i as u64 + 1)).to_le_bytes());
        body.extend_from_slice(&0x100u64.to_le_bytes());
        body.extend_from_slice(&[0; 16]);
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
    }
    out
}

/// The per-unit path on hostile units: index entries pointing into garbage, mid-unit, past
/// the end, at a unit too deep; every lookup is an answer or a counted skip, never a panic.
#[test]
fn hostile_units_found_by_aranges_are_skipped_and_counted() {
    let (deep, abbrev) = nested_unit(100_000);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let junk: Vec<u8> = (0..4096)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect();
    let mut info = deep.clone();
    info.extend_from_slice(&junk);
    let at_junk = deep.len() as u32;
    let units = [0, 3, at_junk, at_junk + 100, u32::MAX - 8];
    let index = aranges(&units);
    let obj = elf_builder::with_sections(&[
        (".debug_info", 0, &info),
        (".debug_abbrev", 0, &abbrev),
        (".debug_aranges", 0, &index),
        (".debug_line", 0, &junk),
        (".debug_str", 0, &junk),
    ]);
    let mut dwarf = read(&obj, DEFAULT_LIMITS).expect("index read");
    let addrs: Vec<u64> = (0..units.len() as u64 + 1)
        .map(|i| 0x1000 * (i + 1) + 8)
        .collect();
    let mut elf = ElfReader::new(&obj[..], DEFAULT_LIMITS).expect("headers");
    let looked = dwarf
        .lookup(&mut elf, &addrs, u64::MAX, |_, c| assert!(c.is_empty()))
        .expect("lookup");
    let s = looked.skipped;
    println!("{looked:?}");
    assert_eq!(s.too_deep, 1, "{looked:?}");
    assert_eq!(s.no_unit, 1, "{looked:?}");
    assert_eq!(
        s.too_deep + s.malformed + s.over_cap + s.no_unit,
        addrs.len() as u64
    );
    // Asked again: nothing is read again.
    let again = dwarf
        .lookup(&mut elf, &addrs, u64::MAX, |_, _| {})
        .expect("lookup");
    assert_eq!((again.units_read, again.bytes_read), (0, 0));
}

/// A lookup starts units only while its read budget lasts: with none it reads nothing and
/// defers every address; with a small one it loads at least one unit, passes the budget by
/// at most that pass's first unit and what it refers to, and defers the rest, which a
/// later lookup answers as a lookup with no budget does.
#[test]
fn a_read_budget_defers_units_to_a_later_lookup() {
    let exe = own_exe();
    let addrs = own_functions(&exe, 7);
    let mut elf = ElfReader::new(&exe[..], DEFAULT_LIMITS).expect("headers");
    // A cap nothing reaches: no unit is let go, so answers do not depend on the order units
    // were loaded in.
    let mut paced = Dwarf::open(&mut elf, 4 << 30).expect("open");
    let mut free = Dwarf::open(&mut elf, 4 << 30).expect("open");
    let want = chains(&mut free, &exe, &addrs);
    let none = paced
        .lookup(&mut elf, &addrs, 0, |_, c| assert!(c.is_empty()))
        .expect("lookup");
    assert_eq!((none.bytes_read, none.units_read), (0, 0));
    let in_units = addrs.len() as u64 - none.skipped.no_unit;
    assert!(in_units > 100, "{none:?}");
    assert_eq!(none.deferred.len() as u64, in_units);
    assert_eq!(none.skipped.deferred, in_units);
    let mut got = vec![Vec::new(); addrs.len()];
    let mut lookups = 0;
    let mut pending: Vec<usize> = (0..addrs.len()).collect();
    while !pending.is_empty() {
        lookups += 1;
        assert!(
            lookups <= addrs.len(),
            "no progress: {} pending",
            pending.len()
        );
        let part: Vec<u64> = pending.iter().map(|&i| addrs[i]).collect();
        // A reader per lookup, as each window makes one (a reader caps what it reads).
        let mut elf = ElfReader::new(&exe[..], DEFAULT_LIMITS).expect("headers");
        let looked = paced
            .lookup(&mut elf, &part, 1, |j, c| got[pending[j]] = c)
            .expect("lookup");
        assert!(looked.units_read >= 1, "{looked:?}");
        assert!(!looked.reset && looked.skipped.over_cap == 0, "{looked:?}");
        pending = looked.deferred.iter().map(|&j| pending[j]).collect();
    }
    assert!(
        lookups > 1,
        "a budget of one byte loaded every unit at once"
    );
    assert_eq!(got, want);
}
