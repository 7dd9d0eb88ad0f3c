"""Path tests shared across the planners (pure, no imports: on every run's path)."""

from __future__ import annotations


def inside(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or lies under it, by name (both normalized:
    ``/ws2`` is not inside ``/ws``)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def open_dir(path: str, at: int | None = None, make: bool = False) -> int:
    """A descriptor of the directory ``path`` (absolute; or relative to the directory
    descriptor ``at``), reached one component at a time without following any
    symlink: one anywhere on the way fails (ELOOP or ENOTDIR), so what is done
    through the descriptor stays where the path led when it was walked, whatever a
    sandbox still running swaps in afterwards.  ``make``: missing directories are
    made (each relative to its parent's descriptor).  The caller closes it."""
    import os

    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open("/" if at is None else ".", flags, dir_fd=at)
    try:
        for name in path.split("/"):
            if name in ("", "."):
                continue
            if name == "..":
                raise OSError(errno_einval(), f"{path}: '..' is not walked")
            try:
                child = os.open(name, flags, dir_fd=fd)
            except FileNotFoundError:
                if not make:
                    raise
                try:
                    os.mkdir(name, dir_fd=fd)
                except FileExistsError:
                    pass
                child = os.open(name, flags, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_parent(path: str, make: bool = False) -> tuple[int, str]:
    """(descriptor of the directory holding ``path``, walked as :func:`open_dir`,
    the last component's name)."""
    import os

    head, name = os.path.split(path.rstrip("/") or "/")
    if not name:
        raise OSError(errno_einval(), f"{path} has no parent to walk to")
    return open_dir(head, make=make), name


def errno_einval() -> int:
    import errno

    return errno.EINVAL


def give_back(fd: int) -> bool:
    """Give the owner read, write and search again on the directory ``fd`` (opened
    without following a symlink) if it is ours and lacks one: a run can ``chmod
    555`` a directory of its workspace, and the aftercare, acting as the same user,
    could then neither take out nor put back what the run left in it (found by
    attacking corral).  The workspace is the user's: its directories are theirs to
    write.  Whether the mode changed."""
    import os
    import stat

    st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or mode & 0o700 == 0o700:
        return False
    try:
        os.fchmod(fd, mode | 0o700)
    except OSError:
        return False
    return True


def give_back_entry(at: int | None, name: str) -> bool:
    """:func:`give_back` for the directory ``name`` in the directory ``at``, which
    may refuse to be opened for reading (mode 0): pinned by an ``O_PATH``
    descriptor opened without following, changed through that descriptor's
    ``/proc/self/fd`` name (fchmod refuses an ``O_PATH`` descriptor).  False for
    anything but a directory."""
    import os
    import stat

    try:
        fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid != os.geteuid() or mode & 0o700 == 0o700:
            return False
        os.chmod(f"/proc/self/fd/{fd}", mode | 0o700)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True
