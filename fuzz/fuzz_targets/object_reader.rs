//! The safe object reader (`parse/src/elf_file.rs`): on any bytes it returns an error or
//! data within its caps, never panics, hangs or allocates past them. Even first bytes hand
//! the rest over as a whole file; odd ones build an ELF around it (`elf_builder`), with
//! compressed string tables when the fuzzer says so.
#![no_main]

use ember_parse::elf_builder;
use ember_parse::elf_file::{ElfReader, Limits};
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_read_bytes: 1 << 20,
    max_section_bytes: 256 << 10,
};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let built;
    let bytes: &[u8] = if mode & 1 == 0 {
        rest
    } else {
        let Some(parts) = elf_builder::parts(rest) else {
            return;
        };
        built = elf_builder::elf(&parts);
        &built
    };
    let Ok(mut elf) = ElfReader::new(bytes, LIMITS) else {
        return;
    };
    let _ = elf.build_id();
    for i in 0..elf.sections().len() {
        if let Ok(d) = elf.section_data(i) {
            assert!(d.len() as u64 <= LIMITS.max_section_bytes);
        }
    }
    for kind in [2, 11] {
        let _ = elf.function_symbols(kind, |s| assert!(!s.name.is_empty()));
    }
    assert!(elf.used() <= LIMITS.max_read_bytes);
});
