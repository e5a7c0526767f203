//! jitdump parser: never panics, never claims more bytes than it was given, respects its
//! entry cap, and parses the same records whether the file arrives whole or in two reads
//! (the second starting where the first's whole records ended, as ember reads it).
#![no_main]

use ember_parse::jit::jitdump::JitDump;
use libfuzzer_sys::fuzz_target;

/// A valid header, so the fuzzer spends its time in the records.
const HEADER: [u8; 40] = {
    let mut h = [0u8; 40];
    let magic = 0x4A69_5444u32.to_le_bytes();
    h[0] = magic[0];
    h[1] = magic[1];
    h[2] = magic[2];
    h[3] = magic[3];
    h[4] = 1; // version
    h[8] = 40; // header size
    h[12] = 62; // EM_X86_64
    h
};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    // Odd modes fuzz the header too; even ones prepend a valid one.
    let bytes: Vec<u8> = if mode & 1 == 1 {
        rest.to_vec()
    } else {
        HEADER.iter().chain(rest).copied().collect()
    };
    let mut whole = JitDump::new(32);
    let (used, _) = whole.feed(&bytes);
    assert!(used <= bytes.len());
    assert!(whole.len() <= 32);

    let cut = usize::from(mode).saturating_mul(bytes.len()) / 255;
    let mut two = JitDump::new(32);
    let (first, _) = two.feed(&bytes[..cut]);
    let (second, _) = two.feed(&bytes[first..]);
    assert_eq!(first + second, used);
    assert_eq!(whole.len(), two.len());
    for w in bytes.windows(8).step_by(5) {
        let addr = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
        assert_eq!(whole.lookup(addr), two.lookup(addr));
    }
});
