/* Method tables exported by the bind_*.c files, stitched together in module.c. */
#ifndef NDINDEX_BINDINGS_H
#define NDINDEX_BINDINGS_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "codec.h"

extern PyMethodDef codec_methods[];
extern PyMethodDef fingerprint_methods[];
/* The compiled code inside a capsule from compile_code(); -1 with TypeError. */
int ndx_get_code(PyObject *obj, const codec_code **code);
int codec_module_init(PyObject *m);

#endif
