//! Where windows go.
pub mod files;
