"""Many byte streams over one virtio-serial port: how the guest reaches the door.

The guest has no network device at all.  Its relay connects to a unix socket
inside the guest (:mod:`corral.vm.guestdoor`); each such connection becomes a
*stream* on the door port, and on the host each stream becomes one connection
to the run's door (the proxy's unix socket).  Both ends run this module
(standard library only: the guest copy comes from the initramfs).

A frame is a header ``!BIH`` (kind, stream id, payload length) and the payload:

* ``OPEN`` (guest to host): a new stream; the host answers ``CLOSE`` when it
  cannot reach the door, so a dead proxy means a closed connection, no network;
* ``DATA``: bytes for the stream's socket; ``ACK``: the receiver has written
  that many bytes out (4-byte count).  A sender keeps at most :data:`WINDOW`
  bytes unacknowledged per stream, so one stalled reader never stops the others
  and memory stays bounded;
* ``EOF``: the sender's side has no more bytes (half close); ``CLOSE``: the
  stream is gone both ways.

Each stream has two threads per end: one reads its socket into frames, one
writes received frames into its socket.

The host end trusts nothing the guest sends (the guest's root can write any
frame on the port): it keeps at most :data:`MAX_STREAMS` streams open (an OPEN
past that, or for a stream already open, is answered CLOSE), and a stream
whose peer sends more than :data:`WINDOW` bytes it has not had acknowledged,
or data after its own EOF, is ended; received bytes wait in one buffer per
stream, so a frame costs the host its bytes alone and what it holds for a
guest stays bounded.
"""

from __future__ import annotations

import os
import socket
import struct
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

OPEN, DATA, EOF, CLOSE, ACK = 1, 2, 3, 4, 5
HEADER = struct.Struct("!BIH")
MAX_PAYLOAD = 65535
WINDOW = 256 * 1024
MAX_STREAMS = 512  # open at once per port: connections a guest holds through the door


class _Stream:
    def __init__(self, mux: Mux, sid: int, sock: socket.socket) -> None:
        self.mux = mux
        self.sid = sid
        self.sock = sock
        self.lock = threading.Condition()
        self.credit = WINDOW  # bytes we may still send before an ACK
        # received bytes to write to the socket, one buffer: frames (even empty ones)
        # cost nothing beyond their bytes, which the window bounds
        self.inbox = bytearray()
        self.eof = False  # the peer's EOF: written out once the inbox is
        self.done = False  # CLOSE sent or received: everything stops
        self.halves = 0  # directions finished (2: the stream is over)

    def start(self) -> None:
        for target in (self._read_socket, self._write_socket):
            threading.Thread(target=target, daemon=True).start()

    def _read_socket(self) -> None:
        """Socket -> DATA frames, within the credit the peer gave."""
        while True:
            with self.lock:
                while self.credit <= 0 and not self.done:
                    self.lock.wait()
                if self.done:
                    return
                size = min(self.credit, MAX_PAYLOAD)
            try:
                data = self.sock.recv(size)
            except OSError:
                self.abort(tell=True)
                return
            if not data:
                self.mux.send(EOF, self.sid)
                self._half_done()
                return
            with self.lock:
                self.credit -= len(data)
            self.mux.send(DATA, self.sid, data)

    def _write_socket(self) -> None:
        """Received DATA -> the socket, acknowledged once written."""
        while True:
            with self.lock:
                while not self.inbox and not self.eof and not self.done:
                    self.lock.wait()
                if self.done:
                    return
                data = bytes(self.inbox)
            try:
                if not data:  # the peer's EOF, after all it sent
                    self.sock.shutdown(socket.SHUT_WR)
                    self._half_done()
                    return
                self.sock.sendall(data)
            except OSError:
                self.abort(tell=True)
                return
            with self.lock:  # taken out once written: until then the window counts it
                del self.inbox[: len(data)]
            self.mux.send(ACK, self.sid, struct.pack("!I", len(data)))

    def _half_done(self) -> None:
        with self.lock:
            self.halves += 1
            over = self.halves == 2
        if over:
            self.mux.forget(self.sid)
            self.sock.close()

    def received(self, kind: int, payload: bytes) -> None:
        with self.lock:
            # a peer that ignores the window, or sends after its own EOF: ended below,
            # nothing kept
            overrun = kind == DATA and (self.eof or len(self.inbox) + len(payload) > WINDOW)
            if overrun:
                pass
            elif kind == DATA:
                self.inbox += payload
            elif kind == EOF:
                self.eof = True
            elif kind == ACK and len(payload) == 4:
                self.credit += struct.unpack("!I", payload)[0]
            self.lock.notify_all()
        if overrun:
            self.abort(tell=True)

    def abort(self, tell: bool = False) -> None:
        with self.lock:
            if self.done:
                return
            self.done = True
            self.lock.notify_all()
        if tell:
            self.mux.send(CLOSE, self.sid)
        self.mux.forget(self.sid)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class Mux:
    """One end of the door port.  ``fd``: the port (a socket on the host, the
    character device in the guest), owned from now on: :meth:`serve` closes it
    when it returns, never earlier, so no thread here can touch a number the
    process has reused (give it a ``dup``; shutting the socket down ends it).
    ``opener`` (the host end): makes the socket a new stream leads to, or returns
    None when it cannot (the stream is refused).
    """

    def __init__(self, fd: int, opener: Callable[[], socket.socket | None] | None = None) -> None:
        self.fd = fd
        self.opener = opener
        self.wlock = threading.Lock()
        self.slock = threading.Lock()
        self.streams: dict[int, _Stream] = {}
        self.next_sid = 1
        self.closed = False

    def send(self, kind: int, sid: int, payload: bytes = b"") -> None:
        frame = HEADER.pack(kind, sid, len(payload)) + payload
        with self.wlock:
            if self.closed:
                return
            view = memoryview(frame)
            try:
                while view:
                    view = view[os.write(self.fd, view) :]
            except OSError:
                pass  # the port is gone: serve() sees it too and ends everything

    def forget(self, sid: int) -> None:
        with self.slock:
            self.streams.pop(sid, None)

    def attach(self, sock: socket.socket) -> None:
        """The guest end: ``sock`` (an accepted connection) becomes a new stream."""
        with self.slock:
            sid = self.next_sid
            self.next_sid += 1
            stream = _Stream(self, sid, sock)
            self.streams[sid] = stream
        self.send(OPEN, sid)
        stream.start()

    def _read_exactly(self, size: int) -> bytes | None:
        data = b""
        while len(data) < size:
            try:
                chunk = os.read(self.fd, size - len(data))
            except InterruptedError:
                continue
            except OSError:
                return None
            if not chunk:
                return None
            data += chunk
        return data

    def serve(self) -> None:
        """Read frames until the port closes; then every stream is closed."""
        while True:
            head = self._read_exactly(HEADER.size)
            if head is None:
                break
            kind, sid, length = HEADER.unpack(head)
            payload = self._read_exactly(length) if length else b""
            if payload is None:
                break
            self._dispatch(kind, sid, payload)
        with self.slock:
            streams = list(self.streams.values())
        for stream in streams:
            stream.abort()
        with self.wlock:
            self.closed = True
            os.close(self.fd)

    def _dispatch(self, kind: int, sid: int, payload: bytes) -> None:
        if kind == OPEN:
            self._opened(sid)
            return
        with self.slock:
            stream = self.streams.get(sid)
        if stream is None:
            return  # a stream already closed on this side: late frames are dropped
        if kind == CLOSE:
            stream.abort()
        else:
            stream.received(kind, payload)

    def _opened(self, sid: int) -> None:
        with self.slock:
            existing = self.streams.get(sid)
            full = len(self.streams) >= MAX_STREAMS
        if existing is not None:  # a second OPEN for an open stream ends it
            existing.abort(tell=True)
            return
        if full:
            self.send(CLOSE, sid)
            return
        sock = None
        if self.opener is not None:
            try:
                sock = self.opener()
            except OSError:
                sock = None
        if sock is None:
            self.send(CLOSE, sid)  # no door: this connection simply ends
            return
        stream = _Stream(self, sid, sock)
        with self.slock:
            self.streams[sid] = stream
        stream.start()


def unix_opener(path: str) -> Callable[[], socket.socket | None]:
    """The host end's opener: a new connection to the door's unix socket."""

    def open_door() -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            return None
        return sock

    return open_door
