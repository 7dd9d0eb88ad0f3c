"""corral's governing proxy: HTTP/1.1 forwarding, CONNECT tunnels and SOCKS5.

Every connection arrives on a socket tagged with the run it belongs to: the
sandbox's own listeners (made in its network namespace and handed over, see
:mod:`corral.netns`), a unix door bound into a container for corral's
relay, or a TCP listener for ``corral proxy serve`` and the landlock tier.
On a proxy port the first byte tells the protocol: 0x05 is SOCKS5, anything
else is HTTP.  A unix door also takes the relay's frames, each one byte
first: 0xfb a proxy connection follows, 0xfc a connection to a host service
at its own address (``ADDRESS PORT\n`` follows), 0xfd a DNS query.  A frame
is only another way to ask what CONNECT and the resolver already answer, by
the same rules; on a TCP port those bytes are simply not HTTP and get a 400.
Besides: a service listener is a CONNECT to its own address, the resolver
socket answers DNS from the policy, and transparent mode's capture port
takes connections nftables redirected.

Each destination is normalized once into a :class:`~corral.net.hooks.Destination`
(:mod:`corral.net.names`), decided by the hook chain
(:mod:`corral.net.hooks`), connected only to an address the chain accepted
after DNS, and written to the audit log when it ends.

Per connection, memory is bounded (bodies are streamed, see
:mod:`corral.net.http1`; tunnels stop reading while the other side's buffer
is full) and so is waiting for a client: ``IDLE_TIMEOUT`` for a request to
begin, ``HEAD_TIMEOUT`` for it to be complete once begun.
"""

from __future__ import annotations

import _socket as socket
import os
import struct
import sys
import time

from corral.net import aio, http1, ip, sniff
from corral.net import dns as dnsmsg
from corral.net.dns import FakePool
from corral.net.hooks import Asker, Chain, Destination, Request, Response
from corral.net.http1 import HttpError
from corral.net.names import BadName, authority, is_address, normalize, printable
from corral.net.rules import Verdict
from corral.runlog import dumps

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ssl
    from collections.abc import Awaitable, Callable, Coroutine
    from typing import TypeGuard

    from corral.net.audit import Audit
    from corral.net.hooks import BodyFilter
    from corral.net.tls import Interceptor

    Resolver = Callable[[str, int], Awaitable[list[str]]]

CONNECT_TIMEOUT = 10.0
TUNNEL_CHUNK = 256 * 1024
# A client connection that sends no request for this long is closed (keep-alive
# clients such as pip and npm reopen one when they need it; squid's default).
IDLE_TIMEOUT = 120.0
# A request head (or a SOCKS5 handshake, or a door frame) must be complete this
# long after its first byte: a slow trickle (slowloris) gets 408 and is closed.
HEAD_TIMEOUT = 30.0
SWEEP_EVERY = 1.0  # how often the timeouts above are checked (their precision)
# An idle TLS connection to an intercepted origin is kept this long for the next
# client connection of the same run (a new handshake costs more than the request);
# short, so that an origin closing idle connections (Node: after 5 s) rarely races it.
PARK_IDLE = 2.0
PARK_MAX = 64  # idle connections kept per destination

# The relay's frames on a unix door (see relay.py): what follows the first byte.
PLAIN = b"\xfb"  # a proxy connection (HTTP or SOCKS5) from the relay's proxy port
SERVICE = b"\xfc"  # "ADDRESS PORT\n", then a connection to that host service
SERVICE_OK = b"\x00"  # the proxy's answer to SERVICE: connected, the service's bytes follow
DNS = b"\xfd"  # one DNS query: 2-byte length + packet
SO_ORIGINAL_DST = 80  # netfilter: where a redirected connection was going
DNS_INFLIGHT = 64  # queries answered at once per resolver socket; more are dropped

SOCKS_OK = 0x00
SOCKS_FAILURE = 0x01
SOCKS_NOT_ALLOWED = 0x02
SOCKS_HOST_UNREACHABLE = 0x04
SOCKS_REFUSED = 0x05
SOCKS_CMD_UNSUPPORTED = 0x07
SOCKS_ATYP_UNSUPPORTED = 0x08

BAD_NAME = "bad-name"  # the rule an audit line names for a host that is no destination
MALFORMED = "malformed"  # ... for a request refused before it had a destination


class Refused(Exception):
    """The chain said no (status 403), or nothing it allowed could be reached (502)."""

    def __init__(self, verdict: Verdict, status: int = 403, refused: bool = False) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict
        self.status = status
        self.refused = refused  # the destination actively refused the connection


class _ResponseRefused(Exception):
    """A response hook denied the head the origin sent (the client gets a 403)."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict


class _RequestRefused(Exception):
    """What the hooks made of a request cannot go out (``status``: 502 or 413)."""

    def __init__(self, status: int, verdict: Verdict) -> None:
        super().__init__(verdict.reason)
        self.status = status
        self.verdict = verdict


class NoDestination(Exception):
    """A request whose host can be no destination (audited already)."""

    def __init__(self, verdict: Verdict, shown: str, port: int) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict
        self.shown = shown
        self.port = port


class _Holding(aio.Protocol):
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


class _Trip:
    """One request that was decided and has an upstream connection: what its round
    trip and its audit line need, and the bytes and status so far."""

    __slots__ = (
        "dest",
        "down",
        "hooked",
        "request",
        "started",
        "status",
        "up",
        "upstream",
        "verdict",
    )

    def __init__(
        self,
        dest: Destination,
        request: http1.Message,
        hooked: Request | None,
        verdict: Verdict,
        upstream: Upstream,
        started: float,
    ) -> None:
        self.dest = dest
        self.request = request
        self.hooked = hooked
        self.verdict = verdict
        self.upstream = upstream
        self.started = started
        self.up = self.down = self.status = 0


class Upstream:
    """A connection to a destination: streams for HTTP forwarding, or a bare
    transport for tunnels (no StreamReader to create, copy through and discard)."""

    __slots__ = (
        "address",
        "handover",
        "holding",
        "host",
        "port",
        "reader",
        "transport",
        "verdict",
        "writer",
    )

    def __init__(self, host: str, port: int, address: str, verdict: Verdict) -> None:
        self.verdict = verdict
        self.handover = False  # a tunnel found plain HTTP: serve it request by request
        self.host = host
        self.port = port
        self.address = address
        self.reader: aio.StreamReader | None = None
        self.writer: aio.StreamWriter | None = None
        self.transport: aio.Transport | None = None
        self.holding: _Holding | None = None

    def protocol(self) -> _Holding:
        """The factory create_connection calls: what holds the upstream's first bytes."""
        assert self.holding is not None
        return self.holding

    def streams(self) -> tuple[aio.StreamReader, aio.StreamWriter]:
        assert self.reader is not None and self.writer is not None, "opened without streams"
        return self.reader, self.writer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.transport is not None:
            self.transport.close()


class _Clock:
    """When a client connection began waiting for a request (0.0: it is not waiting).

    One sweeper task checks every connection's clock each SWEEP_EVERY seconds;
    a timer per request instead cost about a tenth of keep-alive throughput."""

    __slots__ = ("begun", "partial", "reader", "since")

    def __init__(self, reader: aio.StreamReader, now: float) -> None:
        self.reader = reader
        self.since = now
        self.partial = False  # the caller holds bytes of the head already
        self.begun = 0.0  # when the sweeper first saw a partial head

    def waiting(self, now: float) -> None:
        self.since = now
        self.partial = False
        self.begun = 0.0


# Methods whose content has no defined meaning (RFC 9110 9.3): origins often leave it
# unread.  A request carrying some is the last on its upstream connection.
CONTENT_IGNORED = frozenset({b"GET", b"HEAD", b"DELETE", b"OPTIONS", b"TRACE"})
PEEK_LIMIT = 16 * 1024
PEEK_TIMEOUT = 3.0  # a client that sends nothing first is decided by name/address alone


async def system_resolve(host: str, port: int) -> list[str]:
    """The host's resolver (getaddrinfo); ``host`` is a normalized name."""
    infos = await aio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICSERV
    )
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class Proxy:
    def __init__(
        self,
        chain: Chain,
        audit: Audit,
        pinned: dict[str, str] | None = None,
        resolve: Resolver | None = None,
        idle_timeout: float = IDLE_TIMEOUT,
        head_timeout: float = HEAD_TIMEOUT,
        stand_ins: bool = False,
        tls: Interceptor | None = None,
        asker: Asker | None = None,
    ) -> None:
        self.chain = chain
        self.audit = audit
        # TLS inspection, for the destinations the chain says need it (None: never)
        self.tls = tls
        self.asker = asker or Asker()
        # [network] hosts: name -> address, instead of DNS; keyed by the one spelling
        # a Destination has, so no other spelling of a pinned name reaches DNS
        self.pinned = {normalize(k): normalize(v) for k, v in (pinned or {}).items()}
        self.resolve: Resolver = resolve or system_resolve
        self.idle_timeout = idle_timeout
        self.head_timeout = head_timeout
        # transparent mode: DNS answers are stand-in addresses mapped back to names
        self.stand_ins = stand_ins
        # called once, when the first connection or query arrives (the door's "used")
        self.on_first_use: Callable[[], None] | None = None
        # asked before each new connection or query: False once the proxy is to
        # stop (a worker whose first worker died serves nothing more, at once)
        self.live: Callable[[], bool] = _always
        self.pools: dict[str, FakePool] = {}  # run id -> transparent-mode stand-in names
        self._dns_inflight = 0
        self._flush_scheduled = False
        self._clocks: set[_Clock] = set()
        self._settled: aio.Future | None = None  # settle() waits on it: no connection left
        self._sweeper: aio.Task | None = None
        # (run id, host, port) -> idle upstream TLS connections, newest last
        self._parked: dict[tuple[str, str, int], list[tuple[float, Upstream]]] = {}

    # -- doors -------------------------------------------------------------------

    async def serve_unix(self, sock: socket.socket, run_id: str, frames: bool = True) -> aio.Server:
        """Serve a unix door; ``frames``: it also takes the relay's frames."""
        return await aio.start_unix_server(
            lambda r, w: self.handle(r, w, run_id, frames), sock=sock, limit=http1.MAX_HEAD
        )

    async def serve_sock(self, sock: socket.socket, run_id: str) -> aio.Server:
        """Serve a TCP socket bound (and possibly shared with other workers) by the caller."""
        return await aio.start_server(
            lambda r, w: self.handle(r, w, run_id), sock=sock, limit=http1.MAX_HEAD
        )

    async def serve_tcp_door(self, sock: socket.socket, run_id: str) -> aio.Server:
        """Serve the landlock tier's door, a TCP port on the host's loopback, to
        clients of this process's uid only (:mod:`corral.net.peer`): another
        local user must not send requests through this run's policy and secrets."""
        uid = os.getuid()

        async def on_client(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
            conn = writer.get_extra_info("socket")
            from corral.net import peer

            try:
                theirs = peer.client_uid(conn)
            except OSError:
                theirs = None
            if theirs != uid:
                who = "an unknown user" if theirs is None else f"uid {theirs}"
                verdict = Verdict(False, "door-peer", f"a connection from {who}, not the run's")
                self._record(run_id, "tcp", "", "", "the door", 0, verdict, 403, 0, 0, 0.0)
                writer.transport.abort()
                return
            await self.handle(reader, writer, run_id)

        return await aio.start_server(on_client, sock=sock, limit=http1.MAX_HEAD)

    async def serve_tcp(self, host: str, port: int, run_id: str) -> aio.Server:
        return await aio.start_server(
            lambda r, w: self.handle(r, w, run_id),
            host,
            port,
            limit=http1.MAX_HEAD,
            reuse_address=True,
        )

    async def serve_service(
        self, sock: socket.socket, run_id: str, host: str, port: int
    ) -> aio.Server:
        """Serve a listener at a host service's own address inside the sandbox: each
        connection is a CONNECT to ``host:port``, decided and audited as one."""

        async def on_client(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
            if not self.live():
                writer.transport.abort()
                return
            # a clock like any client's, so settle() waits for its audit line, written
            # as it ends; busy from the start (a tunnel: no idle or head timeout)
            clock = self._clock(reader)
            clock.since = 0.0
            work = self.service(reader, writer, run_id, host, port)
            await self._guarded(run_id, writer, work, clock)

        return await aio.start_server(on_client, sock=sock, limit=http1.MAX_HEAD)

    async def serve_capture(
        self,
        sock: socket.socket,
        run_id: str,
        original: Callable[[object], tuple[str, int]] | None = None,
    ) -> aio.Server:
        """Serve transparent mode's capture port: where each connection was going
        comes from netfilter (``original``, for tests: any function of the socket)."""
        find = original or original_destination

        async def on_client(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
            if not self.live():
                writer.transport.abort()
                return
            clock = self._clock(reader)
            clock.partial = True  # what the client sends first is read within HEAD_TIMEOUT
            try:
                address, port = find(writer.get_extra_info("socket"))
            except (OSError, BadName):
                self._forget(clock)
                writer.close()
                return
            await self._guarded(
                run_id, writer, self.captured(reader, writer, run_id, clock, address, port), clock
            )

        return await aio.start_server(on_client, sock=sock, limit=http1.MAX_HEAD)

    async def serve_dns(self, sock: socket.socket, run_id: str) -> aio.BaseTransport:
        """Serve the sandbox's resolver (a UDP socket): answers from the policy."""
        loop = aio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Resolver(self, run_id), sock=sock
        )
        return transport

    def guard(self, run_id: str) -> None:
        """Send whatever the event loop would print (an exception in a callback, a
        task that failed unobserved) to the audit log as one line, counted."""

        def on_error(loop: aio.AbstractEventLoop, context: dict[str, object]) -> None:
            exc = context.get("exception")
            where = str(context.get("message") or "event loop")
            error = exc if isinstance(exc, BaseException) else None
            self.audit.internal_error(run_id, where, error)

        aio.get_running_loop().set_exception_handler(on_error)

    async def handle(
        self,
        reader: aio.StreamReader,
        writer: aio.StreamWriter,
        run_id: str,
        frames: bool = False,
    ) -> None:
        if not self.live():
            writer.transport.abort()
            return
        clock = self._clock(reader)
        await self._guarded(
            run_id, writer, self._dispatch(reader, writer, run_id, frames, clock), clock
        )

    async def _dispatch(
        self,
        reader: aio.StreamReader,
        writer: aio.StreamWriter,
        run_id: str,
        frames: bool,
        clock: _Clock,
    ) -> None:
        first = await reader.read(1)
        if frames and first == PLAIN:
            first = await reader.read(1)  # what follows is the client's, not a frame
        elif frames and first == SERVICE:
            clock.partial = True
            line = await reader.readuntil(b"\n")
            clock.since = 0.0
            try:
                host, port = _address_frame(line)
            except BadName as exc:
                self.refuse_name(run_id, "service", line.decode("latin-1"), 0, exc, 400)
                return
            await self.service(reader, writer, run_id, host, port, ack=True)
            return
        elif frames and first == DNS:
            clock.partial = True
            await self.dns(reader, writer, run_id, clock)
            return
        if not first:
            return
        clock.partial = True
        if first == b"\x05":
            await self.socks5(reader, writer, run_id, clock)
        elif first[0] in http1.TOKEN or first in b"\r\n":
            await self.http(reader, writer, run_id, first, clock)
        else:  # no method starts so: say so now, not when a head never ends
            await self.malformed(writer, run_id, "http", HttpError(400, "neither HTTP nor SOCKS5"))

    async def _guarded(
        self,
        run_id: str,
        writer: aio.StreamWriter,
        work: Coroutine[object, object, None],
        clock: _Clock | None = None,
    ) -> None:
        """Run one connection's work; whatever happens, it ends closed and quiet."""
        try:
            await work
        except (ConnectionError, aio.IncompleteReadError, TimeoutError):
            pass
        except aio.LimitOverrunError:
            pass  # a frame line longer than any address
        except aio.CancelledError:
            # The worker is stopping.  Ending normally matters: Python 3.11's
            # start_server reports a cancelled connection task as an error, with
            # a traceback on the terminal of whoever started the run.
            pass
        except Exception as exc:  # one bad connection must never take the proxy down
            self.audit.internal_error(run_id, "connection", exc)
        finally:
            if clock is not None:
                self._forget(clock)
            writer.close()

    async def settle(self, within: float) -> None:
        """Wait, at most ``within`` seconds, for the connections still open to end.
        The run's end closes every client's socket, but a tunnel writes its audit
        line only once it has seen that: stopping the worker at once lost the last
        one now and then (a connection cancelled mid-way records nothing)."""
        if not self._clocks:
            return
        self._settled = aio.get_running_loop().create_future()
        try:
            await aio.wait_for(self._settled, within)
        except TimeoutError:
            pass  # cut off unrecorded: what settle() is there to make rare

    def _forget(self, clock: _Clock) -> None:
        """A connection has ended (its clock no longer swept)."""
        self._clocks.discard(clock)
        if not self._clocks and self._settled is not None and not self._settled.done():
            self._settled.set_result(None)

    def used(self) -> None:
        """Something arrived: tell whoever waits for the first use, once."""
        if self.on_first_use is not None:
            first, self.on_first_use = self.on_first_use, None
            first()

    def _clock(self, reader: aio.StreamReader) -> _Clock:
        self.used()
        loop = aio.get_running_loop()
        clock = _Clock(reader, loop.time())
        self._clocks.add(clock)
        if self._sweeper is None:
            self._sweeper = loop.create_task(self._sweep())
        return clock

    async def _sweep(self) -> None:
        """Expire clients that wait too long: no request (idle) or an unfinished head."""
        loop = aio.get_running_loop()
        every = min(SWEEP_EVERY, self.idle_timeout / 4, self.head_timeout / 4)
        while True:
            await aio.sleep(every)
            now = loop.time()
            for clock in list(self._clocks):
                if not clock.since:
                    continue  # busy: a body, an upstream, a tunnel
                if clock.partial or clock.reader.buffered:
                    clock.begun = clock.begun or now
                    expired = now - clock.begun >= self.head_timeout
                else:
                    expired = now - clock.since >= self.idle_timeout
                if expired:
                    clock.since = 0.0
                    clock.reader.set_exception(TimeoutError())  # the waiting read raises
            if self._parked:
                self._unpark_stale(now)

    # -- decisions and upstream connections ---------------------------------------------

    async def decide(self, dest: Destination) -> Verdict:
        """The chain's verdict on a destination; an ask waits for its answer."""
        verdict = self.chain.connect(dest)
        if verdict.ask:
            verdict = await self.asker.ask(dest, None, verdict)
        return verdict

    def park(self, dest: Destination, upstream: Upstream) -> None:
        """Keep an idle upstream TLS connection for the run's next client connection."""
        key = (dest.run_id, upstream.host, upstream.port)
        idle = self._parked.setdefault(key, [])
        if len(idle) >= PARK_MAX or upstream.streams()[0].at_eof():
            upstream.close()
            return
        idle.append((aio.get_running_loop().time(), upstream))
        if self._sweeper is None:
            self._sweeper = aio.get_running_loop().create_task(self._sweep())

    def unpark(self, dest: Destination) -> Upstream | None:
        """The newest parked connection to ``dest`` still open and fresh, if any."""
        idle = self._parked.get((dest.run_id, dest.host, dest.port))
        now = aio.get_running_loop().time()
        while idle:
            parked_at, upstream = idle.pop()
            reader, writer = upstream.streams()
            if now - parked_at < PARK_IDLE and not reader.at_eof() and not writer.is_closing():
                return upstream
            upstream.close()
        return None

    def _unpark_stale(self, now: float) -> None:
        for key, idle in list(self._parked.items()):
            keep = [(t, u) for t, u in idle if now - t < PARK_IDLE]
            for t, u in idle:
                if now - t >= PARK_IDLE:
                    u.close()
            if keep:
                self._parked[key] = keep
            else:
                del self._parked[key]

    async def open_upstream(
        self,
        dest: Destination,
        streams: bool = True,
        tls: ssl.SSLContext | None = None,
        verdict: Verdict | None = None,
    ) -> Upstream:
        """Connect to an address of ``dest`` the chain accepts (``verdict``: the
        chain's answer already asked for); with ``tls``, as a TLS client verifying
        ``dest.host`` (an untrusted origin is a 502 refusal, never a pass)."""
        if not streams and self.chain.needs_inspection(dest.host, dest.port):
            # an opaque tunnel to a host whose requests a rule must see (a proxy
            # without TLS interception, e.g. `corral proxy serve`): fail closed
            raise Refused(
                Verdict(False, "needs-inspection", "a rule must see the requests to this host")
            )
        if verdict is None:  # (decide(), inlined: this runs for every tunnel)
            verdict = self.chain.connect(dest)
            if verdict.ask:
                verdict = await self.asker.ask(dest, None, verdict)
        if not verdict.allowed:
            raise Refused(verdict)
        loop = aio.get_running_loop()
        candidates = await self._addresses(dest, verdict)
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
                # (corral.net.aio sets TCP_NODELAY on every TCP connection)
                async with aio.timeout(CONNECT_TIMEOUT):
                    if streams:
                        upstream.reader, upstream.writer = await aio.open_connection(
                            address,
                            dest.port,
                            limit=http1.MAX_HEAD,
                            ssl=tls,
                            server_hostname=dest.host if tls else None,
                        )
                    else:
                        upstream.holding = _Holding()
                        upstream.transport, _ = await loop.create_connection(
                            upstream.protocol, address, dest.port
                        )
            except (OSError, TimeoutError) as exc:
                if _ssl_error(exc):
                    from corral.net.tls import upstream_refusal

                    raise Refused(upstream_refusal(exc, dest.host), 502) from None
                error = f"{address}: {exc.strerror if isinstance(exc, OSError) else 'timeout'}"
                refused = isinstance(exc, ConnectionRefusedError)
                continue
            return upstream
        if refusal is not None and not error:
            raise Refused(refusal)
        raise Refused(
            Verdict(True, verdict.rule, f"cannot connect: {error or 'no address'}"), 502, refused
        )

    async def _addresses(self, dest: Destination, verdict: Verdict) -> list[str]:
        """An address as such, a pinned name's address, or what DNS says: for the
        normalized host only, so the name resolved is the name decided."""
        host = dest.host
        if is_address(host):
            return [host]
        pinned = self.pinned.get(host)
        if pinned is not None:
            return [pinned]
        try:
            return await self.resolve(host, dest.port)
        except OSError:
            raise Refused(Verdict(True, verdict.rule, f"cannot resolve {host}"), 502) from None

    async def refuse_http(
        self, writer: aio.StreamWriter, dest: Destination, exc: Refused, started: float
    ) -> None:
        """Audit a refusal and tell an HTTP client: 403 with the decision, or 502
        (as JSON when the chain's parts refused, e.g. an untrusted origin)."""
        self.log(dest, exc.verdict, exc.status, 0, 0, started)
        if exc.status == 403 or not exc.verdict.allowed:
            await _send_denial(writer, exc.status, exc.verdict, dest.host, dest.port)
        else:
            await _send_error(writer, exc.status, exc.verdict.reason)

    def refuse_name(
        self, run_id: str, scheme: str, raw: str, port: int, exc: BadName, status: int
    ) -> tuple[Verdict, str]:
        """Audit a host that is no destination; returns the verdict and how to show it."""
        verdict = Verdict(False, BAD_NAME, exc.reason)
        shown = printable(raw)
        self._record(run_id, scheme, "", "", shown, port, verdict, status, 0, 0, 0.0)
        return verdict, shown

    def refuse_malformed(
        self,
        run_id: str,
        scheme: str,
        status: int,
        why: str,
        host: str = "",
        port: int = 0,
        method: str = "",
    ) -> None:
        """Audit a request refused before it had a destination (a head that does not
        parse, a target that is no authority, a SOCKS5 greeting corral does not
        take): every request leaves a line, however it was refused."""
        verdict = Verdict(False, MALFORMED, why)
        self._record(run_id, scheme, method, "", printable(host), port, verdict, status, 0, 0, 0.0)

    async def malformed(
        self,
        writer: aio.StreamWriter,
        run_id: str,
        scheme: str,
        exc: HttpError,
        method: bytes = b"",
    ) -> None:
        """refuse_malformed for an HttpError, then the client told."""
        self.refuse_malformed(
            run_id, scheme, exc.status, exc.message, method=method.decode("latin-1", "replace")
        )
        await _send_error(writer, exc.status, exc.message)

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
        extra: dict[str, object] | None = None,
    ) -> None:
        if verdict.detail:
            extra = {**verdict.detail, **(extra or {})}
        self._record(
            dest.run_id,
            dest.scheme,
            dest.method,
            dest.path,
            dest.host,
            dest.port,
            verdict,
            status,
            up,
            down,
            started,
            address,
            extra,
        )

    def _record(
        self,
        run_id: str,
        scheme: str,
        method: str,
        path: str,
        host: str,
        port: int,
        verdict: Verdict,
        status: int,
        up: int,
        down: int,
        started: float,
        address: str = "",
        extra: dict[str, object] | None = None,
    ) -> None:
        entry: dict[str, object] = {
            "run_id": run_id,
            "scheme": scheme,
            "method": method or None,
            "path": path or None,
            "host": host,
            "port": port,
            "address": address or verdict.address or None,
            "decision": verdict.decision,
            "rule": verdict.rule,
            "reason": verdict.reason or None,
            "status": status,
            "bytes_up": up,
            "bytes_down": down,
            "duration": round(time.monotonic() - started, 6) if started else 0.0,
        }
        if extra:
            entry.update(extra)
        self.audit.record(entry)
        if not self._flush_scheduled:  # lines buffered in the audit reach disk within 50 ms
            self._flush_scheduled = True
            aio.get_running_loop().call_later(0.05, self._flush)

    # -- HTTP ------------------------------------------------------------------------

    async def http(
        self,
        reader: aio.StreamReader,
        writer: aio.StreamWriter,
        run_id: str,
        first: bytes,
        clock: _Clock,
    ) -> None:
        upstream: Upstream | None = None
        loop = aio.get_running_loop()
        try:
            while True:
                try:
                    head = await http1.read_head(reader, first)
                    if head is None:
                        return
                    request = http1.parse_request(head)
                except TimeoutError:
                    if first or clock.partial or reader.buffered:
                        late = HttpError(408, "request head not complete in time")
                        await self.malformed(writer, run_id, "http", late)
                    return
                except HttpError as exc:
                    await self.malformed(writer, run_id, "http", exc)
                    return
                first = b""
                clock.since = 0.0  # busy until the exchange is done
                if request.method == b"CONNECT":
                    if upstream is not None:
                        upstream.close()
                        upstream = None
                    await self.connect(reader, writer, request, run_id)
                    return
                try:  # (not a coroutine of its own: this runs for every request)
                    dest, path = self.plain_target(request, run_id)
                except HttpError as exc:
                    await self.malformed(writer, run_id, "http", exc, request.method)
                    return
                except NoDestination as exc:
                    await _send_denial(writer, 400, exc.verdict, exc.shown, exc.port)
                    return
                keep, upstream = await self.exchange(reader, writer, dest, request, path, upstream)
                if not keep:
                    return
                clock.waiting(loop.time())
        finally:
            if upstream is not None:
                upstream.close()

    def plain_target(self, request: http1.Message, run_id: str) -> tuple[Destination, bytes]:
        """A plain-HTTP request's destination (absolute-form target) and origin-form
        path; HttpError, or NoDestination (audited) for a host that is none."""
        host, port, path = http1.split_absolute(request.target)
        try:
            dest = Destination(run_id, "http", host, port)
        except BadName as exc:
            verdict, shown = self.refuse_name(run_id, "http", host, port, exc, 400)
            raise NoDestination(verdict, shown, port) from None
        dest.method = request.method.decode("ascii", "replace")
        dest.path = path.decode("utf-8", "replace")
        return dest, path

    async def exchange(
        self,
        reader: aio.StreamReader,
        writer: aio.StreamWriter,
        dest: Destination,
        request: http1.Message,
        path: bytes,
        upstream: Upstream | None,
        tls: ssl.SSLContext | None = None,
    ) -> tuple[bool, Upstream | None]:
        """One request/response exchange with ``dest``: plain HTTP, or a request
        inside intercepted TLS (``tls`` then verifies the origin).  Both go through
        the chain's request hooks (corral.net.hooks).  Returns (keep the client
        connection, the upstream to reuse)."""
        started = time.monotonic()
        try:
            body_kind, body_len = http1.framing(request)
        except HttpError as exc:
            self.log(dest, Verdict(False, MALFORMED, exc.message), exc.status, 0, 0, started)
            await _send_error(writer, exc.status, exc.message)
            return False, upstream
        verdict = self.chain.connect(dest)
        if verdict.ask:  # (decide(), inlined: this runs for every request)
            verdict = await self.asker.ask(dest, None, verdict)
        headers = http1.forwardable(request, body_kind, body_len)
        hooked: Request | None = None
        if verdict.allowed and self.chain.sees_requests:
            hooked = Request(  # its own list: ``headers`` keeps the client's framing
                dest.method, path.decode("latin-1"), list(headers), _announced(body_kind, body_len)
            )
            decided = self.chain.request(dest, hooked)  # None: no hook had a say
            if hooked.wants_body and body_kind == "length" and body_len <= hooked.wants_body:
                try:
                    decided = await self._with_body(reader, writer, dest, hooked, body_len)
                except aio.IncompleteReadError:  # the client gave up: its line all the same
                    short = Verdict(False, MALFORMED, "the body ended before its Content-Length")
                    self.log(dest, short, 400, 0, 0, started, extra=hooked.audit)
                    return False, upstream
                headers = [(k, v) for k, v in headers if k != b"expect"]  # (answered)
            if decided is not None:  # (no coroutine of its own: this runs for every request)
                verdict = await self.asker.ask(dest, hooked, decided) if decided.ask else decided
        extra = hooked.audit if hooked is not None else None
        if not verdict.allowed:
            self.log(dest, verdict, 403, 0, 0, started, extra=extra)
            await _send_denial(writer, 403, verdict, dest.host, dest.port, _plain(request))
            return body_kind == "none" and request.keep_alive(), upstream
        limit = None
        if hooked is not None:
            try:
                headers, path, limit = self._rewritten(
                    dest, hooked, headers, path, body_kind, body_len
                )
            except _RequestRefused as exc:
                self.log(dest, exc.verdict, exc.status, 0, 0, started, extra=extra)
                plain = exc.status == 413 and _plain(request)
                await _send_denial(writer, exc.status, exc.verdict, dest.host, dest.port, plain)
                return False, upstream
        headers, upgrade, last = _upstream_head(request, headers, body_kind, dest, tls)
        upstream = self._reusable(dest, upstream, tls)
        if upstream is None:
            try:
                upstream = await self.open_upstream(dest, tls=tls, verdict=verdict)
            except Refused as exc:
                await self.refuse_http(writer, dest, exc, started)
                return False, None
        trip = _Trip(dest, request, hooked, verdict, upstream, started)
        try:
            return await self._round_trip(
                trip, reader, writer, path, headers, body_kind, body_len, limit, upgrade, last
            )
        except (_ResponseRefused, HttpError, ConnectionError, aio.IncompleteReadError) as exc:
            return await self._broken(trip, writer, exc)

    async def _with_body(
        self,
        reader: aio.StreamReader,
        writer: aio.StreamWriter,
        dest: Destination,
        hooked: Request,
        length: int,
    ) -> Verdict | None:
        """The hooks' second decision, with the body a hook asked for read into
        ``hooked.body`` (a client that waits for "100 Continue" is sent one first;
        the body then goes upstream from there, see _round_trip)."""
        expect = hooked.get(b"expect")
        if expect is not None and expect.strip().lower() == b"100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        hooked.headers[:] = [(k, v) for k, v in hooked.headers if k != b"expect"]
        hooked.body = await reader.readexactly(length)
        hooked.wants_body = 0
        return self.chain.request(dest, hooked)

    async def _round_trip(
        self,
        trip: _Trip,
        reader: aio.StreamReader,
        writer: aio.StreamWriter,
        path: bytes,
        headers: list[tuple[bytes, bytes]],
        body_kind: str,
        body_len: int,
        limit: int | None,
        upgrade: bytes,
        last: bool,
    ) -> tuple[bool, Upstream | None]:
        """The decided request upstream and its response to the client (exchange's
        second half; what breaks it is :meth:`_broken`'s)."""
        request, upstream, dest = trip.request, trip.upstream, trip.dest
        head = http1.serialize_head(request.method + b" " + path + b" HTTP/1.1", headers)
        source = reader
        if trip.hooked is not None and trip.hooked.body is not None:  # read to decide
            source = aio.StreamReader()
            source.feed_data(trip.hooked.body)
            source.feed_eof()
        trip.up += len(head) + await http1.copy_body(
            source, upstream.streams()[1], body_kind, body_len, head, limit
        )
        response_head = await http1.read_head(upstream.streams()[0])
        if response_head is None:
            raise HttpError(502, "upstream closed the connection without a response")
        response = http1.parse_response(response_head)
        if 100 <= response.status < 200 and response.status != 101:  # (rare: no await)
            response, trip.down = await self._past_interim(
                response, upstream, writer, dest, request, trip.hooked
            )
        trip.status = response.status
        kind, length = http1.framing(response, request.method)
        first, out_headers, keep, filters = self._client_head(
            dest, trip.hooked, request, response, kind, length, upgrade
        )
        if trip.status == 101:  # decided: from here on, bytes both ways, unhooked
            out = http1.serialize_head(first, out_headers)
            writer.write(out)
            more_up, more_down = await _splice(reader, writer, *upstream.streams())
            trip.up, trip.down = trip.up + more_up, trip.down + len(out) + more_down
            self._logged(trip)
            upstream.close()
            return False, None
        trip.down += await _to_client(
            upstream, writer, request, kind, length, first, out_headers, filters
        )
        extra = trip.hooked.audit if trip.hooked is not None else None  # (_logged, inlined)
        self.log(
            dest,
            trip.verdict,
            trip.status,
            trip.up,
            trip.down,
            trip.started,
            upstream.address,
            extra,
        )
        if kind != "close" and response.keep_alive() and not last:
            return keep, upstream
        upstream.close()
        return keep, None

    async def _broken(
        self, trip: _Trip, writer: aio.StreamWriter, exc: BaseException
    ) -> tuple[bool, Upstream | None]:
        """An exchange that a response hook refused or a broken message ended:
        logged, the upstream closed, the client told unless part of a response
        is out already.  Returns what exchange returns."""
        trip.upstream.close()
        if isinstance(exc, _ResponseRefused):
            self._logged(trip, exc.verdict, 403, down=0)
            await _send_denial(writer, 403, exc.verdict, trip.dest.host, trip.dest.port)
            return trip.request.keep_alive(), None
        if not isinstance(exc, HttpError):  # a connection lost, either side
            self._logged(trip, status=trip.status or 502)
            return False, None
        trip.down += exc.sent
        refused = trip.verdict
        if exc.status == 413 and trip.hooked is not None:
            refused = Verdict(False, trip.hooked.body_rule, exc.message)
        self._logged(trip, refused, exc.status)
        if not trip.down and refused is trip.verdict:
            await _send_error(writer, exc.status, exc.message)
        elif not trip.down:
            await _send_denial(writer, exc.status, refused, trip.dest.host, trip.dest.port)
        return False, None

    def _logged(
        self,
        trip: _Trip,
        verdict: Verdict | None = None,
        status: int | None = None,
        down: int | None = None,
    ) -> None:
        """The audit line of a round trip (its own verdict and figures unless given)."""
        self.log(
            trip.dest,
            verdict or trip.verdict,
            trip.status if status is None else status,
            trip.up,
            trip.down if down is None else down,
            trip.started,
            trip.upstream.address,
            trip.hooked.audit if trip.hooked is not None else None,
        )

    def _reusable(
        self, dest: Destination, upstream: Upstream | None, tls: ssl.SSLContext | None
    ) -> Upstream | None:
        """An open upstream connection to ``dest`` this exchange may use: the client
        connection's own, else (intercepted TLS) one parked by an earlier client."""
        if upstream is not None and (upstream.host, upstream.port) != (dest.host, dest.port):
            upstream.close()
            upstream = None
        if upstream is None and tls is not None:
            upstream = self.unpark(dest)
        if upstream is not None and upstream.streams()[0].at_eof():  # the origin closed it
            upstream.close()
            return None
        return upstream

    def _rewritten(
        self,
        dest: Destination,
        hooked: Request,
        headers: list[tuple[bytes, bytes]],
        path: bytes,
        body_kind: str,
        body_len: int,
    ) -> tuple[list[tuple[bytes, bytes]], bytes, int | None]:
        """The request's headers, target and body limit after the hooks' rewrite;
        what a rule wrote is checked like what a client sends.  _RequestRefused:
        502 for a rewrite that would not parse, 413 for a body over a rule's limit."""
        plan = hooked.plan
        if plan is None or plan.rewrite:  # (else nothing to rewrite, nothing to check)
            self.chain.rewrite(dest, hooked)
            try:
                if hooked.unchecked:  # (False: only hooks that check what they write ran)
                    headers = http1.refit(hooked.headers, headers, 502)
                    path = http1.check_target(hooked.target.encode("latin-1", "replace"), 502)
                else:
                    headers, path = hooked.headers, hooked.target.encode("latin-1", "replace")
            except HttpError as exc:
                raise _RequestRefused(502, Verdict(False, "rewrite", exc.message)) from None
        limit = hooked.body_limit
        if limit is not None and body_kind == "length" and body_len > limit:
            why = f"request body larger than {limit} bytes"
            raise _RequestRefused(413, Verdict(False, hooked.body_rule, why))
        return headers, path, limit

    def _client_head(
        self,
        dest: Destination,
        hooked: Request | None,
        request: http1.Message,
        response: http1.Message,
        kind: str,
        length: int,
        upgrade: bytes,
    ) -> tuple[bytes, list[tuple[bytes, bytes]], bool, list[BodyFilter]]:
        """The final response head the client gets (its first line and headers),
        whether its connection stays open, and the hooks' filters its body goes
        through (then the headers hold no framing: copy_filtered writes it).
        HttpError for a switch of protocols nobody asked for; _ResponseRefused
        when a response hook denies the head."""
        status = response.status
        if status == 101 and not upgrade:
            raise HttpError(502, "upstream switched protocols without being asked")
        if status == 101 and http1.header_tokens(response.get_all(b"upgrade")) != {upgrade}:
            raise HttpError(502, "upstream switched to a protocol other than websocket")
        filters: list[BodyFilter] = []
        if _responded(hooked):  # (the hooks' copy: forwardable() once per head)
            assert hooked is not None
            reason, out_headers, filters = self._response_head(dest, hooked, response, kind, length)
        else:
            reason, out_headers = response.reason, http1.forwardable(response, kind, length)
        keep = kind != "close" and request.keep_alive()
        if status == 101:
            out_headers += [(b"connection", b"upgrade"), (b"upgrade", upgrade)]
            filters = []
        elif filters and kind == "none":
            filters = []  # no body to filter (HEAD, 204, 304)
        elif filters:
            out_headers = [(k, v) for k, v in out_headers if k not in http1.FRAMING_FIELDS]
            framed = http1.filtered_keeps_framing(kind, length, filters)
            if not framed and request.version != b"HTTP/1.1":
                keep = False  # re-framed as "until the connection closes"
        if not keep and status != 101:  # say so: a client must not reuse it
            out_headers.append((b"connection", b"close"))
        first = response.version + b" " + str(status).encode() + b" " + reason
        return first, out_headers, keep, filters

    async def _past_interim(
        self,
        response: http1.Message,
        upstream: Upstream,
        writer: aio.StreamWriter,
        dest: Destination,
        request: http1.Message,
        hooked: Request | None,
    ) -> tuple[http1.Message, int]:
        """From an interim head (100, 103 Early Hints) on: each sent on to the client,
        until the final one; that one, and the bytes sent.  An interim head may echo
        what the request carried as much as the final one: the hooks see it too."""
        down = 0
        while 100 <= response.status < 200 and response.status != 101:
            kind, _ = http1.framing(response, request.method)
            if _responded(hooked):  # (filters: none, an interim head has no body)
                assert hooked is not None
                reason, out_headers, _ = self._response_head(dest, hooked, response, kind, 0)
            else:  # (an interim head has no body: framing says "none")
                reason, out_headers = response.reason, http1.forwardable(response, kind, 0)
            first = response.version + b" " + str(response.status).encode() + b" " + reason
            out = http1.serialize_head(first, out_headers)
            down += len(out)
            writer.write(out)
            response_head = await http1.read_head(upstream.streams()[0])
            if response_head is None:
                raise HttpError(502, "upstream closed after an interim response")
            response = http1.parse_response(response_head)
        return response, down

    def _response_head(
        self,
        dest: Destination,
        hooked: Request,
        response: http1.Message,
        kind: str,
        length: int,
    ) -> tuple[bytes, list[tuple[bytes, bytes]], list[BodyFilter]]:
        """A response head (interim or final) after the request hooks' on_response:
        its reason phrase and headers, checked unless every hook vouches for what it
        writes, and the filters hooks set on its body; _ResponseRefused when a
        hook denies it."""
        headers = http1.forwardable(response, kind, length)
        known = length if kind == "length" else 0 if kind == "none" else None  # (else unsaid)
        seen = Response(response.status, list(headers), response.reason, known)
        refused = self.chain.response(dest, hooked, seen)
        if refused is not None and not refused.allowed:
            raise _ResponseRefused(refused)
        if not seen.unchecked:
            return seen.reason, seen.headers, seen.filters
        if not http1.CONTROL.isdisjoint(seen.reason):
            raise HttpError(502, "a rule produced a control character in a reason phrase")
        return seen.reason, http1.refit(seen.headers, headers, 502), seen.filters

    async def connect(
        self,
        reader: aio.StreamReader,
        writer: aio.StreamWriter,
        request: http1.Message,
        run_id: str,
    ) -> None:
        started = time.monotonic()
        try:
            host, port = http1.split_authority(request.target, 443)
        except HttpError as exc:
            shown = request.target.decode("latin-1", "replace")
            self.refuse_malformed(run_id, "connect", exc.status, exc.message, shown, 0, "CONNECT")
            await _send_error(writer, exc.status, exc.message)
            return
        try:
            dest = Destination(run_id, "connect", host, port)
        except BadName as exc:
            verdict, shown = self.refuse_name(run_id, "connect", host, port, exc, 400)
            await _send_denial(writer, 400, verdict, shown, port)
            return
        if self.tls is not None and self.chain.needs_inspection(dest.host, dest.port):
            verdict = await self.decide(dest)
            if not verdict.allowed:
                await self.refuse_http(writer, dest, Refused(verdict), started)
                return
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            await intercept(self, reader, writer, dest, verdict)
            return
        try:
            upstream = await self.open_upstream(dest, streams=False)
        except Refused as exc:
            await self.refuse_http(writer, dest, exc, started)
            return
        writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        up, down = await tunnel(reader, writer, upstream, name=dest.host)
        if upstream.handover:
            await serve_plain(self, reader, writer, dest, upstream)
            return
        status = 200 if upstream.verdict.allowed else 403
        self.log(dest, upstream.verdict, status, up, down, started, upstream.address)

    # -- SOCKS5 ----------------------------------------------------------------------

    async def socks5(
        self,
        reader: aio.StreamReader,
        writer: aio.StreamWriter,
        run_id: str,
        clock: _Clock,
    ) -> None:
        started = time.monotonic()
        count = (await reader.readexactly(1))[0]
        methods = await reader.readexactly(count)
        if 0 not in methods:
            writer.write(b"\x05\xff")  # only "no authentication": the door already says who
            self.refuse_malformed(run_id, "socks5", 0xFF, "no authentication method corral takes")
            return
        writer.write(b"\x05\x00")
        version, command, _, atyp = await reader.readexactly(4)
        if version != 5:
            writer.write(_socks_reply(SOCKS_FAILURE))
            self.refuse_malformed(run_id, "socks5", SOCKS_FAILURE, "not a SOCKS5 request")
            return
        if atyp == 1:
            host = socket.inet_ntop(socket.AF_INET, await reader.readexactly(4))
        elif atyp == 4:
            host = socket.inet_ntop(socket.AF_INET6, await reader.readexactly(16))
        elif atyp == 3:
            size = (await reader.readexactly(1))[0]
            host = (await reader.readexactly(size)).decode("utf-8", "surrogateescape")
        else:
            writer.write(_socks_reply(SOCKS_ATYP_UNSUPPORTED))
            why = f"address type {atyp} unknown"
            self.refuse_malformed(run_id, "socks5", SOCKS_ATYP_UNSUPPORTED, why)
            return
        (port,) = struct.unpack("!H", await reader.readexactly(2))
        clock.since = 0.0  # the handshake is complete
        try:
            dest = Destination(run_id, "socks5", host, port)
        except BadName as exc:
            self.refuse_name(run_id, "socks5", host, port, exc, SOCKS_FAILURE)
            writer.write(_socks_reply(SOCKS_FAILURE))
            return
        if command != 1:  # BIND and UDP ASSOCIATE: no way to govern them, so no
            verdict = Verdict(False, "socks5", "only SOCKS5 CONNECT is supported")
            self.log(dest, verdict, SOCKS_CMD_UNSUPPORTED, 0, 0, started)
            writer.write(_socks_reply(SOCKS_CMD_UNSUPPORTED))
            return
        if self.tls is not None and self.chain.needs_inspection(dest.host, dest.port):
            verdict = await self.decide(dest)
            if not verdict.allowed:
                self.log(dest, verdict, SOCKS_NOT_ALLOWED, 0, 0, started)
                writer.write(_socks_reply(SOCKS_NOT_ALLOWED))
                return
            writer.write(_socks_reply(SOCKS_OK))
            await intercept(self, reader, writer, dest, verdict)
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
        up, down = await tunnel(reader, writer, upstream, name=dest.host)
        if upstream.handover:
            await serve_plain(self, reader, writer, dest, upstream)
            return
        code = SOCKS_OK if upstream.verdict.allowed else SOCKS_NOT_ALLOWED
        self.log(dest, upstream.verdict, code, up, down, started, upstream.address)

    # -- host services at their own address ------------------------------------------------

    async def service(
        self,
        reader: aio.StreamReader,
        writer: aio.StreamWriter,
        run_id: str,
        host: str,
        port: int,
        ack: bool = False,
    ) -> None:
        """A connection to a host service at its own address: a CONNECT to
        ``host:port`` with nothing to say to the client but the service's bytes.
        A refusal, or a service that cannot be reached, resets the connection (the
        nearest a client can see to "connection refused") and is an audit line.
        ``ack``: the connection came through the relay, which resets its client
        unless the one byte ``SERVICE_OK`` comes first."""
        started = time.monotonic()
        dest = Destination(run_id, "service", host, port)
        if self.tls is not None and self.chain.needs_inspection(dest.host, dest.port):
            verdict = await self.decide(dest)
            if not verdict.allowed:
                self.log(dest, verdict, 403, 0, 0, started)
                _reset(writer)
                return
            if ack:
                writer.write(SERVICE_OK)
            await intercept(self, reader, writer, dest, verdict)
            return
        try:
            upstream = await self.open_upstream(dest, streams=False)
        except Refused as exc:
            self.log(dest, exc.verdict, exc.status, 0, 0, started)
            _reset(writer)
            return
        if ack:
            writer.write(SERVICE_OK)
        up, down = await tunnel(reader, writer, upstream)
        self.log(dest, upstream.verdict, 200, up, down, started, upstream.address)

    # -- the sandbox's resolver -------------------------------------------------------------

    def pool(self, run_id: str) -> FakePool:
        return self.pools.setdefault(run_id, FakePool())

    async def dns(
        self,
        reader: aio.StreamReader,
        writer: aio.StreamWriter,
        run_id: str,
        clock: _Clock,
    ) -> None:
        """One DNS query framed by the relay on a unix door; the reply goes back framed."""
        (size,) = struct.unpack("!H", await reader.readexactly(2))
        packet = await reader.readexactly(size)
        clock.since = 0.0
        reply = await self.dns_reply(run_id, packet)
        writer.write(struct.pack("!H", len(reply)) + reply)
        await writer.drain()

    async def dns_reply(self, run_id: str, packet: bytes) -> bytes:
        """The answer to one query: NXDOMAIN for a name the policy refuses; for one it
        allows, its addresses (or a stand-in in transparent mode).  Each query is
        one audit line (``scheme`` dns, ``method`` the record type)."""
        started = time.monotonic()
        query = dnsmsg.parse_query(packet)
        if query is None:
            self.refuse_name(run_id, "dns", "", 53, BadName("malformed DNS query"), 1)
            return dnsmsg.error_reply(packet, dnsmsg.RCODE_FORMERR)
        if dnsmsg.own_name(query):  # the sandbox's hostname: no lookup, nothing to decide
            return dnsmsg.answer(query, list(dnsmsg.OWN_ADDRESSES))
        try:
            dest = Destination(run_id, "dns", query.name, 53)
        except BadName as exc:
            self.refuse_name(run_id, "dns", query.name, 53, exc, dnsmsg.RCODE_FORMERR)
            return dnsmsg.answer(query, None, dnsmsg.RCODE_FORMERR)
        dest.method = dnsmsg.type_name(query.qtype)
        verdict = self.chain.dns(run_id, dest.host)
        addresses: list[str] = []
        rcode = 0
        if not verdict.allowed:
            rcode = dnsmsg.RCODE_NXDOMAIN
        elif self.stand_ins:
            addresses = [self.pool(run_id).address_for(dest.host)]
        else:
            addresses, rcode = await self._lookup(dest)
        reply = dnsmsg.answer(query, addresses, rcode)
        shown = [a for a in addresses if dnsmsg.answers(a, query.qtype)]
        self.log(dest, verdict, rcode, len(packet), len(reply), started, ",".join(shown))
        return reply

    async def _lookup(self, dest: Destination) -> tuple[list[str], int]:
        """An allowed name's addresses, as the proxy itself would dial them (a pinned
        name's address, or what the host's resolver says), and the rcode."""
        pinned = self.pinned.get(dest.host)
        if pinned is not None:
            return [pinned], 0
        try:
            return await self.resolve(dest.host, 0), 0
        except socket.gaierror as exc:
            gone = exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", -5))
            return [], dnsmsg.RCODE_NXDOMAIN if gone else dnsmsg.RCODE_SERVFAIL
        except OSError:
            return [], dnsmsg.RCODE_SERVFAIL

    # -- transparent mode: connections nftables redirected to the capture port ----------------

    async def captured(
        self,
        reader: aio.StreamReader,
        writer: aio.StreamWriter,
        run_id: str,
        clock: _Clock,
        address: str,
        port: int,
    ) -> None:
        """A connection the sandbox's nftables rules redirected (it was going to
        ``address:port``): name it, decide, splice."""
        started = time.monotonic()
        clock.since = 0.0  # the peek below has its own bound
        named = self.pool(run_id).name_for(address)
        early = await _peek(reader)
        found = sniff.claim(early, final=True)
        asked: set[str] = set()
        for raw in found.names:
            try:
                asked.add(normalize(raw))
            except BadName as exc:
                verdict, shown = self.refuse_name(run_id, "transparent", raw, port, exc, 400)
                if sniff.is_http_request(early):
                    await _send_denial(writer, 400, verdict, shown, port)
                return
        claimed = min(asked) if len(asked) == 1 else None
        dest = Destination(run_id, "transparent", named or claimed or address, port)
        refusal = _captured_refusal(found, asked, named, address)
        if refusal is not None:
            await self._refuse_captured(writer, dest, refusal, 403, early, started)
            return
        inspected = self.tls is not None and self.chain.needs_inspection(dest.host, dest.port)
        if inspected or found.http:
            verdict = await self.decide(dest)
            if not verdict.allowed:
                await self._refuse_captured(writer, dest, verdict, 403, early, started)
            elif inspected:
                await intercept(self, reader, writer, dest, verdict, early)
            else:
                reader.feed_data(early + reader.take_buffered())  # back, in order
                await serve_plain(self, reader, writer, dest)
            return
        try:
            upstream = await self.open_upstream(dest, streams=False)
        except Refused as exc:
            await self._refuse_captured(writer, dest, exc.verdict, exc.status, early, started)
            return
        # nothing sent in time: the stand-in's name still binds what comes later
        up, down = await tunnel(reader, writer, upstream, early, None if early else named)
        if upstream.handover:
            await serve_plain(self, reader, writer, dest, upstream)
            return
        status = 200 if upstream.verdict.allowed else 403
        self.log(dest, upstream.verdict, status, up + len(early), down, started, upstream.address)

    async def _refuse_captured(
        self,
        writer: aio.StreamWriter,
        dest: Destination,
        verdict: Verdict,
        status: int,
        early: bytes,
        started: float,
    ) -> None:
        """Audit; and where the client spoke HTTP, answer it (TLS gets a plain close)."""
        self.log(dest, verdict, status, 0, 0, started)
        if not sniff.is_http_request(early):
            return
        if status == 403:
            await _send_denial(writer, 403, verdict, dest.host, dest.port)
        else:
            await _send_error(writer, status, verdict.reason)


def _address_frame(line: bytes) -> tuple[str, int]:
    """The relay's ``ADDRESS PORT\\n`` line: which host service a connection is for."""
    address, _, port_text = line.decode("ascii", "replace").strip().rpartition(" ")
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
        raise BadName("malformed service frame")
    host = normalize(address)
    if not is_address(host):
        raise BadName("malformed service frame")
    return host, int(port_text)


def original_destination(sock: object) -> tuple[str, int]:
    """Where a connection nftables redirected to the capture port was going."""
    get = sock.getsockopt  # type: ignore[attr-defined]
    if sock.family == socket.AF_INET6:  # type: ignore[attr-defined]
        raw = get(socket.IPPROTO_IPV6, SO_ORIGINAL_DST, 28)
        port = struct.unpack("!H", raw[2:4])[0]
        return normalize(socket.inet_ntop(socket.AF_INET6, raw[8:24])), port
    raw = get(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port = struct.unpack("!H", raw[2:4])[0]
    return socket.inet_ntop(socket.AF_INET, raw[4:8]), port


class _Resolver(aio.DatagramProtocol):
    """The sandbox's resolver socket: each query answered by :meth:`Proxy.dns_reply`."""

    def __init__(self, proxy: Proxy, run_id: str) -> None:
        self.proxy = proxy
        self.run_id = run_id
        self.transport: aio.DatagramTransport | None = None

    def connection_made(self, transport: aio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        if not self.proxy.live():
            return
        self.proxy.used()
        if self.proxy._dns_inflight >= DNS_INFLIGHT:
            return  # a flood: dropped, as a busy resolver would (clients retry)
        self.proxy._dns_inflight += 1
        aio.get_running_loop().create_task(self._answer(data, addr))

    async def _answer(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        try:
            reply = await self.proxy.dns_reply(self.run_id, data)
            if self.transport is not None and not self.transport.is_closing():
                self.transport.sendto(reply, addr)
        except Exception as exc:  # one bad query must never take the resolver down
            self.proxy.audit.internal_error(self.run_id, "dns", exc)
        finally:
            self.proxy._dns_inflight -= 1


async def _peek(reader: aio.StreamReader) -> bytes:
    """What a captured client sends first (a TLS ClientHello, an HTTP head), if anything."""
    early = b""
    try:
        while len(early) < PEEK_LIMIT and sniff.claim(early).state == "wait":
            chunk = await aio.wait_for(reader.read(PEEK_LIMIT), PEEK_TIMEOUT)
            if not chunk:
                break
            early += chunk
    except TimeoutError:
        pass  # a protocol where the server speaks first
    return early


def _captured_refusal(
    found: sniff.Claim, asked: set[str], named: str | None, address: str
) -> Verdict | None:
    """Why a captured connection is refused before it is decided, if it is."""
    if found.state == "unreadable":
        return Verdict(False, "name-unreadable", found.reason)
    if len(asked) > 1:
        return Verdict(False, "name-mismatch", f"asked for {' and '.join(sorted(asked))} at once")
    if named and asked and named not in asked:
        # The stand-in address was handed out for `named`; a different SNI or
        # Host would be domain fronting through an allowed name.
        return Verdict(False, "name-mismatch", f"connected to {named} but asked for {min(asked)}")
    if named is None and _in_pool(address):
        return Verdict(False, "default", "stand-in address from an earlier run")
    return None


def _always() -> bool:
    return True


def run_loop(main: Coroutine[object, object, None]) -> None:
    """Run the proxy's event loop (corral.net.aio: ready at once, see its docstring)."""
    aio.run(main)


def _ssl_error(exc: BaseException) -> TypeGuard[ssl.SSLError]:
    """A TLS failure?  Only a run that loaded ssl can have one (and only such a run
    pays for importing it)."""
    ssl = sys.modules.get("ssl")
    return ssl is not None and isinstance(exc, ssl.SSLError)


def _in_pool(address: str) -> bool:
    try:
        return ip.address(address) in dnsmsg.POOL
    except ValueError:
        return False


def _reset(writer: aio.StreamWriter) -> None:
    """Close a client's TCP connection with a reset rather than an orderly end, so
    the client reports a failure instead of an empty reply (a unix socket, the
    relay's door, has no reset: it closes, and the relay resets its client)."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family != socket.AF_UNIX:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


async def intercept(
    proxy: Proxy,
    reader: aio.StreamReader,
    writer: aio.StreamWriter,
    dest: Destination,
    verdict: Verdict,
    early: bytes = b"",
) -> None:
    """Hand an allowed connection that needs inspection to corral.net.tls (imported
    only by runs that can intercept)."""
    from corral.net import tls

    await tls.intercept(proxy, reader, writer, dest, verdict, early)


def _responded(hooked: Request | None) -> bool:
    """Does a hook see the responses to this request (its destination's plan)?"""
    return hooked is not None and (hooked.plan is None or bool(hooked.plan.on_response))


def _announced(kind: str, length: int) -> int | None:
    """A body's announced length for hooks: 0 without one, None when chunked."""
    return length if kind == "length" else None if kind == "chunked" else 0


async def _to_client(
    upstream: Upstream,
    writer: aio.StreamWriter,
    request: http1.Message,
    kind: str,
    length: int,
    first: bytes,
    headers: list[tuple[bytes, bytes]],
    filters: list[BodyFilter],
) -> int:
    """The final response head and its body (framed as ``kind`` upstream) to the
    client; through the hooks' filters, re-framed, when there are any.  The bytes
    written; an HttpError says in ``sent`` how many were out before it (then no
    other response may follow)."""
    if filters:
        chunked = request.version == b"HTTP/1.1"
        reader = upstream.streams()[0]
        return await http1.copy_filtered(
            reader, writer, kind, length, first, headers, filters, chunked
        )
    out = http1.serialize_head(first, headers)
    try:
        return len(out) + await http1.copy_body(upstream.streams()[0], writer, kind, length, out)
    except HttpError as exc:
        exc.sent += len(out)  # (counted as out, as ever: a broken body gets no second head)
        raise


def _upstream_head(
    request: http1.Message,
    headers: list[tuple[bytes, bytes]],
    body_kind: str,
    dest: Destination,
    tls: ssl.SSLContext | None,
) -> tuple[list[tuple[bytes, bytes]], bytes, bool]:
    """The headers that go upstream, the upgrade asked for (b"websocket" or b""),
    and whether this is the last request on the upstream connection."""
    upgrade = _websocket_upgrade(request)
    if upgrade:  # hop-by-hop, so dropped already: the upgrade is asked for again
        headers = [*headers, (b"connection", b"upgrade"), (b"upgrade", upgrade)]
    # Content where it means nothing (a GET's): an origin that ignores it, as most
    # GET handlers do, would read it as the next request, one no rule decided.
    # Closing after it leaves the origin no next request to read.
    last = body_kind != "none" and request.method.upper() in CONTENT_IGNORED
    if last:
        headers = [*headers, (b"connection", b"close")]
    # RFC 9112 3.2.2: the target's authority replaces any Host the client sent,
    # so the origin cannot be steered to a virtual host the policy never saw; it
    # is written from the normalized host, the name that was decided.
    headers = [(k, v) for k, v in headers if k != b"host"]
    headers.insert(0, (b"host", authority(dest.host, dest.port, 443 if tls else 80).encode()))
    return headers, upgrade, last


def _websocket_upgrade(request: http1.Message) -> bytes:
    """b"websocket" for a WebSocket handshake, b"" for anything else.  Only that
    token is passed on: h2c (offered alone or beside websocket) would turn the
    connection into HTTP/2 whose requests no hook sees."""
    offered = request.get_all(b"upgrade")
    if not offered:  # (the usual case)
        return b""
    asked = b"upgrade" in http1.header_tokens(request.get_all(b"connection"))
    return b"websocket" if asked and b"websocket" in http1.header_tokens(offered) else b""


async def _splice(
    client_r: aio.StreamReader,
    client_w: aio.StreamWriter,
    server_r: aio.StreamReader,
    server_w: aio.StreamWriter,
) -> tuple[int, int]:
    """Bytes both ways after an upgrade (streams: either side may be TLS) until
    one side ends; returns (bytes up, bytes down)."""

    async def pump(src: aio.StreamReader, dst: aio.StreamWriter) -> int:
        count = 0
        try:
            while data := await src.read(TUNNEL_CHUNK):
                dst.write(data)
                count += len(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        return count

    loop = aio.get_running_loop()
    up = loop.create_task(pump(client_r, server_w))
    down = loop.create_task(pump(server_r, client_w))
    await aio.wait((up, down), return_when=aio.FIRST_COMPLETED)
    for task in (up, down):  # TLS has no half-close: one side ending ends both
        task.cancel()
    server_w.close()
    results = await aio.gather(up, down, return_exceptions=True)
    counts = [r if isinstance(r, int) else 0 for r in results]
    return counts[0], counts[1]


def _socks_reply(code: int) -> bytes:
    return bytes([5, code, 0, 1, 0, 0, 0, 0, 0, 0])


class _Pump(aio.BufferedProtocol):
    """One direction of a tunnel at the transport level: bytes received on this
    side are written straight to the peer (no StreamReader copies, no task per
    direction; read into the loop's shared buffer, and only what the peer's
    socket does not take at once is copied).  Back-pressure: when the peer's
    buffer fills, this side stops reading until it drains."""

    def __init__(self, transport: aio.Transport, peer: aio.Transport, done: aio.Future) -> None:
        self.transport = transport
        self.peer = peer
        self.done = done
        self.count = 0
        self.eof = False
        self.partner: _Pump | None = None
        self.hold: _Hold | None = None  # the client's side of a tunnel to a name
        self.refused: Verdict | None = None
        self.handover: bytes | None = None  # plain HTTP's first bytes, for serve_plain

    def data_received(self, data: bytes) -> None:
        self.count += len(data)
        if self.hold is None:
            self.peer.write(data)
        else:
            self.held(data)

    def get_buffer(self, sizehint: int) -> memoryview:
        return aio.READ_BUFFER

    def buffer_updated(self, nbytes: int) -> None:
        self.count += nbytes
        if self.hold is None:
            self.peer.write(aio.READ_BUFFER[:nbytes])  # sent now, or the rest copied
        else:
            self.held(bytes(aio.READ_BUFFER[:nbytes]))

    def held(self, data: bytes, final: bool = False) -> None:
        """Hold the first bytes until they show the name they ask for: pass them
        on if it is the tunnel's, else refuse (an HTTP client reads why)."""
        hold = self.hold
        assert hold is not None
        verdict = hold.feed(data, final)
        if verdict is None:
            if hold.timer is None:  # bytes that stay unfinished are unreadable
                hold.timer = aio.get_running_loop().call_later(PEEK_TIMEOUT, self.expire)
            return
        self.hold = None
        if hold.timer is not None:
            hold.timer.cancel()
        if verdict.allowed and hold.http:
            self.handover = hold.data  # tunnel() gives the client back to the proxy
            self.transport.pause_reading()
            if not self.done.done():
                self.done.set_result(None)
            return
        if verdict.allowed:
            self.peer.write(hold.data)
            return
        self.refused = verdict
        if sniff.is_http_request(hold.data):
            body = _denial_record(verdict, hold.name, hold.port)
            self.transport.write(
                _denial(403, verdict.rule, body, b"application/json", verdict.reason)
            )
        self.finish()

    def expire(self) -> None:
        if self.hold is not None:
            self.held(b"", final=True)

    def eof_received(self) -> bool:
        if self.hold is not None:
            self.held(b"", final=True)
        self.eof = True
        if self.handover is not None:
            return True  # the client's reader is told when it is handed back
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


class _Hold:
    """A tunnel's first client bytes, until they say which name they ask for.

    A tunnel to a name goes to that name's address, but a CDN serves whichever
    of its sites the ClientHello's SNI (or the Host) asks for: another name there
    is domain fronting, refused as ``name-mismatch``; bytes that look like TLS or
    HTTP but cannot be read are refused as ``name-unreadable``.  A tunnel to an
    address was allowed as that address: it has no name to hold to."""

    __slots__ = ("data", "http", "name", "port", "timer")

    def __init__(self, name: str, port: int) -> None:
        self.name = name
        self.port = port
        self.data = b""
        self.http = False
        self.timer: aio.Handle | None = None

    def feed(self, data: bytes, final: bool) -> Verdict | None:
        """None while more bytes could change the answer; then the verdict."""
        self.data += data
        found = sniff.claim(self.data, final or len(self.data) >= PEEK_LIMIT)
        if found.state == "wait":
            return None
        if found.state == "unreadable":
            return Verdict(False, "name-unreadable", f"{found.reason}, in a tunnel to {self.name}")
        self.http = found.http
        for raw in found.names:
            try:
                asked = normalize(raw)
            except BadName as exc:
                return Verdict(False, "name-mismatch", f"a tunnel to {self.name} asked for {exc}")
            if asked != self.name:
                return Verdict(
                    False, "name-mismatch", f"connected to {self.name} but asked for {asked}"
                )
        return _HELD_OK


_HELD_OK = Verdict(True, "name", "the first bytes ask for the tunnel's name")


async def tunnel(
    client_r: aio.StreamReader,
    client_w: aio.StreamWriter,
    upstream: Upstream,
    first_up: bytes = b"",
    name: str | None = None,
) -> tuple[int, int]:
    """Splice the client and a bare upstream transport until both sides are done;
    returns (bytes up, bytes down).  ``first_up`` was read from the client already.
    ``name``: the client's first bytes must ask for it (see _Hold); a refusal
    ends the tunnel and becomes ``upstream.verdict``.  Plain HTTP ends it too,
    with ``upstream.handover`` set and the client's bytes back in ``client_r``:
    the caller serves it request by request (serve_plain)."""
    client = client_w.transport
    before = client.get_protocol()
    server = upstream.transport
    holding = upstream.holding
    assert server is not None and holding is not None, "tunnels use a bare transport"
    done: aio.Future = aio.get_running_loop().create_future()
    up = _Pump(client, server, done)  # reads the client, writes the server
    down = _Pump(server, client, done)
    up.partner, down.partner = down, up
    if name is not None and not ip.is_address(name):
        up.hold = _Hold(name, upstream.port)
    early_up = first_up + client_r.take_buffered()
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
        if up.handover is not None:
            client.set_protocol(before)
            client_r.feed_data(up.handover)
            if up.eof:
                client_r.feed_eof()
            client.resume_reading()
            _give_streams(upstream)
        else:
            client.close()
            server.close()
        if up.hold is not None and up.hold.timer is not None:
            up.hold.timer.cancel()
    if up.refused is not None:
        upstream.verdict = up.refused
    return up.count, down.count


def _give_streams(upstream: Upstream) -> None:
    """A tunnel's bare upstream, now with the streams HTTP forwarding reads and writes."""
    loop = aio.get_running_loop()
    transport = upstream.transport
    assert transport is not None
    reader = aio.StreamReader(limit=http1.MAX_HEAD, loop=loop)
    protocol = aio.StreamReaderProtocol(reader, loop=loop)
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    upstream.reader, upstream.writer = reader, aio.StreamWriter(transport, protocol, reader, loop)
    upstream.handover = True
    transport.resume_reading()


async def serve_plain(
    proxy: Proxy,
    reader: aio.StreamReader,
    writer: aio.StreamWriter,
    dest: Destination,
    upstream: Upstream | None = None,
) -> None:
    """Plain HTTP in a tunnel to a name, or captured: served like forwarded HTTP,
    each request decided, audited and sent with the name's own Host, so a later
    request on the connection cannot ask a CDN for another site."""
    from corral.net import tls

    await tls.serve_requests(proxy, reader, writer, dest, "http", upstream)


async def _send_error(writer: aio.StreamWriter, status: int, message: str) -> None:
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


def _plain(request: http1.Message) -> bool:
    """A client that shows its user a plain-text refusal and nothing else: git
    prints a text/plain error body line by line as ``remote: ...``."""
    agent = request.get(b"user-agent")
    return agent is not None and agent.startswith(b"git/")


async def _send_denial(
    writer: aio.StreamWriter,
    status: int,
    verdict: Verdict,
    host: str,
    port: int,
    plain: bool = False,
) -> None:
    """A refusal as JSON (one line of text for ``plain`` clients): 403 for the
    policy's no, 400 for a host that is no destination."""
    if plain:
        text = f"corral: denied by the sandbox's policy ({verdict.rule}): {verdict.reason}\n"
        body, kind = text.encode("utf-8", "replace"), b"text/plain; charset=utf-8"
    else:
        body, kind = _denial_record(verdict, host, port), b"application/json"
    writer.write(_denial(status, verdict.rule, body, kind, verdict.reason))
    try:
        await writer.drain()
    except ConnectionError:
        pass


def _denial(status: int, rule: str, body: bytes, kind: bytes, reason: str = "") -> bytes:
    """A refusal's response; its status line says corral refused it and why, the
    one part of it every client shows (curl's "CONNECT tunnel failed, response
    403", Python's "Tunnel connection failed: 403 ..."): an agent told only 403
    could not tell the policy's no from the server's."""
    headers = [
        (b"content-type", kind),
        (b"content-length", str(len(body)).encode()),
        (b"x-corral-decision", f"deny; rule={rule}".encode("ascii", "replace")),
    ]
    if status != 403:
        headers.append((b"connection", b"close"))
    phrase = _REASONS.get(status, "Error")
    if status == 403:
        said = "".join(c if " " <= c <= "~" else "?" for c in f"{rule}: {reason}"[:200])
        phrase = f"Blocked by corral ({said})" if reason else f"Blocked by corral ({rule})"
    first = f"HTTP/1.1 {status} {phrase}".encode()
    return http1.serialize_head(first, headers) + body


def _denial_record(verdict: Verdict, host: str, port: int) -> bytes:
    """The JSON body of a refusal an HTTP client reads."""
    record = {
        "decision": "deny",
        "rule": verdict.rule,
        "reason": verdict.reason,
        "host": host,
        "port": port,
    }
    return (dumps(record) + "\n").encode()


_REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    505: "HTTP Version Not Supported",
}
