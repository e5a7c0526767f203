/* SPDX-License-Identifier: GPL-2.0 */
/*
 * A block's record out: its key, the in-kernel sums of repeated keys, the ring; the
 * stacks held until the thread runs again, and the fallback's walk at switch-out.
 */
#ifndef EMBER_OFFCPU_SEND_BPF_H
#define EMBER_OFFCPU_SEND_BPF_H

#include "offcpu_task.bpf.h"

/* One word into a record's key (a multiply-xorshift: keys are compared whole, never ordered). */
static __always_inline __u64 offcpu_mix(__u64 h, __u64 v)
{
	h = (h ^ v) * 0x9e3779b97f4a7c15ULL;
	return h ^ (h >> 31);
}

struct offcpu_hash {
	struct offcpu_thread *t;
	__u64 h;
	__u32 n; /* ips words to take: kernel, user, then the interpreter tail */
};

/* bpf_loop callback: one ips word into the key (i taken whole: its bounds check is the one the index uses). */
static long offcpu_hash_word(__u64 i, void *arg)
{
	struct offcpu_hash *c = arg;

	if (i >= c->n || i >= 2 * EMBER_MAX_FRAMES + PY_TAIL_WORDS)
		return 1;
	c->h = offcpu_mix(c->h, c->t->s.ips[i]);
	return 0;
}

/* The record's key: everything the agent counts it by (struct ember_offcpu_head). */
static __always_inline __u64 offcpu_key(struct offcpu_thread *t, __u32 words)
{
	struct ember_record *rec = &t->s.rec;
	struct offcpu_hash c = { .t = t, .n = words };
	__u64 comm[2];

	__builtin_memcpy(comm, rec->comm, sizeof(comm));
	c.h = offcpu_mix(0x5ca1ab1e, (__u64)t->head.kind | (__u64)t->head.state << 8 | (__u64)t->head.path << 16 |
					   (__u64)(__u32)t->head.syscall << 32);
	c.h = offcpu_mix(c.h, t->head.waker_key);
	c.h = offcpu_mix(c.h, rec->cgroup_id);
	c.h = offcpu_mix(c.h, (__u64)rec->pid << 32 | rec->tid);
	c.h = offcpu_mix(c.h, rec->start_ns);
	c.h = offcpu_mix(c.h, comm[0]);
	c.h = offcpu_mix(c.h, comm[1]);
	c.h = offcpu_mix(c.h, (__u64)rec->kern_frames | (__u64)rec->user_frames << 16 | (__u64)rec->user_result << 32 |
				      (__u64)rec->user_flags << 40 | (__u64)rec->py_result << 48);
	bpf_loop(2 * EMBER_MAX_FRAMES + PY_TAIL_WORDS, offcpu_hash_word, &c, 0);
	/* 0 says "no key" (a block without a waker). */
	return c.h ? c.h : 1;
}

/*
 * A record done: added to its key's sums if that key's record went out since the agent
 * last drained them, else sent whole (head, record, k + u ips and the interpreter tail
 * if any) and its key entered. A record that asks the agent for something is always
 * sent. Returns the key, or 0 if the record was lost.
 */
static __always_inline __u64 offcpu_send(struct offcpu_thread *t)
{
	__u32 k = t->s.rec.kern_frames, u = t->s.rec.user_frames;
	__u64 size, key, tail = t->s.rec.py_result != EMBER_PY_NONE ? sizeof(struct ember_py_tail) : 0;
	struct ember_offcpu_sum fresh = {}, *sum;
	long err;

	if (k > EMBER_MAX_FRAMES)
		k = EMBER_MAX_FRAMES;
	if (u > EMBER_MAX_FRAMES)
		u = EMBER_MAX_FRAMES;
	key = offcpu_key(t, k + u + tail / sizeof(__u64));
	t->head.key = key;
	if (!t->s.rec.user_flags) {
		sum = bpf_map_lookup_elem(&offcpu_sums, &key);
		if (sum) {
			/* A waker's entry only says its record went out: its blocks carry the times. */
			if (t->head.kind != EMBER_OFFCPU_WAKER) {
				__sync_fetch_and_add(&sum->off_ns, t->head.off_ns);
				__sync_fetch_and_add(&sum->runnable_ns, t->head.runnable_ns);
				__sync_fetch_and_add(&sum->count, 1);
				if (t->head.runnable_ns)
					__sync_fetch_and_add(&sum->runnable, 1);
			}
			offcpu_count(EMBER_OFFCPU_CNT_SUMMED);
			return key;
		}
	}
	size = sizeof(struct ember_offcpu_head) + sizeof(struct ember_record) + (k + u) * sizeof(__u64) + tail;
	/* Asks wait for the next drain (a second at most): they serve its later blocks, not this one. */
	if (bpf_ringbuf_output(&offcpu_samples, &t->head, size,
			       bpf_ringbuf_query(&offcpu_samples, BPF_RB_AVAIL_DATA) >=
						       ember_cfg.wakeup_bytes ?
				       BPF_RB_FORCE_WAKEUP :
				       BPF_RB_NO_WAKEUP)) {
		offcpu_count(EMBER_OFFCPU_CNT_LOST_RINGBUF);
		return 0;
	}
	offcpu_count(EMBER_OFFCPU_CNT_SENT);
	/* After the record: an entry means the agent has its record (or will, ring first). */
	err = bpf_map_update_elem(&offcpu_sums, &key, &fresh, BPF_NOEXIST);
	if (err && err != -EMBER_EEXIST)
		offcpu_count(EMBER_OFFCPU_CNT_SUMS_FULL);
	return key;
}

/* Puts t under tid in `offcpu_threads`; 0 if there was no room. */
static __always_inline int offcpu_hold(__u32 tid, struct offcpu_thread *t)
{
	if (!bpf_map_update_elem(&offcpu_threads, &tid, t, BPF_NOEXIST)) {
		__sync_fetch_and_add(&ember_offcpu_live, 1);
		return 1;
	}
	/* An entry left by a switch-in this program missed (attached mid-switch): replace it. */
	if (!bpf_map_update_elem(&offcpu_threads, &tid, t, BPF_EXIST))
		return 1;
	offcpu_count(EMBER_OFFCPU_CNT_MAP_FULL);
	return 0;
}

/* The fallback: `prev`'s stacks now, held until it runs again. */
static __always_inline void offcpu_walk_out(void *ctx, struct task_struct *prev, struct offcpu_task *r,
					    __u32 tid, __u64 now)
{
	struct offcpu_thread *t;
	struct scratch *s;
	long kbytes, ubytes;
	__u32 zero = 0;

	t = bpf_map_lookup_elem(&offcpu_scratch, &zero);
	if (!t) {
		offcpu_count(EMBER_OFFCPU_CNT_NO_SCRATCH);
		return;
	}
	offcpu_count(EMBER_OFFCPU_CNT_TAKEN);
	s = &t->s;
	s->rec.time_ns = offcpu_ktime(now);
	capture_current(s, bpf_get_current_pid_tgid(), bpf_get_current_cgroup_id());
	kbytes = capture_kernel(ctx, s, CAPTURE_OFFCPU);
	ubytes = s->rec.pid && !kernel_thread(prev) ? capture_user(ctx, prev, s, kbytes, 0, CAPTURE_OFFCPU, 1) : 0;
	s->rec.user_frames = ubytes / sizeof(__u64);
	if (!ubytes)
		s->rec.py_result = EMBER_PY_NONE;
	if (offcpu_hold(tid, t))
		offcpu_set_held(r, HELD_SWITCH);
}

/* The current task's record, made if it has none and the cap allows; 0 if it cannot have one. */
static __always_inline struct offcpu_task *offcpu_record(struct task_struct *task)
{
	struct offcpu_task *r = bpf_task_storage_get(&offcpu_tasks, task, 0, 0);

	if (r)
		return r;
	if (ember_offcpu_tasks >= ember_offcpu_cfg.max_tasks) {
		offcpu_count(EMBER_OFFCPU_CNT_TASK_FULL);
		return 0;
	}
	r = bpf_task_storage_get(&offcpu_tasks, task, 0, EMBER_STORAGE_CREATE);
	if (!r) {
		offcpu_count(EMBER_OFFCPU_CNT_TASK_FULL);
		return 0;
	}
	__sync_fetch_and_add(&ember_offcpu_tasks, 1);
	return r;
}

/* A thread's final switch-out: its record and what it holds go. */
static __always_inline void offcpu_dead(struct task_struct *prev, __u32 tid)
{
	struct offcpu_task *r = bpf_task_storage_get(&offcpu_tasks, prev, 0, 0);

	if (!r)
		return;
	if (r->held == HELD_EXIT)
		offcpu_count(EMBER_OFFCPU_CNT_EXITED);
	offcpu_release(r, tid);
	if (!bpf_task_storage_delete(&offcpu_tasks, prev))
		__sync_fetch_and_add(&ember_offcpu_tasks, -1);
}

#endif /* EMBER_OFFCPU_SEND_BPF_H */
