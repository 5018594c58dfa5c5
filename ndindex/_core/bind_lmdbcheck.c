/* Python binding of the LMDB structure checker (lmdbcheck.c).
 *
 * A file is passed as (buffer, psize, npages) as in bind_lmdbpage.c, with
 * psize 0 read from meta page 0 and npages -1 meaning every whole page of
 * the buffer.  A damaged structure raises CorruptionError with attributes
 * pgno (the page), tree (its tree's name, None for a meta page) and problem
 * (what is wrong); the message says all three. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "bindings.h"
#include "lmdbcheck.h"

static const char *const KIND_NAMES[] = {"unseen", "meta",          "branch", "leaf",
                                         "overflow", "overflow-more", "free",   "tail"};

static PyObject *tree_name(const mdbc_report *r, int i) {
    if (i == MDBC_TREE_FREE)
        return PyUnicode_FromString("(free)");
    if (i == MDBC_TREE_MAIN)
        return PyUnicode_FromString("(main)");
    return PyUnicode_DecodeUTF8((const char *)r->tree[i].name, (Py_ssize_t)r->tree[i].name_len,
                                "backslashreplace");
}

/* The words of a failed check: "LMDB page N (tree T): problem", and for a
 * page reached twice, what reached it first. */
static PyObject *error_message(const mdbc_report *r, const mdbp_error *e, const mdbp_meta *metas,
                               const uint8_t *kind, const uint8_t *owner, uint64_t npages,
                               PyObject **tree) {
    *tree = r->error_tree >= 0 ? tree_name(r, r->error_tree) : Py_NewRef(Py_None);
    if (!*tree)
        return NULL;
    if (r->error_tree < 0 && e->pgno < 2 && metas)
        return PyUnicode_FromFormat("LMDB meta page %llu: %s (meta 0: txnid %llu, last page %llu; "
                                    "meta 1: txnid %llu, last page %llu)",
                                    (unsigned long long)e->pgno, e->what,
                                    (unsigned long long)metas[0].txnid,
                                    (unsigned long long)metas[0].last_pg,
                                    (unsigned long long)metas[1].txnid,
                                    (unsigned long long)metas[1].last_pg);
    if (r->error_tree < 0 && e->pgno < 2)
        return PyUnicode_FromFormat("LMDB meta page %llu: %s", (unsigned long long)e->pgno, e->what);
    if (r->error_tree < 0)
        return PyUnicode_FromFormat("LMDB page %llu: %s", (unsigned long long)e->pgno, e->what);
    int twice = !strcmp(e->what, "page reachable twice") || !strcmp(e->what, "page listed free is in use");
    if (twice && e->pgno < npages && kind[e->pgno] < sizeof KIND_NAMES / sizeof *KIND_NAMES &&
        owner[e->pgno] < r->ntrees) {
        PyObject *first = tree_name(r, owner[e->pgno]);
        PyObject *msg = first ? PyUnicode_FromFormat(
                                    "LMDB page %llu (tree %U): %s (already a %s page of tree %U)",
                                    (unsigned long long)e->pgno, *tree, e->what,
                                    KIND_NAMES[kind[e->pgno]], first)
                              : NULL;
        Py_XDECREF(first);
        return msg;
    }
    return PyUnicode_FromFormat("LMDB page %llu (tree %U): %s", (unsigned long long)e->pgno, *tree,
                                e->what);
}

/* Raise CorruptionError(message, database="lmdb") with pgno, tree and problem. */
static PyObject *raise_check_error(const mdbc_report *r, const mdbp_error *e, const mdbp_meta *metas,
                                   const uint8_t *kind, const uint8_t *owner, uint64_t npages) {
    PyObject *tree;
    PyObject *msg = error_message(r, e, metas, kind, owner, npages, &tree);
    if (!msg) {
        Py_XDECREF(tree);
        return NULL;
    }
    ndx_raise_corruption(msg, "lmdb", -1);
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = PyErr_GetRaisedException();
#else
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
#endif
    if (exc && tree) {
        PyObject *pgno = PyLong_FromUnsignedLongLong(e->pgno);
        PyObject *problem = PyUnicode_FromString(e->what);
        if (!pgno || !problem || PyObject_SetAttrString(exc, "pgno", pgno) < 0 ||
            PyObject_SetAttrString(exc, "tree", tree) < 0 ||
            PyObject_SetAttrString(exc, "problem", problem) < 0)
            PyErr_Clear();
        Py_XDECREF(pgno);
        Py_XDECREF(problem);
    }
    Py_XDECREF(tree);
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    PyErr_Restore(type, exc, tb);
#endif
    return NULL;
}

static PyObject *tree_dict(const mdbc_report *r, int i) {
    const mdbc_tree *t = &r->tree[i];
    uint64_t pages = t->branch_pages + t->leaf_pages + t->overflow_pages + t->dup_pages;
    PyObject *root = t->db.root == MDBP_INVALID_PGNO ? Py_NewRef(Py_None)
                                                     : PyLong_FromUnsignedLongLong(t->db.root);
    if (!root)
        return NULL;
    return Py_BuildValue("{s:k,s:N,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "depth",
                         (unsigned long)t->db.depth, "root", root,
                         "branch_pages", (unsigned long long)t->branch_pages, "leaf_pages",
                         (unsigned long long)t->leaf_pages, "overflow_pages",
                         (unsigned long long)t->overflow_pages, "dup_pages",
                         (unsigned long long)t->dup_pages, "entries",
                         (unsigned long long)t->entries, "bytes",
                         (unsigned long long)(pages * r->meta.psize), "key_bytes",
                         (unsigned long long)t->key_bytes, "value_bytes",
                         (unsigned long long)t->value_bytes);
}

static PyObject *report_dict(const mdbc_report *r) {
    PyObject *trees = PyDict_New();
    for (unsigned i = 0; trees && i < r->ntrees; i++) {
        PyObject *name = tree_name(r, (int)i), *stats = tree_dict(r, (int)i);
        if (!name || !stats || PyDict_SetItem(trees, name, stats) < 0)
            Py_CLEAR(trees);
        Py_XDECREF(name);
        Py_XDECREF(stats);
    }
    if (!trees)
        return NULL;
    return Py_BuildValue("{s:i,s:K,s:K,s:k,s:K,s:K,s:K,s:K,s:K,s:N}", "slot", r->slot, "txnid",
                         (unsigned long long)r->meta.txnid, "last_pg",
                         (unsigned long long)r->meta.last_pg, "psize",
                         (unsigned long)r->meta.psize, "file_pages",
                         (unsigned long long)r->file_pages, "free_pages",
                         (unsigned long long)r->free_pages, "free_past_end",
                         (unsigned long long)r->free_past_end, "free_records",
                         (unsigned long long)r->free_records, "tail_pages",
                         (unsigned long long)r->tail_pages, "trees", trees);
}

/* The buffer's geometry: psize (0: from meta page 0) and npages (-1: all). */
static int file_geometry(Py_buffer *buf, unsigned long *psize, long long *npages) {
    if (*psize == 0) {
        mdbp_meta m;
        mdbp_error e;
        mdbc_report r = {.error_tree = -1};
        if (mdbp_read_meta(buf->buf, (size_t)buf->len, 0, 0, &m, &e) < 0) {
            raise_check_error(&r, &e, NULL, NULL, NULL, 0);
            return -1;
        }
        *psize = m.psize;
    }
    mdbp_map map;
    unsigned long long all = (unsigned long long)buf->len / (*psize ? *psize : 1);
    if (ndx_get_map(buf, *psize, *npages < 0 ? all : (unsigned long long)*npages, &map) < 0)
        return -1;
    *npages = (long long)map.npages;
    return 0;
}

/* Run the checker on one snapshot; 0, or -1 with CorruptionError (or
 * MemoryError) set.  kind and owner hold npages bytes each. */
static int run_check(Py_buffer *buf, unsigned long psize, long long npages, int slot,
                     mdbc_report *r, uint8_t *kind, uint8_t *owner) {
    mdbp_error e;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = mdbc_check(buf->buf, (size_t)npages * psize, (uint32_t)psize, slot, r, kind, owner, &e);
    Py_END_ALLOW_THREADS
    if (rc == MDBC_NOMEM) {
        PyErr_NoMemory();
        return -1;
    }
    if (rc < 0) {
        /* Meta-page problems quote both pages' transaction ids when both parse. */
        mdbp_meta metas[2];
        mdbp_error me;
        size_t avail = (size_t)npages * psize;
        int metas_ok = mdbp_read_meta(buf->buf, avail, 0, (uint32_t)psize, &metas[0], &me) == 0 &&
                       mdbp_read_meta(buf->buf, avail, 1, (uint32_t)psize, &metas[1], &me) == 0;
        raise_check_error(r, &e, metas_ok ? metas : NULL, kind, owner, (uint64_t)npages);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(lmdb_check_doc,
             "lmdb_check(file, psize=0, npages=-1, both=False) -> dict\n\n"
             "Check every LMDB structure of the snapshot LMDB would open from file (a\n"
             "buffer of the whole file, e.g. an mmap): both meta pages, every page of the\n"
             "free, main and named databases (with their duplicate sub-pages and\n"
             "sub-databases), overflow runs, the free list, and that every page up to\n"
             "the meta page's last one is used exactly once or free\n"
             "(format-spec/lmdb.md).  psize 0 reads the page size from meta page 0;\n"
             "npages -1 takes every whole page of the buffer.\n\n"
             "Returns slot, txnid, last_pg, psize, file_pages, free_pages, free_past_end,\n"
             "free_records, tail_pages and trees: {name: {depth, root (None if empty),\n"
             "branch_pages, leaf_pages, overflow_pages, dup_pages (of its duplicates'\n"
             "sub-databases), entries, bytes (all its pages), key_bytes, value_bytes}},\n"
             "the free and main databases named '(free)' and '(main)'.\n"
             "both=True also checks the other meta page's snapshot and adds 'other': its\n"
             "dict, or {slot, txnid, error, pgno, tree} if it is damaged.\n\n"
             "Raises CorruptionError (database 'lmdb', attributes pgno, tree, problem)\n"
             "for the first problem of the current snapshot; ValueError for a bad\n"
             "psize or npages.  Cost: one read of every tree page, none of overflow\n"
             "pages; about 2 bytes of memory per page (twice with both).");
static PyObject *py_lmdb_check(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"file", "psize", "npages", "both", NULL};
    Py_buffer buf;
    unsigned long psize = 0;
    long long npages = -1;
    int both = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|kLp", names, &buf, &psize, &npages, &both))
        return NULL;
    PyObject *res = NULL, *other = NULL;
    mdbc_report *r = PyMem_Calloc(1, sizeof *r);
    uint8_t *kind = NULL, *owner = NULL;
    if (!r) {
        PyErr_NoMemory();
        goto done;
    }
    if (file_geometry(&buf, &psize, &npages) < 0)
        goto done;
    kind = PyMem_Malloc((size_t)npages + 2);
    owner = PyMem_Malloc((size_t)npages + 2);
    if (!kind || !owner) {
        PyErr_NoMemory();
        goto done;
    }
    if (run_check(&buf, psize, npages, -1, r, kind, owner) < 0 || !(res = report_dict(r)))
        goto done;
    if (both) {
        int slot = !r->slot;
        if (run_check(&buf, psize, npages, slot, r, kind, owner) == 0)
            other = report_dict(r);
        else if (PyErr_ExceptionMatches(PyExc_MemoryError))
            Py_CLEAR(res);
        else {
#if PY_VERSION_HEX >= 0x030C0000
            PyObject *exc = PyErr_GetRaisedException();
#else
            PyObject *type, *exc, *tb;
            PyErr_Fetch(&type, &exc, &tb);
            PyErr_NormalizeException(&type, &exc, &tb);
            Py_XDECREF(type);
            Py_XDECREF(tb);
#endif
            PyObject *msg = exc ? PyObject_Str(exc) : NULL;
            PyObject *pgno = exc ? PyObject_GetAttrString(exc, "pgno") : NULL;
            PyObject *tree = exc ? PyObject_GetAttrString(exc, "tree") : NULL;
            if (msg && pgno && tree)
                other = Py_BuildValue("{s:i,s:K,s:O,s:O,s:O}", "slot", slot, "txnid",
                                      (unsigned long long)r->meta.txnid, "error", msg, "pgno",
                                      pgno, "tree", tree);
            Py_XDECREF(msg);
            Py_XDECREF(pgno);
            Py_XDECREF(tree);
            Py_XDECREF(exc);
        }
        if (!other || PyDict_SetItemString(res, "other", other) < 0)
            Py_CLEAR(res);
    }
done:
    Py_XDECREF(other);
    PyMem_Free(r);
    PyMem_Free(kind);
    PyMem_Free(owner);
    PyBuffer_Release(&buf);
    return res;
}

PyDoc_STRVAR(lmdb_page_map_doc,
             "lmdb_page_map(file, psize=0, npages=-1, slot=-1) -> dict\n\n"
             "Check the snapshot of meta page slot (-1: the one LMDB opens) as\n"
             "lmdb_check does and return what each page of the file is: kinds (bytes,\n"
             "one per page: an index into kind_names), owners (bytes, one per page: an\n"
             "index into trees, 255 for none), trees (the tree names, '(free)' and\n"
             "'(main)' first) and kind_names ('unseen', 'meta', 'branch', 'leaf',\n"
             "'overflow', 'overflow-more', 'free', 'tail').  Pages of a duplicate\n"
             "sub-database belong to the named database that holds it.  Raises\n"
             "CorruptionError as lmdb_check.");
static PyObject *py_lmdb_page_map(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"file", "psize", "npages", "slot", NULL};
    Py_buffer buf;
    unsigned long psize = 0;
    long long npages = -1;
    int slot = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|kLi", names, &buf, &psize, &npages, &slot))
        return NULL;
    PyObject *res = NULL;
    mdbc_report *r = PyMem_Calloc(1, sizeof *r);
    uint8_t *kind = NULL, *owner = NULL;
    if (!r) {
        PyErr_NoMemory();
        goto done;
    }
    if (slot < -1 || slot > 1) {
        PyErr_SetString(PyExc_ValueError, "slot must be -1, 0 or 1");
        goto done;
    }
    if (file_geometry(&buf, &psize, &npages) < 0)
        goto done;
    kind = PyMem_Malloc((size_t)npages + 2);
    owner = PyMem_Malloc((size_t)npages + 2);
    if (!kind || !owner) {
        PyErr_NoMemory();
        goto done;
    }
    if (run_check(&buf, psize, npages, slot, r, kind, owner) < 0)
        goto done;
    PyObject *trees = PyTuple_New(r->ntrees);
    for (unsigned i = 0; trees && i < r->ntrees; i++) {
        PyObject *name = tree_name(r, (int)i);
        if (!name)
            Py_CLEAR(trees);
        else
            PyTuple_SET_ITEM(trees, i, name);
    }
    PyObject *kinds = PyTuple_New(sizeof KIND_NAMES / sizeof *KIND_NAMES);
    for (size_t i = 0; kinds && i < sizeof KIND_NAMES / sizeof *KIND_NAMES; i++) {
        PyObject *s = PyUnicode_FromString(KIND_NAMES[i]);
        if (!s)
            Py_CLEAR(kinds);
        else
            PyTuple_SET_ITEM(kinds, i, s);
    }
    if (trees && kinds)
        res = Py_BuildValue("{s:y#,s:y#,s:O,s:O}", "kinds", (const char *)kind, (Py_ssize_t)npages,
                            "owners", (const char *)owner, (Py_ssize_t)npages, "trees", trees,
                            "kind_names", kinds);
    Py_XDECREF(trees);
    Py_XDECREF(kinds);
done:
    PyMem_Free(r);
    PyMem_Free(kind);
    PyMem_Free(owner);
    PyBuffer_Release(&buf);
    return res;
}

PyMethodDef lmdbcheck_methods[] = {
    {"lmdb_check", (PyCFunction)(void (*)(void))py_lmdb_check, METH_VARARGS | METH_KEYWORDS,
     lmdb_check_doc},
    {"lmdb_page_map", (PyCFunction)(void (*)(void))py_lmdb_page_map, METH_VARARGS | METH_KEYWORDS,
     lmdb_page_map_doc},
    {NULL, NULL, 0, NULL},
};
