/* SPDX-License-Identifier: GPL-2.0 */
/*
 * A process's executable ranges and their tables: the maps the agent fills, the asks
 * by which a record wants a process read, the range of a pc, and the ranges the exec
 * hook and the walker add from the task's memory map.
 */
#ifndef EMBER_RANGES_BPF_H
#define EMBER_RANGES_BPF_H

#include "filter.bpf.h"

/*
 * Unwind tables, one inner array per object (see struct ember_unwind_header);
 * the agent creates each at its exact size, fills it through mmap and puts it
 * in a slot. Kernel memory for them counts against the agent's cgroup.
 */
struct unwind_table_map {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_INNER_MAP | BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	/*
	 * Sizes, not BTF types, as the agent's tables have none: before 6.2 the kernel
	 * compares an inner map's BTF-derived fields with the template's, and refused every
	 * table (EINVAL) while the template had BTF (Debian's 6.1 in the kernel matrix).
	 */
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(struct ember_unwind_chunk));
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, EMBER_UNWIND_TABLES);
	__type(key, __u32);
	__array(values, struct unwind_table_map);
} unwind_tables SEC(".maps");

/* Per process (tgid): its executable ranges and their tables. No prealloc: costs what is used. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096); /* resized from the config before load */
	__type(key, __u32);
	__type(value, struct ember_unwind_proc);
} unwind_procs SEC(".maps");

/* Per table slot: time_ns of the last sample that used it (the agent evicts the least recent). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, EMBER_UNWIND_TABLES);
	__type(key, __u32);
	__type(value, __u64);
} unwind_used SEC(".maps");

/* Files whose tables are loaded, by the kernel's (dev, inode): see struct ember_unwind_file. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, EMBER_UNWIND_FILES);
	__type(key, struct ember_unwind_file_key);
	__type(value, struct ember_unwind_file);
} unwind_files SEC(".maps");

/* A process's ranges being built by the exec hook (too big for the BPF stack). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ember_unwind_proc);
} proc_scratch SEC(".maps");

extern int bpf_iter_task_vma_new(struct bpf_iter_task_vma *it, struct task_struct *task,
				 __u64 addr) __weak __ksym;
extern struct vm_area_struct *bpf_iter_task_vma_next(struct bpf_iter_task_vma *it) __weak __ksym;
extern void bpf_iter_task_vma_destroy(struct bpf_iter_task_vma *it) __weak __ksym;

/* When a pid last asked the agent for its ranges, and how long until it may ask again. */
struct ask_state {
	__u64 at;
	__u64 gap;
};

/*
 * Per pid: the first ask goes out at once, the next after a second, then after twice the
 * last gap, up to a minute: a process whose miss no read fixes (code in memfd or
 * anonymous memory, an unreadable binary) asked every second for as long as it ran, and
 * each ask is a whole record and a read for the agent. An exec starts the pid afresh.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct ask_state);
} unwind_asked SEC(".maps");

#define ASK_EVERY_NS 1000000000ULL
#define ASK_MAX_NS (64 * ASK_EVERY_NS)

/* Sets `flag` in the record unless this pid's last ask was less than its gap ago. */
static __always_inline void ask(struct scratch *s, __u8 flag)
{
	__u32 pid = s->rec.pid;
	__u64 now = s->rec.time_ns;
	struct ask_state *last = bpf_map_lookup_elem(&unwind_asked, &pid), next = { .at = now, .gap = ASK_EVERY_NS };

	if (last) {
		if (now - last->at < last->gap)
			return;
		next.gap = last->gap < ASK_MAX_NS / 2 ? 2 * last->gap : ASK_MAX_NS;
	}
	bpf_map_update_elem(&unwind_asked, &pid, &next, 0);
	s->rec.user_flags |= flag;
}

/*
 * find_range does not branch on what it reads: each step adds half of the span
 * to the index, or 0, by arithmetic (half_if_le). With an if/else per step the
 * verifier follows each outcome apart with the index exact (an index that
 * addresses memory must be), so find_range was 128 paths of distinct constant
 * indexes, each carrying the rest of walk_step: most of ember_walk's 175,000
 * verified instructions and 0.27 s of load. Here a step is one path with a
 * range of indexes. find_row keeps its if/else: its paths end in the copy of
 * one row, so they cost the verifier ~8,000 instructions rather than multiply,
 * and a branchless step is slower whenever the CPU predicts the branches
 * (stacks that repeat sample after sample): each step then waits for its load.
 */

/* half if a <= b, else 0, for a and b below 2^63 (user addresses). */
static __always_inline __u32 half_if_le(__u32 half, __u64 a, __u64 b)
{
	__u64 d = b - a; /* bit 63 set if a > b */

	/* Hides d's origin, or clang turns this back into a compare and a branch. */
	barrier_var(d);
	/* A shift, not an and with 0 or -1: the verifier (6.18 here) forks a state for each of those. */
	return (__u64)half >> ((d >> 63) << 5);
}

/* The range holding pc: the last one starting at or below it, if pc is inside it. */
static __always_inline struct ember_unwind_range *find_range(struct ember_unwind_proc *proc, __u64 pc)
{
	__u32 n = proc->count, at = 0, half, i;
	struct ember_unwind_range *r;

	if (n > EMBER_UNWIND_RANGES)
		n = EMBER_UNWIND_RANGES;
	if (n == 0)
		return 0;
	/* The last range starting at or below pc is in [at, at + n): 6 halvings cover 64 ranges. */
	for (i = 0; i < 6 && n > 1; i++) {
		half = n / 2;
		/* at + half < EMBER_UNWIND_RANGES: the masks are for the verifier. */
		at += half_if_le(half, proc->ranges[(at + half) & (EMBER_UNWIND_RANGES - 1)].start, pc);
		n -= half;
	}
	r = &proc->ranges[at & (EMBER_UNWIND_RANGES - 1)];
	/* at = 0 also when the first range starts above pc. */
	if (pc < r->start || pc - r->start >= r->len)
		return 0;
	return r;
}

/* pc - bias for a mapping at `start` of file offset `offset`, by the segment the offset is in. */
static __always_inline __u64 file_bias(struct ember_unwind_file *f, __u64 start, __u64 offset)
{
	__u32 i, n = f->count;
	struct ember_unwind_segment *seg = &f->segments[0];

	for (i = 0; i < EMBER_UNWIND_FILE_SEGMENTS; i++) {
		struct ember_unwind_segment *g = &f->segments[i];

		if (i < n && offset >= (g->offset & ~0xfffULL) && offset < g->offset + (g->size ? g->size : 1)) {
			seg = g;
			break;
		}
	}
	return start - offset + seg->offset - seg->vaddr;
}

/* Whether an inode's ctime is the one its `unwind_files` entry was built with. */
static __always_inline int same_ctime(struct inode *inode, struct ember_unwind_file *f)
{
	__s64 sec;
	__u32 nsec;

	if (bpf_core_field_exists(inode->i_ctime_sec)) {
		sec = inode->i_ctime_sec;
		nsec = inode->i_ctime_nsec & 0x7fffffff; /* without 6.13's "queried" flag */
	} else if (bpf_core_field_exists(((struct inode___pre611 *)inode)->__i_ctime)) {
		struct inode___pre611 *i = (void *)inode;

		sec = BPF_CORE_READ(i, __i_ctime.tv_sec);
		nsec = BPF_CORE_READ(i, __i_ctime.tv_nsec);
	} else {
		struct inode___pre66 *i = (void *)inode;

		sec = BPF_CORE_READ(i, i_ctime.tv_sec);
		nsec = BPF_CORE_READ(i, i_ctime.tv_nsec);
	}
	return sec == f->ctime_sec && nsec == f->ctime_nsec;
}

/* The range of an executable mapping of a file whose table is loaded; 0 if it is not one. */
static __always_inline int vma_range(struct vm_area_struct *vma, struct ember_unwind_range *r)
{
	struct ember_unwind_file_key key;
	struct ember_unwind_file *f;
	struct inode *inode;
	struct file *file;

	if (!(vma->vm_flags & EMBER_VM_EXEC))
		return 0;
	file = vma->vm_file;
	if (!file)
		return 0;
	inode = file->f_inode;
	__builtin_memset(&key, 0, sizeof(key));
	key.dev = inode->i_sb->s_dev;
	key.ino = inode->i_ino;
	f = bpf_map_lookup_elem(&unwind_files, &key);
	if (!f || f->size != inode->i_size || !same_ctime(inode, f))
		return 0;
	r->start = vma->vm_start;
	r->len = vma->vm_end - vma->vm_start;
	r->bias = file_bias(f, vma->vm_start, (__u64)vma->vm_pgoff << 12);
	r->table = f->table;
	return 1;
}

struct found {
	struct ember_unwind_range r;
	__u32 ok;
};

static long on_vma(struct task_struct *task, struct vm_area_struct *vma, void *arg)
{
	struct found *out = arg;

	out->ok = vma_range(vma, &out->r);
	return 0;
}

struct shift_ctx {
	struct ember_unwind_proc *p;
	__u64 start;
	__u32 at; /* where the new range goes */
};

/* bpf_loop callback: moves range count - k - 1 up by one, or stops where the new range goes. */
static long shift_range(__u32 k, void *arg)
{
	struct shift_ctx *c = arg;
	struct ember_unwind_proc *p = c->p;
	__u32 i = p->count - k;

	if (i == 0 || p->ranges[(i - 1) & (EMBER_UNWIND_RANGES - 1)].start <= c->start) {
		c->at = i;
		return 1;
	}
	p->ranges[i & (EMBER_UNWIND_RANGES - 1)] = p->ranges[(i - 1) & (EMBER_UNWIND_RANGES - 1)];
	return 0;
}

/*
 * Adds r to a process's sorted ranges in place (the walker's miss of a library
 * mapped since the agent read the process); 0 if they are full. Two CPUs doing
 * this for one process at once can leave a range out; the agent's next read of
 * the process repairs it. The shift is a bpf_loop of its own: as a loop inside
 * walk_step the verifier went through all 64 of its iterations.
 */
static __always_inline int insert_range(struct ember_unwind_proc *p, struct ember_unwind_range *r)
{
	struct shift_ctx c = { .p = p, .start = r->start };
	__u32 n = p->count;

	if (n >= EMBER_UNWIND_RANGES)
		return 0;
	/* Shifts the ranges starting above r up by one, from the top; its step n (i = 0) always stops. */
	bpf_loop(n + 1, shift_range, &c, 0);
	p->ranges[c.at & (EMBER_UNWIND_RANGES - 1)] = *r;
	p->count = n + 1;
	return 1;
}

/*
 * A process that exec'd: its ranges from its new memory map (the program and
 * ld.so, mapped by the kernel), for the objects whose tables are loaded, before
 * it runs an instruction; libraries ld.so maps later are found by the walker.
 * Runs in process context: the VMA iterator refuses contexts with interrupts off.
 */
SEC("tp_btf/sched_process_exec")
int BPF_PROG(ember_exec, struct task_struct *task)
{
	__u32 pid = bpf_get_current_pid_tgid() >> 32, zero = 0, n;
	struct ember_unwind_proc *p = bpf_map_lookup_elem(&proc_scratch, &zero);
	struct ember_unwind_range r;
	struct bpf_iter_task_vma it;
	struct vm_area_struct *vma;

	/* A new program asks at once: it may live milliseconds (a reused pid's gap is not its). */
	bpf_map_delete_elem(&unwind_asked, &pid);
	if (!p || ember_cfg.unwind_mode == EMBER_MODE_FRAME_POINTER)
		return 0;
	if (ember_cfg.filter_pids && !bpf_map_lookup_elem(&pid_filter, &pid))
		return 0;
	p->count = 0;
	/* The sampler asks the agent to read such a process when it samples it. */
	p->flags = EMBER_PROC_UNREAD;
	if (!bpf_ksym_exists(bpf_iter_task_vma_new))
		return 0;
	if (!bpf_iter_task_vma_new(&it, bpf_get_current_task_btf(), 0)) {
		/* Counts live in the map value, not registers, so the iterator's loop converges. */
		while ((vma = bpf_iter_task_vma_next(&it))) {
			if (!vma_range(vma, &r))
				continue;
			n = p->count;
			if (n >= EMBER_UNWIND_RANGES)
				break;
			p->ranges[n] = r;
			p->count = n + 1;
		}
	}
	bpf_iter_task_vma_destroy(&it);
	/* The old program's ranges never outlive the exec. */
	if (!p->count) {
		bpf_map_delete_elem(&unwind_procs, &pid);
		return 0;
	}
	if (bpf_map_update_elem(&unwind_procs, &pid, p, 0))
		count(EMBER_CNT_EXEC_FAILED);
	else
		count(EMBER_CNT_EXEC_RANGES);
	return 0;
}

#endif /* EMBER_RANGES_BPF_H */
