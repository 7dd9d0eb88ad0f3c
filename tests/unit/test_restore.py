"""corral.restore on a real directory: what a snapshot puts back, to the nanosecond."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from corral import restore

OLD = 1_000_000_000_123_456_789


@pytest.fixture
def git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    root = tmp_path / "ws" / ".git"
    (root / "hooks").mkdir(parents=True)
    (root / "config").write_text("[core]\n")
    (root / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
    (root / "hooks" / "link").symlink_to("pre-commit")
    os.chmod(root / "config", 0o600)
    os.chmod(root / "hooks" / "pre-commit", 0o750)
    for path in (root / "config", root / "hooks" / "pre-commit", root / "hooks"):
        os.utime(path, ns=(OLD, OLD))
    os.utime(root / "hooks" / "link", ns=(OLD, OLD), follow_symlinks=False)
    return root


def state(path: Path) -> tuple[bytes, int, int]:
    st = os.lstat(path)
    data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
    return data, st.st_mode, st.st_mtime_ns


def test_content_mode_and_times_come_back(git: Path) -> None:
    paths = [git / "config", git / "hooks"]
    watched = [git / "config", git / "hooks", git / "hooks" / "pre-commit", git / "hooks" / "link"]
    before = {p: state(p) for p in watched}
    snap = restore.snapshot([str(p) for p in paths])
    (git / "config").unlink()
    (git / "config").write_text("evil\n")  # a new file: new mode from the umask, new times
    os.utime(git / "hooks" / "pre-commit")  # a touch alone is a change
    os.utime(git, ns=(OLD + 5, OLD + 5))  # as the run leaves the parent
    said = restore.restore(snap, "run-1")
    assert len(said) == 2 and all("restored from the snapshot" in str(s) for s in said), said
    assert {d.fields["action"] for d in said} == {"restored"}
    assert {d.fields["path"] for d in said} == {str(git / "config"), str(git / "hooks")}
    for path, was in before.items():
        assert state(path) == was, path
    assert os.stat(git).st_mtime_ns == OLD + 5  # the undo itself leaves no trace there


def test_unchanged_or_only_read_is_not_a_change(git: Path) -> None:
    snap = restore.snapshot([str(git / "config"), str(git / "hooks")])
    (git / "config").read_bytes()
    os.utime(git / "config", ns=(OLD + 99, OLD))  # an access time alone moved
    assert restore.restore(snap, "run-2") == []
    assert os.stat(git / "config").st_mtime_ns == OLD


def test_a_fifo_swapped_in_after_the_look_never_holds_the_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process of the run still alive could put a FIFO where the walk just saw a
    regular file: the open does not wait, and the walk stops with a reason."""
    fifo = tmp_path / "config"
    os.mkfifo(fifo)
    regular = os.stat(tmp_path)  # its times; the mode is made regular below
    real_lstat = os.lstat

    class Regular:
        st_mode = stat.S_IFREG | 0o644
        st_size = 0
        st_mtime_ns = regular.st_mtime_ns
        st_atime_ns = regular.st_atime_ns

    def lstat(path: object) -> object:
        return Regular() if str(path) == str(fifo) else real_lstat(path)  # type: ignore[arg-type]

    monkeypatch.setattr(restore.os, "lstat", lstat)
    with pytest.raises(restore.TooLarge, match="no longer a regular file"):
        restore._walk(str(fifo))
