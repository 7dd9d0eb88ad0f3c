"""The home layer: a private, per-workspace home directory for sandboxed commands.

Tools write under ``~`` (npm's cache, ``pip install --user``, ``git config
--global``, ``~/.cache``).  The real home stays read-only (secrets masked) and
stays where it is; ``HOME`` inside the sandbox points at a directory corral
keeps for the workspace instead, under its state directory::

    $XDG_STATE_HOME/corral/homes/<workspace-name>-<hash>/

It is seeded from the real home, so that reading ``~/.gitconfig`` or running a
tool installed under ``~`` still works (:func:`corral.homeseed.decide`):

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

This module is on the hot path of ``corral run``: it plans the layer and, when
nothing seeding looks at has changed since the last run (:func:`unchanged`:
a few stats), leaves it as it is; :mod:`corral.homeseed` does the rest.
"""

from __future__ import annotations

import os
import stat

from corral import defaults

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from corral.policy import Policy

MODES = defaults.HOME_MODES
# Never linked to the real home: tools write there (caches, pip's --user site,
# ~/.local/bin), and writes through a link would meet the read-only real home.
OWN = (".cache", ".npm", ".local")
# Seeded one level deeper: new entries are the layer's, existing ones linked or copied.
MERGED = (".config",)
COPY_MAX = 64 << 10  # bytes: larger files are linked, not copied
COPY_COUNT_MAX = 64  # copies per directory; the rest are linked
MANIFEST_MAGIC = "corral-home 2"


def layers_dir() -> str:
    from corral import runlog

    return os.path.join(runlog.state_dir(), "homes")


def _sha256_hex(text: str) -> str:
    try:  # the builtin module is much cheaper to import than hashlib
        from _sha256 import sha256  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        try:  # its name from Python 3.12
            from _sha2 import sha256  # type: ignore[import-not-found, no-redef, unused-ignore]
        except ImportError:
            from hashlib import sha256  # type: ignore[no-redef, unused-ignore]
    return str(sha256(text.encode("utf-8", "surrogateescape")).hexdigest())


def workspace_key(workspace: str) -> str:
    """``<name>-<hash>``: readable in a listing, distinct for every workspace path."""
    name = os.path.basename(workspace.rstrip("/"))[:32]
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in name).lstrip(".") or "ws"
    return f"{name}-{_sha256_hex(workspace)[:16]}"


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


class HomeError(Exception):
    pass


def _private_dir(path: str) -> None:
    """Make ``path`` (and missing parents) a directory of ours, mode 0700; refuse a
    link or someone else's directory there."""
    os.makedirs(path, 0o700, exist_ok=True)  # concurrent runs may race to make it
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
        if layer.mode == "persist" and unchanged(layer):
            return
        from corral import homeseed

        homeseed.refresh(layer)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise HomeError(
            f"cannot prepare the home layer {layer.path}: {why} (corral keeps it in its "
            "state directory: set XDG_STATE_HOME to a directory you can write, or run with "
            "--home read-only)"
        ) from None


def put(layer: str, name: str, data: bytes) -> None:
    """Write ``data`` to ``name`` (relative to the home: ``.npmrc``,
    ``.config/pip/pip.conf``) in a home layer, made (0700) if missing.  What a run
    left in the layer is the sandbox's: a symlink there (on the way, or at the
    name) led a user's copy of a token-free file to a host file of the run's
    choosing (found by attacking corral), so none is followed; a file with a
    second hard link is refused too.  OSError naming what is wrong."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or ".." in parts or name.startswith("/"):
        raise OSError(f"{name}: a path inside the home, such as .npmrc or .config/pip/pip.conf")
    _private_dir(layer)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(layer, flags)
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                os.mkdir(part, 0o700, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                inner = os.open(part, flags, dir_fd=fd)
            except OSError:
                where = "/".join(parts[: i + 1])
                raise OSError(
                    f"~/{where} in the home layer is not a directory (or a symlink): "
                    "remove it, or corral home clean"
                ) from None
            os.close(fd)
            fd = inner
        _write_file(fd, parts[-1], data, name)
    finally:
        os.close(fd)


def _write_file(directory: int, base: str, data: bytes, name: str) -> None:
    """``data`` into ``base`` in ``directory``: a plain file of one link, or made."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        out = os.open(base, flags, 0o600, dir_fd=directory)
    except OSError as exc:
        raise OSError(
            f"~/{name} in the home layer: {exc.strerror} (a symlink or "
            "something else a run left: remove it, or corral home clean)"
        ) from None
    try:
        st = os.fstat(out)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise OSError(
                f"~/{name} in the home layer is not a plain file of one link: "
                "remove it, or corral home clean"
            )
        os.ftruncate(out, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(out, view) :]
    finally:
        os.close(out)


def remove(path: str) -> bool:
    """Remove a layer, its manifest and lock (corral.trees: through descriptors
    only, never following a link a run left); True once the layer is gone."""
    from corral.trees import remove_tree

    gone = remove_tree(path)
    for beside in (".seed", ".lock"):
        try:
            os.unlink(path + beside)
        except FileNotFoundError:
            pass
    return gone


# -- skipping the seeding when nothing it looks at changed ---------------------


def secrets_digest(secrets: Iterable[str]) -> str:
    """Which secrets a seeding honoured: another set (a new --read-deny) seeds again."""
    return _sha256_hex("\n".join(sorted(secrets)))[:32]


def stamp(path: str) -> str:
    """What changes when a directory gains or loses an entry, or a file its content."""
    try:
        st = os.stat(path)
    except OSError:
        return "-"
    return f"{st.st_mtime_ns}:{st.st_size}:{st.st_ino}"


def stamped_paths(layer: HomeLayer, copied: Iterable[str]) -> list[str]:
    """The directories seeding lists (both sides) and the real files it copied."""
    assert layer.real is not None
    paths = [layer.real, layer.path]
    for name in MERGED:
        paths += [os.path.join(layer.real, name), os.path.join(layer.path, name)]
    return paths + [os.path.join(layer.real, rel) for rel in sorted(copied)]


def unchanged(layer: HomeLayer) -> bool:
    """Whether the manifest's stamps all still hold (one read and a stat per stamp),
    under the same secrets: then seeding would change nothing."""
    try:
        with open(layer.manifest, "rb") as fh:
            lines = fh.read().decode("utf-8", "surrogateescape").split("\n")
    except OSError:
        return False
    if lines[0] != MANIFEST_MAGIC:
        return False
    want = secrets_digest(layer.secrets) if layer.real is not None else "-"
    honoured = False
    for line in lines[1:]:
        kind, _, rest = line.partition("\t")
        if kind == "secrets":
            honoured = rest == want
        elif kind == "stamp":
            path, _, value = rest.rpartition("\t")
            if stamp(path) != value:
                return False
    return honoured
