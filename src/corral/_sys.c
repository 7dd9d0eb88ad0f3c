/*
 * corral._sys: the few system calls corral's hot path needs that Python 3.11's
 * os module lacks (os.unshare arrived in 3.12; inotify has no binding at all).
 * Optional: when it was not built (no C compiler at install time), corral makes
 * the same calls through ctypes' C module, whose import alone costs about a
 * millisecond on every `corral run`.  Each function raises OSError with errno.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <sched.h>
#include <sys/inotify.h>

static PyObject *sys_unshare(PyObject *self, PyObject *args) {
    int flags;
    if (!PyArg_ParseTuple(args, "i:unshare", &flags))
        return NULL;
    if (unshare(flags) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *sys_inotify_init1(PyObject *self, PyObject *args) {
    int flags;
    if (!PyArg_ParseTuple(args, "i:inotify_init1", &flags))
        return NULL;
    int fd = inotify_init1(flags);
    if (fd < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLong(fd);
}

static PyObject *sys_inotify_add_watch(PyObject *self, PyObject *args) {
    int fd;
    const char *path;
    unsigned int mask;
    if (!PyArg_ParseTuple(args, "iyI:inotify_add_watch", &fd, &path, &mask))
        return NULL;
    int wd = inotify_add_watch(fd, path, mask);
    if (wd < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLong(wd);
}

static PyMethodDef methods[] = {
    {"unshare", sys_unshare, METH_VARARGS, "unshare(flags): unshare(2)."},
    {"inotify_init1", sys_inotify_init1, METH_VARARGS, "inotify_init1(flags) -> fd."},
    {"inotify_add_watch", sys_inotify_add_watch, METH_VARARGS,
     "inotify_add_watch(fd, path: bytes, mask) -> watch descriptor."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "corral._sys", NULL, -1, methods,
};

PyMODINIT_FUNC PyInit__sys(void) { return PyModule_Create(&module); }
