"""The bounds every run has unless the policy lifts them, and what each tier makes of them.

Defaults are a pure function of host facts (:func:`defaults_for`); the facts are
read once where a policy is loaded (:func:`host_facts`), never by a tier's
``plan()``.  Why these values (the README's "Limits" says the same):

* **memory**: half the host's RAM.  The other half stays with the host and the
  agent driving corral; a parallel C++ or Rust build (0.5-2 GB per compiler or
  linker job) and a test runner with one worker per core fit in half of a
  developer machine.  The private tmpfs pages count against it too.
* **pids**: 4096 tasks (threads count: a ``rustc`` or a Node worker is a dozen
  of them).  ``make -j64`` with its compilers, a browser with its renderers,
  fit; a fork bomb stops at an eighth of the smallest common ``pid_max`` (32768)
  and the host keeps the rest.  gVisor counts its own host threads against it
  (about nine per process with the ptrace platform, measured): some 450
  processes there.
* **tmp** (each of ``/tmp`` and ``/var/tmp``): a quarter of RAM, between 512 MiB
  and 4 GiB.  pip unpacking a large wheel (torch: about 2 GB) through ``/tmp``
  fits on a 16 GiB machine.
* **shm** (``/dev/shm``): RAM/16, between 64 MiB and 1 GiB; Chromium and
  Playwright want about 1 GiB (the container engines' 64 MiB is famously too
  little for them).
* **/run**: 64 MiB, fixed: corral's own mount point and a few runtime files.

A bound that was *set* (flag or policy) and cannot be enforced is refused
(exit 122).  A *default* that cannot be enforced for this user is left out:
:func:`notice` says so in one line, and the run record keeps it.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.cgroups import CgroupHost
    from corral.policy import Limits
    from corral.tiers.base import Plan

MiB = 1 << 20
GiB = 1 << 30
DEFAULT_PIDS = 4096
RUN_SIZE = 64 * MiB  # the private /run, every tier that has one
NAMES = ("timeout", "memory", "pids", "cpus", "tmp", "shm")
CGROUP_NAMES = ("memory", "pids", "cpus")
SCRATCH_NAMES = ("tmp", "shm")
UNKNOWN_RAM = 4 * GiB  # if the host will not say: assume a small machine


class HostFacts:
    """What the defaults depend on."""

    __slots__ = ("memory",)

    def __init__(self, memory: int) -> None:
        self.memory = memory  # bytes of RAM


def host_facts() -> HostFacts:
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        ram = 0
    return HostFacts(ram)


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def _whole_mib(size: int) -> int:
    return size - size % MiB


def defaults_for(facts: HostFacts) -> dict[str, int]:
    """This host's default bounds, by limit name (bytes, or tasks for pids)."""
    ram = facts.memory if facts.memory > 0 else UNKNOWN_RAM
    return {
        "memory": _whole_mib(ram // 2),
        "pids": DEFAULT_PIDS,
        "tmp": _whole_mib(_clamp(ram // 4, 512 * MiB, 4 * GiB)),
        "shm": _whole_mib(_clamp(ram // 16, 64 * MiB, GiB)),
    }


def size_text(size: float) -> str:
    """``4G``, ``12052M``, ``1536K``, ``1000B``: exact, and readable back by
    ``parse_size`` (which wants a unit on every number but 0)."""
    n = int(size)
    for unit, factor in (("T", 1 << 40), ("G", GiB), ("M", MiB), ("K", 1 << 10)):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{unit}"
    return f"{n}B" if n else "0"


def value_text(name: str, value: float | None) -> str:
    if value is None:
        return "none"
    if name in ("memory", "tmp", "shm", "run"):
        return size_text(value)
    if name == "timeout":
        return f"{value:g}s"
    return f"{value:g}"


class Bound:
    """One limit as a plan applies it."""

    __slots__ = ("enforced", "how", "name", "source", "value")

    def __init__(
        self, name: str, value: float | None, source: str, enforced: bool | None, how: str
    ) -> None:
        self.name = name
        self.value = value  # None: no bound
        self.source = source  # "set", "none" (lifted), "default" or "" (no bound)
        self.enforced = enforced  # None: nothing to enforce, or not on this tier
        self.how = how  # the mechanism, or why not

    def describe(self) -> str:
        shown = {"set": "(set)", "default": "(default)", "fixed": "(fixed)", "none": "(lifted)"}
        source = shown.get(self.source, "")
        text = f"{self.name:<8} {value_text(self.name, self.value):<8} {source:<9}"
        if self.enforced is True:
            return f"{text}  enforced: {self.how}"
        if self.enforced is False:
            return f"{text}  NOT enforced: {self.how}"
        return f"{text}  {self.how}".rstrip()


def _add(plan: Plan, limits: Limits, name: str, enforced: bool | None, how: str) -> None:
    value = limits.get(name)
    if value is None:
        enforced, how = None, ""
    plan.bounds[name] = Bound(name, value, limits.source(name), enforced, how)


def apply_cgroup(plan: Plan, limits: Limits, host: CgroupHost | None = None) -> None:
    """memory, pids and cpus through a cgroup (and the timeout, by corral itself), on
    the cgroup layout ``host`` (:attr:`HostFacts.cgroups`; read now when None)."""
    from corral import cgroups

    cg, dropped, why = cgroups.plan_for(limits, host)
    plan.cgroup = cg
    _add(plan, limits, "timeout", True, "corral kills the whole process tree")
    for name in CGROUP_NAMES:
        if cgroups.CONTROLLERS[name] in dropped:
            _add(plan, limits, name, False, why)
        else:
            _add(plan, limits, name, True, f"cgroup {cg.version}" if cg else "")
    _note(plan)


def apply_engine(plan: Plan, limits: Limits, engine: str, problem: str) -> None:
    """memory, pids and cpus through a container engine; ``problem``: why it cannot
    enforce them for this user ("" if it can).  A limit that was set is refused then."""
    if problem:
        refused = [n for n in CGROUP_NAMES if limits.source(n) == "set"]
        if refused:
            from corral.errors import RefusedError

            raise RefusedError(f"cannot enforce the {', '.join(refused)} limit here: {problem}")
    _add(plan, limits, "timeout", True, "corral kills the whole process tree")
    for name in CGROUP_NAMES:
        _add(plan, limits, name, not problem, problem or f"{engine} (the container's cgroup)")
    _note(plan)


def apply_scratch(
    plan: Plan, sized_by: str = "", absent: str = "", blocked: tuple[str, ...] = ()
) -> None:
    """tmp and shm.  ``sized_by``: how the tier bounds its private tmpfs; or ``absent``:
    why it has none, and a size that was set is refused then, except for the names in
    ``blocked`` (nothing can be written there on this tier at all)."""
    limits = plan.policy.limits
    where = {"tmp": "/tmp and /var/tmp (each)", "shm": "/dev/shm"}
    for name in SCRATCH_NAMES:
        if sized_by:
            _add(plan, limits, name, True, f"{sized_by} of {where[name]}")
        elif name in blocked:
            _add(plan, limits, name, None, f"does not apply: {where[name]} is off limits")
        elif limits.source(name) == "set":
            from corral.errors import RefusedError

            raise RefusedError(f"cannot enforce the {name} limit on the {plan.tier} tier: {absent}")
        else:
            _add(plan, limits, name, None, f"does not apply: {absent}")
    if sized_by:
        plan.bounds["run"] = Bound("run", RUN_SIZE, "fixed", True, f"{sized_by} of /run")


def unenforced(plan: Plan) -> list[str]:
    """Defaults this run goes without."""
    return [b.name for b in plan.bounds.values() if b.source == "default" and b.enforced is False]


def notice(plan: Plan) -> str:
    """One line naming the defaults not enforced here, and why ("" if none)."""
    names = unenforced(plan)
    if not names:
        return ""
    why = plan.bounds[names[0]].how
    listed = " and ".join(f"{n} ({value_text(n, plan.bounds[n].value)})" for n in names)
    remedy = (
        "root or a delegated cgroup v2 subtree enforces them; "
        if all(n in CGROUP_NAMES for n in names)
        else ""
    )
    lift = " ".join(f"--{n} none" for n in names)
    return (
        f"the default {listed} limit{'s are' if len(names) > 1 else ' is'} not enforced "
        f"for this user here: {why} ({remedy}{lift} goes without, and without this line)"
    )


def _note(plan: Plan) -> None:
    line = notice(plan)
    if line:
        plan.notes.append(line)


def skipped_at_setup(plan: Plan) -> str:
    """If setting up the cgroup failed for defaults only: mark them, and the one line."""
    if plan.cgroup is None or not plan.cgroup.skipped:
        return ""
    for name in CGROUP_NAMES:
        bound = plan.bounds.get(name)
        if bound is not None and bound.enforced and bound.source == "default":
            bound.enforced, bound.how = False, plan.cgroup.skipped
    return notice(plan)


def record(plan: Plan) -> dict[str, object]:
    """For the run record: each bound with a value or lifted, its source, enforced or not."""
    out: dict[str, object] = {}
    for b in plan.bounds.values():
        if b.source:
            out[b.name] = {"value": b.value, "source": b.source, "enforced": b.enforced}
    return out


def describe(plan: Plan) -> list[str]:
    limits = plan.policy.limits
    if not plan.bounds:
        return [
            f"limits: timeout={limits.timeout} memory={limits.memory} pids={limits.pids} "
            f"cpus={limits.cpus} output={limits.output}"
        ]
    lines = ["limits:"]
    lines += [f"  {b.describe()}" for b in plan.bounds.values()]
    lines.append(f"  {'output':<8} {size_text(limits.output):<8} {'':<9}  kept of stdout+stderr")
    return lines


def host_report(
    engine: str = "", engine_problem: str | None = None
) -> dict[str, dict[str, object]]:
    """This host's defaults and, for this user, whether each tier enforces them
    (``corral doctor``).  ``engine_problem`` is None without a usable engine."""
    from corral import cgroups
    from corral.policy import Limits

    ram = host_facts().memory
    limits = Limits()
    limits.defaults = defaults_for(HostFacts(ram))
    try:
        cg, dropped, why = cgroups.plan_for(limits)
    except Exception as exc:  # doctor reports; it never fails on one check
        cg, dropped, why = None, list(cgroups.CONTROLLERS.values()), str(exc)
    report: dict[str, dict[str, object]] = {}
    for name in ("memory", "pids"):
        row: dict[str, object] = {"value": limits.defaults[name]}
        if cgroups.CONTROLLERS[name] in dropped:
            row["namespace, landlock, none"] = f"NOT enforced for this user: {why}"
        else:
            row["namespace, landlock, none"] = f"enforced (cgroup {cg.version if cg else '?'})"
        if engine_problem is not None:
            row["container, gvisor"] = (
                f"NOT enforced for this user: {engine_problem}"
                if engine_problem
                else f"enforced ({engine})"
            )
        report[name] = row
    report["tmp"] = {
        "value": limits.defaults["tmp"],
        "namespace, container, gvisor": "enforced (tmpfs size of /tmp and /var/tmp, each)",
        "landlock": "does not apply: no private /tmp; TMPDIR is a directory on the host's "
        "$TMPDIR or /tmp, bounded only by that filesystem's free space",
        "none": "does not apply: the host's own /tmp",
    }
    report["shm"] = {
        "value": limits.defaults["shm"],
        "namespace, container, gvisor": "enforced (tmpfs size of /dev/shm)",
        "landlock": "does not apply: /dev/shm is off limits",
        "none": "does not apply: the host's own /dev/shm",
    }
    report["run"] = {"value": RUN_SIZE, "namespace, container, gvisor": "fixed tmpfs size of /run"}
    return {"ram": {"value": ram}, **report}


def report_lines(report: dict[str, dict[str, object]]) -> list[str]:
    ram = float(str(report["ram"]["value"]))
    lines = [
        f"defaults (this host: {ram / GiB:.1f}G RAM; set --memory --pids --tmp --shm "
        "or [limits]; none lifts one):"
    ]
    for name, row in report.items():
        if name == "ram":
            continue
        value = row["value"]
        shown = size_text(float(str(value))) if name != "pids" else str(value)
        where = [f"{k}: {v}" for k, v in row.items() if k != "value"]
        lines.append(f"  {name:<7} {shown:<7} {where[0]}")
        lines.extend(f"  {'':<7} {'':<7} {w}" for w in where[1:])
    return lines
