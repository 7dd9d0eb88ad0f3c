"""Hard links in the environments the workspace walk skips (``.venv``, ``node_modules``).

uv (its default link mode on Linux, when its cache shares the filesystem),
pnpm and bun install a package by hard-linking every file from their global
cache.  A run that writes into such a file in place changes the cached copy,
and with it every environment on the host that links it later: code that
runs outside the sandbox.  The workspace walk does not enter these
directories (tens of thousands of files), so this module looks at them by
*package*: the unit those tools link whole.

A package is an entry of a ``site-packages`` (a module file, a package
directory, a ``.dist-info``) or of a ``node_modules`` (``name``,
``@scope/name``, and pnpm's ``.pnpm/ID/node_modules/name``).  Up to
:data:`SAMPLE` regular files of each are looked at (of a ``.dist-info``, the
files a wheel brings);
a package with one of them linked is made read-only whole, and a directory
all of whose packages are linked is made read-only as one (one mount for a
uv environment rather than hundreds).  What is read-only can still be read
and run; installing into it fails, and the note says why.
"""

from __future__ import annotations

import os
import stat

SAMPLE = 3  # regular files looked at per package
MAX_PACKAGES = 20_000  # beyond it the whole environment is read-only
WHEEL_FILES = ("METADATA", "entry_points.txt", "WHEEL")
MAX_MOUNTS = 200  # read-only packages of one environment, else the whole of it


def find(farms: list[str]) -> list[str]:
    """The paths to make read-only in these environments (packages, or whole
    directories of them), given the environments' directories."""
    found: list[str] = []
    for farm in farms:
        found += _farm(farm)
    return found


def _farm(farm: str) -> list[str]:
    groups = _groups(farm)
    total = sum(len(packages) for packages in groups.values())
    if total > MAX_PACKAGES:
        return [farm] if any(_linked(p) for p in _first(groups, MAX_PACKAGES)) else []
    found = []
    for parent, packages in groups.items():
        linked = [p for p in packages if _linked(p)]
        if linked and 2 * len(linked) >= len(packages):
            found.append(parent)  # mostly linked (the rest: files the tool wrote): one mount
        else:
            found += linked
    return [farm] if len(found) > MAX_MOUNTS else found


def _first(groups: dict[str, list[str]], count: int) -> list[str]:
    out: list[str] = []
    for packages in groups.values():
        out += packages[: count - len(out)]
        if len(out) >= count:
            break
    return out


def _groups(farm: str) -> dict[str, list[str]]:
    """Directory -> its package entries, for every site-packages or node_modules
    level of ``farm``."""
    groups: dict[str, list[str]] = {}
    if os.path.basename(farm) == "node_modules":
        _node_modules(farm, groups)
        return groups
    envs = [farm]
    if os.path.basename(farm) == ".tox":  # one environment per directory
        envs = [e.path for e in _dirs(farm)]
    for env in envs:
        for lib in ("lib", "lib64"):
            if os.path.islink(os.path.join(env, lib)):
                continue  # (lib64 -> lib)
            for python in _dirs(os.path.join(env, lib)):
                site = os.path.join(python.path, "site-packages")
                if python.name.startswith("python") and os.path.isdir(site):
                    groups[site] = _entries(site)
    return groups


def _node_modules(path: str, groups: dict[str, list[str]]) -> None:
    """``name`` and ``@scope/name`` under ``path``; pnpm's store, ``.pnpm/ID/
    node_modules/name``, as one group (``.pnpm``: one mount when linked)."""
    packages = []
    for entry in _dirs(path):
        if entry.name == ".pnpm":
            store: list[str] = []
            for item in _dirs(entry.path):
                inner = os.path.join(item.path, "node_modules")
                store += _packages(inner)
            if store:
                groups[entry.path] = store
        elif not entry.name.startswith("."):
            packages += _packages(path, entry)
    if packages:
        groups[path] = packages


def _packages(path: str, entry: os.DirEntry[str] | None = None) -> list[str]:
    """The packages of a node_modules (or the one ``entry`` names), scopes opened."""
    entries = [entry] if entry is not None else _dirs(path)
    out = []
    for item in entries:
        if item.name.startswith("@"):
            out += [e.path for e in _dirs(item.path)]
        elif not item.name.startswith("."):
            out.append(item.path)
    return out


def _dirs(path: str) -> list[os.DirEntry[str]]:
    try:
        return [e for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _entries(path: str) -> list[str]:
    try:
        return [e.path for e in os.scandir(path) if not e.is_symlink()]
    except OSError:
        return []


def _linked(path: str) -> bool:
    """A regular file with another link, or a package directory with one among the
    first SAMPLE regular files found (breadth first; a ``.dist-info``: WHEEL_FILES)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return stat.S_ISREG(st.st_mode) and st.st_nlink > 1
    if path.endswith(".dist-info"):  # the files a wheel brings (the installer writes the rest)
        return any(_nlink(os.path.join(path, name)) > 1 for name in WHEEL_FILES)
    budget = SAMPLE
    pending = [path]
    listed = 0
    while pending and budget > 0 and listed < 8:
        listed += 1
        try:
            with os.scandir(pending.pop(0)) as entries:  # read only as far as needed
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name != "__pycache__":  # written by imports: never linked
                            pending.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        if entry.stat(follow_symlinks=False).st_nlink > 1:
                            return True
                        budget -= 1
                        if budget <= 0:
                            break
        except OSError:
            continue
    return False


def _nlink(path: str) -> int:
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    return st.st_nlink if stat.S_ISREG(st.st_mode) else 0
