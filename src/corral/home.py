"""The home layer: a private, per-workspace home directory for sandboxed commands.

Tools write under ``~`` (npm's cache, ``pip install --user``, ``git config
--global``, ``~/.cache``).  The real home stays read-only (secrets masked) and
stays where it is; ``HOME`` inside the sandbox points at a directory corral
keeps for the workspace instead, under its state directory::

    $XDG_STATE_HOME/corral/homes/<workspace-name>-<hash>/

It is seeded from the real home, so that reading ``~/.gitconfig`` or running a
tool installed under ``~`` still works (:func:`decide`):

* a dotfile at the top of the home (and any file in ``~/.config``) of at most
  COPY_MAX bytes is *copied*: the sandbox may change its copy (``git config
  --global`` replaces it), and the copy follows the real file until it does;
* every other entry is a *symlink* to the real one: reading works, writing
  through it meets the real home's read-only mount (or Landlock's refusal);
* OWN names (caches, ``~/.local``) are never linked: the layer keeps its own;
* a secret (any read-deny path, or beneath one) is never copied or linked.

Why not an overlay filesystem: bubblewrap 0.8 has no overlay option, and
mounting one first (a user namespace made by corral, then bwrap inside it)
costs about 0.75 ms per run here, on top of ctypes (measured; see the README).

So the sandbox reaches the real home's content only through its real paths
(masked exactly as before) or through copies of files that are not secret.
What the sandbox itself writes into the layer, including a file at a path
that is secret in the real home (``~/.npmrc``), is its own and persists for
the next run of the same workspace: that is how a token-free copy of a tool's
configuration is given to it (README).

Modes (``[filesystem] home``): ``persist`` (default), ``ephemeral`` (a fresh
seeded layer per run, removed after it), ``read-only`` (no layer: ``HOME`` is
the real home, read-only, as before).  Container tiers bind their own layer at
``$HOME`` and seed nothing: the host's home is not in the container at all.

This module is on the hot path of ``corral run``: it imports only ``os``.
"""

from __future__ import annotations

import os
import stat

from corral import defaults

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from corral.policy import Policy

MODES = defaults.HOME_MODES
# Never linked to the real home: tools write there (caches, pip's --user site,
# ~/.local/bin), and writes through a link would meet the read-only real home.
OWN = (".cache", ".npm", ".local")
# Seeded one level deeper: new entries are the layer's, existing ones linked or copied.
MERGED = (".config",)
COPY_MAX = 64 << 10  # bytes: larger files are linked, not copied
COPY_COUNT_MAX = 64  # copies per directory; the rest are linked
MANIFEST_MAGIC = "corral-home 1"


def layers_dir() -> str:
    from corral import runlog

    return os.path.join(runlog.state_dir(), "homes")


def workspace_key(workspace: str) -> str:
    """``<name>-<hash>``: readable in a listing, distinct for every workspace path."""
    try:  # the builtin module is much cheaper to import than hashlib
        from _sha256 import sha256  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        from hashlib import sha256
    name = os.path.basename(workspace.rstrip("/"))[:32]
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in name).lstrip(".") or "ws"
    digest = sha256(workspace.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return f"{name}-{digest}"


def layer_name(workspace: str, kind: str = "host") -> str:
    """Host tiers (namespace, landlock) share one layer; container tiers have their own,
    unseeded (the image's programs are not the host's, and the host home is absent)."""
    key = workspace_key(workspace)
    return key if kind == "host" else f"{key}-container"


def layer_path(workspace: str, kind: str = "host") -> str:
    return os.path.join(layers_dir(), layer_name(workspace, kind))


class HomeLayer:
    """One run's home layer: where it is, how long it lives, what seeds it."""

    __slots__ = ("kind", "manifest", "mode", "path", "real", "secrets", "workspace")

    def __init__(self, path: str, mode: str, kind: str, workspace: str, real: str | None) -> None:
        self.path = path
        self.mode = mode  # persist or ephemeral
        self.kind = kind  # host or container
        self.workspace = workspace
        self.real = real  # the real home to seed from (None: nothing to seed)
        self.secrets: frozenset[str] = frozenset()  # absolute read-deny paths
        self.manifest = path + ".seed"  # beside the layer: out of the sandbox's reach

    def describe(self) -> str:
        life = "removed after the run" if self.mode == "ephemeral" else "kept between runs"
        seeded = "seeded from " + self.real if self.real else "not seeded"
        return f"home layer ($HOME): {self.path} ({self.mode}: {life}; {seeded})"


def plan_home(policy: Policy, kind: str = "host") -> HomeLayer | None:
    """The layer a run gets under ``policy``, or None (read-only mode, a ``HOME`` the
    policy sets itself, or a home that is writable already).  Nothing is created
    until :func:`prepare`."""
    from corral.errors import PolicyError
    from corral.policy import _expect_home

    try:  # set from Python, the value has not met the loader's check
        mode = _expect_home(policy.filesystem.home)
    except ValueError as exc:
        raise PolicyError(f"filesystem.home: {exc}") from None
    if mode == "read-only" or "HOME" in policy.env.set_values:
        return None
    # spelled as the policy spells it: the read-deny paths seeding checks against
    # are ~ expanded the same way (and, for those present, their real paths too)
    real = os.path.normpath(os.path.abspath(policy.home()))
    resolved = os.path.realpath(real)
    if resolved == "/":
        return None  # nowhere to bind a layer
    for path in policy.writable_paths():
        root = os.path.realpath(path)
        if resolved == root or resolved.startswith(root.rstrip("/") + "/"):
            return None  # a workspace that holds the home: it is writable already
    path = layer_path(policy.workspace, kind)
    if mode == "ephemeral":
        path += ".run-" + os.urandom(6).hex()
    return HomeLayer(path, mode, kind, policy.workspace, real if kind == "host" else None)


# -- deciding what to seed (pure) ----------------------------------------------


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


class HomeError(Exception):
    pass


def _private_dir(path: str) -> None:
    """Make ``path`` (and missing parents) a directory of ours, mode 0700; refuse a
    link or someone else's directory there."""
    try:
        os.mkdir(path, 0o700)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise HomeError(f"{path} is not a directory owned by this user")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)


def prepare(layer: HomeLayer) -> None:
    """Create the layer (mode 0700) and seed it; HomeError says why it cannot be."""
    try:
        _private_dir(os.path.dirname(layer.path))
        _private_dir(layer.path)
        if layer.mode != "persist":
            if layer.real is not None:
                seed(layer, {})
            return
        known = read_manifest(layer.manifest)
        copies = dict(known or {})
        if layer.real is not None:
            seed(layer, copies)
        # seed() replaces a Copy it renews and drops one it forgets: comparing the
        # dicts (values by identity) tells whether anything changed
        if known is None or copies != known:
            write_manifest(layer.manifest, layer.workspace, copies)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise HomeError(f"cannot prepare the home layer {layer.path}: {why}") from None


def remove(path: str) -> None:
    """Remove a layer and its manifest (never following a link inside it)."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    try:
        os.unlink(path + ".seed")
    except FileNotFoundError:
        pass


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
    return Copy(len(data), st.st_mtime_ns, mine.st_ino, mine.st_size, mine.st_mtime_ns)


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


def write_manifest(path: str, workspace: str, copies: dict[str, Copy]) -> None:
    lines = [MANIFEST_MAGIC]
    if "\n" not in workspace:
        lines.append(f"workspace\t{workspace}")
    for rel, c in sorted(copies.items()):
        lines.append(f"copy\t{rel}\t{c.real_size}\t{c.real_mtime}\t{c.ino}\t{c.size}\t{c.mtime}")
    tmp = f"{path}.{os.urandom(4).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
    finally:
        os.close(fd)
    os.rename(tmp, path)


# -- `corral home`: where the layers are, and removing them --------------------


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
        if not n.endswith(".seed") and (n in mine or n.startswith(tuple(m + ".run-" for m in mine)))
    )


def all_layers() -> list[str]:
    base = layers_dir()
    try:
        names = os.listdir(base)
    except OSError:
        return []
    return sorted(os.path.join(base, n) for n in names if not n.endswith(".seed"))


def size_of(path: str) -> int:
    """Bytes under ``path`` (links not followed)."""
    total = 0
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def report() -> dict[str, str]:
    """What each kind of tier does with $HOME, for ``corral doctor``."""
    return {
        "layers": layers_dir(),
        "namespace, landlock": (
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
