//! The one `perf_event_open` of the agent: the sampler's clock or cycle events, the task
//! record reader's dummy events and the readings' counters all open their events here, so
//! the attribute size, the close-on-exec flag and the ownership of the new descriptor are
//! right once.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use libbpf_rs::libbpf_sys;

pub use libbpf_sys::perf_event_attr as Attr;

/// A zeroed attribute with its `size` set: all-zero is a valid value of every field, and
/// the kernel reads `size` to know which version of the struct it was given.
pub fn attr() -> Attr {
    // SAFETY: perf_event_attr is a plain C struct for which all-zero is a valid value.
    let mut attr: Attr = unsafe { std::mem::zeroed() };
    attr.size = std::mem::size_of::<Attr>() as u32;
    attr
}

/// Opens `attr` on `cpu`, close-on-exec, for every task on that CPU (`cgroup = None`) or
/// for the tasks of one cgroup (an fd of its directory, `PERF_FLAG_PID_CGROUP`).
pub fn open(attr: &Attr, cpu: u32, cgroup: Option<BorrowedFd<'_>>) -> std::io::Result<OwnedFd> {
    let (pid, flags) = match cgroup {
        Some(fd) => (
            fd.as_raw_fd(),
            libbpf_sys::PERF_FLAG_FD_CLOEXEC | libbpf_sys::PERF_FLAG_PID_CGROUP,
        ),
        // pid -1 + a CPU: every task on that CPU.
        None => (-1, libbpf_sys::PERF_FLAG_FD_CLOEXEC),
    };
    let cpu =
        libc::c_int::try_from(cpu).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: attr is initialised and outlives the call; the kernel returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr as *const Attr,
            pid,
            cpu,
            -1,
            libc::c_ulong::from(flags),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: perf_event_open returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_a_software_counter_or_says_why_not() {
        let mut a = attr();
        a.type_ = libbpf_sys::PERF_TYPE_SOFTWARE;
        a.config = u64::from(libbpf_sys::PERF_COUNT_SW_DUMMY);
        match open(&a, 0, None) {
            Ok(fd) => {
                // SAFETY: F_GETFD only reads the descriptor's flags.
                let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
                assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
            }
            // Unprivileged or perf_event_paranoid: refused, never a panic.
            Err(e) => assert!(
                matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)),
                "{e}"
            ),
        }
    }
}
