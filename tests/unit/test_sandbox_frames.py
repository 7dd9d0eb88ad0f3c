"""What the host's reader takes from the agent's channel, which a command may write
on (a microVM guest's root takes the agent's descriptor over): every frame is
bounded by what the agent sends for the request pending under its id, and one
past that is malformed before more of it is read.  Found by attacking corral: a
"done" frame announcing 4 GiB was read whole (8 GiB held at its copy) by a
Sandbox whose policy said 256 MiB.  Pure: a socket pair, no sandbox started."""

from __future__ import annotations

import json
import socket
import struct
import threading

import pytest

from corral import sandbox
from corral.sandbox import FRAME_BOUNDS, MAX_HEADER, Sandbox


def reader() -> Sandbox:
    sb = Sandbox.__new__(Sandbox)  # (only what _recv reads: nothing is started)
    sb._bounds = {}
    return sb


def frame(header: dict[str, object], payload: bytes = b"", announce: int | None = None) -> bytes:
    data = json.dumps(header).encode()
    size = len(payload) if announce is None else announce
    return struct.pack("!II", len(data), size) + data + payload


def received(sb: Sandbox, data: bytes) -> tuple[dict[str, object], bytes]:
    """_recv of ``data`` written by a thread (a frame larger than the socket's buffer)."""
    ours, theirs = socket.socketpair()
    ours.settimeout(10)  # (a reader waiting for bytes never sent fails, not hangs)

    def write() -> None:
        try:
            theirs.sendall(data)
        except OSError:
            pass  # the reader gave up on the frame and closed

    writer = threading.Thread(target=write)
    writer.start()
    try:
        return sb._recv(ours)
    finally:
        ours.close()
        writer.join()
        theirs.close()


@pytest.mark.parametrize(
    "data",
    [
        frame({"ev": "done", "id": 7}, announce=0xFFFFFFFF),  # 4 GiB, no request 7 pending
        frame({"ev": "out", "id": 3, "fd": 1}, announce=(1 << 16) + 1),
        struct.pack("!II", MAX_HEADER + 1, 0) + b"{",  # a header past 1 MiB announced
    ],
)
def test_a_frame_past_what_the_agent_sends_is_malformed_unread(data: bytes) -> None:
    with pytest.raises(sandbox._Malformed):
        received(reader(), data)


def test_a_pending_read_or_listing_takes_its_own_bounds_and_no_more() -> None:
    sb = reader()
    sb._bounds[5] = FRAME_BOUNDS["read"]
    content = b"x" * (2 << 20)  # a file's content: past an output frame's bound
    done = {"ev": "done", "id": 5}
    assert received(sb, frame(done, content)) == (done, content)
    with pytest.raises(sandbox._Malformed):
        received(sb, frame({"ev": "done", "id": 5}, announce=(256 << 20) + 1))
    with pytest.raises(sandbox._Malformed):  # another id gets no more than before
        received(sb, frame({"ev": "done", "id": 6}, announce=len(content)))
    sb._bounds[8] = FRAME_BOUNDS["list"]
    entries = [{"name": f"f{i:07d}", "type": "file"} for i in range(60_000)]  # ~2 MiB
    header, _ = received(sb, frame({"ev": "done", "id": 8, "entries": entries}))
    assert len(header["entries"]) == 60_000  # type: ignore[arg-type]
    with pytest.raises(sandbox._Malformed):  # a big header for another request: refused
        received(sb, frame({"ev": "done", "id": 9, "entries": entries}))
