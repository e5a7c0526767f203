//! Which processes run a CPython the sampler can walk, and its `py_procs` entry: the
//! interpreter object among the process's mappings ([`ember_parse::python::detect`], once
//! per file), its layout, and what only the live process knows (where its objects were
//! loaded, the pthread key its thread states are kept under).
//!
//! The thread state is found in BPF from the thread pointer: `*(tp + 0x310 + 16·key + 8)`,
//! glibc's `pthread_getspecific` fast path for keys below 32 (`specific_1stblock`, at
//! 0x310 in `struct pthread` for glibc 2.27 and later): the `autoTSSkey` every CPython
//! 3.8–3.14 keeps the thread's own state under, shared or static build alike. Under musl
//! it is `*(*(tp + tsd) + 8·key)`, `self->tsd[key]`, with `tsd`'s offset in musl's
//! `struct pthread` decoded from the process's own libc ([`ember_parse::libc`]).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use ember_parse::libc;
use ember_parse::python::debug_offsets;
use ember_parse::python::detect::{detect, DetectError, Interpreter};
use ember_parse::python::layout::{FrameModel, Layout};

use super::check::{check_main_chain, Chain};
use super::members::{check_code_members, MembersError};
use super::memory::ProcMem;
pub use super::PyProcess;
use crate::capture::unwind::{ember_py_limit, ember_py_model, ember_py_proc, ember_py_tls};
use crate::metrics::{Metrics, PyAttach};
use crate::os::file_id::FileId;
use crate::os::procfs::RegionKind;
use crate::process::elf_file::{ElfReader, Limits};
use crate::process::object::FileAt;
use crate::process::snapshot::{Mapped, Snapshot};

/// `offsetof(struct pthread, specific_1stblock)` in glibc 2.27+ (x86-64).
const GLIBC_SPECIFIC: u64 = 0x310;
/// `EMBER_PY_NO_FIELD`: a field this version lacks.
const NO_FIELD: u16 = ember_py_limit::EMBER_PY_NO_FIELD.0 as u16;
/// Keys glibc keeps in the thread's first block (the BPF read needs no second level).
const FIRST_BLOCK_KEYS: u32 = 32;
/// musl's `PTHREAD_KEYS_MAX`: the length of `self->tsd`.
const MUSL_KEYS: u32 = 128;
/// Interpreter verdicts kept per file (detection reads the file's symbol tables once).
const MAX_FILES: usize = 4096;
/// Caps of the symbol table reads of detection.
const LIMITS: Limits = Limits {
    max_read_bytes: 32 << 20,
    max_section_bytes: 24 << 20,
};

/// What came of looking at a process.
#[derive(Debug)]
pub enum Attach {
    /// No interpreter among its mappings.
    NotPython,
    /// An interpreter whose runtime is not initialized yet: look again soon.
    NotReady,
    /// An interpreter ember cannot walk (counted by reason).
    Refused(PyAttach),
    /// The sampler's entry, and the process as the names side sees it.
    Attached(Box<ember_py_proc>, Arc<PyProcess>),
}

/// Decides what each process's interpreter is, remembering each file's detection.
pub struct Attacher {
    files: HashMap<FileId, Option<Arc<Interpreter>>>,
    /// musl libcs seen: their `tsd` offset, `None` if it could not be decoded.
    musls: HashMap<FileId, Option<u32>>,
    metrics: Metrics,
}

impl Attacher {
    /// An attacher counting in `metrics`.
    pub fn new(metrics: Metrics) -> Self {
        Self {
            files: HashMap::new(),
            musls: HashMap::new(),
            metrics,
        }
    }

    /// Looks at `snap`'s mappings and, for an interpreter, at the process's memory.
    pub fn attach(&mut self, snap: &Snapshot) -> Attach {
        let mut found = None;
        // `Some(None)`: a musl libc whose thread keys were not found.
        let mut musl = None;
        let mut maps_glibc = false;
        for region in &snap.regions {
            let e = &region.map;
            if e.kind != RegionKind::File {
                continue;
            }
            maps_glibc |= is_glibc(&e.path);
            let Mapped::Open(file) = &region.file else {
                continue;
            };
            // Alpine's `/lib/ld-musl-x86_64.so.1`, Debian's `x86_64-linux-musl/libc.so`.
            if musl.is_none() && is_musl(&e.path) {
                musl = Some(self.musl_tsd(file));
            }
            if found.is_some() {
                continue;
            }
            match self.interpreter(file, e.inode, e.path.as_bytes()) {
                Ok(Some(interp)) => {
                    if let Some(bias) = load_bias(file, e.start, e.offset) {
                        found = Some((interp, bias, file));
                    }
                }
                Ok(None) => {}
                Err(reason) => return self.refused(reason),
            }
        }
        let Some((interp, bias, interp_file)) = found else {
            return Attach::NotPython;
        };
        // No C library mapped at all: a static interpreter, with musl's linked in if its own
        // `pthread_getspecific` has musl's shape (python-build-standalone's musl builds).
        if musl.is_none() && !maps_glibc {
            musl = self.musl_tsd(interp_file).map(Some);
        }
        let libc = match musl {
            None => Libc::Glibc,
            Some(Some(tsd)) => Libc::Musl { tsd },
            Some(None) => return self.refused(PyAttach::Musl),
        };
        let Some(layout) = interp.layout() else {
            return self.refused(PyAttach::UnknownVersion);
        };
        let mem = ProcMem::new(snap.pid);
        match attach_live(&mem, &interp, &layout, bias, libc) {
            Ok(Some(entry)) => {
                self.metrics.python_attached(PyAttach::Attached);
                let process = PyProcess {
                    version: interp.version,
                    layout,
                    code_type: interp.code_type.wrapping_add(bias),
                    unicode_type: interp.unicode_type.wrapping_add(bias),
                    bytes_type: interp.bytes_type.wrapping_add(bias),
                };
                Attach::Attached(Box::new(entry), Arc::new(process))
            }
            Ok(None) => Attach::NotReady,
            Err(reason) => self.refused(reason),
        }
    }

    /// `offsetof(struct pthread, tsd)` of the musl libc `file`, decoded once per file.
    fn musl_tsd(&mut self, file: &File) -> Option<u32> {
        let meta = file.metadata().ok()?;
        let id = FileId::of(&meta);
        if let Some(known) = self.musls.get(&id) {
            return *known;
        }
        let src = FileAt::new(file, meta.len());
        let tsd = ElfReader::new(&src, LIMITS)
            .ok()
            .and_then(|mut elf| libc::musl_tsd_offset(&mut elf).ok().flatten());
        if self.musls.len() >= MAX_FILES {
            self.musls.clear();
        }
        self.musls.insert(id, tsd);
        tsd
    }

    fn refused(&self, reason: PyAttach) -> Attach {
        self.metrics.python_attached(reason);
        Attach::Refused(reason)
    }

    /// The interpreter `file` holds (detected once per file), or why it is refused.
    fn interpreter(
        &mut self,
        file: &File,
        inode: u64,
        name: &[u8],
    ) -> Result<Option<Arc<Interpreter>>, PyAttach> {
        let meta = file.metadata().map_err(|_| PyAttach::Unreadable)?;
        if !meta.is_file() || meta.ino() != inode {
            return Ok(None);
        }
        let id = FileId::of(&meta);
        if let Some(known) = self.files.get(&id) {
            return Ok(known.clone());
        }
        let src = FileAt::new(file, meta.len());
        let found = ElfReader::new(&src, LIMITS)
            .map_err(DetectError::from)
            .and_then(|mut elf| detect(&mut elf, name));
        let verdict = match found {
            Ok(v) => v.map(Arc::new),
            Err(e) => return Err(refusal(&e)),
        };
        if self.files.len() >= MAX_FILES {
            self.files.clear();
        }
        self.files.insert(id, verdict.clone());
        Ok(verdict)
    }
}

/// The C library of a process, as far as its thread keys go.
#[derive(Debug, Clone, Copy)]
enum Libc {
    /// glibc 2.27+: keys below 32 in `struct pthread` itself.
    Glibc,
    /// musl: keys in the array `self->tsd`, at this offset in `struct pthread`.
    Musl { tsd: u32 },
}

/// Whether a mapped file's path names musl's libc (which is also its dynamic loader).
fn is_musl(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("ld-musl-") || name.starts_with("libc.musl-") || path.contains("-linux-musl/")
}

/// Whether a mapped file's path names glibc's libc or dynamic loader.
fn is_glibc(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("libc.so.") || name.starts_with("libc-2.") || name.starts_with("ld-linux-")
}

/// The metric reason of a detection error.
fn refusal(e: &DetectError) -> PyAttach {
    match e {
        DetectError::Elf(_) | DetectError::NotX86_64(_) => PyAttach::Unreadable,
        DetectError::NoVersion | DetectError::UnknownVersion(_) => PyAttach::UnknownVersion,
        DetectError::FreeThreaded(_) => PyAttach::FreeThreaded,
        DetectError::DebugBuild => PyAttach::DebugBuild,
        DetectError::MissingSymbol(_) | DetectError::BadSymbol(_) => PyAttach::Symbols,
    }
}

/// Process address minus object address for the executable mapping of `file` at `start`
/// (file offset `offset`), from the object's program headers.
fn load_bias(file: &File, start: u64, offset: u64) -> Option<u64> {
    let meta = file.metadata().ok()?;
    let src = FileAt::new(file, meta.len());
    let elf = ElfReader::new(&src, LIMITS).ok()?;
    let seg = elf
        .segments()
        .iter()
        .find(|s| offset >= s.offset && offset < s.offset.saturating_add(s.filesz.max(1)))?;
    let vaddr = seg.vaddr.checked_add(offset - seg.offset)?;
    Some(start.wrapping_sub(vaddr))
}

/// The `py_procs` entry of a live interpreter; `None` while its runtime is not initialized.
fn attach_live(
    mem: &ProcMem,
    interp: &Interpreter,
    layout: &Layout,
    bias: u64,
    libc: Libc,
) -> Result<Option<ember_py_proc>, PyAttach> {
    // The layout is this binary's if its code type says so (a forged or patched build
    // whose objects differ is refused, not walked wrong).
    let code_type = interp.code_type.wrapping_add(bias);
    // `tp_basicsize` follows the type's `PyVarObject` head (`ob_type`, `ob_size`) and
    // `tp_name`: 32 in GIL builds, 48 in free-threaded ones.
    let basicsize_at = u64::from(layout.object_type) + 24;
    let basic = mem
        .u64_at(code_type + basicsize_at)
        .map_err(|_| PyAttach::Memory)?;
    // A layout from the file's `_Py_DebugOffsets` (3.14) reads only the code fields it
    // names; its code object ends where the bytecode starts (`tp_basicsize` is
    // `co_code_adaptive`'s offset: 208 in 3.14.10, as 200 in 3.13.0).
    let size = match interp.published {
        Some(_) => layout.code_adaptive.unwrap_or(0),
        None => layout.code_size,
    };
    if basic != u64::from(size) {
        return Err(PyAttach::LayoutMismatch);
    }
    check_code_members(mem, code_type, layout, interp.version).map_err(|e| match e {
        MembersError::Unreadable => PyAttach::Memory,
        MembersError::Moved(_) | MembersError::Missing(_) => PyAttach::LayoutMismatch,
    })?;
    let runtime = interp.runtime.wrapping_add(bias);
    if interp.version.minor >= 13 {
        check_debug_offsets(mem, runtime, layout)?;
    }
    let tss = runtime + u64::from(layout.runtime_autotss);
    let created = mem.u32_at(tss).map_err(|_| PyAttach::Memory)?;
    if created == 0 {
        return Ok(None);
    }
    match check_main_chain(mem, runtime, layout, code_type) {
        Chain::Checked(_) => {}
        Chain::NotCode => return Err(PyAttach::CodeCheck),
        Chain::Unreadable => return Err(PyAttach::Memory),
    }
    // The pthread key first: it holds the thread's state also while the thread has
    // released the GIL (in a C call such as zlib's), where 3.12+ clears `_Py_tss_tstate`
    // (measured: 77 % of a zlib-heavy 3.13 fixture's samples kept their Python frames
    // through the thread-local, 99 % through the key).
    let key = mem.u32_at(tss + 4).map_err(|_| PyAttach::Memory)?;
    let mut entry = match libc {
        Libc::Glibc if key < FIRST_BLOCK_KEYS => ember_py_proc {
            tls_offset: (GLIBC_SPECIFIC + 16 * u64::from(key) + 8) as i64,
            tls_mode: ember_py_tls::EMBER_PY_TLS_TP.0 as u8,
            ..Default::default()
        },
        Libc::Glibc => thread_local(mem, interp, bias).ok_or(PyAttach::TssKey)?,
        Libc::Musl { tsd } if key < MUSL_KEYS => ember_py_proc {
            tls_offset: i64::from(8 * key),
            tls_module: u64::from(tsd),
            tls_mode: ember_py_tls::EMBER_PY_TLS_TSD.0 as u8,
            ..Default::default()
        },
        // musl's 3.12+ `_Py_tss_tstate` would need its own DTV read: not done.
        Libc::Musl { .. } => return Err(PyAttach::TssKey),
    };
    let ranges = std::iter::once(interp.eval).chain(interp.eval_cold);
    for (i, (lo, hi)) in ranges.take(2).enumerate() {
        entry.eval_start[i] = lo.wrapping_add(bias);
        entry.eval_end[i] = hi.wrapping_add(bias);
    }
    fill_layout(&mut entry, layout);
    entry.code_type = code_type;
    Ok(Some(entry))
}

/// 3.13+: CPython publishes the offsets of what the walker reads at the start of
/// `_PyRuntime` (`_Py_DebugOffsets`); the table's must be the same, or the process is not
/// walked (counted `layout_mismatch`).
fn check_debug_offsets(mem: &ProcMem, runtime: u64, layout: &Layout) -> Result<(), PyAttach> {
    let mut bytes = vec![0u8; debug_offsets::READ_LEN];
    mem.read(runtime, &mut bytes)
        .map_err(|_| PyAttach::Memory)?;
    let published = debug_offsets::parse(&bytes)
        .map_err(|_| PyAttach::LayoutMismatch)?
        .layout;
    let walker = |l: &Layout| {
        (
            l.tstate_frame,
            l.frame_code,
            l.frame_previous,
            l.frame_instr,
            l.frame_owner,
            l.code_firstlineno,
            l.code_filename,
            l.code_name,
            l.code_qualname,
            l.code_linetable,
            l.code_adaptive,
            (l.runtime_interp_head, l.interp_threads_head, l.tstate_next),
        )
    };
    if walker(&published) != walker(layout) {
        return Err(PyAttach::LayoutMismatch);
    }
    Ok(())
}

/// 3.12+, when the pthread key is out of the BPF read's reach: the thread's current state
/// is the thread-local `_Py_tss_tstate` (null while the thread has released the GIL), in
/// the static TLS block of an executable (`%fs`-relative), or in libpython's dynamic TLS
/// block, whose module id and offset its GOT slot for `__tls_get_addr` holds once
/// relocated. `None` where neither is known.
fn thread_local(mem: &ProcMem, interp: &Interpreter, bias: u64) -> Option<ember_py_proc> {
    if interp.version.minor < 12 {
        return None;
    }
    if let Some(offset) = interp.tls_static {
        return Some(ember_py_proc {
            tls_offset: offset,
            tls_mode: ember_py_tls::EMBER_PY_TLS_TP.0 as u8,
            ..Default::default()
        });
    }
    let got = interp.tls_got?.wrapping_add(bias);
    let module = mem.u64_at(got).ok()?;
    let offset = mem.u64_at(got + 8).ok()?;
    // glibc numbers modules from 1; an offset inside a TLS block of reasonable size.
    if !(1..=4096).contains(&module) || offset >= 1 << 20 {
        return None;
    }
    Some(ember_py_proc {
        tls_offset: offset as i64,
        tls_module: module,
        tls_mode: ember_py_tls::EMBER_PY_TLS_DTV.0 as u8,
        ..Default::default()
    })
}

/// The walker's offsets from `layout`.
fn fill_layout(e: &mut ember_py_proc, l: &Layout) {
    e.model = match l.model {
        FrameModel::Objects => ember_py_model::EMBER_PY_OBJECTS,
        FrameModel::Entry => ember_py_model::EMBER_PY_ENTRY,
        FrameModel::CStack => ember_py_model::EMBER_PY_CSTACK,
    }
    .0 as u8;
    e.owner_cstack = l.owner_cstack;
    e.code_tagged = u8::from(l.frame_code_tagged);
    e.tstate_frame = l.tstate_frame;
    e.cframe_current = l.cframe_current.unwrap_or(NO_FIELD);
    e.frame_code = l.frame_code;
    e.frame_previous = l.frame_previous;
    e.frame_instr = l.frame_instr;
    e.frame_owner = l.frame_owner;
    e.frame_size = l.frame_size;
    e.code_firstlineno = l.code_firstlineno;
    e.code_adaptive = l.code_adaptive.unwrap_or(0);
    e.object_type = l.object_type;
    e.frame_tlbc = l.frame_tlbc_index.unwrap_or(NO_FIELD);
    e.code_tlbc = l.code_tlbc.unwrap_or(0);
}

#[cfg(test)]
mod tests {
    use super::{is_glibc, is_musl};

    #[test]
    fn musl_is_told_by_its_file_name() {
        assert!(is_musl("/lib/ld-musl-x86_64.so.1"));
        assert!(is_musl("/usr/lib/x86_64-linux-musl/libc.so"));
        assert!(!is_musl("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(!is_musl("/opt/musl-notes/libfoo.so"));
    }

    #[test]
    fn glibc_is_told_by_its_file_name() {
        assert!(is_glibc("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(is_glibc("/lib64/ld-linux-x86-64.so.2"));
        assert!(is_glibc("/lib/libc-2.17.so"));
        assert!(!is_glibc("/usr/lib/x86_64-linux-musl/libc.so"));
        assert!(!is_glibc("/lib/libc.musl-x86_64.so.1"));
        assert!(!is_glibc("/lib/ld-musl-x86_64.so.1"));
    }
}
