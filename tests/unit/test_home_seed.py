"""The home layer (corral.home): the pure seeding decision, the seeding itself on a
real directory tree, and how each tier's plan gives the command its layer."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from corral import fsplan, home, homeseed
from corral import landlock as L
from corral.errors import PolicyError
from corral.home import COPY_MAX
from corral.homeseed import Copy, Entry, decide, secret_test
from corral.policy import Policy, load
from corral.tiers.landlock import Confined, LandlockTier
from corral.tiers.namespace import NamespaceTier

REAL = "/home/u"
NO_SECRETS = secret_test([])


def ops(
    real: dict[str, Entry], layer: dict[str, Entry] | None = None, **kw: object
) -> list[tuple[str, ...]]:
    copies = kw.pop("copies", {})
    is_secret = kw.pop("is_secret", NO_SECRETS)
    rel_dir = str(kw.pop("rel_dir", ""))
    real_dir = REAL if not rel_dir else f"{REAL}/{rel_dir}"
    return decide(rel_dir, real_dir, real, layer or {}, copies, is_secret)  # type: ignore[arg-type]


# -- decide(): what the layer gets -------------------------------------------------


def test_small_dotfiles_are_copied_everything_else_linked() -> None:
    got = ops(
        {
            ".gitconfig": Entry("file", 20, 1),
            ".bashrc": Entry("file", COPY_MAX, 1),
            ".big": Entry("file", COPY_MAX + 1, 1),
            "notes.txt": Entry("file", 5, 1),  # not a dotfile: the user's documents stay links
            ".rustup": Entry("dir"),
            "Downloads": Entry("dir"),
            ".fifo": Entry("other"),
        }
    )
    assert ("copy", ".gitconfig", f"{REAL}/.gitconfig") in got
    assert ("copy", ".bashrc", f"{REAL}/.bashrc") in got
    for name in (".big", "notes.txt", ".rustup", "Downloads"):
        assert ("link", name, f"{REAL}/{name}") in got
    assert not [op for op in got if op[1] == ".fifo"]


def test_own_names_are_never_linked_and_merged_ones_are_made() -> None:
    got = ops(
        {
            ".cache": Entry("dir"),
            ".npm": Entry("dir"),
            ".local": Entry("dir"),
            ".config": Entry("dir"),
        }
    )
    assert got == [("mkdir", ".config")]
    # one level down, every small file is copied (config files seldom start with a dot)
    inner = ops({"starship.toml": Entry("file", 10, 1), "git": Entry("dir")}, rel_dir=".config")
    assert inner == [
        ("link", ".config/git", f"{REAL}/.config/git"),
        ("copy", ".config/starship.toml", f"{REAL}/.config/starship.toml"),
    ]


def test_secrets_are_neither_copied_nor_linked() -> None:
    is_secret = secret_test([f"{REAL}/.npmrc", f"{REAL}/.ssh/", f"{REAL}/.config/gh/"])
    real = {
        ".npmrc": Entry("file", 10, 1),
        ".ssh": Entry("dir"),
        ".env": Entry("file", 10, 1),  # a secret by name wherever it is
        ".env.local": Entry("file", 10, 1),
        ".env.example": Entry("file", 10, 1),  # a template: public
    }
    got = ops(real, is_secret=is_secret)
    assert got == [("copy", ".env.example", f"{REAL}/.env.example")]
    inner = ops(
        {"gh": Entry("dir"), "gh-dash": Entry("dir")}, rel_dir=".config", is_secret=is_secret
    )
    assert inner == [("link", ".config/gh-dash", f"{REAL}/.config/gh-dash")]


def test_a_copy_of_a_path_that_became_secret_is_removed() -> None:
    copy = Copy(10, 1, 7, 10, 1)
    got = ops(
        {".token": Entry("file", 10, 1)},
        {".token": Entry("file", 10, 1, 7)},
        copies={".token": copy},
        is_secret=secret_test([f"{REAL}/.token"]),
    )
    assert got == [("remove", ".token")]


def test_the_layers_own_entries_win() -> None:
    layer = {".gitconfig": Entry("other"), ".rustup": Entry("dir"), ".cargo": Entry("link")}
    got = ops(
        {".gitconfig": Entry("file", 5, 1), ".rustup": Entry("dir"), ".cargo": Entry("dir")}, layer
    )
    assert got == []


def test_a_copy_follows_the_real_file_until_the_sandbox_changes_it() -> None:
    copy = Copy(real_size=5, real_mtime=100, ino=7, size=5, mtime=100)
    real = {".bashrc": Entry("file", 9, 200)}  # changed on the host since
    untouched = {".bashrc": Entry("file", 5, 100, 7)}
    assert ops(real, untouched, copies={".bashrc": copy}) == [
        ("copy", ".bashrc", f"{REAL}/.bashrc")
    ]
    same = {".bashrc": Entry("file", 5, 100)}
    assert ops(same, untouched, copies={".bashrc": copy}) == []
    for edited in (Entry("file", 5, 150, 7), Entry("file", 5, 100, 8), Entry("link")):
        # edited in place, replaced by a rename, or by a link: the sandbox's own now
        assert ops(real, {".bashrc": edited}, copies={".bashrc": copy}) == [("forget", ".bashrc")]
    # deleted by the sandbox: forgotten, and the next seeding copies it again
    assert ops(real, {}, copies={".bashrc": copy}) == [
        ("forget", ".bashrc"),
        ("copy", ".bashrc", f"{REAL}/.bashrc"),
    ]


def test_what_the_real_home_lost_goes_from_the_layer() -> None:
    copy = Copy(5, 100, 7, 5, 100)
    layer = {
        ".gone": Entry("file", 5, 100, 7),  # corral's unchanged copy
        ".edited": Entry("file", 6, 150, 7),  # a copy the sandbox changed
        ".old-dir": Entry("link"),  # a link: removed only if it is corral's
        "mine": Entry("dir"),  # the sandbox's own
    }
    got = ops({}, layer, copies={".gone": copy, ".edited": copy, ".vanished": copy})
    assert got == [
        ("forget", ".edited"),
        ("remove", ".gone"),
        ("unlink-link", ".old-dir", f"{REAL}/.old-dir"),
        ("forget", ".vanished"),
    ]


def test_copies_per_directory_are_bounded() -> None:
    real = {f".f{i:03d}": Entry("file", 1, 1) for i in range(home.COPY_COUNT_MAX + 5)}
    got = ops(real)
    assert sum(op[0] == "copy" for op in got) == home.COPY_COUNT_MAX
    assert sum(op[0] == "link" for op in got) == 5


def test_secret_test_covers_paths_beneath() -> None:
    is_secret = secret_test(["/h/.ssh/", "/h/.npmrc"])
    assert is_secret("/h/.ssh") and is_secret("/h/.ssh/id_rsa") and is_secret("/h/.npmrc")
    assert not is_secret("/h/.npmrc2") and not is_secret("/h/.sshx") and not is_secret("/h")


# -- seed(): on a real tree ---------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    root = Path(os.path.realpath(tmp_path))
    real, ws = root / "home", root / "ws"
    real.mkdir()
    ws.mkdir()
    monkeypatch.setenv("HOME", str(real))
    monkeypatch.setenv("XDG_STATE_HOME", str(root / "state"))
    monkeypatch.setattr(fsplan, "host_unix_sockets", lambda *_: [])
    monkeypatch.setattr(fsplan, "host_net_dirs", lambda *_: [])
    # tmp_path is under /tmp, which plans treat as private: look elsewhere for masks
    monkeypatch.setattr(fsplan, "PRIVATE_TMP", (str(root / "private-tmp"),))
    return real, ws


def prepared(ws: Path, mode: str = "persist") -> home.HomeLayer:
    pol = Policy(str(ws))
    pol.filesystem.home = mode
    layer = home.plan_home(pol)
    assert layer is not None
    layer.secrets = frozenset(fsplan.plan_filesystem(pol, mounts=False).read_deny)
    home.prepare(layer)
    return layer


def test_seeding_a_real_tree(tree: tuple[Path, Path]) -> None:
    real, ws = tree
    (real / ".gitconfig").write_text("[user]\n\tname = Real\n")
    (real / ".npmrc").write_text("//registry/:_authToken=SECRET\n")
    (real / ".ssh").mkdir()
    (real / ".ssh" / "id_ed25519").write_text("SECRET\n")
    (real / ".config" / "git").mkdir(parents=True)
    (real / ".config" / "tool.toml").write_text("x = 1\n")
    (real / ".config" / "gh").mkdir()
    (real / ".cache").mkdir()
    (real / "dotfiles").mkdir()
    (real / "dotfiles" / "vimrc").write_text("set nu\n")
    (real / ".vimrc").symlink_to(real / "dotfiles" / "vimrc")  # kept by a dotfile manager
    (real / ".sneaky").symlink_to(real / ".ssh" / "id_ed25519")  # leads into a secret
    layer = prepared(ws)
    top = Path(layer.path)
    assert os.stat(top).st_mode & 0o777 == 0o700
    assert not (top / ".gitconfig").is_symlink()
    assert (top / ".gitconfig").read_text() == "[user]\n\tname = Real\n"
    assert (top / ".vimrc").read_text() == "set nu\n" and not (top / ".vimrc").is_symlink()
    assert os.readlink(top / ".config" / "git") == str(real / ".config" / "git")
    assert (top / ".config" / "tool.toml").read_text() == "x = 1\n"
    assert os.readlink(top / "dotfiles") == str(real / "dotfiles")
    for absent in (".npmrc", ".ssh", ".cache", ".config/gh", ".sneaky"):
        assert not os.path.lexists(top / absent), absent
    # the manifest lives beside the layer, out of the sandbox's reach
    assert homeseed.manifest_workspace(layer.manifest) == str(ws)
    assert set(homeseed.read_manifest(layer.manifest) or {}) == {
        ".gitconfig",
        ".vimrc",
        ".config/tool.toml",
    }


def test_reseeding_follows_the_host_and_keeps_the_sandboxs_changes(
    tree: tuple[Path, Path],
) -> None:
    real, ws = tree
    (real / ".bashrc").write_text("one\n")
    (real / ".gitconfig").write_text("real\n")
    (real / ".profile").write_text("profile\n")
    top = Path(prepared(ws).path)
    # the sandbox replaces one copy as git does (write a new file, rename it over)
    (top / ".gitconfig.new").write_text("sandbox's\n")
    os.rename(top / ".gitconfig.new", top / ".gitconfig")
    # and puts a link where a copy was, aiming at a file outside
    victim = real.parent / "victim"
    victim.write_text("untouched\n")
    (top / ".profile").unlink()
    (top / ".profile").symlink_to(victim)
    (real / ".bashrc").write_text("two\n")
    (real / ".gitconfig").write_text("real, changed\n")
    (real / ".profile").write_text("profile, changed\n")
    (real / ".inputrc").write_text("new\n")
    prepared(ws)
    assert (top / ".bashrc").read_text() == "two\n"  # followed the host
    assert (top / ".gitconfig").read_text() == "sandbox's\n"  # the sandbox's own now
    assert (top / ".inputrc").read_text() == "new\n"
    assert victim.read_text() == "untouched\n" and (top / ".profile").is_symlink()
    (real / ".bashrc").unlink()
    prepared(ws)
    assert not (top / ".bashrc").exists()  # its original is gone, and it was unchanged


def settled(ws: Path) -> home.HomeLayer:
    """Seed and let the clock move on: a file time comes from a coarse clock, so a
    change in the same tick as a stamp would look like no change."""
    layer = prepared(ws)
    time.sleep(0.05)
    return layer


def test_a_stamp_too_recent_to_trust_never_holds(tree: tuple[Path, Path]) -> None:
    real, ws = tree
    (real / ".bashrc").write_text("one\n")
    layer = prepared(ws)  # everything was just written: every stamp is recent
    assert "\trecent\n" in Path(layer.manifest).read_text()
    assert not home.unchanged(layer)


def test_seeding_is_skipped_while_nothing_it_looks_at_changes(
    tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    real, ws = tree
    (real / ".bashrc").write_text("one\n")
    (real / ".config").mkdir()
    monkeypatch.setattr(homeseed, "RECENT_NS", 0)  # trust every stamp, for the test
    layer = settled(ws)
    assert home.unchanged(layer)
    calls: list[str] = []
    with monkeypatch.context() as patch:
        patch.setattr(homeseed, "seed", lambda lay, copies: calls.append(lay.path))
        prepared(ws)
    assert calls == []  # the fast path: a read and a few stats
    top = Path(layer.path)
    changes: list[Callable[[], object]] = [
        lambda: (real / ".bashrc").write_text("two, longer\n"),  # a copied file's content
        lambda: (real / ".inputrc").write_text("x\n"),  # the real home gains an entry
        lambda: (real / ".config" / "app.toml").write_text("x\n"),  # so does ~/.config
        lambda: (top / ".inputrc").unlink(),  # the sandbox removes a copy
    ]
    for change in changes:
        change()
        assert not home.unchanged(layer)
        assert home.unchanged(settled(ws))
    assert (top / ".bashrc").read_text() == "two, longer\n" and (top / ".inputrc").exists()
    # another set of secrets (a new --read-deny) seeds again
    layer.secrets = frozenset([*layer.secrets, str(real / ".bashrc")])
    assert not home.unchanged(layer)


def test_a_path_that_becomes_secret_leaves_the_layer(tree: tuple[Path, Path]) -> None:
    real, ws = tree
    (real / ".token").write_text("was public\n")
    top = Path(prepared(ws).path)
    assert (top / ".token").exists()
    pol = Policy(str(ws))
    pol.filesystem.read_deny = ["~/.token"]
    layer = home.plan_home(pol)
    assert layer is not None
    layer.secrets = frozenset(fsplan.plan_filesystem(pol, mounts=False).read_deny)
    home.prepare(layer)
    assert not (top / ".token").exists()


def test_ephemeral_layers_are_new_each_time_and_removable(tree: tuple[Path, Path]) -> None:
    real, ws = tree
    (real / ".bashrc").write_text("x\n")
    a, b = prepared(ws, "ephemeral"), prepared(ws, "ephemeral")
    assert a.path != b.path and a.path.startswith(home.layer_path(str(ws)) + ".run-")
    assert not os.path.exists(a.manifest)
    assert (Path(a.path) / ".bashrc").read_text() == "x\n"
    home.remove(a.path)
    assert not os.path.exists(a.path) and os.path.exists(b.path)


def test_concurrent_first_runs_share_one_layer(tree: tuple[Path, Path]) -> None:
    import threading

    real, ws = tree
    for i in range(20):
        (real / f".rc{i}").write_text(f"{i}\n")
    (real / ".config").mkdir()
    errors: list[BaseException] = []

    def one() -> None:
        try:
            prepared(ws)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    top = Path(home.layer_path(str(ws)))
    assert sorted(p.name for p in top.iterdir() if p.name.startswith(".rc")) == sorted(
        f".rc{i}" for i in range(20)
    )
    assert not [p for p in top.iterdir() if p.name.startswith(".corral-seed-")]
    # one seeding at a time: the manifest knows the copies that are there
    copies = homeseed.read_manifest(str(top) + ".seed") or {}
    assert {f".rc{i}" for i in range(20)} <= set(copies)
    for i in range(20):
        assert copies[f".rc{i}"].ino == os.lstat(top / f".rc{i}").st_ino


def test_a_layer_directory_that_is_not_ours_is_refused(tree: tuple[Path, Path]) -> None:
    _real, ws = tree
    target = home.layer_path(str(ws))
    os.makedirs(os.path.dirname(target))
    os.symlink("/", target)
    with pytest.raises(home.HomeError, match="not a directory owned by this user"):
        prepared(ws)


def test_layers_of_a_workspace(tree: tuple[Path, Path]) -> None:
    _real, ws = tree
    persist, short = prepared(ws), prepared(ws, "ephemeral")
    other = ws.parent / "other"
    other.mkdir()
    prepared(other)
    assert homeseed.layers_of(str(ws)) == sorted([persist.path, short.path])
    assert len(homeseed.all_layers()) == 3


# -- plans ----------------------------------------------------------------------------


def test_workspace_keys_are_readable_and_distinct() -> None:
    a, b = home.workspace_key("/srv/my proj"), home.workspace_key("/tmp/my proj")
    assert a.startswith("my_proj-") and b.startswith("my_proj-") and a != b
    assert home.workspace_key("/srv/.hidden").startswith("hidden-")
    assert home.workspace_key("/srv/my proj") == a


def test_which_runs_get_a_layer(tree: tuple[Path, Path]) -> None:
    real, ws = tree
    pol = Policy(str(ws))
    layer = home.plan_home(pol)
    assert layer is not None and layer.mode == "persist" and layer.real == str(real)
    assert layer.path == home.layer_path(str(ws)) and not os.path.exists(layer.path)  # pure
    container = home.plan_home(pol, kind="container")
    assert container is not None and container.real is None
    assert container.path == layer.path + "-container"
    pol.filesystem.home = "read-only"
    assert home.plan_home(pol) is None
    pol.filesystem.home = "persist"
    pol.env.set_values = {"HOME": "/elsewhere"}  # the policy chose $HOME itself
    assert home.plan_home(pol) is None
    around = Policy(str(real.parent))  # a workspace holding the home: writable already
    assert home.plan_home(around) is None
    pol.filesystem.home = "scratch"  # set from Python: checked all the same
    with pytest.raises(PolicyError, match=r'filesystem\.home: home must be one of "persist"'):
        home.plan_home(pol)


def test_the_policy_key_is_checked(tree: tuple[Path, Path]) -> None:
    _real, ws = tree
    (ws / "corral.toml").write_text('[filesystem]\nhome = "ephemeral"\n')
    pol = load(str(ws))
    assert pol.filesystem.home == "ephemeral"
    assert pol.to_dict()["filesystem"]["home"] == "ephemeral"  # type: ignore[index]
    assert "home" not in Policy(str(ws)).to_dict()["filesystem"]  # type: ignore[operator]
    (ws / "corral.toml").write_text('[filesystem]\nhome = "rw"\n')
    with pytest.raises(PolicyError, match=r"corral.toml:2: filesystem.home: home must be one of"):
        load(str(ws))
    (ws / "corral.toml").write_text("[filesystem]\nhome = true\n")
    with pytest.raises(PolicyError, match=r"filesystem\.home: expected a string"):
        load(str(ws))


def test_namespace_plan_binds_the_layer_through_the_state_mask(tree: tuple[Path, Path]) -> None:
    real, ws = tree
    state = Path(os.environ["XDG_STATE_HOME"]) / "corral"
    state.mkdir(parents=True)
    (state / "runs.jsonl").write_text("{}\n")
    plan = NamespaceTier().plan(Policy(str(ws)), ["true"])
    assert plan.home is not None
    layer = plan.home.path
    assert plan.env["HOME"] == layer and layer.startswith(str(state) + "/homes/")
    kinds = {m.dest: m.kind for m in plan.mounts}
    # corral's state: an empty tmpfs (other layers, the logs: out of sight), not mode 000
    assert kinds[str(state)] == "tmpfs" and kinds[layer] == "bind"
    order = [m.dest for m in plan.mounts]
    assert order.index(str(state)) < order.index(layer)
    assert f"{real}/.ssh" in plan.home.secrets
    assert "home layer ($HOME): " + layer in plan.describe()
    # without a layer the state stays masked as before, and HOME is the real home
    pol = Policy(str(ws))
    pol.filesystem.home = "read-only"
    plain = NamespaceTier().plan(pol, ["true"])
    assert plain.home is None and plain.env["HOME"] == str(real)
    assert {m.dest: m.kind for m in plain.mounts}[str(state)] == "mask-dir"
    assert not any(m.kind == "bind" and m.dest.startswith(str(state)) for m in plain.mounts)


def test_first_run_the_layer_lands_in_the_snapshot_of_a_missing_state_dir(
    tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    real, ws = tree
    # corral's state under the home, not there yet: the home is snapshotted (a tmpfs
    # that hides what appears later), and bwrap makes the layer's mount point in it
    # before the snapshot turns read-only
    monkeypatch.delenv("XDG_STATE_HOME")
    plan = NamespaceTier().plan(Policy(str(ws)), ["true"])
    assert plan.home is not None and plan.home.path.startswith(f"{real}/.local/state/corral/")
    order = [(m.kind, m.dest) for m in plan.mounts]
    bind = order.index(("bind", plan.home.path))
    assert order.index(("tmpfs", str(real))) < bind < order.index(("remount-ro", str(real)))


def test_landlock_plan_grants_the_layer(
    tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    real, ws = tree
    monkeypatch.setattr("corral.tiers.landlock.abi_version", lambda: 7)
    plan = LandlockTier().plan(Policy(str(ws)), ["true"])
    assert plan.home is not None and isinstance(plan.strategy, Confined)
    layer = plan.home.path
    assert plan.env["HOME"] == layer
    rules = dict(plan.strategy.ruleset.paths)
    assert rules[layer] & L.WRITE_FILE and rules[layer] & L.READ_FILE and rules[layer] & L.MAKE_DIR

    def allowed(path: str, right: int) -> bool:
        while True:
            if rules.get(path, 0) & right:
                return True
            if path == "/":
                return False
            path = os.path.dirname(path)

    # beside the layer, corral's state stays unreadable and nothing of the real home writable
    state = home.layers_dir()
    assert not allowed(os.path.join(state, "other-layer", "f"), L.READ_FILE)
    assert not allowed(os.path.join(state, "other-layer", "f"), L.WRITE_FILE)
    assert not allowed(str(real / ".gitconfig"), L.WRITE_FILE)


def test_a_layer_nested_deeper_than_a_recursion_is_sized_and_removed(tmp_path: Path) -> None:
    """A run nested its layer 1,500 directories deep: `corral home list` and `clean`
    ended in RecursionError and the layer stayed (found by attacking corral).  The
    twin: a link inside to a file outside is removed as a link, its target kept."""
    from corral import home, homeseed

    layer = tmp_path / "layer"
    layer.mkdir()
    deep = layer
    for _ in range(1500):  # (not os.makedirs: it recurses too)
        deep = deep / "d"
        deep.mkdir()
    (deep / "f").write_bytes(b"x" * 5000)
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    (layer / "link").symlink_to(outside)
    assert homeseed.size_of(str(layer)) >= 5000
    home.remove(str(layer))
    assert not layer.exists() and outside.read_text() == "keep"


def test_clean_during_a_run_never_follows_a_directory_swapped_for_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run still alive swapped a directory of its layer for a link to the
    user's files once `corral home clean` had begun, and the walk by path
    deleted them (found by attacking corral).  Here the swap happens at the
    first removal; the user's files stay, and the layer and its link go.  The
    twin: with no swap, every file of the layer goes."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "v1").write_text("precious")
    real_unlink = os.unlink
    for swap in (True, False):
        layer = tmp_path / f"layer-{swap}"
        (layer / "d").mkdir(parents=True)
        (layer / "d" / "v1").write_text("the layer's own")
        (layer / "f0").write_text("")
        pending = [swap]  # (the run swaps once, when removal has begun)

        def unlink(
            name: str, *, dir_fd: int | None = None, at: Path = layer, pending: list[bool] = pending
        ) -> None:
            if pending and pending.pop():
                os.rename(at / "d", at.with_name(at.name + "-moved"))
                os.symlink(victim, at / "d")
            real_unlink(name, dir_fd=dir_fd)

        monkeypatch.setattr(os, "unlink", unlink)
        home.remove(str(layer))
        monkeypatch.setattr(os, "unlink", real_unlink)
        assert (victim / "v1").read_text() == "precious"
        assert not os.path.lexists(layer)


def test_a_layer_that_cannot_be_made_names_what_to_do(tmp_path: Path) -> None:
    """A service account whose home does not exist could not run anything, and the
    message said only "Permission denied" (found by trying corral as a new user)."""
    (tmp_path / "not-a-dir").write_text("")
    layer = home.HomeLayer(str(tmp_path / "not-a-dir" / "ws-1"), "persist", "host", "/ws", None)
    with pytest.raises(home.HomeError) as err:
        home.prepare(layer)
    assert "set XDG_STATE_HOME to a directory you can write" in str(err.value)
    assert "--home read-only" in str(err.value)
    ok = home.HomeLayer(str(tmp_path / "homes" / "ws-1"), "persist", "host", "/ws", None)
    home.prepare(ok)  # the twin: a writable place works
    assert os.path.isdir(ok.path)


def test_clean_says_what_it_could_not_remove(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`corral home clean` printed "removed" whatever was left (found by attacking
    corral): a layer not removed entirely is named on stderr, exit 1.  The twin:
    one that goes is said removed, exit 0."""
    from corral import cli

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = tmp_path / "ws"
    ws.mkdir()
    for gone in (False, True):
        layer = Path(home.layer_path(str(ws), "host"))
        (layer / "d").mkdir(parents=True)
        monkeypatch.setattr(home, "remove", lambda path, gone=gone: gone)
        code = cli.main(["home", "clean", "--workspace", str(ws)])
        said = capsys.readouterr()
        if gone:
            assert code == 0 and said.out == f"removed {layer}\n"
        else:
            assert code == 1 and f"could not remove all of {layer}" in said.err and not said.out
        monkeypatch.undo()
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
        home.remove(str(layer))
