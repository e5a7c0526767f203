//! The one composition root: starts every thread and subsystem of `ember run` and
//! `ember record` in order, and stops them in the reverse order within a deadline.
//!
//! In: the validated [`Config`] and this node's [`NodeName`]. Out: each finished window,
//! handed to the caller's callback (and, for `run`, to every sink).
//!
//! Start order (stop runs it backwards):
//! 1. the window directory (`run`);
//! 2. metrics, and the health clock `/healthz` reads;
//! 3. the HTTP listener (`run`, `server.enabled`), bound before BPF is loaded so a taken
//!    port fails at once;
//! 4. the sinks (`run`): window files, Pyroscope, OTLP profiles, on their own thread;
//! 5. the pod watcher (`kubernetes.enabled`), a task on the agent's runtime;
//! 6. OTLP metrics (`run`, `otlp_metrics.enabled`), on the agent's runtime;
//! 7. the pipeline: capture → aggregate → output (symbolize → encode → hand out, the loop
//!    of `encode::output`), one thread each, each stage made from one struct of its parts.
//!    Stages hand each other owned batches (the types of [`crate::model`]) over bounded
//!    channels, and every `try_send` that finds a queue full counts what it dropped.
//!    Stopping drains front to back, so the last window is complete;
//! 8. the readings thread (`run`): USE readings, perf counters, run-queue latency;
//! 9. the HTTP server (`run`), started right after the listener (3.) so that /healthz
//!    answers while the sampler loads; it is stopped first, as if started here.
//!
//! The window directory, metrics, the listener and the pod watcher need no stop of their
//! own: they go with the agent (the listener with the server, the watcher with the runtime).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::aggregate::{self, Aggregator, Closes, Window, Workloads};
use crate::capture::tasks::{TaskLink, TaskWatch};
use crate::capture::{self, Batch, Capture, CaptureError, Control, UnwindLink, Work, WorkSender};
use crate::config::selector::SelectorError;
use crate::config::{Config, NodeName};
use crate::encode::{self, Encoded};
use crate::export::files::{FilesError, WindowDir};
use crate::metrics::Metrics;
use crate::os::privileges;
use crate::os::signals::{runtime, stop_signal, StopSignals};
use crate::process::registry::{self, Registry};
use crate::process::unwind;
use crate::readings::otlp::OtlpError;
use crate::readings::{self, Readings};
use crate::server::{self, Health};
use crate::symbolize::debuginfod::Debuginfod;
use crate::symbolize::Symbolizer;
use crate::workload::kube::{self, Metadata};
use crate::workload::{Accounting, Filter};

/// What the agent is started for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `ember run`: windows of `window.duration`, aligned on the wall clock, go to the
    /// window files and every sink; readings, OTLP metrics and the HTTP server run too.
    /// [`Agent::wait`] returns on SIGTERM or SIGINT.
    Run,
    /// `ember record`: one unaligned window, closed when recording stops, goes to the
    /// callback only; no files, sinks, readings or server. [`Agent::wait_until`] returns
    /// when its future ends (the duration, the recorded processes' exit) or on SIGTERM or
    /// SIGINT.
    Record {
        /// How long the recording may last, when bounded: what the shutdown deadline
        /// allows for the one window (unbounded: [`RECORD_STOP_WINDOW`]).
        duration: Option<Duration>,
    },
    /// `ember top`: windows of `window`, unaligned, go to the callback only, as for
    /// `Record`; [`Agent::wait_until`] returns as it does for `Record`.
    Live {
        /// The window length (the screen's refresh).
        window: Duration,
    },
}

/// Why the agent could not start, or did not stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// ember lacks a privilege it cannot work without; the sentence names it.
    #[error("{0}")]
    Privileges(String),
    /// The window directory could not be opened.
    #[error("opening the data directory {}", path.display())]
    DataDir {
        /// `output.data_dir`.
        path: PathBuf,
        /// Why.
        source: FilesError,
    },
    /// The async runtime could not be built.
    #[error("starting the async runtime")]
    Runtime(#[source] std::io::Error),
    /// `server.listen` or `server.metrics_listen` could not be bound.
    #[error("listening on {addr}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The profiles listener's token file could not be written.
    #[error("writing the profiles listener's token to {}", path.display())]
    Token {
        /// `output.data_dir/ui-token`.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A sink could not start.
    #[error(transparent)]
    Sinks(crate::export::SinkSetupError),
    /// A pod selector of `filters:` is invalid.
    #[error(transparent)]
    Filter(#[from] SelectorError),
    /// The OTLP metrics exporter could not start.
    #[error(transparent)]
    OtlpMetrics(#[from] OtlpError),
    /// The sampler (or a pipeline thread) could not start.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// A `readings.*_exclude` expression is invalid.
    #[error("readings: a device filter is not a valid regular expression")]
    DeviceFilter(#[source] regex::Error),
    /// The readings thread could not start.
    #[error("starting the readings thread")]
    Readings(#[source] std::io::Error),
    /// Stopping took longer than the shutdown deadline; what was still running was abandoned.
    #[error("stopping took longer than {limit:?} ({part} had not stopped): abandoned what was still running")]
    Deadline {
        /// The shutdown deadline.
        limit: Duration,
        /// The part being stopped when time ran out.
        part: &'static str,
    },
}

/// Time to stop what has no time limit of its own in the config: the sampler (a 200 ms
/// poll), the readings thread, the server's in-flight requests.
const STOP_MARGIN: Duration = Duration::from_secs(5);

/// What the shutdown deadline allows for symbolizing and encoding `record`'s one window,
/// at most (a recording bounded by less gets its own length).
pub const RECORD_STOP_WINDOW: Duration = Duration::from_secs(60);

/// A part that has a stop of its own, in the order started.
enum Part {
    Sinks(crate::export::Shutdown),
    OtlpMetrics(readings::otlp::Exporter),
    Pipeline(Pipeline),
    Readings(Readings),
    Server {
        stop: tokio::sync::oneshot::Sender<()>,
        task: tokio::task::JoinHandle<std::io::Result<()>>,
    },
}

impl Part {
    fn name(&self) -> &'static str {
        match self {
            Part::Sinks(_) => "the sinks",
            Part::OtlpMetrics(_) => "OTLP metrics",
            Part::Pipeline(_) => "the pipeline",
            Part::Readings(_) => "the readings thread",
            Part::Server { .. } => "the HTTP server",
        }
    }

    /// Stops the part; blocking stops run off the runtime thread so the runtime can carry
    /// what they wait for (the server's last requests, OTLP's last export).
    async fn stop(self) {
        let blocking: Box<dyn FnOnce() + Send> = match self {
            Part::Server { stop, task } => {
                let _ = stop.send(());
                let _ = task.await;
                return;
            }
            // The last window is queued now; the sinks get sinks.shutdown_grace to send it.
            Part::Sinks(s) => Box::new(move || s.stop()),
            Part::OtlpMetrics(e) => Box::new(move || e.shutdown()),
            Part::Pipeline(p) => Box::new(move || p.stop()),
            Part::Readings(r) => Box::new(move || r.stop()),
        };
        let _ = tokio::task::spawn_blocking(blocking).await;
    }
}

/// A running agent: [`Agent::start`], [`Agent::wait`], [`Agent::stop`].
pub struct Agent {
    /// Carries the pod watcher, OTLP metrics and the HTTP server, while [`Agent::wait`]
    /// and [`Agent::stop`] run on it.
    rt: tokio::runtime::Runtime,
    /// SIGTERM and SIGINT, taken by [`Agent::wait`].
    signals: std::sync::Mutex<Option<StopSignals>>,
    mode: Mode,
    /// Started parts with a stop of their own, in start order.
    parts: Vec<Part>,
    /// Total time [`Agent::stop`] may take.
    deadline: Duration,
    /// The agent's metrics ([`Agent::progress`]).
    metrics: Metrics,
}

impl Agent {
    /// Starts everything `mode` needs, in the order of the module doc. `on_window` runs on
    /// the output thread with each finished window and the samples lost since the previous
    /// one (for `run`, before the sinks get the window).
    pub fn start<F>(
        cfg: &Config,
        node: &NodeName,
        mode: Mode,
        mut on_window: F,
    ) -> Result<Self, AgentError>
    where
        F: FnMut(&Encoded, u64) + Send + 'static,
    {
        if let Some(sentence) = privileges::check() {
            return Err(AgentError::Privileges(sentence));
        }
        if let Some(warning) = privileges::effective().and_then(privileges::degraded) {
            tracing::warn!("{warning}");
        }
        let run = mode == Mode::Run;
        let windows = run.then(|| open_windows(&cfg.output)).transpose()?;
        let metrics = Metrics::new();
        let health = Health::new(cfg.window.duration);
        let loading = Arc::new(AtomicBool::new(true));
        if run {
            add_health_checks(&health, cfg, &metrics, windows.as_ref(), &loading);
        }
        let (rt, signals) = runtime().map_err(AgentError::Runtime)?;
        let listener = if run && cfg.server.enabled {
            Some(
                rt.block_on(server::bind(&cfg.server))
                    .map_err(|(addr, source)| AgentError::Listen { addr, source })?,
            )
        } else {
            None
        };
        let mut parts = Vec::new();
        // The server first: it answers from the first second. It stops first too (it is
        // put in `parts` last): its requests' drain must not wait behind the last window.
        let server = serve(
            &rt,
            listener,
            cfg,
            &metrics,
            windows.clone(),
            health.clone(),
        )?;
        let mut dispatch = if run {
            let (dispatch, shutdown) =
                crate::export::start(&cfg.sinks, windows.clone(), &node.name, &metrics)
                    .map_err(AgentError::Sinks)?;
            parts.push(Part::Sinks(shutdown));
            Some(dispatch)
        } else {
            None
        };
        let filter = Filter::new(&cfg.filters)?;
        let meta = cfg
            .kubernetes
            .enabled
            .then(|| rt.block_on(kube::start(&cfg.kubernetes, &node.name)));
        if run && cfg.otlp_metrics.enabled {
            parts.push(otlp_metrics(&rt, cfg, node, &metrics)?);
        }
        let (h, m) = (health.clone(), metrics.clone());
        let mut last_lost = 0;
        let on_window = move |enc: Encoded| {
            let lost = m.lost_total();
            on_window(&enc, lost - last_lost);
            last_lost = lost;
            if let Some(d) = &mut dispatch {
                d.accept(&enc);
            }
            h.beat();
        };
        let (closes, deadline_window) = closes(mode, cfg);
        let pipeline = Pipeline::start(
            cfg,
            PipelineParts {
                node: node.name.clone(),
                closes,
                metrics: metrics.clone(),
                metadata: meta.clone(),
                filter,
                on_window,
            },
        )?;
        parts.push(Part::Pipeline(pipeline));
        loading.store(false, Ordering::Relaxed);
        parts.extend(server);
        if run {
            // After the sampler: its perf events are the first ember opens (tests wait on them).
            let sources = reading_sources(cfg, meta.as_ref(), &metrics)?;
            if !sources.is_empty() {
                let r = Readings::start(sources, cfg.readings.interval, metrics.clone())
                    .map_err(AgentError::Readings)?;
                parts.push(Part::Readings(r));
            }
            tracing::info!(
                "profiling every CPU at {} Hz; windows of {:?} go to {}",
                cfg.sampling.frequency_hz,
                cfg.window.duration,
                cfg.output.data_dir.display()
            );
        }
        Ok(Self {
            rt,
            signals: std::sync::Mutex::new(signals),
            mode,
            parts,
            deadline: stop_deadline(cfg, run, deadline_window),
            metrics,
        })
    }

    /// What loaded on this kernel: each feature's state (`record` says when the one it was
    /// asked for does not run here).
    pub fn features(&self) -> Option<&crate::capture::LoadReport> {
        self.parts.iter().find_map(|p| match p {
            Part::Pipeline(p) => Some(p.capture.report()),
            _ => None,
        })
    }

    /// Blocks until SIGTERM or SIGINT. The pod watcher, OTLP metrics and the HTTP server
    /// run meanwhile.
    pub fn wait(&self) {
        self.wait_until(std::future::pending());
    }

    /// Blocks until `until` ends (run on the agent's runtime: timers and fds work in it)
    /// or SIGTERM or SIGINT comes.
    pub fn wait_until(&self, until: impl std::future::Future<Output = ()>) {
        let signals = self
            .signals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.rt.block_on(async {
            tokio::select! {
                _ = until => {}
                _ = stop_signal(signals) => {}
            }
        });
    }

    /// Samples taken and samples lost so far (`record`'s progress line).
    pub fn progress(&self) -> (u64, u64) {
        (self.metrics.samples.get(), self.metrics.lost_total())
    }

    /// Stops every part in the reverse order of start, the pipeline handing out its last
    /// window first. If that takes longer than the shutdown deadline, whatever is still
    /// running is abandoned (the process is expected to exit) and the error says so.
    pub fn stop(self) -> Result<(), AgentError> {
        let Self {
            rt,
            mode,
            parts,
            deadline,
            signals: _,
            metrics: _,
        } = self;
        if mode == Mode::Run {
            tracing::info!("stopping: flushing the current window");
        }
        let mut part = "";
        let stop_all = async {
            for p in parts.into_iter().rev() {
                part = p.name();
                p.stop().await;
            }
        };
        // The timer must be made on the runtime: inside `block_on`, not before it.
        let stopped = rt.block_on(async { tokio::time::timeout(deadline, stop_all).await });
        if stopped.is_err() {
            // Dropping the runtime would wait for its blocking threads, the stuck one too.
            rt.shutdown_background();
            return Err(AgentError::Deadline {
                limit: deadline,
                part,
            });
        }
        // Everything stopped; what is left on the blocking pool is heavy HTTP work told to
        // stop (it ends at its next check) or a read stuck on a file: never wait long.
        rt.shutdown_timeout(Duration::from_secs(1));
        Ok(())
    }
}

/// When windows close, and the window the shutdown deadline allows for: `record`'s one
/// window closes when recording stops, never on a timer.
fn closes(mode: Mode, cfg: &Config) -> (Closes, Duration) {
    match mode {
        Mode::Run => (
            Closes::Every {
                window: cfg.window.duration,
                align: true,
            },
            cfg.window.duration,
        ),
        Mode::Live { window } => (
            Closes::Every {
                window,
                align: false,
            },
            window,
        ),
        Mode::Record { duration } => (
            Closes::AtEnd,
            duration.map_or(RECORD_STOP_WINDOW, |d| d.min(RECORD_STOP_WINDOW)),
        ),
    }
}

/// The shutdown deadline: the last window (of length `window`) must be handed out
/// (symbolizing and encoding it takes less than one window, or `run` could not keep up),
/// OTLP metrics get their last export (otlp_metrics.timeout), the sinks send the last
/// window (sinks.shutdown_grace), and STOP_MARGIN covers the rest.
fn stop_deadline(cfg: &Config, run: bool, window: Duration) -> Duration {
    let otlp = if run && cfg.otlp_metrics.enabled {
        cfg.otlp_metrics.timeout
    } else {
        Duration::ZERO
    };
    window + otlp + cfg.sinks.shutdown_grace + STOP_MARGIN
}

/// Starts the OTLP metrics exporter (`otlp_metrics.enabled`, `run`).
fn otlp_metrics(
    rt: &tokio::runtime::Runtime,
    cfg: &Config,
    node: &NodeName,
    metrics: &Metrics,
) -> Result<Part, AgentError> {
    let o = &cfg.otlp_metrics;
    // The exporter's tasks and connection live on the agent's runtime.
    let _guard = rt.enter();
    let e = readings::otlp::start(o, node.known(), metrics.readings.clone())?;
    tracing::info!(
        "pushing OTLP metrics to {} every {:?}",
        o.endpoint,
        o.interval
    );
    Ok(Part::OtlpMetrics(e))
}

/// Opens the window directory (`output.data_dir`), keeping at most `keep_windows` windows
/// and `keep_bytes` bytes.
fn open_windows(o: &crate::config::Output) -> Result<Arc<WindowDir>, AgentError> {
    let dir = WindowDir::open(&o.data_dir, o.keep_windows, o.keep_bytes).map_err(|source| {
        AgentError::DataDir {
            path: o.data_dir.clone(),
            source,
        }
    })?;
    Ok(Arc::new(dir))
}

/// `/readyz` while the sampler loads.
#[derive(Debug, thiserror::Error)]
#[error("loading the BPF programs")]
struct Loading;

/// The checks `/healthz` and `/readyz` run beside the window clock (`run`): stuck stages,
/// and the window directory's faults.
///
/// Until the sampler runs (`loading`), /readyz fails and /healthz says so in its 200 body:
/// a kernel's verifier may take seconds over the programs, and a probe must not mistake
/// that for a hung agent.
fn add_health_checks(
    health: &Health,
    cfg: &Config,
    metrics: &Metrics,
    windows: Option<&Arc<WindowDir>>,
    loading: &Arc<AtomicBool>,
) {
    let l = loading.clone();
    health.add_readiness_check("bpf", move || {
        if l.load(Ordering::Relaxed) {
            Err(Loading)
        } else {
            Ok(())
        }
    });
    // A stage stuck this long fails /healthz (`health.stall_windows`, plus the
    // grace the window check allows a loaded machine).
    if cfg.health.stall_windows > 0 {
        let stall = cfg.window.duration.saturating_mul(cfg.health.stall_windows);
        metrics
            .progress
            .set_limit(stall.saturating_add(server::HEALTH_GRACE));
    }
    let stages = metrics.progress.clone();
    health.add_check("stages", move || stages.check());
    // The window directory reports its faults (full, read-only) until a write
    // succeeds: readiness only, since a restart cannot empty a disk (liveness is
    // the pipeline's progress, which goes on: windows still reach the sinks).
    if let Some(dir) = windows {
        let dir = dir.clone();
        health.add_readiness_check("window files", move || dir.health());
    }
}

/// Starts the HTTP server on `listener` (on the agent's runtime), saying where it serves;
/// none without a listener (`record`, `server.enabled: false`).
fn serve(
    rt: &tokio::runtime::Runtime,
    listener: Option<server::Listeners>,
    cfg: &Config,
    metrics: &Metrics,
    windows: Option<Arc<WindowDir>>,
    health: Arc<Health>,
) -> Result<Option<Part>, AgentError> {
    let (Some(listener), Some(windows)) = (listener, windows) else {
        return Ok(None);
    };
    let local =
        server::announce(&listener, &cfg.server, &cfg.output.data_dir).map_err(|source| {
            AgentError::Token {
                path: cfg.output.data_dir.join(server::LOCAL_TOKEN_FILE),
                source,
            }
        })?;
    if let Some(addr) = listener.metrics_addr() {
        tracing::info!("serving /metrics, /healthz and /readyz on http://{addr}/");
    }
    if let Some(addr) = listener.health_addr() {
        tracing::info!("serving the probes' /healthz and /readyz on http://{addr}/");
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = rt.spawn(server::serve(
        listener,
        cfg.server.clone(),
        metrics.clone(),
        windows,
        health,
        local,
        async {
            let _ = stopped.await;
        },
    ));
    Ok(Some(Part::Server { stop, task }))
}

/// Every source the readings thread reads each `readings.interval` (resource metrics shown
/// on /metrics and sent by the exporters): USE readings (`readings:`), perf counters and
/// run-queue latency (`counters:`). A counter source that cannot start is logged once and
/// left out; profiling goes on.
fn reading_sources(
    cfg: &Config,
    meta: Option<&Metadata>,
    metrics: &Metrics,
) -> Result<Vec<Box<dyn readings::Source>>, AgentError> {
    let mut sources = readings::resources::sources(&cfg.readings, meta.cloned(), metrics)
        .map_err(AgentError::DeviceFilter)?;
    let c = &cfg.counters;
    if c.perf {
        match readings::pmc::Pmc::start(c, meta.cloned(), metrics.clone()) {
            Ok(p) => {
                tracing::info!("perf counters: {} fds open", p.fds_open());
                sources.push(Box::new(p));
            }
            Err(e) => tracing::warn!("perf counters are off: {e}"),
        }
    }
    if c.runqueue_latency {
        match readings::runqlat::Runqlat::start(c, meta.cloned(), metrics.clone()) {
            Ok(r) => sources.push(Box::new(r)),
            Err(e) => tracing::warn!("run-queue latency is off: {e}"),
        }
    }
    Ok(sources)
}

/// The capture → aggregate → output threads.
struct Pipeline {
    capture: Capture,
    /// The unwind loader's thread and its halt flag (it also ends when capture stops asking,
    /// after serving the process registry until the aggregator is gone).
    unwind: Option<(JoinHandle<()>, LoaderHalt)>,
    aggregate: JoinHandle<()>,
    output: JoinHandle<()>,
}

/// Data pages of each CPU's task record ring (exec, mmap, exit; ~100 bytes a record).
const TASK_RING_PAGES: usize = 16;

/// What stops the unwind loader: its halt flag, and its queue to wake it.
type LoaderHalt = (Arc<AtomicBool>, WorkSender);
/// Periods queued between aggregation and symbolization (each its CPU window and, with
/// off-CPU, its off-CPU, `offwake` and `lock` ones, named together).
const WINDOW_QUEUE: usize = 2;
/// BPF deny/allow orders queued between aggregation and capture.
const CONTROL_QUEUE: usize = 4096;

/// What the pipeline is wired from, besides the config.
struct PipelineParts<F> {
    /// This node's name, for the per-container series.
    node: String,
    /// When windows close: aligned on the wall clock (`run`), or once at the end (`record`).
    closes: Closes,
    /// Where every stage counts.
    metrics: Metrics,
    /// Names pods (when Kubernetes is enabled).
    metadata: Option<Metadata>,
    /// Decides what is profiled.
    filter: Filter,
    /// Runs on the output thread with each window.
    on_window: F,
}

impl Pipeline {
    /// Starts the stages, the sampler last (it returns once attached); `on_window` runs
    /// on the output thread for each window.
    fn start<F>(cfg: &Config, parts: PipelineParts<F>) -> Result<Self, CaptureError>
    where
        F: FnMut(Encoded) + Send + 'static,
    {
        let PipelineParts {
            node,
            closes,
            metrics,
            metadata,
            filter,
            on_window,
        } = parts;
        let (batch_tx, batch_rx) = mpsc::sync_channel::<Batch>(cfg.limits.sample_queue_batches);
        let queue_bytes = crate::capture::QueueBytes::new(cfg.limits.sample_queue_bytes);
        let (window_tx, window_rx) = mpsc::sync_channel::<Vec<Window>>(WINDOW_QUEUE);
        let (control_tx, control_rx) = mpsc::sync_channel::<Control>(CONTROL_QUEUE);

        let accounting = Accounting::new(
            &metrics,
            node,
            cfg.limits.max_processes,
            crate::workload::accounting::MAX_BYTES,
        );
        let python = &cfg.interpreters.python;
        let (processes, registry) =
            registry::channel(&cfg.limits, &cfg.jit, python, metrics.clone());
        let agg = Aggregator::new(aggregate::Parts {
            frequency_hz: cfg.sampling.frequency_hz,
            limits: cfg.limits.clone(),
            processes,
            offcpu: cfg.offcpu.enabled,
            offwake: cfg.offcpu.wakers,
            lock: cfg.offcpu.locks,
            offcpu_window: cfg.offcpu.window,
            python: cfg.interpreters.python.clone(),
            queue_bytes: Some(queue_bytes.clone()),
            metrics: metrics.clone(),
            workloads: Workloads {
                metadata,
                filter,
                accounting: Some(accounting),
                control: Some(control_tx),
            },
        });
        // The sampler before the aggregator: no window opens (and none is written, empty)
        // while the kernel verifies the programs.
        let (capture, link) = Capture::start(capture::Parts {
            sampling: cfg.sampling.clone(),
            offcpu: cfg.offcpu.clone(),
            windows: match closes {
                Closes::Every {
                    window,
                    align: true,
                } => Some(window),
                Closes::Every { align: false, .. } | Closes::AtEnd => None,
            },
            batches: batch_tx,
            budget: queue_bytes,
            control: control_rx,
            metrics: metrics.clone(),
        })?;
        let aggregate = spawn("ember-aggregate", move || {
            agg.run(batch_rx, window_tx, closes)
        })?;

        let (m, cache) = (metrics.clone(), cfg.limits.symbol_cache_entries);
        let symbols = cfg.symbols.clone();
        let data_dir = cfg.output.data_dir.clone();
        let output = spawn("ember-output", move || {
            let fetcher = Debuginfod::start(&symbols, &data_dir, m.clone());
            let symbolizer =
                Symbolizer::with_settings(cache, symbols, m.clone()).with_debuginfod(fetcher);
            encode::output::run(window_rx, symbolizer, m, on_window)
        })?;

        let unwind = start_unwind(cfg, link, registry, metrics)?;
        Ok(Self {
            capture,
            aggregate,
            output,
            unwind,
        })
    }

    /// Stops sampling, closes the current window and waits until it has been handed out.
    fn stop(self) {
        // The loader may be busy reading a whole host's processes: it stops between two.
        if let Some((_, (halt, wake))) = &self.unwind {
            halt.store(true, Ordering::Relaxed);
            // Asleep until work comes: this is its work. A full queue wakes it anyway.
            let _ = wake.try_send(Work::Wake);
        }
        self.capture.stop();
        if let Some((unwind, _)) = self.unwind {
            let _ = unwind.join();
        }
        let _ = self.aggregate.join();
        let _ = self.output.join();
    }
}

/// The unwind loader (`ember-unwind`) and the task record reader that feeds it
/// (`ember-tasks`), when the sampler walks tables (`link.maps`). The reader is not joined:
/// it sleeps up to five seconds between records, and the loader stops it when it returns.
/// The loader's thread owns the process `registry`; without a loader the registry gets a
/// thread of its own (`ember-process`, not joined: it ends with the aggregator's handle).
fn start_unwind(
    cfg: &Config,
    link: UnwindLink,
    registry: Registry,
    metrics: Metrics,
) -> Result<Option<(JoinHandle<()>, LoaderHalt)>, CaptureError> {
    let alone = |r: Registry| r.spawn().map(|_| None).map_err(|_| CaptureError::Thread);
    let Some(maps) = link.maps else {
        return alone(registry);
    };
    let settings = unwind::Settings {
        max_bytes: cfg.sampling.unwind_max_bytes,
        cache_dir: Some(cfg.sampling.unwind_cache_dir.clone())
            .filter(|d| !d.as_os_str().is_empty()),
        python: cfg.interpreters.python.enabled,
        subprocesses: cfg.sampling.subprocesses,
    };
    let mut loader = match unwind::Loader::new(maps, settings, metrics.clone()) {
        Ok(loader) => loader,
        Err(e) => {
            tracing::warn!("unwind tables disabled: {e}; stacks use frame pointers");
            return alone(registry);
        }
    };
    registry.wake_with(link.sender.clone());
    loader.own_registry(registry);
    let tasks = match TaskWatch::open_online(TASK_RING_PAGES) {
        Ok(watch) => {
            let tasks = TaskLink::default();
            let (tx, m, l) = (link.sender.clone(), metrics, tasks.clone());
            let reader = std::thread::Builder::new().name("ember-tasks".into());
            match reader.spawn(move || capture::tasks::forward(watch, tx, m, l)) {
                Ok(_detached) => Some(tasks),
                Err(e) => {
                    tracing::warn!(
                        "cannot start the task record reader ({e}): processes load at first sample"
                    );
                    None
                }
            }
        }
        Err(e) => {
            tracing::warn!(
                "not following exec/mmap/exit ({e}): processes are loaded for unwinding at \
                 their first sample"
            );
            None
        }
    };
    let halt = (loader.halt_handle(), link.sender.clone());
    let preload = cfg.sampling.pids.clone();
    let reader = tasks.clone();
    match spawn("ember-unwind", move || {
        loader.run(&preload, link.work, tasks)
    }) {
        Ok(thread) => Ok(Some((thread, halt))),
        Err(e) => {
            if let Some(reader) = reader {
                reader.stop();
            }
            Err(e)
        }
    }
}

fn spawn<F: FnOnce() + Send + 'static>(name: &str, f: F) -> Result<JoinHandle<()>, CaptureError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|_| CaptureError::Thread)
}
