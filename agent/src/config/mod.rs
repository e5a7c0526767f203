//! ember's configuration: a documented YAML file, validated once into typed settings.
//!
//! `config/ember.yaml` is the default and is embedded in the binary; a user file
//! is layered over it key by key, so every key has exactly one documented default.

pub mod otlp;
pub mod pyroscope;
pub mod reference;
pub mod selector;
pub mod sinks;
mod symbols;
pub mod units;
mod validate;
pub mod values;

pub use sinks::{OtlpSink, PyroscopeApi, PyroscopeSink, ResourcePer, Sinks};
pub use symbols::Symbols;
pub use values::{Secret, Url};

use units::{duration, size};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// The default configuration, as shipped in `config/ember.yaml`.
pub const DEFAULT_YAML: &str = include_str!("../../../config/ember.yaml");

/// Why a configuration was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// YAML syntax or schema error, with its position.
    #[error("{origin}:{line}:{column}: {message}")]
    Parse {
        /// File name (or `<default>`).
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A value that parses but makes no sense.
    #[error("{origin}: {key}: {message}")]
    Invalid {
        /// File name.
        origin: String,
        /// Dotted key path.
        key: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// How samples are taken.
    pub sampling: Sampling,
    /// How samples are grouped in time.
    pub window: Window,
    /// Where windows are written.
    pub output: Output,
    /// The local HTTP server.
    pub server: Server,
    /// Caps on every cache and queue.
    pub limits: Limits,
    /// Kubernetes metadata.
    pub kubernetes: Kubernetes,
    /// Which workloads to profile.
    pub filters: Filters,
    /// Logging.
    pub log: Log,
    /// Resource readings (USE metrics of the host and its containers).
    pub readings: Readings,
    /// JIT frames: perf maps, jitdumps, JVM perf map refresh.
    pub jit: Jit,
    /// Perf counters and run-queue latency.
    pub counters: Counters,
    /// OTLP metrics export.
    pub otlp_metrics: OtlpMetrics,
    /// Where windows are shipped besides the local files (Pyroscope, OTLP).
    pub sinks: Sinks,
    /// Symbol tables of object files: caps and debug directories.
    pub symbols: Symbols,
    /// When `/healthz` reports a stuck stage.
    pub health: Health,
    /// Off-CPU profiling: where threads wait, how long and why.
    pub offcpu: OffCpu,
    /// `interpreters:`.
    pub interpreters: Interpreters,
}

/// `health:` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Health {
    /// `/healthz` fails when capture or symbolization/output has made no progress for this
    /// many window lengths (0: never).
    pub stall_windows: u32,
}

impl Default for Health {
    fn default() -> Self {
        Self { stall_windows: 3 }
    }
}

/// `offcpu:` keys: off-CPU profiles from `sched_switch` (see docs/offcpu.md).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct OffCpu {
    /// Load the off-CPU programs and write off-CPU windows.
    pub enabled: bool,
    /// Blocks shorter than this are not reported (counted as short).
    #[serde(deserialize_with = "duration")]
    pub min_block: Duration,
    /// Length of the off-CPU windows: they end at the first `window.duration` boundary
    /// at or after it (a multiple of `window.duration` lines them up with CPU windows).
    #[serde(deserialize_with = "duration")]
    pub window: Duration,
    /// Fraction of switch-outs considered at all (0 < rate <= 1); reported times are
    /// scaled by its inverse.
    pub sample_rate: f64,
    /// Fraction of the switch-outs neither `rseq` nor `syscall_exit` covers (page faults,
    /// preemption in user mode of threads without rseq) whose stacks are walked at
    /// switch-out, the only place they can be (0 < rate <= 1); their times are scaled by
    /// its inverse.
    pub fallback_rate: f64,
    /// Walk the user stack of a long block inside a syscall of a thread without rseq at the
    /// syscall's exit (tp_btf/sys_exit: a program run per syscall on the host); false:
    /// such blocks take the fallback.
    pub syscall_exit: bool,
    /// Walk the user stack of a long block of a thread with rseq registered (glibc 2.35+
    /// registers it for every thread) on its return to user mode (tp_btf/rseq_update),
    /// whether it blocked in a syscall or not: one program run per context switch.
    pub rseq: bool,
    /// On kernels with BPF task works (6.18+), walk the user stack of every long block of
    /// a user thread on its return to user mode by a task work its switch-in schedules:
    /// nothing runs per switch or per syscall for it, and neither `rseq` nor
    /// `syscall_exit` is hooked. Older kernels use `rseq`, `syscall_exit` and the fallback.
    pub task_work: bool,
    /// Walk the stacks of the thread that wakes a block already past `min_block`
    /// (tp_btf/sched_waking), joined to the block: the `offwake` windows.
    pub wakers: bool,
    /// Lock-contention windows (`lock`): futex waits with their wakers, and kernel lock
    /// contention of `min_block` or more (lock:contention_begin/end, where the kernel has
    /// them).
    pub locks: bool,
    /// Follow kernel threads' blocks too (kworkers, ksoftirqd, rcu: idle by design and in
    /// no container); false: skipped at switch-out, counted `kernel_thread_skipped`.
    pub kernel_threads: bool,
    /// Long blocks whose stacks are held at once (BPF map entries, ~2.2 KiB each while
    /// used); more are counted as dropped.
    pub max_threads: u32,
    /// Threads with an off-CPU record at once (task storage, ~300 bytes of kernel memory
    /// each); threads past it are not profiled, and counted.
    pub max_tasks: u32,
    /// The off-CPU ring buffer, in bytes (power of two).
    #[serde(deserialize_with = "size")]
    pub ring_buffer_bytes: u32,
    /// Distinct off-CPU records (a thread's stacks, state and waker) counted in the kernel
    /// between two reads a second apart (BPF hash entries, ~100 bytes of kernel memory
    /// each); the agent keeps as many records for them. A record past it is sent whole
    /// every time, counted `sums_full`.
    pub max_stacks: u32,
}

impl Default for OffCpu {
    fn default() -> Self {
        Self {
            enabled: true,
            min_block: Duration::from_micros(1000),
            window: Duration::from_secs(60),
            sample_rate: 1.0,
            fallback_rate: 0.1,
            syscall_exit: false,
            rseq: true,
            task_work: true,
            wakers: true,
            locks: true,
            kernel_threads: false,
            max_threads: 8192,
            max_tasks: 65536,
            ring_buffer_bytes: 1 << 20,
            max_stacks: 8192,
        }
    }
}

/// `interpreters:` keys: frames of interpreted code walked beside the native ones.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Interpreters {
    /// `interpreters.python:`.
    pub python: Python,
}

/// `interpreters.python:` keys: CPython 3.8–3.14 frames (see docs/python.md).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Python {
    /// Walk Python frames in the processes that run a CPython ember knows.
    pub enabled: bool,
    /// Keep the eval loop's own native frames (`_PyEval_EvalFrameDefault`) beside the
    /// Python frames that stand for them.
    pub keep_eval_frames: bool,
    /// Bytes of named code objects kept (per-process names, lines and line tables); the
    /// least recently used go first, counted.
    #[serde(deserialize_with = "size")]
    pub cache_bytes: u64,
}

impl Default for Python {
    fn default() -> Self {
        Self {
            enabled: true,
            keep_eval_frames: false,
            cache_bytes: 8 << 20,
        }
    }
}

/// `readings:` keys: USE metrics of the host and its containers, read on their own thread.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Readings {
    /// How often every source is read; scrapes and exports show the latest reading.
    #[serde(deserialize_with = "duration")]
    pub interval: Duration,
    /// Read the host's CPU, memory, disk and network counters.
    pub host: bool,
    /// Read every container's cgroup counters.
    pub containers: bool,
    /// Containers read at most; more are counted in `ember_cache_dropped_total`.
    pub max_containers: usize,
    /// Block devices and network interfaces reported at most (each).
    pub max_devices: usize,
    /// Block devices left out (a regular expression on the name); empty: none.
    pub disk_exclude: String,
    /// Network interfaces left out (a regular expression on the name); empty: none.
    pub network_exclude: String,
}

impl Default for Readings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(10),
            host: true,
            containers: true,
            max_containers: 1024,
            max_devices: 256,
            disk_exclude: r"^(z?ram|loop|fd|(h|s|v|xv)d[a-z]|nvme\d+n\d+p)\d+$".into(),
            network_exclude: String::new(),
        }
    }
}

/// `counters:` keys: perf counters (per CPU and per container) and run-queue latency,
/// read every `readings.interval`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Counters {
    /// Count perf events (hardware where the PMU has them, software always).
    pub perf: bool,
    /// Load the run-queue latency BPF program (sched tracepoints).
    pub runqueue_latency: bool,
    /// Containers with their own counters and histogram at most.
    pub max_containers: usize,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            perf: true,
            runqueue_latency: true,
            max_containers: 64,
        }
    }
}

/// `jit:` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Jit {
    /// Name frames in JIT code from `/tmp/perf-<pid>.map` and `jit-<pid>.dump`.
    pub enabled: bool,
    /// Largest perf map or jitdump read, in bytes; larger files are refused (counted).
    #[serde(deserialize_with = "size")]
    pub max_file_bytes: u64,
    /// JIT symbols kept per process (perf map and jitdump each).
    pub max_entries_per_process: usize,
    /// JIT symbols kept across all processes.
    pub max_total_entries: usize,
    /// Bytes of JIT symbols (names, ranges, debug lines) kept per process.
    #[serde(deserialize_with = "size")]
    pub max_bytes_per_process: usize,
    /// Bytes of JIT symbols kept across all processes.
    #[serde(deserialize_with = "size")]
    pub max_total_bytes: usize,
    /// Ask each JVM to rewrite its perf map (like `jcmd PID Compiler.perfmap`) at most this
    /// often; `0s` = never.
    #[serde(deserialize_with = "duration")]
    pub jvm_perfmap_refresh: Duration,
}

impl Default for Jit {
    fn default() -> Self {
        Self {
            enabled: true,
            max_file_bytes: 64 << 20,
            max_entries_per_process: 200_000,
            max_total_entries: 1_000_000,
            max_bytes_per_process: 32 << 20,
            max_total_bytes: 64 << 20,
            jvm_perfmap_refresh: Duration::ZERO,
        }
    }
}

/// `otlp_metrics:` keys: push the metrics snapshot to an OTLP gRPC endpoint.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct OtlpMetrics {
    /// Export at all.
    pub enabled: bool,
    /// gRPC endpoint (`http://` or `https://`).
    pub endpoint: Url,
    /// How often to push.
    #[serde(deserialize_with = "duration")]
    pub interval: Duration,
    /// Deadline of one export.
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
    /// gRPC metadata sent with every export (e.g. `authorization`).
    pub headers: std::collections::BTreeMap<String, Secret>,
    /// PEM CA bundle for an `https://` endpoint; empty = the system's roots.
    pub ca_file: PathBuf,
}

impl Default for OtlpMetrics {
    fn default() -> Self {
        Self {
            enabled: false,
            endpoint: "http://127.0.0.1:4317".into(),
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
            headers: std::collections::BTreeMap::new(),
            ca_file: PathBuf::new(),
        }
    }
}

/// `kubernetes:` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Kubernetes {
    /// Watch this node's pods to label samples with namespace, pod and container.
    pub enabled: bool,
    /// This node's name; empty means the `NODE_NAME` environment variable, then the host name.
    pub node_name: String,
    /// Kubeconfig file; empty means in-cluster config, then `KUBECONFIG` / `~/.kube/config`.
    pub kubeconfig: PathBuf,
}

impl Default for Kubernetes {
    fn default() -> Self {
        Self {
            enabled: true,
            node_name: String::new(),
            kubeconfig: PathBuf::new(),
        }
    }
}

/// The environment variable holding the node name (downward API `fieldRef: spec.nodeName`).
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// This node's name, resolved once at start and passed to every stage that names the node
/// (`ember_container_info`, the pod watcher, OTLP resources).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeName {
    /// `kubernetes.node_name`, else `$NODE_NAME`, else the host name (each trimmed; a blank
    /// one counts as unset). Empty only when all three are.
    pub name: String,
    /// Whether the name came from the config or the downward API, not guessed from the host
    /// name: only a known name is exported as `k8s.node.name`.
    pub known: bool,
}

impl NodeName {
    /// Resolves the name from `cfg`, the environment and `/proc/sys/kernel/hostname`.
    pub fn resolve(cfg: &Kubernetes) -> Self {
        let env = std::env::var(NODE_NAME_ENV).ok();
        Self::from_sources(&cfg.node_name, env.as_deref(), || {
            std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default()
        })
    }

    fn from_sources(configured: &str, env: Option<&str>, host: impl FnOnce() -> String) -> Self {
        match [Some(configured), env]
            .into_iter()
            .flatten()
            .map(str::trim)
            .find(|n| !n.is_empty())
        {
            Some(name) => Self {
                name: name.to_owned(),
                known: true,
            },
            None => Self {
                name: host().trim().to_owned(),
                known: false,
            },
        }
    }

    /// The name when it is known (configured or from the downward API), else `None`.
    pub fn known(&self) -> Option<&str> {
        self.known.then_some(self.name.as_str())
    }
}

/// `filters:` keys. Empty include lists include everything; excludes win over includes.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Filters {
    /// Only pods in these namespaces (host processes are not in any namespace).
    pub include_namespaces: Vec<String>,
    /// Never pods in these namespaces.
    pub exclude_namespaces: Vec<String>,
    /// Only pods whose labels match this Kubernetes label selector (`app=web,tier!=db`).
    pub include_pod_selector: String,
    /// Never pods whose labels match this selector.
    pub exclude_pod_selector: String,
    /// Only containers with these names.
    pub include_containers: Vec<String>,
    /// Never containers with these names.
    pub exclude_containers: Vec<String>,
    /// Only processes with these names (`comm`, as in `ps -o comm`).
    pub include_processes: Vec<String>,
    /// Never processes with these names.
    pub exclude_processes: Vec<String>,
}

/// `sampling:` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Sampling {
    /// Samples per second per CPU.
    pub frequency_hz: u64,
    /// Perf event driving the sampler.
    pub event: SampleEvent,
    /// Sample the idle task too.
    pub include_idle: bool,
    /// BPF ring buffer size in bytes.
    #[serde(deserialize_with = "size")]
    pub ring_buffer_bytes: u32,
    /// Only these tgids; empty means all.
    pub pids: Vec<u32>,
    /// With `pids`: the processes they fork join them (`record -- CMD`, `--subprocesses`).
    pub subprocesses: bool,
    /// How user stacks are walked.
    pub unwind: UnwindMode,
    /// Cap on the kernel memory of unwind tables and per-process ranges, in bytes.
    #[serde(deserialize_with = "size")]
    pub unwind_max_bytes: u64,
    /// Processes whose ranges the sampler holds at most.
    pub unwind_max_processes: u32,
    /// Where compiled unwind tables are kept across restarts; empty: not kept.
    pub unwind_cache_dir: PathBuf,
}

/// `sampling.unwind`: how the sampler walks user stacks.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum UnwindMode {
    /// Unwind tables where an object has `.eh_frame`/`.debug_frame`, the frame pointer elsewhere.
    Auto,
    /// Unwind tables only: code without them ends the stack (counted).
    Dwarf,
    /// Frame pointers only (the kernel's `bpf_get_stack`).
    FramePointer,
}

/// The perf event that triggers a sample.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum SampleEvent {
    /// Software CPU clock: works everywhere.
    CpuClock,
    /// Hardware CPU cycles, when the PMU provides them.
    Cycles,
}

/// `window:` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Window {
    /// Length of one window.
    #[serde(deserialize_with = "duration")]
    pub duration: Duration,
}

/// `output:` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Output {
    /// Directory for window files.
    pub data_dir: PathBuf,
    /// Window files kept at most.
    pub keep_windows: usize,
    /// Bytes of window files kept at most.
    #[serde(deserialize_with = "size")]
    pub keep_bytes: u64,
}

/// `server:` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Server {
    /// Serve HTTP at all.
    pub enabled: bool,
    /// Address of the profiles listener: window files, the explorer page and its API
    /// (and `/metrics`, `/healthz` when `metrics_listen` is unset).
    pub listen: SocketAddr,
    /// Address of a second listener with only `/metrics` and `/healthz`, for Prometheus
    /// and the kubelet; `None` serves them on `listen` alone.
    #[serde(deserialize_with = "optional_addr")]
    pub metrics_listen: Option<SocketAddr>,
    /// Address of a listener with only `/healthz` (liveness) and `/readyz` (readiness),
    /// for the kubelet's probes: no other client shares its connections, so a flood of
    /// another listener cannot starve the probes. `None`: no such listener.
    #[serde(deserialize_with = "optional_addr")]
    pub health_listen: Option<SocketAddr>,
    /// File holding the bearer token the profiles listener requires; re-read when it
    /// changes; empty for none. Required when `listen` is not a loopback address.
    pub token_file: PathBuf,
    /// Without `token_file`: make a random token at start, keep it in
    /// `<output.data_dir>/ui-token` (mode 0600) and require it (bearer header, or the
    /// cookie set by the printed `/?token=` address). `false` lets every local user of a
    /// plain host read every profile: only where the listener's loopback is private (a
    /// pod's own network namespace, reached through `kubectl port-forward`).
    pub local_auth: bool,
    /// Without a token, the `Host` names the profiles listener answers besides its own
    /// address and `localhost`, `127.0.0.1`, `[::1]` (any port): `name` (any port) or
    /// `name:port`. Any other `Host` gets 421 (DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// Connections open at once per listener; more are closed at accept (counted).
    pub max_connections: usize,
    /// Requests that read or merge windows at once; more get 503 (counted).
    pub max_concurrent_requests: usize,
    /// Time a client has to send a request's headers.
    #[serde(deserialize_with = "duration")]
    pub header_read_timeout: Duration,
    /// A connection that moves no byte for this long is closed.
    #[serde(deserialize_with = "duration")]
    pub idle_timeout: Duration,
    /// Time a request may take to produce its response.
    #[serde(deserialize_with = "duration")]
    pub request_timeout: Duration,
    /// Largest window file served or merged, in bytes.
    #[serde(deserialize_with = "size")]
    pub max_file_bytes: u64,
    /// Distinct samples (stack + labels) a merged profile may hold.
    pub max_merge_samples: usize,
    /// Nodes a flame graph (`/api/flamegraph`) may hold; more get 413 (counted).
    pub max_flame_nodes: usize,
    /// Bytes of one API response body (JSON, merged pprof, SVG); more get 413 (counted).
    #[serde(deserialize_with = "size")]
    pub max_response_bytes: u64,
}

/// `limits:` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Processes tracked.
    pub max_processes: usize,
    /// Object files held open.
    pub max_objects: usize,
    /// Distinct stacks per window.
    pub max_stacks_per_window: usize,
    /// Symbolized addresses cached.
    pub symbol_cache_entries: usize,
    /// Sample batches queued between capture and aggregation.
    pub sample_queue_batches: usize,
    /// Bytes of sample batches queued between capture and aggregation (a batch holds up to
    /// a ring buffer's worth of stacks).
    #[serde(deserialize_with = "size")]
    pub sample_queue_bytes: u64,
    /// Bytes of distinct stacks held per window (a stack may have 254 frames).
    #[serde(deserialize_with = "size")]
    pub max_stack_bytes_per_window: u64,
}

/// `log:` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Log {
    /// Default log level.
    pub level: String,
}

/// An address, or `""` for none.
fn optional_addr<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    let s = String::deserialize(d)?;
    if s.is_empty() {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|e| serde::de::Error::custom(format!("{s:?}: {e}")))
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            frequency_hz: 99,
            event: SampleEvent::CpuClock,
            include_idle: false,
            ring_buffer_bytes: 1 << 20,
            pids: Vec::new(),
            subprocesses: false,
            unwind: UnwindMode::Auto,
            unwind_max_bytes: 32 << 20,
            unwind_max_processes: 4096,
            unwind_cache_dir: PathBuf::from("/var/lib/ember/unwind"),
        }
    }
}

impl Default for Window {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(10),
        }
    }
}

impl Default for Output {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("/var/lib/ember/windows"),
            keep_windows: 540,
            keep_bytes: 256 << 20,
        }
    }
}

impl Default for Server {
    fn default() -> Self {
        Self {
            enabled: true,
            listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            metrics_listen: None,
            health_listen: None,
            token_file: PathBuf::new(),
            local_auth: true,
            allowed_hosts: Vec::new(),
            max_connections: 512,
            max_concurrent_requests: 4,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(30),
            max_file_bytes: 64 << 20,
            max_merge_samples: 1_000_000,
            max_flame_nodes: 500_000,
            max_response_bytes: 64 << 20,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_processes: 16384,
            max_objects: 4096,
            max_stacks_per_window: 200_000,
            symbol_cache_entries: 262_144,
            sample_queue_batches: 1024,
            sample_queue_bytes: 32 << 20,
            max_stack_bytes_per_window: 32 << 20,
        }
    }
}

impl Default for Log {
    fn default() -> Self {
        Self {
            level: "info".into(),
        }
    }
}

impl Config {
    /// Loads `path`; keys it leaves out keep their defaults.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_yaml(&text, &path.display().to_string())
    }

    /// Parses YAML text; `origin` names it in errors. Keys left out keep their defaults
    /// (the values written in `config/ember.yaml`, which a test keeps equal to `Default`).
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let cfg: Option<Config> = serde_yaml::from_str(text).map_err(|e| {
            let (line, column) = e
                .location()
                .map(|l| (l.line(), l.column()))
                .unwrap_or((1, 1));
            ConfigError::Parse {
                origin: origin.to_owned(),
                line,
                column,
                message: strip_location(&e.to_string()),
            }
        })?;
        let cfg = cfg.unwrap_or_default();
        cfg.validate(origin)?;
        Ok(cfg)
    }
}

/// serde_yaml appends " at line L column C" to messages; the position is reported separately.
fn strip_location(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_owned(),
        None => msg.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_file_is_the_default() {
        assert_eq!(
            Config::from_yaml(DEFAULT_YAML, "ember.yaml").expect("valid"),
            Config::default()
        );
    }

    #[test]
    fn embedded_file_lists_every_key() {
        // Every key of the schema appears in the documented default file.
        let v: serde_yaml::Value = serde_yaml::from_str(DEFAULT_YAML).expect("yaml");
        let sections = v.as_mapping().expect("mapping");
        assert_eq!(sections.len(), 17);
        let count: usize = sections
            .values()
            .map(|s| s.as_mapping().map_or(0, |m| m.len()))
            .sum();
        // sampling, offcpu, window, output, server, limits, kubernetes, filters, log, sinks,
        // readings, jit, counters, otlp_metrics, symbols, health, interpreters.
        assert_eq!(
            count,
            10 + 15 + 1 + 3 + 16 + 7 + 3 + 8 + 1 + 8 + 7 + 7 + 3 + 6 + 14 + 1 + 1
        );
        let python = &v["interpreters"]["python"];
        assert_eq!(python.as_mapping().map_or(0, |m| m.len()), 3);
        let sinks = &v["sinks"];
        assert_eq!(sinks["pyroscope"].as_mapping().map_or(0, |m| m.len()), 14);
        assert_eq!(sinks["otlp"].as_mapping().map_or(0, |m| m.len()), 7);
    }

    #[test]
    fn default_parses_and_validates() {
        let c = Config::default();
        assert_eq!(c.sampling.frequency_hz, 99);
        assert_eq!(c.window.duration, Duration::from_secs(10));
        assert_eq!(c.server.listen.ip().to_string(), "127.0.0.1");
        assert!(c.sampling.pids.is_empty());
    }

    #[test]
    fn user_file_overrides_single_keys() {
        let c = Config::from_yaml(
            "window:\n  duration: 2s\nsampling:\n  frequency_hz: 49\n",
            "t.yaml",
        )
        .expect("valid");
        assert_eq!(c.window.duration, Duration::from_secs(2));
        assert_eq!(c.sampling.frequency_hz, 49);
        assert_eq!(
            c.output.keep_windows, 540,
            "untouched keys keep their default"
        );
    }

    #[test]
    fn unknown_key_points_at_its_line() {
        let err =
            Config::from_yaml("window:\n  duration: 2s\n  durration: 3s\n", "t.yaml").unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("t.yaml:3:"), "{msg}");
        assert!(msg.contains("durration"), "{msg}");
    }

    #[test]
    fn unknown_section_points_at_its_line() {
        let err = Config::from_yaml("# c\n\nsamplin:\n  frequency_hz: 1\n", "t.yaml").unwrap_err();
        assert!(err.to_string().starts_with("t.yaml:3:"), "{err}");
    }

    #[test]
    fn wrong_type_points_at_its_line() {
        let err = Config::from_yaml("sampling:\n  frequency_hz: fast\n", "t.yaml").unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("t.yaml:2:"), "{msg}");
    }

    #[test]
    fn bad_duration_is_explained() {
        let err = Config::from_yaml("window:\n  duration: soon\n", "t.yaml").unwrap_err();
        assert!(err.to_string().contains("soon"), "{err}");
        assert!(err.to_string().starts_with("t.yaml:2:"), "{err}");
    }

    #[test]
    fn syntax_error_has_position() {
        let err = Config::from_yaml("window: [1,\n", "t.yaml").unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::Parse { line: 2, .. } | ConfigError::Parse { line: 1, .. }
            ),
            "{err}"
        );
    }

    #[test]
    fn invalid_values_name_the_key() {
        let err =
            Config::from_yaml("sampling:\n  ring_buffer_bytes: 5000\n", "t.yaml").unwrap_err();
        assert!(
            err.to_string().contains("sampling.ring_buffer_bytes"),
            "{err}"
        );
        let err = Config::from_yaml("readings:\n  disk_exclude: \"(\"\n", "t.yaml").unwrap_err();
        assert!(err.to_string().contains("readings.disk_exclude"), "{err}");
        let err = Config::from_yaml("readings:\n  interval: 1ms\n", "t.yaml").unwrap_err();
        assert!(err.to_string().contains("readings.interval"), "{err}");
        let err = Config::from_yaml("limits:\n  max_objects: 0\n", "t.yaml").unwrap_err();
        assert!(err.to_string().contains("limits.max_objects"), "{err}");
    }

    /// Issue 54: every size key takes `32MiB` as well as bytes; a bad size or a duration
    /// without its unit is reported at its line and column, naming the key.
    #[test]
    fn sizes_and_durations_take_units_and_bad_ones_name_their_line() {
        let c = Config::from_yaml(
            "sampling:\n  ring_buffer_bytes: 2MiB\n  unwind_max_bytes: 1048576\nsymbols:\n  debuginfod_cache_bytes: 2GiB\nsinks:\n  queue_bytes: 512KiB\n  timeout: 1m\n",
            "t.yaml",
        )
        .expect("valid");
        assert_eq!(c.sampling.ring_buffer_bytes, 2 << 20);
        assert_eq!(c.sampling.unwind_max_bytes, 1 << 20);
        assert_eq!(c.symbols.debuginfod_cache_bytes, 2 << 30);
        assert_eq!(c.sinks.queue_bytes, 512 << 10);
        assert_eq!(c.sinks.timeout, Duration::from_secs(60));
        let err = Config::from_yaml(
            "output:\n  keep_windows: 3\n  keep_bytes: 12 parsecs\n",
            "t.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("t.yaml:3:15: output.keep_bytes: \"12 parsecs\" is not a size"),
            "{err}"
        );
        let err = Config::from_yaml("\nwindow:\n  duration: 10\n", "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("t.yaml:3:13: window.duration: \"10\" is not a duration"),
            "{err}"
        );
    }

    #[test]
    fn sinks_parse_validate_and_hide_secrets() {
        let c = Config::from_yaml(
            "sinks:\n  pyroscope:\n    enabled: true\n    url: https://p:4040\n    basic_auth_user: u\n    basic_auth_password: hunter2\n    headers: {X-A: b}\n  otlp:\n    resource_per: process\n",
            "t.yaml",
        )
        .expect("valid");
        assert_eq!(c.sinks.pyroscope.basic_auth_password.0, "hunter2");
        assert_eq!(c.sinks.otlp.resource_per, ResourcePer::Process);
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        // Credentials in URLs and metrics header values stay out of Debug and Display.
        let c = Config::from_yaml(
            "sinks:\n  pyroscope:\n    url: https://bob:s3cret@p:4040/x?y=z@w\n  otlp:\n    endpoint: http://tok@o:4317\n\
             otlp_metrics:\n  endpoint: https://u:pw@m:4317\n  headers: {authorization: Bearer t0ken}\n",
            "t.yaml",
        )
        .expect("valid");
        let shown = format!(
            "{c:?} {} {}",
            c.sinks.pyroscope.url, c.otlp_metrics.endpoint
        );
        for secret in ["s3cret", "bob:", "tok@", ":pw@", "t0ken"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("https://***@p:4040/x?y=z@w"), "{shown}");
        assert_eq!(&*c.sinks.pyroscope.url, "https://bob:s3cret@p:4040/x?y=z@w");
        let err = Config::from_yaml(
            "sinks:\n  pyroscope:\n    enabled: true\n    url: p:4040\n",
            "t.yaml",
        )
        .unwrap_err();
        assert!(err.to_string().contains("sinks.pyroscope.url"), "{err}");
        let err = Config::from_yaml(
            "sinks:\n  pyroscope:\n    labels: {__name__: x}\n",
            "t.yaml",
        )
        .unwrap_err();
        assert!(err.to_string().contains("sinks.pyroscope.labels"), "{err}");
    }

    #[test]
    fn node_name_from_config_then_env_then_host() {
        let host = || " host-1\n".to_owned();
        let n = |c, e| NodeName::from_sources(c, e, host);
        let known = |name: &str| NodeName {
            name: name.into(),
            known: true,
        };
        assert_eq!(n("a", Some("b")), known("a"));
        assert_eq!(n(" ", Some("b")), known("b"));
        assert_eq!(n("", Some(" b ")), known("b"));
        let guessed = n("", Some(""));
        assert_eq!((guessed.name.as_str(), guessed.known()), ("host-1", None));
        assert_eq!(n("", None).known(), None);
        assert_eq!(n("a", None).known(), Some("a"));
    }

    #[test]
    fn empty_file_is_the_default() {
        assert_eq!(
            Config::from_yaml("", "t.yaml").expect("valid"),
            Config::default()
        );
    }
}
