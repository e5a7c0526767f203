//! What this kernel runs: the BPF object's optional parts each load, fall back or turn off
//! on their own, and each outcome is said once (a log line, `ember_feature_enabled`, a row
//! of `ember features`).
//!
//! Fleets run many kernels, and the same program costs the verifier 35k instructions on
//! one and over its million-instruction limit on the next; an optional map type (task
//! storage, 5.11+) or tracepoint (lock contention, 5.19+) may be missing. libbpf loads an
//! object whole, so one refused program used to stop the agent. Here the load is a
//! [`Plan`]: what the settings ask for, less what probes say the kernel lacks. When the
//! kernel refuses a part, the plan steps that part down to its next simpler variant (the
//! walker without interpreter frames, then frame pointers; off-CPU's task work, then its
//! syscall hooks, then the switch-out fallback, then off) and the load is tried again.
//! Only the sampler itself must load.
//!
//! Every program is loaded with the verifier's statistics (log level `BPF_LOG_STATS`), so
//! the instructions each one cost the verifier are known on every kernel: the budget test
//! and `ember features` read them from here.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, Once};

use libbpf_rs::PrintLevel;
use tracing::{debug, warn};

/// `BPF_LOG_STATS`: the verifier's summary only (processed instructions, states, time).
pub(super) const LOG_STATS: u32 = 4;

/// Loads tried before giving up: each step down removes a part or a variant, and there are
/// fewer of those than this.
pub(super) const MAX_ATTEMPTS: usize = 12;

/// The parts of the BPF object a kernel may lack or refuse (and the one it must load).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Feature {
    /// The perf-event sampler with frame-pointer stacks: the one part that must load.
    Sampler,
    /// The table walker (`ember_walk`): stacks of code without frame pointers.
    UnwindTables,
    /// Interpreter frames (CPython) in the walker.
    Python,
    /// The exec hook: a new program's ranges before its first instruction.
    ExecTracking,
    /// The fork hook: children of the `--pid` processes join them (`sampling.subprocesses`).
    Subprocesses,
    /// Off-CPU profiles (`ember_offcpu_switch` and the hooks of its path).
    OffCpu,
    /// Wakeups: runnable time and the wakers' stacks (`ember_offcpu_waking`).
    Wakers,
    /// Kernel lock contention (`lock:contention_begin/end`).
    KernelLocks,
    /// The run-queue latency histogram (its own object).
    RunqueueLatency,
}

impl Feature {
    /// Every feature, in the order they are reported.
    pub const ALL: [Feature; 9] = [
        Feature::Sampler,
        Feature::UnwindTables,
        Feature::Python,
        Feature::ExecTracking,
        Feature::Subprocesses,
        Feature::OffCpu,
        Feature::Wakers,
        Feature::KernelLocks,
        Feature::RunqueueLatency,
    ];

    /// Its name in logs, metrics and `ember features`.
    pub fn name(self) -> &'static str {
        match self {
            Feature::Sampler => "sampler",
            Feature::UnwindTables => "unwind_tables",
            Feature::Python => "python",
            Feature::ExecTracking => "exec_tracking",
            Feature::Subprocesses => "subprocesses",
            Feature::OffCpu => "offcpu",
            Feature::Wakers => "wakers",
            Feature::KernelLocks => "kernel_locks",
            Feature::RunqueueLatency => "runqueue_latency",
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a feature is in the state it is: the `reason` label of `ember_feature_enabled`
/// (a short code; the sentence is in [`FeatureState::detail`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Loaded as asked.
    Loaded,
    /// Off in the configuration (or by a feature it depends on being off).
    Config,
    /// The kernel lacks what it needs (a map type, helper, tracepoint or BTF).
    Unsupported,
    /// The verifier or the kernel refused it; a simpler variant may run instead.
    Refused,
    /// Loaded, but its attachment to the kernel failed.
    AttachFailed,
}

impl Reason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Loaded => "loaded",
            Reason::Config => "config",
            Reason::Unsupported => "unsupported",
            Reason::Refused => "refused",
            Reason::AttachFailed => "attach_failed",
        }
    }
}

/// One feature's outcome on this kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureState {
    /// Which feature.
    pub feature: Feature,
    /// Whether it runs.
    pub enabled: bool,
    /// The variant that runs (`frame_pointer`, `tables`, `task_work`...), or `off`.
    pub path: String,
    /// Why it runs this way.
    pub reason: Reason,
    /// The same as a sentence: what was asked, what the kernel said.
    pub detail: String,
}

/// One program's verification on this kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramStat {
    /// The program's name (`ember_walk`).
    pub name: String,
    /// It is loaded and in use.
    pub loaded: bool,
    /// Instructions the verifier processed for it (from `BPF_LOG_STATS`), when it said.
    pub verified_insns: Option<u64>,
    /// The verifier's last line when it refused it (in some attempt).
    pub error: Option<String>,
}

/// What a load found on this kernel: every feature's state and every program's cost.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// `uname -r`.
    pub kernel: String,
    /// One state per feature of [`Feature::ALL`] that this object reports.
    pub features: Vec<FeatureState>,
    /// Programs by name: loaded ones with their cost, refused ones with the verifier's line.
    pub programs: Vec<ProgramStat>,
    /// Loads tried after the first (each a part stepped down).
    pub retries: u32,
}

impl LoadReport {
    /// The state of `feature`, if this report has it.
    pub fn feature(&self, feature: Feature) -> Option<&FeatureState> {
        self.features.iter().find(|f| f.feature == feature)
    }

    /// Says each feature's outcome once: in the log, and in `ember_feature_enabled`.
    pub fn publish(&self, metrics: &crate::metrics::Metrics) {
        self.log();
        for f in &self.features {
            metrics
                .feature_enabled
                .get_or_create(&crate::metrics::FeatureLabels {
                    feature: f.feature.name(),
                    reason: f.reason.as_str(),
                })
                .set(i64::from(f.enabled));
        }
    }

    /// Says each feature's outcome once in the log: on at info, off at warn unless the
    /// configuration turned it off.
    pub fn log(&self) {
        for f in &self.features {
            if f.enabled || f.reason == Reason::Config {
                tracing::info!(
                    "feature {}: {} ({})",
                    f.feature,
                    if f.enabled { &f.path } else { "off" },
                    f.detail
                );
            } else {
                warn!("feature {}: off ({})", f.feature, f.detail);
            }
        }
    }
}

/// The kernel release (`uname -r`), or "unknown".
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// libbpf's messages while a load is under way, for [`LoadLog::take`].
static CAPTURED: Mutex<Option<Vec<String>>> = Mutex::new(None);
static PRINT: Once = Once::new();

/// Routes libbpf's messages: kept while a load is captured, else warnings to the log.
fn libbpf_print(level: PrintLevel, msg: String) {
    let mut captured = CAPTURED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(lines) = captured.as_mut() {
        // A load's messages are a few dozen; a runaway log is cut, not grown.
        if lines.len() < 4096 {
            lines.push(msg);
        }
        return;
    }
    drop(captured);
    match level {
        PrintLevel::Warn => warn!("libbpf: {}", msg.trim_end()),
        PrintLevel::Info | PrintLevel::Debug => debug!("libbpf: {}", msg.trim_end()),
    }
}

/// libbpf's messages of one load attempt (every level: successful programs' statistics
/// come at debug level).
pub(super) struct LoadLog(());

impl LoadLog {
    /// Starts keeping libbpf's messages.
    pub(super) fn start() -> Self {
        PRINT.call_once(|| {
            libbpf_rs::set_print(Some((PrintLevel::Debug, libbpf_print)));
        });
        *CAPTURED.lock().unwrap_or_else(|e| e.into_inner()) = Some(Vec::new());
        LoadLog(())
    }

    /// Stops keeping them and returns what was said.
    pub(super) fn take(self) -> Parsed {
        let lines = CAPTURED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_default();
        // The whole of it (verifier logs of refused programs included) for `log.level: debug`.
        for line in &lines {
            debug!("libbpf: {}", line.trim_end());
        }
        Parsed::from_messages(&lines)
    }
}

impl Drop for LoadLog {
    fn drop(&mut self) {
        *CAPTURED.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// What a load attempt's libbpf messages say.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Parsed {
    /// Verified instructions of each program whose log was printed.
    pub(super) insns: BTreeMap<String, u64>,
    /// The part that failed the load, if one did: a program or a map.
    pub(super) failed: Option<Culprit>,
    /// The verifier's (or libbpf's) last line about that failure.
    pub(super) last_line: Option<String>,
}

/// What libbpf named in a failed load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Culprit {
    /// A program libbpf could not load.
    Program(String),
    /// A map libbpf could not create.
    Map(String),
}

impl fmt::Display for Culprit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Culprit::Program(p) => write!(f, "program {p}"),
            Culprit::Map(m) => write!(f, "map {m}"),
        }
    }
}

const LOG_BEGIN: &str = "-- BEGIN PROG LOAD LOG --";
const LOG_END: &str = "-- END PROG LOAD LOG --";

impl Parsed {
    /// Reads libbpf's messages: program logs (`prog 'X': -- BEGIN PROG LOAD LOG --`),
    /// failures (`prog 'X': failed to load`, `map 'Y': failed to create`). The first
    /// failure is the culprit: libbpf stops at it.
    pub(super) fn from_messages(messages: &[String]) -> Self {
        let mut out = Parsed::default();
        let mut verdicts = BTreeMap::new();
        let mut fail_msg = None;
        for msg in messages {
            let m = msg.trim_start();
            let m = m.strip_prefix("libbpf: ").unwrap_or(m);
            if let Some(name) = leading_name(m, "prog '") {
                if let Some(log) = between(m, LOG_BEGIN, LOG_END) {
                    if let Some(n) = processed_insns(log) {
                        out.insns.insert(name.to_owned(), n);
                    }
                    if let Some(line) = last_verifier_line(log) {
                        verdicts.insert(name.to_owned(), line);
                    }
                } else if out.failed.is_none()
                    && [
                        "failed to load",
                        "load failed",
                        "failed to find kernel BTF",
                        "failed to prepare",
                    ]
                    .iter()
                    .any(|s| m.contains(s))
                {
                    out.failed = Some(Culprit::Program(name.to_owned()));
                    fail_msg = Some(m.trim().to_owned());
                }
            } else if let Some(name) = leading_name(m, "map '") {
                if out.failed.is_none() && m.contains("failed to") {
                    out.failed = Some(Culprit::Map(name.to_owned()));
                    fail_msg = Some(m.trim().to_owned());
                }
            }
        }
        out.last_line = match &out.failed {
            Some(Culprit::Program(p)) => verdicts.remove(p).or(fail_msg),
            Some(Culprit::Map(_)) => fail_msg,
            None => None,
        };
        out
    }
}

/// The quoted name a message starts with (`prog 'ember_walk': ...`).
fn leading_name<'a>(msg: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = msg.strip_prefix(prefix)?;
    let len = rest.find('\'')?;
    Some(&rest[..len])
}

fn between<'a>(msg: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = msg.find(open)? + open.len();
    let end = msg[start..].find(close).map_or(msg.len(), |e| start + e);
    Some(&msg[start..end])
}

/// "processed N insns" of a `BPF_LOG_STATS` log.
fn processed_insns(log: &str) -> Option<u64> {
    log.lines().find_map(|line| {
        let rest = line.trim().strip_prefix("processed ")?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The log's last line that is not one of the statistics (the verifier's verdict), with
/// the line before when the last only says where ("... failed callback verification").
fn last_verifier_line(log: &str) -> Option<String> {
    let lines: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty()
                && !l.starts_with("processed ")
                && !l.starts_with("verification time")
                && !l.starts_with("stack depth")
        })
        .collect();
    let last = *lines.last()?;
    let line = match lines.len().checked_sub(2).map(|i| lines[i]) {
        Some(before) if last.contains("failed callback verification") => {
            format!("{before} ({last})")
        }
        _ => last.to_owned(),
    };
    Some(line.chars().take(300).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn reads_each_programs_verified_instructions() {
        let p = Parsed::from_messages(&msgs(&[
            "libbpf: loading object 'ember_bpf'\n",
            "prog 'ember_sample': -- BEGIN PROG LOAD LOG --\nverification time 501 usec\nstack depth 0+16\nprocessed 1234 insns (limit 1000000) max_states_per_insn 2 total_states 80 peak_states 80 mark_read 10\n-- END PROG LOAD LOG --\n",
            "prog 'ember_walk': -- BEGIN PROG LOAD LOG --\nprocessed 56789 insns (limit 1000000) max_states_per_insn 4\n-- END PROG LOAD LOG --\n",
        ]));
        assert_eq!(p.insns.get("ember_sample"), Some(&1234));
        assert_eq!(p.insns.get("ember_walk"), Some(&56789));
        assert_eq!(p.failed, None);
    }

    #[test]
    fn names_the_refused_program_and_the_verifiers_last_line() {
        let p = Parsed::from_messages(&msgs(&[
            "prog 'ember_sample': -- BEGIN PROG LOAD LOG --\nprocessed 10 insns (limit 1000000)\n-- END PROG LOAD LOG --\n",
            "libbpf: prog 'ember_walk': BPF program load failed: Argument list too long\n",
            "prog 'ember_walk': -- BEGIN PROG LOAD LOG --\nBPF program is too large. Processed 1000001 insn\nverification time 26000000 usec\nprocessed 1000001 insns (limit 1000000) max_states_per_insn 37 total_states 50376 peak_states 116170 mark_read 5\n-- END PROG LOAD LOG --\n",
            "prog 'ember_walk': failed to load: -E2BIG\n",
            "failed to load object 'ember_bpf'\n",
        ]));
        assert_eq!(p.failed, Some(Culprit::Program("ember_walk".into())));
        assert_eq!(
            p.last_line.as_deref(),
            Some("BPF program is too large. Processed 1000001 insn")
        );
        assert_eq!(p.insns.get("ember_walk"), Some(&1000001));
    }

    #[test]
    fn names_a_map_the_kernel_could_not_create() {
        let p = Parsed::from_messages(&msgs(&[
            "libbpf: map 'offcpu_tasks': failed to create: Invalid argument(-22)\n",
            "failed to load object 'ember_bpf'\n",
        ]));
        assert_eq!(p.failed, Some(Culprit::Map("offcpu_tasks".into())));
        assert!(p.last_line.unwrap().contains("Invalid argument"));
    }

    #[test]
    fn names_a_program_whose_tracepoint_is_missing() {
        let p = Parsed::from_messages(&msgs(&[
            "prog 'ember_offcpu_lock_begin': failed to find kernel BTF type ID of 'contention_begin': -ESRCH\n",
            "prog 'ember_offcpu_lock_begin': failed to prepare load attributes: -ESRCH\n",
            "prog 'ember_offcpu_lock_begin': failed to load: -ESRCH\n",
        ]));
        assert_eq!(
            p.failed,
            Some(Culprit::Program("ember_offcpu_lock_begin".into()))
        );
    }

    #[test]
    fn garbage_says_nothing() {
        let p = Parsed::from_messages(&msgs(&[
            "prog '",
            "map 'x",
            "",
            "-- BEGIN PROG LOAD LOG --",
        ]));
        assert_eq!(p, Parsed::default());
    }
}
