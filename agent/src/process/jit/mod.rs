//! JIT frames: names for code that runtimes generate at run time (Node, the JVM, ...),
//! from the process's perf map (`/tmp/perf-<pid>.map`) and jitdump (`jit-<pid>.dump`).
//!
//! JIT code lives in anonymous executable memory, so the process table normalizes a JIT
//! address to a region (`[anon]`). Such an address is looked up here, while the process is
//! alive, in a per-process table built from the runtime's files; a hit becomes a named
//! [`JitFrame`]. The tables belong to the process table (the aggregation stage) and are
//! freed with the process, after its last window.
//!
//! The files are written by the profiled process, so they are untrusted input:
//! - the perf map is opened as `/proc/<pid>/root/tmp/perf-<nspid>.map` (the process's own
//!   `/tmp` and pid inside its namespaces), one component at a time with `openat2(
//!   RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS)`, so no symlink is followed, in or out of the
//!   container, and each directory checked to be on a local file system before a name is
//!   looked up in it (a FUSE `/tmp` whose daemon never answers would hold the aggregator;
//!   see `process::fs`);
//! - the jitdump is the very file the process maps (through `/proc/PID/map_files`);
//! - a file is used only when owned by the process's uid or by root (perf's rule), when it
//!   is a regular file, and when it is no larger than `jit.max_file_bytes`;
//! - entries and the bytes they hold (a name may be 64 KiB) are capped per process and
//!   across all processes, names are interned (a fleet of identical runtimes on a node
//!   writes the same names), and files are read in bounded chunks;
//!
//! and every refusal is counted in `ember_jit_rejects_total{reason}`. Files are re-read
//! incrementally: only the bytes appended since the last read, everything again when the
//! file shrank or was replaced. Each process's files are looked at no more than once per
//! window, and only for processes whose stacks reach anonymous executable memory, so
//! processes without JIT code cost nothing.

mod jvm;
// The parsers of the files: pure over bytes, in ember-parse (fuzzed there).
use ember_parse::jit::{jitdump, names, perfmap};

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Arc;
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;

use crate::config::Jit;
use crate::process::jit::jitdump::JitDump;

use crate::metrics::{JitReject, Metrics, ObjectRefusal};
use crate::model::JitSource;
use crate::process::object::Object;
use names::Names;
use perfmap::PerfMap;

/// A frame in JIT code, named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitFrame {
    /// Which file named it.
    pub source: JitSource,
    /// The function's name as the runtime wrote it.
    pub name: Arc<str>,
    /// Source file, when a jitdump's `DEBUG_INFO` gave one.
    pub file: Option<Arc<str>>,
    /// Source line, or 0.
    pub line: u32,
    /// The address in the process (JIT code has no file to give an offset in).
    pub addr: u64,
}

/// What the process table knows about a process that matters here.
#[derive(Debug, Clone, Default)]
pub struct Hints {
    /// `libjvm.so` is mapped.
    pub jvm: bool,
    /// The process maps a `jit-<pid>.dump` (held open by the process table).
    pub jitdump: Option<Arc<Object>>,
}

/// Where an incremental read stopped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Cursor {
    dev: u64,
    ino: u64,
    offset: u64,
}

#[derive(Debug)]
struct ProcJit {
    /// The pid in the process's own pid namespace.
    nspid: u32,
    /// Effective uid and gid.
    uid: u32,
    gid: u32,
    /// Whether the process has a SIGQUIT handler (a JVM that can be attached to).
    sigquit: bool,
    /// The window the files were last looked at.
    checked: u64,
    perf: PerfMap,
    perf_at: Option<Cursor>,
    dump: JitDump,
    dump_at: Option<Cursor>,
    /// A dump tail that stayed incomplete across two reads was counted once.
    dump_stalled: bool,
    /// The jitdump's size at the last read.
    dump_size: u64,
    /// Where the record the last read stopped at ends: nothing more can be parsed until
    /// the file reaches this size, so it is not read again before.
    dump_need: u64,
    /// The perf map was rewritten on our request: read it whole next time.
    reread: bool,
    jvm_asked: Option<Instant>,
}

/// Per-process JIT tables with a global entry cap; owned by the process table.
pub struct JitTables {
    settings: Jit,
    procs: HashMap<u32, ProcJit>,
    /// Entries held across `procs`, kept up to date (the global cap is checked often).
    total: usize,
    /// Bytes charged across `procs`, likewise.
    total_bytes: usize,
    /// Names shared by every table.
    names: Names,
    /// The window `names` was last pruned in.
    pruned: u64,
    metrics: Metrics,
    attach: Option<jvm::Worker>,
}

impl JitTables {
    /// Empty tables; starts the JVM attach thread when JVM refresh is on.
    pub fn new(settings: Jit, metrics: Metrics) -> Self {
        let attach = (settings.enabled && !settings.jvm_perfmap_refresh.is_zero())
            .then(|| jvm::Worker::start(metrics.clone()))
            .and_then(|r| {
                r.map_err(|e| tracing::warn!("JVM perf map refresh is off: {e}"))
                    .ok()
            });
        Self {
            settings,
            procs: HashMap::new(),
            total: 0,
            total_bytes: 0,
            names: Names::default(),
            pruned: 0,
            metrics,
            attach,
        }
    }

    /// A process was (re)read: a JVM is asked for its perf map right away, so the map is
    /// there by the time its first window closes.
    pub fn seen(&mut self, pid: u32, hints: &Hints, window: u64) {
        if hints.jvm && self.attach.is_some() && self.entry(pid, window).is_some() {
            self.maybe_ask_jvm(pid);
        }
    }

    /// Names the JIT code at `addr` of `pid`, reading the process's files first if they
    /// were not looked at in this `window`.
    pub fn lookup(&mut self, pid: u32, addr: u64, window: u64, hints: &Hints) -> Option<JitFrame> {
        if !self.settings.enabled {
            return None;
        }
        let fresh = self.entry(pid, window)?.checked == window;
        if !fresh {
            self.refresh(pid, window, hints);
        }
        let p = self.procs.get(&pid)?;
        if let Some(hit) = p.dump.lookup(addr) {
            return Some(JitFrame {
                source: JitSource::JitDump,
                name: hit.name.clone(),
                file: hit.source.map(|s| s.file.clone()),
                line: hit.source.map_or(0, |s| s.line),
                addr,
            });
        }
        let (name, _) = p.perf.lookup_shared(addr)?;
        Some(JitFrame {
            source: JitSource::PerfMap,
            name,
            file: None,
            line: 0,
            addr,
        })
    }

    /// Frees the tables of a process that is gone (after its last window).
    pub fn forget(&mut self, pid: u32) {
        if let Some(p) = self.procs.remove(&pid) {
            self.total = self.total.saturating_sub(p.perf.len() + p.dump.len());
            self.total_bytes = self
                .total_bytes
                .saturating_sub(p.perf.bytes() + p.dump.bytes());
            self.publish();
        }
    }

    fn publish(&self) {
        self.metrics.jit_entries.set(self.total as i64);
        self.metrics.jit_bytes.set(self.total_bytes as i64);
    }

    /// The state of `pid`, created from `/proc/<pid>/status` on first use.
    fn entry(&mut self, pid: u32, window: u64) -> Option<&mut ProcJit> {
        if !self.procs.contains_key(&pid) {
            let status = crate::os::procfs::read_capped(
                std::path::Path::new(&format!("/proc/{pid}/status")),
                64 << 10,
            )
            .ok()?;
            let st = parse_status(&status)?;
            let cap = self.settings.max_entries_per_process;
            let bytes = self.settings.max_bytes_per_process;
            self.procs.insert(
                pid,
                ProcJit {
                    nspid: st.nspid.unwrap_or(pid),
                    uid: st.uid,
                    gid: st.gid,
                    sigquit: st.sigquit,
                    checked: window.wrapping_sub(1),
                    perf: PerfMap::with_limits(cap, bytes, self.names.clone()),
                    perf_at: None,
                    dump: JitDump::with_limits(cap, bytes, self.names.clone()),
                    dump_at: None,
                    dump_stalled: false,
                    dump_size: 0,
                    dump_need: 0,
                    reread: false,
                    jvm_asked: None,
                },
            );
        }
        self.procs.get_mut(&pid)
    }

    fn refresh(&mut self, pid: u32, window: u64, hints: &Hints) {
        self.collect_jvm_results();
        if hints.jvm {
            self.maybe_ask_jvm(pid);
        }
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        p.checked = window;
        let own = p.perf.len() + p.dump.len();
        let own_bytes = p.perf.bytes() + p.dump.bytes();
        // What the global caps leave this process, on top of what it holds.
        let room = self
            .settings
            .max_total_entries
            .saturating_sub(self.total.saturating_sub(own))
            .min(self.settings.max_entries_per_process);
        let room_bytes = self
            .settings
            .max_total_bytes
            .saturating_sub(self.total_bytes.saturating_sub(own_bytes))
            .min(self.settings.max_bytes_per_process);
        let mut rejects: Vec<JitReject> = Vec::new();
        let limits = Limits {
            file_bytes: self.settings.max_file_bytes,
            entries: room,
            bytes: room_bytes,
            names: &self.names,
            read: &self.metrics.jit_read_bytes,
        };
        read_perf_map(pid, p, &limits, &mut rejects, &self.metrics);
        if let Some(obj) = &hints.jitdump {
            read_jitdump(obj, p, &limits, &mut rejects);
        }
        self.total = self.total.saturating_sub(own) + p.perf.len() + p.dump.len();
        self.total_bytes =
            self.total_bytes.saturating_sub(own_bytes) + p.perf.bytes() + p.dump.bytes();
        if self.pruned != window {
            // Names of tables replaced or forgotten since: at most one sweep per window.
            self.pruned = window;
            self.names.prune();
        }
        let mut counted: HashMap<JitReject, u64> = HashMap::new();
        for r in rejects {
            *counted.entry(r).or_default() += 1;
        }
        for (r, n) in counted {
            self.metrics.jit_rejected(r, n);
        }
        self.publish();
    }

    fn maybe_ask_jvm(&mut self, pid: u32) {
        let interval = self.settings.jvm_perfmap_refresh;
        let Some(attach) = &self.attach else {
            return;
        };
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        if p.jvm_asked.is_some_and(|t| t.elapsed() < interval) {
            return;
        }
        p.jvm_asked = Some(Instant::now());
        // Pinned now: the pid may name another process by the time the attach thread
        // gets to it.
        let (pidfd, start_time) = jvm::pin(pid);
        attach.request(jvm::Request {
            pidfd,
            start_time,
            pid,
            nspid: p.nspid,
            uid: p.uid,
            gid: p.gid,
            sigquit: p.sigquit,
        });
    }

    fn collect_jvm_results(&mut self) {
        let Some(attach) = &self.attach else {
            return;
        };
        for pid in attach.refreshed() {
            if let Some(p) = self.procs.get_mut(&pid) {
                p.reread = true;
            }
        }
    }
}

/// Reads what was appended to the perf map of `pid` (all of it when it was replaced).
/// The label a perf-map line refusal is counted under (the parser names its own reasons;
/// the stage maps them onto the metric).
fn perfmap_reason(r: perfmap::Reject) -> JitReject {
    match r {
        perfmap::Reject::Malformed => JitReject::Malformed,
        perfmap::Reject::BadRange => JitReject::BadRange,
        perfmap::Reject::TooMany => JitReject::TooMany,
        perfmap::Reject::TooBig => JitReject::Bytes,
    }
}

/// The label a jitdump refusal is counted under.
fn jitdump_reason(r: jitdump::Reject) -> JitReject {
    match r {
        jitdump::Reject::BadHeader => JitReject::JitdumpHeader,
        jitdump::Reject::Malformed => JitReject::JitdumpMalformed,
        jitdump::Reject::BadRange => JitReject::BadRange,
        jitdump::Reject::TooMany => JitReject::TooMany,
        jitdump::Reject::TooBig => JitReject::Bytes,
    }
}

/// What one process may read and hold in one refresh.
struct Limits<'a> {
    /// Largest file read.
    file_bytes: u64,
    /// Entries and bytes it may hold (its own cap, less what others hold of the global one).
    entries: usize,
    bytes: usize,
    names: &'a Names,
    /// Bytes read from JIT files.
    read: &'a Counter,
}

/// Bytes read from a JIT file at a time: the parsers take appended pieces, so a 64 MB map
/// never needs 64 MB of buffer.
const READ_CHUNK: u64 = 1 << 20;

fn read_perf_map(
    pid: u32,
    p: &mut ProcJit,
    limits: &Limits,
    rejects: &mut Vec<JitReject>,
    metrics: &Metrics,
) {
    // Walked one checked component at a time inside the process's root: never onto a FUSE
    // or network file system (a /tmp there would hold the aggregator), never a FIFO.
    let dir = std::path::PathBuf::from(format!("/proc/{pid}"));
    let mut mounts = crate::process::fs::Mounts::new(&dir, metrics);
    let rel = format!("tmp/perf-{}.map", p.nspid);
    let file = match crate::process::object::open_file_in_process(&mut mounts, &rel) {
        Ok(Some(f)) => f,
        Ok(None) => return,
        Err(r) => return rejects.push(jit_refusal(r)),
    };
    drop(mounts);
    let Some((size, at)) = check_file(&file, p.uid, limits.file_bytes, rejects) else {
        return;
    };
    let mut cursor = match p.perf_at {
        Some(c) if c.dev == at.dev && c.ino == at.ino && c.offset <= size && !p.reread => c,
        _ => {
            // New, replaced, shrunk or rewritten on request: start over.
            p.perf = PerfMap::with_limits(limits.entries, limits.bytes, limits.names.clone());
            at
        }
    };
    p.reread = false;
    p.perf.set_limits(
        limits.entries.max(p.perf.len()),
        limits.bytes.max(p.perf.bytes()),
    );
    while cursor.offset < size {
        let to = size.min(cursor.offset + READ_CHUNK);
        let Some(bytes) = read_range(&file, cursor.offset, to, limits.read) else {
            return rejects.push(JitReject::Read);
        };
        if bytes.is_empty() {
            break; // shrank meanwhile: the next read starts over
        }
        rejects.extend(p.perf.feed_bytes(&bytes).into_iter().map(perfmap_reason));
        cursor.offset += bytes.len() as u64;
    }
    p.perf_at = Some(cursor);
}

/// The JIT reason of a refused open.
fn jit_refusal(r: ObjectRefusal) -> JitReject {
    match r {
        ObjectRefusal::Symlink => JitReject::Symlink,
        ObjectRefusal::NotRegular => JitReject::NotRegular,
        ObjectRefusal::Fuse | ObjectRefusal::NetworkFs | ObjectRefusal::UnknownFs => {
            JitReject::RemoteFs
        }
        _ => JitReject::Open,
    }
}

/// Reads the records appended to the jitdump the process maps.
fn read_jitdump(obj: &Object, p: &mut ProcJit, limits: &Limits, rejects: &mut Vec<JitReject>) {
    let file = obj.file();
    let Some((size, at)) = check_file(file, p.uid, limits.file_bytes, rejects) else {
        return;
    };
    let mut cursor = match p.dump_at {
        Some(c) if c.dev == at.dev && c.ino == at.ino && c.offset <= size => c,
        _ => {
            p.dump = JitDump::with_limits(limits.entries, limits.bytes, limits.names.clone());
            p.dump_stalled = false;
            p.dump_need = 0;
            at
        }
    };
    if p.dump_at.is_some() && p.dump.broken() {
        return; // nothing after a malformed record is trusted: never read it again
    }
    if p.dump_at.is_some() && size < p.dump_need {
        // The record the last read stopped at is not complete yet: reading its start again
        // (up to the file's cap, for every process mapping the file, every window) would
        // parse nothing. A tail that did not grow at all is a truncated record: count it once.
        let stalled = size == p.dump_size;
        if stalled && !p.dump_stalled {
            rejects.push(JitReject::JitdumpTruncated);
        }
        p.dump_stalled = stalled;
        p.dump_size = size;
        return;
    }
    p.dump.set_limits(
        limits.entries.max(p.dump.len()),
        limits.bytes.max(p.dump.bytes()),
    );
    // Whole records only are consumed: read a chunk (grown to hold one large record, up
    // to the file's size cap) until what is left is an incomplete tail.
    let mut used = 0usize;
    let mut pending = 0usize;
    let mut chunk = READ_CHUNK;
    while cursor.offset < size {
        let to = size.min(cursor.offset + chunk);
        let Some(bytes) = read_range(file, cursor.offset, to, limits.read) else {
            return rejects.push(JitReject::Read);
        };
        let (n, rs) = p.dump.feed(&bytes);
        rejects.extend(rs.into_iter().map(jitdump_reason));
        cursor.offset += n as u64;
        used += n;
        pending = bytes.len() - n;
        if n == 0 {
            if to >= size || bytes.is_empty() || p.dump.broken() {
                break;
            }
            chunk = chunk.saturating_mul(2);
        } else {
            chunk = READ_CHUNK;
        }
    }
    // A tail that did not grow since the last read is a truncated record, not one being
    // written: count it once (it still gets parsed if the rest ever arrives).
    let stalled = pending > 0 && used == 0 && p.dump_at.is_some() && size == p.dump_size;
    if stalled && !p.dump_stalled {
        rejects.push(JitReject::JitdumpTruncated);
    }
    p.dump_stalled = stalled;
    p.dump_size = size;
    p.dump_at = Some(cursor);
    p.dump_need = match pending {
        0 => 0,
        _ => record_end(file, cursor.offset, p.dump.header_seen(), limits.read),
    };
}

/// Where the jitdump record (or the file header, before it was seen) starting at `offset`
/// ends, from its size field; 0 when that cannot be read.
fn record_end(file: &File, offset: u64, header_seen: bool, read: &Counter) -> u64 {
    // A record: id u32, total_size u32. The file header: magic, version, total_size.
    let (at, len) = if header_seen { (4, 8) } else { (8, 12) };
    match read_range(file, offset, offset + len, read) {
        Some(b) if b.len() == len as usize => {
            let size = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
            offset.saturating_add(u64::from(size))
        }
        _ => 0,
    }
}

/// Checks a JIT file before reading it: a regular file, owned by `uid` or root, no larger
/// than `max_bytes`. Returns its size and identity.
fn check_file(
    file: &File,
    uid: u32,
    max_bytes: u64,
    rejects: &mut Vec<JitReject>,
) -> Option<(u64, Cursor)> {
    let Ok(meta) = file.metadata() else {
        rejects.push(JitReject::Open);
        return None;
    };
    if !meta.file_type().is_file() {
        rejects.push(JitReject::NotRegular);
        return None;
    }
    if meta.uid() != uid && meta.uid() != 0 {
        rejects.push(JitReject::Owner);
        return None;
    }
    if meta.len() > max_bytes {
        rejects.push(JitReject::TooLarge);
        return None;
    }
    Some((
        meta.len(),
        Cursor {
            dev: meta.dev(),
            ino: meta.ino(),
            offset: 0,
        },
    ))
}

/// Bytes `[from, to)` of `file` (fewer if it shrank meanwhile).
fn read_range(file: &File, from: u64, to: u64, read: &Counter) -> Option<Vec<u8>> {
    let len = usize::try_from(to.saturating_sub(from)).ok()?;
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match file.read_at(&mut buf[got..], from + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    buf.truncate(got);
    read.inc_by(got as u64);
    Some(buf)
}

/// What `/proc/<pid>/status` says that matters here.
#[derive(Debug, Default, PartialEq, Eq)]
struct Status {
    nspid: Option<u32>,
    uid: u32,
    gid: u32,
    sigquit: bool,
}

fn parse_status(text: &str) -> Option<Status> {
    let mut st = Status::default();
    let mut seen_uid = false;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let mut fields = value.split_whitespace();
        match key {
            // The last field is the pid in the innermost namespace, the process's own view.
            "NSpid" => st.nspid = fields.next_back().and_then(|v| v.parse().ok()),
            // Real, effective, saved, fs: the JVM compares against the effective ids.
            "Uid" => {
                st.uid = fields.nth(1)?.parse().ok()?;
                seen_uid = true;
            }
            "Gid" => st.gid = fields.nth(1)?.parse().ok()?,
            "SigCgt" => {
                let mask = u64::from_str_radix(fields.next()?, 16).ok()?;
                st.sigquit = mask & (1 << (libc::SIGQUIT - 1)) != 0;
            }
            _ => {}
        }
    }
    seen_uid.then_some(st)
}

/// Whether a maps path is a jitdump (`.../jit-<pid>.dump`).
pub fn is_jitdump_path(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.strip_prefix("jit-")
        .and_then(|r| r.strip_suffix(".dump"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields() {
        let text = "Name:\tjava\nUid:\t1000\t1001\t1001\t1001\nGid:\t50\t51\t51\t51\n\
                    NSpid:\t4242\t7\nSigCgt:\t0000000181005ccf\n";
        assert_eq!(
            parse_status(text),
            Some(Status {
                nspid: Some(7),
                uid: 1001,
                gid: 51,
                sigquit: true
            })
        );
        let host = "Uid:\t0\t0\t0\t0\nNSpid:\t12\nSigCgt:\t0000000000000000\n";
        let st = parse_status(host).expect("parses");
        assert_eq!((st.nspid, st.sigquit), (Some(12), false));
        assert_eq!(parse_status("Name: x\n"), None);
    }

    /// A live process (so `/proc/<pid>/root` and status exist) and its perf map path.
    struct Victim {
        child: std::process::Child,
        map: std::path::PathBuf,
    }

    impl Victim {
        fn new() -> Self {
            let child = std::process::Command::new("sleep")
                .arg("60")
                .spawn()
                .expect("spawn sleep");
            let map = std::path::PathBuf::from(format!("/tmp/perf-{}.map", child.id()));
            Self { child, map }
        }
        fn pid(&self) -> u32 {
            self.child.id()
        }
    }

    impl Drop for Victim {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.map);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// Refusals counted under the label value `reason`.
    fn rejects(m: &Metrics, reason: &str) -> u64 {
        let reason = *JitReject::ALL
            .iter()
            .find(|r| r.as_str() == reason)
            .unwrap_or_else(|| panic!("{reason} is no JIT reject reason"));
        m.jit_rejects
            .get_or_create(&crate::metrics::ReasonLabel { reason })
            .get()
    }

    fn name(t: &mut JitTables, pid: u32, addr: u64, window: u64) -> Option<String> {
        t.lookup(pid, addr, window, &Hints::default())
            .map(|f| f.name.to_string())
    }

    #[test]
    fn perf_map_is_read_incrementally_and_reread_when_replaced() {
        let v = Victim::new();
        let m = Metrics::new();
        let mut t = JitTables::new(Jit::default(), m.clone());
        std::fs::write(&v.map, "1000 100 bare_hex\n0x2000 0x100 prefixed_hex\n").expect("write");
        assert_eq!(
            name(&mut t, v.pid(), 0x1010, 1).as_deref(),
            Some("bare_hex")
        );
        assert_eq!(
            name(&mut t, v.pid(), 0x20ff, 1).as_deref(),
            Some("prefixed_hex")
        );
        let f = t
            .lookup(v.pid(), 0x1010, 1, &Hints::default())
            .expect("hit");
        assert_eq!((f.source, f.addr), (JitSource::PerfMap, 0x1010));
        // Appended: a later entry wins over the earlier one for its range.
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&v.map)
            .expect("open");
        file.write_all(b"1000 10 newer\n3000 10 third\n")
            .expect("append");
        assert_eq!(
            name(&mut t, v.pid(), 0x3000, 1),
            None,
            "read once per window only"
        );
        assert_eq!(name(&mut t, v.pid(), 0x3000, 2).as_deref(), Some("third"));
        assert_eq!(name(&mut t, v.pid(), 0x1008, 2).as_deref(), Some("newer"));
        assert_eq!(
            name(&mut t, v.pid(), 0x1050, 2).as_deref(),
            Some("bare_hex")
        );
        assert_eq!(t.total, 4);
        // Rewritten shorter: read from scratch.
        std::fs::write(&v.map, "5000 10 only\n").expect("rewrite");
        assert_eq!(name(&mut t, v.pid(), 0x1008, 3), None);
        assert_eq!(name(&mut t, v.pid(), 0x5000, 3).as_deref(), Some("only"));
        // Replaced by another file (new inode), even a longer one: read from scratch.
        let tmp = v.map.with_extension("new");
        std::fs::write(&tmp, "6000 10 replaced\n7000 10 also_replaced\n").expect("write");
        std::fs::rename(&tmp, &v.map).expect("rename");
        assert_eq!(name(&mut t, v.pid(), 0x5000, 4), None);
        assert_eq!(
            name(&mut t, v.pid(), 0x7000, 4).as_deref(),
            Some("also_replaced")
        );
        assert_eq!(m.jit_entries.get(), 2);
        t.forget(v.pid());
        assert_eq!((t.total, m.jit_entries.get()), (0, 0));
        assert_eq!(rejects(&m, "malformed"), 0);
    }

    #[test]
    fn hostile_perf_maps_are_refused_and_counted() {
        let m = Metrics::new();
        let settings = Jit {
            max_file_bytes: 1 << 20,
            ..Jit::default()
        };
        let mut t = JitTables::new(settings, m.clone());

        // A symlink to a host file: never opened.
        let v = Victim::new();
        let secret = tempfile::NamedTempFile::new().expect("tmp");
        std::fs::write(secret.path(), "1000 10 host_secret\n").expect("write");
        std::os::unix::fs::symlink(secret.path(), &v.map).expect("symlink");
        assert_eq!(name(&mut t, v.pid(), 0x1000, 1), None);
        assert_eq!(rejects(&m, "symlink"), 1);

        // 1 GB (sparse): refused without reading.
        let v = Victim::new();
        let f = std::fs::File::create(&v.map).expect("create");
        f.set_len(1 << 30).expect("1 GB");
        assert_eq!(name(&mut t, v.pid(), 0x1000, 1), None);
        assert_eq!(rejects(&m, "too_large"), 1);

        // Garbage lines are skipped, the good ones kept.
        let v = Victim::new();
        let mut junk = b"garbage\n\xff\xfe\x00 zz 12\n1000 0 empty\n1000 10 good\n".to_vec();
        junk.extend(std::iter::repeat_n(b'x', 100_000));
        junk.extend(b"\n2000 10 after_junk\n");
        std::fs::write(&v.map, junk).expect("write");
        assert_eq!(name(&mut t, v.pid(), 0x1000, 1).as_deref(), Some("good"));
        assert_eq!(
            name(&mut t, v.pid(), 0x2000, 1).as_deref(),
            Some("after_junk")
        );
        assert_eq!(rejects(&m, "malformed"), 3);
        assert_eq!(rejects(&m, "bad_range"), 1);

        // Not a regular file.
        let v = Victim::new();
        std::fs::create_dir(&v.map).expect("mkdir");
        assert_eq!(name(&mut t, v.pid(), 0x1000, 1), None);
        assert!(rejects(&m, "not_regular") + rejects(&m, "open") >= 1);
        let _ = std::fs::remove_dir(&v.map);

        // Owned by another user: refused (perf's rule). Needs root to chown.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let v = Victim::new();
            std::fs::write(&v.map, "1000 10 not_yours\n").expect("write");
            std::os::unix::fs::chown(&v.map, Some(4242), Some(4242)).expect("chown");
            assert_eq!(name(&mut t, v.pid(), 0x1000, 1), None);
            assert_eq!(rejects(&m, "owner"), 1);
        }
    }

    #[test]
    fn entry_caps_per_process_and_global() {
        let m = Metrics::new();
        let settings = Jit {
            max_entries_per_process: 3,
            max_total_entries: 5,
            ..Jit::default()
        };
        let mut t = JitTables::new(settings, m.clone());
        let lines: String = (1..=10)
            .map(|i| format!("{:x} 10 f{i}\n", i * 0x1000))
            .collect();
        let (a, b) = (Victim::new(), Victim::new());
        std::fs::write(&a.map, &lines).expect("write");
        std::fs::write(&b.map, &lines).expect("write");
        assert!(name(&mut t, a.pid(), 0x1000, 1).is_some());
        assert!(name(&mut t, b.pid(), 0x1000, 1).is_some());
        assert_eq!(t.total, 5, "3 for the first, the 2 left for the second");
        assert_eq!(rejects(&m, "too_many"), 7 + 8);
        t.forget(a.pid());
        assert_eq!(t.total, 2);
    }

    #[test]
    fn byte_caps_per_process_and_global() {
        let m = Metrics::new();
        let settings = Jit {
            max_bytes_per_process: 2 << 20,
            max_total_bytes: 5 << 20,
            ..Jit::default()
        };
        let mut t = JitTables::new(settings, m.clone());
        // Four processes, each with 100 distinct 64 KiB names (6.4 MB of map).
        let victims: Vec<Victim> = (0..4).map(|_| Victim::new()).collect();
        for (k, v) in victims.iter().enumerate() {
            let lines: String = (1..=100u64)
                .map(|i| {
                    format!(
                        "{:x} 10 {}{k}_{i}\n",
                        i * 0x1000,
                        "n".repeat((64 << 10) - 64)
                    )
                })
                .collect();
            std::fs::write(&v.map, lines).expect("write");
        }
        // 2 MiB each for the first two, the 1 MiB left of the global 5 for the third,
        // nothing for the fourth.
        let named: Vec<bool> = victims
            .iter()
            .map(|v| name(&mut t, v.pid(), 0x1000, 1).is_some())
            .collect();
        assert_eq!(named, [true, true, true, false]);
        let held = m.jit_bytes.get() as usize;
        assert!(held <= 5 << 20, "{held} bytes held, cap 5 MiB");
        assert!(held >= 4 << 20, "the budget is used: {held}");
        assert!(t.procs.values().all(|p| p.perf.bytes() <= 2 << 20));
        assert!(rejects(&m, "bytes") >= 4 * 100 - 5 * 16 * 4);
        for v in &victims {
            t.forget(v.pid());
        }
        assert_eq!(m.jit_bytes.get(), 0);
        t.names.prune();
        assert!(t.names.is_empty());
    }

    #[test]
    fn jitdump_is_read_incrementally_and_a_truncated_tail_counted() {
        use crate::process::jit::jitdump::build;
        let v = Victim::new();
        let m = Metrics::new();
        let mut t = JitTables::new(Jit::default(), m.clone());
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join(format!("jit-{}.dump", v.pid()));
        let mut bytes = build::header(v.pid());
        bytes.extend(build::debug_info(0x1000, &[(0x1000, 3, "hot.js")]));
        bytes.extend(build::code_load(0x1000, 0x40, "jitted_a"));
        let cut = bytes.len();
        bytes.extend(build::code_load(0x2000, 0x40, "jitted_b"));
        std::fs::write(&path, &bytes[..cut + 20]).expect("write");
        let obj = Arc::new(Object::open_local(&path).expect("open"));
        let hints = Hints {
            jvm: false,
            jitdump: Some(obj),
        };
        let f = t.lookup(v.pid(), 0x1004, 1, &hints).expect("named");
        assert_eq!(
            (&*f.name, f.source, f.line),
            ("jitted_a", JitSource::JitDump, 3)
        );
        assert_eq!(f.file.as_deref(), Some("hot.js"));
        assert!(t.lookup(v.pid(), 0x2004, 1, &hints).is_none());
        assert!(t.lookup(v.pid(), 0x2004, 2, &hints).is_none());
        assert_eq!(
            rejects(&m, "jitdump_truncated"),
            1,
            "stalled tail counted once"
        );
        assert!(t.lookup(v.pid(), 0x2004, 3, &hints).is_none());
        assert_eq!(rejects(&m, "jitdump_truncated"), 1);
        // The rest arrives: parsing resumes.
        std::fs::write(&path, &bytes).expect("write");
        let f = t.lookup(v.pid(), 0x2004, 4, &hints).expect("named");
        assert_eq!(&*f.name, "jitted_b");
    }

    /// A jitdump whose last record never completes is read once, not at every window by
    /// every process mapping it (44 % of a core at 30 processes and a 64 MiB file).
    #[test]
    fn a_jitdump_tail_that_never_completes_is_not_read_again() {
        use crate::process::jit::jitdump::build;
        let v = Victim::new();
        let m = Metrics::new();
        let mut t = JitTables::new(Jit::default(), m.clone());
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join(format!("jit-{}.dump", v.pid()));
        let mut bytes = build::header(v.pid());
        bytes.extend(build::code_load(0x1000, 0x40, "jitted_a"));
        // A record that says it is 8 MiB long, of which 256 KiB were ever written.
        let mut tail = build::code_load(0x2000, 0x40, "never_done");
        tail[4..8].copy_from_slice(&(8u32 << 20).to_le_bytes());
        tail.resize(256 << 10, 0);
        bytes.extend(&tail);
        std::fs::write(&path, &bytes).expect("write");
        let obj = Arc::new(Object::open_local(&path).expect("open"));
        let hints = Hints {
            jvm: false,
            jitdump: Some(obj),
        };
        assert!(t.lookup(v.pid(), 0x1004, 1, &hints).is_some());
        let first = m.jit_read_bytes.get();
        assert!(
            first >= bytes.len() as u64,
            "read {first} of {}",
            bytes.len()
        );
        for window in 2..10 {
            assert!(t.lookup(v.pid(), 0x2004, window, &hints).is_none());
        }
        assert_eq!(
            m.jit_read_bytes.get(),
            first,
            "the incomplete tail was read again"
        );
        assert_eq!(rejects(&m, "jitdump_truncated"), 1, "counted once");
        // It grows, still short of its end: not read either. Then it completes: parsed.
        let mut more = bytes.clone();
        more.resize(bytes.len() + 4096, 0);
        std::fs::write(&path, &more).expect("write");
        assert!(t.lookup(v.pid(), 0x2004, 10, &hints).is_none());
        assert_eq!(m.jit_read_bytes.get(), first);
        let start = bytes.len() - tail.len();
        more.resize(start + (8 << 20), 0);
        more.extend(build::code_load(0x3000, 0x40, "after"));
        std::fs::write(&path, &more).expect("write");
        let f = t
            .lookup(v.pid(), 0x3004, 11, &hints)
            .expect("parsing resumed");
        assert_eq!(&*f.name, "after");
    }

    #[test]
    fn jitdump_paths() {
        assert!(is_jitdump_path("/tmp/jit-123.dump"));
        assert!(is_jitdump_path("jit-1.dump"));
        assert!(!is_jitdump_path("/tmp/jit-.dump"));
        assert!(!is_jitdump_path("/tmp/jit-12a.dump"));
        assert!(!is_jitdump_path("/usr/lib/libjit-1.dump.so"));
    }
}
