"""The undo of a landlock run that took the write bit off a directory it could chmod
(``chmod 555 .git/hooks``): corral, as the same user, gives the owner's rights
back through a descriptor and goes on; what it still cannot undo is said as it
is (never "removed") and refuses later runs in that workspace
(:mod:`corral.unfinished`).  As root no mode stops corral: a directory made
immutable (``chattr +i``) stands in for one it cannot change back.  The real
tier as a user: tests/integration/test_landlock_aftercare.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral import paths, restore, unfinished
from corral.errors import RefusedError


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "corral"


@pytest.fixture
def immutable() -> Iterator[list[Path]]:
    """Directories made immutable by the test, made mutable again at its end."""
    made: list[Path] = []
    yield made
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], check=False)


def make_immutable(path: Path, made: list[Path]) -> None:
    if os.geteuid() != 0:
        pytest.skip("chattr +i needs root")
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
        pytest.skip("this file system has no immutable flag")
    made.append(path)


def test_give_back_restores_the_owners_rights_through_descriptors(tmp_path: Path) -> None:
    shut, closed = tmp_path / "shut", tmp_path / "closed"
    shut.mkdir(mode=0o555)
    closed.mkdir(mode=0o000)
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(closed)
    fd = os.open(shut, os.O_RDONLY | os.O_DIRECTORY)
    at = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert paths.give_back(fd) and os.stat(shut).st_mode & 0o777 == 0o755
        assert not paths.give_back(fd)  # the twin: nothing lacking, nothing changed
        assert not paths.give_back_entry(at, "link")  # never followed
        assert os.stat(closed).st_mode & 0o777 == 0
        assert not paths.give_back_entry(at, "file")
        assert paths.give_back_entry(at, "closed") and os.stat(closed).st_mode & 0o777 == 0o700
    finally:
        os.close(fd)
        os.close(at)


def test_a_hook_that_cannot_be_taken_out_is_said_to_stay(
    tmp_path: Path, immutable: list[Path]
) -> None:
    """It once said "(removed); could not restore it: File exists"."""
    hooks = tmp_path / "ws" / ".git" / "hooks"
    hooks.mkdir(parents=True)
    snap = restore.snapshot([str(hooks)])
    (hooks / "pre-commit").write_text("#!/bin/sh\necho planted\n")
    make_immutable(hooks, immutable)
    said = restore.restore(snap, "run-i")
    assert len(said) == 1 and said[0].fields["action"] == "not restored", said
    assert "it stays as the run left it, not restored" in str(said[0]), said
    assert "(removed)" not in str(said[0]) and "File exists" not in str(said[0])
    assert unfinished.left(said) == [str(said[0])]


def test_twin_a_hook_in_a_read_only_directory_is_taken_out(tmp_path: Path) -> None:
    hooks = tmp_path / "ws" / ".git" / "hooks"
    hooks.mkdir(parents=True)
    snap = restore.snapshot([str(hooks)])
    (hooks / "pre-commit").write_text("#!/bin/sh\necho planted\n")
    hooks.chmod(0o555)
    said = restore.restore(snap, "run-r")
    assert "restored from the snapshot" in str(said[0]) and said[0].fields["moved_to"]
    assert list(hooks.iterdir()) == [] and unfinished.left(said) == []


def test_a_record_refuses_runs_that_share_its_places_only(tmp_path: Path) -> None:
    ws, other = str(tmp_path / "ws"), str(tmp_path / "other")
    note = unfinished.record("run-u", [ws], ["denied read: /ws/.env (read-deny) ... inode 42"])
    assert note.fields["action"] == "held" and "refused until" in str(note)
    for places in ([ws], [ws + "/sub"], [str(tmp_path)]):
        with pytest.raises(RefusedError, match=r"run run-u left .* inode 42; look at it"):
            unfinished.check(places)
    unfinished.check([other])  # the twin: another workspace starts
    os.unlink(str(note.fields["path"]))
    unfinished.check([ws])  # and so does this one, once the user removed the record


UNDONE = """
import os, subprocess, sys
from corral import launch
from corral.errors import RefusedError
from corral.policy import Policy
from corral.tiers import get

ws, stuck = sys.argv[1], sys.argv[2] == "stuck"
policy = Policy(ws)
tier = get("none")

def planned():
    plan = tier.plan(policy, ["true"], host=tier.gather(policy))
    plan.strategy.confines = True  # (as on landlock: tier none has no sandbox)
    plan.restore = {ws + "/.git/hooks": "write-deny"}
    return plan

care = launch.Aftercare(planned(), "first")
with open(ws + "/.git/hooks/pre-commit", "w") as f:
    f.write("planted")
if stuck:
    subprocess.run(["chattr", "+i", ws + "/.git/hooks"], check=True)
try:
    said = care.finish()
finally:
    subprocess.run(["chattr", "-i", ws + "/.git/hooks"], check=False)
print("held" if any(d.fields.get("action") == "held" for d in said) else "clean")
try:
    launch.Aftercare(planned(), "second").finish()
    print("started")
except RefusedError as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize("stuck", [True, False], ids=["stuck", "twin"])
def test_a_run_left_unundone_refuses_the_next_one(
    tmp_path: Path, immutable: list[Path], stuck: bool
) -> None:
    ws = tmp_path / "ws"
    (ws / ".git" / "hooks").mkdir(parents=True)
    if stuck:  # (skipped where it cannot be made: the script sets it itself)
        make_immutable(ws / ".git" / "hooks", immutable)
        subprocess.run(["chattr", "-i", str(ws / ".git" / "hooks")], check=True)
    arg = "stuck" if stuck else "fine"
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "HOME": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-c", UNDONE, str(ws), arg], capture_output=True, env=env, timeout=60
    )
    lines = run.stdout.decode().splitlines()
    if not stuck:
        assert lines == ["clean", "started"], run
        return
    assert lines[0] == "held" and lines[1].startswith("refused: run first left"), run
    assert f"{ws}/.git/hooks (write-deny) was changed" in lines[1], run
