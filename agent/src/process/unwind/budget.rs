//! The byte budget and its LRU: kernel memory (tables plus per-process ranges) stays under
//! `sampling.unwind_max_bytes`.
//!
//! The least recently used tables (the sampler stamps each table's slot when it walks
//! it) are evicted first; a table walked in the last [`IN_USE`] never is (a host whose
//! working set is over the cap would otherwise evict and rebuild tables endlessly), a table
//! over 1/[`MAX_SHARE`] of the cap is never installed, and a table refused for want of
//! room is not tried again for [`RETRY_REFUSED`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::files::MAX_FILES;
use super::slots::Slots;
use super::store::TableKey;
use crate::capture::unwind::{UnwindIo, PROC_BYTES};

/// What the kernel spends on one hash element besides its value (approximate).
pub(super) const PROC_OVERHEAD: u64 = 64;
/// Kernel bytes of one process's ranges.
pub(super) const PROC_COST: u64 = PROC_BYTES as u64 + PROC_OVERHEAD;
/// A table walked this recently is in use: never evicted to make room for another.
pub(super) const IN_USE: Duration = Duration::from_millis(500);
/// A table refused for want of room is not built or installed again for this long.
const RETRY_REFUSED: Duration = Duration::from_secs(10);
/// A table larger than this share of the cap (1/`MAX_SHARE`) is never installed: it would
/// evict most others.
const MAX_SHARE: u64 = 2;

/// The cap, and the tables refused under it; see the module documentation.
#[derive(Debug)]
pub(super) struct Budget {
    max_bytes: u64,
    /// Tables refused for want of room, and until when they stay refused.
    refused: HashMap<TableKey, Instant>,
}

impl Budget {
    /// A budget of `max_bytes`.
    pub(super) fn new(max_bytes: u64) -> Self {
        Self {
            max_bytes,
            refused: HashMap::new(),
        }
    }

    /// Kernel bytes in use: `table_bytes` of tables and `procs` processes' ranges.
    pub(super) fn used(table_bytes: u64, procs: usize) -> u64 {
        table_bytes + procs as u64 * PROC_COST
    }

    /// Whether a table of `bytes` may ever be installed.
    pub(super) fn admits(&self, bytes: u64) -> bool {
        bytes <= self.max_bytes / MAX_SHARE
    }

    /// Whether `more` bytes fit besides `used`.
    pub(super) fn fits(&self, used: u64, more: u64) -> bool {
        used + more <= self.max_bytes
    }

    /// Whether `key` was refused for want of room a moment ago.
    pub(super) fn is_refused(&mut self, key: &TableKey) -> bool {
        match self.refused.get(key) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                self.refused.remove(key);
                false
            }
            None => false,
        }
    }

    /// Refuses `key` for [`RETRY_REFUSED`].
    pub(super) fn refuse(&mut self, key: TableKey) {
        if self.refused.len() >= MAX_FILES {
            self.refused.clear();
        }
        self.refused.insert(key, Instant::now() + RETRY_REFUSED);
    }
}

/// The table to evict next: the least recently walked of those not walked in the last
/// [`IN_USE`] before `now_ns` (nor waiting to be committed); `None` if there is none.
pub(super) fn lru_victim(
    slots: &Slots,
    io: &impl UnwindIo,
    now_ns: u64,
) -> Option<(u32, TableKey)> {
    let idle_before = now_ns.saturating_sub(IN_USE.as_nanos() as u64);
    slots
        .evictable()
        .map(|(slot, key)| (slot, key, io.last_used(slot)))
        .filter(|&(_, _, used)| used < idle_before)
        .min_by_key(|&(_, _, used)| used)
        .map(|(slot, key, _)| (slot, key))
}

/// CLOCK_MONOTONIC in nanoseconds: what `bpf_ktime_get_ns` stamps slots with.
pub(super) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; CLOCK_MONOTONIC is what bpf_ktime_get_ns reads.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::unwind::fake::FakeMaps;

    #[test]
    fn the_cap_and_its_share() {
        let b = Budget::new(10 << 20);
        assert!(b.admits(5 << 20) && !b.admits((5 << 20) + 1));
        assert!(b.fits(9 << 20, 1 << 20) && !b.fits(9 << 20, (1 << 20) + 1));
        assert_eq!(Budget::used(4096, 2), 4096 + 2 * PROC_COST);
    }

    #[test]
    fn refused_tables_wait() {
        let mut b = Budget::new(1 << 20);
        let key = [9; 16];
        assert!(!b.is_refused(&key));
        b.refuse(key);
        assert!(b.is_refused(&key));
        b.refused
            .insert(key, Instant::now() - Duration::from_millis(1));
        assert!(!b.is_refused(&key), "refused no longer");
        assert!(b.refused.is_empty());
    }

    #[test]
    fn the_least_recently_walked_idle_table_goes_first() {
        let mut slots = Slots::new();
        let mut io = FakeMaps::default();
        let keys: Vec<TableKey> = (0..4u8).map(|i| [i; 16]).collect();
        for (slot, key) in keys.iter().enumerate() {
            slots.put(slot as u32, *key, 4096, Vec::new());
        }
        let now = 10_000_000_000;
        assert_eq!(lru_victim(&slots, &io, now), None, "all pending");
        slots.committed();
        // Walked at 5 s, 3 s, 9.9 s (in use) and 4 s.
        for (slot, at) in [(0, 5_000_000_000), (1, 3_000_000_000), (2, 9_900_000_000)] {
            io.mark_used(slot, at);
        }
        io.mark_used(3, 4_000_000_000);
        assert_eq!(lru_victim(&slots, &io, now), Some((1, keys[1])));
        slots.free(1);
        assert_eq!(lru_victim(&slots, &io, now), Some((3, keys[3])));
        slots.free(3);
        assert_eq!(lru_victim(&slots, &io, now), Some((0, keys[0])));
        slots.free(0);
        assert_eq!(lru_victim(&slots, &io, now), None, "slot 2 is in use");
        assert_eq!(
            lru_victim(&slots, &io, now + 1_000_000_000),
            Some((2, keys[2]))
        );
    }
}
