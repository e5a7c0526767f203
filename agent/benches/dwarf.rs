//! Criterion bench of what DWARF lines cost the symbolizer: a cold window (every address new
//! to the frame cache, as after a deploy) of the C++ inlining fixture
//! (`tests/fixtures/inline_hot.cc`, built here with `g++ -O2 -g`), symbolized with
//! `symbols.dwarf` on and off. Warm windows do not touch DWARF (the frame cache answers).
//! Needs g++ and to read the fixture's `/proc/PID/maps` (the same user does).

use std::hint::black_box;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use ember::aggregate::{Aggregator, Parts, Window, Workloads};
use ember::config::{Jit, Limits, Symbols};
use ember::metrics::Metrics;
use ember::model::Sample;
use ember::symbolize::Symbolizer;

/// The running fixture: killed on drop.
struct Fixture(Child);

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Builds and starts the fixture; its pid.
fn start(dir: &Path) -> Option<(Fixture, u32)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/inline_hot.cc");
    let bin = dir.join("inline_hot");
    let built = Command::new("g++")
        .args(["-O2", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .ok()?;
    if !built.success() {
        return None;
    }
    let mut child = Command::new(&bin).stdout(Stdio::piped()).spawn().ok()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take()?)
        .read_line(&mut line)
        .ok()?;
    let pid = line.trim().strip_prefix("pid ")?.parse().ok()?;
    Some((Fixture(child), pid))
}

/// The fixture's executable mapping: (start, end).
fn text(pid: u32) -> Option<(u64, u64)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (range, perms) = (f.next()?, f.next()?);
        if !perms.contains('x') || !l.ends_with("inline_hot") {
            return None;
        }
        let (lo, hi) = range.split_once('-')?;
        Some((
            u64::from_str_radix(lo, 16).ok()?,
            u64::from_str_radix(hi, 16).ok()?,
        ))
    })
}

/// A window of 2000 samples over 200 stacks of 4 frames, spread over the fixture's code.
fn window(pid: u32, (lo, hi): (u64, u64)) -> Window {
    let mut agg = Aggregator::new(Parts {
        frequency_hz: 99,
        limits: Limits::default(),
        processes: ember::process::registry::start(
            &Limits::default(),
            &Jit::default(),
            &Default::default(),
            Metrics::new(),
        )
        .expect("the process registry's thread")
        .0,
        offcpu: false,
        offwake: false,
        lock: false,
        offcpu_window: Duration::from_secs(10),
        python: Default::default(),
        queue_bytes: None,
        metrics: Metrics::new(),
        workloads: Workloads::default(),
    });
    let span = (hi - lo).min(0x2000);
    for i in 0..2000u64 {
        let k = i % 200;
        agg.add(Sample {
            time_ns: i,
            cgroup_id: 1,
            pid,
            start_time: 0,
            tid: pid,
            cpu: 0,
            comm: *b"inline_hot\0\0\0\0\0\0",
            kernel: Vec::new(),
            user: (0..4).map(|f| lo + (k * 13 + f * 101) % span).collect(),
            user_exact: 0,
            user_eval: 0,
            python: Vec::new(),
            py_result: None,
            user_end: ember::model::StackEnd::Complete,
            off_cpu: None,
            waker: None,
            lock: None,
        });
    }
    agg.close()
}

fn benches(c: &mut Criterion) {
    let Ok(dir) = tempfile::tempdir() else { return };
    let Some((_fixture, pid)) = start(dir.path()) else {
        eprintln!("dwarf bench skipped: g++ or the fixture did not run");
        return;
    };
    let Some(range) = text(pid) else {
        eprintln!("dwarf bench skipped: the fixture's maps are not readable");
        return;
    };
    let w = window(pid, range);
    for dwarf in [false, true] {
        let settings = Symbols {
            dwarf,
            ..Symbols::default()
        };
        let name = format!(
            "symbolize cold fixture window, dwarf {}",
            if dwarf { "on" } else { "off" }
        );
        c.bench_function(&name, |b| {
            b.iter_batched(
                || {
                    let sym = Symbolizer::with_settings(100_000, settings.clone(), Metrics::new());
                    (sym, w.clone())
                },
                |(mut sym, w)| black_box(sym.symbolize(w)),
                BatchSize::LargeInput,
            )
        });
    }
}

criterion_group! {
    name = dwarf;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = benches
}
criterion_main!(dwarf);
