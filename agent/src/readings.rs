//! Resource readings: periodic snapshots of host and container metrics
//! (USE counters from /proc and cgroups, hardware and software counters,
//! run-queue latency) that more than one exporter renders.
//!
//! One collector thread asks every [`Source`] for its families each interval
//! and publishes the whole [`Snapshot`] at once. The Prometheus scrape and the
//! OTLP exporter both render the latest snapshot, so a scrape never opens a file
//! or reads a counter, never waits on a slow source, and never touches the
//! sampler; and both exporters show the same instruments with the same values.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

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

/// A producer of families, read once per interval on the collector thread.
pub trait Source: Send {
    /// Short name for logs and for `ember_readings_errors_total{source}`.
    fn name(&self) -> &'static str;
    /// Appends this source's families to `out`. An error is counted and the
    /// source is asked again next interval; a source that can partially read
    /// should push what it has and count the rest itself.
    fn read(&mut self, out: &mut Vec<Family>) -> Result<(), String>;
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

/// The collector thread: reads every source each interval and publishes the result.
pub struct Readings {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

/// How often the stop flag is checked while waiting for the next interval.
const STOP_POLL: Duration = Duration::from_millis(100);

impl Readings {
    /// Starts reading `sources` every `interval` into `metrics.readings`; the
    /// first snapshot is taken at once. Failed reads are counted in
    /// `ember_readings_errors_total{source}` and logged once per source.
    pub fn start(
        mut sources: Vec<Box<dyn Source>>,
        interval: Duration,
        metrics: crate::metrics::Metrics,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("ember-readings".into())
            .spawn(move || {
                let mut logged = vec![false; sources.len()];
                while !flag.load(Ordering::Relaxed) {
                    let began = Instant::now();
                    let mut families = Vec::new();
                    for (i, s) in sources.iter_mut().enumerate() {
                        if let Err(e) = s.read(&mut families) {
                            metrics
                                .readings_errors
                                .get_or_create(&crate::metrics::SourceLabel {
                                    source: s.name().to_owned(),
                                })
                                .inc();
                            if !logged[i] {
                                logged[i] = true;
                                tracing::warn!(source = s.name(), "readings: {e}");
                            }
                        }
                    }
                    metrics.readings.publish(Snapshot {
                        time: SystemTime::now(),
                        families,
                    });
                    while !flag.load(Ordering::Relaxed) && began.elapsed() < interval {
                        std::thread::sleep(STOP_POLL.min(interval.saturating_sub(began.elapsed())));
                    }
                }
            })?;
        Ok(Self { stop, thread })
    }

    /// Stops the thread and waits for it.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::Registry;

    fn exposition(p: &Published) -> String {
        let mut r = Registry::with_prefix("ember");
        r.register_collector(Box::new(p.clone()));
        let mut s = String::new();
        encode(&mut s, &r).unwrap();
        s
    }

    #[test]
    fn renders_counters_gauges_and_histograms() {
        let mut cpu = Family::new(
            "node_cpu",
            "CPU time by mode",
            Some(Unit::Seconds),
            Kind::Counter,
        );
        cpu.push(vec![("cpu", "0".into()), ("mode", "user".into())], 12.5);
        let mut load = Family::new("node_load1", "1-minute load", None, Kind::Gauge);
        load.push(vec![], 0.25);
        let mut rq = Family::new(
            "runqueue_latency",
            "Run-queue latency",
            Some(Unit::Seconds),
            Kind::Histogram,
        );
        rq.points.push(Point {
            labels: vec![],
            value: Value::Histogram {
                sum: 0.003,
                count: 3,
                buckets: vec![(0.001, 2), (f64::INFINITY, 1)],
            },
        });
        assert_eq!(cpu.otlp_name(), "ember_node_cpu_seconds_total");
        let p = Published::default();
        p.publish(Snapshot {
            time: SystemTime::now(),
            families: vec![cpu, load, rq],
        });
        let text = exposition(&p);
        assert!(
            text.contains("ember_node_cpu_seconds_total{cpu=\"0\",mode=\"user\"} 12.5"),
            "{text}"
        );
        assert!(text.contains("ember_node_load1 0.25"), "{text}");
        assert!(
            text.contains("ember_runqueue_latency_seconds_bucket{le=\"0.001\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("ember_runqueue_latency_seconds_bucket{le=\"+Inf\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("ember_runqueue_latency_seconds_count 3"),
            "{text}"
        );
    }

    struct Fixed(u32);
    impl Source for Fixed {
        fn name(&self) -> &'static str {
            "fixed"
        }
        fn read(&mut self, out: &mut Vec<Family>) -> Result<(), String> {
            self.0 += 1;
            if self.0 % 2 == 0 {
                return Err("even".into());
            }
            let mut f = Family::new("reads", "reads", None, Kind::Gauge);
            f.push(vec![], f64::from(self.0));
            out.push(f);
            Ok(())
        }
    }

    #[test]
    fn thread_publishes_and_counts_errors() {
        let metrics = crate::metrics::Metrics::new();
        let r = Readings::start(
            vec![Box::new(Fixed(0))],
            Duration::from_millis(20),
            metrics.clone(),
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !metrics
            .encode()
            .contains("ember_readings_errors_total{source=\"fixed\"} 2")
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        r.stop();
        let text = metrics.encode();
        assert!(
            text.contains("ember_readings_errors_total{source=\"fixed\"}"),
            "{text}"
        );
        assert!(metrics.readings.latest().time > SystemTime::UNIX_EPOCH);
    }

    #[test]
    fn same_name_from_two_sources_is_one_family() {
        let mut a = Family::new("x", "x", None, Kind::Gauge);
        a.push(vec![("k", "a".into())], 1.0);
        let mut b = Family::new("x", "x", None, Kind::Gauge);
        b.push(vec![("k", "b".into())], 2.0);
        let p = Published::default();
        p.publish(Snapshot {
            time: SystemTime::now(),
            families: vec![a, b],
        });
        let text = exposition(&p);
        assert_eq!(text.matches("# TYPE ember_x gauge").count(), 1, "{text}");
        assert!(text.contains("ember_x{k=\"b\"} 2"), "{text}");
    }
}
