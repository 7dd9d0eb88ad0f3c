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

A run that has ended is not done with either: what it wrote where the check
after it does not look (past the walk's bounds, in a ``node_modules``, behind a
link, or moved there later by another run) stays.  So a marker's removal (by
corral, by the guardian, or a stale one when found) appends the run to a
journal, ``live/ended.jsonl``: its id, pid, start, end (``time.time_ns()``, never
before a change time the run made) and places; a found policy file changed
within an ended run's [start, end] in its places is refused just as well,
until the user, having reviewed it, touches it (its change time then after
every ended run) or names it.  The journal keeps the last JOURNAL_KEEP runs of
the last 30 days (rewritten when it passes JOURNAL_MAX bytes).

Cost on the hot path: registering is an open, a lock, a write and an unlink;
ending one an append to the journal; checking happens only when a policy file
exists, and is one listing of a usually near-empty directory and one read of
the journal, whose lines are parsed only when the file's change time lies in
their window.
"""

from __future__ import annotations

import os
import time

from corral import runlog
from corral.paths import inside

LIVE = "live"
JOURNAL = "ended.jsonl"  # in the live directory: the runs that have ended
JOURNAL_MAX = 1 << 20  # bytes, past which it is rewritten with
JOURNAL_KEEP = 512  # the last runs
JOURNAL_DAYS = 30  # that ended this recently
_OPEN = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
_WINDOW = rb'\{"start": (\d+), "end": (\d+), '  # (compiled where read: _window)


def _window(line: bytes) -> tuple[int, int] | None:
    """A journal line's (start, end), or None."""
    import re

    found = re.match(_WINDOW, line)
    return (int(found[1]), int(found[2])) if found is not None else None


def live_dir() -> str:
    return os.path.join(runlog.state_dir(), LIVE)


def journal_path() -> str:
    return os.path.join(live_dir(), JOURNAL)


def _ended(
    run_id: str, pid: int, start: int, places: list[str], kept: dict[str, int] | None = None
) -> None:
    """Journal a run that has just ended (its marker removed by the caller);
    ``kept``: the policy files corral itself put back after it (real path: change
    time then), which are the user's, whatever their change time says."""
    end = time.time_ns()  # later than any change time the run made (the fs clock lags it)
    said: dict[str, object] = {"run": run_id, "pid": pid, "places": places}
    if kept:
        said["kept"] = kept
    # the window first, spaced as ended_runs reads it at fixed places; the rest in
    # runlog's encoder (json pulls in re: neither is on a run's hot path)
    line = f'{{"start": {start}, "end": {end}, ' + runlog.dumps(said)[1:]
    _append((line + "\n").encode("utf-8", "surrogateescape"))


def _append(line: bytes) -> None:
    import fcntl

    path = journal_path()
    for _ in range(3):
        try:
            fd = os.open(path, _APPEND, 0o600)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            try:
                now = os.stat(path, follow_symlinks=False)
            except OSError:
                continue
            if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
                continue  # rewritten meanwhile: append to the new one
            os.write(fd, line)
            if held.st_size + len(line) > JOURNAL_MAX:
                _trim(path)
            return
        except OSError:
            return
        finally:
            os.close(fd)


def _trim(path: str) -> None:
    """Rewrite the journal (its lock held) with its last recent lines."""
    with open(path, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    oldest = time.time_ns() - JOURNAL_DAYS * 86400 * 10**9
    kept = []
    for line in lines[-JOURNAL_KEEP:]:
        window = _window(line)
        if window is not None and window[1] >= oldest and line.endswith(b"\n"):
            kept.append(line)
    new = path + ".new"
    try:
        os.unlink(new)
    except FileNotFoundError:
        pass
    fd = os.open(new, _OPEN, 0o600)
    try:
        os.write(fd, b"".join(kept))
    finally:
        os.close(fd)
    os.replace(new, path)


class Marker:
    """One live run's marker: its path, and the descriptor holding its lock."""

    __slots__ = ("fd", "kept", "owner", "path", "places", "start")

    def __init__(self, path: str, fd: int, start: int, places: list[str]) -> None:
        self.path = path
        self.fd = fd
        self.start = start  # ns, the file system's clock (the marker's own change time)
        self.places = places
        self.owner = os.getpid()
        self.kept: dict[str, int] = {}  # see keep()

    def keep(self, restored: list[str]) -> None:
        """The paths corral put back after the run (landlock's write-deny paths:
        their content as at launch), with their change times now: the restore
        changed them, within the run's window, and they are the user's (a policy
        file, a named one, a ``[tls]`` file: each is checked when loaded)."""
        for path in restored:
            try:
                self.kept[os.path.realpath(path)] = os.stat(path).st_ctime_ns
            except OSError:
                pass

    def remove(self) -> None:
        """The run is over (and its quarantine done): no longer live, journaled
        as ended (by whoever removes the marker: once).  In the guardian (a
        fork) the descriptor is the guardian's own copy, under another number:
        its exit lets go of that one."""
        if self.fd < 0:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        else:
            _ended(os.path.basename(self.path), self.owner, self.start, self.places, self.kept)
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
    return Marker(path, fd, start, places)


class LiveRun:
    """What a marker says (``end`` None), or a line of the journal of ended runs."""

    __slots__ = ("end", "kept", "pid", "places", "run_id", "start")

    def __init__(
        self, pid: int, start: int, places: list[str], run_id: str = "", end: int | None = None
    ) -> None:
        self.pid = pid
        self.start = start
        self.places = places
        self.run_id = run_id
        self.end = end
        self.kept: dict[str, int] = {}  # policy files corral put back (Marker.keep)


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
        if name == JOURNAL or name == JOURNAL + ".new":
            continue
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
                data = os.read(fd, 1 << 20)
                try:
                    os.unlink(path)
                except OSError:
                    continue
                run = _parse(data, name)
                if run is not None:  # ended: as far as anyone can tell, now
                    _ended(name, run.pid, run.start, run.places)
                continue
        except OSError:
            continue
        finally:
            os.close(fd)
        run = _parse(data, name)
        if run is not None:
            found.append(run)
    return found


def _parse(data: bytes, name: str) -> LiveRun | None:
    head, *places = data.decode("utf-8", "surrogateescape").split("\0")
    pid, _, start = head.partition(" ")
    if pid.isdigit() and start.isdigit():
        return LiveRun(int(pid), int(start), places, name)
    return None


def ended_runs(changed: list[int]) -> list[LiveRun]:
    """The journaled ended runs whose window holds one of the ``changed`` times
    (only those lines are parsed)."""
    try:
        with open(journal_path(), "rb") as f:
            data = f.read()
    except OSError:
        return []
    if not data or not changed:
        return []
    import json

    # the times are 19 digits (2001 to 2286): compared as they are written, as bytes
    lo, hi = b"%019d" % min(changed), b"%019d" % max(changed)
    found = []
    for line in data.split(b"\n"):
        fixed = line[29:38] == b', "end": ' and line[57:59] == b", "
        if fixed and (line[10:29] > hi or line[38:57] < lo):  # most lines: out cheaply
            continue
        window = _window(line)
        if window is None:
            continue
        start, end = window
        if not any(start <= c <= end for c in changed):
            continue
        try:
            said = json.loads(line.decode("utf-8", "surrogateescape"))
            run = LiveRun(int(said["pid"]), start, list(said["places"]), str(said["run"]), end)
            run.kept = {str(k): int(v) for k, v in dict(said.get("kept", {})).items()}
        except (ValueError, KeyError, TypeError):
            continue
        found.append(run)
    return found


def planted_by(path: str, read: int | None = None) -> tuple[LiveRun, str] | None:
    """The run, live or ended, that could have written the policy file ``path``
    (the file itself, or what it leads to, made or changed in its writable
    places since it started, and before it ended), and which of the two it
    wrote; or None.  ``read``: the change time of the file the caller read
    (fstat of its descriptor): a run swapping directories made the path name
    the user's file when checked and its own when read (found by attacking
    corral), so what was read is checked too."""
    seen = []
    try:
        seen.append((os.path.abspath(path), os.lstat(path).st_ctime_ns))
        seen.append((os.path.realpath(path), os.stat(path).st_ctime_ns))
    except OSError:
        pass
    if read is not None:
        seen.append((os.path.abspath(path), read))
    runs = live_runs()  # first: a stale marker found on the way is journaled
    runs += ended_runs([changed for _, changed in seen])
    for run in runs:
        for where, changed in seen:
            during = run.start <= changed and (run.end is None or changed <= run.end)
            if run.kept.get(os.path.realpath(where)) == changed:
                continue  # as corral put it back after that run: the user's
            if during and any(inside(where, p) for p in run.places if p):
                return run, where
    return None


def refusal(
    path: str, run: LiveRun, where: str = "", named: bool = False, pinned: bool = True
) -> str:
    """The one line that says why ``path`` is not loaded, and what to do
    (``where``: the file that run could have changed, the link or its target;
    ``named``: a file the caller named, whose content it may pin instead, if
    ``pinned``: a policy file; a ``[tls]`` file it names cannot be)."""

    def clock(ns: int) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))

    name_it = "name it (--policy FILE, or Sandbox(policy=FILE))"
    if named:  # named already: what is left is to vouch for what it holds
        name_it = (
            f"pin what it holds (--policy-sha256 HEX, or Policy.load(FILE, sha256=HEX);"
            f" HEX: sha256sum {path})"
            if pinned
            else ""
        )
    since = time.strftime("%H:%M:%S", time.localtime(run.start / 1e9))
    if run.end is not None:
        where = where or path
        touch = f"touch -h {where}" if os.path.islink(where) else f"touch {where}"
        which = "it" if where == os.path.abspath(path) else f"what it leads to ({where})"
        return (
            f"{path}: {which} was made or changed between {clock(run.start)} and "
            f"{clock(run.end)}, where run {run.run_id} (corral pid {run.pid}), since "
            "ended, could write: that run may have written it, so it is not loaded; "
            f"if it is yours, review it, then `{touch}` (its change time is then after "
            f"that run){' or ' + name_it if name_it else ''}"
        )
    return (
        f"{path} was made or changed after {since}, where the run in progress since "
        f"then (corral pid {run.pid}) can write: that run may have written it, so it "
        f"is not loaded; if it is yours, review it{' and ' + name_it if name_it else ''}, "
        "or wait for that run to end"
    )
