"""The "newc" cpio format the Linux kernel unpacks as its initramfs.

Each entry is a 110-byte ASCII header (magic ``070701`` and thirteen 8-digit hex
fields), the NUL-terminated name, padding to 4 bytes, the data, padding to 4
bytes; the archive ends with an entry named ``TRAILER!!!``.  The kernel only
reads what it needs here: mode, mtime, size, name and data (for a symlink, the
data is its target; for a device node, rdevmajor and rdevminor).  Owners and
inode numbers are fixed and a time is 0 unless given (a Python module's, so its
cached bytecode stays valid), so the same inputs always give the same bytes
(the archive is cached by its inputs' digest).
"""

from __future__ import annotations

import stat

MAGIC = b"070701"
TRAILER = "TRAILER!!!"


class Entry:
    """A file (``data``), a directory (``data`` empty), a symlink (``data`` its
    target) or a device node (``rdev``: its major and minor numbers)."""

    __slots__ = ("data", "mode", "mtime", "name", "rdev")

    def __init__(
        self,
        name: str,
        mode: int,
        data: bytes = b"",
        mtime: int = 0,
        rdev: tuple[int, int] = (0, 0),
    ) -> None:
        self.name = name.lstrip("/")
        self.mode = mode
        self.data = data
        self.mtime = mtime
        self.rdev = rdev


def directory(name: str, perms: int = 0o755) -> Entry:
    return Entry(name, stat.S_IFDIR | perms)


def file(name: str, data: bytes, perms: int = 0o644, mtime: int = 0) -> Entry:
    return Entry(name, stat.S_IFREG | perms, data, mtime)


def symlink(name: str, target: str) -> Entry:
    return Entry(name, stat.S_IFLNK | 0o777, target.encode())


def char_device(name: str, major: int, minor: int, perms: int = 0o666) -> Entry:
    return Entry(name, stat.S_IFCHR | perms, rdev=(major, minor))


def _pad(length: int) -> bytes:
    return b"\0" * (-length % 4)


def _header(entry: Entry, ino: int, nlink: int, namesize: int) -> bytes:
    # ino mode uid gid nlink mtime filesize devmajor devminor rdevmajor rdevminor namesize check
    size, (major, minor) = len(entry.data), entry.rdev
    fields = (ino, entry.mode, 0, 0, nlink, entry.mtime, size, 0, 0, major, minor, namesize, 0)
    return MAGIC + b"".join(b"%08x" % value for value in fields)


def newc(entries: list[Entry]) -> bytes:
    """The archive holding ``entries`` in order (parents must come before children)."""
    out = bytearray()
    for ino, entry in enumerate([*entries, Entry(TRAILER, 0)], start=1):
        name = entry.name.encode() + b"\0"
        nlink = 2 if stat.S_ISDIR(entry.mode) else 1
        ino = ino if entry.name != TRAILER else 0
        head = _header(entry, ino, nlink, len(name))
        out += head + name + _pad(len(head) + len(name))
        out += entry.data + _pad(len(entry.data))
    return bytes(out)
