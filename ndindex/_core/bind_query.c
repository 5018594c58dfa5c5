/* Python binding of the query kernel: snapshots as capsules, query and
 * query_many.  Kernels live in query.c. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "bindings.h"
#include "psm.h"
#include "query.h"

#define SNAPSHOT_CAPSULE "ndindex._core.snapshot"
#define DIRECTORY_CAPSULE "ndindex._core.run_directory"
#define LOG_AID_CAPSULE "ndindex._core.log_aid"
#define PENDING_INDEX_CAPSULE "ndindex._core.pending_index"

/* A run directory and the buffer (the file's mapping) its pointers lie in;
 * a directory that extends another (run_directory's prev) took over its
 * block pointers, and so holds the mappings they lie in too (older, smaller
 * mappings of the same file: a few, as the file doubles). */
#define DIRECTORY_MAPPINGS 16
typedef struct {
    run_directory d;
    Py_buffer file;
    int nolder;
    Py_buffer older[DIRECTORY_MAPPINGS];
} directory_box;

static void directory_box_free(directory_box *box) {
    run_directory_free(&box->d);
    PyBuffer_Release(&box->file);
    for (int i = 0; i < box->nolder; i++)
        PyBuffer_Release(&box->older[i]);
    PyMem_Free(box);
}

static void directory_free(PyObject *cap) {
    directory_box *box = PyCapsule_GetPointer(cap, DIRECTORY_CAPSULE);
    if (box)
        directory_box_free(box);
}

/* Hold, in box, a view of the mapping that exports v (unless box holds it). */
static int hold_mapping(directory_box *box, const Py_buffer *v) {
    if (v->obj == box->file.obj)
        return 0;
    for (int i = 0; i < box->nolder; i++)
        if (box->older[i].obj == v->obj)
            return 0;
    if (box->nolder == DIRECTORY_MAPPINGS) {
        PyErr_SetString(PyExc_RuntimeError, "a run directory spans too many mappings");
        return -1;
    }
    if (PyObject_GetBuffer(v->obj, &box->older[box->nolder], PyBUF_SIMPLE) < 0)
        return -1;
    box->nolder++;
    return 0;
}
/* Release the GIL for batches of at least this many queries. */
#define GIL_RELEASE_QUERIES 8

/* The C snapshot plus the Python objects whose memory it points into. */
typedef struct {
    query_snapshot s;
    query_table *tables;
    query_run *runs;
    int nviews;
    Py_buffer *views;
    PyObject *keep; /* list of objects (code capsules) the snapshot points into */
    const uint8_t **tomb_verified;
} snapshot_box;

/* A search aid over a table's log, and a view of the array it is over:
 * built once per log array (log_aid), it serves every snapshot whose table
 * has that array, as a commit leaves the log and grows its recent part. */
typedef struct {
    Py_buffer view;
    search_aid aid;
} log_aid_box;

static void log_aid_free(PyObject *cap) {
    log_aid_box *box = PyCapsule_GetPointer(cap, LOG_AID_CAPSULE);
    if (box) {
        search_aid_free(&box->aid);
        PyBuffer_Release(&box->view);
        PyMem_Free(box);
    }
}

static void box_free(snapshot_box *box) {
    for (int t = 0; box->tables && t < box->s.ntables; t++)
        if (!box->tables[t].log_aid_shared)
            search_aid_free(&box->tables[t].log_aid);
    for (int i = 0; i < box->nviews; i++)
        PyBuffer_Release(&box->views[i]);
    PyMem_Free(box->views);
    PyMem_Free(box->tables);
    PyMem_Free(box->runs);
    Py_XDECREF(box->keep);
    PyMem_Free(box->tomb_verified);
    PyMem_Free(box);
}

static void snapshot_free(PyObject *cap) {
    snapshot_box *box = PyCapsule_GetPointer(cap, SNAPSHOT_CAPSULE);
    if (box)
        box_free(box);
}

/* Parse a sequence of (src_lo, dst_lo, length) runs. */
int ndx_parse_runs(PyObject *seq, perm_runs *r) {
    PyObject *fast = PySequence_Fast(seq, "runs must be a sequence of (src, dst, length)");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int total = 0;
    if (n > 64) {
        PyErr_SetString(PyExc_ValueError, "at most 64 runs");
        goto fail;
    }
    r->n = (int)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        int src, dst, len;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "iii", &src, &dst, &len))
            goto fail;
        if (src < 0 || dst < 0 || len < 1 || src + len > 64 || dst + len > 64) {
            PyErr_Format(PyExc_ValueError, "run (%d, %d, %d) out of range", src, dst, len);
            goto fail;
        }
        r->src[i] = (uint8_t)src;
        r->dst[i] = (uint8_t)dst;
        r->mask[i] = len == 64 ? ~0ull : (1ull << len) - 1;
        total += len;
    }
    if (total != 64) {
        PyErr_Format(PyExc_ValueError, "runs cover %d bits, expected 64", total);
        goto fail;
    }
    Py_DECREF(fast);
    return 0;
fail:
    Py_DECREF(fast);
    return -1;
}

/* Take a uint64 buffer into the box; *n gets its length in values. */
static const uint64_t *take_u64(snapshot_box *box, PyObject *obj, size_t *n, const char *what) {
    Py_buffer *v = &box->views[box->nviews];
    if (ndx_get_u64_buffer(obj, v, 0, what) < 0)
        return NULL;
    box->nviews++;
    *n = (size_t)v->len / 8;
    return v->buf ? v->buf : (const uint64_t *)"";
}

static PyObject *raise_query_error(int rc, const query_error *err);

/* A bound that may be None: *has 0 for None. */
static int parse_bound(PyObject *obj, int *has, uint64_t *v) {
    *has = obj != Py_None;
    if (!*has)
        return 0;
    *v = PyLong_AsUnsignedLongLong(obj);
    return PyErr_Occurred() ? -1 : 0;
}

static int parse_run(snapshot_box *box, PyObject *item, query_run *r) {
    int space, kind;
    unsigned long run_id;
    unsigned long long last;
    PyObject *code, *lo, *hi, *dir;
    if (!PyArg_ParseTuple(item, "iikOKOOO", &space, &kind, &run_id, &code, &last, &lo, &hi, &dir))
        return -1;
    r->dir = NULL;
    r->mem = NULL;
    if (PyCapsule_IsValid(dir, LOG_AID_CAPSULE)) {
        /* A run in memory: its values, with their search aid (log_aid). */
        log_aid_box *ab = PyCapsule_GetPointer(dir, LOG_AID_CAPSULE);
        if (!ab->view.len) {
            PyErr_SetString(PyExc_ValueError, "a run in memory holds no values");
            return -1;
        }
        if (PyList_Append(box->keep, dir) < 0)
            return -1;
        r->mem = ab->view.buf;
        r->nmem = (size_t)ab->view.len / 8;
        r->mem_aid = &ab->aid;
    } else if (dir != Py_None) {
        directory_box *db = PyCapsule_GetPointer(dir, DIRECTORY_CAPSULE);
        if (!db || PyList_Append(box->keep, dir) < 0)
            return -1;
        r->dir = &db->d;
    }
    if (space < 0 || space > 255 || (kind != RUN_KIND_HUFFMAN && kind != RUN_KIND_RAW) ||
        run_id > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_ValueError, "run space, kind or id out of range");
        return -1;
    }
    r->space = (uint8_t)space;
    r->kind = (uint8_t)kind;
    r->run_id = (uint32_t)run_id;
    r->last = last;
    if (kind == RUN_KIND_HUFFMAN) {
        if (ndx_get_code(code, &r->code) < 0 || PyList_Append(box->keep, code) < 0)
            return -1;
    }
    return parse_bound(lo, &r->has_lo, &r->lo) < 0 || parse_bound(hi, &r->has_hi, &r->hi) < 0
               ? -1
               : 0;
}

PyDoc_STRVAR(make_snapshot_doc,
             "make_snapshot(file, psize, npages, chunks_tree, tables, hide_runs, tombstones,\n"
             "              hide_tombstones=None)\n"
             "    -> capsule\n\n"
             "file: the mapped index file; psize, npages: its page size and readable pages;\n"
             "chunks_tree: (root or None, depth, flags) of the chunks database;\n"
             "tables: sequence of (p, runs, inverse_runs, table_runs, log, log_recent[, log_aid])\n"
             "where table_runs is a sequence of (space, kind, run_id, code or None, last, lo or None,\n"
             "hi or None, directory or None) -- live range (lo, hi], directory from\n"
             "run_directory(), or for a run held in memory log_aid(values) over its values\n"
             "from the start of its live range on -- and log, log_recent the sorted\n"
             "permuted log additions\n"
             "(uint64; disjoint; log_recent the newest, small), log_aid from log_aid(log) or\n"
             "None (then built here);\n"
             "hide_runs: sorted uint64 values never reported from a run;\n"
             "tombstones: a sequence of (run_id, last, chunks), one a tombstone run (at most\n"
             "64): values they hold are never reported from a run either (looked up per\n"
             "candidate);\n"
             "hide_tombstones: sorted uint64 tombstones held in memory (of runs not in\n"
             "tombstones), or None.\n"
             "The caller keeps the LMDB read transaction that pins the pages open for as\n"
             "long as the snapshot is used.");
static PyObject *py_make_snapshot(PyObject *self, PyObject *args) {
    PyObject *file, *chunks, *tables, *hide_runs, *tombs, *hide_tombs = Py_None;
    unsigned long psize;
    unsigned long long npages, tomb_chunks = 0;
    uint32_t tomb_run_id[MAX_TOMB_RUNS];
    uint64_t tomb_last[MAX_TOMB_RUNS];
    if (!PyArg_ParseTuple(args, "OkKOOOO|O", &file, &psize, &npages, &chunks, &tables, &hide_runs,
                          &tombs, &hide_tombs))
        return NULL;
    PyObject *tfast = PySequence_Fast(tombs, "tombstones must be a sequence");
    if (!tfast)
        return NULL;
    Py_ssize_t ntomb = PySequence_Fast_GET_SIZE(tfast);
    if (ntomb > MAX_TOMB_RUNS) {
        Py_DECREF(tfast);
        PyErr_SetString(PyExc_ValueError, "more than 64 tombstone runs");
        return NULL;
    }
    for (Py_ssize_t r = 0; r < ntomb; r++) {
        unsigned long id;
        unsigned long long last, nchunks;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(tfast, r), "kKK", &id, &last, &nchunks) ||
            id == 0 || id > 0xFFFFFFFFul || nchunks > (1ull << 32)) {
            Py_DECREF(tfast);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "tombstone run id or chunks out of range");
            return NULL;
        }
        tomb_run_id[r] = (uint32_t)id;
        tomb_last[r] = last;
        tomb_chunks += nchunks;
    }
    Py_DECREF(tfast);
    size_t tomb_slots = 64;
    while (tomb_slots < 4 * tomb_chunks)
        tomb_slots *= 2;
    PyObject *fast = PySequence_Fast(tables, "tables must be a sequence");
    if (!fast)
        return NULL;
    Py_ssize_t nt = PySequence_Fast_GET_SIZE(fast);
    snapshot_box *box = PyMem_Calloc(1, sizeof *box);
    PyObject *cap = NULL;
    if (!box) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    box->keep = PyList_New(0);
    box->tables = PyMem_Calloc(nt ? nt : 1, sizeof(query_table));
    box->views = PyMem_Calloc(2 * nt + 4, sizeof(Py_buffer));
    if (!box->keep || !box->tables || !box->views) {
        PyErr_NoMemory();
        goto fail;
    }
    /* The file buffer, then one log per table, then the three value lists. */
    Py_buffer *fv = &box->views[box->nviews];
    if (PyObject_GetBuffer(file, fv, PyBUF_SIMPLE) < 0)
        goto fail;
    box->nviews++;
    if (ndx_get_map(fv, psize, npages, &box->s.map) < 0)
        goto fail;
    if (ndx_tree_of(chunks, &box->s.chunks) < 0)
        goto fail;
    Py_ssize_t total_runs = 0;
    for (Py_ssize_t t = 0; t < nt; t++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, t);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 6 || PyTuple_GET_SIZE(item) > 7) {
            PyErr_SetString(PyExc_TypeError, "each table is (p, runs, inverse_runs, table_runs, "
                                             "log, log_recent[, log_aid])");
            goto fail;
        }
        Py_ssize_t nr = PySequence_Size(PyTuple_GET_ITEM(item, 3));
        if (nr < 0)
            goto fail;
        total_runs += nr;
    }
    box->runs = PyMem_Calloc(total_runs ? total_runs : 1, sizeof(query_run));
    if (!box->runs) {
        PyErr_NoMemory();
        goto fail;
    }
    query_run *next_run = box->runs;
    for (Py_ssize_t t = 0; t < nt; t++) {
        query_table *tb = &box->tables[t];
        PyObject *item = PySequence_Fast_GET_ITEM(fast, t);
        tb->p = (int)PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
        if (PyErr_Occurred())
            goto fail;
        if (tb->p < 0 || tb->p > 64) {
            PyErr_SetString(PyExc_ValueError, "p must be in 0..64");
            goto fail;
        }
        if (ndx_parse_runs(PyTuple_GET_ITEM(item, 1), &tb->fwd) < 0 ||
            ndx_parse_runs(PyTuple_GET_ITEM(item, 2), &tb->inv) < 0)
            goto fail;
        tb->orig_mask = perm_apply(&tb->inv, prefix_mask(tb->p));
        PyObject *runs = PySequence_Fast(PyTuple_GET_ITEM(item, 3), "table runs must be a sequence");
        if (!runs)
            goto fail;
        tb->runs = next_run;
        tb->nruns = (int)PySequence_Fast_GET_SIZE(runs);
        for (int r = 0; r < tb->nruns; r++) {
            if (parse_run(box, PySequence_Fast_GET_ITEM(runs, r), next_run++) < 0) {
                Py_DECREF(runs);
                goto fail;
            }
        }
        Py_DECREF(runs);
        box->s.ntables = (int)t + 1; /* box_free frees the log tops of these */
        tb->log = take_u64(box, PyTuple_GET_ITEM(item, 4), &tb->nlog, "log");
        if (!tb->log)
            goto fail;
        tb->log_recent = take_u64(box, PyTuple_GET_ITEM(item, 5), &tb->nlog_recent, "log_recent");
        if (!tb->log_recent)
            goto fail;
        PyObject *aid = PyTuple_GET_SIZE(item) == 7 ? PyTuple_GET_ITEM(item, 6) : Py_None;
        if (aid != Py_None) {
            log_aid_box *ab = PyCapsule_GetPointer(aid, LOG_AID_CAPSULE);
            if (!ab)
                goto fail;
            if (ab->view.buf != (const void *)tb->log || (size_t)ab->view.len / 8 != tb->nlog) {
                PyErr_SetString(PyExc_ValueError, "log_aid is over another array than log");
                goto fail;
            }
            if (PyList_Append(box->keep, aid) < 0)
                goto fail;
            tb->log_aid = ab->aid;
            tb->log_aid_shared = 1;
        } else if (search_aid_build(&tb->log_aid, tb->log, tb->nlog) < 0) {
            PyErr_NoMemory();
            goto fail;
        }
    }
    box->s.ntables = (int)nt;
    box->s.tables = box->tables;
    if (!(box->s.hide_runs = take_u64(box, hide_runs, &box->s.nhide_runs, "hide_runs")))
        goto fail;
    if (hide_tombs != Py_None &&
        !(box->s.hide_tombs = take_u64(box, hide_tombs, &box->s.nhide_tombs, "hide_tombstones")))
        goto fail;
    box->s.ntomb = (int)ntomb;
    memcpy(box->s.tomb_run_id, tomb_run_id, ntomb * sizeof *tomb_run_id);
    memcpy(box->s.tomb_last, tomb_last, ntomb * sizeof *tomb_last);
    if (ntomb && !(box->tomb_verified = PyMem_Calloc(tomb_slots, sizeof(uint8_t *)))) {
        PyErr_NoMemory();
        goto fail;
    }
    box->s.tomb_verified = box->tomb_verified;
    box->s.tomb_slots = tomb_slots;
    cap = PyCapsule_New(box, SNAPSHOT_CAPSULE, snapshot_free);
    if (!cap)
        goto fail;
    Py_DECREF(fast);
    return cap;
fail:
    Py_DECREF(fast);
    box_free(box);
    return NULL;
}

static PyObject *raise_query_error(int rc, const query_error *err) {
    if (rc == QUERY_NOMEM)
        return PyErr_NoMemory();
    PyObject *msg = err->pgno
        ? PyUnicode_FromFormat("table %d, run %u: %s (LMDB page %llu)", err->table,
                               (unsigned)err->run_id, err->what, (unsigned long long)err->pgno)
        : PyUnicode_FromFormat("table %d, run %u: %s", err->table, (unsigned)err->run_id,
                               err->what);
    return ndx_raise_corruption_at(msg, "chunks", err->has_key ? (const char *)err->key : NULL,
                                   CHUNK_KEY_BYTES, -1);
}

/* A pending_index and views of the arrays it points into. */
typedef struct {
    pending_index ix;
    Py_buffer *views;
    int nviews;
} pending_index_box;

static void pending_index_box_free(pending_index_box *box) {
    for (int i = 0; i < box->nviews; i++)
        PyBuffer_Release(&box->views[i]);
    PyMem_Free(box->views);
    PyMem_Free(box->ix.part);
    PyMem_Free(box->ix.npart);
    PyMem_Free(box);
}

static void pending_index_free(PyObject *cap) {
    pending_index_box *box = PyCapsule_GetPointer(cap, PENDING_INDEX_CAPSULE);
    if (box)
        pending_index_box_free(box);
}

PyDoc_STRVAR(pending_index_doc,
             "pending_index(tables) -> capsule\n\n"
             "A writer's pending additions indexed for query() and query_many():\n"
             "tables holds, per table of the snapshot's plan, two sorted uint64\n"
             "arrays of the additions' values permuted by that table.  The capsule\n"
             "keeps views of the arrays.");
static PyObject *py_pending_index(PyObject *self, PyObject *tables) {
    PyObject *seq = PySequence_Fast(tables, "tables must be a sequence of (older, recent) pairs");
    if (!seq)
        return NULL;
    Py_ssize_t nt = PySequence_Fast_GET_SIZE(seq);
    pending_index_box *box = PyMem_Calloc(1, sizeof *box);
    if (!box || nt < 1 || nt > 1024) {
        PyMem_Free(box);
        Py_DECREF(seq);
        return box ? (PyErr_SetString(PyExc_ValueError, "tables: 1..1024 tables"), NULL)
                   : PyErr_NoMemory();
    }
    box->ix.ntables = (int)nt;
    box->ix.part = PyMem_Calloc((size_t)(2 * nt), sizeof *box->ix.part);
    box->ix.npart = PyMem_Calloc((size_t)(2 * nt), sizeof *box->ix.npart);
    box->views = PyMem_Calloc((size_t)(2 * nt), sizeof *box->views);
    PyObject *cap = NULL;
    if (!box->ix.part || !box->ix.npart || !box->views) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t t = 0; t < nt; t++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, t);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "each table is an (older, recent) tuple of arrays");
            goto done;
        }
        for (int j = 0; j < 2; j++) {
            Py_buffer *v = &box->views[box->nviews];
            if (ndx_get_u64_buffer(PyTuple_GET_ITEM(pair, j), v, 0, "pending index") < 0)
                goto done;
            box->nviews++;
            box->ix.part[2 * t + j] = v->buf;
            box->ix.npart[2 * t + j] = (size_t)v->len / 8;
        }
    }
    cap = PyCapsule_New(box, PENDING_INDEX_CAPSULE, pending_index_free);
done:
    Py_DECREF(seq);
    if (!cap)
        pending_index_box_free(box);
    return cap;
}

/* Optional pending (adds, removes) buffers, both None for none, and an
 * optional pending_index capsule (None for none) for snapshot s. */
typedef struct {
    query_pending p;
    Py_buffer adds, removes;
    int have;
} pending_args;

static int get_pending(PyObject *adds, PyObject *removes, PyObject *index,
                       const query_snapshot *s, pending_args *pa) {
    memset(pa, 0, sizeof *pa);
    if (adds == Py_None && removes == Py_None && index == Py_None)
        return 0;
    if (adds == Py_None || removes == Py_None) {
        PyErr_SetString(PyExc_TypeError, "pending adds and removes go together");
        return -1;
    }
    if (index != Py_None) {
        pending_index_box *box = PyCapsule_GetPointer(index, PENDING_INDEX_CAPSULE);
        if (!box) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "pending index must come from pending_index()");
            return -1;
        }
        if (box->ix.ntables != s->ntables) {
            PyErr_SetString(PyExc_ValueError, "pending index has another number of tables");
            return -1;
        }
        pa->p.index = &box->ix;
    }
    if (ndx_get_u64_buffer(adds, &pa->adds, 0, "pending adds") < 0)
        return -1;
    if (ndx_get_u64_buffer(removes, &pa->removes, 0, "pending removes") < 0) {
        PyBuffer_Release(&pa->adds);
        return -1;
    }
    pa->have = 1;
    pa->p.adds = pa->adds.buf;
    pa->p.nadds = (size_t)pa->adds.len / 8;
    pa->p.removes = pa->removes.buf;
    pa->p.nremoves = (size_t)pa->removes.len / 8;
    return 0;
}

static void release_pending(pending_args *pa) {
    if (pa->have) {
        PyBuffer_Release(&pa->adds);
        PyBuffer_Release(&pa->removes);
    }
}

static query_snapshot *get_snapshot(PyObject *obj) {
    snapshot_box *box = PyCapsule_GetPointer(obj, SNAPSHOT_CAPSULE);
    if (!box) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "snapshot must come from make_snapshot()");
        return NULL;
    }
    return &box->s;
}

PyDoc_STRVAR(query_doc,
             "query(snapshot, q, k, pending_adds=None, pending_removes=None,\n"
             "      pending_index=None) -> list[tuple[int, int]]\n\n"
             "Every stored value within Hamming distance k of q, distinct, as\n"
             "(value, distance) pairs ordered by (distance, value).  pending_adds\n"
             "(uint64, unsorted) and the values of pending_index (pending_index())\n"
             "are seen as stored; pending_removes (uint64, sorted) hide stored values\n"
             "and the index's.");
static PyObject *py_query(PyObject *self, PyObject *args) {
    PyObject *snap, *padds = Py_None, *premoves = Py_None, *pindex = Py_None;
    unsigned long long q;
    int k;
    if (!PyArg_ParseTuple(args, "OKi|OOO", &snap, &q, &k, &padds, &premoves, &pindex))
        return NULL;
    query_snapshot *s = get_snapshot(snap);
    if (!s)
        return NULL;
    if (k < 0 || k > 64) {
        PyErr_SetString(PyExc_ValueError, "k must be in 0..64");
        return NULL;
    }
    pending_args pa;
    if (get_pending(padds, premoves, pindex, s, &pa) < 0)
        return NULL;
    query_results r = {0};
    query_error err = {0};
    int rc = query_one(s, pa.have ? &pa.p : NULL, q, k, 0, &r, &err);
    release_pending(&pa);
    PyObject *res = NULL;
    if (rc < 0) {
        raise_query_error(rc, &err);
    } else if ((res = PyList_New((Py_ssize_t)r.n)) != NULL) {
        for (size_t i = 0; i < r.n; i++) {
            PyObject *pair = Py_BuildValue("(Ki)", (unsigned long long)r.fp[i], (int)r.dist[i]);
            if (!pair) {
                Py_CLEAR(res);
                break;
            }
            PyList_SET_ITEM(res, (Py_ssize_t)i, pair);
        }
    }
    query_results_free(&r);
    return res;
}

PyDoc_STRVAR(query_prefetch_doc,
             "query_prefetch(snapshot, q, k)\n\n"
             "Ask the page cache for the pages query(snapshot, q, k) will read in runs\n"
             "found through the chunks tree, a tree level at a time, so that a cold\n"
             "file's reads overlap.  Returns None; never raises for damage.");
static PyObject *py_query_prefetch(PyObject *self, PyObject *args) {
    PyObject *snap;
    unsigned long long q;
    int k;
    if (!PyArg_ParseTuple(args, "OKi", &snap, &q, &k))
        return NULL;
    query_snapshot *s = get_snapshot(snap);
    if (!s)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    query_prefetch(s, q, k);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyDoc_STRVAR(query_many_doc,
             "query_many(snapshot, queries, k, pending_adds=None, pending_removes=None,\n"
             "           pending_index=None)\n"
             "    -> (qidx: bytes, fingerprints: bytes, distances: bytes)\n\n"
             "query() for each uint64 in queries; qidx (int64) names the query of each\n"
             "match.  Releases the GIL, so threads can split a batch.");
static PyObject *py_query_many(PyObject *self, PyObject *args) {
    PyObject *snap, *padds = Py_None, *premoves = Py_None, *pindex = Py_None;
    Py_buffer qs;
    int k;
    if (!PyArg_ParseTuple(args, "Oy*i|OOO", &snap, &qs, &k, &padds, &premoves, &pindex))
        return NULL;
    query_snapshot *s = get_snapshot(snap);
    if (!s || qs.len % 8 || k < 0 || k > 64) {
        if (s)
            PyErr_SetString(PyExc_ValueError, "queries must be a uint64 buffer and k in 0..64");
        PyBuffer_Release(&qs);
        return NULL;
    }
    pending_args pa;
    if (get_pending(padds, premoves, pindex, s, &pa) < 0) {
        PyBuffer_Release(&qs);
        return NULL;
    }
    size_t n = (size_t)qs.len / 8;
    const uint64_t *q = qs.buf;
    query_results r = {0};
    query_error err = {0};
    int rc = 0;
    PyThreadState *ts = n >= GIL_RELEASE_QUERIES ? PyEval_SaveThread() : NULL;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = query_one(s, pa.have ? &pa.p : NULL, q[i], k, (int64_t)i, &r, &err);
    if (ts)
        PyEval_RestoreThread(ts);
    release_pending(&pa);
    PyObject *res = rc < 0 ? raise_query_error(rc, &err)
                           : ndx_pairs_to_bytes(r.qidx, r.fp, r.dist, r.n);
    query_results_free(&r);
    PyBuffer_Release(&qs);
    return res;
}

PyDoc_STRVAR(run_directory_doc,
             "run_directory(file, psize, npages, chunks_tree, space, run_id, kind, start,\n"
             "              prev=None) -> (capsule, chunks, inline_chunks, last)\n\n"
             "List the chunks of a run that hold values >= start, checking each header\n"
             "and their fences, for make_snapshot.  A chunk stored in its own overflow\n"
             "pages stays put until it is deleted; one stored inside a leaf page\n"
             "(inline_chunks counts them) moves when the page is copied, so a directory\n"
             "with inline chunks serves its own snapshot only.  prev: a directory of the\n"
             "same run that this one extends (start is then just past prev's last value,\n"
             "and the first chunk listed must continue where prev ends).  last: the last\n"
             "value listed, or None.  Raises CorruptionError.");
static PyObject *py_run_directory(PyObject *self, PyObject *args) {
    PyObject *file, *chunks, *prev = Py_None;
    unsigned long psize, run_id;
    unsigned long long npages, start;
    int space, kind;
    if (!PyArg_ParseTuple(args, "OkKOikiK|O", &file, &psize, &npages, &chunks, &space, &run_id,
                          &kind, &start, &prev))
        return NULL;
    const run_directory *prev_d = NULL;
    if (prev != Py_None) {
        directory_box *pb = PyCapsule_GetPointer(prev, DIRECTORY_CAPSULE);
        if (!pb)
            return NULL;
        prev_d = &pb->d;
    }
    if (space < 0 || space > 255 || run_id > 0xFFFFFFFFul ||
        (kind != RUN_KIND_HUFFMAN && kind != RUN_KIND_RAW)) {
        PyErr_SetString(PyExc_ValueError, "space, run id or kind out of range");
        return NULL;
    }
    mdbp_db tree;
    if (ndx_tree_of(chunks, &tree) < 0)
        return NULL;
    directory_box *box = PyMem_Calloc(1, sizeof *box);
    if (!box)
        return PyErr_NoMemory();
    if (PyObject_GetBuffer(file, &box->file, PyBUF_SIMPLE) < 0) {
        PyMem_Free(box);
        return NULL;
    }
    mdbp_map map;
    query_error err = {0};
    int rc = -1;
    if (ndx_get_map(&box->file, psize, npages, &map) == 0) {
        Py_BEGIN_ALLOW_THREADS rc = run_directory_build(&map, &tree, (uint8_t)space,
                                                        (uint32_t)run_id, (uint8_t)kind, start,
                                                        prev_d, &box->d, &err);
        Py_END_ALLOW_THREADS if (rc < 0) {
            err.table = space;
            raise_query_error(rc, &err);
        }
    }
    if (rc < 0) {
        PyBuffer_Release(&box->file);
        PyMem_Free(box);
        return NULL;
    }
    if (prev_d) {
        const directory_box *pb = PyCapsule_GetPointer(prev, DIRECTORY_CAPSULE);
        int bad = hold_mapping(box, &pb->file) < 0;
        for (int i = 0; !bad && i < pb->nolder; i++)
            bad = hold_mapping(box, &pb->older[i]) < 0;
        if (bad) {
            directory_box_free(box);
            return NULL;
        }
    }
    PyObject *cap = PyCapsule_New(box, DIRECTORY_CAPSULE, directory_free);
    if (!cap) {
        directory_box_free(box);
        return NULL;
    }
    PyObject *last = box->d.nblocks ? PyLong_FromUnsignedLongLong(box->d.last[box->d.nblocks - 1])
                                    : Py_NewRef(Py_None);
    if (!last) {
        Py_DECREF(cap);
        return NULL;
    }
    return Py_BuildValue("(NnnN)", cap, (Py_ssize_t)box->d.nchunks,
                         (Py_ssize_t)box->d.inline_chunks, last);
}

PyDoc_STRVAR(run_directory_verify_doc,
             "run_directory_verify(directory, kind, start) -> int\n\n"
             "Check the directory's blocks holding values >= start that no query has\n"
             "checked yet, as a query's first visit does, and flag those that pass;\n"
             "return how many.  A block that fails stays unflagged (the query that\n"
             "reaches it raises).  Releases the GIL.");
static PyObject *py_run_directory_verify(PyObject *self, PyObject *args) {
    PyObject *cap;
    int kind;
    unsigned long long start;
    if (!PyArg_ParseTuple(args, "OiK", &cap, &kind, &start))
        return NULL;
    directory_box *box = PyCapsule_GetPointer(cap, DIRECTORY_CAPSULE);
    if (!box)
        return NULL;
    if (kind != RUN_KIND_HUFFMAN && kind != RUN_KIND_RAW) {
        PyErr_SetString(PyExc_ValueError, "kind out of range");
        return NULL;
    }
    size_t n;
    Py_BEGIN_ALLOW_THREADS n = run_directory_verify(&box->d, (uint8_t)kind, start);
    Py_END_ALLOW_THREADS return PyLong_FromSize_t(n);
}

PyDoc_STRVAR(run_directory_blocks_doc,
             "run_directory_blocks(directory) -> list[(last, offset)]\n\n"
             "What a run directory lists: each block's last value and its offset in the\n"
             "file.");
static PyObject *py_run_directory_blocks(PyObject *self, PyObject *arg) {
    directory_box *box = PyCapsule_GetPointer(arg, DIRECTORY_CAPSULE);
    if (!box)
        return NULL;
    PyObject *out = PyList_New((Py_ssize_t)box->d.nblocks);
    for (size_t i = 0; out && i < box->d.nblocks; i++) {
        PyObject *item = Py_BuildValue("(Kn)", (unsigned long long)box->d.last[i],
                                       (Py_ssize_t)(box->d.block[i] - (const uint8_t *)box->file.buf));
        if (!item) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, item);
    }
    return out;
}

/* A tree (root or None, depth, flags) into db; -1 with an exception. */
PyDoc_STRVAR(run_read_doc,
             "run_read(file, psize, npages, chunks_tree, space, run_id, kind, code, start,\n"
             "         max_chunks, stop) -> (values, keys, end, exhausted, last_seen)\n\n"
             "Read up to max_chunks chunks of a run from the one holding start (after the\n"
             "first, none whose values all lie past stop), checking\n"
             "headers, fences and every block; return the values >= start (uint64 bytes),\n"
             "the chunks' keys, the last value of the last chunk read, whether no chunk of\n"
             "the run follows, and whether the run's last chunk was read.  code: the run's\n"
             "compiled code (Huffman runs) or None.  GIL released.  Raises CorruptionError.");
static PyObject *py_run_read(PyObject *self, PyObject *args) {
    PyObject *file, *chunks, *code;
    unsigned long psize, run_id;
    unsigned long long npages, start, stop;
    int space, kind;
    Py_ssize_t max_chunks;
    if (!PyArg_ParseTuple(args, "OkKOikiOKnK", &file, &psize, &npages, &chunks, &space, &run_id,
                          &kind, &code, &start, &max_chunks, &stop))
        return NULL;
    if (space < 0 || space > 255 || run_id > 0xFFFFFFFFul || max_chunks < 1 ||
        (kind != RUN_KIND_HUFFMAN && kind != RUN_KIND_RAW)) {
        PyErr_SetString(PyExc_ValueError, "space, run id, kind or max_chunks out of range");
        return NULL;
    }
    const codec_code *c = NULL;
    if (kind == RUN_KIND_HUFFMAN && ndx_get_code(code, &c) < 0)
        return NULL;
    mdbp_db tree;
    if (ndx_tree_of(chunks, &tree) < 0)
        return NULL;
    Py_buffer fb;
    if (PyObject_GetBuffer(file, &fb, PyBUF_SIMPLE) < 0)
        return NULL;
    mdbp_map map;
    PyObject *res = NULL;
    run_slice sl;
    query_error err = {0};
    if (ndx_get_map(&fb, psize, npages, &map) == 0) {
        int rc;
        Py_BEGIN_ALLOW_THREADS rc = run_read(&map, &tree, (uint8_t)space, (uint32_t)run_id,
                                             (uint8_t)kind, c, start, (size_t)max_chunks,
                                             stop, &sl, &err);
        Py_END_ALLOW_THREADS if (rc < 0) {
            err.table = space;
            raise_query_error(rc, &err);
        }
        else {
            PyObject *keys = PyList_New((Py_ssize_t)sl.nchunks);
            for (size_t i = 0; keys && i < sl.nchunks; i++) {
                PyObject *k = PyBytes_FromStringAndSize((const char *)sl.keys[i], CHUNK_KEY_BYTES);
                if (!k) {
                    Py_CLEAR(keys);
                    break;
                }
                PyList_SET_ITEM(keys, (Py_ssize_t)i, k);
            }
            /* The values (megabytes, for a merge step's chunks) are copied
             * and the slice freed without the GIL: under it, the copy and
             * the page faults of the new object's memory held up the
             * writer's add() calls (py-spy --gil: this call was 12% of the
             * GIL's time in a 10M stream).  No one else sees the new object
             * yet. */
            size_t n = sl.nvalues * 8;
            unsigned long long end = sl.end;
            int exhausted = sl.exhausted, last_seen = sl.last_seen;
            PyObject *values = keys ? PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n) : NULL;
            char *dst = values ? PyBytes_AS_STRING(values) : NULL;
            Py_BEGIN_ALLOW_THREADS
            if (dst && n) /* n = 0: the shared empty bytes, and values may be NULL */
                memcpy(dst, sl.values, n);
            run_slice_free(&sl); /* clears sl */
            Py_END_ALLOW_THREADS
            if (values && keys)
                res = Py_BuildValue("(OOKii)", values, keys, end, exhausted, last_seen);
            Py_XDECREF(values);
            Py_XDECREF(keys);
        }
    }
    PyBuffer_Release(&fb);
    return res;
}

/* -- probabilistic simhash matching on one table (query_prefixes) ---------- */

/* Table t of the snapshot; -1 with ValueError if there is none. */
static int check_table(const query_snapshot *s, int t) {
    if (t < 0 || t >= s->ntables) {
        PyErr_Format(PyExc_ValueError, "table %d: the snapshot has tables 0..%d", t,
                     s->ntables - 1);
        return -1;
    }
    return 0;
}

/* A list of (value, distance) pairs: results r[0..n). */
static PyObject *results_to_list(const query_results *r) {
    PyObject *res = PyList_New((Py_ssize_t)r->n);
    for (size_t i = 0; res && i < r->n; i++) {
        PyObject *pair = Py_BuildValue("(Ki)", (unsigned long long)r->fp[i], (int)r->dist[i]);
        if (!pair) {
            Py_CLEAR(res);
            break;
        }
        PyList_SET_ITEM(res, (Py_ssize_t)i, pair);
    }
    return res;
}

PyDoc_STRVAR(query_prefixes_doc,
             "query_prefixes(snapshot, table, q, k, prefixes, pending_adds=None,\n"
             "               pending_removes=None, pending_index=None)\n"
             "    -> list[tuple[int, int]]\n\n"
             "Probe only the given table, at each of prefixes (uint64 values of the\n"
             "table's p prefix bits): every stored value within Hamming distance k of q\n"
             "whose permuted prefix is one of them, distinct, as (value, distance) pairs\n"
             "ordered by (distance, value).  Pending additions count only under a\n"
             "probed prefix.  Raises ValueError for a prefix of more than p bits.");
static PyObject *py_query_prefixes(PyObject *self, PyObject *args) {
    PyObject *snap, *padds = Py_None, *premoves = Py_None, *pindex = Py_None, *prefix_obj;
    unsigned long long q;
    int t, k;
    if (!PyArg_ParseTuple(args, "OiKiO|OOO", &snap, &t, &q, &k, &prefix_obj, &padds, &premoves,
                          &pindex))
        return NULL;
    query_snapshot *s = get_snapshot(snap);
    if (!s || check_table(s, t) < 0)
        return NULL;
    if (k < 0 || k > 64) {
        PyErr_SetString(PyExc_ValueError, "k must be in 0..64");
        return NULL;
    }
    Py_buffer pv;
    if (ndx_get_u64_buffer(prefix_obj, &pv, 0, "prefixes") < 0)
        return NULL;
    const uint64_t *prefixes = pv.buf;
    size_t n = (size_t)pv.len / 8;
    int p = s->tables[t].p;
    for (size_t i = 0; i < n; i++)
        if (p < 64 && prefixes[i] >> p) {
            PyErr_Format(PyExc_ValueError, "prefix %llu has more than the table's %d bits",
                         (unsigned long long)prefixes[i], p);
            PyBuffer_Release(&pv);
            return NULL;
        }
    pending_args pa;
    if (get_pending(padds, premoves, pindex, s, &pa) < 0) {
        PyBuffer_Release(&pv);
        return NULL;
    }
    query_results r = {0};
    query_error err = {0};
    int rc = query_prefixes(s, pa.have ? &pa.p : NULL, t, q, k, prefixes, n, 0, &r, &err);
    release_pending(&pa);
    PyBuffer_Release(&pv);
    PyObject *res = rc < 0 ? raise_query_error(rc, &err) : results_to_list(&r);
    query_results_free(&r);
    return res;
}

/* Probabilities of the input bits (p_j of bit j) moved to the positions the
 * table's permutation gives them, where psm_headers reads them. */
static void permute_probs(const perm_runs *r, const double *in, double *out) {
    for (int i = 0; i < r->n; i++)
        for (int b = 0; b < popcount64(r->mask[i]); b++)
            out[r->dst[i] + b] = in[r->src[i] + b];
}

/* The PSM query of each q[i]: its first max_probes prefixes in VOSH order of
 * probs[64 i ..] over the table's prefix bits, probed by query_prefixes.
 * headers has room for max_probes values. */
static int psm_queries(const query_snapshot *s, const query_pending *pend, int t,
                       const uint64_t *q, const double *probs, size_t nq, int k,
                       size_t max_probes, uint64_t *headers, query_results *r,
                       query_error *err) {
    const query_table *tb = &s->tables[t];
    double moved[64];
    for (size_t i = 0; i < nq; i++) {
        permute_probs(&tb->fwd, probs + 64 * i, moved);
        long n = psm_headers(perm_apply(&tb->fwd, q[i]), moved, tb->p, k, max_probes, headers);
        if (n < 0)
            return QUERY_NOMEM;
        int rc = query_prefixes(s, pend, t, q[i], k, headers, (size_t)n, (int64_t)i, r, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Parse the arguments shared by query_psm and query_psm_many. */
static int psm_args(PyObject *snap, int t, int k, Py_ssize_t max_probes, query_snapshot **s,
                    uint64_t **headers) {
    *s = get_snapshot(snap);
    if (!*s || check_table(*s, t) < 0)
        return -1;
    if (k < 0 || k > 64 || max_probes < 0) {
        PyErr_SetString(PyExc_ValueError, "k must be in 0..64 and max_probes >= 0");
        return -1;
    }
    if ((size_t)max_probes > SIZE_MAX / 8) {
        PyErr_NoMemory();
        return -1;
    }
    *headers = PyMem_RawMalloc(max_probes ? (size_t)max_probes * 8 : 8);
    if (!*headers) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(query_psm_doc,
             "query_psm(snapshot, table, q, probabilities, k, max_probes, pending_adds=None,\n"
             "          pending_removes=None, pending_index=None) -> list[tuple[int, int]]\n\n"
             "The probabilistic query of one fingerprint: query_prefixes at the first\n"
             "max_probes prefixes of pi(q) XOR a flip set of at most k prefix bits, most\n"
             "probable flip set first (VOSH order of probabilities, 64 float64 values,\n"
             "p_j of input bit j).");
static PyObject *py_query_psm(PyObject *self, PyObject *args) {
    PyObject *snap, *probs_obj, *padds = Py_None, *premoves = Py_None, *pindex = Py_None;
    unsigned long long q;
    int t, k;
    Py_ssize_t max_probes;
    if (!PyArg_ParseTuple(args, "OiKOin|OOO", &snap, &t, &q, &probs_obj, &k, &max_probes, &padds,
                          &premoves, &pindex))
        return NULL;
    query_snapshot *s;
    uint64_t *headers;
    if (psm_args(snap, t, k, max_probes, &s, &headers) < 0)
        return NULL;
    Py_buffer probs;
    pending_args pa;
    PyObject *res = NULL;
    if (ndx_get_probs(probs_obj, &probs, 64, 1) == 0) {
        if (get_pending(padds, premoves, pindex, s, &pa) == 0) {
            uint64_t one = q;
            query_results r = {0};
            query_error err = {0};
            int rc = psm_queries(s, pa.have ? &pa.p : NULL, t, &one, probs.buf, 1, k,
                                 (size_t)max_probes, headers, &r, &err);
            release_pending(&pa);
            res = rc < 0 ? raise_query_error(rc, &err) : results_to_list(&r);
            query_results_free(&r);
        }
        PyBuffer_Release(&probs);
    }
    PyMem_RawFree(headers);
    return res;
}

PyDoc_STRVAR(query_psm_many_doc,
             "query_psm_many(snapshot, table, queries, probabilities, k, max_probes,\n"
             "               pending_adds=None, pending_removes=None, pending_index=None)\n"
             "    -> (qidx: bytes, fingerprints: bytes, distances: bytes)\n\n"
             "query_psm for each uint64 in queries (probabilities: 64 float64 per\n"
             "query), as query_many returns them.  Releases the GIL.");
static PyObject *py_query_psm_many(PyObject *self, PyObject *args) {
    PyObject *snap, *probs_obj, *padds = Py_None, *premoves = Py_None, *pindex = Py_None;
    Py_buffer qs;
    int t, k;
    Py_ssize_t max_probes;
    if (!PyArg_ParseTuple(args, "Oiy*Oin|OOO", &snap, &t, &qs, &probs_obj, &k, &max_probes,
                          &padds, &premoves, &pindex))
        return NULL;
    if (qs.len % 8) {
        PyErr_SetString(PyExc_ValueError, "queries must be a uint64 buffer");
        PyBuffer_Release(&qs);
        return NULL;
    }
    query_snapshot *s;
    uint64_t *headers;
    if (psm_args(snap, t, k, max_probes, &s, &headers) < 0) {
        PyBuffer_Release(&qs);
        return NULL;
    }
    size_t n = (size_t)qs.len / 8;
    Py_buffer probs;
    pending_args pa;
    PyObject *res = NULL;
    if (ndx_get_probs(probs_obj, &probs, 64, n) == 0) {
        if (get_pending(padds, premoves, pindex, s, &pa) == 0) {
            query_results r = {0};
            query_error err = {0};
            int rc;
            PyThreadState *ts = n >= GIL_RELEASE_QUERIES ? PyEval_SaveThread() : NULL;
            rc = psm_queries(s, pa.have ? &pa.p : NULL, t, qs.buf, probs.buf, n, k,
                             (size_t)max_probes, headers, &r, &err);
            if (ts)
                PyEval_RestoreThread(ts);
            release_pending(&pa);
            res = rc < 0 ? raise_query_error(rc, &err)
                         : ndx_pairs_to_bytes(r.qidx, r.fp, r.dist, r.n);
            query_results_free(&r);
        }
        PyBuffer_Release(&probs);
    }
    PyMem_RawFree(headers);
    PyBuffer_Release(&qs);
    return res;
}

PyDoc_STRVAR(log_aid_doc,
             "log_aid(log) -> capsule\n\n"
             "The search aid make_snapshot builds over a table's log (sorted uint64),\n"
             "built once: a snapshot given it with the same array shares it.");
static PyObject *py_log_aid(PyObject *self, PyObject *log) {
    log_aid_box *box = PyMem_Calloc(1, sizeof *box);
    if (!box)
        return PyErr_NoMemory();
    if (ndx_get_u64_buffer(log, &box->view, 0, "log") < 0) {
        PyMem_Free(box);
        return NULL;
    }
    size_t n = (size_t)box->view.len / 8;
    if (search_aid_build(&box->aid, box->view.buf ? box->view.buf : (const uint64_t *)"", n) < 0) {
        PyBuffer_Release(&box->view);
        PyMem_Free(box);
        return PyErr_NoMemory();
    }
    PyObject *cap = PyCapsule_New(box, LOG_AID_CAPSULE, log_aid_free);
    if (!cap) {
        search_aid_free(&box->aid);
        PyBuffer_Release(&box->view);
        PyMem_Free(box);
    }
    return cap;
}

PyMethodDef query_methods[] = {
    {"log_aid", py_log_aid, METH_O, log_aid_doc},
    {"run_read", py_run_read, METH_VARARGS, run_read_doc},
    {"run_directory", py_run_directory, METH_VARARGS, run_directory_doc},
    {"run_directory_verify", py_run_directory_verify, METH_VARARGS, run_directory_verify_doc},
    {"run_directory_blocks", py_run_directory_blocks, METH_O, run_directory_blocks_doc},
    {"make_snapshot", py_make_snapshot, METH_VARARGS, make_snapshot_doc},
    {"query_prefetch", py_query_prefetch, METH_VARARGS, query_prefetch_doc},
    {"query", py_query, METH_VARARGS, query_doc},
    {"pending_index", py_pending_index, METH_O, pending_index_doc},
    {"query_many", py_query_many, METH_VARARGS, query_many_doc},
    {"query_prefixes", py_query_prefixes, METH_VARARGS, query_prefixes_doc},
    {"query_psm", py_query_psm, METH_VARARGS, query_psm_doc},
    {"query_psm_many", py_query_psm_many, METH_VARARGS, query_psm_many_doc},
    {NULL, NULL, 0, NULL},
};
