//! The `Host` check of a profiles listener without a token (DNS rebinding).
//!
//! A page on `evil.example` whose name a DNS rebinding points at 127.0.0.1 reaches a
//! loopback listener from the victim's browser as same-origin, and could read every
//! profile. Its requests carry `Host: evil.example[:port]`, a name the attacker chose;
//! so without a token, only these `Host` values are served:
//! - the listener's own address (`127.0.0.1:9464`);
//! - `localhost`, `127.0.0.1` and `[::1]`, with any port or none: no DNS answer can
//!   make a browser send them for another site, and `kubectl port-forward` maps the
//!   port (`8080:9465`);
//! - the names in `server.allowed_hosts`: `name` (any port) or `name:port`.
//!
//! Anything else, or no `Host` at all, gets 421 Misdirected Request (counted as `host`).

use std::net::SocketAddr;

use axum::extract::{Request, State};
use axum::http::header::HOST;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::metrics::{HttpRefusal, Metrics};

/// Names that always mean this machine.
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// The `Host` values one listener accepts.
#[derive(Clone)]
pub(super) struct Hosts {
    /// The listener's own address, as a client writes it (`127.0.0.1:9464`, `[::1]:9464`).
    own: String,
    /// `server.allowed_hosts`, lower case: `(name, Some(port))` or `(name, None)`.
    allowed: Vec<(String, Option<String>)>,
    metrics: Metrics,
}

impl Hosts {
    /// The values a listener bound to `own` accepts, plus `allowed`.
    pub(super) fn new(own: SocketAddr, allowed: &[String], metrics: Metrics) -> Self {
        let allowed = allowed
            .iter()
            .map(|h| {
                let h = h.to_ascii_lowercase();
                let (name, port) = split(&h);
                (name.to_string(), port.map(str::to_string))
            })
            .collect();
        Self {
            own: own.to_string(),
            allowed,
            metrics,
        }
    }

    /// Whether a request with `Host: host` is for this listener.
    pub(super) fn accepts(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        if host == self.own {
            return true;
        }
        let (name, port) = split(&host);
        if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
            return false;
        }
        LOOPBACK_NAMES.contains(&name)
            || self
                .allowed
                .iter()
                .any(|(n, p)| n == name && (p.is_none() || p.as_deref() == port))
    }
}

/// `name:port` → (`name`, `Some(port)`); `[v6]:port` likewise; no port → `None`.
fn split(host: &str) -> (&str, Option<&str>) {
    if host.starts_with('[') {
        return match host.find(']') {
            Some(end) => {
                let (name, rest) = host.split_at(end + 1);
                (name, rest.strip_prefix(':'))
            }
            None => (host, None),
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (host, None),
    }
}

/// Middleware: requests whose `Host` is not this listener's get 421.
pub(super) async fn require_own_host(
    State(hosts): State<Hosts>,
    req: Request,
    next: Next,
) -> Response {
    let ok = req
        .headers()
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|h| hosts.accepts(h));
    if ok {
        return next.run(req).await;
    }
    hosts.metrics.http_refused(HttpRefusal::Host);
    (
        StatusCode::MISDIRECTED_REQUEST,
        "the Host header names neither this listener nor a name in server.allowed_hosts\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_loopback_and_configured_names_only() {
        let own: SocketAddr = "127.0.0.1:9464".parse().expect("addr");
        let hosts = Hosts::new(
            own,
            &["Ember.Internal".into(), "proxy:8443".into()],
            Metrics::new(),
        );
        for ok in [
            "127.0.0.1:9464",
            "localhost:9464",
            "LOCALHOST:8080",
            "localhost",
            "[::1]:9464",
            "127.0.0.1",
            "ember.internal",
            "ember.internal:80",
            "proxy:8443",
        ] {
            assert!(hosts.accepts(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:9464",
            "localhost.evil.example:9464",
            "proxy:8444",
            "proxy",
            "127.0.0.2:9464",
            "localhost:x",
            "localhost:",
            "",
            "[::1",
        ] {
            assert!(!hosts.accepts(bad), "{bad}");
        }
        let v6 = Hosts::new("[::1]:9000".parse().expect("addr"), &[], Metrics::new());
        assert!(v6.accepts("[::1]:9000"));
        assert!(!v6.accepts("[::2]:9000"));
    }
}
