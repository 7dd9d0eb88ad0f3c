"""corral's governing proxy: HTTP/1.1 forwarding, CONNECT tunnels and SOCKS5.

Every connection arrives through a door (a unix socket bound into one
sandbox, or a TCP listener for ``corral proxy serve``) that is tagged with the
run it belongs to.  The first byte tells the protocol: 0x05 is SOCKS5,
anything else is HTTP.  Each request or tunnel is decided by the hook chain
(:mod:`corral.net.hooks`), connected only to an address the chain accepted
after DNS, and written to the audit log when it ends.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import struct
import time
from typing import cast

from corral.net import dns as dnsmsg
from corral.net import http1, sniff
from corral.net.dns import FakePool
from corral.net.hooks import Chain, Destination
from corral.net.http1 import HttpError
from corral.net.rules import Verdict
from corral.runlog import dumps

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Coroutine

    from corral.net.audit import Audit

CONNECT_TIMEOUT = 10.0
TUNNEL_CHUNK = 256 * 1024

TRANSPARENT = b"\xfe"  # door preamble from the relay: a captured connection (see relay.py)
DNS = b"\xfd"  # door preamble from the relay: one DNS query

SOCKS_OK = 0x00
SOCKS_FAILURE = 0x01
SOCKS_NOT_ALLOWED = 0x02
SOCKS_HOST_UNREACHABLE = 0x04
SOCKS_REFUSED = 0x05
SOCKS_CMD_UNSUPPORTED = 0x07
SOCKS_ATYP_UNSUPPORTED = 0x08


class Refused(Exception):
    """The chain said no (status 403), or nothing it allowed could be reached (502)."""

    def __init__(self, verdict: Verdict, status: int = 403, refused: bool = False) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict
        self.status = status
        self.refused = refused  # the destination actively refused the connection

    @property
    def decision(self) -> str:
        return self.verdict.decision if self.status == 403 else "error"


class _Holding(asyncio.Protocol):
    """Holds what a tunnel's upstream sends before the tunnel takes it over."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.eof = False
        self.lost = False

    def data_received(self, data: bytes) -> None:
        self.buffer += data

    def eof_received(self) -> bool:
        self.eof = True
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


class Upstream:
    """A connection to a destination: streams for HTTP forwarding, or a bare
    transport for tunnels (no StreamReader to create, copy through and discard)."""

    __slots__ = ("address", "holding", "host", "port", "reader", "transport", "verdict", "writer")

    def __init__(self, host: str, port: int, address: str, verdict: Verdict) -> None:
        self.verdict = verdict
        self.host = host
        self.port = port
        self.address = address
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.transport: asyncio.Transport | None = None
        self.holding: _Holding | None = None

    def streams(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        assert self.reader is not None and self.writer is not None, "opened without streams"
        return self.reader, self.writer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.transport is not None:
            self.transport.close()


PEEK_LIMIT = 16 * 1024
PEEK_TIMEOUT = 3.0  # a client that sends nothing first is decided by name/address alone


class Proxy:
    def __init__(self, chain: Chain, audit: Audit, pinned: dict[str, str] | None = None) -> None:
        self.chain = chain
        self.audit = audit
        self.pinned = pinned or {}  # [network] hosts: name -> address, instead of DNS
        self.pools: dict[str, FakePool] = {}  # run id -> transparent-mode stand-in names
        self._flush_scheduled = False

    # -- doors -------------------------------------------------------------------

    async def serve_unix(self, sock: socket.socket, run_id: str) -> asyncio.Server:
        return await asyncio.start_unix_server(
            lambda r, w: self.handle(r, w, run_id), sock=sock, limit=http1.MAX_HEAD
        )

    async def serve_sock(self, sock: socket.socket, run_id: str) -> asyncio.Server:
        """Serve a TCP socket bound (and possibly shared with other workers) by the caller."""
        return await asyncio.start_server(
            lambda r, w: self.handle(r, w, run_id), sock=sock, limit=http1.MAX_HEAD
        )

    async def serve_tcp(self, host: str, port: int, run_id: str) -> asyncio.Server:
        return await asyncio.start_server(
            lambda r, w: self.handle(r, w, run_id),
            host,
            port,
            limit=http1.MAX_HEAD,
            reuse_address=True,
        )

    async def handle(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, run_id: str
    ) -> None:
        try:
            first = await reader.read(1)
            if not first:
                return
            if first == b"\x05":
                await self.socks5(reader, writer, run_id)
            elif first == TRANSPARENT:
                await self.captured(reader, writer, run_id)
            elif first == DNS:
                await self.dns(reader, writer, run_id)
            else:
                await self.http(reader, writer, run_id, first)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        except Exception as exc:  # one bad connection must never take the proxy down
            self.audit.record({"run_id": run_id, "decision": "error", "reason": repr(exc)})
        finally:
            writer.close()

    # -- decisions and upstream connections ---------------------------------------------

    async def open_upstream(self, dest: Destination, streams: bool = True) -> Upstream:
        verdict = self.chain.connect(dest)
        if not verdict.allowed:
            raise Refused(verdict)
        loop = asyncio.get_running_loop()
        literal = _literal(dest.host)
        pinned = self.pinned.get(dest.host.lower().rstrip("."))
        if literal is not None:
            candidates = [literal]
        elif pinned is not None:
            candidates = [pinned]
        else:
            try:
                infos = await loop.getaddrinfo(dest.host, dest.port, type=socket.SOCK_STREAM)
            except socket.gaierror:
                raise Refused(
                    Verdict(True, verdict.rule, f"cannot resolve {dest.host}"), 502
                ) from None
            candidates = list(dict.fromkeys(str(info[4][0]) for info in infos))
        refusal: Verdict | None = None
        error = ""
        refused = False
        for address in candidates:
            checked = self.chain.resolved(dest, address)
            if not checked.allowed:
                refusal = refusal or checked
                continue
            upstream = Upstream(dest.host, dest.port, address, verdict)
            try:
                # asyncio.timeout, not wait_for: no extra task per connection.  TCP_NODELAY
                # is already set by asyncio and uvloop on TCP transports.
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    if streams:
                        upstream.reader, upstream.writer = await asyncio.open_connection(
                            address, dest.port, limit=http1.MAX_HEAD
                        )
                    else:
                        transport, holding = await loop.create_connection(
                            _Holding, address, dest.port
                        )
                        upstream.transport = transport
                        upstream.holding = holding
            except (OSError, TimeoutError) as exc:
                error = f"{address}: {exc.strerror if isinstance(exc, OSError) else 'timeout'}"
                refused = isinstance(exc, ConnectionRefusedError)
                continue
            return upstream
        if refusal is not None and not error:
            raise Refused(refusal)
        raise Refused(
            Verdict(True, verdict.rule, f"cannot connect: {error or 'no address'}"), 502, refused
        )

    async def refuse_http(
        self, writer: asyncio.StreamWriter, dest: Destination, exc: Refused, started: float
    ) -> None:
        """Audit a refusal and tell an HTTP client: 403 with the decision, or 502."""
        self.log(dest, exc.verdict, exc.status, 0, 0, started)
        if exc.status == 403:
            await _send_denial(writer, exc.verdict, dest)
        else:
            await _send_error(writer, exc.status, exc.verdict.reason)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self.audit.flush()

    def log(
        self,
        dest: Destination,
        verdict: Verdict,
        status: int,
        up: int,
        down: int,
        started: float,
        address: str = "",
    ) -> None:
        self.audit.record(
            {
                "run_id": dest.run_id,
                "scheme": dest.scheme,
                "method": dest.method or None,
                "path": dest.path or None,
                "host": dest.host,
                "port": dest.port,
                "address": address or None,
                "decision": verdict.decision,
                "rule": verdict.rule,
                "reason": verdict.reason or None,
                "status": status,
                "bytes_up": up,
                "bytes_down": down,
                "duration": round(time.monotonic() - started, 6),
            }
        )
        if not self._flush_scheduled:  # lines buffered in the audit reach disk within 50 ms
            self._flush_scheduled = True
            asyncio.get_running_loop().call_later(0.05, self._flush)

    # -- HTTP ------------------------------------------------------------------------

    async def http(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        run_id: str,
        first: bytes,
    ) -> None:
        upstream: Upstream | None = None
        try:
            while True:
                try:
                    head = await http1.read_head(reader, first)
                    first = b""
                    if head is None:
                        return
                    request = http1.parse_request(head)
                except HttpError as exc:
                    await _send_error(writer, exc.status, exc.message)
                    return
                if request.method == b"CONNECT":
                    if upstream is not None:
                        upstream.close()
                        upstream = None
                    await self.connect(reader, writer, request, run_id)
                    return
                keep, upstream = await self.forward(reader, writer, request, run_id, upstream)
                if not keep:
                    return
        finally:
            if upstream is not None:
                upstream.close()

    async def forward(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        request: http1.Message,
        run_id: str,
        upstream: Upstream | None,
    ) -> tuple[bool, Upstream | None]:
        """One request/response exchange; returns (keep the client connection, upstream)."""
        started = time.monotonic()
        try:
            authority, host, port, path = http1.split_absolute(request.target)
            body_kind, body_len = http1.framing(request)
        except HttpError as exc:
            await _send_error(writer, exc.status, exc.message)
            return False, upstream
        dest = Destination(run_id, "http", host, port)
        dest.method = request.method.decode("ascii", "replace")
        dest.path = path.decode("utf-8", "replace")
        verdict = self.chain.connect(dest)
        extra = self.chain.request(dest, request) if verdict.allowed else None
        if extra is not None and not extra.allowed:
            verdict = extra
        if not verdict.allowed:
            self.log(dest, verdict, 403, 0, 0, started)
            await _send_denial(writer, verdict, dest)
            return body_kind == "none" and request.keep_alive(), upstream
        if upstream is not None and (upstream.host, upstream.port) != (host, port):
            upstream.close()
            upstream = None
        if upstream is None or upstream.streams()[0].at_eof():
            try:
                upstream = await self.open_upstream(dest)
            except Refused as exc:
                await self.refuse_http(writer, dest, exc, started)
                return False, None
        # RFC 9112 3.2.2: the target's authority replaces any Host the client sent,
        # so the origin cannot be steered to a virtual host the policy never saw.
        headers = [(k, v) for k, v in http1.forwardable(request, body_kind) if k != b"host"]
        headers.insert(0, (b"host", authority.encode("ascii", "replace")))
        up = down = 0
        status = 0
        try:
            head = http1.serialize_head(request.method + b" " + path + b" HTTP/1.1", headers)
            up += len(head) + await http1.copy_body(
                reader, upstream.streams()[1], body_kind, body_len, head
            )
            response_head = await http1.read_head(upstream.streams()[0])
            if response_head is None:
                raise HttpError(502, "upstream closed the connection without a response")
            while True:
                response = http1.parse_response(response_head)
                status = response.status
                kind, length = http1.framing(response, request.method)
                first = response.version + b" " + str(status).encode() + b" " + response.reason
                out = http1.serialize_head(first, http1.forwardable(response, kind))
                down += len(out)
                if 100 <= status < 200 and status != 101:
                    writer.write(out)
                    response_head = await http1.read_head(upstream.streams()[0])
                    if response_head is None:
                        raise HttpError(502, "upstream closed after an interim response")
                    continue
                break
            down += await http1.copy_body(upstream.streams()[0], writer, kind, length, out)
        except HttpError as exc:
            self.log(dest, verdict, exc.status, up, down, started, upstream.address)
            upstream.close()
            if not down:
                await _send_error(writer, exc.status, exc.message)
            return False, None
        except (ConnectionError, asyncio.IncompleteReadError):
            self.log(dest, verdict, status or 502, up, down, started, upstream.address)
            upstream.close()
            return False, None
        self.log(dest, verdict, status, up, down, started, upstream.address)
        reusable = kind != "close" and response.keep_alive()
        if not reusable:
            upstream.close()
            upstream = None
        return kind != "close" and request.keep_alive(), upstream

    async def connect(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        request: http1.Message,
        run_id: str,
    ) -> None:
        started = time.monotonic()
        try:
            host, port = http1.split_authority(request.target, 443)
        except HttpError as exc:
            await _send_error(writer, exc.status, exc.message)
            return
        dest = Destination(run_id, "connect", host, port)
        try:
            upstream = await self.open_upstream(dest, streams=False)
        except Refused as exc:
            await self.refuse_http(writer, dest, exc, started)
            return
        writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        up, down = await tunnel(reader, writer, upstream)
        self.log(dest, upstream.verdict, 200, up, down, started, upstream.address)

    # -- SOCKS5 ----------------------------------------------------------------------

    async def socks5(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, run_id: str
    ) -> None:
        started = time.monotonic()
        count = (await reader.readexactly(1))[0]
        methods = await reader.readexactly(count)
        if 0 not in methods:
            writer.write(b"\x05\xff")  # only "no authentication": the door already says who
            return
        writer.write(b"\x05\x00")
        version, command, _, atyp = await reader.readexactly(4)
        if version != 5:
            return
        if atyp == 1:
            host = socket.inet_ntop(socket.AF_INET, await reader.readexactly(4))
        elif atyp == 4:
            host = socket.inet_ntop(socket.AF_INET6, await reader.readexactly(16))
        elif atyp == 3:
            size = (await reader.readexactly(1))[0]
            host = (await reader.readexactly(size)).decode("utf-8", "replace")
        else:
            writer.write(_socks_reply(SOCKS_ATYP_UNSUPPORTED))
            return
        (port,) = struct.unpack("!H", await reader.readexactly(2))
        dest = Destination(run_id, "socks5", host, port)
        if command != 1:  # BIND and UDP ASSOCIATE: no way to govern them, so no
            verdict = Verdict(False, "socks5", "only SOCKS5 CONNECT is supported")
            self.log(dest, verdict, SOCKS_CMD_UNSUPPORTED, 0, 0, started)
            writer.write(_socks_reply(SOCKS_CMD_UNSUPPORTED))
            return
        try:
            upstream = await self.open_upstream(dest, streams=False)
        except Refused as exc:
            code = SOCKS_NOT_ALLOWED if exc.status == 403 else SOCKS_HOST_UNREACHABLE
            if exc.refused:
                code = SOCKS_REFUSED
            self.log(dest, exc.verdict, code, 0, 0, started)
            writer.write(_socks_reply(code))
            return
        writer.write(_socks_reply(SOCKS_OK))
        up, down = await tunnel(reader, writer, upstream)
        self.log(dest, upstream.verdict, SOCKS_OK, up, down, started, upstream.address)

    # -- transparent mode -----------------------------------------------------------------

    def pool(self, run_id: str) -> FakePool:
        return self.pools.setdefault(run_id, FakePool())

    async def dns(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, run_id: str
    ) -> None:
        started = time.monotonic()
        (size,) = struct.unpack("!H", await reader.readexactly(2))
        packet = await reader.readexactly(size)
        query = dnsmsg.parse_query(packet)
        if query is None:
            reply = dnsmsg.error_reply(packet, dnsmsg.RCODE_FORMERR)
        else:
            verdict = self.chain.dns(run_id, query.name)
            if verdict.allowed:
                address = self.pool(run_id).address_for(query.name)
                reply = dnsmsg.answer(query, address)
            else:
                reply = dnsmsg.answer(query, None, dnsmsg.RCODE_NXDOMAIN)
            dest = Destination(run_id, "dns", query.name, 53)
            self.log(
                dest,
                verdict,
                0 if verdict.allowed else dnsmsg.RCODE_NXDOMAIN,
                len(packet),
                len(reply),
                started,
            )
        writer.write(struct.pack("!H", len(reply)) + reply)
        await writer.drain()

    async def captured(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, run_id: str
    ) -> None:
        """A connection the sandbox's nftables rules redirected: name it, decide, splice."""
        started = time.monotonic()
        line = await reader.readuntil(b"\n")
        address, _, port_text = line.decode("ascii", "replace").strip().rpartition(" ")
        port = int(port_text)
        named = self.pool(run_id).name_for(address)
        early = b""
        try:
            while len(early) < PEEK_LIMIT and not sniff.looks_complete(early):
                chunk = await asyncio.wait_for(reader.read(PEEK_LIMIT), PEEK_TIMEOUT)
                if not chunk:
                    break
                early += chunk
        except TimeoutError:
            pass  # a protocol where the server speaks first
        claimed = sniff.tls_server_name(early) or sniff.http_host(early)
        host = named or claimed or address
        dest = Destination(run_id, "transparent", host, port)
        if named and claimed and claimed.lower().rstrip(".") != named:
            # The stand-in address was handed out for `named`; a different SNI or
            # Host would be domain fronting through an allowed name.
            verdict = Verdict(
                False, "name-mismatch", f"connected to {named} but asked for {claimed}"
            )
            self.log(dest, verdict, 403, 0, 0, started)
            return
        if named is None and _in_pool(address):
            verdict = Verdict(False, "default", "stand-in address from an earlier run")
            self.log(dest, verdict, 403, 0, 0, started)
            return
        try:
            upstream = await self.open_upstream(dest, streams=False)
        except Refused as exc:
            self.log(dest, exc.verdict, exc.status, 0, 0, started)
            return
        up, down = await tunnel(reader, writer, upstream, early)
        self.log(dest, upstream.verdict, 200, up + len(early), down, started, upstream.address)


def run_loop(main: Coroutine[object, object, None]) -> None:
    """Run the proxy's event loop: uvloop when installed (several times faster)."""
    try:
        import uvloop  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


def _in_pool(address: str) -> bool:
    try:
        return ipaddress.ip_address(address) in dnsmsg.POOL
    except ValueError:
        return False


def _socks_reply(code: int) -> bytes:
    return bytes([5, code, 0, 1, 0, 0, 0, 0, 0, 0])


def _literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


class _Pump(asyncio.Protocol):
    """One direction of a tunnel at the transport level: bytes received on this
    side are written straight to the peer (no StreamReader copies, no task per
    direction).  Back-pressure: when the peer's buffer fills, this side stops
    reading until it drains."""

    def __init__(
        self, transport: asyncio.Transport, peer: asyncio.Transport, done: asyncio.Future[None]
    ) -> None:
        self.transport = transport
        self.peer = peer
        self.done = done
        self.count = 0
        self.eof = False
        self.partner: _Pump | None = None

    def data_received(self, data: bytes) -> None:
        self.count += len(data)
        self.peer.write(data)

    def eof_received(self) -> bool:
        self.eof = True
        if self.peer.can_write_eof() and not self.peer.is_closing():
            self.peer.write_eof()
        if self.partner is not None and self.partner.eof:
            self.finish()
        return True  # keep the other direction open (half-close)

    def connection_lost(self, exc: Exception | None) -> None:
        self.finish()

    # the *peer* pump gets these for writes into our transport; see tunnel()
    def pause_writing(self) -> None:
        if self.partner is not None:
            self.partner.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.partner is not None and not self.partner.transport.is_closing():
            self.partner.transport.resume_reading()

    def finish(self) -> None:
        for transport in (self.transport, self.peer):
            transport.close()
        if not self.done.done():
            self.done.set_result(None)


def _take_buffered(reader: asyncio.StreamReader) -> bytes:
    """What the stream layer already read but nobody consumed (e.g. a TLS
    ClientHello sent right behind CONNECT).  asyncio has no public way to take
    it over when the transport changes hands."""
    buffer: bytearray = reader._buffer  # type: ignore[attr-defined]
    data = bytes(buffer)
    buffer.clear()
    return data


async def tunnel(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    upstream: Upstream,
    first_up: bytes = b"",
) -> tuple[int, int]:
    """Splice the client and a bare upstream transport until both sides are done;
    returns (bytes up, bytes down).  ``first_up`` was read from the client already."""
    # uvloop's transports are not asyncio.Transport subclasses, but behave as one
    client = cast("asyncio.Transport", client_w.transport)
    server = upstream.transport
    holding = upstream.holding
    assert server is not None and holding is not None, "tunnels use a bare transport"
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    up = _Pump(client, server, done)  # reads the client, writes the server
    down = _Pump(server, client, done)
    up.partner, down.partner = down, up
    early_up = first_up + _take_buffered(client_r)
    early_down = bytes(holding.buffer)
    client_eof = client_r.at_eof()
    client.set_protocol(up)
    server.set_protocol(down)
    try:
        if early_up:
            up.data_received(early_up)
        if early_down:
            down.data_received(early_down)
        if holding.lost:
            down.finish()
        if client_eof:
            up.eof_received()
        if holding.eof:
            down.eof_received()
        for transport in (client, server):
            if not transport.is_closing():
                transport.resume_reading()
        await done
    finally:
        client.close()
        server.close()
    return up.count, down.count


async def _send_error(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    body = (message + "\n").encode()
    writer.write(
        http1.serialize_head(
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}".encode(),
            [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        )
        + body
    )
    try:
        await writer.drain()
    except ConnectionError:
        pass


async def _send_denial(writer: asyncio.StreamWriter, verdict: Verdict, dest: Destination) -> None:
    body = (
        dumps(
            {
                "decision": "deny",
                "rule": verdict.rule,
                "reason": verdict.reason,
                "host": dest.host,
                "port": dest.port,
            }
        )
        + "\n"
    ).encode()
    writer.write(
        http1.serialize_head(
            b"HTTP/1.1 403 Forbidden",
            [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"x-corral-decision", f"deny; rule={verdict.rule}".encode("ascii", "replace")),
            ],
        )
        + body
    )
    try:
        await writer.drain()
    except ConnectionError:
        pass


_REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    505: "HTTP Version Not Supported",
}
