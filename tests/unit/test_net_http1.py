"""Tests for corral.net.http1: heads, framing, header forwarding and body copying.

Pure functions are called directly; the stream functions are driven by an
``aio.StreamReader`` fed with ``feed_data`` and a writer that collects bytes.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar, cast

import pytest

from corral.net import aio, http1
from corral.net.http1 import HttpError, Message

T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    async def bounded() -> T:
        result: T = await aio.wait_for(coro, 5)  # aio's helpers return Any
        return result

    result: T = aio.run(bounded())
    return result


class FakeTransport:
    def __init__(self) -> None:
        self.buffered = 0

    def get_write_buffer_size(self) -> int:
        return self.buffered


class FakeWriter:
    """What copy_body needs from a StreamWriter: write, drain and a transport."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.transport = FakeTransport()
        self.drains = 0

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        self.drains += 1


def reader_with(data: bytes, eof: bool = True, limit: int = http1.MAX_HEAD) -> aio.StreamReader:
    reader = aio.StreamReader(limit=limit)
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


async def copy(data: bytes, kind: str, length: int = 0) -> tuple[int, bytes, bytes]:
    """Copy one body out of ``data``; returns (count, bytes written, bytes left unread)."""
    reader = reader_with(data)
    writer = FakeWriter()
    sent = await http1.copy_body(reader, cast(aio.StreamWriter, writer), kind, length)
    return sent, bytes(writer.data), await reader.read()


def request(head: bytes) -> Message:
    return http1.parse_request(head)


def response(head: bytes) -> Message:
    return http1.parse_response(head)


# -- parse_request -----------------------------------------------------------------------------


def test_parse_request_good() -> None:
    msg = request(b"GET http://example.org/x?y=1 HTTP/1.1\r\nHost: example.org\r\nX-A:  b c \t")
    assert msg.method == b"GET"
    assert msg.target == b"http://example.org/x?y=1"
    assert msg.version == b"HTTP/1.1"
    assert msg.headers == [(b"host", b"example.org"), (b"x-a", b"b c")]
    assert msg.get(b"host") == b"example.org"
    assert msg.get(b"missing") is None


def test_parse_request_lowercases_names_keeps_values_and_order() -> None:
    msg = request(b"POST / HTTP/1.0\r\nX-One: A\r\nx-one: B\r\nCONTENT-TYPE: Text/Plain")
    assert msg.version == b"HTTP/1.0"
    assert msg.get_all(b"x-one") == [b"A", b"B"]
    assert msg.get(b"x-one") == b"A"
    assert msg.get(b"content-type") == b"Text/Plain"


def test_parse_request_no_headers() -> None:
    msg = request(b"CONNECT example.org:443 HTTP/1.1")
    assert msg.method == b"CONNECT"
    assert msg.target == b"example.org:443"
    assert msg.headers == []


def test_parse_request_empty_value_and_colon_in_value() -> None:
    msg = request(b"GET / HTTP/1.1\r\nX-Empty:\r\nX-Url: http://a:1/b")
    assert msg.get(b"x-empty") == b""
    assert msg.get(b"x-url") == b"http://a:1/b"


@pytest.mark.parametrize(
    "line",
    [
        b"G(T / HTTP/1.1",
        b"GE\x00T / HTTP/1.1",
        b"G\xc3\xa9T / HTTP/1.1",
        b" GET / HTTP/1.1",
        b"GET /",
        b"GET",
        b"",
        b"GET / HTTP/1.1 extra",
        b"GET  / HTTP/1.1",
    ],
)
def test_parse_request_bad_request_line(line: bytes) -> None:
    with pytest.raises(HttpError) as info:
        request(line)
    assert info.value.status == 400


@pytest.mark.parametrize("version", [b"HTTP/2.0", b"HTTP/0.9", b"HTTP/1.2", b"http/1.1", b"FOO"])
def test_parse_request_unsupported_version(version: bytes) -> None:
    with pytest.raises(HttpError) as info:
        request(b"GET / " + version)
    assert info.value.status == 505


@pytest.mark.parametrize(
    "header",
    [
        b" folded",
        b"\tfolded",
        b"no colon here",
        b": empty name",
        b"Bad Name: x",
        b"Bad\tName: x",
        b"Name : x",
        b"Na(me: x",
        b"N\xc3\xa4me: x",
    ],
)
def test_parse_request_bad_header(header: bytes) -> None:
    with pytest.raises(HttpError) as info:
        request(b"GET / HTTP/1.1\r\nHost: a\r\n" + header)
    assert info.value.status == 400


def test_folded_header_message() -> None:
    with pytest.raises(HttpError, match="folded"):
        request(b"GET / HTTP/1.1\r\nX-A: 1\r\n  continued")


@pytest.mark.parametrize(
    "header",
    [
        b"X-A: a\nTransfer-Encoding: chunked",
        b"X-A: a\rTransfer-Encoding: chunked",
        b"X-A: a\x00b",
    ],
)
def test_control_characters_in_header_value_are_refused(header: bytes) -> None:
    with pytest.raises(HttpError) as info:
        request(b"POST / HTTP/1.1\r\nHost: a\r\n" + header)
    assert info.value.status == 400


# -- keep_alive --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "keep"),
    [
        (b"GET / HTTP/1.1", True),
        (b"GET / HTTP/1.1\r\nConnection: close", False),
        (b"GET / HTTP/1.1\r\nConnection: Keep-Alive, CLOSE", False),
        (b"GET / HTTP/1.1\r\nConnection: x-foo\r\nConnection: close", False),
        (b"GET / HTTP/1.0", False),
        (b"GET / HTTP/1.0\r\nConnection: keep-alive", True),
        (b"GET / HTTP/1.0\r\nConnection: Keep-Alive", True),
    ],
)
def test_keep_alive(head: bytes, keep: bool) -> None:
    assert request(head).keep_alive() is keep


# -- parse_response ----------------------------------------------------------------------------


def test_parse_response_good() -> None:
    msg = response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b")
    assert msg.version == b"HTTP/1.1"
    assert msg.status == 200
    assert msg.reason == b"OK"
    assert msg.get(b"content-length") == b"5"


def test_parse_response_reason_with_spaces_and_without_reason() -> None:
    assert response(b"HTTP/1.1 404 Not Found Here").reason == b"Not Found Here"
    msg = response(b"HTTP/1.0 204")
    assert msg.status == 204
    assert msg.reason == b""
    assert msg.version == b"HTTP/1.0"


@pytest.mark.parametrize(
    "head",
    [b"HTTP/2 200 OK", b"HTTP/1.1 abc OK", b"HTTP/1.1", b"", b"garbage", b"ICY 200 OK"],
)
def test_parse_response_bad_status_line(head: bytes) -> None:
    with pytest.raises(HttpError) as info:
        response(head)
    assert info.value.status == 502


def test_parse_response_bad_header() -> None:
    with pytest.raises(HttpError):
        response(b"HTTP/1.1 200 OK\r\n folded")
    with pytest.raises(HttpError):
        response(b"HTTP/1.1 200 OK\r\nno colon")


# -- framing -----------------------------------------------------------------------------------


def test_request_without_framing_has_no_body() -> None:
    assert http1.framing(request(b"GET / HTTP/1.1")) == ("none", 0)
    assert http1.framing(request(b"POST / HTTP/1.1")) == ("none", 0)


def test_content_length() -> None:
    assert http1.framing(request(b"POST / HTTP/1.1\r\nContent-Length: 42")) == ("length", 42)


def test_content_length_zero_is_no_body() -> None:
    assert http1.framing(request(b"POST / HTTP/1.1\r\nContent-Length: 0")) == ("none", 0)


def test_transfer_encoding_chunked() -> None:
    msg = request(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked")
    assert http1.framing(msg) == ("chunked", 0)
    msg = request(b"POST / HTTP/1.1\r\nTransfer-Encoding: Chunked ")
    assert http1.framing(msg) == ("chunked", 0)


@pytest.mark.parametrize(
    "headers",
    [
        b"Content-Length: 5\r\nTransfer-Encoding: chunked",
        b"Transfer-Encoding: chunked\r\nContent-Length: 5",
        b"Transfer-Encoding: chunked\r\nContent-Length: 0",
    ],
)
def test_content_length_and_transfer_encoding_is_smuggling(headers: bytes) -> None:
    with pytest.raises(HttpError) as info:
        http1.framing(request(b"POST / HTTP/1.1\r\n" + headers))
    assert info.value.status == 400


@pytest.mark.parametrize(
    "headers",
    [
        b"Content-Length: 5\r\nContent-Length: 5",
        b"Content-Length: 5, 5",
        b"Content-Length: 5,5\r\nContent-Length:  5",
    ],
)
def test_duplicate_identical_content_length_is_fine(headers: bytes) -> None:
    assert http1.framing(request(b"POST / HTTP/1.1\r\n" + headers)) == ("length", 5)


@pytest.mark.parametrize(
    "headers",
    [
        b"Content-Length: 5\r\nContent-Length: 6",
        b"Content-Length: 5, 6",
        b"Content-Length: 5\r\nContent-Length: 05",
    ],
)
def test_conflicting_content_length(headers: bytes) -> None:
    with pytest.raises(HttpError) as info:
        http1.framing(request(b"POST / HTTP/1.1\r\n" + headers))
    assert info.value.status == 400


@pytest.mark.parametrize(
    "value", [b"abc", b"-1", b"+5", b"0x10", b"5.0", b"", b"1 2", b"1" * 19, b"\xd9\xa3"]
)
def test_bad_content_length(value: bytes) -> None:
    with pytest.raises(HttpError) as info:
        http1.framing(request(b"POST / HTTP/1.1\r\nContent-Length: " + value))
    assert info.value.status == 400


def test_longest_accepted_content_length() -> None:
    msg = request(b"POST / HTTP/1.1\r\nContent-Length: " + b"9" * 18)
    assert http1.framing(msg) == ("length", 10**18 - 1)


@pytest.mark.parametrize(
    "value",
    [b"gzip, chunked", b"gzip,chunked", b"deflate, gzip, chunked"],
)
def test_transfer_codings_besides_chunked_are_refused(value: bytes) -> None:
    # The proxy re-frames as plain chunked; another coding would arrive undeclared.
    msg = request(b"POST / HTTP/1.1\r\nTransfer-Encoding: " + value)
    with pytest.raises(HttpError) as info:
        http1.framing(msg)
    assert info.value.status == 400


def test_transfer_encoding_split_across_headers_is_refused() -> None:
    msg = request(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked")
    with pytest.raises(HttpError):
        http1.framing(msg)


def test_plain_chunked_in_any_case_is_accepted() -> None:
    msg = request(b"POST / HTTP/1.1\r\nTransfer-Encoding: Chunked")
    assert http1.framing(msg) == ("chunked", 0)


@pytest.mark.parametrize(
    "value",
    [
        b"chunked, gzip",
        b"gzip",
        b"chunked, chunked",
        b"identity",
        b"",
        b"xchunked",
        b"chunked;q=1",
    ],
)
def test_transfer_coding_not_ending_in_one_chunked_is_refused(value: bytes) -> None:
    with pytest.raises(HttpError) as info:
        http1.framing(request(b"POST / HTTP/1.1\r\nTransfer-Encoding: " + value))
    assert info.value.status == 400


def test_bad_transfer_encoding_in_response_is_a_gateway_error() -> None:
    with pytest.raises(HttpError) as info:
        http1.framing(response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip"), b"GET")
    assert info.value.status == 502


@pytest.mark.parametrize("status", [100, 101, 103, 199, 204, 304])
def test_responses_that_never_have_a_body(status: int) -> None:
    msg = response(b"HTTP/1.1 %d X\r\nContent-Length: 10" % status)
    assert http1.framing(msg, b"GET") == ("none", 0)


def test_response_to_head_has_no_body() -> None:
    msg = response(b"HTTP/1.1 200 OK\r\nContent-Length: 10")
    assert http1.framing(msg, b"HEAD") == ("none", 0)
    msg = response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked")
    assert http1.framing(msg, b"HEAD") == ("none", 0)


def test_response_framing() -> None:
    assert http1.framing(response(b"HTTP/1.1 200 OK\r\nContent-Length: 3"), b"GET") == (
        "length",
        3,
    )
    assert http1.framing(response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked"), b"POST") == (
        "chunked",
        0,
    )


def test_response_without_framing_runs_until_close() -> None:
    assert http1.framing(response(b"HTTP/1.1 200 OK"), b"GET") == ("close", 0)
    assert http1.framing(response(b"HTTP/1.0 200 OK"), b"GET") == ("close", 0)


def test_response_with_ambiguous_framing_is_refused() -> None:
    with pytest.raises(HttpError):
        http1.framing(
            response(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked"),
            b"GET",
        )
    with pytest.raises(HttpError):
        http1.framing(response(b"HTTP/1.1 200 OK\r\nContent-Length: 3, 4"), b"GET")


# -- forwardable -------------------------------------------------------------------------------


def names(headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    return [name for name, _ in headers]


def test_forwardable_drops_hop_by_hop() -> None:
    msg = request(
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nKeep-Alive: 5\r\n"
        b"Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\nTE: trailers\r\n"
        b"Trailer: X-T\r\nUpgrade: websocket\r\nAccept: */*"
    )
    assert http1.forwardable(msg, "none", 0) == [(b"host", b"a"), (b"accept", b"*/*")]


def test_forwardable_drops_headers_named_in_connection() -> None:
    msg = request(
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: X-Secret, x-other\r\nConnection: X-Third\r\n"
        b"X-Secret: 1\r\nX-Other: 2\r\nx-third: 3\r\nX-Kept: 4"
    )
    assert names(http1.forwardable(msg, "none", 0)) == [b"host", b"x-kept"]


def test_forwardable_keeps_order_and_duplicates() -> None:
    msg = request(b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nA: 3")
    assert http1.forwardable(msg, "none", 0) == [(b"a", b"1"), (b"b", b"2"), (b"a", b"3")]


def test_forwardable_keeps_transfer_encoding_only_for_chunked() -> None:
    msg = request(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked")
    assert http1.forwardable(msg, "chunked", 0) == [
        (b"host", b"a"),
        (b"transfer-encoding", b"chunked"),
    ]
    for kind in ("none", "length", "close"):
        assert b"transfer-encoding" not in names(http1.forwardable(msg, kind, 0))


def test_forwardable_keeps_content_length() -> None:
    msg = request(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5")
    assert http1.forwardable(msg, "length", 5) == [(b"host", b"a"), (b"content-length", b"5")]


@pytest.mark.parametrize(
    "fields",
    [b"Content-Length: 5, 5", b"Content-Length: 005", b"Content-Length: 5\r\nContent-Length: 5"],
)
def test_a_content_length_goes_on_as_the_proxy_read_it(fields: bytes) -> None:
    """Forms a lenient parser accepts and a strict one may read otherwise (the rest
    of the body then taken for a request of its own) leave as one plain field;
    the twin, a plain one, leaves as it came."""
    msg = request(b"POST / HTTP/1.1\r\nHost: a\r\n" + fields + b"\r\nX: y")
    kind, length = http1.framing(msg)
    assert http1.forwardable(msg, kind, length) == [
        (b"host", b"a"),
        (b"x", b"y"),
        (b"content-length", b"5"),
    ]


def test_connection_cannot_remove_framing_headers() -> None:
    msg = request(b"POST / HTTP/1.1\r\nHost: a\r\nConnection: content-length\r\nContent-Length: 5")
    kind, length = http1.framing(msg)
    assert (kind, length) == ("length", 5)
    assert (b"content-length", b"5") in http1.forwardable(msg, kind, length)


# -- serialize_head ----------------------------------------------------------------------------


def test_serialize_head() -> None:
    head = http1.serialize_head(b"GET / HTTP/1.1", [(b"host", b"a"), (b"x", b"y")])
    assert head == b"GET / HTTP/1.1\r\nhost: a\r\nx: y\r\n\r\n"
    assert http1.serialize_head(b"HTTP/1.1 200 OK", []) == b"HTTP/1.1 200 OK\r\n\r\n"


def test_serialize_then_parse_round_trip() -> None:
    msg = request(b"PUT /x HTTP/1.1\r\nHost: a\r\nX-A: 1")
    head = http1.serialize_head(b"PUT /x HTTP/1.1", msg.headers)
    again = request(head[:-4])
    assert again.headers == msg.headers


# -- split_absolute ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (b"http://example.org/path", ("example.org", 80, b"/path")),
        (b"http://example.org:8080/p?q=1", ("example.org", 8080, b"/p?q=1")),
        (b"http://[::1]:80/", ("::1", 80, b"/")),
        (b"http://[::1]/x", ("::1", 80, b"/x")),
        (b"http://192.0.2.1:81/a/b/c", ("192.0.2.1", 81, b"/a/b/c")),
        (b"http://example.org", ("example.org", 80, b"/")),
        (b"http://example.org?q=1", ("example.org", 80, b"/?q=1")),
        (b"HTTP://Example.org/", ("Example.org", 80, b"/")),  # normalized later, once
        (b"http://example.org/a?b=http://c/d", ("example.org", 80, b"/a?b=http://c/d")),
        # not UTF-8: kept as surrogates for the normalizer to refuse with its reason
        (b"http://ex\xffample.org/", ("ex\udcffample.org", 80, b"/")),
    ],
)
def test_split_absolute(target: bytes, expected: tuple[str, int, bytes]) -> None:
    assert http1.split_absolute(target) == expected


@pytest.mark.parametrize(
    "target",
    [
        b"https://example.org/",
        b"ftp://example.org/",
        b"/path",
        b"example.org/path",
        b"example.org:80",
        b"http://user:pw@example.org/",
        b"http://user@example.org/",
        b"http:///path",
        b"http://example.org:abc/",
        b"http://example.org:0/",
        b"http://example.org:65536/",
        b"http://[::1/",
    ],
)
def test_split_absolute_refuses(target: bytes) -> None:
    with pytest.raises(HttpError) as info:
        http1.split_absolute(target)
    assert info.value.status == 400


def test_split_absolute_https_hint() -> None:
    with pytest.raises(HttpError, match="CONNECT"):
        http1.split_absolute(b"https://example.org/")


# -- split_authority ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("authority", "expected"),
    [
        (b"example.org", ("example.org", 443)),
        (b"example.org:8443", ("example.org", 8443)),
        (b"[::1]", ("::1", 443)),
        (b"[::1]:8443", ("::1", 8443)),
        (b"::1", ("::1", 443)),
        (b"192.0.2.1:1", ("192.0.2.1", 1)),
        (b"192.0.2.1:65535", ("192.0.2.1", 65535)),
    ],
)
def test_split_authority(authority: bytes, expected: tuple[str, int]) -> None:
    assert http1.split_authority(authority, 443) == expected


@pytest.mark.parametrize(
    "authority",
    [
        b"",
        b":443",
        b"[]:443",
        b"[::1",
        b"host:abc",
        b"host:0",
        b"host:65536",
        b"host:-1",
        b"host: 1",
    ],
)
def test_split_authority_refuses(authority: bytes) -> None:
    with pytest.raises(HttpError) as info:
        http1.split_authority(authority, 443)
    assert info.value.status == 400


def test_split_authority_refuses_junk_after_bracket() -> None:
    with pytest.raises(HttpError):
        http1.split_authority(b"[::1]junk", 443)


# -- read_head ---------------------------------------------------------------------------------


def test_read_head() -> None:
    async def go() -> tuple[bytes | None, bytes]:
        reader = reader_with(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nBODY", eof=False)
        head = await http1.read_head(reader)
        return head, await reader.read(4)

    head, rest = run(go())
    assert head == b"GET / HTTP/1.1\r\nHost: a"
    assert rest == b"BODY"


def test_read_head_with_prefix() -> None:
    async def go() -> bytes | None:
        return await http1.read_head(reader_with(b"ET / HTTP/1.1\r\n\r\n"), b"G")

    assert run(go()) == b"GET / HTTP/1.1"


def test_read_head_ignores_stray_crlf() -> None:
    async def go() -> tuple[bytes | None, bytes | None]:
        one = await http1.read_head(reader_with(b"\r\nGET / HTTP/1.1\r\n\r\n"))
        two = await http1.read_head(reader_with(b"\nGET / HTTP/1.1\r\n\r\n"), b"\r")
        return one, two

    assert run(go()) == (b"GET / HTTP/1.1", b"GET / HTTP/1.1")


def test_read_head_two_in_a_row() -> None:
    async def go() -> list[bytes | None]:
        reader = reader_with(b"GET /1 HTTP/1.1\r\n\r\nGET /2 HTTP/1.1\r\n\r\n")
        return [await http1.read_head(reader) for _ in range(3)]

    assert run(go()) == [b"GET /1 HTTP/1.1", b"GET /2 HTTP/1.1", None]


def test_read_head_too_large() -> None:
    async def go() -> None:
        reader = reader_with(b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 2000, eof=False, limit=1024)
        await http1.read_head(reader)

    with pytest.raises(HttpError) as info:
        run(go())
    assert info.value.status == 431


def test_read_head_just_under_the_limit() -> None:
    async def go() -> bytes | None:
        head = b"GET / HTTP/1.1\r\nX: " + b"a" * 900
        return await http1.read_head(reader_with(head + b"\r\n\r\n", limit=1024))

    head = run(go())
    assert head is not None
    assert head.endswith(b"a" * 900)


@pytest.mark.parametrize("data", [b"GET / HTTP/1.1\r\nHost: a\r\n", b"G", b"GET / HTTP/1.1\r\n\r"])
def test_read_head_eof_mid_head(data: bytes) -> None:
    async def go() -> None:
        await http1.read_head(reader_with(data))

    with pytest.raises(HttpError) as info:
        run(go())
    assert info.value.status == 400


def test_read_head_eof_mid_head_after_prefix() -> None:
    async def go() -> None:
        await http1.read_head(reader_with(b""), b"G")

    with pytest.raises(HttpError):
        run(go())


@pytest.mark.parametrize("data", [b"", b"\r\n", b"\r\n\r"])
def test_read_head_clean_eof(data: bytes) -> None:
    async def go() -> bytes | None:
        return await http1.read_head(reader_with(data))

    assert run(go()) is None


# -- copy_body: length -------------------------------------------------------------------------


def test_copy_body_length() -> None:
    sent, out, rest = run(copy(b"hello world", "length", 5))
    assert (sent, out) == (5, b"hello")
    assert rest == b" world"


def test_copy_body_length_large() -> None:
    body = bytes(range(256)) * 4096  # 1 MiB, several CHUNK-sized reads
    sent, out, _ = run(copy(body, "length", len(body)))
    assert sent == len(body)
    assert out == body


def test_copy_body_length_early_eof() -> None:
    with pytest.raises(HttpError, match="early"):
        run(copy(b"abc", "length", 5))


def test_copy_body_none_copies_nothing() -> None:
    sent, out, rest = run(copy(b"stays", "none", 0))
    assert (sent, out) == (0, b"")
    assert rest == b"stays"


# -- copy_body: chunked ------------------------------------------------------------------------


def test_copy_body_chunked() -> None:
    body = b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    sent, out, rest = run(copy(body + b"NEXT", "chunked"))
    assert out == body
    assert sent == len(body)
    assert rest == b"NEXT"


def test_copy_body_chunked_hex_sizes_any_case() -> None:
    body = b"A\r\n0123456789\r\nb\r\n0123456789a\r\n0\r\n\r\n"
    sent, out, _ = run(copy(body, "chunked"))
    assert out == body.replace(b"A\r\n", b"a\r\n")  # size lines are re-written
    assert sent == len(body)


def test_copy_body_chunked_with_extensions_and_trailers() -> None:
    body = (
        b"5;name=value\r\nhello\r\n"
        b"3 ; ext\r\nabc\r\n"
        b"0;last\r\nX-Checksum: 1234\r\nX-Other: y\r\n\r\n"
    )
    sent, out, rest = run(copy(body + b"rest", "chunked"))
    # extensions and trailers are dropped (nothing can hide in them)
    assert out == b"5\r\nhello\r\n3\r\nabc\r\n0\r\n\r\n"
    assert sent == len(out)
    assert rest == b"rest"


@pytest.mark.parametrize(
    "trailers",
    [
        b"Content-Length: 5\r\n\r\n",  # a well-formed trailer: read and dropped
        b"Transfer-Encoding: chunked\r\nX: y\r\n\r\n",
    ],
)
def test_copy_body_chunked_trailers_never_forwarded(trailers: bytes) -> None:
    sent, out, rest = run(copy(b"3\r\nabc\r\n0\r\n" + trailers + b"NEXT", "chunked"))
    assert out == b"3\r\nabc\r\n0\r\n\r\n" and sent == len(out)
    assert rest == b"NEXT"


@pytest.mark.parametrize(
    "trailers",
    [
        b" folded: yes\r\n\r\n",  # obs-fold
        b"no colon\r\n\r\n",
        b"X-A: b\x00c\r\n\r\n",
        b"X-A: b\nc\r\n\r\n",
        b"X: " + b"a" * (http1.MAX_HEAD - 10) + b"\r\nY: " + b"b" * 20 + b"\r\n\r\n",
    ],
)
def test_copy_body_chunked_bad_trailers_are_400(trailers: bytes) -> None:
    with pytest.raises(HttpError) as info:
        run(copy(b"3\r\nabc\r\n0\r\n" + trailers, "chunked"))
    assert info.value.status == 400


def test_copy_body_huge_chunk_is_streamed_not_held() -> None:
    """A chunk larger than CHUNK reaches the writer in pieces of at most CHUNK."""

    class Pieces(FakeWriter):
        def __init__(self) -> None:
            super().__init__()
            self.largest = 0

        def write(self, data: bytes) -> None:
            self.largest = max(self.largest, len(data))
            super().write(data)

    size = 3 * http1.CHUNK + 7

    async def go() -> Pieces:
        reader = reader_with(b"%x\r\n" % size + b"z" * size + b"\r\n0\r\n\r\n")
        writer = Pieces()
        await http1.copy_body(reader, cast(aio.StreamWriter, writer), "chunked", 0)
        return writer

    writer = run(go())
    assert writer.largest <= http1.CHUNK
    assert bytes(writer.data) == b"%x\r\n" % size + b"z" * size + b"\r\n0\r\n\r\n"


def test_copy_body_chunked_empty() -> None:
    sent, out, _ = run(copy(b"0\r\n\r\n", "chunked"))
    assert (sent, out) == (5, b"0\r\n\r\n")


@pytest.mark.parametrize(
    "body",
    [
        b"x\r\nhello\r\n0\r\n\r\n",
        b"0x5\r\nhello\r\n0\r\n\r\n",
        b"-5\r\nhello\r\n0\r\n\r\n",
        b"+5\r\nhello\r\n0\r\n\r\n",
        b"\r\nhello\r\n0\r\n\r\n",
        b";ext\r\nhello\r\n0\r\n\r\n",
        b"1" * 17 + b"\r\n",
        b"1" * 16 + b"\r\n",  # >= 2**60: a signed 64-bit parser downstream could wrap
        b"8000000000000000\r\n",
        b"5\nhello\r\n0\r\n\r\n",
    ],
)
def test_copy_body_bad_chunk_size(body: bytes) -> None:
    with pytest.raises(HttpError) as info:
        run(copy(body, "chunked"))
    assert info.value.status == 400


@pytest.mark.parametrize(
    "body",
    [b"5\r\nhelloXX0\r\n\r\n", b"5\r\nhello\n0\r\n\r\n", b"5\r\nhelloworld\r\n0\r\n\r\n"],
)
def test_copy_body_bad_chunk_terminator(body: bytes) -> None:
    with pytest.raises(HttpError):
        run(copy(body, "chunked"))


@pytest.mark.parametrize(
    "body",
    [b"", b"5", b"5\r\nhel", b"5\r\nhello", b"5\r\nhello\r"],
)
def test_copy_body_chunked_early_eof(body: bytes) -> None:
    with pytest.raises(HttpError):
        run(copy(body, "chunked"))


@pytest.mark.parametrize("body", [b"0\r\n", b"0\r\nX-T: 1\r\n", b"0\r\nX-T"])
def test_copy_body_chunked_eof_in_trailers(body: bytes) -> None:
    with pytest.raises(HttpError):
        run(copy(body, "chunked"))


def test_copy_body_bare_lf_in_chunk_extension_is_refused() -> None:
    with pytest.raises(HttpError):
        run(copy(b"5;a\nX\r\nhello\r\n0\r\n\r\n", "chunked"))


# -- copy_body: close-delimited ----------------------------------------------------------------


def test_copy_body_close_delimited() -> None:
    body = b"everything until EOF\r\n\r\n0\r\n" * 1000
    sent, out, _ = run(copy(body, "close"))
    assert sent == len(body)
    assert out == body


def test_copy_body_close_delimited_empty() -> None:
    assert run(copy(b"", "close"))[:2] == (0, b"")


def test_copy_body_drains_when_the_buffer_fills() -> None:
    async def go() -> int:
        reader = reader_with(b"x" * 10)
        writer = FakeWriter()
        writer.transport.buffered = http1.CHUNK + 1
        await http1.copy_body(reader, cast(aio.StreamWriter, writer), "length", 10)
        return writer.drains

    assert run(go()) >= 2  # once for the full buffer, once at the end
