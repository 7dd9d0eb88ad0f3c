"""Set up the guest kernel the microVM boots: ``python -m corral.vm.setup``.

It takes Debian's ``linux-image`` kernel, from this host (``/boot/vmlinuz-VER``
with ``/lib/modules/VER``) when it has one the guest can use, else fetched with
``apt-get download`` (no root needed) and read with ``dpkg-deb``.  Kept in the
cache (``$XDG_CACHE_HOME/corral/vm``, else ``~/.cache/corral/vm``):

* ``kernel-VER/vmlinux``: the ELF kernel out of the bzImage, trimmed
  (:mod:`corral.vm.kernel`), booted through its PVH entry;
* ``kernel-VER/modules/NAME.ko``: the modules the guest needs that this kernel
  does not have built in (Debian builds virtio-mmio, the virtio console and 9p
  as modules), with ``kernel-VER/manifest`` naming them in load order.

With ``--system`` (as root) the kernel goes to :data:`SYSTEM_DIR` instead, for
every user of the host.  :func:`require` is what a run calls: the assets (this
user's first, then the system's), or a refusal naming the command that fixes it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

from corral.errors import CorralError, RefusedError, SetupError
from corral.vm import kernel


def setup_command() -> str:
    """The command that sets the guest kernel up, for the interpreter running corral.

    A user who installed corral into a virtual environment needs that
    environment's python, not whatever ``python3`` is on PATH.
    """
    python = sys.executable or "python3"
    on_path = shutil.which("python3")
    in_venv = sys.prefix != sys.base_prefix
    if on_path and not in_venv and os.path.realpath(on_path) == os.path.realpath(python):
        python = "python3"
    return f"{shlex.quote(python)} -m corral.vm.setup"


META_PACKAGE = "linux-image-amd64"
# What the guest needs from its kernel: the microvm's virtio-mmio bus, the
# virtio-serial ports (stdio, control, door) and the 9p file system.
WANTED = ("virtio_mmio", "virtio_console", "9pnet_virtio", "9p")
MANIFEST_VERSION = "1"


SYSTEM_DIR = "/var/cache/corral/vm"  # kernels root set up for every user (--system)


def cache_dir() -> str:
    """This user's cache: kernels set up by them, the initramfs, probe answers."""
    from corral import vm

    return vm.cache_dir()


class Assets:
    """A set-up guest kernel: its ELF, its version and its modules in load order."""

    __slots__ = ("directory", "modules", "release", "vmlinux")

    def __init__(self, directory: str, release: str, modules: list[str]) -> None:
        self.directory = directory
        self.release = release
        self.vmlinux = os.path.join(directory, "vmlinux")
        self.modules = modules  # names, in insmod order

    def module_path(self, name: str) -> str:
        return os.path.join(self.directory, "modules", name + ".ko")


def _manifest_text(release: str, source: str, order: list[str]) -> str:
    return (
        f"version {MANIFEST_VERSION}\nrelease {release}\nsource {source}\n"
        f"wanted {' '.join(WANTED)}\nmodules {' '.join(order)}\n"
    )


def read_manifest(directory: str) -> Assets | None:
    try:
        with open(os.path.join(directory, "manifest"), encoding="utf-8") as fh:
            fields = dict(line.rstrip("\n").partition(" ")[::2] for line in fh)
    except OSError:
        return None
    if fields.get("version") != MANIFEST_VERSION or fields.get("wanted") != " ".join(WANTED):
        return None  # set up by another corral: set up again
    assets = Assets(directory, fields.get("release", ""), fields.get("modules", "").split())
    if not os.path.isfile(assets.vmlinux):
        return None
    return assets


def installed(cache: str | None = None) -> list[Assets]:
    """Every usable guest kernel in the cache, newest release first."""
    cache = cache or cache_dir()
    try:
        names = sorted(os.listdir(cache), reverse=True)
    except OSError:
        return []
    found = []
    for name in names:
        if name.startswith("kernel-") and ".tmp" not in name:
            assets = read_manifest(os.path.join(cache, name))
            if assets is not None:
                found.append(assets)
    return found


def require(cache: str | None = None, system: str = SYSTEM_DIR) -> Assets:
    """The guest kernel to boot (this user's, else the system's), or RefusedError
    naming the command that sets it up."""
    if os.uname().machine != "x86_64":
        raise RefusedError(f"microvm: guests are x86_64 only; this host is {os.uname().machine}")
    found = installed(cache) + installed(system)
    if not found:
        raise RefusedError(f"microvm: no guest kernel is set up; run: {setup_command()}")
    return found[0]


# ---- where the package's files come from --------------------------------------


class Source:
    """The files of one kernel release: the bzImage, modules.builtin, modules."""

    release = ""
    origin = ""

    def bzimage(self) -> bytes:
        raise NotImplementedError

    def modules(self, names: set[str]) -> tuple[dict[str, bytes], set[str]]:
        """The .ko files of ``names`` found, and the names built into the kernel."""
        raise NotImplementedError


def _decompress_module(path: str, data: bytes) -> bytes:
    if path.endswith(".xz"):
        import lzma

        return lzma.decompress(data)
    if path.endswith(".gz"):
        import gzip

        return gzip.decompress(data)
    if path.endswith(".zst"):
        raise SetupError(f"{path}: zstd-compressed modules are not supported")
    return data


def _builtin_names(text: str) -> set[str]:
    return {kernel.module_name(line.strip()) for line in text.splitlines() if line.strip()}


class HostKernel(Source):
    """``/boot/vmlinuz-VER`` and ``/lib/modules/VER`` on this host."""

    def __init__(self, release: str, boot: str = "/boot", lib: str = "/lib/modules") -> None:
        self.release = release
        self.origin = f"{boot}/vmlinuz-{release}"
        self.tree = os.path.join(lib, release)

    def bzimage(self) -> bytes:
        with open(self.origin, "rb") as fh:
            return fh.read()

    def modules(self, names: set[str]) -> tuple[dict[str, bytes], set[str]]:
        try:
            with open(os.path.join(self.tree, "modules.builtin"), encoding="utf-8") as fh:
                builtin = _builtin_names(fh.read())
        except OSError:
            builtin = set()
        found: dict[str, bytes] = {}
        for root, _dirs, files in os.walk(os.path.join(self.tree, "kernel")):
            for name in files:
                if kernel.module_name(name) in names:
                    path = os.path.join(root, name)
                    with open(path, "rb") as fh:
                        found[kernel.module_name(name)] = _decompress_module(path, fh.read())
        return found, builtin


def host_releases(boot: str = "/boot", lib: str = "/lib/modules") -> list[str]:
    """Kernel releases this host has both a vmlinuz and modules for, newest first."""
    try:
        names = os.listdir(boot)
    except OSError:
        return []
    releases = [n[len("vmlinuz-") :] for n in names if n.startswith("vmlinuz-")]
    return sorted((r for r in releases if os.path.isdir(os.path.join(lib, r))), reverse=True)


class DebPackage(Source):
    """A downloaded ``linux-image-VER`` package, read with ``dpkg-deb --fsys-tarfile``."""

    def __init__(self, deb: str, release: str) -> None:
        self.deb = deb
        self.release = release
        self.origin = os.path.basename(deb)

    def _members(self, wanted: object) -> dict[str, bytes]:
        """Files of the package whose path (``boot/...``, ``lib/modules/...``) ``wanted``
        accepts, read from one pass over its data archive."""
        import tarfile

        proc = subprocess.Popen(
            ["dpkg-deb", "--fsys-tarfile", self.deb],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None and callable(wanted)
        found: dict[str, bytes] = {}
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                for member in tar:
                    path = member.name.removeprefix("./").removeprefix("usr/")
                    if member.isfile() and wanted(path):
                        data = tar.extractfile(member)
                        if data is not None:
                            found[path] = data.read()
        finally:
            proc.stdout.close()
            err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
            if proc.wait() != 0:
                raise SetupError(f"dpkg-deb cannot read {self.deb}: {err or 'failed'}")
        return found

    def bzimage(self) -> bytes:
        path = f"boot/vmlinuz-{self.release}"
        found = self._members(lambda p: p == path)
        if path not in found:
            raise SetupError(f"{self.origin} holds no {path}")
        return found[path]

    def modules(self, names: set[str]) -> tuple[dict[str, bytes], set[str]]:
        tree = f"lib/modules/{self.release}/"
        builtin_path = tree + "modules.builtin"

        def wanted(path: str) -> bool:
            if path == builtin_path:
                return True
            return path.startswith(tree + "kernel/") and kernel.module_name(path) in names

        files = self._members(wanted)
        builtin = _builtin_names(files.pop(builtin_path, b"").decode(errors="replace"))
        found = {kernel.module_name(p): _decompress_module(p, d) for p, d in files.items()}
        return found, builtin


def versioned_package(apt_cache_depends: str) -> str | None:
    """The ``linux-image-...`` package ``apt-cache depends`` output names first."""
    for line in apt_cache_depends.splitlines():
        kind, _, name = line.strip().partition(": ")
        if kind == "Depends" and name.startswith("linux-image-"):
            return name.strip("<>")
    return None


def package_for_meta(meta: str = META_PACKAGE) -> str:
    """The versioned kernel package the meta-package depends on now (apt's lists)."""
    try:
        out = subprocess.run(
            ["apt-cache", "depends", meta], capture_output=True, text=True, check=False
        )
    except OSError:
        raise RefusedError(
            "microvm setup needs apt-cache and apt-get download (Debian or Ubuntu)"
        ) from None
    found = versioned_package(out.stdout)
    if found is None:
        raise SetupError(
            f"apt knows no {meta} (run apt-get update first): {out.stderr.strip()[-200:]}"
        )
    return found


def download(package: str, into: str) -> str:
    """``apt-get download PACKAGE`` into ``into``; the .deb's path."""
    out = subprocess.run(
        ["apt-get", "download", "-q", package], cwd=into, capture_output=True, text=True
    )
    debs = [n for n in os.listdir(into) if n.startswith(package + "_") and n.endswith(".deb")]
    if out.returncode != 0 or not debs:
        last = (out.stderr.strip().splitlines() or ["failed"])[-1]
        raise SetupError(f"apt-get download {package}: {last}")
    return os.path.join(into, debs[0])


# ---- building the cache entry --------------------------------------------------


def _gather_modules(source: Source) -> tuple[list[str], dict[str, bytes]]:
    """The modules to load, in order, with their bytes: WANTED and what they need."""
    have: dict[str, bytes] = {}
    builtin: set[str] = set()
    asked: set[str] = set()
    todo = set(WANTED)
    while todo:
        asked |= todo
        found, builtin_now = source.modules(todo)
        builtin |= builtin_now
        have.update(found)
        deps = {name: kernel.depends(data) for name, data in have.items()}
        todo = {d for ds in deps.values() for d in ds if d not in have and d not in builtin}
        todo -= asked  # asked already and not there: reported below
    missing = [n for n in asked if n not in have and n not in builtin]
    if missing:
        raise SetupError(
            f"kernel {source.release} has neither built in nor as modules: "
            + ", ".join(sorted(missing))
        )
    deps = {name: kernel.depends(data) for name, data in have.items()}
    order = kernel.load_order(list(WANTED), deps)
    return order, {name: have[name] for name in order}


def install(source: Source, cache: str) -> Assets:
    """Write the kernel's cache entry from ``source`` (atomically: a rename)."""
    elf = kernel.vmlinux_from_bzimage(source.bzimage())
    if not kernel.has_pvh_note(elf):
        raise SetupError(
            f"kernel {source.release} has no PVH entry (CONFIG_PVH); QEMU cannot boot it"
        )
    order, modules = _gather_modules(source)
    final = os.path.join(cache, f"kernel-{source.release}")
    work = f"{final}.tmp{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "modules"))
    with open(os.path.join(work, "vmlinux"), "wb") as fh:
        fh.write(kernel.trim_elf(elf))
    for name, data in modules.items():
        with open(os.path.join(work, "modules", name + ".ko"), "wb") as fh:
            fh.write(data)
    with open(os.path.join(work, "manifest"), "w", encoding="utf-8") as fh:
        fh.write(_manifest_text(source.release, source.origin, order))
    shutil.rmtree(final, ignore_errors=True)
    os.rename(work, final)
    assets = read_manifest(final)
    assert assets is not None
    return assets


def _clean_stale(cache: str) -> None:
    """Work directories a killed setup left behind."""
    try:
        names = os.listdir(cache)
    except OSError:
        return
    for name in names:
        if ".tmp" in name:
            shutil.rmtree(os.path.join(cache, name), ignore_errors=True)


def setup(cache: str | None = None, fetch: bool = True, log: object = None) -> Assets:
    """Find or fetch a kernel and install it in the cache; the assets."""
    say = log if callable(log) else (lambda _line: None)
    cache = cache or cache_dir()
    os.makedirs(cache, mode=0o755 if cache == SYSTEM_DIR else 0o700, exist_ok=True)
    _clean_stale(cache)
    problems = []
    for release in host_releases():
        try:
            assets = install(HostKernel(release), cache)
        except (CorralError, kernel.KernelError, OSError) as exc:
            problems.append(f"/boot/vmlinuz-{release}: {exc}")
            continue
        say(f"guest kernel {release} from this host's /boot")
        return assets
    if not fetch:
        raise SetupError("; ".join(problems) or "no kernel in /boot with modules in /lib/modules")
    package = package_for_meta()
    release = package.removeprefix("linux-image-")
    say(f"fetching {package} with apt-get download")
    work = os.path.join(cache, f"download.tmp{os.getpid()}")
    os.makedirs(work)
    try:
        deb = download(package, work)
        assets = install(DebPackage(deb, release), cache)
    except kernel.KernelError as exc:
        raise SetupError(f"{package}: {exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"guest kernel {release} from {package}")
    return assets


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if any(a not in ("--no-fetch", "--system") for a in argv):
        print(f"usage: {setup_command()} [--no-fetch] [--system]", file=sys.stderr)
        return 2
    cache = SYSTEM_DIR if "--system" in argv else None
    try:
        assets = setup(cache, fetch="--no-fetch" not in argv, log=print)
    except CorralError as exc:
        print(f"corral: {exc.message}", file=sys.stderr)
        return exc.code
    print(f"ready: {assets.vmlinux} with {len(assets.modules)} modules: {' '.join(assets.modules)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
