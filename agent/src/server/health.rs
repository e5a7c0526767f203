//! `/healthz` (liveness) and `/readyz` (readiness).
//!
//! Liveness means "the pipeline makes progress": the heartbeat is built in (the pipeline
//! calls [`Health::beat`] whenever a window closes) and other parts add a progress
//! condition with [`Health::add_check`] (e.g. a stage's progress). A restart is what a
//! failed liveness probe brings, so only what a restart can cure belongs here.
//!
//! Readiness adds conditions a restart cannot cure but an operator should see, with
//! [`Health::add_readiness_check`]: a full or read-only data disk leaves the pipeline
//! running (windows still reach the sinks) and must not restart-loop the agent, so it
//! fails `/readyz` and is named in `/healthz`'s 200 body, never fails `/healthz`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// Slack added to three windows before the agent counts as stuck.
pub(crate) const HEALTH_GRACE: Duration = Duration::from_secs(30);

/// Why a registered check fails: its owner's typed error, shown as one line.
pub type CheckError = Box<dyn std::error::Error + Send + Sync>;

/// A registered check: `Ok` while healthy, else why not.
type Check = Box<dyn Fn() -> Result<(), CheckError> + Send + Sync>;

/// Liveness of the agent: it fails once no beat (or, before the first, no start)
/// happened within 3 × window + 30 s, or once any registered check fails.
pub struct Health {
    limit: Duration,
    started: Instant,
    /// Milliseconds from `started` to the last beat; an atomic so the pipeline never
    /// waits on the server.
    last_beat_ms: AtomicU64,
    /// Extra liveness checks, by name, in the order they were added.
    checks: RwLock<Vec<(&'static str, Check)>>,
    /// Readiness-only checks, by name, in the order they were added.
    readiness: RwLock<Vec<(&'static str, Check)>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("limit", &self.limit)
            .field("last_beat_ms", &self.last_beat_ms)
            .finish_non_exhaustive()
    }
}

impl Health {
    /// Starts the clock for a pipeline that closes a window every `window`.
    pub fn new(window: Duration) -> Arc<Self> {
        Arc::new(Self {
            limit: window.saturating_mul(3).saturating_add(HEALTH_GRACE),
            started: Instant::now(),
            last_beat_ms: AtomicU64::new(0),
            checks: RwLock::new(Vec::new()),
            readiness: RwLock::new(Vec::new()),
        })
    }

    /// Records that a window just closed.
    pub fn beat(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_beat_ms.store(ms, Ordering::Relaxed);
    }

    /// Adds a liveness check `/healthz` (and `/readyz`) runs on every request: `Ok`
    /// while the pipeline makes progress, else why not (one line). It must be cheap and
    /// must not block: read a state its owner keeps.
    pub fn add_check<E: std::error::Error + Send + Sync + 'static>(
        &self,
        name: &'static str,
        check: impl Fn() -> Result<(), E> + Send + Sync + 'static,
    ) {
        self.checks
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push((name, boxed(check)));
    }

    /// Adds a check only `/readyz` fails on (`/healthz` names it in its 200 body): a
    /// fault a restart cannot cure, such as a full or read-only data directory. Cheap
    /// and non-blocking, like [`Health::add_check`].
    pub fn add_readiness_check<E: std::error::Error + Send + Sync + 'static>(
        &self,
        name: &'static str,
        check: impl Fn() -> Result<(), E> + Send + Sync + 'static,
    ) {
        self.readiness
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push((name, boxed(check)));
    }

    /// Liveness: `Ok` while the pipeline makes progress, else why not.
    pub fn check(&self) -> Result<(), HealthError> {
        self.check_at(Instant::now())?;
        let checks = self.checks.read().unwrap_or_else(|e| e.into_inner());
        for (name, check) in checks.iter() {
            check().map_err(|why| HealthError::Check { name, why })?;
        }
        Ok(())
    }

    /// Readiness: liveness and every readiness check.
    pub fn ready(&self) -> Result<(), HealthError> {
        self.check()?;
        self.degraded()
    }

    /// The first failing readiness-only check, if any.
    fn degraded(&self) -> Result<(), HealthError> {
        let checks = self.readiness.read().unwrap_or_else(|e| e.into_inner());
        for (name, check) in checks.iter() {
            check().map_err(|why| HealthError::Check { name, why })?;
        }
        Ok(())
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

/// A check whose typed error is boxed, so checks of different owners share one list.
fn boxed<E: std::error::Error + Send + Sync + 'static>(
    check: impl Fn() -> Result<(), E> + Send + Sync + 'static,
) -> Check {
    Box::new(move || check().map_err(|e| Box::new(e) as CheckError))
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
    /// A registered check failed.
    #[error("{name}: {why}")]
    Check {
        /// The check's name.
        name: &'static str,
        /// What it said.
        why: CheckError,
    },
}

/// `GET /healthz` (liveness): `ok` or 503 with the reason; a failing readiness check
/// is named in the 200 body (`ok; not ready: ...`) but does not fail it.
pub(super) async fn healthz(State(health): State<Arc<Health>>) -> Response {
    match health.check() {
        Ok(()) => match health.degraded() {
            Ok(()) => (StatusCode::OK, "ok\n").into_response(),
            Err(why) => (StatusCode::OK, format!("ok; not ready: {why}\n")).into_response(),
        },
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

/// `GET /readyz` (readiness): `ok` or 503 with the reason.
pub(super) async fn readyz(State(health): State<Arc<Health>>) -> Response {
    match health.ready() {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expires_after_three_windows_and_grace() {
        let health = Health::new(Duration::from_secs(10));
        let start = health.started;
        assert!(health.check_at(start + Duration::from_secs(60)).is_ok());
        let late = health.check_at(start + Duration::from_secs(61));
        assert!(late.is_err_and(|why| why.to_string().contains("limit 60 s")));
        health.beat();
        assert!(health.check().is_ok());
    }

    #[test]
    fn registered_checks_fail_the_whole() {
        let health = Health::new(Duration::from_secs(10));
        health.add_check("stages", || Err(std::io::Error::other("capture stuck")));
        let why = health.check().err().map(|e| e.to_string());
        assert_eq!(why.as_deref(), Some("stages: capture stuck"));
        assert!(health.ready().is_err());
    }

    #[test]
    fn readiness_checks_fail_readiness_only() {
        let health = Health::new(Duration::from_secs(10));
        health.add_readiness_check("data_dir", || Err(std::io::Error::other("read-only")));
        assert!(health.check().is_ok(), "liveness ignores the data dir");
        let why = health.ready().err().map(|e| e.to_string());
        assert_eq!(why.as_deref(), Some("data_dir: read-only"));
    }
}
