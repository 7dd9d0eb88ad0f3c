"""Aftercare corral could not finish: later runs where it was are refused.

A run on the landlock tier can change what it must not (a git hook, a
``.git/config``, a secret's name) and corral undoes it afterwards
(:mod:`corral.restore`).  When the undo fails (a planted hook that could be
neither moved nor removed, another name of a secret that could not be taken
out or not even found), the run's closing lines say so; but a line is easy to
miss, and the next run would start with the hook in place or the secret
readable under its new name (found by attacking corral).

So such a run leaves a record in corral's state directory
(``unfinished/<run id>``: the places it could write, then one line per thing
left), and a run that could write in one of those places, or beneath or above
one, is refused (exit 122) with the first line and what to do: look at it
(``corral log --run ID`` has every line), put it right, then remove the record.

Cost on the hot path: one listing of a directory that is usually absent.
"""

from __future__ import annotations

import os

from corral import runlog
from corral.paths import inside

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from corral.report import Denial

UNFINISHED = "unfinished"
# a denial's action that says a protected path stays as the run left it
LEFT = frozenset({"not restored", "not taken out", "not found", "not moved back"})


def unfinished_dir() -> str:
    return os.path.join(runlog.state_dir(), UNFINISHED)


def left(said: Sequence[Denial]) -> list[str]:
    """The lines of the denials that say something stays as the run left it: a
    protected path not put back, a secret's other name not taken out or not
    found, a created write-deny path neither moved nor removed."""
    lines = []
    for d in said:
        if d.kind != "file":
            continue
        action, path = d.fields.get("action"), d.fields.get("path")
        created = action == "quarantined" and d.fields.get("error") and not d.fields.get("moved_to")
        if action in LEFT or (created and isinstance(path, str) and os.path.lexists(path)):
            lines.append(str(d))
    return lines


def record(run_id: str, places: Sequence[str], lines: Sequence[str]) -> Denial:
    """Leave the record that refuses later runs in ``places``; the line that says so
    (or that it could not be left, in which case nothing refuses them)."""
    from corral.report import Denial

    path = os.path.join(unfinished_dir(), run_id)
    text = "\0".join((*places, "", *lines))
    try:
        os.makedirs(unfinished_dir(), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, text.encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)
    except OSError as exc:
        said = f"could not undo all of this run, nor note it for later runs ({exc})"
        return Denial("file", said, path=path, rule="aftercare", action="not held")
    said = (
        f"could not undo all of this run (above): runs that can write where it "
        f"could are refused until you put it right and remove {path}"
    )
    return Denial("file", said, path=path, rule="aftercare", action="held")


def check(places: Sequence[str]) -> None:
    """Refuse a run (RefusedError) that could write in a place an unfinished
    aftercare left something in."""
    directory = unfinished_dir()
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as f:
                head, _, rest = f.read().decode("utf-8", "surrogateescape").partition("\0\0")
        except OSError:
            continue
        theirs = head.split("\0")
        if any(inside(p, q) or inside(q, p) for p in places for q in theirs if p and q):
            from corral.errors import RefusedError

            first = rest.split("\0")[0].removeprefix("denied read: ").removeprefix("denied write: ")
            raise RefusedError(
                f"run {name} left something corral could not undo where this run could "
                f"write: {first}; look at it (corral log --run {name}), put it right, "
                f"then remove {path}"
            )
