"""The interface every tier implements, and the plan it returns.

A tier is a name, a strength, ``health()`` (can it run here, and if not, exactly
why) and a pure ``plan(policy, command)``: what would be launched, with which
mounts, syscall rules and limits.  Launching a plan is the launcher's job
(:mod:`corral.launch`), so plans can be unit-tested without running anything.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from corral.bounds import Bound
    from corral.cgroups import CgroupPlan
    from corral.fsplan import Mount
    from corral.home import HomeLayer
    from corral.landlock import Ruleset
    from corral.net.trust import NetExtras
    from corral.netns import NetPlan
    from corral.policy import Policy
    from corral.seccomp import SyscallRule


class Health:
    __slots__ = ("available", "details", "reason")

    def __init__(self, available: bool, reason: str, details: dict[str, object] | None = None):
        self.available = available
        self.reason = reason  # one line a person can act on
        self.details = details or {}

    def to_dict(self) -> dict[str, object]:
        return {"available": self.available, "reason": self.reason, **self.details}


class Plan:
    """What a tier will launch.  Environment *values* live only in ``env``.

    ``fds`` maps a file-descriptor number used in ``argv`` to what the launcher
    must put there: ``"status"`` (a pipe bwrap reports to), ``"seccomp"`` (the
    compiled filter), ``"empty"`` (an empty file's content, for masks; also the
    filler a container engine needs below a passed descriptor) or ``"pass"`` (the
    caller's own descriptor of that number, which the user asked to pass through).
    No other descriptor of the caller reaches the sandbox.
    """

    __slots__ = (
        "argv",
        "bounds",
        "cgroup",
        "cwd",
        "cwd_in_argv",
        "env",
        "fds",
        "hardlinks",
        "home",
        "landlock",
        "launcher_env",
        "lock_watch",
        "mounts",
        "netns",
        "notes",
        "policy",
        "prepare",
        "quarantine",
        "report",
        "restore",
        "scratch",
        "seccomp",
        "teardown",
        "tier",
        "warning",
    )

    def __init__(self, tier: str, policy: Policy) -> None:
        self.tier = tier
        self.policy = policy
        self.argv: list[str] = []
        self.env: dict[str, str] = {}
        self.cwd = policy.workspace
        self.cwd_in_argv = False  # True when argv itself changes to cwd (bwrap --chdir)
        # a network namespace the launcher creates, with the listeners it hands to
        # the proxy (namespace tier with a network; see corral.netns)
        self.netns: NetPlan | None = None
        self.mounts: list[Mount] = []
        self.seccomp: tuple[SyscallRule, ...] = ()
        self.cgroup: CgroupPlan | None = None
        self.bounds: dict[str, Bound] = {}  # each limit: value, where from, enforced or not
        self.fds: dict[int, str] = {}
        self.quarantine: list[str] = []
        # where $HOME points, made and seeded by the launcher (corral.home)
        self.home: HomeLayer | None = None
        # read-only files git writes through a lock file beside them: directory ->
        # {lock name: protected path}, watched during the run (corral.lockwatch)
        self.lock_watch: dict[str, dict[str, str]] = {}
        self.hardlinks: list[str] = []  # files made read-only: may share content outside
        # tiers without mounts (landlock): the ruleset, write-deny paths put back
        # after the run, and a private scratch directory the launcher creates
        self.landlock: Ruleset | None = None
        self.restore: list[str] = []
        self.scratch: str | None = None
        self.notes: list[str] = []
        self.warning: str | None = None  # printed on stderr every run (tier none)
        # For tiers that launch through another program (a container engine):
        self.launcher_env: dict[str, str] | None = None  # its environment, if not ``env``
        self.prepare: list[tuple[str, bytes, int]] = []  # files made in scratch: name, data, mode
        self.report: str | None = None  # a file naming limits hit, one per line
        self.teardown: list[list[str]] = []  # commands that remove what a kill left behind

    def describe(self) -> str:
        """A human-readable account of the plan; never prints environment values."""
        lines = [f"tier: {self.tier}", f"workspace: {self.policy.workspace}", f"cwd: {self.cwd}"]
        lines.append("env: " + " ".join(sorted(self.env)))
        if self.home is not None:
            lines.append(self.home.describe())
        from corral.bounds import describe

        lines.extend(describe(self))
        if self.cgroup is not None:
            lines.append(f"cgroup: {self.cgroup.describe()}")
        if self.mounts:
            lines.append("mounts:")
            lines.extend(f"  {m!r}" for m in self.mounts)
        if self.landlock is not None:
            lines.extend(self.landlock.describe())
        if self.scratch:
            lines.append(f"scratch (private, removed after the run): {self.scratch}")
        if self.restore:
            lines.append("snapshotted at launch, restored after the run if changed:")
            lines.extend(f"  {p}" for p in self.restore)
        if self.netns is not None:
            lines.extend(self.netns.describe())
        lines.extend(network_lines(self.policy))
        if self.seccomp:
            lines.append("seccomp (each call below fails with that errno; all others allowed):")
            shown = [(r.describe(), r.why) for r in self.seccomp]
            width = min(44, max(len(call) for call, _ in shown))
            lines.extend(f"  {call:<{width}}  {why}" for call, why in shown)
        if self.quarantine:
            lines.append("quarantined after the run if created:")
            lines.extend(f"  {p}" for p in self.quarantine)
        lines.extend(f"note: {n}" for n in self.notes)
        lines.append("argv: " + " ".join(self.argv))
        return "\n".join(lines)


def network_lines(policy: Policy) -> list[str]:
    """The network rules as ``--explain`` prints them."""
    net = policy.network
    if net.mode != "proxy":
        return ["network: none (the sandbox's own loopback only; allow a host with --allow)"]
    lines = [
        "network: proxy (only through corral's proxy; deny wins, anything not allowed is denied)",
        f"  allow: {', '.join(net.allow) or 'nothing'}",
    ]
    if net.deny:
        lines.append(f"  deny: {', '.join(net.deny)}")
    for name, address in sorted(net.hosts.items()):
        lines.append(f"  pinned: {name} = {address} (no DNS)")
    lines.append(
        "  an allowed name that resolves to a loopback, private, link-local, CGNAT or "
        "metadata address is refused unless an address rule allows that address"
    )
    if net.transparent:
        lines.append("  transparent: every TCP connection and DNS query is captured")
    return lines


class Tier:
    """Base class: subclasses set ``name``, ``strength`` and ``summary``."""

    name = ""
    strength = 0  # auto picks the highest available; 0 means never picked by auto
    summary = ""
    # How the sandbox reaches the proxy: "unix" (a socket bound in; plan() gets its
    # path) or "tcp" (a loopback port; plan() gets "127.0.0.1:PORT").
    door_transport = "unix"

    def health(self, probe: bool = False) -> Health:
        """Can this tier run here?  ``probe`` may launch a tiny test sandbox (doctor)."""
        raise NotImplementedError

    def health_for(self, policy: Policy | None, probe: bool = False) -> Health:
        """Like health(), for the choices a policy makes (the container tier's engine)."""
        return self.health(probe)

    def python_argv(self) -> list[str]:
        """How to start a Python inside this tier's sandbox (the relay and the agent)."""
        from corral.tiers.namespace import inside_python

        return [inside_python()]

    def plan(
        self,
        policy: Policy,
        command: list[str],
        door: str | None = None,
        extra: Sequence[Mount] = (),
        pass_fds: Sequence[int] = (),
        net: NetExtras | None = None,
    ) -> Plan:
        """What would run ``command`` under ``policy``.  ``door`` is the proxy's address
        when ``policy.network.mode`` is "proxy" (see ``door_transport``); ``extra``
        are corral's own files to bind in (the long-lived sandbox's agent);
        ``pass_fds`` are the caller's descriptors (numbers above 2) the user asked
        to hand to the command at the same numbers; ``net`` is what the run's door
        adds inside beside its address (corral's CA bundle when this run can
        intercept TLS, hooks' variables: :mod:`corral.net.trust`)."""
        raise NotImplementedError(f"tier {self.name} cannot run commands yet")
