//! Stage progress for `/healthz`: each pipeline thread notes, with one relaxed atomic store,
//! that it is alive (capture and aggregation tick on every loop turn) or that it started and
//! finished a piece of work (the output thread, per window). The server reads it; nothing
//! waits on anything.
//!
//! A stage is stuck when its last tick (or the start of the window it is still working on)
//! is older than `health.stall_windows` window lengths: a capture thread wedged in a
//! syscall, an aggregator blocked on a FIFO, a symbolizer that never returns.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::metrics::reasons::Stage;

/// A stage that showed no sign of life within the limit.
#[derive(Debug, thiserror::Error)]
#[error("the {stage} stage has made no progress for {since_s} s (limit {limit_s} s)")]
pub struct Stalled {
    /// The stuck stage.
    pub stage: Stage,
    /// Seconds since its last tick (or since the work in hand began).
    pub since_s: u64,
    /// The limit, in seconds.
    pub limit_s: u64,
}

/// Last sign of life of each stage, in milliseconds since [`Progress`] was made (0: none).
#[derive(Debug)]
pub struct Progress {
    started: Instant,
    /// Stall limit in milliseconds; 0 turns the check off.
    limit_ms: AtomicU64,
    /// Per stage: last tick of a loop stage.
    ticks: [AtomicU64; 3],
    /// Per stage: when the work in hand began (0: idle).
    busy: [AtomicU64; 3],
}

impl Default for Progress {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            limit_ms: AtomicU64::new(0),
            ticks: Default::default(),
            busy: Default::default(),
        }
    }
}

fn slot(stage: Stage) -> usize {
    match stage {
        Stage::Capture => 0,
        Stage::Aggregate => 1,
        Stage::Output => 2,
    }
}

impl Progress {
    fn now_ms(&self) -> u64 {
        // +1: 0 means "never".
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    /// Sets how long a stage may go without progress (zero: never unhealthy).
    pub fn set_limit(&self, limit: Duration) {
        let ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        self.limit_ms.store(ms, Ordering::Relaxed);
    }

    /// A loop stage turned once: it is alive.
    pub fn tick(&self, stage: Stage) {
        self.ticks[slot(stage)].store(self.now_ms(), Ordering::Relaxed);
    }

    /// A work stage took up a piece of work (and is stuck if it never finishes it).
    pub fn begin(&self, stage: Stage) {
        self.busy[slot(stage)].store(self.now_ms(), Ordering::Relaxed);
        self.tick(stage);
    }

    /// A work stage finished its piece of work.
    pub fn end(&self, stage: Stage) {
        self.busy[slot(stage)].store(0, Ordering::Relaxed);
        self.tick(stage);
    }

    /// `Ok` unless a stage has shown no progress within the limit; then which and since when.
    pub fn check(&self) -> Result<(), Stalled> {
        self.check_at(self.now_ms())
    }

    fn check_at(&self, now: u64) -> Result<(), Stalled> {
        let limit = self.limit_ms.load(Ordering::Relaxed);
        if limit == 0 {
            return Ok(());
        }
        for &stage in Stage::ALL {
            let i = slot(stage);
            let busy = self.busy[i].load(Ordering::Relaxed);
            let tick = self.ticks[i].load(Ordering::Relaxed);
            // Loop stages must keep ticking; work stages only count while busy. A stage that
            // never ticked is not running in this mode.
            let since = if busy != 0 {
                now.saturating_sub(busy)
            } else if stage != Stage::Output && tick != 0 {
                now.saturating_sub(tick)
            } else {
                0
            };
            if since > limit {
                return Err(Stalled {
                    stage,
                    since_s: since / 1000,
                    limit_s: limit / 1000,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stuck_stages_are_named() {
        let p = Progress::default();
        assert!(p.check_at(1_000_000).is_ok(), "nothing ticked yet");
        p.set_limit(Duration::from_secs(30));
        p.tick(Stage::Capture);
        p.tick(Stage::Aggregate);
        let t = p.ticks[0].load(Ordering::Relaxed);
        assert!(p.check_at(t + 29_000).is_ok());
        let err = p.check_at(t + 31_000).expect_err("capture stuck");
        assert!(err.to_string().contains("capture"), "{err}");
        p.tick(Stage::Capture);
        p.tick(Stage::Aggregate);
        // Output idle for long is fine; busy for long is not.
        p.end(Stage::Output);
        let t = p.ticks[2].load(Ordering::Relaxed);
        p.tick(Stage::Capture);
        p.tick(Stage::Aggregate);
        assert!(p.check_at(t + 20_000).is_ok());
        p.begin(Stage::Output);
        p.ticks[0].store(u64::MAX / 2, Ordering::Relaxed);
        p.ticks[1].store(u64::MAX / 2, Ordering::Relaxed);
        let b = p.busy[2].load(Ordering::Relaxed);
        let err = p.check_at(b + 31_000).expect_err("output stuck");
        assert!(err.to_string().contains("output"), "{err}");
        p.set_limit(Duration::ZERO);
        assert!(p.check_at(b + 31_000).is_ok(), "0 turns it off");
    }
}
