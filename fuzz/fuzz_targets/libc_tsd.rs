//! musl's `tsd` offset (`parse/src/libc.rs`), read from a container's libc: on any object
//! (the first byte picks raw bytes or an ELF built around them) and on any code bytes, an
//! answer or `None`, never a panic; a found offset is 8-aligned and at most 4096.
#![no_main]

use ember_parse::elf_builder;
use ember_parse::elf_file::{ElfReader, Limits};
use ember_parse::libc::{decode_getspecific, musl_tsd_offset};
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_read_bytes: 1 << 20,
    max_section_bytes: 256 << 10,
};

fn check(found: Option<u32>) {
    if let Some(off) = found {
        assert!(off % 8 == 0 && off <= 4096, "tsd offset {off}");
    }
}

fuzz_target!(|data: &[u8]| {
    check(decode_getspecific(data));
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
    if let Ok(mut elf) = ElfReader::new(bytes, LIMITS) {
        if let Ok(found) = musl_tsd_offset(&mut elf) {
            check(found);
        }
    }
});
