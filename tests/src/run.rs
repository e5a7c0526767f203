//! Starting the agent under test: [`EmberRun`] builds one `ember` command line (binary from
//! `EMBER_BIN`, subcommand, config file, data directory, a free listen port), spawns it with
//! its stdout and stderr captured, and hands back an [`Ember`] that waits for `/healthz`,
//! scrapes `/metrics`, stops with SIGTERM and is killed on drop. Every suite starts its agents
//! here, so that a new flag or a changed start-up is one edit.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::{ember_bin, free_port, http_get, online_cpus, wait_timeout};

/// One `ember` invocation, built up and then [spawned](EmberRun::spawn).
///
/// ```no_run
/// # use ember_tests::EmberRun;
/// # let dir = std::path::Path::new("/tmp");
/// let ember = EmberRun::run(dir)
///     .config("kubernetes:\n  enabled: false\n")
///     .data_dir(dir.join("windows"))
///     .listen()
///     .spawn_ready();
/// let text = ember.scrape();
/// ```
#[must_use]
pub struct EmberRun {
    /// Where the config file, stdout and stderr go.
    dir: PathBuf,
    /// The subcommand and the caller's arguments, in order.
    args: Vec<OsString>,
    config: Option<String>,
    data_dir: Option<PathBuf>,
    /// `--listen ADDR` when set by [`EmberRun::listen`]/[`EmberRun::listen_on`] (or given
    /// as plain arguments: [`EmberRun::try_spawn`] reads them back).
    listen: Option<String>,
    /// Where the agent serves when its config, not a flag, says so.
    serves: Option<String>,
    env: Vec<(OsString, OsString)>,
}

impl EmberRun {
    /// `ember SUBCOMMAND`, its files in `dir`.
    pub fn new(subcommand: &str, dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            args: vec![subcommand.into()],
            config: None,
            data_dir: None,
            listen: None,
            serves: None,
            env: Vec::new(),
        }
    }

    /// `ember run`, its files in `dir`.
    pub fn run(dir: &Path) -> Self {
        Self::new("run", dir)
    }

    /// `ember record`, its files in `dir`.
    pub fn record(dir: &Path) -> Self {
        Self::new("record", dir)
    }

    /// `ember report`, its files in `dir`.
    pub fn report(dir: &Path) -> Self {
        Self::new("report", dir)
    }

    /// `ember top`, its files in `dir`.
    pub fn top(dir: &Path) -> Self {
        Self::new("top", dir)
    }

    /// The whole command line, binary first, quoted for `sh` (for a terminal multiplexer
    /// that runs it: `ember top` needs a terminal, so the test does not spawn it itself).
    /// The environment of [`EmberRun::env`] goes first, as `KEY=VALUE`.
    pub fn shell_line(&self) -> Result<String> {
        let quote =
            |a: &std::ffi::OsStr| format!("'{}'", a.to_string_lossy().replace('\'', "'\\''"));
        let mut words: Vec<String> = self
            .env
            .iter()
            .map(|(k, v)| format!("{}={}", k.to_string_lossy(), quote(v)))
            .collect();
        words.push(quote(ember_bin().as_os_str()));
        words.extend(self.argv()?.iter().map(|a| quote(a)));
        Ok(words.join(" "))
    }

    /// One more argument.
    pub fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.args.push(a.into());
        self
    }

    /// More arguments.
    pub fn args<I, A>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// `--pid PID` for each of `pids`.
    pub fn pids(mut self, pids: &[u32]) -> Self {
        for p in pids {
            self = self.arg("--pid").arg(p.to_string());
        }
        self
    }

    /// A config file with `yaml`, written to `<dir>/ember.yaml` and passed as `--config`.
    pub fn config(mut self, yaml: impl Into<String>) -> Self {
        self.config = Some(yaml.into());
        self
    }

    /// `--data-dir PATH` (`ember run`'s window files and token).
    pub fn data_dir(mut self, path: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(path.into());
        self
    }

    /// `--listen 127.0.0.1:PORT` on a port that was free a moment ago.
    pub fn listen(self) -> Self {
        let addr = format!("127.0.0.1:{}", free_port());
        self.listen_on(&addr)
    }

    /// `--listen ADDR`.
    pub fn listen_on(mut self, addr: &str) -> Self {
        self.listen = Some(addr.to_owned());
        self
    }

    /// The agent serves on `addr` because its config says so (no flag is added).
    pub fn serves_at(mut self, addr: &str) -> Self {
        self.serves = Some(addr.to_owned());
        self
    }

    /// An environment variable for the agent.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// The address `--listen` will get (or the config's, [`EmberRun::serves_at`]).
    pub fn addr(&self) -> Option<&str> {
        self.listen.as_deref().or(self.serves.as_deref())
    }

    /// The command line after the binary: the subcommand, then `--config`, `--data-dir` and
    /// `--listen` as set, then the caller's arguments (so a trailing command stays last).
    fn argv(&self) -> Result<Vec<OsString>> {
        let mut argv = vec![self.args[0].clone()];
        if let Some(yaml) = &self.config {
            let path = self.dir.join("ember.yaml");
            fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
            argv.extend(["--config".into(), path.into_os_string()]);
        }
        if let Some(data) = &self.data_dir {
            argv.extend(["--data-dir".into(), data.clone().into_os_string()]);
        }
        if let Some(listen) = &self.listen {
            argv.extend(["--listen".into(), listen.into()]);
        }
        argv.extend(self.args[1..].iter().cloned());
        Ok(argv)
    }

    /// Starts the agent (not waiting for anything); panics if it cannot start.
    pub fn spawn(self) -> Ember {
        self.try_spawn().expect("starting ember")
    }

    /// Starts the agent (not waiting for anything).
    pub fn try_spawn(self) -> Result<Ember> {
        let argv = self.argv()?;
        // The flags decide, however they were given (a builder method or plain arguments).
        let after = |flag: &str| {
            argv.iter()
                .position(|a| a == flag)
                .and_then(|i| argv.get(i + 1))
                .map(PathBuf::from)
        };
        let listen = after("--listen").map(|p| p.to_string_lossy().into_owned());
        if let (Some(listen), Some(data)) = (&listen, after("--data-dir")) {
            token_files()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(listen.clone(), data.join("ui-token"));
        }
        let stdout = self.dir.join("ember.stdout");
        let stderr = self.dir.join("ember.stderr");
        let child = Command::new(ember_bin())
            .args(&argv)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(fs::File::create(&stdout)?)
            .stderr(fs::File::create(&stderr)?)
            .spawn()
            .context("starting ember")?;
        Ok(Ember {
            child,
            stdout,
            stderr,
            addr: listen.or(self.serves),
        })
    }

    /// Starts the agent and waits until `/healthz` answers 200 (60 s at most; panics with
    /// its stderr otherwise). Needs an address ([`EmberRun::listen`]).
    pub fn spawn_ready(self) -> Ember {
        let mut ember = self.spawn();
        ember.wait_ready(Duration::from_secs(60));
        ember
    }

    /// Starts the agent and waits until its perf events are open on every CPU
    /// ([`Ember::wait_attached`], `timeout` at most); panics if it exits first.
    pub fn spawn_attached(self, timeout: Duration) -> Ember {
        let mut ember = self.spawn();
        if ember.wait_attached(timeout).is_none() && !ember.running() {
            panic!("ember exited early\n--- stderr ---\n{}", ember.stderr());
        }
        ember
    }
}

/// A running `ember`, its stdout and stderr going to files in `dir`. Killed on drop.
pub struct Ember {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
    /// Where it serves `/metrics` and `/healthz`, when the run said ([`EmberRun::listen`]).
    addr: Option<String>,
}

/// Where each `ember run` started by [`EmberRun::spawn`] keeps its profiles listener's
/// token: `--listen` address → `<--data-dir>/ui-token`. [`http_get`] presents it, as the
/// owner of the data directory may.
fn token_files() -> &'static Mutex<HashMap<String, PathBuf>> {
    static FILES: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    FILES.get_or_init(Default::default)
}

/// The token of the ember listening on `addr` (read from its data directory), if any.
pub fn token_for(addr: &str) -> Option<String> {
    let path = token_files()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(addr)
        .cloned()?;
    let t = fs::read_to_string(path).ok()?;
    Some(t.trim().to_string()).filter(|t| !t.is_empty())
}

impl Ember {
    /// Where the agent serves `/metrics` (panics when the run set no address).
    pub fn addr(&self) -> &str {
        self.addr
            .as_deref()
            .expect("this ember has no listen address (EmberRun::listen)")
    }

    /// Waits until `/healthz` answers 200; panics with the agent's stderr if it exits first
    /// or `timeout` passes.
    pub fn wait_ready(&mut self, timeout: Duration) {
        let addr = self.addr().to_owned();
        let deadline = Instant::now() + timeout;
        loop {
            assert!(
                self.running(),
                "ember exited before /healthz answered\n--- stderr ---\n{}",
                self.stderr()
            );
            if matches!(http_get(&addr, "/healthz"), Ok((200, _))) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "/healthz on {addr} did not answer 200 within {timeout:?}\n--- stderr ---\n{}",
                self.stderr()
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// `/metrics`, retried for up to 30 s until it answers 200 ([`crate::scrape`]).
    pub fn scrape(&self) -> String {
        crate::scrape(self.addr())
    }

    /// One scrape of `/metrics`, "" when it does not answer (the agent may be busy or gone).
    pub fn try_scrape(&self) -> String {
        http_get(self.addr(), "/metrics")
            .map(|r| r.1)
            .unwrap_or_default()
    }

    /// Scrapes until `done` holds on the exposition; panics after `timeout`, or if the agent
    /// exits, with the last scrape and the agent's stderr (`what` names the wait).
    pub fn scrape_until(
        &mut self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        while Instant::now() < deadline {
            assert!(self.running(), "ember exited:\n{}", self.stderr());
            if let Ok((200, body)) = http_get(self.addr(), "/metrics") {
                if done(&body) {
                    return body;
                }
                last = body;
            }
            thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "{what} never showed\n--- metrics ---\n{last}\n--- stderr ---\n{}",
            self.stderr()
        );
    }

    /// Sends SIGTERM and waits for the exit (panics with stderr after `timeout`).
    pub fn stop(&mut self, timeout: Duration) -> ExitStatus {
        self.signal(libc::SIGTERM);
        self.wait(timeout)
    }

    /// The agent's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything ember wrote to stderr so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Everything ember wrote to stdout so far.
    pub fn stdout(&self) -> String {
        fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// Waits for ember to exit; panics with its output if it takes longer than `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        match wait_timeout(&mut self.child, timeout) {
            Ok(Some(s)) => s,
            Ok(None) => panic!(
                "ember did not exit within {timeout:?}\n--- stderr ---\n{}",
                self.stderr()
            ),
            Err(e) => panic!("waiting for ember: {e}"),
        }
    }

    /// Sends a signal to ember.
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our live child.
        let r = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(r, 0, "kill({}, {sig})", self.child.id());
    }

    /// Whether ember is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits until ember has a sampling perf event open on every online CPU (its
    /// BPF program is attached right after), or `timeout` passes. Returns the
    /// time it took, or `None` on timeout (the caller decides whether that matters).
    ///
    /// This looks only at ember's open file descriptors
    /// (`anon_inode:[perf_event]`), so it needs no cooperation from the agent.
    pub fn wait_attached(&mut self, timeout: Duration) -> Option<Duration> {
        let start = Instant::now();
        let want = online_cpus();
        while start.elapsed() < timeout {
            if !self.running() {
                return None;
            }
            if count_perf_event_fds(self.pid()) >= want {
                // Attaching the program follows opening the event; give it a moment.
                thread::sleep(Duration::from_millis(200));
                return Some(start.elapsed());
            }
            thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Ember {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Number of perf event file descriptors `pid` holds.
pub fn count_perf_event_fds(pid: u32) -> usize {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| fs::read_link(e.path()).ok())
        .filter(|t| t.to_string_lossy().contains("perf_event"))
        .count()
}
