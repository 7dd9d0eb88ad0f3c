"""The filesystem decision, translated for the guest (pure: no host access).

One :class:`~corral.fsplan.FsPlan`, one more translation.  The masks are laid
on the *host* side, where the guest's root cannot reach them: QEMU runs in a
bubblewrap sandbox whose mount namespace holds, under :data:`VIEW`, exactly
the view the namespace tier gives a command (host ``/`` read-only, snapshots
hiding secrets created after launch, masks, read-only binds over write-protected
paths, the writable paths bound read-write).  QEMU exports that view to the
guest over 9p: :data:`VIEW` read-only as the guest's root, and each writable
path read-write.  A write the guest attempts through the root export is refused
by QEMU (``readonly=on``) and by the read-only bind under it; a mask is an empty
mode-000 file or directory on the host, so there is nothing behind it to read
even for the guest's root; and QEMU itself, with no capabilities in its user
namespace, cannot open what the host's permissions deny its uid.

Not exported: ``/proc``, ``/dev`` and ``/sys`` (empty directories in the view;
the guest mounts its own), nor anything QEMU itself uses (its binary, the
kernel, the initramfs live outside :data:`VIEW`).

:func:`request` writes what the guest's init runs (:mod:`corral.vm.initramfs`).
"""

from __future__ import annotations

import json
import shlex

from corral.fsplan import PRIVATE_TMP, SOCKET_MASK, Mount

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

VIEW = "/guest"  # where QEMU's sandbox holds the guest's view of the host
OWN_KERNEL_FILES = ("/proc", "/dev", "/sys")  # the guest mounts its own
ROOT_TAG = "root"
ROOT_CACHE = "loose"  # the read-only system: cached in the guest (measured: 2.6x faster)
RW_CACHE = "mmap"  # writable exports: writes go straight to the host; mmap works


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class Export:
    """One 9p share: ``tag`` the guest mounts at ``path`` (its host path too)."""

    __slots__ = ("path", "tag", "writable")

    def __init__(self, tag: str, path: str, writable: bool) -> None:
        self.tag = tag
        self.path = path
        self.writable = writable

    @property
    def source(self) -> str:
        """Where QEMU finds it, in its own sandbox."""
        return VIEW if self.path == "/" else VIEW + self.path

    def __repr__(self) -> str:
        return f"9p {self.tag} {self.path} {'rw' if self.writable else 'ro'}"


def view_mounts(mounts: Sequence[Mount]) -> list[Mount]:
    """The fsplan mounts, re-rooted under VIEW for QEMU's sandbox.

    The host's ``/proc``, ``/dev`` and ``/sys`` become empty directories: the
    guest has its own, and the binds the plan lays under them (kernel-wide
    entries read-only, network interfaces hidden) concern a sandbox that shares
    the host's kernel, which the guest does not.  Host unix sockets are left
    unmasked: over 9p a socket is a name, and the guest's connect() reaches only
    the guest's own kernel (and a socket that vanished between the plan and the
    launch would make bubblewrap fail on a read-only parent)."""
    out: list[Mount] = []
    for m in mounts:
        if any(_inside(m.dest, own) for own in OWN_KERNEL_FILES) or m.why == SOCKET_MASK:
            continue
        dest = VIEW if m.dest == "/" else VIEW + m.dest
        out.append(Mount(m.kind, dest, m.src, m.why))
        if m.dest == "/":
            out.extend(
                Mount("tmpfs", VIEW + own, why="the guest mounts its own")
                for own in OWN_KERNEL_FILES
            )
    return out


def exports(writable: Sequence[str]) -> list[Export]:
    """The root, read-only, and each writable path, read-write."""
    found = [Export(ROOT_TAG, "/", False)]
    found += [Export(f"w{i}", path, True) for i, path in enumerate(writable)]
    return found


def _depth(path: str) -> int:
    return path.rstrip("/").count("/")


def guest_mounts(
    shares: Sequence[Export], scratch: Mapping[str, int | None], present: Sequence[str]
) -> list[tuple[str, str, str]]:
    """What the guest mounts after its root, in order: ("tmpfs", path, size) for
    each private scratch directory the plan has (``present``; a size of None is
    the kernel's default, half the guest's RAM) and ("9p", path, tag) for each
    writable export; parents before children."""
    found = [
        ("tmpfs", path, str(scratch.get(path) or "50%")) for path in PRIVATE_TMP if path in present
    ]
    found += [("9p", e.path, e.tag) for e in shares if e.writable]
    return sorted(found, key=lambda m: (_depth(m[1]), m[1]))


class Launch:
    """Who runs what in the guest."""

    __slots__ = (
        "argv",
        "cwd",
        "duplex",
        "env",
        "gid",
        "network",
        "pids",
        "relay",
        "uid",
        "waiting",
    )

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        uid: int,
        gid: int,
        pids: int | None,
        network: bool,
        duplex: bool = False,
        waiting: bool = False,
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.cwd = cwd
        self.uid = uid
        self.gid = gid
        self.pids = pids
        self.network = network
        # stdin and stdout are one port, read and written (corral's agent: the
        # host's end is the Sandbox's socket, handed to QEMU as it is)
        self.duplex = duplex
        # the command is corral's agent, started by a Sandbox machine's init before
        # its state was saved (corral.vm.guestpython): argv is not run, the agent
        # only takes the cwd, ids and environment (guest.go)
        self.waiting = waiting
        # with a network, the relay's arguments a waiting agent serves in its own
        # process (corral.agent.wait_for_go), the door and loopback ports
        self.relay: list[str] = []


def request(
    shares: Sequence[Export],
    mounts: Sequence[tuple[str, str, str]],
    launch: Launch,
    fresh: tuple[bytes, float] | None = None,
) -> bytes:
    """The shell script the guest's init sources: its mounts, then ``run``.

    The init queues mounts and makes them a batch at a time: ``mounts`` comes
    before a mount whose mount point lies under one still queued (a workspace in
    /tmp after /tmp's tmpfs), and ``run`` makes the rest.

    Every path, name and value is quoted for the shell; environment values go
    through the control port only, never an argv the host can see.  ``fresh``
    (random bytes, the host's time in seconds): first, for a guest restored from
    a saved state, its own randomness and clock (the init's ``fresh``)."""
    q = shlex.quote
    lines = [f"fresh {fresh[0].hex()} {int(fresh[1])}"] if fresh is not None else []
    lines.append(f"mount_root {q(ROOT_TAG)} {ROOT_CACHE}")
    queued: list[str] = []  # the init makes queued mounts in one batch (its `mounts`)
    for kind, path, what in mounts:
        if any(_inside(path, parent) for parent in queued):
            lines.append("mounts")  # its mount point is looked for (or made) in there
            queued.clear()
        queued.append(path)
        if kind == "tmpfs":
            lines.append(f"mount_tmpfs {q(path)} {q(what)}")
        else:
            lines.append(f"mount_rw {q(what)} {q(path)} {RW_CACHE}")
    run = [
        "run",
        str(launch.uid),
        str(launch.gid),
        str(launch.pids) if launch.pids is not None else "-",
        "1" if launch.network else "0",
        "2" if launch.waiting else "1" if launch.duplex else "0",
        q(launch.cwd),
    ]
    if launch.waiting:
        run.append(go(launch))
    else:
        run += [*(q(f"{k}={v}") for k, v in sorted(launch.env.items())), "--"]
        run += [q(a) for a in launch.argv]
    lines.append(" ".join(run))
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


# How long the waiting agent remembers that a directory of the guest's read-only
# root lacked a command's name (corral.agent.locate), in seconds.  Each such miss
# is a round trip to QEMU (the guest's 9p keeps no negative entries): with this
# host's 15-entry PATH an exec whose search was forgotten took 5-8 ms more under
# TCG, and an agent's commands come seconds apart, so a memory of 2 s was nearly
# always forgotten.  What it delays: only a name the host adds, during the run,
# to a read-only directory in front of the one found (a name not found is never
# remembered; writable directories in front are always looked in); the guest's
# 9p cache (cache=loose) does not promise more of the host's later changes.
PATH_MEMORY = 60.0


def go(launch: Launch) -> str:
    """The waiting agent's line (after the root and the door port's device the init
    adds): the hex of its cwd, ids, environment, how long it may remember a PATH
    search (PATH_MEMORY) and (with a network) the relay's arguments, one word
    whatever the values hold."""
    run: dict[str, object] = {
        "cwd": launch.cwd,
        "uid": launch.uid,
        "gid": launch.gid,
        "env": launch.env,
        "path_memory": PATH_MEMORY,
    }
    if launch.relay:
        run["relay"] = launch.relay
    return json.dumps(run, sort_keys=True).encode("utf-8", "surrogateescape").hex()


def describe(shares: Sequence[Export], mounts: Sequence[tuple[str, str, str]]) -> list[str]:
    """The guest's mount plan, for ``--explain``."""
    lines = [f"  / <- 9p {ROOT_TAG} (read-only, cache={ROOT_CACHE})"]
    lines.append("  /proc /sys /dev /dev/pts <- the guest's own; /sys/fs/cgroup cgroup2")
    for kind, path, what in mounts:
        if kind == "tmpfs":
            lines.append(f"  {path} <- tmpfs size={what}")
        else:
            lines.append(f"  {path} <- 9p {what} (read-write, cache={RW_CACHE})")
    del shares
    return lines
