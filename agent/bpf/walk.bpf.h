/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The table walker: a frame at a time (walk_frame, verified once on its own), the
 * interpreters' frames where a runtime's loop runs (interp.bpf.h), the record's end,
 * and the tail calls that carry a deep stack over several program runs (ember_walk).
 */
#ifndef EMBER_WALK_BPF_H
#define EMBER_WALK_BPF_H

#include "interp.bpf.h"

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

#endif /* EMBER_WALK_BPF_H */
