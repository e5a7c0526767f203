//! The contracts between the stages, in one place: what capture hands aggregation (a
//! [`Sample`]), what aggregation hands symbolization (a [`Window`] of [`Stack`]s), and what
//! symbolization hands the encoders and sinks (a [`Symbolized`] window of [`SymFrame`]s),
//! with the values they carry: [`Labels`], [`ProfileKind`], [`OffCpu`] time and its
//! [`OffState`], how a stack's walk ended ([`StackEnd`]), [`Mapping`]s and file identities.
//!
//! Data only: no stage is imported here (a leaf, checked by `tests/modgraph.py`), so every
//! stage can name these types, and the types say what flows, not how it is made. What makes
//! them lives with its stage: [`Labels`] are built from a cgroup and a pod in
//! `workload::labels`, a [`FileId`] is read from an open file in `process::object`.
//!
//! A window is generic over its frame type: aggregation's frames (`aggregate::Frame`) are
//! kernel addresses and normalized user addresses, which hold the open object files the
//! symbolizer reads (so they live with the process table that opens them); symbolization's
//! are [`SymFrame`]s, shared between the stacks of a window. The two windows differ in
//! nothing else.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Declares an enum of unit variants with a fixed name per variant (`Variant => "name"`),
/// each with its doc: `ALL`, `as_str` and `Display`. The metrics leaf adds the label
/// encoding of the ones that are metric labels (`metrics::reasons`).
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $value:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The name, as `/metrics` and profiles show it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $value,)+
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
pub(crate) use named_enum;

/// One stack sample as the BPF program saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// CLOCK_MONOTONIC nanoseconds.
    pub time_ns: u64,
    /// v2 cgroup id of the task.
    pub cgroup_id: u64,
    /// Thread group id (process id) in the host pid namespace.
    pub pid: u32,
    /// The process's start time in clock ticks since boot, as `/proc/PID/stat` field 22
    /// shows it (the kernel's own, recorded with the sample): with `pid`, names the
    /// process, whose pid may be another's by the time the sample is named. 0: unknown.
    pub start_time: u64,
    /// Thread id.
    pub tid: u32,
    /// CPU the sample was taken on.
    pub cpu: u32,
    /// Thread name, NUL-padded.
    pub comm: [u8; 16],
    /// Kernel instruction pointers, leaf first.
    pub kernel: Vec<u64>,
    /// User instruction pointers, leaf first.
    pub user: Vec<u64>,
    /// Bit i set: user frame i is where the code was (the leaf, a frame a signal
    /// interrupted, a signal trampoline), to be named at its address; the others are
    /// return addresses, named at the byte before (the call).
    pub user_exact: u128,
    /// How the user stack's walk ended.
    pub user_end: StackEnd,
    /// Interpreter (Python) frames the walker recorded, innermost first, each placed
    /// before the user frame its [`PyFrameRef::before`] names.
    pub python: Vec<PyFrameRef>,
    /// Bit i set: user frame i is a frame of the interpreter's eval loop.
    pub user_eval: u128,
    /// How the interpreter frames came out (`None`: the walk met no eval frame).
    pub py_result: Option<PyWalk>,
    /// `None` for a CPU sample; for an off-CPU one, why and how long the thread was off CPU
    /// (the stacks are the ones it left the CPU with).
    pub off_cpu: Option<OffCpu>,
    /// An off-CPU block's thread that woke it, as it woke it (`offcpu.wakers`): its pid,
    /// tid, name and stacks (its interpreter frames are not kept).
    pub waker: Option<Box<Sample>>,
    /// An off-CPU sample of a lock wait: which kind (`offcpu.locks`).
    pub lock: Option<LockWait>,
}

/// What kind of lock an off-CPU sample waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockWait {
    /// A futex wait (pthread mutexes and condition variables, Go and Java monitors).
    Futex,
    /// Kernel lock contention (lock:contention_begin/end: mutexes, rwsems, spinlocks).
    Kernel,
}

/// An interpreter frame as the walker recorded it: named later from the process's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PyFrameRef {
    /// The user frame (index in [`Sample::user`]) this frame goes before; the frame count
    /// when it comes after every native frame.
    pub before: u8,
    /// The code object's address in the process.
    pub code: u64,
    /// The instruction's offset in the bytecode, in 2-byte code units (as recorded: the
    /// version decides what it counts from).
    pub unit: u32,
    /// The code's `co_firstlineno` as the walker read it (0: unknown).
    pub fingerprint: u32,
}

named_enum! {
    /// How a sample's interpreter frames came out (`ember_py_result` in `bpf/ember.h`):
    /// the `result` label of `ember_python_walks_total`.
    pub enum PyWalk {
        /// Every eval frame got its interpreter frames.
        Ok => "ok",
        /// An eval frame, but the thread's state or current frame was not found.
        NoState => "no_state",
        /// The stack's frame cap ended the walk.
        Truncated => "truncated",
        /// An eval frame had no interpreter frame left, or a frame's code was not a code
        /// object (the frames from there on are dropped).
        Mismatch => "mismatch",
        /// A frame could not be read: the frames above it are missing.
        Read => "read_error",
        /// The native walk stopped early (an unwind error) with interpreter frames left:
        /// they follow its last native frame, not interleaved with the frames it missed.
        Appended => "appended",
    }
}

/// Time a thread was off CPU, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffCpu {
    /// Why.
    pub state: OffState,
    /// Nanoseconds.
    pub ns: u64,
    /// How many blocks the nanoseconds add up: 1 for a record as it came, more for the
    /// sums the kernel counted under its key (and for a window's stack, its count).
    pub blocks: u64,
}

named_enum! {
    /// Why a thread was off CPU: the `state` label of off-CPU samples and of
    /// `ember_container_offcpu_seconds_total`.
    pub enum OffState {
        /// Interruptible sleep (timers, poll, pipes, sockets, futexes), and TASK_IDLE, stopped
        /// and traced tasks.
        Sleep => "sleep",
        /// Uninterruptible sleep that counts in the load average (D state): disk I/O, page
        /// faults, most kernel locks.
        Disk => "disk",
        /// Runnable but not running: preempted, or woken and waiting for a CPU.
        Runnable => "runnable",
    }
}

named_enum! {
    /// How a sampled user stack's walk ended: the `result` label of
    /// `ember_stacks_total{workload,result}`.
    pub enum StackEnd {
        /// The walk reached the outermost frame (the program's entry or a thread's start).
        Complete => "complete",
        /// Frame pointers only (`sampling.unwind: frame_pointer`, or a process whose tables were
        /// not loaded yet): where the walk ended is not checked.
        FramePointer => "frame_pointer",
        /// Tables, then frame pointers (JIT code, objects without CFI) until rbp was 0.
        FramePointerEnd => "frame_pointer_end",
        /// More than 127 frames: the outermost ones are cut.
        Truncated => "truncated",
        /// No user stack (a kernel thread).
        NoUserStack => "no_user_stack",
        /// A table row ember cannot express (see `ember_unwind_rows_unsupported_total`).
        Unsupported => "unsupported_rule",
        /// Stack memory could not be read (paged out, or a corrupt frame).
        ReadFault => "read_fault",
        /// The next frame was not above this one: a corrupt stack or a wrong rule.
        BadFrame => "bad_frame",
        /// A rule needed rbp after an earlier frame lost it.
        RbpUnknown => "rbp_unknown",
        /// `sampling.unwind: dwarf` and the code has no table.
        NoTable => "no_table",
        /// The process's table was evicted or dropped while the walk ran.
        TableMissing => "table_missing",
    }
}

/// What a window's profile measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ProfileKind {
    /// CPU time, from samples at `sampling.frequency_hz`.
    #[default]
    Cpu,
    /// Time threads spent off CPU, from context switches (`offcpu.enabled`).
    OffCpu,
    /// Blocked time under the stack of the thread that ended it (`offcpu.wakers`): the
    /// waker's frames on top of the blocked ones, a `--` frame between them.
    OffWake,
    /// Time waiting for locks (`offcpu.locks`): futex waits with their wakers, and kernel
    /// lock contention.
    Lock,
}

/// The frame between a waker's frames and the blocked ones in `offwake` and `lock`
/// profiles (as bcc's offwaketime prints it); its mapping is a region of that name.
pub const WAKE_SEPARATOR: &str = "--";

impl ProfileKind {
    /// Every kind, in the order a window's profiles are made.
    pub const ALL: [ProfileKind; 4] = [
        ProfileKind::Cpu,
        ProfileKind::OffCpu,
        ProfileKind::OffWake,
        ProfileKind::Lock,
    ];

    /// Whether its samples are blocks weighted by nanoseconds (every kind but CPU).
    pub const fn is_off_cpu(self) -> bool {
        !matches!(self, ProfileKind::Cpu)
    }

    /// The name `ember record --type` and `/api` take, and the window files carry
    /// (`<start>.offcpu.pb.gz`; CPU windows carry none).
    pub const fn as_str(self) -> &'static str {
        match self {
            ProfileKind::Cpu => "cpu",
            ProfileKind::OffCpu => "offcpu",
            ProfileKind::OffWake => "offwake",
            ProfileKind::Lock => "lock",
        }
    }
}

/// The workload labels of one process in one window, as samples and metrics carry them
/// (built from its cgroup and pod by `workload::labels`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels {
    /// Container id (64 hex), empty outside containers.
    pub container_id: String,
    /// Pod uid, empty outside pods.
    pub pod_uid: String,
    /// Pod namespace (from the API), empty when unknown.
    pub namespace: String,
    /// Pod name (from the API).
    pub pod: String,
    /// Container name (from the API).
    pub container: String,
    /// Service name: annotation, or `<namespace>/<owner>`.
    pub service_name: String,
    /// Cgroup path, for processes outside containers.
    pub cgroup: String,
    /// systemd unit, when the cgroup names one.
    pub systemd_unit: String,
    /// Pod labels (for selectors; not exported as sample labels).
    pub pod_labels: std::collections::BTreeMap<String, String>,
}

impl Labels {
    /// The workload these labels belong to, for per-workload metrics: the service, else
    /// the container (`namespace/pod/container`, or `container:<id>` before its pod is
    /// known), else (host processes) the process name.
    pub fn workload(&self, process: &str) -> String {
        if !self.service_name.is_empty() {
            self.service_name.clone()
        } else if !self.container.is_empty() {
            format!("{}/{}/{}", self.namespace, self.pod, self.container)
        } else if !self.container_id.is_empty() {
            let id = &self.container_id;
            format!("container:{}", id.get(..12).unwrap_or(id))
        } else {
            process.to_owned()
        }
    }

    /// `(key, value)` pairs for pprof sample labels, empty values left out.
    pub fn sample_labels(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("container_id", self.container_id.as_str()),
            ("pod_uid", self.pod_uid.as_str()),
            ("namespace", self.namespace.as_str()),
            ("pod", self.pod.as_str()),
            ("container", self.container.as_str()),
            ("service_name", self.service_name.as_str()),
            ("cgroup", self.cgroup.as_str()),
            ("systemd_unit", self.systemd_unit.as_str()),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
    }
}

/// A distinct stack of one thread and how often it was sampled, its frames of type `F`.
#[derive(Debug, Clone)]
pub struct Stack<F> {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Thread name.
    pub comm: String,
    /// Process name.
    pub process: Arc<str>,
    /// Container, pod and cgroup of the process.
    pub labels: Arc<Labels>,
    /// Kernel frames then user frames, leaf first. Every frame but the leaf of each side
    /// is a return address, named at the call instruction (see [`Sample::user_exact`]).
    pub frames: Vec<F>,
    /// Samples of this stack (CPU), or blocks reported (off-CPU).
    pub count: u64,
    /// Off-CPU stacks: why, and the nanoseconds off CPU summed over its blocks.
    pub off_cpu: Option<OffCpu>,
    /// The interpreter the process runs, when its frames are walked (`python 3.12.1`).
    pub runtime: Option<Runtime>,
}

/// An interpreter whose frames a stack holds: the `runtime` and `runtime_version` labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    /// `python`.
    pub name: &'static str,
    /// `3.12.1`.
    pub version: Arc<str>,
}

impl<F> Stack<F> {
    /// The same stack over other frames (`frames`, made from this stack's).
    pub fn with_frames<G>(self, frames: Vec<G>) -> Stack<G> {
        Stack {
            pid: self.pid,
            tid: self.tid,
            comm: self.comm,
            process: self.process,
            labels: self.labels,
            frames,
            count: self.count,
            off_cpu: self.off_cpu,
            runtime: self.runtime,
        }
    }
}

/// One closed window of distinct stacks, their frames of type `F`.
#[derive(Debug, Clone)]
pub struct Window<F> {
    /// Wall-clock start.
    pub start: SystemTime,
    /// Length.
    pub duration: Duration,
    /// Nanoseconds of CPU time one sample stands for (1e9 / Hz).
    pub period_ns: u64,
    /// What it measures.
    pub kind: ProfileKind,
    /// Distinct stacks, in the aggregator's order.
    pub stacks: Vec<Stack<F>>,
}

impl<F> Window<F> {
    /// Total samples in the window.
    pub fn samples(&self) -> u64 {
        self.stacks.iter().map(|s| s.count).sum()
    }

    /// A window of the same times and kind over `stacks`.
    pub fn with_stacks<G>(&self, stacks: Vec<Stack<G>>) -> Window<G> {
        Window {
            start: self.start,
            duration: self.duration,
            period_ns: self.period_ns,
            kind: self.kind,
            stacks,
        }
    }
}

/// A distinct stack of one thread, its frames named (shared between the stacks of a window).
pub type SymStack = Stack<Arc<SymFrame>>;

/// One window with every frame named: what the encoders and sinks take.
pub type Symbolized = Window<Arc<SymFrame>>;

impl Window<Arc<SymFrame>> {
    /// How many frames (counted per stack, not per sample) were named, unnamed or JIT.
    pub fn frame_counts(&self) -> FrameCounts {
        let mut c = FrameCounts::default();
        for f in self.stacks.iter().flat_map(|s| &s.frames) {
            if f.is_jit() {
                c.jit += 1;
            } else if f.named {
                c.named += 1;
            } else {
                c.unnamed += 1;
            }
        }
        c
    }
}

/// How many frames were named, for `ember_frames_total`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FrameCounts {
    /// Frames with a symbol.
    pub named: u64,
    /// Frames shown as `object+offset` or `[unknown]`.
    pub unnamed: u64,
    /// Frames in JIT code named from a perf map or jitdump.
    pub jit: u64,
}

/// One function of a resolved frame (a frame with inlined calls would have several).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Func {
    /// Demangled name.
    pub name: Arc<str>,
    /// Source file, when debug info has it.
    pub file: Option<Arc<str>>,
    /// Source line, or 0.
    pub line: u32,
}

/// One resolved frame: where its address is, and the functions there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymFrame {
    /// The file (or pseudo-file) the address belongs to.
    pub mapping: Mapping,
    /// Kernel address, file offset in an object, offset in a region, or the process
    /// address (unknown memory, JIT code).
    pub address: u64,
    /// Functions, innermost (inlined) first; one placeholder such as `libc.so.6+0x1a2b`
    /// when the frame has no symbol.
    pub funcs: Arc<[Func]>,
    /// A real symbol was found (JIT frames are named by their runtime).
    pub named: bool,
}

impl SymFrame {
    /// Whether the frame is JIT code, named from a perf map or jitdump.
    pub fn is_jit(&self) -> bool {
        matches!(self.mapping, Mapping::Jit(_))
    }

    /// Whether the frame is interpreted code (a Python function).
    pub fn is_interpreted(&self) -> bool {
        matches!(self.mapping, Mapping::Python)
    }
}

/// Name of the pseudo-file that kernel frames are attributed to.
pub const KERNEL_MAPPING: &str = "[kernel.kallsyms]";

/// Where a frame's address lies. Frames with equal mappings share one mapping in the
/// encoded profiles.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Mapping {
    /// The kernel ([`KERNEL_MAPPING`]).
    Kernel,
    /// An executable or library.
    Object(Arc<ObjectFile>),
    /// An anonymous or special region, by label (`[vdso]`, `[anon]`, …).
    Region(Arc<str>),
    /// Memory no mapping was found for.
    Unknown,
    /// JIT code, by the file that named it.
    Jit(JitSource),
    /// Interpreted code ([`PYTHON_MAPPING`]): the address is the code object's, the
    /// function, file and line its frame's.
    Python,
}

/// Name of the pseudo-file that Python frames are attributed to.
pub const PYTHON_MAPPING: &str = "[python]";

impl Mapping {
    /// The file name profiles show for this mapping.
    pub fn file_name(&self) -> &str {
        match self {
            Mapping::Kernel => KERNEL_MAPPING,
            Mapping::Object(o) => &o.path,
            Mapping::Region(label) => label,
            Mapping::Unknown => "[unknown]",
            Mapping::Jit(source) => source.mapping_name(),
            Mapping::Python => PYTHON_MAPPING,
        }
    }

    /// The GNU build id, for object files that have one.
    pub fn build_id(&self) -> Option<&[u8]> {
        match self {
            Mapping::Object(o) => o.build_id.as_deref(),
            _ => None,
        }
    }
}

/// Where a JIT frame's name came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JitSource {
    /// `/tmp/perf-<pid>.map`.
    PerfMap,
    /// `jit-<pid>.dump`.
    JitDump,
}

impl JitSource {
    /// The pprof mapping file name JIT frames of this source are put in.
    pub fn mapping_name(self) -> &'static str {
        match self {
            JitSource::PerfMap => "[perf-map]",
            JitSource::JitDump => "[jitdump]",
        }
    }
}

/// An object file as the encoders see it: no open file, only its identity and names.
#[derive(Debug, Clone)]
pub struct ObjectFile {
    /// Device and inode, as the mapping names them.
    pub key: ObjectKey,
    /// Identity of the file opened.
    pub id: FileId,
    /// Path as the process saw it.
    pub path: String,
    /// GNU build id, when the file has one.
    pub build_id: Option<Vec<u8>>,
}

// An object is the file opened: the first path seen in a window names it.
impl PartialEq for ObjectFile {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for ObjectFile {}

impl Hash for ObjectFile {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

/// Identity of a mapped file: device and inode, as `/proc/PID/maps` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Device (major, minor).
    pub dev: (u32, u32),
    /// Inode number.
    pub inode: u64,
}

/// The file as `fstat` saw it when opened: what parsed data is cached by (one type for
/// every cache, read by [`FileId::of_file`]; see [`crate::os::file_id`]).
pub use crate::os::file_id::FileId;

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(count: u64, frames: Vec<u32>) -> Stack<u32> {
        Stack {
            pid: 1,
            tid: 2,
            comm: "worker".into(),
            process: Arc::from("app"),
            labels: Arc::new(Labels::default()),
            frames,
            count,
            off_cpu: Some(OffCpu {
                state: OffState::Disk,
                ns: 7,
                blocks: count,
            }),
            runtime: None,
        }
    }

    #[test]
    fn a_window_keeps_its_header_and_stacks_their_fields_over_new_frames() {
        let w = Window {
            start: SystemTime::UNIX_EPOCH + Duration::from_secs(10),
            duration: Duration::from_secs(10),
            period_ns: 10_101_010,
            kind: ProfileKind::OffCpu,
            stacks: vec![stack(3, vec![1, 2]), stack(4, vec![3])],
        };
        assert_eq!(w.samples(), 7);
        let mapped: Vec<Stack<String>> = w
            .stacks
            .iter()
            .cloned()
            .map(|s| {
                let frames = s.frames.iter().map(|f| format!("f{f}")).collect();
                s.with_frames(frames)
            })
            .collect();
        let out = w.with_stacks(mapped);
        assert_eq!(
            (out.start, out.duration, out.period_ns, out.kind),
            (w.start, w.duration, w.period_ns, w.kind)
        );
        assert_eq!(out.samples(), 7);
        let s = &out.stacks[0];
        assert_eq!(s.frames, vec!["f1".to_owned(), "f2".to_owned()]);
        assert_eq!(
            (s.pid, s.tid, s.comm.as_str(), &*s.process),
            (1, 2, "worker", "app")
        );
        assert_eq!(
            s.off_cpu.map(|o| (o.state, o.ns)),
            Some((OffState::Disk, 7))
        );
    }

    #[test]
    fn named_values_keep_their_names() {
        assert_eq!(OffState::ALL.len(), 3);
        assert_eq!(OffState::Runnable.to_string(), "runnable");
        assert_eq!(StackEnd::Unsupported.as_str(), "unsupported_rule");
        assert_eq!(StackEnd::ALL.first(), Some(&StackEnd::Complete));
        assert_eq!(ProfileKind::OffCpu.as_str(), "offcpu");
        assert_eq!(Mapping::Jit(JitSource::JitDump).file_name(), "[jitdump]");
    }

    #[test]
    fn frames_are_counted_named_unnamed_or_jit() {
        let frame = |mapping, named| {
            Arc::new(SymFrame {
                mapping,
                address: 0,
                funcs: Arc::from(Vec::<Func>::new()),
                named,
            })
        };
        let w: Symbolized = Window {
            start: SystemTime::UNIX_EPOCH,
            duration: Duration::ZERO,
            period_ns: 1,
            kind: ProfileKind::Cpu,
            stacks: vec![stack(1, vec![]).with_frames(vec![
                frame(Mapping::Kernel, true),
                frame(Mapping::Unknown, false),
                frame(Mapping::Jit(JitSource::PerfMap), true),
            ])],
        };
        let c = w.frame_counts();
        assert_eq!((c.named, c.unnamed, c.jit), (1, 1, 1));
    }
}
