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

#endif /* EMBER_FILTER_BPF_H */
