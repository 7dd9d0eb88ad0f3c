"""corral.restore on a real directory: what a snapshot puts back, to the nanosecond."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from corral import restore
from corral.report import Denial

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
    real_stat = os.stat

    class Regular:
        st_mode = stat.S_IFREG | 0o644
        st_size = 0
        st_mtime_ns = regular.st_mtime_ns
        st_atime_ns = regular.st_atime_ns
        st_dev, st_ino, st_nlink = regular.st_dev, 1, 1

    def look(path: Any, **kw: Any) -> object:  # the walk's look, by its directory
        return Regular() if str(path) == fifo.name and "dir_fd" in kw else real_stat(path, **kw)

    monkeypatch.setattr(os, "stat", look)
    with pytest.raises(restore.TooLarge, match="no longer a regular file"):
        restore._walk(str(fifo))


@pytest.fixture
def secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = tmp_path / "ws"
    (ws / "private").mkdir(parents=True)
    (ws / ".env").write_text("KEY=secret\n")
    (ws / "private" / "id").write_text("ID=secret\n")
    (ws / "plain.txt").write_text("plain\n")
    return ws


def _settle(ws: Path, run: Callable[[], object]) -> list[str]:
    """Snapshot the two secrets (and a write-deny twin), do ``run``, restore."""
    rules = {str(ws / ".env"): "read-deny", str(ws / "private"): "read-deny"}
    snap = restore.snapshot(rules)
    run()
    said = restore.restore(snap, "run-s", rules, [str(ws)])
    return [str(d) for d in said]


def _holders(ws: Path) -> set[str]:
    return {
        str(f.relative_to(ws))
        for f in ws.rglob("*")
        if f.is_file() and not f.is_symlink() and b"secret" in f.read_bytes()
    }


def test_a_secret_renamed_anywhere_in_the_workspace_is_taken_out(secrets: Path) -> None:
    ws = secrets

    def run() -> None:
        (ws / "new").mkdir()
        (ws / ".env").rename(ws / "new" / "notes.txt")
        (ws / "private").rename(ws / "public")

    said = _settle(ws, run)
    assert _holders(ws) == {".env", "private/id"}
    assert not (ws / "public").exists() and (ws / "new").is_dir()
    copies = [s for s in said if "was moved or linked to" in s]
    assert len(copies) == 2 and all("moved that to" in s for s in copies), said  # no name left
    assert sum("restored from the snapshot" in s for s in said) == 2


def test_a_hard_link_to_an_unchanged_secret_is_taken_out(secrets: Path) -> None:
    ws = secrets
    said = _settle(ws, lambda: os.link(ws / ".env", ws / "link.txt"))
    assert not (ws / "link.txt").exists()
    assert (ws / ".env").read_text() == "KEY=secret\n" and os.stat(ws / ".env").st_nlink == 1
    assert len(said) == 1 and f"linked to {ws / 'link.txt'}; removed that link" in said[0]


def test_a_secret_rewritten_in_place_is_put_back_and_plain_files_stay(secrets: Path) -> None:
    ws = secrets

    def run() -> None:
        (ws / ".env").write_text("wiped\n")
        (ws / "plain.txt").rename(ws / "renamed.txt")  # the twin: not a secret
        os.link(ws / "renamed.txt", ws / "linked.txt")

    said = _settle(ws, run)
    assert (ws / ".env").read_text() == "KEY=secret\n"
    assert (ws / "renamed.txt").read_text() == (ws / "linked.txt").read_text() == "plain\n"
    assert len(said) == 1 and "(read-deny) was changed" in said[0]


def test_an_unchanged_secret_costs_no_search(
    secrets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(restore, "_find_inodes", None)  # never called
    assert _settle(secrets, lambda: None) == []


def test_a_search_cut_short_says_so(secrets: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = secrets
    monkeypatch.setattr(restore, "MAX_SEARCH", 2)
    for n in range(5):
        (ws / f"f{n}").write_text("x")
    (ws / "sub").mkdir()  # (listed after every entry above it: past the bound)
    said = _settle(ws, lambda: (ws / ".env").rename(ws / "sub" / "f9"))
    assert any("could not look everywhere for it: more than 2 entries" in s for s in said), said


def _home_filled(ws: Path, entries: int) -> Path:
    """A home layer beside the workspace holding ``entries`` empty files."""
    junk = ws.parent / "layer" / ".cache" / "junk"
    junk.mkdir(parents=True)
    for n in range(entries):
        (junk / f"{n:07d}").touch()
    return ws.parent / "layer"


def _settle_with_home(ws: Path, layer: Path, run: Callable[[], object]) -> list[Denial]:
    """As :func:`_settle`, with the roots corral.launch passes: the workspace, then
    the home layer."""
    rules = {str(ws / ".env"): "read-deny", str(ws / "private"): "read-deny"}
    snap = restore.snapshot(rules)
    run()
    return restore.restore(snap, "run-h", rules, [str(ws), str(layer)])


def test_a_home_layer_filled_to_the_bound_never_hides_a_renamed_secret(
    secrets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run made 510,000 files in its home layer, searched first, then ``mv .env
    notes.txt``: the search gave up before the workspace (found by attacking
    corral).  The workspace is searched first now; the home layer is not even
    listed once the copy is found."""
    ws = secrets
    monkeypatch.setattr(restore, "MAX_SEARCH", 50)
    layer = _home_filled(ws, 80)
    listed: list[str] = []
    real = os.scandir

    def scandir(path: Any) -> Any:
        listed.append(str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    said = _settle_with_home(ws, layer, lambda: (ws / ".env").rename(ws / "notes.txt"))
    assert not (ws / "notes.txt").exists() and _holders(ws) == {".env", "private/id"}
    assert [d.fields["action"] for d in said if d.fields.get("copy")] == ["quarantined"]
    assert not [p for p in listed if p.startswith(str(layer))], listed


def test_twin_a_secret_renamed_into_the_home_layer_is_found_there(secrets: Path) -> None:
    ws = secrets
    layer = _home_filled(ws, 5)
    said = _settle_with_home(ws, layer, lambda: (ws / ".env").rename(layer / "notes.txt"))
    assert not (layer / "notes.txt").exists(), said
    assert [d.fields["copy"] for d in said if d.fields.get("copy")] == [str(layer / "notes.txt")]


def test_every_link_of_a_secret_is_found_before_the_search_ends(secrets: Path) -> None:
    """The search stops once each stray's links are all found, not at the first."""
    ws = secrets

    def run() -> None:
        (ws / "a").mkdir()
        os.link(ws / ".env", ws / "a" / "one")
        os.link(ws / ".env", ws / "two")
        (ws / ".env").rename(ws / "three")

    said = _settle(ws, run)
    assert _holders(ws) == {".env", "private/id"}, said
    assert sum("moved or linked to" in s for s in said) == 3, said


def test_a_search_that_cannot_finish_says_how_to_finish_it_and_holds_later_runs(
    secrets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the bound the next run is refused (corral.unfinished) with the inode
    and the command that finds it; the twin: within it, nothing holds."""
    from corral import unfinished

    ws = secrets
    monkeypatch.setattr(restore, "MAX_SEARCH", 20)
    for n in range(30):
        (ws / f"f{n}").touch()
    ino = os.stat(ws / ".env").st_ino
    (ws / "sub").mkdir()  # (listed after the 30 entries above it: past the bound)
    said = _settle_with_home(
        ws, ws.parent / "none", lambda: (ws / ".env").rename(ws / "sub" / "f99")
    )
    left = unfinished.left(said)
    assert len(left) == 1 and f"find {ws} -xdev -inum {ino}" in left[0], said
    monkeypatch.setattr(restore, "MAX_SEARCH", 200)
    (ws / "sub" / "f99").unlink()
    (ws / ".env").write_text("KEY=secret\n")
    said = _settle_with_home(ws, ws.parent / "none", lambda: (ws / ".env").rename(ws / "f98"))
    assert unfinished.left(said) == [] and not (ws / "f98").exists(), said


def _keep(ws: Path, run: Callable[[], None]) -> list[str]:
    """Anchor ``conf/keys`` (a mount tier's mask) at launch, do ``run``, check."""
    rules = {str(ws / "conf" / "keys"): "in-place"}
    snap = restore.snapshot(rules, rules)
    run()
    return [str(d) for d in restore.restore(snap, "run-k", rules, [str(ws)])]


@pytest.fixture
def nested(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = tmp_path / "ws"
    (ws / "conf" / "keys").mkdir(parents=True)
    (ws / "conf" / "keys" / "k").write_text("secret\n")
    (ws / "conf" / "app.yaml").write_text("app\n")
    return ws


def test_a_path_carried_off_by_a_renamed_directory_is_moved_back(nested: Path) -> None:
    ws = nested

    def run() -> None:
        (ws / "conf").rename(ws / "settings")
        (ws / "conf" / "keys").mkdir(parents=True)
        (ws / "conf" / "keys" / "k").write_text("the run's own\n")

    said = _keep(ws, run)
    assert (ws / "conf" / "keys" / "k").read_text() == "secret\n"
    assert (ws / "settings" / "app.yaml").read_text() == "app\n"  # the rest of the rename stays
    assert not (ws / "settings" / "keys").exists()
    assert len(said) == 2, said
    assert "was made where a path the run carried off was; moved to" in said[0]
    assert said[1].endswith(
        f"was carried to {ws / 'settings' / 'keys'} by a directory the run renamed; moved back"
    )


def test_a_path_left_in_place_costs_one_look(nested: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(restore, "_find_inodes", None)  # never called
    assert _keep(nested, lambda: (nested / "conf" / "app.yaml").unlink()) == []
    assert restore.snapshot({"/no/such": "in-place"}, {"/no/such": "in-place"}) == {}


def test_never_moved_back_through_a_symlink_the_run_left(nested: Path, tmp_path: Path) -> None:
    ws = nested
    outside = tmp_path / "outside"
    outside.mkdir()

    def run() -> None:
        (ws / "conf").rename(ws / "settings")
        (ws / "conf").symlink_to(outside)

    (outside / "keys").mkdir()  # what the path leads to through the run's link
    (outside / "keys" / "theirs").write_text("theirs\n")
    said = _keep(ws, run)
    # nothing went through the link: the link itself went, and the path came back
    assert [p.name for p in outside.iterdir()] == ["keys"]
    assert (outside / "keys" / "theirs").read_text() == "theirs\n"
    assert not (ws / "conf").is_symlink()
    assert (ws / "conf" / "keys" / "k").read_text() == "secret\n"
    assert len(said) == 2, said
    assert f"{ws / 'conf'} was made where a path the run carried off was; moved to" in said[0]
    assert said[1].endswith("by a directory the run renamed; moved back"), said


def test_what_is_made_where_a_lost_path_was_goes(nested: Path) -> None:
    """The carried path is nowhere to be found (the search's bound, or gone): what
    the run made at its old place is not what was there, and goes even so."""
    ws = nested

    def run() -> None:
        (ws / "conf").rename(ws / "settings")
        (ws / "conf" / "keys").mkdir(parents=True)
        (ws / "conf" / "keys" / "k").write_text("the run's own\n")

    rules = {str(ws / "conf" / "keys"): "in-place"}
    snap = restore.snapshot(rules, rules)
    run()
    said = [str(d) for d in restore.restore(snap, "run-k", rules, [])]  # searched nowhere
    assert not (ws / "conf" / "keys").exists()
    assert (ws / "settings" / "keys" / "k").read_text() == "secret\n"
    assert "was made where a path the run carried off was; moved to" in said[0], said
    assert "could not find it: it is gone" in said[1], said


def test_a_secret_whose_directory_was_renamed_away_goes_back(secrets: Path) -> None:
    ws = secrets
    (ws / "private" / "deeper").mkdir()
    (ws / "private" / "deeper" / "k").write_text("K=secret\n")
    rules = {str(ws / "private" / "deeper"): "read-deny"}
    snap = restore.snapshot(rules)
    (ws / "private").rename(ws / "moved")
    said = [str(d) for d in restore.restore(snap, "run-d", rules, [str(ws)])]
    assert (ws / "private" / "deeper" / "k").read_text() == "K=secret\n"
    assert not (ws / "moved" / "deeper").exists()  # its copy: taken out
    assert any("restored from the snapshot" in s for s in said), said


def test_a_tree_made_too_deep_is_put_back_not_a_crash(git: Path) -> None:
    """A run nested 1,200 directories in .git/hooks beside a planted hook: the
    walk's recursion ended the undo with RecursionError before anything was put
    back, and the hook ran on the host's next commit (found by attacking corral).
    Too deep is now refused like too large: the tree is moved to quarantine and
    the snapshot put back.  A link to a name that is not UTF-8 is kept as its
    bytes (it raised too).  The twin: a tree as deep as a real one comes back
    whole."""
    hooks = git / "hooks"
    (hooks / "odd").symlink_to(os.fsdecode(b"target-\xff"))
    snap = restore.snapshot([str(hooks)])
    (hooks / "pre-commit").write_text("#!/bin/sh\necho pwned\n")
    deep = hooks
    for _ in range(1200):
        deep = deep / "d"
        os.mkdir(deep)
    said = restore.restore(snap, "run-deep")
    _remove_deep(git.parent.parent / "state")  # (quarantined; pytest's cleanup recurses)
    assert said and (hooks / "pre-commit").read_text() == "#!/bin/sh\n"
    assert not (hooks / "d").exists()
    assert os.fsencode(os.readlink(hooks / "odd")) == b"target-\xff"
    shallow = git / "shallow"
    (shallow / "a" / "b").mkdir(parents=True)
    (shallow / "a" / "b" / "f").write_text("x")
    snap = restore.snapshot([str(shallow)])
    (shallow / "a" / "b" / "f").write_text("y")
    restore.restore(snap, "run-shallow")
    assert (shallow / "a" / "b" / "f").read_text() == "x"


def _remove_deep(top: Path) -> None:
    """Remove a tree however deep (Python 3.11's os.walk and rmtree recurse)."""
    import subprocess

    subprocess.run(["rm", "-rf", "--", str(top)], check=True)
