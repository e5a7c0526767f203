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
//! dropped), each attach is bounded by one total deadline (connect, write and answer: a
//! peer that never accepts or dribbles a byte a second cannot hold the thread), and results
//! come back on a queue.
//!
//! A pid may be reused between the request and the signal, so the request carries a pidfd
//! taken when it was queued and the process's start time: before `/proc/PID/root` is opened
//! and again after (so the root opened was this process's), and right before SIGQUIT, the
//! start time (and the `SigCgt` mask) are read again, and the signal goes through the pidfd,
//! which can only reach the process it was opened for. The JVM's root and `/tmp` must be on
//! local file systems (a FUSE `/tmp` whose daemon never answers would hold this thread; see
//! `process::fs`). The socket is opened `O_PATH|O_NOFOLLOW` inside the JVM's `/tmp`,
//! checked (from the kernel's cache) to be a socket on `/tmp`'s own mount, and connected to
//! through `/proc/self/fd/N`, so a socket swapped for a symlink or a mount is never followed.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::metrics::{Cache, JvmRefresh, Metrics, ObjectRefusal};
use crate::process::fs::{Checked, Mounts};
use crate::process::object::open_dir_in_process;

/// One JVM to ask.
#[derive(Debug, Clone)]
pub struct Request {
    /// A pidfd for the process, taken when the request was queued (`None` if the kernel
    /// refused one: then the attach is not attempted).
    pub pidfd: Option<Arc<OwnedFd>>,
    /// The process's start time (clock ticks since boot) when the request was queued.
    pub start_time: u64,
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
    /// The process is gone, or its pid names another process now.
    #[error("the process exited or its pid was reused")]
    Gone,
    /// The attach path is not a socket.
    #[error("the attach path is not a socket")]
    NotSocket,
    /// The deadline passed.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The JVM's root or /tmp is on a FUSE, network or unknown file system, or the socket's
    /// name leads onto another mount.
    #[error("the JVM's /tmp is not on a local file system")]
    RemoteFs,
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
            AttachError::Gone => JvmRefresh::Gone,
            AttachError::NotSocket => JvmRefresh::NotSocket,
            AttachError::Timeout(_) => JvmRefresh::Timeout,
            AttachError::RemoteFs => JvmRefresh::RemoteFs,
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
                    let result = perfmap(&req, TIMEOUT, &m);
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

/// Flags argument of the pidfd system calls: none.
const NO_FLAGS: libc::c_long = 0;

/// A pidfd for `pid` and its start time now, for a [`Request`].
pub fn pin(pid: u32) -> (Option<Arc<OwnedFd>>, u64) {
    // SAFETY: pidfd_open takes a pid and flags by value; a negative result is an error.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_long, NO_FLAGS) };
    let pidfd = (fd >= 0).then(|| {
        // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
        Arc::new(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    });
    (pidfd, start_time(pid).unwrap_or(0))
}

fn start_time(pid: u32) -> Option<u64> {
    crate::os::procfs::start_time(std::path::Path::new("/proc"), pid)
}

/// Whether `pid` catches SIGQUIT now, from `/proc/<pid>/status`.
fn catches_sigquit(pid: u32) -> Option<bool> {
    let text = crate::os::procfs::read_capped(
        std::path::Path::new(&format!("/proc/{pid}/status")),
        64 << 10,
    )
    .ok()?;
    let mask = text.lines().find_map(|l| l.strip_prefix("SigCgt:"))?.trim();
    let mask = u64::from_str_radix(mask, 16).ok()?;
    Some(mask & (1 << (libc::SIGQUIT - 1)) != 0)
}

/// Whether the process of `req` is still the one the request was made for: its pidfd still
/// reaches a live process (so its pid was not freed and reused) with the same start time.
fn still_the_same(req: &Request) -> Result<(), AttachError> {
    let pidfd = req.pidfd.as_ref().ok_or(AttachError::Gone)?;
    // SAFETY: signal 0 through a pidfd only checks that the process is there.
    let alive = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd() as libc::c_long,
            0 as libc::c_long,
            std::ptr::null::<libc::siginfo_t>(),
            NO_FLAGS,
        )
    } == 0;
    if alive && start_time(req.pid) == Some(req.start_time) {
        Ok(())
    } else {
        Err(AttachError::Gone)
    }
}

/// Sends SIGQUIT to the process of `req`, only if it is still the process the request was
/// made for (same start time, alive behind the pidfd) and it catches SIGQUIT right now.
fn signal(req: &Request) -> Result<(), AttachError> {
    let pidfd = req.pidfd.as_ref().ok_or(AttachError::Gone)?;
    // SigCgt first, then the start time: if the start time still matches (and the pidfd
    // still reaches a live process), the mask read before it was this process's.
    let catches = catches_sigquit(req.pid);
    if start_time(req.pid) != Some(req.start_time) {
        return Err(AttachError::Gone);
    }
    match catches {
        Some(true) => {}
        Some(false) => return Err(AttachError::NoHandler),
        None => return Err(AttachError::Gone),
    }
    // SAFETY: pidfd_send_signal takes a descriptor, a signal number, a null siginfo and
    // flags; the pidfd can only reach the process it was opened for.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd() as libc::c_long,
            libc::SIGQUIT as libc::c_long,
            std::ptr::null::<libc::siginfo_t>(),
            NO_FLAGS,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(AttachError::Gone)
    }
}

/// Asks the JVM `req` to write `/tmp/perf-<nspid>.map`, within one total deadline of
/// `timeout`. Must run on a thread of its own (it changes that thread's credentials for a
/// while; they are restored on every path, by the guard's drop).
pub fn perfmap(req: &Request, timeout: Duration, metrics: &Metrics) -> Result<(), AttachError> {
    let deadline = Instant::now() + timeout;
    // Still the process the request was made for? Asked before anything of /proc/PID is
    // touched: a pid reused since names another process's root and /tmp.
    still_the_same(req)?;
    let dir = std::path::PathBuf::from(format!("/proc/{}", req.pid));
    let mut mounts = Mounts::new(&dir, metrics);
    // Its /tmp, one checked component at a time from its root: both on local file systems
    // (a FUSE /tmp would hold this thread), no symlinks.
    let (tmp, tmp_at) = open_dir_in_process(&mut mounts, "tmp").map_err(|r| match r {
        ObjectRefusal::Fuse | ObjectRefusal::NetworkFs | ObjectRefusal::UnknownFs => {
            AttachError::RemoteFs
        }
        other => AttachError::Tmp(std::io::Error::other(other.as_str())),
    })?;
    // And still the same process now that its root was opened: the pid was never freed in
    // between (the pidfd still reaches a live process), so the root was this process's.
    still_the_same(req)?;
    let _creds = Credentials::switch(req.uid, req.gid).map_err(AttachError::Credentials)?;
    let socket_name = format!(".java_pid{}", req.nspid);
    if !is_socket(&mut mounts, &tmp, &tmp_at, &socket_name) {
        if !req.sigquit {
            return Err(AttachError::NoHandler);
        }
        let trigger = format!(".attach_pid{}", req.nspid);
        let made = create_file(&tmp, &trigger);
        let signalled = signal(req);
        let found = signalled.is_ok()
            && wait_for_socket(&mut mounts, &tmp, &tmp_at, &socket_name, deadline);
        if made {
            unlink(&tmp, &trigger);
        }
        signalled?;
        if !found {
            return Err(AttachError::NoSocket(timeout));
        }
    }
    let mut stream = connect_in(
        &mut mounts,
        (&tmp, &tmp_at),
        &socket_name,
        deadline,
        timeout,
    )?;
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(AttachError::Timeout(timeout));
    }
    stream.set_write_timeout(Some(left))?;
    stream
        .write_all(b"1\0jcmd\0Compiler.perfmap\0\0\0")
        .map_err(|e| timed_out(e, timeout))?;
    let answer = read_answer(&mut stream, deadline, timeout)?;
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

/// A read or write that hit its timeout is the deadline passing.
fn timed_out(e: std::io::Error, timeout: Duration) -> AttachError {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            AttachError::Timeout(timeout)
        }
        _ => AttachError::Io(e),
    }
}

/// Reads the answer (at most 64 KiB) until the JVM closes the connection or `deadline`.
fn read_answer(
    stream: &mut UnixStream,
    deadline: Instant,
    timeout: Duration,
) -> Result<Vec<u8>, AttachError> {
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(AttachError::Timeout(timeout));
        }
        // Each read waits at most what is left of the one deadline, so a peer sending a
        // byte at a time cannot stretch it.
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buf) {
            Ok(0) => return Ok(answer),
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                if answer.len() >= 64 << 10 {
                    answer.truncate(64 << 10);
                    return Ok(answer);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(timed_out(e, timeout)),
        }
    }
}

/// Connects to the socket `name` in `dir`: opened `O_PATH|O_NOFOLLOW` (a symlink is
/// opened as itself, never followed), checked to be a socket, then connected to through
/// `/proc/self/fd/N`, without blocking past `deadline` (a full backlog makes a blocking
/// connect wait).
fn connect_in(
    mounts: &mut Mounts,
    (dir, dir_at): (&File, &Checked),
    name: &str,
    deadline: Instant,
    timeout: Duration,
) -> Result<UnixStream, AttachError> {
    let c = std::ffi::CString::new(name).map_err(|_| AttachError::NotSocket)?;
    // SAFETY: valid dirfd and NUL-terminated name; the result is checked.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(AttachError::Io(std::io::Error::last_os_error()));
    }
    // SAFETY: just opened, owned here.
    let path_fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // Asked of the kernel's cache, and only on /tmp's own mount: a name that leads onto
    // another mount (a FUSE file bound over it) is never stat'ed or connected to.
    match mounts.check(path_fd.as_fd()) {
        Ok(c) if c.mount == dir_at.mount && c.kind == libc::S_IFSOCK => {}
        Ok(c) if c.mount != dir_at.mount => return Err(AttachError::RemoteFs),
        Ok(_) => return Err(AttachError::NotSocket),
        Err(_) => return Err(AttachError::RemoteFs),
    }
    let target = format!("/proc/self/fd/{}", path_fd.as_raw_fd());
    // SAFETY: a zeroed sockaddr_un is valid; the path fits (checked).
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if target.len() >= addr.sun_path.len() {
        return Err(AttachError::NotSocket);
    }
    for (d, s) in addr.sun_path.iter_mut().zip(target.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: plain socket creation; the result is checked.
    let sock = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if sock < 0 {
        return Err(AttachError::Io(std::io::Error::last_os_error()));
    }
    // SAFETY: just created, owned here.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    loop {
        // SAFETY: addr is a valid sockaddr_un of the size given.
        let rc = unsafe {
            libc::connect(
                sock.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            // A full backlog: try again until the deadline.
            Some(libc::EISCONN) => break,
            Some(libc::EAGAIN)
            | Some(libc::EINPROGRESS)
            | Some(libc::EALREADY)
            | Some(libc::EINTR) => {
                if Instant::now() >= deadline {
                    return Err(AttachError::Timeout(timeout));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => return Err(AttachError::Io(e)),
        }
    }
    let stream = UnixStream::from(sock);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// Whether `name` in `dir` is a socket on `dir`'s own mount (never a symlink followed, and
/// nothing asked of another file system).
fn is_socket(mounts: &mut Mounts, dir: &File, dir_at: &Checked, name: &str) -> bool {
    mounts
        .check_in(dir, name, dir_at)
        .is_some_and(|c| c.kind == libc::S_IFSOCK)
}

fn wait_for_socket(
    mounts: &mut Mounts,
    dir: &File,
    dir_at: &Checked,
    name: &str,
    deadline: Instant,
) -> bool {
    while Instant::now() < deadline {
        if is_socket(mounts, dir, dir_at, name) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;
    use std::path::PathBuf;
    use std::process::{Child, Command};

    /// A process that catches SIGQUIT (as a JVM does), and its attach socket path.
    struct FakeJvm {
        child: Child,
        socket: PathBuf,
    }

    impl FakeJvm {
        fn start() -> Self {
            use std::os::unix::process::CommandExt;
            let mut cmd = Command::new("sh");
            cmd.args(["-c", "trap 'echo quit' QUIT; while :; do sleep 0.1; done"])
                .stdout(std::process::Stdio::null());
            // A shell cannot trap a signal ignored when it started, and a test run started
            // in the background of a non-interactive shell has SIGQUIT ignored: restore the
            // default first. SAFETY: signal(2) is async-signal-safe, as pre_exec requires.
            unsafe {
                cmd.pre_exec(|| {
                    libc::signal(libc::SIGQUIT, libc::SIG_DFL);
                    Ok(())
                });
            }
            let child = cmd.spawn().expect("spawn sh");
            let pid = child.id();
            // Wait until the trap is installed.
            let deadline = Instant::now() + Duration::from_secs(5);
            while catches_sigquit(pid) != Some(true) {
                assert!(Instant::now() < deadline, "no QUIT handler");
                std::thread::sleep(Duration::from_millis(10));
            }
            let socket = PathBuf::from(format!("/tmp/.java_pid{pid}"));
            Self { child, socket }
        }

        fn request(&self) -> Request {
            let pid = self.child.id();
            let (pidfd, start_time) = pin(pid);
            // SAFETY: geteuid/getegid have no preconditions.
            let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
            Request {
                pidfd,
                start_time,
                pid,
                nspid: pid,
                uid,
                gid,
                sigquit: true,
            }
        }
    }

    impl Drop for FakeJvm {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.socket);
            let _ = std::fs::remove_file(format!("/tmp/.attach_pid{}", self.child.id()));
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    const DEADLINE: Duration = Duration::from_secs(1);
    /// Slack for a loaded machine: the attach must end near its deadline, never much later.
    const SLACK: Duration = Duration::from_secs(3);

    #[test]
    fn a_listener_that_never_accepts_ends_by_the_deadline() {
        let jvm = FakeJvm::start();
        let _listener = UnixListener::bind(&jvm.socket).expect("bind");
        let started = Instant::now();
        let r = perfmap(&jvm.request(), DEADLINE, &Metrics::new());
        assert!(matches!(r, Err(AttachError::Timeout(_))), "{r:?}");
        assert!(
            started.elapsed() < DEADLINE + SLACK,
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_listener_that_dribbles_ends_by_the_deadline() {
        let jvm = FakeJvm::start();
        let listener = UnixListener::bind(&jvm.socket).expect("bind");
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let server = std::thread::spawn(move || {
            if let Ok((mut c, _)) = listener.accept() {
                // One byte every 100 ms, never closing: each read succeeds in time.
                while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                    if c.write_all(b"0").is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        });
        let started = Instant::now();
        let r = perfmap(&jvm.request(), DEADLINE, &Metrics::new());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(matches!(r, Err(AttachError::Timeout(_))), "{r:?}");
        assert!(
            started.elapsed() < DEADLINE + SLACK,
            "{:?}",
            started.elapsed()
        );
        let _ = server.join();
    }

    #[test]
    fn a_socket_swapped_for_a_symlink_is_never_connected() {
        let jvm = FakeJvm::start();
        let outside = tempfile::tempdir().expect("tmp");
        let target = outside.path().join("host.sock");
        let host = UnixListener::bind(&target).expect("bind");
        host.set_nonblocking(true).expect("nonblocking");
        std::os::unix::fs::symlink(&target, &jvm.socket).expect("symlink");
        // Straight at the connect step (as if swapped after the socket check) ...
        let mut mounts = Mounts::new(std::path::Path::new("/proc/self"), &Metrics::new());
        let (tmp, at) = open_dir_in_process(&mut mounts, "tmp").expect("tmp");
        let name = jvm
            .socket
            .file_name()
            .and_then(|n| n.to_str())
            .expect("name");
        let r = connect_in(
            &mut mounts,
            (&tmp, &at),
            name,
            Instant::now() + DEADLINE,
            DEADLINE,
        );
        assert!(matches!(r, Err(AttachError::NotSocket)), "{r:?}");
        // ... and through a whole attach.
        let r = perfmap(&jvm.request(), DEADLINE, &Metrics::new());
        assert!(r.is_err(), "{r:?}");
        assert!(
            matches!(host.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "the host socket behind the symlink was connected to"
        );
    }

    #[test]
    fn a_reused_pid_is_not_signalled() {
        // `sleep` dies of SIGQUIT: if it were signalled, it would be gone.
        let mut sleeper = Command::new("sleep").arg("30").spawn().expect("spawn");
        let pid = sleeper.id();
        let (pidfd, start_time) = pin(pid);
        let req = Request {
            pidfd,
            start_time: start_time + 1, // as if the pid named another process now
            pid,
            nspid: pid,
            uid: 0,
            gid: 0,
            sigquit: true,
        };
        assert!(matches!(signal(&req), Err(AttachError::Gone)));
        let req = Request { start_time, ..req };
        // The right process, but it does not catch SIGQUIT now.
        assert!(matches!(signal(&req), Err(AttachError::NoHandler)));
        assert!(sleeper.try_wait().expect("wait").is_none(), "still alive");
        let _ = sleeper.kill();
        let _ = sleeper.wait();
    }

    /// Issue 25: a request whose pid names another process by now (another start time) is
    /// dropped before anything of that process is opened: not its root, not its /tmp, and
    /// never a socket there, even one that is already listening (on main the attach opened
    /// the new process's /tmp and, finding a socket, connected without any check).
    #[test]
    fn a_reused_pid_is_not_attached_to() {
        let mut sleeper = Command::new("sleep").arg("30").spawn().expect("spawn");
        let pid = sleeper.id();
        // A listener where the pid's /tmp has its attach socket (the host's /tmp here).
        let nspid = 4_000_000_000u32 - pid;
        let path = PathBuf::from(format!("/tmp/.java_pid{nspid}"));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let (pidfd, start_time) = pin(pid);
        // SAFETY: geteuid/getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let req = Request {
            pidfd,
            start_time: start_time + 1, // the request was for an earlier process
            pid,
            nspid,
            uid,
            gid,
            sigquit: false,
        };
        let r = perfmap(&req, DEADLINE, &Metrics::new());
        let accepted = listener.accept().is_ok();
        let _ = std::fs::remove_file(&path);
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        assert!(matches!(r, Err(AttachError::Gone)), "{r:?}");
        assert!(!accepted, "connected to another process's socket");
    }

    #[test]
    fn credentials_are_restored_on_every_path() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var("EMBER_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
                "needs root (setresuid) and EMBER_REQUIRE_PRIVILEGED=1 forbids skipping"
            );
            return;
        }
        let jvm = FakeJvm::start();
        let _listener = UnixListener::bind(&jvm.socket).expect("bind");
        let mut req = jvm.request();
        // Another user: the root-owned 0600 socket refuses it (an error path).
        req.uid = 4242;
        req.gid = 4242;
        let ids = std::thread::spawn(move || {
            let r = perfmap(&req, DEADLINE, &Metrics::new());
            // SAFETY: no preconditions; per-thread ids.
            let ids = unsafe { (libc::geteuid(), libc::getegid()) };
            (r.is_err(), ids)
        })
        .join()
        .expect("thread");
        assert_eq!(ids, (true, (0, 0)));
    }
}
