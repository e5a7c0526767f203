//! Processes: the ranges the loader wrote for each process, and the files they map.
//!
//! A process is its pid and its start time: one whose pid now names another process (or
//! none) is forgotten at the next sweep. Kernel threads and other processes without
//! executable mappings are remembered by start time so they are not read again.
//!
//! Files by inode, as the kernel names them (mmap records), can name another file once the
//! inode is freed: the map from inode to table holds only files some process known here
//! still maps (a mapped inode cannot be freed), counted by range, so the entry goes with
//! the last range that maps the file.

use std::collections::HashMap;
use std::path::Path;

use super::slots::TableId;
use super::store::TableKey;
use crate::capture::unwind::{ember_unwind_proc, ember_unwind_range, RANGES, TABLE_NONE};
use crate::os::procfs;

/// A mapped file as `/proc/PID/maps` and the kernel's mmap records name it: device
/// (major, minor) and inode.
pub(super) type Inode = ((u32, u32), u64);

/// One executable range of a process.
#[derive(Debug, Clone)]
pub(super) struct Range {
    /// First address.
    pub(super) start: u64,
    /// Bytes.
    pub(super) len: u32,
    /// `pc - bias` is the object's own address.
    pub(super) bias: u64,
    /// The object's table, `None`: the frame pointer.
    pub(super) table: Option<TableKey>,
    /// The file mapped, when the range has a table: while a process maps it, its inode
    /// names it and no other file.
    pub(super) file: Option<Inode>,
}

/// What the loader wrote of one process.
#[derive(Debug, Clone)]
pub(super) struct Proc {
    /// Its start time, telling it from a later process on its pid.
    pub(super) start_time: u64,
    /// Sorted by start, not overlapping, at most [`RANGES`].
    pub(super) ranges: Vec<Range>,
    /// When the loader last started a full read of it (CLOCK_MONOTONIC ns, as task
    /// records and samples are stamped); 0: never (ranges copied at fork or added from an
    /// mmap record). Records and asks older than the read need no other.
    pub(super) read_ns: u64,
}

/// The processes the loader knows; see the module documentation.
#[derive(Debug, Default)]
pub(super) struct Procs {
    procs: HashMap<u32, Proc>,
    /// Processes without executable mappings (kernel threads), by start time.
    empty: HashMap<u32, u64>,
    /// Tables by inode only, with how many ranges of the processes above map the file.
    inodes: HashMap<Inode, (TableKey, u32)>,
}

/// Processes without executable mappings remembered at most (then all are forgotten).
const MAX_EMPTY: usize = super::files::MAX_FILES;

impl Procs {
    /// `pid`'s ranges.
    pub(super) fn get(&self, pid: u32) -> Option<&Proc> {
        self.procs.get(&pid)
    }

    /// Whether `pid` has ranges.
    pub(super) fn contains(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }

    /// Processes with ranges.
    pub(super) fn len(&self) -> usize {
        self.procs.len()
    }

    /// The processes with a range in `key`'s table.
    pub(super) fn users(&self, key: &TableKey) -> Vec<u32> {
        self.procs
            .iter()
            .filter(|(_, p)| p.ranges.iter().any(|r| r.table.as_ref() == Some(key)))
            .map(|(&pid, _)| pid)
            .collect()
    }

    /// The table of the file at `inode` while a known process maps it.
    pub(super) fn inode_table(&self, inode: &Inode) -> Option<TableKey> {
        self.inodes.get(inode).map(|e| e.0)
    }

    /// Keeps `proc` as `pid`'s ranges (replacing any), counting the files its ranges map.
    pub(super) fn put(&mut self, pid: u32, proc: Proc) {
        for r in &proc.ranges {
            if let (Some(f), Some(key)) = (r.file, r.table) {
                let e = self.inodes.entry(f).or_insert((key, 0));
                // The newest read wins (a file rewritten in place while mapped).
                e.0 = key;
                e.1 = e.1.saturating_add(1);
            }
        }
        // Counted before the old ranges are let go: a file both map keeps its entry.
        if let Some(old) = self.procs.insert(pid, proc) {
            self.release(&old);
        }
    }

    /// Lets go of `pid`'s ranges.
    pub(super) fn take(&mut self, pid: u32) -> Option<Proc> {
        let p = self.procs.remove(&pid)?;
        self.release(&p);
        Some(p)
    }

    /// Uncounts the files of `p`'s ranges: the entry of a file no known process maps goes.
    fn release(&mut self, p: &Proc) {
        let files = p.ranges.iter().filter(|r| r.table.is_some());
        for f in files.filter_map(|r| r.file) {
            if let Some(e) = self.inodes.get_mut(&f) {
                e.1 = e.1.saturating_sub(1);
                if e.1 == 0 {
                    self.inodes.remove(&f);
                }
            }
        }
    }

    /// The start time `pid` was last read at without executable mappings.
    pub(super) fn known_empty(&self, pid: u32) -> Option<u64> {
        self.empty.get(&pid).copied()
    }

    /// Notes that `pid`, started at `start_time`, has no executable mappings.
    pub(super) fn mark_empty(&mut self, pid: u32, start_time: u64) {
        self.empty.insert(pid, start_time);
        if self.empty.len() > MAX_EMPTY {
            self.empty.clear();
        }
    }

    /// Forgets that `pid` had no executable mappings (it exec'd or exited).
    pub(super) fn forget_empty(&mut self, pid: u32) {
        self.empty.remove(&pid);
    }

    /// The processes with ranges whose pid no longer names them in `proc_root`, with their
    /// start times.
    pub(super) fn gone(&self, proc_root: &Path) -> Vec<(u32, u64)> {
        self.procs
            .iter()
            .filter(|(&pid, p)| procfs::start_time(proc_root, pid) != Some(p.start_time))
            .map(|(&pid, p)| (pid, p.start_time))
            .collect()
    }

    /// Forgets the processes without mappings that are gone from `proc_root`.
    pub(super) fn sweep_empty(&mut self, proc_root: &Path) {
        self.empty
            .retain(|&pid, t| procfs::start_time(proc_root, pid) == Some(*t));
    }
}

/// `ranges` with `new` mapped over them: a mapping replaces whatever it overlaps (ld.so maps
/// a library's segments over its first, whole-file mapping); sorted, at most [`RANGES`].
pub(super) fn with_mapping(ranges: &[Range], new: Range) -> Vec<Range> {
    let end = new.start + u64::from(new.len);
    let mut out: Vec<Range> = ranges
        .iter()
        .filter(|r| r.start + u64::from(r.len) <= new.start || r.start >= end)
        .cloned()
        .collect();
    out.push(new);
    out.sort_by_key(|r| r.start);
    out.truncate(RANGES);
    out
}

/// The value the walker reads for a process with `ranges`: each with its table's id while
/// loaded (`id_of`), else [`TABLE_NONE`] (the frame pointer); at most [`RANGES`].
pub(super) fn proc_value(
    ranges: &[Range],
    id_of: impl Fn(&TableKey) -> Option<TableId>,
) -> ember_unwind_proc {
    let mut v = ember_unwind_proc::default();
    for (out, r) in v.ranges.iter_mut().zip(ranges) {
        let table = r
            .table
            .as_ref()
            .and_then(&id_of)
            .map_or(TABLE_NONE, |id| id.0);
        *out = ember_unwind_range {
            start: r.start,
            bias: r.bias,
            len: r.len,
            table,
        };
    }
    // At most RANGES: fits.
    v.count = ranges.len().min(RANGES) as u32;
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: u64, len: u32, table: Option<u8>, ino: u64) -> Range {
        Range {
            start,
            len,
            bias: start,
            table: table.map(|t| [t; 16]),
            file: table.map(|_| ((8, 1), ino)),
        }
    }

    #[test]
    fn an_inode_names_a_table_while_a_process_maps_it() {
        let mut p = Procs::default();
        let f = ((8, 1), 42);
        let proc = |ranges| Proc {
            start_time: 1,
            ranges,
            read_ns: 0,
        };
        p.put(10, proc(vec![range(0x1000, 0x1000, Some(1), 42)]));
        p.put(11, proc(vec![range(0x1000, 0x1000, Some(1), 42)]));
        assert_eq!(p.inode_table(&f), Some([1; 16]));
        // 10 exits: 11 still maps the file.
        assert!(p.take(10).is_some());
        assert_eq!(p.inode_table(&f), Some([1; 16]));
        // 11 is read again without it (unmapped): the inode names nothing any more.
        p.put(11, proc(vec![range(0x5000, 0x1000, None, 0)]));
        assert_eq!(p.inode_table(&f), None);
        assert_eq!(p.users(&[1; 16]), Vec::<u32>::new());
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn a_mapping_replaces_what_it_overlaps() {
        let old = vec![
            range(0x1000, 0x1000, Some(1), 1),
            range(0x4000, 0x4000, Some(2), 2),
            range(0x9000, 0x1000, None, 0),
        ];
        let got = with_mapping(&old, range(0x5000, 0x1000, Some(3), 3));
        let starts: Vec<u64> = got.iter().map(|r| r.start).collect();
        assert_eq!(starts, [0x1000, 0x5000, 0x9000]);
        let many: Vec<Range> = (0..RANGES as u64)
            .map(|i| range(0x10_0000 + i * 0x1000, 0x1000, None, 0))
            .collect();
        assert_eq!(with_mapping(&many, range(0, 0x1000, None, 0)).len(), RANGES);
    }

    #[test]
    fn the_walker_value_names_loaded_tables_only() {
        let ranges = vec![
            range(0x1000, 0x100, Some(1), 1),
            range(0x2000, 0x200, Some(2), 2),
            range(0x3000, 0x300, None, 0),
        ];
        let v = proc_value(&ranges, |k| (k == &[1; 16]).then_some(TableId(0x1007)));
        assert_eq!(v.count, 3);
        let got: Vec<(u64, u64, u32, u32)> = v.ranges[..3]
            .iter()
            .map(|r| (r.start, r.bias, r.len, r.table))
            .collect();
        assert_eq!(
            got,
            [
                (0x1000, 0x1000, 0x100, 0x1007),
                (0x2000, 0x2000, 0x200, TABLE_NONE),
                (0x3000, 0x3000, 0x300, TABLE_NONE),
            ]
        );
        assert_eq!((v.ranges[3].start, v.flags), (0, 0));
    }
}
