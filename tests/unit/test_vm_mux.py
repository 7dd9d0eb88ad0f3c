"""The door port's multiplexer with real sockets on both ends (no VM): streams
carry bytes both ways, half-closes pass through, a stalled reader stalls only
its own stream, and a door that cannot be reached closes the connection."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.vm import mux


class Echo:
    """A unix-socket server standing in for the door: echoes, or holds its data."""

    def __init__(self, path: str, hold: threading.Event | None = None) -> None:
        self.path = path
        self.hold = hold
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(64)
        self.accepted = 0
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                first = conn.recv(1)
                if first == b"H" and self.hold is not None:  # a far end that stops reading
                    self.hold.wait()
                data = first
                while data:
                    conn.sendall(data)
                    data = conn.recv(65536)
                conn.shutdown(socket.SHUT_WR)  # echo the half-close
            except OSError:
                pass  # the test is over

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def link(tmp_path: Path) -> Iterator[tuple[mux.Mux, str]]:
    """A guest end and a host end joined by a socket pair (the port), the host end
    opening connections to ``door.sock``."""
    guest_side, host_side = socket.socketpair()
    door = str(tmp_path / "door.sock")
    host = mux.Mux(os.dup(host_side.fileno()), mux.unix_opener(door))
    guest = mux.Mux(os.dup(guest_side.fileno()))
    ended = []
    for end in (host, guest):
        done = threading.Event()
        ended.append(done)
        threading.Thread(target=lambda e=end, d=done: (e.serve(), d.set()), daemon=True).start()
    yield guest, door
    for side in (guest_side, host_side):
        side.shutdown(socket.SHUT_RDWR)
        side.close()
    assert all(done.wait(10) for done in ended)  # each end closed its own descriptor


def connect(guest: mux.Mux) -> socket.socket:
    """What the relay does in the guest: a connection that becomes a stream."""
    ours, theirs = socket.socketpair()
    guest.attach(theirs)
    ours.settimeout(20)
    return ours


def send_quietly(sock: socket.socket, data: bytes, end: bool = False) -> None:
    try:
        sock.sendall(data)
        if end:
            sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the stream was closed when the test ended


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_streams_carry_bytes_both_ways_and_half_close(link: tuple[mux.Mux, str]) -> None:
    guest, door = link
    echo = Echo(door)
    payloads = [os.urandom(n) for n in (1, 1000, 3 * mux.WINDOW + 17)]
    conns = [connect(guest) for _ in payloads]
    for conn, data in zip(conns, payloads, strict=True):
        threading.Thread(target=send_quietly, args=(conn, data, True), daemon=True).start()
    for conn, data in zip(conns, payloads, strict=True):
        assert read_all(conn) == data  # all of it back, then end of file
        conn.close()
    assert echo.accepted == 3  # one door connection per stream
    echo.close()


def test_a_stalled_stream_does_not_stall_the_others(link: tuple[mux.Mux, str]) -> None:
    guest, door = link
    hold = threading.Event()
    echo = Echo(door, hold)
    stalled = connect(guest)
    # more than the window: the far end does not read, so the sender must wait
    threading.Thread(
        target=send_quietly, args=(stalled, b"H" + b"x" * (4 * mux.WINDOW)), daemon=True
    ).start()
    time.sleep(0.3)
    other = connect(guest)
    other.sendall(b"hello")
    other.shutdown(socket.SHUT_WR)
    assert read_all(other) == b"hello"
    other.close()
    hold.set()
    stalled.settimeout(20)
    assert len(stalled.recv(65536)) > 0
    stalled.close()
    echo.close()


def test_no_door_means_the_connection_just_closes(link: tuple[mux.Mux, str]) -> None:
    guest, door = link
    conn = connect(guest)  # nothing listens on the door: the proxy is gone
    try:
        conn.sendall(b"GET / HTTP/1.1\r\n\r\n")
        answer = read_all(conn)
    except (BrokenPipeError, ConnectionResetError):
        answer = b""  # closed before the request was even written
    assert answer == b""
    conn.close()
    echo = Echo(door)  # and the allow twin: with the door back, the same works
    conn = connect(guest)
    conn.sendall(b"ping")
    conn.shutdown(socket.SHUT_WR)
    assert read_all(conn) == b"ping"
    conn.close()
    echo.close()


def test_the_port_closing_ends_every_stream(tmp_path: Path) -> None:
    guest_side, host_side = socket.socketpair()
    guest = mux.Mux(os.dup(guest_side.fileno()))
    done = threading.Event()

    def serve() -> None:
        guest.serve()
        done.set()

    threading.Thread(target=serve, daemon=True).start()
    conn = connect(guest)
    host_side.close()  # QEMU is gone
    assert done.wait(10)
    assert read_all(conn) == b""
    conn.close()
    guest_side.close()
    del tmp_path


# --- a hostile guest: the guest's root can write any frame on the port -------------


class Door:
    """A door that accepts every connection and never reads: counts them."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(1024)
        self.held: list[socket.socket] = []
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return


def hostile_link(tmp_path: Path) -> tuple[socket.socket, mux.Mux, threading.Event]:
    """The host end of the port, and the raw guest side of it (frames by hand)."""
    guest_side, host_side = socket.socketpair()
    host = mux.Mux(os.dup(host_side.fileno()), mux.unix_opener(str(tmp_path / "door.sock")))
    host_side.close()
    done = threading.Event()

    def serve() -> None:
        host.serve()
        done.set()

    threading.Thread(target=serve, daemon=True).start()
    return guest_side, host, done


def frames(sock: socket.socket, until: float) -> list[tuple[int, int]]:
    """(kind, stream) of every frame the host sends before ``until`` seconds pass."""
    got, buf = [], b""
    sock.settimeout(0.2)
    end = time.monotonic() + until
    while time.monotonic() < end:
        try:
            buf += sock.recv(65536)
        except TimeoutError:
            continue
        while len(buf) >= mux.HEADER.size:
            kind, sid, length = mux.HEADER.unpack(buf[: mux.HEADER.size])
            if len(buf) < mux.HEADER.size + length:
                break
            got.append((kind, sid))
            buf = buf[mux.HEADER.size + length :]
    return got


def test_a_guest_cannot_open_streams_without_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each stream is a door connection and two threads on the host: past
    MAX_STREAMS an OPEN is answered CLOSE and no connection is made."""
    monkeypatch.setattr(mux, "MAX_STREAMS", 8)
    door = Door(str(tmp_path / "door.sock"))
    guest, host, done = hostile_link(tmp_path)
    guest.sendall(b"".join(mux.HEADER.pack(mux.OPEN, sid, 0) for sid in range(1, 21)))
    got = frames(guest, 2.0)
    assert sorted(sid for kind, sid in got if kind == mux.CLOSE) == list(range(9, 21))
    assert len(door.held) == 8 and len(host.streams) == 8  # the twin: 8 were opened
    guest.sendall(mux.HEADER.pack(mux.OPEN, 3, 0))  # a second OPEN for an open stream
    assert (mux.CLOSE, 3) in frames(guest, 1.0) and len(host.streams) == 7
    guest.close()
    assert done.wait(10)


def test_data_past_the_window_ends_the_stream(tmp_path: Path) -> None:
    """A peer that ignores the window (sends without waiting for ACKs) to a door
    that does not read: the host keeps at most WINDOW bytes, then ends the stream."""
    Door(str(tmp_path / "door.sock"))
    guest, host, done = hostile_link(tmp_path)
    chunk = b"x" * mux.MAX_PAYLOAD
    guest.sendall(mux.HEADER.pack(mux.OPEN, 1, 0) + mux.HEADER.pack(mux.OPEN, 2, 0))
    within = mux.HEADER.pack(mux.DATA, 2, 1000) + b"y" * 1000  # the twin: stays open
    flood = mux.HEADER.pack(mux.DATA, 1, len(chunk)) + chunk
    guest.sendall(within)
    for _ in range(3 * mux.WINDOW // len(chunk)):
        guest.sendall(flood)
    got = frames(guest, 2.0)
    assert (mux.CLOSE, 1) in got and (mux.CLOSE, 2) not in got
    assert list(host.streams) == [2]
    guest.close()
    assert done.wait(10)


def test_frames_without_bytes_hold_nothing_on_the_host(tmp_path: Path) -> None:
    """The window counts bytes, so frames that carry none (empty DATA, DATA after the
    peer's own EOF, which nothing writes out) must not pile up on the host: they
    are taken as nothing, or end the stream.  Twin: a stream that half-closes
    as a peer should stays open, and its bytes reach the door."""
    door = Door(str(tmp_path / "door.sock"))
    guest, host, done = hostile_link(tmp_path)
    guest.sendall(mux.HEADER.pack(mux.OPEN, 1, 0) + mux.HEADER.pack(mux.OPEN, 2, 0))
    guest.sendall(mux.HEADER.pack(mux.DATA, 2, 5) + b"hello" + mux.HEADER.pack(mux.EOF, 2, 0))
    empty = mux.HEADER.pack(mux.DATA, 1, 0)
    for _ in range(50):
        guest.sendall(empty * 2000)  # 100,000 frames of nothing: all taken as nothing
    guest.sendall(mux.HEADER.pack(mux.EOF, 1, 0) + (mux.HEADER.pack(mux.DATA, 1, 1) + b"z") * 1000)
    got = frames(guest, 2.0)
    assert (mux.CLOSE, 1) in got and 1 not in host.streams  # data after its EOF ended it
    assert (mux.CLOSE, 2) not in got and list(host.streams) == [2]
    assert wait_until(lambda: len(door.held) == 2)
    door.held[1].settimeout(5)
    assert door.held[1].recv(100) == b"hello" and door.held[1].recv(100) == b""  # and EOF
    guest.close()
    assert done.wait(10)


def wait_until(check: Callable[[], bool], seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.01)
    return check()
