//! The table's rows and pages: Rust mirrors of `struct ember_unwind_row` and
//! `struct ember_unwind_page` in `agent/bpf/ember.h` (checked against the skeleton's
//! types in the agent's `normalize/unwind/abi.rs`), and the typed view of their rule bytes.

/// log2 of the page size: rows carry the low 12 bits of their address, the page
/// index the rest (`EMBER_UNWIND_PAGE_SHIFT`).
pub const PAGE_SHIFT: u32 = 12;
/// Bytes per page.
pub const PAGE_SIZE: u64 = 1 << PAGE_SHIFT;

/// One unwind row, as the sampler reads it: the rule in force from `pc_low` (within its
/// page) to the next row.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UnwindRow {
    /// The address of the row's first instruction within its page.
    pub pc_low: u16,
    /// A [`CfaRule`] as its byte.
    pub cfa_rule: u8,
    /// An [`RbpRule`] as its byte.
    pub rbp_rule: u8,
    /// Offset for the CFA rule; read as `i16` for [`CfaRule::RbpDeref`].
    pub cfa_offset: u16,
    /// Offset for the rbp rule; for [`CfaRule::Plt`], the `rip & 15` threshold.
    pub rbp_offset: i16,
}

/// One 4 KiB page of a table: where its rows start and how many there are.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UnwindPage {
    /// Index of the page's first row in the table's rows.
    pub first_row: u32,
    /// Rows of the page; at least 1, and the first has `pc_low` 0.
    pub row_count: u32,
}

/// How the caller's frame address (CFA) is found (`enum ember_cfa_rule`).
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CfaRule {
    /// CFI that rows cannot express (a CFA in another register, an unknown expression, a
    /// return address not at CFA - 8, an offset out of range): the walk stops there.
    Unsupported = 0,
    /// CFA = rsp + `cfa_offset`.
    Rsp = 1,
    /// CFA = rbp + `cfa_offset`.
    Rbp = 2,
    /// CFA = *(rbp + `cfa_offset as i16`): gcc's code for a function that realigns its stack.
    RbpDeref = 3,
    /// A PLT stub: CFA = rsp + `cfa_offset` + ((rip & 15) >= `rbp_offset`) * 8.
    Plt = 4,
    /// A signal trampoline (`__restore_rt`): rsp points at the `ucontext` of the
    /// `rt_sigframe`, whose `mcontext` (the interrupted registers) is at rsp + 40.
    Signal = 5,
    /// The outermost frame: the object's entry point (`_start`), or CFI that marks the
    /// return address undefined (a thread's entry in `clone3`).
    Stop = 6,
    /// No CFI covers this address: unwind with the frame pointer.
    FramePointer = 7,
}

impl CfaRule {
    /// The rule of a row's byte; `None` for a byte no rule has.
    pub fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            0 => Self::Unsupported,
            1 => Self::Rsp,
            2 => Self::Rbp,
            3 => Self::RbpDeref,
            4 => Self::Plt,
            5 => Self::Signal,
            6 => Self::Stop,
            7 => Self::FramePointer,
            _ => return None,
        })
    }
}

/// Where the caller's rbp is (`enum ember_rbp_rule`). The return address is always at
/// CFA - 8 in a row that the walk can follow.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RbpRule {
    /// rbp still holds the caller's value.
    Unchanged = 0,
    /// Saved at CFA + `rbp_offset`.
    AtCfa = 1,
    /// Saved at rbp + `rbp_offset` (a realigned stack).
    AtRbp = 2,
    /// Not recoverable: a caller frame that needs rbp cannot be found.
    Unknown = 3,
}

impl RbpRule {
    /// The rule of a row's byte; `None` for a byte no rule has.
    pub fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            0 => Self::Unchanged,
            1 => Self::AtCfa,
            2 => Self::AtRbp,
            3 => Self::Unknown,
            _ => return None,
        })
    }
}

/// A row's rule without its address: what the compiler compares to drop a row that
/// repeats the one before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rule {
    /// How the CFA is found.
    pub cfa: CfaRule,
    /// Where the caller's rbp is.
    pub rbp: RbpRule,
    /// See [`UnwindRow::cfa_offset`].
    pub cfa_offset: u16,
    /// See [`UnwindRow::rbp_offset`].
    pub rbp_offset: i16,
}

impl Rule {
    /// A rule with no offsets.
    pub const fn bare(cfa: CfaRule) -> Self {
        Self {
            cfa,
            rbp: RbpRule::Unchanged,
            cfa_offset: 0,
            rbp_offset: 0,
        }
    }

    /// The row of this rule at an address.
    pub fn at(self, addr: u64) -> UnwindRow {
        UnwindRow {
            // Truncation intended: the page index carries the rest.
            pc_low: (addr & (PAGE_SIZE - 1)) as u16,
            cfa_rule: self.cfa as u8,
            rbp_rule: self.rbp as u8,
            cfa_offset: self.cfa_offset,
            rbp_offset: self.rbp_offset,
        }
    }
}

impl UnwindRow {
    /// The row's rule; `None` if a rule byte is out of range (never for a compiled table).
    pub fn rule(&self) -> Option<Rule> {
        Some(Rule {
            cfa: CfaRule::from_u8(self.cfa_rule)?,
            rbp: RbpRule::from_u8(self.rbp_rule)?,
            cfa_offset: self.cfa_offset,
            rbp_offset: self.rbp_offset,
        })
    }
}
