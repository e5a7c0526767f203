//! The code type's own member list, checked at attach: `PyCode_Type.tp_members` is the table
//! CPython uses for `code.co_filename` and the like, each entry a name and the field's offset
//! in the code object. The symbolizer reads some of those fields with offsets from ember's
//! table (3.8–3.12) or the interpreter's `_Py_DebugOffsets` (3.13+); the process's own list
//! must put each of them at the same offset, or the layout is not this interpreter's.
//!
//! Every read is of hostile memory: the list is read one entry at a time, at most
//! [`MAX_MEMBERS`] entries, each name at most [`NAME_BYTES`] bytes.

use ember_parse::python::layout::Layout;
use ember_parse::python::Version;

use super::memory::ProcMem;

/// `PyTypeObject.tp_members`, from the type's `ob_type` field: the same in 3.8–3.14 (the
/// fields between, `tp_name` to `tp_methods`, have not moved; `tp_flags` is 136 past it as
/// the 3.13+ tables say).
const TP_MEMBERS_PAST_OB_TYPE: u64 = 232;
/// `sizeof(PyMemberDef)`: name, type, offset, flags, doc.
const MEMBER_SIZE: usize = 40;
/// `PyMemberDef.offset`.
const MEMBER_OFFSET: usize = 16;
/// Entries read before the list is taken as forged (the code type lists about 15).
pub const MAX_MEMBERS: usize = 64;
/// Bytes of a name read: the longest name looked for, `co_firstlineno`, and its NUL fit.
const NAME_BYTES: usize = 16;

/// Why the check refused a layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MembersError {
    /// The type or its list could not be read.
    Unreadable,
    /// A field the symbolizer reads is listed at another offset.
    Moved(&'static str),
    /// A field the symbolizer reads is not in the list (or the list has no end).
    Missing(&'static str),
}

/// The code-object fields ember reads, by the names the type lists them under.
fn wanted(l: &Layout, v: Version) -> Vec<(&'static str, u16)> {
    let mut w = vec![
        ("co_firstlineno", l.code_firstlineno),
        ("co_filename", l.code_filename),
        ("co_name", l.code_name),
    ];
    // 3.10 replaced `co_lnotab` with `co_linetable` (lnotab became a computed getter).
    let table = if v.minor <= 9 {
        "co_lnotab"
    } else {
        "co_linetable"
    };
    w.push((table, l.code_linetable));
    if let Some(q) = l.code_qualname {
        w.push(("co_qualname", q));
    }
    w
}

/// Checks the member list of the code type at `code_type` against `l`; `Ok` with the number
/// of fields checked.
pub fn check_code_members(
    mem: &ProcMem,
    code_type: u64,
    l: &Layout,
    v: Version,
) -> Result<usize, MembersError> {
    let at = code_type + u64::from(l.object_type) + TP_MEMBERS_PAST_OB_TYPE;
    let list = mem.u64_at(at).map_err(|_| MembersError::Unreadable)?;
    if list == 0 {
        return Err(MembersError::Unreadable);
    }
    let mut want = wanted(l, v);
    let total = want.len();
    let mut entry = [0u8; MEMBER_SIZE];
    for i in 0..MAX_MEMBERS {
        if want.is_empty() {
            break;
        }
        mem.read(list + (i * MEMBER_SIZE) as u64, &mut entry)
            .map_err(|_| MembersError::Unreadable)?;
        let word = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&entry[o..o + 8]);
            u64::from_le_bytes(b)
        };
        let name = word(0);
        if name == 0 {
            break;
        }
        let Some(name) = read_name(mem, name) else {
            continue;
        };
        if let Some(k) = want
            .iter()
            .position(|(n, _)| n.as_bytes() == name.as_slice())
        {
            let (field, offset) = want.swap_remove(k);
            if word(MEMBER_OFFSET) != u64::from(offset) {
                return Err(MembersError::Moved(field));
            }
        }
    }
    match want.first() {
        None => Ok(total),
        Some((field, _)) => Err(MembersError::Missing(field)),
    }
}

/// A member's name up to its NUL, `None` if unreadable or longer than any name looked for.
fn read_name(mem: &ProcMem, at: u64) -> Option<Vec<u8>> {
    let mut b = [0u8; NAME_BYTES];
    mem.read(at, &mut b).ok()?;
    let end = b.iter().position(|&c| c == 0)?;
    Some(b[..end].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_parse::python::layout::layout_for;
    use std::ffi::CString;

    /// A code type in this process's memory: its head up to `tp_members`, which points at a
    /// list of `entries` (name, offset), ended by a null name unless `unterminated`.
    struct FakeType {
        type_bytes: Vec<u8>,
        _names: Vec<CString>,
        _list: Vec<u8>,
    }

    fn fake(object_type: u16, entries: &[(&str, u64)], unterminated: bool) -> FakeType {
        let names: Vec<CString> = entries
            .iter()
            .map(|(n, _)| CString::new(*n).unwrap())
            .collect();
        let mut list = Vec::new();
        for (name, (_, offset)) in names.iter().zip(entries) {
            let mut e = [0u8; MEMBER_SIZE];
            e[..8].copy_from_slice(&(name.as_ptr() as u64).to_le_bytes());
            e[MEMBER_OFFSET..MEMBER_OFFSET + 8].copy_from_slice(&offset.to_le_bytes());
            list.extend_from_slice(&e);
        }
        if unterminated {
            // The last entry again and again, up to past the cap.
            let last = list[list.len() - MEMBER_SIZE..].to_vec();
            while list.len() < (MAX_MEMBERS + 2) * MEMBER_SIZE {
                list.extend_from_slice(&last);
            }
        } else {
            list.extend_from_slice(&[0u8; MEMBER_SIZE]);
        }
        let mut type_bytes = vec![0u8; 512];
        let at = usize::from(object_type) + TP_MEMBERS_PAST_OB_TYPE as usize;
        type_bytes[at..at + 8].copy_from_slice(&(list.as_ptr() as u64).to_le_bytes());
        FakeType {
            type_bytes,
            _names: names,
            _list: list,
        }
    }

    fn v(minor: u8) -> Version {
        Version {
            major: 3,
            minor,
            micro: 0,
            free_threaded: false,
        }
    }

    fn check(t: &FakeType, l: &Layout, minor: u8) -> Result<usize, MembersError> {
        let mem = ProcMem::new(std::process::id());
        check_code_members(&mem, t.type_bytes.as_ptr() as u64, l, v(minor))
    }

    /// 3.12's list, as `code_memberlist` declares it, with the table's offsets.
    fn list_312(l: &Layout) -> Vec<(&'static str, u64)> {
        vec![
            ("co_argcount", 52),
            ("co_flags", 48),
            ("co_firstlineno", l.code_firstlineno.into()),
            ("co_filename", l.code_filename.into()),
            ("co_name", l.code_name.into()),
            ("co_qualname", l.code_qualname.unwrap().into()),
            ("co_linetable", l.code_linetable.into()),
            ("co_exceptiontable", 144),
        ]
    }

    #[test]
    fn a_list_that_agrees_passes() {
        let l = layout_for(v(12)).unwrap();
        let t = fake(l.object_type, &list_312(&l), false);
        assert_eq!(check(&t, &l, 12), Ok(5));
        // 3.9 lists co_lnotab and no qualified name.
        let l9 = layout_for(v(9)).unwrap();
        let list = [
            ("co_lnotab", u64::from(l9.code_linetable)),
            ("co_name", l9.code_name.into()),
            ("co_filename", l9.code_filename.into()),
            ("co_firstlineno", l9.code_firstlineno.into()),
        ];
        assert_eq!(check(&fake(8, &list, false), &l9, 9), Ok(4));
    }

    #[test]
    fn a_moved_or_missing_field_is_refused() {
        let l = layout_for(v(12)).unwrap();
        let mut moved = list_312(&l);
        moved[4].1 += 8;
        assert_eq!(
            check(&fake(8, &moved, false), &l, 12),
            Err(MembersError::Moved("co_name"))
        );
        let missing: Vec<_> = list_312(&l)
            .into_iter()
            .filter(|(n, _)| *n != "co_qualname")
            .collect();
        assert_eq!(
            check(&fake(8, &missing, false), &l, 12),
            Err(MembersError::Missing("co_qualname"))
        );
    }

    #[test]
    fn a_forged_list_costs_a_bounded_read() {
        let l = layout_for(v(12)).unwrap();
        // No end: the reads stop at the cap.
        let endless = [("co_flags", 48u64)];
        assert!(matches!(
            check(&fake(8, &endless, true), &l, 12),
            Err(MembersError::Missing(_))
        ));
        // A list pointer to unmapped memory, and none at all.
        let mut t = fake(8, &list_312(&l), false);
        let at = 8 + TP_MEMBERS_PAST_OB_TYPE as usize;
        t.type_bytes[at..at + 8].copy_from_slice(&8u64.to_le_bytes());
        assert_eq!(check(&t, &l, 12), Err(MembersError::Unreadable));
        t.type_bytes[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(check(&t, &l, 12), Err(MembersError::Unreadable));
    }

    #[test]
    fn a_free_threaded_type_is_read_past_its_longer_head() {
        let l = Layout {
            object_type: 24,
            ..layout_for(v(12)).unwrap()
        };
        let t = fake(24, &list_312(&l), false);
        assert_eq!(check(&t, &l, 12), Ok(5));
    }
}
