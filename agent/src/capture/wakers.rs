//! Joins an off-CPU block to the thread that woke it. The waker's record goes out as it
//! wakes a block already past `min_block` (sched_waking, in the waker); the block's own
//! record follows once the blocked thread is back. Between the two, the waker waits here,
//! keyed by the woken thread: at most `cap` of them, the oldest dropped first, counted.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::model::Sample;

/// A waker waits for its block at most this long: a block's record follows its wakeup
/// within the time the woken thread takes to run again (microseconds to a few ms on a
/// loaded host); one that never comes was lost (ring buffer, map full, thread exited).
const MAX_WAIT: Duration = Duration::from_secs(5);

/// Why a waker was not joined to its block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unjoined {
    /// Its block's record never came (lost, or the thread exited), or a later waker of the
    /// same thread came first.
    Unmatched,
    /// `cap` wakers were already waiting.
    Full,
}

struct Pending {
    block_ns: u64,
    at: Instant,
    waker: Sample,
}

/// Wakers waiting for their blocks' records, by woken thread.
pub struct Wakers {
    pending: HashMap<u32, Pending>,
    cap: usize,
}

impl Wakers {
    /// At most `cap` wakers waiting at once.
    pub fn new(cap: usize) -> Self {
        Self {
            pending: HashMap::new(),
            cap: cap.max(1),
        }
    }

    /// Holds the waker of `wakee`'s block that began at `block_ns`; returns what was not
    /// joined on the way (a waker it replaced, expired ones, or this one when full).
    pub fn hold(
        &mut self,
        wakee: u32,
        block_ns: u64,
        waker: Sample,
        now: Instant,
    ) -> Vec<Unjoined> {
        let mut out = Vec::new();
        if !self.pending.contains_key(&wakee) && self.pending.len() >= self.cap {
            let before = self.pending.len();
            self.pending
                .retain(|_, p| now.saturating_duration_since(p.at) < MAX_WAIT);
            out.extend(std::iter::repeat_n(
                Unjoined::Unmatched,
                before - self.pending.len(),
            ));
            if self.pending.len() >= self.cap {
                out.push(Unjoined::Full);
                return out;
            }
        }
        let new = Pending {
            block_ns,
            at: now,
            waker,
        };
        if self.pending.insert(wakee, new).is_some() {
            out.push(Unjoined::Unmatched);
        }
        out
    }

    /// The waker of `tid`'s block that began at `start_ns`: one held for it, or for a
    /// later block of the same syscall merged into it (its record keeps the first start).
    /// A waker of an earlier block, whose record never came, is dropped (`Err`).
    pub fn take(&mut self, tid: u32, start_ns: u64) -> Result<Option<Sample>, Unjoined> {
        match self.pending.remove(&tid) {
            None => Ok(None),
            Some(p) if p.block_ns >= start_ns => Ok(Some(p.waker)),
            Some(_) => Err(Unjoined::Unmatched),
        }
    }

    /// Wakers waiting now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waker(tid: u32) -> Sample {
        Sample {
            time_ns: 0,
            cgroup_id: 0,
            pid: 1,
            tid,
            cpu: 0,
            comm: [0; 16],
            kernel: Vec::new(),
            user: Vec::new(),
            user_exact: 0,
            user_end: crate::model::StackEnd::Complete,
            python: Vec::new(),
            user_eval: 0,
            py_result: None,
            off_cpu: None,
            waker: None,
            lock: None,
        }
    }

    #[test]
    fn joins_the_block_it_woke_or_one_merged_after_it() {
        let mut w = Wakers::new(4);
        let now = Instant::now();
        assert!(w.hold(7, 1000, waker(70), now).is_empty());
        assert_eq!(w.take(8, 1000), Ok(None), "another thread");
        assert_eq!(w.take(7, 1000).map(|s| s.map(|s| s.tid)), Ok(Some(70)));
        assert!(w.is_empty());
        // Woken out of a second block of the same syscall: the record has the first start.
        w.hold(7, 2000, waker(71), now);
        assert_eq!(w.take(7, 1500).map(|s| s.map(|s| s.tid)), Ok(Some(71)));
        // A waker whose block's record was lost: the next block of its thread drops it.
        w.hold(7, 3000, waker(72), now);
        assert_eq!(w.take(7, 4000), Err(Unjoined::Unmatched));
    }

    #[test]
    fn bounded_oldest_expire_then_new_ones_are_refused() {
        let mut w = Wakers::new(2);
        let t0 = Instant::now();
        w.hold(1, 10, waker(10), t0);
        w.hold(2, 10, waker(20), t0);
        assert_eq!(
            w.hold(1, 20, waker(11), t0),
            [Unjoined::Unmatched],
            "a later waker of the same thread replaces it"
        );
        assert_eq!(w.hold(3, 10, waker(30), t0), [Unjoined::Full]);
        assert_eq!(w.len(), 2);
        let later = t0 + MAX_WAIT + Duration::from_secs(1);
        assert_eq!(
            w.hold(3, 10, waker(30), later),
            [Unjoined::Unmatched, Unjoined::Unmatched],
            "both expired"
        );
        assert_eq!(w.len(), 1);
    }
}
