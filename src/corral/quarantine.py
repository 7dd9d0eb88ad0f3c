"""Moving what a run must not leave in the workspace into corral's quarantine.

``$XDG_STATE_HOME/corral/quarantine/RUN/<the path>``: a rename when the state
directory is on the workspace's filesystem.  On another one a rename cannot
work and a copy could be as large as the run made it (a run can fill its
workspace to fill the user's home through corral): up to :data:`COPY_MAX`
bytes and :data:`COPY_ENTRIES` entries are copied *for the whole run* (every
path its aftercare moves out shares them: eight new repositories with 60 MiB
hooks each once grew the state by 480 MiB), no more than :data:`MAX_DEPTH`
directories deep; anything beyond, or that cannot be copied (a FIFO), is
removed.  Either way it leaves the workspace: what stays there after a failed
move is said, never passed over.

Every step acts through directory descriptors walked from ``/`` without
following a symlink (:func:`corral.paths.open_dir`), never through the path
string: another sandbox still running in the same workspace could swap a
directory on the way for a symlink to a host directory between a check and
the move (and have the user's files moved, or removed, through it: found by
attacking corral).  A path reached through a symlink is refused: nothing is
moved or removed, and the reason says so.

Imported only when something must be moved.
"""

from __future__ import annotations

import errno
import os
import stat

from corral import paths

COPY_MAX = 64 << 20  # bytes copied per run (across every path moved out)
COPY_ENTRIES = 10_000  # entries copied per run
MAX_DEPTH = 64  # directories below a path copied (deeper is removed: no RecursionError)

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# run id -> [bytes, entries] copied so far by its aftercare
_copied: dict[str, list[int]] = {}


def destination(path: str, run_id: str) -> str:
    from corral import runlog

    return os.path.join(runlog.state_dir(), "quarantine", run_id, path.lstrip("/"))


def move_out(path: str, run_id: str) -> tuple[str, str]:
    """(where ``path`` went, "") or ("", why it is not in the quarantine); in both
    cases it is gone from where it was unless the why says it stayed."""
    dest = destination(path, run_id)
    try:
        parent, name = paths.open_parent(path)
    except FileNotFoundError:
        return "", f"removed instead ({path} is gone)"
    except OSError as exc:
        return "", refused(path, exc)
    try:
        return _move_out(parent, name, dest, run_id)
    finally:
        os.close(parent)


def refused(path: str, exc: OSError) -> str:
    """Why nothing was done at ``path``: the walk to it failed (a directory on the
    way that is a symlink now: ELOOP or ENOTDIR)."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        why = "a directory on the way to it is no longer one (a symlink?): not followed"
    else:
        why = f"the way to it cannot be walked ({exc.strerror or exc})"
    return f"{why}, nothing was moved or removed; it stays where it is"


def _move_out(parent: int, name: str, dest: str, run_id: str) -> tuple[str, str]:
    try:
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        into = os.open(os.path.dirname(dest), _DIR)
    except OSError as exc:
        return "", _removed(parent, name, str(exc))
    try:
        try:
            _rename(parent, name, into, os.path.basename(dest))
            return dest, ""
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                return "", _removed(parent, name, str(exc))
        why = _copy_within_budget(parent, name, into, os.path.basename(dest), run_id)
    finally:
        os.close(into)
    if why:
        return "", _removed(parent, name, why)
    ok = _remove(parent, name)
    return dest, ("" if ok else "copied, but it could not be removed from the workspace")


def _rename(parent: int, name: str, into: int, dname: str) -> None:
    """Rename ``name`` (in ``parent``) to ``dname`` (in ``into``).  Refused (EACCES,
    EPERM) when the run took the write bit off ``parent``, or off ``name`` itself
    if it is a directory (its ``..`` changes): the owner's rights are given back
    through descriptors (:func:`corral.paths.give_back`) and it is tried once more."""
    try:
        os.rename(name, dname, src_dir_fd=parent, dst_dir_fd=into)
    except PermissionError:
        if not (paths.give_back(parent) | paths.give_back_entry(parent, name)):
            raise
        os.rename(name, dname, src_dir_fd=parent, dst_dir_fd=into)


class _Refused(Exception):
    pass


def _copy_within_budget(parent: int, name: str, into: int, dname: str, run_id: str) -> str:
    """Copy ``name`` (in ``parent``) to ``dname`` (in ``into``) if the run's copy budget
    allows it; "" or why not (then nothing of it is left in the quarantine)."""
    used = _copied.setdefault(run_id, [0, 0])
    try:
        total, entries = _copy(
            parent, name, into, dname, COPY_MAX - used[0], COPY_ENTRIES - used[1]
        )
    except (OSError, _Refused) as exc:
        _remove(into, dname)
        if isinstance(exc, _Refused):
            return str(exc)
        return f"cannot be copied to corral's state: {exc}"
    used[0] += total
    used[1] += entries
    return ""


def _copy(
    parent: int, name: str, into: int, dname: str, room: int, room_entries: int
) -> tuple[int, int]:
    """Copy without following symlinks, one directory descriptor per level (none of
    it by path, no recursion); (bytes, entries) copied, or _Refused past the room."""
    total, entries = 0, 0
    budget = f"more than {COPY_MAX >> 20} MiB or {COPY_ENTRIES} entries (copied in this run)"
    # [source dir fd, copy's dir fd, names left, stat of the source dir]
    frames: list[tuple[int, int, list[str], os.stat_result]] = []
    todo: list[tuple[int, str, int, str]] = [(parent, name, into, dname)]
    try:
        while todo or frames:
            if todo:
                src, n, dst, dn = todo.pop()
            else:
                sfd, dfd, names, st = frames[-1]
                if not names:
                    frames.pop()
                    os.fchmod(dfd, stat.S_IMODE(st.st_mode))
                    os.utime(dfd, ns=(st.st_atime_ns, st.st_mtime_ns))
                    os.close(sfd)
                    os.close(dfd)
                    continue
                n = names.pop()
                src, dst, dn = sfd, dfd, n
            st = os.stat(n, dir_fd=src, follow_symlinks=False)
            entries += 1
            total += st.st_size
            if total > room or entries > room_entries:
                raise _Refused(budget)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(n, dir_fd=src), dn, dir_fd=dst)
            elif stat.S_ISDIR(st.st_mode):
                if len(frames) >= MAX_DEPTH:
                    raise _Refused(f"more than {MAX_DEPTH} directories deep")
                sfd = os.open(n, _DIR, dir_fd=src)
                try:
                    os.mkdir(dn, 0o700, dir_fd=dst)
                    dfd = os.open(dn, _DIR, dir_fd=dst)
                except OSError:
                    os.close(sfd)
                    raise
                frames.append((sfd, dfd, sorted(os.listdir(sfd), reverse=True), st))
            elif stat.S_ISREG(st.st_mode):
                total += _copy_file(src, n, dst, dn, room - total + st.st_size) - st.st_size
                if total > room:
                    raise _Refused(budget)
            else:
                raise _Refused("cannot be copied to corral's state: a FIFO, socket or device")
    finally:
        for sfd, dfd, _, _ in frames:
            os.close(sfd)
            os.close(dfd)
    return total, entries


def _copy_file(src: int, name: str, dst: int, dname: str, room: int) -> int:
    """Copy one regular file (at most ``room`` + 1 bytes read); the bytes read."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Refused("cannot be copied to corral's state: no longer a regular file")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        out = os.open(dname, flags, 0o600, dir_fd=dst)
        try:
            done = 0
            while done <= room and (chunk := os.read(fd, min(1 << 20, room + 1 - done))):
                os.write(out, chunk)
                done += len(chunk)
            os.fchmod(out, stat.S_IMODE(st.st_mode))
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(out)
    finally:
        os.close(fd)
    return done


def _remove(parent: int, name: str) -> bool:
    """Remove ``name`` in the directory ``parent`` (a tree: through descriptors, no
    symlink followed, no recursion, however deep); whether it is gone.  A
    directory the run made read-only (``chmod 555``) gets its owner's rights back
    first (:func:`corral.paths.give_back`): it leaves the workspace anyway."""
    try:
        try:
            _remove_once(parent, name)
        except PermissionError:
            if not paths.give_back(parent):
                raise
            _remove_once(parent, name)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _remove_once(parent: int, name: str) -> None:
    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent)
        return
    top = _open_owned(parent, name)
    try:
        _empty(top)
    finally:
        os.close(top)
    os.rmdir(name, dir_fd=parent)


def _open_owned(at: int, name: str) -> int:
    """The directory ``name`` in ``at``, opened without following, with its owner's
    rights given back if the run took them (to be listed and emptied)."""
    try:
        fd = os.open(name, _DIR, dir_fd=at)
    except PermissionError:  # (no read bit: it cannot even be opened)
        if not paths.give_back_entry(at, name):
            raise
        fd = os.open(name, _DIR, dir_fd=at)
    try:
        paths.give_back(fd)
    except OSError:
        os.close(fd)
        raise
    return fd


def _empty(top: int) -> None:
    """Remove everything in the directory ``top``.  Past MAX_DEPTH levels a
    directory is renamed up into ``top`` (no more descriptors held open than that)."""
    frames: list[tuple[int, str, list[str]]] = [(top, "", [])]
    flat = 0
    try:
        while frames:
            fd, name, subdirs = frames[-1]
            if not subdirs:
                for n in os.listdir(fd):
                    if stat.S_ISDIR(os.stat(n, dir_fd=fd, follow_symlinks=False).st_mode):
                        subdirs.append(n)
                    else:
                        os.unlink(n, dir_fd=fd)
                if not subdirs:  # empty now
                    frames.pop()
                    if frames:
                        os.close(fd)
                        os.rmdir(name, dir_fd=frames[-1][0])
                    continue
            sub = subdirs.pop()
            if len(frames) > MAX_DEPTH:
                flat += 1
                while _exists(top, f".corral-flat-{flat}"):
                    flat += 1
                paths.give_back_entry(fd, sub)  # (its ".." changes: its write bit)
                os.rename(sub, f".corral-flat-{flat}", src_dir_fd=fd, dst_dir_fd=top)
                continue
            frames.append((_open_owned(fd, sub), sub, []))
    finally:
        for fd, _, _ in frames[1:]:
            os.close(fd)


def _exists(fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _removed(parent: int, name: str, why: str) -> str:
    """The reason a move failed, after removing ``name`` from the workspace instead."""
    if _remove(parent, name):
        return f"removed instead ({why})"
    return f"{why}; it could not be removed either and stays where it is"
