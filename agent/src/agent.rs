//! Wires the stages together: capture → aggregate → symbolize → encode → a window callback.
//!
//! Each stage runs on its own thread and owns its state; stages hand each other owned
//! batches over bounded channels, and every `try_send` that finds a queue full counts
//! what it dropped. Stopping drains front to back, so the last window is complete.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::aggregate::{Aggregator, Window, Workloads};
use crate::capture::{Batch, Capture, CaptureError, Control, Settings};
use crate::encode::pprof;
use crate::encode::Encoded;
use crate::metrics::{Cache, FrameResult, Loss, Metrics};
use crate::normalize::process::Limits;
use crate::symbolize::Symbolizer;
use crate::workload::kube::Metadata;
use crate::workload::{Accounting, Filter};

/// How the pipeline is set up.
#[derive(Debug, Clone)]
pub struct Options {
    /// Capture settings.
    pub capture: Settings,
    /// Window length.
    pub window: Duration,
    /// Align window ends to multiples of `window` on the wall clock (for `run`).
    pub align: bool,
    /// Process and object caps.
    pub limits: Limits,
    /// Distinct stacks per window.
    pub max_stacks: usize,
    /// Symbolized frames cached between windows.
    pub symbol_cache: usize,
    /// Sample batches queued between capture and aggregation.
    pub queue_batches: usize,
    /// This node's name, for `ember_container_info`.
    pub node: String,
    /// Containers with CPU series at a time.
    pub max_containers: usize,
    /// JIT frames: perf maps, jitdumps, JVM refresh.
    pub jit: crate::config::Jit,
}

/// A running pipeline.
pub struct Pipeline {
    capture: Capture,
    aggregate: JoinHandle<()>,
    output: JoinHandle<()>,
}

/// Windows queued between aggregation and symbolization.
const WINDOW_QUEUE: usize = 2;
/// BPF deny/allow orders queued between aggregation and capture.
const CONTROL_QUEUE: usize = 4096;

impl Pipeline {
    /// Starts every stage; `on_window` runs on the output thread for each window.
    /// `metadata` names pods (when Kubernetes is enabled); `filter` decides what is profiled.
    pub fn start<F>(
        opts: Options,
        metrics: Metrics,
        metadata: Option<Metadata>,
        filter: Filter,
        on_window: F,
    ) -> Result<Self, CaptureError>
    where
        F: FnMut(Encoded) + Send + 'static,
    {
        let (batch_tx, batch_rx) = mpsc::sync_channel::<Batch>(opts.queue_batches);
        let (window_tx, window_rx) = mpsc::sync_channel::<Window>(WINDOW_QUEUE);
        let (control_tx, control_rx) = mpsc::sync_channel::<Control>(CONTROL_QUEUE);

        let accounting = Accounting::new(
            metrics.containers.clone(),
            opts.node.clone(),
            opts.max_containers,
        );
        let workloads = Workloads {
            metadata,
            filter,
            accounting: Some(accounting),
            control: Some(control_tx),
        };
        let mut agg = Aggregator::new(
            opts.capture.frequency_hz,
            opts.limits,
            opts.max_stacks,
            metrics.clone(),
            workloads,
        );
        agg.set_jit(opts.jit.clone());
        let (m, window, align) = (metrics.clone(), opts.window, opts.align);
        let aggregate = spawn("ember-aggregate", move || {
            aggregate_loop(batch_rx, window_tx, agg, window, align, m)
        })?;

        let (m, cache) = (metrics.clone(), opts.symbol_cache);
        // blazesym's symbolizer is not Send: it is born on the thread that uses it.
        let output = spawn("ember-output", move || {
            output_loop(window_rx, Symbolizer::new(cache, m.clone()), m, on_window)
        })?;

        let capture = Capture::start(opts.capture, batch_tx, control_rx, metrics)?;
        Ok(Self {
            capture,
            aggregate,
            output,
        })
    }

    /// Stops sampling, closes the current window and waits until it has been handed out.
    pub fn stop(self) {
        self.capture.stop();
        let _ = self.aggregate.join();
        let _ = self.output.join();
    }
}

fn spawn<F: FnOnce() + Send + 'static>(name: &str, f: F) -> Result<JoinHandle<()>, CaptureError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|_| CaptureError::Thread)
}

/// Time until the next window boundary: a multiple of `window` since the epoch when
/// aligned (so windows of many hosts line up), else a full window.
fn until_boundary(window: Duration, align: bool) -> Duration {
    if !align {
        return window;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let w = window.as_nanos().max(1);
    let left = w - now % w;
    // A first window shorter than a second is not worth a file: fold it into the next.
    let left = if left < 1_000_000_000 { left + w } else { left };
    Duration::from_nanos(u64::try_from(left).unwrap_or(u64::MAX))
}

fn aggregate_loop(
    rx: Receiver<Batch>,
    tx: SyncSender<Window>,
    mut agg: Aggregator,
    window: Duration,
    align: bool,
    metrics: Metrics,
) {
    let mut deadline = Instant::now() + until_boundary(window, align);
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(batch) => batch.into_iter().for_each(|s| agg.add(s)),
            Err(RecvTimeoutError::Timeout) => {
                let w = agg.close();
                let n = w.samples();
                if let Err(TrySendError::Full(_)) = tx.try_send(w) {
                    metrics.dropped(Cache::WindowQueue, 1);
                    metrics.lost(Loss::WindowQueue, n);
                }
                deadline = Instant::now() + until_boundary(window, align);
            }
            Err(RecvTimeoutError::Disconnected) => {
                // Capture has stopped and drained: the last window is complete.
                let _ = tx.send(agg.close());
                return;
            }
        }
    }
}

fn output_loop<F: FnMut(Encoded)>(
    rx: Receiver<Window>,
    mut symbolizer: Symbolizer,
    metrics: Metrics,
    mut on_window: F,
) {
    for window in rx {
        let started = Instant::now();
        let symbols = symbolizer.resolve(&window);
        let (profile, frames) = pprof::encode(&window, &symbols);
        let gz = match pprof::to_gzip(&profile) {
            Ok(gz) => gz,
            Err(e) => {
                tracing::error!("could not compress a window, dropped: {e}");
                metrics.dropped(Cache::WindowEncode, 1);
                continue;
            }
        };
        metrics
            .window_encode_seconds
            .observe(started.elapsed().as_secs_f64());
        metrics.windows.inc();
        for (result, n) in [
            (FrameResult::Named, frames.named),
            (FrameResult::Unnamed, frames.unnamed),
            (FrameResult::Jit, frames.jit),
        ] {
            metrics.frames_written(result, n);
        }
        on_window(Encoded {
            start: window.start,
            duration: window.duration,
            samples: window.samples(),
            profile,
            gz,
            frames,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_boundaries_land_on_multiples() {
        let w = Duration::from_secs(10);
        let left = until_boundary(w, true);
        assert!(
            left >= Duration::from_secs(1) && left <= Duration::from_secs(11),
            "{left:?}"
        );
        let end = SystemTime::now() + left;
        let ms = end
            .duration_since(UNIX_EPOCH)
            .expect("after epoch")
            .as_millis()
            % 10_000;
        assert!(!(50..9_950).contains(&ms), "ends {ms} ms past a boundary");
        assert_eq!(until_boundary(w, false), w);
    }
}
