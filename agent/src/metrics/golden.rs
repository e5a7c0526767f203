//! Golden test of the text exposition: every family of [`Metrics`], each with one series,
//! encoded and compared byte for byte with `agent/src/metrics/testdata/exposition.txt`. It
//! pins each family's name, help, type, unit and label names (and the series created at
//! start), so a refactor of how metrics are declared shows no change here;
//! `EMBER_BLESS=1 cargo test -p ember --lib metrics::golden` rewrites the file after a
//! deliberate change (and the diff shows it in review).

use std::path::PathBuf;

use super::containers::{ContainerInfoLabels, ContainerLabels, ContainerOffCpuLabels};
use super::*;
use crate::model::OffState;

/// Creates a series in every family of `m` that starts without one (a family without
/// series is not written at all), with every value of each label enum.
pub(super) fn touch_every_family(m: &Metrics) {
    let c = ContainerLabels {
        namespace: "shop".into(),
        pod: "cart-7d9f".into(),
        container: "cart".into(),
        container_id: "a".repeat(64),
    };
    m.containers.sampled.get_or_create(&c).inc_by(1.5);
    m.containers
        .info
        .get_or_create(&ContainerInfoLabels {
            namespace: c.namespace.clone(),
            pod: c.pod.clone(),
            container: c.container.clone(),
            container_id: c.container_id.clone(),
            pod_uid: "0f1e2d3c-0000-4000-8000-000000000001".into(),
            node: "node-1".into(),
        })
        .set(1);
    for &state in OffState::ALL {
        m.containers
            .offcpu
            .get_or_create(&ContainerOffCpuLabels {
                namespace: c.namespace.clone(),
                pod: c.pod.clone(),
                container: c.container.clone(),
                container_id: c.container_id.clone(),
                state,
            })
            .inc_by(0.25);
    }
    m.containers.lock_wait.get_or_create(&c).inc_by(0.5);
    m.feature_enabled
        .get_or_create(&super::FeatureLabels {
            feature: "offcpu",
            reason: "refused",
        })
        .set(1);
    StackSide::ALL.iter().for_each(|&s| m.stack_error(s, 1));
    Cache::ALL.iter().for_each(|&c| m.dropped(c, 1));
    WindowFailure::ALL.iter().for_each(|&f| m.window_failed(f));
    ProcRead::ALL.iter().for_each(|&r| m.proc_read_error(r, 1));
    ReadingsSource::ALL
        .iter()
        .for_each(|&s| m.readings_error(s));
    JitReject::ALL.iter().for_each(|&r| m.jit_rejected(r, 1));
    JvmRefresh::ALL.iter().for_each(|&r| m.jvm_refreshed(r));
    SymbolMiss::ALL.iter().for_each(|&r| m.symbol_missed(r, 1));
    StackEnd::ALL
        .iter()
        .for_each(|&e| m.stacks_ended("shop/cart", e, 1));
    m.unnamed_frames("shop/cart".into(), 1);
    PyWalk::ALL
        .iter()
        .for_each(|&r| m.interpreter_stacks_ended("shop/cart", "python", r, 1));
    for r in [FrameResult::Named, FrameResult::Unnamed] {
        m.interpreter_frames_written("shop/cart".into(), "python", r, 1);
    }
    OffCpuEvent::ALL.iter().for_each(|&e| m.offcpu(e, 1));
    m.export.announce(SinkName::Pyroscope);
    m.export.drop(SinkName::Pyroscope, ExportDrop::Http(400), 1);
    let _ = m.export.series_folded.get_or_create(&SinkLabel {
        sink: SinkName::Pyroscope,
    });
}

/// The exposition of [`touch_every_family`]'s metrics, the agent's RSS (read from /proc on
/// encode) written as 0, and the series of each family sorted: a family keeps its series in
/// a hash map, so their order changes from run to run.
pub(super) fn exposition() -> String {
    let m = Metrics::new();
    touch_every_family(&m);
    let mut out = String::new();
    let mut series: Vec<String> = Vec::new();
    let flush = |out: &mut String, series: &mut Vec<String>| {
        series.sort();
        for l in series.drain(..) {
            out.push_str(&l);
            out.push('\n');
        }
    };
    for line in m.encode().lines() {
        if line.starts_with('#') {
            flush(&mut out, &mut series);
            out.push_str(line);
            out.push('\n');
        } else if line.starts_with("ember_process_resident_memory_bytes ") {
            series.push("ember_process_resident_memory_bytes 0".to_owned());
        } else {
            series.push(line.to_owned());
        }
    }
    flush(&mut out, &mut series);
    out
}

#[test]
fn exposition_matches_the_golden() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/metrics/testdata/exposition.txt");
    let text = exposition();
    if std::env::var_os("EMBER_BLESS").is_some() {
        std::fs::write(&path, &text).expect("writing the golden exposition");
        return;
    }
    let golden = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (EMBER_BLESS=1 writes it)", path.display()));
    if text != golden {
        let first = text
            .lines()
            .zip(golden.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(text.lines().count().min(golden.lines().count()));
        panic!(
            "the exposition differs from {} at line {}:\n  now:    {:?}\n  golden: {:?}\n\
             (EMBER_BLESS=1 rewrites it after a deliberate change)",
            path.display(),
            first + 1,
            text.lines().nth(first),
            golden.lines().nth(first)
        );
    }
}
