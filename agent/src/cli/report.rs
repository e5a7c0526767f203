//! `ember report`: the window files of a data directory, picked by time and filtered by
//! workload, merged into one profile and written in any of `record`'s formats, the way
//! `perf report` reads `perf.data`.
//!
//! The directory is only read: nothing is created, pruned or renamed in it. Every file
//! is treated as hostile input: only names `ember run` writes are opened, symlinks are
//! refused, a file over `server.max_file_bytes` is not read, a profile is inflated to
//! the same cap as the server's, and the merge holds at most `server.max_merge_samples`
//! distinct samples. A file that is not a profile is counted, named in one warning
//! line, and skipped.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

use super::output::{self, format_of, Format};
use crate::config::units::parse_duration;
use crate::config::Config;
use crate::encode::flamegraph;
use crate::export::files::{is_window_name, window_kind};
use crate::model::ProfileKind;
use crate::proto::Profile;
use crate::server::api::window_start;
use crate::server::limits::Work;
use crate::server::merge::{LabelFilter, MergeError, Merger};

/// `ember report` flags.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    ember report --since 10m -o last10m.svg             the last ten minutes of /var/lib/ember/windows\n  \
    ember report --data-dir d --container api -o api.pb.gz\n  \
    ember report --since 2026-12-07T09:00:00Z --until 2026-12-07T10:00:00Z --process 4242 -o -")]
pub struct ReportArgs {
    /// YAML configuration layered over the embedded default: its output.data_dir, and
    /// the caps server.max_file_bytes and server.max_merge_samples.
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// The window directory (default: output.data_dir).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Windows that start at or after this: RFC 3339 in UTC (2026-12-07T09:00:00Z), or a
    /// duration ago (10m, 2h). Default: the oldest.
    #[arg(long)]
    pub since: Option<String>,
    /// Windows that start before this (same forms, or now). Default: now.
    #[arg(long)]
    pub until: Option<String>,
    /// Only samples of this container (its name, the `container` label).
    #[arg(long)]
    pub container: Option<String>,
    /// Only samples of this pod (the `pod` label).
    #[arg(long)]
    pub pod: Option<String>,
    /// Only samples of this process: a pid, or a process name (the `process` label).
    #[arg(long)]
    pub process: Option<String>,
    /// Only samples with this label, KEY=VALUE (namespace=shop, comm=worker, ...);
    /// repeat for several (all must match).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// Which windows: cpu, offcpu, offwake or lock.
    #[arg(long = "type", value_enum, default_value_t = ReportType::Cpu)]
    pub kind: ReportType,
    /// Output file, or - for standard output; the format as for `record`.
    #[arg(long, short = 'o')]
    pub output: PathBuf,
    /// Output format (overrides the extension).
    #[arg(long, value_enum)]
    pub format: Option<Format>,
}

/// `ember report --type`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum ReportType {
    /// CPU windows.
    Cpu,
    /// Off-CPU windows.
    Offcpu,
    /// Off-CPU windows under the waker's stack.
    Offwake,
    /// Lock waits.
    Lock,
}

impl ReportType {
    fn kind(self) -> ProfileKind {
        match self {
            Self::Cpu => ProfileKind::Cpu,
            Self::Offcpu => ProfileKind::OffCpu,
            Self::Offwake => ProfileKind::OffWake,
            Self::Lock => ProfileKind::Lock,
        }
    }
}

/// Windows named in the warning line at most; the rest are counted.
const NAMED_SKIPS: usize = 5;

/// Runs `ember report`.
pub fn report(args: ReportArgs) -> Result<()> {
    let cfg = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::from_yaml(crate::config::DEFAULT_YAML, "<embedded config/ember.yaml>")?,
    };
    let dir = args.data_dir.clone().unwrap_or(cfg.output.data_dir.clone());
    let format = format_of(&args.output, args.format)?;
    let now = SystemTime::now();
    let since = match &args.since {
        Some(t) => when(t, now).with_context(|| format!("--since {t}"))?,
        None => UNIX_EPOCH,
    };
    let until = match &args.until {
        Some(t) => when(t, now).with_context(|| format!("--until {t}"))?,
        None => now,
    };
    if since > until {
        bail!("--since is after --until");
    }
    let filter = LabelFilter(filters(&args)?);
    let kind = args.kind.kind();
    let (picked, all) = select(&dir, kind, since, until)?;
    if picked.is_empty() {
        bail!(
            "no {} windows in {} start between {} and {} ({all} window files there)",
            kind.as_str(),
            dir.display(),
            stamp(since),
            stamp(until)
        );
    }
    let caps = Caps {
        file_bytes: cfg.server.max_file_bytes,
        samples: cfg.server.max_merge_samples,
    };
    let merged = merge(&dir, &picked, &filter, caps)?;
    let samples: i64 = merged
        .profile
        .sample
        .iter()
        .map(|s| s.value.first().copied().unwrap_or(0))
        .sum();
    if merged.skipped > 0 {
        eprintln!("ember: {}", merged.skip_line());
    }
    if merged.read == 0 {
        bail!("none of the {} windows could be read", picked.len());
    }
    if merged.profile.sample.is_empty() {
        bail!(
            "no samples in the {} windows read match the filters{}",
            merged.read,
            describe(&filter)
        );
    }
    let title = match kind {
        ProfileKind::Cpu => "ember report".to_owned(),
        other => format!("ember report --type {}", other.as_str()),
    };
    let bytes = output::render(&merged.profile, None, &title, format)?;
    let written = output::write(&args.output, &bytes)?;
    let top: Vec<String> = flamegraph::top_functions(&merged.profile, 3)
        .into_iter()
        .map(|(name, n)| format!("{name} {:.1}%", 100.0 * n as f64 / samples.max(1) as f64))
        .collect();
    eprintln!(
        "ember: {} windows from {} to {}: {samples} samples; top: {}",
        merged.read,
        merged.first.map_or_else(String::new, stamp),
        merged.last.map_or_else(String::new, stamp),
        if top.is_empty() {
            "-".to_owned()
        } else {
            top.join(", ")
        }
    );
    eprintln!("ember: wrote {written}");
    Ok(())
}

/// `now`, a duration ago (`10m`), or RFC 3339 in UTC (`2026-12-07T09:00:00Z`, fractions
/// allowed).
fn when(text: &str, now: SystemTime) -> Result<SystemTime> {
    if text == "now" {
        return Ok(now);
    }
    if let Ok(ago) = parse_duration(text) {
        return now
            .checked_sub(ago)
            .filter(|t| *t >= UNIX_EPOCH)
            .context("before 1970");
    }
    humantime::parse_rfc3339_weak(text).with_context(|| {
        format!("{text:?} is neither a UTC time (RFC 3339: 2026-12-07T09:00:00Z) nor a duration ago (10m)")
    })
}

/// The label pairs every kept sample must carry.
fn filters(args: &ReportArgs) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    if let Some(c) = &args.container {
        out.push(("container".to_owned(), c.clone()));
    }
    if let Some(p) = &args.pod {
        out.push(("pod".to_owned(), p.clone()));
    }
    if let Some(p) = &args.process {
        let key = if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
            "pid"
        } else {
            "process"
        };
        out.push((key.to_owned(), p.clone()));
    }
    for l in &args.labels {
        match l.split_once('=') {
            Some((k, v)) if !k.is_empty() => out.push((k.to_owned(), v.to_owned())),
            _ => bail!("--label {l:?}: write KEY=VALUE"),
        }
    }
    Ok(out)
}

/// ` (container=api, pid=42)`, or nothing without filters.
fn describe(filter: &LabelFilter) -> String {
    if filter.0.is_empty() {
        return String::new();
    }
    let pairs: Vec<String> = filter.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(" ({})", pairs.join(", "))
}

/// `t` as RFC 3339 to the millisecond.
fn stamp(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// A window file picked by name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Picked {
    name: String,
    start: SystemTime,
}

/// The window files of `kind` in `dir` that start in `[since, until)`, oldest first, and
/// how many window files of any kind and time the directory holds.
fn select(
    dir: &Path,
    kind: ProfileKind,
    since: SystemTime,
    until: SystemTime,
) -> Result<(Vec<Picked>, usize)> {
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("reading the directory {}", dir.display()))?;
    let mut all = 0;
    let mut picked = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !is_window_name(&name) {
            continue;
        }
        all += 1;
        let Some(start) = window_start(&name) else {
            continue;
        };
        if window_kind(&name) == Some(kind) && start >= since && start < until {
            picked.push(Picked { name, start });
        }
    }
    // Names sort by start; the collision suffix `-N` sorts after the plain name.
    picked.sort_by(|a, b| a.start.cmp(&b.start).then_with(|| a.name.cmp(&b.name)));
    Ok((picked, all))
}

/// The caps a report reads under.
#[derive(Debug, Clone, Copy)]
struct Caps {
    /// Largest window file read (`server.max_file_bytes`).
    file_bytes: u64,
    /// Distinct samples the merged profile may hold (`server.max_merge_samples`).
    samples: usize,
}

/// Why a window file was skipped.
#[derive(Debug, thiserror::Error)]
enum Skip {
    /// Opening or reading it failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A directory, FIFO, device...
    #[error("not a regular file")]
    NotAFile,
    /// Larger than `server.max_file_bytes`.
    #[error("{0} bytes, over server.max_file_bytes ({1})")]
    TooLarge(u64, u64),
    /// It grew past the cap while read.
    #[error("grew over server.max_file_bytes ({0}) while read")]
    Grew(u64),
    /// Not gzip, not pprof, or inflating past the cap.
    #[error("{0}")]
    Decode(#[from] flamegraph::FlameGraphError),
    /// A profile of other sample types than the first window's.
    #[error("{0}")]
    SampleTypes(MergeError),
}

/// The merged profile and what was skipped on the way.
struct Merged {
    profile: Profile,
    read: usize,
    /// The start of the first and of the last window read.
    first: Option<SystemTime>,
    last: Option<SystemTime>,
    skipped: usize,
    /// The first [`NAMED_SKIPS`] skipped files and why.
    named: Vec<(String, Skip)>,
}

impl Merged {
    /// Counts `name` as skipped, keeping why for the warning line.
    fn skip(&mut self, name: &str, why: Skip) {
        self.skipped += 1;
        if self.named.len() < NAMED_SKIPS {
            self.named.push((name.to_owned(), why));
        }
    }

    /// The one warning line: how many files were skipped, the first few named with why.
    fn skip_line(&self) -> String {
        let names: Vec<String> = self
            .named
            .iter()
            .map(|(n, why)| format!("{n} ({why})"))
            .collect();
        let more = self.skipped.saturating_sub(self.named.len());
        format!(
            "skipped {} window file{} that could not be read as profiles: {}{}",
            self.skipped,
            if self.skipped == 1 { "" } else { "s" },
            names.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        )
    }
}

/// Reads, decodes and merges the `picked` windows one at a time.
fn merge(dir: &Path, picked: &[Picked], filter: &LabelFilter, caps: Caps) -> Result<Merged> {
    let work = Work::unlimited();
    let mut merger = Merger::new(caps.samples);
    let mut out = Merged {
        profile: Profile::default(),
        read: 0,
        first: None,
        last: None,
        skipped: 0,
        named: Vec::new(),
    };
    for w in picked {
        let decoded = read_capped(&dir.join(&w.name), caps.file_bytes)
            .and_then(|b| Ok(flamegraph::decode_gz(&b)?));
        let profile = match decoded {
            Ok(p) => p,
            Err(why) => {
                out.skip(&w.name, why);
                continue;
            }
        };
        match merger.add(&profile, filter, &work) {
            Ok(()) => {
                out.read += 1;
                out.first = out.first.or(Some(w.start));
                out.last = Some(w.start);
            }
            Err(e @ MergeError::SampleTypes) => out.skip(&w.name, Skip::SampleTypes(e)),
            // The cap: the report cannot go on (a narrower range or a filter can).
            Err(e) => bail!("{}: {e}", w.name),
        }
    }
    out.profile = merger.finish();
    Ok(out)
}

/// The bytes of the window file at `path`: a regular file (symlinks are not followed, a
/// FIFO does not block the open) of at most `cap` bytes, read to at most `cap` bytes
/// even if it grows meanwhile.
fn read_capped(path: &Path, cap: u64) -> std::result::Result<Vec<u8>, Skip> {
    let file: File = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(Skip::NotAFile);
    }
    if meta.len() > cap {
        return Err(Skip::TooLarge(meta.len(), cap));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(cap.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(Skip::Grew(cap));
    }
    Ok(bytes)
}
