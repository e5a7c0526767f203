//! Grafana Pyroscope: each window, split into one pprof profile per
//! `service_name` by [`crate::encode::pyroscope`], is pushed as one series per service.
//!
//! The push API is Connect unary, `POST /push.v1.PusherService/Push` with a
//! gzip'ed protobuf `PushRequest` (`application/proto`); the pprof inside each
//! `RawSample` is not compressed, as the pyroscope-io client sends it. Old
//! servers get the legacy `POST /ingest?name=…&format=pprof`, one request per
//! service. Series labels: `__name__=process_cpu` (`off_cpu` for off-CPU windows), `service_name`, the
//! namespace/pod/container/container_id shared by every sample of the service,
//! and the configured static labels.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use base64::Engine;
use bytes::Bytes;
use flate2::write::GzEncoder;
use flate2::Compression;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use prost::Message;

use super::delivery::{random_u128, Outcome, Transient, Transport};
use super::Encode;
use crate::config::{PyroscopeApi, PyroscopeSink};
use crate::encode::pyroscope::{split, Service, Split};
use crate::metrics::ExportDrop;
use crate::model::Symbolized;
use crate::push_proto::{PushRequest, RawProfileSeries, RawSample};

/// Metric and log name of this sink.
pub const NAME: &str = "pyroscope";
/// The Connect path of the push API.
pub const PUSH_PATH: &str = "/push.v1.PusherService/Push";
/// Largest error body read from the server (for the log).
const MAX_ERROR_BODY: usize = 4096;

/// One HTTP request, ready to send.
#[derive(Debug, Clone)]
pub struct Request {
    /// Path and query, appended to the base URL.
    pub path: String,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Whether the body is gzip'ed (`Content-Encoding: gzip`).
    pub gzip: bool,
    /// The body.
    pub body: Bytes,
}

/// Turns windows into Pyroscope requests.
pub struct Encoder {
    api: PyroscopeApi,
    labels: BTreeMap<String, String>,
    keep: HashSet<String>,
    max_series: usize,
    /// Stacks folded into the overflow series ([`split`]).
    folded: Counter,
}

impl Encoder {
    /// An encoder for the `sinks.pyroscope` settings, counting folded stacks in `folded`.
    pub fn new(cfg: &PyroscopeSink, folded: Counter) -> Self {
        Self {
            api: cfg.api,
            labels: cfg.labels.clone(),
            keep: cfg.sample_labels.iter().cloned().collect(),
            max_series: cfg.max_series,
            folded,
        }
    }

    /// The requests for one window: one push, or one ingest per service.
    pub fn requests(&self, w: &Symbolized) -> Result<Vec<Request>> {
        let Split { services, folded } = split(w, &self.keep, self.max_series);
        self.folded.inc_by(folded as u64);
        let mut out = Vec::new();
        match self.api {
            PyroscopeApi::Push => {
                let mut req = PushRequest::default();
                for s in &services {
                    req.series.push(RawProfileSeries {
                        labels: s.series_labels(&self.labels),
                        samples: vec![RawSample {
                            raw_profile: Bytes::from(s.profile.encode_to_vec()),
                            id: uuid(),
                        }],
                    });
                }
                if !req.series.is_empty() {
                    out.push(Request {
                        path: PUSH_PATH.to_owned(),
                        content_type: "application/proto",
                        gzip: true,
                        body: Bytes::from(gzip(&req.encode_to_vec())?),
                    });
                }
            }
            PyroscopeApi::Ingest => {
                let from = unix_secs(w.start);
                let until = unix_secs(w.start + w.duration).max(from + 1);
                let hz = match w.period_ns {
                    p if p > 0 => 1_000_000_000 / p,
                    _ => 100,
                };
                for s in &services {
                    let name = self.ingest_name(s);
                    out.push(Request {
                        path: format!(
                            "/ingest?name={}&from={from}&until={until}&format=pprof&sampleRate={hz}&spyName=ember",
                            percent_encode(&name)
                        ),
                        content_type: "application/octet-stream",
                        gzip: false,
                        body: Bytes::from(s.profile.encode_to_vec()),
                    });
                }
            }
        }
        Ok(out)
    }

    /// `service{k=v,…}`, the legacy application name with its tags. Names and values come
    /// from workloads, so the characters that structure the name are replaced
    /// ([`ingest_safe`]).
    fn ingest_name(&self, s: &Service) -> String {
        let mut tags: Vec<String> = s
            .uniform
            .iter()
            .map(|(k, v)| format!("{k}={}", ingest_safe(v)))
            .chain(
                self.labels
                    .iter()
                    .map(|(k, v)| format!("{k}={}", ingest_safe(v))),
            )
            .collect();
        tags.dedup();
        let kind = match s.kind {
            crate::model::ProfileKind::Cpu => "cpu",
            crate::model::ProfileKind::OffCpu => "off_cpu",
        };
        format!("{}.{kind}{{{}}}", ingest_safe(&s.name), tags.join(","))
    }
}

/// Longest service name or tag value put into a legacy ingest name, in bytes.
const MAX_INGEST_PART: usize = 128;

/// `part` with every character that structures a legacy ingest name (`{`, `}`, `,`, `=`),
/// and every control or space character, replaced by `_`, cut to [`MAX_INGEST_PART`] bytes.
fn ingest_safe(part: &str) -> String {
    let mut out = String::with_capacity(part.len().min(MAX_INGEST_PART));
    for c in part.chars() {
        let c = match c {
            '{' | '}' | ',' | '=' => '_',
            c if c.is_control() || c.is_whitespace() => '_',
            c => c,
        };
        if out.len() + c.len_utf8() > MAX_INGEST_PART {
            break;
        }
        out.push(c);
    }
    out
}

impl Encode for Encoder {
    type Item = Request;
    fn encode(&mut self, w: &Symbolized) -> Result<Vec<(Request, u64)>> {
        Ok(self
            .requests(w)?
            .into_iter()
            .map(|r| {
                let n = r.body.len() as u64;
                (r, n)
            })
            .collect())
    }
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A random version-4 UUID, as text.
fn uuid() -> String {
    let mut b = random_u128().to_be_bytes();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut gz = GzEncoder::new(Vec::with_capacity(bytes.len() / 4), Compression::fast());
    gz.write_all(bytes)?;
    Ok(gz.finish()?)
}

/// RFC 3986 percent-encoding of everything but unreserved characters.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Secrets and headers sent with every request.
fn headers(cfg: &PyroscopeSink) -> Result<HeaderMap> {
    let mut h = HeaderMap::new();
    let sensitive = |h: &mut HeaderMap, name: HeaderName, value: String, what: &str| {
        let mut v = HeaderValue::from_str(&value)
            .with_context(|| format!("sinks.pyroscope: {what} is not a valid header value"))?;
        v.set_sensitive(true);
        h.insert(name, v);
        anyhow::Ok(())
    };
    let password = super::secret(
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
    let token = super::secret(
        &cfg.bearer_token.0,
        &cfg.bearer_token_file,
        "sinks.pyroscope.bearer_token_file",
    )?;
    if !token.is_empty() {
        if !cfg.basic_auth_user.is_empty() {
            bail!("sinks.pyroscope: set either basic auth or a bearer token, not both");
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
        let name = HeaderName::from_bytes(k.as_bytes())
            .with_context(|| format!("sinks.pyroscope.headers: {k:?} is not a header name"))?;
        sensitive(&mut h, name, v.0.clone(), &format!("header {k}"))?;
    }
    h.insert(
        http::header::USER_AGENT,
        HeaderValue::from_static(concat!("ember/", env!("CARGO_PKG_VERSION"))),
    );
    Ok(h)
}

/// rustls with ring: the PEM CAs in `ca_file`, else the system roots.
pub fn tls_config(ca_file: &Path) -> Result<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    if ca_file.as_os_str().is_empty() {
        let native = rustls_native_certs::load_native_certs();
        for cert in native.certs {
            // One unusable system certificate must not disable TLS altogether.
            let _ = roots.add(cert);
        }
        if roots.is_empty() {
            tracing::warn!("no system CA certificates found; https sinks will fail (set ca_file)");
        }
    } else {
        for cert in CertificateDer::pem_file_iter(ca_file)
            .with_context(|| format!("reading CA file {}", ca_file.display()))?
        {
            let cert = cert.with_context(|| format!("parsing CA file {}", ca_file.display()))?;
            roots
                .add(cert)
                .with_context(|| format!("CA file {}", ca_file.display()))?;
        }
        if roots.is_empty() {
            bail!("CA file {} holds no certificate", ca_file.display());
        }
    }
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS setup")?
    .with_root_certificates(roots)
    .with_no_client_auth())
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
    secrets: super::SecretFiles,
}

impl Http {
    /// A client for the `sinks.pyroscope` settings; reads the secret files now, and again
    /// whenever they change.
    pub fn new(cfg: &PyroscopeSink, connect_timeout: Duration) -> Result<Self> {
        let secrets = super::SecretFiles::new([
            cfg.basic_auth_password_file.as_path(),
            cfg.bearer_token_file.as_path(),
        ]);
        let headers = headers(cfg)?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(connect_timeout));
        http.set_nodelay(true);
        let tls = if cfg.url.starts_with("https://") {
            tls_config(&cfg.ca_file)?
        } else {
            // Plain http: no certificates are needed (and none are read).
            tls_config_empty()?
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
                tracing::info!(sink = NAME, "secret files changed; read them again");
            }
            Err(e) => tracing::warn!(
                sink = NAME,
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

/// A TLS config trusting nothing, for plain-http servers (the connector needs one).
fn tls_config_empty() -> Result<rustls::ClientConfig> {
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS setup")?
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth())
}

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
    use crate::encode::pyroscope::tests::window;
    use crate::proto::Profile;

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

    /// Names from workloads cannot add tags or braces to a legacy ingest name.
    #[test]
    fn ingest_names_escape_what_workloads_choose() -> Result<()> {
        let mut w = window();
        let evil = Arc::new(crate::model::Labels {
            service_name: "web}{admin=1,x".into(),
            namespace: "a=b,c".into(),
            ..Default::default()
        });
        for s in &mut w.stacks {
            s.labels = evil.clone();
        }
        let cfg = PyroscopeSink {
            api: PyroscopeApi::Ingest,
            ..Default::default()
        };
        let reqs = Encoder::new(&cfg, Counter::default()).requests(&w)?;
        assert_eq!(reqs.len(), 1);
        let name = reqs[0]
            .path
            .strip_prefix("/ingest?name=")
            .and_then(|p| p.split('&').next())
            .context("no name")?;
        let name = percent_decode(name);
        assert_eq!(name, "web__admin_1_x.cpu{namespace=a_b_c}");
        assert_eq!(ingest_safe(&"é".repeat(100)).len(), MAX_INGEST_PART);
        Ok(())
    }

    fn percent_decode(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' && i + 2 < b.len() {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("00");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(0));
                i += 3;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn push_request_has_required_labels() -> Result<()> {
        let cfg = PyroscopeSink {
            labels: [("cluster".to_owned(), "c1".to_owned())].into(),
            ..Default::default()
        };
        let w = window();
        let reqs = Encoder::new(&cfg, Counter::default()).requests(&w)?;
        assert_eq!(reqs.len(), 1);
        assert_eq!(reqs[0].path, PUSH_PATH);
        let mut raw = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(&reqs[0].body[..]),
            &mut raw,
        )?;
        let push = PushRequest::decode(&raw[..])?;
        assert_eq!(push.series.len(), 2);
        let labels: Vec<(&str, &str)> = push.series[1]
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        assert_eq!(
            labels,
            [
                ("__name__", "process_cpu"),
                ("service_name", "shop/web"),
                ("namespace", "shop"),
                ("cluster", "c1")
            ]
        );
        let id = &push.series[1].samples[0].id;
        assert_eq!(id.len(), 36, "{id}");
        let p = Profile::decode(&push.series[1].samples[0].raw_profile[..])?;
        assert_eq!(p.sample.len(), 1);

        let ingest = Encoder::new(
            &PyroscopeSink {
                api: PyroscopeApi::Ingest,
                ..cfg
            },
            Counter::default(),
        )
        .requests(&w)?;
        assert_eq!(ingest.len(), 2);
        assert!(
            ingest[1].path.starts_with(
                "/ingest?name=shop%2Fweb.cpu%7Bnamespace%3Dshop%2Ccluster%3Dc1%7D&from=1800000000&until=1800000010&format=pprof&sampleRate=99"
            ),
            "{}",
            ingest[1].path
        );
        Ok(())
    }

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
