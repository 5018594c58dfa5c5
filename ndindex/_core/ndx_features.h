/* ndx_features.h: feature kernels of the fingerprint layer (named so that it cannot
 * shadow glibc's <features.h> on the include path): XXH64, tokenising normalised
 * UTF-8 into hashed features, Rabin fingerprints of character windows,
 * simhash weight accumulation and MinHash minima.
 *
 * Plain C on pointers, lengths and fixed-width integers; every function that
 * can fail returns an FP_* status code.  The Python binding is
 * bind_fingerprint.c; the normative definitions are in
 * format-spec/fingerprinter.md. */
#ifndef NDINDEX_FEATURES_H
#define NDINDEX_FEATURES_H

#include <stddef.h>
#include <stdint.h>

#define FP_OK 0
#define FP_NOMEM (-1)
#define FP_BAD_ARG (-2)

#define FP_UNIT_WORDS 0
#define FP_UNIT_CHARS 1
#define FP_UNIT_LINES 2

#define FP_HASH_XXH64 0
#define FP_HASH_RABIN 1

/* The irreducible polynomial of the Rabin fingerprints: x^64 + this. */
#define FP_RABIN_POLY UINT64_C(0x9bdc0890b9832b3b)

/* simhash weights are fixed point: an integer weight of w * 2^FP_WEIGHT_SHIFT,
 * summed exactly in int64 so that the result does not depend on the order of
 * the features or on the platform's floating point. */
#define FP_WEIGHT_SHIFT 12

/* Classifies a non-ASCII code point (1 = yes); the binding supplies Python's
 * Unicode database so that the kernel agrees with str.isalnum/isspace. */
typedef int (*fp_class_fn)(uint32_t cp);

typedef struct {
    int unit;               /* FP_UNIT_* */
    uint32_t ngram;         /* tokens per feature, >= 1 */
    int hash;               /* FP_HASH_*; Rabin only for FP_UNIT_CHARS */
    uint64_t seed;          /* XXH64 seed */
    const uint64_t *stop;   /* sorted XXH64 hashes of stop tokens, or NULL */
    size_t n_stop;
    int final;              /* this piece ends the text */
    int emitted_before;     /* earlier pieces of the text emitted a feature */
    fp_class_fn is_word;    /* non-ASCII word characters */
    fp_class_fn is_space;   /* non-ASCII white space */
} fp_params;

typedef struct {
    uint64_t *features;     /* malloc'd; the caller frees */
    size_t n_features;
    uint8_t *carry;         /* malloc'd; the caller frees; may be NULL if empty */
    size_t carry_len;
    size_t n_tokens;        /* kept tokens in this piece, carry excluded */
} fp_result;

uint64_t fp_xxh64(const void *data, size_t len, uint64_t seed);

/* Hash n_rows rows of row_bytes bytes each with XXH64(seed). */
void fp_xxh64_rows(const uint8_t *data, size_t n_rows, size_t row_bytes, uint64_t seed,
                   uint64_t *out);

/* Rabin fingerprint (FP_RABIN_POLY) of a byte string, first byte highest. */
uint64_t fp_rabin(const uint8_t *data, size_t len);

/* Tokenise one piece of normalised UTF-8 text into hashed features.
 * carry: the previous piece's carry (tokens that may still start a feature).
 * Invalid UTF-8 bytes are treated as single non-word, non-space characters. */
int fp_extract(const uint8_t *text, size_t len, const uint8_t *carry, size_t carry_len,
               const fp_params *p, fp_result *r);

/* Add features to the 8x256 fixed-point byte buckets (see features.c).
 * weights: NULL for weight 1 each, else n fixed-point integer weights. */
void fp_simhash_accumulate(const uint64_t *features, const int64_t *weights, size_t n,
                           int64_t buckets[8][256]);

/* V_j = 2 * (sum of weights with bit j set) - (sum of all weights). */
void fp_simhash_finish(const int64_t buckets[8][256], int64_t v[64]);

/* MinHash: mins[i] = min over features x of ((a[i] * fold(x) + b[i]) >> 32),
 * fold(x) = (x ^ (x >> 32)) mod 2^32; mins must be initialised by the caller
 * (to 0xFFFFFFFF for a fresh sketch). */
void fp_minhash_update(const uint64_t *features, size_t n, const uint64_t *a, const uint64_t *b,
                       size_t p, uint32_t *mins);

#endif
