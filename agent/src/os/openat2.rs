//! `openat2` confined to a directory: how ember opens a file that a process (often a
//! container) names, without ever resolving the name on the host.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};

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
