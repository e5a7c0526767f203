//! The agent's small HTTP server: metrics, health, and the recent windows
//! as raw pprof files and flame graphs.
//!
//! Routes: `GET /metrics` (OpenMetrics), `GET /healthz`, `GET /` (an HTML
//! list of windows), `GET /windows/<name>` (the `.pb.gz` file) and
//! `GET /flamegraph/<name>.svg`. Decoding and rendering run on the blocking
//! pool, at most [`MAX_RENDERS`] at a time.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::encode::flamegraph::{self, xml_escape, FlameGraphError};
use crate::export::files::{FilesError, WindowDir};
use crate::metrics::{Metrics, OPENMETRICS_CONTENT_TYPE};

/// Flame graphs rendered at once; each may hold a decoded profile in
/// memory, so more requests get 503 instead of queueing.
pub const MAX_RENDERS: usize = 2;
/// Windows listed on the index page, newest first.
const MAX_LISTED: usize = 500;
/// Slack added to three windows before the agent counts as stuck.
pub(crate) const HEALTH_GRACE: Duration = Duration::from_secs(30);

/// Liveness of the pipeline: it calls [`Health::beat`] whenever a window
/// closes, and `/healthz` fails once no beat (or, before the first, no
/// start) happened within 3 × window + 30 s.
#[derive(Debug)]
pub struct Health {
    limit: Duration,
    started: Instant,
    /// Milliseconds from `started` to the last beat; an atomic so the
    /// pipeline never waits on the server.
    last_beat_ms: AtomicU64,
}

impl Health {
    /// Starts the clock for a pipeline that closes a window every `window`.
    pub fn new(window: Duration) -> Arc<Self> {
        Arc::new(Self {
            limit: window.saturating_mul(3).saturating_add(HEALTH_GRACE),
            started: Instant::now(),
            last_beat_ms: AtomicU64::new(0),
        })
    }

    /// Records that a window just closed.
    pub fn beat(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_beat_ms.store(ms, Ordering::Relaxed);
    }

    /// `Ok` while healthy, else why not.
    pub fn check(&self) -> Result<(), HealthError> {
        self.check_at(Instant::now())
    }

    fn check_at(&self, now: Instant) -> Result<(), HealthError> {
        let last = Duration::from_millis(self.last_beat_ms.load(Ordering::Relaxed));
        let since = now
            .saturating_duration_since(self.started)
            .saturating_sub(last);
        if since <= self.limit {
            Ok(())
        } else {
            Err(HealthError::Stalled {
                since,
                limit: self.limit,
            })
        }
    }
}

/// Why `/healthz` fails; its text is the body of the 503.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    /// No window closed (and, before the first, the pipeline did not start) within the limit.
    #[error(
        "no profiling window closed in the last {} s (limit {} s)",
        .since.as_secs(),
        .limit.as_secs()
    )]
    Stalled {
        /// Time since the last window closed (or since the start).
        since: Duration,
        /// 3 × window + 30 s.
        limit: Duration,
    },
}

/// Binds a TCP listener for [`serve`].
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// What every handler can reach.
#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    windows: Arc<WindowDir>,
    health: Arc<Health>,
    renders: Arc<Semaphore>,
}

/// Serves the routes on `listener` until `shutdown` completes, then
/// finishes in-flight requests and returns.
pub async fn serve(
    listener: TcpListener,
    metrics: Metrics,
    windows: Arc<WindowDir>,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let state = AppState {
        metrics,
        windows,
        health,
        renders: Arc::new(Semaphore::new(MAX_RENDERS)),
    };
    let app = Router::new()
        .route("/", get(index))
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(healthz))
        .route("/windows/{name}", get(raw_window))
        .route("/flamegraph/{file}", get(flame_graph))
        .fallback(|| async { RouteError::NotFound })
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Why a request failed; each maps to one status code.
#[derive(Debug, thiserror::Error)]
enum RouteError {
    #[error("not found")]
    NotFound,
    #[error("busy rendering other flame graphs, retry shortly")]
    Busy,
    #[error("cannot read window: {0}")]
    Read(FilesError),
    #[error("cannot decode window: {0}")]
    Render(#[from] FlameGraphError),
    #[error("internal task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl From<FilesError> for RouteError {
    fn from(e: FilesError) -> Self {
        match e {
            // A bad name, a pruned window and a non-window all look alike
            // from outside: there is no such window.
            FilesError::InvalidName(_) | FilesError::NotFound(_) | FilesError::NotAWindow(_) => {
                Self::NotFound
            }
            other => Self::Read(other),
        }
    }
}

impl IntoResponse for RouteError {
    fn into_response(self) -> Response {
        let status = match self {
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::Busy => StatusCode::SERVICE_UNAVAILABLE,
            Self::Read(_) | Self::Render(_) | Self::Task(_) => {
                tracing::warn!(error = %self, "http request failed");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        // The full error goes to the log; the client gets a short line.
        let body = match self {
            Self::NotFound | Self::Busy => format!("{self}\n"),
            Self::Read(_) => "cannot read window\n".to_string(),
            Self::Render(_) => "cannot decode or render window\n".to_string(),
            Self::Task(_) => "internal error\n".to_string(),
        };
        (status, body).into_response()
    }
}

async fn metrics_text(State(state): State<AppState>) -> Response {
    (
        [(CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
        state.metrics.encode(),
    )
        .into_response()
}

async fn healthz(State(state): State<AppState>) -> Response {
    // A window must close in time, the window directory reports its own faults (full,
    // read-only) until a write succeeds, and no stage may be stuck (metrics::progress).
    let verdict = (state.health.check().map_err(|e| e.to_string()))
        .and_then(|()| state.windows.health().map_err(|e| e.to_string()))
        .and_then(|()| state.metrics.progress.check());
    match verdict {
        Ok(()) => (
            StatusCode::OK,
            "ok
",
        )
            .into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{why}
"
            ),
        )
            .into_response(),
    }
}

async fn index(State(state): State<AppState>) -> Result<Html<String>, RouteError> {
    let windows = state.windows.clone();
    let files = tokio::task::spawn_blocking(move || windows.list()).await?;
    let mut rows = String::new();
    for file in files.iter().take(MAX_LISTED) {
        let name = xml_escape(&file.name);
        rows.push_str(&format!(
            "<tr><td>{name}</td><td>{size}</td>\
             <td><a href=\"flamegraph/{name}.svg\">flame graph</a></td>\
             <td><a href=\"windows/{name}\">pprof</a></td></tr>\n",
            size = xml_escape(&human_bytes(file.bytes)),
        ));
    }
    let shown = files.len().min(MAX_LISTED);
    Ok(Html(format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>ember</title></head><body>\n\
         <h1>ember</h1>\n<p>{shown} of {total} windows, newest first. \
         <a href=\"metrics\">metrics</a> · <a href=\"healthz\">health</a></p>\n\
         <table>\n<tr><th>window</th><th>size</th><th></th><th></th></tr>\n{rows}</table>\n\
         </body></html>\n",
        total = files.len(),
    )))
}

async fn raw_window(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, RouteError> {
    let windows = state.windows.clone();
    let bytes = tokio::task::spawn_blocking(move || windows.read(&name)).await??;
    Ok(([(CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

async fn flame_graph(
    State(state): State<AppState>,
    Path(file): Path<String>,
) -> Result<Response, RouteError> {
    let name = file
        .strip_suffix(".svg")
        .filter(|n| crate::export::files::is_window_name(n))
        .ok_or(RouteError::NotFound)?
        .to_string();
    let permit = state
        .renders
        .clone()
        .try_acquire_owned()
        .map_err(|_| RouteError::Busy)?;
    let windows = state.windows.clone();
    let svg = tokio::task::spawn_blocking(move || -> Result<Vec<u8>, RouteError> {
        let _permit = permit;
        let profile = flamegraph::decode_gz(&windows.read(&name)?)?;
        Ok(flamegraph::svg(&profile, &format!("ember CPU {name}"))?)
    })
    .await??;
    Ok(([(CONTENT_TYPE, "image/svg+xml")], svg).into_response())
}

/// `bytes` for people: `512 B`, `12.3 KiB`, `4.0 MiB`.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Function, Line, Location, Profile, Sample};
    use prost::Message;
    use std::io::{Read, Write};
    use std::time::UNIX_EPOCH;

    type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

    /// One sample in `hot_function` called from `main`, gzip'ed.
    fn profile_gz() -> std::io::Result<Vec<u8>> {
        let profile = Profile {
            string_table: vec!["".into(), "main".into(), "hot_function".into()],
            function: vec![
                Function {
                    id: 1,
                    name: 1,
                    ..Default::default()
                },
                Function {
                    id: 2,
                    name: 2,
                    ..Default::default()
                },
            ],
            location: (1..=2)
                .map(|id| Location {
                    id,
                    line: vec![Line {
                        function_id: id,
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect(),
            sample: vec![Sample {
                location_id: vec![2, 1],
                value: vec![7, 70_000_000],
                label: vec![],
            }],
            ..Default::default()
        };
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&profile.encode_to_vec())?;
        gz.finish()
    }

    struct Reply {
        status: u16,
        content_type: String,
        body: Vec<u8>,
    }

    /// A bare HTTP/1.0 GET over a real socket; the server closes the
    /// connection after the response, so read to the end.
    async fn get(
        addr: SocketAddr,
        path: &str,
    ) -> Result<Reply, Box<dyn std::error::Error + Send + Sync>> {
        let request = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
        let raw = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
            let mut stream = std::net::TcpStream::connect(addr)?;
            stream.set_read_timeout(Some(Duration::from_secs(10)))?;
            stream.write_all(request.as_bytes())?;
            let mut raw = Vec::new();
            stream.read_to_end(&mut raw)?;
            Ok(raw)
        })
        .await??;
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or("no end of headers")?;
        let head = String::from_utf8_lossy(&raw[..split]).to_string();
        let status = head.split_whitespace().nth(1).ok_or("no status")?.parse()?;
        let content_type = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-type")
                    .then(|| v.trim().to_string())
            })
            .unwrap_or_default();
        Ok(Reply {
            status,
            content_type,
            body: raw[split + 4..].to_vec(),
        })
    }

    #[tokio::test]
    async fn routes_over_tcp() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let windows = Arc::new(WindowDir::open(tmp.path(), 10, u64::MAX)?);
        let gz = profile_gz()?;
        let start = UNIX_EPOCH + Duration::from_secs(1_795_317_300);
        let name = windows
            .write(start, &gz)?
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or("no file name")?
            .to_string();
        // A window that is not a profile, to see the 500.
        let bad = windows
            .write(start + Duration::from_secs(1), b"garbage")?
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or("no file name")?
            .to_string();
        std::fs::write(tmp.path().join("secret.txt"), b"secret")?;

        let listener = bind("127.0.0.1:0".parse()?).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listener,
            Metrics::new(),
            windows,
            Health::new(Duration::from_secs(10)),
            async {
                let _ = stopped.await;
            },
        ));

        let r = get(addr, "/metrics").await?;
        assert_eq!(r.status, 200);
        assert_eq!(r.content_type, OPENMETRICS_CONTENT_TYPE);
        assert!(String::from_utf8_lossy(&r.body).contains("# EOF"));

        let r = get(addr, "/healthz").await?;
        assert_eq!((r.status, r.body.as_slice()), (200, &b"ok\n"[..]));

        let r = get(addr, "/").await?;
        assert_eq!(r.status, 200);
        assert!(r.content_type.starts_with("text/html"));
        let html = String::from_utf8_lossy(&r.body);
        assert!(html.contains(&format!("flamegraph/{name}.svg")));
        assert!(html.contains(&format!("windows/{name}")));
        // Latest first.
        assert!(html.find(bad.as_str()) < html.find(name.as_str()));

        let r = get(addr, &format!("/windows/{name}")).await?;
        assert_eq!(r.status, 200);
        assert_eq!(r.content_type, "application/octet-stream");
        assert_eq!(r.body, gz);

        let r = get(addr, &format!("/flamegraph/{name}.svg")).await?;
        assert_eq!(r.status, 200);
        assert_eq!(r.content_type, "image/svg+xml");
        assert!(String::from_utf8_lossy(&r.body).contains("hot_function"));

        let r = get(addr, &format!("/flamegraph/{bad}.svg")).await?;
        assert_eq!(r.status, 500);

        for path in [
            "/windows/../secret.txt",
            "/windows/..%2Fsecret.txt",
            "/windows/secret.txt",
            "/flamegraph/..%2Fsecret.txt.svg",
            &format!("/flamegraph/{name}"),
            "/windows/20261122T031559.000Z.pb.gz",
            "/nope",
        ] {
            let r = get(addr, path).await?;
            assert_eq!(r.status, 404, "{path}");
            assert!(!String::from_utf8_lossy(&r.body).contains("secret"));
        }

        let _ = stop.send(());
        server.await??;
        Ok(())
    }

    #[test]
    fn health_expires_after_three_windows_and_grace() {
        let health = Health::new(Duration::from_secs(10));
        let start = health.started;
        assert!(health.check_at(start + Duration::from_secs(60)).is_ok());
        let late = health.check_at(start + Duration::from_secs(61));
        assert!(late.is_err_and(|why| why.to_string().contains("limit 60 s")));
        health.beat();
        assert!(health.check().is_ok());
    }

    #[test]
    fn sizes_for_people() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(12_595), "12.3 KiB");
        assert_eq!(human_bytes(4 * 1024 * 1024), "4.0 MiB");
    }
}
