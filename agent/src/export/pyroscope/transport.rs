//! Sending requests to one Pyroscope server over HTTP/1.1 (rustls for `https://`):
//! the headers every request carries (basic auth or bearer token, tenant, extra
//! headers), read again when a secret file is rotated, and one attempt per call whose
//! reply [`super::error::classify`] turns into a delivery outcome.

use std::time::{Duration, SystemTime};

use base64::Engine;
use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::error::{classify, retry_after};
use super::request::Request;
use super::{NAME, PUSH_PATH};
use crate::config::PyroscopeSink;
use crate::export::delivery::{Outcome, Transient, Transport};
use crate::export::secrets::{secret, SecretFiles};
use crate::export::setup::SinkSetupError;
use crate::metrics::ExportDrop;

/// Largest error body read from the server (for the log).
const MAX_ERROR_BODY: usize = 4096;

/// Secrets and headers sent with every request.
fn headers(cfg: &PyroscopeSink) -> Result<HeaderMap, SinkSetupError> {
    let mut h = HeaderMap::new();
    let sensitive = |h: &mut HeaderMap, name: HeaderName, value: String, what: &str| {
        let mut v =
            HeaderValue::from_str(&value).map_err(|source| SinkSetupError::HeaderValue {
                what: what.to_owned(),
                source,
            })?;
        v.set_sensitive(true);
        h.insert(name, v);
        Ok::<(), SinkSetupError>(())
    };
    let password = secret(
        &cfg.basic_auth_password.0,
        &cfg.basic_auth_password_file,
        "sinks.pyroscope.basic_auth_password_file",
    )?;
    if !cfg.basic_auth_user.is_empty() {
        let token = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{password}", cfg.basic_auth_user));
        sensitive(
            &mut h,
            http::header::AUTHORIZATION,
            format!("Basic {token}"),
            "basic auth",
        )?;
    }
    let token = secret(
        &cfg.bearer_token.0,
        &cfg.bearer_token_file,
        "sinks.pyroscope.bearer_token_file",
    )?;
    if !token.is_empty() {
        if !cfg.basic_auth_user.is_empty() {
            return Err(SinkSetupError::BothAuth);
        }
        sensitive(
            &mut h,
            http::header::AUTHORIZATION,
            format!("Bearer {token}"),
            "the bearer token",
        )?;
    }
    if !cfg.tenant_id.is_empty() {
        sensitive(
            &mut h,
            HeaderName::from_static("x-scope-orgid"),
            cfg.tenant_id.clone(),
            "tenant_id",
        )?;
    }
    for (k, v) in &cfg.headers {
        let name =
            HeaderName::from_bytes(k.as_bytes()).map_err(|source| SinkSetupError::HeaderName {
                name: k.clone(),
                source,
            })?;
        sensitive(&mut h, name, v.0.clone(), &format!("header {k}"))?;
    }
    h.insert(
        http::header::USER_AGENT,
        HeaderValue::from_static(concat!("ember/", env!("CARGO_PKG_VERSION"))),
    );
    Ok(h)
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Sends [`Request`]s to one Pyroscope server.
pub struct Http {
    client: HttpsClient,
    base: String,
    headers: HeaderMap,
    /// The settings the headers were made from, to make them again when a secret file
    /// is rotated.
    cfg: PyroscopeSink,
    secrets: SecretFiles,
}

impl Http {
    /// A client for the `sinks.pyroscope` settings; reads the secret files now, and again
    /// whenever they change.
    pub fn new(cfg: &PyroscopeSink, connect_timeout: Duration) -> Result<Self, SinkSetupError> {
        let secrets = SecretFiles::new([
            cfg.basic_auth_password_file.as_path(),
            cfg.bearer_token_file.as_path(),
        ]);
        let headers = headers(cfg)?;
        if cfg.url.starts_with("http://")
            && (headers.contains_key(http::header::AUTHORIZATION)
                || !cfg.headers.is_empty()
                || cfg.url.redacted() != cfg.url.0)
        {
            crate::export::secrets::warn_cleartext(NAME.as_str(), &cfg.url);
        }
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(connect_timeout));
        http.set_nodelay(true);
        let tls = if cfg.url.starts_with("https://") {
            crate::tls::client_for(&cfg.ca_file)?
        } else {
            // Plain http: no certificates are needed (and none are read), but the
            // connector needs a configuration; this one trusts nothing.
            crate::tls::client(rustls::RootCertStore::empty())?
        };
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        // The idle timeout needs a timer to take effect.
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Self {
            client,
            base: cfg.url.trim_end_matches('/').to_owned(),
            headers,
            cfg: cfg.clone(),
            secrets,
        })
    }

    /// Reads the secret files again if they changed; a file that cannot be read (mid
    /// rotation) keeps the last good headers, with a warning.
    fn rotate(&mut self) {
        if !self.secrets.changed() {
            return;
        }
        match headers(&self.cfg) {
            Ok(h) => {
                self.headers = h;
                tracing::info!(
                    sink = NAME.as_str(),
                    "secret files changed; read them again"
                );
            }
            Err(e) => tracing::warn!(
                sink = NAME.as_str(),
                "secret files changed but could not be read: {e:#}; keeping the previous ones"
            ),
        }
    }

    async fn attempt(&self, r: &Request) -> Outcome {
        let mut builder = http::Request::post(format!("{}{}", self.base, r.path))
            .header(http::header::CONTENT_TYPE, r.content_type);
        if r.gzip {
            builder = builder.header(http::header::CONTENT_ENCODING, "gzip");
        }
        if r.path == PUSH_PATH {
            builder = builder.header("connect-protocol-version", "1");
        }
        let mut req = match builder.body(Full::new(r.body.clone())) {
            Ok(req) => req,
            Err(e) => {
                return Outcome::Reject {
                    reason: ExportDrop::BadRequest,
                    detail: e.to_string(),
                }
            }
        };
        req.headers_mut()
            .extend(self.headers.iter().map(|(k, v)| (k.clone(), v.clone())));
        let resp = match self.client.request(req).await {
            Ok(resp) => resp,
            Err(e) => {
                let reason = if e.is_connect() {
                    Transient::Connect
                } else {
                    Transient::Io
                };
                return Outcome::Retry {
                    reason,
                    after: None,
                };
            }
        };
        let status = resp.status();
        let after = retry_after(resp.headers(), SystemTime::now());
        // Read the body so the connection can be reused; only error bodies are kept.
        let body = Limited::new(resp.into_body(), MAX_ERROR_BODY)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        classify(status.as_u16(), after, &body, r.body.len() as u64)
    }
}

impl Transport for Http {
    type Item = Request;
    fn send(&mut self, item: &Request) -> impl std::future::Future<Output = Outcome> + Send + '_ {
        let item = item.clone();
        self.rotate();
        async move { self.attempt(&item).await }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Result;

    #[test]
    fn rotated_token_files_are_read_again() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let token = dir.path().join("token");
        std::fs::write(&token, "first\n")?;
        let cfg = PyroscopeSink {
            url: "http://user:pw@127.0.0.1:1".into(),
            bearer_token_file: token.clone(),
            ..Default::default()
        };
        let mut http = Http::new(&cfg, Duration::from_secs(1))?;
        let auth = |h: &Http| h.headers.get(http::header::AUTHORIZATION).cloned();
        assert_eq!(
            auth(&http).as_ref().map(|v| v.as_bytes()),
            Some(&b"Bearer first"[..])
        );
        assert!(auth(&http).is_some_and(|v| v.is_sensitive()));
        http.rotate();
        // Rotated the way Kubernetes does it: a new file renamed over the old one.
        let next = dir.path().join("token.new");
        std::fs::write(&next, "second-token\n")?;
        std::fs::rename(&next, &token)?;
        http.rotate();
        assert_eq!(
            auth(&http).as_ref().map(|v| v.as_bytes()),
            Some(&b"Bearer second-token"[..])
        );
        // Gone mid-rotation: the last good token stays.
        std::fs::remove_file(&token)?;
        http.rotate();
        assert_eq!(
            auth(&http).as_ref().map(|v| v.as_bytes()),
            Some(&b"Bearer second-token"[..])
        );
        Ok(())
    }
}
