//! The `ember` command: `run` (the agent), `record` (one-shot), `report` and `top` (in
//! `ember::cli`), `features` and `check-config`
//! (and the hidden `docs`, which prints the generated reference pages).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use ember::agent::{Agent, Mode};
use ember::capture::{Feature, FeatureState, Reason};
use ember::cli::output::{self, format_of, Format};
use ember::cli::target::{self, Target};
use ember::config::{Config, NodeName};
use ember::encode::flamegraph;
use ember::encode::Encoded;
use ember::model::ProfileKind;
use ember::watch::{Exits, Held};

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
    /// Merge the window files of a data directory (a time range, a container, a process)
    /// into one profile in any format, as `perf report` reads `perf.data`.
    Report(ember::cli::report::ReportArgs),
    /// A live view of the hottest functions per process and container, refreshed in the
    /// terminal (q or Ctrl-C quits), as `py-spy top` and `perf top`.
    Top(ember::cli::top::TopArgs),
    /// Say what runs on this kernel: every feature, the path chosen and why, and what each
    /// BPF program cost the verifier (loads the programs as `run` would, samples nothing).
    Features(FeaturesArgs),
    /// Check a configuration file; errors name the line and column.
    CheckConfig {
        /// The YAML file.
        file: PathBuf,
    },
    /// Print the generated reference pages (docs/configuration.md, docs/metrics.md), or
    /// write both into a directory (`make docs`); a unit test compares them with the
    /// checked-in pages.
    #[command(hide = true)]
    Docs(DocsArgs),
}

#[derive(Args)]
struct DocsArgs {
    /// Which page to print: config or metrics.
    #[arg(value_enum)]
    page: Option<DocPage>,
    /// Write every page into this directory instead.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `ember docs PAGE`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum DocPage {
    /// docs/configuration.md, from config/ember.yaml.
    Config,
    /// docs/metrics.md, from the metric table.
    Metrics,
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
    /// HTTP listen address of the profiles listener (server.listen).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Listen address for /metrics and /healthz only (server.metrics_listen).
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Listen address for the probes' /healthz and /readyz only (server.health_listen).
    #[arg(long)]
    health_listen: Option<SocketAddr>,
    /// Window length, e.g. 10s (window.duration).
    #[arg(long, value_parser = humantime::parse_duration)]
    window: Option<Duration>,
}

#[derive(Args)]
struct FeaturesArgs {
    /// YAML configuration layered over the embedded default (what `run` would load).
    #[arg(long, short = 'c')]
    config: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
#[command(after_help = "Examples:\n  \
    ember record -o cpu.svg -- make -j2          run a command, profile it and its children\n  \
    ember record --pid 4242 -o app.pb.gz          until pid 4242 exits (or Ctrl-C)\n  \
    ember record -d 10s --format folded -o -      the whole host for 10 s, to stdout")]
struct RecordArgs {
    #[command(flatten)]
    common: Common,
    /// How long to record, e.g. 30s or 2m. Default: until the command or every --pid has
    /// exited; the whole host: 30s. Ctrl-C ends any recording early (the profile is written).
    #[arg(long, short = 'd', value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Output file, or - for standard output. Its format: --format, else the name's
    /// extension (.pb.gz/.pprof, .folded, .svg, .speedscope.json); - defaults to folded.
    #[arg(long, short = 'o')]
    output: PathBuf,
    /// Output format (overrides the extension).
    #[arg(long, value_enum)]
    format: Option<Format>,
    /// Also profile the processes the --pid processes start from now on (and theirs).
    /// Always on for a command given after --.
    #[arg(long)]
    subprocesses: bool,
    /// What to record: cpu (samples of running threads), offcpu (where threads wait, how
    /// long and why), offwake (blocked time under the stack of the thread that woke it) or
    /// lock (futex waits with their wakers, kernel lock contention); the last three turn on
    /// offcpu.enabled (and offcpu.wakers, offcpu.locks), cpu turns it off.
    #[arg(long = "type", value_enum, default_value_t = RecordType::Cpu)]
    kind: RecordType,
    /// A command to run and profile, with its children, until it exits (after --).
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// `ember record --type`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RecordType {
    /// CPU time.
    Cpu,
    /// Off-CPU time.
    Offcpu,
    /// Off-CPU time under the waker's stack.
    Offwake,
    /// Lock waits.
    Lock,
}

fn main() -> ExitCode {
    ember::one_malloc_arena();
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Run(RunArgs::default())) {
        Command::Run(args) => run(args),
        Command::Record(args) => record(args),
        Command::Report(args) => ember::cli::report::report(args),
        Command::Top(args) => top(args),
        Command::CheckConfig { file } => check_config(&file),
        Command::Features(args) => features(args),
        Command::Docs(args) => docs(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ember: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn docs(args: DocsArgs) -> Result<()> {
    let pages = [
        ("configuration.md", ember::config::reference::markdown()),
        ("metrics.md", ember::metrics::reference::markdown()),
    ];
    match (args.out, args.page) {
        (Some(dir), _) => {
            for (name, text) in pages {
                let path = dir.join(name);
                std::fs::write(&path, text).with_context(|| format!("{}", path.display()))?;
                println!("{}", path.display());
            }
        }
        (None, Some(DocPage::Config)) => print!("{}", pages[0].1),
        (None, Some(DocPage::Metrics)) => print!("{}", pages[1].1),
        (None, None) => bail!("ember docs: name a page (config, metrics) or --out DIR"),
    }
    Ok(())
}

fn top(args: ember::cli::top::TopArgs) -> Result<()> {
    let cfg = load(&Common {
        config: args.config.clone(),
        frequency: args.frequency,
        pids: args.pids.clone(),
    })?;
    init_logging(&cfg);
    let node = NodeName::resolve(&cfg.kubernetes);
    ember::cli::top::top(args, cfg, &node)
}

fn check_config(file: &Path) -> Result<()> {
    Config::load(file)?;
    println!("{}: ok", file.display());
    Ok(())
}

fn features(args: FeaturesArgs) -> Result<()> {
    let cfg = load(&Common {
        config: args.config,
        ..Common::default()
    })?;
    cfg.validate("the command line")?;
    init_logging(&cfg);
    let mut report = ember::capture::probe_features(&cfg.sampling, &cfg.offcpu)?;
    let (enabled, reason, detail) = if !cfg.counters.runqueue_latency {
        (
            false,
            Reason::Config,
            "counters.runqueue_latency: false".to_owned(),
        )
    } else {
        match ember::readings::probe_runqlat(&cfg.counters) {
            Ok(()) => (true, Reason::Loaded, "loaded".to_owned()),
            Err(e) => (false, Reason::Refused, e.to_string()),
        }
    };
    report.features.push(FeatureState {
        feature: Feature::RunqueueLatency,
        enabled,
        path: if enabled {
            "tp_btf/sched_wakeup+switch".into()
        } else {
            "off".into()
        },
        reason,
        detail,
    });
    if args.json {
        let json = serde_json::json!({
            "kernel": report.kernel,
            "retries": report.retries,
            "features": report.features.iter().map(|f| serde_json::json!({
                "feature": f.feature.name(),
                "enabled": f.enabled,
                "path": f.path,
                "reason": f.reason.as_str(),
                "detail": f.detail,
            })).collect::<Vec<_>>(),
            "programs": report.programs.iter().map(|p| serde_json::json!({
                "name": p.name,
                "loaded": p.loaded,
                "verified_insns": p.verified_insns,
                "error": p.error,
            })).collect::<Vec<_>>(),
        });
        println!("{json:#}");
        return Ok(());
    }
    println!("kernel {}", report.kernel);
    println!("{:<18} {:<4} {:<28} why", "feature", "on", "path");
    for f in &report.features {
        println!(
            "{:<18} {:<4} {:<28} {}: {}",
            f.feature.name(),
            if f.enabled { "yes" } else { "no" },
            f.path,
            f.reason.as_str(),
            f.detail
        );
    }
    println!();
    println!("{:<26} {:>14}  verifier", "program", "insns processed");
    for p in &report.programs {
        let insns = p.verified_insns.map_or("-".to_owned(), |n| n.to_string());
        let state = match (&p.error, p.loaded) {
            (Some(e), true) => format!("loaded (a fuller variant was refused: {e})"),
            (Some(e), false) => format!("refused: {e}"),
            (None, _) => "loaded".to_owned(),
        };
        println!("{:<26} {:>14}  {}", p.name, insns, state);
    }
    Ok(())
}

/// The config file (or the embedded default) with the flags both commands share applied
/// over it; the caller applies its own, then validates once ([`Config::validate`]), so a
/// flag meets the same rules as the key it overrides.
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

/// One line per window: its kind (off-CPU ones), when, how many samples, how many lost,
/// and with `top` the three hottest functions (counted over the whole profile: a running
/// agent does so for CPU windows only, four windows a period being too many to read).
fn summary(w: &Encoded, lost: u64, top: bool) -> String {
    let stamp = time::OffsetDateTime::from(w.start)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let kind = match w.window.kind {
        ProfileKind::Cpu => String::new(),
        other => format!("{} ", other.as_str()),
    };
    let mut line = format!(
        "ember: {kind}window {stamp} {:.1}s: {} samples, {lost} lost",
        w.duration.as_secs_f64(),
        w.samples,
    );
    if top {
        let top: Vec<String> = flamegraph::top_functions(&w.profile, 3)
            .into_iter()
            .map(|(name, n)| format!("{name} {:.1}%", 100.0 * n as f64 / w.samples.max(1) as f64))
            .collect();
        line.push_str("; top: ");
        line.push_str(&if top.is_empty() {
            "-".to_owned()
        } else {
            top.join(", ")
        });
    }
    line
}

fn run(args: RunArgs) -> Result<()> {
    let mut cfg = load(&args.common)?;
    if let Some(dir) = args.data_dir {
        cfg.output.data_dir = dir;
    }
    if let Some(listen) = args.listen {
        cfg.server.listen = listen;
    }
    if let Some(addr) = args.metrics_listen {
        cfg.server.metrics_listen = Some(addr);
    }
    if let Some(addr) = args.health_listen {
        cfg.server.health_listen = Some(addr);
    }
    if let Some(w) = args.window {
        cfg.window.duration = w;
    }
    // The flags must meet the same rules as the file (a public --listen needs a token, a
    // window is at least 100ms).
    cfg.validate("the command line")?;
    init_logging(&cfg);
    let node = NodeName::resolve(&cfg.kubernetes);
    let agent = Agent::start(&cfg, &node, Mode::Run, |enc, lost| {
        eprintln!(
            "{}",
            summary(enc, lost, enc.window.kind == ProfileKind::Cpu)
        );
    })?;
    agent.wait();
    agent.stop()?;
    Ok(())
}

fn record(args: RecordArgs) -> Result<()> {
    let mut cfg = load(&args.common)?;
    let kind = match args.kind {
        RecordType::Cpu => {
            // Its windows would be thrown away: no off-CPU programs for a CPU recording.
            cfg.offcpu.enabled = false;
            ProfileKind::Cpu
        }
        RecordType::Offcpu => {
            cfg.offcpu.enabled = true;
            ProfileKind::OffCpu
        }
        RecordType::Offwake => {
            cfg.offcpu.enabled = true;
            cfg.offcpu.wakers = true;
            ProfileKind::OffWake
        }
        RecordType::Lock => {
            cfg.offcpu.enabled = true;
            cfg.offcpu.locks = true;
            ProfileKind::Lock
        }
    };
    let format = format_of(&args.output, args.format)?;
    let mut target = Target::prepare(&mut cfg, &args.command, args.subprocesses)?;
    // The whole host has no end of its own: 30 s unless told.
    let duration = args
        .duration
        .or_else(|| target.exits.is_none().then_some(Duration::from_secs(30)));
    cfg.validate("the command line")?;
    init_logging(&cfg);
    let node = NodeName::resolve(&cfg.kubernetes);
    let (tx, rx) = std::sync::mpsc::channel::<(Encoded, u64)>();
    let started = Instant::now();
    let agent = Agent::start(&cfg, &node, Mode::Record { duration }, move |enc, lost| {
        let _ = tx.send((enc.clone(), lost));
    })?;
    // Off-CPU types need off-CPU: where this kernel cannot run it, say so and why, and stop.
    if kind != ProfileKind::Cpu {
        if let Some(f) = agent
            .features()
            .and_then(|r| r.feature(Feature::OffCpu))
            .filter(|f| !f.enabled)
        {
            let why = f.detail.clone();
            agent.stop()?;
            bail!("off-CPU profiling does not run on this kernel: {why} (`ember features` says what does)");
        }
    }
    eprintln!(
        "ember: recording {}",
        what(kind, &cfg, &args.command, duration)
    );
    target.release()?;
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    agent.wait_until(recording(
        &agent,
        target.exits.take(),
        duration,
        progress,
        started,
    ));
    if progress {
        eprintln!();
    }
    agent.stop()?;
    if let Some(status) = target.held.as_mut().and_then(Held::try_wait) {
        eprintln!("ember: `{}` exited: {status}", args.command.join(" "));
    }
    let (enc, lost) = rx
        .iter()
        .find(|(enc, _)| enc.window.kind == kind)
        .context("the pipeline ended without a profile")?;
    let title = match kind {
        ProfileKind::Cpu => "ember record".to_owned(),
        other => format!("ember record --type {}", other.as_str()),
    };
    let bytes = output::render(&enc.profile, Some(&enc.gz), &title, format)?;
    let written = output::write(&args.output, &bytes)?;
    eprintln!("{}", summary(&enc, lost, true));
    eprintln!(
        "ember: wrote {written} ({:.1}s recorded, {} named / {} unnamed frames)",
        started.elapsed().as_secs_f64(),
        enc.frames.named,
        enc.frames.unnamed
    );
    Ok(())
}

/// What is recorded, for how long, at what rate.
fn what(kind: ProfileKind, cfg: &Config, command: &[String], duration: Option<Duration>) -> String {
    let pids = &cfg.sampling.pids;
    format!(
        "{}{} {} at {} Hz",
        match kind {
            ProfileKind::Cpu => "",
            ProfileKind::OffCpu => "off-CPU time of ",
            ProfileKind::OffWake => "off-CPU time and wakers of ",
            ProfileKind::Lock => "lock waits of ",
        },
        match (command.is_empty(), pids.is_empty()) {
            (false, _) => format!("`{}` (pid {pids:?}) and its children", command.join(" ")),
            (true, true) => "every process".to_owned(),
            (true, false) if cfg.sampling.subprocesses =>
                format!("pids {pids:?} and their children"),
            (true, false) => format!("pids {pids:?}"),
        },
        match (duration, command.is_empty()) {
            (Some(d), _) => format!("for {d:?}"),
            (None, false) => "until it exits".to_owned(),
            (None, true) => "until they exit".to_owned(),
        },
        cfg.sampling.frequency_hz
    )
}

/// Until the recording ends: `duration` passes or every process in `exits` has exited.
/// On a terminal, a progress line every two seconds (elapsed, samples, lost).
async fn recording(
    agent: &Agent,
    exits: Option<Exits>,
    duration: Option<Duration>,
    progress: bool,
    started: Instant,
) {
    let ended = target::ended(exits);
    let limit = async {
        match duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    let ticks = async {
        if !progress {
            return std::future::pending().await;
        }
        let mut every = tokio::time::interval(Duration::from_secs(2));
        loop {
            every.tick().await;
            let (samples, lost) = agent.progress();
            eprint!(
                "\rember: {:.0}s, {samples} samples, {lost} lost ",
                started.elapsed().as_secs_f64()
            );
        }
    };
    tokio::select! {
        _ = ended => {}
        _ = limit => {}
        _ = ticks => {}
    }
}
