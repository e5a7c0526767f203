//! The readings snapshot: metric families as sources report them, and the latest snapshot
//! shared between the readings thread (writer) and the exporters (readers).
//!
//! It lives among the metrics (a leaf) because the Prometheus registry renders it on every
//! scrape; [`crate::readings`] fills it, `/metrics` and the OTLP metrics exporter read it.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabel, EncodeLabelSet, LabelSetEncoder, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

/// What kind of value a family holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic total; the exposition appends `_total`.
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// Cumulative buckets, sum and count.
    Histogram,
}

/// One value of a family.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A counter or gauge value.
    Number(f64),
    /// A histogram: `buckets` are `(upper bound, observations in this bucket)`,
    /// not cumulative (as OTLP and BPF log2 histograms count), bounds ascending,
    /// the last `f64::INFINITY`. The Prometheus encoder accumulates them.
    Histogram {
        /// Sum of all observations.
        sum: f64,
        /// Number of observations.
        count: u64,
        /// Per-bucket counts.
        buckets: Vec<(f64, u64)>,
    },
}

/// One labelled point of a family.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// Label pairs, in a fixed order per family.
    pub labels: Vec<(&'static str, String)>,
    /// The value.
    pub value: Value,
}

/// A metric family: one name, many labelled points.
#[derive(Debug, Clone)]
pub struct Family {
    /// Name without the `ember_` prefix, the unit suffix or `_total`
    /// (the Prometheus encoder adds those; OTLP uses [`Family::otlp_name`]).
    pub name: &'static str,
    /// One-line help.
    pub help: &'static str,
    /// Base unit, if any.
    pub unit: Option<Unit>,
    /// Counter, gauge or histogram.
    pub kind: Kind,
    /// The points.
    pub points: Vec<Point>,
}

impl Family {
    /// An empty family.
    pub fn new(name: &'static str, help: &'static str, unit: Option<Unit>, kind: Kind) -> Self {
        Self {
            name,
            help,
            unit,
            kind,
            points: Vec::new(),
        }
    }

    /// Adds a counter or gauge point.
    pub fn push(&mut self, labels: Vec<(&'static str, String)>, value: f64) {
        self.points.push(Point {
            labels,
            value: Value::Number(value),
        });
    }

    /// The name as Prometheus shows it, which OTLP reuses so that both
    /// exporters carry the same instrument names: `ember_<name>[_<unit>][_total]`.
    pub fn otlp_name(&self) -> String {
        let mut n = format!("ember_{}", self.name);
        if let Some(u) = &self.unit {
            n.push('_');
            n.push_str(u.as_str());
        }
        if self.kind == Kind::Counter {
            n.push_str("_total");
        }
        n
    }
}

/// Everything the sources reported at one instant.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// When the sources were read.
    pub time: SystemTime,
    /// The families, in the order the sources produced them.
    pub families: Vec<Family>,
}

impl Default for Snapshot {
    fn default() -> Self {
        Self {
            time: SystemTime::UNIX_EPOCH,
            families: Vec::new(),
        }
    }
}

/// The latest snapshot, shared between the collector thread (writer) and the
/// exporters (readers). Readers clone an `Arc` and release the lock at once.
#[derive(Clone, Default, Debug)]
pub struct Published(Arc<RwLock<Arc<Snapshot>>>);

impl Published {
    /// Replaces the latest snapshot.
    pub fn publish(&self, snapshot: Snapshot) {
        let s = Arc::new(snapshot);
        match self.0.write() {
            Ok(mut g) => *g = s,
            Err(poisoned) => *poisoned.into_inner() = s,
        }
    }

    /// The latest snapshot.
    pub fn latest(&self) -> Arc<Snapshot> {
        match self.0.read() {
            Ok(g) => Arc::clone(&g),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }
}

/// Label pairs as a prometheus-client label set.
struct Pairs<'a>(&'a [(&'static str, String)]);

impl EncodeLabelSet for Pairs<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), fmt::Error> {
        for (k, v) in self.0 {
            EncodeLabel::encode(&(*k, v.as_str()), encoder.encode_label())?;
        }
        Ok(())
    }
}

impl Collector for Published {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let snapshot = self.latest();
        // A name must appear once in an exposition: merge families that two
        // sources happened to share, keeping the first one's help and type.
        let mut order: Vec<&Family> = Vec::new();
        let mut extra: HashMap<&str, Vec<&Family>> = HashMap::new();
        for f in &snapshot.families {
            if order.iter().any(|o| o.name == f.name) {
                extra.entry(f.name).or_default().push(f);
            } else {
                order.push(f);
            }
        }
        for f in order {
            let metric_type = match f.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
                Kind::Histogram => MetricType::Histogram,
            };
            let mut family =
                encoder.encode_descriptor(f.name, f.help, f.unit.as_ref(), metric_type)?;
            let more = extra.get(f.name).map(Vec::as_slice).unwrap_or(&[]);
            for p in f
                .points
                .iter()
                .chain(more.iter().flat_map(|m| m.points.iter()))
            {
                // An empty label set is written without braces.
                if p.labels.is_empty() {
                    encode_value(&mut family, f.kind, &p.value)?;
                } else {
                    let labels = Pairs(&p.labels);
                    encode_value(&mut family.encode_family(&labels)?, f.kind, &p.value)?;
                }
            }
        }
        Ok(())
    }
}

fn encode_value(m: &mut MetricEncoder, kind: Kind, value: &Value) -> Result<(), fmt::Error> {
    match (value, kind) {
        (Value::Number(v), Kind::Counter) => m.encode_counter::<NoLabelSet, _, f64>(v, None),
        (Value::Number(v), _) => m.encode_gauge(v),
        (
            Value::Histogram {
                sum,
                count,
                buckets,
            },
            Kind::Histogram,
        ) => m.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None),
        // A histogram value in a scalar family is a source bug: skip it rather
        // than write an exposition Prometheus would reject.
        (Value::Histogram { .. }, _) => Ok(()),
    }
}
