/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Who ended a block: the waker's stacks at sched_waking (an interrupt's cut at its
 * entry), and kernel lock contention timed from contention_begin to its end.
 */
#ifndef EMBER_OFFCPU_WAKE_BPF_H
#define EMBER_OFFCPU_WAKE_BPF_H

#include "offcpu_send.bpf.h"

/*
 * The kernel's interrupt entry code (asm_sysvec_*, asm_common_interrupt): typeless (void)
 * so libbpf takes their addresses from kallsyms at load; 0 where the kernel has none.
 */
extern const void __irqentry_text_start __ksym __weak;
extern const void __irqentry_text_end __ksym __weak;

/*
 * The number of kernel frames up to and with the first interrupt entry of `ips`, or 0 if
 * none: the stack was taken in an interrupt, and the frames beyond are of whatever it
 * interrupted.
 */
struct offcpu_irq_scan {
	const __u64 *ips;
	__u64 lo, hi;
	__u32 frames, found;
};

/* bpf_loop callback: is kernel frame i an interrupt entry? (a loop the verifier walks once) */
static long offcpu_irq_frame(__u64 i, void *arg)
{
	struct offcpu_irq_scan *c = arg;
	__u64 ip;

	if (i >= c->frames || i >= STACK_BYTES / sizeof(__u64))
		return 1;
	ip = c->ips[i];
	if (ip >= c->lo && ip < c->hi) {
		c->found = i + 1;
		return 1;
	}
	return 0;
}

static __always_inline __u32 offcpu_irq_frames(const __u64 *ips, __u32 frames)
{
	struct offcpu_irq_scan c = {
		.ips = ips,
		.lo = (__u64)&__irqentry_text_start,
		.hi = (__u64)&__irqentry_text_end,
		.frames = frames,
	};

	if (!c.lo || c.hi <= c.lo)
		return 0;
	bpf_loop(STACK_BYTES / sizeof(__u64), offcpu_irq_frame, &c, 0);
	return c.found;
}

/*
 * The current thread wakes `p`, whose block already lasted at least min_block: the
 * waker's stacks, as it wakes it, go out now (or were sent since the last drain: the
 * same key), and the key is left in p's record for the block's own, which follows.
 * sched_waking runs in the waker (try_to_wake_up, under p's pi_lock: interrupts off),
 * so its user stack is the current one. A wakeup from an interrupt (a timer, an I/O
 * completion) has the interrupted thread as `current`, which is no waker: its kernel
 * stack, cut at the interrupt's entry, is all that is sent, as no process's (one key
 * for each interrupt path, not one per thread and place it happened to interrupt).
 */
static __always_inline void offcpu_waker(void *ctx, struct task_struct *p, struct offcpu_task *r, __u64 now,
					 __u64 ktime)
{
	struct task_struct *cur = bpf_get_current_task_btf();
	struct offcpu_thread *t;
	struct scratch *s;
	long kbytes, ubytes;
	__u32 zero = 0, irq;

	t = bpf_map_lookup_elem(&offcpu_scratch, &zero);
	if (!t) {
		offcpu_count(EMBER_OFFCPU_CNT_NO_SCRATCH);
		return;
	}
	offcpu_count(EMBER_OFFCPU_CNT_WAKER);
	s = &t->s;
	t->head.off_ns = now - r->start_ns;
	t->head.runnable_ns = 0;
	t->head.state = r->state;
	t->head.path = r->path;
	t->head.kind = EMBER_OFFCPU_WAKER;
	t->head.syscall = r->syscall;
	t->head.key = 0;
	t->head.waker_key = 0;
	s->rec.time_ns = ktime;
	capture_current(s, bpf_get_current_pid_tgid(), bpf_get_current_cgroup_id());
	kbytes = capture_kernel(ctx, s, CAPTURE_OFFCPU);
	irq = offcpu_irq_frames(s->ips, s->rec.kern_frames);
	if (irq) {
		offcpu_count(EMBER_OFFCPU_CNT_WAKER_IRQ);
		/* Masked, not only compared: the verifier keeps the bound. */
		_Static_assert(STACK_BYTES == 0x3f8, "STACK_BYTES is a mask of whole words");
		kbytes = ((long)irq * sizeof(__u64)) & STACK_BYTES;
		s->rec.kern_frames = kbytes / sizeof(__u64);
		s->rec.cgroup_id = 0;
		s->rec.pid = 0;
		s->rec.tid = 0;
		s->rec.start_ns = 0;
		__builtin_memset(s->rec.comm, 0, sizeof(s->rec.comm));
		__builtin_memcpy(s->rec.comm, "[interrupt]", sizeof("[interrupt]"));
	}
	ubytes = s->rec.pid && !kernel_thread(cur) ? capture_user(ctx, cur, s, kbytes, 0, CAPTURE_OFFCPU, 0) : 0;
	s->rec.user_frames = ubytes / sizeof(__u64);
	if (!ubytes)
		s->rec.py_result = EMBER_PY_NONE;
	r->waker_key = offcpu_send(t);
}

/*
 * A sleeping thread is being woken: from now on it waits for a CPU (runnable). The
 * first wakeup of a block already past min_block also takes the waker's stacks
 * (offcpu.wakers); every other wakeup costs the wakee's storage lookup.
 */
SEC("tp_btf/sched_waking")
int BPF_PROG(ember_offcpu_waking, struct task_struct *p)
{
	struct offcpu_task *r;
	struct offcpu_clock *c;
	__u64 now, ktime;

	r = bpf_task_storage_get(&offcpu_tasks, p, 0, 0);
	if (!r || !r->start_ns || r->wake_ns)
		return 0;
	/* The scheduler's clock of this CPU may be a tick old here: ktime, brought to it. */
	c = offcpu_clock();
	if (!c)
		return 0;
	ktime = bpf_ktime_get_ns();
	now = ktime - c->off;
	r->wake_ns = now;
	/* A block the fallback did not draw is not reported: neither is its waker. */
	if (ember_offcpu_cfg.wakers && r->path != OFFCPU_PATH_SKIP && now - r->start_ns >= ember_offcpu_cfg.min_block_ns &&
	    (__s64)(now - r->start_ns) > 0)
		offcpu_waker(ctx, p, r, now, ktime);
	return 0;
}

/*
 * Kernel lock contention (lock:contention_begin/end, 5.19+): a wait of min_block or
 * more is sent with the stacks of the thread as it gets the lock (its kernel stack is
 * the lock's call site). Only threads that already have an off-CPU record (they passed
 * the filters at a switch-out) are timed; a contention nested in another's slow path
 * (a mutex's wait_lock) is not timed apart from it.
 */
SEC("tp_btf/contention_begin")
int BPF_PROG(ember_offcpu_lock_begin, void *lock, unsigned int flags)
{
	struct offcpu_task *r = bpf_task_storage_get(&offcpu_tasks, bpf_get_current_task_btf(), 0, 0);

	if (!r || r->lock_ns)
		return 0;
	r->lock_addr = (__u64)lock;
	r->lock_ns = bpf_ktime_get_ns();
	return 0;
}

SEC("tp_btf/contention_end")
int BPF_PROG(ember_offcpu_lock_end, void *lock, int ret)
{
	struct task_struct *cur = bpf_get_current_task_btf();
	struct offcpu_task *r = bpf_task_storage_get(&offcpu_tasks, cur, 0, 0);
	struct offcpu_thread *t;
	struct scratch *s;
	long kbytes, ubytes;
	__u64 now, waited;
	__u32 one = 1;

	if (!r || !r->lock_ns || r->lock_addr != (__u64)lock)
		return 0;
	now = bpf_ktime_get_ns();
	waited = now - r->lock_ns;
	r->lock_ns = 0;
	if ((__s64)waited < 0 || waited < ember_offcpu_cfg.min_block_ns) {
		offcpu_count(EMBER_OFFCPU_CNT_KLOCK_SHORT);
		return 0;
	}
	t = bpf_map_lookup_elem(&offcpu_scratch, &one);
	if (!t) {
		offcpu_count(EMBER_OFFCPU_CNT_NO_SCRATCH);
		return 0;
	}
	offcpu_count(EMBER_OFFCPU_CNT_KLOCK);
	s = &t->s;
	t->head.off_ns = waited;
	t->head.runnable_ns = 0;
	t->head.state = EMBER_OFFCPU_SLEEP;
	t->head.path = EMBER_OFFCPU_PATH_EXIT;
	t->head.kind = EMBER_OFFCPU_KLOCK;
	t->head.syscall = -1;
	t->head.key = 0;
	t->head.waker_key = 0;
	s->rec.time_ns = now - waited;
	capture_current(s, bpf_get_current_pid_tgid(), bpf_get_current_cgroup_id());
	kbytes = capture_kernel(ctx, s, CAPTURE_OFFCPU);
	ubytes = s->rec.pid && !kernel_thread(cur) ? capture_user(ctx, cur, s, kbytes, 0, CAPTURE_OFFCPU, 0) : 0;
	s->rec.user_frames = ubytes / sizeof(__u64);
	if (!ubytes)
		s->rec.py_result = EMBER_PY_NONE;
	offcpu_send(t);
	return 0;
}

#endif /* EMBER_OFFCPU_WAKE_BPF_H */
