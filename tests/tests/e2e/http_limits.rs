//! The HTTP server against hostile clients (issue 25), on the real agent:
//!
//! - a connection flood (hundreds of idle sockets on the profiles and metrics listeners,
//!   kept topped up): the probes on their own listener (`server.health_listen`) answer
//!   N of N, and the profiles listener still admits every new request by evicting the
//!   oldest connection that never sent a complete request; every eviction is counted;
//! - abandoned heavy requests (clients that hang up after a second, round after round):
//!   the blocking work stops (`ember_http_heavy_running` back to 0, each counted as
//!   `cancelled`) and concurrent heavy work never exceeds `server.max_concurrent_requests`;
//! - SIGTERM while heavy requests are in flight: the agent exits within a few seconds
//!   instead of waiting for the work to end.
//!
//! The heavy data is built here: synthetic windows of a busy node (200,000 samples, one
//! thread id each, over 2,000 distinct 20-frame stacks of 20,000 functions) written to
//! the agent's data directory before it starts.
//!
//! Every test here starts `ember run` (BPF), so each holds [`sampling_lock`] and needs root.

use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ember::proto::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};
use ember_tests::*;

/// Shape of the synthetic busy-node windows.
struct Busy {
    windows: usize,
    samples: usize,
    stacks: usize,
    functions: usize,
    depth: usize,
}

/// CPU seconds the agent may use in the 5 s after abandoned heavy requests stopped: 0.68 s
/// measured (sampling the host and the readings, on 2 CPUs); a flame graph still being built
/// takes a whole CPU, 5 s.
const IDLE_CPU_SECONDS: f64 = 2.5;
/// How much the agent's peak RSS may grow over the abandoned requests (MiB): 187
/// and 216 measured with the cap of 4 running at once; the 12 of a round at once would take three times that.
const RSS_GROWTH_MIB: u64 = 384;
/// SIGTERM to exit with heavy requests in flight: the 5 s drain the README states, plus the
/// last window's write and slack for a loaded 2-CPU machine.
const SIGTERM_BOUND: Duration = Duration::from_secs(10);

/// What issue 25 measured against: a busy node's windows.
const BUSY: Busy = Busy {
    windows: 10,
    samples: 200_000,
    stacks: 2_000,
    functions: 20_000,
    depth: 20,
};

/// One gzip'ed window of `b`'s shape.
fn busy_window(b: &Busy, time_nanos: i64) -> Vec<u8> {
    let mut strings: Vec<String> = [
        "",
        "samples",
        "count",
        "cpu",
        "nanoseconds",
        "/usr/bin/busy",
        "tid",
    ]
    .map(String::from)
    .to_vec();
    let first_name = strings.len() as i64;
    for i in 0..b.functions {
        strings.push(format!("busy::module_{}::function_{i}", i % 97));
    }
    let function = (0..b.functions)
        .map(|i| Function {
            id: i as u64 + 1,
            name: first_name + i as i64,
            ..Default::default()
        })
        .collect();
    let location = (0..b.functions)
        .map(|i| Location {
            id: i as u64 + 1,
            mapping_id: 1,
            address: 0x1000 + 16 * i as u64,
            line: vec![Line {
                function_id: i as u64 + 1,
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect();
    // Distinct stacks from a fixed xorshift sequence: every window the same.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let stacks: Vec<Vec<u64>> = (0..b.stacks)
        .map(|_| {
            (0..b.depth)
                .map(|_| next() % b.functions as u64 + 1)
                .collect()
        })
        .collect();
    let sample = (0..b.samples)
        .map(|i| Sample {
            location_id: stacks[i % b.stacks].clone(),
            value: vec![1, 10_101_010],
            label: vec![Label {
                key: 6,
                num: i as i64 + 1,
                ..Default::default()
            }],
        })
        .collect();
    let profile = Profile {
        sample_type: vec![
            ValueType { r#type: 1, unit: 2 },
            ValueType { r#type: 3, unit: 4 },
        ],
        period_type: Some(ValueType { r#type: 3, unit: 4 }),
        period: 10_101_010,
        string_table: strings,
        function,
        location,
        mapping: vec![Mapping {
            id: 1,
            filename: 5,
            memory_start: 0x1000,
            memory_limit: 0x1000_0000,
            has_functions: true,
            ..Default::default()
        }],
        sample,
        time_nanos,
        duration_nanos: 10_000_000_000,
        ..Default::default()
    };
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&prost::Message::encode_to_vec(&profile))
        .expect("gzip");
    gz.finish().expect("gzip")
}

/// The window file name of a window starting at `unix` seconds: `20261122T031500.000Z.pb.gz`.
fn window_name(unix: u64) -> String {
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let (days, secs) = ((unix / 86_400) as i64, unix % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}.000Z.pb.gz",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Writes `b.windows` windows, 10 s apart, starting an hour ago; returns the query range
/// (`from=…&to=…`, Unix seconds) that selects exactly them.
fn write_busy_windows(data: &Path, b: &Busy) -> String {
    fs::create_dir_all(data).expect("data dir");
    let start = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
        - 3600;
    let gz = busy_window(b, i64::try_from(start).expect("secs") * 1_000_000_000);
    for i in 0..b.windows as u64 {
        fs::write(data.join(window_name(start + 10 * i)), &gz).expect("writing a window");
    }
    format!("from={start}&to={}", start + 10 * b.windows as u64)
}

/// A running agent and its three listeners.
struct Agent {
    ember: Ember,
    profiles: String,
    metrics: String,
    health: String,
    _dir: tempfile::TempDir,
}

/// `ember run` with 1 s windows, `server_yaml` (indented under `server:`) and, if
/// `busy` is set, the busy windows in its data directory; returns when /readyz is 200.
fn start(server_yaml: &str, busy: Option<&Busy>) -> (Agent, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("ember.yaml");
    fs::write(
        &cfg,
        format!("kubernetes:\n  enabled: false\nwindow:\n  duration: 1s\nserver:\n{server_yaml}"),
    )
    .expect("config");
    let data = dir.path().join("windows");
    let range = busy
        .map(|b| write_busy_windows(&data, b))
        .unwrap_or_default();
    let profiles = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let health = format!("127.0.0.1:{}", free_port());
    let ember = EmberRun::run(dir.path())
        .args([
            "--config",
            cfg.to_str().expect("utf-8"),
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--listen",
            &profiles,
            "--metrics-listen",
            &metrics,
            "--health-listen",
            &health,
        ])
        .try_spawn()
        .expect("starting ember");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if matches!(http_get(&health, "/readyz"), Ok((200, _))) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ember not ready after 90 s\n{}",
            ember.stderr()
        );
        thread::sleep(Duration::from_millis(200));
    }
    (
        Agent {
            ember,
            profiles,
            metrics,
            health,
            _dir: dir,
        },
        range,
    )
}

/// Raises this process's open-file limit to its hard limit.
fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
    lim.rlim_cur
}

/// `ember_http_refused_total{reason="…"}` in an exposition.
fn refused(metrics: &str, reason: &str) -> f64 {
    series_value(
        metrics,
        &format!("ember_http_refused_total{{reason=\"{reason}\"}}"),
    )
}

/// Whether the peer closed `s` (EOF or reset); `s` must be non-blocking.
fn closed_by_peer(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) if e.kind() == ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

/// Keeps `n` idle connections to `addr` open until `stop`: each one the agent closes is
/// counted in `closes` and opened again.
fn flood(addr: String, n: usize, stop: Arc<AtomicBool>, closes: Arc<AtomicU64>) {
    let connect = |addr: &str| -> Option<TcpStream> {
        let s = TcpStream::connect(addr).ok()?;
        s.set_nonblocking(true).ok()?;
        Some(s)
    };
    let mut socks: Vec<Option<TcpStream>> = (0..n).map(|_| connect(&addr)).collect();
    while !stop.load(Ordering::Relaxed) {
        for slot in socks.iter_mut() {
            let gone = match slot {
                Some(s) => closed_by_peer(s),
                None => true,
            };
            if gone {
                if slot.is_some() {
                    closes.fetch_add(1, Ordering::Relaxed);
                }
                *slot = connect(&addr);
            }
        }
        thread::sleep(Duration::from_millis(100));
    }
    // One last look: closes that happened since the last sweep.
    for s in socks.iter_mut().flatten() {
        if closed_by_peer(s) {
            closes.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// 600 idle sockets, kept topped up, on each of the profiles and metrics listeners
/// (cap 64): the probes on the health listener answer 40 of 40 within the kubelet's 5 s,
/// and 20 of 20 new requests on the profiles listener are served (within 3 attempts) by
/// evicting idle sockets. Every socket the agent closed was counted as `evicted`; none was
/// refused at accept (there was always an idle one to evict).
#[test]
fn probes_and_new_requests_get_through_a_connection_flood() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let nofile = raise_nofile();
    assert!(
        nofile >= 2_000,
        "RLIMIT_NOFILE hard limit {nofile} is too low"
    );
    let (a, _) = start(
        "  max_connections: 64\n  header_read_timeout: 60s\n  idle_timeout: 60s\n",
        None,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let closes = Arc::new(AtomicU64::new(0));
    let flooders: Vec<_> = [a.profiles.clone(), a.metrics.clone()]
        .into_iter()
        .map(|addr| {
            let (stop, closes) = (stop.clone(), closes.clone());
            thread::spawn(move || flood(addr, 600, stop, closes))
        })
        .collect();
    // The flood holds every slot once the agent has had to close idle sockets.
    let deadline = Instant::now() + Duration::from_secs(60);
    while closes.load(Ordering::Relaxed) < 600 {
        assert!(Instant::now() < deadline, "the flood never filled the cap");
        thread::sleep(Duration::from_millis(50));
    }

    let mut probes = 0;
    let mut served = 0;
    let mut retries = 0;
    for i in 0..40 {
        let path = if i % 2 == 0 { "/healthz" } else { "/readyz" };
        if matches!(http_get(&a.health, path), Ok((200, _))) {
            probes += 1;
        }
        // A new request on the flooded listener: admitted by evicting an idle socket.
        // The flood opens hundreds of sockets per sweep, so a client preempted between
        // its connect and its request on a loaded machine may lose its fresh slot to 64
        // newer ones: up to 3 attempts (before the fix none got in while the flood held
        // the cap, for 60 s here).
        if i % 2 == 0 {
            let tries =
                (1..=3).find(|_| matches!(http_get(&a.profiles, "/api/windows"), Ok((200, _))));
            if let Some(t) = tries {
                served += 1;
                retries += t - 1;
            }
        }
        thread::sleep(Duration::from_millis(100));
    }
    let churn = closes.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        f.join().expect("flood thread");
    }
    let m = scrape(&a.metrics);
    println!(
        "flood: probes {probes}/40, new profile requests {served}/20 ({retries} retried), flood \
         sockets closed by the agent {} (during the probes {churn}), evicted {}, refused at \
         accept {}",
        closes.load(Ordering::Relaxed),
        refused(&m, "evicted"),
        refused(&m, "connection_cap")
    );
    assert_eq!(probes, 40, "probes answered under the flood");
    assert_eq!(served, 20, "new requests on the flooded profiles listener");
    // Every flood socket the agent closed was an eviction, counted; the counter may be
    // higher (closes after the last look, the scrape's own admission).
    assert!(
        refused(&m, "evicted") >= closes.load(Ordering::Relaxed) as f64,
        "{m}"
    );
    assert_eq!(refused(&m, "connection_cap"), 0.0, "{m}");
    drop(a);
}

/// Reads `ember_http_heavy_running` from `addr`, `None` if the scrape failed.
fn heavy_running(addr: &str) -> Option<f64> {
    let (code, m) = http_get(addr, "/metrics").ok()?;
    (code == 200).then(|| metric_value(&m, "ember_http_heavy_running"))?
}

/// CPU time (user + system) of `pid` in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    cpu_ticks(pid).unwrap_or(0) as f64 / clk_tck() as f64
}

/// Sends `GET path` on a new connection and returns it without reading.
fn send(addr: &str, path: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    let auth = token_for(addr)
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{auth}\r\n"
    )
    .expect("send");
    s
}

/// The status of the response that arrived on `s`, if one did (not consumed).
fn status_now(s: &TcpStream) -> Option<u16> {
    s.set_nonblocking(true).ok()?;
    let mut head = [0u8; 12];
    let n = s.peek(&mut head).ok()?;
    (n == head.len())
        .then(|| std::str::from_utf8(&head[9..12]).ok()?.parse().ok())
        .flatten()
}

/// Three rounds of 12 flame-graph requests over the busy windows: once each request was
/// either refused (503 busy) or is running, the clients hang up after half a second
/// (reading 10 busy windows takes seconds). At most 4 pieces of heavy work ever run at
/// once; each abandoned one stops (the running gauge is back to 0 within seconds, not
/// after the work would have ended) and is counted as `cancelled`, the others as `busy`.
#[test]
fn abandoned_heavy_requests_stop_and_stay_under_the_cap() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let (a, range) = start(
        "  max_concurrent_requests: 4\n  request_timeout: 60s\n",
        Some(&BUSY),
    );
    let pid = a.ember.pid();
    let rss_before = peak_rss(pid) >> 20;
    // A watcher samples the gauge throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (stop, peak, addr) = (stop.clone(), peak.clone(), a.metrics.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(v) = heavy_running(&addr) {
                    peak.fetch_max(v as u64, Ordering::Relaxed);
                }
                thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let path = format!("/api/flamegraph?{range}");
    let (mut busy_seen, mut abandoned, mut answered) = (0, 0, 0);
    let mut stopped_after = Vec::new();
    let mut cpu_after = Vec::new();
    for _round in 0..3 {
        let clients: Vec<TcpStream> = (0..12).map(|_| send(&a.profiles, &path)).collect();
        // Every request reached its handler: answered (busy, or done on a very fast
        // machine) or running. Generous for a loaded machine.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let answered_now = clients.iter().filter(|c| status_now(c).is_some()).count();
            let running = heavy_running(&a.metrics).unwrap_or(0.0) as usize;
            if answered_now + running >= clients.len() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "requests never reached the agent"
            );
            thread::sleep(Duration::from_millis(20));
        }
        thread::sleep(Duration::from_millis(500));
        for c in &clients {
            match status_now(c) {
                Some(503) => busy_seen += 1,
                Some(_) => answered += 1,
                None => abandoned += 1,
            }
        }
        drop(clients);
        let hung_up = Instant::now();
        let cpu = cpu_seconds(pid);
        // The work stops at its next check: generous for a loaded machine, far below
        // what the work itself takes (before the fix it ran on for minutes).
        let deadline = hung_up + Duration::from_secs(20);
        loop {
            if heavy_running(&a.metrics) == Some(0.0) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "heavy work still running 20 s after its clients left\n{}",
                a.ember.stderr()
            );
            thread::sleep(Duration::from_millis(20));
        }
        stopped_after.push(hung_up.elapsed());
        cpu_after.push(cpu_seconds(pid) - cpu);
    }
    // After the last round: 5 s in which nothing runs.
    let cpu = cpu_seconds(pid);
    thread::sleep(Duration::from_secs(5));
    let idle_cpu = cpu_seconds(pid) - cpu;
    stop.store(true, Ordering::Relaxed);
    watcher.join().expect("watcher");
    let m = scrape(&a.metrics);
    let (busy, cancelled) = (refused(&m, "busy"), refused(&m, "cancelled"));
    println!(
        "abandoned: peak running {} (cap 4), stopped {stopped_after:?} after the hang-ups, \
         CPU meanwhile {cpu_after:.2?} s, CPU in the 5 s after {idle_cpu:.2} s, peak RSS \
         {rss_before} -> {} MiB; busy {busy} (clients saw {busy_seen}), cancelled {cancelled} \
         (abandoned {abandoned}), answered {answered}",
        peak.load(Ordering::Relaxed),
        peak_rss(pid) >> 20
    );
    assert!(peak.load(Ordering::Relaxed) <= 4, "{m}");
    // Stopped work costs nothing after: the agent idles (its sampler and readings) in the
    // 5 s after the last hang-up, and the abandoned work left no memory behind beyond
    // one request's worth of decoded windows.
    assert!(
        idle_cpu < IDLE_CPU_SECONDS,
        "{idle_cpu:.2} s of CPU in the 5 s after the clients left: the work goes on"
    );
    let rss_after = peak_rss(pid) >> 20;
    assert!(
        rss_after <= rss_before + RSS_GROWTH_MIB,
        "peak RSS grew from {rss_before} to {rss_after} MiB over abandoned requests"
    );
    assert_eq!(busy_seen + answered + abandoned, 36);
    assert!(
        abandoned >= 1,
        "no request was still running when its client left"
    );
    assert_eq!(busy, busy_seen as f64, "{m}");
    // Each request whose client left while it ran was cancelled, counted once.
    assert_eq!(cancelled, abandoned as f64, "{m}");
    assert_eq!(metric_value(&m, "ember_http_heavy_running"), Some(0.0));
    drop(a);
}

/// SIGTERM while four flame-graph requests over the busy windows are in flight (their
/// clients waiting): the agent drains for at most a few seconds, stops the work and exits,
/// well within its shutdown deadline, instead of waiting for the work to end.
#[test]
fn sigterm_does_not_wait_for_heavy_requests() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let (mut a, range) = start(
        "  max_concurrent_requests: 4\n  request_timeout: 60s\n",
        Some(&BUSY),
    );
    let path = format!("/api/flamegraph?{range}");
    let _clients: Vec<TcpStream> = (0..4).map(|_| send(&a.profiles, &path)).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while heavy_running(&a.metrics) != Some(4.0) {
        assert!(Instant::now() < deadline, "the requests never all ran");
        thread::sleep(Duration::from_millis(20));
    }
    let t = Instant::now();
    a.ember.signal(libc::SIGTERM);
    // 5 s of drain for the requests (README: "Shutdown drains requests for at most 5 s"),
    // then the work is told to stop; the rest of the shutdown is the last window.
    let status = a.ember.wait(Duration::from_secs(30));
    let took = t.elapsed();
    println!("sigterm with 4 heavy requests in flight: exited in {took:?}");
    assert!(status.success(), "{status}\n{}", a.ember.stderr());
    assert!(
        took <= SIGTERM_BOUND,
        "exit took {took:?} with heavy requests in flight: more than the 5 s drain and the last \
         window ({SIGTERM_BOUND:?})\n{}",
        a.ember.stderr()
    );
}
