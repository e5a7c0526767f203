//! Criterion benches of the per-window work: aggregation, warm symbolization and pprof encoding.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use ember::aggregate::{Aggregator, Parts, Window, Workloads};
use ember::config::{Jit, Limits};
use ember::metrics::Metrics;
use ember::model::Sample;
use ember::symbolize::Symbolizer;

fn limits() -> Limits {
    Limits {
        max_processes: 1024,
        max_objects: 1024,
        max_stacks_per_window: 100_000,
        ..Default::default()
    }
}

fn aggregator() -> Aggregator {
    aggregator_with(false)
}

/// An aggregator, with all three off-CPU windows when `offcpu`.
fn aggregator_with(offcpu: bool) -> Aggregator {
    Aggregator::new(Parts {
        frequency_hz: 99,
        limits: limits(),
        processes: ember::process::registry::start(
            &limits(),
            &Jit::default(),
            &Default::default(),
            Metrics::new(),
        )
        .expect("the process registry's thread")
        .0,
        offcpu,
        offwake: offcpu,
        lock: offcpu,
        offcpu_window: Duration::from_secs(10),
        python: Default::default(),
        queue_bytes: None,
        metrics: Metrics::new(),
        workloads: Workloads::default(),
    })
}

/// Addresses inside this benchmark's own code, so they normalize and symbolize for real.
fn own_addresses() -> Vec<u64> {
    let fns: [fn() -> Vec<u64>; 3] = [own_addresses, Vec::new, Vec::new];
    let base = fns[0] as *const () as u64;
    let other = samples as *const () as u64;
    (0..64)
        .map(|i| {
            if i % 2 == 0 {
                base + i * 4
            } else {
                other + i * 4
            }
        })
        .collect()
}

/// This process's start time as the sampler records it (`/proc/self/stat` field 22), so
/// the bench names stacks by pid and start time as the agent does.
fn own_start_time() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // After the name's closing parenthesis, field 3 (the state) is the first.
    let (_, rest) = stat.rsplit_once(')').expect("stat: name");
    rest.split_whitespace()
        .nth(22 - 3)
        .and_then(|f| f.parse().ok())
        .expect("stat: field 22")
}

/// 2000 samples (10 s × 99 Hz × 2 CPUs) over 200 distinct 20-frame stacks of this process.
fn samples() -> Vec<Sample> {
    let pid = std::process::id();
    let start_time = own_start_time();
    let addrs = own_addresses();
    (0..2000u64)
        .map(|i| {
            let k = (i % 200) as usize;
            Sample {
                time_ns: i,
                cgroup_id: 1,
                pid,
                start_time,
                tid: pid + (i % 4) as u32,
                cpu: (i % 2) as u32,
                comm: *b"bench\0\0\0\0\0\0\0\0\0\0\0",
                kernel: Vec::new(),
                user: (0..20).map(|f| addrs[(k + f) % addrs.len()]).collect(),
                user_exact: 0,
                user_eval: 0,
                python: Vec::new(),
                py_result: None,
                waker: None,
                lock: None,
                user_end: ember::model::StackEnd::Complete,
                off_cpu: None,
            }
        })
        .collect()
}

/// 2000 off-CPU block parts (a second of a host whose threads block 1,000 times a second
/// past `min_block`): the samples above, each with 12 kernel frames, asleep or (every third)
/// runnable, every other one a futex wait, each woken by one of 8 waker stacks.
fn offcpu_samples() -> Vec<Sample> {
    use ember::model::{LockWait, OffCpu, OffState};
    let kernel: Vec<u64> = (0..12).map(|f| 0xffff_ffff_8100_0000 + f * 0x40).collect();
    let wakers: Vec<Sample> = samples().into_iter().take(8).collect();
    samples()
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let state = if i % 3 == 2 {
                OffState::Runnable
            } else {
                OffState::Sleep
            };
            Sample {
                kernel: kernel.clone(),
                off_cpu: Some(OffCpu {
                    state,
                    ns: 1_000_000,
                    blocks: 1,
                }),
                lock: (i % 2 == 0).then_some(LockWait::Futex),
                waker: Some(Box::new(Sample {
                    kernel: kernel[..6].to_vec(),
                    ..wakers[i % 8].clone()
                })),
                ..s
            }
        })
        .collect()
}

fn window() -> Window {
    let mut agg = aggregator();
    for s in samples() {
        agg.add(s);
    }
    agg.close()
}

fn benches(c: &mut Criterion) {
    c.bench_function("aggregate 2000 samples + normalize", |b| {
        b.iter_batched(
            || (aggregator(), samples()),
            |(mut agg, samples)| {
                for s in samples {
                    agg.add(s);
                }
                black_box(agg.close())
            },
            BatchSize::LargeInput,
        )
    });

    // The steady state: one aggregator (and process table) for every window, as the agent
    // runs; the bench above pays a new table's first read of the process each time.
    let mut warm = aggregator();
    for s in samples() {
        warm.add(s);
    }
    black_box(warm.close());
    c.bench_function("aggregate 2000 samples + normalize, warm table", |b| {
        b.iter_batched(
            samples,
            |samples| {
                for s in samples {
                    warm.add(s);
                }
                black_box(warm.close())
            },
            BatchSize::LargeInput,
        )
    });

    c.bench_function(
        "aggregate 2000 off-CPU samples (wakers, futex) + normalize",
        |b| {
            b.iter_batched(
                || (aggregator_with(true), offcpu_samples()),
                |(mut agg, samples)| {
                    for s in samples {
                        agg.add(s);
                    }
                    black_box(agg.close_windows())
                },
                BatchSize::LargeInput,
            )
        },
    );

    let w = window();
    let mut sym = Symbolizer::new(100_000, Metrics::new());
    let _ = sym.symbolize(w.clone());
    c.bench_function("symbolize warm window", |b| {
        b.iter_batched(
            || w.clone(),
            |w| black_box(sym.symbolize(w)),
            BatchSize::LargeInput,
        )
    });

    let symbolized = sym.symbolize(w);
    c.bench_function("encode pprof + gzip", |b| {
        b.iter(|| {
            let p = ember::encode::pprof::encode(&symbolized);
            black_box(ember::encode::pprof::to_gzip(&p))
        })
    });
}

criterion_group! {
    name = pipeline;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = benches
}
criterion_main!(pipeline);
