//! Interned JIT names: runtimes in many processes (a fleet of identical JVM or Node pods
//! on a node) write the same function and file names, so each distinct name is held once
//! and shared by every table that holds it.
//!
//! A pure leaf, shared by the perf map and jitdump parsers (and the agent's JIT stage).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// A shared set of names; clones share the set.
#[derive(Debug, Clone, Default)]
pub struct Names(Arc<Mutex<HashSet<Arc<str>>>>);

impl Names {
    /// The shared copy of `name`, added when new.
    pub fn intern(&self, name: &str) -> Arc<str> {
        let Ok(mut set) = self.0.lock() else {
            return Arc::from(name);
        };
        if let Some(n) = set.get(name) {
            return n.clone();
        }
        let n: Arc<str> = Arc::from(name);
        set.insert(n.clone());
        n
    }

    /// Drops names no table holds any more (O(names); called at most once per window).
    pub fn prune(&self) {
        if let Ok(mut set) = self.0.lock() {
            set.retain(|n| Arc::strong_count(n) > 1);
        }
    }

    /// Distinct names held.
    #[cfg(any(test, feature = "testing"))]
    pub fn len(&self) -> usize {
        self.0.lock().map_or(0, |s| s.len())
    }

    /// Whether no name is held.
    #[cfg(any(test, feature = "testing"))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the distinct names held (their text).
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.0.lock().map_or(0, |s| s.iter().map(|n| n.len()).sum())
    }
}
