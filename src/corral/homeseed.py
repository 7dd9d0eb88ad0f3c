"""Seeding the home layer (see :mod:`corral.home`): deciding what it shows of the
real home (:func:`decide`, pure), doing it (:func:`seed`), and the manifest that
says which entries are corral's copies and what seeding last looked at.

Imported only when a seeding has something to do, and for ``corral home``.
"""

from __future__ import annotations

import os
import stat
import time

from corral import defaults
from corral.home import (
    COPY_COUNT_MAX,
    COPY_MAX,
    MANIFEST_MAGIC,
    MERGED,
    OWN,
    HomeLayer,
    layers_dir,
    secrets_digest,
    stamp,
    stamped_paths,
    workspace_key,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

RECENT_NS = 1_000_000_000  # stamps younger than this are not trusted (see write_manifest)


class Entry:
    """One directory entry as seeding sees it: ``kind`` is dir, file (regular, or a
    link to one), link (to anything else) or other (sockets, fifos: skipped)."""

    __slots__ = ("ino", "kind", "mtime", "size")

    def __init__(self, kind: str, size: int = 0, mtime: int = 0, ino: int = 0) -> None:
        self.kind = kind
        self.size = size
        self.mtime = mtime
        self.ino = ino

    def __repr__(self) -> str:
        return f"Entry({self.kind!r}, {self.size}, {self.mtime}, {self.ino})"


class Copy:
    """What the manifest remembers of a copy corral made: the real file's size and
    mtime when copied, and the copy's inode, size and mtime then."""

    __slots__ = ("ino", "mtime", "real_mtime", "real_size", "size")

    def __init__(self, real_size: int, real_mtime: int, ino: int, size: int, mtime: int) -> None:
        self.real_size = real_size
        self.real_mtime = real_mtime
        self.ino = ino
        self.size = size
        self.mtime = mtime

    def unchanged(self, seen: Entry | None) -> bool:
        """Whether the layer's entry is still the copy corral made (the sandbox did
        not replace or edit it)."""
        return (
            seen is not None
            and seen.kind == "file"
            and (seen.ino, seen.size, seen.mtime) == (self.ino, self.size, self.mtime)
        )

    def stale(self, real: Entry) -> bool:
        return (real.size, real.mtime) != (self.real_size, self.real_mtime)


def never_copied(name: str) -> bool:
    """Names that hold secrets wherever they are (the workspace list), and names the
    manifest's line format cannot hold."""
    if name in defaults.READ_DENY_WORKSPACE_NAMES or "\t" in name or "\n" in name:
        return True
    return name.startswith(".env.") and name not in defaults.ENV_TEMPLATES


def decide(
    rel_dir: str,
    real_dir: str,
    real: dict[str, Entry],
    layer: dict[str, Entry],
    copies: dict[str, Copy],
    is_secret: Callable[[str], bool],
) -> list[tuple[str, ...]]:
    """What to do in one layer directory (``rel_dir`` inside the layer, "" for its
    top) so that it shows ``real_dir``'s entries (``real``).  ``layer`` is what the
    layer directory holds now, ``copies`` the manifest's copies.  Operations:

    ("link", rel, target), ("copy", rel, source), ("mkdir", rel),
    ("remove", rel) (an unchanged copy whose original is gone or secret),
    ("unlink-link", rel, target) (a link corral made to something now gone),
    ("forget", rel) (a copy the sandbox replaced: its own now).
    """
    ops: list[tuple[str, ...]] = []
    top = rel_dir == ""
    copied = 0
    for name in sorted(real):
        rel = name if top else f"{rel_dir}/{name}"
        source = os.path.join(real_dir, name)
        have, entry, copy = layer.get(name), real[name], copies.get(rel)
        if is_secret(source) or (entry.kind == "file" and never_copied(name)):
            if copy is not None:
                ops.append(("remove", rel))  # was copied before the path became secret
            continue
        if entry.kind == "other" or (top and name in OWN):
            continue
        if top and name in MERGED and entry.kind == "dir":
            if have is None:
                ops.append(("mkdir", rel))
            continue  # its entries: the same decision one level down
        copyable = (
            entry.kind == "file"
            and entry.size <= COPY_MAX
            and (name.startswith(".") or not top)
            and copied < COPY_COUNT_MAX
        )
        if copy is not None:
            if copy.unchanged(have):
                if copy.stale(entry):
                    ops.append(("copy", rel, source))  # follow the real file
                copied += 1
                continue
            ops.append(("forget", rel))  # replaced by the sandbox: its own now
        if have is not None:
            continue  # the layer's own entry wins (or a link made before)
        if copyable:
            ops.append(("copy", rel, source))
            copied += 1
        else:
            ops.append(("link", rel, source))
    for name in sorted(set(layer) - set(real)):
        rel = name if top else f"{rel_dir}/{name}"
        copy = copies.get(rel)
        if copy is not None:
            ops.append(("remove", rel) if copy.unchanged(layer[name]) else ("forget", rel))
        elif layer[name].kind == "link":
            ops.append(("unlink-link", rel, os.path.join(real_dir, name)))
    for rel in sorted(copies):  # copies of names neither side has any more
        parent, _, name = rel.rpartition("/")
        if parent == rel_dir and name not in real and name not in layer:
            ops.append(("forget", rel))
    return ops


def secret_test(secrets: Iterable[str]) -> Callable[[str], bool]:
    """Whether a path is a read-deny path or lies beneath one."""
    deny = frozenset(p.rstrip("/") or "/" for p in secrets)

    def is_secret(path: str) -> bool:
        while True:
            if path in deny:
                return True
            parent = os.path.dirname(path)
            if parent == path:
                return False
            path = parent

    return is_secret


# -- doing it (the launcher, before the sandbox starts) ------------------------


def refresh(layer: HomeLayer) -> None:
    """Seed the layer and record what seeding looked at (OSError on failure).

    Runs of one workspace that start together take turns (a lock beside the
    layer): each copy's manifest entry must name the file that is there."""
    if layer.mode != "persist":
        if layer.real is not None:
            seed(layer, {})
        return
    import fcntl

    lock = os.open(
        layer.path + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        copies = dict(read_manifest(layer.manifest) or {})
        if layer.real is not None:
            seed(layer, copies)
        write_manifest(layer, copies)
    finally:
        os.close(lock)  # and with it the lock


def _real_entries(path: str, top: bool) -> dict[str, Entry]:
    """The real directory's entries; only dotfiles at the top (and every file in a
    MERGED directory) cost a stat: the rest are linked whatever their size."""
    found: dict[str, Entry] = {}
    try:
        it = os.scandir(path)
    except OSError:
        return found
    with it:
        for e in it:
            try:
                if e.is_symlink():
                    # a dotfile kept elsewhere (stow, chezmoi): its content, if a file
                    wanted = e.name.startswith(".") or not top
                    st = os.stat(e.path) if wanted else None
                    if st is not None and stat.S_ISREG(st.st_mode):
                        found[e.name] = Entry("file", st.st_size, st.st_mtime_ns)
                    elif st is not None and stat.S_ISDIR(st.st_mode):
                        found[e.name] = Entry("dir")  # a dotfiles directory: still merged
                    else:
                        found[e.name] = Entry("link")
                elif e.is_dir(follow_symlinks=False):
                    found[e.name] = Entry("dir")
                elif e.is_file(follow_symlinks=False):
                    if e.name.startswith(".") or not top:
                        st = e.stat(follow_symlinks=False)
                        found[e.name] = Entry("file", st.st_size, st.st_mtime_ns)
                    else:
                        found[e.name] = Entry("file", COPY_MAX + 1)  # linked: no stat needed
                else:
                    found[e.name] = Entry("other")
            except OSError:
                found[e.name] = Entry("link")
    return found


def _layer_entries(fd: int, copies: dict[str, Copy], rel_dir: str) -> dict[str, Entry]:
    found: dict[str, Entry] = {}
    with os.scandir(fd) as it:
        for e in it:
            rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
            if e.is_symlink():
                found[e.name] = Entry("link")
            elif e.is_dir(follow_symlinks=False):
                found[e.name] = Entry("dir")
            elif rel in copies and e.is_file(follow_symlinks=False):
                st = os.stat(e.name, dir_fd=fd, follow_symlinks=False)
                found[e.name] = Entry("file", st.st_size, st.st_mtime_ns, st.st_ino)
            else:
                found[e.name] = Entry("other")
    return found


def seed(layer: HomeLayer, copies: dict[str, Copy]) -> None:
    """Apply :func:`decide` to the top of the layer and to each MERGED directory.

    Everything inside the layer is done relative to a directory descriptor and
    never follows a link: the sandbox may have put links anywhere in it."""
    assert layer.real is not None
    is_secret = secret_test(layer.secrets)
    top = os.open(layer.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        _seed_dir(top, "", layer.real, copies, is_secret)
        for name in MERGED:
            try:
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
            except OSError:
                continue  # not a directory of the layer's (the sandbox's own choice)
            try:
                _seed_dir(sub, name, os.path.join(layer.real, name), copies, is_secret)
            finally:
                os.close(sub)
    finally:
        os.close(top)


def _seed_dir(
    fd: int, rel_dir: str, real_dir: str, copies: dict[str, Copy], is_secret: Callable[[str], bool]
) -> None:
    real = _real_entries(real_dir, rel_dir == "")
    ops = decide(rel_dir, real_dir, real, _layer_entries(fd, copies, rel_dir), copies, is_secret)
    for op in ops:
        name = op[1].rpartition("/")[2]
        try:
            _apply(fd, op, name, copies, is_secret)
        except OSError:
            continue  # one entry that cannot be seeded leaves the rest as they are


def _apply(
    fd: int,
    op: tuple[str, ...],
    name: str,
    copies: dict[str, Copy],
    is_secret: Callable[[str], bool],
) -> None:
    what, rel = op[0], op[1]
    if what == "mkdir":
        os.mkdir(name, 0o700, dir_fd=fd)
    elif what == "link":
        try:
            os.symlink(op[2], name, dir_fd=fd)
        except FileExistsError:
            pass  # a concurrent run made it
    elif what == "copy":
        made = _copy_in(fd, name, op[2], is_secret)
        if made is not None:
            copies[rel] = made
    elif what == "remove":
        copy = copies.pop(rel)
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if copy.unchanged(Entry("file", st.st_size, st.st_mtime_ns, st.st_ino)):
            os.unlink(name, dir_fd=fd)
    elif what == "unlink-link":
        if os.readlink(name, dir_fd=fd) == op[2]:  # corral's own link, now dangling
            os.unlink(name, dir_fd=fd)
    elif what == "forget":
        copies.pop(rel, None)


def _copy_in(fd: int, name: str, source: str, is_secret: Callable[[str], bool]) -> Copy | None:
    """Copy a regular file into the layer directory ``fd`` under ``name``, replacing
    what is there; None when the source is not a readable, small, public file."""
    if is_secret(os.path.realpath(source)):
        return None  # a link in the real home that leads into a secret
    src = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode) or st.st_size > COPY_MAX:
            return None
        data = b""
        while chunk := os.read(src, COPY_MAX + 1 - len(data)):
            data += chunk
            if len(data) > COPY_MAX:
                break
    finally:
        os.close(src)
    if len(data) > COPY_MAX:
        return None
    tmp = f".corral-seed-{os.urandom(4).hex()}"
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
    try:
        os.write(out, data)
        os.fchmod(out, st.st_mode & 0o755 | 0o600)
        os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        mine = os.fstat(out)
    except BaseException:
        os.close(out)
        os.unlink(tmp, dir_fd=fd)
        raise
    os.close(out)
    os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    # a change to the real file in the clock tick it was read in would keep its
    # mtime: a time that recent is not remembered, so the next seeding copies again
    real_mtime = st.st_mtime_ns if st.st_mtime_ns <= time.time_ns() - RECENT_NS else -1
    return Copy(len(data), real_mtime, mine.st_ino, mine.st_size, mine.st_mtime_ns)


# -- the manifest: which entries are corral's copies ---------------------------


def read_manifest(path: str) -> dict[str, Copy] | None:
    """The copies a layer's manifest lists; None when there is no manifest yet."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            lines = fh.read().split("\n")
    except FileNotFoundError:
        return None
    copies: dict[str, Copy] = {}
    if lines[0] != MANIFEST_MAGIC:
        return copies  # unknown: start again (a copy then counts as the sandbox's own)
    for line in lines[1:]:
        parts = line.split("\t")
        if len(parts) == 7 and parts[0] == "copy":
            try:
                numbers = [int(p) for p in parts[2:]]
            except ValueError:
                continue
            copies[parts[1]] = Copy(*numbers)
    return copies


def manifest_workspace(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            head = fh.read(8192).split("\n")
    except OSError:
        return ""
    for line in head[1:]:
        if line.startswith("workspace\t"):
            return line.partition("\t")[2]
    return ""


def write_manifest(layer: HomeLayer, copies: dict[str, Copy]) -> None:
    """The copies, and the stamps :func:`corral.home.unchanged` checks next time (taken
    after seeding: its own changes to the layer are not news)."""
    path = layer.manifest
    lines = [MANIFEST_MAGIC]
    if "\n" not in layer.workspace and "\t" not in layer.workspace:
        lines.append(f"workspace\t{layer.workspace}")
    if layer.real is None:
        lines.append("secrets\t-")
    else:
        lines.append(f"secrets\t{secrets_digest(layer.secrets)}")
        # a file time is set from a clock that ticks every few milliseconds: a
        # change in the same tick as the stamp would go unseen, so a stamp that
        # recent is recorded as one that never holds (the next run seeds again)
        recent = time.time_ns() - RECENT_NS
        for where in stamped_paths(layer, copies):
            if "\n" not in where and "\t" not in where:
                value = stamp(where)
                if value != "-" and int(value.partition(":")[0]) > recent:
                    value = "recent"
                lines.append(f"stamp\t{where}\t{value}")
    for rel, c in sorted(copies.items()):
        lines.append(f"copy\t{rel}\t{c.real_size}\t{c.real_mtime}\t{c.ino}\t{c.size}\t{c.mtime}")
    tmp = f"{path}.{os.urandom(4).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
    finally:
        os.close(fd)
    os.rename(tmp, path)


# -- `corral home` and `corral doctor` ------------------------------------------


def layers_of(workspace: str) -> list[str]:
    """Every layer of ``workspace`` that exists: the host tiers', the container tiers',
    and ephemeral ones a killed run left behind."""
    base = layers_dir()
    key = workspace_key(workspace)
    try:
        names = os.listdir(base)
    except OSError:
        return []
    mine = (key, f"{key}-container")
    return sorted(
        os.path.join(base, n)
        for n in names
        if not n.endswith((".seed", ".lock"))
        and (n in mine or n.startswith(tuple(m + ".run-" for m in mine)))
    )


def all_layers() -> list[str]:
    base = layers_dir()
    try:
        names = os.listdir(base)
    except OSError:
        return []
    return sorted(os.path.join(base, n) for n in names if not n.endswith((".seed", ".lock")))


def gone_layers() -> list[str]:
    """Layers whose workspace (as their manifest names it) no longer exists."""
    found = []
    for path in all_layers():
        workspace = manifest_workspace(path + ".seed")
        if workspace and not os.path.isdir(workspace):
            found.append(path)
    return found


def size_of(path: str) -> int:
    """Bytes under ``path`` (links not followed)."""
    total = 0
    for entry, _ in tree_entries(path):
        try:
            total += os.lstat(entry).st_blocks * 512
        except OSError:
            pass
    return total


def tree_entries(top: str) -> Iterator[tuple[str, bool]]:
    """Every path under ``top`` (not ``top``), parents before what they hold, and
    whether it is a directory; links are entries, never followed.  A loop, not a
    recursion (os.walk's in 3.11): a layer a run nested 1,500 directories deep
    made `corral home list` and `clean` end in RecursionError."""
    pending = [top]
    while pending:
        directory = pending.pop()
        try:
            with os.scandir(directory) as found:
                entries = list(found)
        except OSError:
            continue
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            yield entry.path, is_dir
            if is_dir:
                pending.append(entry.path)


def report() -> dict[str, str]:
    """What each kind of tier does with $HOME, for ``corral doctor``."""
    return {
        "layers": layers_dir(),
        "namespace, landlock, microvm": (
            "$HOME is the workspace's home layer, seeded with links to your home's entries "
            f"and copies of its dotfiles (not {', '.join(OWN)}, never a secret); your home "
            "itself stays read-only at its own path"
        ),
        "container, gvisor": (
            "the workspace's own layer is bound at $HOME; not seeded (your home is not in "
            "the container)"
        ),
        "off": '[filesystem] home = "read-only" (or --home read-only): $HOME is your home, '
        "read-only, as without a layer",
    }
