//! Parser for JIT symbol maps, `/tmp/perf-<pid>.map`: one `START SIZE name` per line, in
//! hex, bare (Node) or `0x`-prefixed (the JVM's `jcmd Compiler.perfmap`).
//!
//! A pure parser over bytes (the agent's JIT stage, `normalize::jit`, does the file handling).
//! The map is read incrementally: runtimes append to it for as long as they run, so
//! [`PerfMap::feed_bytes`] takes whatever was appended since the last read, and a partial
//! last line waits for the rest. Later entries win over earlier ones for overlapping
//! ranges, as in perf. Names are kept as written, with invalid UTF-8 replaced, and
//! interned in a [`Names`] set shared with other maps.
//!
//! Both the entries and the bytes they hold are capped: a name may be 64 KiB long, so an
//! entry cap alone would let one process's map hold gigabytes.

use std::collections::BTreeMap;

use super::names::Names;

/// Why a line was skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reject {
    /// Not three fields of hex, hex and a name.
    Malformed,
    /// A zero size, or a range that wraps around the address space.
    BadRange,
    /// The per-map entry cap was reached.
    TooMany,
    /// The per-map byte cap was reached.
    TooBig,
}

/// What one entry costs besides its name's bytes: the tree node's share, the range and the
/// shared name's header, rounded up.
pub const ENTRY_OVERHEAD: usize = 64;

/// The bytes charged for one entry named `name` (charged in full even when the name is
/// shared with other entries or maps: the budget errs on the safe side).
pub fn entry_cost(name: &str) -> usize {
    name.len() + ENTRY_OVERHEAD
}

/// The symbols of one process's perf map.
#[derive(Debug, Default)]
pub struct PerfMap {
    /// Ranges by start address; no two overlap.
    ranges: BTreeMap<u64, (u64, std::sync::Arc<str>)>,
    /// A trailing line without its newline yet.
    partial: Vec<u8>,
    /// Inside an overlong line: drop bytes up to the next newline.
    skipping: bool,
    max_entries: usize,
    /// Bytes charged for the entries held ([`entry_cost`] each), and their cap.
    bytes: usize,
    max_bytes: usize,
    names: Names,
    rejected: BTreeMap<Reject, u64>,
}

impl PerfMap {
    /// An empty map holding at most `max_entries` ranges (and no byte cap).
    #[cfg(any(test, fuzzing))]
    pub fn new(max_entries: usize) -> Self {
        Self::with_limits(max_entries, usize::MAX, Names::default())
    }

    /// An empty map holding at most `max_entries` ranges and `max_bytes` bytes, its names
    /// interned in `names`.
    pub fn with_limits(max_entries: usize, max_bytes: usize, names: Names) -> Self {
        Self {
            max_entries,
            max_bytes,
            names,
            ..Default::default()
        }
    }

    /// Adds text appended to the map file; returns the lines skipped, by reason.
    #[cfg(test)]
    pub fn feed(&mut self, text: &str) -> Vec<Reject> {
        self.feed_bytes(text.as_bytes())
    }

    /// Adds bytes appended to the map file; returns the lines skipped, by reason.
    pub fn feed_bytes(&mut self, mut bytes: &[u8]) -> Vec<Reject> {
        let mut rejects = Vec::new();
        if self.skipping {
            // The rest of an overlong line, already counted.
            match bytes.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    self.skipping = false;
                    bytes = &bytes[i + 1..];
                }
                None => return rejects,
            }
        }
        let complete = match bytes.iter().rposition(|&b| b == b'\n') {
            Some(i) => i + 1,
            None => {
                self.hold(bytes, &mut rejects);
                return rejects;
            }
        };
        let mut head = std::mem::take(&mut self.partial);
        let first_end = bytes.iter().position(|&b| b == b'\n').unwrap_or(0) + 1;
        head.extend_from_slice(&bytes[..first_end]);
        let lines =
            std::iter::once(&head[..]).chain(bytes[first_end..complete].split(|&b| b == b'\n'));
        for raw in lines {
            let raw = raw.strip_suffix(b"\n").unwrap_or(raw);
            if raw.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if raw.len() > MAX_LINE {
                self.count(Reject::Malformed, &mut rejects);
                continue;
            }
            let line = String::from_utf8_lossy(raw);
            if let Err(r) = self.add_line(line.trim_end_matches('\r')) {
                self.count(r, &mut rejects);
            }
        }
        self.hold(&bytes[complete..], &mut rejects);
        rejects
    }

    /// Keeps the start of a line whose end has not arrived yet; a line longer than any
    /// JIT name could make is garbage: counted once, and skipped up to its newline.
    fn hold(&mut self, bytes: &[u8], rejects: &mut Vec<Reject>) {
        if self.partial.len() + bytes.len() > MAX_LINE {
            self.partial.clear();
            self.skipping = true;
            self.count(Reject::Malformed, rejects);
        } else {
            self.partial.extend_from_slice(bytes);
        }
    }

    fn count(&mut self, r: Reject, rejects: &mut Vec<Reject>) {
        *self.rejected.entry(r).or_default() += 1;
        rejects.push(r);
    }

    /// Changes the entry and byte caps (the JIT stage shares a global budget between
    /// processes); entries already held stay.
    pub fn set_limits(&mut self, max_entries: usize, max_bytes: usize) {
        self.max_entries = max_entries;
        self.max_bytes = max_bytes;
    }

    /// Bytes charged for the entries held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn add_line(&mut self, line: &str) -> Result<(), Reject> {
        let mut it = line.splitn(3, ' ');
        let (Some(start), Some(size), Some(name)) = (it.next(), it.next(), it.next()) else {
            return Err(Reject::Malformed);
        };
        let start = parse_hex(start).ok_or(Reject::Malformed)?;
        let size = parse_hex(size).ok_or(Reject::Malformed)?;
        let name = name.trim();
        if name.is_empty() {
            return Err(Reject::Malformed);
        }
        let end = start
            .checked_add(size)
            .filter(|_| size > 0)
            .ok_or(Reject::BadRange)?;
        self.insert(start, end, name)
    }

    /// Inserts `[start, end)`, cutting back whatever older ranges it overlaps.
    ///
    /// The older ranges' parts outside the new one stay (a head before it, a tail after
    /// it), so a line strictly inside an older range adds three entries for the one it
    /// removes: the caps are checked on the count and bytes after the whole change, and
    /// when they would be exceeded the older tail is given up first, then the line.
    fn insert(&mut self, start: u64, end: u64, name: &str) -> Result<(), Reject> {
        let overlapping: Vec<(u64, u64, usize)> = self
            .ranges
            .range(..end)
            .rev()
            .take_while(|(_, (e, _))| *e > start)
            .map(|(s, (e, n))| (*s, *e, entry_cost(n)))
            .collect();
        // Overlapping ranges are disjoint and sorted: only the first (lowest) can stick
        // out before `start`, only the last (highest) after `end`.
        let head = overlapping
            .last()
            .filter(|(s, _, _)| *s < start)
            .map(|(_, _, c)| *c);
        let tail = overlapping
            .first()
            .filter(|(_, e, _)| *e > end)
            .map(|(_, _, c)| *c);
        let removed: usize = overlapping.iter().map(|(_, _, c)| c).sum();
        let cost = entry_cost(name);
        let fits = |tail: Option<usize>| {
            let entries = self.ranges.len() - overlapping.len()
                + 1
                + usize::from(head.is_some())
                + usize::from(tail.is_some());
            let bytes =
                self.bytes.saturating_sub(removed) + cost + head.unwrap_or(0) + tail.unwrap_or(0);
            // Growing past a cap is refused; a map already over a lowered cap may still
            // replace what it holds.
            if entries > self.max_entries && entries > self.ranges.len() {
                Err(Reject::TooMany)
            } else if bytes > self.max_bytes && bytes > self.bytes {
                Err(Reject::TooBig)
            } else {
                Ok(())
            }
        };
        let keep_tail = match (tail, fits(tail)) {
            (Some(_), Ok(())) => true,
            (None, Ok(())) => false,
            (Some(_), Err(_)) => {
                fits(None)?;
                false
            }
            (None, Err(r)) => return Err(r),
        };
        for (s, _, c) in overlapping {
            self.bytes = self.bytes.saturating_sub(c);
            if let Some((e, old)) = self.ranges.remove(&s) {
                if s < start {
                    self.bytes += entry_cost(&old);
                    self.ranges.insert(s, (start, old.clone()));
                }
                if e > end && keep_tail {
                    self.bytes += entry_cost(&old);
                    self.ranges.insert(end, (e, old));
                }
            }
        }
        self.bytes += cost;
        self.ranges.insert(start, (end, self.names.intern(name)));
        Ok(())
    }

    /// The name of the range holding `addr`, and `addr`'s offset in it.
    #[cfg(any(test, fuzzing))]
    pub fn lookup(&self, addr: u64) -> Option<(&str, u64)> {
        let (start, (end, name)) = self.ranges.range(..=addr).next_back()?;
        (addr < *end).then(|| (&**name, addr - start))
    }

    /// Like [`PerfMap::lookup`], with the name shared rather than borrowed.
    pub fn lookup_shared(&self, addr: u64) -> Option<(std::sync::Arc<str>, u64)> {
        let (start, (end, name)) = self.ranges.range(..=addr).next_back()?;
        (addr < *end).then(|| (name.clone(), addr - start))
    }

    /// Ranges held.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether the map holds no range.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Lines skipped so far, by reason (`malformed`, `bad_range`, `too_many`).
    #[cfg(test)]
    pub fn rejected(&self) -> &BTreeMap<Reject, u64> {
        &self.rejected
    }
}

/// Longest line kept while waiting for its end; JIT names are far shorter.
const MAX_LINE: usize = 64 << 10;

fn parse_hex(s: &str) -> Option<u64> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_and_prefixed_hex() {
        let mut m = PerfMap::new(100);
        let rejects = m.feed(
            "3ef414c0 398 LazyCompile:~hot_a /app/main.js:3\n\
             0x7f0000001000 0x20 Interpreter\n\
             7f0000002000 10 java.lang.String::hashCode (inlined)\n",
        );
        assert!(rejects.is_empty());
        assert_eq!(
            m.lookup(0x3ef414c0),
            Some(("LazyCompile:~hot_a /app/main.js:3", 0))
        );
        assert_eq!(
            m.lookup(0x3ef414c0 + 0x397),
            Some(("LazyCompile:~hot_a /app/main.js:3", 0x397))
        );
        assert_eq!(m.lookup(0x3ef414c0 + 0x398), None);
        assert_eq!(m.lookup(0x7f0000001010), Some(("Interpreter", 0x10)));
        assert_eq!(
            m.lookup(0x7f000000200f).map(|(n, _)| n),
            Some("java.lang.String::hashCode (inlined)")
        );
    }

    #[test]
    fn later_entries_win_and_older_ones_are_cut() {
        let mut m = PerfMap::new(100);
        m.feed("1000 100 old\n1040 10 new\n");
        assert_eq!(m.lookup(0x1000).map(|r| r.0), Some("old"));
        assert_eq!(m.lookup(0x1045).map(|r| r.0), Some("new"));
        assert_eq!(
            m.lookup(0x1050).map(|r| r.0),
            Some("old"),
            "the tail of the old range stays"
        );
        assert_eq!(
            m.lookup(0x1050).map(|r| r.1),
            Some(0),
            "offsets count from the piece's start"
        );
        m.feed("0f00 400 newest\n");
        assert_eq!(m.len(), 1);
        assert_eq!(m.lookup(0x1045).map(|r| r.0), Some("newest"));
    }

    #[test]
    fn partial_lines_wait_for_their_end() {
        let mut m = PerfMap::new(100);
        m.feed("1000 10 fir");
        assert!(m.is_empty());
        m.feed("st\n2000 1");
        assert_eq!(m.lookup(0x1001).map(|r| r.0), Some("first"));
        m.feed("0 second\n");
        assert_eq!(m.lookup(0x2001).map(|r| r.0), Some("second"));
    }

    #[test]
    fn overlong_lines_are_skipped_whole_however_they_arrive() {
        let mut long = vec![b'x'; MAX_LINE + 10];
        long.extend(b" 1000 10 tail_of_junk\n2000 10 good\n");
        let mut whole = PerfMap::new(10);
        assert_eq!(whole.feed_bytes(&long), [Reject::Malformed]);
        let mut chunked = PerfMap::new(10);
        let mut rejects = Vec::new();
        for c in long.chunks(1000) {
            rejects.extend(chunked.feed_bytes(c));
        }
        assert_eq!(rejects, [Reject::Malformed]);
        for m in [&whole, &chunked] {
            assert_eq!(m.lookup(0x1000), None);
            assert_eq!(m.lookup(0x2000).map(|r| r.0), Some("good"));
        }
    }

    #[test]
    fn garbage_is_counted_not_fatal() {
        let mut m = PerfMap::new(2);
        let rejects = m.feed(
            "not a map line\nzz 10 x\n1000 0 empty\nffffffffffffffff 10 wraps\n1000 10\n\
             11112222333344445555 10 too_long_hex\n1000 10 a\n2000 10 b\n3000 10 c\n",
        );
        assert_eq!(
            rejects,
            [
                Reject::Malformed,
                Reject::Malformed,
                Reject::BadRange,
                Reject::BadRange,
                Reject::Malformed,
                Reject::Malformed,
                Reject::TooMany
            ]
        );
        assert_eq!(m.len(), 2);
        assert_eq!(m.rejected().get(&Reject::Malformed), Some(&4));
        assert_eq!(m.rejected().get(&Reject::TooMany), Some(&1));
        // A replacement within the cap still lands.
        assert!(m.feed("1000 10 a2\n").is_empty());
        assert_eq!(m.lookup(0x1000).map(|r| r.0), Some("a2"));
    }

    #[test]
    fn nested_lines_respect_the_entry_cap() {
        // Each line strictly inside the one before: cutting the older range around it
        // makes a head and a tail piece, and both count toward the cap.
        let mut m = PerfMap::new(3);
        let text: String = (0..1000u64)
            .map(|i| format!("{:x} {:x} n{i}\n", 0x1000 + i, 0x10_0000 - 2 * i))
            .collect();
        m.feed(&text);
        assert!(m.len() <= 3, "{} entries with a cap of 3", m.len());
        assert!(m.rejected().get(&Reject::TooMany).is_some_and(|n| *n > 0));
    }

    #[test]
    fn bytes_are_capped_and_names_shared() {
        let names = Names::default();
        let long = "x".repeat(MAX_LINE - 64);
        let text: String = (1..=100u64)
            .map(|i| format!("{:x} 10 {long}\n", i * 0x1000))
            .collect();
        let cap = 10 * entry_cost(&long);
        let mut a = PerfMap::with_limits(1000, cap, names.clone());
        let mut b = PerfMap::with_limits(1000, cap, names.clone());
        a.feed(&text);
        b.feed(&text);
        for m in [&a, &b] {
            assert_eq!(m.len(), 10);
            assert!(m.bytes() <= cap);
            assert_eq!(m.rejected().get(&Reject::TooBig), Some(&90));
        }
        assert_eq!(names.len(), 1, "one copy of the name for both maps");
        assert_eq!(names.bytes(), long.len());
        drop((a, b));
        names.prune();
        assert!(names.is_empty());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut m = PerfMap::new(16);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut s = String::new();
            for _ in 0..(seed % 40) {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                s.push(b"0123456789abcdefx \n\tZ"[(seed >> 59) as usize % 21] as char);
            }
            let _ = m.feed(&s);
            let _ = m.lookup(seed);
        }
        assert!(m.len() <= 16);
    }
}
