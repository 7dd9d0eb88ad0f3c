"""Rules in the real proxy, in-process (no sandbox): a proxy that cannot intercept
TLS (``corral proxy serve``) refuses an opaque tunnel to a host whose requests a
rule must see, and still tunnels to every other host."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from test_net_proxy_unit import RUN_ID, Origin, read_response, run

from corral.net.audit import Audit
from corral.net.hooks import Chain, HostRulesHook
from corral.net.httprules import HttpRulesHook
from corral.net.proxy import Proxy
from corral.net.rules import HostRules


def test_opaque_tunnel_to_a_ruled_host_is_refused_and_others_pass(tmp_path: Path) -> None:
    async def go() -> None:
        from corral.net import aio

        ruled, free = await Origin().start(), await Origin().start()
        entries: list[dict[str, object]] = [
            {"host": f"127.0.0.1:{ruled.port}", "methods": ["GET"], "action": "allow"}
        ]
        chain = Chain(
            [HostRulesHook(HostRules.parse(["127.0.0.1"], [])), HttpRulesHook.from_policy(entries)]
        )
        audit = Audit(str(tmp_path / "net.jsonl"))
        server = await Proxy(chain, audit).serve_tcp("127.0.0.1", 0, RUN_ID)
        port = server.sockets[0].getsockname()[1]
        try:
            for origin, expected in ((ruled, 403), (free, 200)):
                reader, writer = await aio.open_connection("127.0.0.1", port)
                writer.write(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % origin.port)
                line = await reader.readuntil(b"\r\n")
                assert int(line.split()[1]) == expected, line
                if expected == 200:
                    await reader.readuntil(b"\r\n")
                    writer.write(b"DELETE /x HTTP/1.1\r\nHost: o\r\n\r\n")
                    assert (await read_response(reader)).status == 200
                writer.close()
            assert ruled.requests == [] and [r.method for r in free.requests] == [b"DELETE"]
        finally:
            server.close()
            ruled.close()
            free.close()
            audit.close()

    run(go)


class RuledWorld:
    """An origin, and a plain proxy whose ``[[network.rules]]`` name it (``{port}``)."""

    def __init__(self, origin: Origin, port: int, audit_path: Path) -> None:
        self.origin = origin
        self.port = port
        self.audit_path = audit_path

    def url(self, target: str) -> bytes:
        return f"http://127.0.0.1:{self.origin.port}{target}".encode()

    async def send(self, raw: bytes) -> bytes:
        """``raw`` on a fresh connection; everything the proxy answered until it closed
        or went quiet."""
        from corral.net import aio

        reader, writer = await aio.open_connection("127.0.0.1", self.port)
        writer.write(raw)
        out = b""
        try:
            while data := await aio.wait_for(reader.read(65536), 0.5):
                out += data
        except TimeoutError:
            pass
        writer.close()
        return out

    def audit(self) -> list[dict[str, Any]]:
        if not self.audit_path.exists():
            return []
        return [json.loads(x) for x in self.audit_path.read_text().splitlines()]


@asynccontextmanager
async def ruled(tmp_path: Path, entries: list[dict[str, object]]) -> AsyncIterator[RuledWorld]:
    origin = await Origin().start()
    entries = [{**e, "host": str(e["host"]).format(port=origin.port)} for e in entries]
    chain = Chain(
        [HostRulesHook(HostRules.parse(["127.0.0.1"], [])), HttpRulesHook.from_policy(entries)]
    )
    audit = Audit(str(tmp_path / "net.jsonl"))
    server = await Proxy(chain, audit).serve_tcp("127.0.0.1", 0, RUN_ID)
    try:
        yield RuledWorld(origin, server.sockets[0].getsockname()[1], tmp_path / "net.jsonl")
    finally:
        server.close()
        origin.close()
        audit.close()


PUBLIC_NOT_SECRET: list[dict[str, object]] = [
    {"host": "127.0.0.1:{port}", "paths": ["/public/**"], "action": "allow"},
    {"host": "127.0.0.1:{port}", "paths": ["/public/secret/**"], "action": "deny"},
]


@pytest.mark.parametrize(
    "target",
    [
        "/secret/../public/x",  # a router matching /secret/ on the path as sent serves it
        "/public/secret/%2e%2e/x",
        "/secret%2F..%2Fpublic/x",
        "/public/secret/x/../../y",
        "/public/./secret/x",
    ],
)
def test_a_dot_segment_to_a_ruled_host_never_reaches_the_origin(
    tmp_path: Path, target: str
) -> None:
    """The rules used to decide on the path with dot segments resolved, but the
    origin got the target as sent: Node, Express, uvicorn/Starlette and Werkzeug
    route ``/secret/../public/x`` under ``/secret``.  Twin: the plain path passes."""

    async def go() -> None:
        async with ruled(tmp_path, PUBLIC_NOT_SECRET) as w:
            answer = await w.send(b"GET " + w.url(target) + b" HTTP/1.1\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 403"), answer
            assert b'"rule":"bad-path"' in answer.replace(b" ", b"")
            twin = await w.send(b"GET " + w.url("/public/x") + b" HTTP/1.1\r\n\r\n")
            assert twin.startswith(b"HTTP/1.1 200"), twin
            assert w.origin.paths == ["/public/x"]

    run(go)
