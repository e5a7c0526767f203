//! A directory of window files, one gzip'ed pprof profile per closed window,
//! with retention by count and by total size.
//!
//! Files are named by the UTC start of their window,
//! `20261122T031500.123Z.pb.gz`, so names sort by time; a second window with
//! the same start gets `-1`, `-2`, … before `.pb.gz`. Off-CPU windows
//! (`offcpu.enabled`) are `20261122T031500.123Z.offcpu.pb.gz` beside them, and
//! count in the same retention caps. Only names of exactly that shape are
//! listed, served or removed: anything else in the directory belongs to
//! someone else and is left alone.
//!
//! Faults on the directory are survived: a directory removed under us is created again
//! on the next write; a full or read-only file system fails the write (the caller counts
//! it) and shows in [`WindowDir::health`] until a write succeeds again. The wall clock
//! may step back: retention then never removes the window just written, and windows
//! named after it (written before the step) are pruned first.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::model::ProfileKind;
use time::macros::format_description;
use time::OffsetDateTime;

/// File name suffix of every window file.
const SUFFIX: &str = ".pb.gz";
/// What off-CPU window names carry before [`SUFFIX`].
const OFFCPU_TAG: &str = ".offcpu";
/// Length of the timestamp part, `20261122T031500.123Z`.
const STAMP_LEN: usize = 20;
/// Writes between two listings of the directory: retention works from what the agent
/// wrote in between, so files added or removed by hand are seen within this many writes.
const RESCAN_EVERY: u32 = 64;
/// Most `-N` suffixes tried for windows that start in the same millisecond.
const MAX_COLLISIONS: u32 = 999;
/// Largest window file [`WindowDir::read`] returns; windows are far smaller,
/// this only stops a replaced file from making us read without bound.
const MAX_READ_BYTES: u64 = 512 * 1024 * 1024;

/// Errors from the window directory.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// The directory could not be created.
    #[error("cannot create window directory {dir}: {source}")]
    CreateDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The window start cannot be written as a file name (before 1970 or
    /// past year 9999).
    #[error("window start time is out of range for a file name")]
    Time,
    /// Writing a window file failed.
    #[error("cannot write window file {path}: {source}")]
    Write {
        /// The file being written.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Too many windows with the same start time.
    #[error("too many windows named {0}")]
    Collisions(String),
    /// The name is not one this module produces.
    #[error("not a window file name: {0:?}")]
    InvalidName(String),
    /// No such window (it may have been removed by retention).
    #[error("no window file named {0}")]
    NotFound(String),
    /// Reading a window file failed.
    #[error("cannot read window file {name}: {source}")]
    Read {
        /// The window file.
        name: String,
        /// Why.
        source: io::Error,
    },
    /// The file is not a regular file or is larger than windows can be.
    #[error("window file {0} is not a regular file of a sane size")]
    NotAWindow(String),
}

/// One window file, as listed by [`WindowDir::list`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowFile {
    /// File name inside the directory, e.g. `20261122T031500.123Z.pb.gz`.
    pub name: String,
    /// Size on disk in bytes.
    pub bytes: u64,
    /// What the window measures (from its name).
    pub kind: ProfileKind,
}

/// The window directory: writes windows atomically, enforces retention and
/// serves them back by name. Share it with `Arc`; writes are serialized
/// internally.
#[derive(Debug)]
pub struct WindowDir {
    dir: PathBuf,
    keep_windows: usize,
    keep_bytes: u64,
    /// Held while writing and pruning so two writers cannot pick the same
    /// name or prune each other's counts; holds the window files retention counts.
    write_lock: Mutex<Index>,
    /// The last write's failure and when it began, until a write succeeds.
    failing: Mutex<Option<(WriteFailure, Instant)>>,
    /// Times the directory was found missing and created again.
    recreated: AtomicU64,
}

/// The window files retention counts, as the agent last listed and wrote them.
#[derive(Debug, Default)]
struct Index {
    /// Oldest first by name; `None`: list the directory at the next write.
    files: Option<Vec<WindowFile>>,
    /// Writes since the directory was last listed.
    writes: u32,
}

/// Why writing a window failed, as far as an operator can act on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteFailure {
    /// No space (or quota) left on the file system.
    NoSpace,
    /// The file system is read-only.
    ReadOnly,
    /// Anything else (permissions, I/O errors, ...).
    Other,
}

impl WriteFailure {
    /// The failure an I/O error means.
    pub fn of(e: &io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => WriteFailure::NoSpace,
            Some(libc::EROFS) => WriteFailure::ReadOnly,
            _ => WriteFailure::Other,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            WriteFailure::NoSpace => "no space left",
            WriteFailure::ReadOnly => "read-only file system",
            WriteFailure::Other => "write error",
        }
    }
}

/// The window directory cannot be written (readiness fails with this).
#[derive(Debug, thiserror::Error)]
#[error("cannot write windows to {}: {failure} (for {for_s} s)", .dir.display())]
pub struct DirFailing {
    dir: PathBuf,
    failure: &'static str,
    for_s: u64,
}

impl FilesError {
    /// What kind of write failure this is, when it is one.
    pub fn write_failure(&self) -> Option<WriteFailure> {
        match self {
            FilesError::Write { source, .. } | FilesError::CreateDir { source, .. } => {
                Some(WriteFailure::of(source))
            }
            _ => None,
        }
    }
}

impl WindowDir {
    /// Opens (creating it with mode 0750 if needed) a window directory
    /// that keeps at most `keep_windows` files and `keep_bytes` bytes of
    /// windows. The newest window is always kept, even if it alone is over
    /// either cap. Temp files left by an earlier crash are removed.
    pub fn open(dir: &Path, keep_windows: usize, keep_bytes: u64) -> Result<Self, FilesError> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)
            .map_err(|source| FilesError::CreateDir {
                dir: dir.to_path_buf(),
                source,
            })?;
        let windows = Self {
            dir: dir.to_path_buf(),
            keep_windows,
            keep_bytes,
            write_lock: Mutex::new(Index::default()),
            failing: Mutex::new(None),
            recreated: AtomicU64::new(0),
        };
        windows.remove_stale_temps();
        Ok(windows)
    }

    /// Writes the gzip'ed profile of the window that started at `start`
    /// and returns its path, then removes the oldest windows beyond the
    /// caps (logged). The file appears under its final name only once
    /// complete, so readers never see half a window.
    #[cfg(test)]
    pub fn write(&self, start: SystemTime, gz: &[u8]) -> Result<PathBuf, FilesError> {
        self.write_kind(start, ProfileKind::Cpu, gz)
    }

    /// [`WindowDir::write`] for a window of `kind` (off-CPU windows are named
    /// `<stamp>.offcpu.pb.gz`).
    pub fn write_kind(
        &self,
        start: SystemTime,
        kind: ProfileKind,
        gz: &[u8],
    ) -> Result<PathBuf, FilesError> {
        let stamp = stamp(start)?;
        let mut index = self.write_lock.lock().unwrap_or_else(|e| e.into_inner());
        let result = self.write_locked(&mut index, &stamp, kind, gz);
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        match (
            &result,
            result.as_ref().err().and_then(FilesError::write_failure),
        ) {
            (Ok(_), _) => *failing = None,
            (Err(_), Some(f)) => {
                if failing.is_none_or(|(was, _)| was != f) {
                    *failing = Some((f, Instant::now()));
                }
            }
            (Err(_), None) => {}
        }
        result
    }

    fn write_locked(
        &self,
        index: &mut Index,
        stamp: &str,
        kind: ProfileKind,
        gz: &[u8],
    ) -> Result<PathBuf, FilesError> {
        // Written under a hidden name, then renamed to the first free window name: the
        // rename (which never replaces) is the check that the name is free, so a write
        // costs no stat of the directory or of the name.
        let first = window_name(stamp, 0, kind);
        let temp = self.dir.join(temp_name(&first));
        let write_err = |source| {
            // Best effort: the temp file is ours, and must not keep a full disk full.
            let _ = fs::remove_file(&temp);
            FilesError::Write {
                path: self.dir.join(&first),
                source,
            }
        };
        match write_file(&temp, gz) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Removed under us (by hand, a node cleanup, a remounted volume): create
                // it again, as `open` would.
                DirBuilder::new()
                    .recursive(true)
                    .mode(0o750)
                    .create(&self.dir)
                    .map_err(|source| FilesError::CreateDir {
                        dir: self.dir.clone(),
                        source,
                    })?;
                self.recreated.fetch_add(1, Ordering::Relaxed);
                index.files = None;
                tracing::warn!(dir = %self.dir.display(), "the window directory was gone; created it again");
                write_file(&temp, gz).map_err(write_err)?;
            }
            written => written.map_err(write_err)?,
        }
        let name = match self.place(&temp, stamp, kind) {
            Ok(name) => name,
            Err(e) => {
                // Best effort: the temp file is ours and useless now.
                let _ = fs::remove_file(&temp);
                return Err(e);
            }
        };
        let path = self.dir.join(&name);
        let removed = self.prune(index, &name, gz.len() as u64, kind);
        if !removed.is_empty() {
            tracing::debug!(count = removed.len(), oldest = %removed[0], "removed old windows");
        }
        Ok(path)
    }

    /// `Ok` unless the last write failed; then what failed and for how long.
    pub fn health(&self) -> Result<(), DirFailing> {
        match *self.failing.lock().unwrap_or_else(|e| e.into_inner()) {
            None => Ok(()),
            Some((failure, since)) => Err(DirFailing {
                dir: self.dir.clone(),
                failure: failure.describe(),
                for_s: since.elapsed().as_secs(),
            }),
        }
    }

    /// How many times the directory was found missing and created again.
    pub fn recreated(&self) -> u64 {
        self.recreated.load(Ordering::Relaxed)
    }

    /// The window files, newest first.
    pub fn list(&self) -> Vec<WindowFile> {
        let mut files = self.scan(Vec::new());
        files.reverse();
        files
    }

    /// The bytes of the window file `name`. Only names this module
    /// produces are accepted (no paths), and symlinks are not followed.
    pub fn read(&self, name: &str) -> Result<Vec<u8>, FilesError> {
        if !is_window_name(name) {
            return Err(FilesError::InvalidName(name.to_string()));
        }
        let read_err = |source: io::Error| {
            if source.kind() == io::ErrorKind::NotFound {
                FilesError::NotFound(name.to_string())
            } else {
                FilesError::Read {
                    name: name.to_string(),
                    source,
                }
            }
        };
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(self.dir.join(name))
            .map_err(read_err)?;
        let meta = file.metadata().map_err(read_err)?;
        if !meta.is_file() || meta.len() > MAX_READ_BYTES {
            return Err(FilesError::NotAWindow(name.to_string()));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
        // The cap also holds if the file grows after the check.
        file.take(MAX_READ_BYTES)
            .read_to_end(&mut bytes)
            .map_err(read_err)?;
        Ok(bytes)
    }

    /// Renames `temp` to the first of `<stamp>.pb.gz`, `<stamp>-1.pb.gz`, … not yet taken,
    /// and returns that name. Called with the write lock held.
    fn place(&self, temp: &Path, stamp: &str, kind: ProfileKind) -> Result<String, FilesError> {
        for n in 0..=MAX_COLLISIONS {
            let name = window_name(stamp, n, kind);
            let path = self.dir.join(&name);
            match rename_noreplace(temp, &path) {
                Ok(()) => return Ok(name),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(source) => return Err(FilesError::Write { path, source }),
            }
        }
        Err(FilesError::Collisions(format!("{stamp}{SUFFIX}")))
    }

    /// Removes the oldest windows beyond the caps, never `newest` (the one just
    /// written, `bytes` long). Called with the write lock held, on its `index`: the
    /// directory is listed again only every [`RESCAN_EVERY`] writes (a listing with a stat
    /// of every file took ~1 ms for 360 windows, at each of the period's windows).
    ///
    /// Sorting parses every name (once a sort, `sort_by_cached_key`: parsing at every
    /// comparison was a twelfth of the output thread's CPU with 360 windows), so it is
    /// done only when the newest window does not sort last (a listing, a clock step).
    ///
    /// Oldest means oldest by name, except that after the wall clock stepped back the
    /// windows named after `newest` were written before it: they go first.
    fn prune(&self, index: &mut Index, newest: &str, bytes: u64, kind: ProfileKind) -> Vec<String> {
        let (mut files, in_order) = match index.files.take() {
            Some(mut files) if index.writes < RESCAN_EVERY => {
                index.writes += 1;
                // The index is in name order, and the newest window almost always sorts
                // last: then nothing needs sorting (two names parsed, not every one).
                let in_order = files
                    .last()
                    .is_none_or(|last| sort_key(&last.name) < sort_key(newest));
                files.push(WindowFile {
                    name: newest.to_string(),
                    bytes,
                    kind,
                });
                (files, in_order)
            }
            known => {
                index.writes = 0;
                (self.scan(known.unwrap_or_default()), false)
            }
        };
        if !in_order {
            let newest_key = sort_key(newest);
            files.sort_by_cached_key(|f| {
                let key = sort_key(&f.name);
                (key <= newest_key, key)
            });
        }
        let mut count = files.len();
        let mut bytes: u64 = files.iter().map(|f| f.bytes).sum();
        let mut removed = Vec::new();
        let mut listed_wrong = false;
        for file in &files {
            if count <= self.keep_windows && bytes <= self.keep_bytes {
                break;
            }
            if file.name == newest {
                continue;
            }
            match fs::remove_file(self.dir.join(&file.name)) {
                Ok(()) => removed.push(file.name.clone()),
                // Removed by someone else since the listing: list again next time.
                Err(e) if e.kind() == io::ErrorKind::NotFound => listed_wrong = true,
                Err(e) => {
                    tracing::warn!(file = %file.name, error = %e, "cannot remove old window");
                }
            }
            // Count it as gone either way, so one stuck file does not make
            // us delete every newer window to compensate.
            count -= 1;
            bytes = bytes.saturating_sub(file.bytes);
        }
        if !listed_wrong {
            // Kept in name order for the next write; a stuck file stays, as a listing would show it.
            files.retain(|f| !removed.contains(&f.name));
            if !in_order {
                files.sort_by_cached_key(|f| sort_key(&f.name));
            }
            index.files = Some(files);
        }
        removed
    }

    /// The window files, oldest first. Errors are logged and give what
    /// could be read, because listing is for humans and retention. The sizes of files in
    /// `known` (an earlier listing) are taken from it: a listing stats only new files.
    fn scan(&self, known: Vec<WindowFile>) -> Vec<WindowFile> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot list window directory");
                return Vec::new();
            }
        };
        let known: std::collections::HashMap<String, u64> =
            known.into_iter().map(|f| (f.name, f.bytes)).collect();
        let mut files: Vec<WindowFile> = entries
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let name = entry.file_name().into_string().ok()?;
                let (_, _, kind) = parse_name(&name)?;
                // The directory entry's type: no stat, and symlinks are not followed.
                if !entry.file_type().ok()?.is_file() {
                    return None;
                }
                let bytes = match known.get(&name) {
                    Some(&bytes) => bytes,
                    None => entry.metadata().ok()?.len(),
                };
                Some(WindowFile { name, bytes, kind })
            })
            .collect();
        files.sort_by_cached_key(|f| sort_key(&f.name));
        files
    }

    /// Removes `.<window name>.tmp` files: only a crash mid-write leaves them.
    fn remove_stale_temps(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let is_temp = name
                .strip_prefix('.')
                .and_then(|n| n.strip_suffix(".tmp"))
                .is_some_and(is_window_name);
            if is_temp {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

/// Writes `bytes` to a new file at `path` (mode 0640). Not synced: a sync per window
/// (four a period with off-CPU on) was a fifth of the output thread's CPU, and the
/// kernel's writeback batches what a sync writes one file at a time. A power loss can
/// leave the last windows empty or torn under their final names; readers skip a window
/// that does not decode (logged), and a process crash loses nothing written.
fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file: File = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    file.write_all(bytes)
}

/// The name of the window of `kind` that started at `stamp`, the `n`th of that start.
fn window_name(stamp: &str, n: u32, kind: ProfileKind) -> String {
    let tag = kind_tag(kind);
    if n == 0 {
        format!("{stamp}{tag}{SUFFIX}")
    } else {
        format!("{stamp}-{n}{tag}{SUFFIX}")
    }
}

/// Renames `from` to `to` unless `to` exists (`AlreadyExists` then). Where the file
/// system cannot rename without replacing, a check of `to` comes first (racy against
/// other writers, which the write lock excludes).
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other);
    let (cfrom, cto) = (c(from)?, c(to)?);
    // SAFETY: both are NUL-terminated paths that outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cfrom.as_ptr(),
            libc::AT_FDCWD,
            cto.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL) | Some(libc::ENOSYS) => {
            // symlink_metadata so a dangling symlink also counts as taken.
            if fs::symlink_metadata(to).is_ok() {
                return Err(io::ErrorKind::AlreadyExists.into());
            }
            fs::rename(from, to)
        }
        _ => Err(e),
    }
}

/// The hidden temp name a window is written under before its rename.
fn temp_name(name: &str) -> String {
    format!(".{name}.tmp")
}

/// `start` as `20261122T031500.123Z`.
fn stamp(start: SystemTime) -> Result<String, FilesError> {
    let since_epoch = start
        .duration_since(UNIX_EPOCH)
        .map_err(|_| FilesError::Time)?;
    let nanos = i128::try_from(since_epoch.as_nanos()).map_err(|_| FilesError::Time)?;
    let utc = OffsetDateTime::from_unix_timestamp_nanos(nanos).map_err(|_| FilesError::Time)?;
    let format =
        format_description!("[year][month][day]T[hour][minute][second].[subsecond digits:3]Z");
    let text = utc.format(format).map_err(|_| FilesError::Time)?;
    // Years past 9999 would break the fixed width the name check expects.
    if text.len() == STAMP_LEN {
        Ok(text)
    } else {
        Err(FilesError::Time)
    }
}

/// Splits a window name into its timestamp and collision number, or `None`
/// and kind, or `None` if it is not exactly
/// `YYYYMMDDTHHMMSS.mmmZ[-N][.offcpu|.offwake|.lock].pb.gz`.
fn parse_name(name: &str) -> Option<(&str, u32, ProfileKind)> {
    let rest = name.strip_suffix(SUFFIX)?;
    let (rest, kind) = ProfileKind::ALL[1..]
        .iter()
        .find_map(|&k| Some((rest.strip_suffix(kind_tag(k))?, k)))
        .unwrap_or((rest, ProfileKind::Cpu));
    let (stamp, n) = match rest.split_once('-') {
        Some((stamp, n)) => {
            // 1..=999 without leading zeros, so each number has one name.
            let ok = (1..=3).contains(&n.len())
                && !n.starts_with('0')
                && n.bytes().all(|b| b.is_ascii_digit());
            (stamp, if ok { n.parse().ok()? } else { return None })
        }
        None => (rest, 0),
    };
    let b = stamp.as_bytes();
    let shape_ok = b.len() == STAMP_LEN
        && b.iter().enumerate().all(|(i, c)| match i {
            8 => *c == b'T',
            15 => *c == b'.',
            19 => *c == b'Z',
            _ => c.is_ascii_digit(),
        });
    shape_ok.then_some((stamp, n, kind))
}

/// Whether `name` is a window file name this module could have produced.
/// Such a name has no `/` and no `..`, so it is safe to join to the dir.
pub fn is_window_name(name: &str) -> bool {
    parse_name(name).is_some()
}

/// What the window file `name` measures, or `None` if it is not a window name.
pub fn window_kind(name: &str) -> Option<ProfileKind> {
    parse_name(name).map(|(_, _, kind)| kind)
}

/// Sorts windows by start time, then collision number (plain string order
/// would put `…Z-1.pb.gz` before `…Z.pb.gz`), CPU first, then the off-CPU kinds.
fn sort_key(name: &str) -> (String, u32, usize) {
    parse_name(name).map_or_else(
        || (name.to_string(), 0, 0),
        |(s, n, k)| {
            let rank = ProfileKind::ALL.iter().position(|&x| x == k).unwrap_or(0);
            (s.to_string(), n, rank)
        },
    )
}

/// What a window file's name carries before `.pb.gz` for its kind: `.offcpu`,
/// `.offwake`, `.lock`; nothing for CPU windows.
fn kind_tag(kind: ProfileKind) -> &'static str {
    match kind {
        ProfileKind::Cpu => "",
        ProfileKind::OffCpu => OFFCPU_TAG,
        ProfileKind::OffWake => ".offwake",
        ProfileKind::Lock => ".lock",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};
    use std::sync::Arc;
    use std::time::Duration;

    fn at(ms: u64) -> SystemTime {
        // 2026-11-22T03:15:00Z plus `ms`.
        UNIX_EPOCH + Duration::from_secs(1_795_317_300) + Duration::from_millis(ms)
    }

    fn names(w: &WindowDir) -> Vec<String> {
        w.list().into_iter().map(|f| f.name).collect()
    }

    #[test]
    fn a_removed_directory_is_created_again() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("windows");
        let w = WindowDir::open(&dir, 10, u64::MAX)?;
        w.write(at(0), b"before")?;
        fs::remove_dir_all(&dir)?;
        w.write(at(10_000), b"after")?;
        assert_eq!(names(&w), ["20261122T031510.000Z.pb.gz"]);
        assert_eq!(w.recreated(), 1);
        assert!(w.health().is_ok());
        Ok(())
    }

    #[test]
    fn a_clock_step_back_never_prunes_the_newest_window() -> Result<(), Box<dyn std::error::Error>>
    {
        let tmp = tempfile::tempdir()?;
        let w = WindowDir::open(tmp.path(), 3, u64::MAX)?;
        for i in 0..3 {
            w.write(at(i * 10_000), b"before the step")?;
        }
        // The clock steps back a day: the next windows have the oldest names.
        let back = |ms: u64| at(ms) - Duration::from_secs(86_400);
        let p = w.write(back(30_000), b"after the step")?;
        let first_after = p.file_name().and_then(|n| n.to_str()).map(str::to_owned);
        assert!(
            names(&w).contains(first_after.as_ref().ok_or("name")?),
            "the window just written survived retention: {:?}",
            names(&w)
        );
        for i in 1..=3 {
            let p = w.write(back(30_000 + i * 10_000), b"after the step")?;
            let name = p.file_name().and_then(|n| n.to_str()).ok_or("name")?;
            assert!(names(&w).iter().any(|n| n == name), "{name} kept");
        }
        // Windows from before the step went first; the three newest are all from after it.
        let kept = names(&w);
        assert_eq!(kept.len(), 3, "{kept:?}");
        assert!(kept.iter().all(|n| n.starts_with("20261121T")), "{kept:?}");
        Ok(())
    }

    /// Retention counts from what it wrote, not from a listing at every write: the
    /// directory is listed once, then every RESCAN_EVERY writes or when a window it meant
    /// to remove was already gone, so files removed or added by hand are seen.
    #[test]
    fn retention_sees_files_changed_by_hand() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let w = WindowDir::open(tmp.path(), 3, u64::MAX)?;
        for i in 0..3 {
            w.write(at(i * 10_000), b"w")?;
        }
        // Not listed at the next write: a window someone else put there stays unseen...
        fs::write(tmp.path().join("20261122T031459.000Z.pb.gz"), b"by hand")?;
        w.write(at(30_000), b"w")?;
        assert_eq!(names(&w).len(), 4, "{:?}", names(&w));
        // ...until the oldest the agent knows is already gone, which lists again.
        fs::remove_file(tmp.path().join("20261122T031510.000Z.pb.gz"))?;
        w.write(at(40_000), b"w")?;
        w.write(at(50_000), b"w")?;
        assert_eq!(
            names(&w),
            [
                "20261122T031550.000Z.pb.gz",
                "20261122T031540.000Z.pb.gz",
                "20261122T031530.000Z.pb.gz"
            ]
        );
        // Every RESCAN_EVERY writes the directory is listed anyway.
        fs::write(tmp.path().join("20261122T031459.000Z.pb.gz"), b"by hand")?;
        for i in 0..u64::from(RESCAN_EVERY) + 1 {
            w.write(at(60_000 + i * 10_000), b"w")?;
        }
        assert_eq!(names(&w).len(), 3, "{:?}", names(&w));
        Ok(())
    }

    /// Mounts a tmpfs of `size` at `dir` (root only).
    fn tmpfs(dir: &Path, size: &str) -> bool {
        std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success())
    }

    fn remount(dir: &Path, opts: &str) -> bool {
        std::process::Command::new("mount")
            .args(["-o", &format!("remount,{opts}")])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success())
    }

    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }

    #[test]
    fn full_and_read_only_file_systems_fail_writes_and_show_in_health(
    ) -> Result<(), Box<dyn std::error::Error>> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var("EMBER_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
                "needs root (mount) and EMBER_REQUIRE_PRIVILEGED=1 forbids skipping"
            );
            eprintln!("skipped: needs root to mount a small tmpfs");
            return Ok(());
        }
        let tmp = tempfile::tempdir()?;
        let mnt = tmp.path().join("mnt");
        fs::create_dir(&mnt)?;
        assert!(tmpfs(&mnt, "64k"), "mount tmpfs");
        let _unmount = Unmount(mnt.clone());
        let w = WindowDir::open(&mnt, 100, u64::MAX)?;
        let big = vec![7u8; 40 << 10];
        w.write(at(0), &big)?;
        let err = w.write(at(10_000), &big).expect_err("full");
        assert_eq!(err.write_failure(), Some(WriteFailure::NoSpace), "{err}");
        let health = w.health().expect_err("unhealthy while full");
        assert!(health.to_string().contains("no space left"), "{health}");
        // No temp file is left behind to keep the disk full.
        assert_eq!(fs::read_dir(&mnt)?.count(), 1);

        assert!(remount(&mnt, "ro"), "remount ro");
        let err = w.write(at(20_000), b"small").expect_err("read-only");
        assert_eq!(err.write_failure(), Some(WriteFailure::ReadOnly), "{err}");
        assert!(w
            .health()
            .expect_err("ro")
            .to_string()
            .contains("read-only"));

        // Writable again: windows resume and health clears.
        assert!(remount(&mnt, "rw"), "remount rw");
        w.write(at(30_000), b"small")?;
        assert!(w.health().is_ok());
        assert_eq!(names(&w).len(), 2);
        Ok(())
    }

    #[test]
    fn shareable() {
        fn check<T: Send + Sync>() {}
        check::<Arc<WindowDir>>();
    }

    #[test]
    fn names_are_utc_stamps_with_collision_suffixes() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("windows");
        let w = WindowDir::open(&dir, 100, u64::MAX)?;
        let mode = fs::metadata(&dir).map(|m| m.permissions().mode() & 0o777);
        assert_eq!(mode.ok(), Some(0o750));

        let p = w.write(at(123), b"one")?;
        assert_eq!(p, dir.join("20261122T031500.123Z.pb.gz"));
        w.write(at(123), b"two")?;
        w.write(at(123), b"three")?;
        w.write(at(1_000), b"four")?;
        assert_eq!(
            names(&w),
            vec![
                "20261122T031501.000Z.pb.gz",
                "20261122T031500.123Z-2.pb.gz",
                "20261122T031500.123Z-1.pb.gz",
                "20261122T031500.123Z.pb.gz",
            ]
        );
        assert_eq!(w.read("20261122T031500.123Z-1.pb.gz")?, b"two");
        assert_eq!(w.list()[0].bytes, 4);
        assert!(matches!(
            w.write(UNIX_EPOCH - Duration::from_secs(1), b""),
            Err(FilesError::Time)
        ));
        Ok(())
    }

    #[test]
    fn offcpu_windows_sit_beside_cpu_windows() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let w = WindowDir::open(tmp.path(), 10, u64::MAX)?;
        w.write_kind(at(123), ProfileKind::Cpu, b"cpu")?;
        let p = w.write_kind(at(123), ProfileKind::OffCpu, b"off")?;
        assert!(p.ends_with("20261122T031500.123Z.offcpu.pb.gz"));
        w.write_kind(at(123), ProfileKind::OffCpu, b"off2")?;
        let listed: Vec<_> = w.list().into_iter().map(|f| (f.name, f.kind)).collect();
        assert_eq!(
            listed,
            vec![
                (
                    "20261122T031500.123Z-1.offcpu.pb.gz".to_string(),
                    ProfileKind::OffCpu
                ),
                (
                    "20261122T031500.123Z.offcpu.pb.gz".to_string(),
                    ProfileKind::OffCpu
                ),
                ("20261122T031500.123Z.pb.gz".to_string(), ProfileKind::Cpu),
            ]
        );
        assert_eq!(w.read("20261122T031500.123Z.offcpu.pb.gz")?, b"off");
        assert!(!is_window_name("20261122T031500.123Z.offcpu-1.pb.gz"));
        assert!(!is_window_name("20261122T031500.123Z.other.pb.gz"));
        Ok(())
    }

    #[test]
    fn retention_by_count() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let w = WindowDir::open(tmp.path(), 3, u64::MAX)?;
        for i in 0..5 {
            w.write(at(i * 1000), b"x")?;
        }
        assert_eq!(
            names(&w),
            vec![
                "20261122T031504.000Z.pb.gz",
                "20261122T031503.000Z.pb.gz",
                "20261122T031502.000Z.pb.gz",
            ]
        );
        Ok(())
    }

    #[test]
    fn retention_by_bytes_keeps_newest() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let w = WindowDir::open(tmp.path(), 100, 25)?;
        for i in 0..4 {
            w.write(at(i * 1000), &[0u8; 10])?;
        }
        // 4 × 10 bytes > 25: the two oldest go.
        assert_eq!(
            names(&w),
            vec!["20261122T031503.000Z.pb.gz", "20261122T031502.000Z.pb.gz"]
        );
        // A single window over the cap is still kept.
        w.write(at(9_000), &[0u8; 100])?;
        assert_eq!(names(&w), vec!["20261122T031509.000Z.pb.gz"]);
        Ok(())
    }

    #[test]
    fn other_files_are_untouched() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let foreign = [
            "notes.txt",
            "20261122T031500.123Z.pb",
            "20261122T031500.123Z-01.pb.gz",
            "x20261122T031500.123Z.pb.gz",
            ".20261122T031500.000Z.pb.gz.tmp.keep",
        ];
        for f in foreign {
            fs::write(tmp.path().join(f), vec![0u8; 1000])?;
        }
        // Stale temp file from a crash: ours, removed on open.
        let stale = tmp.path().join(".20261122T031500.000Z.pb.gz.tmp");
        fs::write(&stale, b"half")?;
        let w = WindowDir::open(tmp.path(), 1, 1)?;
        assert!(!stale.exists());
        w.write(at(0), b"a")?;
        w.write(at(1000), b"b")?;
        assert_eq!(names(&w), vec!["20261122T031501.000Z.pb.gz"]);
        for f in foreign {
            assert!(tmp.path().join(f).exists(), "{f} was removed");
        }
        Ok(())
    }

    #[test]
    fn read_rejects_traversal_and_symlinks() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let secret = tmp.path().join("secret");
        fs::write(&secret, b"secret")?;
        let w = WindowDir::open(&tmp.path().join("w"), 10, u64::MAX)?;
        for bad in [
            "../secret",
            "/etc/passwd",
            "..",
            "",
            "a/20261122T031500.123Z.pb.gz",
            "20261122T031500.123Z.pb.gz/..",
            "20261122T031500.123Z-0.pb.gz",
        ] {
            assert!(
                matches!(w.read(bad), Err(FilesError::InvalidName(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            w.read("20261122T031500.123Z.pb.gz"),
            Err(FilesError::NotFound(_))
        ));
        // A symlink with a window name is neither listed nor followed.
        symlink(&secret, w.dir.join("20261122T031500.999Z.pb.gz"))?;
        assert!(w.list().is_empty());
        assert!(w.read("20261122T031500.999Z.pb.gz").is_err());
        Ok(())
    }
}
