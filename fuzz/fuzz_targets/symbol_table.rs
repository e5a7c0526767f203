//! The symbol-table builder (`parse/src/symbols/table.rs`) over objects built around the fuzzer's
//! symbol and string tables: building never panics, stays within the read caps, and every
//! lookup returns a name that is in a string table, or a miss.
#![no_main]

use ember_parse::elf_builder;
use ember_parse::elf_file::{ElfReader, Limits};
use ember_parse::symbols::table::SymTable;
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_read_bytes: 1 << 20,
    max_section_bytes: 256 << 10,
};

fuzz_target!(|data: &[u8]| {
    let Some(parts) = elf_builder::parts(data) else {
        return;
    };
    let bytes = elf_builder::elf(&parts);
    let Ok(mut elf) = ElfReader::new(&bytes[..], LIMITS) else {
        return;
    };
    let Ok((table, _)) = SymTable::build::<[u8], [u8]>(&mut elf, None) else {
        return;
    };
    assert!(elf.used() <= LIMITS.max_read_bytes);
    assert!(table.bytes() as u64 <= 4 * LIMITS.max_read_bytes + 4096);
    // Offsets at and around every start the fuzzer could have written, and a sweep.
    for off in (0..(1u64 << 20) + 64).step_by(4093).chain([u64::MAX, 0, 1]) {
        if let Ok(name) = table.lookup(off) {
            assert!(!name.is_empty() && !name.contains(&0));
        }
    }
});
