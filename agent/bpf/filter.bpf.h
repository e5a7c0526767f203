/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Who is profiled: the `--pid` allow-list and the deny-lists the agent fills as it
 * judges workloads (the sampler and off-CPU both skip what they name).
 */
#ifndef EMBER_FILTER_BPF_H
#define EMBER_FILTER_BPF_H

#include "record.bpf.h"

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

/*
 * Not LRU: a forgotten cgroup would be sampled again. The agent removes an entry once the
 * cgroup is gone or its workload is allowed again, and denies by pid when this is full.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384); /* resized from CGROUP_DENY_ENTRIES before load */
	__type(key, __u64);
	__type(value, __u8);
} cgroup_deny SEC(".maps");

/*
 * Set by the agent before its first deny order, never cleared: until then both deny maps
 * are empty and their lookups are skipped (two hash lookups at every context switch with
 * off-CPU on, most of which a host without filters never needs).
 */
__u32 ember_deny_used = 0;

/*
 * `record -- CMD` and `--subprocesses`: a process forked by one on the allow-list joins
 * it, so the command's children are sampled from their first instruction (an exec keeps
 * the tgid). New threads share their process's tgid: nothing to add. Loaded only when
 * asked; a full list is counted and the child goes unsampled.
 */
struct task_struct___fork {
	int pid;
	int tgid;
} __attribute__((preserve_access_index));

SEC("tp_btf/sched_process_fork")
int BPF_PROG(ember_fork, struct task_struct *parent_, struct task_struct *child_)
{
	/* Direct loads: both are the tracepoint's own (BTF-typed) pointers. */
	struct task_struct___fork *parent = (void *)parent_, *child = (void *)child_;
	__u32 ptgid = parent->tgid, tgid = child->tgid;
	__u8 one = 1;

	if (!ember_cfg.follow_forks || child->pid != child->tgid || !bpf_map_lookup_elem(&pid_filter, &ptgid))
		return 0;
	if (bpf_map_update_elem(&pid_filter, &tgid, &one, 0 /* BPF_ANY */))
		count(EMBER_CNT_FORK_FULL);
	return 0;
}

#endif /* EMBER_FILTER_BPF_H */
