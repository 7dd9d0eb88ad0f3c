"""The "newc" cpio format the Linux kernel unpacks as its initramfs.

Each entry is a 110-byte ASCII header (magic ``070701`` and thirteen 8-digit hex
fields), the NUL-terminated name, padding to 4 bytes, the data, padding to 4
bytes; the archive ends with an entry named ``TRAILER!!!``.  The kernel only
reads what it needs here: mode, mtime, size, name and data (for a symlink, the
data is its target).  Owners and inode numbers are fixed and a time is 0 unless
given (a Python module's, so its cached bytecode stays valid), so the same
inputs always give the same bytes (the archive is cached by its inputs' digest).
"""

from __future__ import annotations

import stat

MAGIC = b"070701"
TRAILER = "TRAILER!!!"


class Entry:
    """A file (``data``), a directory (``data`` empty) or a symlink (``data`` its target)."""

    __slots__ = ("data", "mode", "mtime", "name")

    def __init__(self, name: str, mode: int, data: bytes = b"", mtime: int = 0) -> None:
        self.name = name.lstrip("/")
        self.mode = mode
        self.data = data
        self.mtime = mtime


def directory(name: str, perms: int = 0o755) -> Entry:
    return Entry(name, stat.S_IFDIR | perms)


def file(name: str, data: bytes, perms: int = 0o644, mtime: int = 0) -> Entry:
    return Entry(name, stat.S_IFREG | perms, data, mtime)


def symlink(name: str, target: str) -> Entry:
    return Entry(name, stat.S_IFLNK | 0o777, target.encode())


def _pad(length: int) -> bytes:
    return b"\0" * (-length % 4)


def _header(ino: int, mode: int, nlink: int, mtime: int, size: int, namesize: int) -> bytes:
    # ino mode uid gid nlink mtime filesize devmajor devminor rdevmajor rdevminor namesize check
    fields = (ino, mode, 0, 0, nlink, mtime, size, 0, 0, 0, 0, namesize, 0)
    return MAGIC + b"".join(b"%08x" % value for value in fields)


def newc(entries: list[Entry]) -> bytes:
    """The archive holding ``entries`` in order (parents must come before children)."""
    out = bytearray()
    for ino, entry in enumerate([*entries, Entry(TRAILER, 0)], start=1):
        name = entry.name.encode() + b"\0"
        nlink = 2 if stat.S_ISDIR(entry.mode) else 1
        ino = ino if entry.name != TRAILER else 0
        head = _header(ino, entry.mode, nlink, entry.mtime, len(entry.data), len(name))
        out += head + name + _pad(len(head) + len(name))
        out += entry.data + _pad(len(entry.data))
    return bytes(out)
