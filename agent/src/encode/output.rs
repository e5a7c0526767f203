//! The output thread's loop: names the frames of each window aggregation closes, encodes
//! it, counts what it wrote, and hands it out (to the window files and sinks, through the
//! agent's callback).
//!
//! In: the aggregated [`Window`]s of each period (CPU, then the off-CPU kinds), named
//! together. Out: each [`Encoded`] window, to `on_window`.

use std::sync::mpsc::Receiver;
use std::time::Instant;

use crate::aggregate::Window;
use crate::encode::Encoded;
use crate::metrics::{FrameResult, Metrics, Stage, WindowFailure};
use crate::model::SymStack;
use crate::symbolize::Symbolizer;

/// The output thread: symbolizes each period's windows from `rx` together (one pass over
/// their objects), encodes each and hands it to `on_window`, until aggregation has sent its
/// last period. A window that cannot be compressed is dropped and counted.
pub fn run<F: FnMut(Encoded)>(
    rx: Receiver<Vec<Window>>,
    mut symbolizer: Symbolizer,
    metrics: Metrics,
    mut on_window: F,
) {
    let mut gzip = crate::encode::pprof::Gzip::new();
    for windows in rx {
        let started = Instant::now();
        metrics.progress.begin(Stage::Output);
        let named = symbolizer.symbolize_all(windows);
        // The period's naming is shared: each window's encode time includes its share.
        let share = started.elapsed() / u32::try_from(named.len()).unwrap_or(1).max(1);
        for window in named {
            let started = Instant::now();
            let encoded = match Encoded::new(window, &mut gzip) {
                Ok(encoded) => encoded,
                Err(e) => {
                    tracing::error!("could not compress a window, dropped: {e}");
                    metrics.window_failed(WindowFailure::Encode);
                    continue;
                }
            };
            metrics
                .window_encode_seconds
                .observe((started.elapsed() + share).as_secs_f64());
            hand_out(&metrics, encoded, &mut on_window);
        }
        metrics.progress.end(Stage::Output);
    }
}

/// Counts what `encoded` wrote and hands it to `on_window`.
fn hand_out<F: FnMut(Encoded)>(metrics: &Metrics, encoded: Encoded, on_window: &mut F) {
    metrics.windows.inc();
    let frames = encoded.frames;
    for (result, n) in [
        (FrameResult::Named, frames.named),
        (FrameResult::Unnamed, frames.unnamed),
        (FrameResult::Jit, frames.jit),
    ] {
        metrics.frames_written(result, n);
    }
    // Which workloads have broken names: unnamed frames by workload.
    for s in &encoded.window.stacks {
        let unnamed = s.frames.iter().filter(|f| !f.named && !f.is_jit()).count();
        if unnamed > 0 {
            metrics.unnamed_frames(s.labels.workload(&s.process), unnamed as u64);
        }
        if let Some(rt) = &s.runtime {
            count_interpreted(metrics, s, rt.name);
        }
    }
    on_window(encoded);
}

/// Counts `stack`'s interpreter frames, named and not, for its workload.
fn count_interpreted(metrics: &Metrics, stack: &SymStack, runtime: &'static str) {
    let (mut named, mut unnamed) = (0, 0);
    for f in stack.frames.iter().filter(|f| f.is_interpreted()) {
        if f.named {
            named += 1;
        } else {
            unnamed += 1;
        }
    }
    let workload = stack.labels.workload(&stack.process);
    for (result, n) in [(FrameResult::Named, named), (FrameResult::Unnamed, unnamed)] {
        if n > 0 {
            metrics.interpreter_frames_written(workload.clone(), runtime, result, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ProfileKind;
    use std::time::{Duration, SystemTime};

    #[test]
    fn every_window_is_encoded_counted_and_handed_out_in_order() {
        let (tx, rx) = std::sync::mpsc::sync_channel(4);
        let window = |at: u64, kind| Window {
            start: SystemTime::UNIX_EPOCH + Duration::from_secs(at),
            duration: Duration::from_secs(10),
            period_ns: 10_101_010,
            kind,
            stacks: Vec::new(),
        };
        let (cpu, off, lock) = (ProfileKind::Cpu, ProfileKind::OffCpu, ProfileKind::Lock);
        tx.send(vec![window(60, cpu), window(60, off), window(60, lock)])
            .expect("queued");
        tx.send(vec![window(70, cpu)]).expect("queued");
        drop(tx);
        let metrics = Metrics::new();
        let symbolizer = Symbolizer::new(16, metrics.clone());
        let mut out = Vec::new();
        run(rx, symbolizer, metrics.clone(), |e| out.push(e));
        let kinds: Vec<(ProfileKind, SystemTime)> = out
            .iter()
            .map(|e| (e.window.kind, e.window.start))
            .collect();
        let at = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        assert_eq!(
            kinds,
            [(cpu, at(60)), (off, at(60)), (lock, at(60)), (cpu, at(70))]
        );
        assert_eq!(out[0].samples, 0);
        assert_eq!(metrics.windows.get(), 4);
    }
}
