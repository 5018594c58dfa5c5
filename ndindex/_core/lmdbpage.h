/* Reading LMDB 0.9 files (data version 1) in place, trusting no byte.
 *
 * ndindex reads its own records through these functions, not through LMDB,
 * so that a damaged page gives an error instead of a crash, an assertion or
 * a silently different answer.  Every page number, offset, count and size
 * taken from the file is bounds-checked before it is used; each page must
 * name itself (its header holds its own page number) and hold keys inside
 * the range its parent gave it (fences).  format-spec/FORMAT.md section 8
 * lists every LMDB field read here and the checks made on it.
 *
 * Pages of a committed LMDB snapshot never change while a read transaction
 * holds it, so the caller keeps one open for as long as it uses the map. */
#ifndef NDINDEX_LMDBPAGE_H
#define NDINDEX_LMDBPAGE_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MDBP_PAGE_HEADER 16
#define MDBP_NODE_HEADER 8
#define MDBP_DB_BYTES 48
#define MDBP_META_BYTES 136 /* magic .. txnid, after the page header */
#define MDBP_MAX_DEPTH 16
#define MDBP_MAX_KEY 511
#define MDBP_INVALID_PGNO (~(uint64_t)0)

#define MDBP_P_BRANCH 0x01
#define MDBP_P_LEAF 0x02
#define MDBP_P_OVERFLOW 0x04
#define MDBP_P_META 0x08
#define MDBP_F_BIGDATA 0x01
#define MDBP_F_SUBDATA 0x02
#define MDBP_F_DUPDATA 0x04

enum mdbp_status {
    MDBP_END = 0,   /* no entry at or after the key */
    MDBP_FOUND = 1, /* the cursor is on an entry */
    MDBP_CORRUPT = -1,
};

/* The file as mapped: pages [0, npages) may be read. */
typedef struct {
    const uint8_t *base;
    uint64_t npages;
    uint32_t psize;
} mdbp_map;

/* MDB_db: one B-tree's record in a meta page or in the main database. */
typedef struct {
    uint32_t pad;
    uint16_t flags, depth;
    uint64_t branch_pages, leaf_pages, overflow_pages, entries, root;
} mdbp_db;

/* MDB_meta: the start of one committed snapshot. */
typedef struct {
    uint32_t version, psize;
    uint16_t env_flags;
    uint64_t mapsize, last_pg, txnid;
    mdbp_db free_db, main_db;
} mdbp_meta;

/* What was wrong and where; `what` is a static string. */
typedef struct {
    uint64_t pgno;
    const char *what;
} mdbp_error;

/* Fixed-width loads: LMDB writes host order, and ndindex supports
 * little-endian hosts only (FORMAT.md section 8.1).  Shared by the page
 * reader and the checker. */
static inline uint16_t ld16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline uint32_t ld32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t ld64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Record what is wrong where; returns MDBP_CORRUPT. */
static inline int mdbp_fail(mdbp_error *e, uint64_t pgno, const char *what) {
    e->pgno = pgno;
    e->what = what;
    return MDBP_CORRUPT;
}

/* A key order: negative, zero or positive as a sorts before, with or after b. */
typedef int (*mdbp_compare_fn)(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen);

/* MDB_db flag: keys are native integers (the free database's order). */
#define MDBP_DB_INTEGERKEY 0x08

/* A position in a tree: the pages from the root down to a leaf, the node
 * index on each, and the key range each page must hold (its fences). */
typedef struct {
    const mdbp_map *map;
    int depth;
    int check_all; /* check every node of each page visited, not only those used */
    mdbp_compare_fn cmp; /* the tree's key order (integer keys: mdbp_compare_uint) */
    const uint8_t *page[MDBP_MAX_DEPTH];
    unsigned index[MDBP_MAX_DEPTH], nkeys[MDBP_MAX_DEPTH];
    const uint8_t *lo[MDBP_MAX_DEPTH], *hi[MDBP_MAX_DEPTH]; /* NULL: unbounded */
    uint16_t lo_len[MDBP_MAX_DEPTH], hi_len[MDBP_MAX_DEPTH];
} mdbp_cursor;

/* What is wrong with a free-list value, or NULL: an ID list (mdb.c,
 * midl.h), a count, then that many page numbers, decreasing, each a page
 * of the snapshot (2..last_pg); LMDB may reserve a longer value than the
 * list fills (format-spec/lmdb.md [L32]).  The checker and every write
 * check each record with it: LMDB trusts the lists, and one out of order
 * aborted a later commit (mdb_freelist_save: "pglast <= env->me_pglast"). */
const char *mdbp_free_list_problem(const uint8_t *val, size_t vlen, uint64_t last_pg);

/* Parse and check the meta page in slot 0 or 1 of a file's first bytes
 * (`avail` of them).  psize_hint 0 takes the page size from the page itself
 * (slot 0 only).  Returns 0, or MDBP_CORRUPT with *e set. */
int mdbp_read_meta(const uint8_t *file, size_t avail, int slot, uint32_t psize_hint,
                   mdbp_meta *out, mdbp_error *e);

/* Parse an MDB_db record (48 bytes, native order) and check it against the
 * map: root in range (or none), depth 0..MDBP_MAX_DEPTH and consistent. */
int mdbp_parse_db(const mdbp_map *map, const uint8_t *raw, mdbp_db *out, mdbp_error *e);

/* Position c on the first entry whose key is >= key (set_range), checking
 * every page on the way.  Returns MDBP_FOUND, MDBP_END or MDBP_CORRUPT. */
int mdbp_seek(const mdbp_map *map, const mdbp_db *db, const uint8_t *key, size_t klen,
              int check_all, mdbp_cursor *c, mdbp_error *e);

/* Step to the next entry: MDBP_FOUND, MDBP_END or MDBP_CORRUPT. */
int mdbp_next(mdbp_cursor *c, mdbp_error *e);

/* The key of the current entry. */
void mdbp_key(const mdbp_cursor *c, const uint8_t **key, size_t *klen);

/* The value of the current entry (following an overflow page if needed)
 * and its node flags.  Returns 0 or MDBP_CORRUPT. */
int mdbp_value(const mdbp_cursor *c, const uint8_t **val, size_t *vlen, unsigned *flags,
               mdbp_error *e);

/* Exact lookup: MDBP_FOUND with *val and *vlen set, MDBP_END, or MDBP_CORRUPT. */
int mdbp_get(const mdbp_map *map, const mdbp_db *db, const uint8_t *key, size_t klen,
             const uint8_t **val, size_t *vlen, unsigned *flags, mdbp_error *e);

/* Ask the page cache for what seeks of keys[0..n) (klen bytes each) will
 * read, one tree level at a time: every distinct page of a level is asked
 * for at once (madvise WILLNEED), then read to find the next level's, so
 * that on a cold file the reads of all n descents overlap instead of
 * queueing one behind another.  vals[i]: the value (or its overflow pages)
 * of the leaf node seek i will land on, or NULL; not read, only asked for.
 * Damage ends a descent quietly (the real seek reports it).  n <= 256. */
void mdbp_prefetch_seeks(const mdbp_map *map, const mdbp_db *db, const uint8_t *keys,
                         size_t klen, int n, const uint8_t **vals, size_t *vlens);

/* madvise(WILLNEED) of the pages holding [p, p + len) of a map. */
void mdbp_hint(const void *p, size_t len);

/* Full check of one branch or leaf page: header, every node in bounds, keys
 * strictly increasing and inside [lo, hi).  kind is MDBP_P_BRANCH or
 * MDBP_P_LEAF.  Returns 0 or MDBP_CORRUPT. */
int mdbp_check_page(const mdbp_map *map, uint64_t pgno, unsigned kind, const uint8_t *lo,
                    size_t lo_len, const uint8_t *hi, size_t hi_len, mdbp_error *e);

/* Memory comparison as LMDB's default key order: bytes, then length. */
int mdbp_compare(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen);


/* MDB_INTEGERKEY order (the free database's): keys of 4 or 8 bytes compared
 * as native unsigned integers.  Keys of unequal or other sizes, which LMDB
 * never stores in such a tree, sort by size and then by bytes, so the order
 * stays total; callers check key sizes themselves. */
int mdbp_compare_uint(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen);

/* mdbp_check_page with the tree's key order cmp instead of mdbp_compare. */
int mdbp_check_page_by(const mdbp_map *map, uint64_t pgno, unsigned kind, mdbp_compare_fn cmp,
                       const uint8_t *lo, size_t lo_len, const uint8_t *hi, size_t hi_len,
                       mdbp_error *e);

#endif
