"""Run one command in a microVM: ``python -m corral.vm.run [OPTIONS] -- COMMAND...``

The runner the microvm tier's launch strategy forks (:mod:`corral.tiers.microvm`),
and on its own a way to run the building blocks without the launcher.  Options are ``corral
run``'s: ``--policy --workspace --timeout --memory --cpus --pids --allow --deny
--network --writable --read-deny --write-deny --env -q``, plus ``--explain``
(print the plan: QEMU's sandbox and command line, the guest's mounts) and
``--console`` (the guest's serial console on stderr, for debugging).

Exit codes are corral's: the command's own, 128+N for a signal, 124 when the
timeout fired (QEMU's whole sandbox killed), 122 refused, 125 setup failed.

Nothing outlives the run: every channel is a socket pair (no file on the host),
QEMU runs under bubblewrap with ``--die-with-parent`` in its own pid namespace,
so a killed runner takes QEMU with it, and the initramfs and probe answers in
the cache are written whole or not at all.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import threading
import time

from corral.errors import EXIT_TIMEOUT, CorralError, RefusedError, SetupError
from corral.tiers.base import Health
from corral.vm import guest, initramfs, probe, qemu, setup, snapshot

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from corral.fsplan import FsPlan, Mount
    from corral.policy import Policy

# corral run's options this runner takes (their entries are corral run's), and its own
RUN_NAMES = [
    *("--policy", "--workspace", "--timeout", "--memory", "--cpus", "--pids", "--allow"),
    *("--deny", "--network", "--writable", "--read-deny", "--write-deny", "--env"),
    *("--explain", "-q"),
]
CONSOLE = ("console", "flag", "", "the guest's serial console on stderr (debugging)")
# how a user gets the console: `corral run` has no such option, this module does
CONSOLE_HINT = "python -m corral.vm.run --console -- COMMAND"
MONITOR = "corral.qmp"  # QEMU's QMP monitor: a socket pair like the ports
DRAIN_TIMEOUT = 10.0  # seconds to collect output the guest said it sent
# seconds for the guest to boot and take the request: 2 to 5 s under TCG, more on a
# busy host; a guest that hangs while booting is stopped and reported
BOOT_TIMEOUT = 60.0
# seconds for a restored guest to take the request (it takes well under one): a
# state that does not resume is given up for a boot
RESTORE_TIMEOUT = 20.0
CHUNK = 65536
# The control port is the init's, but the guest's root can reach it: its lines are
# bounded, and what the host prints of one is plain text (no terminal controls).
MAX_CONTROL_LINE = 4096
MAX_STATUS = 255  # the init reports its shell's $? (128+N for a signal)


def find_program(name: str) -> str | None:
    for d in [*os.environ.get("PATH", "").split(":"), "/usr/bin", "/bin"]:
        if os.path.isabs(d) and os.access(os.path.join(d, name), os.X_OK):
            return os.path.realpath(os.path.join(d, name))
    return None


def bound_tmpfs(args: list[str], size: int) -> list[str]:
    """Every ``--tmpfs`` in bwrap ``args`` without a ``--size`` gets ``size``: in QEMU's
    view they are empty placeholders and masks, and the guest's root could chmod
    a mask inside a writable export and fill it with host memory."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--tmpfs" and (i < 2 or args[i - 2] != "--size"):
            out += ["--size", str(size)]
        out.append(arg)
    return out


class VmPlan:
    """Everything a run needs, built before anything starts."""

    def __init__(self) -> None:
        self.argv: list[str] = []  # bwrap ... -- qemu ...
        self.fds: dict[int, str] = {}  # number in the sandbox -> "seccomp", "empty", a port
        self.request = b""
        self.launch: guest.Launch | None = None
        self.machine: qemu.Machine | None = None
        self.view: list[Mount] = []
        self.shares: list[guest.Export] = []
        self.guest_mounts: list[tuple[str, str, str]] = []
        self.decision: probe.Decision | None = None
        self.timeout: float | None = None
        self.notes: list[str] = []
        self.cache = ""  # where saved states are kept
        self.warm_key = ""  # the machine's saved state, if any (corral.vm.snapshot)
        self.restore_args: list[str] = []  # what QEMU's argv gains to restore it

        self.chosen: snapshot.Warm | None = None  # how the last start went, once decided

    def warm(self) -> snapshot.Warm:
        """How a start goes now (or went: :attr:`chosen`)."""
        if self.chosen is not None:
            return self.chosen
        console = self.machine is not None and self.machine.console
        return snapshot.decide(self.cache, self.warm_key, console)

    def describe(self) -> str:
        lines = [f"accelerator: {self.decision.reason if self.decision else '?'}"]
        lines.append(f"start: {self.warm().describe()}")
        if self.launch is not None and self.launch.waiting:
            lines.append(
                "agent: corral's, started by the guest's init before its state was saved;"
                " it takes this run's directory, ids and environment"
            )
        if self.machine is not None:
            lines.append(f"vcpus: {self.machine.cpus}  guest RAM: {self.machine.memory_mib} MiB")
        lines.append(f"timeout: {self.timeout if self.timeout else 'none'}")
        lines.append("QEMU's view of the host (bwrap, exported to the guest under /guest):")
        lines += qemu.describe_view(self.view)
        lines.append("exports: " + ", ".join(repr(s) for s in self.shares))
        lines.append("the guest mounts:")
        lines += guest.describe(self.shares, self.guest_mounts)
        lines += [f"note: {n}" for n in self.notes]
        lines.append("argv: " + " ".join(self.argv))
        return "\n".join(lines)


def requirements() -> tuple[setup.Assets, str, str, str]:
    """The guest kernel, a static busybox, QEMU and bubblewrap, or RefusedError
    naming the first one missing and how to get it."""
    from corral.tiers import namespace

    assets = setup.require()
    busybox = initramfs.find_busybox()
    if busybox is None:
        raise RefusedError("microvm: needs a static busybox (apt-get install busybox-static)")
    qemu_path = find_program("qemu-system-x86_64")
    if qemu_path is None:
        raise RefusedError("microvm: needs QEMU (apt-get install qemu-system-x86)")
    if not qemu_path.startswith("/usr/"):
        raise RefusedError(f"microvm: QEMU outside /usr is not supported ({qemu_path})")
    bwrap = namespace.find_bwrap()
    if bwrap is None:
        raise RefusedError("microvm: needs bubblewrap to confine QEMU (apt-get install bubblewrap)")
    return assets, busybox, qemu_path, bwrap


def health(probe_now: bool = False) -> Health:
    """Whether the microvm can run here, and on which accelerator and why.
    ``probe_now`` boots the guest once with KVM if that was never tried for this
    host kernel, QEMU and guest kernel (``doctor --probe``); otherwise the cached
    answer, or TCG until a probe says otherwise."""
    try:
        assets, busybox, qemu_path, _bwrap = requirements()
        cache = setup.cache_dir()
        initrd = initramfs.cached(assets, busybox, cache)
        decision = probe.decide(qemu_path, assets, initrd, cache, probe=probe_now)
    except CorralError as exc:
        return Health(False, exc.message)
    except OSError as exc:
        return Health(False, f"microvm: cannot use the cache {setup.cache_dir()}: {exc}")
    details: dict[str, object] = {
        "accelerator": decision.accel,
        "why": decision.reason,
        "guest_kernel": assets.release,
        "qemu": qemu_path,
    }
    return Health(True, f"QEMU microvm, guest kernel {assets.release}; {decision.reason}", details)


class VmHost:
    """What a VM plan needs to know about this host, read once by :func:`gather`:
    the guest kernel, busybox, QEMU and bubblewrap, the initramfs built from
    them, the accelerator decision, the TSC and merged-/usr facts, the host's
    CPUs and the caller's ids."""

    __slots__ = (
        "agent",
        "assets",
        "bwrap",
        "cache",
        "cpus",
        "decision",
        "facts",
        "gid",
        "initrd",
        "owner",
        "qemu",
        "saved",
        "state_inputs",
        "uid",
    )

    def __init__(
        self,
        assets: setup.Assets,
        qemu_path: str,
        bwrap: str,
        initrd: str,
        decision: probe.Decision,
        facts: qemu.HostFacts,
        cpus: int = 1,
        uid: int = 1000,
        gid: int = 1000,
        owner: int = 0,
        cache: str = "",
        state_inputs: Sequence[str] = (),
    ) -> None:
        self.assets = assets
        self.qemu = qemu_path
        self.bwrap = bwrap
        self.initrd = initrd
        self.decision = decision
        self.facts = facts
        self.cpus = cpus
        self.uid = uid
        self.gid = gid
        self.owner = owner  # corral's pid: QEMU is named after it (ps shows whose VM)
        self.cache = cache  # this user's VM cache: the saved states
        # what a saved state depends on besides QEMU's argv (corral.vm.snapshot)
        self.state_inputs = list(state_inputs)
        self.saved: frozenset[str] = frozenset()  # the keys of the states in the cache
        # a Sandbox's machine: its initramfs (with the agent's Python) and state
        # inputs, or why it has none (its agent then starts as any command)
        self.agent: AgentMachine | str = "not gathered"


class AgentMachine:
    """The initramfs of a Sandbox's machine and what its saved state depends on."""

    __slots__ = ("initrd", "state_inputs")

    def __init__(self, initrd: str, state_inputs: Sequence[str]) -> None:
        self.initrd = initrd
        self.state_inputs = list(state_inputs)


def gather(probe_now: bool = True, agent: bool = False) -> VmHost:
    """Read this host for a VM plan: RefusedError naming what is missing, the
    initramfs built if this cache has none of its digest, and the accelerator
    probed once per host kernel, QEMU and guest kernel (``probe_now``).
    ``agent``: also a Sandbox's machine (its initramfs built the first time)."""
    assets, busybox, qemu_path, bwrap = requirements()
    cache = setup.cache_dir()
    try:
        initrd = initramfs.cached(assets, busybox, cache)
        decision = probe.decide(qemu_path, assets, initrd, cache, probe=probe_now)
        inputs = [snapshot.identity(p) for p in (qemu_path, assets.vmlinux, initrd)]
    except OSError as exc:
        raise SetupError(f"microvm: cannot use the cache {cache}: {exc}") from None
    if decision.accel == "kvm":  # KVM's guest state follows the host's kernel and CPU
        inputs += [os.uname().release, os.uname().version]
    host = VmHost(
        assets,
        qemu_path,
        bwrap,
        initrd,
        decision,
        qemu.host_facts(),
        os.cpu_count() or 1,
        os.getuid(),
        os.getgid(),
        os.getpid(),
        cache,
        inputs,
    )
    host.saved = snapshot.saved_keys(cache)
    if agent:
        host.agent = _agent_machine(assets, busybox, cache, inputs)
    return host


def _agent_machine(
    assets: setup.Assets, busybox: str, cache: str, inputs: list[str]
) -> AgentMachine | str:
    """A Sandbox's machine: the initramfs with the agent's Python (built once), or
    why there is none."""
    from corral.tiers import namespace
    from corral.vm import guestpython

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    closure = guestpython.gather(namespace.inside_python(), os.path.join(here, "agent.py"), cache)
    if isinstance(closure, str):
        return closure
    try:
        initrd = initramfs.cached(assets, busybox, cache, closure)
        # the base initramfs's identity is the third input
        return AgentMachine(initrd, [*inputs[:2], snapshot.identity(initrd), *inputs[3:]])
    except OSError as exc:
        return f"its initramfs cannot be built: {exc}"


def prepare(
    policy: Policy,
    command: list[str],
    door: str | None = None,
    console: bool = False,
    name: str = "corral-vm",
) -> VmPlan:
    """The plan for ``command`` under ``policy``: reads the host, starts nothing
    (except the accelerator probe, once per host, QEMU and guest kernel)."""
    from corral import fsplan

    host = gather()
    return build(policy, command, host, fsplan.plan_filesystem(policy), door, console, name)


def build(
    policy: Policy,
    command: list[str],
    host: VmHost,
    fs: FsPlan,
    door: str | None = None,
    console: bool = False,
    name: str = "corral-vm",
    view_extra: Sequence[Mount] = (),
    env_extra: Mapping[str, str] | None = None,
    agent: bool = False,
    home: str | None = None,
) -> VmPlan:
    """The plan for ``command`` under ``policy`` on the host ``host`` describes, with
    the filesystem decision ``fs``; reads nothing but ``CORRAL_VM_WARM`` (whether
    the machine is one whose state is saved).  ``view_extra``: more read-only
    binds in QEMU's view (the guest's root); ``env_extra``: variables that win
    over the policy's (hooks' placeholders).  ``agent``: ``command`` is a
    Sandbox's agent; it runs as the agent a Sandbox machine's
    init started before its state was saved, when this host has that machine
    (with a network, serving the relay in its own process).
    ``home``: the home layer's path (``fs`` binds it in the view), exported
    read-write at that path like the workspace."""
    from corral import environ, fsplan
    from corral.tiers import namespace

    if policy.network.transparent:
        raise RefusedError(
            "microvm: --transparent is not available (the guest has no network device)"
        )
    plan = VmPlan()
    plan.decision = host.decision
    limits = policy.limits
    vcpus, memory_mib = qemu.size(
        limits.get("memory"), limits.source("memory"), limits.get("cpus"), host.cpus
    )
    pids = limits.get("pids")
    plan.timeout = limits.get("timeout")
    plan.notes = list(fs.notes)
    plan.view = guest.view_mounts([*fs.mounts, *view_extra])
    plan.shares = guest.exports([*fs.writable, *([home] if home else [])])
    present = [m.dest for m in fs.mounts if m.kind == "tmpfs" and m.dest in fsplan.PRIVATE_TMP]
    plan.guest_mounts = guest.guest_mounts(plan.shares, namespace.scratch_sizes(limits), present)
    command, env, notes, relay_args = _guest_command(policy, command, door)
    plan.notes += notes
    if env_extra:
        env = {**env, **env_extra}
    ready = host.agent if agent else None
    if isinstance(ready, str):
        plan.notes.append(f"the agent starts with the guest (no waiting agent: {ready})")
        ready = None
    plan.launch = guest.Launch(
        command,
        env,
        environ.sandbox_cwd(policy, fs.writable),
        host.uid,
        host.gid,
        None if pids is None else int(pids),
        policy.network.mode == "proxy",
        duplex=ready is not None,
        waiting=ready is not None,
    )
    if ready is not None:  # with a network, its relay runs in the agent's process
        plan.launch.relay = relay_args
    plan.request = guest.request(plan.shares, plan.guest_mounts, plan.launch)
    machine = _machine(host, vcpus, memory_mib, plan.shares, name, console)
    _sandbox(plan, host, machine, ready)
    if snapshot.enabled(console) and plan.warm_key not in host.saved:
        # (a first run took 7 s here in silence: say why, once)
        plan.notes.append(
            "no saved state of this machine yet: this run boots the guest and saves "
            "its state (some seconds, once); later runs restore it"
        )
    return plan


def _machine(
    host: VmHost,
    vcpus: int,
    memory_mib: int,
    shares: list[guest.Export],
    name: str,
    console: bool,
) -> qemu.Machine:
    return qemu.Machine(
        accel=host.decision.accel,
        cpus=vcpus,
        memory_mib=memory_mib,
        # a machine that may be saved boots as its restores will resume (the
        # kernel's command line is part of the state's key)
        cmdline=qemu.kernel_cmdline(
            host.facts.tsc_khz,
            console=console,
            saved=snapshot.enabled(console),
            accel=host.decision.accel,
        ),
        exports=shares,
        name=name,
        qemu=host.qemu,
        console=console,
    )


def _guest_command(
    policy: Policy, command: list[str], door: str | None
) -> tuple[list[str], dict[str, str], list[str], list[str]]:
    """The command the guest runs, its environment, the plan's notes and the relay's
    arguments: with a network, behind the relay (as on the other tiers) reached
    through the guest's end of the door port, which also listens on the guest's
    loopback for each allowed host service at its own address."""
    from corral import environ, netns
    from corral.tiers import namespace

    env = environ.sandbox_env(policy)
    if policy.network.mode != "proxy":
        return command, env, [], []
    from corral.net import door as doors

    if door is None:
        raise ValueError("network mode proxy needs the door's path")
    services, notes = netns.loopback_services(policy.network.allow, policy.network.deny)
    relay = doors.relay_argv([namespace.inside_python()], services)
    bridge = [relay[0], "-I", "-S", "/run/corral/guestdoor.py", "4", doors.SANDBOX_DOOR]
    relay_args = relay[relay.index(doors.SANDBOX_RELAY) + 1 :]
    guest_argv = [*bridge, "--", *relay_args, "--", *command]
    return guest_argv, {**doors.proxy_env(), **env}, notes, relay_args


def _sandbox(plan: VmPlan, host: VmHost, machine: qemu.Machine, ready: AgentMachine | None) -> None:
    """QEMU in its bubblewrap sandbox for ``machine``: the descriptors it is handed
    (numbered in ``plan.fds``), its argv, and the key of its saved state."""
    from corral.tiers import namespace

    assert plan.launch is not None
    numbers = iter(range(3, 1 << 16))
    status_fd, seccomp_fd = next(numbers), next(numbers)
    plan.fds[status_fd] = "status"
    plan.fds[seccomp_fd] = "seccomp"
    ports = list(qemu.PORTS if plan.launch.network else qemu.PORTS[:-1])
    for port in ports:
        number = next(numbers)
        plan.fds[number] = port
        machine.ports.append((port, number))
    monitor, state = next(numbers), next(numbers)
    plan.fds[monitor] = MONITOR
    plan.fds[state] = "state"  # passed only when a saved state is restored
    machine.monitor = monitor
    view_args, view_fds = namespace.mount_args(plan.view, numbers)
    plan.fds.update(view_fds)
    plan.machine = machine
    initrd, inputs = (ready.initrd, ready.state_inputs) if ready else (host.initrd, None)
    own = qemu.own_root(host.facts, host.assets.vmlinux, initrd, host.decision.accel == "kvm")
    qemu_argv = qemu.qemu_argv(machine)
    plan.argv = qemu.sandbox_argv(
        host.bwrap, own, bound_tmpfs(view_args, 65536), status_fd, seccomp_fd, qemu_argv
    )
    plan.cache = host.cache
    plan.warm_key = snapshot.state_key(
        qemu_argv, inputs if inputs is not None else host.state_inputs
    )
    plan.restore_args = ["-incoming", f"fd:{state}"]


class Result:
    __slots__ = (
        "duration",
        "exit_code",
        "oom_kills",
        "reported",
        "stderr_bytes",
        "stdout_bytes",
        "timed_out",
    )

    def __init__(self) -> None:
        self.exit_code = 0
        self.reported = False  # the guest said how the command ended
        self.timed_out = False
        self.duration = 0.0
        self.oom_kills = 0
        self.stdout_bytes = 0
        self.stderr_bytes = 0


def _write_all(fd: int, data: bytes) -> bool:
    """False once the reader is gone (the rest of the output is dropped)."""
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        return False
    return True


def _pump_stdin(src: int, sock: socket.socket) -> None:
    """The runner's stdin to the guest; its end of file closes the port (the
    guest's read then returns end of file)."""
    try:
        while True:
            data = os.read(src, CHUNK)
            if not data:
                break
            sock.sendall(data)
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


PR_SET_THP_DISABLE = 41


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up before a fork (ctypes loads nothing in the child)."""
    import ctypes

    try:
        found: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return found


def _no_huge_pages(prctl: Callable[..., int] | None) -> None:
    """No transparent huge pages for this process and what it executes (bwrap, then
    QEMU: the setting survives fork and exec).  QEMU marks the guest's RAM and its
    code cache for huge pages, so the host backs any 2 MiB the guest has touched a
    byte of with 2 MiB (khugepaged collapses the rest): a restored guest whose
    state holds 90 MiB kept 100 MiB resident, its RAM all huge pages.  Measured:
    an idle restored Sandbox of 256 MiB, 176 MiB of RSS with them, 163 without.
    The price is a fault per 4 KiB page the restore writes (a warm start ~60 ms
    slower here, where a fault costs ~3 us) and one per zero page it reads,
    which states no longer hold (snapshot.strip_zero_pages).  Nothing else
    depends on it: a failure is ignored."""
    if prctl is not None:
        prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)


class _Vm:
    """A started VM: bwrap's pid, its child's (the sandbox's pid 1), our socket ends."""

    def __init__(
        self, plan: VmPlan, given: dict[str, int] | None = None, state: int | None = None
    ) -> None:
        """``given``: ports whose host end is a caller's socket, handed to QEMU as
        it is (the Sandbox's channel to its agent) instead of a new socket pair.
        ``state``: a saved state QEMU restores instead of booting."""
        from corral import seccomp
        from corral.launch import move_fds_into_place
        from corral.tiers import namespace

        self.state = state
        self.socks: dict[str, socket.socket] = {}
        wanted: dict[int, int] = {}
        theirs: list[int] = []
        null = os.open(os.devnull, os.O_RDWR)
        self.err_r, err_w = os.pipe()
        status_r, status_w = os.pipe()
        theirs += [null, err_w, status_w]
        wanted.update({0: null, 1: null, 2: err_w})
        if plan.machine is not None and plan.machine.console:
            wanted[1] = 2  # the serial console: QEMU's stdout, to our stderr
        for number, what in plan.fds.items():
            if what == "status":
                wanted[number] = status_w
            elif what == "seccomp":
                sec_r, sec_w = os.pipe()
                os.write(
                    sec_w,
                    seccomp.compile_filter(seccomp.default_deny_rules(), seccomp.native_arch()),
                )
                os.close(sec_w)
                wanted[number] = sec_r
                theirs.append(sec_r)
            elif what == "empty":
                wanted[number] = null
            elif what.startswith(namespace.SOURCE + "\0"):  # namespace.mount_args: a bind source
                wanted[number] = source = namespace.open_source(what)
                theirs.append(source)
            elif what == "state":
                if state is not None:
                    wanted[number] = state
            elif given and what in given:
                wanted[number] = given[what]
            else:  # a port: one socket pair, QEMU holds one end
                ours, other = socket.socketpair()
                self.socks[what] = ours
                wanted[number] = other.detach()
                theirs.append(wanted[number])
        argv = plan.argv + (plan.restore_args if state is not None else [])
        prctl = _prctl()
        pid = os.fork()
        if pid == 0:
            try:
                os.setpgid(0, 0)
                _no_huge_pages(prctl)
                move_fds_into_place(wanted)
                os.execve(argv[0], argv, {})
            finally:
                os._exit(127)
        self.pid = pid
        for fd in theirs:
            os.close(fd)
        self.status_r = status_r  # bwrap writes the exit code there at the end
        self.child = _child_pid(status_r)

    def stop(self) -> None:
        """Kill the sandbox's pid 1: the kernel kills QEMU with it, and bwrap exits
        once both are gone, so when this returns nothing of the VM is left."""
        for pid in (self.child, self.pid):
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                break
        self.wait()

    def wait(self) -> None:
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        for sock in self.socks.values():
            try:
                sock.shutdown(socket.SHUT_RDWR)  # ends the door's mux, which holds a copy
            except OSError:
                pass
            sock.close()
        os.close(self.err_r)
        os.close(self.status_r)

    def ended(self) -> str:
        """How QEMU ended, once it has (bwrap's last status line)."""
        from corral.launch import _status_value

        text = b""
        try:
            while chunk := os.read(self.status_r, 4096):
                text += chunk
        except OSError:
            pass
        code = _status_value(text.decode(errors="replace"), "exit-code")
        if code is None:
            return "QEMU's end is unknown"
        if code > 128:
            return f"QEMU was killed by signal {code - 128}"
        return f"QEMU exited with status {code}"


def _child_pid(status_r: int) -> int:
    """bwrap's first status line names the sandbox's pid 1 (0 if bwrap failed)."""
    from corral.launch import _status_value

    text = b""
    while b"}" not in text:
        chunk = os.read(status_r, 4096)
        if not chunk:
            break
        text += chunk
    return _status_value(text.decode(errors="replace"), "child-pid") or 0


class _Gone(SetupError):
    """The VM ended, or did not take its request in time (``late``), before the
    guest said ``up``: nothing of the command has run yet."""

    def __init__(self, message: str, late: bool = False) -> None:
        super().__init__(message)
        self.late = late


def execute(
    plan: VmPlan,
    door: str | None,
    stdin: int = 0,
    stdout: int = 1,
    stderr: int = 2,
    duplex: bool = False,
) -> Result:
    """Start the VM (restored or booted: :func:`_start`), run the request, stream
    the output; the result once the VM is gone.  ``duplex``: ``stdin`` is a
    socket that is the command's stdin and stdout both (corral's agent), handed
    to QEMU as the stdin port."""
    result = Result()
    started = time.monotonic()
    if duplex and plan.launch is not None:
        plan.launch.duplex = True
    given = {"corral.stdin": stdin} if duplex else None
    # duplex: the agent's stdout is its channel, and the stdout port nobody's; what
    # the guest's root writes there is counted, never mixed into the channel
    vm, follower = _start(plan, given, result, (-1 if duplex else stdout, stderr), started)
    try:
        if not duplex:
            threading.Thread(
                target=_pump_stdin, args=(stdin, vm.socks["corral.stdin"]), daemon=True
            ).start()
        if "corral.door" in vm.socks and door is not None:
            from corral.vm import mux

            port = os.dup(vm.socks["corral.door"].fileno())  # the mux closes its own copy
            link = mux.Mux(port, mux.unix_opener(door))
            threading.Thread(target=link.serve, daemon=True).start()
        follower.run()
    finally:
        # Once the report and every byte of output are in, nothing of the run is left
        # in the guest (it synced its writes to the host before reporting): the VM is
        # stopped at once rather than powered off, which under TCG took ~200 ms.
        vm.stop()
    result.duration = time.monotonic() - started
    return result


def _say(line: str) -> None:
    sys.stderr.write(f"corral: {line}\n")
    sys.stderr.flush()


def _start(
    plan: VmPlan,
    given: dict[str, int] | None,
    result: Result,
    sinks: tuple[int, int],
    started: float,
) -> tuple[_Vm, _Follower]:
    """A VM that has taken the request: restored from the machine's saved state
    when the cache has one, else booted (saving the state on the way when there
    is none).  A state that does not restore is removed, and the VM booted."""
    warm = plan.chosen = plan.warm()
    if warm.restore:
        fd = snapshot.open_state(warm.path)
        if fd is not None:
            try:
                return _launch(plan, given, result, sinks, started, state=fd)
            except _Gone as exc:
                if not exc.late:  # QEMU refused it; a slow host is no reason to drop it
                    snapshot.discard(warm.path, fd)
                why = exc.message.removeprefix("microvm: ")
                _say(f"microvm: the saved VM state did not restore ({why}); booting")
            finally:
                os.close(fd)
        warm = plan.chosen = snapshot.Warm(
            warm.path, False, True, "the saved state did not restore"
        )
    return _launch(plan, given, result, sinks, started, save=warm.path if warm.save else "")


def _launch(
    plan: VmPlan,
    given: dict[str, int] | None,
    result: Result,
    sinks: tuple[int, int],
    started: float,
    state: int | None = None,
    save: str = "",
) -> tuple[_Vm, _Follower]:
    """Start QEMU (restoring ``state`` if given), save the guest's state to ``save``
    at the init's ``waiting`` if asked, send the request; back once the guest
    took it (or the timeout fired).  On any error the VM is stopped."""
    assert plan.launch is not None
    vm = _Vm(plan, given, state)
    try:
        wait = RESTORE_TIMEOUT if state is not None else BOOT_TIMEOUT
        follower = _Follower(vm, plan, result, *sinks, started, wait)
        if save:
            follower.run(until="waiting")
            if result.timed_out:
                return vm, follower
            _save(vm, save)
        # a restored guest shares its random state and clock with every other one
        fresh = (os.urandom(32), time.time()) if state is not None else None
        request = guest.request(plan.shares, plan.guest_mounts, plan.launch, fresh)
        try:
            # its number of lines first (the init reads it line by line)
            vm.socks["corral.ctl"].sendall(b"%d\n" % request.count(b"\n") + request)
        except OSError:
            pass  # QEMU is gone already: the follower says why
        follower.run(until="up")
    except BaseException:
        vm.stop()
        raise
    return vm, follower


def _save(vm: _Vm, path: str) -> None:
    """Save the guest's state (no request sent yet) as its machine's warm start; a
    failure is said and the boot goes on."""
    cache = os.path.dirname(path)
    try:
        fd = snapshot.new_file(cache)
    except OSError as exc:
        _say(f"microvm: no warm start saved: no unnamed file in {cache}: {exc.strerror}")
        return
    try:
        snapshot.save(snapshot.Monitor(vm.socks[MONITOR]), fd)
    except (snapshot.SaveError, OSError, ValueError) as exc:
        os.close(fd)
        _say(f"microvm: no warm start saved: {exc}")
        return
    fd = snapshot.without_zero_pages(fd, cache)
    try:
        snapshot.commit(fd, path)
    except OSError as exc:
        _say(f"microvm: no warm start saved: {path}: {exc.strerror}")


class _Follower:
    """Reads everything the VM sends until the guest says a given line, or the
    command's end has been reported and its output collected, the timeout
    fires, or the VM dies."""

    def __init__(
        self,
        vm: _Vm,
        plan: VmPlan,
        result: Result,
        stdout: int,
        stderr: int,
        started: float,
        boot_timeout: float = BOOT_TIMEOUT,
    ) -> None:
        self.vm = vm
        self.result = result
        out, err = vm.socks["corral.stdout"].fileno(), vm.socks["corral.stderr"].fileno()
        self.out, self.err = out, err
        self.ctl = vm.socks["corral.ctl"].fileno()
        self.sinks = {out: stdout, err: stderr}
        self.got = {out: 0, err: 0}
        self.alive = {out: stdout >= 0, err: True}  # False: what arrives is dropped
        self.control = b""
        self.qemu_err = b""
        self.booted = False  # the init said "up": it has the request
        self.until = ""  # the guest's line run() returns at ("waiting", "up")
        self.seen = ""  # the last of those lines the guest said
        self.expect: dict[int, int] | None = None  # bytes per output, once reported
        self.watch = [out, err, self.ctl, vm.err_r]
        self.deadline = started + plan.timeout if plan.timeout else None
        self.boot_timeout = boot_timeout
        self.boot_deadline = time.monotonic() + boot_timeout
        self.drain_until = 0.0

    def run(self, until: str = "") -> None:
        self.until = until
        self._lines()
        while True:
            if until and self.seen == until:
                return
            if self.expect is not None and all(self.got[fd] >= n for fd, n in self.expect.items()):
                return
            wait = self._wait()
            if wait is not None and wait <= 0:
                if self.expect is None and not self.booted and self.deadline_is_boot():
                    what = "boot" if self.vm.state is None else "resume from its saved state"
                    raise _Gone(
                        f"microvm: the guest did not {what} within {self.boot_timeout:g} s "
                        f"({CONSOLE_HINT} shows where it stopped)",
                        late=True,
                    )
                if self.expect is None:
                    self.result.timed_out = True
                    self.result.exit_code = EXIT_TIMEOUT
                return
            ready, _, _ = select.select(self.watch, [], [], wait)
            for fd in ready:
                self._take(fd)

    def deadline_is_boot(self) -> bool:
        return self.deadline is None or self.boot_deadline < self.deadline

    def _wait(self) -> float | None:
        now = time.monotonic()
        if self.expect is not None:
            return self.drain_until - now
        ends = [self.deadline] if self.deadline is not None else []
        if not self.booted:
            ends.append(self.boot_deadline)
        return min(ends) - now if ends else None

    def _take(self, fd: int) -> None:
        try:
            data = os.read(fd, CHUNK)
        except OSError:
            data = b""  # QEMU is gone: the same as end of file
        if not data:
            self.watch.remove(fd)
        if fd in self.sinks:
            self.got[fd] += len(data)
            if data and self.alive[fd]:
                self.alive[fd] = _write_all(self.sinks[fd], data)
        elif fd == self.vm.err_r:
            self.qemu_err = (self.qemu_err + data)[-4096:]
            if not data and self.expect is None and b"\n" not in self.control:
                # before "up" nothing of the command ran (a restore may boot instead)
                gone = SetupError if self.booted else _Gone
                raise gone(_why_ended(self.qemu_err, self.vm.ended()))
        else:
            self.control += data
            self._lines()
            if len(self.control) > MAX_CONTROL_LINE:
                raise SetupError(
                    f"microvm: the guest sent a control line of over {MAX_CONTROL_LINE} bytes"
                )

    def _lines(self) -> None:
        """Take the control lines received, up to the one run() waits for."""
        while b"\n" in self.control and self.expect is None:
            if self.until and self.seen == self.until:
                return
            line, self.control = self.control.split(b"\n", 1)
            if line in (b"waiting", b"up"):
                self.seen = line.decode()
                self.booted = self.booted or line == b"up"
                continue
            line_text = line.decode(errors="replace")
            self.expect = _report(line_text, self.result, self.out, self.err)
            self.drain_until = time.monotonic() + DRAIN_TIMEOUT


def _plain(text: str, limit: int = 500) -> str:
    """The guest's words as one line of plain text (corral.errors.plain: no terminal
    control), at most ``limit`` characters of them."""
    from corral.errors import plain

    return plain(text[:limit]) + ("..." if len(text) > limit else "")


def _report(line: str, result: Result, out: int, err: int) -> dict[int, int]:
    """Take in the guest's ``exit CODE OUT ERR OOM`` or ``error WHY`` line."""
    kind, _, rest = line.partition(" ")
    fields = rest.split()
    if kind == "error":
        raise SetupError(f"microvm: {_plain(rest)}")
    # the guest's root can write this line: only what the init can say is taken (a
    # status past 255 made the runner's os._exit raise, and its fork ran on as corral)
    if kind != "exit" or len(fields) != 4 or not all(_decimal(f) for f in fields):
        raise SetupError(f"microvm: the guest answered {_plain(line, 200)}")
    code, out_n, err_n, oom = (int(f) for f in fields)
    if code > MAX_STATUS:
        raise SetupError(f"microvm: the guest answered {_plain(line, 200)}")
    result.reported = True
    result.exit_code = code
    result.stdout_bytes, result.stderr_bytes = out_n, err_n
    result.oom_kills = oom
    return {out: out_n, err: err_n}


def _decimal(field: str) -> bool:
    """ASCII digits, no more than a 64-bit count has (str.isdigit takes "²" too)."""
    return 0 < len(field) <= 20 and field.isascii() and field.isdigit()


def _why_ended(qemu_err: bytes, how: str) -> str:
    lines = qemu_err.decode(errors="replace").strip().splitlines()
    stopped = f"{how}; the guest stopped before it reported ({CONSOLE_HINT} shows why)"
    why = lines[-1] if lines else stopped
    return f"microvm: the VM ended before the command did: {why}"


def main(argv: list[str]) -> int:
    from corral import cli

    try:
        table = {name: cli.RUN_OPTIONS[name] for name in RUN_NAMES}
        opts, command = cli.parse(argv, {**table, "--console": CONSOLE}, positional=True)
        if not command:
            raise CorralError("usage: python -m corral.vm.run [OPTIONS] -- COMMAND...")
        policy = cli.build_policy(opts)
        door = None
        if policy.network.mode == "proxy" and not opts.get("explain"):
            from corral.launch import new_run_id
            from corral.net.door import open_door

            door = open_door(policy, new_run_id())
        run_id = f"corral-vm-{os.getpid()}-{os.urandom(3).hex()}"
        plan = prepare(
            policy,
            command,
            door.address if door else "/run/door",
            bool(opts.get("console")),
            run_id,
        )
        if opts.get("explain"):
            print(plan.describe())
            return 0
        stop = _forward_signals()
        try:
            result = execute(plan, door.address if door else None)
        finally:
            if door is not None:
                door.close()
        if stop:
            return 128 + stop[0]
    except CorralError as exc:
        sys.stderr.write(f"corral: {exc.message}\n")
        return exc.code
    if result.timed_out:
        sys.stderr.write(f"corral: timed out after {plan.timeout:g}s; the VM was stopped\n")
    elif result.oom_kills and not opts.get("quiet"):
        sys.stderr.write(
            f"corral: limit hit: memory (the guest's OOM killer ended {result.oom_kills})\n"
        )
    return result.exit_code


def _forward_signals() -> list[int]:
    """SIGINT/SIGTERM/SIGHUP stop the VM (raised in the main thread, which then
    stops QEMU on its way out) and the runner exits 128+N."""
    got: list[int] = []

    def handler(signum: int, _frame: object) -> None:
        got.append(signum)
        raise SetupError("stopped by a signal")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
    return got


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
