"""corral.lockwatch against the real kernel: inotify on a temporary git dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from syscall_paths import syscalls  # noqa: F401  (the fixture)

from corral.lockwatch import LockWatch, parse_events


def watch(git: Path) -> LockWatch:
    return LockWatch({str(git): {"config.lock": str(git / "config")}})


@pytest.mark.usefixtures("syscalls")
def test_a_lock_created_and_removed_is_a_refused_write(tmp_path: Path) -> None:
    (tmp_path / "config").write_text("[core]\n")
    w = watch(tmp_path)
    for _ in range(2):  # git tries, the rename fails (EBUSY in the sandbox), the lock goes
        (tmp_path / "config.lock").write_text("[core]\n\tx = 1\n")
        (tmp_path / "config.lock").unlink()
    (tmp_path / "index.lock").write_text("")  # other files in the directory are not ours
    (tmp_path / "index.lock").unlink()
    found = w.finish()
    assert [(d.fields["path"], d.fields["count"]) for d in found] == [(str(tmp_path / "config"), 2)]
    assert w.fd == -1  # closed


def test_a_lock_renamed_over_the_file_is_a_write_that_happened(tmp_path: Path) -> None:
    (tmp_path / "config").write_text("[core]\n")
    w = watch(tmp_path)
    (tmp_path / "config.lock").write_text("[core]\n\tx = 1\n")
    os.rename(tmp_path / "config.lock", tmp_path / "config")  # the allow twin: it went through
    assert w.finish() == []


def test_a_lock_left_behind_counts_and_a_stale_one_does_not(tmp_path: Path) -> None:
    (tmp_path / "config.lock").write_text("stale, from before the run\n")
    w = watch(tmp_path)
    (tmp_path / "config.lock").unlink()  # removed, never created during the run: not ours
    assert w.finish() == []
    w = watch(tmp_path)
    (tmp_path / "config.lock").write_text("the writer died\n")
    assert len(w.finish()) == 1


@pytest.mark.usefixtures("syscalls")
def test_a_missing_directory_is_no_error(tmp_path: Path) -> None:
    w = LockWatch({str(tmp_path / "gone"): {"config.lock": str(tmp_path / "gone" / "config")}})
    assert w.finish() == []


def test_parse_events_reads_packed_records() -> None:
    def record(wd: int, mask: int, name: bytes) -> bytes:
        padded = name + b"\0" * (16 - len(name))
        return (
            wd.to_bytes(4, "little", signed=True)
            + mask.to_bytes(4, "little")
            + (0).to_bytes(4, "little")
            + len(padded).to_bytes(4, "little")
            + padded
        )

    data = record(1, 0x100, b"config.lock") + record(2, 0x40, b"x") + record(1, 0x200, b"")
    assert parse_events(data) == [(1, 0x100, "config.lock"), (2, 0x40, "x"), (1, 0x200, "")]
