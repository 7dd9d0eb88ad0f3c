"""The landlock tier: Landlock + seccomp + no capabilities, no namespaces at all.

For hosts that deny user namespaces (containers, hardened CI runners, some
AppArmor defaults).  ``plan()`` turns the policy into a Landlock ruleset
(:mod:`corral.landlock`), a seccomp deny list and the environment; the
launcher forks a reaper that confines the command (:mod:`corral.confine`).

It shares the host's process table, hostname, /tmp and network stack; what
that costs, and what corral does about it, is in :data:`DIFFERENCES`.
"""

from __future__ import annotations

import errno
import os

from corral import environ, fsplan
from corral.tiers.base import Health, HostFacts, LaunchStrategy, Plan, Tier, gather_common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from corral.chmodsup import Places
    from corral.fsplan import FsPlan, Mount
    from corral.landlock import Ruleset, Tree
    from corral.net.trust import NetExtras
    from corral.policy import Policy
    from corral.seccomp import SyscallRule

# What this tier does not hide compared with the namespace tier, and how corral
# compensates.  `corral doctor` prints these.
DIFFERENCES = (
    "host processes are visible in /proc (names and arguments; the numbers of their "
    "open descriptors); their memory, environment and files are not reachable "
    "(Landlock's ptrace scoping), signals to them are refused (signal scoping), and "
    "so is a change to their scheduling (CPUs, niceness, I/O priority: corral's "
    "supervisor lets it go on for the sandbox's own processes and threads only)",
    "no pseudo-terminal but the run's own: the host's other ptys (the user's other "
    "terminals) cannot be opened, and a new one cannot be made (os.openpty, script, "
    "expect: EACCES); `corral shell` gives the shell a pty corral made",
    "inotify works everywhere the sandbox can see, so it can tell when the user's "
    "programs open or read a file there, secrets included (their contents stay "
    "unreadable); the namespace tier hides those paths",
    "the hostname and the network stack are shared; TCP may connect only to the "
    "proxy's port (Landlock rules name ports, not addresses: a server elsewhere on "
    "that same port would be reachable), no TCP bind, no UDP or raw sockets and no "
    "stream protocol but TCP, such as MPTCP, which Landlock does not govern (seccomp)",
    "an allowed host service on loopback (--allow 127.0.0.1:8080) is reached only "
    "through the proxy (NO_PROXY leaves it out), not at its own address: a client "
    "that ignores proxy variables cannot reach it; name lookups are not answered "
    "(no resolver, and none are recorded)",
    "/tmp, /var/tmp, /run and /dev/shm are the host's: the sandbox cannot open, read or "
    "write what is in them (the names there can be listed); TMPDIR points at a private "
    "scratch directory removed after the run",
    "no unix sockets can be created (seccomp): a path unix socket is not covered by "
    "Landlock, and host daemons listen on them; socketpair() still works, but not of "
    "datagrams (a datagram socket can be sent from, or connected, to any path); no "
    "listen() (on a socket never bound, the kernel binds any port, on every address)",
    "no System V IPC (shmget, semget, msgget...) and no POSIX message queues (mq_open...): "
    "ENOSYS, their objects are the host's, found by key or name, and outlive the run; "
    "shared anonymous mappings and memfds work",
    "write-deny paths inside the workspace (git hooks and config, editor settings) "
    "can be changed during the run; corral restores them afterwards and reports it",
    "names inside secret directories can be listed, not read; a new file created "
    "beside a secret file in the workspace (e.g. next to .env) cannot be read back",
    "a secret in the workspace (.env, a read_deny path there) stays unreadable but can be "
    "renamed, hard-linked or rewritten during the run; after it corral puts it back from "
    "a snapshot taken at launch and takes its other names out (found by inode), so no "
    "later run reads it, and reports each (up to 16 MiB of secrets there; more is refused)",
    "chmod works only in the writable places (the workspace, writable paths, the home "
    "layer, the scratch directory): Landlock does not govern file modes, so corral's "
    "supervisor in the reaper decides each call on the file it names; chmod is refused "
    "(EPERM) outside them, on a secret or a file with more than one hard link there, "
    "with set-ID bits, through /proc/PID/ magic links (ELOOP), and if the supervisor is "
    "gone (ENOSYS); chown is refused everywhere, and so are extended attributes and "
    "ACLs (ENOTSUP: an ACL sets a mode too) and inode flags (chattr: ENOTTY, as on a file "
    "system without them)",
    "timestamps (touch, utimensat) of any file the sandbox can see can be changed, outside "
    "the workspace too: Landlock does not govern file times and seccomp cannot tell the "
    "paths apart (content, modes and owners stay protected; restored write-deny paths "
    "get their times back)",
    "a hard-linked file in the workspace is read-only, and a new file created directly in "
    "a directory on the way to it (the workspace root included) cannot be opened for "
    "writing in that run (Landlock rights follow directories)",
    "with TLS inspection, corral's CA is trusted through SSL_CERT_FILE, REQUESTS_CA_BUNDLE, "
    "CURL_CA_BUNDLE, NODE_EXTRA_CA_CERTS, PIP_CERT, GIT_SSL_CAINFO and AWS_CA_BUNDLE only: "
    "without mounts the system bundle (/etc/ssl/certs/ca-certificates.crt) stays the "
    "host's, so a tool that reads only that file rejects intercepted connections",
)

# What bounds the scratch space here (corral cannot mount a sized tmpfs without
# privileges this tier does without): `corral doctor` and --explain say it.
SCRATCH_BOUND = (
    "no private /tmp here; TMPDIR is a directory in the host's $TMPDIR or /tmp, "
    "bounded only by that filesystem's free space"
)

_AF_UNIX = 1
_AF_INET = 2
_AF_INET6 = 10
_SOCK_NOT_STREAM = 0xE  # any of these type bits: not SOCK_STREAM (1); flags sit higher
_SOCK_DGRAM = 0x2  # (of a unix pair's types, only SOCK_DGRAM has it: STREAM 1, SEQPACKET 5)
# System V IPC: no namespace of its own here, so its segments, semaphores and queues
# are the host's, found by key (the host's processes' memory, readable and writable
# with the same uid), and they outlive the run
_SYSV_IPC = (
    "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semtimedop", "semctl",
    "msgget", "msgsnd", "msgrcv", "msgctl",
)  # fmt: skip
# ... and POSIX message queues the same: the host's mqueue namespace, by name (a
# run could unlink a host process's queue, and one it made outlived the run)
_POSIX_MQUEUE = (
    "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
)  # fmt: skip
_IPPROTO_TCP = 6


# Landlock does not govern file metadata: without these, a file the sandbox may
# only read (but owns, as root owns /etc) could be made world-writable.  A mode
# change goes to corral's supervisor (corral.chmodsup), which allows it inside
# the writable places only; owners are refused everywhere.
MODE_CALLS = ("chmod", "fchmod", "fchmodat", "fchmodat2")
# Another process's scheduling: niceness and I/O priority (setpriority, ioprio_set:
# which, who) and CPUs and policy (sched_*: pid first).  Without a pid namespace
# a command reached the host's processes of its uid (pinned to one CPU, set idle:
# found by attacking corral); the supervisor lets a call on the sandbox's own
# processes and threads go on, and refuses any other.
SCHED_CALLS = ("sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr")
PRIORITY_CALLS = {"setpriority": (0, 1), "ioprio_set": (1, 2)}  # which: (process, group)
_OWNER_CALLS = ("chown", "fchown", "lchown", "fchownat")
# ... nor extended attributes: an ACL (system.posix_acl_access) is one, and setting
# it changes the file's mode, so a private file outside the workspace could be
# opened up to other users.  ENOTSUP: tools take it as a file system without them.
_XATTR_WRITES = (
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "setxattrat",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
    "removexattrat",
)

# ... nor ioctls on anything but devices, and these change a file's metadata for
# its owner through any descriptor, a read-only one included: inode flags (nodump
# hides a file from backups), extended flags, the generation number (NFS file
# handles), fs-verity (a file no one can write again) and an empty directory's
# encryption policy.  ENOTTY: what a file system without them answers.
_INODE_IOCTLS = {
    0x40086602: "FS_IOC_SETFLAGS",
    0x40087602: "FS_IOC_SETVERSION",
    0x40086604: "EXT4_IOC_SETVERSION",
    0x401C5820: "FS_IOC_FSSETXATTR",
    0x40806685: "FS_IOC_ENABLE_VERITY",
    0x800C6613: "FS_IOC_SET_ENCRYPTION_POLICY",
}


def extra_seccomp_rules() -> tuple[SyscallRule, ...]:
    """What Landlock leaves open here, closed by seccomp."""
    return (*_metadata_rules(), *_socket_rules(), *_ipc_rules(), *_scheduling_rules())


def _scheduling_rules() -> tuple[SyscallRule, ...]:
    """Another process's scheduling, to the supervisor (a process group's: refused);
    a process's own (pid 0) stays free."""
    from corral.seccomp import ArgCond, SyscallRule

    why = "another process's scheduling: the sandbox's own only (the supervisor decides)"
    rules = [
        SyscallRule(name, errno.EPERM, (ArgCond(0, "ne", 0),), why, notify=True)
        for name in SCHED_CALLS
    ]
    for name, (process, group) in PRIORITY_CALLS.items():
        rules.append(
            SyscallRule(
                name, errno.EPERM, (ArgCond(0, "eq", process), ArgCond(1, "ne", 0)), why, True
            )
        )
        rules.append(
            SyscallRule(
                name,
                errno.EPERM,
                (ArgCond(0, "eq", group), ArgCond(1, "ne", 0)),
                "the scheduling of another process group (the host's, maybe)",
            )
        )
    return tuple(rules)


def _metadata_rules() -> tuple[SyscallRule, ...]:
    """File modes (to the supervisor), owners, extended attributes, inode flags."""
    from corral.seccomp import ArgCond, SyscallRule

    modes = tuple(
        SyscallRule(
            name,
            errno.EPERM,
            (),
            "file modes: corral allows them in writable places only (Landlock does not)",
            notify=True,
        )
        for name in MODE_CALLS
    )
    owners = tuple(
        SyscallRule(name, errno.EPERM, (), "file owners: Landlock does not govern them")
        for name in _OWNER_CALLS
    )
    xattrs = tuple(
        SyscallRule(name, errno.EOPNOTSUPP, (), "extended attributes and ACLs (an ACL sets a mode)")
        for name in _XATTR_WRITES
    )
    inode = tuple(
        SyscallRule("ioctl", errno.ENOTTY, (ArgCond(1, "eq", request),), f"{name}: file metadata")
        for request, name in _INODE_IOCTLS.items()
    )
    by_path = SyscallRule(
        "file_setattr",
        errno.ENOSYS,
        (),
        "extended flags by path (Linux 6.17): callers fall back to the ioctl, refused too",
    )
    return (*modes, *owners, *xattrs, *inode, by_path)


def _socket_rules() -> tuple[SyscallRule, ...]:
    """Sockets Landlock does not govern: unix ones, datagram pairs, listen without a
    bind, UDP, raw, and stream protocols but TCP."""
    from corral.seccomp import ArgCond, SyscallRule

    eacces = errno.EACCES
    rules = [
        SyscallRule(
            "socket",
            eacces,
            (ArgCond(0, "eq", _AF_UNIX),),
            "unix sockets: connect() by path is not governed by Landlock",
        ),
        SyscallRule(
            "socketpair",
            eacces,
            (ArgCond(1, "bits_set", _SOCK_DGRAM),),
            "datagram socket pairs: either end can send to, or connect to, any unix "
            "socket path, which Landlock does not govern",
        ),
        SyscallRule(
            "listen",
            eacces,
            (),
            "listen(): on a socket never bound the kernel binds an ephemeral port on "
            "every address, which Landlock's bind rules do not see",
        ),
    ]
    for family, name in ((_AF_INET, "IPv4"), (_AF_INET6, "IPv6")):
        not_stream = (ArgCond(0, "eq", family), ArgCond(1, "bits_set", _SOCK_NOT_STREAM))
        rules.append(
            SyscallRule(
                "socket", eacces, not_stream, f"UDP and raw {name}: Landlock governs TCP only"
            )
        )
    # A stream socket of another protocol (MPTCP, SCTP, SMC) is not TCP to Landlock,
    # so it could connect and bind anywhere; MPTCP falls back to plain TCP with any
    # server.  EPROTONOSUPPORT, as where MPTCP is off: programs that try it first
    # (Go) fall back to TCP.
    rules += [
        SyscallRule(
            "socket",
            errno.EPROTONOSUPPORT,
            (ArgCond(0, "eq", family), ArgCond(2, "not_in", values=(0, _IPPROTO_TCP))),
            "stream protocols but TCP (MPTCP, SCTP): Landlock governs TCP only",
        )
        for family in (_AF_INET, _AF_INET6)
    ]
    return tuple(rules)


def _ipc_rules() -> tuple[SyscallRule, ...]:
    """System V IPC and POSIX message queues: the host's here."""
    from corral.seccomp import SyscallRule

    return (
        *(
            SyscallRule(name, errno.ENOSYS, (), "System V IPC: the host's objects, by key")
            for name in _SYSV_IPC
        ),
        *(
            SyscallRule(name, errno.ENOSYS, (), "POSIX message queues: the host's, by name")
            for name in _POSIX_MQUEUE
        ),
    )


_abi: list[int] = []  # asked once per process: it needs ctypes and a syscall


def abi_version() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is missing or blocked."""
    if not _abi:
        _abi.append(_ask_abi())
    return _abi[0]


def _ask_abi() -> int:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    abi = int(libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))
    return max(abi, 0)


def dac_hidden(path: str, groups: Sequence[int] | None = None) -> bool:
    """Whether file permissions already keep this process from reading ``path``.

    Inside the sandbox that stays so: capabilities are gone, chown is refused and
    chmod is refused outside the writable places and on secrets inside them
    (corral.chmodsup), so such a path needs no Landlock split (for an ordinary user,
    /etc/shadow alone would otherwise cost a rule per entry of /etc).
    ``groups``: this process's supplementary groups (asked when None)."""
    import stat

    try:
        st = os.stat(path)
    except OSError:
        return False  # missing: it may appear later, readable
    need = 0o1 if stat.S_ISDIR(st.st_mode) else 0o4  # search a dir, read a file
    if st.st_uid == os.geteuid():
        return not st.st_mode & (need << 6)
    if st.st_gid == os.getegid() or st.st_gid in (os.getgroups() if groups is None else groups):
        return not st.st_mode & (need << 3)
    return not st.st_mode & need


def _within(path: str, root: str) -> bool:
    return path.startswith(root.rstrip("/") + "/")


def _parents(path: str, roots: list[str]) -> list[str]:
    """``path`` and its ancestors up to (not above) the writable root holding it."""
    root = next((r for r in roots if _within(path, r)), None)
    chain = []
    while root is not None and _within(path, root):
        chain.append(path)
        path = os.path.dirname(path)
    return chain


SERVICES_NOTE = (
    "allowed host services on loopback are reached through the proxy here (NO_PROXY "
    "leaves them out); a client that ignores proxy variables cannot reach them on this tier"
)


def door_port(door: str | None) -> int:
    """The proxy's TCP port from a door address ``127.0.0.1:PORT``."""
    host, _, port = (door or "").rpartition(":")
    if host != "127.0.0.1" or not port.isdigit():
        raise ValueError(f"this tier needs a TCP door on 127.0.0.1, got {door!r}")
    return int(port)


def abi_problem(abi: int) -> str:
    """Why Landlock ABI ``abi`` (0: none) is not enough for this tier."""
    from corral import landlock

    if abi == 0:
        return (
            "no Landlock in this kernel, or it is turned off or blocked here "
            "(Linux >= 5.13 with CONFIG_SECURITY_LANDLOCK and landlock in lsm=)"
        )
    missing = [what for need, what in landlock.ABI_FEATURES if abi < need <= 6]
    return (
        f"Landlock ABI {abi} lacks {', '.join(missing)} (needs ABI "
        f"{landlock.MIN_ABI}, Linux >= 6.12)"
    )


class Confined(LaunchStrategy):
    """A reaper process outside the sandbox (:func:`corral.confine.reaper`) whose
    child confines itself with ``ruleset`` and the plan's seccomp filter, then
    execs the command.  No namespace holds the tree together: the reaper
    sweeps the command's descendants on SIGTERM (a SIGKILL would leave them to
    init), so :meth:`stop` sends that.  The reaper also serves the filter's mode
    calls (:mod:`corral.chmodsup`): allowed in ``places`` only."""

    def __init__(self, ruleset: Ruleset, places: Places | None = None) -> None:
        self.ruleset = ruleset
        self.places = places

    def spawn(
        self, plan: Plan, child_fds: dict[int, int], procs_files: list[str], entered: bool
    ) -> int:
        from corral import confine, launch, seccomp

        arch = seccomp.native_arch()
        program = seccomp.compile_filter(plan.seccomp, arch)
        parent = os.getpid()
        pid = os.fork()
        if pid:
            return pid

        def exec_command(channel: int) -> None:
            wanted = dict(child_fds)
            if channel >= 0:  # kept through the move (at a number no target uses)
                spare = max([2, channel, *child_fds, *child_fds.values()]) + 1
                wanted[spare] = channel
                channel = spare
            try:
                launch.move_fds_into_place(wanted)
                os.chdir(plan.cwd)
            except OSError as exc:
                os.write(2, f"corral: cannot enter {plan.cwd}: {exc.strerror}\n".encode())
                os._exit(126)
            # exec_failed's words, loaded before the ruleset: corral's own files
            # may be out of the command's reach (a checkout under /tmp, say)
            import corral.failures  # noqa: F401

            try:
                try:
                    confine.apply(self.ruleset, program, channel)
                except confine.ListenerBusy:  # corral in corral: modes refused, as before
                    os.close(channel)
                    unsupervised = seccomp.compile_filter(plan.seccomp, arch, notify=False)
                    confine.install_seccomp(unsupervised)
            except (OSError, confine.ConfineError) as exc:
                os.write(2, f"corral: the landlock sandbox could not be set up: {exc}\n".encode())
                os._exit(125)
            try:
                os.execvpe(plan.argv[0], plan.argv, plan.env)
            except OSError as exc:
                launch.exec_failed(plan, exc, plan.env)

        try:
            launch.child_session(procs_files)
            confine.reaper(exec_command, parent, self._supervisor())
        except BaseException as exc:
            os.write(2, f"corral: the landlock sandbox could not be set up: {exc}\n".encode())
        finally:
            os._exit(125)

    def _supervisor(self) -> Callable[[int, int], int] | None:
        places = self.places
        if places is None:
            return None

        def supervise(listener: int, pid: int) -> int:
            from corral import chmodsup

            return chmodsup.serve(listener, pid, places)

        return supervise

    def stop(self, plan: Plan, pid: int) -> None:
        try:
            os.kill(pid, 15)  # SIGTERM: the reaper kills what is below it, then exits
        except OSError:
            pass

    def describe(self) -> list[str]:
        return self.ruleset.describe()


class LandlockFacts(HostFacts):
    """The landlock tier's host: the kernel's Landlock ABI version (0: none), the
    read-deny paths that file permissions already hide from this user, and the
    directory tree the ruleset's split walks (:class:`corral.landlock.Tree`)."""

    __slots__ = ("abi", "hidden", "terminals", "tree")

    def __init__(
        self,
        *,
        abi: int = 0,
        hidden: frozenset[str] = frozenset(),
        tree: Tree | None = None,
        terminals: tuple[str, ...] = (),
        **common: Any,
    ) -> None:
        from corral.landlock import Tree

        super().__init__(**common)
        self.abi = abi
        self.hidden = hidden
        self.tree = tree if tree is not None else Tree()
        self.terminals = terminals  # the run's own terminal (its stdio's pty), if any


class LandlockTier(Tier):
    name = "landlock"
    strength = 40
    summary = "Landlock + seccomp + no capabilities: no user namespaces needed"
    door_transport = "tcp"
    strategy = Confined

    def gather(self, policy: Policy, agent: bool = False) -> LandlockFacts:
        from corral import home, landlock

        facts = LandlockFacts()
        gather_common(policy, facts)
        facts.abi = abi_version()
        facts.fs = fsplan.plan_filesystem(policy, mounts=False, environ=facts.environ)
        facts.home = home.plan_home(policy)
        facts.groups = tuple(os.getgroups())
        fs = facts.fs
        facts.hidden = frozenset(p for p in fs.read_deny if dac_hidden(p, facts.groups))
        if not agent:  # (a Sandbox's commands get pipes, never its caller's terminal)
            facts.terminals = own_terminals()
        if facts.abi >= landlock.MIN_ABI:
            secrets = [p for p in fs.read_deny if p not in facts.hidden]
            facts.tree = landlock.record_tree(facts.abi, fs.writable, secrets, fs.hardlinks)
        return facts

    def health(self, probe: bool = False) -> Health:
        from corral import landlock

        if os.uname().machine not in ("x86_64", "aarch64"):
            return Health(False, f"landlock tier supports x86_64 and aarch64, not {os.uname()}")
        abi = abi_version()
        details: dict[str, object] = {
            "abi": abi,
            "protections": landlock.features(abi),
            "differences": list(DIFFERENCES),
        }
        if abi < landlock.MIN_ABI:
            return Health(False, abi_problem(abi), details)
        return Health(True, f"ABI {abi}: fs, tcp, scoping", details)

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
        from corral import bounds, landlock, seccomp
        from corral.errors import RefusedError

        if policy.network.transparent:
            raise RefusedError(
                "the landlock tier cannot capture traffic transparently (it needs a "
                "network namespace); use the proxy variables or the namespace tier"
            )
        facts = host if isinstance(host, LandlockFacts) else self.gather(policy)
        abi = facts.abi
        if abi < landlock.MIN_ABI:
            raise RefusedError(abi_problem(abi))
        plan = Plan(self.name, policy)
        fs = facts.fs
        assert fs is not None
        plan.notes = list(fs.notes)
        plan.quarantine = fs.quarantine
        plan.repositories = fs.repositories
        plan.restore = dict.fromkeys(fs.write_protect, "write-deny")
        plan.restore.update(dict.fromkeys(fs.secrets_inside, "read-deny"))
        plan.hardlinks = fs.hardlinks
        plan.env = environ.sandbox_env(policy, facts.environ)
        plan.cwd = environ.sandbox_cwd(policy, fs.writable, facts.cwd)
        # the home layer: no mount here, so $HOME names it where it is on the host
        layer = facts.home
        if layer is not None:
            layer.secrets = frozenset(fs.read_deny)
            plan.home = layer
            plan.env["HOME"] = layer.path
        plan.seccomp = (
            *seccomp.default_deny_rules(),
            *seccomp.other_process_rules(),
            *extra_seccomp_rules(),
        )
        plan.fds = dict.fromkeys(pass_fds, "pass")
        bounds.apply_cgroup(plan, policy.limits, facts.cgroup_layout())
        bounds.apply_scratch(plan, absent=SCRATCH_BOUND, blocked=("shm",))
        base = facts.environ.get("TMPDIR") or "/tmp"
        if not os.path.isabs(base):
            base = "/tmp"
        plan.scratch = os.path.join(base, "corral-scratch-" + facts.token)
        plan.env.setdefault("TMPDIR", plan.scratch)
        port, bundle = self._network(plan, policy, door, net)
        # No mounts here: a file a tier would bind in (the agent) is used where it is,
        # readable through its own grant.
        binds = {m.dest: m.src or m.dest for m in extra if m.kind == "ro-bind"}
        plan.argv = [binds.get(arg, arg) for arg in command]
        secrets = [p for p in fs.read_deny if p not in facts.hidden]
        tree = facts.tree
        rules = landlock.build(
            abi, fs.writable, secrets, plan.scratch, port, tree.listdir, tree.is_dir, fs.hardlinks
        )
        plan.notes += _split_notes(fs)
        grants = [(src, landlock.READ_FILE | landlock.EXECUTE) for src in binds.values()]
        tty = (landlock.READ_FILE | landlock.WRITE_FILE | landlock.IOCTL_DEV) & rules.handled_fs
        grants += [(t, tty) for t in facts.terminals]  # (/dev/stdout reopens it by name)
        if bundle:
            grants.append((bundle, landlock.READ_FILE))
        if layer is not None:
            # created by the launcher after planning (like the scratch directory); a
            # grant rooted inside corral's withheld state directory still holds
            grants.append((layer.path, (landlock.READ | landlock.WRITE) & rules.handled_fs))
        if grants:
            rules.paths = sorted({*rules.paths, *grants})
        plan.strategy = Confined(rules, _mode_places(fs, layer.path if layer else None, plan))
        return plan

    def _network(
        self, plan: Plan, policy: Policy, door: str | None, net: NetExtras | None
    ) -> tuple[int | None, str | None]:
        """The proxy's port the ruleset lets the sandbox connect to, and corral's CA
        bundle it lets it read (None, None without a network)."""
        if policy.network.mode != "proxy":
            return None, None
        from corral.net.door import proxy_env
        from corral.netns import loopback_services

        port = door_port(door)
        # No namespace of its own: an allowed host service cannot be served at
        # its own address, so proxy-aware clients must send it to the proxy.
        services, _ = loopback_services(policy.network.allow, policy.network.deny)
        hosts = tuple(dict.fromkeys(h for h, _ in services))
        plan.env = {**proxy_env(port, port, through_proxy=hosts), **plan.env}
        if hosts:
            plan.notes.append(SERVICES_NOTE)
        if net is None:
            return port, None
        from corral.net.trust import sandbox_env

        # no mounts: the variables name the host's file, granted by the ruleset
        plan.env = sandbox_env(net, plan.env, net.ca_bundle or "", policy.env.set_values)
        return port, net.ca_bundle


def own_terminals() -> tuple[str, ...]:
    """The pseudo-terminals this process's stdin, stdout and stderr are: the one the
    run inherits.  Every other pty of the host stays out of reach (a grant on all
    of /dev/pts let a command read the keys typed into the user's other terminals
    and write on them: found by attacking corral)."""
    found: list[str] = []
    for fd in (0, 1, 2):
        try:
            name = os.path.realpath(os.ttyname(fd))
        except OSError:
            continue
        if name.startswith("/dev/pts/") and name not in found:
            found.append(name)
    return tuple(found)


def _mode_places(fs: FsPlan, home: str | None, plan: Plan) -> Places:
    """Where the sandbox may change modes: where it may write (the writable paths,
    the home layer, its scratch directory), less its secrets and hard-linked files
    there."""
    from corral.chmodsup import Places

    roots = [*fs.writable, *(p for p in (home, plan.scratch) if p)]
    return Places(roots, [*fs.read_deny, *fs.hardlinks])


def _split_notes(fs: FsPlan) -> list[str]:
    """What Landlock's rights following directories means for this plan's secrets
    and hard links in the writable places."""
    notes = []
    beside = sorted(
        {os.path.dirname(p) for p in fs.read_deny if any(_within(p, w) for w in fs.writable)}
    )
    if beside:
        notes.append(
            "landlock: new files created directly in "
            + ", ".join(beside)
            + " cannot be read back in this run (a secret file there is hidden, and "
            "Landlock rights follow directories)"
        )
    split = sorted({os.path.dirname(p) for h in fs.hardlinks for p in _parents(h, fs.writable)})
    if split:
        notes.append(
            "landlock: new files created directly in "
            + ", ".join(split)
            + " cannot be opened for writing in this run (a hard-linked file below "
            "is read-only, and Landlock rights follow directories)"
        )
    return notes
