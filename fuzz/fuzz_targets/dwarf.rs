//! The DWARF reader (`parse/src/dwarf.rs`): on any `.debug_info`, `.debug_abbrev`,
//! `.debug_line`, `.debug_str` and `.debug_aranges` bytes it returns an error or chains
//! within its caps, never panics, hangs or overflows the stack (addr2line recurses per
//! inline level); with `.debug_aranges` it takes the path that loads units one by one.
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
    // The low bit of the first byte: `.debug_aranges` too (the last part is shared with
    // `.debug_str`, so the per-unit path sees the same bytes).
    let mut sections = vec![
        (".debug_info", 0, &rest[..cuts[0]]),
        (".debug_abbrev", 0, &rest[cuts[0]..cuts[1]]),
        (".debug_line", 0, &rest[cuts[1]..cuts[2]]),
        (".debug_str", 0, &rest[cuts[2]..]),
    ];
    if head[0] & 1 == 1 {
        sections.push((".debug_aranges", 0, &rest[cuts[2]..]));
    }
    let obj = elf_builder::with_sections(&sections);
    let Ok(mut elf) = ElfReader::new(&obj[..], LIMITS) else {
        return;
    };
    let Ok(mut dwarf) = Dwarf::open(&mut elf, LIMITS.max_read_bytes) else {
        return;
    };
    let _ = dwarf.lookup(&mut elf, &[0, 1, 0x10, 0x1000, u64::MAX], 1 << 16, |_, chain| {
        assert!(chain.len() <= MAX_INLINE_DEPTH);
        for f in chain {
            assert!(f.name.map_or(0, |n| n.len()) <= MAX_NAME);
        }
    });
});
