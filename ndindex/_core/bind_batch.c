/* Python binding of the batch join kernel: Q-tables as capsules and
 * batch_probe over a chunk of F.  The kernel lives in batch.c. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "batch.h"
#include "bindings.h"

#define BATCH_CAPSULE "ndindex._core.batch_tables"
/* Release the GIL for chunks of at least this many fingerprints. */
#define GIL_RELEASE_FPS 1024
/* Largest directory: 2^28 + 1 offsets (1 GiB) is far past any useful size. */
#define MAX_DIR_BITS 28

/* The C tables plus the buffers they point into. */
typedef struct {
    int ntables;
    batch_table *tables;
    int nviews;
    Py_buffer *views;
} batch_box;

static void box_free(batch_box *box) {
    for (int i = 0; i < box->nviews; i++)
        PyBuffer_Release(&box->views[i]);
    PyMem_Free(box->views);
    PyMem_Free(box->tables);
    PyMem_Free(box);
}

static void batch_capsule_free(PyObject *cap) {
    batch_box *box = PyCapsule_GetPointer(cap, BATCH_CAPSULE);
    if (box)
        box_free(box);
}


/* Check one table's directory against its values; -1 with ValueError. */
static int check_table(const batch_table *tb) {
    size_t slots = (size_t)1 << tb->b;
    if (tb->n > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "a table holds at most 2^32 - 1 values");
        return -1;
    }
    if (tb->dir[0] != 0 || tb->dir[slots] != tb->n) {
        PyErr_SetString(PyExc_ValueError, "directory must start at 0 and end at len(values)");
        return -1;
    }
    for (size_t h = 0; h < slots; h++)
        if (tb->dir[h] > tb->dir[h + 1]) {
            PyErr_SetString(PyExc_ValueError, "directory offsets must not decrease");
            return -1;
        }
    return 0;
}

PyDoc_STRVAR(make_batch_tables_doc,
             "make_batch_tables(tables) -> capsule\n\n"
             "tables: sequence of (p, b, runs, inverse_runs, mask, values, directory):\n"
             "values, a uint64 buffer of the permuted queries, sorted; directory, a\n"
             "uint32 buffer of 2^b + 1 offsets (directory[h] = first index whose top b\n"
             "bits are >= h); mask, the prefix bits at their unpermuted positions.\n"
             "The capsule keeps the buffers alive.");
static PyObject *py_make_batch_tables(PyObject *self, PyObject *arg) {
    PyObject *fast = PySequence_Fast(arg, "tables must be a sequence");
    if (!fast)
        return NULL;
    Py_ssize_t nt = PySequence_Fast_GET_SIZE(fast);
    batch_box *box = PyMem_Calloc(1, sizeof *box);
    if (!box) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    box->tables = PyMem_Calloc(nt ? (size_t)nt : 1, sizeof(batch_table));
    box->views = PyMem_Calloc(2 * (size_t)nt + 1, sizeof(Py_buffer));
    if (!box->tables || !box->views) {
        PyErr_NoMemory();
        goto fail;
    }
    if (nt < 1 || nt > 255) {
        PyErr_SetString(PyExc_ValueError, "need 1..255 tables");
        goto fail;
    }
    box->ntables = (int)nt;
    for (Py_ssize_t t = 0; t < nt; t++) {
        batch_table *tb = &box->tables[t];
        PyObject *runs, *inv, *vals, *dir;
        unsigned long long mask;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, t), "iiOOKOO", &tb->p, &tb->b, &runs,
                              &inv, &mask, &vals, &dir))
            goto fail;
        if (tb->p < 0 || tb->p > 64 || tb->b < 0 || tb->b > tb->p || tb->b > MAX_DIR_BITS) {
            PyErr_Format(PyExc_ValueError, "need 0 <= b <= p <= 64 and b <= %d, got p=%d b=%d",
                         MAX_DIR_BITS, tb->p, tb->b);
            goto fail;
        }
        if (ndx_parse_runs(runs, &tb->fwd) < 0 || ndx_parse_runs(inv, &tb->inv) < 0)
            goto fail;
        tb->mask = mask;
        Py_buffer *v = &box->views[box->nviews];
        if (PyObject_GetBuffer(vals, &v[0], PyBUF_C_CONTIGUOUS) < 0)
            goto fail;
        box->nviews++;
        if (PyObject_GetBuffer(dir, &v[1], PyBUF_C_CONTIGUOUS) < 0)
            goto fail;
        box->nviews++;
        if (v[0].len % 8 || (size_t)v[1].len != (((size_t)1 << tb->b) + 1) * 4) {
            PyErr_SetString(PyExc_ValueError,
                            "values must be uint64 and the directory 2^b + 1 uint32 offsets");
            goto fail;
        }
        tb->n = (size_t)v[0].len / 8;
        tb->vals = v[0].buf;
        tb->dir = v[1].buf;
        if (check_table(tb) < 0)
            goto fail;
    }
    Py_DECREF(fast);
    PyObject *cap = PyCapsule_New(box, BATCH_CAPSULE, batch_capsule_free);
    if (!cap)
        box_free(box);
    return cap;
fail:
    Py_DECREF(fast);
    box_free(box);
    return NULL;
}

PyDoc_STRVAR(batch_probe_doc,
             "batch_probe(tables, fingerprints, k, self_join) -> (q: bytes, f: bytes, "
             "distance: bytes)\n\n"
             "Every pair of a query in tables and a uint64 in fingerprints within\n"
             "Hamming distance k, once each; with self_join only pairs with q < f.\n"
             "q and f are uint64, distance uint8.  Releases the GIL.");
static PyObject *py_batch_probe(PyObject *self, PyObject *args) {
    PyObject *cap;
    Py_buffer fps;
    int k, self_join, sort_bits = 16;
    if (!PyArg_ParseTuple(args, "Oy*ip|i", &cap, &fps, &k, &self_join, &sort_bits))
        return NULL;
    batch_box *box = PyCapsule_GetPointer(cap, BATCH_CAPSULE);
    PyObject *res = NULL;
    if (!box) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "tables must come from make_batch_tables()");
    } else if (fps.len % 8) {
        PyErr_SetString(PyExc_ValueError, "fingerprints must be a uint64 buffer");
    } else if (k < 0 || k > 64) {
        PyErr_Format(PyExc_ValueError, "k must be in 0..64, got %d", k);
    } else {
        size_t nf = (size_t)fps.len / 8;
        batch_pairs r = {0};
        int rc;
        if (nf >= GIL_RELEASE_FPS) {
            Py_BEGIN_ALLOW_THREADS rc =
                batch_probe(box->tables, box->ntables, fps.buf, nf, k, self_join, sort_bits, &r);
            Py_END_ALLOW_THREADS
        } else {
            rc = batch_probe(box->tables, box->ntables, fps.buf, nf, k, self_join, sort_bits, &r);
        }
        res = rc < 0 ? PyErr_NoMemory() : ndx_pairs_to_bytes(r.q, r.f, r.dist, r.n);
        batch_pairs_free(&r);
    }
    PyBuffer_Release(&fps);
    return res;
}

PyMethodDef batch_methods[] = {
    {"make_batch_tables", py_make_batch_tables, METH_O, make_batch_tables_doc},
    {"batch_probe", py_batch_probe, METH_VARARGS, batch_probe_doc},
    {NULL, NULL, 0, NULL},
};
