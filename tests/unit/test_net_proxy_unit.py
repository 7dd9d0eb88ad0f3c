"""The real ``Proxy`` in-process, on real sockets, against real origins on 127.0.0.1.

Each test starts an asyncio origin that records what reached it (accepted
connections and parsed requests), a ``Proxy`` listening on 127.0.0.1:0 through
``serve_tcp`` and an ``Audit`` writing to ``tmp_path``.  Evidence is taken on the
origin side: a deny test passes only if nothing arrived there, and each deny
has an allow twin that shows the same path works.  All traffic stays on
127.0.0.1 (and ::1 where available); every test is bounded by a timeout.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from corral.net import aio
from corral.net.audit import Audit
from corral.net.hooks import Chain, HostRulesHook
from corral.net.proxy import Proxy
from corral.net.rules import HostRules

T = TypeVar("T")
TIMEOUT = 5.0
RUN_ID = "run-x"
AUDIT_FIELDS = {
    "time",
    "run_id",
    "scheme",
    "method",
    "path",
    "host",
    "port",
    "address",
    "decision",
    "rule",
    "status",
    "bytes_up",
    "bytes_down",
    "duration",
}


def run(factory: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        result: T = await aio.wait_for(factory(), TIMEOUT)  # aio's helpers return Any
        return result

    result: T = aio.run(bounded())
    return result


# -- the origin --------------------------------------------------------------------------------


class Seen:
    """One request as the origin parsed it."""

    def __init__(self, method: bytes, target: bytes, head: bytes) -> None:
        self.method = method
        self.target = target
        self.head = head  # raw, up to and without the blank line
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = b""

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


class Origin:
    """A small HTTP/1.1 server: keep-alive, Content-Length and chunked request bodies.

    ``/echo`` answers with the request body; ``/chunked`` answers chunked;
    ``/close`` answers without framing and closes; anything else says hello.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self.accepts = 0
        self.requests: list[Seen] = []
        self.server: aio.Server | None = None

    async def start(self) -> Origin:
        self.server = await aio.start_server(self.handle, self.host, 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    @property
    def paths(self) -> list[str]:
        return [r.target.decode() for r in self.requests]

    async def handle(self, reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
        self.accepts += 1
        conn = self.accepts
        try:
            while True:
                try:
                    head = (await reader.readuntil(b"\r\n\r\n"))[:-4]
                except (aio.IncompleteReadError, ConnectionError):
                    return
                lines = head.split(b"\r\n")
                method, target, _ = lines[0].split(b" ", 2)
                seen = Seen(method, target, head)
                for line in lines[1:]:
                    name, _, value = line.partition(b":")
                    seen.headers.append((name.strip().lower(), value.strip()))
                length = seen.header(b"content-length")
                if seen.header(b"transfer-encoding") == b"chunked":
                    seen.body = await read_chunked(reader)
                elif length is not None:
                    seen.body = await reader.readexactly(int(length))
                self.requests.append(seen)
                if not await self.respond(seen, writer, conn):
                    return
        finally:
            writer.close()

    async def respond(self, seen: Seen, writer: aio.StreamWriter, conn: int) -> bool:
        path = seen.target.decode()
        body = seen.body if path.startswith("/echo") else f"hello from origin {path}\n".encode()
        common = f"HTTP/1.1 200 OK\r\nX-Origin-Conn: {conn}\r\n".encode()
        if path.startswith("/close"):
            writer.write(common + b"\r\n" + body)
            await writer.drain()
            return False
        if path.startswith("/chunked"):
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:5], body[5:]) if p)
            writer.write(common + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")
        else:
            head = common + b"Content-Length: %d\r\n\r\n" % len(body)
            writer.write(head if seen.method == b"HEAD" else head + body)
        await writer.drain()
        return seen.header(b"connection") != b"close"


async def read_chunked(reader: aio.StreamReader) -> bytes:
    body = b""
    while True:
        size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass
            return body
        body += (await reader.readexactly(size + 2))[:-2]


# -- the client side ---------------------------------------------------------------------------


class Response:
    def __init__(self, status: int, headers: dict[bytes, bytes], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


async def read_response(reader: aio.StreamReader, method: bytes = b"GET") -> Response:
    head = (await reader.readuntil(b"\r\n\r\n"))[:-4]
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ")[1])
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if method == b"HEAD" or status in (204, 304) or 100 <= status < 200:
        body = b""
    elif headers.get(b"transfer-encoding") == b"chunked":
        body = await read_chunked(reader)
    elif b"content-length" in headers:
        body = await reader.readexactly(int(headers[b"content-length"]))
    else:
        body = await reader.read()
    return Response(status, headers, body)


async def socks_hello(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
    writer.write(b"\x05\x01\x00")
    assert await reader.readexactly(2) == b"\x05\x00"


async def socks_request(
    reader: aio.StreamReader,
    writer: aio.StreamWriter,
    address: bytes,
    port: int,
    command: int = 1,
) -> int:
    """Greeting plus one request; ``address`` is ATYP and address bytes; returns REP."""
    await socks_hello(reader, writer)
    writer.write(bytes([5, command, 0]) + address + struct.pack("!H", port))
    reply = await reader.readexactly(10)
    assert reply[0] == 5
    assert reply[2:4] == b"\x00\x01"
    return reply[1]


def socks_domain(name: str) -> bytes:
    return bytes([3, len(name)]) + name.encode()


def socks_ipv4(address: str) -> bytes:
    return b"\x01" + socket.inet_pton(socket.AF_INET, address)


def socks_ipv6(address: str) -> bytes:
    return b"\x04" + socket.inet_pton(socket.AF_INET6, address)


# -- the proxy ---------------------------------------------------------------------------------


class World:
    def __init__(self, origin: Origin, proxy: Proxy, port: int, audit_path: Path) -> None:
        self.origin = origin
        self.proxy = proxy
        self.port = port
        self.audit_path = audit_path
        self.clients: list[aio.StreamWriter] = []

    async def connect(self) -> tuple[aio.StreamReader, aio.StreamWriter]:
        reader, writer = await aio.open_connection("127.0.0.1", self.port)
        self.clients.append(writer)
        return reader, writer

    async def exchange(self, raw: bytes, method: bytes = b"GET") -> Response:
        """One request on a fresh connection."""
        reader, writer = await self.connect()
        writer.write(raw)
        response = await read_response(reader, method)
        writer.close()
        return response

    def url(self, path: str = "/", host: str = "127.0.0.1") -> bytes:
        return f"http://{host}:{self.origin.port}{path}".encode()

    def audit(self) -> list[dict[str, Any]]:
        if not self.audit_path.exists():
            return []
        return [json.loads(line) for line in self.audit_path.read_text().splitlines()]

    async def wait_audit(self, count: int) -> list[dict[str, Any]]:
        """The audit lines once there are at least ``count`` (lines land after the reply)."""
        while len(lines := self.audit()) < count:
            await aio.sleep(0.01)
        return lines


@asynccontextmanager
async def world(
    tmp_path: Path, allow: list[str], deny: list[str] | None = None, origin_host: str = "127.0.0.1"
) -> AsyncIterator[World]:
    """An origin, and a proxy whose rules may say ``{port}`` for the origin's port."""
    origin = await Origin(origin_host).start()
    rules = HostRules.parse(
        [a.format(port=origin.port) for a in allow],
        [d.format(port=origin.port) for d in deny or []],
    )
    audit = Audit(str(tmp_path / "net.jsonl"))
    proxy = Proxy(Chain([HostRulesHook(rules)]), audit)
    server = await proxy.serve_tcp("127.0.0.1", 0, RUN_ID)
    w = World(origin, proxy, server.sockets[0].getsockname()[1], tmp_path / "net.jsonl")
    try:
        yield w
    finally:
        for client in w.clients:
            client.close()
        server.close()
        origin.close()
        audit.close()


def check_audit_line(line: dict[str, Any]) -> None:
    assert set(line) >= AUDIT_FIELDS, AUDIT_FIELDS - set(line)
    assert line["run_id"] == RUN_ID
    assert isinstance(line["time"], str)
    assert line["time"].endswith("Z")
    assert isinstance(line["duration"], int | float)
    assert 0 <= line["duration"] < TIMEOUT
    assert isinstance(line["bytes_up"], int)
    assert isinstance(line["bytes_down"], int)


ALLOW_ORIGIN = ["127.0.0.1:{port}"]


# -- HTTP forwarding ---------------------------------------------------------------------------


def test_get_keep_alive_reuses_one_upstream_connection(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            reader, writer = await w.connect()
            host = f"127.0.0.1:{w.origin.port}".encode()
            for path in ("/one", "/two"):
                writer.write(b"GET " + w.url(path) + b" HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
                response = await read_response(reader)
                assert response.status == 200
                assert response.body == f"hello from origin {path}\n".encode()
                assert response.headers[b"x-origin-conn"] == b"1"
            assert w.origin.accepts == 1
            assert w.origin.paths == ["/one", "/two"]  # origin-form upstream
            assert all(r.method == b"GET" for r in w.origin.requests)
            lines = await w.wait_audit(2)
            for line, path in zip(lines, ("/one", "/two"), strict=True):
                check_audit_line(line)
                assert line["scheme"] == "http"
                assert line["method"] == "GET"
                assert line["path"] == path
                assert line["host"] == "127.0.0.1"
                assert line["port"] == w.origin.port
                assert line["address"] == "127.0.0.1"
                assert line["decision"] == "allow"
                assert line["rule"] == f"127.0.0.1:{w.origin.port}"
                assert line["status"] == 200
                assert line["bytes_up"] >= len(b"GET " + path.encode() + b" HTTP/1.1\r\n\r\n")
                assert line["bytes_down"] >= len(f"hello from origin {path}\n")

    run(go)


def test_pipelined_requests_are_answered_in_order(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            reader, writer = await w.connect()
            writer.write(
                b"".join(b"GET " + w.url(p) + b" HTTP/1.1\r\n\r\n" for p in ("/a", "/b", "/c"))
            )
            bodies = [(await read_response(reader)).body for _ in range(3)]
            assert bodies == [f"hello from origin /{p}\n".encode() for p in "abc"]
            assert w.origin.accepts == 1

    run(go)


def test_new_destination_on_the_same_client_connection_opens_a_new_upstream(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        async with world(tmp_path, ["127.0.0.1:{port}", "localhost:{port}"]) as w:
            reader, writer = await w.connect()
            writer.write(b"GET " + w.url("/first") + b" HTTP/1.1\r\n\r\n")
            assert (await read_response(reader)).status == 200
            # localhost resolves to loopback: not allowed by name alone, so the address
            # rule above decides; a different host means a different upstream connection
            writer.write(b"GET " + w.url("/second", "localhost") + b" HTTP/1.1\r\n\r\n")
            assert (await read_response(reader)).status == 200
            assert w.origin.accepts == 2

    run(go)


def test_post_with_content_length_is_echoed(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            body = bytes(range(256)) * 1024  # 256 KiB: more than one read
            response = await w.exchange(
                b"POST "
                + w.url("/echo")
                + b" HTTP/1.1\r\nContent-Type: application/octet-stream\r\n"
                + b"Content-Length: %d\r\n\r\n" % len(body)
                + body
            )
            assert response.status == 200
            assert response.body == body
            seen = w.origin.requests[0]
            assert seen.method == b"POST"
            assert seen.header(b"content-length") == str(len(body)).encode()
            assert seen.header(b"host") == f"127.0.0.1:{w.origin.port}".encode()
            (line,) = await w.wait_audit(1)
            check_audit_line(line)
            assert line["method"] == "POST"
            assert line["bytes_up"] >= len(body)
            assert line["bytes_down"] >= len(body)

    run(go)


def test_post_with_chunked_body_is_echoed(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            chunks = [b"hello ", b"chunked ", b"world" * 1000]
            wire = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(c), c) for c in chunks)
            wire += b"0\r\nX-Trailer: yes\r\n\r\n"
            response = await w.exchange(
                b"POST "
                + w.url("/echo")
                + b" HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                + wire
            )
            assert response.status == 200
            assert response.body == b"".join(chunks)
            seen = w.origin.requests[0]
            assert seen.header(b"transfer-encoding") == b"chunked"
            assert seen.header(b"content-length") is None
            (line,) = await w.wait_audit(1)
            check_audit_line(line)
            assert line["bytes_up"] >= len(wire)
            assert line["bytes_down"] >= len(b"".join(chunks))

    run(go)


def test_chunked_response_is_forwarded_chunked(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            response = await w.exchange(b"GET " + w.url("/chunked") + b" HTTP/1.1\r\n\r\n")
            assert response.status == 200
            assert response.headers[b"transfer-encoding"] == b"chunked"
            assert response.body == b"hello from origin /chunked\n"

    run(go)


def test_response_without_framing_runs_until_close(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            reader, writer = await w.connect()
            writer.write(b"GET " + w.url("/close") + b" HTTP/1.1\r\n\r\n")
            response = await read_response(reader)  # reads to EOF: the proxy must close
            assert response.body == b"hello from origin /close\n"
            assert await reader.read() == b""

    run(go)


def test_head_response_has_no_body(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            reader, writer = await w.connect()
            writer.write(b"HEAD " + w.url("/h") + b" HTTP/1.1\r\n\r\n")
            response = await read_response(reader, b"HEAD")
            assert response.status == 200
            assert int(response.headers[b"content-length"]) > 0
            # the connection is still in step: a second request gets its own answer
            writer.write(b"GET " + w.url("/after") + b" HTTP/1.1\r\n\r\n")
            assert (await read_response(reader)).body == b"hello from origin /after\n"

    run(go)


def test_hop_by_hop_headers_are_not_forwarded(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            response = await w.exchange(
                b"GET " + w.url("/") + b" HTTP/1.1\r\nProxy-Authorization: Basic c2VjcmV0\r\n"
                b"Proxy-Connection: keep-alive\r\nConnection: X-Private\r\nX-Private: 1\r\n"
                b"X-Public: 2\r\n\r\n"
            )
            assert response.status == 200
            seen = w.origin.requests[0]
            for name in (b"proxy-authorization", b"proxy-connection", b"x-private"):
                assert seen.header(name) is None, name
            assert seen.header(b"x-public") == b"2"

    run(go)


def test_denied_host_gets_403_json_and_allowed_twin_works(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            reader, writer = await w.connect()
            writer.write(b"GET http://blocked.example:8080/secret HTTP/1.1\r\n\r\n")
            denied = await read_response(reader)
            assert denied.status == 403
            assert denied.headers[b"x-corral-decision"] == b"deny; rule=default"
            assert denied.headers[b"content-type"] == b"application/json"
            body = denied.json()
            assert body["decision"] == "deny"
            assert body["rule"] == "default"
            assert body["host"] == "blocked.example"
            assert body["port"] == 8080
            assert body["reason"]
            # allow twin, on the same client connection (a bodiless denial keeps it open)
            writer.write(b"GET " + w.url("/open") + b" HTTP/1.1\r\n\r\n")
            allowed = await read_response(reader)
            assert allowed.status == 200
            assert w.origin.paths == ["/open"]
            denied_line, allowed_line = await w.wait_audit(2)
            check_audit_line(denied_line)
            assert denied_line["decision"] == "deny"
            assert denied_line["rule"] == "default"
            assert denied_line["status"] == 403
            assert denied_line["host"] == "blocked.example"
            assert denied_line["port"] == 8080
            assert denied_line["path"] == "/secret"
            assert denied_line["address"] is None
            assert (denied_line["bytes_up"], denied_line["bytes_down"]) == (0, 0)
            assert allowed_line["decision"] == "allow"
            key = ("blocked.example", 8080, "default", "host not in the allow list", "", "")
            assert w.proxy.audit.denied == {key: 1}

    run(go)


def test_deny_rule_beats_allow_for_the_origin(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ["127.0.0.0/8"], ["127.0.0.1:{port}"]) as w:
            denied = await w.exchange(b"GET " + w.url("/x") + b" HTTP/1.1\r\n\r\n")
            assert denied.status == 403
            assert denied.json()["rule"] == f"127.0.0.1:{w.origin.port}"
            assert w.origin.accepts == 0
        async with world(tmp_path / "twin", ["127.0.0.0/8"], ["127.0.0.1:1"]) as w:
            allowed = await w.exchange(b"GET " + w.url("/x") + b" HTTP/1.1\r\n\r\n")
            assert allowed.status == 200
            assert w.origin.paths == ["/x"]

    run(go)


def test_denied_request_with_body_closes_the_connection(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            reader, writer = await w.connect()
            # the body is a request of its own: it must not be read as the next request
            inner = b"GET " + w.url("/inner") + b" HTTP/1.1\r\n\r\n"
            writer.write(
                b"POST http://blocked.example/ HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(inner)
                + inner
            )
            assert (await read_response(reader)).status == 403
            assert await reader.read() == b""
            assert w.origin.accepts == 0

    run(go)


@pytest.mark.parametrize(
    ("request_line", "status"),
    [
        (b"GET https://127.0.0.1/ HTTP/1.1", 400),
        (b"GET /relative HTTP/1.1", 400),
        (b"GET http://user@127.0.0.1/ HTTP/1.1", 400),
        (b"GET http://127.0.0.1/ HTTP/2.0", 505),
        (b"G@T http://127.0.0.1/ HTTP/1.1", 400),
        (b"GET http://127.0.0.1/ HTTP/1.1\r\n folded: header", 400),
    ],
)
def test_malformed_requests_are_refused(tmp_path: Path, request_line: bytes, status: int) -> None:
    async def go() -> None:
        async with world(tmp_path, ["127.0.0.1"]) as w:
            response = await w.exchange(request_line + b"\r\n\r\n")
            assert response.status == status
            assert response.headers[b"connection"] == b"close"
            assert w.origin.accepts == 0

    run(go)


def test_head_too_large_is_431(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            response = await w.exchange(
                b"GET " + w.url("/") + b" HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"
            )
            assert response.status == 431
            assert w.origin.accepts == 0

    run(go)


def test_smuggling_attempt_is_refused_and_plain_twin_works(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            smuggled = b"GET /admin HTTP/1.1\r\nHost: x\r\n\r\n"
            chunked = b"0\r\n\r\n" + smuggled
            response = await w.exchange(
                b"POST " + w.url("/echo") + b" HTTP/1.1\r\n"
                b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(chunked) + chunked
            )
            assert response.status == 400
            assert w.origin.accepts == 0
            assert w.origin.requests == []
            # twin: the same body framed by Content-Length alone is just a body
            twin = await w.exchange(
                b"POST "
                + w.url("/echo")
                + b" HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(chunked)
                + chunked
            )
            assert twin.status == 200
            assert twin.body == chunked
            assert w.origin.paths == ["/echo"]

    run(go)


def test_bad_chunk_in_request_body_is_400(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            response = await w.exchange(
                b"POST " + w.url("/echo") + b" HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"zz\r\nhello\r\n0\r\n\r\n"
            )
            assert response.status == 400
            assert w.origin.requests == []

    run(go)


def test_unreachable_origin_is_502(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ["127.0.0.1"]) as w:
            port = closed_port()
            response = await w.exchange(f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n".encode())
            assert response.status == 502
            (line,) = await w.wait_audit(1)
            check_audit_line(line)
            assert line["status"] == 502
            assert line["rule"] == "127.0.0.1"  # the rule that allowed it, not "default"
            assert "cannot connect" in line["reason"]

    run(go)


def test_unreachable_origin_is_not_a_policy_denial(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ["127.0.0.1"]) as w:
            port = closed_port()
            response = await w.exchange(f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n".encode())
            assert response.status == 502
            (line,) = await w.wait_audit(1)
            assert line["decision"] != "deny"
            # tallied as unreachable, not as refused: corral names it after the run
            assert [k[4] for k in w.proxy.audit.denied] == ["down"]

    run(go)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# -- rebinding ---------------------------------------------------------------------------------


def test_name_resolving_to_loopback_needs_the_address_allowed(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ["localhost:{port}"]) as w:
            denied = await w.exchange(b"GET " + w.url("/r", "localhost") + b" HTTP/1.1\r\n\r\n")
            assert denied.status == 403
            assert denied.json()["rule"] == "rebinding"
            assert denied.headers[b"x-corral-decision"] == b"deny; rule=rebinding"
            reader, writer = await w.connect()
            code = await socks_request(reader, writer, socks_domain("localhost"), w.origin.port)
            assert code == 0x02
            connect = await w.exchange(
                f"CONNECT localhost:{w.origin.port} HTTP/1.1\r\n\r\n".encode()
            )
            assert connect.status == 403
            assert connect.json()["rule"] == "rebinding"
            assert w.origin.accepts == 0
            lines = await w.wait_audit(3)
            assert [(x["scheme"], x["rule"], x["decision"]) for x in lines] == [
                ("http", "rebinding", "deny"),
                ("socks5", "rebinding", "deny"),
                ("connect", "rebinding", "deny"),
            ]
        async with world(tmp_path / "twin", ["localhost:{port}", "127.0.0.1:{port}"]) as w:
            allowed = await w.exchange(b"GET " + w.url("/r", "localhost") + b" HTTP/1.1\r\n\r\n")
            assert allowed.status == 200
            assert w.origin.paths == ["/r"]
            assert w.origin.requests[0].header(b"host") == f"localhost:{w.origin.port}".encode()
            (line,) = await w.wait_audit(1)
            assert line["host"] == "localhost"
            assert line["address"] == "127.0.0.1"
            assert line["rule"] == f"localhost:{w.origin.port}"

    run(go)


def test_star_does_not_reach_loopback(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ["*"]) as w:
            response = await w.exchange(b"GET " + w.url("/") + b" HTTP/1.1\r\n\r\n")
            assert response.status == 403
            assert response.json()["rule"] == "rebinding"
            assert w.origin.accepts == 0
        async with world(tmp_path / "twin", ["*", "127.0.0.1"]) as w:
            assert (await w.exchange(b"GET " + w.url("/") + b" HTTP/1.1\r\n\r\n")).status == 200

    run(go)


# -- CONNECT -----------------------------------------------------------------------------------


async def connect_tunnel(
    w: World, target: bytes
) -> tuple[aio.StreamReader, aio.StreamWriter, bytes]:
    reader, writer = await w.connect()
    writer.write(b"CONNECT " + target + b" HTTP/1.1\r\nHost: " + target + b"\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    return reader, writer, head


def test_connect_allowed_then_http_inside_the_tunnel(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            target = f"127.0.0.1:{w.origin.port}".encode()
            reader, writer, head = await connect_tunnel(w, target)
            assert head == b"HTTP/1.1 200 Connection Established\r\n\r\n"
            request = b"GET /in-tunnel HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            writer.write(request)
            response = await read_response(reader)
            assert response.status == 200
            assert response.body == b"hello from origin /in-tunnel\n"
            writer.write_eof()
            assert await reader.read() == b""
            assert w.origin.paths == ["/in-tunnel"]
            (line,) = await w.wait_audit(1)
            check_audit_line(line)
            assert line["scheme"] == "connect"
            assert line["method"] is None
            assert line["path"] is None
            assert line["decision"] == "allow"
            assert line["status"] == 200
            assert line["address"] == "127.0.0.1"
            assert line["bytes_up"] == len(request)
            assert line["bytes_down"] >= len(response.body)

    run(go)


def test_the_runs_end_waits_for_the_last_tunnel_to_be_recorded(tmp_path: Path) -> None:
    """A tunnel writes its audit line once both ends are done.  When the run ends, its
    clients' sockets close, and the worker stopped at once: the last tunnel's line
    was lost now and then (a CI run saw it).  settle() waits for it, bounded."""

    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            target = f"127.0.0.1:{w.origin.port}".encode()
            reader, writer, head = await connect_tunnel(w, target)
            assert head == b"HTTP/1.1 200 Connection Established\r\n\r\n"
            writer.write(b"GET /last HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive origin
            assert (await read_response(reader)).status == 200
            writer.transport.abort()  # the client's process is gone
            await w.proxy.settle(5.0)  # what the worker does at the run's end
            w.proxy.audit.flush()  # (as the worker does when it stops)
            (line,) = w.audit()  # recorded already: no waiting for it here
            assert line["scheme"] == "connect" and line["decision"] == "allow"
            t = aio.get_running_loop().time()
            await w.proxy.settle(5.0)  # nothing open: no wait (the twin)
            assert aio.get_running_loop().time() - t < 0.1

    run(go)


def test_connect_denied_is_403(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ["127.0.0.1:1"]) as w:
            target = f"127.0.0.1:{w.origin.port}".encode()
            reader, _, head = await connect_tunnel(w, target)
            assert head.startswith(b"HTTP/1.1 403 ")
            assert b"x-corral-decision: deny; rule=default" in head
            length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
            body = json.loads(await reader.readexactly(length))
            assert body == {
                "decision": "deny",
                "rule": "default",
                "reason": body["reason"],
                "host": "127.0.0.1",
                "port": w.origin.port,
            }
            assert w.origin.accepts == 0
            (line,) = await w.wait_audit(1)
            check_audit_line(line)
            assert (line["scheme"], line["decision"], line["status"]) == ("connect", "deny", 403)

    run(go)


def test_connect_to_bad_authority_is_400(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ["*"]) as w:
            _, _, head = await connect_tunnel(w, b"127.0.0.1:notaport")
            assert head.startswith(b"HTTP/1.1 400 ")
            assert w.origin.accepts == 0

    run(go)


# -- SOCKS5 ------------------------------------------------------------------------------------


async def http_through_socks(
    reader: aio.StreamReader, writer: aio.StreamWriter, path: str, host: str = "x"
) -> Response:
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    response = await read_response(reader)
    writer.write_eof()
    return response


def test_socks5_connect_with_domain_name(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ["localhost:{port}", "127.0.0.1:{port}"]) as w:
            reader, writer = await w.connect()
            code = await socks_request(reader, writer, socks_domain("localhost"), w.origin.port)
            assert code == 0x00
            response = await http_through_socks(reader, writer, "/socks-name", "localhost")
            assert response.body == b"hello from origin /socks-name\n"
            assert w.origin.paths == ["/socks-name"]
            # plain HTTP in a tunnel to a name is served request by request
            (line,) = await w.wait_audit(1)
            check_audit_line(line)
            assert (line["scheme"], line["method"], line["path"]) == ("http", "GET", "/socks-name")
            assert line["host"] == "localhost"
            assert line["address"] == "127.0.0.1"
            assert line["decision"] == "allow"
            assert line["status"] == 200
            assert line["bytes_down"] >= len(response.body)

    run(go)


def test_socks5_connect_with_ipv4(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            reader, writer = await w.connect()
            code = await socks_request(reader, writer, socks_ipv4("127.0.0.1"), w.origin.port)
            assert code == 0x00
            response = await http_through_socks(reader, writer, "/socks-v4")
            assert response.status == 200
            assert w.origin.paths == ["/socks-v4"]
            (line,) = await w.wait_audit(1)
            assert (line["host"], line["port"], line["rule"]) == (
                "127.0.0.1",
                w.origin.port,
                f"127.0.0.1:{w.origin.port}",
            )

    run(go)


def ipv6_loopback_available() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_loopback_available(), reason="no IPv6 loopback")
def test_socks5_connect_with_ipv6_and_its_deny_twin(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ["[::1]:{port}"], origin_host="::1") as w:
            reader, writer = await w.connect()
            assert await socks_request(reader, writer, socks_ipv6("::1"), w.origin.port) == 0
            assert (await http_through_socks(reader, writer, "/v6")).status == 200
            assert w.origin.paths == ["/v6"]
            reader, writer = await w.connect()
            code = await socks_request(reader, writer, socks_ipv6("::1"), w.origin.port + 1)
            assert code == 0x02
            assert w.origin.accepts == 1

    run(go)


def test_socks5_denied_is_not_allowed_and_twin_allowed(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN, ["127.0.0.1:{port}"]) as w:
            reader, writer = await w.connect()
            code = await socks_request(reader, writer, socks_ipv4("127.0.0.1"), w.origin.port)
            assert code == 0x02
            assert await reader.read() == b""  # and the connection is closed
            assert w.origin.accepts == 0
            (line,) = await w.wait_audit(1)
            check_audit_line(line)
            assert (line["scheme"], line["decision"], line["status"]) == ("socks5", "deny", 2)
            assert line["rule"] == f"127.0.0.1:{w.origin.port}"
        async with world(tmp_path / "twin", ALLOW_ORIGIN) as w:
            reader, writer = await w.connect()
            code = await socks_request(reader, writer, socks_ipv4("127.0.0.1"), w.origin.port)
            assert code == 0x00
            assert (await http_through_socks(reader, writer, "/twin")).status == 200

    run(go)


@pytest.mark.parametrize(("command", "name"), [(2, "BIND"), (3, "UDP ASSOCIATE")])
def test_socks5_commands_other_than_connect_are_unsupported(
    tmp_path: Path, command: int, name: str
) -> None:
    async def go() -> None:
        async with world(tmp_path, ["127.0.0.1"]) as w:
            reader, writer = await w.connect()
            code = await socks_request(
                reader, writer, socks_ipv4("127.0.0.1"), w.origin.port, command
            )
            assert code == 0x07, name
            assert w.origin.accepts == 0
            (line,) = await w.wait_audit(1)
            check_audit_line(line)
            assert (line["decision"], line["rule"], line["status"]) == ("deny", "socks5", 7)
            # twin: CONNECT to the same destination under the same rules works
            reader, writer = await w.connect()
            code = await socks_request(reader, writer, socks_ipv4("127.0.0.1"), w.origin.port)
            assert code == 0x00

    run(go)


def test_socks5_without_the_no_auth_method_is_refused(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ["127.0.0.1"]) as w:
            reader, writer = await w.connect()
            writer.write(b"\x05\x01\x02")  # username/password only
            assert await reader.readexactly(2) == b"\x05\xff"
            assert await reader.read() == b""

    run(go)


def test_socks5_unknown_address_type(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ["127.0.0.1"]) as w:
            reader, writer = await w.connect()
            code = await socks_request(reader, writer, b"\x09", w.origin.port)
            assert code == 0x08
            assert w.origin.accepts == 0

    run(go)


def test_socks5_connection_refused_reply(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ["127.0.0.1"]) as w:
            reader, writer = await w.connect()
            code = await socks_request(reader, writer, socks_ipv4("127.0.0.1"), closed_port())
            assert code == 0x05

    run(go)


# -- bugs shown through the real proxy ---------------------------------------------------------


def test_connection_header_cannot_strip_content_length(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            smuggled = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
            response = await w.exchange(
                b"POST " + w.url("/echo") + b" HTTP/1.1\r\nConnection: content-length\r\n"
                b"Content-Length: %d\r\n\r\n" % len(smuggled) + smuggled
            )
            assert response.status == 200
            seen = [(r.method, r.target, r.body) for r in w.origin.requests]
            assert seen == [(b"POST", b"/echo", smuggled)]

    run(go)


def test_bare_lf_in_header_value_never_reaches_the_origin(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            response = await w.exchange(
                b"GET " + w.url("/lf") + b" HTTP/1.1\r\nX-A: a\nX-Injected: 1\r\n\r\n"
            )
            assert response.status == 400
            assert w.origin.requests == []

    run(go)


def test_host_header_follows_the_absolute_target(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            response = await w.exchange(
                b"GET " + w.url("/vhost") + b" HTTP/1.1\r\nHost: internal.example\r\n\r\n"
            )
            assert response.status == 200
            hosts = [v for k, v in w.origin.requests[0].headers if k == b"host"]
            assert hosts == [f"127.0.0.1:{w.origin.port}".encode()]

    run(go)


def test_host_header_built_from_target_excludes_query(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, ALLOW_ORIGIN) as w:
            response = await w.exchange(b"GET " + w.url("?q=1") + b" HTTP/1.1\r\n\r\n")
            assert response.status == 200
            seen = w.origin.requests[0]
            assert seen.target == b"/?q=1"
            assert seen.header(b"host") == f"127.0.0.1:{w.origin.port}".encode()

    run(go)


def test_a_tunnel_carries_megabytes_both_ways_intact_under_backpressure(tmp_path: Path) -> None:
    """Opaque tunnels read into one shared buffer and copy only what a socket
    does not take at once: many megabytes each way, with a reader that falls
    behind (so writes stall and reading pauses), arrive byte for byte."""
    import hashlib
    import os

    size = 8 * 1024 * 1024
    up_data, down_data = os.urandom(size), os.urandom(size)

    async def go() -> None:
        got_up = bytearray()

        async def server(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
            writer.write(down_data)  # all at once: far more than any socket buffer
            while len(got_up) < size:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                got_up.extend(chunk)
                await aio.sleep(0.0005)  # a reader that falls behind
            await writer.drain()
            writer.close()

        origin = await aio.start_server(server, "127.0.0.1", 0)
        port = origin.sockets[0].getsockname()[1]
        proxy = Proxy(Chain([HostRulesHook(HostRules.parse([f"127.0.0.1:{port}"], []))]),
                      Audit(str(tmp_path / "net.jsonl")))  # fmt: skip
        server_p = await proxy.serve_tcp("127.0.0.1", 0, RUN_ID)
        proxy_port = server_p.sockets[0].getsockname()[1]
        reader, writer = await aio.open_connection("127.0.0.1", proxy_port)
        writer.write(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        for at in range(0, size, 1 << 20):
            writer.write(up_data[at : at + (1 << 20)])
            await writer.drain()
        got_down = bytearray()
        while len(got_down) < size:
            chunk = await reader.read(1 << 20)
            assert chunk, len(got_down)
            got_down.extend(chunk)
            await aio.sleep(0.0005)
        writer.close()
        assert hashlib.sha256(got_down).digest() == hashlib.sha256(down_data).digest()
        for _ in range(200):
            if len(got_up) >= size:
                break
            await aio.sleep(0.01)
        assert hashlib.sha256(got_up).digest() == hashlib.sha256(up_data).digest()
        server_p.close()
        origin.close()

    aio.run(aio.wait_for(go(), 60))


def test_a_proxy_told_it_is_ending_serves_no_new_connection(tmp_path: Path) -> None:
    """A worker whose first worker died (its ``live`` says no) takes no more
    connections, even in the loop turn that brings the news; its twin, live,
    forwards the same request."""
    hits: list[bytes] = []

    async def go() -> None:
        async def origin_cb(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
            hits.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            writer.close()

        origin = await aio.start_server(origin_cb, "127.0.0.1", 0)
        port = origin.sockets[0].getsockname()[1]
        rules = HostRules.parse([f"127.0.0.1:{port}"], [])
        proxy = Proxy(Chain([HostRulesHook(rules)]), Audit(str(tmp_path / "net.jsonl")))
        server = await proxy.serve_tcp("127.0.0.1", 0, RUN_ID)
        proxy_port = server.sockets[0].getsockname()[1]
        request = f"GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        for live, answered in ((False, False), (True, True)):
            proxy.live = lambda live=live: live  # type: ignore[misc]
            reader, writer = await aio.open_connection("127.0.0.1", proxy_port)
            writer.write(request)
            head = await reader.read(100)
            assert head.startswith(b"HTTP/1.1 200") is answered, head
            writer.close()
        assert len(hits) == 1  # only the live twin reached the origin
        server.close()
        origin.close()

    aio.run(aio.wait_for(go(), 20))
