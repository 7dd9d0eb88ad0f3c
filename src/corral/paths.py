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
