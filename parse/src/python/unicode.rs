//! `str` objects (PEP 393 `PyASCIIObject` / `PyCompactUnicodeObject`) read from a profiled
//! process: [`header`] reads the object's head and says where its characters are and how
//! many bytes they take, so the caller does two bounded reads; [`decode`] turns those bytes
//! into a `String`.
//!
//! The `state` bit field (`Include/cpython/unicodeobject.h`): `interned:2, kind:3,
//! compact:1, ascii:1`, then `ready:1` (≤3.11) or `statically_allocated:1` (3.12+) — the
//! same bits in every GIL build 3.8–3.14 and in 3.13t. 3.14t makes `interned` a whole
//! byte (it is written atomically), which moves the others up by 6 bits.
//!
//! Only compact strings are decoded: every string the compiler makes (names, file names)
//! is compact; a legacy one (a `str` subclass instance) is refused, for the caller to count.
//! Lone surrogates (U+D800–U+DFFF, which Python allows, e.g. file names decoded with
//! `surrogateescape`) become U+FFFD; a UCS-4 value past U+10FFFF is an error.

#[cfg(test)]
mod tests;

use super::{Layout, Version};

/// The most code points decoded: names and file names are far shorter; a forged length
/// costs an error, not a read of gigabytes.
pub const MAX_CHARS: usize = 4096;

/// How a string stores its characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CharKind {
    /// One byte each, all below 0x80 (`state.ascii`).
    Ascii,
    /// One byte each (U+0000–U+00FF).
    Latin1,
    /// Two bytes each, native (little) endian (U+0000–U+FFFF).
    Ucs2,
    /// Four bytes each, native (little) endian.
    Ucs4,
}

impl CharKind {
    /// Bytes per character.
    pub fn width(self) -> usize {
        match self {
            CharKind::Ascii | CharKind::Latin1 => 1,
            CharKind::Ucs2 => 2,
            CharKind::Ucs4 => 4,
        }
    }
}

/// Where a string's characters are, from its head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StrHeader {
    /// Their offset from the object's address.
    pub data: u16,
    /// Their length in bytes (`length × width`, at most `4 ×` [`MAX_CHARS`]).
    pub bytes: usize,
    /// How they are stored.
    pub kind: CharKind,
}

/// Why a string was not decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StrError {
    /// The head given is shorter than the layout's `state` and `length` fields.
    #[error("string head of {0} bytes is short")]
    Short(usize),
    /// A negative length.
    #[error("string length {0} is negative")]
    Negative(i64),
    /// More than [`MAX_CHARS`] code points.
    #[error("string of {0} code points is over the cap")]
    TooLong(i64),
    /// A `kind` other than 1, 2 or 4, or `ascii` set on a wider kind.
    #[error("string state {0:#x} has no valid kind")]
    Kind(u32),
    /// A legacy (non-compact) string, its characters in a second block.
    #[error("legacy (non-compact) string")]
    Legacy,
    /// The character bytes are not a whole number of characters.
    #[error("{0} character bytes do not divide into characters")]
    Ragged(usize),
    /// A character its kind cannot hold (a byte ≥ 0x80 in an ASCII string, past U+10FFFF).
    #[error("invalid character {0:#x}")]
    Char(u32),
}

/// The bit where `state.kind` starts (`compact` is 3 bits further, `ascii` 4).
fn kind_shift(v: Version) -> u32 {
    if v.free_threaded && (v.major, v.minor) >= (3, 14) {
        8
    } else {
        2
    }
}

/// A little-endian integer of `N` bytes at `at` in `head`.
fn field<const N: usize>(head: &[u8], at: u16) -> Option<[u8; N]> {
    let at = usize::from(at);
    head.get(at..at + N)?.try_into().ok()
}

/// Reads a string's head (the bytes at its address, at least up to `state` and `length`):
/// where its characters are, how many bytes, and of what kind. The caller checks the type.
pub fn header(v: Version, head: &[u8], layout: &Layout) -> Result<StrHeader, StrError> {
    let short = StrError::Short(head.len());
    let state = u32::from_le_bytes(field(head, layout.unicode_state).ok_or(short)?);
    let length = i64::from_le_bytes(field(head, layout.unicode_length).ok_or(short)?);
    if length < 0 {
        return Err(StrError::Negative(length));
    }
    let chars = usize::try_from(length).map_err(|_| StrError::TooLong(length))?;
    if chars > MAX_CHARS {
        return Err(StrError::TooLong(length));
    }
    let shift = kind_shift(v);
    let (compact, ascii) = ((state >> (shift + 3)) & 1, (state >> (shift + 4)) & 1);
    let kind = match ((state >> shift) & 7, ascii) {
        (1, 1) => CharKind::Ascii,
        (1, 0) => CharKind::Latin1,
        (2, 0) => CharKind::Ucs2,
        (4, 0) => CharKind::Ucs4,
        _ => return Err(StrError::Kind(state)),
    };
    if compact == 0 {
        return Err(StrError::Legacy);
    }
    let data = if kind == CharKind::Ascii {
        layout.unicode_ascii_data
    } else {
        layout.unicode_compact_data
    };
    Ok(StrHeader {
        data,
        bytes: chars * kind.width(),
        kind,
    })
}

/// The string `bytes` (a header's `bytes` at its `data`) hold; lone surrogates become
/// U+FFFD. At most [`MAX_CHARS`] characters are decoded: longer input is an error.
pub fn decode(kind: CharKind, bytes: &[u8]) -> Result<String, StrError> {
    let width = kind.width();
    if bytes.len() % width != 0 {
        return Err(StrError::Ragged(bytes.len()));
    }
    if bytes.len() / width > MAX_CHARS {
        return Err(StrError::TooLong((bytes.len() / width) as i64));
    }
    let mut out = String::with_capacity(bytes.len());
    for unit in bytes.chunks_exact(width) {
        let c = match *unit {
            [b] if kind == CharKind::Ascii && b >= 0x80 => return Err(StrError::Char(b.into())),
            [b] => char::from(b),
            [a, b] => char::from_u32(u16::from_le_bytes([a, b]).into()).unwrap_or('\u{fffd}'),
            [a, b, c, d] => {
                let v = u32::from_le_bytes([a, b, c, d]);
                match char::from_u32(v) {
                    Some(c) => c,
                    None if (0xd800..0xe000).contains(&v) => '\u{fffd}',
                    None => return Err(StrError::Char(v)),
                }
            }
            _ => return Err(StrError::Ragged(bytes.len())),
        };
        out.push(c);
    }
    Ok(out)
}
