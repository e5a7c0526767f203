//! CPython `str` decoding: never panics, whatever the head and characters; a header it
//! accepts is within the caps, and decoding gives at most 4096 characters.
#![no_main]

use ember_parse::python::code::testing::gil_layout;
use ember_parse::python::unicode::{decode, header, CharKind, MAX_CHARS};
use ember_parse::python::Version;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let version = Version {
        major: 3,
        minor: 8 + mode % 7,
        micro: 0,
        free_threaded: mode & 0x80 != 0,
    };
    let layout = gil_layout(version.minor);
    if let Ok(h) = header(version, rest, &layout) {
        assert!(h.bytes <= 4 * MAX_CHARS);
        assert_eq!(h.bytes % h.kind.width(), 0);
        let at = usize::from(h.data);
        if let Some(chars) = rest.get(at..at.saturating_add(h.bytes)) {
            let _ = decode(h.kind, chars);
        }
    }
    for kind in [
        CharKind::Ascii,
        CharKind::Latin1,
        CharKind::Ucs2,
        CharKind::Ucs4,
    ] {
        if let Ok(s) = decode(kind, rest) {
            assert!(s.chars().count() <= MAX_CHARS);
            assert_eq!(s.chars().count() * kind.width(), rest.len());
        }
    }
});
