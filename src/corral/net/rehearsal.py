"""One HTTP exchange a proxy worker plays to itself before it serves its run.

A worker is forked from corral, so the first request it serves writes to
hundreds of memory pages it still shares with corral (each one copied on that
first write) and runs code the interpreter has not specialised yet.  Measured
here: about 290 page faults, and the first GET of a run half a millisecond or
more slower than the second.  The worker is idle while its sandbox starts, so it
spends a millisecond of that time on a rehearsal: a client, the proxy's own
HTTP path (:meth:`corral.net.proxy.Proxy.handle`) and a stand-in origin, joined
by socket pairs inside the worker.

Nothing of it leaves the process: it opens no socket but its own pairs, asks
no resolver, writes no audit line (its own :class:`Audit` has no file), and
does not count as the run's use of its network.  Its proxy has its own chain
that allows only its own stand-in host.  Whatever goes wrong is dropped: a
rehearsal that fails costs the first request its speed, never its answer.
"""

from __future__ import annotations

import _socket
import os

from corral.net import aio
from corral.net.audit import Audit
from corral.net.hooks import Chain, Destination, Hook
from corral.net.proxy import Proxy, Upstream
from corral.net.rules import Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ssl

HOST = "rehearsal.invalid"  # (.invalid: a name no resolver answers, RFC 6761)
REQUEST = (
    b"GET http://rehearsal.invalid/ HTTP/1.1\r\nHost: rehearsal.invalid\r\n"
    b"User-Agent: corral\r\nAccept: */*\r\nProxy-Connection: Keep-Alive\r\n\r\n"
)
BODY = b"ok\n"
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\n" + BODY
WITHIN = 0.5  # seconds: a rehearsal still unfinished by then is abandoned
# Python 3.11 specialises a function's code once it has run a few times: measured
# here, four exchanges took the first real GET from 2.2 to 1.9 ms, one to 2.0, ten
# no further than four (each costs about 0.8 ms of an otherwise idle CPU)
TIMES = 4


class _OnlyItself(Hook):
    name = "rehearsal"
    connect_by_host_port = True

    def on_connect(self, dest: Destination) -> Verdict | None:
        return Verdict(dest.host == HOST, "rehearsal")


class _Stage(Proxy):
    """A proxy whose one upstream is the stand-in origin, over a socket pair."""

    origin: aio.Task | None = None

    async def open_upstream(
        self,
        dest: Destination,
        streams: bool = True,
        tls: ssl.SSLContext | None = None,
        verdict: Verdict | None = None,
    ) -> Upstream:
        ours, origin = _pair()
        upstream = Upstream(dest.host, dest.port, "rehearsal", verdict or Verdict(True, "x"))
        upstream.reader, upstream.writer = await aio.open_connection(sock=ours)
        self.origin = aio.get_running_loop().create_task(_origin(origin))
        return upstream


async def _origin(sock: _socket.socket) -> None:
    reader, writer = await aio.open_connection(sock=sock)
    try:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(RESPONSE)
        await writer.drain()
    finally:
        writer.close()


def _pair() -> tuple[_socket.socket, _socket.socket]:
    one, two = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    one.setblocking(False)
    two.setblocking(False)
    return one, two


async def _play(request: bytes = REQUEST) -> bytes:
    """One exchange; what the client was answered (to its first empty line and
    what the socket held with it, or to the end of the stand-in's body)."""
    audit = Audit(None)
    audit.fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)  # its lines encoded, then dropped
    stage = _Stage(Chain([_OnlyItself()]), audit)
    client, served = _pair()
    reader, writer = await aio.open_connection(sock=served)
    creader, cwriter = await aio.open_connection(sock=client)
    handled = aio.get_running_loop().create_task(stage.handle(reader, writer, "rehearsal"))
    try:
        cwriter.write(request)
        answer = await creader.readuntil(b"\r\n\r\n")
        if answer.startswith(b"HTTP/1.1 200 "):
            answer += await creader.readexactly(len(BODY))
        cwriter.close()
        await handled
        return answer
    finally:
        handled.cancel()
        if stage._sweeper is not None:
            stage._sweeper.cancel()
        audit.close()


async def _within(times: int) -> bytes:
    answer = b""
    async with aio.timeout(WITHIN):
        for _ in range(times):
            answer = await _play()
    return answer


def ask_once(chain: Chain) -> None:
    """Ask the run's own chain about the rehearsal's host, once, so that its
    rules' code has run before the first real request needs it.  Only a chain
    whose answers depend on the host and port alone is asked: none of its hooks
    counts, asks or remembers anything, and what the chain keeps is the answer
    for a name the sandbox cannot resolve anyway."""
    if chain.pure_connect:  # a name, and an address (TEST-NET-1, RFC 5737): two paths
        chain.connect(Destination("rehearsal", "http", HOST, 80))
        chain.connect(Destination("rehearsal", "http", "192.0.2.1", 80))


def rehearse(times: int = TIMES) -> bytes:
    """Play the exchange ``times`` times on a loop of its own; what the client
    was answered the last time (b"" if anything went wrong)."""
    try:
        return aio.run(_within(times))  # type: ignore[no-any-return, unused-ignore]
    except Exception:
        return b""
