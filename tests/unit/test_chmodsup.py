"""The landlock tier's chmod supervisor: its pure parts, then the real kernel.

The pure parts (structs, argument parsing, reading a path, the decision) need
nothing launched.  The kernel tests fork a child that installs a filter sending
its mode calls to a listener (as the landlock tier's command does), pass the
listener here, and serve it with the supervisor's own code, or not at all.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from corral import chmodsup, confine, seccomp
from corral.chmodsup import Places, Request, decide, read_string
from corral.tiers.landlock import MODE_CALLS

# --- structs and numbers ------------------------------------------------------


def test_struct_sizes_and_ioctl_numbers_are_the_kernels() -> None:
    # <linux/seccomp.h>: sizeof(struct seccomp_notif) == 80, _resp == 24
    assert chmodsup.NOTIF.size == 80 and chmodsup.RESP.size == 24
    assert chmodsup.NOTIF_RECV == 0xC0502100
    assert chmodsup.NOTIF_SEND == 0xC0182101
    assert chmodsup.NOTIF_ID_VALID == 0x40082102


def test_notification_unpacks_and_answer_packs() -> None:
    raw = chmodsup.NOTIF.pack(7, 1234, 0, 90, 0xC000003E, 0, 0xDEAD, 0o644, 0, 0, 0, 0)
    call = chmodsup.unpack_notif(raw)
    assert (call.id, call.pid, call.nr, call.args[:2]) == (7, 1234, 90, (0xDEAD, 0o644))
    assert chmodsup.RESP.unpack(chmodsup.pack_resp(7, errno.EPERM)) == (7, 0, -errno.EPERM, 0)
    assert chmodsup.RESP.unpack(chmodsup.pack_resp(7, 0)) == (7, 0, 0, 0)


def test_requests_read_each_calls_arguments() -> None:
    fchmod = Request("fchmod", (5, 0o100644, 0, 0, 0, 0))
    assert fchmod.by_fd and fchmod.fd == 5 and fchmod.mode == 0o644  # only mode bits
    chmod = Request("chmod", (0x1000, 0o600, 0, 0, 0, 0))
    assert not chmod.by_fd and (chmod.dirfd, chmod.path, chmod.mode) == (-100, 0x1000, 0o600)
    at = Request("fchmodat", (0xFFFFFF9C, 0x2000, 0o755, 0x100, 0, 0))  # AT_FDCWD, 32-bit
    assert (at.dirfd, at.path, at.mode, at.flags) == (-100, 0x2000, 0o755, 0)  # no flags arg
    at2 = Request("fchmodat2", (3, 0x2000, 0o700, 0x100, 0, 0))
    assert (at2.dirfd, at2.flags) == (3, 0x100)
    with pytest.raises(ValueError):
        Request("chown", (0, 0, 0, 0, 0, 0))


def test_own_descriptor_names() -> None:
    assert chmodsup.own_fd(b"/proc/self/fd/12") == 12
    assert chmodsup.own_fd(b"/proc/thread-self/fd/3") == 3
    for other in (b"/proc/self/fd/", b"/proc/self/fd/3/x", b"/proc/1/fd/3", b"/proc/self/cwd"):
        assert chmodsup.own_fd(other) is None, other


# --- reading the path -----------------------------------------------------------


def memory(base: int, data: bytes) -> Callable[[int, int], bytes]:
    """A reader of ``data`` mapped at ``base``, failing (EIO) elsewhere, and
    refusing reads that cross a page, as a page fault would cut them."""

    def read(size: int, addr: int) -> bytes:
        assert addr // 4096 == (addr + size - 1) // 4096, "a read crossed a page"
        if not base <= addr < base + len(data):
            raise OSError(errno.EIO, "unmapped")
        return data[addr - base : addr - base + size]

    return read


def test_path_is_read_up_to_its_nul_across_pages() -> None:
    path = b"a/" * 3000 + b"end"
    read = memory(0x10000 - 10, path[:4000] + b"\0" + b"junk")
    assert read_string(read, 0x10000 - 10) == path[:4000]


def test_path_without_nul_is_too_long() -> None:
    with pytest.raises(OSError) as info:
        read_string(memory(0x10000, b"x" * 9000), 0x10000)
    assert info.value.errno == errno.ENAMETOOLONG


def test_path_running_into_unmapped_memory_is_a_fault() -> None:
    for addr in (0, 0x5000, 1 << 63):
        with pytest.raises(OSError) as info:
            read_string(memory(0x10000, b"abc"), addr)
        assert info.value.errno == errno.EFAULT
    with pytest.raises(OSError) as info:
        read_string(memory(0x10000 - 3, b"abc"), 0x10000 - 3)  # no NUL before the hole
    assert info.value.errno == errno.EFAULT


# --- the decision -----------------------------------------------------------------


def facts(kind: int = stat.S_IFREG, nlink: int = 1, ino: int = 10) -> os.stat_result:
    return os.stat_result((kind | 0o644, ino, 1, nlink, 0, 0, 0, 0, 0, 0))


PLACES = Places(["/ws", "/home/layer"], ["/ws/.env", "/ws/vault", "/state", "/outside/secret"])
PLACES.ids = frozenset({(1, 99)})  # a secret, known by identity


@pytest.mark.parametrize(
    ("path", "st", "mode", "expected"),
    [
        ("/ws/a.txt", facts(), 0o600, 0),
        ("/ws", facts(stat.S_IFDIR, nlink=5), 0o755, 0),  # a root itself; dirs have links
        ("/home/layer/.cache/x", facts(), 0o700, 0),
        ("/ws/gone (deleted)", facts(nlink=0), 0o600, 0),  # unlinked, was inside
        ("/etc/passwd", facts(), 0o666, errno.EPERM),
        ("/ws2/a", facts(), 0o600, errno.EPERM),  # a sibling sharing the prefix
        ("/ws/hard", facts(nlink=2), 0o600, errno.EPERM),  # its other name may be outside
        ("/ws/a.txt", facts(), 0o4755, errno.EPERM),
        ("/ws/a.txt", facts(), 0o2755, errno.EPERM),
        ("/ws/.env", facts(), 0o644, errno.EPERM),
        ("/ws/vault/key", facts(), 0o644, errno.EPERM),  # below a withheld directory
        ("/ws/renamed", facts(ino=99), 0o644, errno.EPERM),  # a secret under a new name
        ("/ws/disk", facts(stat.S_IFBLK), 0o666, errno.EPERM),
        ("/ws/tty", facts(stat.S_IFCHR), 0o666, errno.EPERM),
        ("/ws/link", facts(stat.S_IFLNK), 0o600, errno.EOPNOTSUPP),
        ("pipe:[123]", facts(stat.S_IFIFO), 0o600, errno.EPERM),
    ],
)
def test_decide(path: str, st: os.stat_result, mode: int, expected: int) -> None:
    assert decide(path, st, mode, PLACES) == expected


def test_withheld_paths_outside_the_roots_are_not_kept() -> None:
    """corral's state directory holds the home layer: an ancestor of a root is
    not "inside" it, or nothing in the home layer could change mode."""
    assert PLACES.withheld == ("/ws/.env", "/ws/vault")


# --- the real kernel ----------------------------------------------------------------


def mode_rules() -> list[seccomp.SyscallRule]:
    return [seccomp.SyscallRule(name, errno.EPERM, (), "", notify=True) for name in MODE_CALLS]


def confined(body: Callable[[], str]) -> tuple[int, int, int]:
    """Fork a child whose mode calls go to a listener, run ``body`` there once the
    filter is in, and return (its pid, the listener, a pipe carrying body's text)."""
    program = seccomp.compile_filter(mode_rules(), seccomp.native_arch())
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(out_r)
            mine = confine.install_seccomp(program, listen=True)
            confine.send_fd(theirs.fileno(), mine)
            os.close(mine)
            os.write(out_w, body().encode())
        finally:
            os._exit(0)
    os.close(out_w)
    theirs.close()
    listener = confine.receive_fd(ours.fileno())
    ours.close()
    assert listener is not None
    return pid, listener, out_r


def serve_until_done(pid: int, listener: int, out_r: int, places: Places) -> str:
    """Serve with the supervisor's own loop (threads: the loop wants the main
    thread's signals, so here we poll by hand with the same handle_one)."""
    import select

    places.remember()
    names = chmodsup.call_names()
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    while True:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        for _fd, events in poller.poll(100):
            if events & select.POLLIN:
                chmodsup.handle_one(listener, names, places)
            else:
                poller.unregister(listener)
    os.close(listener)
    with os.fdopen(out_r) as fh:
        return fh.read()


def attempt(what: str, action: Callable[[], object]) -> str:
    try:
        action()
    except OSError as exc:
        return f"{what}=err:{exc.errno}\n"
    return f"{what}=ok\n"


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path, Places]:
    ws = tmp_path / "ws"
    outside = tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    for path in (ws / "mine", outside / "theirs", ws / "secret"):
        path.write_text("x")
        path.chmod(0o644)
    os.link(outside / "theirs", ws / "hardlink")
    (ws / "escape").symlink_to(outside / "theirs")
    return ws, outside, Places([str(ws)], [str(ws / "secret")])


def test_supervisor_allows_inside_and_refuses_the_rest(layout: tuple[Path, Path, Places]) -> None:
    ws, outside, places = layout

    def body() -> str:
        os.chdir(ws)
        fd = os.open("mine", os.O_RDONLY)
        opath = os.open("mine", os.O_PATH)
        thread_out: list[str] = []
        worker = threading.Thread(
            target=lambda: thread_out.append(attempt("thread", lambda: os.chmod("mine", 0o640)))
        )
        worker.start()
        worker.join()
        return "".join(
            [
                attempt("chmod", lambda: os.chmod("mine", 0o600)),
                attempt("fchmod", lambda: os.fchmod(fd, 0o604)),
                attempt("at", lambda: os.chmod("mine", 0o620, dir_fd=os.open(".", os.O_PATH))),
                attempt("procfd", lambda: os.chmod(f"/proc/self/fd/{opath}", 0o610)),
                *thread_out,
                attempt("outside", lambda: os.chmod(outside / "theirs", 0o666)),
                attempt("symlink", lambda: os.chmod("escape", 0o666)),
                attempt("hardlink", lambda: os.chmod("hardlink", 0o666)),
                attempt("secret", lambda: os.chmod("secret", 0o666)),
                attempt("missing", lambda: os.chmod("nothing", 0o666)),
                attempt("magic", lambda: os.chmod(f"/proc/{os.getppid()}/cwd/mine", 0o666)),
            ]
        )

    out = serve_until_done(*confined(body), places)
    for what in ("chmod", "fchmod", "at", "procfd", "thread"):
        assert f"{what}=ok" in out, out
    assert stat.S_IMODE((ws / "mine").stat().st_mode) == 0o610  # the last done: procfd
    for what in ("outside", "symlink", "hardlink", "secret"):
        assert f"{what}=err:{errno.EPERM}" in out, out
    assert f"missing=err:{errno.ENOENT}" in out, out
    assert f"magic=err:{errno.ELOOP}" in out, out  # a magic link leads where we may go
    assert stat.S_IMODE((outside / "theirs").stat().st_mode) == 0o644
    assert stat.S_IMODE((ws / "secret").stat().st_mode) == 0o644


def test_without_a_supervisor_the_call_fails_and_nothing_changes(
    layout: tuple[Path, Path, Places],
) -> None:
    """Fail closed: the listener is gone (a reaper that died), so the kernel fails
    the call itself and no mode changes."""
    ws, _, _ = layout
    pid, listener, out_r = confined(lambda: attempt("chmod", lambda: os.chmod(ws / "mine", 0o600)))
    os.close(listener)
    os.waitpid(pid, 0)
    with os.fdopen(out_r) as fh:
        assert fh.read() == f"chmod=err:{errno.ENOSYS}\n"
    assert stat.S_IMODE((ws / "mine").stat().st_mode) == 0o644


def test_a_swapped_symlink_never_reaches_outside(layout: tuple[Path, Path, Places]) -> None:
    """One thread swaps a symlink between a file inside and one outside while
    another chmods through it: the supervisor decides and acts on one opened file,
    so the file outside never changes, while some chmods land inside."""
    ws, outside, places = layout

    def body() -> str:
        os.chdir(ws)
        stop = threading.Event()

        def swap() -> None:
            while not stop.is_set():
                for target in ("mine", str(outside / "theirs")):
                    os.symlink(target, "flip.new")
                    os.rename("flip.new", "flip")

        swapper = threading.Thread(target=swap)
        swapper.start()
        done = 0
        for i in range(400):
            try:
                os.chmod("flip", 0o600 | (i & 0o7))
                done += 1
            except OSError:
                pass
        stop.set()
        swapper.join()
        return f"done={done}"

    out = serve_until_done(*confined(body), places)
    assert stat.S_IMODE((outside / "theirs").stat().st_mode) == 0o644, out
    assert out.startswith("done=") and out != "done=0", out


def test_scheduling_goes_on_for_the_sandboxs_own_processes_only() -> None:
    """The sandbox's own: under the reaper (here: this process, and a child of it);
    not the reaper's parent or pid 1.  A call let on is answered with the flag
    that lets the kernel run it as made."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert chmodsup.ours(child.pid, os.getpid())
        assert not chmodsup.ours(os.getppid(), os.getpid())
        assert not chmodsup.ours(1, os.getpid())
        assert not chmodsup.ours(2**22 + 12345, os.getpid())  # no such process
    finally:
        child.kill()
        child.wait()
    assert chmodsup.RESP.unpack(chmodsup.pack_resp(9, chmodsup.GO_ON)) == (9, 0, 0, 1)
