//! Where a C library keeps a thread's pthread keys, for readers of another process's
//! thread-specific data (CPython keeps each thread's state under a key, `autoTSSkey`).
//!
//! glibc's layout is fixed for the versions ember supports (the agent knows it). musl's
//! `struct pthread` has moved between releases, so its `tsd` offset is read from musl's
//! own `pthread_getspecific`, which on x86-64 is four instructions:
//!
//! ```text
//! mov %fs:0x0,%rax          ; the thread's struct pthread (its `self` field)
//! mov 0x80(%rax),%rax       ; self->tsd               <- the offset we want
//! mov %edi,%edi             ; (the key, zero-extended; optional)
//! mov (%rax,%rdi,8),%rax    ; tsd[key]
//! ```
//!
//! The decoder accepts any of the eight legacy registers in those roles and a one- or
//! four-byte displacement, and nothing else: another shape is refused, never guessed.

use object::elf;

use crate::elf_file::{ElfError, ElfReader, ReadAt};

/// Bytes of `pthread_getspecific` read (the pattern fits in 24).
const CODE_BYTES: u64 = 32;
/// The largest `tsd` offset believed: `struct pthread` is a few hundred bytes.
const MAX_TSD_OFFSET: u32 = 4096;

/// `offsetof(struct pthread, tsd)` of the musl libc `reader` holds, from its
/// `pthread_getspecific`; `None` if the object does not define that function or its code
/// is not the shape above.
pub fn musl_tsd_offset<R: ReadAt + ?Sized>(
    reader: &mut ElfReader<'_, R>,
) -> Result<Option<u32>, ElfError> {
    // The shared libc exports it; a static executable (musl linked in) has it in `.symtab`.
    let mut at = None;
    for kind in [elf::SHT_DYNSYM, elf::SHT_SYMTAB] {
        let Some(syms) = reader.symbol_data(kind)? else {
            continue;
        };
        syms.functions(|f| {
            if f.name == b"pthread_getspecific" && at.is_none() {
                at = Some(f.addr);
            }
        });
        if at.is_some() {
            break;
        }
    }
    let Some(at) = at else {
        return Ok(None);
    };
    let code = reader.read_vaddr(at, CODE_BYTES)?;
    Ok(decode_getspecific(&code))
}

/// The `tsd` displacement of a `pthread_getspecific` whose code starts `code` (see the
/// module doc), or `None`.
pub fn decode_getspecific(code: &[u8]) -> Option<u32> {
    // mov %fs:0x0,%r64: 64 48 8b (00 reg 100) 25 00000000
    let [0x64, 0x48, 0x8b, modrm, 0x25, 0, 0, 0, 0, rest @ ..] = code else {
        return None;
    };
    if modrm & 0xc7 != 0x04 {
        return None;
    }
    let this = (modrm >> 3) & 7;
    // mov disp(%this),%tsd: 48 8b (mod reg rm=this) disp8|disp32
    let [0x48, 0x8b, modrm, rest @ ..] = rest else {
        return None;
    };
    let tsd = (modrm >> 3) & 7;
    if modrm & 7 != this || this == 4 {
        return None;
    }
    let (disp, rest) = match modrm >> 6 {
        1 => {
            let (&d, rest) = rest.split_first()?;
            (u32::from(d), rest)
        }
        2 => {
            let (d, rest) = rest.split_first_chunk::<4>()?;
            (u32::from_le_bytes(*d), rest)
        }
        _ => return None,
    };
    // mov %edi,%edi: the key is an unsigned int.
    let rest = rest.strip_prefix(&[0x89, 0xff]).unwrap_or(rest);
    // mov (%tsd,%rdi,8),%r64: 48 8b (00 reg 100) (11 111 base=tsd)
    let [0x48, 0x8b, modrm, sib, ..] = rest else {
        return None;
    };
    let scaled = modrm & 0xc7 == 0x04 && *sib == 0xf8 | tsd && tsd != 5;
    (scaled && disp % 8 == 0 && disp <= MAX_TSD_OFFSET).then_some(disp)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Debian 12's musl 1.2.3 (`objdump -d /usr/lib/x86_64-linux-musl/libc.so`).
    const DEBIAN_MUSL_1_2_3: &[u8] = &[
        0x64, 0x48, 0x8b, 0x04, 0x25, 0, 0, 0, 0, // mov %fs:0x0,%rax
        0x48, 0x8b, 0x80, 0x80, 0, 0, 0, // mov 0x80(%rax),%rax
        0x89, 0xff, // mov %edi,%edi
        0x48, 0x8b, 0x04, 0xf8, // mov (%rax,%rdi,8),%rax
        0xc3, // ret
    ];

    #[test]
    fn debian_musl() {
        assert_eq!(decode_getspecific(DEBIAN_MUSL_1_2_3), Some(0x80));
    }

    #[test]
    fn other_registers_and_short_displacement() {
        // mov %fs:0,%rdx; mov 0x78(%rdx),%rcx; mov (%rcx,%rdi,8),%rax
        let code = [
            0x64, 0x48, 0x8b, 0x14, 0x25, 0, 0, 0, 0, 0x48, 0x8b, 0x4a, 0x78, 0x48, 0x8b, 0x04,
            0xf9, 0xc3,
        ];
        assert_eq!(decode_getspecific(&code), Some(0x78));
    }

    #[test]
    fn other_shapes_are_refused() {
        let mut wrong_base = DEBIAN_MUSL_1_2_3.to_vec();
        wrong_base[21] = 0xf9; // tsd[key] read through %rcx, not the register loaded
        let mut unaligned = DEBIAN_MUSL_1_2_3.to_vec();
        unaligned[12] = 0x84;
        let mut huge = DEBIAN_MUSL_1_2_3.to_vec();
        huge[13] = 0x10;
        let mut not_fs = DEBIAN_MUSL_1_2_3.to_vec();
        // %gs, not %fs.
        not_fs[0] = 0x65;
        // glibc 2.36's starts with `cmp $0x1f,%edi`.
        let glibc = [0x83, 0xff, 0x1f, 0x77, 0x2d];
        for code in [
            &wrong_base[..],
            &unaligned,
            &huge,
            &not_fs,
            &glibc,
            &DEBIAN_MUSL_1_2_3[..12],
            &[],
        ] {
            assert_eq!(decode_getspecific(code), None, "{code:02x?}");
        }
    }

    /// The whole path over a real object, where Debian's `musl` package is installed (the
    /// Makefile installs it for the musl CPython build).
    #[test]
    fn real_debian_libc() {
        let path = "/usr/lib/x86_64-linux-musl/libc.so";
        let Ok(data) = std::fs::read(path) else {
            eprintln!("SKIP {path}: musl not installed");
            return;
        };
        let limits = crate::elf_file::Limits {
            max_read_bytes: 8 << 20,
            max_section_bytes: 4 << 20,
        };
        let mut reader = ElfReader::new(&data[..], limits).unwrap();
        assert_eq!(musl_tsd_offset(&mut reader).unwrap(), Some(0x80));
        // glibc defines the function too, in another shape: refused.
        let glibc = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        let mut reader = ElfReader::new(&glibc[..], limits).unwrap();
        assert_eq!(musl_tsd_offset(&mut reader).unwrap(), None);
    }

    /// A static musl executable (musl linked in, found in `.symtab`), built with Debian's
    /// `musl-gcc -static` where it is installed (the Makefile's musl CPython build needs it).
    #[test]
    fn real_static_musl_executable() {
        let dir = std::env::temp_dir().join(format!("ember-static-musl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("key.c");
        std::fs::write(
            &src,
            "#include <pthread.h>\nstatic pthread_key_t k;\n\
             int main(void) { pthread_key_create(&k, 0); return pthread_getspecific(k) != 0; }\n",
        )
        .unwrap();
        let exe = dir.join("key");
        let built = std::process::Command::new("musl-gcc")
            .args(["-static", "-O2", "-o"])
            .arg(&exe)
            .arg(&src)
            .status();
        if !matches!(built, Ok(s) if s.success()) {
            eprintln!("SKIP: musl-gcc -static unavailable (musl-tools not installed)");
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
        let data = std::fs::read(&exe).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let limits = crate::elf_file::Limits {
            max_read_bytes: 8 << 20,
            max_section_bytes: 4 << 20,
        };
        let mut reader = ElfReader::new(&data[..], limits).unwrap();
        assert!(
            !reader.info().interp,
            "a static executable has no PT_INTERP"
        );
        assert_eq!(musl_tsd_offset(&mut reader).unwrap(), Some(0x80));
    }

    #[test]
    fn decodes_every_prefix_without_panic() {
        for n in 0..DEBIAN_MUSL_1_2_3.len() {
            let _ = decode_getspecific(&DEBIAN_MUSL_1_2_3[..n]);
        }
    }
}
