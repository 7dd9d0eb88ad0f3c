"""Tiers corral knows but cannot run commands on yet.

Each one still reports what this host has for it, so ``corral doctor`` tells a
person both "not built yet" and what would be missing once it is.  Asking for
one with ``--tier`` is refused with that reason; nothing falls back.
"""

from __future__ import annotations

import os
import shutil
import sys

from corral.tiers.base import Health, Plan, Tier

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from corral.fsplan import Mount
    from corral.net.trust import NetExtras
    from corral.policy import Policy
    from corral.tiers.base import HostFacts


def _which(*names: str) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


class _Planned(Tier):
    issue = ""

    def host_facts(self) -> str:
        return ""

    def health(self, probe: bool = False) -> Health:
        facts = self.host_facts()
        reason = f"not built yet in this version of corral (planned: {self.issue})"
        return Health(False, f"{reason}; host: {facts}" if facts else reason)


class FirecrackerTier(_Planned):
    """Builders and an honest health (:mod:`corral.vm.firecracker`); no launcher yet.

    The operator names the guest's kernel and root filesystem in
    ``CORRAL_FIRECRACKER_KERNEL`` and ``CORRAL_FIRECRACKER_ROOTFS``; whether this
    host's KVM boots guests is the microvm tier's boot probe's answer."""

    name = "firecracker"
    strength = 95
    summary = "Firecracker microVM under its jailer (builders only)"
    issue = "microVM tier"

    def health(self, probe: bool = False) -> Health:
        from corral.vm import firecracker

        found = firecracker.health(
            os.environ.get("CORRAL_FIRECRACKER_KERNEL"),
            os.environ.get("CORRAL_FIRECRACKER_ROOTFS"),
            kvm_boots(probe),
        )
        if not found.available:
            return found
        return Health(
            False,
            f"{found.reason}: everything it needs is here, but this version of corral "
            "has no Firecracker launcher (its builders only)",
            found.details,
        )


def kvm_boots(probe: bool = False) -> tuple[bool, str]:
    """Whether this host's KVM boots a guest, and how that is known (the microvm
    tier's cached boot probe; ``probe`` runs it if it never ran)."""
    from corral.vm import probe as vm_probe
    from corral.vm import run

    problem = vm_probe.kvm_problem()
    if problem:
        return False, problem
    health = run.health(probe_now=probe)
    if not health.available:
        return False, f"no boot probe possible: {health.reason}"
    return health.details.get("accelerator") == "kvm", str(health.details.get("why", ""))


class SeatbeltTier(_Planned):
    name = "seatbelt"
    strength = 45
    summary = "macOS sandbox-exec profile (built by corral.seatbelt)"
    issue = "seatbelt tier on macOS"
    door_transport = "tcp"  # the profile allows one localhost port: the proxy's

    def health(self, probe: bool = False) -> Health:
        if sys.platform != "darwin":
            return Health(False, "macOS only (sandbox-exec); this host is " + sys.platform)
        if not os.path.exists("/usr/bin/sandbox-exec"):
            return Health(False, "/usr/bin/sandbox-exec is missing")
        return Health(
            False,
            "profile builder ready (corral.seatbelt); macOS launcher untested "
            "here, so not offered yet",
        )

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
        """The pure part: what would run on macOS (``sandbox-exec -p PROFILE``)."""
        from corral import environ, seatbelt

        plan = Plan(self.name, policy)
        plan.env = environ.sandbox_env(policy)
        plan.cwd = environ.sandbox_cwd(policy, policy.writable_paths())
        port = None
        if policy.network.mode == "proxy":
            from corral.net.door import proxy_env
            from corral.tiers.landlock import door_port

            port = door_port(door)
            plan.env = {**proxy_env(port, port), **plan.env}
        plan.argv = seatbelt.argv(policy, command, port)
        return plan
