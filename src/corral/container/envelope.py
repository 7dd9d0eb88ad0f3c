"""The container envelope: a pure function from a policy's decisions to an engine argv.

Nothing here touches the host; :mod:`corral.tiers.container` gathers the facts
(engine, runtime, uid, mounts) into a :class:`Spec` and unit tests check the
argv this module makes of it.
"""

from __future__ import annotations

from corral.paths import inside

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.fsplan import Mount

HOSTNAME = "corral"
# A Spec's sizes unless the tier sets them (it sets them from the policy's limits,
# corral.bounds); tmpfs pages count against the container's memory limit too.
SCRATCH_SIZE = 256 << 20  # each of /tmp and /var/tmp
SHM_SIZE = 64 << 20
RUN_SIZE = 64 << 20
MASK_SIZE = "4k"
# podman's --tmpfs copies what lies under the mount point into the new tmpfs by
# default (tmpcopyup): a mask over a secret directory would hold a copy of the
# secret, and a snapshot of a directory with corral's state the state itself.
NO_COPY = "notmpcopyup,"


class Spec:
    """Everything the argv depends on."""

    __slots__ = (
        "cgroup_manager",
        "command",
        "cpus",
        "engine",
        "engine_name",
        "gid",
        "host_uds",
        "image",
        "init",
        "interactive",
        "labels",
        "low_ports",
        "memory",
        "mounts",
        "name",
        "pids",
        "preserve_fds",
        "rootless",
        "roots",
        "run_size",
        "runtime",
        "runtime_name",
        "seccomp",
        "shm",
        "swap_accounting",
        "tmp",
        "tty",
        "uid",
        "ulimits",
        "workdir",
    )

    def __init__(self, engine: str, image: str, command: list[str]) -> None:
        self.engine = engine  # path of podman or docker
        self.engine_name = "podman"
        self.runtime = ""  # OCI runtime path (podman) or name (docker)
        self.runtime_name = "runc"
        self.cgroup_manager = ""
        self.rootless = False
        self.image = image
        self.command = command
        self.name = ""
        self.uid = 0
        self.gid = 0
        self.memory = 0
        self.pids = 0
        self.cpus = 0.0
        self.swap_accounting = True
        self.tmp: int | None = SCRATCH_SIZE  # None: no size, the kernel's or runtime's default
        self.shm: int | None = SHM_SIZE  # None: no bound (--shm-size=0)
        self.run_size = RUN_SIZE
        self.ulimits: dict[str, tuple[int, int]] = {}
        self.seccomp = ""  # path of the OCI seccomp profile
        self.mounts: list[Mount] = []
        self.roots: list[str] = []  # host paths the container sees (binds of the workspace etc.)
        self.workdir = "/"
        self.interactive = False
        self.init = True  # the engine's init as pid 1 (reaps, forwards signals)
        self.tty = False
        self.host_uds = False  # gVisor: may the sandbox connect to host unix sockets (the door)
        # any port may be bound inside (its own network namespace; the relay's
        # resolver listens on 53)
        self.low_ports = False
        self.preserve_fds = 0  # podman: hand descriptors 3..2+N to the container (--pass-fd)
        self.labels: dict[str, str] = {}


def _check_path(path: str) -> str:
    # --mount splits on commas and the engines on "=" only in the key: refuse
    # what would be parsed as another option rather than guess at escaping
    if "," in path or "\n" in path:
        raise ValueError(f"path {path!r} cannot be passed to the container engine (comma)")
    return path


def _size(size: int | None) -> str:
    """A tmpfs ``size=`` option (empty: no bound), in whole units where exact."""
    if size is None:
        return ""
    for unit, factor in (("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if size % factor == 0:
            return f"size={size // factor}{unit},"
    return f"size={size},"


def mount_args(
    mounts: list[Mount],
    roots: list[str],
    mask_file: str,
    tmp: int | None = SCRATCH_SIZE,
    run: int = RUN_SIZE,
) -> list[str]:
    """fsplan's mount list as engine flags; ``tmp`` and ``run`` size the private tmpfs.

    The image replaces the host's ``/``, so only what lies inside ``roots`` (the
    host paths bound in: workspace, writable paths, corral's own files) needs
    the policy's masks; the rest of fsplan's list covers host paths the
    container never sees.  ``mask_file`` is an empty mode-000 file on the host.
    """
    placed: list[tuple[str, list[str]]] = []  # (destination, its engine arguments)
    for m in mounts:
        dest = _check_path(m.dest)
        out: list[str] = []
        if m.kind in ("dev", "proc", "symlink", "remount-ro"):
            # the engine makes its own /dev and /proc; a shadow's read-only remount
            # is dropped: its tmpfs stays private to the container, so what a
            # command writes there vanishes with it and never reaches the host
            continue
        if m.kind == "tmpfs":
            if dest in ("/tmp", "/var/tmp"):
                out += ["--tmpfs", f"{dest}:rw,{NO_COPY}nosuid,nodev,{_size(tmp)}mode=1777"]
            elif dest == "/run":
                out += ["--tmpfs", f"{dest}:rw,{NO_COPY}nosuid,nodev,{_size(run)}mode=755"]
            elif dest == "/dev/shm":
                continue  # the engine's own private /dev/shm (--shm-size)
            elif any(inside(dest, r) for r in roots):
                out += ["--tmpfs", f"{dest}:rw,{NO_COPY}nosuid,nodev,{_size(tmp)}".rstrip(",")]
            placed.append((dest, out))
            continue
        if not any(inside(dest, r) for r in roots):
            continue
        if m.kind in ("bind", "ro-bind"):
            if m.src == "/" or dest == "/":
                continue
            src = _check_path(m.src or m.dest)
            ro = ",ro" if m.kind == "ro-bind" else ""
            out += ["--mount", f"type=bind,src={src},dst={dest}{ro}"]
        elif m.kind == "mask-dir":
            out += ["--tmpfs", f"{dest}:ro,{NO_COPY}nosuid,nodev,noexec,size={MASK_SIZE},mode=000"]
        elif m.kind == "mask-file":
            out += ["--mount", f"type=bind,src={_check_path(mask_file)},dst={dest},ro"]
        else:
            raise ValueError(f"unknown mount kind {m.kind!r}")
        placed.append((dest, out))
    return _last_per_destination(placed)


def _last_per_destination(placed: list[tuple[str, list[str]]]) -> list[str]:
    """The engine's arguments, one mount per destination: the last (as bwrap's
    mounts stack, the last wins).  Two at one place is an error to podman: a link
    a run left made the pin of a directory and its write-deny both land on it,
    and every later container run failed with the engine's words (found by
    attacking corral)."""
    last = {dest: i for i, (dest, _) in enumerate(placed)}
    return [arg for i, (dest, args) in enumerate(placed) if last[dest] == i for arg in args]


def global_args(spec: Spec) -> list[str]:
    """Engine options that come before the subcommand."""
    args = [spec.engine]
    if spec.engine_name == "podman":
        if spec.cgroup_manager:
            args.append(f"--cgroup-manager={spec.cgroup_manager}")
        if spec.runtime:
            args.append(f"--runtime={spec.runtime}")
    return args


def run_argv(spec: Spec, mask_file: str = "/dev/null") -> list[str]:
    """``podman run`` / ``docker run`` with corral's hardening, for ``spec``."""
    argv = global_args(spec)
    argv += ["run", "--rm"]
    if spec.name:
        argv += ["--name", spec.name]
    for key, value in sorted(spec.labels.items()):
        argv += ["--label", f"{key}={value}"]
    if spec.interactive:
        argv.append("--interactive")
    if spec.tty:
        argv.append("--tty")
    argv += [
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        "--read-only",
        "--init" if spec.init else "",
        f"--hostname={HOSTNAME}",
        "--network=none",
        "--ipc=private",
        "--pull=never",  # an image is what the user named and built, never fetched
        f"--user={spec.uid}:{spec.gid}",
        f"--shm-size={_shm_size(spec)}",
        "--log-driver=none",  # output goes to corral, not into the engine's store
    ]
    if spec.engine_name == "docker" and spec.runtime:
        argv.append(f"--runtime={spec.runtime}")
    if spec.engine_name == "podman":
        argv.append("--read-only-tmpfs=false")  # only the tmpfs corral names below
        if spec.rootless:
            argv.append("--userns=keep-id")
        if spec.preserve_fds:
            argv.append(f"--preserve-fds={spec.preserve_fds}")
    if spec.low_ports and spec.runtime_name != "runsc":  # gVisor has no such sysctl
        argv.append("--sysctl=net.ipv4.ip_unprivileged_port_start=0")
    if spec.runtime_name == "runsc":
        # gVisor builds its own network stack unless told there is none, and
        # must be told to apply the OCI seccomp profile
        argv += ["--runtime-flag=network=none", "--runtime-flag=oci-seccomp"]
        if spec.host_uds:  # the relay must open the door, a host unix socket bound in
            argv.append("--runtime-flag=host-uds=open")
    argv.append(f"--security-opt=seccomp={spec.seccomp}" if spec.seccomp else "")
    argv = [a for a in argv if a]
    if spec.memory:
        argv.append(f"--memory={spec.memory}")
        if spec.swap_accounting:
            argv.append(f"--memory-swap={spec.memory}")  # no swap to escape into
    if spec.pids:
        argv.append(f"--pids-limit={spec.pids}")
    if spec.cpus:
        argv.append(f"--cpus={spec.cpus:g}")
    for key, (soft, hard) in sorted(spec.ulimits.items()):
        argv.append(f"--ulimit={key}={soft}:{hard}")
    argv += mount_args(spec.mounts, spec.roots, mask_file, spec.tmp, spec.run_size)
    argv += [f"--workdir={_check_path(spec.workdir)}", "--", spec.image, *spec.command]
    return argv


def _shm_size(spec: Spec) -> int:
    if spec.shm:
        return spec.shm
    # no bound: podman reads 0 so; docker reads 0 as its 64 MiB default, so give
    # it a size beyond any host's RAM (a tmpfs size is a cap, not an allocation)
    return 0 if spec.engine_name == "podman" else 1 << 40


def image_argv(spec: Spec) -> list[str]:
    """Ask the engine for the image's id: it fails when the image is not in its store."""
    return [*global_args(spec), "image", "inspect", "--format", "{{.Id}}", spec.image]


def remove_argv(spec: Spec) -> list[str]:
    """Remove the container whatever its state (after a kill, or by the guardian)."""
    if spec.engine_name == "podman":
        return [*global_args(spec), "rm", "--force", "--ignore", "--time=0", spec.name]
    return [spec.engine, "rm", "--force", spec.name]
