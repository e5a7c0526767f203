//! The decoder against `str` objects as each interpreter here lays them out
//! (`testdata/strings-*.txt` from `testdata/dump_strings.py`, and the script run live).

use super::*;
use crate::python::code::testing::gil_layout;
use crate::python::lines::tests::each_interpreter;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

fn version(text: &str) -> Version {
    let head = text
        .lines()
        .next()
        .unwrap()
        .strip_prefix("# python ")
        .unwrap();
    let mut v = head.split([' ', '.']).map(|p| p.parse::<u8>().unwrap());
    Version {
        major: v.next().unwrap(),
        minor: v.next().unwrap(),
        micro: v.next().unwrap(),
        free_threaded: false,
    }
}

/// Decodes every string of a dump as the agent will (header, then the character bytes at
/// its offset) and checks the refusals; returns how many strings were checked.
fn check_dump(text: &str) -> usize {
    let v = version(text);
    let layout = gil_layout(v.minor);
    let first = text.lines().next().unwrap();
    let sizes = format!(
        "ascii={} compact={}",
        layout.unicode_ascii_data, layout.unicode_compact_data
    );
    assert!(first.ends_with(&sizes), "{first}: sizes are not {sizes}");
    let mut n = 0;
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(' ').collect();
        let (name, raw) = (f[1], hex(f[3]));
        let got = header(v, &raw, &layout);
        match f[0] {
            "str" => {
                let want: String = f[2]
                    .split(',')
                    .filter(|p| *p != "-")
                    .map(|p| u32::from_str_radix(p, 16).unwrap())
                    .map(|c| char::from_u32(c).unwrap_or('\u{fffd}'))
                    .collect();
                let h = got.unwrap_or_else(|e| panic!("{v} {name}: {e}"));
                let at = usize::from(h.data);
                let s = decode(h.kind, &raw[at..at + h.bytes]).unwrap();
                assert_eq!(s, want, "{v} {name}");
                // What follows the characters is CPython's NUL terminator.
                assert!(raw[at + h.bytes..].iter().all(|b| *b == 0), "{v} {name}");
            }
            "head" => match (f[2], got) {
                ("long", Err(StrError::TooLong(_))) | ("legacy", Err(StrError::Legacy)) => {}
                (want, Ok(h)) if want == format!("bytes={}", h.bytes) => {}
                (want, got) => panic!("{v} {name}: want {want}, got {got:?}"),
            },
            other => panic!("bad line {other}"),
        }
        n += 1;
    }
    n
}

#[test]
fn committed_dumps_decode() {
    for text in [
        include_str!("../testdata/strings-3.8.18.txt"),
        include_str!("../testdata/strings-3.9.18.txt"),
        include_str!("../testdata/strings-3.10.13.txt"),
        include_str!("../testdata/strings-3.11.7.txt"),
        include_str!("../testdata/strings-3.12.1.txt"),
        include_str!("../testdata/strings-3.13.0.txt"),
    ] {
        assert_eq!(check_dump(text), 15);
    }
}

#[test]
fn live_interpreters_decode() {
    each_interpreter("dump_strings.py", |python, out| {
        let n = check_dump(out);
        eprintln!("{python}: {n} strings decode");
    });
}

/// A head with `state` and `length` set, 3.12 GIL offsets.
fn head(state: u32, length: i64) -> Vec<u8> {
    let mut h = vec![0u8; 56];
    h[32..36].copy_from_slice(&state.to_le_bytes());
    h[16..24].copy_from_slice(&length.to_le_bytes());
    h
}

const V312: Version = Version {
    major: 3,
    minor: 12,
    micro: 1,
    free_threaded: false,
};

#[test]
fn hostile_heads_are_refused() {
    let l = gil_layout(12);
    // kind 1, compact, ascii: fine; then each field forged.
    let ok = 1 << 2 | 1 << 5 | 1 << 6;
    assert_eq!(
        header(V312, &head(ok, 3), &l),
        Ok(StrHeader {
            data: 40,
            bytes: 3,
            kind: CharKind::Ascii
        })
    );
    assert_eq!(
        header(V312, &head(ok, 3)[..35], &l),
        Err(StrError::Short(35))
    );
    assert_eq!(header(V312, &head(ok, -1), &l), Err(StrError::Negative(-1)));
    assert_eq!(
        header(V312, &head(ok, 1 << 40), &l),
        Err(StrError::TooLong(1 << 40))
    );
    assert_eq!(
        header(V312, &head(ok, 4097), &l),
        Err(StrError::TooLong(4097))
    );
    for bad in [0, 3, 5, 7] {
        let state = bad << 2 | 1 << 5;
        assert_eq!(
            header(V312, &head(state, 1), &l),
            Err(StrError::Kind(state))
        );
    }
    // ascii on a two-byte kind; a legacy string.
    let state = 2 << 2 | 1 << 5 | 1 << 6;
    assert_eq!(
        header(V312, &head(state, 1), &l),
        Err(StrError::Kind(state))
    );
    assert_eq!(header(V312, &head(4 << 2, 1), &l), Err(StrError::Legacy));
    let h = header(V312, &head(4 << 2 | 1 << 5, 4096), &l).unwrap();
    assert_eq!((h.data, h.bytes, h.kind), (56, 16384, CharKind::Ucs4));
}

#[test]
fn free_threaded_314_moves_the_bits() {
    let l = gil_layout(12);
    let v = Version {
        minor: 14,
        free_threaded: true,
        ..V312
    };
    // 3.14t: `interned` is a byte; kind at bit 8, compact 11, ascii 12.
    let state = 2 << 8 | 1 << 11 | 3;
    assert_eq!(header(v, &head(state, 2), &l).unwrap().kind, CharKind::Ucs2);
    // The 3.13t and GIL bits mean nothing there (kind 0).
    assert_eq!(
        header(v, &head(2 << 2 | 1 << 5, 2), &l),
        Err(StrError::Kind(2 << 2 | 1 << 5))
    );
    let v313t = Version {
        minor: 13,
        free_threaded: true,
        ..V312
    };
    let h = header(v313t, &head(2 << 2 | 1 << 5, 2), &l).unwrap();
    assert_eq!(h.kind, CharKind::Ucs2);
}

#[test]
fn decode_bad_characters() {
    assert_eq!(
        decode(CharKind::Ascii, b"ab\x80"),
        Err(StrError::Char(0x80))
    );
    assert_eq!(decode(CharKind::Latin1, b"ab\x80").unwrap(), "ab\u{80}");
    assert_eq!(
        decode(CharKind::Ucs2, &[0x41, 0, 0]),
        Err(StrError::Ragged(3))
    );
    assert_eq!(decode(CharKind::Ucs2, &[0x00, 0xd8]).unwrap(), "\u{fffd}");
    let past = 0x11_0000u32.to_le_bytes();
    assert_eq!(
        decode(CharKind::Ucs4, &past),
        Err(StrError::Char(0x11_0000))
    );
    assert_eq!(
        decode(CharKind::Ucs4, &0xdfffu32.to_le_bytes()).unwrap(),
        "\u{fffd}"
    );
    let many = vec![b'a'; MAX_CHARS + 1];
    assert_eq!(
        decode(CharKind::Latin1, &many),
        Err(StrError::TooLong(4097))
    );
    assert_eq!(
        decode(CharKind::Ascii, &many[1..]).unwrap().len(),
        MAX_CHARS
    );
}
