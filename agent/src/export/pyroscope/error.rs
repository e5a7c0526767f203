//! What a Pyroscope server's reply means for delivery: sent, retried (and when), or
//! dropped for good under a reason named after the HTTP status.

use std::time::{Duration, SystemTime};

use http::header::HeaderMap;

use crate::export::delivery::{Outcome, Transient};
use crate::metrics::ExportDrop;

/// What an HTTP status means for delivery: 2xx sent; 408, 429 and 5xx retried
/// (with `Retry-After`); any other status is a permanent rejection.
pub fn classify(status: u16, after: Option<Duration>, body: &[u8], sent: u64) -> Outcome {
    match status {
        200..=299 => Outcome::Sent { bytes: sent },
        408 | 429 | 500..=599 => Outcome::Retry {
            reason: Transient::Status(ExportDrop::Http(status)),
            after,
        },
        _ => Outcome::Reject {
            reason: ExportDrop::Http(status),
            detail: String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
        },
    }
}

/// `Retry-After` as delay-seconds or an HTTP date, relative to `now`.
pub fn retry_after(h: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let v = h.get(http::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::HeaderValue;
    use std::time::UNIX_EPOCH;

    #[test]
    fn statuses_and_retry_after() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let mut h = HeaderMap::new();
        h.insert(http::header::RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(3)));
        let date = httpdate::fmt_http_date(now + Duration::from_secs(20));
        h.insert(
            http::header::RETRY_AFTER,
            HeaderValue::from_str(&date).expect("date"),
        );
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(20)));
        assert_eq!(classify(200, None, b"", 5), Outcome::Sent { bytes: 5 });
        assert!(matches!(classify(503, None, b"", 5), Outcome::Retry { .. }));
        assert!(matches!(classify(429, None, b"", 5), Outcome::Retry { .. }));
        assert!(matches!(
            classify(400, None, b"bad", 5),
            Outcome::Reject { reason, .. } if reason.to_string() == "http_400"
        ));
        assert!(matches!(
            classify(401, None, b"", 5),
            Outcome::Reject { .. }
        ));
    }
}
