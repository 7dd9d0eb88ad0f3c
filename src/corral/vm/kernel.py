"""Pure transforms of a Debian kernel package's files into what the guest boots.

* :func:`vmlinux_from_bzimage`: the ELF kernel inside a ``vmlinuz`` (bzImage).
  QEMU boots an ELF with a PVH entry note directly, skipping the real-mode setup
  and the decompressor, which under TCG takes about 3 s of a 5 s boot.
* :func:`trim_elf`: the same ELF without the zero bytes at the end of its load
  segments (the loader zero-fills them) nor its section headers: Debian's 64 MB
  vmlinux becomes about 39 MB, and QEMU keeps that file mapped for the VM's life.
* :func:`modinfo`, :func:`load_order`: a module's dependencies from its own
  ``.modinfo`` section (the package has no ``modules.dep``; depmod makes it at
  install time) and the order to ``insmod`` them.
"""

from __future__ import annotations

import struct

PT_LOAD = 1
PT_NOTE = 4
XEN_ELFNOTE_PHYS32_ENTRY = 18  # the PVH entry point QEMU looks for


class KernelError(Exception):
    """The file is not what the guest can boot; the message says why."""


def vmlinux_from_bzimage(data: bytes) -> bytes:
    """The uncompressed ELF kernel from a bzImage (boot protocol 2.08 or later)."""
    if data[0x202:0x206] != b"HdrS":
        raise KernelError("not a bzImage (no HdrS boot header)")
    version = struct.unpack_from("<H", data, 0x206)[0]
    if version < 0x208:
        raise KernelError(f"boot protocol {version >> 8}.{version & 0xFF} has no payload fields")
    setup_sects = data[0x1F1] or 4
    offset, length = struct.unpack_from("<II", data, 0x248)
    start = (setup_sects + 1) * 512 + offset
    payload = data[start : start + length]
    elf = _decompress(payload)
    if elf[:4] != b"\x7fELF":
        raise KernelError("the bzImage payload is not an ELF kernel")
    return elf


def _decompress(payload: bytes) -> bytes:
    if payload.startswith(b"\xfd7zXZ\x00"):
        import lzma

        return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(payload)
    if payload.startswith(b"\x1f\x8b"):
        import zlib

        return zlib.decompressobj(wbits=31).decompress(payload)
    if payload.startswith(b"BZh"):
        import bz2

        return bz2.BZ2Decompressor().decompress(payload)
    kinds = {b"\x28\xb5\x2f\xfd": "zstd", b"\x02\x21\x4c\x18": "lz4", b"\x89LZO": "lzo"}
    kind = kinds.get(payload[:4], "an unknown format")
    raise KernelError(f"the kernel is compressed with {kind}; corral reads xz, gzip or bzip2")


class _Elf:
    """The few fields of a little-endian ELF64 file that the functions here need."""

    def __init__(self, data: bytes) -> None:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise KernelError("not a little-endian 64-bit ELF file")
        self.data = data
        (self.phoff, self.shoff) = struct.unpack_from("<QQ", data, 0x20)
        (self.phentsize, self.phnum, self.shentsize, self.shnum, self.shstrndx) = (
            struct.unpack_from("<HHHHH", data, 0x36)
        )

    def segments(self) -> list[tuple[int, int, int, int]]:
        """(index, type, file offset, file size) of each program header."""
        found = []
        for i in range(self.phnum):
            at = self.phoff + i * self.phentsize
            kind = struct.unpack_from("<I", self.data, at)[0]
            offset = struct.unpack_from("<Q", self.data, at + 8)[0]
            filesz = struct.unpack_from("<Q", self.data, at + 32)[0]
            found.append((i, kind, offset, filesz))
        return found

    def section(self, wanted: str) -> bytes | None:
        if not self.shoff or self.shstrndx >= self.shnum:
            return None
        names_at = self.shoff + self.shstrndx * self.shentsize
        names_off, names_size = struct.unpack_from("<QQ", self.data, names_at + 24)
        names = self.data[names_off : names_off + names_size]
        for i in range(self.shnum):
            at = self.shoff + i * self.shentsize
            name_index = struct.unpack_from("<I", self.data, at)[0]
            name = names[name_index : names.index(b"\0", name_index)].decode(errors="replace")
            if name == wanted:
                offset, size = struct.unpack_from("<QQ", self.data, at + 24)
                return self.data[offset : offset + size]
        return None


def has_pvh_note(elf: bytes) -> bool:
    """Whether the kernel can be booted through its PVH entry (QEMU's ELF path)."""
    parsed = _Elf(elf)
    for _, kind, offset, size in parsed.segments():
        if kind != PT_NOTE:
            continue
        at, end = offset, offset + size
        while at + 12 <= end:
            namesz, descsz, note_type = struct.unpack_from("<III", elf, at)
            if note_type == XEN_ELFNOTE_PHYS32_ENTRY and elf[at + 12 : at + 15] == b"Xen":
                return True
            at += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False


def trim_elf(elf: bytes) -> bytes:
    """``elf`` with each load segment's trailing zeros left to the loader's zero fill,
    its section headers dropped and the file cut after the last byte still used."""
    parsed = _Elf(elf)
    out = bytearray(elf)
    end = parsed.phoff + parsed.phnum * parsed.phentsize
    for index, kind, offset, filesz in parsed.segments():
        if kind == PT_LOAD and filesz:
            kept = len(elf[offset : offset + filesz].rstrip(b"\0"))
            struct.pack_into("<Q", out, parsed.phoff + index * parsed.phentsize + 32, kept)
            filesz = kept
        if filesz:
            end = max(end, offset + filesz)
    struct.pack_into("<Q", out, 0x28, 0)  # e_shoff: no section headers
    struct.pack_into("<HHH", out, 0x3A, 0, 0, 0)  # e_shentsize, e_shnum, e_shstrndx
    return bytes(out[:end])


def modinfo(ko: bytes) -> dict[str, str]:
    """A module's ``.modinfo`` fields (``name``, ``depends``...); later keys win."""
    section = _Elf(ko).section(".modinfo")
    if section is None:
        raise KernelError("not a kernel module (no .modinfo section)")
    fields = {}
    for item in section.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq:
            fields[key.decode(errors="replace")] = value.decode(errors="replace")
    return fields


def depends(ko: bytes) -> list[str]:
    return [d for d in modinfo(ko).get("depends", "").split(",") if d]


def load_order(wanted: list[str], deps: dict[str, list[str]]) -> list[str]:
    """``wanted`` and everything they need, each after what it depends on.

    ``deps`` maps a module name to its dependencies; a name missing from it is
    built into the kernel (or absent: :func:`missing` tells which)."""
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order or name not in deps:
            return
        if name in visiting:
            raise KernelError(f"module dependency cycle through {name}")
        visiting.add(name)
        for dep in deps[name]:
            visit(dep)
        visiting.discard(name)
        order.append(name)

    for name in wanted:
        visit(name)
    return order


def module_name(path: str) -> str:
    """``kernel/fs/9p/9p.ko`` -> ``9p``; the kernel spells ``-`` and ``_`` alike."""
    base = path.rsplit("/", 1)[-1]
    for suffix in (".ko", ".ko.xz", ".ko.zst", ".ko.gz"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return base.replace("-", "_")
