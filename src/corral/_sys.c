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
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
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

/* Bring the calling thread's loopback up (SIOCSIFFLAGS, IFF_UP): 0, or -1 and errno. */
static int lo_up(void) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    int ok = ioctl(fd, SIOCGIFFLAGS, &ifr) == 0;
    if (ok) {
        ifr.ifr_flags |= IFF_UP;
        ok = ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
    }
    int saved = errno;
    close(fd);
    errno = saved;
    return ok ? 0 : -1;
}

/* A new network namespace's loopback, brought up. */
static PyObject *sys_loopback_up(PyObject *self, PyObject *noargs) {
    if (lo_up() != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

/*
 * A network namespace made ahead, on a thread, while corral plans the run.
 * Making one costs the kernel about half a millisecond (more with many network
 * modules); on a thread that work overlaps corral's planning instead of
 * following it.  unshare(CLONE_NEWNET) moves only the calling thread, so the
 * thread makes the namespace, brings its loopback up and opens it; the main
 * thread joins it later with setns().  One at a time, per process.
 *
 * A user other than root needs a user namespace to own it, which no thread of a
 * threaded process can unshare: the thread clones a child into both new
 * namespaces instead (sharing its memory and descriptor table, the thread
 * suspended meanwhile, as by vfork).  The child maps its own uid and gid, brings
 * loopback up, opens both namespaces into the shared table and exits; the main
 * thread joins the user namespace, then the network one.  What corral forks
 * before that (the run's guardian, its proxy) stays in the host's namespaces.
 */
static struct {
    int state; /* 0: none, 1: thread running, 2: joined */
    pthread_t thread;
    pid_t tid;
    int flags;
    int nsfd;
    int userfd; /* the user namespace made with it (CLONE_NEWUSER), else -1 */
    unsigned int uid, gid;
    int err; /* errno of the step that failed, 0 if none did */
} ahead = {0, 0, 0, 0, -1, -1, 0, 0, 0};

static char child_stack[64 * 1024] __attribute__((aligned(16)));

/* "ID ID 1\n" into buf (at least 32 bytes): no stdio in the cloned child. */
static void map_line(char *buf, unsigned int id) {
    char digits[12];
    int n = 0, at = 0;
    do {
        digits[n++] = (char)('0' + id % 10);
        id /= 10;
    } while (id);
    for (int copy = 0; copy < 2; copy++) {
        for (int i = n - 1; i >= 0; i--)
            buf[at++] = digits[i];
        buf[at++] = ' ';
    }
    buf[at++] = '1';
    buf[at++] = '\n';
    buf[at] = '\0';
}

static int write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t len = (ssize_t)strlen(text);
    int ok = write(fd, text, (size_t)len) == len;
    int saved = errno;
    close(fd);
    errno = saved;
    return ok ? 0 : -1;
}

static int user_child(void *unused) {
    char map[32];
    if (write_file("/proc/self/setgroups", "deny") != 0)
        goto fail;
    map_line(map, ahead.uid);
    if (write_file("/proc/self/uid_map", map) != 0)
        goto fail;
    map_line(map, ahead.gid);
    if (write_file("/proc/self/gid_map", map) != 0 || lo_up() != 0)
        goto fail;
    ahead.userfd = open("/proc/self/ns/user", O_RDONLY | O_CLOEXEC);
    if (ahead.userfd < 0)
        goto fail;
    ahead.nsfd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (ahead.nsfd < 0)
        goto fail;
    _exit(0);
fail:
    ahead.err = errno ? errno : EIO;
    _exit(1);
}

static void user_ahead(void) {
    int flags = CLONE_VM | CLONE_VFORK | CLONE_FILES | ahead.flags; /* no exit signal */
    pid_t pid = clone(user_child, child_stack + sizeof child_stack, flags, NULL);
    if (pid < 0) {
        ahead.err = errno;
        return;
    }
    int status = 0;
    while (waitpid(pid, &status, __WALL) < 0 && errno == EINTR)
        ;
    if (ahead.err == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        ahead.err = EIO;
}

static void *ahead_main(void *unused) {
    ahead.tid = (pid_t)syscall(SYS_gettid);
    /* no signal for this thread, nor for the child it clones (which shares
       Python's memory: a handler run there would trip the main thread's flags) */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    if (ahead.flags & CLONE_NEWUSER) {
        user_ahead();
        return NULL;
    }
    if (unshare(ahead.flags) != 0 || lo_up() != 0) {
        ahead.err = errno;
        return NULL;
    }
    ahead.nsfd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (ahead.nsfd < 0)
        ahead.err = errno;
    return NULL;
}

/* The thread's CPUs: those this process may use, less the one it runs on now.
   Most of a namespace's cost is the kernel's (its sysctl tables, conntrack,
   loopback: ~1.3 ms here), and the scheduler tends to start a thread on its
   creator's CPU, where the planning it should overlap is running. */
static void elsewhere(pthread_attr_t *attr) {
    cpu_set_t set;
    int here = sched_getcpu();
    if (here < 0 || sched_getaffinity(0, sizeof set, &set) != 0)
        return;
    CPU_CLR(here, &set);
    if (CPU_COUNT(&set) > 0)
        pthread_attr_setaffinity_np(attr, sizeof set, &set);
}

static PyObject *sys_netns_ahead(PyObject *self, PyObject *args) {
    int flags;
    unsigned int uid = 0, gid = 0;
    if (!PyArg_ParseTuple(args, "i|II:netns_ahead", &flags, &uid, &gid))
        return NULL;
    if (ahead.state != 0) {
        errno = EBUSY;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    ahead.flags = flags;
    ahead.uid = uid;
    ahead.gid = gid;
    ahead.nsfd = ahead.userfd = -1;
    ahead.err = 0;
    ahead.tid = 0;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    elsewhere(&attr);
    int rc = pthread_create(&ahead.thread, &attr, ahead_main, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    ahead.state = 1;
    Py_RETURN_NONE;
}

/* Wait for the thread to be gone, kernel side too: pthread_join returns once it
   cleared its tid, a moment before the kernel stops counting it, and a process
   counted as threaded must not fork (Python 3.12 warns of exactly that). */
static PyObject *sys_netns_join(PyObject *self, PyObject *noargs) {
    if (ahead.state == 1) {
        Py_BEGIN_ALLOW_THREADS
        pthread_join(ahead.thread, NULL);
        pid_t pid = getpid();
        for (int i = 0; i < 100000 && ahead.tid > 0; i++) {
            if (syscall(SYS_tgkill, pid, ahead.tid, 0) != 0)
                break;
            sched_yield();
        }
        Py_END_ALLOW_THREADS
        ahead.state = 2;
    }
    Py_RETURN_NONE;
}

/* Move the calling thread into the namespace made ahead: True; False when none
   was started; OSError when making or entering it failed (the caller then makes
   one itself, and says why if that fails too). */
static PyObject *sys_netns_enter(PyObject *self, PyObject *noargs) {
    if (ahead.state == 0)
        Py_RETURN_FALSE;
    PyObject *joined = sys_netns_join(self, NULL);
    Py_DECREF(joined);
    ahead.state = 0;
    int fd = ahead.nsfd, userfd = ahead.userfd;
    ahead.nsfd = ahead.userfd = -1;
    if (ahead.err == 0 && userfd >= 0 && setns(userfd, CLONE_NEWUSER) != 0)
        ahead.err = errno;
    if (userfd >= 0)
        close(userfd);
    if (ahead.err != 0) {
        errno = ahead.err;
        return errno_error(fd);
    }
    if (setns(fd, CLONE_NEWNET) != 0)
        return errno_error(fd);
    close(fd);
    Py_RETURN_TRUE;
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
    {"netns_ahead", sys_netns_ahead, METH_VARARGS,
     "netns_ahead(flags[, uid, gid]): start making a namespace (lo up) on a thread;"
     " with CLONE_NEWUSER, in a user namespace mapping uid and gid to themselves."},
    {"netns_join", sys_netns_join, METH_NOARGS, "netns_join(): wait for that thread to end."},
    {"netns_enter", sys_netns_enter, METH_NOARGS,
     "netns_enter() -> bool: move this thread into it (False: none was started)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "corral._sys", NULL, -1, methods,
};

PyMODINIT_FUNC PyInit__sys(void) { return PyModule_Create(&module); }
