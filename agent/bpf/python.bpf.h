/* SPDX-License-Identifier: GPL-2.0 */
/*
 * CPython's frames, for the walker (interp.bpf.h dispatches to it): where a native
 * frame is in the eval loop (`_PyEval_EvalFrameDefault`), the interpreter frames
 * that eval call runs are recorded before it, innermost first, from the thread's own
 * PyThreadState (see struct ember_py_proc in ember.h and agent/src/normalize/python).
 * interp.bpf.h dispatches to it; it needs only the walk's state and runtime.bpf.h.
 */
#ifndef EMBER_PYTHON_BPF_H
#define EMBER_PYTHON_BPF_H

#include "runtime.bpf.h"

/* Per process (tgid): where its interpreter's eval loop is and how to walk its frames. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096); /* resized from the config before load */
	__type(key, __u32);
	__type(value, struct ember_py_proc);
} py_procs SEC(".maps");

/* One interpreter frame's bytes, read at once (per CPU; off-CPU has its own, key 1). */
struct py_frame_buf {
	__u64 w[EMBER_PY_FRAME_BYTES / 8];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct py_frame_buf);
} py_buf SEC(".maps");

/* The thread's innermost interpreter frame, from its PyThreadState; 0 if there is none. */
static __always_inline __u64 py_cursor(struct ember_py_proc *py)
{
	__u64 tp = thread_pointer(), base = tp, ts, f;

	if (!tp)
		return 0;
	if (py->tls_mode == EMBER_PY_TLS_DTV) {
		/* glibc's dtv_t is 16 bytes; an unallocated block is -1 (dlopen'ed, not touched yet). */
		if (read_u64(&base, tp + 8) || read_u64(&base, base + 16 * py->tls_module))
			return 0;
		if (base == 0 || base == (__u64)-1)
			return 0;
	} else if (py->tls_mode == EMBER_PY_TLS_TSD) {
		/* musl: the thread's key array, allocated with the thread (never null once running). */
		if (read_u64(&base, tp + py->tls_module) || base == 0)
			return 0;
	}
	if (read_u64(&ts, base + py->tls_offset) || ts == 0 || (ts & 7))
		return 0;
	if (read_u64(&f, ts + py->tstate_frame))
		return 0;
	if (py->cframe_current != EMBER_PY_NO_FIELD && (f == 0 || read_u64(&f, f + py->cframe_current)))
		return 0;
	return f;
}

/* Whether pc is in the interpreter's eval loop. */
static __always_inline int in_eval(struct ember_py_proc *py, __u64 pc)
{
	return (pc >= py->eval_start[0] && pc < py->eval_end[0]) ||
	       (pc >= py->eval_start[1] && pc < py->eval_end[1]);
}

static __always_inline __u64 buf_word(struct py_frame_buf *b, __u16 off)
{
	return b->w[(off >> 3) & (EMBER_PY_FRAME_BYTES / 8 - 1)];
}

/* The 4-byte or 1-byte field at off (little-endian) of a frame's bytes. */
static __always_inline __u32 buf_u32(struct py_frame_buf *b, __u16 off)
{
	return buf_word(b, off) >> ((off & 4) * 8);
}

static __always_inline __u8 buf_u8(struct py_frame_buf *b, __u16 off)
{
	return buf_word(b, off) >> ((off & 7) * 8);
}

/*
 * Where the bytecode the frame runs starts: the code object's own (`co_code_adaptive`), or
 * in a free-threaded 3.14+ build the thread's copy, `co_tlbc->entries[tlbc_index]` (index 0
 * is the code object's own). 0 if the copy cannot be read: the offset is then out of range
 * and recorded as unknown.
 */
static __always_inline __u64 py_bytecode(struct ember_py_proc *py, struct py_frame_buf *b, __u64 code)
{
	__u64 arr, size, base = 0;
	__u32 index;

	if (py->frame_tlbc == EMBER_PY_NO_FIELD || !code)
		return code + py->code_adaptive;
	index = buf_u32(b, py->frame_tlbc);
	if (index == 0)
		return code + py->code_adaptive;
	if (bpf_probe_read_user(&arr, sizeof(arr), (void *)(code + py->code_tlbc)) || !arr ||
	    bpf_probe_read_user(&size, sizeof(size), (void *)arr) || index >= size ||
	    bpf_probe_read_user(&base, sizeof(base), (void *)(arr + 8 + 8 * (__u64)index)))
		return 0;
	return base;
}

/*
 * Ends the current eval frame's interpreter frames: its own frame is recorded next. An
 * append keeps its result: EMBER_PY_APPENDED says where its frames stand.
 */
static __always_inline long py_done(struct walk *w, __u8 result)
{
	w->interp.emitting = INTERP_NONE;
	if (result != EMBER_PY_OK && !w->interp.appending)
		w->interp.result = result;
	return 0;
}

/*
 * One step of an eval frame's interpreter frames: records the frame at the cursor
 * (two slots) and moves to its caller, or ends the eval frame's run by its model.
 */
static __always_inline long py_step(struct walk_ctx *c)
{
	struct scratch *s = c->s;
	struct walk *w = &s->w;
	struct ember_py_proc *py = c->py;
	__u32 key = c->buf_key, i, at, size, unit = 0, fp = 0;
	__u64 frame = w->interp.frame, code, prev, instr, type;
	struct py_frame_buf *b;
	__u8 owner;

	if (!py || !frame)
		return py_done(w, EMBER_PY_MISMATCH);
	b = bpf_map_lookup_elem(&py_buf, &key);
	if (!b)
		return py_done(w, EMBER_PY_READ);
	size = py->frame_size;
	if (size > EMBER_PY_FRAME_BYTES)
		size = EMBER_PY_FRAME_BYTES;
	if (bpf_probe_read_user(b, size, (void *)frame)) {
		w->interp.frame = 0;
		return py_done(w, EMBER_PY_READ);
	}
	code = buf_word(b, py->frame_code);
	prev = buf_word(b, py->frame_previous);
	owner = buf_u8(b, py->frame_owner);
	if (py->model == EMBER_PY_CSTACK && owner >= py->owner_cstack) {
		/*
		 * The eval call's entry frame: its run of frames ends here (an append goes on
		 * past it). At or above: 3.14 gives it FRAME_OWNED_BY_INTERPRETER (3), below
		 * FRAME_OWNED_BY_CSTACK (4).
		 */
		w->interp.frame = prev;
		if (w->interp.appending && prev)
			return 0;
		return py_done(w, EMBER_PY_OK);
	}
	if (py->code_tagged)
		code &= ~7ULL;
	i = w->uframes;
	at = w->kframes + i;
	if (i + 2 > EMBER_MAX_FRAMES || at + 2 > 2 * EMBER_MAX_FRAMES) {
		/* An append ends at the cap; the native walk's own end stays as it was. */
		if (w->interp.appending)
			return py_done(w, EMBER_PY_TRUNCATED);
		w->interp.result = EMBER_PY_TRUNCATED;
		return stop(w, EMBER_UNWIND_TRUNCATED);
	}
	/*
	 * A frame whose code is not a code object (one being set up at a call's edge, or a
	 * forged chain): nothing from here on is trusted, so no frame is recorded. A code
	 * object not resident keeps its address, fingerprint 0 (unknown).
	 */
	if (code && !bpf_probe_read_user(&type, sizeof(type), (void *)(code + py->object_type)) &&
	    type != py->code_type) {
		w->interp.frame = 0;
		return py_done(w, EMBER_PY_MISMATCH);
	}
	if (code && bpf_probe_read_user(&fp, sizeof(fp), (void *)(code + py->code_firstlineno)))
		fp = 0;
	if (py->model == EMBER_PY_OBJECTS) {
		unit = buf_u32(b, py->frame_instr);
		if ((__s32)unit < 0)
			unit = 0; /* -1: not started */
	} else {
		instr = buf_word(b, py->frame_instr) - py_bytecode(py, b, code);
		unit = instr < (1ULL << 32) ? instr / 2 : 0;
	}
	barrier_var(at);
	s->ips[at & 0xff] = code;
	s->ips[(at + 1) & 0xff] = ((__u64)unit << 32) | fp;
	set_bit(w->interp.tail.py_start, i);
	w->uframes = i + 2;
	w->interp.frame = prev;
	count(EMBER_CNT_PY_FRAMES);
	if (!prev)
		return py_done(w, EMBER_PY_OK);
	if (w->interp.appending)
		return 0;
	if (py->model == EMBER_PY_OBJECTS || (py->model == EMBER_PY_ENTRY && owner))
		return py_done(w, EMBER_PY_OK);
	return 0;
}

/*
 * At a frame about to be recorded whose pc is in the eval loop: 1 if its interpreter
 * frames are to be recorded first (the walk's next steps), 0 to record the frame itself.
 */
static __always_inline int py_at_eval(struct walk_ctx *c, __u64 pc)
{
	struct walk *w = &c->s->w;

	if (!c->py || !in_eval(c->py, pc))
		return 0;
	if (w->interp.loop_done) {
		w->interp.loop_done = 0;
		set_bit(w->interp.tail.eval, w->uframes);
		return 0;
	}
	if (!w->interp.started) {
		w->interp.started = 1;
		w->interp.frame = py_cursor(c->py);
		w->interp.result = w->interp.frame ? EMBER_PY_OK : EMBER_PY_NO_STATE;
	} else if (!w->interp.frame && w->interp.result == EMBER_PY_OK) {
		w->interp.result = EMBER_PY_MISMATCH;
	}
	if (!w->interp.frame) {
		set_bit(w->interp.tail.eval, w->uframes);
		return 0;
	}
	w->interp.emitting = INTERP_PYTHON;
	w->interp.loop_done = 1;
	return 1;
}

/*
 * The native walk stopped early: records the interpreter frames it did not reach (all of
 * the thread's if it met no eval frame), past entry frames, after its last native frame.
 */
static __always_inline void py_append(struct walk_ctx *c)
{
	struct walk *w = &c->s->w;
	__u32 before = w->uframes;
	__u8 started = w->interp.started, result = w->interp.result;
	__u32 i;

	if (!c->py)
		return;
	if (!started) {
		w->interp.frame = py_cursor(c->py);
		w->interp.result = EMBER_PY_OK;
		w->interp.started = 1;
	}
	if (!w->interp.frame)
		goto none;
	w->interp.result = EMBER_PY_APPENDED;
	w->interp.appending = 1;
	w->interp.emitting = INTERP_PYTHON;
	/* Each step records a frame or passes an entry frame; the frame cap ends it sooner. */
	for (i = 0; i < 2 * EMBER_MAX_FRAMES && w->interp.emitting; i++)
		interp_frame(c->s, c->py, c->buf_key);
	w->interp.emitting = INTERP_NONE;
	w->interp.appending = 0;
	if (w->uframes != before)
		return;
none:
	/* Nothing appended (no Python on this thread, or only entry frames left): as it was. */
	w->interp.started = started;
	w->interp.result = result;
}

/* The process's interpreter entry for this run of the walker, or 0. */
static __always_inline void py_begin(struct walk_ctx *c, __u32 pid)
{
	c->py = c->proc && (c->proc->flags & EMBER_PROC_PYTHON) ? bpf_map_lookup_elem(&py_procs, &pid) : 0;
}

#endif /* EMBER_PYTHON_BPF_H */
