//! Delivery shared by the network sinks: a bounded queue per sink, filled by the
//! output thread without ever blocking, and one async task per sink that sends its
//! queue in order with timeouts, retries (exponential backoff, full jitter,
//! `Retry-After`) and counted drops.
//!
//! The queue is capped in bytes of encoded requests. When a new request does not
//! fit, the oldest queued ones are dropped first: a backend that comes back gets
//! the freshest windows, and memory stays bounded however long it is away.

use std::collections::hash_map::RandomState;
use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::config::Sinks;
use crate::metrics::{ExportDrop, ExportMetrics, SinkLabel, SinkName};

/// Bytes of a backend's error text logged (one line, control characters escaped).
const MAX_LOGGED_DETAIL: usize = 512;

/// What one attempt to send a request came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Accepted; `bytes` went over the wire.
    Sent {
        /// Bytes sent (the body as compressed).
        bytes: u64,
    },
    /// A transient failure: try again after the backoff, or `after` if the server said so.
    Retry {
        /// What failed, for the log.
        reason: Transient,
        /// The server's `Retry-After`, if any.
        after: Option<Duration>,
    },
    /// A permanent failure: retrying cannot help; the request is dropped.
    Reject {
        /// The drop metric's reason, e.g. `http_400`, `grpc_invalid_argument`.
        reason: ExportDrop,
        /// What the server said, for the log.
        detail: String,
    },
}

/// Why an attempt failed in a way worth retrying. Only logged: a request dropped after
/// retrying counts as `retries_exhausted`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transient {
    /// The attempt took longer than `sinks.timeout`.
    Timeout,
    /// No connection could be made.
    Connect,
    /// The connection failed during the request.
    Io,
    /// The backend answered with a status worth retrying (HTTP 408, 429, 5xx; gRPC
    /// UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED), named as a drop reason would be.
    Status(ExportDrop),
}

impl std::fmt::Display for Transient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transient::Timeout => f.write_str("timeout"),
            Transient::Connect => f.write_str("connect"),
            Transient::Io => f.write_str("io"),
            Transient::Status(s) => s.fmt(f),
        }
    }
}

/// Sends one queued request to a backend.
pub trait Transport: Send + 'static {
    /// The queued request.
    type Item: Send + 'static;
    /// One attempt; the caller applies the timeout.
    fn send(&mut self, item: &Self::Item) -> impl Future<Output = Outcome> + Send + '_;
}

/// Full jitter: a uniform wait in `[0, min(retry_max_backoff, retry_initial_backoff *
/// 2^attempt)]`, but never less than what the server asked for with `Retry-After`. The
/// server's ask is clamped to `retry_max_elapsed` plus a second (a hostile or broken
/// backend may send `Retry-After: 18446744073709551615`): waiting longer than that only
/// ends in `retries_exhausted` anyway.
pub fn backoff(policy: &Sinks, attempt: u32, retry_after: Option<Duration>) -> Duration {
    let ceiling = policy
        .retry_initial_backoff
        .saturating_mul(1u32 << attempt.min(20))
        .min(policy.retry_max_backoff);
    let jittered = ceiling.mul_f64(random_unit());
    let most = policy
        .retry_max_elapsed
        .saturating_add(Duration::from_secs(1));
    retry_after.map_or(jittered, |a| a.min(most).max(jittered))
}

/// A uniform number in [0, 1) from the standard library's per-process random keys
/// (good enough to spread retries; not for secrets).
fn random_unit() -> f64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// 128 random bits, for ids.
pub fn random_u128() -> u128 {
    let a = RandomState::new().build_hasher().finish();
    let mut h = RandomState::new().build_hasher();
    h.write_u64(a);
    (u128::from(a) << 64) | u128::from(h.finish())
}

struct State<T> {
    items: VecDeque<(T, u64)>,
    bytes: u64,
    closed: bool,
    in_flight: bool,
}

/// A sink's bounded queue of encoded requests.
pub struct Queue<T> {
    sink: SinkName,
    cap: u64,
    state: Mutex<State<T>>,
    notify: Notify,
    metrics: ExportMetrics,
}

impl<T> Queue<T> {
    /// An empty queue holding at most `cap` bytes.
    pub fn new(sink: SinkName, cap: u64, metrics: ExportMetrics) -> Self {
        metrics.announce(sink);
        Self {
            sink,
            cap,
            state: Mutex::new(State {
                items: VecDeque::new(),
                bytes: 0,
                closed: false,
                in_flight: false,
            }),
            notify: Notify::new(),
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn gauge(&self, bytes: u64) {
        self.metrics
            .queue_bytes
            .get_or_create(&SinkLabel { sink: self.sink })
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Queues `item` of `size` bytes without blocking, dropping the oldest queued
    /// requests (counted, `queue_full`) until it fits. A request larger than the
    /// whole cap is dropped itself (`too_large`).
    pub fn push(&self, item: T, size: u64) {
        if size > self.cap {
            self.metrics.drop(self.sink, ExportDrop::TooLarge, 1);
            tracing::warn!(
                sink = self.sink.as_str(),
                size,
                cap = self.cap,
                "a request is larger than the whole queue; dropped (raise sinks.queue_bytes)"
            );
            return;
        }
        let mut dropped = 0;
        let bytes = {
            let mut s = self.lock();
            if s.closed {
                drop(s);
                self.metrics.drop(self.sink, ExportDrop::Shutdown, 1);
                return;
            }
            while s.bytes + size > self.cap {
                match s.items.pop_front() {
                    Some((_, n)) => {
                        s.bytes -= n;
                        dropped += 1;
                    }
                    None => break,
                }
            }
            s.items.push_back((item, size));
            s.bytes += size;
            s.bytes
        };
        if dropped > 0 {
            self.metrics.drop(self.sink, ExportDrop::QueueFull, dropped);
        }
        self.gauge(bytes);
        self.notify.notify_one();
    }

    /// The oldest request, waiting for one; `None` once closed and empty.
    pub async fn pop(&self) -> Option<T> {
        loop {
            {
                let mut s = self.lock();
                if let Some((item, n)) = s.items.pop_front() {
                    s.bytes -= n;
                    s.in_flight = true;
                    let bytes = s.bytes;
                    drop(s);
                    self.gauge(bytes);
                    return Some(item);
                }
                if s.closed {
                    return None;
                }
            }
            self.notify.notified().await;
        }
    }

    /// Marks the request from the last [`Queue::pop`] as done (sent or dropped).
    pub fn done(&self) {
        self.lock().in_flight = false;
    }

    /// No more pushes; [`Queue::pop`] returns `None` once the queue is empty.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_one();
    }

    /// Drops what is left (queued and in flight) after the shutdown grace, counted
    /// as `shutdown`; returns how many.
    pub fn abandon(&self) -> u64 {
        let n = {
            let mut s = self.lock();
            let n = s.items.len() as u64 + u64::from(s.in_flight);
            s.items.clear();
            s.bytes = 0;
            s.in_flight = false;
            n
        };
        if n > 0 {
            self.metrics.drop(self.sink, ExportDrop::Shutdown, n);
        }
        self.gauge(0);
        n
    }

    /// Requests and bytes queued now.
    #[cfg(test)]
    pub fn len_bytes(&self) -> (usize, u64) {
        let s = self.lock();
        (s.items.len(), s.bytes)
    }
}

/// Logs a failure once per (sink, reason), then only counts it.
#[derive(Default)]
struct OnceLog(HashSet<String>);

impl OnceLog {
    fn first(&mut self, reason: &str) -> bool {
        // Reasons come from a small fixed vocabulary (status codes, gRPC codes), so this stays small.
        self.0.len() < 256 && self.0.insert(reason.to_owned())
    }
}

/// Sends `queue` in order through `transport` until the queue is closed and empty, with
/// the timeout and retry limits of `policy` (`sinks.timeout`, `sinks.retry_*`).
///
/// A panic while delivering one request (a bug, in ember or a client library) must not
/// end the task silently, leaving the queue to fill and drop while `/healthz` stays
/// green: it is caught, logged, counted as a drop (`internal`), and the task goes on
/// with the next request.
pub async fn run<T: Transport>(queue: Arc<Queue<T::Item>>, mut transport: T, policy: Arc<Sinks>) {
    use futures::FutureExt;
    let sink = queue.sink.as_str();
    let mut logged = OnceLog::default();
    while let Some(item) = queue.pop().await {
        let one = deliver(&queue, &mut transport, &policy, item, &mut logged);
        if let Err(panic) = std::panic::AssertUnwindSafe(one).catch_unwind().await {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(sink, panic = %what, "delivering a request panicked; dropped it, the sink goes on");
            queue.metrics.drop(queue.sink, ExportDrop::Internal, 1);
        }
        queue.done();
    }
}

/// Sends one request, retrying within the policy's limits.
async fn deliver<T: Transport>(
    queue: &Queue<T::Item>,
    transport: &mut T,
    policy: &Sinks,
    item: T::Item,
    logged: &mut OnceLog,
) {
    let sink = queue.sink.as_str();
    let metrics = &queue.metrics;
    let label = SinkLabel { sink: queue.sink };
    {
        let first = Instant::now();
        let mut attempt = 0u32;
        loop {
            let outcome = tokio::time::timeout(policy.timeout, transport.send(&item))
                .await
                .unwrap_or(Outcome::Retry {
                    reason: Transient::Timeout,
                    after: None,
                });
            match outcome {
                Outcome::Sent { bytes } => {
                    metrics.sent.get_or_create(&label).inc();
                    metrics.sent_bytes.get_or_create(&label).inc_by(bytes);
                    metrics
                        .latency
                        .get_or_create(&label)
                        .observe(first.elapsed().as_secs_f64());
                    if attempt > 0 {
                        tracing::info!(sink, attempts = attempt + 1, "delivered after retries");
                    }
                    break;
                }
                Outcome::Reject { reason, detail } => {
                    metrics.drop(queue.sink, reason, 1);
                    if logged.first(&reason.to_string()) {
                        let detail = crate::export::secrets::one_line(&detail, MAX_LOGGED_DETAIL);
                        tracing::warn!(
                            sink,
                            %reason,
                            %detail,
                            "the backend rejected a request; dropped, not retried (logged once per reason)"
                        );
                    }
                    break;
                }
                Outcome::Retry { reason, after } => {
                    let wait = backoff(policy, attempt, after);
                    attempt = attempt.saturating_add(1);
                    let done_by = first.elapsed().checked_add(wait);
                    if done_by.is_none_or(|t| t > policy.retry_max_elapsed) {
                        metrics.drop(queue.sink, ExportDrop::RetriesExhausted, 1);
                        let key = format!("retries_exhausted:{reason}");
                        if logged.first(&key) {
                            tracing::warn!(
                                sink,
                                last_error = %reason,
                                attempts = attempt,
                                "giving up on a request after retrying (logged once per reason)"
                            );
                        }
                        break;
                    }
                    if logged.first(&format!("retry:{reason}")) {
                        tracing::warn!(
                            sink,
                            %reason,
                            "sending failed; retrying with backoff (logged once per reason)"
                        );
                    }
                    tracing::debug!(sink, %reason, ?wait, attempt, "retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    #[test]
    fn oldest_dropped_first_and_counted() {
        let m = Metrics::new();
        let q = Queue::new(SinkName::Pyroscope, 100, m.export.clone());
        for i in 0..5u32 {
            q.push(i, 30);
        }
        // 3 × 30 fit; 0 and 1 were dropped.
        assert_eq!(q.len_bytes(), (3, 90));
        q.push(9, 101);
        let text = m.encode();
        assert!(
            text.contains(r#"ember_export_dropped_total{sink="pyroscope",reason="queue_full"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"ember_export_dropped_total{sink="pyroscope",reason="too_large"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"ember_export_queue_bytes{sink="pyroscope"} 90"#),
            "{text}"
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("rt");
        let first = rt.block_on(q.pop());
        assert_eq!(first, Some(2));
        q.close();
        assert_eq!(rt.block_on(q.pop()), Some(3));
        assert_eq!(q.abandon(), 2, "one queued, one in flight");
    }

    #[test]
    fn backoff_is_capped_jittered_and_honours_retry_after() {
        let p = Sinks {
            timeout: Duration::from_secs(1),
            retry_initial_backoff: Duration::from_millis(100),
            retry_max_backoff: Duration::from_secs(2),
            retry_max_elapsed: Duration::from_secs(60),
            ..Default::default()
        };
        let mut distinct = HashSet::new();
        for attempt in 0..40 {
            let b = backoff(&p, attempt, None);
            let ceiling = Duration::from_millis(100)
                .saturating_mul(1 << attempt.min(20))
                .min(Duration::from_secs(2));
            assert!(b <= ceiling, "{attempt}: {b:?} > {ceiling:?}");
            distinct.insert(b);
        }
        assert!(distinct.len() > 20, "not jittered: {distinct:?}");
        let b = backoff(&p, 0, Some(Duration::from_secs(7)));
        assert!(b >= Duration::from_secs(7), "{b:?}");
    }

    struct Script(Vec<Outcome>, Arc<Mutex<u32>>);

    impl Transport for Script {
        type Item = u32;
        fn send(&mut self, _item: &u32) -> impl Future<Output = Outcome> + Send + '_ {
            *self.1.lock().expect("lock") += 1;
            let o = if self.0.is_empty() {
                Outcome::Sent { bytes: 10 }
            } else {
                self.0.remove(0)
            };
            async move { o }
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("rt")
    }

    #[test]
    fn retry_after_u64_max_drops_the_request_and_delivery_goes_on() {
        // The overflowing path: `first.elapsed() + wait` only overflows once the first
        // attempt is a second or more behind, so a `Retry-After: 1` comes first.
        let m = Metrics::new();
        let q = Arc::new(Queue::new(SinkName::Otlp, 1000, m.export.clone()));
        q.push(1, 10);
        q.push(2, 10);
        q.close();
        let calls = Arc::new(Mutex::new(0));
        let retry = |after| Outcome::Retry {
            reason: Transient::Status(ExportDrop::Http(429)),
            after: Some(after),
        };
        let script = Script(
            vec![
                retry(Duration::from_millis(1100)),
                retry(Duration::from_secs(u64::MAX)),
            ],
            calls.clone(),
        );
        let p = Arc::new(Sinks {
            timeout: Duration::from_secs(1),
            retry_initial_backoff: Duration::from_millis(1),
            retry_max_backoff: Duration::from_millis(5),
            retry_max_elapsed: Duration::from_secs(60),
            ..Default::default()
        });
        rt().block_on(run(q, script, p.clone()));
        assert_eq!(*calls.lock().expect("lock"), 3);
        let text = m.encode();
        assert!(
            text.contains(
                r#"ember_export_dropped_total{sink="otlp",reason="retries_exhausted"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"ember_export_sent_total{sink="otlp"} 1"#),
            "{text}"
        );
        // And the wait itself is clamped.
        let b = backoff(&p, 0, Some(Duration::from_secs(u64::MAX)));
        assert!(b <= Duration::from_secs(61), "{b:?}");
    }

    struct Panics(u32);

    impl Transport for Panics {
        type Item = u32;
        fn send(&mut self, item: &u32) -> impl Future<Output = Outcome> + Send + '_ {
            let item = *item;
            self.0 += 1;
            async move {
                assert!(item != 1, "a bug while sending");
                Outcome::Sent { bytes: 10 }
            }
        }
    }

    #[test]
    fn a_panicking_delivery_is_counted_and_the_task_goes_on() {
        let m = Metrics::new();
        let q = Arc::new(Queue::new(SinkName::Pyroscope, 1000, m.export.clone()));
        q.push(1, 10);
        q.push(2, 10);
        q.close();
        let p = Arc::new(Sinks::default());
        rt().block_on(run(q.clone(), Panics(0), p));
        let text = m.encode();
        assert!(
            text.contains(r#"ember_export_dropped_total{sink="pyroscope",reason="internal"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"ember_export_sent_total{sink="pyroscope"} 1"#),
            "{text}"
        );
        assert_eq!(q.abandon(), 0, "nothing left in flight");
    }

    #[test]
    fn retries_transient_failures_and_drops_rejections() {
        let m = Metrics::new();
        let q = Arc::new(Queue::new(SinkName::Otlp, 1000, m.export.clone()));
        q.push(1, 10);
        q.push(2, 10);
        q.close();
        let calls = Arc::new(Mutex::new(0));
        let script = Script(
            vec![
                Outcome::Retry {
                    reason: Transient::Status(ExportDrop::Http(503)),
                    after: None,
                },
                Outcome::Sent { bytes: 10 },
                Outcome::Reject {
                    reason: ExportDrop::Http(400),
                    detail: "bad".into(),
                },
            ],
            calls.clone(),
        );
        let p = Arc::new(Sinks {
            timeout: Duration::from_secs(1),
            retry_initial_backoff: Duration::from_millis(1),
            retry_max_backoff: Duration::from_millis(5),
            retry_max_elapsed: Duration::from_secs(5),
            ..Default::default()
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("rt");
        rt.block_on(run(q, script, p));
        assert_eq!(*calls.lock().expect("lock"), 3);
        let text = m.encode();
        assert!(
            text.contains(r#"ember_export_sent_total{sink="otlp"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"ember_export_dropped_total{sink="otlp",reason="http_400"} 1"#),
            "{text}"
        );
    }
}
