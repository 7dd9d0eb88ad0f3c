"""Snapshot write-deny paths and secrets before a run and put them back after it.

Tiers without mounts (landlock) cannot make ``.git/hooks`` read-only inside a
writable workspace (see :mod:`corral.landlock`), nor stop a run renaming,
hard-linking or rewriting a ``.env`` there: Landlock keeps its content
unreadable in the run, but ``mv .env notes.txt`` would leave it readable to
the next run.  Instead the launcher takes
a snapshot of each such path before the command starts and, once every
process of the run is gone, compares: anything changed is moved to the
quarantine directory and the snapshot is written back.  This is undo, not
prevention: during the run the change exists, and the README says so.
For a secret, every other name its file or directory got during the run (a
rename, a hard link: found by inode in the writable places) is moved to the
quarantine as well, so no later run can read it there.

Mount tiers need less: a masked secret or a read-only write-deny path cannot
be changed from inside, but a directory above it can be renamed, and the mount
goes with it (``mv data data2`` carries ``data/private``, so a later run,
which masks ``data/private``, would read ``data2/private``).  Those paths are
"in-place": only their inode is noted at launch, and one that moved is put
back where it was (what the run made at its old path goes to the quarantine).

Restoring happens when nothing of this run's sandbox is left running; another
sandbox in the same workspace may still be, and swap a directory on the way for
a symlink to a host directory between a check and a write (it once had corral
create ``~/.config/git/config``: found by attacking corral), or do it while a
launcher takes its snapshot (which then read a host file the sandbox could not,
for the restore to write into the workspace).  So everything is read and
written through directory descriptors walked without following a symlink
(:func:`corral.paths.open_dir`), never through a path string.

What is put back is the content, the mode and the modification time (to the
nanosecond) of every entry, and the access time; the directory holding a
restored path keeps the times the run left it with, so the undo itself leaves
no trace there.  (A change time cannot be set.)
"""

from __future__ import annotations

import os
import stat

from corral.paths import inside

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from corral.report import Denial

MAX_BYTES = 16 * 1024 * 1024  # a hooks directory is kilobytes; refuse surprises
MAX_ENTRIES = 5000
# levels below a path: deeper is refused like too many entries (a run nested 1,200
# directories in .git/hooks and the recursive walk's RecursionError ended the
# undo before anything was put back: found by attacking corral)
MAX_DEPTH = 64

# relative path -> (kind, mode, content or link, mtime_ns, atime_ns, (dev, inode,
# links)); a change is anything but the access time, which reading alone moves
Tree = dict[str, tuple[str, int, bytes, int, int, tuple[int, int, int]]]
Inode = tuple[int, int]
# entries looked at for a secret's other names (only if it moved): about a second
# for 1,000,000 here (a listing's entries carry their inodes: no stat each)
MAX_SEARCH = 2_000_000


class TooLarge(Exception):
    pass


def _walk(path: str) -> Tree | None:
    """The tree at ``path`` without following symlinks; None if nothing is there.

    Read through directory descriptors walked from ``/`` without following a
    symlink (:func:`corral.paths.open_dir`), each entry opened relative to the
    descriptor of the directory holding it, never by a path: another sandbox
    still running in the workspace swapped a directory of the tree for a link to
    a host directory while this walk was in it, and the snapshot read a file the
    sandbox could not (the restore then wrote it into the workspace: found by
    attacking corral).  A symlink on the way to ``path`` is an OSError (ELOOP or
    ENOTDIR), as is an entry swapped for one between its look and its open."""
    from corral.paths import open_parent

    try:
        parent, name = open_parent(path)
    except FileNotFoundError:
        return None
    walk = _Walk(path)
    try:
        walk.visit(parent, name, "", 0)
    except FileNotFoundError:
        return walk.tree or None
    finally:
        os.close(parent)
    return walk.tree


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Walk:
    """One walk of :func:`_walk`: the tree so far and the bytes read."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.tree: Tree = {}
        self.total = 0

    def visit(self, at: int, name: str, rel: str, depth: int) -> None:
        """Note ``name`` (in the directory ``at``) as ``rel``, and what it holds."""
        if len(self.tree) >= MAX_ENTRIES:
            raise TooLarge(f"{self.path} has more than {MAX_ENTRIES} entries")
        if depth > MAX_DEPTH:
            raise TooLarge(f"{self.path} is more than {MAX_DEPTH} directories deep")
        st = os.stat(name, dir_fd=at, follow_symlinks=False)
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISLNK(st.st_mode):  # (any bytes)
            self.tree[rel] = ("l", 0, os.fsencode(os.readlink(name, dir_fd=at)), *_times(st))
        elif stat.S_ISDIR(st.st_mode):
            fd = os.open(name, _DIR, dir_fd=at)  # (a link swapped in since: ELOOP)
            try:
                st = os.fstat(fd)  # what is noted is what is read
                self.tree[rel] = ("d", stat.S_IMODE(st.st_mode), b"", *_times(st))
                for child in sorted(os.listdir(fd)):
                    self.visit(fd, child, os.path.join(rel, child) if rel else child, depth + 1)
            finally:
                os.close(fd)
        elif stat.S_ISREG(st.st_mode):
            self._file(at, name, rel)
        elif stat.S_ISFIFO(st.st_mode):  # made again on restore (empty, like any FIFO)
            self.tree[rel] = ("p", mode, b"", *_times(st))
        else:  # socket/device
            self.tree[rel] = ("o", mode, b"", *_times(st))

    def _file(self, at: int, name: str, rel: str) -> None:
        # (a process of the run still alive could swap in a FIFO or keep the file
        # growing: the open never waits, and the read is bounded)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(name, flags, dir_fd=at)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise TooLarge(f"{os.path.join(self.path, rel)} is no longer a regular file")
            if self.total + st.st_size > MAX_BYTES:
                raise TooLarge(f"{self.path} holds more than {MAX_BYTES >> 20} MiB")
            data = b""
            room = MAX_BYTES - self.total + 1
            while len(data) < room and (chunk := os.read(fd, min(1 << 20, room - len(data)))):
                data += chunk
        finally:
            os.close(fd)
        self.total += len(data)
        if self.total > MAX_BYTES:
            raise TooLarge(f"{self.path} holds more than {MAX_BYTES >> 20} MiB")
        self.tree[rel] = ("f", stat.S_IMODE(st.st_mode), data, *_times(st))


def _times(st: os.stat_result) -> tuple[int, int, tuple[int, int, int]]:
    """A tree entry's mtime, atime and (dev, inode, links)."""
    return st.st_mtime_ns, st.st_atime_ns, (st.st_dev, st.st_ino, st.st_nlink)


def snapshot(paths: Iterable[str], rules: Mapping[str, str] | None = None) -> dict[str, Tree]:
    """Trees of the given paths as they are now (TooLarge if one is unreasonable);
    an "in-place" path (``rules``) only by its inode."""
    rules = rules or {}
    return {
        p: t
        for p in paths
        if (t := _anchor(p) if rules.get(p) == "in-place" else _walk(p)) is not None
    }


def _anchor(path: str) -> Tree | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return {"": ("i", 0, b"", 0, 0, (st.st_dev, st.st_ino, st.st_nlink))}


def _changed(before: Tree, now: Tree | None) -> bool:
    """Anything but access times differs (a ``touch`` is a change)."""
    if now is None or now.keys() != before.keys():
        return True
    return any(now[rel][:4] != entry[:4] for rel, entry in before.items())


def _write(parent: int, name: str, tree: Tree) -> None:
    """Make ``tree`` at ``name`` in the directory ``parent`` (a descriptor): every
    entry through the descriptor of the directory holding it, walked without
    following a symlink, never by a path a sandbox still running could swap a
    directory of for a symlink to a host directory (found by attacking corral)."""
    dirs = _Dirs(parent, name)
    try:
        for rel in sorted(tree):  # parents sort before their entries
            kind, mode, data = tree[rel][:3]
            at, entry = dirs.holding(rel)
            if kind == "d":  # its own mode last: a read-only one would keep us out
                os.mkdir(entry, 0o700, dir_fd=at)
            elif kind == "l":
                os.symlink(os.fsdecode(data), entry, dir_fd=at)
            elif kind == "p":
                os.mkfifo(entry, mode, dir_fd=at)
            elif kind == "f":
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(entry, flags, mode, dir_fd=at)
                try:
                    os.write(fd, data)
                    os.fchmod(fd, mode)  # the mode the umask narrowed
                finally:
                    os.close(fd)
        # modes and times last, deepest first: making an entry moves its directory's
        # times, and a directory's mode may keep its owner out
        for rel in sorted(tree, reverse=True):
            kind, mode, _, mtime, atime, _ = tree[rel]
            at, entry = dirs.holding(rel)
            if kind in "dp":
                _chmod(at, entry, kind, mode)
            if kind in "dflp":
                os.utime(entry, ns=(atime, mtime), dir_fd=at, follow_symlinks=False)
    finally:
        dirs.close()


def _exists(at: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=at, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _why(moved: list[Denial]) -> str:
    """Why the quarantine left a path where it was (its denial's error)."""
    return str(moved[0].fields.get("error") or "") if moved else "it could not be moved"


def _write_owned(held: int, name: str, tree: Tree) -> str:
    """:func:`_write`; "" or why it failed.  A directory holding the path that the
    run made read-only (``chmod 555 .git``) gets its owner's rights back and the
    write is tried once more (the run's hook or ``core.fsmonitor`` stayed, and ran
    on the host at the next commit: found by attacking corral)."""
    try:
        try:
            _write(held, name, tree)
        except PermissionError:
            from corral.paths import give_back

            if not give_back(held):
                raise
            _write(held, name, tree)
    except OSError as exc:
        return str(exc)
    return ""


def _chmod(at: int, entry: str, kind: str, mode: int) -> None:
    """chmod of a directory or FIFO through a descriptor opened without following."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(entry, flags | (os.O_DIRECTORY if kind == "d" else 0), dir_fd=at)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


class _Dirs:
    """The descriptor of the directory holding each entry of a tree being written,
    walked from the descriptor of the tree's parent (the last one kept)."""

    def __init__(self, parent: int, name: str) -> None:
        self.parent, self.name = parent, name
        self.last: tuple[str, int] | None = None

    def holding(self, rel: str) -> tuple[int, str]:
        from corral.paths import open_dir

        if not rel:
            return self.parent, self.name
        head, entry = os.path.split(os.path.join(self.name, rel))
        if self.last is None or self.last[0] != head:
            self.close()
            self.last = (head, open_dir(head, at=self.parent))
        return self.last[1], entry

    def close(self) -> None:
        if self.last is not None:
            os.close(self.last[1])
            self.last = None


def restore(
    snap: dict[str, Tree],
    run_id: str,
    rules: Mapping[str, str] | None = None,
    roots: Sequence[str] = (),
) -> list[Denial]:
    """Put changed paths back; one denial per path that had been changed.
    ``rules``: path -> "write-deny" (the default) or "read-deny" (a secret: its
    other names in ``roots``, the writable places, are taken out too)."""
    from corral.launch import quarantine
    from corral.paths import open_parent
    from corral.report import restored

    rules = rules or {}
    secrets = {p: t for p, t in snap.items() if rules.get(p) == "read-deny"}
    strays = _moved_inodes(secrets)  # looked at before anything is put back
    carried = _carried(snap, rules)
    said = []
    for path, before in snap.items():
        if rules.get(path) == "in-place":
            continue  # (_carried looked at it)
        try:
            now = _walk(path)
        except (OSError, TooLarge):
            now = None
        if not _changed(before, now):
            continue
        parent = os.path.dirname(path)
        rule = rules.get(path, "write-deny")
        # a secret goes back even where the run renamed its directory away
        made = rule == "read-deny" and bool(_make_parents(path))
        if os.path.realpath(parent) != parent or made:
            said.append(restored(path, parent=parent, rule=rule))
            continue
        try:  # held from here: what is done is done in this directory, by descriptor
            held, name = open_parent(path)
        except OSError:  # (a symlink on the way now: another sandbox's swap)
            said.append(restored(path, parent=parent, rule=rule))
            continue
        try:
            left = os.fstat(held)  # as the run left it: the undo must not show there
            moved = quarantine([path], run_id) if os.path.lexists(path) else []
            # what the quarantine could neither move nor remove stays as the run left
            # it: said so, never "removed" (and no write to fail on it)
            stays = _exists(held, name)
            error = _why(moved) if stays else _write_owned(held, name, before)
            try:
                os.utime(held, ns=(left.st_atime_ns, left.st_mtime_ns))
            except OSError:
                pass  # not ours to set (another owner): a trace, not a failure
        finally:
            os.close(held)
        moved_to = str(moved[0].fields.get("moved_to") or "") if moved else ""
        said.append(restored(path, "" if stays else moved_to, error, rule=rule, stays=stays))
    if carried:
        said += _put_back(carried, roots, run_id)
    if strays:
        said += _take_out_copies(strays, roots, run_id)
    return said


def _carried(snap: dict[str, Tree], rules: Mapping[str, str]) -> dict[Inode, str]:
    """The in-place paths whose inode is no longer there -> the path it had."""
    carried = {}
    for path, tree in snap.items():
        if rules.get(path) != "in-place":
            continue
        dev, ino, _ = tree[""][5]
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if st is None or (st.st_dev, st.st_ino) != (dev, ino):
            carried[(dev, ino)] = path
    return carried


def _put_back(carried: dict[Inode, str], roots: Sequence[str], run_id: str) -> list[Denial]:
    """Move each carried path back from where the run's rename took it."""
    from corral.report import carried_back

    found, complete = _find_inodes({i: {p} for i, p in carried.items()}, roots)
    said: list[Denial] = []
    for now, inode in found:
        path = carried.pop(inode)
        said += _clear(path, run_id)
        error = _move_back(now, path)
        said.append(carried_back(path, now, error))
    for path in carried.values():
        said += _clear(path, run_id)  # not what was there, even if that is lost
        why = "it is gone" if complete else f"not found in the first {MAX_SEARCH} entries"
        said.append(carried_back(path, "", why))
    return said


def _clear(path: str, run_id: str) -> list[Denial]:
    """Move what the run made at a carried path's old place to the quarantine.  A
    directory on the way that the run made a symlink goes itself: the path
    through it is some other directory's entry, outside the workspace perhaps."""
    from corral.launch import not_through_links
    from corral.quarantine import move_out
    from corral.report import made_in_place

    where = not_through_links(path)
    if not os.path.lexists(where):
        return []
    return [made_in_place(where, *move_out(where, run_id))]


def _make_parents(path: str) -> str:
    """Make the missing directories on the way to ``path`` (a run renamed one away),
    never through a symlink the run left; "" or why not."""
    existing = os.path.dirname(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if os.path.realpath(existing) != existing:
        return f"{existing} is a symlink now"
    from corral.paths import open_dir

    try:  # each made relative to its parent's descriptor, none through a symlink
        os.close(open_dir(os.path.dirname(path), make=True))
    except OSError as exc:
        return str(exc)
    return ""


def _move_back(now: str, path: str) -> str:
    """Rename ``now`` to ``path``, making missing directories on the way; "" or why not."""
    error = _make_parents(path)
    if error:
        return error
    try:
        if os.path.lexists(path):
            return f"{path} could not be cleared"
        _rename(now, path)
    except OSError as exc:
        return str(exc)
    return ""


def _rename(now: str, path: str) -> None:
    """``os.rename(now, path)`` through the descriptors of both parents (walked
    without following a symlink)."""
    from corral.paths import open_parent

    src, src_name = open_parent(now)
    try:
        dst, dst_name = open_parent(path)
        try:
            os.rename(src_name, dst_name, src_dir_fd=src, dst_dir_fd=dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _unlink(path: str) -> None:
    """``os.unlink(path)`` through its parent's descriptor (walked without following)."""
    from corral.paths import open_parent

    parent, name = open_parent(path)
    try:
        try:
            os.unlink(name, dir_fd=parent)
        except PermissionError:  # a directory the run made read-only: see give_back
            from corral.paths import give_back

            if not give_back(parent):
                raise
            os.unlink(name, dir_fd=parent)
    finally:
        os.close(parent)


def _moved_inodes(secrets: dict[str, Tree]) -> dict[Inode, set[str]]:
    """The inodes of secret files and directories that are no longer (only) where
    they were: moved, removed, or linked anew -> the names they had at launch."""
    strays: dict[Inode, set[str]] = {}
    for path, tree in secrets.items():
        names: dict[Inode, set[str]] = {}
        moved: set[Inode] = set()
        for rel, (kind, *_, (dev, ino, links)) in tree.items():
            full = os.path.join(path, rel) if rel else path
            names.setdefault((dev, ino), set()).add(full)
            if kind not in "fd":
                continue
            try:
                st = os.lstat(full)
            except OSError:
                st = None
            if (
                st is None
                or (st.st_dev, st.st_ino) != (dev, ino)
                or (kind == "f" and st.st_nlink > links)
            ):
                moved.add((dev, ino))
        for inode in moved:
            strays.setdefault(inode, set()).update(names[inode])
    return strays


def _take_out_copies(
    strays: dict[Inode, set[str]], roots: Sequence[str], run_id: str
) -> list[Denial]:
    """Find the other names of moved secrets in ``roots`` and quarantine them."""
    from corral.quarantine import move_out
    from corral.report import secret_copy

    found, complete = _find_inodes(strays, roots)
    said = []
    for copy, inode in found:
        if _still_at(strays[inode], inode) and not os.path.isdir(copy):
            try:  # a link beside the secret it still names: nothing to keep
                _unlink(copy)
                dest, error = "", ""
            except OSError as exc:
                dest, error = "", str(exc)
        else:
            dest, error = move_out(copy, run_id)
        said.append(secret_copy(min(strays[inode]), copy, dest, error))
    if not complete:  # (corral.unfinished refuses later runs there until it is found)
        import shlex

        where = " ".join(shlex.quote(r) for r in _outermost(roots))
        for inode, names in strays.items():
            why = f"more than {MAX_SEARCH} entries; look for inode {inode[1]}: "
            why += f"find {where} -xdev -inum {inode[1]}"
            said.append(secret_copy(min(names), "", "", why))
    return said


def _still_at(names: set[str], inode: Inode) -> bool:
    """The secret's inode is still at one of the names it had at launch."""
    return any(_is(name, inode) for name in names)


def _find_inodes(
    strays: dict[Inode, set[str]], roots: Sequence[str]
) -> tuple[list[tuple[str, Inode]], bool]:
    """Paths under ``roots`` (not following symlinks) whose inode is a stray and
    that are not one of its names at launch; and whether the search was complete.

    The roots in their order, each searched whole before the next: the workspace
    first, the home layer last (a run filled its home layer with 510,000 empty
    files, searched first, and the bound stopped the search before it reached
    the ``notes.txt`` the run had renamed ``.env`` to: found by attacking corral).
    Each directory is read once, as a stream, its entries' inodes from the
    listing itself (no stat but for a match); the search ends as soon as every
    stray's names are all accounted for (:class:`_Names`)."""
    inodes = {ino for _, ino in strays}
    known = {name for names in strays.values() for name in names}
    names = _Names(strays)
    found: list[tuple[str, Inode]] = []
    seen = 0
    for root in _outermost(roots):
        pending = [root]
        while pending:
            try:
                listing = os.scandir(pending.pop())
            except OSError:
                continue
            with listing:
                for entry in listing:
                    seen += 1
                    if seen > MAX_SEARCH:
                        return found, False
                    if entry.inode() in inodes and entry.path not in known:
                        st = entry.stat(follow_symlinks=False)
                        if (st.st_dev, st.st_ino) in strays:
                            found.append((entry.path, (st.st_dev, st.st_ino)))
                            if names.found(st):
                                return found, True
                            continue  # a whole directory goes: nothing beneath to look at
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
    return found, True


def _outermost(roots: Sequence[str]) -> list[str]:
    """The directories among ``roots``, in order, but those inside one before them
    (searched there already: a copy found twice would be moved out twice)."""
    kept: list[str] = []
    for root in dict.fromkeys(roots):
        if os.path.isdir(root) and not any(inside(root, k) for k in kept):
            kept.append(root)
    return kept


class _Names:
    """How many other names of each stray are still to be found: a directory has
    one; a file as many as its links but those it still has at launch names."""

    def __init__(self, strays: dict[Inode, set[str]]) -> None:
        self.strays = strays
        self.left: dict[Inode, int] = {}

    def found(self, st: os.stat_result) -> bool:
        """One more name of the stray ``st`` found; whether every stray's are."""
        inode = (st.st_dev, st.st_ino)
        if inode not in self.left:
            at_launch = sum(_is(name, inode) for name in self.strays[inode])
            self.left[inode] = 1 if stat.S_ISDIR(st.st_mode) else st.st_nlink - at_launch
        self.left[inode] -= 1
        return len(self.left) == len(self.strays) and max(self.left.values()) <= 0


def _is(name: str, inode: Inode) -> bool:
    try:
        st = os.lstat(name)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == inode
