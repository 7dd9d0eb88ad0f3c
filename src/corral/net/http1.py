"""Strict HTTP/1.1 message heads and body framing for the proxy.

Strict on purpose: a proxy that forwards what it does not understand is a
request-smuggling tool.  Ambiguous framing (both Content-Length and
Transfer-Encoding, conflicting lengths, folded headers, a chunk size that is
not hex) is refused with 400 rather than guessed at.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio

MAX_HEAD = 64 * 1024
CHUNK = 256 * 1024

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
TOKEN_BYTES = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


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
        tokens = {t.strip().lower() for v in self.get_all(b"connection") for t in v.split(b",")}
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
    if not CONTROL.isdisjoint(msg.target):
        raise HttpError(400, "control character in the request target")
    if msg.version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise HttpError(505, "only HTTP/1.0 and HTTP/1.1 are supported")
    _parse_headers(lines[1:], msg)
    return msg


def parse_response(head: bytes) -> Message:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
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


def serialize_head(first_line: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    out = [first_line]
    out += [name + b": " + value for name, value in headers]
    out.append(b"\r\n")
    return b"\r\n".join(out)


def forwardable(msg: Message, kind: str) -> list[tuple[bytes, bytes]]:
    """Headers minus hop-by-hop ones (and any the Connection header names).

    Transfer-Encoding is hop-by-hop, but the proxy forwards chunked bodies as
    they are, so a chunked message keeps ``Transfer-Encoding: chunked``.
    """
    named = {t.strip().lower() for v in msg.get_all(b"connection") for t in v.split(b",")}
    # Connection may not remove what frames the message or names its target:
    # "Connection: content-length" would otherwise smuggle the body as a request.
    drop = HOP_BY_HOP | (named - FRAMING)
    kept = [(k, v) for k, v in msg.headers if k not in drop]
    if kind == "chunked":
        kept.append((b"transfer-encoding", b"chunked"))
    return kept


async def read_head(reader: asyncio.StreamReader, prefix: bytes = b"") -> bytes | None:
    """Up to and without the blank line; None on a clean EOF before any byte.

    ``prefix`` is what the caller already read (the byte used to tell HTTP
    from SOCKS).
    """
    import asyncio

    try:
        data = prefix + await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not (prefix + exc.partial).strip():
            return None
        raise HttpError(400, "connection closed in the middle of a message head") from None
    except asyncio.LimitOverrunError:
        raise HttpError(431, "message head too large") from None
    if data.startswith(b"\r\n"):  # RFC 9112 2.2: ignore a stray CRLF before a request
        data = data.lstrip(b"\r\n")
    return data[:-4]


async def copy_body(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    kind: str,
    length: int,
    head: bytes = b"",
) -> int:
    """Write ``head``, then forward a body framed as ``kind``; returns the body bytes.

    The head goes out with the first piece of the body: for the small bodies a
    proxy mostly sees, one send instead of two.
    """
    import asyncio

    sent = 0
    if head and kind != "length":
        writer.write(head)
        head = b""
    if kind == "length":
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
            sent += len(data)
            if writer.transport.get_write_buffer_size() > CHUNK:
                await writer.drain()
    elif kind == "chunked":
        while True:
            try:
                line = await reader.readuntil(b"\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                raise HttpError(400, "bad chunked body") from None
            size_text = line[:-2].split(b";", 1)[0].strip()
            if (
                not size_text
                or len(size_text) > 16
                or not all(c in b"0123456789abcdefABCDEF" for c in size_text)
                or not CONTROL.isdisjoint(line[:-2])
            ):
                raise HttpError(400, "bad chunk size")
            size = int(size_text, 16)
            clean = b"%x\r\n" % size  # extensions are dropped: nothing to smuggle in them
            writer.write(clean)
            sent += len(clean)
            if size == 0:  # trailers until the empty line
                while True:
                    try:
                        trailer = await reader.readuntil(b"\r\n")
                    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                        raise HttpError(400, "bad chunked trailer") from None
                    if not CONTROL.isdisjoint(trailer[:-2]):
                        raise HttpError(400, "control character in a trailer")
                    writer.write(trailer)
                    sent += len(trailer)
                    if trailer == b"\r\n":
                        break
                break
            try:
                data = await reader.readexactly(size + 2)
            except asyncio.IncompleteReadError:
                raise HttpError(400, "chunked body ended early") from None
            if data[-2:] != b"\r\n":
                raise HttpError(400, "bad chunk terminator")
            writer.write(data)
            sent += len(data)
            if writer.transport.get_write_buffer_size() > CHUNK:
                await writer.drain()
    elif kind == "close":
        while data := await reader.read(CHUNK):
            writer.write(data)
            sent += len(data)
            if writer.transport.get_write_buffer_size() > CHUNK:
                await writer.drain()
    await writer.drain()
    return sent


def split_authority(authority: bytes, default_port: int) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]:port`` -> (host, port); raises HttpError."""
    text = authority.decode("ascii", "replace")
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


def split_absolute(target: bytes) -> tuple[str, str, int, bytes]:
    """``http://host:port/path?q`` -> (authority, host, port, b"/path?q")."""
    scheme, sep, rest = target.partition(b"://")
    if not sep:
        raise HttpError(400, "a proxy request needs an absolute URL (http://host/path)")
    scheme_text = scheme.lower().decode("ascii", "replace")
    if scheme_text != "http":
        raise HttpError(400, f"unsupported scheme {scheme_text!r}: use CONNECT for https")
    slash = rest.find(b"/")
    question = rest.find(b"?")
    cut = min(x for x in (slash, question, len(rest)) if x >= 0)
    authority, path = rest[:cut], rest[cut:]
    if b"@" in authority:
        raise HttpError(400, "credentials in proxy URLs are not forwarded")
    host, port = split_authority(authority, 80)
    if not path.startswith(b"/"):
        path = b"/" + path
    return authority.decode("ascii", "replace"), host, port, path
