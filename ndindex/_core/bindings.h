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
int query_module_init(PyObject *m);

#endif
