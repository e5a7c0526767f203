//! The identity of a file as one `fstat` tells it: what every cache of parsed file data
//! (symbol tables, unwind tables) is keyed by, and what the sampler's `unwind_files`
//! entries are checked against.
//!
//! A container can write any build id into its files, but cannot make its file the host's
//! inode. A file replaced in place (an upgrade reusing the inode) changes its size or
//! mtime, and an inode freed and reused by another file changes its ctime too, which the
//! kernel sets and no `utimensat` can (the mtime can be set to anything, even past the
//! year 2262, so times are kept as the kernel keeps them: seconds and nanoseconds, with
//! nothing multiplied that could overflow or saturate two times into one).

use std::fs::{File, Metadata};
use std::os::unix::fs::MetadataExt;

/// A file time as the kernel keeps it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileTime {
    /// Seconds since the epoch (negative before it).
    pub sec: i64,
    /// Nanoseconds within the second, below 10^9.
    pub nsec: u32,
}

impl FileTime {
    fn new(sec: i64, nsec: i64) -> Self {
        // The kernel keeps nanoseconds below 10^9; clamped, never wrapped.
        let nsec = u32::try_from(nsec.clamp(0, 999_999_999)).unwrap_or(0);
        Self { sec, nsec }
    }
}

/// A file's device, inode, size, mtime and ctime: see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Modification time (settable by the file's owner).
    pub mtime: FileTime,
    /// Status change time (set by the kernel only).
    pub ctime: FileTime,
}

impl FileId {
    /// The identity `meta` tells.
    pub fn of(meta: &Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime: FileTime::new(meta.mtime(), meta.mtime_nsec()),
            ctime: FileTime::new(meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// The identity of an open file.
    pub fn of_file(file: &File) -> std::io::Result<Self> {
        Ok(Self::of(&file.metadata()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_far_apart_stay_apart() {
        // Two mtimes past what i64 nanoseconds hold: a saturating product made them equal.
        let a = FileTime::new(i64::MAX, 1);
        let b = FileTime::new(i64::MAX - 1, 999_999_999);
        assert_ne!(a, b);
        assert!(b < a);
        assert!(FileTime::new(-1, 5) < FileTime::new(0, 0));
        assert_eq!(FileTime::new(1, 2_000_000_000).nsec, 999_999_999);
        assert_eq!(FileTime::new(1, -3).nsec, 0);
    }

    #[test]
    fn identity_of_a_file() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc").expect("write");
        let f = File::open(&path).expect("open");
        let id = FileId::of_file(&f).expect("stat");
        let m = std::fs::metadata(&path).expect("stat");
        assert_eq!((id.dev, id.ino, id.size), (m.dev(), m.ino(), 3));
        assert_eq!(id.ctime.sec, m.ctime());
        assert_eq!(i64::from(id.mtime.nsec), m.mtime_nsec());
        // Rewritten in place: the same inode, another identity.
        std::fs::write(&path, b"abcd").expect("rewrite");
        assert_ne!(FileId::of_file(&f).expect("stat"), id);
    }
}
