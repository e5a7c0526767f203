//! The DWARF reader (`parse/src/dwarf.rs`): on any `.debug_info`, `.debug_abbrev`,
//! `.debug_line` and `.debug_str` bytes it returns an error or chains within its caps, never
//! panics, hangs or overflows the stack (addr2line recurses per inline level).
#![no_main]

use ember_parse::dwarf::{Dwarf, MAX_INLINE_DEPTH, MAX_NAME};
use ember_parse::elf_builder;
use ember_parse::elf_file::{ElfReader, Limits};
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_read_bytes: 1 << 20,
    max_section_bytes: 256 << 10,
};

fuzz_target!(|data: &[u8]| {
    let Some((head, rest)) = data.split_at_checked(3) else {
        return;
    };
    let cut = |b: u8| usize::from(b) * rest.len() / 255;
    let mut cuts = [cut(head[0]), cut(head[1]), cut(head[2])];
    cuts.sort_unstable();
    let obj = elf_builder::with_sections(&[
        (".debug_info", 0, &rest[..cuts[0]]),
        (".debug_abbrev", 0, &rest[cuts[0]..cuts[1]]),
        (".debug_line", 0, &rest[cuts[1]..cuts[2]]),
        (".debug_str", 0, &rest[cuts[2]..]),
    ]);
    let Ok(mut elf) = ElfReader::new(&obj[..], LIMITS) else {
        return;
    };
    let Ok(dwarf) = Dwarf::read(&mut elf) else {
        return;
    };
    let _ = dwarf.lookup(&[0, 1, 0x10, 0x1000, u64::MAX], |_, chain| {
        assert!(chain.len() <= MAX_INLINE_DEPTH);
        for f in chain {
            assert!(f.name.map_or(0, |n| n.len()) <= MAX_NAME);
        }
    });
});
