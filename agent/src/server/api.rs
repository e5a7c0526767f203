//! The profiles API: windows merged over any time range and filtered by any label, as
//! one gzip'ed pprof (`/api/profile`, for `go tool pprof` and friends) or as a flame graph
//! tree with a top-functions table (`/api/flamegraph`, for the explorer page), plus
//! listings of windows (`/api/windows`) and label values (`/api/labels`).
//!
//! Query parameters: `from`, `to` (RFC 3339, Unix seconds, `now` or `now-15m`; default
//! the last 15 minutes), `seconds=N` (the last N seconds, what `pprof -seconds` sends),
//! `type=cpu|offcpu|offwake|lock`; every other parameter is a label filter (`container=api`,
//! `pid=42`). A window belongs to a range when it starts inside it.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use flate2::read::GzDecoder;
use prost::Message;
use serde::Serialize;

use super::flame::{Flame, FlameError};
use super::limits::{Heavy, Stopped, Work};
use super::merge::{str_at, LabelFilter, MergeError, Merger};
use crate::encode::flamegraph::{FlameGraphError, MAX_DECODED_BYTES};
use crate::export::files::{WindowDir, WindowFile};
use crate::metrics::{HttpRefusal, Metrics};
use crate::model::ProfileKind;
use crate::proto::{Profile, ValueType};

/// Range when the request names none.
const DEFAULT_RANGE: Duration = Duration::from_secs(15 * 60);
/// Values listed per label key by `/api/labels`.
const MAX_LABEL_VALUES: usize = 1000;
/// Label keys listed by `/api/labels`.
const MAX_LABEL_KEYS: usize = 1000;

/// What the API handlers share.
#[derive(Clone)]
pub(super) struct Api {
    pub(super) windows: Arc<WindowDir>,
    pub(super) metrics: Metrics,
    pub(super) heavy: Heavy,
    pub(super) max_file_bytes: u64,
    pub(super) max_merge_samples: usize,
    pub(super) max_flame_nodes: usize,
    pub(super) max_response_bytes: u64,
}

/// Profile kinds a window file can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Kind {
    /// On-CPU samples (`<stamp>.pb.gz`).
    Cpu,
    /// Off-CPU time (`<stamp>.offcpu.pb.gz`).
    Offcpu,
    /// Blocked time under its wakers (`<stamp>.offwake.pb.gz`).
    Offwake,
    /// Lock waits (`<stamp>.lock.pb.gz`).
    Lock,
}

/// What `type=` takes, for its error message.
const KINDS: &str = "must be cpu, offcpu, offwake or lock";

impl Kind {
    fn of(name: &str) -> Self {
        [Self::Offcpu, Self::Offwake, Self::Lock]
            .into_iter()
            .find(|k| name.ends_with(&format!(".{}.pb.gz", k.profile().as_str())))
            .unwrap_or(Self::Cpu)
    }

    /// The kind `type=` names.
    fn parse(name: &str) -> Option<Self> {
        [Self::Cpu, Self::Offcpu, Self::Offwake, Self::Lock]
            .into_iter()
            .find(|k| k.profile().as_str() == name)
    }

    /// The window kind of this kind's files.
    fn profile(self) -> ProfileKind {
        match self {
            Self::Cpu => ProfileKind::Cpu,
            Self::Offcpu => ProfileKind::OffCpu,
            Self::Offwake => ProfileKind::OffWake,
            Self::Lock => ProfileKind::Lock,
        }
    }
}

/// Why a request failed; each maps to one status.
#[derive(Debug, thiserror::Error)]
pub(super) enum ApiError {
    #[error("bad parameter {0}: {1}")]
    Param(String, String),
    #[error("{0}")]
    Merge(#[from] MergeError),
    #[error("{0}")]
    Flame(#[from] FlameError),
    #[error("window {0} is larger than server.max_file_bytes")]
    FileTooLarge(String),
    #[error(
        "the response would be larger than {0} bytes (server.max_response_bytes): \
         narrow the time range or filter by a label"
    )]
    ResponseTooLarge(u64),
    #[error("{0}")]
    Stopped(#[from] Stopped),
    #[error("internal error")]
    Internal(String),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match self {
            Self::Stopped(s)
            | Self::Merge(MergeError::Stopped(s))
            | Self::Flame(FlameError::Stopped(s)) => return s.into_response(),
            Self::Param(..)
            | Self::Merge(MergeError::SampleTypes)
            | Self::Flame(FlameError::SampleTypes) => StatusCode::BAD_REQUEST,
            Self::Merge(MergeError::TooManySamples { .. })
            | Self::Flame(FlameError::TooManyNodes { .. })
            | Self::FileTooLarge(_)
            | Self::ResponseTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Internal(ref why) => {
                tracing::warn!(error = %why, "profiles api failed");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        (status, format!("{self}\n")).into_response()
    }
}

/// A parsed query: the range, the kind and the label filter.
#[derive(Debug)]
pub(super) struct Query {
    from: SystemTime,
    to: SystemTime,
    kind: Kind,
    filter: LabelFilter,
}

impl Query {
    pub(super) fn parse(query: Option<&str>, now: SystemTime) -> Result<Self, ApiError> {
        let mut from = None;
        let mut to = None;
        let mut seconds = None;
        let mut kind = Kind::Cpu;
        let mut filter = Vec::new();
        for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            let bad = |why: &str| ApiError::Param(key.to_string(), why.to_string());
            match &*key {
                "from" => from = Some(parse_time(&value, now).map_err(bad)?),
                "to" => to = Some(parse_time(&value, now).map_err(bad)?),
                "seconds" => {
                    let s: u64 = value.parse().map_err(|_| bad("not a whole number"))?;
                    seconds = Some(Duration::from_secs(s));
                }
                "type" => kind = Kind::parse(&value).ok_or_else(|| bad(KINDS))?,
                // The page's cache buster and pprof's own parameters.
                "_" | "debug" | "gc" => {}
                _ if key.is_empty() || value.is_empty() => {}
                _ => filter.push((key.into_owned(), value.into_owned())),
            }
        }
        let to = to.unwrap_or(now);
        let from = match (from, seconds) {
            (Some(f), _) => f,
            (None, Some(s)) => to.checked_sub(s).unwrap_or(UNIX_EPOCH),
            (None, None) => to.checked_sub(DEFAULT_RANGE).unwrap_or(UNIX_EPOCH),
        };
        if from > to {
            return Err(ApiError::Param("from".into(), "is after to".into()));
        }
        Ok(Self {
            from,
            to,
            kind,
            filter: LabelFilter(filter),
        })
    }
}

/// Latest time a query may name: 9999-12-31T23:59:59Z, as far as RFC 3339 goes.
const MAX_UNIX_SECONDS: f64 = 253_402_300_799.0;

/// `now`, `now-15m`, Unix seconds (`1795317300.5`) or RFC 3339; else why not. Never
/// panics: a number out of range (`1e30`, `-1`, `NaN`) is an error like any other.
fn parse_time(text: &str, now: SystemTime) -> Result<SystemTime, &'static str> {
    if text == "now" {
        return Ok(now);
    }
    if let Some(ago) = text.strip_prefix("now-") {
        let ago = humantime::parse_duration(ago).map_err(|_| "not a duration after now-")?;
        return now
            .checked_sub(ago)
            .filter(|t| *t >= UNIX_EPOCH)
            .ok_or("out of range (before 1970)");
    }
    if let Ok(secs) = text.parse::<f64>() {
        if !(0.0..=MAX_UNIX_SECONDS).contains(&secs) {
            return Err("out of range (Unix seconds from 0 to 253402300799)");
        }
        return Duration::try_from_secs_f64(secs)
            .ok()
            .and_then(|d| UNIX_EPOCH.checked_add(d))
            .ok_or("out of range");
    }
    humantime::parse_rfc3339_weak(text)
        .map_err(|_| "not a time (now, now-15m, Unix seconds or RFC 3339)")
}

/// The start of the window named `name`, from its `20261122T031500.123Z` stamp.
pub(crate) fn window_start(name: &str) -> Option<SystemTime> {
    let s = name.get(..20)?;
    let rfc = format!(
        "{}-{}-{}T{}:{}:{}Z",
        s.get(0..4)?,
        s.get(4..6)?,
        s.get(6..8)?,
        s.get(9..11)?,
        s.get(11..13)?,
        s.get(13..19)?
    );
    humantime::parse_rfc3339(&rfc).ok()
}

/// Unix milliseconds of `t`.
fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The windows of `kind` that start in `[from, to)`, oldest first.
fn select(windows: &WindowDir, q: &Query) -> Vec<(WindowFile, SystemTime)> {
    let mut picked: Vec<_> = windows
        .list()
        .into_iter()
        .filter(|f| Kind::of(&f.name) == q.kind)
        .filter_map(|f| {
            let start = window_start(&f.name)?;
            (start >= q.from && start < q.to).then_some((f, start))
        })
        .collect();
    picked.reverse();
    picked
}

impl Api {
    /// Reads and decodes every selected window, handing each to `each`; stops when
    /// `work` says so. Unreadable windows are logged and skipped (retention may remove
    /// one between the listing and the read).
    fn for_each_window(
        &self,
        q: &Query,
        work: &Work,
        mut each: impl FnMut(&Profile) -> Result<(), ApiError>,
    ) -> Result<usize, ApiError> {
        let mut count = 0;
        for (file, _) in select(&self.windows, q) {
            work.check()?;
            if file.bytes > self.max_file_bytes {
                self.metrics.http_refused(HttpRefusal::TooLarge);
                return Err(ApiError::FileTooLarge(file.name));
            }
            // One decoded window at a time across all requests, held until `each` is done.
            let _turn = work.window_turn()?;
            let read = self.windows.read(&file.name);
            let profile = match read.map(|b| decode_window(&b, work)) {
                Ok(Ok(p)) => p,
                Ok(Err(DecodeStop::Stopped(s))) => return Err(s.into()),
                Ok(Err(DecodeStop::Bad(e))) => {
                    tracing::warn!(window = %file.name, error = %e, "cannot decode window");
                    continue;
                }
                Err(e) => {
                    tracing::debug!(window = %file.name, error = %e, "cannot read window");
                    continue;
                }
            };
            work.check()?;
            each(&profile)?;
            count += 1;
        }
        Ok(count)
    }

    /// The selected windows merged into one profile.
    fn merged(&self, q: &Query, work: &Work) -> Result<Profile, ApiError> {
        let mut merger = Merger::new(self.max_merge_samples);
        let read = self.for_each_window(q, work, |p| {
            merger.add(p, &q.filter, work).map_err(|e| {
                if matches!(e, MergeError::TooManySamples { .. }) {
                    self.metrics.http_refused(HttpRefusal::TooLarge);
                }
                ApiError::from(e)
            })
        })?;
        let mut profile = merger.finish();
        if read == 0 {
            empty_header(&mut profile, q);
        }
        Ok(profile)
    }

    /// `body` unless it is over `server.max_response_bytes` (413, counted).
    fn capped(&self, body: Vec<u8>) -> Result<Vec<u8>, ApiError> {
        if body.len() as u64 > self.max_response_bytes {
            self.metrics.http_refused(HttpRefusal::TooLarge);
            return Err(ApiError::ResponseTooLarge(self.max_response_bytes));
        }
        Ok(body)
    }

    /// `value` as JSON, refused (413, counted) as soon as it passes
    /// `server.max_response_bytes`: the body is never built past the cap.
    fn json(&self, value: &impl Serialize) -> Result<Vec<u8>, ApiError> {
        let mut out = CappedWriter {
            buf: Vec::new(),
            cap: usize::try_from(self.max_response_bytes).unwrap_or(usize::MAX),
            over: false,
        };
        match serde_json::to_writer(&mut out, value) {
            Ok(()) => Ok(out.buf),
            Err(_) if out.over => {
                self.metrics.http_refused(HttpRefusal::TooLarge);
                Err(ApiError::ResponseTooLarge(self.max_response_bytes))
            }
            Err(e) => Err(ApiError::Internal(e.to_string())),
        }
    }

    /// Runs `work` as heavy work ([`Heavy::run`]): the slot is the work's, the deadline
    /// and the cancellation are checked inside its loops.
    async fn heavy<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Api, &Work) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let api = self.clone();
        self.heavy.run(move |w| work(&api, w)).await
    }
}

/// Why [`decode_window`] gave no profile.
enum DecodeStop {
    Bad(FlameGraphError),
    Stopped(Stopped),
}

/// The gunzip and decode of [`crate::encode::flamegraph::decode_gz`] (same cap), polling
/// `work` every 256 KiB of output so that a cancelled request does not decompress a
/// whole window first.
fn decode_window(gz: &[u8], work: &Work) -> Result<Profile, DecodeStop> {
    let mut raw = Vec::new();
    let mut reader = GzDecoder::new(gz).take(MAX_DECODED_BYTES + 1);
    let mut chunk = vec![0u8; 256 << 10];
    loop {
        work.check().map_err(DecodeStop::Stopped)?;
        let n = reader
            .read(&mut chunk)
            .map_err(|e| DecodeStop::Bad(FlameGraphError::Gunzip(e)))?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&chunk[..n]);
    }
    if raw.len() as u64 > MAX_DECODED_BYTES {
        return Err(DecodeStop::Bad(FlameGraphError::TooLarge));
    }
    Profile::decode(raw.as_slice()).map_err(|e| DecodeStop::Bad(FlameGraphError::Decode(e)))
}

/// A writer into memory that fails once `cap` bytes would be passed.
struct CappedWriter {
    buf: Vec<u8>,
    cap: usize,
    over: bool,
}

impl Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len().saturating_add(data.len()) > self.cap {
            self.over = true;
            return Err(std::io::Error::other(
                "response over server.max_response_bytes",
            ));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The header of an empty profile of `q`'s kind: a range with no window still gives
/// a valid profile (pprof reads it as "no samples").
fn empty_header(p: &mut Profile, q: &Query) {
    let (count, count_unit) = crate::encode::pprof::count_type(q.kind.profile());
    let (value, unit) = crate::encode::pprof::value_type(q.kind.profile());
    p.string_table = ["", count, count_unit, value, unit]
        .iter()
        .map(|s| s.to_string())
        .collect();
    p.sample_type = vec![
        ValueType { r#type: 1, unit: 2 },
        ValueType { r#type: 3, unit: 4 },
    ];
    p.period_type = Some(ValueType { r#type: 3, unit: 4 });
    p.default_sample_type = 3;
    p.time_nanos = i64::try_from(millis(q.from))
        .unwrap_or(0)
        .saturating_mul(1_000_000);
    p.duration_nanos = i64::try_from(q.to.duration_since(q.from).unwrap_or_default().as_nanos())
        .unwrap_or(i64::MAX);
}

fn json_response(body: Vec<u8>) -> Response {
    ([(CONTENT_TYPE, "application/json")], body).into_response()
}

/// `GET /api/profile`: one gzip'ed pprof merged over the range.
pub(super) async fn profile(State(api): State<Api>, req: Request) -> Result<Response, ApiError> {
    let q = Query::parse(req.uri().query(), SystemTime::now())?;
    let kind = q.kind;
    let gz = api
        .heavy(move |api, work| {
            let profile = api.merged(&q, work)?;
            work.check()?;
            let gz = crate::encode::pprof::to_gzip(&profile)
                .map_err(|e| ApiError::Internal(e.to_string()))?;
            api.capped(gz)
        })
        .await?;
    let file = match kind {
        Kind::Cpu => "attachment; filename=\"ember-cpu.pb.gz\"",
        Kind::Offcpu => "attachment; filename=\"ember-offcpu.pb.gz\"",
        Kind::Offwake => "attachment; filename=\"ember-offwake.pb.gz\"",
        Kind::Lock => "attachment; filename=\"ember-lock.pb.gz\"",
    };
    Ok((
        [
            (CONTENT_TYPE, "application/octet-stream"),
            (CONTENT_DISPOSITION, file),
        ],
        gz,
    )
        .into_response())
}

/// One window in `/api/windows`.
#[derive(Serialize)]
struct WindowRow {
    name: String,
    /// Unix milliseconds of the window's start.
    start_ms: u64,
    bytes: u64,
    #[serde(rename = "type")]
    kind: Kind,
}

/// `GET /api/windows`: every window on disk (or of one `type`), oldest first.
pub(super) async fn windows(State(api): State<Api>, req: Request) -> Result<Response, ApiError> {
    let only = match form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "type")
        .map(|(_, v)| v.into_owned())
        .as_deref()
    {
        None => None,
        Some(name) => match Kind::parse(name) {
            Some(k) => Some(k),
            None => return Err(ApiError::Param("type".into(), KINDS.into())),
        },
    };
    // A directory listing (at most output.keep_windows files): light, off the runtime.
    let rows = tokio::task::spawn_blocking(move || {
        let mut rows: Vec<WindowRow> = api
            .windows
            .list()
            .into_iter()
            .filter(|f| only.is_none_or(|k| k == Kind::of(&f.name)))
            .filter_map(|f| {
                Some(WindowRow {
                    start_ms: millis(window_start(&f.name)?),
                    kind: Kind::of(&f.name),
                    name: f.name,
                    bytes: f.bytes,
                })
            })
            .collect();
        rows.reverse();
        api.json(&rows)
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))??;
    Ok(json_response(rows))
}

/// `GET /api/labels`: the values of each sample label in the range (at most
/// [`MAX_LABEL_VALUES`] per key; `truncated` lists the keys that had more).
pub(super) async fn labels(State(api): State<Api>, req: Request) -> Result<Response, ApiError> {
    #[derive(Serialize)]
    struct Labels {
        labels: BTreeMap<String, BTreeSet<String>>,
        truncated: BTreeSet<String>,
        windows: usize,
    }
    let q = Query::parse(req.uri().query(), SystemTime::now())?;
    let out = api
        .heavy(move |api, work| {
            let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            let mut truncated = BTreeSet::new();
            let windows = api.for_each_window(&q, work, |p| {
                for s in &p.sample {
                    work.tick()?;
                    for l in &s.label {
                        let key = str_at(p, l.key);
                        // Thread ids are too many to list usefully.
                        if key == "tid" {
                            continue;
                        }
                        let value = if l.str != 0 {
                            str_at(p, l.str).to_string()
                        } else {
                            l.num.to_string()
                        };
                        if !labels.contains_key(key) && labels.len() >= MAX_LABEL_KEYS {
                            truncated.insert("(keys)".to_string());
                            continue;
                        }
                        let values = labels.entry(key.to_string()).or_default();
                        if values.len() < MAX_LABEL_VALUES {
                            values.insert(value);
                        } else if !values.contains(&value) {
                            truncated.insert(key.to_string());
                        }
                    }
                }
                Ok(())
            })?;
            api.json(&Labels {
                labels,
                truncated,
                windows,
            })
        })
        .await?;
    Ok(json_response(out))
}

/// `GET /api/flamegraph`: the range as a flame graph tree and top table, built window
/// by window ([`Flame`]).
pub(super) async fn flamegraph(State(api): State<Api>, req: Request) -> Result<Response, ApiError> {
    let q = Query::parse(req.uri().query(), SystemTime::now())?;
    let body = api
        .heavy(move |api, work| {
            let mut flame = Flame::new(api.max_flame_nodes);
            api.for_each_window(&q, work, |p| {
                flame.add(p, &q.filter, work).map_err(|e| {
                    if matches!(e, FlameError::TooManyNodes { .. }) {
                        api.metrics.http_refused(HttpRefusal::TooLarge);
                    }
                    ApiError::from(e)
                })
            })?;
            work.check()?;
            api.json(&flame.graph())
        })
        .await?;
    Ok(json_response(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_filters_parse() -> Result<(), ApiError> {
        let now = UNIX_EPOCH + Duration::from_secs(1_795_317_300);
        let q = Query::parse(
            Some("from=now-15m&to=2026-11-22T03:15:00Z&type=offcpu&container=api&_=1"),
            now,
        )?;
        assert_eq!(q.to, now);
        assert_eq!(q.from, now - Duration::from_secs(900));
        assert_eq!(q.kind, Kind::Offcpu);
        assert_eq!(
            q.filter.0,
            vec![("container".to_string(), "api".to_string())]
        );
        let q = Query::parse(Some("seconds=30"), now)?;
        assert_eq!(q.from, now - Duration::from_secs(30));
        let q = Query::parse(Some("from=1795317200.5&to=1795317300"), now)?;
        assert_eq!(q.from, now - Duration::from_millis(99_500));
        assert!(Query::parse(Some("from=yesterday"), now).is_err());
        assert!(Query::parse(Some("type=heap"), now).is_err());
        assert!(Query::parse(Some("from=now&to=now-1m"), now).is_err());
        // Out of range: an error naming the parameter, never a panic.
        for bad in [
            "1e30",
            "1e300",
            "-1",
            "NaN",
            "inf",
            "253402300800",
            "now-99999999999y",
        ] {
            match Query::parse(Some(&format!("from={bad}")), now) {
                Err(ApiError::Param(key, why)) => assert_eq!(key, "from", "{bad}: {why}"),
                other => panic!("from={bad}: {other:?}"),
            }
        }
        Ok(())
    }

    #[test]
    fn window_names_give_their_start() {
        let t = window_start("20261122T031500.123Z-1.pb.gz");
        assert_eq!(
            t,
            Some(UNIX_EPOCH + Duration::from_millis(1_795_317_300_123))
        );
        assert_eq!(Kind::of("20261122T031500.123Z.offcpu.pb.gz"), Kind::Offcpu);
        assert_eq!(Kind::of("20261122T031500.123Z.pb.gz"), Kind::Cpu);
        assert_eq!(
            Kind::of("20261122T031500.123Z.offwake.pb.gz"),
            Kind::Offwake
        );
        assert_eq!(Kind::of("20261122T031500.123Z-2.lock.pb.gz"), Kind::Lock);
        assert_eq!(Kind::parse("lock"), Some(Kind::Lock));
        assert_eq!(Kind::parse("mutex"), None);
        assert_eq!(window_start("junk"), None);
    }
}
