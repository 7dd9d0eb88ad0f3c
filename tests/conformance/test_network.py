"""Network: direct TCP, UDP and IPv6, DNS, raw sockets, host unix sockets, proxy
bypass and forbidden hosts through the proxy.

Every target is on the host's loopback (127.0.0.1 or ::1), and every verdict is
what the host-side listener or origin received.  The allow twin in each case
uses the same policy: the sandbox's own loopback for the no-network default,
the allowed origin through the proxy when a host is allowed.
"""

# Probe programs are embedded one statement per line; wrapping them hurts more than long lines.
# ruff: noqa: E501

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from .conftest import Box, Listener, Origin

CURL = "curl -sS --noproxy '' --max-time 10"


def _inner_loopback(box: Box, family: str = "AF_INET", host: str = "127.0.0.1") -> str:
    """Probe code for the allow twin: a server and client on the sandbox's own
    loopback; on a tier without a network namespace (no TCP bind at all) the
    local channel left to it, a socket pair."""
    if not box.has("netns"):
        return (
            "a, b = socket.socketpair(); a.sendall(b'ping'); print('twin=' + b.recv(10).decode())\n"
        )
    return (
        "import threading\n"
        f"srv = socket.socket(socket.{family}); srv.bind(({host!r}, 0)); srv.listen(1)\n"
        "def serve():\n    c_, _ = srv.accept(); c_.sendall(c_.recv(10)); c_.close()\n"
        "threading.Thread(target=serve).start()\n"
        f"cl = socket.socket(socket.{family}); cl.settimeout(3); cl.connect(srv.getsockname()[:2])\n"
        "cl.sendall(b'ping'); print('twin=' + cl.recv(10).decode())\n"
    )


@pytest.fixture
def tcp4() -> Iterator[Listener]:
    lst = Listener(socket.AF_INET, socket.SOCK_STREAM, "127.0.0.1")
    yield lst
    lst.close()


def test_direct_tcp(box: Box, tcp4: Listener) -> None:
    r = box.py(
        f"s = socket.socket(); s.settimeout(2)\n"
        f"attempt('attack', lambda: (s.connect(('127.0.0.1', {tcp4.port})), s.sendall(b'escaped'))[1])\n"
        + _inner_loopback(box)
    )
    assert r.got.get("twin") == "ping", r
    assert tcp4.hits == [], r


def test_direct_udp(box: Box) -> None:
    lst = Listener(socket.AF_INET, socket.SOCK_DGRAM, "127.0.0.1")
    try:
        r = box.py(
            f"attempt('attack', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'escaped', ('127.0.0.1', {lst.port})))\n"
            + (
                "a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); a.bind(('127.0.0.1', 0))\n"
                "socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'inner', a.getsockname())\n"
                if box.has("netns")
                else "a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET); b.send(b'inner')\n"
            )
            + "a.settimeout(2); print('twin=' + a.recv(10).decode())\n"
        )
        import time

        time.sleep(0.3)  # a datagram that escaped would be here by now
        assert r.got.get("twin") == "inner", r
        assert lst.hits == [], r
    finally:
        lst.close()


def test_direct_ipv6(box: Box) -> None:
    if not socket.has_ipv6 or not os.path.exists("/proc/net/if_inet6"):
        pytest.skip("N.A.: the host has no IPv6")
    try:
        lst = Listener(socket.AF_INET6, socket.SOCK_STREAM, "::1")
    except OSError as exc:
        pytest.skip(f"N.A.: cannot listen on [::1] on the host: {exc}")
    try:
        r = box.py(
            "s = socket.socket(socket.AF_INET6); s.settimeout(2)\n"
            f"attempt('attack', lambda: (s.connect(('::1', {lst.port})), s.sendall(b'escaped'))[1])\n"
            + _inner_loopback(box)
        )
        assert r.got.get("twin") == "ping", r
        assert lst.hits == [], r
    finally:
        lst.close()


def test_dns(box: Box) -> None:
    """No name reaches a resolver: neither through libc nor by a raw query to :53."""
    try:
        lst = Listener(socket.AF_INET, socket.SOCK_DGRAM, "127.0.0.1", 53)
    except OSError as exc:
        pytest.skip(f"N.A.: 127.0.0.1:53 is not free on the host for a fake resolver: {exc}")
    query = (
        b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x06canary\x04test\x00\x00\x01\x00\x01"
    )
    try:
        r = box.py(
            f"attempt('resolve', lambda: socket.getaddrinfo('canary-{box.token}.test', 80))\n"
            f"attempt('raw_query', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto({query!r}, ('127.0.0.1', 53)))\n"
            "attempt('twin', lambda: socket.getaddrinfo('localhost', 80)[0][4][0])\n"
        )
        import time

        time.sleep(0.3)
        assert r.got.get("twin", "").startswith("ok:"), r  # twin: /etc/hosts names resolve
        assert r.denied("resolve"), r
        assert lst.hits == [], r
    finally:
        lst.close()


def test_raw_sockets(box: Box) -> None:
    r = box.py(
        "attempt('raw_icmp', lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close())\n"
        "attempt('raw_tcp', lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP).close())\n"
        "attempt('packet', lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close())\n"
        "attempt('netlink', lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close())\n"
        "attempt('twin', lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close())\n"
    )
    assert r.ok("twin"), r
    for name in ("raw_icmp", "raw_tcp", "packet", "netlink"):
        assert r.denied(name), (name, r)


def test_host_unix_socket(box: Box) -> None:
    sockdir = box.c.base / "daemon"
    sockdir.mkdir()
    os.chmod(sockdir, 0o777)
    path = str(sockdir / "api.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    os.chmod(path, 0o777)
    srv.listen(4)
    srv.settimeout(0.3)
    try:
        r = box.py(
            f"attempt('attack', lambda: socket.socket(socket.AF_UNIX).connect({path!r}))\n"
            "a, b = socket.socketpair(); a.sendall(b'pair'); print('twin=' + b.recv(10).decode())\n"
        )
        assert r.got.get("twin") == "pair", r
        with pytest.raises(TimeoutError):
            srv.accept()  # evidence: nobody connected
    finally:
        srv.close()


def test_host_unix_datagram_socket(box: Box) -> None:
    """A datagram sent to a host socket by its path (a syslog's /dev/log): from a
    datagram socket of a pair too, which can send to, or connect to, any path."""
    sockdir = box.c.base / "dgdaemon"
    sockdir.mkdir()
    os.chmod(sockdir, 0o777)
    path = str(sockdir / "log.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(path)
    os.chmod(path, 0o777)
    srv.settimeout(0.3)
    try:
        r = box.py(
            f"attempt('own', lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b'escaped', {path!r}))\n"
            "def from_pair():\n"
            "    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
            f"    a.sendto(b'escaped', {path!r})\n"
            "def connected():\n"
            "    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
            f"    a.connect({path!r}); a.send(b'escaped')\n"
            "attempt('pair', from_pair)\n"
            "attempt('connected', connected)\n"
            "a, b = socket.socketpair(); a.sendall(b'pair'); print('twin=' + b.recv(10).decode())\n"
        )
        assert r.got.get("twin") == "pair", r
        with pytest.raises(TimeoutError):
            srv.recv(100)  # evidence: no datagram arrived
    finally:
        srv.close()


def test_listen_without_bind(box: Box) -> None:
    """listen() on a socket never bound: the kernel binds it to a free port on every
    address; where the sandbox shares the host's network, a port opened to the
    world.  Evidence: the host cannot connect to the port the sandbox saw."""
    proc = box.popen(
        "s = socket.socket()\n"
        "attempt('listen', lambda: (s.listen(1), s.getsockname()[1])[1])\n"
        "sys.stdout.flush(); time.sleep(3)\n"
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        port = int(line.split(":")[-1]) if line.startswith("listen=ok") else 0
        if port:
            with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), 1):
                pass
        assert line.startswith("listen="), (line, proc)
    finally:
        proc.kill()
        proc.communicate()
    r = box.py(_inner_loopback(box))  # twin: what the sandbox may do locally works
    assert r.got.get("twin") == "ping", r


def test_abstract_unix_socket(box: Box) -> None:
    name = f"\0corral-conformance-{box.token}"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(name)
    srv.listen(4)
    srv.settimeout(0.3)
    try:
        r = box.py(
            f"attempt('attack', lambda: socket.socket(socket.AF_UNIX).connect({name!r}))\n"
            + (
                f"inner = socket.socket(socket.AF_UNIX); inner.bind('\\0inner-{box.token}')\n"
                f"inner.listen(1); cl = socket.socket(socket.AF_UNIX); cl.connect('\\0inner-{box.token}')\n"
                "conn, _ = inner.accept(); cl.sendall(b'abs'); print('twin=' + conn.recv(10).decode())\n"
                if box.has("netns")  # abstract names are per network namespace
                else "a, b = socket.socketpair(); a.sendall(b'abs'); print('twin=' + b.recv(10).decode())\n"
            )
        )
        assert r.got.get("twin") == "abs", r
        with pytest.raises(TimeoutError):
            srv.accept()
    finally:
        srv.close()


def test_proxy_bypass(box: Box, origins: tuple[Origin, Origin]) -> None:
    """With one host port allowed, a direct connection to another goes nowhere.  (The
    allowed one is served at its own address, through the proxy, on tiers with a
    network namespace: tests/integration/test_host_services.py.)"""
    ok, bad = origins
    r = box.py(
        "import subprocess\n"
        f"s = socket.socket(); s.settimeout(2)\n"
        f"attempt('attack', lambda: (s.connect(('127.0.0.1', {bad.port})), s.sendall(b'GET /direct HTTP/1.0\\r\\n\\r\\n'))[1])\n"
        f"p = subprocess.run(['sh', '-c', \"{CURL} -x $HTTP_PROXY http://127.0.0.1:{ok.port}/via-proxy\"], capture_output=True, text=True)\n"
        "print('twin=' + p.stdout.strip())\n",
        "--allow",
        f"127.0.0.1:{ok.port}",
    )
    assert r.got.get("twin") == "hello from origin", r
    assert ok.hits == ["/via-proxy"], r  # the proxied request arrived
    assert bad.hits == [], r  # evidence: the direct one did not


def _through_proxy(box: Box, ok: Origin, bad: Origin, how: str) -> None:
    via = {
        "http": "-x $HTTP_PROXY",
        "connect": "-p -x $HTTP_PROXY",
        "socks5": "-x $SOCKS_PROXY",
    }[how]
    r = box.py(
        "import subprocess\n"
        "def get(url):\n"
        f"    return subprocess.run(['sh', '-c', \"{CURL} {via} \" + url], capture_output=True, text=True).stdout.strip()\n"
        f"print('attack=' + repr(get('http://127.0.0.1:{bad.port}/forbidden')))\n"
        f"print('twin=' + get('http://127.0.0.1:{ok.port}/allowed'))\n",
        "--allow",
        f"127.0.0.1:{ok.port}",
    )
    assert r.got.get("twin") == "hello from origin", r
    assert ok.hits == ["/allowed"], r
    assert bad.hits == [], r  # evidence: the forbidden origin saw nothing


def test_forbidden_host_http_proxy(box: Box, origins: tuple[Origin, Origin]) -> None:
    _through_proxy(box, *origins, "http")


def test_forbidden_host_connect_tunnel(box: Box, origins: tuple[Origin, Origin]) -> None:
    _through_proxy(box, *origins, "connect")


def test_forbidden_host_socks5(box: Box, origins: tuple[Origin, Origin]) -> None:
    _through_proxy(box, *origins, "socks5")


def test_name_rebinding_to_loopback(box: Box, origins: tuple[Origin, Origin]) -> None:
    """An allowed *name* that resolves to loopback is refused; the address allowed works."""
    ok, bad = origins
    r = box.py(
        "import subprocess\n"
        "def get(url):\n"
        f"    return subprocess.run(['sh', '-c', \"{CURL} -x $HTTP_PROXY \" + url], capture_output=True, text=True).stdout.strip()\n"
        f"print('attack=' + repr(get('http://localhost:{bad.port}/by-name')))\n"
        f"print('twin=' + get('http://127.0.0.1:{ok.port}/by-address'))\n",
        "--allow",
        f"localhost:{bad.port}",
        "--allow",
        f"127.0.0.1:{ok.port}",
    )
    assert r.got.get("twin") == "hello from origin", r
    assert bad.hits == [], r
    assert "rebinding" in r.got.get("attack", ""), r
