/* SPDX-License-Identifier: GPL-2.0 */
/*
 * A record as the sampler and off-CPU build it: the per-CPU scratch (the record, its
 * ips, the walk's state), its ring buffer and counters, and its copy out.
 */
#ifndef EMBER_RECORD_BPF_H
#define EMBER_RECORD_BPF_H

#include "types.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "ember.h"

/* The sampler's settings (and the walker's, off-CPU's too), written into .rodata before load. */
const volatile struct ember_config ember_cfg = {};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20); /* resized from the config before load */
} samples SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EMBER_CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

/*
 * A walk's interpreter frames in progress, whichever the runtime (interp.bpf.h): a native
 * frame of an interpreter's loop first records the interpreter frames that loop runs.
 */
struct interp_walk {
	__u8 started;   /* the thread's interpreter state was looked for (at the first loop frame) */
	__u8 emitting;  /* enum interp_runtime: whose frames of the loop frame at ip are being recorded */
	__u8 loop_done; /* ... done: record the loop frame itself */
	__u8 result;    /* enum ember_py_result */
	__u8 appending; /* the native walk stopped early: the rest of the frames go after it */
	__u64 frame;    /* the next interpreter frame (0: none left) */
	struct ember_py_tail tail; /* which user slots are interpreter frames, which loop frames */
};

/* The table walker's registers and progress, kept across its tail calls. */
struct walk {
	__u64 ip, sp, bp;
	__u32 kframes;  /* kernel frames at the start of ips */
	__u32 uframes;  /* user frames after them */
	__u8 running;   /* 0 once the walk ended; `result` says how */
	__u8 result;    /* enum ember_unwind_result */
	__u8 bp_lost;   /* a frame's rbp rule was "unknown": rbp no longer holds the caller's */
	__u8 exact;     /* ip is where the code was interrupted, not a return address */
	__u8 looked;    /* bpf_find_vma was used (once a sample: it defers its unlock to irq_work) */
	struct interp_walk interp; /* interpreter frames (interp.bpf.h) */
};

/* Words of a struct ember_py_tail. */
#define PY_TAIL_WORDS (sizeof(struct ember_py_tail) / sizeof(__u64))

/*
 * A record with room for both stacks and the interpreter tail; built here, then copied
 * out at its used size.
 */
struct scratch {
	struct ember_record rec;
	__u64 ips[2 * EMBER_MAX_FRAMES + PY_TAIL_WORDS];
	struct walk w;
};
/* finish() writes the tail at ips[(n & 0xff) + j], n <= 2 * EMBER_MAX_FRAMES. */
_Static_assert(2 * EMBER_MAX_FRAMES + PY_TAIL_WORDS <= 256 + PY_TAIL_WORDS, "tail index");
/* walk_step indexes ips with a mask of 0xff for the verifier: it must stay inside the scratch. */
_Static_assert(__builtin_offsetof(struct scratch, ips) + 256 * sizeof(__u64) <= sizeof(struct scratch),
	       "ips[at & 0xff] leaves the scratch");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch_map SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &which);

	if (v)
		*v += 1; /* per-CPU slot: no other writer */
}

#define STACK_BYTES (EMBER_MAX_FRAMES * sizeof(__u64))

/* Complete, not forward: libbpf holds a kfunc prototype naming a forward struct incompatible with the kernel's. */
struct task_struct {
	int pid;
	unsigned int flags;
	struct task_struct *group_leader;
	__u64 start_boottime; /* 5.5+ */
} __attribute__((preserve_access_index));

#define PF_KTHREAD 0x00200000

/*
 * The start time of `task`'s process (its group leader's start_boottime, ns), as the
 * record's start_ns carries it; 0 where the kernel lacks the field. One CO-RE read per
 * record, outside every loop.
 */
static __always_inline __u64 process_start_ns(struct task_struct *task)
{
	if (!bpf_core_field_exists(task->start_boottime))
		return 0;
	return BPF_CORE_READ(task, group_leader, start_boottime);
}

/*
 * A kernel thread (kworker, kdamond, ...): no user stack to walk, and no memory map
 * to ask the agent for (each ask wakes two of its threads, and a busy host samples
 * kernel threads every second).
 */
static __always_inline int kernel_thread(struct task_struct *task)
{
	return task->flags & PF_KTHREAD;
}

/*
 * Copies the record out at its used size. A record that asks for a process's ranges
 * wakes the agent (the process may live milliseconds); a range miss waits for the next
 * drain (a second at most): it is mostly a miss no read fixes (code in memfd or
 * anonymous memory), and each forced wakeup woke the aggregator too.
 */
static __always_inline void emit(struct scratch *s, __u64 kbytes, __u64 ubytes)
{
	__u64 size = sizeof(struct ember_record) + kbytes + ubytes, wake;

	if (size > sizeof(struct ember_record) + sizeof(s->ips))
		size = sizeof(struct ember_record) + sizeof(s->ips);
	wake = (s->rec.user_flags & ~EMBER_REC_RANGE_MISS) ||
			       bpf_ringbuf_query(&samples, BPF_RB_AVAIL_DATA) >= ember_cfg.wakeup_bytes ?
		       BPF_RB_FORCE_WAKEUP :
		       BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_output(&samples, s, size, wake)) {
		count(EMBER_CNT_LOST_RINGBUF);
		return;
	}
	count(EMBER_CNT_SENT);
}

#endif /* EMBER_RECORD_BPF_H */
