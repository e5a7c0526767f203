//! TODO(helper): see /work/notes/common27.md

/// The tag bits of a `_PyStackRef` (3.14+): a frame's `f_executable` with these cleared
/// is the code object's address.
pub const STACKREF_TAG_MASK: u64 = 0b11;
