"""TLS inspection: terminate a client's TLS with a leaf from corral's CA, decide
each HTTP request inside with the hook chain, and forward it over TLS verified
against the host's trust store (plus ``[tls] upstream_ca``).

Only destinations the chain says need it (:meth:`corral.net.hooks.Chain.needs_inspection`)
come here; every other CONNECT, SOCKS5 or captured connection stays an opaque
tunnel in :mod:`corral.net.proxy`.

HTTP/1.1 only: ALPN offers ``http/1.1`` to the client and to the origin, so
clients that prefer HTTP/2 fall back to it.  Inside, requests keep the plain
proxy's properties (keep-alive, streamed and chunked bodies, strict framing,
WebSocket upgrades once the request is decided): they go through the same
:meth:`corral.net.proxy.Proxy.exchange`.  A client that speaks plain HTTP
through a tunnel to such a destination is handled the same way without TLS;
anything else is refused, since nothing could be decided about it.
"""

from __future__ import annotations

import os
import ssl
import time

from corral.net import aio, http1
from corral.net.ca import CA, Issuer
from corral.net.http1 import HttpError
from corral.net.names import BadName, normalize
from corral.net.rules import Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.net.hooks import Destination
    from corral.net.proxy import Proxy, Upstream
    from corral.net.trust import UpstreamTrust

HANDSHAKE_TIMEOUT = 30.0  # as a request head (proxy.HEAD_TIMEOUT)
PEEK_LIMIT = 16 * 1024
ALPN = ["http/1.1"]
TLS_RECORD = 0x16  # a TLS handshake record starts every ClientHello
INSPECT_RULE = "inspect"  # the rule an audit line names for what inspection refused
UPSTREAM_RULE = "upstream-tls"  # ... and for an origin whose certificate failed


class Interceptor:
    """One per proxy worker: the leaf key, the leaf contexts per host, and the
    context that verifies origins."""

    def __init__(self, ca: CA, trust: UpstreamTrust) -> None:
        self.ca = ca
        self.trust = trust
        self._issuer: Issuer | None = None  # made on first use: after the fork
        self._upstream: ssl.SSLContext | None = None
        self._servers: dict[str, tuple[ssl.SSLContext, float]] = {}

    @property
    def upstream(self) -> ssl.SSLContext:
        if self._upstream is None:
            self._upstream = upstream_context(self.trust)
        return self._upstream

    def server_context(self, host: str) -> ssl.SSLContext:
        """The context that presents ``host``'s leaf certificate, made once per host."""
        found = self._servers.get(host)
        if found is not None and found[1] > time.time():
            return found[0]
        if self._issuer is None:
            self._issuer = Issuer(self.ca)
        cert_pem, renew = self._issuer.leaf(host)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(ALPN)
        _load_chain(context, cert_pem + self._issuer.key_pem)
        if len(self._servers) >= 4096:  # bounded: a client naming endless hosts
            self._servers.clear()
        self._servers[host] = (context, renew.timestamp())
        return context


def upstream_context(trust: UpstreamTrust) -> ssl.SSLContext:
    """Verifies origins: the host's trust store (or the SSL_CERT_FILE corral was
    started with), always, plus ``[tls] upstream_ca``; all read before the run."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=trust.store)
    for text in trust.extra:
        context.load_verify_locations(cadata=text)
    context.set_alpn_protocols(ALPN)
    return context


def _load_chain(context: ssl.SSLContext, pem: bytes) -> None:
    """load_cert_chain reads files only: hand it an anonymous in-memory one."""
    fd = os.memfd_create("corral-leaf", os.MFD_CLOEXEC)
    try:
        os.write(fd, pem)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


async def accept_tls(
    transport: aio.Transport, context: ssl.SSLContext, early: bytes
) -> tuple[aio.StreamReader, aio.StreamWriter]:
    """Be the TLS server on an accepted connection; ``early`` holds the client's
    first bytes, already read (a ClientHello behind CONNECT, or peeked for its
    SNI in transparent mode)."""
    loop = aio.get_running_loop()
    reader = aio.StreamReader(limit=http1.MAX_HEAD, loop=loop)
    protocol = aio.StreamReaderProtocol(reader, loop=loop)
    tls_transport = await loop.start_tls(
        transport,
        protocol,
        context,
        server_side=True,
        ssl_handshake_timeout=HANDSHAKE_TIMEOUT,
        initial=early,
    )
    return reader, aio.StreamWriter(tls_transport, protocol, reader, loop)


async def intercept(
    proxy: Proxy,
    reader: aio.StreamReader,
    writer: aio.StreamWriter,
    dest: Destination,
    verdict: Verdict,
    early: bytes = b"",
) -> None:
    """An allowed connection to a destination that needs inspection, after the
    client was told it is connected (CONNECT 200, SOCKS5 success, or captured)."""
    started = time.monotonic()
    early += reader.take_buffered()
    if not early:
        clock = proxy._clock(reader)  # the client speaks first; the idle timeout holds
        try:
            early = await reader.read(PEEK_LIMIT)
        finally:
            proxy._clocks.discard(clock)
        if not early:
            return
    if early[0] == TLS_RECORD:
        assert proxy.tls is not None
        try:
            context = proxy.tls.server_context(dest.host)
            inner_r, inner_w = await accept_tls(writer.transport, context, early)
        except (ssl.SSLError, ConnectionError, TimeoutError) as exc:
            why = f"TLS handshake with the client failed: {_ssl_reason(exc)}"
            proxy.log(dest, Verdict(True, verdict.rule, why), 0, len(early), 0, started)
            return
        await serve_requests(proxy, inner_r, inner_w, dest, "https")
    elif early[0] in http1.TOKEN:
        reader.feed_data(early)  # the buffer is empty: the bytes go back in order
        await serve_requests(proxy, reader, writer, dest, "http")
    else:
        refused = Verdict(False, INSPECT_RULE, "neither TLS nor HTTP: nothing to decide on")
        proxy.log(dest, refused, 0, len(early), 0, started)


async def serve_requests(
    proxy: Proxy,
    reader: aio.StreamReader,
    writer: aio.StreamWriter,
    dest: Destination,
    scheme: str,
    upstream: Upstream | None = None,
) -> None:
    """The keep-alive loop of HTTP requests inside one inspected connection
    (``upstream``: one already open to ``dest``, with streams)."""
    loop = aio.get_running_loop()
    clock = proxy._clock(reader)  # idle and head timeouts, as for any client
    upstream_tls = proxy.tls.upstream if scheme == "https" and proxy.tls else None
    idle = True
    try:
        while True:
            try:
                head = await http1.read_head(reader)
                if head is None:
                    return
                request = http1.parse_request(head)
                target = origin_target(request, dest, scheme)
            except TimeoutError:
                if clock.partial or reader.buffered:
                    late = HttpError(408, "request head not complete in time")
                    proxy.refuse_malformed(
                        dest.run_id, scheme, 408, late.message, dest.host, dest.port
                    )
                    await _reply(writer, 408, late.message)
                return
            except HttpError as exc:
                proxy.refuse_malformed(
                    dest.run_id, scheme, exc.status, exc.message, dest.host, dest.port
                )
                await _reply(writer, exc.status, exc.message)
                return
            clock.since = 0.0  # busy until the exchange is done
            inner = dest.for_request(
                scheme, request.method.decode("ascii", "replace"), target.decode("utf-8", "replace")
            )
            idle = False  # an exchange that does not return leaves it mid-response
            keep, upstream = await proxy.exchange(
                reader, writer, inner, request, target, upstream, upstream_tls
            )
            idle = True
            if not keep:
                return
            clock.waiting(loop.time())
    finally:
        proxy._clocks.discard(clock)
        if upstream is not None:
            if upstream_tls is not None and idle:
                proxy.park(dest, upstream)  # for this run's next connection to dest
            else:
                upstream.close()
        writer.close()


def origin_target(request: http1.Message, dest: Destination, scheme: str) -> bytes:
    """The origin-form target of a request inside a connection to ``dest``; an
    absolute URL must name that very destination."""
    target = request.target
    if request.method == b"CONNECT":
        raise HttpError(400, "CONNECT inside an inspected connection")
    if target.startswith(b"/") or (target == b"*" and request.method == b"OPTIONS"):
        return target
    try:
        named, port, path = http1.split_absolute(target, schemes=(scheme,))
        same = normalize(named) == dest.host and port == dest.port
    except BadName:
        same = False
    if not same:
        raise HttpError(400, f"this connection is to {dest.host}:{dest.port} only")
    return path


async def _reply(writer: aio.StreamWriter, status: int, message: str) -> None:
    from corral.net.proxy import _send_error

    await _send_error(writer, status, message)


def _ssl_reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return exc.verify_message or str(exc)
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


def upstream_refusal(exc: ssl.SSLError, host: str) -> Verdict:
    """The verdict for an origin whose TLS failed: certificate or handshake."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = f"the certificate of {host} is not trusted: {_ssl_reason(exc)}"
    else:
        why = f"TLS with {host} failed: {_ssl_reason(exc)}"
    return Verdict(False, UPSTREAM_RULE, why)
