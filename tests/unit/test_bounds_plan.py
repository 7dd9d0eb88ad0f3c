"""The default bounds: values from host facts, "none" to lift, plans and argv that carry
them, and a default the host cannot enforce noted rather than refused.  Pure parts only;
tests/integration/test_bounds.py runs them on every tier."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from homes import one_home  # noqa: F401  (fixture)

from corral import bounds, cgroups, fsplan
from corral import policy as pol
from corral.bounds import GiB, HostFacts, MiB, defaults_for
from corral.cgroups import CgroupHost, CgroupPlan, CgroupRun
from corral.container import envelope
from corral.container.engine import Engine, limits_problem
from corral.errors import PolicyError, RefusedError
from corral.policy import Limits, Policy
from corral.tiers.landlock import LandlockTier
from corral.tiers.namespace import NamespaceTier, mount_args
from corral.tiers.none import NoneTier

pytestmark = pytest.mark.usefixtures("one_home")

# -- the values -----------------------------------------------------------------------


def test_the_defaults_chosen() -> None:
    """Half the RAM, 4096 tasks, a quarter of RAM per /tmp (512M-4G), RAM/16 of shm (64M-1G)."""
    assert defaults_for(HostFacts(16 * GiB)) == {
        "memory": 8 * GiB,
        "pids": 4096,
        "tmp": 4 * GiB,
        "shm": GiB,
    }
    assert defaults_for(HostFacts(8 * GiB)) == {
        "memory": 4 * GiB,
        "pids": 4096,
        "tmp": 2 * GiB,
        "shm": 512 * MiB,
    }


@pytest.mark.parametrize(
    ("ram", "memory", "tmp", "shm"),
    [
        (512 * MiB, 256 * MiB, 512 * MiB, 64 * MiB),  # floors
        (2 * GiB, GiB, 512 * MiB, 128 * MiB),
        (256 * GiB, 128 * GiB, 4 * GiB, GiB),  # ceilings
        (24105 * MiB + 12345, 12052 * MiB, 4 * GiB, GiB),  # whole MiB, rounded down
        (0, 2 * GiB, GiB, 256 * MiB),  # the host would not say: a small machine
    ],
)
def test_defaults_scale_with_ram(ram: int, memory: int, tmp: int, shm: int) -> None:
    d = defaults_for(HostFacts(ram))
    assert (d["memory"], d["tmp"], d["shm"], d["pids"]) == (memory, tmp, shm, 4096)
    assert all(v % MiB == 0 for k, v in d.items() if k != "pids")


def test_host_facts_read_the_ram() -> None:
    assert bounds.host_facts().memory == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_gvisor_minimum_is_below_the_default() -> None:
    from corral.tiers.container import GVISOR_MIN_PIDS

    assert bounds.DEFAULT_PIDS >= GVISOR_MIN_PIDS


@pytest.mark.parametrize(
    ("size", "text"),
    [(4 * GiB, "4G"), (12052 * MiB, "12052M"), (1536 << 10, "1536K"), (1000, "1000B")],
)
def test_size_text_reads_back(size: int, text: str) -> None:
    assert bounds.size_text(size) == text
    assert pol.parse_size(text) == size


# -- set, lifted, default ---------------------------------------------------------------


def limits_with_defaults() -> Limits:
    lim = Limits()
    lim.defaults = defaults_for(HostFacts(16 * GiB))
    return lim


def test_get_and_source_order() -> None:
    lim = limits_with_defaults()
    assert (lim.get("memory"), lim.source("memory")) == (8 * GiB, "default")
    assert (lim.get("timeout"), lim.source("timeout")) == (None, "")
    lim.assign("memory", "1G", pol.parse_memory)
    assert (lim.get("memory"), lim.source("memory")) == (GiB, "set")
    lim.assign("memory", "none", pol.parse_memory)
    assert (lim.get("memory"), lim.source("memory")) == (None, "none")
    lim.assign("memory", "512M", pol.parse_memory)  # a later value wins over none
    assert (lim.get("memory"), lim.source("memory")) == (512 * MiB, "set")
    assert Limits().get("pids") is None  # no defaults filled: nothing (a hand-built Policy)


def write_policy(tmp_path: Path, text: str) -> Policy:
    (tmp_path / "corral.toml").write_text(text)
    return pol.load(str(tmp_path))


def test_policy_keys_and_none(tmp_path: Path) -> None:
    p = write_policy(
        tmp_path,
        '[limits]\nmemory = "none"\npids = "NONE"\ntmp = "2G"\nshm = "none"\ncpus = "none"\n',
    )
    lim = p.limits
    assert lim.defaults == defaults_for(bounds.host_facts())  # load fills them
    assert lim.get("memory") is None and lim.get("pids") is None and lim.get("shm") is None
    assert lim.get("tmp") == 2 * GiB and lim.source("tmp") == "set"
    assert lim.lifted == {"memory", "pids", "shm", "cpus"}
    limits = p.to_dict()["limits"]
    assert isinstance(limits, dict)
    assert limits["tmp"] == 2 * GiB and limits["none"] == ["cpus", "memory", "pids", "shm"]


def test_digest_of_a_policy_without_the_new_keys_is_unchanged(tmp_path: Path) -> None:
    p = write_policy(tmp_path, '[limits]\nmemory = "1G"\n')
    assert p.to_dict()["limits"] == {
        "timeout": None,
        "memory": GiB,
        "pids": None,
        "cpus": None,
        "output": 64 * MiB,
    }


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('[limits]\ntmp = "0"\n', "limits.tmp: size '0' is too small: at least 1M, or none"),
        ('[limits]\nshm = "100k"\n', "limits.shm: size '100k' is too small"),
        ('[limits]\nshm = "lots"\n', "limits.shm: bad size"),
        ('[limits]\nmemory = "1M"\n', "limits.memory: memory '1M' is too small: at least 16M"),
        ("[limits]\nmemory = 0\n", "limits.memory: memory 0 is too small"),
        ('[limits]\npids = "nope"\n', "limits.pids: bad pids"),
        ("[limits]\n\ntmp = true\n", ":3: limits.tmp: expected a size"),
    ],
)
def test_bad_values_name_line_and_key(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(PolicyError) as info:
        write_policy(tmp_path, text)
    assert fragment in info.value.message


def test_flags_set_and_lift(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from corral import cli
    from corral.errors import CorralError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "corral.toml").write_text('[limits]\nmemory = "1G"\ntmp = "1G"\n')
    p = cli.build_policy({"memory": "none", "shm": "256M", "pids": "64", "timeout": "none"})
    assert p.limits.get("memory") is None and p.limits.source("memory") == "none"
    assert p.limits.get("tmp") == GiB and p.limits.get("shm") == 256 * MiB
    assert p.limits.get("pids") == 64 and p.limits.get("timeout") is None
    with pytest.raises(CorralError) as info:
        cli.build_policy({"tmp": "0"})
    assert info.value.message.startswith("--tmp: size '0' is too small")
    with pytest.raises(CorralError) as info:
        cli.build_policy({"output": "none"})  # corral's own buffer bound: a size only
    assert info.value.message.startswith("--output-limit: bad size")


# -- cgroups: a default the host cannot enforce is dropped, a set one refused --------------


def test_defaults_not_enforceable_are_dropped_not_refused() -> None:
    lim = limits_with_defaults()
    plan, dropped, why = cgroups.settle(lim, CgroupHost())  # no v2, no writable v1
    assert plan is None and dropped == ["memory", "pids"]
    assert "no cgroup v2 delegation" in why and "not writable by this user" in why


def test_a_set_limit_still_refused_where_defaults_are_dropped() -> None:
    lim = limits_with_defaults()
    lim.assign("pids", 64, pol.parse_pids)
    with pytest.raises(RefusedError) as info:
        cgroups.settle(lim, CgroupHost())
    assert "cannot enforce the pids limit" in info.value.message
    assert "memory" not in info.value.message.split(":")[0]


def v1_host(tmp_path: Path, names: tuple[str, ...]) -> CgroupHost:
    host = CgroupHost()
    for name in names:
        d = tmp_path / name
        d.mkdir()
        host.v1[name] = str(d)
    return host


def test_defaults_partly_enforceable(tmp_path: Path) -> None:
    host = v1_host(tmp_path, ("pids",))  # memory's hierarchy is not ours
    lim = limits_with_defaults()
    plan, dropped, _ = cgroups.settle(lim, host)
    assert plan is not None and plan.version == "v1"
    assert dropped == ["memory"]
    assert [s[2] for s in plan.settings] == ["pids.max"] and plan.settings[0][3] == "4096"
    assert plan.optional == {"memory", "pids"}  # both defaults (cpus has none)


def test_enforceable_defaults_in_v1(tmp_path: Path) -> None:
    host = v1_host(tmp_path, ("memory", "pids", "cpu"))
    plan, dropped, _ = cgroups.settle(limits_with_defaults(), host)
    assert plan is not None and dropped == []
    assert ("memory", str(tmp_path / "memory"), "memory.limit_in_bytes", str(8 * GiB)) in (
        plan.settings
    )
    lifted = limits_with_defaults()
    lifted.lift("memory")
    lifted.lift("pids")
    assert cgroups.settle(lifted, host) == (None, [], "")


def test_v2_domain_controller_below_a_populated_cgroup_is_not_usable(tmp_path: Path) -> None:
    base = tmp_path / "user.slice" / "app.scope"
    base.mkdir(parents=True)
    (base / "cgroup.type").write_text("domain\n")  # not the root
    (base / "cgroup.controllers").write_text("cpu io memory pids\n")
    (base / "cgroup.subtree_control").write_text("\n")
    assert cgroups._v2_usable(str(base)) == {"cpu", "pids"}  # threaded ones only
    (base / "cgroup.subtree_control").write_text("memory\n")
    assert cgroups._v2_usable(str(base)) == {"cpu", "pids", "memory"}  # enabled already


def test_setup_failure_of_defaults_only_is_skipped(tmp_path: Path) -> None:
    plan = CgroupPlan("v1")
    missing = str(tmp_path / "gone")  # mkdir under it fails
    plan.settings = [("memory", missing, "memory.limit_in_bytes", "1")]
    plan.optional = {"memory"}
    run = CgroupRun(plan, "t1")
    run.create()  # no raise
    assert plan.skipped.startswith("cannot set up a cgroup here")
    assert run.dirs == [] and run.procs_files() == []
    plan.optional = set()
    plan.skipped = ""
    with pytest.raises(RefusedError):
        CgroupRun(plan, "t2").create()


def test_join_files_are_v1_tasks(tmp_path: Path) -> None:
    plan = CgroupPlan("v1")
    plan.settings = [("pids", str(tmp_path), "pids.max", "5")]
    run = CgroupRun(plan, "t3")
    run.dirs = [str(tmp_path / "corral-t3")]
    assert run.procs_files() == [str(tmp_path / "corral-t3" / "tasks")]
    plan.version = "v2"
    assert run.procs_files() == [str(tmp_path / "corral-t3" / "cgroup.procs")]


def test_spawn_inside_joins_and_comes_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # other tests of this process may have left threads behind (a Sandbox's reader)
    monkeypatch.setattr(cgroups, "_other_threads", lambda: 0)
    home = tmp_path / "tasks"
    run_dir = tmp_path / "corral-x"
    run_dir.mkdir()
    home.write_text("")
    (run_dir / "tasks").write_text("")
    seen: list[str] = []

    def start() -> int:
        seen.append((run_dir / "tasks").read_text())
        return 4242

    assert cgroups.spawn_inside([str(run_dir / "tasks")], start) == 4242
    assert seen == ["0"] and home.read_text() == "0"  # joined, then back home

    def fails() -> int:
        raise OSError(11, "pids")

    assert cgroups.spawn_inside([str(run_dir / "tasks")], fails) is None  # caller forks
    monkeypatch.setattr(cgroups, "_other_threads", lambda: 1)
    assert cgroups.spawn_inside([str(run_dir / "tasks")], start) is None  # threads: fork
    assert seen == ["0"]  # start was not called


# -- plans -------------------------------------------------------------------------------


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = Path(os.path.realpath(tmp_path))
    for d in ("home", "ws"):
        (root / d).mkdir()
    monkeypatch.setenv("HOME", str(root / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(root / "state"))
    monkeypatch.setattr(fsplan, "host_unix_sockets", lambda *_: [])
    monkeypatch.chdir(root / "ws")
    return root / "ws"


def policy_for(ws: Path, host: CgroupHost, monkeypatch: pytest.MonkeyPatch) -> Policy:
    monkeypatch.setattr(cgroups, "detect", lambda: host)
    p = Policy(str(ws))
    p.limits.defaults = defaults_for(HostFacts(16 * GiB))
    return p


def sizes_in(argv: list[str]) -> dict[str, int]:
    out = {}
    for i, arg in enumerate(argv):
        if arg == "--size":
            assert argv[i + 2] == "--tmpfs"
            out[argv[i + 3]] = int(argv[i + 1])
    return out


def test_namespace_argv_sizes_every_private_tmpfs(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = policy_for(workspace, CgroupHost(), monkeypatch)
    plan = NamespaceTier().plan(p, ["true"])
    expected = {"/tmp": 4 * GiB, "/var/tmp": 4 * GiB, "/run": 64 * MiB, "/dev/shm": GiB}
    assert sizes_in(plan.argv) == {k: v for k, v in expected.items() if os.path.isdir(k)}
    p.limits.assign("tmp", "16M", pol.parse_scratch)
    p.limits.assign("shm", "none", pol.parse_scratch)
    sized = sizes_in(NamespaceTier().plan(p, ["true"]).argv)
    assert sized.get("/tmp") == 16 * MiB and "/dev/shm" not in sized  # lifted: no --size


def test_mount_args_size_only_what_is_named() -> None:
    mounts = [fsplan.Mount("tmpfs", "/tmp"), fsplan.Mount("tmpfs", "/home/u")]
    args, _ = mount_args(mounts, sizes={"/tmp": 1 << 20})
    assert args == ["--size", str(1 << 20), "--tmpfs", "/tmp", "--tmpfs", "/home/u"]
    assert mount_args(mounts)[0] == ["--tmpfs", "/tmp", "--tmpfs", "/home/u"]


def test_namespace_defaults_not_enforceable_give_one_note(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = NamespaceTier().plan(policy_for(workspace, CgroupHost(), monkeypatch), ["true"])
    assert plan.cgroup is None
    assert bounds.unenforced(plan) == ["memory", "pids"]
    notes = [n for n in plan.notes if n.startswith("the default ")]
    assert notes == [
        "the default memory (8G) and pids (4096) limits are not enforced for this user here: "
        + plan.bounds["memory"].how
        + " (root or a delegated cgroup v2 subtree enforces them;"
        + " --memory none --pids none goes without, and without this line)"
    ]
    record = bounds.record(plan)
    assert record["memory"] == {"value": 8 * GiB, "source": "default", "enforced": False}
    assert record["tmp"] == {"value": 4 * GiB, "source": "default", "enforced": True}
    assert "timeout" not in record and "cpus" not in record  # no bound, none asked
    text = plan.describe()
    assert "memory   8G       (default)  NOT enforced: no cgroup v2 delegation" in text
    assert "tmp      4G       (default)  enforced: tmpfs size of /tmp and /var/tmp" in text


def test_namespace_enforced_defaults_no_note(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    host = v1_host(tmp_path, ("memory", "pids"))
    plan = NamespaceTier().plan(policy_for(workspace, host, monkeypatch), ["true"])
    assert plan.cgroup is not None and plan.cgroup.version == "v1"
    assert bounds.unenforced(plan) == [] and not any("default" in n for n in plan.notes)
    assert "memory   8G       (default)  enforced: cgroup v1" in plan.describe()


def test_lifting_silences_the_note(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = policy_for(workspace, CgroupHost(), monkeypatch)
    p.limits.lift("memory")
    p.limits.lift("pids")
    plan = NamespaceTier().plan(p, ["true"])
    assert plan.notes == [] or not any(n.startswith("the default ") for n in plan.notes)
    assert bounds.record(plan)["memory"] == {"value": None, "source": "none", "enforced": None}


def test_landlock_refuses_a_set_tmp_and_says_what_bounds_its_scratch(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.tiers import landlock

    monkeypatch.setattr(landlock, "abi_version", lambda: 7)
    p = policy_for(workspace, CgroupHost(), monkeypatch)
    plan = LandlockTier().plan(p, ["true"])
    assert plan.bounds["tmp"].enforced is None and "free space" in plan.bounds["tmp"].how
    assert plan.bounds["shm"].enforced is None and "off limits" in plan.bounds["shm"].how
    assert "run" not in plan.bounds
    p.limits.assign("shm", "8M", pol.parse_scratch)  # nothing can be written there: fine
    LandlockTier().plan(p, ["true"])
    p.limits.assign("tmp", "1G", pol.parse_scratch)
    with pytest.raises(RefusedError) as info:
        LandlockTier().plan(p, ["true"])
    assert "cannot enforce the tmp limit on the landlock tier" in info.value.message


def test_none_tier_refuses_set_scratch_sizes(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = policy_for(workspace, CgroupHost(), monkeypatch)
    assert NoneTier().plan(p, ["true"]).bounds["shm"].enforced is None
    p.limits.assign("shm", "8M", pol.parse_scratch)
    with pytest.raises(RefusedError):
        NoneTier().plan(p, ["true"])


def test_setup_skip_turns_into_the_note(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = NamespaceTier().plan(policy_for(workspace, CgroupHost(), monkeypatch), ["true"])
    assert bounds.skipped_at_setup(plan) == ""  # no cgroup: nothing skipped
    plan.cgroup = CgroupPlan("v2")
    plan.cgroup.skipped = "cannot set up a cgroup here: Device or resource busy"
    plan.bounds["memory"].enforced = True
    plan.bounds["pids"].enforced = True
    assert "Device or resource busy" in bounds.skipped_at_setup(plan)
    assert bounds.unenforced(plan) == ["memory", "pids"]


# -- the container envelope and engine ---------------------------------------------------------


def spec(**kw: object) -> envelope.Spec:
    s = envelope.Spec("/usr/bin/podman", "img", ["true"])
    s.mounts = [
        fsplan.Mount("tmpfs", "/tmp"),
        fsplan.Mount("tmpfs", "/var/tmp"),
        fsplan.Mount("tmpfs", "/run"),
        fsplan.Mount("tmpfs", "/dev/shm"),
    ]
    for key, value in kw.items():
        setattr(s, key, value)
    return s


def test_envelope_sizes_from_the_limits() -> None:
    argv = envelope.run_argv(spec(tmp=4 * GiB, shm=GiB, run_size=64 * MiB))
    assert "/tmp:rw,notmpcopyup,nosuid,nodev,size=4g,mode=1777" in argv
    assert "/var/tmp:rw,notmpcopyup,nosuid,nodev,size=4g,mode=1777" in argv
    assert "/run:rw,notmpcopyup,nosuid,nodev,size=64m,mode=755" in argv
    assert f"--shm-size={GiB}" in argv
    small = envelope.run_argv(spec(tmp=1536 << 10))
    assert "/tmp:rw,notmpcopyup,nosuid,nodev,size=1536k,mode=1777" in small


def test_envelope_lifted_sizes() -> None:
    argv = envelope.run_argv(spec(tmp=None, shm=None))
    assert "/tmp:rw,notmpcopyup,nosuid,nodev,mode=1777" in argv
    assert "--shm-size=0" in argv  # podman: no bound
    docker = envelope.run_argv(spec(shm=None, engine_name="docker"))
    assert f"--shm-size={1 << 40}" in docker  # docker reads 0 as 64 MiB


def engine(rootless: bool, layout: str, manager: str = "") -> Engine:
    eng = Engine("podman", "/usr/bin/podman")
    eng.rootless, eng.cgroups, eng.cgroup_manager = rootless, layout, manager
    return eng


def test_engine_limits_problem(tmp_path: Path) -> None:
    assert limits_problem(engine(False, "hybrid"), ["memory", "pids"]) == ""  # root
    assert limits_problem(engine(True, "v2"), []) == ""  # nothing asked
    assert "hybrid cgroup host" in limits_problem(engine(True, "hybrid"), ["memory"])
    assert "only through systemd" in limits_problem(engine(True, "v2", "cgroupfs"), ["pids"])
    uid = os.getuid()
    service = tmp_path / "user.slice" / f"user-{uid}.slice" / f"user@{uid}.service"
    assert "no cgroup delegated" in limits_problem(engine(True, "v2"), ["pids"], str(tmp_path))
    service.mkdir(parents=True)
    (service / "cgroup.controllers").write_text("cpu pids\n")
    eng = engine(True, "v2")
    assert limits_problem(eng, ["pids"], str(tmp_path)) == ""
    assert "does not delegate memory" in limits_problem(eng, ["memory", "pids"], str(tmp_path))


def test_engine_bounds_note_or_refuse(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from corral.tiers.base import Plan

    p = policy_for(workspace, CgroupHost(), monkeypatch)
    plan = Plan("container", p)
    bounds.apply_engine(plan, p.limits, "podman", "rootless podman cannot set resource limits")
    assert bounds.unenforced(plan) == ["memory", "pids"] and len(plan.notes) == 1
    p.limits.assign("memory", "1G", pol.parse_memory)
    with pytest.raises(RefusedError) as info:
        bounds.apply_engine(Plan("container", p), p.limits, "podman", "rootless podman ...")
    assert "cannot enforce the memory limit here: rootless podman" in info.value.message
    ok = Plan("container", p)
    bounds.apply_engine(ok, p.limits, "podman", "")
    assert ok.bounds["memory"].enforced is True and ok.bounds["memory"].source == "set"


def test_doctor_report_shape() -> None:
    report = bounds.host_report("podman", "")
    assert report["pids"]["value"] == 4096 and report["run"]["value"] == 64 * MiB
    assert report["memory"]["container, gvisor"] == "enforced (podman)"
    assert "free space" in str(report["tmp"]["landlock"])
    lines = bounds.report_lines(report)
    assert lines[0].startswith("defaults (this host: ")
    assert any(line.split()[:2] == ["pids", "4096"] for line in lines)
    assert "container, gvisor" not in bounds.host_report()["memory"]  # no engine here
