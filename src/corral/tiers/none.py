"""The unconfined tier: runs the command directly.  Only when asked for by name."""

from __future__ import annotations

from corral import environ
from corral.tiers.base import Health, HostFacts, LaunchStrategy, Plan, Tier

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from corral.fsplan import Mount
    from corral.net.trust import NetExtras
    from corral.policy import Policy

WARNING = (
    "corral: WARNING: tier none: running UNCONFINED (no filesystem, network, "
    "secret or syscall protection; only the environment is filtered and limits applied)"
)


class Direct(LaunchStrategy):
    """A plain process (the defaults): no sandbox, so no door, no long-lived
    Sandbox and no shell, and a warning on every run."""

    confines = False
    warning = WARNING

    def cannot_run_where(self) -> str:
        return ""  # it runs on the host itself


class NoneTier(Tier):
    name = "none"
    strength = 0
    summary = "no sandbox: the command runs directly, as if corral were not there"
    strategy = Direct

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

        facts = self.gather(policy) if host is None else host
        plan = Plan(self.name, policy)
        plan.strategy = Direct()
        plan.env = environ.sandbox_env(policy, facts.environ)
        plan.cwd = environ.sandbox_cwd(policy, [policy.workspace], facts.cwd)
        bounds.apply_cgroup(plan, policy.limits, facts.cgroup_layout())
        bounds.apply_scratch(plan, absent="it has no private /tmp or /dev/shm (the host's own)")
        plan.argv = list(command)
        plan.fds = dict.fromkeys(pass_fds, "pass")
        return plan
