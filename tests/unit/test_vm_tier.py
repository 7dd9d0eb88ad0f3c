"""The microvm tier's plan from fabricated host facts: nothing launched, no host read
by plan() (the facts name a kernel, QEMU and bubblewrap that need not exist)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral import fsplan
from corral.errors import RefusedError
from corral.fsplan import Mount
from corral.policy import Policy
from corral.tiers import get
from corral.tiers.base import Plan
from corral.tiers.microvm import MicroVMTier, VmFacts, VmStrategy
from corral.vm import guest, probe, qemu, setup
from corral.vm.run import AgentMachine, VmHost


def facts_for(policy: Policy, accel: str = "tcg") -> VmFacts:
    host = VmHost(
        setup.Assets("/fake/kernel-6.1", "6.1.0-test", ["virtio_mmio"]),
        "/usr/bin/qemu-system-x86_64",
        "/usr/bin/bwrap",
        "/fake/initramfs.cpio",
        probe.Decision(accel, f"{accel.upper()}: as the test says"),
        qemu.HostFacts(2_000_000, {"/bin": "usr/bin"}),
        cpus=4,
        uid=1000,
        gid=1000,
        owner=4242,
    )
    facts = VmFacts(host, token="abc123")
    facts.fs = fsplan.plan_filesystem(policy)
    return facts


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    p = Policy(str(tmp_path))
    p.limits.defaults = {"memory": 8 << 30, "pids": 4096}
    return p


def test_the_registry_has_the_tier_with_its_strategy() -> None:
    tier = get("microvm")
    assert isinstance(tier, MicroVMTier) and tier.strategy is VmStrategy
    assert VmStrategy.lazy  # Sandbox: booted on first use, again after the VM died


def test_plan_is_qemu_in_bwrap_with_the_policys_bounds(policy: Policy) -> None:
    policy.limits.memory = 256 << 20
    policy.limits.cpus = 2
    policy.limits.pids = 64
    plan = MicroVMTier().plan(policy, ["echo", "hi"], host=facts_for(policy))
    assert isinstance(plan.strategy, VmStrategy)
    argv = plan.argv
    assert argv[0] == "/usr/bin/bwrap" and "/usr/bin/qemu-system-x86_64" in argv
    q = argv[argv.index("/usr/bin/qemu-system-x86_64") :]
    assert q[q.index("-m") + 1].startswith("256") and q[q.index("-smp") + 1].startswith("2")
    assert "corral-vm-4242-abc123" in q  # named after corral's pid: ps shows whose VM
    assert q[q.index("-accel") + 1] == f"tcg,tb-size={qemu.TCG_CODE_MIB}"  # a small code cache
    assert plan.bounds["memory"].value == 256 << 20 and plan.bounds["memory"].enforced
    assert plan.bounds["pids"].enforced and plan.bounds["cpus"].how == "2 vCPU(s)"
    assert plan.strategy.vm.timeout is None  # the launcher's timeout stops the VM
    assert plan.fds == {}  # the runner makes its own channels
    launch = plan.strategy.vm.launch
    assert launch is not None and launch.pids == 64 and not launch.network


def test_a_default_memory_bound_is_capped_and_says_so(policy: Policy) -> None:
    plan = MicroVMTier().plan(policy, ["true"], host=facts_for(policy))
    assert plan.bounds["memory"].value == qemu.GUEST_MEMORY_DEFAULT << 20
    assert plan.bounds["memory"].source == "default"


def test_explain_names_the_accelerator_the_mounts_and_qemus_argv(policy: Policy) -> None:
    text = MicroVMTier().plan(policy, ["true"], host=facts_for(policy)).describe()
    assert "tier: microvm" in text and "accelerator: TCG: as the test says" in text
    assert "the guest mounts:" in text and "/ <- 9p" in text
    last = text.splitlines()[-1]
    assert last.startswith("argv: /usr/bin/bwrap") and "qemu-system-x86_64" in last


def test_what_a_guest_cannot_have_is_refused(policy: Policy) -> None:
    tier = MicroVMTier()
    with pytest.raises(RefusedError, match="descriptors cannot be passed"):
        tier.plan(policy, ["true"], pass_fds=[5], host=facts_for(policy))
    policy.network.mode = "proxy"
    policy.network.transparent = True
    with pytest.raises(RefusedError, match="--transparent"):
        tier.plan(policy, ["true"], door="/tmp/door.sock", host=facts_for(policy))


def test_the_agent_bind_is_served_by_the_guests_own_copy(policy: Policy) -> None:
    tier = MicroVMTier()
    agent = Mount("ro-bind", "/run/corral/agent.py", "/src/agent.py", "the sandbox's agent")
    plan = tier.plan(
        policy, ["python3", "/run/corral/agent.py"], extra=[agent], host=facts_for(policy)
    )
    assert "/src/agent.py" not in plan.argv  # not in QEMU's view: the initramfs has it
    with pytest.raises(ValueError, match="no guest copy"):
        tier.plan(
            policy, ["true"], extra=[Mount("ro-bind", "/x", "/y", "")], host=facts_for(policy)
        )


def test_with_a_network_the_relay_runs_first_in_the_guest(policy: Policy) -> None:
    policy.network.mode = "proxy"
    plan = MicroVMTier().plan(policy, ["curl", "x"], door="/tmp/d.sock", host=facts_for(policy))
    assert isinstance(plan.strategy, VmStrategy)
    launch = plan.strategy.vm.launch
    assert launch is not None and launch.network
    assert "/run/corral/guestdoor.py" in launch.argv and launch.argv[-2:] == ["curl", "x"]
    assert "HTTP_PROXY" in launch.env and "HTTP_PROXY" in plan.env


def test_allowed_host_services_are_served_at_their_own_address_in_the_guest(
    policy: Policy,
) -> None:
    policy.network.mode = "proxy"
    policy.network.allow = ["127.0.0.1:8080", "127.0.0.0/8:9000", "example.org"]
    plan = MicroVMTier().plan(policy, ["curl", "x"], door="/tmp/d.sock", host=facts_for(policy))
    launch = plan.strategy.vm.launch  # type: ignore[attr-defined]
    argv = launch.argv[: launch.argv.index("curl")]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--service"] == ["127.0.0.1:8080"]
    assert any("127.0.0.0/8:9000" in n and "only through the proxy" in n for n in plan.notes)


def test_home_is_the_home_layer_exported_read_write_at_its_own_path(
    policy: Policy, tmp_path: Path
) -> None:
    from corral import home

    layer = home.HomeLayer(str(tmp_path / "layer"), "persist", "host", policy.workspace, "/h")
    facts = facts_for(policy)
    facts.home = layer
    facts.fs = fsplan.plan_filesystem(policy, home=layer.path)
    plan = MicroVMTier().plan(policy, ["true"], host=facts)
    vm = plan.strategy.vm  # type: ignore[attr-defined]
    assert plan.home is layer and vm.launch.env["HOME"] == layer.path
    exported = {(e.path, e.writable) for e in vm.shares}
    assert (layer.path, True) in exported and (policy.workspace, True) in exported
    assert any(m.dest.endswith(layer.path) and m.kind == "bind" for m in vm.view)
    # the twin: no layer (home = "read-only"), the real home and no export for it
    plain = MicroVMTier().plan(policy, ["true"], host=facts_for(policy))
    other = plain.strategy.vm  # type: ignore[attr-defined]
    assert plain.home is None and other.launch.env.get("HOME") == policy.home()
    assert all(e.path != layer.path for e in other.shares)


def test_with_a_network_the_guests_resolv_conf_is_corrals(policy: Policy) -> None:
    from corral import netns

    def resolver_binds(mode: str, host: tuple[str, bool] | None) -> list[str]:
        policy.network.mode = mode
        facts = facts_for(policy)
        facts.resolv_conf = host
        plan = MicroVMTier().plan(policy, ["true"], door="/tmp/d.sock", host=facts)
        vm = plan.strategy.vm  # type: ignore[attr-defined]
        return [m.dest for m in vm.view if m.src == netns.resolv_conf()]

    assert resolver_binds("proxy", ("/etc/resolv.conf", True)) == ["/guest/etc/resolv.conf"]
    assert resolver_binds("proxy", ("/etc/resolv.real", True)) == ["/guest/etc/resolv.real"]
    # the twins: offline, no resolver to point at; a file under the guest's own /run
    assert resolver_binds("none", ("/etc/resolv.conf", True)) == []
    assert resolver_binds("proxy", ("/run/systemd/resolve/stub-resolv.conf", True)) == []


def test_without_a_guest_kernel_the_tier_refuses_with_the_setup_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from corral import cli

    monkeypatch.setattr(setup, "installed", lambda cache=None: [])
    health = MicroVMTier().health()
    assert not health.available
    assert health.reason.endswith(f"no guest kernel is set up; run: {setup.setup_command()}")
    try:
        code = cli.main(["run", "--tier", "microvm", "--", "true"])
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 122 and err.count("\n") == 1 and setup.setup_command() in err


def test_firecracker_refuses_with_every_reason_and_even_when_complete(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from corral.tiers import planned

    monkeypatch.setattr(planned, "kvm_boots", lambda probe=False: (False, "TCG: KVM is PVM"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CORRAL_FIRECRACKER_KERNEL", raising=False)
    monkeypatch.delenv("CORRAL_FIRECRACKER_ROOTFS", raising=False)
    reason = get("firecracker").health().reason
    for missing in (
        "a KVM that boots guests (TCG: KVM is PVM)",
        "the firecracker binary on PATH",
        "the jailer binary on PATH",
        "an operator-supplied guest kernel (none configured)",
        "an operator-supplied guest root filesystem (none configured)",
    ):
        assert missing in reason
    # everything present: still refused, and says why
    for name in ("firecracker", "jailer", "vmlinux", "rootfs.ext4"):
        (tmp_path / name).write_text("")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setattr(planned, "kvm_boots", lambda probe=False: (True, "KVM"))
    monkeypatch.setenv("CORRAL_FIRECRACKER_KERNEL", str(tmp_path / "vmlinux"))
    monkeypatch.setenv("CORRAL_FIRECRACKER_ROOTFS", str(tmp_path / "rootfs.ext4"))
    health = get("firecracker").health()
    assert not health.available and "no Firecracker launcher" in health.reason


# ---- a Sandbox's machine: the agent waiting since before the state was saved ----


def agent_plan(policy: Policy, facts: VmFacts, command: list[str] | None = None) -> Plan:
    from corral.tiers.base import SANDBOX_AGENT

    tier = MicroVMTier()
    bind = Mount("ro-bind", SANDBOX_AGENT, "/src/agent.py", "the sandbox's agent")
    door = "/run/door.sock" if policy.network.mode == "proxy" else None
    return tier.plan(policy, command or tier.agent_command(), door, extra=[bind], host=facts)


def test_a_sandboxs_agent_is_the_one_its_machine_started(policy: Policy) -> None:
    facts = facts_for(policy)
    assert facts.vm is not None
    facts.vm.agent = AgentMachine("/fake/agent-initramfs.cpio", ["q", "k", "agent-initrd"])
    sandbox = agent_plan(policy, facts).strategy
    assert isinstance(sandbox, VmStrategy) and sandbox.vm.launch is not None
    assert sandbox.vm.launch.waiting and sandbox.vm.launch.duplex
    argv = sandbox.vm.argv
    assert argv[argv.index("/fake/agent-initramfs.cpio") + 1] == "/vm/initrd"
    run = MicroVMTier().plan(policy, ["true"], host=facts).strategy
    assert isinstance(run, VmStrategy) and run.vm.launch is not None
    assert not run.vm.launch.waiting and "/fake/initramfs.cpio" in run.vm.argv
    assert sandbox.vm.warm_key != run.vm.warm_key  # each machine its own saved state
    # another command with the agent's bind is no agent: it runs as any command
    other = agent_plan(policy, facts, ["sh", "-c", "true"]).strategy
    assert isinstance(other, VmStrategy) and other.vm.launch is not None
    assert not other.vm.launch.waiting


def test_without_that_machine_the_agent_starts_with_the_guest_and_says_why(
    policy: Policy,
) -> None:
    facts = facts_for(policy)
    assert facts.vm is not None
    facts.vm.agent = "/usr/bin/python3 is older than Python 3.11"
    plan = agent_plan(policy, facts)
    assert isinstance(plan.strategy, VmStrategy) and plan.strategy.vm.launch is not None
    assert not plan.strategy.vm.launch.waiting
    assert any("no waiting agent: /usr/bin/python3 is older" in n for n in plan.notes)


def test_a_networked_sandboxs_waiting_agent_is_given_its_relays_arguments(
    policy: Policy,
) -> None:
    policy.network.mode = "proxy"
    policy.network.allow = ["127.0.0.1:8080"]
    facts = facts_for(policy)
    assert facts.vm is not None
    facts.vm.agent = AgentMachine("/fake/agent-initramfs.cpio", ["agent-initrd"])
    plan = agent_plan(policy, facts)
    vm = plan.strategy.vm if isinstance(plan.strategy, VmStrategy) else None
    assert vm is not None and vm.launch is not None and vm.launch.waiting
    assert "/fake/agent-initramfs.cpio" in vm.argv
    relay = vm.launch.relay
    assert relay[:2] == ["--door", "/run/corral/door.sock"] and "--service" in relay
    go = json.loads(bytes.fromhex(guest.go(vm.launch)))
    assert go["relay"] == relay and "HTTP_PROXY" in go["env"]
    assert go["path_memory"] == guest.PATH_MEMORY == 60.0  # (corral.agent.SEARCH_TTL)
    # the twin: without a network the go line carries no relay
    policy.network.mode = "none"
    offline = agent_plan(policy, facts).strategy.vm.launch  # type: ignore[attr-defined]
    assert offline.waiting and "relay" not in json.loads(bytes.fromhex(guest.go(offline)))


def test_a_first_run_says_it_boots_and_saves_a_state(
    policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first microvm run took 7 s in silence (booting, then saving the state later
    runs restore): it says so, once; a run whose state is saved says nothing."""
    monkeypatch.delenv("CORRAL_VM_WARM", raising=False)
    facts = facts_for(policy)
    first = MicroVMTier().plan(policy, ["true"], host=facts)
    assert isinstance(first.strategy, VmStrategy)
    key = first.strategy.vm.warm_key
    said = [n for n in first.notes if n.startswith("no saved state of this machine yet")]
    assert len(said) == 1
    assert facts.vm is not None
    facts.vm.saved = frozenset({key})
    later = MicroVMTier().plan(policy, ["true"], host=facts)
    assert isinstance(later.strategy, VmStrategy) and later.strategy.vm.warm_key == key
    assert not [n for n in later.notes if n.startswith("no saved state")]
