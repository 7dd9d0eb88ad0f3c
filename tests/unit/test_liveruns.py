"""corral.liveruns: a run's marker while it lives, and the policy files it refuses;
policy.unchecked_place: the ones said on stderr."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from corral import liveruns
from corral import policy as pol
from corral.errors import PolicyError

POLICY = '[network]\nmode = "none"\n'


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    work = tmp_path / "ws"
    work.mkdir()
    return Path(os.path.realpath(work))


def _tick() -> None:
    """Past the file system clock's tick, so that change times differ."""
    time.sleep(0.02)


def test_a_policy_file_made_during_a_live_run_is_refused(ws: Path) -> None:
    marker = liveruns.register("run-1", [str(ws)])
    assert marker is not None
    try:
        _tick()
        (ws / "corral.toml").write_text(POLICY)
        with pytest.raises(PolicyError) as refused:
            pol.load(str(ws))
        said = str(refused.value)
        assert str(ws / "corral.toml") in said and f"pid {os.getpid()}" in said
        assert "\n" not in said
        named = pol.load(str(ws), str(ws / "corral.toml"))  # named: the user's choice
        assert named.source == str(ws / "corral.toml")
    finally:
        marker.remove()
    assert pol.load(str(ws)).source == str(ws / "corral.toml")  # the run is over
    assert os.listdir(liveruns.live_dir()) == []


def test_a_policy_file_from_before_or_elsewhere_loads(ws: Path, tmp_path: Path) -> None:
    (ws / "corral.toml").write_text(POLICY)
    other = tmp_path / "other"
    other.mkdir()
    _tick()
    marker = liveruns.register("run-2", [str(other)])
    assert marker is not None
    try:
        _tick()
        assert pol.load(str(ws)).source == str(ws / "corral.toml")  # made before it
        (ws / "corral.toml").write_text(POLICY)  # changed now, but not where it writes
        assert pol.load(str(ws)).source == str(ws / "corral.toml")
    finally:
        marker.remove()


def test_an_old_file_linked_in_during_the_run_is_refused(ws: Path) -> None:
    """The link is new though what it leads to is old: its own change time counts."""
    (ws / "notes.txt").write_text(POLICY)
    _tick()
    marker = liveruns.register("run-3", [str(ws)])
    assert marker is not None
    try:
        _tick()
        (ws / "corral.toml").symlink_to("notes.txt")
        with pytest.raises(PolicyError):
            pol.load(str(ws))
    finally:
        marker.remove()


def test_a_marker_no_process_holds_is_stale(ws: Path) -> None:
    """Its run and guardian were killed (the lock went with them): ignored, removed."""
    pid = os.fork()
    if pid == 0:
        try:
            liveruns.register("run-4", [str(ws)])
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.listdir(liveruns.live_dir()) == ["run-4"]
    _tick()
    (ws / "corral.toml").write_text(POLICY)
    assert pol.load(str(ws)).source == str(ws / "corral.toml")
    assert os.listdir(liveruns.live_dir()) == []


def test_the_lock_lives_in_a_forked_holder(ws: Path) -> None:
    """The guardian holds the lock too: live while corral's own copy is closed."""
    marker = liveruns.register("run-5", [str(ws)])
    assert marker is not None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the guardian's part: hold it until told
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    os.close(marker.fd)  # corral killed: its descriptor gone, the file still there
    try:
        assert [run.pid for run in liveruns.live_runs()] == [os.getpid()]
    finally:
        os.close(w)
        os.waitpid(pid, 0)
    assert liveruns.live_runs() == []


def test_policy_files_where_the_check_after_a_run_does_not_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    repo = Path(os.path.realpath(tmp_path)) / "repo"
    deep = repo / "a" / "b"
    skipped = repo / "node_modules" / "pkg"
    for d in (repo / ".git", deep, skipped):
        d.mkdir(parents=True)
    for d in (repo, deep, skipped):
        (d / "corral.toml").write_text(POLICY)
    assert pol.unchecked_place(str(repo / "corral.toml")) is None  # its own top
    said = pol.unchecked_place(str(deep / "corral.toml"))
    assert said is not None and str(deep / "corral.toml") in said and f"below {repo}," in said
    said = pol.unchecked_place(str(skipped / "corral.toml"))
    assert said is not None and "inside node_modules/" in said
    # a workspace corral keeps a home layer for counts as a root, .git or not
    plain = Path(os.path.realpath(tmp_path)) / "plain"
    (plain / "sub").mkdir(parents=True)
    (plain / "sub" / "corral.toml").write_text(POLICY)
    assert pol.unchecked_place(str(plain / "sub" / "corral.toml")) is None
    from corral import home

    os.makedirs(home.layer_path(str(plain)))
    assert f"below {plain}," in (pol.unchecked_place(str(plain / "sub" / "corral.toml")) or "")


def test_the_warning_is_one_line_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    sub = Path(os.path.realpath(tmp_path)) / "repo" / "sub"
    sub.mkdir(parents=True)
    (sub.parent / ".git").mkdir()
    (sub / "corral.toml").write_text(POLICY)
    assert pol.load(str(sub)).source == str(sub / "corral.toml")
    err = capsys.readouterr().err
    assert err.startswith("corral: warning: policy file ") and err.count("\n") == 1
    pol.load(str(sub), str(sub / "corral.toml"))  # named: nothing said
    assert capsys.readouterr().err == ""
