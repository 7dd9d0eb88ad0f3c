"""The container envelope and its OCI seccomp profile: pure functions, checked on their output."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, cast

import pytest

from corral import seccomp
from corral.container import envelope, seccomp_oci
from corral.container.envelope import Spec
from corral.fsplan import Mount

WS = "/home/u/project"


def spec(**kw: object) -> Spec:
    s = Spec("/usr/bin/podman", "localhost/agent:latest", ["python3", "-c", "pass"])
    s.runtime = "/usr/sbin/runc"
    s.name = "corral-abc"
    s.uid, s.gid = 1000, 1000
    s.roots = [WS, "/run/corral"]
    s.workdir = WS
    s.mounts = [
        Mount("ro-bind", "/", "/"),
        Mount("dev", "/dev"),
        Mount("proc", "/proc"),
        Mount("tmpfs", "/tmp"),
        Mount("tmpfs", "/var/tmp"),
        Mount("tmpfs", "/run"),
        Mount("tmpfs", "/dev/shm"),
        Mount("mask-dir", "/home/u/.ssh"),  # outside every root: the image has no such path
        Mount("tmpfs", "/home/u"),  # a shadow of the host home: not in the container at all
        Mount("ro-bind", "/home/u/.bashrc", "/home/u/.bashrc"),
        Mount("bind", WS, WS),
        Mount("ro-bind", f"{WS}/.git/hooks", f"{WS}/.git/hooks"),
        Mount("mask-file", f"{WS}/.env"),
        Mount("mask-dir", f"{WS}/secrets"),
        Mount("remount-ro", "/home/u"),
        Mount("ro-bind", "/run/corral/boot.py", "/src/corral/container/boot.py"),
    ]
    for key, value in kw.items():
        setattr(s, key, value)
    return s


def test_hardening_flags() -> None:
    argv = envelope.run_argv(spec(memory=64 << 20, pids=32, cpus=0.5), mask_file="/s/mask")
    for flag in (
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        "--read-only",
        "--init",
        "--network=none",
        "--hostname=corral",
        "--user=1000:1000",
        "--pull=never",
        f"--memory={64 << 20}",
        f"--memory-swap={64 << 20}",
        "--pids-limit=32",
        "--cpus=0.5",
        "--rm",
    ):
        assert flag in argv, flag
    assert argv[:3] == ["/usr/bin/podman", "--runtime=/usr/sbin/runc", "run"]
    assert argv[argv.index("--") + 1 :] == ["localhost/agent:latest", "python3", "-c", "pass"]
    # no engine socket and no host root inside
    assert not any("docker.sock" in a or "podman.sock" in a for a in argv)
    assert not any(a.startswith("type=bind,src=/,") for a in argv)


def test_no_limits_no_limit_flags_and_no_swap_flag_without_accounting() -> None:
    argv = envelope.run_argv(spec())
    assert not any(a.startswith(("--memory", "--pids-limit", "--cpus")) for a in argv)
    argv = envelope.run_argv(spec(memory=1 << 30, swap_accounting=False))
    assert f"--memory={1 << 30}" in argv and not any(a.startswith("--memory-swap") for a in argv)


def test_mounts_only_inside_roots_and_masks_applied() -> None:
    argv = envelope.run_argv(spec(), mask_file="/s/mask")
    joined = " ".join(argv)
    assert f"type=bind,src={WS},dst={WS}" in argv
    assert f"type=bind,src={WS}/.git/hooks,dst={WS}/.git/hooks,ro" in argv  # write-deny
    assert f"type=bind,src=/s/mask,dst={WS}/.env,ro" in argv  # read-deny file
    assert any(a.startswith(f"{WS}/secrets:ro,") and "mode=000" in a for a in argv)
    assert "type=bind,src=/src/corral/container/boot.py,dst=/run/corral/boot.py,ro" in argv
    # allow twins: private scratch is writable and bounded
    assert "/tmp:rw,notmpcopyup,nosuid,nodev,size=256m,mode=1777" in argv
    assert "/var/tmp:rw,notmpcopyup,nosuid,nodev,size=256m,mode=1777" in argv
    # the host home is not in the container: nothing of it is bound in
    assert "/home/u" not in joined.replace(WS, "")


def test_env_values_never_in_argv() -> None:
    argv = envelope.run_argv(spec())
    assert not any(a in ("-e", "--env", "--env-file") or a.startswith("--env") for a in argv)


def test_gvisor_and_rootless_and_docker_variants() -> None:
    gv = envelope.run_argv(spec(runtime="/usr/bin/runsc", runtime_name="runsc", init=False))
    assert "--runtime-flag=network=none" in gv and "--runtime-flag=oci-seccomp" in gv
    assert "--init" not in gv
    assert not any("host-uds" in a for a in gv)  # host sockets stay closed without a door
    gv_door = envelope.run_argv(spec(runtime_name="runsc", host_uds=True))
    assert "--runtime-flag=host-uds=open" in gv_door
    rootless = envelope.run_argv(spec(rootless=True))
    assert "--userns=keep-id" in rootless
    assert "--userns=keep-id" not in envelope.run_argv(spec())
    docker = envelope.run_argv(spec(engine="/usr/bin/docker", engine_name="docker", runtime="runc"))
    assert docker[:2] == ["/usr/bin/docker", "run"] and "--runtime=runc" in docker
    assert "--read-only-tmpfs=false" not in docker  # a podman-only option
    quirks = envelope.run_argv(spec(cgroup_manager="cgroupfs", ulimits={"nofile": (1024, 2048)}))
    assert quirks[1] == "--cgroup-manager=cgroupfs" and "--ulimit=nofile=1024:2048" in quirks
    assert envelope.remove_argv(spec())[-5:] == [
        "rm",
        "--force",
        "--ignore",
        "--time=0",
        "corral-abc",
    ]


def test_image_lookup_uses_the_runs_engine_options() -> None:
    argv = envelope.image_argv(spec(cgroup_manager="cgroupfs"))
    assert argv[:2] == ["/usr/bin/podman", "--cgroup-manager=cgroupfs"]
    assert argv[-4:] == ["inspect", "--format", "{{.Id}}", "localhost/agent:latest"]


def test_paths_with_commas_are_refused() -> None:
    with pytest.raises(ValueError, match="comma"):
        envelope.run_argv(spec(mounts=[Mount("bind", "/a,b", "/a,b")], roots=["/a,b"]))


def _matches(rule: dict[str, object], value: int) -> bool:
    """Would this OCI rule's (OR-ed by runc) argument tests catch ``value`` in arg 0?"""
    for arg in rule.get("args", []):  # type: ignore[attr-defined]
        op, a, b = arg["op"], arg["value"], arg["valueTwo"]
        if op == "SCMP_CMP_MASKED_EQ" and value & a == b:
            return True
        if op == "SCMP_CMP_GT" and value > a:
            return True
    return False


def _denied(profile: dict[str, object], name: str, value: int) -> bool:
    rules = [r for r in profile["syscalls"] if r["names"] == [name]]  # type: ignore[attr-defined]
    return any("args" not in r or _matches(r, value) for r in rules)


def test_seccomp_profile_from_corral_rules() -> None:
    prof = seccomp_oci.profile(seccomp.default_deny_rules())
    assert prof["defaultAction"] == "SCMP_ACT_ALLOW"
    for name in ("ptrace", "bpf", "io_uring_setup", "keyctl", "mount", "setns", "userfaultfd"):
        assert _denied(prof, name, 0), name
    # socket: exactly unix, inet, inet6 on the low word; high bits never dodge it
    for family in range(64):
        assert _denied(prof, "socket", family) == (family not in (1, 2, 10)), family
    assert _denied(prof, "socket", (1 << 32) | 16)
    # clone: only CLONE_NEWUSER is refused (threads and fork stay allowed)
    assert _denied(prof, "clone", 0x10000000) and not _denied(prof, "clone", 0x3D0F00)
    # ioctl TIOCSTI refused, high bits included; TCGETS allowed
    assert _denied(prof, "ioctl", 0x5412) and _denied(prof, "ioctl", (1 << 40) | 0x5412)
    assert not _denied(prof, "ioctl", 0x5401)
    # clock_adjtime on CLOCK_REALTIME allowed, others refused
    assert not _denied(prof, "clock_adjtime", 0) and _denied(prof, "clock_adjtime", 3)
    # personality: the safe values stay allowed, ADDR_NO_RANDOMIZE is refused
    for ok in (0x0, 0x8, 0x20000, 0x20008):
        assert not _denied(prof, "personality", ok), ok
    assert _denied(prof, "personality", 0x0040000)
    syscalls = cast("list[dict[str, Any]]", prof["syscalls"])  # the profile's JSON
    errnos = {r["names"][0]: r["errnoRet"] for r in syscalls}
    assert errnos["socket"] == 97 and errnos["clone3"] == 38  # EAFNOSUPPORT, ENOSYS


def test_gvisor_namespace_rules() -> None:
    from corral.tiers.container import gvisor_namespace_rules

    prof = seccomp_oci.profile(gvisor_namespace_rules())
    assert _denied(prof, "unshare", 0x20000) and _denied(prof, "clone", 0x40000000)
    assert not _denied(prof, "clone", 0x3D0F00)  # a thread's flags


def test_preserve_fds_only_when_asked() -> None:
    """--pass-fd: podman hands descriptors 3..2+N to the container; without it, none."""
    argv = envelope.run_argv(spec(preserve_fds=39))
    assert "--preserve-fds=39" in argv
    assert argv.index("--preserve-fds=39") < argv.index("--")
    assert not any(a.startswith("--preserve-fds") for a in envelope.run_argv(spec()))


def _check_line(path: Path, dev_ino: bool = True) -> str:
    st = os.lstat(path)
    ids = (
        (st.st_dev, st.st_ino, "-", "-") if dev_ino else ("-", "-", st.st_mtime_ns, st.st_ctime_ns)
    )
    return " ".join(str(v) for v in (stat.S_IFMT(st.st_mode), *ids, path)) + "\n"


def test_boot_runs_nothing_over_a_bind_that_is_not_what_corral_found(tmp_path: Path) -> None:
    """boot's check inside: each listed target must be a mount point holding the
    file corral found (by device and inode, or by its times), else nothing runs."""
    from corral.container import boot

    found, other = tmp_path / "found", tmp_path / "other"
    found.mkdir()
    other.mkdir()
    os.utime(other, ns=(1, 1))  # (made in the same clock tick: its times would match)
    checks = tmp_path / "checks"
    for dev_ino in (True, False):
        checks.write_text(_check_line(found, dev_ino))
        assert boot.changed_mounts(str(checks), {str(found)}) == []  # twin: as found
        assert boot.changed_mounts(str(checks), set()) == [str(found)]  # mounted elsewhere
        checks.write_text(_check_line(other, dev_ino).replace(str(other), str(found)))
        assert boot.changed_mounts(str(checks), {str(found)}) == [str(found)]  # another file
    link = tmp_path / "link"
    link.symlink_to(found)
    checks.write_text(_check_line(found).replace(str(found), str(link)))
    assert boot.changed_mounts(str(checks), {str(link)}) == [str(link)]  # a link now
    checks.write_text("")
    assert boot.changed_mounts(str(checks), set()) == [str(checks)]  # unreadable: refused
    assert boot._unescape("/a\\040b\\134c") == "/a b\\c"


def test_one_mount_per_destination_the_last() -> None:
    """A link a run left (pkg/.vscode -> ../sec) made the pin of sec/ and its
    write-deny land on one place: podman refused every later run ("duplicate mount
    destination").  The last one stays, as bwrap's stack; others are untouched."""
    mounts = [
        Mount("bind", "/ws", "/ws", "workspace"),
        Mount("bind", "/ws/sec", "/ws/sec", "pinned"),
        Mount("ro-bind", "/ws/sec", "/ws/sec", "write-deny"),
        Mount("mask-file", "/ws/sec/.env", "", "secret"),
    ]
    args = envelope.mount_args(mounts, ["/ws"], "/m")
    assert [a for a in args if "dst=/ws/sec," in a or a.endswith("dst=/ws/sec")] == [
        "type=bind,src=/ws/sec,dst=/ws/sec,ro"
    ]
    assert "type=bind,src=/ws,dst=/ws" in args and "type=bind,src=/m,dst=/ws/sec/.env,ro" in args
