/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unwind tables, the ranges of each process, and the files the exec hook and the
 * walker map to tables.
 */
#ifndef EMBER_CONTRACT_UNWIND_H
#define EMBER_CONTRACT_UNWIND_H

/*
 * Unwind tables (normalize/unwind builds them from an object's .eh_frame and
 * .debug_frame; the sampler walks them to unwind code without frame pointers).
 *
 * One table per object. Addresses are the object's own virtual addresses (the
 * sampler subtracts the mapping's bias first). The object's code is cut into
 * 4 KiB pages, numbered from the table's first page; page i's rows are
 * rows[first_row .. first_row + row_count), sorted by pc_low, and the first
 * one always has pc_low 0, so a binary search of at most 13 steps always
 * finds the row in force: the last one with pc_low <= (pc & 0xfff).
 *
 * Why 4 KiB: a sample's cost is the cold pages it touches (at 99 Hz nothing a
 * sample reads is still cached), and a page's rows then fit one 4 KiB chunk of
 * the table: a search reads the header, one index chunk and one row chunk
 * (with 64 KiB pages, a large library's ~1,000 rows a page spread over 2-4).
 * The index costs 8 bytes per 4 KiB of code.
 *
 * Rust mirrors these in parse/src/unwind/row.rs (the compiler is fuzzed without
 * the BPF build); agent/src/normalize/unwind/abi.rs checks the mirrors against the
 * skeleton's types at compile time.
 */
enum ember_unwind_page_shift {
	EMBER_UNWIND_PAGE_SHIFT = 12,
};

/* The tables' and ranges' sizes. */
enum ember_unwind_limit {
	EMBER_UNWIND_CHUNK_SLOTS = 512,  /* slots per element of a table's array: 4 KiB elements */
	EMBER_UNWIND_SLOT_BITS = 12,     /* slots of the `unwind_tables` map of tables: ... */
	EMBER_UNWIND_TABLES = 1 << 12,   /* ... 1 << EMBER_UNWIND_SLOT_BITS */
	EMBER_UNWIND_RANGES = 64,        /* executable ranges per process the sampler can hold; more are dropped (counted) */
	EMBER_UNWIND_FILE_SEGMENTS = 4,  /* executable segments per file of `unwind_files` */
	EMBER_UNWIND_FILES = 8192,       /* entries of `unwind_files`: a few files (copies, upgrades) per table slot */
};

/* How to find the caller's frame (the CFA, canonical frame address). */
enum ember_cfa_rule {
	EMBER_CFA_UNSUPPORTED = 0,   /* CFI ember cannot express here: stop, counted */
	EMBER_CFA_RSP = 1,           /* CFA = rsp + cfa_offset */
	EMBER_CFA_RBP = 2,           /* CFA = rbp + cfa_offset */
	EMBER_CFA_RBP_DEREF = 3,     /* CFA = *(rbp + (__s16)cfa_offset): realigned stack */
	EMBER_CFA_PLT = 4,           /* CFA = rsp + cfa_offset + ((rip & 15) >= rbp_offset) * 8 */
	EMBER_CFA_SIGNAL = 5,        /* signal trampoline: rsp points at the ucontext, its mcontext at rsp + 40 */
	EMBER_CFA_STOP = 6,          /* outermost frame (the entry point, thread entry): the stack ends here */
	EMBER_CFA_FRAME_POINTER = 7, /* no CFI covers this address: use the frame pointer */
};

/* Where the caller's rbp is. The return address is always at CFA - 8. */
enum ember_rbp_rule {
	EMBER_RBP_UNCHANGED = 0, /* rbp still holds the caller's value */
	EMBER_RBP_AT_CFA = 1,    /* saved at CFA + rbp_offset */
	EMBER_RBP_AT_RBP = 2,    /* saved at rbp + rbp_offset (realigned stack) */
	EMBER_RBP_UNKNOWN = 3,   /* not recoverable: frames above that need it stop */
};

/* 8 bytes, so a table costs 8 bytes per row plus 8 per page. */
struct ember_unwind_row {
	__u16 pc_low;     /* address & 0xfff of the row's first instruction */
	__u8 cfa_rule;    /* enum ember_cfa_rule */
	__u8 rbp_rule;    /* enum ember_rbp_rule */
	__u16 cfa_offset;
	__s16 rbp_offset; /* EMBER_CFA_PLT: the (rip & 15) threshold instead */
};

struct ember_unwind_page {
	__u32 first_row; /* index of the page's first row in the table's rows */
	__u32 row_count; /* >= 1 for every page of a table */
};

/*
 * A loaded table is a run of 8-byte slots: slot 0 is this header, slots
 * 1 .. page_count are the pages, the rows follow. It is stored as one BPF
 * array (an inner map of `unwind_tables`, created at its exact size and filled
 * through mmap) whose elements are chunks of EMBER_UNWIND_CHUNK_SLOTS slots:
 * lookups in an inner map are helper calls (not inlined), so the walker looks up
 * a chunk once and searches inside it, instead of one lookup per slot.
 */
struct ember_unwind_header {
	__u32 first_page; /* object address >> EMBER_UNWIND_PAGE_SHIFT of page 0 */
	__u32 page_count;
};

struct ember_unwind_chunk {
	__u64 slots[EMBER_UNWIND_CHUNK_SLOTS];
};

/*
 * A table's id, as ranges and `unwind_files` name it: its slot in the low
 * EMBER_UNWIND_SLOT_BITS and, above them, the slot's generation, which the agent
 * bumps each time it puts a table in the slot. The walker's row cache is keyed by
 * id, so a slot given to another object never serves the rows of the one before.
 */
#define EMBER_UNWIND_SLOT(id) ((id) & (EMBER_UNWIND_TABLES - 1))
/* A range whose object has no table: walk it by the frame pointer. No table's id. */
enum ember_table_none {
	EMBER_TABLE_NONE = 0xffffffff,
};

/* One executable mapping of a process. */
struct ember_unwind_range {
	__u64 start;  /* first address */
	__u64 bias;   /* the object's own address = pc - bias */
	__u32 len;    /* bytes */
	__u32 table;  /* the table's id (slot and generation), or EMBER_TABLE_NONE */
};

/* Bits of `ember_unwind_proc.flags`. */
enum ember_proc_flag {
	/* Written by the exec hook: ranges from the new memory map, not yet read by the agent. */
	EMBER_PROC_UNREAD = 1,
	/*
	 * Written by the agent: the process has a `py_procs` entry. The walker looks there only
	 * when it is set: a lookup of a pid the map lacks still costs a sample a cold page.
	 */
	EMBER_PROC_PYTHON = 2,
};

/* Value of the `unwind_procs` hash (key: tgid), written whole by the agent. */
struct ember_unwind_proc {
	__u32 count; /* ranges used, sorted by start, not overlapping */
	__u32 flags; /* enum ember_proc_flag bits */
	struct ember_unwind_range ranges[EMBER_UNWIND_RANGES];
};

/*
 * A file whose table is loaded, as the kernel names it (`unwind_files`): lets the
 * exec hook write a new program's ranges before it runs, and the walker add a
 * library mapped since the agent read the process, from the task's memory map.
 */
struct ember_unwind_file_key {
	__u64 dev; /* the kernel's dev_t of the file's filesystem: major << 20 | minor */
	__u64 ino;
};

/* An executable PT_LOAD segment: object address, file offset, bytes. */
struct ember_unwind_segment {
	__u64 vaddr;
	__u64 offset;
	__u64 size;
};

/*
 * The file's size and ctime when its table was built: an inode freed and reused by
 * another file differs in its ctime (which no one can set), and a file rewritten in
 * place in both. Either, and the sampler leaves the mapping to the frame pointer until
 * the agent has read the process.
 */
struct ember_unwind_file {
	__u32 table; /* the table's id (slot and generation) */
	__u32 count; /* segments used */
	__u64 size;
	__s64 ctime_sec;
	__u32 ctime_nsec;
	__u32 pad;
	struct ember_unwind_segment segments[EMBER_UNWIND_FILE_SEGMENTS];
};

#endif /* EMBER_CONTRACT_UNWIND_H */
