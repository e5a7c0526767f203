/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The sampler: a perf_event program per CPU that takes the interrupted thread's record
 * and stacks (stack.bpf.h), after the filters the agent set (pids, denied workloads).
 */
#ifndef EMBER_SAMPLE_BPF_H
#define EMBER_SAMPLE_BPF_H

#include "filter.bpf.h"
#include "stack.bpf.h"

/*
 * A sample: the record's fields and the kernel stack; then the user stack, by
 * frame pointers (bpf_get_stack), or, when `tables`, by the walker, whose first run
 * is the sampler's own (a tail call and the map lookups it repeats cost a stack of
 * a few frames a tenth of its time), and which tail-calls ember_walk for the rest.
 */
static __always_inline int sample(struct ember_perf_ctx *ctx, const int tables)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32, tid = (__u32)id;
	/* Interrupted in user mode: its registers are the thread's, and the kernel has no stack to give. */
	int user_mode = (ctx->regs.cs & 3) == 3;
	__u32 zero = 0;
	struct scratch *s;
	long kbytes, ubytes;
	__u64 cgroup_id;

	if (tid == 0 && !ember_cfg.include_idle) {
		count(EMBER_CNT_IDLE);
		return 0;
	}
	if (ember_cfg.filter_pids && !bpf_map_lookup_elem(&pid_filter, &pid)) {
		count(EMBER_CNT_FILTERED);
		return 0;
	}
	cgroup_id = bpf_get_current_cgroup_id();
	if (ember_deny_used &&
	    (bpf_map_lookup_elem(&pid_deny, &pid) || bpf_map_lookup_elem(&cgroup_deny, &cgroup_id))) {
		count(EMBER_CNT_FILTERED);
		return 0;
	}
	count(EMBER_CNT_SAMPLES);

	s = bpf_map_lookup_elem(&scratch_map, &zero);
	if (!s) {
		count(EMBER_CNT_NO_SCRATCH);
		return 0;
	}
	s->rec.time_ns = bpf_ktime_get_ns();
	capture_current(s, id, cgroup_id);
	/* get_perf_callchain gives nothing for user mode: the call is skipped. */
	if (user_mode) {
		s->rec.kern_frames = 0;
		kbytes = 0;
	} else {
		kbytes = capture_kernel(ctx, s, CAPTURE_SAMPLE);
	}
	ubytes = 0;
	/* The current task is typed only with kernel BTF (task_regs). */
	if (pid != 0 && !(ember_cfg.task_regs && kernel_thread(bpf_get_current_task_btf()))) {
		if (tables)
			ubytes = capture_user(ctx, 0, s, kbytes, user_mode ? &ctx->regs : 0, CAPTURE_SAMPLE, 1);
		else
			ubytes = capture_fp(ctx, 0, s, kbytes, CAPTURE_SAMPLE);
		if (ubytes < 0)
			return 0; /* the walker sent the record */
	}
	s->rec.user_frames = ubytes / sizeof(__u64);
	emit(s, kbytes, ubytes);
	return 0;
}

/* The sampler that must load on every kernel: user stacks by frame pointers. */
SEC("perf_event")
int ember_sample(struct ember_perf_ctx *ctx)
{
	return sample(ctx, 0);
}

/* The sampler with the table walker (sampling.unwind auto or dwarf, where the kernel takes it). */
SEC("perf_event")
int ember_sample_walk(struct ember_perf_ctx *ctx)
{
	return sample(ctx, 1);
}

#endif /* EMBER_SAMPLE_BPF_H */
