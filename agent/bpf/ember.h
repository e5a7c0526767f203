/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The only contract between ember's BPF program and its Rust side.
 *
 * The Rust types are generated from this header's BTF by libbpf-cargo (the
 * `ember_cfg` rodata and `ember_record_layout` globals pull them into the
 * skeleton), so nothing here is copied by hand.
 */
#ifndef EMBER_H
#define EMBER_H

/* Frames kept per stack, per side (kernel and user); the kernel's own cap is 127. */
#define EMBER_MAX_FRAMES 127
#define EMBER_COMM_LEN 16

/* Settings written into .rodata before load. */
struct ember_config {
	/* Non-zero: only tgids present in the `pid_filter` map are sampled. */
	__u32 filter_pids;
	/* Non-zero: also sample the idle task (pid 0). */
	__u32 include_idle;
	/*
	 * Wake the consumer only once this many bytes wait in the ring buffer: the
	 * agent drains on a timer, so a quiet host costs no wakeup per sample.
	 */
	__u64 wakeup_bytes;
};

/*
 * Fixed part of every ring buffer record. It is followed by `kern_frames`
 * kernel instruction pointers, then `user_frames` user ones, leaf first.
 */
struct ember_record {
	__u64 time_ns;   /* bpf_ktime_get_ns() (CLOCK_MONOTONIC) */
	__u64 cgroup_id; /* v2 cgroup id of the task */
	__u32 pid;       /* thread group id, as the host sees it */
	__u32 tid;
	__u32 cpu;
	__u16 kern_frames;
	__u16 user_frames;
	char comm[EMBER_COMM_LEN]; /* thread name */
	__u64 ips[];
};

/* Indexes of the per-CPU `counters` map. Every path that loses a sample has one. */
enum ember_counter {
	EMBER_CNT_SAMPLES = 0,    /* program runs that were not filtered out */
	EMBER_CNT_SENT = 1,       /* records handed to the ring buffer */
	EMBER_CNT_LOST_RINGBUF = 2, /* ring buffer full: whole sample lost */
	EMBER_CNT_KERN_STACK_ERR = 3, /* bpf_get_stack failed for the kernel side (sample kept) */
	EMBER_CNT_USER_STACK_ERR = 4, /* bpf_get_stack failed for the user side (sample kept) */
	EMBER_CNT_IDLE = 5,       /* idle task skipped (not a loss) */
	EMBER_CNT_FILTERED = 6,   /* excluded by --pid or the filters (not a loss) */
	EMBER_CNT_NO_SCRATCH = 7, /* per-CPU scratch missing: whole sample lost */
	EMBER_CNT_MAX = 8,
};

/*
 * Run-queue latency (runqlat.bpf.c): time from a task becoming runnable
 * (sched_wakeup, sched_wakeup_new, or being preempted while still runnable)
 * to it running (sched_switch), in log2 buckets.
 *
 * Slot i counts latencies whose (ns >> EMBER_RQ_SHIFT) has floor(log2) == i
 * (0 and 1 both go to slot 0), so its upper bound is 2^(i+1) << EMBER_RQ_SHIFT
 * nanoseconds; the last slot also holds everything larger (+Inf).
 */
#define EMBER_RQ_SLOTS 24
#define EMBER_RQ_SHIFT 10

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

#endif /* EMBER_H */
