"""Tests for corral.cgroups: detect() on fake /proc files and the pure plan_cgroup()."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral import cgroups
from corral.cgroups import CgroupHost, plan_cgroup
from corral.errors import EXIT_REFUSED, RefusedError
from corral.policy import Limits

MEM = 512 << 20


def limits(memory: int | None = None, pids: int | None = None, cpus: float | None = None) -> Limits:
    lim = Limits()
    lim.memory, lim.pids, lim.cpus = memory, pids, cpus
    return lim


def v2_host(
    base: str = "/sys/fs/cgroup/user.slice/me", ctls: str = "cpu memory pids"
) -> CgroupHost:
    host = CgroupHost()
    host.v2_mount = "/sys/fs/cgroup"
    host.v2_base = base
    host.v2_controllers = set(ctls.split())
    return host


def test_no_limits_no_cgroup() -> None:
    assert plan_cgroup(limits(), CgroupHost()) is None
    assert plan_cgroup(limits(), v2_host()) is None
    lim = limits()
    lim.timeout = 5.0  # a timeout is not a cgroup limit
    assert plan_cgroup(lim, CgroupHost()) is None


def test_v2_all_limits() -> None:
    base = "/sys/fs/cgroup/user.slice/me"
    plan = plan_cgroup(limits(MEM, 64, 1.5), v2_host(base))
    assert plan is not None
    assert plan.version == "v2"
    assert plan.settings == [
        ("memory", base, "memory.max", str(MEM)),
        ("memory", base, "memory.swap.max", "0"),
        ("pids", base, "pids.max", "64"),
        ("cpu", base, "cpu.max", "150000 100000"),
    ]
    assert plan.describe() == (
        f"v2 memory.max={MEM} memory.swap.max=0 pids.max=64 cpu.max=150000 100000"
    )


@pytest.mark.parametrize(
    ("cpus", "quota"), [(1.0, "100000"), (2.5, "250000"), (0.5, "50000"), (0.01, "1000")]
)
def test_v2_cpu_quota(cpus: float, quota: str) -> None:
    plan = plan_cgroup(limits(cpus=cpus), v2_host())
    assert plan is not None
    assert plan.settings == [("cpu", "/sys/fs/cgroup/user.slice/me", "cpu.max", f"{quota} 100000")]


def test_v2_cpu_quota_is_rounded() -> None:
    plan = plan_cgroup(limits(cpus=0.29), v2_host())
    assert plan is not None
    assert plan.settings[0][3] == "29000 100000"


def test_v2_only_what_is_asked() -> None:
    plan = plan_cgroup(limits(pids=10), v2_host(ctls="pids"))
    assert plan is not None
    assert [s[2] for s in plan.settings] == ["pids.max"]


def v1_host(tmp_path: Path, names: tuple[str, ...] = ("memory", "pids", "cpu")) -> CgroupHost:
    host = CgroupHost()
    for name in names:
        d = tmp_path / name / "a" / "b"
        d.mkdir(parents=True)
        host.v1[name] = str(d)
    return host


def test_v1_settings(tmp_path: Path) -> None:
    host = v1_host(tmp_path)
    plan = plan_cgroup(limits(MEM, 32, 0.5), host)
    assert plan is not None
    assert plan.version == "v1"
    mem, pids, cpu = host.v1["memory"], host.v1["pids"], host.v1["cpu"]
    assert plan.settings == [
        ("memory", mem, "memory.limit_in_bytes", str(MEM)),
        ("memory", mem, "memory.memsw.limit_in_bytes", str(MEM)),
        ("pids", pids, "pids.max", "32"),
        ("cpu", cpu, "cpu.cfs_period_us", "100000"),
        ("cpu", cpu, "cpu.cfs_quota_us", "50000"),
    ]


def test_v2_lacking_a_controller_falls_back_to_v1(tmp_path: Path) -> None:
    host = v1_host(tmp_path, ("memory",))
    host.v2_base = "/sys/fs/cgroup/me"
    host.v2_controllers = {"pids"}
    plan = plan_cgroup(limits(memory=MEM), host)
    assert plan is not None and plan.version == "v1"


def test_refused_when_nothing_can_enforce(tmp_path: Path) -> None:
    with pytest.raises(RefusedError) as info:
        plan_cgroup(limits(memory=MEM), CgroupHost())
    assert info.value.code == EXIT_REFUSED == 122
    assert "memory limit" in info.value.message
    assert "no cgroup v2 delegation" in info.value.message


def test_refused_names_only_the_missing_limits(tmp_path: Path) -> None:
    host = v1_host(tmp_path, ("memory",))
    host.v1["pids"] = str(tmp_path / "no-such-dir")  # not writable: does not exist
    host.v2_base = "/sys/fs/cgroup/me"
    host.v2_controllers = {"memory"}
    with pytest.raises(RefusedError) as info:
        plan_cgroup(limits(memory=MEM, pids=5), host)
    message = info.value.message
    assert "cannot enforce the pids limit" in message
    assert "lacks pids" in message
    assert "memory limit" not in message


def test_wanted_order() -> None:
    assert cgroups.wanted(limits()) == []
    assert cgroups.wanted(limits(MEM, 1, 1.0)) == ["memory", "pids", "cpu"]


# -- detect() on fake /proc files ---------------------------------------------------


def write_proc(tmp_path: Path, mounts: str, cgroup: str) -> tuple[str, str]:
    m = tmp_path / "mounts"
    c = tmp_path / "cgroup"
    m.write_text(mounts)
    c.write_text(cgroup)
    return str(m), str(c)


def test_detect_hybrid_layout(tmp_path: Path) -> None:
    fs = tmp_path / "sys"
    (fs / "unified" / "a" / "b").mkdir(parents=True)
    (fs / "unified" / "a" / "b" / "cgroup.controllers").write_text("\n")
    (fs / "unified" / "a" / "b" / "cgroup.subtree_control").write_text("\n")
    for name in ("memory", "cpu,cpuacct", "pids"):
        (fs / name / "a" / "b").mkdir(parents=True)
    mounts = (
        f"sysfs /sys sysfs rw 0 0\n"
        f"tmpfs {fs} tmpfs rw,mode=755 0 0\n"
        f"cgroup2 {fs}/unified cgroup2 rw,nsdelegate 0 0\n"
        f"cgroup {fs}/memory cgroup rw,relatime,memory 0 0\n"
        f"cgroup {fs}/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0\n"
        f"cgroup {fs}/pids cgroup rw,relatime,pids 0 0\n"
        f"cgroup {fs}/systemd cgroup rw,relatime,name=systemd 0 0\n"
        "short line\n"
    )
    membership = "12:pids:/a/b\n4:memory:/a/b\n3:cpu,cpuacct:/a/b\n1:name=systemd:/a/b\n0::/a/b\n"
    host = cgroups.detect(*write_proc(tmp_path, mounts, membership))
    assert host.v2_mount == f"{fs}/unified"
    assert host.v2_base == f"{fs}/unified/a/b"
    assert host.v2_controllers == set()  # hybrid: the controllers live in v1
    assert host.v1 == {
        "memory": f"{fs}/memory/a/b",
        "cpu": f"{fs}/cpu,cpuacct/a/b",
        "pids": f"{fs}/pids/a/b",
    }
    plan = plan_cgroup(limits(memory=MEM, cpus=1.0), host)
    assert plan is not None and plan.version == "v1"
    assert plan.settings[0][1] == f"{fs}/memory/a/b"


def test_detect_pure_v2(tmp_path: Path) -> None:
    base = tmp_path / "cg" / "user.slice" / "me"
    base.mkdir(parents=True)
    (base / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (base / "cgroup.subtree_control").write_text("memory pids\n")
    mounts = f"cgroup2 {tmp_path}/cg cgroup2 rw 0 0\ncgroup2 /elsewhere cgroup2 rw 0 0\n"
    host = cgroups.detect(*write_proc(tmp_path, mounts, "0::/user.slice/me\n"))
    assert host.v2_mount == f"{tmp_path}/cg"
    assert host.v2_base == str(base)
    assert host.v2_controllers == {"cpuset", "cpu", "io", "memory", "pids"}
    assert host.v1 == {}
    plan = plan_cgroup(limits(memory=MEM, pids=4, cpus=2.0), host)
    assert plan is not None and plan.version == "v2"


def test_detect_missing_files(tmp_path: Path) -> None:
    host = cgroups.detect(str(tmp_path / "nope"), str(tmp_path / "nope2"))
    assert host.v2_mount is None and host.v2_base is None
    assert host.v1 == {} and host.v2_controllers == set()
