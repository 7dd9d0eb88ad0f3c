"""Removing a directory tree a sandbox could write: corral's home layers, a run's
scratch directory, a batch's scratch.

Every step is taken relative to a descriptor of the directory it is in, opened
without following a link: a run still alive swapped a directory of its layer for
a link to the user's files while a walk by path went on, and ``corral home
clean`` deleted them (found by attacking corral).  Not a recursion: a run nested
its scratch 3,000 directories deep and 3.11's ``shutil.rmtree`` ended in
RecursionError, losing the run's record.  A directory the run made unwritable
(``chmod 500``) is given back its owner's rights first: the tree is the user's,
and a run that did so kept what it had planted in its layer.
"""

from __future__ import annotations

import os

# A directory deeper than this is moved up to the top of the tree and emptied
# from there, so the descriptors held stay few.
FLATTEN_AT = 64
DIRECTORY_NOFOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: str) -> bool:
    """Remove ``path`` and all it holds, a link as a link (what it names stays).
    True once nothing is left at ``path``."""
    try:
        top = _open_dir(None, path)
    except OSError:
        top = -1
    if top >= 0:
        try:
            _empty(top)
        finally:
            os.close(top)
    _remove_entry(None, path)
    return not os.path.lexists(path)


def _empty(top: int) -> None:
    """Remove everything in the directory open as ``top``, depth first, one
    descriptor per level held."""
    stack = [(top, _entries(top))]
    names: list[str] = []  # each stacked directory's name in the one above it
    moved = 0
    while stack:
        fd, entries = stack[-1]
        if not entries:  # emptied: close it and remove it from its parent
            stack.pop()
            if stack:
                os.close(fd)
                _remove_entry(stack[-1][0], names.pop())
            continue
        name, is_dir = entries.pop()
        if not is_dir:
            _unlink(fd, name)
        elif len(stack) > FLATTEN_AT:
            moved += 1
            flat = f".corral-flat-{os.getpid()}-{moved}"
            try:
                os.rename(name, flat, src_dir_fd=fd, dst_dir_fd=top)
                stack[0][1].append((flat, True))
            except OSError:
                pass
        else:
            try:
                sub = _open_dir(fd, name)
            except OSError:  # a link or a file now: it goes, what it names stays
                _remove_entry(fd, name)
                continue
            names.append(name)
            stack.append((sub, _entries(sub)))


def _open_dir(at: int | None, name: str) -> int:
    """The directory ``name`` (in the one open as ``at``), never through a link;
    one its owner cannot read is given back the owner's rights first."""
    from corral.paths import give_back_entry

    try:
        return os.open(name, DIRECTORY_NOFOLLOW, dir_fd=at)
    except PermissionError:
        give_back_entry(at, name)
        return os.open(name, DIRECTORY_NOFOLLOW, dir_fd=at)


def _entries(fd: int) -> list[tuple[str, bool]]:
    """The names in the directory open as ``fd``, and whether each is a directory
    (a link is not).  A directory the run made unwritable is made writable for
    its owner here, before its entries are removed."""
    from corral.paths import give_back

    try:
        give_back(fd)
        with os.scandir(fd) as found:
            return [(e.name, e.is_dir(follow_symlinks=False)) for e in found]
    except OSError:
        return []


def _remove_entry(fd: int | None, name: str) -> None:
    """Remove the entry ``name`` of the directory open as ``fd``: a directory if
    it is one (and empty), else the entry itself, never what a link names."""
    try:
        os.rmdir(name, dir_fd=fd)
    except NotADirectoryError:
        _unlink(fd, name)
    except OSError:
        pass


def _unlink(fd: int | None, name: str) -> None:
    try:
        os.unlink(name, dir_fd=fd)
    except OSError:
        pass
