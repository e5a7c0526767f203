//! Aggregation stage: counts samples per (process, thread, stack) for one window,
//! then normalizes every distinct stack against the process table.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::capture::Sample;
use crate::metrics::Metrics;
use crate::process::{Limits, ProcessTable, UserAddr};

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

/// Per-window sample counts plus the process table they are normalized against.
pub struct Aggregator {
    table: ProcessTable,
    counts: HashMap<Key, u64>,
    max_stacks: usize,
    period_ns: u64,
    start: SystemTime,
    started: Instant,
    metrics: Metrics,
}

impl Aggregator {
    /// A new aggregator for samples taken at `frequency_hz`.
    pub fn new(frequency_hz: u64, limits: Limits, max_stacks: usize, metrics: Metrics) -> Self {
        Self {
            table: ProcessTable::new(limits, metrics.clone()),
            counts: HashMap::new(),
            max_stacks,
            period_ns: 1_000_000_000 / frequency_hz.max(1),
            start: SystemTime::now(),
            started: Instant::now(),
            metrics,
        }
    }

    /// Counts one sample; the first sample of a process reads its mappings.
    pub fn add(&mut self, s: Sample) {
        self.table.touch(s.pid);
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
            None if full => self.metrics.lost("stack_cap", 1),
            None => {
                self.counts.insert(key, 1);
            }
        }
    }

    /// Closes the window: normalizes its stacks and starts the next one.
    pub fn close(&mut self) -> Window {
        let counts = std::mem::take(&mut self.counts);
        let mut stacks = Vec::with_capacity(counts.len());
        for (key, count) in counts {
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
                frames,
                count,
            });
        }
        // Stable order makes output deterministic and diffable.
        stacks.sort_by(|a, b| (a.pid, a.tid, b.count).cmp(&(b.pid, b.tid, a.count)));
        self.table.end_window();
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
        Aggregator::new(99, limits, max_stacks, Metrics::new())
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
}
