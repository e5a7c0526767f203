//! Run-queue latency: how long runnable tasks wait for a CPU, host-wide and per container,
//! from the `sched_wakeup`, `sched_wakeup_new` and `sched_switch` tracepoints
//! (`agent/bpf/runqlat.bpf.c`, BCC runqlat's method) into in-kernel log2 histograms.
//!
//! Per-container histograms are keyed by the kernfs id of the task's cgroup in the
//! hierarchy that holds the `perf_event` controller (see `agent/bpf/ember.h`): on a cgroup
//! v2 host that is simply the task's cgroup; on hybrid hosts, whose v2 root is empty and
//! where `bpf_get_current_cgroup_id()` is 1 for every task, it is still the task's own
//! directory in whichever hierarchy carries `perf_event` — the same directory the agent
//! opens for per-container perf counters, from the same walk
//! ([`crate::workload::walk`], the [`walk::COUNTERS`] view). The agent creates a zeroed histogram for each container
//! it tracks (at most `max_containers`, the map's size) and deletes it when the container
//! goes, so the program never inserts and a full map cannot lose anything silently.

use std::collections::{HashMap, HashSet};
use std::mem::MaybeUninit;
use std::path::PathBuf;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, MapHandle, OpenObject};

use crate::config::Counters;
use crate::metrics::{Cache, Metrics, ReadingsSource};
use crate::readings::{Family, Interval, Kind, Point, ReadError, Source, Value};
use crate::workload::kube::Metadata;
use crate::workload::labels::container_labels;
use crate::workload::walk::{self, ContainerCgroup, Request};

#[allow(missing_docs, clippy::all, clippy::unwrap_used)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/runqlat.skel.rs"));
}
use skel::types::{ember_rq_counter, ember_rq_hist, ember_rq_limit};
use skel::RunqlatSkelBuilder;

/// Buckets of the in-kernel histogram (`EMBER_RQ_SLOTS`).
pub const SLOTS: usize = ember_rq_limit::EMBER_RQ_SLOTS.0 as usize;
/// Latencies are bucketed by log2 of `ns >> SHIFT` (`EMBER_RQ_SHIFT`).
pub const SHIFT: u32 = ember_rq_limit::EMBER_RQ_SHIFT.0;
const HIST_BYTES: usize = std::mem::size_of::<ember_rq_hist>();
const _: () = {
    use std::mem::offset_of;
    // `struct ember_rq_hist` and `enum ember_rq_counter` of `bpf/ember.h` (the rest of the
    // header is checked in `capture/abi.rs`).
    assert!(HIST_BYTES == 8 * (SLOTS + 1), "ember_rq_hist layout");
    assert!(offset_of!(ember_rq_hist, slots) == 0);
    assert!(offset_of!(ember_rq_hist, sum_ns) == 8 * SLOTS);
    assert!(ember_rq_counter::EMBER_RQ_CNT_EVENTS.0 == 0);
    assert!(ember_rq_counter::EMBER_RQ_CNT_START_FULL.0 == 1);
    assert!(ember_rq_counter::EMBER_RQ_CNT_MAX.0 == 2);
};

/// A histogram as the BPF program keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hist {
    /// Counts per log2 slot.
    pub slots: [u64; SLOTS],
    /// Sum of the latencies, nanoseconds.
    pub sum_ns: u64,
}

impl Default for Hist {
    fn default() -> Self {
        Self {
            slots: [0; SLOTS],
            sum_ns: 0,
        }
    }
}

impl Hist {
    /// Parses one `struct ember_rq_hist` value; `None` if too short.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() < HIST_BYTES {
            return None;
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[8 * i..8 * i + 8]);
            u64::from_ne_bytes(w)
        };
        let mut h = Hist::default();
        for (i, s) in h.slots.iter_mut().enumerate() {
            *s = word(i);
        }
        h.sum_ns = word(SLOTS);
        Some(h)
    }

    /// Adds another CPU's histogram.
    pub fn add(&mut self, o: &Hist) {
        for (a, b) in self.slots.iter_mut().zip(o.slots.iter()) {
            *a = a.saturating_add(*b);
        }
        self.sum_ns = self.sum_ns.saturating_add(o.sum_ns);
    }

    /// The exported value: seconds, non-cumulative buckets with the upper bound of slot `i`
    /// at `2^(i+1+SHIFT)` ns and the last slot at +Inf.
    pub fn value(&self) -> Value {
        let buckets = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, &n)| (upper_bound_seconds(i), n))
            .collect();
        Value::Histogram {
            sum: self.sum_ns as f64 / 1e9,
            count: self.slots.iter().sum(),
            buckets,
        }
    }
}

/// Upper bound of slot `i`, in seconds (+Inf for the last).
pub fn upper_bound_seconds(i: usize) -> f64 {
    if i + 1 >= SLOTS {
        f64::INFINITY
    } else {
        (1u64 << (i as u32 + 1 + SHIFT)) as f64 / 1e9
    }
}

/// The run-queue latency source (`source="runqlat"`): the attached programs and handles on
/// their maps.
pub struct Runqlat {
    _links: Vec<Link>,
    host: MapHandle,
    cgroups: MapHandle,
    counters: MapHandle,
    tracked: HashMap<u64, ContainerCgroup>,
    refused: HashSet<u64>,
    /// `counters.max_containers`: containers with their own histogram at most (the BPF
    /// map's size).
    max_containers: usize,
    root: Option<PathBuf>,
    metadata: Option<Metadata>,
    metrics: Metrics,
}

impl Runqlat {
    /// Loads and attaches the tracepoint programs.
    pub fn start(
        cfg: &Counters,
        metadata: Option<Metadata>,
        metrics: Metrics,
    ) -> Result<Self, libbpf_rs::Error> {
        // The skeleton borrows its object; the links and map handles taken from it below
        // outlive it, so one object per process is leaked rather than kept borrowed.
        let object: &'static mut MaybeUninit<OpenObject> =
            Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = RunqlatSkelBuilder::default().open(object)?;
        open.maps
            .rq_cgroups
            .set_max_entries(cfg.max_containers.clamp(1, u32::MAX as usize) as u32)?;
        let skel = open.load()?;
        let progs = &skel.progs;
        let links = vec![
            progs.ember_rq_wakeup.attach()?,
            progs.ember_rq_wakeup_new.attach()?,
            progs.ember_rq_switch.attach()?,
        ];
        let maps = &skel.maps;
        let root = walk::perf_event_root();
        Ok(Self {
            host: MapHandle::try_from(&maps.rq_host)?,
            cgroups: MapHandle::try_from(&maps.rq_cgroups)?,
            counters: MapHandle::try_from(&maps.rq_counters)?,
            _links: links,
            tracked: HashMap::new(),
            refused: HashSet::new(),
            max_containers: cfg.max_containers,
            root,
            metadata,
            metrics,
        })
    }

    fn rescan(&mut self, interval: &Interval) {
        let Some(root) = &self.root else { return };
        let Some(scan) = interval.cgroups.scan(root, walk::COUNTERS) else {
            return;
        };
        let present: HashMap<u64, &ContainerCgroup> =
            scan.containers.iter().map(|c| (c.inode, c)).collect();
        let gone: Vec<u64> = self
            .tracked
            .keys()
            .filter(|k| !present.contains_key(k))
            .copied()
            .collect();
        for k in gone {
            let _ = self.cgroups.delete(&k.to_ne_bytes());
            self.tracked.remove(&k);
        }
        self.refused.retain(|k| present.contains_key(k));
        let zero = [0u8; HIST_BYTES];
        for c in &scan.containers {
            if self.tracked.contains_key(&c.inode) || self.refused.contains(&c.inode) {
                continue;
            }
            if self.tracked.len() >= self.max_containers {
                self.refused.insert(c.inode);
                self.metrics.dropped(Cache::RunqueueContainers, 1);
                continue;
            }
            // NOEXIST: a stale entry (an inode reused before we saw the old one go) keeps
            // counting rather than being zeroed under a live reader.
            let _ = self
                .cgroups
                .update(&c.inode.to_ne_bytes(), &zero, MapFlags::NO_EXIST);
            self.tracked.insert(c.inode, c.clone());
        }
    }

    fn counter(&self, idx: ember_rq_counter) -> u64 {
        let key = idx.0.to_ne_bytes();
        self.counters
            .lookup_percpu(&key, MapFlags::ANY)
            .ok()
            .flatten()
            .map(|per_cpu| {
                per_cpu
                    .iter()
                    .filter_map(|v| v.get(..8).and_then(|b| b.try_into().ok()))
                    .map(u64::from_ne_bytes)
                    .sum()
            })
            .unwrap_or(0)
    }
}

impl Source for Runqlat {
    fn name(&self) -> ReadingsSource {
        ReadingsSource::Runqlat
    }

    fn cgroups(&self) -> Vec<Request> {
        Request::counters(self.root.as_ref())
    }

    fn read(&mut self, out: &mut Vec<Family>, interval: &Interval) -> Result<(), ReadError> {
        self.rescan(interval);
        let mut hist = Family::new(
            "runqueue_latency",
            "Time runnable tasks waited for a CPU (sched_wakeup/sched_switch), host-wide and per container",
            Some(prometheus_client::registry::Unit::Seconds),
            Kind::Histogram,
        );
        let per_cpu = self
            .host
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .map_err(|source| ReadError::Map {
                map: "rq_host",
                source,
            })?
            .unwrap_or_default();
        let mut host = Hist::default();
        for v in per_cpu.iter().filter_map(|b| Hist::from_bytes(b)) {
            host.add(&v);
        }
        hist.points.push(Point {
            labels: vec![],
            value: host.value(),
        });
        let meta = self.metadata.as_ref();
        for (inode, c) in &self.tracked {
            let Ok(Some(bytes)) = self.cgroups.lookup(&inode.to_ne_bytes(), MapFlags::ANY) else {
                continue;
            };
            if let Some(h) = Hist::from_bytes(&bytes) {
                hist.points.push(Point {
                    labels: container_labels(&c.container_id, None, meta),
                    value: h.value(),
                });
            }
        }
        let mut lost = Family::new(
            "runqueue_latency_lost",
            "Run-queue latencies not measured because the BPF map of enqueue times was full",
            None,
            Kind::Counter,
        );
        lost.push(
            vec![],
            self.counter(ember_rq_counter::EMBER_RQ_CNT_START_FULL) as f64,
        );
        let mut tracked = Family::new(
            "runqueue_containers",
            "Containers with their own run-queue latency histogram",
            None,
            Kind::Gauge,
        );
        tracked.push(vec![], self.tracked.len() as f64);
        out.extend([hist, lost, tracked]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_bytes_become_seconds_buckets() {
        let mut raw = vec![0u8; HIST_BYTES];
        raw[0..8].copy_from_slice(&3u64.to_ne_bytes()); // slot 0: < 2048 ns
        raw[8 * 5..8 * 6].copy_from_slice(&2u64.to_ne_bytes()); // slot 5: < 65536 ns
        raw[8 * (SLOTS - 1)..8 * SLOTS].copy_from_slice(&1u64.to_ne_bytes());
        raw[8 * SLOTS..].copy_from_slice(&9_000_000_000u64.to_ne_bytes());
        let mut h = Hist::from_bytes(&raw).unwrap();
        assert!(Hist::from_bytes(&raw[1..]).is_none());
        h.add(&h.clone());
        let Value::Histogram {
            sum,
            count,
            buckets,
        } = h.value()
        else {
            panic!("not a histogram")
        };
        assert_eq!(count, 12);
        assert_eq!(sum, 18.0);
        assert_eq!(buckets.len(), SLOTS);
        assert_eq!(buckets[0], (2048e-9, 6));
        assert_eq!(buckets[5], (65536e-9, 4));
        assert_eq!(buckets[SLOTS - 1], (f64::INFINITY, 2));
        assert!(buckets.windows(2).all(|w| w[0].0 < w[1].0));
    }
}
