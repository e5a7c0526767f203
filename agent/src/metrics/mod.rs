//! Every metric ember exports about itself, defined in one place.
//!
//! Stages get a clone of [`Metrics`] (its handles are cheap `Arc`s) and update
//! their own series; the HTTP server encodes the registry on scrape.

pub mod containers;
pub mod progress;
pub mod reasons;
pub mod snapshot;

use std::collections::HashSet;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, EncodeLabelValue, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

pub use reasons::{
    Cache, ExportDrop, FrameResult, HttpRefusal, JitReject, JvmRefresh, Loss, NameCap,
    ObjectRefusal, OffCpuEvent, OffState, ProcRead, ReadingsSource, RowLookup, StackEnd, StackSide,
    Stage, SymbolMiss, TableBuild, WindowWriteError,
};

/// Label set with a single `reason`, one of the enums of [`reasons`].
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct ReasonLabel<R> {
    /// Why the item was lost, dropped, refused or missed.
    pub reason: R,
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

/// Label set naming a readings source.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    /// Which [`crate::readings::Source`].
    pub source: ReadingsSource,
}

/// Label set naming a bounded cache or queue.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabel {
    /// Which cache or queue.
    pub cache: Cache,
}

/// Handles to all of ember's own metrics.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// Samples that reached userspace with their stacks.
    pub samples: Counter,
    /// Samples lost, by where they were lost.
    pub samples_lost: Family<ReasonLabel<Loss>, Counter>,
    /// Samples not taken or dropped because a filter excludes their workload.
    pub samples_filtered: Counter,
    /// Per-container CPU series.
    pub containers: containers::ContainerMetrics,
    /// 1 while Kubernetes metadata is synced with the API server, else 0.
    pub kubernetes_fresh: Gauge<i64, AtomicI64>,
    /// Stacks the kernel could not walk (the sample is kept with the other side).
    pub stack_errors: Family<SideLabel, Counter>,
    /// Windows closed and written.
    pub windows: Counter,
    /// Frames written, by whether a name was found.
    pub frames: Family<ResultLabel<FrameResult>, Counter>,
    /// Time to symbolize and encode one window.
    pub window_encode_seconds: Histogram,
    /// Resident memory of the agent, read on scrape.
    pub resident_memory: Gauge<i64, AtomicI64>,
    /// Processes the agent currently knows about.
    pub processes: Gauge<i64, AtomicI64>,
    /// Object files (executables and libraries) currently held open.
    pub objects: Gauge<i64, AtomicI64>,
    /// Entries dropped from a bounded cache or queue because it was full.
    pub cache_dropped: Family<CacheLabel, Counter>,
    /// Processes forgotten after they exited.
    pub processes_evicted: Counter,
    /// Online CPUs that have a sampling perf event attached.
    pub cpus_sampled: Gauge<i64, AtomicI64>,
    /// Problems reading /proc that were counted and skipped, by file.
    pub proc_read_errors: Family<ReasonLabel<ProcRead>, Counter>,
    /// Failed reads of a readings source, by source.
    pub readings_errors: Family<SourceLabel, Counter>,
    /// The latest resource readings, rendered on every scrape.
    pub readings: snapshot::Published,
    /// Shipping windows to network sinks.
    pub export: ExportMetrics,
    /// JIT map files, lines and records refused, by reason.
    pub jit_rejects: Family<ReasonLabel<JitReject>, Counter>,
    /// Window directory faults, by reason.
    pub window_write_errors: Family<ReasonLabel<WindowWriteError>, Counter>,
    /// HTTP connections and requests turned away, by reason.
    pub http_refused: Family<ReasonLabel<HttpRefusal>, Counter>,
    /// Heavy HTTP requests (reading, merging, rendering windows) whose blocking work runs.
    pub http_heavy_running: Gauge<i64, AtomicI64>,
    /// JIT symbol entries held across all processes.
    pub jit_entries: Gauge<i64, AtomicI64>,
    /// Bytes charged for the JIT symbols held across all processes.
    pub jit_bytes: Gauge<i64, AtomicI64>,
    /// Bytes read from perf maps and jitdumps.
    pub jit_read_bytes: Counter,
    /// JVM perf map refreshes asked for, by result.
    pub jvm_refreshes: Family<ResultLabel<JvmRefresh>, Counter>,
    /// Addresses of object files that got no name, by reason.
    pub symbol_misses: Family<ReasonLabel<SymbolMiss>, Counter>,
    /// Object files refused (open, read or parse), by reason.
    pub object_refusals: Family<ReasonLabel<ObjectRefusal>, Counter>,
    /// Symbol names kept short of what a file made of them, by reason.
    pub symbol_names_capped: Family<ReasonLabel<NameCap>, Counter>,
    /// Bytes of the parsed symbol tables held.
    pub symbol_table_bytes: Gauge<i64, AtomicI64>,
    /// Signs of life of the pipeline stages, for `/healthz`.
    pub progress: Arc<progress::Progress>,
    /// User stacks by workload and how their walk ended.
    pub stacks: Family<WorkloadResultLabels, Counter>,
    /// Unwind tables the sampler needed, by what came of them.
    pub unwind_tables_built: Family<ResultLabel<TableBuild>, Counter>,
    /// Frames walked by a table, by where their row was found.
    pub unwind_row_lookups: Family<ResultLabel<RowLookup>, Counter>,
    /// Unwind tables loaded in the kernel now.
    pub unwind_tables: Gauge<i64, AtomicI64>,
    /// Processes with unwind ranges in the kernel now.
    pub unwind_processes: Gauge<i64, AtomicI64>,
    /// Kernel memory of unwind tables and ranges now, in bytes.
    pub unwind_map_bytes: Gauge<i64, AtomicI64>,
    /// Off-CPU switch-outs and blocks, by what became of them.
    pub offcpu_events: Family<ResultLabel<OffCpuEvent>, Counter>,
    /// Threads off CPU whose stacks the off-CPU program holds now.
    pub offcpu_threads: Gauge<i64, AtomicI64>,
    /// Frames left unnamed in written stacks, by workload.
    pub unnamed_frames: Family<WorkloadLabel, Counter>,
    lost_sum: Arc<AtomicU64>,
    /// Workloads with their own series in the per-workload families (at most
    /// [`MAX_WORKLOADS`]).
    workloads: Arc<Mutex<HashSet<String>>>,
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

/// Workloads `ember_stacks_total` keeps apart (families only grow); later ones share
/// `workload="other"`.
pub const MAX_WORKLOADS: usize = 500;

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates the registry and registers every metric under the `ember_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ember");
        let samples = Counter::default();
        registry.register(
            "samples",
            "Samples that reached userspace with their stacks",
            samples.clone(),
        );
        let samples_lost = Family::<ReasonLabel<Loss>, Counter>::default();
        registry.register(
            "samples_lost",
            "Samples lost, by reason",
            samples_lost.clone(),
        );
        let samples_filtered = Counter::default();
        registry.register(
            "samples_filtered",
            "Samples not taken or dropped because a filter excludes their workload",
            samples_filtered.clone(),
        );
        let containers = containers::ContainerMetrics::default();
        registry.register_with_unit(
            "container_cpu",
            "CPU time of each container estimated from samples (samples / frequency)",
            Unit::Seconds,
            containers.sampled.clone(),
        );
        registry.register_with_unit(
            "container_cgroup_cpu",
            "CPU time of each container as its cgroup counts it (cpuacct.usage or cpu.stat usage_usec)",
            Unit::Seconds,
            containers.cgroup.clone(),
        );
        registry.register_with_unit(
            "container_offcpu",
            "Time the threads of each container were off CPU, by why (sleep, disk, runnable; offcpu.enabled)",
            Unit::Seconds,
            containers.offcpu.clone(),
        );
        registry.register(
            "container_info",
            "Container identity and placement, for joins (always 1)",
            containers.info.clone(),
        );
        let kubernetes_fresh = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "kubernetes_metadata_fresh",
            "1 while the pod watch is synced with the API server, else 0 (host mode or reconnecting)",
            kubernetes_fresh.clone(),
        );
        let stack_errors = Family::<SideLabel, Counter>::default();
        registry.register(
            "stack_errors",
            "Stacks the kernel could not walk; the sample is kept with the other side",
            stack_errors.clone(),
        );
        let windows = Counter::default();
        registry.register("windows", "Profile windows written", windows.clone());
        let frames = Family::<ResultLabel<FrameResult>, Counter>::default();
        registry.register(
            "frames",
            "Frames written, by whether they were named",
            frames.clone(),
        );
        let window_encode_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        registry.register_with_unit(
            "window_encode",
            "Time to symbolize and encode one window",
            Unit::Seconds,
            window_encode_seconds.clone(),
        );
        let resident_memory = Gauge::<i64, AtomicI64>::default();
        registry.register_with_unit(
            "process_resident_memory",
            "Resident memory of the ember process",
            Unit::Bytes,
            resident_memory.clone(),
        );
        let processes = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "processes_tracked",
            "Processes ember holds mappings for",
            processes.clone(),
        );
        let objects = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "objects_open",
            "Object files held open for symbolization",
            objects.clone(),
        );
        let cache_dropped = Family::<CacheLabel, Counter>::default();
        registry.register(
            "cache_dropped",
            "Entries dropped from a bounded cache or queue because it was full",
            cache_dropped.clone(),
        );
        let processes_evicted = Counter::default();
        registry.register(
            "processes_evicted",
            "Processes forgotten after they exited",
            processes_evicted.clone(),
        );
        let cpus_sampled = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "cpus_sampled",
            "Online CPUs with a sampling perf event",
            cpus_sampled.clone(),
        );
        let proc_read_errors = Family::<ReasonLabel<ProcRead>, Counter>::default();
        registry.register(
            "proc_read_errors",
            "Unreadable or malformed /proc entries, counted and skipped",
            proc_read_errors.clone(),
        );
        let readings_errors = Family::<SourceLabel, Counter>::default();
        registry.register(
            "readings_errors",
            "Failed reads of a resource-readings source, by source",
            readings_errors.clone(),
        );
        let readings = snapshot::Published::default();
        let export = ExportMetrics::register(&mut registry);
        registry.register_collector(Box::new(readings.clone()));
        // Create every loss reason and frame result up front, so alert expressions such as
        // `rate(ember_samples_lost_total[5m]) > 0` have a series to read from the start.
        for &reason in Loss::ALL {
            let _ = samples_lost.get_or_create(&ReasonLabel { reason });
        }
        let window_write_errors = Family::<ReasonLabel<WindowWriteError>, Counter>::default();
        registry.register(
            "window_write_errors",
            "Window directory faults (full, read-only, removed), by reason",
            window_write_errors.clone(),
        );
        for &reason in WindowWriteError::ALL {
            let _ = window_write_errors.get_or_create(&ReasonLabel { reason });
        }
        let jit_rejects = Family::<ReasonLabel<JitReject>, Counter>::default();
        registry.register(
            "jit_rejects",
            "JIT symbol files, lines and records refused (perf maps, jitdumps), by reason",
            jit_rejects.clone(),
        );
        let http_refused = Family::<ReasonLabel<HttpRefusal>, Counter>::default();
        registry.register(
            "http_refused",
            "HTTP connections and requests turned away or cut short, by reason",
            http_refused.clone(),
        );
        for &reason in HttpRefusal::ALL {
            let _ = http_refused.get_or_create(&ReasonLabel { reason });
        }
        let http_heavy_running = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "http_heavy_running",
            "Heavy HTTP requests (reading, merging or rendering windows) whose work is running",
            http_heavy_running.clone(),
        );
        let jit_entries = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "jit_entries",
            "JIT symbols held across all processes",
            jit_entries.clone(),
        );
        let jit_bytes = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "jit_bytes",
            "Bytes charged for the JIT symbols held across all processes (names, ranges, debug lines)",
            jit_bytes.clone(),
        );
        let jit_read_bytes = Counter::default();
        registry.register_with_unit(
            "jit_read",
            "Bytes read from perf maps and jitdumps",
            Unit::Bytes,
            jit_read_bytes.clone(),
        );
        let jvm_refreshes = Family::<ResultLabel<JvmRefresh>, Counter>::default();
        registry.register(
            "jvm_perfmap_refreshes",
            "JVMs asked to rewrite their perf map over the attach protocol, by result",
            jvm_refreshes.clone(),
        );
        let symbol_misses = Family::<ReasonLabel<SymbolMiss>, Counter>::default();
        registry.register(
            "symbol_misses",
            "Addresses in object files that got no name, by reason (error: the object is unreadable)",
            symbol_misses.clone(),
        );
        let object_refusals = Family::<ReasonLabel<ObjectRefusal>, Counter>::default();
        registry.register(
            "object_refusals",
            "Object files refused (open, read or parse), by reason; the object stays unnamed",
            object_refusals.clone(),
        );
        for &reason in ObjectRefusal::ALL {
            let _ = object_refusals.get_or_create(&ReasonLabel { reason });
        }
        let symbol_names_capped = Family::<ReasonLabel<NameCap>, Counter>::default();
        registry.register(
            "symbol_names_capped",
            "Symbol names kept short of what a file made of them (shown as stored, or cut at 4 KiB), by reason",
            symbol_names_capped.clone(),
        );
        for &reason in NameCap::ALL {
            let _ = symbol_names_capped.get_or_create(&ReasonLabel { reason });
        }
        let symbol_table_bytes = Gauge::<i64, AtomicI64>::default();
        registry.register_with_unit(
            "symbol_tables",
            "Memory of the parsed symbol tables held (budget: symbols.cache_bytes)",
            Unit::Bytes,
            symbol_table_bytes.clone(),
        );
        for &result in FrameResult::ALL {
            let _ = frames.get_or_create(&ResultLabel { result });
        }
        let stacks = Family::<WorkloadResultLabels, Counter>::default();
        registry.register(
            "stacks",
            "User stacks sampled, by workload and how the walk ended (complete: reached the \
             program's entry or thread start)",
            stacks.clone(),
        );
        let unnamed_frames = Family::<WorkloadLabel, Counter>::default();
        registry.register(
            "unnamed_frames",
            "Frames of written stacks left unnamed (object+offset or [unknown]), by workload",
            unnamed_frames.clone(),
        );
        let unwind_tables_built = Family::<ResultLabel<TableBuild>, Counter>::default();
        registry.register(
            "unwind_tables_built",
            "Objects the sampler needed an unwind table for, by what came of them",
            unwind_tables_built.clone(),
        );
        for &result in TableBuild::ALL {
            let _ = unwind_tables_built.get_or_create(&ResultLabel { result });
        }
        let unwind_row_lookups = Family::<ResultLabel<RowLookup>, Counter>::default();
        registry.register(
            "unwind_row_lookups",
            "Frames the sampler walked by an unwind table, by where it found their row (its \
             per-CPU row cache, or a search of the table)",
            unwind_row_lookups.clone(),
        );
        for &result in RowLookup::ALL {
            let _ = unwind_row_lookups.get_or_create(&ResultLabel { result });
        }
        let unwind_tables = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "unwind_tables",
            "Unwind tables loaded in the kernel",
            unwind_tables.clone(),
        );
        let unwind_processes = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "unwind_processes",
            "Processes whose executable ranges the sampler holds",
            unwind_processes.clone(),
        );
        let unwind_map_bytes = Gauge::<i64, AtomicI64>::default();
        registry.register_with_unit(
            "unwind_map",
            "Kernel memory of unwind tables and ranges (counts against the agent's cgroup)",
            Unit::Bytes,
            unwind_map_bytes.clone(),
        );
        let offcpu_events = Family::<ResultLabel<OffCpuEvent>, Counter>::default();
        registry.register(
            "offcpu_events",
            "Off-CPU switch-outs and blocks, by what became of them (losses: map_full, ringbuf_full, no_scratch, malformed)",
            offcpu_events.clone(),
        );
        let offcpu_threads = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "offcpu_threads",
            "Threads off CPU whose stacks the off-CPU program holds now (at most offcpu.max_threads)",
            offcpu_threads.clone(),
        );
        Self {
            registry: Arc::new(registry),
            samples,
            samples_lost,
            samples_filtered,
            containers,
            kubernetes_fresh,
            stack_errors,
            windows,
            frames,
            window_encode_seconds,
            resident_memory,
            processes,
            objects,
            cache_dropped,
            processes_evicted,
            cpus_sampled,
            proc_read_errors,
            readings_errors,
            readings,
            export,
            jit_rejects,
            window_write_errors,
            http_refused,
            http_heavy_running,
            jit_entries,
            jit_bytes,
            jit_read_bytes,
            jvm_refreshes,
            symbol_misses,
            object_refusals,
            symbol_names_capped,
            symbol_table_bytes,
            progress: Arc::default(),
            stacks,
            unwind_tables_built,
            unwind_row_lookups,
            unwind_tables,
            unwind_processes,
            unwind_map_bytes,
            offcpu_events,
            offcpu_threads,
            unnamed_frames,
            lost_sum: Arc::default(),
            workloads: Arc::default(),
        }
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

    /// Counts `n` entries dropped from the cache or queue `cache`.
    pub fn dropped(&self, cache: Cache, n: u64) {
        self.cache_dropped
            .get_or_create(&CacheLabel { cache })
            .inc_by(n);
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

    /// Counts one JVM perf map refresh that ended with `result`.
    pub fn jvm_refreshed(&self, result: JvmRefresh) {
        self.jvm_refreshes
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
    pub sink: String,
}

/// Label set naming a sink and why something was dropped.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SinkReasonLabel {
    /// `pyroscope` or `otlp`.
    pub sink: String,
    /// `queue_full`, `too_large`, `http_400`, `grpc_invalid_argument`, `retries_exhausted`, ...
    pub reason: ExportDrop,
}

/// The latency histogram of one sink.
type LatencyFamily = Family<SinkLabel, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms … ~33 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// `ember_export_*`: what the network sinks delivered, dropped and how long it took.
#[derive(Clone)]
pub struct ExportMetrics {
    /// Requests (windows or parts of them) dropped, by sink and reason.
    pub dropped: Family<SinkReasonLabel, Counter>,
    /// Requests a backend accepted.
    pub sent: Family<SinkLabel, Counter>,
    /// Bytes of accepted requests, as sent (compressed).
    pub sent_bytes: Family<SinkLabel, Counter>,
    /// Time from the first attempt to the accepted reply, retries included.
    pub latency: LatencyFamily,
    /// Bytes waiting in each sink's queue.
    pub queue_bytes: Family<SinkLabel, Gauge<i64, AtomicI64>>,
    /// Stacks pushed under a sink's overflow series (past its series cap per window).
    pub series_folded: Family<SinkLabel, Counter>,
}

impl ExportMetrics {
    fn register(registry: &mut Registry) -> Self {
        let m = Self {
            dropped: Family::default(),
            sent: Family::default(),
            sent_bytes: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            queue_bytes: Family::default(),
            series_folded: Family::default(),
        };
        registry.register(
            "export_series_folded",
            "Stacks a sink pushed under its overflow series, past its series cap per window",
            m.series_folded.clone(),
        );
        registry.register(
            "export_dropped",
            "Requests to a sink dropped, by sink and reason",
            m.dropped.clone(),
        );
        registry.register(
            "export_sent",
            "Requests a sink's backend accepted",
            m.sent.clone(),
        );
        registry.register_with_unit(
            "export_sent",
            "Bytes of requests a sink's backend accepted, as sent",
            Unit::Bytes,
            m.sent_bytes.clone(),
        );
        registry.register_with_unit(
            "export_latency",
            "Time from a request's first attempt to its acceptance, retries included",
            Unit::Seconds,
            m.latency.clone(),
        );
        registry.register_with_unit(
            "export_queue",
            "Bytes waiting in a sink's queue",
            Unit::Bytes,
            m.queue_bytes.clone(),
        );
        m
    }

    /// Counts `n` requests of `sink` dropped for `reason`.
    pub fn drop(&self, sink: &str, reason: ExportDrop, n: u64) {
        self.dropped
            .get_or_create(&SinkReasonLabel {
                sink: sink.to_owned(),
                reason,
            })
            .inc_by(n);
    }

    /// Creates a sink's series at zero so they exist from the start.
    pub fn announce(&self, sink: &str) {
        let l = SinkLabel {
            sink: sink.to_owned(),
        };
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
mod tests {
    use super::*;

    #[test]
    fn workloads_past_the_cap_share_other() {
        let m = Metrics::new();
        for i in 0..MAX_WORKLOADS {
            assert_eq!(m.workload_label(format!("w{i}")), format!("w{i}"));
        }
        assert_eq!(m.workload_label("w0".into()), "w0");
        assert_eq!(m.workload_label("late".into()), "other");
        m.unnamed_frames("late".into(), 3);
        m.unnamed_frames("w1".into(), 2);
        let text = m.encode();
        assert!(
            text.contains("ember_unnamed_frames_total{workload=\"other\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("ember_unnamed_frames_total{workload=\"w1\"} 2"),
            "{text}"
        );
    }
}
