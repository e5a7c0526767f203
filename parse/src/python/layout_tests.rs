//! The table against the real interpreters: `testdata/offsets.py` measures each offset
//! inside a running CPython (searching live objects for values known from Python) and
//! prints it; every field of [`layout_for`]'s answer must equal what it measured.

use super::*;
use std::collections::HashMap;
use std::process::Command;

/// The interpreters this kind of machine ships: pyenv's shared builds and Debian's static
/// `python3.11`. An absent one is skipped, said on stderr.
const INTERPRETERS: &[&str] = &[
    "/root/.pyenv/versions/3.8.18/bin/python3",
    "/root/.pyenv/versions/3.9.18/bin/python3",
    "/root/.pyenv/versions/3.10.13/bin/python3",
    "/root/.pyenv/versions/3.11.7/bin/python3",
    "/root/.pyenv/versions/3.12.1/bin/python3",
    "/root/.pyenv/versions/3.13.0/bin/python3",
    "/usr/bin/python3.11",
];

fn version(minor: u8) -> Version {
    Version {
        major: 3,
        minor,
        micro: 0,
        free_threaded: false,
    }
}

/// `name value` lines; `none` is `None`.
fn measure(python: &str) -> (Version, HashMap<String, Option<u32>>) {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/python/testdata/offsets.py"
    );
    // The script finds offsets by searching live memory for known values; a value that
    // happens to appear twice makes it give up (seen once in ~100 runs on a loaded host),
    // so it gets three tries. Values it does print are exact, and compared below.
    let mut out = Command::new(python)
        .arg(script)
        .output()
        .expect("run python");
    for _ in 0..2 {
        if out.status.success() {
            break;
        }
        eprintln!(
            "{python}: offsets.py gave up, again: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out = Command::new(python)
            .arg(script)
            .output()
            .expect("run python");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{python}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut values = HashMap::new();
    let mut found = None;
    for line in stdout.lines() {
        let (name, value) = line.split_once(' ').expect("name value");
        if name == "version" {
            let mut parts = value.split('.').map(|p| p.parse::<u8>().expect("number"));
            let mut v = version(0);
            (v.major, v.minor, v.micro) = (
                parts.next().expect("major"),
                parts.next().expect("minor"),
                parts.next().expect("micro"),
            );
            found = Some(v);
            continue;
        }
        let value = (value != "none").then(|| value.parse().expect("offset"));
        values.insert(name.to_string(), value);
    }
    (found.expect("version line"), values)
}

/// Every measured field of `l`, by the script's names.
fn fields(l: &Layout) -> Vec<(&'static str, Option<u32>)> {
    let s = |v: u16| Some(u32::from(v));
    let o = |v: Option<u16>| v.map(u32::from);
    vec![
        ("runtime_autotss", Some(l.runtime_autotss)),
        ("runtime_tstate_current", l.runtime_tstate_current),
        ("tstate_frame", s(l.tstate_frame)),
        ("cframe_current", o(l.cframe_current)),
        ("tstate_native_id", o(l.tstate_native_id)),
        ("tstate_thread_id", s(l.tstate_thread_id)),
        ("frame_code", s(l.frame_code)),
        ("frame_previous", s(l.frame_previous)),
        ("frame_instr", s(l.frame_instr)),
        ("frame_owner", s(l.frame_owner)),
        ("owner_cstack", Some(u32::from(l.owner_cstack))),
        ("code_firstlineno", s(l.code_firstlineno)),
        ("code_filename", s(l.code_filename)),
        ("code_name", s(l.code_name)),
        ("code_qualname", o(l.code_qualname)),
        ("code_linetable", s(l.code_linetable)),
        ("code_adaptive", o(l.code_adaptive)),
        ("code_size", s(l.code_size)),
        ("unicode_state", s(l.unicode_state)),
        ("unicode_length", s(l.unicode_length)),
        ("unicode_ascii_data", s(l.unicode_ascii_data)),
        ("unicode_compact_data", s(l.unicode_compact_data)),
        ("bytes_size", s(l.bytes_size)),
        ("bytes_data", s(l.bytes_data)),
        ("runtime_interp_head", Some(l.runtime_interp_head)),
        ("interp_threads_head", Some(l.interp_threads_head)),
        ("tstate_next", s(l.tstate_next)),
    ]
}

#[test]
fn table_matches_the_interpreters() {
    let mut checked = 0;
    for python in INTERPRETERS {
        if !std::path::Path::new(python).exists() {
            eprintln!("SKIP {python}: not installed on this machine");
            continue;
        }
        let (v, measured) = measure(python);
        let layout = layout_for(v).unwrap_or_else(|| panic!("{python}: no layout for {v}"));
        let fields = fields(&layout);
        assert_eq!(measured.len(), fields.len(), "{python}: {measured:?}");
        for (name, want) in fields {
            let got = measured
                .get(name)
                .unwrap_or_else(|| panic!("{python}: no {name}"));
            assert_eq!(*got, want, "{python} ({v}): {name}");
        }
        checked += 1;
    }
    eprintln!("layouts checked against {checked} interpreters");
}

#[test]
fn frame_reads_cover_the_fields() {
    for minor in 8..=13 {
        let l = layout_for(version(minor)).expect("known minor");
        let model = match minor {
            8..=10 => FrameModel::Objects,
            11 => FrameModel::Entry,
            _ => FrameModel::CStack,
        };
        assert_eq!(l.model, model, "3.{minor}");
        // ≤3.10 f_lasti is an int; pointers elsewhere; the owner is one byte.
        let instr = if model == FrameModel::Objects { 4 } else { 8 };
        let ends = [
            l.frame_code + 8,
            l.frame_previous + 8,
            l.frame_instr + instr,
            l.frame_owner + 1,
        ];
        assert!(ends.iter().all(|&e| e <= l.frame_size), "3.{minor}");
        assert!(l.frame_size <= 128 && l.frame_size % 8 == 0, "3.{minor}");
        let code = [
            l.code_firstlineno + 4,
            l.code_filename + 8,
            l.code_name + 8,
            l.code_qualname.map_or(0, |q| q + 8),
            l.code_linetable + 8,
        ];
        assert!(code.iter().all(|&e| e <= l.code_size), "3.{minor}");
        assert!(l.code_size <= 4096);
        assert_eq!(l.code_adaptive.is_some(), minor >= 11);
        assert_eq!(l.cframe_current.is_some(), minor == 11 || minor == 12);
        assert_eq!(l.owner_cstack, if minor >= 12 { 3 } else { 0 });
    }
}

#[test]
fn unknown_versions_are_refused() {
    for minor in [0, 6, 7, 14, 15, 255] {
        assert_eq!(layout_for(version(minor)), None, "3.{minor}");
    }
    let free = Version {
        free_threaded: true,
        ..version(13)
    };
    assert_eq!(layout_for(free), None);
    for major in [2, 4] {
        let v = Version {
            major,
            ..version(8)
        };
        assert_eq!(layout_for(v), None);
    }
    // The micro release does not matter.
    assert_eq!(
        layout_for(Version {
            micro: 2,
            ..version(11)
        }),
        layout_for(version(11))
    );
}
