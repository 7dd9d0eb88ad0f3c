"""What a client's first bytes ask for (corral.net.sniff.claim), read fail-closed."""

from __future__ import annotations

import itertools
import ssl
import struct

import pytest

from corral.net.sniff import claim


def real_hello(name: str | None) -> bytes:
    """The ClientHello this machine's OpenSSL sends (TLS 1.3 key shares and all)."""
    context = ssl.create_default_context()
    if name is None:
        context.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def split(hello: bytes, *cuts: int) -> bytes:
    """The same ClientHello over several TLS records, cut at ``cuts`` (servers join them)."""
    (size,) = struct.unpack("!H", hello[3:5])
    payload = hello[5 : 5 + size]
    edges = [0, *cuts, len(payload)]
    pieces = [payload[a:b] for a, b in itertools.pairwise(edges)]
    return b"".join(hello[:3] + struct.pack("!H", len(p)) + p for p in pieces)


def test_a_real_client_hello_names_its_server() -> None:
    found = claim(real_hello("api.example.test"))
    assert (found.state, found.names) == ("names", ("api.example.test",))


def test_a_client_hello_split_over_records_is_joined_and_read() -> None:
    """Splitting once hid the SNI: the first record alone has no server_name."""
    hello = real_hello("evil.example.test")
    for cuts in ((3,), (40,), (100, 101, 200)):
        found = claim(split(hello, *cuts))
        assert (found.state, found.names) == ("names", ("evil.example.test",)), cuts


def test_an_unfinished_client_hello_waits_then_is_unreadable() -> None:
    hello = split(real_hello("a.test"), 50)
    for end in (1, 5, 20, 60, len(hello) - 1):
        assert claim(hello[:end]).state == "wait", end
        final = claim(hello[:end], final=True)
        assert (final.state, final.reason) == ("unreadable", "an unfinished ClientHello"), end


def test_a_client_hello_without_sni_names_nothing() -> None:
    assert claim(real_hello(None)).state == "none"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x16\x03\x01\x00\x04\x02\x00\x00\x00", "a TLS handshake that is not a ClientHello"),
        (
            b"\x16\x03\x01\x00\x01\x01\x17\x03\x03\x00\x01x",
            "a TLS record that is not the ClientHello's",
        ),
        (b"\x16\x03\x01\x00\x04\x01\xff\xff\xff", "a ClientHello larger than corral reads"),
        (b"\x16\x03\x01\x00\x08\x01\x00\x00\x04\x03\x03\x00\x00", "a malformed ClientHello"),
    ],
)
def test_tls_that_cannot_be_read_is_unreadable(data: bytes, reason: str) -> None:
    found = claim(data)
    assert (found.state, found.reason) == ("unreadable", reason)


def test_two_server_names_are_unreadable_and_one_is_read() -> None:
    hello = real_hello("one.test")
    two = hello.replace(b"one.test", b"two.test")
    assert claim(two).names == ("two.test",)  # the twin: one name, read
    names = struct.pack("!BH", 0, 8) + b"one.test" + struct.pack("!BH", 0, 8) + b"two.test"
    ext = struct.pack("!HHH", 0, len(names) + 2, len(names)) + names
    body = b"\x03\x03" + b"\x00" * 32 + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    body += struct.pack("!H", len(ext)) + ext
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    record = b"\x16\x03\x01" + struct.pack("!H", len(handshake)) + handshake
    assert claim(record).state == "unreadable"


@pytest.mark.parametrize(
    ("data", "names"),
    [
        (b"GET / HTTP/1.1\r\nHost: a.test:8080\r\n\r\n", ("a.test",)),
        (b"GET / HTTP/1.1\nhost:a.test\n\n", ("a.test",)),  # bare LF, as servers accept
        (b"\r\n\r\nGET / HTTP/1.1\r\nHost: a.test\r\n\r\n", ("a.test",)),  # empty lines skipped
        (b"GET  /  HTTP/1.1\r\nHost: a.test\r\n\r\n", ("a.test",)),  # runs of spaces
        (b"GET http://u@b.test:1/x HTTP/1.1\r\nHost: a.test\r\n\r\n", ("a.test", "b.test")),
        (b"FOO / HTTP/1.0\r\nHost: [::1]:80\r\n\r\n", ("::1",)),
    ],
)
def test_an_http_request_names_its_host_and_target(data: bytes, names: tuple[str, ...]) -> None:
    found = claim(data)
    assert (found.state, found.names) == ("names", names)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "more than one Host header"),
        (b"GET / HTTP/1.1\r\nHost: a\r\n b\r\n\r\n", "a folded header line"),
        (b"GET / HTTP/1.1\r\nHost: a:x\r\n\r\n", "a bad Host: bad port"),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "cleartext HTTP/2, whose host corral does not read"),
    ],
)
def test_http_that_could_be_read_two_ways_is_unreadable(data: bytes, reason: str) -> None:
    found = claim(data)
    assert (found.state, found.reason) == ("unreadable", reason)


@pytest.mark.parametrize(
    "data",
    [
        b"GET",
        b"GET / HTT",
        b"GET / HTTP/1.1\r\n",
        b"GET / HTTP/1.1\r\nHost: a.test\r\n",
        b"\r\n",
        b"GET / HTTP/1.1\r",  # split after the CR: its LF comes in the next packet
        b"GET / HTTP/1.1\rHost: b.test",  # a bare CR: judged once the line is whole
    ],
)
def test_an_unfinished_request_waits_then_is_unreadable(data: bytes) -> None:
    """A client that stops mid-head cannot be let through as "no name": the rest
    of its head would follow unread."""
    assert claim(data).state == "wait"
    assert claim(data, final=True).state == "unreadable"


@pytest.mark.parametrize(
    "data",
    [
        b"SSH-2.0-OpenSSH_9.2\r\n",
        b"NICK corral\r\n",
        b"*1\r\n$4\r\nPING\r\n",
        b"\x00\x00\x00\x08\x04\xd2\x16\x2f",  # a PostgreSQL SSL request
        b"GET key\r\n",  # Redis' inline commands, memcached's: no HTTP target or version
        b"set key 0 0 5\r\n",
        b"GET / HTTP/1.1\r\nAccept: */*\r\n\r\n",
    ],
)
def test_other_protocols_name_nothing(data: bytes) -> None:
    assert claim(data).state == "none"
    assert claim(data, final=True).state == "none"


@pytest.mark.parametrize(
    "data",
    [
        b"GET /a b HTTP/1.1\r\nHost: b.test\r\n\r\n",  # a space in the target (old nginx)
        b"GET /a HTTP/1.1\rHost: b.test\r\n\r\n",  # a bare CR ends a line for some servers
        b"GET /a\rHTTP/1.1\r\nHost: b.test\r\n\r\n",
        b"GET /\r\n",  # HTTP/0.9: a server's default site, whichever it is
        b"get http://b.test/ x HTTP/1.0\r\n\r\n",
    ],
)
def test_a_line_a_server_could_read_as_http_is_unreadable_not_none(data: bytes) -> None:
    """Bytes let through as "no name" reach the server unread: a request line corral
    cannot read but a server might (for another host) is refused instead."""
    found = claim(data)
    assert (found.state, found.reason) == ("unreadable", "an HTTP request line corral cannot read")
    assert claim(b"GET /a%20b HTTP/1.1\r\nHost: b.test\r\n\r\n").names == ("b.test",)  # twin


def test_nothing_sent_waits_until_final() -> None:
    assert claim(b"").state == "wait"
    assert claim(b"", final=True).state == "none"


@pytest.mark.parametrize(
    "data",
    [
        b"PROXY TCP4 10.9.8.7 10.0.0.1 4444 80\r\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n",
        b"\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c" + bytes(12) + b"GET / HTTP/1.1\r\n",
        b"PROXY UNKNOWN\r\n\x16\x03\x01",
    ],
)
def test_a_proxy_protocol_header_is_unreadable_not_none(data: bytes) -> None:
    """A PROXY protocol header before a request for another host went through an
    opaque tunnel unread, as "another protocol" (found by attacking corral): an
    origin that reads one routes by what follows.  The twins: the same request
    alone names its host, and a request after empty lines is still read."""
    found = claim(data)
    assert (found.state, found.reason) == (
        "unreadable",
        "a PROXY protocol header before the client's bytes",
    )
    assert claim(b"\r\n\r\n"[:3]).state == "wait"
    assert claim(b"\r\n\r\n\x00", final=True).state == "unreadable"
    request = b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n"
    assert claim(request).names == ("other.test",)
    assert claim(b"\r\n\r\n" + request).names == ("other.test",)
