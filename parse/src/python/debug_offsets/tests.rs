//! The parser against tables written field by field in each header's order (3.13, 3.13t,
//! 3.14, 3.14t), against the real 3.13.0 libpython, Debian's 3.14.10 and the free-threaded
//! 3.13.15t and 3.14.7t `make python-ft` builds, and against corrupt tables.
//!
//! The images are transcribed from the headers independently of the parser's group lists,
//! so a field missing or out of order there shifts every later value and fails. Values of
//! 3.13 GIL are 3.13.0's own; the others are plausible (t builds: a 32-byte `PyObject`
//! head, 16 bytes more before each code field), distinct so that a swap shows.

use super::*;
use object::{Object, ObjectSection, ObjectSymbol};

/// `(group.field, value)` in the order of 3.13's `_Py_DebugOffsets` (`pycore_runtime.h`).
fn image_313(ft: bool) -> Vec<(&'static str, u64)> {
    let o = if ft { 16 } else { 0 };
    vec![
        ("runtime_state.size", 283320),
        ("runtime_state.finalizing", 608),
        ("runtime_state.interpreters_head", 632),
        ("interpreter_state.size", 194968),
        ("interpreter_state.id", 7272),
        ("interpreter_state.next", 7264),
        ("interpreter_state.threads_head", 7344),
        ("interpreter_state.gc", 7400),
        ("interpreter_state.imports_modules", 7656),
        ("interpreter_state.sysdict", 7640),
        ("interpreter_state.builtins", 7648),
        ("interpreter_state.ceval_gil", 16),
        ("interpreter_state.gil_runtime_state", 7752),
        (
            "interpreter_state.gil_runtime_state_enabled",
            if ft { 24 } else { 0 },
        ),
        ("interpreter_state.gil_runtime_state_locked", 7768),
        ("interpreter_state.gil_runtime_state_holder", 7760),
        ("thread_state.size", 304 + o),
        ("thread_state.prev", 0),
        ("thread_state.next", 8),
        ("thread_state.interp", 16),
        ("thread_state.current_frame", 72),
        ("thread_state.thread_id", 152),
        ("thread_state.native_thread_id", 160),
        ("thread_state.datastack_chunk", 232),
        ("thread_state.status", 32),
        ("interpreter_frame.size", 80),
        ("interpreter_frame.previous", 8),
        ("interpreter_frame.executable", 0),
        ("interpreter_frame.instr_ptr", 56),
        ("interpreter_frame.localsplus", 72),
        ("interpreter_frame.owner", 70),
        ("code_object.size", 208 + o),
        ("code_object.filename", 112 + o),
        ("code_object.name", 120 + o),
        ("code_object.qualname", 128 + o),
        ("code_object.linetable", 136 + o),
        ("code_object.firstlineno", 68 + o),
        ("code_object.argcount", 52 + o),
        ("code_object.localsplusnames", 96 + o),
        ("code_object.localspluskinds", 104 + o),
        ("code_object.co_code_adaptive", 200 + o),
        ("pyobject.size", 16 + o),
        ("pyobject.ob_type", 8 + o),
        ("type_object.size", 416 + o),
        ("type_object.tp_name", 24 + o),
        ("type_object.tp_repr", 88 + o),
        ("type_object.tp_flags", 168 + o),
        ("tuple_object.size", 32 + o),
        ("tuple_object.ob_item", 24 + o),
        ("tuple_object.ob_size", 16 + o),
        ("list_object.size", 40 + o),
        ("list_object.ob_item", 24 + o),
        ("list_object.ob_size", 16 + o),
        ("dict_object.size", 48 + o),
        ("dict_object.ma_keys", 32 + o),
        ("dict_object.ma_values", 40 + o),
        ("float_object.size", 24 + o),
        ("float_object.ob_fval", 16 + o),
        ("long_object.size", 32 + o),
        ("long_object.lv_tag", 16 + o),
        ("long_object.ob_digit", 24 + o),
        ("bytes_object.size", 40 + o),
        ("bytes_object.ob_size", 16 + o),
        ("bytes_object.ob_sval", 32 + o),
        ("unicode_object.size", 64 + o),
        ("unicode_object.state", 32 + o),
        ("unicode_object.length", 16 + o),
        ("unicode_object.asciiobject_size", 40 + o),
        ("gc.size", 240),
        ("gc.collecting", 200),
    ]
}

/// The same for 3.14 (`pycore_debug_offsets.h`, 3.14b2 on): `threads_main`, the code
/// generation counters, frame `stackpointer`/`tlbc_index`, `co_tlbc`, and the
/// `set_object`, `gen_object`, `llist_node` and `debugger_support` groups.
fn image_314(ft: bool) -> Vec<(&'static str, u64)> {
    let o = if ft { 16 } else { 0 };
    let tlbc = |v: u64| if ft { v } else { 0 };
    vec![
        ("runtime_state.size", 300000),
        ("runtime_state.finalizing", 600),
        ("runtime_state.interpreters_head", 624),
        ("interpreter_state.size", 200000),
        ("interpreter_state.id", 7280),
        ("interpreter_state.next", 7272),
        ("interpreter_state.threads_head", 7352),
        ("interpreter_state.threads_main", 7360),
        ("interpreter_state.gc", 7408),
        ("interpreter_state.imports_modules", 7664),
        ("interpreter_state.sysdict", 7648),
        ("interpreter_state.builtins", 7656),
        ("interpreter_state.ceval_gil", 24),
        ("interpreter_state.gil_runtime_state", 7760),
        ("interpreter_state.gil_runtime_state_enabled", tlbc(24)),
        ("interpreter_state.gil_runtime_state_locked", 7776),
        ("interpreter_state.gil_runtime_state_holder", 7768),
        ("interpreter_state.code_object_generation", 7800),
        ("interpreter_state.tlbc_generation", tlbc(7808)),
        ("thread_state.size", 320 + o),
        ("thread_state.prev", 0),
        ("thread_state.next", 8),
        ("thread_state.interp", 16),
        ("thread_state.current_frame", 80),
        ("thread_state.thread_id", 160),
        ("thread_state.native_thread_id", 168),
        ("thread_state.datastack_chunk", 240),
        ("thread_state.status", 32),
        ("interpreter_frame.size", 88),
        ("interpreter_frame.previous", 8),
        ("interpreter_frame.executable", 0),
        ("interpreter_frame.instr_ptr", 56),
        ("interpreter_frame.localsplus", 80),
        ("interpreter_frame.owner", if ft { 78 } else { 74 }),
        ("interpreter_frame.stackpointer", 64),
        ("interpreter_frame.tlbc_index", tlbc(72)),
        ("code_object.size", 224 + o),
        ("code_object.filename", 112 + o),
        ("code_object.name", 120 + o),
        ("code_object.qualname", 128 + o),
        ("code_object.linetable", 136 + o),
        ("code_object.firstlineno", 68 + o),
        ("code_object.argcount", 52 + o),
        ("code_object.localsplusnames", 96 + o),
        ("code_object.localspluskinds", 104 + o),
        ("code_object.co_code_adaptive", 216 + o),
        ("code_object.co_tlbc", tlbc(208 + o)),
        ("pyobject.size", 16 + o),
        ("pyobject.ob_type", 8 + o),
        ("type_object.size", 416 + o),
        ("type_object.tp_name", 24 + o),
        ("type_object.tp_repr", 88 + o),
        ("type_object.tp_flags", 168 + o),
        ("tuple_object.size", 32 + o),
        ("tuple_object.ob_item", 24 + o),
        ("tuple_object.ob_size", 16 + o),
        ("list_object.size", 40 + o),
        ("list_object.ob_item", 24 + o),
        ("list_object.ob_size", 16 + o),
        ("set_object.size", 200 + o),
        ("set_object.used", 24 + o),
        ("set_object.table", 40 + o),
        ("set_object.mask", 32 + o),
        ("dict_object.size", 48 + o),
        ("dict_object.ma_keys", 32 + o),
        ("dict_object.ma_values", 40 + o),
        ("float_object.size", 24 + o),
        ("float_object.ob_fval", 16 + o),
        ("long_object.size", 32 + o),
        ("long_object.lv_tag", 16 + o),
        ("long_object.ob_digit", 24 + o),
        ("bytes_object.size", 40 + o),
        ("bytes_object.ob_size", 16 + o),
        ("bytes_object.ob_sval", 32 + o),
        ("unicode_object.size", 64 + o),
        ("unicode_object.state", 32 + o),
        ("unicode_object.length", 16 + o),
        ("unicode_object.asciiobject_size", 40 + o),
        ("gc.size", 256),
        ("gc.collecting", 216),
        ("gen_object.size", 120 + o),
        ("gen_object.gi_name", 40 + o),
        ("gen_object.gi_iframe", 96 + o),
        ("gen_object.gi_frame_state", 91 + o),
        ("llist_node.next", 0),
        ("llist_node.prev", 8),
        ("debugger_support.eval_breaker", 24),
        ("debugger_support.remote_debugger_support", 312),
        ("debugger_support.remote_debugging_enabled", 5000),
        ("debugger_support.debugger_pending_call", 0),
        ("debugger_support.debugger_script_path", 4),
        ("debugger_support.debugger_script_path_size", 512),
    ]
}

/// The bytes of a table: cookie, version, flag, then the values.
fn write(version: u32, ft: bool, fields: &[(&str, u64)]) -> Vec<u8> {
    let mut b = COOKIE.to_vec();
    b.extend(u64::from(version).to_le_bytes());
    b.extend(u64::from(ft).to_le_bytes());
    for (_, v) in fields {
        b.extend(v.to_le_bytes());
    }
    b
}

/// Sets one field of an image.
fn with(mut fields: Vec<(&'static str, u64)>, name: &str, value: u64) -> Vec<(&'static str, u64)> {
    fields.iter_mut().find(|(n, _)| *n == name).unwrap().1 = value;
    fields
}

fn value(fields: &[(&str, u64)], name: &str) -> u16 {
    fields.iter().find(|(n, _)| *n == name).unwrap().1 as u16
}

/// The layout a table must give: each field where the image put it.
fn expect(fields: &[(&str, u64)], minor: u8, ft: bool) -> Layout {
    let v = |n| value(fields, n);
    let ascii = v("unicode_object.asciiobject_size");
    let code_end = v("code_object.linetable").max(v("code_object.qualname")) + 8;
    Layout {
        model: FrameModel::CStack,
        runtime_autotss: if minor == 13 { 0x870 } else { 0x920 },
        tstate_frame: v("thread_state.current_frame"),
        cframe_current: None,
        tstate_native_id: Some(v("thread_state.native_thread_id")),
        tstate_thread_id: v("thread_state.thread_id"),
        runtime_tstate_current: None,
        frame_code: v("interpreter_frame.executable"),
        frame_previous: v("interpreter_frame.previous"),
        frame_instr: v("interpreter_frame.instr_ptr"),
        frame_owner: v("interpreter_frame.owner"),
        owner_cstack: 3,
        frame_size: (v("interpreter_frame.owner") + 1)
            .max(if ft && minor >= 14 {
                v("interpreter_frame.tlbc_index") + 4
            } else {
                0
            })
            .div_ceil(8)
            * 8,
        code_firstlineno: v("code_object.firstlineno"),
        code_filename: v("code_object.filename"),
        code_name: v("code_object.name"),
        code_qualname: Some(v("code_object.qualname")),
        code_linetable: v("code_object.linetable"),
        code_adaptive: Some(v("code_object.co_code_adaptive")),
        code_size: code_end.div_ceil(8) * 8,
        unicode_state: v("unicode_object.state"),
        unicode_length: v("unicode_object.length"),
        unicode_ascii_data: ascii,
        unicode_compact_data: ascii + 16,
        bytes_size: v("bytes_object.ob_size"),
        bytes_data: v("bytes_object.ob_sval"),
        object_type: v("pyobject.ob_type"),
        frame_code_tagged: minor >= 14,
        frame_tlbc_index: (ft && minor >= 14).then(|| v("interpreter_frame.tlbc_index")),
        code_tlbc: (ft && minor >= 14).then(|| v("code_object.co_tlbc")),
        runtime_interp_head: u32::from(v("runtime_state.interpreters_head")),
        interp_threads_head: u32::from(v("interpreter_state.threads_head")),
        tstate_next: v("thread_state.next"),
    }
}

#[test]
fn header_images_of_each_build() {
    for (hex, ft, fields) in [
        (0x030d00f0u32, false, image_313(false)),
        (0x030d01f0, true, image_313(true)),
        (0x030e00f0, false, image_314(false)),
        (0x030e02f0, true, image_314(true)),
    ] {
        let minor = (hex >> 16) as u8;
        let mut bytes = write(hex, ft, &fields);
        let len = bytes.len();
        assert_eq!(len, if minor == 13 { 584 } else { 760 });
        assert!(len <= READ_LEN);
        // What follows the table in `_PyRuntime` does not matter.
        bytes.resize(READ_LEN, 0xee);
        let got = parse(&bytes).unwrap_or_else(|e| panic!("{hex:#x} ft={ft}: {e}"));
        assert_eq!(
            got.version,
            Version {
                free_threaded: ft,
                ..Version::from_hex(hex)
            }
        );
        assert_eq!(got.layout, expect(&fields, minor, ft), "{hex:#x} ft={ft}");
        assert_eq!(parse(&bytes[..len]).map(|d| d.layout), Ok(got.layout));
        // Every field of the header, used by the layout or not, where the parser's
        // group list says.
        let table = Table {
            groups: minor_spec(minor).unwrap().groups,
            values: fields.iter().map(|(_, v)| *v).collect(),
        };
        for (name, want) in &fields {
            let (g, f) = name.split_once('.').unwrap();
            assert_eq!(table.get(g, f), Some(*want), "{hex:#x} {name}");
        }
    }
}

#[test]
fn corrupt_tables_are_refused() {
    let good = image_314(false);
    let v = 0x030e00f0;
    let bytes = write(v, false, &good);
    for n in 0..bytes.len() {
        let need = if n < 24 { 24 } else { 760 };
        assert_eq!(
            parse(&bytes[..n]),
            Err(DebugOffsetsError::Short { need, got: n }),
            "{n} bytes"
        );
    }
    let mut bad = bytes.clone();
    bad[0] = b'X';
    assert_eq!(parse(&bad), Err(DebugOffsetsError::Cookie));
    for hex in [0x030c01f0u64, 0x030f00a1, 0x020e00f0, 1 << 40] {
        let mut b = bytes.clone();
        b[8..16].copy_from_slice(&hex.to_le_bytes());
        assert_eq!(parse(&b), Err(DebugOffsetsError::Version(hex)));
    }
    let mut ft2 = bytes.clone();
    ft2[16] = 2;
    assert_eq!(parse(&ft2), Err(DebugOffsetsError::FreeThreaded(2)));
    let huge = with(good.clone(), "code_object.size", (1 << 20) + 1);
    assert_eq!(
        parse(&write(v, false, &huge)),
        Err(DebugOffsetsError::StructTooLarge {
            group: "code_object",
            size: (1 << 20) + 1
        })
    );
    let outside = with(good.clone(), "interpreter_frame.owner", 88);
    assert_eq!(
        parse(&write(v, false, &outside)),
        Err(DebugOffsetsError::FieldOutside {
            group: "interpreter_frame",
            field: "owner",
            offset: 88,
            size: 88
        })
    );
    // Inside a (large) struct, but farther than ember reads.
    let far = with(
        with(good.clone(), "code_object.size", 1 << 20),
        "code_object.qualname",
        70000,
    );
    assert_eq!(
        parse(&write(v, false, &far)),
        Err(DebugOffsetsError::TooFar {
            group: "code_object",
            field: "qualname",
            offset: 70000
        })
    );
    // Unsized groups are not checked against a size: 3.14's script path size is a length.
    let unsized_ = with(good, "debugger_support.debugger_script_path_size", 1 << 30);
    assert!(parse(&write(v, false, &unsized_)).is_ok());
}

const LIBPYTHON_313: &str = "/root/.pyenv/versions/3.13.0/lib/libpython3.13.so.1.0";

/// The bytes of dynamic symbol `name` in the object file (its section's data at it), and
/// the symbol's size.
fn symbol_bytes<'a>(file: &object::File<'a>, name: &str, len: usize) -> &'a [u8] {
    let sym = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap();
    let section = file.section_by_index(sym.section_index().unwrap()).unwrap();
    let at = (sym.address() - section.address()) as usize;
    &section.data().unwrap()[at..at + len]
}

#[test]
fn real_libpython_313() {
    let Ok(data) = std::fs::read(LIBPYTHON_313) else {
        eprintln!("SKIP {LIBPYTHON_313}: not installed");
        return;
    };
    let file = object::File::parse(&*data).unwrap();
    let got = parse(symbol_bytes(&file, "_PyRuntime", READ_LEN)).unwrap();
    assert_eq!(
        got.version,
        Version {
            major: 3,
            minor: 13,
            micro: 0,
            free_threaded: false
        }
    );
    let l = got.layout;
    // Verified on this machine (interpreters-notes.md §2).
    assert_eq!((l.tstate_frame, l.frame_previous, l.frame_code), (72, 8, 0));
    assert_eq!((l.frame_instr, l.frame_owner, l.owner_cstack), (56, 70, 3));
    assert_eq!(
        (l.code_filename, l.code_qualname, l.code_linetable),
        (112, Some(128), 136)
    );
    assert_eq!(
        (l.code_firstlineno, l.code_adaptive, l.code_name),
        (68, Some(200), 120)
    );
    assert_eq!(
        (l.unicode_state, l.unicode_length, l.unicode_ascii_data),
        (32, 16, 40)
    );
    assert_eq!(
        (l.unicode_compact_data, l.bytes_size, l.bytes_data),
        (56, 16, 32)
    );
    assert_eq!(
        (
            l.object_type,
            l.frame_size,
            l.code_size,
            l.frame_code_tagged
        ),
        (8, 72, 144, false)
    );
    assert_eq!(l.tstate_native_id, Some(160));
    assert_eq!(l, expect(&image_313(false), 13, false));
    // autoTSSkey: PyGILState_GetThisThreadState starts with `lea 0x870(%rax),%rbx`
    // (%rax = &_PyRuntime from the GOT).
    let code = symbol_bytes(&file, "PyGILState_GetThisThreadState", 16);
    let lea = [&[0x48, 0x8d, 0x98][..], &l.runtime_autotss.to_le_bytes()].concat();
    assert!(code.windows(lea.len()).any(|w| w == lea), "{code:02x?}");
}

/// Debian sid's python3.14 as `make python314-root` unpacks it (static, stripped, non-PIE).
const DEBIAN_314: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../target/python314/root/usr/bin/python3.14"
);

#[test]
fn real_debian_314() {
    let Ok(data) = std::fs::read(DEBIAN_314) else {
        eprintln!("SKIP {DEBIAN_314}: not built (make python314-root)");
        return;
    };
    let file = object::File::parse(&*data).unwrap();
    let got = parse(symbol_bytes(&file, "_PyRuntime", READ_LEN)).unwrap();
    assert_eq!((got.version.minor, got.version.free_threaded), (14, false));
    let l = got.layout;
    // Read from 3.14.10's table and checked in the running interpreter (PyCode_Type's
    // tp_basicsize is 208, co_code_adaptive's offset).
    assert_eq!((l.tstate_frame, l.frame_previous, l.frame_code), (72, 8, 0));
    assert_eq!((l.frame_instr, l.frame_owner, l.owner_cstack), (56, 74, 3));
    assert_eq!(
        (l.code_filename, l.code_qualname, l.code_linetable),
        (112, Some(128), 136)
    );
    assert_eq!(
        (l.code_firstlineno, l.code_adaptive, l.code_name),
        (68, Some(208), 120)
    );
    assert_eq!(
        (
            l.unicode_state,
            l.unicode_ascii_data,
            l.unicode_compact_data
        ),
        (32, 40, 56)
    );
    assert_eq!(
        (l.frame_size, l.code_size, l.frame_code_tagged),
        (80, 144, true)
    );
    assert_eq!((l.tstate_thread_id, l.tstate_native_id), (152, Some(160)));
    // autoTSSkey: PyGILState_GetThisThreadState is `endbr64; cmpl $0, rel32(%rip)` on
    // `_PyRuntime + 0x920` (the key's `_is_initialized`), then `PyThread_tss_get` of it.
    let code = symbol_bytes(&file, "PyGILState_GetThisThreadState", 11);
    assert_eq!(
        code[..6],
        [0xf3, 0x0f, 0x1e, 0xfa, 0x83, 0x3d],
        "{code:02x?}"
    );
    let rel = i32::from_le_bytes(code[6..10].try_into().unwrap());
    let sym = |n: &str| {
        file.dynamic_symbols()
            .find(|s| s.name() == Ok(n))
            .unwrap()
            .address()
    };
    let target = sym("PyGILState_GetThisThreadState") + 11;
    let target = target.wrapping_add_signed(i64::from(rel));
    assert_eq!(target - sym("_PyRuntime"), u64::from(l.runtime_autotss));
}

/// The free-threaded builds `make python-ft` makes (static, with symbols).
const FREE_THREADED: [(&str, u8); 2] = [
    (
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/python-ft313/build/python"
        ),
        13,
    ),
    (
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/python-ft314/build/python"
        ),
        14,
    ),
];

#[test]
fn real_free_threaded_builds() {
    for (path, minor) in FREE_THREADED {
        let Ok(data) = std::fs::read(path) else {
            eprintln!("SKIP {path}: not built (make python-ft)");
            continue;
        };
        let file = object::File::parse(&*data).unwrap();
        let got = parse(symbol_bytes(&file, "_PyRuntime", READ_LEN)).unwrap();
        assert_eq!(
            (got.version.minor, got.version.free_threaded),
            (minor, true)
        );
        let l = got.layout;
        // The free-threaded object head: ob_tid, flags, ob_ref_local, ob_ref_shared, ob_type.
        assert_eq!(l.object_type, 24, "{path}");
        // 3.14t threads run their own bytecode copies; 3.13t has none.
        assert_eq!(l.frame_tlbc_index.is_some(), minor >= 14, "{path}");
        assert_eq!(l.code_tlbc.is_some(), minor >= 14, "{path}");
        if let (Some(index), Some(tlbc)) = (l.frame_tlbc_index, l.code_tlbc) {
            assert!(
                index + 4 <= l.frame_size,
                "{path}: frame read covers tlbc_index"
            );
            assert!(tlbc > l.code_firstlineno, "{path}: co_tlbc {tlbc}");
        }
        // autoTSSkey: PyGILState_GetThisThreadState starts `push %rbx; lea rel32(%rip),%rbx`
        // on `_PyRuntime + autotss`, then calls `PyThread_tss_is_created` on it.
        let code = symbol_bytes(&file, "PyGILState_GetThisThreadState", 8);
        assert_eq!(code[..4], [0x53, 0x48, 0x8d, 0x1d], "{path}: {code:02x?}");
        let rel = i32::from_le_bytes(code[4..8].try_into().unwrap());
        let sym = |n: &str| {
            file.dynamic_symbols()
                .find(|s| s.name() == Ok(n))
                .unwrap()
                .address()
        };
        let target = (sym("PyGILState_GetThisThreadState") + 8).wrapping_add_signed(i64::from(rel));
        assert_eq!(
            target - sym("_PyRuntime"),
            u64::from(l.runtime_autotss),
            "{path}"
        );
    }
}
