#include "query.h"

#include <stdlib.h>
#include <string.h>

#include "arrays.h"
#include "crc32c.h"
#include "rawblock.h"

/* A run's block not located ahead (see locate_listed). */
#define NOT_LOCATED ((size_t)-1)

static int reserve(query_results *r, size_t extra) {
    if (r->n + extra <= r->cap)
        return 0;
    size_t cap = r->cap ? r->cap : 64;
    while (cap < r->n + extra)
        cap *= 2;
    uint64_t *fp = realloc(r->fp, cap * sizeof *fp);
    if (fp)
        r->fp = fp;
    uint8_t *dist = realloc(r->dist, cap * sizeof *dist);
    if (dist)
        r->dist = dist;
    int64_t *qidx = realloc(r->qidx, cap * sizeof *qidx);
    if (qidx)
        r->qidx = qidx;
    if (!fp || !dist || !qidx)
        return QUERY_NOMEM;
    r->cap = cap;
    return 0;
}

void query_results_free(query_results *r) {
    free(r->fp);
    free(r->dist);
    free(r->qidx);
    memset(r, 0, sizeof *r);
}

static inline uint64_t load_be64(const uint8_t *p) {
    return __builtin_bswap64(load_le64(p));
}
static inline uint32_t load_le32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline void store_be64(uint8_t *p, uint64_t v) {
    v = __builtin_bswap64(v);
    memcpy(p, &v, 8);
}

/* The chunks-tree key of a fingerprint chunk (FORMAT.md 7.7): space, run id
 * (u32 BE), value (u64 BE). */
static inline void chunk_key(uint8_t key[CHUNK_KEY_BYTES], uint8_t space, uint32_t run_id,
                             uint64_t value) {
    key[0] = space;
    key[1] = (uint8_t)(run_id >> 24);
    key[2] = (uint8_t)(run_id >> 16);
    key[3] = (uint8_t)(run_id >> 8);
    key[4] = (uint8_t)run_id;
    store_be64(key + 5, value);
}

int search_aid_build(search_aid *aid, const uint64_t *a, size_t n) {
    memset(aid, 0, sizeof *aid);
    aid->ntop = (n + DIRECTORY_GROUP - 1) / DIRECTORY_GROUP;
    unsigned bits = 1;
    while (bits < 20 && ((size_t)1 << bits) < aid->ntop)
        bits++;
    aid->guide_bits = bits;
    aid->top = malloc((aid->ntop ? aid->ntop : 1) * sizeof *aid->top);
    aid->guide = malloc((((size_t)1 << bits) + 1) * sizeof *aid->guide);
    if (!aid->top || !aid->guide) {
        search_aid_free(aid);
        return QUERY_NOMEM;
    }
    for (size_t g = 0; g < aid->ntop; g++) {
        size_t i = (g + 1) * DIRECTORY_GROUP - 1;
        aid->top[g] = a[i < n ? i : n - 1];
    }
    size_t g = 0;
    for (size_t r = 0; r <= (size_t)1 << bits; r++) {
        while (g < aid->ntop && (aid->top[g] >> (64 - bits)) < r)
            g++;
        aid->guide[r] = (uint32_t)g;
    }
    return 0;
}

void search_aid_free(search_aid *aid) {
    free(aid->top);
    free(aid->guide);
    memset(aid, 0, sizeof *aid);
}

/* A search of a search_aid for v, in steps, so that locate_listed can
 * interleave the searches of many runs (each step prefetches what the next
 * reads). */
typedef struct {
    uint64_t v;
    size_t g, end;
} aid_search;

/* Step 1: the guide's range for v's top bits (prefetched). */
static inline void aid_search_start(const search_aid *aid, uint64_t v, aid_search *a) {
    a->v = v;
    a->g = (size_t)(v >> (64 - aid->guide_bits));
    __builtin_prefetch(aid->guide + a->g);
}

/* Step 2: read the guide; prefetch the top entries it names. */
static inline void aid_search_guide(const search_aid *aid, aid_search *a) {
    size_t r = a->g;
    a->g = aid->guide[r];
    a->end = aid->guide[r + 1];
    __builtin_prefetch(aid->top + a->g);
}

/* Step 3: the first group whose top is >= v (ntop if none): the guide's
 * range for v's top bits holds it, or it is the first group past it. */
static inline size_t aid_search_group(const search_aid *aid, const aid_search *a) {
    return a->g + lower_bound_u64(aid->top + a->g, a->end - a->g, a->v);
}

/* The three steps at once. */
static inline size_t aid_group(const search_aid *aid, uint64_t v) {
    aid_search a;
    aid_search_start(aid, v, &a);
    aid_search_guide(aid, &a);
    return aid_search_group(aid, &a);
}

/* First index i of sorted a[0..n) with a[i] >= v, given g, the first group
 * whose top is >= v (aid_group; ntop if none). */
static inline size_t group_lower_bound(const uint64_t *a, size_t n, size_t ntop, size_t g,
                                       uint64_t v) {
    if (g >= ntop)
        return n;
    size_t i = g * DIRECTORY_GROUP;
    while (a[i] < v)
        i++;
    return i;
}

/* First index i of the table's log with log[i] >= v (nlog if none). */
static inline size_t log_lower_bound(const query_table *tb, uint64_t v) {
    return group_lower_bound(tb->log, tb->nlog, tb->log_aid.ntop, aid_group(&tb->log_aid, v), v);
}

static int contains(const uint64_t *a, size_t n, uint64_t v) {
    size_t i = lower_bound_u64(a, n, v);
    return i < n && a[i] == v;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Words for a negative codec status (static strings). */
static const char *block_status_text(long rc) {
    switch (rc) {
    case CODEC_BAD_CHECKSUM: return "block checksum mismatch";
    case CODEC_BAD_COUNT: return "block holds an impossible count";
    case CODEC_OVERRUN: return "block bitstream runs past its end";
    case CODEC_NOT_SORTED: return "block values do not increase or end at its key";
    case CODEC_BAD_PADDING: return "block padding is not zero";
    case CODEC_BAD_RESTART: return "block restart record disagrees with its entries";
    case CODEC_BAD_WIDTH: return "raw block width is impossible or not its span's";
    default: return "block does not decode";
    }
}

static int corrupt(query_error *err, const char *what) {
    err->what = what;
    return QUERY_CORRUPT;
}

/* Whether a chunk's header (run_id at offset 8) names the run its key does. */
static int names_its_run(const uint8_t *key, const uint8_t *val) {
    return load_le32(val + 8) == ((uint32_t)key[1] << 24 | (uint32_t)key[2] << 16 |
                                  (uint32_t)key[3] << 8 | key[4]);
}

int chunk_check(const uint8_t *key, const uint8_t *val, size_t vlen, unsigned *nblocks,
                query_error *err) {
    if (vlen < CHUNK_HEADER_BYTES)
        return corrupt(err, "chunk shorter than its header");
    unsigned kind = val[4], n = (unsigned)val[6] | ((unsigned)val[7] << 8);
    if (kind != RUN_KIND_HUFFMAN && kind != RUN_KIND_RAW)
        return corrupt(err, "chunk kind is not a fingerprint kind");
    if (n < 1 || n > CHUNK_MAX_BLOCKS)
        return corrupt(err, "chunk block count out of range");
    size_t head = CHUNK_HEADER_BYTES + 8 * (size_t)n;
    if (vlen != head + (size_t)n * BLOCK_BYTES)
        return corrupt(err, "chunk size disagrees with its block count");
    /* The checksum covers the key too: a value reached under another key fails. */
    uint32_t crc = crc32c_extend(crc32c_extend(0, key, CHUNK_KEY_BYTES), val + 4, head - 4);
    if (crc != load_le32(val))
        return corrupt(err, "chunk header checksum mismatch");
    if (val[5] & ~(CHUNK_FLAG_FIRST | CHUNK_FLAG_LAST) || load_le32(val + 12) != 0)
        return corrupt(err, "chunk reserved bits set");
    if (!names_its_run(key, val))
        return corrupt(err, "chunk names another run");
    const uint8_t *keys = val + CHUNK_HEADER_BYTES;
    for (unsigned i = 1; i < n; i++)
        if (load_le64(keys + 8 * i) <= load_le64(keys + 8 * (i - 1)))
            return corrupt(err, "chunk block keys do not increase");
    if (load_le64(keys + 8 * (n - 1)) != load_be64(key + 5))
        return corrupt(err, "chunk's last block key differs from its key");
    uint64_t low = load_le64(val + 16);
    if (!(val[5] & CHUNK_FLAG_FIRST) && low >= load_le64(keys))
        return corrupt(err, "chunk's low fence is not below its first block");
    *nblocks = n;
    return 0;
}

/* Append a candidate v (unpermuted) found by table t, unless an earlier
 * table finds it too: every table holds the same values, and table i finds
 * v exactly when v agrees with q on table i's prefix bits, so the first
 * such table reports it. */
static int add_candidate(const query_snapshot *s, int t, uint64_t q, query_results *r,
                         uint64_t v) {
    uint64_t x = v ^ q;
    for (int i = 0; i < t; i++)
        if ((x & s->tables[i].orig_mask) == 0)
            return 0;
    if (reserve(r, 1) < 0)
        return QUERY_NOMEM;
    r->fp[r->n++] = v;
    return 0;
}

/* Blocks wait in a queue, fetched into the cache meanwhile, and are probed
 * PROBE_GROUP at a time: the Huffman ones by codec_probe_lanes, which
 * decodes them side by side (one block's decode is a chain of dependent
 * loads; several chains overlap), then the raw ones, whose search would
 * otherwise wait for each block to arrive from memory. */
#define PROBE_GROUP 32
/* Matches a lane holds before its block goes back to the one-lane probe,
 * whose buffer takes a whole block. */
#define LANE_CAP 64

/* A probe of one run of table t for permuted values in [lo, hi] within k
 * of qp; key, when has_key, the chunk probed, for an error report. */
typedef struct {
    int t, k;
    const query_run *run;
    uint64_t lo, hi, qp;
    int has_key;
    uint8_t key[CHUNK_KEY_BYTES];
} run_probe;

/* One block of a run probe: its key (last value); verified, its flag in
 * the run directory (NULL: check its checksum).  Small, and written in
 * place (queue_block): a whole job built on the stack and copied into the
 * queue stalled on store forwarding, for every block. */
typedef struct {
    const run_probe *rp;
    const uint8_t *block;
    uint64_t block_key;
    uint8_t *verified;
} block_job;

/* Jobs refer to the run probes before them; probes are reused once full
 * and no job waits (queue_probe). */
typedef struct {
    const query_snapshot *s;
    uint64_t q; /* the query, unpermuted */
    query_results *out;
    query_error *err;
    int n, nprobes;
    block_job jobs[PROBE_GROUP];
    run_probe probes[PROBE_GROUP];
} job_queue;

/* The prefix a lane decodes a block for: the table's, or for an exact
 * lookup all 64 bits, so that its decode stops right past q. */
static inline int lane_prefix(const query_snapshot *s, const run_probe *rp) {
    return rp->k == 0 ? 64 : s->tables[rp->t].p;
}

/* Take the matches of a block: the values in [lo, hi], unpermuted. */
static int take_matches(const query_snapshot *s, const run_probe *rp, uint64_t q,
                        const uint64_t *found, long n, query_results *out) {
    const query_table *tb = &s->tables[rp->t];
    for (long i = 0; i < n; i++)
        if (found[i] >= rp->lo && found[i] <= rp->hi &&
            add_candidate(s, rp->t, q, out, perm_apply(&tb->inv, found[i])) < 0)
            return QUERY_NOMEM;
    return 0;
}

/* A lane that overflowed its cap, probed again alone with room for a whole
 * block (out of line: its buffer is 64 KB of stack).  *status: the probe's
 * count or status. */
static __attribute__((noinline)) int probe_overflowed(const query_snapshot *s,
                                                      const block_job *jb, uint64_t q,
                                                      query_results *out, long *status) {
    uint64_t whole[1 + BLOCK_PAYLOAD_BITS];
    const run_probe *rp = jb->rp;
    *status = codec_probe_verified(rp->run->code, jb->block, rp->qp, lane_prefix(s, rp), rp->k,
                                   whole, sizeof whole / sizeof *whole,
                                   jb->verified ? *jb->verified : 0);
    return *status < 0 ? 0 : take_matches(s, rp, q, whole, *status, out);
}

/* Where a queued block failed: its table, run and chunk. */
static int job_corrupt(job_queue *jq, const block_job *jb, long status) {
    query_error *err = jq->err;
    const run_probe *rp = jb->rp;
    err->table = rp->t;
    err->run_id = rp->run->run_id;
    err->has_key = rp->has_key;
    memcpy(err->key, rp->key, CHUNK_KEY_BYTES);
    return corrupt(err, block_status_text(status));
}

/* Probe a queued raw block (checked first unless *verified says so).
 * Inlined into queue_flush's clones (raw_probe too), so that its popcounts
 * compile to the instruction where the clone may use it: out of line, they
 * were the portable bit-twiddling sequence in every build. */
static inline __attribute__((always_inline)) int probe_raw_block(job_queue *jq,
                                                                 const block_job *jb) {
    uint64_t found[RAW_BLOCK_MAX_VALUES];
    const run_probe *rp = jb->rp;
    long n = jb->verified && *jb->verified ? raw_count(jb->block)
                                            : raw_block_check(jb->block, jb->block_key);
    if (n > 0)
        n = raw_probe(jb->block, (unsigned)n, jb->block_key, rp->lo, rp->hi, rp->qp, rp->k,
                      found, RAW_BLOCK_MAX_VALUES);
    if (n < 0)
        return job_corrupt(jq, jb, n);
    if (jb->verified)
        *jb->verified = 1; /* a benign race: another thread may set it too */
    return take_matches(jq->s, rp, jq->q, found, n, jq->out);
}

/* Probe the queued blocks and take their matches. */
HOT_KERNEL static int queue_flush(job_queue *jq) {
    const query_snapshot *s = jq->s;
    const int n = jq->n;
    codec_lane lane[PROBE_GROUP];
    int lane_job[PROBE_GROUP], nlanes = 0;
    uint64_t found[PROBE_GROUP][LANE_CAP];
    jq->n = 0;
    for (int j = 0; j < n; j++) {
        const block_job *jb = &jq->jobs[j];
        const run_probe *rp = jb->rp;
        if (rp->run->kind == RUN_KIND_RAW)
            continue;
        lane_job[nlanes] = j;
        lane[nlanes] = (codec_lane){.code = rp->run->code, .block = jb->block, .q = rp->qp,
                                    .p = lane_prefix(s, rp), .k = rp->k,
                                    .verified = jb->verified ? *jb->verified : 0,
                                    .out = found[nlanes], .cap = LANE_CAP};
        nlanes++;
    }
    codec_probe_lanes(lane, nlanes);
    for (int i = 0; i < nlanes; i++) {
        const block_job *jb = &jq->jobs[lane_job[i]];
        long m = lane[i].n;
        int rc = m == CODEC_OUT_FULL ? probe_overflowed(s, jb, jq->q, jq->out, &m)
                                     : take_matches(s, jb->rp, jq->q, found[i], m, jq->out);
        if (rc < 0)
            return rc;
        if (m < 0)
            return job_corrupt(jq, jb, m);
        if (jb->verified)
            *jb->verified = 1; /* a benign race: another thread may set it too */
    }
    for (int j = 0; j < n; j++) {
        if (jq->jobs[j].rp->run->kind != RUN_KIND_RAW)
            continue;
        int rc = probe_raw_block(jq, &jq->jobs[j]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Start a probe of run of table t in the queue: *rp (without a key). */
static int queue_probe(job_queue *jq, int t, const query_run *run, uint64_t qp, uint64_t lo,
                       uint64_t hi, int k, run_probe **rp) {
    if (jq->nprobes == PROBE_GROUP) {
        int rc = jq->n ? queue_flush(jq) : 0;
        if (rc < 0)
            return rc;
        jq->nprobes = 0;
    }
    run_probe *p = *rp = &jq->probes[jq->nprobes++];
    p->t = t;
    p->k = k;
    p->run = run;
    p->lo = lo;
    p->hi = hi;
    p->qp = qp;
    p->has_key = 0;
    return 0;
}

/* Queue a block of run probe rp, fetching it into the cache meanwhile
 * unless fetched (locate_listed did); lower, when has_lower, is the
 * previous block's key (for raw_prefetch). */
static int queue_block(job_queue *jq, const run_probe *rp, const uint8_t *block,
                       uint64_t block_key, int has_lower, uint64_t lower, uint8_t *verified,
                       int fetched) {
    if (jq->n == PROBE_GROUP) {
        int rc = queue_flush(jq);
        if (rc < 0)
            return rc;
    }
    block_job *jb = &jq->jobs[jq->n++];
    jb->rp = rp;
    jb->block = block;
    jb->block_key = block_key;
    jb->verified = verified;
    /* A block is read in part once verified; before, whole, by the checksum
     * (locate_listed fetched the part only). */
    int whole = !(verified && *verified);
    if (fetched && !whole)
        return 0;
    if (whole)
        prefetch_block(block);
    else if (rp->run->kind == RUN_KIND_RAW)
        raw_prefetch(block, has_lower, lower, block_key, rp->lo, rp->hi);
    else
        coded_prefetch(block, has_lower, lower, block_key, rp->lo, rp->hi);
    return 0;
}

/* Probe the blocks of one checked chunk (key, val) for values in [lo, hi];
 * *done is set once the chunk reaches hi. */
static int probe_chunk(job_queue *jq, int t, const query_run *run, uint64_t qp, uint64_t lo,
                       uint64_t hi, int k, const uint8_t *key, const uint8_t *val,
                       unsigned nblocks, int *done) {
    const uint8_t *keys = val + CHUNK_HEADER_BYTES;
    const uint8_t *blocks = keys + 8 * (size_t)nblocks;
    unsigned b = 0, e = nblocks;
    while (b < e) { /* first block whose key is >= lo */
        unsigned mid = (b + e) / 2;
        if (load_le64(keys + 8 * mid) < lo)
            b = mid + 1;
        else
            e = mid;
    }
    *done = 0;
    run_probe *rp;
    int rc = queue_probe(jq, t, run, qp, lo, hi, k, &rp);
    if (rc < 0)
        return rc;
    rp->has_key = 1;
    memcpy(rp->key, key, CHUNK_KEY_BYTES);
    for (; b < nblocks; b++) {
        uint64_t bkey = load_le64(keys + 8 * b);
        rc = queue_block(jq, rp, blocks + (size_t)b * BLOCK_BYTES, bkey, b > 0,
                         b > 0 ? load_le64(keys + 8 * (b - 1)) : 0, NULL, 0);
        if (rc < 0)
            return rc;
        if (bkey >= hi) {
            *done = 1;
            return 0;
        }
    }
    return 0;
}

/* First group of a directory whose last value is >= lo (ntop if none). */
static inline size_t directory_group(const run_directory *d, uint64_t lo) {
    return aid_group(&d->aid, lo);
}

/* First block of group g whose last value is >= lo (nblocks if none). */
static inline size_t group_block(const run_directory *d, size_t g, uint64_t lo) {
    return group_lower_bound(d->last, d->nblocks, d->aid.ntop, g, lo);
}

/* First block of a directory whose last value is >= lo (nblocks if none). */
static inline size_t directory_block(const run_directory *d, uint64_t lo) {
    return group_block(d, directory_group(d, lo), lo);
}

/* Probe a listed run's blocks for values in [lo, hi] (already clipped to the
 * run's live range), from block at when located ahead. */
static int probe_directory(job_queue *jq, int t, const query_run *run, uint64_t qp, uint64_t lo,
                           uint64_t hi, int k, size_t at) {
    run_directory *d = (run_directory *)run->dir;
    size_t b = at != NOT_LOCATED ? at : directory_block(d, lo);
    if (b == d->nblocks)
        return corrupt(jq->err, "no block covers a value inside the run");
    run_probe *rp;
    int rc = queue_probe(jq, t, run, qp, lo, hi, k, &rp);
    if (rc < 0)
        return rc;
    for (size_t first = b; b < d->nblocks; b++) {
        rc = queue_block(jq, rp, d->block[b], d->last[b], b > 0, b > 0 ? d->last[b - 1] : 0,
                         &d->verified[b], b == first && at != NOT_LOCATED);
        if (rc < 0)
            return rc;
        if (d->last[b] >= hi)
            break;
    }
    return 0;
}

/* Candidates of table t of s (whose table tb is) among sorted permuted
 * values a[i..n) up to hi, within k of qp. */
HOT_KERNEL static int scan_candidates(const query_snapshot *s, int t, const query_table *tb,
                                      uint64_t q, uint64_t qp, const uint64_t *a, size_t n,
                                      size_t i, uint64_t hi, int k, query_results *out) {
    for (; i < n && a[i] <= hi; i++)
        if (popcount64(a[i] ^ qp) <= k &&
            add_candidate(s, t, q, out, perm_apply(&tb->inv, a[i])) < 0)
            return QUERY_NOMEM;
    return 0;
}

/* Clip [*lo, *hi] to what run holds live; 0 if nothing of it is left. */
static inline int clip_to_run(const query_run *run, uint64_t *lo, uint64_t *hi) {
    if (run->has_lo) {
        if (*hi <= run->lo)
            return 0;
        if (*lo <= run->lo)
            *lo = run->lo + 1;
    }
    if (run->has_hi) {
        if (*lo > run->hi)
            return 0;
        if (*hi > run->hi)
            *hi = run->hi;
    }
    return *lo <= run->last;
}

/* Probe one run of table t for permuted values in [lo, hi] within k of qp
 * (Huffman blocks go to jq).  at: for a listed run, the directory's first
 * block for the clipped lo, for a run in memory the first value at or
 * above it (located ahead, see locate_listed), or NOT_LOCATED. */
static int probe_run(job_queue *jq, int t, const query_run *run, uint64_t qp, uint64_t lo,
                     uint64_t hi, int k, size_t at) {
    const query_snapshot *s = jq->s;
    query_error *err = jq->err;
    if (!clip_to_run(run, &lo, &hi))
        return 0;
    err->table = t;
    err->run_id = run->run_id;
    err->has_key = 0;
    int done = 0;
    if (run->mem)
        return scan_candidates(s, t, &s->tables[t], jq->q, qp, run->mem, run->nmem,
                               at != NOT_LOCATED ? at : lower_bound_u64(run->mem, run->nmem, lo),
                               hi, k, jq->out);
    if (run->dir)
        return probe_directory(jq, t, run, qp, lo, hi, k, at);
    uint8_t key[CHUNK_KEY_BYTES];
    chunk_key(key, run->space, run->run_id, lo);
    mdbp_cursor c;
    mdbp_error pe;
    int rc = mdbp_seek(&s->map, &s->chunks, key, CHUNK_KEY_BYTES, 0, &c, &pe);
    int first = 1;
    uint64_t prev_last = 0;
    while (rc == MDBP_FOUND) {
        const uint8_t *k8, *val;
        size_t klen, vlen;
        unsigned flags, nblocks;
        mdbp_key(&c, &k8, &klen);
        if (klen != CHUNK_KEY_BYTES || memcmp(k8, key, 5) != 0) {
            if (first) /* lo <= the run's last value, so some chunk must hold it */
                return corrupt(err, "no chunk covers a value inside the run");
            return 0;
        }
        memcpy(err->key, k8, CHUNK_KEY_BYTES);
        err->has_key = 1;
        if (mdbp_value(&c, &val, &vlen, &flags, &pe) < 0) {
            err->pgno = pe.pgno;
            return corrupt(err, pe.what);
        }
        if (flags != 0 && flags != MDBP_F_BIGDATA)
            return corrupt(err, "chunk node has database flags");
        if (chunk_check(k8, val, vlen, &nblocks, err) < 0)
            return QUERY_CORRUPT;
        if (val[4] != run->kind)
            return corrupt(err, "chunk kind differs from its run's");
        uint64_t low = load_le64(val + 16), chunk_last = load_be64(k8 + 5);
        /* Fences: the first chunk found must start below lo, and each next
         * chunk must continue where the previous one ended. */
        if (first ? !(val[5] & CHUNK_FLAG_FIRST) && low >= lo : low != prev_last)
            return corrupt(err, "chunk fences do not match its neighbours");
        rc = probe_chunk(jq, t, run, qp, lo, hi, k, k8, val, nblocks, &done);
        if (rc < 0)
            return rc;
        if (done || chunk_last >= hi)
            return 0;
        prev_last = chunk_last;
        first = 0;
        rc = mdbp_next(&c, &pe);
    }
    if (rc == MDBP_CORRUPT) {
        err->pgno = pe.pgno;
        return corrupt(err, pe.what);
    }
    if (first)
        return corrupt(err, "no chunk covers a value inside the run");
    return 0;
}

void run_directory_free(run_directory *d) {
    search_aid_free(&d->aid);
    free(d->last);
    free(d->block);
    free(d->verified);
    memset(d, 0, sizeof *d);
}

size_t run_directory_verify(run_directory *d, uint8_t kind, uint64_t start) {
    size_t b = lower_bound_u64(d->last, d->nblocks, start), n = 0;
    for (; b < d->nblocks; b++) {
        if (d->verified[b])
            continue;
        const uint8_t *blk = d->block[b];
        if (kind == RUN_KIND_RAW ? raw_block_check(blk, d->last[b]) < 0
                                 : codec_block_count(blk) < 0)
            continue;
        d->verified[b] = 1; /* a benign race, as a query's flag */
        n++;
    }
    return n;
}

int run_directory_build(const mdbp_map *map, const mdbp_db *chunks, uint8_t space,
                        uint32_t run_id, uint8_t kind, uint64_t start,
                        const run_directory *prev, run_directory *out, query_error *err) {
    memset(out, 0, sizeof *out);
    uint8_t key[CHUNK_KEY_BYTES];
    chunk_key(key, space, run_id, start);
    err->run_id = run_id;
    mdbp_cursor c;
    mdbp_error pe;
    size_t cap = 0;
    uint64_t prev_last = 0;
    if (prev && prev->nblocks) {
        /* Start with prev's blocks: the chunks listed next must continue
         * where its last one ended (the fence check below). */
        cap = prev->nblocks + 256;
        out->last = malloc(cap * sizeof *out->last);
        out->block = malloc(cap * sizeof *out->block);
        if (!out->last || !out->block) {
            run_directory_free(out);
            return QUERY_NOMEM;
        }
        memcpy(out->last, prev->last, prev->nblocks * sizeof *out->last);
        memcpy(out->block, prev->block, prev->nblocks * sizeof *out->block);
        out->nblocks = prev->nblocks;
        out->nchunks = prev->nchunks;
        out->inline_chunks = prev->inline_chunks;
        prev_last = prev->last[prev->nblocks - 1];
    }
    int rc = mdbp_seek(map, chunks, key, CHUNK_KEY_BYTES, 0, &c, &pe);
    while (rc == MDBP_FOUND) {
        const uint8_t *k8, *val;
        size_t klen, vlen;
        unsigned flags, nblocks;
        mdbp_key(&c, &k8, &klen);
        if (klen != CHUNK_KEY_BYTES || memcmp(k8, key, 5) != 0)
            break;
        memcpy(err->key, k8, CHUNK_KEY_BYTES);
        err->has_key = 1;
        if (mdbp_value(&c, &val, &vlen, &flags, &pe) < 0) {
            err->pgno = pe.pgno;
            goto bad_tree;
        }
        if ((flags != 0 && flags != MDBP_F_BIGDATA) || chunk_check(k8, val, vlen, &nblocks, err) < 0 ||
            val[4] != kind) {
            if (!err->what || flags > MDBP_F_BIGDATA)
                err->what = "chunk is not one of its run's";
            goto fail;
        }
        uint64_t low = load_le64(val + 16);
        if (out->nchunks ? low != prev_last : !(val[5] & CHUNK_FLAG_FIRST) && low >= start) {
            err->what = "chunk fences do not match its neighbours";
            goto fail;
        }
        if (out->nblocks + nblocks > cap) {
            while (out->nblocks + nblocks > cap)
                cap = cap ? 2 * cap : 256;
            uint64_t *l = realloc(out->last, cap * sizeof *l);
            if (l)
                out->last = l;
            const uint8_t **bp = realloc(out->block, cap * sizeof *bp);
            if (bp)
                out->block = bp;
            if (!l || !bp) {
                run_directory_free(out);
                return QUERY_NOMEM;
            }
        }
        const uint8_t *keys = val + CHUNK_HEADER_BYTES;
        const uint8_t *blocks = keys + 8 * (size_t)nblocks;
        for (unsigned b = 0; b < nblocks; b++) {
            out->last[out->nblocks] = load_le64(keys + 8 * b);
            out->block[out->nblocks] = blocks + (size_t)b * BLOCK_BYTES;
            out->nblocks++;
        }
        prev_last = load_be64(k8 + 5);
        out->inline_chunks += flags != MDBP_F_BIGDATA;
        out->nchunks++;
        rc = mdbp_next(&c, &pe);
    }
    if (rc == MDBP_CORRUPT) {
        err->pgno = pe.pgno;
        goto bad_tree;
    }
    out->verified = calloc(out->nblocks ? out->nblocks : 1, 1);
    if (out->verified && prev && prev->nblocks)
        memcpy(out->verified, prev->verified, prev->nblocks);
    if (!out->verified || search_aid_build(&out->aid, out->last, out->nblocks) < 0) {
        run_directory_free(out);
        return QUERY_NOMEM;
    }
    return 0;
bad_tree:
    err->what = pe.what;
fail:
    run_directory_free(out);
    return QUERY_CORRUPT;
}

void run_slice_free(run_slice *s) {
    free(s->values);
    free(s->keys);
    memset(s, 0, sizeof *s);
}

int run_read(const mdbp_map *map, const mdbp_db *chunks, uint8_t space, uint32_t run_id,
             uint8_t kind, const codec_code *code, uint64_t start, size_t max_chunks,
             uint64_t stop, run_slice *out, query_error *err) {
    memset(out, 0, sizeof *out);
    uint8_t key[CHUNK_KEY_BYTES];
    chunk_key(key, space, run_id, start);
    err->run_id = run_id;
    mdbp_cursor c;
    mdbp_error pe;
    size_t keycap = 0;
    uint64_t prev_last = 0;
    int rc = mdbp_seek(map, chunks, key, CHUNK_KEY_BYTES, 0, &c, &pe);
    while (rc == MDBP_FOUND && out->nchunks < max_chunks) {
        const uint8_t *k8, *val;
        size_t klen, vlen;
        unsigned flags, nblocks;
        mdbp_key(&c, &k8, &klen);
        if (klen != CHUNK_KEY_BYTES || memcmp(k8, key, 5) != 0) {
            out->exhausted = 1;
            break;
        }
        memcpy(err->key, k8, CHUNK_KEY_BYTES);
        err->has_key = 1;
        if (mdbp_value(&c, &val, &vlen, &flags, &pe) < 0) {
            err->pgno = pe.pgno;
            err->what = pe.what;
            goto fail;
        }
        if ((flags != 0 && flags != MDBP_F_BIGDATA) || chunk_check(k8, val, vlen, &nblocks, err) < 0 ||
            val[4] != kind) {
            if (!err->what || flags > MDBP_F_BIGDATA)
                err->what = "chunk is not one of its run's";
            goto fail;
        }
        uint64_t low = load_le64(val + 16);
        if (out->nchunks ? low != prev_last : !(val[5] & CHUNK_FLAG_FIRST) && low >= start) {
            err->what = "chunk fences do not match its neighbours";
            goto fail;
        }
        if (out->nchunks && low >= stop)
            break; /* every value of this chunk lies past stop */
        uint64_t entries = load_le64(val + 24);
        if (entries > (uint64_t)nblocks * (1 + BLOCK_PAYLOAD_BITS)) {
            err->what = "chunk claims more entries than its blocks can hold";
            goto fail;
        }
        size_t need = out->nvalues + (size_t)entries + 1 + BLOCK_PAYLOAD_BITS;
        if (need > out->cap) {
            size_t cap = out->cap ? out->cap : 4096;
            while (cap < need)
                cap *= 2;
            uint64_t *v = realloc(out->values, cap * sizeof *v);
            if (!v)
                goto nomem;
            out->values = v;
            out->cap = cap;
        }
        if (out->nchunks == keycap) {
            keycap = keycap ? 2 * keycap : 16;
            uint8_t(*kk)[CHUNK_KEY_BYTES] = realloc(out->keys, keycap * sizeof *kk);
            if (!kk)
                goto nomem;
            out->keys = kk;
        }
        memcpy(out->keys[out->nchunks], k8, CHUNK_KEY_BYTES);
        const uint8_t *bkeys = val + CHUNK_HEADER_BYTES;
        const uint8_t *blocks = bkeys + 8 * (size_t)nblocks;
        size_t got = 0;
        for (unsigned b = 0; b < nblocks; b++) {
            uint64_t *dst = out->values + out->nvalues + got;
            long n = kind == RUN_KIND_RAW ? raw_decode(blocks + (size_t)b * BLOCK_BYTES, dst)
                                          : codec_decode(code, blocks + (size_t)b * BLOCK_BYTES,
                                                         dst, 1 + BLOCK_PAYLOAD_BITS);
            if (n < 0) {
                err->what = block_status_text(n);
                goto fail;
            }
            if (dst[n - 1] != load_le64(bkeys + 8 * b) ||
                (got ? dst[0] <= dst[-1] : (out->nchunks || (val[5] & CHUNK_FLAG_FIRST)) ? 0
                                                                                          : dst[0] <= low)) {
                err->what = "block values disagree with the chunk's keys or fences";
                goto fail;
            }
            if (got == 0 && out->nvalues && dst[0] <= out->values[out->nvalues - 1]) {
                err->what = "values do not increase across chunks";
                goto fail;
            }
            got += (size_t)n;
            if (got > entries) {
                err->what = "chunk holds more values than its header says";
                goto fail;
            }
        }
        if (got != entries) {
            err->what = "chunk holds fewer values than its header says";
            goto fail;
        }
        out->nvalues += got;
        prev_last = load_be64(k8 + 5);
        out->end = prev_last;
        out->nchunks++;
        if (val[5] & CHUNK_FLAG_LAST) {
            out->exhausted = out->last_seen = 1;
            break;
        }
        rc = mdbp_next(&c, &pe);
    }
    if (rc == MDBP_CORRUPT) {
        err->pgno = pe.pgno;
        err->what = pe.what;
        goto fail;
    }
    if (rc == MDBP_END)
        out->exhausted = 1;
    /* Drop the values below start (the first chunk may begin before it). */
    size_t skip = 0;
    while (skip < out->nvalues && out->values[skip] < start)
        skip++;
    if (skip) {
        memmove(out->values, out->values + skip, (out->nvalues - skip) * sizeof *out->values);
        out->nvalues -= skip;
    }
    return 0;
nomem:
    run_slice_free(out);
    return QUERY_NOMEM;
fail:
    run_slice_free(out);
    return QUERY_CORRUPT;
}

/* The log's additions in [lo, hi] within k of qp: both of its arrays.
 * at: the first position of log[] at or above lo (NOT_LOCATED: search). */
static int log_candidates(const query_snapshot *s, int t, const query_table *tb, uint64_t q,
                          uint64_t qp, uint64_t lo, uint64_t hi, int k, size_t at,
                          query_results *out) {
    if (scan_candidates(s, t, tb, q, qp, tb->log, tb->nlog,
                        at != NOT_LOCATED ? at : log_lower_bound(tb, lo), hi, k, out) < 0)
        return QUERY_NOMEM;
    return scan_candidates(s, t, tb, q, qp, tb->log_recent, tb->nlog_recent,
                           lower_bound_u64(tb->log_recent, tb->nlog_recent, lo), hi, k, out);
}

/* Keep out[from:] entries not in the sorted set a[0:n]. */
static void drop_hidden(query_results *out, size_t from, const uint64_t *a, size_t n) {
    if (!n)
        return;
    size_t m = from;
    for (size_t i = from; i < out->n; i++)
        if (!contains(a, n, out->fp[i]))
            out->fp[m++] = out->fp[i];
    out->n = m;
}

/* The checks of a tombstone chunk (FORMAT.md 7.8) found under key: 0 with
 * *entries set, or QUERY_CORRUPT. */
static int tomb_chunk_check(const uint8_t *key, const uint8_t *val, size_t vlen,
                            size_t *entries, query_error *err) {
    if (vlen < CHUNK_HEADER_BYTES)
        return corrupt(err, "tombstone chunk shorter than its header");
    uint64_t n = load_le64(val + 24);
    if (val[4] != RUN_KIND_TOMBSTONES || val[5] & ~(CHUNK_FLAG_FIRST | CHUNK_FLAG_LAST) ||
        val[6] || val[7] || load_le32(val + 12) != 0 || n < 1 ||
        n > (vlen - CHUNK_HEADER_BYTES) / TOMBSTONE_BYTES ||
        vlen != CHUNK_HEADER_BYTES + n * TOMBSTONE_BYTES)
        return corrupt(err, "tombstone chunk header impossible");
    if (crc32c_extend(crc32c_extend(0, key, CHUNK_KEY_BYTES), val + 4, vlen - 4) != load_le32(val))
        return corrupt(err, "tombstone chunk checksum mismatch");
    if (!names_its_run(key, val))
        return corrupt(err, "chunk names another run");
    const uint8_t *pairs = val + CHUNK_HEADER_BYTES;
    uint64_t prev = load_le64(val + 16);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t v = load_le64(pairs + i * TOMBSTONE_BYTES);
        if ((i || !(val[5] & CHUNK_FLAG_FIRST)) && v <= prev)
            return corrupt(err, "tombstone chunk values out of order");
        prev = v;
    }
    if (prev != load_be64(key + 5))
        return corrupt(err, "tombstone chunk's last value differs from its key");
    *entries = (size_t)n;
    return 0;
}

/* Whether tombstone run r holds v: 1, 0, or QUERY_CORRUPT.  One search of
 * the chunks tree for the chunk whose range holds v, then of the chunk. */
static int tombstoned_in(const query_snapshot *s, int r, uint64_t v, query_error *err) {
    if (v > s->tomb_last[r])
        return 0;
    err->table = SPACE_TOMBSTONES;
    err->run_id = s->tomb_run_id[r];
    err->has_key = 0;
    uint8_t key[CHUNK_KEY_BYTES];
    chunk_key(key, SPACE_TOMBSTONES, s->tomb_run_id[r], v);
    mdbp_cursor c;
    mdbp_error pe;
    int rc = mdbp_seek(&s->map, &s->chunks, key, CHUNK_KEY_BYTES, 0, &c, &pe);
    const uint8_t *k8, *val;
    size_t klen, vlen, n;
    unsigned flags;
    if (rc == MDBP_FOUND) {
        mdbp_key(&c, &k8, &klen);
        if (klen != CHUNK_KEY_BYTES || memcmp(k8, key, 5) != 0)
            rc = MDBP_END;
    }
    if (rc == MDBP_CORRUPT || (rc == MDBP_FOUND && mdbp_value(&c, &val, &vlen, &flags, &pe) < 0)) {
        err->pgno = pe.pgno;
        return corrupt(err, pe.what);
    }
    /* v is at most the run's last value, so some chunk must hold its range. */
    if (rc != MDBP_FOUND)
        return corrupt(err, "no tombstone chunk covers a value inside the run");
    memcpy(err->key, k8, CHUNK_KEY_BYTES);
    err->has_key = 1;
    if (flags != 0 && flags != MDBP_F_BIGDATA)
        return corrupt(err, "chunk node has database flags");
    /* Chunks start near page boundaries: hash the address, then look in
     * TOMB_PROBE_SLOTS slots from there. */
    const size_t home = (size_t)(((uintptr_t)val * 0x9E3779B97F4A7C15ull) >> 32);
    int seen = 0;
    for (size_t i = 0; i < TOMB_PROBE_SLOTS && !seen; i++)
        seen = s->tomb_verified[(home + i) & (s->tomb_slots - 1)] == val;
    if (seen) {
        n = (size_t)load_le64(val + 24);
    } else {
        /* The check reads the whole chunk (up to 64 KB) in order; the map
         * is MADV_RANDOM, so on a cold file each of its pages would be a
         * read of its own, one after another (16 of a cold first query's
         * 25 at 30M): ask for them all at once. */
        mdbp_hint(val, vlen);
        if (tomb_chunk_check(k8, val, vlen, &n, err) < 0)
            return QUERY_CORRUPT;
        size_t at = home;
        for (size_t i = 0; i < TOMB_PROBE_SLOTS; i++)
            if (!s->tomb_verified[(home + i) & (s->tomb_slots - 1)]) {
                at = home + i;
                break;
            }
        s->tomb_verified[at & (s->tomb_slots - 1)] = val; /* a benign race: another thread
                                                             may set it too */
    }
    /* The chunk holds (low fence, its key]: a low fence at or above v means
     * the chunk before it is missing. */
    if (!(val[5] & CHUNK_FLAG_FIRST) && load_le64(val + 16) >= v)
        return corrupt(err, "tombstone chunk fences do not match its neighbours");
    const uint8_t *pairs = val + CHUNK_HEADER_BYTES;
    size_t a = 0, b = n;
    while (a < b) {
        size_t mid = (a + b) / 2;
        if (load_le64(pairs + mid * TOMBSTONE_BYTES) < v)
            a = mid + 1;
        else
            b = mid;
    }
    return a < n && load_le64(pairs + a * TOMBSTONE_BYTES) == v;
}

/* Whether any tombstone run holds v: 1, 0, or QUERY_CORRUPT. */
static int tombstoned(const query_snapshot *s, uint64_t v, query_error *err) {
    for (int r = 0; r < s->ntomb; r++) {
        int rc = tombstoned_in(s, r, v, err);
        if (rc)
            return rc;
    }
    return 0;
}

/* Keep out[from:] entries that a run may report: in neither the log's
 * removals nor the tombstone run. */
static int drop_hidden_from_runs(const query_snapshot *s, query_results *out, size_t from,
                                 query_error *err) {
    drop_hidden(out, from, s->hide_runs, s->nhide_runs);
    drop_hidden(out, from, s->hide_tombs, s->nhide_tombs);
    if (!s->ntomb)
        return 0;
    size_t m = from;
    for (size_t i = from; i < out->n; i++) {
        int rc = tombstoned(s, out->fp[i], err);
        if (rc < 0)
            return rc;
        if (!rc)
            out->fp[m++] = out->fp[i];
    }
    out->n = m;
    return 0;
}

/* Listed runs of a table: find each one's block holding lo and prefetch it,
 * so the cache misses of all runs overlap instead of queueing up. */
static void prefetch_listed(const query_table *tb, uint64_t lo) {
    for (int r = 0; r < tb->nruns; r++) {
        const query_run *run = &tb->runs[r];
        if (!run->dir || lo > run->last || (run->has_hi && lo > run->hi))
            continue;
        uint64_t from = run->has_lo && lo <= run->lo ? run->lo + 1 : lo;
        size_t b = directory_block(run->dir, from);
        if (b < run->dir->nblocks) {
            const uint8_t *blk = run->dir->block[b];
            for (int line = 0; line < BLOCK_BYTES; line += 256)
                __builtin_prefetch(blk + line);
        }
    }
}

/* query_one locates the blocks of this many tables' listed runs (the first
 * LOCATE_RUNS of each) before probing any of them. */
#define LOCATE_TABLES 8
#define LOCATE_RUNS 16

/* What query_one probes in one table: q permuted, and the range that can
 * hold a match: q's prefix bucket, or for k = 0 (an exact lookup) q alone. */
typedef struct {
    uint64_t qp, lo, hi;
} table_probe;

static inline table_probe table_probe_of(const query_table *tb, uint64_t q, int k) {
    uint64_t mask = prefix_mask(tb->p), qp = perm_apply(&tb->fwd, q);
    if (k == 0)
        return (table_probe){qp, qp, qp};
    return (table_probe){qp, qp & mask, (qp & mask) | ~mask};
}

/* The search aid of a listed run or a run in memory; NULL for the others. */
static inline const search_aid *run_aid(const query_run *run) {
    return run->mem ? run->mem_aid : run->dir ? &run->dir->aid : NULL;
}

/* For tables [t0, t1) probed at tp[]: at[t - t0][r], the first block of
 * each listed run r for its clipped range (of a run in memory, its first
 * value there), NOT_LOCATED for the others, and
 * log_at[t - t0], the first position of the table's log at or above its
 * range.  In four passes over every run and log -- the guide, the top
 * array, the group of last[] values, the block -- each prefetching what
 * the next one reads, so the misses of every table and run overlap instead
 * of queueing one behind another (a log searched on its own cost a query
 * three misses a table). */
static void locate_listed(const query_snapshot *s, int t0, int t1, const table_probe *tp,
                          size_t at[][LOCATE_RUNS], size_t *log_at) {
    aid_search search[LOCATE_TABLES][LOCATE_RUNS + 1]; /* [.][LOCATE_RUNS]: the log */
    for (int t = t0; t < t1; t++) {
        const query_table *tb = &s->tables[t];
        for (int r = 0; r < LOCATE_RUNS; r++) {
            at[t - t0][r] = NOT_LOCATED;
            if (r >= tb->nruns)
                continue;
            const query_run *run = &tb->runs[r];
            uint64_t lo = tp[t - t0].lo, hi = tp[t - t0].hi;
            if (!run_aid(run) || !clip_to_run(run, &lo, &hi))
                continue;
            aid_search_start(run_aid(run), lo, &search[t - t0][r]);
            at[t - t0][r] = 0;
        }
        aid_search_start(&tb->log_aid, tp[t - t0].lo, &search[t - t0][LOCATE_RUNS]);
    }
    for (int t = t0; t < t1; t++) {
        const query_table *tb = &s->tables[t];
        for (int r = 0; r < LOCATE_RUNS && r < tb->nruns; r++)
            if (at[t - t0][r] != NOT_LOCATED)
                aid_search_guide(run_aid(&tb->runs[r]), &search[t - t0][r]);
        aid_search_guide(&tb->log_aid, &search[t - t0][LOCATE_RUNS]);
    }
    for (int t = t0; t < t1; t++) {
        const query_table *tb = &s->tables[t];
        for (int r = 0; r < LOCATE_RUNS && r < tb->nruns; r++) {
            if (at[t - t0][r] == NOT_LOCATED)
                continue;
            const query_run *run = &tb->runs[r];
            size_t g = aid_search_group(run_aid(run), &search[t - t0][r]);
            at[t - t0][r] = g;
            if (run->mem) {
                if (g < run->mem_aid->ntop) {
                    __builtin_prefetch(run->mem + g * DIRECTORY_GROUP);
                    __builtin_prefetch(run->mem + g * DIRECTORY_GROUP + 8);
                }
                continue;
            }
            const run_directory *d = run->dir;
            if (g < d->aid.ntop) {
                __builtin_prefetch(d->last + g * DIRECTORY_GROUP);
                __builtin_prefetch(d->last + g * DIRECTORY_GROUP + 8);
                __builtin_prefetch(d->block + g * DIRECTORY_GROUP);
                __builtin_prefetch(d->block + g * DIRECTORY_GROUP + 8);
            }
        }
        size_t g = aid_search_group(&tb->log_aid, &search[t - t0][LOCATE_RUNS]);
        if (g < tb->log_aid.ntop) {
            __builtin_prefetch(tb->log + g * DIRECTORY_GROUP);
            __builtin_prefetch(tb->log + g * DIRECTORY_GROUP + 8);
        }
        log_at[t - t0] = g;
    }
    for (int t = t0; t < t1; t++) {
        const query_table *tb = &s->tables[t];
        for (int r = 0; r < LOCATE_RUNS && r < tb->nruns; r++) {
            if (at[t - t0][r] == NOT_LOCATED)
                continue;
            const query_run *run = &tb->runs[r];
            if (run->mem) {
                at[t - t0][r] = group_lower_bound(run->mem, run->nmem, run->mem_aid->ntop,
                                                  at[t - t0][r], search[t - t0][r].v);
                continue;
            }
            const run_directory *d = run->dir;
            size_t b = group_block(d, at[t - t0][r], search[t - t0][r].v);
            at[t - t0][r] = b;
            if (b < d->nblocks) {
                const uint8_t *blk = d->block[b];
                __builtin_prefetch(d->verified + b);
                if (tb->runs[r].kind == RUN_KIND_RAW)
                    raw_prefetch(blk, b > 0, b > 0 ? d->last[b - 1] : 0, d->last[b],
                                 search[t - t0][r].v, tp[t - t0].hi);
                else
                    coded_prefetch(blk, b > 0, b > 0 ? d->last[b - 1] : 0, d->last[b],
                                   search[t - t0][r].v, tp[t - t0].hi);
            }
        }
        log_at[t - t0] = group_lower_bound(tb->log, tb->nlog, tb->log_aid.ntop, log_at[t - t0],
                                           tp[t - t0].lo);
    }
}

/* A value can be found in several runs of one table, its log and the
 * pending additions: sort out[start..], drop repeats, then order by
 * distance to q (values ascending within one) and tag them with qidx. */
static int finish_matches(query_results *out, size_t start, uint64_t q, int64_t qidx) {
    size_t n = out->n - start;
    uint64_t *fp = out->fp + start;
    if (n <= 32) {
        /* A query finds a handful of candidates: insertion sort beats qsort's
         * callback per comparison. */
        for (size_t i = 1; i < n; i++) {
            uint64_t v = fp[i];
            size_t j = i;
            for (; j > 0 && fp[j - 1] > v; j--)
                fp[j] = fp[j - 1];
            fp[j] = v;
        }
    } else {
        qsort(fp, n, sizeof *fp, cmp_u64);
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (i == 0 || fp[i] != fp[i - 1])
            fp[m++] = fp[i];
    /* Stable counting sort by distance keeps values ascending within one. */
    if (m > 1) {
        size_t bucket[65] = {0};
        for (size_t i = 0; i < m; i++)
            bucket[popcount64(fp[i] ^ q)]++;
        uint64_t small[64];
        uint64_t *tmp = m <= 64 ? small : malloc(m * sizeof *tmp);
        if (!tmp)
            return QUERY_NOMEM;
        size_t pos[65], acc = 0;
        for (int d = 0; d <= 64; d++) {
            pos[d] = acc;
            acc += bucket[d];
        }
        for (size_t i = 0; i < m; i++)
            tmp[pos[popcount64(fp[i] ^ q)]++] = fp[i];
        memcpy(fp, tmp, m * sizeof *fp);
        if (tmp != small)
            free(tmp);
    }
    for (size_t i = 0; i < m; i++) {
        out->dist[start + i] = (uint8_t)popcount64(fp[i] ^ q);
        out->qidx[start + i] = qidx;
    }
    out->n = start + m;
    return 0;
}

/* Probe every run of tables [t0, t1) (the listed ones located by
 * locate_listed): every block holding part of a table's range is queued,
 * and all of them decode side by side. */
static int probe_tables(const query_snapshot *s, int t0, int t1, const table_probe *tp,
                        uint64_t q, int k, size_t at[][LOCATE_RUNS], query_results *out,
                        query_error *err) {
    job_queue jq = {.s = s, .q = q, .out = out, .err = err};
    for (int t = t0; t < t1; t++) {
        const query_table *tb = &s->tables[t];
        for (int r = 0; r < tb->nruns; r++) {
            size_t b = r < LOCATE_RUNS ? at[t - t0][r] : NOT_LOCATED;
            int rc = probe_run(&jq, t, &tb->runs[r], tp[t - t0].qp, tp[t - t0].lo,
                               tp[t - t0].hi, k, b);
            if (rc < 0)
                return rc;
        }
    }
    return queue_flush(&jq);
}

void query_prefetch(const query_snapshot *s, uint64_t q, int k) {
    enum { MAX_SEEKS = 256 };
    uint8_t keys[MAX_SEEKS][CHUNK_KEY_BYTES];
    uint64_t los[MAX_SEEKS];
    const uint8_t *vals[MAX_SEEKS];
    size_t vlens[MAX_SEEKS];
    int n = 0;
    const int ntables = k == 0 ? 1 : s->ntables;
    for (int t = 0; t < ntables; t++) {
        const query_table *tb = &s->tables[t];
        const table_probe tp = table_probe_of(tb, q, k);
        for (int r = 0; r < tb->nruns && n < MAX_SEEKS; r++) {
            const query_run *run = &tb->runs[r];
            uint64_t lo = tp.lo, hi = tp.hi;
            if (run->dir || run->mem || !clip_to_run(run, &lo, &hi))
                continue;
            chunk_key(keys[n], run->space, run->run_id, lo);
            los[n++] = lo;
        }
    }
    if (!n)
        return;
    mdbp_prefetch_seeks(&s->map, &s->chunks, &keys[0][0], CHUNK_KEY_BYTES, n, vals, vlens);
    /* The chunks' headers and block keys, then the block holding lo. */
    for (int i = 0; i < n; i++)
        if (vals[i])
            mdbp_hint(vals[i], vlens[i] < 4096 ? vlens[i] : 4096);
    for (int i = 0; i < n; i++) {
        if (!vals[i] || vlens[i] < CHUNK_HEADER_BYTES)
            continue;
        unsigned nblocks = (unsigned)vals[i][6] | ((unsigned)vals[i][7] << 8);
        if (nblocks < 1 || nblocks > CHUNK_MAX_BLOCKS ||
            vlens[i] != CHUNK_HEADER_BYTES + (size_t)nblocks * (8 + BLOCK_BYTES))
            continue;
        const uint8_t *bkeys = vals[i] + CHUNK_HEADER_BYTES;
        unsigned b = 0;
        while (b + 1 < nblocks && load_le64(bkeys + 8 * b) < los[i])
            b++;
        mdbp_hint(bkeys + 8 * (size_t)nblocks + (size_t)b * BLOCK_BYTES, BLOCK_BYTES);
    }
}

/* The indexed pending additions of table t of s in [lo, hi] within k of q
 * (qp: q permuted by the table): the two sorted arrays part[0..1] of
 * npart[0..1] values, that table's share of a pending_index. */
static int index_candidates(const query_snapshot *s, int t, const uint64_t *const *part,
                            const size_t *npart, uint64_t q, uint64_t qp, uint64_t lo,
                            uint64_t hi, int k, query_results *out) {
    for (int j = 0; j < 2; j++)
        if (scan_candidates(s, t, &s->tables[t], q, qp, part[j], npart[j],
                            lower_bound_u64(part[j], npart[j], lo), hi, k, out) < 0)
            return QUERY_NOMEM;
    return 0;
}

HOT_KERNEL int query_one(const query_snapshot *s, const query_pending *pend, uint64_t q, int k,
                         int64_t qidx, query_results *out, query_error *err) {
    size_t start = out->n;
    /* Every table holds every fingerprint: an exact lookup (k = 0) needs one. */
    const int ntables = k == 0 ? 1 : s->ntables;
    table_probe tp[LOCATE_TABLES];
    size_t at[LOCATE_TABLES][LOCATE_RUNS], log_at[LOCATE_TABLES];
    for (int t0 = 0; t0 < ntables; t0 += LOCATE_TABLES) {
        int t1 = t0 + LOCATE_TABLES < ntables ? t0 + LOCATE_TABLES : ntables;
        for (int t = t0; t < t1; t++)
            tp[t - t0] = table_probe_of(&s->tables[t], q, k);
        locate_listed(s, t0, t1, tp, at, log_at);
        size_t group_start = out->n;
        int rc = probe_tables(s, t0, t1, tp, q, k, at, out, err);
        if (rc < 0) {
            out->n = start;
            return rc;
        }
        /* Drop what the runs found but tombstones or later removals hide,
         * then add what the logs find. */
        rc = drop_hidden_from_runs(s, out, group_start, err);
        if (rc < 0) {
            out->n = start;
            return rc;
        }
        for (int t = t0; t < t1; t++) {
            if (log_candidates(s, t, &s->tables[t], q, tp[t - t0].qp, tp[t - t0].lo,
                               tp[t - t0].hi, k, log_at[t - t0], out) < 0)
                return QUERY_NOMEM;
            if (pend && pend->index &&
                index_candidates(s, t, pend->index->part + 2 * t, pend->index->npart + 2 * t, q,
                                 tp[t - t0].qp, tp[t - t0].lo, tp[t - t0].hi, k, out) < 0)
                return QUERY_NOMEM;
        }
    }
    /* Then the pending additions, and last drop what pending removals hide
     * (the additions are not among them, but the index may hold values
     * removed since it was built). */
    for (size_t i = 0; pend && i < pend->nadds; i++)
        if (popcount64(pend->adds[i] ^ q) <= k) {
            if (reserve(out, 1) < 0)
                return QUERY_NOMEM;
            out->fp[out->n++] = pend->adds[i];
        }
    if (pend)
        drop_hidden(out, start, pend->removes, pend->nremoves);
    return finish_matches(out, start, q, qidx);
}

/* Prefixes probed together: the blocks of the group's listed runs are
 * prefetched first, so that their cache misses overlap. */
#define PREFIX_GROUP 32

HOT_KERNEL int query_prefixes(const query_snapshot *s, const query_pending *pend, int t,
                              uint64_t q, int k, const uint64_t *prefixes, size_t nprefixes,
                              int64_t qidx, query_results *out, query_error *err) {
    /* Only table t is probed, so a candidate has no earlier table to defer
     * to: a view of the snapshot whose only table is t makes add_candidate
     * keep every one, and lets probe_run serve unchanged. */
    query_snapshot one = *s;
    one.tables = &s->tables[t];
    one.ntables = 1;
    const query_table *tb = one.tables;
    const int p = tb->p, shift = 64 - p;
    const uint64_t mask = p <= 0 ? 0 : (p >= 64 ? ~0ull : ~0ull << shift);
    const uint64_t qp = perm_apply(&tb->fwd, q);
    size_t start = out->n;
    job_queue jq = {.s = &one, .q = q, .out = out, .err = err};
    for (size_t g = 0; g < nprefixes; g += PREFIX_GROUP) {
        size_t end = nprefixes - g < PREFIX_GROUP ? nprefixes : g + PREFIX_GROUP;
        for (size_t i = g; i < end; i++)
            prefetch_listed(tb, p <= 0 ? 0 : prefixes[i] << shift);
        for (size_t i = g; i < end; i++) {
            uint64_t lo = p <= 0 ? 0 : prefixes[i] << shift, hi = lo | ~mask;
            /* An entry x under this prefix agrees with the probe value qf on
             * the prefix, and q differs from qf in exactly the flipped prefix
             * bits: d(x, q) = d(x, qf) + flips.  So the block probe asks for
             * k - flips around qf, and reports exactly the x within k of q. */
            int flips = popcount64((lo ^ qp) & mask);
            if (flips > k)
                continue;
            uint64_t qf = lo | (qp & ~mask);
            for (int r = 0; r < tb->nruns; r++) {
                int rc = probe_run(&jq, 0, &tb->runs[r], qf, lo, hi, k - flips, NOT_LOCATED);
                if (rc < 0) {
                    err->table = t;
                    out->n = start;
                    return rc;
                }
            }
        }
    }
    int rc = queue_flush(&jq);
    if (rc < 0) {
        err->table = t;
        out->n = start;
        return rc;
    }
    rc = drop_hidden_from_runs(s, out, start, err);
    if (rc < 0) {
        out->n = start;
        return rc;
    }
    for (size_t j = 0; j < nprefixes; j++) {
        uint64_t lo = p <= 0 ? 0 : prefixes[j] << shift, hi = lo | ~mask;
        if (log_candidates(&one, 0, tb, q, qp, lo, hi, k, NOT_LOCATED, out) < 0)
            return QUERY_NOMEM;
        if (pend && pend->index &&
            index_candidates(&one, 0, pend->index->part + 2 * t, pend->index->npart + 2 * t, q,
                             qp, lo, hi, k, out) < 0)
            return QUERY_NOMEM;
    }
    if (pend && pend->nadds) {
        /* Pending additions count as stored: reported when within k and
         * under a probed prefix, as if they were in the log. */
        uint64_t *sorted = malloc((nprefixes ? nprefixes : 1) * sizeof *sorted);
        if (!sorted)
            return QUERY_NOMEM;
        memcpy(sorted, prefixes, nprefixes * sizeof *sorted);
        qsort(sorted, nprefixes, sizeof *sorted, cmp_u64);
        for (size_t i = 0; i < pend->nadds; i++) {
            uint64_t v = pend->adds[i];
            if (popcount64(v ^ q) > k ||
                !contains(sorted, nprefixes, p <= 0 ? 0 : perm_apply(&tb->fwd, v) >> shift))
                continue;
            if (reserve(out, 1) < 0) {
                free(sorted);
                return QUERY_NOMEM;
            }
            out->fp[out->n++] = v;
        }
        free(sorted);
    }
    /* Last, as in query_one: the index may hold values removed since. */
    if (pend)
        drop_hidden(out, start, pend->removes, pend->nremoves);
    return finish_matches(out, start, q, qidx);
}
