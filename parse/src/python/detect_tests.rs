//! Detection against the interpreters on this machine (addresses from `nm -D`/`readelf
//! -s`, the TLS slots from `readelf -r` and `objdump -d`), and refusals on objects built
//! with `elf_builder`.

use super::*;
use crate::elf_builder::{elf, Parts};
use crate::elf_file::DEFAULT_LIMITS;

fn v(minor: u8, micro: u8) -> Version {
    Version {
        major: 3,
        minor,
        micro,
        free_threaded: false,
    }
}

fn detect_bytes(bytes: &[u8], name: &str) -> Result<Option<Interpreter>, DetectError> {
    let mut reader = ElfReader::new(bytes, DEFAULT_LIMITS)?;
    detect(&mut reader, name.as_bytes())
}

/// One interpreter as this machine has it.
struct Real {
    path: &'static str,
    version: Version,
    runtime: u64,
    /// `_PyEval_EvalFrameDefault` address and size.
    eval: (u64, u64),
    cold: Option<(u64, u64)>,
    /// PyCode_Type, PyUnicode_Type, PyBytes_Type, _Py_NoneStruct.
    types: [u64; 4],
    tss: Option<u64>,
    tls_got: Option<u64>,
}

const PYENV: &str = "/root/.pyenv/versions";

fn reals() -> Vec<Real> {
    let lib = |v: &str, m: &str| format!("{PYENV}/{v}/lib/libpython{m}.so.1.0").leak() as &str;
    let r = |path, version, runtime, eval, cold, types, tss, tls_got| Real {
        path,
        version,
        runtime,
        eval,
        cold,
        types,
        tss,
        tls_got,
    };
    vec![
        r(
            lib("3.8.18", "3.8"),
            v(8, 0),
            0x372e00,
            (0x6bf60, 34511),
            None,
            [0x321000, 0x3388e0, 0x31fca0, 0x332220],
            None,
            None,
        ),
        r(
            lib("3.9.18", "3.9"),
            v(9, 0),
            0x3acf60,
            (0x66920, 35197),
            None,
            [0x359cc0, 0x371940, 0x358920, 0x36b420],
            None,
            None,
        ),
        r(
            lib("3.10.13", "3.10"),
            v(10, 0),
            0x3a8660,
            (0x65540, 38051),
            None,
            [0x379b20, 0x391c60, 0x378720, 0x38bc80],
            None,
            None,
        ),
        r(
            lib("3.11.7", "3.11"),
            v(11, 7),
            0x54e540,
            (0xfab70, 43345),
            Some((0xfa7f6, 4)),
            [0x449b00, 0x461860, 0x448640, 0x45bbe0],
            None,
            None,
        ),
        r(
            lib("3.12.1", "3.12"),
            v(12, 1),
            0x643340,
            (0x10bdc0, 51245),
            Some((0x10ba24, 8)),
            [0x549e80, 0x563c20, 0x548840, 0x55d440],
            Some(8),
            Some(0x543ef0),
        ),
        r(
            lib("3.13.0", "3.13"),
            v(13, 0),
            0x5294c0,
            (0x8b8e0, 48125),
            None,
            [0x4f0bc0, 0x50c5e0, 0x4ef580, 0x5047a0],
            Some(0x18),
            Some(0x4eaec0),
        ),
        // Debian's: static, no .symtab, no PT_TLS (3.11 keeps no thread-local state).
        r(
            "/usr/bin/python3.11",
            v(11, 2),
            0xa5b740,
            (0x52b0f0, 55644),
            // Stripped: from `.eh_frame` (`objdump -d`: 378 of the function's jumps land
            // in this FDE, whose CFA is rsp + 352, no function entry).
            Some((0x430f05, 0x43455e - 0x430f05)),
            [0x959440, 0x958980, 0x958b20, 0x959cc0],
            None,
            None,
        ),
    ]
}

#[test]
fn real_interpreters_are_detected() {
    let mut checked = 0;
    for r in reals() {
        let Ok(bytes) = std::fs::read(r.path) else {
            eprintln!("SKIP {}: not installed on this machine", r.path);
            continue;
        };
        let got = detect_bytes(&bytes, r.path)
            .unwrap_or_else(|e| panic!("{}: {e}", r.path))
            .unwrap_or_else(|| panic!("{}: not detected", r.path));
        let want = Interpreter {
            version: r.version,
            runtime: r.runtime,
            eval: (r.eval.0, r.eval.0 + r.eval.1),
            eval_cold: r.cold.map(|(a, n)| (a, a + n)),
            code_type: r.types[0],
            unicode_type: r.types[1],
            bytes_type: r.types[2],
            none: Some(r.types[3]),
            tss_tstate: r.tss,
            tls_got: r.tls_got,
            tls_static: None,
            published: None,
        };
        assert_eq!(got, want, "{}", r.path);
        assert!(layout_for(got.version).is_some());
        if let Some(slot) = r.tls_got {
            check_tls_slot_with_objdump(r.path, slot);
        }
        checked += 1;
    }
    eprintln!("detected {checked} interpreters");
}

/// `_PyThreadState_GetCurrent` passes the slot to `__tls_get_addr`: `lea X(%rip),%rdi`,
/// objdump annotating X. Skipped without objdump.
fn check_tls_slot_with_objdump(path: &str, slot: u64) {
    let out = std::process::Command::new("objdump")
        .args([
            "-d",
            "--no-show-raw-insn",
            "--disassemble=_PyThreadState_GetCurrent",
            path,
        ])
        .output();
    let Ok(out) = out else {
        eprintln!("SKIP objdump check of {path}: no objdump");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let lea = text
        .lines()
        .find(|l| l.contains("lea") && l.contains("(%rip),%rdi"))
        .unwrap_or_else(|| panic!("{path}: no lea in\n{text}"));
    assert!(lea.contains(&format!("# {slot:x}")), "{path}: {lea}");
    assert!(text.contains("__tls_get_addr"), "{path}: {text}");
}

#[test]
fn an_executable_using_libpython_is_not_the_interpreter() {
    let path = format!("{PYENV}/3.12.1/bin/python3.12");
    let Ok(bytes) = std::fs::read(&path) else {
        eprintln!("SKIP {path}: not installed on this machine");
        return;
    };
    assert_eq!(detect_bytes(&bytes, &path), Ok(None));
    // Nor is a program that has nothing to do with Python.
    let exe = std::fs::read("/proc/self/exe").expect("own exe");
    assert_eq!(detect_bytes(&exe, "ember_parse"), Ok(None));
}

/// An `Elf64_Sym` (section 1: defined).
fn sym(name_at: u32, kind: u8, value: u64, size: u64) -> Vec<u8> {
    let mut s = Vec::with_capacity(24);
    s.extend_from_slice(&name_at.to_le_bytes());
    s.push(0x10 | kind); // STB_GLOBAL
    s.push(0);
    s.extend_from_slice(&1u16.to_le_bytes());
    s.extend_from_slice(&value.to_le_bytes());
    s.extend_from_slice(&size.to_le_bytes());
    s
}

/// The interpreter's symbols (minus `skip`, plus `extra`) in `.dynsym`, `tls` in
/// `.symtab`, and `py_version` (when given) as the bytes `Py_Version` names.
fn fake(skip: &str, extra: &[&str], py_version: Option<u32>, tls: &[(&str, u64)]) -> Vec<u8> {
    let mut names: Vec<(&str, u8, u64)> = [
        ("_PyRuntime", elf::STT_OBJECT, 0x1000),
        ("_PyEval_EvalFrameDefault", elf::STT_FUNC, 0x100),
        ("PyCode_Type", elf::STT_OBJECT, 0x200),
        ("PyUnicode_Type", elf::STT_OBJECT, 0x300),
        ("PyBytes_Type", elf::STT_OBJECT, 0x400),
        ("_Py_NoneStruct", elf::STT_OBJECT, 0x500),
    ]
    .into_iter()
    .filter(|n| n.0 != skip)
    .collect();
    names.extend(extra.iter().map(|&n| (n, elf::STT_FUNC, 0x600)));
    let table = |entries: &[(&str, u8, u64)], tail: usize| {
        let (mut syms, mut strs) = (vec![0u8; 24], vec![0u8]);
        for &(name, kind, value) in entries {
            let at = if name == "Py_Version" {
                tail
            } else {
                value as usize
            };
            syms.extend(sym(strs.len() as u32, kind, at as u64, 0x40));
            strs.extend_from_slice(name.as_bytes());
            strs.push(0);
        }
        (syms, strs)
    };
    let tls: Vec<_> = tls.iter().map(|&(n, at)| (n, elf::STT_TLS, at)).collect();
    let (symtab, strtab) = table(&tls, 0);
    if py_version.is_some() {
        names.push(("Py_Version", elf::STT_OBJECT, 0));
    }
    // Py_Version's bytes end `.dynstr`, which `elf` places after the other three tables.
    let (dynsym, mut dynstr) = table(&names, 0);
    let before = 64 + 56 + symtab.len() + strtab.len() + dynsym.len();
    let (dynsym, _) = table(&names, before + dynstr.len());
    if let Some(hex) = py_version {
        dynstr.extend_from_slice(&hex.to_le_bytes());
    }
    elf(&Parts {
        symtab: &symtab,
        strtab: &strtab,
        dynsym: &dynsym,
        dynstr: &dynstr,
        compressed: false,
    })
}

#[test]
fn built_objects_are_detected_or_refused() {
    let ok = fake("", &[], Some(0x030c01f0), &[]);
    let got = detect_bytes(&ok, "libpython3.12.so")
        .expect("ok")
        .expect("some");
    assert_eq!(
        (got.version, got.runtime, got.eval),
        (v(12, 1), 0x1000, (0x100, 0x140))
    );
    assert_eq!(
        (got.tss_tstate, got.tls_got, got.tls_static),
        (None, None, None)
    );
    // Py_Version wins over the name; the name serves before 3.11.
    let named = fake("", &[], None, &[]);
    let got = detect_bytes(&named, "/usr/lib/libpython3.9.so.1.0");
    assert_eq!(got.expect("ok").expect("some").version, v(9, 0));
    let cases: &[(Vec<u8>, &str, DetectError)] = &[
        // 3.14 is read from its own `_Py_DebugOffsets`: none here.
        (
            fake("", &[], Some(0x030e00f0), &[]),
            "python3.14",
            DetectError::BadSymbol("_Py_DebugOffsets"),
        ),
        (
            fake("", &[], Some(0x030f00f0), &[]),
            "python3.15",
            DetectError::UnknownVersion(v(15, 0)),
        ),
        (
            fake("", &[], Some(0x030700f0), &[]),
            "x",
            DetectError::UnknownVersion(v(7, 0)),
        ),
        (
            fake("", &[], None, &[]),
            "libpython3.7m.so.1.0",
            DetectError::UnknownVersion(v(7, 0)),
        ),
        (fake("", &[], None, &[]), "uwsgi", DetectError::NoVersion),
        // A free-threaded 3.13+ build is read from its own `_Py_DebugOffsets` (none here);
        // one older than the table is refused as such.
        (
            fake("", &[], Some(0x030d00f0), &[]),
            "python3.13t",
            DetectError::BadSymbol("_Py_DebugOffsets"),
        ),
        (
            fake("", &["_Py_DecRefShared"], Some(0x030d00f0), &[]),
            "python3",
            DetectError::BadSymbol("_Py_DebugOffsets"),
        ),
        (
            fake("", &["_Py_DecRefShared"], Some(0x030c00f0), &[]),
            "python3",
            DetectError::FreeThreaded(Version {
                free_threaded: true,
                ..v(12, 0)
            }),
        ),
        (
            fake("", &[], None, &[]),
            "libpython3.10d.so",
            DetectError::DebugBuild,
        ),
        (
            fake("", &["_Py_NegativeRefcount"], Some(0x030c01f0), &[]),
            "python3",
            DetectError::DebugBuild,
        ),
        (
            fake("PyCode_Type", &[], Some(0x030c01f0), &[]),
            "python3.12",
            DetectError::MissingSymbol("PyCode_Type"),
        ),
    ];
    for (bytes, name, want) in cases {
        assert_eq!(detect_bytes(bytes, name).as_ref(), Err(want), "{name}");
    }
    let mut arm = fake("", &[], Some(0x030c01f0), &[]);
    arm[18..20].copy_from_slice(&elf::EM_AARCH64.to_le_bytes());
    let got = detect_bytes(&arm, "python3.12");
    assert_eq!(got, Err(DetectError::NotX86_64(elf::EM_AARCH64)));
    // Without either of the two symbols, not an interpreter at all.
    for skip in ["_PyRuntime", "_PyEval_EvalFrameDefault"] {
        assert_eq!(
            detect_bytes(&fake(skip, &[], Some(0x030c01f0), &[]), "python3.12"),
            Ok(None)
        );
    }
}

#[test]
fn a_version_outside_the_file_is_refused() {
    let mut bytes = fake("", &[], Some(0x030c01f0), &[]);
    // The segment moved to 16 MiB (p_vaddr): Py_Version's address is in none.
    bytes[64 + 16..64 + 24].copy_from_slice(&(16u64 << 20).to_le_bytes());
    let got = detect_bytes(&bytes, "python3.12");
    assert_eq!(got, Err(DetectError::BadSymbol("Py_Version")));
}

/// `bytes` turned into an executable (`e_type`) with a `PT_TLS` of `memsz`/`align`: a new
/// program header table (the `PT_LOAD` and the `PT_TLS`) appended to the file.
fn with_tls(mut bytes: Vec<u8>, e_type: u16, memsz: u64, align: u64) -> Vec<u8> {
    let load = bytes[64..120].to_vec();
    let at = bytes.len().next_multiple_of(8);
    bytes.resize(at, 0);
    bytes.extend_from_slice(&load);
    let mut tls = vec![0u8; 56];
    tls[..4].copy_from_slice(&elf::PT_TLS.to_le_bytes());
    tls[40..48].copy_from_slice(&memsz.to_le_bytes());
    tls[48..56].copy_from_slice(&align.to_le_bytes());
    bytes.extend_from_slice(&tls);
    bytes[16..18].copy_from_slice(&e_type.to_le_bytes());
    bytes[32..40].copy_from_slice(&(at as u64).to_le_bytes());
    bytes[56..58].copy_from_slice(&2u16.to_le_bytes());
    bytes
}

#[test]
fn static_tls_offsets_of_executables() {
    let tss = [("pkgcontext", 0), ("_Py_tss_tstate", 8)];
    let exe = with_tls(fake("", &[], Some(0x030c01f0), &tss), elf::ET_EXEC, 0x10, 8);
    let got = detect_bytes(&exe, "python3.12").expect("ok").expect("some");
    assert_eq!(
        (got.tss_tstate, got.tls_static, got.tls_got),
        (Some(8), Some(-8), None)
    );
    // The block is rounded up to its alignment below the thread pointer.
    let exe = with_tls(
        fake("", &[], Some(0x030d00f0), &tss),
        elf::ET_EXEC,
        0x14,
        16,
    );
    let got = detect_bytes(&exe, "python3.13").expect("ok").expect("some");
    assert_eq!(got.tls_static, Some(8 - 32));
    // A shared object has no static offset; without the symbol, neither.
    let lib = with_tls(fake("", &[], Some(0x030c01f0), &tss), elf::ET_DYN, 0x10, 8);
    let got = detect_bytes(&lib, "libpython3.12.so")
        .expect("ok")
        .expect("some");
    assert_eq!((got.tss_tstate, got.tls_static), (Some(8), None));
    let exe = with_tls(fake("", &[], Some(0x030c01f0), &[]), elf::ET_EXEC, 0x10, 8);
    let got = detect_bytes(&exe, "python3.12").expect("ok").expect("some");
    assert_eq!(got.tls_static, None);
}

#[test]
fn names_give_versions() {
    let named = |n: &str| name_version(n.as_bytes()).map(|n| (n.version, n.debug));
    let ft = |minor| Version {
        free_threaded: true,
        ..v(minor, 0)
    };
    assert_eq!(
        named("/usr/lib/libpython3.11.so.1.0"),
        Some((v(11, 0), false))
    );
    assert_eq!(named("libpython3.8.so"), Some((v(8, 0), false)));
    assert_eq!(named("/usr/bin/python3.13"), Some((v(13, 0), false)));
    assert_eq!(named("python3.13t"), Some((ft(13), false)));
    assert_eq!(named("libpython3.13t.so.1.0"), Some((ft(13), false)));
    assert_eq!(named("python3.12d"), Some((v(12, 0), true)));
    for bad in [
        "python3",
        "python3.",
        "python3.12-config",
        "python3.123",
        "libpython3.12.a",
        "libpython3.so",
        "libpython3.12.sox",
        "mypython3.12",
        "python3.12/uwsgi",
        "",
    ] {
        assert_eq!(named(bad), None, "{bad}");
    }
}

#[test]
fn static_tls_arithmetic_is_checked() {
    assert_eq!(static_tls_offset(8, 16, 8), Some(-8));
    assert_eq!(static_tls_offset(0, 0, 0), Some(0));
    assert_eq!(static_tls_offset(0, 1, 64), Some(-64));
    assert_eq!(static_tls_offset(0, u64::MAX, 16), None);
    assert_eq!(static_tls_offset(u64::MAX, 8, 8), None);
}

/// An interpreter-shaped C program: the symbols detection looks for, and a thread-local
/// `_Py_tss_tstate` (hidden, as CPython's) read by `_PyThreadState_GetCurrent`.
const FAKE_C: &str = r#"
char _PyRuntime[4096];
const unsigned long Py_Version = 0x030c01f0;
char PyCode_Type[416], PyUnicode_Type[416], PyBytes_Type[416], _Py_NoneStruct[16];
__thread char other_tls[24] = {1};
__attribute__((visibility("hidden"))) __thread void *_Py_tss_tstate;
void *_PyThreadState_GetCurrent(void) { return _Py_tss_tstate; }
long _PyEval_EvalFrameDefault(long x) {
    return x * 3 + (long)_PyThreadState_GetCurrent() + other_tls[x & 7];
}
int main(int argc, char **argv) { (void)argv; return (int)_PyEval_EvalFrameDefault(argc); }
"#;

/// `_PyThreadState_GetCurrent`'s disassembly, `None` without objdump.
fn get_current(path: &str) -> Option<String> {
    let out = std::process::Command::new("objdump")
        .args([
            "-d",
            "--no-show-raw-insn",
            "--disassemble=_PyThreadState_GetCurrent",
            path,
        ])
        .output()
        .ok()?;
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn gcc_built_interpreters_give_their_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("fake.c");
    std::fs::write(&src, FAKE_C).expect("write source");
    let build = |name: &str, flags: &[&str]| {
        let out = dir.path().join(name);
        let ok = std::process::Command::new("gcc")
            .args(["-O2", "-o"])
            .arg(&out)
            .args(flags)
            .arg(&src)
            .status()
            .expect("run gcc (the unwind tests need it too)");
        assert!(ok.success(), "gcc {flags:?}");
        out.to_string_lossy().into_owned()
    };
    // A PIE executable (exports its symbols, as python3.X does): local-exec TLS, %fs-relative.
    let exe = build("python3.12", &["-rdynamic"]);
    let Some(text) = get_current(&exe) else {
        eprintln!("SKIP gcc-built interpreters: no objdump");
        return;
    };
    let got = detect_bytes(&std::fs::read(&exe).expect("read"), &exe)
        .expect("ok")
        .expect("detected");
    let off = got.tls_static.expect("static TLS offset");
    let want = format!("%fs:{:#x},", off as u64);
    assert!(text.contains(&want), "{want} not in\n{text}");
    assert_eq!(got.tls_got, None);
    // A shared library: general-dynamic TLS, the slot handed to __tls_get_addr. It also has
    // a DTPMOD64 slot for the global other_tls (by symbol index), which must not be taken.
    let lib = build("libpython3.12.so", &["-shared", "-fPIC"]);
    let got = detect_bytes(&std::fs::read(&lib).expect("read"), &lib)
        .expect("ok")
        .expect("detected");
    assert_eq!(got.tls_static, None);
    let slot = got.tls_got.expect("GOT slot");
    check_tls_slot_with_objdump(&lib, slot);
}

/// Debian sid's python3.14 as `make python314-root` unpacks it: static, stripped (no
/// `.symtab`, so no `.cold` symbol), non-PIE; addresses from `nm -DS` and `.eh_frame`.
#[test]
fn debian_314_is_detected() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/python314/root/usr/bin/python3.14"
    );
    let Ok(bytes) = std::fs::read(path) else {
        eprintln!("SKIP {path}: not built (make python314-root)");
        return;
    };
    let got = detect_bytes(&bytes, path).expect("ok").expect("detected");
    assert_eq!((got.version.minor, got.runtime), (14, 0xba07c0));
    assert_eq!(got.eval, (0x598b80, 0x598b80 + 0x4a0));
    // The 84 KB FDE holding the opcode handlers (`objdump -d`: 251 `jmp *%rax`).
    assert_eq!(got.eval_cold, Some((0x43fb58, 0x45451f)));
    assert_eq!(
        [got.code_type, got.unicode_type, got.bytes_type],
        [0xb62360, 0xb647c0, 0xb64960]
    );
    assert_eq!(
        (got.tss_tstate, got.tls_got, got.tls_static),
        (None, None, None)
    );
    let layout = got
        .published
        .expect("3.14's layout from its _Py_DebugOffsets");
    assert_eq!(got.layout(), Some(layout));
    assert_eq!((layout.frame_owner, layout.owner_cstack), (74, 3));
    assert_eq!(layout.runtime_autotss, 0x920);
}
