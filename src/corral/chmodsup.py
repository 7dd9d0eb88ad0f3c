"""chmod in the writable places on the landlock tier: a seccomp supervisor.

Landlock does not govern file modes, so the landlock tier's seccomp filter
refuses set-ID modes itself and hands every other chmod, fchmod, fchmodat and
fchmodat2 to its listener (SECCOMP_RET_USER_NOTIF).  The command's process
passes the listener to the reaper (:func:`corral.confine.reaper`), which serves
it here while it waits for the command: for each call it opens the very file
the call names, resolved as the kernel would for the caller, decides on that
opened file (:func:`decide`), changes its mode itself and answers with the
result.  If the reaper is gone, the kernel fails the call (ENOSYS): nothing
changes.

Races: the decision and the chmod act on one opened file, never on a path
looked up twice, so a symlink or directory swapped in between changes nothing.
The sandbox cannot move a file into or out of the writable places (Landlock's
rename and link rights), so a file that lies inside them stays inside; a
regular file with other names may be a file outside: refused.  The target's
pid could be reused once it dies: every read of the target comes before
SECCOMP_IOCTL_NOTIF_ID_VALID, which says it is still waiting in that call.

The reaper runs as the command's uid with no capabilities (it drops them before
serving), so it can change no mode the command's own chmod could not.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

# struct seccomp_notif {u64 id; u32 pid; u32 flags; struct seccomp_data data}, and
# seccomp_data {int nr; u32 arch; u64 instruction_pointer; u64 args[6]}
NOTIF = struct.Struct("=QIIiIQ6Q")
# struct seccomp_notif_resp {u64 id; s64 val; s32 error; u32 flags}
RESP = struct.Struct("=QqiI")


def _iowr(nr: int, size: int, write_only: bool = False) -> int:
    """An ioctl number of seccomp's ('!') family, as <linux/ioctl.h> encodes it."""
    direction = 1 if write_only else 3
    return (direction << 30) | (size << 16) | (ord("!") << 8) | nr


NOTIF_RECV = _iowr(0, NOTIF.size)
NOTIF_SEND = _iowr(1, RESP.size)
NOTIF_ID_VALID = _iowr(2, 8, write_only=True)

PATH_MAX = 4096
_PAGE = 4096  # reads of the target's memory stop at page ends: the next may be unmapped
_AT_FDCWD = -100
_AT_SYMLINK_NOFOLLOW = 0x100
_AT_EMPTY_PATH = 0x1000
_PIDFD_THREAD = os.O_EXCL  # a pidfd for a thread, not only a process (Linux >= 6.9)
_RESOLVE_NO_MAGICLINKS = 0x02
_SYS_OPENAT2 = 437  # the same on x86_64 and aarch64
_SYS_PIDFD_GETFD = 438
_libc: list[ctypes.CDLL] = []  # loaded when first needed: planning imports Places


def _syscall(*args: object) -> int:
    if not _libc:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        _libc.append(libc)
    return int(_libc[0].syscall(*args))


def own_fd(path: bytes) -> int | None:
    """N for /proc/self/fd/N (or thread-self): the caller's own descriptor.  glibc's
    fchmodat(AT_SYMLINK_NOFOLLOW) opens the file O_PATH, then chmods that name."""
    for prefix in (b"/proc/self/fd/", b"/proc/thread-self/fd/"):
        number = path[len(prefix) :]
        if path.startswith(prefix) and number.isdigit() and len(number) < 10:
            return int(number)
    return None


class Call:
    """One notification: the call's id, the calling thread and the raw arguments."""

    __slots__ = ("args", "id", "nr", "pid")

    def __init__(self, id: int, pid: int, nr: int, args: tuple[int, ...]) -> None:
        self.id = id
        self.pid = pid
        self.nr = nr
        self.args = args


def unpack_notif(buf: bytes) -> Call:
    id_, pid, _flags, nr, _arch, _ip, *args = NOTIF.unpack(buf)
    return Call(id_, pid, nr, tuple(args))


GO_ON = -1  # answer()'s "let the call itself go on" (SECCOMP_USER_NOTIF_FLAG_CONTINUE)


def pack_resp(call_id: int, err: int) -> bytes:
    """The answer: the call returns 0, or fails with ``err``, or (GO_ON) the kernel
    runs it as the caller made it."""
    if err == GO_ON:
        return RESP.pack(call_id, 0, 0, 1)
    return RESP.pack(call_id, 0, -err, 0)


def _int(value: int) -> int:
    """An ``int`` argument from its 64-bit register: the low word, signed."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


class Request:
    """What a mode call asks, from its name and raw arguments: ``fd`` for fchmod;
    otherwise ``dirfd`` (AT_FDCWD for chmod), the path's address and ``flags``."""

    __slots__ = ("by_fd", "dirfd", "fd", "flags", "mode", "path")

    def __init__(self, name: str, args: Sequence[int]) -> None:
        self.fd = self.dirfd = self.path = self.flags = 0
        self.by_fd = name == "fchmod"
        if self.by_fd:
            self.fd, self.mode = _int(args[0]), args[1]
        elif name == "chmod":
            self.dirfd, self.path, self.mode = _AT_FDCWD, args[0], args[1]
        elif name in ("fchmodat", "fchmodat2"):
            self.dirfd, self.path, self.mode = _int(args[0]), args[1], args[2]
            self.flags = _int(args[3]) if name == "fchmodat2" else 0
        else:
            raise ValueError(f"not a mode call: {name}")
        self.mode &= 0o7777  # the kernel keeps these bits of the umode_t


def read_string(read: Callable[[int, int], bytes], addr: int) -> bytes:
    """The NUL-terminated string at ``addr``, read page by page with ``read(size,
    addr)``; EFAULT where nothing can be read, ENAMETOOLONG past PATH_MAX."""
    if not 0 < addr < 1 << 63:
        raise OSError(errno.EFAULT, "bad address")
    out = b""
    while len(out) < PATH_MAX:
        size = min(_PAGE - addr % _PAGE, PATH_MAX - len(out))
        try:
            chunk = read(size, addr)
        except OSError:
            chunk = b""
        if not chunk:
            raise OSError(errno.EFAULT, "bad address")
        end = chunk.find(b"\0")
        if end >= 0:
            return out + chunk[:end]
        out += chunk
        addr += len(chunk)
    raise OSError(errno.ENAMETOOLONG, "path too long")


def within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class Places:
    """Where modes may change: the writable ``roots`` (real paths), less the
    ``withheld`` paths inside them (secrets, hard-linked files), which are also
    known by identity (``ids``, filled by :meth:`remember`) so that a secret the
    sandbox renames stays withheld."""

    __slots__ = ("ids", "roots", "withheld")

    def __init__(self, roots: Sequence[str], withheld: Sequence[str]) -> None:
        self.roots = tuple(roots)
        self.withheld = tuple(w for w in withheld if any(within(w, r) for r in roots))
        self.ids: frozenset[tuple[int, int]] = frozenset()

    def remember(self) -> None:
        """Note what the roots and withheld paths are now (at launch, before the
        command runs): the home layer and scratch directory are made after planning."""
        self.roots = tuple(os.path.realpath(r) for r in self.roots)
        ids = set()
        for path in self.withheld:
            try:
                st = os.lstat(path)
            except OSError:
                continue
            ids.add((st.st_dev, st.st_ino))
        self.ids = frozenset(ids)


def decide(path: str, st: os.stat_result, mode: int, places: Places) -> int:
    """The errno for giving the opened file ``st``, found at ``path`` (the
    kernel's name for it), mode ``mode``; 0 to go ahead."""
    if mode & 0o6000:
        return errno.EPERM  # set-ID bits (the filter refuses them before us)
    if stat.S_ISLNK(st.st_mode):
        return errno.EOPNOTSUPP  # fchmodat2(AT_SYMLINK_NOFOLLOW) on a symlink, as Linux says
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return errno.EPERM  # a device's mode is the host's business
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        return errno.EPERM  # another name may be outside: one inode, one mode
    if not any(within(path, root) for root in places.roots):
        return errno.EPERM
    if (st.st_dev, st.st_ino) in places.ids or any(within(path, w) for w in places.withheld):
        return errno.EPERM
    return 0


# --- doing it, for one call ---------------------------------------------------


def _check(result: int) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def _pidfd(tid: int) -> int:
    try:
        return os.pidfd_open(tid, _PIDFD_THREAD)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return os.pidfd_open(tid, 0)  # an older kernel: a thread group leader only


def _getfd(pidfd: int, fd: int) -> int:
    """A duplicate of the target's ``fd`` (the same open file)."""
    return _check(_syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0))


def _openat2(base: int, path: bytes, follow: bool) -> int:
    """``path`` opened O_PATH from ``base``, refusing magic links (/proc/PID/fd/N,
    /proc/PID/cwd): here they would lead where the reaper may go, not the caller."""
    flags = os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    how = ctypes.create_string_buffer(struct.pack("=QQQ", flags, 0, _RESOLVE_NO_MAGICLINKS))
    return _check(_syscall(_SYS_OPENAT2, base, ctypes.c_char_p(path), how, 24))


class _Fds:
    """Descriptors opened for one call, all closed after it."""

    def __init__(self) -> None:
        self.held: list[int] = []

    def keep(self, fd: int) -> int:
        self.held.append(fd)
        return fd

    def close(self) -> None:
        for fd in self.held:
            os.close(fd)


def _open_target(req: Request, tid: int, pidfd: int, fds: _Fds) -> tuple[int, bool]:
    """The file ``req`` names for thread ``tid``, opened, and whether its mode is
    set through /proc/self/fd (an O_PATH descriptor) rather than fchmod."""
    if req.by_fd:
        return fds.keep(_getfd(pidfd, req.fd)), False
    if req.flags & ~(_AT_SYMLINK_NOFOLLOW | _AT_EMPTY_PATH):
        raise OSError(errno.EINVAL, "unknown flags")
    mem = fds.keep(os.open(f"/proc/{tid}/mem", os.O_RDONLY | os.O_CLOEXEC))
    path = read_string(lambda size, addr: os.pread(mem, size, addr), req.path)
    follow = not req.flags & _AT_SYMLINK_NOFOLLOW
    own = own_fd(path)
    if own is not None:
        if not follow:
            raise OSError(errno.EOPNOTSUPP, "a symlink")
        return fds.keep(_getfd(pidfd, own)), True
    if path.startswith(b"/"):
        return fds.keep(_openat2(_AT_FDCWD, path, follow)), True
    if req.dirfd == _AT_FDCWD:
        base = fds.keep(os.open(f"/proc/{tid}/cwd", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
    else:
        base = fds.keep(_getfd(pidfd, req.dirfd))
    if not path:
        if not req.flags & _AT_EMPTY_PATH:
            raise OSError(errno.ENOENT, "empty path")
        return base, True
    return fds.keep(_openat2(base, path, follow)), True


def _still_waiting(listener: int, call_id: int) -> bool:
    import fcntl

    try:
        fcntl.ioctl(listener, NOTIF_ID_VALID, struct.pack("=Q", call_id))
    except OSError:
        return False
    return True


def answer(listener: int, call: Call, names: dict[int, str], places: Places) -> int:
    """Do what ``call`` asks if :func:`decide` allows it: its errno, 0 when done;
    for a scheduling call, GO_ON when it names the sandbox's own thread."""
    name = names.get(call.nr)
    if name is None:
        return errno.EPERM
    if name in SCHEDULING:
        target = _int(call.args[SCHEDULING[name]])
        return GO_ON if ours(target, os.getpid()) else errno.EPERM
    req = Request(name, call.args)
    fds = _Fds()
    try:
        pidfd = fds.keep(_pidfd(call.pid))
        target, by_path = _open_target(req, call.pid, pidfd, fds)
        if not _still_waiting(listener, call.id):
            return errno.EPERM  # the caller is gone: what we read may be another's
        st = os.fstat(target)
        err = decide(os.readlink(f"/proc/self/fd/{target}"), st, req.mode, places)
        if err:
            return err
        if by_path:
            os.chmod(f"/proc/self/fd/{target}", req.mode)  # this very file, not a name
        else:
            os.fchmod(target, req.mode)
        return 0
    except OSError as exc:
        return exc.errno or errno.EPERM
    finally:
        fds.close()


# The scheduling calls the filter hands over (corral.tiers.landlock), and which
# argument names the process or thread they change.
SCHEDULING = {
    "sched_setaffinity": 0,
    "sched_setscheduler": 0,
    "sched_setparam": 0,
    "sched_setattr": 0,
    "setpriority": 1,
    "ioprio_set": 1,
}


def ours(tid: int, root: int) -> bool:
    """Whether thread or process ``tid`` is the sandbox's: under ``root`` (the
    reaper, a subreaper: an orphan comes back to it, never leaves its tree).  Its
    value is all the call is decided on, and the call goes on as made; only a pid
    reused in between (a wrap of the pid space) could be another's."""
    pid = tid
    for _ in range(4096):  # (a deeper tree than any: the walk ends)
        if pid == root:
            return True
        if pid <= 1:
            return False
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:  # (a thread's id works too)
                stat = fh.read()
        except OSError:
            return False
        pid = int(stat[stat.rindex(b")") + 2 :].split()[1])  # field 4: the parent
    return False


# --- the loop -----------------------------------------------------------------


def call_names() -> dict[int, str]:
    """The mode and scheduling calls' numbers on this machine."""
    from corral import seccomp
    from corral.tiers.landlock import MODE_CALLS

    arch = seccomp.native_arch()
    found = {name: seccomp.syscall_number(name, arch) for name in (*MODE_CALLS, *SCHEDULING)}
    return {nr: name for name, nr in found.items() if nr is not None}


def handle_one(listener: int, names: dict[int, str], places: Places) -> None:
    import fcntl

    buf = bytearray(NOTIF.size)  # the kernel wants it zeroed
    try:
        fcntl.ioctl(listener, NOTIF_RECV, buf, True)
    except OSError:
        return  # ENOENT: the caller went away before we took it
    call = unpack_notif(bytes(buf))
    try:
        err = answer(listener, call, names, places)
    except Exception:  # a bug here must refuse, never stop the reaper
        err = errno.EPERM
    try:
        fcntl.ioctl(listener, NOTIF_SEND, pack_resp(call.id, err))
    except OSError:
        pass  # ENOENT: the caller was killed meanwhile


def serve(listener: int, child: int, places: Places) -> int:
    """Answer the listener until ``child`` ends, reaping whatever else ends (this
    process is a subreaper); the child's wait status."""
    import select
    import signal

    places.remember()
    names = call_names()
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)  # SIGCHLD wakes the poll below
    signal.signal(signal.SIGCHLD, lambda _sig, _frame: None)
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        status = _reap(child)
        if status is not None:
            return status
        for fd, events in poller.poll():
            if fd == wake_r:
                try:
                    os.read(wake_r, 4096)  # the wakes; _reap finds what ended
                except BlockingIOError:
                    pass
            elif events & select.POLLIN:
                handle_one(listener, names, places)
            else:  # POLLHUP: nothing is left that the filter covers
                poller.unregister(listener)


def _reap(child: int) -> int | None:
    """Reap every process that has ended; ``child``'s status if it is one."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 0  # cannot happen while child is ours; do not spin
        if pid == 0:
            return None
        if pid == child:
            return status
