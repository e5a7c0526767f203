/* SPDX-License-Identifier: GPL-2.0 */
/*
 * One frame's unwind row, from the per-CPU row cache or its table, and the ways a
 * walk steps or stops that every unwinder shares (frame pointer, reads, the end).
 */
#ifndef EMBER_FRAME_BPF_H
#define EMBER_FRAME_BPF_H

#include "ranges.bpf.h"

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

#endif /* EMBER_FRAME_BPF_H */
