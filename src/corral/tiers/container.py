"""The container tier: podman or docker with corral's envelope, runc or gVisor (runsc).

``plan()`` gathers the host facts (engine, runtime, uid, fsplan's mounts) and
hands them to the pure :func:`corral.container.envelope.run_argv`.  The
container's first corral process is :mod:`corral.container.boot`, run by the
host's own Python bound in read-only (:mod:`corral.container.bundle`), which
gives the command its environment from a file, so no value is in any argv or
in ``podman inspect``.  With a network, the relay comes next, exactly as in
the namespace tier, and talks to the same door.

``gvisor`` is this tier with ``runsc`` as the default runtime.
"""

from __future__ import annotations

import os
import sys

from corral import environ, fsplan, shell
from corral.errors import RefusedError
from corral.paths import inside
from corral.tiers.base import Health, HostFacts, LaunchStrategy, Plan, Tier, gather_common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from corral.container.bundle import Bundle
    from corral.container.engine import Engine
    from corral.container.envelope import Spec
    from corral.fsplan import Mount
    from corral.net.trust import NetExtras
    from corral.policy import Policy
    from corral.seccomp import SyscallRule

    # a file's type, device, inode, mtime and ctime (ns)
    Identity = tuple[int, int, int, int, int]

INSIDE = "/run/corral"
BOOT = f"{INSIDE}/boot.py"
ENV_FILE = f"{INSIDE}/env"
REPORT = f"{INSIDE}/report"
CHECKS = f"{INSIDE}/checks"
# what the engine itself needs from our environment (never the sandbox's values)
ENGINE_ENV = (
    "PATH",
    "HOME",
    "USER",
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "DOCKER_HOST",
    "DOCKER_CONFIG",
    "CONTAINERS_CONF",
    "CONTAINERS_STORAGE_CONF",
    "CONTAINER_HOST",
    "TMPDIR",
)


NO_IMAGE = (
    "no image named (--image REF, [container] image in the policy, or $CORRAL_IMAGE; "
    "python -m corral.container.image builds a small one from this host's programs)"
)


def env_file(env: dict[str, str]) -> bytes:
    """NAME=VALUE entries, each ended by a NUL (a value may hold newlines, never NUL)."""
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())


def image_for(policy: Policy, environ: dict[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return policy.container.image or env.get("CORRAL_IMAGE", "")


class EngineLaunch(LaunchStrategy):
    """A container engine's client: ``podman run --rm`` (the plan's argv) with the
    engine's own environment.  The container outlives a killed client, so a
    run that did not end on its own removes it (``podman rm -f``), from the
    guardian too if corral is killed.  Started lazily by ``Sandbox`` (and again
    after it died); the command's limits hit are read from a file boot writes."""

    lazy = True
    # the engine's client is between corral and the container (its --tty would be
    # the engine's terminal handling): the container makes the shell's own pty
    own_terminal = True
    close_grace = 2.0  # the agent's exit ends the container; --rm removes it
    agent_fds = False  # the agent is reached through the engine's pipes

    def __init__(
        self, env: dict[str, str], report: str, remove: list[str], inspect: Sequence[str] = ()
    ) -> None:
        self.env = env  # the engine client's environment (never the sandbox's values)
        self.report = report  # a file naming limits hit, one per line ("" if none)
        self.remove = remove  # the command that removes the container
        self.inspect = list(inspect)  # the command that finds the image (its name last)

    def exit_code(self, plan: Plan, code: int) -> int:
        # 125 is the engine's own failure; a missing image is the usual one, and the
        # engine's words for it do not say how to get one
        if code == 125 and self.inspect and not self._image_present():
            engine = os.path.basename(self.inspect[0])
            sys.stderr.write(
                f"corral: image {self.inspect[-1]} is not in {engine}'s "
                "store (python -m corral.container.image builds one; or --image REF)\n"
            )
        return code

    def _image_present(self) -> bool:
        import subprocess

        try:
            found = subprocess.run(
                self.inspect,
                env=self.env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=20,
            )
        except (OSError, subprocess.TimeoutExpired):
            return True  # cannot tell: say nothing rather than something wrong
        return found.returncode == 0

    def spawn(
        self, plan: Plan, child_fds: dict[int, int], procs_files: list[str], entered: bool
    ) -> int:
        from corral import launch

        # the engine changes directory inside (--workdir)
        return launch.spawn_process(plan, child_fds, procs_files, chdir=False, env=self.env)

    def limits_hit(self, plan: Plan) -> list[str]:
        if not self.report:
            return []
        try:  # (bounded: the command can write that file, on the host's disk)
            with open(self.report, encoding="utf-8", errors="replace") as fh:
                words = fh.read(256).split()
        except OSError:
            return []
        return [w for w in dict.fromkeys(words) if w in ("memory", "pids")]

    def needs_guardian(self) -> bool:
        return True  # the container outlives a killed client

    def cleanup(self, plan: Plan, clean: bool, pid: int = 0) -> None:
        """A killed client leaves its container behind: remove it, quietly, bounded.
        A runtime that hung before the container started outlives the engine's
        removal: its processes are ended by the container's ID (see leftovers).
        ``pid``: the engine's client, when corral was killed: it is not tied to
        corral's death, and one that had not made the container yet made it after
        the removal, which then ran with nothing left to remove it (found by
        attacking corral); so it is killed, waited for, and the removal repeated."""
        if clean:
            return
        self._remove()
        if pid and _end_client(pid):
            self._remove()

    def _remove(self) -> None:
        import subprocess

        from corral.container import leftovers

        try:
            subprocess.run(
                self.remove,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            pass
        leftovers.end(*leftovers.find(self.remove[-1]))  # (the name ends the argv)

    def describe(self) -> list[str]:
        return ["if killed: " + " ".join(self.remove)]


def _end_client(pid: int, within: float = 5.0) -> bool:
    """SIGKILL the engine's client and wait (bounded) until it is gone; whether it
    was there to kill."""
    import time

    try:
        os.kill(pid, 9)  # SIGKILL (the signal module imports enum)
    except OSError:
        return False
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            break
        try:  # (ours to reap when the guardian is its parent)
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.02)
    return True


class ContainerFacts(HostFacts):
    """The container tier's host: the engine and runtime chosen (or why none can
    be), whether it can enforce limits for this user, the host Python it binds
    in, where the per-run files go, which masked paths are unix sockets, and which
    mount targets are FIFOs or device nodes (gVisor only: its gofer opens every
    target, and an open of a FIFO waits for a writer that never comes), and what
    the bind sources below writable paths are (boot checks them inside)."""

    __slots__ = (
        "binds",
        "bundle",
        "engine",
        "engine_why",
        "fifos",
        "limits_problem",
        "sockets",
        "tmpdir",
    )

    def __init__(
        self,
        *,
        engine: Engine | None = None,
        engine_why: str = "",
        limits_problem: str = "",
        bundle: Bundle | None = None,
        tmpdir: str = "/tmp",
        sockets: frozenset[str] = frozenset(),
        fifos: frozenset[str] = frozenset(),
        binds: dict[str, Identity] | None = None,
        **common: Any,
    ) -> None:
        super().__init__(**common)
        self.binds = binds or {}  # bind sources below writable paths: bind_identities
        self.engine = engine
        self.engine_why = engine_why
        self.limits_problem = limits_problem
        self.bundle = bundle
        self.tmpdir = tmpdir
        self.sockets = sockets
        self.fifos = fifos


def _engine_spec(eng: Engine, image: str, argv: list[str], name: str) -> Spec:
    """The envelope's spec as far as the engine and runtime chosen decide it."""
    from corral.container.envelope import Spec

    spec = Spec(eng.path, image, argv)
    spec.engine_name = eng.name
    spec.runtime = eng.runtime_path
    spec.runtime_name = eng.runtime
    spec.cgroup_manager = eng.cgroup_manager
    spec.rootless = eng.rootless
    spec.swap_accounting = eng.swap_accounting
    spec.name = name
    return spec


def _seccomp_rules(runtime: str) -> tuple[SyscallRule, ...]:
    """corral's deny list for the engine's profile.  gVisor answers a filtered clone3
    with EPERM whatever errno the profile names, so glibc never falls back to
    clone() and no thread starts; its own clone3 creates no host namespace: the
    rule guards nothing there."""
    from corral import seccomp

    rules = seccomp.default_deny_rules()
    if runtime != "runsc":
        return rules
    return (*(r for r in rules if r.name != "clone3"), *gvisor_namespace_rules())


class ContainerTier(Tier):
    name = "container"
    strength = 60
    summary = "podman or docker with a hardened envelope (runc, or runsc = gVisor)"
    default_runtime = ""
    uses_container = True
    strategy = EngineLaunch

    def _engine(self, policy: Policy | None) -> tuple[Engine | None, str]:
        from corral.container import engine as engines

        chosen = policy.container.engine if policy is not None else ""
        eng, why = engines.find(chosen)
        if eng is None:
            return None, why
        runtime = (policy.container.runtime if policy is not None else "") or self.default_runtime
        problem = engines.choose_runtime(eng, runtime)
        if problem:
            return None, f"{eng.name}: {problem}"
        return eng, ""

    def health(self, probe: bool = False) -> Health:
        return self.health_for(None, probe)

    def health_for(self, policy: Policy | None, probe: bool = False) -> Health:
        from corral.container import engine as engines

        eng, why = self._engine(policy)
        if eng is None:
            return Health(False, why or "no container engine", {"engines": engines.describe_all()})
        if policy is not None and not image_for(policy):
            return Health(False, NO_IMAGE)
        details: dict[str, object] = {
            "engine": eng.path,
            "runtime": eng.runtime_path,
            "cgroups": eng.cgroups,
            "cgroup_manager": eng.cgroup_manager or "engine default",
            "ulimits": {k: list(v) for k, v in eng.ulimits.items()},
        }
        reason = f"{eng.name} at {eng.path}, runtime {eng.runtime}"
        quirks = []
        if eng.cgroup_manager:
            quirks.append(f"cgroup manager {eng.cgroup_manager} ({eng.cgroups} cgroups)")
        if eng.ulimits:
            quirks.append(
                "ulimits " + ", ".join(f"{k}={s}:{h}" for k, (s, h) in eng.ulimits.items())
            )
        if quirks:
            reason += "; applying " + "; ".join(quirks)
        # the other engines' state is for `corral doctor`, not every run's hot path
        others = engines.describe_all() if policy is None else ""
        if probe:
            import subprocess

            image = image_for(policy) if policy is not None else os.environ.get("CORRAL_IMAGE", "")
            try:
                out = subprocess.run(
                    [eng.path, "version", "--format", "{{.Client.Version}}"],
                    capture_output=True,
                    text=True,
                    timeout=20,
                )
                details["version"] = out.stdout.strip()
                if image:
                    exists = subprocess.run(
                        [eng.path, "image", "inspect", "--format", "{{.Id}}", image],
                        capture_output=True,
                        timeout=20,
                    )
                    if exists.returncode != 0:
                        return Health(False, f"{reason}; image {image} not found", details)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return Health(False, f"{eng.name} probe failed: {exc}", details)
        return Health(True, f"{reason} [{others}]" if others else reason, details)

    def limits_engine(self) -> tuple[str, str] | None:
        from corral.container.engine import find, limits_problem

        eng, _ = find()
        return None if eng is None else (eng.name, limits_problem(eng, ["memory", "pids"]))

    def python_argv(self) -> list[str]:
        from corral.container.bundle import host_bundle

        return list(host_bundle().argv)

    def gather(self, policy: Policy, agent: bool = False) -> ContainerFacts:
        import stat

        from corral import cgroups, home
        from corral.container.bundle import host_bundle
        from corral.container.engine import limits_problem

        facts = ContainerFacts()
        gather_common(policy, facts)
        facts.engine, facts.engine_why = self._engine(policy)
        if facts.engine is None:
            return facts
        facts.home = home.plan_home(policy, kind="container")
        facts.fs = fsplan.plan_filesystem(policy, environ=facts.environ)
        facts.binds = bind_identities(facts.fs.mounts, facts.fs.writable)
        need = [c for n, c in cgroups.CONTROLLERS.items() if policy.limits.get(n) is not None]
        facts.limits_problem = limits_problem(facts.engine, need)
        facts.bundle = host_bundle()
        facts.tmpdir = _tmpdir()
        facts.stdin_tty = os.isatty(0)
        if facts.engine.runtime == "runsc":
            sockets, fifos = set(), set()
            for m in facts.fs.mounts:
                try:
                    mode = os.lstat(m.dest).st_mode
                except OSError:
                    continue
                if m.kind == "mask-file" and stat.S_ISSOCK(mode):
                    sockets.add(m.dest)
                elif stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                    fifos.add(m.dest)
            facts.sockets, facts.fifos = frozenset(sockets), frozenset(fifos)
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
        from corral.fsplan import Mount

        facts = host if isinstance(host, ContainerFacts) else self.gather(policy)
        eng = facts.engine
        if eng is None:
            raise RefusedError(f"tier {self.name} is not available here: {facts.engine_why}")
        image = image_for(policy, facts.environ)
        if not image:
            raise RefusedError(f"tier {self.name} is not available here: {NO_IMAGE}")
        plan = Plan(self.name, policy)
        fs = facts.fs
        assert fs is not None and facts.bundle is not None
        plan.quarantine = fs.quarantine
        plan.repositories = fs.repositories
        plan.restore = dict.fromkeys(fs.keep_in_place, "in-place")
        plan.notes = list(fs.notes)
        plan.lock_watch = fs.lock_watch
        plan.hardlinks = fs.hardlinks
        plan.env = environ.sandbox_env(policy, facts.environ)
        plan.cwd = environ.sandbox_cwd(policy, fs.writable, facts.cwd)
        plan.seccomp = _seccomp_rules(eng.runtime)
        suffix = facts.token
        scratch = os.path.join(facts.tmpdir, f"corral-ctr-{suffix}")
        bundle = facts.bundle
        boot = os.path.join(os.path.dirname(os.path.dirname(__file__)), "container", "boot.py")
        # gVisor shows the container no cgroup files: nothing for boot to report,
        # and no host file the command could fill either (one was bound anyway)
        report = "-" if eng.runtime == "runsc" else REPORT
        own = [
            *bundle.mounts,
            Mount("ro-bind", BOOT, boot, "corral's first process inside"),
            Mount("ro-bind", ENV_FILE, f"{scratch}/env", "the command's environment"),
        ]
        if report != "-":
            own.append(
                Mount("bind", REPORT, f"{scratch}/report", "limits hit, written after the command")
            )
        inner = list(command)
        if policy.network.mode == "proxy":
            inner = self._through_door(plan, policy, bundle.argv, inner, own, door, net)
        plan.argv = []
        keep = ",".join(str(n) for n in sorted(pass_fds)) or "-"
        roots = self._lay_out(plan, policy, facts, [*own, *extra])
        checks = mount_checks(plan.mounts, fs.writable, eng.runtime, facts.binds)
        if checks:
            plan.mounts.append(Mount("ro-bind", CHECKS, f"{scratch}/checks", "bind sources"))
        check_arg = CHECKS if checks else "-"
        full = [*bundle.argv, "-I", "-S", BOOT, ENV_FILE, report, keep, check_arg, "--", *inner]
        spec = _engine_spec(eng, image, full, f"corral-{suffix}")
        self._limits(plan, policy, facts, spec)
        self._describe(spec, plan, facts, scratch, roots, net)
        if pass_fds:
            plan.fds = self._pass_fds(eng, pass_fds)
            spec.preserve_fds = max(pass_fds) - 2
        # a terminal on stdin gets a terminal inside (the engine's own pty, not
        # ours: TIOCSTI there cannot reach the caller's); the agent speaks frames,
        # and so does corral shell, whose relay makes the shell's pty inside
        spec.tty = not extra and facts.stdin_tty and shell.TTY_RELAY not in command
        self._envelope(plan, spec, facts, scratch, image)
        if checks:
            plan.prepare.append(("checks", checks.encode(), 0o644))
        return plan

    @staticmethod
    def _describe(
        spec: Spec,
        plan: Plan,
        facts: ContainerFacts,
        scratch: str,
        roots: list[str],
        net: NetExtras | None,
    ) -> None:
        """What the engine is told besides the image and argv: labels, ids, the
        seccomp profile's path, mounts and the paths bound over the image's."""
        policy = plan.policy
        proxied = policy.network.mode == "proxy"
        # the workspace label lets `podman ps --filter label=corral.workspace=DIR`
        # find one project's sandboxes (and tests find their own, not a neighbour's)
        spec.labels = {"corral": "1", "corral.workspace": policy.workspace}
        spec.uid, spec.gid = facts.uid, facts.gid
        spec.seccomp = f"{scratch}/seccomp.json"
        spec.mounts = plan.mounts
        spec.roots = roots
        if proxied:
            spec.roots.append("/etc/resolv.conf")  # ours, bound over the image's
        if net is not None and net.ca_bundle is not None:  # the image's bundle paths too
            spec.roots += list(net.system_bundles)
        spec.workdir = plan.cwd
        spec.host_uds = proxied
        # the relay binds the resolver (53) and host services at their own port,
        # which may be below 1024, in the container's own network namespace
        spec.low_ports = proxied
        spec.interactive = True

    def _envelope(
        self, plan: Plan, spec: Spec, facts: ContainerFacts, scratch: str, image: str
    ) -> None:
        """The engine's argv from the spec, the files the launcher writes in the
        scratch directory first, and how the run is started and removed."""
        from corral.container import envelope
        from corral.container.seccomp_oci import dumps, profile

        eng = facts.engine
        assert eng is not None
        try:
            plan.argv = envelope.run_argv(spec, mask_file=f"{scratch}/mask")
        except ValueError as exc:
            raise RefusedError(f"tier {self.name}: {exc}") from None
        plan.scratch = scratch
        plan.prepare = [
            ("env", env_file(plan.env), 0o600),
            ("report", b"", 0o600),
            ("mask", b"", 0o000),
            ("seccomp.json", dumps(profile(plan.seccomp)).encode(), 0o644),
        ]
        engine_env = {k: facts.environ[k] for k in ENGINE_ENV if k in facts.environ}
        remove = envelope.remove_argv(spec)
        plan.strategy = EngineLaunch(
            engine_env, f"{scratch}/report", remove, envelope.image_argv(spec)
        )
        plan.notes.append(
            f"{eng.name} with runtime {eng.runtime}, image {image}; the host's / is not "
            "visible, only the workspace and writable paths are bound in"
        )

    def _limits(self, plan: Plan, policy: Policy, facts: ContainerFacts, spec: Spec) -> None:
        """The engine's bounds: memory, pids and cpus when this host can enforce them
        (:meth:`_bounds`), the rlimits, the private tmpfs and shm sizes."""
        eng = facts.engine
        assert eng is not None
        lim = policy.limits
        pids = lim.get("pids")
        if eng.runtime == "runsc" and pids is not None and pids < GVISOR_MIN_PIDS:
            raise RefusedError(
                f"tier {self.name} with runsc cannot enforce a pids limit of {pids:g}: "
                "gVisor's own host threads count against it (it fails to start below "
                f"{GVISOR_MIN_PIDS}), so the limit bounds the sandbox, not its processes"
            )
        # gVisor applies rlimits in its own kernel, where the host's ceiling does not bind
        spec.ulimits = {} if eng.runtime == "runsc" else dict(eng.ulimits)
        if self._bounds(plan, eng, facts.limits_problem):
            spec.memory = int(lim.get("memory") or 0)
            spec.pids = int(lim.get("pids") or 0)
            spec.cpus = float(lim.get("cpus") or 0.0)
        tmp, shm = lim.get("tmp"), lim.get("shm")
        spec.tmp = None if tmp is None else int(tmp)
        spec.shm = None if shm is None else int(shm)

    def _lay_out(
        self, plan: Plan, policy: Policy, facts: ContainerFacts, own: list[Mount]
    ) -> list[str]:
        """``plan.mounts``: the home layer first, fsplan's list, then corral's own;
        the host paths bound in (the roots the envelope keeps fsplan's masks in)."""
        from corral.fsplan import Mount

        fs, eng = facts.fs, facts.engine
        assert fs is not None and eng is not None
        mounts = list(fs.mounts)
        if eng.runtime == "runsc":
            mounts = self._gvisor_sockets(policy, mounts, facts.sockets)
            self._gvisor_fifos(mounts, facts.fifos)
        roots = [*fs.writable, INSIDE]
        layer = facts.home
        first: list[Mount] = []
        if layer is not None:
            # the host's home is absent here: the layer is bound at $HOME itself, and
            # the host home's masks (secrets that are not in the container) are dropped
            # but those of a workspace inside it
            dest = plan.env["HOME"]
            mounts = [m for m in mounts if not inside(m.dest, dest) or _under(m.dest, fs.writable)]
            # first: a workspace inside the home is bound over it, not under it
            first.append(Mount("bind", dest, layer.path, "home layer at $HOME"))
            roots.append(dest)
            plan.home = layer
        plan.mounts = [*first, *mounts, *own]
        return roots

    def _bounds(self, plan: Plan, eng: Engine, problem: str) -> bool:
        """Record the limits as this engine applies them; False if it cannot for this
        user (``problem``: then they were all defaults, and none is passed: the
        engine would warn)."""
        from corral import bounds

        lim = plan.policy.limits
        bounds.apply_engine(plan, lim, eng.name, problem)  # refuses a limit that was set
        bounds.apply_scratch(plan, sized_by="tmpfs size")
        return not problem

    def _pass_fds(self, eng: Engine, pass_fds: Sequence[int]) -> dict[int, str]:
        """podman hands a container the descriptors 3..N (--preserve-fds): the numbers
        in between that were not asked for get /dev/null, which boot closes again."""
        if eng.name != "podman" or eng.runtime == "runsc":
            raise RefusedError(
                f"tier {self.name} with {eng.name} and {eng.runtime} cannot pass a descriptor "
                "into the container (--pass-fd needs podman with runc or crun)"
            )
        return {n: "pass" if n in pass_fds else "empty" for n in range(3, max(pass_fds) + 1)}

    def _gvisor_sockets(
        self, policy: Policy, mounts: list[Mount], host_sockets: frozenset[str]
    ) -> list[Mount]:
        """gVisor cannot mount over a socket (it fails to start), and needs none:
        it refuses host unix sockets unless told to open them, which only the
        door needs.  With the door, a host socket in a bound path would be
        reachable, so that is refused rather than left open.  ``host_sockets``:
        the masked paths that are unix sockets on this host."""
        roots = policy.writable_paths()
        kept: list[Mount] = []
        sockets: list[Mount] = []
        for m in mounts:
            if m.kind != "mask-file" or m.dest not in host_sockets:
                kept.append(m)
            elif any(m.dest == r or m.dest.startswith(r.rstrip("/") + "/") for r in roots):
                sockets.append(m)  # bound in with the workspace: it matters
            # (a host socket elsewhere is not in the container at all)
        if sockets and policy.network.mode == "proxy":
            raise RefusedError(
                f"tier {self.name} with runsc and a network cannot hide the host unix socket "
                f"{sockets[0].dest} (gVisor would have to open host sockets for the door); "
                "remove it, or use --oci-runtime runc"
            )
        return kept

    def _gvisor_fifos(self, mounts: list[Mount], fifos: frozenset[str]) -> None:
        """Refuse a mount over a FIFO or a device node (``fifos``: those among the
        targets on this host).  gVisor's gofer opens every mount target, and the
        open of a FIFO waits for ever, with runsc holding its lock: the run would
        never start.  Leaving the mount out would leave that path unprotected."""
        for m in mounts:
            if m.dest in fifos:
                raise RefusedError(
                    f"tier {self.name} cannot protect {m.dest} ({m.why or m.kind}): it is a "
                    "FIFO or a device node, and gVisor waits for ever on one it mounts over; "
                    "remove it, or use --oci-runtime runc"
                )

    def _through_door(
        self,
        plan: Plan,
        policy: Policy,
        python: list[str],
        command: list[str],
        own: list[Mount],
        door: str | None,
        net: NetExtras | None = None,
    ) -> list[str]:
        """The relay runs first inside (the engine owns the container's network
        namespace): the proxy's ports, a resolver and the allowed host services
        at their own address, each forwarded through the door."""
        from corral import netns
        from corral.fsplan import Mount
        from corral.net import door as doors
        from corral.net import trust

        if door is None:
            raise ValueError("network mode proxy needs the door's path")
        if policy.network.transparent:
            raise RefusedError(
                f"tier {self.name}: --transparent is not built for containers; "
                "use the proxy variables (the default)"
            )
        services, notes = netns.loopback_services(policy.network.allow, policy.network.deny)
        plan.notes = [*plan.notes, *notes]
        own += doors.door_mounts(door)
        own.append(Mount("ro-bind", "/etc/resolv.conf", netns.resolv_conf(), "the resolver"))
        plan.env = {**doors.proxy_env(), **plan.env}
        if net is not None:  # corral's CA, inside and over the image's system bundles
            own += trust.trust_mounts(net)
            plan.env = trust.sandbox_env(net, plan.env, trust.INSIDE_BUNDLE, policy.env.set_values)
        return [*doors.relay_argv(python, services), "--", *command]


class GVisorTier(ContainerTier):
    """The container tier with gVisor's runsc as the runtime (``--tier gvisor`` is
    ``--tier container --oci-runtime runsc``)."""

    name = "gvisor"
    strength = 80
    summary = "container tier with gVisor (runsc) as the OCI runtime"
    default_runtime = "runsc"


# measured with runsc 20221219: at 16 it does not start, near 100 it exits 2 with
# no output now and then (its host threads hit the limit), at 200 it runs
GVISOR_MIN_PIDS = 256

# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWPID, NEWNET
NAMESPACE_BITS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x20000000 | 0x40000000


def gvisor_namespace_rules() -> tuple[SyscallRule, ...]:
    """Under runc, new namespaces need CAP_SYS_ADMIN, which is dropped; gVisor's
    own kernel lets unshare(CLONE_NEWNS) through without it (measured), so the
    profile refuses every namespace flag there."""
    from corral.seccomp import ArgCond, SyscallRule

    return tuple(
        SyscallRule(
            name,
            1,  # EPERM, as a missing capability would say
            (ArgCond(0, "bits_set", NAMESPACE_BITS),),
            "new namespaces (gVisor does not require CAP_SYS_ADMIN for them)",
        )
        for name in ("unshare", "clone")
    )


def _in_writable(m: Mount, writable: Sequence[str]) -> bool:
    """A bind whose source lies below a writable path (not the path itself)."""
    src = m.src or m.dest
    return m.kind in ("bind", "ro-bind") and any(src != r and inside(src, r) for r in writable)


def bind_identities(mounts: Sequence[Mount], writable: Sequence[str]) -> dict[str, Identity]:
    """(file type, device, inode, mtime, ctime) of each bind source below a writable
    path, as it is now; a symlink or a missing source is left out (refused)."""
    import stat

    found = {}
    for m in mounts:
        if not _in_writable(m, writable):
            continue
        src = m.src or m.dest
        try:
            st = os.lstat(src)
        except OSError:
            continue
        if not stat.S_ISLNK(st.st_mode):
            kind = stat.S_IFMT(st.st_mode)
            found[src] = (kind, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
    return found


def mount_checks(
    mounts: Sequence[Mount], writable: Sequence[str], runtime: str, ids: dict[str, Identity]
) -> str:
    """What boot checks inside (see corral.container.boot): each bind whose source
    lies below a writable path, where the sandbox, or another run in the same
    workspace, can swap it for a symlink before the engine binds it, as the file
    corral found (``ids``).  runc shows the host's device and inode numbers; gVisor
    numbers its own, so there the times stand in (to the nanosecond, and the
    change time is set by no one).  A source that was a symlink already: refused."""
    lines = []
    for m in mounts:
        if not _in_writable(m, writable):
            continue
        src = m.src or m.dest
        if src not in ids:
            raise RefusedError(
                f"{src} changed while the run was set up (another run in this workspace "
                "may be swapping it for a link); nothing was run"
            )
        kind, dev, ino, mtime, ctime = ids[src]
        fields = (
            (kind, "-", "-", mtime, ctime) if runtime == "runsc" else (kind, dev, ino, "-", "-")
        )
        lines.append(" ".join(str(v) for v in (*fields, m.dest)) + "\n")
    return "".join(lines)


def _under(path: str, roots: list[str]) -> bool:
    return any(inside(path, r) for r in roots)


def _tmpdir() -> str:
    # the engine (root, or the user's own podman) must reach it: not a private dir
    return "/tmp" if os.path.isdir("/tmp") else os.path.realpath(os.environ.get("TMPDIR", "/tmp"))
