//! Every struct and enum of `agent/bpf/ember.h` (the contract headers it includes),
//! checked at compile time.
//!
//! The Rust types are the skeleton's, generated from the BPF program's BTF, so Rust and C
//! agree by construction; what can drift is what Rust code assumes of them (a record's ips
//! right after its header, ranges per process, the enum values matched by name, a value
//! viewed as bytes). These checks state the header's layout once more, field by field:
//! a change to the header fails the build here, pointing at the code that relies on it.
//! Each struct is also checked to have no hidden padding (every byte a named field), so
//! no uninitialized byte is ever copied to or from the kernel. The Rust mirrors of the
//! unwind rows and pages are checked against these types in `process/unwind/abi.rs`;
//! `struct ember_rq_hist` (runqlat's skeleton) in `readings/runqlat.rs`.

use std::mem::{align_of, offset_of, size_of};

use super::skel::types::{
    ember_cfa_rule, ember_config, ember_counter, ember_offcpu_config, ember_offcpu_counter,
    ember_offcpu_head, ember_offcpu_kind, ember_offcpu_path, ember_offcpu_state, ember_offcpu_sum,
    ember_proc_flag, ember_rbp_rule, ember_record, ember_unwind_chunk, ember_unwind_file,
    ember_unwind_file_key, ember_unwind_header, ember_unwind_mode, ember_unwind_page,
    ember_unwind_proc, ember_unwind_range, ember_unwind_result, ember_unwind_row,
    ember_unwind_segment, scratch,
};
use super::skel::types::{
    ember_limit, ember_py_limit, ember_rec_flag, ember_table_none, ember_unwind_limit,
};
use super::skel::types::{
    ember_py_model, ember_py_proc, ember_py_result, ember_py_tail, ember_py_tls,
};
use super::unwind::{CHUNK_SLOTS, FILE_SEGMENTS, PROC_BYTES, RANGES, SLOTS};
use super::MAX_FRAMES;

/// The size of the field `project` names (no value needed).
const fn field_size<T, F>(_project: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

/// `struct`: its size, alignment and each field's offset, and no byte that is no field.
macro_rules! shared_struct {
    ($t:ident: size $size:literal, align $align:literal { $($f:ident @ $off:literal),+ $(,)? }) => {
        const _: () = {
            assert!(size_of::<$t>() == $size, concat!(stringify!($t), ": size"));
            assert!(align_of::<$t>() == $align, concat!(stringify!($t), ": alignment"));
            $(assert!(
                offset_of!($t, $f) == $off,
                concat!(stringify!($t), ".", stringify!($f), ": offset")
            );)+
            assert!(
                0 $(+ field_size(|v: &$t| &v.$f))+ == size_of::<$t>(),
                concat!(stringify!($t), ": hidden padding")
            );
        };
    };
}

/// `enum`: each value as the header numbers it.
macro_rules! shared_enum {
    ($t:ident { $($v:ident = $n:literal),+ $(,)? }) => {
        const _: () = {
            $(assert!($t::$v.0 == $n, concat!(stringify!($t), "::", stringify!($v)));)+
        };
    };
}

shared_struct!(ember_config: size 32, align 8 {
    filter_pids @ 0,
    include_idle @ 4,
    wakeup_bytes @ 8,
    unwind_mode @ 16,
    task_regs @ 20,
    follow_forks @ 24,
    pad @ 28,
});

shared_struct!(ember_record: size 64, align 8 {
    time_ns @ 0,
    cgroup_id @ 8,
    start_ns @ 16,
    pid @ 24,
    tid @ 28,
    cpu @ 32,
    kern_frames @ 36,
    user_frames @ 38,
    comm @ 40,
    user_result @ 56,
    user_flags @ 57,
    py_result @ 58,
    pad0 @ 59,
    pad1 @ 60,
    ips @ 64,
});

shared_struct!(ember_unwind_row: size 8, align 2 {
    pc_low @ 0,
    cfa_rule @ 2,
    rbp_rule @ 3,
    cfa_offset @ 4,
    rbp_offset @ 6,
});

shared_struct!(ember_unwind_page: size 8, align 4 { first_row @ 0, row_count @ 4 });
shared_struct!(ember_unwind_header: size 8, align 4 { first_page @ 0, page_count @ 4 });
shared_struct!(ember_unwind_chunk: size 4096, align 8 { slots @ 0 });

shared_struct!(ember_unwind_range: size 24, align 8 {
    start @ 0,
    bias @ 8,
    len @ 16,
    table @ 20,
});

shared_struct!(ember_unwind_proc: size 1544, align 8 { count @ 0, flags @ 4, ranges @ 8 });
shared_struct!(ember_unwind_file_key: size 16, align 8 { dev @ 0, ino @ 8 });
shared_struct!(ember_unwind_segment: size 24, align 8 { vaddr @ 0, offset @ 8, size @ 16 });

shared_struct!(ember_unwind_file: size 128, align 8 {
    table @ 0,
    count @ 4,
    size @ 8,
    ctime_sec @ 16,
    ctime_nsec @ 24,
    pad @ 28,
    segments @ 32,
});

shared_struct!(ember_offcpu_config: size 56, align 8 {
    min_block_ns @ 0,
    sample_threshold @ 8,
    fallback_threshold @ 16,
    syscall_exit @ 24,
    max_tasks @ 28,
    rseq @ 32,
    wakers @ 36,
    klocks @ 40,
    self_tgid @ 44,
    kernel_threads @ 48,
    task_work @ 52,
});

shared_struct!(ember_offcpu_head: size 48, align 8 {
    off_ns @ 0,
    runnable_ns @ 8,
    state @ 16,
    path @ 20,
    kind @ 24,
    syscall @ 28,
    key @ 32,
    waker_key @ 40,
});

shared_struct!(ember_offcpu_sum: size 24, align 8 {
    off_ns @ 0,
    runnable_ns @ 8,
    count @ 16,
    runnable @ 20,
});

// The `#define`s the constants of `capture` and `capture::unwind` state.
const _: () = {
    // EMBER_MAX_FRAMES: the sampler's scratch holds both sides' frames.
    assert!(
        field_size(|s: &scratch| &s.ips)
            == 2 * MAX_FRAMES * size_of::<u64>() + size_of::<ember_py_tail>()
    );
    assert!(MAX_FRAMES < 128, "one bit each in Sample::user_exact");
    assert!(RANGES == ember_unwind_limit::EMBER_UNWIND_RANGES.0 as usize);
    assert!(FILE_SEGMENTS == ember_unwind_limit::EMBER_UNWIND_FILE_SEGMENTS.0 as usize);
    assert!(CHUNK_SLOTS == ember_unwind_limit::EMBER_UNWIND_CHUNK_SLOTS.0 as usize);
    assert!(SLOTS == ember_unwind_limit::EMBER_UNWIND_TABLES.0 as usize);
    assert!(
        field_size(|r: &ember_record| &r.comm) == ember_limit::EMBER_COMM_LEN.0 as usize,
        "EMBER_COMM_LEN"
    );
    assert!(
        field_size(|p: &ember_py_proc| &p.eval_start)
            == ember_py_limit::EMBER_PY_EVAL_RANGES.0 as usize * size_of::<u64>()
    );
    assert!(PROC_BYTES == 8 + RANGES * size_of::<ember_unwind_range>());
};

shared_enum!(ember_limit {
    EMBER_MAX_FRAMES = 127,
    EMBER_COMM_LEN = 16,
    EMBER_IP_EXACT_BIT = 63,
    EMBER_FRAMES_PER_RUN = 16,
});

shared_enum!(ember_rec_flag {
    EMBER_REC_UNKNOWN_PROCESS = 1,
    EMBER_REC_RANGE_MISS = 2,
    EMBER_REC_UNREAD = 4,
});

shared_enum!(ember_unwind_limit {
    EMBER_UNWIND_CHUNK_SLOTS = 512,
    EMBER_UNWIND_SLOT_BITS = 12,
    EMBER_UNWIND_TABLES = 4096,
    EMBER_UNWIND_RANGES = 64,
    EMBER_UNWIND_FILE_SEGMENTS = 4,
    EMBER_UNWIND_FILES = 8192,
});

shared_enum!(ember_table_none {
    EMBER_TABLE_NONE = 0xffff_ffff,
});

shared_enum!(ember_py_limit {
    EMBER_PY_EVAL_RANGES = 2,
    EMBER_PY_NO_FIELD = 0xffff,
    EMBER_PY_FRAME_BYTES = 128,
});

shared_enum!(ember_proc_flag {
    EMBER_PROC_UNREAD = 1,
    EMBER_PROC_PYTHON = 2,
});

shared_enum!(ember_unwind_mode {
    EMBER_MODE_FRAME_POINTER = 0,
    EMBER_MODE_AUTO = 1,
    EMBER_MODE_DWARF = 2,
});

shared_enum!(ember_unwind_result {
    EMBER_UNWIND_FRAME_POINTER = 0,
    EMBER_UNWIND_COMPLETE = 1,
    EMBER_UNWIND_TRUNCATED = 2,
    EMBER_UNWIND_FP_END = 3,
    EMBER_UNWIND_ERR_UNSUPPORTED = 4,
    EMBER_UNWIND_ERR_READ = 5,
    EMBER_UNWIND_ERR_BAD_FRAME = 6,
    EMBER_UNWIND_ERR_RBP_UNKNOWN = 7,
    EMBER_UNWIND_ERR_NO_TABLE = 8,
    EMBER_UNWIND_ERR_TABLE = 9,
    EMBER_UNWIND_RESULT_MAX = 10,
});

shared_enum!(ember_counter {
    EMBER_CNT_SAMPLES = 0,
    EMBER_CNT_SENT = 1,
    EMBER_CNT_LOST_RINGBUF = 2,
    EMBER_CNT_KERN_STACK_ERR = 3,
    EMBER_CNT_USER_STACK_ERR = 4,
    EMBER_CNT_IDLE = 5,
    EMBER_CNT_FILTERED = 6,
    EMBER_CNT_NO_SCRATCH = 7,
    EMBER_CNT_TAIL_CALL = 8,
    EMBER_CNT_EXEC_RANGES = 9,
    EMBER_CNT_EXEC_FAILED = 10,
    EMBER_CNT_VMA_FOUND = 11,
    EMBER_CNT_ROW_CACHED = 12,
    EMBER_CNT_ROW_SEARCHED = 13,
    EMBER_CNT_ROW_EVICTED = 14,
    EMBER_CNT_PY_FRAMES = 15,
    EMBER_CNT_ROW_LEAF = 16,
    EMBER_CNT_FORK_FULL = 17,
    EMBER_CNT_MAX = 18,
});

shared_enum!(ember_cfa_rule {
    EMBER_CFA_UNSUPPORTED = 0,
    EMBER_CFA_RSP = 1,
    EMBER_CFA_RBP = 2,
    EMBER_CFA_RBP_DEREF = 3,
    EMBER_CFA_PLT = 4,
    EMBER_CFA_SIGNAL = 5,
    EMBER_CFA_STOP = 6,
    EMBER_CFA_FRAME_POINTER = 7,
});

shared_enum!(ember_rbp_rule {
    EMBER_RBP_UNCHANGED = 0,
    EMBER_RBP_AT_CFA = 1,
    EMBER_RBP_AT_RBP = 2,
    EMBER_RBP_UNKNOWN = 3,
});

shared_enum!(ember_offcpu_state {
    EMBER_OFFCPU_SLEEP = 0,
    EMBER_OFFCPU_DISK = 1,
    EMBER_OFFCPU_RUNNABLE = 2,
});

shared_enum!(ember_offcpu_path {
    EMBER_OFFCPU_PATH_EXIT = 0,
    EMBER_OFFCPU_PATH_SWITCH = 1,
    EMBER_OFFCPU_PATH_KTHREAD = 2,
});

shared_enum!(ember_offcpu_kind {
    EMBER_OFFCPU_BLOCK = 0,
    EMBER_OFFCPU_WAKER = 1,
    EMBER_OFFCPU_KLOCK = 2,
});

shared_enum!(ember_offcpu_counter {
    EMBER_OFFCPU_CNT_SWITCHES = 0,
    EMBER_OFFCPU_CNT_TAKEN = 1,
    EMBER_OFFCPU_CNT_MAP_FULL = 2,
    EMBER_OFFCPU_CNT_SHORT = 3,
    EMBER_OFFCPU_CNT_SENT = 4,
    EMBER_OFFCPU_CNT_LOST_RINGBUF = 5,
    EMBER_OFFCPU_CNT_NO_SCRATCH = 6,
    EMBER_OFFCPU_CNT_FILTERED = 7,
    EMBER_OFFCPU_CNT_SYSCALL = 8,
    EMBER_OFFCPU_CNT_KTHREAD = 9,
    EMBER_OFFCPU_CNT_SKIPPED = 10,
    EMBER_OFFCPU_CNT_EXIT_WALK = 11,
    EMBER_OFFCPU_CNT_MERGED = 12,
    EMBER_OFFCPU_CNT_TASK_FULL = 13,
    EMBER_OFFCPU_CNT_EXITED = 14,
    EMBER_OFFCPU_CNT_RSEQ = 15,
    EMBER_OFFCPU_CNT_WAKER = 16,
    EMBER_OFFCPU_CNT_KLOCK = 17,
    EMBER_OFFCPU_CNT_KLOCK_SHORT = 18,
    EMBER_OFFCPU_CNT_KTHREAD_SKIPPED = 19,
    EMBER_OFFCPU_CNT_SUMMED = 20,
    EMBER_OFFCPU_CNT_SUMS_FULL = 21,
    EMBER_OFFCPU_CNT_WAKER_IRQ = 22,
    EMBER_OFFCPU_CNT_TASK_WORK = 23,
    EMBER_OFFCPU_CNT_WORK_FAILED = 24,
    EMBER_OFFCPU_CNT_MAX = 25,
});

shared_struct!(ember_py_proc: size 88, align 8 {
    eval_start @ 0,
    eval_end @ 16,
    tls_offset @ 32,
    tls_module @ 40,
    code_type @ 48,
    tls_mode @ 56,
    model @ 57,
    owner_cstack @ 58,
    code_tagged @ 59,
    tstate_frame @ 60,
    cframe_current @ 62,
    frame_code @ 64,
    frame_previous @ 66,
    frame_instr @ 68,
    frame_owner @ 70,
    frame_size @ 72,
    code_firstlineno @ 74,
    code_adaptive @ 76,
    object_type @ 78,
    frame_tlbc @ 80,
    code_tlbc @ 82,
    pad @ 84,
});

shared_struct!(ember_py_tail: size 32, align 8 {
    py_start @ 0,
    eval @ 16,
});

shared_enum!(ember_py_tls {
    EMBER_PY_TLS_TP = 0,
    EMBER_PY_TLS_DTV = 1,
    EMBER_PY_TLS_TSD = 2,
});

shared_enum!(ember_py_model {
    EMBER_PY_OBJECTS = 0,
    EMBER_PY_ENTRY = 1,
    EMBER_PY_CSTACK = 2,
});

shared_enum!(ember_py_result {
    EMBER_PY_NONE = 0,
    EMBER_PY_OK = 1,
    EMBER_PY_NO_STATE = 2,
    EMBER_PY_TRUNCATED = 3,
    EMBER_PY_MISMATCH = 4,
    EMBER_PY_READ = 5,
    EMBER_PY_APPENDED = 6,
    EMBER_PY_RESULT_MAX = 7,
});
