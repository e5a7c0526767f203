/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The walker's interface to interpreters: the table walker (walk_frame) asks
 * interp_at_pc at each native frame whether it is an interpreter loop's frame,
 * and then calls interp_frame, a frame a step, until that runtime's frames of the
 * loop frame are recorded; the loop frame itself follows. Each runtime is one
 * header (python.bpf.h) that provides <rt>_begin, <rt>_at_pc, <rt>_step and <rt>_append; a
 * new runtime adds its header, its value of enum interp_runtime and one line in
 * each function below, and the walker's core stays as it is.
 *
 * A sample's interpreter frames share one state (struct interp_walk) and one tail
 * after the ips (struct ember_py_tail): a thread runs one interpreter.
 */
#ifndef EMBER_INTERP_BPF_H
#define EMBER_INTERP_BPF_H

#include "runtime.bpf.h"
#include "python.bpf.h"

/* Each runtime's entry for the process `pid`, at the start of a walker run; buf_key 0 the sampler. */
static __always_inline void interp_begin(struct walk_ctx *c, __u32 pid, __u32 buf_key)
{
	c->buf_key = buf_key;
	py_begin(c, pid);
}

/*
 * At a frame about to be recorded: 1 if a runtime records its interpreter frames first
 * (the walk's next steps, by interp_frame), 0 to record the native frame itself.
 */
static __always_inline int interp_at_pc(struct walk_ctx *c, __u64 pc)
{
	return py_at_eval(c, pc);
}

/* One interpreter frame of the runtime that is recording (the walker's step result). */
static __always_inline int interp_one(struct scratch *s, struct ember_py_proc *py, __u32 buf_key)
{
	struct walk_ctx c = { .s = s, .py = py, .buf_key = buf_key };

	switch (s->w.interp.emitting) {
	case INTERP_PYTHON:
		return py_step(&c);
	default:
		s->w.interp.emitting = INTERP_NONE;
		return 0;
	}
}

/* interp_one as a global function, verified once on its own, like walk_frame. */
__noinline int interp_frame(struct scratch *s, struct ember_py_proc *py, __u32 buf_key)
{
	if (!s)
		return 1;
	return interp_one(s, py, buf_key);
}

/*
 * After the native walk: where it stopped early (an unwind error: not an end it reached, nor
 * the frame cap), the thread's interpreter frames it did not reach follow its last native
 * frame.
 */
static __always_inline void interp_append(struct walk_ctx *c)
{
	struct walk *w = &c->s->w;

	if (w->running || w->result < EMBER_UNWIND_ERR_UNSUPPORTED)
		return;
	py_append(c);
}

/* Resets the walk's interpreter state; interp_finish's record says EMBER_PY_NONE until a loop frame. */
static __always_inline void interp_reset(struct walk *w)
{
	w->interp.started = 0;
	w->interp.emitting = INTERP_NONE;
	w->interp.loop_done = 0;
	w->interp.result = EMBER_PY_NONE;
	w->interp.appending = 0;
	w->interp.frame = 0;
	__builtin_memset(&w->interp.tail, 0, sizeof(w->interp.tail));
}

/*
 * Writes the interpreter tail after the k + u ips of a walk that met a loop frame, and
 * says so in the record; returns its bytes.
 */
static __always_inline __u64 interp_finish(struct scratch *s, __u32 k, __u32 u)
{
	__u32 n = k + u, j;

	s->rec.py_result = s->w.interp.started ? s->w.interp.result : EMBER_PY_NONE;
	if (s->rec.py_result == EMBER_PY_NONE || n > 2 * EMBER_MAX_FRAMES) {
		s->rec.py_result = EMBER_PY_NONE;
		return 0;
	}
	barrier_var(n);
	for (j = 0; j < PY_TAIL_WORDS; j++)
		s->ips[(n & 0xff) + j] = ((__u64 *)&s->w.interp.tail)[j];
	return sizeof(struct ember_py_tail);
}

#endif /* EMBER_INTERP_BPF_H */
