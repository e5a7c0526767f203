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

pub mod delivery;
pub mod files;
pub mod otlp;
pub mod pyroscope;

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::config;
use crate::encode::Encoded;
use crate::metrics::{ExportDrop, Metrics, WindowFailure, WindowWriteError};
use crate::symbolize::Symbolized;
use delivery::{Queue, Transport};
use files::WindowDir;

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
    fn encode(&mut self, window: &Symbolized) -> Result<Vec<(Self::Item, u64)>>;
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
    name: &'static str,
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
                tracing::warn!(sink = self.name, "could not encode a window: {e:#}");
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

/// Reads a secret: the file if one is named (trailing newline removed), else `inline`.
pub(crate) fn secret(inline: &str, file: &Path, key: &str) -> Result<String> {
    if file.as_os_str().is_empty() {
        return Ok(inline.to_owned());
    }
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("{key}: reading {}", file.display()))?;
    Ok(text.trim_end_matches(['\r', '\n']).to_owned())
}

/// Watches secret files (tokens, passwords) for rotation: Kubernetes swaps a mounted
/// Secret's files atomically, so a change of identity, size or modification time means
/// "read it again". A `stat` per request is cheap next to the request.
pub(crate) struct SecretFiles {
    files: Vec<(std::path::PathBuf, Option<Stamp>)>,
}

/// Device, inode, mtime (seconds, nanoseconds) and size of a file.
type Stamp = (u64, u64, i64, i64, u64);

impl SecretFiles {
    /// Watches the non-empty paths of `files`, as they are now.
    pub(crate) fn new<'a>(files: impl IntoIterator<Item = &'a Path>) -> Self {
        let files = files
            .into_iter()
            .filter(|p| !p.as_os_str().is_empty())
            .map(|p| (p.to_owned(), stamp(p)))
            .collect();
        Self { files }
    }

    /// Whether any file changed since the last call (or since [`SecretFiles::new`]).
    pub(crate) fn changed(&mut self) -> bool {
        let mut changed = false;
        for (path, last) in &mut self.files {
            let now = stamp(path);
            if now != *last {
                *last = now;
                changed = true;
            }
        }
        changed
    }
}

/// What identifies a file's content cheaply: device, inode, mtime and size (following
/// symlinks, as Kubernetes' `..data` link is swapped on update).
fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.size()))
}

/// Starts the configured sinks: `files` (if any) first, then each enabled
/// network sink with its queue and delivery task on the "ember-sinks" thread.
/// `host` names this machine in OTLP resources.
pub fn start(
    cfg: &config::Sinks,
    files: Option<Arc<WindowDir>>,
    host: &str,
    metrics: &Metrics,
) -> Result<(Dispatcher, Shutdown)> {
    let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
    if let Some(dir) = files {
        sinks.push(Box::new(Files::new(dir, metrics.clone())));
    }
    // One copy for the delivery tasks: they read the timeout and retry limits from it.
    let policy = Arc::new(cfg.clone());
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
        .context("starting the sinks' runtime")?;
    let mut tasks = Vec::new();
    {
        // Clients that connect lazily (tonic) need the runtime they will run on.
        let _guard = rt.enter();
        if cfg.pyroscope.enabled {
            let transport = pyroscope::Http::new(&cfg.pyroscope, cfg.timeout)?;
            let folded = metrics
                .export
                .series_folded
                .get_or_create(&crate::metrics::SinkLabel {
                    sink: pyroscope::NAME.to_owned(),
                })
                .clone();
            let encoder = pyroscope::Encoder::new(&cfg.pyroscope, folded);
            tasks.push(queue_sink(
                &rt,
                pyroscope::NAME,
                encoder,
                transport,
                &policy,
                metrics,
                &mut sinks,
                &mut shutdown,
            ));
            // `Url`'s Display leaves out any userinfo.
            tracing::info!(url = %cfg.pyroscope.url, api = ?cfg.pyroscope.api, "shipping windows to Pyroscope");
        }
        if cfg.otlp.enabled {
            let transport = otlp::Grpc::new(&cfg.otlp, cfg.timeout)?;
            let encoder = otlp::Encoder::new(&cfg.otlp, host);
            tasks.push(queue_sink(
                &rt,
                otlp::NAME,
                encoder,
                transport,
                &policy,
                metrics,
                &mut sinks,
                &mut shutdown,
            ));
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
        .context("starting the sinks' thread")?;
    shutdown.stop = Some(tx);
    shutdown.thread = Some(thread);
    Ok((Dispatcher { sinks }, shutdown))
}

type Runtime = tokio::runtime::Runtime;

/// Wires one network sink: its queue, its front half in `sinks`, its delivery
/// task on `rt`, and its shutdown hooks.
#[allow(clippy::too_many_arguments)]
fn queue_sink<E: Encode, T: Transport<Item = E::Item>>(
    rt: &Runtime,
    name: &'static str,
    encoder: E,
    transport: T,
    cfg: &Arc<config::Sinks>,
    metrics: &Metrics,
    sinks: &mut Vec<Box<dyn Sink>>,
    shutdown: &mut Shutdown,
) -> tokio::task::JoinHandle<()> {
    let queue = Arc::new(Queue::new(name, cfg.queue_bytes, metrics.export.clone()));
    sinks.push(Box::new(Queued {
        name,
        encoder,
        queue: queue.clone(),
        metrics: metrics.clone(),
    }));
    let q = queue.clone();
    shutdown.closers.push(Box::new(move || q.close()));
    let q = queue.clone();
    shutdown.abandon.push(Box::new(move || q.abandon()));
    rt.spawn(delivery::run(queue, transport, cfg.clone()))
}
