#include "arrays.h"

#include <stdlib.h>
#include <string.h>


void permute_u64(const perm_runs *r, const uint64_t *in, uint64_t *out, size_t n) {
    for (size_t i = 0; i < n; i++)
        out[i] = perm_apply(r, in[i]);
}

void delta_histogram(const uint64_t *a, size_t n, int coding, uint64_t counts[64]) {
    for (size_t i = 1; i < n; i++) {
        uint64_t d = coding ? a[i] - a[i - 1] : a[i] ^ a[i - 1];
        if (d)
            counts[63 - __builtin_clzll(d)]++;
    }
}


/* Merge two strictly increasing arrays, equal values once; branch-light.
 * Each step's loads wait on the step before (which array advanced), about
 * 4 ns a value: merge2 below runs two of these chains side by side. */
static size_t merge2_chain(const uint64_t *a, size_t na, const uint64_t *b, size_t nb,
                           uint64_t *out) {
    size_t i = 0, j = 0, m = 0;
    while (i < na && j < nb) {
        uint64_t x = a[i], y = b[j];
        out[m++] = x < y ? x : y;
        i += x <= y;
        j += y <= x;
    }
    memcpy(out + m, a + i, (na - i) * sizeof *out);
    m += na - i;
    memcpy(out + m, b + j, (nb - j) * sizeof *out);
    return m + nb - j;
}

/* merge2_chain in two halves at once: the values below the longer array's
 * middle value v, and those from v on (equal values fall on one side).
 * The halves' chains are independent, so the CPU overlaps them: 1.7-1.9x
 * as fast on random values (tools/bench/bench_merge.py, two equal runs).
 * The upper half is written where it would start were there no equal
 * pairs below v, and moved down if there were. */
static size_t merge2(const uint64_t *a, size_t na, const uint64_t *b, size_t nb, uint64_t *out) {
    if (na < nb) {
        const uint64_t *t = a;
        a = b;
        b = t;
        size_t n = na;
        na = nb;
        nb = n;
    }
    if (nb < 64)
        return merge2_chain(a, na, b, nb, out);
    size_t ha = na / 2, hb = lower_bound_u64(b, nb, a[ha]);
    const uint64_t *a2 = a + ha, *b2 = b + hb;
    size_t na2 = na - ha, nb2 = nb - hb;
    uint64_t *out2 = out + ha + hb;
    size_t i = 0, j = 0, m = 0, i2 = 0, j2 = 0, m2 = 0;
    while (i < ha && j < hb && i2 < na2 && j2 < nb2) {
        uint64_t x = a[i], y = b[j], x2 = a2[i2], y2 = b2[j2];
        out[m++] = x < y ? x : y;
        out2[m2++] = x2 < y2 ? x2 : y2;
        i += x <= y;
        j += y <= x;
        i2 += x2 <= y2;
        j2 += y2 <= x2;
    }
    m2 += merge2_chain(a2 + i2, na2 - i2, b2 + j2, nb2 - j2, out2 + m2);
    m += merge2_chain(a + i, ha - i, b + j, hb - j, out + m);
    if (m < ha + hb)
        memmove(out + m, out2, m2 * sizeof *out);
    return m + m2;
}

/* Drop from a[0:n] (sorted) every value of hide (sorted); in place. */
static size_t drop_hidden_u64(uint64_t *a, size_t n, const uint64_t *hide, size_t nhide) {
    if (!nhide)
        return n;
    size_t m = 0, h = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t v = a[i];
        while (h < nhide && hide[h] < v)
            h++;
        if (h < nhide && hide[h] == v)
            continue;
        a[m++] = v;
    }
    return m;
}

size_t merge_unique_u64(const uint64_t *const *runs, const size_t *lens, int k,
                        const uint64_t *hide, size_t nhide, uint64_t *out) {
    size_t m = 0;
    if (k <= 0)
        return 0;
    if (k == 1) {
        memcpy(out, runs[0], lens[0] * sizeof *out);
        return drop_hidden_u64(out, lens[0], hide, nhide);
    }
    /* Fold the runs in pairwise, ping-ponging between out and a scratch
     * buffer so that each value moves once per fold, the shortest runs
     * first: a value moves once for every fold after its run's, so a long
     * run folded in first moved k - 1 times (a merge step of level-1 runs
     * into a level-2 run, largest first, moved about twice what it keeps). */
    int order[64];
    if (k > 64)
        return (size_t)-1;
    size_t total = 0;
    for (int i = 0; i < k; i++) {
        int j = i;
        for (; j > 0 && lens[order[j - 1]] > lens[i]; j--)
            order[j] = order[j - 1];
        order[j] = i;
        total += lens[i];
    }
    uint64_t *tmp = k > 2 ? malloc(total * sizeof *tmp) : NULL;
    if (k > 2 && !tmp)
        return (size_t)-1;
    /* Each fold after the first flips buffers (k - 2 flips): start in the
     * one that ends as out. */
    uint64_t *cur = (k % 2 == 0) ? out : tmp, *other = (k % 2 == 0) ? tmp : out;
    m = merge2(runs[order[0]], lens[order[0]], runs[order[1]], lens[order[1]], cur);
    for (int i = 2; i < k; i++) {
        m = merge2(cur, m, runs[order[i]], lens[order[i]], other);
        uint64_t *t = cur;
        cur = other;
        other = t;
    }
    free(tmp);
    return drop_hidden_u64(out, m, hide, nhide);
}
