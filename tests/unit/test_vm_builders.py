"""The microVM's pure builders: cpio, kernel files, setup's choices, the initramfs,
the guest's view and request, QEMU's and bubblewrap's argv.  Nothing boots here;
tests/integration/test_vm.py boots the real guest."""

from __future__ import annotations

import json
import lzma
import os
import shlex
import shutil
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corral.errors import RefusedError, SetupError
from corral.fsplan import Mount
from corral.vm import cpio, guest, initramfs, kernel, probe, qemu, setup, snapshot
from corral.vm import run as vmrun

# ---- cpio ------------------------------------------------------------------------


def parse_newc(data: bytes) -> list[tuple[str, int, bytes]]:
    """(name, mode, data) of each entry, read back independently of the writer."""
    found: list[tuple[str, int, bytes]] = []
    at = 0
    while True:
        assert data[at : at + 6] == b"070701"
        fields = [int(data[at + 6 + 8 * i : at + 14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = fields[1], fields[6], fields[11]
        name_at = at + 110
        name = data[name_at : name_at + namesize - 1].decode()
        assert data[name_at + namesize - 1] == 0
        body = name_at + namesize + (-(110 + namesize) % 4)
        if name == "TRAILER!!!":
            return found
        found.append((name, mode, data[body : body + size]))
        at = body + size + (-size % 4)


def test_newc_writes_a_device_node_with_its_numbers() -> None:
    data = cpio.newc([cpio.char_device("dev/null", 1, 3)])
    fields = [int(data[6 + 8 * i : 14 + 8 * i], 16) for i in range(13)]
    assert fields[1] == stat.S_IFCHR | 0o666 and (fields[9], fields[10]) == (1, 3)
    assert fields[6] == 0  # no data


def test_the_guest_dev_holds_only_the_usual_nodes() -> None:
    # the guest's consoles and virtio ports (the control port among them) stay the init's
    data = initramfs.archive([], b"BUSYBOX", [])
    nodes = {n for n, mode, _ in parse_newc(data) if stat.S_ISCHR(mode)}
    names = {n.removeprefix(initramfs.DEV_TEMPLATE + "/") for n in nodes}
    assert names == {"null", "zero", "full", "random", "urandom", "tty"}
    assert f"cp -a /{initramfs.DEV_TEMPLATE}/. $S/dev/" in initramfs.init_script([])


def test_newc_round_trips_files_dirs_and_links() -> None:
    entries = [
        cpio.directory("a"),
        cpio.file("a/b", b"hello\n", 0o755),
        cpio.symlink("a/c", "b"),
        cpio.file("/e", b""),  # a leading slash is dropped
        cpio.file("odd", b"123"),  # odd sizes are padded to 4 bytes
    ]
    data = cpio.newc(entries)
    assert len(data) % 4 == 0
    assert parse_newc(data) == [
        ("a", stat.S_IFDIR | 0o755, b""),
        ("a/b", stat.S_IFREG | 0o755, b"hello\n"),
        ("a/c", stat.S_IFLNK | 0o777, b"b"),
        ("e", stat.S_IFREG | 0o644, b""),
        ("odd", stat.S_IFREG | 0o644, b"123"),
    ]
    assert cpio.newc(entries) == data  # no times or inode numbers from the host


@pytest.mark.skipif(not os.path.exists("/bin/busybox"), reason="busybox is not installed")
def test_newc_is_read_by_busybox_cpio(tmp_path: Path) -> None:
    data = cpio.newc(
        [cpio.directory("d"), cpio.file("d/f", b"x" * 5, 0o600), cpio.symlink("l", "d/f")]
    )
    subprocess.run(["/bin/busybox", "cpio", "-i", "-d"], input=data, cwd=tmp_path, check=True)
    assert (tmp_path / "d" / "f").read_bytes() == b"xxxxx"
    assert stat.S_IMODE((tmp_path / "d" / "f").stat().st_mode) == 0o600
    assert os.readlink(tmp_path / "l") == "d/f"


# ---- kernel files ------------------------------------------------------------------


def elf64(segments: list[tuple[int, bytes]], sections: dict[str, bytes] | None = None) -> bytes:
    """A little-endian ELF64 with ``segments`` (type, data) as program headers and
    ``sections`` (name -> data) with a section name table."""
    phnum = len(segments)
    data_at = 64 + 56 * phnum
    body = bytearray()
    phdrs = bytearray()
    for kind, seg in segments:
        offset = data_at + len(body)
        phdrs += struct.pack("<IIQQQQQQ", kind, 0, offset, 0, 0, len(seg), len(seg) + 0x100, 8)
        body += seg
    shoff = shnum = shstrndx = 0
    tail = bytearray()
    if sections:
        names = b"\0" + b"".join(n.encode() + b"\0" for n in [*sections, ".shstrtab"])
        base = data_at + len(body)
        blobs = [*sections.values(), names]
        offsets = []
        for blob in blobs:
            offsets.append(base + len(tail))
            tail += blob
        shoff = base + len(tail)
        shdrs = bytearray(64)  # the null section
        name_at = 1
        for blob, off, name in zip(blobs, offsets, [*sections, ".shstrtab"], strict=True):
            shdrs += struct.pack("<IIQQQQIIQQ", name_at, 1, 0, 0, off, len(blob), 0, 0, 1, 0)
            name_at += len(name) + 1
        tail += shdrs
        shnum = len(blobs) + 1
        shstrndx = shnum - 1
    header = bytearray(64)
    header[:8] = b"\x7fELF\x02\x01\x01\x00"
    struct.pack_into(
        "<HHIQQQIHHHHHH", header, 16, 2, 62, 1, 0, 64, shoff, 0, 64, 56, phnum, 64, shnum, shstrndx
    )
    return bytes(header + phdrs + body + tail)


def pvh_note() -> bytes:
    return struct.pack("<III", 4, 4, kernel.XEN_ELFNOTE_PHYS32_ENTRY) + b"Xen\0" + b"\0\0\0\1"


def bzimage(payload: bytes, version: int = 0x20F, setup_sects: int = 3) -> bytes:
    setup = bytearray((setup_sects + 1) * 512)
    setup[0x1F1] = setup_sects
    setup[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", setup, 0x206, version)
    struct.pack_into("<II", setup, 0x248, 16, len(payload))  # payload 16 bytes into protected mode
    return bytes(setup) + b"\0" * 16 + payload + b"trailer"


def test_vmlinux_comes_out_of_an_xz_bzimage() -> None:
    elf = elf64([(kernel.PT_LOAD, b"code" + b"\0" * 64), (kernel.PT_NOTE, pvh_note())])
    out = kernel.vmlinux_from_bzimage(bzimage(lzma.compress(elf, format=lzma.FORMAT_XZ)))
    assert out == elf
    assert kernel.has_pvh_note(out)


def test_bzimage_errors_say_what_is_wrong() -> None:
    with pytest.raises(kernel.KernelError, match="not a bzImage"):
        kernel.vmlinux_from_bzimage(b"\0" * 4096)
    with pytest.raises(kernel.KernelError, match=r"boot protocol 2\.6"):
        kernel.vmlinux_from_bzimage(bzimage(b"", version=0x206))
    with pytest.raises(kernel.KernelError, match="zstd"):
        kernel.vmlinux_from_bzimage(bzimage(b"\x28\xb5\x2f\xfd" + b"\0" * 32))


def test_a_kernel_without_a_pvh_note_is_told_apart() -> None:
    assert not kernel.has_pvh_note(elf64([(kernel.PT_LOAD, b"x"), (kernel.PT_NOTE, b"\0" * 12)]))


def test_trim_elf_leaves_trailing_zeros_to_the_loader() -> None:
    elf = elf64(
        [(kernel.PT_LOAD, b"text"), (kernel.PT_LOAD, b"data" + b"\0" * 4000)],
        {".extra": b"section data"},
    )
    out = kernel.trim_elf(elf)
    parsed = kernel._Elf(out)
    segments = parsed.segments()
    assert [s[3] for s in segments] == [4, 4]  # file sizes: trailing zeros dropped
    offset = segments[1][2]
    assert out[offset : offset + 4] == b"data"
    assert len(out) == offset + 4  # cut after the last byte still used
    assert parsed.shoff == 0 and parsed.shnum == 0  # no section headers
    mem = struct.unpack_from("<Q", out, 64 + 56 + 40)[0]
    assert mem == 4004 + 0x100  # what the loader zero-fills is unchanged


def test_modinfo_gives_a_modules_dependencies() -> None:
    info = b"license=GPL\0depends=virtio,virtio_ring\0name=virtio_mmio\0"
    ko = elf64([], {".text": b"\x90", ".modinfo": info})
    assert kernel.modinfo(ko)["name"] == "virtio_mmio"
    assert kernel.depends(ko) == ["virtio", "virtio_ring"]
    assert kernel.depends(elf64([], {".modinfo": b"depends=\0"})) == []
    with pytest.raises(kernel.KernelError, match=r"no \.modinfo"):
        kernel.modinfo(elf64([], {".text": b""}))


def test_load_order_puts_dependencies_first_and_skips_built_in() -> None:
    deps = {
        "9p": ["9pnet", "fscache", "netfs"],
        "9pnet": [],
        "fscache": ["netfs"],
        "netfs": [],
        "9pnet_virtio": ["virtio", "9pnet", "virtio_ring"],
        "virtio": ["virtio_ring"],
        "virtio_ring": [],
    }
    order = kernel.load_order(["9pnet_virtio", "9p"], deps)
    for name, needs in deps.items():
        for dep in needs:
            assert order.index(dep) < order.index(name)
    assert kernel.load_order(["a"], {"a": ["builtin"]}) == ["a"]
    with pytest.raises(kernel.KernelError, match="cycle"):
        kernel.load_order(["a"], {"a": ["b"], "b": ["a"]})


def test_module_names_are_spelled_as_the_kernel_does() -> None:
    assert kernel.module_name("kernel/fs/9p/9p.ko") == "9p"
    assert kernel.module_name("kernel/drivers/x/virtio-mmio.ko.xz") == "virtio_mmio"


# ---- setup -----------------------------------------------------------------------


def test_the_versioned_package_is_read_from_apt_cache() -> None:
    text = "linux-image-amd64\n  Depends: linux-image-6.1.0-57-amd64\n  Depends: other\n"
    assert setup.versioned_package(text) == "linux-image-6.1.0-57-amd64"
    assert setup.versioned_package("linux-image-amd64\n") is None


class FakeSource(setup.Source):
    release = "6.1.0-test"
    origin = "fake"

    def __init__(self, modules: dict[str, list[str]], builtin: set[str]) -> None:
        self.files = {
            name: elf64([], {".modinfo": f"depends={','.join(d)}\0name={name}\0".encode()})
            for name, d in modules.items()
        }
        self.builtin = builtin
        self.asked: list[set[str]] = []

    def modules(self, names: set[str]) -> tuple[dict[str, bytes], set[str]]:
        self.asked.append(set(names))
        return {n: d for n, d in self.files.items() if n in names}, self.builtin


def test_setup_gathers_what_the_wanted_modules_need() -> None:
    source = FakeSource(
        {
            "virtio_mmio": ["virtio", "virtio_ring"],
            "virtio_console": ["virtio", "virtio_ring"],
            "virtio": ["virtio_ring"],
            "virtio_ring": [],
            "9pnet_virtio": ["virtio", "9pnet", "virtio_ring"],
            "9pnet": [],
            "9p": ["9pnet", "netfs"],
        },
        builtin={"netfs"},
    )
    order, files = setup._gather_modules(source)
    assert set(order) == {
        "virtio_mmio",
        "virtio_console",
        "virtio",
        "virtio_ring",
        "9pnet_virtio",
        "9pnet",
        "9p",
    }
    assert order.index("virtio_ring") < order.index("virtio") < order.index("virtio_mmio")
    assert list(files) == order
    assert len(source.asked) == 2  # the wanted ones, then what they need


def test_setup_names_what_the_kernel_lacks() -> None:
    source = FakeSource({"virtio_mmio": [], "virtio_console": [], "9pnet_virtio": []}, set())
    with pytest.raises(SetupError, match=r"neither built in nor as modules: 9p$"):
        setup._gather_modules(source)


def test_require_refuses_with_the_command_that_sets_up(tmp_path: Path) -> None:
    with pytest.raises(RefusedError) as caught:
        setup.require(str(tmp_path / "user"), str(tmp_path / "system"))
    assert caught.value.message.endswith(f"run: {setup.setup_command()}")


def test_setup_command_names_the_python_running_corral(monkeypatch: pytest.MonkeyPatch) -> None:
    # From a virtual environment the message must name that environment's python.
    monkeypatch.setattr(sys, "executable", "/home/me/proj/.venv/bin/python")
    monkeypatch.setattr(sys, "prefix", "/home/me/proj/.venv")
    assert setup.setup_command() == "/home/me/proj/.venv/bin/python -m corral.vm.setup"
    # The system's own python3, found first on PATH, is named plainly.
    monkeypatch.setattr(sys, "prefix", sys.base_prefix)
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/python3")
    monkeypatch.setattr(sys, "executable", "/usr/bin/python3")
    assert setup.setup_command() == "python3 -m corral.vm.setup"


def test_require_finds_a_system_kernel_and_ignores_half_written_ones(tmp_path: Path) -> None:
    system = tmp_path / "system"
    good = system / "kernel-6.1.0-1-amd64"
    (good / "modules").mkdir(parents=True)
    (good / "vmlinux").write_bytes(b"elf")
    (good / "manifest").write_text(setup._manifest_text("6.1.0-1-amd64", "test", ["virtio"]))
    (system / "kernel-6.1.0-9-amd64.tmp42").mkdir()  # a setup killed midway
    stale = system / "kernel-6.1.0-5-amd64"  # made by another corral: other modules wanted
    stale.mkdir()
    (stale / "vmlinux").write_bytes(b"elf")
    (stale / "manifest").write_text("version 1\nrelease x\nwanted other\nmodules \n")
    found = setup.require(str(tmp_path / "user"), str(system))
    assert found.release == "6.1.0-1-amd64" and found.modules == ["virtio"]
    assert found.module_path("virtio") == str(good / "modules" / "virtio.ko")


# ---- initramfs -------------------------------------------------------------------


def test_the_initramfs_holds_the_init_modules_busybox_and_helpers() -> None:
    data = initramfs.archive([("virtio", b"ko1"), ("9p", b"ko2")], b"BUSYBOX", [("mux.py", b"# m")])
    files = {name: (mode, body) for name, mode, body in parse_newc(data)}
    assert files["bin/busybox"] == (stat.S_IFREG | 0o755, b"BUSYBOX")
    assert files["lib/modules/virtio.ko"][1] == b"ko1"
    assert files["corral/mux.py"][1] == b"# m"
    assert files["bin/reseed"] == (stat.S_IFREG | 0o755, initramfs.reseed_program())
    mode, init = files["init"]
    assert mode == stat.S_IFREG | 0o755
    text = init.decode()
    assert "loadmods /lib/modules/virtio.ko /lib/modules/9p.ko ||" in text
    assert "set -- virtio 9p\n" in text and "@" not in text.replace("$@", "").replace('"$@"', "")
    assert f"msize={initramfs.MSIZE}" in text


def test_module_signatures_are_kept_for_the_locked_down_guest() -> None:
    # the guest kernel runs with lockdown=confidentiality, which loads only signed
    # modules: the archive holds each module byte for byte as the host has it
    body = b"\x7fELF module body" + b"S" * 300 + b"~Module signature appended~\n"
    data = initramfs.archive([("virtio", body)], b"BUSYBOX", [])
    files = {name: content for name, _, content in parse_newc(data)}
    assert files["lib/modules/virtio.ko"] == body
    assert "lockdown=confidentiality" in qemu.kernel_cmdline(0).split()


def test_the_init_script_parses_in_busybox_sh() -> None:
    script = initramfs.init_script(["virtio"])
    out = subprocess.run(["/bin/busybox", "sh", "-n"], input=script.encode(), capture_output=True)
    assert out.returncode == 0, out.stderr


def _fstab_field(text: str) -> str:
    """A field of an fstab line as getmntent(3) reads it."""
    for escape, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(escape, char)
    return text


@pytest.mark.skipif(not os.path.exists("/bin/busybox"), reason="busybox is not installed")
def test_the_inits_queue_writes_fstab_lines_mount_reads_back(tmp_path: Path) -> None:
    """Mount points go into the init's fstab escaped (a space or a line break would
    split the line): each reads back as the path it was."""
    script = initramfs.init_script([])
    queue = script[script.index("queue() {") : script.index("mounts() {")]
    awkward = ["/mnt/ws", "/mnt/a b", "/mnt/tab\there", "/mnt/new\nline", "/mnt/back\\slash",
               "/mnt/it's", "/mnt/$HOME*"]  # fmt: skip
    fstab = tmp_path / "fstab"
    calls = "".join(f'queue tmpfs "${{{i + 1}}}" tmpfs size=1\n' for i in range(len(awkward)))
    subprocess.run(
        ["/bin/busybox", "sh", "-c", f"FSTAB={fstab}\n{queue}{calls}", "sh", *awkward],
        check=True,
    )
    lines = fstab.read_text().splitlines()
    assert len(lines) == len(awkward)
    for line, path in zip(lines, awkward, strict=True):
        fields = line.split()
        assert (
            len(fields) == 6
            and fields[0] == "tmpfs"
            and fields[2:] == ["tmpfs", "size=1", "0", "0"]
        )
        assert _fstab_field(fields[1]) == path


def test_the_init_reads_the_request_the_host_sends_as_it_was(tmp_path: Path) -> None:
    """The init reads the request by lines with the shell's own read (no process):
    quoted values with line breaks, backslashes, blanks and bytes that are not
    UTF-8 come out as the host wrote them, and nothing past the request is read."""
    script = initramfs.init_script([])
    reader = script[script.index("read -r lines <&3") : script.index("echo up >&3")]
    launch = guest.Launch(
        ["printf", "%s", "two\nlines", "back\\slash", "  blanks\t"],
        {"A": "line\nbreak\\", "B": " lead", "C": "caf\udce9"},
        "/ws",
        1000,
        1000,
        None,
        False,
    )
    request = guest.request(guest.exports(["/ws"]), [], launch, (b"\x01" * 32, 1.0))
    assert b"line\nbreak" in request and b"caf\xe9" in request
    out = tmp_path / "request"
    sent = b"%d\n" % request.count(b"\n") + request + b"after\n"
    # the control port is the init's fd 3: here, stdin
    reader = "exec 3<&0\n" + reader.replace("/request", str(out)) + "cat <&3"
    proc = subprocess.run(
        ["/bin/busybox", "sh", "-c", reader], input=sent, stdout=subprocess.PIPE, check=True
    )
    assert out.read_bytes() == request and proc.stdout == b"after\n"


def test_the_initramfs_is_cached_by_its_inputs(tmp_path: Path) -> None:
    kdir = tmp_path / "kernel"
    (kdir / "modules").mkdir(parents=True)
    (kdir / "modules" / "virtio.ko").write_bytes(b"ko")
    assets = setup.Assets(str(kdir), "6.1.0-t", ["virtio"])
    box = tmp_path / "busybox"
    box.write_bytes(b"\x7fELF static one")
    first = initramfs.cached(assets, str(box), str(tmp_path / "cache"))
    assert initramfs.cached(assets, str(box), str(tmp_path / "cache")) == first
    # within a process the files' digests are kept by their identity (path, size,
    # mtime, inode): a file rewritten in the same clock tick differs in its size
    box.write_bytes(b"\x7fELF static, two")
    second = initramfs.cached(assets, str(box), str(tmp_path / "cache"))
    assert second != first and os.path.exists(first) and os.path.exists(second)
    assert not [n for n in os.listdir(tmp_path / "cache") if ".tmp" in n]


def test_only_the_most_recently_used_initramfs_images_are_kept(tmp_path: Path) -> None:
    """An upgrade builds new images; the old ones must not pile up in the cache."""
    kdir = tmp_path / "kernel"
    (kdir / "modules").mkdir(parents=True)
    (kdir / "modules" / "virtio.ko").write_bytes(b"ko")
    assets = setup.Assets(str(kdir), "6.1.0-t", ["virtio"])
    box = tmp_path / "busybox"
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "state-k").write_bytes(b"a state is not an image")
    paths = []
    for n in range(initramfs.KEEP):
        box.write_bytes(b"\x7fELF static %d" % n)
        paths.append(initramfs.cached(assets, str(box), str(cache)))
        os.utime(paths[-1], (1000 + n, 1000 + n))
    box.write_bytes(b"\x7fELF static 0")
    before = snapshot.identity(paths[0])
    assert initramfs.cached(assets, str(box), str(cache)) == paths[0]  # used: the newest
    assert snapshot.identity(paths[0]) == before  # a state's key holds it: unchanged
    box.write_bytes(b"\x7fELF static new")
    newest = initramfs.cached(assets, str(box), str(cache))
    images = sorted(n for n in os.listdir(cache) if n.startswith("initramfs-"))
    kept = sorted(os.path.basename(p) for p in (paths[0], *paths[2:], newest))
    assert images == kept  # the least recently used one, paths[1], went
    assert (cache / "state-k").exists()


def test_find_busybox_takes_only_a_static_one(tmp_path: Path) -> None:
    dynamic = tmp_path / "dynamic"
    dynamic.write_bytes(elf64([(3, b"/lib64/ld-linux-x86-64.so.2\0")]))
    static = tmp_path / "static"
    static.write_bytes(elf64([(kernel.PT_LOAD, b"code")]))
    assert initramfs.find_busybox((str(tmp_path / "none"), str(dynamic), str(static))) == str(
        static
    )
    assert initramfs.find_busybox((str(dynamic),)) is None


# ---- the guest's view and request ------------------------------------------------


def test_the_view_is_the_plan_rerooted_without_the_hosts_kernel_files() -> None:
    mounts = [
        Mount("ro-bind", "/", "/"),
        Mount("dev", "/dev"),
        Mount("proc", "/proc"),
        Mount("tmpfs", "/tmp"),
        Mount("ro-bind", "/proc/sys", "/proc/sys"),
        Mount("tmpfs", "/sys/class/net"),
        Mount("tmpfs", "/home/u"),
        Mount("symlink", "/home/u/link", "../target"),
        Mount("bind", "/home/u/ws", "/home/u/ws"),
        Mount("mask-file", "/home/u/ws/.env"),
        Mount("mask-dir", "/home/u/.ssh"),
        Mount("remount-ro", "/home/u"),
    ]
    view = guest.view_mounts(mounts)
    assert [(m.kind, m.dest, m.src) for m in view] == [
        ("ro-bind", "/guest", "/"),
        ("tmpfs", "/guest/proc", None),
        ("tmpfs", "/guest/dev", None),
        ("tmpfs", "/guest/sys", None),
        ("tmpfs", "/guest/tmp", None),
        ("tmpfs", "/guest/home/u", None),
        ("symlink", "/guest/home/u/link", "../target"),  # a link's text is not a host path
        ("bind", "/guest/home/u/ws", "/home/u/ws"),
        ("mask-file", "/guest/home/u/ws/.env", None),
        ("mask-dir", "/guest/home/u/.ssh", None),
        ("remount-ro", "/guest/home/u", None),
    ]


def test_exports_are_the_root_read_only_and_each_writable_path() -> None:
    shares = guest.exports(["/home/u/ws", "/srv/data"])
    assert [(s.tag, s.path, s.writable, s.source) for s in shares] == [
        ("root", "/", False, "/guest"),
        ("w0", "/home/u/ws", True, "/guest/home/u/ws"),
        ("w1", "/srv/data", True, "/guest/srv/data"),
    ]


def test_guest_mounts_put_parents_first() -> None:
    shares = guest.exports(["/tmp/ws"])
    sizes = {"/tmp": 1 << 30, "/var/tmp": 1 << 30, "/run": 64 << 20, "/dev/shm": None}
    found = guest.guest_mounts(shares, sizes, ["/tmp", "/var/tmp", "/run", "/dev/shm"])
    assert found == [
        ("tmpfs", "/run", str(64 << 20)),
        ("tmpfs", "/tmp", str(1 << 30)),
        ("tmpfs", "/dev/shm", "50%"),
        ("9p", "/tmp/ws", "w0"),  # a workspace under /tmp, after /tmp's own tmpfs
        ("tmpfs", "/var/tmp", str(1 << 30)),
    ]


@pytest.mark.skipif(not os.path.exists("/bin/busybox"), reason="busybox is not installed")
def test_the_request_quotes_every_word_for_the_guests_shell() -> None:
    """The request runs in busybox sh: stand-in functions print what they got."""
    awkward = ["it's", 'a "b"', "$HOME `x` $(y)", "new\nline", "tab\there", "ünï", "*", ""]
    launch = guest.Launch(
        ["printf", *awkward],
        {"A": "va'l", "B": "x\ny", "PATH": "/usr/bin:/bin"},
        "/work space/it's",
        1000,
        1001,
        64,
        False,
    )
    shares = guest.exports(["/work space/it's"])
    request = guest.request(shares, [("9p", "/work space/it's", "w0")], launch).decode()
    stubs = (
        'mount_root() { printf "root[%s]\\n" "$@"; }\n'
        'mount_rw() { printf "rw[%s]\\n" "$@"; }\n'
        "mounts() { :; }\n"
        'run() { printf "run[%s]\\n" "$@"; }\n'
    )
    out = subprocess.run(
        ["/bin/busybox", "sh", "-c", stubs + request], capture_output=True, check=True
    ).stdout.decode()
    words = [w for w in out.split("]\n") if w]
    assert words[:2] == ["root[root", "root[loose"]
    assert words[2:5] == ["rw[w0", "rw[/work space/it's", "rw[mmap"]
    run = [w.removeprefix("run[") for w in words[5:]]
    assert run[:7] == ["1000", "1001", "64", "0", "0", "/work space/it's", "A=va'l"]
    assert run[7:10] == ["B=x\ny", "PATH=/usr/bin:/bin", "--"]
    assert run[10:] == ["printf", *awkward]


def test_the_request_makes_queued_mounts_before_a_mount_point_under_them() -> None:
    """The init batches mounts (one `mount -a` each): a mount point that may lie
    under a queued mount is looked for only once that batch is made."""
    launch = guest.Launch(["true"], {}, "/tmp/ws", 0, 0, None, False)
    mounts = [
        ("tmpfs", "/run", "64"),
        ("tmpfs", "/tmp", "1024"),
        ("tmpfs", "/dev/shm", "50%"),
        ("9p", "/tmp/ws", "w0"),
        ("tmpfs", "/var/tmp", "1024"),
        ("9p", "/tmp/ws/sub", "w1"),
    ]
    lines = guest.request(guest.exports(["/tmp/ws"]), mounts, launch).decode().splitlines()
    assert lines[:9] == [
        "mount_root root loose",
        "mount_tmpfs /run 64",
        "mount_tmpfs /tmp 1024",
        "mount_tmpfs /dev/shm 50%",
        "mounts",  # /tmp's tmpfs before /tmp/ws is looked for
        "mount_rw w0 /tmp/ws mmap",
        "mount_tmpfs /var/tmp 1024",
        "mounts",
        "mount_rw w1 /tmp/ws/sub mmap",
    ]
    assert lines[9].startswith("run ")  # run makes the last batch


def test_environment_values_are_never_in_qemus_argv() -> None:
    launch = guest.Launch(["true"], {"TOKEN": "secret-7f3a"}, "/ws", 0, 0, None, False)
    request = guest.request(guest.exports(["/ws"]), [], launch)
    assert b"secret-7f3a" in request  # it travels over the control port...
    machine = qemu.Machine(accel="tcg", cpus=1, memory_mib=256, cmdline="quiet")
    assert "secret-7f3a" not in " ".join(qemu.qemu_argv(machine))  # ...never an argv


# ---- QEMU and its sandbox --------------------------------------------------------


def test_qemu_argv_is_a_microvm_with_ports_and_exports_and_no_network() -> None:
    shares = guest.exports(["/ws"])
    machine = qemu.Machine(
        accel="tcg",
        cpus=2,
        memory_mib=512,
        cmdline="quiet corral.mode=run",
        ports=[("corral.ctl", 5), ("corral.stdout", 7)],
        exports=shares,
        name="corral-vm-test",
    )
    argv = qemu.qemu_argv(machine)
    joined = " ".join(argv)
    assert argv[argv.index("-M") + 1].startswith("microvm,x-option-roms=off")
    assert argv[argv.index("-accel") + 1] == f"tcg,tb-size={qemu.TCG_CODE_MIB}"
    assert argv[argv.index("-cpu") + 1] == "max"
    assert argv[argv.index("-smp") + 1] == "2" and argv[argv.index("-m") + 1] == "512M"
    assert argv[argv.index("-append") + 1] == "quiet corral.mode=run"
    assert "-chardev socket,id=p1,fd=5" in joined and "name=corral.ctl,nr=1" in joined
    assert "-chardev socket,id=p2,fd=7" in joined and "name=corral.stdout,nr=2" in joined
    assert "path=/guest,security_model=none,multidevs=remap,readonly=on" in joined
    assert "path=/guest/ws,security_model=none,multidevs=remap -device" in joined
    assert "mount_tag=root" in joined and "mount_tag=w0" in joined
    for absent in ("-netdev", "-nic", "-net ", "user,", "-monitor stdio", "-nographic"):
        assert absent not in joined
    assert "-nodefaults" in argv and argv[argv.index("-serial") + 1] == "none"
    assert argv[argv.index("-sandbox") + 1].startswith("on,")


def test_kvm_uses_the_hosts_cpu_and_the_console_is_optional() -> None:
    machine = qemu.Machine(accel="kvm", cpus=1, memory_mib=256, cmdline="", console=True)
    argv = qemu.qemu_argv(machine)
    assert argv[argv.index("-cpu") + 1] == "host"
    assert (
        argv[argv.index("-serial") + 1] == "stdio" and "isa-serial=on" in argv[argv.index("-M") + 1]
    )


def test_the_kernel_command_line_carries_the_hosts_tsc() -> None:
    line = qemu.kernel_cmdline(2599998)
    assert "tsc_early_khz=2599998" in line.split() and "no_timer_check" in line.split()
    assert line.split()[-1] == "corral.mode=run"
    assert "tsc_early_khz" not in qemu.kernel_cmdline(0)
    assert qemu.kernel_cmdline(0, mode="probe", console=True).split()[0] == "console=ttyS0"


def test_only_an_emulated_guest_gives_up_address_randomisation() -> None:
    # TCG translates code per virtual address: randomised mappings are translated
    # afresh at every exec (an exec of true 3x slower); under KVM nothing is lost
    assert "norandmaps" in qemu.kernel_cmdline(0, accel="tcg").split()
    assert "norandmaps" not in qemu.kernel_cmdline(0, accel="kvm").split()


def test_tsc_frequency_from_cpuinfo() -> None:
    text = "flags\t\t: fpu tsc constant_tsc nonstop_tsc\ncpu MHz\t\t: 2599.998\ncpu MHz\t\t: 1.0\n"
    assert qemu.tsc_khz_from_cpuinfo(text) == 2599998
    assert qemu.tsc_khz_from_cpuinfo(text.replace(" constant_tsc", "")) == 0  # no one frequency
    assert qemu.tsc_khz_from_cpuinfo("flags: constant_tsc\n") == 0


def test_size_maps_limits_to_vcpus_and_guest_ram() -> None:
    mib = 1 << 20
    assert qemu.size(512 * mib, "set", None, 8) == (1, 512)
    assert qemu.size(12 * 1024 * mib, "default", 1.5, 8) == (2, qemu.GUEST_MEMORY_DEFAULT)
    assert qemu.size(12 * 1024 * mib, "set", 64, 8) == (8, 12 * 1024)
    assert qemu.size(None, "none", 0.25, 8) == (1, qemu.GUEST_MEMORY_DEFAULT)
    with pytest.raises(RefusedError, match="below the guest's 128 MiB"):
        qemu.size(64 * mib, "set", None, 8)


def test_qemus_own_root_holds_only_what_it_needs() -> None:
    facts = qemu.HostFacts(0, {"/bin": "usr/bin", "/lib": "usr/lib"})
    own = qemu.own_root(facts, "/cache/vmlinux", "/cache/initrd.cpio", kvm=False)
    assert own[:3] == ["--ro-bind", "/usr", "/usr"]
    assert "--symlink usr/bin /bin" in " ".join(own)
    assert "/dev/kvm" not in own and "/home" not in " ".join(own)
    assert own[-6:] == [
        "--ro-bind",
        "/cache/vmlinux",
        qemu.KERNEL,
        "--ro-bind",
        "/cache/initrd.cpio",
        qemu.INITRD,
    ]
    assert "--dev-bind /dev/kvm /dev/kvm" in " ".join(qemu.own_root(facts, "k", "i", kvm=True))


def test_qemus_sandbox_has_every_namespace_and_no_capabilities() -> None:
    argv = qemu.sandbox_argv("/usr/bin/bwrap", ["--own"], ["--view"], 3, 4, ["qemu", "-x"])
    for flag in (
        "--unshare-user",
        "--unshare-pid",
        "--unshare-net",
        "--die-with-parent",
        "--disable-userns",
    ):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert (
        argv[argv.index("--json-status-fd") + 1] == "3" and argv[argv.index("--seccomp") + 1] == "4"
    )
    assert argv[-4:] == ["--view", "--", "qemu", "-x"]


def test_every_tmpfs_in_qemus_view_is_bounded() -> None:
    args = ["--tmpfs", "/a", "--perms", "0000", "--tmpfs", "/b", "--size", "9", "--tmpfs", "/c"]
    assert vmrun.bound_tmpfs(args, 64) == [
        "--size", "64", "--tmpfs", "/a",
        "--perms", "0000", "--size", "64", "--tmpfs", "/b",
        "--size", "9", "--tmpfs", "/c",
    ]  # fmt: skip


def test_qemu_is_found_only_on_absolute_path_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted = tmp_path / "qemu-system-x86_64"
    planted.write_text("#!/bin/sh\n")
    planted.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", f".:{tmp_path}")
    assert vmrun.find_program("qemu-system-x86_64") == str(planted)
    monkeypatch.setenv("PATH", ".")
    found = vmrun.find_program("qemu-system-x86_64")
    assert found is None or found.startswith("/usr/")


# ---- the accelerator probe's decision --------------------------------------------


def probe_setup(tmp_path: Path) -> tuple[str, setup.Assets]:
    fake_qemu = tmp_path / "qemu-system-x86_64"
    fake_qemu.write_text("qemu")
    return str(fake_qemu), setup.Assets(str(tmp_path), "6.1.0-t", [])


def test_without_dev_kvm_it_is_tcg_and_nothing_boots(tmp_path: Path) -> None:
    qemu_path, assets = probe_setup(tmp_path)

    def never(*_: object) -> str:
        raise AssertionError("no probe without /dev/kvm")

    found = probe.decide(
        qemu_path, assets, "i", str(tmp_path / "c"), device=str(tmp_path / "kvm"), booter=never
    )
    assert found.accel == "tcg" and found.reason == f"TCG: no {tmp_path / 'kvm'}"


def test_the_probe_runs_once_and_its_answer_is_kept(tmp_path: Path) -> None:
    qemu_path, assets = probe_setup(tmp_path)
    device = tmp_path / "kvm"
    device.write_text("")
    calls: list[str] = []

    def hangs(*_: object) -> str:
        calls.append("probe")
        return "the guest kernel did not boot with KVM within 8 s"

    cache = str(tmp_path / "cache")
    first = probe.decide(qemu_path, assets, "i", cache, device=str(device), booter=hangs)
    again = probe.decide(qemu_path, assets, "i", cache, device=str(device), booter=hangs)
    assert calls == ["probe"]
    assert first.accel == again.accel == "tcg" and again.cached
    assert first.reason.startswith("TCG: /dev/kvm exists but the guest kernel did not boot")
    # another guest kernel is another question
    other = setup.Assets(str(tmp_path), "6.1.0-other", [])
    assert (
        probe.decide(qemu_path, other, "i", cache, device=str(device), booter=lambda *_: "").accel
        == "kvm"
    )
    assert (
        probe.decide(qemu_path, other, "i", cache, device=str(device), probe=False).accel == "kvm"
    )


def test_health_without_probing_does_not_boot(tmp_path: Path) -> None:
    qemu_path, assets = probe_setup(tmp_path)
    device = tmp_path / "kvm"
    device.write_text("")
    found = probe.decide(
        qemu_path, assets, "i", str(tmp_path / "c"), probe=False, device=str(device)
    )
    assert found.accel == "tcg" and "not probed yet" in found.reason


# ---- a Sandbox's machine: the agent's Python in the initramfs ---------------------


def test_a_waiting_agents_request_carries_its_run_as_one_word() -> None:
    """No argv is run and every value survives: the agent decodes one hex word."""
    env = {"A": "va'l", "B": "x\ny $(z)", "PATH": "/usr/bin:/bin"}
    launch = guest.Launch(["python3", "agent.py"], env, "/work space", 1000, 1001, 64, False)
    launch.duplex = launch.waiting = True
    request = guest.request(guest.exports(["/work space"]), [], launch).decode()
    run = shlex.split(request.splitlines()[-1])
    assert run[:7] == ["run", "1000", "1001", "64", "0", "2", "/work space"]
    assert len(run) == 8 and "agent.py" not in request
    got = json.loads(bytes.fromhex(run[7]))
    want = {"cwd": "/work space", "uid": 1000, "gid": 1001, "env": env, "path_memory": 60.0}
    assert got == want


LDD = """\
/usr/bin/python3.11:
\tlinux-vdso.so.1 (0x00007ffd)
\tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x00007f01)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f02)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f03)
/usr/lib/python3.11/lib-dynload/_ctypes.cpython-311-x86_64-linux-gnu.so:
\tlibffi.so.8 => /opt/ffi/lib/libffi.so.8 (0x00007f04)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f02)
"""


def test_the_agents_python_is_its_interpreter_modules_and_libraries() -> None:
    from corral.vm import guestpython

    ctypes_so = "/usr/lib/python3.11/lib-dynload/_ctypes.cpython-311-x86_64-linux-gnu.so"
    probed: dict[str, list[str] | str] = {
        "python": "/usr/bin/python3.11",
        "modules": ["/usr/lib/python3.11/os.py", "/usr/lib/python3.11/json/__init__.py"],
        "maps": ["/usr/bin/python3.11", ctypes_so, "/usr/lib/locale/C.utf8/LC_CTYPE"],
    }
    assert guestpython.elf_files(probed) == ["/usr/bin/python3.11", ctypes_so]
    closure = guestpython.entries(probed, LDD)
    assert isinstance(closure, guestpython.Closure)
    paths = [g for g, _ in closure.files]
    assert "/lib64/ld-linux-x86-64.so.2" in paths and "/opt/ffi/lib/libffi.so.8" in paths
    assert ctypes_so in paths and "/usr/lib/python3.11/json/__init__.py" in paths
    assert "/usr/lib/locale/C.utf8/LC_CTYPE" not in paths  # only what it must load
    assert closure.libdirs == ["/lib/x86_64-linux-gnu", "/opt/ffi/lib"]  # no ld.so.cache
    missing = guestpython.entries(probed, LDD.replace("/opt/ffi/lib/libffi.so.8", "not found"))
    assert missing == "the loader does not find libffi.so.8"


def test_the_agents_python_is_laid_out_at_its_host_paths() -> None:
    files = [
        initramfs.PythonFile("/usr/lib/python3.11/os.py", b"# os", 0o100644, 1_700_000_000),
        initramfs.PythonFile("/usr/bin/python3.11", b"\x7fELF", 0o100755, 1_600_000_000),
        initramfs.PythonFile("/bin/busybox", b"not this", 0o100755, 1),  # the initramfs's own
    ]
    data = initramfs.archive([], b"BUSYBOX", [], ("/usr/bin/python3.11", ["/lib/x"], files))
    found = parse_newc(data)
    names = [n for n, _, _ in found]
    by_name = {n: (mode, body) for n, mode, body in found}
    assert by_name["corral/python"][1] == b"/usr/bin/python3.11\n/lib/x\n"
    assert by_name["bin/busybox"][1] == b"BUSYBOX"
    assert by_name["usr/bin/python3.11"] == (stat.S_IFREG | 0o755, b"\x7fELF")
    for name in names:  # every parent comes before its children
        parent = name.rsplit("/", 1)[0]
        assert "/" not in name or names.index(parent) < names.index(name)
    at = data.index(b"usr/lib/python3.11/os.py\0") - 110
    assert int(data[at + 46 : at + 54], 16) == 1_700_000_000  # its mtime: the .pyc stays valid


# ---- the control port, as a hostile guest's root could use it ----------------------


class _FakeVm:
    """The host's ends of a VM's ports, without a VM: the test plays the guest."""

    def __init__(self) -> None:
        import socket

        self.guest: dict[str, socket.socket] = {}
        self.socks: dict[str, socket.socket] = {}
        for name in ("corral.ctl", "corral.stdout", "corral.stderr"):
            self.socks[name], self.guest[name] = socket.socketpair()
        self.err_r, self.err_w = os.pipe()
        self.state = None

    def ended(self) -> str:
        return "ended"

    def follow(self, control: bytes) -> vmrun.Result:
        class Plan:
            timeout = 5.0

        result = vmrun.Result()
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            follower = vmrun._Follower(self, Plan(), result, null, null, time.monotonic())  # type: ignore[arg-type]
            self.guest["corral.ctl"].sendall(control)
            follower.run()
        finally:
            os.close(null)
        return result


def test_a_control_line_without_end_is_refused_not_held() -> None:
    """The guest's root can write the control port: an endless line ends the run
    with one corral line instead of growing the host's memory."""
    vm = _FakeVm()
    with pytest.raises(SetupError, match="control line of over"):
        vm.follow(b"x" * (vmrun.MAX_CONTROL_LINE * 4))
    assert _FakeVm().follow(b"exit 3 0 0 0\n").exit_code == 3  # the twin


def test_the_guests_error_words_reach_the_terminal_as_plain_text() -> None:
    with pytest.raises(SetupError) as caught:
        _FakeVm().follow(b"error bad \x1b]0;owned\x07 mount\x1b[2J" + b"y" * 2000 + b"\n")
    message = caught.value.message
    assert "\x1b" not in message and "\x07" not in message
    assert message.startswith("microvm: bad \\x1b]0;owned\\x07 mount\\x1b[2J")
    assert len(message) < 600
