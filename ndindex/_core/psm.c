/* Probabilistic simhash matching kernels: see psm.h. */
#include "psm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "arrays.h"
#include "codec.h" /* HOT_KERNEL */

/* Headers probed together, their directory slots prefetched first. */
#define PSM_PROBE_GROUP 64

/* ---------------------------------------------------------------- VOSH */

static double log_odds(double p) {
    if (p < VOSH_P_MIN)
        p = VOSH_P_MIN;
    if (p > VOSH_P_MAX)
        p = VOSH_P_MAX;
    return log(p) - log1p(-p);
}

/* Sum of the log-odds of a set in increasing rank order (vosh._key). */
static double set_key(const double *logits, uint64_t set) {
    double key = 0.0;
    for (; set; set &= set - 1)
        key += logits[__builtin_ctzll(set)];
    return key;
}

/* Whether a pops before b: larger key, then smaller size, then the
 * lexicographically smaller rank tuple (the lowest rank where they differ
 * belongs to a), exactly as Python compares (-key, h, ranks). */
static inline int before(const vosh_node *a, const vosh_node *b) {
    if (a->key != b->key)
        return a->key > b->key;
    int ha = popcount64(a->set), hb = popcount64(b->set);
    if (ha != hb)
        return ha < hb;
    uint64_t x = a->set ^ b->set;
    return x && ((a->set >> __builtin_ctzll(x)) & 1);
}

static int heap_push(vosh_heap *v, double key, uint64_t set) {
    if (v->len == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 64;
        vosh_node *h = realloc(v->heap, cap * sizeof *h);
        if (!h)
            return PSM_NOMEM;
        v->heap = h;
        v->cap = cap;
    }
    vosh_node node = {key, set};
    size_t i = v->len++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(&node, &v->heap[parent]))
            break;
        v->heap[i] = v->heap[parent];
        i = parent;
    }
    v->heap[i] = node;
    return 0;
}

static vosh_node heap_pop(vosh_heap *v) {
    vosh_node top = v->heap[0], last = v->heap[--v->len];
    size_t i = 0, n = v->len;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && before(&v->heap[c + 1], &v->heap[c]))
            c++;
        if (!before(&v->heap[c], &last))
            break;
        v->heap[i] = v->heap[c];
        i = c;
    }
    if (n)
        v->heap[i] = last;
    return top;
}

int vosh_init(vosh_heap *v, const double *probs, const uint8_t *positions, int n, int kmin,
              int kmax) {
    memset(v, 0, sizeof *v);
    v->n = n;
    /* Stable insertion sort by log-odds, largest first (numpy's stable
     * argsort of -logits in vosh.py): equal values keep input order. */
    for (int i = 0; i < n; i++) {
        double l = log_odds(probs[i]);
        int j = i;
        for (; j > 0 && v->logits[j - 1] < l; j--) {
            v->logits[j] = v->logits[j - 1];
            v->pos[j] = v->pos[j - 1];
        }
        v->logits[j] = l;
        v->pos[j] = positions[i];
    }
    if (kmax > n)
        kmax = n;
    for (int h = kmin < 0 ? 0 : kmin; h <= kmax; h++) {
        uint64_t root = h == 64 ? ~0ull : (1ull << h) - 1;
        if (heap_push(v, set_key(v->logits, root), root) < 0)
            return PSM_NOMEM;
    }
    return 0;
}

int vosh_next(vosh_heap *v, uint64_t *mask) {
    if (v->len == 0)
        return 0;
    vosh_node node = heap_pop(v);
    uint64_t s = node.set, m = 0;
    for (uint64_t t = s; t; t &= t - 1)
        m |= 1ull << v->pos[__builtin_ctzll(t)];
    *mask = m;
    if (s == 0)
        return 1;
    /* ProduceChildren (vosh.produce_children). */
    int top = 63 - __builtin_clzll(s);
    if (top + 1 < v->n) {
        uint64_t left = s ^ (1ull << top) ^ (1ull << (top + 1));
        if (heap_push(v, set_key(v->logits, left), left) < 0)
            return PSM_NOMEM;
    }
    /* The final run of consecutive ranks ends at top; z is the gap just
     * below it, and the element before the run must sit at z - 1. */
    uint64_t gaps = ~s & ((1ull << top) - 1);
    if (gaps) {
        int z = 63 - __builtin_clzll(gaps);
        if (z >= 1 && ((s >> (z - 1)) & 1)) {
            uint64_t right = s ^ (1ull << (z - 1)) ^ (1ull << z);
            if (heap_push(v, set_key(v->logits, right), right) < 0)
                return PSM_NOMEM;
        }
    }
    return 1;
}

void vosh_free(vosh_heap *v) {
    free(v->heap);
    v->heap = NULL;
    v->len = v->cap = 0;
}

/* ---------------------------------------------------------------- probes */

static int reserve(psm_results *r, size_t extra) {
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
    uint64_t *q = realloc(r->q, cap * sizeof *q);
    if (q)
        r->q = q;
    if (!fp || !dist || !q)
        return PSM_NOMEM;
    r->cap = cap;
    return 0;
}

void psm_results_free(psm_results *r) {
    free(r->fp);
    free(r->dist);
    free(r->q);
    memset(r, 0, sizeof *r);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static inline uint64_t header_of(uint64_t x, int p) {
    return p ? x >> (64 - p) : 0;
}

/* Sort the matches r[start..] by value, drop repeats, then order them by
 * distance, values ascending within one (stable counting sort). */
static int order_matches(psm_results *r, size_t start, uint64_t q) {
    size_t n = r->n - start;
    uint64_t *fp = r->fp + start;
    if (n > 32) {
        qsort(fp, n, sizeof *fp, cmp_u64);
    } else {
        for (size_t i = 1; i < n; i++) { /* a query finds a handful: insertion sort */
            uint64_t v = fp[i];
            size_t j = i;
            for (; j > 0 && fp[j - 1] > v; j--)
                fp[j] = fp[j - 1];
            fp[j] = v;
        }
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (i == 0 || fp[i] != fp[m - 1])
            fp[m++] = fp[i];
    if (m > 1) {
        uint64_t *tmp = malloc(m * sizeof *tmp);
        if (!tmp)
            return PSM_NOMEM;
        size_t pos[66] = {0};
        for (size_t i = 0; i < m; i++)
            pos[popcount64(fp[i] ^ q) + 1]++;
        for (int d = 0; d < 65; d++)
            pos[d + 1] += pos[d];
        for (size_t i = 0; i < m; i++)
            tmp[pos[popcount64(fp[i] ^ q)]++] = fp[i];
        memcpy(fp, tmp, m * sizeof *tmp);
        free(tmp);
    }
    for (size_t i = 0; i < m; i++)
        r->dist[start + i] = (uint8_t)popcount64(fp[i] ^ q);
    r->n = start + m;
    return 0;
}

/* Append the values within k of q among those with header h. */
static inline int probe_one(const psm_table *t, uint64_t q, int k, uint64_t h, uint64_t tag,
                            psm_results *out) {
    uint64_t lo = t->p ? h << (64 - t->p) : 0, hi = lo | (t->p ? ~0ull >> t->p : ~0ull);
    uint64_t bucket = t->b ? h >> (t->p - t->b) : 0;
    size_t i = t->dir[bucket], end = t->dir[bucket + 1];
    if (t->b < t->p) /* the bucket holds several headers: find ours */
        i += lower_bound_u64(t->vals + i, end - i, lo);
    for (; i < end && t->vals[i] <= hi; i++) {
        if (popcount64(t->vals[i] ^ q) <= k) {
            if (reserve(out, 1) < 0)
                return PSM_NOMEM;
            out->fp[out->n] = t->vals[i];
            out->q[out->n] = tag;
            out->n++;
        }
    }
    return 0;
}

/* Probe a group of headers: their directory slots are prefetched first, so
 * the group's cache misses overlap instead of queueing one after another
 * (a probe of a large table is a miss on the directory, then on the values). */
HOT_KERNEL static int probe_group(const psm_table *t, uint64_t q, int k,
                                  const uint64_t *headers, size_t n, uint64_t tag,
                                  psm_results *out) {
    uint64_t limit = t->p ? ~0ull >> (64 - t->p) : 0;
    for (size_t i = 0; i < n; i++)
        if (headers[i] <= limit)
            __builtin_prefetch(&t->dir[t->b ? headers[i] >> (t->p - t->b) : 0]);
    for (size_t i = 0; i < n; i++)
        if (headers[i] <= limit && probe_one(t, q, k, headers[i], tag, out) < 0)
            return PSM_NOMEM;
    return 0;
}

HOT_KERNEL int psm_probe(const psm_table *t, uint64_t q, int k, const uint64_t *headers,
                         size_t nheaders, uint64_t tag, psm_results *out) {
    size_t start = out->n;
    for (size_t i = 0; i < nheaders; i += PSM_PROBE_GROUP) {
        size_t g = nheaders - i < PSM_PROBE_GROUP ? nheaders - i : PSM_PROBE_GROUP;
        if (probe_group(t, q, k, headers + i, g, tag, out) < 0)
            return PSM_NOMEM;
    }
    return order_matches(out, start, q);
}

/* The heap over q's header bits (ascending positions 64-p..63), sizes 0..k. */
static int header_heap(vosh_heap *v, const double *probs, int p, int k) {
    uint8_t positions[64];
    for (int i = 0; i < p; i++)
        positions[i] = (uint8_t)(64 - p + i);
    return vosh_init(v, probs + 64 - p, positions, p, 0, k);
}

long psm_headers(uint64_t q, const double *probs, int p, int k, size_t max_out, uint64_t *out) {
    vosh_heap v;
    long n = 0;
    int rc = header_heap(&v, probs, p, k);
    uint64_t mask;
    while (rc == 0 && (size_t)n < max_out && (rc = vosh_next(&v, &mask)) == 1) {
        out[n++] = header_of(q ^ mask, p);
        rc = 0;
    }
    vosh_free(&v);
    return rc < 0 ? rc : n;
}

int psm_query(const psm_table *t, uint64_t q, const double *probs, int k, size_t max_probes,
              uint64_t tag, psm_results *out, size_t *probes) {
    /* Headers leave the heap a group at a time: memory stays bounded by the
     * group whatever max_probes is, and each group's probes overlap their
     * misses (probing each header as it left the heap was slower: every miss
     * waited behind the heap work before it). */
    size_t start = out->n, n = 0;
    uint64_t group[PSM_PROBE_GROUP], mask;
    vosh_heap v;
    int rc = header_heap(&v, probs, t->p, k), more = 1;
    while (rc == 0 && more && n < max_probes) {
        size_t g = 0;
        while (g < PSM_PROBE_GROUP && n + g < max_probes && (more = vosh_next(&v, &mask)) == 1)
            group[g++] = header_of(q ^ mask, t->p);
        if (more < 0)
            rc = more;
        else
            rc = probe_group(t, q, k, group, g, tag, out);
        n += g;
    }
    vosh_free(&v);
    *probes = n;
    if (rc < 0) {
        out->n = start;
        return rc;
    }
    return order_matches(out, start, q);
}

/* First index i >= from with header(a[i]) >= h: galloping, since the next
 * header is usually near but may lie far ahead in a large chunk. */
static size_t seek_header(const uint64_t *a, size_t n, size_t from, uint64_t h, int p) {
    size_t step = 1, lo = from, hi = from;
    while (hi < n && header_of(a[hi], p) < h) {
        lo = hi + 1;
        hi = from + step;
        step *= 2;
    }
    if (hi > n)
        hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (header_of(a[mid], p) < h)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

HOT_KERNEL int psm_join(const uint64_t *eh, const uint64_t *eq, size_t ne, const uint64_t *fps,
                        size_t nf, int p, int k, int skip_equal, psm_results *out) {
    size_t j = 0, end = 0;
    for (size_t i = 0; i < ne; i++) {
        if (i == 0 || eh[i] != eh[i - 1]) {
            /* headers ascend, so the next range starts at or after this one's end */
            j = seek_header(fps, nf, end, eh[i], p);
            for (end = j; end < nf && header_of(fps[end], p) == eh[i];)
                end++;
        }
        uint64_t q = eq[i];
        for (size_t c = j; c < end; c++) {
            int d = popcount64(fps[c] ^ q);
            if (d > k || (skip_equal && fps[c] == q))
                continue;
            if (reserve(out, 1) < 0)
                return PSM_NOMEM;
            out->q[out->n] = q;
            out->fp[out->n] = fps[c];
            out->dist[out->n] = (uint8_t)d;
            out->n++;
        }
    }
    return 0;
}
