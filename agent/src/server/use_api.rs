//! `/api/use`: the readings the USE page needs, from the latest two snapshots the
//! readings thread published (counters become rates in the page).
//!
//! Only the families the page reads are sent; the server keeps the last two distinct
//! snapshots (two `Arc`s), so memory does not grow with requests.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::UNIX_EPOCH;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::metrics::snapshot::{Published, Snapshot, Value};

/// Families the USE page reads, by their names in the snapshot.
const FAMILIES: &[&str] = &[
    "node_cpu",
    "node_load1",
    "node_pressure_cpu_waiting",
    "node_pressure_memory_waiting",
    "node_pressure_io_waiting",
    "node_memory_MemTotal",
    "node_memory_MemAvailable",
    "node_vmstat_pswpin",
    "node_vmstat_pswpout",
    "node_vmstat_oom_kill",
    "node_disk_io_time",
    "node_network_receive",
    "node_network_transmit",
    "node_network_speed",
    "node_network_receive_errs",
    "node_network_transmit_errs",
    "node_network_receive_drop",
    "node_network_transmit_drop",
    "container_cpu_usage",
    "container_cpu_cfs_periods",
    "container_cpu_cfs_throttled_periods",
    "container_pressure_cpu_waiting",
    "container_pressure_memory_waiting",
    "container_pressure_io_waiting",
    "container_memory_working_set",
    "container_oom_events",
];

/// The older and the newer of two snapshots.
type Pair = (Option<Arc<Snapshot>>, Option<Arc<Snapshot>>);

/// The snapshots `/api/use` serves.
#[derive(Clone)]
pub(super) struct UseState {
    published: Published,
    /// The older and the newer of the last two distinct snapshots seen.
    seen: Arc<Mutex<Pair>>,
}

impl UseState {
    pub(super) fn new(published: Published) -> Self {
        Self {
            published,
            seen: Arc::new(Mutex::new((None, None))),
        }
    }

    /// The previous and the latest snapshot.
    fn pair(&self) -> (Option<Arc<Snapshot>>, Arc<Snapshot>) {
        let latest = self.published.latest();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let newer_time = seen.1.as_ref().map(|s| s.time);
        if newer_time != Some(latest.time) {
            seen.0 = seen.1.take();
            seen.1 = Some(latest.clone());
        }
        (seen.0.clone(), latest)
    }
}

#[derive(Serialize)]
struct Point {
    labels: BTreeMap<&'static str, String>,
    value: f64,
}

#[derive(Serialize)]
struct SnapshotJson {
    time_ms: u64,
    families: BTreeMap<&'static str, Vec<Point>>,
}

fn to_json(s: &Snapshot) -> SnapshotJson {
    let mut families: BTreeMap<&'static str, Vec<Point>> = BTreeMap::new();
    for f in s.families.iter().filter(|f| FAMILIES.contains(&f.name)) {
        let points = families.entry(f.name).or_default();
        for p in &f.points {
            if let Value::Number(value) = p.value {
                points.push(Point {
                    labels: p.labels.iter().cloned().collect(),
                    value,
                });
            }
        }
    }
    SnapshotJson {
        time_ms: s
            .time
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        families,
    }
}

/// `GET /api/use`: `{previous, latest}`, each `{time_ms, families}`; `previous` is null
/// until a second snapshot was published.
pub(super) async fn readings(State(state): State<UseState>) -> Response {
    #[derive(Serialize)]
    struct Pair {
        previous: Option<SnapshotJson>,
        latest: SnapshotJson,
    }
    let (previous, latest) = state.pair();
    let pair = Pair {
        previous: previous.as_deref().map(to_json),
        latest: to_json(&latest),
    };
    match serde_json::to_vec(&pair) {
        Ok(body) => ([(CONTENT_TYPE, "application/json")], body).into_response(),
        Err(_) => axum::http::StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
