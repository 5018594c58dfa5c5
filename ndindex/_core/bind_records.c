/* Python bindings of the record kernels (records.c) and the record chunk parser. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "bindings.h"
#include "crc32c.h"
#include "records.h"

#define DB "chunks"
#define CHUNK_HEAD_BYTES 24
#define DIR_ENTRY_BYTES 18
#define KIND_RECORDS 3
#define FLAG_FIRST 1
#define MAX_RAW_BLOCK (1u << 24)

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static PyObject *bad(const char *what, const char *key, Py_ssize_t klen, Py_ssize_t offset) {
    return ndx_raise_corruption_at(PyUnicode_FromString(what), DB, key, klen, offset);
}

static PyObject *record_tuple(const rec_view *r) {
    return Py_BuildValue("(y#By#)", (const char *)r->key, (Py_ssize_t)r->klen, r->flag,
                         (const char *)r->val, (Py_ssize_t)r->vlen);
}

/* Check a raw sub-block (and its first key, when given); NULL with CorruptionError. */
static int check_block(const uint8_t *buf, size_t n, PyObject *first) {
    size_t at = 0;
    long count = rec_check(buf, n, &at);
    if (count < 0) {
        bad(count == -1 ? "record sub-block: a record does not fit or has a bad flag"
                        : "record sub-block: keys do not increase", NULL, 0, (Py_ssize_t)at);
        return -1;
    }
    if (first != Py_None) {
        size_t pos = 0;
        rec_view r;
        if (count == 0 || rec_next(buf, n, &pos, &r) < 0 ||
            (size_t)PyBytes_GET_SIZE(first) != r.klen ||
            memcmp(PyBytes_AS_STRING(first), r.key, r.klen) != 0) {
            bad("record sub-block: first key differs from the directory", NULL, 0, -1);
            return -1;
        }
    }
    return 0;
}

PyDoc_STRVAR(records_unpack_doc,
             "records_unpack(raw) -> list of (key, flag, value)\n\n"
             "Every record of a raw sub-block, checked (well formed, flags 0/1, keys\n"
             "strictly increasing); CorruptionError otherwise.");

static PyObject *py_records_unpack(PyObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*:records_unpack", &b)) return NULL;
    PyObject *out = NULL;
    if (check_block(b.buf, (size_t)b.len, Py_None) < 0) goto done;
    out = PyList_New(0);
    size_t pos = 0;
    rec_view r;
    while (out && pos < (size_t)b.len) {
        rec_next(b.buf, (size_t)b.len, &pos, &r);
        PyObject *t = record_tuple(&r);
        if (!t || PyList_Append(out, t) < 0) Py_CLEAR(out);
        Py_XDECREF(t);
    }
done:
    PyBuffer_Release(&b);
    return out;
}

PyDoc_STRVAR(records_find_doc,
             "records_find(raw, prefix, first_key=None) -> list of (key, flag, value)\n\n"
             "The records of a raw sub-block whose key begins with prefix, after checking\n"
             "the whole block (and that its first key is first_key).");

static PyObject *py_records_find(PyObject *self, PyObject *args) {
    Py_buffer b, p;
    PyObject *first = Py_None;
    if (!PyArg_ParseTuple(args, "y*y*|O:records_find", &b, &p, &first)) return NULL;
    PyObject *out = NULL;
    if (first != Py_None && !PyBytes_Check(first)) {
        PyErr_SetString(PyExc_TypeError, "first_key must be bytes or None");
        goto done;
    }
    if (check_block(b.buf, (size_t)b.len, first) < 0) goto done;
    out = PyList_New(0);
    size_t pos = 0, plen = (size_t)p.len;
    rec_view r;
    while (out && pos < (size_t)b.len) {
        rec_next(b.buf, (size_t)b.len, &pos, &r);
        int c = memcmp(r.key, p.buf, r.klen < plen ? r.klen : plen);
        if (c > 0) break;
        if (c == 0 && r.klen >= plen) {
            PyObject *t = record_tuple(&r);
            if (!t || PyList_Append(out, t) < 0) Py_CLEAR(out);
            Py_XDECREF(t);
        }
    }
done:
    PyBuffer_Release(&b);
    PyBuffer_Release(&p);
    return out;
}

PyDoc_STRVAR(records_offsets_doc,
             "records_offsets(raw) -> bytes\n\n"
             "The start offset of every record of a checked raw stream, as native int64.");

static PyObject *py_records_offsets(PyObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*:records_offsets", &b)) return NULL;
    PyObject *res = NULL;
    size_t at = 0;
    long count = rec_check(b.buf, (size_t)b.len, &at);
    if (count < 0) {
        bad("record stream malformed or out of order", NULL, 0, (Py_ssize_t)at);
        goto done;
    }
    res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)count * 8);
    if (!res) goto done;
    int64_t *o = (int64_t *)PyBytes_AS_STRING(res);
    size_t pos = 0;
    rec_view r;
    for (long i = 0; i < count; i++) {
        o[i] = (int64_t)pos;
        rec_next(b.buf, (size_t)b.len, &pos, &r);
    }
done:
    PyBuffer_Release(&b);
    return res;
}

PyDoc_STRVAR(records_prefix_doc,
             "records_prefix(raw, offsets, prefix) -> list of (key, flag, value)\n\n"
             "The records of a sorted raw stream whose key begins with prefix, found by\n"
             "binary search over offsets (from records_offsets).");

static PyObject *py_records_prefix(PyObject *self, PyObject *args) {
    Py_buffer b, o, p;
    if (!PyArg_ParseTuple(args, "y*y*y*:records_prefix", &b, &o, &p)) return NULL;
    PyObject *out = PyList_New(0);
    const int64_t *off = o.buf;
    Py_ssize_t n = o.len / 8, lo = 0, hi = n;
    const uint8_t *buf = b.buf;
    size_t len = (size_t)b.len, plen = (size_t)p.len;
    rec_view r;
    while (lo < hi) {  /* the first record whose key is >= prefix */
        Py_ssize_t mid = lo + (hi - lo) / 2;
        size_t pos = (size_t)off[mid];
        if (off[mid] < 0 || rec_next(buf, len, &pos, &r) < 0) {
            Py_CLEAR(out);
            bad("record offsets do not match the stream", NULL, 0, -1);
            goto done;
        }
        if (rec_cmp(r.key, r.klen, p.buf, plen) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (Py_ssize_t i = lo; out && i < n; i++) {
        size_t pos = (size_t)off[i];
        if (off[i] < 0 || rec_next(buf, len, &pos, &r) < 0) {
            Py_CLEAR(out);
            bad("record offsets do not match the stream", NULL, 0, -1);
            break;
        }
        if (r.klen < plen || memcmp(r.key, p.buf, plen) != 0) break;
        PyObject *t = record_tuple(&r);
        if (!t || PyList_Append(out, t) < 0) Py_CLEAR(out);
        Py_XDECREF(t);
    }
done:
    PyBuffer_Release(&b);
    PyBuffer_Release(&o);
    PyBuffer_Release(&p);
    return out;
}

PyDoc_STRVAR(records_pack_doc,
             "records_pack(records) -> bytes\n\n"
             "Pack (key, flag, value) records, in the order given, as a raw record stream.");

static PyObject *py_records_pack(PyObject *self, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "records must be a sequence");
    if (!seq) return NULL;
    rec_buf out = {0};
    PyObject *res = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        const char *k, *v;
        Py_ssize_t kl, vl;
        int flag;
        if (!PyArg_ParseTuple(item, "y#iy#:records_pack", &k, &kl, &flag, &v, &vl)) goto done;
        if (kl > 0xFFFF || vl > 0xFFFFFFFFLL || flag < 0 || flag > 1) {
            PyErr_SetString(PyExc_ValueError, "record key, value or flag out of range");
            goto done;
        }
        if (rec_buf_put(&out, (const uint8_t *)k, (size_t)kl, (uint8_t)flag, (const uint8_t *)v,
                        (size_t)vl) < 0) {
            PyErr_NoMemory();
            goto done;
        }
    }
    res = PyBytes_FromStringAndSize((const char *)out.data, (Py_ssize_t)out.len);
done:
    rec_buf_free(&out);
    Py_DECREF(seq);
    return res;
}

PyDoc_STRVAR(pair_records_pack_doc,
             "pair_records_pack(hi, lo, flags) -> bytes\n\n"
             "Records keyed by 16 bytes (u64 BE hi, u64 BE lo), with empty values: the\n"
             "lookup-key space.  hi, lo: uint64 arrays sorted by (hi, lo), distinct;\n"
             "flags: one byte per record.");

static PyObject *py_pair_records_pack(PyObject *self, PyObject *args) {
    PyObject *hobj, *lobj;
    Py_buffer h, l, f;
    if (!PyArg_ParseTuple(args, "OOy*:pair_records_pack", &hobj, &lobj, &f)) return NULL;
    if (ndx_get_u64_buffer(hobj, &h, 0, "hi") < 0) {
        PyBuffer_Release(&f);
        return NULL;
    }
    if (ndx_get_u64_buffer(lobj, &l, 0, "lo") < 0) {
        PyBuffer_Release(&h);
        PyBuffer_Release(&f);
        return NULL;
    }
    PyObject *res = NULL;
    size_t n = (size_t)h.len / 8;
    if ((size_t)l.len / 8 != n || (size_t)f.len != n) {
        PyErr_SetString(PyExc_ValueError, "hi, lo and flags differ in length");
        goto done;
    }
    res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * (REC_HEAD_BYTES + 16)));
    if (!res) goto done;
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(res);
    const uint64_t *hv = h.buf, *lv = l.buf;
    const uint8_t *fv = f.buf;
    for (size_t i = 0; i < n; i++, o += REC_HEAD_BYTES + 16) {
        o[0] = 16;
        o[1] = 0;
        o[2] = fv[i] ? 1 : 0;
        memset(o + 3, 0, 4);
        for (int j = 0; j < 8; j++) {
            o[REC_HEAD_BYTES + j] = (uint8_t)(hv[i] >> (56 - 8 * j));
            o[REC_HEAD_BYTES + 8 + j] = (uint8_t)(lv[i] >> (56 - 8 * j));
        }
    }
done:
    PyBuffer_Release(&h);
    PyBuffer_Release(&l);
    PyBuffer_Release(&f);
    return res;
}

PyDoc_STRVAR(records_merge_doc,
             "records_merge(inputs, above, upto, drop_deletes) -> (bytes, count)\n\n"
             "Merge raw record streams given newest first (the first holding a key decides\n"
             "it), keeping keys > above and <= upto (None: unbounded), dropping deletions\n"
             "when drop_deletes.  CorruptionError names the input that is malformed.");

static PyObject *py_records_merge(PyObject *self, PyObject *args) {
    PyObject *inputs, *above_obj, *upto_obj;
    int drop;
    if (!PyArg_ParseTuple(args, "OOOp:records_merge", &inputs, &above_obj, &upto_obj, &drop))
        return NULL;
    PyObject *seq = PySequence_Fast(inputs, "inputs must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    Py_buffer *views = PyMem_Calloc(k ? (size_t)k : 1, sizeof *views);
    const uint8_t **bufs = PyMem_Calloc(k ? (size_t)k : 1, sizeof *bufs);
    size_t *lens = PyMem_Calloc(k ? (size_t)k : 1, sizeof *lens);
    Py_buffer above = {0}, upto = {0};
    int have_above = 0, have_upto = 0;
    Py_ssize_t got = 0;
    PyObject *res = NULL;
    rec_buf out = {0};
    if (!views || !bufs || !lens) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < k; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &views[got], PyBUF_SIMPLE) < 0)
            goto done;
        bufs[got] = views[got].buf;
        lens[got] = (size_t)views[got].len;
    }
    if (above_obj != Py_None) {
        if (PyObject_GetBuffer(above_obj, &above, PyBUF_SIMPLE) < 0) goto done;
        have_above = 1;
    }
    if (upto_obj != Py_None) {
        if (PyObject_GetBuffer(upto_obj, &upto, PyBUF_SIMPLE) < 0) goto done;
        have_upto = 1;
    }
    int bad_input = -1;
    long n;
    Py_BEGIN_ALLOW_THREADS
    n = rec_merge(bufs, lens, (int)k, above.buf, (size_t)above.len, have_above, upto.buf,
                  (size_t)upto.len, have_upto, drop, &out, &bad_input);
    Py_END_ALLOW_THREADS
    if (n == -2) {
        PyErr_NoMemory();
        goto done;
    }
    if (n < 0) {
        PyObject *msg = PyUnicode_FromFormat("record merge: input %d is malformed or out of order",
                                             bad_input);
        ndx_raise_corruption(msg, DB, -1);
        goto done;
    }
    res = Py_BuildValue("(y#l)", (const char *)out.data, (Py_ssize_t)out.len, n);
done:
    rec_buf_free(&out);
    if (have_above) PyBuffer_Release(&above);
    if (have_upto) PyBuffer_Release(&upto);
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(bufs);
    PyMem_Free(lens);
    Py_DECREF(seq);
    return res;
}

PyDoc_STRVAR(records_split_doc,
             "records_split(raw, block_bytes) -> list of (start, end, first_key, last_key, count)\n\n"
             "Cut a raw record stream at record boundaries into sub-blocks of at least\n"
             "block_bytes (the last may be shorter).  The stream must be well formed.");

static PyObject *py_records_split(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t block;
    if (!PyArg_ParseTuple(args, "y*n:records_split", &b, &block)) return NULL;
    PyObject *out = PyList_New(0);
    size_t pos = 0, start = 0, n = (size_t)b.len;
    Py_ssize_t count = 0;
    rec_view first = {0}, r = {0};
    while (out && pos < n) {
        size_t at = pos;
        if (rec_next(b.buf, n, &pos, &r) < 0) {
            Py_CLEAR(out);
            bad("record stream: a record does not fit", NULL, 0, (Py_ssize_t)at);
            break;
        }
        if (at == start) first = r;
        count++;
        if (pos - start >= (size_t)block || pos == n) {
            PyObject *t = Py_BuildValue("(nny#y#n)", (Py_ssize_t)start, (Py_ssize_t)pos,
                                        (const char *)first.key, (Py_ssize_t)first.klen,
                                        (const char *)r.key, (Py_ssize_t)r.klen, count);
            if (!t || PyList_Append(out, t) < 0) Py_CLEAR(out);
            Py_XDECREF(t);
            start = pos;
            count = 0;
        }
    }
    PyBuffer_Release(&b);
    return out;
}

PyDoc_STRVAR(record_filter_doc,
             "record_filter(raw, mode, nbytes) -> bytes\n\n"
             "The group filter (FORMAT.md 7.9) of nbytes bytes over the records of a raw\n"
             "stream: mode 0 groups by the first 8 key bytes, mode 1 by all but the last 8.");

static PyObject *py_record_filter(PyObject *self, PyObject *args) {
    Py_buffer b;
    int mode;
    Py_ssize_t nbytes;
    if (!PyArg_ParseTuple(args, "y*in:record_filter", &b, &mode, &nbytes)) return NULL;
    PyObject *res = NULL;
    if (nbytes < 1 || nbytes > 0xFFFF || mode < 0 || mode > 1) {
        PyErr_SetString(PyExc_ValueError, "record_filter: nbytes must be 1..65535, mode 0 or 1");
        goto done;
    }
    res = PyBytes_FromStringAndSize(NULL, nbytes);
    if (!res) goto done;
    uint8_t *f = (uint8_t *)PyBytes_AS_STRING(res);
    memset(f, 0, (size_t)nbytes);
    size_t pos = 0, n = (size_t)b.len;
    rec_view r;
    while (pos < n) {
        if (rec_next(b.buf, n, &pos, &r) < 0) {
            Py_CLEAR(res);
            bad("record stream: a record does not fit", NULL, 0, (Py_ssize_t)pos);
            break;
        }
        const uint8_t *g;
        size_t gl;
        rec_group(r.key, r.klen, mode, &g, &gl);
        rec_filter_add(f, (size_t)nbytes, rec_group_hash(g, gl));
    }
done:
    PyBuffer_Release(&b);
    return res;
}

/* A record chunk's checked header (FORMAT.md 7.9, [F16]). */
typedef struct {
    uint8_t flags;
    uint32_t records;
    uint16_t nblocks;
    const uint8_t *fence;
    size_t fence_len;
    const uint8_t *dir;  /* the first directory entry */
    const uint8_t *filter;
    size_t filter_len;
} chunk_info;

/* Check a chunk's header and directory against its key: 0, or -1 with *why
 * (and *at, an offset into the value, or -1). */
static int chunk_parse(const uint8_t *key, size_t klen, const uint8_t *v, size_t n,
                       chunk_info *ci, const char **why, Py_ssize_t *at) {
    *at = -1;
    if (klen < 5 || n < CHUNK_HEAD_BYTES) {
        *why = "record chunk too short";
        return -1;
    }
    uint8_t kind = v[4];
    ci->flags = v[5];
    ci->nblocks = le16(v + 6);
    ci->records = le32(v + 12);
    uint32_t run_id = le32(v + 8), dir_bytes = le32(v + 16);
    ci->fence_len = le16(v + 20);
    ci->filter_len = le16(v + 22);
    size_t head_end = CHUNK_HEAD_BYTES + ci->fence_len + (size_t)dir_bytes + ci->filter_len;
    if (kind != KIND_RECORDS || ci->nblocks < 1 || head_end > n) {
        *why = "record chunk header impossible";
        return -1;
    }
    if (crc32c_extend(crc32c(key, klen), v + 4, head_end - 4) != le32(v)) {
        *why = "record chunk checksum mismatch";
        return -1;
    }
    uint32_t key_run = ((uint32_t)key[1] << 24) | ((uint32_t)key[2] << 16) |
                       ((uint32_t)key[3] << 8) | (uint32_t)key[4];
    if ((ci->flags & ~3) || run_id != key_run || ((ci->flags & FLAG_FIRST) && ci->fence_len)) {
        *why = "record chunk header fields impossible";
        return -1;
    }
    ci->fence = v + CHUNK_HEAD_BYTES;
    ci->dir = ci->fence + ci->fence_len;
    size_t pos = CHUNK_HEAD_BYTES + ci->fence_len, dir_end = pos + dir_bytes, expect = head_end;
    ci->filter = v + dir_end;
    const uint8_t *prev = NULL;
    size_t prev_len = 0;
    for (uint16_t i = 0; i < ci->nblocks; i++) {
        *at = (Py_ssize_t)pos;
        if (pos > dir_end || dir_end - pos < DIR_ENTRY_BYTES) {
            *why = "record directory runs past the header";
            return -1;
        }
        uint32_t off = le32(v + pos), clen = le32(v + pos + 4), rlen = le32(v + pos + 8);
        uint16_t flen = le16(v + pos + 16);
        pos += DIR_ENTRY_BYTES;
        if (flen > dir_end - pos || off != expect || clen > n - off || rlen > MAX_RAW_BLOCK ||
            clen > rlen || clen == 0) {
            *why = "record directory entry impossible";
            return -1;
        }
        if (prev ? rec_cmp(prev, prev_len, v + pos, flen) >= 0
                 : (!(ci->flags & FLAG_FIRST) &&
                    rec_cmp(v + pos, flen, ci->fence, ci->fence_len) <= 0)) {
            *why = "record directory keys out of order";
            return -1;
        }
        prev = v + pos;
        prev_len = flen;
        pos += flen;
        expect = off + clen;
    }
    *at = -1;
    if (pos != dir_end || expect != n || rec_cmp(prev, prev_len, key + 5, klen - 5) > 0) {
        *why = "record directory does not cover the chunk";
        return -1;
    }
    return 0;
}

/* Directory entry i (the chunk was checked): its fields and first key. */
static const uint8_t *dir_entry(const chunk_info *ci, uint16_t i, const uint8_t **first,
                                size_t *first_len) {
    const uint8_t *e = ci->dir;
    for (uint16_t j = 0; j < i; j++) e += DIR_ENTRY_BYTES + le16(e + 16);
    *first = e + DIR_ENTRY_BYTES;
    *first_len = le16(e + 16);
    return e;
}

static int filter_hit(const chunk_info *ci, const uint8_t *g, size_t glen) {
    return !ci->filter_len || rec_filter_has(ci->filter, ci->filter_len, rec_group_hash(g, glen));
}

PyDoc_STRVAR(record_chunk_doc,
             "record_chunk(key, value, group=None) -> (flags, records, fence, blocks, hit)\n\n"
             "Check a record chunk's header, directory and filter against its LMDB key\n"
             "(FORMAT.md 7.9) and return its flags, record count, low fence (None in a\n"
             "run's first chunk) and sub-blocks as (offset, stored_len, raw_len, crc,\n"
             "first_key).  With a group: only the sub-blocks that may hold keys beginning\n"
             "with it, and hit=False (no sub-blocks) when the filter rules it out.");

static PyObject *py_record_chunk(PyObject *self, PyObject *args) {
    Py_buffer kb, vb, gb = {0};
    PyObject *group_obj = Py_None;
    if (!PyArg_ParseTuple(args, "y*y*|O:record_chunk", &kb, &vb, &group_obj)) return NULL;
    int have_group = 0;
    PyObject *res = NULL, *blocks = NULL, *fence = NULL;
    chunk_info ci;
    const char *why;
    Py_ssize_t at;
    if (group_obj != Py_None) {
        if (PyObject_GetBuffer(group_obj, &gb, PyBUF_SIMPLE) < 0) goto done;
        have_group = 1;
    }
    if (chunk_parse(kb.buf, (size_t)kb.len, vb.buf, (size_t)vb.len, &ci, &why, &at) < 0) {
        bad(why, kb.buf, kb.len, at);
        goto done;
    }
    int hit = 1;
    uint16_t lo = 0, hi = ci.nblocks;
    if (have_group) {
        const uint8_t *g = gb.buf, *first;
        size_t glen = (size_t)gb.len, flen;
        hit = filter_hit(&ci, g, glen);
        if (!hit) {
            hi = 0;
        } else {
            /* Sub-blocks that may hold keys beginning with g: from the last whose
             * first key is <= g to the last whose first key begins with g. */
            lo = 0;
            while (lo + 1 < ci.nblocks) {
                dir_entry(&ci, lo + 1, &first, &flen);
                if (rec_cmp(first, flen, g, glen) > 0) break;
                lo++;
            }
            hi = lo + 1;
            while (hi < ci.nblocks) {
                dir_entry(&ci, hi, &first, &flen);
                if (flen < glen || memcmp(first, g, glen) != 0) break;
                hi++;
            }
        }
    }
    blocks = PyList_New(0);
    for (uint16_t i = lo; blocks && i < hi; i++) {
        const uint8_t *first;
        size_t flen;
        const uint8_t *e = dir_entry(&ci, i, &first, &flen);
        PyObject *t = Py_BuildValue("(kkkky#)", (unsigned long)le32(e), (unsigned long)le32(e + 4),
                                    (unsigned long)le32(e + 8), (unsigned long)le32(e + 12),
                                    (const char *)first, (Py_ssize_t)flen);
        if (!t || PyList_Append(blocks, t) < 0) Py_CLEAR(blocks);
        Py_XDECREF(t);
    }
    if (!blocks) goto done;
    if (ci.flags & FLAG_FIRST) {
        fence = Py_None;
        Py_INCREF(fence);
    } else {
        fence = PyBytes_FromStringAndSize((const char *)ci.fence, (Py_ssize_t)ci.fence_len);
        if (!fence) goto done;
    }
    res = Py_BuildValue("(BkOOO)", ci.flags, (unsigned long)ci.records, fence, blocks,
                        hit ? Py_True : Py_False);
done:
    Py_XDECREF(blocks);
    Py_XDECREF(fence);
    if (have_group) PyBuffer_Release(&gb);
    PyBuffer_Release(&kb);
    PyBuffer_Release(&vb);
    return res;
}

PyDoc_STRVAR(record_probe_doc,
             "record_probe(file, psize, npages, tree, run_prefix, groups, cursor=None)\n"
             "    -> list of (i, key, offset, length)\n\n"
             "Look up many groups in one record run: for each group i, seek its first\n"
             "chunk in the chunks tree, check the chunk ([F16]) and that the tree routed\n"
             "to the right chunk (its low fence is below the group, or at most the run's\n"
             "merge cursor), and report the chunk when its filter may hold the group or\n"
             "its separator begins with the group (the group may go on in the next\n"
             "chunk).  Groups the filters rule out cost no sub-block read.");

static PyObject *py_record_probe(PyObject *self, PyObject *args) {
    Py_buffer buf, pre;
    unsigned long psize;
    unsigned long long npages;
    PyObject *tree, *groups, *cursor_obj = Py_None;
    if (!PyArg_ParseTuple(args, "y*kKOy*O|O:record_probe", &buf, &psize, &npages, &tree, &pre,
                          &groups, &cursor_obj))
        return NULL;
    PyObject *res = NULL, *seq = NULL;
    uint8_t *seek = NULL;
    mdbp_map map;
    mdbp_db db;
    if (ndx_get_map(&buf, psize, npages, &map) < 0 || ndx_tree_of(tree, &db) < 0) goto done;
    if (cursor_obj != Py_None && !PyBytes_Check(cursor_obj)) {
        PyErr_SetString(PyExc_TypeError, "cursor must be bytes or None");
        goto done;
    }
    seq = PySequence_Fast(groups, "groups must be a sequence");
    if (!seq) goto done;
    res = PyList_New(0);
    Py_ssize_t ng = PySequence_Fast_GET_SIZE(seq);
    size_t plen = (size_t)pre.len;
    for (Py_ssize_t i = 0; res && i < ng; i++) {
        PyObject *gobj = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyBytes_Check(gobj)) {
            PyErr_SetString(PyExc_TypeError, "groups must be bytes");
            Py_CLEAR(res);
            break;
        }
        const uint8_t *g = (const uint8_t *)PyBytes_AS_STRING(gobj);
        size_t glen = (size_t)PyBytes_GET_SIZE(gobj);
        uint8_t *grown = PyMem_Realloc(seek, plen + glen + 1);
        if (!grown) {
            PyErr_NoMemory();
            Py_CLEAR(res);
            break;
        }
        seek = grown;
        memcpy(seek, pre.buf, plen);
        memcpy(seek + plen, g, glen);
        mdbp_cursor c;
        mdbp_error e;
        int rc = mdbp_seek(&map, &db, seek, plen + glen, 0, &c, &e);
        if (rc == MDBP_CORRUPT) {
            Py_CLEAR(res);
            ndx_raise_lmdb(&e);
            break;
        }
        if (rc != MDBP_FOUND) continue;
        const uint8_t *k, *v;
        size_t kl, vl;
        unsigned vflags;
        mdbp_key(&c, &k, &kl);
        if (kl < plen || memcmp(k, pre.buf, plen) != 0) continue;  /* past the run */
        if (mdbp_value(&c, &v, &vl, &vflags, &e) < 0) {
            Py_CLEAR(res);
            ndx_raise_lmdb(&e);
            break;
        }
        chunk_info ci;
        const char *why;
        Py_ssize_t at;
        if (chunk_parse(k, kl, v, vl, &ci, &why, &at) < 0) {
            Py_CLEAR(res);
            bad(why, (const char *)k, (Py_ssize_t)kl, at);
            break;
        }
        /* [F13]: the chunk found must be the one that would hold the group. */
        if (!(ci.flags & FLAG_FIRST) && rec_cmp(ci.fence, ci.fence_len, g, glen) >= 0 &&
            !(cursor_obj != Py_None &&
              rec_cmp(ci.fence, ci.fence_len, (const uint8_t *)PyBytes_AS_STRING(cursor_obj),
                      (size_t)PyBytes_GET_SIZE(cursor_obj)) <= 0)) {
            Py_CLEAR(res);
            bad("record chunk fences do not match its neighbours", (const char *)k,
                (Py_ssize_t)kl, -1);
            break;
        }
        int goes_on = kl - 5 >= glen && memcmp(k + 5, g, glen) == 0;
        if (!filter_hit(&ci, g, glen) && !goes_on) continue;
        PyObject *t = Py_BuildValue("(ny#nn)", i, (const char *)k, (Py_ssize_t)kl,
                                    (Py_ssize_t)(v - map.base), (Py_ssize_t)vl);
        if (!t || PyList_Append(res, t) < 0) Py_CLEAR(res);
        Py_XDECREF(t);
    }
done:
    PyMem_Free(seek);
    Py_XDECREF(seq);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&pre);
    return res;
}

PyDoc_STRVAR(write_with_gil_doc,
             "write_with_gil(fd, data) -> int\n\n"
             "os.write() that keeps the GIL: the bytes written, OSError on failure.\n"
             "For the journal's small appends, one per operation.  os.write lets the\n"
             "GIL go, and a busy compaction thread then takes it: the writer waited\n"
             "~12 us for it back against ~1 us for the write itself.");
static PyObject *py_write_with_gil(PyObject *self, PyObject *args) {
    int fd;
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "iy*", &fd, &b))
        return NULL;
    ssize_t n;
    do
        n = write(fd, b.buf, (size_t)b.len);
    while (n < 0 && errno == EINTR);
    PyBuffer_Release(&b);
    if (n < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromSsize_t(n);
}

PyMethodDef records_methods[] = {
    {"write_with_gil", py_write_with_gil, METH_VARARGS, write_with_gil_doc},
    {"records_unpack", py_records_unpack, METH_VARARGS, records_unpack_doc},
    {"records_find", py_records_find, METH_VARARGS, records_find_doc},
    {"records_pack", py_records_pack, METH_O, records_pack_doc},
    {"records_offsets", py_records_offsets, METH_VARARGS, records_offsets_doc},
    {"records_prefix", py_records_prefix, METH_VARARGS, records_prefix_doc},
    {"pair_records_pack", py_pair_records_pack, METH_VARARGS, pair_records_pack_doc},
    {"records_merge", py_records_merge, METH_VARARGS, records_merge_doc},
    {"records_split", py_records_split, METH_VARARGS, records_split_doc},
    {"record_filter", py_record_filter, METH_VARARGS, record_filter_doc},
    {"record_chunk", py_record_chunk, METH_VARARGS, record_chunk_doc},
    {"record_probe", py_record_probe, METH_VARARGS, record_probe_doc},
    {NULL, NULL, 0, NULL},
};
