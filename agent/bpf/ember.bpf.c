// SPDX-License-Identifier: GPL-2.0
/*
 * ember's sampler: a perf_event program that copies the interrupted task's
 * kernel and user stacks into one ring buffer record.
 *
 * User stacks: where the agent has loaded unwind tables for the process
 * (`unwind_procs`), `ember_walk` walks them (tables compiled from .eh_frame by
 * normalize/unwind, the frame pointer where code has none); otherwise
 * bpf_get_stack follows frame pointers, and the record asks the agent to load
 * the process.
 *
 * Why a ring buffer and no STACK_TRACE map: a stack-id map loses samples to
 * hash collisions (two stacks share a bucket and one is dropped or overwritten)
 * and to drain races (an id read after its bucket was reused names another
 * stack). Raw stacks in a ring buffer lose a sample only when the buffer is
 * full, and that is counted.
 */
#include "record.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* Never written: present so the skeleton carries the Rust types of the record and the counters. */
struct ember_record ember_record_layout = {};
enum ember_counter ember_counter_layout = EMBER_CNT_MAX;
/* The constants, as enums: Rust takes their values from the skeleton (capture/abi.rs). */
enum ember_limit ember_limit_layout = EMBER_MAX_FRAMES;
enum ember_rec_flag ember_rec_flag_layout = EMBER_REC_UNKNOWN_PROCESS;
enum ember_unwind_limit ember_unwind_limit_layout = EMBER_UNWIND_RANGES;
enum ember_table_none ember_table_none_layout = EMBER_TABLE_NONE;
enum ember_py_limit ember_py_limit_layout = EMBER_PY_EVAL_RANGES;
/* Likewise for the unwind table types: normalize/unwind checks its Rust mirror against them. */
struct ember_unwind_row ember_unwind_row_layout = {};
struct ember_unwind_page ember_unwind_page_layout = {};
enum ember_cfa_rule ember_cfa_rule_layout = EMBER_CFA_UNSUPPORTED;
enum ember_rbp_rule ember_rbp_rule_layout = EMBER_RBP_UNCHANGED;
struct ember_unwind_header ember_unwind_header_layout = {};
struct ember_unwind_chunk ember_unwind_chunk_layout = {};
struct ember_unwind_range ember_unwind_range_layout = {};
struct ember_unwind_proc ember_unwind_proc_layout = {};
struct ember_unwind_file ember_unwind_file_layout = {};
enum ember_unwind_result ember_unwind_result_layout = EMBER_UNWIND_FRAME_POINTER;
enum ember_unwind_mode ember_unwind_mode_layout = EMBER_MODE_FRAME_POINTER;
enum ember_proc_flag ember_proc_flag_layout = EMBER_PROC_UNREAD;
enum ember_unwind_page_shift ember_unwind_page_shift_layout = EMBER_UNWIND_PAGE_SHIFT;
struct ember_py_proc ember_py_proc_layout = {};
struct ember_py_tail ember_py_tail_layout = {};
enum ember_py_result ember_py_result_layout = EMBER_PY_NONE;
enum ember_py_tls ember_py_tls_layout = EMBER_PY_TLS_TP;
enum ember_py_model ember_py_model_layout = EMBER_PY_OBJECTS;

/*
 * The units, each a header that includes what it builds on (no circle):
 * record -> ranges -> frame -> runtime -> python -> interp -> walk -> stack -> sample, offcpu.
 */
#include "sample.bpf.h"
/* Off-CPU profiling: its own programs and maps, sharing the walker and its tables. */
#include "offcpu.bpf.h"
