"""Memory, pids and CPU limits through cgroups (v2 where the host delegates the
controllers, v1 otherwise), and the cleanup that leaves no cgroup behind.

:func:`plan_cgroup` is pure: host layout + limits -> a :class:`CgroupPlan` or a
refusal.  :class:`CgroupRun` does the writes.  A limit the host cannot enforce
is refused (:class:`~corral.errors.RefusedError`), never silently dropped.
"""

from __future__ import annotations

import os

from corral.errors import RefusedError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.policy import Limits

CPU_PERIOD_US = 100_000


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
    try:
        with open(mounts, encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 4:
                    continue
                if parts[2] == "cgroup2" and host.v2_mount is None:
                    host.v2_mount = parts[1]
                elif parts[2] == "cgroup":
                    for opt in parts[3].split(","):
                        if opt in ("memory", "pids", "cpu"):
                            v1_mounts[opt] = parts[1]
        with open(cgroup, encoding="utf-8") as fh:
            memberships = [line.rstrip("\n").split(":", 2) for line in fh]
    except OSError:
        return host
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
    if not os.access(base, os.W_OK):
        return set()
    try:
        with open(os.path.join(base, "cgroup.subtree_control"), encoding="utf-8") as fh:
            enabled = set(fh.read().split())
        with open(os.path.join(base, "cgroup.controllers"), encoding="utf-8") as fh:
            available = set(fh.read().split())
    except OSError:
        return set()
    # A controller that is available but not yet enabled can be enabled only
    # if base holds no processes (or is the root); try it at setup time.
    return enabled | available


class CgroupPlan:
    """Which controller lives where, and what to write into each file."""

    __slots__ = ("settings", "version")

    def __init__(self, version: str) -> None:
        self.version = version  # "v2" or "v1"
        # (controller or "" for v2, parent dir, file name, value)
        self.settings: list[tuple[str, str, str, str]] = []

    def describe(self) -> str:
        return f"{self.version} " + " ".join(f"{f}={v}" for _, _, f, v in self.settings)


def wanted(limits: Limits) -> list[str]:
    need = []
    if limits.memory is not None:
        need.append("memory")
    if limits.pids is not None:
        need.append("pids")
    if limits.cpus is not None:
        need.append("cpu")
    return need


def plan_cgroup(limits: Limits, host: CgroupHost) -> CgroupPlan | None:
    """Decide how to enforce the limits, or raise RefusedError saying why we cannot."""
    need = wanted(limits)
    if not need:
        return None
    if host.v2_base and all(c in host.v2_controllers for c in need):
        plan = CgroupPlan("v2")
        base = host.v2_base
        if limits.memory is not None:
            plan.settings.append(("memory", base, "memory.max", str(limits.memory)))
            plan.settings.append(("memory", base, "memory.swap.max", "0"))
        if limits.pids is not None:
            plan.settings.append(("pids", base, "pids.max", str(limits.pids)))
        if limits.cpus is not None:
            quota = max(1000, round(limits.cpus * CPU_PERIOD_US))
            plan.settings.append(("cpu", base, "cpu.max", f"{quota} {CPU_PERIOD_US}"))
        return plan
    missing = [c for c in need if c not in host.v1 or not os.access(host.v1[c], os.W_OK)]
    if missing:
        lacking = ", ".join(c for c in need if c not in host.v2_controllers)
        where = (
            "no cgroup v2 delegation"
            if not host.v2_controllers
            else f"cgroup v2 at {host.v2_base} lacks {lacking}"
        )
        raise RefusedError(
            f"cannot enforce the {', '.join(missing)} limit here: {where}, and the cgroup v1 "
            f"{'/'.join(missing)} hierarchy is not writable by this user "
            "(run as root, or delegate a cgroup v2 subtree, or drop the limit)"
        )
    plan = CgroupPlan("v1")
    if limits.memory is not None:
        plan.settings.append(
            ("memory", host.v1["memory"], "memory.limit_in_bytes", str(limits.memory))
        )
        plan.settings.append(
            ("memory", host.v1["memory"], "memory.memsw.limit_in_bytes", str(limits.memory))
        )
    if limits.pids is not None:
        plan.settings.append(("pids", host.v1["pids"], "pids.max", str(limits.pids)))
    if limits.cpus is not None:
        quota = max(1000, round(limits.cpus * CPU_PERIOD_US))
        plan.settings.append(("cpu", host.v1["cpu"], "cpu.cfs_period_us", str(CPU_PERIOD_US)))
        plan.settings.append(("cpu", host.v1["cpu"], "cpu.cfs_quota_us", str(quota)))
    return plan


def plan_for(limits: Limits) -> CgroupPlan | None:
    """plan_cgroup on this host; reads /proc only when a limit asks for a cgroup."""
    return plan_cgroup(limits, detect()) if wanted(limits) else None


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(value)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return ""


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
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def limits_hit(self) -> list[str]:
        hit = []
        for ctl, parent, _, _ in self.plan.settings:
            path = os.path.join(parent, self.name)
            if ctl == "memory" and "memory" not in hit:
                if self.plan.version == "v2":
                    events = _read(os.path.join(path, "memory.events"))
                    if _counter(events, "oom_kill") or _counter(events, "max"):
                        hit.append("memory")
                else:
                    oom = _read(os.path.join(path, "memory.oom_control"))
                    fail = _read(os.path.join(path, "memory.failcnt")).strip()
                    if _counter(oom, "oom_kill") or (fail.isdigit() and int(fail) > 0):
                        hit.append("memory")
            elif (
                ctl == "pids"
                and "pids" not in hit
                and _counter(_read(os.path.join(path, "pids.events")), "max")
            ):
                hit.append("pids")
        return hit

    def pids(self) -> list[int]:
        found: set[int] = set()
        for procs in self.procs_files():
            found.update(int(x) for x in _read(procs).split() if x.isdigit())
        return sorted(found)

    def kill_all(self) -> None:
        if self.plan.version == "v2":
            for d in self.dirs:
                try:
                    _write(os.path.join(d, "cgroup.kill"), "1")
                except OSError:
                    pass
        for pid in self.pids():
            try:
                os.kill(pid, 9)
            except OSError:
                pass

    def remove(self) -> None:
        """Kill what is left and remove the directories; retries while the kernel reaps."""
        import time

        for _ in range(200):
            remaining = []
            for d in self.dirs:
                try:
                    os.rmdir(d)
                except FileNotFoundError:
                    pass
                except OSError:
                    remaining.append(d)
            self.dirs = remaining
            if not remaining:
                return
            self.kill_all()
            time.sleep(0.01)


def _counter(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0
