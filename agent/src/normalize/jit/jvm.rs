//! Asks a running JVM to rewrite its perf map, as `jcmd <pid> Compiler.perfmap` does, by
//! speaking HotSpot's attach protocol directly (no `jcmd` needed in the container).
//!
//! The protocol: create `.attach_pid<nspid>` in the JVM's `/tmp`, send it SIGQUIT, wait for
//! the UNIX socket `/tmp/.java_pid<nspid>`, connect, write `1\0jcmd\0Compiler.perfmap\0\0\0`
//! and read the result code. Everything is done through the JVM's own view of the
//! filesystem: its `/tmp` is opened as `/proc/<pid>/root/tmp` with `openat2(RESOLVE_IN_ROOT |
//! RESOLVE_NO_SYMLINKS)`, and the socket is reached through that directory descriptor
//! (`/proc/self/fd/N/.java_pid<nspid>`), so a container can never redirect ember to a host path.
//!
//! The JVM only talks to a peer whose effective uid and gid equal its own (or root), and its
//! socket is mode 0600. Rather than needing `CAP_DAC_OVERRIDE`, the attach runs on one
//! dedicated thread that takes the JVM's effective uid/gid for the duration with the raw
//! `setresuid`/`setresgid` system calls — which, unlike the libc wrappers, change only the
//! calling thread — and restores root afterwards (the saved uid stays 0, so it can). No other
//! thread ever runs with changed credentials, and nothing is forked.
//! It runs off the sampling path: requests go through a bounded queue (full = counted and
//! dropped), each attach is bounded by a timeout, and results come back on a queue.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::time::{Duration, Instant};

use crate::metrics::{Cache, JvmRefresh, Metrics};
use crate::os::openat2::{openat2_in_root, RESOLVE_NO_SYMLINKS};

/// One JVM to ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Host pid.
    pub pid: u32,
    /// Pid in the JVM's own pid namespace (the attach files are named with it).
    pub nspid: u32,
    /// The JVM's effective uid.
    pub uid: u32,
    /// The JVM's effective gid.
    pub gid: u32,
    /// The JVM handles SIGQUIT (else the signal would kill it: never sent then).
    pub sigquit: bool,
}

/// Why an attach failed.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The process has no SIGQUIT handler, so it cannot be signalled safely.
    #[error("no SIGQUIT handler")]
    NoHandler,
    /// The JVM's /tmp could not be opened safely.
    #[error("cannot open the JVM's /tmp: {0}")]
    Tmp(std::io::Error),
    /// Taking the JVM's uid/gid on the attach thread failed.
    #[error("cannot switch credentials: {0}")]
    Credentials(std::io::Error),
    /// The JVM did not open its attach socket in time.
    #[error("no attach socket after {0:?}")]
    NoSocket(Duration),
    /// Talking to the socket failed.
    #[error("attach socket: {0}")]
    Io(#[from] std::io::Error),
    /// The JVM answered with a non-zero result.
    #[error("the JVM answered {0:?}")]
    Refused(String),
}

impl AttachError {
    /// The metric result.
    pub fn result(&self) -> JvmRefresh {
        match self {
            AttachError::NoHandler => JvmRefresh::NoHandler,
            AttachError::Tmp(_) => JvmRefresh::Tmp,
            AttachError::Credentials(_) => JvmRefresh::Credentials,
            AttachError::NoSocket(_) => JvmRefresh::NoSocket,
            AttachError::Io(_) => JvmRefresh::Io,
            AttachError::Refused(_) => JvmRefresh::Refused,
        }
    }
}

/// Requests queued for the attach thread.
const QUEUE: usize = 16;
/// Longest one attach may take, start to answer.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The attach thread and its queues.
pub struct Worker {
    tx: SyncSender<Request>,
    done: Receiver<u32>,
    metrics: Metrics,
}

impl Worker {
    /// Starts the attach thread.
    pub fn start(metrics: Metrics) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel::<Request>(QUEUE);
        let (done_tx, done) = mpsc::sync_channel::<u32>(QUEUE);
        let m = metrics.clone();
        std::thread::Builder::new()
            .name("ember-jvm-attach".into())
            .spawn(move || {
                for req in rx {
                    let result = perfmap(&req, TIMEOUT);
                    let counted = match &result {
                        Ok(()) => JvmRefresh::Ok,
                        Err(e) => {
                            tracing::debug!("JVM {} perf map refresh: {e}", req.pid);
                            e.result()
                        }
                    };
                    m.jvm_refreshed(counted);
                    if result.is_ok() && done_tx.try_send(req.pid).is_err() {
                        m.dropped(Cache::JvmResults, 1);
                    }
                }
            })?;
        Ok(Self { tx, done, metrics })
    }

    /// Queues a request; a full queue drops it (counted).
    pub fn request(&self, req: Request) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.tx.try_send(req) {
            self.metrics.dropped(Cache::JvmRequests, 1);
        }
    }

    /// Pids whose perf map was rewritten since the last call.
    pub fn refreshed(&self) -> Vec<u32> {
        let mut out = Vec::new();
        loop {
            match self.done.try_recv() {
                Ok(pid) => out.push(pid),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return out,
            }
        }
    }
}

/// Asks the JVM `req` to write `/tmp/perf-<nspid>.map`, waiting at most `timeout`.
/// Must run on a thread of its own (it changes that thread's credentials for a while).
pub fn perfmap(req: &Request, timeout: Duration) -> Result<(), AttachError> {
    let started = Instant::now();
    let root = File::open(format!("/proc/{}/root", req.pid)).map_err(AttachError::Tmp)?;
    let tmp = openat2_in_root(
        &root,
        "tmp",
        libc::O_RDONLY | libc::O_DIRECTORY,
        RESOLVE_NO_SYMLINKS,
    )
    .map_err(AttachError::Tmp)?;
    let _creds = Credentials::switch(req.uid, req.gid).map_err(AttachError::Credentials)?;
    let socket_name = format!(".java_pid{}", req.nspid);
    if !is_socket(&tmp, &socket_name) {
        if !req.sigquit {
            return Err(AttachError::NoHandler);
        }
        let trigger = format!(".attach_pid{}", req.nspid);
        let made = create_file(&tmp, &trigger);
        // SAFETY: kill has no memory effects; the target handles SIGQUIT (checked above).
        unsafe { libc::kill(req.pid as i32, libc::SIGQUIT) };
        let found = wait_for_socket(&tmp, &socket_name, timeout);
        if made {
            unlink(&tmp, &trigger);
        }
        if !found {
            return Err(AttachError::NoSocket(timeout));
        }
    }
    let path = format!("/proc/self/fd/{}/{socket_name}", tmp.as_raw_fd());
    let mut stream = UnixStream::connect(path)?;
    let left = timeout
        .saturating_sub(started.elapsed())
        .max(Duration::from_millis(100));
    stream.set_read_timeout(Some(left))?;
    stream.set_write_timeout(Some(left))?;
    stream.write_all(b"1\0jcmd\0Compiler.perfmap\0\0\0")?;
    let mut answer = Vec::new();
    stream.take(64 << 10).read_to_end(&mut answer)?;
    let text = String::from_utf8_lossy(&answer);
    let code = text.lines().next().unwrap_or("").trim();
    // The first line is the attach result; a jcmd that failed says so in its output.
    if code == "0" && !text.contains("Exception") && !text.contains("Unknown diagnostic") {
        Ok(())
    } else {
        Err(AttachError::Refused(
            text.chars().take(200).collect::<String>(),
        ))
    }
}

fn is_socket(dir: &File, name: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(name) else {
        return false;
    };
    // SAFETY: a zeroed stat is a valid out-buffer; dirfd and name are valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    rc == 0 && st.st_mode & libc::S_IFMT == libc::S_IFSOCK
}

fn wait_for_socket(dir: &File, name: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if is_socket(dir, name) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Creates an empty `name` in `dir` (never through a symlink); whether it was created.
fn create_file(dir: &File, name: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(name) else {
        return false;
    };
    // SAFETY: valid dirfd and NUL-terminated name.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return false;
    }
    // SAFETY: fd was just opened by us.
    unsafe { libc::close(fd) };
    true
}

fn unlink(dir: &File, name: &str) {
    if let Ok(c) = std::ffi::CString::new(name) {
        // SAFETY: valid dirfd and NUL-terminated name.
        unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) };
    }
}

/// This thread's effective uid/gid switched to the target's until dropped.
struct Credentials {
    /// The ids to go back to, when switched.
    restore: Option<(u32, u32)>,
}

impl Credentials {
    fn switch(uid: u32, gid: u32) -> std::io::Result<Self> {
        // SAFETY: geteuid/getegid have no preconditions.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        if euid == uid && egid == gid {
            return Ok(Self { restore: None });
        }
        // Raw system calls: per thread. gid first, while still privileged to change it.
        set_ids(libc::SYS_setresgid, gid)?;
        if let Err(e) = set_ids(libc::SYS_setresuid, uid) {
            let _ = set_ids(libc::SYS_setresgid, egid);
            return Err(e);
        }
        Ok(Self {
            restore: Some((euid, egid)),
        })
    }
}

impl Drop for Credentials {
    fn drop(&mut self) {
        if let Some((euid, egid)) = self.restore {
            // uid first (back to root), then gid, which needs the privilege back.
            if set_ids(libc::SYS_setresuid, euid).is_err()
                || set_ids(libc::SYS_setresgid, egid).is_err()
            {
                // Cannot happen while the saved uid is 0; if it ever does, this thread must
                // not go on with someone else's identity.
                tracing::error!("could not restore the JVM attach thread's credentials");
                std::process::abort();
            }
        }
    }
}

/// Sets only the effective id of this thread (`-1` keeps real and saved).
fn set_ids(call: libc::c_long, id: u32) -> std::io::Result<()> {
    let keep = u32::MAX as libc::c_long;
    // SAFETY: setres[ug]id take three ids by value; -1 leaves one unchanged.
    let rc = unsafe { libc::syscall(call, keep, id as libc::c_long, keep) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
