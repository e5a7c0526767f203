//! Object files (executables and libraries) that sampled processes map: the one way ember
//! opens and reads a file out of a process, for symbols, build ids and unwind tables.
//!
//! A mapped file is opened only through `/proc/PID/map_files/START-END` (the mapped file
//! itself, even if deleted or in another mount namespace) or, where that is refused, by its
//! path resolved inside the process's root, one component at a time with `openat2(
//! RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` — never on the host —
//! and only if it is the inode the maps entry names. Every file is first opened `O_PATH`
//! and checked (type, mount) before any file system `open` runs: only regular files on
//! local file systems are opened for reading, never one on FUSE or a network file system,
//! whose daemon or server could leave the open (or any later read) waiting forever, and
//! never a device, whose driver's `open` could do anything ([`crate::process::fs`]).
//! Always `O_NONBLOCK`. Bytes are read with `pread` into buffers ember owns ([`FileAt`]),
//! never mmapped, so a container truncating the file makes a short read, not a `SIGBUS`.
//! Every refusal is counted in `ember_object_refusals_total{reason}`.
//!
//! Open objects are held so that they stay readable after the process (or its container)
//! is gone, shared by `(device, inode)` across processes. Each holds the root directory of
//! the process it was first seen in ([`open_root`]), so that the debug file of a stripped
//! object can be looked up inside that root ([`open_in_root`]) after the process is gone.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::metrics::{Metrics, ObjectRefusal, SymbolSource};
use crate::os::openat2::{open_path_in, reopen, stat_cached, RESOLVE_NO_XDEV};
use crate::os::procfs::MapsEntry;
pub use crate::process::elf_file::FileAt;
use crate::process::elf_file::{ElfError, ElfReader};
use crate::process::fs::{Checked, Mounts, Refusal};

// A file's identities are model types (a symbolized mapping carries them); the identity
// of an open file is read by `FileId::of_file` (`os::file_id`).
pub use crate::model::{FileId, ObjectKey};

/// An executable or library held open for symbolization.
#[derive(Debug)]
pub struct Object {
    /// Identity.
    pub key: ObjectKey,
    /// Path as the process saw it (inside its mount namespace).
    pub path: String,
    /// GNU build id, when the file has one.
    pub build_id: Option<Vec<u8>>,
    /// The open file's identity and size.
    pub id: FileId,
    /// Root directory of the process the object was first seen in, where that is not
    /// ember's own root: debug files are looked up inside it too.
    pub root: Option<Arc<File>>,
    file: File,
}

impl Object {
    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Random-access reads of the file, as big as it was when opened.
    pub fn reader(&self) -> FileAt<'_> {
        FileAt::new(&self.file, self.id.size)
    }

    /// The file name shown for unnamed frames (`libc.so.6`).
    pub fn base_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }

    /// An object for the open `file`, known to the process as `path`, in the process root
    /// `root` (see [`open_root`]); reads its build id.
    pub fn new(key: ObjectKey, path: String, file: File, root: Option<Arc<File>>) -> Self {
        let id = FileId::of_file(&file).unwrap_or(FileId {
            dev: 0,
            ino: key.inode,
            size: 0,
            mtime: Default::default(),
            ctime: Default::default(),
        });
        let mut obj = Object {
            key,
            path,
            build_id: None,
            id,
            root,
            file,
        };
        obj.build_id = read_build_id(&obj.reader());
        obj
    }

    /// Opens `path` as an object (used by tests and benchmarks on local files).
    pub fn open_local(path: &Path) -> std::io::Result<Self> {
        let file = File::open(path)?;
        let inode = file.metadata()?.ino();
        let key = ObjectKey { dev: (0, 0), inode };
        Ok(Self::new(key, path.display().to_string(), file, None))
    }
}

/// Caps of ember's build-id read: headers and small note sections only.
const BUILD_ID_LIMITS: crate::process::elf_file::Limits = crate::process::elf_file::Limits {
    max_read_bytes: 1 << 20,
    max_section_bytes: 1 << 20,
};

fn read_build_id(src: &FileAt<'_>) -> Option<Vec<u8>> {
    // A parser bug on a hostile file costs the build id, not the agent.
    std::panic::catch_unwind(|| {
        ElfReader::new(src, BUILD_ID_LIMITS)
            .and_then(|mut elf| elf.build_id())
            .ok()
            .flatten()
    })
    .ok()
    .flatten()
}

/// The metric reason of an ELF read error.
pub fn refusal(e: &ElfError) -> ObjectRefusal {
    match e {
        ElfError::Io => ObjectRefusal::Io,
        ElfError::Malformed(_) => ObjectRefusal::Malformed,
        ElfError::TooLarge => ObjectRefusal::TooLarge,
        ElfError::CompressedSize => ObjectRefusal::CompressedSize,
        ElfError::Inflate => ObjectRefusal::Inflate,
        ElfError::Unsupported => ObjectRefusal::Compression,
    }
}

/// Opens the file behind mapping `e` of the process whose mounts are `mounts` (made for its
/// `/proc` directory), counting a refusal in `metrics`: `map_files`, else the path inside
/// the process's root (not for a deleted file: its path names something else now).
/// Regular files on local file systems only, checked before any file system `open` runs
/// ([`crate::process::fs`]); non-blocking. The path fallback must lead to the very file
/// the maps entry names (its device and inode), or it is refused as a mismatch.
pub fn open_mapped(
    mounts: &mut Mounts,
    e: &MapsEntry,
    metrics: &Metrics,
) -> Result<File, ObjectRefusal> {
    let r = open_mapped_inner(mounts, e);
    if let Err(reason) = r {
        metrics.object_refused(reason);
    }
    r
}

fn open_mapped_inner(mounts: &mut Mounts, e: &MapsEntry) -> Result<File, ObjectRefusal> {
    let direct = mounts
        .dir()
        .join("map_files")
        .join(format!("{:x}-{:x}", e.start, e.end));
    let (handle, c) = match open_handle(&direct, false) {
        // The mapped file itself: a symlink to it is followed (it is the kernel's own).
        Ok(h) => {
            let c = mounts.check(h.as_fd()).map_err(fs_refusal)?;
            (h, c)
        }
        Err(_) if e.path.ends_with(" (deleted)") => return Err(ObjectRefusal::Deleted),
        Err(_) => {
            let root = open_root_for(mounts)?;
            let (h, c) = walk(mounts, &root, &e.path)?;
            if c.is_file() && (c.ino != e.inode || (c.dev != e.dev && c.fs_dev != e.dev)) {
                return Err(ObjectRefusal::Mismatch);
            }
            (h, c)
        }
    };
    if c.kind == libc::S_IFLNK {
        return Err(ObjectRefusal::Symlink);
    }
    if !c.is_file() {
        // A device is refused here, before its driver's `open` could run; a FIFO before an
        // open could wait for a writer.
        return Err(ObjectRefusal::NotRegular);
    }
    reopen(handle.as_fd()).map_err(|_| ObjectRefusal::Open)
}

/// The metric reason of a file system refusal.
fn fs_refusal(r: Refusal) -> ObjectRefusal {
    match r {
        Refusal::Fuse => ObjectRefusal::Fuse,
        Refusal::Network => ObjectRefusal::NetworkFs,
        Refusal::Unknown => ObjectRefusal::UnknownFs,
        Refusal::Stat => ObjectRefusal::Open,
    }
}

/// An `O_PATH` handle for `path` (`/proc/...`): no file system `open` runs.
fn open_handle(path: &Path, directory: bool) -> std::io::Result<OwnedFd> {
    let mut flags = libc::O_PATH | libc::O_CLOEXEC;
    if directory {
        flags |= libc::O_DIRECTORY;
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)?;
    Ok(OwnedFd::from(f))
}

/// Why [`walk`] stopped.
enum Walk {
    /// A component is not there (or not a directory where one was needed).
    Missing,
    /// Refused, for this reason.
    Refused(ObjectRefusal),
}

impl From<Walk> for ObjectRefusal {
    fn from(w: Walk) -> Self {
        match w {
            Walk::Missing => ObjectRefusal::Open,
            Walk::Refused(r) => r,
        }
    }
}

/// Opens `path` (absolute, as the process sees it) under the process's `root`, one
/// component at a time as `O_PATH` handles, each directory checked to be on a local mount
/// before a name is looked up in it (a lookup in a FUSE directory waits for its daemon),
/// no symlinks, no `..`. Returns the last handle, checked.
fn walk(mounts: &mut Mounts, root: &File, path: &str) -> Result<(OwnedFd, Checked), Walk> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    if parts.is_empty() || parts.iter().any(|p| *p == "." || *p == "..") {
        return Err(Walk::Refused(ObjectRefusal::Open));
    }
    let mut dir: Option<File> = None;
    for (i, part) in parts.iter().enumerate() {
        let base = dir.as_ref().unwrap_or(root);
        let h = open_path_in(base, part, 0).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT | libc::ENOTDIR) => Walk::Missing,
            Some(libc::ELOOP) => Walk::Refused(ObjectRefusal::Symlink),
            _ => Walk::Refused(ObjectRefusal::Open),
        })?;
        let c = mounts
            .check(h.as_fd())
            .map_err(|r| Walk::Refused(fs_refusal(r)))?;
        if i + 1 == parts.len() {
            return Ok((h, c));
        }
        if c.kind == libc::S_IFLNK {
            return Err(Walk::Refused(ObjectRefusal::Symlink));
        }
        if !c.is_dir() {
            return Err(Walk::Missing);
        }
        dir = Some(File::from(h));
    }
    Err(Walk::Missing)
}

/// Opens `rel` (such as `tmp/perf-42.map`) under the root of the process whose mounts are
/// `mounts`, as safely as a mapped object: one checked component at a time, no symlinks,
/// on local file systems only, a regular file. `Ok(None)`: not there.
pub fn open_file_in_process(mounts: &mut Mounts, rel: &str) -> Result<Option<File>, ObjectRefusal> {
    let root = open_root_for(mounts)?;
    let (h, c) = match walk(mounts, &root, rel) {
        Ok(x) => x,
        Err(Walk::Missing) => return Ok(None),
        Err(Walk::Refused(r)) => return Err(r),
    };
    match c.kind {
        libc::S_IFREG => reopen(h.as_fd()).map(Some).map_err(|_| ObjectRefusal::Open),
        libc::S_IFLNK => Err(ObjectRefusal::Symlink),
        _ => Err(ObjectRefusal::NotRegular),
    }
}

/// Opens directory `rel` (such as `tmp`) under the root of the process whose mounts are
/// `mounts` as an `O_PATH` handle, each component checked as in [`open_file_in_process`];
/// with what the check found.
pub fn open_dir_in_process(
    mounts: &mut Mounts,
    rel: &str,
) -> Result<(File, Checked), ObjectRefusal> {
    let root = open_root_for(mounts)?;
    let (h, c) = walk(mounts, &root, rel)?;
    if !c.is_dir() {
        return Err(ObjectRefusal::NotRegular);
    }
    Ok((File::from(h), c))
}

/// [`open_root`], with why it failed.
fn open_root_for(mounts: &mut Mounts) -> Result<File, ObjectRefusal> {
    let h = open_handle(&mounts.dir().join("root"), true).map_err(|_| ObjectRefusal::Open)?;
    let c = mounts.check(h.as_fd()).map_err(fs_refusal)?;
    if !c.is_dir() {
        return Err(ObjectRefusal::Open);
    }
    Ok(File::from(h))
}

/// Opens the root directory of the process whose mounts are `mounts` (what `/proc/PID/root`
/// points to) as an `O_PATH` handle, only if it is on a local file system: it stays usable
/// as the base of [`open_in_root`] after the process has exited, and never names a host path.
pub fn open_root(mounts: &mut Mounts) -> Option<File> {
    open_root_for(mounts).ok()
}

/// Opens `path` (a debug file by build id, such as `/usr/lib/debug/.build-id/ab/cd….debug`)
/// inside a process's `root` (from [`open_root`]: on a local file system), as safely as a
/// mapped object: confined to the root and to its mount (`RESOLVE_NO_XDEV`: no lookup ever
/// reaches another file system, FUSE or not, even one mounted after the root was checked),
/// no symlinks, non-blocking, regular files only (checked before the file is opened). A
/// file that is not there (or behind a mount point) is no refusal; anything else that stops
/// the open (a symlink, a FIFO) is counted.
pub fn open_in_root(root: &File, path: &Path, metrics: &Metrics) -> Option<File> {
    let path = path.to_str()?;
    let refused = match open_path_in(root, path.trim_start_matches('/'), RESOLVE_NO_XDEV) {
        Ok(h) => match stat_cached(h.as_fd(), "", false).map(|m| m.kind) {
            Ok(libc::S_IFREG) => match reopen(h.as_fd()) {
                Ok(f) => return Some(f),
                Err(_) => ObjectRefusal::Open,
            },
            Ok(libc::S_IFLNK) => ObjectRefusal::Symlink,
            Ok(_) => ObjectRefusal::NotRegular,
            Err(_) => ObjectRefusal::Io,
        },
        Err(e) => match e.raw_os_error() {
            Some(libc::ENOENT | libc::ENOTDIR | libc::EXDEV) => return None,
            Some(libc::ELOOP) => ObjectRefusal::Symlink,
            _ => ObjectRefusal::Open,
        },
    };
    metrics.object_refused(refused);
    None
}

/// Opens a file of the host (a debug file in a configured directory): non-blocking,
/// regular files only; a refusal is counted unless the file simply is not there.
pub fn open_host(path: &Path, metrics: &Metrics) -> Option<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    regular(file).map_err(|r| metrics.object_refused(r)).ok()
}

fn regular(file: File) -> Result<File, ObjectRefusal> {
    match file.metadata() {
        Ok(m) if m.is_file() => Ok(file),
        Ok(_) => Err(ObjectRefusal::NotRegular),
        Err(_) => Err(ObjectRefusal::Io),
    }
}

/// The debug file of `obj` by its build id: in `host_dirs` on the host first, else in
/// `root_dirs` inside the root of the process the object came from (a container's own
/// debug packages), else in the debuginfod cache `fetched` (a host directory); with where
/// it was found (`build_id_dir` or `debuginfod`). `None` without a build id or such a file;
/// refusals are counted.
pub fn find_debug_file(
    obj: &Object,
    host_dirs: &[PathBuf],
    root_dirs: &[PathBuf],
    fetched: Option<&Path>,
    metrics: &Metrics,
) -> Option<(File, SymbolSource)> {
    let id = obj.build_id.as_deref()?;
    let path = |dir: &PathBuf| debug_file_path(dir, id);
    host_dirs
        .iter()
        .filter_map(path)
        .find_map(|p| open_host(&p, metrics))
        .or_else(|| {
            let root = obj.root.as_deref()?;
            root_dirs
                .iter()
                .filter_map(path)
                .find_map(|p| open_in_root(root, &p, metrics))
        })
        .map(|f| (f, SymbolSource::BuildIdDir))
        .or_else(|| {
            let f = open_host(&debug_file_path(fetched?, id)?, metrics)?;
            Some((f, SymbolSource::Debuginfod))
        })
}

/// The path of the debug file for `build_id` under a `.build-id` debug directory (`dir` is
/// e.g. `/usr/lib/debug`): `dir/.build-id/ab/cdef….debug`. Hex only, so no name in the
/// object can steer it anywhere else.
pub fn debug_file_path(dir: &Path, build_id: &[u8]) -> Option<PathBuf> {
    let (first, rest) = build_id.split_first()?;
    if rest.is_empty() {
        return None;
    }
    let hex: String = rest.iter().map(|b| format!("{b:02x}")).collect();
    Some(
        dir.join(".build-id")
            .join(format!("{first:02x}"))
            .join(format!("{hex}.debug")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str) -> MapsEntry {
        MapsEntry {
            start: 1,
            end: 2,
            offset: 0,
            exec: true,
            dev: (0, 0),
            inode: 1,
            path: path.to_owned(),
            kind: crate::os::procfs::RegionKind::of(path),
        }
    }

    /// The maps entry a process mapping `file` (known to it as `path`) would have.
    fn entry_of(file: &Path, path: &str) -> MapsEntry {
        let m = std::fs::metadata(file).expect("stat");
        MapsEntry {
            dev: (libc::major(m.dev()), libc::minor(m.dev())),
            inode: m.ino(),
            ..entry(path)
        }
    }

    /// A fake `/proc/PID` with no `map_files`: its root is `root`, its mountinfo this
    /// process's (the fake root is a directory of this mount namespace).
    fn fake_proc(dir: &Path, root: &Path) -> PathBuf {
        let proc_dir = dir.join("proc/1");
        std::fs::create_dir_all(&proc_dir).expect("mkdir");
        std::os::unix::fs::symlink(root, proc_dir.join("root")).expect("symlink");
        let own = std::fs::read("/proc/self/mountinfo").expect("mountinfo");
        std::fs::write(proc_dir.join("mountinfo"), own).expect("write");
        proc_dir
    }

    #[test]
    fn refuses_fifos_symlinks_and_deleted_paths_in_the_root() {
        // A fake /proc/PID: no map_files, a root with a FIFO, a symlink out and a file.
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("lib")).expect("mkdir");
        let fifo = std::ffi::CString::new(root.join("lib/fifo.so").to_str().expect("utf-8"))
            .expect("cstring");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        std::fs::write(root.join("lib/real.so"), b"\x7fELF").expect("write");
        std::os::unix::fs::symlink("/etc/hostname", root.join("lib/link.so")).expect("symlink");
        std::os::unix::fs::symlink("/lib", root.join("linkdir")).expect("symlink");
        let proc_dir = fake_proc(dir.path(), &root);
        let m = Metrics::new();
        let reason = |e: MapsEntry| open_mapped(&mut Mounts::new(&proc_dir, &m), &e, &m).err();
        let real = |p: &str| entry_of(&root.join("lib/real.so"), p);
        assert_eq!(
            reason(entry_of(&root.join("lib/fifo.so"), "/lib/fifo.so")),
            Some(ObjectRefusal::NotRegular)
        );
        assert_eq!(reason(entry("/lib/link.so")), Some(ObjectRefusal::Symlink));
        assert_eq!(
            reason(real("/linkdir/real.so")),
            Some(ObjectRefusal::Symlink)
        );
        assert_eq!(
            reason(real("/lib/real.so (deleted)")),
            Some(ObjectRefusal::Deleted)
        );
        assert_eq!(
            reason(real("/lib/../lib/real.so")),
            Some(ObjectRefusal::Open)
        );
        assert_eq!(reason(real("/lib/real.so")), None);
        let text = m.encode();
        assert!(
            text.contains("ember_object_refusals_total{reason=\"not_regular\"} 1"),
            "{text}"
        );
    }

    /// Issue 25: the path fallback opens what the path names now, which need not be what
    /// the process mapped (replaced, or another file put there): a file whose device or
    /// inode is not the maps entry's is refused and counted (on main it was opened, and its
    /// symbols served for the mapped one).
    #[test]
    fn the_path_fallback_refuses_a_file_that_is_not_the_mapped_inode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("lib")).expect("mkdir");
        std::fs::write(root.join("lib/a.so"), b"\x7fELF a").expect("write");
        std::fs::write(root.join("lib/b.so"), b"\x7fELF b").expect("write");
        let proc_dir = fake_proc(dir.path(), &root);
        let m = Metrics::new();
        // Mapped: a.so. At the path now: b.so (a.so renamed over by it, say).
        let mapped = entry_of(&root.join("lib/a.so"), "/lib/b.so");
        assert_eq!(
            open_mapped(&mut Mounts::new(&proc_dir, &m), &mapped, &m).err(),
            Some(ObjectRefusal::Mismatch)
        );
        let other_dev = MapsEntry {
            dev: (mapped.dev.0 + 1, mapped.dev.1),
            ..entry_of(&root.join("lib/b.so"), "/lib/b.so")
        };
        assert_eq!(
            open_mapped(&mut Mounts::new(&proc_dir, &m), &other_dev, &m).err(),
            Some(ObjectRefusal::Mismatch)
        );
        let right = entry_of(&root.join("lib/b.so"), "/lib/b.so");
        assert!(open_mapped(&mut Mounts::new(&proc_dir, &m), &right, &m).is_ok());
        assert!(
            m.encode()
                .contains("ember_object_refusals_total{reason=\"mismatch\"} 2"),
            "{}",
            m.encode()
        );
    }

    /// Issue 25: a walk inside a process's root never looks a name up in a directory on a
    /// FUSE (or network) mount: a tmpfs mounted at `<root>/tmp`, which the process's
    /// mountinfo calls `fuse.stalled`, stops the walk at `tmp`, counted as `fuse`, while a
    /// file beside it in the root is opened.
    #[test]
    fn a_walk_stops_at_a_directory_on_a_fuse_mount() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("tmp")).expect("mkdir");
        std::fs::write(root.join("here.map"), b"1 2 x\n").expect("write");
        let tmp = root.join("tmp");
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "ember-test", tmp.to_str().expect("utf-8")])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            assert!(
                std::env::var("EMBER_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
                "mount needs root"
            );
            return;
        }
        struct Unmount(PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(&self.0)
                    .status();
            }
        }
        let _unmount = Unmount(tmp.clone());
        std::fs::write(tmp.join("perf-1.map"), b"1 2 x\n").expect("write");
        let proc_dir = fake_proc(dir.path(), &root);
        // The tmpfs, as the process's mountinfo would show a FUSE mount there.
        let own = std::fs::read_to_string(proc_dir.join("mountinfo")).expect("mountinfo");
        let point = format!(" {} ", tmp.display());
        let text: String = own
            .lines()
            .map(|l| match (l.contains(&point), l.split_once(" - ")) {
                (true, Some((head, tail))) => {
                    let rest = tail.split_once(' ').map_or("", |(_, r)| r);
                    format!("{head} - fuse.stalled {rest}\n")
                }
                _ => format!("{l}\n"),
            })
            .collect();
        assert!(text.contains("fuse.stalled"), "{text}");
        std::fs::write(proc_dir.join("mountinfo"), text).expect("write");
        let m = Metrics::new();
        let mut mounts = Mounts::new(&proc_dir, &m);
        assert_eq!(
            open_file_in_process(&mut mounts, "tmp/perf-1.map").err(),
            Some(ObjectRefusal::Fuse)
        );
        assert!(matches!(
            open_file_in_process(&mut mounts, "here.map"),
            Ok(Some(_))
        ));
        assert!(matches!(
            open_file_in_process(&mut mounts, "not-there.map"),
            Ok(None)
        ));
    }

    /// Issue 25: a mapping of a device (here a private copy of /dev/zero, mapped
    /// executable) is refused before the device is opened, so its driver's `open` never
    /// runs: no `IN_OPEN` reaches an inotify watch on it (on main the `map_files` open ran
    /// first and the type was checked after).
    #[test]
    fn a_device_mapping_is_refused_without_opening_the_device() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let node = dir.path().join("zero");
        let c = std::ffi::CString::new(node.as_os_str().as_bytes()).expect("cstring");
        // SAFETY: a valid path; makedev(1, 5) is /dev/zero.
        if unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 5)) } != 0 {
            assert!(
                std::env::var("EMBER_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
                "mknod needs root: {}",
                std::io::Error::last_os_error()
            );
            return;
        }
        let dev = match std::fs::File::open(&node) {
            Ok(f) => f,
            // A nodev mount: no device can be mapped from it, nothing to test.
            Err(_) => return,
        };
        // SAFETY: a private read+exec mapping of a device we opened; unmapped below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&dev),
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED, "mmap");
        drop(dev);
        // SAFETY: a fresh inotify instance, watching our own node.
        let ino = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(ino >= 0);
        // SAFETY: valid descriptor and path.
        let w = unsafe { libc::inotify_add_watch(ino, c.as_ptr(), libc::IN_OPEN) };
        assert!(w >= 0);
        let start = addr as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let (entries, _) = crate::os::procfs::parse_maps(&maps);
        let e = entries
            .into_iter()
            .find(|e| e.start == start)
            .expect("the mapping");
        let m = Metrics::new();
        let r = open_mapped(&mut Mounts::new(Path::new("/proc/self"), &m), &e, &m);
        let mut buf = [0u8; 4096];
        // SAFETY: reading into our buffer from our inotify descriptor.
        let n = unsafe { libc::read(ino, buf.as_mut_ptr().cast(), buf.len()) };
        // SAFETY: our mapping and descriptor.
        unsafe {
            libc::munmap(addr, 4096);
            libc::close(ino);
        }
        assert_eq!(r.err(), Some(ObjectRefusal::NotRegular));
        assert!(
            n <= 0,
            "the device was opened ({n} bytes of inotify events)"
        );
    }

    #[test]
    fn debug_files_in_a_root_are_opened_safely() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ids = dir.path().join("usr/lib/debug/.build-id/ab");
        std::fs::create_dir_all(&ids).expect("mkdir");
        std::fs::write(ids.join("01.debug"), b"\x7fELF").expect("write");
        std::fs::write(dir.path().join("real.debug"), b"\x7fELF").expect("write");
        // Absolute, so it would resolve inside the root were symlinks followed.
        std::os::unix::fs::symlink("/real.debug", ids.join("02.debug")).expect("symlink");
        let fifo =
            std::ffi::CString::new(ids.join("03.debug").to_str().expect("utf-8")).expect("cstring");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let proc_dir = fake_proc(dir.path(), dir.path());
        let m = Metrics::new();
        let root = open_root(&mut Mounts::new(&proc_dir, &m)).expect("open root");
        let debug = Path::new("/usr/lib/debug");
        let open = |id: &[u8]| {
            let path = debug_file_path(debug, id).expect("path");
            open_in_root(&root, &path, &m).is_some()
        };
        assert!(open(&[0xab, 0x01]));
        assert!(!open(&[0xab, 0x02]), "a symlink is not followed");
        assert!(!open(&[0xab, 0x03]), "a FIFO is refused");
        assert!(!open(&[0xab, 0x04]), "not there");
        let text = m.encode();
        for (reason, n) in [("symlink", 1), ("not_regular", 1)] {
            let line = format!("ember_object_refusals_total{{reason=\"{reason}\"}} {n}");
            assert!(text.contains(&line), "{text}");
        }
        assert!(
            !text.contains("ember_object_refusals_total{reason=\"open\"} 1"),
            "a missing file is no refusal: {text}"
        );
    }

    #[test]
    fn debug_file_paths_are_hex() {
        let p = debug_file_path(Path::new("/usr/lib/debug"), &[0xab, 0xcd, 0x01]);
        assert_eq!(
            p.as_deref(),
            Some(Path::new("/usr/lib/debug/.build-id/ab/cd01.debug"))
        );
        assert_eq!(debug_file_path(Path::new("/d"), &[1]), None);
    }

    #[test]
    fn reads_own_build_id_without_mapping() {
        let obj = Object::open_local(Path::new("/proc/self/exe")).expect("open");
        assert!(obj.build_id.as_ref().is_some_and(|b| b.len() >= 8));
        assert!(obj.id.size > 0);
    }
}
