//! The profiles API: windows merged over any time range and filtered by any label, as
//! one gzip'ed pprof (`/api/profile`, for `go tool pprof` and friends) or as a flame graph
//! tree with a top-functions table (`/api/flamegraph`, for the explorer page), plus
//! listings of windows (`/api/windows`) and label values (`/api/labels`).
//!
//! Query parameters: `from`, `to` (RFC 3339, Unix seconds, `now` or `now-15m`; default
//! the last 15 minutes), `seconds=N` (the last N seconds, what `pprof -seconds` sends),
//! `type=cpu|offcpu`; every other parameter is a label filter (`container=api`,
//! `pid=42`). A window belongs to a range when it starts inside it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::limits::Deadline;
use super::merge::{str_at, LabelFilter, MergeError, Merger};
use crate::encode::flamegraph::decode_gz;
use crate::export::files::{WindowDir, WindowFile};
use crate::metrics::{HttpRefusal, Metrics};
use crate::proto::{Profile, ValueType};

/// Range when the request names none.
const DEFAULT_RANGE: Duration = Duration::from_secs(15 * 60);
/// Values listed per label key by `/api/labels`.
const MAX_LABEL_VALUES: usize = 1000;
/// Rows of the top-functions table.
const MAX_TOP: usize = 500;
/// File name suffix of off-CPU windows (see export/files.rs).
const OFFCPU_SUFFIX: &str = ".offcpu.pb.gz";

/// What the API handlers share.
#[derive(Clone)]
pub(super) struct Api {
    pub(super) windows: Arc<WindowDir>,
    pub(super) metrics: Metrics,
    pub(super) max_file_bytes: u64,
    pub(super) max_merge_samples: usize,
    pub(super) request_timeout: Duration,
}

/// Profile kinds a window file can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Kind {
    /// On-CPU samples (`<stamp>.pb.gz`).
    Cpu,
    /// Off-CPU time (`<stamp>.offcpu.pb.gz`).
    Offcpu,
}

impl Kind {
    fn of(name: &str) -> Self {
        if name.ends_with(OFFCPU_SUFFIX) {
            Self::Offcpu
        } else {
            Self::Cpu
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
    #[error("window {0} is larger than server.max_file_bytes")]
    FileTooLarge(String),
    #[error("the request ran past server.request_timeout; narrow the range")]
    Timeout,
    #[error("internal error")]
    Internal(String),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self {
            Self::Param(..) | Self::Merge(MergeError::SampleTypes) => StatusCode::BAD_REQUEST,
            Self::Merge(MergeError::TooManySamples { .. }) | Self::FileTooLarge(_) => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            Self::Timeout => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(why) => {
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
                "from" => from = Some(parse_time(&value, now).ok_or_else(|| bad("not a time"))?),
                "to" => to = Some(parse_time(&value, now).ok_or_else(|| bad("not a time"))?),
                "seconds" => {
                    let s: u64 = value.parse().map_err(|_| bad("not a whole number"))?;
                    seconds = Some(Duration::from_secs(s));
                }
                "type" => {
                    kind = match &*value {
                        "cpu" => Kind::Cpu,
                        "offcpu" => Kind::Offcpu,
                        _ => return Err(bad("must be cpu or offcpu")),
                    }
                }
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

/// `now`, `now-15m`, Unix seconds (`1795317300.5`) or RFC 3339.
fn parse_time(text: &str, now: SystemTime) -> Option<SystemTime> {
    if text == "now" {
        return Some(now);
    }
    if let Some(ago) = text.strip_prefix("now-") {
        return now.checked_sub(humantime::parse_duration(ago).ok()?);
    }
    if let Ok(secs) = text.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0)
            .then(|| UNIX_EPOCH.checked_add(Duration::from_secs_f64(secs)))
            .flatten();
    }
    humantime::parse_rfc3339_weak(text).ok()
}

/// The start of the window named `name`, from its `20261122T031500.123Z` stamp.
pub(super) fn window_start(name: &str) -> Option<SystemTime> {
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
    /// Reads and decodes every selected window, handing each to `each`; stops at the
    /// deadline. Unreadable windows are logged and skipped (retention may remove one
    /// between the listing and the read).
    fn for_each_window(
        &self,
        q: &Query,
        deadline: Deadline,
        mut each: impl FnMut(&Profile) -> Result<(), ApiError>,
    ) -> Result<usize, ApiError> {
        let mut read = 0;
        for (file, _) in select(&self.windows, q) {
            if deadline.passed() {
                self.metrics.http_refused(HttpRefusal::Timeout);
                return Err(ApiError::Timeout);
            }
            if file.bytes > self.max_file_bytes {
                self.metrics.http_refused(HttpRefusal::TooLarge);
                return Err(ApiError::FileTooLarge(file.name));
            }
            let profile = match self.windows.read(&file.name).map(|b| decode_gz(&b)) {
                Ok(Ok(p)) => p,
                Ok(Err(e)) => {
                    tracing::warn!(window = %file.name, error = %e, "cannot decode window");
                    continue;
                }
                Err(e) => {
                    tracing::debug!(window = %file.name, error = %e, "cannot read window");
                    continue;
                }
            };
            each(&profile)?;
            read += 1;
        }
        Ok(read)
    }

    /// The selected windows merged into one profile.
    fn merged(&self, q: &Query, deadline: Deadline) -> Result<Profile, ApiError> {
        let mut merger = Merger::new(self.max_merge_samples);
        let read = self.for_each_window(q, deadline, |p| {
            merger.add(p, &q.filter).map_err(|e| {
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

    /// Runs `work` on the blocking pool under this request's deadline.
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Api, Deadline) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let api = self.clone();
        let deadline = Deadline::after(self.request_timeout);
        tokio::task::spawn_blocking(move || work(&api, deadline))
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
    }
}

/// The header of an empty profile of `q`'s kind: a range with no window still gives
/// a valid profile (pprof reads it as "no samples").
fn empty_header(p: &mut Profile, q: &Query) {
    let names: &[&str] = match q.kind {
        Kind::Cpu => &["", "samples", "count", "cpu", "nanoseconds"],
        Kind::Offcpu => &["", "samples", "count", "offcpu", "nanoseconds"],
    };
    p.string_table = names.iter().map(|s| s.to_string()).collect();
    p.sample_type = vec![
        ValueType { r#type: 1, unit: 2 },
        ValueType { r#type: 3, unit: 4 },
    ];
    p.period_type = Some(ValueType { r#type: 3, unit: 4 });
    p.default_sample_type = 3;
    p.time_nanos = i64::try_from(millis(q.from)).unwrap_or(0) * 1_000_000;
    p.duration_nanos = i64::try_from(q.to.duration_since(q.from).unwrap_or_default().as_nanos())
        .unwrap_or(i64::MAX);
}

fn json(value: &impl Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => ([(CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => ApiError::Internal(e.to_string()).into_response(),
    }
}

/// `GET /api/profile`: one gzip'ed pprof merged over the range.
pub(super) async fn profile(State(api): State<Api>, req: Request) -> Result<Response, ApiError> {
    let q = Query::parse(req.uri().query(), SystemTime::now())?;
    let kind = q.kind;
    let gz = api
        .blocking(move |api, deadline| {
            let profile = api.merged(&q, deadline)?;
            crate::encode::pprof::to_gzip(&profile).map_err(|e| ApiError::Internal(e.to_string()))
        })
        .await?;
    let file = match kind {
        Kind::Cpu => "attachment; filename=\"ember-cpu.pb.gz\"",
        Kind::Offcpu => "attachment; filename=\"ember-offcpu.pb.gz\"",
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
        Some("cpu") => Some(Kind::Cpu),
        Some("offcpu") => Some(Kind::Offcpu),
        Some(_) => {
            return Err(ApiError::Param(
                "type".into(),
                "must be cpu or offcpu".into(),
            ))
        }
    };
    let rows = api
        .blocking(move |api, _| {
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
            Ok(rows)
        })
        .await?;
    Ok(json(&rows))
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
        .blocking(move |api, deadline| {
            let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            let mut truncated = BTreeSet::new();
            let windows = api.for_each_window(&q, deadline, |p| {
                for s in &p.sample {
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
            Ok(Labels {
                labels,
                truncated,
                windows,
            })
        })
        .await?;
    Ok(json(&out))
}

/// A flame graph node as d3-flame-graph reads it: `value` includes the children.
#[derive(Serialize, Default)]
pub(super) struct Node {
    name: String,
    value: i64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    children: Vec<Node>,
}

impl Node {
    fn child(&mut self, name: &str) -> &mut Node {
        let at = match self.children.iter().position(|c| c.name == name) {
            Some(i) => i,
            None => {
                self.children.push(Node {
                    name: name.to_string(),
                    ..Default::default()
                });
                self.children.len() - 1
            }
        };
        &mut self.children[at]
    }
}

/// A row of the top-functions table.
#[derive(Serialize)]
struct Top {
    name: String,
    /// Samples with the function as the leaf.
    flat: i64,
    /// Samples with the function anywhere on the stack (once per stack).
    cum: i64,
}

/// What `/api/flamegraph` returns.
#[derive(Serialize)]
struct FlameGraph {
    root: Node,
    top: Vec<Top>,
    /// What `value` counts (the profile's first sample type), e.g. `samples/count`.
    unit: String,
    total: i64,
    samples: usize,
}

/// Frame names of a sample, root first: inline frames expand, unnamed code shows as
/// its object and address.
fn frames(p: &Profile, location_ids: &[u64], by_id: &HashMap<u64, usize>) -> Vec<String> {
    let mut names = Vec::new();
    for id in location_ids.iter().rev() {
        let Some(loc) = by_id.get(id).and_then(|&i| p.location.get(i)) else {
            continue;
        };
        if loc.line.is_empty() {
            let object = p
                .mapping
                .iter()
                .find(|m| m.id == loc.mapping_id)
                .map_or("", |m| str_at(p, m.filename));
            names.push(format!("{object}+{:#x}", loc.address));
            continue;
        }
        for line in loc.line.iter().rev() {
            let name = p
                .function
                .iter()
                .find(|f| f.id == line.function_id)
                .map_or("?", |f| str_at(p, f.name));
            names.push(name.to_string());
        }
    }
    names
}

/// The flame graph tree and the top table of a merged profile, by its first value.
fn flame_graph(p: &Profile) -> FlameGraph {
    let by_id: HashMap<u64, usize> = p
        .location
        .iter()
        .enumerate()
        .map(|(i, l)| (l.id, i))
        .collect();
    let mut root = Node {
        name: "all".into(),
        ..Default::default()
    };
    let mut top: HashMap<String, (i64, i64)> = HashMap::new();
    for s in &p.sample {
        let v = s.value.first().copied().unwrap_or(0);
        let names = frames(p, &s.location_id, &by_id);
        root.value += v;
        let mut node = &mut root;
        for name in &names {
            node = node.child(name);
            node.value += v;
        }
        let mut seen = BTreeSet::new();
        for name in &names {
            if seen.insert(name.as_str()) {
                top.entry(name.clone()).or_default().1 += v;
            }
        }
        if let Some(leaf) = names.last() {
            top.entry(leaf.clone()).or_default().0 += v;
        }
    }
    let mut top: Vec<Top> = top
        .into_iter()
        .map(|(name, (flat, cum))| Top { name, flat, cum })
        .collect();
    top.sort_by(|a, b| b.flat.cmp(&a.flat).then(b.cum.cmp(&a.cum)));
    top.truncate(MAX_TOP);
    let unit = p
        .sample_type
        .first()
        .map(|t| format!("{}/{}", str_at(p, t.r#type), str_at(p, t.unit)))
        .unwrap_or_default();
    FlameGraph {
        total: root.value,
        root,
        top,
        unit,
        samples: p.sample.len(),
    }
}

/// `GET /api/flamegraph`: the merged range as a flame graph tree and top table.
pub(super) async fn flamegraph(State(api): State<Api>, req: Request) -> Result<Response, ApiError> {
    let q = Query::parse(req.uri().query(), SystemTime::now())?;
    let graph = api
        .blocking(move |api, deadline| Ok(flame_graph(&api.merged(&q, deadline)?)))
        .await?;
    Ok(json(&graph))
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
        assert_eq!(window_start("junk"), None);
    }
}
