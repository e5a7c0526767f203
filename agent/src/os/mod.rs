//! Operating-system helpers that every stage may use and that import no stage: strict
//! `/proc` parsers and capped reads, and the capability check.

pub mod openat2;
pub mod privileges;
pub mod procfs;
