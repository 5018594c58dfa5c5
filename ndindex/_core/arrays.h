/* Whole-array kernels: permute, histogram, the k-way merge of compaction
 * steps, and the lower bound the query kernels share. */
#ifndef NDINDEX_ARRAYS_H
#define NDINDEX_ARRAYS_H
#include <stddef.h>
#include <stdint.h>

#include "query.h"

/* First index i in a[0..n) (sorted) with a[i] >= v (n if none). */
static inline size_t lower_bound_u64(const uint64_t *a, size_t n, uint64_t v) {
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

/* out[i] = the permutation of in[i] (in and out may alias). */
void permute_u64(const perm_runs *r, const uint64_t *in, uint64_t *out, size_t n);

/* counts[h] += number of i >= 1 whose delta with a[i-1] has its leading
 * 1-bit at h; delta is a[i] - a[i-1] (coding 1) or a[i] ^ a[i-1] (coding 0).
 * Equal neighbours are not counted. */
void delta_histogram(const uint64_t *a, size_t n, int coding, uint64_t counts[64]);

/* Merge k <= 64 sorted arrays (each strictly increasing) into out,
 * dropping repeats and every value of the sorted array hide; returns the
 * count, or (size_t)-1 when k > 64 or memory runs out.  out must hold the
 * sum of the lengths. */
size_t merge_unique_u64(const uint64_t *const *runs, const size_t *lens, int k,
                        const uint64_t *hide, size_t nhide, uint64_t *out);

#endif
