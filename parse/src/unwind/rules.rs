//! One row's rules: what gimli's table says of the CFA, the return address and rbp at an
//! address, as the [`Rule`] the sampler follows. Only the rules an x86-64 walk needs are
//! kept (rsp/rbp + offset, the PLT's and gcc's realigned-frame expressions, rbp saved at
//! the CFA or below rbp); anything else becomes an unsupported row, counted by reason.

use gimli::{
    CfaRule as GimliCfa, EndianSlice, LittleEndian, Operation, Register, RegisterRule,
    UnwindExpression, UnwindSection, UnwindTableRow,
};

use super::error::UnsupportedReason;
use super::row::{CfaRule, RbpRule, Rule};

/// x86-64 DWARF register numbers.
const RBP: Register = Register(6);
const RSP: Register = Register(7);
/// The return address column.
pub(super) const RA: Register = Register(16);

/// The reader gimli parses CFI with.
pub(super) type Reader<'a> = EndianSlice<'a, LittleEndian>;

/// Rows that became [`CfaRule::Unsupported`] or lost their rbp rule, by reason, indexed
/// like [`UnsupportedReason::ALL`] (`Stats::unsupported`).
pub(super) type Unsupported = [u64; UnsupportedReason::ALL.len()];

fn unsupported(counts: &mut Unsupported, reason: UnsupportedReason) -> Rule {
    counts[reason as usize] += 1;
    Rule::bare(CfaRule::Unsupported)
}

/// The rule of one row of gimli's table; a row ember cannot express counts in `counts`.
pub(super) fn to_rule<'a, S: UnwindSection<Reader<'a>>>(
    row: &UnwindTableRow<usize>,
    section: &S,
    counts: &mut Unsupported,
) -> Rule {
    match row.register(RA) {
        Some(RegisterRule::Undefined) => return Rule::bare(CfaRule::Stop),
        Some(RegisterRule::Offset(-8)) => {}
        _ => return unsupported(counts, UnsupportedReason::ReturnAddress),
    }
    let mut rule = match row.cfa() {
        GimliCfa::RegisterAndOffset { register, offset } => {
            let cfa = match *register {
                RSP => CfaRule::Rsp,
                RBP => CfaRule::Rbp,
                _ => return unsupported(counts, UnsupportedReason::CfaRegister),
            };
            let Ok(cfa_offset) = u16::try_from(*offset) else {
                return unsupported(counts, UnsupportedReason::OffsetRange);
            };
            Rule {
                cfa_offset,
                ..Rule::bare(cfa)
            }
        }
        GimliCfa::Expression(e) => match cfa_expression(e, section) {
            Some(rule) => rule,
            None => return unsupported(counts, UnsupportedReason::CfaExpression),
        },
    };
    if rule.cfa == CfaRule::Plt {
        // A PLT stub never touches rbp; rbp_offset holds its threshold.
        return rule;
    }
    let at = match row.register(RBP) {
        None | Some(RegisterRule::SameValue) => Some((RbpRule::Unchanged, 0)),
        Some(RegisterRule::Undefined) => None,
        Some(RegisterRule::Offset(n)) => match i16::try_from(n) {
            Ok(n) => Some((RbpRule::AtCfa, n)),
            Err(_) => {
                counts[UnsupportedReason::OffsetRange as usize] += 1;
                None
            }
        },
        Some(RegisterRule::Expression(e)) => match rbp_expression(&e, section) {
            Some(n) => Some((RbpRule::AtRbp, n)),
            None => {
                counts[UnsupportedReason::RbpRule as usize] += 1;
                None
            }
        },
        Some(_) => {
            counts[UnsupportedReason::RbpRule as usize] += 1;
            None
        }
    };
    (rule.rbp, rule.rbp_offset) = at.unwrap_or((RbpRule::Unknown, 0));
    rule
}

/// Most operations a recognised expression has (the PLT's: 9).
const MAX_OPS: usize = 12;

/// The operations of a CFI expression, or `None` if it has more than [`MAX_OPS`] or does
/// not parse.
fn operations<'a, S: UnwindSection<Reader<'a>>>(
    e: &UnwindExpression<usize>,
    section: &S,
) -> Option<Vec<Operation<Reader<'a>>>> {
    let encoding = gimli::Encoding {
        format: gimli::Format::Dwarf32,
        version: 4,
        address_size: 8,
    };
    let mut ops = e.get(section).ok()?.operations(encoding);
    let mut out = Vec::new();
    while let Some(op) = ops.next().ok()? {
        if out.len() == MAX_OPS {
            return None;
        }
        out.push(op);
    }
    Some(out)
}

/// The two CFA expressions x86-64 toolchains emit: the linker's for PLT stubs, and gcc's
/// for a function that realigns its stack (the CFA saved below rbp).
fn cfa_expression<'a, S: UnwindSection<Reader<'a>>>(
    e: &UnwindExpression<usize>,
    section: &S,
) -> Option<Rule> {
    use Operation::{And, Deref, Ge, Plus, RegisterOffset, Shl, UnsignedConstant};
    match operations(e, section)?.as_slice() {
        // rsp + a + ((rip & 15) >= n) << 3
        [RegisterOffset {
            register: RSP,
            offset: a,
            ..
        }, RegisterOffset {
            register: RA,
            offset: 0,
            ..
        }, UnsignedConstant { value: 15 }, And, UnsignedConstant { value: n }, Ge, UnsignedConstant { value: 3 }, Shl, Plus] => {
            Some(Rule {
                cfa_offset: u16::try_from(*a).ok()?,
                rbp_offset: i16::try_from(*n).ok().filter(|n| *n <= 16)?,
                ..Rule::bare(CfaRule::Plt)
            })
        }
        // *(rbp + a)
        [RegisterOffset {
            register: RBP,
            offset: a,
            ..
        }, Deref { size: 8, .. }] => Some(Rule {
            // The row's u16 carries an i16 for this rule.
            cfa_offset: i16::try_from(*a).ok()? as u16,
            ..Rule::bare(CfaRule::RbpDeref)
        }),
        _ => None,
    }
}

/// gcc's rule for rbp in a function that realigns its stack: saved at rbp + n.
fn rbp_expression<'a, S: UnwindSection<Reader<'a>>>(
    e: &UnwindExpression<usize>,
    section: &S,
) -> Option<i16> {
    match operations(e, section)?.as_slice() {
        [Operation::RegisterOffset {
            register: RBP,
            offset,
            ..
        }] => i16::try_from(*offset).ok(),
        _ => None,
    }
}
