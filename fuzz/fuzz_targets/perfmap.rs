//! Perf map parser: never panics, respects its entry cap, and reads the same map
//! whether the file arrives whole or in appended pieces.
#![no_main]

use ember_parse::jit::perfmap::PerfMap;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, text)) = data.split_first() else {
        return;
    };
    let mut whole = PerfMap::new(64);
    let _ = whole.feed_bytes(text);
    assert!(whole.len() <= 64);

    // The same bytes appended in pieces of `split` bytes.
    let mut pieces = PerfMap::new(64);
    for chunk in text.chunks(usize::from(split).max(1)) {
        let _ = pieces.feed_bytes(chunk);
    }
    assert_eq!(whole.len(), pieces.len());
    // Probe addresses taken from the input itself, so hits are likely.
    for w in text.windows(8).step_by(7) {
        let addr = u64::from_le_bytes(w.try_into().unwrap_or([0; 8])) >> (split % 48);
        assert_eq!(whole.lookup(addr), pieces.lookup(addr));
    }
    for addr in [0, 0x1000, 0x7fff_0000_0000, u64::MAX] {
        assert_eq!(whole.lookup(addr), pieces.lookup(addr));
    }
});
