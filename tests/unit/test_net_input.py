"""The proxy's input, hostile bytes on every path, judged by a logging origin and resolver.

The real ``Proxy`` runs on a loop in this process with a *logging resolver*
injected in place of getaddrinfo: it records every name the proxy asks it for
and answers from a table (127.0.0.1 / ::1 only), so "never sent to DNS" is
what the resolver saw, not a guess, and no query leaves the machine.  The
origin (tests/unit/test_net_proxy_unit.py) records every connection and
request.  Each deny has an allow twin under the same rules: the correctly
spelled name reaches the origin by the same path.

Paths: HTTP absolute-form, CONNECT, SOCKS5 domain names, transparent mode's
capture port (connections named by Host or by TLS SNI; where each was going
comes from a stand-in for netfilter), and DNS frames through a unix door that
takes corral's relay frames.
"""

from __future__ import annotations

import json
import socket
import struct
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypedDict, Unpack

import pytest
from test_net_proxy_unit import (
    Origin,
    ipv6_loopback_available,
    read_response,
    run,
    socks_hello,
    socks_ipv4,
    socks_request,
)

from corral.net import aio, names
from corral.net.audit import Audit
from corral.net.hooks import Chain, Destination, Hook, HostRulesHook
from corral.net.proxy import Proxy
from corral.net.rules import HostRules, Verdict

RUN_ID = "run-input"


class LoggingResolver:
    """Stands in for getaddrinfo: records each name asked, answers from a table."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        if host not in self.table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [self.table[host]]


class World:
    def __init__(
        self,
        origin: Origin,
        proxy: Proxy,
        resolver: LoggingResolver,
        port: int,
        door: str,
        capture_port: int,
    ) -> None:
        self.origin = origin
        self.proxy = proxy
        self.resolver = resolver
        self.port = port  # the proxy's TCP listener: no relay frames there
        self.door = door  # a unix door that takes the relay's frames
        # transparent mode's capture port: every connection "was going" to the origin
        self.capture_port = capture_port
        self.audit_path = Path(door).with_name("net.jsonl")
        self.clients: list[aio.StreamWriter] = []

    async def tcp(self) -> tuple[aio.StreamReader, aio.StreamWriter]:
        reader, writer = await aio.open_connection("127.0.0.1", self.port)
        self.clients.append(writer)
        return reader, writer

    async def capture(self) -> tuple[aio.StreamReader, aio.StreamWriter]:
        reader, writer = await aio.open_connection("127.0.0.1", self.capture_port)
        self.clients.append(writer)
        return reader, writer

    async def unix(self) -> tuple[aio.StreamReader, aio.StreamWriter]:
        reader, writer = await aio.open_unix_connection(self.door)
        self.clients.append(writer)
        return reader, writer

    def audit(self) -> list[dict[str, Any]]:
        self.proxy.audit.flush()
        if not self.audit_path.exists():
            return []
        return [json.loads(line) for line in self.audit_path.read_text().splitlines()]

    async def decided(self, decision: str, count: int = 1) -> list[dict[str, Any]]:
        """The audit lines with this decision, once there are ``count`` (a tunnel's
        line is written when it ends)."""
        for _ in range(300):
            lines = [e for e in self.audit() if e["decision"] == decision]
            if len(lines) >= count:
                return lines
            await aio.sleep(0.01)
        return [e for e in self.audit() if e["decision"] == decision]


class Timeouts(TypedDict, total=False):
    """The Proxy's keyword timeouts a world may shorten."""

    idle_timeout: float
    head_timeout: float


@asynccontextmanager
async def world(
    tmp_path: Path,
    allow: list[str],
    table: dict[str, str] | None = None,
    hosts: dict[str, str] | None = None,
    origin_host: str = "127.0.0.1",
    hooks: list[Hook] | None = None,
    stand_in: str | None = None,
    **timeouts: Unpack[Timeouts],
) -> AsyncIterator[World]:
    """``stand_in``: captured connections were going to the stand-in address the
    resolver handed out for that name (else to the origin's own address)."""
    here = Path(tempfile.mkdtemp(dir=tmp_path))
    origin = await Origin(origin_host).start()
    rules = HostRules.parse([a.format(port=origin.port) for a in allow], [])
    resolver = LoggingResolver(table or {})
    audit = Audit(str(here / "net.jsonl"))
    chain = Chain([HostRulesHook(rules), *(hooks or [])])
    # a transparent run's proxy: DNS answers are stand-ins
    proxy = Proxy(chain, audit, hosts, resolver, stand_ins=True, **timeouts)
    tcp = await proxy.serve_tcp("127.0.0.1", 0, RUN_ID)
    door = str(here / "door.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(door)
    sock.listen(16)
    unix = await proxy.serve_unix(sock, RUN_ID)
    listener = socket.create_server(("127.0.0.1", 0))

    def original(_sock: object) -> tuple[str, int]:
        address = proxy.pool(RUN_ID).address_for(stand_in) if stand_in else "127.0.0.1"
        return address, origin.port

    capture = await proxy.serve_capture(listener, RUN_ID, original=original)
    w = World(
        origin,
        proxy,
        resolver,
        tcp.sockets[0].getsockname()[1],
        door,
        listener.getsockname()[1],
    )
    try:
        yield w
    finally:
        for client in w.clients:
            client.close()
        tcp.close()
        unix.close()
        capture.close()
        origin.close()
        audit.close()


# -- the paths a name can take ------------------------------------------------------------


def full_width(text: str) -> bytes:
    """``text`` in full-width letters and digits (U+FF01..), as UTF-8."""
    return "".join(chr(ord(c) + 0xFEE0) for c in text).encode()


class Outcome:
    def __init__(self, reached: bool, answer: object) -> None:
        self.reached = reached  # the origin answered this client through the proxy
        self.answer = answer  # HTTP status, SOCKS reply code, DNS rcode, or "closed"

    def __repr__(self) -> str:
        return f"Outcome(reached={self.reached}, answer={self.answer!r})"


async def _through(reader: aio.StreamReader, writer: aio.StreamWriter, name: bytes) -> bool:
    """One GET inside an open tunnel (its Host the tunnel's name, as clients send);
    then close it, so that its audit line is written."""
    writer.write(b"GET /named HTTP/1.1\r\nHost: " + name + b"\r\nConnection: close\r\n\r\n")
    response = await read_response(reader)
    writer.close()
    return response.status == 200 and b"hello from origin" in response.body


async def via_http(w: World, name: bytes) -> Outcome:
    reader, writer = await w.tcp()
    port = str(w.origin.port).encode()
    writer.write(b"GET http://" + name + b":" + port + b"/named HTTP/1.1\r\nHost: x\r\n\r\n")
    response = await read_response(reader)
    return Outcome(
        response.status == 200 and b"hello from origin" in response.body, response.status
    )


async def via_connect(w: World, name: bytes) -> Outcome:
    reader, writer = await w.tcp()
    writer.write(b"CONNECT " + name + b":%d HTTP/1.1\r\n\r\n" % w.origin.port)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    if status != 200:
        return Outcome(False, status)
    return Outcome(await _through(reader, writer, name), status)


async def via_socks5(w: World, name: bytes) -> Outcome:
    reader, writer = await w.tcp()
    await socks_hello(reader, writer)
    writer.write(b"\x05\x01\x00\x03" + bytes([len(name)]) + name + struct.pack("!H", w.origin.port))
    reply = await reader.readexactly(10)
    if reply[1] != 0:
        return Outcome(False, reply[1])
    return Outcome(await _through(reader, writer, name), 0)


def capture_frame(port: int) -> bytes:
    """What corral's relay once sent for a captured connection to 127.0.0.1:PORT;
    the proxy now reads that from netfilter, and this is a frame on no door."""
    return b"\xfe" + b"127.0.0.1 %d\n" % port


async def via_transparent_host(w: World, name: bytes) -> Outcome:
    reader, writer = await w.capture()
    writer.write(b"GET /named HTTP/1.1\r\nHost: " + name + b"\r\nConnection: close\r\n\r\n")
    data = await reader.read()
    writer.close()  # the tunnel ends, and its audit line is written
    if not data:
        return Outcome(False, "closed")
    status = int(data.split(b" ")[1])
    return Outcome(status == 200 and b"hello from origin" in data, status)


def client_hello(server_name: bytes) -> bytes:
    """A minimal TLS 1.2 ClientHello carrying one SNI host name."""
    sni = struct.pack("!HBH", len(server_name) + 3, 0, len(server_name)) + server_name
    extensions = struct.pack("!HH", 0, len(sni)) + sni
    body = (
        b"\x03\x03"
        + b"\x00" * 32
        + b"\x00"  # no session id
        + b"\x00\x02\x13\x01"  # one cipher suite
        + b"\x01\x00"  # null compression
        + struct.pack("!H", len(extensions))
        + extensions
    )
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack("!H", len(handshake)) + handshake


async def via_transparent_sni(w: World, name: bytes) -> Outcome:
    before = w.origin.accepts
    reader, writer = await w.capture()
    writer.write(client_hello(name))
    # Refused: the proxy closes (nothing to say to TLS).  Allowed: the origin accepts.
    for _ in range(200):
        if w.origin.accepts > before:
            writer.close()  # the tunnel ends, and its audit line is written
            return Outcome(True, "spliced")
        try:
            if await aio.wait_for(reader.read(1), 0.01) == b"":
                return Outcome(False, "closed")
        except TimeoutError:
            pass
    return Outcome(False, "nothing")


def dns_query(name: bytes, ident: int = 0x1234) -> bytes:
    if name.endswith(b"."):
        name = name[:-1]
    labels = b"".join(bytes([len(label)]) + label for label in name.split(b"."))
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + labels + b"\x00\x00\x01\x00\x01"


async def dns_frame(w: World, packet: bytes) -> bytes:
    reader, writer = await w.unix()
    writer.write(b"\xfd" + struct.pack("!H", len(packet)) + packet)
    (size,) = struct.unpack("!H", await reader.readexactly(2))
    return await reader.readexactly(size)


async def via_dns(w: World, name: bytes) -> Outcome:
    reply = await dns_frame(w, dns_query(name))
    rcode = reply[3] & 0x0F
    answers = struct.unpack("!H", reply[6:8])[0]
    return Outcome(rcode == 0 and answers == 1, rcode)


Path_ = Callable[[World, bytes], Awaitable[Outcome]]
PATHS: dict[str, Path_] = {
    "http": via_http,
    "connect": via_connect,
    "socks5": via_socks5,
    "transparent-host": via_transparent_host,
    "transparent-sni": via_transparent_sni,
    "dns": via_dns,
}
# How each path says "that host is no destination"
REFUSAL = {
    "http": 400,
    "connect": 400,
    "socks5": 0x01,
    "transparent-host": 400,
    "transparent-sni": "closed",
    "dns": 1,  # FORMERR
}

WILD = ["*.wild.test", "127.0.0.1:{port}"]  # the address rule lets the names reach loopback
TABLE = {"good.wild.test": "127.0.0.1", "evil.test": "127.0.0.1"}

BAD_NAMES = [
    pytest.param(b"evil.test\x00.wild.test", id="nul"),  # the SOCKS5 exploit: dialled evil.test
    pytest.param(b"evil.test\x00", id="nul-end"),
    pytest.param(b"evil.test\r\n.wild.test", id="crlf"),
    pytest.param(b"evil.test\x7f.wild.test", id="del"),
    pytest.param(b"evil.test\xc2\x85.wild.test", id="c1-control"),
    pytest.param(b"a" * 64 + b".wild.test", id="label-64"),
    pytest.param(b"x..wild.test", id="empty-label"),
    pytest.param(b"evil.test%.wild.test", id="percent"),
    pytest.param(b"\xef\xbf\xbd.wild.test", id="idna-rejects"),  # U+FFFD
    pytest.param(b"ev\xffil.wild.test", id="not-utf8"),
]


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_name_that_is_no_destination_is_refused_and_never_resolved(
    tmp_path: Path, path: str, name: bytes
) -> None:
    if path == "dns" and b".." in name:
        pytest.skip("an empty label cannot be written in a DNS question (it ends the name)")
    control = any(c < 0x20 or c == 0x7F for c in name)
    expected = REFUSAL[path]
    if path == "transparent-host" and b"\r\n" in name:
        expected = 403  # the Host line ends at CRLF: "evil.test", which is not allowed

    async def go() -> None:
        async with world(tmp_path, WILD, TABLE) as w:
            outcome = await PATHS[path](w, name)
            assert not outcome.reached
            assert outcome.answer == expected, outcome
            assert w.resolver.asked == []  # never resolved, in any spelling
            assert w.origin.accepts == 0
            denied = await w.decided("deny", 0)
            assert all(e["host"] is None or e["host"].isprintable() for e in denied)
            if control and path in ("http", "connect"):
                return  # refused before any name is read: a control byte in the request line
            if expected == REFUSAL[path]:
                assert [e["rule"] for e in denied] == ["bad-name"] and denied[0]["reason"]

    run(go)


GOOD_SPELLINGS = [
    pytest.param(b"good.wild.test", id="plain"),
    pytest.param(b"GOOD.Wild.TEST.", id="case-and-trailing-dot"),
    pytest.param(full_width("good") + b".wild.test", id="full-width"),
    pytest.param("good\u3002wild\u3002test".encode(), id="ideographic-dot"),
    pytest.param("good\uff0ewild\uff61test".encode(), id="full-width-dots"),
]


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("name", GOOD_SPELLINGS)
def test_allow_twin_every_spelling_of_an_allowed_name_is_the_one_name(
    tmp_path: Path, path: str, name: bytes
) -> None:
    if path == "dns" and not name.isascii():
        pytest.skip("DNS carries A-labels: a non-ASCII label is a malformed query")

    async def go() -> None:
        async with world(tmp_path, WILD, TABLE) as w:
            outcome = await PATHS[path](w, name)
            assert outcome.reached, outcome
            allowed = await w.decided("allow")
            assert [e["host"] for e in allowed] == ["good.wild.test"]  # decided on that
            if path == "dns":
                assert w.resolver.asked == []  # answered with a stand-in address
            else:
                assert w.resolver.asked == ["good.wild.test"]  # and dialled that

    run(go)


def test_allow_twin_the_nul_name_spelled_right_reaches_the_origin(tmp_path: Path) -> None:
    """``evil.test`` itself is not allowed by ``*.wild.test``: only a rule for it would."""

    async def go() -> None:
        async with world(tmp_path, WILD, TABLE) as w:
            assert (await via_socks5(w, b"evil.test")).answer == 0x02  # not allowed
            assert w.resolver.asked == []
        async with world(tmp_path, ["evil.test", "127.0.0.1:{port}"], TABLE) as w:
            assert (await via_socks5(w, b"evil.test")).reached
            assert w.resolver.asked == ["evil.test"]

    run(go)


def test_numeric_hosts_the_c_resolver_would_read_as_addresses_are_refused(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        async with world(tmp_path, ["*", "127.0.0.1:{port}"], TABLE) as w:
            for name in (b"0x7f.0x1", b"2130706433", b"127.1", b"0177.0.0.1"):
                assert (await via_socks5(w, name)).answer == 0x01, name
            assert w.resolver.asked == [] and w.origin.accepts == 0
            # twin: the dotted-quad spelling is an address, decided and dialled as such
            assert (await via_http(w, b"127.0.0.1")).reached

    run(go)


# -- pinned names never reach DNS ---------------------------------------------------------

PINNED = {"pinned.test": "127.0.0.1"}
PIN_RULES = ["pinned.test", "other.test", "127.0.0.1:{port}"]


@pytest.mark.parametrize("path", ["http", "connect", "socks5", "transparent-host"])
@pytest.mark.parametrize(
    "name",
    [
        b"pinned.test",
        full_width("pinned") + b".test",
        "pinned\u3002test".encode(),
        "PINNED\uff0eTEST.".encode(),
    ],
    ids=["plain", "full-width", "ideographic-dot", "full-width-dot-upper"],
)
def test_a_pinned_name_never_reaches_dns_in_any_spelling(
    tmp_path: Path, path: str, name: bytes
) -> None:
    async def go() -> None:
        async with world(tmp_path, PIN_RULES, {"other.test": "127.0.0.1"}, PINNED) as w:
            assert (await PATHS[path](w, name)).reached
            assert w.resolver.asked == []
            # twin: an allowed name that is not pinned does go to the (logging) resolver
            assert (await PATHS[path](w, b"other.test")).reached
            assert w.resolver.asked == ["other.test"]

    run(go)


def test_a_pinned_name_written_oddly_in_the_policy_is_found_too(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(
            tmp_path, PIN_RULES, {}, {full_width("PINNED").decode() + "\u3002test.": "127.0.0.1"}
        ) as w:
            assert (await via_socks5(w, b"pinned.test")).reached
            assert w.resolver.asked == []

    run(go)


# -- IPv6 zones: the address checked is the address dialled -------------------------------


@pytest.mark.skipif(not ipv6_loopback_available(), reason="no IPv6 loopback on this machine")
@pytest.mark.parametrize("path", ["http", "connect", "socks5"])
def test_an_ipv6_zone_is_dropped_for_the_check_and_the_connect_alike(
    tmp_path: Path, path: str
) -> None:
    async def go() -> None:
        async with world(tmp_path, ["[::1]:{port}"], origin_host="::1") as w:
            spelled = b"::1%lo" if path == "socks5" else b"[::1%25lo]"
            assert (await PATHS[path](w, spelled)).reached
            (line,) = await w.decided("allow")
            assert line["host"] == "::1" and line["address"] == "::1"
            # deny twin: a zone on anything but an IPv6 address is no host at all
            refused = await PATHS[path](w, b"127.0.0.1%lo")
            assert refused.answer == REFUSAL[path] and w.origin.accepts == 1

    run(go)


# -- HTTP framing and smuggling ------------------------------------------------------------

SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"


def post(target: bytes, headers: bytes, body: bytes) -> bytes:
    return b"POST " + target + b" HTTP/1.1\r\n" + headers + b"\r\n" + body


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        pytest.param(
            b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            b"0\r\n\r\n" + SMUGGLED,
            id="cl-and-te",
        ),
        pytest.param(
            b"Content-Length: 5\r\nContent-Length: 41\r\n", b"hello" + SMUGGLED, id="duplicate-cl"
        ),
        pytest.param(b"Content-Length: 5, 41\r\n", b"hello" + SMUGGLED, id="cl-list"),
        pytest.param(b"Content-Length : 5\r\n", b"hello" + SMUGGLED, id="space-before-colon"),
        pytest.param(b"Content-Length: +5\r\n", b"hello" + SMUGGLED, id="signed-cl"),
        pytest.param(
            b"X-A: a\r\n Transfer-Encoding: chunked\r\n", b"0\r\n\r\n" + SMUGGLED, id="obs-fold"
        ),
        pytest.param(
            b"Transfer-Encoding: chunked, identity\r\n", b"0\r\n\r\n" + SMUGGLED, id="te-identity"
        ),
        pytest.param(b"Transfer-Encoding: identity\r\n", b"0\r\n\r\n" + SMUGGLED, id="identity"),
        pytest.param(b"Transfer-Encoding: xchunked\r\n", b"0\r\n\r\n" + SMUGGLED, id="xchunked"),
        pytest.param(
            b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
            b"0\r\n\r\n" + SMUGGLED,
            id="te-twice",
        ),
        pytest.param(
            b"Transfer-Encoding: chunked\r\n",
            b"10000000000000005\r\nhello\r\n0\r\n\r\n" + SMUGGLED,
            id="chunk-size-overflow",
        ),
        pytest.param(
            b"Transfer-Encoding: chunked\r\n",
            b"5\nhello\r\n0\r\n\r\n" + SMUGGLED,
            id="bare-lf-chunk-size",
        ),
        pytest.param(
            b"Transfer-Encoding: chunked\r\n",
            b"5\r\nhello\n0\r\n\r\n" + SMUGGLED,
            id="bare-lf-chunk-end",
        ),
        pytest.param(
            b"Transfer-Encoding: chunked\r\n",
            b"5\r\nhello\r\n0\r\nContent-Length: 41\nX: y\r\n\r\n" + SMUGGLED,
            id="bare-lf-trailer",
        ),
        pytest.param(b"X-A: b\nContent-Length: 5\r\n", b"hello" + SMUGGLED, id="bare-lf-header"),
        pytest.param(b"X-A: b\rContent-Length: 5\r\n", b"hello" + SMUGGLED, id="bare-cr-header"),
    ],
)
def test_smuggling_variants_never_reach_the_origin_as_a_second_request(
    tmp_path: Path, headers: bytes, body: bytes
) -> None:
    async def go() -> None:
        async with world(tmp_path, ["127.0.0.1:{port}"]) as w:
            reader, writer = await w.tcp()
            target = b"http://127.0.0.1:%d/echo" % w.origin.port
            writer.write(post(target, headers, body))
            response = await read_response(reader)
            assert response.status == 400
            assert await reader.read() == b""  # and closed: nothing after it is read
            assert "/smuggled" not in w.origin.paths
            assert w.origin.requests == []  # not even a complete first request
            # twin: one plainly framed body on the same rules reaches the origin whole
            twin = post(target, b"Content-Length: %d\r\n" % len(body), body)
            reader, writer = await w.tcp()
            writer.write(twin)
            answer = await read_response(reader)
            assert answer.status == 200 and answer.body == body
            assert w.origin.paths == ["/echo"]

    run(go)


@pytest.mark.parametrize(
    "target",
    [b"/a\tb", b"/a\x00b", b"/a\x0bb", b"/a\x7fb", b"/a\x1bb"],
    ids=["tab", "nul", "vt", "del", "esc"],
)
def test_a_control_character_in_the_request_target_is_400(tmp_path: Path, target: bytes) -> None:
    async def go() -> None:
        async with world(tmp_path, ["127.0.0.1:{port}"]) as w:
            reader, writer = await w.tcp()
            base = b"http://127.0.0.1:%d" % w.origin.port
            writer.write(b"GET " + base + target + b" HTTP/1.1\r\n\r\n")
            response = await read_response(reader)
            assert response.status == 400 and w.origin.accepts == 0
            reader, writer = await w.tcp()  # twin: the same target percent-encoded
            writer.write(b"GET " + base + b"/a%09b HTTP/1.1\r\n\r\n")
            assert (await read_response(reader)).status == 200
            assert w.origin.paths == ["/a%09b"]

    run(go)


def test_trailers_are_dropped_not_forwarded(tmp_path: Path) -> None:
    async def go() -> None:
        raw = bytearray()

        async def record(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
            while b"0\r\n\r\n" not in raw and (data := await reader.read(4096)):
                raw.extend(data)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
            writer.close()

        recorder = await aio.start_server(record, "127.0.0.1", 0)
        port = recorder.sockets[0].getsockname()[1]
        try:
            async with world(tmp_path, [f"127.0.0.1:{port}"]) as w:
                reader, writer = await w.tcp()
                body = b"5\r\nhello\r\n0\r\nContent-Length: 999\r\nX-Trailer: yes\r\n\r\n"
                target = b"http://127.0.0.1:%d/t" % port
                writer.write(post(target, b"Transfer-Encoding: chunked\r\n", body))
                assert (await read_response(reader)).status == 200
                assert raw.endswith(b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n")  # the twin: body whole
                assert b"X-Trailer" not in raw and b"999" not in raw
        finally:
            recorder.close()

    run(go)


# -- time: slow heads and idle connections --------------------------------------------------

FAST: Timeouts = {"idle_timeout": 1.2, "head_timeout": 0.6}


def test_a_head_that_trickles_in_gets_408_and_a_close(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ["127.0.0.1:{port}"], **FAST) as w:
            reader, writer = await w.tcp()
            started = aio.get_running_loop().time()
            writer.write(b"GET http://127.0.0.1:%d/slow HTTP/1.1\r\n" % w.origin.port)
            # a header line every 0.1 s, never the end of the head, each well within
            # the idle timeout; then nothing more, before the head timeout ends it
            # (a line written after the proxy closed would reset the connection, and
            # with it the 408 not read yet, on a loaded machine)
            for _ in range(5):
                writer.write(b"X-Slow: 1\r\n")
                await aio.sleep(0.1)
            got = await aio.wait_for(reader.read(), 5)
            assert got.startswith(b"HTTP/1.1 408 ")
            # the head timeout's doing: idle would end it 1.2 s after the last line
            assert aio.get_running_loop().time() - started < 0.5 + FAST["idle_timeout"]
            assert w.origin.accepts == 0

    run(go)


def test_allow_twin_a_head_in_slow_pieces_within_the_limit_works(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ["127.0.0.1:{port}"], **FAST) as w:
            reader, writer = await w.tcp()
            for piece in (b"GET http://127.0.0.1:%d/ok HTTP/1.1\r\n" % w.origin.port, b"X: 1\r\n"):
                writer.write(piece)
                await aio.sleep(0.15)
            writer.write(b"\r\n")
            assert (await read_response(reader)).status == 200
            assert w.origin.paths == ["/ok"]

    run(go)


def test_a_silent_client_is_closed_after_the_idle_timeout(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ["127.0.0.1:{port}"], **FAST) as w:
            loop = aio.get_running_loop()
            reader, _ = await w.tcp()
            started = loop.time()
            assert await reader.read() == b""  # closed, without a status: it asked nothing
            assert 1.0 <= loop.time() - started < 3.5

    run(go)


def test_an_idle_keep_alive_connection_is_closed_and_a_busy_one_is_not(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ["127.0.0.1:{port}"], **FAST) as w:
            reader, writer = await w.tcp()
            request = b"GET http://127.0.0.1:%d/ka HTTP/1.1\r\n\r\n" % w.origin.port
            for _ in range(4):  # a request every 0.5 s: never idle for 1.2 s
                writer.write(request)
                assert (await read_response(reader)).status == 200
                await aio.sleep(0.5)
            assert len(w.origin.requests) == 4
            assert await aio.wait_for(reader.read(), 4) == b""  # then idle: closed

    run(go)


# -- the relay's frames belong to a unix door only ------------------------------------------


def test_relay_frames_on_a_tcp_port_are_not_http_and_get_400(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ["*.wild.test:{port}", "127.0.0.1:{port}"], TABLE) as w:
            query = dns_query(b"good.wild.test")
            for frame in (
                b"\xfd" + struct.pack("!H", len(query)) + query,
                capture_frame(w.origin.port) + b"GET / HTTP/1.1\r\nHost: good.wild.test\r\n\r\n",
            ):
                reader, writer = await w.tcp()
                writer.write(frame)
                response = await read_response(reader)
                assert response.status == 400
            assert w.origin.accepts == 0 and w.resolver.asked == []
            # twins: a DNS frame on the unix door, and the capture port, are served
            assert (await via_dns(w, b"good.wild.test")).reached
            assert (await via_transparent_host(w, b"good.wild.test")).reached

    run(go)


def test_the_old_capture_frame_is_no_frame_on_a_unix_door(tmp_path: Path) -> None:
    """A captured connection's destination comes from netfilter on the capture
    port, never from bytes a client sends: the relay's old 0xfe frame is not HTTP."""

    async def go() -> None:
        async with world(tmp_path, ["127.0.0.1:{port}"]) as w:
            path = str(tmp_path / "plain.sock")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(path)
            sock.listen(4)
            server = await w.proxy.serve_unix(sock, RUN_ID)  # with the relay's frames
            try:
                reader, writer = await aio.open_unix_connection(path)
                writer.write(capture_frame(w.origin.port) + b"GET / HTTP/1.1\r\n\r\n")
                assert (await read_response(reader)).status == 400
                writer.close()
                assert w.origin.accepts == 0
                reader, writer = await aio.open_unix_connection(path)  # twin: plain HTTP
                writer.write(b"GET http://127.0.0.1:%d/p HTTP/1.1\r\n\r\n" % w.origin.port)
                assert (await read_response(reader)).status == 200
                writer.close()
            finally:
                server.close()

    run(go)


@pytest.mark.parametrize(
    ("request_bytes", "reply"),
    [
        pytest.param(b"\x04\x01\x00\x01", 0x01, id="version-4-request"),
        pytest.param(b"\x05\x01\x00\x09", 0x08, id="unknown-address-type"),
        pytest.param(b"\x05\x01\x00\x03\x00\x00\x50", 0x01, id="empty-name"),
    ],
)
def test_malformed_socks5_gets_a_reply_not_a_silent_close(
    tmp_path: Path, request_bytes: bytes, reply: int
) -> None:
    async def go() -> None:
        async with world(tmp_path, ["127.0.0.1:{port}"]) as w:
            reader, writer = await w.tcp()
            await socks_hello(reader, writer)
            writer.write(request_bytes)
            answer = await reader.readexactly(10)
            assert answer[0] == 5 and answer[1] == reply
            assert w.origin.accepts == 0
            reader, writer = await w.tcp()  # twin
            assert await socks_request(reader, writer, socks_ipv4("127.0.0.1"), w.origin.port) == 0

    run(go)


@pytest.mark.parametrize(
    "packet",
    [
        dns_query(b"evil\x00.wild.test"),
        # a label with a dot in it would read as two labels once joined
        struct.pack("!HHHHHH", 1, 0x0100, 1, 0, 0, 0)
        + b"\x09good.wild\x04test\x00\x00\x01\x00\x01",
        b"\x00\x01",
    ],
    ids=["nul-label", "dot-in-label", "truncated"],
)
def test_a_malformed_dns_frame_gets_formerr(tmp_path: Path, packet: bytes) -> None:
    async def go() -> None:
        async with world(tmp_path, ["*.wild.test"]) as w:
            reply = await dns_frame(w, packet)
            assert reply[3] & 0x0F == 1  # FORMERR
            assert (await via_dns(w, b"good.wild.test")).reached  # twin

    run(go)


# -- errors inside the proxy: one audit line and a count, never a traceback ------------------


class Exploding(Hook):
    name = "exploding"

    def on_connect(self, dest: Destination) -> Verdict | None:
        if dest.host == "boom.test":
            raise RuntimeError("a hook with a bug")
        return None


def test_an_unexpected_exception_is_one_audit_line_and_a_count(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    async def go() -> None:
        async with world(tmp_path, ["*.test", "127.0.0.1:{port}"], hooks=[Exploding()]) as w:
            w.proxy.guard(RUN_ID)
            reader, writer = await w.tcp()
            writer.write(b"GET http://boom.test/ HTTP/1.1\r\n\r\n")
            assert await reader.read() == b""
            assert w.proxy.audit.errors == 1
            (line,) = await w.decided("error")
            assert "RuntimeError: a hook with a bug" in line["reason"]
            assert "\n" not in line["reason"]
            # the loop's own handler: a failing callback is counted the same way
            aio.get_running_loop().call_soon(lambda: 1 / 0)
            await aio.sleep(0.01)
            assert w.proxy.audit.errors == 2
            # twin: the proxy still serves
            assert (await via_http(w, b"127.0.0.1")).reached

    run(go)
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err and "Error" not in captured.err


def test_a_tunnel_open_when_the_loop_stops_leaves_no_traceback(tmp_path: Path) -> None:
    """The CancelledError once printed after ``npm install``: a worker stopping
    with a tunnel still open (Python 3.11's start_server reports a cancelled
    connection task through the loop's exception handler)."""
    import subprocess
    import sys

    script = f"""
from corral.net import aio
from corral.net.audit import Audit
from corral.net.hooks import Chain, HostRulesHook
from corral.net.proxy import Proxy, run_loop
from corral.net.rules import HostRules

class Hold(aio.Protocol):  # an origin that keeps its side open after the client's EOF
    def eof_received(self):
        return True

async def main():
    origin = await aio.get_running_loop().create_server(Hold, "127.0.0.1", 0)
    port = origin.sockets[0].getsockname()[1]
    rules = HostRules.parse([f"127.0.0.1:{{port}}"], [])
    proxy = Proxy(Chain([HostRulesHook(rules)]), Audit({str(tmp_path / "net.jsonl")!r}))
    proxy.guard("r")
    server = await proxy.serve_tcp("127.0.0.1", 0, "r")
    reader, writer = await aio.open_connection(
        "127.0.0.1", server.sockets[0].getsockname()[1])
    writer.write(f"CONNECT 127.0.0.1:{{port}} HTTP/1.1\\r\\n\\r\\n".encode())
    await reader.readuntil(b"\\r\\n\\r\\n")
    writer.write_eof()
    await aio.sleep(0.1)
    print("errors", proxy.audit.errors)

run_loop(main())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert b"errors 0" in done.stdout  # twin: the tunnel was up, and nothing went wrong
    assert b"Traceback" not in done.stderr and b"CancelledError" not in done.stderr


# -- the normalizer itself -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "one"),
    [
        ("Example.ORG.", "example.org"),
        (" example.org\t", "example.org"),
        ("bücher.example", "xn--bcher-kva.example"),
        (full_width("example").decode() + "\u3002org", "example.org"),
        (full_width("127").decode() + "\uff0e0.0.1", "127.0.0.1"),
        ("[::1]", "::1"),
        ("[FE80::1%25eth0]", "fe80::1"),
        ("::ffff:127.0.0.1", "127.0.0.1"),
        ("_dmarc.example.org", "_dmarc.example.org"),
        ("a" * 63 + ".org", "a" * 63 + ".org"),
        (".".join(["a" * 49] * 5) + ".abc", ".".join(["a" * 49] * 5) + ".abc"),  # 253
    ],
)
def test_normalize(raw: str, one: str) -> None:
    assert names.normalize(raw) == one
    assert names.normalize(one) == one  # idempotent: normalizing twice changes nothing


@pytest.mark.parametrize(
    "raw",
    [
        "",
        " ",
        "a\x00b.org",
        "a\tb.org",
        "a.org\n",
        "a\x85.org",
        "a" * 64 + ".org",
        ".".join(["a" * 49] * 5) + ".abcd",  # 254
        "a..org",
        ".org",
        "a.org..",
        "a b.org",
        "a%b.org",
        "1.2.3.4%eth0",
        "[::1",
        "::1::2",
        "host:80",
        "0x7f.0x1",
        "127.1",
        "999.1.1.1",
        "\ufffd.org",
        "x" * 2000,
    ],
)
def test_normalize_refuses_with_a_reason(raw: str) -> None:
    with pytest.raises(names.BadName) as info:
        names.normalize(raw)
    assert info.value.reason


def test_printable_escapes_what_a_terminal_would_interpret() -> None:
    shown = names.printable("evil\x00.\x1b[31mred\u202e.test")
    assert shown.isprintable() and "\x1b" not in shown and "\\x00" in shown


MALFORMED_REQUESTS = {
    "userinfo": b"GET http://127.0.0.1:{port}@127.0.0.1:1/x HTTP/1.1\r\nHost: x\r\n\r\n",
    "https-in-plain": b"GET https://127.0.0.1:{port}/x HTTP/1.1\r\nHost: x\r\n\r\n",
    "bad-authority": b"CONNECT 127.0.0.1:{port}x HTTP/1.1\r\n\r\n",
    "cl-and-te": b"POST http://127.0.0.1:{port}/x HTTP/1.1\r\nContent-Length: 5\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "obs-fold": b"GET http://127.0.0.1:{port}/x HTTP/1.1\r\nX-A: a\r\n b\r\n\r\n",
    "not-http": b"\x16\x03\x01\x00\x05hello",
    "socks5-no-method": b"\x05\x01\x02",
}


@pytest.mark.parametrize("kind", list(MALFORMED_REQUESTS))
def test_a_malformed_request_is_refused_and_audited(tmp_path: Path, kind: str) -> None:
    """Every request leaves an audit line, however it was refused: a head that
    does not parse, a target that names no destination, a SOCKS5 greeting corral
    does not take were refused with no line (found by attacking the proxy), so a
    run's log and summary did not show them.  The twin: a well-formed request on
    the same connection kind reaches the origin and is audited as allowed."""

    async def go() -> None:
        async with world(tmp_path, ["127.0.0.1:{port}"]) as w:
            reader, writer = await w.tcp()
            writer.write(MALFORMED_REQUESTS[kind].replace(b"{port}", b"%d" % w.origin.port))
            answer = await reader.read(1024)
            assert answer.startswith((b"HTTP/1.1 4", b"\x05\xff")), answer
            refused = await w.decided("deny")
            assert [e["rule"] for e in refused] == ["malformed"], refused
            assert refused[0]["status"] in (400, 0xFF), refused
            assert w.origin.requests == []
            outcome = await via_http(w, b"127.0.0.1")  # the twin
            assert outcome.reached, outcome
            assert [e["rule"] for e in await w.decided("allow")] != []

    run(go)
