// SPDX-License-Identifier: GPL-2.0
/*
 * ember's off-CPU profiler: where threads wait, how long, and why.
 *
 * Included at the end of ember.bpf.c, so it is part of the sampler's object:
 * it walks user stacks with the same unwind tables and the same walker
 * (walk_frame), and sends what the walker asks for (ranges of a process) through
 * the same record flags. Loaded only with `offcpu.enabled`.
 *
 * A switch-out cannot know how long the thread will be away, so it takes no
 * stack: tp_btf/sched_switch writes the time, the state and whether the thread
 * blocked inside a syscall into the thread's own record (`offcpu_tasks`, task
 * storage). When the thread runs again (it is `next` of a switch, on any CPU),
 * a block under min_block costs nothing more. A longer one is taken by where the
 * thread was:
 * - a user thread on a kernel with BPF task works (6.18+): its kernel stack now,
 *   from the sleeping task (bpf_get_task_stack), into `offcpu_threads`, and a task
 *   work scheduled on it that walks its user stack in the thread as it returns to
 *   user mode, whose user registers and stack are still those it blocked with. There
 *   the thread's memory is the current one, so the table walker and the interpreter
 *   walk run as in a CPU sample. No program runs per switch or per syscall for it.
 * - older kernels, inside a syscall (futex, epoll, read, nanosleep: most off-CPU
 *   time) or any block of a thread with rseq: the same, but the user stack is walked
 *   by tp_btf/rseq_update (once per switch of such a thread) or at the syscall's
 *   exit (tp_btf/sys_exit, every syscall).
 * - a kernel thread: its kernel stack now, sent at once (it has no user side).
 * - anywhere else (a page fault's I/O, preemption in user mode), no hook runs in
 *   the thread before it is back in user mode: the fallback walks both stacks at
 *   switch-out, as before, for a fraction of such switch-outs (fallback_threshold;
 *   their times are scaled by its inverse), and holds them in `offcpu_threads`
 *   until the thread runs again.
 * tp_btf/sched_waking stamps the wakeup of a sleeping thread, so the time from
 * its wakeup to running is reported as `runnable` (waiting for a CPU) apart
 * from its sleep.
 *
 * Per-task records are task storage, not a hash keyed by tid: the sys_exit
 * program runs at every syscall of the host, and finding the record is a pointer
 * chase from the task (no hashing, no bucket lock); a record is freed with its
 * task even where the final switch-out was missed, so none can leak. The number
 * of records is capped (max_tasks, counted in ember_offcpu_tasks), and a
 * thread's final switch-out (TASK_DEAD) deletes its record and anything it held.
 *
 * Every record ends in offcpu_send, which counts it in the kernel (`offcpu_sums`)
 * when a record of the same key went out since the agent last drained the sums: the
 * agent reads a record per distinct stack a second, not one per block. A waker's
 * key is left in its wakee's record, and the block's key includes it.
 */

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

/*
 * The current task's user stack, walked into s after its kbytes of kernel ips: the
 * table walker when its process is loaded (with its interpreter frames), else frame
 * pointers (no interpreter frames: rec.py_result stays EMBER_PY_NONE). Returns the
 * user bytes; an interpreter tail, if any, is written after them (interp_finish).
 */
static __always_inline long offcpu_user_stack(void *ctx, struct task_struct *task, struct scratch *s,
					      long kbytes, int cached)
{
	__u32 pid = s->rec.pid, one = 1;
	struct ember_pt_regs *u;
	struct walk_ctx c;
	long ubytes;

	if (ember_cfg.unwind_mode != EMBER_MODE_FRAME_POINTER && ember_cfg.task_regs) {
		c.proc = bpf_map_lookup_elem(&unwind_procs, &pid);
		if (!c.proc) {
			ask(s, EMBER_REC_UNKNOWN_PROCESS);
		} else {
			struct walk *w = &s->w;

			u = (struct ember_pt_regs *)bpf_task_pt_regs(task);
			if (u && !bpf_probe_read_kernel(&w->ip, 8, &u->ip) &&
			    !bpf_probe_read_kernel(&w->sp, 8, &u->sp) &&
			    !bpf_probe_read_kernel(&w->bp, 8, &u->bp)) {
				__u32 k = kbytes / sizeof(__u64), n;

				w->kframes = k;
				w->uframes = 0;
				w->running = 1;
				w->result = EMBER_UNWIND_COMPLETE;
				w->bp_lost = 0;
				w->exact = 1;
				w->looked = 0;
				interp_reset(w);
				c.s = s;
				/*
				 * Walks that may interrupt one another on a CPU (a waker's, from an
				 * interrupt, over an rseq walk) must not share a row cache: a waker
				 * searches every row (wakers are walked only for long blocks).
				 */
				c.cache = cached ? bpf_map_lookup_elem(&row_cache, &one) : 0;
				/* The walk runs in the thread (or as it leaves the CPU): its TLS is current. */
				interp_begin(&c, pid, 1);
				/*
				 * No tail calls from here: one loop takes the whole stack. A task
				 * work (no ctx) may not call the global walk_frame.
				 */
				walk_frames(&c, EMBER_MAX_FRAMES);
				if (w->running)
					w->result = EMBER_UNWIND_TRUNCATED;
				s->rec.user_result = w->result;
				n = w->uframes > EMBER_MAX_FRAMES ? EMBER_MAX_FRAMES : w->uframes;
				if (k > EMBER_MAX_FRAMES)
					k = EMBER_MAX_FRAMES;
				interp_finish(s, k, n);
				return n * sizeof(__u64);
			}
		}
	}
	/* A task work has no context: the task's own user registers, as bpf_get_stack takes them. */
	if (ctx)
		ubytes = bpf_get_stack(ctx, (void *)s->ips + kbytes, STACK_BYTES, BPF_F_USER_STACK);
	else
		ubytes = bpf_get_task_stack(task, (void *)s->ips + kbytes, STACK_BYTES, BPF_F_USER_STACK);
	if (ubytes < 0)
		ubytes = 0; /* kernel threads have none */
	if (ubytes > STACK_BYTES)
		ubytes = STACK_BYTES;
	return ubytes & ~7L;
}

/* Fills the record's fields that name the current task. */
static __always_inline void offcpu_current(struct scratch *s)
{
	__u64 cgroup_id = bpf_get_current_cgroup_id(), id = bpf_get_current_pid_tgid();

	s->rec.cgroup_id = cgroup_id;
	s->rec.pid = id >> 32;
	s->rec.tid = (__u32)id;
	s->rec.cpu = bpf_get_smp_processor_id();
	s->rec.user_result = EMBER_UNWIND_FRAME_POINTER;
	s->rec.user_flags = 0;
	s->rec.py_result = EMBER_PY_NONE;
	bpf_get_current_comm(s->rec.comm, sizeof(s->rec.comm));
}

/* One word into a record's key (a multiply-xorshift: keys are compared whole, never ordered). */
static __always_inline __u64 offcpu_mix(__u64 h, __u64 v)
{
	h = (h ^ v) * 0x9e3779b97f4a7c15ULL;
	return h ^ (h >> 31);
}

struct offcpu_hash {
	struct offcpu_thread *t;
	__u64 h;
	__u32 n; /* ips words to take: kernel, user, then the interpreter tail */
};

/* bpf_loop callback: one ips word into the key (i taken whole: its bounds check is the one the index uses). */
static long offcpu_hash_word(__u64 i, void *arg)
{
	struct offcpu_hash *c = arg;

	if (i >= c->n || i >= 2 * EMBER_MAX_FRAMES + PY_TAIL_WORDS)
		return 1;
	c->h = offcpu_mix(c->h, c->t->s.ips[i]);
	return 0;
}

/* The record's key: everything the agent counts it by (struct ember_offcpu_head). */
static __always_inline __u64 offcpu_key(struct offcpu_thread *t, __u32 words)
{
	struct ember_record *rec = &t->s.rec;
	struct offcpu_hash c = { .t = t, .n = words };
	__u64 comm[2];

	__builtin_memcpy(comm, rec->comm, sizeof(comm));
	c.h = offcpu_mix(0x5ca1ab1e, (__u64)t->head.kind | (__u64)t->head.state << 8 | (__u64)t->head.path << 16 |
					   (__u64)(__u32)t->head.syscall << 32);
	c.h = offcpu_mix(c.h, t->head.waker_key);
	c.h = offcpu_mix(c.h, rec->cgroup_id);
	c.h = offcpu_mix(c.h, (__u64)rec->pid << 32 | rec->tid);
	c.h = offcpu_mix(c.h, comm[0]);
	c.h = offcpu_mix(c.h, comm[1]);
	c.h = offcpu_mix(c.h, (__u64)rec->kern_frames | (__u64)rec->user_frames << 16 | (__u64)rec->user_result << 32 |
				      (__u64)rec->user_flags << 40 | (__u64)rec->py_result << 48);
	bpf_loop(2 * EMBER_MAX_FRAMES + PY_TAIL_WORDS, offcpu_hash_word, &c, 0);
	/* 0 says "no key" (a block without a waker). */
	return c.h ? c.h : 1;
}

/*
 * A record done: added to its key's sums if that key's record went out since the agent
 * last drained them, else sent whole (head, record, k + u ips and the interpreter tail
 * if any) and its key entered. A record that asks the agent for something is always
 * sent. Returns the key, or 0 if the record was lost.
 */
static __always_inline __u64 offcpu_send(struct offcpu_thread *t)
{
	__u32 k = t->s.rec.kern_frames, u = t->s.rec.user_frames;
	__u64 size, key, tail = t->s.rec.py_result != EMBER_PY_NONE ? sizeof(struct ember_py_tail) : 0;
	struct ember_offcpu_sum fresh = {}, *sum;
	long err;

	if (k > EMBER_MAX_FRAMES)
		k = EMBER_MAX_FRAMES;
	if (u > EMBER_MAX_FRAMES)
		u = EMBER_MAX_FRAMES;
	key = offcpu_key(t, k + u + tail / sizeof(__u64));
	t->head.key = key;
	if (!t->s.rec.user_flags) {
		sum = bpf_map_lookup_elem(&offcpu_sums, &key);
		if (sum) {
			/* A waker's entry only says its record went out: its blocks carry the times. */
			if (t->head.kind != EMBER_OFFCPU_WAKER) {
				__sync_fetch_and_add(&sum->off_ns, t->head.off_ns);
				__sync_fetch_and_add(&sum->runnable_ns, t->head.runnable_ns);
				__sync_fetch_and_add(&sum->count, 1);
				if (t->head.runnable_ns)
					__sync_fetch_and_add(&sum->runnable, 1);
			}
			offcpu_count(EMBER_OFFCPU_CNT_SUMMED);
			return key;
		}
	}
	size = sizeof(struct ember_offcpu_head) + sizeof(struct ember_record) + (k + u) * sizeof(__u64) + tail;
	/* Asks wait for the next drain (a second at most): they serve its later blocks, not this one. */
	if (bpf_ringbuf_output(&offcpu_samples, &t->head, size,
			       bpf_ringbuf_query(&offcpu_samples, BPF_RB_AVAIL_DATA) >=
						       ember_cfg.wakeup_bytes ?
				       BPF_RB_FORCE_WAKEUP :
				       BPF_RB_NO_WAKEUP)) {
		offcpu_count(EMBER_OFFCPU_CNT_LOST_RINGBUF);
		return 0;
	}
	offcpu_count(EMBER_OFFCPU_CNT_SENT);
	/* After the record: an entry means the agent has its record (or will, ring first). */
	err = bpf_map_update_elem(&offcpu_sums, &key, &fresh, BPF_NOEXIST);
	if (err && err != -EMBER_EEXIST)
		offcpu_count(EMBER_OFFCPU_CNT_SUMS_FULL);
	return key;
}

/* Puts t under tid in `offcpu_threads`; 0 if there was no room. */
static __always_inline int offcpu_hold(__u32 tid, struct offcpu_thread *t)
{
	if (!bpf_map_update_elem(&offcpu_threads, &tid, t, BPF_NOEXIST)) {
		__sync_fetch_and_add(&ember_offcpu_live, 1);
		return 1;
	}
	/* An entry left by a switch-in this program missed (attached mid-switch): replace it. */
	if (!bpf_map_update_elem(&offcpu_threads, &tid, t, BPF_EXIST))
		return 1;
	offcpu_count(EMBER_OFFCPU_CNT_MAP_FULL);
	return 0;
}

/* The fallback: `prev`'s stacks now, held until it runs again. */
static __always_inline void offcpu_walk_out(void *ctx, struct task_struct *prev, struct offcpu_task *r,
					    __u32 tid, __u64 now)
{
	struct offcpu_thread *t;
	struct scratch *s;
	long kbytes, ubytes;
	__u32 zero = 0;

	t = bpf_map_lookup_elem(&offcpu_scratch, &zero);
	if (!t) {
		offcpu_count(EMBER_OFFCPU_CNT_NO_SCRATCH);
		return;
	}
	offcpu_count(EMBER_OFFCPU_CNT_TAKEN);
	s = &t->s;
	s->rec.time_ns = offcpu_ktime(now);
	offcpu_current(s);
	kbytes = bpf_get_stack(ctx, s->ips, STACK_BYTES, 0);
	if (kbytes < 0)
		kbytes = 0;
	if (kbytes > STACK_BYTES)
		kbytes = STACK_BYTES;
	kbytes &= ~7L;
	s->rec.kern_frames = kbytes / sizeof(__u64);
	ubytes = s->rec.pid && !kernel_thread(prev) ? offcpu_user_stack(ctx, prev, s, kbytes, 1) : 0;
	s->rec.user_frames = ubytes / sizeof(__u64);
	if (!ubytes)
		s->rec.py_result = EMBER_PY_NONE;
	if (offcpu_hold(tid, t))
		offcpu_set_held(r, HELD_SWITCH);
}

/* The current task's record, made if it has none and the cap allows; 0 if it cannot have one. */
static __always_inline struct offcpu_task *offcpu_record(struct task_struct *task)
{
	struct offcpu_task *r = bpf_task_storage_get(&offcpu_tasks, task, 0, 0);

	if (r)
		return r;
	if (ember_offcpu_tasks >= ember_offcpu_cfg.max_tasks) {
		offcpu_count(EMBER_OFFCPU_CNT_TASK_FULL);
		return 0;
	}
	r = bpf_task_storage_get(&offcpu_tasks, task, 0, EMBER_STORAGE_CREATE);
	if (!r) {
		offcpu_count(EMBER_OFFCPU_CNT_TASK_FULL);
		return 0;
	}
	__sync_fetch_and_add(&ember_offcpu_tasks, 1);
	return r;
}

/* A thread's final switch-out: its record and what it holds go. */
static __always_inline void offcpu_dead(struct task_struct *prev, __u32 tid)
{
	struct offcpu_task *r = bpf_task_storage_get(&offcpu_tasks, prev, 0, 0);

	if (!r)
		return;
	if (r->held == HELD_EXIT)
		offcpu_count(EMBER_OFFCPU_CNT_EXITED);
	offcpu_release(r, tid);
	if (!bpf_task_storage_delete(&offcpu_tasks, prev))
		__sync_fetch_and_add(&ember_offcpu_tasks, -1);
}

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
	offcpu_current(&t->s);
	kbytes = t->s.rec.kern_frames;
	if (kbytes > EMBER_MAX_FRAMES)
		kbytes = EMBER_MAX_FRAMES;
	kbytes *= sizeof(__u64);
	/* The walker's clock (asks, table stamps) is now; the record keeps the block's start. */
	start = t->s.rec.time_ns;
	t->s.rec.time_ns = bpf_ktime_get_ns();
	ubytes = offcpu_user_stack(ctx, task, &t->s, kbytes, !!ctx);
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
	offcpu_current(s);
	kbytes = bpf_get_stack(ctx, s->ips, STACK_BYTES, 0);
	if (kbytes < 0)
		kbytes = 0;
	if (kbytes > STACK_BYTES)
		kbytes = STACK_BYTES;
	kbytes &= ~7L;
	s->rec.kern_frames = kbytes / sizeof(__u64);
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
		__builtin_memset(s->rec.comm, 0, sizeof(s->rec.comm));
		__builtin_memcpy(s->rec.comm, "[interrupt]", sizeof("[interrupt]"));
	}
	ubytes = s->rec.pid && !kernel_thread(cur) ? offcpu_user_stack(ctx, cur, s, kbytes, 0) : 0;
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
	offcpu_current(s);
	kbytes = bpf_get_stack(ctx, s->ips, STACK_BYTES, 0);
	if (kbytes < 0)
		kbytes = 0;
	if (kbytes > STACK_BYTES)
		kbytes = STACK_BYTES;
	kbytes &= ~7L;
	s->rec.kern_frames = kbytes / sizeof(__u64);
	ubytes = s->rec.pid && !kernel_thread(cur) ? offcpu_user_stack(ctx, cur, s, kbytes, 0) : 0;
	s->rec.user_frames = ubytes / sizeof(__u64);
	if (!ubytes)
		s->rec.py_result = EMBER_PY_NONE;
	offcpu_send(t);
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
