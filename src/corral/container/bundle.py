"""The host's Python, made runnable inside any image: corral's own processes
(the boot step, the relay, the agent) need a Python, and an image may have
none, or a different libc.

Chosen over a static relay (nothing here can build one, and a relay alone
would not serve the agent) and over "the image must have python3": the
interpreter running corral, its standard library and the directories of the
shared libraries it has loaded are bound read-only at ``/run/corral/py``, and
run through the host's own dynamic loader (``ld.so --library-path ...``), so
the image's libc and loader are never used.  Only corral's processes use it;
the command runs on the image's own files.
"""

from __future__ import annotations

import functools
import os
import sys

from corral.fsplan import Mount

ROOT = "/run/corral/py"


class Bundle:
    __slots__ = ("argv", "mounts")

    def __init__(self, argv: list[str], mounts: list[Mount]) -> None:
        self.argv = argv  # the interpreter inside: loader, library path, python
        self.mounts = mounts


def _loaded_libraries(maps: str = "/proc/self/maps") -> list[str]:
    found: list[str] = []
    with open(maps, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            parts = line.split(None, 5)
            if len(parts) == 6:
                path = parts[5].strip()
                name = os.path.basename(path)
                if path.startswith("/") and ".so" in name and path not in found:
                    found.append(path)
    return found


@functools.cache
def host_bundle() -> Bundle:
    """Mounts and argv for the Python running this process."""
    exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable) or sys.executable)
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    stdlib = os.path.realpath(os.path.join(sys.base_prefix, "lib", version))
    if not os.path.exists(os.path.join(stdlib, "os.py")):  # an unusual layout: ask
        import sysconfig  # (costs milliseconds: only when the usual place is wrong)

        stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    lib_dirs: list[str] = []
    loader = ""
    for path in _loaded_libraries():
        real = os.path.realpath(path)
        if real.startswith(stdlib + "/") or "-packages/" in real:
            continue  # extension modules: found through the standard library's own tree
        if os.path.basename(real).startswith(("ld-linux", "ld-musl")):
            loader = real
        if os.path.dirname(real) not in lib_dirs:
            lib_dirs.append(os.path.dirname(real))
    mounts = [
        Mount("ro-bind", f"{ROOT}/bin/{version}", exe, "corral's interpreter (host Python)"),
        Mount("ro-bind", f"{ROOT}/lib/{version}", stdlib, "its standard library"),
    ]
    inside_dirs = []
    for n, d in enumerate(lib_dirs):
        inside = f"{ROOT}/so{n}"
        inside_dirs.append(inside)
        mounts.append(Mount("ro-bind", inside, d, "shared libraries of corral's interpreter"))
    python = f"{ROOT}/bin/{version}"
    if not loader:  # a static interpreter: it needs no loader
        return Bundle([python], mounts)
    inner_loader = (
        f"{inside_dirs[lib_dirs.index(os.path.dirname(loader))]}/{os.path.basename(loader)}"
    )
    return Bundle([inner_loader, "--library-path", ":".join(inside_dirs), python], mounts)
