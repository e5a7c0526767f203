// SPDX-License-Identifier: GPL-2.0
/*
 * ember's off-CPU profiler: where threads wait, how long, and why.
 *
 * Included at the end of ember.bpf.c, so it is part of the sampler's object:
 * it walks user stacks with the same unwind tables and the same walker
 * (walk_step), and sends what the walker asks for (ranges of a process) through
 * the same record flags. Loaded only with `offcpu.enabled`.
 *
 * tp_btf/sched_switch (no kprobes here) sees both tasks of a switch:
 * - `prev` (the current task) is switched out: its kernel stack
 *   (bpf_get_stack), its user stack (the table walker from its saved user
 *   registers, bpf_task_pt_regs) and its state are kept in `offcpu_threads`,
 *   keyed by thread id. One map for all CPUs: a thread that wakes up on another
 *   CPU finds its entry (per-CPU storage would miss it or pair it with an older
 *   switch-out and inflate the time).
 * - `next` runs again: its entry (if any) becomes one record on
 *   `offcpu_samples` with the time it was off CPU, then is deleted.
 * tp_btf/sched_wakeup stamps the wakeup of a sleeping thread, so the time from
 * its wakeup to running is reported as `runnable` (waiting for a CPU) apart
 * from its sleep.
 *
 * A thread's final switch-out (TASK_DEAD) keeps nothing, so exited threads
 * never hold an entry; the map's size is the cap on threads off CPU with a
 * stack held, and a full map is counted.
 */

/* The kernel's task states (include/linux/sched.h), stable since 4.14. */
#define EMBER_TASK_RUNNING 0x0
#define EMBER_TASK_UNINTERRUPTIBLE 0x2
#define EMBER_TASK_DEAD 0x80
#define EMBER_TASK_NOLOAD 0x400

#ifndef BPF_EXIST
#define BPF_EXIST 2
#endif

const volatile struct ember_offcpu_config ember_offcpu_cfg = {};

/* Never written: present so the skeleton carries the Rust types. */
struct ember_offcpu_head ember_offcpu_head_layout = {};
enum ember_offcpu_counter ember_offcpu_counter_layout = EMBER_OFFCPU_CNT_MAX;
enum ember_offcpu_state ember_offcpu_state_layout = EMBER_OFFCPU_SLEEP;

/* Threads off CPU with their stacks held right now (entries of `offcpu_threads`). */
__u64 ember_offcpu_live = 0;

/* The fields read of a task, as a CO-RE flavor of the kernel's task_struct. */
struct task_struct___offcpu {
	int pid;
	unsigned int __state;
} __attribute__((preserve_access_index));

/*
 * A switched-out thread: when and in what state, then the record as it will be
 * sent: `head` is filled when the thread runs again and sent with the record
 * and its ips that follow it (struct scratch: rec, ips, then the walker's state).
 */
struct offcpu_thread {
	__u64 start_ns;
	__u64 wake_ns; /* first wakeup since start_ns, 0 if none yet */
	__u32 state;   /* enum ember_offcpu_state */
	__u32 pad;
	struct ember_offcpu_head head;
	struct scratch s;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 8192); /* resized from the config before load */
	__type(key, __u32);
	__type(value, struct offcpu_thread);
} offcpu_threads SEC(".maps");

/* Built here, then copied into `offcpu_threads` (its own: the sampler's NMI may interrupt). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct offcpu_thread);
} offcpu_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20); /* resized from the config before load */
} offcpu_samples SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EMBER_OFFCPU_CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} offcpu_counters SEC(".maps");

static __always_inline void offcpu_count(__u32 which)
{
	__u64 *v = bpf_map_lookup_elem(&offcpu_counters, &which);

	if (v)
		*v += 1;
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

/* prev's user stack: the table walker when its process is loaded, else frame pointers. */
static __always_inline long offcpu_user_stack(void *ctx, struct task_struct *prev, struct scratch *s,
					      long kbytes)
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

			u = (struct ember_pt_regs *)bpf_task_pt_regs(prev);
			if (u && !bpf_probe_read_kernel(&w->ip, 8, &u->ip) &&
			    !bpf_probe_read_kernel(&w->sp, 8, &u->sp) &&
			    !bpf_probe_read_kernel(&w->bp, 8, &u->bp)) {
				w->kframes = kbytes / sizeof(__u64);
				w->uframes = 0;
				w->running = 1;
				w->result = EMBER_UNWIND_COMPLETE;
				w->bp_lost = 0;
				w->exact = 1;
				w->looked = 0;
				interp_reset(w);
				c.s = s;
				c.cache = bpf_map_lookup_elem(&row_cache, &one);
				/* Interpreter frames off CPU: not yet (their tail is not kept per thread). */
				c.py = 0;
				c.buf_key = 1;
				/* No tail calls from here: one bpf_loop takes the whole stack. */
				bpf_loop(EMBER_MAX_FRAMES, walk_step, &c, 0);
				if (w->running)
					w->result = EMBER_UNWIND_TRUNCATED;
				s->rec.user_result = w->result;
				return w->uframes > EMBER_MAX_FRAMES ? STACK_BYTES : w->uframes * sizeof(__u64);
			}
		}
	}
	ubytes = bpf_get_stack(ctx, (void *)s->ips + kbytes, STACK_BYTES, BPF_F_USER_STACK);
	if (ubytes < 0)
		ubytes = 0; /* kernel threads have none */
	if (ubytes > STACK_BYTES)
		ubytes = STACK_BYTES;
	return ubytes & ~7L;
}

/* `prev` leaves the CPU: keep its stacks, state and time. */
static __always_inline void offcpu_out(void *ctx, _Bool preempt, struct task_struct *prev, __u64 now)
{
	struct task_struct___offcpu *p = (void *)prev;
	__u64 id = bpf_get_current_pid_tgid(), cgroup_id;
	__u32 pid = id >> 32, tid = (__u32)id, zero = 0;
	struct offcpu_thread *t;
	struct scratch *s;
	long kbytes, ubytes, err;
	int state;

	if (tid == 0) /* the idle task */
		return;
	state = offcpu_state(preempt, p);
	if (state < 0)
		return;
	if (ember_cfg.filter_pids && !bpf_map_lookup_elem(&pid_filter, &pid)) {
		offcpu_count(EMBER_OFFCPU_CNT_FILTERED);
		return;
	}
	cgroup_id = bpf_get_current_cgroup_id();
	if (bpf_map_lookup_elem(&pid_deny, &pid) || bpf_map_lookup_elem(&cgroup_deny, &cgroup_id)) {
		offcpu_count(EMBER_OFFCPU_CNT_FILTERED);
		return;
	}
	offcpu_count(EMBER_OFFCPU_CNT_SWITCHES);
	if (ember_offcpu_cfg.sample_threshold <= 0xffffffffULL &&
	    (__u64)bpf_get_prandom_u32() >= ember_offcpu_cfg.sample_threshold)
		return;
	t = bpf_map_lookup_elem(&offcpu_scratch, &zero);
	if (!t) {
		offcpu_count(EMBER_OFFCPU_CNT_NO_SCRATCH);
		return;
	}
	offcpu_count(EMBER_OFFCPU_CNT_TAKEN);
	t->start_ns = now;
	t->wake_ns = 0;
	t->state = state;
	s = &t->s;
	s->rec.time_ns = now;
	s->rec.cgroup_id = cgroup_id;
	s->rec.pid = pid;
	s->rec.tid = tid;
	s->rec.cpu = bpf_get_smp_processor_id();
	s->rec.user_result = EMBER_UNWIND_FRAME_POINTER;
	s->rec.user_flags = 0;
	s->rec.py_result = EMBER_PY_NONE;
	bpf_get_current_comm(s->rec.comm, sizeof(s->rec.comm));

	kbytes = bpf_get_stack(ctx, s->ips, STACK_BYTES, 0);
	if (kbytes < 0)
		kbytes = 0;
	if (kbytes > STACK_BYTES)
		kbytes = STACK_BYTES;
	kbytes &= ~7L;
	s->rec.kern_frames = kbytes / sizeof(__u64);
	ubytes = pid && !kernel_thread(prev) ? offcpu_user_stack(ctx, prev, s, kbytes) : 0;
	s->rec.user_frames = ubytes / sizeof(__u64);

	err = bpf_map_update_elem(&offcpu_threads, &tid, t, BPF_NOEXIST);
	if (!err) {
		__sync_fetch_and_add(&ember_offcpu_live, 1);
		return;
	}
	/* An entry left by a switch-in this program missed (attached mid-switch): replace it. */
	if (bpf_map_update_elem(&offcpu_threads, &tid, t, BPF_EXIST))
		offcpu_count(EMBER_OFFCPU_CNT_MAP_FULL);
}

/* `next` runs again: report the time it was off CPU, from its switch-out. */
static __always_inline void offcpu_in(struct task_struct *next, __u64 now)
{
	struct task_struct___offcpu *n = (void *)next;
	__u32 tid = n->pid;
	struct offcpu_thread *t;
	__u64 total, size;
	__u32 k, u;

	if (!tid)
		return;
	t = bpf_map_lookup_elem(&offcpu_threads, &tid);
	if (!t)
		return;
	total = now - t->start_ns;
	if ((__s64)total < 0 || total < ember_offcpu_cfg.min_block_ns) {
		offcpu_count(EMBER_OFFCPU_CNT_SHORT);
		goto done;
	}
	t->head.state = t->state;
	t->head.pad = 0;
	if (t->state != EMBER_OFFCPU_RUNNABLE && t->wake_ns > t->start_ns && t->wake_ns <= now) {
		t->head.off_ns = t->wake_ns - t->start_ns;
		t->head.runnable_ns = now - t->wake_ns;
	} else {
		t->head.off_ns = total;
		t->head.runnable_ns = 0;
	}
	k = t->s.rec.kern_frames;
	u = t->s.rec.user_frames;
	if (k > EMBER_MAX_FRAMES)
		k = EMBER_MAX_FRAMES;
	if (u > EMBER_MAX_FRAMES)
		u = EMBER_MAX_FRAMES;
	size = sizeof(struct ember_offcpu_head) + sizeof(struct ember_record) + (k + u) * sizeof(__u64);
	if (bpf_ringbuf_output(&offcpu_samples, &t->head, size,
			       t->s.rec.user_flags ||
					       bpf_ringbuf_query(&offcpu_samples, BPF_RB_AVAIL_DATA) >=
						       ember_cfg.wakeup_bytes ?
				       BPF_RB_FORCE_WAKEUP :
				       BPF_RB_NO_WAKEUP))
		offcpu_count(EMBER_OFFCPU_CNT_LOST_RINGBUF);
	else
		offcpu_count(EMBER_OFFCPU_CNT_SENT);
done:
	if (!bpf_map_delete_elem(&offcpu_threads, &tid))
		__sync_fetch_and_add(&ember_offcpu_live, -1);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(ember_offcpu_switch, _Bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u64 now = bpf_ktime_get_ns();

	offcpu_out(ctx, preempt, prev, now);
	offcpu_in(next, now);
	return 0;
}

/* A sleeping thread is woken: from now on it waits for a CPU (runnable). */
SEC("tp_btf/sched_wakeup")
int BPF_PROG(ember_offcpu_wakeup, struct task_struct *p)
{
	struct task_struct___offcpu *q = (void *)p;
	__u32 tid = q->pid;
	struct offcpu_thread *t = bpf_map_lookup_elem(&offcpu_threads, &tid);

	if (t && !t->wake_ns)
		t->wake_ns = bpf_ktime_get_ns();
	return 0;
}
