"""Moving what a run must not leave in the workspace into corral's quarantine.

``$XDG_STATE_HOME/corral/quarantine/RUN/<the path>``: a rename when the state
directory is on the workspace's filesystem.  On another one a rename cannot
work and a copy could be as large as the run made it (a run can fill its
workspace to fill the user's home through corral): up to :data:`COPY_MAX`
bytes and :data:`COPY_ENTRIES` entries are copied, anything larger, or that
cannot be copied (a FIFO), is removed.  Either way it leaves the workspace:
what stays there after a failed move is said, never passed over.

Imported only when something must be moved.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat

COPY_MAX = 64 << 20
COPY_ENTRIES = 10_000


def destination(path: str, run_id: str) -> str:
    from corral import runlog

    return os.path.join(runlog.state_dir(), "quarantine", run_id, path.lstrip("/"))


def move_out(path: str, run_id: str) -> tuple[str, str]:
    """(where ``path`` went, "") or ("", why it is not in the quarantine); in both
    cases it is gone from where it was unless the why says it stayed."""
    dest = destination(path, run_id)
    try:
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.rename(path, dest)
        return dest, ""
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            return "", _removed(path, str(exc))
    if not _small(path):
        return "", _removed(path, f"more than {COPY_MAX >> 20} MiB or {COPY_ENTRIES} entries")
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.copytree(path, dest, symlinks=True)
        else:
            shutil.copy2(path, dest, follow_symlinks=False)
    except (OSError, shutil.Error) as exc:
        shutil.rmtree(dest, ignore_errors=True)
        return "", _removed(path, f"cannot be copied to corral's state: {exc}")
    return dest, ("" if _remove(path) else "copied, but it could not be removed from the workspace")


def _small(path: str) -> bool:
    """Whether the tree at ``path`` is within the copy bounds (symlinks not followed)."""
    total, entries = 0, 0
    stack = [path]
    while stack:
        here = stack.pop()
        entries += 1
        try:
            st = os.lstat(here)
            if stat.S_ISDIR(st.st_mode):
                stack.extend(os.path.join(here, n) for n in os.listdir(here))
            elif not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode):
                return False  # a FIFO or socket: nothing to copy
            total += st.st_size
        except OSError:
            return False
        if total > COPY_MAX or entries > COPY_ENTRIES:
            return False
    return True


def _remove(path: str) -> bool:
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _removed(path: str, why: str) -> str:
    """The reason a move failed, after removing ``path`` from the workspace instead."""
    if _remove(path):
        return f"removed instead ({why})"
    return f"{why}; it could not be removed either and stays where it is"
