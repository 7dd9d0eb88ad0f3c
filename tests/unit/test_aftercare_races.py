"""The aftercare of one run while another sandbox still runs in the same workspace:
a directory on the way to what is restored or quarantined swapped for a symlink
to a host directory between the check and the act (found by attacking corral).
Nothing outside the workspace may be created, moved or removed; each race has a
twin where the same restore or quarantine, unraced, still works.  Also the
quarantine's bounds: depth (no RecursionError) and one copy budget per run."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral import gitguard, launch, quarantine, restore

PAYLOAD = '[core]\n\tfsmonitor = "touch /tmp/pwned"\n'


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(quarantine, "_copied", {}, raising=False)  # the per-run budgets
    return tmp_path / "state" / "corral" / "quarantine"


@pytest.fixture
def other_fs() -> Iterator[Path]:
    """A directory on another filesystem than tmp_path (where the state is)."""
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat("/tmp").st_dev:
        pytest.skip("no /dev/shm on another filesystem than /tmp on this host")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as where:
        yield Path(where)


def swap_for_link(directory: Path, target: Path) -> Path:
    """What the other sandbox does: its real directory parked, a symlink in its place."""
    park = directory.parent / (directory.name + ".parked")
    os.rename(directory, park)
    os.symlink(target, directory)
    return park


def repository(root: Path) -> Path:
    git = root / "r" / ".git"
    (git / "hooks").mkdir(parents=True)
    (git / "config").write_text("[core]\n\tbare = false\n")
    return git


# --- restore: the write-deny r/.git/config put back through a swapped r/.git


def restore_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, race: bool
) -> tuple[Path, Path, list[Any]]:
    host = tmp_path / "home" / ".config" / "git"
    host.mkdir(parents=True)
    git = repository(tmp_path / "ws")
    config = str(git / "config")
    snap = restore.snapshot([config])
    (git / "config").write_text(PAYLOAD)  # the run's change
    real = launch.quarantine

    def quarantine_then_swap(paths: list[str], run_id: str) -> list[Any]:
        said = real(paths, run_id)
        if race:  # after the check of r/.git, before the snapshot is written back
            swap_for_link(git, host)
        return said

    monkeypatch.setattr(launch, "quarantine", quarantine_then_swap)
    return host, git, restore.restore(snap, "run1")


def test_a_restore_never_writes_through_a_directory_swapped_for_a_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, git, said = restore_with(tmp_path, monkeypatch, race=True)
    assert list(host.iterdir()) == [], said  # no ~/.config/git/config made
    # put back in the directory walked to (the one the other run parked)
    parked = git.parent / ".git.parked"
    assert (parked / "config").read_text() == "[core]\n\tbare = false\n"
    assert len(said) == 1


def test_twin_a_restore_unraced_puts_the_config_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, git, said = restore_with(tmp_path, monkeypatch, race=False)
    assert (git / "config").read_text() == "[core]\n\tbare = false\n"
    assert "restored from the snapshot" in str(said[0]) and list(host.iterdir()) == []


def test_a_restore_refuses_a_parent_that_is_a_symlink_when_walked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swap made between the realpath check and the walk: nothing is done."""
    host = tmp_path / "home" / ".config" / "git"
    host.mkdir(parents=True)
    git = repository(tmp_path / "ws")
    snap = restore.snapshot([str(git / "config")])
    (git / "config").unlink()
    real = os.path.realpath

    def realpath_then_swap(path: Any, **kw: Any) -> Any:
        found = real(path, **kw)
        if str(path) == str(git) and not git.is_symlink():
            swap_for_link(git, host)
        return found

    monkeypatch.setattr(os.path, "realpath", realpath_then_swap)
    said = restore.restore(snap, "run1")
    monkeypatch.undo()
    assert list(host.iterdir()) == []
    assert said[0].fields["action"] == "not restored"


# --- snapshot: .git/hooks/p swapped for a link to a host directory mid-walk


def snapshot_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, race: bool
) -> dict[str, restore.Tree]:
    """Another run plants hooks/p/{a/big, secret} and, when this launcher opens
    p/a/big for its snapshot, swaps p for a link to a host directory holding an
    unreadable ``secret``."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret").write_text("TOPSECRET\n")
    (host / "secret").chmod(0o600)
    hooks = repository(tmp_path / "ws") / "hooks"
    (hooks / "p" / "a").mkdir(parents=True)
    (hooks / "p" / "a" / "big").write_bytes(b"\0" * 4096)
    (hooks / "p" / "secret").write_text("decoy\n")
    real_open = os.open

    def open_then_swap(path: Any, *args: Any, **kw: Any) -> int:
        fd = real_open(path, *args, **kw)
        if race and os.path.basename(str(path)) == "big" and not (hooks / "p").is_symlink():
            swap_for_link(hooks / "p", host)
        return fd

    monkeypatch.setattr(os, "open", open_then_swap)
    snap = restore.snapshot([str(hooks)])
    monkeypatch.undo()
    return snap


def test_a_snapshot_never_reads_through_a_directory_swapped_mid_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = snapshot_with(tmp_path, monkeypatch, race=True)
    (tree,) = snap.values()
    assert all(b"TOPSECRET" not in entry[2] for entry in tree.values()), tree
    assert tree["p/secret"][2] == b"decoy\n"  # read in the directory walked to


def test_twin_a_snapshot_unraced_holds_the_whole_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = snapshot_with(tmp_path, monkeypatch, race=False)
    (tree,) = snap.values()
    assert sorted(tree) == ["", "p", "p/a", "p/a/big", "p/secret"]
    assert tree["p/secret"][2] == b"decoy\n" and tree["p/a/big"][2] == b"\0" * 4096


def test_a_snapshot_refuses_a_symlink_on_the_way(tmp_path: Path) -> None:
    """Swapped before the launcher looked: not read through, and the launch is
    refused (corral.launch turns the OSError into a refusal); the twin: the
    directory walked to snapshots as ever."""
    host = tmp_path / "host"
    (host / "hooks").mkdir(parents=True)
    (host / "hooks" / "secret").write_text("TOPSECRET\n")
    git = repository(tmp_path / "ws")
    parked = swap_for_link(git, host)
    with pytest.raises(OSError):
        restore.snapshot([str(git / "hooks")])
    snap = restore.snapshot([str(parked / "config")])
    assert snap[str(parked / "config")][""][2] == b"[core]\n\tbare = false\n"


# --- quarantine: a new repository's hook moved out through a swapped hooks/


def test_gitguard_never_moves_host_files_through_a_swapped_hooks_dir(
    tmp_path: Path, state: Path
) -> None:
    victim = tmp_path / "home"
    victim.mkdir()
    (victim / ".bashrc").write_text("precious\n")
    git = repository(tmp_path / "ws")
    (git / "hooks" / ".bashrc").write_text("#!/bin/sh\necho planted\n")
    found = [(str(git / "hooks" / ".bashrc"), "a git hook")]  # the check, then:
    swap_for_link(git / "hooks", victim)
    said = gitguard.quarantine(found, "run1")
    assert (victim / ".bashrc").read_text() == "precious\n"
    assert not state.exists() or not any(state.rglob(".bashrc"))
    assert "not followed" in str(said[0]) and said[0].fields["moved_to"] is None


def test_twin_gitguard_moves_the_hook_out(tmp_path: Path, state: Path) -> None:
    git = repository(tmp_path / "ws")
    (git / "hooks" / ".bashrc").write_text("#!/bin/sh\necho planted\n")
    said = gitguard.quarantine([(str(git / "hooks" / ".bashrc"), "a git hook")], "run1")
    assert not (git / "hooks" / ".bashrc").exists()
    assert said[0].fields["moved_to"] and Path(str(said[0].fields["moved_to"])).is_file()


def test_launch_quarantine_never_moves_through_a_link_made_after_its_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "home"
    victim.mkdir()
    (victim / "pre-commit").write_text("precious\n")
    git = repository(tmp_path / "ws")
    (git / "hooks" / "pre-commit").write_text("planted\n")
    real = launch.not_through_links

    def check_then_swap(path: str, plain: dict[str, bool] | None = None) -> str:
        where = real(path, plain)
        swap_for_link(git / "hooks", victim)
        return where

    monkeypatch.setattr(launch, "not_through_links", check_then_swap)
    said = launch.quarantine([str(git / "hooks" / "pre-commit")], "run1")
    assert (victim / "pre-commit").read_text() == "precious\n"
    assert said and said[0].fields["error"] and "not followed" in str(said[0].fields["error"])


def test_the_copy_fallback_never_removes_through_a_swapped_directory(
    other_fs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """State on another filesystem: a copy, then a removal, of what the walk held."""
    victim = other_fs / "home"
    victim.mkdir()
    (victim / ".bashrc").write_text("precious\n")
    git = repository(other_fs / "ws")
    (git / "hooks" / ".bashrc").write_text("planted\n")
    swap_at_the_first(monkeypatch, os, "rename", lambda: swap_for_link(git / "hooks", victim))
    dest, error = quarantine.move_out(str(git / "hooks" / ".bashrc"), "run1")
    assert (victim / ".bashrc").read_text() == "precious\n", (dest, error)
    assert error == "" and Path(dest).read_text() == "planted\n"
    assert not (git.parent / ".git" / "hooks.parked" / ".bashrc").exists()


def test_twin_the_copy_fallback_moves_a_hook_out(other_fs: Path) -> None:
    git = repository(other_fs / "ws")
    (git / "hooks" / ".bashrc").write_text("planted\n")
    dest, error = quarantine.move_out(str(git / "hooks" / ".bashrc"), "run1")
    assert error == "" and Path(dest).read_text() == "planted\n"
    assert not (git / "hooks" / ".bashrc").exists()


def swap_at_the_first(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str, swap: Callable[[], object]
) -> None:
    real = getattr(module, name)
    done: list[bool] = []

    def wrapped(*args: Any, **kw: Any) -> Any:
        if not done:
            done.append(True)
            swap()
        return real(*args, **kw)

    monkeypatch.setattr(module, name, wrapped)


# --- the quarantine's bounds


def test_a_deep_tree_is_removed_not_a_recursion_error(other_fs: Path) -> None:
    vscode = other_fs / ".vscode"
    vscode.mkdir()
    fd = os.open(vscode, os.O_RDONLY)
    for _ in range(1200):  # (no recursion here either)
        os.mkdir("d", dir_fd=fd)
        deeper = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(fd)
    (vscode / "tasks.json").write_text("{}\n")
    dest, error = quarantine.move_out(str(vscode), "run1")
    assert dest == "" and "removed instead (more than 64 directories deep" in error
    assert not vscode.exists()


def test_twin_a_shallow_tree_is_copied(other_fs: Path) -> None:
    vscode = other_fs / ".vscode"
    (vscode / ("d/" * 10)).mkdir(parents=True)
    (vscode / "tasks.json").write_text("{}\n")
    dest, error = quarantine.move_out(str(vscode), "run1")
    assert error == "" and (Path(dest) / "tasks.json").read_text() == "{}\n"
    assert (Path(dest) / ("d/" * 10)).is_dir() and not vscode.exists()


def test_the_copy_budget_is_per_run(other_fs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quarantine, "COPY_MAX", 5000)
    hooks = []
    for n in range(3):
        hook = other_fs / f"r{n}" / "hooks"
        hook.mkdir(parents=True)
        (hook / "pre-commit").write_bytes(b"x" * 2000)
        hooks.append(hook)
    first = quarantine.move_out(str(hooks[0]), "run1")
    second = quarantine.move_out(str(hooks[1]), "run1")
    third = quarantine.move_out(str(hooks[2]), "run1")
    assert first[1] == "" and second[1] == ""
    assert third[0] == "" and third[1].startswith("removed instead (more than")
    assert not any(h.exists() for h in hooks)
    # another run has its own budget
    again = other_fs / "again"
    again.mkdir()
    (again / "pre-commit").write_bytes(b"x" * 2000)
    assert quarantine.move_out(str(again), "run2")[1] == ""


# --- the shared walk


def test_the_walk_refuses_a_symlink_anywhere_and_never_makes_through_one(tmp_path: Path) -> None:
    from corral.paths import open_dir, open_parent

    host = tmp_path / "host"
    host.mkdir()
    (tmp_path / "ws" / "r").mkdir(parents=True)
    os.symlink(host, tmp_path / "ws" / "r" / ".git")
    for path in (tmp_path / "ws" / "r" / ".git", tmp_path / "ws" / "r" / ".git" / "hooks"):
        with pytest.raises(OSError):
            os.close(open_dir(str(path), make=True))
    with pytest.raises(OSError):
        open_parent(str(tmp_path / "ws" / "r" / ".git" / "config"))
    assert list(host.iterdir()) == []
    # the twin: a plain path is walked, and missing directories made
    fd = open_dir(str(tmp_path / "ws" / "r" / "sub" / "deeper"), make=True)
    os.close(fd)
    assert (tmp_path / "ws" / "r" / "sub" / "deeper").is_dir()
    parent, name = open_parent(str(tmp_path / "ws" / "r" / "x"))
    os.close(parent)
    assert name == "x"
