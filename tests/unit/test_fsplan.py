"""Tests for corral.fsplan.plan_filesystem on fake homes and workspaces under tmp_path.

tmp_path lives under /tmp, which the plan treats as private (hidden by a tmpfs),
so most tests point PRIVATE_TMP elsewhere to see the masks they are about.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from homes import one_home  # noqa: F401  (fixture)

from corral import defaults, fsplan
from corral.errors import PolicyError
from corral.fsplan import FsPlan, Mount, plan_filesystem
from corral.paths import inside
from corral.policy import Policy

pytestmark = pytest.mark.usefixtures("one_home")

REAL_PRIVATE_TMP = fsplan.PRIVATE_TMP


class Layout:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.ws = root / "ws"
        self.state = root / "state"


@pytest.fixture
def lay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Layout]:
    layout = Layout(Path(os.path.realpath(tmp_path)))
    layout.home.mkdir()
    layout.ws.mkdir()
    (layout.state / "corral").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(layout.home))
    monkeypatch.setenv("XDG_STATE_HOME", str(layout.state))
    monkeypatch.setattr(fsplan, "host_unix_sockets", lambda *_: [])
    monkeypatch.setattr(fsplan, "host_net_dirs", lambda *_: [])
    monkeypatch.setattr(fsplan, "PRIVATE_TMP", (str(layout.root / "private-tmp"),))
    yield layout


def policy_for(lay: Layout, read_deny: list[str] | None = None) -> Policy:
    """A policy on lay.ws; with ``read_deny`` the built-in lists are off (hermetic)."""
    pol = Policy(str(lay.ws))
    if read_deny is not None:
        pol.filesystem.use_defaults = False
        pol.filesystem.read_deny = read_deny
    return pol


def index(plan: FsPlan, mount: Mount) -> int:
    return plan.mounts.index(mount)


def dests(plan: FsPlan, kind: str) -> list[str]:
    return [m.dest for m in plan.mounts if m.kind == kind]


def bind_socket(path: Path) -> None:
    """Create a unix socket file at ``path`` (relative bind keeps under the 108-byte limit)."""
    here = os.getcwd()
    os.chdir(path.parent)
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(path.name)
    finally:
        os.chdir(here)


# -- base and order ------------------------------------------------------------------


def test_base_mounts_come_first(lay: Layout, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fsplan, "PRIVATE_TMP", REAL_PRIVATE_TMP)
    plan = plan_filesystem(policy_for(lay))
    expected = [Mount("ro-bind", "/", "/"), Mount("dev", "/dev"), Mount("proc", "/proc")]
    expected += [Mount("tmpfs", t) for t in REAL_PRIVATE_TMP if os.path.isdir(t)]
    assert plan.mounts[: len(expected)] == expected
    assert Mount("tmpfs", "/tmp") in expected
    assert plan.writable == [str(lay.ws)]
    # The fake home lives under the private /tmp: nothing there needs a mask or a shadow.
    assert not any(m.dest.startswith(str(lay.home)) for m in plan.mounts)


def test_workspace_bound_read_write_after_shadows(lay: Layout) -> None:
    extra = lay.root / "extra"
    extra.mkdir()
    pol = policy_for(lay, ["~/.aws/"])
    pol.filesystem.writable = [str(extra)]
    plan = plan_filesystem(pol)
    ws_bind = index(plan, Mount("bind", str(lay.ws), str(lay.ws)))
    extra_bind = index(plan, Mount("bind", str(extra), str(extra)))
    shadow = index(plan, Mount("tmpfs", str(lay.home)))
    assert shadow < ws_bind
    assert shadow < extra_bind
    assert sorted(plan.writable) == sorted([str(lay.ws), str(extra)])
    assert dests(plan, "bind") == sorted([str(lay.ws), str(extra)], key=lambda p: (p.count("/"), p))


def test_existing_secrets_become_masks(lay: Layout) -> None:
    (lay.home / ".ssh").mkdir()
    (lay.home / ".ssh" / "id_ed25519").write_text("key")
    (lay.home / ".netrc").write_text("machine x password y")
    plan = plan_filesystem(policy_for(lay))
    assert Mount("mask-dir", str(lay.home / ".ssh")) in plan.mounts
    assert Mount("mask-file", str(lay.home / ".netrc")) in plan.mounts
    # nothing is laid inside a masked directory
    assert not any(m.dest.startswith(str(lay.home / ".ssh") + "/") for m in plan.mounts)
    # corral's own state (activity log, quarantine) is hidden too
    assert Mount("mask-dir", str(lay.state / "corral")) in plan.mounts


def test_missing_secret_shadows_home(lay: Layout) -> None:
    (lay.home / ".ssh").mkdir()
    (lay.home / ".bashrc").write_text("")
    (lay.home / "link").symlink_to("somewhere/else")
    bind_socket(lay.home / "agent.sock")
    home = str(lay.home)
    plan = plan_filesystem(policy_for(lay, ["~/.aws/", "~/.ssh/"]))
    start = index(plan, Mount("tmpfs", home))
    assert plan.mounts[start : start + 3] == [
        Mount("tmpfs", home),
        Mount("ro-bind", f"{home}/.bashrc", f"{home}/.bashrc"),
        Mount("symlink", f"{home}/link", "somewhere/else"),
    ]
    assert not any(m.dest == f"{home}/agent.sock" for m in plan.mounts)
    assert not any(m.dest == f"{home}/.aws" for m in plan.mounts)
    # the existing ~/.ssh is masked in the snapshot, never bound into it first
    assert [m.kind for m in plan.mounts if m.dest == f"{home}/.ssh"] == ["mask-dir"]
    assert index(plan, Mount("mask-dir", f"{home}/.ssh")) > start + 2
    # and the snapshot is remounted read-only last
    remount = index(plan, Mount("remount-ro", home))
    assert remount > index(plan, Mount("mask-dir", f"{home}/.ssh"))
    assert all(m.kind == "remount-ro" for m in plan.mounts[remount:])
    assert dests(plan, "remount-ro") == [home]


def test_missing_nested_secret_shadows_nearest_ancestor(lay: Layout) -> None:
    (lay.home / ".config").mkdir()
    plan = plan_filesystem(policy_for(lay, ["~/.config/gcloud/"]))
    assert dests(plan, "tmpfs") == [str(lay.home / ".config")]
    assert dests(plan, "remount-ro") == [str(lay.home / ".config")]


def test_default_lists_shadow_home_when_a_secret_is_missing(lay: Layout) -> None:
    plan = plan_filesystem(policy_for(lay))
    assert Mount("tmpfs", str(lay.home)) in plan.mounts
    assert Mount("remount-ro", str(lay.home)) in plan.mounts


def test_missing_host_wide_secret_is_left_alone(lay: Layout) -> None:
    plan = plan_filesystem(policy_for(lay, ["/etc/corral-test-no-such-dir/secret"]))
    assert dests(plan, "tmpfs") == []
    assert not any("corral-test-no-such-dir" in m.dest for m in plan.mounts)


def test_missing_secret_under_never_shadow_is_a_note(
    lay: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", "/usr")  # a home that must never be snapshotted
    plan = plan_filesystem(policy_for(lay, ["~/corral-test-no-such-dir/secret"]))
    assert dests(plan, "tmpfs") == []
    assert any("/usr/corral-test-no-such-dir/secret" in n for n in plan.notes)


def test_missing_secret_inside_workspace_needs_no_shadow(lay: Layout) -> None:
    plan = plan_filesystem(policy_for(lay, ["secrets/"]))
    assert dests(plan, "tmpfs") == []
    assert not any(m.dest == str(lay.ws / "secrets") for m in plan.mounts)


def test_masks_follow_binds_sorted_by_depth(lay: Layout) -> None:
    (lay.home / ".ssh").mkdir()
    (lay.home / ".netrc").write_text("")
    (lay.home / ".config" / "gh").mkdir(parents=True)
    (lay.ws / ".env").write_text("A=1")
    (lay.ws / "deep" / "er").mkdir(parents=True)
    (lay.ws / "deep" / "er" / ".env.local").write_text("A=1")
    (lay.ws / ".git" / "hooks").mkdir(parents=True)
    (lay.ws / ".git" / "config").write_text("")
    plan = plan_filesystem(policy_for(lay, ["~/.ssh/", "~/.netrc", "~/.config/gh/"]))
    last_bind = max(i for i, m in enumerate(plan.mounts) if m.kind == "bind")
    protect = [m for m in plan.mounts if m.kind.startswith("mask") or m.why.startswith("git")]
    assert len(protect) >= 7
    assert all(index(plan, m) > last_bind for m in protect)
    first = min(index(plan, m) for m in protect)
    section = plan.mounts[first : first + len(protect)]
    assert sorted(section, key=lambda m: (m.dest.count("/"), m.dest)) == section


def test_no_mask_nested_in_a_mask_dir(lay: Layout) -> None:
    (lay.home / ".ssh").mkdir()
    (lay.home / ".ssh" / "id_rsa").write_text("")
    (lay.home / ".ssh" / "keys").mkdir()
    plan = plan_filesystem(policy_for(lay, ["~/.ssh/", "~/.ssh/id_rsa", "~/.ssh/keys/"]))
    assert [m for m in plan.mounts if m.kind.startswith("mask")] == [
        Mount("mask-dir", str(lay.home / ".ssh")),
        Mount("mask-dir", str(lay.state / "corral")),
    ]


def test_no_mount_inside_a_mask_dir_after_it(lay: Layout) -> None:
    (lay.home / ".config" / "git").mkdir(parents=True)
    plan = plan_filesystem(policy_for(lay, ["~/.config/", "~/.config/git/credentials"]))
    for i, mask in enumerate(plan.mounts):
        if mask.kind != "mask-dir":
            continue
        inside = [m for m in plan.mounts[i + 1 :] if m.dest.startswith(mask.dest + "/")]
        assert inside == [], f"{inside} laid after {mask}"


# -- the workspace -------------------------------------------------------------------


def test_git_dirs_are_read_only(lay: Layout) -> None:
    ws = lay.ws
    for git in (ws / ".git", ws / "sub" / ".git"):
        (git / "hooks").mkdir(parents=True)
        (git / "config").write_text("[core]\n\tbare = false\n")
        (git / "HEAD").write_text("ref: refs/heads/main\n")
    module = ws / ".git" / "modules" / "x"
    (module / "hooks").mkdir(parents=True)
    (module / "HEAD").write_text("ref: refs/heads/main\n")
    (module / "config").write_text("")
    nested_name = ws / ".git" / "modules" / "libs" / "y"  # submodule at path libs/y
    nested_name.mkdir(parents=True)
    (nested_name / "HEAD").write_text("x\n")
    (nested_name / "config").write_text("")
    plan = plan_filesystem(policy_for(lay, []))
    ro = set(dests(plan, "ro-bind"))
    for path in (
        ws / ".git" / "hooks",
        ws / ".git" / "config",
        ws / "sub" / ".git" / "hooks",
        ws / "sub" / ".git" / "config",
        module / "hooks",
        module / "config",
        nested_name / "config",
    ):
        assert str(path) in ro, path
    assert Mount("ro-bind", str(module / "hooks"), str(module / "hooks")) in plan.mounts
    # missing ones cannot be mounted over without creating them: quarantined instead
    assert str(nested_name / "hooks") in plan.quarantine
    assert str(ws / ".git" / "config.worktree") in plan.quarantine
    assert str(ws / ".git" / "commondir") in plan.quarantine  # git reads config through it
    assert str(ws / ".git" / "HEAD") not in ro


def _repo(path: Path) -> Path:
    git = path / ".git"
    (git / "hooks").mkdir(parents=True)
    (git / "config").write_text("[core]\n\tbare = false\n")
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    return git


def test_the_walk_starts_from_each_writable_root_once() -> None:
    """The workspace first, then the others shallowest first; one inside a root
    kept is reached by that root's walk, one holding the workspace is kept."""
    walk_roots = fsplan.walk_roots
    assert walk_roots(["/w"]) == ["/w"]
    assert walk_roots(["/w", "/w"]) == ["/w"]  # (writable = ["."])
    assert walk_roots(["/w", "/w/build", "/x/y", "/x", "/a/b/c", "/wx"]) == [
        "/w",
        "/wx",
        "/x",
        "/a/b/c",
    ]
    assert walk_roots(["/p/ws", "/p"]) == ["/p/ws", "/p"]
    assert walk_roots([]) == []


def test_every_writable_root_is_protected_as_the_workspace(lay: Layout) -> None:
    """A repository in a ``writable`` path outside the workspace: its git config and
    hooks are read-only (and watched through their lock files), its top's
    protected names read-only or quarantined if made, a nested repository and a
    ``.env`` found by its walk, and the walk after the run starts from it too.
    Twin: the same policy without the writable path plans none of it."""
    extra = lay.root / "extra"
    git = _repo(extra)
    nested = _repo(extra / "sub")
    (extra / ".vscode").mkdir()
    (extra / "pkg").mkdir()
    (extra / "pkg" / "corral.toml").write_text("")
    (extra / "pkg" / ".env").write_text("KEY=1\n")
    pol = policy_for(lay, [])
    pol.filesystem.use_defaults = True
    pol.filesystem.writable = [str(extra)]
    plan = plan_filesystem(pol)
    ro = set(dests(plan, "ro-bind"))
    for path in (
        git / "hooks",
        git / "config",
        nested / "hooks",
        nested / "config",
        extra / ".vscode",
        extra / "pkg" / "corral.toml",
    ):
        assert str(path) in ro, path
    for path in (extra / "corral.toml", extra / ".envrc", extra / ".bashrc", git / "commondir"):
        assert str(path) in plan.quarantine, path
    assert str(extra / "pkg" / ".env") in dests(plan, "mask-file")
    assert plan.lock_watch[str(git)] == {"config.lock": str(git / "config")}
    assert plan.repositories is not None
    assert plan.repositories.roots == (str(lay.ws), str(extra))
    assert str(extra) not in ro  # the root itself stays writable
    pol.filesystem.writable = []  # the twin
    alone = plan_filesystem(pol)
    assert not any(str(extra) in p for p in (*dests(alone, "ro-bind"), *alone.quarantine))
    assert alone.repositories is not None and alone.repositories.roots == (str(lay.ws),)


def test_a_root_holding_the_workspace_is_walked_around_it(lay: Layout) -> None:
    """``writable`` holds the workspace: its walk skips the workspace (walked once,
    by its own walk), and a protected name at its top that is the workspace (a
    workspace called ``.claude``) is not made read-only: a note says so."""
    outer = lay.root / "outer"
    ws = outer / ".claude"
    _repo(outer)
    inner = _repo(ws / "lib")
    (ws / "lib" / ".env").write_text("KEY=1\n")
    pol = Policy(str(ws))
    pol.filesystem.writable = [str(outer)]
    plan = plan_filesystem(pol)
    assert plan.repositories is not None and plan.repositories.roots == (str(ws), str(outer))
    scan = fsplan.scan_workspace([str(ws), str(outer)])
    assert scan.secret_files == [str(ws / "lib" / ".env")]  # found once: walked once
    assert sorted(scan.git_dirs) == sorted([str(inner), str(outer / ".git")])
    ro = set(dests(plan, "ro-bind"))
    assert {str(inner / "hooks"), str(outer / ".git" / "hooks")} <= ro
    assert str(ws) not in ro and Mount("bind", str(ws), str(ws)) in plan.mounts
    assert any(n.startswith(f"{ws} (write-deny) is or holds the writable") for n in plan.notes)


def test_each_root_walk_has_its_own_bound(lay: Layout, monkeypatch: pytest.MonkeyPatch) -> None:
    """A root whose walk ends at its bound does not end the next root's: its
    repository is still found, and the note names the root that stopped."""
    monkeypatch.setattr(defaults, "SCAN_MAX_ENTRIES", 50)
    big, extra = lay.root / "big", lay.root / "extra"
    big.mkdir()
    for n in range(60):
        (big / str(n)).touch()
    git = _repo(extra)
    scan = fsplan.scan_workspace([str(lay.ws), str(big), str(extra)])
    assert not scan.complete and scan.stopped == [str(big)]
    assert scan.git_dirs == [str(git)]
    pol = policy_for(lay, [])
    pol.filesystem.writable = [str(big), str(extra)]
    notes = plan_filesystem(pol).notes
    assert f"writable path {big} scan stopped after 50 entries" in " ".join(notes)


def test_gitfile_is_not_a_git_dir(lay: Layout) -> None:
    (lay.ws / "wt").mkdir()
    (lay.ws / "wt" / ".git").write_text("gitdir: /elsewhere\n")
    scan = fsplan.scan_workspace(str(lay.ws))
    assert scan.git_dirs == []


def test_a_gitfile_path_is_read_to_its_last_line_break_as_git_reads_it(lay: Layout) -> None:
    """git takes everything after "gitdir: " but the trailing line breaks: a path
    over two lines was read as its first line, and its repository never checked."""
    wt = lay.ws / "wt"
    (wt / "two\nlines").mkdir(parents=True)
    (wt / ".git").write_text("gitdir: two\nlines\r\n")
    assert fsplan.gitfile_target(str(wt / ".git")) == str(wt / "two\nlines")
    (wt / ".git").write_text("gitdir:two\n")  # the twin: what git refuses, so does corral
    assert fsplan.gitfile_target(str(wt / ".git")) is None


def test_a_git_dir_by_another_name_is_protected(lay: Layout) -> None:
    """A directory holding HEAD, objects/ and refs/ (a bare repository, `git init
    --bare`) is a repository to git run in it: its config and hooks are
    protected as a .git's are, and the walk does not go inside.  The twin: a
    directory with a HEAD file alone is a directory."""
    bare, plain = lay.ws / "deps" / "lib.git", lay.ws / "notes"
    for d in (bare / "objects", bare / "refs", bare / "hooks", plain):
        d.mkdir(parents=True)
    (bare / "HEAD").write_text("ref: refs/heads/main\n")
    (bare / "config").write_text("[core]\n\tbare = true\n")
    (plain / "HEAD").write_text("a note\n")
    (plain / "config").write_text("mine\n")
    plan = plan_filesystem(policy_for(lay, []))
    ro = dests(plan, "ro-bind")
    assert str(bare / "config") in ro and str(bare / "hooks") in ro
    assert str(plain / "config") not in ro
    assert str(bare / "objects") not in fsplan.scan_workspace(str(lay.ws)).dirs


@pytest.mark.parametrize("value", [".githooks", '".githooks"  # moved'])
def test_core_hooks_path_is_protected(lay: Layout, value: str) -> None:
    git = lay.ws / ".git"
    (git / "hooks").mkdir(parents=True)
    (git / "config").write_text(f"[user]\n\tname = x\n[core]\n\thooksPath = {value}\n")
    (lay.ws / ".githooks").mkdir()
    plan = plan_filesystem(policy_for(lay, []))
    hooks = str(lay.ws / ".githooks")
    assert Mount("ro-bind", hooks, hooks) in plan.mounts


def test_missing_core_hooks_path_is_quarantined(lay: Layout) -> None:
    git = lay.ws / ".git"
    git.mkdir()
    (git / "config").write_text("[core]\nHooksPath = tools/hooks\n")
    plan = plan_filesystem(policy_for(lay, []))
    assert str(lay.ws / "tools" / "hooks") in plan.quarantine


def test_hooks_path_only_in_core_section(lay: Layout) -> None:
    git = lay.ws / ".git"
    git.mkdir()
    (git / "config").write_text("[alias]\nhooksPath = nope\n")
    assert fsplan._hooks_path(str(git)) is None


def test_missing_write_deny_is_quarantined_not_mounted(lay: Layout) -> None:
    (lay.ws / ".idea").mkdir()
    (lay.ws / ".envrc").write_text("")
    plan = plan_filesystem(policy_for(lay))
    vscode = str(lay.ws / ".vscode")
    assert vscode in plan.quarantine
    assert str(lay.ws / "corral.toml") in plan.quarantine
    assert not any(m.dest == vscode for m in plan.mounts)
    assert Mount("ro-bind", str(lay.ws / ".idea"), str(lay.ws / ".idea")) in plan.mounts
    assert Mount("ro-bind", str(lay.ws / ".envrc"), str(lay.ws / ".envrc")) in plan.mounts


def test_write_deny_symlink_out_of_workspace_needs_nothing(lay: Layout) -> None:
    outside = lay.root / "outside"
    outside.mkdir()
    (lay.ws / ".vscode").symlink_to(outside)
    plan = plan_filesystem(policy_for(lay, []))
    assert not any(m.dest in (str(outside), str(lay.ws / ".vscode")) for m in plan.mounts)
    assert str(lay.ws / ".vscode") not in plan.quarantine


def test_env_files_in_workspace_are_masked(lay: Layout) -> None:
    ws = lay.ws
    (ws / "a" / "b").mkdir(parents=True)
    (ws / "node_modules").mkdir()
    secrets = [ws / ".env", ws / ".env.local", ws / "a" / ".env", ws / "a" / "b" / ".env.prod"]
    secrets += [ws / "a" / ".npmrc"]
    templates = [ws / ".env.example", ws / "a" / ".env.sample", ws / ".env.template"]
    for path in [*secrets, *templates, ws / "node_modules" / ".env", ws / "env"]:
        path.write_text("TOKEN=x\n")
    plan = plan_filesystem(policy_for(lay, []))
    masks = set(dests(plan, "mask-file"))
    for path in secrets:
        assert str(path) in masks, path
    for path in templates:
        assert str(path) not in masks, path
    assert str(ws / "env") not in masks
    assert str(ws / "node_modules" / ".env") not in masks  # skipped directory


def test_directories_holding_protected_paths_are_pinned_before_them(lay: Layout) -> None:
    """Each directory between the workspace and a mask or read-only bind in it is
    bound onto itself (renaming a mount fails in every sandbox), after the
    workspace's bind and before what it holds; the workspace's own entries, and
    directories holding nothing protected, are not."""
    ws = lay.ws
    (ws / "apps" / "web").mkdir(parents=True)
    (ws / "apps" / "web" / ".env").write_text("A=1")
    (ws / "apps" / "plain").mkdir()
    (ws / ".env").write_text("A=1")
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "config").write_text("")
    plan = plan_filesystem(policy_for(lay, []))
    pins = [m for m in plan.mounts if m.why.startswith("pinned")]
    assert [m.dest for m in pins] == [str(ws / ".git"), str(ws / "apps"), str(ws / "apps" / "web")]
    assert all(m.kind == "bind" and m.src == m.dest for m in pins)
    workspace = index(plan, Mount("bind", str(ws), str(ws)))
    env = index(plan, Mount("mask-file", str(ws / "apps" / "web" / ".env")))
    config = next(i for i, m in enumerate(plan.mounts) if m.dest == str(ws / ".git" / "config"))
    assert workspace < index(plan, pins[0]) and index(plan, pins[-1]) < min(env, config)


def test_writable_path_must_exist(lay: Layout) -> None:
    pol = policy_for(lay, [])
    pol.filesystem.writable = ["does-not-exist"]
    with pytest.raises(PolicyError, match="does-not-exist"):
        plan_filesystem(pol)
    (lay.ws / "file").write_text("")
    pol.filesystem.writable = ["file"]
    with pytest.raises(PolicyError, match="not a directory"):
        plan_filesystem(pol)


# -- host unix sockets -------------------------------------------------------------------


def test_visible_host_socket_is_masked(lay: Layout, monkeypatch: pytest.MonkeyPatch) -> None:
    (lay.root / "run").mkdir()
    sock = lay.root / "run" / "d.sock"
    bind_socket(sock)
    private = lay.root / "private-tmp"
    private.mkdir()
    hidden = private / "x.sock"
    bind_socket(hidden)
    (lay.root / "plain").write_text("")
    fake = [str(sock), str(hidden), str(lay.root / "gone.sock"), str(lay.root / "plain")]
    monkeypatch.setattr(fsplan, "host_unix_sockets", lambda *_: fake)
    plan = plan_filesystem(policy_for(lay, []))
    assert Mount("mask-file", str(sock)) in plan.mounts
    assert dests(plan, "mask-file") == [str(sock)]


@pytest.fixture
def open_root() -> Iterator[Path]:
    """A directory every user may enter down from / (tmp_path's parents are 0700)."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="corral-reach-"))
    os.chmod(root, 0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root)


def test_a_socket_another_uid_cannot_reach_needs_no_mask(
    open_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    me, stranger = os.getuid(), os.getuid() + 12345
    modes = {"closed": 0o700, "others": 0o701, "group": 0o710, "open": 0o755}
    socks = {}
    for name, mode in modes.items():
        (open_root / name).mkdir()
        socks[name] = open_root / name / "d.sock"
        bind_socket(socks[name])
        os.chmod(open_root / name, mode)
    assert fsplan.beyond_reach(str(socks["closed"]), stranger)
    assert not fsplan.beyond_reach(str(socks["closed"]), me)  # its owner may enter
    for name in ("others", "group", "open"):  # a search bit: maybe reachable
        assert not fsplan.beyond_reach(str(socks[name]), stranger), name
    assert not fsplan.beyond_reach(str(open_root / "gone" / "d.sock"), stranger)  # unsure
    # the plan: the stranger's sandbox skips only the unreachable one's mask
    monkeypatch.setattr(fsplan, "host_unix_sockets", lambda *_: [str(p) for p in socks.values()])
    monkeypatch.setattr(fsplan, "host_net_dirs", lambda *_: [])
    monkeypatch.setattr(fsplan, "PRIVATE_TMP", (str(open_root / "private-tmp"),))
    ws = open_root / "ws"
    ws.mkdir()
    pol = Policy(str(ws))
    pol.filesystem.use_defaults = False
    masked = dests(plan_filesystem(pol, capless_uid=stranger), "mask-file")
    assert masked == sorted(str(socks[n]) for n in ("others", "group", "open"))
    # a tier whose sandbox may hold capabilities (no capless_uid) masks every one
    assert dests(plan_filesystem(pol), "mask-file") == sorted(str(p) for p in socks.values())
    # a snapshot of the closed directory (a missing secret in it) opens the way:
    # its socket is masked again
    pol.filesystem.read_deny = [str(open_root / "closed" / "missing-secret")]
    plan = plan_filesystem(pol, capless_uid=stranger)
    assert Mount("tmpfs", str(open_root / "closed")) in plan.mounts
    assert str(socks["closed"]) in dests(plan, "mask-file")


def test_host_unix_sockets_parses_proc_net_unix(tmp_path: Path) -> None:
    table = tmp_path / "unix"
    table.write_text(
        "Num       RefCount Protocol Flags    Type St Inode Path\n"
        "0000: 00000002 00000000 00010000 0001 01 1001 /run/b.sock\n"
        "0000: 00000002 00000000 00010000 0001 01 1002 @abstract\n"
        "0000: 00000002 00000000 00000000 0002 01 1003\n"
        "0000: 00000002 00000000 00010000 0001 01 1004 /var/with space.sock\n"
        "0000: 00000002 00000000 00010000 0001 01 1005 /run/a.sock\n"
        "0000: 00000002 00000000 00010000 0001 01 1006 /run/a.sock\n"
    )
    assert fsplan.host_unix_sockets(str(table)) == [
        "/run/a.sock",
        "/run/b.sock",
        "/var/with space.sock",
    ]
    assert fsplan.host_unix_sockets(str(tmp_path / "missing")) == []


def test_mount_repr_and_equality() -> None:
    a = Mount("ro-bind", "/x", "/x", "why")
    assert a == Mount("ro-bind", "/x", "/x")
    assert hash(a) == hash(Mount("ro-bind", "/x", "/x"))
    assert a != Mount("bind", "/x", "/x")
    assert repr(a) == "ro-bind /x  # why"
    assert repr(Mount("symlink", "/l", "t")) == "symlink t /l"


def test_kernel_mounts_cover_kernel_state_and_host_interfaces() -> None:
    """Pure: /proc entries that reach kernel-wide state become read-only binds of
    themselves (only those the host has), each host interface directory an empty
    tmpfs; nothing else under /proc is touched (twin: /proc/self stays)."""
    net = ["/sys/class/net", "/sys/devices/virtual/net", "/sys/devices/pci0/virtio1/net"]
    mounts = fsplan.kernel_mounts({"sys", "fs", "self", "cpuinfo", "1"}, net)
    binds = [m for m in mounts if m.kind == "ro-bind"]
    assert [(m.src, m.dest) for m in binds] == [
        ("/proc/sys", "/proc/sys"),
        ("/proc/fs", "/proc/fs"),
    ]
    hidden = [(m.kind, m.dest) for m in mounts if m.kind != "ro-bind"]
    assert hidden == [("tmpfs", path) for path in net]
    assert not any(m.dest.startswith(("/proc/self", "/proc/1", "/proc/cpuinfo")) for m in mounts)
    assert fsplan.kernel_mounts(set(), []) == []


def test_host_net_dirs_follow_the_links(tmp_path: Path) -> None:
    """From a fake /sys/class/net: the class directory and each interface's parent
    ``net`` directory (where a MAC address can be read); links elsewhere are ignored."""
    devices = tmp_path / "devices"
    for parent in ("virtual/net/lo", "pci0/virtio1/net/eth0"):
        (devices / parent).mkdir(parents=True)
    klass = tmp_path / "class-net"
    klass.mkdir()
    (klass / "lo").symlink_to(devices / "virtual/net/lo")
    (klass / "eth0").symlink_to(devices / "pci0/virtio1/net/eth0")
    (klass / "bonding_masters").write_text("")
    found = fsplan.host_net_dirs(str(klass), str(devices))
    assert found == sorted(
        [str(klass), str(devices / "pci0/virtio1/net"), str(devices / "virtual/net")]
    )
    # links that lead outside the devices tree are not followed into a mount
    assert fsplan.host_net_dirs(str(klass), str(tmp_path / "elsewhere")) == [str(klass)]
    assert fsplan.host_net_dirs(str(tmp_path / "missing")) == []


def test_plan_hides_the_real_hosts_interfaces(monkeypatch: pytest.MonkeyPatch) -> None:
    """On this host: every interface /sys/class/net lists has its directory hidden."""
    if not os.path.isdir("/sys/class/net"):
        pytest.skip("this host has no /sys/class/net")
    found = fsplan.host_net_dirs()
    assert "/sys/class/net" in found
    for name in os.listdir("/sys/class/net"):
        real = os.path.realpath(f"/sys/class/net/{name}")
        if os.path.isdir(real) and real.startswith("/sys/devices/"):
            assert os.path.dirname(real) in found, name


def test_hard_links_found_and_made_read_only(lay: Layout) -> None:
    """A file with a link the scan does not find in the workspace is bound read-only
    over itself and reported; a pair whose links are both inside is left alone."""
    outside = lay.root / "outside.txt"
    outside.write_text("x")
    os.link(outside, lay.ws / "planted.txt")
    (lay.ws / "deep").mkdir()
    (lay.ws / "deep" / "a").write_text("a")
    os.link(lay.ws / "deep" / "a", lay.ws / "b")
    os.symlink(outside, lay.ws / "to-outside")  # a symlink is not a hard link
    plan = plan_filesystem(policy_for(lay, read_deny=[]))
    planted = str(lay.ws / "planted.txt")
    assert plan.hardlinks == [planted]
    assert Mount("ro-bind", planted, planted) in plan.mounts
    assert index(plan, Mount("bind", str(lay.ws), str(lay.ws))) < index(
        plan, Mount("ro-bind", planted, planted)
    )
    assert any(planted in n and "read-only for this run" in n for n in plan.notes)
    assert not any(m.dest in (str(lay.ws / "b"), str(lay.ws / "deep" / "a")) for m in plan.mounts)
    # a tier without mounts gets the same decision
    assert plan_filesystem(policy_for(lay, read_deny=[]), mounts=False).hardlinks == [planted]


def test_hard_links_to_secrets_are_masked(lay: Layout) -> None:
    """A link to a secret (a denied file, or a file in a denied directory) is the
    secret: masked and denied, on both kinds of tier; another link stays read-only."""
    (lay.home / ".ssh").mkdir()
    key = lay.home / ".ssh" / "id_ed25519"
    key.write_text("key")
    token = lay.home / "token.txt"
    token.write_text("t")
    os.link(key, lay.ws / "key-link")
    os.link(token, lay.ws / "token-link")
    plain = lay.root / "plain.txt"
    plain.write_text("p")
    os.link(plain, lay.ws / "plain-link")
    pol = policy_for(lay, read_deny=["~/.ssh/", "~/token.txt"])
    for mounts in (True, False):
        plan = plan_filesystem(pol, mounts=mounts)
        masked = {str(lay.ws / "key-link"), str(lay.ws / "token-link")}
        assert masked <= set(plan.read_deny), plan.read_deny
        assert plan.hardlinks == [str(lay.ws / "plain-link")]  # the twin: read-only only
        if mounts:
            assert {m.dest for m in plan.mounts if m.kind == "mask-file"} >= masked


def test_links_inside_to_a_secret_or_a_protected_file(lay: Layout) -> None:
    """Both names in the workspace: a link to ``.env`` is masked like it, a link to a
    write-protected file is write-protected like it (on both kinds of tier); a
    plain pair of links is left alone (the twin)."""
    (lay.ws / ".env").write_text("K=1")
    os.link(lay.ws / ".env", lay.ws / "env-link")
    (lay.ws / "sub" / ".vscode").mkdir(parents=True)
    (lay.ws / "sub" / ".vscode" / "tasks.json").write_text("{}")
    os.link(lay.ws / "sub" / ".vscode" / "tasks.json", lay.ws / "tasks-link")
    (lay.ws / "a").write_text("a")
    os.link(lay.ws / "a", lay.ws / "b")
    for mounts in (True, False):  # (the built-in lists: .env and .vscode)
        plan = plan_filesystem(policy_for(lay), mounts=mounts)
        assert str(lay.ws / "env-link") in plan.read_deny
        assert str(lay.ws / "tasks-link") in plan.write_protect
        assert plan.hardlinks == []  # nothing leads outside
        assert not {str(lay.ws / "a"), str(lay.ws / "b")} & {*plan.read_deny, *plan.write_protect}
        if mounts:
            link = str(lay.ws / "tasks-link")
            assert Mount("ro-bind", link, link) in plan.mounts


def test_hard_links_refused_or_too_many(lay: Layout, monkeypatch: pytest.MonkeyPatch) -> None:
    from corral import defaults
    from corral.errors import EXIT_REFUSED, RefusedError

    outside = lay.root / "outside.txt"
    outside.write_text("x")
    for n in range(3):
        os.link(outside, lay.ws / f"l{n}")
    pol = policy_for(lay, read_deny=[])
    pol.filesystem.hardlinks = "refuse"
    with pytest.raises(RefusedError) as refused:
        plan_filesystem(pol)
    assert refused.value.code == EXIT_REFUSED
    assert str(lay.ws / "l0") in refused.value.message and '"refuse"' in refused.value.message
    pol.filesystem.hardlinks = "read-only"
    assert len(plan_filesystem(pol).hardlinks) == 3  # twin: the default protects them
    monkeypatch.setattr(defaults, "HARDLINK_MAX", 2)
    with pytest.raises(RefusedError, match="more than 2"):
        plan_filesystem(pol)


def test_hardlink_note_lists_at_most_ten() -> None:
    found = [f"/ws/f{n}" for n in range(12)]
    note = fsplan.hardlink_decision(found, "read-only")
    assert "/ws/f9" in note and "/ws/f10" not in note and "and 2 more" in note


def test_read_only_git_files_are_watched_through_their_lock(lay: Layout) -> None:
    ws = lay.ws
    git, sub = ws / ".git", ws / "sub" / ".git"
    for d in (git, sub):
        (d / "hooks").mkdir(parents=True)
        (d / "config").write_text("")
    (git / "config.worktree").write_text("")
    plan = plan_filesystem(policy_for(lay, []))
    assert plan.lock_watch == {
        str(git): {
            "config.lock": str(git / "config"),
            "config.worktree.lock": str(git / "config.worktree"),
        },
        str(sub): {"config.lock": str(sub / "config")},  # a missing config.worktree: quarantined
    }
    (ws / "plain").mkdir()
    assert plan_filesystem(policy_for(lay, [])).lock_watch.keys() == {str(git), str(sub)}


def test_configs_that_hold_registry_tokens_are_unreadable_by_default(lay: Layout) -> None:
    home = lay.home
    (home / ".npmrc").write_text("//registry.npmjs.org/:_authToken=npm_secret\n")
    (home / ".pip").mkdir()
    (home / ".pip" / "pip.conf").write_text("[global]\nindex-url = https://u:tok@host/\n")
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text("[global]\n")
    (home / ".config" / "other.conf").write_text("fine\n")  # the allow twin: not a secret
    plan = plan_filesystem(policy_for(lay))
    assert str(home / ".npmrc") in dests(plan, "mask-file")
    assert {str(home / ".pip"), str(home / ".config" / "pip")} <= set(dests(plan, "mask-dir"))
    masked = set(dests(plan, "mask-file")) | set(dests(plan, "mask-dir"))
    assert str(home / ".config" / "other.conf") not in masked
    # absent ones are still hidden if created later: their parent is snapshotted
    for name in (".yarnrc", ".bunfig.toml", ".condarc"):
        assert str(home / name) in plan.read_deny
    assert str(home) in dests(plan, "remount-ro")


def test_every_policy_file_in_the_workspace_is_write_deny_and_new_ones_are_found(
    tmp_path: Path,
) -> None:
    """A run started in ``sub`` loads ``sub/corral.toml``: it is policy like the root's."""
    from corral.fsplan import Repositories, new_protected, scan_workspace

    ws = tmp_path / "ws"
    (ws / "sub" / "deep").mkdir(parents=True)
    (ws / "sub" / "deep" / "corral.toml").write_text("[env]\n")
    fs = plan_filesystem(Policy.load(workspace=str(ws)))
    nested = str(ws / "sub" / "deep" / "corral.toml")
    assert any(m.kind == "ro-bind" and m.dest == nested for m in fs.mounts)
    assert nested in fs.keep_in_place
    before = Repositories(scan_workspace(str(ws)), 0)
    (ws / "sub" / "corral.toml").write_text("[filesystem]\ndefaults = false\n")
    after = scan_workspace(str(ws), git_only=True)
    assert new_protected(after, before) == [str(ws / "sub" / "corral.toml")]
    (ws / "sub" / "corral.toml").unlink()  # the twin: nothing new, nothing found
    assert new_protected(scan_workspace(str(ws), git_only=True), before) == []


def test_protected_names_are_found_in_every_directory_the_walk_reaches(lay: Layout) -> None:
    """A monorepo's ``packages/foo/.vscode/`` runs its tasks in an editor started in
    ``packages/foo``: protected like the root's, at depth 1 to SCAN_MAX_DEPTH (the
    walk lists no deeper).  The root's own come from the policy's patterns, once."""
    ws = lay.ws
    levels = [ws / "/".join(f"d{n}" for n in range(1, depth + 1)) for depth in range(1, 8)]
    for here in levels:
        (here / ".vscode").mkdir(parents=True)
        (here / ".claude").mkdir()
        (here / ".claude" / "settings.json").write_text("{}\n")
        (here / ".mcp.json").write_text("{}\n")
    (ws / ".vscode").mkdir()
    scan = fsplan.scan_workspace(str(ws))
    found = set(scan.protected)
    for here in levels[: defaults.SCAN_MAX_DEPTH]:
        for name in (".vscode", ".claude", ".mcp.json"):
            assert str(here / name) in found, here / name
    for name in (".vscode", ".claude", ".mcp.json"):
        assert str(levels[defaults.SCAN_MAX_DEPTH] / name) not in found  # depth 7
    assert str(ws / ".vscode") not in found  # the root's: write_deny_patterns
    plan = plan_filesystem(policy_for(lay))
    binds = {m.dest: m for m in plan.mounts if m.kind == "ro-bind"}
    deepest = str(levels[defaults.SCAN_MAX_DEPTH - 1] / ".claude")
    assert deepest in binds and binds[deepest].why.startswith("write-deny")
    assert deepest in plan.keep_in_place and deepest in plan.write_protect
    assert str(levels[0] / ".mcp.json") in binds
    assert (
        str(levels[0]) not in binds
        and str(levels[defaults.SCAN_MAX_DEPTH] / ".vscode") not in binds
    )
    assert [m.dest for m in plan.mounts].count(str(ws / ".vscode")) == 1
    # [filesystem] defaults = false turns the names off below the root as at it;
    # a policy file stays protected whatever the policy says
    (levels[0] / "corral.toml").write_text("[env]\n")
    off = plan_filesystem(policy_for(lay, []))
    dests_off = {m.dest for m in off.mounts if m.kind == "ro-bind"}
    assert str(levels[0] / ".vscode") not in dests_off
    assert str(levels[0] / "corral.toml") in dests_off


def test_a_file_named_like_a_protected_directory_is_not_taken_for_it(lay: Layout) -> None:
    """The list says ``.vscode/`` is a directory and ``.mcp.json`` a file: a FILE named
    ``.vscode`` or a directory named ``.mcp.json`` is neither (the twins match).  A
    symlink counts as either: it is protected where it leads."""
    ws = lay.ws
    (ws / "a").mkdir()
    (ws / "a" / ".vscode").write_text("not settings\n")
    (ws / "a" / ".mcp.json").mkdir()
    (ws / "b" / ".vscode").mkdir(parents=True)
    (ws / "b" / ".mcp.json").write_text("{}\n")
    (ws / "c").mkdir()
    (ws / "c" / ".cursor").symlink_to(ws / "b" / ".vscode")
    found = set(fsplan.scan_workspace(str(ws)).protected)
    assert str(ws / "a" / ".vscode") not in found and str(ws / "a" / ".mcp.json") not in found
    assert {str(ws / "b" / ".vscode"), str(ws / "b" / ".mcp.json")} <= found
    assert str(ws / "c" / ".cursor") in found


def test_protected_entries_made_after_launch_are_new_and_those_there_are_not(
    lay: Layout,
) -> None:
    ws = lay.ws
    (ws / "pkg" / "a" / ".vscode").mkdir(parents=True)
    (ws / "pkg" / "a" / ".vscode" / "tasks.json").write_text("{}\n")
    (ws / "pkg" / "b").mkdir()
    before = fsplan.Repositories(fsplan.scan_workspace(str(ws)), 0)
    (ws / "pkg" / "a" / ".vscode" / "tasks.json").write_text('{"evil": 1}\n')  # existing
    (ws / "pkg" / "b" / ".mcp.json").write_text("{}\n")
    (ws / "pkg" / "b" / ".cursor" / "sub").mkdir(parents=True)
    (ws / "pkg" / "b" / ".cursor" / "sub" / ".mcp.json").write_text("{}\n")  # goes with it
    (ws / "pkg" / "b" / "README.md").write_text("twin\n")
    (ws / ".vscode").mkdir()  # the root's: the quarantine list has it (write_deny_patterns)
    (ws / "pkg" / "b" / "corral.toml").write_text("[env]\n")  # what corral loads, unasked
    after = fsplan.scan_workspace(str(ws), git_only=True, before=before)
    # only the policy file: a clone or a template brings its own .vscode/, .mcp.json...
    assert fsplan.new_protected(after, before) == [str(ws / "pkg" / "b" / "corral.toml")]
    assert fsplan.created_repositories(str(ws), before) is not None
    (ws / "pkg" / "b" / "corral.toml").unlink()
    assert fsplan.created_repositories(str(ws), before) is None  # the twin
    # with [filesystem] defaults = false only a new corral.toml counts
    off = fsplan.Repositories(fsplan.scan_workspace(str(ws)), 0)
    (ws / "pkg" / "a" / ".claude").mkdir()
    (ws / "pkg" / "a" / "corral.toml").write_text("[env]\n")
    later = fsplan.scan_workspace(str(ws), git_only=True)
    assert fsplan.new_protected(later, off) == [str(ws / "pkg" / "a" / "corral.toml")]


def test_corrals_own_state_directory_in_the_workspace_is_not_walked(lay: Layout) -> None:
    """Should corral's state directory lie in the workspace, its home layers' dotfiles
    (.bashrc, .zshrc: the sandbox's own $HOME) are not protected names."""
    ws = lay.ws
    layer = ws / "state" / "corral" / "homes" / "ws-1"
    layer.mkdir(parents=True)
    (layer / ".zshrc").write_text("# mine\n")
    (ws / "pkg").mkdir()
    (ws / "pkg" / ".zshrc").write_text("# mine\n")  # the twin: found
    scan = fsplan.scan_workspace(str(ws), skip={str(ws / "state" / "corral")})
    assert scan.protected == [str(ws / "pkg" / ".zshrc")]
    assert str(layer / ".zshrc") in fsplan.scan_workspace(str(ws)).protected


def test_a_state_directory_in_the_workspace_is_refused_without_mounts(
    lay: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without mounts (landlock) nothing holds corral's state directory in place: a
    run renamed one in the workspace and left a symlink, and the logs and the
    quarantine went where it led.  Refused however it is spelled ("//", a
    symlink to it; found by attacking the first refusal); the twins: with mounts
    it is masked, and one outside the workspace is fine."""
    (lay.ws / ".st").mkdir()
    (lay.root / "stlink").symlink_to(lay.ws / ".st")
    for spelled in (str(lay.ws / ".st"), str(lay.ws) + "//.st", str(lay.root / "stlink")):
        monkeypatch.setenv("XDG_STATE_HOME", spelled)
        with pytest.raises(PolicyError, match="state directory"):
            plan_filesystem(policy_for(lay, []), mounts=False)
        plan_filesystem(policy_for(lay, []), mounts=True)  # (masked: a mount holds it)
    monkeypatch.setenv("XDG_STATE_HOME", str(lay.state))
    plan_filesystem(policy_for(lay, []), mounts=False)


# -- the real home's links into the workspace (a dotfiles repository) ------------------


def test_home_loaded_names_are_dotfiles_bin_and_config_entries() -> None:
    loaded = fsplan.home_loaded
    assert loaded(".gitconfig") and loaded(".bashrc") and loaded(".config") and loaded("bin")
    assert loaded(".config/nvim") and loaded(".config/git")
    # where stow links files one by one: git's and ssh's config, programs on PATH
    assert loaded(".config/git/config") and loaded(".ssh/config")
    assert loaded(".local/bin") and loaded(".local/bin/tool")
    # and what the host runs unasked: user units, autostart entries, fish's startup
    assert loaded(".config/systemd/user/my.service") and loaded(".config/autostart/a.desktop")
    assert loaded(".config/fish/config.fish") and loaded(".config/fish/conf.d/x.fish")
    assert not loaded(".config/systemd/other/x")
    # the twins: a project kept under ~ by a link, and what no tool loads unasked
    assert not loaded("src") and not loaded("notes") and not loaded(".cache/x")
    assert not loaded(".config/nvim/init.lua")  # (a linked ~/.config/nvim is caught whole)


def test_home_link_decision_protects_targets_inside_a_writable_root() -> None:
    links = [
        ("/h/.gitconfig", "/ws/git/.gitconfig"),
        ("/h/.config/nvim", "/ws/nvim"),
        ("/h/.vimrc", "/elsewhere/vimrc"),  # read-only already: nothing
        ("/h/.zshrc", "/ws2/zshrc"),  # a name beside the root, not in it
        ("/h/.tmux.conf", "/extra/tmux.conf"),  # a writable path other than the workspace
        ("/h/.config/helix", "/ws"),  # the workspace itself: a note
        ("/h/.code", "/"),  # a directory holding it: a note
    ]
    protect, notes = fsplan.home_link_decision(links, ["/ws", "/extra"])
    assert protect == [
        ("/h/.gitconfig", "/ws/git/.gitconfig"),
        ("/h/.config/nvim", "/ws/nvim"),
        ("/h/.tmux.conf", "/extra/tmux.conf"),
    ]
    assert len(notes) == 2
    assert "/h/.config/helix leads to /ws" in notes[0] and "/h/.code leads to /" in notes[1]
    assert fsplan.home_link_decision(links[2:4], ["/ws"]) == ([], [])


def stow(lay: Layout) -> None:
    """GNU stow's layout and chezmoi-style names: the real home's links lead into the
    workspace, a dotfiles repository."""
    ws, home = lay.ws, lay.home
    (ws / "git").mkdir()
    (ws / "git" / ".gitconfig").write_text("[user]\n")
    (ws / "git" / "README").write_text("mine\n")
    (ws / "nvim").mkdir()
    (ws / "nvim" / "init.lua").write_text("-- mine\n")
    (home / ".gitconfig").symlink_to("../ws/git/.gitconfig")
    (home / ".config").mkdir()
    (home / ".config" / "nvim").symlink_to(ws / "nvim")
    (home / ".bashrc").symlink_to("../ws/bashrc")  # not there yet
    (home / "src").symlink_to(ws / "git")  # a plain name: a project, not loaded
    (lay.root / "other").mkdir()
    (lay.root / "other" / "vimrc").write_text("")
    (home / ".vimrc").symlink_to(lay.root / "other" / "vimrc")


def test_home_links_into_the_workspace_are_write_protected(lay: Layout) -> None:
    """The finding: with a dotfiles repository as the workspace, the files the real
    home's links lead to were writable workspace files (``core.fsmonitor`` in
    ``~/.gitconfig`` ran on the host's next ``git status``).  They are write-deny
    for the run on every tier: read-only binds, the landlock tier's restore list
    (write_protect), kept in place; a missing one quarantined; a directory whole.
    The twins: a file beside them, the plain-named link and a link out of the
    workspace change nothing."""
    stow(lay)
    ws = lay.ws
    gitconfig, nvim = str(ws / "git" / ".gitconfig"), str(ws / "nvim")
    for mounts in (True, False):
        plan = plan_filesystem(policy_for(lay), mounts=mounts)
        assert {gitconfig, nvim} <= set(plan.write_protect) <= set(plan.keep_in_place)
        assert str(ws / "bashrc") in plan.quarantine
        assert not {str(ws / "git"), str(ws / "git" / "README"), str(ws / "nvim" / "init.lua")} & {
            *plan.write_protect,
            *plan.quarantine,
        }
        assert not any(p.startswith(str(lay.root / "other")) for p in plan.write_protect)
        if mounts:
            for path in (gitconfig, nvim):
                assert Mount("ro-bind", path, path) in plan.mounts
            assert Mount("bind", str(ws / "git"), str(ws / "git")) in plan.mounts  # pinned
            binds = [m for m in plan.mounts if m.kind == "ro-bind" and m.dest.startswith(str(ws))]
            assert {m.dest for m in binds} == {gitconfig, nvim}, binds
            assert "leads here" in next(m.why for m in binds if m.dest == gitconfig)


def test_home_links_are_followed_as_the_kernel_does(lay: Layout) -> None:
    """The links' targets, found with a readlink and an lstat each, are realpath's
    answers: through a linked directory on the way, an absolute link, a link to a
    link, a ``..`` after a linked directory, a dangling link and a linked
    ``~/.config``; the targets in the workspace are protected, the one a ``..``
    takes out of it is not."""
    ws, home = lay.ws, lay.home
    (ws / "dots" / "sub").mkdir(parents=True)
    for name in ("a", "b", "c", "e"):
        (ws / "dots" / name).write_text("")
    (lay.root / "outside").mkdir()
    (lay.root / "outside" / "d").write_text("")
    (home / "dotfiles").symlink_to(ws / "dots")  # (a plain name: not itself protected)
    (home / ".a").symlink_to("dotfiles/a")
    (home / ".b").symlink_to(ws / "dots" / "b")
    (ws / "dots" / "to-c").symlink_to("c")
    (home / ".c").symlink_to("dotfiles/to-c")
    (ws / "dots" / "sub" / "up").symlink_to(lay.root / "outside" / "deep")
    (lay.root / "outside" / "deep").mkdir()
    (home / ".d").symlink_to("dotfiles/sub/up/../d")  # .. after a link: outside/d
    (home / ".missing").symlink_to("dotfiles/nothing")
    (lay.root / "conf").mkdir()
    (lay.root / "conf" / "tool").symlink_to("../ws/dots/e")
    (home / ".config").symlink_to(lay.root / "conf")
    plan = plan_filesystem(policy_for(lay), mounts=False)
    steps = fsplan._Planner(policy_for(lay), False, [str(home)])
    found = dict(steps.home_links())
    assert set(found) == {
        str(home / n) for n in (".a", ".b", ".c", ".d", ".missing", ".config")
    } | {str(home / ".config" / "tool")}
    for link, target in found.items():
        assert target == os.path.realpath(link), link
    dots = ws / "dots"
    assert {str(dots / n) for n in ("a", "b", "c", "e")} <= set(plan.write_protect)
    assert str(dots / "to-c") not in plan.write_protect  # (a link on the way: not bound)
    assert str(lay.root / "outside" / "d") not in plan.write_protect
    assert str(dots / "nothing") in plan.quarantine


def test_a_home_link_to_the_workspace_itself_is_a_note(lay: Layout) -> None:
    """``~/.config/nvim`` leading to the workspace (or ``~/code`` to a directory that
    holds it): protecting it would leave nothing writable; the run goes on as one
    inside ``~/.config/nvim`` would, and says so."""
    (lay.home / ".config").mkdir()
    (lay.home / ".config" / "nvim").symlink_to(lay.ws)
    (lay.home / ".code").symlink_to(lay.root)
    plan = plan_filesystem(policy_for(lay))
    assert str(lay.ws) not in plan.write_protect and str(lay.root) not in plan.write_protect
    assert any(f"{lay.home}/.config/nvim leads to {lay.ws}" in n for n in plan.notes)
    assert any(f"{lay.home}/.code leads to {lay.root}" in n for n in plan.notes)
    assert Mount("bind", str(lay.ws), str(lay.ws)) in plan.mounts


def test_a_writable_root_inside_another_gets_the_tops_protections(lay: Layout) -> None:
    """``writable = [P, P/proj]``: the walk visits ``P/proj`` once, from ``P``, but
    its top is a root's top all the same: ``.mcp.json`` or ``.envrc`` made there are
    quarantined as with ``writable = [P/proj]`` alone.  Twin: a directory of ``P``
    that is no root gets no such names at its top."""
    outer = lay.root / "P"
    (outer / "proj").mkdir(parents=True)
    (outer / "other").mkdir()
    pol = policy_for(lay, [])
    pol.filesystem.use_defaults = True
    pol.filesystem.writable = [str(outer), str(outer / "proj")]
    plan = plan_filesystem(pol)
    for name in (".mcp.json", ".envrc", "corral.toml"):
        assert str(outer / "proj" / name) in plan.quarantine, name
        assert str(outer / name) in plan.quarantine, name
        assert str(outer / "other" / name) not in plan.quarantine, name
    assert plan.repositories is not None
    assert plan.repositories.roots == (str(lay.ws), str(outer))  # walked once


def test_include_targets_resolve_as_git_does() -> None:
    targets = fsplan.include_targets
    assert targets("../.gitconfig", "/ws/.git/config", ["/h"]) == ["/ws/.gitconfig"]
    assert targets("/abs/x", "/ws/.git/config", ["/h"]) == ["/abs/x"]
    assert targets("~/inc", "/ws/.git/config", ["/h", "/h2"]) == ["/h/inc", "/h2/inc"]
    assert targets(":(optional)local", "/h/.gitconfig", ["/h"]) == ["/h/local"]
    # the twins: another user's home and no value name nothing
    assert targets("~bob/x", "/ws/.git/config", ["/h"]) == []
    assert targets("", "/ws/.git/config", ["/h"]) == []


def test_git_config_files_follow_includes_of_includes(tmp_path: Path) -> None:
    """Includes and conditional includes, nested, missing ones named too, a loop
    read once, git's depth kept; the core keys of every file, a later one winning.
    Twin: a ``path`` key of another section includes nothing."""
    root = os.path.realpath(tmp_path)
    (tmp_path / "a").write_text(
        '[include]\n\tpath = b\n[includeIf "gitdir:~/w/"]\n\tpath = sub/c\n'
        "[core]\n\thooksPath = mine\n[alias]\n\tpath = not-a-file\n"
    )
    (tmp_path / "b").write_text("[include]\n\tpath = a\n[core]\n\thooksPath = b-hooks\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c").write_text("[include]\n\tpath = ../missing\n")
    files, core = fsplan.git_config_files(f"{root}/a", [])
    assert files == [f"{root}/{n}" for n in ("a", "b", "sub/c", "missing")]
    assert core == {"hookspath": "mine"}
    for n in range(12):
        (tmp_path / f"d{n}").write_text(f"[include]\npath = d{n + 1}\n")
    files, _ = fsplan.git_config_files(f"{root}/d0", [])
    assert len(files) == fsplan.GIT_INCLUDE_DEPTH + 1


def test_a_repositorys_included_config_is_write_deny(lay: Layout) -> None:
    """``.git/config`` includes ``../.gitconfig`` (a file of the work tree), which
    includes ``~/shared`` and ``team.cfg`` (missing): the workspace's ones are
    write-deny, the missing one quarantined, the home's left (read-only already);
    a hooksPath the included file sets is protected too.  Twin: the file beside
    them stays writable."""
    git = _repo(lay.ws)
    (git / "config").write_text("[core]\n\tbare = false\n[include]\n\tpath = ../.gitconfig\n")
    (lay.ws / ".gitconfig").write_text(
        "[include]\n\tpath = ~/shared\n\tpath = team.cfg\n[core]\n\thooksPath = .githooks\n"
    )
    (lay.ws / ".githooks").mkdir()
    (lay.home / "shared").write_text("")
    (lay.ws / "README").write_text("")
    plan = plan_filesystem(policy_for(lay, []))
    ro = set(dests(plan, "ro-bind"))
    assert str(lay.ws / ".gitconfig") in ro and str(lay.ws / ".githooks") in ro
    assert str(lay.ws / "team.cfg") in plan.quarantine
    assert str(lay.home / "shared") not in ro
    assert str(lay.ws / "README") not in ro  # the twin


def test_the_homes_git_config_includes_into_the_workspace_are_write_deny(lay: Layout) -> None:
    """``~/.gitconfig`` and ``~/.config/git/config`` include files of a dotfiles
    workspace: those are write-deny for the run.  Twin: a workspace file no home
    config names stays writable."""
    (lay.ws / "common").write_text("")
    (lay.ws / "xdg").write_text("")
    (lay.ws / "other").write_text("")
    (lay.home / ".gitconfig").write_text(f"[include]\n\tpath = {lay.ws}/common\n")
    (lay.home / ".config" / "git").mkdir(parents=True)
    (lay.home / ".config" / "git" / "config").write_text(
        f'[includeIf "gitdir:/"]\n\tpath = {lay.ws}/xdg\n'
    )
    plan = plan_filesystem(policy_for(lay, []))
    ro = set(dests(plan, "ro-bind"))
    assert str(lay.ws / "common") in ro and str(lay.ws / "xdg") in ro
    assert str(lay.ws / "other") not in ro  # the twin


def test_a_missing_writable_path_is_named_where_it_was_set(tmp_path: Path) -> None:
    """It read "writable path /x does not exist" with no file, line or key (found by
    trying corral as a new user); the twin: one that exists is writable."""
    ws = tmp_path / "ws"
    ws.mkdir()
    there = tmp_path / "there"
    there.mkdir()
    (ws / "corral.toml").write_text(
        f'[network]\nmode = "none"\n\n[filesystem]\nwritable = ["{there}", "/does/not/exist"]\n'
    )
    policy = Policy.load(workspace=str(ws))
    with pytest.raises(PolicyError) as raised:
        plan_filesystem(policy)
    assert raised.value.message == (
        f"{ws / 'corral.toml'}:5: filesystem.writable: /does/not/exist does not exist or "
        "is not a directory (create it, or remove the entry)"
    )
    flagged = Policy(str(ws))  # (no file: the flag said it)
    flagged.filesystem.writable = ["/nope"]
    with pytest.raises(PolicyError, match=r"^--writable /nope: does not exist"):
        plan_filesystem(flagged)
    flagged.filesystem.writable = [str(there)]
    assert str(there) in plan_filesystem(flagged).writable


def test_a_host_path_under_tmp_the_sandbox_cannot_see_is_named(tmp_path: Path) -> None:
    """`git clone /tmp/remote.git` failed with git's "does not exist" and nothing
    said why (found by trying corral as a new user); the twins: a path given as
    writable, one that does not exist, and one outside /tmp get no note."""
    there = {"/tmp/remote.git", "/tmp/given/x", "/var/tmp/out", "/etc/hosts"}
    notes = fsplan.host_tmp_args(
        ["git", "clone", "/tmp/remote.git", "--into=/var/tmp/out", "/tmp/given/x", "/tmp/none"],
        ["/ws", "/tmp/given"],
        there.__contains__,
    )
    assert notes == [
        "/tmp/remote.git: the sandbox has a /tmp of its own and does not see the host's; "
        "--writable /tmp/remote.git gives it this path",
        "/var/tmp/out: the sandbox has a /var/tmp of its own and does not see the host's; "
        "--writable /var/tmp/out gives it this path",
    ]
    assert fsplan.host_tmp_args(["cat", "/etc/hosts"], ["/ws"], there.__contains__) == []
    # the program itself (it was left out): a venv's python gives the venv
    venv = {"/tmp/venv/bin/python"}
    assert fsplan.host_tmp_args(["/tmp/venv/bin/python", "-V"], ["/ws"], venv.__contains__) == [
        "/tmp/venv/bin/python: the sandbox has a /tmp of its own and does not see the host's; "
        "--writable /tmp/venv gives it this path"
    ]


def _stowed(lay: Layout) -> tuple[Path, Path]:
    """GNU stow's unfolded layout: ~/.ssh and ~/.aws real, their files links into
    ~/dotfiles (one of them a level down, as stow unfolds ~/.aws/sso/)."""
    key = lay.home / "dotfiles" / "ssh" / "id_ed25519"
    cred = lay.home / "dotfiles" / "aws" / "sso" / "token.json"
    cred.parent.mkdir(parents=True)
    key.parent.mkdir(parents=True)
    key.write_text("key")
    cred.write_text("token")
    (lay.home / ".ssh").mkdir()
    (lay.home / ".ssh" / "id_ed25519").symlink_to("../dotfiles/ssh/id_ed25519")
    (lay.home / ".ssh" / "known_hosts").write_text("kh")
    (lay.home / ".aws" / "sso").mkdir(parents=True)
    (lay.home / ".aws" / "sso" / "token.json").symlink_to(cred)
    return key, cred


@pytest.mark.parametrize("mounts", [True, False])  # (False: the landlock tier's plan)
def test_links_in_a_secret_directory_are_denied_where_they_lead(lay: Layout, mounts: bool) -> None:
    key, cred = _stowed(lay)
    plan = plan_filesystem(policy_for(lay, ["~/.ssh/", "~/.aws/"]), mounts=mounts)
    assert {str(key), str(cred)} <= set(plan.read_deny)
    if mounts:
        assert Mount("mask-file", str(key)) in plan.mounts
        assert Mount("mask-file", str(cred)) in plan.mounts
    # what is no secret's link stays readable
    assert not any(p.endswith("/dotfiles") or p.endswith("/ssh") for p in plan.read_deny)


def test_links_deep_in_a_secret_directory_with_many_subdirs_are_not_sought(
    lay: Layout,
) -> None:
    """The bound on the per-run cost: one level down only in a directory with a few
    subdirectories (a browser profile has dozens); its direct links still count."""
    key, cred = _stowed(lay)
    for n in range(fsplan.SECRET_SUBDIRS_MAX):
        (lay.home / ".aws" / f"d{n}").mkdir()
    (lay.home / ".aws" / "direct").symlink_to(key)
    plan = plan_filesystem(policy_for(lay, ["~/.aws/"]))
    assert str(key) in plan.read_deny and str(cred) not in plan.read_deny


def test_a_secret_link_into_the_workspace_is_masked_there(lay: Layout) -> None:
    key = lay.ws / "ssh" / "id_ed25519"
    key.parent.mkdir()
    key.write_text("key")
    (lay.home / ".ssh").mkdir()
    (lay.home / ".ssh" / "id_ed25519").symlink_to(key)
    plan = plan_filesystem(policy_for(lay, ["~/.ssh/"]))
    assert Mount("mask-file", str(key)) in plan.mounts
    assert str(key) in plan.secrets_inside


def test_a_linked_secret_directory_is_masked_where_it_leads(lay: Layout) -> None:
    key, _ = _stowed(lay)
    (lay.home / ".ssh" / "id_ed25519").unlink()
    (lay.home / ".ssh" / "known_hosts").unlink()
    (lay.home / ".ssh").rmdir()
    (lay.home / ".ssh").symlink_to("dotfiles/ssh")
    plan = plan_filesystem(policy_for(lay, ["~/.ssh/"]))
    assert Mount("mask-dir", str(key.parent)) in plan.mounts
    assert str(key.parent) in plan.read_deny


def test_a_link_in_a_secret_directory_to_a_wide_place_is_a_note(lay: Layout) -> None:
    (lay.home / ".ssh").mkdir()
    (lay.home / ".ssh" / "home").symlink_to(lay.home)
    (lay.home / ".ssh" / "bin").symlink_to("/usr/bin")
    (lay.home / ".ssh" / "null").symlink_to("/dev/null")
    plan = plan_filesystem(policy_for(lay, ["~/.ssh/"]))
    masked = {m.dest for m in plan.mounts if m.kind.startswith("mask")}
    assert not masked & {str(lay.home), "/usr/bin", "/dev/null"}
    assert any(str(lay.home / ".ssh" / "home") in n for n in plan.notes)


def _relocated(lay: Layout) -> tuple[dict[str, str], list[Path]]:
    """Secrets where the launcher's environment moved them, and that environment."""
    base = lay.root / "elsewhere"
    env = {
        "XDG_CONFIG_HOME": str(base / "xdg"),
        "GNUPGHOME": str(base / "gpg"),
        "KUBECONFIG": f"{base / 'kube-a.yaml'}:relative.yaml:{base / 'kube-b.yaml'}",
        "AWS_SHARED_CREDENTIALS_FILE": str(base / "aws-creds"),
        "DOCKER_CONFIG": str(base / "docker"),
        "CARGO_HOME": str(base / "cargo"),
    }
    secrets = [
        base / "xdg" / "gh" / "hosts.yml",
        base / "gpg" / "private.key",
        base / "kube-a.yaml",
        base / "kube-b.yaml",
        base / "aws-creds",
        base / "docker" / "config.json",
        base / "cargo" / "credentials.toml",
    ]
    for path in secrets:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("secret")
    (base / "cargo" / "config.toml").write_text("not a secret")
    return env, secrets


@pytest.mark.parametrize("mounts", [True, False])  # (False: the landlock tier's plan)
def test_secrets_the_environment_moves_are_denied_there(lay: Layout, mounts: bool) -> None:
    env, secrets = _relocated(lay)
    plan = plan_filesystem(policy_for(lay), mounts=mounts, environ=env)
    for secret in secrets:
        assert any(str(secret) == p or inside(str(secret), p) for p in plan.read_deny), secret
    base = lay.root / "elsewhere"
    assert str(base / "cargo" / "config.toml") not in plan.read_deny
    if mounts:
        masked = {m.dest for m in plan.mounts if m.kind.startswith("mask")}
        assert {str(base / "gpg"), str(base / "xdg" / "gh"), str(base / "aws-creds")} <= masked
    # the twin: the default place stays denied, and nothing without the variables
    assert str(lay.home / ".config" / "gh") in plan.read_deny
    plain = plan_filesystem(policy_for(lay), mounts=mounts, environ={})
    assert not any(inside(p, str(base)) for p in plain.read_deny)


def test_a_moved_secret_is_not_denied_with_the_defaults_off(lay: Layout) -> None:
    env, _ = _relocated(lay)
    plan = plan_filesystem(policy_for(lay, []), environ=env)
    assert not any(inside(p, str(lay.root / "elsewhere")) for p in plan.read_deny)


def test_a_variable_naming_a_wide_place_is_a_note(lay: Layout) -> None:
    env = {"DOCKER_CONFIG": str(lay.home), "GNUPGHOME": str(lay.ws), "PIP_CONFIG_FILE": "/dev/null"}
    plan = plan_filesystem(policy_for(lay), environ=env)
    masked = {m.dest for m in plan.mounts if m.kind.startswith("mask")}
    assert not masked & {str(lay.home), str(lay.ws), "/dev/null"}
    assert any("$DOCKER_CONFIG" in n for n in plan.notes)
    assert any("$GNUPGHOME" in n for n in plan.notes)
    assert not any("/dev/null" in n for n in plan.notes)  # (a way to ignore a config)


@pytest.mark.parametrize("spelled", ["~/datasets/raw/", "{real}/raw/"])
@pytest.mark.parametrize("mounts", [True, False])  # (False: the landlock tier's plan)
def test_write_deny_spelled_through_a_linked_writable_path(
    lay: Layout, mounts: bool, spelled: str
) -> None:
    """``writable = ["~/datasets"]``, a link: a write-deny path spelled through it was
    dropped (compared unresolved with the real roots); spelled by its real path
    (the twin) it was always protected."""
    real = lay.root / "data"
    (real / "raw").mkdir(parents=True)
    (lay.home / "datasets").symlink_to(real)
    pol = policy_for(lay, [])
    pol.filesystem.writable = ["~/datasets"]
    raw = spelled.format(real=real)
    pol.filesystem.write_deny = [raw, raw.replace("/raw/", "/new/")]
    plan = plan_filesystem(pol, mounts=mounts)
    assert str(real / "raw") in plan.write_protect
    assert str(real / "new") in plan.quarantine  # (missing: quarantined if made)
    if mounts:
        bind = next(m for m in plan.mounts if m.dest == str(real / "raw"))
        assert bind.kind == "ro-bind" and bind.why.startswith("write-deny")
        if spelled.startswith("~"):  # the user's spelling, in --explain
            assert str(lay.home / "datasets" / "raw") in bind.why


@pytest.mark.parametrize("mounts", [True, False])  # (False: the landlock tier's plan)
def test_an_absent_read_deny_path_in_the_workspace_is_named_as_uncovered(
    lay: Layout, mounts: bool
) -> None:
    """Nothing can be laid over a missing path inside the workspace: a file made there
    during the run is readable to it.  Said in a note (the README said it was
    covered); the twin, present at launch, is masked and not in a note."""
    (lay.ws / "present.key").write_text("key")
    plan = plan_filesystem(policy_for(lay, ["secrets/", "deploy.key", "present.key"]), mounts)
    for name in ("secrets", "deploy.key"):
        assert any(n.startswith(f"{lay.ws / name} (read-deny) does not exist") for n in plan.notes)
    assert not any(str(lay.ws / "present.key") in n for n in plan.notes)
    assert str(lay.ws / "present.key") in plan.read_deny
    if mounts:
        assert Mount("mask-file", str(lay.ws / "present.key")) in plan.mounts
