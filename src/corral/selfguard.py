"""What corral runs on the host must not lie where the sandbox can write.

A run writes in its workspace (and the policy's writable paths, and its home
layer).  If corral's own code, the Python it runs in, a directory on its import
path or a program it starts (bwrap, podman and its runtime, QEMU) lies there, a
sandboxed command can change what corral runs on the host next: a wrapper
``bwrap`` in the workspace's ``.venv/bin`` (on PATH in an activated venv), an
edited ``src/corral`` in a checkout corral was installed from in place, a
``heapq.py`` beside the script of an app that holds a ``Sandbox`` (its
directory comes first on the import path, and corral imports some modules
only when it needs them).  All found by attacking corral.  Such a run is
refused with one line that says what lies where, and what to do.

Cost on the hot path: a few ``realpath`` calls, once per process.
"""

from __future__ import annotations

import os
import sys

from corral.paths import inside

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

REMEDY = (
    "install corral outside it (README: Installing it for use), start it as `corral`, "
    "not `python -m corral` in the workspace, and keep the app that uses it elsewhere"
)
PROGRAM_REMEDY = "check it, then take its directory off PATH (or delete it)"
_seen: dict[tuple[str, ...], list[tuple[str, str]]] = {}


def refusal(places: Sequence[str], argv: Sequence[str]) -> str | None:
    """Why this run must not start (corral's code, Python, import path or a
    program of ``argv`` lies in one of ``places``, all real paths), or None."""
    roots = [p for p in places if p]
    for what, real in [*_runtime(), *_programs(argv)]:
        for root in roots:
            if inside(real, root):
                remedy = PROGRAM_REMEDY if what == "the program" else REMEDY
                return f"{what} {real} lies where the sandbox can write ({root}): {remedy}"
    return None


def _runtime() -> list[tuple[str, str]]:
    """(what, real path) of corral's code, its Python and its import path."""
    key = (os.getcwd(), *sys.path)
    found = _seen.get(key)
    if found is None:
        import corral

        found = [
            ("corral's code", os.path.realpath(os.path.dirname(os.path.dirname(corral.__file__)))),
            ("the Python corral runs in", os.path.realpath(sys.prefix)),
        ]
        # ("" is the current directory: python -m, python -c, an interactive session)
        found += [("a directory on its import path,", os.path.realpath(p or ".")) for p in sys.path]
        _seen[key] = found
    return found


def _programs(argv: Sequence[str]) -> list[tuple[str, str]]:
    """The host programs a plan's argv starts: its first word, and a container
    engine's ``--runtime``."""
    named = [argv[0]] if argv else []
    named += [argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "--runtime"]
    return [("the program", os.path.realpath(p)) for p in named if os.path.isabs(p)]
