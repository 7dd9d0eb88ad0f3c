"""Build a small local image from programs already on this host (no registry needed).

    python -m corral.container.image [--tag localhost/corral-test:latest] [--engine podman]

The root file system holds busybox (static: sh and the usual tools), and each
program in ``DEFAULT_PROGRAMS`` (python3, curl, procps' pkill and pgrep, git) with the
shared libraries ``ldd`` says it needs; a Python brings its standard library, the
libraries of its extension modules and the HTTP clients of ``PYTHON_PACKAGES``
the host has; git brings its HTTP helper.  The tree is packed with tar and given to
``ENGINE import``.  Tests and CI use it; users point corral at their own image
with ``--image`` or ``[container] image``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

DEFAULT_TAG = "localhost/corral-test:latest"
DEFAULT_PROGRAMS = ("python3", "curl", "pkill", "pgrep", "git")
# git's own helpers: it re-executes itself from its exec path, and speaks HTTP
# through git-remote-http (git-remote-https is the same program)
GIT_HELPERS = ("git", "git-remote-http")
# Python packages the network tests use as real clients, when the host has them
# (Debian: python3-requests, python3-httpx), with what they import
PYTHON_PACKAGES = (
    "requests",
    "urllib3",
    "idna",
    "certifi",
    "charset_normalizer",
    "chardet",
    "httpx",
    "httpcore",
    "h11",
    "anyio",
    "sniffio",
    "rfc3986",
    "six.py",
)
DIST_PACKAGES = "/usr/lib/python3/dist-packages"
# bumped when the contents change, so tests rebuild an older image they find
IMAGE_VERSION = "2"
# what was added on top of version 2, as a label of its own: a checkout that only
# knows version 2 accepts this image as it is (it holds all of version 2) rather
# than rebuilding it from under another checkout's tests
IMAGE_FEATURES = "git,http-clients"


def _ldd(path: str) -> list[str]:
    out = subprocess.run(["ldd", path], capture_output=True, text=True, check=False).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
            libs.append(parts[2])
        elif parts and parts[0].startswith("/"):
            libs.append(parts[0])  # the loader
    return libs


def _copy(src: str, root: str, dest: str | None = None) -> None:
    target = os.path.join(root, (dest or src).lstrip("/"))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if not os.path.lexists(target):
        shutil.copy2(os.path.realpath(src), target)


def populate(root: str, programs: tuple[str, ...] = DEFAULT_PROGRAMS) -> None:
    busybox = shutil.which("busybox") or "/bin/busybox"
    _copy(busybox, root, "/bin/busybox")
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True)
    for applet in applets.stdout.split():
        for d in ("bin", "usr/bin"):
            os.makedirs(os.path.join(root, d), exist_ok=True)
            link = os.path.join(root, d, applet)
            if not os.path.lexists(link):
                os.symlink("/bin/busybox", link)
    for name in programs:
        path = shutil.which(name, path="/usr/bin:/bin")
        if path is None:
            raise SystemExit(f"build-image: {name} not found on this host")
        real = os.path.realpath(path)
        for d in ("usr/bin", "bin"):
            link = os.path.join(root, d, name)
            if os.path.lexists(link):
                os.unlink(link)
        _copy(real, root, f"/usr/bin/{name}")
        libs = _ldd(real)
        if os.path.basename(real).startswith("python"):
            version = os.path.basename(real)
            stdlib = f"/usr/lib/{version}"
            shutil.copytree(
                stdlib,
                os.path.join(root, stdlib.lstrip("/")),
                symlinks=True,
                ignore=shutil.ignore_patterns("test", "__pycache__", "idlelib", "tkinter"),
                dirs_exist_ok=True,
            )
            dynload = os.path.join(stdlib, "lib-dynload")
            for so in os.listdir(dynload):
                libs += _ldd(os.path.join(dynload, so))
        for lib in libs:
            _copy(lib, root)
        if name == "git":
            _git_helpers(root)
        if name == "python3":
            _python_packages(root)
    etc = os.path.join(root, "etc")
    os.makedirs(etc, exist_ok=True)
    with open(os.path.join(etc, "passwd"), "w", encoding="utf-8") as fh:
        fh.write("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
    with open(os.path.join(etc, "group"), "w", encoding="utf-8") as fh:
        fh.write("root:x:0:\nnogroup:x:65534:\n")
    for d in ("tmp", "var/tmp", "run", "root", "home", "proc", "sys", "dev"):
        os.makedirs(os.path.join(root, d), exist_ok=True)


def _git_helpers(root: str) -> None:
    core = "/usr/lib/git-core"
    for helper in GIT_HELPERS:
        path = os.path.join(core, helper)
        if not os.path.exists(path):
            continue
        _copy(path, root)
        for lib in _ldd(os.path.realpath(path)):
            _copy(lib, root)
    if os.path.exists(os.path.join(root, core.lstrip("/"), "git-remote-http")):
        link = os.path.join(root, core.lstrip("/"), "git-remote-https")
        if not os.path.lexists(link):
            os.symlink("git-remote-http", link)


def _python_packages(root: str) -> None:
    for package in PYTHON_PACKAGES:
        source = os.path.join(DIST_PACKAGES, package)
        if os.path.isfile(source):
            _copy(source, root)
        elif os.path.isdir(source):
            shutil.copytree(
                source,
                os.path.join(root, source.lstrip("/")),
                symlinks=True,
                ignore=shutil.ignore_patterns("__pycache__"),
                dirs_exist_ok=True,
            )


def build(tag: str = DEFAULT_TAG, engine: str = "podman") -> None:
    with tempfile.TemporaryDirectory(prefix="corral-image-") as tmp:
        root = os.path.join(tmp, "root")
        os.makedirs(root)
        populate(root)
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            [
                engine,
                "import",
                "--change",
                "CMD=/bin/sh",
                "--change",
                f"LABEL corral.test-image={IMAGE_VERSION}",
                "--change",
                f"LABEL corral.test-image.features={IMAGE_FEATURES}",
                "-",
                tag,
            ],
            stdin=tar.stdout,
            stdout=subprocess.DEVNULL,
            check=False,
        )
        tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise SystemExit(f"build-image: {engine} import failed")
    print(tag)


def main(argv: list[str]) -> None:
    tag, engine = DEFAULT_TAG, "podman"
    args = list(argv)
    while args:
        flag = args.pop(0)
        if flag == "--tag" and args:
            tag = args.pop(0)
        elif flag == "--engine" and args:
            engine = args.pop(0)
        else:
            raise SystemExit("usage: python -m corral.container.image [--tag REF] [--engine E]")
    build(tag, engine)


if __name__ == "__main__":
    main(sys.argv[1:])
