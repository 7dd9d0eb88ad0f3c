"""The namespace tier: bubblewrap with every namespace, a seccomp filter and cgroup limits.

``plan()`` maps the policy onto bwrap's argv; nothing here launches anything
except ``health(probe=True)``, which runs one tiny sandbox to prove user
namespaces really work on this host.
"""

from __future__ import annotations

import os

from corral import environ, fsplan
from corral.fsplan import SOCKET_MASK, Mount
from corral.tiers.base import (
    SANDBOX_AGENT,
    Health,
    HostFacts,
    LaunchStrategy,
    Plan,
    Tier,
    gather_common,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection, Iterator, Sequence
    from typing import Any

    from corral.net.trust import NetExtras
    from corral.netns import NetPlan, Resolver
    from corral.policy import Limits, Policy

FD_STATUS = 3  # bwrap's --json-status-fd: tells setup failure from the command's exit
FD_SECCOMP = 4  # the compiled filter
FD_EMPTY = 5  # first of one /dev/null fd per file mask: bwrap consumes each data fd

# Namespaces and hardening that do not depend on the policy.
HARDENING = (
    "--unshare-user",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-net",
    "--unshare-cgroup",
    "--disable-userns",  # no nested user namespaces, enforced by bwrap in the kernel
    "--die-with-parent",  # corral killed -> everything inside killed
    "--new-session",  # setsid: no TIOCSTI into the caller's terminal (CVE-2017-5226)
    "--cap-drop",
    "ALL",
    "--hostname",
    "corral",
)


def find_bwrap(path: str | None = None) -> str | None:
    """bwrap on ``path`` (a PATH value; corral's own when None), or in /usr/bin, /bin."""
    if path is None:
        path = os.environ.get("PATH", "")
    for d in [*path.split(":"), "/usr/bin", "/bin"]:
        if not os.path.isabs(d):
            continue  # "" or "." would run a bwrap planted in the (writable) workspace
        candidate = os.path.join(d, "bwrap")
        if os.access(candidate, os.X_OK):
            return candidate
    return None


# Variables the dynamic loader and libc act on in any program they start (glibc's
# "unsecure" list, which a set-ID program ignores; bwrap is not one here).
LOADER_NAMES = frozenset(
    [
        "GCONV_PATH",
        "GETCONF_DIR",
        "GLIBC_TUNABLES",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "MALLOC_TRACE",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
        "TZDIR",
    ]
)


def loader_settings(env: dict[str, str]) -> list[str]:
    """Take the loader's variables (LD_*, LOADER_NAMES) out of ``env``, the
    environment bwrap is started with, and give them to the command through
    bwrap's ``--setenv``: bwrap runs on the host before any namespace exists,
    and an ``LD_PRELOAD`` or ``LD_LIBRARY_PATH`` the policy set or passed made it
    load a library an earlier run had put in the workspace (found by attacking
    corral).  Their values, paths, are then in bwrap's argv."""
    names = sorted(n for n in env if n.startswith("LD_") or n in LOADER_NAMES)
    args: list[str] = []
    for name in names:
        args += ["--setenv", name, env.pop(name)]
    return args


def own_fd_numbers(pass_fds: Collection[int] = ()) -> Iterator[int]:
    """Numbers for bwrap's own descriptors, from 3 up, around those the user passes
    through: status, seccomp, then one per file mask."""
    number = FD_STATUS
    while True:
        if number not in pass_fds:
            yield number
        number += 1


def mount_args(
    mounts: list[Mount],
    numbers: Iterator[int] | None = None,
    sizes: dict[str, int] | None = None,
) -> tuple[list[str], dict[int, str]]:
    """bwrap arguments for each mount operation, in order, and the descriptors they
    use (taken from ``numbers``; from FD_EMPTY up by default), each with what the
    launcher puts there: ``"empty"`` (a mask's content) or a bind source below a
    writable path (:func:`source_spec`).  ``sizes`` bounds the tmpfs mounted at
    those paths (bytes)."""
    if numbers is None:
        numbers = own_fd_numbers(range(FD_STATUS, FD_EMPTY))
    args: list[str] = []
    fds: dict[int, str] = {}
    sizes = sizes or {}
    in_snapshot = snapshot_masks(mounts)
    roots = writable_roots(mounts)
    for m in mounts:
        if m in in_snapshot:
            # an empty mode-000 entry made in the snapshot's tmpfs: no mount of its
            # own, and read-only (even to chmod) once the snapshot is remounted
            args += ["--perms", "0000"]
            if m.kind == "mask-dir":
                args += ["--dir", m.dest]
            else:
                fd = next(numbers)
                fds[fd] = "empty"
                args += ["--file", str(fd), m.dest]
            continue
        if m.kind in ("ro-bind", "bind"):
            args += _bind_args(m, roots, numbers, fds)
        elif m.kind == "tmpfs":
            if m.dest in sizes:
                args += ["--size", str(sizes[m.dest])]
            args += ["--tmpfs", m.dest]
        elif m.kind == "dev":
            args += ["--dev", m.dest]
        elif m.kind == "proc":
            args += ["--proc", m.dest, *_INIT_MEMORY_MASKS]
        elif m.kind == "symlink":
            args += ["--symlink", m.src or "", m.dest]
        elif m.kind == "mask-dir":
            # An empty, private, mode-000 tmpfs, read-only at once: nothing in it to
            # read, and its owner (the sandbox) cannot chmod it open to fill it
            # (a tmpfs not remounted takes half the host's RAM, and inodes beyond)
            args += ["--perms", "0000", "--size", "4096", "--tmpfs", m.dest]
            args += ["--remount-ro", m.dest]
        elif m.kind == "mask-file":
            fd = next(numbers)
            fds[fd] = "empty"
            args += ["--perms", "0000", "--ro-bind-data", str(fd), m.dest]
        elif m.kind == "remount-ro":
            args += ["--remount-ro", m.dest]
        elif m.kind == "mqueue":
            args += ["--mqueue", m.dest]
        else:  # a new kind must be taught here before it can be used
            raise ValueError(f"unknown mount kind {m.kind!r}")
    return args, fds


# A bind's source below a writable path is bound from a descriptor the launcher
# opens (:func:`open_source`), not by name: bwrap resolves a name when it mounts,
# through symlinks, some time after corral looked, and another run in the same
# workspace can swap a protected directory (sub/.vscode) for a link to
# ../../../etc in between: the host's /etc, bound over the sandbox's, put its
# /etc/shadow back over corral's mask.
SOURCE = "source"


def writable_roots(mounts: list[Mount]) -> list[str]:
    """The sources of writable binds, outermost first."""
    return sorted({m.src or m.dest for m in mounts if m.kind == "bind"}, key=len)


def _bind_args(
    m: Mount, roots: list[str], numbers: Iterator[int], fds: dict[int, str]
) -> list[str]:
    src = m.src or m.dest
    root = next((r for r in roots if src.startswith(r.rstrip("/") + "/")), None)
    if root is None:
        return ["--ro-bind" if m.kind == "ro-bind" else "--bind", src, m.dest]
    fd = next(numbers)
    fds[fd] = source_spec(root, src)
    return ["--ro-bind-fd" if m.kind == "ro-bind" else "--bind-fd", str(fd), m.dest]


def source_spec(root: str, src: str) -> str:
    """What ``plan.fds`` says for a bind source: ``source``, the writable root it
    lies below and its path, NUL-separated (no path holds a NUL)."""
    return f"{SOURCE}\0{root}\0{src}"


def open_source(spec: str) -> int:
    """The source a :func:`source_spec` names, opened O_PATH one component at a time
    from its root, no symlink followed: SetupRaced (plan again) if the path no
    longer leads there without one."""
    from corral.errors import SetupRaced

    _, root, src = spec.split("\0")
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in os.path.relpath(src, root).split("/"):
            try:
                step = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                raise SetupRaced(f"{src}: {exc.strerror} (changed during setup)") from None
            os.close(fd)
            fd = step
            if _is_link(fd):
                raise SetupRaced(f"{src}: a symlink now (changed during setup)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(fd: int) -> bool:
    import stat

    return stat.S_ISLNK(os.fstat(fd).st_mode)


def snapshot_masks(mounts: list[Mount]) -> list[Mount]:
    """The masks that stand directly in a snapshot (a tmpfs remounted read-only at
    the end) with no other mount at or under them: bwrap need not mount them."""
    tmpfs = {m.dest for m in mounts if m.kind == "tmpfs"}
    snapshots = {m.dest for m in mounts if m.kind == "remount-ro"} & tmpfs
    found = []
    for m in mounts:
        if m.kind not in ("mask-dir", "mask-file") or os.path.dirname(m.dest) not in snapshots:
            continue
        prefix = m.dest + "/"
        if not any(o is not m and (o.dest == m.dest or o.dest.startswith(prefix)) for o in mounts):
            found.append(m)
    return found


def scratch_sizes(limits: Limits) -> dict[str, int]:
    """The size of each private tmpfs (fsplan.PRIVATE_TMP); a lifted one is left out."""
    from corral.bounds import RUN_SIZE

    sizes = {"/run": RUN_SIZE}
    for dest, name in (("/tmp", "tmp"), ("/var/tmp", "tmp"), ("/dev/shm", "shm")):
        value = limits.get(name)
        if value is not None:
            sizes[dest] = int(value)
    return sizes


def inside_python() -> str:
    """A Python the sandbox can see for the relay: this one unless it lives in a
    directory the sandbox replaces with a private tmpfs."""
    import sys

    real = os.path.realpath(sys.executable)
    if not any(real.startswith(t + "/") for t in fsplan.PRIVATE_TMP):
        return real
    return "/usr/bin/python3"


# what a reset empties: the private tmpfs (/run too: a command may leave files
# there; corral's own under /run/corral are a read-only mount it skips) and
# the sandbox's POSIX message queues
RESET_TMP = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/dev/mqueue")
OWN_RUN = "/run/corral"  # corral's files inside (the agent, the CA bundle)


def own_mounts(mounts: list[Mount]) -> list[Mount]:
    """``mounts`` with the sandbox's own POSIX message queue filesystem after /dev
    (so a reset can list and remove what a command queued), and /run/corral, when
    something is bound in it, a tmpfs of its own made read-only after the binds:
    a command cannot rename it away and put its own agent or CA bundle there."""
    out: list[Mount] = []
    sealed = False  # /run/corral is its own tmpfs already
    for m in mounts:
        if m.dest.startswith(OWN_RUN + "/") and not sealed:
            out.append(Mount("tmpfs", OWN_RUN, why="corral's own files: read-only below"))
            sealed = True
        out.append(m)
        if m.kind == "dev" and m.dest == "/dev":
            out.append(Mount("mqueue", "/dev/mqueue", why="the sandbox's own POSIX queues"))
    if sealed:
        out.append(Mount("remount-ro", OWN_RUN, why="corral's own files"))
    # /dev and the tmpfs over the host's interfaces, read-only once everything is
    # mounted: a reset empties the scratch mounts only, and a job replaced /dev/fd and
    # /dev/stderr with its own for the next job to use (found by attacking warm
    # sandboxes).  /dev/shm, /dev/mqueue and /dev/pts are mounts of their own: writable.
    for m in mounts:
        if (m.kind == "dev" and m.dest == "/dev") or (
            m.kind == "tmpfs" and m.dest.startswith("/sys/")
        ):
            out.append(Mount("remount-ro", m.dest, why="no file a job leaves here stays"))
    return out


class Bwrap(LaunchStrategy):
    """bubblewrap, spawned directly; it changes to the working directory inside
    (--chdir) and reports its child and the command's exit code on the "status"
    pipe.  ``netns``: the network namespace corral makes for it (see
    corral.netns): ``corral run`` moves its own process into it first
    (:meth:`enter`), a long-lived sandbox's child does so before the exec.
    ``--die-with-parent`` and the pid namespace take the tree down with it."""

    def __init__(self, netns: NetPlan | None = None) -> None:
        self.netns = netns

    @classmethod
    def ahead(cls, policy: Policy) -> None:
        """Start making the namespace of the run (with a network or without)."""
        from corral import netns

        netns.make_ahead()  # (what fails there, enter does again and says why)

    def enter(self, plan: Plan) -> Resolver | None:
        """Move this process into the sandbox's new network namespace; the resolver
        to serve if the sandbox has no network."""
        if self.netns is None:
            return None
        from corral import netns
        from corral.errors import SetupError

        try:
            held = netns.enter(self.netns)
        except OSError as exc:
            raise SetupError(
                f"the {plan.tier} sandbox's network could not be set up: {exc}"
            ) from None
        return netns.Resolver(held) if held else None

    def spawn(
        self, plan: Plan, child_fds: dict[int, int], procs_files: list[str], entered: bool
    ) -> int:
        from corral import launch

        if self.netns is None or entered:
            plan.argv = without_gone_sockets(plan.argv, plan.mounts)
            return launch.spawn_process(plan, child_fds, procs_files, chdir=False)

        def before() -> None:  # in the forked child: the last look comes after the namespace
            self._enter_in_child()
            plan.argv = without_gone_sockets(plan.argv, plan.mounts)

        return launch.spawn_process(plan, child_fds, procs_files, chdir=False, before_exec=before)

    def _enter_in_child(self) -> None:
        from corral import netns
        from corral.errors import SetupError

        assert self.netns is not None
        try:
            netns.enter(self.netns)
        except Exception as exc:
            raise SetupError(f"network: {exc}") from None

    def describe(self) -> list[str]:
        return self.netns.describe() if self.netns is not None else []


# Pid 1 inside is bwrap's own init, which runs as the command's uid: a command that
# wrote its memory (/proc/1/mem; ptrace and process_vm_writev are refused by seccomp)
# could turn off its parent-death signal and have the sandbox outlive corral.  Bound
# over with /dev/null, read-only: the init's memory is out of reach.
_INIT_MEMORY_MASKS = tuple(
    arg for mem in ("1/mem", "1/task/1/mem") for arg in ("--ro-bind", "/dev/null", f"/proc/{mem}")
)


def without_gone_sockets(argv: list[str], mounts: list[Mount]) -> list[str]:
    """bwrap's argv less the masks of host sockets gone since the plan was made
    (looked at now, just before bwrap starts).  Nothing is left there to hide, and
    bwrap would fail making the mask's mount point in a read-only parent: with
    sockets coming and going on the host (other runs' doors), most of a
    Sandbox's setup attempts did.  A socket bound there after this look is not
    masked, as one bound after the plan never was."""
    gone = {m.dest for m in mounts if m.why == SOCKET_MASK and not os.path.lexists(m.dest)}
    if not gone:
        return argv
    out: list[str] = []
    i = 0
    while i < len(argv):  # (a mask-file: --perms 0000 --ro-bind-data FD DEST)
        if argv[i : i + 3] == _MASK_FILE and i + 4 < len(argv) and argv[i + 4] in gone:
            i += 5
            continue
        out.append(argv[i])
        i += 1
    return out


_MASK_FILE = ["--perms", "0000", "--ro-bind-data"]


class NamespaceFacts(HostFacts):
    """The namespace tier's host: bwrap's path (None when missing) and why
    transparent capture cannot run here (None when it can, or was not asked
    for)."""

    __slots__ = ("bwrap", "transparent")

    def __init__(
        self,
        *,
        bwrap: str | None = "/usr/bin/bwrap",
        transparent: str | None = None,
        **common: Any,
    ) -> None:
        super().__init__(**common)
        self.bwrap = bwrap
        self.transparent = transparent


class NamespaceTier(Tier):
    name = "namespace"
    strength = 50
    summary = "bubblewrap: user, pid, ipc, uts, net, cgroup namespaces + seccomp + cgroups"
    door_transport = "netns"
    strategy = Bwrap

    def gather(self, policy: Policy, agent: bool = False) -> NamespaceFacts:
        from corral import home

        facts = NamespaceFacts()
        gather_common(policy, facts)
        facts.home = home.plan_home(policy)
        layer = facts.home
        facts.fs = fsplan.plan_filesystem(
            policy,
            home=layer.path if layer else None,
            capless_uid=os.geteuid(),
            environ=facts.environ,
        )
        facts.bwrap = find_bwrap(facts.environ.get("PATH", ""))
        if policy.network.mode == "proxy" and policy.network.transparent:
            from corral.net import transparent

            facts.transparent = transparent.unavailable()
        return facts

    def reset_dirs(self, plan: Plan) -> list[str] | None:
        """bwrap's own pid namespace holds the agent (its pid 1) and its commands
        alone (the proxy's sockets are held outside), and its IPC namespace is its
        own; /tmp, /var/tmp, /dev/shm and /run are the plan's private tmpfs, and
        /dev/mqueue its queues."""
        kinds = ("tmpfs", "mqueue")
        return [m.dest for m in plan.mounts if m.kind in kinds and m.dest in RESET_TMP]

    def _network(
        self,
        plan: Plan,
        policy: Policy,
        handoff: str | None,
        facts: NamespaceFacts,
        net: NetExtras | None = None,
    ) -> NetPlan:
        """corral makes the sandbox's network namespace (see corral.netns), and
        bwrap gets it instead of making one.  Without a network: loopback only,
        and a resolver that refuses every name and records it.  With one: the
        proxy's ports, the resolver and the allowed host services listen inside,
        held by the proxy; no process of ours runs inside."""
        from corral import netns

        if policy.network.mode != "proxy":
            made = netns.offline_plan()
        else:
            if handoff is None:
                raise ValueError("network mode proxy needs the door's handoff socket")
            if policy.network.transparent and facts.transparent:
                from corral.errors import RefusedError

                raise RefusedError(facts.transparent)
            made, notes = netns.plan_for(policy, handoff)
            plan.notes = [*plan.notes, *notes]
            from corral.net import door as doors

            # the policy's own [env] values win over the proxy defaults
            plan.env = {**doors.proxy_env(), **plan.env}
            if net is not None:  # corral's CA, inside and over the system bundles
                from corral.net import trust

                plan.mounts = [*plan.mounts, *trust.trust_mounts(net)]
                plan.env = trust.sandbox_env(
                    net, plan.env, trust.INSIDE_BUNDLE, policy.env.set_values
                )
        target = netns.resolv_target(facts.resolv_conf, fsplan.PRIVATE_TMP)
        if target is not None:
            plan.mounts = [
                *plan.mounts,
                Mount("ro-bind", target, netns.resolv_conf(), "the sandbox's resolver"),
            ]
        return made

    def health(self, probe: bool = False) -> Health:
        bwrap = find_bwrap()
        if bwrap is None:
            return Health(
                False, "bwrap not found on PATH (Debian/Ubuntu: apt-get install bubblewrap)"
            )
        try:
            with open("/proc/sys/user/max_user_namespaces", encoding="utf-8") as fh:
                if int(fh.read().strip() or "0") == 0:
                    return Health(
                        False,
                        "user namespaces are disabled (/proc/sys/user/max_user_namespaces is 0)",
                    )
        except (OSError, ValueError):
            pass
        try:
            with open("/proc/sys/kernel/unprivileged_userns_clone", encoding="utf-8") as fh:
                if fh.read().strip() == "0" and os.geteuid() != 0:
                    return Health(
                        False,
                        "unprivileged user namespaces are disabled "
                        "(kernel.unprivileged_userns_clone = 0)",
                    )
        except OSError:
            pass
        details: dict[str, object] = {"bwrap": bwrap}
        if probe:
            import subprocess

            try:
                out = subprocess.run(
                    [bwrap, *HARDENING, "--ro-bind", "/", "/", "--proc", "/proc", "true"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                    env={},
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                return Health(False, f"bwrap probe failed: {exc}", details)
            if out.returncode != 0:
                msg = out.stderr.strip().splitlines()[-1:] or [f"exit {out.returncode}"]
                return Health(False, f"bwrap cannot create namespaces here: {msg[0]}", details)
        return Health(True, f"bwrap at {bwrap}", details)

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
        from corral import bounds, seccomp

        facts = host if isinstance(host, NamespaceFacts) else self.gather(policy)
        plan = Plan(self.name, policy)
        layer = facts.home
        fs = facts.fs
        assert fs is not None
        plan.mounts = fs.mounts
        plan.quarantine = fs.quarantine
        plan.repositories = fs.repositories
        plan.restore = dict.fromkeys(fs.keep_in_place, "in-place")
        plan.notes = fs.notes
        plan.lock_watch = fs.lock_watch
        plan.hardlinks = fs.hardlinks
        plan.env = environ.sandbox_env(policy, facts.environ)
        loader = loader_settings(plan.env)
        if layer is not None:
            layer.secrets = frozenset(fs.read_deny)
            plan.home = layer
            plan.env["HOME"] = layer.path
        plan.cwd = environ.sandbox_cwd(policy, fs.writable, facts.cwd)
        plan.seccomp = (*seccomp.default_deny_rules(), *seccomp.other_process_rules())
        bounds.apply_cgroup(plan, policy.limits, facts.cgroup_layout())
        bounds.apply_scratch(plan, sized_by="tmpfs size")
        numbers = own_fd_numbers(pass_fds)
        status_fd, seccomp_fd = next(numbers), next(numbers)
        plan.fds = {status_fd: "status", seccomp_fd: "seccomp", **dict.fromkeys(pass_fds, "pass")}
        plan.strategy = Bwrap(self._network(plan, policy, door, facts, net))
        plan.mounts = own_mounts([*plan.mounts, *extra])
        mounts, mount_fds = mount_args(plan.mounts, numbers, scratch_sizes(policy.limits))
        plan.fds.update(mount_fds)
        bwrap = facts.bwrap or "bwrap"
        hardening = list(HARDENING)
        hardening.remove("--unshare-net")  # the launcher provides the network namespace
        if command[-1:] == [SANDBOX_AGENT] and list(command) == self.agent_command():
            # corral's agent is pid 1 (it reaps): no bwrap init above it that a
            # command could write itself into, to outlive a reset
            hardening.append("--as-pid-1")
        plan.argv = [
            bwrap,
            *hardening,
            "--json-status-fd",
            str(status_fd),
            "--seccomp",
            str(seccomp_fd),
            *mounts,
            *loader,
            "--chdir",
            plan.cwd,
            "--",
            *command,
        ]
        return plan
