"""The landlock tier's pure parts: rule splitting, the ruleset, the plan, the seccomp
additions.  A fake filesystem stands in for listdir, so nothing here touches disk
or the kernel (tests/integration run the same policies for real)."""

from __future__ import annotations

import errno
import functools
import operator
import os
from pathlib import Path

import pytest
from test_seccomp import AUDIT_ARCH, RET_ERRNO, run

from corral import landlock as L
from corral.policy import Policy
from corral.seccomp import compile_filter, native_arch, syscall_number
from corral.tiers.landlock import DIFFERENCES, Confined, LandlockTier, extra_seccomp_rules

# A small tree: dirs map to their entries; anything else listed is a file; links are None.
TREE: dict[str, dict[str, bool | None]] = {
    "/": {"etc": True, "home": True, "tmp": True, "usr": True, "dev": True, "bin": None},
    "/etc": {"shadow": False, "hosts": False, "ssl": True},
    "/home": {"u": True},
    "/home/u": {".ssh": True, ".bashrc": False, "proj": True, ".config": True},
    "/home/u/.config": {"gcloud": True, "app.conf": False},
    "/home/u/proj": {".env": False, "src": True, "README": False},
    "/dev": {"null": False, "sda": False, "kvm": False},
}


def listdir(path: str) -> list[tuple[str, bool | None]]:
    return sorted(TREE.get(path, {}).items())


def is_dir(path: str) -> bool | None:
    if path in TREE:
        return True
    parent, name = os.path.split(path)
    return TREE.get(parent, {}).get(name)


def rules_of(rs: L.Ruleset) -> dict[str, int]:
    return dict(rs.paths)


def allowed(rules: dict[str, int], path: str, right: int) -> bool:
    """What Landlock decides: some rule on the path or an ancestor grants it."""
    while True:
        if rules.get(path, 0) & right:
            return True
        if path == "/":
            return False
        path = os.path.dirname(path)


@pytest.fixture
def rules() -> dict[str, int]:
    rs = L.build(
        7,
        writable=["/home/u/proj"],
        read_deny=[
            "/etc/shadow",
            "/home/u/.ssh",
            "/home/u/.config/gcloud",
            "/home/u/.aws",
            "/home/u/proj/.env",
        ],
        scratch="/tmp/corral-scratch-x",
        proxy_port=None,
        listdir=listdir,
        is_dir=is_dir,
    )
    return rules_of(rs)


@pytest.mark.parametrize(
    "path",
    [
        "/etc/shadow",
        "/home/u/.ssh/id_ed25519",
        "/home/u/.config/gcloud/creds.json",
        "/home/u/.aws/credentials",
        "/home/u/proj/.env",
    ],
)
def test_secrets_cannot_be_read(rules: dict[str, int], path: str) -> None:
    assert not allowed(rules, path, L.READ_FILE)
    assert not allowed(rules, path, L.EXECUTE)


@pytest.mark.parametrize(
    "path",
    [
        "/etc/hosts",
        "/etc/ssl/certs/ca.pem",
        "/usr/bin/python3",
        "/home/u/.bashrc",
        "/home/u/.config/app.conf",
        "/home/u/proj/src/main.py",
        "/home/u/proj/README",
    ],
)
def test_everything_else_can_be_read(rules: dict[str, int], path: str) -> None:
    assert allowed(rules, path, L.READ_FILE)


def test_secret_created_later_stays_unreadable(rules: dict[str, int]) -> None:
    # ~/.aws did not exist at launch: nothing grants it, or anything new in ~
    assert not allowed(rules, "/home/u/.aws/credentials", L.READ_FILE)
    assert not allowed(rules, "/home/u/.new-token", L.READ_FILE)


def test_listing_is_never_withheld(rules: dict[str, int]) -> None:
    assert rules["/"] == L.READ_DIR  # split: only listing is safe to inherit from /
    assert allowed(rules, "/home/u/.ssh", L.READ_DIR)


def test_writes_only_in_workspace_and_scratch(rules: dict[str, int]) -> None:
    for path in ("/home/u/proj/new.txt", "/home/u/proj/src/a.py", "/tmp/corral-scratch-x/f"):
        assert allowed(rules, path, L.WRITE_FILE) and allowed(rules, path, L.MAKE_REG), path
    for path in ("/etc/hosts", "/home/u/.bashrc", "/tmp/other", "/usr/bin/x"):
        assert not allowed(rules, path, L.WRITE_FILE), path
        assert not allowed(rules, path, L.MAKE_REG | L.REMOVE_FILE), path


def test_host_scratch_areas_are_off_limits(rules: dict[str, int]) -> None:
    for path in ("/tmp/x", "/dev/sda", "/dev/kvm"):
        assert not allowed(rules, path, L.READ_FILE), path
    assert allowed(rules, "/dev/null", L.WRITE_FILE)  # allow twin: safe devices
    assert allowed(rules, "/tmp/corral-scratch-x/a", L.READ_FILE)


def test_new_file_beside_a_workspace_secret_is_writable_not_readable(
    rules: dict[str, int],
) -> None:
    # the documented price of hiding .env (corral.landlock docstring)
    assert allowed(rules, "/home/u/proj/new.txt", L.WRITE_FILE)
    assert not allowed(rules, "/home/u/proj/new.txt", L.READ_FILE)
    assert allowed(rules, "/home/u/proj/src/new.txt", L.READ_FILE)


def test_file_rules_carry_only_file_rights(rules: dict[str, int]) -> None:
    for path, access in rules.items():
        if is_dir(path) is False:
            assert access & ~L.FILE_RIGHTS == 0, path


def test_symlinks_get_no_rule(rules: dict[str, int]) -> None:
    assert "/bin" not in rules  # /bin -> usr/bin is reached through /usr


def test_network_rules() -> None:
    none = L.build(7, [], [], "/s", None, listdir=listdir, is_dir=is_dir)
    assert none.handled_net == L.NET_BIND_TCP | L.NET_CONNECT_TCP and none.ports == []
    proxy = L.build(7, [], [], "/s", 41234, listdir=listdir, is_dir=is_dir)
    assert proxy.ports == [(41234, L.NET_CONNECT_TCP)]  # connect only, never bind
    assert proxy.scoped == L.SCOPE_SIGNAL | L.SCOPE_ABSTRACT_UNIX


def test_rights_follow_the_abi() -> None:
    old = L.build(3, [], [], "/s", None, listdir=listdir, is_dir=is_dir)
    assert old.handled_fs & L.IOCTL_DEV == 0 and old.handled_net == 0 and old.scoped == 0
    assert all(a & ~old.handled_fs == 0 for _, a in old.paths)


def test_describe_names_rules() -> None:
    rs = L.build(7, ["/home/u/proj"], [], "/s", 3128, listdir=listdir, is_dir=is_dir)
    text = "\n".join(rs.describe())
    assert "read+write beneath /home/u/proj" in text and "tcp connect to port 3128" in text


def _run(name: str, *args: int) -> int:
    """The filter's verdict for one call, through the BPF interpreter of test_seccomp."""
    arch = native_arch()
    prog = compile_filter(extra_seccomp_rules(), arch)
    nr = syscall_number(name, arch)
    assert nr is not None
    ret = run(prog, nr, AUDIT_ARCH[arch], args)
    return ret - RET_ERRNO if ret & 0xFFFF0000 == RET_ERRNO else -1


@pytest.mark.parametrize(
    ("family", "kind", "denied"),
    [
        (1, 1, True),  # AF_UNIX stream
        (1, 2 | 0x80000, True),  # AF_UNIX dgram, cloexec
        (2, 2, True),  # UDP
        (10, 2 | 0x800, True),  # UDP6, nonblock
        (2, 3, True),  # raw
        (2, 1, False),  # TCP: governed by Landlock instead
        (10, 1 | 0x80000 | 0x800, False),  # TCP6 with flags
    ],
)
def test_socket_rules(family: int, kind: int, denied: bool) -> None:
    assert (_run("socket", family, kind) == errno.EACCES) == denied


def test_socketpair_stays_allowed() -> None:
    assert _run("socketpair", 1, 1) == -1


@pytest.mark.parametrize(
    ("request_", "denied"),
    [
        (0x40086602, True),  # FS_IOC_SETFLAGS
        (0x40087602, True),  # FS_IOC_SETVERSION
        (0x40086604, True),  # EXT4_IOC_SETVERSION
        (0x401C5820, True),  # FS_IOC_FSSETXATTR
        (0x40806685, True),  # FS_IOC_ENABLE_VERITY
        (0x800C6613, True),  # FS_IOC_SET_ENCRYPTION_POLICY
        (0x1_40086602, True),  # high bits the kernel drops (cmd is an unsigned int)
        (0x80086601, False),  # FS_IOC_GETFLAGS: lsattr still works
        (0x801C581F, False),  # FS_IOC_FSGETXATTR
        (0x5401, False),  # TCGETS
    ],
)
def test_inode_metadata_ioctls(request_: int, denied: bool) -> None:
    """Landlock governs device ioctls only: these set a file's metadata for its owner
    through a read-only descriptor, outside the workspace too."""
    assert (_run("ioctl", 3, request_) == errno.ENOTTY) == denied


def test_file_setattr_is_refused() -> None:
    assert _run("file_setattr", -100, 0, 0, 24, 0) == errno.ENOSYS


def test_plan_is_pure_and_complete(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "config").write_text("[core]\n")
    (ws / ".env").write_text("KEY=1\n")
    policy = Policy.load(workspace=str(ws))
    plan = LandlockTier().plan(policy, ["true"])
    assert plan.argv == ["true"] and isinstance(plan.strategy, Confined)
    assert plan.scratch and plan.env["TMPDIR"] == plan.scratch
    assert not os.path.exists(plan.scratch)  # the launcher creates it
    assert plan.restore[str(ws / ".git" / "config")] == "write-deny"
    assert plan.restore[str(ws / ".git" / "hooks")] == "write-deny"
    # a secret in the workspace: unreadable by Landlock, its renames and links undone
    assert plan.restore[str(ws / ".env")] == "read-deny"
    assert all(p.startswith(str(ws)) for p in plan.restore)  # ~/.ssh and such: not here
    assert f"  {ws / '.env'} (read-deny)" in plan.describe()
    assert dict(plan.strategy.ruleset.paths)[str(ws)] & L.WRITE_FILE
    assert "HTTP_PROXY" not in plan.env
    policy.network.mode = "proxy"
    proxied = LandlockTier().plan(policy, ["true"], door="127.0.0.1:4321")
    assert proxied.env["HTTP_PROXY"] == "http://127.0.0.1:4321"
    assert proxied.env["ALL_PROXY"] == "http://127.0.0.1:4321"
    assert proxied.env["SOCKS_PROXY"] == "socks5h://127.0.0.1:4321"
    assert isinstance(proxied.strategy, Confined)
    assert proxied.strategy.ruleset.ports == [(4321, L.NET_CONNECT_TCP)]
    with pytest.raises(ValueError):
        LandlockTier().plan(policy, ["true"], door="/run/door.sock")  # needs a TCP door
    text = plan.describe()
    assert "landlock ABI" in text and "restored after the run" in text


def test_differences_are_stated() -> None:
    text = " ".join(DIFFERENCES)
    for words in ("host processes are visible", "hostname", "/tmp", "unix sockets", "restores"):
        assert words in text


@pytest.mark.parametrize(
    ("abi", "missing"),
    [
        (0, "no Landlock"),
        (3, "TCP bind/connect"),
        (5, "signal and abstract-socket scoping"),
    ],
)
def test_old_kernels_are_refused_with_the_reason(
    abi: int, missing: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from corral.errors import RefusedError
    from corral.tiers import landlock as tier_module

    monkeypatch.setattr(tier_module, "abi_version", lambda: abi)
    health = LandlockTier().health()
    assert not health.available and missing in health.reason, health.reason
    assert health.details["abi"] == abi
    with pytest.raises(RefusedError, match="Landlock"):
        LandlockTier().plan(Policy.load(workspace=str(tmp_path)), ["true"])


def test_new_kernel_is_available(monkeypatch: pytest.MonkeyPatch) -> None:
    from corral.tiers import landlock as tier_module

    monkeypatch.setattr(tier_module, "abi_version", lambda: 7)
    health = LandlockTier().health()
    assert health.available and "ABI 7" in health.reason
    assert "TCP bind/connect" in health.details["protections"]  # type: ignore[operator]


def test_hard_linked_file_keeps_its_content() -> None:
    """read_only: the file may be read, never opened for writing or truncated; its
    siblings and the rest of the workspace stay writable (twin)."""
    rs = L.build(
        7,
        writable=["/home/u/proj"],
        read_deny=[],
        scratch="/s",
        proxy_port=None,
        listdir=listdir,
        is_dir=is_dir,
        read_only=["/home/u/proj/README"],
    )
    rules = rules_of(rs)
    readme = "/home/u/proj/README"
    assert allowed(rules, readme, L.READ_FILE)
    assert not allowed(rules, readme, L.WRITE_FILE)
    assert not allowed(rules, readme, L.TRUNCATE)
    for twin in ("/home/u/proj/src/main.py", "/home/u/proj/.env"):
        assert allowed(rules, twin, L.WRITE_FILE), twin
    # the cost, as documented: a new file beside it gets only the directory's rights
    assert not allowed(rules, "/home/u/proj/new-file", L.WRITE_FILE)
    assert allowed(rules, "/home/u/proj/new-file", L.MAKE_REG)


def test_plan_notes_where_new_files_cannot_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    os.link(outside, ws / "sub" / "linked.txt")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr("corral.tiers.landlock.abi_version", lambda: 7)
    plan = LandlockTier().plan(Policy(str(ws)), ["true"])
    text = "\n".join(plan.notes)
    assert str(ws / "sub" / "linked.txt") in text and "read-only for this run" in text
    assert f"created directly in {ws}, {ws / 'sub'} cannot be opened for writing" in text
    assert isinstance(plan.strategy, Confined)
    rules = dict(plan.strategy.ruleset.paths)
    assert not allowed(rules, str(ws / "sub" / "linked.txt"), L.WRITE_FILE)


def test_a_linked_environment_gets_no_write_right(tmp_path: Path) -> None:
    """Packages hard-linked from a cache outside (uv, pnpm): read and run, never written."""
    from test_linkfarm import venv

    ws = tmp_path / "ws"
    site = venv(ws, tmp_path / "cache")
    (ws / "src").mkdir()
    plan = LandlockTier().plan(Policy.load(workspace=str(ws)), ["true"])
    assert isinstance(plan.strategy, Confined)
    rules = dict(plan.strategy.ruleset.paths)

    def rights(path: Path) -> int:
        text = str(path)
        return functools.reduce(
            operator.or_, (r for p, r in rules.items() if text == p or text.startswith(p + "/")), 0
        )

    linked = site / "pkg0" / "__init__.py"
    assert rights(linked) & L.READ_FILE and not rights(linked) & (L.WRITE_FILE | L.TRUNCATE)
    assert rights(ws / "src" / "new.py") & L.WRITE_FILE  # the twin: the workspace stays writable


USER_NOTIF = 0x7FC00000  # SECCOMP_RET_USER_NOTIF


@pytest.mark.parametrize(
    ("name", "args", "handed_over"),
    [
        ("sched_setaffinity", (4321, 8, 0), True),  # another pid: the supervisor decides
        ("sched_setaffinity", (0, 8, 0), False),  # its own: free
        ("sched_setscheduler", (4321, 5, 0), True),
        ("sched_setattr", (4321, 0, 0), True),
        ("sched_setparam", (0, 0), False),
        ("setpriority", (0, 4321, 19), True),  # PRIO_PROCESS, another pid
        ("setpriority", (0, 0, 19), False),  # nice(1): its own
        ("ioprio_set", (1, 4321, 0x6000), True),  # IOPRIO_WHO_PROCESS, another pid
        ("ioprio_set", (1, 0, 0x6000), False),
    ],
)
def test_another_processes_scheduling_goes_to_the_supervisor(
    name: str, args: tuple[int, ...], handed_over: bool
) -> None:
    """Without a pid namespace, the host's processes of the same uid (found by
    attacking corral: an editor pinned to one CPU and set idle)."""
    arch = native_arch()
    prog = compile_filter(extra_seccomp_rules(), arch)
    nr = syscall_number(name, arch)
    assert nr is not None
    assert (run(prog, nr, AUDIT_ARCH[arch], args) == USER_NOTIF) == handed_over


def test_a_process_groups_scheduling_is_refused() -> None:
    assert _run("setpriority", 1, 4321, 19) == errno.EPERM  # PRIO_PGRP, another group
    assert _run("ioprio_set", 2, 4321, 0) == errno.EPERM  # IOPRIO_WHO_PGRP
    assert _run("setpriority", 1, 0, 19) == -1  # its own group: free


def test_only_the_runs_own_terminal_is_granted(tmp_path: Path) -> None:
    """Not /dev/pts, where every pty of the host's users is: the keys typed into
    the user's other terminals were readable (found by attacking corral)."""
    assert "/dev/pts" not in L.DEVICES and "/dev/ptmx" not in L.DEVICES
    policy = Policy.load(workspace=str(tmp_path))
    tier = LandlockTier()
    facts = tier.gather(policy, agent=True)
    assert facts.terminals == ()  # a Sandbox's commands get pipes
    facts.terminals = ("/dev/pts/7",)
    plan = tier.plan(policy, ["true"], host=facts)
    assert isinstance(plan.strategy, Confined)
    paths = dict(plan.strategy.ruleset.paths)
    assert paths["/dev/pts/7"] == L.READ_FILE | L.WRITE_FILE | L.IOCTL_DEV
    assert not any(p in ("/dev/pts", "/dev/ptmx") for p in paths)
