"""Syscall filter, network and unix-socket isolation on real bwrap, each with an allow twin."""

from __future__ import annotations

import os
import pty
import pwd
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from conftest import Corral, is_gvisor

PROBE = r"""
import ctypes, errno, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
def call(name, fn):
    try:
        r = fn()
        print(f"{name}=ok" if r is None or r >= 0 else
              f"{name}=err:{errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())}")
    except OSError as e:
        print(f"{name}=err:{errno.errorcode.get(e.errno, e.errno)}")
call("ptrace", lambda: libc.ptrace(16, os.getppid(), 0, 0))           # PTRACE_ATTACH
call("unshare_user", lambda: libc.unshare(0x10000000))
call("unshare_ns", lambda: libc.unshare(0x00020000))
call("mount", lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
call("keyctl", lambda: libc.syscall(250, 0, 0, 0, 0, 0))               # x86_64 keyctl
call("bpf", lambda: libc.syscall(321, 0, 0, 0))
call("io_uring", lambda: libc.syscall(425, 1, 0))
call("userfaultfd", lambda: libc.syscall(323, 0))
call("perf", lambda: libc.syscall(298, 0, 0, -1, -1, 0))
call("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close())
call("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close())
call("vsock", lambda: socket.socket(40, socket.SOCK_STREAM, 0).close())
call("inet", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close())
call("inet6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close())
call("unix", lambda: socket.socketpair().__class__ and None)
call("fork", lambda: (os.waitpid(os.fork(), 0) if True else 0) and None)
call("thread", lambda: __import__("threading").Thread(target=lambda: None).start())
"""


def run_py(c: Corral, ws: Path, code: str, *flags: str) -> subprocess.CompletedProcess[bytes]:
    (ws / "probe.py").write_text(code)
    c.chown(ws / "probe.py")
    return c.run(["run", "-q", *flags, "--", "python3", "probe.py"], cwd=ws)


def results(out: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in out.decode().splitlines() if "=" in line)


def test_syscall_filter(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    r = run_py(
        c,
        ws,
        PROBE.replace(
            "os.waitpid(os.fork(), 0) if True else 0",
            "os._exit(0) if os.fork() == 0 else os.wait()",
        ),
    )
    got = results(r.stdout)
    assert r.returncode == 0, r.stderr
    for denied in (
        "ptrace",
        "unshare_user",
        "unshare_ns",
        "mount",
        "keyctl",
        "bpf",
        "io_uring",
        "userfaultfd",
        "perf",
        "netlink",
        "packet",
        "vsock",
    ):
        assert got[denied].startswith("err:"), (denied, got)
    # gVisor applies OCI seccomp rules with EPERM whatever errno the profile names
    assert got["netlink"] == ("err:EPERM" if is_gvisor(c) else "err:EAFNOSUPPORT")
    for allowed in ("inet", "inet6", "unix", "fork", "thread"):  # allow twins
        assert got[allowed] == "ok", (allowed, got)


def test_no_capabilities_and_no_new_privileges(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    r = c.run(
        [
            "run",
            "-q",
            "--",
            "sh",
            "-c",
            "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; "
            "hostname; id -u",
        ],
        cwd=ws,
    )
    out = r.stdout.decode()
    assert "CapEff:\t0000000000000000" in out and "CapPrm:\t0000000000000000" in out, out
    if c.has("mounts") or c.who == "root":
        # An ordinary user cannot empty its bounding set without a user namespace
        # (and needs not: with no_new_privs, exec never grants capabilities).
        assert "CapBnd:\t0000000000000000" in out, out
    assert "Seccomp:\t2" in out
    if not is_gvisor(c):  # gVisor's /proc/self/status has no NoNewPrivs line (runsc gets it)
        assert "NoNewPrivs:\t1" in out
    if c.has("uts"):
        assert "corral" in out  # own hostname (uts namespace)
    assert out.strip().endswith(str(c.uid))  # allow twin: runs as the caller's uid


def _host_server() -> tuple[socket.socket, int, list[bytes]]:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    hits: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            hits.append(conn.recv(100))
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1], hits


def test_no_network_but_own_loopback(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    srv, port, hits = _host_server()
    try:
        r = run_py(
            c,
            ws,
            f"""
import socket, threading
def attempt(name, fam, addr):
    try:
        s = socket.socket(fam, socket.SOCK_STREAM); s.settimeout(2); s.connect(addr)
        s.sendall(b"escaped"); print(name + "=CONNECTED")
    except OSError as e:
        print(name + "=blocked")
attempt("host_loopback", socket.AF_INET, ("127.0.0.1", {port}))
attempt("host_v6", socket.AF_INET6, ("::1", {port}))
attempt("public", socket.AF_INET, ("192.0.2.1", 80))
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.sendto(b"x", ("192.0.2.1", 53)); print("udp=SENT")
except OSError:
    print("udp=blocked")
try:
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
    def serve():
        conn, _ = srv.accept(); conn.sendall(conn.recv(10)); conn.close()
    threading.Thread(target=serve).start()
    cl = socket.create_connection(srv.getsockname(), timeout=2); cl.sendall(b"ping")
    print("inner=" + cl.recv(10).decode())
except OSError:
    print("inner=blocked")
a, b = socket.socketpair(); a.sendall(b"pair"); print("pair=" + b.recv(10).decode())
""",
        )
        got = results(r.stdout)
        assert got.get("pair") == "pair", (got, r.stderr)  # allow twin: local IPC works
        # its own loopback (netns), or no TCP bind at all: the host's loopback is shared
        assert got.get("inner") == ("ping" if c.has("netns") else "blocked"), got
        for key in ("host_loopback", "host_v6", "public", "udp"):
            assert got[key] == "blocked", got
        assert hits == []  # evidence from outside: the host listener saw nothing
    finally:
        srv.close()


def test_host_unix_sockets_are_unreachable(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    sockdir = c.base / "daemon"
    sockdir.mkdir()
    os.chmod(sockdir, 0o777)
    stream_path, dgram_path = str(sockdir / "api.sock"), str(sockdir / "log.sock")
    in_ws = str(ws / "dev.sock")
    stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stream.bind(stream_path)
    stream.listen(4)
    ws_stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ws_stream.bind(in_ws)
    ws_stream.listen(4)
    dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dgram.bind(dgram_path)
    for p in (stream_path, dgram_path, in_ws):
        os.chmod(p, 0o777)
    stream.settimeout(0.1)
    dgram.settimeout(0.1)
    try:
        r = run_py(
            c,
            ws,
            f"""
import socket
def tryit(name, fn):
    try:
        fn(); print(name + "=REACHED")
    except OSError as e:
        print(name + "=blocked")
def conn(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(path); s.sendall(b"escape")
def sendto(path):
    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"escape", path)
def sendmsg(path):
    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendmsg([b"escape"], [], 0, path)
tryit("stream", lambda: conn({stream_path!r}))
tryit("workspace_stream", lambda: conn({in_ws!r}))
tryit("dgram_sendto", lambda: sendto({dgram_path!r}))
tryit("dgram_sendmsg", lambda: sendmsg({dgram_path!r}))
try:
    import os
    inner = os.path.join(os.environ.get("TMPDIR", "/tmp"), "inner.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); srv.bind(inner)
    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendmsg([b"hi"], [], 0, inner)
    print("inner=" + srv.recv(10).decode())
except OSError:
    print("inner=blocked")
a, b = socket.socketpair(); a.sendall(b"pair"); print("pair=" + b.recv(10).decode())
""",
        )
        got = results(r.stdout)
        assert got.get("pair") == "pair", (got, r.stderr)  # allow twin
        # Unix sockets of its own where mounts hide the host's; none at all where
        # they cannot (landlock: Landlock does not govern connect() by path)
        assert got.get("inner") == ("hi" if c.has("mounts") else "blocked"), got
        for key in ("stream", "workspace_stream", "dgram_sendto", "dgram_sendmsg"):
            assert got[key] == "blocked", got
        for sock in (stream, ws_stream):  # evidence from outside: nobody connected
            sock.settimeout(0.1)
            try:
                sock.accept()
                raise AssertionError("a sandboxed process reached a host unix socket")
            except TimeoutError:
                pass
        try:
            data = dgram.recv(100)
            raise AssertionError(f"a datagram reached the host: {data!r}")
        except TimeoutError:
            pass
    finally:
        for s in (stream, ws_stream, dgram):
            s.close()


def test_another_users_private_socket_neither_fails_the_run_nor_is_reached(
    sandbox: tuple[Corral, Path],
) -> None:
    """A daemon of another user with its socket in its own 0700 directory: bwrap
    cannot mount a mask there (the run failed with exit 125 when corral ran as
    root), and the command cannot reach it anyway.  The twin: the same daemon's
    socket in a directory others may enter keeps its mask, and the run works."""
    c, ws = sandbox
    other = pwd.getpwnam("corral-test").pw_uid if c.who == "root" else 0
    private, public = c.base / "private-daemon", c.base / "public-daemon"
    for d, mode in ((private, 0o700), (public, 0o755)):
        d.mkdir()
        os.chown(d, other, other)
        os.chmod(d, mode)
    socks = []
    try:
        for d in (private, public):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(str(d / "api.sock"))
            os.chmod(d / "api.sock", 0o777)
            s.listen(4)
            s.settimeout(0.1)
            socks.append(s)
        r = run_py(
            c,
            ws,
            f"""
import socket
paths = {{"private": {str(private / "api.sock")!r}, "public": {str(public / "api.sock")!r}}}
for name, path in paths.items():
    try:
        socket.socket(socket.AF_UNIX).connect(path); print(name + "=REACHED")
    except OSError as e:
        print(name + "=" + type(e).__name__)
""",
        )
        assert r.returncode == 0, r.stderr
        got = results(r.stdout)
        assert got["private"] == "PermissionError", got  # the directory bars the way
        assert got["public"] in ("ConnectionRefusedError", "PermissionError"), got  # its mask
        for s in socks:
            with pytest.raises(TimeoutError):
                s.accept()
    finally:
        for s in socks:
            s.close()


def test_tiocsti_cannot_inject_into_the_terminal(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    master, slave = pty.openpty()
    os.chmod(os.ttyname(slave), 0o666)
    (ws / "probe.py").write_text("""
import fcntl, termios, sys
try:
    fcntl.ioctl(0, termios.TIOCSTI, b"X"); print("tiocsti=INJECTED")
except OSError as e:
    print("tiocsti=blocked")
fcntl.ioctl(0, termios.TCGETS, bytes(64)); print("tcgets=ok")
""")
    c.chown(ws / "probe.py")
    try:
        r = subprocess.run(
            c.argv(["run", "-q", "--", "python3", "probe.py"]),
            cwd=ws,
            env=c.env(),
            stdin=slave,
            capture_output=True,
            timeout=30,
        )
        got = results(r.stdout)
        assert got.get("tcgets") == "ok", (got, r.stderr)  # allow twin: the tty works
        assert got.get("tiocsti") == "blocked"
        os.set_blocking(master, False)
        try:
            typed = os.read(master, 100)
        except BlockingIOError:
            typed = b""
        assert b"X" not in typed
    finally:
        os.close(master)
        os.close(slave)


def test_the_accounts_own_home_is_masked_under_another_home(
    tsandbox: tuple[Corral, Path],
) -> None:
    """corral runs here with HOME set to a directory of the test's (as a Ray node or
    a service may start it).  The default masks followed $HOME alone, and the
    account's real ~/.ssh, shell history and tokens were readable.  Both homes
    are masked now.  The twin: a file of the same name in the workspace reads."""
    import pwd

    c, ws = tsandbox
    home = Path(pwd.getpwuid(c.uid).pw_dir)
    assert home != c.home  # the case under test
    token = home / ".vault-token"
    # corral's own state there (another run's activity log, home layers): masked too
    log = home / ".local" / "state" / "corral" / "runs.jsonl"
    made: list[Path] = []
    for directory in (home, *reversed(log.parents[:4])):
        if not directory.exists():
            directory.mkdir()
            os.chown(directory, c.uid, c.gid)
            made.append(directory)
    for path in (token, log):
        if not path.exists():
            path.write_text("not for this sandbox\n")
            os.chown(path, c.uid, c.gid)
            made.append(path)
    try:
        (ws / ".vault-token").write_text("mine\n")
        c.chown(ws)
        r = c.sh(
            ws,
            f"for f in {token} {log}; do cat $f >/dev/null 2>&1 && echo read || echo refused; "
            "done; cat .vault-token",
        )
        assert r.stdout.decode().split() == ["refused", "refused", "mine"], r
    finally:
        for path in reversed(made):
            path.unlink() if path.is_file() else path.rmdir()
