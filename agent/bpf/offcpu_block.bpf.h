/* SPDX-License-Identifier: GPL-2.0 */
/*
 * A block from switch-out to switch-in (tp_btf/sched_switch), and its user stack walked
 * as the thread returns to user mode: a task work, rseq_update or the syscall's exit.
 */
#ifndef EMBER_OFFCPU_BLOCK_BPF_H
#define EMBER_OFFCPU_BLOCK_BPF_H

#include "offcpu_send.bpf.h"

/* `prev` leaves the CPU: its record says when, why and where; stacks only for the fallback. */
static __always_inline void offcpu_out(void *ctx, _Bool preempt, struct task_struct *prev, __u64 now)
{
	struct task_struct___offcpu *p = (void *)prev;
	__u64 id = bpf_get_current_pid_tgid(), cgroup_id;
	__u32 pid = id >> 32, tid = (__u32)id;
	struct offcpu_task *r;
	int state, nr, kthread;

	if (tid == 0) /* the idle task */
		return;
	state = offcpu_state(preempt, p);
	if (state < 0) {
		offcpu_dead(prev, tid);
		return;
	}
	if (ember_cfg.filter_pids && !bpf_map_lookup_elem(&pid_filter, &pid)) {
		offcpu_count(EMBER_OFFCPU_CNT_FILTERED);
		return;
	}
	if (pid == ember_offcpu_cfg.self_tgid ||
	    (ember_deny_used &&
	     (bpf_map_lookup_elem(&pid_deny, &pid) ||
	      (cgroup_id = bpf_get_current_cgroup_id(), bpf_map_lookup_elem(&cgroup_deny, &cgroup_id))))) {
		offcpu_count(EMBER_OFFCPU_CNT_FILTERED);
		return;
	}
	offcpu_count(EMBER_OFFCPU_CNT_SWITCHES);
	kthread = !pid || kernel_thread(prev) || (prev->flags & EMBER_PF_USER_WORKER);
	if (kthread && !ember_offcpu_cfg.kernel_threads) {
		offcpu_count(EMBER_OFFCPU_CNT_KTHREAD_SKIPPED);
		return;
	}
	if (ember_offcpu_cfg.sample_threshold <= 0xffffffffULL &&
	    (__u64)bpf_get_prandom_u32() >= ember_offcpu_cfg.sample_threshold)
		return;
	r = offcpu_record(prev);
	if (!r)
		return;
	r->start_ns = now;
	r->wake_ns = 0;
	r->waker_key = 0;
	r->state = state;
	if (kthread) {
		/* Its cgroup now: at its switch-in another task is current. */
		r->cgroup_id = bpf_get_current_cgroup_id();
		r->syscall = -1;
		r->path = EMBER_OFFCPU_PATH_KTHREAD;
		offcpu_count(EMBER_OFFCPU_CNT_KTHREAD);
		return;
	}
	/* A record waiting for its syscall's exit: the thread is still inside that syscall. */
	nr = r->held == HELD_EXIT ? r->syscall : offcpu_syscall(prev);
	r->syscall = nr;
	/* Any block of a user thread: a task work walks it on the way back to user mode. */
	if (ember_offcpu_cfg.task_work) {
		r->path = EMBER_OFFCPU_PATH_EXIT;
		offcpu_count(EMBER_OFFCPU_CNT_TASK_WORK);
		return;
	}
	/* Any block of a thread with rseq: rseq_update runs in it before it is back in user mode. */
	if (ember_offcpu_cfg.rseq && offcpu_has_rseq(prev)) {
		r->path = EMBER_OFFCPU_PATH_EXIT;
		offcpu_count(EMBER_OFFCPU_CNT_RSEQ);
		return;
	}
	if (nr >= 0 && ember_offcpu_cfg.syscall_exit) {
		r->path = EMBER_OFFCPU_PATH_EXIT;
		offcpu_count(EMBER_OFFCPU_CNT_SYSCALL);
		return;
	}
	if (ember_offcpu_cfg.fallback_threshold <= 0xffffffffULL &&
	    (__u64)bpf_get_prandom_u32() >= ember_offcpu_cfg.fallback_threshold) {
		r->path = OFFCPU_PATH_SKIP;
		offcpu_count(EMBER_OFFCPU_CNT_SKIPPED);
		return;
	}
	r->path = EMBER_OFFCPU_PATH_SWITCH;
	offcpu_walk_out(ctx, prev, r, tid, now);
}

/* The head of a block that ended now: its time in its state, then runnable after a wakeup. */
static __always_inline void offcpu_times(struct ember_offcpu_head *h, struct offcpu_task *r, __u64 start,
					 __u64 now)
{
	h->state = r->state;
	h->path = r->path;
	h->kind = EMBER_OFFCPU_BLOCK;
	h->syscall = r->syscall;
	h->key = 0;
	h->waker_key = r->waker_key;
	if (r->state != EMBER_OFFCPU_RUNNABLE && r->wake_ns > start && r->wake_ns <= now) {
		h->off_ns = r->wake_ns - start;
		h->runnable_ns = now - r->wake_ns;
	} else {
		h->off_ns = now - start;
		h->runnable_ns = 0;
	}
}

/*
 * A held long block's user stack, walked in its thread on the way back to user mode, and
 * the record sent: the rest of offcpu_in_syscall once the thread is back (by rseq_update,
 * sys_exit, or the task work). `ctx` is 0 in a task work.
 */
static __always_inline void offcpu_walk_back(void *ctx, struct task_struct *task, struct offcpu_thread *t)
{
	long kbytes, ubytes;
	__u64 start;

	offcpu_count(EMBER_OFFCPU_CNT_EXIT_WALK);
	capture_current(&t->s, bpf_get_current_pid_tgid(), bpf_get_current_cgroup_id());
	kbytes = t->s.rec.kern_frames;
	if (kbytes > EMBER_MAX_FRAMES)
		kbytes = EMBER_MAX_FRAMES;
	kbytes *= sizeof(__u64);
	/* The walker's clock (asks, table stamps) is now; the record keeps the block's start. */
	start = t->s.rec.time_ns;
	t->s.rec.time_ns = bpf_ktime_get_ns();
	ubytes = capture_user(ctx, task, &t->s, kbytes, 0, CAPTURE_OFFCPU, !!ctx);
	t->s.rec.time_ns = start;
	t->s.rec.user_frames = ubytes / sizeof(__u64);
	if (!ubytes)
		t->s.rec.py_result = EMBER_PY_NONE;
	offcpu_send(t);
}

/*
 * The task work a long block's switch-in schedules: it runs in the thread as it returns to
 * user mode, its user registers and stack those it blocked with. Preemptible where the
 * kernel runs it, so the walk (per-CPU read buffers) runs with preemption off; the row cache
 * is left alone (another thread's work may have been preempted halfway through an entry).
 */
static int offcpu_work(struct bpf_map *map, void *key, void *value)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct offcpu_task *r;

	r = bpf_task_storage_get(&offcpu_tasks, task, 0, 0);
	/* Released meanwhile (its thread was seen exiting, or the entry was replaced). */
	if (!r || r->held != HELD_EXIT || *(__u32 *)key != tid)
		return 0;
	bpf_preempt_disable();
	offcpu_walk_back(0, task, value);
	/* Last: the entry (this work's own) may be reused as soon as it is deleted. */
	offcpu_release(r, tid);
	bpf_preempt_enable();
	return 0;
}

/* A long block inside a syscall ended: its kernel stack now, held for the syscall's exit. */
static __always_inline void offcpu_in_syscall(struct task_struct *next, struct offcpu_task *r, __u32 tid,
					      __u64 start, __u64 now)
{
	struct offcpu_thread *t;
	__u32 zero = 0;
	long kbytes;

	if (r->held == HELD_EXIT) {
		/* Blocked again in the same syscall before its exit: one record, one stack. */
		t = bpf_map_lookup_elem(&offcpu_threads, &tid);
		if (t) {
			struct ember_offcpu_head h;

			offcpu_times(&h, r, start, now);
			if (h.state == EMBER_OFFCPU_RUNNABLE)
				t->head.runnable_ns += h.off_ns;
			else
				t->head.off_ns += h.off_ns;
			t->head.runnable_ns += h.runnable_ns;
			/* The waker that ended the later block is the one the thread runs on. */
			if (r->waker_key)
				t->head.waker_key = r->waker_key;
			offcpu_count(EMBER_OFFCPU_CNT_MERGED);
			return;
		}
		offcpu_set_held(r, HELD_NONE);
	}
	t = bpf_map_lookup_elem(&offcpu_scratch, &zero);
	if (!t) {
		offcpu_count(EMBER_OFFCPU_CNT_NO_SCRATCH);
		return;
	}
	offcpu_times(&t->head, r, start, now);
	t->s.rec.time_ns = offcpu_ktime(start);
	kbytes = bpf_get_task_stack(next, t->s.ips, STACK_BYTES, 0);
	if (kbytes < 0)
		kbytes = 0;
	if (kbytes > STACK_BYTES)
		kbytes = STACK_BYTES;
	t->s.rec.kern_frames = kbytes / sizeof(__u64);
	t->s.rec.user_frames = 0;
	if (!offcpu_hold(tid, t))
		return;
	offcpu_set_held(r, HELD_EXIT);
	if (ember_offcpu_cfg.task_work && bpf_ksym_exists(bpf_task_work_schedule_resume_impl)) {
		struct offcpu_entry *h = bpf_map_lookup_elem(&offcpu_threads, &tid);

		if (!h || bpf_task_work_schedule_resume_impl(next, &h->tw, &offcpu_threads, offcpu_work, 0)) {
			offcpu_count(EMBER_OFFCPU_CNT_WORK_FAILED);
			offcpu_release(r, tid);
		}
	}
}

/* A kernel thread's long block: its kernel stack, sent now. */
static __always_inline void offcpu_in_kthread(struct task_struct *next, struct offcpu_task *r, __u64 start,
					      __u64 now)
{
	struct task_struct___offcpu *n = (void *)next;
	struct offcpu_thread *t;
	struct scratch *s;
	__u32 zero = 0;
	long kbytes;

	t = bpf_map_lookup_elem(&offcpu_scratch, &zero);
	if (!t) {
		offcpu_count(EMBER_OFFCPU_CNT_NO_SCRATCH);
		return;
	}
	s = &t->s;
	offcpu_times(&t->head, r, start, now);
	s->rec.time_ns = offcpu_ktime(start);
	s->rec.cgroup_id = r->cgroup_id;
	s->rec.pid = n->tgid;
	s->rec.tid = n->pid;
	s->rec.start_ns = process_start_ns(next);
	s->rec.cpu = bpf_get_smp_processor_id();
	s->rec.user_result = EMBER_UNWIND_FRAME_POINTER;
	s->rec.user_flags = 0;
	s->rec.py_result = EMBER_PY_NONE;
	bpf_probe_read_kernel(s->rec.comm, sizeof(s->rec.comm), n->comm);
	kbytes = bpf_get_task_stack(next, s->ips, STACK_BYTES, 0);
	if (kbytes < 0)
		kbytes = 0;
	if (kbytes > STACK_BYTES)
		kbytes = STACK_BYTES;
	s->rec.kern_frames = kbytes / sizeof(__u64);
	s->rec.user_frames = 0;
	offcpu_send(t);
}

/* `next` runs again: a short block is forgotten; a long one is taken by its path. */
static __always_inline void offcpu_in(struct task_struct *next, __u64 now)
{
	struct task_struct___offcpu *n = (void *)next;
	__u32 tid = n->pid;
	struct offcpu_task *r;
	struct offcpu_thread *t;
	__u64 start;

	if (!tid)
		return;
	r = bpf_task_storage_get(&offcpu_tasks, next, 0, 0);
	if (!r || !r->start_ns)
		return;
	start = r->start_ns;
	r->start_ns = 0;
	if ((__s64)(now - start) < 0 || now - start < ember_offcpu_cfg.min_block_ns) {
		offcpu_count(EMBER_OFFCPU_CNT_SHORT);
		if (r->held == HELD_SWITCH)
			offcpu_release(r, tid);
		return;
	}
	switch (r->path) {
	case EMBER_OFFCPU_PATH_EXIT:
		offcpu_in_syscall(next, r, tid, start, now);
		return;
	case EMBER_OFFCPU_PATH_KTHREAD:
		offcpu_in_kthread(next, r, start, now);
		return;
	case EMBER_OFFCPU_PATH_SWITCH:
		if (r->held != HELD_SWITCH)
			return;
		t = bpf_map_lookup_elem(&offcpu_threads, &tid);
		if (t) {
			offcpu_times(&t->head, r, start, now);
			offcpu_send(t);
		}
		offcpu_release(r, tid);
		return;
	default: /* OFFCPU_PATH_SKIP: its share is in the fallback's scaled records */
		return;
	}
}

SEC("tp_btf/sched_switch")
int BPF_PROG(ember_offcpu_switch, _Bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u64 now = offcpu_switch_now(prev);

	offcpu_out(ctx, preempt, prev, now);
	offcpu_in(next, now);
	return 0;
}

/*
 * The current thread is back from a block, in its own context with its user registers
 * and stack as it blocked with: if the block was long, its user stack is walked now and
 * the block is sent. Any other call costs one read of ember_offcpu_exits, or the record's
 * lookup while some thread's entry waits.
 */
static __always_inline void offcpu_resume(void *ctx)
{
	struct task_struct *task;
	struct offcpu_task *r;
	struct offcpu_thread *t;
	__u32 tid;

	if (!ember_offcpu_exits)
		return;
	task = bpf_get_current_task_btf();
	r = bpf_task_storage_get(&offcpu_tasks, task, 0, 0);
	if (!r || r->held != HELD_EXIT)
		return;
	tid = (__u32)bpf_get_current_pid_tgid();
	t = bpf_map_lookup_elem(&offcpu_threads, &tid);
	if (t)
		offcpu_walk_back(ctx, task, t);
	offcpu_release(r, tid);
}

/* A syscall returns: the thread is back from any block inside it. */
SEC("tp_btf/sys_exit")
int BPF_PROG(ember_offcpu_exit, struct pt_regs *regs, long ret)
{
	offcpu_resume(ctx);
	return 0;
}

/*
 * A thread with rseq registered returns to user mode after a context switch (the
 * scheduler sets TIF_NOTIFY_RESUME at every switch-out of such a thread): it is back
 * from a block of any kind, in a syscall or not. Runs once per switch, not per syscall.
 */
SEC("tp_btf/rseq_update")
int BPF_PROG(ember_offcpu_rseq, struct task_struct *t)
{
	offcpu_resume(ctx);
	return 0;
}

#endif /* EMBER_OFFCPU_BLOCK_BPF_H */
