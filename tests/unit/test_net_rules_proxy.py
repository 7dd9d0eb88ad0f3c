"""Rules in the real proxy, in-process (no sandbox): a proxy that cannot intercept
TLS (``corral proxy serve``) refuses an opaque tunnel to a host whose requests a
rule must see, and still tunnels to every other host."""

from __future__ import annotations

from pathlib import Path

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
