//! Reading a code object out of a profiled process: its qualified name, file, first line
//! and line table, for the symbolizer to name a sampled frame.
//!
//! Everything read is hostile: the process may have forged the frame chain the sampler
//! followed, or freed and reused the object since. So each step is checked (the object's
//! type against the interpreter's own type objects, `co_firstlineno` against the one the
//! sampler saw), each read is bounded (the code object's head at 4 KiB, strings at 4096
//! characters, the line table at 64 KiB), and each failure is a [`CodeError`] with a
//! [`CodeError::reason`] for the agent to count.

#[cfg(test)]
mod tests;

// Layouts for tests and fuzz targets.
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use super::lines::{self, TableKind, MAX_TABLE};
use super::unicode::{self, StrError};
use super::{Layout, Version};

/// The most bytes of a code object read at once, whatever its layout says (a forged
/// `tp_basicsize` must not cost a large read).
pub const MAX_CODE_READ: usize = 4096;

/// Why a read of the process's memory failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    /// Some of `addr..addr + len` is not mapped (or the read came up short).
    #[error("{len} bytes at {addr:#x} are not mapped")]
    Unmapped {
        /// The first byte asked for.
        addr: u64,
        /// The bytes asked for.
        len: usize,
    },
    /// The process is gone.
    #[error("process gone")]
    Gone,
    /// Reading the process is not permitted (ptrace access mode).
    #[error("not permitted")]
    Denied,
    /// Another error, by errno.
    #[error("read failed: errno {0}")]
    Other(i32),
}

/// A profiled process's memory.
pub trait Memory {
    /// Fills `buf` with the bytes at `addr`, all of them or an error.
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemError>;
}

/// The addresses of the interpreter's type objects in the process (`PyCode_Type`,
/// `PyUnicode_Type`, `PyBytes_Type`), which the objects read must point to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Types {
    /// `PyCode_Type`.
    pub code: u64,
    /// `PyUnicode_Type`.
    pub unicode: u64,
    /// `PyBytes_Type`.
    pub bytes: u64,
}

/// Why a code object was not read (see [`CodeError::reason`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodeError {
    /// A read failed.
    #[error("{what}: {err}")]
    Read {
        /// What was being read.
        what: &'static str,
        /// How it failed.
        err: MemError,
    },
    /// A null or misaligned object pointer.
    #[error("{what} pointer {addr:#x} is not an object")]
    Pointer {
        /// Which pointer.
        what: &'static str,
        /// Its value.
        addr: u64,
    },
    /// An object's type is not the expected one (freed, reused or forged).
    #[error("{what} has type {found:#x}")]
    TypeMismatch {
        /// Which object.
        what: &'static str,
        /// Its `ob_type`.
        found: u64,
    },
    /// `co_firstlineno` differs from the sampler's fingerprint (another code object now),
    /// or is negative.
    #[error("first line {found}, the sample saw {want}")]
    Fingerprint {
        /// The fingerprint recorded at sampling time.
        want: u32,
        /// `co_firstlineno` now.
        found: i64,
    },
    /// A string over [`unicode::MAX_CHARS`] code points.
    #[error("string of {0} code points")]
    StringTooLong(i64),
    /// A string that is not a compact string of a valid kind, or has invalid characters.
    #[error("string: {0}")]
    StringKind(StrError),
    /// A line table over [`MAX_TABLE`] bytes, or of negative size.
    #[error("line table of {0} bytes")]
    TableTooLarge(i64),
    /// The layout puts a field past the bytes read (a layout bug, not the process's).
    #[error("layout field {0} lies past the bytes read")]
    Layout(&'static str),
    /// A version without a line-table format.
    #[error("no line table format for {0}")]
    Version(Version),
}

impl CodeError {
    /// A short stable label per kind of failure, for the agent's counters.
    pub fn reason(&self) -> &'static str {
        match self {
            CodeError::Read { .. } => "read",
            CodeError::Pointer { .. } => "pointer",
            CodeError::TypeMismatch { .. } => "type",
            CodeError::Fingerprint { .. } => "fingerprint",
            CodeError::StringTooLong(_) => "string_too_long",
            CodeError::StringKind(_) => "string_kind",
            CodeError::TableTooLarge(_) => "table_too_large",
            CodeError::Layout(_) => "layout",
            CodeError::Version(_) => "version",
        }
    }
}

/// What a code object says about its frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Code {
    /// `co_qualname` (3.11+) or `co_name`.
    pub qualname: String,
    /// `co_filename`.
    pub filename: String,
    /// `co_firstlineno`.
    pub first_line: u32,
    table: Vec<u8>,
    kind: TableKind,
}

impl Code {
    /// The line of the instruction `unit` code units into the bytecode (see
    /// [`lines::line_at`]).
    pub fn line(&self, unit: u32) -> Option<u32> {
        lines::line_at(self.kind, &self.table, self.first_line, unit)
    }

    /// The bytes this value holds, for a cache bounded in bytes.
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<Code>() + self.qualname.len() + self.filename.len() + self.table.len()
    }
}

/// Reads `N` little-endian bytes at `at` of `buf`.
fn field<const N: usize>(buf: &[u8], at: u16, name: &'static str) -> Result<[u8; N], CodeError> {
    let at = usize::from(at);
    buf.get(at..at + N)
        .and_then(|b| b.try_into().ok())
        .ok_or(CodeError::Layout(name))
}

fn u64_at(buf: &[u8], at: u16, name: &'static str) -> Result<u64, CodeError> {
    field(buf, at, name).map(u64::from_le_bytes)
}

/// `len` bytes at `addr`.
fn read(
    mem: &mut impl Memory,
    what: &'static str,
    addr: u64,
    len: usize,
) -> Result<Vec<u8>, CodeError> {
    let mut buf = vec![0; len];
    mem.read(addr, &mut buf)
        .map_err(|err| CodeError::Read { what, err })?;
    Ok(buf)
}

/// An object pointer: non-null and 8-aligned.
fn object(what: &'static str, addr: u64) -> Result<u64, CodeError> {
    if addr == 0 || addr % 8 != 0 {
        return Err(CodeError::Pointer { what, addr });
    }
    Ok(addr)
}

/// `addr + off`, where an object's field is (an error if that wraps).
fn offset(what: &'static str, addr: u64, off: u16) -> Result<u64, CodeError> {
    addr.checked_add(u64::from(off))
        .ok_or(CodeError::Pointer { what, addr })
}

/// Reads the head of the object at `addr` (`len` bytes) and checks its type.
fn typed_head(
    mem: &mut impl Memory,
    layout: &Layout,
    what: &'static str,
    addr: u64,
    len: usize,
    want: u64,
) -> Result<Vec<u8>, CodeError> {
    let head = read(mem, what, object(what, addr)?, len)?;
    let found = u64_at(&head, layout.object_type, "object_type")?;
    if found != want {
        return Err(CodeError::TypeMismatch { what, found });
    }
    Ok(head)
}

/// The `str` at `addr`: its head, then its characters. The head read is the size of the
/// smallest string (`PyASCIIObject`), so it never runs past the object.
fn read_str(
    mem: &mut impl Memory,
    layout: &Layout,
    version: Version,
    types: &Types,
    what: &'static str,
    addr: u64,
) -> Result<String, CodeError> {
    let len = [
        usize::from(layout.unicode_ascii_data),
        usize::from(layout.unicode_state) + 4,
        usize::from(layout.unicode_length) + 8,
        usize::from(layout.object_type) + 8,
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    let head = typed_head(mem, layout, what, addr, len, types.unicode)?;
    let h = unicode::header(version, &head, layout).map_err(|e| match e {
        StrError::TooLong(n) => CodeError::StringTooLong(n),
        StrError::Short(_) => CodeError::Layout("unicode"),
        e => CodeError::StringKind(e),
    })?;
    let start = usize::from(h.data);
    let chars = match head.get(start..start + h.bytes) {
        Some(inline) => inline.to_vec(),
        None => read(mem, what, offset(what, addr, h.data)?, h.bytes)?,
    };
    unicode::decode(h.kind, &chars).map_err(CodeError::StringKind)
}

/// The line table (a `bytes`) at `addr`.
fn read_table(
    mem: &mut impl Memory,
    layout: &Layout,
    types: &Types,
    addr: u64,
) -> Result<Vec<u8>, CodeError> {
    let len = usize::from(layout.bytes_size.max(layout.object_type)) + 8;
    let head = typed_head(mem, layout, "co_linetable", addr, len, types.bytes)?;
    let size = i64::from_le_bytes(field(&head, layout.bytes_size, "bytes_size")?);
    let size = usize::try_from(size)
        .ok()
        .filter(|n| *n <= MAX_TABLE)
        .ok_or(CodeError::TableTooLarge(size))?;
    let data = offset("co_linetable", addr, layout.bytes_data)?;
    read(mem, "co_linetable", data, size)
}

/// Reads the code object at `addr` of a process running `version` laid out as `layout`.
/// `fingerprint` is the `co_firstlineno` the sampler saw (0: unknown, not checked).
pub fn read_code(
    mem: &mut impl Memory,
    layout: &Layout,
    version: Version,
    types: &Types,
    addr: u64,
    fingerprint: u32,
) -> Result<Code, CodeError> {
    let kind = lines::kind_for(version).ok_or(CodeError::Version(version))?;
    let len = usize::from(layout.code_size).min(MAX_CODE_READ);
    let head = typed_head(mem, layout, "code", addr, len, types.code)?;
    let first = i32::from_le_bytes(field(&head, layout.code_firstlineno, "code_firstlineno")?);
    if fingerprint != 0 && i64::from(first) != i64::from(fingerprint) {
        return Err(CodeError::Fingerprint {
            want: fingerprint,
            found: first.into(),
        });
    }
    let first_line = u32::try_from(first).map_err(|_| CodeError::Fingerprint {
        want: fingerprint,
        found: first.into(),
    })?;
    let name_at = layout.code_qualname.unwrap_or(layout.code_name);
    let name = u64_at(&head, name_at, "code_qualname")?;
    let file = u64_at(&head, layout.code_filename, "code_filename")?;
    let table = u64_at(&head, layout.code_linetable, "code_linetable")?;
    Ok(Code {
        qualname: read_str(mem, layout, version, types, "co_qualname", name)?,
        filename: read_str(mem, layout, version, types, "co_filename", file)?,
        first_line,
        table: read_table(mem, layout, types, table)?,
        kind,
    })
}
