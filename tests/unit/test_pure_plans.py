"""Every tier's plan() built from a fabricated HostFacts: nothing monkeypatched.

The workspace, the home, the bwrap, the engine below exist nowhere on this
machine: a plan that read the host instead of its facts would show it (a
missing workspace is a PolicyError in fsplan, a missing bwrap is "bwrap").
Each tier's strategy is checked for the data it owns; launching is
tests/integration's job.
"""

from __future__ import annotations

from typing import Any

import pytest

from corral import landlock as L
from corral.container.bundle import Bundle
from corral.container.engine import Engine
from corral.errors import RefusedError
from corral.fsplan import FsPlan, Mount
from corral.home import HomeLayer
from corral.netns import resolv_conf
from corral.policy import Policy
from corral.tiers import get
from corral.tiers.base import LaunchStrategy
from corral.tiers.container import ContainerFacts, ContainerTier, EngineLaunch, GVisorTier
from corral.tiers.host import HostFacts
from corral.tiers.landlock import Confined, LandlockFacts, LandlockTier
from corral.tiers.namespace import Bwrap, NamespaceFacts, NamespaceTier
from corral.tiers.none import WARNING, Direct, NoneTier

WS = "/nowhere/ws"
HOME = "/nowhere/home"
ENVIRON = {"PATH": "/opt/tools/bin:/usr/bin", "HOME": HOME, "TMPDIR": "/nowhere/tmp"}
TOKEN = "feedc0ffee00"


def policy() -> Policy:
    pol = Policy(WS)
    pol.env.set_values = {"CORRAL_TEST_SET": "1"}
    return pol


def fs_plan(mounts: bool = True) -> FsPlan:
    fs = FsPlan()
    fs.writable = [WS]
    fs.read_deny = [f"{HOME}/.ssh", "/etc/shadow"]
    fs.quarantine = [f"{WS}/.git/hooks/pre-commit"]
    fs.notes = ["a note from the filesystem decision"]
    if mounts:
        fs.mounts = [
            Mount("ro-bind", "/", "/", "host filesystem, read-only"),
            Mount("mask-dir", f"{HOME}/.ssh", why="read-deny"),
            Mount("mask-file", "/etc/shadow", why="read-deny"),
            Mount("bind", WS, WS, "workspace"),
        ]
    return fs


def common(**more: Any) -> dict[str, Any]:
    return {
        "environ": ENVIRON,
        "cwd": f"{WS}/src",
        "uid": 4242,
        "gid": 4343,
        "token": TOKEN,
        **more,
    }


def test_every_runnable_tier_gathers_and_names_a_strategy() -> None:
    for name in ("none", "namespace", "landlock", "container", "gvisor"):
        tier = get(name)
        assert issubclass(tier.strategy, LaunchStrategy), name
    assert not NoneTier.strategy.confines and NamespaceTier.strategy.confines
    assert ContainerTier.strategy.lazy and not LandlockTier.strategy.lazy
    assert not ContainerTier.strategy.shell and not NamespaceTier.strategy.shell  # both run it
    assert ContainerTier.strategy.own_terminal and not NamespaceTier.strategy.own_terminal


def test_none_plan_from_facts() -> None:
    plan = NoneTier().plan(policy(), ["make", "test"], host=HostFacts(**common()))
    assert plan.argv == ["make", "test"]
    assert plan.env["PATH"] == "/opt/tools/bin:/usr/bin"  # the facts', not this process's
    assert plan.env["CORRAL_TEST_SET"] == "1"
    assert plan.cwd == f"{WS}/src"  # the caller's directory, inside the workspace
    assert isinstance(plan.strategy, Direct) and plan.strategy.warning == WARNING
    assert plan.strategy.cannot_run_where() == ""


def test_none_plan_outside_the_workspace_starts_in_it() -> None:
    facts = HostFacts(**common(cwd="/elsewhere"))
    assert NoneTier().plan(policy(), ["true"], host=facts).cwd == WS


def test_namespace_plan_from_facts() -> None:
    facts = NamespaceFacts(
        bwrap="/opt/bwrap/bin/bwrap",
        resolv_conf=("/run/resolvconf/resolv.conf", True),
        fs=fs_plan(),
        **common(),
    )
    plan = NamespaceTier().plan(policy(), ["true"], host=facts)
    argv = plan.argv
    assert argv[0] == "/opt/bwrap/bin/bwrap"
    assert argv[argv.index("--chdir") + 1] == f"{WS}/src"
    assert argv[-2:] == ["--", "true"]
    at = argv.index("/run/resolvconf/resolv.conf")  # the host's real resolv.conf, replaced
    assert argv[at - 2 : at] == ["--ro-bind", resolv_conf()]
    assert "--unshare-net" not in argv  # corral makes the network namespace
    assert Mount("mask-dir", f"{HOME}/.ssh") in plan.mounts
    assert plan.quarantine == [f"{WS}/.git/hooks/pre-commit"]
    assert plan.notes == ["a note from the filesystem decision"]
    assert isinstance(plan.strategy, Bwrap) and plan.strategy.netns is not None
    assert plan.strategy.netns.handoff is None  # no network: loopback only
    assert sorted(plan.fds.values()).count("empty") == 1  # the one masked file


def test_namespace_plan_gives_the_loaders_variables_to_the_command_not_to_bwrap() -> None:
    """bwrap was started with the sandbox's environment: an LD_PRELOAD or
    LD_LIBRARY_PATH the policy set made it load, on the host, a library an
    earlier run had put in the workspace (found by attacking corral).  They go
    to the command through --setenv; the twin: another variable stays in the
    environment bwrap passes on, and no --setenv is added without one."""
    pol = policy()
    pol.env.set_values = {"LD_PRELOAD": f"{WS}/x.so", "GCONV_PATH": f"{WS}/g", "CC": "gcc"}
    plan = NamespaceTier().plan(pol, ["true"], host=NamespaceFacts(fs=fs_plan(), **common()))
    assert "LD_PRELOAD" not in plan.env and "GCONV_PATH" not in plan.env
    assert plan.env["CC"] == "gcc"
    at = plan.argv.index("--chdir")
    assert plan.argv[at - 6 : at] == [
        *("--setenv", "GCONV_PATH", f"{WS}/g"),
        *("--setenv", "LD_PRELOAD", f"{WS}/x.so"),
    ]
    plain = NamespaceTier().plan(policy(), ["true"], host=NamespaceFacts(fs=fs_plan(), **common()))
    assert "--setenv" not in plain.argv


def test_namespace_plan_without_bwrap_or_resolv_conf() -> None:
    facts = NamespaceFacts(bwrap=None, resolv_conf=None, fs=fs_plan(), **common())
    plan = NamespaceTier().plan(policy(), ["true"], host=facts)
    assert plan.argv[0] == "bwrap"
    assert resolv_conf() not in plan.argv


def test_namespace_plan_refuses_transparent_with_the_facts_reason() -> None:
    pol = policy()
    pol.network.mode, pol.network.allow, pol.network.transparent = "proxy", ["a.test"], True
    facts = NamespaceFacts(transparent="no nft here", fs=fs_plan(), **common())
    with pytest.raises(RefusedError, match="no nft here"):
        NamespaceTier().plan(pol, ["true"], door="/handoff", host=facts)


def test_namespace_plan_with_a_home_layer() -> None:
    layer = HomeLayer("/nowhere/state/homes/ws-1", "persist", "host", WS, HOME)
    facts = NamespaceFacts(fs=fs_plan(), home=layer, **common())
    plan = NamespaceTier().plan(policy(), ["true"], host=facts)
    assert plan.home is layer and plan.env["HOME"] == layer.path
    assert layer.secrets == frozenset(fs_plan().read_deny)


# A tree for the landlock tier's split: / holds etc (with shadow) and nowhere.
TREE = L.Tree(
    {
        "/": [("etc", True), ("nowhere", True), ("usr", True)],
        "/etc": [("shadow", False), ("hosts", False)],
        "/nowhere": [("home", True), ("ws", True)],
        "/nowhere/home": [(".ssh", True), (".bashrc", False)],
    }
)


def landlock_facts(**more: Any) -> LandlockFacts:
    return LandlockFacts(
        **{"abi": 7, "fs": fs_plan(mounts=False), "tree": TREE, **common(), **more}
    )


def test_landlock_plan_from_facts() -> None:
    plan = LandlockTier().plan(policy(), ["true"], host=landlock_facts())
    assert plan.argv == ["true"] and plan.mounts == []
    assert plan.scratch == f"/nowhere/tmp/corral-scratch-{TOKEN}"  # facts' TMPDIR and token
    assert plan.env["TMPDIR"] == plan.scratch
    assert plan.cwd == f"{WS}/src"
    assert isinstance(plan.strategy, Confined)
    rules = dict(plan.strategy.ruleset.paths)
    # the split walks the facts' tree: around the secrets, never onto them
    assert f"{HOME}/.bashrc" in rules and f"{HOME}/.ssh" not in rules
    assert "/etc/hosts" in rules and "/etc/shadow" not in rules
    assert rules[WS] & L.WRITE_FILE
    assert rules[plan.scratch] & L.WRITE_FILE


def test_landlock_plan_leaves_a_hidden_secret_unsplit() -> None:
    plan = LandlockTier().plan(
        policy(), ["true"], host=landlock_facts(hidden=frozenset({"/etc/shadow"}))
    )
    assert isinstance(plan.strategy, Confined)
    rules = dict(plan.strategy.ruleset.paths)
    assert "/etc" in rules  # file permissions hide shadow: /etc is granted whole
    assert "/etc/hosts" not in rules


def test_landlock_plan_refuses_an_old_abi_from_the_facts() -> None:
    with pytest.raises(RefusedError, match="Landlock ABI 3 lacks"):
        LandlockTier().plan(policy(), ["true"], host=landlock_facts(abi=3))
    with pytest.raises(RefusedError, match="no Landlock in this kernel"):
        LandlockTier().plan(policy(), ["true"], host=landlock_facts(abi=0))


def test_landlock_plan_grants_the_proxy_port_only() -> None:
    pol = policy()
    pol.network.mode, pol.network.allow = "proxy", ["a.test"]
    plan = LandlockTier().plan(pol, ["true"], door="127.0.0.1:4321", host=landlock_facts())
    assert isinstance(plan.strategy, Confined)
    assert plan.strategy.ruleset.ports == [(4321, L.NET_CONNECT_TCP)]
    assert plan.env["HTTPS_PROXY"] == "http://127.0.0.1:4321"


def fake_engine(runtime: str = "runc") -> Engine:
    eng = Engine.__new__(Engine)  # the real constructor asks the host
    eng.name, eng.path, eng.rootless = "podman", "/opt/podman/bin/podman", False
    eng.cgroups, eng.cgroup_manager, eng.swap_accounting = "v2", "", True
    eng.ulimits, eng.runtime, eng.runtime_path = {}, runtime, f"/opt/{runtime}"
    return eng


def container_facts(**more: Any) -> ContainerFacts:
    bundle = Bundle(["/run/corral/py/bin/python3"], [Mount("ro-bind", "/run/corral/py", "/py")])
    return ContainerFacts(
        **{
            "engine": fake_engine(),
            "bundle": bundle,
            "tmpdir": "/nowhere/tmp",
            "fs": fs_plan(),
            **common(environ={**ENVIRON, "CORRAL_IMAGE": "localhost/img:1"}),
            **more,
        }
    )


def test_container_plan_from_facts() -> None:
    plan = ContainerTier().plan(policy(), ["true"], host=container_facts())
    argv = plan.argv
    assert argv[0] == "/opt/podman/bin/podman"
    assert argv[argv.index("--name") + 1] == f"corral-{TOKEN}"
    assert "localhost/img:1" in argv  # the image the facts' environment names
    assert "--user=4242:4343" in argv  # the facts' ids
    assert f"--workdir={WS}/src" in argv or argv[argv.index("--workdir") + 1] == f"{WS}/src"
    assert "--tty" not in argv  # stdin is not a terminal in these facts
    assert plan.scratch == f"/nowhere/tmp/corral-ctr-{TOKEN}"
    assert isinstance(plan.strategy, EngineLaunch)
    assert plan.strategy.env == {"PATH": ENVIRON["PATH"], "HOME": HOME, "TMPDIR": "/nowhere/tmp"}
    assert plan.strategy.report == f"{plan.scratch}/report"
    assert plan.strategy.remove[-1] == f"corral-{TOKEN}"
    assert plan.strategy.needs_guardian()


def test_container_plan_gets_a_tty_when_the_facts_say_so() -> None:
    assert (
        "--tty" in ContainerTier().plan(policy(), ["sh"], host=container_facts(stdin_tty=True)).argv
    )


def test_corral_shells_relay_gets_no_engine_tty_even_from_a_terminal() -> None:
    """Its relay makes the shell's pty inside and reads frames on a plain stdin: the
    engine's terminal would echo them and edit them."""
    relayed = EngineLaunch.shell_command(["sh", "-i"], ["/py"])
    facts = container_facts(stdin_tty=True)
    argv = ContainerTier().plan(policy(), relayed, host=facts).argv
    assert "--tty" not in argv and "--interactive" in argv
    assert EngineLaunch.own_terminal and not EngineLaunch.shell  # corral shell runs there


def test_container_plan_refuses_without_an_engine_or_image() -> None:
    with pytest.raises(RefusedError, match="no podman here"):
        ContainerTier().plan(
            policy(), ["true"], host=container_facts(engine=None, engine_why="no podman here")
        )
    with pytest.raises(RefusedError, match="no image named"):
        ContainerTier().plan(policy(), ["true"], host=container_facts(**common()))


def test_gvisor_plan_drops_a_masked_socket_the_facts_name() -> None:
    facts = container_facts(engine=fake_engine("runsc"), sockets=frozenset({"/etc/shadow"}))
    plan = GVisorTier().plan(policy(), ["true"], host=facts)
    assert Mount("mask-file", "/etc/shadow") not in plan.mounts  # not mountable over a socket
    assert Mount("mask-dir", f"{HOME}/.ssh") in plan.mounts


def test_only_runc_gets_the_report_file_from_the_host() -> None:
    """gVisor's boot reports nothing (no cgroup files inside), yet the host file
    was bound writable: the command filled it, on the host's /tmp (found by
    attacking corral).  runc's boot writes it (the twin)."""
    from corral.tiers.container import REPORT

    gvisor = GVisorTier().plan(
        policy(), ["true"], host=container_facts(engine=fake_engine("runsc"))
    )
    assert all(m.dest != REPORT for m in gvisor.mounts) and REPORT not in gvisor.argv
    runc = ContainerTier().plan(policy(), ["true"], host=container_facts())
    assert any(m.dest == REPORT and m.kind == "bind" for m in runc.mounts)


def test_gvisor_refuses_to_mount_over_a_fifo_the_facts_name() -> None:
    """gVisor's gofer would wait for ever on the FIFO; leaving the mount out would
    leave the path unprotected.  Twin: the same plan on runc keeps the mount."""
    fs = fs_plan()
    fs.mounts.append(Mount("ro-bind", f"{WS}/.envrc", f"{WS}/.envrc", why="write-deny"))
    fifo = frozenset({f"{WS}/.envrc"})
    with pytest.raises(RefusedError, match=r"\.envrc \(write-deny\): it is a FIFO"):
        GVisorTier().plan(
            policy(), ["true"], host=container_facts(engine=fake_engine("runsc"), fs=fs, fifos=fifo)
        )
    ids = {f"{WS}/.envrc": (0o100000, 1, 2, 3, 4)}
    facts = container_facts(engine=fake_engine("runc"), fs=fs, fifos=fifo, binds=ids)
    plan = ContainerTier().plan(policy(), ["true"], host=facts)
    assert Mount("ro-bind", f"{WS}/.envrc", f"{WS}/.envrc") in plan.mounts


def test_container_checks_the_bind_sources_in_the_workspace_inside() -> None:
    """boot is handed each bind source below the workspace as corral found it:
    device and inode on runc, the times on gVisor (which numbers its own inodes).
    A source corral found no longer there, or found a symlink, is refused."""
    fs = fs_plan()
    fs.mounts.append(Mount("ro-bind", f"{WS}/.envrc", f"{WS}/.envrc", why="write-deny"))
    ids = {f"{WS}/.envrc": (0o100000, 1, 2, 3, 4)}
    for tier, engine, line in (
        (ContainerTier(), "runc", f"32768 1 2 - - {WS}/.envrc\n"),
        (GVisorTier(), "runsc", f"32768 - - 3 4 {WS}/.envrc\n"),
    ):
        facts = container_facts(engine=fake_engine(engine), fs=fs, binds=ids)
        plan = tier.plan(policy(), ["true"], host=facts)
        assert ("checks", line.encode(), 0o644) in plan.prepare
        (bound,) = [m for m in plan.mounts if m.dest == "/run/corral/checks"]
        assert bound.kind == "ro-bind" and bound.src == f"{plan.scratch}/checks"
        assert "/run/corral/checks" in plan.argv[plan.argv.index("/run/corral/boot.py") :]
        with pytest.raises(RefusedError, match=r"\.envrc changed while the run was set up"):
            tier.plan(policy(), ["true"], host=container_facts(engine=fake_engine(engine), fs=fs))
    plan = ContainerTier().plan(policy(), ["true"], host=container_facts())  # twin: none
    assert not any(name == "checks" for name, _, _ in plan.prepare)
    boot = plan.argv.index("/run/corral/boot.py")
    assert plan.argv[boot + 4 : boot + 6] == ["-", "--"]


def test_gvisor_refuses_a_socket_in_the_workspace_with_a_network() -> None:
    pol = policy()
    pol.network.mode, pol.network.allow = "proxy", ["a.test"]
    fs = fs_plan()
    fs.mounts.append(Mount("mask-file", f"{WS}/agent.sock", why="read-deny"))
    facts = container_facts(
        engine=fake_engine("runsc"), fs=fs, sockets=frozenset({f"{WS}/agent.sock"})
    )
    with pytest.raises(RefusedError, match=r"agent\.sock"):
        GVisorTier().plan(pol, ["true"], door="/nowhere/door", host=facts)
