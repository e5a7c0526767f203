//! The commands that read profiles for a person: `ember report` (the window files on disk,
//! like `perf report`) and `ember top` (a live view, like `py-spy top`), and what they
//! share with `ember record`: the output formats and the processes a recording follows.
//!
//! This room composes the others (it starts an [`crate::agent::Agent`], reads the window
//! files `crate::export::files` writes, merges them as the server does), so it comes last
//! in the module order; `anyhow` carries its errors, as at any edge.

pub mod output;
pub mod report;
pub mod target;
pub mod top;
