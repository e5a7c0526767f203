//! Shipping windows to several backends at once (issue 6): a Pyroscope-compatible
//! receiver (checks the request shape of the pyroscope-io client and validates each
//! pprof with pprof's checker) and an OTLP profiles server built from the official
//! protos (opentelemetry-proto's tonic stubs), compared with the local window files;
//! then backend faults, with drops counted and the other sink still receiving.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use base64::Engine;
use ember::proto::Profile;
use ember::push_proto::PushRequest;
use ember_tests::*;
use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_server::{
    ProfilesService, ProfilesServiceServer,
};
use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value;
use prost::Message;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// How the Pyroscope receiver behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Accept and store.
    Ok,
    /// Not listening: connections are refused.
    Down,
    /// Answer with this status.
    Status(u16),
    /// 429 with `Retry-After: N`.
    RetryAfter(u64),
    /// Reply (200) only after this many seconds.
    Slow(u64),
    /// Read the request head, then reset the connection mid-request.
    Reset,
    /// Accept and read, never reply.
    BlackHole,
}

/// One push the receiver accepted.
struct Push {
    headers: HashMap<String, String>,
    req: PushRequest,
}

#[derive(Clone)]
struct Pyroscope {
    addr: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    got: Arc<Mutex<Vec<Push>>>,
    errors: Arc<Mutex<Vec<String>>>,
    attempts: Arc<AtomicU64>,
}

impl Pyroscope {
    fn start(rt: &tokio::runtime::Runtime, mode: Mode) -> Self {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let p = Pyroscope {
            addr,
            mode: Arc::new(Mutex::new(mode)),
            got: Arc::default(),
            errors: Arc::default(),
            attempts: Arc::default(),
        };
        rt.spawn(p.clone().serve());
        p
    }

    fn mode(&self) -> Mode {
        *self.mode.lock().expect("lock")
    }

    fn set(&self, m: Mode) {
        *self.mode.lock().expect("lock") = m;
    }

    fn received(&self) -> usize {
        self.got.lock().expect("lock").len()
    }

    /// Listens while the mode is not `Down`; closes the socket while it is.
    async fn serve(self) {
        loop {
            if self.mode() == Mode::Down {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            let Ok(listener) = TcpListener::bind(self.addr).await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            while self.mode() != Mode::Down {
                tokio::select! {
                    r = listener.accept() => if let Ok((s, _)) = r {
                        tokio::spawn(self.clone().connection(s));
                    },
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
        }
    }

    async fn connection(self, stream: TcpStream) {
        let mut r = BufReader::new(stream);
        loop {
            let mut head = Vec::new();
            loop {
                let mut line = String::new();
                match r.read_line(&mut line).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if line == "\r\n" {
                    break;
                }
                head.push(line.trim_end().to_owned());
            }
            self.attempts.fetch_add(1, Ordering::Relaxed);
            let request_line = head.first().cloned().unwrap_or_default();
            let headers: HashMap<String, String> = head
                .iter()
                .skip(1)
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
                .collect();
            let mode = self.mode();
            if mode == Mode::Reset {
                let s = r.into_inner();
                // A zero linger sends RST at once (it is a non-zero linger that blocks).
                #[allow(deprecated)]
                let _ = s.set_linger(Some(Duration::ZERO));
                drop(s);
                return;
            }
            let len: usize = headers
                .get("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0u8; len];
            if r.read_exact(&mut body).await.is_err() {
                return;
            }
            let reply = match mode {
                Mode::Down => return,
                Mode::Reset => return,
                Mode::BlackHole => {
                    while self.mode() == Mode::BlackHole {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    return;
                }
                Mode::Status(code) => format!(
                    "HTTP/1.1 {code} Nope\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\nnope"
                ),
                Mode::RetryAfter(s) => format!(
                    "HTTP/1.1 429 Too Many Requests\r\nRetry-After: {s}\r\nContent-Length: 0\r\n\r\n"
                ),
                Mode::Slow(s) => {
                    tokio::time::sleep(Duration::from_secs(s)).await;
                    "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_owned()
                }
                Mode::Ok => match self.decode(&request_line, &headers, &body) {
                    Ok(req) => {
                        self.got.lock().expect("lock").push(Push {
                            headers,
                            req,
                        });
                        "HTTP/1.1 200 OK\r\nContent-Type: application/proto\r\nContent-Length: 0\r\n\r\n"
                            .to_owned()
                    }
                    Err(e) => {
                        self.errors.lock().expect("lock").push(e.clone());
                        format!(
                            "HTTP/1.1 400 Bad Request\r\nContent-Length: {}\r\n\r\n{e}",
                            e.len()
                        )
                    }
                },
            };
            if r.get_mut().write_all(reply.as_bytes()).await.is_err() {
                return;
            }
        }
    }

    /// The request shape the pyroscope-io client sends (conventions.md): a Connect
    /// unary POST, `application/proto`, gzip'ed `PushRequest`.
    fn decode(
        &self,
        request_line: &str,
        headers: &HashMap<String, String>,
        body: &[u8],
    ) -> Result<PushRequest, String> {
        if request_line != "POST /push.v1.PusherService/Push HTTP/1.1" {
            return Err(format!("unexpected request line {request_line:?}"));
        }
        if headers.get("content-type").map(String::as_str) != Some("application/proto") {
            return Err(format!("content-type {:?}", headers.get("content-type")));
        }
        if headers.get("content-encoding").map(String::as_str) != Some("gzip") {
            return Err(format!(
                "content-encoding {:?}",
                headers.get("content-encoding")
            ));
        }
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(body)
            .read_to_end(&mut raw)
            .map_err(|e| format!("gunzip: {e}"))?;
        PushRequest::decode(&raw[..]).map_err(|e| format!("PushRequest: {e}"))
    }
}

/// How the OTLP receiver behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OtlpMode {
    Ok,
    Unavailable,
    InvalidArgument,
}

/// One export the OTLP receiver accepted, with its `x-test-header` metadata.
type Export = (ExportProfilesServiceRequest, Option<String>);

#[derive(Clone)]
struct Otlp {
    mode: Arc<Mutex<OtlpMode>>,
    /// Each request with its `x-test-header` metadata.
    got: Arc<Mutex<Vec<Export>>>,
}

#[tonic::async_trait]
impl ProfilesService for Otlp {
    async fn export(
        &self,
        request: tonic::Request<ExportProfilesServiceRequest>,
    ) -> Result<tonic::Response<ExportProfilesServiceResponse>, tonic::Status> {
        let mode = *self.mode.lock().expect("lock");
        match mode {
            OtlpMode::Unavailable => return Err(tonic::Status::unavailable("down for a bit")),
            OtlpMode::InvalidArgument => return Err(tonic::Status::invalid_argument("not today")),
            OtlpMode::Ok => {}
        }
        let auth = request
            .metadata()
            .get("x-test-header")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.got
            .lock()
            .expect("lock")
            .push((request.into_inner(), auth));
        Ok(tonic::Response::new(
            ExportProfilesServiceResponse::default(),
        ))
    }
}

impl Otlp {
    fn start(rt: &tokio::runtime::Runtime) -> (Self, SocketAddr) {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let o = Otlp {
            mode: Arc::new(Mutex::new(OtlpMode::Ok)),
            got: Arc::default(),
        };
        let svc = ProfilesServiceServer::new(o.clone())
            .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
            .max_decoding_message_size(64 << 20);
        rt.spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve(addr),
        );
        (o, addr)
    }

    fn set(&self, m: OtlpMode) {
        *self.mode.lock().expect("lock") = m;
    }

    fn received(&self) -> usize {
        self.got.lock().expect("lock").len()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Starts `ember run` on the hog only, with `config` (YAML) layered on the default.
fn start_ember(dir: &Path, config: &str, listen: &str) -> Ember {
    EmberRun::run(dir)
        .config(config)
        .data_dir(dir.join("data"))
        .listen_on(listen)
        .spawn_attached(Duration::from_secs(15))
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Folded stacks (root first) → CPU nanoseconds, from a pprof profile.
fn pprof_folded(p: &Profile) -> BTreeMap<String, i64> {
    let mut m = BTreeMap::new();
    for s in stacks(p) {
        *m.entry(s.folded()).or_insert(0) += s.values.get(1).copied().unwrap_or(0);
    }
    m
}

/// Folded stacks → CPU nanoseconds from an OTLP request, through its dictionary.
fn otlp_folded(r: &ExportProfilesServiceRequest) -> BTreeMap<String, i64> {
    let d = r.dictionary.as_ref().expect("dictionary");
    let mut m = BTreeMap::new();
    for rp in &r.resource_profiles {
        for sp in &rp.scope_profiles {
            for p in &sp.profiles {
                for s in &p.samples {
                    let stack = &d.stack_table[s.stack_index as usize];
                    let mut names: Vec<String> = stack
                        .location_indices
                        .iter()
                        .flat_map(|&l| {
                            let loc = &d.location_table[l as usize];
                            if loc.lines.is_empty() {
                                return vec!["?".to_owned()];
                            }
                            loc.lines
                                .iter()
                                .map(|ln| {
                                    let f = &d.function_table[ln.function_index as usize];
                                    let n = &d.string_table[f.name_strindex as usize];
                                    if n.is_empty() {
                                        "?".to_owned()
                                    } else {
                                        n.clone()
                                    }
                                })
                                .collect()
                        })
                        .collect();
                    names.reverse();
                    if names.is_empty() {
                        names.push("<no frames>".into());
                    }
                    *m.entry(names.join(";")).or_insert(0) += s.values[0];
                }
            }
        }
    }
    m
}

fn resource_attrs(r: &ExportProfilesServiceRequest) -> Vec<BTreeMap<String, String>> {
    r.resource_profiles
        .iter()
        .map(|rp| {
            rp.resource
                .iter()
                .flat_map(|res| &res.attributes)
                .map(|kv| {
                    let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                        Some(any_value::Value::StringValue(s)) => s.clone(),
                        Some(any_value::Value::IntValue(i)) => i.to_string(),
                        other => format!("{other:?}"),
                    };
                    (kv.key.clone(), v)
                })
                .collect()
        })
        .collect()
}

/// Both network sinks and the files receive the same windows: Pyroscope pushes
/// have the pyroscope-io request shape, labels and auth headers and pass pprof's
/// checker; OTLP requests decode with the official protos and carry the same
/// stacks and CPU time as the window file, with semantic-convention resources.
#[test]
fn pyroscope_and_otlp_get_the_same_windows() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let rt = runtime();
    let pyro = Pyroscope::start(&rt, Mode::Ok);
    let (otlp, otlp_addr) = Otlp::start(&rt);
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = dir.path().join("password");
    std::fs::write(&secret, "s3cret-pw\n").expect("password file");
    let mut hog = Fixture::spawn(CPU_HOG, &["--seconds", "60"]).expect("cpu_hog");
    hog.wait_for("ready", Duration::from_secs(10))
        .expect("ready");
    let listen = format!("127.0.0.1:{}", free_port());
    let config = format!(
        r#"
sampling:
  pids: [{pid}]
window:
  duration: 1s
kubernetes:
  enabled: false
# CPU windows only: each push is checked against the CPU window file of its start.
offcpu:
  enabled: false
sinks:
  timeout: 5s
  pyroscope:
    enabled: true
    url: http://{pyro}
    labels: {{cluster: e2e}}
    tenant_id: team-a
    basic_auth_user: ember
    basic_auth_password_file: {secret}
    headers: {{X-Extra: yes-please}}
  otlp:
    enabled: true
    endpoint: http://{otlp_addr}
    headers: {{x-test-header: hello}}
"#,
        pid = hog.pid,
        pyro = pyro.addr,
        secret = secret.display(),
    );
    let mut ember = start_ember(dir.path(), &config, &listen);
    let started = Instant::now();
    while (pyro.received() < 3 || otlp.received() < 3)
        && started.elapsed() < Duration::from_secs(20)
    {
        thread::sleep(Duration::from_millis(200));
    }
    let metrics = ember.try_scrape();
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(20));
    let stderr = ember.stderr();
    assert!(status.success(), "ember exited with {status}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        !stderr.contains("s3cret-pw"),
        "the password was logged:\n{stderr}"
    );
    assert!(
        pyro.errors.lock().expect("lock").is_empty(),
        "bad pushes: {:?}",
        pyro.errors.lock().expect("lock")
    );
    assert!(
        pyro.received() >= 3,
        "pyroscope got {} pushes\n{stderr}",
        pyro.received()
    );
    assert!(
        otlp.received() >= 3,
        "otlp got {} requests\n{stderr}",
        otlp.received()
    );

    // Window files by start time.
    let mut files: HashMap<i64, Profile> = HashMap::new();
    for e in std::fs::read_dir(dir.path().join("data"))
        .expect("data dir")
        .flatten()
    {
        if let Ok(p) = read_profile(&e.path()) {
            files.insert(p.time_nanos, p);
        }
    }
    assert!(files.len() >= 3, "{} window files", files.len());

    // Pyroscope: request shape, labels, valid pprof, same CPU time as the file.
    let want_auth = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("ember:s3cret-pw")
    );
    let mut matched = 0;
    let mut push_bytes = Vec::new();
    for (i, push) in pyro.got.lock().expect("lock").iter().enumerate() {
        let h = &push.headers;
        assert_eq!(h.get("authorization"), Some(&want_auth), "{h:?}");
        assert_eq!(h.get("x-scope-orgid").map(String::as_str), Some("team-a"));
        assert_eq!(h.get("x-extra").map(String::as_str), Some("yes-please"));
        push_bytes.push(h.get("content-length").cloned().unwrap_or_default());
        assert_eq!(push.req.series.len(), 1, "one service (the hog)");
        let series = &push.req.series[0];
        let labels: BTreeMap<&str, &str> = series
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        assert_eq!(labels.len(), series.labels.len(), "duplicate label names");
        assert_eq!(labels.get("__name__"), Some(&"process_cpu"));
        assert_eq!(labels.get("service_name"), Some(&"cpu_hog"), "{labels:?}");
        assert_eq!(labels.get("cluster"), Some(&"e2e"));
        assert_eq!(series.samples.len(), 1);
        let raw = &series.samples[0].raw_profile;
        assert!(
            !raw.starts_with(&[0x1f, 0x8b]),
            "raw_profile must not be gzip'ed"
        );
        assert_eq!(series.samples[0].id.len(), 36, "a UUID");
        let path = dir.path().join(format!("push-{i}.pb"));
        std::fs::write(&path, raw).expect("write");
        let n = pprofcheck(&path);
        assert!(n > 0);
        let p = Profile::decode(&raw[..]).expect("pprof");
        for s in &p.sample {
            for l in &s.label {
                let k = string(&p, l.key);
                assert!(
                    k != "tid" && k != "pid",
                    "high-cardinality label {k} pushed"
                );
            }
        }
        if let Some(f) = files.get(&p.time_nanos) {
            assert_eq!(
                pprof_folded(&p),
                pprof_folded(f),
                "push {i} vs its window file"
            );
            matched += 1;
        }
    }
    assert!(matched >= 2, "only {matched} pushes matched a window file");

    // OTLP: same stacks and CPU time as the window file; resource attributes.
    let mut matched = 0;
    let mut otlp_bytes = Vec::new();
    for (req, header) in otlp.got.lock().expect("lock").iter() {
        assert_eq!(header.as_deref(), Some("hello"));
        otlp_bytes.push(req.encoded_len());
        let attrs = resource_attrs(req);
        assert_eq!(attrs.len(), 1, "one resource: the hog process, {attrs:?}");
        let a = &attrs[0];
        assert_eq!(a.get("process.pid"), Some(&hog.pid.to_string()), "{a:?}");
        assert_eq!(a.get("service.name").map(String::as_str), Some("cpu_hog"));
        assert_eq!(
            a.get("process.executable.name").map(String::as_str),
            Some("cpu_hog")
        );
        assert!(a.get("host.name").is_some_and(|h| !h.is_empty()), "{a:?}");
        let p = &req.resource_profiles[0].scope_profiles[0].profiles[0];
        let d = req.dictionary.as_ref().expect("dictionary");
        let st = p.sample_type.expect("sample type");
        assert_eq!(d.string_table[st.type_strindex as usize], "cpu");
        assert_eq!(d.string_table[st.unit_strindex as usize], "nanoseconds");
        for s in &p.samples {
            let keys: Vec<&str> = s
                .attribute_indices
                .iter()
                .map(|&i| {
                    d.string_table[d.attribute_table[i as usize].key_strindex as usize].as_str()
                })
                .collect();
            assert!(
                keys.contains(&"thread.id") && keys.contains(&"thread.name"),
                "{keys:?}"
            );
        }
        if let Some(f) = files.get(&(p.time_unix_nano as i64)) {
            assert_eq!(p.period, f.period);
            assert_eq!(otlp_folded(req), pprof_folded(f), "OTLP vs window file");
            matched += 1;
        }
    }
    assert!(
        matched >= 2,
        "only {matched} OTLP requests matched a window file"
    );
    let sent = |sink: &str| {
        series_value(
            &metrics,
            &format!("ember_export_sent_total{{sink=\"{sink}\"}}"),
        )
    };
    assert!(sent("pyroscope") >= 1.0 && sent("otlp") >= 1.0, "{metrics}");
    println!(
        "bytes per window: pyroscope push bodies {push_bytes:?}; otlp requests (before gzip) {otlp_bytes:?}"
    );
    println!(
        "latency: {:?}",
        family(&metrics, "ember_export_latency_seconds_sum")
            .into_iter()
            .zip(family(&metrics, "ember_export_latency_seconds_count"))
            .map(|((k, s), (_, c))| format!("{k:?} mean {:.1} ms", 1000.0 * s / c.max(1.0)))
            .collect::<Vec<_>>()
    );
}

/// Faults, one after another in one run: Pyroscope down at start, 500, 429 with
/// Retry-After, 400, slow replies, connection resets, a black hole and flapping,
/// while OTLP keeps receiving; then OTLP unavailable and rejecting while
/// Pyroscope keeps receiving. Drops are counted, memory stays bounded, nothing panics.
#[test]
fn faults_are_counted_and_isolated() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let rt = runtime();
    let pyro = Pyroscope::start(&rt, Mode::Down);
    let (otlp, otlp_addr) = Otlp::start(&rt);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut hog = Fixture::spawn(CPU_HOG, &["--seconds", "90"]).expect("cpu_hog");
    hog.wait_for("ready", Duration::from_secs(10))
        .expect("ready");
    let listen = format!("127.0.0.1:{}", free_port());
    // Two requests of ~750 bytes: outages overflow it within seconds.
    let queue_bytes = 2048;
    let config = format!(
        r#"
sampling:
  pids: [{pid}]
window:
  duration: 1s
kubernetes:
  enabled: false
# CPU windows only: the queue is sized in CPU requests.
offcpu:
  enabled: false
sinks:
  queue_bytes: {queue_bytes}
  timeout: 2s
  retry_initial_backoff: 100ms
  retry_max_backoff: 1s
  retry_max_elapsed: 6s
  shutdown_grace: 2s
  pyroscope:
    enabled: true
    url: http://{pyro}
  otlp:
    enabled: true
    endpoint: http://{otlp_addr}
"#,
        pid = hog.pid,
        pyro = pyro.addr,
    );
    let mut ember = start_ember(dir.path(), &config, &listen);
    let max_rss = std::cell::Cell::new(0u64);
    let max_queue = std::cell::Cell::new(0.0f64);
    let phase = |name: &str, secs: u64, pyro_mode: Mode, otlp_mode: OtlpMode| {
        pyro.set(pyro_mode);
        otlp.set(otlp_mode);
        let (p0, o0) = (pyro.received(), otlp.received());
        let end = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < end {
            thread::sleep(Duration::from_millis(250));
            max_rss.set(max_rss.get().max(rss_kib(ember.pid())));
            let m = ember.try_scrape();
            for (_, v) in family(&m, "ember_export_queue_bytes").iter() {
                max_queue.set(max_queue.get().max(*v));
            }
        }
        let (p, o) = (pyro.received() - p0, otlp.received() - o0);
        println!(
            "phase {name}: pyroscope got {p}, otlp got {o}, max RSS {} KiB",
            max_rss.get()
        );
        (p, o)
    };
    let (_, o) = phase("pyroscope down at start", 5, Mode::Down, OtlpMode::Ok);
    assert!(o >= 2, "otlp must keep receiving while pyroscope is down");
    let (p, _) = phase("pyroscope back", 4, Mode::Ok, OtlpMode::Ok);
    assert!(p >= 1, "pyroscope must receive once back");
    let (_, o) = phase("500", 4, Mode::Status(500), OtlpMode::Ok);
    assert!(o >= 2);
    let a0 = pyro.attempts.load(Ordering::Relaxed);
    let (_, o) = phase("429 Retry-After", 4, Mode::RetryAfter(1), OtlpMode::Ok);
    assert!(o >= 2);
    // Retry-After: 1 spaces attempts a second apart (the backoff alone starts at 100 ms).
    let attempts = pyro.attempts.load(Ordering::Relaxed) - a0;
    assert!(
        attempts <= 6,
        "{attempts} attempts in 4 s despite Retry-After: 1"
    );
    let (_, o) = phase("400", 3, Mode::Status(400), OtlpMode::Ok);
    assert!(o >= 1);
    let (_, o) = phase("slow 10 s", 5, Mode::Slow(10), OtlpMode::Ok);
    assert!(o >= 2, "a slow pyroscope must not delay otlp");
    let (_, o) = phase("reset", 3, Mode::Reset, OtlpMode::Ok);
    assert!(o >= 1);
    let rss_before_hole = max_rss.get();
    let (_, o) = phase("black hole", 10, Mode::BlackHole, OtlpMode::Ok);
    assert!(o >= 4, "a black-holed pyroscope must not delay otlp");
    let mut flaps = 0;
    for i in 0..6 {
        let mode = if i % 2 == 0 { Mode::Down } else { Mode::Ok };
        flaps += phase("flap", 1, mode, OtlpMode::Ok).0;
    }
    let (p, _) = phase("pyroscope steady again", 3, Mode::Ok, OtlpMode::Ok);
    assert!(p + flaps >= 1, "pyroscope must receive after flapping");
    let (p, _) = phase("otlp unavailable", 3, Mode::Ok, OtlpMode::Unavailable);
    assert!(
        p >= 1,
        "pyroscope must keep receiving while otlp is unavailable"
    );
    let (p, _) = phase(
        "otlp invalid argument",
        3,
        Mode::Ok,
        OtlpMode::InvalidArgument,
    );
    assert!(p >= 1);
    let (_, o) = phase("otlp back", 3, Mode::Ok, OtlpMode::Ok);
    assert!(o >= 1, "otlp must receive once back");

    let m = ember.try_scrape();
    let (max_rss, max_queue) = (max_rss.get(), max_queue.get());
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(20));
    let stderr = ember.stderr();
    assert!(status.success(), "ember exited with {status}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let dropped = family(&m, "ember_export_dropped_total");
    println!("dropped: {dropped:?}");
    println!("sent: {:?}", family(&m, "ember_export_sent_total"));
    println!("max RSS {max_rss} KiB (before the black hole {rss_before_hole} KiB); max queue {max_queue} bytes");
    let d = |sink: &str, reason: &str| {
        series_value(
            &m,
            &format!("ember_export_dropped_total{{sink=\"{sink}\",reason=\"{reason}\"}}"),
        )
    };
    assert!(d("pyroscope", "http_400") >= 1.0, "{dropped:?}");
    assert!(d("otlp", "grpc_invalid_argument") >= 1.0, "{dropped:?}");
    assert!(d("pyroscope", "queue_full") >= 1.0, "{dropped:?}");
    assert!(d("pyroscope", "retries_exhausted") >= 1.0, "{dropped:?}");
    assert!(
        d("otlp", "http_400") == 0.0 && d("otlp", "queue_full") == 0.0,
        "{dropped:?}"
    );
    assert!(
        max_queue <= queue_bytes as f64,
        "queue {max_queue} over its cap"
    );
    // The queue is 2 KiB: an outage must not grow the agent. The bound is loose on
    // purpose (the agent's baseline is tens of MiB); growth would be unbounded.
    assert!(max_rss < 256 * 1024, "RSS {max_rss} KiB");
    // Each failure is logged once per reason, not once per attempt.
    let lines = stderr.matches("retrying with backoff").count();
    assert!(lines <= 12, "{lines} retry warnings:\n{stderr}");
}
