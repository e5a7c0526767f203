//! Demangling (`parse/src/symbols/demangle.rs`) of any name a file can hold: never panics past its
//! catch, returns promptly (run with `-timeout`: a name that demangles to gigabytes stops at
//! the first write past the cap) and gives either a demangled name within `MAX_DEMANGLED`
//! bytes or the name as stored. The first byte picks the input: the bytes as they are, or
//! behind `_Z` (C++) or `_R` (Rust v0), or a nesting C++ name of that many levels with the
//! rest appended, so the fuzzer starts inside the demanglers' grammars.
#![no_main]

use ember_parse::symbols::demangle::{
    demangle, nesting_name, Outcome, MAX_DEMANGLE, MAX_DEMANGLED,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let name: Vec<u8> = match mode % 4 {
        0 => rest.to_vec(),
        1 => [b"_Z", rest].concat(),
        2 => [b"_R", rest].concat(),
        _ => [nesting_name(usize::from(mode / 4)).as_bytes(), rest].concat(),
    };
    let (out, outcome) = demangle(&name);
    match outcome {
        Outcome::Demangled => {
            assert!(name.len() <= MAX_DEMANGLE);
            assert!(out.len() <= MAX_DEMANGLED, "{} bytes", out.len());
        }
        Outcome::AsStored | Outcome::TooLong | Outcome::Panicked => {
            assert_eq!(out, String::from_utf8_lossy(&name));
        }
    }
});
