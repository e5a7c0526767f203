//! OTLP metrics: the same instruments as the Prometheus snapshot, pushed over gRPC with
//! opentelemetry-otlp.
//!
//! Every family of the latest [`crate::readings::Snapshot`] becomes one observable
//! instrument named [`Family::otlp_name`] (so `ember_perf_events_total` on /metrics is
//! `ember_perf_events_total` in OTLP), with the same labels as attributes; its callback
//! reads `metrics.readings.latest()` when the periodic reader collects, so OTLP never reads
//! a source itself. Counters are observable counters (cumulative), gauges observable
//! gauges. Families appear as sources first report them, so a task registers instruments
//! for new names each interval.
//!
//! Histograms: the SDK's histogram instrument only records single observations and cannot
//! take the pre-bucketed counts the kernel keeps, so a histogram family is exported the
//! way Prometheus exposes it: observable counters `<name>_bucket` (cumulative, attribute
//! `le`), `<name>_count` and `<name>_sum`. `histogram_quantile` over the receiver's
//! Prometheus view works unchanged.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use opentelemetry::metrics::{Meter, MeterProvider};
use opentelemetry::KeyValue;
use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::Resource;

use crate::config::{OtlpMetrics, Secret};
use crate::readings::{Family, Kind, Published, Value};

/// Why the exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    /// A header name or value gRPC cannot carry.
    #[error("otlp_metrics.headers: {0:?} is not a valid gRPC metadata key or value")]
    Header(String),
    /// The CA file could not be read or holds no usable certificate.
    #[error("otlp_metrics.ca_file: {0}")]
    Ca(#[source] crate::tls::TlsError),
    /// The exporter rejected its settings.
    #[error("otlp_metrics: {0}")]
    Build(String),
}

/// The running exporter; [`Exporter::shutdown`] pushes once more and stops.
pub struct Exporter {
    provider: SdkMeterProvider,
    task: tokio::task::JoinHandle<()>,
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}

/// The resource every metric carries: `service.name=ember`, `host.name`, and
/// `k8s.node.name` when known.
pub fn resource(node_name: Option<&str>) -> Resource {
    let mut attrs = vec![KeyValue::new("host.name", host_name())];
    if let Some(n) = node_name.filter(|n| !n.is_empty()) {
        attrs.push(KeyValue::new("k8s.node.name", n.to_owned()));
    }
    Resource::builder()
        .with_service_name("ember")
        .with_attributes(attrs)
        .build()
}

fn metadata(headers: &BTreeMap<String, Secret>) -> Result<tonic::metadata::MetadataMap, OtlpError> {
    let mut map = tonic::metadata::MetadataMap::new();
    for (k, v) in headers {
        let key = tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
            .map_err(|_| OtlpError::Header(k.clone()))?;
        let value = tonic::metadata::MetadataValue::try_from(v.0.as_str())
            .map_err(|_| OtlpError::Header(k.clone()))?;
        map.insert(key, value);
    }
    Ok(map)
}

/// Starts pushing `published` to `settings.endpoint`, with `k8s.node.name` set to
/// `node_name` when known; must be called inside a Tokio runtime, which then carries the
/// gRPC connection.
pub fn start(
    settings: &OtlpMetrics,
    node_name: Option<&str>,
    published: Published,
) -> Result<Exporter, OtlpError> {
    let mut builder = opentelemetry_otlp::MetricExporter::builder()
        .with_tonic()
        .with_endpoint(settings.endpoint.0.clone())
        .with_timeout(settings.timeout)
        .with_metadata(metadata(&settings.headers)?);
    if settings.endpoint.starts_with("https://") {
        let tls = crate::export::otlp::transport::tls(&settings.ca_file).map_err(OtlpError::Ca)?;
        builder = builder.with_tls_config(tls);
    }
    let exporter = builder
        .build()
        .map_err(|e| OtlpError::Build(e.to_string()))?;
    let reader = PeriodicReader::builder(exporter)
        .with_interval(settings.interval)
        .build();
    let provider = SdkMeterProvider::builder()
        .with_resource(resource(node_name))
        .with_reader(reader)
        .build();
    let meter = provider.meter("ember");
    let poll = settings.interval.min(Duration::from_secs(1));
    let task = tokio::spawn(async move {
        let mut instruments = Instruments::default();
        loop {
            instruments.sync(&meter, &published);
            tokio::time::sleep(poll).await;
        }
    });
    Ok(Exporter { provider, task })
}

impl Exporter {
    /// Pushes the latest values once more and stops. Blocks: call it off the runtime
    /// thread (`spawn_blocking`) so the runtime can carry the last export.
    pub fn shutdown(self) {
        self.task.abort();
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!("otlp_metrics: final export failed: {e}");
        }
    }
}

/// Instruments registered so far, by OTLP name.
#[derive(Default)]
struct Instruments {
    names: HashSet<String>,
    // The handles keep the callbacks registered.
    counters: Vec<opentelemetry::metrics::ObservableCounter<f64>>,
    gauges: Vec<opentelemetry::metrics::ObservableGauge<f64>>,
}

/// Most instruments registered, so a misbehaving source cannot grow them without bound.
const MAX_INSTRUMENTS: usize = 1024;

fn attributes(labels: &[(&'static str, String)]) -> Vec<KeyValue> {
    labels
        .iter()
        .map(|(k, v)| KeyValue::new(*k, v.clone()))
        .collect()
}

/// Every point of every family called `name` in the latest snapshot.
/// Where a callback reports one value with its attributes.
type Observe<'a> = &'a dyn Fn(f64, &[KeyValue]);

/// Reports every number point of the families named `name` in the latest snapshot
/// through `observe`: the body of both the counter and the gauge callbacks.
fn numbers(published: Published, name: String) -> impl Fn(Observe) {
    move |observe| {
        with_families(&published, &name, |fam| {
            for pt in &fam.points {
                if let Value::Number(v) = pt.value {
                    observe(v, &attributes(&pt.labels));
                }
            }
        })
    }
}

fn with_families(published: &Published, name: &str, mut f: impl FnMut(&Family)) {
    let s = published.latest();
    for fam in s.families.iter().filter(|fam| fam.otlp_name() == name) {
        f(fam);
    }
}

/// `(le-labelled cumulative buckets, count, sum)` of one histogram point.
pub type HistogramSeries = (Vec<(Vec<KeyValue>, f64)>, f64, f64);

/// The observations of one histogram point as Prometheus writes them: cumulative `le`
/// buckets, count and sum.
pub fn histogram_series(
    labels: &[(&'static str, String)],
    value: &Value,
) -> Option<HistogramSeries> {
    let Value::Histogram {
        sum,
        count,
        buckets,
    } = value
    else {
        return None;
    };
    let mut acc = 0u64;
    let mut out = Vec::with_capacity(buckets.len());
    for (bound, n) in buckets {
        acc = acc.saturating_add(*n);
        let mut a = attributes(labels);
        let le = if bound.is_infinite() {
            "+Inf".to_owned()
        } else {
            bound.to_string()
        };
        a.push(KeyValue::new("le", le));
        out.push((a, acc as f64));
    }
    Some((out, *count as f64, *sum))
}

fn unit_of(f: &Family) -> &'static str {
    match f.unit.as_ref().map(|u| u.as_str()) {
        Some("seconds") => "s",
        Some("bytes") => "By",
        _ => "1",
    }
}

impl Instruments {
    fn sync(&mut self, meter: &Meter, published: &Published) {
        let snapshot = published.latest();
        for f in &snapshot.families {
            let name = f.otlp_name();
            if self.names.contains(&name) || self.names.len() >= MAX_INSTRUMENTS {
                continue;
            }
            self.names.insert(name.clone());
            let p = published.clone();
            match f.kind {
                Kind::Counter => {
                    let observe = numbers(p, name.clone());
                    self.counters.push(
                        meter
                            .f64_observable_counter(name)
                            .with_description(f.help)
                            .with_unit(unit_of(f))
                            .with_callback(move |obs| observe(&|v, attrs| obs.observe(v, attrs)))
                            .build(),
                    );
                }
                Kind::Gauge => {
                    let observe = numbers(p, name.clone());
                    self.gauges.push(
                        meter
                            .f64_observable_gauge(name)
                            .with_description(f.help)
                            .with_unit(unit_of(f))
                            .with_callback(move |obs| observe(&|v, attrs| obs.observe(v, attrs)))
                            .build(),
                    );
                }
                Kind::Histogram => {
                    for part in ["bucket", "count", "sum"] {
                        let (n, p) = (name.clone(), p.clone());
                        self.counters.push(
                            meter
                                .f64_observable_counter(format!("{name}_{part}"))
                                .with_description(f.help)
                                .with_unit(if part == "sum" { unit_of(f) } else { "1" })
                                .with_callback(move |obs| {
                                    with_families(&p, &n, |fam| {
                                        for pt in &fam.points {
                                            let Some((buckets, count, sum)) =
                                                histogram_series(&pt.labels, &pt.value)
                                            else {
                                                continue;
                                            };
                                            match part {
                                                "bucket" => {
                                                    for (a, v) in &buckets {
                                                        obs.observe(*v, a);
                                                    }
                                                }
                                                "count" => {
                                                    obs.observe(count, &attributes(&pt.labels))
                                                }
                                                _ => obs.observe(sum, &attributes(&pt.labels)),
                                            }
                                        }
                                    })
                                })
                                .build(),
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_becomes_cumulative_le_series() {
        let v = Value::Histogram {
            sum: 0.5,
            count: 4,
            buckets: vec![(0.001, 1), (0.002, 0), (f64::INFINITY, 3)],
        };
        let (b, count, sum) = histogram_series(&[("pod", "p".into())], &v).unwrap();
        assert_eq!((count, sum), (4.0, 0.5));
        let got: Vec<(String, f64)> = b
            .iter()
            .map(|(a, v)| (a[1].value.as_str().into_owned(), *v))
            .collect();
        assert_eq!(
            got,
            vec![
                ("0.001".into(), 1.0),
                ("0.002".into(), 1.0),
                ("+Inf".into(), 4.0)
            ]
        );
        assert_eq!(b[0].0[0], KeyValue::new("pod", "p"));
        assert!(histogram_series(&[], &Value::Number(1.0)).is_none());
    }

    #[test]
    fn resource_names_the_service_host_and_node() {
        let r = resource(Some("node-1"));
        let get = |k: &'static str| r.get(&opentelemetry::Key::from_static_str(k));
        assert_eq!(
            get("service.name").map(|v| v.to_string()),
            Some("ember".into())
        );
        assert_eq!(
            get("k8s.node.name").map(|v| v.to_string()),
            Some("node-1".into())
        );
        assert!(get("host.name").is_some());
        assert!(resource(None)
            .get(&opentelemetry::Key::from_static_str("k8s.node.name"))
            .is_none());
    }

    #[test]
    fn bad_headers_are_refused() {
        let mut h = BTreeMap::new();
        h.insert("x-scope-orgid".into(), Secret("tenant".into()));
        assert!(metadata(&h).is_ok());
        h.insert("bad key".into(), Secret("v".into()));
        assert!(matches!(metadata(&h), Err(OtlpError::Header(_))));
    }
}
