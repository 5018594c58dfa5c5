/* Python binding of the document kernels (docs.c): buffers, argument
 * checks, exceptions.  Arrays travel as buffers of native-order fixed-width
 * integers; results come back as bytearrays that numpy wraps. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "bindings.h"
#include "docs.h"

/* Release the GIL for work above this many features or pairs. */
#define GIL_RELEASE_ITEMS 4096

static Py_ssize_t items(const Py_buffer *b, Py_ssize_t size, const char *name) {
    if (b->len % size != 0) {
        PyErr_Format(PyExc_ValueError, "%s must hold %zd-byte items, got %zd bytes", name, size,
                     b->len);
        return -1;
    }
    return b->len / size;
}

PyDoc_STRVAR(band_keys_doc,
             "band_keys(features, a, b, rows, state=None) -> bytearray\n\n"
             "The len(a) band keys (native uint64) of one document: band j hashes the\n"
             "rows smallest distinct ((a[j] * fold(x) + b[j]) mod 2^64) >> 32 over the\n"
             "native uint64 features x with XXH64 seeded j (format-spec/documents.md).\n"
             "state, a writable buffer of len(a) * (rows + 1) uint32 (zeroed to begin),\n"
             "carries the bands' smallest values from call to call: the keys of a\n"
             "document given in pieces are those of the last call.");
static PyObject *py_band_keys(PyObject *self, PyObject *args) {
    Py_buffer feats, a, b, state = {0};
    int rows;
    if (!PyArg_ParseTuple(args, "y*y*y*i|w*:band_keys", &feats, &a, &b, &rows, &state))
        return NULL;
    PyObject *out = NULL;
    uint32_t *low = NULL;
    Py_ssize_t n = items(&feats, 8, "features"), bands = items(&a, 8, "a");
    if (n < 0 || bands < 0)
        goto done;
    if (b.len != a.len || bands < 1 || bands > 65535 || rows < 1 || rows > DOCS_MAX_ROWS) {
        PyErr_Format(PyExc_ValueError,
                     "need 1..65535 bands with as many a and b, rows in 1..%d; got %zd a, "
                     "%zd b, rows %d", DOCS_MAX_ROWS, bands, b.len / 8, rows);
        goto done;
    }
    Py_ssize_t state_bytes = bands * (rows + 1) * 4;
    if (state.obj) {
        if (state.len != state_bytes) {
            PyErr_Format(PyExc_ValueError, "band state must be %zd bytes, got %zd",
                         state_bytes, state.len);
            goto done;
        }
        low = state.buf;
    } else if (!(low = calloc((size_t)state_bytes, 1))) {
        PyErr_NoMemory();
        goto done;
    }
    uint32_t *count = low + (size_t)bands * rows;
    for (Py_ssize_t j = 0; j < bands; j++)
        if (count[j] > (uint32_t)rows) {
            PyErr_SetString(PyExc_ValueError, "band state holds a count above rows");
            goto done;
        }
    out = PyByteArray_FromStringAndSize(NULL, bands * 8);
    if (!out)
        goto done;
    uint64_t *keys = (uint64_t *)PyByteArray_AS_STRING(out);
    if (n * bands > GIL_RELEASE_ITEMS) {
        Py_BEGIN_ALLOW_THREADS
        docs_band_update(feats.buf, (size_t)n, a.buf, b.buf, (int)bands, rows, low, count);
        Py_END_ALLOW_THREADS
    } else {
        docs_band_update(feats.buf, (size_t)n, a.buf, b.buf, (int)bands, rows, low, count);
    }
    docs_band_hash(low, count, (int)bands, rows, keys);
done:
    if (!state.obj)
        free(low);
    PyBuffer_Release(&feats);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    if (state.obj)
        PyBuffer_Release(&state);
    return out;
}

/* The values of a sketch: a native uint32 buffer, strictly increasing. */
static Py_ssize_t sketch_values(const Py_buffer *v) {
    Py_ssize_t n = items(v, 4, "values");
    const uint32_t *x = v->buf;
    for (Py_ssize_t i = 1; n > 0 && i < n; i++)
        if (x[i] <= x[i - 1]) {
            PyErr_Format(PyExc_ValueError, "sketch values must strictly increase (index %zd)",
                         i);
            return -1;
        }
    return n;
}

PyDoc_STRVAR(rice_encode_doc,
             "rice_encode(values, k=-1) -> (k, bytes)\n\n"
             "The Rice bit stream of strictly increasing native uint32 values (gaps as\n"
             "in format-spec/documents.md) with parameter k; k = -1 picks the k in\n"
             "0..31 with the fewest bits (ties to the smaller).");
static PyObject *py_rice_encode(PyObject *self, PyObject *args) {
    Py_buffer v;
    int k = -1;
    if (!PyArg_ParseTuple(args, "y*|i:rice_encode", &v, &k))
        return NULL;
    PyObject *res = NULL;
    Py_ssize_t n = sketch_values(&v);
    if (n < 0)
        goto done;
    if (k < -1 || k > 31) {
        PyErr_Format(PyExc_ValueError, "k must be in 0..31 or -1, got %d", k);
        goto done;
    }
    if (k < 0)
        k = docs_rice_best(v.buf, (size_t)n);
    uint64_t bits = docs_rice_bits(v.buf, (size_t)n, k);
    PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((bits + 7) / 8));
    if (!data)
        goto done;
    docs_rice_encode(v.buf, (size_t)n, k, (uint8_t *)PyBytes_AS_STRING(data));
    res = Py_BuildValue("(iN)", k, data);
done:
    PyBuffer_Release(&v);
    return res;
}

static const char *decode_text(int rc) {
    switch (rc) {
    case DOCS_TRUNCATED: return "the bit stream ends before the last value";
    case DOCS_OVERFLOW: return "a value passes 2^32 - 1";
    case DOCS_PADDING: return "nonzero padding bits after the last value";
    case DOCS_TRAILING: return "bytes after the end of the bit stream";
    default: return "invalid arguments";
    }
}

PyDoc_STRVAR(rice_decode_doc,
             "rice_decode(data, n, k) -> bytearray\n\n"
             "n native uint32 values from a Rice bit stream with parameter k (0..31).\n"
             "Raises CorruptionError (database 'document record') when the bytes\n"
             "are not exactly such a stream.");
static PyObject *py_rice_decode(PyObject *self, PyObject *args) {
    Py_buffer data;
    Py_ssize_t n;
    int k;
    if (!PyArg_ParseTuple(args, "y*ni:rice_decode", &data, &n, &k))
        return NULL;
    PyObject *out = NULL;
    if (n < 0 || k < 0 || k > 31) {
        PyErr_Format(PyExc_ValueError, "need n >= 0 and k in 0..31, got n=%zd k=%d", n, k);
        goto done;
    }
    /* Every value takes at least one bit: a count past the bits (damage)
     * cannot decode, and the decoder writes at most that many values before
     * it says why, the same status a bit-at-a-time read gives (an overflow
     * can come before the end: "cannot fit" here misnamed it). */
    Py_ssize_t room = n > data.len * 8 ? data.len * 8 : n;
    out = PyByteArray_FromStringAndSize(NULL, room * 4);
    if (!out)
        goto done;
    int rc = docs_rice_decode(data.buf, (size_t)data.len, (size_t)n, k,
                              (uint32_t *)PyByteArray_AS_STRING(out));
    if (rc != DOCS_OK) {
        Py_CLEAR(out);
        ndx_raise_corruption(PyUnicode_FromString(decode_text(rc)), "document record", -1);
    }
done:
    PyBuffer_Release(&data);
    return out;
}

PyDoc_STRVAR(similarity_doc,
             "similarity(values, offsets, left, right, k, threshold=0.0) -> bytearray\n\n"
             "Bottom-k similarity (native float64) of each document pair (left[i],\n"
             "right[i]); sketch d is values[offsets[d]:offsets[d + 1]] (native uint32,\n"
             "sorted, distinct; offsets native int64, non-decreasing).  With threshold\n"
             "> 0, a pair that cannot reach it may get an upper bound below it instead.\n"
             "Raises ValueError for an index outside the sketches or bad offsets.");
static PyObject *py_similarity(PyObject *self, PyObject *args) {
    Py_buffer v, off, l, r;
    Py_ssize_t k;
    double threshold = 0.0;
    if (!PyArg_ParseTuple(args, "y*y*y*y*n|d:similarity", &v, &off, &l, &r, &k, &threshold))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t nv = items(&v, 4, "values"), no = items(&off, 8, "offsets");
    Py_ssize_t np_ = items(&l, 8, "left"), nr = items(&r, 8, "right");
    if (nv < 0 || no < 0 || np_ < 0 || nr < 0)
        goto done;
    if (no < 1 || np_ != nr || k < 1) {
        PyErr_SetString(PyExc_ValueError, "need offsets of n + 1 >= 1 entries, left and right "
                                          "of one length, k >= 1");
        goto done;
    }
    const int64_t *o = off.buf, *lp = l.buf, *rp = r.buf;
    if (o[0] != 0 || o[no - 1] != nv) {
        PyErr_SetString(PyExc_ValueError, "offsets must start at 0 and end at len(values)");
        goto done;
    }
    for (Py_ssize_t i = 1; i < no; i++)
        if (o[i] < o[i - 1]) {
            PyErr_SetString(PyExc_ValueError, "offsets must not decrease");
            goto done;
        }
    for (Py_ssize_t i = 0; i < np_; i++)
        if (lp[i] < 0 || lp[i] >= no - 1 || rp[i] < 0 || rp[i] >= no - 1) {
            PyErr_Format(PyExc_ValueError, "pair %zd names a document outside 0..%zd", i, no - 2);
            goto done;
        }
    out = PyByteArray_FromStringAndSize(NULL, np_ * 8);
    if (!out)
        goto done;
    double *res = (double *)PyByteArray_AS_STRING(out);
    if (np_ > GIL_RELEASE_ITEMS) {
        Py_BEGIN_ALLOW_THREADS
        docs_similarity(v.buf, o, lp, rp, (size_t)np_, (size_t)k, threshold, res);
        Py_END_ALLOW_THREADS
    } else {
        docs_similarity(v.buf, o, lp, rp, (size_t)np_, (size_t)k, threshold, res);
    }
done:
    PyBuffer_Release(&v);
    PyBuffer_Release(&off);
    PyBuffer_Release(&l);
    PyBuffer_Release(&r);
    return out;
}

PyMethodDef docs_methods[] = {
    {"band_keys", py_band_keys, METH_VARARGS, band_keys_doc},
    {"rice_encode", py_rice_encode, METH_VARARGS, rice_encode_doc},
    {"rice_decode", py_rice_decode, METH_VARARGS, rice_decode_doc},
    {"similarity", py_similarity, METH_VARARGS, similarity_doc},
    {NULL, NULL, 0, NULL},
};
