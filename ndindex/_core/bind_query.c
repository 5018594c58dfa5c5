/* Python binding of the query kernel: snapshots as capsules, query and
 * query_many.  Kernels live in query.c. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "bindings.h"
#include "query.h"

#define SNAPSHOT_CAPSULE "ndindex._core.snapshot"
/* Release the GIL for batches of at least this many queries. */
#define GIL_RELEASE_QUERIES 8

/* The C snapshot plus the Python objects whose memory it points into. */
typedef struct {
    query_snapshot s;
    int nviews;
    Py_buffer *views;
    PyObject *codes; /* tuple keeping the code capsules alive */
} snapshot_box;

static void box_free(snapshot_box *box) {
    for (int i = 0; i < box->nviews; i++)
        PyBuffer_Release(&box->views[i]);
    PyMem_Free(box->views);
    PyMem_Free(box->s.tables);
    Py_XDECREF(box->codes);
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

PyDoc_STRVAR(make_snapshot_doc,
             "make_snapshot(tables, removed) -> capsule\n\n"
             "tables: sequence of (p, runs, inverse_runs, code, keys, block_addresses, log,\n"
             "decoded, offsets) with uint64 buffers (log sorted and permuted; decoded, the\n"
             "whole table when preloaded, else None; offsets, where each block starts in\n"
             "decoded, one more than the blocks, or None);\n"
             "removed: sorted uint64 buffer of unpermuted values never to report.\n"
             "The caller must keep the memory the block addresses point to alive\n"
             "for as long as the snapshot is used.");
static PyObject *py_make_snapshot(PyObject *self, PyObject *args) {
    PyObject *tables, *removed;
    if (!PyArg_ParseTuple(args, "OO", &tables, &removed))
        return NULL;
    PyObject *fast = PySequence_Fast(tables, "tables must be a sequence");
    if (!fast)
        return NULL;
    Py_ssize_t nt = PySequence_Fast_GET_SIZE(fast);
    snapshot_box *box = PyMem_Calloc(1, sizeof *box);
    if (!box) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    box->s.ntables = (int)nt;
    box->s.tables = PyMem_Calloc(nt ? nt : 1, sizeof(query_table));
    box->views = PyMem_Calloc(5 * nt + 1, sizeof(Py_buffer));
    box->codes = PyTuple_New(nt);
    PyObject *cap = NULL;
    if (!box->s.tables || !box->views || !box->codes) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t t = 0; t < nt; t++) {
        query_table *tb = &box->s.tables[t];
        PyObject *p, *runs, *inv, *code, *keys, *addrs, *log, *decoded, *offsets;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, t), "OOOOOOOOO", &p, &runs, &inv,
                              &code, &keys, &addrs, &log, &decoded, &offsets))
            goto fail;
        tb->p = (int)PyLong_AsLong(p);
        if (tb->p < 0 || tb->p > 64) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "p must be in 0..64");
            goto fail;
        }
        if (ndx_parse_runs(runs, &tb->fwd) < 0 || ndx_parse_runs(inv, &tb->inv) < 0)
            goto fail;
        uint64_t top = tb->p == 0 ? 0 : (tb->p >= 64 ? ~0ull : ~0ull << (64 - tb->p));
        tb->orig_mask = perm_apply(&tb->inv, top);
        if (ndx_get_code(code, &tb->code) < 0)
            goto fail;
        Py_INCREF(code);
        PyTuple_SET_ITEM(box->codes, t, code);
        Py_buffer *v = &box->views[box->nviews];
        if (ndx_get_u64_buffer(keys, &v[0], 0, "keys") < 0)
            goto fail;
        box->nviews++;
        if (ndx_get_u64_buffer(addrs, &v[1], 0, "block addresses") < 0)
            goto fail;
        box->nviews++;
        if (ndx_get_u64_buffer(log, &v[2], 0, "log") < 0)
            goto fail;
        box->nviews++;
        if (v[0].len != v[1].len) {
            PyErr_SetString(PyExc_ValueError, "one block address per key");
            goto fail;
        }
        tb->nblocks = (size_t)v[0].len / 8;
        tb->keys = v[0].buf;
        tb->block_addr = v[1].buf;
        tb->nlog = (size_t)v[2].len / 8;
        tb->log = v[2].buf;
        if (decoded != Py_None) {
            if (ndx_get_u64_buffer(decoded, &v[3], 0, "decoded") < 0)
                goto fail;
            box->nviews++;
            if (ndx_get_u64_buffer(offsets, &v[4], 0, "offsets") < 0)
                goto fail;
            box->nviews++;
            tb->ndecoded = (size_t)v[3].len / 8;
            tb->decoded = v[3].buf;
            tb->offsets = v[4].buf;
            const uint64_t *off = v[4].buf;
            if ((size_t)v[4].len / 8 != tb->nblocks + 1 || off[0] != 0 ||
                off[tb->nblocks] != tb->ndecoded) {
                PyErr_SetString(PyExc_ValueError, "offsets must bound each block in decoded");
                goto fail;
            }
            for (size_t b = 0; b < tb->nblocks; b++)
                if (off[b] >= off[b + 1]) {
                    PyErr_SetString(PyExc_ValueError, "offsets must increase");
                    goto fail;
                }
        }
    }
    Py_buffer *rv = &box->views[box->nviews];
    if (ndx_get_u64_buffer(removed, rv, 0, "removed") < 0)
        goto fail;
    box->nviews++;
    box->s.nremoved = (size_t)rv->len / 8;
    box->s.removed = rv->buf;
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

static PyObject *raise_query_error(int rc, int table, size_t block) {
    if (rc == -100)
        return PyErr_NoMemory();
    return ndx_raise_corruption(PyUnicode_FromFormat("table %d, block %zu: %s", table, block,
                                                     ndx_status_text(rc)),
                                "segments", -1);
}

static PyObject *results_to_python(query_results *r) {
    PyObject *fp = PyBytes_FromStringAndSize((const char *)r->fp, (Py_ssize_t)(r->n * 8));
    PyObject *dist = PyBytes_FromStringAndSize((const char *)r->dist, (Py_ssize_t)r->n);
    PyObject *qidx = PyBytes_FromStringAndSize((const char *)r->qidx, (Py_ssize_t)(r->n * 8));
    PyObject *res = NULL;
    if (fp && dist && qidx)
        res = PyTuple_Pack(3, qidx, fp, dist);
    Py_XDECREF(fp);
    Py_XDECREF(dist);
    Py_XDECREF(qidx);
    return res;
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
             "query(snapshot, q, k) -> list[tuple[int, int]]\n\n"
             "Every stored value within Hamming distance k of q, distinct, as\n"
             "(value, distance) pairs ordered by (distance, value).");
static PyObject *py_query(PyObject *self, PyObject *args) {
    PyObject *snap;
    unsigned long long q;
    int k;
    if (!PyArg_ParseTuple(args, "OKi", &snap, &q, &k))
        return NULL;
    query_snapshot *s = get_snapshot(snap);
    if (!s)
        return NULL;
    query_results r = {0};
    int bad_table = 0;
    size_t bad_block = 0;
    int rc = query_one(s, q, k, 0, &r, &bad_table, &bad_block);
    PyObject *res = NULL;
    if (rc < 0) {
        raise_query_error(rc, bad_table, bad_block);
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

PyDoc_STRVAR(query_many_doc,
             "query_many(snapshot, queries, k) -> (qidx: bytes, fingerprints: bytes, "
             "distances: bytes)\n\n"
             "query() for each uint64 in queries; qidx (int64) names the query of each\n"
             "match.  Releases the GIL, so threads can split a batch.");
static PyObject *py_query_many(PyObject *self, PyObject *args) {
    PyObject *snap;
    Py_buffer qs;
    int k;
    if (!PyArg_ParseTuple(args, "Oy*i", &snap, &qs, &k))
        return NULL;
    query_snapshot *s = get_snapshot(snap);
    if (!s || qs.len % 8) {
        if (s)
            PyErr_SetString(PyExc_ValueError, "queries must be a uint64 buffer");
        PyBuffer_Release(&qs);
        return NULL;
    }
    size_t n = (size_t)qs.len / 8;
    const uint64_t *q = qs.buf;
    query_results r = {0};
    int rc = 0, bad_table = 0;
    size_t bad_block = 0;
    PyThreadState *ts = n >= GIL_RELEASE_QUERIES ? PyEval_SaveThread() : NULL;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = query_one(s, q[i], k, (int64_t)i, &r, &bad_table, &bad_block);
    if (ts)
        PyEval_RestoreThread(ts);
    PyObject *res = rc < 0 ? raise_query_error(rc, bad_table, bad_block)
                           : results_to_python(&r);
    query_results_free(&r);
    PyBuffer_Release(&qs);
    return res;
}

PyDoc_STRVAR(block_addresses_doc,
             "block_addresses(segment, first_block_offset, n_blocks, out, start) -> None\n\n"
             "Write the addresses of n_blocks consecutive 1024-byte blocks of a\n"
             "segment buffer into out[start:start + n_blocks] (uint64).");
static PyObject *py_block_addresses(PyObject *self, PyObject *args) {
    Py_buffer seg, out;
    Py_ssize_t off, nb, start;
    if (!PyArg_ParseTuple(args, "y*nnw*n", &seg, &off, &nb, &out, &start))
        return NULL;
    PyObject *res = NULL;
    if (off < 0 || nb < 0 || off + nb * BLOCK_BYTES > seg.len || start < 0 ||
        (start + nb) * 8 > out.len) {
        PyErr_SetString(PyExc_ValueError, "blocks lie outside the segment or the output");
    } else {
        uint64_t *o = (uint64_t *)out.buf + start;
        for (Py_ssize_t i = 0; i < nb; i++)
            o[i] = (uint64_t)(uintptr_t)((const char *)seg.buf + off + i * BLOCK_BYTES);
        res = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&seg);
    PyBuffer_Release(&out);
    return res;
}

PyMethodDef query_methods[] = {
    {"make_snapshot", py_make_snapshot, METH_VARARGS, make_snapshot_doc},
    {"query", py_query, METH_VARARGS, query_doc},
    {"query_many", py_query_many, METH_VARARGS, query_many_doc},
    {"block_addresses", py_block_addresses, METH_VARARGS, block_addresses_doc},
    {NULL, NULL, 0, NULL},
};

