//! CPython line-table decoders: never panic, whatever the table; the runs they give start
//! at byte 0, are non-empty and contiguous, and `line_at` answers what the runs say.
#![no_main]

use ember_parse::python::lines::{line_at, lines, TableKind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((head, table)) = data.split_first_chunk::<5>() else {
        return;
    };
    let kind = match head[0] % 3 {
        0 => TableKind::Lnotab,
        1 => TableKind::Linetable310,
        _ => TableKind::Locations,
    };
    let first = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    let mut end = 0u32;
    let mut runs = Vec::new();
    for r in lines(kind, table, first) {
        assert_eq!(r.start, end);
        assert!(r.end > r.start);
        end = r.end;
        runs.push(r);
        if end == u32::MAX {
            break;
        }
    }
    // Every table entry gives at most one run.
    assert!(runs.len() <= table.len() + 1);
    // The first code unit starting in each run gets the run's line.
    for r in runs.iter().take(64) {
        let unit = r.start.div_ceil(2);
        if u64::from(unit) * 2 < u64::from(r.end) {
            assert_eq!(line_at(kind, table, first, unit), r.line);
        }
    }
    let _ = line_at(kind, table, first, u32::MAX);
});
