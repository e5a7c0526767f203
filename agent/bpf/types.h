/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The few kernel types ember's BPF code needs. Kernel structures it reads are
 * declared with only the fields it reads, `preserve_access_index` (CO-RE):
 * libbpf relocates each field against the running kernel's BTF, so no vmlinux.h.
 */
#ifndef EMBER_TYPES_H
#define EMBER_TYPES_H

typedef unsigned char __u8;
typedef signed char __s8;
typedef unsigned short __u16;
typedef short __s16;
typedef unsigned int __u32;
typedef int __s32;
typedef unsigned long long __u64;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u64 __be64;
typedef __u32 __wsum;

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PROG_ARRAY = 3,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_ARRAY_OF_MAPS = 12,
	BPF_MAP_TYPE_RINGBUF = 27,
};

#define BPF_F_NO_PREALLOC (1U << 0)
#define BPF_F_MMAPABLE (1U << 10)
#define BPF_F_INNER_MAP (1U << 12)
#define BPF_NOEXIST 1

/* x86-64 registers as the kernel saves them (struct pt_regs, also the perf_event context's). */
struct ember_pt_regs {
	__u64 r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
	__u64 ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};

/* The perf_event program's context (struct bpf_perf_event_data). */
struct ember_perf_ctx {
	struct ember_pt_regs regs;
	__u64 sample_period;
	__u64 addr;
};

struct task_struct;
struct pt_regs;

/* What the sampler reads of a task's memory map (the VMA iterator's items), CO-RE relocated. */
struct super_block {
	__u32 s_dev; /* dev_t: major << 20 | minor */
} __attribute__((preserve_access_index));

struct inode {
	unsigned long i_ino;
	struct super_block *i_sb;
	__s64 i_size;
	/* Linux 6.11+; from 6.13 bit 31 of the nanoseconds flags a ctime that was queried. */
	__s64 i_ctime_sec;
	__u32 i_ctime_nsec;
} __attribute__((preserve_access_index));

struct timespec64 {
	__s64 tv_sec;
	long tv_nsec;
} __attribute__((preserve_access_index));

/* The inode's ctime before 6.11: `__i_ctime` from 6.6, `i_ctime` before. */
struct inode___pre611 {
	struct timespec64 __i_ctime;
} __attribute__((preserve_access_index));

struct inode___pre66 {
	struct timespec64 i_ctime;
} __attribute__((preserve_access_index));

struct file {
	struct inode *f_inode;
} __attribute__((preserve_access_index));

struct vm_area_struct {
	unsigned long vm_start;
	unsigned long vm_end;
	unsigned long vm_flags;
	unsigned long vm_pgoff;
	struct file *vm_file;
} __attribute__((preserve_access_index));

#define EMBER_VM_EXEC 0x4UL

/* A task's thread pointer (x86-64: the %fs base), where its TLS is: a flavor of task_struct. */
struct thread_struct {
	unsigned long fsbase;
} __attribute__((preserve_access_index));

struct task_struct___py {
	struct thread_struct thread;
} __attribute__((preserve_access_index));

/* The open-coded VMA iterator (kernel 6.7+); its kfuncs are weak, so older kernels load too. */
struct bpf_iter_task_vma {
	__u64 __opaque[1];
} __attribute__((aligned(8)));

#define BPF_F_USER_STACK (1ULL << 8)
#define BPF_RB_NO_WAKEUP 1
#define BPF_RB_FORCE_WAKEUP 2
#define BPF_RB_AVAIL_DATA 0

#endif /* EMBER_TYPES_H */
