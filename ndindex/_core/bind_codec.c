/* Python binding of the block codec, crc32c and the table-building array
 * kernels: argument checks, buffers, exceptions.  Kernels live in codec.c,
 * crc32c.c and arrays.c. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "arrays.h"
#include "rawblock.h"
#include "bindings.h"
#include "codec.h"
#include "crc32c.h"

/* Release the GIL for work above this many values. */
#define GIL_RELEASE_VALUES 4096

static PyObject *CorruptionError;

PyObject *ndx_raise_corruption_at(PyObject *message, const char *database, const char *key,
                                  Py_ssize_t key_len, Py_ssize_t offset) {
    PyObject *kw = Py_BuildValue("{s:s}", "database", database);
    if (kw && offset >= 0) {
        PyObject *o = PyLong_FromSsize_t(offset);
        if (!o || PyDict_SetItemString(kw, "offset", o) < 0)
            Py_CLEAR(kw);
        Py_XDECREF(o);
    }
    if (kw && key) {
        PyObject *k = PyBytes_FromStringAndSize(key, key_len);
        if (!k || PyDict_SetItemString(kw, "key", k) < 0)
            Py_CLEAR(kw);
        Py_XDECREF(k);
    }
    PyObject *args = message ? PyTuple_Pack(1, message) : NULL;
    if (kw && args) {
        PyObject *exc = PyObject_Call(CorruptionError, args, kw);
        if (exc) {
            PyErr_SetObject(CorruptionError, exc);
            Py_DECREF(exc);
        }
    }
    Py_XDECREF(kw);
    Py_XDECREF(args);
    Py_XDECREF(message);
    return NULL;
}

PyObject *ndx_raise_corruption(PyObject *message, const char *database, Py_ssize_t offset) {
    return ndx_raise_corruption_at(message, database, NULL, 0, offset);
}

const char *ndx_status_text(long rc) {
    switch (rc) {
    case CODEC_BAD_CHECKSUM: return "checksum mismatch";
    case CODEC_BAD_COUNT: return "impossible entry count";
    case CODEC_OVERRUN: return "bitstream runs past the end of the block";
    case CODEC_NOT_SORTED: return "decoded values do not increase";
    case CODEC_BAD_CODE: return "invalid Huffman code";
    case CODEC_BAD_PADDING: return "nonzero padding bits after the last entry";
    case CODEC_BAD_RESTART: return "a restart record disagrees with the entries";
    case CODEC_BAD_WIDTH: return "impossible packed width (above 56, or not the span's bit length)";
    default: return "unknown codec error";
    }
}

/* Raise CorruptionError naming the block; returns NULL. */
static PyObject *raise_block_error(long rc, Py_ssize_t block_index) {
    return ndx_raise_corruption(
        PyUnicode_FromFormat("block %zd: %s", block_index, ndx_status_text(rc)), "block",
        block_index * (Py_ssize_t)BLOCK_BYTES);
}

/* Compiled codes travel as capsules: Python cannot forge one, so kernels
 * can trust the tables without re-validating them on every call. */
#define CODE_CAPSULE "ndindex._core.code"

static void code_capsule_free(PyObject *cap) {
    PyMem_Free(PyCapsule_GetPointer(cap, CODE_CAPSULE));
}

int ndx_get_code(PyObject *obj, const codec_code **code) {
    *code = PyCapsule_GetPointer(obj, CODE_CAPSULE);
    if (*code == NULL) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "code must come from compile_code()");
        return -1;
    }
    return 0;
}

static int check_blocks(Py_buffer *b) {
    if (b->len % BLOCK_BYTES != 0) {
        PyErr_Format(PyExc_ValueError, "block data must be a multiple of %d bytes, got %zd",
                     BLOCK_BYTES, b->len);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(compile_code_doc,
             "compile_code(lengths, coding) -> capsule\n\n"
             "Build the canonical code for 64 code lengths (bytes, each 1..12,\n"
             "Kraft sum exactly 1) and a coding (0 = xor, 1 = delta, 2 = delta with\n"
             "restart records).\n"
             "Raises ValueError for an invalid code.");
static PyObject *py_compile_code(PyObject *self, PyObject *args) {
    Py_buffer lengths;
    int coding;
    if (!PyArg_ParseTuple(args, "y*i", &lengths, &coding))
        return NULL;
    PyObject *out = NULL;
    if (lengths.len != CODE_SYMBOLS) {
        PyErr_Format(PyExc_ValueError, "expected %d code lengths, got %zd", CODE_SYMBOLS,
                     lengths.len);
        goto done;
    }
    codec_code *c = PyMem_Malloc(sizeof *c);
    if (!c) {
        PyErr_NoMemory();
        goto done;
    }
    if (codec_compile(lengths.buf, coding, c) != CODEC_OK) {
        PyMem_Free(c);
        PyErr_SetString(PyExc_ValueError,
                        "invalid code: lengths must be 1..12 with Kraft sum 1, coding 0, 1 or 2");
        goto done;
    }
    out = PyCapsule_New(c, CODE_CAPSULE, code_capsule_free);
    if (!out)
        PyMem_Free(c);
done:
    PyBuffer_Release(&lengths);
    return out;
}

PyDoc_STRVAR(encode_doc,
             "encode(code, values, out_blocks, out_keys) -> int\n\n"
             "Encode strictly increasing uint64 values into 1024-byte blocks written\n"
             "to out_blocks (writable); each block's last value goes to out_keys.\n"
             "Returns the number of blocks.  Raises ValueError for unsorted or\n"
             "duplicate values or too small outputs.");
static PyObject *py_encode(PyObject *self, PyObject *args) {
    PyObject *code;
    Py_buffer values, blocks, keys;
    if (!PyArg_ParseTuple(args, "Oy*w*w*", &code, &values, &blocks, &keys))
        return NULL;
    PyObject *res = NULL;
    const codec_code *c;
    if (ndx_get_code(code, &c) < 0)
        goto done;
    if (values.len % 8 || keys.len % 8 || check_blocks(&blocks) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "values and keys must be uint64 buffers");
        goto done;
    }
    size_t n = (size_t)values.len / 8, cap = (size_t)blocks.len / BLOCK_BYTES;
    if ((size_t)keys.len / 8 < cap) {
        PyErr_SetString(PyExc_ValueError, "out_keys needs one slot per output block");
        goto done;
    }
    long rc;
    if (n >= GIL_RELEASE_VALUES) {
        Py_BEGIN_ALLOW_THREADS rc = codec_encode(c, values.buf, n, blocks.buf, cap, keys.buf);
        Py_END_ALLOW_THREADS
    } else {
        rc = codec_encode(c, values.buf, n, blocks.buf, cap, keys.buf);
    }
    if (rc == CODEC_UNSORTED_INPUT)
        PyErr_SetString(PyExc_ValueError,
                        "values must be strictly increasing (sorted, without duplicates)");
    else if (rc < 0)
        PyErr_SetString(PyExc_ValueError, "output buffer too small");
    else
        res = PyLong_FromLong(rc);
done:
    PyBuffer_Release(&values);
    PyBuffer_Release(&blocks);
    PyBuffer_Release(&keys);
    return res;
}

PyDoc_STRVAR(block_counts_doc,
             "block_counts(blocks, out) -> None\n\n"
             "Write each block's header entry count (not yet verified) to out\n"
             "(writable uint16 buffer, one per block).");
static PyObject *py_block_counts(PyObject *self, PyObject *args) {
    Py_buffer blocks, out;
    if (!PyArg_ParseTuple(args, "y*w*", &blocks, &out))
        return NULL;
    PyObject *res = NULL;
    if (check_blocks(&blocks) < 0)
        goto done;
    size_t nb = (size_t)blocks.len / BLOCK_BYTES;
    if ((size_t)out.len < nb * 2) {
        PyErr_SetString(PyExc_ValueError, "out needs one uint16 per block");
        goto done;
    }
    const uint8_t *b = blocks.buf;
    uint16_t *o = out.buf;
    for (size_t i = 0; i < nb; i++)
        o[i] = (uint16_t)(b[i * BLOCK_BYTES + 4] | (b[i * BLOCK_BYTES + 5] << 8));
    res = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&blocks);
    PyBuffer_Release(&out);
    return res;
}

PyDoc_STRVAR(decode_doc,
             "decode(code, blocks, out) -> int\n\n"
             "Decode consecutive 1024-byte blocks into out (writable uint64 buffer)\n"
             "and return the number of values.  Checks every checksum, bound,\n"
             "ordering and padding; raises CorruptionError naming the first bad\n"
             "block, ValueError when out is too small.");
static PyObject *py_decode(PyObject *self, PyObject *args) {
    PyObject *code;
    Py_buffer blocks, out;
    if (!PyArg_ParseTuple(args, "Oy*w*", &code, &blocks, &out))
        return NULL;
    PyObject *res = NULL;
    const codec_code *c;
    if (ndx_get_code(code, &c) < 0 || check_blocks(&blocks) < 0)
        goto done;
    size_t nb = (size_t)blocks.len / BLOCK_BYTES, cap = (size_t)out.len / 8, total = 0;
    long rc = 0;
    size_t bad = 0;
    int release = nb * 128 >= GIL_RELEASE_VALUES;
    PyThreadState *ts = release ? PyEval_SaveThread() : NULL;
    for (size_t i = 0; i < nb; i++) {
        rc = codec_decode(c, (const uint8_t *)blocks.buf + i * BLOCK_BYTES,
                          (uint64_t *)out.buf + total, cap - total);
        if (rc < 0) {
            bad = i;
            break;
        }
        total += (size_t)rc;
    }
    if (ts)
        PyEval_RestoreThread(ts);
    if (rc == CODEC_BAD_COUNT && cap - total < 1 + BLOCK_PAYLOAD_BITS) {
        /* Could be a real bad count or just a short output: tell which. */
        long cnt = codec_block_count((const uint8_t *)blocks.buf + bad * BLOCK_BYTES);
        if (cnt > 0 && (size_t)cnt > cap - total) {
            PyErr_SetString(PyExc_ValueError, "out is too small for the decoded values");
            goto done;
        }
    }
    if (rc < 0)
        raise_block_error(rc, (Py_ssize_t)bad);
    else
        res = PyLong_FromSize_t(total);
done:
    PyBuffer_Release(&blocks);
    PyBuffer_Release(&out);
    return res;
}

PyDoc_STRVAR(probe_doc,
             "probe(code, block, q, p, k) -> list[int]\n\n"
             "Entries x of one block whose top p bits equal q's and with\n"
             "popcount(x ^ q) <= k, in increasing order.  Stops decoding past q's\n"
             "prefix.  Raises CorruptionError for a bad block.");
static PyObject *py_probe(PyObject *self, PyObject *args) {
    PyObject *code;
    Py_buffer block;
    unsigned long long q;
    int p, k;
    if (!PyArg_ParseTuple(args, "Oy*Kii", &code, &block, &q, &p, &k))
        return NULL;
    PyObject *res = NULL;
    const codec_code *c;
    if (ndx_get_code(code, &c) < 0)
        goto done;
    if (block.len != BLOCK_BYTES) {
        PyErr_Format(PyExc_ValueError, "a block is %d bytes, got %zd", BLOCK_BYTES, block.len);
        goto done;
    }
    if (p < 0 || p > 64 || k < 0 || k > 64) {
        PyErr_SetString(PyExc_ValueError, "p and k must be in 0..64");
        goto done;
    }
    uint64_t found[1 + BLOCK_PAYLOAD_BITS];
    long rc = codec_probe(c, block.buf, q, p, k, found, 1 + BLOCK_PAYLOAD_BITS);
    if (rc < 0) {
        raise_block_error(rc, 0);
        goto done;
    }
    res = PyList_New(rc);
    for (long i = 0; res && i < rc; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(found[i]);
        if (!v) {
            Py_CLEAR(res);
            break;
        }
        PyList_SET_ITEM(res, i, v);
    }
done:
    PyBuffer_Release(&block);
    return res;
}

PyDoc_STRVAR(probe_lanes_doc,
             "probe_lanes(codes, blocks, qs, ps, ks, verified, cap) -> list\n\n"
             "Probe n blocks side by side, as queries do (codec_probe_lanes): lane i\n"
             "probes block i of blocks (n x 1024 bytes) with codes[i], qs[i], ps[i],\n"
             "ks[i].  verified: skip the checksums (as for blocks a query checked\n"
             "before).  cap: matches a lane keeps.  Returns per lane the list of\n"
             "matches, or the text of its damage (or \"more than cap matches\").");
static PyObject *py_probe_lanes(PyObject *self, PyObject *args) {
    PyObject *codes, *qs, *ps, *ks;
    Py_buffer blocks;
    int verified;
    Py_ssize_t cap;
    if (!PyArg_ParseTuple(args, "Oy*OOOpn", &codes, &blocks, &qs, &ps, &ks, &verified, &cap))
        return NULL;
    PyObject *res = NULL;
    codec_lane *lanes = NULL;
    uint64_t *found = NULL;
    Py_ssize_t n = blocks.len / BLOCK_BYTES;
    if (blocks.len % BLOCK_BYTES || cap < 0 || cap > 1 + BLOCK_PAYLOAD_BITS || n > 1 << 20) {
        PyErr_SetString(PyExc_ValueError, "blocks must be whole 1024-byte blocks, cap 0..8081");
        goto done;
    }
    if (PySequence_Size(codes) != n || PySequence_Size(qs) != n || PySequence_Size(ps) != n ||
        PySequence_Size(ks) != n) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "one code, q, p and k per block");
        goto done;
    }
    lanes = PyMem_Calloc(n ? n : 1, sizeof *lanes);
    found = PyMem_Calloc(n * cap + 1, sizeof *found);
    if (!lanes || !found) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *c = PySequence_GetItem(codes, i), *q = PySequence_GetItem(qs, i),
                 *p = PySequence_GetItem(ps, i), *k = PySequence_GetItem(ks, i);
        int ok = c && q && p && k && ndx_get_code(c, &lanes[i].code) == 0;
        if (ok) {
            lanes[i].q = PyLong_AsUnsignedLongLong(q);
            lanes[i].p = PyLong_AsLong(p);
            lanes[i].k = PyLong_AsLong(k);
            ok = !PyErr_Occurred();
            if (ok && (lanes[i].p < 0 || lanes[i].p > 64 || lanes[i].k < 0 || lanes[i].k > 64)) {
                PyErr_SetString(PyExc_ValueError, "p and k must be in 0..64");
                ok = 0;
            }
        }
        Py_XDECREF(c);
        Py_XDECREF(q);
        Py_XDECREF(p);
        Py_XDECREF(k);
        if (!ok)
            goto done;
        lanes[i].block = (const uint8_t *)blocks.buf + i * BLOCK_BYTES;
        lanes[i].verified = verified;
        lanes[i].out = found + i * cap;
        lanes[i].cap = (size_t)cap;
    }
    codec_probe_lanes(lanes, (int)n);
    res = PyList_New(n);
    for (Py_ssize_t i = 0; res && i < n; i++) {
        PyObject *item;
        if (lanes[i].n < 0) {
            item = PyUnicode_FromString(lanes[i].n == CODEC_OUT_FULL ? "more than cap matches"
                                                                     : ndx_status_text(lanes[i].n));
        } else {
            item = PyList_New(lanes[i].n);
            for (long j = 0; item && j < lanes[i].n; j++) {
                PyObject *v = PyLong_FromUnsignedLongLong(lanes[i].out[j]);
                if (!v)
                    Py_CLEAR(item);
                else
                    PyList_SET_ITEM(item, j, v);
            }
        }
        if (!item)
            Py_CLEAR(res);
        else
            PyList_SET_ITEM(res, i, item);
    }
done:
    PyMem_Free(lanes);
    PyMem_Free(found);
    PyBuffer_Release(&blocks);
    return res;
}

PyDoc_STRVAR(crc32c_doc, "crc32c(data) -> int\n\nCRC-32C (Castagnoli) of a bytes-like object.");
static PyObject *py_crc32c(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t c;
    if (b.len >= 65536) {
        Py_BEGIN_ALLOW_THREADS c = crc32c(b.buf, (size_t)b.len);
        Py_END_ALLOW_THREADS
    } else {
        c = crc32c(b.buf, (size_t)b.len);
    }
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}

/* Pairs as three bytes objects: (q, fingerprint, distance), n 8-byte query
 * entries (ids or values), n uint64 fingerprints, n uint8 distances. */
PyObject *ndx_pairs_to_bytes(const void *q, const uint64_t *fp, const uint8_t *dist, size_t n) {
    PyObject *qb = PyBytes_FromStringAndSize((const char *)q, (Py_ssize_t)(n * 8));
    PyObject *fb = PyBytes_FromStringAndSize((const char *)fp, (Py_ssize_t)(n * 8));
    PyObject *db = PyBytes_FromStringAndSize((const char *)dist, (Py_ssize_t)n);
    PyObject *res = NULL;
    if (qb && fb && db)
        res = PyTuple_Pack(3, qb, fb, db);
    Py_XDECREF(qb);
    Py_XDECREF(fb);
    Py_XDECREF(db);
    return res;
}

int ndx_get_u64_buffer(PyObject *obj, Py_buffer *view, int writable, const char *what) {
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS
                                               : PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->len % 8) {
        PyErr_Format(PyExc_ValueError, "%s must be a uint64 buffer", what);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(permute_doc,
             "permute(values, runs, out) -> None\n\n"
             "out[i] = the permutation given by runs ((src_lo, dst_lo, length), covering\n"
             "64 bits) of values[i]; out may be values itself.  GIL released.");
static PyObject *py_permute(PyObject *self, PyObject *args) {
    PyObject *values, *runs, *out;
    if (!PyArg_ParseTuple(args, "OOO", &values, &runs, &out))
        return NULL;
    perm_runs r;
    if (ndx_parse_runs(runs, &r) < 0)
        return NULL;
    Py_buffer in, o;
    if (ndx_get_u64_buffer(values, &in, 0, "values") < 0)
        return NULL;
    if (ndx_get_u64_buffer(out, &o, 1, "out") < 0) {
        PyBuffer_Release(&in);
        return NULL;
    }
    PyObject *res = NULL;
    if (o.len < in.len) {
        PyErr_SetString(PyExc_ValueError, "out is shorter than values");
    } else {
        Py_BEGIN_ALLOW_THREADS permute_u64(&r, in.buf, o.buf, (size_t)in.len / 8);
        Py_END_ALLOW_THREADS
        res = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&in);
    PyBuffer_Release(&o);
    return res;
}

PyDoc_STRVAR(delta_histogram_doc,
             "delta_histogram(values, coding) -> list[int]\n\n"
             "For sorted uint64 values: how many neighbours' deltas (coding 1) or\n"
             "XORs (coding 0) have their leading 1-bit at each h in 0..63.");
static PyObject *py_delta_histogram(PyObject *self, PyObject *args) {
    PyObject *values;
    int coding;
    if (!PyArg_ParseTuple(args, "Oi", &values, &coding))
        return NULL;
    Py_buffer v;
    if (ndx_get_u64_buffer(values, &v, 0, "values") < 0)
        return NULL;
    uint64_t counts[64] = {0};
    Py_BEGIN_ALLOW_THREADS delta_histogram(v.buf, (size_t)v.len / 8, coding, counts);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    PyObject *res = PyList_New(64);
    for (int h = 0; res && h < 64; h++) {
        PyObject *c = PyLong_FromUnsignedLongLong(counts[h]);
        if (!c) {
            Py_CLEAR(res);
            break;
        }
        PyList_SET_ITEM(res, h, c);
    }
    return res;
}


PyDoc_STRVAR(merge_unique_doc,
             "merge_unique(runs, hide, out) -> int\n\n"
             "Merge sorted, strictly increasing uint64 buffers (at most 64) into out,\n"
             "dropping repeats and every value of the sorted buffer hide; return the\n"
             "count written.  out must hold the sum of the lengths.  GIL released.");
static PyObject *py_merge_unique(PyObject *self, PyObject *args) {
    PyObject *runs;
    Py_buffer hide, out;
    if (!PyArg_ParseTuple(args, "Oy*w*", &runs, &hide, &out))
        return NULL;
    PyObject *res = NULL, *fast = PySequence_Fast(runs, "runs must be a sequence");
    Py_buffer views[64];
    int nv = 0;
    if (!fast)
        goto done;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(fast);
    if (k > 64 || hide.len % 8 || out.len % 8) {
        PyErr_SetString(PyExc_ValueError, "at most 64 runs of uint64; hide and out uint64");
        goto done;
    }
    const uint64_t *ptrs[64];
    size_t lens[64], total = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        if (ndx_get_u64_buffer(PySequence_Fast_GET_ITEM(fast, i), &views[nv], 0, "run") < 0)
            goto done;
        ptrs[i] = views[nv].buf;
        lens[i] = (size_t)views[nv].len / 8;
        total += lens[i];
        nv++;
    }
    if ((size_t)out.len / 8 < total) {
        PyErr_SetString(PyExc_ValueError, "out is smaller than the runs together");
        goto done;
    }
    size_t m;
    Py_BEGIN_ALLOW_THREADS m = merge_unique_u64(ptrs, lens, (int)k, hide.buf, (size_t)hide.len / 8,
                                                out.buf);
    Py_END_ALLOW_THREADS if (m == (size_t)-1) PyErr_NoMemory();
    else res = PyLong_FromSize_t(m);
done:
    for (int i = 0; i < nv; i++)
        PyBuffer_Release(&views[i]);
    Py_XDECREF(fast);
    PyBuffer_Release(&hide);
    PyBuffer_Release(&out);
    return res;
}

PyDoc_STRVAR(raw_encode_doc,
             "raw_encode(values, out_blocks, out_keys, packed) -> int\n\n"
             "Encode strictly increasing uint64 values as raw blocks (FORMAT.md 5.3),\n"
             "packed ones where they hold more if packed (format-4 files); return the\n"
             "number of blocks (at most one per 127 values, rounded up).  GIL released.");
static PyObject *py_raw_encode(PyObject *self, PyObject *args) {
    Py_buffer values, blocks, keys;
    int packed;
    if (!PyArg_ParseTuple(args, "y*w*w*p", &values, &blocks, &keys, &packed))
        return NULL;
    PyObject *res = NULL;
    if (values.len % 8 || keys.len % 8 || check_blocks(&blocks) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "values and keys must be uint64 buffers");
        goto done;
    }
    size_t cap = (size_t)blocks.len / BLOCK_BYTES;
    if ((size_t)keys.len / 8 < cap) {
        PyErr_SetString(PyExc_ValueError, "out_keys needs one slot per output block");
        goto done;
    }
    long rc;
    Py_BEGIN_ALLOW_THREADS rc = raw_encode(values.buf, (size_t)values.len / 8, packed, blocks.buf, cap,
                                           keys.buf);
    Py_END_ALLOW_THREADS if (rc == CODEC_UNSORTED_INPUT) PyErr_SetString(
        PyExc_ValueError, "values must be strictly increasing (sorted, without duplicates)");
    else if (rc < 0) PyErr_SetString(PyExc_ValueError, "output buffer too small");
    else res = PyLong_FromLong(rc);
done:
    PyBuffer_Release(&values);
    PyBuffer_Release(&blocks);
    PyBuffer_Release(&keys);
    return res;
}

PyDoc_STRVAR(raw_decode_doc,
             "raw_decode(blocks, out) -> int\n\n"
             "Decode consecutive raw blocks into out (uint64, room for 1024 per block),\n"
             "checking each checksum, count, order and padding, and that values\n"
             "increase across blocks; return the count.  Raises CorruptionError naming\n"
             "the first bad block.  GIL released.");
static PyObject *py_raw_decode(PyObject *self, PyObject *args) {
    Py_buffer blocks, out;
    if (!PyArg_ParseTuple(args, "y*w*", &blocks, &out))
        return NULL;
    PyObject *res = NULL;
    if (check_blocks(&blocks) < 0 || out.len % 8)
        goto done;
    size_t nb = (size_t)blocks.len / BLOCK_BYTES, cap = (size_t)out.len / 8, m = 0;
    long rc = 0;
    Py_ssize_t bad = -1;
    uint64_t *o = out.buf;
    Py_BEGIN_ALLOW_THREADS for (size_t b = 0; b < nb; b++) {
        if (cap - m < RAW_BLOCK_MAX_VALUES) {
            rc = CODEC_OVERRUN;
            bad = (Py_ssize_t)b;
            break;
        }
        rc = raw_decode((const uint8_t *)blocks.buf + b * BLOCK_BYTES, o + m);
        if (rc < 0 || (m && o[m] <= o[m - 1])) {
            rc = rc < 0 ? rc : CODEC_NOT_SORTED;
            bad = (Py_ssize_t)b;
            break;
        }
        m += (size_t)rc;
    }
    Py_END_ALLOW_THREADS if (bad >= 0) raise_block_error(rc, bad);
    else res = PyLong_FromSize_t(m);
done:
    PyBuffer_Release(&blocks);
    PyBuffer_Release(&out);
    return res;
}

PyMethodDef codec_methods[] = {
    {"permute", py_permute, METH_VARARGS, permute_doc},
    {"delta_histogram", py_delta_histogram, METH_VARARGS, delta_histogram_doc},
    {"compile_code", py_compile_code, METH_VARARGS, compile_code_doc},
    {"encode", py_encode, METH_VARARGS, encode_doc},
    {"block_counts", py_block_counts, METH_VARARGS, block_counts_doc},
    {"decode", py_decode, METH_VARARGS, decode_doc},
    {"probe", py_probe, METH_VARARGS, probe_doc},
    {"probe_lanes", py_probe_lanes, METH_VARARGS, probe_lanes_doc},
    {"crc32c", py_crc32c, METH_O, crc32c_doc},
    {"merge_unique", py_merge_unique, METH_VARARGS, merge_unique_doc},
    {"raw_encode", py_raw_encode, METH_VARARGS, raw_encode_doc},
    {"raw_decode", py_raw_decode, METH_VARARGS, raw_decode_doc},
    {NULL, NULL, 0, NULL},
};

int codec_module_init(PyObject *m) {
    crc32c_init();
    PyObject *errors = PyImport_ImportModule("ndindex.errors");
    if (!errors)
        return -1;
    CorruptionError = PyObject_GetAttrString(errors, "CorruptionError");
    Py_DECREF(errors);
    if (!CorruptionError)
        return -1;
    if (PyModule_AddIntConstant(m, "BLOCK_BYTES", BLOCK_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "BLOCK_HEADER_BYTES", BLOCK_HEADER_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "CODE_MAX_BITS", CODE_MAX_BITS) < 0 ||
        PyModule_AddIntConstant(m, "BLOCK_MIN_ENTRIES", BLOCK_MIN_ENTRIES) < 0 ||
        PyModule_AddIntConstant(m, "COMPILED_CODE_BYTES", (long)sizeof(codec_code)) < 0)
        return -1;
    return 0;
}
