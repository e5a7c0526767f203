// SPDX-License-Identifier: GPL-2.0
/*
 * ember's sampler: a perf_event program that copies the interrupted task's
 * kernel and user stacks into one ring buffer record.
 *
 * Why a ring buffer and no STACK_TRACE map: stack-id maps lose samples to hash
 * collisions and to drain races (see shared/docs/bpf-notes.md). Raw stacks in
 * a ring buffer lose a sample only when the buffer is full, and that is counted.
 */
#include "types.h"
#include <bpf/bpf_helpers.h>
#include "ember.h"

char LICENSE[] SEC("license") = "GPL";

const volatile struct ember_config ember_cfg = {};

/* Never written: present so the skeleton carries the Rust types of the record and the counters. */
struct ember_record ember_record_layout = {};
enum ember_counter ember_counter_layout = EMBER_CNT_MAX;
/* Likewise for the unwind table types: normalize/unwind checks its Rust mirror against them. */
struct ember_unwind_row ember_unwind_row_layout = {};
struct ember_unwind_page ember_unwind_page_layout = {};
enum ember_cfa_rule ember_cfa_rule_layout = EMBER_CFA_UNSUPPORTED;
enum ember_rbp_rule ember_rbp_rule_layout = EMBER_RBP_UNCHANGED;

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

/* Allow-list of tgids, used when ember_cfg.filter_pids is set (`--pid`). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} pid_filter SEC(".maps");

/*
 * Deny-lists the agent fills as it judges workloads against its filters: excluded
 * processes cost one lookup per sample from then on. Cgroups where the host has
 * cgroup v2 ids for containers; pids otherwise (LRU: bounded, oldest forgotten).
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u8);
} pid_deny SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __u8);
} cgroup_deny SEC(".maps");

/* A record with room for both stacks; built here, then copied out at its used size. */
struct scratch {
	struct ember_record rec;
	__u64 ips[2 * EMBER_MAX_FRAMES];
};

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

SEC("perf_event")
int ember_sample(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32, tid = (__u32)id;
	__u32 zero = 0;
	struct scratch *s;
	long kbytes, ubytes;
	__u64 size, wake, cgroup_id;

	if (tid == 0 && !ember_cfg.include_idle) {
		count(EMBER_CNT_IDLE);
		return 0;
	}
	if (ember_cfg.filter_pids && !bpf_map_lookup_elem(&pid_filter, &pid)) {
		count(EMBER_CNT_FILTERED);
		return 0;
	}
	cgroup_id = bpf_get_current_cgroup_id();
	if (bpf_map_lookup_elem(&pid_deny, &pid) || bpf_map_lookup_elem(&cgroup_deny, &cgroup_id)) {
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
	s->rec.cgroup_id = cgroup_id;
	s->rec.pid = pid;
	s->rec.tid = tid;
	s->rec.cpu = bpf_get_smp_processor_id();
	bpf_get_current_comm(s->rec.comm, sizeof(s->rec.comm));

	kbytes = bpf_get_stack(ctx, s->ips, STACK_BYTES, 0);
	if (kbytes < 0) {
		count(EMBER_CNT_KERN_STACK_ERR);
		kbytes = 0;
	}
	if (kbytes > STACK_BYTES)
		kbytes = STACK_BYTES;
	kbytes &= ~7L;

	ubytes = 0;
	if (pid != 0) {
		/* Kernel threads have no user stack; only count failures of user tasks. */
		ubytes = bpf_get_stack(ctx, (void *)s->ips + kbytes, STACK_BYTES, BPF_F_USER_STACK);
		if (ubytes < 0) {
			count(EMBER_CNT_USER_STACK_ERR);
			ubytes = 0;
		}
		if (ubytes > STACK_BYTES)
			ubytes = STACK_BYTES;
		ubytes &= ~7L;
	}
	s->rec.kern_frames = kbytes / sizeof(__u64);
	s->rec.user_frames = ubytes / sizeof(__u64);

	size = sizeof(struct ember_record) + kbytes + ubytes;
	if (size > sizeof(*s))
		size = sizeof(*s);
	wake = bpf_ringbuf_query(&samples, BPF_RB_AVAIL_DATA) >= ember_cfg.wakeup_bytes ?
		       BPF_RB_FORCE_WAKEUP :
		       BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_output(&samples, s, size, wake)) {
		count(EMBER_CNT_LOST_RINGBUF);
		return 0;
	}
	count(EMBER_CNT_SENT);
	return 0;
}
