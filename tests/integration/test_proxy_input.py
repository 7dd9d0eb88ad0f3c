"""Hostile input against the real proxy processes: ``corral proxy serve`` and a run's door.

Raw bytes from real sockets; evidence from logging origins on 127.0.0.1 (and
::1) that record every connection and request, and from the proxy process's
own /proc status for memory.  Every deny has its allow twin under the same
policy.  No name used here is sent to a DNS server: names are pinned
(``[network] hosts``), refused before any lookup, or ``localhost``, which this
host's resolver answers from /etc/hosts.

The name battery on every path, with a logging resolver injected into the
proxy, is tests/unit/test_net_input.py; this file shows the same fixes in the
processes users run.
"""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Corral, wait_for
from test_network import CURL, HTTP_PROXY, Origin, origins  # noqa: F401  (fixture)

MiB = 1024 * 1024


class StreamingOrigin:
    """An HTTP/1.1 origin that never holds a body: it counts what streams in.

    ``POST`` bodies (Content-Length or chunked) are read in 1 MiB pieces and
    only counted; ``GET /chunk/N`` answers with one chunk of N bytes, written
    in 1 MiB pieces.  ``seen`` lists (method, path, body bytes)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.create_server((host, port), family=family)
        self.port = self.listener.getsockname()[1]
        self.seen: list[tuple[str, str, int]] = []
        self.accepts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepts += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as f:
            try:
                while self._one(conn, f):
                    pass
            except (OSError, ValueError):
                pass

    def _one(self, conn: socket.socket, f: object) -> bool:
        read_line = f.readline  # type: ignore[attr-defined]
        line = read_line(65536)
        if not line:
            return False
        method, path, _ = line.decode("latin-1").split(" ", 2)
        headers = {}
        while (h := read_line(65536)) not in (b"\r\n", b""):
            name, _, value = h.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        size = self._body(f, headers)
        self.seen.append((method, path, size))
        if path.startswith("/chunk/"):
            n = int(path.rsplit("/", 1)[1])
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n" % n)
            piece = b"d" * MiB
            for at in range(0, n, MiB):
                conn.sendall(piece[: min(MiB, n - at)])
            conn.sendall(b"\r\n0\r\n\r\n")
        else:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 18\r\n\r\nhello from origin\n")
        return headers.get("connection") != "close"

    @staticmethod
    def _body(f: object, headers: dict[str, str]) -> int:
        read, read_line = f.read, f.readline  # type: ignore[attr-defined]
        if headers.get("transfer-encoding") == "chunked":
            total = 0
            while True:
                size = int(read_line(1024).split(b";")[0], 16)
                if size == 0:
                    while read_line(65536) not in (b"\r\n", b""):
                        pass
                    return total
                left = size
                while left:
                    got = len(read(min(MiB, left)))
                    if not got:
                        raise ValueError("body ended early")
                    left -= got
                total += size
                read(2)
        length = int(headers.get("content-length", "0"))
        left = length
        while left:
            left -= len(read(min(MiB, left)))
        return length


@pytest.fixture
def streaming() -> Iterator[StreamingOrigin]:
    origin = StreamingOrigin()
    try:
        yield origin
    finally:
        origin.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Serve:
    """A running ``corral proxy serve`` with one worker (its pid is the worker's)."""

    def __init__(self, c: Corral, ws: Path, policy: str) -> None:
        self.stderr = b""
        path = ws / "proxy.toml"
        path.write_text(policy.replace("[network]\n", '[network]\nmode = "proxy"\n'))
        c.chown(path)
        self.port = free_port()
        self.proc = c.popen(
            [
                "proxy",
                "serve",
                "--policy",
                str(path),
                "--listen",
                f"127.0.0.1:{self.port}",
                "--workers",
                "1",
            ],
            cwd=ws,
            stderr=subprocess.PIPE,
        )
        if not wait_for(self._listening, 10):
            self.stop()
            raise AssertionError(f"corral proxy serve did not start: {self.stderr!r}")

    def _listening(self) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=30)

    def socks5(self, name: bytes, port: int) -> tuple[int, socket.socket]:
        s = self.connect()
        s.sendall(b"\x05\x01\x00")
        assert s.recv(2) == b"\x05\x00"
        s.sendall(b"\x05\x01\x00\x03" + bytes([len(name)]) + name + struct.pack("!H", port))
        reply = _exactly(s, 10)
        return reply[1], s

    def hwm_kib(self) -> int:
        """The worker's peak resident memory so far (VmHWM), in KiB."""
        with open(f"/proc/{self.proc.pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        raise AssertionError("no VmHWM")

    def stop(self) -> None:
        if self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=15)
        self.stderr = err or b""


Start = Callable[[str], Serve]


@pytest.fixture
def serve(sandbox: tuple[Corral, Path]) -> Iterator[Start]:
    """A factory: serve(policy_text) -> a running Serve, stopped at the end (and
    checked: no traceback on its terminal)."""
    c, ws = sandbox
    started: list[Serve] = []

    def start(policy: str) -> Serve:
        s = Serve(c, ws, policy)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()
        assert s.proc.returncode == 0, s.stderr
        assert b"Traceback" not in s.stderr, s.stderr


def _exactly(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    return data


def _get(s: socket.socket, path: str = "/", host: str = "x") -> bytes:
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


# -- one name: the SOCKS5 NUL exploit and a pinned name in another spelling --------------------


def test_socks5_nul_name_cannot_dial_a_host_no_rule_names(
    serve: Start,
    origins: tuple[Origin, Origin],  # noqa: F811
) -> None:
    ok, _ = origins
    proxy = serve(
        "[network]\n"
        f'allow = ["*.wild.test", "127.0.0.1:{ok.port}"]\n'
        'hosts = { "good.wild.test" = "127.0.0.1" }\n'
    )
    # Before the fix the rule saw "*.wild.test" and the C resolver read up to the NUL:
    # "localhost", which /etc/hosts answers with 127.0.0.1, and the origin was reached.
    code, s = proxy.socks5(b"localhost\x00.wild.test", ok.port)
    assert code == 0x01 and s.recv(1) == b""
    assert ok.hits == []
    code, s = proxy.socks5(b"good.wild.test", ok.port)  # twin: the rule's own name
    assert code == 0x00 and b"hello from origin" in _get(s, "/good", "good.wild.test")
    assert ok.hits == [("GET", "/good")]


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.fixture
def twin_origins() -> Iterator[tuple[StreamingOrigin, StreamingOrigin]]:
    """The same port on 127.0.0.1 and ::1: which one answers tells which path a name took."""
    if not _ipv6_loopback():
        pytest.skip("no IPv6 loopback on this machine: the ::1 origin cannot exist")
    for _ in range(20):
        v4 = StreamingOrigin("127.0.0.1")
        try:
            v6 = StreamingOrigin("::1", v4.port)
        except OSError:
            v4.close()
            continue
        try:
            yield v4, v6
        finally:
            v4.close()
            v6.close()
        return
    pytest.fail("no port free on both 127.0.0.1 and ::1")


FULL_WIDTH_LOCALHOST = "".join(chr(ord(c) + 0xFEE0) for c in "localhost").encode()


def test_a_pinned_name_in_full_width_letters_is_dialled_as_pinned_not_resolved(
    serve: Start, twin_origins: tuple[StreamingOrigin, StreamingOrigin]
) -> None:
    v4, v6 = twin_origins
    port = v4.port
    proxy = serve(
        "[network]\n"
        f'allow = ["localhost:{port}", "[::1]:{port}", "127.0.0.1:{port}"]\n'
        'hosts = { "localhost" = "::1" }\n'
    )
    # pinned to ::1; the host's resolver would say 127.0.0.1 (/etc/hosts)
    code, s = proxy.socks5(FULL_WIDTH_LOCALHOST, port)
    assert code == 0 and b"hello from origin" in _get(s, "/socks", "localhost")
    s = proxy.connect()
    s.sendall(b"GET http://" + FULL_WIDTH_LOCALHOST + b":%d/http HTTP/1.1\r\n\r\n" % port)
    assert b"hello from origin" in s.recv(4096)
    assert [p for _, p, _ in v6.seen] == ["/socks", "/http"]
    assert v4.seen == [] and v4.accepts == 0  # never resolved, so never 127.0.0.1
    code, s = proxy.socks5(b"127.0.0.1", port)  # twin: the other origin is reachable
    assert code == 0 and b"hello from origin" in _get(s, "/v4")
    assert [p for _, p, _ in v4.seen] == ["/v4"]


# -- bounded memory ------------------------------------------------------------------------------

HUGE = 256 * MiB
CEILING_KIB = 64 * 1024  # a worker may grow by this much at most while HUGE bytes pass


@pytest.mark.slow
def test_a_huge_chunk_streams_through_a_worker_in_bounded_memory(
    serve: Start, streaming: StreamingOrigin
) -> None:
    proxy = serve(f'[network]\nallow = ["127.0.0.1:{streaming.port}"]\n')
    base = f"http://127.0.0.1:{streaming.port}"
    with proxy.connect() as s:  # warm up: the worker's imports and buffers are in place
        s.sendall(f"GET {base}/warm HTTP/1.1\r\nConnection: close\r\n\r\n".encode())
        while s.recv(65536):
            pass
    before = proxy.hwm_kib()
    with proxy.connect() as s:  # up: one chunk of 256 MiB in a request body
        s.sendall(
            f"POST {base}/up HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n".encode() % HUGE
        )
        piece = b"u" * MiB
        for _ in range(HUGE // MiB):
            s.sendall(piece)
        s.sendall(b"\r\n0\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200 ")
    with proxy.connect() as s:  # down: one chunk of 256 MiB in a response body
        s.sendall(f"GET {base}/chunk/{HUGE} HTTP/1.1\r\nConnection: close\r\n\r\n".encode())
        received = 0
        while chunk := s.recv(4 * MiB):
            received += len(chunk)
    grown = proxy.hwm_kib() - before
    assert ("POST", "/up", HUGE) in streaming.seen  # the whole body arrived
    assert received > HUGE  # and the whole response (plus its framing)
    assert grown < CEILING_KIB, f"the worker grew by {grown} KiB while 2 x 256 MiB passed"


# -- internal frames and a tunnel open at the end, on every tier -------------------------------

FRAMES = """
import os, socket, struct, sys
port = int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1])
origin = int(sys.argv[1])
def ask(data):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(data)
    out = s.recv(64)
    s.close()
    return out
query = struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 0) + b"\\x09localhost\\x00\\x00\\x01\\x00\\x01"
print("dns", ask(b"\\xfd" + struct.pack("!H", len(query)) + query)[:12])
capture = b"\\xfe127.0.0.1 %d\\nGET /captured HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n\\r\\n" % origin
print("capture", ask(capture)[:12])
"""


def test_relay_frames_from_the_sandbox_are_refused_with_400(
    tsandbox: tuple[Corral, Path],
    origins: tuple[Origin, Origin],  # noqa: F811
) -> None:
    """A run that is not transparent takes no relay frames at its proxy port: on the
    landlock tier that port is TCP, reachable by any local process."""
    c, ws = tsandbox
    ok, _ = origins
    (ws / "frames.py").write_text(FRAMES)
    c.chown(ws / "frames.py")
    r = c.sh(
        ws,
        f"python3 frames.py {ok.port}; {CURL} {HTTP_PROXY} http://127.0.0.1:{ok.port}/plain",
        "--allow",
        f"127.0.0.1:{ok.port}",
    )
    out = r.stdout.decode()
    assert "dns b'HTTP/1.1 400'" in out, (out, r.stderr)
    assert "capture b'HTTP/1.1 400'" in out
    assert "hello from origin" in out  # twin: the same port forwards plain HTTP
    assert ok.hits == [("GET", "/plain")]


class Holder:
    """An origin that accepts, reads until EOF and then keeps its side open."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.got = b""
        self.held: list[socket.socket] = []
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.held.append(conn)
            while chunk := conn.recv(4096):
                self.got += chunk
                conn.sendall(b"got it")

    def close(self) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()


TUNNEL = """
import os, socket, sys
port = int(os.environ["HTTPS_PROXY"].rsplit(":", 1)[1])
s = socket.create_connection(("127.0.0.1", port), timeout=10)
s.sendall(b"CONNECT 127.0.0.1:%s HTTP/1.1\\r\\n\\r\\n" % sys.argv[1].encode())
print("tunnel", s.recv(64).split(b"\\r\\n")[0].decode())
s.sendall(b"through the tunnel")
print("holder", s.recv(64).decode())
"""  # and exit with the tunnel open, as npm leaves its keep-alive tunnels


def test_a_run_ending_with_a_tunnel_open_prints_no_traceback(
    tsandbox: tuple[Corral, Path],
) -> None:
    c, ws = tsandbox
    holder = Holder()
    try:
        (ws / "tunnel.py").write_text(TUNNEL)
        c.chown(ws / "tunnel.py")
        r = c.sh(ws, f"python3 tunnel.py {holder.port}", "--allow", f"127.0.0.1:{holder.port}")
        assert r.returncode == 0, r.stderr
        assert "tunnel HTTP/1.1 200 Connection Established" in r.stdout.decode()
        assert "holder got it" in r.stdout.decode()
        assert holder.got == b"through the tunnel"
    finally:
        holder.close()
    assert b"Traceback" not in r.stderr and b"Error" not in r.stderr, r.stderr
    runs = (c.state / "corral" / "runs.jsonl").read_text().splitlines()
    assert json.loads(runs[-1])["proxy_errors"] == 0


def test_proxy_serve_prints_no_traceback_when_stopped_with_a_tunnel_open(serve: Start) -> None:
    holder = Holder()
    try:
        proxy = serve(f'[network]\nallow = ["127.0.0.1:{holder.port}"]\n')
        s = proxy.connect()
        s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % holder.port)
        assert s.recv(64).startswith(b"HTTP/1.1 200")
        s.sendall(b"held")
        assert s.recv(64) == b"got it"
        s.shutdown(socket.SHUT_WR)
        time.sleep(0.1)
        proxy.stop()  # the fixture checks its stderr once more; here it is explicit
        assert proxy.proc.returncode == 0
        assert b"Traceback" not in proxy.stderr and b"Error" not in proxy.stderr, proxy.stderr
    finally:
        holder.close()
