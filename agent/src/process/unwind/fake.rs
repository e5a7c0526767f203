//! An in-memory [`UnwindIo`]: the sampler's unwind maps as plain maps, for the loader's
//! policy tests (no BPF, no root).

use std::collections::{BTreeMap, HashMap};

use crate::capture::unwind::{
    ember_unwind_file, ember_unwind_file_key, ember_unwind_proc, MapError, TableImage, UnwindIo,
    SLOTS,
};

/// A table as written: its header and sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FakeTable {
    /// `first_page` of its header.
    pub(crate) first_page: u32,
    /// Pages.
    pub(crate) pages: usize,
    /// Rows.
    pub(crate) rows: usize,
}

/// The maps; see the module documentation.
#[derive(Debug)]
pub(crate) struct FakeMaps {
    /// As [`UnwindIo::exec_hook`].
    pub(crate) exec_hook: bool,
    /// `unwind_tables`: slot → table.
    pub(crate) tables: BTreeMap<u32, FakeTable>,
    /// Written, not committed.
    pub(crate) pending: Vec<(u32, FakeTable)>,
    /// `unwind_procs`.
    pub(crate) procs: BTreeMap<u32, ember_unwind_proc>,
    /// Most entries `unwind_procs` takes.
    pub(crate) max_procs: usize,
    /// `unwind_files`, by (dev, inode).
    pub(crate) files: HashMap<(u64, u64), ember_unwind_file>,
    /// `unwind_used`.
    pub(crate) used: Vec<u64>,
    /// Times the row caches were emptied.
    pub(crate) cache_clears: u32,
    /// Every slot evicted, in order.
    pub(crate) evicted: Vec<u32>,
}

impl Default for FakeMaps {
    fn default() -> Self {
        Self {
            exec_hook: false,
            tables: BTreeMap::new(),
            pending: Vec::new(),
            procs: BTreeMap::new(),
            max_procs: usize::MAX,
            files: HashMap::new(),
            used: vec![0; SLOTS],
            cache_clears: 0,
            evicted: Vec::new(),
        }
    }
}

impl FakeMaps {
    /// The table ids of `pid`'s ranges, in order.
    pub(crate) fn range_tables(&self, pid: u32) -> Option<Vec<u32>> {
        let p = self.procs.get(&pid)?;
        Some(
            p.ranges[..p.count as usize]
                .iter()
                .map(|r| r.table)
                .collect(),
        )
    }
}

impl UnwindIo for FakeMaps {
    fn exec_hook(&self) -> bool {
        self.exec_hook
    }

    fn write_table(&mut self, slot: u32, table: TableImage<'_>) -> Result<(), MapError> {
        let t = FakeTable {
            first_page: table.header.first_page,
            pages: table.pages.len(),
            rows: table.rows.len(),
        };
        self.pending.push((slot, t));
        Ok(())
    }

    fn commit_tables(&mut self) -> Vec<u32> {
        self.tables.extend(self.pending.drain(..));
        Vec::new()
    }

    fn evict_table(&mut self, slot: u32) {
        self.tables.remove(&slot);
        self.evicted.push(slot);
    }

    fn write_proc(
        &mut self,
        pid: u32,
        value: &ember_unwind_proc,
        only_new: bool,
    ) -> Result<(), MapError> {
        let exists = self.procs.contains_key(&pid);
        if only_new && exists {
            return Err(MapError::Exists);
        }
        if !exists && self.procs.len() >= self.max_procs {
            return Err(MapError::TooLarge("unwind_procs full"));
        }
        self.procs.insert(pid, *value);
        Ok(())
    }

    fn delete_proc(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }

    fn proc_pids(&self) -> Vec<u32> {
        self.procs.keys().copied().collect()
    }

    fn write_file(
        &mut self,
        key: ember_unwind_file_key,
        value: &ember_unwind_file,
    ) -> Result<(), MapError> {
        self.files.insert((key.dev, key.ino), *value);
        Ok(())
    }

    fn delete_file(&mut self, key: ember_unwind_file_key) {
        self.files.remove(&(key.dev, key.ino));
    }

    fn last_used(&self, slot: u32) -> u64 {
        self.used.get(slot as usize).copied().unwrap_or(0)
    }

    fn mark_used(&mut self, slot: u32, ns: u64) {
        if let Some(u) = self.used.get_mut(slot as usize) {
            *u = ns;
        }
    }

    fn clear_row_cache(&mut self) {
        self.cache_clears += 1;
    }
}
