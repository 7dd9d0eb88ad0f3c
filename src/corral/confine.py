"""Confine the current process in place: Landlock, seccomp, no capabilities.

Used by the landlock tier, which has no helper binary like bwrap: after the
launcher forks, :func:`reaper` runs in the child.  The reaper stays outside
the sandbox, becomes the "subreaper" of everything the command starts (so
nothing can escape by daemonizing) and forks the command, which confines
itself with :func:`apply` and execs.  When the command ends, when corral asks
(SIGTERM) or when corral dies (the parent-death signal), the reaper kills
every descendant before it exits.

The syscalls go through ctypes: the standard library has no wrapper for them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import time

try:  # the C module: `signal` imports enum, which the hot path avoids
    import _signal as signal  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover
    import signal  # type: ignore[no-redef, unused-ignore]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.landlock import Ruleset

_SYS = {  # the same numbers on x86_64 and aarch64 (the "new" syscall table)
    "landlock_create_ruleset": 444,
    "landlock_add_rule": 445,
    "landlock_restrict_self": 446,
}
_PR_SET_PDEATHSIG = 1
_PR_SET_SECCOMP = 22
_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_SECCOMP_MODE_FILTER = 2
_SECCOMP_SET_MODE_FILTER = 1  # seccomp(2)'s operation
_SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
_SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
# SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP, SECBIT_KEEP_CAPS_LOCKED and their locks:
# uid 0 gains nothing from exec, and the bits cannot be undone.
_SECUREBITS = 0x01 | 0x02 | 0x04 | 0x08 | 0x20
_CAP_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.restype = ctypes.c_int


class ConfineError(Exception):
    pass


class ListenerBusy(ConfineError):
    """A filter above this process has a listener already (corral inside corral's
    landlock tier): the kernel allows one per chain."""


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise ConfineError(f"{what}: {os.strerror(err)}")
    return result


def _prctl(option: int, arg2: int = 0, what: str = "prctl") -> int:
    return _check(
        _libc.prctl(option, ctypes.c_ulong(arg2), ctypes.c_ulong(0), ctypes.c_ulong(0), 0), what
    )


def _capability_words() -> dict[str, int]:
    words = {}
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("Cap"):
                key, value = line.split(":", 1)
                words[key] = int(value, 16)
    return words


def drop_capabilities() -> None:
    """Give up every capability for good (the landlock tier may be started by root).

    An ordinary user holds none, and no_new_privs keeps exec from granting any;
    root also empties its bounding set and locks the securebits that would give
    uid 0 capabilities back on exec."""
    words = _capability_words()
    if not (words.get("CapEff", 0) | words.get("CapPrm", 0) | words.get("CapAmb", 0)):
        return
    _libc.prctl(_PR_SET_SECUREBITS, ctypes.c_ulong(_SECUREBITS), 0, 0, 0)
    for cap in range(64):  # past the kernel's last capability this is EINVAL: harmless
        _libc.prctl(_PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0)
    _libc.prctl(_PR_CAP_AMBIENT, ctypes.c_ulong(_PR_CAP_AMBIENT_CLEAR_ALL), 0, 0, 0)
    header = ctypes.create_string_buffer(struct.pack("=Ii", _CAP_VERSION_3, 0))
    data = ctypes.create_string_buffer(bytes(24))  # two all-zero {eff, prm, inh} sets
    _check(_libc.capset(header, data), "capset")
    words = _capability_words()
    if words.get("CapEff", 0) | words.get("CapPrm", 0) | words.get("CapBnd", 0):
        raise ConfineError("capabilities could not be dropped")


def restrict(rules: Ruleset) -> None:
    """Apply a Landlock ruleset to this process and everything it starts."""
    attr = struct.pack("=QQQ", rules.handled_fs, rules.handled_net, rules.scoped)
    size = 8 if rules.abi < 4 else 16 if rules.abi < 6 else 24
    buf = ctypes.create_string_buffer(attr[:size])
    fd = _check(
        _libc.syscall(_SYS["landlock_create_ruleset"], buf, ctypes.c_size_t(size), 0),
        "landlock_create_ruleset",
    )
    try:
        for path, access in rules.paths:
            try:
                # O_PATH|O_NOFOLLOW: the rule lands on this very inode, never on
                # where a symlink planted since planning would lead.
                target = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError:
                continue  # gone since planning: nothing there to grant
            try:
                rule = ctypes.create_string_buffer(struct.pack("=Qi", access, target))
                _check(
                    _libc.syscall(_SYS["landlock_add_rule"], fd, 1, rule, 0),
                    f"landlock rule for {path}",
                )
            finally:
                os.close(target)
        for port, access in rules.ports:
            rule = ctypes.create_string_buffer(struct.pack("=QQ", access, port))
            _check(
                _libc.syscall(_SYS["landlock_add_rule"], fd, 2, rule, 0),
                f"landlock rule for port {port}",
            )
        _prctl(_PR_SET_NO_NEW_PRIVS, 1, "no_new_privs")
        _check(_libc.syscall(_SYS["landlock_restrict_self"], fd, 0), "landlock_restrict_self")
    finally:
        os.close(fd)


def install_seccomp(program: bytes, listen: bool = False) -> int:
    """Load a compiled classic-BPF filter (see :mod:`corral.seccomp`); with
    ``listen``, through seccomp(2) with a new listener, whose descriptor is
    returned (-1 otherwise)."""
    _prctl(_PR_SET_NO_NEW_PRIVS, 1, "no_new_privs")
    filt = ctypes.create_string_buffer(program)
    prog = ctypes.create_string_buffer(
        struct.pack("=HxxxxxxQ", len(program) // 8, ctypes.addressof(filt))
    )
    if not listen:
        _check(
            _libc.prctl(_PR_SET_SECCOMP, ctypes.c_ulong(_SECCOMP_MODE_FILTER), prog, 0, 0),
            "seccomp",
        )
        return -1
    nr = _SYS_SECCOMP[os.uname().machine]
    flags = ctypes.c_uint(_SECCOMP_FILTER_FLAG_NEW_LISTENER)
    fd = _libc.syscall(nr, ctypes.c_uint(_SECCOMP_SET_MODE_FILTER), flags, prog)
    if fd < 0 and ctypes.get_errno() == errno.EBUSY:
        raise ListenerBusy("seccomp: a listener exists already")
    return _check(fd, "seccomp")


def send_fd(channel: int, fd: int) -> None:
    """Pass ``fd`` over the unix socket ``channel`` (SCM_RIGHTS)."""
    import _socket

    sock = _socket.socket(fileno=channel)
    try:
        rights = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack("=i", fd))]
        sock.sendmsg([b"L"], rights)
    finally:
        sock.detach()


def receive_fd(channel: int) -> int | None:
    """The descriptor sent by :func:`send_fd`, or None when the other end closed
    without sending one."""
    import _socket

    sock = _socket.socket(fileno=channel)
    try:
        _, ancillary, _, _ = sock.recvmsg(1, _socket.CMSG_SPACE(4))
    finally:
        sock.detach()
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS and len(data) >= 4:
            return int(struct.unpack_from("=i", data)[0])
    return None


def apply(rules: Ruleset, seccomp_program: bytes, channel: int = -1) -> None:
    """Confine this process.  ``channel``: a unix socket to pass the seccomp
    filter's listener to the supervisor over (then closed here, before the
    command runs: the sandbox must never answer its own calls)."""
    drop_capabilities()
    restrict(rules)
    # last: it may deny what the steps above use
    if channel < 0:
        install_seccomp(seccomp_program)
        return
    listener = install_seccomp(seccomp_program, listen=True)
    try:
        send_fd(channel, listener)
    finally:
        os.close(listener)
        os.close(channel)


# --- the reaper ----------------------------------------------------------------


def _children_of(pids: set[int]) -> set[int]:
    """Processes whose parent is in ``pids`` (one pass over /proc)."""
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: parse after the last ')'
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) in pids:
            found.add(int(name))
    return found


def kill_descendants() -> None:
    """SIGKILL everything below this process until nothing is left.

    This process is a subreaper, so whatever a killed process leaves behind is
    reparented here and found by the next pass."""
    me = os.getpid()
    while True:
        reaped = False
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return  # no children: no descendants either
            if pid == 0:
                break
            reaped = True
        tree: set[int] = set()
        level = _children_of({me})
        while level:
            tree |= level
            level = _children_of(level) - tree
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if not tree and not reaped:
            # children exist but no list shows them yet (one read as it is made or
            # ends): look again shortly.  Waiting for any child to end instead would
            # hang on a live one no pass had seen, and the run with it (its pipes)
            time.sleep(0.001)


def _channel() -> tuple[int, int]:
    """A unix socket pair for the listener, the reaper's end and the command's."""
    import _socket

    ours, theirs = _socket.socketpair(
        _socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC
    )
    return ours.detach(), theirs.detach()


def _close_all_but(keep: int) -> None:
    if keep < 0:
        os.closerange(3, 65536)
        return
    os.closerange(3, keep)
    os.closerange(keep + 1, 65536)


def reaper(exec_command: object, parent: int, supervise: object = None) -> None:
    """Run in the launcher's forked child; never returns.

    ``exec_command`` is called in a further child, after confinement is applied
    by the caller's closure; it execs or exits.  Exit status mirrors the command's.
    ``supervise``: called as ``supervise(listener, pid)`` to serve the listener of
    the command's seccomp filter until the command ends, returning its wait
    status; ``exec_command`` is then given a unix socket to send the listener
    over (-1 without ``supervise``).
    """
    _prctl(_PR_SET_CHILD_SUBREAPER, 1, "subreaper")
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, "parent-death signal")

    class Stop(BaseException):  # not Exception: the supervisor refuses calls on those
        pass

    def on_term(_signum: int, _frame: object) -> None:
        raise Stop  # interrupts the blocking waitpid below

    status = None
    signal.signal(signal.SIGTERM, on_term)
    try:
        if os.getppid() != parent:  # corral died before the signal was armed
            raise Stop
        ours, theirs = -1, -1
        if supervise is not None:
            # The supervisor acts as the command's uid with no more power than it:
            # no capabilities (root's would let it chmod any file).  The command
            # drops them too; doing it before the fork leaves none to either.
            drop_capabilities()
            ours, theirs = _channel()
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                assert callable(exec_command)
                exec_command(theirs)
            finally:
                os._exit(125)
        # The reaper keeps no file open that the pump waits on.
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        _close_all_but(ours)
        listener = None
        if ours >= 0:
            listener = receive_fd(ours)  # None: the command was never confined with one
            os.close(ours)
        if listener is not None:
            assert callable(supervise)
            status = supervise(listener, pid)
        while status is None:
            try:
                done, st = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if done == pid:
                status = st
    except Stop:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the sweep below must finish
    kill_descendants()
    if status is None:
        os._exit(128 + signal.SIGKILL)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL and SIGSTOP cannot have handlers: they are default already
        os.kill(os.getpid(), sig)  # die the way the command died
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 125)
