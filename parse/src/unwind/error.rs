//! What can go wrong compiling a table: a whole-object failure ([`UnwindError`], one
//! [`ErrorReason`] label each), and the entries and rows given up inside an object that
//! still compiled ([`SkipReason`], [`UnsupportedReason`]). Every label is a fixed string
//! so it can be a metric label value.

/// Why no table was built for an object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnwindError {
    /// The object is larger than [`super::Limits::max_object_bytes`].
    #[error("object is {bytes} bytes, over the cap of {max}")]
    TooLarge {
        /// Size of the object.
        bytes: u64,
        /// The cap.
        max: u64,
    },
    /// Not an ELF file, or its headers point outside it.
    #[error("not a readable ELF object: {0}")]
    BadElf(&'static str),
    /// The section headers, the section names or the CFI sections (together) are larger
    /// than what is read of them ([`super::Limits::max_cfi_bytes`] for CFI): refused
    /// before they are read.
    #[error("{what} is {bytes} bytes, over the cap of {max}")]
    SectionTooLarge {
        /// Which part of the object.
        what: &'static str,
        /// Its size, as the headers give it (clipped to the file).
        bytes: u64,
        /// The cap.
        max: u64,
    },
    /// An ELF object for another machine, class or byte order.
    #[error("not an x86-64 little-endian ELF64 object")]
    NotX86_64,
    /// Neither a loadable executable nor a shared object (e.g. a relocatable `.o`).
    #[error("ELF type {0} is neither an executable nor a shared object")]
    NotLoadable(u16),
    /// No `.eh_frame`/`.debug_frame`, or none of their entries describes code in the
    /// object: not a fault, the object is unwound with frame pointers.
    #[error("no usable call frame information")]
    NoCfi,
    /// Compiling would make more rows than [`super::Limits::max_rows`].
    #[error("more than {max} unwind rows")]
    TooManyRows {
        /// The cap.
        max: usize,
    },
    /// More CIEs and FDEs than [`super::Limits::max_entries`].
    #[error("more than {max} CFI entries")]
    TooManyEntries {
        /// The cap.
        max: usize,
    },
    /// The described code spans more 4 KiB pages than [`super::Limits::max_pages`].
    #[error("code spans {pages} pages, over the cap of {max}")]
    SpanTooLarge {
        /// Pages the rows would need.
        pages: u64,
        /// The cap.
        max: u64,
    },
    /// The CFA programs to interpret (each FDE's own plus its CIE's, again for every FDE
    /// sharing that CIE) exceed the work budget: a hostile object would otherwise cost
    /// time quadratic in its size.
    #[error("CFI programs exceed the work budget of {budget} bytes")]
    TooMuchWork {
        /// The budget in bytes of CFA program.
        budget: u64,
    },
}

/// [`UnwindError`] without its details: a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorReason {
    /// [`UnwindError::TooLarge`].
    TooLarge,
    /// [`UnwindError::BadElf`].
    BadElf,
    /// [`UnwindError::SectionTooLarge`].
    SectionTooLarge,
    /// [`UnwindError::NotX86_64`].
    NotX86_64,
    /// [`UnwindError::NotLoadable`].
    NotLoadable,
    /// [`UnwindError::NoCfi`].
    NoCfi,
    /// [`UnwindError::TooManyRows`].
    TooManyRows,
    /// [`UnwindError::TooManyEntries`].
    TooManyEntries,
    /// [`UnwindError::SpanTooLarge`].
    SpanTooLarge,
    /// [`UnwindError::TooMuchWork`].
    TooMuchWork,
}

impl ErrorReason {
    /// Every reason, for metrics that pre-register their labels.
    pub const ALL: [Self; 10] = [
        Self::TooLarge,
        Self::BadElf,
        Self::SectionTooLarge,
        Self::NotX86_64,
        Self::NotLoadable,
        Self::NoCfi,
        Self::TooManyRows,
        Self::TooManyEntries,
        Self::SpanTooLarge,
        Self::TooMuchWork,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TooLarge => "too_large",
            Self::BadElf => "bad_elf",
            Self::SectionTooLarge => "section_too_large",
            Self::NotX86_64 => "not_x86_64",
            Self::NotLoadable => "not_loadable",
            Self::NoCfi => "no_cfi",
            Self::TooManyRows => "too_many_rows",
            Self::TooManyEntries => "too_many_entries",
            Self::SpanTooLarge => "span_too_large",
            Self::TooMuchWork => "too_much_work",
        }
    }
}

impl UnwindError {
    /// The metric label of this error.
    pub fn reason(&self) -> ErrorReason {
        match self {
            Self::TooLarge { .. } => ErrorReason::TooLarge,
            Self::BadElf(_) => ErrorReason::BadElf,
            Self::SectionTooLarge { .. } => ErrorReason::SectionTooLarge,
            Self::NotX86_64 => ErrorReason::NotX86_64,
            Self::NotLoadable(_) => ErrorReason::NotLoadable,
            Self::NoCfi => ErrorReason::NoCfi,
            Self::TooManyRows { .. } => ErrorReason::TooManyRows,
            Self::TooManyEntries { .. } => ErrorReason::TooManyEntries,
            Self::SpanTooLarge { .. } => ErrorReason::SpanTooLarge,
            Self::TooMuchWork { .. } => ErrorReason::TooMuchWork,
        }
    }
}

/// Why an FDE (or the rest of a section) gave no rows in a table that still compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// gimli could not parse the entry or evaluate its CFA program.
    Malformed,
    /// Its CIE is missing (no CIE starts at the offset it names, or that CIE is past
    /// [`super::Limits::max_cies`]), is not x86-64 CFI (address size, return address
    /// column), or is longer than [`super::Limits::max_cie_bytes`].
    BadCie,
    /// Its address range is empty, wraps, or is not inside an executable segment (a
    /// discarded function in `.debug_frame` points at address 0).
    OutsideCode,
    /// Its range overlaps an FDE already taken (`.eh_frame` wins over `.debug_frame`).
    Overlap,
    /// An entry's length could not be read: the rest of that section was not read.
    SectionCut,
}

impl SkipReason {
    /// Every reason, in the order of [`super::Stats::skipped`].
    pub const ALL: [Self; 5] = [
        Self::Malformed,
        Self::BadCie,
        Self::OutsideCode,
        Self::Overlap,
        Self::SectionCut,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::BadCie => "bad_cie",
            Self::OutsideCode => "outside_code",
            Self::Overlap => "overlap",
            Self::SectionCut => "section_cut",
        }
    }
}

/// Why a row became [`super::CfaRule::Unsupported`] (or its rbp [`super::RbpRule::Unknown`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnsupportedReason {
    /// The CFA is another register plus an offset (`longjmp`, a prologue that realigns
    /// the stack through r10).
    CfaRegister,
    /// The CFA is an expression that is neither the PLT's nor gcc's realigned frame.
    CfaExpression,
    /// An offset does not fit the row's 16 bits.
    OffsetRange,
    /// The return address is neither at CFA - 8 nor undefined (`__vfork` keeps it in a
    /// register).
    ReturnAddress,
    /// rbp's rule is a register, a value or an expression rows cannot express.
    RbpRule,
}

impl UnsupportedReason {
    /// Every reason, in the order of [`super::Stats::unsupported`].
    pub const ALL: [Self; 5] = [
        Self::CfaRegister,
        Self::CfaExpression,
        Self::OffsetRange,
        Self::ReturnAddress,
        Self::RbpRule,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CfaRegister => "cfa_register",
            Self::CfaExpression => "cfa_expression",
            Self::OffsetRange => "offset_range",
            Self::ReturnAddress => "return_address",
            Self::RbpRule => "rbp_rule",
        }
    }
}
