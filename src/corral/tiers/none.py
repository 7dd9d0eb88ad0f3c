"""The unconfined tier: runs the command directly.  Only when asked for by name."""

from __future__ import annotations

from corral import environ
from corral.tiers.base import Health, Plan, Tier

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from corral.fsplan import Mount
    from corral.net.trust import NetExtras
    from corral.policy import Policy
    from corral.tiers.host import HostFacts

WARNING = (
    "corral: WARNING: tier none: running UNCONFINED (no filesystem, network, "
    "secret or syscall protection; only the environment is filtered and limits applied)"
)


class NoneTier(Tier):
    name = "none"
    strength = 0
    summary = "no sandbox: the command runs directly, as if corral were not there"

    def health(self, probe: bool = False) -> Health:
        return Health(True, "always available; gives no protection (only when named)")

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

        plan = Plan(self.name, policy)
        plan.env = environ.sandbox_env(policy)
        plan.cwd = environ.sandbox_cwd(policy, [policy.workspace])
        bounds.apply_cgroup(plan, policy.limits)
        bounds.apply_scratch(plan, absent="it has no private /tmp or /dev/shm (the host's own)")
        plan.argv = list(command)
        plan.fds = dict.fromkeys(pass_fds, "pass")
        plan.warning = WARNING
        return plan
