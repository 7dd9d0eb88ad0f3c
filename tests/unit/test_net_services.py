"""Host services at their own address, the sandbox's resolver and the listeners' handoff.

The real ``Proxy`` in-process against real origins on 127.0.0.1 (as in
test_net_proxy_unit.py); the real door with its proxy process, handed real
listeners exactly as the launcher hands them (here made on the host's own
loopback, port 0: what is tested is the handoff and the serving, the namespace
is the integration tests' part).  Each deny has an allow twin; no name is
ever sent to a DNS server (refused, or pinned, or answered by a table).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from test_net_proxy_unit import Origin, read_response, run

from corral import netns
from corral.net import aio, dns
from corral.net.audit import Audit
from corral.net.door import Door
from corral.net.hooks import Chain, HostRulesHook
from corral.net.proxy import Proxy
from corral.net.rules import HostRules
from corral.netns import Listener
from corral.policy import Policy
from tests.procs import alive

RUN_ID = "run-svc"


def make_proxy(tmp_path: Path, allow: list[str], **kw: Any) -> Proxy:
    audit = Audit(str(tmp_path / "net.jsonl"))
    return Proxy(Chain([HostRulesHook(HostRules.parse(allow, []))]), audit, **kw)


def audit_lines(proxy: Proxy, tmp_path: Path) -> list[dict[str, Any]]:
    proxy.audit.flush()
    path = tmp_path / "net.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def query(name: bytes, qtype: int = dns.TYPE_A, ident: int = 7) -> bytes:
    labels = b"".join(bytes([len(label)]) + label for label in name.split(b"."))
    return (
        struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0)
        + labels
        + b"\x00"
        + qtype.to_bytes(2, "big")
        + b"\x00\x01"
    )


def answers(reply: bytes) -> tuple[int, list[str]]:
    """rcode and the addresses of the answer records."""
    rcode = reply[3] & 0x0F
    count = struct.unpack("!H", reply[6:8])[0]
    at = 12
    while reply[at]:
        at += 1 + reply[at]
    at += 5  # the root label, qtype, qclass
    found = []
    for _ in range(count):
        rtype, _, _, size = struct.unpack("!HHIH", reply[at + 2 : at + 12])
        data = reply[at + 12 : at + 12 + size]
        family = socket.AF_INET if rtype == dns.TYPE_A else socket.AF_INET6
        found.append(socket.inet_ntop(family, data))
        at += 12 + size
    return rcode, found


async def closed(reader: aio.StreamReader) -> bool:
    """The proxy closed the connection without a word (a reset, with bytes unread)."""
    try:
        return await reader.read() == b""
    except ConnectionResetError:
        return True


# -- a listener at a host service's own address -------------------------------------------


def test_a_service_listener_is_a_connect_to_its_own_address_and_its_deny_twin(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        ok, other = await Origin().start(), await Origin().start()
        proxy = make_proxy(tmp_path, [f"127.0.0.1:{ok.port}"])
        servers = []
        try:
            for origin in (ok, other):
                sock = socket.create_server(("127.0.0.1", 0))
                servers.append(
                    (await proxy.serve_service(sock, RUN_ID, "127.0.0.1", origin.port), sock)
                )
            ports = [sock.getsockname()[1] for _, sock in servers]
            reader, writer = await aio.open_connection("127.0.0.1", ports[0])
            writer.write(b"GET /own HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await read_response(reader)).status == 200  # bytes spliced both ways
            writer.close()
            reader, writer = await aio.open_connection("127.0.0.1", ports[1])
            writer.write(b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")
            assert await closed(reader)  # refused: closed, nothing to say
            assert ok.paths == ["/own"] and other.accepts == 0
            for _ in range(100):
                lines = audit_lines(proxy, tmp_path)
                if len(lines) == 2:
                    break
                await aio.sleep(0.01)
            by_port = {e["port"]: e for e in lines}
            assert by_port[ok.port]["scheme"] == "service"
            assert by_port[ok.port]["decision"] == "allow"
            assert by_port[other.port]["decision"] == "deny"
            assert by_port[other.port]["rule"] == "default"
            assert by_port[other.port]["reason"] == "address not in the allow list"
        finally:
            for server, _ in servers:
                server.close()
            ok.close()
            other.close()

    run(go)


def test_a_service_connection_is_waited_for_when_the_run_ends(tmp_path: Path) -> None:
    """The proxy settles before it stops (the run's end closed every client): a
    connection at a host service's own address is waited for like any other, so
    its audit line, written as it ends, is there (it went missing now and then:
    test_other_loopback_traffic_stays_local).  The twin: nothing open, nothing
    waited for."""

    async def go() -> None:
        ok = await Origin().start()
        proxy = make_proxy(tmp_path, [f"127.0.0.1:{ok.port}"])
        sock = socket.create_server(("127.0.0.1", 0))
        server = await proxy.serve_service(sock, RUN_ID, "127.0.0.1", ok.port)
        try:
            reader, writer = await aio.open_connection("127.0.0.1", sock.getsockname()[1])
            writer.write(b"GET /own HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await read_response(reader)).status == 200
            writer.close()  # the sandbox is gone: its sockets closed
            await proxy.settle(1.0)  # what a worker does as it stops
            lines = audit_lines(proxy, tmp_path)
            assert [(e["scheme"], e["port"]) for e in lines] == [("service", ok.port)]
            started = time.monotonic()
            await proxy.settle(1.0)  # the twin: nothing open
            assert time.monotonic() - started < 0.1
        finally:
            server.close()
            ok.close()

    run(go)


def test_the_relay_frames_on_a_unix_door(tmp_path: Path) -> None:
    """The relay marks each connection: a proxy connection (whose 0xfd is then just
    a byte, not a frame), a host service (decided as a CONNECT), a DNS query."""

    async def go() -> None:
        ok = await Origin().start()
        allow = [f"127.0.0.1:{ok.port}", "svc.test"]
        proxy = make_proxy(tmp_path, allow, pinned={"svc.test": "127.0.0.1"})
        path = str(tmp_path / "door.sock")
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(path)
        sock.listen(8)
        server = await proxy.serve_unix(sock, RUN_ID)
        try:

            async def door(data: bytes) -> tuple[aio.StreamReader, aio.StreamWriter]:
                reader, writer = await aio.open_unix_connection(path)
                writer.write(data)
                return reader, writer

            reader, _ = await door(b"\xfb\xfd\x00\x05hello")  # a client's own 0xfd: not HTTP
            assert (await read_response(reader)).status == 400
            reader, _ = await door(b"\xfbGET http://127.0.0.1:%d/plain HTTP/1.1\r\n\r\n" % ok.port)
            assert (await read_response(reader)).status == 200
            reader, _ = await door(b"\xfc127.0.0.1 %d\nGET /svc HTTP/1.1\r\n\r\n" % ok.port)
            assert await reader.readexactly(1) == b"\x00"  # connected: the relay may go on
            assert (await read_response(reader)).status == 200
            reader, _ = await door(b"\xfc127.0.0.1 9\nGET /no HTTP/1.1\r\n\r\n")  # deny twin
            assert await closed(reader)
            reader, _ = await door(b"\xfcnot-an-address 80\n")  # malformed: refused, audited
            assert await closed(reader)
            packet = query(b"svc.test")
            reader, _ = await door(b"\xfd" + struct.pack("!H", len(packet)) + packet)
            size = struct.unpack("!H", await reader.readexactly(2))[0]
            assert answers(await reader.readexactly(size)) == (0, ["127.0.0.1"])
            assert ok.paths == ["/plain", "/svc"]
            lines = audit_lines(proxy, tmp_path)
            assert any(e["rule"] == "bad-name" and e["scheme"] == "service" for e in lines)
        finally:
            server.close()
            ok.close()

    run(go)


# -- the sandbox's resolver ---------------------------------------------------------------


async def _ask(proxy: Proxy, name: bytes, qtype: int = dns.TYPE_A) -> tuple[int, list[str]]:
    return answers(await proxy.dns_reply(RUN_ID, query(name, qtype)))


def test_a_refused_name_is_nxdomain_and_one_audit_line_with_its_rule(tmp_path: Path) -> None:
    asked: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return {"pypi.org": ["127.0.0.9", "::9"]}[host]

    async def go() -> None:
        proxy = make_proxy(
            tmp_path, ["pypi.org", "svc.test"], pinned={"svc.test": "127.0.0.1"}, resolve=resolve
        )
        assert await _ask(proxy, b"blocked.test") == (dns.RCODE_NXDOMAIN, [])
        assert await _ask(proxy, b"pypi.org") == (0, ["127.0.0.9"])  # twin: answered
        assert await _ask(proxy, b"pypi.org", dns.TYPE_AAAA) == (0, ["::9"])
        assert await _ask(proxy, b"svc.test") == (0, ["127.0.0.1"])  # pinned: never asked
        assert await _ask(proxy, b"svc.test", dns.TYPE_AAAA) == (0, [])  # no such record
        assert await _ask(proxy, b"corral") == (0, ["127.0.0.1"])  # the sandbox's own name
        assert await _ask(proxy, b"corral", dns.TYPE_AAAA) == (0, ["::1"])
        assert asked == ["pypi.org", "pypi.org"]  # the refused name was never resolved
        lines = audit_lines(proxy, tmp_path)
        (refused,) = [e for e in lines if e["host"] == "blocked.test"]
        assert refused["scheme"] == "dns" and refused["method"] == "A"
        assert refused["decision"] == "deny" and refused["rule"] == "default"
        assert refused["reason"] == "host not in the allow list" and refused["status"] == 3
        allowed = [e for e in lines if e["host"] == "pypi.org"]
        assert {(e["method"], e["address"]) for e in allowed} == {
            ("A", "127.0.0.9"),
            ("AAAA", "::9"),
        }

    run(go)


def test_transparent_mode_answers_stand_ins(tmp_path: Path) -> None:
    async def go() -> None:
        proxy = make_proxy(tmp_path, ["pypi.org"], stand_ins=True)
        rcode, (address,) = await _ask(proxy, b"pypi.org")
        assert rcode == 0 and address.startswith("198.18.")
        assert proxy.pool(RUN_ID).name_for(address) == "pypi.org"
        assert await _ask(proxy, b"blocked.test") == (dns.RCODE_NXDOMAIN, [])

    run(go)


def test_the_resolver_socket_answers_over_udp(tmp_path: Path) -> None:
    async def go() -> None:
        proxy = make_proxy(tmp_path, ["svc.test"], pinned={"svc.test": "127.0.0.1"})
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        transport = await proxy.serve_dns(sock, RUN_ID)
        client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        client.setblocking(False)
        try:
            loop = aio.get_running_loop()
            for name, expected in ((b"svc.test", (0, ["127.0.0.1"])), (b"no.test", (3, []))):
                client.sendto(query(name), sock.getsockname())
                reply = await aio.wait_for(loop.sock_recv(client, 512), 2)
                assert answers(reply) == expected
        finally:
            client.close()
            transport.close()

    run(go)


def test_without_a_network_every_lookup_is_refused_and_remembered() -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    address = server.getsockname()
    resolver = netns.Resolver([(Listener("dns", "127.0.0.1", 0), server.detach())])
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.settimeout(2)
    try:
        client.sendto(query(b"example.org"), address)
        (fd,) = resolver.fds()
        resolver.answer(fd)
        assert answers(client.recv(512)) == (dns.RCODE_NXDOMAIN, [])
        client.sendto(b"\x00\x01", address)  # not a query: FORMERR, not kept
        resolver.answer(fd)
        assert client.recv(512)[3] & 0x0F == dns.RCODE_FORMERR
        assert resolver.refused == [("example.org", "A")]
        # the sandbox's own hostname is loopback, as a host's /etc/hosts has it
        client.sendto(query(b"Corral"), address)
        resolver.answer(fd)
        assert answers(client.recv(512)) == (0, ["127.0.0.1"])
        client.sendto(query(b"corral", dns.TYPE_AAAA), address)
        resolver.answer(fd)
        assert answers(client.recv(512)) == (0, ["::1"])
        client.sendto(query(b"1." + b"0." * 31 + b"ip6.arpa", dns.TYPE_PTR), address)
        resolver.answer(fd)
        assert answers(client.recv(512)) == (0, [])  # loopback's name: no record, no refusal
        assert resolver.refused == [("example.org", "A")]  # not a lookup refused
    finally:
        client.close()
        resolver.close()


def test_every_tier_names_the_sandbox_as_its_resolvers_answer_it() -> None:
    from corral.container import envelope
    from corral.tiers import namespace
    from corral.vm import initramfs

    args = list(namespace.HARDENING)
    assert args[args.index("--hostname") + 1] == dns.SANDBOX_HOSTNAME
    assert envelope.HOSTNAME == dns.SANDBOX_HOSTNAME
    assert f"\nhostname {dns.SANDBOX_HOSTNAME}\n" in initramfs.INIT


# -- the handoff and the door's proxy process ------------------------------------------------


def _door(tmp_path: Path, allow: list[str]) -> Door:
    policy = Policy(str(tmp_path))
    policy.network.mode = "proxy"
    policy.network.allow = allow
    door = Door(policy, RUN_ID, str(tmp_path / "net.jsonl"), transport="netns")
    door.open()
    return door


def _made(listeners: list[Listener]) -> list[tuple[Listener, Any]]:
    import _socket

    made = []
    for listener in listeners:
        kind = _socket.SOCK_DGRAM if listener.datagram else _socket.SOCK_STREAM
        sock = _socket.socket(_socket.AF_INET, kind)
        sock.bind(("127.0.0.1", 0))
        if not listener.datagram:
            sock.listen(16)
        made.append((Listener(listener.kind, listener.host, listener.port), sock))
    return made


def test_listeners_handed_to_the_door_are_served_and_die_with_the_proxy(tmp_path: Path) -> None:
    async def origin_and_check() -> None:
        ok = await Origin().start()
        door = _door(tmp_path, [f"127.0.0.1:{ok.port}"])
        made = _made(
            [Listener("proxy", "127.0.0.1", 3128), Listener("service", "127.0.0.1", ok.port)]
        )
        ports = [sock.getsockname()[1] for _, sock in made]
        try:
            netns._hand_over(door.address, made)  # as the launcher does
            for _, sock in made:
                sock.close()  # the proxy holds the only copies now
            loop = aio.get_running_loop()
            reader, writer = await aio.open_connection("127.0.0.1", ports[0])
            writer.write(b"GET http://127.0.0.1:%d/proxied HTTP/1.1\r\n\r\n" % ok.port)
            assert (await read_response(reader)).status == 200
            writer.close()
            reader, writer = await aio.open_connection("127.0.0.1", ports[1])
            writer.write(b"GET /own HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await read_response(reader)).status == 200
            writer.close()
            assert ok.paths == ["/proxied", "/own"]
            pids = [int(p) for p in (Path(door.dir) / "proxy.pid").read_text().split()]
            assert len(pids) == 2  # the first worker and the sibling it forked
            os.kill(pids[0], 9)  # the proxy killed: its sibling stops with it
            started = time.monotonic()
            while time.monotonic() - started < 1.0 and any(alive(p) for p in pids):
                await aio.sleep(0.005)
            assert not any(alive(p) for p in pids)
            for port in ports:  # no proxy: the listeners went with it, refused at once
                with pytest.raises(ConnectionRefusedError):
                    await loop.sock_connect(socket.socket(), ("127.0.0.1", port))
            assert time.monotonic() - started < 1.0
        finally:
            door.close()
            ok.close()
        assert not os.path.exists(door.dir)

    run(origin_and_check)


def _used_door(tmp_path: Path) -> Door:
    """A door whose proxy took one request (to 127.0.0.1:9, where nothing listens)."""
    door = _door(tmp_path, ["127.0.0.1:9"])
    made = _made([Listener("proxy", "127.0.0.1", 3128)])
    netns._hand_over(door.address, made)
    with socket.create_connection(made[0][1].getsockname(), timeout=5) as client:
        client.sendall(b"GET http://127.0.0.1:9/ HTTP/1.1\r\n\r\n")
        client.recv(100)
    for _, sock in made:
        sock.close()
    return door


def test_a_door_nothing_reached_closes_at_once_and_leaves_nothing(tmp_path: Path) -> None:
    door = _door(tmp_path, ["127.0.0.1:9"])
    started = time.monotonic()
    assert door.close() == []
    assert time.monotonic() - started < 0.5  # its proxy may still be importing: not waited for
    assert not os.path.exists(door.dir)
    twin = _used_door(tmp_path)  # a door that was used is waited for, its tally read
    # allowed, not denied; nothing listening (502) is kept as unreachable, with why
    [down] = twin.close()
    assert down["unreachable"] and not down["lookup"]
    assert (down["host"], down["port"], down["rule"]) == ("127.0.0.1", 9, "127.0.0.1:9")
    assert "Connection refused" in str(down["reason"])
    lines = [json.loads(x) for x in (tmp_path / "net.jsonl").read_text().splitlines()]
    assert [(e["scheme"], e["status"]) for e in lines] == [("http", 502)]


def test_a_door_told_its_sandbox_ended_stops_beside_the_aftercare(tmp_path: Path) -> None:
    """corral run tells the door once the sandbox is gone (sandbox_ended), then does
    its own cleanup, then collects the tally (close).  A door nothing reached has
    its workers killed at once (no tally to wait for); the twin, a door that was
    used, is told to finish and close() still returns its denials, its audit
    line already written."""
    door = _door(tmp_path, ["127.0.0.1:9"])
    made = _made([Listener("proxy", "127.0.0.1", 3128)])
    netns._hand_over(door.address, made)
    for _, sock in made:
        sock.close()
    pid_file = Path(door.dir) / "proxy.pid"
    started = time.monotonic()
    while time.monotonic() - started < 5.0 and len(_words(pid_file)) < 2:
        time.sleep(0.005)  # each worker notes its pid as it starts
    pids = [int(p) for p in _words(pid_file)]
    assert len(pids) == 2  # the first worker and its sibling
    door.sandbox_ended()
    started = time.monotonic()
    while time.monotonic() - started < 2.0 and any(alive(p) for p in pids):
        time.sleep(0.005)
    assert not any(alive(p) for p in pids)
    assert door.close() == [] and not os.path.exists(door.dir)

    used = _used_door(tmp_path)
    used.sandbox_ended()
    [down] = used.close()
    assert (down["host"], down["port"], down["unreachable"]) == ("127.0.0.1", 9, True)
    lines = [json.loads(x) for x in (tmp_path / "net.jsonl").read_text().splitlines()]
    assert [(e["scheme"], e["status"]) for e in lines] == [("http", 502)]
    assert not os.path.exists(used.dir)


def _words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return []
