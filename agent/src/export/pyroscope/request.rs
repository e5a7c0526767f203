//! Pyroscope requests from a window: one push of every service's profile (gzip'ed
//! `PushRequest`, the pprof inside not compressed, as the pyroscope-io client sends it),
//! or for old servers one legacy ingest per service with its name and tags in the query.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use flate2::write::GzEncoder;
use flate2::Compression;
use prometheus_client::metrics::counter::Counter;
use prost::Message;

use super::encode::{split, Service, Split};
use super::PUSH_PATH;
use crate::config::{PyroscopeApi, PyroscopeSink};
use crate::export::delivery::random_u128;
use crate::export::{Encode, EncodeError};
use crate::model::Symbolized;
use crate::push_proto::{PushRequest, RawProfileSeries, RawSample};

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
    pub fn requests(&self, w: &Symbolized) -> Result<Vec<Request>, EncodeError> {
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
            other => super::encode::profile_name(other),
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
    fn encode(&mut self, w: &Symbolized) -> Result<Vec<(Request, u64)>, EncodeError> {
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

fn gzip(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut gz = GzEncoder::new(Vec::with_capacity(bytes.len() / 4), Compression::fast());
    gz.write_all(bytes)?;
    gz.finish()
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

#[cfg(test)]
mod tests {
    use super::super::encode::tests::window;
    use super::*;
    use crate::proto::Profile;
    use anyhow::{Context, Result};
    use std::sync::Arc;

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
}
