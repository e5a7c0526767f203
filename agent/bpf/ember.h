/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The only contract between ember's BPF program and its Rust side.
 *
 * The Rust types are generated from this header's BTF by libbpf-cargo (the
 * `ember_cfg` rodata and `ember_record_layout` globals pull them into the
 * skeleton), so nothing here is copied by hand.
 */
#ifndef EMBER_H
#define EMBER_H

/* Frames kept per stack, per side (kernel and user); the kernel's own cap is 127. */
#define EMBER_MAX_FRAMES 127

/*
 * Set in a user ip the table walker recorded: look the frame up at this address, not
 * at the byte before it as for a return address. The leaf, a frame a signal
 * interrupted (its ip is where the code was), and a signal trampoline (the handler
 * "returns" to its first byte, and no call precedes that). User addresses are below
 * 2^47 on x86-64; the agent clears the bit.
 */
#define EMBER_IP_EXACT (1ULL << 63)
#define EMBER_COMM_LEN 16

/* Settings written into .rodata before load. */
struct ember_config {
	/* Non-zero: only tgids present in the `pid_filter` map are sampled. */
	__u32 filter_pids;
	/* Non-zero: also sample the idle task (pid 0). */
	__u32 include_idle;
	/*
	 * Wake the consumer only once this many bytes wait in the ring buffer: the
	 * agent drains on a timer, so a quiet host costs no wakeup per sample.
	 */
	__u64 wakeup_bytes;
	/* enum ember_unwind_mode: how user stacks are walked. */
	__u32 unwind_mode;
	/*
	 * Non-zero: the kernel has BTF, so a sample taken in kernel mode can read the
	 * task's saved user registers (bpf_task_pt_regs). Zero: such samples walk the
	 * user side by frame pointers (the verifier never sees that branch).
	 */
	__u32 task_regs;
};

/* sampling.unwind: frame_pointer, auto (tables where an object has them, else the frame pointer), dwarf. */
enum ember_unwind_mode {
	EMBER_MODE_FRAME_POINTER = 0,
	EMBER_MODE_AUTO = 1,
	EMBER_MODE_DWARF = 2,
};

/*
 * Fixed part of every ring buffer record. It is followed by `kern_frames`
 * kernel instruction pointers, then `user_frames` user ones, leaf first.
 */
struct ember_record {
	__u64 time_ns;   /* bpf_ktime_get_ns() (CLOCK_MONOTONIC) */
	__u64 cgroup_id; /* v2 cgroup id of the task */
	__u32 pid;       /* thread group id, as the host sees it */
	__u32 tid;
	__u32 cpu;
	__u16 kern_frames;
	__u16 user_frames;
	char comm[EMBER_COMM_LEN]; /* thread name */
	__u8 user_result;  /* enum ember_unwind_result: how the user stack ended */
	__u8 user_flags;   /* EMBER_REC_* */
	__u8 py_result;    /* enum ember_py_result; not EMBER_PY_NONE: a struct ember_py_tail follows the ips */
	__u8 pad0;
	__u32 pad1;
	__u64 ips[];
};

/* How a user stack ended. */
enum ember_unwind_result {
	EMBER_UNWIND_FRAME_POINTER = 0, /* bpf_get_stack's frame pointer walk: its end is not checked */
	EMBER_UNWIND_COMPLETE = 1,      /* reached the outermost frame (entry point, thread start) */
	EMBER_UNWIND_TRUNCATED = 2,     /* EMBER_MAX_FRAMES frames and still going */
	EMBER_UNWIND_FP_END = 3,        /* tables, then frame pointers (JIT code, objects without CFI) to rbp = 0 */
	EMBER_UNWIND_ERR_UNSUPPORTED = 4, /* a row ember cannot express (counted when the table was built) */
	EMBER_UNWIND_ERR_READ = 5,      /* stack memory could not be read */
	EMBER_UNWIND_ERR_BAD_FRAME = 6, /* the caller's frame is not above this one's */
	EMBER_UNWIND_ERR_RBP_UNKNOWN = 7, /* a rule needs an rbp that an earlier frame lost */
	EMBER_UNWIND_ERR_NO_TABLE = 8,  /* sampling.unwind: dwarf and the code has no table */
	EMBER_UNWIND_ERR_TABLE = 9,     /* a table slot was empty or its page index out of range */
	EMBER_UNWIND_RESULT_MAX = 10,
};

/* user_flags bits: what the sampler asks the agent to load. */
#define EMBER_REC_UNKNOWN_PROCESS 1 /* no unwind ranges for this pid yet (asks back off: see ask()) */
#define EMBER_REC_RANGE_MISS 2      /* a pc outside every known range (asks back off: see ask()) */
/*
 * A process whose ranges the exec hook wrote and the agent has not read since (asked at
 * once after its exec, then backing off): it may live milliseconds, so the agent reads it
 * at once, ahead of the exec records it paces.
 */
#define EMBER_REC_UNREAD 4

/*
 * Interpreter frames (Python). Where the table walker meets a frame of the
 * interpreter's eval loop (a range of `struct ember_py_proc`), it first records
 * the interpreter frames that eval call runs, innermost first, from the thread's
 * own PyThreadState, then the eval frame itself. An interpreter frame takes two
 * user slots: the code object's address, then (instruction offset in 2-byte code
 * units << 32 | the code's co_firstlineno as a fingerprint). The tail after the
 * ips says which user slots start an interpreter frame and which are eval frames.
 */
#define EMBER_PY_EVAL_RANGES 2
/* A field the version does not have (`cframe_current`). */
#define EMBER_PY_NO_FIELD 0xffff
/* Bytes of a frame the walker reads at once: every field it reads is inside them. */
#define EMBER_PY_FRAME_BYTES 128

/* How a thread's PyThreadState is found from its thread pointer (tp, %fs base). */
enum ember_py_tls {
	EMBER_PY_TLS_TP = 0,  /* *(tp + tls_offset): a pthread key's slot, or static TLS */
	EMBER_PY_TLS_DTV = 1, /* *(dtv[tls_module] + tls_offset), dtv = *(tp + 8): libpython's TLS block */
	EMBER_PY_TLS_TSD = 2, /* *(*(tp + tls_module) + tls_offset): musl's self->tsd[key] */
};

/* How eval calls and frames pair (see FrameModel in parse/src/python/layout.rs). */
enum ember_py_model {
	EMBER_PY_OBJECTS = 0, /* <= 3.10: one frame per eval call */
	EMBER_PY_ENTRY = 1,   /* 3.11: frames up to the one whose `frame_owner` byte (is_entry) is set */
	EMBER_PY_CSTACK = 2,  /* 3.12+: frames up to an eval call's entry frame (owner >= owner_cstack, not recorded) */
};

/* Value of the `py_procs` hash (key: tgid), written whole by the agent. */
struct ember_py_proc {
	__u64 eval_start[EMBER_PY_EVAL_RANGES]; /* process addresses of the eval loop's code; 0: unused */
	__u64 eval_end[EMBER_PY_EVAL_RANGES];
	__s64 tls_offset;
	__u64 tls_module;
	__u64 code_type;   /* PyCode_Type: a frame whose code object is not of it ends the walk */
	__u8 tls_mode;     /* enum ember_py_tls */
	__u8 model;        /* enum ember_py_model */
	__u8 owner_cstack; /* EMBER_PY_CSTACK: owner values from this one up mark an eval call's entry frame */
	__u8 code_tagged;  /* the frame's code pointer carries tag bits (3.14 _PyStackRef): mask 7 */
	__u16 tstate_frame;   /* PyThreadState: frame, cframe or current_frame */
	__u16 cframe_current; /* _PyCFrame.current_frame, or EMBER_PY_NO_FIELD */
	__u16 frame_code;
	__u16 frame_previous;
	__u16 frame_instr;    /* <= 3.10: the int f_lasti; else the instruction pointer */
	__u16 frame_owner;    /* 3.11 is_entry, 3.12+ owner (one byte) */
	__u16 frame_size;     /* bytes read per frame, <= EMBER_PY_FRAME_BYTES */
	__u16 code_firstlineno;
	__u16 code_adaptive;  /* 3.11+: where the bytecode starts in the code object */
	__u16 object_type;    /* PyObject.ob_type: 8, 24 in free-threaded builds */
	__u16 frame_tlbc;     /* 3.14t: the frame's tlbc_index (an int), or EMBER_PY_NO_FIELD */
	__u16 code_tlbc;      /* 3.14t: the code's co_tlbc, {size, entries[size]} of bytecode copies */
	__u16 pad[2];
};

/* How a sample's interpreter frames came out. */
enum ember_py_result {
	EMBER_PY_NONE = 0,      /* not an interpreter's process, or no eval frame met: no tail */
	EMBER_PY_OK = 1,        /* every eval frame got its frames */
	EMBER_PY_NO_STATE = 2,  /* an eval frame, but the thread's state or frame was not found */
	EMBER_PY_TRUNCATED = 3, /* the stack's frame cap ended the walk */
	EMBER_PY_MISMATCH = 4,  /* an eval frame had no interpreter frame left (one surplus is normal), or a
				 * frame's code was not a code object (a frame being set up): the rest dropped */
	EMBER_PY_READ = 5,      /* a frame could not be read: the rest are missing */
	EMBER_PY_APPENDED = 6,  /* the native walk stopped early (an unwind error) with interpreter frames
				 * left: they follow its last native frame, not interleaved (up to the frame cap) */
	EMBER_PY_RESULT_MAX = 7,
};

/* After the ips of a record whose py_result is not EMBER_PY_NONE. Bit i: user slot i. */
struct ember_py_tail {
	__u64 py_start[2]; /* slot i and i + 1 are an interpreter frame */
	__u64 eval[2];     /* slot i is a frame of the eval loop */
};

/* Indexes of the per-CPU `counters` map. Every path that loses a sample has one. */
enum ember_counter {
	EMBER_CNT_SAMPLES = 0,    /* program runs that were not filtered out */
	EMBER_CNT_SENT = 1,       /* records handed to the ring buffer */
	EMBER_CNT_LOST_RINGBUF = 2, /* ring buffer full: whole sample lost */
	EMBER_CNT_KERN_STACK_ERR = 3, /* bpf_get_stack failed for the kernel side (sample kept) */
	EMBER_CNT_USER_STACK_ERR = 4, /* bpf_get_stack failed for the user side (sample kept) */
	EMBER_CNT_IDLE = 5,       /* idle task skipped (not a loss) */
	EMBER_CNT_FILTERED = 6,   /* excluded by --pid or the filters (not a loss) */
	EMBER_CNT_NO_SCRATCH = 7, /* per-CPU scratch missing: whole sample lost */
	EMBER_CNT_TAIL_CALL = 8,  /* the walker's next run could not be entered: the stack is cut there (sample kept) */
	EMBER_CNT_EXEC_RANGES = 9, /* the exec hook wrote a new program's ranges */
	EMBER_CNT_EXEC_FAILED = 10, /* ... could not (`unwind_procs` full): the agent's read follows */
	EMBER_CNT_VMA_FOUND = 11, /* the walker found a library mapped since the agent's read */
	EMBER_CNT_ROW_CACHED = 12, /* frames whose unwind row came from the per-CPU row cache */
	EMBER_CNT_ROW_SEARCHED = 13, /* ... was searched in its table (then kept in the cache) */
	EMBER_CNT_ROW_EVICTED = 14, /* ... and took the cache entry of another row */
	EMBER_CNT_PY_FRAMES = 15, /* interpreter frames recorded */
	EMBER_CNT_ROW_LEAF = 16,  /* a first user frame in code no CFI covers, stepped as a leaf (return address at rsp) */
	EMBER_CNT_MAX = 17,
};

/*
 * Run-queue latency (runqlat.bpf.c): time from a task becoming runnable
 * (sched_wakeup, sched_wakeup_new, or being preempted while still runnable)
 * to it running (sched_switch), in log2 buckets.
 *
 * Slot i counts latencies whose (ns >> EMBER_RQ_SHIFT) has floor(log2) == i
 * (0 and 1 both go to slot 0), so its upper bound is 2^(i+1) << EMBER_RQ_SHIFT
 * nanoseconds; the last slot also holds everything larger (+Inf).
 */
#define EMBER_RQ_SLOTS 24
#define EMBER_RQ_SHIFT 10

struct ember_rq_hist {
	__u64 slots[EMBER_RQ_SLOTS];
	__u64 sum_ns; /* sum of all latencies counted in `slots` */
};

/*
 * Per-container histograms live in the hash map `rq_cgroups`, keyed by the
 * kernfs id (= directory inode) of the task's perf_event cgroup: on cgroup v2
 * that is the task's cgroup, on v1 its cgroup in the perf_event hierarchy --
 * the same directory the agent opens for per-container perf counters. The
 * agent inserts a zeroed histogram for each container it tracks and deletes it
 * when the container goes; the program only adds to entries that exist, so
 * the map's size is the agent's cap and nothing is lost to a full map.
 */

/* Indexes of runqlat's per-CPU `rq_counters` map. */
enum ember_rq_counter {
	EMBER_RQ_CNT_EVENTS = 0,       /* latencies measured */
	EMBER_RQ_CNT_START_FULL = 1,   /* enqueue time not stored: `rq_start` full (latency lost) */
	EMBER_RQ_CNT_MAX = 2,
};

/*
 * Unwind tables (normalize/unwind builds them from an object's .eh_frame and
 * .debug_frame; the sampler walks them to unwind code without frame pointers).
 *
 * One table per object. Addresses are the object's own virtual addresses (the
 * sampler subtracts the mapping's bias first). The object's code is cut into
 * 4 KiB pages, numbered from the table's first page; page i's rows are
 * rows[first_row .. first_row + row_count), sorted by pc_low, and the first
 * one always has pc_low 0, so a binary search of at most 13 steps always
 * finds the row in force: the last one with pc_low <= (pc & 0xfff).
 *
 * Why 4 KiB: a sample's cost is the cold pages it touches (at 99 Hz nothing a
 * sample reads is still cached), and a page's rows then fit one 4 KiB chunk of
 * the table: a search reads the header, one index chunk and one row chunk
 * (with 64 KiB pages, a large library's ~1,000 rows a page spread over 2-4).
 * The index costs 8 bytes per 4 KiB of code.
 *
 * Rust mirrors these in parse/src/unwind/row.rs (the compiler is fuzzed without
 * the BPF build); agent/src/normalize/unwind/abi.rs checks the mirrors against the
 * skeleton's types at compile time.
 */
enum ember_unwind_page_shift {
	EMBER_UNWIND_PAGE_SHIFT = 12,
};

/* How to find the caller's frame (the CFA, canonical frame address). */
enum ember_cfa_rule {
	EMBER_CFA_UNSUPPORTED = 0,   /* CFI ember cannot express here: stop, counted */
	EMBER_CFA_RSP = 1,           /* CFA = rsp + cfa_offset */
	EMBER_CFA_RBP = 2,           /* CFA = rbp + cfa_offset */
	EMBER_CFA_RBP_DEREF = 3,     /* CFA = *(rbp + (__s16)cfa_offset): realigned stack */
	EMBER_CFA_PLT = 4,           /* CFA = rsp + cfa_offset + ((rip & 15) >= rbp_offset) * 8 */
	EMBER_CFA_SIGNAL = 5,        /* signal trampoline: rsp points at the ucontext, its mcontext at rsp + 40 */
	EMBER_CFA_STOP = 6,          /* outermost frame (the entry point, thread entry): the stack ends here */
	EMBER_CFA_FRAME_POINTER = 7, /* no CFI covers this address: use the frame pointer */
};

/* Where the caller's rbp is. The return address is always at CFA - 8. */
enum ember_rbp_rule {
	EMBER_RBP_UNCHANGED = 0, /* rbp still holds the caller's value */
	EMBER_RBP_AT_CFA = 1,    /* saved at CFA + rbp_offset */
	EMBER_RBP_AT_RBP = 2,    /* saved at rbp + rbp_offset (realigned stack) */
	EMBER_RBP_UNKNOWN = 3,   /* not recoverable: frames above that need it stop */
};

/* 8 bytes, so a table costs 8 bytes per row plus 8 per page. */
struct ember_unwind_row {
	__u16 pc_low;     /* address & 0xfff of the row's first instruction */
	__u8 cfa_rule;    /* enum ember_cfa_rule */
	__u8 rbp_rule;    /* enum ember_rbp_rule */
	__u16 cfa_offset;
	__s16 rbp_offset; /* EMBER_CFA_PLT: the (rip & 15) threshold instead */
};

struct ember_unwind_page {
	__u32 first_row; /* index of the page's first row in the table's rows */
	__u32 row_count; /* >= 1 for every page of a table */
};

/*
 * A loaded table is a run of 8-byte slots: slot 0 is this header, slots
 * 1 .. page_count are the pages, the rows follow. It is stored as one BPF
 * array (an inner map of `unwind_tables`, created at its exact size and filled
 * through mmap) whose elements are chunks of EMBER_UNWIND_CHUNK_SLOTS slots:
 * lookups in an inner map are helper calls (not inlined), so the walker looks up
 * a chunk once and searches inside it, instead of one lookup per slot.
 */
struct ember_unwind_header {
	__u32 first_page; /* object address >> EMBER_UNWIND_PAGE_SHIFT of page 0 */
	__u32 page_count;
};

/* Slots per element of a table's array: 4 KiB elements. */
#define EMBER_UNWIND_CHUNK_SLOTS 512

struct ember_unwind_chunk {
	__u64 slots[EMBER_UNWIND_CHUNK_SLOTS];
};

/* Slots of the `unwind_tables` map of tables. */
#define EMBER_UNWIND_SLOT_BITS 12
#define EMBER_UNWIND_TABLES (1 << EMBER_UNWIND_SLOT_BITS)
/*
 * A table's id, as ranges and `unwind_files` name it: its slot in the low
 * EMBER_UNWIND_SLOT_BITS and, above them, the slot's generation, which the agent
 * bumps each time it puts a table in the slot. The walker's row cache is keyed by
 * id, so a slot given to another object never serves the rows of the one before.
 */
#define EMBER_UNWIND_SLOT(id) ((id) & (EMBER_UNWIND_TABLES - 1))
/* A range whose object has no table: walk it by the frame pointer. No table's id. */
#define EMBER_TABLE_NONE 0xffffffff

/* One executable mapping of a process. */
struct ember_unwind_range {
	__u64 start;  /* first address */
	__u64 bias;   /* the object's own address = pc - bias */
	__u32 len;    /* bytes */
	__u32 table;  /* the table's id (slot and generation), or EMBER_TABLE_NONE */
};

/* Bits of `ember_unwind_proc.flags`. */
enum ember_proc_flag {
	/* Written by the exec hook: ranges from the new memory map, not yet read by the agent. */
	EMBER_PROC_UNREAD = 1,
	/*
	 * Written by the agent: the process has a `py_procs` entry. The walker looks there only
	 * when it is set: a lookup of a pid the map lacks still costs a sample a cold page.
	 */
	EMBER_PROC_PYTHON = 2,
};

/* Executable ranges per process the sampler can hold; more are dropped (counted by the agent). */
#define EMBER_UNWIND_RANGES 64

/* Value of the `unwind_procs` hash (key: tgid), written whole by the agent. */
struct ember_unwind_proc {
	__u32 count; /* ranges used, sorted by start, not overlapping */
	__u32 flags; /* enum ember_proc_flag bits */
	struct ember_unwind_range ranges[EMBER_UNWIND_RANGES];
};

/*
 * A file whose table is loaded, as the kernel names it (`unwind_files`): lets the
 * exec hook write a new program's ranges before it runs, and the walker add a
 * library mapped since the agent read the process, from the task's memory map.
 */
struct ember_unwind_file_key {
	__u64 dev; /* the kernel's dev_t of the file's filesystem: major << 20 | minor */
	__u64 ino;
};

/* An executable PT_LOAD segment: object address, file offset, bytes. */
struct ember_unwind_segment {
	__u64 vaddr;
	__u64 offset;
	__u64 size;
};

#define EMBER_UNWIND_FILE_SEGMENTS 4

/*
 * The file's size and ctime when its table was built: an inode freed and reused by
 * another file differs in its ctime (which no one can set), and a file rewritten in
 * place in both. Either, and the sampler leaves the mapping to the frame pointer until
 * the agent has read the process.
 */
struct ember_unwind_file {
	__u32 table; /* the table's id (slot and generation) */
	__u32 count; /* segments used */
	__u64 size;
	__s64 ctime_sec;
	__u32 ctime_nsec;
	__u32 pad;
	struct ember_unwind_segment segments[EMBER_UNWIND_FILE_SEGMENTS];
};

/* Entries of `unwind_files`: a few files (copies, upgrades) per table slot. */
#define EMBER_UNWIND_FILES 8192

/* User frames the table walker takes per program run; it tail-calls itself for more. */
#define EMBER_FRAMES_PER_RUN 16

/*
 * Off-CPU (offcpu.bpf.h, part of the sampler's object so it shares the unwind
 * tables and the walker). At sched_switch the thread switched out (`prev`) gets
 * a small per-task record (time, state, whether it blocked inside a syscall);
 * stacks are taken only for blocks that last at least min_block, once the thread
 * runs again: a block inside a syscall has its kernel stack taken at switch-in
 * and its user stack walked at the syscall's exit, in the thread itself; a
 * thread with rseq registered (glibc 2.35+ registers it for every thread) has any
 * block's user stack walked on its return to user mode (rseq_update), in a syscall
 * or not; a kernel thread's block is taken whole at switch-in; other blocks (page
 * faults, preemption in user mode of threads without rseq) fall back to a walk at
 * switch-out under fallback_threshold. Records go out on the `offcpu_samples` ring.
 */
struct ember_offcpu_config {
	/* Blocks shorter than this (switch-out to switch-in) are not reported. */
	__u64 min_block_ns;
	/* A switch-out is considered when bpf_get_prandom_u32() < this (2^32 = every one). */
	__u64 sample_threshold;
	/* ... and, outside a syscall, walked at switch-out when another draw is < this. */
	__u64 fallback_threshold;
	/* Non-zero: blocks inside a syscall are walked at its exit; zero: at switch-out, as the fallback. */
	__u32 syscall_exit;
	/* Per-task records at most (`offcpu_tasks`); threads past it are counted, not profiled. */
	__u32 max_tasks;
	/* Non-zero: every block of a thread with rseq registered is walked on its return to user mode. */
	__u32 rseq;
	/* Non-zero: the thread that wakes a block already past min_block has its stacks sent (sched_waking). */
	__u32 wakers;
	/* Non-zero: kernel lock contention of min_block or more is sent (lock:contention_begin/end). */
	__u32 klocks;
	/*
	 * The agent's own process: its blocks are not followed (each wakeup of one of its
	 * threads would cost a walk, for waits that are the profiler's own).
	 */
	__u32 self_tgid;
	/*
	 * Non-zero: kernel threads' blocks are followed too (kworkers, ksoftirqd: idle by
	 * design, in no container); zero: skipped at switch-out, counted, no record kept.
	 */
	__u32 kernel_threads;
	/*
	 * Non-zero: every block of a user thread is walked on its return to user mode by a
	 * task work the switch-in schedules for long blocks (bpf_task_work, 6.18+), so no
	 * program runs per switch or per syscall for it; rseq and syscall_exit are then unused.
	 */
	__u32 task_work;
};

/* Why a thread was off CPU, from its state at switch-out. */
enum ember_offcpu_state {
	EMBER_OFFCPU_SLEEP = 0,    /* interruptible sleep (and TASK_IDLE, stopped, traced) */
	EMBER_OFFCPU_DISK = 1,     /* uninterruptible (D state), not TASK_NOLOAD */
	EMBER_OFFCPU_RUNNABLE = 2, /* preempted or woken: waiting for a CPU */
};

/* Where a block's stacks were taken: the weight of its record follows from it. */
enum ember_offcpu_path {
	EMBER_OFFCPU_PATH_EXIT = 0,    /* kernel stack at switch-in, user when back (syscall exit, rseq) */
	EMBER_OFFCPU_PATH_SWITCH = 1,  /* the fallback: both at switch-out, sampled by fallback_threshold */
	EMBER_OFFCPU_PATH_KTHREAD = 2, /* a kernel thread: its kernel stack at switch-in */
};

/* What an off-CPU record is. */
enum ember_offcpu_kind {
	EMBER_OFFCPU_BLOCK = 0,  /* a block of min_block or more: the blocked thread's stacks */
	EMBER_OFFCPU_WAKER = 1,  /* the stacks of the thread that woke such a block, as it woke it */
	EMBER_OFFCPU_KLOCK = 2,  /* kernel lock contention of min_block or more, as the lock was taken */
};

/*
 * An off-CPU record on the `offcpu_samples` ring: this head, then a struct
 * ember_record and its kernel and user ips. A block's record has time_ns the
 * switch-out; a waker's record describes the waker (time_ns the wakeup).
 *
 * Records are counted in the kernel: `key` hashes everything the agent counts a
 * record by (kind, state, path, syscall, waker_key, cgroup, pid, tid, name, both
 * stacks, the interpreter tail; not the times or the CPU). The first record of a
 * key since the agent last drained `offcpu_sums` is sent whole, with its own
 * times, and leaves an entry under its key; later ones only add their times to
 * that entry. The agent drains the map once a window (at the window's last drain
 * of the ring), and each entry's sums count as copies of the record it kept for
 * the key.
 */
struct ember_offcpu_head {
	__u64 off_ns;      /* time off CPU in `state`: switch-out to wakeup (or to switch-in); KLOCK: the wait */
	__u64 runnable_ns; /* then runnable: wakeup to switch-in (0 when `state` is runnable) */
	__u32 state;       /* enum ember_offcpu_state */
	__u32 path;        /* enum ember_offcpu_path */
	__u32 kind;        /* enum ember_offcpu_kind */
	__s32 syscall;     /* the syscall the block's thread blocked in, -1 outside one */
	__u64 key;         /* the record's key in `offcpu_sums` */
	__u64 waker_key;   /* BLOCK: the key of the waker record that woke it (sent earlier); 0: none */
};

/*
 * Value of `offcpu_sums` (key: a record's key): what the records of that key sent
 * after the first add up to. A waker's entry stays at zero: its key is only a name
 * its blocks join on.
 */
struct ember_offcpu_sum {
	__u64 off_ns;      /* sum of their off_ns */
	__u64 runnable_ns; /* sum of their runnable_ns */
	__u32 count;       /* how many */
	__u32 runnable;    /* ... of them with a runnable part */
};

/* Slots of the one per-CPU entry of `offcpu_counters` (a __u64 each, in this order). */
enum ember_offcpu_counter {
	EMBER_OFFCPU_CNT_SWITCHES = 0,  /* switch-outs of threads that were not filtered out */
	EMBER_OFFCPU_CNT_TAKEN = 1,     /* ... walked at switch-out (the fallback path) */
	EMBER_OFFCPU_CNT_MAP_FULL = 2,  /* a long block lost: `offcpu_threads` full */
	EMBER_OFFCPU_CNT_SHORT = 3,     /* blocks under min_block (not a loss) */
	EMBER_OFFCPU_CNT_SENT = 4,      /* records handed to the ring buffer */
	EMBER_OFFCPU_CNT_LOST_RINGBUF = 5, /* ring buffer full: the block is lost */
	EMBER_OFFCPU_CNT_NO_SCRATCH = 6, /* per-CPU scratch missing: lost */
	EMBER_OFFCPU_CNT_FILTERED = 7,  /* excluded by --pid, the filters or as the agent (not a loss) */
	EMBER_OFFCPU_CNT_SYSCALL = 8,   /* switch-outs inside a syscall: nothing walked yet */
	EMBER_OFFCPU_CNT_KTHREAD = 9,   /* switch-outs of kernel threads: nothing walked yet */
	EMBER_OFFCPU_CNT_SKIPPED = 10,  /* outside a syscall, not drawn by fallback_threshold */
	EMBER_OFFCPU_CNT_EXIT_WALK = 11, /* user stacks walked when back: syscall exit or rseq (long blocks) */
	EMBER_OFFCPU_CNT_MERGED = 12,   /* a long block added to one of the same syscall waiting for its exit */
	EMBER_OFFCPU_CNT_TASK_FULL = 13, /* no per-task record (max_tasks, or no memory): not profiled */
	EMBER_OFFCPU_CNT_EXITED = 14,   /* a long block whose thread exited before it was back: lost */
	EMBER_OFFCPU_CNT_RSEQ = 15,     /* switch-outs of threads with rseq: nothing walked yet */
	EMBER_OFFCPU_CNT_WAKER = 16,    /* wakers of blocks past min_block walked (records sent or lost) */
	EMBER_OFFCPU_CNT_KLOCK = 17,    /* kernel lock waits of min_block or more walked */
	EMBER_OFFCPU_CNT_KLOCK_SHORT = 18, /* kernel lock waits under min_block (not a loss) */
	EMBER_OFFCPU_CNT_KTHREAD_SKIPPED = 19, /* switch-outs of kernel threads, not followed (offcpu.kernel_threads) */
	EMBER_OFFCPU_CNT_SUMMED = 20,   /* records counted in `offcpu_sums` instead of sent */
	EMBER_OFFCPU_CNT_SUMS_FULL = 21, /* a record's key found no room in `offcpu_sums`: its next ones are sent too */
	EMBER_OFFCPU_CNT_WAKER_IRQ = 22, /* ... of them, wakeups from an interrupt: its frames only, no thread */
	EMBER_OFFCPU_CNT_TASK_WORK = 23, /* switch-outs of user threads: walked by a task work if long */
	EMBER_OFFCPU_CNT_WORK_FAILED = 24, /* a long block's task work could not be scheduled: lost */
	EMBER_OFFCPU_CNT_MAX = 25,
};

#endif /* EMBER_H */
