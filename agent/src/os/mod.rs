//! Operating-system helpers that every stage may use and that import no stage: strict
//! `/proc` parsers and capped reads, file identity, mount tables, confined opens, and the
//! capability check.

pub mod file_id;
pub use ember_parse::mountinfo;
pub mod openat2;
pub mod privileges;
pub mod procfs;

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
