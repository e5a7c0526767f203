//! Object files (executables and libraries) that sampled processes map, held open so that
//! they stay readable after the process or its container is gone; shared by
//! `(device, inode)` across processes.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Identity of a mapped file: device and inode, as `/proc/PID/maps` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Device (major, minor).
    pub dev: (u32, u32),
    /// Inode number.
    pub inode: u64,
}

/// An executable or library held open for symbolization.
#[derive(Debug)]
pub struct Object {
    /// Identity.
    pub key: ObjectKey,
    /// Path as the process saw it (inside its mount namespace).
    pub path: String,
    /// GNU build id, when the file has one.
    pub build_id: Option<Vec<u8>>,
    file: File,
}

impl Object {
    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// A path that opens this very file for as long as the object lives.
    pub fn open_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }

    /// The file name shown for unnamed frames (`libc.so.6`).
    pub fn base_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }

    /// An object for the open `file`, known to the process as `path`; reads its build id.
    pub fn new(key: ObjectKey, path: String, file: File) -> Self {
        let mut obj = Object {
            key,
            path,
            build_id: None,
            file,
        };
        obj.build_id = read_build_id(&obj.open_path());
        obj
    }

    /// Opens `path` as an object (used by tests and benchmarks on local files).
    pub fn open_local(path: &Path) -> std::io::Result<Self> {
        let file = File::open(path)?;
        let inode = std::os::unix::fs::MetadataExt::ino(&file.metadata()?);
        let key = ObjectKey { dev: (0, 0), inode };
        Ok(Self::new(key, path.display().to_string(), file))
    }
}

fn read_build_id(path: &Path) -> Option<Vec<u8>> {
    blazesym::helper::read_elf_build_id(path)
        .ok()
        .flatten()
        .map(|b| b.into_owned())
}
