/* Whole-array kernels used when tables are built: permute, histogram. */
#ifndef NDINDEX_ARRAYS_H
#define NDINDEX_ARRAYS_H
#include <stddef.h>
#include <stdint.h>

#include "query.h"

/* out[i] = the permutation of in[i] (in and out may alias). */
void permute_u64(const perm_runs *r, const uint64_t *in, uint64_t *out, size_t n);

/* counts[h] += number of i >= 1 whose delta with a[i-1] has its leading
 * 1-bit at h; delta is a[i] - a[i-1] (coding 1) or a[i] ^ a[i-1] (coding 0).
 * Equal neighbours are not counted. */
void delta_histogram(const uint64_t *a, size_t n, int coding, uint64_t counts[64]);

/* Merge k sorted arrays (each strictly increasing) into out, dropping
 * repeats and every value of the sorted array hide; returns the count.
 * out must hold the sum of the lengths. */
size_t merge_unique_u64(const uint64_t *const *runs, const size_t *lens, int k,
                        const uint64_t *hide, size_t nhide, uint64_t *out);

#endif
