/* madvise and sysconf, which -std=c11 hides. */
#define _DEFAULT_SOURCE
#include "lmdbpage.h"

#include <sys/mman.h>
#include <unistd.h>

#include <string.h>

#define MDB_MAGIC 0xBEEFC0DEu
#define MDB_DATA_VERSION 1u
/* Environment flags LMDB keeps in the meta page (mm_flags), and the
 * database flags a tree record may carry (MDB_REVERSEKEY..MDB_INTEGERDUP). */
#define ENV_FLAGS_KNOWN 0xFFFFu
#define DB_FLAGS_KNOWN 0x7Eu
#define DB_DUPSORT 0x04u
#define DB_INTEGERKEY 0x08u

int mdbp_compare(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen) {
    size_t n = alen < blen ? alen : blen;
    int d = n ? memcmp(a, b, n) : 0;
    if (d)
        return d;
    return alen < blen ? -1 : alen > blen;
}

static void parse_db_raw(const uint8_t *r, mdbp_db *d) {
    d->pad = ld32(r);
    d->flags = ld16(r + 4);
    d->depth = ld16(r + 6);
    d->branch_pages = ld64(r + 8);
    d->leaf_pages = ld64(r + 16);
    d->overflow_pages = ld64(r + 24);
    d->entries = ld64(r + 32);
    d->root = ld64(r + 40);
}

static int check_db(uint64_t pages_limit, const mdbp_db *d, uint64_t where, mdbp_error *e) {
    /* LMDB 0.9 does not keep the page counts of a tree with sorted
     * duplicates (MDB_DUPSORT) exact: its duplicates' sub-database pages
     * are added to them and taken away unevenly, even left behind in an
     * emptied tree.  Only such a tree's depth and entries are checked. */
    int counted = !(d->flags & DB_DUPSORT);
    if (d->root == MDBP_INVALID_PGNO) {
        if (d->depth != 0 || d->entries != 0 ||
            (counted && (d->branch_pages || d->leaf_pages || d->overflow_pages)))
            return mdbp_fail(e, where, "empty tree with nonzero counts");
        return 0;
    }
    if (d->root < 2 || d->root >= pages_limit)
        return mdbp_fail(e, where, "tree root page out of range");
    if (d->depth < 1 || d->depth > MDBP_MAX_DEPTH)
        return mdbp_fail(e, where, "tree depth out of range");
    if (d->entries < 1 || (counted && d->leaf_pages < 1))
        return mdbp_fail(e, where, "non-empty tree without leaves or entries");
    if (counted && d->branch_pages + d->leaf_pages + d->overflow_pages >= pages_limit)
        return mdbp_fail(e, where, "tree page counts exceed the file");
    if (counted && (d->depth > 1) != (d->branch_pages > 0))
        return mdbp_fail(e, where, "tree depth disagrees with its branch page count");
    return 0;
}

int mdbp_read_meta(const uint8_t *file, size_t avail, int slot, uint32_t psize_hint,
                   mdbp_meta *out, mdbp_error *e) {
    uint32_t psize = psize_hint;
    if (slot == 0 && psize == 0) {
        /* mm_psize is the free database's md_pad: page header, then magic,
         * version, address and mapsize (24 bytes), then the MDB_db. */
        if (avail < MDBP_PAGE_HEADER + MDBP_META_BYTES)
            return mdbp_fail(e, 0, "file too short for a meta page");
        psize = ld32(file + MDBP_PAGE_HEADER + 24);
    }
    if (psize < 512 || psize > 65536 || (psize & (psize - 1)))
        return mdbp_fail(e, (uint64_t)slot, "meta page size is not a power of two in 512..65536");
    size_t off = (size_t)slot * psize;
    if (avail < off + MDBP_PAGE_HEADER + MDBP_META_BYTES)
        return mdbp_fail(e, (uint64_t)slot, "file too short for a meta page");
    const uint8_t *p = file + off;
    if (ld64(p) != (uint64_t)slot)
        return mdbp_fail(e, (uint64_t)slot, "meta page does not name itself");
    if ((ld16(p + 10) & ~0x10u) != MDBP_P_META) /* P_DIRTY may linger from a write */
        return mdbp_fail(e, (uint64_t)slot, "meta page flags are not P_META");
    const uint8_t *m = p + MDBP_PAGE_HEADER;
    if (ld32(m) != MDB_MAGIC)
        return mdbp_fail(e, (uint64_t)slot, "meta page magic is not LMDB's");
    out->version = ld32(m + 4);
    if (out->version != MDB_DATA_VERSION)
        return mdbp_fail(e, (uint64_t)slot, "LMDB data version is not 1");
    out->mapsize = ld64(m + 16);
    parse_db_raw(m + 24, &out->free_db);
    parse_db_raw(m + 24 + MDBP_DB_BYTES, &out->main_db);
    out->last_pg = ld64(m + 24 + 2 * MDBP_DB_BYTES);
    out->txnid = ld64(m + 24 + 2 * MDBP_DB_BYTES + 8);
    out->psize = out->free_db.pad;
    out->env_flags = out->free_db.flags;
    if (out->psize != psize)
        return mdbp_fail(e, (uint64_t)slot, "meta pages disagree on the page size");
    if (!(out->env_flags & DB_INTEGERKEY))
        return mdbp_fail(e, (uint64_t)slot, "free database lacks its integer-key flag");
    /* The free database's other tree flags are never set: with
     * MDB_DUPSORT LMDB's cursor on it asserts (abort) for want of a
     * duplicates cursor, and the others it refuses as MDB_INVALID. */
    if (out->env_flags & DB_FLAGS_KNOWN & ~DB_INTEGERKEY)
        return mdbp_fail(e, (uint64_t)slot, "free database has tree flags besides its integer key");
    if (out->last_pg < 1 || out->last_pg >= ((uint64_t)1 << 48))
        return mdbp_fail(e, (uint64_t)slot, "meta page's last page out of range");
    if (out->mapsize % psize)
        return mdbp_fail(e, (uint64_t)slot, "map size is not a whole number of pages");
    mdbp_db free_db = out->free_db;
    free_db.pad = 0;
    free_db.flags = 0;
    if (check_db(out->last_pg + 1, &free_db, (uint64_t)slot, e) < 0 ||
        check_db(out->last_pg + 1, &out->main_db, (uint64_t)slot, e) < 0)
        return MDBP_CORRUPT;
    /* The main database names the others: plain byte keys, no flags (with
     * one, LMDB lost the named databases or refused the file). */
    if (out->main_db.flags)
        return mdbp_fail(e, (uint64_t)slot, "main database has tree flags");
    return 0;
}

const char *mdbp_free_list_problem(const uint8_t *val, size_t vlen, uint64_t last_pg) {
    if (vlen < 8 || vlen % 8)
        return "free-list value is not a whole number of 8-byte words";
    uint64_t count = ld64(val);
    if (count > vlen / 8 - 1)
        return "free-list count exceeds its value";
    uint64_t prev = 0;
    for (uint64_t j = 1; j <= count; j++) {
        uint64_t pg = ld64(val + 8 * j);
        if (j > 1 && pg >= prev)
            return "free-list page numbers do not decrease";
        if (pg < 2 || pg > last_pg)
            return "free-list page number outside the snapshot's pages";
        prev = pg;
    }
    return NULL;
}

int mdbp_parse_db(const mdbp_map *map, const uint8_t *raw, mdbp_db *out, mdbp_error *e) {
    parse_db_raw(raw, out);
    if (out->flags & ~DB_FLAGS_KNOWN)
        return mdbp_fail(e, out->root, "database record has unknown flags");
    return check_db(map->npages, out, out->root, e);
}

/* A branch or leaf page, its header checked: it names itself, has the
 * expected kind and a free-space window inside the page. */
static int get_page(const mdbp_map *map, uint64_t pgno, unsigned kind, const uint8_t **out,
                    unsigned *nkeys, mdbp_error *e) {
    if (pgno < 2 || pgno >= map->npages)
        return mdbp_fail(e, pgno, "page number out of range");
    const uint8_t *p = map->base + pgno * map->psize;
    if (ld64(p) != pgno)
        return mdbp_fail(e, pgno, "page does not name itself");
    unsigned flags = ld16(p + 10);
    if (flags != kind)
        return mdbp_fail(e, pgno, kind == MDBP_P_LEAF ? "expected a leaf page" : "expected a branch page");
    unsigned lower = ld16(p + 12), upper = ld16(p + 14);
    if (lower < MDBP_PAGE_HEADER || lower > upper || upper > map->psize ||
        ((lower - MDBP_PAGE_HEADER) & 1))
        return mdbp_fail(e, pgno, "page free-space bounds impossible");
    unsigned n = (lower - MDBP_PAGE_HEADER) / 2;
    if (n < (kind == MDBP_P_BRANCH ? 2u : 1u))
        return mdbp_fail(e, pgno, "page holds too few nodes");
    *out = p;
    *nkeys = n;
    return 0;
}

/* Node i of a checked page, itself checked: header and key inside the node
 * area, and for leaves the data (or the overflow page number) too. */
static int get_node(const mdbp_map *map, const uint8_t *page, unsigned i, const uint8_t **node,
                    mdbp_error *e) {
    uint64_t pgno = ld64(page);
    unsigned upper = ld16(page + 14);
    unsigned off = ld16(page + MDBP_PAGE_HEADER + 2 * i);
    if (off < upper || off + MDBP_NODE_HEADER > map->psize)
        return mdbp_fail(e, pgno, "node offset outside the page's node area");
    const uint8_t *nd = page + off;
    unsigned ksize = ld16(nd + 6);
    size_t end = (size_t)off + MDBP_NODE_HEADER + ksize;
    if (ksize > MDBP_MAX_KEY || end > map->psize)
        return mdbp_fail(e, pgno, "node key runs past the page");
    if (ld16(page + 10) == MDBP_P_LEAF) {
        unsigned nflags = ld16(nd + 4);
        if (nflags & ~(unsigned)(MDBP_F_BIGDATA | MDBP_F_SUBDATA | MDBP_F_DUPDATA))
            return mdbp_fail(e, pgno, "leaf node has unknown flags");
        size_t dsize = (size_t)ld16(nd) | ((size_t)ld16(nd + 2) << 16);
        if (end + ((nflags & MDBP_F_BIGDATA) ? 8 : dsize) > map->psize)
            return mdbp_fail(e, pgno, "leaf node data runs past the page");
    }
    *node = nd;
    return 0;
}

static inline void node_key(const uint8_t *nd, const uint8_t **k, size_t *klen) {
    *k = nd + MDBP_NODE_HEADER;
    *klen = ld16(nd + 6);
}

static inline uint64_t node_child(const uint8_t *nd) {
    return (uint64_t)ld16(nd) | ((uint64_t)ld16(nd + 2) << 16) | ((uint64_t)ld16(nd + 4) << 32);
}

/* A leaf node's data (its overflow page number when F_BIGDATA) and size. */
static inline const uint8_t *node_data(const uint8_t *nd, size_t *dsize) {
    *dsize = (size_t)ld16(nd) | ((size_t)ld16(nd + 2) << 16);
    return nd + MDBP_NODE_HEADER + ld16(nd + 6);
}

/* Binary search of a checked page's n nodes as LMDB's mdb_node_search: in
 * a branch, *at is one past the last node whose key is <= key (node 0
 * stands for everything below node 1); in a leaf, the first node whose key
 * is >= key (n if none). */
static int node_search(const mdbp_map *map, const uint8_t *page, unsigned n, int leaf,
                       mdbp_compare_fn cmp, const uint8_t *key, size_t klen, unsigned *at,
                       mdbp_error *e) {
    unsigned lo = leaf ? 0 : 1, hi = n;
    while (lo < hi) {
        unsigned mid = lo + (hi - lo) / 2;
        const uint8_t *nd, *k;
        size_t kl;
        if (get_node(map, page, mid, &nd, e) < 0)
            return MDBP_CORRUPT;
        node_key(nd, &k, &kl);
        if (cmp(k, kl, key, klen) < (leaf ? 0 : 1))
            lo = mid + 1;
        else
            hi = mid;
    }
    *at = lo;
    return 0;
}

int mdbp_compare_uint(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen) {
    if (alen != blen || (alen != 4 && alen != 8))
        return alen != blen ? (alen < blen ? -1 : 1) : mdbp_compare(a, alen, b, blen);
    uint64_t x = alen == 8 ? ld64(a) : ld32(a), y = alen == 8 ? ld64(b) : ld32(b);
    return x < y ? -1 : x > y;
}

static int in_fences_by(mdbp_compare_fn cmp, const uint8_t *k, size_t klen, const uint8_t *lo,
                        size_t lo_len, const uint8_t *hi, size_t hi_len) {
    if (lo && cmp(k, klen, lo, lo_len) < 0)
        return 0;
    if (hi && cmp(k, klen, hi, hi_len) >= 0)
        return 0;
    return 1;
}

static int in_fences(const uint8_t *k, size_t klen, const uint8_t *lo, size_t lo_len,
                     const uint8_t *hi, size_t hi_len) {
    return in_fences_by(mdbp_compare, k, klen, lo, lo_len, hi, hi_len);
}

int mdbp_check_page(const mdbp_map *map, uint64_t pgno, unsigned kind, const uint8_t *lo,
                    size_t lo_len, const uint8_t *hi, size_t hi_len, mdbp_error *e) {
    return mdbp_check_page_by(map, pgno, kind, mdbp_compare, lo, lo_len, hi, hi_len, e);
}

int mdbp_check_page_by(const mdbp_map *map, uint64_t pgno, unsigned kind, mdbp_compare_fn cmp,
                       const uint8_t *lo, size_t lo_len, const uint8_t *hi, size_t hi_len,
                       mdbp_error *e) {
    const uint8_t *page;
    unsigned n;
    if (get_page(map, pgno, kind, &page, &n, e) < 0)
        return MDBP_CORRUPT;
    const uint8_t *prev = NULL;
    size_t prev_len = 0;
    for (unsigned i = 0; i < n; i++) {
        const uint8_t *nd, *k;
        size_t klen;
        if (get_node(map, page, i, &nd, e) < 0)
            return MDBP_CORRUPT;
        if (kind == MDBP_P_BRANCH && i == 0)
            continue; /* a branch's first key is implicit: everything below the second */
        node_key(nd, &k, &klen);
        if (!in_fences_by(cmp, k, klen, lo, lo_len, hi, hi_len))
            return mdbp_fail(e, pgno, "key outside the range its parent gives the page");
        if (prev && cmp(prev, prev_len, k, klen) >= 0)
            return mdbp_fail(e, pgno, "keys on the page do not increase");
        prev = k;
        prev_len = klen;
    }
    return 0;
}

/* Load level `lvl` of the cursor: the page `pgno` of the kind its level
 * needs, checked against the fences already set for that level. */
static int load_level(mdbp_cursor *c, int lvl, uint64_t pgno, int total_depth, mdbp_error *e) {
    unsigned kind = lvl == total_depth - 1 ? MDBP_P_LEAF : MDBP_P_BRANCH;
    if (c->check_all) {
        if (mdbp_check_page_by(c->map, pgno, kind, c->cmp, c->lo[lvl], c->lo_len[lvl], c->hi[lvl],
                            c->hi_len[lvl], e) < 0)
            return MDBP_CORRUPT;
    }
    if (get_page(c->map, pgno, kind, &c->page[lvl], &c->nkeys[lvl], e) < 0)
        return MDBP_CORRUPT;
    if (kind == MDBP_P_LEAF && !c->check_all) {
        /* The cheap check: the leaf's first and last keys lie inside its
         * fences, so a misrouted descent cannot pass for a right one. */
        const uint8_t *nd, *k;
        size_t klen;
        unsigned n = c->nkeys[lvl];
        for (unsigned j = 0; j < 2; j++) {
            if (get_node(c->map, c->page[lvl], j ? n - 1 : 0, &nd, e) < 0)
                return MDBP_CORRUPT;
            node_key(nd, &k, &klen);
            if (!in_fences_by(c->cmp, k, klen, c->lo[lvl], c->lo_len[lvl], c->hi[lvl],
                              c->hi_len[lvl]))
                return mdbp_fail(e, pgno, "leaf key outside the range its parent gives it");
        }
    }
    return 0;
}

/* Set the fences of level lvl + 1 from node i of the branch at level lvl. */
static int child_fences(mdbp_cursor *c, int lvl, unsigned i, mdbp_error *e) {
    const uint8_t *nd, *k;
    size_t klen;
    c->lo[lvl + 1] = c->lo[lvl];
    c->lo_len[lvl + 1] = c->lo_len[lvl];
    c->hi[lvl + 1] = c->hi[lvl];
    c->hi_len[lvl + 1] = c->hi_len[lvl];
    if (i > 0) {
        if (get_node(c->map, c->page[lvl], i, &nd, e) < 0)
            return MDBP_CORRUPT;
        node_key(nd, &k, &klen);
        if (!in_fences_by(c->cmp, k, klen, c->lo[lvl], c->lo_len[lvl], c->hi[lvl],
                          c->hi_len[lvl]))
            return mdbp_fail(e, ld64(c->page[lvl]), "branch key outside its page's range");
        c->lo[lvl + 1] = k;
        c->lo_len[lvl + 1] = (uint16_t)klen;
    }
    if (i + 1 < c->nkeys[lvl]) {
        if (get_node(c->map, c->page[lvl], i + 1, &nd, e) < 0)
            return MDBP_CORRUPT;
        node_key(nd, &k, &klen);
        if (c->lo[lvl + 1] && c->cmp(k, klen, c->lo[lvl + 1], c->lo_len[lvl + 1]) <= 0)
            return mdbp_fail(e, ld64(c->page[lvl]), "branch keys do not increase");
        if (!in_fences_by(c->cmp, k, klen, c->lo[lvl], c->lo_len[lvl], c->hi[lvl],
                          c->hi_len[lvl]))
            return mdbp_fail(e, ld64(c->page[lvl]), "branch key outside its page's range");
        c->hi[lvl + 1] = k;
        c->hi_len[lvl + 1] = (uint16_t)klen;
    }
    return 0;
}

/* Descend from level lvl (already loaded) to a leaf, taking node `first`
 * of level lvl and then the leftmost child of each level below. */
static int descend_leftmost(mdbp_cursor *c, int lvl, unsigned first, mdbp_error *e) {
    unsigned i = first;
    for (; lvl < c->depth - 1; lvl++) {
        const uint8_t *nd;
        c->index[lvl] = i;
        if (get_node(c->map, c->page[lvl], i, &nd, e) < 0 || child_fences(c, lvl, i, e) < 0 ||
            load_level(c, lvl + 1, node_child(nd), c->depth, e) < 0)
            return MDBP_CORRUPT;
        i = 0;
    }
    c->index[lvl] = i;
    return MDBP_FOUND;
}

int mdbp_seek(const mdbp_map *map, const mdbp_db *db, const uint8_t *key, size_t klen,
              int check_all, mdbp_cursor *c, mdbp_error *e) {
    c->map = map;
    c->depth = db->depth;
    c->check_all = check_all;
    c->cmp = (db->flags & MDBP_DB_INTEGERKEY) ? mdbp_compare_uint : mdbp_compare;
    if (db->root == MDBP_INVALID_PGNO)
        return MDBP_END;
    if (db->depth < 1 || db->depth > MDBP_MAX_DEPTH)
        return mdbp_fail(e, db->root, "tree depth out of range");
    c->lo[0] = c->hi[0] = NULL;
    c->lo_len[0] = c->hi_len[0] = 0;
    if (load_level(c, 0, db->root, db->depth, e) < 0)
        return MDBP_CORRUPT;
    for (int lvl = 0; lvl < db->depth; lvl++) {
        const uint8_t *page = c->page[lvl];
        unsigned n = c->nkeys[lvl];
        int leaf = lvl == db->depth - 1;
        unsigned lo;
        if (node_search(map, page, n, leaf, c->cmp, key, klen, &lo, e) < 0)
            return MDBP_CORRUPT;
        if (leaf) {
            c->index[lvl] = lo;
            if (lo < n)
                return MDBP_FOUND;
            /* Every key here is below `key`: the answer starts the next leaf. */
            c->index[lvl] = n - 1;
            return mdbp_next(c, e);
        }
        unsigned i = lo - 1; /* lo >= 1: the last node with key <= key */
        const uint8_t *nd;
        c->index[lvl] = i;
        if (get_node(map, page, i, &nd, e) < 0 || child_fences(c, lvl, i, e) < 0 ||
            load_level(c, lvl + 1, node_child(nd), db->depth, e) < 0)
            return MDBP_CORRUPT;
    }
    return mdbp_fail(e, db->root, "tree descent ended without a leaf");
}

int mdbp_next(mdbp_cursor *c, mdbp_error *e) {
    int leaf = c->depth - 1;
    if (c->index[leaf] + 1 < c->nkeys[leaf]) {
        c->index[leaf]++;
        return MDBP_FOUND;
    }
    for (int lvl = leaf - 1; lvl >= 0; lvl--) {
        if (c->index[lvl] + 1 < c->nkeys[lvl])
            return descend_leftmost(c, lvl, c->index[lvl] + 1, e);
    }
    return MDBP_END;
}

void mdbp_key(const mdbp_cursor *c, const uint8_t **key, size_t *klen) {
    int leaf = c->depth - 1;
    const uint8_t *page = c->page[leaf];
    unsigned off = ld16(page + MDBP_PAGE_HEADER + 2 * c->index[leaf]);
    node_key(page + off, key, klen); /* the node was checked when the page was searched */
}

int mdbp_value(const mdbp_cursor *c, const uint8_t **val, size_t *vlen, unsigned *flags,
               mdbp_error *e) {
    int leaf = c->depth - 1;
    const uint8_t *nd;
    if (get_node(c->map, c->page[leaf], c->index[leaf], &nd, e) < 0)
        return MDBP_CORRUPT;
    unsigned nflags = ld16(nd + 4);
    size_t dsize;
    const uint8_t *data = node_data(nd, &dsize);
    *flags = nflags;
    if (!(nflags & MDBP_F_BIGDATA)) {
        *val = data;
        *vlen = dsize;
        return 0;
    }
    uint64_t pgno = ld64(data);
    const mdbp_map *map = c->map;
    if (pgno < 2 || pgno >= map->npages)
        return mdbp_fail(e, ld64(c->page[leaf]), "overflow page number out of range");
    const uint8_t *op = map->base + pgno * map->psize;
    if (ld64(op) != pgno)
        return mdbp_fail(e, pgno, "overflow page does not name itself");
    if (ld16(op + 10) != MDBP_P_OVERFLOW)
        return mdbp_fail(e, pgno, "expected an overflow page");
    uint64_t pages = ld32(op + 12);
    if (pages < 1 || pages > map->npages - pgno)
        return mdbp_fail(e, pgno, "overflow run runs past the file");
    /* LMDB's OVPAGES: the fewest pages holding the header and the data.  A
     * run may be longer: a smaller value that replaces a larger one in the
     * same transaction is written over it in place (mdb.c, mdb_cursor_put). */
    if ((MDBP_PAGE_HEADER - 1 + (uint64_t)dsize) / map->psize + 1 > pages)
        return mdbp_fail(e, pgno, "overflow run too short for its value");
    *val = op + MDBP_PAGE_HEADER;
    *vlen = dsize;
    return 0;
}

int mdbp_get(const mdbp_map *map, const mdbp_db *db, const uint8_t *key, size_t klen,
             const uint8_t **val, size_t *vlen, unsigned *flags, mdbp_error *e) {
    mdbp_cursor c;
    int rc = mdbp_seek(map, db, key, klen, 0, &c, e);
    if (rc != MDBP_FOUND)
        return rc;
    const uint8_t *k;
    size_t kl;
    mdbp_key(&c, &k, &kl);
    if (c.cmp(k, kl, key, klen) != 0)
        return MDBP_END;
    if (mdbp_value(&c, val, vlen, flags, e) < 0)
        return MDBP_CORRUPT;
    return MDBP_FOUND;
}

void mdbp_hint(const void *p, size_t len) {
    static long os_page;
    if (!os_page)
        os_page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(os_page - 1);
    (void)madvise((void *)a, (uintptr_t)p + len - a, MADV_WILLNEED);
}

void mdbp_prefetch_seeks(const mdbp_map *map, const mdbp_db *db, const uint8_t *keys,
                         size_t klen, int n, const uint8_t **vals, size_t *vlens) {
    uint64_t pg[256];
    mdbp_error e;
    if (n > 256)
        n = 256;
    for (int i = 0; i < n; i++) {
        vals[i] = NULL;
        vlens[i] = 0;
        pg[i] = db->root;
    }
    if (db->root == MDBP_INVALID_PGNO || db->depth < 1 || db->depth > MDBP_MAX_DEPTH)
        return;
    mdbp_compare_fn cmp = (db->flags & MDBP_DB_INTEGERKEY) ? mdbp_compare_uint : mdbp_compare;
    for (int lvl = 0; lvl < db->depth; lvl++) {
        int leaf = lvl == db->depth - 1;
        for (int i = 0; i < n; i++) {
            int seen = pg[i] < 2 || pg[i] >= map->npages;
            for (int j = 0; j < i && !seen; j++)
                seen = pg[j] == pg[i];
            if (!seen)
                mdbp_hint(map->base + pg[i] * map->psize, map->psize);
        }
        for (int i = 0; i < n; i++) {
            const uint8_t *page, *nd;
            unsigned nkeys;
            if (pg[i] == MDBP_INVALID_PGNO ||
                get_page(map, pg[i], leaf ? MDBP_P_LEAF : MDBP_P_BRANCH, &page, &nkeys, &e) < 0) {
                pg[i] = MDBP_INVALID_PGNO;
                continue;
            }
            /* The node mdbp_seek lands on (the last one when the key is
             * past them all: the answer starts the next leaf, which only
             * a real seek reads). */
            unsigned lo;
            int bad = node_search(map, page, nkeys, leaf, cmp, keys + (size_t)i * klen, klen,
                                  &lo, &e) < 0;
            unsigned at = leaf ? (lo < nkeys ? lo : nkeys - 1) : lo - 1;
            if (bad || get_node(map, page, at, &nd, &e) < 0) {
                pg[i] = MDBP_INVALID_PGNO;
                continue;
            }
            if (!leaf) {
                pg[i] = node_child(nd);
                continue;
            }
            size_t dsize;
            const uint8_t *data = node_data(nd, &dsize);
            if (!(ld16(nd + 4) & MDBP_F_BIGDATA)) {
                vals[i] = data;
                vlens[i] = dsize;
                continue;
            }
            uint64_t ov = ld64(data);
            uint64_t pages = (MDBP_PAGE_HEADER - 1 + (uint64_t)dsize) / map->psize + 1;
            if (ov >= 2 && ov < map->npages && pages <= map->npages - ov) {
                vals[i] = map->base + ov * map->psize + MDBP_PAGE_HEADER;
                vlens[i] = dsize;
            }
        }
    }
}
