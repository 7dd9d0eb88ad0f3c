"""The landlock tier's undo when the run took the write bit off a directory.

corral runs as the user, the run too: a run that plants a git hook and then
``chmod 555 .git/hooks`` (or sets ``core.fsmonitor`` and ``chmod 555 .git``, or
moves ``.env`` into a directory it makes read-only) once left corral unable to
move, remove or put back anything there; the hook then ran on the host at the
next commit, the next run read the secret (found by attacking corral).  As root
the modes never stopped corral; as a user they did.  Each case has a twin run
without the ``chmod``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import Corral

pytestmark = pytest.mark.tiers("landlock", why="the landlock tier's restore and quarantine")

HOOK = "#!/bin/sh\necho planted\n"


def repository(c: Corral, ws: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    c.chown(ws)
    return ws / ".git"


@pytest.mark.parametrize("chmod", [True, False], ids=["read-only", "twin"])
def test_a_hook_in_a_read_only_hooks_directory_is_taken_out(
    tsandbox: tuple[Corral, Path], chmod: bool
) -> None:
    c, ws = tsandbox
    git = repository(c, ws)
    r = c.sh(
        ws,
        f"printf '{HOOK}' > .git/hooks/pre-commit && chmod 755 .git/hooks/pre-commit"
        + (" && chmod 555 .git/hooks" if chmod else "")
        + " && echo planted",
    )
    assert b"planted" in r.stdout, r
    assert not (git / "hooks" / "pre-commit").exists(), r.stderr
    assert (git / "hooks").stat().st_mode & 0o700 == 0o700
    assert b"restored from the snapshot taken at launch" in r.stderr, r.stderr
    assert b"could not" not in r.stderr, r.stderr
    again = c.sh(ws, "echo again")  # nothing left: the next run is not refused
    assert again.returncode == 0 and again.stdout == b"again\n", again


@pytest.mark.parametrize("chmod", [True, False], ids=["read-only", "twin"])
def test_a_config_in_a_read_only_git_directory_is_put_back(
    tsandbox: tuple[Corral, Path], chmod: bool
) -> None:
    c, ws = tsandbox
    git = repository(c, ws)
    before = (git / "config").read_text()
    r = c.sh(
        ws,
        "git config core.fsmonitor 'touch /tmp/pwned; false'"
        + (" && chmod 555 .git" if chmod else "")
        + " && echo set",
    )
    assert b"set" in r.stdout, r
    assert (git / "config").read_text() == before, r.stderr
    assert b"restored from the snapshot taken at launch" in r.stderr, r.stderr


@pytest.mark.parametrize("chmod", [True, False], ids=["read-only", "twin"])
def test_a_secret_moved_into_a_read_only_directory_never_reaches_a_later_run(
    tsandbox: tuple[Corral, Path], chmod: bool
) -> None:
    c, ws = tsandbox
    (ws / ".env").write_text("CANARY-dotenv\n")
    c.chown(ws)
    first = c.sh(
        ws,
        "mkdir d && mv .env d/notes.txt" + (" && chmod 555 d" if chmod else "") + " && echo moved",
    )
    assert b"moved" in first.stdout, first
    assert b"moved that to" in first.stderr, first.stderr
    later = c.sh(ws, "cat d/notes.txt .env 2>&1; true")
    assert later.returncode == 0 and b"CANARY" not in later.stdout, later
    assert (ws / ".env").read_text() == "CANARY-dotenv\n"
    assert not (ws / "d" / "notes.txt").exists()
