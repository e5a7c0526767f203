//! `_Py_DebugOffsets` (3.13+): the table of struct sizes and field offsets CPython puts at
//! the start of `_PyRuntime` for out-of-process tools, parsed into a [`Layout`].
//!
//! The table is static data, so the agent reads it from the object file (and may compare
//! it with process memory). Its own layout changes per minor (3.13: `pycore_runtime.h`;
//! 3.14: `pycore_debug_offsets.h`, with new groups and fields), so each minor has its own
//! list of groups below, in the header's order; a minor without one is refused. Every
//! group with a `size` is validated as pystack does: the size at most [`MAX_STRUCT_SIZE`],
//! each field offset inside it. The table is the same shape in free-threaded (`t`) builds;
//! only its values and the `free_threaded` flag differ.
//!
//! What the table does not carry comes from constants per minor, checked against real
//! builds where this machine has one: the `autoTSSkey` offset in `_PyRuntime`, the owner
//! value of an eval call's entry frame (`pycore_frame.h`, `ceval.c`), and whether
//! `f_executable` is a tagged `_PyStackRef` (3.14).

#[cfg(test)]
mod tests;

use super::layout::{FrameModel, Layout};
use super::Version;

/// The first 8 bytes of the table (`_Py_Debug_Cookie`).
pub const COOKIE: [u8; 8] = *b"xdebugpy";

/// The largest struct size accepted (pystack's bound): a bigger one is a forged table.
pub const MAX_STRUCT_SIZE: u64 = 1 << 20;

/// Bytes to read at `_PyRuntime` for any table this module parses (3.14's is 760).
pub const READ_LEN: usize = 1024;

/// The tag bits of a `_PyStackRef` (3.14+: bit 0; 3.15 uses bits 0–1): a frame's
/// `f_executable` with these cleared is the code object's address (objects are 8-aligned).
pub const STACKREF_TAG_MASK: u64 = 0b11;

/// One `{size, fields…}` group of the table, as the header declares it.
struct Group {
    name: &'static str,
    /// Whether the group starts with the struct's `size` (3.14's `llist_node` and
    /// `debugger_support` do not).
    sized: bool,
    /// The fields after `size`, in order.
    fields: &'static [&'static str],
}

const fn group(name: &'static str, fields: &'static [&'static str]) -> Group {
    Group {
        name,
        sized: true,
        fields,
    }
}

/// 3.13 (`Include/internal/pycore_runtime.h`).
const GROUPS_313: &[Group] = &[
    group("runtime_state", &["finalizing", "interpreters_head"]),
    group(
        "interpreter_state",
        &[
            "id",
            "next",
            "threads_head",
            "gc",
            "imports_modules",
            "sysdict",
            "builtins",
            "ceval_gil",
            "gil_runtime_state",
            "gil_runtime_state_enabled",
            "gil_runtime_state_locked",
            "gil_runtime_state_holder",
        ],
    ),
    group("thread_state", THREAD_STATE),
    group(
        "interpreter_frame",
        &["previous", "executable", "instr_ptr", "localsplus", "owner"],
    ),
    group("code_object", CODE_313),
    group("pyobject", &["ob_type"]),
    group("type_object", &["tp_name", "tp_repr", "tp_flags"]),
    group("tuple_object", &["ob_item", "ob_size"]),
    group("list_object", &["ob_item", "ob_size"]),
    group("dict_object", &["ma_keys", "ma_values"]),
    group("float_object", &["ob_fval"]),
    group("long_object", &["lv_tag", "ob_digit"]),
    group("bytes_object", &["ob_size", "ob_sval"]),
    group("unicode_object", UNICODE),
    group("gc", &["collecting"]),
];

/// 3.14 (`Include/internal/pycore_debug_offsets.h`, as of 3.14b2).
const GROUPS_314: &[Group] = &[
    group("runtime_state", &["finalizing", "interpreters_head"]),
    group(
        "interpreter_state",
        &[
            "id",
            "next",
            "threads_head",
            "threads_main",
            "gc",
            "imports_modules",
            "sysdict",
            "builtins",
            "ceval_gil",
            "gil_runtime_state",
            "gil_runtime_state_enabled",
            "gil_runtime_state_locked",
            "gil_runtime_state_holder",
            "code_object_generation",
            "tlbc_generation",
        ],
    ),
    group("thread_state", THREAD_STATE),
    group(
        "interpreter_frame",
        &[
            "previous",
            "executable",
            "instr_ptr",
            "localsplus",
            "owner",
            "stackpointer",
            "tlbc_index",
        ],
    ),
    group("code_object", CODE_314),
    group("pyobject", &["ob_type"]),
    group("type_object", &["tp_name", "tp_repr", "tp_flags"]),
    group("tuple_object", &["ob_item", "ob_size"]),
    group("list_object", &["ob_item", "ob_size"]),
    group("set_object", &["used", "table", "mask"]),
    group("dict_object", &["ma_keys", "ma_values"]),
    group("float_object", &["ob_fval"]),
    group("long_object", &["lv_tag", "ob_digit"]),
    group("bytes_object", &["ob_size", "ob_sval"]),
    group("unicode_object", UNICODE),
    group("gc", &["collecting"]),
    group("gen_object", &["gi_name", "gi_iframe", "gi_frame_state"]),
    Group {
        name: "llist_node",
        sized: false,
        fields: &["next", "prev"],
    },
    Group {
        name: "debugger_support",
        sized: false,
        fields: &[
            "eval_breaker",
            "remote_debugger_support",
            "remote_debugging_enabled",
            "debugger_pending_call",
            "debugger_script_path",
            "debugger_script_path_size",
        ],
    },
];

const THREAD_STATE: &[&str] = &[
    "prev",
    "next",
    "interp",
    "current_frame",
    "thread_id",
    "native_thread_id",
    "datastack_chunk",
    "status",
];

const CODE_313: &[&str] = &[
    "filename",
    "name",
    "qualname",
    "linetable",
    "firstlineno",
    "argcount",
    "localsplusnames",
    "localspluskinds",
    "co_code_adaptive",
];

const CODE_314: &[&str] = &[
    "filename",
    "name",
    "qualname",
    "linetable",
    "firstlineno",
    "argcount",
    "localsplusnames",
    "localspluskinds",
    "co_code_adaptive",
    "co_tlbc",
];

const UNICODE: &[&str] = &["state", "length", "asciiobject_size"];

/// What a minor's table does not say, beside its groups.
struct MinorSpec {
    groups: &'static [Group],
    /// The `owner` value from which a frame marks an eval call's entry (see
    /// [`Layout::owner_cstack`]).
    owner_cstack: u8,
    /// Whether `f_executable` is a tagged `_PyStackRef`.
    tagged: bool,
    /// `_PyRuntime`'s `autoTSSkey` offset, the same in GIL and free-threaded builds.
    autotss: u32,
}

/// Per minor, what its table does not carry. The `autoTSSkey` offsets were read off
/// `PyGILState_GetThisThreadState`, which tests whether the key is created before reading
/// it: 0x870 in 3.13.0 (`lea 0x870(%rax)` on `_PyRuntime`) and in a free-threaded 3.13.15;
/// 0x920 in Debian's 3.14.10 (`cmpl $0, _PyRuntime+0x920`) and in a free-threaded 3.14.7
/// (`lea _PyRuntime+0x920`). 3.14 still keeps the thread's own state under the key, set
/// while the GIL is released (or, free-threaded, while the thread is detached).
fn minor_spec(minor: u8) -> Option<MinorSpec> {
    match minor {
        // FRAME_OWNED_BY_CSTACK = 3: `_PyEval_EvalFrameDefault`'s entry frame.
        13 => Some(MinorSpec {
            groups: GROUPS_313,
            owner_cstack: 3,
            tagged: false,
            autotss: 0x870,
        }),
        // 3.14 inserts FRAME_OWNED_BY_INTERPRETER = 3 before FRAME_OWNED_BY_CSTACK = 4 and
        // gives the eval call's entry frame the new value (`entry.frame.owner` in ceval.c);
        // 4 is assigned nowhere. Both mark the end of an eval call's run.
        14 => Some(MinorSpec {
            groups: GROUPS_314,
            owner_cstack: 3,
            tagged: true,
            autotss: 0x920,
        }),
        _ => None,
    }
}

/// Whether [`parse`] reads the tables of `version`'s minor (3.13, 3.14).
pub fn parses(version: Version) -> bool {
    version.major == 3 && minor_spec(version.minor).is_some()
}

/// What a table gave: the interpreter's version and build, and its layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DebugOffsets {
    /// `PY_VERSION_HEX` from the table, with its `free_threaded` flag.
    pub version: Version,
    /// The offsets ember reads.
    pub layout: Layout,
}

/// Why a table was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DebugOffsetsError {
    /// Fewer bytes than the table of its minor.
    #[error("debug offsets truncated: {got} of {need} bytes")]
    Short {
        /// Bytes the table needs.
        need: usize,
        /// Bytes given.
        got: usize,
    },
    /// Not starting with `xdebugpy`: no table (≤3.12) or not `_PyRuntime`.
    #[error("no xdebugpy cookie")]
    Cookie,
    /// A version that is not 3.x or a minor without a parser.
    #[error("debug offsets of unsupported version {0:#x}")]
    Version(u64),
    /// A `free_threaded` flag other than 0 or 1.
    #[error("free_threaded flag {0}")]
    FreeThreaded(u64),
    /// A struct size over [`MAX_STRUCT_SIZE`].
    #[error("{group}.size {size} is over the cap")]
    StructTooLarge {
        /// The group.
        group: &'static str,
        /// Its size.
        size: u64,
    },
    /// A field at or past its struct's size.
    #[error("{group}.{field} = {offset} is outside its struct of {size} bytes")]
    FieldOutside {
        /// The group.
        group: &'static str,
        /// The field.
        field: &'static str,
        /// Its offset.
        offset: u64,
        /// The struct's size.
        size: u64,
    },
    /// A field ember reads lies past what its layout can hold (u16) or read at once.
    #[error("{group}.{field} = {offset} is too far for ember's layout")]
    TooFar {
        /// The group.
        group: &'static str,
        /// The field.
        field: &'static str,
        /// Its offset.
        offset: u64,
    },
}

/// The values of a parsed table, by group and field name.
struct Table {
    groups: &'static [Group],
    /// Each group's size (0 for unsized groups) then its fields, in table order.
    values: Vec<u64>,
}

impl Table {
    /// `group.field` (or `group.size` for field `"size"`); `None` only for a name the
    /// minor's groups lack, which the tests rule out for every name the layout uses.
    fn get(&self, group: &str, field: &str) -> Option<u64> {
        let mut at = 0;
        for g in self.groups {
            let len = usize::from(g.sized) + g.fields.len();
            if g.name == group {
                let i = match field {
                    "size" if g.sized => 0,
                    _ => usize::from(g.sized) + g.fields.iter().position(|f| *f == field)?,
                };
                return self.values.get(at + i).copied();
            }
            at += len;
        }
        None
    }

    /// `group.field` as a layout offset: present and small enough for a u16 (a field
    /// of a struct ember reads in one go, at most [`MAX_READ`] bytes in).
    fn far_offset(
        &self,
        group: &'static str,
        field: &'static str,
    ) -> Result<u32, DebugOffsetsError> {
        let offset = self.get(group, field).unwrap_or(u64::MAX);
        match u32::try_from(offset) {
            Ok(o) if u64::from(o) < MAX_POINTER_AT => Ok(o),
            _ => Err(DebugOffsetsError::TooFar {
                group,
                field,
                offset,
            }),
        }
    }

    fn offset(&self, group: &'static str, field: &'static str) -> Result<u16, DebugOffsetsError> {
        let offset = self.get(group, field).unwrap_or(u64::MAX);
        match u16::try_from(offset) {
            Ok(o) if u64::from(o) < MAX_READ => Ok(o),
            _ => Err(DebugOffsetsError::TooFar {
                group,
                field,
                offset,
            }),
        }
    }
}

/// The farthest into a struct ember follows a pointer it reads alone (the attach check's
/// `threads_head`: 7,344 bytes into 3.13's interpreter state).
const MAX_POINTER_AT: u64 = 1 << 20;

/// The farthest into a struct ember reads a field (its code-object read is capped at
/// 4 KiB as well).
const MAX_READ: u64 = 4096;

/// Parses the table at the start of `bytes` (at least [`READ_LEN`] bytes read at
/// `_PyRuntime`, or fewer if the object ends: the minor's own length is checked).
pub fn parse(bytes: &[u8]) -> Result<DebugOffsets, DebugOffsetsError> {
    let word = |i: usize| -> Option<u64> {
        let b = bytes.get(8 * i..8 * i + 8)?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    };
    let short = |need| DebugOffsetsError::Short {
        need,
        got: bytes.len(),
    };
    if bytes.get(..8).ok_or(short(24))? != COOKIE {
        return Err(DebugOffsetsError::Cookie);
    }
    let (hex, ft) = (word(1).ok_or(short(24))?, word(2).ok_or(short(24))?);
    let mut version =
        Version::from_hex(u32::try_from(hex).map_err(|_| DebugOffsetsError::Version(hex))?);
    if version.major != 3 {
        return Err(DebugOffsetsError::Version(hex));
    }
    let spec = minor_spec(version.minor).ok_or(DebugOffsetsError::Version(hex))?;
    version.free_threaded = match ft {
        0 => false,
        1 => true,
        _ => return Err(DebugOffsetsError::FreeThreaded(ft)),
    };
    let words: usize = spec
        .groups
        .iter()
        .map(|g| usize::from(g.sized) + g.fields.len())
        .sum();
    let values = (3..3 + words)
        .map(word)
        .collect::<Option<Vec<u64>>>()
        .ok_or(short(8 * (3 + words)))?;
    let table = Table {
        groups: spec.groups,
        values,
    };
    validate(&table)?;
    let layout = layout(&table, version, &spec)?;
    Ok(DebugOffsets { version, layout })
}

/// Every sized group: its size at most [`MAX_STRUCT_SIZE`], its fields inside it.
fn validate(t: &Table) -> Result<(), DebugOffsetsError> {
    for g in t.groups.iter().filter(|g| g.sized) {
        let size = t.get(g.name, "size").unwrap_or(u64::MAX);
        if size > MAX_STRUCT_SIZE {
            return Err(DebugOffsetsError::StructTooLarge {
                group: g.name,
                size,
            });
        }
        for field in g.fields {
            let offset = t.get(g.name, field).unwrap_or(u64::MAX);
            if offset >= size {
                return Err(DebugOffsetsError::FieldOutside {
                    group: g.name,
                    field,
                    offset,
                    size,
                });
            }
        }
    }
    Ok(())
}

/// The bytes from a struct's start that cover `fields` (offset, width), rounded up to 8.
fn cover(fields: &[(u16, u16)]) -> u16 {
    let end = fields.iter().map(|(o, w)| o + w).max().unwrap_or(0);
    end.div_ceil(8) * 8
}

/// The layout a validated table gives.
fn layout(t: &Table, v: Version, spec: &MinorSpec) -> Result<Layout, DebugOffsetsError> {
    let (frame_code, frame_previous) = (
        t.offset("interpreter_frame", "executable")?,
        t.offset("interpreter_frame", "previous")?,
    );
    let (frame_instr, frame_owner) = (
        t.offset("interpreter_frame", "instr_ptr")?,
        t.offset("interpreter_frame", "owner")?,
    );
    let code = |f| t.offset("code_object", f);
    let (code_filename, code_name, code_qualname) =
        (code("filename")?, code("name")?, code("qualname")?);
    let (code_linetable, code_firstlineno) = (code("linetable")?, code("firstlineno")?);
    let ascii = t.offset("unicode_object", "asciiobject_size")?;
    // A free-threaded 3.14+ thread runs its own copy of the bytecode (`co_tlbc`, picked by
    // the frame's `tlbc_index`); GIL builds publish 0 for both.
    let (frame_tlbc_index, code_tlbc) = if v.free_threaded && v.minor >= 14 {
        (
            Some(t.offset("interpreter_frame", "tlbc_index")?),
            Some(code("co_tlbc")?),
        )
    } else {
        (None, None)
    };
    let tlbc_cover = frame_tlbc_index.map_or((0, 0), |o| (o, 4));
    Ok(Layout {
        model: FrameModel::CStack,
        runtime_autotss: spec.autotss,
        tstate_frame: t.offset("thread_state", "current_frame")?,
        cframe_current: None,
        tstate_native_id: Some(t.offset("thread_state", "native_thread_id")?),
        tstate_thread_id: t.offset("thread_state", "thread_id")?,
        runtime_tstate_current: None,
        frame_code,
        frame_previous,
        frame_instr,
        frame_owner,
        owner_cstack: spec.owner_cstack,
        frame_size: cover(&[
            (frame_code, 8),
            (frame_previous, 8),
            (frame_instr, 8),
            (frame_owner, 1),
            tlbc_cover,
        ]),
        code_firstlineno,
        code_filename,
        code_name,
        code_qualname: Some(code_qualname),
        code_linetable,
        code_adaptive: Some(code("co_code_adaptive")?),
        code_size: cover(&[
            (code_filename, 8),
            (code_name, 8),
            (code_qualname, 8),
            (code_linetable, 8),
            (code_firstlineno, 4),
        ]),
        unicode_state: t.offset("unicode_object", "state")?,
        unicode_length: t.offset("unicode_object", "length")?,
        unicode_ascii_data: ascii,
        // PyCompactUnicodeObject (3.12+): the ASCII head, then utf8_length and utf8.
        unicode_compact_data: ascii + 16,
        bytes_size: t.offset("bytes_object", "ob_size")?,
        bytes_data: t.offset("bytes_object", "ob_sval")?,
        object_type: t.offset("pyobject", "ob_type")?,
        frame_code_tagged: spec.tagged,
        frame_tlbc_index,
        code_tlbc,
        runtime_interp_head: t.far_offset("runtime_state", "interpreters_head")?,
        interp_threads_head: t.far_offset("interpreter_state", "threads_head")?,
        tstate_next: t.offset("thread_state", "next")?,
    })
}
