//! The symbolizer's symbol tables: read within the caps ([`build_table`]), and cached one
//! per file (by the identity of the file opened), least recently used evicted past
//! `symbols.cache_bytes`, a file whose table alone is over the budget left unnamed for a
//! while rather than parsed every window.

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::Symbols;
use crate::metrics::{Cache, Metrics, NameCap, ObjectRefusal, SymbolSource};
use crate::model::FileId;
use crate::process::elf_file::{ElfError, ElfReader, Limits};
use crate::process::object::{find_debug_file, refusal, FileAt, Object};
use crate::symbolize::table::SymTable;
use crate::symbolize::Symbolizer;

/// A symbol table and where its names come from.
pub(super) struct Named {
    /// The table.
    pub(super) table: SymTable,
    /// Which table named it: the object's `.symtab`, a debug file's, or `.dynsym` alone.
    pub(super) source: SymbolSource,
}

/// Parsed symbol tables by file, least recently used evicted past a byte budget.
pub(super) struct Tables {
    pub(super) map: HashMap<FileId, (Option<Arc<Named>>, usize, u64)>,
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

impl Symbolizer {
    /// The symbol table of `obj`: from the cache, else read and parsed now (once per file;
    /// a file that cannot be read is remembered as such). `None` if it has none.
    pub(super) fn table(&mut self, obj: &Object) -> Option<Arc<Named>> {
        if let Some(t) = self.tables.get(&obj.id, self.window) {
            return t;
        }
        if self.tables.refused(&obj.id, self.window) {
            return None;
        }
        // The file opened must be the inode the mapping names: one opened by its path
        // (where `map_files` was refused) can be another file by now, and its names must
        // not be shown for this mapping. (Inode only: btrfs subvolumes and some overlay
        // setups report another `st_dev` than `/proc/PID/maps`.)
        if obj.id.ino != obj.key.inode {
            tracing::debug!(
                "{} is not the mapped inode {} (opened {}); unnamed",
                obj.path,
                obj.key.inode,
                obj.id.ino
            );
            self.metrics.object_refused(ObjectRefusal::Mismatch);
            self.tables.insert(obj.id, None, self.window);
            return None;
        }
        let (settings, metrics) = (&self.settings, &self.metrics);
        // A parser bug on a hostile file costs that file's names, not the agent.
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            build_table(obj, settings, metrics)
        }));
        let table = match built {
            Ok(Ok((t, source, lacks_debug))) => {
                if let (true, Some(d), Some(id)) =
                    (lacks_debug, self.debuginfod.as_mut(), obj.build_id.as_ref())
                {
                    d.ask(id, obj.id);
                }
                Some(Arc::new(Named { table: t, source }))
            }
            Ok(Err(e)) => {
                tracing::debug!("cannot read the symbols of {}: {e}", obj.path);
                self.metrics.object_refused(refusal(&e));
                None
            }
            Err(_) => {
                tracing::warn!(
                    "the symbol reader panicked on {}; it stays unnamed",
                    obj.path
                );
                self.metrics.object_refused(ObjectRefusal::Panic);
                None
            }
        };
        let evicted = self.tables.insert(obj.id, table.clone(), self.window);
        if self.tables.refused(&obj.id, self.window) {
            tracing::debug!(
                "the symbol table of {} is over symbols.cache_bytes; unnamed for {OVER_BUDGET_WINDOWS} windows",
                obj.path
            );
            self.metrics.object_refused(ObjectRefusal::OverBudget);
        }
        if evicted > 0 {
            self.metrics.dropped(Cache::SymbolTables, evicted);
        }
        table
    }
}

/// Reads the symbol table of `obj` within the `symbols:` caps: its own `.symtab` and
/// `.dynsym`, and, without `.symtab`, that of its debug file ([`find_debug_file`]); says too
/// which table names it and whether it is stripped with a build id and no debug file (one
/// to ask debuginfod for).
pub(super) fn build_table(
    obj: &Object,
    settings: &Symbols,
    metrics: &Metrics,
) -> Result<(SymTable, SymbolSource, bool), ElfError> {
    let limits = Limits {
        max_read_bytes: settings.max_read_bytes,
        max_section_bytes: settings.max_section_bytes,
    };
    let src = obj.reader();
    let mut elf = ElfReader::new(&src, limits)?;
    let stripped = !elf
        .sections()
        .iter()
        .any(|s| s.kind == object::elf::SHT_SYMTAB);
    let debug_file = stripped
        .then(|| {
            find_debug_file(
                obj,
                &settings.debug_dirs,
                &settings.root_debug_dirs,
                settings.fetched_dir.as_deref(),
                metrics,
            )
        })
        .flatten();
    let lacks_debug = stripped && obj.build_id.is_some() && debug_file.is_none();
    let debug_src = debug_file
        .as_ref()
        .and_then(|(f, _)| Some(FileAt::new(f, FileId::of_file(f).ok()?.size)));
    let mut debug = match &debug_src {
        Some(d) => match ElfReader::new(d, limits) {
            // The file is named by the build id; a file that says otherwise is not it.
            Ok(mut r) => (r.build_id().ok().flatten() == obj.build_id).then_some(r),
            Err(e) => {
                metrics.object_refused(refusal(&e));
                None
            }
        },
        None => None,
    };
    let source = match (&debug, &debug_file) {
        _ if !stripped => SymbolSource::Symtab,
        (Some(d), Some((_, from)))
            if d.sections()
                .iter()
                .any(|s| s.kind == object::elf::SHT_SYMTAB) =>
        {
            *from
        }
        _ => SymbolSource::Dynsym,
    };
    let (table, built) = SymTable::build(&mut elf, debug.as_mut())?;
    if built.truncated {
        metrics.object_refused(ObjectRefusal::TooLarge);
    }
    if built.names_cut > 0 {
        metrics.name_capped(NameCap::NameLength, built.names_cut);
    }
    Ok((table, source, lacks_debug))
}

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
    pub(super) fn get(&mut self, id: &FileId, window: u64) -> Option<Option<Arc<Named>>> {
        let e = self.map.get_mut(id)?;
        e.2 = window;
        Some(e.0.clone())
    }

    /// Caches `table` for `id`, evicting the least recently used until it fits; returns
    /// how many were evicted (or not kept). A table bigger than the whole budget serves only
    /// this window. Tables used in this window are not evicted for it: when the others do not
    /// make room, `table` serves this window only (counted), so a window that needs more than
    /// the budget rebuilds its overflow in the next one, not every table evicted in turn.
    pub(super) fn insert(&mut self, id: FileId, table: Option<Arc<Named>>, window: u64) -> u64 {
        let size = table.as_ref().map_or(NEGATIVE_BYTES, |t| t.table.bytes());
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
