"""Snapshot write-deny paths before a run and put them back after it.

Tiers without mounts (landlock) cannot make ``.git/hooks`` read-only inside a
writable workspace (see :mod:`corral.landlock`).  Instead the launcher takes
a snapshot of each such path before the command starts and, once every
process of the run is gone, compares: anything changed is moved to the
quarantine directory and the snapshot is written back.  This is undo, not
prevention: during the run the change exists, and the README says so.

Restoring happens when nothing of the sandbox is left running, so the checks
below cannot be raced.  What is put back is the content, the mode and the
modification time (to the nanosecond) of every entry, and the access time;
the directory holding a restored path keeps the times the run left it with,
so the undo itself leaves no trace there.  (A change time cannot be set.)
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.report import Denial

MAX_BYTES = 16 * 1024 * 1024  # a hooks directory is kilobytes; refuse surprises
MAX_ENTRIES = 5000

# relative path -> (kind, mode, content or link, mtime_ns, atime_ns); a change is
# anything but the access time, which reading alone moves
Tree = dict[str, tuple[str, int, bytes, int, int]]


class TooLarge(Exception):
    pass


def _walk(path: str) -> Tree | None:
    """The tree at ``path`` without following symlinks; None if nothing is there."""
    tree: Tree = {}
    total = 0

    def visit(full: str, rel: str) -> None:
        nonlocal total
        st = os.lstat(full)
        if len(tree) >= MAX_ENTRIES:
            raise TooLarge(f"{path} has more than {MAX_ENTRIES} entries")
        times = (st.st_mtime_ns, st.st_atime_ns)
        if stat.S_ISLNK(st.st_mode):
            tree[rel] = ("l", 0, os.readlink(full).encode(), *times)
        elif stat.S_ISDIR(st.st_mode):
            tree[rel] = ("d", stat.S_IMODE(st.st_mode), b"", *times)
            for name in sorted(os.listdir(full)):
                visit(os.path.join(full, name), os.path.join(rel, name) if rel else name)
        elif stat.S_ISREG(st.st_mode):
            total += st.st_size
            if total > MAX_BYTES:
                raise TooLarge(f"{path} holds more than {MAX_BYTES >> 20} MiB")
            # (a process of the run still alive could swap in a FIFO or keep the
            # file growing: the open never waits, and the read is bounded)
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise TooLarge(f"{full} is no longer a regular file")
                data = b""
                room = MAX_BYTES - total + st.st_size + 1
                while len(data) < room and (chunk := os.read(fd, min(1 << 20, room))):
                    data += chunk
            finally:
                os.close(fd)
            total += len(data) - st.st_size
            if total > MAX_BYTES:
                raise TooLarge(f"{path} holds more than {MAX_BYTES >> 20} MiB")
            tree[rel] = ("f", stat.S_IMODE(st.st_mode), data, *times)
        elif stat.S_ISFIFO(st.st_mode):  # made again on restore (empty, like any FIFO)
            tree[rel] = ("p", stat.S_IMODE(st.st_mode), b"", *times)
        else:  # socket/device
            tree[rel] = ("o", stat.S_IMODE(st.st_mode), b"", *times)

    try:
        visit(path, "")
    except FileNotFoundError:
        return tree or None
    return tree


def snapshot(paths: list[str]) -> dict[str, Tree]:
    """Trees of the given paths as they are now (TooLarge if one is unreasonable)."""
    return {p: t for p in paths if (t := _walk(p)) is not None}


def _changed(before: Tree, now: Tree | None) -> bool:
    """Anything but access times differs (a ``touch`` is a change)."""
    if now is None or now.keys() != before.keys():
        return True
    return any(now[rel][:4] != entry[:4] for rel, entry in before.items())


def _write(path: str, tree: Tree) -> None:
    for rel in sorted(tree):  # parents sort before their entries
        kind, mode, data, _, _ = tree[rel]
        full = os.path.join(path, rel) if rel else path
        if kind == "d":
            os.mkdir(full, mode)
        elif kind == "l":
            os.symlink(data.decode(), full)
        elif kind == "p":
            os.mkfifo(full, mode)
        elif kind == "f":
            fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
    for rel, (kind, mode, _, _, _) in tree.items():  # modes the umask narrowed
        if kind in "dfp":
            os.chmod(os.path.join(path, rel) if rel else path, mode)
    # times last, deepest first: making an entry moves its directory's times
    for rel in sorted(tree, reverse=True):
        kind, _, _, mtime, atime = tree[rel]
        if kind in "dflp":
            full = os.path.join(path, rel) if rel else path
            os.utime(full, ns=(atime, mtime), follow_symlinks=False)


def restore(snap: dict[str, Tree], run_id: str) -> list[Denial]:
    """Put changed paths back; one denial per path that had been changed."""
    from corral.launch import quarantine
    from corral.report import restored

    said = []
    for path, before in snap.items():
        try:
            now = _walk(path)
        except (OSError, TooLarge):
            now = None
        if not _changed(before, now):
            continue
        parent = os.path.dirname(path)
        if os.path.realpath(parent) != parent:
            said.append(restored(path, parent=parent))
            continue
        try:
            left = os.stat(parent)  # as the run left it: the undo must not show there
        except OSError:
            left = None
        moved = quarantine([path], run_id) if os.path.lexists(path) else []
        error = ""
        try:
            _write(path, before)
        except OSError as exc:
            error = str(exc)
        if left is not None:
            try:
                os.utime(parent, ns=(left.st_atime_ns, left.st_mtime_ns))
            except OSError:
                pass  # not ours to set (another owner): a trace, not a failure
        moved_to = str(moved[0].fields.get("moved_to") or "") if moved else ""
        said.append(restored(path, moved_to, error))
    return said
