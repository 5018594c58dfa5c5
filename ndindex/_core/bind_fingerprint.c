/* Python binding of the feature kernels (features.c): argument checks,
 * buffers, exceptions.  Arrays travel as buffers of native-order fixed-width
 * integers; results come back as bytearrays that numpy wraps without a copy. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "bindings.h"
#include "ndx_features.h"

/* Release the GIL for inputs above this many bytes (python-xxhash does the
 * same: below it, the release costs more than it frees). */
#define GIL_RELEASE_BYTES 8192

static int py_is_word(uint32_t cp) { return Py_UNICODE_ISALNUM(cp) || cp == '_'; }
static int py_is_space(uint32_t cp) { return Py_UNICODE_ISSPACE(cp); }

static PyObject *raise_status(int rc) {
    if (rc == FP_NOMEM)
        return PyErr_NoMemory();
    PyErr_Format(PyExc_ValueError, "feature kernel rejected its arguments (status %d)", rc);
    return NULL;
}

/* Check that a buffer holds whole items of item_size bytes; returns the count or -1. */
static Py_ssize_t item_count(const Py_buffer *b, Py_ssize_t item_size, const char *name) {
    if (b->len % item_size != 0) {
        PyErr_Format(PyExc_ValueError, "%s must hold %zd-byte items, got %zd bytes", name,
                     item_size, b->len);
        return -1;
    }
    return b->len / item_size;
}

PyDoc_STRVAR(xxh64_doc,
             "xxh64(data, seed=0) -> int\n\n"
             "XXH64 of a bytes-like object with a 64-bit seed, as an unsigned int.");
static PyObject *py_xxh64(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"data", "seed", NULL};
    Py_buffer data;
    unsigned long long seed = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|K:xxh64", names, &data, &seed))
        return NULL;
    uint64_t h;
    if (data.len > GIL_RELEASE_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        h = fp_xxh64(data.buf, (size_t)data.len, seed);
        Py_END_ALLOW_THREADS
    } else {
        h = fp_xxh64(data.buf, (size_t)data.len, seed);
    }
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLongLong(h);
}

PyDoc_STRVAR(xxh64_rows_doc,
             "xxh64_rows(data, row_bytes, seed=0) -> bytearray\n\n"
             "XXH64 of each row_bytes-byte row of data; native-order uint64 values.\n"
             "Raises ValueError unless len(data) is a multiple of row_bytes >= 1.");
static PyObject *py_xxh64_rows(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"data", "row_bytes", "seed", NULL};
    Py_buffer data;
    Py_ssize_t row_bytes;
    unsigned long long seed = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*n|K:xxh64_rows", names, &data, &row_bytes,
                                     &seed))
        return NULL;
    PyObject *out = NULL;
    if (row_bytes < 1) {
        PyErr_Format(PyExc_ValueError, "row_bytes must be >= 1, got %zd", row_bytes);
        goto done;
    }
    Py_ssize_t rows = item_count(&data, row_bytes, "data");
    if (rows < 0)
        goto done;
    out = PyByteArray_FromStringAndSize(NULL, rows * 8);
    if (!out)
        goto done;
    uint64_t *dst = (uint64_t *)PyByteArray_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    fp_xxh64_rows(data.buf, (size_t)rows, (size_t)row_bytes, seed, dst);
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&data);
    return out;
}

PyDoc_STRVAR(rabin_doc,
             "rabin(data) -> int\n\n"
             "Rabin fingerprint of data modulo x^64 + 0x9bdc0890b9832b3b over GF(2),\n"
             "the first byte's highest bit being the highest power of x.");
static PyObject *py_rabin(PyObject *self, PyObject *arg) {
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0)
        return NULL;
    uint64_t f = fp_rabin(data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLongLong(f);
}

PyDoc_STRVAR(extract_doc,
             "extract(text, carry, unit, ngram, hash, seed, stop, final, emitted_before)\n"
             "    -> (features: bytearray, carry: bytes, n_tokens: int)\n\n"
             "Tokenise one piece of normalised UTF-8 text into hashed features\n"
             "(native uint64).  unit: 0 words, 1 chars, 2 lines; hash: 0 XXH64,\n"
             "1 Rabin (chars only); stop: sorted native uint64 stop-token hashes.\n"
             "carry is the previous piece's carry (b'' for the first piece).");
static PyObject *py_extract(PyObject *self, PyObject *args) {
    Py_buffer text, carry, stop;
    int unit, hash, final, emitted_before;
    unsigned int ngram;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "y*y*iIiKy*pp:extract", &text, &carry, &unit, &ngram, &hash,
                          &seed, &stop, &final, &emitted_before))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n_stop = item_count(&stop, 8, "stop");
    if (n_stop < 0)
        goto done;
    if (ngram < 1) {
        PyErr_Format(PyExc_ValueError, "ngram must be >= 1, got %u", ngram);
        goto done;
    }
    fp_params p = {unit, ngram, hash, seed, stop.buf, (size_t)n_stop, final, emitted_before,
                   py_is_word, py_is_space};
    fp_result r;
    int rc;
    if (text.len > GIL_RELEASE_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        rc = fp_extract(text.buf, (size_t)text.len, carry.buf, (size_t)carry.len, &p, &r);
        Py_END_ALLOW_THREADS
    } else {
        rc = fp_extract(text.buf, (size_t)text.len, carry.buf, (size_t)carry.len, &p, &r);
    }
    if (rc != FP_OK) {
        raise_status(rc);
        goto done;
    }
    PyObject *feats = PyByteArray_FromStringAndSize((const char *)r.features,
                                                    (Py_ssize_t)(r.n_features * 8));
    PyObject *tail = PyBytes_FromStringAndSize((const char *)r.carry, (Py_ssize_t)r.carry_len);
    free(r.features);
    free(r.carry);
    if (feats && tail)
        result = Py_BuildValue("(NNn)", feats, tail, (Py_ssize_t)r.n_tokens);
    else {
        Py_XDECREF(feats);
        Py_XDECREF(tail);
    }
done:
    PyBuffer_Release(&text);
    PyBuffer_Release(&carry);
    PyBuffer_Release(&stop);
    return result;
}

PyDoc_STRVAR(simhash_accumulate_doc,
             "simhash_accumulate(features, weights, buckets) -> None\n\n"
             "Add native uint64 features with native int64 fixed-point weights\n"
             "(None: weight 1.0 each) into buckets, a writable buffer of 8*256 int64.");
static PyObject *py_simhash_accumulate(PyObject *self, PyObject *args) {
    Py_buffer feats, buckets, weights = {0};
    PyObject *wobj;
    if (!PyArg_ParseTuple(args, "y*Ow*:simhash_accumulate", &feats, &wobj, &buckets))
        return NULL;
    PyObject *result = NULL;
    int have_weights = wobj != Py_None;
    if (have_weights && PyObject_GetBuffer(wobj, &weights, PyBUF_SIMPLE) < 0)
        goto done;
    Py_ssize_t n = item_count(&feats, 8, "features");
    if (n < 0)
        goto done;
    if (have_weights && weights.len != feats.len) {
        PyErr_Format(PyExc_ValueError, "weights must match features: expected %zd int64, got %zd bytes",
                     n, weights.len);
        goto done;
    }
    if (buckets.len != 8 * 256 * 8) {
        PyErr_Format(PyExc_ValueError, "buckets must be 16384 bytes (8*256 int64), got %zd",
                     buckets.len);
        goto done;
    }
    const int64_t *w = have_weights ? weights.buf : NULL;
    if (feats.len > GIL_RELEASE_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        fp_simhash_accumulate(feats.buf, w, (size_t)n, buckets.buf);
        Py_END_ALLOW_THREADS
    } else {
        fp_simhash_accumulate(feats.buf, w, (size_t)n, buckets.buf);
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&feats);
    PyBuffer_Release(&buckets);
    if (have_weights && weights.obj)
        PyBuffer_Release(&weights);
    return result;
}

PyDoc_STRVAR(simhash_finish_doc,
             "simhash_finish(buckets) -> (fingerprint: int, v: bytearray)\n\n"
             "Expand the buckets into V (64 native int64, fixed point) and return the\n"
             "fingerprint whose bit j is 1 exactly when V_j > 0.");
static PyObject *py_simhash_finish(PyObject *self, PyObject *arg) {
    Py_buffer buckets;
    if (PyObject_GetBuffer(arg, &buckets, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = NULL;
    if (buckets.len != 8 * 256 * 8) {
        PyErr_Format(PyExc_ValueError, "buckets must be 16384 bytes (8*256 int64), got %zd",
                     buckets.len);
        goto done;
    }
    PyObject *v = PyByteArray_FromStringAndSize(NULL, 64 * 8);
    if (!v)
        goto done;
    int64_t *vv = (int64_t *)PyByteArray_AS_STRING(v);
    fp_simhash_finish(buckets.buf, vv);
    uint64_t fp = 0;
    for (int j = 0; j < 64; j++)
        if (vv[j] > 0)
            fp |= UINT64_C(1) << j;
    result = Py_BuildValue("(KN)", (unsigned long long)fp, v);
done:
    PyBuffer_Release(&buckets);
    return result;
}

PyDoc_STRVAR(minhash_update_doc,
             "minhash_update(features, a, b, mins) -> None\n\n"
             "Lower each mins[i] (writable native uint32) to the least\n"
             "((a[i] * fold(x) + b[i]) mod 2^64) >> 32 over the native uint64\n"
             "features x, fold(x) = (x ^ x >> 32) mod 2^32; a and b: native uint64.");
static PyObject *py_minhash_update(PyObject *self, PyObject *args) {
    Py_buffer feats, a, b, mins;
    if (!PyArg_ParseTuple(args, "y*y*y*w*:minhash_update", &feats, &a, &b, &mins))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = item_count(&feats, 8, "features");
    Py_ssize_t p = item_count(&a, 8, "a");
    if (n < 0 || p < 0)
        goto done;
    if (b.len != a.len || mins.len != p * 4) {
        PyErr_Format(PyExc_ValueError,
                     "a, b and mins must hold the same count: a %zd, b %zd, mins %zd",
                     p, b.len / 8, mins.len / 4);
        goto done;
    }
    if (feats.len > GIL_RELEASE_BYTES / 8) {
        Py_BEGIN_ALLOW_THREADS
        fp_minhash_update(feats.buf, (size_t)n, a.buf, b.buf, (size_t)p, mins.buf);
        Py_END_ALLOW_THREADS
    } else {
        fp_minhash_update(feats.buf, (size_t)n, a.buf, b.buf, (size_t)p, mins.buf);
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&feats);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    PyBuffer_Release(&mins);
    return result;
}

PyMethodDef fingerprint_methods[] = {
    {"xxh64", (PyCFunction)(void (*)(void))py_xxh64, METH_VARARGS | METH_KEYWORDS, xxh64_doc},
    {"xxh64_rows", (PyCFunction)(void (*)(void))py_xxh64_rows, METH_VARARGS | METH_KEYWORDS,
     xxh64_rows_doc},
    {"rabin", py_rabin, METH_O, rabin_doc},
    {"extract", py_extract, METH_VARARGS, extract_doc},
    {"simhash_accumulate", py_simhash_accumulate, METH_VARARGS, simhash_accumulate_doc},
    {"simhash_finish", py_simhash_finish, METH_O, simhash_finish_doc},
    {"minhash_update", py_minhash_update, METH_VARARGS, minhash_update_doc},
    {NULL, NULL, 0, NULL},
};
