/* Document kernels: see docs.h and format-spec/documents.md. */
#include "docs.h"

#include <stdlib.h>
#include <string.h>

#include "ndx_features.h"

void docs_band_update(const uint64_t *features, size_t n, const uint64_t *a, const uint64_t *b,
                      int bands, int rows, uint32_t *low, uint32_t *count) {
    /* Each band keeps its `rows` smallest values so far, sorted; a new value
     * at or above the largest of a full band is rejected by one compare,
     * which is the fate of nearly every feature once the bands fill. */
    for (size_t i = 0; i < n; i++) {
        uint32_t f = (uint32_t)(features[i] ^ (features[i] >> 32));
        for (int j = 0; j < bands; j++) {
            uint32_t h = (uint32_t)((a[j] * f + b[j]) >> 32);
            uint32_t *v = low + (size_t)j * rows;
            int c = (int)count[j];
            if (c == rows && h >= v[rows - 1])
                continue;
            int pos = c;
            while (pos > 0 && v[pos - 1] > h)
                pos--;
            if (pos > 0 && v[pos - 1] == h)
                continue; /* already kept: values are distinct */
            int last = c == rows ? rows - 1 : c;
            memmove(v + pos + 1, v + pos, (size_t)(last - pos) * sizeof *v);
            v[pos] = h;
            if (c < rows)
                count[j] = (uint32_t)(c + 1);
        }
    }
}

void docs_band_hash(const uint32_t *low, const uint32_t *count, int bands, int rows,
                    uint64_t *keys) {
    uint8_t buf[4 * DOCS_MAX_ROWS];
    for (int j = 0; j < bands; j++) {
        const uint32_t *v = low + (size_t)j * rows;
        for (uint32_t r = 0; r < count[j]; r++) {
            buf[4 * r] = (uint8_t)v[r];
            buf[4 * r + 1] = (uint8_t)(v[r] >> 8);
            buf[4 * r + 2] = (uint8_t)(v[r] >> 16);
            buf[4 * r + 3] = (uint8_t)(v[r] >> 24);
        }
        keys[j] = fp_xxh64(buf, 4 * (size_t)count[j], (uint64_t)j);
    }
}

static inline uint32_t gap_at(const uint32_t *values, size_t i) {
    return i ? values[i] - values[i - 1] - 1 : values[0];
}

uint64_t docs_rice_bits(const uint32_t *values, size_t n, int k) {
    uint64_t bits = (uint64_t)n * (uint64_t)(k + 1);
    for (size_t i = 0; i < n; i++)
        bits += gap_at(values, i) >> k;
    return bits;
}

/* bits(k) is convex in k: bits(k + 1) - bits(k) = n - sum(ceil((gap >> k) / 2)),
 * and the sum shrinks as k grows.  So a walk from the guess k ~ log2(mean
 * gap) finds the smallest minimiser in a few evaluations where trying all
 * 32 took 54 us a 1024-value sketch: down while not worse, then up while
 * better. */
int docs_rice_best(const uint32_t *values, size_t n) {
    if (n == 0)
        return 0;
    uint64_t mean = ((uint64_t)values[n - 1] + 1) / n;
    int k = 0;
    while (k < 31 && (mean >> (k + 1)) > 0)
        k++;
    uint64_t bits = docs_rice_bits(values, n, k);
    while (k > 0) {
        uint64_t lower = docs_rice_bits(values, n, k - 1);
        if (lower > bits)
            break;
        k--;
        bits = lower;
    }
    while (k < 31) {
        uint64_t higher = docs_rice_bits(values, n, k + 1);
        if (higher >= bits)
            break;
        k++;
        bits = higher;
    }
    return k;
}

/* Bits go to the stream least significant first: stream bit i is bit
 * (i mod 8) of byte i / 8. */
typedef struct {
    uint8_t *out;
    uint64_t acc; /* bits not yet written, the next one lowest */
    int nacc;     /* how many: fewer than 8 between calls */
} bit_writer;

/* Append count <= 32 bits of value (a word at a time, where a bit at a time
 * took 90 us a 1024-value sketch). */
static inline void put_bits(bit_writer *w, uint64_t value, int count) {
    w->acc |= value << w->nacc;
    w->nacc += count;
    while (w->nacc >= 8) {
        *w->out++ = (uint8_t)w->acc;
        w->acc >>= 8;
        w->nacc -= 8;
    }
}

void docs_rice_encode(const uint32_t *values, size_t n, int k, uint8_t *out) {
    bit_writer w = {out, 0, 0};
    uint64_t low_mask = ((uint64_t)1 << k) - 1;
    for (size_t i = 0; i < n; i++) {
        uint32_t g = gap_at(values, i);
        uint64_t q = g >> k;
        for (; q >= 32; q -= 32) /* q one bits, then a zero */
            put_bits(&w, 0xFFFFFFFFu, 32);
        put_bits(&w, ((uint64_t)1 << q) - 1, (int)q + 1);
        put_bits(&w, g & low_mask, k);
    }
    if (w.nacc > 0) /* the last byte, zero padded */
        *w.out = (uint8_t)w.acc;
}

/* The stream's bits from pos on, least significant first: at least 57 of
 * them, zeros past the end. */
static inline uint64_t bits_at(const uint8_t *data, size_t len, uint64_t pos) {
    size_t byte = (size_t)(pos >> 3);
    uint64_t w = 0;
    if (byte + 8 <= len) {
        for (int i = 0; i < 8; i++)
            w |= (uint64_t)data[byte + i] << (8 * i);
    } else {
        for (size_t i = 0; byte + i < len; i++)
            w |= (uint64_t)data[byte + i] << (8 * i);
    }
    return w >> (pos & 7);
}

/* Reads 57 bits at a time where a bit at a time took 18 us a 1024-value
 * sketch; the statuses are those of reading bit by bit: a run of ones
 * past the limit is DOCS_OVERFLOW even where the stream ends after it. */
int docs_rice_decode(const uint8_t *data, size_t len, size_t n, int k, uint32_t *values) {
    if (k < 0 || k > 31)
        return DOCS_BAD_ARG;
    const uint64_t limit = UINT64_C(0xFFFFFFFF) >> k, low_mask = ((uint64_t)1 << k) - 1;
    uint64_t pos = 0, end = (uint64_t)len * 8;
    int64_t prev = -1;
    for (size_t i = 0; i < n; i++) {
        uint64_t q = 0;
        for (;;) { /* q one bits, then a zero */
            if (pos >= end)
                return DOCS_TRUNCATED;
            uint64_t avail = end - pos < 57 ? end - pos : 57;
            uint64_t zeros = ~bits_at(data, len, pos) & (((uint64_t)1 << avail) - 1);
            uint64_t ones = zeros ? (uint64_t)__builtin_ctzll(zeros) : avail;
            q += ones;
            if (q > limit)
                return DOCS_OVERFLOW;
            pos += ones;
            if (zeros) {
                pos++;
                break;
            }
        }
        if (pos + (uint64_t)k > end)
            return DOCS_TRUNCATED;
        uint64_t low = bits_at(data, len, pos) & low_mask;
        pos += (uint64_t)k;
        int64_t v = prev + 1 + (int64_t)((q << k) | low);
        if (v > (int64_t)UINT32_MAX)
            return DOCS_OVERFLOW;
        values[i] = (uint32_t)v;
        prev = v;
    }
    if ((pos + 7) / 8 < len)
        return DOCS_TRAILING;
    for (; pos < end; pos++)
        if ((data[pos >> 3] >> (pos & 7)) & 1)
            return DOCS_PADDING;
    return DOCS_OK;
}

void docs_similarity(const uint32_t *values, const int64_t *offsets, const int64_t *left,
                     const int64_t *right, size_t npairs, size_t k, double threshold,
                     double *out) {
    for (size_t p = 0; p < npairs; p++) {
        const uint32_t *x = values + offsets[left[p]], *y = values + offsets[right[p]];
        size_t nx = (size_t)(offsets[left[p] + 1] - offsets[left[p]]);
        size_t ny = (size_t)(offsets[right[p] + 1] - offsets[right[p]]);
        size_t i = 0, j = 0, united = 0, both = 0;
        int below = 0;
        /* Merge the two sorted sketches until k union values are seen.  Every
         * 64 steps, stop if even matching every value still to come (at most
         * r = min(what is left of either sketch, of k)) keeps the pair below
         * the threshold: (both + r) / (united + r) bounds the result, and it
         * is what is returned then. */
        while (united < k && i < nx && j < ny) {
            uint32_t u = x[i], v = y[j];
            both += u == v;
            i += u <= v;
            j += v <= u;
            united++;
            if (threshold > 0 && (united & 63) == 0) {
                size_t r = nx - i < ny - j ? nx - i : ny - j;
                r = r < k - united ? r : k - united;
                double bound = (double)(both + r) / (double)(united + r);
                if (bound < threshold) {
                    out[p] = bound;
                    below = 1;
                    break;
                }
            }
        }
        if (below)
            continue;
        /* One sketch is used up: the rest of the union comes from the other. */
        size_t rest = (nx - i) + (ny - j);
        united += rest < k - united ? rest : k - united;
        out[p] = united ? (double)both / (double)united : 1.0;
    }
}
