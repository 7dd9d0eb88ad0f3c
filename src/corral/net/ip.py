"""IP addresses and networks, as the network rules need them, without ``ipaddress``.

``ipaddress`` pulls in ``functools`` and ``collections``: about 4 ms on every
networked run, in corral's process and again in the proxy, for what is here a
few parses and integer comparisons.  Parsing is the C library's
(``inet_pton``), which accepts exactly the addresses ``ipaddress.ip_address``
does apart from IPv6 zones (``fe80::1%eth0``): callers strip a zone first, as
a zone picks an interface and is never the client's choice.  Text is written
as ``ipaddress`` writes it (dotted quads; RFC 5952 for IPv6), so every name
and audit line reads the same as before.  The one question that needs
``ipaddress``'s registry tables, whether an address is internal (the
rebinding guard), imports it then (:func:`is_internal`).
``tests/unit/test_net_ip.py`` checks this module against ``ipaddress``.
"""

from __future__ import annotations

import _socket

_V4_BITS = 32
_V6_BITS = 128
_MAPPED = 0xFFFF << 32  # ::ffff:0:0/96, an IPv4 address written as IPv6


class IP:
    """One address: ``version`` 4 or 6 and its value as an integer."""

    __slots__ = ("value", "version")

    def __init__(self, version: int, value: int) -> None:
        self.version = version
        self.value = value

    @property
    def bits(self) -> int:
        return _V4_BITS if self.version == 4 else _V6_BITS

    @property
    def packed(self) -> bytes:
        return self.value.to_bytes(self.bits // 8, "big")

    @property
    def ipv4_mapped(self) -> IP | None:
        """The IPv4 address of ``::ffff:a.b.c.d``, else None."""
        if self.version == 6 and self.value >> 32 == 0xFFFF:
            return IP(4, self.value & 0xFFFFFFFF)
        return None

    @property
    def is_loopback(self) -> bool:
        if self.version == 4:
            return self.value >> 24 == 127
        return self.value == 1

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IP) and (self.version, self.value) == (other.version, other.value)

    def __hash__(self) -> int:
        return hash((self.version, self.value))

    def __str__(self) -> str:
        if self.version == 4:
            return _socket.inet_ntop(_socket.AF_INET, self.packed)
        return _v6_text(self.value)

    def __repr__(self) -> str:
        return f"IP({str(self)!r})"


class Net:
    """One network: the address with its host bits cleared, and the prefix length."""

    __slots__ = ("base", "prefix", "version")

    def __init__(self, version: int, base: int, prefix: int) -> None:
        self.version = version
        self.base = base
        self.prefix = prefix

    @property
    def bits(self) -> int:
        return _V4_BITS if self.version == 4 else _V6_BITS

    @property
    def network_address(self) -> IP:
        return IP(self.version, self.base)

    @property
    def num_addresses(self) -> int:
        return 1 << (self.bits - self.prefix)

    def __contains__(self, addr: object) -> bool:
        if not isinstance(addr, IP) or addr.version != self.version:
            return False
        return addr.value >> (self.bits - self.prefix) == self.base >> (self.bits - self.prefix)

    def overlaps(self, other: Net) -> bool:
        if other.version != self.version:
            return False
        shift = self.bits - min(self.prefix, other.prefix)
        return self.base >> shift == other.base >> shift

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Net) and (self.version, self.base, self.prefix) == (
            other.version,
            other.base,
            other.prefix,
        )

    def __hash__(self) -> int:
        return hash((self.version, self.base, self.prefix))

    def __str__(self) -> str:
        return f"{IP(self.version, self.base)}/{self.prefix}"

    def __repr__(self) -> str:
        return f"Net({str(self)!r})"


def address(text: str) -> IP:
    """The address ``text`` spells (ValueError if none; no zone)."""
    try:
        return IP(4, int.from_bytes(_socket.inet_pton(_socket.AF_INET, text), "big"))
    except (OSError, TypeError, ValueError):
        pass
    if ":" in text:
        try:
            return IP(6, int.from_bytes(_socket.inet_pton(_socket.AF_INET6, text), "big"))
        except (OSError, TypeError, ValueError):
            pass
    raise ValueError(f"{text!r} does not appear to be an IPv4 or IPv6 address")


def v4(text: str) -> IP | None:
    """An IPv4 address, else None."""
    try:
        return IP(4, int.from_bytes(_socket.inet_pton(_socket.AF_INET, text), "big"))
    except (OSError, TypeError, ValueError):
        return None


def v6(text: str) -> IP | None:
    """An IPv6 address (no zone), else None."""
    try:
        return IP(6, int.from_bytes(_socket.inet_pton(_socket.AF_INET6, text), "big"))
    except (OSError, TypeError, ValueError):
        return None


def is_address(text: str) -> bool:
    try:
        address(text)
    except ValueError:
        return False
    return True


def unmapped(addr: IP) -> IP:
    """::ffff:1.2.3.4 is 1.2.3.4: IPv4 rules must see it as such."""
    return addr.ipv4_mapped or addr


def network(text: str, strict: bool = True) -> Net:
    """``ADDRESS`` or ``ADDRESS/PREFIX`` as ``ipaddress.ip_network`` reads it
    (``strict``: host bits must be clear); ValueError otherwise."""
    base_text, slash, prefix_text = text.partition("/")
    addr = address(base_text)
    if not slash:
        return Net(addr.version, addr.value, addr.bits)
    if not (prefix_text.isascii() and prefix_text.isdigit()):
        return _masked(text, strict)  # a netmask or hostmask (IPv4): ipaddress knows them
    prefix = int(prefix_text)
    if prefix > addr.bits:
        raise ValueError(f"{prefix_text!r} is not a valid netmask")
    host_bits = addr.bits - prefix
    base = addr.value >> host_bits << host_bits
    if strict and base != addr.value:
        raise ValueError(f"{text!r} has host bits set")
    return Net(addr.version, base, prefix)


def _masked(text: str, strict: bool) -> Net:
    import ipaddress

    net = ipaddress.ip_network(text, strict=strict)
    return Net(net.version, int(net.network_address), net.prefixlen)


_NAT64 = Net(6, 0x64FF9B << 96, 96)  # 64:ff9b::/96, the well-known NAT64 prefix


def embedded_v4(addr: IP) -> IP | None:
    """The IPv4 address a 6to4 (2002:AABB:CCDD::/48) or NAT64 (64:ff9b::a.b.c.d)
    address stands for, else None."""
    if addr.version != 6:
        return None
    if addr.value >> 112 == 0x2002:
        return IP(4, (addr.value >> 80) & 0xFFFFFFFF)
    if addr in _NAT64:
        return IP(4, addr.value & 0xFFFFFFFF)
    return None


def is_internal(addr: IP, metadata: frozenset[IP], cgnat: Net) -> bool:
    """Loopback, private, link-local, unspecified, multicast, reserved, CGNAT or a
    cloud metadata endpoint: ``ipaddress``'s registry tables decide."""
    import ipaddress

    mapped = addr.ipv4_mapped
    if mapped is not None:
        addr = mapped
    if addr in metadata or addr in cgnat:
        return True
    inner = embedded_v4(addr)
    if inner is not None and is_internal(inner, metadata, cgnat):
        return True  # a 6to4 relay or a NAT64 translator would take it to that address
    std = ipaddress.ip_address(addr.packed)
    return bool(
        std.is_loopback
        or std.is_private
        or std.is_link_local
        or std.is_unspecified
        or std.is_multicast
        or std.is_reserved
    )


def _v6_text(value: int) -> str:
    """RFC 5952, as ``ipaddress`` writes it: lowercase hextets without leading
    zeros, the longest run of two or more zero hextets (the first of equals) as ``::``."""
    hextets = [(value >> (112 - 16 * i)) & 0xFFFF for i in range(8)]
    best_start, best_len = -1, 1
    start, run = -1, 0
    for i, h in enumerate(hextets):
        if h == 0:
            if run == 0:
                start = i
            run += 1
            if run > best_len:
                best_start, best_len = start, run
        else:
            run = 0
    words = [f"{h:x}" for h in hextets]
    if best_start < 0:
        return ":".join(words)
    head = ":".join(words[:best_start])
    tail = ":".join(words[best_start + best_len :])
    return f"{head}::{tail}"
