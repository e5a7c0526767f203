//! The listener loop and the limits every connection and request lives under.
//!
//! - a connection cap: past `max_connections` open connections, the connection that is
//!   cheapest to lose makes room for the new one ([`Conns::admit`]): first the oldest
//!   that never sent a complete request, then the longest-idle between requests, then
//!   one whose response is still being written; only when every connection has a
//!   request in the works is the new one closed at accept (both counted). So idle or
//!   half-sent sockets cannot hold every slot, whoever opens them;
//! - a header-read timeout (hyper's, counted) and an idle timeout (here): a connection
//!   that moves no byte and has no request in flight for `idle_timeout` is closed
//!   (counted);
//! - per request: at most `max_concurrent_requests` heavy requests (reading, merging or
//!   rendering windows) at once, more get 503 at once (counted), and every request on the
//!   profiles listener gets `request_timeout` (503, counted). The slot belongs to the
//!   blocking work itself ([`Heavy::run`]): it is released when the work ends, not when
//!   the request's future is dropped, and the work polls a [`Work`] that says stop once
//!   the deadline passed, the client left (the future was dropped) or the server stops.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::RETRY_AFTER;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::body::Frame;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, Semaphore};
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
    let conns = Arc::new(Conns::new(limits.max_connections));
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
        let Some(slot) = conns.admit(&metrics) else {
            metrics.http_refused(HttpRefusal::ConnectionCap);
            drop(stream);
            continue;
        };
        let (router, metrics, shutdown) = (router.clone(), metrics.clone(), shutdown.clone());
        tokio::spawn(connection(stream, router, limits, metrics, shutdown, slot));
        // Let the new connection read what it was sent before the next accept: a client
        // whose request is already in the socket is then busy (not evictable) before a
        // burst of accepts behind it reaches the cap.
        tokio::task::yield_now().await;
    }
    drop(listener);
    // Every slot back = every connection closed.
    let _ = tokio::time::timeout(DRAIN, async {
        while !conns.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    Ok(())
}

/// The open connections of one listener, for the cap and for eviction.
struct Conns {
    max: usize,
    inner: Mutex<ConnsInner>,
}

struct ConnsInner {
    next_id: u64,
    open: HashMap<u64, Arc<Activity>>,
}

impl Conns {
    fn new(max: usize) -> Self {
        Self {
            max,
            inner: Mutex::new(ConnsInner {
                next_id: 0,
                open: HashMap::new(),
            }),
        }
    }

    fn is_empty(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .open
            .is_empty()
    }

    /// A slot for a new connection: a free one, or one taken from the connection
    /// cheapest to lose (told to close, counted as `evicted`); `None` when every
    /// connection has a request in the works.
    fn admit(self: &Arc<Self>, metrics: &Metrics) -> Option<Slot> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.open.len() >= self.max {
            // At most max_connections entries, scanned only at the cap.
            let victim = inner
                .open
                .iter()
                .filter_map(|(&id, a)| a.eviction_rank().map(|rank| (rank, id)))
                .min()
                .map(|(_, id)| id)?;
            if let Some(a) = inner.open.remove(&victim) {
                a.evict.notify_one();
                metrics.http_refused(HttpRefusal::Evicted);
            }
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let activity = Arc::new(Activity::new());
        inner.open.insert(id, activity.clone());
        Some(Slot {
            conns: self.clone(),
            id,
            activity,
        })
    }
}

/// A connection's place in [`Conns`]; given back on drop.
struct Slot {
    conns: Arc<Conns>,
    id: u64,
    activity: Arc<Activity>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // A no-op when the connection was evicted (its entry is gone already).
        self.conns
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .open
            .remove(&self.id);
    }
}

/// Serves one connection until the client closes it, it idles out, it is evicted or
/// shutdown.
async fn connection(
    stream: TcpStream,
    router: Router,
    limits: ConnLimits,
    metrics: Metrics,
    mut shutdown: watch::Receiver<bool>,
    slot: Slot,
) {
    let activity = slot.activity.clone();
    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: activity.clone(),
    });
    let busy = activity.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let router = router.clone();
        let handling = InFlight::enter(busy.clone());
        async move {
            let response = router.oneshot(req.map(Body::new)).await;
            // The handler is done; the body is still to be written.
            let writing = Writing::enter(handling.0.clone());
            drop(handling);
            response.map(|r| {
                r.map(|body| {
                    Body::new(Guarded {
                        inner: body,
                        _writing: writing,
                    })
                })
            })
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
            served = conn.as_mut() => {
                // hyper's header-read timeout: a request that never completed.
                if served.is_err_and(|e| e.is_timeout()) {
                    metrics.http_refused(HttpRefusal::HeaderTimeout);
                }
                break;
            }
            // Counted by the admitting side.
            _ = activity.evict.notified() => break,
            _ = shutdown.wait_for(|stop| *stop), if !draining => {
                conn.as_mut().graceful_shutdown();
                draining = true;
            }
            _ = tokio::time::sleep(tick) => {
                if activity.idle_for() >= limits.idle_timeout {
                    metrics.http_refused(HttpRefusal::Idle);
                    break;
                }
            }
        }
    }
    drop(slot);
}

/// When a connection last moved a byte, how many of its requests are being handled or
/// written, and whether it ever sent a complete request.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
    /// Requests whose handler runs.
    in_flight: AtomicUsize,
    /// Responses whose body is being written.
    writing: AtomicUsize,
    /// Complete requests (headers parsed) so far.
    requests: AtomicU64,
    /// Told when the connection must close to make room for a new one.
    evict: Notify,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            writing: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            evict: Notify::new(),
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

    /// How readily this connection gives up its slot at the cap, lowest first; `None`
    /// while a handler runs (its work is bounded by the request limits instead).
    /// 0: never sent a complete request, oldest first (a slowloris or an idle socket);
    /// 1: idle between requests, longest idle first; 2: writing a response, the one
    /// that moved a byte least recently first.
    fn eviction_rank(&self) -> Option<(u8, u64)> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        if self.requests.load(Ordering::Relaxed) == 0 {
            // Accept order: `start` is the accept time; older = smaller key.
            let age = u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX);
            return Some((0, u64::MAX - age));
        }
        let class = if self.writing.load(Ordering::Relaxed) > 0 {
            2
        } else {
            1
        };
        let idle = u64::try_from(self.idle_for().as_micros()).unwrap_or(u64::MAX);
        Some((class, u64::MAX - idle))
    }
}

/// Marks a request's handler running until dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn enter(activity: Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        activity.requests.fetch_add(1, Ordering::Relaxed);
        Self(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// Marks a response body being written until dropped (sent or abandoned).
struct Writing(Arc<Activity>);

impl Writing {
    fn enter(activity: Arc<Activity>) -> Self {
        activity.writing.fetch_add(1, Ordering::Relaxed);
        Self(activity)
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        self.0.writing.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that holds a [`Writing`] mark until it is dropped.
struct Guarded {
    inner: Body,
    _writing: Writing,
}

impl hyper::body::Body for Guarded {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
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
    pub(super) timeout: Duration,
    pub(super) metrics: Metrics,
}

/// Middleware: the response within `request_timeout`, or 503. Dropping the handler's
/// future cancels its blocking work ([`Heavy::run`]).
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

/// Why heavy work did not run or stopped before its end.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// Every heavy slot is taken.
    #[error("busy with other profile requests (server.max_concurrent_requests), retry shortly")]
    Busy,
    /// The work ran past `server.request_timeout`.
    #[error("the request ran past server.request_timeout; narrow the range")]
    Timeout,
    /// The request went away (the client left, the request timed out) or the server
    /// is stopping.
    #[error("the request was cancelled")]
    Cancelled,
    /// The blocking task panicked or could not run.
    #[error("internal error")]
    Task(String),
}

impl IntoResponse for Stopped {
    fn into_response(self) -> Response {
        match self {
            Self::Busy => (
                StatusCode::SERVICE_UNAVAILABLE,
                [(RETRY_AFTER, "1")],
                format!("{self}\n"),
            )
                .into_response(),
            Self::Timeout | Self::Cancelled => {
                (StatusCode::SERVICE_UNAVAILABLE, format!("{self}\n")).into_response()
            }
            Self::Task(why) => {
                tracing::warn!(error = %why, "http request failed");
                (StatusCode::INTERNAL_SERVER_ERROR, "internal error\n").into_response()
            }
        }
    }
}

/// Heavy requests: at most `max_concurrent_requests` pieces of blocking work at once,
/// each under the request's deadline and cancelled when its request goes away.
#[derive(Clone)]
pub(super) struct Heavy {
    slots: Arc<Semaphore>,
    timeout: Duration,
    metrics: Metrics,
    /// Set when the server stops: every piece of work still running stops.
    stopping: Arc<AtomicBool>,
    /// Windows held decoded at once across all heavy work ([`Work::window_turn`]).
    decoded: Arc<Semaphore>,
}

/// Windows held decoded at once across all heavy requests: a busy node's window
/// decodes to ~100-150 MB, so four requests decoding side by side would take the agent
/// far past its memory limit; taking turns per window costs no throughput a 2-core node
/// would have had anyway.
const DECODED_AT_ONCE: usize = 1;

impl Heavy {
    pub(super) fn new(max: usize, timeout: Duration, metrics: Metrics) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max)),
            timeout,
            metrics,
            stopping: Arc::new(AtomicBool::new(false)),
            decoded: Arc::new(Semaphore::new(DECODED_AT_ONCE)),
        }
    }

    /// Tells every piece of work still running to stop (server shutdown).
    pub(super) fn stop_all(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// Runs `work` on the blocking pool: a slot or [`Stopped::Busy`] at once (counted).
    /// The slot moves into the blocking task and is released when the work returns; if
    /// this future is dropped first (the client hung up, `request_timeout`, shutdown),
    /// the work's [`Work::check`] says [`Stopped::Cancelled`] from then on.
    pub(super) async fn run<T, E>(
        &self,
        work: impl FnOnce(&Work) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<Stopped> + Send + 'static,
    {
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            self.metrics.http_refused(HttpRefusal::Busy);
            return Err(Stopped::Busy.into());
        };
        let cancelled = Arc::new(AtomicBool::new(false));
        let _cancel_on_drop = CancelOnDrop(cancelled.clone());
        let w = Work {
            deadline: Instant::now() + self.timeout,
            cancelled,
            stopping: self.stopping.clone(),
            decoded: self.decoded.clone(),
            metrics: self.metrics.clone(),
            ticks: std::cell::Cell::new(0),
            counted: std::cell::Cell::new(false),
        };
        let gauge = self.metrics.http_heavy_running.clone();
        let task = tokio::task::spawn_blocking(move || {
            gauge.inc();
            let out = work(&w);
            // The slot goes back only now that the work has ended (before the gauge
            // drops, so a gauge at 0 means every slot is free).
            drop(permit);
            gauge.dec();
            out
        });
        match task.await {
            Ok(out) => out,
            Err(e) => Err(Stopped::Task(e.to_string()).into()),
        }
    }
}

/// Sets its flag when dropped: the request's future is gone.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What heavy blocking work polls, inside its loops, to know whether to go on.
pub(crate) struct Work {
    deadline: Instant,
    cancelled: Arc<AtomicBool>,
    stopping: Arc<AtomicBool>,
    decoded: Arc<Semaphore>,
    metrics: Metrics,
    ticks: std::cell::Cell<u32>,
    /// The stop was counted (once per request).
    counted: std::cell::Cell<bool>,
}

/// Items between two clock reads in [`Work::tick`].
const TICK_EVERY: u32 = 256;

impl Work {
    /// `Err` once the request was cancelled (counted as `cancelled`), the server is
    /// stopping, or the deadline passed (counted as `timeout`).
    pub(super) fn check(&self) -> Result<(), Stopped> {
        let stop =
            if self.cancelled.load(Ordering::Relaxed) || self.stopping.load(Ordering::Relaxed) {
                Stopped::Cancelled
            } else if Instant::now() >= self.deadline {
                Stopped::Timeout
            } else {
                return Ok(());
            };
        if !self.counted.replace(true) {
            self.metrics.http_refused(match stop {
                Stopped::Timeout => HttpRefusal::Timeout,
                _ => HttpRefusal::Cancelled,
            });
        }
        Err(stop)
    }

    /// [`Work::check`] every [`TICK_EVERY`] calls: cheap enough per sample or frame.
    pub(super) fn tick(&self) -> Result<(), Stopped> {
        let n = self.ticks.get().wrapping_add(1);
        self.ticks.set(n);
        if n % TICK_EVERY == 0 {
            self.check()
        } else {
            Ok(())
        }
    }

    /// Waits (polling [`Work::check`]) for this work's turn to hold a decoded window;
    /// the turn lasts until the returned permit is dropped.
    pub(super) fn window_turn(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Stopped> {
        loop {
            if let Ok(turn) = self.decoded.clone().try_acquire_owned() {
                return Ok(turn);
            }
            self.check()?;
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Work with no deadline to speak of, never cancelled: unit tests, and `ember report`
    /// (a command a person stops with Ctrl-C).
    pub(crate) fn unlimited() -> Self {
        let now = Instant::now();
        Self {
            deadline: now
                .checked_add(Duration::from_secs(100 * 365 * 86_400))
                .unwrap_or(now + Duration::from_secs(3600)),
            cancelled: Arc::new(AtomicBool::new(false)),
            stopping: Arc::new(AtomicBool::new(false)),
            decoded: Arc::new(Semaphore::new(1)),
            metrics: Metrics::new(),
            ticks: std::cell::Cell::new(0),
            counted: std::cell::Cell::new(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ember_http_refused_total{reason}`'s value.
    fn refused(metrics: &Metrics, reason: &str) -> u64 {
        let prefix = format!("ember_http_refused_total{{reason=\"{reason}\"}} ");
        metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
            .unwrap_or(0)
    }

    async fn told_to_close(slot: &Slot) -> bool {
        tokio::time::timeout(Duration::from_secs(5), slot.activity.evict.notified())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn the_cap_evicts_what_is_cheapest_to_lose() -> Result<(), &'static str> {
        let metrics = Metrics::new();
        let conns = Arc::new(Conns::new(3));
        let idle = conns.admit(&metrics).ok_or("slot")?;
        let busy = conns.admit(&metrics).ok_or("slot")?;
        let between = conns.admit(&metrics).ok_or("slot")?;
        // `busy` has a handler running; `between` finished a request and idles;
        // `idle` never sent one.
        let _busy = InFlight::enter(busy.activity.clone());
        drop(InFlight::enter(between.activity.clone()));
        let next = conns.admit(&metrics).ok_or("evicts the idle one")?;
        assert!(told_to_close(&idle).await);
        assert_eq!(refused(&metrics, "evicted"), 1);
        let _next = InFlight::enter(next.activity.clone());
        let last = conns
            .admit(&metrics)
            .ok_or("evicts the one between requests")?;
        assert!(told_to_close(&between).await);
        assert_eq!(refused(&metrics, "evicted"), 2);
        // Every connection has a handler running: a new one is refused.
        let _last = InFlight::enter(last.activity.clone());
        assert!(conns.admit(&metrics).is_none());
        // A connection that ends gives its slot back.
        drop(last);
        assert!(conns.admit(&metrics).is_some());
        Ok(())
    }

    #[tokio::test]
    async fn heavy_work_keeps_its_slot_until_it_stops() -> Result<(), Box<dyn std::error::Error>> {
        let metrics = Metrics::new();
        let heavy = Heavy::new(1, Duration::from_secs(60), metrics.clone());
        let (started_tx, started) = std::sync::mpsc::channel();
        let h = heavy.clone();
        let request = tokio::spawn(async move {
            h.run(move |work| -> Result<(), Stopped> {
                let _ = started_tx.send(());
                loop {
                    work.check()?;
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
            .await
        });
        tokio::task::spawn_blocking(move || started.recv()).await??;
        // While it runs, a second request is refused at once.
        assert_eq!(
            heavy.run(|_| Ok::<_, Stopped>(())).await,
            Err(Stopped::Busy)
        );
        // The client leaves: the request's future is dropped.
        request.abort();
        let _ = request.await;
        // The work notices, stops and gives the slot back.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match heavy.run(|_| Ok::<_, Stopped>(())).await {
                Ok(()) => break,
                Err(Stopped::Busy) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
        assert_eq!(refused(&metrics, "cancelled"), 1);
        assert!(refused(&metrics, "busy") >= 1);
        assert_eq!(metrics.http_heavy_running.get(), 0);
        Ok(())
    }
}
