"""chmod on the landlock tier: allowed in the writable places, decided by corral's
supervisor in the reaper (corral.chmodsup), refused everywhere else.

Each allow case has a deny twin under the same policy: a file outside, a symlink
or hard link in the workspace leading outside, set-ID bits, chown.  The supervisor
gone (fail closed) is tested at unit level (tests/unit/test_chmodsup.py).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

import pytest
from conftest import Corral

pytestmark = pytest.mark.tiers("landlock", why="the landlock tier's chmod supervisor")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def out(r: object) -> str:
    stdout: bytes = getattr(r, "stdout", b"")
    stderr: bytes = getattr(r, "stderr", b"")
    return (stdout + stderr).decode(errors="replace")


def test_git_init_commit_and_clone_in_the_workspace(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    r = c.sh(
        ws,
        "git init -q repo && cd repo && echo hello > README && git add README && "
        "git -c user.name=a -c user.email=a@b commit -q -m first && echo commit=ok && "
        "cd .. && git clone -q repo copy && cat copy/README",
    )
    assert r.returncode == 0 and "commit=ok" in out(r) and "hello" in out(r), out(r)
    assert (ws / "copy" / ".git" / "config").exists()


def test_chmod_in_the_workspace_and_the_home_layer(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    (ws / "file").write_text("x")
    (ws / "file").chmod(0o644)
    c.chown(ws)
    r = c.sh(
        ws,
        "chmod 600 file && mkdir -p d && chmod 700 d && echo ws=ok; "
        'echo h > "$HOME/h" && chmod 640 "$HOME/h" && stat -c home=%a "$HOME/h"',
    )
    assert "ws=ok" in out(r) and "home=640" in out(r), out(r)
    assert mode(ws / "file") == 0o600 and mode(ws / "d") == 0o700


def test_node_copy_file_in_the_workspace(tsandbox: tuple[Corral, Path]) -> None:
    """libuv gives the copy its source's mode with fchmod, from a worker thread."""
    c, ws = tsandbox
    if not shutil.which("node"):
        pytest.skip("node is not installed here")
    (ws / "src.txt").write_text("copied\n")
    (ws / "src.txt").chmod(0o640)
    c.chown(ws)
    r = c.sh(ws, 'node -e \'require("fs").copyFileSync("src.txt", "dst.txt")\' && echo node=ok')
    assert "node=ok" in out(r), out(r)
    assert (ws / "dst.txt").read_text() == "copied\n" and mode(ws / "dst.txt") == 0o640


PROBE = """
import os, sys
def attempt(what, action):
    try:
        action()
        print(f"{what}=ok")
    except OSError as exc:
        print(f"{what}=err:{exc.errno}")
outside = sys.argv[1]
attempt("twin", lambda: os.chmod("mine", 0o600))
attempt("outside", lambda: os.chmod(outside, 0o666))
attempt("symlink", lambda: os.chmod("escape", 0o666))
attempt("hardlink", lambda: os.chmod("linked", 0o666))
attempt("setuid", lambda: os.chmod("mine", 0o4755))
attempt("chown", lambda: os.chown("mine", os.getuid(), os.getgid()))
"""


def test_chmod_outside_the_writable_places_stays_refused(tsandbox: tuple[Corral, Path]) -> None:
    """Deny twins in one run, beside an allowed chmod: a file the user owns outside
    the workspace, reached by name, through a symlink or a hard link in the
    workspace; set-ID bits; chown.  Nothing outside changes."""
    c, ws = tsandbox
    outside = c.home / "outside.txt"
    outside.write_text("mine\n")
    outside.chmod(0o600)
    (ws / "mine").write_text("x")
    (ws / "mine").chmod(0o644)
    (ws / "escape").symlink_to(outside)
    os.link(outside, ws / "linked")
    c.chown(ws, c.home)
    r = c.run(["run", "-q", "--", "python3", "-c", PROBE, str(outside)], cwd=ws)
    text = out(r)
    assert "twin=ok" in text and mode(ws / "mine") == 0o600, text
    for what in ("outside", "symlink", "hardlink", "setuid", "chown"):
        assert f"{what}={'err:' + str(errno.EPERM)}" in text, (what, text)
    assert mode(outside) == 0o600 and outside.read_text() == "mine\n"


# 300 chmods at least; on a loaded machine the swapping thread can win every one
# of them, so the loop goes on (up to 10 s) until one has landed inside
RACE = """
import os, sys, threading, time
outside = sys.argv[1]
stop = threading.Event()
def swap():
    while not stop.is_set():
        for target in ("mine", outside):
            os.symlink(target, "flip.new")
            os.rename("flip.new", "flip")
threading.Thread(target=swap, daemon=True).start()
done = i = 0
deadline = time.monotonic() + 10
while i < 300 or (done == 0 and time.monotonic() < deadline):
    try:
        os.chmod("flip", 0o640 | (i & 0o7))
        done += 1
    except OSError:
        pass
    i += 1
stop.set()
print(f"done={done}")
"""


def test_a_symlink_swapped_during_chmod_never_reaches_outside(
    tsandbox: tuple[Corral, Path],
) -> None:
    """A thread swaps a workspace symlink between a file inside and one outside
    while chmod loops through it: some chmods land inside, none outside."""
    c, ws = tsandbox
    outside = c.home / "outside.txt"
    outside.write_text("mine\n")
    outside.chmod(0o600)
    (ws / "mine").write_text("x")
    c.chown(ws, c.home)
    r = c.run(["run", "-q", "--", "python3", "-c", RACE, str(outside)], cwd=ws, timeout=120)
    assert "done=" in out(r) and "done=0\n" not in out(r), out(r)
    assert mode(outside) == 0o600
