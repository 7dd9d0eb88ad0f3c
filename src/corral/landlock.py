"""Where a policy becomes Landlock rules (the landlock tier's pure builder).

Landlock is an allow-list: a process may touch a file only if some rule grants
the right on the file or on one of its parent directories.  Rights are
inherited by everything beneath a rule's directory and cannot be taken away
further down.  So "read everything except ``~/.ssh``" cannot be one rule on
``/``.  :func:`build` *splits* every directory on the way to a denied path:
the directory keeps only the rights no denied path below needs withheld, and
each of its entries is granted the rest on its own, except the denied entry.

Consequences worth knowing (``corral doctor`` and the README say them too):

* an entry created after launch in a split directory gets only that
  directory's own rights; a secret that appears later is therefore unreadable,
  and so is, say, a new file next to a ``.env`` in the workspace;
* listing directories (``READ_DIR``) is never withheld: it would make ``/``
  unlistable.  Names inside denied directories can be listed; contents cannot;
* write-deny paths inside the writable workspace (git hooks and config, editor
  settings) cannot be carved out without making new files there unwritable, so
  the launcher snapshots them and restores them after the run
  (:mod:`corral.restore`); so for secrets there, which the run can rename,
  link or rewrite though not read: put back, and their other names taken out;
* a hard-linked file in the workspace (its content may be a file outside) *is*
  carved out, because undo would come too late for the file outside: the
  directories on the way to it are split, so a file created later directly in
  one of them cannot be opened for writing in that run.

Everything here only reads the filesystem (``listdir``) and builds data; the
launcher applies it (:mod:`corral.confine`).
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    Listing = Callable[[str], list[tuple[str, bool | None]]]

# --- the kernel's constants (include/uapi/linux/landlock.h) --------------------

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5

NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1

SCOPE_ABSTRACT_UNIX = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1

RULE_PATH_BENEATH = 1
RULE_NET_PORT = 2

# Rights by ABI version: a right the kernel does not know makes the ruleset invalid.
_FS_BY_ABI = {
    1: (1 << 13) - 1,
    2: (1 << 14) - 1,
    3: (1 << 15) - 1,
    4: (1 << 15) - 1,
    5: (1 << 16) - 1,
}

# What corral needs, and the first ABI that gives it.
MIN_ABI = 6
ABI_FEATURES = (
    (1, "filesystem"),
    (2, "rename/link across directories"),
    (3, "truncate"),
    (4, "TCP bind/connect"),
    (5, "device ioctls"),
    (6, "signal and abstract-socket scoping"),
    (7, "audit logging"),
)

# Rights that only make sense on a file (the kernel rejects others on a file rule).
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
READ = EXECUTE | READ_FILE | READ_DIR
WRITE = (
    WRITE_FILE
    | TRUNCATE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SOCK
    | MAKE_FIFO
    | MAKE_SYM
    | REFER
)
# Withheld from a secret: reading and running it.  Listing is never withheld
# (see the module docstring), and writing is not either: withholding it from a
# ``.env`` in the workspace would make every new file beside it unwritable.
SECRET = READ_FILE | EXECUTE
# Withheld from a file that must keep its content (a hard link to a file outside).
CONTENT = WRITE_FILE | TRUNCATE
# Withheld from the host's scratch areas: all but listing.
SCRATCH = (READ | WRITE) & ~READ_DIR
# Device nodes a program expects; everything else under /dev (disks, memory,
# input devices) gets no rights, which matters for root, whose uid owns them.
DEVICES = {
    "/dev/null": READ_FILE | WRITE_FILE,
    "/dev/zero": READ_FILE | WRITE_FILE,
    "/dev/full": READ_FILE | WRITE_FILE,
    "/dev/random": READ_FILE,
    "/dev/urandom": READ_FILE,
    "/dev/tty": READ_FILE | WRITE_FILE | IOCTL_DEV,
}
# Not /dev/pts: every pty of the host's users is there, and Landlock cannot tell a
# pty the sandbox made from another (a grant on all of it let a command read the
# keys typed into the user's other terminals).  The run's own terminal is granted
# by name (corral.tiers.landlock.own_terminals); new ptys are refused (os.openpty
# opens its second end by path), and /dev/ptmx with them.
# Shared with the host here (the namespace tier gives private copies): their
# contents are other programs' scratch files, shared memory and sockets.
HOST_SCRATCH = ("/tmp", "/var/tmp", "/run", "/dev/shm", "/dev")

_NAMES = {
    EXECUTE: "execute",
    WRITE_FILE: "write",
    READ_FILE: "read",
    READ_DIR: "list",
    REMOVE_DIR: "rmdir",
    REMOVE_FILE: "unlink",
    MAKE_CHAR: "mkchar",
    MAKE_DIR: "mkdir",
    MAKE_REG: "create",
    MAKE_SOCK: "mksock",
    MAKE_FIFO: "mkfifo",
    MAKE_BLOCK: "mkblock",
    MAKE_SYM: "symlink",
    REFER: "refer",
    TRUNCATE: "truncate",
    IOCTL_DEV: "ioctl",
}


def rights_text(access: int) -> str:
    if access & WRITE == WRITE and access & READ == READ:
        return "read+write"
    if access & (READ | WRITE) == READ:
        return "read"
    return ",".join(name for bit, name in _NAMES.items() if access & bit)


def features(abi: int) -> list[str]:
    return [what for need, what in ABI_FEATURES if abi >= need]


class Ruleset:
    """A Landlock ruleset as data: what is handled, and what is granted where."""

    __slots__ = ("abi", "handled_fs", "handled_net", "paths", "ports", "scoped")

    def __init__(self, abi: int) -> None:
        self.abi = abi
        self.handled_fs = _FS_BY_ABI.get(min(abi, 5), 0)
        self.handled_net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0
        self.scoped = SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL if abi >= 6 else 0
        self.paths: list[tuple[str, int]] = []  # (absolute path, rights beneath it)
        self.ports: list[tuple[int, int]] = []  # (TCP port, rights)

    def describe(self) -> list[str]:
        lines = [
            f"landlock ABI {self.abi}: handles fs={self.handled_fs:#x} "
            f"net={self.handled_net:#x} scope={self.scoped:#x}"
        ]
        lines += [f"  allow {rights_text(a)} beneath {p}" for p, a in self.paths]
        lines += [f"  allow tcp connect to port {port}" for port, _ in self.ports]
        if not self.ports and self.handled_net:
            lines.append("  no TCP bind or connect at all")
        return lines


def _entries(path: str) -> list[tuple[str, bool | None]]:
    """(name, kind) for each entry, kind as :func:`_is_dir` says, from one readdir
    (the file type comes with the entry: no stat per name)."""
    try:
        with os.scandir(path) as it:
            found = []
            for e in it:
                try:
                    kind = None if e.is_symlink() else e.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                found.append((e.name, kind))
    except OSError:
        return []
    return sorted(found)


def _is_dir(path: str) -> bool | None:
    """True for a directory, False for another non-link file, None for a symlink or
    nothing.  A symlink needs no rule: what it points to is reached through the
    target's own place in the tree, and a rule on it would follow it there."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISLNK(mode):
        return None
    return stat.S_ISDIR(mode)


def split_grants(
    grants: Iterable[tuple[str, int]],
    withheld: dict[str, int],
    listdir: Listing = _entries,
    is_dir: Callable[[str], bool | None] = _is_dir,
) -> list[tuple[str, int]]:
    """Landlock rules giving each grant's rights beneath its path, minus ``withheld``
    (path -> rights no one may have there or beneath).  Pure apart from ``listdir``
    and ``is_dir``, which tests replace."""
    rules: dict[str, int] = {}

    def emit(path: str, kind: bool | None, access: int) -> None:
        if kind is None:
            return
        if not kind:
            access &= FILE_RIGHTS
        if access:
            rules[path] = rules.get(path, 0) | access

    # rights withheld somewhere strictly below each directory, found once
    below_of: dict[str, int] = {}
    for denied, rights in withheld.items():
        parent = os.path.dirname(denied)
        while True:
            below_of[parent] = below_of.get(parent, 0) | rights
            if parent in ("/", "") or os.path.dirname(parent) == parent:
                break  # (a relative path never reaches "/")
            parent = os.path.dirname(parent)

    def grant(path: str, kind: bool | None, access: int) -> None:
        access &= ~withheld.get(path, 0)
        below = below_of.get(path, 0)
        if not below & access or not kind:
            emit(path, kind, access)
            return
        emit(path, kind, access & ~below)  # safe to inherit all the way down
        rest = access & below
        for name, child_kind in listdir(path):
            grant(os.path.join(path, name), child_kind, rest)

    for path, access in grants:
        path = os.path.normpath(path)
        grant(path, is_dir(path), access)
    return sorted(rules.items())


class Tree:
    """The directory listings and file kinds a ruleset's split reads, answered from
    memory: :func:`record_tree` fills one from the host once (the tier's
    ``gather()``), so that planning reads nothing; a test writes one by hand.
    ``listings``: directory -> [(name, kind)]; ``kinds``: path -> kind (as
    ``_is_dir`` says); a path found in neither is missing."""

    __slots__ = ("kinds", "listings")

    def __init__(
        self,
        listings: dict[str, list[tuple[str, bool | None]]] | None = None,
        kinds: dict[str, bool | None] | None = None,
    ) -> None:
        self.listings = listings if listings is not None else {}
        self.kinds = kinds if kinds is not None else {}

    def listdir(self, path: str) -> list[tuple[str, bool | None]]:
        return self.listings.get(path, [])

    def is_dir(self, path: str) -> bool | None:
        if path in self.kinds:
            return self.kinds[path]
        if path in self.listings:
            return True
        parent, name = os.path.split(path)
        return dict(self.listings.get(parent, ())).get(name)


def record_tree(
    abi: int, writable: list[str], read_deny: list[str], read_only: Iterable[str] = ()
) -> Tree:
    """What :func:`build` reads from the host for these paths, read now."""
    tree = Tree()

    def listdir(path: str) -> list[tuple[str, bool | None]]:
        tree.listings[path] = found = _entries(path)
        return found

    def is_dir(path: str) -> bool | None:
        tree.kinds[path] = kind = _is_dir(path)
        return kind

    build(abi, writable, read_deny, "/", None, listdir, is_dir, read_only)
    return tree


def build(
    abi: int,
    writable: list[str],
    read_deny: list[str],
    scratch: str,
    proxy_port: int | None,
    listdir: Listing = _entries,
    is_dir: Callable[[str], bool | None] = _is_dir,
    read_only: Iterable[str] = (),
) -> Ruleset:
    """The ruleset for one run.

    ``writable``: directories the sandbox may change; ``read_deny``: absolute
    paths nobody may read (present or not); ``scratch``: the run's private
    temporary directory; ``proxy_port``: the one TCP port the sandbox may
    connect to (corral's proxy), or None for no network at all;
    ``read_only``: files inside writable directories whose content must not
    change (hard links that may share it with a file outside).
    """
    rs = Ruleset(abi)
    withheld: dict[str, int] = {}
    for path in read_deny:
        withheld[path] = withheld.get(path, 0) | SECRET
    for path in read_only:
        # the file's content; a rename that would regain these rights elsewhere is
        # refused by Landlock itself (EXDEV: a move may not gain rights)
        withheld[path] = withheld.get(path, 0) | CONTENT
    for path in HOST_SCRATCH:
        withheld[path] = withheld.get(path, 0) | SCRATCH
    # A grant rooted inside a withheld area (a workspace under /tmp, the scratch
    # directory) still holds: withholding applies to what a grant splits, and
    # only where the grant starts above it.
    grants = [("/", READ), *((w, READ | WRITE) for w in writable)]
    rules = split_grants(grants, withheld, listdir, is_dir)
    devices = [(dev, access) for dev, access in DEVICES.items() if is_dir(dev) is not None]
    # the scratch directory is created by the launcher, after planning
    merged: dict[str, int] = {scratch: READ | WRITE}
    for path, access in [*rules, *devices]:
        merged[path] = merged.get(path, 0) | access
    rs.paths = sorted((p, a & rs.handled_fs) for p, a in merged.items() if a & rs.handled_fs)
    if proxy_port is not None:
        rs.ports = [(proxy_port, NET_CONNECT_TCP)]
    return rs
