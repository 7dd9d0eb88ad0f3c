"""Name the destination of a captured connection from its first bytes (pure).

In transparent mode a client did not tell a proxy where it goes; its first
bytes usually do: a TLS ClientHello carries the server name (SNI), an HTTP/1
request carries a Host header.  Neither is trusted to pick the *address*: the
proxy resolves the name itself.

The same bytes guard an opaque tunnel: a CONNECT (or SOCKS5) to an allowed
name whose ClientHello or Host asks for another name is domain fronting, since
a CDN routes by what the client asks for, not by the address it dialled.
:func:`claim` reads them fail-closed: bytes that start like TLS or HTTP but
cannot be read (a ClientHello split over records it cannot join, a request
line still unfinished when time runs out) are *unreadable*, never "no name".
"""

from __future__ import annotations

import struct

TLS_HANDSHAKE = 0x16
MAX_HELLO = 16 * 1024  # bigger than any real ClientHello (post-quantum key shares: ~2 KB)
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class Claim:
    """What a client's first bytes ask for.  ``state``: "wait" (more bytes could
    change the answer), "names" (every name they give, raw), "none" (they give no
    name: another protocol, or TLS without SNI) or "unreadable" (``reason``).
    ``http``: the bytes are an HTTP/1 request head (the proxy then serves the
    connection request by request).  (A plain class: the proxy's hot path does
    not import typing.)"""

    __slots__ = ("http", "names", "reason", "state")

    def __init__(
        self, state: str, names: tuple[str, ...] = (), reason: str = "", http: bool = False
    ) -> None:
        self.state = state
        self.names = names
        self.reason = reason
        self.http = http

    def __repr__(self) -> str:
        return f"Claim({self.state!r}, {self.names!r}, {self.reason!r})"


WAIT = Claim("wait")
NONE = Claim("none")
# A PROXY protocol header (v1 text, v2 binary) before the client's own bytes: an
# origin that reads one (nginx proxy_protocol, HAProxy, Envoy) takes the address
# it names and routes by what follows, which the "none" of another protocol let
# through unread (a fronted request for another host, found by attacking corral).
PROXY_V1 = b"PROXY "
PROXY_V2 = b"\r\n\r\n\x00\r\nQUIT\n"
_PROXY_HEADER = Claim("unreadable", reason="a PROXY protocol header before the client's bytes")


def claim(data: bytes, final: bool = False) -> Claim:
    """The names ``data`` asks for; ``final``: no more bytes will come in time
    (then an unfinished ClientHello or request head is unreadable, not a wait)."""
    if not data:
        return NONE if final else WAIT
    if data[:6] == PROXY_V1 or data[:12] == PROXY_V2:
        return _PROXY_HEADER
    if len(data) < 12 and PROXY_V2.startswith(data):
        return Claim("unreadable", reason="an unfinished PROXY protocol header") if final else WAIT
    found = _tls_claim(data) if data[0] == TLS_HANDSHAKE else _http_claim(data)
    if found.state == "wait" and final:
        what = "ClientHello" if data[0] == TLS_HANDSHAKE else "HTTP request head"
        return Claim("unreadable", reason=f"an unfinished {what}")
    return found


def _tls_claim(data: bytes) -> Claim:
    """Join the handshake records at the start of ``data`` into the ClientHello
    (a client may split it over several, and servers join them), then read its SNI."""
    if len(data) >= 9 and data[1] == 0x03 and data[5] == 0x01:  # the usual: one record
        size = int.from_bytes(data[3:5], "big")
        length = int.from_bytes(data[6:9], "big")
        if size == length + 4 and len(data) >= 5 + size:
            return _names_claim(data[9 : 5 + size])
    hello = b""
    at = 0
    while len(hello) < 4 or len(hello) < 4 + int.from_bytes(hello[1:4], "big"):
        if len(data) < at + 5:
            return WAIT
        if data[at] != TLS_HANDSHAKE or data[at + 1] != 0x03:
            return Claim("unreadable", reason="a TLS record that is not the ClientHello's")
        (size,) = struct.unpack("!H", data[at + 3 : at + 5])
        if len(data) < at + 5 + size:
            return WAIT
        hello += data[at + 5 : at + 5 + size]
        at += 5 + size
        if hello[:1] not in (b"", b"\x01"):
            return Claim("unreadable", reason="a TLS handshake that is not a ClientHello")
        if len(hello) >= 4 and int.from_bytes(hello[1:4], "big") > MAX_HELLO:
            return Claim("unreadable", reason="a ClientHello larger than corral reads")
    return _names_claim(hello[4 : 4 + int.from_bytes(hello[1:4], "big")])


def _names_claim(body: bytes) -> Claim:
    try:
        names = _hello_names(body)
    except (IndexError, ValueError, struct.error):
        return Claim("unreadable", reason="a malformed ClientHello")
    return Claim("names", names) if names else NONE


def _hello_names(body: bytes) -> tuple[str, ...]:
    """The host names of a ClientHello's server_name extension (ValueError if it
    is malformed or repeated: a server could read it otherwise than corral)."""
    at = 2 + 32  # client_version, random
    at += 1 + body[at]  # session id
    at += 2 + struct.unpack("!H", body[at : at + 2])[0]  # cipher suites
    at += 1 + body[at]  # compression methods
    if at == len(body):
        return ()  # no extensions at all
    (total,) = struct.unpack("!H", body[at : at + 2])
    at += 2
    if at + total != len(body):
        raise ValueError("extensions length")
    names: list[str] = []
    seen = False
    end = len(body)
    unpack = struct.unpack_from  # (no slice per extension: a ClientHello has about 16)
    while at < end:
        kind, size = unpack("!HH", body, at)
        at += 4 + size
        if at > end:
            raise ValueError("extension length")
        if kind == 0:
            if seen:
                raise ValueError("two server_name extensions")
            seen = True
            names.extend(_server_names(body[at - size : at]))
    if len(names) > 1:
        raise ValueError("more than one host name")
    return tuple(names)


def _server_names(value: bytes) -> list[str]:
    (total,) = struct.unpack("!H", value[:2])
    if total + 2 != len(value):
        raise ValueError("server_name list length")
    names = []
    pos = 2
    while pos < len(value):
        kind = value[pos]
        (size,) = struct.unpack("!H", value[pos + 1 : pos + 3])
        raw = value[pos + 3 : pos + 3 + size]
        if len(raw) != size:
            raise ValueError("server name length")
        if kind == 0:  # the normalizer decides what is acceptable in it
            names.append(raw.decode("utf-8", "surrogateescape"))
        pos += 3 + size
    return names


def _http_claim(data: bytes) -> Claim:
    """An HTTP/1 request's names: its Host and an absolute-form target's authority.
    Bare LF line ends count, as many servers accept them, and so do empty lines
    before the request line, which servers skip."""
    data = data.lstrip(b"\r\n")
    if not data:
        return WAIT
    first, newline, _ = data.partition(b"\n")
    if not newline:
        return WAIT if _request_line_prefix(first) else NONE
    if first.rstrip(b"\r") == b"PRI * HTTP/2.0":
        return Claim("unreadable", reason="cleartext HTTP/2, whose host corral does not read")
    parts = first.split()  # (white space: CR included)
    if len(parts) != 3 or b"\r" in first.rstrip(b"\r") or not parts[2].upper().startswith(b"HTTP/"):
        return _UNREADABLE_LINE if _like_http(parts) else NONE
    if not set(parts[0]) <= _TOKEN:
        return NONE
    hosts: list[bytes] = []
    for line in data.split(b"\n")[1:-1]:  # the last piece has no line end yet
        line = line.rstrip(b"\r")
        if not line:
            return _with_target(parts[1], hosts)
        if line[:1] in (b" ", b"\t"):
            return Claim("unreadable", reason="a folded header line")
        name, colon, value = line.partition(b":")
        if colon and name.strip().lower() == b"host":
            hosts.append(value.strip(b" \t"))
    return WAIT


def _with_target(target: bytes, hosts: list[bytes]) -> Claim:
    """The host names of a complete head: its Host and an absolute-form target."""
    from corral.net.http1 import HttpError, split_authority

    if len(hosts) > 1:
        return Claim("unreadable", reason="more than one Host header")
    scheme, sep, rest = target.partition(b"://")
    if sep and scheme.isalpha():  # servers route by this authority before Host
        hosts.append(rest.split(b"/")[0].split(b"?")[0].split(b"#")[0].rpartition(b"@")[2])
    try:
        names = tuple(split_authority(h, 80)[0] for h in hosts)
    except HttpError as exc:
        return Claim("unreadable", reason=f"a bad Host: {exc.message}")
    return Claim("names" if names else "none", names, http=True)


def _request_line_prefix(data: bytes) -> bool:
    """``data`` (no line end yet) could still become an HTTP/1 request line: a
    method, then anything.  Once a method and a space came, a CR is no reason to
    let the bytes go unread: its LF may come in the next packet (split after the
    CR, a request for another host once passed as "no name")."""
    method = data.partition(b" ")[0]
    return bool(method) and set(method) <= _TOKEN


# Methods a server reads a request line by, whatever else the line holds (with one
# target, HTTP/0.9).  A line of another protocol that begins with one of these
# words, in capitals, then a path is not let through unread.
_METHODS = frozenset((b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"TRACE"))
_UNREADABLE_LINE = Claim("unreadable", reason="an HTTP request line corral cannot read")


def _like_http(parts: list[bytes]) -> bool:
    """A first line a server could take for an HTTP request (a space in the target,
    which some servers accept; a bare CR; an HTTP/0.9 request), though it is not
    one corral reads.  Never "no name": an HTTP server behind the address would
    serve it, for whichever host it asks."""
    if not parts or not set(parts[0]) <= _TOKEN:
        return False
    if any(p.upper().startswith(b"HTTP/") for p in parts[1:]):
        return True
    target = parts[1] if len(parts) > 1 else b""
    return parts[0] in _METHODS and (target[:1] == b"/" or b"://" in target)


def _request_head(data: bytes) -> list[bytes] | None:
    head, sep, _ = data.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.split(b"\r\n")
    if len(lines[0].split(b" ")) != 3:
        return None
    return lines


def is_http_request(data: bytes) -> bool:
    """``data`` begins with a complete HTTP/1 request head (the client can read a status)."""
    return _request_head(data.lstrip(b"\r\n")) is not None
