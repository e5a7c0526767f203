//! The sampler's unwind maps, and the one place that writes them.
//!
//! The unwind loader ([`crate::process::unwind`]) decides what the sampler holds (which
//! tables, in which slots, which processes' ranges); this file turns those decisions into
//! map updates, behind [`UnwindIo`] so the decisions are tested against an in-memory fake.
//! Values are the skeleton's types, generated from `agent/bpf/ember.h` ([`ember_unwind_proc`],
//! [`ember_unwind_file`], ...): no offset is written by hand, and [`super::abi`] fails the
//! build the moment the header and the constants below disagree.
//!
//! A table is one array map created at its exact size with `BPF_F_MMAPABLE` and filled
//! through mmap: one syscall per table, never one per row. Tables filled are put into
//! `unwind_tables` in one batch ([`UnwindIo::commit_tables`]), since every update of a map
//! of maps waits for an RCU grace period (~10 ms here).

use std::mem::{offset_of, size_of};
use std::os::fd::{AsFd, AsRawFd};

use libbpf_rs::{libbpf_sys, MapCore, MapFlags, MapHandle, MapType};
use tracing::warn;

pub use super::skel::types::{
    ember_cfa_rule, ember_proc_flag, ember_rbp_rule, ember_unwind_chunk, ember_unwind_file,
    ember_unwind_file_key, ember_unwind_header, ember_unwind_page, ember_unwind_page_shift,
    ember_unwind_proc, ember_unwind_range, ember_unwind_row, ember_unwind_segment,
};
pub use super::skel::types::{ember_py_limit, ember_py_model, ember_py_proc, ember_py_tls};
use super::skel::types::{ember_table_none, ember_unwind_limit};

/// Bits of a table id that are its slot (`EMBER_UNWIND_SLOT_BITS`; also checked against
/// the map at [`MapIo::open`]).
pub const SLOT_BITS: u32 = ember_unwind_limit::EMBER_UNWIND_SLOT_BITS.0;
/// Slots of `unwind_tables` (`EMBER_UNWIND_TABLES`).
pub const SLOTS: usize = 1 << SLOT_BITS;
/// `EMBER_TABLE_NONE`: walk this range by the frame pointer.
pub const TABLE_NONE: u32 = ember_table_none::EMBER_TABLE_NONE.0;
/// Bytes of one element of a table's array (`struct ember_unwind_chunk`).
pub const CHUNK_BYTES: usize = size_of::<ember_unwind_chunk>();
/// 8-byte slots per element (`EMBER_UNWIND_CHUNK_SLOTS`): the walker looks up one 4 KiB
/// chunk and searches inside it.
pub const CHUNK_SLOTS: usize = CHUNK_BYTES / size_of::<u64>();
/// Ranges per process (`EMBER_UNWIND_RANGES`: the length of `ember_unwind_proc.ranges`).
pub const RANGES: usize = (size_of::<ember_unwind_proc>() - offset_of!(ember_unwind_proc, ranges))
    / size_of::<ember_unwind_range>();
/// Segments per `unwind_files` entry (`EMBER_UNWIND_FILE_SEGMENTS`).
pub const FILE_SEGMENTS: usize = (size_of::<ember_unwind_file>()
    - offset_of!(ember_unwind_file, segments))
    / size_of::<ember_unwind_segment>();
/// Entries of `unwind_files` (`EMBER_UNWIND_FILES`).
pub const FILES: usize = ember_unwind_limit::EMBER_UNWIND_FILES.0 as usize;
/// Bytes of one `unwind_procs` value.
pub const PROC_BYTES: usize = size_of::<ember_unwind_proc>();

/// The sampler's unwind maps, handed to the loader that fills them (its own file descriptors).
pub struct UnwindMaps {
    /// `unwind_tables`: slot → the table's inner array.
    pub tables: MapHandle,
    /// `unwind_procs`: tgid → `ember_unwind_proc`.
    pub procs: MapHandle,
    /// `unwind_used`: slot → time_ns of its last use (mmapable).
    pub used: MapHandle,
    /// `unwind_files`: the kernel's (dev, inode) of a file → its table id and segments.
    pub files: MapHandle,
    /// `row_cache`: the walker's per-CPU cache of rows, keyed by table id (emptied when a
    /// slot's ids start over).
    pub row_cache: MapHandle,
    /// `py_procs`: tgid → `ember_py_proc`, the process's Python interpreter.
    pub py_procs: MapHandle,
    /// The exec hook (`ember_exec`) is attached: it writes a new program's ranges itself,
    /// and the walker adds libraries mapped since, so the loader leaves new processes'
    /// entries to them and only reads processes whole.
    pub exec_hook: bool,
}

/// Why a map update failed.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// An entry was asked to be new and one is there already.
    #[error("the entry exists already")]
    Exists,
    /// The kernel refused the update (a full map, memory).
    #[error("map update refused: {0}")]
    Refused(#[source] libbpf_rs::Error),
    /// A table's array could not be created or mapped.
    #[error("table array: {0}")]
    Array(#[source] std::io::Error),
    /// A table larger than a map can hold (pages or chunks over 32 bits).
    #[error("table too large for a map: {0}")]
    TooLarge(&'static str),
}

/// A table as the walker reads it: the header slot, the page slots, the rows.
#[derive(Debug, Clone, Copy)]
pub struct TableImage<'a> {
    /// Slot 0.
    pub header: ember_unwind_header,
    /// Slots `1..=page_count`.
    pub pages: &'a [ember_unwind_page],
    /// The slots after the pages.
    pub rows: &'a [ember_unwind_row],
}

impl TableImage<'_> {
    /// 8-byte slots the table takes.
    pub fn slots(&self) -> usize {
        table_slots(self.pages.len(), self.rows.len())
    }
}

/// 8-byte slots of a table of `pages` pages and `rows` rows: the header, pages, rows.
pub fn table_slots(pages: usize, rows: usize) -> usize {
    1 + pages + rows
}

/// Kernel bytes of the array of a table of `slots` slots: whole chunks.
pub fn table_bytes(slots: usize) -> u64 {
    (slots.div_ceil(CHUNK_SLOTS) * CHUNK_BYTES) as u64
}

/// What the unwind loader does to the sampler's maps: write a table, a process's ranges, a
/// file; evict them. The loader's policy is tested against a fake of this.
pub trait UnwindIo {
    /// Whether the exec hook writes new programs' ranges (see [`UnwindMaps::exec_hook`]).
    fn exec_hook(&self) -> bool;
    /// Fills `table` into a new array for `slot`; it takes effect at the next
    /// [`UnwindIo::commit_tables`].
    fn write_table(&mut self, slot: u32, table: TableImage<'_>) -> Result<(), MapError>;
    /// Puts the tables written since the last call into their slots; returns the slots the
    /// kernel refused (left empty).
    fn commit_tables(&mut self) -> Vec<u32>;
    /// Empties `slot` (every range naming it was pointed elsewhere first).
    fn evict_table(&mut self, slot: u32);
    /// Writes `pid`'s ranges in one update; with `only_new`, only if it has none
    /// ([`MapError::Exists`] otherwise).
    fn write_proc(
        &mut self,
        pid: u32,
        value: &ember_unwind_proc,
        only_new: bool,
    ) -> Result<(), MapError>;
    /// Deletes `pid`'s ranges (absent or not).
    fn delete_proc(&mut self, pid: u32);
    /// The pids that have ranges (the exec hook may have written some).
    fn proc_pids(&self) -> Vec<u32>;
    /// Writes what the sampler may know of a file by its inode.
    fn write_file(
        &mut self,
        key: ember_unwind_file_key,
        value: &ember_unwind_file,
    ) -> Result<(), MapError>;
    /// Deletes a file's entry (absent or not).
    fn delete_file(&mut self, key: ember_unwind_file_key);
    /// When the walker last used `slot` (CLOCK_MONOTONIC ns; 0: never).
    fn last_used(&self, slot: u32) -> u64;
    /// Stamps `slot` as used at `ns` (a table just put there is in use).
    fn mark_used(&mut self, slot: u32, ns: u64);
    /// Empties the walker's row caches, every CPU's (a slot's ids started over).
    fn clear_row_cache(&mut self);
    /// Writes `pid`'s Python interpreter entry (`py_procs`).
    fn write_py(&mut self, pid: u32, value: &ember_py_proc) -> Result<(), MapError> {
        let _ = (pid, value);
        Ok(())
    }
    /// Removes `pid`'s Python interpreter entry, if any.
    fn delete_py(&mut self, pid: u32) {
        let _ = pid;
    }
}

/// [`UnwindIo`] on the sampler's maps.
pub struct MapIo {
    maps: UnwindMaps,
    used: UsedView,
    /// Tables filled but not yet in `unwind_tables`.
    pending: Vec<(u32, MapHandle)>,
}

impl MapIo {
    /// Takes the maps, mapping `unwind_used` into the agent.
    pub fn open(maps: UnwindMaps) -> std::io::Result<Self> {
        if maps.tables.max_entries() as usize != SLOTS {
            return Err(std::io::Error::other(format!(
                "unwind_tables has {} slots, the agent expects {SLOTS}",
                maps.tables.max_entries()
            )));
        }
        let used = UsedView::map(&maps.used)?;
        Ok(Self {
            maps,
            used,
            pending: Vec::new(),
        })
    }
}

impl UnwindIo for MapIo {
    fn exec_hook(&self) -> bool {
        self.maps.exec_hook
    }

    fn write_table(&mut self, slot: u32, table: TableImage<'_>) -> Result<(), MapError> {
        let inner = fill(&table)?;
        self.pending.push((slot, inner));
        Ok(())
    }

    fn commit_tables(&mut self) -> Vec<u32> {
        if self.pending.is_empty() {
            return Vec::new();
        }
        let pending = std::mem::take(&mut self.pending);
        let keys: Vec<u8> = pending.iter().flat_map(|(s, _)| s.to_ne_bytes()).collect();
        let fds: Vec<u8> = pending
            .iter()
            .flat_map(|(_, m)| m.as_fd().as_raw_fd().to_ne_bytes())
            .collect();
        let batch = self.maps.tables.update_batch(
            &keys,
            &fds,
            pending.len() as u32,
            MapFlags::ANY,
            MapFlags::ANY,
        );
        if batch.is_ok() {
            return Vec::new();
        }
        // One by one, to learn which the kernel refused.
        let tables = &self.maps.tables;
        pending
            .into_iter()
            .filter(|(slot, inner)| {
                let fd = inner.as_fd().as_raw_fd();
                tables
                    .update(&slot.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY)
                    .inspect_err(|e| tracing::debug!("unwind table slot {slot} refused: {e}"))
                    .is_err()
            })
            .map(|(slot, _)| slot)
            .collect()
    }

    fn evict_table(&mut self, slot: u32) {
        let _ = self.maps.tables.delete(&slot.to_ne_bytes());
    }

    fn write_proc(
        &mut self,
        pid: u32,
        value: &ember_unwind_proc,
        only_new: bool,
    ) -> Result<(), MapError> {
        let flags = if only_new {
            MapFlags::NO_EXIST
        } else {
            MapFlags::ANY
        };
        match self
            .maps
            .procs
            .update(&pid.to_ne_bytes(), bytes_of(value), flags)
        {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::AlreadyExists => Err(MapError::Exists),
            Err(e) => Err(MapError::Refused(e)),
        }
    }

    fn delete_proc(&mut self, pid: u32) {
        let _ = self.maps.procs.delete(&pid.to_ne_bytes());
    }

    fn proc_pids(&self) -> Vec<u32> {
        self.maps
            .procs
            .keys()
            .filter_map(|k| k.get(..4)?.try_into().ok().map(u32::from_ne_bytes))
            .collect()
    }

    fn write_file(
        &mut self,
        key: ember_unwind_file_key,
        value: &ember_unwind_file,
    ) -> Result<(), MapError> {
        self.maps
            .files
            .update(bytes_of(&key), bytes_of(value), MapFlags::ANY)
            .map_err(MapError::Refused)
    }

    fn delete_file(&mut self, key: ember_unwind_file_key) {
        let _ = self.maps.files.delete(bytes_of(&key));
    }

    fn last_used(&self, slot: u32) -> u64 {
        self.used.get(slot as usize)
    }

    fn mark_used(&mut self, slot: u32, ns: u64) {
        self.used.stamp(slot as usize, ns);
    }

    fn write_py(&mut self, pid: u32, value: &ember_py_proc) -> Result<(), MapError> {
        self.maps
            .py_procs
            .update(&pid.to_ne_bytes(), bytes_of(value), MapFlags::ANY)
            .map_err(MapError::Refused)
    }

    fn delete_py(&mut self, pid: u32) {
        let _ = self.maps.py_procs.delete(&pid.to_ne_bytes());
    }

    fn clear_row_cache(&mut self) {
        let Ok(cpus) = libbpf_rs::num_possible_cpus() else {
            return;
        };
        let cache = &self.maps.row_cache;
        let zeros = vec![vec![0u8; cache.value_size() as usize]; cpus];
        for key in 0..cache.max_entries() {
            if let Err(e) = cache.update_percpu(&key.to_ne_bytes(), &zeros, MapFlags::ANY) {
                warn!("could not empty the unwind row cache: {e}");
            }
        }
    }
}

/// The bytes of a value shared with BPF, as the kernel copies it.
///
/// Only for the skeleton's unwind types: `#[repr(C)]` integers and arrays of them, with
/// every padding byte a named field ([`super::abi`] checks that their sizes are the sums
/// of their fields), so no byte is uninitialized.
fn bytes_of<T: SharedValue>(value: &T) -> &[u8] {
    // SAFETY: T is one of the padding-free plain-data types below; the slice covers
    // exactly the value and lives as long as the borrow.
    unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }
}

/// The types [`bytes_of`] may view as bytes.
trait SharedValue {}
impl SharedValue for ember_unwind_proc {}
impl SharedValue for ember_unwind_file {}
impl SharedValue for ember_unwind_file_key {}
impl SharedValue for ember_py_proc {}

/// Creates a table's array at its exact size and fills it through mmap.
fn fill(t: &TableImage<'_>) -> Result<MapHandle, MapError> {
    let entries = t.slots();
    let chunks = entries.div_ceil(CHUNK_SLOTS);
    let n = u32::try_from(chunks).map_err(|_| MapError::TooLarge("too many rows"))?;
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: size_of::<libbpf_sys::bpf_map_create_opts>() as _,
        map_flags: libbpf_sys::BPF_F_INNER_MAP | libbpf_sys::BPF_F_MMAPABLE,
        ..Default::default()
    };
    let inner = MapHandle::create(
        MapType::Array,
        Some("ember_unwind"),
        4,
        CHUNK_BYTES as u32,
        n,
        &opts,
    )
    .map_err(|e| MapError::Array(std::io::Error::other(e)))?;
    let len = chunks * CHUNK_BYTES;
    // Unmapped below; nothing else refers to it.
    let ptr = map_shared(&inner, len).map_err(MapError::Array)?;
    let base = ptr.cast::<u64>();
    // SAFETY: the mapping holds `len >= entries * 8` writable bytes, page-aligned, until the
    // munmap below. Each value is 8 bytes with an alignment of at most 8, written at an
    // 8-byte slot: the header at slot 0, the pages after it, the rows after them.
    unsafe {
        base.cast::<ember_unwind_header>().write(t.header);
        let pages = base.add(1);
        std::ptr::copy_nonoverlapping(
            t.pages.as_ptr(),
            pages.cast::<ember_unwind_page>(),
            t.pages.len(),
        );
        let rows = pages.add(t.pages.len());
        std::ptr::copy_nonoverlapping(
            t.rows.as_ptr(),
            rows.cast::<ember_unwind_row>(),
            t.rows.len(),
        );
        libc::munmap(ptr, len);
    }
    Ok(inner)
}

/// A read-write shared mapping of the first `len` bytes of an mmapable array map (the
/// kernel rounds the array up to whole pages, so `len` may be page-rounded).
fn map_shared(map: &MapHandle, len: usize) -> std::io::Result<*mut libc::c_void> {
    // SAFETY: a fresh mapping of a map fd we hold; the caller unmaps it.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            map.as_fd().as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(ptr)
}

/// `unwind_used` mapped into the agent: the sampler stamps a slot each time it walks it.
struct UsedView {
    ptr: *mut u64,
    len: usize,
}

// SAFETY: the mapping is owned by the view and only read/written as plain u64s.
unsafe impl Send for UsedView {}

impl UsedView {
    fn map(map: &MapHandle) -> std::io::Result<Self> {
        let len = (SLOTS * size_of::<u64>()).next_multiple_of(4096);
        // Unmapped in Drop.
        let ptr = map_shared(map, len)?;
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }

    fn get(&self, slot: usize) -> u64 {
        if slot >= SLOTS {
            return 0;
        }
        // SAFETY: slot < SLOTS, inside the mapping; BPF writes whole u64s.
        unsafe { std::ptr::read_volatile(self.ptr.add(slot)) }
    }

    fn stamp(&self, slot: usize, t: u64) {
        if slot < SLOTS {
            // SAFETY: as in get.
            unsafe { std::ptr::write_volatile(self.ptr.add(slot), t) }
        }
    }
}

impl Drop for UsedView {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
