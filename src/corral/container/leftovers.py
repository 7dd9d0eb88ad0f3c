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
    found = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc}/{entry}/cmdline", "rb") as fh:
                raw = fh.read(1 << 16)
        except OSError:
            continue  # gone, or a kernel thread
        if raw:
            found[int(entry)] = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    return found


def container_ids(name: str, argvs: dict[int, list[str]]) -> set[str]:
    """The IDs conmon gives for container ``name`` (pure: ``argvs`` is pid -> argv)."""
    ids = set()
    for argv in argvs.values():
        if not argv or os.path.basename(argv[0]) != "conmon":
            continue
        pairs = dict(itertools.pairwise(argv))
        if pairs.get("-n") == name and pairs.get("-c"):
            ids.add(pairs["-c"])
    return ids


def holders(ids: set[str], argvs: dict[int, list[str]]) -> list[int]:
    """The pids whose arguments carry one of ``ids`` (pure)."""
    return sorted(pid for pid, argv in argvs.items() if any(i in a for a in argv for i in ids))


def runtime_roots(pids: list[int], argvs: dict[int, list[str]]) -> set[str]:
    """The runtimes' state directories (``--root=DIR``) named by those processes."""
    roots = set()
    for pid in pids:
        for arg in argvs.get(pid, []):
            if arg.startswith("--root="):
                roots.add(arg.removeprefix("--root="))
    return roots


def find(name: str) -> tuple[set[str], list[int], set[str]]:
    """Container ``name``'s IDs, the processes left for it, and the runtime roots."""
    argvs = _argvs()
    ids = container_ids(name, argvs)
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
