//! The attach check: before a process's frames are walked, every code object on its main
//! thread's frame chain must be of the interpreter's code type. A layout that reads the
//! wrong words (a patched build, a version that lied) fails it on the first frames, so
//! the process gets native frames only, counted, instead of Python frames named from
//! garbage.

use ember_parse::python::layout::{FrameModel, Layout};

use super::memory::ProcMem;

/// Frames of the main thread's chain checked (the notes' bound; deeper ones are not read).
pub const MAX_FRAMES: usize = 64;
/// Thread states followed to the main thread's (the oldest, last of the list).
const MAX_THREADS: usize = 1024;
/// Looks at a changing chain: a frame pushed or popped between two reads can make one
/// look wrong, a wrong layout makes every look wrong.
const TRIES: usize = 3;

/// How the check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chain {
    /// Every code object read was a code object (the count; 0 for a chain with none yet).
    Checked(usize),
    /// A frame's code object was not of the code type, in every try.
    NotCode,
    /// The chain could not be read (an exited process, or pointers that lead nowhere).
    Unreadable,
}

/// Checks the main thread's chain of the interpreter whose `_PyRuntime` is at `runtime`.
pub fn check_main_chain(mem: &ProcMem, runtime: u64, layout: &Layout, code_type: u64) -> Chain {
    let mut last = Chain::Unreadable;
    for _ in 0..TRIES {
        last = match look(mem, runtime, layout, code_type) {
            Ok(Some(n)) => return Chain::Checked(n),
            Ok(None) => Chain::NotCode,
            Err(_) => Chain::Unreadable,
        };
    }
    last
}

/// One look: `Some(frames checked)`, `None` at a frame whose code is not a code object.
fn look(mem: &ProcMem, runtime: u64, l: &Layout, code_type: u64) -> std::io::Result<Option<usize>> {
    let interp = mem.u64_at(runtime + u64::from(l.runtime_interp_head))?;
    if interp == 0 {
        return Ok(Some(0));
    }
    let mut ts = mem.u64_at(interp + u64::from(l.interp_threads_head))?;
    for _ in 0..MAX_THREADS {
        let next = if ts == 0 {
            0
        } else {
            mem.u64_at(ts + u64::from(l.tstate_next))?
        };
        if next == 0 {
            break;
        }
        ts = next;
    }
    if ts == 0 {
        return Ok(Some(0));
    }
    let mut frame = mem.u64_at(ts + u64::from(l.tstate_frame))?;
    if let Some(current) = l.cframe_current {
        if frame != 0 {
            frame = mem.u64_at(frame + u64::from(current))?;
        }
    }
    let mut checked = 0;
    for _ in 0..MAX_FRAMES {
        if frame == 0 {
            break;
        }
        match code_at(mem, frame, l, code_type) {
            Ok((Some(true), previous)) => {
                checked += 1;
                frame = previous;
            }
            Ok((None, previous)) => frame = previous,
            Ok((Some(false), _)) => return Ok(None),
            // A chain that leads into unmapped memory past frames that checked out is a
            // broken chain, not a wrong layout: the walker counts it at each sample.
            Err(_) if checked > 0 => break,
            Err(e) => return Err(e),
        }
    }
    Ok(Some(checked))
}

/// The frame at `frame`: whether its code object is one (`None` for a C-stack entry
/// frame, whose executable is a shim or None), and its caller.
fn code_at(
    mem: &ProcMem,
    frame: u64,
    l: &Layout,
    code_type: u64,
) -> std::io::Result<(Option<bool>, u64)> {
    let previous = mem.u64_at(frame + u64::from(l.frame_previous))?;
    if l.model == FrameModel::CStack {
        let mut owner = [0u8];
        mem.read(frame + u64::from(l.frame_owner), &mut owner)?;
        if owner[0] >= l.owner_cstack {
            return Ok((None, previous));
        }
    }
    let mut code = mem.u64_at(frame + u64::from(l.frame_code))?;
    if l.frame_code_tagged {
        code &= !7;
    }
    let is_code = code != 0 && mem.u64_at(code + u64::from(l.object_type))? == code_type;
    Ok((Some(is_code), previous))
}
