/* Document kernels: lookup keys (banded bottom-r super-shingles), the
 * Rice-coded sketch record, and bottom-k verification of candidate pairs.
 * Plain C on pointers, lengths and fixed-width ints; statuses are DOCS_*.
 * The binding is bind_docs.c; the normative text is format-spec/documents.md. */
#ifndef NDINDEX_DOCS_H
#define NDINDEX_DOCS_H
#include <stddef.h>
#include <stdint.h>

#define DOCS_OK 0
#define DOCS_NOMEM (-1)
#define DOCS_BAD_ARG (-2)
/* Record decoding: what is wrong with the bytes ([DR10]-[DR14]). */
#define DOCS_TRUNCATED (-10)  /* the bit stream ends before n values */
#define DOCS_OVERFLOW (-11)   /* a value would pass 2^32 - 1 */
#define DOCS_PADDING (-12)    /* non-zero padding bits after the last value */
#define DOCS_TRAILING (-13)   /* bytes after the bit stream */

/* Largest rows per band (values hashed into one band key). */
#define DOCS_MAX_ROWS 64

/* Band keys of one document ([DK20]-[DK22]).  For band j < bands, the
 * `rows` smallest distinct values of h_j(x) = ((a[j] * fold(x) + b[j]) mod
 * 2^64) >> 32 over the features, fold(x) = (x ^ (x >> 32)) mod 2^32, sorted
 * ascending, written as little-endian uint32 and hashed with XXH64 seeded j.
 * A document with fewer distinct values hashes all it has.
 *
 * The state of a document read in pieces: low[j * rows ..] holds band j's
 * count[j] smallest values so far, sorted (count zeroed to begin).
 * docs_band_update takes n more features into it (their order does not
 * matter); docs_band_hash writes the bands keys of what it holds.  The
 * caller checks 1 <= rows <= DOCS_MAX_ROWS. */
void docs_band_update(const uint64_t *features, size_t n, const uint64_t *a, const uint64_t *b,
                      int bands, int rows, uint32_t *low, uint32_t *count);
void docs_band_hash(const uint32_t *low, const uint32_t *count, int bands, int rows,
                    uint64_t *keys);

/* Bits the Rice code of n strictly increasing values takes with parameter
 * k: sum of (gap >> k) + n * (k + 1), gaps as in [DR05]. */
uint64_t docs_rice_bits(const uint32_t *values, size_t n, int k);

/* The parameter in 0..31 with the fewest bits, ties to the smaller ([DR06]). */
int docs_rice_best(const uint32_t *values, size_t n);

/* Write the Rice bit stream of n strictly increasing values with parameter
 * k into out (ceil(docs_rice_bits / 8) bytes, zero padded). */
void docs_rice_encode(const uint32_t *values, size_t n, int k, uint8_t *out);

/* Read n values with parameter k from len bytes; values gets n outputs.
 * Returns DOCS_OK or a decoding status (nothing is read past len). */
int docs_rice_decode(const uint8_t *data, size_t len, size_t n, int k, uint32_t *values);

/* Bottom-k similarity of document pairs ([DV30]): sketches are rows of a
 * CSR array (values[offsets[d] .. offsets[d+1]) sorted, distinct); for each
 * pair i, among the k smallest values of the union of left[i]'s and
 * right[i]'s sketches, the fraction present in both (1 when the union is
 * empty).  With threshold > 0 a pair that cannot reach it may stop early and
 * get an upper bound of its similarity, below threshold, instead.  Indices
 * must be checked by the caller. */
void docs_similarity(const uint32_t *values, const int64_t *offsets, const int64_t *left,
                     const int64_t *right, size_t npairs, size_t k, double threshold,
                     double *out);

#endif
