/* Batch join kernel (Manku et al. 3.3): stored fingerprints F probed against
 * permuted, sorted tables built over a query set Q held in memory. */
#ifndef NDINDEX_BATCH_H
#define NDINDEX_BATCH_H
#include <stddef.h>
#include <stdint.h>

#include "query.h"

/* One table over Q.  vals holds perm(Q) sorted; dir[h] is the first index
 * of vals whose top b bits are >= h (dir[2^b] = n), so the entries sharing
 * f's top b bits are vals[dir[h] .. dir[h+1]).  b <= p: a bucket may hold
 * entries that share only b of the p prefix bits; the dedupe rule below
 * drops their pairs here, and the table that does cover them reports them. */
typedef struct {
    int p, b;
    perm_runs fwd, inv;
    uint64_t mask; /* the prefix bits, at their unpermuted positions */
    size_t n;
    const uint64_t *vals;
    const uint32_t *dir;
} batch_table;

/* A growable list of pairs. */
typedef struct {
    uint64_t *q, *f;
    uint8_t *dist;
    size_t n, cap;
} batch_pairs;

#define BATCH_NOMEM (-100)

/* Append every pair (q, f, popcount(q ^ f)) with q in Q, f in fps and
 * distance <= k, once: table j reports a pair only when j is the first table
 * whose prefix q and f share.  With self_join, only pairs with q < f.
 * Returns 0 or BATCH_NOMEM (out keeps the pairs found before). */
int batch_probe(const batch_table *tables, int ntables, const uint64_t *fps, size_t nf, int k,
                int self_join, int sort_bits, batch_pairs *out);

void batch_pairs_free(batch_pairs *r);

#endif
