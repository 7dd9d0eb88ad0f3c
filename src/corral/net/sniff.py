"""Name the destination of a captured connection from its first bytes (pure).

In transparent mode a client did not tell a proxy where it goes; its first
bytes usually do: a TLS ClientHello carries the server name (SNI), an HTTP/1
request carries a Host header.  Neither is trusted to pick the *address*: the
proxy resolves the name itself.
"""

from __future__ import annotations

import struct


def tls_server_name(data: bytes) -> str | None:
    """SNI host name of a TLS ClientHello at the start of ``data``, if complete."""
    try:
        if len(data) < 5 or data[0] != 0x16 or data[1] != 0x03:
            return None
        (record_len,) = struct.unpack("!H", data[3:5])
        body = data[5 : 5 + record_len]
        if len(body) < 4 or body[0] != 0x01:  # handshake type: client_hello
            return None
        at = 4 + 2 + 32  # handshake header, client_version, random
        session_len = body[at]
        at += 1 + session_len
        (suites_len,) = struct.unpack("!H", body[at : at + 2])
        at += 2 + suites_len
        compression_len = body[at]
        at += 1 + compression_len
        (extensions_len,) = struct.unpack("!H", body[at : at + 2])
        at += 2
        end = min(len(body), at + extensions_len)
        while at + 4 <= end:
            ext_type, ext_len = struct.unpack("!HH", body[at : at + 4])
            at += 4
            if ext_type == 0:  # server_name
                names = body[at : at + ext_len]
                pos = 2
                while pos + 3 <= len(names):
                    kind = names[pos]
                    (name_len,) = struct.unpack("!H", names[pos + 1 : pos + 3])
                    if kind == 0:  # the normalizer decides what is acceptable in it
                        raw = names[pos + 3 : pos + 3 + name_len]
                        return raw.decode("utf-8", "surrogateescape")
                    pos += 3 + name_len
                return None
            at += ext_len
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
    return None


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
    return _request_head(data) is not None


def raw_http_host(data: bytes) -> str | None:
    """The first Host header's value as sent, for logging a refusal."""
    for line in _request_head(data) or []:
        name, colon, value = line.partition(b":")
        if colon and name.strip().lower() == b"host":
            return value.strip().decode("utf-8", "surrogateescape")
    return None


def http_host(data: bytes) -> str | None:
    """Host header of an HTTP/1 request at the start of ``data`` (without port).

    Raises BadName when the head names its host ambiguously: two Host headers
    (we would decide on one, the origin might serve the other) or a value that
    is no authority."""
    from corral.net.http1 import HttpError, split_authority
    from corral.net.names import BadName

    values = []
    for line in _request_head(data) or []:
        name, colon, value = line.partition(b":")
        if colon and name.strip().lower() == b"host":
            values.append(value.strip(b" \t"))
    if not values:
        return None
    if len(values) > 1:
        raise BadName("more than one Host header")
    try:
        return split_authority(values[0], 80)[0]
    except HttpError as exc:
        raise BadName(f"bad Host header: {exc.message}") from None


def looks_complete(data: bytes) -> bool:
    """Enough bytes to decide: a whole TLS record, or a whole HTTP head."""
    if data[:1] == b"\x16" and len(data) >= 5:
        record_len: int = struct.unpack("!H", data[3:5])[0]
        return len(data) >= 5 + record_len
    return b"\r\n\r\n" in data
