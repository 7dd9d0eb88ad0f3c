"""Warm start: the guest's state saved once, restored on every start.

A cold boot under TCG spends 2 to 3 s in the guest kernel and the init before
the guest can take a request; every boot of one machine (kernel, initramfs,
QEMU, machine options, RAM, vCPUs, devices) reaches that point in the same
state.  So the first boot of a machine saves its state there, with QEMU's own
migration written to a file (QMP ``migrate`` to a descriptor), and later starts
launch QEMU with ``-incoming`` from that file: the guest resumes where the init
waits for its request (``waiting`` on the control port).

What keeps the tier's guarantees:

* **Nothing of a run is in a state.** It is saved before the request is sent:
  no mount of the host's view (QEMU refuses to migrate a mounted 9p export),
  no command, no environment value.  Only the guest's kernel and init are in
  it and, for a Sandbox's machine, corral's agent waiting for its first line
  (:mod:`corral.vm.guestpython`): its code and modules, no ids, cwd or env.
* **Fresh per run.** Every guest restored from one state would share its
  kernel's random state and clock: the request's first line (``fresh``) mixes 32
  bytes of the host's randomness into the guest's pool and reseeds its
  generator before anything else runs in the guest, and sets its clock.
* **Same decision.** A restore runs the same bubblewrap sandbox around QEMU,
  the same view and exports, the same devices (no network device): only the
  boot is skipped.  Device paths and descriptors are not part of a state.
* **Keyed by all that shapes it.** The file's name is a digest of QEMU's argv
  less what differs per start and never reaches the guest (:func:`stable_argv`)
  and of the identity of QEMU's binary, the guest kernel and the initramfs.
* **Written whole or not at all.** QEMU writes into an unnamed file in the
  cache directory (``O_TMPFILE``), which gets its name only once complete and
  synced; a corral killed meanwhile leaves nothing.  It is kept without the
  records of the guest RAM's zero pages (:func:`strip_zero_pages`): restoring
  one is a read of memory never touched, a page fault each.  A state that does not
  restore is removed and the run boots instead, saying why.
* **Honest.** Where a warm start cannot be used (turned off with
  ``CORRAL_VM_WARM=0``, the guest's console on, no ``O_TMPFILE`` in the cache)
  the run boots and says why.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import socket
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import BinaryIO

FORMAT = "1"  # bumped when what a state holds or how it is used changes
KEEP = 4  # states kept in a cache (each is the guest's touched RAM, ~100 MB)
SAVE_TIMEOUT = 60.0  # seconds for QEMU to write a state
PREFIX = "state-"
OFF = "CORRAL_VM_WARM"  # "0": never restore nor save


class SaveError(Exception):
    """A state could not be saved (the run goes on; the next start boots again)."""


def stable_argv(argv: Sequence[str]) -> list[str]:
    """QEMU's argv as it shapes the guest: without ``-name`` and ``-incoming``, with
    every ``fd=N`` and ``path=...`` option made the same (descriptor numbers
    and the host paths of exports are not part of a guest's state)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("-name", "-incoming"):
            skip = True
            continue
        options = arg.split(",")
        for i, option in enumerate(options):
            key = option.partition("=")[0]
            if key in ("fd", "path") and "=" in option:
                options[i] = key + "=*"
        out.append(",".join(options))
    return out


def identity(path: str) -> str:
    """A file's identity for a key: real path, size, change time, inode."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return f"{real}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def state_key(argv: Sequence[str], inputs: Sequence[str]) -> str:
    """The digest naming a state: QEMU's :func:`stable_argv` and ``inputs`` (the
    identities of QEMU's binary, the kernel and the initramfs, and host facts)."""
    digest = hashlib.sha256(FORMAT.encode())
    for part in [*stable_argv(argv), "--", *inputs]:
        digest.update(part.encode("utf-8", "surrogateescape") + b"\0")
    return digest.hexdigest()[:24]


def state_path(cache: str, key: str) -> str:
    return os.path.join(cache, f"{PREFIX}{key}")


def saved_keys(cache: str) -> frozenset[str]:
    """The keys of the states saved in ``cache`` (a host fact a plan reads)."""
    try:
        names = os.listdir(cache)
    except OSError:
        return frozenset()
    return frozenset(n[len(PREFIX) :] for n in names if n.startswith(PREFIX))


class Warm:
    """How one start goes: ``restore`` the state at ``path``, or boot (and
    ``save`` one there); ``why``: why it does not restore ("" when it does)."""

    __slots__ = ("path", "restore", "save", "why")

    def __init__(self, path: str, restore: bool, save: bool, why: str) -> None:
        self.path = path
        self.restore = restore
        self.save = save
        self.why = why

    def describe(self) -> str:
        if self.restore:
            return f"warm start: restore {self.path}"
        return f"cold boot: {self.why}" + (f" (saved to {self.path})" if self.save else "")


def enabled(console: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a machine's starts restore and save states at all (not turned off,
    no console): how it boots depends on it (corral.vm.qemu.kernel_cmdline)."""
    env = os.environ if environ is None else environ
    return env.get(OFF) != "0" and not console


def decide(cache: str, key: str, console: bool, environ: dict[str, str] | None = None) -> Warm:
    """Restore if this cache has the state of ``key``; else boot and save one."""
    env = os.environ if environ is None else environ
    path = state_path(cache, key)
    if env.get(OFF) == "0":
        return Warm(path, False, False, f"warm start turned off ({OFF}=0)")
    if console:
        return Warm(path, False, False, "no warm start with the guest's console")
    if os.path.isfile(path):
        return Warm(path, True, False, "")
    return Warm(path, False, True, "no saved state of this machine yet; this boot saves one")


def new_file(cache: str) -> int:
    """An unnamed file in ``cache`` for QEMU to write a state into (OSError if the
    file system has no ``O_TMPFILE``: then no state is saved).  Readable: the
    state is read back by :func:`without_zero_pages`."""
    os.makedirs(cache, mode=0o700, exist_ok=True)
    return os.open(cache, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)


# QEMU's migration stream (its savevm.c and ram.c, stream version 3), as far as
# without_zero_pages reads it: the header, the machine's configuration, then the
# RAM's sections (start, parts, end), each a run of page records closed by EOS;
# the devices' sections follow, copied as they are.
STREAM_HEADER = b"QEVM\x00\x00\x00\x03"
CONFIGURATION = 0x07
SECTION_START, SECTION_PART, SECTION_END = 0x01, 0x02, 0x03
SECTION_FOOTER = 0x7E
RAM_ZERO, RAM_MEM_SIZE, RAM_PAGE, RAM_EOS, RAM_CONTINUE = 0x02, 0x04, 0x08, 0x10, 0x20
PAGE_SIZE = 4096
# the guest's RAM: anonymous memory QEMU maps at start and nothing writes before a
# restore loads it (its ROMs, which are written at start, are other blocks)
GUEST_RAM = b"microvm.ram"


class StreamError(Exception):
    """The stream is not one :func:`strip_zero_pages` knows: it is kept as it is."""


class _Reader:
    def __init__(self, src: BinaryIO) -> None:
        self.src = src
        self.block = b""  # the block of the last page record read (in any section)

    def take(self, n: int) -> bytes:
        data = self.src.read(n)
        if len(data) != n:
            raise StreamError("the stream ends early")
        return data

    def byte(self) -> int:
        return self.take(1)[0]

    def be32(self) -> int:
        return int.from_bytes(self.take(4), "big")

    def be64(self) -> int:
        return int.from_bytes(self.take(8), "big")

    def name(self) -> bytes:
        return self.take(self.byte())


def strip_zero_pages(src: BinaryIO, dst: BinaryIO) -> int:
    """Copy a saved state from ``src`` to ``dst`` without the records of the guest
    RAM's zero pages; the number left out.  StreamError when the stream has
    anything else than what QEMU 7.2 writes for a microvm saved to a file.

    Why: QEMU restores a zero page by reading it (a page still zero is not
    written), and a read of guest RAM never touched maps the kernel's zero page,
    one fault per 4 KiB without huge pages: 170 ms for a 1 GiB guest on the
    host this was measured on, to leave every page as it was."""
    r = _Reader(src)
    if r.take(len(STREAM_HEADER)) != STREAM_HEADER or r.byte() != CONFIGURATION:
        raise StreamError("not a version 3 stream with the machine's configuration")
    dst.write(STREAM_HEADER + bytes([CONFIGURATION]))
    size = r.be32()
    dst.write(size.to_bytes(4, "big") + r.take(size))  # the machine type's name
    ram_section = -1
    dropped = 0
    while True:
        kind = r.byte()
        section = r.be32()
        head = bytes([kind]) + section.to_bytes(4, "big")
        if kind == SECTION_START and ram_section < 0:
            idstr = r.name()
            if idstr != b"ram":
                raise StreamError(f"a section {idstr!r} before the RAM's end")
            ram_section = section
            head += bytes([len(idstr)]) + idstr + r.take(8)  # instance and version
        elif kind not in (SECTION_PART, SECTION_END) or section != ram_section:
            raise StreamError(f"section type {kind} before the RAM's end")
        dst.write(head)
        dropped += _ram_records(r, dst)
        footer = r.take(1)
        if footer[0] == SECTION_FOOTER:
            footer += r.take(4)
        dst.write(footer)
        if kind == SECTION_END:
            break
    while chunk := src.read(1 << 20):  # the devices' sections, the end and its description
        dst.write(chunk)
    return dropped


def _ram_records(r: _Reader, dst: BinaryIO) -> int:
    """One section's page records up to its EOS, copied but for the guest RAM's
    zero pages.  A record names its block unless it is the block of the record
    before it (CONTINUE), in this section or an earlier one: a record written
    after one left out, and the first one written in a section, name theirs."""
    dropped = 0
    written = b""  # the block of the last record written in this section
    while True:
        word = r.be64()
        flags, address = word & (PAGE_SIZE - 1), word & ~(PAGE_SIZE - 1)
        kind = flags & ~RAM_CONTINUE
        if kind == RAM_EOS:
            dst.write(word.to_bytes(8, "big"))
            return dropped
        if kind == RAM_MEM_SIZE:  # the blocks' names and sizes (the first section)
            dst.write(word.to_bytes(8, "big"))
            left = address
            while left > 0:
                name = r.name()
                length = r.be64()
                dst.write(bytes([len(name)]) + name + length.to_bytes(8, "big"))
                left -= length
            continue
        if kind not in (RAM_ZERO, RAM_PAGE):
            raise StreamError(f"a RAM record with flags {flags:#x}")
        if not flags & RAM_CONTINUE:
            r.block = r.name()
        elif not r.block:
            raise StreamError("a RAM record continues no block")
        block = r.block
        payload = r.take(1 if kind == RAM_ZERO else PAGE_SIZE)
        if kind == RAM_ZERO and payload == b"\0" and block == GUEST_RAM:
            dropped += 1
            continue
        if block == written:
            dst.write((address | kind | RAM_CONTINUE).to_bytes(8, "big"))
        else:
            dst.write((address | kind).to_bytes(8, "big") + bytes([len(block)]) + block)
            written = block
        dst.write(payload)


def without_zero_pages(fd: int, cache: str) -> int:
    """The state QEMU wrote in ``fd`` (see :func:`new_file`), rewritten by
    :func:`strip_zero_pages` into a new unnamed file in ``cache``, whose
    descriptor is returned (``fd`` closed); ``fd`` itself when the stream is not
    as expected or cannot be rewritten: a restore then loads it as it is."""
    try:
        out = new_file(cache)
    except OSError:
        return fd
    try:
        with (
            open(os.dup(fd), "rb", buffering=1 << 20) as src,
            open(os.dup(out), "wb", buffering=1 << 20) as dst,
        ):
            src.seek(0)
            strip_zero_pages(src, dst)
    except (StreamError, OSError):
        os.close(out)
        return fd
    os.close(fd)
    return out


def commit(fd: int, path: str) -> None:
    """Give the complete state in ``fd`` its name (synced first), then drop the
    oldest states beyond :data:`KEEP`.  Closes ``fd``."""
    cache, name = os.path.split(path)
    try:
        os.fsync(fd)
        # linkat with AT_SYMLINK_FOLLOW (what a dir_fd makes os.link call: its
        # plain link() would link /proc's magic symlink itself)
        where = os.open(cache, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=where)
        except FileExistsError:
            pass  # another start saved the same machine meanwhile
        finally:
            os.close(where)
    finally:
        os.close(fd)
    prune(cache, KEEP)


def prune(cache: str, keep: int, prefix: str = PREFIX, suffix: str = "") -> None:
    """Remove all but the ``keep`` most recently used (:func:`mark_used`) states in
    ``cache`` (or files named ``prefix``...``suffix``: the initramfs images)."""
    found = []
    for name in os.listdir(cache):
        if name.startswith(prefix) and name.endswith(suffix):
            try:
                found.append((os.stat(os.path.join(cache, name)).st_atime, name))
            except FileNotFoundError:
                continue
    for _, name in sorted(found, reverse=True)[keep:]:
        try:
            os.unlink(os.path.join(cache, name))
        except FileNotFoundError:
            pass


def open_state(path: str) -> int | None:
    """The state to restore, opened (and marked as used, for :func:`prune`)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    mark_used(path)
    return fd


def mark_used(path: str) -> None:
    """Set a cached file's access time to now, for :func:`prune`; its modification
    time stays, since a state's key holds the initramfs's (:func:`identity`)."""
    try:
        os.utime(path, ns=(time.time_ns(), os.stat(path).st_mtime_ns))
    except OSError:
        pass


def discard(path: str, fd: int) -> None:
    """Remove the state at ``path`` if it is still the file ``fd`` holds (one that
    did not restore); a newer one saved meanwhile stays."""
    try:
        if os.path.samestat(os.fstat(fd), os.stat(path)):
            os.unlink(path)
    except OSError:
        pass


class Monitor:
    """QEMU's QMP monitor over a socket: commands and their answers, events skipped."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _message(self, deadline: float) -> dict[str, object]:
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                raise SaveError("QEMU's monitor did not answer in time")
            chunk = self.sock.recv(65536)
            if not chunk:
                raise SaveError("QEMU's monitor closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        found = json.loads(line)
        return found if isinstance(found, dict) else {}

    def greet(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while "QMP" not in self._message(deadline):
            pass
        self.command("qmp_capabilities", timeout=timeout)

    def command(
        self,
        name: str,
        arguments: dict[str, object] | None = None,
        fds: Sequence[int] = (),
        timeout: float = 10.0,
    ) -> object:
        request: dict[str, object] = {"execute": name}
        if arguments:
            request["arguments"] = arguments
        data = json.dumps(request).encode() + b"\n"
        if fds:
            import array

            rights = array.array("i", fds)
            self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
        else:
            self.sock.sendall(data)
        deadline = time.monotonic() + timeout
        while True:
            answer = self._message(deadline)
            if "error" in answer:
                error = answer["error"]
                desc = error.get("desc", error) if isinstance(error, dict) else error
                raise SaveError(f"QEMU refused {name}: {desc}")
            if "return" in answer:
                return answer["return"]


def save(monitor: Monitor, fd: int, timeout: float = SAVE_TIMEOUT) -> None:
    """Write the running guest's state into ``fd`` and let it run on (QEMU pauses a
    guest once its state is written).  SaveError says why it could not."""
    deadline = time.monotonic() + timeout
    monitor.greet(timeout)
    monitor.command("getfd", {"fdname": "corral-state"}, fds=[fd])
    monitor.command("migrate", {"uri": "fd:corral-state"})
    while True:
        status = monitor.command("query-migrate")
        state = status.get("status") if isinstance(status, dict) else None
        if state == "completed":
            break
        if state in ("failed", "cancelled") or time.monotonic() > deadline:
            why = status.get("error-desc", state) if isinstance(status, dict) else state
            monitor.command("cont")
            raise SaveError(f"QEMU could not save the guest's state: {why or 'timed out'}")
        time.sleep(0.01)
    monitor.command("cont")
