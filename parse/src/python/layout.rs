//! Where CPython keeps what ember reads, per minor version (x86-64, GIL builds): the
//! thread state's frame chain for the BPF walker, and the code and string objects for
//! the symbolizer. 3.13+ come from `_Py_DebugOffsets` ([`super::debug_offsets`]); older
//! minors from [`layout_for`]'s table.

use super::Version;

/// How the walker finds a thread's `PyThreadState` and steps its frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameModel {
    /// 3.8–3.10: `PyFrameObject`s, one per C call of the eval loop.
    Objects,
    /// 3.11: `_PyInterpreterFrame`s; an eval call runs frames up to one marked `is_entry`.
    Entry,
    /// 3.12+: `_PyInterpreterFrame`s; an eval call's frames end at one owned by the C stack.
    CStack,
}

/// Byte offsets of the fields ember reads (see the field docs), for one interpreter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The frame model of this version.
    pub model: FrameModel,
    /// Offset in `_PyRuntime` of the `Py_tss_t` `autoTSSkey` (its key is 4 bytes further).
    pub runtime_autotss: u32,
    /// `PyThreadState`: ≤3.10 `frame`; 3.11/3.12 `cframe`; 3.13+ `current_frame`.
    pub tstate_frame: u16,
    /// 3.11/3.12: `_PyCFrame.current_frame`; `None` where `tstate_frame` is the frame.
    pub cframe_current: Option<u16>,
    /// `PyThreadState.native_thread_id` (3.11+), the thread's id in its pid namespace.
    pub tstate_native_id: Option<u16>,
    /// `PyThreadState.thread_id`: the `pthread_self()` of the thread that made the state
    /// (on x86-64 glibc and musl, its thread pointer, `fsbase`).
    pub tstate_thread_id: u16,
    /// ≤3.11: offset in `_PyRuntime` of `gilstate.tstate_current`, the GIL holder's state
    /// (a fallback when the thread-specific key cannot be read); `None` from 3.12.
    pub runtime_tstate_current: Option<u32>,
    /// Frame: its code object (`f_code`, 3.13+ `f_executable`).
    pub frame_code: u16,
    /// Frame: the caller's frame (`f_back`, 3.11+ `previous`).
    pub frame_previous: u16,
    /// Frame: ≤3.10 `f_lasti` (an int); 3.11+ `prev_instr`/`instr_ptr` (a pointer).
    pub frame_instr: u16,
    /// Frame: 3.11 `is_entry`, 3.12+ `owner` (one byte); 0 for ≤3.10.
    pub frame_owner: u16,
    /// 3.12+: an `owner` at or above this value marks the entry frame of an eval call,
    /// which ends that call's run of frames: 3.12/3.13 `FRAME_OWNED_BY_CSTACK` (3); 3.14
    /// `FRAME_OWNED_BY_INTERPRETER` (3, the entry frame's) and `FRAME_OWNED_BY_CSTACK` (4).
    pub owner_cstack: u8,
    /// Bytes of a frame the walker reads at once (covers the fields above).
    pub frame_size: u16,
    /// Code: `co_firstlineno` (an int), the walker's fingerprint.
    pub code_firstlineno: u16,
    /// Code: `co_filename`.
    pub code_filename: u16,
    /// Code: `co_name`.
    pub code_name: u16,
    /// Code: `co_qualname` (3.11+).
    pub code_qualname: Option<u16>,
    /// Code: `co_lnotab` (≤3.9), `co_linetable` (3.10+).
    pub code_linetable: u16,
    /// Code: `co_code_adaptive` (3.11+), where instruction offsets count from.
    pub code_adaptive: Option<u16>,
    /// Bytes of a code object the symbolizer reads (`PyCode_Type.tp_basicsize`, capped).
    pub code_size: u16,
    /// `PyUnicodeObject`: its `state` bit field.
    pub unicode_state: u16,
    /// `PyUnicodeObject`: `length` in code points.
    pub unicode_length: u16,
    /// `PyASCIIObject` size: where a compact ASCII string's characters start.
    pub unicode_ascii_data: u16,
    /// `PyCompactUnicodeObject` size: where other compact strings' characters start.
    pub unicode_compact_data: u16,
    /// `PyBytesObject`: `ob_size`.
    pub bytes_size: u16,
    /// `PyBytesObject`: `ob_sval`.
    pub bytes_data: u16,
    /// `PyObject`: `ob_type` (8 in GIL builds, 24 in free-threaded ones).
    pub object_type: u16,
    /// Whether `frame_code` holds a tagged `_PyStackRef` (3.14+): clear its low bits
    /// ([`super::debug_offsets::STACKREF_TAG_MASK`]) before using it as an address.
    pub frame_code_tagged: bool,
    /// Frame: `tlbc_index` (3.14+ free-threaded builds): which copy of the bytecode the
    /// thread runs (`co_tlbc->entries[i]`; 0 is `co_code_adaptive`); `None` elsewhere.
    pub frame_tlbc_index: Option<u16>,
    /// Code: `co_tlbc` (3.14+ free-threaded builds), the `_PyCodeArray` of the threads'
    /// bytecode copies (`{size, entries[size]}`); `None` elsewhere.
    pub code_tlbc: Option<u16>,
    /// Offset in `_PyRuntime` of `interpreters.head`, the newest interpreter (the main
    /// one in a process without subinterpreters): where the attach check starts.
    pub runtime_interp_head: u32,
    /// `PyInterpreterState`: `tstate_head` (≤3.10), `threads.head` (3.11+), the newest
    /// thread's state; the main thread's is the last of the `next` chain.
    pub interp_threads_head: u32,
    /// `PyThreadState.next`, the next older thread's state.
    pub tstate_next: u16,
}

/// The layout of a GIL build of `version` from ember's table (3.8–3.13), or `None` for a
/// version it does not know (another major, an unknown minor, any free-threaded build):
/// refused, never guessed. 3.13 is also read from `_Py_DebugOffsets`; this entry is the
/// fallback and the cross-check. No micro release is known to move a field, so the table
/// is per minor (verified on 3.8.18, 3.9.18, 3.10.13, 3.11.2, 3.11.7, 3.12.1, 3.13.0).
pub fn layout_for(version: Version) -> Option<Layout> {
    if version.major != 3 || version.free_threaded {
        return None;
    }
    match version.minor {
        8 => Some(V3_8),
        9 => Some(V3_9),
        10 => Some(V3_10),
        11 => Some(V3_11),
        12 => Some(V3_12),
        13 => Some(V3_13),
        _ => None,
    }
}

// Every value below was read from the version's installed headers and measured inside the
// real interpreter by `testdata/offsets.py` (see `layout_tests.rs`).

/// 3.8: `PyFrameObject`s; `frame`/`thread_id` in `PyThreadState`; `gilstate` in `_PyRuntime`.
const V3_8: Layout = Layout {
    model: FrameModel::Objects,
    runtime_autotss: 0x570,
    tstate_frame: 24,
    cframe_current: None,
    tstate_native_id: None,
    tstate_thread_id: 176,
    runtime_tstate_current: Some(0x558),
    frame_code: 32,
    frame_previous: 24,
    // f_lasti: an int, in bytes of bytecode.
    frame_instr: 104,
    frame_owner: 0,
    owner_cstack: 0,
    frame_size: 112,
    code_firstlineno: 40,
    code_filename: 104,
    code_name: 112,
    code_qualname: None,
    // co_lnotab.
    code_linetable: 120,
    code_adaptive: None,
    code_size: 176,
    unicode_state: 32,
    unicode_length: 16,
    unicode_ascii_data: 48,
    unicode_compact_data: 72,
    bytes_size: 16,
    bytes_data: 32,
    object_type: 8,
    frame_code_tagged: false,
    frame_tlbc_index: None,
    code_tlbc: None,
    runtime_interp_head: 32,
    interp_threads_head: 8,
    tstate_next: 8,
};

/// 3.9: as 3.8 but `_PyRuntime` shrank (`gilstate` moved up).
const V3_9: Layout = Layout {
    runtime_autotss: 0x248,
    runtime_tstate_current: Some(0x238),
    ..V3_8
};

/// 3.10: as 3.9 but `f_lasti` counts code units, 8 bytes earlier; `co_linetable` replaces
/// `co_lnotab` at the same offset.
const V3_10: Layout = Layout {
    frame_instr: 96,
    frame_size: 104,
    ..V3_9
};

/// 3.11: `_PyInterpreterFrame`s reached through `cframe`, entry frames flagged.
const V3_11: Layout = Layout {
    model: FrameModel::Entry,
    runtime_autotss: 0x250,
    tstate_frame: 56,
    cframe_current: Some(8),
    tstate_native_id: Some(160),
    tstate_thread_id: 152,
    runtime_tstate_current: Some(0x240),
    frame_code: 32,
    frame_previous: 48,
    // prev_instr: a pointer into co_code_adaptive.
    frame_instr: 56,
    // is_entry.
    frame_owner: 68,
    owner_cstack: 0,
    frame_size: 72,
    code_firstlineno: 72,
    code_filename: 112,
    code_name: 120,
    code_qualname: Some(128),
    code_linetable: 136,
    code_adaptive: Some(184),
    code_size: 184,
    runtime_interp_head: 40,
    interp_threads_head: 16,
    ..V3_10
};

/// 3.12: frames end at a C-stack-owned shim; `PyASCIIObject` lost `wstr`.
const V3_12: Layout = Layout {
    model: FrameModel::CStack,
    runtime_autotss: 0x608,
    tstate_frame: 56,
    cframe_current: Some(0),
    tstate_native_id: Some(144),
    tstate_thread_id: 136,
    runtime_tstate_current: None,
    frame_code: 0,
    frame_previous: 8,
    frame_instr: 56,
    // owner.
    frame_owner: 70,
    owner_cstack: 3,
    frame_size: 72,
    code_firstlineno: 68,
    code_adaptive: Some(192),
    code_size: 192,
    unicode_ascii_data: 40,
    unicode_compact_data: 56,
    interp_threads_head: 72,
    ..V3_11
};

/// 3.13: no `cframe` (`current_frame` in the thread state); `f_executable`, `instr_ptr`.
const V3_13: Layout = Layout {
    runtime_autotss: 0x870,
    tstate_frame: 72,
    cframe_current: None,
    tstate_native_id: Some(160),
    tstate_thread_id: 152,
    code_adaptive: Some(200),
    code_size: 200,
    runtime_interp_head: 632,
    interp_threads_head: 7344,
    ..V3_12
};

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
