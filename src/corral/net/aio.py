"""corral's own small event loop: the part of asyncio the proxy uses, nothing more.

Why not asyncio itself: importing it (with ``ssl``, ``logging``, ``inspect``,
``typing``, ``concurrent.futures`` and the rest it pulls in) costs 40 to 60 ms
of CPU on a small machine, and a run's proxy is a process forked for that run.
Every networked run paid it, and its first request waited for it: the
sandbox's command connected while the proxy was still importing.  This module
imports only C modules (``_socket``, ``select``, ``_heapq``, ``_thread``) and is
ready a millisecond after the fork.

It offers asyncio's names and semantics for what the proxy needs, so the code
reads as asyncio code: coroutines driven by :class:`Task`, :class:`Future`,
``call_soon``/``call_later``, readers and writers on an epoll set, TCP and unix
stream transports with protocols (flow control both ways, half-close,
``set_protocol``), datagram transports, servers, TLS over memory BIOs
(``start_tls``, client connections with ``ssl=``), streams
(:class:`StreamReader`, :class:`StreamWriter`), ``timeout``, ``wait_for``,
``sleep``, ``gather``, ``wait``, :class:`Event`, and a few worker threads for
``getaddrinfo`` and ``run_in_executor``.  What differs from asyncio is said
where it differs (``start_tls`` takes the bytes already read and calls
``connection_made`` itself).  Only the proxy's own processes run it; corral's
Python API keeps using asyncio.
"""

from __future__ import annotations

import _socket
import errno as _errno
import os
import select
import time
from _collections import deque  # type: ignore[import-not-found, unused-ignore]
from _heapq import heappop, heappush

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ssl
    from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable
    from typing import Any

MAX_READ = 256 * 1024  # bytes asked of a socket per readiness event (asyncio's figure)
HIGH_WATER = 64 * 1024  # a transport's write buffer above this pauses its protocol
LOW_WATER = 16 * 1024  # ... and below this resumes it
DEFAULT_LIMIT = 64 * 1024  # a StreamReader's line/frame limit
EXECUTOR_THREADS = 4
ACCEPT_BATCH = 16  # connections accepted per readiness event of a listener
# Clients held at once by one loop (one proxy worker): each may cost a message head
# (64 KiB) and buffers, in a process outside the sandbox's memory limit.  Fewer
# where the descriptor limit is lower: a client may hold an upstream too, and the
# worker keeps FD_RESERVE for everything else (files, lookups, imports).
MAX_CLIENTS = 1024
FD_RESERVE = 64
ACCEPT_PAUSE = 0.5  # seconds a listener rests after the process ran out of descriptors
FIRST_COMPLETED = "FIRST_COMPLETED"
ALL_COMPLETED = "ALL_COMPLETED"

_PENDING, _DONE, _CANCELLED = 0, 1, 2
_IN = select.EPOLLIN
_OUT = select.EPOLLOUT
_TRY_AGAIN = (BlockingIOError, InterruptedError)
_OUT_OF_ROOM = (_errno.EMFILE, _errno.ENFILE, _errno.ENOBUFS, _errno.ENOMEM)


class CancelledError(BaseException):
    """A task was cancelled (a BaseException, as asyncio's, so ``except Exception``
    does not swallow it)."""


class InvalidStateError(Exception):
    pass


class IncompleteReadError(EOFError):
    """The stream ended before ``expected`` bytes (None: a separator) arrived."""

    def __init__(self, partial: bytes, expected: int | None) -> None:
        super().__init__(f"{len(partial)} bytes read on a total of {expected!r} expected bytes")
        self.partial = partial
        self.expected = expected


class LimitOverrunError(Exception):
    """A separator was not found within the reader's limit."""

    def __init__(self, message: str, consumed: int) -> None:
        super().__init__(message)
        self.consumed = consumed


# -- handles, futures, tasks -----------------------------------------------------------------


class Handle:
    __slots__ = ("args", "callback", "cancelled", "when")

    def __init__(
        self, callback: Callable[..., object], args: tuple[object, ...], when: float
    ) -> None:
        self.callback = callback
        self.args = args
        self.cancelled = False
        self.when = when

    def cancel(self) -> None:
        self.cancelled = True

    def __lt__(self, other: Handle) -> bool:
        return self.when < other.when


class Future:
    """A result to come; ``await`` on it from a :class:`Task` suspends the task."""

    __slots__ = ("_callbacks", "_exception", "_loop", "_result", "_state", "_unseen")

    def __init__(self, loop: Loop | None = None) -> None:
        self._loop = loop or get_running_loop()
        self._state = _PENDING
        self._result: object = None
        self._exception: BaseException | None = None
        self._callbacks: list[Callable[[Future], object]] = []
        self._unseen = False  # an exception nobody asked for (reported when collected)

    def get_loop(self) -> Loop:
        return self._loop

    def done(self) -> bool:
        return self._state != _PENDING

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def cancel(self, msg: object = None) -> bool:
        if self._state != _PENDING:
            return False
        self._state = _CANCELLED
        self._schedule_callbacks()
        return True

    def result(self) -> Any:
        if self._state == _CANCELLED:
            raise CancelledError()
        if self._state == _PENDING:
            raise InvalidStateError("result is not set")
        self._unseen = False
        if self._exception is not None:
            raise self._exception
        return self._result

    def exception(self) -> BaseException | None:
        if self._state == _CANCELLED:
            raise CancelledError()
        if self._state == _PENDING:
            raise InvalidStateError("exception is not set")
        self._unseen = False
        return self._exception

    def set_result(self, result: object) -> None:
        if self._state != _PENDING:
            raise InvalidStateError("already done")
        self._result = result
        self._state = _DONE
        self._schedule_callbacks()

    def set_exception(self, exception: BaseException) -> None:
        if self._state != _PENDING:
            raise InvalidStateError("already done")
        if isinstance(exception, type):
            exception = exception()
        self._exception = exception
        self._state = _DONE
        self._unseen = True
        self._schedule_callbacks()

    def add_done_callback(self, fn: Callable[[Any], object]) -> None:
        if self._state != _PENDING:
            self._loop.call_soon(fn, self)
        else:
            self._callbacks.append(fn)

    def remove_done_callback(self, fn: Callable[[Any], object]) -> int:
        kept = [cb for cb in self._callbacks if cb != fn]
        removed = len(self._callbacks) - len(kept)
        self._callbacks = kept
        return removed

    def _schedule_callbacks(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            self._loop.call_soon(fn, self)

    def __await__(self) -> Generator[Future, None, Any]:
        if self._state == _PENDING:
            yield self  # the task waits here until this future is done
        return self.result()

    __iter__ = __await__

    def __del__(self) -> None:
        if self._unseen and self._exception is not None and not self._loop._closed:
            self._loop.call_exception_handler(
                {"message": "exception never retrieved", "exception": self._exception}
            )


class Task(Future):
    """Drives a coroutine: each ``await`` of a pending :class:`Future` suspends it
    until that future is done."""

    __slots__ = ("_cancels", "_coro", "_must_cancel", "_parked", "_waiting_on", "_woken")

    def __init__(self, coro: Coroutine[Any, Any, Any], loop: Loop | None = None) -> None:
        super().__init__(loop)
        self._coro = coro
        self._waiting_on: Future | None = None
        self._parked = False  # asleep until wake() (a stream's data), see _Park
        self._woken = Handle(self._step, (), 0.0)  # one per task: it is queued once at most
        self._must_cancel = False
        self._cancels = 0  # cancel() calls not taken back by uncancel()
        self._loop._tasks.add(self)
        self._loop.call_soon(self._step)

    def get_coro(self) -> Coroutine[Any, Any, Any]:
        return self._coro

    def cancel(self, msg: object = None) -> bool:
        if self._state != _PENDING:
            return False
        self._cancels += 1
        waiting = self._waiting_on
        if waiting is not None and waiting.cancel():
            return True  # its callback wakes us, and the await raises CancelledError
        self._must_cancel = True
        self.wake()  # a parked task gets the cancel at once
        return True

    def wake(self) -> None:
        """Run a parked task again (what it waited for has come)."""
        if self._parked:
            self._parked = False
            self._loop._ready.append(self._woken)

    def uncancel(self) -> int:
        if self._cancels > 0:
            self._cancels -= 1
        if self._cancels == 0:
            self._must_cancel = False  # a cancel not delivered yet is taken back too
        return self._cancels

    def cancelling(self) -> int:
        return self._cancels

    def _step(self, _woken_by: Future | None = None) -> None:
        if self._state != _PENDING:
            return
        self._waiting_on = None
        loop = self._loop
        loop._current = self
        try:
            if self._must_cancel:
                self._must_cancel = False
                yielded = self._coro.throw(CancelledError())
            else:
                yielded = self._coro.send(None)
        except StopIteration as stop:
            loop._current = None
            self._finish(stop.value, None)
        except CancelledError:
            loop._current = None
            self._finish(None, None, cancelled=True)
        except (KeyboardInterrupt, SystemExit) as exc:
            loop._current = None
            self._finish(None, exc)
            raise
        except BaseException as exc:
            loop._current = None
            self._finish(None, exc)
        else:
            loop._current = None
            if yielded is _PARKED:  # (the common case, inlined: a stream's wait)
                self._parked = True
                if self._must_cancel:
                    self.wake()
            else:
                self._wait_on(yielded)

    def _wait_on(self, yielded: object) -> None:
        if yielded is _PARKED:  # until wake(): no future, no callback
            self._parked = True
            if self._must_cancel:
                self.wake()
        elif yielded is None:  # a bare yield (sleep(0)): run again on the next turn
            self._loop.call_soon(self._step)
        elif isinstance(yielded, Future):
            self._waiting_on = yielded
            yielded.add_done_callback(self._step)
            if self._must_cancel and yielded.cancel():
                self._must_cancel = False
        else:
            self._loop.call_soon(self._step)
            self._must_cancel = False
            self._coro.throw(RuntimeError(f"a task cannot wait on {yielded!r}"))

    def _finish(self, result: object, exc: BaseException | None, cancelled: bool = False) -> None:
        self._loop._tasks.discard(self)
        if cancelled:
            Future.cancel(self)
        elif exc is not None:
            Future.set_exception(self, exc)
        else:
            Future.set_result(self, result)


class _Yield:
    """Awaiting this gives the loop one turn (sleep(0))."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        yield None


class _Park:
    """Awaiting this parks the current task until something calls its
    :meth:`Task.wake` (or cancels it).  A stream's reader waits so, several
    times per request: cheaper than a Future and its callback."""

    __slots__ = ()

    def __await__(self) -> Generator[object, None, None]:
        yield _PARKED


_PARKED = object()  # what a parked task yields
_PARK = _Park()


# -- the loop -----------------------------------------------------------------------------------


class Loop:
    """One per thread that runs it: epoll readiness, a ready queue, timers."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._ready: deque[Handle] = deque()
        self._timers: list[Handle] = []
        self._readers: dict[int, Handle] = {}
        self._writers: dict[int, Handle] = {}
        self._masks: dict[int, int] = {}
        self._tasks: set[Task] = set()
        self._current: Task | None = None
        self._stopping = False
        self._closed = False
        self._handler: Callable[[Loop, dict[str, object]], object] | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._from_threads: deque[Handle] = deque()
        self._executor: _Executor | None = None
        self._signals: dict[int, Handle] = {}
        self.add_reader(self._wake_r, self._drain_wakeups)
        self.clients = 0  # accepted connections still open, over all servers
        self.max_clients = client_limit()

    # scheduling
    def time(self) -> float:
        return time.monotonic()

    def call_soon(self, callback: Callable[..., object], *args: object) -> Handle:
        handle = Handle(callback, args, 0.0)
        self._ready.append(handle)
        return handle

    def call_later(self, delay: float, callback: Callable[..., object], *args: object) -> Handle:
        return self.call_at(time.monotonic() + delay, callback, *args)

    def call_at(self, when: float, callback: Callable[..., object], *args: object) -> Handle:
        handle = Handle(callback, args, when)
        heappush(self._timers, handle)
        return handle

    def call_soon_threadsafe(self, callback: Callable[..., object], *args: object) -> Handle:
        handle = Handle(callback, args, 0.0)
        self._from_threads.append(handle)  # deque.append is atomic
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            pass  # full (a wakeup is pending already) or closed
        return handle

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except OSError:
            pass
        while self._from_threads:
            self._ready.append(self._from_threads.popleft())

    def create_future(self) -> Future:
        return Future(self)

    def create_task(self, coro: Coroutine[Any, Any, Any]) -> Task:
        return Task(coro, self)

    # readiness
    def add_reader(self, fd: int, callback: Callable[..., object], *args: object) -> None:
        old = self._readers.get(fd)
        if old is not None:
            old.cancelled = True
        self._readers[fd] = Handle(callback, args, 0.0)
        self._update(fd)

    def remove_reader(self, fd: int) -> bool:
        handle = self._readers.pop(fd, None)
        if handle is None:
            return False
        handle.cancelled = True  # it may be queued for this turn already
        self._update(fd)
        return True

    def add_writer(self, fd: int, callback: Callable[..., object], *args: object) -> None:
        old = self._writers.get(fd)
        if old is not None:
            old.cancelled = True
        self._writers[fd] = Handle(callback, args, 0.0)
        self._update(fd)

    def remove_writer(self, fd: int) -> bool:
        handle = self._writers.pop(fd, None)
        if handle is None:
            return False
        handle.cancelled = True
        self._update(fd)
        return True

    def _update(self, fd: int) -> None:
        mask = (_IN if fd in self._readers else 0) | (_OUT if fd in self._writers else 0)
        old = self._masks.get(fd, 0)
        if mask == old:
            return
        if not mask:
            del self._masks[fd]
            try:
                self._epoll.unregister(fd)
            except OSError:
                pass  # already closed
        elif old:
            self._masks[fd] = mask
            self._epoll.modify(fd, mask)
        else:
            self._masks[fd] = mask
            self._epoll.register(fd, mask)

    # running
    def run_forever(self) -> None:
        previous = _running.loop
        _running.loop = self
        self._stopping = False
        try:
            while not self._stopping:
                self._run_once()
        finally:
            _running.loop = previous

    def run_until_complete(self, future: Awaitable[Any]) -> Any:
        task = future if isinstance(future, Future) else self.create_task(_as_coro(future))
        task.add_done_callback(lambda _f: self.stop())
        self.run_forever()
        if not task.done():
            raise RuntimeError("the loop stopped before the future completed")
        return task.result()

    def stop(self) -> None:
        self._stopping = True

    def is_running(self) -> bool:
        return _running.loop is self

    def is_closed(self) -> bool:
        return self._closed

    def _run_once(self) -> None:
        ready = self._ready
        timers = self._timers
        if ready or self._stopping:
            timeout = 0.0
        elif timers:
            timeout = max(0.0, timers[0].when - time.monotonic())
        else:
            timeout = -1.0
        events = self._epoll.poll(timeout)
        readers = self._readers
        writers = self._writers
        for fd, mask in events:
            if mask & ~_OUT:  # readable, or an error/hang-up: the reader sees it
                handle = readers.get(fd)
                if handle is not None:
                    ready.append(handle)
            if mask & ~_IN:
                handle = writers.get(fd)
                if handle is not None:
                    ready.append(handle)
        if timers:
            now = time.monotonic()
            while timers and timers[0].when <= now:
                ready.append(heappop(timers))
        for _ in range(len(ready)):
            handle = ready.popleft()
            if handle.cancelled:
                continue
            try:
                handle.callback(*handle.args)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:
                self.call_exception_handler({"message": "callback failed", "exception": exc})

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sig in list(self._signals):
            self.remove_signal_handler(sig)
        if self._executor is not None:
            self._executor.shutdown()
        self._epoll.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # errors
    def set_exception_handler(self, handler: Callable[[Loop, dict[str, object]], object]) -> None:
        self._handler = handler

    def call_exception_handler(self, context: dict[str, object]) -> None:
        if self._handler is not None:
            try:
                self._handler(self, context)
                return
            except Exception:
                pass
        import sys

        exc = context.get("exception")
        detail = f": {type(exc).__name__}: {exc}" if exc is not None else ""
        sys.stderr.write(f"corral event loop: {context.get('message')}{detail}\n")

    # signals
    def add_signal_handler(self, sig: int, callback: Callable[..., object], *args: object) -> None:
        import _signal  # type: ignore[import-not-found, unused-ignore]

        handle = Handle(callback, args, 0.0)
        self._signals[sig] = handle
        _signal.signal(sig, lambda _n, _f: self.call_soon_threadsafe(callback, *args))

    def remove_signal_handler(self, sig: int) -> bool:
        import _signal  # type: ignore[import-not-found, unused-ignore]

        if self._signals.pop(sig, None) is None:
            return False
        _signal.signal(sig, _signal.SIG_DFL)
        return True

    # threads
    def run_in_executor(self, executor: None, fn: Callable[..., Any], *args: object) -> Future:
        if self._executor is None:
            self._executor = _Executor(self)
        return self._executor.submit(fn, args)

    async def getaddrinfo(
        self, host: str | None, port: int | str | None, family: int = 0, type: int = 0,
        proto: int = 0, flags: int = 0,
    ) -> list[tuple[Any, ...]]:  # fmt: skip
        return await self.run_in_executor(  # type: ignore[no-any-return]
            None, _socket.getaddrinfo, host, port, family, type, proto, flags
        )

    # connections
    async def sock_connect(self, sock: _socket.socket, address: Any) -> None:
        """Connect a non-blocking socket, waiting for the outcome on the loop."""
        try:
            sock.connect(address)
            return
        except _TRY_AGAIN:
            pass
        fd = sock.fileno()
        if not _writable_now(fd):  # (on loopback the handshake is done already)
            waiter = self.create_future()
            self.add_writer(fd, _set_if_pending, waiter, None)
            try:
                await waiter
            finally:
                self.remove_writer(fd)
        error = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_ERROR)
        if error:
            raise OSError(error, os.strerror(error))

    async def sock_recv(self, sock: _socket.socket, size: int) -> bytes:
        """Receive from a non-blocking socket, waiting on the loop while it has nothing."""
        while True:
            try:
                return sock.recv(size)
            except _TRY_AGAIN:
                pass
            waiter = self.create_future()
            self.add_reader(sock.fileno(), _set_if_pending, waiter, None)
            try:
                await waiter
            finally:
                self.remove_reader(sock.fileno())

    async def create_connection(
        self,
        protocol_factory: Callable[[], Protocol],
        host: str | None = None,
        port: int | None = None,
        *,
        ssl: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        sock: _socket.socket | None = None,
    ) -> tuple[Transport, Protocol]:
        if sock is None:
            sock = await self._open_tcp(host, port)
        sock.setblocking(False)
        raw = SocketTransport(self, sock, _Pending())
        try:
            if ssl is not None:
                protocol = protocol_factory()
                transport: Transport = await self.start_tls(
                    raw, protocol, ssl, server_hostname=server_hostname or host
                )
                return transport, protocol
        except BaseException:
            raw.abort()
            raise
        protocol = protocol_factory()
        raw.set_protocol(protocol)
        protocol.connection_made(raw)
        raw.start()
        return raw, protocol

    async def _open_tcp(self, host: str | None, port: int | None) -> _socket.socket:
        infos = _literal(host, port) or await self.getaddrinfo(host, port, type=_socket.SOCK_STREAM)
        error: OSError | None = None
        for family, kind, proto, _name, address in infos:
            sock = _socket.socket(
                family, kind | _socket.SOCK_NONBLOCK | _socket.SOCK_CLOEXEC, proto
            )
            try:
                await self.sock_connect(sock, address)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            return sock
        raise error or OSError(f"no address for {host}")

    async def start_tls(
        self,
        transport: Transport,
        protocol: Protocol,
        sslcontext: ssl.SSLContext,
        *,
        server_side: bool = False,
        server_hostname: str | None = None,
        ssl_handshake_timeout: float | None = 60.0,
        initial: bytes = b"",
    ) -> Transport:
        """TLS over ``transport`` for ``protocol``; returns the TLS transport, on
        which ``protocol.connection_made`` has been called already.  ``initial``:
        bytes of the peer's already read off the transport (a ClientHello);
        what the transport's stream holds unread follows them."""
        from corral.net.aiotls import TLSLayer

        before = transport.get_protocol()
        if isinstance(before, StreamReaderProtocol):  # what its stream read and nobody took
            initial += before._reader.take_buffered()
        layer = TLSLayer(self, transport, protocol, sslcontext, server_side, server_hostname)
        return await layer.handshake(initial, ssl_handshake_timeout)

    async def create_datagram_endpoint(
        self, protocol_factory: Callable[[], DatagramProtocol], *, sock: _socket.socket
    ) -> tuple[DatagramTransport, DatagramProtocol]:
        sock.setblocking(False)
        protocol = protocol_factory()
        transport = DatagramTransport(self, sock, protocol)
        protocol.connection_made(transport)
        transport.start()
        return transport, protocol

    async def create_server(
        self,
        protocol_factory: Callable[[], Protocol],
        host: str | None = None,
        port: int | None = None,
        *,
        sock: _socket.socket | None = None,
        backlog: int = 1024,
        reuse_address: bool = True,
    ) -> Server:
        if sock is None:
            sock = _listen_tcp(host, port, backlog, reuse_address)
        server = Server(self, [sock], protocol_factory, backlog)
        server.start()
        return server

    def shutdown_default_executor(self) -> None:
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None


def _literal(host: str | None, port: int | None) -> list[tuple[Any, ...]]:
    """getaddrinfo's answer for an address literal, without a thread: the proxy
    connects to addresses it has resolved and checked already."""
    if host is None or port is None:
        return []
    for family, address in (
        (_socket.AF_INET, (host, port)),
        (_socket.AF_INET6, (host, port, 0, 0)),
    ):
        try:
            _socket.inet_pton(family, host)
        except OSError:
            continue
        return [(family, _socket.SOCK_STREAM, 0, "", address)]
    return []


def _as_coro(awaitable: Awaitable[Any]) -> Coroutine[Any, Any, Any]:
    if hasattr(awaitable, "send"):
        return awaitable  # type: ignore[return-value]

    async def wrap() -> Any:
        return await awaitable

    return wrap()


def _writable_now(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return bool(poller.poll(0))


def _set_if_pending(future: Future, value: object) -> None:
    if not future.done():
        future.set_result(value)


class _Running:
    """Which loop this thread runs (a C thread-local: no `threading` import)."""

    def __init__(self) -> None:
        import _thread

        self._local = _thread._local()

    @property
    def loop(self) -> Loop | None:
        return getattr(self._local, "loop", None)

    @loop.setter
    def loop(self, value: Loop | None) -> None:
        self._local.loop = value


_running = _Running()


def get_running_loop() -> Loop:
    loop = _running.loop
    if loop is None:
        raise RuntimeError("no running event loop")
    return loop


get_event_loop = get_running_loop


def current_task() -> Task | None:
    return get_running_loop()._current


def new_event_loop() -> Loop:
    return Loop()


def run(main: Coroutine[Any, Any, Any]) -> Any:
    """Run ``main`` on a new loop; then cancel what is left and close the loop."""
    loop = Loop()
    try:
        return loop.run_until_complete(loop.create_task(main))
    finally:
        try:
            _cancel_all(loop)
        finally:
            loop.close()


def _cancel_all(loop: Loop) -> None:
    tasks = [t for t in loop._tasks if not t.done()]
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    loop.run_until_complete(gather(*tasks, return_exceptions=True, loop=loop))
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler(
                {"message": "unhandled exception during shutdown", "exception": task.exception()}
            )


# -- the few threads: getaddrinfo, run_in_executor ---------------------------------------------


class _Executor:
    """A handful of daemon threads taking calls from a queue; results come back
    to the loop through call_soon_threadsafe."""

    def __init__(self, loop: Loop) -> None:
        import _queue

        self.loop = loop
        self.queue: Any = _queue.SimpleQueue()
        self.threads = 0

    def submit(self, fn: Callable[..., Any], args: tuple[object, ...]) -> Future:
        import _thread

        future = self.loop.create_future()
        self.queue.put((future, fn, args))
        if self.threads < EXECUTOR_THREADS:
            self.threads += 1
            _thread.start_new_thread(self._work, ())
        return future

    def _work(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            future, fn, args = item
            try:
                result = fn(*args)
            except BaseException as exc:
                self._post(future, None, exc)
            else:
                self._post(future, result, None)

    def _post(self, future: Future, result: object, exc: BaseException | None) -> None:
        def settle() -> None:
            if future.done():
                return
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(result)

        try:
            self.loop.call_soon_threadsafe(settle)
        except OSError:
            pass  # the loop is gone

    def shutdown(self) -> None:
        for _ in range(self.threads):
            self.queue.put(None)
        self.threads = 0


# -- protocols and transports --------------------------------------------------------------------


class BaseProtocol:
    def connection_made(self, transport: Any) -> None:
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        pass

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass


class Protocol(BaseProtocol):
    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool | None:
        return None


class BufferedProtocol(BaseProtocol):
    """Reads land in a buffer the protocol gives (no bytes object per read);
    ``buffer_updated(n)`` must use or copy those ``n`` bytes before it returns:
    the buffer may be shared (:data:`READ_BUFFER`)."""

    def get_buffer(self, sizehint: int) -> memoryview:
        raise NotImplementedError

    def buffer_updated(self, nbytes: int) -> None:
        pass

    def eof_received(self) -> bool | None:
        return None


# One read buffer for every BufferedProtocol that lends it (a loop runs one
# callback at a time, and each consumes its bytes before returning).
READ_BUFFER = memoryview(bytearray(MAX_READ))


class DatagramProtocol(BaseProtocol):
    def datagram_received(self, data: bytes, addr: Any) -> None:
        pass

    def error_received(self, exc: Exception) -> None:
        pass


class _Pending(Protocol):
    """A raw transport's protocol until its real one is set."""


class BaseTransport:
    def __init__(self, extra: dict[str, object] | None = None) -> None:
        self._extra = extra or {}

    def get_extra_info(self, name: str, default: object = None) -> Any:
        return self._extra.get(name, default)

    def is_closing(self) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def set_protocol(self, protocol: Any) -> None:
        raise NotImplementedError

    def get_protocol(self) -> Any:
        raise NotImplementedError


class Transport(BaseTransport):
    """A byte stream's transport (see :class:`SocketTransport`; TLS: aiotls)."""

    def write(self, data: bytes | bytearray | memoryview) -> None:
        raise NotImplementedError

    def writelines(self, chunks: Iterable[bytes]) -> None:
        self.write(b"".join(chunks))

    def write_eof(self) -> None:
        raise NotImplementedError

    def can_write_eof(self) -> bool:
        return False

    def abort(self) -> None:
        raise NotImplementedError

    def pause_reading(self) -> None:
        raise NotImplementedError

    def resume_reading(self) -> None:
        raise NotImplementedError

    def is_reading(self) -> bool:
        raise NotImplementedError

    def get_write_buffer_size(self) -> int:
        raise NotImplementedError

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        raise NotImplementedError


class SocketTransport(Transport):
    """A connected stream socket (TCP or unix): reads while not paused, writes
    at once and buffers the rest, pauses its protocol above HIGH_WATER."""

    def __init__(
        self, loop: Loop, sock: _socket.socket, protocol: Protocol, server: Server | None = None
    ) -> None:
        super().__init__({"socket": sock})
        self._loop = loop
        self._sock: _socket.socket | None = sock
        self._fd = sock.fileno()
        self._protocol: Any = protocol  # a Protocol, or a BufferedProtocol (_into)
        self._server = server
        self._buffer = bytearray()
        self._closing = False
        self._lost = False
        self._reading = False
        self._paused = True  # until start()
        self._eof = False  # write_eof asked for
        self._read_eof = False  # the peer's end of file arrived
        self._protocol_paused = False
        self._high = HIGH_WATER
        self._low = LOW_WATER
        self._into = isinstance(protocol, BufferedProtocol)
        if server is not None:
            server._attach()

    def get_extra_info(self, name: str, default: object = None) -> Any:
        if name not in self._extra and self._sock is not None:
            if name == "peername":
                self._extra[name] = _address(self._sock, "getpeername")
            elif name == "sockname":
                self._extra[name] = _address(self._sock, "getsockname")
        return self._extra.get(name, default)

    def start(self) -> None:
        """Begin reading (after connection_made)."""
        if self._paused and not self._closing and not self._read_eof:
            self._paused = False
            self._loop.add_reader(self._fd, self._read_ready)

    def set_protocol(self, protocol: Any) -> None:
        self._protocol = protocol
        self._into = isinstance(protocol, BufferedProtocol)

    def get_protocol(self) -> Any:
        return self._protocol

    def is_closing(self) -> bool:
        return self._closing

    def is_reading(self) -> bool:
        return not self._paused and not self._closing and not self._read_eof

    def pause_reading(self) -> None:
        if self._closing or self._paused or self._read_eof:
            return
        self._paused = True
        self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        self.start()

    def _read_ready(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            if self._into:  # into the protocol's buffer: no bytes object per read
                got = sock.recv_into(self._protocol.get_buffer(-1))
                if got:
                    self._protocol.buffer_updated(got)
                    return
            else:
                data = sock.recv(MAX_READ)
                if data:
                    self._protocol.data_received(data)
                    return
        except _TRY_AGAIN:
            return
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            self._fatal(exc)
            return
        self._loop.remove_reader(self._fd)
        self._read_eof = True  # nothing more will come: never read again
        keep_open = self._protocol.eof_received()
        if not keep_open:
            self.close()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._eof:
            raise RuntimeError("cannot write after write_eof()")
        if not data or self._lost:
            return
        if not self._buffer:
            try:
                sent = self._sock.send(data)  # type: ignore[union-attr]
            except _TRY_AGAIN:
                sent = 0
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:
                self._fatal(exc)
                return
            if sent == len(data):
                return
            data = memoryview(data)[sent:]
            self._loop.add_writer(self._fd, self._write_ready)
        self._buffer += data
        if not self._protocol_paused and len(self._buffer) > self._high:
            self._protocol_paused = True
            self._protocol.pause_writing()

    def _write_ready(self) -> None:
        if self._sock is None:
            return
        try:
            sent = self._sock.send(self._buffer)
        except _TRY_AGAIN:
            return
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            self._loop.remove_writer(self._fd)
            self._buffer.clear()
            self._fatal(exc)
            return
        del self._buffer[:sent]
        if self._protocol_paused and len(self._buffer) <= self._low:
            self._protocol_paused = False
            self._protocol.resume_writing()
        if self._buffer:
            return
        self._loop.remove_writer(self._fd)
        if self._closing:
            self._lose(None)
        elif self._eof:
            self._shutdown_write()

    def write_eof(self) -> None:
        if self._closing or self._eof:
            return
        self._eof = True
        if not self._buffer:
            self._shutdown_write()

    def _shutdown_write(self) -> None:
        try:
            self._sock.shutdown(_socket.SHUT_WR)  # type: ignore[union-attr]
        except OSError:
            pass

    def can_write_eof(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return len(self._buffer)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = HIGH_WATER if high is None else high
        self._low = self._high // 4 if low is None else low

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._fd)
        if not self._buffer:
            self._lose(None)

    def abort(self) -> None:
        self._force_close(None)

    def _fatal(self, exc: BaseException) -> None:
        if not isinstance(exc, OSError):  # a bug, not the network: say so
            self._loop.call_exception_handler({"message": "transport failed", "exception": exc})
        self._force_close(exc if isinstance(exc, Exception) else None)

    def _force_close(self, exc: Exception | None) -> None:
        if self._lost:
            return
        if self._buffer:
            self._buffer.clear()
            self._loop.remove_writer(self._fd)
        if not self._closing:
            self._closing = True
            self._loop.remove_reader(self._fd)
        self._lose(exc)

    def _lose(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._loop.call_soon(self._call_connection_lost, exc)

    def _call_connection_lost(self, exc: Exception | None) -> None:
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._loop.remove_reader(self._fd)
            self._loop.remove_writer(self._fd)
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            if self._server is not None:
                self._server._detach()
                self._server = None


def _address(sock: _socket.socket, how: str) -> object:
    try:
        return getattr(sock, how)()
    except OSError:
        return None


class DatagramTransport(BaseTransport):
    """A UDP socket: datagrams in to the protocol, sendto() out (buffered when
    the socket is full)."""

    def __init__(self, loop: Loop, sock: _socket.socket, protocol: DatagramProtocol) -> None:
        super().__init__({"socket": sock})
        self._loop = loop
        self._sock: _socket.socket | None = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._queue: deque[tuple[bytes, Any]] = deque()
        self._closing = False

    def start(self) -> None:
        self._loop.add_reader(self._fd, self._read_ready)

    def get_protocol(self) -> Any:
        return self._protocol

    def set_protocol(self, protocol: Any) -> None:
        self._protocol = protocol

    def is_closing(self) -> bool:
        return self._closing

    def _read_ready(self) -> None:
        if self._sock is None:
            return
        try:
            data, addr = self._sock.recvfrom(MAX_READ)
        except _TRY_AGAIN:
            return
        except OSError as exc:
            self._protocol.error_received(exc)
            return
        self._protocol.datagram_received(data, addr)

    def sendto(self, data: bytes, addr: Any = None) -> None:
        if self._sock is None or self._closing:
            return
        if not self._queue:
            try:
                self._sock.sendto(data, addr)
                return
            except _TRY_AGAIN:
                self._loop.add_writer(self._fd, self._write_ready)
            except OSError as exc:
                self._protocol.error_received(exc)
                return
        if len(self._queue) < 1024:  # a flood is dropped, as UDP may
            self._queue.append((data, addr))

    def _write_ready(self) -> None:
        while self._queue and self._sock is not None:
            data, addr = self._queue[0]
            try:
                self._sock.sendto(data, addr)
            except _TRY_AGAIN:
                return
            except OSError as exc:
                self._protocol.error_received(exc)
            self._queue.popleft()
        self._loop.remove_writer(self._fd)

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)
        self._loop.call_soon(self._lost)

    abort = close

    def _lost(self) -> None:
        try:
            self._protocol.connection_lost(None)
        finally:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


class Server:
    """Accepts on listening sockets; each connection gets a protocol from the
    factory and a :class:`SocketTransport`."""

    def __init__(
        self,
        loop: Loop,
        sockets: list[_socket.socket],
        factory: Callable[[], Protocol],
        backlog: int,
    ) -> None:
        self._loop = loop
        self.sockets = sockets
        self._factory = factory
        self._backlog = backlog
        self._active = 0
        self._serving = False
        self._waiters: list[Future] = []

    def start(self) -> None:
        self._serving = True
        for sock in self.sockets:
            sock.setblocking(False)
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _accept(self, listener: _socket.socket) -> None:
        # A few per wakeup, not the whole backlog: workers sharing a listener then
        # share a burst of connections instead of one taking them all.
        for _ in range(ACCEPT_BATCH):
            try:
                fd, _addr = listener._accept()  # type: ignore[attr-defined]
            except _TRY_AGAIN:
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_ROOM:
                    self._rest(listener)
                return  # ECONNABORTED: the next readiness tries again
            sock = _socket.socket(listener.family, listener.type, 0, fd)
            if self._loop.clients >= self._loop.max_clients:
                # Taken off the backlog and closed at once: left there, it would
                # keep the listener ready and this loop spinning on it.
                sock.close()
                continue
            sock.setblocking(False)
            if listener.family != _socket.AF_UNIX:
                sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            protocol = self._factory()
            transport = SocketTransport(self._loop, sock, protocol, self)
            try:
                protocol.connection_made(transport)
            except BaseException:
                transport.abort()
                raise
            transport.start()
            transport._read_ready()  # a client's first bytes are often here already

    def _rest(self, listener: _socket.socket) -> None:
        """Out of descriptors: the connection stays in the backlog, so its listener
        stays ready, and trying again at once would spin.  Rest a while."""
        fd = listener.fileno()
        self._loop.remove_reader(fd)

        def wake() -> None:
            if self._serving and listener.fileno() == fd:
                self._loop.add_reader(fd, self._accept, listener)

        self._loop.call_later(ACCEPT_PAUSE, wake)

    def _attach(self) -> None:
        self._active += 1
        self._loop.clients += 1

    def _detach(self) -> None:
        self._active -= 1
        self._loop.clients -= 1
        if self._active == 0 and not self._serving:
            self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            _set_if_pending(waiter, None)

    def is_serving(self) -> bool:
        return self._serving

    def close(self) -> None:
        if not self._serving:
            return
        self._serving = False
        for sock in self.sockets:
            self._loop.remove_reader(sock.fileno())
            sock.close()
        if self._active == 0:
            self._wake()

    async def wait_closed(self) -> None:
        if self._serving or self._active == 0:
            return
        waiter = self._loop.create_future()
        self._waiters.append(waiter)
        await waiter

    async def serve_forever(self) -> None:
        await self._loop.create_future()  # until cancelled


def client_limit() -> int:
    """How many clients one loop holds at once (see MAX_CLIENTS)."""
    import resource  # a C module

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CLIENTS
    return max(1, min(MAX_CLIENTS, (soft - FD_RESERVE) // 2))


AbstractServer = Server
AbstractEventLoop = Loop


def _listen_tcp(host: str | None, port: int | None, backlog: int, reuse: bool) -> _socket.socket:
    infos = _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM, 0, _socket.AI_PASSIVE)
    family, kind, proto, _name, address = infos[0]
    sock = _socket.socket(family, kind | _socket.SOCK_CLOEXEC, proto)
    try:
        if reuse:
            sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


# -- streams -------------------------------------------------------------------------------------


class StreamReader:
    """Bytes a protocol received, read by coroutines.  Above twice ``limit``
    buffered, the transport stops reading until a reader takes some."""

    def __init__(self, limit: int = DEFAULT_LIMIT, loop: Loop | None = None) -> None:
        self._limit = limit
        self._loop = loop or get_running_loop()
        self._buffer = bytearray()
        self._eof = False
        self._waiter: Task | None = None  # the task parked for more data
        self._exception: BaseException | None = None
        self._transport: Transport | None = None
        self._paused = False

    @property
    def buffered(self) -> int:
        """Bytes received and not read yet."""
        return len(self._buffer)

    def take_buffered(self) -> bytes:
        """Everything received and not read yet (the stream then holds none):
        for a caller taking the connection over (a tunnel, TLS)."""
        data = bytes(self._buffer)
        self._buffer.clear()
        self._maybe_resume()
        return data

    def exception(self) -> BaseException | None:
        return self._exception

    def set_exception(self, exc: BaseException) -> None:
        self._exception = exc
        self._wake()  # the waiting read raises it

    def set_transport(self, transport: Transport) -> None:
        self._transport = transport

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.wake()

    def feed_eof(self) -> None:
        self._eof = True
        self._wake()

    def at_eof(self) -> bool:
        return self._eof and not self._buffer

    def feed_data(self, data: bytes) -> None:
        if not data:
            return
        self._buffer += data
        self._wake()
        if not self._paused and self._transport is not None and len(self._buffer) > 2 * self._limit:
            try:
                self._transport.pause_reading()
            except NotImplementedError:
                return
            self._paused = True

    def _maybe_resume(self) -> None:
        if self._paused and len(self._buffer) <= self._limit and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()

    async def _wait_for_data(self) -> None:
        if self._waiter is not None:
            raise RuntimeError("another coroutine is already waiting for this stream")
        if self._paused:  # nothing would ever come: read on, whatever the buffer
            self._paused = False
            if self._transport is not None:
                self._transport.resume_reading()
        task = self._loop._current
        if task is None:
            raise RuntimeError("a stream is read outside a task")
        self._waiter = task
        try:
            await _PARK
        finally:
            self._waiter = None
        if self._exception is not None:
            raise self._exception

    async def read(self, n: int = -1) -> bytes:
        if self._exception is not None:
            raise self._exception
        if n == 0:
            return b""
        if n < 0:
            chunks = []
            while chunk := await self.read(self._limit):
                chunks.append(chunk)
            return b"".join(chunks)
        if not self._buffer and not self._eof:
            await self._wait_for_data()
        if len(self._buffer) <= n:
            data = bytes(self._buffer)
            self._buffer.clear()
        else:
            data = bytes(memoryview(self._buffer)[:n])
            del self._buffer[:n]
        self._maybe_resume()
        return data

    async def readexactly(self, n: int) -> bytes:
        if n < 0:
            raise ValueError("readexactly size can not be less than zero")
        if self._exception is not None:
            raise self._exception
        while len(self._buffer) < n:
            if self._eof:
                partial = bytes(self._buffer)
                self._buffer.clear()
                raise IncompleteReadError(partial, n)
            await self._wait_for_data()
        if len(self._buffer) == n:
            data = bytes(self._buffer)
            self._buffer.clear()
        else:
            data = bytes(memoryview(self._buffer)[:n])
            del self._buffer[:n]
        self._maybe_resume()
        return data

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        if self._exception is not None:
            raise self._exception
        size = len(separator)
        offset = 0
        while True:
            found = self._buffer.find(separator, offset)
            if found >= 0:
                break
            offset = max(0, len(self._buffer) + 1 - size)
            if offset > self._limit:
                raise LimitOverrunError("separator not found within the limit", offset)
            if self._eof:
                partial = bytes(self._buffer)
                self._buffer.clear()
                raise IncompleteReadError(partial, None)
            await self._wait_for_data()
        if found > self._limit:
            raise LimitOverrunError("separator found beyond the limit", found)
        end = found + size
        data = bytes(memoryview(self._buffer)[:end])
        del self._buffer[:end]
        self._maybe_resume()
        return data

    async def readline(self) -> bytes:
        try:
            return await self.readuntil(b"\n")
        except IncompleteReadError as exc:
            return exc.partial
        except LimitOverrunError as exc:
            if self._buffer.startswith(b"\n", exc.consumed):
                del self._buffer[: exc.consumed + 1]
            else:
                self._buffer.clear()
            self._maybe_resume()
            raise ValueError(exc.args[0]) from None


class StreamReaderProtocol(Protocol):
    """Feeds a :class:`StreamReader`; with ``client_connected_cb``, starts it
    (as a task when it is a coroutine function) once connected."""

    def __init__(
        self,
        reader: StreamReader,
        client_connected_cb: Callable[[StreamReader, StreamWriter], object] | None = None,
        loop: Loop | None = None,
    ) -> None:
        self._reader = reader
        self._loop = loop or reader._loop
        self._callback = client_connected_cb
        self._transport: Transport | None = None
        self._paused = False
        self._drain_waiters: deque[Future] = deque()
        self._lost = False
        self._closed: Future | None = None
        self.task: Task | None = None

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        self._reader.set_transport(transport)
        if self._callback is not None:
            writer = StreamWriter(transport, self, self._reader, self._loop)
            result = self._callback(self._reader, writer)
            if hasattr(result, "send"):
                self.task = self._loop.create_task(result)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        self._reader.feed_data(data)

    def eof_received(self) -> bool:
        self._reader.feed_eof()
        return True  # keep writing (half-close); a TLS layer ends it itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if exc is None:
            self._reader.feed_eof()
        else:
            self._reader.set_exception(exc)
        while self._drain_waiters:
            waiter = self._drain_waiters.popleft()
            if not waiter.done():
                if exc is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(exc)
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        while self._drain_waiters:
            waiter = self._drain_waiters.popleft()
            _set_if_pending(waiter, None)

    async def drain_helper(self) -> None:
        if self._lost:
            raise ConnectionResetError("Connection lost")
        if not self._paused:
            return
        waiter = self._loop.create_future()
        self._drain_waiters.append(waiter)
        await waiter

    async def wait_closed(self) -> None:
        if self._lost:
            return
        if self._closed is None:
            self._closed = self._loop.create_future()
        await self._closed


class StreamWriter:
    """Writes to a transport; ``drain()`` waits while its buffer is above the
    high-water mark."""

    def __init__(
        self,
        transport: Transport,
        protocol: StreamReaderProtocol,
        reader: StreamReader | None,
        loop: Loop | None = None,
    ) -> None:
        self.transport = transport
        self._protocol = protocol
        self._reader = reader
        self._loop = loop or protocol._loop

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.transport.write(data)

    def writelines(self, chunks: Iterable[bytes]) -> None:
        self.transport.writelines(chunks)

    def write_eof(self) -> None:
        self.transport.write_eof()

    def can_write_eof(self) -> bool:
        return self.transport.can_write_eof()

    def close(self) -> None:
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    async def wait_closed(self) -> None:
        await self._protocol.wait_closed()

    def get_extra_info(self, name: str, default: object = None) -> Any:
        return self.transport.get_extra_info(name, default)

    async def drain(self) -> None:
        if self._reader is not None and self._reader._exception is not None:
            raise self._reader._exception
        if self.transport.is_closing():
            await _Yield()  # let connection_lost run, so drain_helper knows
        protocol = self._protocol
        if protocol._lost or protocol._paused:  # (else no coroutine to make and run)
            await protocol.drain_helper()


async def open_connection(
    host: str | None = None,
    port: int | None = None,
    *,
    limit: int = DEFAULT_LIMIT,
    ssl: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
    sock: _socket.socket | None = None,
) -> tuple[StreamReader, StreamWriter]:
    loop = get_running_loop()
    reader = StreamReader(limit, loop)
    protocol = StreamReaderProtocol(reader, loop=loop)
    transport, _ = await loop.create_connection(
        lambda: protocol, host, port, ssl=ssl, server_hostname=server_hostname, sock=sock
    )
    return reader, StreamWriter(transport, protocol, reader, loop)


async def open_unix_connection(
    path: str | None = None, *, sock: _socket.socket | None = None, limit: int = DEFAULT_LIMIT
) -> tuple[StreamReader, StreamWriter]:
    loop = get_running_loop()
    if sock is None:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, path)
        except BaseException:
            sock.close()
            raise
    return await open_connection(sock=sock, limit=limit)


async def start_server(
    client_connected_cb: Callable[[StreamReader, StreamWriter], object],
    host: str | None = None,
    port: int | None = None,
    *,
    sock: _socket.socket | None = None,
    limit: int = DEFAULT_LIMIT,
    backlog: int = 1024,
    reuse_address: bool = True,
) -> Server:
    loop = get_running_loop()

    def factory() -> Protocol:
        return StreamReaderProtocol(StreamReader(limit, loop), client_connected_cb, loop)

    return await loop.create_server(
        factory, host, port, sock=sock, backlog=backlog, reuse_address=reuse_address
    )


async def start_unix_server(
    client_connected_cb: Callable[[StreamReader, StreamWriter], object],
    path: str | None = None,
    *,
    sock: _socket.socket | None = None,
    limit: int = DEFAULT_LIMIT,
    backlog: int = 1024,
) -> Server:
    if sock is None:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
        try:
            sock.bind(path or "")
            sock.listen(backlog)
        except BaseException:
            sock.close()
            raise
    return await start_server(client_connected_cb, sock=sock, limit=limit, backlog=backlog)


# -- waiting: sleep, timeout, wait_for, gather, wait, Event --------------------------------------


async def sleep(delay: float, result: object = None) -> Any:
    if delay <= 0:
        await _Yield()
        return result
    loop = get_running_loop()
    future = loop.create_future()
    handle = loop.call_later(delay, _set_if_pending, future, result)
    try:
        return await future
    finally:
        handle.cancel()


class Timeout:
    """``async with timeout(s):``: the block is cancelled after ``s`` seconds
    (None: never) and the cancellation becomes TimeoutError."""

    def __init__(self, delay: float | None) -> None:
        self._delay = delay
        self._task: Task | None = None
        self._handle: Handle | None = None
        self._fired = False

    async def __aenter__(self) -> Timeout:
        task = current_task()
        if task is None:
            raise RuntimeError("timeout() outside a task")
        self._task = task
        if self._delay is not None:
            loop = task.get_loop()
            self._handle = loop.call_later(max(0.0, self._delay), self._fire)
        return self

    def _fire(self) -> None:
        if self._task is not None and not self._task.done():
            self._fired = True
            self._task.cancel()

    def expired(self) -> bool:
        return self._fired

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: object, tb: object
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        fired = self._fired and self._task is not None
        if fired and self._task.uncancel() == 0 and exc_type is CancelledError:  # type: ignore[union-attr]
            raise TimeoutError from None


def timeout(delay: float | None) -> Timeout:
    return Timeout(delay)


async def wait_for(awaitable: Awaitable[Any], timeout: float | None) -> Any:
    """``awaitable``'s result, or TimeoutError after ``timeout`` seconds (it is
    cancelled then).  A coroutine runs in the caller's task: no task of its own."""
    if timeout is None:
        return await awaitable
    async with Timeout(timeout):
        return await awaitable


def ensure_future(awaitable: Awaitable[Any], loop: Loop | None = None) -> Future:
    if isinstance(awaitable, Future):
        return awaitable
    return (loop or get_running_loop()).create_task(_as_coro(awaitable))


def gather(
    *awaitables: Awaitable[Any], return_exceptions: bool = False, loop: Loop | None = None
) -> Future:
    """A future of every result in order (exceptions among them when
    ``return_exceptions``; else the first exception)."""
    loop = loop or get_running_loop()
    children = [ensure_future(a, loop) for a in awaitables]
    outer = _Gathering(loop, children)
    if not children:
        outer.set_result([])
        return outer
    left = [len(children)]

    def one_done(child: Future) -> None:
        if outer.done():
            if not child.cancelled():
                child.exception()  # seen: the outer future already reported
            return
        if not return_exceptions:
            if child.cancelled():
                outer.set_exception(CancelledError())
                return
            exc = child.exception()
            if exc is not None:
                outer.set_exception(exc)
                return
        left[0] -= 1
        if left[0] == 0:
            if outer.cancel_requested:  # as asyncio: the awaiting task is cancelled
                Future.cancel(outer)
            else:
                outer.set_result([_outcome(c) for c in children])

    for child in children:
        child.add_done_callback(one_done)
    return outer


def _outcome(future: Future) -> object:
    if future.cancelled():
        return CancelledError()
    return future.exception() or future.result()


class _Gathering(Future):
    __slots__ = ("_children", "cancel_requested")

    def __init__(self, loop: Loop, children: list[Future]) -> None:
        super().__init__(loop)
        self._children = children
        self.cancel_requested = False

    def cancel(self, msg: object = None) -> bool:
        if self.done():
            return False
        cancelled = False
        for child in self._children:
            if child.cancel():
                cancelled = True
        if cancelled:
            self.cancel_requested = True
        return cancelled


async def wait(
    awaitables: Iterable[Awaitable[Any]], return_when: str = ALL_COMPLETED
) -> tuple[set[Future], set[Future]]:
    """(done, pending) once one (FIRST_COMPLETED) or all of them are done."""
    loop = get_running_loop()
    futures = {ensure_future(a, loop) for a in awaitables}
    if not futures:
        raise ValueError("wait() needs at least one awaitable")
    waiter = loop.create_future()
    left = [len(futures)]

    def one_done(_f: Future) -> None:
        left[0] -= 1
        if return_when == FIRST_COMPLETED or left[0] == 0:
            _set_if_pending(waiter, None)

    for future in futures:
        future.add_done_callback(one_done)
    try:
        if return_when == FIRST_COMPLETED:
            ready = any(f.done() for f in futures)
        else:
            ready = all(f.done() for f in futures)
        if not ready:
            await waiter
    finally:
        for future in futures:
            future.remove_done_callback(one_done)
    done = {f for f in futures if f.done()}
    return done, futures - done


class Event:
    def __init__(self) -> None:
        self._set = False
        self._waiters: list[Future] = []

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            _set_if_pending(waiter, True)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> bool:
        if self._set:
            return True
        waiter = get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter  # type: ignore[no-any-return]
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
