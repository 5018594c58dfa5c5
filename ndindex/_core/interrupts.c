/* With statements that Ctrl-C cannot cut in two.
 *
 * CPython runs a Python signal handler (Ctrl-C's KeyboardInterrupt) only at
 * certain points of the main thread: as a Python function starts, as a call
 * of a C function from Python code returns, at a loop's back edge.  A with
 * statement's __enter__ and __exit__ written in Python (or by
 * contextlib.contextmanager) start with such a point, before any line of
 * theirs runs: a Ctrl-C there skipped the whole __exit__ (a transaction's
 * lock held and its block counted for ever) or half of it.  The functions
 * here are C: the with statement reaches them with no point on the way, and
 * they hold Ctrl-C back (as errors.interrupts_deferred does, from its first
 * instruction on) before they call any Python code. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <signal.h>
#include <unistd.h>

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

/* An __exit__ that calls self.close(), in C (an instance method).  A Python
 * __exit__ starts with a point where a Ctrl-C lands before its first line:
 * the index stayed open.  close() itself starts with one too, before it holds
 * Ctrl-C back: a KeyboardInterrupt from it had done nothing, and the close
 * is made again (a close() that ran returns at once), then the interrupt
 * raised (sweep_interrupt_points: 1 point in 500 of an upgrade). */
static PyObject *exit_closing(PyObject *unused, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "exit_closing needs self");
        return NULL;
    }
    PyObject *r = PyObject_CallMethod(args[0], "close", NULL);
    if (r != NULL) {
        Py_DECREF(r);
        Py_RETURN_FALSE;
    }
    if (!PyErr_ExceptionMatches(PyExc_KeyboardInterrupt))
        return NULL;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    r = PyObject_CallMethod(args[0], "close", NULL);
    if (r == NULL) {
        /* A second Ctrl-C (or an error of the close): the first interrupt
         * is what the with statement raises; the second is reported. */
        PyErr_WriteUnraisable(args[0]);
    }
    Py_XDECREF(r);
    PyErr_Restore(type, value, tb);
    return NULL;
}

static PyMethodDef exit_closing_def = {
    "exit_closing", (PyCFunction)(void (*)(void))exit_closing, METH_FASTCALL,
    "Call self.close() (a with statement's __exit__, in C), once more after a KeyboardInterrupt.",
};

/* -- holding SIGINT back ------------------------------------------------------------ */

static PyObject *signal_func;   /* _signal.signal (C: signal.signal is a Python function) */
static PyObject *sig_dfl;       /* _signal.SIG_DFL */
static PyObject *held_func;     /* held(), the handler while Ctrl-C is held back */
static long held_count;         /* SIGINTs held back by the innermost hold */

static PyObject *held(PyObject *unused, PyObject *args) {
    held_count++;
    Py_RETURN_NONE;
}

static PyMethodDef held_def = {"held", held, METH_VARARGS, "Count a SIGINT held back."};

/* For a long wait inside a hold (claim_build's, for another process's build
 * name): whether a Ctrl-C is held back, taken from the hold (the caller
 * raises KeyboardInterrupt itself, having left nothing behind). */
static PyObject *take_held_interrupt(PyObject *unused, PyObject *noargs) {
    if (held_count > 0) {
        held_count = 0;
        Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

static PyMethodDef take_held_interrupt_def = {
    "take_held_interrupt", take_held_interrupt, METH_NOARGS,
    "True, and no longer held, if a Ctrl-C is held back by the innermost Block's hold.",
};

typedef struct {
    PyObject *previous;   /* the handler to put back; NULL: not held (not the main thread) */
    long outer_count;     /* the enclosing hold's count */
    long caught;          /* KeyboardInterrupts of pending handlers as the hold began or ended */
    PyObject *exc_type, *exc_value, *exc_tb;   /* another exception of one (the first) */
} hold_state;

/* _signal.signal(SIGINT, handler); NULL with an exception.  signal.signal
 * first runs the handlers of signals that are pending, and one may raise:
 * a KeyboardInterrupt (under the handler being replaced) is counted in
 * h->caught, another exception (say SystemExit, of a SIGTERM handler) kept
 * for the hold's end, and the call made again, so the handler is set in
 * any case. */
static PyObject *set_sigint(PyObject *handler, hold_state *h) {
    for (;;) {
        PyObject *previous = PyObject_CallFunction(signal_func, "iO", SIGINT, handler);
        if (previous != NULL || !PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_ValueError) ||
            PyErr_ExceptionMatches(PyExc_TypeError))
            return previous;
        if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
            PyErr_Clear();
            h->caught++;
        } else if (h->exc_type == NULL) {
            PyErr_Fetch(&h->exc_type, &h->exc_value, &h->exc_tb);
        } else {
            PyErr_Clear();   /* a second one: the first is raised */
        }
    }
}

/* Hold Ctrl-C back.  Signals reach the main thread alone: elsewhere (a
 * ValueError from signal.signal) the hold does nothing. */
static int hold_begin(hold_state *h) {
    h->caught = 0;
    h->exc_type = h->exc_value = h->exc_tb = NULL;
    h->previous = set_sigint(held_func, h);
    if (h->previous == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    /* After the call: the pending handlers it ran may have been an
     * enclosing hold's held(), counting for that hold. */
    h->outer_count = held_count;
    held_count = 0;
    return 0;
}

/* Put the previous handler back, and hand it the Ctrl-C held back, if any:
 * it runs as the with statement's call returns (for the default handler:
 * KeyboardInterrupt there).  Keeps the exception set, if one is; else sets
 * the other exception a pending handler raised, if one did, and returns -1. */
static int hold_end(hold_state *h) {
    if (h->previous == NULL)
        return 0;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *handler = h->previous == Py_None ? sig_dfl : h->previous;
    PyObject *back = set_sigint(handler, h);   /* runs held() for pending ones */
    long got = held_count + h->caught;
    held_count = h->outer_count;
    if (back == NULL)
        PyErr_WriteUnraisable(signal_func);
    Py_XDECREF(back);
    if (got > 0) {
        if (PyCallable_Check(handler))
            PyErr_SetInterruptEx(SIGINT);
        else if (PyObject_RichCompareBool(handler, sig_dfl, Py_EQ) == 1)
            kill(getpid(), SIGINT);   /* the default action: end the process */
        PyErr_Clear();
    }
    Py_CLEAR(h->previous);
    if (h->exc_type != NULL && type == NULL) {
        PyErr_Restore(h->exc_type, h->exc_value, h->exc_tb);
        return -1;
    }
    Py_XDECREF(h->exc_type);   /* an exception is on its way already */
    Py_XDECREF(h->exc_value);
    Py_XDECREF(h->exc_tb);
    PyErr_Restore(type, value, tb);
    return 0;
}

/* exit(type, value, traceback) of the exception set, which stays set. */
static void exit_with_error(PyObject *exit) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *r = PyObject_CallFunctionObjArgs(exit, type, value ? value : Py_None,
                                               tb ? tb : Py_None, NULL);
    if (r == NULL)
        PyErr_WriteUnraisable(exit);
    Py_XDECREF(r);
    PyErr_Restore(type, value, tb);
}

/* -- Block: a with statement over a lock and two calls, in C -------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *lock;    /* acquired before enter(), released after exit() */
    PyObject *enter;   /* enter() -> what the with statement binds */
    PyObject *exit;    /* exit(type, value, traceback) -> true to swallow the exception */
} Block;

static int block_traverse(Block *self, visitproc visit, void *arg) {
    Py_VISIT(self->lock);
    Py_VISIT(self->enter);
    Py_VISIT(self->exit);
    return 0;
}

static int block_clear(Block *self) {
    Py_CLEAR(self->lock);
    Py_CLEAR(self->enter);
    Py_CLEAR(self->exit);
    return 0;
}

static void block_dealloc(Block *self) {
    PyObject_GC_UnTrack(self);
    block_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int block_init(Block *self, PyObject *args, PyObject *kwargs) {
    PyObject *lock, *enter, *exit;
    if (!PyArg_ParseTuple(args, "OOO:Block", &lock, &enter, &exit))
        return -1;
    Py_INCREF(lock);
    Py_INCREF(enter);
    Py_INCREF(exit);
    Py_XSETREF(self->lock, lock);
    Py_XSETREF(self->enter, enter);
    Py_XSETREF(self->exit, exit);
    return 0;
}

static void release(PyObject *lock) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *r = PyObject_CallMethod(lock, "release", NULL);
    if (r == NULL)
        PyErr_WriteUnraisable(lock);
    Py_XDECREF(r);
    PyErr_Restore(type, value, tb);
}

static int block_ready(Block *self) {
    if (self->lock == NULL || self->enter == NULL || self->exit == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Block was not initialised");
        return 0;
    }
    return 1;
}

static PyObject *block_enter(Block *self, PyObject *unused) {
    if (!block_ready(self))
        return NULL;
    int locks = self->lock != Py_None;
    if (locks) {
        /* The wait for the lock is Ctrl-C's to break (nothing is held yet). */
        PyObject *r = PyObject_CallMethod(self->lock, "acquire", NULL);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    hold_state h;
    if (hold_begin(&h) < 0) {
        if (locks)
            release(self->lock);
        return NULL;
    }
    PyObject *out = PyObject_CallNoArgs(self->enter);
    if (hold_end(&h) < 0 && out != NULL) {
        /* Entered, and another signal's handler raised as the hold ended:
         * the block ends with that exception, as one at its first line. */
        exit_with_error(self->exit);
        Py_CLEAR(out);
    }
    if (out == NULL && locks)
        release(self->lock);
    return out;
}

static PyObject *block_exit(Block *self, PyObject *args) {
    PyObject *type, *value, *tb;
    if (!PyArg_ParseTuple(args, "OOO:__exit__", &type, &value, &tb) || !block_ready(self))
        return NULL;
    hold_state h;
    PyObject *out;
    if (hold_begin(&h) < 0) {
        exit_with_error(self->exit);   /* the block ends all the same */
        out = NULL;
    } else {
        out = PyObject_CallFunctionObjArgs(self->exit, type, value, tb, NULL);
        if (hold_end(&h) < 0)
            Py_CLEAR(out);
    }
    if (self->lock != Py_None)
        release(self->lock);
    return out;
}

static PyMethodDef block_methods[] = {
    {"__enter__", (PyCFunction)block_enter, METH_NOARGS, "Take the lock, then enter() with Ctrl-C held back."},
    {"__exit__", (PyCFunction)block_exit, METH_VARARGS, "exit(type, value, traceback) with Ctrl-C held back, then let go of the lock."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ndindex._core.Block",
    .tp_basicsize = sizeof(Block),
    .tp_dealloc = (destructor)block_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_traverse = (traverseproc)block_traverse,
    .tp_clear = (inquiry)block_clear,
    .tp_doc = "Block(lock, enter, exit): a context manager whose __enter__ takes lock and\n"
              "returns enter(), and whose __exit__ returns exit(type, value, traceback) and\n"
              "lets go of lock (a lock whose acquire and release are C, or None); both in C,\n"
              "with Ctrl-C held back while they call Python.",
    .tp_methods = block_methods,
    .tp_init = (initproc)block_init,
    .tp_new = PyType_GenericNew,
};

static int add_instance_method(PyObject *m, PyMethodDef *def) {
    PyObject *func = PyCFunction_New(def, NULL);
    if (func == NULL)
        return -1;
    PyObject *method = PyInstanceMethod_New(func);
    Py_DECREF(func);
    if (method == NULL || PyModule_AddObject(m, def->ml_name, method) < 0) {
        Py_XDECREF(method);
        return -1;
    }
    return 0;
}

int interrupts_module_init(PyObject *m) {
    PyObject *signal_mod = PyImport_ImportModule("_signal");
    if (signal_mod == NULL)
        return -1;
    signal_func = PyObject_GetAttrString(signal_mod, "signal");
    sig_dfl = PyObject_GetAttrString(signal_mod, "SIG_DFL");
    Py_DECREF(signal_mod);
    held_func = PyCFunction_New(&held_def, NULL);
    if (signal_func == NULL || sig_dfl == NULL || held_func == NULL)
        return -1;
    PyObject *take = PyCFunction_New(&take_held_interrupt_def, NULL);
    if (take == NULL || PyModule_AddObject(m, "take_held_interrupt", take) < 0) {
        Py_XDECREF(take);
        return -1;
    }
    if (add_instance_method(m, &enter_self_def) < 0 ||
        add_instance_method(m, &exit_closing_def) < 0)
        return -1;
    if (PyType_Ready(&BlockType) < 0)
        return -1;
    Py_INCREF(&BlockType);
    if (PyModule_AddObject(m, "Block", (PyObject *)&BlockType) < 0) {
        Py_DECREF(&BlockType);
        return -1;
    }
    return 0;
}
