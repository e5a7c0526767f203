//! `/healthz`: the pipeline's heartbeat plus any checks other parts register.
//!
//! The heartbeat is built in: the pipeline calls [`Health::beat`] whenever a window
//! closes. Other parts add their own condition with [`Health::add_check`] (a small
//! closure into their own module, e.g. a stage's progress or the data directory's
//! state); `/healthz` answers 200 only while every check passes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// Slack added to three windows before the agent counts as stuck.
pub(crate) const HEALTH_GRACE: Duration = Duration::from_secs(30);

/// A registered check: `Ok` while healthy, else a one-line reason.
type Check = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Liveness of the agent: it fails once no beat (or, before the first, no start)
/// happened within 3 × window + 30 s, or once any registered check fails.
pub struct Health {
    limit: Duration,
    started: Instant,
    /// Milliseconds from `started` to the last beat; an atomic so the pipeline never
    /// waits on the server.
    last_beat_ms: AtomicU64,
    /// Extra checks, by name, in the order they were added.
    checks: RwLock<Vec<(&'static str, Check)>>,
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
        })
    }

    /// Records that a window just closed.
    pub fn beat(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_beat_ms.store(ms, Ordering::Relaxed);
    }

    /// Adds a check `/healthz` runs on every request: `Ok` while healthy, else why not
    /// (one line). It must be cheap and must not block: read a state its owner keeps.
    pub fn add_check(
        &self,
        name: &'static str,
        check: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    ) {
        self.checks
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push((name, Box::new(check)));
    }

    /// `Ok` while healthy, else why not.
    pub fn check(&self) -> Result<(), HealthError> {
        self.check_at(Instant::now())?;
        let checks = self.checks.read().unwrap_or_else(|e| e.into_inner());
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
        why: String,
    },
}

/// `GET /healthz`: `ok` or 503 with the reason.
pub(super) async fn healthz(State(health): State<Arc<Health>>) -> Response {
    match health.check() {
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
        health.add_check("data_dir", || Err("read-only".into()));
        let why = health.check().err().map(|e| e.to_string());
        assert_eq!(why.as_deref(), Some("data_dir: read-only"));
    }
}
