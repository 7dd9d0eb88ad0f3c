"""The Python a Sandbox's agent runs on in the guest, carried in its initramfs.

A Python start costs the guest 0.4-0.8 s under TCG, and a restored guest has an
empty page cache, so the interpreter and every module come over 9p again: most
of a ``Sandbox(tier="microvm")``'s start was its agent starting.  A saved state
cannot hold a process that uses the host's view (QEMU refuses to migrate a
mounted 9p export), so a Sandbox's machine carries the agent's interpreter in
its initramfs: the init starts the agent before the state is saved, it imports
what it needs and waits; a restored guest's agent only enters the view
(chroot), takes the caller's ids and environment, and serves
(:func:`corral.agent.wait_for_go`).

Which files: what the interpreter maps and the modules it has imported once it
has read ``agent.py``'s imports, found by running it on the host
(:data:`PROBE`), with the shared libraries where ``ldd`` says the loader finds
them.  Each goes into the initramfs at its host path, with its host mtime (a
module's cached bytecode stays valid): once the agent has entered the view, a
module it imports late is the host's own file at the same path.

Preferred interpreter: ``/usr/bin/python3`` (Debian links its libpython
statically: 7 MB in one file, against 30 MB for a shared build such as
pyenv's); else the one the tier runs the agent with.  The file list is cached
per interpreter and ``agent.py`` (by their identity), so a plan reads it, not a
Python start.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

from corral.vm.snapshot import identity as _identity

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

FORMAT = "1"  # bumped when what is gathered changes
MIN_VERSION = (3, 11)  # corral's own floor: the agent is corral's code
PREFERRED = "/usr/bin/python3"

# Run by the candidate interpreter with -I -S: agent.py's module-level code (its
# imports and definitions; its main() only runs as __main__), the module it
# imports late (_ctypes, for prctl), then what the process maps and imported.
PROBE = r"""
import sys
if sys.version_info < tuple(int(v) for v in sys.argv[2].split(".")):
    raise SystemExit(3)
with open(sys.argv[1], "rb") as fh:
    exec(compile(fh.read(), sys.argv[1], "exec"), {"__name__": "corral_agent_probe"})
import _ctypes, json
mods = []
for m in list(sys.modules.values()):
    for attr in ("__file__", "__cached__"):
        p = getattr(m, attr, None)
        if isinstance(p, str) and p.startswith("/"):
            mods.append(p)
with open("/proc/self/maps") as fh:
    maps = sorted({l.split(None, 5)[5].strip() for l in fh if l.count(" ") >= 5 and "/" in l})
print(json.dumps({"python": sys.executable, "modules": sorted(set(mods)), "maps": maps}))
"""


class Closure:
    """The files an agent's Python needs: ``files`` (path in the guest, host path
    to read) and ``libdirs``, the directories its loader searches (LD_LIBRARY_PATH:
    the initramfs has no ld.so.cache)."""

    __slots__ = ("files", "libdirs", "python")

    def __init__(self, python: str, files: Sequence[tuple[str, str]], libdirs: Sequence[str]):
        self.python = python
        self.files = list(files)
        self.libdirs = list(libdirs)


def parse_ldd(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """ldd's output for several files: (path the loader opens, real path) for every
    library and program interpreter, and the names it could not find."""
    found: list[tuple[str, str]] = []
    missing: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not raw.startswith(("\t", " ")) or not line:
            continue  # "file:" headers
        name, arrow, rest = line.partition(" => ")
        if arrow:
            path = rest.split(" (", 1)[0].strip()
            if path == "not found":
                missing.append(name)
            elif path.startswith("/"):
                found.append((path, path))
        elif line.startswith("/"):  # the program interpreter: "/lib64/ld-linux... (0x...)"
            found.append((line.split(" (", 1)[0], line.split(" (", 1)[0]))
    return found, missing


def entries(probed: dict[str, list[str] | str], ldd: str) -> Closure | str:
    """The closure from the probe's answer and ldd's output for its ELF files (pure),
    or why it cannot be used."""
    python = str(probed["python"])
    libs, missing = parse_ldd(ldd)
    if missing:
        return f"the loader does not find {', '.join(sorted(set(missing)))}"
    files: dict[str, str] = {python: python}
    for path in probed["modules"]:
        files[path] = path
    for path in probed["maps"]:
        if "/lib-dynload/" in path:  # extension modules: the rest is ldd's
            files[path] = path
    for guest_path, host_path in libs:
        files[guest_path] = host_path
    libdirs = sorted({os.path.dirname(g) for g, _ in libs if "/ld-linux" not in g})
    return Closure(python, sorted(files.items()), libdirs)


def elf_files(probed: dict[str, list[str] | str]) -> list[str]:
    """The interpreter and the extension modules it loaded: what ldd reads."""
    so = [p for p in probed["maps"] if "/lib-dynload/" in p]
    return [str(probed["python"]), *so]


def candidates(tier_python: str) -> list[str]:
    found = [os.path.realpath(PREFERRED)] if os.path.exists(PREFERRED) else []
    real = os.path.realpath(tier_python)
    return found + ([real] if real not in found else [])


def _probe(python: str, agent: str) -> dict[str, list[str] | str] | str:
    version = ".".join(str(v) for v in MIN_VERSION)
    try:
        proc = subprocess.run(
            [python, "-I", "-S", "-c", PROBE, agent, version],
            capture_output=True,
            text=True,
            timeout=30,
            env={},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python}: {exc}"
    if proc.returncode == 3:
        return f"{python} is older than Python {version}"
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no reason given"])[-1]
        return f"{python} cannot read the agent: {tail}"
    answer: dict[str, list[str] | str] = json.loads(proc.stdout)
    return answer


def _ldd(paths: Sequence[str]) -> str:
    proc = subprocess.run(
        ["ldd", *paths], capture_output=True, text=True, timeout=30, env={"LC_ALL": "C"}
    )
    return proc.stdout


def gather(tier_python: str, agent: str, cache: str) -> Closure | str:
    """The closure of the first candidate interpreter that can run the agent (read
    from the cache when it has this interpreter's and agent's), or why none can."""
    why = "no Python found"
    for python in candidates(tier_python):
        try:
            key = f"{FORMAT}|{_identity(python)}|{_identity(agent)}"
        except OSError as exc:
            why = f"{python}: {exc.strerror}"
            continue
        name = f"python-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
        path = os.path.join(cache, name)
        try:
            with open(path, encoding="utf-8") as fh:
                kept = json.load(fh)
            return Closure(kept["python"], [tuple(f) for f in kept["files"]], kept["libdirs"])
        except (OSError, ValueError, KeyError):
            pass
        probed = _probe(python, agent)
        if isinstance(probed, str):
            why = probed
            continue
        try:
            closure = entries(probed, _ldd(elf_files(probed)))
        except (OSError, subprocess.TimeoutExpired) as exc:
            closure = f"ldd: {exc}"
        if isinstance(closure, str):
            why = f"{python}: {closure}"
            continue
        _keep(path, closure)
        return closure
    return why


def _keep(path: str, closure: Closure) -> None:
    data = {"python": closure.python, "files": closure.files, "libdirs": closure.libdirs}
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    work = f"{path}.tmp{os.getpid()}"
    with open(work, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.rename(work, path)


def identities(closure: Closure) -> list[str]:
    """What the initramfs's digest covers for these files (stat, not content: a
    plan reads no 30 MB)."""
    return [f"{g}={_identity(h)}" for g, h in closure.files]
