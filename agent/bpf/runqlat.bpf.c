// SPDX-License-Identifier: GPL-2.0
/*
 * ember's run-queue latency: how long runnable tasks wait for a CPU, by the
 * method of BCC's runqlat. The time a task becomes runnable (woken, newly
 * forked, or preempted while still runnable) is stored per thread; when
 * sched_switch puts it on a CPU the difference goes into a log2 histogram,
 * host-wide (per CPU, summed by the agent) and per container cgroup.
 *
 * tp_btf programs (BTF-typed tracepoints) rather than kprobes, which this
 * kind of kernel may lack; the task fields are read with CO-RE relocations, so
 * the program needs the kernel's BTF but no vmlinux.h.
 */
#include "types.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "ember.h"

char LICENSE[] SEC("license") = "GPL";

#define BPF_ANY 0
#define TASK_RUNNING 0

typedef _Bool bool;

/* The few kernel types read, as CO-RE relocatable views (only the fields used). */
struct kernfs_node {
	__u64 id;
} __attribute__((preserve_access_index));

struct cgroup {
	struct kernfs_node *kn;
} __attribute__((preserve_access_index));

struct cgroup_subsys_state {
	struct cgroup *cgroup;
} __attribute__((preserve_access_index));

struct css_set {
	struct cgroup_subsys_state *subsys[16];
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	unsigned int __state;
	struct css_set *cgroups;
} __attribute__((preserve_access_index));

/* Kernels before 5.14 call the field `state`. */
struct task_struct___pre514 {
	long state;
} __attribute__((preserve_access_index));

enum cgroup_subsys_id {
	perf_event_cgrp_id = 0, /* relocated to the running kernel's value */
};

/* Never written: present so the skeleton carries the Rust types. */
struct ember_rq_hist ember_rq_hist_layout = {};
enum ember_rq_counter ember_rq_counter_layout = EMBER_RQ_CNT_MAX;
enum ember_rq_limit ember_rq_limit_layout = EMBER_RQ_SLOTS;

/* tid -> when it became runnable. Full map: the latency is lost and counted. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u64);
} rq_start SEC(".maps");

/* Host-wide histogram, one per CPU (no atomics on the hot path). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ember_rq_hist);
} rq_host SEC(".maps");

/* perf_event cgroup kernfs id -> histogram; entries made by the agent (see ember.h). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64); /* resized from the config before load */
	__type(key, __u64);
	__type(value, struct ember_rq_hist);
} rq_cgroups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EMBER_RQ_CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} rq_counters SEC(".maps");

static __always_inline void count(__u32 idx)
{
	__u64 *c = bpf_map_lookup_elem(&rq_counters, &idx);
	if (c)
		*c += 1;
}

/*
 * The task pointers come from tp_btf arguments, which the verifier trusts: their fields
 * are plain (CO-RE relocated) loads, not bpf_probe_read_kernel calls.
 */
static __always_inline void enqueue(struct task_struct *p)
{
	__u32 tid = p->pid;
	__u64 now;

	if (!tid) /* the idle task never waits */
		return;
	now = bpf_ktime_get_ns();
	if (bpf_map_update_elem(&rq_start, &tid, &now, BPF_ANY))
		count(EMBER_RQ_CNT_START_FULL);
}

/* kernfs id of the task's cgroup in the hierarchy that holds perf_event. */
static __always_inline __u64 perf_cgroup_id(struct task_struct *p)
{
	struct css_set *cset = p->cgroups;
	struct cgroup_subsys_state *css = 0;
	int idx = bpf_core_enum_value(enum cgroup_subsys_id, perf_event_cgrp_id);

	if (!cset || idx < 0 || idx >= 32)
		return 0;
	/* The index is only known at load time: compute the slot's address. */
	bpf_probe_read_kernel(&css, sizeof(css),
			      (void *)cset + bpf_core_field_offset(struct css_set, subsys) +
				      idx * sizeof(css));
	if (!css)
		return 0;
	return BPF_CORE_READ(css, cgroup, kn, id);
}

static __always_inline __u32 slot_of(__u64 ns)
{
	__u64 v = ns >> EMBER_RQ_SHIFT;
	__u32 s = 0;

	/* floor(log2(v)), bounded loop for the verifier */
	for (int i = 0; i < EMBER_RQ_SLOTS - 1; i++) {
		if (v < 2)
			break;
		v >>= 1;
		s++;
	}
	return s;
}

static __always_inline void running(struct task_struct *p)
{
	__u32 tid = p->pid;
	__u32 zero = 0, slot;
	struct ember_rq_hist *h;
	__u64 *start, delta, cg;

	start = bpf_map_lookup_elem(&rq_start, &tid);
	if (!start)
		return;
	delta = bpf_ktime_get_ns() - *start;
	bpf_map_delete_elem(&rq_start, &tid);
	if ((__s64)delta < 0)
		return;
	slot = slot_of(delta);
	if (slot >= EMBER_RQ_SLOTS)
		return;
	count(EMBER_RQ_CNT_EVENTS);
	h = bpf_map_lookup_elem(&rq_host, &zero);
	if (h) {
		h->slots[slot] += 1;
		h->sum_ns += delta;
	}
	cg = perf_cgroup_id(p);
	if (!cg)
		return;
	h = bpf_map_lookup_elem(&rq_cgroups, &cg);
	if (h) {
		__sync_fetch_and_add(&h->slots[slot], 1);
		__sync_fetch_and_add(&h->sum_ns, delta);
	}
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(ember_rq_wakeup, struct task_struct *p)
{
	enqueue(p);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(ember_rq_wakeup_new, struct task_struct *p)
{
	enqueue(p);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(ember_rq_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	unsigned int state;

	/* A task switched out while still runnable (preempted) waits again from now. */
	if (bpf_core_field_exists(prev->__state))
		state = prev->__state;
	else
		state = BPF_CORE_READ((struct task_struct___pre514 *)prev, state);
	if (state == TASK_RUNNING)
		enqueue(prev);
	running(next);
	return 0;
}
