/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What every runtime's walk shares with the dispatch in interp.bpf.h: which runtime
 * a walk is recording, the thread pointer, the tail's bitmaps, and the one global
 * function that records an interpreter frame.
 */
#ifndef EMBER_RUNTIME_BPF_H
#define EMBER_RUNTIME_BPF_H

#include "frame.bpf.h"

/* Whose frames a walk is recording (struct interp_walk.emitting). */
enum interp_runtime {
	INTERP_NONE = 0,
	INTERP_PYTHON = 1,
};

/* The thread's %fs base: where its TLS and its pthread's key slots are (x86-64). */
static __always_inline __u64 thread_pointer(void)
{
	struct task_struct___py *t = (void *)bpf_get_current_task_btf();

	return BPF_CORE_READ(t, thread.fsbase);
}

/* Marks user slot i in one of the tail's bitmaps (i < 128). */
static __always_inline void set_bit(__u64 *bits, __u32 i)
{
	bits[(i >> 6) & 1] |= 1ULL << (i & 63);
}

int interp_frame(struct scratch *s, struct ember_py_proc *py, __u32 buf_key);

#endif /* EMBER_RUNTIME_BPF_H */
