//! Layouts for tests and fuzz targets of the string and code readers (the real ones come
//! from `layout_for` and `_Py_DebugOffsets`).

use crate::python::layout::{FrameModel, Layout};

/// A GIL build's layout with the string and bytes fields of 3.8–3.11 (`wstr` in the ASCII
/// head) or 3.12+ as this machine's interpreters have them; the frame and code fields are
/// zero (see [`layout_312`]).
pub fn gil_layout(minor: u8) -> Layout {
    let (ascii, compact) = if minor >= 12 { (40, 56) } else { (48, 72) };
    Layout {
        model: FrameModel::CStack,
        runtime_autotss: 0,
        tstate_frame: 0,
        cframe_current: None,
        tstate_native_id: None,
        tstate_thread_id: 0,
        runtime_tstate_current: None,
        frame_code: 0,
        frame_previous: 0,
        frame_instr: 0,
        frame_owner: 0,
        owner_cstack: 0,
        frame_size: 0,
        code_firstlineno: 0,
        code_filename: 0,
        code_name: 0,
        code_qualname: None,
        code_linetable: 0,
        code_adaptive: None,
        code_size: 0,
        unicode_state: 32,
        unicode_length: 16,
        unicode_ascii_data: ascii,
        unicode_compact_data: compact,
        bytes_size: 16,
        bytes_data: 32,
        object_type: 8,
        frame_code_tagged: false,
        frame_tlbc_index: None,
        code_tlbc: None,
        runtime_interp_head: 0,
        interp_threads_head: 0,
        tstate_next: 8,
    }
}

/// [`gil_layout`] of 3.12 with code-object fields (`co_firstlineno` 48, `co_filename` 112,
/// `co_name` 120, `co_qualname` 128, `co_linetable` 136, 200 bytes read).
pub fn layout_312() -> Layout {
    Layout {
        code_firstlineno: 48,
        code_filename: 112,
        code_name: 120,
        code_qualname: Some(128),
        code_linetable: 136,
        code_size: 200,
        ..gil_layout(12)
    }
}
