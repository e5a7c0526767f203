//! Line tables: which source line an instruction of a code object belongs to, in the
//! three formats CPython 3.8–3.14 store (`Objects/lnotab_notes.txt`, `Objects/locations.md`).
//!
//! Each decoder walks the table as `PyCode_Addr2Line` does in its version and yields the
//! same answers (tested against that function and `co_lines()` of every interpreter on
//! this machine, `testdata/`). The table comes from a profiled process, so it is hostile:
//! the walk is bounded by the table (capped at [`MAX_TABLE`]), a varint has at most five
//! groups, and a malformed table ends the walk (no line) instead of panicking.

#[cfg(test)]
pub(crate) mod tests;

use super::Version;

/// The largest table decoded; bytes past it are ignored (a code object's real table is a
/// few hundred bytes, a forged one is not read further).
pub const MAX_TABLE: usize = 64 * 1024;

/// Groups of six bits in one location-table varint: five cover CPython's 32-bit ints.
const MAX_VARINT_GROUPS: u32 = 5;

/// The format of a code object's line table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TableKind {
    /// ≤3.9 `co_lnotab`: (byte delta, signed line delta) pairs, deltas applied on reaching.
    Lnotab,
    /// 3.10 `co_linetable`: (byte length, signed line delta) pairs, -128 meaning no line.
    Linetable310,
    /// 3.11+ `co_linetable`: the location table, entries of 1–8 code units with varints.
    Locations,
}

/// The line-table format of `v`, or `None` for a version ember does not know.
pub fn kind_for(v: Version) -> Option<TableKind> {
    match (v.major, v.minor) {
        (3, 8..=9) => Some(TableKind::Lnotab),
        (3, 10) => Some(TableKind::Linetable310),
        (3, 11..=14) => Some(TableKind::Locations),
        _ => None,
    }
}

/// A run of bytecode, in bytes from the start of the code, and its line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineRange {
    /// The first byte of the run.
    pub start: u32,
    /// One past its last byte (`u32::MAX` for the open-ended last run of a `co_lnotab`).
    pub end: u32,
    /// Its line; `None` where CPython has none (3.10+), or where the table's arithmetic
    /// leaves 0..=u32::MAX. Line 0 is kept: CPython gives it to artificial instructions
    /// (a module's `RESUME`, 3.11+).
    pub line: Option<u32>,
}

/// The line of the instruction `unit` code units (2 bytes each) into the bytecode, as
/// `PyCode_Addr2Line` gives it; `None` when the table has no line there (or is malformed
/// before reaching it).
pub fn line_at(kind: TableKind, table: &[u8], first_line: u32, unit: u32) -> Option<u32> {
    let byte = u64::from(unit) * 2;
    lines(kind, table, first_line)
        .find(|r| u64::from(r.end) > byte)
        .filter(|r| u64::from(r.start) <= byte)
        .and_then(|r| r.line)
}

/// The runs of the table in order, each non-empty; they cover the code from byte 0 up to
/// the table's end without gaps (a malformed table ends them early).
pub fn lines(kind: TableKind, table: &[u8], first_line: u32) -> Ranges<'_> {
    Ranges {
        kind,
        table: table.get(..MAX_TABLE).unwrap_or(table),
        pos: 0,
        addr: 0,
        line: i64::from(first_line),
        done: false,
    }
}

/// The iterator [`lines`] returns.
#[derive(Clone, Debug)]
pub struct Ranges<'a> {
    kind: TableKind,
    table: &'a [u8],
    /// The next entry's first byte in `table`.
    pos: usize,
    /// The byte offset where the next run starts.
    addr: u32,
    /// The line the deltas so far add up to (wide: forged deltas cannot overflow it).
    line: i64,
    done: bool,
}

impl Iterator for Ranges<'_> {
    type Item = LineRange;

    fn next(&mut self) -> Option<LineRange> {
        if self.done {
            return None;
        }
        let r = match self.kind {
            TableKind::Lnotab => self.next_lnotab(),
            TableKind::Linetable310 => self.next_310(),
            TableKind::Locations => self.next_location(),
        };
        if r.is_none() {
            self.done = true;
        }
        r
    }
}

/// A line as [`LineRange`] reports it: `None` outside 0..=u32::MAX.
fn checked_line(line: i64) -> Option<u32> {
    u32::try_from(line).ok()
}

impl Ranges<'_> {
    /// A run of `len` bytes from the current address, on `line`.
    fn run(&mut self, len: u32, line: Option<u32>) -> LineRange {
        let start = self.addr;
        self.addr = self.addr.saturating_add(len);
        LineRange {
            start,
            end: self.addr,
            line,
        }
    }

    /// The next (byte count, signed line delta) pair of a ≤3.10 table.
    fn pair(&mut self) -> Option<(u8, i8)> {
        let &[bytes, delta] = self.table.get(self.pos..self.pos.saturating_add(2))? else {
            return None;
        };
        self.pos += 2;
        Some((bytes, delta as i8))
    }

    /// `co_lnotab`: a pair's line delta applies from the address its byte delta reaches,
    /// so a run spans the byte deltas between line changes; the last run never ends.
    fn next_lnotab(&mut self) -> Option<LineRange> {
        while let Some((bytes, delta)) = self.pair() {
            let line = checked_line(self.line);
            self.line += i64::from(delta);
            if bytes != 0 {
                return Some(self.run(u32::from(bytes), line));
            }
        }
        if self.addr == u32::MAX {
            return None;
        }
        let line = checked_line(self.line);
        Some(self.run(u32::MAX, line))
    }

    /// 3.10 `co_linetable`: each pair is a run of `bytes` bytes whose line is the sum of the
    /// deltas so far, or none for -128 (which leaves the sum unchanged); empty runs only
    /// carry their delta.
    fn next_310(&mut self) -> Option<LineRange> {
        while let Some((bytes, delta)) = self.pair() {
            let line = if delta == -128 {
                None
            } else {
                self.line += i64::from(delta);
                checked_line(self.line)
            };
            if bytes != 0 {
                return Some(self.run(u32::from(bytes), line));
            }
        }
        None
    }

    /// 3.11+ location table: an entry's first byte has bit 7 set, its code in bits 3–6 and
    /// its length in code units minus one in bits 0–2; codes 13 and 14 start with a signed
    /// varint line delta, 10–12 add 0–2 lines, 15 has no location, 0–9 stay on the line.
    /// The entry's other bytes never have bit 7 set, which is how the next one is found.
    fn next_location(&mut self) -> Option<LineRange> {
        let first = *self.table.get(self.pos)?;
        if first & 0x80 == 0 {
            return None;
        }
        let code = (first >> 3) & 15;
        let delta = match code {
            13 | 14 => self.signed_varint(self.pos + 1)?,
            10..=12 => i64::from(code - 10),
            _ => 0,
        };
        self.line += delta;
        let line = if code == 15 {
            None
        } else {
            checked_line(self.line)
        };
        self.pos += 1;
        while self.table.get(self.pos).is_some_and(|b| b & 0x80 == 0) {
            self.pos += 1;
        }
        let units = u32::from(first & 7) + 1;
        Some(self.run(units * 2, line))
    }

    /// The location table's signed varint at `at`: six bits a group, least significant
    /// first, bit 6 continuing; the sign in bit 0 of the result. `None` when it runs past
    /// the table or over [`MAX_VARINT_GROUPS`].
    fn signed_varint(&self, at: usize) -> Option<i64> {
        let mut value: u64 = 0;
        for group in 0..MAX_VARINT_GROUPS {
            let b = *self.table.get(at + group as usize)?;
            value |= u64::from(b & 63) << (6 * group);
            if b & 64 == 0 {
                let magnitude = (value >> 1) as i64;
                return Some(if value & 1 == 1 {
                    -magnitude
                } else {
                    magnitude
                });
            }
        }
        None
    }
}
