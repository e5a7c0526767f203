//! The `ember` command: `run` (the agent), `record` (one-shot) and `check-config`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use ember::agent::{Options, Pipeline};
use ember::config::Config;
use ember::encode::flamegraph;
use ember::encode::Encoded;
use ember::export::files::WindowDir;
use ember::metrics::Metrics;
use ember::normalize::process;
use ember::os::privileges;
use ember::workload::Filter;
use ember::{capture, server};

/// ember: an always-on eBPF continuous profiler.
#[derive(Parser)]
#[command(name = "ember", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Profile continuously: one pprof file per window, metrics and flame graphs over HTTP (the default).
    Run(RunArgs),
    /// Profile once for a while and write one profile (.pb.gz, .folded or .svg).
    Record(RecordArgs),
    /// Check a configuration file; errors name the line and column.
    CheckConfig {
        /// The YAML file.
        file: PathBuf,
    },
}

/// Flags shared by `run` and `record`; each overrides the config key of the same meaning.
#[derive(Args, Default)]
struct Common {
    /// YAML configuration layered over the embedded default.
    #[arg(long, short = 'c')]
    config: Option<PathBuf>,
    /// Samples per second per CPU (sampling.frequency_hz).
    #[arg(long)]
    frequency: Option<u64>,
    /// Only these processes (sampling.pids); repeat for several.
    #[arg(long = "pid")]
    pids: Vec<u32>,
}

#[derive(Args, Default)]
struct RunArgs {
    #[command(flatten)]
    common: Common,
    /// Directory for window files (output.data_dir).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// HTTP listen address (server.listen).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Window length, e.g. 10s (window.duration).
    #[arg(long, value_parser = humantime::parse_duration)]
    window: Option<Duration>,
}

#[derive(Args)]
struct RecordArgs {
    #[command(flatten)]
    common: Common,
    /// How long to record, e.g. 30s.
    #[arg(long, short = 'd', default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Output file: .pb.gz (pprof), .folded (collapsed stacks) or .svg (flame graph).
    #[arg(long, short = 'o')]
    output: PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Run(RunArgs::default())) {
        Command::Run(args) => run(args),
        Command::Record(args) => record(args),
        Command::CheckConfig { file } => check_config(&file),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ember: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn check_config(file: &Path) -> Result<()> {
    Config::load(file)?;
    println!("{}: ok", file.display());
    Ok(())
}

fn load(common: &Common) -> Result<Config> {
    let mut cfg = match &common.config {
        Some(path) => Config::load(path)?,
        None => Config::from_yaml(ember::config::DEFAULT_YAML, "<embedded config/ember.yaml>")?,
    };
    if let Some(hz) = common.frequency {
        cfg.sampling.frequency_hz = hz;
    }
    if !common.pids.is_empty() {
        cfg.sampling.pids = common.pids.clone();
    }
    Ok(cfg)
}

fn init_logging(cfg: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&cfg.log.level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

fn require_privileges() -> Result<()> {
    if let Some(sentence) = privileges::check() {
        bail!("{sentence}");
    }
    if let Some(warning) = privileges::effective().and_then(privileges::degraded) {
        tracing::warn!("{warning}");
    }
    Ok(())
}

/// This node's name: the config key, else `NODE_NAME` (the downward API), else the host name.
fn node_name(cfg: &Config) -> String {
    if !cfg.kubernetes.node_name.is_empty() {
        return cfg.kubernetes.node_name.clone();
    }
    std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_default()
        })
}

/// Starts the pod watcher (on the current runtime) when Kubernetes is enabled.
async fn metadata(cfg: &Config) -> Option<ember::workload::kube::Metadata> {
    if !cfg.kubernetes.enabled {
        return None;
    }
    let kubeconfig = &cfg.kubernetes.kubeconfig;
    Some(
        ember::workload::kube::start(ember::workload::kube::KubeSettings {
            enabled: true,
            node_name: Some(node_name(cfg)),
            kubeconfig: (!kubeconfig.as_os_str().is_empty()).then(|| kubeconfig.clone()),
        })
        .await,
    )
}

fn options(cfg: &Config, window: Duration, align: bool) -> Options {
    Options {
        node: node_name(cfg),
        max_containers: cfg.limits.max_processes,
        capture: capture::Settings {
            frequency_hz: cfg.sampling.frequency_hz,
            event: cfg.sampling.event,
            include_idle: cfg.sampling.include_idle,
            ring_buffer_bytes: cfg.sampling.ring_buffer_bytes,
            pids: cfg.sampling.pids.clone(),
        },
        window,
        align,
        limits: process::Limits {
            max_processes: cfg.limits.max_processes,
            max_objects: cfg.limits.max_objects,
        },
        max_stacks: cfg.limits.max_stacks_per_window,
        symbol_cache: cfg.limits.symbol_cache_entries,
        queue_batches: cfg.limits.sample_queue_batches,
        jit: cfg.jit.clone(),
    }
}

/// Every source the readings thread reads each `readings.interval` (resource metrics shown
/// on /metrics and sent by the exporters): USE readings (`readings:`), perf counters and
/// run-queue latency (`counters:`). A counter source that cannot start is logged once and
/// left out; profiling goes on.
fn reading_sources(
    cfg: &Config,
    meta: Option<&ember::workload::kube::Metadata>,
    metrics: &Metrics,
) -> Result<Vec<Box<dyn ember::readings::Source>>> {
    let mut sources = ember::readings::resources::sources(&cfg.readings, meta.cloned(), metrics)
        .context("readings: a device filter is not a valid regular expression")?;
    let c = &cfg.counters;
    if c.perf {
        let settings = ember::readings::pmc::Settings {
            max_containers: c.max_containers,
            cgroup_root: None,
        };
        match ember::readings::pmc::Pmc::start(settings, meta.cloned(), metrics.clone()) {
            Ok(p) => {
                tracing::info!("perf counters: {} fds open", p.fds_open());
                sources.push(Box::new(p));
            }
            Err(e) => tracing::warn!("perf counters are off: {e}"),
        }
    }
    if c.runqueue_latency {
        let settings = ember::readings::runqlat::Settings {
            max_containers: c.max_containers,
            cgroup_root: None,
        };
        match ember::readings::runqlat::Runqlat::start(settings, meta.cloned(), metrics.clone()) {
            Ok(r) => sources.push(Box::new(r)),
            Err(e) => tracing::warn!("run-queue latency is off: {e}"),
        }
    }
    Ok(sources)
}

/// `k8s.node.name` for OTLP: only when configured or given by the downward API (never the
/// host name guessed in host mode).
fn known_node_name(cfg: &Config) -> Option<String> {
    Some(cfg.kubernetes.node_name.clone())
        .filter(|n| !n.is_empty())
        .or_else(|| std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()))
}

/// One line per window: when, how many samples, how many lost, the three hottest functions.
fn summary(w: &Encoded, lost: u64) -> String {
    let stamp = time::OffsetDateTime::from(w.start)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let top: Vec<String> = flamegraph::top_functions(&w.profile, 3)
        .into_iter()
        .map(|(name, n)| format!("{name} {:.1}%", 100.0 * n as f64 / w.samples.max(1) as f64))
        .collect();
    format!(
        "ember: window {stamp} {:.1}s: {} samples, {lost} lost; top: {}",
        w.duration.as_secs_f64(),
        w.samples,
        if top.is_empty() {
            "-".to_owned()
        } else {
            top.join(", ")
        }
    )
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers, wait forever: the default action still ends the process.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

fn run(args: RunArgs) -> Result<()> {
    let mut cfg = load(&args.common)?;
    if let Some(dir) = args.data_dir {
        cfg.output.data_dir = dir;
    }
    if let Some(listen) = args.listen {
        cfg.server.listen = listen;
    }
    if let Some(w) = args.window {
        cfg.window.duration = w;
    }
    init_logging(&cfg);
    require_privileges()?;
    let windows = Arc::new(
        WindowDir::open(
            &cfg.output.data_dir,
            cfg.output.keep_windows,
            cfg.output.keep_bytes,
        )
        .with_context(|| {
            format!(
                "opening the data directory {}",
                cfg.output.data_dir.display()
            )
        })?,
    );
    let metrics = Metrics::new();
    let health = server::Health::new(cfg.window.duration);
    let rt = runtime()?;
    rt.block_on(async {
        let listener = if cfg.server.enabled {
            let l = server::bind(cfg.server.listen)
                .await
                .with_context(|| format!("listening on {}", cfg.server.listen))?;
            Some(l)
        } else {
            None
        };
        let (mut dispatch, sinks_shutdown) = ember::export::start(
            &cfg.sinks,
            Some(windows.clone()),
            &node_name(&cfg),
            &metrics,
        )?;
        let (h, m) = (health.clone(), metrics.clone());
        let mut last_lost = 0;
        let filter = Filter::new(&cfg.filters)?;
        let opts = options(&cfg, cfg.window.duration, true);
        let meta = metadata(&cfg).await;
        let readings_meta = meta.clone();
        let otlp = if cfg.otlp_metrics.enabled {
            let o = &cfg.otlp_metrics;
            let settings = ember::readings::otlp::Settings {
                endpoint: o.endpoint.clone(),
                interval: o.interval,
                timeout: o.timeout,
                headers: o.headers.clone().into_iter().collect(),
                ca_file: o.ca_file.clone(),
                node_name: known_node_name(&cfg),
            };
            let e = ember::readings::otlp::start(settings, metrics.readings.clone())?;
            tracing::info!(
                "pushing OTLP metrics to {} every {:?}",
                o.endpoint,
                o.interval
            );
            Some(e)
        } else {
            None
        };
        let pipeline = Pipeline::start(opts, metrics.clone(), meta, filter, move |enc| {
            let lost = m.lost_total();
            eprintln!("{}", summary(&enc, lost - last_lost));
            last_lost = lost;
            dispatch.accept(&enc);
            h.beat();
        })?;
        // After the sampler: its perf events are the first ember opens (tests wait on them).
        let sources = reading_sources(&cfg, readings_meta.as_ref(), &metrics)?;
        let readings = if sources.is_empty() {
            None
        } else {
            Some(
                ember::readings::Readings::start(sources, cfg.readings.interval, metrics.clone())
                    .context("starting the readings thread")?,
            )
        };
        tracing::info!(
            "profiling every CPU at {} Hz; windows of {:?} go to {}",
            cfg.sampling.frequency_hz,
            cfg.window.duration,
            cfg.output.data_dir.display()
        );
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server_task = listener.map(|l| {
            tracing::info!(
                "serving /metrics, /healthz and flame graphs on http://{}",
                cfg.server.listen
            );
            tokio::spawn(server::serve(
                l,
                metrics.clone(),
                windows.clone(),
                health.clone(),
                async {
                    let _ = stop_rx.await;
                },
            ))
        });
        stop_signal().await;
        tracing::info!("stopping: flushing the current window");
        let _ = tokio::task::spawn_blocking(move || pipeline.stop()).await;
        // The last window is queued now; the sinks get sinks.shutdown_grace to send it.
        let _ = tokio::task::spawn_blocking(move || sinks_shutdown.stop()).await;
        if let Some(r) = readings {
            let _ = tokio::task::spawn_blocking(move || r.stop()).await;
        }
        if let Some(e) = otlp {
            let _ = tokio::task::spawn_blocking(move || e.shutdown()).await;
        }
        let _ = stop_tx.send(());
        if let Some(t) = server_task {
            let _ = t.await;
        }
        Ok(())
    })
}

/// What `record` writes, chosen by the output file's name.
#[derive(Clone, Copy)]
enum Format {
    Pprof,
    Folded,
    Svg,
}

fn format_of(path: &Path) -> Result<Format> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    Ok(if name.ends_with(".pb.gz") || name.ends_with(".pprof") {
        Format::Pprof
    } else if name.ends_with(".folded") {
        Format::Folded
    } else if name.ends_with(".svg") {
        Format::Svg
    } else {
        bail!(
            "{}: the output name must end in .pb.gz, .pprof, .folded or .svg",
            path.display()
        )
    })
}

fn record(args: RecordArgs) -> Result<()> {
    let cfg = load(&args.common)?;
    let format = format_of(&args.output)?;
    init_logging(&cfg);
    require_privileges()?;
    let metrics = Metrics::new();
    let (tx, rx) = std::sync::mpsc::channel::<Encoded>();
    // One window: it closes when recording stops, never on a timer.
    let never = args.duration + Duration::from_secs(365 * 24 * 3600);
    let filter = Filter::new(&cfg.filters)?;
    let started = SystemTime::now();
    // The pod watcher runs on this runtime while recording; its store stays readable after.
    let pipeline = runtime()?.block_on(async {
        let opts = options(&cfg, never, false);
        let meta = metadata(&cfg).await;
        let pipeline = Pipeline::start(opts, metrics.clone(), meta, filter, move |enc| {
            let _ = tx.send(enc);
        })?;
        eprintln!(
            "ember: recording {} for {:?} at {} Hz",
            if cfg.sampling.pids.is_empty() {
                "every process".to_owned()
            } else {
                format!("pids {:?}", cfg.sampling.pids)
            },
            args.duration,
            cfg.sampling.frequency_hz
        );
        tokio::select! {
            _ = tokio::time::sleep(args.duration) => {}
            _ = stop_signal() => {}
        }
        anyhow::Ok(pipeline)
    })?;
    pipeline.stop();
    let enc = rx.recv().context("the pipeline ended without a profile")?;
    let bytes = match format {
        Format::Pprof => enc.gz.clone(),
        Format::Folded => {
            let mut text = flamegraph::folded(&enc.profile).join("\n");
            text.push('\n');
            text.into_bytes()
        }
        Format::Svg => {
            flamegraph::svg(&enc.profile, &format!("ember record, {:?}", args.duration))?
        }
    };
    std::fs::write(&args.output, bytes)
        .with_context(|| format!("writing {}", args.output.display()))?;
    eprintln!("{}", summary(&enc, metrics.lost_total()));
    eprintln!(
        "ember: wrote {} ({:.1}s recorded, {} named / {} unnamed frames)",
        args.output.display(),
        started.elapsed().unwrap_or_default().as_secs_f64(),
        enc.frames.named,
        enc.frames.unnamed
    );
    Ok(())
}
