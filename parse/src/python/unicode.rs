//! TODO(helper): see /work/notes/common27.md
