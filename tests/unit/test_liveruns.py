"""corral.liveruns: a run's marker while it lives, and the policy files it refuses;
policy.unchecked_place: the ones said on stderr."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
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
        # named, it is checked just as well (a script names a file an agent then
        # rewrote), and says how to vouch for it: pin what it holds
        with pytest.raises(PolicyError) as refused:
            pol.load(str(ws), str(ws / "corral.toml"))
        assert "--policy-sha256 HEX" in str(refused.value)
        digest = hashlib.sha256(POLICY.encode()).hexdigest()
        named = pol.load(str(ws), str(ws / "corral.toml"), sha256=digest)  # the user's choice
        assert named.source == str(ws / "corral.toml")
    finally:
        marker.remove()
    assert os.listdir(liveruns.live_dir()) == [liveruns.JOURNAL]  # no longer live: ended
    with pytest.raises(PolicyError) as refused:  # the run is over, what it may have written stays
        pol.load(str(ws))
    assert "run-1" in str(refused.value) and f"touch {ws / 'corral.toml'}" in str(refused.value)
    _tick()
    os.utime(ws / "corral.toml")  # touched by the user, after review
    assert pol.load(str(ws)).source == str(ws / "corral.toml")


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
    with pytest.raises(PolicyError) as refused:  # ended when found: journaled then
        pol.load(str(ws))
    assert "run-4" in str(refused.value) and "since ended" in str(refused.value)
    assert os.listdir(liveruns.live_dir()) == [liveruns.JOURNAL]
    _tick()
    os.utime(ws / "corral.toml")
    assert pol.load(str(ws)).source == str(ws / "corral.toml")


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


def _ended_run(run_id: str, places: list[Path], during: Callable[[], object]) -> None:
    """A run over ``places`` that does ``during`` and ends (its marker removed)."""
    _tick()
    marker = liveruns.register(run_id, [str(p) for p in places])
    assert marker is not None
    _tick()
    during()
    _tick()
    marker.remove()
    _tick()


def test_a_policy_file_changed_while_an_ended_run_could_write_there_is_refused(
    ws: Path, tmp_path: Path
) -> None:
    """Refused after the run ended (the check after it may have missed it), until
    the user touches or names it; one changed before it started, after it ended
    or outside its places loads."""
    other = Path(os.path.realpath(tmp_path)) / "other"
    for d in (ws / "before", ws / "during", ws / "after", other):
        d.mkdir()
    (ws / "before" / "corral.toml").write_text(POLICY)

    def plant() -> None:
        (ws / "during" / "corral.toml").write_text(POLICY)
        (other / "corral.toml").write_text(POLICY)

    _ended_run("run-6", [ws], plant)
    (ws / "after" / "corral.toml").write_text(POLICY)
    planted = ws / "during" / "corral.toml"
    with pytest.raises(PolicyError) as refused:
        pol.load(str(ws / "during"))
    said = str(refused.value)
    assert said.startswith(f"{planted}: it was made or changed between ") and "\n" not in said
    assert "run run-6" in said and f"pid {os.getpid()}" in said
    assert f"`touch {planted}`" in said and "--policy FILE" in said
    with pytest.raises(PolicyError):  # named: checked too
        pol.load(str(ws / "during"), str(planted))
    digest = hashlib.sha256(planted.read_bytes()).hexdigest()
    assert pol.load(str(ws / "during"), str(planted), sha256=digest).source == str(planted)
    for d in (ws / "before", ws / "after", other):
        assert pol.load(str(d)).source == str(d / "corral.toml")
    os.utime(planted)  # reviewed and touched: after every ended run
    assert pol.load(str(ws / "during")).source == str(planted)


def test_a_policy_link_whose_target_an_ended_run_changed_is_refused(
    ws: Path, tmp_path: Path
) -> None:
    """app/corral.toml -> ../shared/sandbox.toml, rewritten by a run in shared/."""
    (ws / "app").mkdir()
    (ws / "shared").mkdir()
    target = ws / "shared" / "sandbox.toml"
    target.write_text(POLICY)
    (ws / "app" / "corral.toml").symlink_to("../shared/sandbox.toml")
    _ended_run("run-7", [ws / "shared"], lambda: target.write_text(POLICY))
    with pytest.raises(PolicyError) as refused:
        pol.load(str(ws / "app"))
    assert f"what it leads to ({target})" in str(refused.value)
    assert f"`touch {target}`" in str(refused.value)
    os.utime(target)
    assert pol.load(str(ws / "app")).source == str(target)


def test_a_policy_file_an_ended_run_left_moved_in_by_a_live_one_is_refused(ws: Path) -> None:
    """A rename keeps the file's change time (from the ended run's window)."""
    projects = ws / "projects"
    (projects / "node_modules" / "p").mkdir(parents=True)

    def plant() -> None:
        (projects / "node_modules" / "p" / "corral.toml").write_text(POLICY)

    _ended_run("run-8", [projects], plant)
    marker = liveruns.register("run-9", [str(projects)])
    assert marker is not None
    try:
        os.rename(projects / "node_modules" / "p", projects / "foo")
        with pytest.raises(PolicyError) as refused:
            pol.load(str(projects / "foo"))
        assert "run run-8" in str(refused.value)
    finally:
        marker.remove()


def test_the_journal_stays_small(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(liveruns, "JOURNAL_MAX", 4096)
    monkeypatch.setattr(liveruns, "JOURNAL_KEEP", 8)
    os.makedirs(liveruns.live_dir())
    old = time.time_ns() - 31 * 86400 * 10**9
    line = f'{{"start": {old}, "end": {old}, "run": "old", "pid": 1, "places": ["/"]}}\n'
    with open(liveruns.journal_path(), "a") as f:
        f.write(line * 40)
    for n in range(20):
        marker = liveruns.register(f"run-{n}", [str(ws / ("x" * 100))])
        assert marker is not None
        marker.remove()
    lines = Path(liveruns.journal_path()).read_text().splitlines()
    assert 0 < len(lines) <= 8 + 4096 // len(lines[-1]) and '"run":"run-19"' in lines[-1]
    assert not any('"run": "old"' in x for x in lines)
    assert os.stat(liveruns.journal_path()).st_mode & 0o777 == 0o600


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


def test_a_policy_file_corral_put_back_after_the_run_is_the_users(ws: Path) -> None:
    """On landlock a run may change a write-protected policy file; corral puts its
    content back after the run, within the run's window, so its change time said
    "written during the run" and the user's own file was refused from then on
    (seen in the tests).  One that corral restored, unchanged since, loads; the
    twin: changed again after the restore (as only the host can), it is judged
    by its change time as any."""
    (ws / "corral.toml").write_text(POLICY)
    marker = liveruns.register("run-2", [str(ws)])
    assert marker is not None
    _tick()
    (ws / "corral.toml").write_text(POLICY)  # the restore, after the run's command ended
    marker.keep([str(ws / "corral.toml"), str(ws / ".git" / "config")])
    marker.remove()
    assert pol.load(str(ws)).source == str(ws / "corral.toml")
    other = liveruns.register("run-3", [str(ws)])
    assert other is not None
    _tick()
    (ws / "corral.toml").write_text(POLICY)  # during run-3, not put back by corral
    other.remove()
    with pytest.raises(PolicyError) as refused:
        pol.load(str(ws))
    assert "run-3" in str(refused.value)


def test_what_was_read_is_checked_not_only_what_the_path_names(ws: Path) -> None:
    """A run swapping two directories made the path name the user's file when it
    was checked and the run's own when it was read (found by attacking corral):
    the change time of what was read is checked too."""
    (ws / "ci.toml").write_text(POLICY)  # the user's, from before the run
    _tick()
    marker = liveruns.register("run-swap", [str(ws)])
    assert marker is not None
    try:
        _tick()
        (ws / "planted.toml").write_text(POLICY)  # the run's, read in the swap's window
        planted_ctime = os.stat(ws / "planted.toml").st_ctime_ns
        path = str(ws / "ci.toml")
        assert liveruns.planted_by(path) is None  # the path alone: the user's (the twin)
        assert liveruns.planted_by(path, planted_ctime) is not None
        with pytest.raises(PolicyError):
            pol.check_found(path, named=True, read=planted_ctime)
        raw, changed = pol.read_policy(path)  # one descriptor: bytes and change time
        assert raw == POLICY.encode() and changed == os.stat(path).st_ctime_ns
    finally:
        marker.remove()
