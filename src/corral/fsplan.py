"""Where a policy's filesystem rules become mounts.

:func:`plan_filesystem` turns a :class:`~corral.policy.Policy` into an ordered
list of :class:`Mount` operations that every mount-namespace tier can replay
(bubblewrap argv today, container flags later).  It inspects the host
filesystem (stat, list, read /proc/net/unix) but changes nothing.

The rules, in the order the mounts are laid:

1. the host's ``/`` read-only; a fresh ``/dev`` and ``/proc``; private tmpfs on
   ``/tmp``, ``/var/tmp``, ``/run`` and ``/dev/shm`` (these are also where host
   daemons keep their unix sockets, so hiding them closes most sockets at once);
   ``/proc/sys`` and the other kernel-wide entries of /proc read-only, and the
   host's network interfaces in /sys hidden (the sandbox has its own network);
2. *shadows*: a read-deny path that does not exist yet cannot get a mount point
   without creating it on the host, so its nearest existing ancestor is rebuilt
   as a read-only snapshot (a tmpfs holding binds of the entries it has now).
   Whatever the host creates there later, the secret included, stays invisible;
3. the workspace and other writable paths, read-write;
4. write-deny paths that exist, bound read-only over themselves (among them
   what the real home's dotfile links lead to in a writable place: the host
   loads it after the run, see :func:`home_link_decision`); read-deny
   paths that exist, replaced by an empty mode-000 directory or file; host unix
   sockets still visible (from /proc/net/unix), replaced by an empty file;
5. the home layer (:mod:`corral.home`), bound read-write at its own path under
   corral's state directory: the mask over that directory becomes an empty
   tmpfs the sandbox can pass through, holding nothing but this one layer;
6. shadows remounted read-only.

A write-deny path that does not exist and lies in a writable area cannot be
mounted over without creating it on the host; it goes into ``quarantine``:
after the run, anything the sandbox created there is moved out of the
workspace and reported as a denial.
"""

from __future__ import annotations

import os
import stat

from corral import defaults
from corral.paths import inside

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence

    from corral.policy import Policy

# Replaced by private tmpfs in every run (see rule 1).
PRIVATE_TMP = ("/tmp", "/var/tmp", "/run", "/dev/shm")
SOCKET_MASK = "host unix socket"  # the reason a host socket's mask gives
# Entries of the sandbox's own /proc that reach kernel-wide state: its pid view is
# private, these are not.  Started by root, the sandbox's uid 0 owns them, so
# /proc/sys/kernel/core_pattern would open for writing.  Bound read-only over
# themselves when the host has them.  bwrap itself covers sysrq-trigger, irq and
# bus (not sys: the directory looks read-only to it); the rest of /proc either
# holds per-process files or refuses a writer without capabilities, which
# tests/integration/test_escapes.py checks file by file.
PROC_HOST_STATE = ("sys", "fs", "acpi", "scsi")
SYS_CLASS_NET = "/sys/class/net"
# A secret directory's subdirectories are looked into for links (stow's per-file
# links) only when there are at most this many (_Planner._deny_link_targets): a
# browser profile's 40, each of 100 entries, took 3 ms a run; ~/.gnupg has three.
SECRET_SUBDIRS_MAX = 8
NEVER_SHADOW = frozenset({"/", "/usr", "/etc", "/bin", "/lib", "/lib64", "/sbin", "/proc", "/sys"})
# Names write-protected in every directory the walk reaches below a writable root
# (the workspace's own are the policy's write-deny patterns, another root's these
# names): what an editor, an agent tool, a shell or a `corral run` started in
# that directory loads.  Each name says whether a directory (True) or a file
# (False) is meant; a symlink counts as either, being protected where it leads.
PROTECTED_NAMES: dict[str, bool] = {
    **{n.rstrip("/"): n.endswith("/") for n in defaults.WRITE_DENY_WORKSPACE},
    defaults.POLICY_FILENAME: False,
}
# Of those, the ones quarantined when a run makes one in a subdirectory (new_protected)
QUARANTINED_WHEN_NEW = frozenset({defaults.POLICY_FILENAME})
# The real home's entries whose links are followed: a link there into a place the
# sandbox may write (a dotfiles repository as the workspace: GNU stow's
# ``~/.gitconfig -> dotfiles/git/.gitconfig``) makes that file what the host loads
# later, outside the sandbox.  At the top of the home: the dotfiles and these plain
# names (``~/bin`` is on a login shell's PATH; ``~/src`` or ``~/notes`` leading into
# a workspace are the user's projects, not loaded); in each directory the home
# layer merges (``~/.config``: corral.home.MERGED), every entry, and so in the
# directories whose files tools load or run unasked where stow links files one by
# one (git's ``~/.config/git/config``, ssh's ``~/.ssh/config`` with its
# ProxyCommand, ``~/.local/bin`` on PATH and the rest of ``~/.local``: Python's
# user site-packages; systemd's user units, the desktop's autostart entries and
# fish's startup files).  A missing one costs one failed scandir a run.
HOME_LOADED_PLAIN = frozenset({"bin"})
HOME_LINK_DIRS = (
    ".config",
    ".config/git",
    ".ssh",
    ".local",
    ".local/bin",
    ".config/systemd/user",
    ".config/autostart",
    ".config/fish",
    ".config/fish/conf.d",
)


class Mount:
    """One mount operation.  ``kind`` is one of:

    ro-bind, bind, tmpfs, dev, proc, symlink (src is the link text),
    mask-dir, mask-file (empty, mode 000, read-only), remount-ro, mqueue (a POSIX
    message queue filesystem: the namespace tier only).
    """

    __slots__ = ("dest", "kind", "src", "why")

    def __init__(self, kind: str, dest: str, src: str | None = None, why: str = "") -> None:
        self.kind = kind
        self.dest = dest
        self.src = src
        self.why = why

    def __repr__(self) -> str:
        src = f" {self.src}" if self.src and self.src != self.dest else ""
        return f"{self.kind}{src} {self.dest}" + (f"  # {self.why}" if self.why else "")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mount) and (self.kind, self.dest, self.src) == (
            other.kind,
            other.dest,
            other.src,
        )

    def __hash__(self) -> int:
        return hash((self.kind, self.dest, self.src))


class FsPlan:
    """The mounts, and the decisions behind them for tiers that do not mount
    (landlock): which paths are secret, which existing paths must stay unchanged."""

    __slots__ = (
        "hardlinks",
        "keep_in_place",
        "lock_watch",
        "mounts",
        "notes",
        "quarantine",
        "read_deny",
        "repositories",
        "secrets_inside",
        "writable",
        "write_protect",
    )

    def __init__(self) -> None:
        self.mounts: list[Mount] = []
        self.quarantine: list[str] = []  # absolute paths checked after the run
        # the writable roots' repositories at launch: those made during the run are
        # looked at after it (corral.gitguard); None: not walked
        self.repositories: Repositories | None = None
        self.writable: list[str] = []
        self.notes: list[str] = []
        self.read_deny: list[str] = []  # absolute, present or not (real paths when present)
        self.write_protect: list[str] = []  # existing write-deny paths inside writable ones
        # existing secrets inside writable ones: a tier without mounts cannot stop the
        # run renaming, linking or rewriting them (corral.restore undoes it)
        self.secrets_inside: list[str] = []
        # what mount tiers keep where it was: a mask or a read-only bind cannot be
        # undone from inside, but it moves with a directory above it that the run
        # renames (then a later run would not cover it at its new path)
        self.keep_in_place: list[str] = []
        # files in the workspace whose content may be shared with a file outside it:
        # read-only for the run (mount tiers bind them so; landlock withholds writing)
        self.hardlinks: list[str] = []
        # read-only git files and the lock file git writes them through:
        # git dir -> {"config.lock": ".../config"} (see corral.lockwatch)
        self.lock_watch: dict[str, dict[str, str]] = {}


def _depth(path: str) -> int:
    return path.rstrip("/").count("/")


def _lkind(path: str) -> str:
    """dir, file, socket, link or missing (does not follow a final symlink)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "missing"
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "file"


def _kind(path: str) -> str:
    """Like _lkind but follows symlinks (a dangling link counts as missing)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "missing"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "file"


# The host's socket list as last read in this process, and the one to keep
# using once the process may have left the host's network namespace.
_seen_sockets: list[str] | None = None
_frozen_sockets: list[str] | None = None


def freeze_host_sockets() -> None:
    """From now on, plans in this process use the host's socket list as last
    read: corral may have entered a sandbox's network namespace since, where
    /proc/net/unix shows none of the host's sockets (planning again after a
    setup race must not lose a mask)."""
    global _frozen_sockets
    if _frozen_sockets is None and _seen_sockets is not None:
        _frozen_sockets = _seen_sockets


def thaw_host_sockets() -> None:
    """Plans read the host's sockets afresh again (after a freeze for one start's
    attempts: corral.sandbox)."""
    global _frozen_sockets
    _frozen_sockets = None


def host_sockets_frozen() -> bool:
    return _frozen_sockets is not None


def host_unix_sockets(proc_net_unix: str = "/proc/net/unix") -> list[str]:
    """Paths of unix sockets bound on the host (abstract ones are per network namespace)."""
    global _seen_sockets
    if _frozen_sockets is not None:
        return list(_frozen_sockets)
    try:
        with open(proc_net_unix, encoding="utf-8", errors="replace") as fh:
            next(fh, None)
            found = set()
            for line in fh:
                parts = line.split(None, 7)
                if len(parts) == 8 and parts[7].startswith("/"):
                    found.add(parts[7].rstrip("\n"))
    except OSError:
        return []
    _seen_sockets = sorted(found)
    return list(_seen_sockets)


def beyond_reach(path: str, uid: int) -> bool:
    """Whether a process of host ``uid`` with no capability over inodes it does
    not own (as in bwrap's user namespace, where only ``uid`` is mapped) cannot
    reach ``path``: some directory above it is another owner's and has no search
    bit for group or others (with an ACL, the group bits are its mask, so no
    entry grants search either).  bwrap could not mount a mask there (a root
    corral's run failed on another user's socket in a 0700 directory), and the
    command cannot connect() to it.  Unsure (a directory that cannot be read):
    False, and the socket keeps its mask."""
    parent = os.path.dirname(path)
    while True:
        try:
            st = os.stat(parent)
        except OSError:
            return False
        if st.st_uid != uid and not st.st_mode & 0o011:
            return True
        if parent == "/":
            return False
        parent = os.path.dirname(parent)


def host_net_dirs(class_net: str = SYS_CLASS_NET, devices: str = "/sys/devices") -> list[str]:
    """Where the host's sysfs lists its network interfaces: ``/sys/class/net`` and,
    for each interface, the ``net`` directory under /sys/devices that holds it
    (its MAC address and statistics live there; /sys/class/net only links to it)."""
    try:
        names = os.listdir(class_net)
    except OSError:
        return []
    found = {class_net}
    for name in names:
        try:  # one readlink, not realpath's lstat per component: this is on every run
            link = os.readlink(os.path.join(class_net, name))
        except OSError:
            continue  # not a link (bonding_masters): nothing to follow
        real = os.path.normpath(os.path.join(class_net, link))
        if inside(real, devices) and os.path.basename(os.path.dirname(real)) == "net":
            found.add(os.path.dirname(real))
    return sorted(found)


def kernel_mounts(proc_names: Collection[str], net_dirs: Sequence[str]) -> list[Mount]:
    """Mounts that keep a sandbox with its own network namespace from changing
    kernel-wide state or reading the host's interfaces (pure: host facts come in).

    ``proc_names``: the entries the host's /proc has; ``net_dirs``: from
    :func:`host_net_dirs`.  /sys itself is the host's, bound read-only with /."""
    mounts = [
        Mount("ro-bind", f"/proc/{name}", f"/proc/{name}", "kernel-wide state: read-only")
        for name in PROC_HOST_STATE
        if name in proc_names
    ]
    for path in net_dirs:
        # bwrap has no sysfs of the sandbox's own network namespace to offer: an
        # empty directory hides the host's interfaces and MAC addresses (a private
        # tmpfs: whatever the sandbox puts there stays there and vanishes with it)
        mounts.append(Mount("tmpfs", path, why="hides the host's network interfaces"))
    return mounts


class WorkspaceScan:
    """What a bounded walk of the workspace (and every other writable root) found:
    git dirs, secret files, and regular files with more links than the walk found
    inside the roots."""

    __slots__ = (
        "complete",
        "dirs",
        "farms",
        "git_dirs",
        "git_files",
        "hardlinks",
        "linked",
        "protected",
        "roots",
        "secret_files",
        "stopped",
    )

    def __init__(self) -> None:
        self.roots: list[str] = []  # the roots walked (see walk_roots)
        self.git_dirs: list[str] = []
        self.git_files: list[str] = []  # ``.git`` files (``gitdir: PATH``), found as such
        self.secret_files: list[str] = []
        self.hardlinks: list[str] = []
        # files whose links the walk all found: one may be a secret or a protected file
        self.linked: list[str] = []
        self.farms: list[str] = []  # environments the walk skips (corral.linkfarm looks in)
        # PROTECTED_NAMES below the root: what a `corral run`, an editor or an agent
        # tool started in that directory would load
        self.protected: list[str] = []
        self.complete = True
        self.stopped: list[str] = []  # the roots whose walk ended at its bound
        self.dirs: dict[str, WalkedDir] = {}  # every directory listed, as it was


class WalkedDir:
    """A directory as a walk listed it: its inode and change time, how many entries
    it had, the subdirectories walked next and its ``.git`` entries.  A later walk
    that finds the same inode with the same change time (a new entry, a rename, a
    touch all change it, and no one but root can set it back) needs no listing."""

    __slots__ = ("count", "ctime", "gits", "ino", "protected", "subdirs")

    def __init__(self, ino: int, ctime: int) -> None:
        self.ino = ino
        self.ctime = ctime
        self.count = 0
        self.subdirs: list[tuple[str, int]] = []
        self.gits: list[tuple[str, bool]] = []
        self.protected: list[str] = []  # entries named in PROTECTED_NAMES (not at the root)


class Repositories:
    """The repositories of the writable roots at launch (``known``: identities of git
    dirs and ``.git`` entries) and their walk (``roots``; ``dirs``; ``cutoff``:
    change times from before it are trusted unchanged, see
    :func:`created_repositories`)."""

    __slots__ = ("cutoff", "dirs", "known", "roots", "skip")

    def __init__(self, scan: WorkspaceScan, cutoff: int, skip: Collection[str] = ()) -> None:
        found = (identity(p) for p in (*scan.git_dirs, *scan.git_files))
        self.known = frozenset(i for i in found if i is not None)
        self.roots = tuple(scan.roots)
        self.dirs = scan.dirs
        self.cutoff = cutoff
        self.skip = skip  # what the walk at launch did not walk (scan_workspace)


def walk_roots(writable: Sequence[str]) -> list[str]:
    """The writable roots (real paths, the workspace first) the walk starts from,
    each walked as the workspace is: the workspace, then the others shallowest
    first, leaving out one inside a root already kept (the walk of that root
    reaches it; one holding the workspace is kept, and its walk skips the
    workspace: no directory is walked twice).  Pure."""
    if not writable:
        return []
    kept = [writable[0]]
    for root in sorted(writable[1:], key=lambda p: (_depth(p), p)):
        if not any(inside(root, k) for k in kept):
            kept.append(root)
    return kept


def protected_names(use_defaults: bool) -> Collection[str]:
    """The protected names a policy applies in subdirectories: all of them, or with
    ``[filesystem] defaults = false`` (the root's built-in names off too) only
    the policy file, which is protected whatever the policy says."""
    return PROTECTED_NAMES if use_defaults else (defaults.POLICY_FILENAME,)


def _is_secret_name(name: str) -> bool:
    if name in defaults.READ_DENY_WORKSPACE_NAMES:
        return True
    return name.startswith(".env.") and name not in defaults.ENV_TEMPLATES


def scan_workspace(
    roots: str | Sequence[str],
    git_only: bool = False,
    before: Repositories | None = None,
    skip: Collection[str] = (),
) -> WorkspaceScan:
    """Find repositories (their git dirs), secret files and hard links, bounded in
    depth and size (the same walk: one extra stat per regular file).  A git dir
    is a ``.git`` directory, a submodule's or a linked worktree's under it, or
    the workspace directory a ``.git`` file points to.  ``roots``: the workspace,
    or the roots :func:`walk_roots` gives, each walked within the bounds, none
    from inside another (a root holding the workspace skips it); ``git_only``:
    repositories alone (the walk after a run); ``before``: the walk at launch,
    whose directories unchanged since are not listed again; ``skip``: directories
    not walked (corral's own state directory, should it lie in the workspace:
    the home layers' dotfiles are the sandbox's to write)."""
    scan = WorkspaceScan()
    scan.roots = [roots] if isinstance(roots, str) else list(roots)
    if len(scan.roots) > 1:
        skip = {*skip, *scan.roots}  # (a root itself is never skipped: depth 0)
    # (device, inode) -> (links the inode has, paths of it found in the roots)
    linked: dict[tuple[int, int], tuple[int, list[str]]] = {}
    for root in scan.roots:
        budget = defaults.SCAN_MAX_ENTRIES
        stack: list[tuple[str, int]] = [(root, 0)]
        while stack:
            path, depth = stack.pop()
            if depth and path in skip:
                continue
            walked = _unchanged(path, before) if before is not None else None
            if walked is None:
                walked = _list(path, depth, scan, linked, git_only)
                if walked is None:
                    continue
            budget -= walked.count
            if budget < 0:
                scan.complete = False
                scan.stopped.append(root)
                break
            scan.dirs[path] = walked
            stack.extend(walked.subdirs)
            scan.protected += walked.protected
            for git, is_dir in walked.gits:
                _note_repository(git, is_dir, scan)
    scan.git_dirs = list(dict.fromkeys(scan.git_dirs))  # a submodule's, found twice
    # links all found inside the roots share nothing with the outside
    scan.hardlinks = sorted(p for n, paths in linked.values() if len(paths) < n for p in paths)
    scan.linked = sorted(p for n, paths in linked.values() if len(paths) >= n for p in paths)
    return scan


def _list(
    path: str,
    depth: int,
    scan: WorkspaceScan,
    linked: dict[tuple[int, int], tuple[int, list[str]]],
    git_only: bool,
) -> WalkedDir | None:
    """One directory of the walk: its subdirectories and ``.git`` entries, and (but
    with ``git_only``) its secret files and hard-linked files noted in ``scan``."""
    try:
        st = os.lstat(path)
        entries = list(os.scandir(path))
    except OSError:
        return None
    walked = WalkedDir(st.st_ino, st.st_ctime_ns)
    walked.count = len(entries)
    for entry in entries:
        name = entry.name
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            continue
        # (the root's own are the policy's write-deny patterns)
        if (
            depth
            and name in PROTECTED_NAMES
            and (PROTECTED_NAMES[name] == is_dir or entry.is_symlink())
        ):
            walked.protected.append(entry.path)
        if name == ".git":
            walked.gits.append((entry.path, is_dir))
        elif is_dir:
            if name not in defaults.SCAN_SKIP_DIRS and depth < defaults.SCAN_MAX_DEPTH:
                walked.subdirs.append((entry.path, depth + 1))
            elif name in defaults.LINK_FARMS and not git_only:
                scan.farms.append(entry.path)
        elif not git_only:
            if _is_secret_name(name):
                scan.secret_files.append(entry.path)
            _note_links(entry, linked)
    if _is_git_dir({e.name for e in entries}, path):
        # a git dir by another name than .git (`git init --bare sub`, or one a run
        # assembles): git run in it reads its config and hooks; its insides are git's
        walked.gits.append((path, True))
        if depth:
            walked.subdirs = []
    return walked


def _is_git_dir(names: set[str], path: str) -> bool:
    """Whether a directory holding ``names`` is a repository to git itself: a HEAD,
    and objects/ and refs/ (or a commondir that has them), as git tells one."""
    if "HEAD" not in names or not ({"objects", "refs"} <= names or "commondir" in names):
        return False
    return os.path.isfile(os.path.join(path, "HEAD"))


def _unchanged(path: str, before: Repositories) -> WalkedDir | None:
    """The launch walk's record of ``path`` if the directory is still the one it
    listed, untouched since (its change time from before the walk's cutoff)."""
    walked = before.dirs.get(path)
    if walked is None or walked.ctime >= before.cutoff:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return walked if (st.st_ino, st.st_ctime_ns) == (walked.ino, walked.ctime) else None


def _note_repository(path: str, is_dir: bool, scan: WorkspaceScan) -> None:
    """A ``.git`` entry: its git dir with the submodules' and linked worktrees' under
    it.  A ``.git`` file (``gitdir: PATH``) or symlink counts in ``git_files``, and
    the directory it leads to as a git dir (read-only for the run where it is
    writable, as any other; :func:`new_git_dirs` looks at those inside ``root``)."""
    if not is_dir:
        scan.git_files.append(path)
        if os.path.islink(path):
            target: str | None = os.path.realpath(path)
        else:
            target = gitfile_target(path)
        if target is None or not os.path.isdir(target):
            return
        path = target
    scan.git_dirs.append(path)
    scan.git_dirs.extend(_submodule_git_dirs(os.path.join(path, "modules")))
    scan.git_dirs.extend(_worktree_git_dirs(path))


def identity(path: str, follow: bool = False) -> tuple[int, int] | None:
    """(device, inode) of a path itself (with ``follow``, of what a symlink leads to)."""
    try:
        st = os.stat(path, follow_symlinks=follow)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino)


# Directories whose change time is less than this before the launch walk are
# listed again after the run whatever it says: a file system's clock may tick
# coarsely, and a change made in the same tick as the last one before the walk
# would leave the time as it was.
CTIME_MARGIN_NS = 1_000_000_000


def walk_started() -> int:
    """The cutoff for a walk beginning now (see CTIME_MARGIN_NS)."""
    import time

    return time.time_ns() - CTIME_MARGIN_NS


def created_repositories(roots: str | Sequence[str], before: Repositories) -> WorkspaceScan | None:
    """After a run: the walk of ``roots`` again (listing only the directories
    changed since the walk at launch), when it finds a git dir or ``.git`` entry
    that was not there at launch, or stops at its bound (None otherwise: the
    usual case, and the only cost of the check)."""
    scan = scan_workspace(roots, git_only=True, before=before, skip=before.skip)
    if not scan.complete:
        return scan  # (a run can make many files to end the walk before its repository)
    for path in (*scan.git_dirs, *scan.git_files):
        if identity(path) not in before.known:
            return scan
    return scan if new_protected(scan, before) else None


def new_protected(scan: WorkspaceScan, before: Repositories) -> list[str]:
    """Policy files (``corral.toml``) below the root that the walk after a run finds
    and the walk at launch did not: a run must not write what a later run
    started there loads (corral loads it without asking).  The other protected
    names are read-only where they exist at launch, but new ones in a
    subdirectory stay: a clone or a project template brings its own ``.vscode/``
    and ``.gitmodules``, and the tools that load them ask before trusting a
    folder.  One inside another new one goes with it, so is not listed."""
    known = {p for walked in before.dirs.values() for p in walked.protected}
    found = sorted(
        p for p in scan.protected if p not in known and p.rpartition("/")[2] in QUARANTINED_WHEN_NEW
    )
    new: list[str] = []
    for path in found:  # (a directory sorts before what it holds)
        if not new or not path.startswith(tuple(p + "/" for p in new)):
            new.append(path)
    return new


def read_small(path: str, limit: int = 1 << 20) -> str | None:
    """The start of a regular file in the workspace as text (None for anything else)."""
    data = read_small_bytes(path, limit)
    return None if data is None else data.decode("utf-8", "replace")


def read_small_bytes(path: str, limit: int = 1 << 20) -> bytes | None:
    """The start of a regular file in the workspace (None for anything else).  The
    sandbox may have made it a FIFO, which an open() for reading would wait on
    for ever, or a device: opened without blocking, and read only if regular."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def gitfile_target(path: str) -> str | None:
    """Where a ``.git`` file (``gitdir: PATH``) points, absolute; None if it is not one.
    Read as git reads it: everything after ``gitdir: `` but the line ends at the
    end, line breaks inside included (a path "x\ny" read as "x" was never checked)."""
    text = read_small(path, 4096) or ""
    if not text.startswith("gitdir: "):
        return None
    target = text[len("gitdir: ") :].rstrip("\r\n")
    return os.path.realpath(os.path.join(os.path.dirname(path), target)) if target else None


def _worktree_git_dirs(git_dir: str) -> list[str]:
    """Linked worktrees' own git dirs: each reads its ``config.worktree``."""
    try:
        entries = os.scandir(os.path.join(git_dir, "worktrees"))
        return [e.path for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _note_links(
    entry: os.DirEntry[str], linked: dict[tuple[int, int], tuple[int, list[str]]]
) -> None:
    """Record a regular file that has more than one link (symlinks are not followed:
    what a symlink leads to outside is read-only already)."""
    try:
        if not entry.is_file(follow_symlinks=False):
            return
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return
    if st.st_nlink > 1:
        linked.setdefault((st.st_dev, st.st_ino), (st.st_nlink, []))[1].append(entry.path)


def links_to(candidates: list[str], secrets: list[str]) -> list[str]:
    """The candidates that are the same file as a secret (a file denied by path, or
    one inside a denied directory, walked up to SECRET_WALK_MAX entries)."""
    inodes: set[tuple[int, int]] = set()
    budget = defaults.SECRET_WALK_MAX
    stack = list(secrets)
    while stack and budget > 0:
        path = stack.pop()
        budget -= 1
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            inodes.add((st.st_dev, st.st_ino))
        elif stat.S_ISDIR(st.st_mode):
            try:
                stack.extend(os.path.join(path, n) for n in os.listdir(path))
            except OSError:
                continue
    found = []
    for path in candidates:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in inodes:
            found.append(path)
    return found


def hardlink_decision(found: list[str], choice: str) -> str:
    """What happens to hard-linked files in the workspace: the note to print, or
    RefusedError when the policy says "refuse" (or there are too many to protect)."""
    shown = ", ".join(found[:10]) + (f" and {len(found) - 10} more" if len(found) > 10 else "")
    what = (
        f"{len(found)} file(s) in the workspace have hard links the scan did not find "
        f"inside it (their content may be a file outside): {shown}"
    )
    if choice == "refuse" or len(found) > defaults.HARDLINK_MAX:
        from corral.errors import RefusedError

        why = (
            '[filesystem] hardlinks = "refuse"'
            if choice == "refuse"
            else f"more than {defaults.HARDLINK_MAX} to make read-only one by one"
        )
        raise RefusedError(f"{what} ({why}); copy them apart or remove them")
    return f"{what}; read-only for this run"


def farm_decision(found: list[str], choice: str) -> str:
    """The note for environments whose packages are hard links into a tool's cache
    (RefusedError when the policy says "refuse")."""
    shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    what = (
        f"packages in {shown} are hard links into a cache outside the workspace (uv, "
        "pnpm, bun): writing one would change every environment linked from it"
    )
    if choice == "refuse":
        from corral.errors import RefusedError

        raise RefusedError(f'{what} ([filesystem] hardlinks = "refuse"); copy them apart')
    return (
        f"{what}; read-only for this run (an environment made with UV_LINK_MODE=copy, "
        "or pnpm's package-import-method=copy, stays writable)"
    )


def _submodule_git_dirs(modules: str) -> list[str]:
    """Submodules keep their git dirs (hooks, config) under .git/modules/, nested."""
    found: list[str] = []
    stack = [modules]
    while stack:
        path = stack.pop()
        try:
            entries = [e for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        for entry in entries:
            if os.path.isfile(os.path.join(entry.path, "HEAD")):
                found.append(entry.path)
                stack.append(os.path.join(entry.path, "modules"))
            else:
                stack.append(entry.path)
    return found


MALFORMED = "?"  # git_config's section for a line it cannot take plainly


def git_config(text: str) -> Iterator[tuple[str, str, str]]:
    """(section, key, value) for each setting of a git config file, as git reads
    it: the section lower-cased (``name.*`` for one with a subsection, so
    ``[remote "origin"]`` is ``remote.*``), the key lower-cased, the value
    without its comment and quotes; a setting may follow its header on the same
    line.  A line this reader cannot take plainly (a continued value, an
    unclosed header) comes as (MALFORMED, what it is, "")."""
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            inner, close, rest = line[1:].partition("]")
            if not close:
                section = MALFORMED
                yield MALFORMED, line[:60], ""
                continue
            name, _, sub = inner.strip().partition(" ")
            section = name.split(".", 1)[0].lower() + ".*" if sub or "." in name else name.lower()
            line = rest.strip()
            if not line or line[0] in "#;":
                continue
        if line.endswith("\\"):
            yield MALFORMED, "a continued value", ""
            continue
        key, _, value = line.partition("=")
        yield section, key.strip().lower(), value.split("#", 1)[0].strip().strip('"')


GIT_INCLUDE_DEPTH = 10  # git's own limit on includes of includes
OPTIONAL = ":(optional)"  # git's prefix for a path that may be missing


def include_targets(value: str, config: str, homes: Sequence[str]) -> list[str]:
    """The files an ``include.path`` or ``includeIf.*.path`` value of the config
    file ``config`` names, as git resolves it: a relative path against the config
    file's directory (the path as named, not where a link leads), ``~/`` against
    the home (each of ``homes``: git's is $HOME).  ``~user`` is left.  Pure."""
    if value.startswith(OPTIONAL):
        value = value[len(OPTIONAL) :]
    if not value or (value.startswith("~") and value != "~" and not value.startswith("~/")):
        return []
    if value.startswith("~"):
        return [os.path.normpath(h + value[1:]) for h in homes]
    return [os.path.normpath(os.path.join(os.path.dirname(config), value))]


def git_config_files(config: str, homes: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """A git config file and the files it includes, and those include, to git's
    depth (missing ones too: a run could make them), each by its real path; and the
    ``[core]`` keys of them all, lower-cased, a later setting winning (an include
    counts where it stands).  Conditions (``includeIf``) are not weighed: every
    file one could include is named."""
    files: list[str] = []
    core: dict[str, str] = {}

    def read(path: str, depth: int) -> None:
        files.append(path)
        for section, key, value in git_config(read_small(path) or ""):
            if section == "core":
                core[key] = value
            elif key == "path" and section in ("include", "includeif.*"):
                if depth >= GIT_INCLUDE_DEPTH:
                    continue
                for target in include_targets(value, path, homes):
                    parent, _, name = target.rpartition("/")
                    real = f"{os.path.realpath(parent or '/').rstrip('/')}/{name}"
                    if real not in files:
                        read(real, depth + 1)

    read(config, 0)
    return files, core


def _core_settings(git_dir: str, homes: Sequence[str] = ()) -> dict[str, str]:
    """The ``[core]`` keys of a git dir's config and what it includes, lower-cased
    (enough for what we need)."""
    return git_config_files(os.path.join(git_dir, "config"), homes)[1]


def _hooks_path(git_dir: str, homes: Sequence[str] = ()) -> str | None:
    """A repository can move its hooks (core.hooksPath); those must be protected too.

    A relative hooksPath is relative to the working tree: the directory holding
    ``.git``, or for a submodule's git dir under .git/modules, its core.worktree.
    """
    core = _core_settings(git_dir, homes)
    value = core.get("hookspath")
    if not value:
        return None
    value = os.path.expanduser(value)
    if os.path.isabs(value):
        return os.path.normpath(value)
    worktree = core.get("worktree")
    if worktree:
        tree = os.path.normpath(os.path.join(git_dir, worktree))
    else:
        tree = os.path.dirname(git_dir)
    return os.path.normpath(os.path.join(tree, value))


def home_loaded(rel: str) -> bool:
    """Whether the host loads what the real home's entry ``rel`` (relative to the
    home: ``.gitconfig``, ``.config/nvim``) leads to, so that a link there into a
    writable place must make its target read-only (pure)."""
    if "/" in rel:
        return rel.rpartition("/")[0] in HOME_LINK_DIRS
    return rel.startswith(".") or rel in HOME_LOADED_PLAIN


def home_link_decision(
    links: Iterable[tuple[str, str]], writable: Sequence[str]
) -> tuple[list[tuple[str, str]], list[str]]:
    """Of the real home's links (``links``: each one's path and the real path it
    leads to, for the entries :func:`home_loaded` names), those leading into a
    writable root: (link, target) pairs whose targets are write-protected for the
    run, a directory whole; and notes for a link leading to a writable root itself
    or to a directory holding one (protecting it would leave nothing writable; the
    same as running corral inside ``~/.config/nvim``).  Pure."""
    protect: list[tuple[str, str]] = []
    notes: list[str] = []
    for link, target in links:
        for root in writable:
            if target != root and inside(target, root):
                protect.append((link, target))
                break
            if inside(root, target):
                notes.append(
                    f"{link} leads to {target}, which holds the writable {root}: what the "
                    "run writes there is what the host loads from it after the run"
                )
                break
    return protect, notes


def plan_filesystem(
    policy: Policy,
    mounts: bool = True,
    home: str | None = None,
    capless_uid: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> FsPlan:
    """The filesystem decisions for ``policy``; with ``mounts=False`` (tiers that do
    not mount) only the decisions, without the mount list and what only it needs.
    ``home``: the home layer's directory, to bind writable (it need not exist yet).
    ``capless_uid``: the host uid a tier's sandbox runs as with no capability over
    other owners' files (bwrap in its own user namespace); host sockets it could
    not reach get no mask (see :func:`beyond_reach`).
    ``environ``: the launcher's environment (the host facts'; this process's when
    None), for the secrets it moves out of ~ (GNUPGHOME, KUBECONFIG...).

    The steps, in order: the writable roots; the base (host read-only, own /dev,
    /proc, private tmp); read-deny paths (masks, or snapshots of the nearest
    existing parent of a missing one); the walk of the workspace and every other
    writable root (repositories, secret files, hard links); write-deny paths
    (read-only binds, or quarantine of a missing one); then, for the tiers that
    mount, host sockets and the layout."""
    from corral.policy import check_no_patterns, check_workspace, check_writable, home_dirs

    homes = home_dirs()
    check_workspace(os.path.realpath(policy.workspace), homes)  # a Policy made in code
    check_no_patterns(policy)
    for path in policy.writable_paths()[1:]:  # (from a file, a flag, srt's or code)
        check_writable(os.path.realpath(path), homes)
    steps = _Planner(policy, mounts, homes)
    steps.read_deny(os.environ if environ is None else environ)
    scan = steps.workspace()
    steps.write_deny(scan)
    plan = steps.plan
    plan.secrets_inside = sorted(
        p for p in set(plan.read_deny) if p in steps.masks and steps.in_writable(p)
    )
    # (git's own files are not here: a repository moved away and made again at its
    # old path is a repository made during the run, which corral.gitguard checks)
    users = {p for p, m in steps.ro_binds.items() if m.why.startswith("write-deny")}
    plan.keep_in_place = sorted(users | set(plan.secrets_inside))
    if mounts:
        steps.lay_out(home, capless_uid)
    return plan


def _links_and_subdirs(directory: str) -> tuple[list[str], list[str]]:
    """The symlinks and the subdirectories (not through a link) in ``directory``: one
    readdir, the entries' types from it."""
    links: list[str] = []
    subs: list[str] = []
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if entry.is_symlink():
                    links.append(entry.path)
                elif entry.is_dir(follow_symlinks=False):
                    subs.append(entry.path)
    except OSError:
        pass
    return links, subs


class _Planner:
    """One plan_filesystem call: the decisions made so far, and the tests each
    step asks of a path (inside a writable root? in a private tmpfs? present?)."""

    def __init__(self, policy: Policy, mounts: bool, homes: Sequence[str] = ()) -> None:
        self.policy = policy
        self.homes = [h for h in homes if h != "/"]  # (no home: nothing of its own)
        self.mounts = mounts
        self.plan = FsPlan()
        self.plan.writable = self._writable_roots()
        # inside() against each root, as one startswith per call (~350 a run)
        self.writable_set = set(self.plan.writable)
        self.writable_under = tuple(w.rstrip("/") + "/" for w in self.plan.writable)
        self.private_under = tuple(t + "/" for t in PRIVATE_TMP)
        self.shadows: set[str] = set()  # directories snapshotted (see _shadow)
        self.masks: dict[str, Mount] = {}
        self.ro_binds: dict[str, Mount] = {}
        self.listings: dict[str, frozenset[str]] = {}
        # the real home and its HOME_LINK_DIRS: listed with their links told apart
        # (the read-deny step lists them anyway), so that home_links() costs a
        # readlink and an lstat per link and nothing more
        self.link_dirs = {*self.homes, *(f"{h}/{d}" for h in self.homes for d in HOME_LINK_DIRS)}
        self.symlinks: dict[str, list[str]] = {}
        self.reals: dict[str, str] = {}

    def _writable_roots(self) -> list[str]:
        writable = []
        for path in self.policy.writable_paths():
            real = os.path.realpath(path)
            if _kind(real) != "dir":
                from corral.errors import PolicyError

                if path == self.policy.workspace:
                    raise PolicyError(f"the workspace {path} does not exist or is not a directory")
                raise PolicyError(_missing_writable(self.policy, path))
            writable.append(real)
        return writable

    def in_writable(self, path: str) -> bool:
        return path in self.writable_set or path.startswith(self.writable_under)

    def in_private_tmp(self, path: str) -> bool:
        private = path in PRIVATE_TMP or path.startswith(self.private_under)
        return private and not self.in_writable(path)

    def present(self, path: str) -> bool:
        """lexists() answered from one listing per parent: most secrets are absent, and
        one readdir of ~ is cheaper than a failed lstat per candidate."""
        parent, _, name = path.rpartition("/")
        return name in self.listing(parent or "/")

    def listing(self, parent: str) -> frozenset[str]:
        names = self.listings.get(parent)
        if names is None:
            if parent in self.link_dirs:
                names = self._list_with_links(parent)
            else:
                try:
                    names = frozenset(os.listdir(parent))
                except OSError:
                    names = frozenset()
            self.listings[parent] = names
        return names

    def _list_with_links(self, parent: str) -> frozenset[str]:
        found: list[str] = []
        links: list[str] = []
        try:
            with os.scandir(parent) as it:
                for entry in it:
                    found.append(entry.name)
                    if entry.is_symlink():  # (the entry's type: no system call)
                        links.append(entry.name)
        except OSError:
            pass
        self.symlinks[parent] = links
        return frozenset(found)

    def home_links(self) -> list[tuple[str, str]]:
        """The real home's links that :func:`home_loaded` names, with the real paths
        they lead to."""
        found = []
        for home in self.homes:
            for sub in ("", *HOME_LINK_DIRS):
                where = f"{home}/{sub}" if sub else home
                self.listing(where)
                for name in self.symlinks.get(where, ()):
                    if home_loaded(f"{sub}/{name}" if sub else name):
                        link = f"{where}/{name}"
                        found.append((link, self._follow(link, where)))
        return found

    def _real(self, path: str) -> str:
        real = self.reals.get(path)
        if real is None:
            real = self.reals[path] = os.path.realpath(path)
        return real

    def _follow(self, link: str, where: str) -> str:
        """``os.path.realpath(link)`` for a link in directory ``where``, in a readlink
        and an lstat: the directory it leads into resolved once for all its links (a
        stow package's files share one).  A ``..`` after the start of the link's
        text, or a link to a link, is left to realpath (whose ``..`` comes after the
        link before it is followed)."""
        try:
            text = os.readlink(link)
        except OSError:
            return os.path.realpath(link)
        base = "/" if text.startswith("/") else self._real(where)
        rest = text.lstrip("/")
        while rest.startswith("../"):
            base, rest = os.path.dirname(base), rest[3:]
        candidate = os.path.normpath(os.path.join(base, rest))
        if ".." in rest.split("/") or candidate == "/":
            return os.path.realpath(link)
        parent, _, name = candidate.rpartition("/")
        final = f"{self._real(parent or '/').rstrip('/')}/{name}"
        return os.path.realpath(final) if _lkind(final) == "link" else final

    def add_mask(self, path: str, is_dir: bool, why: str) -> None:
        if self.in_private_tmp(path):
            return  # already hidden by a private tmpfs
        self.masks[path] = Mount("mask-dir" if is_dir else "mask-file", path, why=why)

    # -- read-deny -------------------------------------------------------------------

    def read_deny(self, environ: Mapping[str, str]) -> None:
        for entry in self.policy.read_deny_paths():
            self.add_read_deny(entry, "read-deny")
        for entry in self.policy.read_deny_if_present():
            self.add_read_deny(entry, "read-deny (when present)", if_present=True)
        self._read_deny_from_env(environ)
        # corral's own activity log and quarantine: history of other runs
        from corral import runlog

        state = runlog.state_dir()
        # (by its real path too: "//", a symlink to a directory in the workspace)
        writable = self.in_writable(state) or self.in_writable(os.path.realpath(state))
        if writable and not self.mounts:
            from corral.errors import PolicyError

            # without mounts nothing keeps the sandbox from renaming it and leaving a
            # symlink in its place: the logs and the quarantine would go where it led
            raise PolicyError(
                f"corral's state directory {state} is inside a writable place: on this tier "
                "the sandbox could move it; set XDG_STATE_HOME outside the workspace"
            )
        if not self.present(state) and writable:
            # corral makes it during the run (the home layer, the logs): made now, to
            # be masked like one that was there, not left for the sandbox to fill
            os.makedirs(state, mode=0o700, exist_ok=True)
            self.listings.clear()  # (present() answers from listings made before)
        # (corral's own directories hold no links to secrets: not looked into)
        self.add_read_deny(state + "/", "corral's own state", links=False)
        # the VM cache: an initramfs or saved state a run rewrote there would be what
        # every later microvm run boots or restores (a missing one shadows nothing:
        # most hosts never make it).  Its parent, corral's cache, is what is masked:
        # a mask is a mount, so nothing can rename it away and put a planted one
        # in its place.
        cache = runlog.cache_dir() + "/"
        self.add_read_deny(cache, "corral's own cache (the VM's)", True, links=False)
        # corral's default places in each of the user's homes too: run with another
        # HOME or XDG_STATE_HOME, corral left the account's own activity log,
        # audit log and other workspaces' home layers readable (found by attacking it)
        for home in self.policy.homes():
            for place in (".local/state/corral/", ".cache/corral/"):
                other = os.path.join(home, place)
                if other not in (state + "/", cache):
                    why = "corral's own state (another HOME's)"
                    self.add_read_deny(other, why, True, links=False)

    def _read_deny_from_env(self, environ: Mapping[str, str]) -> None:
        """The built-in secrets the launcher's environment moved out of ~, masked
        when present (a value naming a system directory, a home or a writable root,
        /dev/null too, is a note: masking it would hide what every run needs)."""
        denied = set(self.plan.read_deny)
        for name, entry in self.policy.read_deny_from_env(environ):
            path = entry.rstrip("/") or "/"
            if path in denied or path.startswith("/dev/"):
                # (XDG_CONFIG_HOME=~/.config: the defaults already; PIP_CONFIG_FILE=
                # /dev/null, CI's way to ignore a config: no secret, and no note)
                continue
            if self._too_wide(path) or self._too_wide(os.path.realpath(path)):
                note = f"${name} names {path}; too wide to mask, left readable"
                if note not in self.plan.notes:
                    self.plan.notes.append(note)
                continue
            self.add_read_deny(entry, f"read-deny (${name})", if_present=True)

    def add_read_deny(
        self, entry: str, why: str, if_present: bool = False, links: bool = True
    ) -> None:
        """``links``: also deny what links in the directory (and one level below)
        lead to, when ``entry`` is a directory."""
        path = entry.rstrip("/") or "/"
        if self.present(path):
            real = os.path.realpath(path)
            for target in {path, real}:
                kind = _kind(target)
                if kind == "missing":
                    continue
                # a mount onto a path through a link lands on what it leads to: masking
                # that masks the path (both: bwrap failed, or a linked directory on
                # the way read as changed during setup: a file: secret through a link
                # broke every run, found by attacking corral)
                if target != real and _kind(real) != "missing":
                    self.plan.read_deny.append(target)
                    continue
                self.add_mask(target, kind == "dir", why)
                self.plan.read_deny.append(target)
            if links and _kind(real) == "dir":
                self._deny_link_targets(real, why)
            return
        if not if_present and self.in_writable(path):
            self._uncovered(path)
        if if_present or self.in_writable(path) or self.in_private_tmp(path):
            return
        self.plan.read_deny.append(path)
        if self.mounts:  # (a tier without mounts, landlock, needs no snapshot)
            self._snapshot_for(path, "dir" if entry.endswith("/") else "file")

    def _deny_link_targets(self, directory: str, why: str) -> None:
        """A secret directory holding links to its files elsewhere (GNU stow unfolds a
        package into per-file links when ~/.ssh already exists): a mask on the
        directory hides the link, not the key at its target, readable there (and on
        landlock, which follows the link, even by the link's name): found by
        attacking corral.  The targets are denied too; links directly in the
        directory and in its subdirectories, one level down (stow's unfolding of
        ~/.aws/sso/...): a listing of a few small directories, no walk."""
        links, subs = _links_and_subdirs(directory)
        if len(subs) <= SECRET_SUBDIRS_MAX:
            for sub in subs:
                links += _links_and_subdirs(sub)[0]
        for link in links:
            target = os.path.realpath(link)
            if inside(target, directory) or _kind(target) == "missing":
                continue  # (a dangling link: nothing to read through it now)
            if self._too_wide(target):
                note = f"{link} leads to {target}; too wide to mask, left readable"
                if note not in self.plan.notes:
                    self.plan.notes.append(note)
                continue
            self.add_read_deny(target, f"{why} (what {link} leads to)", links=False)

    def _too_wide(self, target: str) -> bool:
        """A link in a secret directory to a system directory, or to one holding a
        home or a writable root: masking it would hide what every run needs."""
        if target in NEVER_SHADOW or target.startswith(("/proc/", "/sys/", "/dev/")):
            return True
        if target.startswith("/usr/") and _depth(target) <= 2 and _kind(target) == "dir":
            return True  # (/usr/bin; a file deeper is masked: CARGO_HOME=/usr/local/cargo)
        held = (*self.homes, *self.plan.writable)
        return any(inside(h, target) for h in held)

    def _uncovered(self, path: str) -> None:
        """A read-deny path missing at launch inside a writable place has nothing over
        it: a mount needs it to exist (corral would have to make it in your workspace,
        left there after the run), and on landlock denying it would make every new
        file beside it unreadable.  What the host (or the run) makes there during the
        run is readable to the run: said, with the path, rather than taken as covered
        (the README claimed it was: found by attacking corral)."""
        root = next((r for r in self.plan.writable if inside(path, r)), path)
        note = (
            f"{path} (read-deny) does not exist and lies in the writable {root}: what "
            "is made there during the run is readable to it; create it before the run, "
            "or keep it outside the writable places"
        )
        if note not in self.plan.notes:
            self.plan.notes.append(note)

    def _snapshot_for(self, path: str, kind: str) -> None:
        """A missing secret: its nearest existing parent is snapshotted, so what is
        created there after launch stays out of the sandbox's sight."""
        ancestor = os.path.dirname(path)
        while ancestor != "/" and not self.present(ancestor):
            ancestor = os.path.dirname(ancestor)
        if ancestor in NEVER_SHADOW or self.in_writable(ancestor):
            self.plan.notes.append(
                f"{path} ({kind}) is missing and {ancestor} cannot be snapshotted; not masked"
            )
            return
        real = self.reals.get(ancestor)
        if real is None:  # most absent secrets share one ancestor (~): resolved once
            real = self.reals[ancestor] = os.path.realpath(ancestor)
        self.shadows.add(real)

    # -- the workspace walk -----------------------------------------------------------

    def workspace(self) -> WorkspaceScan:
        """Nested repositories, secret files and hard links in the workspace and every
        other writable root, each walked as the workspace is."""
        plan = self.plan
        cutoff = walk_started()
        # real, as the walk after the run (launch.created_repositories): a path found
        # then that the walk at launch named otherwise would pass for a new one
        from corral.runlog import state_dir

        skip = {os.path.realpath(state_dir())}
        # every writable root is walked as the workspace is (plan.writable: real
        # paths, the workspace first)
        scan = scan_workspace(walk_roots(plan.writable), skip=skip)
        for root in scan.stopped:
            what = "workspace" if root == plan.writable[0] else f"writable path {root}"
            plan.notes.append(
                f"{what} scan stopped after {defaults.SCAN_MAX_ENTRIES} entries; "
                "deeper repositories and .env files were not masked"
            )
        plan.repositories = Repositories(scan, cutoff, skip)
        for secret in scan.secret_files:
            self._mask_secret(secret)
        plan.hardlinks = [p for p in scan.hardlinks if p not in self.masks]
        # a link to a secret is the secret: masked like one, not merely read-only; its
        # other name may be in the workspace too (a .env linked to sub/notes.txt)
        others = [p for p in (*plan.hardlinks, *scan.linked) if p not in self.masks]
        if others:
            for path in links_to(others, plan.read_deny):
                self.add_mask(path, False, "hard link to a secret")
                plan.read_deny.append(path)
            plan.hardlinks = [p for p in plan.hardlinks if p not in self.masks]
        if plan.hardlinks:
            plan.notes.append(hardlink_decision(plan.hardlinks, self.policy.filesystem.hardlinks))
        if scan.farms:
            from corral import linkfarm

            linked = linkfarm.find(scan.farms)
            if linked:
                plan.notes.append(farm_decision(linked, self.policy.filesystem.hardlinks))
                plan.hardlinks += linked
        return scan

    def _mask_secret(self, secret: str) -> None:
        """A secret file the workspace walk found: masked, and denied by every name.
        One that is a link is masked at what it leads to (a mount onto the link
        lands there anyway; masked at the link too, bwrap failed, and landlock,
        which denies by name, left the target readable: found by attacking corral)."""
        real = os.path.realpath(secret)
        if real != secret and os.path.isfile(real):
            self.plan.read_deny.append(secret)
            if real not in self.masks:
                self.add_mask(real, False, "secret file in workspace (a link's target)")
            self.plan.read_deny.append(real)
            return
        self.add_mask(secret, False, "secret file in workspace")
        self.plan.read_deny.append(secret)

    # -- write-deny -------------------------------------------------------------------

    def write_deny(self, scan: WorkspaceScan) -> None:
        for pattern in self.policy.write_deny_patterns():
            self.add_write_deny(self.policy.expand(pattern), "write-deny")
        for git_dir in scan.git_dirs:
            self._protect_git_dir(git_dir)
        for path in scan.git_files:  # (a symlink cannot be rewritten in place)
            if not os.path.islink(path) and gitfile_target(path) is not None:
                self.add_write_deny(path, "a .git file names the repository git uses")
        # what a run, an editor or an agent tool started in that directory loads
        names = protected_names(self.policy.filesystem.use_defaults)
        # the top of every other writable root is a workspace root too (its walk
        # lists protected names below the top only): those names at it, read-only,
        # or quarantined if the run makes them; a root inside another one too
        # (walked once, by the outer root's walk, whose listing of it is not a top)
        ws = self.plan.writable[0]
        for root in [r for r in dict.fromkeys(self.plan.writable[1:]) if r != ws]:
            for name in names:
                self.add_write_deny(os.path.join(root, name), "write-deny")
        for path in scan.protected:
            name = path.rpartition("/")[2]
            if name == defaults.POLICY_FILENAME:
                self.add_write_deny(path, "write-deny: a policy file")
            elif name in names:
                self.add_write_deny(path, "write-deny: what a tool started there runs")
        # what the real home's git config includes (``[include] path`` into a
        # dotfiles repository as workspace)
        for home in self.homes:
            for name in (".gitconfig", ".config/git/config"):
                self._protect_includes(f"{home}/{name}")
        # what the real home's dotfiles lead to (a dotfiles repository as workspace)
        protect, notes = home_link_decision(self.home_links(), self.plan.writable)
        for link, target in protect:
            self.add_write_deny(target, f"write-deny: {link} leads here (the host loads it)")
        self.plan.notes += notes
        if scan.linked:
            self._protect_links(scan.linked)
        self.plan.write_protect = sorted(self.ro_binds)
        for path in self.plan.hardlinks:
            self.ro_binds.setdefault(
                path, Mount("ro-bind", path, path, "hard link: may be a file outside")
            )

    def _protect_links(self, linked: list[str]) -> None:
        """A hard link in the workspace to a write-protected file is that file: a write
        through it would change what a tool loads later (a link one run made to its
        new ``sub/.claude/settings.json``, protected in the next run)."""
        protected = list(self.ro_binds)
        others = [
            p for p in linked if p not in self.masks and not any(inside(p, d) for d in protected)
        ]
        for path in links_to(others, protected):
            self.add_write_deny(path, "hard link to a write-protected file")

    def _protect_git_dir(self, git_dir: str) -> None:
        """Hooks and config run code outside the sandbox: read-only, and the lock files
        git writes them through watched (corral.lockwatch)."""
        for name in defaults.GITDIR_WRITE_DENY:
            path = os.path.join(git_dir, name.rstrip("/"))
            self.add_write_deny(path, "git hooks/config run code outside the sandbox")
        hooks = _hooks_path(git_dir, self.homes)
        if hooks:
            self.add_write_deny(hooks, "core.hooksPath")
        for name in ("config", "config.worktree"):
            self._protect_includes(os.path.join(git_dir, name))
        for name in defaults.GITDIR_WRITE_DENY:
            path = os.path.join(git_dir, name)
            if not name.endswith("/") and path in self.ro_binds:
                self.plan.lock_watch.setdefault(git_dir, {})[name + ".lock"] = path

    def _protect_includes(self, config: str) -> None:
        """What a git config file includes (``include.path``, ``includeIf.*.path``,
        nested) is git config too: write-deny where writable (a missing one
        quarantined if the run makes it)."""
        for path in git_config_files(config, self.homes)[0][1:]:
            self.add_write_deny(path, f"write-deny: git config included by {config}")

    def add_write_deny(self, path: str, why: str) -> None:
        if not self.in_writable(path):
            # the writable roots are real paths: a write-deny path spelled through a
            # link the user also wrote the root by (``writable = ["~/datasets"]``, a
            # link) compared as outside them and was dropped, silently (found by
            # attacking corral).  Resolved, with the user's spelling kept in the why.
            real = os.path.realpath(path)
            if real != path and self.in_writable(real):
                why = f"{why}: {path}"
                path = real
        kind = _lkind(path)
        if kind == "link":
            real = os.path.realpath(path)
            if not self.in_writable(real):
                return  # points outside the writable area, already read-only
            path, kind = real, _kind(real)
        if kind == "missing":
            if self.in_writable(path):
                self.plan.quarantine.append(path)
            return
        if self.in_writable(path) and path not in self.masks:
            held = [r for r in self.plan.writable if inside(r, path)]
            if held:  # (read-only, it would take the writable root with it)
                note = f"{path} ({why}) is or holds the writable {held[0]}; not write-protected"
                if note not in self.plan.notes:
                    self.plan.notes.append(note)
                return
            self.ro_binds[path] = Mount("ro-bind", path, path, why)

    # -- the mount list ---------------------------------------------------------------

    def lay_out(self, home: str | None, capless_uid: int | None) -> None:
        """base, snapshots, writable roots, protections (binds and masks), the home
        layer, then the snapshots remounted read-only."""
        for sock in _visible_sockets(self.in_private_tmp, self.shadows, capless_uid):
            self.add_mask(sock, False, SOCKET_MASK)
        home_binds = self._home_layer(home)
        masks = self.masks
        # A snapshot inside a masked directory is pointless and would fail: the mask
        # hides it anyway.
        masked_dirs = [m.dest for m in masks.values() if m.kind == "mask-dir"]
        shadows = {r for r in self.shadows if not any(inside(r, d) for d in masked_dirs)}
        mounts = self.plan.mounts
        mounts.extend(self._base())
        # A snapshot entry that a mask or a nested snapshot covers is not bound first:
        # bwrap makes the mount point in the snapshot's tmpfs, the secret is never
        # bound at all, and each bind skipped saves bwrap a mount (~0.2 ms).
        covered = {p for p, m in masks.items() if m.kind in ("mask-dir", "mask-file")} | shadows
        for root in sorted(shadows, key=lambda p: (_depth(p), p)):
            mounts.extend(m for m in _shadow(root) if m.kind != "ro-bind" or m.dest not in covered)
        for path in sorted(self.plan.writable, key=lambda p: (_depth(p), p)):
            mounts.append(Mount("bind", path, path, "writable"))
        protect = [
            m
            for m in [*self.ro_binds.values(), *masks.values()]
            if not any(m.dest != d and inside(m.dest, d) for d in masked_dirs)
        ]
        mounts.extend(self._pins(protect))
        mounts.extend(sorted(protect, key=lambda m: (_depth(m.dest), m.dest)))
        mounts.extend(home_binds)
        for root in sorted(shadows, key=lambda p: (-_depth(p), p)):
            mounts.append(Mount("remount-ro", root, why="snapshot stays read-only"))

    def _pins(self, protect: list[Mount]) -> list[Mount]:
        """Each directory between a writable root and a protected path inside it
        (``apps`` and ``apps/web`` for ``apps/web/.env``; ``.git`` for its config),
        bound onto itself.  A mask or read-only bind is placed by name, and another
        run in the same workspace could rename its directory away in the moments
        between this run's plan and its mounts: the secret would then be readable
        here under the new name.  A directory that is a mount cannot be renamed
        (EBUSY) in any sandbox that has it, so no such run can move those paths;
        a file moved across one fails with EXDEV (``mv`` copies instead)."""
        pins: set[str] = set()
        for m in protect:
            root = next((r for r in self.plan.writable if inside(m.dest, r)), m.dest)
            parent = os.path.dirname(m.dest)
            while parent != root and inside(parent, root):
                pins.add(parent)
                parent = os.path.dirname(parent)
        why = "pinned: holds a protected path (no run can rename it)"
        return [Mount("bind", p, p, why) for p in sorted(pins, key=lambda p: (_depth(p), p))]

    def _base(self) -> list[Mount]:
        base = [
            Mount("ro-bind", "/", "/", "host filesystem, read-only"),
            Mount("dev", "/dev", why="minimal /dev: no raw devices"),
            Mount("proc", "/proc", why="own /proc: host processes invisible"),
        ]
        for tmp in PRIVATE_TMP:
            if os.path.isdir(tmp):
                base.append(Mount("tmpfs", tmp, why="private scratch; hides host sockets"))
        proc_names = {n for n in PROC_HOST_STATE if os.path.lexists(f"/proc/{n}")}
        return base + kernel_mounts(proc_names, host_net_dirs())

    def _home_layer(self, home: str | None) -> list[Mount]:
        if home is None:
            return []
        for path, m in list(self.masks.items()):
            if m.kind == "mask-dir" and inside(home, path):
                # mode 000 would bar the way to the layer; an empty tmpfs hides
                # corral's state (other layers, the logs) just as well
                self.masks[path] = Mount(
                    "tmpfs", path, why="corral's state: hidden but the home layer"
                )
        return [Mount("bind", home, home, "home layer: this workspace's $HOME")]


def _visible_sockets(
    hidden: Callable[[str], bool], shadows: set[str], capless_uid: int | None
) -> list[str]:
    """Host unix sockets still visible after the private tmpfs (``hidden``):
    those the plan masks.  A socket a capless sandbox cannot reach needs none,
    unless a snapshot's tmpfs opens the way into the directory it replaces."""
    found = []
    for sock in host_unix_sockets():
        if hidden(sock) or _lkind(sock) != "socket":
            continue
        snapped = any(inside(sock, root) for root in shadows)
        if capless_uid is None or snapped or not beyond_reach(sock, capless_uid):
            found.append(sock)
    return found


def _shadow(root: str) -> list[Mount]:
    mounts = [Mount("tmpfs", root, why="snapshot: hides paths created after launch")]
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return mounts
    for entry in entries:
        path = entry.path
        try:
            if entry.is_symlink():
                mounts.append(Mount("symlink", path, os.readlink(path)))
            elif stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                continue  # sockets are a door out; they are not carried into snapshots
            else:
                mounts.append(Mount("ro-bind", path, path))
        except OSError:
            continue
    return mounts


def _missing_writable(policy: Policy, path: str) -> str:
    """What to say of a writable path that is no directory: where it was set (the
    policy file's line, or the flag) and what to do."""
    from corral.policyfile import where_set

    place = where_set(policy.source, "filesystem", "writable", path) if policy.source else ""
    why = "does not exist or is not a directory (create it, or remove the entry)"
    return f"{place}: {path} {why}" if place else f"--writable {path}: {why}"


def host_tmp_args(
    command: list[str], writable: list[str], exists: Callable[[str], bool] = os.path.exists
) -> list[str]:
    """The host paths under /tmp or /var/tmp the command names (``git clone
    /tmp/remote.git``, ``--out=/tmp/x``) that the sandbox will not see: its /tmp
    is its own (or, on the landlock tier, off limits).  Only those that exist on
    the host and lie in no writable path: for each, a note saying what to do
    (found by trying corral as a new user: the clone failed with git's "does not
    exist", and nothing said why)."""
    notes = []
    for n, arg in enumerate(command):
        path = arg.partition("=")[2] if arg.startswith("-") else arg
        if not path.startswith(("/tmp/", "/var/tmp/")) or not exists(path):
            continue
        if any(inside(os.path.realpath(path), w) for w in writable):
            continue
        root = "/var/tmp" if path.startswith("/var/tmp/") else "/tmp"
        give = path
        if n == 0:  # the program itself: what it comes with too (a venv's bin/python)
            give = os.path.dirname(path)
            if os.path.basename(give) == "bin":
                give = os.path.dirname(give)
        notes.append(
            f"{path}: the sandbox has a {root} of its own and does not see the host's; "
            f"--writable {give} gives it this path"
        )
    return notes
