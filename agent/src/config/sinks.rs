//! `sinks:` keys: the delivery policy every network sink shares, and one section per
//! sink. A sink's own section has its own file (`super::otlp`, `super::pyroscope`);
//! this file only composes them, so the config file is still parsed in one pass with
//! positions in its errors.

use std::time::Duration;

use serde::Deserialize;

pub use super::otlp::{OtlpSink, ResourcePer};
pub use super::pyroscope::{PyroscopeApi, PyroscopeSink};

use super::values::Invalid;
use super::{duration, size};

/// `sinks:` keys: the network backends windows are shipped to, each with its own
/// bounded queue and delivery task (see `crate::export`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Sinks {
    /// Bytes of encoded requests each network sink may hold; beyond this the oldest are dropped.
    #[serde(deserialize_with = "size")]
    pub queue_bytes: u64,
    /// Time limit for one request: connect, send and the reply.
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
    /// Backoff before the first retry; it doubles per attempt (full jitter).
    #[serde(deserialize_with = "duration")]
    pub retry_initial_backoff: Duration,
    /// Longest backoff between two attempts.
    #[serde(deserialize_with = "duration")]
    pub retry_max_backoff: Duration,
    /// A window still not delivered after this long is dropped (`retries_exhausted`).
    #[serde(deserialize_with = "duration")]
    pub retry_max_elapsed: Duration,
    /// On stop, queued windows are still delivered for at most this long.
    #[serde(deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    /// Grafana Pyroscope.
    pub pyroscope: PyroscopeSink,
    /// OTLP profiles over gRPC.
    pub otlp: OtlpSink,
}

impl Default for Sinks {
    fn default() -> Self {
        Self {
            queue_bytes: 16 << 20,
            timeout: Duration::from_secs(10),
            retry_initial_backoff: Duration::from_millis(500),
            retry_max_backoff: Duration::from_secs(30),
            retry_max_elapsed: Duration::from_secs(120),
            shutdown_grace: Duration::from_secs(5),
            pyroscope: PyroscopeSink::default(),
            otlp: OtlpSink::default(),
        }
    }
}

impl Sinks {
    /// Checks the shared policy, then each sink's section.
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        if self.queue_bytes < 1024 {
            return Err(Invalid::new("sinks.queue_bytes", "must be at least 1024"));
        }
        if self.timeout.is_zero() {
            return Err(Invalid::new("sinks.timeout", "must be more than 0"));
        }
        if self.retry_initial_backoff.is_zero()
            || self.retry_initial_backoff > self.retry_max_backoff
        {
            return Err(Invalid::new(
                "sinks.retry_initial_backoff",
                "must be more than 0 and at most retry_max_backoff",
            ));
        }
        self.pyroscope.validate()?;
        self.otlp.validate()
    }
}
