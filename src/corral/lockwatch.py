"""Writes refused on read-only git files, seen from outside the sandbox.

git writes a file F (``.git/config``) by creating ``F.lock`` beside it, writing
that, and renaming it over F.  Where F is a read-only bind (a write-deny path
on the namespace and container tiers) the rename fails with EBUSY, which git
prints as "could not write config file .git/config: Device or resource busy",
and git removes the lock.  An inotify watch on F's directory, set before the
sandbox starts, sees the lock appear (IN_CREATE) and go (IN_DELETE) without
ever being renamed (IN_MOVED_FROM): that is a refused write, named after the
run.  A lock still there at the end counts too (the writer gave up or died).

What this does not see: a write that opens a protected path itself
(``echo x >> .git/config``, ``cp hook .git/hooks/pre-commit``) fails with EROFS
inside the kernel before anything reaches the disk, so no watch can see it;
the command itself gets "Read-only file system" naming the path.  Seeing those
would take a syscall supervisor (seccomp user notification or fanotify
permission events) on every open of the run.

inotify has no binding in the standard library; the libc calls go through
corral's own C module (``corral._sys``) or, when it was not built, through
``_ctypes`` directly (0.3 ms to import, against 1.5 ms for ``ctypes``),
and only for runs in a git repository.  Tearing an inotify instance down
waits for an RCU grace period (about 14 ms here): corral's guardian process
holds the last reference, so that wait is its exit's, not the run's.  The
watch reports what happens in those directories, by anyone: a git on the host failing in the same
repository during the run would be named too.  The kernel queues 16384
events per watch; a long-lived sandbox busy in ``.git`` beyond that between
two reads loses the newest (git makes a handful per command there).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.report import Denial

IN_MOVED_FROM = 0x40
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_HEADER = 16  # int wd, uint32 mask, cookie, len


def _libc(name: str, *args: int | bytes) -> int:
    """Call a libc function taking ints and C strings; -1 if it cannot be called.
    Through corral's C module when it was built, else ctypes' C module."""
    try:
        from corral import _sys
    except ImportError:
        pass
    else:
        try:
            result: int = getattr(_sys, name)(*args)
        except OSError:
            return -1
        return result
    try:
        import _ctypes

        libc = _ctypes.dlopen(None)  # type: ignore[arg-type]  # NULL: the process itself
        address = _ctypes.dlsym(libc, name)
        result = _ctypes.call_function(address, args)
        return result
    except (ImportError, AttributeError, OSError):
        return -1


def parse_events(data: bytes) -> list[tuple[int, int, str]]:
    """(watch descriptor, mask, name) for each event in one read of an inotify fd."""
    events = []
    at = 0
    while at + _HEADER <= len(data):
        wd = int.from_bytes(data[at : at + 4], "little", signed=True)
        mask = int.from_bytes(data[at + 4 : at + 8], "little")
        size = int.from_bytes(data[at + 12 : at + 16], "little")
        raw = data[at + _HEADER : at + _HEADER + size]
        events.append((wd, mask, raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")))
        at += _HEADER + size
    return events


class LockWatch:
    """Watches ``{directory: {lock name: protected path}}`` from before the sandbox
    starts until :meth:`finish`."""

    def __init__(self, watches: dict[str, dict[str, str]]) -> None:
        self.locks: dict[int, tuple[str, dict[str, str]]] = {}  # wd -> (dir, locks)
        self.created: dict[str, int] = {}  # protected path -> locks made
        self.replaced: dict[str, int] = {}  # protected path -> locks renamed over it
        self.fd = _libc("inotify_init1", IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            return  # no inotify here: refused lock writes go unnamed
        mask = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_ONLYDIR | IN_DONT_FOLLOW
        for directory, locks in watches.items():
            wd = _libc("inotify_add_watch", self.fd, os.fsencode(directory), mask)
            if wd >= 0:
                self.locks[wd] = (directory, locks)

    def drain(self) -> None:
        """Take the events queued so far (the kernel keeps 16384 per instance)."""
        while self.fd >= 0:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                return
            if not data:
                return
            for wd, mask, name in parse_events(data):
                watched = self.locks.get(wd)
                if watched is None or name not in watched[1]:
                    continue
                path = watched[1][name]
                if mask & IN_CREATE:
                    self.created[path] = self.created.get(path, 0) + 1
                elif mask & IN_MOVED_FROM:
                    self.replaced[path] = self.replaced.get(path, 0) + 1

    def finish(self) -> list[Denial]:
        """The refused writes seen, once the sandbox is gone; closes the watch."""
        from corral.report import refused_write

        self.drain()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        said = []
        for directory, locks in self.locks.values():
            for name, path in locks.items():
                refused = self.created.get(path, 0) - self.replaced.get(path, 0)
                if refused > 0:
                    said.append(refused_write(path, os.path.join(directory, name), refused))
        return said
