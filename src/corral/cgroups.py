"""Memory, pids and CPU limits through cgroups (v2 where the host delegates the
controllers, v1 otherwise), and the cleanup that leaves no cgroup behind.

:func:`settle` is pure: host layout + limits -> a :class:`CgroupPlan` or a
refusal.  :class:`CgroupRun` does the writes.  A limit that was *set* and that
the host cannot enforce is refused (:class:`~corral.errors.RefusedError`),
never silently dropped; a *default* the host cannot enforce is left out, and
the caller says so (:mod:`corral.bounds`).
"""

from __future__ import annotations

import os

from corral.errors import RefusedError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from corral.policy import Limits

CPU_PERIOD_US = 100_000
THREADED = frozenset({"cpu", "cpuset", "perf_event", "pids"})  # cgroup v2's threaded controllers
# the controller each limit needs
CONTROLLERS = {"memory": "memory", "pids": "pids", "cpus": "cpu"}


class CgroupHost:
    """Where each controller can be found on this host, and whether we may write there."""

    __slots__ = ("v1", "v2_base", "v2_controllers", "v2_mount")

    def __init__(self) -> None:
        self.v2_mount: str | None = None
        self.v2_base: str | None = None  # our own cgroup inside the v2 mount
        self.v2_controllers: set[str] = set()  # enabled for children of v2_base (or enableable)
        self.v1: dict[str, str] = {}  # controller -> our own cgroup dir in its v1 hierarchy


def detect(mounts: str = "/proc/self/mounts", cgroup: str = "/proc/self/cgroup") -> CgroupHost:
    host = CgroupHost()
    v1_mounts: dict[str, str] = {}
    table, membership = _read(mounts), _read(cgroup)  # on every run as root: no file objects
    if not table or not membership:
        return host
    for line in table.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        if parts[2] == "cgroup2" and host.v2_mount is None:
            host.v2_mount = parts[1]
        elif parts[2] == "cgroup":
            for opt in parts[3].split(","):
                if opt in ("memory", "pids", "cpu"):
                    v1_mounts[opt] = parts[1]
    memberships = [line.split(":", 2) for line in membership.splitlines()]
    for entry in memberships:
        if len(entry) != 3:
            continue
        hier, controllers, path = entry
        if hier == "0" and host.v2_mount:
            host.v2_base = os.path.join(host.v2_mount, path.lstrip("/"))
        for ctl in controllers.split(","):
            if ctl in v1_mounts:
                host.v1[ctl] = os.path.join(v1_mounts[ctl], path.lstrip("/"))
    if host.v2_base:
        host.v2_controllers = _v2_usable(host.v2_base)
    return host


def _v2_usable(base: str) -> set[str]:
    """Controllers that children of ``base`` can use, if we may create children."""
    available = set(_read(os.path.join(base, "cgroup.controllers")).split())
    if not available or not os.access(base, os.W_OK):
        return set()  # (a hybrid host's v2 tree has no controllers: one read)
    enabled = set(_read(os.path.join(base, "cgroup.subtree_control")).split())
    # A controller available but not yet enabled can be enabled for children
    # only if base is the root, or the controller is a threaded one: base holds
    # us, and the kernel refuses a domain controller (memory) below a cgroup with
    # processes in it (EBUSY).
    root = not os.path.exists(os.path.join(base, "cgroup.type"))  # only non-root ones have it
    return enabled | {c for c in available if root or c in THREADED}


class CgroupPlan:
    """Which controller lives where, and what to write into each file."""

    __slots__ = ("optional", "settings", "skipped", "version")

    def __init__(self, version: str) -> None:
        self.version = version  # "v2" or "v1"
        # (controller or "" for v2, parent dir, file name, value)
        self.settings: list[tuple[str, str, str, str]] = []
        # controllers whose limit is a default: if setting them up fails, the run
        # goes on without them (and says so) instead of being refused
        self.optional: set[str] = set()
        self.skipped = ""  # why setting up failed for optional controllers only

    def describe(self) -> str:
        return f"{self.version} " + " ".join(f"{f}={v}" for _, _, f, v in self.settings)


def wanted(limits: Limits) -> list[str]:
    return [ctl for name, ctl in CONTROLLERS.items() if limits.get(name) is not None]


def _missing(need: list[str], host: CgroupHost) -> tuple[str, list[str]]:
    """The version that enforces every controller in ``need``, or the ones neither can."""
    if host.v2_base and all(c in host.v2_controllers for c in need):
        return "v2", []
    missing = [c for c in need if c not in host.v1 or not os.access(host.v1[c], os.W_OK)]
    return ("" if missing else "v1"), missing


def _why(missing: list[str], need: list[str], host: CgroupHost) -> str:
    lacking = ", ".join(c for c in need if c not in host.v2_controllers)
    where = (
        "no cgroup v2 delegation"
        if not host.v2_controllers
        else f"cgroup v2 at {host.v2_base} lacks {lacking}"
    )
    return f"{where}, and the cgroup v1 {'/'.join(missing)} hierarchy is not writable by this user"


def settle(limits: Limits, host: CgroupHost) -> tuple[CgroupPlan | None, list[str], str]:
    """How to enforce the limits: the plan, the defaults left out, and why.

    Raises RefusedError when a limit that was set (not a default) cannot be enforced.
    """
    need = wanted(limits)
    if not need:
        return None, [], ""
    version, missing = _missing(need, host)
    dropped: list[str] = []
    why = ""
    if missing:
        why = _why(missing, need, host)
        names = {ctl: name for name, ctl in CONTROLLERS.items()}
        refused = [c for c in missing if limits.source(names[c]) != "default"]
        if refused:
            raise RefusedError(
                f"cannot enforce the {', '.join(refused)} limit here: {why} "
                "(run as root, or delegate a cgroup v2 subtree, or drop the limit)"
            )
        dropped = missing
        need = [c for c in need if c not in missing]
        if not need:
            return None, dropped, why
        version, missing = _missing(need, host)  # the rest, all enforceable (v1 or v2)
    plan = _build(version, need, limits, host)
    plan.optional = {ctl for name, ctl in CONTROLLERS.items() if limits.source(name) == "default"}
    return plan, dropped, why


def _build(version: str, need: list[str], limits: Limits, host: CgroupHost) -> CgroupPlan:
    plan = CgroupPlan(version)
    memory, pids, cpus = (limits.get(n) if CONTROLLERS[n] in need else None for n in CONTROLLERS)
    quota = max(1000, round(cpus * CPU_PERIOD_US)) if cpus is not None else 0
    if version == "v2":
        base = host.v2_base or ""
        if memory is not None:
            plan.settings.append(("memory", base, "memory.max", str(int(memory))))
            plan.settings.append(("memory", base, "memory.swap.max", "0"))
        if pids is not None:
            plan.settings.append(("pids", base, "pids.max", str(int(pids))))
        if cpus is not None:
            plan.settings.append(("cpu", base, "cpu.max", f"{quota} {CPU_PERIOD_US}"))
        return plan
    if memory is not None:
        mem = host.v1["memory"]
        plan.settings.append(("memory", mem, "memory.limit_in_bytes", str(int(memory))))
        plan.settings.append(("memory", mem, "memory.memsw.limit_in_bytes", str(int(memory))))
    if pids is not None:
        plan.settings.append(("pids", host.v1["pids"], "pids.max", str(int(pids))))
    if cpus is not None:
        plan.settings.append(("cpu", host.v1["cpu"], "cpu.cfs_period_us", str(CPU_PERIOD_US)))
        plan.settings.append(("cpu", host.v1["cpu"], "cpu.cfs_quota_us", str(quota)))
    return plan


def plan_cgroup(limits: Limits, host: CgroupHost) -> CgroupPlan | None:
    """Decide how to enforce the limits, or raise RefusedError saying why we cannot."""
    return settle(limits, host)[0]


def plan_for(
    limits: Limits, host: CgroupHost | None = None
) -> tuple[CgroupPlan | None, list[str], str]:
    """settle() on ``host`` (this host's layout, read now when None); reads /proc only
    when a limit asks for a cgroup."""
    if not wanted(limits):
        return None, [], ""
    return settle(limits, detect() if host is None else host)


def _write(path: str, value: str) -> None:
    # one write(2) with no buffered file object around it: on every run as root
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:
        return ""
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


class CgroupRun:
    """The cgroup directories of one run: create, join, inspect, kill, remove."""

    def __init__(self, plan: CgroupPlan, run_id: str) -> None:
        self.plan = plan
        self.name = f"corral-{run_id}"
        self.dirs: list[str] = []  # one per distinct parent (v1: one per controller)

    def create(self) -> None:
        parents: list[str] = []
        for _, parent, _, _ in self.plan.settings:
            if parent not in parents:
                parents.append(parent)
        try:
            for parent in parents:
                if self.plan.version == "v2":
                    self._enable_v2(parent)
                path = os.path.join(parent, self.name)
                os.mkdir(path, 0o755)
                self.dirs.append(path)
            for _, parent, name, value in self.plan.settings:
                target = os.path.join(parent, self.name, name)
                swap = name.endswith("memsw.limit_in_bytes") or name == "memory.swap.max"
                if swap and not os.path.exists(target):
                    continue  # no swap accounting on this host: nothing to escape into
                _write(target, value)
        except OSError as exc:
            self.remove()
            if {ctl for ctl, _, _, _ in self.plan.settings} <= self.plan.optional:
                # only defaults: the run goes on unbounded by them, and says so
                self.plan.skipped = f"cannot set up a cgroup here: {exc.strerror or exc}"
                return
            raise RefusedError(f"cannot set up the cgroup for the limits: {exc}") from None

    def _enable_v2(self, parent: str) -> None:
        need = {ctl for ctl, _, _, _ in self.plan.settings}
        enabled = set(_read(os.path.join(parent, "cgroup.subtree_control")).split())
        todo = need - enabled
        if todo:
            _write(
                os.path.join(parent, "cgroup.subtree_control"),
                " ".join(f"+{c}" for c in sorted(todo)),
            )

    def procs_files(self) -> list[str]:
        """The files a process joins the run's cgroups through, by writing ``0`` (itself).

        v1: ``tasks``, which moves the writing thread alone, and so (unlike a pid
        written to cgroup.procs) without the kernel's global threadgroup lock,
        whose RCU grace period cost 4 ms per run here.  Used by single-threaded
        processes only (a forked child, or spawn_inside), where a thread is the
        whole process."""
        name = "tasks" if self.plan.version == "v1" else "cgroup.procs"
        return [os.path.join(d, name) for d in self.dirs]

    def limits_hit(self) -> list[str]:
        hit = []
        where = {ctl: os.path.join(parent, self.name) for ctl, parent, _, _ in self.plan.settings}
        if "memory" in where:  # each file once: this runs after every run as root
            path = where["memory"]
            if self.plan.version == "v2":
                events = _read(os.path.join(path, "memory.events"))
                if _counter(events, "oom_kill") or _counter(events, "max"):
                    hit.append("memory")
            else:
                oom = _read(os.path.join(path, "memory.oom_control"))
                fail = _read(os.path.join(path, "memory.failcnt")).strip()
                if _counter(oom, "oom_kill") or (fail.isdigit() and int(fail) > 0):
                    hit.append("memory")
        if "pids" in where and _counter(_read(os.path.join(where["pids"], "pids.events")), "max"):
            hit.append("pids")
        return hit

    def pids(self) -> list[int]:
        found: set[int] = set()
        for d in self.dirs:
            found.update(
                int(x) for x in _read(os.path.join(d, "cgroup.procs")).split() if x.isdigit()
            )
        return sorted(found)

    def kill_all(self) -> None:
        if self.plan.version == "v2":
            for d in self.dirs:
                try:
                    _write(os.path.join(d, "cgroup.kill"), "1")
                except OSError:
                    pass
        me = os.getpid()  # inside only while spawning into it (spawn_inside): never us
        for pid in self.pids():
            if pid == me:
                continue
            try:
                os.kill(pid, 9)
            except OSError:
                pass

    def remove(self, wait: bool = True) -> None:
        """Kill what is left and remove the directories; retries while the kernel reaps
        (for up to 2 s), or with ``wait`` False, tries once (``dirs``: what is left)."""
        import time

        # The sandbox's last processes are usually still being reaped when the run
        # ends (bwrap's init, reparented): short waits first, not 10 ms each time.
        pause = 0.0002
        deadline = time.monotonic() + 2.0
        while True:
            remaining = []
            for d in self.dirs:
                try:
                    os.rmdir(d)
                except FileNotFoundError:
                    pass
                except OSError:
                    remaining.append(d)
            self.dirs = remaining
            if not remaining or not wait or time.monotonic() > deadline:
                return
            self.kill_all()
            time.sleep(pause)
            pause = min(pause * 2, 0.01)


def _other_threads() -> int:
    """Threads started by the threading module besides the main one."""
    import _thread

    return int(_thread._count())


def spawn_inside(procs_files: list[str], start: Callable[[], int]) -> int | None:
    """Run ``start`` (a posix_spawn) with this process inside the run's cgroups, then
    come back: the child starts inside, as a forked child that joins them would,
    without a fork of this interpreter.  cgroup v1 only: there a process may move
    back into its old cgroup whatever the children do (v2 constrains that).

    Only in a single-threaded process (the CLI), where the thread moved through
    ``tasks`` is the whole process; a long-lived one (Sandbox) starts rarely and
    forks instead.  Returns None when it cannot be used; the caller forks and
    joins then.
    """
    if _other_threads():
        return None
    # our own cgroup in each hierarchy: the parent of the run's (see CgroupRun)
    homes = [
        os.path.join(os.path.dirname(os.path.dirname(p)), os.path.basename(p)) for p in procs_files
    ]
    joined: list[str] = []
    try:
        for procs, home in zip(procs_files, homes, strict=True):
            _write(procs, "0")
            joined.append(home)
        return start()
    except OSError:
        return None  # e.g. a pids limit too small for us and the child: fork instead
    finally:
        for home in reversed(joined):
            _write(home, "0")


def _counter(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


STALE_AFTER = 60.0  # seconds an empty run cgroup may stand before a sweep removes it


def sweep_stale(root: str = "/sys/fs/cgroup", depth: int = 5, now: float | None = None) -> int:
    """Remove corral's empty run cgroups (``corral-<run id>``) older than
    STALE_AFTER, of this user, anywhere under ``root``; how many went.

    A run's guardian removes its cgroups when corral is killed, but a process
    manager may kill the guardian too: Ray, when a batch's driver dies, kills
    the actor's children, and its warm sandbox's cgroups stayed.  Called where a
    batch starts (off every run's path).  Safe beside live runs: a cgroup with a
    process in it, or a child, cannot be removed, and one empty because its run
    is only starting is younger than STALE_AFTER."""
    import time

    now = time.time() if now is None else now
    removed = 0
    level = [root]
    for _ in range(depth):
        below = []
        for parent in level:
            try:
                entries = list(os.scandir(parent))
            except OSError:
                continue
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                if entry.name.startswith("corral-"):
                    removed += _remove_if_stale(entry, now)
                else:
                    below.append(entry.path)
        level = below
    return removed


def _remove_if_stale(entry: os.DirEntry[str], now: float) -> int:
    try:
        info = entry.stat(follow_symlinks=False)
        if info.st_uid != os.geteuid() or now - info.st_ctime < STALE_AFTER:
            return 0
        if _read(os.path.join(entry.path, "cgroup.procs")).strip():
            return 0
        os.rmdir(entry.path)
    except OSError:
        return 0
    return 1
