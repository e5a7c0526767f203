//! `_Py_DebugOffsets` parser: never panics; a table it accepts gives a layout whose
//! fields lie inside the small reads ember makes.
#![no_main]

use ember_parse::python::debug_offsets::parse;
use libfuzzer_sys::fuzz_target;

/// CPython 3.13.0's own table (its libpython's `_PyRuntime`), after the cookie.
const TABLE_313: [u64; 72] = [
    0x030d00f0, 0, 283320, 608, 632, 194968, 7272, 7264, 7344, 7400, 7656, 7640, 7648, 16, 7752, 0,
    7768, 7760, 304, 0, 8, 16, 72, 152, 160, 232, 32, 80, 8, 0, 56, 72, 70, 208, 112, 120, 128,
    136, 68, 52, 96, 104, 200, 16, 8, 416, 24, 88, 168, 32, 24, 16, 40, 24, 16, 48, 32, 40, 24, 16,
    32, 16, 24, 40, 16, 32, 64, 32, 16, 40, 240, 200,
];

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    // Odd modes parse the input as it is; even ones XOR it over a real table, so most of
    // what the fuzzer tries is nearly valid and reaches the layout.
    let bytes: Vec<u8> = if mode & 1 == 1 {
        rest.to_vec()
    } else {
        let mut b = b"xdebugpy".to_vec();
        b.extend(TABLE_313.iter().flat_map(|w| w.to_le_bytes()));
        for (i, x) in rest.iter().enumerate() {
            match b.get_mut(i + 8) {
                Some(y) => *y ^= x,
                None => b.push(*x),
            }
        }
        b
    };
    if let Ok(t) = parse(&bytes) {
        let l = t.layout;
        assert!(l.frame_size <= 4096 + 8 && l.code_size <= 4096 + 8);
        for f in [l.frame_code, l.frame_previous, l.frame_instr, l.frame_owner] {
            assert!(f < l.frame_size);
        }
        for f in [
            l.code_filename,
            l.code_name,
            l.code_linetable,
            l.code_firstlineno,
        ] {
            assert!(f < l.code_size);
        }
    }
});
