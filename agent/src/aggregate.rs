//! Aggregation stage: counts samples per (process, thread, stack) for one window,
//! then normalizes every distinct stack against the process table.

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::capture::{Control, Sample};
use crate::metrics::{Cache, Loss, Metrics};
use crate::normalize::process::{Limits, ProcessTable, UserAddr};
use crate::workload::kube::Metadata;
use crate::workload::{self, Accounting, Cgroup, Filter, Labels, Verdict};

/// One frame of a normalized stack.
#[derive(Debug, Clone)]
pub enum Frame {
    /// A kernel address.
    Kernel(u64),
    /// A user address, normalized.
    User(UserAddr),
}

/// A distinct stack of one thread and how often it was sampled.
#[derive(Debug, Clone)]
pub struct Stack {
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
    /// Kernel frames then user frames, leaf first. Every frame but the leaf of each
    /// side is a return address and has already been moved back by one byte, so it
    /// points into the call instruction.
    pub frames: Vec<Frame>,
    /// Samples of this stack.
    pub count: u64,
}

/// One closed window, ready to symbolize.
#[derive(Debug, Clone)]
pub struct Window {
    /// Wall-clock start.
    pub start: SystemTime,
    /// Length.
    pub duration: Duration,
    /// Nanoseconds of CPU time one sample stands for (1e9 / Hz).
    pub period_ns: u64,
    /// Distinct stacks.
    pub stacks: Vec<Stack>,
}

impl Window {
    /// Total samples in the window.
    pub fn samples(&self) -> u64 {
        self.stacks.iter().map(|s| s.count).sum()
    }
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Key {
    pid: u32,
    tid: u32,
    comm: [u8; 16],
    kernel: Box<[u64]>,
    user: Box<[u64]>,
}

/// What the aggregator needs to attribute samples to workloads and filter them.
#[derive(Default)]
pub struct Workloads {
    /// Kubernetes pod metadata, when enabled.
    pub metadata: Option<Metadata>,
    /// The include/exclude rules.
    pub filter: Filter,
    /// Per-container CPU series.
    pub accounting: Option<Accounting>,
    /// Where to send BPF deny orders for excluded workloads.
    pub control: Option<SyncSender<Control>>,
}

/// A process the filter let through: its labels and cgroup for this window.
type Judged = (Arc<Labels>, Arc<Cgroup>);

/// Per-window sample counts plus the process table they are normalized against.
pub struct Aggregator {
    table: ProcessTable,
    counts: HashMap<Key, u64>,
    max_stacks: usize,
    period_ns: u64,
    start: SystemTime,
    started: Instant,
    metrics: Metrics,
    workloads: Workloads,
    /// Excluded processes whose samples may still be in flight.
    denied: HashSet<u32>,
}

impl Aggregator {
    /// A new aggregator for samples taken at `frequency_hz`.
    pub fn new(
        frequency_hz: u64,
        limits: Limits,
        max_stacks: usize,
        metrics: Metrics,
        workloads: Workloads,
    ) -> Self {
        Self {
            table: ProcessTable::new(limits, metrics.clone()),
            counts: HashMap::new(),
            max_stacks,
            period_ns: 1_000_000_000 / frequency_hz.max(1),
            start: SystemTime::now(),
            started: Instant::now(),
            metrics,
            workloads,
            denied: HashSet::new(),
        }
    }

    /// Replaces the JIT settings of the process table.
    pub fn set_jit(&mut self, settings: crate::config::Jit) {
        self.table.set_jit(settings);
    }

    /// Counts one sample; the first sample of a process reads its mappings.
    pub fn add(&mut self, s: Sample) {
        if self.denied.contains(&s.pid) {
            self.metrics.samples_filtered.inc();
            return;
        }
        self.table.touch(s.pid, s.tid, &s.comm, s.cgroup_id);
        let key = Key {
            pid: s.pid,
            tid: s.tid,
            comm: s.comm,
            kernel: s.kernel.into_boxed_slice(),
            user: s.user.into_boxed_slice(),
        };
        let full = self.counts.len() >= self.max_stacks;
        match self.counts.get_mut(&key) {
            Some(c) => *c += 1,
            None if full => self.metrics.lost(Loss::StackCap, 1),
            None => {
                self.counts.insert(key, 1);
            }
        }
    }

    /// Labels of every process in the window, `None` for the ones the filter excludes
    /// (those are also denied in BPF from now on).
    fn judge(&mut self, pids: HashSet<u32>) -> HashMap<u32, Option<Judged>> {
        let fresh = self.workloads.metadata.as_ref().is_some_and(|m| m.fresh());
        self.metrics.kubernetes_fresh.set(i64::from(fresh));
        let mut out = HashMap::with_capacity(pids.len());
        for pid in pids {
            let cg = self.table.cgroup(pid);
            let labels = workload::labels_for(&cg, self.workloads.metadata.as_ref());
            if self
                .workloads
                .filter
                .verdict(&self.table.name(pid), &labels)
                == Verdict::Exclude
            {
                self.deny(pid, &cg);
                out.insert(pid, None);
            } else {
                out.insert(pid, Some((Arc::new(labels), cg)));
            }
        }
        out
    }

    fn deny(&mut self, pid: u32, cg: &Cgroup) {
        self.denied.insert(pid);
        // A container in its own cgroup v2 is denied as a whole (its future processes too);
        // elsewhere (cgroup v1, hybrid hosts where every task reads the root id) by pid.
        let order = if cg.v2_id > 1 && cg.info.container_id.is_some() {
            Control::DenyCgroup(cg.v2_id)
        } else {
            Control::DenyPid(pid)
        };
        self.send(order);
    }

    fn send(&self, order: Control) {
        if let Some(tx) = &self.workloads.control {
            if tx.try_send(order).is_err() {
                self.metrics.dropped(Cache::ControlQueue, 1);
            }
        }
    }

    /// Closes the window: normalizes its stacks and starts the next one.
    pub fn close(&mut self) -> Window {
        let counts = std::mem::take(&mut self.counts);
        let verdicts = self.judge(counts.keys().map(|k| k.pid).collect());
        let mut stacks = Vec::with_capacity(counts.len());
        for (key, count) in counts {
            let Some(Some((labels, cg))) = verdicts.get(&key.pid) else {
                self.metrics.samples_filtered.inc_by(count);
                continue;
            };
            if let Some(acc) = &mut self.workloads.accounting {
                acc.add(labels, cg, (count * self.period_ns) as f64 / 1e9);
            }
            let mut frames = Vec::with_capacity(key.kernel.len() + key.user.len());
            frames.extend(
                key.kernel
                    .iter()
                    .enumerate()
                    .map(|(i, &a)| Frame::Kernel(caller(i, a))),
            );
            for (i, &a) in key.user.iter().enumerate() {
                frames.push(Frame::User(self.table.normalize(key.pid, caller(i, a))));
            }
            let comm_len = key
                .comm
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(key.comm.len());
            stacks.push(Stack {
                pid: key.pid,
                tid: key.tid,
                comm: String::from_utf8_lossy(&key.comm[..comm_len]).into_owned(),
                process: self.table.name(key.pid),
                labels: labels.clone(),
                frames,
                count,
            });
        }
        // Stable order makes output deterministic and diffable.
        stacks.sort_by(|a, b| (a.pid, a.tid, b.count).cmp(&(b.pid, b.tid, a.count)));
        if let Some(acc) = &mut self.workloads.accounting {
            acc.end_window();
        }
        for pid in self.table.end_window() {
            if self.denied.remove(&pid) {
                self.send(Control::AllowPid(pid));
            }
        }
        let now = SystemTime::now();
        let window = Window {
            start: self.start,
            duration: self.started.elapsed(),
            period_ns: self.period_ns,
            stacks,
        };
        self.start = now;
        self.started = Instant::now();
        window
    }
}

/// Frame `i` of a stack side: the leaf is where the CPU was; every other frame is a
/// return address, one past its call instruction.
fn caller(i: usize, addr: u64) -> u64 {
    if i == 0 {
        addr
    } else {
        addr.saturating_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pid: u32, tid: u32, user: &[u64]) -> Sample {
        Sample {
            time_ns: 0,
            cgroup_id: 1,
            pid,
            tid,
            cpu: 0,
            comm: *b"worker\0\0\0\0\0\0\0\0\0\0",
            kernel: vec![0xffff_ffff_8100_0010, 0xffff_ffff_8100_0020],
            user: user.to_vec(),
        }
    }

    fn agg(max_stacks: usize) -> Aggregator {
        let limits = Limits {
            max_processes: 16,
            max_objects: 16,
        };
        Aggregator::new(99, limits, max_stacks, Metrics::new(), Workloads::default())
    }

    #[test]
    fn counts_identical_stacks_together() {
        let mut a = agg(100);
        let pid = std::process::id();
        for _ in 0..5 {
            a.add(sample(pid, pid, &[0x10, 0x20]));
        }
        a.add(sample(pid, pid + 1, &[0x10, 0x20]));
        a.add(sample(pid, pid, &[0x30]));
        let w = a.close();
        assert_eq!(w.samples(), 7);
        assert_eq!(w.stacks.len(), 3);
        assert_eq!(w.period_ns, 10_101_010);
        let top = &w.stacks[0];
        assert_eq!((top.tid, top.count, top.comm.as_str()), (pid, 5, "worker"));
        assert_eq!(top.frames.len(), 4);
        // Return addresses move back one byte; leaves do not.
        assert!(matches!(
            top.frames[0],
            Frame::Kernel(0xffff_ffff_8100_0010)
        ));
        assert!(matches!(
            top.frames[1],
            Frame::Kernel(0xffff_ffff_8100_001f)
        ));
        assert!(matches!(
            top.frames[2],
            Frame::User(UserAddr::Unknown(0x10))
        ));
        assert!(matches!(
            top.frames[3],
            Frame::User(UserAddr::Unknown(0x1f))
        ));
        assert_eq!(a.close().samples(), 0, "the next window starts empty");
    }

    #[test]
    fn stack_cap_counts_what_it_drops() {
        let mut a = agg(2);
        let pid = std::process::id();
        for i in 0..5u64 {
            a.add(sample(pid, pid, &[0x100 + i]));
        }
        a.add(sample(pid, pid, &[0x100]));
        let w = a.close();
        assert_eq!(w.stacks.len(), 2);
        assert_eq!(w.samples(), 3, "existing stacks keep counting");
        let text = a.metrics.encode();
        assert!(
            text.contains("ember_samples_lost_total{reason=\"stack_cap\"} 3"),
            "{text}"
        );
    }

    #[test]
    fn excluded_processes_are_dropped_and_denied_in_bpf() {
        let (tx, rx) = std::sync::mpsc::sync_channel(8);
        let stat = std::fs::read_to_string("/proc/self/stat").expect("stat");
        let rules = crate::config::Filters {
            exclude_processes: vec![crate::os::procfs::parse_stat(&stat).expect("parse").comm],
            ..Default::default()
        };
        let workloads = Workloads {
            filter: Filter::new(&rules).expect("filter"),
            control: Some(tx),
            ..Default::default()
        };
        let limits = Limits {
            max_processes: 16,
            max_objects: 16,
        };
        let mut a = Aggregator::new(99, limits, 100, Metrics::new(), workloads);
        let pid = std::process::id();
        a.add(sample(pid, pid, &[0x10]));
        let w = a.close();
        assert!(w.stacks.is_empty());
        assert_eq!(rx.try_recv(), Ok(Control::DenyPid(pid)));
        a.add(sample(pid, pid, &[0x10]));
        assert_eq!(
            a.metrics.samples_filtered.get(),
            2,
            "in-flight samples are dropped too"
        );
    }
}
