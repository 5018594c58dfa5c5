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


/* Merge two strictly increasing arrays, equal values once; branch-light. */
static size_t merge2(const uint64_t *a, size_t na, const uint64_t *b, size_t nb, uint64_t *out) {
    size_t i = 0, j = 0, m = 0;
    while (i < na && j < nb) {
        uint64_t x = a[i], y = b[j];
        out[m++] = x < y ? x : y;
        i += x <= y;
        j += y <= x;
    }
    while (i < na)
        out[m++] = a[i++];
    while (j < nb)
        out[m++] = b[j++];
    return m;
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
     * buffer so that each value moves once per fold. */
    size_t total = 0;
    for (int i = 0; i < k; i++)
        total += lens[i];
    uint64_t *tmp = k > 2 ? malloc(total * sizeof *tmp) : NULL;
    if (k > 2 && !tmp)
        return (size_t)-1;
    /* Each fold after the first flips buffers (k - 2 flips): start in the
     * one that ends as out. */
    uint64_t *cur = (k % 2 == 0) ? out : tmp, *other = (k % 2 == 0) ? tmp : out;
    m = merge2(runs[0], lens[0], runs[1], lens[1], cur);
    for (int i = 2; i < k; i++) {
        m = merge2(cur, m, runs[i], lens[i], other);
        uint64_t *t = cur;
        cur = other;
        other = t;
    }
    free(tmp);
    return drop_hidden_u64(out, m, hide, nhide);
}
