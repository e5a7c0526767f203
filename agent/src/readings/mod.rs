//! Resource readings: periodic snapshots of host and container metrics
//! (USE counters from /proc and cgroups, hardware and software counters,
//! run-queue latency) that more than one exporter renders.
//!
//! One collector thread asks every [`Source`] for its families each interval
//! and publishes the whole [`Snapshot`] at once. The Prometheus scrape and the
//! OTLP exporter both render the latest snapshot, so a scrape never opens a file
//! or reads a counter, never waits on a slow source, and never touches the
//! sampler; and both exporters show the same instruments with the same values.
//!
//! Before asking, the thread walks the cgroup hierarchies the sources need, each
//! once ([`Interval`]), so every per-container source reads the same inventory.

pub(crate) mod otlp;
pub(crate) mod pmc;
pub mod resources;
pub(crate) mod runqlat;

/// Loads and attaches the run-queue latency programs once and lets go of them: whether
/// `counters.runqueue_latency` can run on this kernel (`ember features`).
pub fn probe_runqlat(cfg: &crate::config::Counters) -> Result<(), libbpf_rs::Error> {
    runqlat::Runqlat::start(cfg, None, crate::metrics::Metrics::new()).map(drop)
}

use std::fmt;
use std::path::PathBuf;
use std::sync::mpsc::{RecvTimeoutError, SyncSender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

pub use crate::metrics::snapshot::{Family, Kind, Point, Published, Snapshot, Value};
use crate::metrics::ReadingsSource;
use crate::workload::walk::{Inventory, Request};

/// A producer of families, read once per interval on the collector thread.
pub trait Source: Send {
    /// Which source this is, for logs and for `ember_readings_errors_total{source}`.
    fn name(&self) -> ReadingsSource;
    /// The cgroup hierarchies this source reads containers from this interval; the
    /// collector walks each once for all sources and hands the result to [`Source::read`].
    fn cgroups(&self) -> Vec<Request> {
        Vec::new()
    }
    /// Appends this source's families to `out`, given what was gathered for this
    /// `interval`. An error is counted and the source is asked again next interval; a
    /// source that can partially read should push what it has and return what failed.
    fn read(&mut self, out: &mut Vec<Family>, interval: &Interval) -> Result<(), ReadError>;
}

/// What the collector gathers once per interval and hands to every source.
#[derive(Debug, Default)]
pub struct Interval {
    /// The container cgroups of every hierarchy the sources asked for
    /// ([`Source::cgroups`]), from one walk of each: the USE readings and the counters
    /// see the same containers.
    pub cgroups: Inventory,
}

impl Interval {
    /// Gathers what `sources` need this interval: walks the cgroup hierarchies they ask for.
    pub fn gather(sources: &[Box<dyn Source>]) -> Self {
        let requests: Vec<Request> = sources.iter().flat_map(|s| s.cgroups()).collect();
        Self {
            cgroups: Inventory::walk(&requests),
        }
    }
}

/// Why a [`Source`] could not read (all or part of) what it reports. The log line shows it.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    File {
        /// The file, as the log names it.
        path: PathBuf,
        /// What the read said.
        source: std::io::Error,
    },
    /// A file's text is not in its format.
    #[error(transparent)]
    Parse(#[from] resources::ParseError),
    /// A container's file is not in its format.
    #[error("{container}: {source}")]
    Container {
        /// The container id.
        container: String,
        /// What is wrong with the file.
        source: resources::ParseError,
    },
    /// A BPF map could not be read.
    #[error("reading {map}: {source}")]
    Map {
        /// The map's name.
        map: &'static str,
        /// What libbpf said.
        source: libbpf_rs::Error,
    },
    /// Reads of open perf counters failed.
    #[error("{0} perf counter reads failed")]
    Counters(u64),
    /// Several parts failed (at least two); what could be read was reported.
    #[error("{}", Joined(.0))]
    Several(Vec<ReadError>),
}

impl ReadError {
    /// `Ok` when nothing failed, else the one error or all of them.
    pub fn collect(mut errors: Vec<ReadError>) -> Result<(), ReadError> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(ReadError::Several(errors)),
        }
    }
}

/// Errors shown one after the other, separated by `; `.
struct Joined<'a>(&'a [ReadError]);

impl fmt::Display for Joined<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// The collector thread: reads every source each interval and publishes the result.
pub struct Readings {
    /// Dropped to stop the thread: its wait ends at once (no polling between intervals).
    stop: SyncSender<()>,
    thread: JoinHandle<()>,
}

impl Readings {
    /// Starts reading `sources` every `interval` into `metrics.readings`; the
    /// first snapshot is taken at once. Failed reads are counted in
    /// `ember_readings_errors_total{source}` and logged once per source.
    pub fn start(
        mut sources: Vec<Box<dyn Source>>,
        interval: Duration,
        metrics: crate::metrics::Metrics,
    ) -> std::io::Result<Self> {
        let (stop, stopped) = std::sync::mpsc::sync_channel::<()>(0);
        let thread = std::thread::Builder::new()
            .name("ember-readings".into())
            .spawn(move || {
                let mut logged = vec![false; sources.len()];
                loop {
                    let began = Instant::now();
                    let mut families = Vec::new();
                    let gathered = Interval::gather(&sources);
                    for (i, s) in sources.iter_mut().enumerate() {
                        if let Err(e) = s.read(&mut families, &gathered) {
                            metrics.readings_error(s.name());
                            if !logged[i] {
                                logged[i] = true;
                                tracing::warn!(source = s.name().as_str(), "readings: {e}");
                            }
                        }
                    }
                    metrics.readings.publish(Snapshot {
                        time: SystemTime::now(),
                        families,
                    });
                    let next = interval.saturating_sub(began.elapsed());
                    if let Err(RecvTimeoutError::Disconnected) = stopped.recv_timeout(next) {
                        return;
                    }
                }
            })?;
        Ok(Self { stop, thread })
    }

    /// Stops the thread and waits for it.
    pub fn stop(self) {
        drop(self.stop);
        let _ = self.thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::{Registry, Unit};

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

    /// Fails every other read. Named `cpu`: sources are named by [`ReadingsSource`] only.
    struct Fixed(u32);
    impl Source for Fixed {
        fn name(&self) -> ReadingsSource {
            ReadingsSource::Cpu
        }
        fn read(&mut self, out: &mut Vec<Family>, _: &Interval) -> Result<(), ReadError> {
            self.0 += 1;
            if self.0 % 2 == 0 {
                return Err(ReadError::Counters(1));
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
            .contains("ember_readings_errors_total{source=\"cpu\"} 2")
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        r.stop();
        let text = metrics.encode();
        assert!(
            text.contains("ember_readings_errors_total{source=\"cpu\"}"),
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
