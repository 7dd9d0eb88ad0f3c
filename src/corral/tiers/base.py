"""The interface every tier implements, the plan it returns and how that plan runs.

A tier is a name, a strength, ``health()`` (can it run here, and if not, exactly
why), ``gather(policy)`` (the host facts its plan needs, read once:
:class:`HostFacts`) and a pure ``plan(policy, command, ..., host=facts)``:
what would be launched, with which mounts, syscall rules and limits.

A plan carries its tier's :class:`LaunchStrategy` (``plan.strategy``): how that
kind of sandbox is started, stopped and cleaned up, with the data only that
tier needs.  :mod:`corral.launch` does what every tier shares and calls the
strategy for the rest, so the launcher, the CLI and ``Sandbox`` never ask which
tier they run.  Plans can be unit-tested without running anything.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from corral.bounds import Bound
    from corral.cgroups import CgroupHost, CgroupPlan
    from corral.fsplan import FsPlan, Mount, Repositories
    from corral.home import HomeLayer
    from corral.net.trust import NetExtras
    from corral.netns import Resolver
    from corral.policy import Policy
    from corral.seccomp import SyscallRule


SANDBOX_AGENT = "/run/corral/agent.py"  # where Sandbox binds corral's agent inside


class HostFacts:
    """What a tier's ``plan()`` needs to know about this host, read once by the
    caller (``Tier.gather(policy)``), so that ``plan(..., host=facts)`` is a pure
    function of the policy, the command and this snapshot, and unit tests
    fabricate one instead of monkeypatching the host.  Each tier extends it
    with its own facts in a subclass in its module (the namespace tier's bwrap
    path, the landlock tier's ABI, the container tier's engine).  Every field
    has a harmless default so a test names only what it cares about.

    ``environ``: corral's own environment (PATH to find tools, TMPDIR, what a
    container engine needs, what the policy passes through); ``cwd``: the
    caller's working directory, symlinks resolved ("" when it is gone);
    ``uid``/``gid``/``groups``: who corral runs as; ``stdin_tty``: whether fd
    0 is a terminal; ``token``: a fresh random hex string naming this plan's
    private files and objects;
    ``fs``: the filesystem decision (:func:`corral.fsplan.plan_filesystem`,
    which reads the workspace and the secrets present); ``home``: the home
    layer, if any (:func:`corral.home.plan_home`); ``cgroups``: the host's
    cgroup layout when a limit needs one (:func:`corral.cgroups.detect`);
    ``resolv_conf``: the host's /etc/resolv.conf with symlinks resolved and
    whether that file exists, or None without one (what corral's resolver file
    is bound over, for the tiers that bind it).
    """

    __slots__ = (
        "cgroups",
        "cwd",
        "environ",
        "fs",
        "gid",
        "groups",
        "home",
        "resolv_conf",
        "stdin_tty",
        "token",
        "uid",
    )

    def __init__(
        self,
        *,
        environ: Mapping[str, str] | None = None,
        cwd: str = "",
        uid: int = 1000,
        gid: int = 1000,
        groups: tuple[int, ...] = (),
        stdin_tty: bool = False,
        token: str = "000000000000",
        fs: FsPlan | None = None,
        home: HomeLayer | None = None,
        cgroups: CgroupHost | None = None,
        resolv_conf: tuple[str, bool] | None = None,
    ) -> None:
        self.environ = dict(environ) if environ is not None else {"PATH": "/usr/bin:/bin"}
        self.cwd = cwd
        self.uid = uid
        self.gid = gid
        self.groups = groups
        self.stdin_tty = stdin_tty
        self.token = token
        self.fs = fs
        self.home = home
        self.cgroups = cgroups
        self.resolv_conf = resolv_conf

    def cgroup_layout(self) -> CgroupHost:
        """The host's cgroup layout; none at all when it was not gathered (a limit
        that needs a cgroup is then refused or, for a default, not enforced)."""
        if self.cgroups is None:
            from corral.cgroups import CgroupHost

            return CgroupHost()
        return self.cgroups


def gather_common(policy: Policy, facts: HostFacts) -> HostFacts:
    """Fill ``facts`` with what every tier reads from this host the same way; each
    tier's ``gather()`` adds the filesystem decision and its own facts."""
    from corral import cgroups

    facts.environ = dict(os.environ)
    try:
        facts.cwd = os.path.realpath(os.getcwd())
    except OSError:
        facts.cwd = ""
    facts.uid, facts.gid = os.getuid(), os.getgid()
    facts.token = os.urandom(6).hex()
    if cgroups.wanted(policy.limits):
        facts.cgroups = cgroups.detect()
    if os.path.lexists("/etc/resolv.conf"):
        facts.resolv_conf = os.path.realpath("/etc/resolv.conf"), os.path.exists("/etc/resolv.conf")
    return facts


class Health:
    __slots__ = ("available", "details", "reason")

    def __init__(self, available: bool, reason: str, details: dict[str, object] | None = None):
        self.available = available
        self.reason = reason  # one line a person can act on
        self.details = details or {}

    def to_dict(self) -> dict[str, object]:
        return {"available": self.available, "reason": self.reason, **self.details}


class LaunchStrategy:
    """How one tier's plans are started, watched, stopped and cleaned up.

    A tier names its strategy class (``Tier.strategy``); its ``plan()`` puts an
    instance holding whatever only that tier needs (bwrap's network namespace,
    a Landlock ruleset, a container's removal command, a VM's sockets) in
    ``plan.strategy``.  Callers read the class attributes below before any plan
    exists (``tier.strategy.lazy``); they never compare a tier's name.

    What the launcher (:mod:`corral.launch`) does for every tier, in order:

    1. ``Aftercare(plan)``: the cgroup (``plan.cgroup``), the private directory
       ``plan.scratch`` with the files ``plan.prepare`` lists, the home layer,
       the snapshot of ``plan.restore``, the lock watch; and a guardian process
       if any of those, or :meth:`needs_guardian`, must be undone after a
       ``kill -9`` of corral.
    2. The descriptors ``plan.fds`` names ("status", "seccomp", "empty", "pass").
    3. ``corral run`` only: :meth:`enter`, in corral's own process (its work may
       have begun beside the planning, in :meth:`ahead`).
    4. :meth:`spawn` -> a pid: the process whose exit is the sandbox's end.
    5. The output pump: stdout/stderr relayed and bounded; on the timeout, a
       forwarded SIGINT/SIGTERM/SIGHUP or ``Sandbox.close()``: :meth:`stop`.
    6. The pid reaped; the code (from a "status" pipe if the plan has one, else
       the wait status, shell style) passed through :meth:`exit_code`; the
       limits hit are the cgroup's plus :meth:`limits_hit`.
    7. :meth:`cleanup`, then the common undoing (cgroup, quarantine, restore,
       scratch, home).  If corral was killed, the guardian calls
       :meth:`cleanup` (``clean=False``), waits for the pid to end, and undoes
       the rest.

    ``Sandbox`` (the long-lived API) starts the plan of ``tier.python_argv()
    + ["-I", "-S", "/run/corral/agent.py"]`` with ``extra=[agent bind]``, its
    stdin and stdout one end of a socket pair and stderr a pipe, through
    ``corral.launch.start`` (steps 1, 2, 4; no :meth:`enter`: :meth:`spawn`
    gets ``entered=False`` and does any such step in the child).  The agent's
    first frame ("ready") says the sandbox is up.  ``close()`` asks the agent to
    shut down, waits up to :attr:`close_grace` seconds, then steps 5-7.

    The defaults are a plain process: fork (or posix_spawn), join the cgroup,
    change to ``plan.cwd``, exec ``plan.argv`` with ``plan.env``; killed by its
    process group; nothing of its own to remove.
    """

    # -- what callers ask before any plan exists (class attributes) ------------
    confines = True  # False: no sandbox at all (tier none): no door, no Sandbox, no shell
    lazy = False  # Sandbox starts it on first use, and again after it died
    shell = ""  # why `corral shell` cannot run on this tier ("" when it can)
    # corral shell's terminal is made inside (shell_command's relay): what corral
    # gives the sandbox is pipes, the input framed (corral.shell._run_relayed)
    own_terminal = False
    close_grace = 0.0  # seconds Sandbox.close() lets the agent's exit end it first
    agent_fds = True  # the agent's socket is ours end to end: descriptors cross it
    warning = ""  # printed on stderr before every run (tier none's warning)

    @classmethod
    def shell_command(cls, shell: list[str], python: list[str]) -> list[str]:
        """The command of ``corral shell`` (corral.shell): on corral's pty, made
        the shell's controlling terminal inside; or, with ``own_terminal``, behind
        the relay that makes one inside."""
        from corral import shell as pty_shell

        if cls.own_terminal:
            return pty_shell.relayed(shell, python)
        return pty_shell.command(shell, python)

    @classmethod
    def ahead(cls, policy: Policy) -> None:
        """For ``corral run``, once the tier is chosen and before the plan is made:
        start setup that :meth:`enter` will need and that can proceed beside the
        planning (bwrap's: the network namespace).  What fails is left to
        :meth:`enter`, which says why."""

    def enter(self, plan: Plan) -> Resolver | None:
        """In corral's own process just before :meth:`spawn`, for ``corral run``
        (whose process serves this one sandbox): e.g. move into the sandbox's new
        network namespace.  Returns a resolver the output pump must serve, or
        None.  Raises SetupError with one line a person can act on."""
        return None

    def spawn(
        self, plan: Plan, child_fds: dict[int, int], procs_files: list[str], entered: bool
    ) -> int:
        """Start ``plan``; return the pid of a child of this process whose exit is
        the sandbox's end, in a new session (its own process group).

        ``child_fds``: descriptor number in the child -> our descriptor (0, 1, 2
        and the numbers of ``plan.fds``); nothing else may cross.  ``procs_files``:
        cgroup.procs files the child joins before the command runs.  ``entered``:
        :meth:`enter` ran in this process.  A failure inside the child before the
        command runs exits 125 with one line on its stderr; a command that cannot
        be executed exits 127 (not found) or 126, as a shell would."""
        from corral import launch

        return launch.spawn_process(plan, child_fds, procs_files, chdir=True)

    def stop(self, plan: Plan, pid: int) -> None:
        """Kill the whole tree at once, without waiting (the timeout, a forwarded
        signal, ``Sandbox.close()``).  ``pid`` is :meth:`spawn`'s; the launcher
        reaps it.  Never raises."""
        try:
            os.killpg(pid, 9)  # SIGKILL; its own process group (a new session)
        except OSError:
            pass

    def exit_code(self, plan: Plan, code: int) -> int:
        """The command's exit code from what the launcher found: the "status" pipe's
        exit-code if the plan has one, else the pid's wait status as a shell says it
        (128+N for a signal).  A tier whose command's code travels another way (a
        guest kernel's) returns that instead."""
        return code

    def limits_hit(self, plan: Plan) -> list[str]:
        """Limit names hit that the launcher's cgroup cannot see ("memory", "pids"),
        e.g. from a file written inside.  Called after the pid is reaped."""
        return []

    def needs_guardian(self) -> bool:
        """Whether :meth:`cleanup` has work to do if corral is killed (something
        that outlives corral's process: a container, a VM)."""
        return False

    def cleanup(self, plan: Plan, clean: bool, pid: int = 0) -> None:
        """Remove what only this kind of sandbox made, once the pid is gone (or, from
        the guardian after corral was killed, before waiting for it: then ``pid``
        is the launched process, if the guardian had heard of it).  ``clean``:
        the sandbox ended on its own, nothing is left to remove by force.  Runs in
        the guardian too, so: idempotent, bounded in time, never raises."""

    def describe(self) -> list[str]:
        """Lines ``--explain`` prints for what only this strategy holds."""
        return []

    def cannot_run_where(self) -> str:
        """Where a command that cannot be executed was looked for, for its message."""
        return " in the sandbox"


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
        "env",
        "fds",
        "hardlinks",
        "home",
        "lock_watch",
        "mounts",
        "notes",
        "policy",
        "prepare",
        "quarantine",
        "repositories",
        "restore",
        "scratch",
        "seccomp",
        "strategy",
        "tier",
    )

    def __init__(self, tier: str, policy: Policy) -> None:
        self.tier = tier
        self.policy = policy
        # how it is started, stopped and cleaned up, with its tier's own data
        self.strategy: LaunchStrategy = LaunchStrategy()
        self.argv: list[str] = []
        self.env: dict[str, str] = {}
        self.cwd = policy.workspace
        self.mounts: list[Mount] = []
        self.seccomp: tuple[SyscallRule, ...] = ()
        self.cgroup: CgroupPlan | None = None
        self.bounds: dict[str, Bound] = {}  # each limit: value, where from, enforced or not
        self.fds: dict[int, str] = {}
        self.quarantine: list[str] = []
        # the workspace's repositories at launch (FsPlan.repositories): the ones a
        # run makes are looked at after it (corral.gitguard)
        self.repositories: Repositories | None = None
        # where $HOME points, made and seeded by the launcher (corral.home)
        self.home: HomeLayer | None = None
        # read-only files git writes through a lock file beside them: directory ->
        # {lock name: protected path}, watched during the run (corral.lockwatch)
        self.lock_watch: dict[str, dict[str, str]] = {}
        self.hardlinks: list[str] = []  # files made read-only: may share content outside
        # write-deny paths and secrets inside writable places, checked after the run
        # (corral.restore): path -> "write-deny" or "read-deny" (tiers without
        # mounts: content put back; a secret's other names taken out too) or
        # "in-place" (mount tiers: moved back if a renamed directory carried it);
        # a private directory the launcher creates (and fills: ``prepare``)
        self.restore: dict[str, str] = {}
        self.scratch: str | None = None
        self.notes: list[str] = []
        self.prepare: list[tuple[str, bytes, int]] = []  # files made in scratch: name, data, mode

    def describe(self) -> str:
        """A human-readable account of the plan; never prints environment values."""
        lines = [f"tier: {self.tier}", f"workspace: {self.policy.workspace}", f"cwd: {self.cwd}"]
        lines.insert(2, f"policy file: {self.policy.source or 'none (built-in defaults)'}")
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
        if self.scratch:
            lines.append(f"scratch (private, removed after the run): {self.scratch}")
        kept = [p for p, rule in self.restore.items() if rule == "in-place"]
        undone = [(p, rule) for p, rule in self.restore.items() if rule != "in-place"]
        if undone:
            lines.append("snapshotted at launch, restored after the run if changed:")
            lines.extend(f"  {p} ({rule})" for p, rule in undone)
        if kept:
            lines.append("kept in place (moved back if a directory the run renames carries one):")
            lines.extend(f"  {p}" for p in kept)
        lines.extend(self.strategy.describe())
        lines.extend(network_lines(self.policy))
        if self.seccomp:
            asks = any(r.notify for r in self.seccomp)
            supervised = ", or goes to corral's supervisor, which answers" if asks else ""
            lines.append(
                f"seccomp (each call below fails with that errno{supervised}; all others allowed):"
            )
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
    return lines + governing_lines(policy)


def governing_lines(policy: Policy) -> list[str]:
    """What the proxy governs beyond hosts, as ``--explain`` prints it: method and
    path rules, secrets (where each real value comes from and goes, never the
    value), guardrails and TLS inspection."""
    net = policy.network
    lines = [f"  rule network.rules[{i}]: {_rule_text(e)}" for i, e in enumerate(net.rules, 1)]
    if any(e.get("action") == "ask" for e in net.rules) or policy.guardrails.dirs:
        lines.append(f"  asks wait at most {net.ask_timeout:g}s for corral approve / deny")
    for name, secret in sorted(policy.secrets.items()):
        into = f"into {secret.header}: {secret.format}" if secret.header else "where it is"
        lines.append(
            f"  secret {name}: ${name} holds a placeholder; the proxy puts the value from "
            f"{secret.source} {into} on requests to {', '.join(secret.hosts)} only"
        )
    guard = policy.guardrails
    for directory in guard.dirs:
        count = "" if guard.files is None else f" ({len(guard.files)} files read)"
        lines.append(f"  guardrails: {directory}{count}")
    if guard.dirs:
        lines.append("  guardrail tiers: " + ", ".join(f"{k} {v}" for k, v in guard.tiers.items()))
    tls = policy.tls
    if tls.inspect:
        lines.append(f"  tls inspect: {', '.join(tls.inspect)}")
    if tls.passthrough:
        lines.append(f"  tls passthrough (never intercepted): {', '.join(tls.passthrough)}")
    if net.rules or policy.secrets or guard.dirs or tls.inspect:
        lines.append(
            "  HTTPS to a host these name is intercepted with corral's CA; any other stays "
            "an opaque tunnel"
        )
    return lines


def _rule_text(entry: dict[str, object]) -> str:
    """One [[network.rules]] entry in a line: host, then what it allows or refuses."""
    parts = [f"host {entry.get('host')}"]
    if entry.get("git"):
        parts.append(f"git {entry['git']}")
    for key in ("methods", "paths"):
        value = entry.get(key)
        if isinstance(value, list) and value:
            parts.append(f"{key} {', '.join(map(str, value))}")
    if entry.get("max_body") is not None:
        parts.append(f"max_body {entry['max_body']}")
    return f"{entry.get('action', 'allow')}: " + "; ".join(parts)


class Tier:
    """Base class: subclasses set ``name``, ``strength`` and ``summary``."""

    name = ""
    strength = 0  # auto picks the highest available; 0 means never picked by auto
    summary = ""
    # How the sandbox reaches the proxy: "unix" (a socket bound in; plan() gets its
    # path) or "tcp" (a loopback port; plan() gets "127.0.0.1:PORT").
    door_transport = "unix"
    # whether [container] (engine, OCI runtime, image) means anything to it
    uses_container = False
    # how its plans are started, stopped and cleaned up (see LaunchStrategy)
    strategy: type[LaunchStrategy] = LaunchStrategy

    def gather(self, policy: Policy, agent: bool = False) -> HostFacts:
        """Read what :meth:`plan` needs to know about this host, once, with a fresh
        token each call (the caller's job: ``corral run``, each ``Sandbox`` start).
        Tiers that need more extend this and return their own subclass.
        ``agent``: the plan will be a Sandbox's agent (a tier may read more for it)."""
        del agent
        return gather_common(policy, HostFacts())

    def health(self, probe: bool = False) -> Health:
        """Can this tier run here?  ``probe`` may launch a tiny test sandbox (doctor)."""
        raise NotImplementedError

    def health_for(self, policy: Policy | None, probe: bool = False) -> Health:
        """Like health(), for the choices a policy makes (the container tier's engine)."""
        return self.health(probe)

    def limits_engine(self) -> tuple[str, str] | None:
        """For ``corral doctor``: the program that enforces limits for this tier and
        why it cannot for this user ("" if it can), when that is not corral's own
        cgroup (a container engine); None otherwise."""
        return None

    def reset_dirs(self, plan: Plan) -> list[str] | None:
        """What ``Sandbox.reset`` empties to give a long-lived sandbox back fresh,
        or None if this tier's sandboxes cannot be reset: that needs a sandbox that
        is its own pid namespace holding only the agent and what it ran (so every
        other process can go), its own IPC namespace (every System V object in it
        is removed) and private temporary directories."""
        return None

    def agent_command(self) -> list[str]:
        """How ``Sandbox`` starts corral's agent inside (bound at SANDBOX_AGENT).  A
        tier may start it differently from another command: the namespace tier
        makes it the sandbox's pid 1, with no other process above it to spare."""
        return [*self.python_argv(), "-I", "-S", SANDBOX_AGENT]

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
        host: HostFacts | None = None,
    ) -> Plan:
        """What would run ``command`` under ``policy`` on the host ``host`` describes
        (from :meth:`gather`; gathered here when None); reads nothing else.
        ``door`` is the proxy's address when ``policy.network.mode`` is "proxy"
        (see ``door_transport``); ``extra`` are corral's own files to bind in
        (the long-lived sandbox's agent); ``pass_fds`` are the caller's
        descriptors (numbers above 2) the user asked to hand to the command at
        the same numbers; ``net`` is what the run's door
        adds inside beside its address (corral's CA bundle when this run can
        intercept TLS, hooks' variables: :mod:`corral.net.trust`)."""
        raise NotImplementedError(f"tier {self.name} cannot run commands yet")
