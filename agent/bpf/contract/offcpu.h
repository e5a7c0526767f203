/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Off-CPU records: settings, the head before a record, summaries and counters.
 */
#ifndef EMBER_CONTRACT_OFFCPU_H
#define EMBER_CONTRACT_OFFCPU_H

#include "record.h"

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
 * record by (kind, state, path, syscall, waker_key, cgroup, pid and its start, tid, name, both
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

#endif /* EMBER_CONTRACT_OFFCPU_H */
