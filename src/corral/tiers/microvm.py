"""The microvm tier: each sandbox is a QEMU ``-M microvm`` guest with its own kernel.

The building blocks live in :mod:`corral.vm` (see its docstring for the design);
this module is the tier: ``health()``, ``gather()`` (the host facts a VM plan
needs), a pure ``plan()`` and the launch strategy.

How it launches (:class:`VmStrategy`): the launcher's child is a fork of corral
that runs the VM (:func:`corral.vm.run.execute`) and exits with the guest
command's code.  Its stdin, stdout and stderr are the launcher's, so the output
pump, the timeout (killing the child's process group: bubblewrap around QEMU
dies with its parent, and QEMU with bubblewrap's pid namespace) and the exit
code are the launcher's as on every tier.  For ``Sandbox`` the agent's stdin and
stdout are one socket: QEMU gets it as the guest's port as it is, so an exec
crosses no process of ours on the host.
"""

from __future__ import annotations

import os

from corral.paths import inside
from corral.tiers.base import Health, HostFacts, LaunchStrategy, Plan, Tier, gather_common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from corral.fsplan import Mount
    from corral.net.trust import NetExtras
    from corral.policy import Policy
    from corral.vm.run import VmHost, VmPlan

# corral's own files the guest has in its initramfs (copied to /run/corral): a
# Sandbox's bind of its agent is served from there
GUEST_OWN = ("/run/corral/agent.py",)


class VmFacts(HostFacts):
    """The common host facts and the VM's own (:class:`corral.vm.run.VmHost`)."""

    __slots__ = ("vm",)

    def __init__(self, vm: VmHost | None = None, **common: object) -> None:
        super().__init__(**common)  # type: ignore[arg-type]
        self.vm = vm


class VmStrategy(LaunchStrategy):
    """Start: fork a runner that boots the VM; stop: kill its process group."""

    lazy = True  # a Sandbox's VM starts on first use, and again after it died
    agent_fds = False  # the agent's channel ends in a guest: no descriptor crosses it
    own_terminal = True  # a pty cannot cross into a guest: the guest makes the shell's

    def __init__(self, vm: VmPlan, door: str | None) -> None:
        self.vm = vm
        self.door = door
        self.limits_r = -1  # the runner names the limits the guest hit here

    def spawn(
        self, plan: Plan, child_fds: dict[int, int], procs_files: list[str], entered: bool
    ) -> int:
        # imported before the fork: another thread may hold the import lock
        import ctypes

        from corral import seccomp
        from corral.launch import move_fds_into_place
        from corral.vm import mux, run

        del ctypes, seccomp, mux, run, procs_files, entered  # the guest bounds itself
        duplex = child_fds.get(0) == child_fds.get(1)  # a Sandbox's agent channel
        # decided here, so describe() says how this start went (restore or boot)
        self.vm.chosen = None
        self.vm.chosen = self.vm.warm()
        limits_r, limits_w = os.pipe()
        pid = os.fork()
        if pid:
            os.close(limits_w)
            self.limits_r = limits_r
            return pid
        code = 125
        try:
            os.setsid()
            _default_signals()
            _die_with_parent()
            move_fds_into_place({0: child_fds[0], 1: child_fds[1], 2: child_fds[2], 3: limits_w})
            code = _serve(self.vm, self.door, duplex)
        finally:
            # a status os._exit cannot take would raise here, and this fork would
            # run on as corral (or as the Sandbox's caller)
            os._exit(code if 0 <= code <= 255 else 125)

    def limits_hit(self, plan: Plan) -> list[str]:
        if self.limits_r < 0:
            return []
        try:
            words = os.read(self.limits_r, 256).decode(errors="replace").split()
        except OSError:
            words = []
        os.close(self.limits_r)
        self.limits_r = -1
        return [w for w in dict.fromkeys(words) if w in ("memory", "pids")]

    def describe(self) -> list[str]:
        # all but its argv line: the plan's argv is the VM's
        # all but its argv and notes: the plan's argv and notes are the VM's
        lines = self.vm.describe().splitlines()
        return [line for line in lines if not line.startswith(("argv: ", "note: "))]

    def cannot_run_where(self) -> str:
        return " in the guest"


def _default_signals() -> None:
    """corral run's handlers and wakeup descriptor are not the runner's: a
    forwarded signal is for corral, which stops the runner with SIGKILL.  Then
    the signals launch.spawn_held blocked are let go (SIGPIPE stays ignored:
    the runner is Python, which wants EPIPE)."""
    import signal

    from corral.launch import RESET_SIGNALS

    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
    except ValueError:  # not Python's main thread (never after a fork, in practice)
        pass
    signal.pthread_sigmask(signal.SIG_UNBLOCK, RESET_SIGNALS)


def _die_with_parent() -> None:
    """This runner dies with corral (PR_SET_PDEATHSIG), and bubblewrap with it."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)  # SIGKILL
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # corral died before the line above ran
        os._exit(125)


def _serve(vm: VmPlan, door: str | None, duplex: bool) -> int:
    """In the runner: boot, run, report; the command's exit code."""
    import sys

    from corral.errors import CorralError
    from corral.vm import run

    try:
        result = run.execute(vm, door, 0, 1, 2, duplex=duplex)
    except CorralError as exc:
        sys.stderr.write(f"corral: {exc.message}\n")
        sys.stderr.flush()
        return exc.code
    if result.oom_kills:
        os.write(3, b"memory\n")
    return result.exit_code


class MicroVMTier(Tier):
    name = "microvm"
    strength = 90
    summary = "QEMU microvm: a guest kernel per sandbox, the host's view over 9p"
    strategy = VmStrategy

    def health(self, probe: bool = False) -> Health:
        from corral.vm import run

        return run.health(probe_now=probe)

    def gather(self, policy: Policy, agent: bool = False) -> VmFacts:
        from corral import fsplan, home
        from corral.vm import run

        facts = VmFacts(run.gather(agent=agent))
        gather_common(policy, facts)
        facts.home = home.plan_home(policy)
        layer = facts.home
        facts.fs = fsplan.plan_filesystem(
            policy, home=layer.path if layer else None, environ=facts.environ
        )
        return facts

    def plan(
        self,
        policy: Policy,
        command: list[str],
        door: str | None = None,
        extra: Sequence[Mount] = (),
        pass_fds: Sequence[int] = (),
        net: NetExtras | None = None,
        host: HostFacts | None = None,
    ) -> Plan:
        from corral import bounds
        from corral.errors import RefusedError
        from corral.vm import run

        facts = host if host is not None else self.gather(policy)
        if not isinstance(facts, VmFacts) or facts.vm is None or facts.fs is None:
            raise ValueError("the microvm tier plans from its own host facts (gather())")
        if pass_fds:
            raise RefusedError(
                "microvm: descriptors cannot be passed into a guest (--pass-fd, pass_fds)"
            )
        for mount in extra:
            if mount.dest not in GUEST_OWN:
                raise ValueError(f"microvm: no guest copy of {mount.dest}")
        view, env_extra = _trust(net, policy, facts.environ or {})
        view += _resolver(policy, facts.resolv_conf)
        layer = facts.home
        if layer is not None:  # $HOME: the home layer, one more writable export
            layer.secrets = frozenset(facts.fs.read_deny)
            env_extra["HOME"] = layer.path
        vm = run.build(
            policy,
            command,
            facts.vm,
            facts.fs,
            door,
            name=f"corral-vm-{facts.vm.owner}-{facts.token}",
            view_extra=view,
            env_extra=env_extra,
            # a Sandbox's agent (its bind is in extra): the one a Sandbox machine's
            # init started before the state was saved, when there is one
            agent=command == self.agent_command() and any(m.dest in GUEST_OWN for m in extra),
            home=layer.path if layer is not None else None,
        )
        vm.timeout = None  # the launcher's: it stops the whole VM (stop())
        plan = Plan(self.name, policy)
        plan.strategy = VmStrategy(vm, door)
        plan.home = layer
        plan.argv = vm.argv
        plan.notes = vm.notes
        plan.quarantine = facts.fs.quarantine
        plan.repositories = facts.fs.repositories
        plan.restore = dict.fromkeys(facts.fs.keep_in_place, "in-place")
        plan.cwd = vm.launch.cwd if vm.launch is not None else policy.workspace
        plan.env = dict(vm.launch.env) if vm.launch is not None else {}
        _bounds(plan, vm)
        bounds.apply_scratch(plan, sized_by="the guest's tmpfs size")
        return plan


def _resolver(policy: Policy, host: tuple[str, bool] | None) -> list[Mount]:
    """With a network, corral's resolv.conf over the host's in the guest's root, as
    on the namespace tier: lookups go to the relay's resolver on the guest's
    loopback, answered from the policy and recorded.  (Not where the host's file
    lies in a directory the guest mounts its own tmpfs on, such as /run: nothing
    to bind over there.)"""
    from corral import fsplan, netns
    from corral.fsplan import Mount

    if policy.network.mode != "proxy":
        return []
    target = netns.resolv_target(host, ())
    if target is None or any(inside(target, d) for d in fsplan.PRIVATE_TMP):
        return []
    return [Mount("ro-bind", target, netns.resolv_conf(), "the guest's resolver")]


def _trust(
    net: NetExtras | None, policy: Policy, host_env: Mapping[str, str]
) -> tuple[list[Mount], dict[str, str]]:
    """corral's CA bundle bound over the system bundles in the guest's root, and
    the variables naming it, also those passed in from ``host_env`` (see
    corral.net.trust.sandbox_env); the namespace tier's own path is under /run,
    the guest's private tmpfs."""
    if net is None or policy.network.mode != "proxy":
        return [], {}
    from corral.net import trust

    env = dict(net.env)
    if net.ca_bundle is None:
        return [], env
    if not net.system_bundles:
        from corral.errors import RefusedError

        raise RefusedError("microvm: TLS inspection needs a system CA bundle on this host")
    mounts = [m for m in trust.trust_mounts(net) if m.dest != trust.INSIDE_BUNDLE]
    inside = net.system_bundles[0]
    passed = dict.fromkeys(trust.bundle_variables(host_env), inside)
    return mounts, {**trust.trust_env(inside), **passed, **env}


def _bounds(plan: Plan, vm: VmPlan) -> None:
    """memory, cpus and pids as the guest applies them; the timeout by corral."""
    from corral.bounds import Bound

    limits = plan.policy.limits
    machine = vm.machine
    assert machine is not None
    how = {
        "timeout": "corral stops the whole VM",
        "memory": "the guest's RAM",
        "cpus": f"{machine.cpus} vCPU(s)",
        "pids": "the guest's pids cgroup",
    }
    for name, text in how.items():
        value = limits.get(name)
        plan.bounds[name] = Bound(
            name, value, limits.source(name), True if value is not None else None, text
        )
    # the guest's RAM is what applies (a default above qemu.GUEST_MEMORY_DEFAULT is
    # capped): the bound says that size
    source = limits.source("memory") if limits.source("memory") == "set" else "default"
    memory = Bound("memory", machine.memory_mib << 20, source, True, "the guest's RAM")
    plan.bounds["memory"] = memory
