//! `openat2` confined to a directory: how ember opens a file that a process (often a
//! container) names, without ever resolving the name on the host.

use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_IN_ROOT: u64 = 0x10;

/// Opens `rel` under `root` with `openat2`: `flags` as for `open`, `resolve` the
/// `RESOLVE_*` bits, always confined to `root` (`RESOLVE_IN_ROOT`) and never through magic
/// links. Used by the JIT stage, which also refuses every symlink.
pub fn openat2_in_root(root: &File, rel: &str, flags: i32, resolve: u64) -> std::io::Result<File> {
    let path = std::ffi::CString::new(rel)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: resolve | RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: valid dirfd, NUL-terminated path and a correctly sized open_how.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: openat2 returned a new descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

/// `RESOLVE_NO_SYMLINKS`: fail with `ELOOP` on any symlink in the path.
pub const RESOLVE_NO_SYMLINKS: u64 = 0x04;

/// `RESOLVE_NO_XDEV`: fail with `EXDEV` rather than cross a mount point.
pub const RESOLVE_NO_XDEV: u64 = 0x01;

/// What [`stat_cached`] tells of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// File type bits (`S_IFMT` of `st_mode`).
    pub kind: u32,
    /// Inode number.
    pub ino: u64,
    /// Device as the file system reports it (major, minor). An overlay may report a layer's
    /// device here; its mount's device is the one `/proc/PID/maps` shows.
    pub dev: (u32, u32),
    /// The 64-bit mount id that is never reused (kernel >= 6.8), else `None`.
    pub mount_unique: Option<u64>,
    /// The mount id `/proc/PID/mountinfo` shows (reused once the mount is gone), when asked.
    pub mount_id: Option<u32>,
}

/// `STATX_MNT_ID_UNIQUE` (Linux 6.8).
const STATX_MNT_ID_UNIQUE: u32 = 0x4000;
/// `STATX_MNT_ID` (Linux 5.8).
const STATX_MNT_ID: u32 = 0x1000;

/// `statx` of `name` in `dir` (or of `dir` itself when `name` is empty) that sends no
/// request to the file system: `AT_STATX_DONT_SYNC` makes FUSE, NFS, CIFS and Ceph answer
/// from what the kernel has cached (even an attribute cache that has expired), and only the
/// type, inode and mount id are asked for, so NFS does not flush dirty pages first. Never
/// follows a symlink or triggers an automount. `unique`: ask for the never-reused mount id
/// (the mountinfo id otherwise).
pub fn stat_cached(dir: BorrowedFd<'_>, name: &str, unique: bool) -> std::io::Result<Meta> {
    let path = std::ffi::CString::new(name)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut flags = libc::AT_STATX_DONT_SYNC | libc::AT_NO_AUTOMOUNT | libc::AT_SYMLINK_NOFOLLOW;
    if name.is_empty() {
        flags |= libc::AT_EMPTY_PATH;
    }
    let mount = if unique {
        STATX_MNT_ID_UNIQUE
    } else {
        STATX_MNT_ID
    };
    let mask = libc::STATX_TYPE | libc::STATX_INO | mount;
    // SAFETY: an all-zero statx is a valid out-buffer.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: valid dirfd, NUL-terminated path, flags and mask by value, and a buffer of
    // the size the kernel writes.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_statx,
            dir.as_raw_fd(),
            path.as_ptr(),
            flags,
            mask,
            &mut sx as *mut libc::statx,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let got = sx.stx_mask;
    Ok(Meta {
        kind: u32::from(sx.stx_mode) & libc::S_IFMT,
        ino: sx.stx_ino,
        dev: (sx.stx_dev_major, sx.stx_dev_minor),
        mount_unique: (got & STATX_MNT_ID_UNIQUE != 0).then_some(sx.stx_mnt_id),
        mount_id: (got & STATX_MNT_ID != 0)
            .then(|| u32::try_from(sx.stx_mnt_id).ok())
            .flatten(),
    })
}

/// Opens `rel` under `dir` as an `O_PATH` handle (no file system `open` runs, so neither a
/// device driver's nor a FUSE daemon's), confined like [`openat2_in_root`]; a trailing
/// symlink is opened as itself, not followed. `resolve` adds `RESOLVE_*` bits.
pub fn open_path_in(dir: &File, rel: &str, resolve: u64) -> std::io::Result<OwnedFd> {
    let f = openat2_in_root(
        dir,
        rel,
        libc::O_PATH | libc::O_NOFOLLOW,
        resolve | RESOLVE_NO_SYMLINKS,
    )?;
    Ok(OwnedFd::from(f))
}

/// Opens the file an `O_PATH` handle names, for reading, non-blocking: the very inode the
/// handle holds (through `/proc/self/fd/N`), whatever its path names by now. Call only
/// after checking what the handle is: this runs the file system's `open`.
pub fn reopen(handle: BorrowedFd<'_>) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_in_root_test(root: &File, rel: &str) -> Option<File> {
        openat2_in_root(root, rel, libc::O_RDONLY, 0).ok()
    }

    #[test]
    fn open_in_root_stays_inside() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("inside"), b"x").expect("write");
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("escape")).expect("symlink");
        std::os::unix::fs::symlink("../../../../etc/hostname", dir.path().join("dotdot"))
            .expect("symlink");
        let root = File::open(dir.path()).expect("open root");
        assert!(open_in_root_test(&root, "inside").is_some());
        // Both symlinks resolve inside the root, where no etc/hostname exists.
        assert!(open_in_root_test(&root, "escape").is_none());
        assert!(open_in_root_test(&root, "dotdot").is_none());
    }
}
