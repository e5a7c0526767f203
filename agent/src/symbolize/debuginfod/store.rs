//! The disk cache of fetched debug files: `DIR/.build-id/ab/cdef….debug`, the layout of a
//! debug directory, so the symbolizer reads it like `/usr/lib/debug`. Files arrive through
//! a temporary file (`DIR/.tmp-…`) renamed into place once checked, so a reader never sees
//! half a file. Its size is kept under a byte budget: the oldest files (by modification
//! time: when they arrived) go first. Names are hex from build ids only.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::process::object::debug_file_path;

/// Files indexed at start (a cache directory filled by someone else is not ours to scan
/// without end).
const MAX_INDEXED: usize = 100_000;

/// The cache directory and what it holds.
pub struct Store {
    dir: PathBuf,
    budget: u64,
    /// (arrival, path) → bytes, oldest first.
    files: BTreeMap<(SystemTime, PathBuf), u64>,
    bytes: u64,
}

impl Store {
    /// Opens (creating) the cache at `dir`, indexes what it holds and removes temporary
    /// files a crash left; trims it to `budget`.
    pub fn open(dir: &Path, budget: u64) -> io::Result<Self> {
        fs::create_dir_all(dir.join(".build-id"))?;
        let mut store = Self {
            dir: dir.to_owned(),
            budget,
            files: BTreeMap::new(),
            bytes: 0,
        };
        for entry in fs::read_dir(dir)?.flatten() {
            if entry.file_name().to_string_lossy().starts_with(".tmp-") {
                let _ = fs::remove_file(entry.path());
            }
        }
        'outer: for sub in fs::read_dir(dir.join(".build-id"))?.flatten() {
            let Ok(files) = fs::read_dir(sub.path()) else {
                continue;
            };
            for f in files.flatten() {
                if store.files.len() >= MAX_INDEXED {
                    break 'outer;
                }
                // DirEntry::metadata does not follow symlinks: only our regular files count.
                let Ok(meta) = f.metadata() else { continue };
                if meta.is_file() {
                    let when = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    store.files.insert((when, f.path()), meta.len());
                    store.bytes += meta.len();
                }
            }
        }
        store.trim(0);
        Ok(store)
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// A new temporary file for the answer about `hex`, and its path.
    pub fn temp(&self, hex: &str) -> io::Result<(File, PathBuf)> {
        let path = self.dir.join(format!(".tmp-{hex}"));
        let _ = fs::remove_file(&path);
        let file = OpenOptions::new()
            .write(true)
            .read(true)
            .create_new(true)
            .mode(0o640)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&path)?;
        Ok((file, path))
    }

    /// Moves the checked temporary file `temp` of `bytes` into place for `id`, first
    /// letting the oldest files go so it fits; returns how many went. A file larger than
    /// the whole budget is refused (`Err`, the temporary file removed).
    pub fn keep(&mut self, temp: &Path, id: &[u8], bytes: u64) -> Result<u64, io::Error> {
        let Some(path) = debug_file_path(&self.dir, id) else {
            let _ = fs::remove_file(temp);
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "empty build id",
            ));
        };
        if bytes > self.budget {
            let _ = fs::remove_file(temp);
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                "over the cache budget",
            ));
        }
        let evicted = self.trim(bytes);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        if let Err(e) = fs::rename(temp, &path) {
            let _ = fs::remove_file(temp);
            return Err(e);
        }
        self.files.retain(|(_, p), _| *p != path);
        self.bytes = self.files.values().sum();
        self.files.insert((SystemTime::now(), path), bytes);
        self.bytes += bytes;
        Ok(evicted)
    }

    /// Removes the oldest files until `room` more bytes fit the budget; how many went.
    fn trim(&mut self, room: u64) -> u64 {
        let mut evicted = 0;
        while self.bytes.saturating_add(room) > self.budget {
            let Some(((_, path), bytes)) = self.files.pop_first() else {
                break;
            };
            let _ = fs::remove_file(&path);
            self.bytes = self.bytes.saturating_sub(bytes);
            evicted += 1;
        }
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn put(store: &mut Store, id: &[u8], bytes: usize) -> u64 {
        let (mut f, temp) = store.temp(&super::super::hex(id)).expect("temp");
        f.write_all(&vec![7u8; bytes]).expect("write");
        store.keep(&temp, id, bytes as u64).expect("keep")
    }

    #[test]
    fn keeps_files_in_the_build_id_layout_under_its_budget() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = Store::open(dir.path(), 10_000).expect("open");
        assert_eq!(put(&mut store, &[0xab, 1, 2], 4000), 0);
        assert!(dir.path().join(".build-id/ab/0102.debug").is_file());
        std::thread::sleep(std::time::Duration::from_millis(10));
        assert_eq!(put(&mut store, &[0xcd, 3], 4000), 0);
        // A third does not fit: the oldest goes.
        assert_eq!(put(&mut store, &[0xef, 4], 4000), 1);
        assert!(!dir.path().join(".build-id/ab/0102.debug").exists());
        assert_eq!(store.bytes(), 8000);
        // Larger than the budget: refused, nothing left behind.
        let (mut f, temp) = store.temp("ff05").expect("temp");
        f.write_all(&[0; 16]).expect("write");
        assert!(store.keep(&temp, &[0xff, 5], 20_000).is_err());
        assert!(!temp.exists());
        // Reopened: the index is rebuilt, a crash's temporary file removed.
        let (_f, stale) = store.temp("0000").expect("temp");
        let store = Store::open(dir.path(), 10_000).expect("reopen");
        assert_eq!(store.bytes(), 8000);
        assert!(!stale.exists());
    }
}
