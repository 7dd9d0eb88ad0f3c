"""corral.net.ip against ipaddress: the same addresses, networks, text and
classification (the rebinding guard's), on fixed edge cases and on many
random inputs."""

from __future__ import annotations

import ipaddress
import random

import pytest

from corral.net import ip
from corral.net.rules import CGNAT, METADATA

EDGES = [
    "1.2.3.4",
    "0.0.0.0",
    "255.255.255.255",
    "01.2.3.4",
    "1.2.3.04",
    "256.1.1.1",
    "1.2.3",
    "1.2.3.4.5",
    " 1.2.3.4",
    "0x1.2.3.4",
    "\uff11.\uff12.\uff13.\uff14",  # full-width digits
    "::",
    "::1",
    "::ffff:1.2.3.4",
    "::ffff:01.2.3.4",
    "::1.2.3.4",
    "1::2::3",
    "1:2:3:4:5:6:7:8",
    "1:2:3:4:5:6:7:8:9",
    "1:0:0:2:0:0:0:3",
    "1:0:0:2:0:0:3:4",
    "0:0:1:0:0:1:0:0",
    "2001:db8::",
    "2001:DB8:0:0:0:0:0:1",
    "fe80::1",
    "::g",
    "",
    "example.org",
]


def _std(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        found = ipaddress.ip_address(text)
    except ValueError:
        return None
    return None if getattr(found, "scope_id", None) else found


def _mine(text: str) -> ip.IP | None:
    try:
        return ip.address(text)
    except ValueError:
        return None


def _random_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        if rng.random() < 0.5:
            value = rng.getrandbits(32)
            parts = [str((value >> s) & 255) for s in (24, 16, 8, 0)]
            out.append(".".join(parts))
        else:
            hextets = [rng.choice([0, 0, 0, 1, 0xFFFF, rng.getrandbits(16)]) for _ in range(8)]
            full = ipaddress.IPv6Address(b"".join(h.to_bytes(2, "big") for h in hextets))
            out.append(rng.choice([str(full), full.exploded, full.exploded.upper()]))
    chars = "0123456789abcdef:."
    out += ["".join(rng.choice(chars) for _ in range(rng.randint(1, 14))) for _ in range(count)]
    return out


@pytest.mark.parametrize("text", EDGES)
def test_edge_addresses_parse_and_print_as_ipaddress(text: str) -> None:
    std, mine = _std(text), _mine(text)
    assert (std is None) == (mine is None)
    if std is not None and mine is not None:
        assert str(mine) == str(std)
        assert mine.packed == std.packed
        assert mine.is_loopback == std.is_loopback


def test_random_addresses_parse_and_print_as_ipaddress() -> None:
    for text in _random_texts(3000, 7):
        std, mine = _std(text), _mine(text)
        assert (std is None) == (mine is None), text
        if std is not None and mine is not None:
            assert str(mine) == str(std), text
            mapped = std.ipv4_mapped if isinstance(std, ipaddress.IPv6Address) else None
            assert str(ip.unmapped(mine)) == str(mapped or std), text


def test_a_zone_is_no_address() -> None:
    assert _mine("fe80::1%eth0") is None  # callers strip a zone first


@pytest.mark.parametrize(
    "text",
    ["10.0.0.0/8", "10.1.2.3/8", "1.2.3.4", "1.2.3.4/32", "0.0.0.0/0", "::/0", "fd00::/8",
     "fe80::1/64", "::1/128", "10.0.0.0/255.0.0.0", "10.0.0.0/0.255.255.255", "1.2.3.4/33",
     "::/129", "1.2.3.4/-1", "1.2.3.4/ 8", "1.2.3.4/8/8", "x/8"],
)  # fmt: skip
def test_networks_as_ipaddress(text: str) -> None:
    for strict in (True, False):
        try:
            std = ipaddress.ip_network(text, strict=strict)
        except ValueError:
            with pytest.raises(ValueError):
                ip.network(text, strict)
            continue
        mine = ip.network(text, strict)
        assert str(mine) == str(std)
        assert mine.num_addresses == std.num_addresses


def test_membership_and_overlap_as_ipaddress() -> None:
    nets = ["10.0.0.0/8", "10.1.0.0/16", "192.168.0.0/16", "0.0.0.0/0", "127.0.0.1/32",
            "fd00::/8", "::/0", "::1/128", "2001:db8::/32"]  # fmt: skip
    texts = [*_random_texts(500, 11), "10.1.2.3", "127.0.0.1", "::1", "fd12::1", "2001:db8::5"]
    for net_text in nets:
        std_net, my_net = ipaddress.ip_network(net_text), ip.network(net_text)
        for text in texts:
            std, mine = _std(text), _mine(text)
            if std is None or mine is None:
                continue
            assert (mine in my_net) == (std.version == std_net.version and std in std_net), text
        for other in nets:
            std_other = ipaddress.ip_network(other)
            same = std_other.version == std_net.version
            assert my_net.overlaps(ip.network(other)) == (same and std_net.overlaps(std_other))


NAT64 = ipaddress.ip_network("64:ff9b::/96")


def test_6to4_and_nat64_forms_of_internal_addresses_are_internal() -> None:
    for text in ("2002:7f00:1::", "2002:a00:1::5", "2002:a9fe:a9fe::", "64:ff9b::7f00:1"):
        assert ip.is_internal(ip.address(text), METADATA, CGNAT), text
    # the twin: 6to4 of a public address (NAT64's prefix lies in ::/8, reserved: all internal)
    assert not ip.is_internal(ip.address("2002:808:808::"), METADATA, CGNAT)


def test_internal_as_the_rebinding_guard_always_said() -> None:
    def old(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            return old(addr.ipv4_mapped)
        if isinstance(addr, ipaddress.IPv6Address):  # 6to4 and NAT64: the IPv4 inside
            inner = addr.sixtofour
            if inner is None and addr in NAT64:
                inner = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
            if inner is not None and old(inner):
                return True
        metadata = {ipaddress.ip_address(str(a)) for a in METADATA}
        cgnat = ipaddress.ip_network(str(CGNAT))
        return (
            addr in metadata
            or addr.is_loopback
            or addr.is_private
            or addr.is_link_local
            or addr.is_unspecified
            or addr.is_multicast
            or addr.is_reserved
            or (isinstance(addr, ipaddress.IPv4Address) and addr in cgnat)
        )

    extra = ["169.254.169.254", "100.64.1.1", "::ffff:10.0.0.1", "8.8.8.8", "2606:4700::1111"]
    extra += ["2002:7f00:1::", "2002:808:808::", "64:ff9b::a00:1", "64:ff9b::808:808"]
    texts = [*_random_texts(2000, 5), *extra, "fd00:ec2::254"]
    for text in texts:
        std, mine = _std(text), _mine(text)
        if std is None or mine is None:
            continue
        assert ip.is_internal(mine, METADATA, CGNAT) == old(std), text
