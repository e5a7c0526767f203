//! Encoding: turns a symbolized window into the formats people and backends read.
//!
//! In: a [`Symbolized`] window from [`crate::symbolize`] (resolved frames, typed workload
//! labels per stack). Out: a pprof profile ([`pprof`]) and views of it for people
//! ([`flamegraph`]: folded stacks, SVG, top functions). Each network sink encodes the
//! typed window its own way in its folder (`crate::export::pyroscope`,
//! `crate::export::otlp`), sharing [`pprof`]'s builder; none reads a label back out of a
//! pprof string table. The output thread's loop ([`output`]) symbolizes and encodes each
//! window.

pub mod flamegraph;
pub(crate) mod output;
pub mod pprof;
pub mod speedscope;

#[cfg(test)]
mod golden;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::model::{FrameCounts, Symbolized};
use crate::proto::Profile;

/// One finished window: the symbolized window, and its pprof profile.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// Wall-clock start of the window.
    pub start: SystemTime,
    /// Length of the window.
    pub duration: Duration,
    /// Samples in it.
    pub samples: u64,
    /// The window itself, for the sinks that encode it their own way.
    pub window: Arc<Symbolized>,
    /// The profile.
    pub profile: Profile,
    /// The profile, serialized and gzipped.
    pub gz: Vec<u8>,
    /// Named and unnamed frames.
    pub frames: FrameCounts,
}

impl Encoded {
    /// Encodes `window` as pprof (and gzips it with `gzip`, as window files are stored).
    pub fn new(window: Symbolized, gzip: &mut pprof::Gzip) -> std::io::Result<Self> {
        let profile = pprof::encode(&window);
        let gz = gzip.profile(&profile)?;
        Ok(Self {
            start: window.start,
            duration: window.duration,
            samples: window.samples(),
            frames: window.frame_counts(),
            window: Arc::new(window),
            profile,
            gz,
        })
    }
}
