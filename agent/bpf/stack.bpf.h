/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The one stack capture that the sampler and every off-CPU site share: the current
 * thread's fields of the record, its kernel stack, and its user stack, walked by the
 * tables where the agent has loaded its process, else by frame pointers.
 */
#ifndef EMBER_STACK_BPF_H
#define EMBER_STACK_BPF_H

#include "walk.bpf.h"

/*
 * Who captures. The sampler has a perf_event context: its walk goes on in ember_walk's
 * tail calls, which send the record, and it counts what fails. Off-CPU walks the whole
 * stack in one loop (a task work has no context to tail-call from).
 */
enum capture_site {
	CAPTURE_SAMPLE = 0,
	CAPTURE_OFFCPU = 1,
};

/* The record's fields that name the current thread (id and cgroup as the caller read them). */
static __always_inline void capture_current(struct scratch *s, __u64 id, __u64 cgroup_id)
{
	s->rec.cgroup_id = cgroup_id;
	s->rec.pid = id >> 32;
	s->rec.tid = (__u32)id;
	s->rec.start_ns = process_start_ns((struct task_struct *)bpf_get_current_task());
	s->rec.cpu = bpf_get_smp_processor_id();
	s->rec.user_result = EMBER_UNWIND_FRAME_POINTER;
	s->rec.user_flags = 0;
	s->rec.py_result = EMBER_PY_NONE;
	bpf_get_current_comm(s->rec.comm, sizeof(s->rec.comm));
}

/* The kernel stack at the start of the ips; returns its bytes. */
static __always_inline long capture_kernel(void *ctx, struct scratch *s, const int site)
{
	long kbytes = bpf_get_stack(ctx, s->ips, STACK_BYTES, 0);

	if (kbytes < 0) {
		if (site == CAPTURE_SAMPLE)
			count(EMBER_CNT_KERN_STACK_ERR);
		kbytes = 0;
	}
	if (kbytes > STACK_BYTES)
		kbytes = STACK_BYTES;
	kbytes &= ~7L;
	s->rec.kern_frames = kbytes / sizeof(__u64);
	return kbytes;
}

/* The user stack by frame pointers after kbytes of kernel ips; returns its bytes. */
static __always_inline long capture_fp(void *ctx, struct task_struct *task, struct scratch *s, long kbytes,
				       const int site)
{
	long ubytes;

	/* A task work has no context: the task's own user registers, as bpf_get_stack takes them. */
	if (site == CAPTURE_SAMPLE || ctx)
		ubytes = bpf_get_stack(ctx, (void *)s->ips + kbytes, STACK_BYTES, BPF_F_USER_STACK);
	else
		ubytes = bpf_get_task_stack(task, (void *)s->ips + kbytes, STACK_BYTES, BPF_F_USER_STACK);
	if (ubytes < 0) {
		/* Kernel threads have none; the sampler counts failures of user tasks. */
		if (site == CAPTURE_SAMPLE)
			count(EMBER_CNT_USER_STACK_ERR);
		ubytes = 0;
	}
	if (ubytes > STACK_BYTES)
		ubytes = STACK_BYTES;
	return ubytes & ~7L;
}

/*
 * The walk's registers: `regs` (a sample that interrupted user mode: its own), else the
 * task's saved user registers, which only a kernel with BTF gives (task 0: the current one).
 */
static __always_inline int walk_regs(struct walk *w, struct ember_pt_regs *regs, struct task_struct *task)
{
	struct ember_pt_regs *u;

	if (regs) {
		w->ip = regs->ip;
		w->sp = regs->sp;
		w->bp = regs->bp;
		return 0;
	}
	if (!ember_cfg.task_regs)
		return -1;
	u = (struct ember_pt_regs *)bpf_task_pt_regs(task ? task : bpf_get_current_task_btf());
	if (!u || bpf_probe_read_kernel(&w->ip, 8, &u->ip) || bpf_probe_read_kernel(&w->sp, 8, &u->sp) ||
	    bpf_probe_read_kernel(&w->bp, 8, &u->bp))
		return -1;
	return 0;
}

/* A new walk from the registers in w, after `kframes` kernel frames. */
static __always_inline void walk_start(struct walk *w, __u32 kframes)
{
	w->kframes = kframes;
	w->uframes = 0;
	w->running = 1;
	w->result = EMBER_UNWIND_COMPLETE;
	w->bp_lost = 0;
	w->exact = 1;
	/* Without task_regs the walker cannot name the task for bpf_find_vma. */
	w->looked = !ember_cfg.task_regs;
	interp_reset(w);
}

/*
 * The current thread's user stack after kbytes of kernel ips: the table walker when the
 * agent has loaded its process (with its interpreter frames), else frame pointers (no
 * interpreter frames: rec.py_result stays EMBER_PY_NONE). Returns the user bytes (an
 * interpreter tail, if any, is written after them), or -1 when the sampler's walk went on
 * in ember_walk, which sends the record. `regs`: see walk_regs. `cached`: off-CPU walks
 * that cannot interrupt one another use its row cache (key 1).
 */
static __always_inline long capture_user(void *ctx, struct task_struct *task, struct scratch *s, long kbytes,
					 struct ember_pt_regs *regs, const int site, int cached)
{
	__u32 pid = s->rec.pid, one = 1, k, n;
	struct walk_ctx c = {};
	struct walk *w = &s->w;

	if (ember_cfg.unwind_mode == EMBER_MODE_FRAME_POINTER || (site != CAPTURE_SAMPLE && !ember_cfg.task_regs))
		return capture_fp(ctx, task, s, kbytes, site);
	c.proc = bpf_map_lookup_elem(&unwind_procs, &pid);
	if (!c.proc)
		ask(s, EMBER_REC_UNKNOWN_PROCESS);
	else if (site == CAPTURE_SAMPLE && (c.proc->flags & EMBER_PROC_UNREAD))
		/* Walked by the exec hook's ranges, but named only once the agent reads it. */
		ask(s, EMBER_REC_UNREAD);
	if (!c.proc || walk_regs(w, regs, task))
		return capture_fp(ctx, task, s, kbytes, site);
	k = kbytes / sizeof(__u64);
	walk_start(w, k);
	c.s = s;
	if (site == CAPTURE_SAMPLE) {
		walk_run(ctx, &c);
		return -1;
	}
	/*
	 * Walks that may interrupt one another on a CPU (a waker's, from an interrupt, over an
	 * rseq walk) must not share a row cache: a waker searches every row (wakers are walked
	 * only for long blocks).
	 */
	c.cache = cached ? bpf_map_lookup_elem(&row_cache, &one) : 0;
	/* The walk runs in the thread (or as it leaves the CPU): its TLS is current. */
	interp_begin(&c, pid, 1);
	walk_frames(&c, EMBER_MAX_FRAMES);
	if (w->running)
		w->result = EMBER_UNWIND_TRUNCATED;
	s->rec.user_result = w->result;
	n = w->uframes > EMBER_MAX_FRAMES ? EMBER_MAX_FRAMES : w->uframes;
	if (k > EMBER_MAX_FRAMES)
		k = EMBER_MAX_FRAMES;
	interp_finish(s, k, n);
	return n * sizeof(__u64);
}

#endif /* EMBER_STACK_BPF_H */
