"""Ending what a container's runtime left running when the engine could not.

``podman rm --force`` drops the record of a container whose runtime hangs
before the container starts (``runsc create`` waiting on its gofer) and
leaves conmon, the runtime and gVisor's gofer and sandbox running, with the
runtime's lock held.  The processes are found by the container's ID: conmon
names the container (``-n NAME``) and its ID (``-c ID``), and every runtime
process below it carries the ID in its arguments.
"""

from __future__ import annotations

import itertools
import os
import signal


def _argvs(proc: str = "/proc") -> dict[int, list[str]]:
    """pid -> argv of this user's processes only: the engine runs as this user, and
    another user could name anything in a process of its own (a fake conmon that
    names this run's container, ``-c`` any value, ``--root`` any directory)."""
    found = {}
    me = os.geteuid()
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"{proc}/{entry}").st_uid != me:
                continue
            with open(f"{proc}/{entry}/cmdline", "rb") as fh:
                raw = fh.read(1 << 16)
        except OSError:
            continue  # gone, or a kernel thread
        if raw:
            found[int(entry)] = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    return found


def _is_id(value: str) -> bool:
    """A container ID as podman and docker make them: 64 lower-case hex digits."""
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def container_ids(
    name: str, argvs: dict[int, list[str]], exes: dict[int, str] | None = None
) -> set[str]:
    """The IDs conmon gives for container ``name`` (pure: ``argvs`` is pid -> argv,
    ``exes`` pid -> the program's file name, when known).  Only a process that is
    conmon (its program, not just its argv[0]) and an ID of the engine's form:
    a process that merely called itself conmon and named the run's container
    (the name is in the engine's argv, for anyone to see) chose what the sweep
    would kill and remove."""
    ids = set()
    for pid, argv in argvs.items():
        if not argv or os.path.basename(argv[0]) != "conmon":
            continue
        if exes is not None and exes.get(pid) != "conmon":
            continue
        pairs = dict(itertools.pairwise(argv))
        if pairs.get("-n") == name and _is_id(pairs.get("-c", "")):
            ids.add(pairs["-c"])
    return ids


def _carries(arg: str, ident: str) -> bool:
    """Whether an argument names the container ``ident``: as itself, an option's
    value, or a path component (never as any substring: ``-c /`` matched all)."""
    return arg == ident or arg.endswith(("=" + ident, "/" + ident)) or f"/{ident}/" in arg


def holders(ids: set[str], argvs: dict[int, list[str]]) -> list[int]:
    """The pids whose arguments name one of ``ids`` (pure)."""
    return sorted(
        pid for pid, argv in argvs.items() if any(_carries(a, i) for a in argv for i in ids)
    )


def runtime_roots(pids: list[int], argvs: dict[int, list[str]]) -> set[str]:
    """The runtimes' state directories (``--root=DIR``) named by those processes."""
    roots = set()
    for pid in pids:
        for arg in argvs.get(pid, []):
            root = arg.removeprefix("--root=")
            if arg.startswith("--root=") and os.path.isabs(root) and ".." not in root.split("/"):
                roots.add(root)
    return roots


def _exes(pids: list[int]) -> dict[int, str]:
    """pid -> the file name of the program it runs (its /proc exe link)."""
    found = {}
    for pid in pids:
        try:
            found[pid] = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            continue
    return found


def find(name: str) -> tuple[set[str], list[int], set[str]]:
    """Container ``name``'s IDs, the processes left for it, and the runtime roots."""
    argvs = _argvs()
    conmons = [pid for pid, argv in argvs.items() if argv and argv[0].endswith("conmon")]
    ids = container_ids(name, argvs, _exes(conmons))
    pids = holders(ids, argvs)
    return ids, pids, runtime_roots(pids, argvs)


def end(ids: set[str], pids: list[int], roots: set[str]) -> None:
    """SIGKILL the processes, then remove the runtime's state and lock files for
    those IDs (their holder is dead, so nothing else will)."""
    me = os.getpid()
    for pid in pids:
        if pid != me:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    for root in roots:
        try:
            names = os.listdir(root)
        except OSError:
            continue
        for entry in names:
            if any(entry.startswith(i) for i in ids):
                try:
                    os.unlink(os.path.join(root, entry))
                except OSError:
                    pass  # a directory, or already gone
