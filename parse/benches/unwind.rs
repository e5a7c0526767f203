//! Criterion bench of the unwind table compiler on Debian's libc and python3 (target:
//! libc's table in at most 50 ms) and on ember's own binary (100 MB+: `EMBER_BIN`, else
//! the workspace's `target/release/ember`, as `make bench` builds it), with each table's
//! size: rows, bytes per row in BPF (the page index included), rows and BPF bytes per
//! MiB of CFI.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use ember_parse::unwind::{compile, DEFAULT_LIMITS};

/// The objects compiled: Debian's libc and python3, and ember's release binary.
fn objects() -> [(&'static str, String); 3] {
    let ember = std::env::var("EMBER_BIN").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../target/release/ember").to_string()
    });
    [
        ("libc", "/lib/x86_64-linux-gnu/libc.so.6".to_string()),
        ("python3", "/usr/bin/python3".to_string()),
        ("ember", ember),
    ]
}

fn tables(c: &mut Criterion) {
    for (name, path) in objects() {
        let Ok(bytes) = std::fs::read(&path) else {
            eprintln!("unwind bench: {path} not readable, skipped");
            continue;
        };
        let table = compile(&bytes, &DEFAULT_LIMITS).expect("compile");
        let s = &table.stats;
        let cfi_mib = (s.eh_frame_bytes + s.debug_frame_bytes) as f64 / (1 << 20) as f64;
        let rows = table.rows.len();
        println!(
            "unwind {name}: {} MiB object, {} KiB of CFI ({} FDEs) -> {rows} rows, {} pages, {} bytes in BPF \
             ({:.2} bytes/row), {:.0} rows and {:.0} KiB of BPF per MiB of CFI",
            bytes.len() >> 20,
            (s.eh_frame_bytes + s.debug_frame_bytes) / 1024,
            s.fdes,
            table.pages.len(),
            table.bpf_bytes(),
            table.bpf_bytes() as f64 / rows as f64,
            rows as f64 / cfi_mib,
            table.bpf_bytes() as f64 / 1024.0 / cfi_mib,
        );
        c.bench_function(&format!("unwind: compile {name}'s table"), |b| {
            b.iter(|| black_box(compile(black_box(&bytes), &DEFAULT_LIMITS)))
        });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = tables
}
criterion_main!(benches);
