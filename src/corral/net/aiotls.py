"""TLS for :mod:`corral.net.aio`: an ``ssl.SSLObject`` over memory BIOs between a
raw stream transport and the protocol that reads plaintext.

Imported only by runs whose proxy terminates or originates TLS (``ssl`` costs
milliseconds to import).  The layer is the raw transport's protocol: ciphertext
that arrives goes into the incoming BIO, OpenSSL turns it into plaintext for the
application protocol, and what OpenSSL has to send (handshake records, data,
alerts) is taken from the outgoing BIO and written to the raw transport.
Plaintext is held, not lost, while the application has paused reading.
"""

from __future__ import annotations

import ssl

from corral.net.aio import MAX_READ, Future, Loop, Protocol, Transport

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_TLS_ERRORS = (ssl.SSLError, OSError)


class TLSLayer(Protocol):
    """One TLS connection: the raw transport's protocol, and the application's
    :class:`TLSTransport`."""

    def __init__(
        self,
        loop: Loop,
        raw: Transport,
        app: Protocol,
        context: ssl.SSLContext,
        server_side: bool,
        server_hostname: str | None,
    ) -> None:
        self._loop = loop
        self._raw = raw
        self._app = app
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._obj = context.wrap_bio(
            self._in, self._out, server_side=server_side, server_hostname=server_hostname
        )
        self._context = context
        self._waiter: Future | None = None
        self._handshaking = True
        self._connected = False  # the application's connection_made was called
        self._paused = False  # the application paused reading
        self._ended = False  # the peer's close_notify (or EOF) was passed on
        self._lost = False
        self._held = 0  # bytes of the outgoing BIO left for the next write (see _step_handshake)
        self.transport = TLSTransport(self)
        raw.set_protocol(self)

    async def handshake(self, initial: bytes, timeout: float | None) -> TLSTransport:
        self._waiter = self._loop.create_future()
        timer = self._loop.call_later(timeout, self._too_slow) if timeout else None
        self._raw.resume_reading()
        if initial:
            self._in.write(initial)
        self._step_handshake()
        try:
            await self._waiter
        except BaseException:
            self._raw.abort()
            raise
        finally:
            if timer is not None:
                timer.cancel()
        self._connected = True
        self._app.connection_made(self.transport)
        self._deliver()  # what came with the peer's last handshake flight
        return self.transport

    def _too_slow(self) -> None:
        self._fail_handshake(TimeoutError("TLS handshake timed out"))

    def _fail_handshake(self, exc: BaseException) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)

    def _step_handshake(self) -> None:
        try:
            self._obj.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return
        except _TLS_ERRORS as exc:
            self._flush()  # the alert, so the peer learns why
            self._fail_handshake(exc)
            return
        self._handshaking = False
        if self._obj.server_side and self._obj.version() == "TLSv1.3":
            # a TLS 1.3 server's last handshake bytes are its session tickets, which
            # the client needs for nothing now: they go with the first response
            # (one write, one wakeup of the client, fewer per new connection).  Not
            # TLS 1.2's: there the server's last flight is its Finished, awaited.
            self._held = self._out.pending
        else:
            self._flush()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _flush(self) -> None:
        if self._out.pending:
            self._held = 0
            self._raw.write(self._out.read())

    # the raw transport's side
    def data_received(self, data: bytes) -> None:
        self._in.write(data)
        if self._handshaking:
            self._step_handshake()
        if self._connected:
            self._deliver()

    def _deliver(self) -> None:
        """Plaintext to the application, while it reads."""
        obj = self._obj
        while not self._paused and not self._ended:
            try:
                chunk = obj.read(MAX_READ)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # the peer's close_notify
                self._end()
                break
            except _TLS_ERRORS as exc:
                self._flush()
                self._raw.abort()
                self._lose(exc if isinstance(exc, Exception) else None)
                return
            if not chunk:
                self._end()
                break
            self._app.data_received(chunk)
            if not self._in.pending and not obj.pending():
                break  # nothing more to decrypt: skip the exception a read would raise
        if self._out.pending > self._held:  # what reading produced (a key update's answer)
            self._flush()

    def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
        if not self._app.eof_received():
            self.transport.close()

    def eof_received(self) -> bool:
        if self._handshaking:
            self._fail_handshake(ConnectionResetError("connection closed during the TLS handshake"))
            return False
        if self._connected:
            self._deliver()
            self._end()
        return False  # TLS has no half-close: the raw transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handshaking:
            self._fail_handshake(
                exc or ConnectionResetError("connection lost during TLS handshake")
            )
        self._lose(exc)

    def _lose(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        if self._connected:
            self._app.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._connected:
            self._app.pause_writing()

    def resume_writing(self) -> None:
        if self._connected:
            self._app.resume_writing()


class TLSTransport(Transport):
    """The application's side of a :class:`TLSLayer`."""

    def __init__(self, layer: TLSLayer) -> None:
        super().__init__()
        self._layer = layer
        self._closing = False

    def get_extra_info(self, name: str, default: object = None) -> Any:
        obj = self._layer._obj
        if name == "ssl_object":
            return obj
        if name == "sslcontext":
            return self._layer._context
        if name == "peercert":
            return obj.getpeercert()
        if name == "cipher":
            return obj.cipher()
        return self._layer._raw.get_extra_info(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        layer = self._layer
        try:
            layer._obj.write(data)
        except _TLS_ERRORS as exc:
            layer._raw.abort()
            layer._lose(exc if isinstance(exc, Exception) else None)
            return
        layer._flush()

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError("TLS has no half-close")

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        layer = self._layer
        try:
            layer._obj.unwrap()  # our close_notify; the peer's is not awaited
        except (ssl.SSLWantReadError, *_TLS_ERRORS):
            pass
        layer._flush()
        layer._raw.close()

    def abort(self) -> None:
        self._closing = True
        self._layer._raw.abort()

    def is_closing(self) -> bool:
        return self._closing or self._layer._raw.is_closing()

    def pause_reading(self) -> None:
        self._layer._paused = True
        self._layer._raw.pause_reading()

    def resume_reading(self) -> None:
        layer = self._layer
        if not layer._paused:
            return
        layer._paused = False
        layer._raw.resume_reading()
        if layer._connected:
            layer._loop.call_soon(layer._deliver)  # what OpenSSL holds already

    def is_reading(self) -> bool:
        return not self._layer._paused and self._layer._raw.is_reading()

    def get_write_buffer_size(self) -> int:
        return self._layer._raw.get_write_buffer_size()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._layer._raw.set_write_buffer_limits(high, low)

    def set_protocol(self, protocol: Any) -> None:
        self._layer._app = protocol

    def get_protocol(self) -> Any:
        return self._layer._app
