#include "query.h"

#include <stdlib.h>
#include <string.h>

#define QUERY_NOMEM (-100)

static int reserve(query_results *r, size_t extra) {
    if (r->n + extra <= r->cap)
        return 0;
    size_t cap = r->cap ? r->cap : 64;
    while (cap < r->n + extra)
        cap *= 2;
    uint64_t *fp = realloc(r->fp, cap * sizeof *fp);
    if (fp)
        r->fp = fp;
    uint8_t *dist = realloc(r->dist, cap * sizeof *dist);
    if (dist)
        r->dist = dist;
    int64_t *qidx = realloc(r->qidx, cap * sizeof *qidx);
    if (qidx)
        r->qidx = qidx;
    if (!fp || !dist || !qidx)
        return QUERY_NOMEM;
    r->cap = cap;
    return 0;
}

void query_results_free(query_results *r) {
    free(r->fp);
    free(r->dist);
    free(r->qidx);
    memset(r, 0, sizeof *r);
}

/* First index i with a[i] >= v (n if none). */
static inline size_t lower_bound(const uint64_t *a, size_t n, uint64_t v) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int contains(const uint64_t *a, size_t n, uint64_t v) {
    size_t i = lower_bound(a, n, v);
    return i < n && a[i] == v;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Append a candidate v (unpermuted) found by table t, unless an earlier
 * table finds it too: every table holds the same values, and table i finds
 * v exactly when v agrees with q on table i's prefix bits, so the first
 * such table reports it and no duplicates need removing later. */
static int add_candidate(const query_snapshot *s, int t, uint64_t q, query_results *r,
                         uint64_t v) {
    uint64_t x = v ^ q;
    for (int i = 0; i < t; i++)
        if ((x & s->tables[i].orig_mask) == 0)
            return 0;
    if (reserve(r, 1) < 0)
        return QUERY_NOMEM;
    r->fp[r->n++] = v;
    return 0;
}

HOT_KERNEL int query_one(const query_snapshot *s, uint64_t q, int k, int64_t qidx,
                         query_results *out, int *bad_table, size_t *bad_block) {
    size_t start = out->n;
    uint64_t found[1 + BLOCK_PAYLOAD_BITS];
    for (int t = 0; t < s->ntables; t++) {
        const query_table *tb = &s->tables[t];
        uint64_t qp = perm_apply(&tb->fwd, q);
        uint64_t mask = tb->p <= 0 ? 0 : (tb->p >= 64 ? ~0ull : ~0ull << (64 - tb->p));
        uint64_t lo = qp & mask, hi = lo | ~mask;
        if (tb->decoded) {
            /* The block directory (small, cache-resident) narrows the search
             * to one block's slice before touching the large array. */
            size_t b = lower_bound(tb->keys, tb->nblocks, lo), i = tb->ndecoded;
            if (b < tb->nblocks)
                i = tb->offsets[b] + lower_bound(tb->decoded + tb->offsets[b],
                                                 tb->offsets[b + 1] - tb->offsets[b], lo);
            for (; i < tb->ndecoded && tb->decoded[i] <= hi; i++)
                if (__builtin_popcountll(tb->decoded[i] ^ qp) <= k)
                    if (add_candidate(s, t, q, out, perm_apply(&tb->inv, tb->decoded[i])) < 0)
                        return QUERY_NOMEM;
        }
        for (size_t b = tb->decoded ? tb->nblocks : lower_bound(tb->keys, tb->nblocks, lo);
             b < tb->nblocks; b++) {
            long n = codec_probe(tb->code, (const uint8_t *)(uintptr_t)tb->block_addr[b], qp,
                                 tb->p, k, found, sizeof found / sizeof found[0]);
            if (n < 0) {
                *bad_table = t;
                *bad_block = b;
                out->n = start;
                return (int)n;
            }
            for (long i = 0; i < n; i++)
                if (add_candidate(s, t, q, out, perm_apply(&tb->inv, found[i])) < 0)
                    return QUERY_NOMEM;
            if (tb->keys[b] >= hi)
                break;
        }
        for (size_t i = lower_bound(tb->log, tb->nlog, lo); i < tb->nlog && tb->log[i] <= hi; i++)
            if (__builtin_popcountll(tb->log[i] ^ qp) <= k)
                if (add_candidate(s, t, q, out, perm_apply(&tb->inv, tb->log[i])) < 0)
                    return QUERY_NOMEM;
    }
    /* Distinct across tables (add_candidate); one table can still find a
     * value in its blocks and in its log, so drop neighbours that repeat and
     * the removed, then order by (distance, value). */
    size_t n = out->n - start;
    uint64_t *fp = out->fp + start;
    if (n <= 32) {
        /* A query finds a handful of candidates: insertion sort beats qsort's
         * callback per comparison. */
        for (size_t i = 1; i < n; i++) {
            uint64_t v = fp[i];
            size_t j = i;
            for (; j > 0 && fp[j - 1] > v; j--)
                fp[j] = fp[j - 1];
            fp[j] = v;
        }
    } else {
        qsort(fp, n, sizeof *fp, cmp_u64);
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && fp[i] == fp[i - 1])
            continue;
        if (s->nremoved && contains(s->removed, s->nremoved, fp[i]))
            continue;
        fp[m++] = fp[i];
    }
    /* Stable counting sort by distance keeps values ascending within one. */
    size_t bucket[65] = {0};
    for (size_t i = 0; i < m; i++)
        bucket[__builtin_popcountll(fp[i] ^ q)]++;
    if (m > 1) {
        uint64_t small[64];
        uint64_t *tmp = m <= 64 ? small : malloc(m * sizeof *tmp);
        if (!tmp)
            return QUERY_NOMEM;
        size_t pos[65], acc = 0;
        for (int d = 0; d <= 64; d++) {
            pos[d] = acc;
            acc += bucket[d];
        }
        for (size_t i = 0; i < m; i++)
            tmp[pos[__builtin_popcountll(fp[i] ^ q)]++] = fp[i];
        memcpy(fp, tmp, m * sizeof *fp);
        if (tmp != small)
            free(tmp);
    }
    for (size_t i = 0; i < m; i++) {
        out->dist[start + i] = (uint8_t)__builtin_popcountll(fp[i] ^ q);
        out->qidx[start + i] = qidx;
    }
    out->n = start + m;
    return 0;
}
