//! One read of a process from `/proc`: the only code that reads `/proc/PID/{stat,maps,cgroup}`
//! and opens the files a process maps.
//!
//! Both the unwind loader (its ranges and tables) and the process table (names, objects,
//! workload labels) read a process through [`read`]; the loader hands what it read on to the
//! table, since a process that lives 30 ms is gone before the table could read it itself.
//! What is known of a process at one moment lives here ([`Snapshot`]): later readers of
//! per-process facts (the runtime a process embeds) read the same snapshot.
//!
//! Mapping kinds come parsed from [`crate::os::procfs`] ([`RegionKind`]); files are opened
//! only through [`crate::process::object::open_mapped`], inside the process's root.

use std::fs::File;
use std::path::Path;

use crate::metrics::{Metrics, ObjectRefusal, ProcRead};
use crate::os::procfs::{self, MapsEntry};
use crate::process::fs::Mounts;
use crate::process::object::{open_mapped, open_root};
use crate::workload::Cgroup;

/// `/proc/PID/maps` can be megabytes for a JVM; read no more than this.
const MAPS_CAP: u64 = 32 << 20;

/// What one read of a process tells: see the module documentation.
#[derive(Debug)]
pub struct Snapshot {
    /// Process id.
    pub pid: u32,
    /// Start time (clock ticks since boot), telling this process from a later one on its pid.
    pub start_time: u64,
    /// `comm` of the process, from its `stat`.
    pub name: String,
    /// A kernel thread ([`procfs::Stat::kthread`]).
    pub kthread: bool,
    /// Its cgroup, for workload labels; `None` if `/proc/PID/cgroup` was unreadable.
    pub cgroup: Option<Cgroup>,
    /// Whether `/proc/PID/maps` was read (`regions` is empty when not).
    pub maps_read: bool,
    /// Its executable mappings, in the order the kernel lists them.
    pub regions: Vec<Region>,
    /// Its root directory ([`crate::process::object::open_root`]), for debug files.
    pub root: Option<File>,
    /// `(device, inode)` of its executable, when asked for ([`ReadOptions::exe`]).
    pub exe: Option<(u64, u64)>,
    /// Its CPython interpreter, when the unwind loader attached to it.
    pub python: Option<std::sync::Arc<crate::process::python::PyProcess>>,
}

/// One executable mapping and, for a file, what came of opening it.
#[derive(Debug)]
pub struct Region {
    /// The line of `/proc/PID/maps`, its kind parsed.
    pub map: MapsEntry,
    /// The mapped file.
    pub file: Mapped,
}

/// What came of a mapping's file.
#[derive(Debug)]
pub enum Mapped {
    /// No file to open, or the reader was asked not to open it.
    NotOpened,
    /// Opened (a regular file on a local file system, the inode the mapping names).
    Open(File),
    /// Refused (counted in `ember_object_refusals_total` by the open).
    Refused(ObjectRefusal),
}

/// What a read does besides stat, maps, files, root and cgroup.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadOptions {
    /// Also take the executable's identity (one `statx` through `/proc/PID/exe`).
    pub exe: bool,
    /// Stop after `stat` when the process started at this time: the caller knows it already.
    pub unless_started_at: Option<u64>,
}

/// Why a read returned no snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// `/proc/PID/stat` was unreadable: the process is gone (or never was).
    #[error("/proc/PID/stat unreadable")]
    Stat,
    /// The process started at [`ReadOptions::unless_started_at`].
    #[error("the process is known already")]
    Known,
}

/// Reads process `pid` from `proc_root` (`/proc` but in tests): its `stat`, executable
/// mappings, the files of those `open` accepts, its root, cgroup and (as `opts` says) its
/// executable. An unreadable `maps` (counted: `ember_proc_read_errors_total{reason="maps"}`)
/// or malformed lines of it (`maps_line`) still give a snapshot; an unreadable `stat` none.
pub fn read(
    proc_root: &Path,
    pid: u32,
    opts: ReadOptions,
    metrics: &Metrics,
    mut open: impl FnMut(&MapsEntry) -> bool,
) -> Result<Snapshot, ReadError> {
    let dir = proc_root.join(pid.to_string());
    let stat = procfs::read_capped(&dir.join("stat"), procfs::STAT_CAP)
        .ok()
        .and_then(|t| procfs::parse_stat(&t))
        .ok_or(ReadError::Stat)?;
    if opts.unless_started_at == Some(stat.start_time) {
        return Err(ReadError::Known);
    }
    let (entries, maps_read) = match procfs::read_capped(&dir.join("maps"), MAPS_CAP) {
        Ok(text) => {
            let (entries, bad) = procfs::parse_maps(&text);
            if bad > 0 {
                metrics.proc_read_error(ProcRead::MapsLine, bad as u64);
            }
            (entries, true)
        }
        Err(_) => {
            metrics.proc_read_error(ProcRead::Maps, 1);
            (Vec::new(), false)
        }
    };
    // Held while this process is read, no longer: keeps the opens off FUSE and network
    // file systems (process::fs).
    let mut mounts = Mounts::new(&dir, metrics);
    let regions = entries
        .into_iter()
        .filter(|e| e.exec)
        .map(|map| {
            let file = if map.is_file_backed() && open(&map) {
                match open_mapped(&mut mounts, &map, metrics) {
                    Ok(f) => Mapped::Open(f),
                    Err(r) => Mapped::Refused(r),
                }
            } else {
                Mapped::NotOpened
            };
            Region { map, file }
        })
        .collect();
    let root = open_root(&mut mounts);
    drop(mounts);
    Ok(Snapshot {
        pid,
        start_time: stat.start_time,
        name: stat.comm,
        kthread: stat.kthread,
        cgroup: Cgroup::read(pid).ok(),
        maps_read,
        regions,
        root,
        exe: if opts.exe {
            exe_id(proc_root, pid)
        } else {
            None
        },
        python: None,
    })
}

/// `(device, inode)` of the executable of `pid`, without asking its file system anything: an
/// `O_PATH` handle through `/proc/PID/exe` and a `statx` answered from the kernel's cache
/// (`AT_STATX_DONT_SYNC`). A plain `stat` asks a FUSE daemon (`GETATTR`) once its attributes
/// expire, and a daemon that never answers would hold the aggregator at every rename.
pub fn exe_id(proc_root: &Path, pid: u32) -> Option<(u64, u64)> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::OpenOptionsExt;
    let h = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(proc_root.join(pid.to_string()).join("exe"))
        .ok()?;
    let m = crate::os::openat2::stat_cached(h.as_fd(), "", false).ok()?;
    Some((libc::makedev(m.dev.0, m.dev.1), m.ino))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::procfs::RegionKind;

    #[test]
    fn reads_itself() {
        let me = std::process::id();
        let m = Metrics::new();
        let opts = ReadOptions {
            exe: true,
            ..Default::default()
        };
        let mut asked = 0;
        let snap = read(Path::new("/proc"), me, opts, &m, |_| {
            asked += 1;
            true
        })
        .expect("read");
        assert_eq!(snap.pid, me);
        assert!(snap.start_time > 0 && snap.maps_read && !snap.name.is_empty());
        assert!(snap.cgroup.is_some() && snap.root.is_some() && snap.exe.is_some());
        let files = snap.regions.iter().filter(|r| r.map.is_file_backed());
        assert_eq!(files.clone().count(), asked, "asked once per file");
        assert!(files
            .clone()
            .all(|r| matches!(r.file, Mapped::Open(_) | Mapped::Refused(_))));
        let exe = std::fs::read_link("/proc/self/exe").expect("exe");
        assert!(files.clone().any(|r| Path::new(&r.map.path) == exe));
        assert!(snap.regions.iter().all(|r| r.map.exec));
        assert!(snap.regions.iter().any(|r| r.map.kind == RegionKind::Vdso));

        // Known already: stops after stat.
        let again = ReadOptions {
            unless_started_at: Some(snap.start_time),
            ..Default::default()
        };
        let r = read(Path::new("/proc"), me, again, &m, |_| true);
        assert_eq!(r.err(), Some(ReadError::Known));
        // Nothing opened unless asked.
        let snap = read(Path::new("/proc"), me, ReadOptions::default(), &m, |_| {
            false
        })
        .expect("read");
        assert!(snap.exe.is_none());
        assert!(snap
            .regions
            .iter()
            .all(|r| matches!(r.file, Mapped::NotOpened)));
    }

    #[test]
    fn a_process_that_is_gone_gives_no_snapshot() {
        let dir = tempfile::tempdir().expect("tmp");
        let r = read(
            dir.path(),
            7,
            ReadOptions::default(),
            &Metrics::new(),
            |_| true,
        );
        assert_eq!(r.err(), Some(ReadError::Stat));
    }
}
