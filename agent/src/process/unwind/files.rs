//! File identity: which table a file has, and what the sampler may know of a file by its
//! inode alone.
//!
//! - A file seen before (the same [`FileId`]: device, inode, size, mtime and ctime; an
//!   inode freed and reused by another file differs at least in its ctime, which no one can
//!   set) is not read again: its table, or that it has none, is remembered.
//! - Objects whose bytes compile to no table (no CFI, malformed, over a cap) are never
//!   parsed again: the same bytes fail the same way (a process reloaded at each of its mmaps
//!   re-parsed them every time).
//! - The file opened for a mapping must be the inode the mapping names (a file opened by its
//!   path inside the process's root may be another).
//! - What `unwind_files` holds: the kernel's (dev, inode) → table id, segments, and the
//!   file's size and ctime, which the sampler checks against the inode it finds (the inode
//!   may since have been freed and given to another file).

use std::collections::{HashMap, HashSet};
use std::fs::{File, Metadata};
use std::os::unix::fs::MetadataExt;

use super::slots::TableId;
use super::store::TableKey;
use crate::capture::unwind::{
    ember_unwind_file, ember_unwind_file_key, ember_unwind_segment, UnwindIo, FILES, FILE_SEGMENTS,
};
use crate::metrics::{Cache, Metrics, TableBuild};
use crate::os::file_id::{FileId, FileTime};

/// File identities remembered (each is a few dozen bytes); also the cap of the other
/// per-file and per-table sets of the loader.
pub(super) const MAX_FILES: usize = 65_536;

/// A file as the kernel names it (`struct ember_unwind_file_key`): its device as the
/// kernel encodes it ([`kernel_dev`]) and its inode.
pub(super) type KernelFile = (u64, u64);

/// What an `unwind_files` entry says of a file besides its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Published {
    /// The file's table.
    pub(super) key: TableKey,
    /// The file's size when read.
    pub(super) size: u64,
    /// The file's ctime when read.
    pub(super) ctime: FileTime,
}

impl Published {
    /// What a file of identity `id` with table `key` is published as.
    pub(super) fn new(key: TableKey, id: &FileId) -> Self {
        Self {
            key,
            size: id.size,
            ctime: id.ctime,
        }
    }
}

/// The loader's knowledge of files; see the module documentation.
#[derive(Debug, Default)]
pub(super) struct Files {
    /// Files already identified: their table, or `None` (no table: frame pointers).
    ids: HashMap<FileId, Option<TableKey>>,
    /// Tables whose bytes compile to nothing.
    unbuildable: HashSet<TableKey>,
    /// What `unwind_files` holds.
    published: HashMap<KernelFile, Published>,
}

impl Files {
    /// What is known of a file: `Some(table or None)` if it was identified before.
    pub(super) fn known(&self, id: &FileId) -> Option<Option<TableKey>> {
        self.ids.get(id).copied()
    }

    /// Remembers a file's table (or that it has none), forgetting every file at the cap.
    pub(super) fn remember(&mut self, id: FileId, key: Option<TableKey>, metrics: &Metrics) {
        if self.ids.len() >= MAX_FILES {
            self.ids.clear();
            metrics.dropped(Cache::UnwindObjects, MAX_FILES as u64);
        }
        self.ids.insert(id, key);
    }

    /// Whether `key`'s bytes compile to no table.
    pub(super) fn is_unbuildable(&self, key: &TableKey) -> bool {
        self.unbuildable.contains(key)
    }

    /// Notes that `key`'s bytes compile to no table.
    pub(super) fn unbuildable(&mut self, key: TableKey) {
        if self.unbuildable.len() >= MAX_FILES {
            self.unbuildable.clear();
        }
        self.unbuildable.insert(key);
    }

    /// What `unwind_files` says of `file`.
    pub(super) fn published(&self, file: &KernelFile) -> Option<&Published> {
        self.published.get(file)
    }

    /// Tells the sampler which table `file` has (`id`, loaded, with `segments`), so a
    /// process that maps it is walked from its own memory map before the loader has read
    /// the process (a process that exec'd a moment ago). The table must be committed.
    pub(super) fn publish(
        &mut self,
        io: &mut impl UnwindIo,
        file: KernelFile,
        p: Published,
        (id, segments): (TableId, &[(u64, u64, u64)]),
        metrics: &Metrics,
    ) {
        if self.published.len() >= FILES && !self.published.contains_key(&file) {
            metrics.dropped(Cache::UnwindFiles, 1);
            return;
        }
        match io.write_file(file_key(file), &file_value(id, &p, segments)) {
            Ok(()) => {
                self.published.insert(file, p);
            }
            Err(_) => metrics.dropped(Cache::UnwindFiles, 1),
        }
    }

    /// Takes `key`'s files out of `unwind_files` (before its slot is freed).
    pub(super) fn unpublish(&mut self, io: &mut impl UnwindIo, key: TableKey) {
        self.published.retain(|&file, p| {
            if p.key != key {
                return true;
            }
            io.delete_file(file_key(file));
            false
        });
    }
}

/// The identity of `file`, opened for a mapping of `inode`, with its metadata; the
/// refusal (counted by the caller) if it is not a regular file or not that inode.
pub(super) fn identify(file: &File, inode: u64) -> Option<Result<(FileId, Metadata), TableBuild>> {
    let meta = file.metadata().ok()?;
    if !meta.is_file() {
        return Some(Err(TableBuild::Unreadable));
    }
    // The device is not compared: btrfs and overlayfs stat a file with another device
    // number than the mapping shows for it.
    if meta.ino() != inode {
        return Some(Err(TableBuild::OtherFile));
    }
    Some(Ok((FileId::of(&meta), meta)))
}

/// The kernel's own encoding of a device number (`MKDEV`), as the sampler reads it from
/// `inode->i_sb->s_dev`; `/proc/PID/maps` prints its major and minor.
pub(super) fn kernel_dev((major, minor): (u32, u32)) -> u64 {
    (u64::from(major) << 20) | u64::from(minor)
}

fn file_key((dev, ino): KernelFile) -> ember_unwind_file_key {
    ember_unwind_file_key { dev, ino }
}

/// The `unwind_files` value of a file published as `p` with table `id`.
fn file_value(id: TableId, p: &Published, segments: &[(u64, u64, u64)]) -> ember_unwind_file {
    let mut v = ember_unwind_file {
        table: id.0,
        size: p.size,
        ctime_sec: p.ctime.sec,
        ctime_nsec: p.ctime.nsec,
        ..Default::default()
    };
    for (out, &(vaddr, offset, size)) in v.segments.iter_mut().zip(segments) {
        *out = ember_unwind_segment {
            vaddr,
            offset,
            size,
        };
    }
    // At most FILE_SEGMENTS: fits.
    v.count = segments.len().min(FILE_SEGMENTS) as u32;
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::unwind::fake::FakeMaps;

    #[test]
    fn kernel_dev_is_mkdev() {
        // /proc/PID/maps prints "fe:01"; the kernel's s_dev is MKDEV(0xfe, 1).
        assert_eq!(kernel_dev((0xfe, 1)), (0xfe << 20) | 1);
        assert_eq!(kernel_dev((8, 0x12)), 0x0080_0012);
    }

    #[test]
    fn an_entry_carries_the_table_the_segments_and_the_ctime() {
        let p = Published {
            key: [1; 16],
            size: 4096,
            ctime: FileTime {
                sec: 1_700_000_000,
                nsec: 7,
            },
        };
        let segs: Vec<(u64, u64, u64)> = (1..=6).map(|i| (i << 12, i, i * 10)).collect();
        let v = file_value(TableId(0x5003), &p, &segs);
        assert_eq!((v.table, v.count, v.size), (0x5003, 4, 4096));
        assert_eq!((v.ctime_sec, v.ctime_nsec, v.pad), (1_700_000_000, 7, 0));
        assert_eq!(
            (
                v.segments[3].vaddr,
                v.segments[3].offset,
                v.segments[3].size
            ),
            (4 << 12, 4, 40)
        );
        let v = file_value(TableId(1), &p, &segs[..1]);
        assert_eq!((v.count, v.segments[1].vaddr), (1, 0));
    }

    #[test]
    fn published_files_go_with_their_table() {
        let (m, mut io, mut f) = (Metrics::new(), FakeMaps::default(), Files::default());
        let (a, b) = ([1; 16], [2; 16]);
        let p = |key| Published {
            key,
            size: 1,
            ctime: FileTime::default(),
        };
        f.publish(&mut io, (8, 1), p(a), (TableId(0), &[]), &m);
        f.publish(&mut io, (8, 2), p(a), (TableId(0), &[]), &m);
        f.publish(&mut io, (8, 3), p(b), (TableId(1), &[]), &m);
        assert_eq!(io.files.len(), 3);
        f.unpublish(&mut io, a);
        assert_eq!(io.files.keys().copied().collect::<Vec<_>>(), [(8, 3)]);
        assert_eq!(f.published(&(8, 3)), Some(&p(b)));
        assert_eq!(f.published(&(8, 1)), None);
    }

    #[test]
    fn a_file_that_is_not_the_mapped_inode_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").expect("write");
        let file = File::open(&path).expect("open");
        let ino = file.metadata().expect("stat").ino();
        assert!(matches!(identify(&file, ino), Some(Ok((id, _))) if id.ino == ino));
        assert_eq!(
            identify(&file, ino + 1).map(|r| r.err()),
            Some(Some(TableBuild::OtherFile))
        );
        let d = File::open(dir.path()).expect("dir");
        let d_ino = d.metadata().expect("stat").ino();
        assert_eq!(
            identify(&d, d_ino).map(|r| r.err()),
            Some(Some(TableBuild::Unreadable))
        );
    }
}
