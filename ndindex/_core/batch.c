/* Batch join kernel: see batch.h.
 *
 * Tables are taken one at a time over the whole chunk of F, so one table's
 * directory and values stay in cache while it is probed.  Probes run in
 * groups: the directory slots of a group are prefetched, then its bucket
 * starts, then the buckets are scanned, so a group's cache misses overlap
 * instead of queueing one after another (a probe of a 1M-entry table is two
 * dependent misses: the directory, then the bucket). */
#include "batch.h"

#include <stdlib.h>
#include <string.h>

#include "codec.h" /* HOT_KERNEL */

/* Probes in flight per group; 16-32 covers the misses a core can overlap. */
#define BATCH_GROUP 32

static int reserve(batch_pairs *r, size_t extra) {
    if (r->n + extra <= r->cap)
        return 0;
    size_t cap = r->cap ? r->cap : 256;
    while (cap < r->n + extra)
        cap *= 2;
    uint64_t *q = realloc(r->q, cap * sizeof *q);
    if (q)
        r->q = q;
    uint64_t *f = realloc(r->f, cap * sizeof *f);
    if (f)
        r->f = f;
    uint8_t *d = realloc(r->dist, cap * sizeof *d);
    if (d)
        r->dist = d;
    if (!q || !f || !d)
        return BATCH_NOMEM;
    r->cap = cap;
    return 0;
}

void batch_pairs_free(batch_pairs *r) {
    free(r->q);
    free(r->f);
    free(r->dist);
    memset(r, 0, sizeof *r);
}

static inline uint64_t bucket_of(uint64_t permuted, int b) {
    return b ? permuted >> (64 - b) : 0;
}

HOT_KERNEL int batch_probe(const batch_table *tables, int ntables, const uint64_t *fps,
                           size_t nf, int k, int self_join, batch_pairs *out) {
    uint64_t fp[BATCH_GROUP];
    uint32_t lo[BATCH_GROUP], hi[BATCH_GROUP];
    size_t h[BATCH_GROUP];
    for (int j = 0; j < ntables; j++) {
        const batch_table *tb = &tables[j];
        const uint64_t *vals = tb->vals;
        const uint32_t *dir = tb->dir;
        for (size_t base = 0; base < nf; base += BATCH_GROUP) {
            size_t g = nf - base < BATCH_GROUP ? nf - base : BATCH_GROUP;
            for (size_t i = 0; i < g; i++) {
                fp[i] = perm_apply(&tb->fwd, fps[base + i]);
                h[i] = (size_t)bucket_of(fp[i], tb->b);
                __builtin_prefetch(&dir[h[i]]);
            }
            for (size_t i = 0; i < g; i++) {
                lo[i] = dir[h[i]];
                hi[i] = dir[h[i] + 1];
                __builtin_prefetch(&vals[lo[i]]);
            }
            for (size_t i = 0; i < g; i++) {
                for (uint32_t c = lo[i]; c < hi[i]; c++) {
                    if (__builtin_popcountll(vals[c] ^ fp[i]) > k)
                        continue;
                    /* A match: rare, so the checks below cost nothing overall. */
                    uint64_t f = fps[base + i];
                    uint64_t q = perm_apply(&tb->inv, vals[c]);
                    uint64_t diff = q ^ f;
                    if ((self_join && q >= f) || (diff & tb->mask))
                        continue;
                    int earlier = 0;
                    for (int e = 0; e < j && !earlier; e++)
                        earlier = (diff & tables[e].mask) == 0;
                    if (earlier)
                        continue;
                    if (reserve(out, 1) < 0)
                        return BATCH_NOMEM;
                    out->q[out->n] = q;
                    out->f[out->n] = f;
                    out->dist[out->n] = (uint8_t)__builtin_popcountll(diff);
                    out->n++;
                }
            }
        }
    }
    return 0;
}
