"""Runs in progress, so that no run loads a policy file another one could have written.

A workspace's ``corral.toml`` is write-protected for a run when it exists at
launch; one the run makes is quarantined when the run ends.  Until then it is
on disk, and a run that lasts (a ``Sandbox``, ``corral mcp``, an agent under
``corral run``) could write one that a second run started meanwhile loads
without asking: its secrets readable, its network open.

So each run leaves a marker in corral's state directory while it lives
(``live/<run id>``: the pid, the run's start as the file system's clock has
it, and the real paths it may write), removed at its end after the
quarantine, by corral or by its guardian when corral is killed.  The marker is
held under a shared ``flock`` by corral and the guardian: a marker no process
holds any more (both were killed) is stale, ignored and removed.  Before a run
loads a policy file it found itself (never one named with ``--policy``), it
refuses one that lies in a live run's writable place and was made or changed
(its change time, which no process can set back) since that run started.

Cost on the hot path: registering is an open, a lock, a write and an unlink;
checking happens only when a policy file exists, and is one listing of a
usually empty directory.
"""

from __future__ import annotations

import os

from corral import runlog

LIVE = "live"
_OPEN = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW


def live_dir() -> str:
    return os.path.join(runlog.state_dir(), LIVE)


class Marker:
    """One live run's marker: its path, and the descriptor holding its lock."""

    __slots__ = ("fd", "owner", "path", "start")

    def __init__(self, path: str, fd: int, start: int) -> None:
        self.path = path
        self.fd = fd
        self.start = start  # ns, the file system's clock (the marker's own change time)
        self.owner = os.getpid()

    def remove(self) -> None:
        """The run is over (and its quarantine done): no longer live.  In the
        guardian (a fork) the descriptor is the guardian's own copy, under
        another number: its exit lets go of that one."""
        if self.fd < 0:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        if os.getpid() == self.owner:
            os.close(self.fd)
        self.fd = -1


def register(run_id: str, places: list[str]) -> Marker | None:
    """Mark a run live, with ``places`` (real paths) it may write; None when the
    state directory cannot take the marker (as the activity log then, the run
    goes on: nothing else could then read one either)."""
    import fcntl

    path = os.path.join(live_dir(), run_id)
    try:
        try:
            fd = os.open(path, _OPEN, 0o600)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            fd = os.open(path, _OPEN, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        # the clock change times are read from: a file made after this has one as late
        start = os.fstat(fd).st_ctime_ns
        text = "\0".join((f"{os.getpid()} {start}", *places))
        os.write(fd, text.encode("utf-8", "surrogateescape"))
    except OSError:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
        return None
    return Marker(path, fd, start)


class LiveRun:
    """What a marker says."""

    __slots__ = ("pid", "places", "start")

    def __init__(self, pid: int, start: int, places: list[str]) -> None:
        self.pid = pid
        self.start = start
        self.places = places


def live_runs() -> list[LiveRun]:
    """The runs in progress (for this user); stale markers removed on the way."""
    directory = live_dir()
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    if not names:
        return []
    import fcntl

    found = []
    for name in names:
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue  # (ended meanwhile)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                data = os.read(fd, 1 << 20)
            else:  # no process holds it: its run and guardian were both killed
                try:
                    os.unlink(path)
                except OSError:
                    pass
                continue
        except OSError:
            continue
        finally:
            os.close(fd)
        head, *places = data.decode("utf-8", "surrogateescape").split("\0")
        pid, _, start = head.partition(" ")
        if pid.isdigit() and start.isdigit():
            found.append(LiveRun(int(pid), int(start), places))
    return found


def _inside(path: str, place: str) -> bool:
    return path == place or path.startswith(place.rstrip("/") + "/")


def planted_by(path: str) -> LiveRun | None:
    """The live run that could have written the policy file ``path`` (the file
    itself, or what it leads to, made or changed in its writable places since it
    started), or None."""
    runs = live_runs()
    if not runs:
        return None
    seen = []
    try:
        seen.append((os.path.abspath(path), os.lstat(path).st_ctime_ns))
        seen.append((os.path.realpath(path), os.stat(path).st_ctime_ns))
    except OSError:
        pass
    for run in runs:
        for where, changed in seen:
            if changed >= run.start and any(_inside(where, p) for p in run.places if p):
                return run
    return None


def refusal(path: str, run: LiveRun) -> str:
    """The one line that says why ``path`` is not loaded, and what to do."""
    import time

    since = time.strftime("%H:%M:%S", time.localtime(run.start / 1e9))
    return (
        f"{path} was made or changed after {since}, where the run in progress since "
        f"then (corral pid {run.pid}) can write: that run may have written it, so it "
        "is not loaded; if it is yours, review it and name it (--policy FILE, or "
        "Sandbox(policy=FILE)), or wait for that run to end"
    )
