//! The listener loop and the limits every connection and request lives under.
//!
//! - a connection cap: past `max_connections` open connections a new one is closed at
//!   accept (counted), so idle sockets cannot exhaust file descriptors or memory;
//! - a header-read timeout (hyper's) and an idle timeout (here): a connection that moves
//!   no byte and has no request in flight for `idle_timeout` is closed (counted);
//! - per request: at most `max_concurrent_requests` heavy requests (reading, merging or
//!   rendering windows) at once, more get 503 at once (counted), and every request on the
//!   profiles listener gets `request_timeout` (503, counted).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::header::RETRY_AFTER;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tower::ServiceExt;

use crate::metrics::{HttpRefusal, Metrics};

/// How a listener treats its connections.
#[derive(Clone, Copy, Debug)]
pub(super) struct ConnLimits {
    pub(super) max_connections: usize,
    pub(super) header_read_timeout: Duration,
    pub(super) idle_timeout: Duration,
}

/// How long shutdown waits for open connections to finish their requests.
const DRAIN: Duration = Duration::from_secs(5);

/// Accepts on `listener` and serves `router` until `shutdown` turns true, then lets
/// in-flight requests finish (at most [`DRAIN`]).
pub(super) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    metrics: Metrics,
    mut shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    let conns = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and friends: back off rather than spin.
                tracing::warn!(error = %e, "http accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = conns.clone().try_acquire_owned() else {
            metrics.http_refused(HttpRefusal::ConnectionCap);
            drop(stream);
            continue;
        };
        let (router, metrics, shutdown) = (router.clone(), metrics.clone(), shutdown.clone());
        tokio::spawn(async move {
            connection(stream, router, limits, metrics, shutdown).await;
            drop(permit);
        });
    }
    drop(listener);
    // Every permit back = every connection closed.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(DRAIN, conns.acquire_many(all)).await;
    Ok(())
}

/// Serves one connection until the client closes it, it idles out or shutdown.
async fn connection(
    stream: TcpStream,
    router: Router,
    limits: ConnLimits,
    metrics: Metrics,
    mut shutdown: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: activity.clone(),
    });
    let busy = activity.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let router = router.clone();
        let guard = InFlight::enter(busy.clone());
        async move {
            let response = router.oneshot(req.map(axum::body::Body::new)).await;
            drop(guard);
            response
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(64 * 1024);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let tick = (limits.idle_timeout / 4).max(Duration::from_millis(25));
    let mut draining = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = shutdown.wait_for(|stop| *stop), if !draining => {
                conn.as_mut().graceful_shutdown();
                draining = true;
            }
            _ = tokio::time::sleep(tick) => {
                if activity.idle_for() >= limits.idle_timeout {
                    metrics.http_refused(HttpRefusal::Idle);
                    return;
                }
            }
        }
    }
}

/// When a connection last moved a byte, and how many of its requests are in flight.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Zero while a request is in flight, else the time since the last byte.
    fn idle_for(&self) -> Duration {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return Duration::ZERO;
        }
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }
}

/// Marks a request in flight until dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn enter(activity: Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// A stream that records each read or write that moved bytes.
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What the request middlewares need.
#[derive(Clone)]
pub(super) struct RequestLimits {
    /// Heavy requests in flight.
    pub(super) heavy: Arc<Semaphore>,
    pub(super) timeout: Duration,
    pub(super) metrics: Metrics,
}

/// Middleware for heavy routes: a slot or 503 at once.
pub(super) async fn one_of_few(
    State(limits): State<RequestLimits>,
    req: Request,
    next: Next,
) -> Response {
    let Ok(_permit) = limits.heavy.clone().try_acquire_owned() else {
        limits.metrics.http_refused(HttpRefusal::Busy);
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(RETRY_AFTER, "1")],
            "busy with other profile requests (server.max_concurrent_requests), retry shortly\n",
        )
            .into_response();
    };
    next.run(req).await
}

/// Middleware: the response within `request_timeout`, or 503.
pub(super) async fn in_time(
    State(limits): State<RequestLimits>,
    req: Request,
    next: Next,
) -> Response {
    match tokio::time::timeout(limits.timeout, next.run(req)).await {
        Ok(response) => response,
        Err(_) => {
            limits.metrics.http_refused(HttpRefusal::Timeout);
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "request took longer than server.request_timeout\n",
            )
                .into_response()
        }
    }
}

/// A deadline blocking work checks between steps (a timed-out request's blocking task
/// is not cancelled by dropping its future).
#[derive(Clone, Copy, Debug)]
pub(super) struct Deadline(Instant);

impl Deadline {
    pub(super) fn after(d: Duration) -> Self {
        Self(Instant::now() + d)
    }

    pub(super) fn passed(&self) -> bool {
        Instant::now() >= self.0
    }
}
