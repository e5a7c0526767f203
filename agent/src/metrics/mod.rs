//! Every metric ember exports about itself, declared once: in the `metric_table!` rows
//! ([`table`]) of [`Metrics`] and the sets nested in it ([`containers::ContainerMetrics`],
//! [`ExportMetrics`]), which make the fields, their registration and the list docs/metrics.md
//! is generated from ([`Metrics::declared`], [`reference`]). The label values are the enums of
//! [`reasons`].
//!
//! Stages get a clone of [`Metrics`] (its handles are cheap `Arc`s) and update
//! their own series; the HTTP server encodes the registry on scrape.

pub mod containers;
pub mod progress;
pub mod reasons;
pub mod reference;
pub mod snapshot;
pub mod table;

use std::collections::HashSet;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{
    EncodeLabel, EncodeLabelSet, EncodeLabelValue, LabelSetEncoder, LabelValueEncoder,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use table::{metric_table, MetricSet};

pub use table::Declared;

pub use reasons::WindowFailure;
pub use reasons::{
    Cache, DebuginfodResult, DwarfRead, DwarfSkip, ExportDrop, FrameResult, HttpRefusal, JitReject,
    JvmRefresh, Loss, NameCap, ObjectRefusal, OffCpuEvent, ProcRead, PyAttach, PyCodeRead,
    ReadingsSource, RowLookup, SinkName, StackSide, Stage, SymbolMiss, SymbolSource, TableBuild,
    WindowWriteError,
};

use crate::model::{PyWalk, StackEnd};

/// Label set with a single `reason`, one of the enums of [`reasons`].
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct ReasonLabel<R> {
    /// Why the item was lost, dropped, refused or missed.
    pub reason: R,
}

impl<R: Copy> ReasonLabel<R> {
    /// A label set per value of `reasons` (series made at start).
    pub fn every(reasons: &'static [R]) -> impl Iterator<Item = Self> {
        reasons.iter().map(|&reason| Self { reason })
    }
}

impl<R: EncodeLabelValue + Copy> EncodeLabelSet for ReasonLabel<R> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        ("reason", self.reason).encode(encoder.encode_label())
    }
}

/// Label set with a single `result`, one of the enums of [`reasons`].
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct ResultLabel<R> {
    /// How the thing counted ended.
    pub result: R,
}

impl<R: Copy> ResultLabel<R> {
    /// A label set per value of `results` (series made at start).
    pub fn every(results: &'static [R]) -> impl Iterator<Item = Self> {
        results.iter().map(|&result| Self { result })
    }
}

impl<R: EncodeLabelValue + Copy> EncodeLabelSet for ResultLabel<R> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        ("result", self.result).encode(encoder.encode_label())
    }
}

/// Label set naming a side of a stack.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SideLabel {
    /// `kernel` or `user`.
    pub side: StackSide,
}

/// Label set with a single `source`: a readings source, or where a name came from.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct SourceLabel<S = ReadingsSource> {
    /// Which [`crate::readings::Source`], or which [`SymbolSource`].
    pub source: S,
}

impl<S: Copy> SourceLabel<S> {
    /// A label set per value of `sources` (series made at start).
    pub fn every(sources: &'static [S]) -> impl Iterator<Item = Self> {
        sources.iter().map(|&source| Self { source })
    }
}

impl<S: EncodeLabelValue + Copy> EncodeLabelSet for SourceLabel<S> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        ("source", self.source).encode(encoder.encode_label())
    }
}

/// The `cache` label value of `ember_cache_dropped_total`: a bounded cache or queue that was
/// full, or a window that failed on its way out (counted there under its own values).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum DropCause {
    /// Entries let go because the cache or queue was full.
    Full(Cache),
    /// A window that could not be compressed or written.
    Failed(WindowFailure),
}

impl EncodeLabelValue for DropCause {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        match self {
            DropCause::Full(cache) => cache.encode(encoder),
            DropCause::Failed(failure) => failure.encode(encoder),
        }
    }
}

/// Label set naming a bounded cache or queue, or a window failure.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabel {
    /// Which cache or queue, or how a window failed.
    pub cache: DropCause,
}

metric_table! {
    /// Handles to all of ember's own metrics, declared once: each row's doc comment is its
    /// help, the rows' order is the exposition's.
    #[derive(Clone)]
    pub struct Metrics {
        registry: Arc<Registry> = plain(Arc::default()),
        /// Samples that reached userspace with their stacks.
        pub samples: Counter = metric("samples"),
        /// Samples lost, by reason.
        pub samples_lost: Family<ReasonLabel<Loss>, Counter> = metric(
            "samples_lost",
            labels ["reason"],
            // Every reason exists from the start, so alert expressions such as
            // `rate(ember_samples_lost_total[5m]) > 0` have a series to read.
            start ReasonLabel::every(Loss::ALL)
        ),
        /// Samples not taken or dropped because a filter excludes their workload.
        pub samples_filtered: Counter = metric("samples_filtered"),
        /// Per-container CPU series.
        pub containers: containers::ContainerMetrics = group(),
        /// 1 while the pod watch is synced with the API server, else 0 (host mode or
        /// reconnecting).
        pub kubernetes_fresh: Gauge<i64, AtomicI64> = metric("kubernetes_metadata_fresh"),
        /// Stacks the kernel could not walk; the sample is kept with the other side.
        pub stack_errors: Family<SideLabel, Counter> = metric("stack_errors", labels ["side"]),
        /// Profile windows written.
        pub windows: Counter = metric("windows"),
        /// Frames written, by whether they were named.
        pub frames: Family<ResultLabel<FrameResult>, Counter> = metric(
            "frames",
            labels ["result"],
            start ResultLabel::every(FrameResult::ALL)
        ),
        /// Time to symbolize and encode one window.
        pub window_encode_seconds: Histogram = metric(
            "window_encode",
            unit Seconds,
            new Histogram::new(exponential_buckets(0.001, 2.0, 14))
        ),
        /// Resident memory of the ember process.
        pub resident_memory: Gauge<i64, AtomicI64> = metric(
            "process_resident_memory",
            unit Bytes
        ),
        /// Processes ember holds mappings for.
        pub processes: Gauge<i64, AtomicI64> = metric("processes_tracked"),
        /// Object files held open for symbolization.
        pub objects: Gauge<i64, AtomicI64> = metric("objects_open"),
        /// Entries dropped from a bounded cache or queue because it was full.
        // Windows that failed (`DropCause::Failed`) count here too, as they always did.
        pub cache_dropped: Family<CacheLabel, Counter> = metric("cache_dropped", labels ["cache"]),
        /// Processes forgotten after they exited.
        pub processes_evicted: Counter = metric("processes_evicted"),
        /// Online CPUs with a sampling perf event.
        pub cpus_sampled: Gauge<i64, AtomicI64> = metric("cpus_sampled"),
        /// 1 for each part of the BPF object that runs on this kernel, 0 for each that
        /// does not, with why (`ember features` says it in full).
        pub feature_enabled: Family<FeatureLabels, Gauge<i64, AtomicI64>> = metric(
            "feature_enabled",
            labels ["feature", "reason"]
        ),
        /// Unreadable or malformed /proc entries, counted and skipped.
        pub proc_read_errors: Family<ReasonLabel<ProcRead>, Counter> = metric(
            "proc_read_errors",
            labels ["reason"]
        ),
        /// Failed reads of a resource-readings source, by source.
        pub readings_errors: Family<SourceLabel, Counter> = metric(
            "readings_errors",
            labels ["source"]
        ),
        /// Shipping windows to network sinks.
        pub export: ExportMetrics = group(),
        /// The latest resource readings, rendered on every scrape.
        pub readings: snapshot::Published = collector(),
        /// Window directory faults (full, read-only, removed), by reason.
        pub window_write_errors: Family<ReasonLabel<WindowWriteError>, Counter> = metric(
            "window_write_errors",
            labels ["reason"],
            start ReasonLabel::every(WindowWriteError::ALL)
        ),
        /// JIT symbol files, lines and records refused (perf maps, jitdumps), by reason.
        pub jit_rejects: Family<ReasonLabel<JitReject>, Counter> = metric(
            "jit_rejects",
            labels ["reason"]
        ),
        /// HTTP connections and requests turned away or cut short, by reason.
        pub http_refused: Family<ReasonLabel<HttpRefusal>, Counter> = metric(
            "http_refused",
            labels ["reason"],
            start ReasonLabel::every(HttpRefusal::ALL)
        ),
        /// Heavy HTTP requests (reading, merging or rendering windows) whose work is running.
        pub http_heavy_running: Gauge<i64, AtomicI64> = metric("http_heavy_running"),
        /// JIT symbols held across all processes.
        pub jit_entries: Gauge<i64, AtomicI64> = metric("jit_entries"),
        /// Bytes charged for the JIT symbols held across all processes (names, ranges, debug
        /// lines).
        pub jit_bytes: Gauge<i64, AtomicI64> = metric("jit_bytes"),
        /// Bytes read from perf maps and jitdumps.
        pub jit_read_bytes: Counter = metric("jit_read", unit Bytes),
        /// Processes that map a CPython interpreter, by what came of attaching to it.
        pub python_attaches: Family<ResultLabel<PyAttach>, Counter> = metric(
            "python_attaches",
            labels ["result"],
            start ResultLabel::every(PyAttach::ALL)
        ),
        /// Samples whose stack met the Python eval loop, by how their Python frames came out.
        pub python_walks: Family<ResultLabel<PyWalk>, Counter> = metric(
            "python_walks",
            labels ["result"],
            start ResultLabel::every(PyWalk::ALL)
        ),
        /// Python frames named from their code objects, by result.
        pub python_code_reads: Family<ResultLabel<PyCodeRead>, Counter> = metric(
            "python_code_reads",
            labels ["result"],
            start ResultLabel::every(PyCodeRead::ALL)
        ),
        /// Bytes of named Python code objects held (`interpreters.python.cache_bytes`).
        pub python_code_cache_bytes: Gauge<i64, AtomicI64> = metric("python_code_cache", unit Bytes),
        /// Debug files asked of the debuginfod servers, by result.
        pub debuginfod_requests: Family<ResultLabel<DebuginfodResult>, Counter> = metric(
            "debuginfod_requests",
            labels ["result"],
            start ResultLabel::every(DebuginfodResult::ALL)
        ),
        /// Bytes of debug files in the debuginfod disk cache (`symbols.debuginfod_cache_bytes`).
        pub debuginfod_cache_bytes: Gauge<i64, AtomicI64> = metric("debuginfod_cache", unit Bytes),
        /// Python processes whose frames the sampler walks.
        pub python_processes: Gauge<i64, AtomicI64> = metric("python_processes"),
        /// JVMs asked to rewrite their perf map over the attach protocol, by result.
        pub jvm_refreshes: Family<ResultLabel<JvmRefresh>, Counter> = metric(
            "jvm_perfmap_refreshes",
            labels ["result"]
        ),
        /// Addresses in object files that got no name, by reason (error: the object is
        /// unreadable).
        pub symbol_misses: Family<ReasonLabel<SymbolMiss>, Counter> = metric(
            "symbol_misses",
            labels ["reason"]
        ),
        /// Object files refused (open, read or parse), by reason; the object stays unnamed.
        pub object_refusals: Family<ReasonLabel<ObjectRefusal>, Counter> = metric(
            "object_refusals",
            labels ["reason"],
            start ReasonLabel::every(ObjectRefusal::ALL)
        ),
        /// Symbol names kept short of what a file made of them (shown as stored, or cut at 4
        /// KiB), by reason.
        pub symbol_names_capped: Family<ReasonLabel<NameCap>, Counter> = metric(
            "symbol_names_capped",
            labels ["reason"],
            start ReasonLabel::every(NameCap::ALL)
        ),
        /// Objects whose DWARF was read for inlined frames and lines, by result.
        pub dwarf_objects: Family<ResultLabel<DwarfRead>, Counter> = metric(
            "dwarf_objects",
            labels ["result"],
            start ResultLabel::every(DwarfRead::ALL)
        ),
        /// DWARF section bytes read (inflated sections included; `symbols.dwarf_bytes` caps
        /// what is held).
        pub dwarf_read_bytes: Counter = metric("dwarf_read", unit Bytes),
        /// Sampled addresses of objects with DWARF that got no inline chain or line, by
        /// reason.
        pub dwarf_skipped: Family<ReasonLabel<DwarfSkip>, Counter> = metric(
            "dwarf_skipped",
            labels ["reason"],
            start ReasonLabel::every(DwarfSkip::ALL)
        ),
        /// Bytes of DWARF held between windows: units loaded and what was parsed of them
        /// (budget: symbols.dwarf_bytes).
        pub dwarf_cache_bytes: Gauge<i64, AtomicI64> = metric("dwarf_cache", unit Bytes),
        /// Addresses of object files looked up, by where their name came from.
        pub symbol_sources: Family<SourceLabel<SymbolSource>, Counter> = metric(
            "symbols",
            labels ["source"],
            start SourceLabel::every(SymbolSource::ALL)
        ),
        /// Memory of the parsed symbol tables held (budget: symbols.cache_bytes).
        pub symbol_table_bytes: Gauge<i64, AtomicI64> = metric("symbol_tables", unit Bytes),
        /// User stacks sampled, by workload and how the walk ended (complete: reached the
        /// program's entry or thread start).
        pub stacks: Family<WorkloadResultLabels, Counter> = metric(
            "stacks",
            labels ["workload", "result"]
        ),
        /// Frames of written stacks left unnamed (object+offset or [unknown]), by workload.
        pub unnamed_frames: Family<WorkloadLabel, Counter> = metric(
            "unnamed_frames",
            labels ["workload"]
        ),
        /// CPU stacks of interpreted processes, by workload, runtime and how the
        /// interpreter walk came out (`result` as in `python_walks_total`).
        pub interpreter_stacks: Family<InterpreterWalkLabels, Counter> = metric(
            "interpreter_stacks",
            labels ["workload", "runtime", "result"]
        ),
        /// Interpreter frames of written stacks, by workload, runtime and whether they
        /// were named (`named`, `unnamed`).
        pub interpreter_frames: Family<InterpreterFrameLabels, Counter> = metric(
            "interpreter_frames",
            labels ["workload", "runtime", "result"]
        ),
        /// Objects the sampler needed an unwind table for, by what came of them.
        pub unwind_tables_built: Family<ResultLabel<TableBuild>, Counter> = metric(
            "unwind_tables_built",
            labels ["result"],
            start ResultLabel::every(TableBuild::ALL)
        ),
        /// Frames the sampler walked by an unwind table, by where it found their row (its
        /// per-CPU row cache, or a search of the table).
        pub unwind_row_lookups: Family<ResultLabel<RowLookup>, Counter> = metric(
            "unwind_row_lookups",
            labels ["result"],
            start ResultLabel::every(RowLookup::ALL)
        ),
        /// The sampler's asks to read a process again for a pc outside its ranges that
        /// were not served: the kernel's task records, none lost since the process's last
        /// read, tell of no new executable mapping (the pc came from a frame-pointer chain
        /// through code without them, or lies in an object that was refused).
        pub unwind_remaps_skipped: Counter = metric("unwind_remaps_skipped"),
        /// Unwind tables loaded in the kernel.
        pub unwind_tables: Gauge<i64, AtomicI64> = metric("unwind_tables"),
        /// Processes whose executable ranges the sampler holds.
        pub unwind_processes: Gauge<i64, AtomicI64> = metric("unwind_processes"),
        /// Kernel memory of unwind tables and ranges (counts against the agent's cgroup).
        pub unwind_map_bytes: Gauge<i64, AtomicI64> = metric("unwind_map", unit Bytes),
        /// Off-CPU switch-outs and blocks, by what became of them (losses: map_full,
        /// ringbuf_full, no_scratch, malformed, task_full, task_work_failed, exited).
        pub offcpu_events: Family<ResultLabel<OffCpuEvent>, Counter> = metric(
            "offcpu_events",
            labels ["result"]
        ),
        /// Long blocks whose stacks the off-CPU programs hold now (at most
        /// offcpu.max_threads).
        pub offcpu_threads: Gauge<i64, AtomicI64> = metric("offcpu_threads"),
        /// Threads with an off-CPU record (task storage) now (at most offcpu.max_tasks).
        pub offcpu_tasks: Gauge<i64, AtomicI64> = metric("offcpu_tasks"),
        /// Signs of life of the pipeline stages, for `/healthz`.
        pub progress: Arc<progress::Progress> = plain(Arc::default()),
        lost_sum: Arc<AtomicU64> = plain(Arc::default()),
        /// Workloads with their own series in the per-workload families (at most
        /// [`MAX_WORKLOADS`]).
        workloads: Arc<Mutex<HashSet<String>>> = plain(Arc::default()),
    }
}

/// Label set of `ember_feature_enabled`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FeatureLabels {
    /// The feature (`sampler`, `unwind_tables`, `offcpu`...).
    pub feature: &'static str,
    /// Why it is on or off: `loaded`, `config`, `unsupported`, `refused`, `attach_failed`.
    pub reason: &'static str,
}

/// Label set of `ember_unnamed_frames_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkloadLabel {
    /// As in [`WorkloadResultLabels`].
    pub workload: String,
}

/// Label set of `ember_stacks_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkloadResultLabels {
    /// The service, container (`namespace/pod/container`) or, for host processes, the process
    /// name; `other` past [`MAX_WORKLOADS`] workloads.
    pub workload: String,
    /// How the stack ended.
    pub result: StackEnd,
}

/// Label set of `ember_interpreter_stacks_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InterpreterWalkLabels {
    /// As in [`WorkloadResultLabels`].
    pub workload: String,
    /// The interpreter (`python`).
    pub runtime: &'static str,
    /// How its frames came out.
    pub result: PyWalk,
}

/// Label set of `ember_interpreter_frames_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InterpreterFrameLabels {
    /// As in [`WorkloadResultLabels`].
    pub workload: String,
    /// The interpreter (`python`).
    pub runtime: &'static str,
    /// `named` or `unnamed`.
    pub result: FrameResult,
}

/// Workloads `ember_stacks_total` keeps apart (families only grow); later ones share
/// `workload="other"`.
pub const MAX_WORKLOADS: usize = 500;

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates the registry and registers every metric of the table under the `ember_`
    /// prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ember");
        let mut metrics = <Self as MetricSet>::register(&mut registry);
        metrics.registry = Arc::new(registry);
        metrics
    }

    /// Every metric the table declares, in exposition order.
    pub fn declared() -> Vec<Declared> {
        let mut out = Vec::new();
        <Self as MetricSet>::declared(&mut out);
        out
    }

    /// Counts `n` samples lost for `reason`.
    pub fn lost(&self, reason: Loss, n: u64) {
        self.samples_lost
            .get_or_create(&ReasonLabel { reason })
            .inc_by(n);
        self.lost_sum.fetch_add(n, Ordering::Relaxed);
    }

    /// Samples lost so far, all reasons together.
    pub fn lost_total(&self) -> u64 {
        self.lost_sum.load(Ordering::Relaxed)
    }

    /// The `workload` label for a workload named `name`: itself while fewer than
    /// [`MAX_WORKLOADS`] have series, `other` past that (label families only grow).
    pub fn workload_label(&self, name: String) -> String {
        let mut seen = self.workloads.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(&name) {
            return name;
        }
        if seen.len() >= MAX_WORKLOADS {
            return "other".to_owned();
        }
        seen.insert(name.clone());
        name
    }

    /// Counts `n` frames of `workload` left unnamed.
    pub fn unnamed_frames(&self, workload: String, n: u64) {
        let workload = self.workload_label(workload);
        self.unnamed_frames
            .get_or_create(&WorkloadLabel { workload })
            .inc_by(n);
    }

    /// Counts `n` CPU stacks of `workload` whose `runtime` walk ended with `result`.
    pub fn interpreter_stacks_ended(
        &self,
        workload: &str,
        runtime: &'static str,
        result: PyWalk,
        n: u64,
    ) {
        let labels = InterpreterWalkLabels {
            workload: workload.to_owned(),
            runtime,
            result,
        };
        self.interpreter_stacks.get_or_create(&labels).inc_by(n);
    }

    /// Counts `n` interpreter frames of `workload` written with `result`.
    pub fn interpreter_frames_written(
        &self,
        workload: String,
        runtime: &'static str,
        result: FrameResult,
        n: u64,
    ) {
        let workload = self.workload_label(workload);
        let labels = InterpreterFrameLabels {
            workload,
            runtime,
            result,
        };
        self.interpreter_frames.get_or_create(&labels).inc_by(n);
    }

    /// Counts `n` user stacks of `workload` that ended with `result`.
    pub fn stacks_ended(&self, workload: &str, result: StackEnd, n: u64) {
        let labels = WorkloadResultLabels {
            workload: workload.to_owned(),
            result,
        };
        self.stacks.get_or_create(&labels).inc_by(n);
    }

    /// Counts an object the sampler needed a table for, by `result`.
    pub fn table_built(&self, result: TableBuild) {
        self.unwind_tables_built
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Counts `n` frames walked by a table whose row was found as `result` says.
    pub fn row_lookups(&self, result: RowLookup, n: u64) {
        self.unwind_row_lookups
            .get_or_create(&ResultLabel { result })
            .inc_by(n);
    }

    /// Counts `n` off-CPU switch-outs or blocks that ended in `result`.
    pub fn offcpu(&self, result: OffCpuEvent, n: u64) {
        self.offcpu_events
            .get_or_create(&ResultLabel { result })
            .inc_by(n);
    }

    /// Counts `n` entries dropped from the cache or queue `cache` because it was full.
    pub fn dropped(&self, cache: Cache, n: u64) {
        self.cache_dropped
            .get_or_create(&CacheLabel {
                cache: DropCause::Full(cache),
            })
            .inc_by(n);
    }

    /// Counts a window dropped because it failed as `failure` says.
    pub fn window_failed(&self, failure: WindowFailure) {
        self.cache_dropped
            .get_or_create(&CacheLabel {
                cache: DropCause::Failed(failure),
            })
            .inc();
    }

    /// Counts `n` stacks of `side` the kernel could not walk.
    pub fn stack_error(&self, side: StackSide, n: u64) {
        self.stack_errors
            .get_or_create(&SideLabel { side })
            .inc_by(n);
    }

    /// Counts `n` frames written with `result`.
    pub fn frames_written(&self, result: FrameResult, n: u64) {
        self.frames.get_or_create(&ResultLabel { result }).inc_by(n);
    }

    /// Counts `n` unreadable or malformed `/proc` entries of kind `reason`.
    pub fn proc_read_error(&self, reason: ProcRead, n: u64) {
        self.proc_read_errors
            .get_or_create(&ReasonLabel { reason })
            .inc_by(n);
    }

    /// Counts `n` window directory faults of kind `reason`.
    pub fn window_write_error(&self, reason: WindowWriteError, n: u64) {
        self.window_write_errors
            .get_or_create(&ReasonLabel { reason })
            .inc_by(n);
    }

    /// Counts a failed read of the readings source `source`.
    pub fn readings_error(&self, source: ReadingsSource) {
        self.readings_errors
            .get_or_create(&SourceLabel { source })
            .inc();
    }

    /// Counts one HTTP connection or request turned away for `reason`.
    pub fn http_refused(&self, reason: HttpRefusal) {
        self.http_refused
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// Counts `n` JIT files, lines or records refused for `reason`.
    pub fn jit_rejected(&self, reason: JitReject, n: u64) {
        self.jit_rejects
            .get_or_create(&ReasonLabel { reason })
            .inc_by(n);
    }

    /// Counts one debuginfod request that ended with `result`.
    pub fn debuginfod_request(&self, result: DebuginfodResult) {
        self.debuginfod_requests
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Counts one look at a Python process that ended with `result`.
    pub fn python_attached(&self, result: PyAttach) {
        self.python_attaches
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Counts `n` samples whose Python walk ended with `result`.
    pub fn python_walked(&self, result: PyWalk, n: u64) {
        self.python_walks
            .get_or_create(&ResultLabel { result })
            .inc_by(n);
    }

    /// Counts `n` Python frames named (or not) with `result`.
    pub fn python_code_read(&self, result: PyCodeRead, n: u64) {
        self.python_code_reads
            .get_or_create(&ResultLabel { result })
            .inc_by(n);
    }

    /// Counts one JVM perf map refresh that ended with `result`.
    pub fn jvm_refreshed(&self, result: JvmRefresh) {
        self.jvm_refreshes
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Counts one object whose DWARF reading ended with `result`.
    pub fn dwarf_read(&self, result: DwarfRead) {
        self.dwarf_objects
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Counts an object file refused for `reason`.
    pub fn object_refused(&self, reason: ObjectRefusal) {
        self.object_refusals
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// Counts `n` symbol names kept short of what a file made of them, for `reason`.
    pub fn name_capped(&self, reason: NameCap, n: u64) {
        self.symbol_names_capped
            .get_or_create(&ReasonLabel { reason })
            .inc_by(n);
    }

    /// Counts `n` addresses of object files named from `source`.
    pub fn symbols_from(&self, source: SymbolSource, n: u64) {
        self.symbol_sources
            .get_or_create(&SourceLabel { source })
            .inc_by(n);
    }

    /// Counts `n` sampled addresses that got no DWARF chain, for `reason`.
    pub fn dwarf_skipped(&self, reason: DwarfSkip, n: u64) {
        self.dwarf_skipped
            .get_or_create(&ReasonLabel { reason })
            .inc_by(n);
    }

    /// Counts `n` addresses of object files that got no name, for `reason`.
    pub fn symbol_missed(&self, reason: SymbolMiss, n: u64) {
        self.symbol_misses
            .get_or_create(&ReasonLabel { reason })
            .inc_by(n);
    }

    /// Encodes the registry in the OpenMetrics text format, refreshing the RSS gauge first.
    pub fn encode(&self) -> String {
        if let Some(rss) = crate::os::procfs::self_rss_bytes() {
            self.resident_memory.set(rss as i64);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Label set naming a sink.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SinkLabel {
    /// `pyroscope` or `otlp`.
    pub sink: SinkName,
}

/// Label set naming a sink and why something was dropped.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SinkReasonLabel {
    /// `pyroscope` or `otlp`.
    pub sink: SinkName,
    /// `queue_full`, `too_large`, `http_400`, `grpc_invalid_argument`, `retries_exhausted`, ...
    pub reason: ExportDrop,
}

/// The latency histogram of one sink.
type LatencyFamily = Family<SinkLabel, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms … ~33 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

metric_table! {
    /// `ember_export_*`: what the network sinks delivered, dropped and how long it took.
    #[derive(Clone)]
    pub struct ExportMetrics {
        /// Stacks a sink pushed under its overflow series, past its series cap per window.
        pub series_folded: Family<SinkLabel, Counter> = metric(
            "export_series_folded",
            labels ["sink"]
        ),
        /// Requests to a sink dropped, by sink and reason.
        pub dropped: Family<SinkReasonLabel, Counter> = metric(
            "export_dropped",
            labels ["sink", "reason"]
        ),
        /// Requests a sink's backend accepted.
        pub sent: Family<SinkLabel, Counter> = metric("export_sent", labels ["sink"]),
        /// Bytes of requests a sink's backend accepted, as sent.
        pub sent_bytes: Family<SinkLabel, Counter> = metric(
            "export_sent",
            unit Bytes,
            labels ["sink"]
        ),
        /// Time from a request's first attempt to its acceptance, retries included.
        pub latency: LatencyFamily = metric(
            "export_latency",
            unit Seconds,
            labels ["sink"],
            new Family::new_with_constructor(latency_histogram)
        ),
        /// Bytes waiting in a sink's queue.
        pub queue_bytes: Family<SinkLabel, Gauge<i64, AtomicI64>> = metric(
            "export_queue",
            unit Bytes,
            labels ["sink"]
        ),
    }
}

impl ExportMetrics {
    /// Counts `n` requests of `sink` dropped for `reason`.
    pub fn drop(&self, sink: SinkName, reason: ExportDrop, n: u64) {
        self.dropped
            .get_or_create(&SinkReasonLabel { sink, reason })
            .inc_by(n);
    }

    /// Creates a sink's series at zero so they exist from the start.
    pub fn announce(&self, sink: SinkName) {
        let l = SinkLabel { sink };
        let _ = self.sent.get_or_create(&l);
        let _ = self.sent_bytes.get_or_create(&l);
        let _ = self.queue_bytes.get_or_create(&l);
        let _ = self.latency.get_or_create(&l);
        self.drop(sink, ExportDrop::QueueFull, 0);
    }
}

/// Content type of [`Metrics::encode`]'s output.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod golden;
#[cfg(test)]
mod tests;
