//! Which mapped object is a CPython interpreter, of what version, and where its own file
//! puts what the sampler needs: `_PyRuntime`, the eval loop's code ranges, the type objects
//! the symbolizer checks against, and the thread-local `_Py_tss_tstate` (3.12+).
//!
//! The interpreter is the object that defines both `_PyRuntime` and
//! `_PyEval_EvalFrameDefault`: a static `python3.X`, a shared `libpython3.X.so`, or a
//! program embedding one (uwsgi). A `python3.X` that links `libpython` defines neither and
//! is not the interpreter: its library is. Addresses are the file's (`st_value`); the
//! caller adds the load bias. x86-64 only.

use object::elf;

use super::layout::{layout_for, Layout};
use super::Version;
use super::{cold, debug_offsets};
use crate::elf_file::{ElfError, ElfReader, ReadAt, Symbol, SymbolData};

/// A CPython interpreter found in an object file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interpreter {
    /// Its version (a GIL build with a known layout: [`layout_for`] answers for it).
    pub version: Version,
    /// Address of `_PyRuntime`.
    pub runtime: u64,
    /// `[start, end)` of `_PyEval_EvalFrameDefault` (its `st_size`).
    pub eval: (u64, u64),
    /// `[start, end)` of `_PyEval_EvalFrameDefault.cold`, the part GCC moved out of line:
    /// from `.symtab`, or in a stripped object from its jumps and `.eh_frame` ([`cold`]).
    pub eval_cold: Option<(u64, u64)>,
    /// Address of `PyCode_Type`.
    pub code_type: u64,
    /// Address of `PyUnicode_Type`.
    pub unicode_type: u64,
    /// Address of `PyBytes_Type`.
    pub bytes_type: u64,
    /// Address of `_Py_NoneStruct` (3.13's C-stack frames hold it as their executable).
    pub none: Option<u64>,
    /// `st_value` of the thread-local `_Py_tss_tstate` (3.12+): its offset in the object's
    /// TLS block, when a symbol table has it.
    pub tss_tstate: Option<u64>,
    /// 3.12+ shared object: address of the GOT slot pair `__tls_get_addr` is given for
    /// `_Py_tss_tstate` (module id, relocated at load; then the offset in the block).
    pub tls_got: Option<u64>,
    /// Executable with a `PT_TLS` segment and a known `_Py_tss_tstate`: its offset from the
    /// thread pointer (`%fs`), negative (x86-64 puts the executable's block just below).
    pub tls_static: Option<i64>,
    /// The layout the file's own `_Py_DebugOffsets` gives, for a version ember's table does
    /// not hold (3.14): the agent checks it against the table in process memory.
    pub published: Option<Layout>,
}

impl Interpreter {
    /// Where this interpreter keeps what ember reads: its file's `_Py_DebugOffsets` for
    /// a version past ember's table, else the table's entry for its version.
    pub fn layout(&self) -> Option<Layout> {
        self.published.or_else(|| layout_for(self.version))
    }

    /// The code ranges of the eval loop (main part, then the cold part if known).
    pub fn eval_ranges(&self) -> impl Iterator<Item = (u64, u64)> {
        std::iter::once(self.eval).chain(self.eval_cold)
    }
}

/// Why an object that defines the interpreter's symbols is not profiled as one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DetectError {
    /// The object could not be read.
    #[error("reading the object: {0}")]
    Elf(#[from] ElfError),
    /// No `Py_Version` (≤3.10) and a file name that names no version.
    #[error("no Py_Version and no version in the file name")]
    NoVersion,
    /// A version ember has no layout for.
    #[error("CPython {0}: no layout for this version")]
    UnknownVersion(Version),
    /// A free-threaded (`t`) build: other object headers, no GIL-build layout applies.
    #[error("CPython {0}: free-threaded build")]
    FreeThreaded(Version),
    /// A debug build (`Py_DEBUG`): reference tracing moves every object's fields.
    #[error("CPython debug build")]
    DebugBuild,
    /// An interpreter without a symbol ember needs.
    #[error("{0} is not defined")]
    MissingSymbol(&'static str),
    /// An interpreter for another machine than x86-64 (ember's only layouts).
    #[error("not an x86-64 object (e_machine {0})")]
    NotX86_64(u16),
    /// A symbol whose value cannot be right (a zero-sized eval loop, a version past the file).
    #[error("{0} is malformed")]
    BadSymbol(&'static str),
}

impl DetectError {
    /// A short label for the metric that counts refusals by reason.
    pub fn reason(&self) -> &'static str {
        match self {
            DetectError::Elf(_) => "unreadable",
            DetectError::NoVersion => "no_version",
            DetectError::UnknownVersion(_) => "unknown_version",
            DetectError::FreeThreaded(_) => "free_threaded",
            DetectError::DebugBuild => "debug_build",
            DetectError::MissingSymbol(_) => "missing_symbol",
            DetectError::NotX86_64(_) => "not_x86_64",
            DetectError::BadSymbol(_) => "bad_symbol",
        }
    }
}

/// What the symbol tables say (one pass per table).
#[derive(Default, Debug)]
struct Found {
    runtime: Option<u64>,
    eval: Option<(u64, u64)>,
    eval_cold: Option<(u64, u64)>,
    version_at: Option<u64>,
    code_type: Option<u64>,
    unicode_type: Option<u64>,
    bytes_type: Option<u64>,
    none: Option<u64>,
    tss_tstate: Option<u64>,
    /// `_Py_DecRefShared`: only free-threaded builds define it.
    free_threaded: bool,
    /// `_Py_NegativeRefcount`: only `Py_REF_DEBUG` (debug) builds define it.
    debug: bool,
}

impl Found {
    fn add(&mut self, s: Symbol<'_>) {
        let at = Some(s.value);
        match s.name {
            b"_PyRuntime" => self.runtime = self.runtime.or(at),
            b"_PyEval_EvalFrameDefault" if s.kind == elf::STT_FUNC => {
                self.eval = self
                    .eval
                    .or(Some((s.value, s.value.saturating_add(s.size))));
            }
            b"_PyEval_EvalFrameDefault.cold" if s.kind == elf::STT_FUNC && s.size > 0 => {
                self.eval_cold = Some((s.value, s.value.saturating_add(s.size)));
            }
            b"Py_Version" => self.version_at = self.version_at.or(at),
            b"PyCode_Type" => self.code_type = self.code_type.or(at),
            b"PyUnicode_Type" => self.unicode_type = self.unicode_type.or(at),
            b"PyBytes_Type" => self.bytes_type = self.bytes_type.or(at),
            b"_Py_NoneStruct" => self.none = self.none.or(at),
            b"_Py_tss_tstate" if s.kind == elf::STT_TLS => self.tss_tstate = at,
            b"_Py_DecRefShared" => self.free_threaded = true,
            b"_Py_NegativeRefcount" => self.debug = true,
            _ => {}
        }
    }

    fn scan(&mut self, data: &SymbolData) {
        data.symbols(|s| self.add(s));
    }
}

/// The interpreter `reader`'s object holds, `None` if it is not one (it lacks
/// `_PyRuntime` or `_PyEval_EvalFrameDefault`), or why it cannot be used. `file_name` is
/// the object's name (its last path component is used), the version's source before 3.11.
///
/// `.dynsym` is read first; `.symtab` (for `.cold` and the TLS symbol, and interpreters
/// that export nothing) only when `.dynsym` defines one of the two symbols or is absent,
/// so that the symbol tables of other programs are not read for nothing.
pub fn detect<R: ReadAt + ?Sized>(
    reader: &mut ElfReader<'_, R>,
    file_name: &[u8],
) -> Result<Option<Interpreter>, DetectError> {
    let mut found = Found::default();
    let dynsym = reader.symbol_data(elf::SHT_DYNSYM)?;
    if let Some(d) = &dynsym {
        found.scan(d);
    }
    let mut stripped = true;
    if dynsym.is_none() || found.runtime.is_some() || found.eval.is_some() {
        drop(dynsym);
        if let Some(s) = reader.symbol_data(elf::SHT_SYMTAB)? {
            stripped = false;
            found.scan(&s);
        }
    }
    let (Some(runtime), Some(eval)) = (found.runtime, found.eval) else {
        return Ok(None);
    };
    let info = reader.info();
    if !info.is_64_le || info.machine != elf::EM_X86_64 {
        return Err(DetectError::NotX86_64(info.machine));
    }
    if eval.1 <= eval.0 {
        return Err(DetectError::BadSymbol("_PyEval_EvalFrameDefault"));
    }
    let version = version(reader, &found, file_name)?;
    let published = match layout_for(version) {
        Some(_) => None,
        None => Some(published_layout(reader, runtime, version)?),
    };
    let exe = info.e_type == elf::ET_EXEC || (info.e_type == elf::ET_DYN && info.interp);
    let tls_static = match (exe, info.tls, found.tss_tstate) {
        (true, Some((_, memsz, align)), Some(off)) => static_tls_offset(off, memsz, align),
        _ => None,
    };
    let tls_got = if !exe && version.minor >= 12 {
        tls_got(reader, found.tss_tstate)?
    } else {
        None
    };
    Ok(Some(Interpreter {
        version,
        runtime,
        eval,
        // Without `.symtab`, from the function's jumps and `.eh_frame` (see `cold`).
        eval_cold: match found.eval_cold {
            None if stripped => cold::find_cold(reader, eval),
            known => known,
        },
        code_type: found
            .code_type
            .ok_or(DetectError::MissingSymbol("PyCode_Type"))?,
        unicode_type: found
            .unicode_type
            .ok_or(DetectError::MissingSymbol("PyUnicode_Type"))?,
        bytes_type: found
            .bytes_type
            .ok_or(DetectError::MissingSymbol("PyBytes_Type"))?,
        none: found.none,
        tss_tstate: found.tss_tstate,
        tls_got,
        tls_static,
        published,
    }))
}

/// The layout of `_Py_DebugOffsets` at `_PyRuntime` in the file, for a version ember's
/// table does not hold: refused as unknown unless its minor has a table parser, and as
/// malformed unless the table parses, validates and names the same version and build.
fn published_layout<R: ReadAt + ?Sized>(
    reader: &mut ElfReader<'_, R>,
    runtime: u64,
    version: Version,
) -> Result<Layout, DetectError> {
    if !debug_offsets::parses(version) {
        return Err(DetectError::UnknownVersion(version));
    }
    let bad = DetectError::BadSymbol("_Py_DebugOffsets");
    let bytes = reader
        .read_vaddr(runtime, debug_offsets::READ_LEN as u64)
        .map_err(|_| bad.clone())?;
    let table = debug_offsets::parse(&bytes).map_err(|_| bad.clone())?;
    let same = |v: Version| (v.major, v.minor, v.free_threaded);
    if same(table.version) != same(version) {
        return Err(bad);
    }
    Ok(table.layout)
}

/// The version from `Py_Version` (3.11+, read from the file) or else the name; debug builds
/// and free-threaded builds before 3.13 refused (a version without a layout is refused by
/// the caller).
fn version<R: ReadAt + ?Sized>(
    reader: &mut ElfReader<'_, R>,
    found: &Found,
    file_name: &[u8],
) -> Result<Version, DetectError> {
    let named = name_version(file_name);
    if found.debug || named.is_some_and(|n| n.debug) {
        return Err(DetectError::DebugBuild);
    }
    let mut v = match found.version_at {
        Some(at) => {
            let bytes = reader
                .read_vaddr(at, 4)
                .map_err(|_| DetectError::BadSymbol("Py_Version"))?;
            let word: [u8; 4] = bytes
                .get(..4)
                .and_then(|b| b.try_into().ok())
                .ok_or(DetectError::BadSymbol("Py_Version"))?;
            Version::from_hex(u32::from_le_bytes(word))
        }
        None => named.ok_or(DetectError::NoVersion)?.version,
    };
    v.free_threaded = found.free_threaded || named.is_some_and(|n| n.version.free_threaded);
    // Free-threaded builds move every object's fields (a 32-byte head): only a build that
    // publishes its own offsets (3.13+) is walked.
    if v.free_threaded && !debug_offsets::parses(v) {
        return Err(DetectError::FreeThreaded(v));
    }
    Ok(v)
}

/// A version read from a file name, and whether the name marks a debug build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Named {
    version: Version,
    debug: bool,
}

/// The version `libpython3.N[flags].so[...]` or `python3.N[flags]` names (flags: `t`
/// free-threaded, `d` debug, `m` pymalloc before 3.8), from the last path component.
fn name_version(file_name: &[u8]) -> Option<Named> {
    let base = file_name.rsplit(|&b| b == b'/').next()?;
    let (rest, lib) = match base.strip_prefix(b"libpython3.") {
        Some(rest) => (rest, true),
        None => (base.strip_prefix(b"python3.")?, false),
    };
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 2 {
        return None;
    }
    let minor = std::str::from_utf8(rest.get(..digits)?)
        .ok()?
        .parse()
        .ok()?;
    let after = rest.get(digits..)?;
    let flags = after.iter().take_while(|b| b"tdm".contains(b)).count();
    let (flags, tail) = after.split_at(flags);
    let tail_ok = if lib {
        tail == b".so" || tail.starts_with(b".so.")
    } else {
        tail.is_empty()
    };
    tail_ok.then_some(Named {
        version: Version {
            major: 3,
            minor,
            micro: 0,
            free_threaded: flags.contains(&b't'),
        },
        debug: flags.contains(&b'd'),
    })
}

/// The `%fs`-relative offset of a TLS symbol at `off` in an executable's block of `memsz`
/// bytes aligned to `align` (x86-64 TLS variant II: the block ends at the thread pointer).
fn static_tls_offset(off: u64, memsz: u64, align: u64) -> Option<i64> {
    let size = memsz.checked_next_multiple_of(align.max(1))?;
    let off = i64::try_from(off).ok()?;
    off.checked_sub(i64::try_from(size).ok()?)
}

/// Most `R_X86_64_DTPMOD64` slots looked at (3.13.0 has 4).
const MAX_TLS_SLOTS: usize = 256;

/// The GOT slot for `_Py_tss_tstate` (see [`Interpreter::tls_got`]): the `DTPMOD64`
/// relocation (local symbol, index 0) whose next word in the file is the symbol's offset;
/// without the symbol, the object's only such slot.
fn tls_got<R: ReadAt + ?Sized>(
    reader: &mut ElfReader<'_, R>,
    tss: Option<u64>,
) -> Result<Option<u64>, DetectError> {
    let mut slots = Vec::new();
    let rela: Vec<usize> = (reader.sections().iter().enumerate())
        .filter(|(_, s)| s.kind == elf::SHT_RELA && s.flags & u64::from(elf::SHF_ALLOC) != 0)
        .map(|(i, _)| i)
        .collect();
    for i in rela {
        let data = reader.section_data(i)?;
        for r in data.chunks_exact(24) {
            let word = |at: usize| r.get(at..at + 8).and_then(|b| b.try_into().ok());
            let (Some(offset), Some(info)) = (word(0), word(8)) else {
                continue;
            };
            let info = u64::from_le_bytes(info);
            if info & 0xffff_ffff == u64::from(elf::R_X86_64_DTPMOD64) && info >> 32 == 0 {
                if slots.len() == MAX_TLS_SLOTS {
                    return Ok(None);
                }
                slots.push(u64::from_le_bytes(offset));
            }
        }
    }
    let Some(tss) = tss else {
        return Ok(match slots.as_slice() {
            [only] => Some(*only),
            _ => None,
        });
    };
    for slot in slots {
        let Ok(next) = reader.read_vaddr(slot.saturating_add(8), 8) else {
            continue;
        };
        if next.as_slice() == tss.to_le_bytes() {
            return Ok(Some(slot));
        }
    }
    Ok(None)
}

#[cfg(test)]
#[path = "detect_tests.rs"]
mod tests;
