/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Run-queue latency histograms (runqlat.bpf.c).
 */
#ifndef EMBER_CONTRACT_RUNQLAT_H
#define EMBER_CONTRACT_RUNQLAT_H

/*
 * Run-queue latency (runqlat.bpf.c): time from a task becoming runnable
 * (sched_wakeup, sched_wakeup_new, or being preempted while still runnable)
 * to it running (sched_switch), in log2 buckets.
 *
 * Slot i counts latencies whose (ns >> EMBER_RQ_SHIFT) has floor(log2) == i
 * (0 and 1 both go to slot 0), so its upper bound is 2^(i+1) << EMBER_RQ_SHIFT
 * nanoseconds; the last slot also holds everything larger (+Inf).
 */
enum ember_rq_limit {
	EMBER_RQ_SLOTS = 24,
	EMBER_RQ_SHIFT = 10,
};

struct ember_rq_hist {
	__u64 slots[EMBER_RQ_SLOTS];
	__u64 sum_ns; /* sum of all latencies counted in `slots` */
};

/*
 * Per-container histograms live in the hash map `rq_cgroups`, keyed by the
 * kernfs id (= directory inode) of the task's perf_event cgroup: on cgroup v2
 * that is the task's cgroup, on v1 its cgroup in the perf_event hierarchy --
 * the same directory the agent opens for per-container perf counters. The
 * agent inserts a zeroed histogram for each container it tracks and deletes it
 * when the container goes; the program only adds to entries that exist, so
 * the map's size is the agent's cap and nothing is lost to a full map.
 */

/* Indexes of runqlat's per-CPU `rq_counters` map. */
enum ember_rq_counter {
	EMBER_RQ_CNT_EVENTS = 0,       /* latencies measured */
	EMBER_RQ_CNT_START_FULL = 1,   /* enqueue time not stored: `rq_start` full (latency lost) */
	EMBER_RQ_CNT_MAX = 2,
};

#endif /* EMBER_CONTRACT_RUNQLAT_H */
