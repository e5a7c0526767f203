/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Off-CPU's per-thread state: the task record of each thread that left a CPU, the
 * held stacks, the maps and counters, the scheduler clock, and the block's state.
 */
#ifndef EMBER_OFFCPU_TASK_BPF_H
#define EMBER_OFFCPU_TASK_BPF_H

#include "filter.bpf.h"
#include "stack.bpf.h"

/* The kernel's task states (include/linux/sched.h), stable since 4.14. */
#define EMBER_TASK_RUNNING 0x0
#define EMBER_TASK_UNINTERRUPTIBLE 0x2
#define EMBER_TASK_DEAD 0x80
#define EMBER_TASK_NOLOAD 0x400

#ifndef BPF_EXIST
#define BPF_EXIST 2
#endif
#define EMBER_EEXIST 17
#define EMBER_MAP_TYPE_TASK_STORAGE 29
#define EMBER_STORAGE_CREATE 1 /* BPF_LOCAL_STORAGE_GET_F_CREATE */
/* pt_regs.ax while a syscall runs: the entry code stores -ENOSYS there until it returns. */
#define EMBER_ENOSYS_AX ((__u64)-38)
/* Above any syscall number: orig_ax of an interrupt or exception is -1, a vector or an error code. */
#define EMBER_MAX_SYSCALL 1024

const volatile struct ember_offcpu_config ember_offcpu_cfg = {};

/* Never written: present so the skeleton carries the Rust types. */
struct ember_offcpu_head ember_offcpu_head_layout = {};
enum ember_offcpu_counter ember_offcpu_counter_layout = EMBER_OFFCPU_CNT_MAX;
enum ember_offcpu_state ember_offcpu_state_layout = EMBER_OFFCPU_SLEEP;
enum ember_offcpu_path ember_offcpu_path_layout = EMBER_OFFCPU_PATH_EXIT;
enum ember_offcpu_kind ember_offcpu_kind_layout = EMBER_OFFCPU_BLOCK;
struct ember_offcpu_sum ember_offcpu_sum_layout = {};

/* Entries of `offcpu_threads` (stacks held) right now. */
__u64 ember_offcpu_live = 0;
/* Per-task records (`offcpu_tasks`) right now: the cap's count. */
__u64 ember_offcpu_tasks = 0;
/*
 * Entries waiting for their syscall's exit right now. Zero nearly all the time (an entry
 * lives from a long block's switch-in to its syscall's exit, microseconds), so the
 * sys_exit program of every other syscall on the host ends on this one read; it is
 * written twice per long block.
 */
__u64 ember_offcpu_exits = 0;

/* The fields read of a task, as a CO-RE flavor of the kernel's task_struct. */
struct task_struct___offcpu {
	int pid;
	int tgid;
	unsigned int __state;
	char comm[EMBER_COMM_LEN];
} __attribute__((preserve_access_index));

/* The thread's registered rseq area (4.18 to 6.18): non-zero, the kernel calls rseq_update on its way back. */
struct task_struct___rseq {
	void *rseq;
} __attribute__((preserve_access_index));

/* Whether `task` has rseq registered, so every return to user mode after a switch runs rseq_update. */
static __always_inline int offcpu_has_rseq(struct task_struct *task)
{
	struct task_struct___rseq *t = (void *)task;

	if (!bpf_core_field_exists(t->rseq))
		return 0;
	/* A direct load: `task` is the tracepoint's own (BTF-typed) pointer. */
	return t->rseq != 0;
}

/* A flavor of the kernel's pt_regs: the two words that say whether a syscall runs. */
struct pt_regs___offcpu {
	unsigned long ax;
	unsigned long orig_ax;
} __attribute__((preserve_access_index));

/* What a task's record holds in `offcpu_threads`. */
enum offcpu_held {
	HELD_NONE = 0,
	HELD_SWITCH = 1, /* the fallback's stacks, from switch-out to switch-in */
	HELD_EXIT = 2,   /* a long block's kernel stack, from switch-in to the syscall's exit */
};

/*
 * A thread of the kernel's on behalf of a process (io_uring's io-wq, vhost; 6.4+): it never
 * returns to user mode, and its saved registers are its creator's, inside a syscall.
 */
#define EMBER_PF_USER_WORKER 0x00004000

/* Not taken at switch-out: a block outside a syscall the fallback did not draw. */
#define OFFCPU_PATH_SKIP 3

/* A thread's own record: 64 bytes, plus the kernel's task storage overhead. */
struct offcpu_task {
	__u64 start_ns;  /* switch-out of the block under way; 0: on CPU */
	__u64 wake_ns;   /* first wakeup since start_ns, 0 if none yet */
	__u64 cgroup_id; /* a kernel thread's, at switch-out (user threads': read when walked) */
	__u64 lock_ns;   /* contention_begin of the kernel lock it waits for; 0: none */
	__u64 lock_addr; /* ... that lock (a nested contention, inside its slow path, is not timed) */
	__u64 waker_key; /* the key of the waker record of the block under way; 0: none yet */
	__s32 syscall;   /* the syscall it blocked in, -1 outside one */
	__u8 state;      /* enum ember_offcpu_state */
	__u8 path;       /* enum ember_offcpu_path, or OFFCPU_PATH_SKIP */
	__u8 held;       /* enum offcpu_held */
	__u8 pad;
};

struct {
	__uint(type, EMBER_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct offcpu_task);
} offcpu_tasks SEC(".maps");

/*
 * A long block's record as it will be sent: `head`, then the record and its ips
 * that follow it (struct scratch: rec, ips, then the walker's state).
 */
struct offcpu_thread {
	struct ember_offcpu_head head;
	struct scratch s;
	__u64 work; /* room for offcpu_entry.tw: never read or written through this type */
};

/*
 * The kernel's handle of a task work a program schedules (6.18+); the verifier knows it
 * by this name in a map value. 8 opaque bytes.
 */
struct bpf_task_work {
	__u64 __opaque;
} __attribute__((aligned(8)));

/*
 * As the kernel's bpf_task_work_callback_t: libbpf resolves the kfunc only if its types
 * match, and a forward declaration does not match the kernel's struct.
 */
struct bpf_map {
	int unused;
};
typedef int (*offcpu_work_fn)(struct bpf_map *map, void *key, void *value);
extern int bpf_task_work_schedule_resume_impl(struct task_struct *task, struct bpf_task_work *tw, void *map__map,
					      offcpu_work_fn callback, void *aux__prog) __weak __ksym;
extern void bpf_preempt_disable(void) __weak __ksym;
extern void bpf_preempt_enable(void) __weak __ksym;

/*
 * An entry of `offcpu_threads`: an offcpu_thread whose last word is the task work that
 * walks it. A per-CPU map may not hold a task work, so the scratch is an offcpu_thread
 * and is copied in whole (the kernel skips the task work's bytes on update).
 */
struct offcpu_entry {
	struct ember_offcpu_head head;
	struct scratch s;
	struct bpf_task_work tw;
};
_Static_assert(sizeof(struct offcpu_entry) == sizeof(struct offcpu_thread), "offcpu_entry mirrors offcpu_thread");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 8192); /* resized from the config before load */
	__type(key, __u32);
	__type(value, struct offcpu_entry);
} offcpu_threads SEC(".maps");

/*
 * Built here, then copied into `offcpu_threads` or sent (its own: the sampler's NMI may
 * interrupt). Key 0: programs that run with interrupts off (sched_switch, sched_waking);
 * key 1: kernel lock contention, which a wakeup in an interrupt may interrupt.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct offcpu_thread);
} offcpu_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20); /* resized from the config before load */
} offcpu_samples SEC(".maps");

/*
 * Records counted in the kernel, by key (see struct ember_offcpu_head): a host's blocks
 * repeat a few stacks, and each one sent whole cost the agent microseconds to read and
 * count. Not preallocated: an entry the agent deletes while a program adds to it is
 * freed after that program, and the add is lost, never made to another key.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 8192); /* resized from the config before load */
	__type(key, __u64);
	__type(value, struct ember_offcpu_sum);
} offcpu_sums SEC(".maps");

/* All off-CPU counters in one per-CPU entry: the agent reads them with one syscall a second. */
struct offcpu_counts {
	__u64 c[EMBER_OFFCPU_CNT_MAX];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct offcpu_counts);
} offcpu_counters SEC(".maps");

static __always_inline void offcpu_count(__u32 which)
{
	__u32 zero = 0;
	struct offcpu_counts *v = bpf_map_lookup_elem(&offcpu_counters, &zero);

	if (v && which < EMBER_OFFCPU_CNT_MAX)
		v->c[which] += 1;
}

/*
 * Block lengths are on the scheduler's clock (sched_clock), which __schedule has just read
 * into its run queue: at sched_switch, "now" is a few loads, where bpf_ktime_get_ns cost
 * 44 ns of the switch program's 200 here. The run queue is reached from `prev` (its
 * cfs_rq's, this CPU's): a typed `runqueues` ksym needs data symbols in kallsyms, which
 * kernels without CONFIG_KALLSYMS_ALL (this one) lack. Record times stay on ktime (the
 * agent's clock): each CPU keeps ktime minus the scheduler's clock, read again every 10 ms
 * at a switch.
 */
struct rq___offcpu {
	__u64 clock;
} __attribute__((preserve_access_index));

struct cfs_rq___offcpu {
	struct rq___offcpu *rq;
} __attribute__((preserve_access_index));

struct sched_entity___offcpu {
	struct cfs_rq___offcpu *cfs_rq;
} __attribute__((preserve_access_index));

/* se.cfs_rq is set for every task, of any class, when it is put on a CPU (group scheduling). */
struct task_struct___clock {
	struct sched_entity___offcpu se;
} __attribute__((preserve_access_index));

#define OFFCPU_CLOCK_EVERY_NS 10000000ULL

struct offcpu_clock {
	__u64 off; /* ktime - the scheduler's clock on this CPU */
	__u64 at;  /* when it was read, on the scheduler's clock; 0: not yet */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct offcpu_clock);
} offcpu_clocks SEC(".maps");

/* Now on the scheduler's clock, in sched_switch (ktime on kernels without group scheduling). */
static __always_inline __u64 offcpu_switch_now(struct task_struct *prev)
{
	struct task_struct___clock *t = (void *)prev;
	struct rq___offcpu *rq;
	struct offcpu_clock *c;
	__u32 zero = 0;
	__u64 now;

	if (!bpf_core_field_exists(t->se.cfs_rq))
		return bpf_ktime_get_ns();
	rq = t->se.cfs_rq ? t->se.cfs_rq->rq : 0;
	if (!rq)
		return bpf_ktime_get_ns();
	now = rq->clock;
	c = bpf_map_lookup_elem(&offcpu_clocks, &zero);
	if (c && (!c->at || now - c->at > OFFCPU_CLOCK_EVERY_NS)) {
		c->off = bpf_ktime_get_ns() - now;
		c->at = now;
	}
	return now;
}

/* This CPU's clock entry, once a switch has set it; 0 before. */
static __always_inline struct offcpu_clock *offcpu_clock(void)
{
	__u32 zero = 0;
	struct offcpu_clock *c = bpf_map_lookup_elem(&offcpu_clocks, &zero);

	return c && c->at ? c : 0;
}

/* A time on the scheduler's clock as ktime, for a record (exact to this CPU's drift since its last read). */
static __always_inline __u64 offcpu_ktime(__u64 sched_ns)
{
	struct offcpu_clock *c = offcpu_clock();

	return c ? sched_ns + c->off : bpf_ktime_get_ns();
}

/* Why `prev` leaves the CPU; -1 for a thread that exits (nothing to keep). */
static __always_inline int offcpu_state(_Bool preempt, struct task_struct___offcpu *prev)
{
	unsigned int st = prev->__state;

	if (st & EMBER_TASK_DEAD)
		return -1;
	/* Preempted (or a sleep cut short by a signal): still on the run queue. */
	if (preempt || st == EMBER_TASK_RUNNING)
		return EMBER_OFFCPU_RUNNABLE;
	/* D state that counts in the load average: I/O, page faults, most kernel locks. */
	if ((st & EMBER_TASK_UNINTERRUPTIBLE) && !(st & EMBER_TASK_NOLOAD))
		return EMBER_OFFCPU_DISK;
	return EMBER_OFFCPU_SLEEP;
}

/*
 * The syscall `task` runs, or -1: its saved user registers say -ENOSYS in ax and a
 * syscall number in orig_ax from the entry until the syscall returns. A page fault
 * whose user ax happens to hold -38 passes for one (its record then waits for the
 * next syscall's exit, and takes that stack).
 */
static __always_inline int offcpu_syscall(struct task_struct *task)
{
	struct pt_regs___offcpu *r = (void *)bpf_task_pt_regs(task);

	if (!r || r->ax != EMBER_ENOSYS_AX || r->orig_ax >= EMBER_MAX_SYSCALL)
		return -1;
	return r->orig_ax;
}

/* Marks what a task's record holds, keeping the count of entries waiting for an exit. */
static __always_inline void offcpu_set_held(struct offcpu_task *r, __u8 held)
{
	if (r->held == HELD_EXIT)
		__sync_fetch_and_add(&ember_offcpu_exits, -1);
	if (held == HELD_EXIT)
		__sync_fetch_and_add(&ember_offcpu_exits, 1);
	r->held = held;
}

/* Lets go of what a task's record holds in `offcpu_threads`. */
static __always_inline void offcpu_release(struct offcpu_task *r, __u32 tid)
{
	if (r->held == HELD_NONE)
		return;
	offcpu_set_held(r, HELD_NONE);
	if (!bpf_map_delete_elem(&offcpu_threads, &tid))
		__sync_fetch_and_add(&ember_offcpu_live, -1);
}

#endif /* EMBER_OFFCPU_TASK_BPF_H */
