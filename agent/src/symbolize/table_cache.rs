//! The symbolizer's cache of parsed symbol tables: one per file (by the identity of the file
//! opened), least recently used evicted past `symbols.cache_bytes`, a file whose table
//! alone is over the budget left unnamed for a while rather than parsed every window.

use std::collections::HashMap;
use std::sync::Arc;

use crate::model::FileId;
use crate::symbolize::table::SymTable;

/// Parsed symbol tables by file, least recently used evicted past a byte budget.
pub(super) struct Tables {
    pub(super) map: HashMap<FileId, (Option<Arc<SymTable>>, usize, u64)>,
    pub(super) bytes: usize,
    budget: usize,
    /// Files whose table was bigger than the whole budget, with the window it was built
    /// in: not parsed again for [`OVER_BUDGET_WINDOWS`] windows (capped at
    /// [`MAX_OVER_BUDGET`] files).
    pub(super) over_budget: HashMap<FileId, u64>,
}

/// Windows an object whose table exceeds the budget stays unnamed before it is parsed
/// again (a build host maps a 150 MB compiler library in every window; parsing it each
/// time cost 4 % of a core).
pub(super) const OVER_BUDGET_WINDOWS: u64 = 30;

/// Files remembered as over the budget; past it the memory starts afresh.
const MAX_OVER_BUDGET: usize = 1024;

/// What the cache counts for a file without a table (the entry itself).
pub(super) const NEGATIVE_BYTES: usize = 64;

impl Tables {
    pub(super) fn new(budget: u64) -> Self {
        Self {
            map: HashMap::new(),
            bytes: 0,
            budget: usize::try_from(budget).unwrap_or(usize::MAX),
            over_budget: HashMap::new(),
        }
    }

    /// Whether `id`'s table was over the budget within the last [`OVER_BUDGET_WINDOWS`].
    pub(super) fn refused(&mut self, id: &FileId, window: u64) -> bool {
        match self.over_budget.get(id) {
            Some(&w) if window.saturating_sub(w) < OVER_BUDGET_WINDOWS => true,
            Some(_) => {
                self.over_budget.remove(id);
                false
            }
            None => false,
        }
    }

    /// Forgets `id` (its file is gone).
    pub(super) fn remove(&mut self, id: &FileId) {
        if let Some((_, b, _)) = self.map.remove(id) {
            self.bytes -= b;
        }
        self.over_budget.remove(id);
    }

    /// The cached answer for `id` (a table, or `None` for a file known to have none).
    pub(super) fn get(&mut self, id: &FileId, window: u64) -> Option<Option<Arc<SymTable>>> {
        let e = self.map.get_mut(id)?;
        e.2 = window;
        Some(e.0.clone())
    }

    /// Caches `table` for `id`, evicting the least recently used until it fits; returns
    /// how many were evicted (or not kept). A table bigger than the whole budget serves only
    /// this window. Tables used in this window are not evicted for it: when the others do not
    /// make room, `table` serves this window only (counted), so a window that needs more than
    /// the budget rebuilds its overflow in the next one, not every table evicted in turn.
    pub(super) fn insert(&mut self, id: FileId, table: Option<Arc<SymTable>>, window: u64) -> u64 {
        let size = table.as_ref().map_or(NEGATIVE_BYTES, |t| t.bytes());
        if size > self.budget {
            if self.over_budget.len() >= MAX_OVER_BUDGET {
                self.over_budget.clear();
            }
            self.over_budget.insert(id, window);
            return 1;
        }
        let mut evicted = 0;
        while self.bytes + size > self.budget {
            let older = self.map.iter().filter(|(_, e)| e.2 < window);
            let Some((&old, _)) = older.min_by_key(|(_, e)| e.2) else {
                return evicted + 1;
            };
            if let Some((_, b, _)) = self.map.remove(&old) {
                self.bytes -= b;
                evicted += 1;
            }
        }
        self.bytes += size;
        if let Some((_, b, _)) = self.map.insert(id, (table, size, window)) {
            self.bytes -= b;
        }
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(ino: u64) -> FileId {
        FileId {
            dev: 1,
            ino,
            size: 0,
            mtime: Default::default(),
            ctime: Default::default(),
        }
    }

    #[test]
    fn a_window_over_the_budget_rebuilds_its_overflow_not_its_other_tables() {
        // Room for two of the three files every window needs.
        let mut t = Tables::new(2 * NEGATIVE_BYTES as u64);
        let mut rebuilt = Vec::new();
        for window in 1..=5 {
            for ino in 1..=3 {
                if t.get(&id(ino), window).is_none() {
                    rebuilt.push((window, ino));
                    let _ = t.insert(id(ino), None, window);
                }
            }
            assert!(t.bytes <= 2 * NEGATIVE_BYTES);
        }
        let first: Vec<(u64, u64)> = (1..=3).map(|ino| (1, ino)).collect();
        let later: Vec<(u64, u64)> = (2..=5).map(|w| (w, 3)).collect();
        assert_eq!(
            rebuilt,
            [first, later].concat(),
            "only the third, once a window"
        );
        // A window that no longer needs a file lets it go for one it needs.
        assert_eq!(t.insert(id(4), None, 6), 1);
        assert_eq!(t.map.len(), 2);
        assert!(t.map.contains_key(&id(4)));
    }
}
