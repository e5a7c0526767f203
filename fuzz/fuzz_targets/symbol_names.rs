//! Symbol names as a table stores them (`parse/src/elf_file.rs` `symbol_name`,
//! `parse/src/symbols/table.rs`): symbols at fuzzer-chosen offsets into a fuzzer-chosen string
//! table (names without a NUL, names inside names, offsets past the end). Every name a
//! lookup gives is the table's bytes from the symbol's offset, to the NUL or cut at
//! `MAX_SYMBOL_NAME`; what is read and built stays within the read cap; the demangled
//! form stays within its own cap.
//!
//! Input: one byte of symbol count, two bytes of name offset per symbol, then the table.
#![no_main]

use ember_parse::elf_builder;
use ember_parse::elf_file::{symbol_name, ElfReader, Limits, MAX_SYMBOL_NAME};
use ember_parse::symbols::demangle::{demangle, Outcome, MAX_DEMANGLED};
use ember_parse::symbols::table::SymTable;
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_read_bytes: 1 << 20,
    max_section_bytes: 256 << 10,
};

fuzz_target!(|data: &[u8]| {
    let Some((&count, rest)) = data.split_first() else {
        return;
    };
    let count = usize::from(count);
    let Some((offsets, strtab)) = rest.split_at_checked(count * 2) else {
        return;
    };
    let offsets: Vec<u32> = offsets
        .chunks_exact(2)
        .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
        .collect();
    let mut symtab = vec![0u8; 24];
    for (i, &at) in offsets.iter().enumerate() {
        symtab.extend_from_slice(&at.to_le_bytes());
        symtab.push(0x12); // STB_GLOBAL, STT_FUNC
        symtab.push(0);
        symtab.extend_from_slice(&1u16.to_le_bytes());
        symtab.extend_from_slice(&(0x1000 + 16 * i as u64).to_le_bytes());
        symtab.extend_from_slice(&16u64.to_le_bytes());
    }
    let bytes = elf_builder::elf(&elf_builder::Parts {
        symtab: &symtab,
        strtab,
        dynsym: &[],
        dynstr: &[],
        compressed: false,
    });
    let Ok(mut elf) = ElfReader::new(&bytes[..], LIMITS) else {
        return;
    };
    let Ok((table, built)) = SymTable::build::<[u8], [u8]>(&mut elf, None) else {
        return;
    };
    assert!(elf.used() <= LIMITS.max_read_bytes);
    assert!(built.names_cut <= offsets.len() as u64);
    for (i, &at) in offsets.iter().enumerate() {
        let Ok(name) = table.lookup(0x1000 + 16 * i as u64) else {
            continue;
        };
        let (want, cut) = symbol_name(strtab, at).expect("a named symbol's offset is in the table");
        assert!(!name.is_empty() && name.len() <= MAX_SYMBOL_NAME);
        assert!(!name.contains(&0));
        assert_eq!(name, want, "symbol {i} at {at}");
        assert_eq!(
            cut,
            strtab.len() - at as usize > MAX_SYMBOL_NAME
                && !strtab[at as usize..]
                    .iter()
                    .take(MAX_SYMBOL_NAME + 1)
                    .any(|&b| b == 0)
        );
        let (shown, outcome) = demangle(&name);
        if outcome == Outcome::Demangled {
            assert!(shown.len() <= MAX_DEMANGLED);
        } else {
            assert_eq!(shown, String::from_utf8_lossy(&name));
        }
    }
});
