/* k-Hamming queries over a snapshot of a format-v2 index: every table's
 * runs (chunks of 1 KB blocks found through the chunks tree and read in
 * place from the mapped file), its sorted copy of the append log, and the
 * caller's pending additions. */
#ifndef NDINDEX_QUERY_H
#define NDINDEX_QUERY_H
#include <stddef.h>
#include <stdint.h>

#include "codec.h"
#include "lmdbpage.h"

/* A permutation as runs: out |= ((x >> src) & mask) << dst. */
typedef struct {
    int n;
    uint8_t src[64], dst[64];
    uint64_t mask[64];
} perm_runs;

/* Fingerprint chunks (FORMAT.md 7.6): a 32-byte header, the key of each
 * block, then the blocks.  The chunk's LMDB key is the space, the run id
 * (big-endian) and the chunk's last value (big-endian). */
#define CHUNK_HEADER_BYTES 32
#define CHUNK_KEY_BYTES 13
#define CHUNK_MAX_BLOCKS 63
#define CHUNK_FLAG_FIRST 1
#define CHUNK_FLAG_LAST 2
#define RUN_KIND_HUFFMAN 1
#define RUN_KIND_RAW 2

/* A search aid over a large sorted array a[0..n): top[], the last value of
 * every DIRECTORY_GROUP-th element, and guide[], for each value r of the
 * top guide_bits bits, the first top entry whose top bits are >= r.  A
 * search reads the guide, one or two top entries (values spread evenly;
 * a binary search over the rest otherwise), then one group of a[]: two or
 * three cache lines, where a binary search over a 10M run's 130,000
 * blocks makes a dozen misses across 1 MB. */
typedef struct {
    uint64_t *top;
    size_t ntop;
    uint32_t *guide; /* (1 << guide_bits) + 1 entries */
    unsigned guide_bits;
} search_aid;

#define DIRECTORY_GROUP 16

/* Build aid over sorted a[0..n) (0, or QUERY_NOMEM); free with
 * search_aid_free. */
int search_aid_build(search_aid *aid, const uint64_t *a, size_t n);
void search_aid_free(search_aid *aid);

/* A run's blocks found once, for runs small enough to list: each block's
 * last value and address, chunk headers checked when listed
 * (run_directory_build).  verified[b] becomes 1 once block b has passed its
 * checksum.  Valid while the run's chunks stay where they are: chunks are
 * never rewritten, a merge input only loses chunks below its cursor (never
 * probed again), so one directory serves every snapshot that holds the run
 * -- unless a chunk lives inside a leaf page (inline_chunks): such a value
 * moves whenever its page is copied, and the directory serves its own
 * snapshot only. */
typedef struct {
    size_t nblocks;
    uint64_t *last;
    const uint8_t **block;
    uint8_t *verified;
    size_t nchunks, inline_chunks;
    search_aid aid; /* over last[] */
} run_directory;

typedef struct {
    uint8_t space;
    uint8_t kind; /* RUN_KIND_HUFFMAN or RUN_KIND_RAW */
    const run_directory *dir; /* NULL: find chunks through the chunks tree */
    /* A run held in memory (mem not NULL; dir NULL): its nmem values, sorted
     * and checked when read, with a search aid over them, probed as the log
     * is instead of block by block (reader.py, MEMORY_RUN_MAX_ENTRIES). */
    const uint64_t *mem;
    size_t nmem;
    const search_aid *mem_aid;
    uint32_t run_id;
    const codec_code *code; /* Huffman runs */
    uint64_t last;          /* the run's last value: a probe at or below it must find a chunk */
    int has_lo, has_hi;     /* live range (lo, hi]: merge inputs and outputs */
    uint64_t lo, hi;
} query_run;

typedef struct {
    int p; /* prefix bits probed */
    perm_runs fwd, inv;
    uint64_t orig_mask; /* the prefix bits, at their unpermuted positions */
    int nruns;
    const query_run *runs;
    /* The log's additions, permuted and sorted, in two arrays: log, and
     * log_recent, the newest (small), so that a commit of a thousand
     * additions costs the reader a merge into log_recent, not into a log of
     * a hundred thousand (the reader folds recent into log now and then). */
    size_t nlog, nlog_recent;
    const uint64_t *log, *log_recent;
    /* over log[]: a log of 100,000 additions is searched in cache */
    search_aid log_aid;
    int log_aid_shared; /* log_aid belongs to a log_aid capsule, not to the snapshot */
} query_table;

/* Tombstone runs a snapshot may have (a writer keeps a few, FORMAT.md 7.8). */
#define MAX_TOMB_RUNS 64

typedef struct {
    mdbp_map map;
    mdbp_db chunks; /* the chunks tree */
    int ntables;
    const query_table *tables;
    /* Sorted, unpermuted: never report a value found in a run (the log's
     * removals). */
    size_t nhide_runs;
    const uint64_t *hide_runs;
    /* Nor one of these (sorted, unpermuted): tombstones held in memory, in
     * place of looking the runs they come from up (they are not among the
     * ntomb runs below). */
    size_t nhide_tombs;
    const uint64_t *hide_tombs;
    /* Nor one a tombstone run holds (FORMAT.md 7.8; ntomb runs, each its
     * id and last fingerprint): looked up per candidate through the chunks
     * tree, so that nothing proportional to the tombstones is read before
     * a query finds something.  tomb_verified: a hash set (tomb_slots, a
     * power of two, about 4 per chunk) of the chunk addresses whose checks
     * passed; lossy (a lost entry costs a check again; benign races). */
    int ntomb;
    uint32_t tomb_run_id[MAX_TOMB_RUNS];
    uint64_t tomb_last[MAX_TOMB_RUNS];
    const uint8_t **tomb_verified;
    size_t tomb_slots;
} query_snapshot;

#define SPACE_TOMBSTONES 0xF0
#define RUN_KIND_TOMBSTONES 4
#define TOMBSTONE_BYTES 12 /* u64 fingerprint, u32 stamp */
#define TOMB_PROBE_SLOTS 8 /* slots tomb_verified looks in from a chunk's hash */

/* A writer's pending additions indexed as the log is, so that a query
 * need not scan them all: per table t, sorted permuted values in two
 * arrays, part[2t] and part[2t + 1]. */
typedef struct {
    int ntables;
    const uint64_t **part;
    size_t *npart;
} pending_index;

/* What a writer has not committed yet but must see (a transaction, or
 * durability="normal"): additions scanned whole (unsorted, unpermuted),
 * more additions in index (or NULL), and removals (sorted) that hide
 * anything the runs, the log, index or adds hold.  index may hold values
 * since removed: they are among the removals. */
typedef struct {
    size_t nadds, nremoves;
    const uint64_t *adds, *removes;
    const pending_index *index;
} query_pending;

/* A growable result list. */
typedef struct {
    uint64_t *fp;
    uint8_t *dist;
    int64_t *qidx;
    size_t n, cap;
} query_results;

/* Where a query found damage. */
typedef struct {
    int table;
    uint32_t run_id;
    uint8_t key[CHUNK_KEY_BYTES]; /* the chunk's key, when known */
    int has_key;
    uint64_t pgno; /* the LMDB page, when the damage is in the tree */
    const char *what;
} query_error;

#define QUERY_NOMEM (-100)
#define QUERY_CORRUPT (-1)

static inline uint64_t perm_apply(const perm_runs *r, uint64_t x) {
    uint64_t out = 0;
    for (int i = 0; i < r->n; i++)
        out |= ((x >> r->src[i]) & r->mask[i]) << r->dst[i];
    return out;
}

/* Append the matches of q within k, distinct, sorted by (distance, value),
 * tagged with qidx.  Returns 0, QUERY_CORRUPT with *err filled, or
 * QUERY_NOMEM. */
int query_one(const query_snapshot *s, const query_pending *pend, uint64_t q, int k,
              int64_t qidx, query_results *out, query_error *err);

/* Ask the page cache for the pages query_one(s, pend, q, k) will read in
 * the runs found through the chunks tree: the tree's levels, each chunk's
 * header, the block holding the range's start -- level by level, so that a
 * cold file's reads overlap (mdbp_prefetch_seeks).  Reads only what is
 * already asked for; never fails (damage is left to the query). */
void query_prefetch(const query_snapshot *s, uint64_t q, int k);

/* Probabilistic simhash matching on table t alone: probe every run of the
 * table, its log and the pending operations at each of the given prefixes
 * (values of the table's p prefix bits: the prefix of pi_t(q) XOR a flip
 * set), and append the values within k of q -- of q itself, not of the
 * flipped probe -- whose prefix is one of them, distinct, sorted by
 * (distance, value), tagged with qidx.  Pending additions count only under
 * a probed prefix, like the log.  Probing every prefix within k of q's
 * finds what query_one finds.  Returns 0, QUERY_CORRUPT with *err filled,
 * or QUERY_NOMEM. */
int query_prefixes(const query_snapshot *s, const query_pending *pend, int t, uint64_t q, int k,
                   const uint64_t *prefixes, size_t nprefixes, int64_t qidx, query_results *out,
                   query_error *err);

/* Check a fingerprint chunk's header against its key: checksum, kind,
 * sizes, block keys increasing and ending at the key's value.  Returns 0 or
 * QUERY_CORRUPT with err->what set. */
int chunk_check(const uint8_t *key, const uint8_t *val, size_t vlen, unsigned *nblocks,
                query_error *err);

void query_results_free(query_results *r);

/* List the chunks of run (space, run_id) holding values >= start, checking
 * each header and the chain of fences.  Returns 0, QUERY_CORRUPT with err
 * set, or QUERY_NOMEM.  Free with run_directory_free. */
int run_directory_build(const mdbp_map *map, const mdbp_db *chunks, uint8_t space,
                        uint32_t run_id, uint8_t kind, uint64_t start,
                        const run_directory *prev, run_directory *out, query_error *err);
void run_directory_free(run_directory *d);
/* Check the blocks of d holding values >= start that no query has checked
 * yet, as a query's first visit does (checksum and count; a raw block's
 * last value against its key), and flag those that pass.  Blocks that fail
 * stay unflagged: the query that reaches them reports the damage.  Returns
 * the number flagged. */
size_t run_directory_verify(run_directory *d, uint8_t kind, uint64_t start);

/* A slice of a run read whole: its values and the keys of its chunks. */
typedef struct {
    uint64_t *values;
    size_t nvalues, cap;
    uint8_t (*keys)[CHUNK_KEY_BYTES];
    size_t nchunks;
    uint64_t end;  /* the last value of the last chunk read */
    int exhausted; /* no chunk of the run follows the ones read */
    int last_seen; /* a chunk read carries the run's last-chunk flag */
} run_slice;

/* Read up to max_chunks chunks of run (space, run_id) from the one holding
 * start, and after the first none whose values all lie past stop (its low
 * fence >= stop): check each header, the fences and every block
 * (checksums, order), keep the values >= start.  code: the run's code
 * (Huffman runs).  Returns 0, QUERY_CORRUPT with err set, or QUERY_NOMEM.
 * Free with run_slice_free. */
int run_read(const mdbp_map *map, const mdbp_db *chunks, uint8_t space, uint32_t run_id,
             uint8_t kind, const codec_code *code, uint64_t start, size_t max_chunks,
             uint64_t stop, run_slice *out, query_error *err);
void run_slice_free(run_slice *s);

#endif
