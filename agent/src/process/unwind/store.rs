//! The on-disk cache of compiled tables, so a restarted agent loads what it already
//! compiled: one file per table, named by the object's content key, written whole and
//! renamed into place, and checked (length, checksum, [`UnwindTable::validate`]) before
//! a table read back is trusted. The directory is the agent's own; its size is capped
//! and the oldest files go first. A file holds what one revision of the compiler made of
//! the object ([`REVISION`]): an agent with another revision neither reads nor keeps it.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use ring::digest::{digest, SHA256};

use super::compile::{Stats, UnwindTable};
use super::row::{UnwindPage, UnwindRow};

pub use ember_parse::unwind::TableKey;

/// The table compiler's revision, in every file's name and header: bumped whenever the rows
/// it writes for the same object change (3: `.debug_frame` signal trampolines known by
/// their code, from the byte before them; 4: 4 KiB pages), so an upgraded agent does not
/// reuse tables an older one got wrong.
const REVISION: u8 = 4;
const MAGIC: &[u8; 8] = &[b'E', b'M', b'B', b'E', b'R', b'U', b'T', b'0' + REVISION];
/// Bytes of cache files kept at most; the least recently written go first. Small enough
/// to share a pod's 64 MiB emptyDir with 32 MiB of windows (deploy/ember.yaml).
const MAX_DIR_BYTES: u64 = 24 << 20;
/// A cache file larger than this is not read (a table of 8 M rows).
const MAX_FILE_BYTES: u64 = 80 << 20;

/// The key of an object's bytes.
pub fn key_of(bytes: &[u8]) -> TableKey {
    let d = digest(&SHA256, bytes);
    let mut k = [0u8; 16];
    k.copy_from_slice(&d.as_ref()[..16]);
    k
}

/// Why a cache file was not used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No file for this key (not an error: compile it).
    #[error("not cached")]
    Missing,
    /// The file is there but failed a check; it has been removed.
    #[error("corrupt cache file: {0}")]
    Corrupt(&'static str),
    /// The directory or file could not be read or written.
    #[error("unwind cache: {0}")]
    Io(#[from] std::io::Error),
}

/// A directory of compiled tables.
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// Opens (creating, mode 0700) the cache directory, and removes the tables another
    /// revision of the compiler wrote there.
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        fs::create_dir_all(dir)?;
        fs::set_permissions(
            dir,
            <fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o700),
        )?;
        let ours = format!(".r{REVISION}.unw");
        for entry in fs::read_dir(dir)?.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".unw") && !name.ends_with(&ours) {
                let _ = fs::remove_file(entry.path());
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    fn path(&self, key: &TableKey) -> PathBuf {
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join(format!("{hex}.r{REVISION}.unw"))
    }

    /// The table cached under `key`, checked.
    pub fn load(&self, key: &TableKey) -> Result<UnwindTable, StoreError> {
        let path = self.path(key);
        let file = match fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(StoreError::Missing),
            Err(e) => return Err(e.into()),
        };
        let mut bytes = Vec::new();
        file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
        match decode(key, &bytes) {
            Ok(t) => Ok(t),
            Err(why) => {
                let _ = fs::remove_file(&path);
                Err(StoreError::Corrupt(why))
            }
        }
    }

    /// Writes `table` under `key` (atomically), then trims the directory to its cap.
    pub fn save(&self, key: &TableKey, table: &UnwindTable) -> Result<(), StoreError> {
        let path = self.path(key);
        let tmp = path.with_extension("tmp");
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&encode(key, table))?;
        f.sync_data()?;
        fs::rename(&tmp, &path)?;
        self.trim();
        Ok(())
    }

    fn trim(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "unw"))
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        for (_, len, path) in files {
            if total <= MAX_DIR_BYTES {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

/// `MAGIC, key[16], first_page u64, n_segments u32, n_pages u32, n_rows u32, pad u32,
/// segments (3 × u64 each), pages (2 × u32), rows (8 bytes), SHA-256[16] of all before`.
fn encode(key: &TableKey, t: &UnwindTable) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(64 + t.segments.len() * 24 + (t.pages.len() + t.rows.len()) * 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(key);
    out.extend_from_slice(&t.first_page.to_le_bytes());
    for n in [t.segments.len(), t.pages.len(), t.rows.len(), 0] {
        out.extend_from_slice(&(n as u32).to_le_bytes());
    }
    for &(a, o, n) in &t.segments {
        for v in [a, o, n] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    for p in &t.pages {
        out.extend_from_slice(&p.first_row.to_le_bytes());
        out.extend_from_slice(&p.row_count.to_le_bytes());
    }
    for r in &t.rows {
        out.extend_from_slice(&row_bytes(r));
    }
    let sum = key_of(&out);
    out.extend_from_slice(&sum);
    out
}

/// A row as the sampler reads it (`struct ember_unwind_row`, little-endian).
pub fn row_bytes(r: &UnwindRow) -> [u8; 8] {
    let [a, b] = r.pc_low.to_le_bytes();
    let [c, d] = r.cfa_offset.to_le_bytes();
    let [e, f] = r.rbp_offset.to_le_bytes();
    [a, b, r.cfa_rule, r.rbp_rule, c, d, e, f]
}

fn decode(key: &TableKey, bytes: &[u8]) -> Result<UnwindTable, &'static str> {
    let body_len = bytes.len().checked_sub(16).ok_or("short")?;
    let (body, sum) = bytes.split_at(body_len);
    if key_of(body) != sum {
        return Err("checksum");
    }
    let mut r = Cursor { b: body };
    if r.take(8)? != MAGIC || r.take(16)? != key {
        return Err("header");
    }
    let first_page = r.u64()?;
    let (ns, np, nr, _) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
    // Lengths are checked against the bytes before anything is allocated.
    let need = ns as usize * 24 + (np as usize + nr as usize) * 8;
    if r.b.len() != need {
        return Err("length");
    }
    let segments = (0..ns)
        .map(|_| Ok((r.u64()?, r.u64()?, r.u64()?)))
        .collect::<Result<Vec<_>, &'static str>>()?;
    let pages = (0..np)
        .map(|_| {
            Ok(UnwindPage {
                first_row: r.u32()?,
                row_count: r.u32()?,
            })
        })
        .collect::<Result<Vec<_>, &'static str>>()?;
    let rows = (0..nr)
        .map(|_| {
            let b = r.take(8)?;
            Ok(UnwindRow {
                pc_low: u16::from_le_bytes([b[0], b[1]]),
                cfa_rule: b[2],
                rbp_rule: b[3],
                cfa_offset: u16::from_le_bytes([b[4], b[5]]),
                rbp_offset: i16::from_le_bytes([b[6], b[7]]),
            })
        })
        .collect::<Result<Vec<_>, &'static str>>()?;
    let table = UnwindTable {
        first_page,
        pages,
        rows,
        segments,
        stats: Stats::default(),
    };
    table.validate()?;
    Ok(table)
}

struct Cursor<'a> {
    b: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if self.b.len() < n {
            return Err("short");
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }
    fn u32(&mut self) -> Result<u32, &'static str> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, &'static str> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::unwind::{compile, DEFAULT_LIMITS};

    fn libc_table() -> (TableKey, UnwindTable) {
        let bytes = fs::read("/proc/self/exe").expect("own binary");
        let t = compile(&bytes, &DEFAULT_LIMITS).expect("compiles");
        (key_of(&bytes), t)
    }

    #[test]
    fn round_trips_and_refuses_damage() {
        let dir = std::env::temp_dir().join(format!("ember-unw-{}", std::process::id()));
        let store = Store::open(&dir).expect("dir");
        let (key, table) = libc_table();
        assert!(matches!(store.load(&key), Err(StoreError::Missing)));
        store.save(&key, &table).expect("save");
        let back = store.load(&key).expect("load");
        assert_eq!(back.rows, table.rows);
        assert_eq!(back.pages, table.pages);
        assert_eq!(back.segments, table.segments);
        assert_eq!(back.first_page, table.first_page);
        // One flipped bit: refused and removed, so the table is compiled again.
        let path = store.path(&key);
        let mut bytes = fs::read(&path).expect("file");
        let mid = bytes.len() / 2;
        bytes[mid] ^= 1;
        fs::write(&path, &bytes).expect("write");
        assert!(matches!(store.load(&key), Err(StoreError::Corrupt(_))));
        assert!(!path.exists());
        // A file for another key is not taken for this one.
        store.save(&key, &table).expect("save");
        let other = [7u8; 16];
        fs::copy(&path, store.path(&other)).expect("copy");
        assert!(matches!(store.load(&other), Err(StoreError::Corrupt(_))));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn another_revisions_tables_are_not_reused() {
        let dir = std::env::temp_dir().join(format!("ember-unw-rev-{}", std::process::id()));
        let store = Store::open(&dir).expect("dir");
        let (key, table) = libc_table();
        store.save(&key, &table).expect("save");
        let ours = store.path(&key);
        // What revision 1 named its file; and a file of a later revision.
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        let old = dir.join(format!("{hex}.unw"));
        let later = dir.join(format!("{hex}.r{}.unw", REVISION + 1));
        fs::copy(&ours, &old).expect("copy");
        fs::copy(&ours, &later).expect("copy");
        let store = Store::open(&dir).expect("reopen");
        assert!(
            !old.exists() && !later.exists(),
            "other revisions' files kept"
        );
        assert!(store.load(&key).is_ok(), "our own file lost");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn decode_never_panics_on_truncations() {
        let (key, table) = libc_table();
        let bytes = encode(&key, &table);
        for cut in [
            0,
            1,
            8,
            23,
            24,
            40,
            47,
            48,
            bytes.len() / 3,
            bytes.len() - 1,
        ] {
            assert!(decode(&key, &bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
