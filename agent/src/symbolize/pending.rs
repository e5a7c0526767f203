//! Frames named without lines because DWARF reads were paced ([`super::dwarf`]'s bucket ran
//! dry): kept in the frame cache by name, and looked up again only while the bucket has
//! bytes. Asking for them in every window instead meant naming them again in every window
//! (their objects' symbol tables rebuilt when the table cache could not hold them all) on a
//! host whose new addresses outrun the pace, which is every host with off-CPU on.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::metrics::Cache;
use crate::symbolize::{dwarf, CacheKey, FrameKey, Resolved, Symbolizer};

/// At most this many frames wait for their lines; the oldest beyond it keep their names
/// without lines (counted in `cache_dropped_total{cache="dwarf_pending"}`) until the frame
/// cache lets them go.
pub(super) const MAX_PENDING: usize = 16_384;

/// Frames waiting for their lines, oldest first: (file serial, file offset).
#[derive(Default)]
pub(super) struct Pending {
    queue: VecDeque<(u64, u64)>,
}

impl Pending {
    /// Whether no frame waits.
    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// How many frames wait.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.queue.len()
    }

    /// Adds a frame; returns how many old ones were let go to make room.
    fn push(&mut self, serial: u64, off: u64) -> u64 {
        let mut dropped = 0;
        while self.queue.len() >= MAX_PENDING {
            self.queue.pop_front();
            dropped += 1;
        }
        self.queue.push_back((serial, off));
        dropped
    }

    /// Takes every waiting frame, grouped by file in the order they first waited.
    fn take_grouped(&mut self) -> Vec<(u64, Vec<u64>)> {
        let mut groups: Vec<(u64, Vec<u64>)> = Vec::new();
        let mut at: HashMap<u64, usize> = HashMap::new();
        for (serial, off) in self.queue.drain(..) {
            let i = *at.entry(serial).or_insert_with(|| {
                groups.push((serial, Vec::new()));
                groups.len() - 1
            });
            groups[i].1.push(off);
        }
        groups
    }
}

impl Symbolizer {
    /// Notes the frames of `deferred` (named without lines this window) to be looked up again.
    pub(super) fn defer_lines(&mut self, deferred: impl IntoIterator<Item = FrameKey>) {
        let mut dropped = 0;
        for key in deferred {
            if let Some(CacheKey::Object(serial, off)) = self.cache_key(&key) {
                dropped += self.pending.push(serial, off);
            }
        }
        if dropped > 0 {
            self.metrics.dropped(Cache::DwarfPending, dropped);
        }
    }

    /// Looks up the lines of waiting frames while the bucket has bytes, oldest first,
    /// updating the frame cache and this window's results `out`. Frames whose file is gone,
    /// or whose cached name went with the frame cache, are forgotten: they are named afresh
    /// when next sampled.
    pub(super) fn retry_lines(&mut self, out: &mut HashMap<FrameKey, Resolved>) {
        if self.pending.is_empty() || !self.lines.can_read() {
            return;
        }
        let objects: HashMap<u64, Arc<crate::normalize::object::Object>> = self
            .live
            .values()
            .filter_map(|l| Some((l.serial, l.object.upgrade()?)))
            .collect();
        let mut dropped = 0;
        for (serial, mut offs) in self.pending.take_grouped() {
            let Some(obj) = objects.get(&serial) else {
                continue;
            };
            offs.sort_unstable();
            offs.dedup();
            offs.retain(|&off| self.cache.contains_key(&CacheKey::Object(serial, off)));
            if !self.lines.can_read() {
                for off in offs {
                    dropped += self.pending.push(serial, off);
                }
                continue;
            }
            let found = (self.lines).chains(obj, &offs, &self.settings, &self.metrics);
            for (off, chain) in found.chains {
                let key = CacheKey::Object(serial, off);
                let Some(old) = self.cache.get(&key) else {
                    continue;
                };
                let name = old
                    .named
                    .then(|| old.funcs.last().map(|f| f.name.clone()))
                    .flatten();
                let resolved = Resolved {
                    funcs: dwarf::merge(chain, name).into(),
                    named: true,
                };
                if let Some(slot) = out.get_mut(&FrameKey::Object(obj.id, off)) {
                    *slot = resolved.clone();
                }
                self.cache.insert(key, resolved);
            }
            for off in found.deferred {
                dropped += self.pending.push(serial, off);
            }
        }
        if dropped > 0 {
            self.metrics.dropped(Cache::DwarfPending, dropped);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_go_first_past_the_cap_and_files_keep_their_order() {
        let mut p = Pending::default();
        let mut dropped = 0;
        for i in 0..MAX_PENDING as u64 + 3 {
            dropped += p.push(i % 2 + 7, i);
        }
        assert_eq!(dropped, 3);
        assert_eq!(p.len(), MAX_PENDING);
        let groups = p.take_grouped();
        assert!(p.is_empty());
        // Offsets 0..3 went; the first left is 3, of file 8.
        assert_eq!(groups[0].0, 8);
        assert_eq!(groups[0].1[0], 3);
        assert_eq!(groups[1].0, 7);
        assert_eq!(groups[1].1[0], 4);
        assert_eq!(groups[0].1.len() + groups[1].1.len(), MAX_PENDING);
    }
}
