"""The model client's answer is bounded in size and in time (corral.brain.ChatBrain
against a raw HTTP server on 127.0.0.1 that answers as a hostile one did: an
endless body, a gzip bomb, a byte at a time).  The twins: a normal answer, plain
or gzip-encoded, is read, and the client asks for an unencoded one."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import Awaitable, Callable

import pytest

from corral.brain import BrainError, ChatBrain

ANSWER = json.dumps(
    {"choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}
).encode()

Body = Callable[[asyncio.StreamWriter], Awaitable[None]]


async def serve(body: Body, heard: list[bytes]) -> tuple[asyncio.Server, str]:
    """A server answering every request with ``body`` (which writes status and headers too)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        heard.append(head)
        size = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )  # fmt: skip
        await reader.readexactly(size)
        try:
            await body(writer)
            await writer.drain()
            writer.close()
        except (ConnectionError, asyncio.CancelledError):
            pass

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


def head(extra: str = "", length: int | None = None) -> bytes:
    size = f"Content-Length: {length}\r\n" if length is not None else ""
    return f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{extra}{size}\r\n".encode()


async def ask(body: Body, **kw: float) -> tuple[str, float, list[bytes]]:
    """What one turn gives (the reply's content, or the BrainError), and its seconds."""
    heard: list[bytes] = []
    server, url = await serve(body, heard)
    brain = ChatBrain(url, "m", **kw)  # type: ignore[arg-type]
    began = time.monotonic()
    try:
        reply = await brain.turn([{"role": "user", "content": "x"}], [])
        got = str(reply.content)
    except BrainError as exc:
        got = f"error: {exc.message}"
    finally:
        await brain.close()
        server.close()
    return got, time.monotonic() - began, heard


async def endless(w: asyncio.StreamWriter) -> None:
    w.write(head())  # no length: the body runs until the connection closes
    w.write(b'{"choices": [{"message": {"content": "')
    while True:
        w.write(b"x" * 65536)
        await w.drain()


async def bomb(w: asyncio.StreamWriter) -> None:
    packed = gzip.compress(b" " * (20 << 20))  # 20 MiB of blanks: about 20 KB packed
    w.write(head("Content-Encoding: gzip\r\n", len(packed)) + packed)


async def drip(w: asyncio.StreamWriter) -> None:
    w.write(head(length=len(ANSWER)))
    for byte in ANSWER:
        w.write(bytes([byte]))
        await w.drain()
        await asyncio.sleep(0.2)


async def plain(w: asyncio.StreamWriter) -> None:
    w.write(head(length=len(ANSWER)) + ANSWER)


async def packed(w: asyncio.StreamWriter) -> None:
    data = gzip.compress(ANSWER)
    w.write(head("Content-Encoding: gzip\r\n", len(data)) + data)


def test_an_endless_answer_stops_at_the_cap() -> None:
    got, seconds, _ = asyncio.run(ask(endless, max_response=1 << 20))
    assert got.startswith("error: model server http://127.0.0.1:")
    assert got.endswith("answered more than 1048576 bytes: not read")
    assert seconds < 5


def test_a_gzip_bomb_stops_at_the_cap_decoded() -> None:
    got, _, _ = asyncio.run(ask(bomb, max_response=1 << 20))
    assert got.endswith("answered more than 1048576 bytes: not read")


def test_a_dripping_answer_stops_at_the_deadline() -> None:
    got, seconds, _ = asyncio.run(ask(drip, deadline=1.0, timeout=5.0))
    assert got.endswith("/v1/chat/completions did not answer within 1s")
    assert seconds < 2


@pytest.mark.parametrize("body", [plain, packed])
def test_a_normal_answer_is_read_plain_or_gzip(body: Body) -> None:
    got, _, heard = asyncio.run(ask(body, max_response=1 << 20, deadline=5.0))
    assert got == "hi"
    assert b"accept-encoding: identity" in heard[0].lower()
