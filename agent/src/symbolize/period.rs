//! A period's windows named together: with off-CPU on, each period closes four windows (CPU,
//! `offcpu`, `offwake`, `lock`) filled mostly by the same processes' frames, so they are
//! resolved in one pass and each object's table and DWARF are read at most once a period.

use crate::aggregate::{Frame, Window};
use crate::model::Symbolized;
use crate::symbolize::{assemble, Symbolizer};

impl Symbolizer {
    /// Names every frame of the windows one period closed in one pass (from cache where
    /// possible), then assembles each window, in their order.
    pub fn symbolize_all(&mut self, windows: Vec<Window>) -> Vec<Symbolized> {
        let names = self.resolve_all(&windows);
        let out = windows.into_iter().map(|w| assemble(w, &names)).collect();
        drop(names);
        // Hand large freed buffers (section reads) back to the kernel rather than keeping
        // them in malloc's pools: steady RSS is what users budget for.
        crate::os::trim_heap();
        out
    }
}

/// Every frame of every stack of `windows`.
pub(super) fn frames(windows: &[Window]) -> impl Iterator<Item = &Frame> {
    windows
        .iter()
        .flat_map(|w| &w.stacks)
        .flat_map(|s| &s.frames)
}
