//! Parser for jitdump files (`jit-<pid>.dump`), the binary JIT log perf defines in
//! `tools/perf/Documentation/jitdump-specification.txt`.
//!
//! A pure parser over bytes: [`JitDump::feed`] takes the bytes from the end of the last
//! complete record to the end of the file and says how many it consumed, so the caller
//! re-reads only what was appended, and a record still being written (a truncated tail)
//! simply waits. `CODE_LOAD` and `CODE_MOVE` name code ranges; `DEBUG_INFO` (written just
//! before the `CODE_LOAD` it describes) adds file and line. Every other record is skipped.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::names::Names;

/// Why (part of) a jitdump was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reject {
    /// Not a jitdump (bad magic), or another byte order / an unknown version.
    BadHeader,
    /// A record whose size cannot be right; the rest of the file is ignored.
    Malformed,
    /// A zero-sized or wrapping code range.
    BadRange,
    /// The entry cap was reached.
    TooMany,
    /// The byte cap was reached (code ranges with their debug lines, or debug lines
    /// waiting for their code).
    TooBig,
}

/// What one code range costs besides its name and lines, rounded up.
const ENTRY_OVERHEAD: usize = 64;
/// What one debug line costs besides its file name's text.
const LINE_COST: usize = std::mem::size_of::<DebugLine>();

/// One source position: code from `addr` on comes from `file:line`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebugLine {
    /// First address this line covers.
    pub addr: u64,
    /// Source line.
    pub line: u32,
    /// Source file.
    pub file: Arc<str>,
}

#[derive(Debug, Clone)]
struct Code {
    end: u64,
    name: Arc<str>,
    lines: Arc<[DebugLine]>,
    /// Bytes charged for this range: name, lines and their distinct file names.
    cost: usize,
}

/// What an address in jitted code resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit<'a> {
    /// The function's name.
    pub name: &'a Arc<str>,
    /// Offset of the address in the function.
    pub offset: u64,
    /// Source position, when `DEBUG_INFO` gave one.
    pub source: Option<&'a DebugLine>,
}

/// The code ranges of one process's jitdump.
#[derive(Debug, Default)]
pub struct JitDump {
    header_seen: bool,
    /// A malformed record was met: nothing after it can be trusted.
    broken: bool,
    code: BTreeMap<u64, Code>,
    /// `DEBUG_INFO` waiting for its `CODE_LOAD`, by code address.
    pending_debug: HashMap<u64, (Arc<[DebugLine]>, usize)>,
    /// Bytes charged for `pending_debug`.
    pending_bytes: usize,
    max_entries: usize,
    /// Bytes charged for the code ranges held, and their cap.
    bytes: usize,
    max_bytes: usize,
    names: Names,
}

const MAGIC: u32 = 0x4A69_5444;
const HEADER_MIN: usize = 40;
const RECORD_HEADER: usize = 16;
/// A record larger than this is taken as corruption (real ones hold one function's code).
const MAX_RECORD: usize = 64 << 20;
const MAX_NAME: usize = 4096;
const MAX_DEBUG_ENTRIES: u64 = 65_536;
/// Debug info held for code not loaded yet.
const MAX_PENDING_DEBUG: usize = 1024;

const CODE_LOAD: u32 = 0;
const CODE_MOVE: u32 = 1;
const DEBUG_INFO: u32 = 2;

impl JitDump {
    /// An empty dump holding at most `max_entries` code ranges (and no byte cap).
    #[cfg(any(test, fuzzing))]
    pub fn new(max_entries: usize) -> Self {
        Self::with_limits(max_entries, usize::MAX, Names::default())
    }

    /// An empty dump holding at most `max_entries` code ranges and `max_bytes` bytes
    /// (debug lines waiting for their code count too), names interned in `names`.
    pub fn with_limits(max_entries: usize, max_bytes: usize, names: Names) -> Self {
        Self {
            max_entries,
            max_bytes,
            names,
            ..Default::default()
        }
    }

    /// Changes the entry and byte caps; entries already held stay.
    pub fn set_limits(&mut self, max_entries: usize, max_bytes: usize) {
        self.max_entries = max_entries;
        self.max_bytes = max_bytes;
    }

    /// Whether the file header was read (records follow it).
    pub fn header_seen(&self) -> bool {
        self.header_seen
    }

    /// Whether a malformed header or record stopped parsing for good.
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// Bytes charged for what is held (code ranges and pending debug lines).
    pub fn bytes(&self) -> usize {
        self.bytes + self.pending_bytes
    }

    /// Parses `bytes`, which start where the previous call's consumed bytes ended.
    /// Returns how many bytes were consumed (whole records only) and what was rejected.
    pub fn feed(&mut self, bytes: &[u8]) -> (usize, Vec<Reject>) {
        let mut rejects = Vec::new();
        if self.broken {
            return (0, rejects);
        }
        let mut pos = 0;
        if !self.header_seen {
            if bytes.len() < HEADER_MIN {
                return (0, rejects);
            }
            let (magic, version, size) = (u32_at(bytes, 0), u32_at(bytes, 4), u32_at(bytes, 8));
            if magic != MAGIC || version != 1 || (size as usize) < HEADER_MIN {
                self.broken = true;
                rejects.push(Reject::BadHeader);
                return (0, rejects);
            }
            if bytes.len() < size as usize {
                return (0, rejects);
            }
            self.header_seen = true;
            pos = size as usize;
        }
        while let Some(head) = bytes.get(pos..pos + RECORD_HEADER) {
            let (id, size) = (u32_at(head, 0), u32_at(head, 4) as usize);
            if !(RECORD_HEADER..=MAX_RECORD).contains(&size) {
                self.broken = true;
                rejects.push(Reject::Malformed);
                break;
            }
            let Some(record) = bytes.get(pos..pos + size) else {
                break; // still being written
            };
            let body = &record[RECORD_HEADER..];
            let result = match id {
                CODE_LOAD => self.code_load(body),
                CODE_MOVE => self.code_move(body),
                DEBUG_INFO => self.debug_info(body),
                _ => Ok(()),
            };
            if let Err(r) = result {
                rejects.push(r);
            }
            pos += size;
        }
        (pos, rejects)
    }

    fn code_load(&mut self, b: &[u8]) -> Result<(), Reject> {
        // pid u32, tid u32, vma u64, code_addr u64, code_size u64, code_index u64, name\0, code.
        if b.len() < 40 {
            return Err(Reject::Malformed);
        }
        let (addr, size) = (u64_at(b, 16), u64_at(b, 24));
        let (name, _) = c_string(&b[40..]).ok_or(Reject::Malformed)?;
        let (lines, lines_cost) = self.pending_debug.remove(&addr).unwrap_or_default();
        self.pending_bytes = self.pending_bytes.saturating_sub(lines_cost);
        let name = self.names.intern(&name);
        let cost = ENTRY_OVERHEAD + name.len() + lines_cost;
        self.insert(addr, size, name, lines, cost)
    }

    fn code_move(&mut self, b: &[u8]) -> Result<(), Reject> {
        // pid u32, tid u32, vma u64, old_code_addr u64, new_code_addr u64, code_size u64, index u64.
        if b.len() < 48 {
            return Err(Reject::Malformed);
        }
        let (old, new, size) = (u64_at(b, 16), u64_at(b, 24), u64_at(b, 32));
        let Some(code) = self.code.remove(&old) else {
            return Ok(()); // moving code we never saw: nothing to name
        };
        self.bytes = self.bytes.saturating_sub(code.cost);
        let delta = new.wrapping_sub(old);
        let lines: Vec<DebugLine> = code
            .lines
            .iter()
            .map(|l| DebugLine {
                addr: l.addr.wrapping_add(delta),
                ..l.clone()
            })
            .collect();
        self.insert(new, size, code.name, lines.into(), code.cost)
    }

    fn debug_info(&mut self, b: &[u8]) -> Result<(), Reject> {
        // code_addr u64, nr_entry u64, then entries {addr u64, lineno u32, discrim u32, name\0}.
        if b.len() < 16 {
            return Err(Reject::Malformed);
        }
        let (addr, n) = (u64_at(b, 0), u64_at(b, 8));
        if n > MAX_DEBUG_ENTRIES {
            return Err(Reject::Malformed);
        }
        // Every entry takes at least 17 bytes of the record, so `n` is checked against
        // the record before anything is allocated for it.
        if n.saturating_mul(17) > (b.len() - 16) as u64 {
            return Err(Reject::Malformed);
        }
        let mut lines = Vec::with_capacity(n as usize);
        let mut cost = 0usize;
        let mut rest = &b[16..];
        let mut last_file: Option<Arc<str>> = None;
        for _ in 0..n {
            if rest.len() < 16 {
                return Err(Reject::Malformed);
            }
            let (a, line) = (u64_at(rest, 0), u32_at(rest, 8));
            let (file, len) = c_string(&rest[16..]).ok_or(Reject::Malformed)?;
            // `len` counts the bytes in the file, not in the (lossily decoded) string.
            rest = &rest[16 + len + 1..];
            // Consecutive entries nearly always share the file: share the string too.
            let file = match &last_file {
                Some(f) if **f == *file => f.clone(),
                _ => {
                    cost += file.len();
                    self.names.intern(&file)
                }
            };
            cost += LINE_COST;
            last_file = Some(file.clone());
            lines.push(DebugLine {
                addr: a,
                line,
                file,
            });
        }
        lines.sort_by_key(|l| l.addr);
        // Lines for code that never loads must not pile up: the waiting ones are
        // dropped when their count or bytes would pass the caps.
        let room = self.max_bytes.saturating_sub(self.bytes);
        if cost > room {
            return Err(Reject::TooBig);
        }
        if self.pending_debug.len() >= MAX_PENDING_DEBUG || self.pending_bytes + cost > room {
            self.pending_debug.clear();
            self.pending_bytes = 0;
        }
        if let Some((_, old)) = self.pending_debug.insert(addr, (lines.into(), cost)) {
            self.pending_bytes = self.pending_bytes.saturating_sub(old);
        }
        self.pending_bytes += cost;
        Ok(())
    }

    /// Adds `[start, start + size)`; older ranges it overlaps are dropped (later wins).
    fn insert(
        &mut self,
        start: u64,
        size: u64,
        name: Arc<str>,
        lines: Arc<[DebugLine]>,
        cost: usize,
    ) -> Result<(), Reject> {
        let end = start
            .checked_add(size)
            .filter(|_| size > 0)
            .ok_or(Reject::BadRange)?;
        let overlapping: Vec<u64> = self
            .code
            .range(..end)
            .rev()
            .take_while(|(_, c)| c.end > start)
            .map(|(s, _)| *s)
            .collect();
        if overlapping.is_empty() && self.code.len() >= self.max_entries {
            return Err(Reject::TooMany);
        }
        let freed: usize = overlapping
            .iter()
            .filter_map(|s| self.code.get(s))
            .map(|c| c.cost)
            .sum();
        let after = self.bytes.saturating_sub(freed) + cost + self.pending_bytes;
        if after > self.max_bytes && after > self.bytes() {
            return Err(Reject::TooBig);
        }
        for s in overlapping {
            if let Some(c) = self.code.remove(&s) {
                self.bytes = self.bytes.saturating_sub(c.cost);
            }
        }
        self.bytes += cost;
        self.code.insert(
            start,
            Code {
                end,
                name,
                lines,
                cost,
            },
        );
        Ok(())
    }

    /// The function holding `addr`, and its source position when known.
    pub fn lookup(&self, addr: u64) -> Option<Hit<'_>> {
        let (start, code) = self.code.range(..=addr).next_back()?;
        if addr >= code.end {
            return None;
        }
        let i = code.lines.partition_point(|l| l.addr <= addr);
        Some(Hit {
            name: &code.name,
            offset: addr - start,
            source: i.checked_sub(1).and_then(|i| code.lines.get(i)),
        })
    }

    /// Code ranges held.
    pub fn len(&self) -> usize {
        self.code.len()
    }

    /// Whether no code range is held.
    pub fn is_empty(&self) -> bool {
        self.code.is_empty()
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        w.copy_from_slice(s);
    }
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        w.copy_from_slice(s);
    }
    u64::from_le_bytes(w)
}

/// The NUL-terminated string at the start of `b` (lossy UTF-8), capped in length, and
/// its length in bytes (without the NUL).
fn c_string(b: &[u8]) -> Option<(String, usize)> {
    let end = b.iter().take(MAX_NAME + 1).position(|&x| x == 0)?;
    Some((String::from_utf8_lossy(&b[..end]).into_owned(), end))
}

/// Builds jitdump bytes, for tests and benchmarks.
#[cfg(any(test, feature = "testing"))]
pub mod build {
    /// The file header for `pid`.
    pub fn header(pid: u32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&super::MAGIC.to_le_bytes());
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(&40u32.to_le_bytes());
        v.extend_from_slice(&62u32.to_le_bytes()); // EM_X86_64
        v.extend_from_slice(&0u32.to_le_bytes());
        v.extend_from_slice(&pid.to_le_bytes());
        v.extend_from_slice(&0u64.to_le_bytes());
        v.extend_from_slice(&0u64.to_le_bytes());
        v
    }

    fn record(id: u32, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&id.to_le_bytes());
        v.extend_from_slice(&(16 + body.len() as u32).to_le_bytes());
        v.extend_from_slice(&0u64.to_le_bytes());
        v.extend_from_slice(body);
        v
    }

    /// A `CODE_LOAD` of `size` bytes at `addr` named `name` (with `size` bytes of code).
    pub fn code_load(addr: u64, size: u64, name: &str) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        for x in [addr, addr, size, 0] {
            b.extend_from_slice(&x.to_le_bytes());
        }
        b.extend_from_slice(name.as_bytes());
        b.push(0);
        b.resize(b.len() + size.min(64) as usize, 0xcc);
        record(super::CODE_LOAD, &b)
    }

    /// A `CODE_MOVE` from `old` to `new`.
    pub fn code_move(old: u64, new: u64, size: u64) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        for x in [new, old, new, size, 0] {
            b.extend_from_slice(&x.to_le_bytes());
        }
        record(super::CODE_MOVE, &b)
    }

    /// A `DEBUG_INFO` for code at `addr`: `(address, line, file)` entries.
    pub fn debug_info(addr: u64, entries: &[(u64, u32, &str)]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&addr.to_le_bytes());
        b.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        for (a, line, file) in entries {
            b.extend_from_slice(&a.to_le_bytes());
            b.extend_from_slice(&line.to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
            b.extend_from_slice(file.as_bytes());
            b.push(0);
        }
        record(super::DEBUG_INFO, &b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name_at(d: &JitDump, addr: u64) -> Option<String> {
        d.lookup(addr).map(|h| h.name.to_string())
    }

    #[test]
    fn load_move_and_debug_info() {
        let mut bytes = build::header(7);
        bytes.extend(build::debug_info(
            0x1000,
            &[(0x1000, 10, "a.js"), (0x1010, 12, "a.js")],
        ));
        bytes.extend(build::code_load(0x1000, 0x40, "hot_a"));
        bytes.extend(build::code_load(0x2000, 0x40, "hot_b"));
        bytes.extend(build::code_move(0x2000, 0x3000, 0x40));
        let mut d = JitDump::new(100);
        let (used, rejects) = d.feed(&bytes);
        assert_eq!(used, bytes.len());
        assert!(rejects.is_empty(), "{rejects:?}");
        assert_eq!(name_at(&d, 0x1000).as_deref(), Some("hot_a"));
        let h = d.lookup(0x1018).expect("hit");
        assert_eq!((h.offset, h.source.map(|s| s.line)), (0x18, Some(12)));
        assert_eq!(h.source.map(|s| &*s.file), Some("a.js"));
        assert_eq!(name_at(&d, 0x2000), None, "moved away");
        assert_eq!(name_at(&d, 0x3020).as_deref(), Some("hot_b"));
        assert_eq!(name_at(&d, 0x3040), None);
    }

    #[test]
    fn truncated_tail_waits_for_the_rest() {
        let mut bytes = build::header(7);
        bytes.extend(build::code_load(0x1000, 0x40, "first"));
        let whole = bytes.len();
        bytes.extend(build::code_load(0x2000, 0x40, "second"));
        let mut d = JitDump::new(100);
        // Everything up to a cut in the middle of the second record.
        let (used, rejects) = d.feed(&bytes[..whole + 30]);
        assert_eq!(used, whole);
        assert!(rejects.is_empty());
        assert_eq!(d.len(), 1);
        // The rest arrives: parsing resumes where the whole records ended.
        let (more, _) = d.feed(&bytes[used..]);
        assert_eq!(used + more, bytes.len());
        assert_eq!(name_at(&d, 0x2001).as_deref(), Some("second"));
        // A header cut short is no error either.
        assert_eq!(JitDump::new(1).feed(&bytes[..20]), (0, vec![]));
    }

    #[test]
    fn garbage_is_rejected_not_fatal() {
        let mut d = JitDump::new(100);
        assert_eq!(d.feed(&[0xab; 64]), (0, vec![Reject::BadHeader]));
        assert_eq!(d.feed(&build::header(1)), (0, vec![]), "stays rejected");

        let mut bytes = build::header(7);
        bytes.extend(build::code_load(0x1000, 0, "empty"));
        bytes.extend(build::code_load(u64::MAX - 4, 0x40, "wraps"));
        bytes.extend([1, 0, 0, 0, 4, 0, 0, 0]); // a record claiming 4 bytes
        bytes.extend([0; 8]);
        bytes.extend(build::code_load(0x2000, 0x40, "after_garbage"));
        let mut d = JitDump::new(100);
        let (_, rejects) = d.feed(&bytes);
        assert_eq!(
            rejects,
            [Reject::BadRange, Reject::BadRange, Reject::Malformed]
        );
        assert!(d.is_empty());
    }

    #[test]
    fn invalid_utf8_file_names_keep_their_byte_length() {
        // Found by cargo-fuzz: "\xe6" decodes to a 3-byte U+FFFD; the next entry starts
        // after the 1 byte in the file, not after 3.
        let mut bytes = build::header(7);
        let mut di = build::debug_info(0x1000, &[(0x1000, 1, ""), (0x1008, 2, "b.js")]);
        // Replace the first file name (an empty string) by one invalid byte.
        let at = 16 + 16 + 16;
        di.insert(at, 0xe6);
        let size = u32::from_le_bytes([di[4], di[5], di[6], di[7]]) + 1;
        di[4..8].copy_from_slice(&size.to_le_bytes());
        bytes.extend(di);
        bytes.extend(build::code_load(0x1000, 0x40, "f"));
        let mut d = JitDump::new(10);
        let (used, rejects) = d.feed(&bytes);
        assert_eq!((used, rejects), (bytes.len(), vec![]));
        let h = d.lookup(0x100a).expect("hit");
        assert_eq!(h.source.map(|s| (&*s.file, s.line)), Some(("b.js", 2)));
        let h = d.lookup(0x1001).expect("hit");
        assert_eq!(h.source.map(|s| (&*s.file, s.line)), Some(("\u{fffd}", 1)));
    }

    #[test]
    fn entry_cap_holds() {
        let mut bytes = build::header(7);
        for i in 0..10u64 {
            bytes.extend(build::code_load(0x1000 * (i + 1), 0x40, "f"));
        }
        let mut d = JitDump::new(3);
        let (_, rejects) = d.feed(&bytes);
        assert_eq!(d.len(), 3);
        assert_eq!(rejects.len(), 7);
        assert!(rejects.iter().all(|r| *r == Reject::TooMany));
    }

    #[test]
    fn byte_cap_holds_with_debug_lines() {
        let file = "f".repeat(4000);
        let mut bytes = build::header(7);
        for i in 0..50u64 {
            let addr = 0x1000 * (i + 1);
            let f = format!("{file}{i}");
            bytes.extend(build::debug_info(addr, &[(addr, 1, &f), (addr + 8, 2, &f)]));
            bytes.extend(build::code_load(addr, 0x40, "f"));
        }
        let cap = 100_000;
        let mut d = JitDump::with_limits(1000, cap, Names::default());
        let (_, rejects) = d.feed(&bytes);
        assert!(d.bytes() <= cap, "{} bytes held", d.bytes());
        assert!(d.len() >= 10 && d.len() < 50, "{} ranges", d.len());
        assert!(rejects.contains(&Reject::TooBig));
        // A debug record claiming more entries than it has bytes for allocates nothing.
        let mut lie = build::debug_info(0x9000, &[(0x9000, 1, "a")]);
        lie[24..32].copy_from_slice(&65_536u64.to_le_bytes());
        let mut d = JitDump::new(10);
        let mut bytes = build::header(7);
        bytes.extend(lie);
        assert_eq!(d.feed(&bytes).1, [Reject::Malformed]);
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut seed = 0x1234_5678_9abc_def0u64;
        for _ in 0..500 {
            let mut bytes = build::header(1);
            for _ in 0..(seed % 300) {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                bytes.push((seed >> 56) as u8 & if seed & 1 == 0 { 0x3 } else { 0xff });
            }
            let mut d = JitDump::new(8);
            let (used, _) = d.feed(&bytes);
            assert!(used <= bytes.len());
            let _ = d.lookup(seed);
        }
    }
}
