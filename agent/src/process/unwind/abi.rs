//! The row and page types are `struct ember_unwind_row` and `struct ember_unwind_page` of
//! `agent/bpf/ember.h`. The compiler keeps its own mirrors (plain Rust, so the fuzz crate
//! can build it without a skeleton); these compile-time checks fail the build the moment
//! the header and the mirrors disagree, and make the mirrors' slices the skeleton's
//! ([`bpf_rows`], [`bpf_pages`]) without a copy.
//!
//! The types come from the BPF program's BTF: `ember.bpf.c` holds one `*_layout` global of
//! each, so libbpf-cargo generates them into the skeleton (re-exported by
//! [`crate::capture::unwind`], whose own layout is checked in `capture/abi.rs`).

use std::mem::{align_of, offset_of, size_of};

use super::row::{CfaRule, RbpRule, UnwindPage, UnwindRow, PAGE_SHIFT};
use crate::capture::unwind::{
    ember_cfa_rule, ember_rbp_rule, ember_unwind_chunk, ember_unwind_page, ember_unwind_page_shift,
    ember_unwind_row, CHUNK_BYTES, CHUNK_SLOTS,
};

const _: () = {
    assert!(size_of::<UnwindRow>() == size_of::<ember_unwind_row>());
    assert!(size_of::<UnwindRow>() == 8);
    assert!(align_of::<UnwindRow>() == align_of::<ember_unwind_row>());
    assert!(offset_of!(UnwindRow, pc_low) == offset_of!(ember_unwind_row, pc_low));
    assert!(offset_of!(UnwindRow, cfa_rule) == offset_of!(ember_unwind_row, cfa_rule));
    assert!(offset_of!(UnwindRow, rbp_rule) == offset_of!(ember_unwind_row, rbp_rule));
    assert!(offset_of!(UnwindRow, cfa_offset) == offset_of!(ember_unwind_row, cfa_offset));
    assert!(offset_of!(UnwindRow, rbp_offset) == offset_of!(ember_unwind_row, rbp_offset));

    assert!(size_of::<ember_unwind_chunk>() == CHUNK_BYTES);
    assert!(CHUNK_BYTES == CHUNK_SLOTS * size_of::<UnwindRow>());

    assert!(size_of::<UnwindPage>() == size_of::<ember_unwind_page>());
    assert!(align_of::<UnwindPage>() == align_of::<ember_unwind_page>());
    assert!(offset_of!(UnwindPage, first_row) == offset_of!(ember_unwind_page, first_row));
    assert!(offset_of!(UnwindPage, row_count) == offset_of!(ember_unwind_page, row_count));

    assert!(CfaRule::Unsupported as u32 == ember_cfa_rule::EMBER_CFA_UNSUPPORTED.0);
    assert!(CfaRule::Rsp as u32 == ember_cfa_rule::EMBER_CFA_RSP.0);
    assert!(CfaRule::Rbp as u32 == ember_cfa_rule::EMBER_CFA_RBP.0);
    assert!(CfaRule::RbpDeref as u32 == ember_cfa_rule::EMBER_CFA_RBP_DEREF.0);
    assert!(CfaRule::Plt as u32 == ember_cfa_rule::EMBER_CFA_PLT.0);
    assert!(CfaRule::Signal as u32 == ember_cfa_rule::EMBER_CFA_SIGNAL.0);
    assert!(CfaRule::Stop as u32 == ember_cfa_rule::EMBER_CFA_STOP.0);
    assert!(CfaRule::FramePointer as u32 == ember_cfa_rule::EMBER_CFA_FRAME_POINTER.0);

    assert!(RbpRule::Unchanged as u32 == ember_rbp_rule::EMBER_RBP_UNCHANGED.0);
    assert!(RbpRule::AtCfa as u32 == ember_rbp_rule::EMBER_RBP_AT_CFA.0);
    assert!(RbpRule::AtRbp as u32 == ember_rbp_rule::EMBER_RBP_AT_RBP.0);
    assert!(RbpRule::Unknown as u32 == ember_rbp_rule::EMBER_RBP_UNKNOWN.0);

    assert!(PAGE_SHIFT == ember_unwind_page_shift::EMBER_UNWIND_PAGE_SHIFT.0);
    // A row's pc_low holds an offset within its page.
    assert!(PAGE_SHIFT <= u16::BITS);
};

/// `rows` as the walker reads them.
pub(super) fn bpf_rows(rows: &[UnwindRow]) -> &[ember_unwind_row] {
    // SAFETY: both are `#[repr(C)]` integers of the same size, alignment and field offsets
    // (checked above), every bit pattern valid for each; the slice keeps `rows`' lifetime.
    unsafe { std::slice::from_raw_parts(rows.as_ptr().cast(), rows.len()) }
}

/// `pages` as the walker reads them.
pub(super) fn bpf_pages(pages: &[UnwindPage]) -> &[ember_unwind_page] {
    // SAFETY: as in `bpf_rows`.
    unsafe { std::slice::from_raw_parts(pages.as_ptr().cast(), pages.len()) }
}
