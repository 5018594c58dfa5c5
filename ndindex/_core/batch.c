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

/* Scan one bucket pair: fps[i] is f's permuted value in table j.  Reports
 * pairs of vals[lo..hi) within k under the first-table rule. */
static inline int scan_bucket(const batch_table *tables, int j, uint64_t fpj, uint32_t lo,
                              uint32_t hi, int k, int self_join, batch_pairs *out) {
    const batch_table *tb = &tables[j];
    /* Nearly every bucket holds no match: test the whole bucket without
     * branches first (the loop runs at about one popcount a cycle). */
    int any = 0;
    for (uint32_t c = lo; c < hi; c++)
        any |= popcount64(tb->vals[c] ^ fpj) <= k;
    if (!any)
        return 0;
    for (uint32_t c = lo; c < hi; c++) {
        if (popcount64(tb->vals[c] ^ fpj) > k)
            continue;
        /* A match: rare, so the checks below cost nothing overall. */
        uint64_t f = perm_apply(&tb->inv, fpj);
        uint64_t q = perm_apply(&tb->inv, tb->vals[c]);
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
        out->dist[out->n] = (uint8_t)popcount64(diff);
        out->n++;
    }
    return 0;
}

/* LSD radix sort of a[0..n) on its top `bits` bits, 8 bits a pass; tmp is
 * scratch of n.  The result is in a. */
static void sort_by_top(uint64_t *a, uint64_t *tmp, size_t n, int bits) {
    for (int done = 0; done < bits; done += 8) {
        int shift = 64 - bits + done;
        size_t count[257] = {0};
        for (size_t i = 0; i < n; i++)
            count[((a[i] >> shift) & 0xff) + 1]++;
        for (int d = 0; d < 256; d++)
            count[d + 1] += count[d];
        for (size_t i = 0; i < n; i++)
            tmp[count[(a[i] >> shift) & 0xff]++] = a[i];
        uint64_t *t = a;
        a = tmp;
        tmp = t;
        if (done + 8 >= bits && ((bits + 7) / 8) % 2 == 1)
            memcpy(tmp, a, n * sizeof *a); /* odd pass count: copy back */
    }
}

HOT_KERNEL int batch_probe(const batch_table *tables, int ntables, const uint64_t *fps,
                           size_t nf, int k, int self_join, int sort_bits, batch_pairs *out) {
    uint64_t *perm = NULL, *tmp = NULL;
    if (sort_bits > 0 && nf > 1) {
        perm = malloc(nf * sizeof *perm);
        tmp = malloc(nf * sizeof *tmp);
        if (!perm || !tmp) {
            free(perm);
            free(tmp);
            return BATCH_NOMEM;
        }
    }
    uint64_t fp[BATCH_GROUP];
    uint32_t lo[BATCH_GROUP], hi[BATCH_GROUP];
    size_t h[BATCH_GROUP];
    int rc = 0;
    for (int j = 0; j < ntables && rc == 0; j++) {
        const batch_table *tb = &tables[j];
        const uint32_t *dir = tb->dir;
        const uint64_t *src = fps;
        if (perm) {
            /* Probing in order of the table's prefix turns random reads of
             * the directory and the buckets into one forward sweep. */
            for (size_t i = 0; i < nf; i++)
                perm[i] = perm_apply(&tb->fwd, fps[i]);
            sort_by_top(perm, tmp, nf, sort_bits < tb->b ? sort_bits : tb->b);
            src = perm;
        }
        for (size_t base = 0; base < nf && rc == 0; base += BATCH_GROUP) {
            size_t g = nf - base < BATCH_GROUP ? nf - base : BATCH_GROUP;
            for (size_t i = 0; i < g; i++) {
                fp[i] = perm ? src[base + i] : perm_apply(&tb->fwd, src[base + i]);
                h[i] = (size_t)bucket_of(fp[i], tb->b);
                __builtin_prefetch(&dir[h[i]]);
            }
            for (size_t i = 0; i < g; i++) {
                lo[i] = dir[h[i]];
                hi[i] = dir[h[i] + 1];
                __builtin_prefetch(&tb->vals[lo[i]]);
            }
            for (size_t i = 0; i < g && rc == 0; i++)
                rc = scan_bucket(tables, j, fp[i], lo[i], hi[i], k, self_join, out);
        }
    }
    free(perm);
    free(tmp);
    return rc;
}
