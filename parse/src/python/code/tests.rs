//! Code objects read from a fake process (a map of regions), honest and hostile.

use super::testing::layout_312 as layout;
use super::*;
use std::collections::HashMap;

/// Memory as a set of regions; every read is logged.
#[derive(Default)]
struct Fake {
    regions: HashMap<u64, Vec<u8>>,
    reads: Vec<(u64, usize)>,
}

impl Memory for Fake {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.reads.push((addr, buf.len()));
        let unmapped = MemError::Unmapped {
            addr,
            len: buf.len(),
        };
        let (base, data) = self
            .regions
            .iter()
            .find(|(b, d)| **b <= addr && addr - **b < d.len() as u64)
            .ok_or(unmapped)?;
        let at = (addr - base) as usize;
        buf.copy_from_slice(data.get(at..at + buf.len()).ok_or(unmapped)?);
        Ok(())
    }
}

const TYPES: Types = Types {
    code: 0x7000_0000,
    unicode: 0x7000_1000,
    bytes: 0x7000_2000,
};

const V312: Version = Version {
    major: 3,
    minor: 12,
    micro: 1,
    free_threaded: false,
};

/// A 3.12 compact `str` object: `state` kind/compact/ascii bits, then its characters.
fn str_obj(ty: u64, kind: u32, ascii: bool, length: i64, chars: &[u8]) -> Vec<u8> {
    let mut o = vec![0u8; if ascii { 40 } else { 56 }];
    o[8..16].copy_from_slice(&ty.to_le_bytes());
    o[16..24].copy_from_slice(&length.to_le_bytes());
    let state = kind << 2 | 1 << 5 | u32::from(ascii) << 6;
    o[32..36].copy_from_slice(&state.to_le_bytes());
    o.extend(chars);
    o.extend([0; 4]);
    o
}

fn ascii(s: &str) -> Vec<u8> {
    str_obj(TYPES.unicode, 1, true, s.len() as i64, s.as_bytes())
}

fn bytes_obj(ty: u64, size: i64, data: &[u8]) -> Vec<u8> {
    let mut o = vec![0u8; 32];
    o[8..16].copy_from_slice(&ty.to_le_bytes());
    o[16..24].copy_from_slice(&size.to_le_bytes());
    o.extend(data);
    o.push(0);
    o
}

const CODE: u64 = 0x1000;
const NAME: u64 = 0x2000;
const FILE: u64 = 0x3000;
const TABLE: u64 = 0x4000;

fn code_obj(ty: u64, first: i32, name: u64, file: u64, table: u64) -> Vec<u8> {
    let mut o = vec![0u8; 200];
    o[8..16].copy_from_slice(&ty.to_le_bytes());
    o[48..52].copy_from_slice(&first.to_le_bytes());
    o[112..120].copy_from_slice(&file.to_le_bytes());
    o[120..128].copy_from_slice(&0xdead_0000u64.to_le_bytes());
    o[128..136].copy_from_slice(&name.to_le_bytes());
    o[136..144].copy_from_slice(&table.to_le_bytes());
    o
}

/// A location table: 2 units on line +1 (code 13), 1 unit without a line, 3 units +2 (code 12).
const LOCATIONS: [u8; 5] = [0x80 | 13 << 3 | 1, 2, 0x80 | 15 << 3, 0x80 | 12 << 3 | 2, 0];

/// An honest process: a function `Klass.method` at line 10 of a long Latin-1 file name.
fn honest() -> Fake {
    let file = "/srv/app/caf\u{e9}/very/long/path/to/the/module.py";
    let latin1: Vec<u8> = file.chars().map(|c| c as u8).collect();
    let mut m = Fake::default();
    m.regions
        .insert(CODE, code_obj(TYPES.code, 10, NAME, FILE, TABLE));
    m.regions.insert(NAME, ascii("Klass.method"));
    m.regions.insert(
        FILE,
        str_obj(TYPES.unicode, 1, false, latin1.len() as i64, &latin1),
    );
    m.regions
        .insert(TABLE, bytes_obj(TYPES.bytes, 5, &LOCATIONS));
    m
}

fn read(m: &mut Fake, fingerprint: u32) -> Result<Code, CodeError> {
    read_code(m, &layout(), V312, &TYPES, CODE, fingerprint)
}

#[test]
fn honest_code_object() {
    let mut m = honest();
    let code = read(&mut m, 10).unwrap();
    assert_eq!(code.qualname, "Klass.method");
    assert_eq!(
        code.filename,
        "/srv/app/caf\u{e9}/very/long/path/to/the/module.py"
    );
    assert_eq!(code.first_line, 10);
    let lines: Vec<_> = (0..7).map(|u| code.line(u)).collect();
    assert_eq!(
        lines,
        [Some(11), Some(11), None, Some(13), Some(13), Some(13), None]
    );
    assert!(code.bytes() > 12 + 45 + 5);
    // Code head; name, file and table: head, then characters or data.
    assert_eq!(m.reads.len(), 7, "{:?}", m.reads);
    // An unknown fingerprint is not checked.
    assert_eq!(read(&mut honest(), 0), Ok(code));
}

#[test]
fn names_before_311_are_co_name() {
    let mut m = honest();
    m.regions.insert(0xdead_0000, ascii("method"));
    let l = Layout {
        code_qualname: None,
        ..layout()
    };
    let v = Version { minor: 10, ..V312 };
    let code = read_code(&mut m, &l, v, &TYPES, CODE, 10).unwrap();
    assert_eq!(code.qualname, "method");
    // The 3.10 decoder reads the same bytes as (bytes, delta) pairs.
    assert_eq!(code.line(0), Some(12));
}

#[test]
fn wrong_types_and_fingerprints() {
    let mut m = honest();
    assert_eq!(
        read(&mut m, 11),
        Err(CodeError::Fingerprint {
            want: 11,
            found: 10
        })
    );
    m.regions
        .insert(CODE, code_obj(TYPES.bytes, 10, NAME, FILE, TABLE));
    let err = read(&mut m, 10).unwrap_err();
    assert_eq!(
        err,
        CodeError::TypeMismatch {
            what: "code",
            found: TYPES.bytes
        }
    );
    assert_eq!(err.reason(), "type");
    // A file name that is a bytes object; a table that is a str.
    let mut m = honest();
    m.regions
        .insert(FILE, bytes_obj(TYPES.bytes, 10, b"abcdefghij"));
    assert!(matches!(
        read(&mut m, 10),
        Err(CodeError::TypeMismatch {
            what: "co_filename",
            ..
        })
    ));
    let mut m = honest();
    m.regions.insert(TABLE, ascii("abc"));
    assert!(matches!(
        read(&mut m, 10),
        Err(CodeError::TypeMismatch {
            what: "co_linetable",
            ..
        })
    ));
    let mut m = honest();
    m.regions
        .insert(CODE, code_obj(TYPES.code, -5, NAME, FILE, TABLE));
    assert_eq!(read(&mut m, 0).unwrap_err().reason(), "fingerprint");
    let v37 = Version { minor: 7, ..V312 };
    assert_eq!(
        read_code(&mut honest(), &layout(), v37, &TYPES, CODE, 0),
        Err(CodeError::Version(v37))
    );
}

#[test]
fn hostile_strings() {
    let cases: [(Vec<u8>, CodeError); 4] = [
        // Kind 3; a legacy string; a forged 4 GB length; an ASCII string with a high byte.
        (
            str_obj(TYPES.unicode, 3, false, 2, b"ab"),
            CodeError::StringKind(StrError::Kind(3 << 2 | 1 << 5)),
        ),
        (
            {
                let mut o = ascii("abc");
                o[32] &= !(1 << 5);
                o
            },
            CodeError::StringKind(StrError::Legacy),
        ),
        (
            str_obj(TYPES.unicode, 4, false, 1 << 32, b""),
            CodeError::StringTooLong(1 << 32),
        ),
        (
            str_obj(TYPES.unicode, 1, true, 3, b"a\xffc"),
            CodeError::StringKind(StrError::Char(0xff)),
        ),
    ];
    for (obj, want) in cases {
        let mut m = honest();
        m.regions.insert(NAME, obj);
        assert_eq!(read(&mut m, 10), Err(want));
        assert!(m.reads.iter().all(|(_, n)| *n <= 200), "{:?}", m.reads);
    }
    // A string whose characters run off its mapping.
    let mut m = honest();
    m.regions
        .insert(FILE, str_obj(TYPES.unicode, 2, false, 4000, b"a\0"));
    assert!(matches!(
        read(&mut m, 10),
        Err(CodeError::Read {
            what: "co_filename",
            err: MemError::Unmapped { len: 8000, .. }
        })
    ));
}

#[test]
fn hostile_tables() {
    for (size, reason) in [
        (1i64 << 40, "table_too_large"),
        (-1, "table_too_large"),
        (5000, "read"),
    ] {
        let mut m = honest();
        m.regions.insert(TABLE, bytes_obj(TYPES.bytes, size, b"xx"));
        assert_eq!(read(&mut m, 10).unwrap_err().reason(), reason, "{size}");
        assert!(m.reads.iter().all(|(_, n)| *n <= 5000));
    }
    let mut m = honest();
    m.regions
        .insert(TABLE, bytes_obj(TYPES.bytes, MAX_TABLE as i64 + 1, b""));
    assert_eq!(
        read(&mut m, 10),
        Err(CodeError::TableTooLarge(MAX_TABLE as i64 + 1))
    );
}

#[test]
fn hostile_pointers_and_sizes() {
    // Unmapped, null and misaligned pointers.
    for (ptr, reason) in [
        (0x9000u64, "read"),
        (0, "pointer"),
        (FILE + 3, "pointer"),
        (u64::MAX - 7, "read"),
    ] {
        let mut m = honest();
        m.regions
            .insert(CODE, code_obj(TYPES.code, 10, NAME, ptr, TABLE));
        assert_eq!(read(&mut m, 10).unwrap_err().reason(), reason, "{ptr:#x}");
    }
    assert_eq!(
        read_code(&mut honest(), &layout(), V312, &TYPES, 0x1001, 0)
            .unwrap_err()
            .reason(),
        "pointer"
    );
    // A forged code size is read up to 4 KiB only; a layout field past the read is a
    // layout error.
    let mut m = honest();
    let big = Layout {
        code_size: u16::MAX,
        ..layout()
    };
    // (The regions are 4 KiB apart.)
    m.regions.get_mut(&CODE).unwrap().resize(MAX_CODE_READ, 0);
    assert!(read_code(&mut m, &big, V312, &TYPES, CODE, 10).is_ok());
    assert_eq!(m.reads[0], (CODE, MAX_CODE_READ));
    let short = Layout {
        code_size: 64,
        ..layout()
    };
    assert_eq!(
        read_code(&mut honest(), &short, V312, &TYPES, CODE, 10),
        Err(CodeError::Layout("code_qualname"))
    );
}

/// A live process's memory through `/proc/PID/mem` (the child is ours: ptrace access).
struct ProcMem(std::fs::File);

impl Memory for ProcMem {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        use std::os::unix::fs::FileExt;
        self.0
            .read_exact_at(buf, addr)
            .map_err(|_| MemError::Unmapped {
                addr,
                len: buf.len(),
            })
    }
}

/// Run by the child: prints `_PyRuntime`'s and the type objects' addresses, then for each
/// code object its address, first line, qualname, file and `co_lines()`, then waits.
const CHILD: &str = r#"
import ctypes, sys
SRC = """
def outer(x):
    def inner(y):
        return [z * 2
                for z in range(y)]
    return inner(x) + [
        x]
class K:
    def méthode(self):
        try:
            return 1 / 0
        except ZeroDivisionError:
            return 2
"""
g = {}
exec(compile(SRC, sys.argv[1], "exec"), g)
outer, K = g["outer"], g["K"]
codes = [outer.__code__, outer.__code__.co_consts[1], K.méthode.__code__, sys._getframe().f_code]
rt = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
print(rt, id(type(outer.__code__)), id(str), id(bytes))
for c in codes:
    runs = " ".join("%d-%d:%s" % (s, e, "-" if l is None else l) for s, e, l in c.co_lines())
    print("%d %d %s %s|%s" % (id(c), c.co_firstlineno, c.co_qualname, c.co_filename, runs))
sys.stdout.flush()
sys.stdin.read()
"#;

#[test]
fn live_313_code_objects() {
    use crate::python::debug_offsets;
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let python = "/root/.pyenv/versions/3.13.0/bin/python3";
    if !std::path::Path::new(python).exists() {
        eprintln!("SKIP {python}: not installed");
        return;
    }
    let mut child = Command::new(python)
        .args(["-c", CHILD, "/tmp/fichier-\u{e9}t\u{e9}-\u{1F600}.py"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let head: Vec<u64> = out
        .next()
        .unwrap()
        .unwrap()
        .split(' ')
        .map(|w| w.parse().unwrap())
        .collect();
    let Ok(file) = std::fs::File::open(format!("/proc/{}/mem", child.id())) else {
        eprintln!("SKIP live 3.13: /proc/PID/mem not readable");
        child.kill().unwrap();
        child.wait().unwrap();
        return;
    };
    let mut mem = ProcMem(file);
    let mut table = vec![0; debug_offsets::READ_LEN];
    mem.read(head[0], &mut table).unwrap();
    let parsed = debug_offsets::parse(&table).unwrap();
    let types = Types {
        code: head[1],
        unicode: head[2],
        bytes: head[3],
    };
    let mut units = 0;
    for _ in 0..4 {
        let line = out.next().unwrap().unwrap();
        let (obj, runs) = line.split_once('|').unwrap();
        let mut f = obj.splitn(4, ' ');
        let addr: u64 = f.next().unwrap().parse().unwrap();
        let first: u32 = f.next().unwrap().parse().unwrap();
        let (qualname, filename) = (f.next().unwrap(), f.next().unwrap());
        let code = read_code(
            &mut mem,
            &parsed.layout,
            parsed.version,
            &types,
            addr,
            first,
        )
        .unwrap();
        assert_eq!(
            (code.qualname.as_str(), code.filename.as_str()),
            (qualname, filename)
        );
        assert_eq!(code.first_line, first);
        for run in runs.split_whitespace() {
            let (range, want) = run.split_once(':').unwrap();
            let (a, b) = range.split_once('-').unwrap();
            let want = (want != "-").then(|| want.parse::<u32>().unwrap());
            for u in a.parse::<u32>().unwrap() / 2..b.parse::<u32>().unwrap() / 2 {
                assert_eq!(code.line(u), want, "{qualname} unit {u}");
                units += 1;
            }
        }
        let wrong = read_code(
            &mut mem,
            &parsed.layout,
            parsed.version,
            &types,
            addr,
            first + 1,
        );
        assert_eq!(wrong.unwrap_err().reason(), "fingerprint");
    }
    drop(child.stdin.take());
    child.wait().unwrap();
    eprintln!("3.13.0: 4 code objects, {units} code units, read from a live process");
}
