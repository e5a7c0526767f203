//! Criterion bench of one readings interval on this machine: every USE source reads its
//! real files (/proc, /proc/1/net, /sys/class/net, the cgroup hierarchies) and the snapshot
//! is rendered as a scrape would render it.

use std::hint::black_box;
use std::time::{Duration, SystemTime};

use criterion::{criterion_group, criterion_main, Criterion};
use ember::config::Readings;
use ember::metrics::Metrics;
use ember::readings::{Interval, Snapshot};

fn interval(c: &mut Criterion) {
    let metrics = Metrics::new();
    let mut sources = ember::readings::resources::sources(&Readings::default(), None, &metrics)
        .expect("default filters");
    c.bench_function("readings: read every USE source once", |b| {
        b.iter(|| {
            let mut out = Vec::new();
            // The cgroup walk, once for every source, as the collector thread does it.
            let interval = Interval::gather(&sources);
            for s in sources.iter_mut() {
                // Unreadable files (no PSI, no cgroup v1 here) are the machine's, not the bench's.
                let _ = s.read(&mut out, &interval);
            }
            black_box(out)
        })
    });
    let mut out = Vec::new();
    let interval = Interval::gather(&sources);
    for s in sources.iter_mut() {
        let _ = s.read(&mut out, &interval);
    }
    metrics.readings.publish(Snapshot {
        time: SystemTime::now(),
        families: out,
    });
    c.bench_function("readings: render /metrics with the snapshot", |b| {
        b.iter(|| black_box(metrics.encode().len()))
    });
}

criterion_group! {
    name = readings;
    config = Criterion::default().measurement_time(Duration::from_secs(3));
    targets = interval
}
criterion_main!(readings);
