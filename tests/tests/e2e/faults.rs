//! Fault tests: the real agent against hostile or broken surroundings, each with its
//! expected outcome asserted (issue 13). More fault tests live beside the code they
//! exercise, with real processes too: JVM attach against a listener that never accepts,
//! one that dribbles and a socket swapped for a symlink (normalize/jit/jvm.rs), nested
//! perf-map lines (parse/src/jit/perfmap.rs), renames and non-UTF-8 names
//! (normalize/process.rs), `Retry-After: u64::MAX` (export/delivery.rs), a full,
//! read-only or removed window directory and a clock stepped back a day
//! (export/files.rs).
//!
//! Here: JIT maps over the byte budget, a broken window directory, a pid reused by another
//! program with the same name in another container, SIGTERM while a sink is wedged, and a
//! process mapping a file from a FUSE file system whose daemon stopped answering.
//!
//! Every test here samples, so each holds [`sampling_lock`] and needs root.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ember_tests::*;

/// Path of the fixture `jit_hog` (see `tests/fixtures/jit_hog.c`).
const JIT_HOG: &str = env!("FIXTURE_JIT_HOG");

/// Path of the fixture `fuse_stall` (see `tests/fixtures/fuse_stall.c`).
const FUSE_STALL: &str = env!("FIXTURE_FUSE_STALL");

/// `ember run` with 1 s windows on `pids` (all if empty), its data dir and HTTP port.
fn run(dir: &Path, data: &Path, config: &str, pids: &[u32]) -> (Ember, String) {
    let ember = EmberRun::run(dir)
        .config(config)
        .args(["--window", "1s"])
        .data_dir(data)
        .listen()
        .pids(pids)
        .spawn_attached(Duration::from_secs(20));
    let addr = ember.addr().to_owned();
    (ember, addr)
}

/// Four processes whose perf maps hold 64 MB each of 64 KiB names: ember keeps its JIT
/// tables within the byte budget (counted refusals), still names the real JIT frames,
/// and its peak RSS stays far below what reading the maps whole would take.
#[test]
fn four_64mb_perf_maps_stay_within_the_jit_byte_budget() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let tmp = tempfile::tempdir().expect("tmp");
    let mut hogs = Vec::new();
    for _ in 0..4 {
        let mut hog = Fixture::spawn(JIT_HOG, &["--perf-map", "--seconds", "30", "--wait-start"])
            .expect("jit_hog");
        let _ = hog
            .next_line(Duration::from_secs(10))
            .expect("hostpid line");
        let map = format!("/tmp/perf-{}.map", hog.pid);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !Path::new(&map).exists() {
            assert!(Instant::now() < deadline, "{map} not written");
            thread::sleep(Duration::from_millis(20));
        }
        // Appended after the real lines: 1,000 lines of 64 KiB names (64 MB), at low
        // addresses that overlap no real code.
        let mut f = fs::OpenOptions::new().append(true).open(&map).expect("map");
        let name = "n".repeat((64 << 10) - 64);
        for i in 0..1000u64 {
            writeln!(f, "{:x} 10 {name}{i}", 0x10_0000 + i * 0x1000).expect("append");
        }
        drop(f);
        hogs.push((hog, map));
    }
    let pids: Vec<u32> = hogs.iter().map(|(h, _)| h.pid).collect();
    let config = "jit:\n  max_file_bytes: 134217728\n  max_bytes_per_process: 4194304\n  \
                  max_total_bytes: 8388608\n";
    let (mut ember, addr) = run(tmp.path(), &tmp.path().join("data"), config, &pids);
    for (hog, _) in &mut hogs {
        hog.start().expect("go");
    }
    let metrics = metrics_until(&addr, Duration::from_secs(30), |m| {
        series_value(m, "ember_jit_rejects_total{reason=\"bytes\"}") >= 4.0
            && series_value(m, "ember_frames_total{result=\"jit\"}") > 0.0
    });
    let peak = peak_rss(ember.pid());
    let held = series_value(&metrics, "ember_jit_bytes");
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(20));
    for (_, map) in &hogs {
        let _ = fs::remove_file(map);
    }
    println!("jit bytes held {held}, peak RSS {} MiB", peak >> 20);
    assert!(
        status.success(),
        "ember exited {status}\n{}",
        ember.stderr()
    );
    assert!(
        held > 0.0 && held <= 8388608.0,
        "ember_jit_bytes {held}\n{metrics}"
    );
    assert!(
        series_value(&metrics, "ember_jit_rejects_total{reason=\"bytes\"}") >= 4.0,
        "{metrics}"
    );
    assert!(
        series_value(&metrics, "ember_frames_total{result=\"jit\"}") > 0.0,
        "JIT frames still named\n{metrics}"
    );
    // Reading the four maps whole would take 256 MB at once; chunked reads and the
    // byte budget keep the agent well under that.
    assert!(peak < 160 << 20, "peak RSS {} MiB", peak >> 20);
}

fn mount(args: &[&str]) {
    let st = Command::new("mount").args(args).status().expect("mount");
    assert!(st.success(), "mount {args:?}");
}

/// Window files that exist in `dir`.
fn windows(dir: &Path) -> usize {
    fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| ember_tests::is_cpu_window(e.file_name()))
                .count()
        })
        .unwrap_or(0)
}

/// The window directory fills up, turns read-only and is removed under a running agent:
/// each fault is counted and fails `/readyz` (naming it), and windows resume once it is
/// gone. Liveness (`/healthz`) stays 200 throughout and names the fault in its body: the
/// pipeline keeps making progress, and a restart cannot empty a disk (issue 25; this test
/// asserted a 503 from `/healthz` before, the restart loop the issue describes).
#[test]
fn a_full_read_only_or_removed_data_dir_is_counted_and_survived() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let tmp = tempfile::tempdir().expect("tmp");
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).expect("mkdir");
    mount(&[
        "-t",
        "tmpfs",
        "-o",
        "size=4m",
        "tmpfs",
        mnt.to_str().expect("utf-8"),
    ]);
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mnt.clone());
    let data = mnt.join("windows");
    let (mut ember, addr) = run(tmp.path(), &data, "", &[]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while windows(&data) < 1 {
        assert!(Instant::now() < deadline, "no window\n{}", ember.stderr());
        thread::sleep(Duration::from_millis(100));
    }

    // Full: a filler takes every free byte.
    let filler = mnt.join("filler");
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=64k"])
        .arg(format!("of={}", filler.display()))
        .stderr(std::process::Stdio::null())
        .status();
    let m = metrics_until(&addr, Duration::from_secs(15), |m| {
        series_value(m, "ember_window_write_errors_total{reason=\"no_space\"}") > 0.0
    });
    assert!(
        series_value(&m, "ember_window_write_errors_total{reason=\"no_space\"}") > 0.0,
        "{m}"
    );
    let (code, body) = http_get(&addr, "/readyz").expect("readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("no space left"), "{body}");
    let (code, body) = http_get(&addr, "/healthz").expect("healthz");
    assert_eq!(code, 200, "a full disk must not fail liveness: {body}");
    assert!(
        body.contains("not ready") && body.contains("no space left"),
        "{body}"
    );
    fs::remove_file(&filler).expect("rm filler");

    // Read-only.
    mount(&["-o", "remount,ro", mnt.to_str().expect("utf-8")]);
    let m = metrics_until(&addr, Duration::from_secs(15), |m| {
        series_value(m, "ember_window_write_errors_total{reason=\"read_only\"}") > 0.0
    });
    assert!(
        series_value(&m, "ember_window_write_errors_total{reason=\"read_only\"}") > 0.0,
        "{m}"
    );
    let (code, body) = http_get(&addr, "/readyz").expect("readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("read-only"), "{body}");
    let (code, body) = http_get(&addr, "/healthz").expect("healthz");
    assert_eq!(code, 200, "a read-only disk must not fail liveness: {body}");
    assert!(body.contains("read-only"), "{body}");
    mount(&["-o", "remount,rw", mnt.to_str().expect("utf-8")]);

    // Removed.
    fs::remove_dir_all(&data).expect("rm data dir");
    let m = metrics_until(&addr, Duration::from_secs(15), |m| {
        series_value(
            m,
            "ember_window_write_errors_total{reason=\"dir_recreated\"}",
        ) > 0.0
    });
    assert!(
        series_value(
            &m,
            "ember_window_write_errors_total{reason=\"dir_recreated\"}"
        ) > 0.0,
        "{m}"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while windows(&data) < 2 {
        assert!(Instant::now() < deadline, "windows did not resume");
        thread::sleep(Duration::from_millis(100));
    }
    let (code, body) = http_get(&addr, "/readyz").expect("readyz");
    assert_eq!(code, 200, "ready again: {body}");
    let (code, body) = http_get(&addr, "/healthz").expect("healthz");
    assert_eq!(
        (code, body.as_str()),
        (200, "ok\n"),
        "healthy, no fault named"
    );
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(20));
    assert!(
        status.success(),
        "ember exited {status}\n{}",
        ember.stderr()
    );
}

/// A kubelet-shaped (systemd driver) container cgroup path.
fn kubelet_path(uid: &str, id: &str) -> String {
    format!(
        "kubepods.slice/kubepods-pod{}.slice/cri-containerd-{id}.scope",
        uid.replace('-', "_")
    )
}

/// Starts `path` so that it gets the pid `pid` (free again after its last owner was
/// reaped): `ns_last_pid` is set to the pid before it, under the lock CRIU uses, then the
/// fixture is forked. Another fork on the host may take the pid first: retried.
fn spawn_with_pid(path: &str, args: &[&str], pid: u32) -> Fixture {
    let ns_last_pid = fs::OpenOptions::new()
        .write(true)
        .open("/proc/sys/kernel/ns_last_pid")
        .expect("ns_last_pid");
    // SAFETY: flock on a file descriptor we own; released when it is closed.
    let r = unsafe { libc::flock(ns_last_pid.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(r, 0, "flock ns_last_pid");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).expect("ns_last_pid");
        let f = Fixture::spawn(path, args).expect("fixture");
        if f.pid == pid {
            return f;
        }
        assert!(Instant::now() < deadline, "pid {pid} was not free again");
        drop(f);
        thread::sleep(Duration::from_millis(50));
    }
}

/// Window files (`.pb.gz`, CPU) in `dir`, oldest first, with their profiles.
fn window_profiles(dir: &Path) -> Vec<(String, ember::proto::Profile)> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| ember_tests::is_cpu_window(n))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
        .into_iter()
        .filter_map(|n| read_profile(&dir.join(&n)).ok().map(|p| (n, p)))
        .collect()
}

/// Wall-clock nanoseconds since the epoch.
fn epoch_ns(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// A sample of `pid` in a window: its string labels and names, leaf first.
struct PidSample {
    labels: BTreeMap<String, String>,
    names: Vec<String>,
    count: i64,
}

/// The samples of `pid` in `p`.
fn samples_of(p: &ember::proto::Profile, pid: u32) -> Vec<PidSample> {
    let resolved = stacks(p);
    p.sample
        .iter()
        .zip(resolved)
        .filter(|(_, st)| st.pid == Some(i64::from(pid)))
        .map(|(s, st)| PidSample {
            labels: s
                .label
                .iter()
                .filter(|l| l.str != 0)
                .map(|l| (string(p, l.key), string(p, l.str)))
                .collect(),
            names: st.frames.iter().map(|f| f.name.clone()).collect(),
            count: st.count(),
        })
        .collect()
}

const ID_A: &str = "aaaa0000aaaa0000aaaa0000aaaa0000aaaa0000aaaa0000aaaa0000aaaa0001";
const UID_A: &str = "aaaaaaaa-1111-2222-3333-444444444444";
const ID_B: &str = "bbbb0000bbbb0000bbbb0000bbbb0000bbbb0000bbbb0000bbbb0000bbbb0002";
const UID_B: &str = "bbbbbbbb-1111-2222-3333-444444444444";

/// A pid reused by another program with the same name in another container: a process
/// named `samecomm` (cpu_hog's code: `hot_a`, `hot_b`) runs in container A and is sampled,
/// then killed; a new process gets the same pid and the same name but other code
/// (syscall_hog's `do_syscalls`) in container B. Every window after the switch attributes
/// the pid's samples to B's container and pod and names B's functions, never A's.
#[test]
fn a_reused_pid_with_the_same_comm_follows_the_new_process() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let v2 = v2_root().expect("a cgroup v2 hierarchy");
    let tmp = tempfile::tempdir().expect("tmp");
    // Same file name, so the same comm; different programs.
    let bin = |sub: &str, from: &str| {
        let d = tmp.path().join(sub);
        fs::create_dir(&d).expect("mkdir");
        let to = d.join("samecomm");
        fs::copy(from, &to).expect("copy fixture");
        to.to_str().expect("utf-8").to_owned()
    };
    let (bin_a, bin_b) = (bin("a", CPU_HOG), bin("b", SYSCALL_HOG));
    let cg_a = TestCgroup::create(&v2, &kubelet_path(UID_A, ID_A)).expect("cgroup A");
    let cg_b = TestCgroup::create(&v2, &kubelet_path(UID_B, ID_B)).expect("cgroup B");

    let mut a = Fixture::spawn(&bin_a, &["--wait-start", "--seconds", "60"]).expect("A");
    let pid = a.pid;
    cg_a.add(pid).expect("A into its cgroup");
    a.start().expect("start A");
    let data = tmp.path().join("data");
    let (mut ember, _addr) = run(tmp.path(), &data, "kubernetes:\n  enabled: false\n", &[pid]);
    thread::sleep(Duration::from_secs(3));

    // A ends; B takes its pid, its name and container B.
    let switched = SystemTime::now();
    drop(a);
    let mut b = spawn_with_pid(&bin_b, &["--wait-start", "--seconds", "60"], pid);
    cg_b.add(pid).expect("B into its cgroup");
    b.start().expect("start B");
    let b_started = SystemTime::now();
    thread::sleep(Duration::from_secs(5));
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(30));
    assert!(
        status.success(),
        "ember exited {status}\n{}",
        ember.stderr()
    );
    drop(b);

    let (mut before, mut after) = (0i64, 0i64);
    for (name, p) in window_profiles(&data) {
        let (start, end) = (p.time_nanos, p.time_nanos + p.duration_nanos);
        let mine = samples_of(&p, pid);
        if end <= epoch_ns(switched) {
            for s in &mine {
                assert_eq!(
                    s.labels.get("container_id").map(String::as_str),
                    Some(ID_A),
                    "{name}: {:?}",
                    s.labels
                );
                assert_eq!(
                    s.labels.get("comm").map(String::as_str),
                    Some("samecomm"),
                    "{name}: {:?}",
                    s.labels
                );
                before += s.count;
            }
        } else if start >= epoch_ns(b_started) {
            for s in &mine {
                assert_eq!(
                    s.labels.get("container_id").map(String::as_str),
                    Some(ID_B),
                    "{name}: {:?}",
                    s.labels
                );
                assert_eq!(
                    s.labels.get("pod_uid").map(String::as_str),
                    Some(UID_B),
                    "{name}: {:?}",
                    s.labels
                );
                assert_eq!(
                    s.labels.get("comm").map(String::as_str),
                    Some("samecomm"),
                    "{name}: {:?}",
                    s.labels
                );
                for old in ["hot_a", "hot_b", "outer"] {
                    assert!(
                        !s.names.iter().any(|n| n == old),
                        "{name}: A's {old} in B's stack {:?}",
                        s.names
                    );
                }
                if s.names.iter().any(|n| n == "do_syscalls") {
                    after += s.count;
                }
            }
        }
    }
    println!(
        "pid {pid}: {before} samples of A before the switch, {after} of B's do_syscalls after"
    );
    assert!(before > 20, "A was barely sampled: {before}");
    assert!(after > 20, "B's own functions were barely named: {after}");
}

/// A Pyroscope backend that accepts connections and never answers (nor reads): a request to
/// it hangs until the client gives up. Counts the connections it accepted.
struct SilentBackend {
    addr: String,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl SilentBackend {
    fn start() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr").to_string();
        let (accepted, stop) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (n, halt) = (accepted.clone(), stop.clone());
        let thread = thread::spawn(move || {
            let mut held = Vec::new();
            while !halt.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        held.push(stream);
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Self {
            addr,
            accepted,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for SilentBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// SIGTERM while a stage is wedged: the Pyroscope sink's backend accepts and never answers,
/// and `sinks.timeout` is an hour, so its delivery task hangs on a request. The agent's
/// shutdown deadline is window + `sinks.shutdown_grace` + 5 s (agent.rs); it must exit
/// cleanly within it, having written the window closed at SIGTERM to the data dir and
/// counted the requests the backend never answered.
#[test]
fn sigterm_with_a_wedged_sink_exits_within_the_shutdown_deadline() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let tmp = tempfile::tempdir().expect("tmp");
    let backend = SilentBackend::start();
    let hog = Fixture::spawn(CPU_HOG, &["--seconds", "60"]).expect("cpu_hog");
    let grace = Duration::from_secs(2);
    let config = format!(
        "kubernetes:\n  enabled: false\nsinks:\n  timeout: 1h\n  retry_max_elapsed: 2h\n  \
         shutdown_grace: 2s\n  pyroscope:\n    enabled: true\n    url: http://{}\n",
        backend.addr
    );
    let data = tmp.path().join("data");
    let (mut ember, _addr) = run(tmp.path(), &data, &config, &[hog.pid]);
    // Wedged: a request is hanging, and windows keep coming.
    let deadline = Instant::now() + Duration::from_secs(20);
    while backend.accepted.load(Ordering::Relaxed) == 0 || window_profiles(&data).len() < 3 {
        assert!(
            Instant::now() < deadline,
            "no push or no windows\n{}",
            ember.stderr()
        );
        thread::sleep(Duration::from_millis(100));
    }
    let signalled = SystemTime::now();
    let t0 = Instant::now();
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(60));
    let took = t0.elapsed();
    let stderr = ember.stderr();
    // window (1 s) + shutdown_grace + STOP_MARGIN (5 s).
    let limit = Duration::from_secs(1) + grace + Duration::from_secs(5);
    println!("stopped in {took:?} (deadline {limit:?})");
    assert!(status.success(), "ember exited {status}\n{stderr}");
    assert!(
        took <= limit + Duration::from_millis(500),
        "stopped in {took:?}\n{stderr}"
    );
    // It did wait for the wedged sink: the grace period, not longer.
    assert!(
        took >= grace - Duration::from_millis(100),
        "stopped in {took:?}: was the sink wedged?"
    );
    let newest = window_profiles(&data).pop().expect("windows");
    let end = newest.1.time_nanos + newest.1.duration_nanos;
    assert!(
        end + 100_000_000 >= epoch_ns(signalled),
        "the newest window {} ends before SIGTERM",
        newest.0
    );
    assert!(
        stderr.contains("requests not delivered within sinks.shutdown_grace were dropped"),
        "the undelivered requests are counted\n{stderr}"
    );
}

/// A FUSE file system mounted by `fuse_stall`, with its process (which maps `lib.so` from it).
/// However the test ends, the connection is aborted (the daemon dies with the fixture, and
/// `/sys/fs/fuse/connections/N/abort` is written too) before the mount point is lazily
/// unmounted, so every thread waiting on the daemon is let go and nothing stays mounted.
struct StalledFuse {
    fixture: Option<Fixture>,
    mnt: std::path::PathBuf,
}

impl StalledFuse {
    /// Mounts it on `mnt`, has the fixture map `lib.so` (a copy of `elf`), then stalls the
    /// daemon: from here on it reads every request and answers none.
    fn start(mnt: &Path, elf: &str) -> Self {
        fs::create_dir_all(mnt).expect("mkdir");
        let mut guard = StalledFuse {
            fixture: None,
            mnt: mnt.to_owned(),
        };
        let mut f =
            Fixture::spawn(FUSE_STALL, &[mnt.to_str().expect("utf-8"), elf]).expect("fuse_stall");
        f.wait_for("ready", Duration::from_secs(10))
            .expect("fuse_stall mapped its file");
        let pid = f.pid;
        guard.fixture = Some(f);
        let maps = fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
        assert!(
            maps.lines()
                .any(|l| l.contains(" r-xp ") && l.ends_with("/lib.so")),
            "lib.so is mapped executable\n{maps}"
        );
        let f = guard.fixture.as_mut().expect("fixture");
        f.send_line("stall").expect("stall");
        f.wait_for("stalled", Duration::from_secs(10))
            .expect("the daemon stalled");
        guard
    }

    fn pid(&self) -> u32 {
        self.fixture.as_ref().map_or(0, |f| f.pid)
    }

    /// The FUSE connection's number (`/sys/fs/fuse/connections/N`): the mount's minor.
    fn connection(&self) -> Option<String> {
        let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
        let mnt = self.mnt.to_str()?;
        info.lines().find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.get(4) == Some(&mnt) && l.contains(" - fuse"))
                .then(|| f.get(2)?.split_once(':').map(|(_, minor)| minor.to_owned()))
                .flatten()
        })
    }
}

impl Drop for StalledFuse {
    fn drop(&mut self) {
        if let Some(n) = self.connection() {
            let _ = fs::write(format!("/sys/fs/fuse/connections/{n}/abort"), "1");
        }
        drop(self.fixture.take());
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

/// Issue 25, defect 4: a process maps an executable file from a FUSE file system whose
/// daemon then answers nothing (an `open`, `stat` or `read` of the file would wait forever;
/// `O_NONBLOCK` means nothing to FUSE). The agent is started after the stall (a restart sees
/// the same) and must never send that file system a request: windows keep closing every
/// second, `/healthz` answers 200 throughout, and the file is refused, counted in
/// `ember_object_refusals_total{reason="fuse"}`. On main the aggregator and the unwind
/// loader each blocked in the file's `open` through `/proc/PID/map_files`: no window closed
/// and `/healthz` failed once 3 windows + 30 s had passed.
#[test]
fn a_stalled_fuse_mapping_costs_a_refusal_not_a_window() {
    if !require_privileged() {
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        assert!(
            std::env::var("EMBER_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
            "no /dev/fuse (modprobe fuse), and EMBER_REQUIRE_PRIVILEGED=1 forbids skipping"
        );
        println!("skipped: no /dev/fuse");
        return;
    }
    let _lock = sampling_lock();
    let tmp = tempfile::tempdir().expect("tmp");
    // Declared first, dropped last: the FUSE connection is aborted (below) before the agent
    // is killed, or a thread of it still waiting on the daemon could not end.
    let mut ember_slot: Option<Ember> = None;
    let fuse = StalledFuse::start(&tmp.path().join("mnt"), CPU_HOG);
    let victim = fuse.pid();
    let data = tmp.path().join("data");
    let (ember, addr) = run(
        tmp.path(),
        &data,
        "kubernetes:\n  enabled: false\n",
        &[victim],
    );
    let ember = ember_slot.insert(ember);

    // 40 s: past the 36 s (3 windows of 2 s + 30 s) after which /healthz fails without
    // windows.
    let watch = Duration::from_secs(40);
    let t0 = Instant::now();
    let first = windows(&data);
    let mut codes: BTreeMap<u16, usize> = BTreeMap::new();
    while t0.elapsed() < watch {
        let code = http_get(&addr, "/healthz").map_or(0, |(c, _)| c);
        *codes.entry(code).or_default() += 1;
        thread::sleep(Duration::from_secs(1));
    }
    let closed = windows(&data) - first;
    let metrics = http_get(&addr, "/metrics")
        .map(|(_, t)| t)
        .unwrap_or_default();
    let refused = series_value(&metrics, "ember_object_refusals_total{reason=\"fuse\"}");
    println!(
        "{closed} windows closed in {watch:?}, /healthz codes {codes:?}, \
         {refused} FUSE refusals"
    );
    // Windows of 2 s at least (the shortest ember takes): 20 in 40 s, 10 is the bar.
    assert!(
        closed >= 10,
        "{closed} windows in {watch:?}\n{}",
        ember.stderr()
    );
    assert_eq!(
        codes.keys().copied().collect::<Vec<_>>(),
        vec![200],
        "/healthz answered {codes:?}"
    );
    assert!(
        refused >= 1.0,
        "the FUSE file is refused, counted\n{metrics}"
    );
    // Nothing of it is stuck on the daemon: it stops as usual.
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(30));
    assert!(
        status.success(),
        "ember exited {status}\n{}",
        ember.stderr()
    );
    drop(fuse);
}

/// Compiles a program whose hot function is `name`; it prints `pid N` and calls it forever.
fn tenant_program(dir: &Path, file: &str, name: &str) -> std::path::PathBuf {
    let src = dir.join(format!("{file}.c"));
    fs::write(
        &src,
        format!(
            "#include <stdio.h>\n#include <unistd.h>\n\
             __attribute__((noinline)) unsigned long {name}(unsigned long n) {{\n\
             \x20 volatile unsigned long x = 0;\n\
             \x20 for (unsigned long i = 0; i < n; i++) x += i * 7;\n\
             \x20 return x;\n}}\n\
             int main(void) {{\n\
             \x20 printf(\"pid %d\\n\", getpid());\n\
             \x20 fflush(stdout);\n\
             \x20 for (;;) {name}(2000000);\n}}\n"
        ),
    )
    .expect("write C");
    let prog = dir.join(file);
    let out = Command::new("clang")
        .args(["-O1", "-fno-omit-frame-pointer", "-o"])
        .arg(&prog)
        .arg(&src)
        .output()
        .expect("running clang");
    assert!(
        out.status.success(),
        "clang: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    prog
}

/// Whether a process other than this one has the file `(dev, ino)` open or mapped.
fn held_elsewhere(dev: u64, ino: u64) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let me = std::process::id().to_string();
    for p in fs::read_dir("/proc").ok()?.filter_map(Result::ok) {
        let pid = p.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
            continue;
        }
        let fds = fs::read_dir(p.path().join("fd")).into_iter().flatten();
        for fd in fds.filter_map(Result::ok) {
            if fs::metadata(fd.path()).is_ok_and(|m| m.dev() == dev && m.ino() == ino) {
                return Some(format!("pid {pid} has it open"));
            }
        }
        let maps = fs::read_to_string(p.path().join("maps")).unwrap_or_default();
        let ino_s = ino.to_string();
        if maps
            .lines()
            .any(|l| l.split_whitespace().nth(4).is_some_and(|i| i == ino_s))
        {
            return Some(format!("pid {pid} maps it"));
        }
    }
    None
}

/// Frees the inode of `held` (deleted, open only here) and creates `path` on it; returns
/// the inode `path` got.
///
/// An ext4 without a journal (this VM's root) hands a freed inode out again only once it has
/// been free a minute, unless it was freed in the same second (`recently_deleted` in
/// fs/ext4/ialloc.c); with a journal, at once. So: wait until no other process holds the
/// file (ember lets go of a gone process's objects at the end of a window), point ext4's
/// `inode_goal` (a sysfs knob for testing the allocator) at the inode, and free it and
/// create the new file early in one second. The goal is set back to 0 after.
fn reuse_inode(held: fs::File, path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let m = held.metadata().expect("stat held");
    let (dev, ino) = (m.dev(), m.ino());
    // The agent holds a gone process's objects until the last window naming them is written:
    // with off-CPU on (the default) that is an off-CPU window, up to `offcpu.window` (60 s)
    // plus one CPU window after the exit. 100 s leaves that bound a margin for a slow write.
    let deadline = Instant::now() + Duration::from_secs(100);
    while let Some(who) = held_elsewhere(dev, ino) {
        assert!(
            Instant::now() < deadline,
            "inode {ino} still held after 100 s: {who}"
        );
        thread::sleep(Duration::from_millis(200));
    }
    let name = fs::read_to_string(format!(
        "/sys/dev/block/{}:{}/uevent",
        libc::major(dev),
        libc::minor(dev)
    ))
    .ok()
    .and_then(|u| {
        u.lines()
            .find_map(|l| l.strip_prefix("DEVNAME=").map(str::to_owned))
    });
    let goal = name.map(|n| Path::new("/sys/fs/ext4").join(n).join("inode_goal"));
    struct Goal(Option<std::path::PathBuf>);
    impl Drop for Goal {
        fn drop(&mut self) {
            if let Some(g) = &self.0 {
                let _ = fs::write(g, "0");
            }
        }
    }
    let goal = Goal(goal.filter(|g| fs::write(g, ino.to_string()).is_ok()));
    // Early in a second, so that the free and the create fall in the same one.
    let into = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_millis());
    thread::sleep(Duration::from_millis(u64::from(1010 - into)));
    drop(held);
    let f = fs::File::create(path).expect("create");
    let got = f.metadata().expect("stat").ino();
    let used_goal = goal.0.is_some();
    drop(goal);
    println!("inode {ino} freed and taken by {got} (ext4 inode_goal set: {used_goal})");
    got
}

/// Tenant A's binary (hot function `tenant_a_secret_fn`) runs and is named; it exits and its
/// file is deleted; once ember has let go of it, its inode is freed and a new file made on
/// it ([`reuse_inode`]), tenant B's binary (`tenant_b_public_fn`, same length, so the same
/// code at the same offsets) is written into it, and runs on A's pid.
/// The old symbolizer cached names by the mapping's device and inode: B's frames came out
/// as `tenant_a_secret_fn`. Every sample of B must carry B's names, never A's.
#[test]
fn an_inode_freed_and_reused_by_another_tenant_never_carries_the_old_names() {
    use std::os::unix::fs::MetadataExt;
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let tmp = tempfile::tempdir().expect("tmp");
    let stage = tmp.path().join("stage");
    fs::create_dir(&stage).expect("mkdir");
    let a_bin = tenant_program(&stage, "a", "tenant_a_secret_fn");
    let b_bin = tenant_program(&stage, "b", "tenant_b_public_fn");
    assert_eq!(
        fs::metadata(&a_bin).expect("a").len(),
        fs::metadata(&b_bin).expect("b").len(),
        "the two programs differ in layout"
    );
    let run_dir = tmp.path().join("run");
    fs::create_dir(&run_dir).expect("mkdir");
    let path = run_dir.join("tenant");
    let path_str = path.to_str().expect("utf-8").to_owned();
    fs::copy(&a_bin, &path).expect("install A");
    let inode = fs::metadata(&path).expect("stat A").ino();

    let a = Fixture::spawn(&path_str, &[]).expect("A");
    let pid = a.pid;
    let data = tmp.path().join("data");
    let (mut ember, _addr) = run(tmp.path(), &data, "kubernetes:\n  enabled: false\n", &[pid]);
    let named_a = |data: &Path| {
        window_profiles(data)
            .iter()
            .flat_map(|(_, p)| samples_of(p, pid))
            .filter(|s| s.names.iter().any(|n| n == "tenant_a_secret_fn"))
            .map(|s| s.count)
            .sum::<i64>()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while named_a(&data) < 20 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(500));
    }
    let before = named_a(&data);
    assert!(before >= 20, "A was not named: {before} samples");

    // A exits and its file goes. The test holds the file open until no one else does, so
    // that its close frees the inode, then B's file is created on it (see `reuse_inode`).
    let hold = fs::File::open(&path).expect("hold A");
    drop(a);
    fs::remove_file(&path).expect("remove A");
    let freed = Instant::now();
    let got = reuse_inode(hold, &path);
    assert_eq!(got, inode, "B's file did not land on A's inode");
    fs::write(&path, fs::read(&b_bin).expect("read B")).expect("write B");
    fs::set_permissions(&path, fs::metadata(&b_bin).expect("stat").permissions()).expect("chmod B");
    assert_eq!(fs::metadata(&path).expect("stat B").ino(), inode);
    println!("B got A's inode {inode} after {:.1?}", freed.elapsed());
    let b = spawn_with_pid(&path_str, &[], pid);
    let b_started = SystemTime::now();
    thread::sleep(Duration::from_secs(6));
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(30));
    assert!(
        status.success(),
        "ember exited {status}\n{}",
        ember.stderr()
    );
    drop(b);

    let (mut leaked, mut own) = (0i64, 0i64);
    for (name, p) in window_profiles(&data) {
        if p.time_nanos < epoch_ns(b_started) {
            continue;
        }
        for s in samples_of(&p, pid) {
            if s.names.iter().any(|n| n == "tenant_a_secret_fn") {
                leaked += s.count;
                println!("{name}: A's name in B's stack {:?}", s.names);
            }
            if s.names.iter().any(|n| n == "tenant_b_public_fn") {
                own += s.count;
            }
        }
    }
    println!("A named {before} times before; B: {own} samples named as B, {leaked} as A");
    assert_eq!(leaked, 0, "B's samples carried A's names");
    assert!(own > 20, "B's own function was barely named: {own}");
}
