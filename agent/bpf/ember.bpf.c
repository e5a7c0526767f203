// SPDX-License-Identifier: GPL-2.0
/*
 * ember's sampler: a perf_event program that copies the interrupted task's
 * kernel and user stacks into one ring buffer record.
 *
 * User stacks: where the agent has loaded unwind tables for the process
 * (`unwind_procs`), `ember_walk` walks them (tables compiled from .eh_frame by
 * normalize/unwind, the frame pointer where code has none); otherwise
 * bpf_get_stack follows frame pointers, and the record asks the agent to load
 * the process.
 *
 * Why a ring buffer and no STACK_TRACE map: a stack-id map loses samples to
 * hash collisions (two stacks share a bucket and one is dropped or overwritten)
 * and to drain races (an id read after its bucket was reused names another
 * stack). Raw stacks in a ring buffer lose a sample only when the buffer is
 * full, and that is counted.
 */
#include "types.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
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
struct ember_unwind_header ember_unwind_header_layout = {};
struct ember_unwind_chunk ember_unwind_chunk_layout = {};
struct ember_unwind_range ember_unwind_range_layout = {};
struct ember_unwind_proc ember_unwind_proc_layout = {};
struct ember_unwind_file ember_unwind_file_layout = {};
enum ember_unwind_result ember_unwind_result_layout = EMBER_UNWIND_FRAME_POINTER;
enum ember_unwind_mode ember_unwind_mode_layout = EMBER_MODE_FRAME_POINTER;
enum ember_proc_flag ember_proc_flag_layout = EMBER_PROC_UNREAD;
enum ember_unwind_page_shift ember_unwind_page_shift_layout = EMBER_UNWIND_PAGE_SHIFT;
struct ember_py_proc ember_py_proc_layout = {};
struct ember_py_tail ember_py_tail_layout = {};
enum ember_py_result ember_py_result_layout = EMBER_PY_NONE;
enum ember_py_tls ember_py_tls_layout = EMBER_PY_TLS_TP;
enum ember_py_model ember_py_model_layout = EMBER_PY_OBJECTS;

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
 * A walk's interpreter frames in progress, whichever the runtime (interp.bpf.h): a native
 * frame of an interpreter's loop first records the interpreter frames that loop runs.
 */
struct interp_walk {
	__u8 started;   /* the thread's interpreter state was looked for (at the first loop frame) */
	__u8 emitting;  /* enum interp_runtime: whose frames of the loop frame at ip are being recorded */
	__u8 loop_done; /* ... done: record the loop frame itself */
	__u8 result;    /* enum ember_py_result */
	__u8 appending; /* the native walk stopped early: the rest of the frames go after it */
	__u64 frame;    /* the next interpreter frame (0: none left) */
	struct ember_py_tail tail; /* which user slots are interpreter frames, which loop frames */
};

/* The table walker's registers and progress, kept across its tail calls. */
struct walk {
	__u64 ip, sp, bp;
	__u32 kframes;  /* kernel frames at the start of ips */
	__u32 uframes;  /* user frames after them */
	__u8 running;   /* 0 once the walk ended; `result` says how */
	__u8 result;    /* enum ember_unwind_result */
	__u8 bp_lost;   /* a frame's rbp rule was "unknown": rbp no longer holds the caller's */
	__u8 exact;     /* ip is where the code was interrupted, not a return address */
	__u8 looked;    /* bpf_find_vma was used (once a sample: it defers its unlock to irq_work) */
	struct interp_walk interp; /* interpreter frames (interp.bpf.h) */
};

/* Words of a struct ember_py_tail. */
#define PY_TAIL_WORDS (sizeof(struct ember_py_tail) / sizeof(__u64))

/*
 * A record with room for both stacks and the interpreter tail; built here, then copied
 * out at its used size.
 */
struct scratch {
	struct ember_record rec;
	__u64 ips[2 * EMBER_MAX_FRAMES + PY_TAIL_WORDS];
	struct walk w;
};
/* finish() writes the tail at ips[(n & 0xff) + j], n <= 2 * EMBER_MAX_FRAMES. */
_Static_assert(2 * EMBER_MAX_FRAMES + PY_TAIL_WORDS <= 256 + PY_TAIL_WORDS, "tail index");
/* walk_step indexes ips with a mask of 0xff for the verifier: it must stay inside the scratch. */
_Static_assert(__builtin_offsetof(struct scratch, ips) + 256 * sizeof(__u64) <= sizeof(struct scratch),
	       "ips[at & 0xff] leaves the scratch");

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

/* Complete, not forward: libbpf holds a kfunc prototype naming a forward struct incompatible with the kernel's. */
struct task_struct {
	int pid;
	unsigned int flags;
} __attribute__((preserve_access_index));

#define PF_KTHREAD 0x00200000

/*
 * A kernel thread (kworker, kdamond, ...): no user stack to walk, and no memory map
 * to ask the agent for (each ask wakes two of its threads, and a busy host samples
 * kernel threads every second).
 */
static __always_inline int kernel_thread(struct task_struct *task)
{
	return task->flags & PF_KTHREAD;
}

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

/*
 * The walker tail-calls itself for the next EMBER_FRAMES_PER_RUN frames. Slot 0 is set by
 * the agent once ember_walk has loaded: a kernel that refuses the walker keeps the slot
 * empty, and the sampler's tail call then falls through to frame pointers.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	/* Sizes, not BTF types: the kernel refuses BTF on program arrays (libbpf retries noisily). */
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} walk_progs SEC(".maps");

/*
 * Set before load when the walker is to leave interpreter frames out: the simpler
 * variant the agent falls back to when a kernel refuses the full one.
 */
const volatile __u32 ember_walk_no_python = 0;

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
 * Copies the record out at its used size. A record that asks for a process's ranges
 * wakes the agent (the process may live milliseconds); a range miss waits for the next
 * drain (a second at most): it is mostly a miss no read fixes (code in memfd or
 * anonymous memory), and each forced wakeup woke the aggregator too.
 */
static __always_inline void emit(struct scratch *s, __u64 kbytes, __u64 ubytes)
{
	__u64 size = sizeof(struct ember_record) + kbytes + ubytes, wake;

	if (size > sizeof(struct ember_record) + sizeof(s->ips))
		size = sizeof(struct ember_record) + sizeof(s->ips);
	wake = (s->rec.user_flags & ~EMBER_REC_RANGE_MISS) ||
			       bpf_ringbuf_query(&samples, BPF_RB_AVAIL_DATA) >= ember_cfg.wakeup_bytes ?
		       BPF_RB_FORCE_WAKEUP :
		       BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_output(&samples, s, size, wake)) {
		count(EMBER_CNT_LOST_RINGBUF);
		return;
	}
	count(EMBER_CNT_SENT);
}

/* The user registers at the interrupt: the sample's own when it hit user mode, else the task's saved ones. */
static __always_inline int user_regs(struct ember_perf_ctx *ctx, struct walk *w)
{
	struct ember_pt_regs *u;

	if ((ctx->regs.cs & 3) == 3) {
		w->ip = ctx->regs.ip;
		w->sp = ctx->regs.sp;
		w->bp = ctx->regs.bp;
		return 0;
	}
	if (!ember_cfg.task_regs)
		return -1;
	u = (struct ember_pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	if (!u || bpf_probe_read_kernel(&w->ip, 8, &u->ip) || bpf_probe_read_kernel(&w->sp, 8, &u->sp) ||
	    bpf_probe_read_kernel(&w->bp, 8, &u->bp))
		return -1;
	return 0;
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

/* Reads a table's slots, looking up each 4 KiB chunk once while a search stays inside it. */
struct cursor {
	void *table;
	struct ember_unwind_chunk *chunk;
	__u32 at; /* index of `chunk` */
};

static __always_inline __u64 *slot_at(struct cursor *c, __u32 k)
{
	__u32 i = k / EMBER_UNWIND_CHUNK_SLOTS;

	if (!c->chunk || c->at != i) {
		c->chunk = bpf_map_lookup_elem(c->table, &i);
		c->at = i;
		if (!c->chunk)
			return 0;
	}
	return &c->chunk->slots[k % EMBER_UNWIND_CHUNK_SLOTS];
}

/* The row in force at the object address addr: page index, then a binary search of its rows. */
static __always_inline int find_row(void *table, __u64 addr, struct ember_unwind_row *out)
{
	struct cursor c = { .table = table };
	struct ember_unwind_header *h;
	struct ember_unwind_page *page;
	struct ember_unwind_row *row;
	__u32 base, lo = 0, hi, mid, i, pi;
	__u16 low = addr & ((1 << EMBER_UNWIND_PAGE_SHIFT) - 1);
	__u64 p = addr >> EMBER_UNWIND_PAGE_SHIFT;

	h = (void *)slot_at(&c, 0);
	if (!h)
		return -1;
	if (p < h->first_page || p - h->first_page >= h->page_count)
		return -1;
	pi = p - h->first_page;
	page = (void *)slot_at(&c, 1 + pi);
	if (!page)
		return -1;
	base = 1 + h->page_count + page->first_row;
	hi = page->row_count;
	/* The last row with pc_low <= low; row 0 of a page has pc_low 0. 13 steps cover 4,096 rows. */
	for (i = 0; i < 13 && hi - lo > 1; i++) {
		mid = lo + (hi - lo) / 2;
		row = (void *)slot_at(&c, base + mid);
		if (!row)
			return -1;
		if (row->pc_low <= low)
			lo = mid;
		else
			hi = mid;
	}
	row = (void *)slot_at(&c, base + lo);
	if (!row)
		return -1;
	*out = *row;
	return 0;
}

static __always_inline long stop(struct walk *w, __u8 result)
{
	w->running = 0;
	w->result = result;
	return 1;
}

static __always_inline long read_u64(__u64 *dst, __u64 addr)
{
	return bpf_probe_read_user(dst, sizeof(*dst), (void *)addr);
}

/* One frame by the frame pointer: [rbp] is the caller's rbp, [rbp + 8] the return address. */
static __always_inline long fp_step(struct walk *w)
{
	__u64 ra, bp, pair[2];

	if (w->bp_lost)
		return stop(w, EMBER_UNWIND_ERR_RBP_UNKNOWN);
	if (w->bp == 0)
		return stop(w, EMBER_UNWIND_FP_END);
	if (w->bp < w->sp)
		return stop(w, EMBER_UNWIND_ERR_BAD_FRAME);
	if (bpf_probe_read_user(pair, sizeof(pair), (void *)w->bp))
		return stop(w, EMBER_UNWIND_ERR_READ);
	bp = pair[0];
	ra = pair[1];
	w->sp = w->bp + 16;
	w->bp = bp;
	w->ip = ra;
	w->exact = 0;
	if (ra == 0)
		return stop(w, EMBER_UNWIND_FP_END);
	return 0;
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
 * Rows found lately, per CPU, keyed by (table id, object address): most samples
 * repeat the frames of the samples before them (the same return addresses, a hot
 * loop's few pcs), and a hit costs one compare where a search costs its page
 * index, its steps and a helper call per chunk it touches. Direct-mapped, 1,024
 * entries of 24 bytes behind the 128 of the first level: 27 KiB per CPU for the
 * sampler, as much for off-CPU when it
 * is on (key 1: its own, as the sampler may interrupt it). An entry is never stale: a table's
 * rows do not change, and a slot given to another table gets another id.
 */
#define ROW_CACHE_BITS 10
#define ROW_CACHE_ENTRIES (1 << ROW_CACHE_BITS)
/*
 * The first level: a sample touches one page of the cache while its rows are among the
 * last few hundred it used (a hot stack sampled again), where rows spread over the whole
 * cache cost a page each. At 99 Hz nothing a sample reads is still cached (measured on
 * this project's VMs: the first read of a per-CPU map value ~0.6 µs, the next ones a few
 * ns), so the cold pages it touches are most of what a sample costs.
 */
#define ROW_L1_ENTRIES 128

struct row_cache_entry {
	__u64 addr;
	__u32 id1; /* table id + 1: 0 is an empty entry */
	__u32 pad;
	struct ember_unwind_row row;
};

struct row_cache {
	struct row_cache_entry l1[ROW_L1_ENTRIES];
	struct row_cache_entry e[ROW_CACHE_ENTRIES];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2); /* 0: the sampler, 1: off-CPU (set to 1 when off-CPU is off) */
	__type(key, __u32);
	__type(value, struct row_cache);
} row_cache SEC(".maps");

struct walk_ctx {
	struct scratch *s;
	struct ember_unwind_proc *proc;
	struct row_cache *cache; /* this CPU's, or 0: every row is searched */
	/* Each runtime's entry for the process, or 0 (interp_begin); off-CPU sets them itself. */
	struct ember_py_proc *py;
	__u32 buf_key; /* the runtimes' per-CPU read buffers: 0 the sampler, 1 off-CPU */
};

/* Interpreter frames: the walker asks interp.bpf.h at each frame, which asks each runtime. */
#include "interp.bpf.h"

/*
 * A table is stamped in `unwind_used` at most this often: eviction needs no finer
 * clock, and a cache hit then writes nothing other CPUs share.
 */
#define STAMP_EVERY_NS 100000000ULL

/* The row in force at object address addr of table `id`: from the row cache, else its table. */
static __always_inline int lookup_row(struct walk_ctx *c, __u32 id, __u64 addr, struct ember_unwind_row *out)
{
	__u32 slot = EMBER_UNWIND_SLOT(id), h;
	__u64 now = c->s->rec.time_ns, *used;
	struct row_cache_entry *e = 0, *l1 = 0;
	void *table;

	used = bpf_map_lookup_elem(&unwind_used, &slot);
	if (used && now - *used > STAMP_EVERY_NS)
		*used = now;
	if (c->cache) {
		h = ((addr ^ ((__u64)id << 40)) * 0x9E3779B97F4A7C15ULL) >> (64 - ROW_CACHE_BITS);
		l1 = &c->cache->l1[h & (ROW_L1_ENTRIES - 1)];
		if (l1->addr == addr && l1->id1 == id + 1) {
			*out = l1->row;
			count(EMBER_CNT_ROW_CACHED);
			return 0;
		}
		e = &c->cache->e[h & (ROW_CACHE_ENTRIES - 1)];
		if (e->addr == addr && e->id1 == id + 1) {
			*out = e->row;
			*l1 = *e;
			count(EMBER_CNT_ROW_CACHED);
			return 0;
		}
	}
	table = bpf_map_lookup_elem(&unwind_tables, &slot);
	if (!table || find_row(table, addr, out))
		return -1;
	count(EMBER_CNT_ROW_SEARCHED);
	if (e) {
		if (e->id1)
			count(EMBER_CNT_ROW_EVICTED);
		e->addr = addr;
		e->id1 = id + 1;
		e->row = *out;
		*l1 = *e;
	}
	return 0;
}

/* A pc in no known range: ask the agent to read the process again, and take the frame pointer meanwhile. */
static __always_inline long range_miss(struct scratch *s)
{
	ask(s, EMBER_REC_RANGE_MISS);
	return ember_cfg.unwind_mode == EMBER_MODE_DWARF ? stop(&s->w, EMBER_UNWIND_ERR_NO_TABLE) : fp_step(&s->w);
}

/* Records the current frame and steps to its caller (or records one interpreter frame). 1 ends the walk. */
static __always_inline long walk_one(struct walk_ctx *c)
{
	struct scratch *s = c->s;
	struct walk *w = &s->w;
	struct ember_unwind_range *r;
	struct ember_unwind_row row;
	__u64 pc, bias, cfa, ra, bp, v, *frame;
	__u32 id, at;

	if (!w->running)
		return 1;
	if (w->interp.emitting)
		return interp_frame(s, c->py, c->buf_key);
	if (w->uframes >= EMBER_MAX_FRAMES)
		return stop(w, EMBER_UNWIND_TRUNCATED);
	at = w->kframes + w->uframes;
	if (at >= 2 * EMBER_MAX_FRAMES)
		return stop(w, EMBER_UNWIND_TRUNCATED);
	/* A return address is the instruction after the call: look up the call itself. */
	pc = w->exact ? w->ip : w->ip - 1;
	/* An interpreter loop's frame: the interpreter frames it runs go first (innermost first). */
	if (interp_at_pc(c, pc))
		return 0;
	/*
	 * The mask is for the verifier: clang indexes with a copy of `at` the check did not
	 * bound, and would drop a mask it can prove idle (the barrier hides what it knows).
	 */
	barrier_var(at);
	frame = &s->ips[at & 0xff];
	*frame = w->exact ? w->ip | EMBER_IP_EXACT : w->ip;
	w->uframes++;

	r = find_range(c->proc, pc);
	if (r) {
		id = r->table;
		bias = r->bias;
	} else if (!w->looked) {
		/* A library mapped since the agent read the process: its memory map names it now. */
		struct found f = {};

		w->looked = 1;
		if (bpf_find_vma(bpf_get_current_task_btf(), pc, on_vma, &f, 0) || !f.ok ||
		    pc - f.r.start >= f.r.len)
			return range_miss(s);
		/* Unwound by f.r either way; ranges that are full are the agent's to sort out. */
		if (insert_range(c->proc, &f.r))
			count(EMBER_CNT_VMA_FOUND);
		else
			ask(s, EMBER_REC_RANGE_MISS);
		id = f.r.table;
		bias = f.r.bias;
	} else {
		return range_miss(s);
	}
	if (id == EMBER_TABLE_NONE)
		return ember_cfg.unwind_mode == EMBER_MODE_DWARF ? stop(w, EMBER_UNWIND_ERR_NO_TABLE) : fp_step(w);
	if (lookup_row(c, id, pc - bias, &row))
		return stop(w, EMBER_UNWIND_ERR_TABLE);

	switch (row.cfa_rule) {
	case EMBER_CFA_RSP:
		cfa = w->sp + row.cfa_offset;
		break;
	case EMBER_CFA_RBP:
		if (w->bp_lost)
			return stop(w, EMBER_UNWIND_ERR_RBP_UNKNOWN);
		cfa = w->bp + row.cfa_offset;
		break;
	case EMBER_CFA_RBP_DEREF:
		if (w->bp_lost)
			return stop(w, EMBER_UNWIND_ERR_RBP_UNKNOWN);
		if (read_u64(&cfa, w->bp + (__s16)row.cfa_offset))
			return stop(w, EMBER_UNWIND_ERR_READ);
		break;
	case EMBER_CFA_PLT:
		cfa = w->sp + row.cfa_offset + ((w->ip & 15) >= (__u64)row.rbp_offset ? 8 : 0);
		break;
	case EMBER_CFA_SIGNAL:
		/* This frame is the trampoline, named at its first byte (the handler's return address). */
		*frame |= EMBER_IP_EXACT;
		/* rsp is the rt_sigframe's ucontext; its saved registers start 40 bytes in. */
		if (read_u64(&bp, w->sp + 120) || read_u64(&v, w->sp + 160) || read_u64(&ra, w->sp + 168))
			return stop(w, EMBER_UNWIND_ERR_READ);
		w->bp = bp;
		w->bp_lost = 0;
		w->sp = v;
		w->ip = ra;
		w->exact = 1;
		return 0;
	case EMBER_CFA_STOP:
		return stop(w, EMBER_UNWIND_COMPLETE);
	case EMBER_CFA_FRAME_POINTER:
		/*
		 * Code no CFI covers. Where the registers are the thread's own (the first user
		 * frame, in it or in a syscall it made; a frame a signal interrupted), it is most
		 * often a leaf written in assembly that leaves its return address at rsp (musl's
		 * string functions and syscall wrappers, whose callers may keep no frame pointer):
		 * taken when that word is an address in one of the process's mapped objects. A
		 * function that pushed rbp first has a stack address there: frame pointer.
		 */
		if ((w->uframes == 1 || w->exact) && !read_u64(&ra, w->sp) && ra &&
		    find_range(c->proc, ra - 1)) {
			count(EMBER_CNT_ROW_LEAF);
			w->sp += 8;
			w->ip = ra;
			w->exact = 0;
			return 0;
		}
		return fp_step(w);
	default:
		return stop(w, EMBER_UNWIND_ERR_UNSUPPORTED);
	}

	if (cfa <= w->sp)
		return stop(w, EMBER_UNWIND_ERR_BAD_FRAME);
	if (row.rbp_rule == EMBER_RBP_AT_CFA && row.rbp_offset == -16) {
		/* The usual frame (push rbp on entry): saved rbp and return address in one read. */
		__u64 pair[2];

		if (bpf_probe_read_user(pair, sizeof(pair), (void *)(cfa - 16)))
			return stop(w, EMBER_UNWIND_ERR_READ);
		w->bp = pair[0];
		w->bp_lost = 0;
		ra = pair[1];
		goto stepped;
	}
	if (read_u64(&ra, cfa - 8))
		return stop(w, EMBER_UNWIND_ERR_READ);
	switch (row.rbp_rule) {
	case EMBER_RBP_AT_CFA:
		if (read_u64(&bp, cfa + row.rbp_offset))
			return stop(w, EMBER_UNWIND_ERR_READ);
		w->bp = bp;
		w->bp_lost = 0;
		break;
	case EMBER_RBP_AT_RBP:
		if (w->bp_lost)
			return stop(w, EMBER_UNWIND_ERR_RBP_UNKNOWN);
		if (read_u64(&bp, w->bp + row.rbp_offset))
			return stop(w, EMBER_UNWIND_ERR_READ);
		w->bp = bp;
		break;
	case EMBER_RBP_UNKNOWN:
		w->bp_lost = 1;
		break;
	default: /* unchanged */
		break;
	}
stepped:
	w->sp = cfa;
	w->ip = ra;
	w->exact = 0;
	if (ra == 0)
		return stop(w, EMBER_UNWIND_COMPLETE);
	return 0;
}

/*
 * One frame of a walk: a global function, so the verifier checks it once, on its own,
 * from what its arguments' types say, instead of again for every state its callers
 * reach it in. As a bpf_loop callback inlined into the walker, its branches multiplied
 * with the loop's states: 35k instructions processed on 6.1, 194k on 6.12, over the
 * 1M limit on 6.18.44. The pointers are map values the caller looked up (0 where it
 * found none); the verifier makes this function check each before use.
 */
__noinline int walk_frame(struct scratch *s, struct ember_unwind_proc *proc, struct row_cache *cache,
			  struct ember_py_proc *py, __u32 buf_key)
{
	struct walk_ctx c = { .s = s, .proc = proc, .cache = cache, .py = py, .buf_key = buf_key };

	if (!s || !proc)
		return 1;
	if (ember_walk_no_python)
		c.py = 0;
	return walk_one(&c);
}

/*
 * Walks up to `frames` frames, one call each; 1 once the walk has ended. The loop keeps no
 * state that differs from one frame to the next but its counter, so the verifier checks
 * it once or twice, whatever `frames` is.
 */
static __always_inline int walk_frames(struct walk_ctx *c, __u32 frames)
{
	__u32 i;

	for (i = 0; i < frames; i++)
		if (walk_frame(c->s, c->proc, c->cache, c->py, c->buf_key))
			return 1;
	return 0;
}

/* Ends a walk: the record carries its user frames and how the walk ended. */
static __always_inline void finish(struct scratch *s)
{
	__u32 k = s->w.kframes, u = s->w.uframes;
	__u64 tail;

	if (k > EMBER_MAX_FRAMES)
		k = EMBER_MAX_FRAMES;
	if (u > EMBER_MAX_FRAMES)
		u = EMBER_MAX_FRAMES;
	s->rec.user_frames = u;
	s->rec.user_result = s->w.result;
	tail = interp_finish(s, k, u);
	emit(s, k * sizeof(__u64), u * sizeof(__u64) + tail);
}

/*
 * One run of a walk: EMBER_FRAMES_PER_RUN frames, then a tail call to the walker for the
 * next run, or the record once the walk has ended. c->proc is the process's entry.
 */
static __always_inline void walk_run(struct ember_perf_ctx *ctx, struct walk_ctx *c)
{
	struct scratch *s = c->s;
	__u32 zero = 0;

	c->cache = bpf_map_lookup_elem(&row_cache, &zero);
	interp_begin(c, s->rec.pid, 0);
	walk_frames(c, EMBER_FRAMES_PER_RUN);
	if (s->w.running) {
		bpf_tail_call(ctx, &walk_progs, 0);
		/* Out of tail calls (33 runs: far more than EMBER_MAX_FRAMES frames), or no walker in the slot. */
		count(EMBER_CNT_TAIL_CALL);
		s->w.running = 0;
		s->w.result = EMBER_UNWIND_TRUNCATED;
	}
	interp_append(c);
	finish(s);
}

/* The table walker's later runs (a stack deeper than the sampler's first run). */
SEC("perf_event")
int ember_walk(struct ember_perf_ctx *ctx)
{
	__u32 zero = 0, pid;
	struct scratch *s = bpf_map_lookup_elem(&scratch_map, &zero);
	struct walk_ctx c = {};

	if (!s)
		return 0;
	pid = s->rec.pid;
	c.s = s;
	c.proc = bpf_map_lookup_elem(&unwind_procs, &pid);
	if (!c.proc) {
		/* The agent dropped the process between two runs. */
		s->w.running = 0;
		s->w.result = EMBER_UNWIND_ERR_TABLE;
		interp_append(&c);
		finish(s);
		return 0;
	}
	walk_run(ctx, &c);
	return 0;
}

/*
 * A sample: the record's fields and the kernel stack; then the user stack, by
 * frame pointers (bpf_get_stack), or, when `tables`, by the walker, whose first run
 * is the sampler's own (a tail call and the map lookups it repeats cost a stack of
 * a few frames a tenth of its time), and which tail-calls ember_walk for the rest.
 */
static __always_inline int sample(struct ember_perf_ctx *ctx, const int tables)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32, tid = (__u32)id;
	__u32 zero = 0;
	struct scratch *s;
	long kbytes, ubytes;
	__u64 cgroup_id;

	if (tid == 0 && !ember_cfg.include_idle) {
		count(EMBER_CNT_IDLE);
		return 0;
	}
	if (ember_cfg.filter_pids && !bpf_map_lookup_elem(&pid_filter, &pid)) {
		count(EMBER_CNT_FILTERED);
		return 0;
	}
	cgroup_id = bpf_get_current_cgroup_id();
	if (ember_deny_used &&
	    (bpf_map_lookup_elem(&pid_deny, &pid) || bpf_map_lookup_elem(&cgroup_deny, &cgroup_id))) {
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
	s->rec.user_result = EMBER_UNWIND_FRAME_POINTER;
	s->rec.user_flags = 0;
	s->rec.py_result = EMBER_PY_NONE;
	bpf_get_current_comm(s->rec.comm, sizeof(s->rec.comm));

	/* Interrupted in user mode, the kernel has no stack to give (get_perf_callchain): skip the call. */
	kbytes = (ctx->regs.cs & 3) == 3 ? 0 : bpf_get_stack(ctx, s->ips, STACK_BYTES, 0);
	if (kbytes < 0) {
		count(EMBER_CNT_KERN_STACK_ERR);
		kbytes = 0;
	}
	if (kbytes > STACK_BYTES)
		kbytes = STACK_BYTES;
	kbytes &= ~7L;
	s->rec.kern_frames = kbytes / sizeof(__u64);

	ubytes = 0;
	/* The current task is typed only with kernel BTF (task_regs). */
	if (pid != 0 && !(ember_cfg.task_regs && kernel_thread(bpf_get_current_task_btf()))) {
		if (tables) {
			struct ember_unwind_proc *known = bpf_map_lookup_elem(&unwind_procs, &pid);

			if (!known) {
				ask(s, EMBER_REC_UNKNOWN_PROCESS);
			} else if (known->flags & EMBER_PROC_UNREAD) {
				/* Walked by the exec hook's ranges, but named only once the agent reads it. */
				ask(s, EMBER_REC_UNREAD);
			}
			if (known && !user_regs(ctx, &s->w)) {
				s->w.kframes = kbytes / sizeof(__u64);
				s->w.uframes = 0;
				s->w.running = 1;
				s->w.result = EMBER_UNWIND_COMPLETE;
				s->w.bp_lost = 0;
				s->w.exact = 1;
				s->w.looked = !ember_cfg.task_regs;
				interp_reset(&s->w);
				struct walk_ctx c = { .s = s, .proc = known };

				walk_run(ctx, &c);
				return 0;
			}
		}
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
	s->rec.user_frames = ubytes / sizeof(__u64);
	emit(s, kbytes, ubytes);
	return 0;
}

/* The sampler that must load on every kernel: user stacks by frame pointers. */
SEC("perf_event")
int ember_sample(struct ember_perf_ctx *ctx)
{
	return sample(ctx, 0);
}

/* The sampler with the table walker (sampling.unwind auto or dwarf, where the kernel takes it). */
SEC("perf_event")
int ember_sample_walk(struct ember_perf_ctx *ctx)
{
	return sample(ctx, 1);
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

/* Off-CPU profiling: its own programs and maps, sharing the walker and its tables (offcpu.bpf.h). */
#include "offcpu.bpf.h"
