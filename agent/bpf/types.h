/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The few kernel types ember's BPF code needs. The program reads no kernel
 * structures (only helpers), so it needs neither vmlinux.h nor CO-RE.
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
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_RINGBUF = 27,
};

#define BPF_F_USER_STACK (1ULL << 8)
#define BPF_RB_NO_WAKEUP 1
#define BPF_RB_FORCE_WAKEUP 2
#define BPF_RB_AVAIL_DATA 0

#endif /* EMBER_TYPES_H */
