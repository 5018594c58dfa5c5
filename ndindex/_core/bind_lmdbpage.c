/* Python binding of the LMDB page reader (lmdbpage.c).
 *
 * A map is passed as (buffer, psize, npages): the bytes of the file (a
 * FileMapping), the page size and how many pages may be read.  A tree is
 * passed as (root or None, depth, flags).  Values come back as (offset,
 * length, flags) into the buffer, so Python slices the map without copying.
 *
 * FileMapping maps a file read-only with room to grow, as LMDB maps its
 * own: a snapshot reads pages that later commits appended without a new
 * mapping (Python's mmap cannot map past the end of a file, and remapping
 * at every commit would fault every page in again). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#ifndef _WIN32
#include <sys/mman.h>
#endif

#include "bindings.h"
#include "lmdbpage.h"

PyObject *ndx_raise_lmdb(const mdbp_error *e) {
    return ndx_raise_corruption(PyUnicode_FromFormat("LMDB page %llu: %s",
                                                     (unsigned long long)e->pgno, e->what),
                                "lmdb", -1);
}

/* Fill map from a buffer and geometry; the pages must lie inside the buffer. */
int ndx_get_map(Py_buffer *buf, unsigned long psize, unsigned long long npages, mdbp_map *map) {
    if (psize < 512 || psize > 65536 || (psize & (psize - 1))) {
        PyErr_SetString(PyExc_ValueError, "psize must be a power of two in 512..65536");
        return -1;
    }
    if (npages > (unsigned long long)buf->len / psize) {
        PyErr_SetString(PyExc_ValueError, "npages exceeds the buffer");
        return -1;
    }
    map->base = buf->buf;
    map->psize = (uint32_t)psize;
    map->npages = npages;
    return 0;
}

static PyObject *db_to_dict(const mdbp_db *d) {
    return Py_BuildValue("{s:k,s:k,s:K,s:K,s:K,s:K,s:K}", "flags", (unsigned long)d->flags,
                         "depth", (unsigned long)d->depth, "branch_pages",
                         (unsigned long long)d->branch_pages, "leaf_pages",
                         (unsigned long long)d->leaf_pages, "overflow_pages",
                         (unsigned long long)d->overflow_pages, "entries",
                         (unsigned long long)d->entries, "root", (unsigned long long)d->root);
}

PyDoc_STRVAR(lmdb_meta_doc,
             "lmdb_meta(file, slot, psize=0) -> dict\n\n"
             "Parse and check meta page 0 or 1 from the file's first bytes (a buffer).\n"
             "psize 0 reads it from page 0.  Returns txnid, last_pg, psize, mapsize,\n"
             "env_flags, free and main (tree records as dicts).  Raises CorruptionError.");
static PyObject *py_lmdb_meta(PyObject *self, PyObject *args) {
    Py_buffer buf;
    int slot;
    unsigned long psize = 0;
    if (!PyArg_ParseTuple(args, "y*i|k", &buf, &slot, &psize))
        return NULL;
    PyObject *res = NULL;
    mdbp_meta m;
    mdbp_error e;
    if (slot != 0 && slot != 1)
        PyErr_SetString(PyExc_ValueError, "slot must be 0 or 1");
    else if (mdbp_read_meta(buf.buf, (size_t)buf.len, slot, (uint32_t)psize, &m, &e) < 0)
        ndx_raise_lmdb(&e);
    else {
        PyObject *fr = db_to_dict(&m.free_db), *mn = db_to_dict(&m.main_db);
        if (fr && mn)
            res = Py_BuildValue("{s:K,s:K,s:k,s:K,s:k,s:O,s:O}", "txnid",
                                (unsigned long long)m.txnid, "last_pg",
                                (unsigned long long)m.last_pg, "psize", (unsigned long)m.psize,
                                "mapsize", (unsigned long long)m.mapsize, "env_flags",
                                (unsigned long)m.env_flags, "free", fr, "main", mn);
        Py_XDECREF(fr);
        Py_XDECREF(mn);
    }
    PyBuffer_Release(&buf);
    return res;
}

/* A tree from a Python tuple (root, depth, flags[, pages]): root None or an
 * int; pages (pages.Tree's count of the tree's pages) is not used here. */
int ndx_tree_of(PyObject *obj, mdbp_db *db) {
    PyObject *root, *pages = NULL;
    int depth;
    unsigned int flags;
    memset(db, 0, sizeof *db);
    if (!PyArg_ParseTuple(obj, "OiI|O", &root, &depth, &flags, &pages))
        return -1;
    if (root == Py_None) {
        db->root = MDBP_INVALID_PGNO;
    } else {
        db->root = PyLong_AsUnsignedLongLong(root);
        if (PyErr_Occurred())
            return -1;
    }
    if (depth < 0 || depth > MDBP_MAX_DEPTH || flags > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "tree depth or flags out of range");
        return -1;
    }
    db->depth = (uint16_t)depth;
    db->flags = (uint16_t)flags;
    return 0;
}

PyDoc_STRVAR(lmdb_get_doc,
             "lmdb_get(file, psize, npages, tree, key) -> (offset, length, flags) | None\n\n"
             "Exact lookup of key in tree = (root or None, depth, db flags); the value lies at\n"
             "file[offset:offset + length].  Raises CorruptionError for a damaged page.");
static PyObject *py_lmdb_get(PyObject *self, PyObject *args) {
    Py_buffer buf, key;
    unsigned long psize;
    unsigned long long npages;
    PyObject *tree;
    if (!PyArg_ParseTuple(args, "y*kKOy*", &buf, &psize, &npages, &tree, &key))
        return NULL;
    PyObject *res = NULL;
    mdbp_map map;
    mdbp_db db;
    if (ndx_get_map(&buf, psize, npages, &map) == 0 && ndx_tree_of(tree, &db) == 0) {
        const uint8_t *val;
        size_t vlen;
        unsigned flags;
        mdbp_error e;
        int rc = mdbp_get(&map, &db, key.buf, (size_t)key.len, &val, &vlen, &flags, &e);
        if (rc == MDBP_CORRUPT)
            ndx_raise_lmdb(&e);
        else if (rc == MDBP_END)
            res = Py_NewRef(Py_None);
        else
            res = Py_BuildValue("(nnk)", (Py_ssize_t)(val - map.base), (Py_ssize_t)vlen,
                                (unsigned long)flags);
    }
    PyBuffer_Release(&buf);
    PyBuffer_Release(&key);
    return res;
}

PyDoc_STRVAR(lmdb_scan_doc,
             "lmdb_scan(file, psize, npages, tree, start, prefix=b'', limit=-1,\n"
             "          check_all=False) -> list[(key, offset, length, flags)]\n\n"
             "The entries from the first key >= start, in order, while keys begin with\n"
             "prefix, at most limit of them.  check_all checks every node of every page\n"
             "visited.  Raises CorruptionError for a damaged page.");
static PyObject *py_lmdb_scan(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"file", "psize", "npages", "tree", "start", "prefix",
                            "limit", "check_all", NULL};
    Py_buffer buf, start, prefix = {0};
    unsigned long psize;
    unsigned long long npages;
    PyObject *tree;
    int check_all = 0;
    Py_ssize_t limit = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*kKOy*|y*np", names, &buf, &psize, &npages,
                                     &tree, &start, &prefix, &limit, &check_all))
        return NULL;
    PyObject *res = NULL;
    mdbp_map map;
    mdbp_db db;
    if (ndx_get_map(&buf, psize, npages, &map) < 0 || ndx_tree_of(tree, &db) < 0)
        goto done;
    res = PyList_New(0);
    if (!res)
        goto done;
    mdbp_cursor c;
    mdbp_error e;
    int rc = mdbp_seek(&map, &db, start.buf, (size_t)start.len, check_all, &c, &e);
    for (Py_ssize_t n = 0; rc == MDBP_FOUND && (limit < 0 || n < limit); n++) {
        const uint8_t *k, *val;
        size_t kl, vlen;
        unsigned flags;
        mdbp_key(&c, &k, &kl);
        if (prefix.buf && (kl < (size_t)prefix.len || memcmp(k, prefix.buf, prefix.len)))
            break;
        if (mdbp_value(&c, &val, &vlen, &flags, &e) < 0) {
            rc = MDBP_CORRUPT;
            break;
        }
        PyObject *item = Py_BuildValue("(y#nnk)", (const char *)k, (Py_ssize_t)kl,
                                       (Py_ssize_t)(val - map.base), (Py_ssize_t)vlen,
                                       (unsigned long)flags);
        if (!item || PyList_Append(res, item) < 0) {
            Py_XDECREF(item);
            Py_CLEAR(res);
            goto done;
        }
        Py_DECREF(item);
        rc = mdbp_next(&c, &e);
    }
    if (rc == MDBP_CORRUPT) {
        Py_CLEAR(res);
        ndx_raise_lmdb(&e);
    }
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&start);
    if (prefix.buf)
        PyBuffer_Release(&prefix);
    return res;
}

PyDoc_STRVAR(lmdb_check_tree_doc,
             "lmdb_check_tree(file, psize, npages, tree, bad_flags, free_last_pg=0) -> int\n\n"
             "Check every page and node of a tree and every value's bounds, as\n"
             "lmdb_scan(..., check_all=True) over the whole tree does, and that no\n"
             "node's flags have a bit of bad_flags; return the number of entries.\n"
             "free_last_pg (the free list's tree, its snapshot's last page): check\n"
             "each record as an ID list of that snapshot's pages too.\n"
             "No rows are built: a write transaction checks the free list whole\n"
             "(1,570 records: 0.4-1.1 ms as rows, 0.04 ms without, pages cached).\n"
             "Raises CorruptionError for a damaged page.");
static PyObject *py_lmdb_check_tree(PyObject *self, PyObject *args) {
    Py_buffer buf;
    unsigned long psize, bad_flags;
    unsigned long long npages, free_last_pg = 0;
    PyObject *tree;
    if (!PyArg_ParseTuple(args, "y*kKOk|K", &buf, &psize, &npages, &tree, &bad_flags,
                          &free_last_pg))
        return NULL;
    PyObject *res = NULL;
    mdbp_map map;
    mdbp_db db;
    if (ndx_get_map(&buf, psize, npages, &map) < 0 || ndx_tree_of(tree, &db) < 0)
        goto done;
    mdbp_cursor c;
    mdbp_error e;
    unsigned long long n = 0;
    int rc = mdbp_seek(&map, &db, (const uint8_t *)"", 0, 1, &c, &e);
    while (rc == MDBP_FOUND) {
        const uint8_t *k, *val;
        size_t kl, vlen;
        unsigned flags;
        mdbp_key(&c, &k, &kl);
        if (mdbp_value(&c, &val, &vlen, &flags, &e) < 0) {
            rc = MDBP_CORRUPT;
            break;
        }
        if (flags & bad_flags) {
            PyObject *hex = PyBytes_FromStringAndSize((const char *)k, (Py_ssize_t)kl);
            PyObject *h = hex ? PyObject_CallMethod(hex, "hex", NULL) : NULL;
            if (h)
                ndx_raise_corruption(PyUnicode_FromFormat("value of key %U has node flags %#lx",
                                                          h, (unsigned long)flags),
                                     "lmdb", -1);
            Py_XDECREF(hex);
            Py_XDECREF(h);
            goto done;
        }
        /* LMDB reuses the pages the free list names unchecked
         * (tools/sweep_corruption.py --index large --seed 291, trial 159). */
        const char *problem = !free_last_pg ? NULL
                              : kl != 8     ? "free-list key is not an 8-byte transaction id"
                                            : mdbp_free_list_problem(val, vlen, free_last_pg);
        if (problem) {
            rc = mdbp_fail(&e, ld64(c.page[c.depth - 1]), problem);
            break;
        }
        n++;
        rc = mdbp_next(&c, &e);
    }
    if (rc == MDBP_CORRUPT)
        ndx_raise_lmdb(&e);
    else
        res = PyLong_FromUnsignedLongLong(n);
done:
    PyBuffer_Release(&buf);
    return res;
}

PyDoc_STRVAR(lmdb_tree_doc,
             "lmdb_tree(file, psize, npages, raw) -> dict\n\n"
             "Parse and check a 48-byte tree record (MDB_db) as found in the main\n"
             "database for a named database.  Raises CorruptionError.");
static PyObject *py_lmdb_tree(PyObject *self, PyObject *args) {
    Py_buffer buf, raw;
    unsigned long psize;
    unsigned long long npages;
    if (!PyArg_ParseTuple(args, "y*kKy*", &buf, &psize, &npages, &raw))
        return NULL;
    PyObject *res = NULL;
    mdbp_map map;
    if (ndx_get_map(&buf, psize, npages, &map) == 0) {
        mdbp_db db;
        mdbp_error e;
        if (raw.len != MDBP_DB_BYTES)
            ndx_raise_corruption(PyUnicode_FromFormat("tree record is %zd bytes, expected %d",
                                                      raw.len, MDBP_DB_BYTES),
                                 "lmdb", -1);
        else if (mdbp_parse_db(&map, raw.buf, &db, &e) < 0)
            ndx_raise_lmdb(&e);
        else
            res = db_to_dict(&db);
    }
    PyBuffer_Release(&buf);
    PyBuffer_Release(&raw);
    return res;
}

#ifndef _WIN32
typedef struct {
    PyObject_HEAD
    void *addr;
    Py_ssize_t length;
    Py_ssize_t exports;
} FileMapping;

static int mapping_init(FileMapping *self, PyObject *args, PyObject *kw) {
    int fd;
    Py_ssize_t length;
    if (!PyArg_ParseTuple(args, "in", &fd, &length))
        return -1;
    if (self->addr) {
        PyErr_SetString(PyExc_ValueError, "FileMapping is already mapped");
        return -1;
    }
    if (length <= 0) {
        PyErr_SetString(PyExc_ValueError, "length must be positive");
        return -1;
    }
    void *addr = mmap(NULL, (size_t)length, PROT_READ, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
#ifdef MADV_RANDOM
    /* Queries touch a few scattered pages; read-ahead would only grow RSS. */
    madvise(addr, (size_t)length, MADV_RANDOM);
#endif
    self->addr = addr;
    self->length = length;
    return 0;
}

static void mapping_dealloc(FileMapping *self) {
    if (self->addr)
        munmap(self->addr, (size_t)self->length);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int mapping_getbuffer(FileMapping *self, Py_buffer *view, int flags) {
    if (!self->addr) {
        PyErr_SetString(PyExc_ValueError, "FileMapping is not mapped");
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->addr, self->length, 1, flags) < 0)
        return -1;
    self->exports++;
    return 0;
}

static void mapping_releasebuffer(FileMapping *self, Py_buffer *view) {
    self->exports--;
}

static PyBufferProcs mapping_as_buffer = {
    (getbufferproc)mapping_getbuffer,
    (releasebufferproc)mapping_releasebuffer,
};

static PyTypeObject FileMappingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ndindex._core.FileMapping",
    .tp_basicsize = sizeof(FileMapping),
    .tp_dealloc = (destructor)mapping_dealloc,
    .tp_as_buffer = &mapping_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "FileMapping(fd, length): a read-only shared mapping of length bytes of a file.\n\n"
              "Bytes past the end of the file must not be read (the OS signals SIGBUS);\n"
              "callers bound every read by the file's size.  Unmapped when the last\n"
              "reference (including buffers taken from it) goes.",
    .tp_init = (initproc)mapping_init,
    .tp_new = PyType_GenericNew,
};

int lmdbpage_module_init(PyObject *m) {
    if (PyType_Ready(&FileMappingType) < 0)
        return -1;
    Py_INCREF(&FileMappingType);
    if (PyModule_AddObject(m, "FileMapping", (PyObject *)&FileMappingType) < 0) {
        Py_DECREF(&FileMappingType);
        return -1;
    }
    return 0;
}
#else
int lmdbpage_module_init(PyObject *m) {
    return 0; /* Python falls back to mmap.mmap and remaps as the file grows */
}
#endif

#ifndef _WIN32
#include <pthread.h>
#include <stddef.h>
/* The head of LMDB's lock file as this platform's LMDB lays it out
 * (mdb.c, MDB_txbody): its reader mutex is a pthread mutex, or SysV
 * semaphore ids where mdb.c picks MDB_USE_SYSV_SEM. */
typedef struct {
    uint32_t magic;
    uint32_t format;
#if defined(__APPLE__) || defined(BSD) || defined(__FreeBSD_kernel__)
    int semid;
    int rlocked;
#else
    pthread_mutex_t rmutex;
#endif
    size_t txnid; /* mdb_size_t */
    unsigned numreaders;
} lmdb_lock_head;
#endif

PyDoc_STRVAR(lmdb_lock_layout_doc,
             "lmdb_lock_layout() -> (txnid_offset, numreaders_offset, txnid_bytes) or None\n\n"
             "Where LMDB's lock file holds the newest transaction id and the count of\n"
             "reader slots on this platform (None where it is not known).");

static PyObject *py_lmdb_lock_layout(PyObject *self, PyObject *noargs) {
#ifndef _WIN32
    return Py_BuildValue("(nnn)", (Py_ssize_t)offsetof(lmdb_lock_head, txnid),
                         (Py_ssize_t)offsetof(lmdb_lock_head, numreaders),
                         (Py_ssize_t)sizeof(size_t));
#else
    Py_RETURN_NONE;
#endif
}

PyMethodDef lmdbpage_methods[] = {
    {"lmdb_meta", py_lmdb_meta, METH_VARARGS, lmdb_meta_doc},
    {"lmdb_lock_layout", py_lmdb_lock_layout, METH_NOARGS, lmdb_lock_layout_doc},
    {"lmdb_get", py_lmdb_get, METH_VARARGS, lmdb_get_doc},
    {"lmdb_scan", (PyCFunction)(void (*)(void))py_lmdb_scan, METH_VARARGS | METH_KEYWORDS,
     lmdb_scan_doc},
    {"lmdb_tree", py_lmdb_tree, METH_VARARGS, lmdb_tree_doc},
    {"lmdb_check_tree", py_lmdb_check_tree, METH_VARARGS, lmdb_check_tree_doc},
    {NULL, NULL, 0, NULL},
};
