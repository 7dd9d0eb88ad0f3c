"""Tests for the namespace tier's plan: bwrap argv, mount arguments, fds, no secrets in argv."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from homes import one_home  # noqa: F401  (fixture)

from corral import fsplan
from corral.fsplan import Mount
from corral.policy import Policy
from corral.tiers import namespace
from corral.tiers.base import Plan
from corral.tiers.namespace import (
    FD_EMPTY,
    FD_SECCOMP,
    FD_STATUS,
    Bwrap,
    NamespaceTier,
    mount_args,
    source_spec,
)

pytestmark = pytest.mark.usefixtures("one_home")

SET_VALUE = "set-value-7d1c0e9b"
PASSED_VALUE = "passed-value-52aa41f3"


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = Path(os.path.realpath(tmp_path))
    (root / "home").mkdir()
    (root / "ws").mkdir()
    monkeypatch.setenv("HOME", str(root / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(root / "state"))
    monkeypatch.setattr(fsplan, "host_unix_sockets", lambda *_: [])
    monkeypatch.chdir(root / "ws")
    return root / "ws"


def make_plan(ws: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]) -> Plan:
    monkeypatch.setenv("CORRAL_TEST_PASSED", PASSED_VALUE)
    pol = Policy(str(ws))
    pol.env.set_values = {"CORRAL_TEST_SET": SET_VALUE}
    pol.env.pass_names = ["CORRAL_TEST_PASSED"]
    return NamespaceTier().plan(pol, command)


def test_argv_has_every_hardening_flag(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = make_plan(workspace, monkeypatch, ["true"])
    argv = plan.argv
    assert os.path.basename(argv[0]) == "bwrap"
    sep = argv.index("--")
    options = argv[1:sep]
    for flag in (
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
    ):
        assert flag in options, flag
    # the network namespace is corral's own: the launcher makes it (loopback and a
    # resolver that refuses every name), bwrap must not replace it with another
    assert "--unshare-net" not in options
    assert isinstance(plan.strategy, Bwrap)
    made = plan.strategy.netns
    assert made is not None and made.handoff is None
    assert [str(listener) for listener in made.listeners] == [
        "dns 127.0.0.1:53/udp",
        "dns [::1]:53/udp",
    ]
    assert options[options.index("--cap-drop") + 1] == "ALL"
    assert options[options.index("--json-status-fd") + 1] == str(FD_STATUS) == "3"
    assert options[options.index("--seccomp") + 1] == str(FD_SECCOMP) == "4"
    assert options[options.index("--chdir") + 1] == str(workspace)
    assert argv[sep:] == ["--", "true"]
    assert plan.tier == "namespace"
    assert plan.cgroup is None  # no limits asked for
    assert plan.seccomp


def test_command_follows_separator_verbatim(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    command = ["sh", "-c", "echo --unshare-net", "--", "-x"]
    plan = make_plan(workspace, monkeypatch, command)
    assert plan.argv[plan.argv.index("--") + 1 :] == command


def test_mount_args_for_every_kind() -> None:
    mounts = [
        Mount("ro-bind", "/", "/"),
        Mount("dev", "/dev"),
        Mount("proc", "/proc"),
        Mount("tmpfs", "/tmp"),
        Mount("bind", "/ws", "/ws"),
        Mount("ro-bind", "/ws/.git/hooks"),  # src defaults to dest
        Mount("symlink", "/home/u/link", "target"),
        Mount("mask-dir", "/home/u/.ssh"),
        Mount("mask-file", "/home/u/.netrc"),
        Mount("mask-file", "/ws/.env"),
        Mount("remount-ro", "/home/u"),
        Mount("mqueue", "/dev/mqueue"),
    ]
    args, fds = mount_args(mounts)
    # a bind source below a writable bind is bound from a descriptor, not by name
    assert fds == {
        FD_EMPTY: source_spec("/ws", "/ws/.git/hooks"),
        FD_EMPTY + 1: "empty",
        FD_EMPTY + 2: "empty",
    }
    text = " ".join(args)
    assert text.startswith(
        "--ro-bind / / --dev /dev --proc /proc "
        # bwrap's init (pid 1 inside, the command's uid): its memory out of reach
        "--ro-bind /dev/null /proc/1/mem --ro-bind /dev/null /proc/1/task/1/mem "
        "--tmpfs /tmp --bind /ws /ws "
        f"--ro-bind-fd {FD_EMPTY} /ws/.git/hooks --symlink target /home/u/link "
        "--perms 0000 --size 4096 --tmpfs /home/u/.ssh --remount-ro /home/u/.ssh "
    )
    assert f"--perms 0000 --ro-bind-data {FD_EMPTY + 1} /home/u/.netrc" in text
    assert f"--perms 0000 --ro-bind-data {FD_EMPTY + 2} /ws/.env" in text
    assert text.endswith("--remount-ro /home/u --mqueue /dev/mqueue")
    last = text.index("--remount-ro /home/u ")
    assert text.index("/home/u/.netrc") < text.index("/ws/.env") < last


def test_the_mask_of_a_socket_gone_since_the_plan_is_dropped_at_launch(tmp_path: Path) -> None:
    """A host socket that went between the plan and bwrap's start loses its mask
    (bwrap could not make its mount point in a read-only parent); the twins: a
    socket still there, and any other mask of a path that is gone, keep theirs."""
    import socket

    from corral.tiers.namespace import without_gone_sockets

    here, gone = tmp_path / "here.sock", str(tmp_path / "gone.sock")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(here))
        mounts = [
            Mount("ro-bind", "/", "/"),
            Mount("mask-file", str(here), why=fsplan.SOCKET_MASK),
            Mount("mask-file", gone, why=fsplan.SOCKET_MASK),
            Mount("mask-file", str(tmp_path / "gone.env"), why="secret"),
        ]
        args, _ = mount_args(mounts)
        kept = without_gone_sockets([*args, "--", "true"], mounts)
    text = " ".join(kept)
    assert f"{here} " in text and f"{tmp_path / 'gone.env'} " in text
    assert gone not in text
    assert len(kept) == len(args) + 2 - 5  # exactly its five words, the rest as it was
    assert kept[-2:] == ["--", "true"]


def test_a_bind_source_swapped_for_a_link_is_not_opened(tmp_path: Path) -> None:
    """What the launcher binds below a writable path is the directory the plan named,
    reached with no symlink followed: another run swapping it (or a directory on
    the way) for a link to ../../../etc gets the plan made again, not /etc bound
    in.  Twin: unswapped, the very directory is opened."""
    from corral.errors import SetupRaced
    from corral.tiers.namespace import open_source

    ws = tmp_path / "ws"
    (ws / "sub" / ".vscode").mkdir(parents=True)
    spec = source_spec(str(ws), str(ws / "sub" / ".vscode"))
    fd = open_source(spec)
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(ws / "sub" / ".vscode"))
    finally:
        os.close(fd)
    (ws / "sub" / ".vscode").rename(ws / "sub" / "real")
    (ws / "sub" / ".vscode").symlink_to("../../../etc")
    with pytest.raises(SetupRaced, match="changed during setup"):
        open_source(spec)
    (ws / "sub" / ".vscode").unlink()
    (ws / "sub").rename(ws / "sub2")
    (ws / "sub").symlink_to("sub2")  # a directory on the way
    with pytest.raises(SetupRaced):
        open_source(spec)


def test_masks_standing_in_a_snapshot_are_made_not_mounted() -> None:
    """In a snapshot (a tmpfs remounted read-only last) a mask is an empty mode-000
    entry bwrap creates: no mount; one with anything at or under it, or outside a
    snapshot, is mounted as before."""
    mounts = [
        Mount("ro-bind", "/", "/"),
        Mount("tmpfs", "/home/u"),
        Mount("ro-bind", "/home/u/.bashrc"),
        Mount("symlink", "/home/u/.aws", "elsewhere"),
        Mount("mask-dir", "/home/u/.ssh"),
        Mount("mask-file", "/home/u/.netrc"),
        Mount("mask-file", "/home/u/.aws"),  # a symlink stands there: mounted
        Mount("mask-dir", "/home/u/.config/gh"),  # not directly in the snapshot
        Mount("mask-file", "/etc/shadow"),  # no snapshot at all
        Mount("remount-ro", "/home/u"),
    ]
    args, fds = mount_args(mounts)
    text = " ".join(args)
    assert "--perms 0000 --dir /home/u/.ssh " in text
    assert f"--perms 0000 --file {FD_EMPTY} /home/u/.netrc " in text
    assert f"--perms 0000 --ro-bind-data {FD_EMPTY + 1} /home/u/.aws " in text
    gh = "/home/u/.config/gh"
    assert f"--perms 0000 --size 4096 --tmpfs {gh} --remount-ro {gh}" in text
    assert f"--perms 0000 --ro-bind-data {FD_EMPTY + 2} /etc/shadow " in text
    assert fds == dict.fromkeys([FD_EMPTY, FD_EMPTY + 1, FD_EMPTY + 2], "empty")
    assert text.endswith("--remount-ro /home/u")
    # a tmpfs that is not remounted read-only is no snapshot: its masks are mounted
    args, _ = mount_args([Mount("tmpfs", "/home/u"), Mount("mask-dir", "/home/u/.ssh")])
    assert args[-8:] == [
        *("--perms", "0000", "--size", "4096", "--tmpfs", "/home/u/.ssh"),
        *("--remount-ro", "/home/u/.ssh"),
    ]


def test_the_agent_is_pid_1_and_nothing_else_is(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sandbox's agent runs with no bwrap init above it (a command could write into
    an init it may not kill, to outlive a reset); any other command keeps bwrap's."""
    tier = NamespaceTier()
    agent = make_plan(workspace, monkeypatch, tier.agent_command())
    sep = agent.argv.index("--")
    assert "--as-pid-1" in agent.argv[:sep]
    assert agent.argv[sep + 1 :] == tier.agent_command()
    other = make_plan(workspace, monkeypatch, ["python3", "-I", "-S", "/run/corral/agent.py"])
    assert "--as-pid-1" not in other.argv[: other.argv.index("--")]


def test_own_mounts_add_queues_and_seal_run_corral() -> None:
    mounts = [
        Mount("ro-bind", "/", "/"),
        Mount("dev", "/dev"),
        Mount("tmpfs", "/run"),
        Mount("ro-bind", "/run/corral/agent.py", "/src/agent.py"),
        Mount("ro-bind", "/run/corral/ca-bundle.pem", "/state/bundle.pem"),
        Mount("remount-ro", "/home/u"),
        Mount("tmpfs", "/sys/class/net"),
    ]
    got = [(m.kind, m.dest) for m in namespace.own_mounts(mounts)]
    assert got == [
        ("ro-bind", "/"),
        ("dev", "/dev"),
        ("mqueue", "/dev/mqueue"),  # after /dev, which it lives in
        ("tmpfs", "/run"),
        ("tmpfs", "/run/corral"),  # before the first bind in it, once
        ("ro-bind", "/run/corral/agent.py"),
        ("ro-bind", "/run/corral/ca-bundle.pem"),
        ("remount-ro", "/home/u"),
        ("tmpfs", "/sys/class/net"),
        ("remount-ro", "/run/corral"),  # after every bind
        # a job's files in /dev or over the host's interfaces would outlive its reset
        ("remount-ro", "/dev"),
        ("remount-ro", "/sys/class/net"),
    ]
    # nothing bound in /run/corral (a one-shot run): no tmpfs for it
    plain = [(m.kind, m.dest) for m in namespace.own_mounts(mounts[:3])]
    assert plain == [
        ("ro-bind", "/"),
        ("dev", "/dev"),
        ("mqueue", "/dev/mqueue"),
        ("tmpfs", "/run"),
        ("remount-ro", "/dev"),
    ]


def test_a_reset_empties_the_private_tmpfs_run_and_the_queues(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = NamespaceTier()
    plan = make_plan(workspace, monkeypatch, tier.agent_command())
    dirs = tier.reset_dirs(plan)
    assert dirs is not None
    assert {"/tmp", "/var/tmp", "/dev/shm", "/run", "/dev/mqueue"} <= set(dirs)
    assert "/run/corral" not in dirs and "/dev" not in dirs


def test_unknown_mount_kind_raises() -> None:
    with pytest.raises(ValueError, match="overlay"):
        mount_args([Mount("overlay", "/x")])


def test_one_fd_per_mask_file(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (".env", ".env.local", ".npmrc"):
        (workspace / name).write_text("TOKEN=x\n")
    plan = make_plan(workspace, monkeypatch, ["true"])
    mask_files = [m for m in plan.mounts if m.kind == "mask-file"]
    assert len(mask_files) >= 3
    empty = sorted(fd for fd, what in plan.fds.items() if what == "empty")
    assert empty == list(range(FD_EMPTY, FD_EMPTY + len(mask_files)))
    assert plan.fds[FD_STATUS] == "status"
    assert plan.fds[FD_SECCOMP] == "seccomp"
    argv = plan.argv
    used = [int(argv[i + 1]) for i, a in enumerate(argv) if a == "--ro-bind-data"]
    assert used == empty  # each fd consumed exactly once, in order
    for mount in mask_files:
        at = argv.index(mount.dest)
        assert argv[at - 4 : at - 1] == ["--perms", "0000", "--ro-bind-data"]
        assert plan.fds[int(argv[at - 1])] == "empty"


def test_no_environment_value_in_argv(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = make_plan(workspace, monkeypatch, ["env"])
    assert plan.env["CORRAL_TEST_SET"] == SET_VALUE
    assert plan.env["CORRAL_TEST_PASSED"] == PASSED_VALUE
    joined = " ".join(plan.argv)
    assert SET_VALUE not in joined
    assert PASSED_VALUE not in joined
    assert "CORRAL_TEST_SET" not in joined  # not even as --setenv NAME


def test_describe_names_env_but_not_values(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = make_plan(workspace, monkeypatch, ["true"])
    text = plan.describe()
    env_line = next(line for line in text.splitlines() if line.startswith("env: "))
    assert "CORRAL_TEST_SET" in env_line.split()
    assert "CORRAL_TEST_PASSED" in env_line.split()
    assert SET_VALUE not in text
    assert PASSED_VALUE not in text
    assert "tier: namespace" in text
    assert "mounts:" in text
    assert f"workspace: {workspace}" in text


def test_find_bwrap_prefers_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", str(fake.parent))
    assert namespace.find_bwrap() == str(fake)


def test_find_bwrap_ignores_relative_path_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted = tmp_path / "bwrap"
    planted.write_text("#!/bin/sh\n")
    planted.chmod(stat.S_IRWXU)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", ":/nonexistent-corral-bin")
    found = namespace.find_bwrap()
    assert found is None or os.path.isabs(found)


def test_passed_descriptors_keep_their_numbers(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--pass-fd 3 --pass-fd 5: bwrap's own descriptors move around them, and the plan
    names each passed one so the launcher hands over exactly those."""
    (workspace / ".env").write_text("TOKEN=x\n")
    pol = Policy(str(workspace))
    plan = NamespaceTier().plan(pol, ["true"], pass_fds=(3, 5))
    assert plan.fds[3] == plan.fds[5] == "pass"
    argv = plan.argv
    status, sec = (
        int(argv[argv.index("--json-status-fd") + 1]),
        int(argv[argv.index("--seccomp") + 1]),
    )
    assert (status, sec) == (4, 6)
    assert plan.fds[status] == "status" and plan.fds[sec] == "seccomp"
    empty = [int(argv[i + 1]) for i, a in enumerate(argv) if a == "--ro-bind-data"]
    assert empty and all(n not in (3, 5) and plan.fds[n] == "empty" for n in empty)
    assert len(set(plan.fds)) == len(plan.fds)  # no number used twice
    # twin: without any, the numbers are the usual ones and nothing is passed
    plain = NamespaceTier().plan(pol, ["true"])
    assert "pass" not in plain.fds.values()
    assert plain.fds[FD_STATUS] == "status" and plain.fds[FD_SECCOMP] == "seccomp"


def test_own_fd_numbers_skip_passed_ones() -> None:
    numbers = namespace.own_fd_numbers({3, 4, 40})
    assert [next(numbers) for _ in range(4)] == [5, 6, 7, 8]
    numbers = namespace.own_fd_numbers(())
    assert [next(numbers) for _ in range(3)] == [FD_STATUS, FD_SECCOMP, FD_EMPTY]


def test_bwrap_argv_keeps_kernel_state_read_only(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/proc/sys and friends are bound read-only after the sandbox's own /proc; the
    host's interface directories become empty tmpfs (host facts stubbed)."""
    monkeypatch.setattr(fsplan, "host_net_dirs", lambda *_: ["/sys/class/net", "/sys/x/net"])
    plan = NamespaceTier().plan(Policy(str(workspace)), ["true"])
    text = " ".join(plan.argv)
    assert "--proc /proc" in text
    assert text.index("--proc /proc") < text.index("--ro-bind /proc/sys /proc/sys")
    for path in ("/sys/class/net", "/sys/x/net"):
        assert f"--tmpfs {path}" in text
    assert "--ro-bind /proc/self" not in text  # twin: the processes' own files are not
