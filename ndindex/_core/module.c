/* The ndindex._core extension module: hot loops only.
 *
 * Each area keeps its kernels (plain C on pointers and fixed-width ints) in
 * its own .c file and its Python binding in a bind_*.c file that exports a
 * method table; this file only stitches the tables into one module. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "bindings.h"

/* An __enter__ that returns self, in C (an instance method: it binds).  A
 * `with` statement calls __enter__ once the object exists, and a Python
 * __enter__ starts with a point where Python runs a signal handler: a Ctrl-C
 * there left the opened Index unclosed, no __exit__ to run (the interrupt
 * point sweep: `ndindex compact --full`, 1 point in 1,500).  A C function
 * has no such point, and the with statement's own instruction none either. */
static PyObject *enter_self(PyObject *unused, PyObject *self) {
    Py_INCREF(self);
    return self;
}

static PyMethodDef enter_self_def = {
    "enter_self", enter_self, METH_O, "Return self (a with statement's __enter__, in C).",
};

static int add_enter_self(PyObject *m) {
    PyObject *func = PyCFunction_New(&enter_self_def, NULL);
    if (func == NULL)
        return -1;
    PyObject *method = PyInstanceMethod_New(func);
    Py_DECREF(func);
    if (method == NULL || PyModule_AddObject(m, "enter_self", method) < 0) {
        Py_XDECREF(method);
        return -1;
    }
    return 0;
}

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "ndindex._core",
    "Hot loops of ndindex (block codec, probes, feature hashing, probabilistic matching).", -1, NULL, NULL, NULL, NULL, NULL,
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
        PyModule_AddFunctions(m, docs_methods) < 0 || add_enter_self(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
