//! Operating-system helpers that every stage may use and that import no stage: strict
//! `/proc` parsers and capped reads, file identity, mount tables, confined opens, the
//! capability check and `perf_event_open`.

pub mod file_id;
pub use ember_parse::mountinfo;
pub mod openat2;
pub mod perf_event;
pub mod privileges;
pub mod procfs;
pub(crate) mod signals;
pub mod watch;

/// Makes every thread allocate from one malloc arena. glibc gives each thread that
/// allocates its own arena, and each keeps what its thread freed: on a build host, where
/// the loader and the symbolizer parse large objects now and then, the agent's resident
/// memory measured 78–83 MB with one arena per thread and 40–44 MB with one (the same
/// host, minutes apart). ember's threads allocate at a few hundred calls a second, so one
/// arena's lock is not contended. Call before any thread starts.
pub fn one_malloc_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a tunable of glibc's allocator; no memory is touched.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Least time between two trims of [`trim_heap`], in seconds.
const TRIM_EVERY_S: u64 = 60;

/// Gives free heap memory back to the kernel, at most once a minute. A trim walks the
/// arena and hands back pages that the next windows' allocations fault in again: once a
/// period, with four windows a period, that was a tenth of the output thread's CPU (and
/// asking `mallinfo2` first how much is free costs a walk of its own). Returns whether it
/// trimmed.
pub fn trim_heap() -> bool {
    use std::sync::atomic::AtomicU64;
    use std::sync::OnceLock;
    use std::time::Instant;
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    static LAST: AtomicU64 = AtomicU64::new(0);
    // Seconds on a monotonic clock, starting at TRIM_EVERY_S so that the first call trims.
    let now = EPOCH.get_or_init(Instant::now).elapsed().as_secs() + TRIM_EVERY_S;
    if !due(&LAST, now) {
        return false;
    }
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free heap memory.
    unsafe {
        libc::malloc_trim(0);
    }
    true
}

/// Whether a trim is due at `now` (seconds) after the last at `last`; if so, `now` is
/// the last.
fn due(last: &std::sync::atomic::AtomicU64, now: u64) -> bool {
    use std::sync::atomic::Ordering;
    if now.saturating_sub(last.load(Ordering::Relaxed)) < TRIM_EVERY_S {
        return false;
    }
    last.store(now, Ordering::Relaxed);
    true
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    #[test]
    fn the_heap_is_trimmed_at_most_once_a_minute() {
        let last = AtomicU64::new(0);
        assert!(super::due(&last, 60), "the first call trims");
        assert!(!super::due(&last, 119), "not again within a minute");
        assert!(super::due(&last, 120));
    }
}
