/* Method tables exported by the bind_*.c files, stitched together in module.c. */
#ifndef NDINDEX_BINDINGS_H
#define NDINDEX_BINDINGS_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "codec.h"
#include "query.h"

extern PyMethodDef codec_methods[];
extern PyMethodDef fingerprint_methods[];
/* The compiled code inside a capsule from compile_code(); -1 with TypeError. */
int ndx_get_code(PyObject *obj, const codec_code **code);
int codec_module_init(PyObject *m);

extern PyMethodDef query_methods[];
/* A permutation from a sequence of (src_lo, dst_lo, length); -1 with an exception. */
int ndx_parse_runs(PyObject *seq, perm_runs *r);

/* Shared binding helpers (bind_codec.c). */
/* A C-contiguous uint64 buffer (writable if asked); -1 with ValueError naming what. */
int ndx_get_u64_buffer(PyObject *obj, Py_buffer *view, int writable, const char *what);
/* Raise ndindex.errors.CorruptionError(message, database=..., offset=... if >= 0);
 * steals message; returns NULL. */
PyObject *ndx_raise_corruption(PyObject *message, const char *database, Py_ssize_t offset);
/* The same, naming the record's key (key_len bytes) when key is not NULL. */
PyObject *ndx_raise_corruption_at(PyObject *message, const char *database, const char *key,
                                  Py_ssize_t key_len, Py_ssize_t offset);
/* Words for a negative codec status. */
const char *ndx_status_text(long rc);

/* (q, fingerprint, distance) of n pairs as three bytes objects (bind_codec.c). */
PyObject *ndx_pairs_to_bytes(const void *q, const uint64_t *fp, const uint8_t *dist, size_t n);
extern PyMethodDef batch_methods[];
/* enter_self and Block (interrupts.c). */
int interrupts_module_init(PyObject *m);
extern PyMethodDef docs_methods[];

#include "lmdbpage.h"
extern PyMethodDef lmdbpage_methods[];
int lmdbpage_module_init(PyObject *m);
/* Raise CorruptionError for a damaged LMDB page; returns NULL. */
PyObject *ndx_raise_lmdb(const mdbp_error *e);
/* A map over a buffer of pages; -1 with ValueError if it does not fit. */
int ndx_get_map(Py_buffer *buf, unsigned long psize, unsigned long long npages, mdbp_map *map);
/* A tree from its Python description (root or None, depth, flags); -1 with an exception. */
int ndx_tree_of(PyObject *obj, mdbp_db *db);

extern PyMethodDef psm_methods[];
/* A C-contiguous float64 buffer of per_row * rows flip probabilities, each in
 * [0, 1] (bind_psm.c); -1 with ValueError. */
int ndx_get_probs(PyObject *obj, Py_buffer *view, size_t per_row, size_t rows);
extern PyMethodDef lmdbcheck_methods[];
extern PyMethodDef records_methods[];

#endif
