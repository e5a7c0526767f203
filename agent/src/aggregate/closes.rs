//! When windows close: at wall-clock boundaries (`run`), every window from the start, or
//! once when the recording ends (`record`).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// When the aggregator closes its windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closes {
    /// At every boundary of a window of `window`: on multiples of it on the wall clock when
    /// `align` (`run`, so the windows of many hosts line up), else every `window` from the
    /// start.
    Every {
        /// The window length.
        window: Duration,
        /// Boundaries on the wall clock.
        align: bool,
    },
    /// Never on a timer: once, when the recording ends (capture stops and the queue is
    /// drained). `record`'s one window.
    AtEnd,
}

impl Closes {
    /// The next boundary from now; `None` for [`Closes::AtEnd`].
    pub(super) fn next(self) -> Option<Instant> {
        match self {
            Closes::Every { window, align } => Some(Instant::now() + until_boundary(window, align)),
            Closes::AtEnd => None,
        }
    }

    /// The window length, if windows close on a timer.
    pub(super) fn window(self) -> Option<Duration> {
        match self {
            Closes::Every { window, .. } => Some(window),
            Closes::AtEnd => None,
        }
    }
}

/// Time until the next window boundary: a multiple of `window` since the epoch when
/// aligned (so windows of many hosts line up), else a full window.
pub(super) fn until_boundary(window: Duration, align: bool) -> Duration {
    if !align {
        return window;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let w = window.as_nanos().max(1);
    let left = w - now % w;
    // A first window shorter than a second is not worth a file: fold it into the next.
    let left = if left < 1_000_000_000 { left + w } else { left };
    Duration::from_nanos(u64::try_from(left).unwrap_or(u64::MAX))
}
