//! Table slots and their generations: which table each slot of the sampler's
//! `unwind_tables` holds, and the id the sampler's ranges and files name it by.
//!
//! A table's id is its slot in the low [`SLOT_BITS`] and the slot's generation above them
//! (`EMBER_UNWIND_SLOT` in `bpf/ember.h`). The walker's row cache is keyed by id, so a slot
//! given to another table never serves the rows of the last; when a slot's generations
//! wrap, its ids repeat and the caller empties the row caches.

use std::collections::HashMap;

use super::store::TableKey;
use crate::capture::unwind::{SLOTS, SLOT_BITS};

/// Generations of a slot before its ids repeat: below 2^20 - 1, so that no id is
/// `EMBER_TABLE_NONE`. At the wrap the walker's row caches are emptied.
pub(super) const GENERATIONS: u32 = (1 << (32 - SLOT_BITS)) - 1;

/// A table's id as the sampler's maps name it: see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TableId(pub(super) u32);

impl TableId {
    /// The id of the table a slot holds after `held` others.
    pub(super) fn new(slot: u32, held: u64) -> Self {
        // Below GENERATIONS, so it fits in the bits above the slot.
        let generation = (held % u64::from(GENERATIONS)) as u32;
        Self(slot | generation << SLOT_BITS)
    }
}

/// A table the loader has built (loaded or not).
#[derive(Debug)]
pub(super) struct Table {
    /// Id in the sampler's maps while loaded.
    pub(super) id: Option<TableId>,
    /// Kernel bytes while loaded.
    pub(super) bytes: u64,
    /// Executable segments (address, file offset, bytes), for the bias of each mapping.
    pub(super) segments: Vec<(u64, u64, u64)>,
}

/// Which table each slot holds; see the module documentation.
#[derive(Debug)]
pub(super) struct Slots {
    /// Every table built so far, by key, loaded or not (a table's segments outlive its slot).
    tables: HashMap<TableKey, Table>,
    slots: Vec<Option<TableKey>>,
    /// Per slot: how many tables it has held (the next one's generation, modulo
    /// [`GENERATIONS`]).
    held: Vec<u64>,
    /// Slots filled but not yet committed to `unwind_tables`: never evicted.
    pending: Vec<u32>,
    /// Kernel bytes of the loaded tables.
    bytes: u64,
}

impl Slots {
    /// Every slot empty.
    pub(super) fn new() -> Self {
        Self {
            tables: HashMap::new(),
            slots: vec![None; SLOTS],
            held: vec![0; SLOTS],
            pending: Vec::new(),
            bytes: 0,
        }
    }

    /// The table of `key`, loaded or not.
    pub(super) fn table(&self, key: &TableKey) -> Option<&Table> {
        self.tables.get(key)
    }

    /// The id of `key`'s table while it is loaded.
    pub(super) fn id(&self, key: &TableKey) -> Option<TableId> {
        self.tables.get(key).and_then(|t| t.id)
    }

    /// The first empty slot.
    pub(super) fn free_slot(&self) -> Option<u32> {
        let i = self.slots.iter().position(|s| s.is_none())?;
        u32::try_from(i).ok()
    }

    /// Puts `key`'s table of `bytes` in `slot` (empty), pending until [`Slots::committed`].
    /// Returns its id and whether the slot's ids just started over.
    pub(super) fn put(
        &mut self,
        slot: u32,
        key: TableKey,
        bytes: u64,
        segments: Vec<(u64, u64, u64)>,
    ) -> (TableId, bool) {
        let i = slot as usize;
        self.slots[i] = Some(key);
        let held = self.held[i];
        self.held[i] = held + 1;
        self.pending.push(slot);
        self.bytes += bytes;
        let id = TableId::new(slot, held);
        self.tables.insert(
            key,
            Table {
                id: Some(id),
                bytes,
                segments,
            },
        );
        // A row cached for this id GENERATIONS tables ago could still be in the caches.
        (id, held != 0 && held % u64::from(GENERATIONS) == 0)
    }

    /// The pending slots are in `unwind_tables` now (or were refused and freed).
    pub(super) fn committed(&mut self) {
        self.pending.clear();
    }

    /// Whether any slot waits to be committed.
    pub(super) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Empties `slot`; the key of the table it held, now unloaded.
    pub(super) fn free(&mut self, slot: u32) -> Option<TableKey> {
        let key = self.slots.get_mut(slot as usize)?.take()?;
        if let Some(t) = self.tables.get_mut(&key) {
            t.id = None;
            self.bytes -= t.bytes;
        }
        Some(key)
    }

    /// The loaded slots that may be evicted (not pending), with their tables.
    pub(super) fn evictable(&self) -> impl Iterator<Item = (u32, TableKey)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, k)| Some((u32::try_from(i).ok()?, (*k)?)))
            .filter(|(slot, _)| !self.pending.contains(slot))
    }

    /// Tables loaded.
    pub(super) fn loaded(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Kernel bytes of the loaded tables.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Makes `slot` look as if it had held `held` tables (a wrap without a million loads).
    #[cfg(test)]
    pub(super) fn set_held(&mut self, slot: u32, held: u64) {
        self.held[slot as usize] = held;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::unwind::TABLE_NONE;

    #[test]
    fn table_ids_of_a_slot_differ_until_they_wrap_and_are_never_none() {
        let slot = SLOTS as u32 - 1;
        let ids: Vec<u32> = (0..4).map(|held| TableId::new(slot, held).0).collect();
        for (i, id) in ids.iter().enumerate() {
            // The walker looks tables up by the low bits (EMBER_UNWIND_SLOT).
            assert_eq!(id & (SLOTS as u32 - 1), slot);
            assert!(!ids[..i].contains(id), "{ids:x?}");
        }
        let last = u64::from(GENERATIONS) - 1;
        assert_ne!(TableId::new(slot, last).0, TABLE_NONE);
        assert_eq!(TableId::new(slot, last).0 >> SLOT_BITS, GENERATIONS - 1);
        // Where the ids start over (and the loader empties the row caches).
        assert_eq!(TableId::new(slot, last + 1), TableId::new(slot, 0));
        assert_eq!(TableId::new(7, 0).0, 7);
    }

    #[test]
    fn a_slot_reports_the_wrap_of_its_generations() {
        let mut s = Slots::new();
        let mut wraps = Vec::new();
        for n in 0..=u64::from(GENERATIONS) + 1 {
            let key = [n as u8; 16];
            let (id, wrapped) = s.put(3, key, 4096, Vec::new());
            s.committed();
            assert_eq!(s.free(3), Some(key));
            if wrapped {
                wraps.push((n, id));
            }
        }
        // Only the table that reuses the first id wraps.
        assert_eq!(wraps, [(u64::from(GENERATIONS), TableId(3))]);
        assert_eq!((s.bytes(), s.loaded()), (0, 0));
    }

    #[test]
    fn pending_slots_are_not_evictable_and_bytes_follow_the_slots() {
        let mut s = Slots::new();
        let (a, b) = ([1; 16], [2; 16]);
        assert_eq!(s.free_slot(), Some(0));
        s.put(0, a, 4096, vec![(0x1000, 0, 10)]);
        assert_eq!(s.free_slot(), Some(1));
        s.put(1, b, 8192, Vec::new());
        assert_eq!(s.evictable().count(), 0);
        assert!(s.has_pending());
        s.committed();
        assert_eq!(s.evictable().collect::<Vec<_>>(), [(0, a), (1, b)]);
        assert_eq!((s.bytes(), s.loaded()), (12288, 2));
        assert_eq!(s.free(0), Some(a));
        assert_eq!(s.free(0), None);
        assert_eq!(s.id(&a), None, "unloaded");
        assert_eq!(
            s.table(&a).map(|t| t.segments.clone()),
            Some(vec![(0x1000, 0, 10)]),
            "its segments are kept"
        );
        assert_eq!(s.id(&b), Some(TableId(1)));
        assert_eq!((s.bytes(), s.free_slot()), (8192, Some(0)));
    }
}
