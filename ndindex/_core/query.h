/* k-Hamming queries over a snapshot of an index: every table's blocks (read
 * in place from the mapped file) and its in-memory sorted log. */
#ifndef NDINDEX_QUERY_H
#define NDINDEX_QUERY_H
#include <stddef.h>
#include <stdint.h>

#include "codec.h"

/* A permutation as runs: out |= ((x >> src) & mask) << dst. */
typedef struct {
    int n;
    uint8_t src[64], dst[64];
    uint64_t mask[64];
} perm_runs;

typedef struct {
    int p; /* prefix bits probed */
    perm_runs fwd, inv;
    uint64_t orig_mask; /* the prefix bits, at their unpermuted positions */
    const codec_code *code;
    size_t nblocks;
    const uint64_t *keys;       /* last (permuted) value of each block */
    const uint64_t *block_addr; /* address of each 1024-byte block */
    size_t nlog;
    const uint64_t *log; /* permuted log values, sorted */
    /* When the table is preloaded: all its values, decoded and sorted; the
     * blocks are then not read. */
    size_t ndecoded;
    const uint64_t *decoded;
    const uint64_t *offsets; /* decoded index of each block's first value, nblocks + 1 */
} query_table;

typedef struct {
    int ntables;
    size_t nremoved;
    const uint64_t *removed; /* sorted, unpermuted: never reported */
    query_table *tables;
} query_snapshot;

/* A growable result list. */
typedef struct {
    uint64_t *fp;
    uint8_t *dist;
    int64_t *qidx;
    size_t n, cap;
} query_results;

static inline uint64_t perm_apply(const perm_runs *r, uint64_t x) {
    uint64_t out = 0;
    for (int i = 0; i < r->n; i++)
        out |= ((x >> r->src[i]) & r->mask[i]) << r->dst[i];
    return out;
}

/* Append the matches of q within k, distinct, sorted by (distance, value),
 * tagged with qidx.  Returns 0, or a negative codec status with *bad_table
 * and *bad_block naming the corrupt block, or -100 when out of memory. */
int query_one(const query_snapshot *s, uint64_t q, int k, int64_t qidx, query_results *out,
              int *bad_table, size_t *bad_block);

void query_results_free(query_results *r);

#endif
