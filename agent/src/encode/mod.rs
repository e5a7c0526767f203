//! Encoding: turns a symbolized window into the formats people and backends read.
//!
//! In: a window and the names of its frames from [`crate::symbolize`]. Out: a pprof
//! profile ([`pprof`]), and views of one for people ([`flamegraph`]: folded stacks, SVG,
//! top functions).

pub mod flamegraph;
pub mod pprof;

#[cfg(test)]
mod golden;

use std::time::{Duration, SystemTime};

use crate::proto::Profile;
use pprof::FrameCounts;

/// One finished window.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// Wall-clock start of the window.
    pub start: SystemTime,
    /// Length of the window.
    pub duration: Duration,
    /// Samples in it.
    pub samples: u64,
    /// The profile.
    pub profile: Profile,
    /// The profile, serialized and gzipped.
    pub gz: Vec<u8>,
    /// Named and unnamed frames.
    pub frames: FrameCounts,
}
