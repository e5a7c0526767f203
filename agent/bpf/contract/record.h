/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The sampler's records: settings, the record and its flags, the sampler's counters.
 */
#ifndef EMBER_CONTRACT_RECORD_H
#define EMBER_CONTRACT_RECORD_H

/*
 * Set in a user ip the table walker recorded: look the frame up at this address, not
 * at the byte before it as for a return address. The leaf, a frame a signal
 * interrupted (its ip is where the code was), and a signal trampoline (the handler
 * "returns" to its first byte, and no call precedes that). User addresses are below
 * 2^47 on x86-64; the agent clears the bit.
 */
#define EMBER_IP_EXACT (1ULL << EMBER_IP_EXACT_BIT)

/* The record's sizes (enums, not #defines: the skeleton carries them to Rust). */
enum ember_limit {
	EMBER_MAX_FRAMES = 127,     /* frames kept per stack, per side (kernel and user); the kernel's own cap */
	EMBER_COMM_LEN = 16,        /* bytes of a thread's name */
	EMBER_IP_EXACT_BIT = 63,    /* EMBER_IP_EXACT's bit */
	EMBER_FRAMES_PER_RUN = 16,  /* user frames the table walker takes per program run; it tail-calls itself for more */
};

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
	/*
	 * Non-zero (`record -- CMD`, `--subprocesses`): a process forked by one in
	 * `pid_filter` joins it (`ember_fork`).
	 */
	__u32 follow_forks;
	__u32 pad; /* explicit: the struct has no hidden padding (abi.rs) */
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
	/*
	 * The thread group leader's start_boottime (ns since boot, suspend included), which
	 * /proc/PID/stat field 22 shows in clock ticks: with pid, names the process (a pid is
	 * reused). 0: unknown (a kernel without the field, an interrupt's waker record).
	 */
	__u64 start_ns;
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
enum ember_rec_flag {
	EMBER_REC_UNKNOWN_PROCESS = 1, /* no unwind ranges for this pid yet (asks back off: see ask()) */
	EMBER_REC_RANGE_MISS = 2,      /* a pc outside every known range (asks back off: see ask()) */
	/*
	 * A process whose ranges the exec hook wrote and the agent has not read since (asked at
	 * once after its exec, then backing off): it may live milliseconds, so the agent reads it
	 * at once, ahead of the exec records it paces.
	 */
	EMBER_REC_UNREAD = 4,
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
	EMBER_CNT_FORK_FULL = 17, /* a child of a profiled process not added: `pid_filter` full */
	EMBER_CNT_MAX = 18,
};

#endif /* EMBER_CONTRACT_RECORD_H */
