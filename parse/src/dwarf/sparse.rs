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
use std::fmt;
use std::sync::Arc;

use addr2line::gimli;
use gimli::{Reader, ReaderOffsetId, RunTimeEndian};

/// Longest run [`Reader::to_slice`] copies out where spans and gaps meet (names and paths
/// are far shorter; a reader over a whole section is never copied whole).
const MAX_COPY: usize = 1 << 20;

/// The spans loaded of one section, sorted by start offset (never overlapping), and the
/// section's size. A sorted vector rather than a tree: spans are added a unit at a time and
/// read byte by byte, so a reader keeps the index of the span it last read
/// ([`Sparse`]'s hint) and most reads find their bytes there without a search.
#[derive(Debug, Default, Clone)]
pub struct Spans {
    size: u64,
    spans: Vec<(u64, Arc<[u8]>)>,
}

impl Spans {
    /// No span yet of a section of `size` bytes.
    pub fn new(size: u64) -> Self {
        Self {
            size,
            spans: Vec::new(),
        }
    }

    /// The section's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.spans.iter().map(|(_, d)| d.len() as u64).sum()
    }

    /// Index of the first span that ends after `pos` (it holds `pos` or starts after it).
    fn from(&self, pos: u64) -> usize {
        let i = self.spans.partition_point(|(s, _)| *s <= pos);
        match i.checked_sub(1).and_then(|j| self.spans.get(j)) {
            Some((s, d)) if pos < s + d.len() as u64 => i - 1,
            _ => i,
        }
    }

    /// Index of the span holding `pos`, if one does.
    fn holding(&self, pos: u64) -> Option<usize> {
        let i = self.from(pos);
        self.spans.get(i).filter(|(s, _)| *s <= pos).map(|_| i)
    }

    /// The parts of `[start, end)` (clipped to the section) not loaded yet.
    pub fn missing(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let end = end.min(self.size);
        let mut out = Vec::new();
        if start >= end {
            return out;
        }
        let mut at = start;
        for (s, d) in self.spans[self.from(start)..].iter() {
            if *s >= end {
                break;
            }
            if *s > at {
                out.push((at, *s));
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
            let at = self.spans.partition_point(|(s, _)| *s < start);
            self.spans.insert(at, (start, Arc::from(data)));
        }
    }

    /// Shares the spans of `self` that lie inside `[start, end)` with `out`.
    pub fn copy_within(&self, start: u64, end: u64, out: &mut Spans) {
        if start >= end {
            return;
        }
        let first = self.spans.partition_point(|(s, _)| *s < start);
        for (s, d) in self.spans[first..].iter() {
            if *s >= end {
                break;
            }
            if s + d.len() as u64 <= end {
                let at = out.spans.partition_point(|(o, _)| o < s);
                out.spans.insert(at, (*s, d.clone()));
            }
        }
    }

    /// Copies `[at, at + buf.len())` into `buf`, zeros where nothing is loaded.
    fn copy(&self, at: u64, buf: &mut [u8]) {
        buf.fill(0);
        let end = at + buf.len() as u64;
        for (s, d) in self.spans[self.from(at)..].iter() {
            if *s >= end {
                break;
            }
            let (lo, hi) = ((*s).max(at), (s + d.len() as u64).min(end));
            if lo >= hi {
                continue;
            }
            buf[(lo - at) as usize..(hi - at) as usize]
                .copy_from_slice(&d[(lo - s) as usize..(hi - s) as usize]);
        }
    }

    /// The bytes `[at, at + len)` when span `i` holds all of them.
    fn within(&self, i: usize, at: u64, len: u64) -> Option<&[u8]> {
        let (s, d) = self.spans.get(i)?;
        let lo = at.checked_sub(*s)?;
        let hi = lo.checked_add(len)?;
        d.get(usize::try_from(lo).ok()?..usize::try_from(hi).ok()?)
    }

    /// The offset of the first `byte` in `[at, end)`.
    fn find(&self, at: u64, end: u64, byte: u8) -> Option<u64> {
        let mut pos = at;
        let mut i = self.from(at);
        while pos < end {
            match self.spans.get(i) {
                // The span holding `pos`.
                Some((s, d)) if *s <= pos => {
                    let hi = (s + d.len() as u64).min(end);
                    let part = &d[(pos - s) as usize..(hi - s) as usize];
                    if let Some(k) = part.iter().position(|&b| b == byte) {
                        return Some(pos + k as u64);
                    }
                    pos = hi;
                    i += 1;
                }
                // Zeros up to the next span (or the end).
                _ if byte == 0 => return Some(pos),
                Some((s, _)) => pos = (*s).min(end),
                None => pos = end,
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
    /// The span this reader last read from: gimli reads a byte or a word at a time, and
    /// the next read is almost always in the same span.
    hint: usize,
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
            hint: 0,
        }
    }

    fn eof(&self) -> gimli::Error {
        gimli::Error::UnexpectedEof(self.offset_id())
    }

    /// `[pos, end)`: borrowed when one span holds it all, else copied out with zeros
    /// where nothing is loaded (at most [`MAX_COPY`] bytes).
    fn bytes(&self) -> gimli::Result<Cow<'_, [u8]>> {
        let len = self.end - self.pos;
        let i = self.data.holding(self.pos);
        if let Some(bytes) = i.and_then(|i| self.data.within(i, self.pos, len)) {
            return Ok(Cow::Borrowed(bytes));
        }
        let len = usize::try_from(len).map_err(|_| self.eof())?;
        if len > MAX_COPY {
            return Err(self.eof());
        }
        let mut v = vec![0; len];
        self.data.copy(self.pos, &mut v);
        Ok(Cow::Owned(v))
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
        self.bytes()
    }

    fn to_string(&self) -> gimli::Result<Cow<'_, str>> {
        match self.bytes()? {
            Cow::Borrowed(b) => std::str::from_utf8(b)
                .map(Cow::Borrowed)
                .map_err(|_| gimli::Error::BadUtf8),
            Cow::Owned(v) => String::from_utf8(v)
                .map(Cow::Owned)
                .map_err(|_| gimli::Error::BadUtf8),
        }
    }

    fn to_string_lossy(&self) -> gimli::Result<Cow<'_, str>> {
        Ok(match self.bytes()? {
            Cow::Borrowed(b) => String::from_utf8_lossy(b),
            Cow::Owned(v) => Cow::Owned(String::from_utf8_lossy(&v).into_owned()),
        })
    }

    fn read_slice(&mut self, buf: &mut [u8]) -> gimli::Result<()> {
        if buf.len() > self.len() {
            return Err(self.eof());
        }
        let len = buf.len() as u64;
        match self.data.within(self.hint, self.pos, len) {
            Some(bytes) => buf.copy_from_slice(bytes),
            None => match self.data.holding(self.pos) {
                Some(i) => {
                    self.hint = i;
                    match self.data.within(i, self.pos, len) {
                        Some(bytes) => buf.copy_from_slice(bytes),
                        None => self.data.copy(self.pos, buf),
                    }
                }
                None => self.data.copy(self.pos, buf),
            },
        }
        self.pos += len;
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
