"""Strict HTTP/1.1 message heads and body framing for the proxy.

Strict on purpose: a proxy that forwards what it does not understand is a
request-smuggling tool.  Ambiguous framing (both Content-Length and
Transfer-Encoding, conflicting lengths, folded headers, a chunk size that is
not hex) is refused with 400 rather than guessed at.

Bodies are streamed, never held: at most ``CHUNK`` bytes are read at a time,
whatever a Content-Length or a chunk size announces, and reading waits while
the receiver's buffer holds more than ``CHUNK`` (backpressure).  A worker's
memory per connection is therefore bounded by a few times ``CHUNK`` plus
``MAX_HEAD``, not by what a client or origin claims to send.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from corral.net import aio
    from corral.net.hooks import BodyFilter

MAX_HEAD = 64 * 1024  # a message head, and all trailers of one chunked body together
CHUNK = 256 * 1024  # most body bytes read at once, and the write buffer that makes us wait
MAX_CHUNK_DIGITS = 15  # a chunk size below 2**60: no 64-bit parser downstream can overflow

# Hop-by-hop headers (RFC 9110 7.6.1) plus the proxy-only ones: never forwarded.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
FRAMING = frozenset({b"content-length", b"host"})
# Bytes never allowed in a header value or request target (bare CR/LF smuggling).
CONTROL = (frozenset(range(0x20)) - {0x09}) | {0x7F}
CONTROL_BYTES = bytes(sorted(CONTROL))
# ... and in a request target not even TAB: RFC 9112 has no whitespace there, and
# parsers that split on any whitespace would read a different target than ours.
TARGET_CONTROL = CONTROL | {0x09}
TOKEN_BYTES = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.sent = 0  # bytes of a response already written when it broke off


class Message:
    """A parsed request or response head."""

    __slots__ = ("headers", "method", "reason", "status", "target", "version")

    def __init__(self) -> None:
        self.method = b""
        self.target = b""
        self.version = b"HTTP/1.1"
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []  # names lower-cased

    def get(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def get_all(self, name: bytes) -> list[bytes]:
        return [value for key, value in self.headers if key == name]

    def keep_alive(self) -> bool:
        tokens = header_tokens(self.get_all(b"connection"))
        if self.version == b"HTTP/1.0":
            return b"keep-alive" in tokens
        return b"close" not in tokens


def _parse_headers(lines: list[bytes], into: Message) -> None:
    for line in lines:
        if not line:
            continue
        if line[:1] in (b" ", b"\t"):
            raise HttpError(400, "folded header lines are not accepted")
        name, sep, value = line.partition(b":")
        # bytes.translate(None, delete) runs in C: an empty result means "only these bytes"
        if not sep or not name or name.translate(None, TOKEN_BYTES):
            raise HttpError(400, "malformed header line")
        if len(value.translate(None, CONTROL_BYTES)) != len(value):
            raise HttpError(400, "control character in a header value")
        into.headers.append((name.lower(), value.strip(b" \t")))


def parse_request(head: bytes) -> Message:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[0] or not set(parts[0]) <= TOKEN:
        raise HttpError(400, "malformed request line")
    msg = Message()
    msg.method, msg.target, msg.version = parts
    if not TARGET_CONTROL.isdisjoint(msg.target):
        raise HttpError(400, "control character in the request target")
    if msg.version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise HttpError(505, "only HTTP/1.0 and HTTP/1.1 are supported")
    _parse_headers(lines[1:], msg)
    return msg


_VERSIONS = frozenset({b"HTTP/1.0", b"HTTP/1.1"})


def parse_response(head: bytes) -> Message:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    # (the version goes on to the client as it came: only the two there are, never
    # bytes an origin chose, which could carry anything, an echoed key included)
    if (
        len(parts) < 2
        or parts[0] not in _VERSIONS
        or not (len(parts[1]) == 3 and parts[1].isdigit())
    ):
        raise HttpError(502, "malformed response from upstream")
    msg = Message()
    msg.version, msg.status = parts[0], int(parts[1])
    msg.reason = parts[2] if len(parts) > 2 else b""
    _parse_headers(lines[1:], msg)
    return msg


def framing(msg: Message, request_method: bytes | None = None) -> tuple[str, int]:
    """How the body is delimited: ("none"|"length"|"chunked"|"close", length)."""
    if request_method is not None and (  # a response that never has a body
        request_method == b"HEAD" or 100 <= msg.status < 200 or msg.status in (204, 304)
    ):
        return "none", 0
    te = msg.get_all(b"transfer-encoding")
    cl = msg.get_all(b"content-length")
    if te:
        if cl:
            raise HttpError(400, "both Content-Length and Transfer-Encoding")
        codings = [c.strip().lower() for v in te for c in v.split(b",")]
        # Only plain chunked: the proxy re-frames as exactly that, so any other
        # coding would reach the receiver undeclared.
        if codings != [b"chunked"]:
            raise HttpError(400 if request_method is None else 502, "unsupported Transfer-Encoding")
        return "chunked", 0
    if cl:
        values = {v.strip() for v in cl for v in v.split(b",")}
        if len(values) != 1:
            raise HttpError(400, "conflicting Content-Length")
        value = values.pop()
        if not value.isdigit() or len(value) > 18:
            raise HttpError(400, "bad Content-Length")
        length = int(value)
        return ("length", length) if length else ("none", 0)
    if request_method is None:
        return "none", 0  # a request without framing has no body
    return "close", 0  # a response without framing runs until the server closes


FRAMING_FIELDS = (b"content-length", b"transfer-encoding")


def refit(
    headers: list[tuple[bytes, bytes]], original: list[tuple[bytes, bytes]], status: int
) -> list[tuple[bytes, bytes]]:
    """Headers a hook rewrote, made safe to send: the framing of ``original`` (the
    body is copied as it was framed, whatever a hook wrote) and every field
    checked as a parser would (no CR/LF or other control byte: a value taken from
    a file must not start a header of its own).  HttpError ``status`` otherwise."""
    framing = [(k, v) for k, v in original if k in FRAMING_FIELDS]
    kept = [(k, v) for k, v in headers if k not in FRAMING_FIELDS]
    for name, value in kept:
        if not name or name.translate(None, TOKEN_BYTES) or name != name.lower():
            raise HttpError(status, "a rule produced a malformed header name")
        if len(value.translate(None, CONTROL_BYTES)) != len(value):
            raise HttpError(status, "a rule produced a control character in a header")
    return kept + framing


def check_target(target: bytes, status: int) -> bytes:
    """A rewritten origin-form target: no whitespace or control byte."""
    if not target.startswith(b"/") or not TARGET_CONTROL.isdisjoint(target) or b" " in target:
        raise HttpError(status, "a rule produced a malformed request target")
    return target


def serialize_head(first_line: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    out = [first_line]
    out += [name + b": " + value for name, value in headers]
    out.append(b"\r\n")
    return b"\r\n".join(out)


def header_tokens(values: list[bytes]) -> set[bytes]:
    """The comma-separated tokens of a header's values (Connection, Upgrade), lower-case."""
    return {t.strip().lower() for v in values for t in v.split(b",")}


def forwardable(msg: Message, kind: str, length: int) -> list[tuple[bytes, bytes]]:
    """Headers minus hop-by-hop ones (and any the Connection header names).

    Transfer-Encoding is hop-by-hop, but the proxy forwards chunked bodies as
    they are, so a chunked message keeps ``Transfer-Encoding: chunked``.  A body
    of ``length`` bytes goes on with one Content-Length, written as the proxy
    read it: ``5, 5``, ``005`` or two fields are read alike here, and a receiver
    that read them otherwise would take part of the body for the next message.
    """
    named = header_tokens(msg.get_all(b"connection"))
    # Connection may not remove what frames the message or names its target:
    # "Connection: content-length" would otherwise smuggle the body as a request.
    drop = _HOP_BY_HOP_AND_LENGTH if kind == "length" else HOP_BY_HOP
    if named:
        drop = drop | (named - FRAMING)
    kept = [(k, v) for k, v in msg.headers if k not in drop]
    if kind == "chunked":
        kept.append((b"transfer-encoding", b"chunked"))
    elif kind == "length":
        kept.append((b"content-length", b"%d" % length))
    return kept


_HOP_BY_HOP_AND_LENGTH = HOP_BY_HOP | {b"content-length"}


async def read_head(reader: aio.StreamReader, prefix: bytes = b"") -> bytes | None:
    """Up to and without the blank line; None on a clean EOF before any byte.

    ``prefix`` is what the caller already read (the byte used to tell HTTP
    from SOCKS).
    """
    from corral.net import aio

    try:
        data = prefix + await reader.readuntil(b"\r\n\r\n")
    except aio.IncompleteReadError as exc:
        if not (prefix + exc.partial).strip():
            return None
        raise HttpError(400, "connection closed in the middle of a message head") from None
    except aio.LimitOverrunError:
        raise HttpError(431, "message head too large") from None
    if data.startswith(b"\r\n"):  # RFC 9112 2.2: ignore a stray CRLF before a request
        data = data.lstrip(b"\r\n")
    return data[:-4]


async def copy_body(
    reader: aio.StreamReader,
    writer: aio.StreamWriter,
    kind: str,
    length: int,
    head: bytes = b"",
    limit: int | None = None,
) -> int:
    """Write ``head``, then forward a body framed as ``kind``; returns the body bytes.

    The head goes out with the first piece of the body: for the small bodies a
    proxy mostly sees, one send instead of two.  Trailers of a chunked body are
    read, checked like header lines and dropped (what a trailer could say, e.g.
    a second Content-Length, is for no proxy to pass on).  ``limit`` bounds a
    chunked body's data: past it, HttpError 413 before the chunk is written
    (a Content-Length is checked by the caller, before anything is sent).
    """
    if head and kind != "length":
        writer.write(head)
        head = b""
    if kind == "length":
        sent = await _copy_exactly(reader, writer, length, head)
    elif kind == "chunked":
        sent = await _copy_chunked(reader, writer, limit)
    elif kind == "close":
        sent = 0
        while data := await reader.read(CHUNK):
            writer.write(data)
            sent += len(data)
            if writer.transport.get_write_buffer_size() > CHUNK:
                await writer.drain()
    else:
        sent = 0
    await writer.drain()
    return sent


async def _copy_exactly(
    reader: aio.StreamReader, writer: aio.StreamWriter, length: int, head: bytes = b""
) -> int:
    """``length`` bytes, at most CHUNK at a time, waiting while the writer is full."""
    remaining = length
    while remaining:
        data = await reader.read(min(remaining, CHUNK))
        if not data:
            raise HttpError(502, "body ended early")
        if head:
            writer.write(head + data)
            head = b""
        else:
            writer.write(data)
        remaining -= len(data)
        if writer.transport.get_write_buffer_size() > CHUNK:
            await writer.drain()
    return length


async def _copy_chunked(
    reader: aio.StreamReader, writer: aio.StreamWriter, limit: int | None = None
) -> int:
    """Re-frame a chunked body chunk by chunk: clean size lines, data streamed."""
    from corral.net import aio

    sent = 0
    data_bytes = 0
    while True:
        try:
            line = await reader.readuntil(b"\r\n")
        except (aio.IncompleteReadError, aio.LimitOverrunError):
            raise HttpError(400, "bad chunked body") from None
        size = _chunk_size(line[:-2])
        data_bytes += size
        if limit is not None and data_bytes > limit:
            raise HttpError(413, f"request body larger than {limit} bytes")
        if size == 0:
            await _skip_trailers(reader)
            writer.write(b"0\r\n\r\n")
            return sent + 5
        clean = b"%x\r\n" % size  # extensions are dropped: nothing to smuggle in them
        writer.write(clean)
        sent += len(clean) + size + 2
        if size <= CHUNK:  # the usual case: one read, one write
            try:
                data = await reader.readexactly(size + 2)
            except aio.IncompleteReadError:
                raise HttpError(400, "chunked body ended early") from None
            if data[-2:] != b"\r\n":
                raise HttpError(400, "bad chunk terminator")
            writer.write(data)
        else:  # a huge chunk is streamed like a long Content-Length body
            await _copy_big_chunk(reader, writer, size)
        if writer.transport.get_write_buffer_size() > CHUNK:
            await writer.drain()


async def _copy_big_chunk(reader: aio.StreamReader, writer: aio.StreamWriter, size: int) -> None:
    from corral.net import aio

    try:
        await _copy_exactly(reader, writer, size)
        end = await reader.readexactly(2)
    except (HttpError, aio.IncompleteReadError):
        raise HttpError(400, "chunked body ended early") from None
    if end != b"\r\n":
        raise HttpError(400, "bad chunk terminator")
    writer.write(end)


def _chunk_size(line: bytes) -> int:
    size_text = line.split(b";", 1)[0].strip(b" \t")
    digits = size_text.lstrip(b"0") or b"0"
    if (
        not size_text
        or len(digits) > MAX_CHUNK_DIGITS
        or size_text.translate(None, b"0123456789abcdefABCDEF")
        or not CONTROL.isdisjoint(line)
    ):
        raise HttpError(400, "bad chunk size")
    return int(size_text, 16)


async def _skip_trailers(reader: aio.StreamReader) -> None:
    """Read trailer lines up to the empty one (MAX_HEAD in all), check, drop them."""
    from corral.net import aio

    total = 0
    while True:
        try:
            line = await reader.readuntil(b"\r\n")
        except (aio.IncompleteReadError, aio.LimitOverrunError):
            raise HttpError(400, "bad chunked trailer") from None
        if line == b"\r\n":
            return
        total += len(line)
        if total > MAX_HEAD:
            raise HttpError(400, "chunked trailers too large")
        if not CONTROL.isdisjoint(line[:-2]):
            raise HttpError(400, "control character in a trailer")
        _parse_headers([line[:-2]], Message())  # a malformed trailer is a 400 too


def split_authority(authority: bytes, default_port: int) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]:port`` -> (host as sent, port); raises HttpError.

    The host is not checked here: :func:`corral.net.names.normalize` does that,
    once, for every path.  Bytes that are not UTF-8 survive as surrogates, so
    the normalizer refuses them with its reason."""
    text = authority.decode("utf-8", "surrogateescape")
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise HttpError(400, "bad authority")
        host, rest = text[1:close], text[close + 1 :]
        if rest and not rest.startswith(":"):
            raise HttpError(400, "bad authority")
        port_text = rest[1:]
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    if port_text or text.endswith(":"):
        if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
            raise HttpError(400, "bad port")
        port = int(port_text)
    else:
        port = default_port
    if not host:
        raise HttpError(400, "missing host")
    return host, port


DEFAULT_PORTS = {"http": 80, "https": 443}


def split_absolute(target: bytes, schemes: tuple[str, ...] = ("http",)) -> tuple[str, int, bytes]:
    """``http://host:port/path?q`` -> (host as sent, port, b"/path?q"); ``schemes``
    are the ones accepted (a plain proxy request: only http)."""
    scheme, sep, rest = target.partition(b"://")
    if not sep:
        raise HttpError(400, "a proxy request needs an absolute URL (http://host/path)")
    scheme_text = scheme.lower().decode("ascii", "replace")
    if scheme_text not in schemes:
        if scheme_text == "https" and "https" not in schemes:
            raise HttpError(400, f"unsupported scheme {scheme_text!r}: use CONNECT for https")
        raise HttpError(400, f"unsupported scheme {scheme_text!r} here")
    slash = rest.find(b"/")
    question = rest.find(b"?")
    cut = min(x for x in (slash, question, len(rest)) if x >= 0)
    authority, path = rest[:cut], rest[cut:]
    if b"@" in authority:
        raise HttpError(400, "credentials in proxy URLs are not forwarded")
    host, port = split_authority(authority, DEFAULT_PORTS[scheme_text])
    if not path.startswith(b"/"):
        path = b"/" + path
    return host, port, path


# -- a body through hooks' filters (corral.net.hooks.BodyFilter) ---------------------

WHOLE = CHUNK  # a filtered body of at most this many bytes is read whole


def filtered_keeps_framing(kind: str, length: int, filters: list[BodyFilter]) -> bool:
    """Whether a body framed as ``kind`` goes through filters read whole (and then
    out with a Content-Length, to any client); else it is re-framed chunked for
    an HTTP/1.1 client, or runs until the connection closes for an older one.
    A filter that grows its input (decompresses it) streams: read whole, a small
    body could become a huge one, held at once."""
    return kind == "length" and length <= WHOLE and not any(f.grows for f in filters)


async def copy_filtered(
    reader: aio.StreamReader,
    writer: aio.StreamWriter,
    kind: str,
    length: int,
    first_line: bytes,
    headers: list[tuple[bytes, bytes]],
    filters: list[BodyFilter],
    chunked: bool,
) -> int:
    """Write a response head and its body (framed as ``kind`` upstream) through
    ``filters``, re-framed: see :func:`filtered_keeps_framing`; ``chunked``: the
    client reads chunked bodies.  ``headers`` hold no framing field.  Returns
    the bytes written."""
    if filtered_keeps_framing(kind, length, filters):
        body = _through(filters, await _read_exactly(reader, length), True)
        head = serialize_head(first_line, [*headers, (b"content-length", b"%d" % len(body))])
        writer.write(head + body)
        await writer.drain()
        return len(head) + len(body)
    if chunked:
        headers = [*headers, (b"transfer-encoding", b"chunked")]
    head = serialize_head(first_line, headers)
    writer.write(head)
    sent = len(head)
    try:
        async for piece in _pieces(reader, kind, length):
            while True:  # (once, but for a filter that gives what it grew in steps)
                sent += _write_piece(writer, _through(filters, piece, False), chunked)
                if writer.transport.get_write_buffer_size() > CHUNK:
                    await writer.drain()
                if not _pending(filters):
                    break
                piece = b""
        sent += _write_piece(writer, _through(filters, b"", True), chunked)
    except HttpError as exc:  # the head is out: no other response may follow it
        exc.sent = sent
        raise
    if chunked:
        writer.write(b"0\r\n\r\n")
        sent += 5
    await writer.drain()
    return sent


def _through(filters: list[BodyFilter], data: bytes, last: bool) -> bytes:
    for body_filter in filters:
        data = body_filter.feed(data) + body_filter.end() if last else body_filter.feed(data)
    return data


def _pending(filters: list[BodyFilter]) -> bool:
    """Whether a filter has more ready of what it was fed (BodyFilter.pending): a
    decompressed body comes in steps, for the client to drain between them, so
    what a connection holds does not grow with the compression ratio."""
    return any(body_filter.pending() for body_filter in filters)


def _write_piece(writer: aio.StreamWriter, data: bytes, chunked: bool) -> int:
    if not data:
        return 0
    if chunked:
        data = b"%x\r\n%b\r\n" % (len(data), data)
    writer.write(data)
    return len(data)


async def _read_exactly(reader: aio.StreamReader, length: int) -> bytes:
    try:
        return await reader.readexactly(length)
    except EOFError:  # (aio.IncompleteReadError, without an import on every response)
        raise HttpError(502, "body ended early") from None


async def _pieces(reader: aio.StreamReader, kind: str, length: int) -> AsyncIterator[bytes]:
    """A response body's data as it arrives, whatever its framing upstream."""
    from corral.net import aio

    if kind == "close":
        while data := await reader.read(CHUNK):
            yield data
        return
    if kind == "length":
        async for data in _exactly(reader, length):
            yield data
        return
    while kind == "chunked":
        try:
            size = _chunk_size((await reader.readuntil(b"\r\n"))[:-2])
        except (aio.IncompleteReadError, aio.LimitOverrunError):
            raise HttpError(502, "bad chunked body") from None
        if size == 0:
            await _skip_trailers(reader)
            return
        async for data in _exactly(reader, size):
            yield data
        if await _read_exactly(reader, 2) != b"\r\n":
            raise HttpError(502, "bad chunk terminator")


# (_copy_exactly and _copy_chunked do for every unfiltered body what _pieces does
# here, without an async generator: one costs a microsecond or so per response)
async def _exactly(reader: aio.StreamReader, length: int) -> AsyncIterator[bytes]:
    while length:
        data = await reader.read(min(length, CHUNK))
        if not data:
            raise HttpError(502, "body ended early")
        length -= len(data)
        yield data
