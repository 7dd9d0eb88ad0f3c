/*
 * corral._sys: the few system calls corral's hot path needs that Python 3.11's
 * os module lacks (os.unshare arrived in 3.12; inotify has no binding at all).
 * Optional: when it was not built (no C compiler at install time), corral makes
 * the same calls through ctypes' C module, whose import alone costs about a
 * millisecond on every `corral run` (and the network ones through the socket
 * module, a quarter of one).  Each function raises OSError with errno.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

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

static PyObject *errno_error(int fd) {
    int saved = errno;
    if (fd >= 0)
        close(fd);
    errno = saved;
    return PyErr_SetFromErrno(PyExc_OSError);
}

/* A new network namespace's loopback, brought up (SIOCSIFFLAGS, IFF_UP). */
static PyObject *sys_loopback_up(PyObject *self, PyObject *noargs) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return errno_error(-1);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    if (ioctl(fd, SIOCGIFFLAGS, &ifr) != 0)
        return errno_error(fd);
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(fd, SIOCSIFFLAGS, &ifr) != 0)
        return errno_error(fd);
    close(fd);
    Py_RETURN_NONE;
}

/* A UDP socket bound to (host, port), IPv6 only for an IPv6 host: its fd. */
static PyObject *sys_udp_bind(PyObject *self, PyObject *args) {
    const char *host;
    int port;
    if (!PyArg_ParseTuple(args, "si:udp_bind", &host, &port))
        return NULL;
    struct sockaddr_in v4;
    struct sockaddr_in6 v6;
    memset(&v4, 0, sizeof v4);
    memset(&v6, 0, sizeof v6);
    int six = strchr(host, ':') != NULL;
    int parsed = six ? inet_pton(AF_INET6, host, &v6.sin6_addr) : inet_pton(AF_INET, host, &v4.sin_addr);
    if (parsed != 1 || port < 0 || port > 65535) {
        errno = EINVAL;
        return errno_error(-1);
    }
    v4.sin_family = AF_INET;
    v4.sin_port = htons((unsigned short)port);
    v6.sin6_family = AF_INET6;
    v6.sin6_port = htons((unsigned short)port);
    int fd = socket(six ? AF_INET6 : AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return errno_error(-1);
    int one = 1;
    if (six && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) != 0)
        return errno_error(fd);
    int bound = six ? bind(fd, (struct sockaddr *)&v6, sizeof v6)
                    : bind(fd, (struct sockaddr *)&v4, sizeof v4);
    if (bound != 0)
        return errno_error(fd);
    return PyLong_FromLong(fd);
}

static PyMethodDef methods[] = {
    {"unshare", sys_unshare, METH_VARARGS, "unshare(flags): unshare(2)."},
    {"inotify_init1", sys_inotify_init1, METH_VARARGS, "inotify_init1(flags) -> fd."},
    {"inotify_add_watch", sys_inotify_add_watch, METH_VARARGS,
     "inotify_add_watch(fd, path: bytes, mask) -> watch descriptor."},
    {"loopback_up", sys_loopback_up, METH_NOARGS, "loopback_up(): bring lo up."},
    {"udp_bind", sys_udp_bind, METH_VARARGS, "udp_bind(host, port) -> fd."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "corral._sys", NULL, -1, methods,
};

PyMODINIT_FUNC PyInit__sys(void) { return PyModule_Create(&module); }
