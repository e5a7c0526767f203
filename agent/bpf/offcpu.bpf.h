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
#ifndef EMBER_OFFCPU_BPF_H
#define EMBER_OFFCPU_BPF_H

/* The units: offcpu_task -> offcpu_send -> offcpu_block (switches, resume), offcpu_wake (wakers, locks). */
#include "offcpu_block.bpf.h"
#include "offcpu_wake.bpf.h"

#endif /* EMBER_OFFCPU_BPF_H */
