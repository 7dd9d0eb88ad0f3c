"""The transparent mode's DNS: allowed names get a stand-in address, others NXDOMAIN.

A sandbox in transparent mode sends its DNS queries to the proxy (through the
relay and the door).  The proxy answers an allowed name with an address from
a private pool (198.18.0.0/15, reserved for benchmarking) and remembers the
pairing; when the sandbox then connects to that address, the captured
connection is mapped back to the name.  The sandbox never learns a real
address, so it cannot aim at one, and names the policy does not allow do not
resolve at all.
"""

from __future__ import annotations

import ipaddress
import struct

POOL = ipaddress.ip_network("198.18.0.0/15")
TTL = 5
TYPE_A = 1
TYPE_AAAA = 28
RCODE_NXDOMAIN = 3
RCODE_FORMERR = 1
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
        address = str(POOL.network_address + self._next)
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


def answer(query: Query, address: str | None, rcode: int = 0) -> bytes:
    """A response: one A record for ``address``, or an empty answer / error code."""
    records = b""
    if address is not None and rcode == 0 and query.qtype == TYPE_A:
        records = (
            b"\xc0\x0c"  # pointer to the question's name
            + struct.pack("!HHIH", TYPE_A, 1, TTL, 4)
            + ipaddress.IPv4Address(address).packed
        )
    flags = 0x8180 | rcode  # response, recursion desired and available
    count = 1 if records else 0
    return struct.pack("!HHHHHH", query.id, flags, 1, count, 0, 0) + query.question + records


def error_reply(packet: bytes, rcode: int) -> bytes:
    """Reply to something that did not parse: echo the id, no question."""
    ident = struct.unpack("!H", packet[:2])[0] if len(packet) >= 2 else 0
    return struct.pack("!HHHHHH", ident, 0x8180 | rcode, 0, 0, 0, 0)
