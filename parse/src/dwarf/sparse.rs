//! A DWARF section of which ember holds only some byte ranges ("spans"), read through a
//! gimli [`Reader`] that sees the whole section at its real offsets and zeros wherever
//! nothing was loaded.
//!
//! Why zeros: in every DWARF structure ember reads partially, a zero is a terminator (the
//! end of an abbreviation table, a NUL ending a string, a `(0, 0)` pair ending a
//! `.debug_ranges` list, `DW_RLE_end_of_list`, a null DIE), so a span that stops short cuts
//! the structure instead of running into garbage; and offsets stay those the file's other
//! sections refer to, so gimli and addr2line need no change to read a few units of a huge
//! section.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use addr2line::gimli;
use gimli::{Reader, ReaderOffsetId, RunTimeEndian};

/// Longest run [`Reader::to_slice`] copies out (names and paths are far shorter; a reader
/// over a whole section is never copied whole).
const MAX_COPY: usize = 1 << 20;

/// The spans loaded of one section, by start offset (never overlapping), and the section's
/// size.
#[derive(Debug, Default, Clone)]
pub struct Spans {
    size: u64,
    spans: BTreeMap<u64, Arc<[u8]>>,
}

impl Spans {
    /// No span yet of a section of `size` bytes.
    pub fn new(size: u64) -> Self {
        Self {
            size,
            spans: BTreeMap::new(),
        }
    }

    /// The section's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.spans.values().map(|s| s.len() as u64).sum()
    }

    /// The parts of `[start, end)` (clipped to the section) not loaded yet.
    pub fn missing(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let end = end.min(self.size);
        let mut out = Vec::new();
        if start >= end {
            return out;
        }
        let mut at = start;
        if let Some((&s, d)) = self.spans.range(..=start).next_back() {
            at = at.max(s + d.len() as u64);
        }
        for (&s, d) in self.spans.range(start..end) {
            if s > at {
                out.push((at, s));
            }
            at = at.max(s + d.len() as u64);
        }
        if at < end {
            out.push((at, end));
        }
        out
    }

    /// Adds `data` at `start` (a range [`Spans::missing`] returned: no overlap).
    pub fn insert(&mut self, start: u64, data: Vec<u8>) {
        if !data.is_empty() {
            self.spans.insert(start, Arc::from(data));
        }
    }

    /// Shares the spans of `self` that lie inside `[start, end)` with `out`.
    pub fn copy_within(&self, start: u64, end: u64, out: &mut Spans) {
        if start >= end {
            return;
        }
        for (&s, d) in self.spans.range(start..end) {
            if s + d.len() as u64 <= end {
                out.spans.insert(s, d.clone());
            }
        }
    }

    /// Copies `[at, at + buf.len())` into `buf`, zeros where nothing is loaded.
    fn copy(&self, at: u64, buf: &mut [u8]) {
        buf.fill(0);
        let end = at + buf.len() as u64;
        let first = self.spans.range(..=at).next_back().map_or(at, |(&s, _)| s);
        for (&s, d) in self.spans.range(first..end) {
            let (lo, hi) = (s.max(at), (s + d.len() as u64).min(end));
            if lo >= hi {
                continue;
            }
            buf[(lo - at) as usize..(hi - at) as usize]
                .copy_from_slice(&d[(lo - s) as usize..(hi - s) as usize]);
        }
    }

    /// The offset of the first `byte` in `[at, end)`.
    fn find(&self, at: u64, end: u64, byte: u8) -> Option<u64> {
        let mut pos = at;
        while pos < end {
            // The span holding `pos`, if any; else zeros up to the next span.
            let holding = self
                .spans
                .range(..=pos)
                .next_back()
                .filter(|(&s, d)| pos < s + d.len() as u64);
            match holding {
                Some((&s, d)) => {
                    let hi = (s + d.len() as u64).min(end);
                    let part = &d[(pos - s) as usize..(hi - s) as usize];
                    if let Some(i) = part.iter().position(|&b| b == byte) {
                        return Some(pos + i as u64);
                    }
                    pos = hi;
                }
                None if byte == 0 => return Some(pos),
                None => {
                    pos = self.spans.range(pos..end).next().map_or(end, |(&s, _)| s);
                }
            }
        }
        None
    }
}

/// A gimli reader over [`Spans`]: `[pos, end)` of the section.
#[derive(Clone)]
pub struct Sparse {
    data: Arc<Spans>,
    pos: u64,
    end: u64,
    endian: RunTimeEndian,
}

impl fmt::Debug for Sparse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sparse({:#x}..{:#x})", self.pos, self.end)
    }
}

impl Sparse {
    /// The whole of `data`'s section.
    pub fn new(data: Arc<Spans>, endian: RunTimeEndian) -> Self {
        let end = data.size;
        Self {
            data,
            pos: 0,
            end,
            endian,
        }
    }

    fn eof(&self) -> gimli::Error {
        gimli::Error::UnexpectedEof(self.offset_id())
    }

    fn copy_out(&self) -> gimli::Result<Vec<u8>> {
        let len = usize::try_from(self.end - self.pos).map_err(|_| self.eof())?;
        if len > MAX_COPY {
            return Err(self.eof());
        }
        let mut v = vec![0; len];
        self.data.copy(self.pos, &mut v);
        Ok(v)
    }
}

impl Reader for Sparse {
    type Endian = RunTimeEndian;
    type Offset = usize;

    fn endian(&self) -> RunTimeEndian {
        self.endian
    }

    fn len(&self) -> usize {
        (self.end - self.pos) as usize
    }

    fn empty(&mut self) {
        self.end = self.pos;
    }

    fn truncate(&mut self, len: usize) -> gimli::Result<()> {
        if len > self.len() {
            return Err(self.eof());
        }
        self.end = self.pos + len as u64;
        Ok(())
    }

    fn offset_from(&self, base: &Self) -> usize {
        self.pos.saturating_sub(base.pos) as usize
    }

    fn offset_id(&self) -> ReaderOffsetId {
        ReaderOffsetId(self.pos)
    }

    fn lookup_offset_id(&self, id: ReaderOffsetId) -> Option<usize> {
        (id.0 >= self.pos && id.0 <= self.end).then(|| (id.0 - self.pos) as usize)
    }

    fn find(&self, byte: u8) -> gimli::Result<usize> {
        self.data
            .find(self.pos, self.end, byte)
            .map(|at| (at - self.pos) as usize)
            .ok_or_else(|| self.eof())
    }

    fn skip(&mut self, len: usize) -> gimli::Result<()> {
        if len > self.len() {
            return Err(self.eof());
        }
        self.pos += len as u64;
        Ok(())
    }

    fn split(&mut self, len: usize) -> gimli::Result<Self> {
        if len > self.len() {
            return Err(self.eof());
        }
        let mut head = self.clone();
        head.end = self.pos + len as u64;
        self.pos = head.end;
        Ok(head)
    }

    fn to_slice(&self) -> gimli::Result<Cow<'_, [u8]>> {
        self.copy_out().map(Cow::Owned)
    }

    fn to_string(&self) -> gimli::Result<Cow<'_, str>> {
        String::from_utf8(self.copy_out()?)
            .map(Cow::Owned)
            .map_err(|_| gimli::Error::BadUtf8)
    }

    fn to_string_lossy(&self) -> gimli::Result<Cow<'_, str>> {
        Ok(Cow::Owned(
            String::from_utf8_lossy(&self.copy_out()?).into_owned(),
        ))
    }

    fn read_slice(&mut self, buf: &mut [u8]) -> gimli::Result<()> {
        if buf.len() > self.len() {
            return Err(self.eof());
        }
        self.data.copy(self.pos, buf);
        self.pos += buf.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans() -> Arc<Spans> {
        let mut s = Spans::new(100);
        s.insert(10, b"abc\0de".to_vec());
        s.insert(40, b"xyz".to_vec());
        Arc::new(s)
    }

    #[test]
    fn reads_zeros_between_spans_at_real_offsets() {
        let s = spans();
        assert_eq!(s.missing(0, 100), vec![(0, 10), (16, 40), (43, 100)]);
        assert_eq!(s.missing(11, 14), vec![]);
        let mut r = Sparse::new(s, RunTimeEndian::Little);
        assert_eq!(r.len(), 100);
        let mut buf = [9u8; 8];
        r.skip(8).expect("skip");
        r.read_slice(&mut buf).expect("read");
        assert_eq!(&buf, b"\0\0abc\0de");
        assert_eq!(r.find(b'x').expect("x"), 40 - 16);
        assert_eq!(r.find(0).expect("nul"), 0);
        let mut s2 = r.clone();
        s2.skip(24).expect("skip");
        let head = s2.split(3).expect("split");
        assert_eq!(&*head.to_slice().expect("slice"), b"xyz");
        assert!(r.find(b'q').is_err());
        let mut short = [0u8; 200];
        assert!(r.read_slice(&mut short).is_err());
    }

    #[test]
    fn large_copies_are_refused() {
        let r = Sparse::new(Arc::new(Spans::new(64 << 20)), RunTimeEndian::Little);
        assert!(r.to_slice().is_err());
    }
}
