/* The ndindex._core extension module: hot loops, and (interrupts.c) with
 * statements that Ctrl-C cannot cut in two.
 *
 * Each area keeps its kernels (plain C on pointers and fixed-width ints) in
 * its own .c file and its Python binding in a bind_*.c file that exports a
 * method table; this file only stitches the tables into one module. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "bindings.h"

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "ndindex._core",
    "Hot loops of ndindex (block codec, probes, feature hashing, probabilistic matching), and with statements Ctrl-C cannot cut in two.", -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__core(void) {
    PyObject *m = PyModule_Create(&core_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddFunctions(m, codec_methods) < 0 || codec_module_init(m) < 0 ||
        PyModule_AddFunctions(m, query_methods) < 0 ||
        PyModule_AddFunctions(m, batch_methods) < 0 ||
        PyModule_AddFunctions(m, lmdbpage_methods) < 0 || lmdbpage_module_init(m) < 0 ||
        PyModule_AddFunctions(m, lmdbcheck_methods) < 0 ||
        PyModule_AddFunctions(m, records_methods) < 0 ||
        PyModule_AddFunctions(m, psm_methods) < 0 ||
        PyModule_AddFunctions(m, fingerprint_methods) < 0 ||
        PyModule_AddFunctions(m, docs_methods) < 0 || interrupts_module_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
