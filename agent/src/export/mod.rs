//! Where windows go: the local window files and any number of network sinks
//! (Pyroscope, OTLP), all fed from the one stream of windows.
//!
//! The output thread hands each window to every [`Sink`] in turn. The files
//! sink writes at once (local disk). A network sink only encodes the window
//! into requests and pushes them onto its own bounded [`delivery::Queue`],
//! which never blocks; its delivery task sends them.
//!
//! All delivery tasks run on one dedicated thread with its own current-thread
//! Tokio runtime ("ember-sinks"), apart from the main runtime that serves HTTP
//! and watches pods: TLS handshakes, gzip and a backend that stalls stay off
//! the sampler, the output thread and the HTTP server. Tasks are async, so a
//! slow backend holds only its own task; the other sinks keep sending.
//!
//! ```text
//!  export/
//!    mod.rs       Sink, Dispatcher, start: wires every sink, shuts them down
//!    delivery.rs  the bounded queue and the send loop (timeouts, retries, drops)
//!    secrets.rs   secret files, read again when rotated
//!    setup.rs     why a sink could not start (SinkSetupError)
//!    files.rs     the local window files
//!    <sink>/      one network backend, everything of its own in one folder:
//!      config.rs    its `sinks.<sink>` keys (parsed by the config room: a leaf)
//!      encode.rs    the typed window in the backend's format
//!      request.rs   (pyroscope) the requests made of it
//!      transport.rs the client: TLS, headers, secrets, one attempt
//!      error.rs     what a reply means for delivery: sent, retried, dropped
//! ```

pub mod delivery;
pub mod files;
pub mod otlp;
pub mod pyroscope;
pub mod secrets;
pub mod setup;

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::config;
use crate::encode::Encoded;
use crate::metrics::{ExportDrop, Metrics, SinkName, WindowFailure, WindowWriteError};
use crate::model::Symbolized;
use delivery::{Queue, Transport};
use files::WindowDir;
pub use setup::SinkSetupError;

/// A destination for finished windows. `accept` runs on the output thread and
/// must not wait on the network.
pub trait Sink: Send {
    /// Takes one window.
    fn accept(&mut self, window: &Encoded);
}

/// Encodes windows into a network sink's requests (on the output thread), from the
/// typed window, not its pprof profile.
pub trait Encode: Send + 'static {
    /// One request, as queued.
    type Item: Send + 'static;
    /// The requests for one window, each with its size in bytes (for the queue cap).
    fn encode(&mut self, window: &Symbolized) -> Result<Vec<(Self::Item, u64)>, EncodeError>;
}

/// Why a window could not be encoded into a sink's requests (counted as dropped).
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// A request body could not be compressed.
    #[error(transparent)]
    Gzip(#[from] std::io::Error),
}

/// The local window files.
pub struct Files {
    dir: Arc<WindowDir>,
    metrics: Metrics,
    /// [`WindowDir::recreated`] as last counted.
    recreated: u64,
}

impl Files {
    /// Writes windows into `dir`.
    pub fn new(dir: Arc<WindowDir>, metrics: Metrics) -> Self {
        Self {
            dir,
            metrics,
            recreated: 0,
        }
    }
}

impl Sink for Files {
    fn accept(&mut self, w: &Encoded) {
        let result = self.dir.write_kind(w.start, w.window.kind, &w.gz);
        let recreated = self.dir.recreated();
        if recreated > self.recreated {
            self.metrics
                .window_write_error(WindowWriteError::DirRecreated, recreated - self.recreated);
            self.recreated = recreated;
        }
        if let Err(e) = result {
            tracing::error!("could not write a window: {e}");
            self.metrics.window_failed(WindowFailure::Write);
            let reason = match e.write_failure() {
                Some(files::WriteFailure::NoSpace) => WindowWriteError::NoSpace,
                Some(files::WriteFailure::ReadOnly) => WindowWriteError::ReadOnly,
                _ => WindowWriteError::Other,
            };
            self.metrics.window_write_error(reason, 1);
        }
    }
}

/// A network sink's front half: its encoder and its queue.
struct Queued<E: Encode> {
    name: SinkName,
    encoder: E,
    queue: Arc<Queue<E::Item>>,
    metrics: Metrics,
}

impl<E: Encode> Sink for Queued<E> {
    fn accept(&mut self, w: &Encoded) {
        match self.encoder.encode(&w.window) {
            Ok(requests) => {
                for (r, size) in requests {
                    self.queue.push(r, size);
                }
            }
            Err(e) => {
                self.metrics.export.drop(self.name, ExportDrop::Encode, 1);
                tracing::warn!(
                    sink = self.name.as_str(),
                    "could not encode a window: {e:#}"
                );
            }
        }
    }
}

/// Every sink, fed in order from the output thread.
pub struct Dispatcher {
    sinks: Vec<Box<dyn Sink>>,
}

impl Dispatcher {
    /// Hands `w` to every sink.
    pub fn accept(&mut self, w: &Encoded) {
        for s in &mut self.sinks {
            s.accept(w);
        }
    }
}

/// Stops the delivery thread, draining the queues for the grace period.
pub struct Shutdown {
    closers: Vec<Box<dyn Fn() + Send>>,
    abandon: Vec<Box<dyn Fn() -> u64 + Send>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    grace: Duration,
}

impl Shutdown {
    /// Closes every queue, lets the delivery tasks send what is queued for at
    /// most the grace period, then drops (and counts) what is left. Blocks.
    pub fn stop(mut self) {
        for close in &self.closers {
            close();
        }
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let left: u64 = self.abandon.iter().map(|a| a()).sum();
        if left > 0 {
            tracing::warn!(
                requests = left,
                grace = ?self.grace,
                "stopping: requests not delivered within sinks.shutdown_grace were dropped"
            );
        }
    }
}

/// Starts the configured sinks: `files` (if any) first, then each enabled
/// network sink with its queue and delivery task on the "ember-sinks" thread.
/// `host` names this machine in OTLP resources.
pub fn start(
    cfg: &config::Sinks,
    files: Option<Arc<WindowDir>>,
    host: &str,
    metrics: &Metrics,
) -> Result<(Dispatcher, Shutdown), SinkSetupError> {
    let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
    if let Some(dir) = files {
        sinks.push(Box::new(Files::new(dir, metrics.clone())));
    }
    let mut shutdown = Shutdown {
        closers: Vec::new(),
        abandon: Vec::new(),
        stop: None,
        thread: None,
        grace: cfg.shutdown_grace,
    };
    if !cfg.pyroscope.enabled && !cfg.otlp.enabled {
        return Ok((Dispatcher { sinks }, shutdown));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("ember-sinks")
        .build()
        .map_err(SinkSetupError::Runtime)?;
    let mut tasks = Vec::new();
    {
        // Clients that connect lazily (tonic) need the runtime they will run on.
        let _guard = rt.enter();
        let mut wire = Wiring {
            rt: &rt,
            // One copy for the delivery tasks: they read the timeout and retry limits from it.
            policy: Arc::new(cfg.clone()),
            metrics,
            sinks: &mut sinks,
            shutdown: &mut shutdown,
        };
        if cfg.pyroscope.enabled {
            let transport = pyroscope::Http::new(&cfg.pyroscope, cfg.timeout)?;
            let folded = metrics
                .export
                .series_folded
                .get_or_create(&crate::metrics::SinkLabel {
                    sink: pyroscope::NAME,
                })
                .clone();
            let encoder = pyroscope::Encoder::new(&cfg.pyroscope, folded);
            tasks.push(wire.queue(pyroscope::NAME, encoder, transport));
            // `Url`'s Display leaves out any userinfo.
            tracing::info!(url = %cfg.pyroscope.url, api = ?cfg.pyroscope.api, "shipping windows to Pyroscope");
        }
        if cfg.otlp.enabled {
            let transport = otlp::Grpc::new(&cfg.otlp, cfg.timeout)?;
            let encoder = otlp::Encoder::new(&cfg.otlp, host);
            tasks.push(wire.queue(otlp::NAME, encoder, transport));
            tracing::info!(endpoint = %cfg.otlp.endpoint, "shipping windows as OTLP profiles");
        }
    }
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let grace = cfg.shutdown_grace;
    let thread = std::thread::Builder::new()
        .name("ember-sinks".into())
        .spawn(move || {
            rt.block_on(async move {
                // Delivery runs while this waits; on stop, the queues are closed and
                // the tasks end once empty, or the grace period ends them.
                let _ = rx.await;
                let _ = tokio::time::timeout(grace, futures::future::join_all(tasks)).await;
            });
        })
        .map_err(SinkSetupError::Thread)?;
    shutdown.stop = Some(tx);
    shutdown.thread = Some(thread);
    Ok((Dispatcher { sinks }, shutdown))
}

type Runtime = tokio::runtime::Runtime;

/// What wiring a network sink needs: the sinks' runtime, the shared delivery policy and
/// metrics, and where its front half and shutdown hooks go.
struct Wiring<'a> {
    rt: &'a Runtime,
    policy: Arc<config::Sinks>,
    metrics: &'a Metrics,
    sinks: &'a mut Vec<Box<dyn Sink>>,
    shutdown: &'a mut Shutdown,
}

impl Wiring<'_> {
    /// Wires one network sink: its queue, its front half, its delivery task on the
    /// sinks' runtime, and its shutdown hooks.
    fn queue<E: Encode, T: Transport<Item = E::Item>>(
        &mut self,
        name: SinkName,
        encoder: E,
        transport: T,
    ) -> tokio::task::JoinHandle<()> {
        let export = self.metrics.export.clone();
        let queue = Arc::new(Queue::new(name, self.policy.queue_bytes, export));
        self.sinks.push(Box::new(Queued {
            name,
            encoder,
            queue: queue.clone(),
            metrics: self.metrics.clone(),
        }));
        let q = queue.clone();
        self.shutdown.closers.push(Box::new(move || q.close()));
        let q = queue.clone();
        self.shutdown.abandon.push(Box::new(move || q.abandon()));
        self.rt
            .spawn(delivery::run(queue, transport, self.policy.clone()))
    }
}
