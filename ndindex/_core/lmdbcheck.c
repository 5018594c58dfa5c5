#include "lmdbcheck.h"

#include <stdlib.h>
#include <string.h>

/* Tree flags (MDB_db.md_flags) the checker knows how to order and walk;
 * the others (MDB_REVERSEKEY, MDB_DUPFIXED, MDB_INTEGERDUP, MDB_REVERSEDUP)
 * change the page layout or the key order and ndindex never sets them. */
#define DB_DUPSORT 0x04u
#define DB_INTEGERKEY 0x08u
#define DB_FLAGS_WALKED (DB_DUPSORT | DB_INTEGERKEY)
#define P_DIRTY 0x10u
#define P_SUBP 0x40u

/* A free-list record: its ID list (count, then page numbers) and the page
 * holding it, kept until every tree has been walked. */
typedef struct {
    const uint8_t *ids;
    uint64_t count, pgno;
} free_record;

typedef struct {
    mdbp_map map; /* pages [0, min(file pages, last_pg + 1)) */
    uint64_t last_pg, file_pages;
    uint8_t *kind, *owner;
    mdbc_report *r;
    mdbp_error *e;
    free_record *free;
    size_t nfree, free_cap;
    uint64_t *past_end; /* free pages past the end of the file */
    size_t npast, past_cap;
    uint64_t *extents; /* scratch for check_tiling: one per node of a page */
} walker;

enum role { ROLE_FREE, ROLE_MAIN, ROLE_NAMED, ROLE_DUPS };

/* One B-tree being walked: whose pages they are, what its leaves hold, and
 * the counts to compare with its record. */
typedef struct {
    int tree; /* index in r->tree that owns the pages */
    enum role role;
    unsigned flags;
    mdbp_compare_fn cmp;
    int depth;
    uint64_t branch, leaf, overflow, entries;
    uint64_t dup_branch, dup_leaf; /* pages of its duplicates' sub-databases */
} tree_walk;

static int grow(void **buf, size_t *cap, size_t need, size_t item) {
    if (need <= *cap)
        return 0;
    size_t n = *cap ? 2 * *cap : 64;
    while (n < need)
        n *= 2;
    void *p = realloc(*buf, n * item);
    if (!p)
        return MDBC_NOMEM;
    *buf = p;
    *cap = n;
    return 0;
}

/* Mark page pgno, reached from page `from`, as `kind` of tree t; it must be
 * a page of the snapshot that nothing reached before. */
static int claim(walker *w, uint64_t from, uint64_t pgno, unsigned kind, int tree) {
    if (pgno < 2)
        return mdbp_fail(w->e, from, "page number names a meta page");
    if (pgno > w->last_pg)
        return mdbp_fail(w->e, from, "page number past the meta page's last page");
    if (pgno >= w->file_pages)
        return mdbp_fail(w->e, from, "page number past the end of the file");
    if (w->kind[pgno] != MDBC_UNSEEN)
        return mdbp_fail(w->e, pgno, "page reachable twice");
    w->kind[pgno] = (uint8_t)kind;
    w->owner[pgno] = (uint8_t)tree;
    return 0;
}

/* An overflow run whose first page a leaf node names; returns its data. */
static const uint8_t *overflow_value(walker *w, tree_walk *t, uint64_t leaf, const uint8_t *ref,
                                     size_t dsize) {
    uint64_t pgno = ld64(ref);
    if (claim(w, leaf, pgno, MDBC_OVERFLOW, t->tree) < 0)
        return NULL;
    const uint8_t *p = w->map.base + pgno * w->map.psize;
    if (ld64(p) != pgno)
        return mdbp_fail(w->e, pgno, "overflow page does not name itself"), NULL;
    if (ld16(p + 10) != MDBP_P_OVERFLOW)
        return mdbp_fail(w->e, pgno, "expected an overflow page"), NULL;
    uint64_t pages = ld32(p + 12);
    if (pages < 1)
        return mdbp_fail(w->e, pgno, "overflow run of zero pages"), NULL;
    if (pages - 1 > w->last_pg - pgno)
        return mdbp_fail(w->e, pgno, "overflow run past the meta page's last page"), NULL;
    if (pages > w->file_pages - pgno)
        return mdbp_fail(w->e, pgno, "overflow run past the end of the file"), NULL;
    /* LMDB's OVPAGES: the fewest pages holding the header and the data.  A
     * run may be longer: LMDB rewrites a value in place when a smaller one
     * replaces it in the same transaction, keeping the run. */
    if ((MDBP_PAGE_HEADER - 1 + (uint64_t)dsize) / w->map.psize + 1 > pages)
        return mdbp_fail(w->e, pgno, "overflow run too short for its value"), NULL;
    for (uint64_t j = 1; j < pages; j++)
        if (claim(w, pgno, pgno + j, MDBC_OVERFLOW_MORE, t->tree) < 0)
            return NULL;
    t->overflow += pages;
    return p + MDBP_PAGE_HEADER;
}

/* A duplicate-sort sub-page: a leaf page image of `size` bytes inside a
 * node, holding the sorted values of one key as data-less nodes. */
static int check_subpage(walker *w, tree_walk *t, uint64_t leaf, const uint8_t *sp, size_t size) {
    if (size < MDBP_PAGE_HEADER)
        return mdbp_fail(w->e, leaf, "duplicate sub-page smaller than a page header");
    if ((ld16(sp + 10) & ~P_DIRTY) != (MDBP_P_LEAF | P_SUBP))
        return mdbp_fail(w->e, leaf, "duplicate sub-page flags are not P_LEAF|P_SUBP");
    unsigned lower = ld16(sp + 12), upper = ld16(sp + 14);
    if (lower < MDBP_PAGE_HEADER || lower > upper || upper > size ||
        ((lower - MDBP_PAGE_HEADER) & 1))
        return mdbp_fail(w->e, leaf, "duplicate sub-page free-space bounds impossible");
    unsigned n = (lower - MDBP_PAGE_HEADER) / 2;
    if (n < 1)
        return mdbp_fail(w->e, leaf, "duplicate sub-page holds no values");
    const uint8_t *prev = NULL;
    size_t prev_len = 0;
    for (unsigned i = 0; i < n; i++) {
        size_t off = ld16(sp + MDBP_PAGE_HEADER + 2 * i);
        if (off < upper || off + MDBP_NODE_HEADER > size)
            return mdbp_fail(w->e, leaf, "duplicate sub-page node offset outside its node area");
        const uint8_t *nd = sp + off;
        size_t ksize = ld16(nd + 6);
        if (ksize > MDBP_MAX_KEY || off + MDBP_NODE_HEADER + ksize > size)
            return mdbp_fail(w->e, leaf, "duplicate sub-page value runs past the sub-page");
        if (ld16(nd) || ld16(nd + 2) || ld16(nd + 4))
            return mdbp_fail(w->e, leaf, "duplicate value node carries data or flags");
        const uint8_t *k = nd + MDBP_NODE_HEADER;
        if (prev && mdbp_compare(prev, prev_len, k, ksize) >= 0)
            return mdbp_fail(w->e, leaf, "duplicate values on the sub-page do not increase");
        prev = k;
        prev_len = ksize;
        w->r->tree[t->tree].value_bytes += ksize;
    }
    t->entries += n;
    return 0;
}

static int walk_tree(walker *w, int tree, enum role role, const mdbp_db *db, tree_walk *out);

/* A tree record stored in a leaf node (a named database or a sub-database
 * of duplicates), checked as lmdbpage's mdbp_parse_db does plus the flags
 * the checker can walk. */
static int parse_record(walker *w, uint64_t leaf, const uint8_t *data, size_t dsize,
                        unsigned allowed_flags, mdbp_db *db) {
    if (dsize != MDBP_DB_BYTES)
        return mdbp_fail(w->e, leaf, "tree record is not 48 bytes");
    if (mdbp_parse_db(&w->map, data, db, w->e) < 0) {
        w->e->pgno = leaf;
        return MDBP_CORRUPT;
    }
    if (db->pad != 0)
        return mdbp_fail(w->e, leaf, "tree record's pad field is not zero");
    if (db->flags & ~allowed_flags)
        return mdbp_fail(w->e, leaf, "tree record has flags the checker does not support");
    return 0;
}

static int leaf_node(walker *w, tree_walk *t, uint64_t pgno, const uint8_t *nd) {
    mdbc_tree *owner = &w->r->tree[t->tree];
    unsigned flags = ld16(nd + 4);
    size_t ksize = ld16(nd + 6);
    size_t dsize = (size_t)ld16(nd) | ((size_t)ld16(nd + 2) << 16);
    const uint8_t *key = nd + MDBP_NODE_HEADER, *val = key + ksize;
    if (t->role == ROLE_DUPS) {
        /* The keys of a sub-database of duplicates are the owner's values. */
        if (flags || dsize)
            return mdbp_fail(w->e, pgno, "duplicate value node carries data or flags");
        owner->value_bytes += ksize;
        t->entries++;
        return 0;
    }
    owner->key_bytes += ksize;
    if (t->role == ROLE_FREE) {
        if (ksize != 8)
            return mdbp_fail(w->e, pgno, "free-list key is not an 8-byte transaction id");
        uint64_t txnid = ld64(key);
        if (txnid < 1 || txnid > w->r->meta.txnid)
            return mdbp_fail(w->e, pgno, "free-list key is not a transaction id up to the snapshot's");
    } else if ((t->flags & DB_INTEGERKEY) && ksize != 4 && ksize != 8)
        return mdbp_fail(w->e, pgno, "integer key is not 4 or 8 bytes");
    if (flags & MDBP_F_BIGDATA) {
        if (flags != MDBP_F_BIGDATA)
            return mdbp_fail(w->e, pgno, "overflow value node has other flags");
        if (!(val = overflow_value(w, t, pgno, val, dsize)))
            return MDBP_CORRUPT;
    }
    if (flags & MDBP_F_DUPDATA) {
        if (!(t->flags & DB_DUPSORT))
            return mdbp_fail(w->e, pgno, "duplicates in a tree without sorted duplicates");
        if (!(flags & MDBP_F_SUBDATA))
            return check_subpage(w, t, pgno, val, dsize);
        mdbp_db db;
        tree_walk sub;
        if (parse_record(w, pgno, val, dsize, 0, &db) < 0 ||
            walk_tree(w, t->tree, ROLE_DUPS, &db, &sub) < 0)
            return MDBP_CORRUPT;
        t->entries += sub.entries;
        t->dup_branch += sub.branch;
        t->dup_leaf += sub.leaf;
        return 0;
    }
    t->entries++;
    if (flags & MDBP_F_SUBDATA) {
        if (t->role != ROLE_MAIN)
            return mdbp_fail(w->e, pgno, "named-database record outside the main database");
        if (w->r->ntrees == MDBC_MAX_TREES)
            return mdbp_fail(w->e, pgno, "more named databases than the checker supports");
        mdbc_tree *named = &w->r->tree[w->r->ntrees];
        if (parse_record(w, pgno, val, dsize, DB_FLAGS_WALKED, &named->db) < 0)
            return MDBP_CORRUPT;
        named->name = key;
        named->name_len = ksize;
        w->r->ntrees++;
        return 0;
    }
    owner->value_bytes += dsize;
    if (t->role == ROLE_FREE) {
        uint64_t holder = (flags & MDBP_F_BIGDATA) ? ld64(key + ksize) : pgno;
        const char *problem = mdbp_free_list_problem(val, dsize, w->last_pg);
        if (problem)
            return mdbp_fail(w->e, holder, problem);
        if (grow((void **)&w->free, &w->free_cap, w->nfree + 1, sizeof *w->free) < 0)
            return MDBC_NOMEM;
        w->free[w->nfree++] = (free_record){val, ld64(val), holder};
        w->r->free_records++;
    }
    return 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* LMDB packs a page's nodes from the end of the page down to `upper` with
 * no gap (mdb_node_add allocates just below upper, mdb_node_del closes the
 * hole), each EVEN(header + key + data) bytes, the data of an overflow value
 * being its page number.  A node whose size field claims more or less (one
 * flipped bit of a free-list record's length) passes every bounds check,
 * yet LMDB's next delete on that page moves the wrong bytes and damages
 * its neighbours: so the node areas must tile [upper, psize) exactly. */
static int check_tiling(walker *w, uint64_t pgno, const uint8_t *p, unsigned n, int leaf) {
    for (unsigned i = 0; i < n; i++) {
        uint64_t off = ld16(p + MDBP_PAGE_HEADER + 2 * i);
        const uint8_t *nd = p + off;
        uint64_t size = MDBP_NODE_HEADER + ld16(nd + 6);
        if (leaf)
            size += (ld16(nd + 4) & MDBP_F_BIGDATA)
                        ? 8
                        : ((uint64_t)ld16(nd) | ((uint64_t)ld16(nd + 2) << 16));
        w->extents[i] = off << 32 | ((size + 1) & ~1ull);
    }
    qsort(w->extents, n, sizeof *w->extents, cmp_u64);
    uint64_t at = ld16(p + 14);
    for (unsigned i = 0; i < n; i++) {
        if (w->extents[i] >> 32 != at)
            return mdbp_fail(w->e, pgno, "page's nodes do not fill its node area exactly");
        at += w->extents[i] & 0xffffffffu;
    }
    if (at != w->map.psize)
        return mdbp_fail(w->e, pgno, "page's nodes do not fill its node area exactly");
    return 0;
}

static int walk_page(walker *w, tree_walk *t, uint64_t from, uint64_t pgno, int level,
                     const uint8_t *lo, size_t lo_len, const uint8_t *hi, size_t hi_len) {
    int leaf = level == t->depth - 1;
    if (claim(w, from, pgno, leaf ? MDBC_LEAF : MDBC_BRANCH, t->tree) < 0 ||
        mdbp_check_page_by(&w->map, pgno, leaf ? MDBP_P_LEAF : MDBP_P_BRANCH, t->cmp, lo, lo_len, hi,
                           hi_len, w->e) < 0)
        return MDBP_CORRUPT;
    /* mdbp_check_page_by has bounds-checked every node and key of the page. */
    const uint8_t *p = w->map.base + pgno * w->map.psize;
    unsigned n = (ld16(p + 12) - MDBP_PAGE_HEADER) / 2;
    if (leaf) {
        t->leaf++;
        for (unsigned i = 0; i < n; i++) {
            int rc = leaf_node(w, t, pgno, p + ld16(p + MDBP_PAGE_HEADER + 2 * i));
            if (rc < 0)
                return rc;
        }
        return check_tiling(w, pgno, p, n, 1) < 0 ? MDBP_CORRUPT : 0;
    }
    if (check_tiling(w, pgno, p, n, 0) < 0)
        return MDBP_CORRUPT;
    t->branch++;
    for (unsigned i = 0; i < n; i++) {
        const uint8_t *nd = p + ld16(p + MDBP_PAGE_HEADER + 2 * i);
        const uint8_t *next = i + 1 < n ? p + ld16(p + MDBP_PAGE_HEADER + 2 * (i + 1)) : NULL;
        uint64_t child = (uint64_t)ld16(nd) | ((uint64_t)ld16(nd + 2) << 16) |
                         ((uint64_t)ld16(nd + 4) << 32);
        /* Child i holds the keys from node i's key (node 0: the page's own
         * lower fence) up to node i + 1's key (the last: the upper fence). */
        const uint8_t *clo = i ? nd + MDBP_NODE_HEADER : lo;
        size_t clo_len = i ? ld16(nd + 6) : lo_len;
        const uint8_t *chi = next ? next + MDBP_NODE_HEADER : hi;
        size_t chi_len = next ? ld16(next + 6) : hi_len;
        int rc = walk_page(w, t, pgno, child, level + 1, clo, clo_len, chi, chi_len);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int walk_tree(walker *w, int tree, enum role role, const mdbp_db *db, tree_walk *t) {
    memset(t, 0, sizeof *t);
    t->tree = tree;
    t->role = role;
    t->flags = role == ROLE_FREE ? DB_INTEGERKEY : db->flags;
    t->cmp = (t->flags & DB_INTEGERKEY) ? mdbp_compare_uint : mdbp_compare;
    t->depth = db->depth;
    if (db->root == MDBP_INVALID_PGNO)
        return 0; /* mdbp_parse_db / mdbp_read_meta checked that its counts are zero */
    int rc = walk_page(w, t, db->root, db->root, 0, NULL, 0, NULL, 0);
    if (rc < 0)
        return rc;
    /* LMDB counts the pages of a tree's duplicate sub-databases in the
     * tree's own record as well as in theirs. */
    /* LMDB keeps the page counts of a tree with sorted duplicates only
     * roughly (see lmdbpage.c, check_db); its entries are exact. */
    if (!(t->flags & DB_DUPSORT) && t->branch != db->branch_pages)
        return mdbp_fail(w->e, db->root, "tree record's branch page count disagrees with its pages");
    if (!(t->flags & DB_DUPSORT) && t->leaf != db->leaf_pages)
        return mdbp_fail(w->e, db->root, "tree record's leaf page count disagrees with its pages");
    if (t->overflow != db->overflow_pages)
        return mdbp_fail(w->e, db->root, "tree record's overflow page count disagrees with its pages");
    if (t->entries != db->entries)
        return mdbp_fail(w->e, db->root, "tree record's entry count disagrees with its entries");
    return 0;
}

/* Mark every page the free list names (each list checked as it was
 * walked: mdbp_free_list_problem); each must be a page that no tree uses
 * and no other record lists. */
static int mark_free(walker *w) {
    mdbc_report *r = w->r;
    for (size_t i = 0; i < w->nfree; i++) {
        const free_record *f = &w->free[i];
        for (uint64_t j = 1; j <= f->count; j++) {
            uint64_t pg = ld64(f->ids + 8 * j);
            r->free_pages++;
            if (pg >= w->file_pages) {
                if (grow((void **)&w->past_end, &w->past_cap, w->npast + 1, sizeof(uint64_t)) < 0)
                    return MDBC_NOMEM;
                w->past_end[w->npast++] = pg;
                continue;
            }
            if (w->kind[pg] == MDBC_FREE)
                return mdbp_fail(w->e, pg, "page listed free twice");
            if (w->kind[pg] != MDBC_UNSEEN) {
                r->error_tree = w->owner[pg];
                return mdbp_fail(w->e, pg, "page listed free is in use");
            }
            w->kind[pg] = MDBC_FREE;
        }
    }
    /* Pages past the end of the file were never written: LMDB can only
     * have freed them, so the free list must name each exactly once. */
    if (w->npast > 1)
        qsort(w->past_end, w->npast, sizeof(uint64_t), cmp_u64);
    for (size_t i = 1; i < w->npast; i++)
        if (w->past_end[i] == w->past_end[i - 1])
            return mdbp_fail(w->e, w->past_end[i], "page listed free twice");
    r->free_past_end = w->npast;
    if (w->last_pg >= w->file_pages) {
        for (size_t i = 0; i < w->npast; i++)
            if (w->past_end[i] != w->file_pages + i)
                return mdbp_fail(w->e, w->file_pages + i, "page past the end of the file is not free");
        if (w->npast != w->last_pg + 1 - w->file_pages)
            return mdbp_fail(w->e, w->file_pages + w->npast, "page past the end of the file is not free");
    }
    return 0;
}

int mdbc_check_metas(const uint8_t *file, size_t avail, uint32_t psize, mdbp_meta meta[2],
                     mdbp_error *e) {
    if (mdbp_read_meta(file, avail, 0, psize, &meta[0], e) < 0 ||
        mdbp_read_meta(file, avail, 1, meta[0].psize, &meta[1], e) < 0)
        return MDBP_CORRUPT;
    if (avail / meta[0].psize < 2)
        return mdbp_fail(e, 1, "file shorter than its two meta pages");
    /* Transaction n writes meta page n % 2; a new file has 0 in both. */
    for (int s = 0; s < 2; s++)
        if (meta[s].txnid != 0 && (meta[s].txnid & 1) != (uint64_t)s)
            return mdbp_fail(e, (uint64_t)s, "meta page holds a transaction id of the other page's parity");
    int cur = meta[1].txnid > meta[0].txnid;
    const mdbp_meta *now = &meta[cur], *before = &meta[!cur];
    if (now->txnid != before->txnid + 1 && now->txnid != 0)
        return mdbp_fail(e, (uint64_t)cur, "meta pages' transaction ids are not consecutive");
    if (now->last_pg < before->last_pg)
        return mdbp_fail(e, (uint64_t)cur, "newer meta page has fewer pages than the older one");
    return cur;
}

int mdbc_check(const uint8_t *file, size_t avail, uint32_t psize, int slot, mdbc_report *r,
               uint8_t *kind, uint8_t *owner, mdbp_error *e) {
    memset(r, 0, sizeof *r);
    r->error_tree = -1;
    mdbp_meta metas[2];
    int cur = mdbc_check_metas(file, avail, psize, metas, e);
    if (cur < 0)
        return MDBP_CORRUPT;
    r->slot = slot < 0 ? cur : slot;
    r->meta = metas[r->slot];
    psize = r->meta.psize;
    walker w = {.last_pg = r->meta.last_pg, .file_pages = avail / psize,
                .kind = kind, .owner = owner, .r = r, .e = e};
    w.map.base = file;
    w.map.psize = psize;
    w.map.npages = w.last_pg + 1 < w.file_pages ? w.last_pg + 1 : w.file_pages;
    r->file_pages = w.file_pages;
    memset(kind, MDBC_UNSEEN, w.file_pages);
    memset(owner, MDBC_NO_TREE, w.file_pages);
    kind[0] = kind[1] = MDBC_META;
    w.extents = malloc((psize - MDBP_PAGE_HEADER) / 2 * sizeof *w.extents);
    if (!w.extents)
        return MDBC_NOMEM;

    r->ntrees = 2;
    r->tree[MDBC_TREE_FREE].db = r->meta.free_db;
    r->tree[MDBC_TREE_MAIN].db = r->meta.main_db;
    if (r->meta.main_db.flags & ~DB_FLAGS_WALKED) {
        r->error_tree = MDBC_TREE_MAIN;
        return mdbp_fail(e, (uint64_t)r->slot, "main database has flags the checker does not support");
    }
    int rc = 0;
    for (unsigned i = 0; i < r->ntrees && rc == 0; i++) {
        /* The main database's walk appends the named databases it lists. */
        tree_walk t;
        r->error_tree = (int)i;
        rc = walk_tree(&w, (int)i, i == MDBC_TREE_FREE ? ROLE_FREE : i == MDBC_TREE_MAIN ? ROLE_MAIN : ROLE_NAMED,
                       &r->tree[i].db, &t);
        r->tree[i].branch_pages = t.branch;
        r->tree[i].leaf_pages = t.leaf;
        r->tree[i].overflow_pages = t.overflow;
        r->tree[i].entries = t.entries;
        r->tree[i].dup_pages = t.dup_branch + t.dup_leaf;
    }
    if (rc == 0) {
        r->error_tree = MDBC_TREE_FREE;
        rc = mark_free(&w);
    }
    if (rc == 0) {
        r->error_tree = -1;
        for (uint64_t pg = 2; pg < w.map.npages && rc == 0; pg++)
            if (kind[pg] == MDBC_UNSEEN)
                rc = mdbp_fail(e, pg, "page neither in a tree nor free");
        for (uint64_t pg = w.map.npages; pg < w.file_pages; pg++)
            kind[pg] = MDBC_TAIL;
        r->tail_pages = w.file_pages - w.map.npages;
    }
    free(w.free);
    free(w.past_end);
    free(w.extents);
    return rc;
}
