//! The decoders against the interpreters' own answers: `testdata/lines-*.txt` as
//! `testdata/dump_lines.py` wrote them on each interpreter here, and the same script run
//! live by every interpreter present.

use super::*;
use std::path::Path;
use std::process::Command;

/// One code object of a dump: its table and the interpreter's line per code unit.
struct Case {
    name: String,
    first: u32,
    table: Vec<u8>,
    /// `PyCode_Addr2Line` per code unit.
    addr2line: Vec<Option<u32>>,
    /// `co_lines()` (or `dis.findlinestarts`) per code unit.
    colines: Vec<Option<u32>>,
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// `start-end:line` runs over code units, expanded.
fn runs(s: &str, units: usize) -> Vec<Option<u32>> {
    let mut out = vec![None; units];
    for run in s.split_whitespace() {
        let (range, line) = run.split_once(':').unwrap();
        let (a, b) = range.split_once('-').unwrap();
        let line = (line != "-").then(|| line.parse().unwrap());
        out[a.parse::<usize>().unwrap()..b.parse().unwrap()].fill(line);
    }
    out
}

/// The version a dump names and its code objects.
fn parse_dump(text: &str) -> (Version, Vec<Case>) {
    let mut lines = text.lines();
    let head = lines.next().unwrap().strip_prefix("# python ").unwrap();
    let head = head.split(' ').next().unwrap();
    let mut v = head.split('.').map(|p| p.parse::<u8>().unwrap());
    let version = Version {
        major: v.next().unwrap(),
        minor: v.next().unwrap(),
        micro: v.next().unwrap(),
        free_threaded: false,
    };
    let mut cases = Vec::new();
    while let Some(code) = lines.next() {
        let f: Vec<&str> = code.split(' ').collect();
        assert_eq!(f[0], "code", "{code}");
        let field = |k: &str| f.iter().find_map(|x| x.strip_prefix(k)).unwrap();
        let units: usize = field("units=").parse().unwrap();
        let a2l = lines.next().unwrap().strip_prefix("addr2line ").unwrap();
        let col = lines.next().unwrap().strip_prefix("colines ").unwrap();
        let addr2line = runs(a2l, units);
        let colines = if col == "=" {
            addr2line.clone()
        } else {
            runs(col, units)
        };
        cases.push(Case {
            name: f[1].to_string(),
            first: field("first=").parse().unwrap(),
            table: hex(field("table=")),
            addr2line,
            colines,
        });
    }
    (version, cases)
}

/// Checks every code unit of every code object with both entry points; returns the number
/// of units checked.
fn check_dump(text: &str) -> usize {
    let (version, cases) = parse_dump(text);
    let kind = kind_for(version).unwrap();
    let mut checked = 0;
    let mut wrong = Vec::new();
    for c in &cases {
        let mut from_runs = vec![None; c.addr2line.len()];
        for r in lines(kind, &c.table, c.first) {
            let end = (r.end / 2).min(from_runs.len() as u32);
            from_runs[(r.start / 2).min(end) as usize..end as usize].fill(r.line);
        }
        for (u, want) in c.addr2line.iter().enumerate() {
            let got = line_at(kind, &c.table, c.first, u as u32);
            if got != *want || c.colines[u] != *want || from_runs[u] != *want {
                wrong.push(format!(
                    "{} unit {u}: line_at {got:?} runs {:?} addr2line {want:?} co_lines {:?}",
                    c.name, from_runs[u], c.colines[u]
                ));
            }
            checked += 1;
        }
    }
    assert!(
        wrong.is_empty(),
        "{version}: {} of {checked} units wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert!(cases.len() >= 15 && checked > 1000, "{version}: small dump");
    checked
}

#[test]
fn committed_dumps_match_every_unit() {
    for (name, text) in [
        ("3.8.18", include_str!("../testdata/lines-3.8.18.txt")),
        ("3.9.18", include_str!("../testdata/lines-3.9.18.txt")),
        ("3.10.13", include_str!("../testdata/lines-3.10.13.txt")),
        ("3.11.7", include_str!("../testdata/lines-3.11.7.txt")),
        ("3.12.1", include_str!("../testdata/lines-3.12.1.txt")),
        ("3.13.0", include_str!("../testdata/lines-3.13.0.txt")),
    ] {
        let n = check_dump(text);
        eprintln!("{name}: {n} code units match");
    }
}

/// The interpreters of this machine: pyenv's shared builds and Debian's static 3.11.
pub(crate) const INTERPRETERS: &[&str] = &[
    "/root/.pyenv/versions/3.8.18/bin/python3",
    "/root/.pyenv/versions/3.9.18/bin/python3",
    "/root/.pyenv/versions/3.10.13/bin/python3",
    "/root/.pyenv/versions/3.11.7/bin/python3",
    "/root/.pyenv/versions/3.12.1/bin/python3",
    "/root/.pyenv/versions/3.13.0/bin/python3",
    "/usr/bin/python3.11",
];

/// Runs `testdata/<script>` under each interpreter of [`INTERPRETERS`] present (the others
/// skipped, said so) and hands `check` its name and output.
pub(crate) fn each_interpreter(script: &str, check: impl Fn(&str, &str)) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/python/testdata")
        .join(script);
    for python in INTERPRETERS {
        if !Path::new(python).exists() {
            eprintln!("SKIP {python}: not installed");
            continue;
        }
        let out = Command::new(python).arg(&script).output().unwrap();
        assert!(
            out.status.success(),
            "{python}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        check(python, &String::from_utf8(out.stdout).unwrap());
    }
}

#[test]
fn live_interpreters_match_every_unit() {
    each_interpreter("dump_lines.py", |python, out| {
        let n = check_dump(out);
        eprintln!("{python}: {n} code units match");
    });
}

#[test]
fn kinds_per_version() {
    let v = |minor| Version {
        major: 3,
        minor,
        micro: 0,
        free_threaded: false,
    };
    assert_eq!(kind_for(v(7)), None);
    assert_eq!(kind_for(v(9)), Some(TableKind::Lnotab));
    assert_eq!(kind_for(v(10)), Some(TableKind::Linetable310));
    assert_eq!(kind_for(v(14)), Some(TableKind::Locations));
    assert_eq!(kind_for(v(15)), None);
}

const KINDS: [TableKind; 3] = [
    TableKind::Lnotab,
    TableKind::Linetable310,
    TableKind::Locations,
];

#[test]
fn empty_and_odd_tables() {
    // No table: co_lnotab keeps the first line everywhere, the others know nothing.
    assert_eq!(line_at(TableKind::Lnotab, &[], 7, 1000), Some(7));
    assert_eq!(line_at(TableKind::Linetable310, &[], 7, 0), None);
    assert_eq!(line_at(TableKind::Locations, &[], 7, 0), None);
    // An odd trailing byte of a pair table is ignored.
    assert_eq!(line_at(TableKind::Linetable310, &[4, 1, 9], 7, 1), Some(8));
    assert_eq!(line_at(TableKind::Linetable310, &[4, 1, 9], 7, 2), None);
}

#[test]
fn location_entries_by_hand() {
    // Code 13 (no columns), 2 units, delta +3 (svarint 6); code 15 (none), 1 unit;
    // code 11 (one line, +1), 1 unit with two column bytes; code 0 (short), 1 unit.
    let t = [
        0x80 | 13 << 3 | 1,
        6,
        0x80 | 15 << 3,
        0x80 | 11 << 3,
        4,
        9,
        0x80,
        0x12,
    ];
    let got: Vec<_> = (0..6)
        .map(|u| line_at(TableKind::Locations, &t, 10, u))
        .collect();
    assert_eq!(got, [Some(13), Some(13), None, Some(14), Some(14), None]);
    // A long varint: 3 groups (delta -70000 = svarint 140001).
    let v = 140001u32;
    let t = [
        0xf0,
        (v & 63) as u8 | 64,
        (v >> 6 & 63) as u8 | 64,
        (v >> 12) as u8,
    ];
    assert_eq!(line_at(TableKind::Locations, &t, 70005, 0), Some(5));
    // Below line 0: no line.
    assert_eq!(line_at(TableKind::Locations, &t, 5, 0), None);
}

#[test]
fn hostile_tables_end_quietly() {
    // A varint of six groups, one cut short, an entry without its high bit.
    let six = [0xf0, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x01];
    assert_eq!(line_at(TableKind::Locations, &six, 1, 0), None);
    assert_eq!(line_at(TableKind::Locations, &[0xf0, 0x42], 1, 0), None);
    assert_eq!(line_at(TableKind::Locations, &[0x10, 0x80], 1, 0), None);
    // Deltas that would run a line past u32: no line, no overflow.
    let up = [0xf0, 0x7e, 0x7f, 0x7f, 0x7f, 0x3f].repeat(20);
    assert!(lines(TableKind::Locations, &up, u32::MAX,).all(|r| r.line.is_none()));
    let down = [255u8, 0x80].repeat(1000);
    assert_eq!(line_at(TableKind::Lnotab, &down, 1, u32::MAX), None);
    assert_eq!(line_at(TableKind::Linetable310, &down, 1, 3), None);
    // Tables past the cap are read up to it only.
    let big = [0x80u8].repeat(MAX_TABLE + 100);
    assert_eq!(lines(TableKind::Locations, &big, 1).count(), MAX_TABLE);
    for kind in KINDS {
        for t in [&six[..], &up, &down, &big] {
            let mut end = 0;
            for r in lines(kind, t, 1) {
                assert!(r.start == end && r.end > r.start, "{kind:?} {r:?}");
                end = r.end;
            }
            let _ = line_at(kind, t, 0, u32::MAX);
        }
    }
}
