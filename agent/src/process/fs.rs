//! Which file systems a process's files may be read from: never FUSE or network ones.
//!
//! `O_NONBLOCK` does nothing for FUSE: an `open`, `fstat` (`GETATTR`), `pread` or even a
//! path lookup on a FUSE file system waits for its daemon, and once the daemon has read the
//! request not even `SIGKILL` ends the wait. A pod that runs a FUSE daemon which never
//! answers would hold the pipeline thread that touched its file forever (issue 25: no
//! window closed, `/healthz` failed, a restart hung the same way). Network file systems
//! (NFS, CIFS, 9p, Ceph, ...) wait for a server the same way. So ember reads only files on
//! local file systems ([`FsKind::Local`], sorted by type from `/proc/PID/mountinfo`; an
//! overlay takes the kind of its layers), and refuses the others, counted, without sending
//! them a single request.
//!
//! How a file is checked before its file system is asked anything: it is first opened
//! `O_PATH` (no file system `open` runs: not a FUSE daemon's, not a device driver's), then
//! `statx` with `AT_STATX_DONT_SYNC` (answered from the kernel's caches, even by FUSE and
//! NFS) gives its type, inode and the id of the mount it is on, and that mount is looked up
//! in the process's mountinfo. Only a regular file on a local mount is then opened for
//! reading ([`crate::os::openat2::reopen`]), through that handle: the very inode checked.
//!
//! Why by mount id after the `O_PATH` open, not by the maps entry's device before it: a
//! device number or a mount id is reused as soon as its file system is unmounted, and a
//! process can unmount, mount FUSE and remap an address between ember's read of
//! `/proc/PID/maps` and its open. The handle pins the mount, so the mount it names is the
//! one checked. A mountinfo read after the pin is current: it is kept open and `poll`ed
//! (`POLLPRI` on any mount change) while one process is read, never longer (an open
//! mountinfo keeps its mount namespace, and so a gone container's volumes, alive). Kernels
//! from 6.8 give every mount a 64-bit id that is never reused: its kind is remembered
//! ([`MAX_KNOWN`] of them), so a process whose mounts are all known costs no mountinfo read.
//!
//! Left to a privileged pod (documented in docs/security.md): 9p answers `AT_STATX_DONT_SYNC` and
//! an `O_PATH` open's revalidation by asking its server, and an overlay mounted in another
//! mount namespace names layer paths that do not resolve in the process's.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::metrics::{Cache, Metrics};
pub use crate::os::mountinfo::FsKind;
use crate::os::mountinfo::{self};
use crate::os::openat2::{stat_cached, Meta};

/// Mount kinds remembered by never-reused mount id; past it they are forgotten (counted in
/// `cache_dropped_total{cache="mounts"}`) and learned again.
pub const MAX_KNOWN: usize = 4096;

/// mountinfo is read up to this many bytes (about 25,000 mounts); a mount past it is not
/// found, and its files are refused as on an unknown file system.
const MOUNTINFO_CAP: u64 = 4 << 20;

/// Why a file was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// It is on a FUSE file system.
    #[error("on a FUSE file system")]
    Fuse,
    /// It is on a network file system.
    #[error("on a network file system")]
    Network,
    /// Its mount is in neither the process's mountinfo nor the host's (a mount made
    /// elsewhere and detached, the kernel's internal ones such as memfd's): what it is cannot
    /// be told, so it is not read.
    #[error("on a file system that is not mounted where the process can see it")]
    Unknown,
    /// `statx` failed (the file went away).
    #[error("cannot stat")]
    Stat,
}

/// A mount, as far as reading from it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Known {
    kind: FsKind,
    /// Its file system's device, as `/proc/PID/maps` shows it for a file on it.
    dev: (u32, u32),
}

/// A file checked by [`Mounts::check`]: on a local file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    /// File type bits (`S_IFMT`).
    pub kind: u32,
    /// Inode number.
    pub ino: u64,
    /// The device of the mount it is on (what `/proc/PID/maps` shows for it).
    pub dev: (u32, u32),
    /// The device its file system reports (an overlay may report a layer's).
    pub fs_dev: (u32, u32),
    /// Its mount (the never-reused id, or the mountinfo id on older kernels): two files
    /// with the same one are on the same mount.
    pub mount: u64,
}

impl Checked {
    /// A regular file.
    pub fn is_file(&self) -> bool {
        self.kind == libc::S_IFREG
    }

    /// A directory.
    pub fn is_dir(&self) -> bool {
        self.kind == libc::S_IFDIR
    }
}

/// A mountinfo file held open while one process is read, and what it said.
struct View {
    file: File,
    mounts: HashMap<u32, Known>,
}

impl View {
    fn open(path: &Path) -> Option<Self> {
        let file = File::open(path).ok()?;
        let mut v = View {
            file,
            mounts: HashMap::new(),
        };
        v.read()?;
        Some(v)
    }

    fn read(&mut self) -> Option<()> {
        self.file.rewind().ok()?;
        let mut bytes = Vec::new();
        (&self.file)
            .take(MOUNTINFO_CAP)
            .read_to_end(&mut bytes)
            .ok()?;
        let text = String::from_utf8_lossy(&bytes);
        let (mounts, _) = mountinfo::parse(&text);
        let kinds = mountinfo::kinds(&mounts);
        self.mounts = mounts
            .iter()
            .map(|m| {
                let kind = kinds.get(&m.id).copied().unwrap_or(FsKind::Local);
                (m.id, Known { kind, dev: m.dev })
            })
            .collect();
        Some(())
    }

    /// Reads the table again if a mount changed since it was read (`POLLPRI`).
    fn refresh(&mut self) -> Option<()> {
        use std::os::fd::AsRawFd;
        let mut p = libc::pollfd {
            fd: self.file.as_raw_fd(),
            events: libc::POLLPRI,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        if n > 0 && p.revents & (libc::POLLPRI | libc::POLLERR) != 0 {
            self.read()?;
        }
        Some(())
    }

    fn get(&mut self, id: u32) -> Option<Known> {
        self.refresh()?;
        self.mounts.get(&id).copied()
    }

    /// A mount of the file system whose device is `dev` (see [`Mounts::look_up`]).
    fn by_dev(&mut self, dev: (u32, u32)) -> Option<Known> {
        self.refresh()?;
        self.mounts.values().find(|k| k.dev == dev).copied()
    }
}

/// What every thread shares: kinds by never-reused mount id, and the host's mountinfo
/// (`/proc/1`: its mount namespace lives as long as the host, so holding it open keeps
/// nothing alive that would otherwise go).
struct Shared {
    known: HashMap<u64, Known>,
    host: Option<View>,
    host_tried: bool,
}

fn shared() -> &'static Mutex<Shared> {
    static SHARED: OnceLock<Mutex<Shared>> = OnceLock::new();
    SHARED.get_or_init(|| {
        Mutex::new(Shared {
            known: HashMap::new(),
            host: None,
            host_tried: false,
        })
    })
}

/// Whether this kernel reports never-reused mount ids (learned at the first `statx`).
fn unique_ids() -> &'static std::sync::atomic::AtomicU8 {
    static STATE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(UNTRIED);
    &STATE
}
const UNTRIED: u8 = 0;
const UNIQUE: u8 = 1;
const NOT_UNIQUE: u8 = 2;

/// The mounts of one process while it is read: checks the files ember opens out of it.
/// Reads the process's mountinfo at most once (again only if a mount changes meanwhile),
/// and only when a file is on a mount not known yet. Drop it when done with the process.
pub struct Mounts {
    dir: PathBuf,
    own: Option<View>,
    own_tried: bool,
    /// Kinds are remembered for (and taken from) every thread only when read from the
    /// kernel's `/proc`: a test's made-up mountinfo must neither teach the host anything
    /// nor be overruled by what the host knows.
    shareable: bool,
    metrics: Metrics,
}

impl Mounts {
    /// The mounts of the process whose `/proc` directory is `proc_dir`.
    pub fn new(proc_dir: &Path, metrics: &Metrics) -> Self {
        Self {
            dir: proc_dir.to_owned(),
            own: None,
            own_tried: false,
            shareable: proc_dir.starts_with("/proc"),
            metrics: metrics.clone(),
        }
    }

    /// The `/proc` directory of the process.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Checks the file `handle` names (open it `O_PATH`: this sends its file system
    /// nothing): its type, inode and mount, and that the mount is local. Never blocks on
    /// a FUSE or network file system.
    pub fn check(&mut self, handle: BorrowedFd<'_>) -> Result<Checked, Refusal> {
        let state = unique_ids().load(std::sync::atomic::Ordering::Relaxed);
        let first = stat_cached(handle, "", state != NOT_UNIQUE).map_err(|_| Refusal::Stat)?;
        if state == UNTRIED {
            let s = if first.mount_unique.is_some() {
                UNIQUE
            } else {
                NOT_UNIQUE
            };
            unique_ids().store(s, std::sync::atomic::Ordering::Relaxed);
        }
        let known = match first.mount_unique {
            Some(u) => match self.remembered(u) {
                Some(k) => k,
                None => {
                    let id = stat_cached(handle, "", false)
                        .ok()
                        .and_then(|m| m.mount_id)
                        .ok_or(Refusal::Stat)?;
                    let k = self.look_up(id, first.dev)?;
                    self.remember(u, k);
                    k
                }
            },
            None => self.look_up(first.mount_id.ok_or(Refusal::Stat)?, first.dev)?,
        };
        let mount = first
            .mount_unique
            .or(first.mount_id.map(u64::from))
            .unwrap_or(0);
        match known.kind {
            FsKind::Local => Ok(checked(&first, known.dev, mount)),
            FsKind::Fuse => Err(Refusal::Fuse),
            FsKind::Network => Err(Refusal::Network),
        }
    }

    /// Checks the file `name` in the directory `dir` (both already checked as local) without
    /// opening it: its type and mount, which must be `dir`'s own (no mount crossed).
    pub fn check_in(&mut self, dir: &File, name: &str, in_dir: &Checked) -> Option<Checked> {
        let unique = unique_ids().load(std::sync::atomic::Ordering::Relaxed) == UNIQUE;
        let m = stat_cached(dir.as_fd(), name, unique).ok()?;
        let mount = m.mount_unique.or(m.mount_id.map(u64::from))?;
        (mount == in_dir.mount).then(|| checked(&m, in_dir.dev, mount))
    }

    fn remembered(&self, unique: u64) -> Option<Known> {
        if !self.shareable {
            return None;
        }
        let s = shared().lock().ok()?;
        s.known.get(&unique).copied()
    }

    fn remember(&self, unique: u64, k: Known) {
        if !self.shareable {
            return;
        }
        let Ok(mut s) = shared().lock() else {
            return;
        };
        if s.known.len() >= MAX_KNOWN {
            let n = s.known.len() as u64;
            s.known.clear();
            self.metrics.dropped(Cache::Mounts, n);
        }
        s.known.insert(unique, k);
    }

    /// The mount `id` (pinned by a handle the caller holds), in the process's mountinfo,
    /// else the host's; else, by `dev`, a mount of the same file system in either.
    ///
    /// The last is for a chrooted process in a mount namespace of its own: its mountinfo
    /// leaves out the mounts above its root, the mount its files are on among them, and the
    /// host's has that mount under another id (a namespace's copy of a mount gets a new one).
    /// A device number names one live file system, and the handle keeps this one alive, so a
    /// mount with the same device in a table read after the pin is on the same file system:
    /// the same kind (a FUSE file system is refused whatever mount it is seen through).
    fn look_up(&mut self, id: u32, dev: (u32, u32)) -> Result<Known, Refusal> {
        if !self.own_tried {
            self.own_tried = true;
            self.own = View::open(&self.dir.join("mountinfo"));
        }
        if let Some(k) = self.own.as_mut().and_then(|v| v.get(id)) {
            return Ok(k);
        }
        let mut s = shared().lock().map_err(|_| Refusal::Unknown)?;
        if !s.host_tried {
            s.host_tried = true;
            s.host = View::open(Path::new("/proc/1/mountinfo"));
        }
        if let Some(k) = s.host.as_mut().and_then(|v| v.get(id)) {
            return Ok(k);
        }
        let own = self.own.as_mut().and_then(|v| v.by_dev(dev));
        own.or_else(|| s.host.as_mut().and_then(|v| v.by_dev(dev)))
            .ok_or(Refusal::Unknown)
    }
}

fn checked(m: &Meta, dev: (u32, u32), mount: u64) -> Checked {
    Checked {
        kind: m.kind,
        ino: m.ino,
        dev,
        fs_dev: m.dev,
        mount,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::openat2::open_path_in;

    /// A fake `/proc/PID` whose mountinfo is this process's, with the mount that holds
    /// `dir` given the type `fstype`.
    fn fake_proc(dir: &Path, fstype: Option<&str>) -> PathBuf {
        let proc_dir = dir.join("proc");
        std::fs::create_dir_all(&proc_dir).expect("mkdir");
        let own = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        let root = File::open(dir).expect("dir");
        let id = stat_cached(root.as_fd(), "", false)
            .expect("statx")
            .mount_id
            .expect("mount id");
        let text: String = own
            .lines()
            .map(|l| {
                let mine = l.split(' ').next() == Some(&id.to_string());
                match (mine, fstype, l.split_once(" - ")) {
                    (true, Some(t), Some((head, tail))) => {
                        let rest = tail.split_once(' ').map_or("", |(_, r)| r);
                        format!("{head} - {t} {rest}\n")
                    }
                    _ => format!("{l}\n"),
                }
            })
            .collect();
        std::fs::write(proc_dir.join("mountinfo"), text).expect("write");
        proc_dir
    }

    #[test]
    fn a_local_file_is_checked_and_a_fuse_one_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("f"), b"x").expect("write");
        let root = File::open(dir.path()).expect("dir");
        let m = Metrics::new();

        let mut local = Mounts::new(&fake_proc(dir.path(), None), &m);
        let h = open_path_in(&root, "f", 0).expect("open");
        let c = local.check(h.as_fd()).expect("local");
        assert!(c.is_file());
        let meta = std::fs::metadata(dir.path().join("f")).expect("stat");
        assert_eq!(
            c.ino,
            std::os::unix::fs::MetadataExt::ino(&meta),
            "the file's inode"
        );

        let mut fuse = Mounts::new(&fake_proc(dir.path(), Some("fuse.x")), &m);
        assert_eq!(fuse.check(h.as_fd()), Err(Refusal::Fuse));
        let mut nfs = Mounts::new(&fake_proc(dir.path(), Some("nfs4")), &m);
        assert_eq!(nfs.check(h.as_fd()), Err(Refusal::Network));
    }

    #[test]
    fn a_file_system_is_found_by_its_device_under_another_mount() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("mountinfo");
        let text = "40 1 0:4242 / /srv rw - fuse.x x rw\n41 1 8:1 / / rw - ext4 /dev/sda1 rw\n";
        std::fs::write(&path, text).expect("write");
        let mut v = View::open(&path).expect("view");
        let fuse = v.by_dev((0, 4242)).expect("the fuse mount");
        assert_eq!(fuse.kind, FsKind::Fuse);
        assert_eq!(v.by_dev((8, 1)).map(|k| k.kind), Some(FsKind::Local));
        assert_eq!(v.by_dev((8, 2)), None);
    }

    #[test]
    fn a_mount_in_no_mountinfo_is_unknown() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("f"), b"x").expect("write");
        let proc_dir = dir.path().join("proc");
        std::fs::create_dir_all(&proc_dir).expect("mkdir");
        // A mountinfo without the mount: only the host's (the real /proc/1) is left, which
        // knows it, unless the test runs where /proc/1 is another namespace.
        std::fs::write(proc_dir.join("mountinfo"), "").expect("write");
        let root = File::open(dir.path()).expect("dir");
        let h = open_path_in(&root, "f", 0).expect("open");
        let mut m = Mounts::new(&proc_dir, &Metrics::new());
        match m.check(h.as_fd()) {
            Ok(c) => assert!(c.is_file()),
            Err(e) => assert_eq!(e, Refusal::Unknown),
        }
    }
}
