//! The agent's HTTP server: up to three listeners with different audiences.
//!
//! - `server.health_listen` (optional, e.g. the pod address): `GET /healthz` (liveness)
//!   and `GET /readyz` (readiness) only, for the kubelet. Its connections are its own,
//!   so no flood of the other listeners can starve the probes (and the manifests'
//!   NetworkPolicy admits no pod to it).
//! - `server.metrics_listen` (optional, e.g. the pod address): `GET /metrics`
//!   (OpenMetrics), `/healthz` and `/readyz` only, for Prometheus.
//! - `server.listen` (127.0.0.1 by default): the same, plus what names every
//!   process, pod and function on the host: the explorer page (`/`, `/use`, assets
//!   under `/ui/`), the profiles API (`/api/*`, [`api`]), single windows
//!   (`/windows/<name>`, `/flamegraph/<name>.svg`). With `server.token_file` set, the
//!   API and windows require `Authorization: Bearer <token>` ([`auth`]); the page and
//!   its assets hold no data and load without it. Without a token, only requests whose
//!   `Host` is this listener's ([`host`]) are served: a page of another site that a DNS
//!   rebinding points at 127.0.0.1 gets 421.
//!
//! Every connection and request lives under the limits of [`limits`]: a connection
//! cap that evicts the connection cheapest to lose, header-read and idle timeouts, a
//! cap on heavy requests in flight held by the work itself, a request timeout checked
//! inside the work's loops, cancellation when the client leaves, and size caps on
//! files, merges, flame graphs and responses.

pub(crate) mod api;
mod auth;
mod flame;
mod health;
mod host;
pub(crate) mod limits;
pub(crate) mod merge;
mod ui;
mod use_api;
mod windows;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use auth::{LocalToken, LOCAL_TOKEN_FILE};
pub use health::Health;
pub(crate) use health::HEALTH_GRACE;

use crate::config;
use crate::encode::flamegraph::FlameGraphError;
use crate::export::files::{FilesError, WindowDir};
use crate::metrics::{Metrics, OPENMETRICS_CONTENT_TYPE};

/// The bound listeners, before BPF is loaded (so a taken port fails fast).
#[derive(Debug)]
pub struct Listeners {
    profiles: TcpListener,
    metrics: Option<TcpListener>,
    health: Option<TcpListener>,
}

impl Listeners {
    /// The profiles listener's address.
    pub fn profiles_addr(&self) -> io::Result<SocketAddr> {
        self.profiles.local_addr()
    }

    /// The metrics listener's address, if there is one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The health listener's address, if there is one.
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.health.as_ref().and_then(|l| l.local_addr().ok())
    }
}

/// Binds `server.listen` and, if set, `server.metrics_listen` and `server.health_listen`;
/// on failure, the address that could not be bound and why.
pub async fn bind(cfg: &config::Server) -> Result<Listeners, (SocketAddr, io::Error)> {
    let profiles = TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| (cfg.listen, e))?;
    let metrics = match cfg.metrics_listen {
        Some(addr) => Some(TcpListener::bind(addr).await.map_err(|e| (addr, e))?),
        None => None,
    };
    let health = match cfg.health_listen {
        Some(addr) => Some(TcpListener::bind(addr).await.map_err(|e| (addr, e))?),
        None => None,
    };
    Ok(Listeners {
        profiles,
        metrics,
        health,
    })
}

/// Says where the profiles listener serves and how to get in; without
/// `server.token_file` (and unless `server.local_auth` is off) makes the local token in
/// `data_dir`. The login address (with the token) is printed only to a terminal: a log
/// collected from a service or a pod must not carry it; elsewhere the log names the file.
pub fn announce(
    listeners: &Listeners,
    cfg: &config::Server,
    data_dir: &std::path::Path,
) -> io::Result<Option<LocalToken>> {
    use std::io::IsTerminal;
    let addr = listeners.profiles_addr()?;
    let what = "the profile explorer, its API, /metrics and /healthz";
    if !cfg.token_file.as_os_str().is_empty() {
        tracing::info!(
            "serving {what} on http://{addr}/ (bearer token of server.token_file required)"
        );
        return Ok(None);
    }
    if !cfg.local_auth {
        tracing::warn!("serving {what} on http://{addr}/ without a token (server.local_auth: false): every local user can read every profile");
        return Ok(None);
    }
    let token = LocalToken::create(data_dir)?;
    if io::stderr().is_terminal() {
        tracing::info!(
            "serving {what}: open {} (token also in {}, readable by its owner only)",
            token.login_url(addr),
            token.path().display()
        );
    } else {
        tracing::info!(
            "serving {what} on http://{addr}/; the token (bearer header, or /?token=<token> once in a browser) is in {}, readable by its owner only",
            token.path().display()
        );
    }
    Ok(Some(token))
}

/// Connections the health listener keeps open at once: the kubelet holds one or two.
const HEALTH_MAX_CONNECTIONS: usize = 64;

/// Serves every listener until `shutdown` completes, then finishes in-flight requests
/// (at most a few seconds) and stops what heavy work is left, and returns.
pub async fn serve(
    listeners: Listeners,
    cfg: config::Server,
    metrics: Metrics,
    windows: Arc<WindowDir>,
    health: Arc<Health>,
    local: Option<LocalToken>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(true);
    });
    let conn = limits::ConnLimits {
        max_connections: cfg.max_connections,
        header_read_timeout: cfg.header_read_timeout,
        idle_timeout: cfg.idle_timeout,
    };
    let heavy = limits::Heavy::new(
        cfg.max_concurrent_requests,
        cfg.request_timeout,
        metrics.clone(),
    );
    let own = listeners.profiles.local_addr()?;
    let profiles = limits::serve(
        listeners.profiles,
        profiles_router(
            &cfg,
            own,
            &metrics,
            (windows, health.clone(), heavy.clone()),
            local.as_ref(),
        ),
        conn,
        metrics.clone(),
        stopped.clone(),
    );
    let open = async {
        match listeners.metrics {
            Some(listener) => {
                limits::serve(
                    listener,
                    open_router(&metrics, health.clone()),
                    conn,
                    metrics.clone(),
                    stopped.clone(),
                )
                .await
            }
            None => Ok(()),
        }
    };
    let probes = async {
        match listeners.health {
            Some(listener) => {
                let conn = limits::ConnLimits {
                    max_connections: HEALTH_MAX_CONNECTIONS,
                    ..conn
                };
                limits::serve(
                    listener,
                    health_router(health.clone()),
                    conn,
                    metrics.clone(),
                    stopped.clone(),
                )
                .await
            }
            None => Ok(()),
        }
    };
    let (a, b, c) = tokio::join!(profiles, open, probes);
    // Past the drain: whatever heavy work is left stops now, so shutdown never waits
    // on a request (each stops at its next check).
    heavy.stop_all();
    a.and(b).and(c)
}

/// `/healthz` and `/readyz`: what the health listener serves.
fn health_router(health: Arc<Health>) -> Router {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .with_state(health)
        .fallback(|| async { RouteError::NotFound })
}

/// `/metrics`, `/healthz` and `/readyz`: what any listener but the health one serves
/// without a token.
fn open_router(metrics: &Metrics, health: Arc<Health>) -> Router {
    let m = metrics.clone();
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = m.clone();
                async move { ([(CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], m.encode()).into_response() }
            }),
        )
        .merge(health_router(health))
}

/// Everything the profiles listener serves; `own` is its bound address, `local` the
/// token made at start when `server.token_file` is unset.
fn profiles_router(
    cfg: &config::Server,
    own: SocketAddr,
    metrics: &Metrics,
    (windows, health, heavy): (Arc<WindowDir>, Arc<Health>, limits::Heavy),
    local: Option<&LocalToken>,
) -> Router {
    let limits = limits::RequestLimits {
        timeout: cfg.request_timeout,
        metrics: metrics.clone(),
    };
    let api = api::Api {
        windows: windows.clone(),
        metrics: metrics.clone(),
        heavy: heavy.clone(),
        max_file_bytes: cfg.max_file_bytes,
        max_merge_samples: cfg.max_merge_samples,
        max_flame_nodes: cfg.max_flame_nodes,
        max_response_bytes: cfg.max_response_bytes,
    };
    let single = windows::Windows {
        dir: windows,
        heavy,
        max_file_bytes: cfg.max_file_bytes,
        max_response_bytes: cfg.max_response_bytes,
        metrics: metrics.clone(),
    };
    let heavy = Router::new()
        .route("/api/profile", get(api::profile))
        .route("/api/flamegraph", get(api::flamegraph))
        .route("/api/labels", get(api::labels))
        .with_state(api.clone())
        .merge(
            Router::new()
                .route("/windows/{name}", get(windows::raw))
                .route("/flamegraph/{file}", get(windows::svg))
                .with_state(single),
        );
    let light = Router::new()
        .route("/api/windows", get(api::windows))
        .with_state(api)
        .merge(
            Router::new()
                .route("/api/use", get(use_api::readings))
                .with_state(use_api::UseState::new(metrics.readings.clone())),
        );
    let configured = !cfg.token_file.as_os_str().is_empty();
    let token = if configured {
        Some(Arc::new(auth::Token::File(auth::TokenFile::new(
            &cfg.token_file,
        ))))
    } else {
        local.map(|t| Arc::new(auth::Token::local(t)))
    };
    let auth = auth::Auth {
        token,
        metrics: metrics.clone(),
    };
    let protected = heavy
        .merge(light)
        .layer(from_fn_with_state(limits, limits::in_time))
        .layer(from_fn_with_state(auth.clone(), auth::require_token));
    let pages = Router::new()
        .route("/", get(ui::index))
        .route("/use", get(ui::use_page))
        .layer(from_fn_with_state(auth, auth::login));
    let router = Router::new()
        .merge(pages)
        .route("/ui/{*path}", get(ui::asset))
        .merge(protected)
        .merge(open_router(metrics, health));
    match configured {
        // A configured token is what a rebinding page cannot send: no Host check
        // needed. (A local token's cookie is SameSite and bound to the loopback
        // name, but the Host check stays: it costs nothing.)
        true => router,
        false => router.layer(from_fn_with_state(
            host::Hosts::new(own, &cfg.allowed_hosts, metrics.clone()),
            host::require_own_host,
        )),
    }
}

/// Why a request for a single window or an asset failed; each maps to one status code.
#[derive(Debug, thiserror::Error)]
enum RouteError {
    #[error("not found")]
    NotFound,
    #[error("window file is larger than server.max_file_bytes")]
    TooLarge,
    #[error("the response would be larger than server.max_response_bytes")]
    ResponseTooLarge,
    #[error("cannot read window: {0}")]
    Read(FilesError),
    #[error("cannot decode window: {0}")]
    Render(#[from] FlameGraphError),
    #[error("{0}")]
    Stopped(#[from] limits::Stopped),
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
            Self::Stopped(s) => return s.into_response(),
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::TooLarge | Self::ResponseTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Read(_) | Self::Render(_) => {
                tracing::warn!(error = %self, "http request failed");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        // The full error goes to the log; the client gets a short line.
        let body = match self {
            Self::NotFound | Self::TooLarge | Self::ResponseTooLarge => format!("{self}\n"),
            Self::Read(_) => "cannot read window\n".to_string(),
            Self::Render(_) => "cannot decode or render window\n".to_string(),
            Self::Stopped(_) => "stopped\n".to_string(),
        };
        (status, body).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Function, Line, Location, Profile, Sample};
    use prost::Message;
    use std::io::{Read, Write};
    use std::time::{Duration, UNIX_EPOCH};

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

        let cfg = config::Server {
            listen: "127.0.0.1:0".parse()?,
            ..Default::default()
        };
        let listeners = bind(&cfg).await.map_err(|(_, e)| e)?;
        let addr = listeners.profiles_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listeners,
            cfg,
            Metrics::new(),
            windows,
            Health::new(Duration::from_secs(10)),
            None,
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
        assert!(String::from_utf8_lossy(&r.body).contains("ui/vendor/d3-flamegraph-5.0.0.min.js"));
        for asset in [
            "app.js",
            "use.js",
            "vendor/d3-7.9.0.min.js",
            "vendor/LICENSE-d3",
        ] {
            let r = get(addr, &format!("/ui/{asset}")).await?;
            assert_eq!(r.status, 200, "{asset}");
        }

        let r = get(addr, "/api/windows").await?;
        assert_eq!(r.status, 200);
        let listed = String::from_utf8_lossy(&r.body).to_string();
        // Oldest first.
        assert!(
            listed.find(name.as_str()) < listed.find(bad.as_str()),
            "{listed}"
        );

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

    /// A raw GET with extra header lines.
    async fn get_with(
        addr: SocketAddr,
        path: &str,
        headers: &str,
    ) -> Result<u16, Box<dyn std::error::Error + Send + Sync>> {
        let request = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n{headers}\r\n");
        let raw = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
            let mut stream = std::net::TcpStream::connect(addr)?;
            stream.set_read_timeout(Some(Duration::from_secs(10)))?;
            stream.write_all(request.as_bytes())?;
            let mut raw = Vec::new();
            stream.read_to_end(&mut raw)?;
            Ok(raw)
        })
        .await??;
        let head = String::from_utf8_lossy(&raw);
        Ok(head.split_whitespace().nth(1).ok_or("no status")?.parse()?)
    }

    #[tokio::test]
    async fn token_guards_profiles_and_metrics_listener_serves_only_metrics() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let windows = Arc::new(WindowDir::open(&tmp.path().join("w"), 10, u64::MAX)?);
        let token = tmp.path().join("token");
        std::fs::write(&token, "tok-1\n")?;
        let cfg = config::Server {
            listen: "127.0.0.1:0".parse()?,
            metrics_listen: Some("127.0.0.1:0".parse()?),
            token_file: token.clone(),
            ..Default::default()
        };
        let listeners = bind(&cfg).await.map_err(|(_, e)| e)?;
        let addr = listeners.profiles_addr()?;
        let maddr = listeners.metrics_addr().ok_or("no metrics listener")?;
        let metrics = Metrics::new();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listeners,
            cfg,
            metrics.clone(),
            windows,
            Health::new(Duration::from_secs(10)),
            None,
            async {
                let _ = stopped.await;
            },
        ));
        // The metrics listener: /metrics and /healthz, nothing that names a workload.
        assert_eq!(get_with(maddr, "/metrics", "").await?, 200);
        assert_eq!(get_with(maddr, "/healthz", "").await?, 200);
        for path in ["/", "/api/windows", "/api/profile", "/use", "/ui/app.js"] {
            assert_eq!(get_with(maddr, path, "").await?, 404, "{path}");
        }
        // The profiles listener: data needs the token, the page does not.
        assert_eq!(get_with(addr, "/api/windows", "").await?, 401);
        assert_eq!(
            get_with(addr, "/api/windows", "Authorization: Bearer nope\r\n").await?,
            401
        );
        assert_eq!(
            get_with(addr, "/api/windows", "Authorization: Bearer tok-1\r\n").await?,
            200
        );
        assert_eq!(get_with(addr, "/api/profile", "").await?, 401);
        assert_eq!(get_with(addr, "/", "").await?, 200);
        assert_eq!(get_with(addr, "/metrics", "").await?, 200);
        // Rotation: the new token works at once, the old one no longer.
        let next = tmp.path().join("token.new");
        std::fs::write(&next, "tok-2")?;
        std::fs::rename(&next, &token)?;
        assert_eq!(
            get_with(addr, "/api/profile", "Authorization: Bearer tok-2\r\n").await?,
            200
        );
        assert_eq!(
            get_with(addr, "/api/windows", "Authorization: Bearer tok-1\r\n").await?,
            401
        );
        let text = metrics.encode();
        assert!(
            text.contains("ember_http_refused_total{reason=\"unauthorized\"} 4"),
            "{text}"
        );
        let _ = stop.send(());
        server.await??;
        Ok(())
    }

    #[tokio::test]
    async fn merge_cap_and_idle_timeout() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let windows = Arc::new(WindowDir::open(tmp.path(), 10, u64::MAX)?);
        let now = std::time::SystemTime::now();
        windows.write(now - Duration::from_secs(20), &profile_gz()?)?;
        let cfg = config::Server {
            listen: "127.0.0.1:0".parse()?,
            idle_timeout: Duration::from_millis(300),
            max_merge_samples: 1,
            ..Default::default()
        };
        let listeners = bind(&cfg).await.map_err(|(_, e)| e)?;
        let addr = listeners.profiles_addr()?;
        let metrics = Metrics::new();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listeners,
            cfg,
            metrics.clone(),
            windows.clone(),
            Health::new(Duration::from_secs(10)),
            None,
            async {
                let _ = stopped.await;
            },
        ));
        // One distinct sample fits; a second window with another stack does not.
        assert_eq!(get_with(addr, "/api/profile?from=now-1m", "").await?, 200);
        let mut other = crate::encode::flamegraph::decode_gz(&profile_gz()?)?;
        other.sample[0].location_id = vec![1];
        let gz = crate::encode::pprof::to_gzip(&other)?;
        windows.write(now - Duration::from_secs(10), &gz)?;
        let r = get(addr, "/api/profile?from=now-1m").await?;
        assert_eq!(r.status, 413);
        assert!(String::from_utf8_lossy(&r.body).contains("server.max_merge_samples"));
        // A silent connection is closed after the idle timeout.
        let closed = tokio::task::spawn_blocking(move || -> std::io::Result<bool> {
            let mut s = std::net::TcpStream::connect(addr)?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            let mut b = [0u8; 1];
            Ok(matches!(s.read(&mut b), Ok(0)))
        })
        .await??;
        assert!(closed);
        let text = metrics.encode();
        assert!(
            text.contains("ember_http_refused_total{reason=\"too_large\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("ember_http_refused_total{reason=\"idle\"} 1"),
            "{text}"
        );
        let _ = stop.send(());
        server.await??;
        Ok(())
    }

    /// A window with `n` distinct 4-frame stacks over random-looking function names.
    fn wide_profile_gz(n: u64) -> std::io::Result<Vec<u8>> {
        let mut string_table = vec!["".to_string(), "samples".into(), "count".into()];
        let mut function = Vec::new();
        for i in 0..n * 4 {
            string_table.push(format!("f_{:016x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
            function.push(Function {
                id: i + 1,
                name: i as i64 + 3,
                ..Default::default()
            });
        }
        let location = (1..=n * 4)
            .map(|id| Location {
                id,
                line: vec![Line {
                    function_id: id,
                    ..Default::default()
                }],
                ..Default::default()
            })
            .collect();
        let sample = (0..n)
            .map(|i| Sample {
                location_id: (1..=4).map(|d| i * 4 + d).collect(),
                value: vec![1],
                label: vec![],
            })
            .collect();
        let profile = Profile {
            sample_type: vec![crate::proto::ValueType { r#type: 1, unit: 2 }],
            string_table,
            function,
            location,
            sample,
            ..Default::default()
        };
        crate::encode::pprof::to_gzip(&profile)
    }

    /// A raw GET with a `Host` of the caller's choice; the status.
    async fn get_host(
        addr: SocketAddr,
        path: &str,
        host: &str,
    ) -> Result<u16, Box<dyn std::error::Error + Send + Sync>> {
        let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let raw = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
            let mut stream = std::net::TcpStream::connect(addr)?;
            stream.set_read_timeout(Some(Duration::from_secs(10)))?;
            stream.write_all(request.as_bytes())?;
            let mut raw = Vec::new();
            stream.read_to_end(&mut raw)?;
            Ok(raw)
        })
        .await??;
        let head = String::from_utf8_lossy(&raw);
        Ok(head.split_whitespace().nth(1).ok_or("no status")?.parse()?)
    }

    /// Issue 25: `?from=1e30` is a 400 (it panicked the handler), a foreign `Host` is a
    /// 421 without a token, a flame graph past `server.max_flame_nodes` and a response
    /// past `server.max_response_bytes` are 413s; each counted.
    #[tokio::test]
    async fn numbers_hosts_nodes_and_bytes_are_refused_cleanly() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let windows = Arc::new(WindowDir::open(tmp.path(), 10, u64::MAX)?);
        let now = std::time::SystemTime::now();
        windows.write(now - Duration::from_secs(20), &wide_profile_gz(200)?)?;
        let cfg = config::Server {
            listen: "127.0.0.1:0".parse()?,
            max_flame_nodes: 100,
            max_response_bytes: 4096,
            allowed_hosts: vec!["ember.test".into()],
            ..Default::default()
        };
        let listeners = bind(&cfg).await.map_err(|(_, e)| e)?;
        let addr = listeners.profiles_addr()?;
        let metrics = Metrics::new();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listeners,
            cfg,
            metrics.clone(),
            windows,
            Health::new(Duration::from_secs(10)),
            None,
            async {
                let _ = stopped.await;
            },
        ));
        let own = addr.to_string();
        for from in ["1e30", "-1", "NaN", "1e19"] {
            let r = get(addr, &format!("/api/profile?from={from}")).await?;
            assert_eq!(r.status, 400, "from={from}");
            assert!(
                String::from_utf8_lossy(&r.body).contains("bad parameter from"),
                "{from}"
            );
        }
        // 200 stacks of 4 frames: 801 nodes.
        let r = get(addr, "/api/flamegraph?from=now-1m").await?;
        assert_eq!(r.status, 413);
        assert!(String::from_utf8_lossy(&r.body).contains("server.max_flame_nodes"));
        // 800 random names do not gzip into 4 KiB.
        let r = get(addr, "/api/profile?from=now-1m").await?;
        assert_eq!(r.status, 413);
        assert!(String::from_utf8_lossy(&r.body).contains("server.max_response_bytes"));
        // Hosts: the listener's, loopback names (any port: port-forwards), configured ones.
        for host in [own.as_str(), "localhost:8080", "[::1]", "ember.test:443"] {
            assert_eq!(get_host(addr, "/api/windows", host).await?, 200, "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:9464",
            "127.0.0.1.evil.example",
        ] {
            assert_eq!(get_host(addr, "/api/windows", host).await?, 421, "{host}");
            assert_eq!(get_host(addr, "/", host).await?, 421, "{host}");
        }
        let text = metrics.encode();
        assert!(
            text.contains("ember_http_refused_total{reason=\"host\"} 6"),
            "{text}"
        );
        assert!(
            text.contains("ember_http_refused_total{reason=\"too_large\"} 2"),
            "{text}"
        );
        let _ = stop.send(());
        server.await??;
        Ok(())
    }
}
