/* Probabilistic simhash matching (Sood and Loguinov, CIKM 2011): the VOSH
 * order of flip sets, and the probe of one sorted table through a directory
 * over its top p bits, the "headers".  The reference of the VOSH order is
 * ndindex/vosh.py; this file must produce the same sequence. */
#ifndef NDINDEX_PSM_H
#define NDINDEX_PSM_H
#include <stddef.h>
#include <stdint.h>

#define PSM_NOMEM (-100)
/* Probabilities are clamped to [VOSH_P_MIN, VOSH_P_MAX] (vosh.P_MIN, P_MAX). */
#define VOSH_P_MIN 1e-300
#define VOSH_P_MAX (1.0 - 0x1p-53)

/* A flip set: bit r of `set` is rank r in volatility order; key = the sum of
 * its log-odds in increasing rank order. */
typedef struct {
    double key;
    uint64_t set;
} vosh_node;

/* The Volatility Ordered Set Heap over n <= 64 bits. */
typedef struct {
    int n;
    double logits[64]; /* log-odds by rank, non-increasing */
    uint8_t pos[64];   /* the bit position of each rank */
    vosh_node *heap;
    size_t len, cap;
} vosh_heap;

/* Sort n probabilities (one per bit position in `positions`) by volatility
 * and seed the heap with the roots of sizes kmin..kmax (at most n).
 * Returns 0 or PSM_NOMEM. */
int vosh_init(vosh_heap *v, const double *probs, const uint8_t *positions, int n, int kmin,
              int kmax);
/* Pop the next most probable set as a mask of bit positions.  Returns 1, 0
 * when every set has come out, or PSM_NOMEM. */
int vosh_next(vosh_heap *v, uint64_t *mask);
void vosh_free(vosh_heap *v);

/* One sorted table probed on its top p bits.  dir has 2^b + 1 offsets
 * (b <= p): the values whose top b bits equal x are vals[dir[x] .. dir[x+1]). */
typedef struct {
    int p, b;
    size_t n;
    const uint64_t *vals;
    const uint32_t *dir;
} psm_table;

/* A growable list of matches (fp, dist, qidx) or pairs (q in qidx as a value). */
typedef struct {
    uint64_t *fp;
    uint8_t *dist;
    uint64_t *q;
    size_t n, cap;
} psm_results;

void psm_results_free(psm_results *r);

/* Append every value within k of q whose top p bits equal one of the given
 * header values, tagged with q, distinct, ordered by (distance, value).
 * Returns 0 or PSM_NOMEM. */
int psm_probe(const psm_table *t, uint64_t q, int k, const uint64_t *headers, size_t nheaders,
              uint64_t tag, psm_results *out);

/* Write q's first max_out flipped headers in VOSH order: the flip sets of at
 * most k of its top p bits (probs: 64 values, p_j of bit j).  Returns the
 * number written, or PSM_NOMEM. */
long psm_headers(uint64_t q, const double *probs, int p, int k, size_t max_out, uint64_t *out);

/* The online query: what psm_probe returns for psm_headers' first
 * max_probes headers, each probed as the heap yields it.  *probes receives
 * the number of headers probed.  Returns 0 or PSM_NOMEM. */
int psm_query(const psm_table *t, uint64_t q, const double *probs, int k, size_t max_probes,
              uint64_t tag, psm_results *out, size_t *probes);

/* Batch mode: entries (header eh[i], query value eq[i]) sorted by header;
 * fps sorted ascending.  Append (eq[i], f, distance) for every f whose top p
 * bits are eh[i] and within k of eq[i] (f != eq[i] when skip_equal).
 * Returns 0 or PSM_NOMEM. */
int psm_join(const uint64_t *eh, const uint64_t *eq, size_t ne, const uint64_t *fps, size_t nf,
             int p, int k, int skip_equal, psm_results *out);

#endif
