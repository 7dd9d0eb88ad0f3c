"""DNS messages for the sandbox's resolver: a name the policy refuses gets NXDOMAIN.

The sandbox's ``/etc/resolv.conf`` names a resolver on its own loopback whose
socket the proxy serves (or, in a container, the relay forwards through the
door).  A name the policy allows is answered with the addresses the proxy's
own resolver finds for it (those the rebinding guard lets through), or, in
transparent mode, with a stand-in from a private pool (198.18.0.0/15,
reserved for benchmarking) whose pairing the proxy remembers: a captured
connection to that address is mapped back to the name, so the sandbox never
learns a real address to aim at.  Names the policy does not allow do not
resolve at all, and each refusal is an audit line with its rule.
"""

from __future__ import annotations

import struct

from corral.net import ip

POOL = ip.network("198.18.0.0/15")
TTL = 5
TYPE_A = 1
TYPE_AAAA = 28
TYPE_PTR = 12
TYPE_NAMES = {
    TYPE_A: "A",
    TYPE_AAAA: "AAAA",
    5: "CNAME",
    15: "MX",
    16: "TXT",
    33: "SRV",
    65: "HTTPS",
}
RCODE_NXDOMAIN = 3
RCODE_FORMERR = 1
RCODE_SERVFAIL = 2
RCODE_REFUSED = 5


class FakePool:
    """name <-> stand-in address, stable for the life of one run."""

    def __init__(self) -> None:
        self.by_name: dict[str, str] = {}
        self.by_address: dict[str, str] = {}
        self._next = 1

    def address_for(self, name: str) -> str:
        existing = self.by_name.get(name)
        if existing is not None:
            return existing
        if self._next >= POOL.num_addresses - 1:
            raise RuntimeError("stand-in address pool exhausted")
        address = str(ip.IP(POOL.version, POOL.base + self._next))
        self._next += 1
        self.by_name[name] = address
        self.by_address[address] = name
        return address

    def name_for(self, address: str) -> str | None:
        return self.by_address.get(address)


class Query:
    __slots__ = ("id", "name", "qtype", "question")

    def __init__(self, ident: int, name: str, qtype: int, question: bytes) -> None:
        self.id = ident
        self.name = name
        self.qtype = qtype
        self.question = question  # the raw question section, echoed in the answer


def parse_query(packet: bytes) -> Query | None:
    """The first question of a standard query, or None if it is not one."""
    if len(packet) < 12:
        return None
    ident, flags, qdcount = struct.unpack("!HHH", packet[:6])
    if flags & 0x8000 or (flags >> 11) & 0xF != 0 or qdcount < 1:
        return None
    labels = []
    at = 12
    while True:
        if at >= len(packet):
            return None
        size = packet[at]
        if size == 0:
            at += 1
            break
        if size & 0xC0:  # compression is not used in questions we accept
            return None
        label = packet[at + 1 : at + 1 + size]
        if b"." in label:  # joined with dots it would read as other labels
            return None
        labels.append(label)
        at += 1 + size
    if at + 4 > len(packet):
        return None
    qtype, _qclass = struct.unpack("!HH", packet[at : at + 4])
    try:  # as sent: the proxy normalizes (and refuses) it like any other name
        name = b".".join(labels).decode("ascii")
    except UnicodeDecodeError:
        return None
    return Query(ident, name, qtype, packet[12 : at + 4])


# The sandbox's own hostname (bwrap --hostname, the container's, the guest's).
# It is no host anywhere: tools that look it up (Python's socket.getfqdn, Java's
# getLocalHost, `hostname -f`, git on some setups) get loopback, as a host's
# /etc/hosts gives its own name, and no lookup of it is refused or reported.
SANDBOX_HOSTNAME = "corral"
OWN_ADDRESSES = ("127.0.0.1", "::1")


# The reverse names of loopback (what getfqdn asks next): answered with no record.
LOOPBACK_REVERSE = ("1." + "0." * 31 + "ip6.arpa", ".127.in-addr.arpa")


def own_name(query: Query) -> bool:
    """Does ``query`` ask for the sandbox's own hostname (answered with OWN_ADDRESSES)
    or for loopback's name (a reverse lookup)?  Neither is a host to decide on."""
    name = query.name.rstrip(".").lower()
    return (
        name == SANDBOX_HOSTNAME
        or name == LOOPBACK_REVERSE[0]
        or name.endswith(LOOPBACK_REVERSE[1])
    )


def answer(query: Query, addresses: list[str] | str | None, rcode: int = 0) -> bytes:
    """A response: one record per address of the asked type (A or AAAA; others are
    skipped), or an empty answer / error code."""
    if isinstance(addresses, str):
        addresses = [addresses]
    records = b""
    count = 0
    for address in (addresses or []) if rcode == 0 else []:
        packed = _packed(address, query.qtype)
        if packed is None:
            continue
        records += (
            b"\xc0\x0c"  # pointer to the question's name
            + struct.pack("!HHIH", query.qtype, 1, TTL, len(packed))
            + packed
        )
        count += 1
    flags = 0x8180 | rcode  # response, recursion desired and available
    return struct.pack("!HHHHHH", query.id, flags, 1, count, 0, 0) + query.question + records


def _packed(address: str, qtype: int) -> bytes | None:
    """The record data of ``address`` if it answers a question of type ``qtype``."""
    try:
        found = ip.address(address)
    except ValueError:
        return None
    if qtype == TYPE_A and found.version == 4:
        return found.packed
    if qtype == TYPE_AAAA and found.version == 6:
        return found.packed
    return None


def answers(address: str, qtype: int) -> bool:
    """Whether ``address`` is a record of the asked type."""
    return _packed(address, qtype) is not None


def type_name(qtype: int) -> str:
    return TYPE_NAMES.get(qtype, f"TYPE{qtype}")


def error_reply(packet: bytes, rcode: int) -> bytes:
    """Reply to something that did not parse: echo the id, no question."""
    ident = struct.unpack("!H", packet[:2])[0] if len(packet) >= 2 else 0
    return struct.pack("!HHHHHH", ident, 0x8180 | rcode, 0, 0, 0, 0)
