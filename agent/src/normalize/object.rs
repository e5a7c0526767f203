//! Object files (executables and libraries) that sampled processes map: the one way ember
//! opens and reads a file out of a process, for symbols, build ids and unwind tables.
//!
//! A mapped file is opened only through `/proc/PID/map_files/START-END` (the mapped file
//! itself, even if deleted or in another mount namespace) or, where that is refused, by its
//! path resolved inside the process's root with `openat2(RESOLVE_IN_ROOT |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` — never on the host. Always `O_NONBLOCK`
//! (a FIFO swapped in cannot block the open), and only regular files are kept (`fstat`).
//! Bytes are read with `pread` into buffers ember owns ([`FileAt`], [`read_all`]), never
//! mmapped, so a container truncating the file makes a short read, not a `SIGBUS`. Every
//! refusal is counted in `ember_object_refusals_total{reason}`.
//!
//! Open objects are held so that they stay readable after the process (or its container)
//! is gone, shared by `(device, inode)` across processes. Each holds the root directory of
//! the process it was first seen in ([`open_root`]), so that the debug file of a stripped
//! object can be looked up inside that root ([`open_in_root`]) after the process is gone.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::metrics::{Metrics, ObjectRefusal};
use crate::normalize::elf_file::{ElfError, ElfReader, ReadAt};
use crate::os::openat2::{openat2_in_root, RESOLVE_NO_SYMLINKS};
use crate::os::procfs::MapsEntry;

/// Identity of a mapped file: device and inode, as `/proc/PID/maps` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Device (major, minor).
    pub dev: (u32, u32),
    /// Inode number.
    pub inode: u64,
}

/// The file as `fstat` saw it when opened: what parsed data is cached by. A container can
/// write any build id into its files, but cannot make its file the host's inode; nor can it
/// make a new file on a freed and reused inode look like the old one: the change time is
/// set by the kernel (no `utimensat` sets it), so it tells the two apart where size and
/// mtime (settable) could not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
    /// Size.
    pub size: u64,
    /// Modification time, nanoseconds.
    pub mtime_ns: i64,
    /// Status change time, nanoseconds.
    pub ctime_ns: i64,
}

impl FileId {
    /// The identity of an open file.
    pub fn of(file: &File) -> std::io::Result<Self> {
        let m = file.metadata()?;
        Ok(FileId {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime_ns: m.mtime().saturating_mul(1_000_000_000) + m.mtime_nsec(),
            ctime_ns: m.ctime().saturating_mul(1_000_000_000) + m.ctime_nsec(),
        })
    }
}

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
        FileAt {
            file: &self.file,
            size: self.id.size,
        }
    }

    /// The file name shown for unnamed frames (`libc.so.6`).
    pub fn base_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }

    /// An object for the open `file`, known to the process as `path`, in the process root
    /// `root` (see [`open_root`]); reads its build id.
    pub fn new(key: ObjectKey, path: String, file: File, root: Option<Arc<File>>) -> Self {
        let id = FileId::of(&file).unwrap_or(FileId {
            dev: 0,
            ino: key.inode,
            size: 0,
            mtime_ns: 0,
            ctime_ns: 0,
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

/// A file read with `pread`, no bigger than `size` (its size when opened).
#[derive(Debug, Clone, Copy)]
pub struct FileAt<'a> {
    file: &'a File,
    size: u64,
}

impl<'a> FileAt<'a> {
    /// Reads `file`, no further than `size`.
    pub fn new(file: &'a File, size: u64) -> Self {
        Self { file, size }
    }
}

impl ReadAt for FileAt<'_> {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        FileExt::read_exact_at(self.file, buf, offset)
    }
}

/// Caps of ember's build-id read: headers and small note sections only.
const BUILD_ID_LIMITS: crate::normalize::elf_file::Limits = crate::normalize::elf_file::Limits {
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

/// Opens the file behind mapping `e` of the process whose `/proc` directory is `dir`,
/// counting a refusal in `metrics`: `map_files`, else the path inside the process's root
/// (not for a deleted file: its path names something else now). Non-blocking, regular files
/// only.
pub fn open_mapped(dir: &Path, e: &MapsEntry, metrics: &Metrics) -> Result<File, ObjectRefusal> {
    let r = open_mapped_inner(dir, e);
    if let Err(reason) = r {
        metrics.object_refused(reason);
    }
    r
}

fn open_mapped_inner(dir: &Path, e: &MapsEntry) -> Result<File, ObjectRefusal> {
    let direct = dir
        .join("map_files")
        .join(format!("{:x}-{:x}", e.start, e.end));
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&direct)
    {
        Ok(f) => f,
        Err(_) if e.path.ends_with(" (deleted)") => return Err(ObjectRefusal::Deleted),
        Err(_) => {
            let root = File::open(dir.join("root")).map_err(|_| ObjectRefusal::Open)?;
            open_confined(&root, &e.path).map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => ObjectRefusal::Symlink,
                _ => ObjectRefusal::Open,
            })?
        }
    };
    regular(file)
}

/// Opens `path` inside `root`: resolved as if `root` were `/` (`..` and absolute symlinks
/// cannot leave it), failing on any symlink or magic link, non-blocking.
fn open_confined(root: &File, path: &str) -> std::io::Result<File> {
    openat2_in_root(
        root,
        path.trim_start_matches('/'),
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW,
        RESOLVE_NO_SYMLINKS,
    )
}

/// Opens the root directory of the process whose `/proc` directory is `dir` (what
/// `/proc/PID/root` points to) as an `O_PATH` handle: it stays usable as the base of
/// [`open_in_root`] after the process has exited, and never names a host path.
pub fn open_root(dir: &Path) -> Option<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir.join("root"))
        .ok()
}

/// Opens `path` (a debug file by build id, such as `/usr/lib/debug/.build-id/ab/cd….debug`)
/// inside a process's `root`, as safely as a mapped object: confined to the root, no
/// symlinks, non-blocking, regular files only. A file that is not there is no refusal;
/// anything else that stops the open (a symlink, a FIFO) is counted.
pub fn open_in_root(root: &File, path: &Path, metrics: &Metrics) -> Option<File> {
    let path = path.to_str()?;
    let refused = match open_confined(root, path) {
        Ok(file) => return regular(file).map_err(|r| metrics.object_refused(r)).ok(),
        Err(e) => match e.raw_os_error() {
            Some(libc::ENOENT | libc::ENOTDIR) => return None,
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
        }
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
        let m = Metrics::new();
        let reason = |p: &str| open_mapped(dir.path(), &entry(p), &m).err();
        assert_eq!(reason("/lib/fifo.so"), Some(ObjectRefusal::NotRegular));
        assert_eq!(reason("/lib/link.so"), Some(ObjectRefusal::Symlink));
        assert_eq!(
            reason("/lib/real.so (deleted)"),
            Some(ObjectRefusal::Deleted)
        );
        assert_eq!(reason("/lib/real.so"), None);
        let text = m.encode();
        assert!(
            text.contains("ember_object_refusals_total{reason=\"not_regular\"} 1"),
            "{text}"
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
        std::fs::create_dir_all(dir.path().join("proc/1")).expect("mkdir");
        std::os::unix::fs::symlink(dir.path(), dir.path().join("proc/1/root")).expect("symlink");
        let root = open_root(&dir.path().join("proc/1")).expect("open root");
        let m = Metrics::new();
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
