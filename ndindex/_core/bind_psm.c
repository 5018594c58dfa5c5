/* Python binding of the probabilistic simhash matching kernels: the VOSH
 * order, one sorted table with a header directory (a capsule), online
 * queries and the batch-mode join.  Kernels live in psm.c. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "bindings.h"
#include "psm.h"

#define PSM_CAPSULE "ndindex._core.psm_table"
/* Release the GIL for batches of at least this many queries or entries. */
#define GIL_RELEASE_QUERIES 8
#define GIL_RELEASE_ENTRIES 4096
/* Largest directory: 2^30 + 1 offsets (4 GiB) is far past any useful size. */
#define MAX_DIR_BITS 30

/* The table plus the buffer its values live in and its own directory. */
typedef struct {
    psm_table t;
    Py_buffer values;
    uint32_t *dir;
} psm_box;

static void psm_capsule_free(PyObject *cap) {
    psm_box *box = PyCapsule_GetPointer(cap, PSM_CAPSULE);
    if (box) {
        PyBuffer_Release(&box->values);
        PyMem_Free(box->dir);
        PyMem_Free(box);
    }
}

static const psm_table *get_table(PyObject *obj) {
    psm_box *box = PyCapsule_GetPointer(obj, PSM_CAPSULE);
    if (!box) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "table must come from psm_table()");
        return NULL;
    }
    return &box->t;
}

/* A float64 buffer of n probabilities per row, each in [0, 1]; -1 with an exception. */
int ndx_get_probs(PyObject *obj, Py_buffer *view, size_t per_row, size_t rows) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if ((size_t)view->len != per_row * rows * sizeof(double)) {
        PyErr_Format(PyExc_ValueError, "probabilities must be %zu float64 values, got %zd bytes",
                     per_row * rows, view->len);
        PyBuffer_Release(view);
        return -1;
    }
    const double *p = view->buf;
    for (size_t i = 0; i < per_row * rows; i++)
        if (!(p[i] >= 0.0 && p[i] <= 1.0)) { /* NaN too */
            PyErr_SetString(PyExc_ValueError, "probabilities must lie in [0, 1]");
            PyBuffer_Release(view);
            return -1;
        }
    return 0;
}

static int check_k(int k) {
    if (k < 0 || k > 64) {
        PyErr_Format(PyExc_ValueError, "k must be in 0..64, got %d", k);
        return -1;
    }
    return 0;
}

static PyObject *matches_to_list(const psm_results *r, size_t start) {
    PyObject *res = PyList_New((Py_ssize_t)(r->n - start));
    for (size_t i = start; res && i < r->n; i++) {
        PyObject *pair = Py_BuildValue("(Ki)", (unsigned long long)r->fp[i], (int)r->dist[i]);
        if (!pair) {
            Py_CLEAR(res);
            break;
        }
        PyList_SET_ITEM(res, (Py_ssize_t)(i - start), pair);
    }
    return res;
}

PyDoc_STRVAR(vosh_masks_doc,
             "vosh_masks(probabilities, positions, k, exact, out) -> int\n\n"
             "Write the flip sets of at most k (exactly k if exact) of the bits named by\n"
             "positions (uint8, one per probability) into out (uint64 masks), most\n"
             "probable first, until out is full or every set has come out.  Returns\n"
             "the number written.  The order is vosh.flip_sets_upto's.");
static PyObject *py_vosh_masks(PyObject *self, PyObject *args) {
    PyObject *probs_obj;
    Py_buffer pos, out, probs;
    int k, exact;
    if (!PyArg_ParseTuple(args, "Oy*ipw*", &probs_obj, &pos, &k, &exact, &out))
        return NULL;
    PyObject *res = NULL;
    size_t n = (size_t)pos.len;
    if (n > 64 || out.len % 8) {
        PyErr_SetString(PyExc_ValueError, "at most 64 positions; out must be uint64");
        goto done;
    }
    for (size_t i = 0; i < n; i++)
        if (((const uint8_t *)pos.buf)[i] > 63) {
            PyErr_SetString(PyExc_ValueError, "positions must be in 0..63");
            goto done;
        }
    if (check_k(k) < 0 || ndx_get_probs(probs_obj, &probs, n, 1) < 0)
        goto done;
    vosh_heap v;
    size_t cap = (size_t)out.len / 8, m = 0;
    uint64_t *o = out.buf;
    int rc = vosh_init(&v, probs.buf, pos.buf, (int)n, exact ? k : 0, k);
    while (rc == 0 && m < cap && (rc = vosh_next(&v, &o[m])) == 1) {
        m++;
        rc = 0;
    }
    vosh_free(&v);
    PyBuffer_Release(&probs);
    res = rc < 0 ? PyErr_NoMemory() : PyLong_FromSize_t(m);
done:
    PyBuffer_Release(&pos);
    PyBuffer_Release(&out);
    return res;
}

PyDoc_STRVAR(psm_table_doc,
             "psm_table(values, p, b) -> capsule\n\n"
             "One table for probabilistic matching: values, a sorted uint64 buffer\n"
             "(kept alive by the capsule); p header bits (0..63); a directory of\n"
             "2^b + 1 offsets over the top b bits (0 <= b <= min(p, 30)), built here.");
static PyObject *py_psm_table(PyObject *self, PyObject *args) {
    PyObject *values;
    int p, b;
    if (!PyArg_ParseTuple(args, "Oii", &values, &p, &b))
        return NULL;
    if (p < 0 || p > 63 || b < 0 || b > p || b > MAX_DIR_BITS)
        return PyErr_Format(PyExc_ValueError, "need 0 <= b <= p <= 63 and b <= %d, got p=%d b=%d",
                            MAX_DIR_BITS, p, b);
    psm_box *box = PyMem_Calloc(1, sizeof *box);
    if (!box)
        return PyErr_NoMemory();
    if (ndx_get_u64_buffer(values, &box->values, 0, "values") < 0) {
        PyMem_Free(box);
        return NULL;
    }
    const uint64_t *v = box->values.buf;
    size_t n = (size_t)box->values.len / 8, slots = (size_t)1 << b;
    PyObject *cap = NULL;
    if (n > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "a table holds at most 2^32 - 1 values");
        goto fail;
    }
    for (size_t i = 1; i < n; i++)
        if (v[i] < v[i - 1]) {
            PyErr_SetString(PyExc_ValueError, "values must be sorted ascending");
            goto fail;
        }
    box->dir = PyMem_Calloc(slots + 1, sizeof(uint32_t));
    if (!box->dir) {
        PyErr_NoMemory();
        goto fail;
    }
    /* dir[x] = first index whose top b bits are >= x */
    size_t i = 0;
    for (size_t x = 0; x <= slots; x++) {
        while (i < n && (b ? v[i] >> (64 - b) : 0) < x)
            i++;
        box->dir[x] = (uint32_t)(x == slots ? n : i);
    }
    box->t = (psm_table){.p = p, .b = b, .n = n, .vals = v, .dir = box->dir};
    cap = PyCapsule_New(box, PSM_CAPSULE, psm_capsule_free);
    if (cap)
        return cap;
fail:
    PyBuffer_Release(&box->values);
    PyMem_Free(box->dir);
    PyMem_Free(box);
    return cap;
}

PyDoc_STRVAR(psm_headers_doc,
             "psm_headers(q, probabilities, p, k, out) -> int\n\n"
             "Write q's flipped headers (top p bits of q XOR a flip set of at most k\n"
             "of them), most probable flip set first, into out (uint64) until it is\n"
             "full or every set has come out; probabilities: 64 float64 values, p_j\n"
             "of bit j.  Returns the number written.");
static PyObject *py_psm_headers(PyObject *self, PyObject *args) {
    unsigned long long q;
    PyObject *probs_obj;
    int p, k;
    Py_buffer out, probs;
    if (!PyArg_ParseTuple(args, "KOiiw*", &q, &probs_obj, &p, &k, &out))
        return NULL;
    PyObject *res = NULL;
    if (p < 0 || p > 63 || out.len % 8) {
        PyErr_SetString(PyExc_ValueError, "p must be in 0..63 and out a uint64 buffer");
    } else if (check_k(k) == 0 && ndx_get_probs(probs_obj, &probs, 64, 1) == 0) {
        long n = psm_headers(q, probs.buf, p, k, (size_t)out.len / 8, out.buf);
        res = n < 0 ? PyErr_NoMemory() : PyLong_FromLong(n);
        PyBuffer_Release(&probs);
    }
    PyBuffer_Release(&out);
    return res;
}

PyDoc_STRVAR(psm_expand_doc,
             "psm_expand(queries, probabilities, p, k, max_probes) -> (headers, queries)\n\n"
             "psm_headers for every query (probabilities: 64 float64 per query): the\n"
             "headers (uint64 bytes) and, for each, its query (uint64 bytes), in query\n"
             "order.  Releases the GIL.");
static PyObject *py_psm_expand(PyObject *self, PyObject *args) {
    Py_buffer qs, probs;
    PyObject *probs_obj;
    int p, k;
    Py_ssize_t max_probes;
    if (!PyArg_ParseTuple(args, "y*Oiin", &qs, &probs_obj, &p, &k, &max_probes))
        return NULL;
    PyObject *res = NULL;
    size_t nq = (size_t)qs.len / 8;
    if (qs.len % 8 || p < 0 || p > 63 || max_probes < 0) {
        PyErr_SetString(PyExc_ValueError, "queries must be uint64, p in 0..63 and max_probes >= 0");
        PyBuffer_Release(&qs);
        return NULL;
    }
    if (check_k(k) < 0 || ndx_get_probs(probs_obj, &probs, 64, nq) < 0) {
        PyBuffer_Release(&qs);
        return NULL;
    }
    size_t per = (size_t)max_probes, total = 0;
    uint64_t *h = NULL, *owner = NULL;
    long rc = 0;
    if (nq && per && nq > SIZE_MAX / per / sizeof *h) {
        rc = PSM_NOMEM;
    } else if (nq && per) {
        h = PyMem_RawMalloc(nq * per * sizeof *h);
        owner = PyMem_RawMalloc(nq * per * sizeof *owner);
        if (!h || !owner)
            rc = PSM_NOMEM;
    }
    if (rc == 0 && nq && per) {
        const uint64_t *q = qs.buf;
        const double *pr = probs.buf;
        Py_BEGIN_ALLOW_THREADS for (size_t i = 0; i < nq && rc >= 0; i++) {
            rc = psm_headers(q[i], pr + 64 * i, p, k, per, h + total);
            for (long j = 0; j < rc; j++)
                owner[total + (size_t)j] = q[i];
            if (rc > 0)
                total += (size_t)rc;
        }
        Py_END_ALLOW_THREADS
    }
    if (rc < 0) {
        PyErr_NoMemory();
    } else {
        PyObject *hb = PyBytes_FromStringAndSize((const char *)h, (Py_ssize_t)(total * 8));
        PyObject *ob = PyBytes_FromStringAndSize((const char *)owner, (Py_ssize_t)(total * 8));
        if (hb && ob)
            res = PyTuple_Pack(2, hb, ob);
        Py_XDECREF(hb);
        Py_XDECREF(ob);
    }
    PyMem_RawFree(h);
    PyMem_RawFree(owner);
    PyBuffer_Release(&probs);
    PyBuffer_Release(&qs);
    return res;
}

PyDoc_STRVAR(psm_probe_doc,
             "psm_probe(table, q, headers, k) -> list[tuple[int, int]]\n\n"
             "Every stored value within k of q whose top p bits equal one of the\n"
             "header values (uint64 buffer), distinct, as (value, distance) ordered by\n"
             "(distance, value).  Headers above 2^p - 1 match nothing.");
static PyObject *py_psm_probe(PyObject *self, PyObject *args) {
    PyObject *tab;
    unsigned long long q;
    Py_buffer headers;
    int k;
    if (!PyArg_ParseTuple(args, "OKy*i", &tab, &q, &headers, &k))
        return NULL;
    const psm_table *t = get_table(tab);
    PyObject *res = NULL;
    if (t && headers.len % 8 == 0 && check_k(k) == 0) {
        psm_results r = {0};
        if (psm_probe(t, q, k, headers.buf, (size_t)headers.len / 8, 0, &r) < 0)
            PyErr_NoMemory();
        else
            res = matches_to_list(&r, 0);
        psm_results_free(&r);
    } else if (t && headers.len % 8) {
        PyErr_SetString(PyExc_ValueError, "headers must be a uint64 buffer");
    }
    PyBuffer_Release(&headers);
    return res;
}

PyDoc_STRVAR(psm_query_doc,
             "psm_query(table, q, probabilities, k, max_probes) -> (matches, probes)\n\n"
             "The online query: q's first max_probes flipped headers in VOSH order\n"
             "(probabilities: 64 float64 values), probed; matches as (value, distance)\n"
             "ordered by (distance, value); probes, the number of headers probed.");
static PyObject *py_psm_query(PyObject *self, PyObject *args) {
    PyObject *tab, *probs_obj;
    unsigned long long q;
    int k;
    Py_ssize_t max_probes;
    if (!PyArg_ParseTuple(args, "OKOin", &tab, &q, &probs_obj, &k, &max_probes))
        return NULL;
    const psm_table *t = get_table(tab);
    Py_buffer probs;
    if (!t || check_k(k) < 0 || ndx_get_probs(probs_obj, &probs, 64, 1) < 0)
        return NULL;
    if (max_probes < 0) {
        PyBuffer_Release(&probs);
        return PyErr_Format(PyExc_ValueError, "max_probes must be >= 0, got %zd", max_probes);
    }
    psm_results r = {0};
    size_t probes = 0;
    PyObject *res = NULL;
    if (psm_query(t, q, probs.buf, k, (size_t)max_probes, 0, &r, &probes) < 0) {
        PyErr_NoMemory();
    } else {
        PyObject *list = matches_to_list(&r, 0);
        if (list)
            res = Py_BuildValue("(Nn)", list, (Py_ssize_t)probes);
    }
    psm_results_free(&r);
    PyBuffer_Release(&probs);
    return res;
}

PyDoc_STRVAR(psm_query_many_doc,
             "psm_query_many(table, queries, probabilities, k, max_probes) ->\n"
             "    (qidx: bytes, fingerprints: bytes, distances: bytes, probes: bytes)\n\n"
             "psm_query for each uint64 in queries (probabilities: 64 float64 per query);\n"
             "qidx (int64) names the query of each match, probes (int64) the headers\n"
             "probed per query.  Releases the GIL.");
static PyObject *py_psm_query_many(PyObject *self, PyObject *args) {
    PyObject *tab, *probs_obj;
    Py_buffer qs, probs;
    int k;
    Py_ssize_t max_probes;
    if (!PyArg_ParseTuple(args, "Oy*Oin", &tab, &qs, &probs_obj, &k, &max_probes))
        return NULL;
    const psm_table *t = get_table(tab);
    size_t nq = (size_t)qs.len / 8;
    if (!t || check_k(k) < 0 || qs.len % 8 || max_probes < 0) {
        if (t && !PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "queries must be uint64 and max_probes >= 0");
        PyBuffer_Release(&qs);
        return NULL;
    }
    if (ndx_get_probs(probs_obj, &probs, 64, nq) < 0) {
        PyBuffer_Release(&qs);
        return NULL;
    }
    int64_t *probes = PyMem_RawMalloc((nq ? nq : 1) * sizeof *probes);
    psm_results r = {0};
    int rc = probes ? 0 : PSM_NOMEM;
    const uint64_t *q = qs.buf;
    const double *pr = probs.buf;
    PyThreadState *ts = nq >= GIL_RELEASE_QUERIES ? PyEval_SaveThread() : NULL;
    for (size_t i = 0; i < nq && rc == 0; i++) {
        size_t used = 0;
        rc = psm_query(t, q[i], pr + 64 * i, k, (size_t)max_probes, i, &r, &used);
        probes[i] = (int64_t)used;
    }
    if (ts)
        PyEval_RestoreThread(ts);
    PyObject *res = NULL;
    if (rc < 0) {
        PyErr_NoMemory();
    } else {
        PyObject *triple = ndx_pairs_to_bytes(r.q, r.fp, r.dist, r.n);
        PyObject *pb = PyBytes_FromStringAndSize((const char *)probes, (Py_ssize_t)(nq * 8));
        if (triple && pb)
            res = Py_BuildValue("(OOOO)", PyTuple_GET_ITEM(triple, 0), PyTuple_GET_ITEM(triple, 1),
                                PyTuple_GET_ITEM(triple, 2), pb);
        Py_XDECREF(triple);
        Py_XDECREF(pb);
    }
    psm_results_free(&r);
    PyMem_RawFree(probes);
    PyBuffer_Release(&probs);
    PyBuffer_Release(&qs);
    return res;
}

PyDoc_STRVAR(psm_join_doc,
             "psm_join(headers, queries, fingerprints, p, k, skip_equal) ->\n"
             "    (q: bytes, f: bytes, distance: bytes)\n\n"
             "Batch mode: entries (headers[i], queries[i]) sorted by header, and\n"
             "fingerprints sorted ascending (uint64 buffers).  Every (queries[i], f)\n"
             "with f's top p bits equal to headers[i] and distance <= k (f !=\n"
             "queries[i] with skip_equal).  Releases the GIL.");
static PyObject *py_psm_join(PyObject *self, PyObject *args) {
    Py_buffer eh, eq, fps;
    int p, k, skip_equal;
    if (!PyArg_ParseTuple(args, "y*y*y*iip", &eh, &eq, &fps, &p, &k, &skip_equal))
        return NULL;
    PyObject *res = NULL;
    if (eh.len % 8 || eq.len != eh.len || fps.len % 8 || p < 0 || p > 63) {
        PyErr_SetString(PyExc_ValueError, "headers, queries (as many) and fingerprints must be "
                                          "uint64 buffers, p in 0..63");
    } else if (check_k(k) == 0) {
        size_t ne = (size_t)eh.len / 8, nf = (size_t)fps.len / 8;
        const uint64_t *h = eh.buf, *f = fps.buf;
        int sorted = 1;
        for (size_t i = 1; i < ne && sorted; i++)
            sorted = h[i - 1] <= h[i];
        for (size_t i = 1; i < nf && sorted; i++)
            sorted = f[i - 1] <= f[i];
        if (!sorted) {
            PyErr_SetString(PyExc_ValueError, "headers and fingerprints must be sorted");
        } else {
            psm_results r = {0};
            int rc;
            if (ne + nf >= GIL_RELEASE_ENTRIES) {
                Py_BEGIN_ALLOW_THREADS rc = psm_join(h, eq.buf, ne, f, nf, p, k, skip_equal, &r);
                Py_END_ALLOW_THREADS
            } else {
                rc = psm_join(h, eq.buf, ne, f, nf, p, k, skip_equal, &r);
            }
            res = rc < 0 ? PyErr_NoMemory() : ndx_pairs_to_bytes(r.q, r.fp, r.dist, r.n);
            psm_results_free(&r);
        }
    }
    PyBuffer_Release(&eh);
    PyBuffer_Release(&eq);
    PyBuffer_Release(&fps);
    return res;
}

PyMethodDef psm_methods[] = {
    {"vosh_masks", py_vosh_masks, METH_VARARGS, vosh_masks_doc},
    {"psm_table", py_psm_table, METH_VARARGS, psm_table_doc},
    {"psm_headers", py_psm_headers, METH_VARARGS, psm_headers_doc},
    {"psm_expand", py_psm_expand, METH_VARARGS, psm_expand_doc},
    {"psm_probe", py_psm_probe, METH_VARARGS, psm_probe_doc},
    {"psm_query", py_psm_query, METH_VARARGS, psm_query_doc},
    {"psm_query_many", py_psm_query_many, METH_VARARGS, psm_query_many_doc},
    {"psm_join", py_psm_join, METH_VARARGS, psm_join_doc},
    {NULL, NULL, 0, NULL},
};
