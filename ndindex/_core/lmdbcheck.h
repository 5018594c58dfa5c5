/* Checking every LMDB 0.9 structure of a file, trusting no byte.
 *
 * The checker walks one snapshot (the meta page LMDB would open, or the
 * other one) as LMDB's own audit does (mdb.c, mdb_audit), but reading the
 * mapped file through lmdbpage.h instead of asking LMDB: both meta pages;
 * every tree -- the free database, the main database and each named
 * database it lists, with their duplicate-sort sub-pages and sub-databases
 * -- page by page, with fences between levels; overflow runs; the free list.
 * It marks each page with what uses it, so that a page reachable twice, a
 * free page also in use, and a page neither used nor free are found; and it
 * compares each tree record's counts with what was walked.
 *
 * format-spec/lmdb.md is the normative text: every check below is one of
 * its numbered statements.  Cost: one pass over the tree pages (overflow
 * pages are only marked, not read), O(pages) bytes of memory. */
#ifndef NDINDEX_LMDBCHECK_H
#define NDINDEX_LMDBCHECK_H
#include "lmdbpage.h"

/* The free database, the main database, then up to 62 named databases. */
#define MDBC_MAX_TREES 64
#define MDBC_TREE_FREE 0
#define MDBC_TREE_MAIN 1
#define MDBC_NO_TREE 0xFF
#define MDBC_NOMEM (-2)

/* What a page of the file is, in the snapshot checked. */
enum mdbc_kind {
    MDBC_UNSEEN = 0,        /* nothing reached it (only while checking) */
    MDBC_META = 1,          /* page 0 or 1 */
    MDBC_BRANCH = 2,        /* a branch page of a tree */
    MDBC_LEAF = 3,          /* a leaf page of a tree */
    MDBC_OVERFLOW = 4,      /* the first page of an overflow run */
    MDBC_OVERFLOW_MORE = 5, /* a later page of an overflow run (no header) */
    MDBC_FREE = 6,          /* listed in the free list */
    MDBC_TAIL = 7,          /* after the meta page's last page: no snapshot uses it */
};

/* One tree of the snapshot and what the walk found in it. */
typedef struct {
    const uint8_t *name; /* its key in the main database (NULL for free and main) */
    size_t name_len;
    mdbp_db db; /* its record, as stored */
    uint64_t branch_pages, leaf_pages, overflow_pages, entries; /* walked */
    uint64_t dup_pages;              /* pages of its duplicate-sort sub-databases */
    uint64_t key_bytes, value_bytes; /* stored keys and values (dups count as keys) */
} mdbc_tree;

typedef struct {
    int slot; /* the meta page checked */
    mdbp_meta meta;
    uint64_t file_pages;    /* whole pages in the file */
    uint64_t free_pages;    /* pages listed free */
    uint64_t free_past_end; /* of those, past the end of the file */
    uint64_t free_records;  /* records in the free database */
    uint64_t tail_pages;    /* pages of the file after the meta page's last page */
    unsigned ntrees;
    mdbc_tree tree[MDBC_MAX_TREES];
    int error_tree; /* after a failure: the tree where it was found, or -1 */
} mdbc_report;

/* Check both meta pages of a file of `avail` bytes and pick the one LMDB
 * opens (the larger transaction id; meta 0 on a tie).  psize 0 takes the
 * page size from page 0.  Returns that slot (0 or 1), or MDBP_CORRUPT with
 * *e set (e->pgno is the meta page). */
int mdbc_check_metas(const uint8_t *file, size_t avail, uint32_t psize, mdbp_meta meta[2],
                     mdbp_error *e);

/* Check the snapshot of meta page `slot` (-1: the one LMDB opens) of a file
 * of `avail` bytes with page size psize (0: from page 0).  kind and owner,
 * avail / psize bytes each, receive every page's enum mdbc_kind and the
 * index of its tree in r->tree (MDBC_NO_TREE for meta, free and tail
 * pages).  Returns 0; MDBP_CORRUPT with *e set and r->error_tree naming the
 * tree; or MDBC_NOMEM. */
int mdbc_check(const uint8_t *file, size_t avail, uint32_t psize, int slot, mdbc_report *r,
               uint8_t *kind, uint8_t *owner, mdbp_error *e);

#endif
