#include "arrays.h"

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
