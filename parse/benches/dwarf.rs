//! Criterion bench of DWARF lines in steady windows of a large binary, as an always-on agent
//! meets them: ember's own release binary (100 MB+, line tables of every codegen unit:
//! `EMBER_BIN`, else the workspace's `target/release/ember`, as `make bench` builds it) held
//! open across 30 windows, each asking for 8 addresses no earlier window asked for (the
//! frame cache answers the others), under the agent's default cap and its per-window read
//! share. What it measures is the cost of a unit arriving beside units already held.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use ember_parse::dwarf::Dwarf;
use ember_parse::elf_file::{ElfReader, DEFAULT_LIMITS};

/// `symbols.dwarf_bytes`'s default in the agent (`config/ember.yaml`).
const CAP: u64 = 12 << 20;

/// What a window may read on average: the agent refills a sixteenth of the cap per window.
const SHARE: u64 = CAP / 16;

/// `.symtab`'s section type.
const SYMTAB: u32 = 2;

/// Windows per iteration, and new addresses asked per window.
const WINDOWS: usize = 30;
const PER_WINDOW: usize = 8;

/// Function middles of `bytes`, in a fixed pseudo-random order.
fn addresses(bytes: &[u8]) -> Vec<u64> {
    let mut elf = ElfReader::new(bytes, DEFAULT_LIMITS).expect("headers");
    let mut addrs = Vec::new();
    elf.function_symbols(SYMTAB, |f| {
        if f.size > 8 {
            addrs.push(f.addr + f.size / 2);
        }
    })
    .expect("symbols");
    addrs.sort_unstable();
    addrs.dedup();
    // A fixed shuffle (an LCG), so runs and branches compare the same windows.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..addrs.len()).rev() {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        addrs.swap(i, (x >> 33) as usize % (i + 1));
    }
    addrs.truncate(WINDOWS * PER_WINDOW);
    addrs
}

fn steady(c: &mut Criterion) {
    let path = std::env::var("EMBER_BIN").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../target/release/ember").to_string()
    });
    let Ok(bytes) = std::fs::read(&path) else {
        eprintln!("dwarf bench: {path} not readable, skipped");
        return;
    };
    let addrs = addresses(&bytes);
    let open = || {
        let mut elf = ElfReader::new(&bytes[..], DEFAULT_LIMITS).expect("headers");
        Dwarf::open(&mut elf, CAP).expect("DWARF")
    };
    let mut lines = 0usize;
    let windows = |dwarf: &mut Dwarf, lines: &mut usize| {
        let mut read = 0;
        for window in addrs.chunks(PER_WINDOW) {
            // A new reader per window, as the agent opens the file per window.
            let mut elf = ElfReader::new(&bytes[..], DEFAULT_LIMITS).expect("headers");
            let looked = dwarf
                .lookup(&mut elf, window, SHARE, |_, chain| {
                    *lines += usize::from(chain.iter().any(|f| f.line > 0));
                })
                .expect("lookup");
            read += looked.bytes_read;
        }
        read
    };
    // What the windows read, for a cost per byte of DWARF.
    let started = std::time::Instant::now();
    let read = windows(&mut open(), &mut lines);
    let took = started.elapsed();
    println!(
        "dwarf steady: {} KiB of units read in {WINDOWS} windows, {:.0} ms, {:.1} ns/byte, {lines} of {} addresses with lines",
        read >> 10,
        took.as_secs_f64() * 1e3,
        took.as_nanos() as f64 / read.max(1) as f64,
        addrs.len()
    );
    c.bench_function(
        "dwarf: 30 steady windows of 8 new addresses, ember's binary",
        |b| {
            b.iter_batched(
                open,
                |mut dwarf| {
                    black_box(windows(&mut dwarf, &mut lines));
                    dwarf
                },
                BatchSize::PerIteration,
            )
        },
    );
    black_box(lines);
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = steady
}
criterion_main!(benches);
