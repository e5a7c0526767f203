//! The processes a recording follows: a command started held until the sampler runs
//! (`ember record -- CMD`), and pids watched until they exit (`--pid`), each through a
//! pidfd, so a pid reused after the exit is never taken for the process.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use tokio::io::unix::AsyncFd;

/// A command forked and held before its `exec` until [`Held::release`]: its pid is known
/// (so the sampler can name it) before it runs an instruction of its own.
///
/// Forked by hand: `std::process::Command::spawn` waits for the child's exec, which here
/// waits for ember.
pub struct Held {
    pid: libc::pid_t,
    /// The write end of the pipe the child waits on; dropped (closed) by `release`.
    gate: Option<OwnedFd>,
    /// Reaped: its exit status was taken.
    reaped: bool,
}

impl Held {
    /// Forks `argv` (a program, found on `PATH` unless it names a path, and its
    /// arguments), held before its exec.
    pub fn spawn(argv: &[String]) -> io::Result<Self> {
        let first = argv
            .first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command"))?;
        let program = find_program(first)?;
        let nul = |e| io::Error::new(io::ErrorKind::InvalidInput, e);
        let path = CString::new(program.as_os_str().as_bytes()).map_err(nul)?;
        let args = argv
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(nul)?;
        let mut ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        let (read, write) = pipe()?;
        let (r, w) = (read.as_raw_fd(), write.as_raw_fd());
        // SAFETY: fork(2); in the child only async-signal-safe calls follow (close, read,
        // signal, execv, _exit) over memory prepared before the fork.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: as above; the child never returns from this block.
            unsafe {
                libc::close(w);
                let mut b = 0u8;
                loop {
                    match libc::read(r, (&mut b as *mut u8).cast(), 1) {
                        1 => break,
                        -1 if *libc::__errno_location() == libc::EINTR => {}
                        // EOF: ember let go of the gate without releasing it (it failed
                        // to start): the command must not run unprofiled.
                        _ => libc::_exit(127),
                    }
                }
                // Rust ignores SIGPIPE in its own processes; the command gets the default.
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                libc::execv(path.as_ptr(), ptrs.as_ptr());
                libc::_exit(127);
            }
        }
        drop(read);
        Ok(Self {
            pid,
            gate: Some(write),
            reaped: false,
        })
    }

    /// The command's pid.
    pub fn pid(&self) -> u32 {
        self.pid.unsigned_abs()
    }

    /// Lets the command exec and run.
    pub fn release(&mut self) -> io::Result<()> {
        if let Some(gate) = self.gate.take() {
            let b = 1u8;
            // SAFETY: a one-byte write from a live buffer to an fd this struct owns.
            if unsafe { libc::write(gate.as_raw_fd(), (&b as *const u8).cast(), 1) } != 1 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// The command's exit status, if it has exited (reaped then).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.reaped {
            return None;
        }
        let mut status = 0;
        // SAFETY: waitpid on our own child, with a live status word.
        if unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) } != self.pid {
            return None;
        }
        self.reaped = true;
        Some(ExitStatus::from_raw(status))
    }
}

impl Drop for Held {
    /// Never released (ember could not start): the command is killed before it runs.
    fn drop(&mut self) {
        if self.gate.take().is_some() && !self.reaped {
            let mut status = 0;
            // SAFETY: kill and reap our own child, which has not been reaped.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, &mut status, 0);
            }
        }
    }
}

/// `name` itself when it names a path (has a `/`), else the first executable regular file
/// of that name in `PATH`, as a shell finds it.
fn find_program(name: &str) -> io::Result<PathBuf> {
    if name.contains('/') {
        return Ok(PathBuf::from(name));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{name}: command not found in PATH"),
            )
        })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Pidfds of processes, readable once each exits.
pub struct Exits {
    fds: Vec<OwnedFd>,
}

impl Exits {
    /// Opens a pidfd for each pid; a pid that names no process is an error that says so.
    pub fn open(pids: &[u32]) -> io::Result<Self> {
        let mut fds = Vec::with_capacity(pids.len());
        for &pid in pids {
            let pid_t = libc::pid_t::try_from(pid)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
            // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid_t, 0) };
            if fd < 0 {
                let e = io::Error::last_os_error();
                return Err(if e.raw_os_error() == Some(libc::ESRCH) {
                    io::Error::new(io::ErrorKind::NotFound, format!("no process has pid {pid}"))
                } else {
                    io::Error::new(e.kind(), format!("pid {pid}: {e}"))
                });
            }
            // SAFETY: the kernel just returned this fd, owned by nobody else.
            fds.push(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
        Ok(Self { fds })
    }

    /// Resolves once every process has exited. Must run on a tokio runtime.
    pub async fn all(self) -> io::Result<()> {
        for fd in self.fds {
            // SAFETY: an OwnedFd is a valid open fd that stays the same until dropped.
            let fd = unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)?;
            // A pidfd polls readable when its process exits; it stays readable.
            let _ = fd.readable().await?;
        }
        Ok(())
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two fds into the two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The command runs only once released; its exit is seen through its pidfd.
    #[test]
    fn held_command_runs_after_release_and_its_exit_is_seen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mark = dir.path().join("ran");
        let argv = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            format!("touch {}", mark.display()),
        ];
        let mut held = Held::spawn(&argv).expect("spawn");
        let exits = Exits::open(&[held.pid()]).expect("pidfd");
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(!mark.exists(), "ran before release");
        held.release().expect("release");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .expect("runtime");
        rt.block_on(exits.all()).expect("exit");
        assert!(held.try_wait().expect("exited").success());
        assert!(mark.exists());
    }

    #[test]
    fn a_pid_that_names_no_process_is_an_error() {
        // Pid max on Linux is at most 2^22: this one cannot exist.
        let e = Exits::open(&[(1 << 22) + 7]).err().expect("error");
        assert!(e.to_string().contains("no process has pid"), "{e}");
    }

    /// Dropped unreleased: killed before its exec, so the command never ran.
    #[test]
    fn a_held_command_dropped_never_runs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mark = dir.path().join("ran");
        let argv = vec!["touch".to_owned(), mark.display().to_string()];
        let held = Held::spawn(&argv).expect("spawn");
        drop(held);
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!mark.exists());
    }

    #[test]
    fn no_command_is_an_error() {
        assert!(Held::spawn(&[]).is_err());
        let e = Held::spawn(&["no-such-command-ember".to_owned()])
            .err()
            .expect("error");
        assert!(e.to_string().contains("not found"), "{e}");
    }
}
