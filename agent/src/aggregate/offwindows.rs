//! Off-CPU windows longer than the CPU window (`offcpu.window`): each period's off-CPU
//! stacks, normalized at the period's close like the CPU window's (so a process that exits
//! mid-window keeps its names), summed by stack until the off-CPU window ends.
//!
//! Why: every window costs the output thread a naming pass, an encode, a file and a prune,
//! whatever it holds, and on a quiet host the off-CPU windows hold the same few hundred
//! daemon waits period after period. Three off-CPU kinds written every 10 s tripled the
//! files; summed over a minute they cost a sixth of that, and each distinct stack is named
//! and encoded once a minute instead of six times.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::{Frame, Stack, Window};
use crate::metrics::{Loss, Metrics};
use crate::model::ProfileKind;
use crate::process::table::UserAddr;

/// The off-CPU stacks of the current off-CPU window, summed by stack, one table per kind.
pub(super) struct OffWindows {
    kinds: HashMap<ProfileKind, Sums>,
    /// Stacks held, and their bytes, all kinds together.
    len: usize,
    bytes: u64,
    /// The off-CPU window's length.
    length: Duration,
    start: SystemTime,
    started: Instant,
    /// When it ends (`run`'s periods close it at the first boundary at or after this).
    pub(super) deadline: Instant,
    max_stacks: usize,
    max_bytes: u64,
    hasher: foldhash::quality::RandomState,
}

/// One kind's stacks: the stacks, and their indexes by [`stack_hash`].
#[derive(Default)]
struct Sums {
    stacks: Vec<Stack>,
    index: HashMap<u64, Vec<usize>>,
}

impl OffWindows {
    /// An empty window of `length`, holding at most `max_stacks` stacks and `max_bytes`
    /// bytes of them, all kinds together (a window's caps).
    pub(super) fn new(length: Duration, max_stacks: usize, max_bytes: u64) -> Self {
        Self {
            kinds: HashMap::new(),
            len: 0,
            bytes: 0,
            length,
            start: SystemTime::now(),
            started: Instant::now(),
            deadline: Instant::now() + length,
            max_stacks,
            max_bytes,
            hasher: Default::default(),
        }
    }

    /// Adds a period's stacks of `kind`: a stack already held (same thread, labels, state
    /// and frames) adds its blocks and time to it; a new one past the caps is dropped,
    /// its blocks counted as lost to the stack cap.
    pub(super) fn add(&mut self, kind: ProfileKind, stacks: Vec<Stack>, metrics: &Metrics) {
        let sums = self.kinds.entry(kind).or_default();
        for s in stacks {
            let h = stack_hash(&self.hasher, &s);
            let slot = sums.index.entry(h).or_default();
            if let Some(&i) = slot.iter().find(|&&i| same(&sums.stacks[i], &s)) {
                let held = &mut sums.stacks[i];
                held.count += s.count;
                if let (Some(a), Some(b)) = (&mut held.off_cpu, s.off_cpu) {
                    a.ns += b.ns;
                    a.blocks += b.blocks;
                }
                continue;
            }
            let bytes = stack_bytes(&s);
            if self.len >= self.max_stacks || self.bytes + bytes > self.max_bytes {
                metrics.lost(Loss::StackCap, s.count);
                continue;
            }
            slot.push(sums.stacks.len());
            sums.stacks.push(s);
            self.len += 1;
            self.bytes += bytes;
        }
    }

    /// Ends the off-CPU window: one window of each of `kinds` (empty when none came), each
    /// sorted by thread then time off CPU, and starts the next, of the same length, from
    /// `next` (the time until its boundary).
    pub(super) fn take(
        &mut self,
        kinds: &[ProfileKind],
        period_ns: u64,
        next: Duration,
    ) -> Vec<Window> {
        let ns = |s: &Stack| s.off_cpu.map_or(0, |o| o.ns);
        let out = kinds
            .iter()
            .map(|&kind| {
                let mut stacks = self.kinds.remove(&kind).unwrap_or_default().stacks;
                stacks.sort_by(|a, b| (a.pid, a.tid, ns(b)).cmp(&(b.pid, b.tid, ns(a))));
                Window {
                    start: self.start,
                    duration: self.started.elapsed(),
                    period_ns,
                    kind,
                    stacks,
                }
            })
            .collect();
        self.kinds.clear();
        (self.len, self.bytes) = (0, 0);
        self.start = SystemTime::now();
        self.started = Instant::now();
        self.deadline = self.started + next;
        out
    }

    /// The off-CPU window's length.
    pub(super) fn length(&self) -> Duration {
        self.length
    }

    /// Stacks held, all kinds together.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Bytes of the stacks held ([`stack_bytes`]), all kinds together.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// The bytes a held stack costs: its parts, its frames and its name.
fn stack_bytes(s: &Stack) -> u64 {
    (std::mem::size_of::<Stack>()
        + 32
        + s.frames.len() * std::mem::size_of::<Frame>()
        + s.comm.len()) as u64
}

/// A hash of what tells two stacks of one window apart (see [`same`]).
fn stack_hash(hasher: &foldhash::quality::RandomState, s: &Stack) -> u64 {
    let mut h = hasher.build_hasher();
    (s.pid, s.tid, &s.comm, s.off_cpu.map(|o| o.state)).hash(&mut h);
    s.labels.sample_labels().for_each(|l| l.hash(&mut h));
    for f in &s.frames {
        match f {
            Frame::Kernel(a) => (0u8, *a).hash(&mut h),
            Frame::User(u) => match u {
                UserAddr::Object(o, off) => (1u8, Arc::as_ptr(o) as usize, *off).hash(&mut h),
                UserAddr::Region(l, off) => (2u8, l, *off).hash(&mut h),
                UserAddr::Unknown(a) => (3u8, *a).hash(&mut h),
                UserAddr::Jit(j) => (4u8, Arc::as_ptr(j) as usize).hash(&mut h),
                UserAddr::Python(p) => (5u8, Arc::as_ptr(p) as usize).hash(&mut h),
            },
        }
    }
    h.finish()
}

/// Whether two stacks are one: the same thread, labels, state and frames. Frames in an
/// object, JIT code or Python compare by the shared record they point to, as the process
/// table hands it out: a record read again is a new stack, never a wrong merge.
fn same(a: &Stack, b: &Stack) -> bool {
    a.pid == b.pid
        && a.tid == b.tid
        && a.comm == b.comm
        && a.off_cpu.map(|o| o.state) == b.off_cpu.map(|o| o.state)
        && (Arc::ptr_eq(&a.labels, &b.labels) || a.labels == b.labels)
        && a.frames.len() == b.frames.len()
        && a.frames
            .iter()
            .zip(&b.frames)
            .all(|(x, y)| same_frame(x, y))
}

fn same_frame(a: &Frame, b: &Frame) -> bool {
    match (a, b) {
        (Frame::Kernel(x), Frame::Kernel(y)) => x == y,
        (Frame::User(x), Frame::User(y)) => match (x, y) {
            (UserAddr::Object(o, i), UserAddr::Object(p, j)) => Arc::ptr_eq(o, p) && i == j,
            (UserAddr::Region(l, i), UserAddr::Region(m, j)) => l == m && i == j,
            (UserAddr::Unknown(i), UserAddr::Unknown(j)) => i == j,
            (UserAddr::Jit(x), UserAddr::Jit(y)) => Arc::ptr_eq(x, y),
            (UserAddr::Python(x), UserAddr::Python(y)) => Arc::ptr_eq(x, y),
            _ => false,
        },
        _ => false,
    }
}
