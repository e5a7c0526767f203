//! The out-of-line part of `_PyEval_EvalFrameDefault` in an interpreter stripped of
//! `.symtab`, where no `_PyEval_EvalFrameDefault.cold` symbol names it.
//!
//! GCC moves the blocks it judges cold into a separate range with its own FDE in
//! `.eh_frame`. With profile-guided builds that range can hold most of the loop: Debian's
//! static `python3.14` (3.14.10, GCC 16, PGO) has a 1,184-byte `_PyEval_EvalFrameDefault`
//! whose opcode handlers and their 251 computed gotos sit in an 84 KB range elsewhere in
//! `.text`, so a sample in a handler is in "the eval loop" only if that range is known.
//!
//! The range is found from the function's own code and `.eh_frame`: every `jmp rel32` and
//! `jcc rel32` pattern in the function's bytes whose target lies outside it is a vote for
//! the FDE holding the target (not at its first byte: a tail call lands there); the FDE
//! with the most votes is the cold part if it has at least [`MIN_VOTES`] and its first row
//! is no function entry (its CFA is not `rsp + 8`: a cold part continues its parent's
//! frame). Byte patterns that are not instructions vote too, but they land in random
//! places; the bars make a wrong pick need many of them in one FDE that is not an entry.

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EhFrame, LittleEndian, UnwindContext, UnwindSection,
};

use crate::elf_file::{ElfReader, ReadAt};

/// Votes the cold part needs (`objdump -d` counts 12 jumps into it in Debian's 3.14.10, 378
/// in its 3.11.2).
pub const MIN_VOTES: usize = 3;
/// Bytes of the eval function scanned at most.
const MAX_CODE: u64 = 1 << 20;
/// FDEs looked at most (Debian 3.14.10's `.eh_frame` has 5,100).
const MAX_FDES: usize = 1 << 18;
/// `.eh_frame` bytes read at most.
const MAX_EH_FRAME: u64 = 16 << 20;

/// DWARF register number of `rsp` on x86-64.
const RSP: u16 = 7;

/// The `[start, end)` of the cold part of the eval function at `eval`, if `.eh_frame` and
/// the function's code show one (see the module doc); `None` on any read error.
pub fn find_cold<R: ReadAt + ?Sized>(
    reader: &mut ElfReader<'_, R>,
    eval: (u64, u64),
) -> Option<(u64, u64)> {
    let len = eval.1.checked_sub(eval.0)?.min(MAX_CODE);
    let code = reader.read_vaddr(eval.0, len).ok()?;
    let mut targets = jump_targets(&code, eval);
    if targets.len() < MIN_VOTES {
        return None;
    }
    targets.sort_unstable();
    let index = reader.find_section(b".eh_frame")?;
    let section = *reader.sections().get(index)?;
    if section.size > MAX_EH_FRAME {
        return None;
    }
    let data = reader.section_data(index).ok()?;
    let eh = {
        let mut eh = EhFrame::new(&data, LittleEndian);
        eh.set_address_size(8);
        eh
    };
    let bases = BaseAddresses::default().set_eh_frame(section.addr);
    let mut best: Option<(usize, u64, u64)> = None;
    let mut entries = eh.entries(&bases);
    let mut ctx = UnwindContext::new();
    for _ in 0..MAX_FDES {
        let Ok(Some(entry)) = entries.next() else {
            break;
        };
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(|s, b, o| s.cie_from_offset(b, o)) else {
            continue;
        };
        let (start, end) = (fde.initial_address(), fde.end_address());
        // Targets strictly inside (start, end): a jump to `start` is a tail call.
        let from = targets.partition_point(|&t| t <= start);
        let to = targets.partition_point(|&t| t < end);
        let votes = to.saturating_sub(from);
        if votes < MIN_VOTES || best.is_some_and(|(v, _, _)| v >= votes) {
            continue;
        }
        let entry_like = fde
            .rows(&eh, &bases, &mut ctx)
            .ok()
            .and_then(|mut rows| match rows.next_row() {
                Ok(Some(row)) => Some(matches!(
                    row.cfa(),
                    CfaRule::RegisterAndOffset { register, offset: 8 } if register.0 == RSP
                )),
                _ => None,
            })
            .unwrap_or(true);
        if !entry_like {
            best = Some((votes, start, end));
        }
    }
    best.map(|(_, start, end)| (start, end))
}

/// Targets of the `jmp rel32` (`e9`) and `jcc rel32` (`0f 80`–`0f 8f`) patterns in `code`
/// (the bytes at `eval.0`) that land outside `[eval.0, eval.1)`.
fn jump_targets(code: &[u8], eval: (u64, u64)) -> Vec<u64> {
    let rel = |at: usize| -> Option<i64> {
        let b = code.get(at..at + 4)?;
        Some(i64::from(i32::from_le_bytes(b.try_into().ok()?)))
    };
    let mut out = Vec::new();
    for i in 0..code.len() {
        let (operand, next) = match (code[i], code.get(i + 1)) {
            (0xe9, _) => (i + 1, i + 5),
            (0x0f, Some(op)) if (0x80..=0x8f).contains(op) => (i + 2, i + 6),
            _ => continue,
        };
        let Some(r) = rel(operand) else {
            continue;
        };
        let target = eval.0.wrapping_add(next as u64).wrapping_add_signed(r);
        if target < eval.0 || target >= eval.1 {
            out.push(target);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_out_of_the_function_are_collected() {
        // jmp +0x100 (out), jne -0x20 (out, before), jmp +0 (in), a call (ignored).
        let mut code = vec![0xe9, 0x00, 0x01, 0x00, 0x00];
        code.extend([0x0f, 0x85, 0xe0, 0xff, 0xff, 0xff]);
        code.extend([0xe9, 0x00, 0x00, 0x00, 0x00]);
        code.extend([0xe8, 0x00, 0x10, 0x00, 0x00]);
        code.extend([0x90; 12]);
        let base = 0x1000;
        let got = jump_targets(&code, (base, base + code.len() as u64));
        assert_eq!(got, vec![base + 5 + 0x100, base + 11 - 0x20]);
        // Truncated patterns at the end are not read past the bytes.
        assert!(jump_targets(&[0x0f, 0x85, 0x00], (0, 3)).is_empty());
        assert!(jump_targets(&[0xe9, 0x00], (0, 2)).is_empty());
    }
}
