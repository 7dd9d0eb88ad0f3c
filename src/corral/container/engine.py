"""Which container engine and OCI runtime to use, and what this host needs of them.

Order: the policy's ``[container] engine`` (or ``--engine``), else
``$CORRAL_ENGINE``, else the first *usable* of podman, docker.  An engine
that is named but unusable is refused with the reason; nothing falls back to
another engine or tier.  Everything here reads files or connects to a socket;
only ``probe()`` (``corral doctor --probe``) runs the engine.
"""

from __future__ import annotations

import os

ORDER = ("podman", "docker")
DOCKER_SOCKET = "/var/run/docker.sock"
# podman (as root) asks for this many open files unless told otherwise; a
# caller whose hard limit is lower cannot grant it and the runtime fails.
PODMAN_DEFAULT_NOFILE = 1048576
NPROC_CEILING = 32768
SBIN = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def which(name: str) -> str | None:
    """A program from PATH or the sbin directories (runc lives in /usr/sbin)."""
    path = os.environ.get("PATH", "")
    dirs = [d for d in path.split(":") if os.path.isabs(d)]  # never "" or "." (the workspace)
    for d in [*dirs, *SBIN]:
        candidate = os.path.join(d, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


class Engine:
    """A usable engine and the host facts that shape its command line."""

    __slots__ = (
        "cgroup_manager",
        "cgroups",
        "name",
        "path",
        "rootless",
        "runtime",
        "runtime_path",
        "swap_accounting",
        "ulimits",
    )

    def __init__(self, name: str, path: str) -> None:
        self.name = name
        self.path = path
        self.rootless = name == "podman" and os.geteuid() != 0
        self.cgroups = cgroup_layout()
        # podman's systemd manager needs systemd as init and a pure v2 hierarchy;
        # elsewhere (containers, v1, hybrid) only cgroupfs works.
        self.cgroup_manager = (
            "cgroupfs"
            if name == "podman"
            and (self.cgroups != "v2" or not os.path.isdir("/run/systemd/system"))
            else ""
        )
        self.swap_accounting = os.path.exists(
            "/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes"
        ) or (self.cgroups == "v2")
        self.ulimits = host_ulimits() if name == "podman" else {}
        self.runtime = "runc"
        self.runtime_path = ""


def cgroup_layout(mounts: str = "/proc/self/mounts") -> str:
    """v2 (unified only), hybrid (v1 controllers plus a v2 mount) or v1."""
    v1 = v2 = False
    try:
        with open(mounts, encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) > 2 and parts[2] == "cgroup2":
                    v2 = True
                elif len(parts) > 2 and parts[2] == "cgroup":
                    v1 = True
    except OSError:
        return "v1"
    if v2 and not v1:
        return "v2"
    return "hybrid" if v2 else "v1"


def host_ulimits() -> dict[str, tuple[int, int]]:
    """Limits to pass as ``--ulimit`` when podman's defaults exceed what we hold.

    Passing the caller's own (soft, hard) pair is always grantable: a process
    can hand its limits down unchanged without any capability.
    """
    import resource

    out: dict[str, tuple[int, int]] = {}
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < PODMAN_DEFAULT_NOFILE:
        out["nofile"] = (soft, hard)
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    if hard != resource.RLIM_INFINITY:
        # RLIMIT_NPROC counts the uid's processes host-wide; pids are bounded by
        # the pids cgroup.  podman's conmon hands the runtime a ceiling of its own
        # (32768 measured here) that a higher request exceeds: stay under both.
        n = min(soft, hard, NPROC_CEILING)
        out["nproc"] = (n, n)
    return out


def limits_problem(
    engine: Engine, controllers: list[str], cgroup_root: str = "/sys/fs/cgroup"
) -> str:
    """Why ``engine`` cannot enforce limits needing ``controllers`` for this user ("" if it can).

    Root's engine always can.  Rootless podman needs a pure cgroup v2 host,
    systemd as its cgroup manager and the controllers delegated to the user's
    systemd instance; elsewhere it ignores the limits with a warning.
    """
    if not engine.rootless or not controllers:
        return ""
    if engine.cgroups != "v2":
        return f"rootless podman cannot set resource limits on a {engine.cgroups} cgroup host"
    if engine.cgroup_manager == "cgroupfs":
        return "rootless podman sets resource limits only through systemd, not running here"
    uid = os.getuid()
    service = f"{cgroup_root}/user.slice/user-{uid}.slice/user@{uid}.service"
    try:
        with open(f"{service}/cgroup.controllers", encoding="utf-8") as fh:
            delegated = set(fh.read().split())
    except OSError:
        return f"rootless podman: no cgroup delegated to this user at {service}"
    missing = [c for c in controllers if c not in delegated]
    if missing:
        return f"rootless podman: systemd does not delegate {', '.join(missing)} to this user"
    return ""


def docker_socket() -> tuple[str | None, str]:
    """(path to connect to, description) from $DOCKER_HOST or the default socket."""
    host = os.environ.get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        return None, f"DOCKER_HOST={host}"
    path = host[len("unix://") :] if host else DOCKER_SOCKET
    return path, path


def docker_problem() -> str:
    """Why docker cannot be used here, or ""."""
    import socket

    path, where = docker_socket()
    if path is None:
        return ""  # a remote daemon: only `corral doctor --probe` can tell
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(path)
        except OSError as exc:
            return f"daemon not reachable at {where} ({exc.strerror or exc})"
    return ""


def rootless_problem(user: str, uid: int, subuid: str = "/etc/subuid") -> str:
    """Why rootless podman cannot run for ``user`` here, or ""."""
    if which("newuidmap") is None:
        return "rootless podman needs newuidmap (Debian: apt-get install uidmap)"
    try:
        with open(subuid, encoding="utf-8") as fh:
            entries = [line.split(":", 1)[0] for line in fh if ":" in line]
    except OSError:
        entries = []
    if user not in entries and str(uid) not in entries:
        return (
            f"rootless podman needs a subordinate uid range for {user} in {subuid} "
            f"(usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user})"
        )
    return ""


def find(chosen: str = "") -> tuple[Engine | None, str]:
    """The engine to use, or None and the reason (naming each engine tried)."""
    chosen = chosen or os.environ.get("CORRAL_ENGINE", "")
    if chosen and chosen not in ORDER:
        return None, f"unknown engine {chosen!r} (known: {', '.join(ORDER)})"
    reasons = []
    for name in [chosen] if chosen else list(ORDER):
        path = which(name)
        if path is None:
            reasons.append(f"{name}: not on PATH")
            continue
        problem = docker_problem() if name == "docker" else _podman_problem()
        if problem:
            reasons.append(f"{name}: {problem}")
            continue
        return Engine(name, path), ""
    return None, "; ".join(reasons)


def _podman_problem() -> str:
    if os.geteuid() == 0:
        return ""
    import pwd

    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = str(os.geteuid())
    return rootless_problem(user, os.geteuid())


def choose_runtime(engine: Engine, chosen: str = "") -> str:
    """Set the engine's OCI runtime; returns why it cannot be used, or ""."""
    name = chosen or os.environ.get("CORRAL_OCI_RUNTIME", "") or "runc"
    engine.runtime = name
    if engine.name == "docker":
        engine.runtime_path = name  # docker knows runtimes by the name in daemon.json
        return ""
    path = which(name)
    if path is None:
        package = {"runsc": "runsc", "runc": "runc", "crun": "crun"}.get(name, name)
        return f"OCI runtime {name} not found (Debian: apt-get install {package})"
    engine.runtime_path = path
    return ""


def describe_all() -> str:
    """One line for ``corral doctor``: every engine and what it has or lacks."""
    parts = []
    for name in ORDER:
        path = which(name)
        if path is None:
            parts.append(f"{name}: not on PATH")
            continue
        problem = docker_problem() if name == "docker" else _podman_problem()
        if problem:
            parts.append(f"{name}: {problem}")
            continue
        runtimes = [r for r in ("runc", "runsc", "crun") if which(r)]
        parts.append(f"{name} at {path} (runtimes: {', '.join(runtimes) or 'none'})")
    return "; ".join(parts)
