//! CPython code-object reader over a forged process: never panics, and reads at most the
//! capped amounts (code head, two strings, a line table) whatever the pointers and sizes.
#![no_main]

use ember_parse::python::code::testing::layout_312;
use ember_parse::python::code::{read_code, MemError, Memory, Types};
use ember_parse::python::Version;
use libfuzzer_sys::fuzz_target;

/// The fuzz input mapped at `BASE`; reads elsewhere fail.
struct Input<'a> {
    data: &'a [u8],
    read: usize,
}

const BASE: u64 = 0x10000;

impl Memory for Input<'_> {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.read += buf.len();
        let unmapped = MemError::Unmapped {
            addr,
            len: buf.len(),
        };
        let at = usize::try_from(addr.checked_sub(BASE).ok_or(unmapped)?).map_err(|_| unmapped)?;
        let src = self
            .data
            .get(at..at.saturating_add(buf.len()))
            .ok_or(unmapped)?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let version = Version {
        major: 3,
        minor: 10 + mode % 4,
        micro: 0,
        free_threaded: false,
    };
    // The type objects at fixed addresses inside the input, so forged objects can match.
    let types = Types {
        code: BASE + 8,
        unicode: BASE + 16,
        bytes: BASE + 24,
    };
    let mut mem = Input {
        data: rest,
        read: 0,
    };
    let fingerprint = u32::from(mode >> 4);
    let _ = read_code(
        &mut mem,
        &layout_312(),
        version,
        &types,
        BASE + 64,
        fingerprint,
    );
    assert!(mem.read <= 200 + 2 * (40 + 4 * 4096) + 24 + 64 * 1024);
});
