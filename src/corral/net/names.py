"""One spelling per destination: the string that is decided on *and* dialled.

Every host a client names (an HTTP target, a CONNECT authority, a SOCKS5
domain, a Host header or TLS server name seen in transparent mode, a DNS
question) goes through :func:`normalize` exactly once, and only its result is
used afterwards: by the hook chain, the pinned ``[network] hosts`` lookup, the
resolver and the socket connect.  A check that reads one spelling while the
connector reads another is how ``evil.test\\0.wild.test`` once passed a
``*.wild.test`` rule and then dialled ``evil.test`` (the C resolver stops at
the NUL).

What normalizing does, in order:

* strips surrounding spaces and tabs; any other control character (NUL,
  CR, LF, DEL, C1) anywhere is refused, not stripped;
* ``[v6]`` loses its brackets; an IPv6 zone suffix (``%eth0``, ``%25eth0``)
  is dropped, so the address checked is the address dialled; an address
  comes out in its canonical form (``::ffff:1.2.3.4`` becomes ``1.2.3.4``);
* a name is converted to A-labels with Python's own ``idna`` codec (IDNA
  2003 with nameprep: full-width letters and the ideographic full stop
  U+3002 become ASCII letters and dots), lower-cased, and loses one
  trailing dot;
* the result must be a DNS name: labels of 1-63 characters from
  ``a-z 0-9 - _``, 253 characters in all, a last label that is not a number
  (``127.1``, ``0x7f.1`` and ``2130706433`` are addresses to the C resolver
  but not to ``ipaddress``: refused rather than guessed at).

Python's codec and not the ``idna`` package: ``idna`` is not one of corral's
dependencies (it arrives only with the optional ``mcp`` extra), and what
matters here is that the decision and the connection use the same string,
which any one codec guarantees.
"""

from __future__ import annotations

MAX_NAME = 253
MAX_LABEL = 63
MAX_RAW = 1024  # longer input is refused before any Unicode work is spent on it
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")
_HEX = frozenset("0123456789abcdef")
_CACHE: dict[str, str] = {}
_CACHE_SIZE = 4096


class BadName(ValueError):
    """A host that cannot be one destination; ``reason`` says why, for the client."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def normalize(raw: str) -> str:
    """The one spelling of ``raw`` (a name or an address); raises :class:`BadName`."""
    cached = _CACHE.get(raw)
    if cached is not None:  # keep-alive clients name the same host thousands of times
        return cached
    host = _normalize(raw)
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.clear()
    _CACHE[raw] = host
    return host


def _normalize(raw: str) -> str:
    if len(raw) > MAX_RAW:
        raise BadName("host name too long")
    text = raw.strip(" \t")
    for ch in text:
        code = ord(ch)
        if code < 0x20 or 0x7F <= code <= 0x9F:
            raise BadName("control character in host name")
    if not text:
        raise BadName("empty host name")
    if text.startswith("[") or text.count(":") > 1:
        return _address_v6(text)
    if ":" in text:
        raise BadName("':' in host name (a port belongs outside the host)")
    address = _address_v4(text)
    if address is not None:
        return address
    return _name(text)


def _address_v6(text: str) -> str:
    from corral.net import ip

    inner = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    inner = inner.split("%", 1)[0]  # a zone picks an interface: never the client's choice
    address = ip.v6(inner)
    if address is None:
        raise BadName("not a valid IPv6 address")
    return str(ip.unmapped(address))


def _address_v4(text: str) -> str | None:
    if not text[-1:].isdigit():
        return None
    from corral.net import ip

    address = ip.v4(text)  # None: checked as a name (a numeric last label is refused there)
    return str(address) if address is not None else None


def _name(text: str) -> str:
    if text.isascii():
        name = text.lower()
    else:
        try:
            name = text.encode("idna").decode("ascii").lower()
        except UnicodeError as exc:
            raise BadName(f"not a valid international host name ({_why(exc)})") from None
        address = _address_v4(name)  # e.g. full-width digits
        if address is not None:
            return address
    if name.endswith("."):
        name = name[:-1]
    if not name:
        raise BadName("empty host name")
    if len(name) > MAX_NAME:
        raise BadName(f"host name longer than {MAX_NAME} characters")
    labels = name.split(".")
    for label in labels:
        if not label:
            raise BadName("empty label in host name")
        if len(label) > MAX_LABEL:
            raise BadName(f"label longer than {MAX_LABEL} characters in host name")
        if not _NAME_CHARS.issuperset(label):
            raise BadName("character not allowed in a host name")
    last = labels[-1]
    if last.isdigit() or (last.startswith("0x") and _HEX.issuperset(last[2:])):
        raise BadName("numeric host that is not a plain address (use a.b.c.d)")
    return name


def _why(exc: UnicodeError) -> str:
    text = str(exc)
    return text.rpartition("(")[2].rstrip(")") or text


def decode(raw: bytes) -> str:
    """Host bytes off the wire as text: UTF-8 or refused (never replaced)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadName("host name is not valid UTF-8") from None


def printable(raw: str | bytes, limit: int = 300) -> str:
    """A refused host as it may be logged and shown: escapes instead of control
    characters and invisible Unicode, so a terminal never interprets it."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "backslashreplace")
    text = raw[:limit].encode("unicode_escape").decode("ascii")
    return text + "..." if len(raw) > limit else text


def is_address(host: str) -> bool:
    """Whether a normalized host is an address, not a name (normalize() turned every
    numeric spelling into one form: IPv6 holds a colon, IPv4 ends in digits)."""
    return ":" in host or host.rpartition(".")[2].isdigit()


def authority(host: str, port: int, default_port: int) -> str:
    """``host[:port]`` for a Host header, from a normalized host."""
    shown = f"[{host}]" if ":" in host else host
    return shown if port == default_port else f"{shown}:{port}"
