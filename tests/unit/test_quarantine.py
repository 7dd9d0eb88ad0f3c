"""corral.quarantine: a rename on one filesystem; across two (a real tmpfs, /dev/shm,
against tmp_path on disk) a bounded copy, and what cannot be copied removed."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral import quarantine


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "corral" / "quarantine"


@pytest.fixture
def other_fs() -> Iterator[Path]:
    """A workspace on another filesystem than tmp_path (where the state is)."""
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat("/tmp").st_dev:
        pytest.skip("no /dev/shm on another filesystem than /tmp on this host")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as where:
        yield Path(where)


def test_one_filesystem_is_a_rename(tmp_path: Path, state: Path) -> None:
    hooks = tmp_path / "ws" / ".git" / "hooks"
    hooks.mkdir(parents=True)
    (hooks / "pre-commit").write_text("x\n")
    dest, error = quarantine.move_out(str(hooks), "run1")
    assert error == "" and Path(dest) == state / "run1" / str(hooks).lstrip("/")
    assert (Path(dest) / "pre-commit").read_text() == "x\n" and not hooks.exists()


def test_another_filesystem_is_a_copy_within_bounds(state: Path, other_fs: Path) -> None:
    made = other_fs / ".vscode"
    made.mkdir()
    (made / "tasks.json").write_text("{}\n")
    os.symlink("/etc/passwd", made / "link")  # copied as a link, never followed
    dest, error = quarantine.move_out(str(made), "run1")
    assert error == "" and not made.exists()
    assert (Path(dest) / "tasks.json").read_text() == "{}\n"
    assert os.readlink(Path(dest) / "link") == "/etc/passwd"


def test_too_large_or_uncopyable_is_removed(
    state: Path, other_fs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run can make what it leaves as large as its disk allows: beyond the bound
    it is removed, not copied into the user's home (the twin above: copied)."""
    monkeypatch.setattr(quarantine, "COPY_MAX", 1000)
    big = other_fs / "big"
    big.mkdir()
    (big / "blob").write_bytes(b"x" * 2000)
    dest, error = quarantine.move_out(str(big), "run1")
    assert dest == "" and "removed instead (more than 0 MiB" in error and not big.exists()
    pipe = other_fs / "pipe"
    pipe.mkdir()
    os.mkfifo(pipe / "fifo")
    dest, error = quarantine.move_out(str(pipe), "run1")
    assert dest == "" and error.startswith("removed instead") and not pipe.exists()
    assert not (state / "run1").exists() or not any((state / "run1").rglob("fifo"))


def test_an_unwritable_state_directory_still_empties_the_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "state-file"
    blocker.write_text("")  # state "directory" that is a file: nothing can go there
    monkeypatch.setenv("XDG_STATE_HOME", str(blocker))
    hook = tmp_path / "ws" / "pre-commit"
    hook.parent.mkdir()
    hook.write_text("x\n")
    dest, error = quarantine.move_out(str(hook), "run1")
    assert dest == "" and error.startswith("removed instead") and not hook.exists()
