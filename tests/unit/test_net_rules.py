"""Tests for corral.net.rules: entry parsing, host/port matching and the rebinding check.

Pure: no DNS, no sockets.  The public-looking addresses below are data only.
"""

from __future__ import annotations

import pytest

from corral.net import ip
from corral.net.rules import HostRules, Rule, Verdict, is_internal, normalize_host

PUBLIC_V4 = "93.184.216.34"
PUBLIC_V6 = "2606:2800:220:1:248:1893:25c8:1946"


def rules(allow: list[str], deny: list[str] | None = None) -> HostRules:
    return HostRules.parse(allow, deny or [])


def allowed(hr: HostRules, host: str, port: int) -> bool:
    return hr.check(host, port).allowed


# -- parsing: every documented form ------------------------------------------------------------


def test_exact_host_any_port() -> None:
    rule = Rule("example.org")
    assert rule.host == "example.org"
    assert rule.wildcard is None
    assert rule.network is None
    assert rule.ports is None
    assert rule.text == "example.org"


def test_host_with_port() -> None:
    rule = Rule("example.org:443")
    assert rule.host == "example.org"
    assert rule.ports == (443, 443)


def test_host_is_normalised_when_parsed() -> None:
    rule = Rule("  Example.ORG.  ")
    assert rule.host == "example.org"


def test_non_ascii_host_becomes_idna() -> None:
    assert Rule("bücher.example").host == "xn--bcher-kva.example"


def test_wildcard_host() -> None:
    rule = Rule("*.example.org")
    assert rule.wildcard == "example.org"
    assert rule.host is None
    assert rule.ports is None


def test_wildcard_host_with_port() -> None:
    rule = Rule("*.example.org:443")
    assert rule.wildcard == "example.org"
    assert rule.ports == (443, 443)


def test_star_is_anything() -> None:
    rule = Rule("*")
    assert rule.wildcard == ""
    assert rule.ports is None


def test_star_with_port() -> None:
    rule = Rule("*:443")
    assert rule.wildcard == ""
    assert rule.ports == (443, 443)


def test_ipv4_address() -> None:
    rule = Rule("192.0.2.7")
    assert rule.network == ip.network("192.0.2.7/32")
    assert rule.host is None
    assert rule.ports is None


def test_ipv4_address_with_port() -> None:
    rule = Rule("192.0.2.7:8080")
    assert rule.network == ip.network("192.0.2.7/32")
    assert rule.ports == (8080, 8080)


def test_ipv4_cidr() -> None:
    assert Rule("10.0.0.0/8").network == ip.network("10.0.0.0/8")


def test_ipv4_cidr_with_port() -> None:
    rule = Rule("10.0.0.0/8:443")
    assert rule.network == ip.network("10.0.0.0/8")
    assert rule.ports == (443, 443)


def test_cidr_with_host_bits_is_widened_not_refused() -> None:
    assert Rule("10.1.2.3/8").network == ip.network("10.0.0.0/8")


def test_ipv6_cidr() -> None:
    assert Rule("fd00::/8").network == ip.network("fd00::/8")


def test_ipv6_cidr_in_brackets_with_port() -> None:
    rule = Rule("[fd00::/8]:443")
    assert rule.network == ip.network("fd00::/8")
    assert rule.ports == (443, 443)


def test_bracketed_ipv6_with_port() -> None:
    rule = Rule("[::1]:8080")
    assert rule.network == ip.network("::1/128")
    assert rule.ports == (8080, 8080)


def test_bracketed_ipv6_without_port() -> None:
    rule = Rule("[::1]")
    assert rule.network == ip.network("::1/128")
    assert rule.ports is None


def test_bare_ipv6() -> None:
    rule = Rule("::1")
    assert rule.network == ip.network("::1/128")
    assert rule.ports is None


def test_bare_ipv6_never_takes_a_port() -> None:
    # "IPv6 with a port needs brackets": ::1:8080 is the address ::1:8080, any port
    rule = Rule("::1:8080")
    assert rule.network == ip.network("::1:8080/128")
    assert rule.ports is None


def test_port_range() -> None:
    rule = Rule("example.org:8000-8999")
    assert rule.ports == (8000, 8999)
    assert not rule.matches_port(7999)
    assert rule.matches_port(8000)
    assert rule.matches_port(8500)
    assert rule.matches_port(8999)
    assert not rule.matches_port(9000)


@pytest.mark.parametrize("text", ["example.org:1", "example.org:65535", "example.org:1-65535"])
def test_port_bounds_accepted(text: str) -> None:
    Rule(text)


# -- parsing: bad forms ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "*.",
        "*.*",
        "**.example.org",
        "a.*.b",
        "ex*ample.org",
        "example.*",
        "host:0",
        "host:70000",
        "host:65536",
        "host:abc",
        "host:",
        "host:-5",
        "host:9000-8000",
        "host:0-80",
        "[::1",
        "[::1]x",
        "[::1]:",
        "[::1]:0",
        "[]",
        "999.1.1.1/8",
        "1.2.3.4/33",
        "fd00::/129",
        "exa mple.org",
        "example.org/path",
        "example.org\\x",
        "http://example.org",
        "a..b",
        "a" * 64 + ".example",
        "example.org:443:80",
    ],
)
def test_bad_entries_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        Rule(text)


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://pypi.org/simple", "pypi.org"),
        ("http://user@registry.test:8080/x?y", "registry.test:8080"),
    ],
)
def test_a_url_is_refused_with_its_host_to_write(url: str, host: str) -> None:
    """It read "bad port in 'https://pypi.org/simple'" (found by trying corral as a
    new user); the twin: the host it names is a rule."""
    with pytest.raises(ValueError, match=f"is a URL: write its host, '{host}'"):
        Rule(url)
    assert Rule(host).matches_name(host.split(":")[0], int(host.partition(":")[2] or 443))


def test_bad_entry_in_a_list_refuses_the_whole_list() -> None:
    with pytest.raises(ValueError):
        HostRules.parse(["example.org", "bad host"], [])
    with pytest.raises(ValueError):
        HostRules.parse([], ["*."])


def test_error_names_the_entry() -> None:
    with pytest.raises(ValueError, match="host:abc"):
        Rule("host:abc")


def test_invalid_ipv4_lookalike_is_refused() -> None:
    # Decision: the code treats it as a host name (digits and dots are valid labels).
    # Either way it is not a usable rule: it can never match an address, and as a name
    # resolvers parse numeric forms inconsistently.  It must be refused.
    with pytest.raises(ValueError):
        Rule("999.1.1.1")


@pytest.mark.parametrize("text", ["*.exa mple.org", "*..org", "*.exa\tmple.org"])
def test_bad_wildcard_suffix_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        Rule(text)


@pytest.mark.parametrize("text", ["host:8_0", "host: 80", "host:+80", "host:5-"])
def test_port_must_be_plain_digits(text: str) -> None:
    with pytest.raises(ValueError):
        Rule(text)


# -- normalize_host ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Example.ORG", "example.org"),
        ("example.org.", "example.org"),
        (" example.org ", "example.org"),
        ("bücher.example", "xn--bcher-kva.example"),
        ("BÜCHER.example.", "xn--bcher-kva.example"),
    ],
)
def test_normalize_host(raw: str, expected: str) -> None:
    assert normalize_host(raw) == expected


# -- check: names ------------------------------------------------------------------------------


def test_default_deny() -> None:
    verdict = rules([]).check("example.org", 443)
    assert not verdict.allowed
    assert verdict.rule == "default"
    assert verdict.decision == "deny"
    assert verdict.reason


def test_exact_host_allowed_any_port() -> None:
    hr = rules(["example.org"])
    verdict = hr.check("example.org", 443)
    assert verdict.allowed
    assert verdict.rule == "example.org"
    assert verdict.decision == "allow"
    assert allowed(hr, "example.org", 80)
    assert allowed(hr, "example.org", 65535)


@pytest.mark.parametrize("host", ["EXAMPLE.org", "example.org.", "Example.Org.", " example.org"])
def test_exact_host_normalised(host: str) -> None:
    assert allowed(rules(["example.org"]), host, 443)


@pytest.mark.parametrize(
    "host", ["www.example.org", "example.com", "example.org.evil", "xexample.org", "example.or"]
)
def test_exact_host_matches_nothing_else(host: str) -> None:
    assert not allowed(rules(["example.org"]), host, 443)


def test_rule_written_in_capitals_matches() -> None:
    assert allowed(rules(["EXAMPLE.org."]), "example.org", 443)


def test_wildcard_matches_subdomains_at_any_depth() -> None:
    hr = rules(["*.example.org"])
    for host in ("a.example.org", "a.b.example.org", "x.y.z.example.org", "A.EXAMPLE.ORG."):
        verdict = hr.check(host, 443)
        assert verdict.allowed, host
        assert verdict.rule == "*.example.org"


@pytest.mark.parametrize(
    "host",
    [
        "example.org",
        "evilexample.org",
        "a.evilexample.org",
        "example.org.evil",
        "org",
        "a-example.org",
    ],
)
def test_wildcard_does_not_match_apex_or_lookalikes(host: str) -> None:
    assert not allowed(rules(["*.example.org"]), host, 443)


def test_apex_and_wildcard_together() -> None:
    hr = rules(["example.org", "*.example.org"])
    assert allowed(hr, "example.org", 443)
    assert allowed(hr, "www.example.org", 443)
    assert not allowed(hr, "evilexample.org", 443)


def test_star_allows_any_name() -> None:
    hr = rules(["*"])
    assert allowed(hr, "anything.example", 1)
    assert allowed(hr, "x", 65535)


def test_port_rule() -> None:
    hr = rules(["example.org:443"])
    assert allowed(hr, "example.org", 443)
    assert not allowed(hr, "example.org", 80)
    assert hr.check("example.org", 80).rule == "default"


def test_wildcard_port_rule() -> None:
    hr = rules(["*.example.org:443"])
    assert allowed(hr, "a.example.org", 443)
    assert not allowed(hr, "a.example.org", 80)


def test_star_port_rule() -> None:
    hr = rules(["*:443"])
    assert allowed(hr, "anything.example", 443)
    assert not allowed(hr, "anything.example", 80)


def test_port_range_rule() -> None:
    hr = rules(["example.org:8000-8999"])
    assert not allowed(hr, "example.org", 7999)
    assert allowed(hr, "example.org", 8000)
    assert allowed(hr, "example.org", 8999)
    assert not allowed(hr, "example.org", 9000)


def test_deny_wins_over_allow() -> None:
    hr = rules(["example.org"], ["example.org"])
    verdict = hr.check("example.org", 443)
    assert not verdict.allowed
    assert verdict.rule == "example.org"
    assert verdict.reason == "denied by rule"


def test_deny_wildcard_beats_allow_exact() -> None:
    hr = rules(["api.example.org"], ["*.example.org"])
    verdict = hr.check("api.example.org", 443)
    assert not verdict.allowed
    assert verdict.rule == "*.example.org"


def test_deny_exact_beats_allow_wildcard() -> None:
    hr = rules(["*.example.org"], ["evil.example.org"])
    assert not allowed(hr, "evil.example.org", 443)
    assert not allowed(hr, "EVIL.example.org.", 443)
    assert allowed(hr, "good.example.org", 443)


def test_deny_star_beats_everything() -> None:
    hr = rules(["example.org", "192.0.2.1"], ["*"])
    assert not allowed(hr, "example.org", 443)
    assert not allowed(hr, "192.0.2.1", 443)


def test_deny_on_one_port_only() -> None:
    hr = rules(["example.org"], ["example.org:80"])
    assert not allowed(hr, "example.org", 80)
    assert allowed(hr, "example.org", 443)


def test_deny_port_range() -> None:
    hr = rules(["*"], ["*:1-1023"])
    assert not allowed(hr, "example.org", 80)
    assert allowed(hr, "example.org", 8080)


def test_first_matching_allow_rule_is_reported() -> None:
    hr = rules(["*.example.org", "*"])
    assert hr.check("a.example.org", 443).rule == "*.example.org"
    assert hr.check("other.example", 443).rule == "*"


# -- check: address literals -------------------------------------------------------------------


def test_ip_literal_needs_an_address_rule() -> None:
    hr = rules(["example.org"])
    verdict = hr.check("192.0.2.7", 80)
    assert not verdict.allowed
    assert verdict.rule == "default"


def test_ip_literal_matches_address_rule() -> None:
    hr = rules(["192.0.2.7"])
    assert hr.check("192.0.2.7", 80).rule == "192.0.2.7"
    assert not allowed(hr, "192.0.2.8", 80)


def test_ip_literal_matches_cidr() -> None:
    hr = rules(["10.0.0.0/8"])
    assert allowed(hr, "10.1.2.3", 80)
    assert allowed(hr, "10.255.255.255", 80)
    assert not allowed(hr, "11.0.0.1", 80)


def test_ip_literal_with_port_rule() -> None:
    hr = rules(["192.0.2.7:8080"])
    assert allowed(hr, "192.0.2.7", 8080)
    assert not allowed(hr, "192.0.2.7", 8081)


def test_ipv6_literal_in_brackets() -> None:
    hr = rules(["[::1]:8080"])
    assert allowed(hr, "[::1]", 8080)
    assert allowed(hr, "::1", 8080)
    assert allowed(hr, "0:0:0:0:0:0:0:1", 8080)
    assert not allowed(hr, "[::1]", 8081)


def test_ipv6_literal_with_zone_is_matched_without_it() -> None:
    assert allowed(rules(["fe80::/10"]), "[fe80::1%eth0]", 80)


def test_ipv6_cidr_matches_ipv6_literal() -> None:
    hr = rules(["fd00::/8"])
    assert allowed(hr, "fd12:3456::1", 80)
    assert not allowed(hr, "fe80::1", 80)


def test_ipv4_rule_never_matches_ipv6_literal_and_back() -> None:
    assert not allowed(rules(["0.0.0.0/0"]), "::1", 80)
    assert not allowed(rules(["::/0"]), "127.0.0.1", 80)


def test_name_rule_does_not_match_ip_literal() -> None:
    # An IP written as a name rule is parsed as an address, but a real name never
    # allows a literal that happens to be its address.
    hr = rules(["example.org"])
    assert not allowed(hr, PUBLIC_V4, 443)


def test_star_allows_ip_literals_at_check_time() -> None:
    # The rebinding check after "resolution" is what keeps * away from internal ranges.
    hr = rules(["*"])
    assert allowed(hr, "127.0.0.1", 80)
    assert not hr.check_resolved("127.0.0.1", 80, "127.0.0.1").allowed


def test_deny_cidr_beats_allow_address() -> None:
    hr = rules(["10.1.2.3"], ["10.0.0.0/8"])
    verdict = hr.check("10.1.2.3", 80)
    assert not verdict.allowed
    assert verdict.rule == "10.0.0.0/8"


def test_deny_address_beats_allow_star() -> None:
    hr = rules(["*"], [PUBLIC_V4])
    assert not allowed(hr, PUBLIC_V4, 443)
    assert allowed(hr, "93.184.216.35", 443)


def test_ip_literal_is_not_matched_by_wildcard_name() -> None:
    assert not allowed(rules(["*.example.org"]), "192.0.2.7", 80)


def test_ipv4_mapped_literal_cannot_dodge_an_ipv4_deny() -> None:
    hr = rules(["*"], [PUBLIC_V4])
    assert not allowed(hr, f"::ffff:{PUBLIC_V4}", 443)
    assert not allowed(hr, f"[::ffff:{PUBLIC_V4}]", 443)


# -- check_resolved ----------------------------------------------------------------------------


def test_public_address_of_allowed_name_is_allowed() -> None:
    hr = rules(["example.org"])
    for address in (PUBLIC_V4, PUBLIC_V6):
        verdict = hr.check_resolved("example.org", 443, address)
        assert verdict.allowed
        assert verdict.rule == "resolved"


INTERNAL_ADDRESSES = [
    "127.0.0.1",
    "127.1.2.3",
    "10.0.0.1",
    "10.255.255.254",
    "172.16.0.1",
    "172.31.255.254",
    "192.168.1.1",
    "169.254.169.254",
    "169.254.170.2",
    "100.64.0.1",
    "100.127.255.254",
    "100.100.100.200",
    "::1",
    "fe80::1",
    "fe80::1%eth0",
    "fd00::1",
    "fd00:ec2::254",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "::ffff:169.254.169.254",
    "0.0.0.0",
    "::",
    "168.63.129.16",
    "224.0.0.1",
    "240.0.0.1",
]


@pytest.mark.parametrize("address", INTERNAL_ADDRESSES)
def test_internal_resolution_is_refused_as_rebinding(address: str) -> None:
    hr = rules(["example.org", "*"])
    verdict = hr.check_resolved("example.org", 443, address)
    assert not verdict.allowed
    assert verdict.rule == "rebinding"
    assert "example.org" in verdict.reason
    assert "explicitly" in verdict.reason


@pytest.mark.parametrize(
    ("address", "rule"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.0.0.1", "127.0.0.0/8"),
        ("127.0.0.1", "127.0.0.1:443"),
        ("10.1.2.3", "10.0.0.0/8"),
        ("172.16.5.5", "172.16.0.0/12"),
        ("192.168.1.1", "192.168.0.0/16"),
        ("169.254.169.254", "169.254.169.254"),
        ("100.64.0.1", "100.64.0.0/10"),
        ("::1", "::1"),
        ("::1", "[::1]:443"),
        ("fe80::1", "fe80::/10"),
        ("fe80::1%eth0", "fe80::/10"),
        ("fd00::1", "fd00::/8"),
        ("0.0.0.0", "0.0.0.0"),
        ("168.63.129.16", "168.63.129.16"),
    ],
)
def test_internal_resolution_allowed_by_explicit_address_rule(address: str, rule: str) -> None:
    hr = rules(["example.org", rule])
    verdict = hr.check_resolved("example.org", 443, address)
    assert verdict.allowed
    assert verdict.rule == rule


def test_explicit_address_rule_must_match_the_port() -> None:
    hr = rules(["example.org", "127.0.0.1:8080"])
    assert hr.check_resolved("example.org", 8080, "127.0.0.1").allowed
    verdict = hr.check_resolved("example.org", 443, "127.0.0.1")
    assert not verdict.allowed
    assert verdict.rule == "rebinding"


def test_star_does_not_count_as_an_explicit_address_rule() -> None:
    hr = rules(["*", "*:443"])
    assert hr.check_resolved("example.org", 443, "10.0.0.1").rule == "rebinding"


def test_name_rule_does_not_count_as_an_explicit_address_rule() -> None:
    hr = rules(["localhost"])
    verdict = hr.check_resolved("localhost", 80, "127.0.0.1")
    assert not verdict.allowed
    assert verdict.rule == "rebinding"


def test_deny_cidr_beats_resolution_of_allowed_name() -> None:
    hr = rules(["example.org"], ["93.184.216.0/24"])
    verdict = hr.check_resolved("example.org", 443, PUBLIC_V4)
    assert not verdict.allowed
    assert verdict.rule == "93.184.216.0/24"
    assert PUBLIC_V4 in verdict.reason


def test_deny_cidr_beats_explicit_internal_allow() -> None:
    hr = rules(["example.org", "10.0.0.0/8"], ["10.0.0.0/16"])
    assert not hr.check_resolved("example.org", 80, "10.0.1.1").allowed
    assert hr.check_resolved("example.org", 80, "10.1.1.1").allowed


def test_deny_cidr_on_another_port_does_not_apply() -> None:
    hr = rules(["example.org"], ["93.184.216.0/24:80"])
    assert not hr.check_resolved("example.org", 80, PUBLIC_V4).allowed
    assert hr.check_resolved("example.org", 443, PUBLIC_V4).allowed


def test_deny_name_rule_is_not_consulted_after_resolution() -> None:
    # Name rules were applied by check(); check_resolved only looks at addresses.
    hr = rules(["example.org"], ["other.example"])
    assert hr.check_resolved("example.org", 443, PUBLIC_V4).allowed


def test_ipv4_mapped_resolution_cannot_dodge_an_ipv4_deny() -> None:
    hr = rules(["example.org"], ["93.184.216.0/24"])
    assert not hr.check_resolved("example.org", 443, f"::ffff:{PUBLIC_V4}").allowed


# -- is_internal -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "internal"),
    [
        ("127.0.0.1", True),
        ("10.0.0.1", True),
        ("172.16.0.1", True),
        ("172.15.255.255", False),
        ("172.32.0.1", False),
        ("192.168.0.1", True),
        ("169.254.0.1", True),
        ("169.254.169.254", True),
        ("100.64.0.1", True),
        ("100.63.255.255", False),
        ("100.128.0.1", False),
        ("100.100.100.200", True),
        ("168.63.129.16", True),
        ("168.63.129.17", False),
        ("0.0.0.0", True),
        ("224.0.0.1", True),
        ("240.0.0.1", True),
        ("8.8.8.8", False),
        ("1.1.1.1", False),
        (PUBLIC_V4, False),
        ("::1", True),
        ("::", True),
        ("fe80::1", True),
        ("fc00::1", True),
        ("fd00::1", True),
        ("fd00:ec2::254", True),
        ("ff02::1", True),
        ("::ffff:127.0.0.1", True),
        ("::ffff:192.168.1.1", True),
        ("::ffff:169.254.169.254", True),
        (f"::ffff:{PUBLIC_V4}", False),
        ("2001:4860:4860::8888", False),
        (PUBLIC_V6, False),
    ],
)
def test_is_internal(address: str, internal: bool) -> None:
    assert is_internal(ip.address(address)) is internal


# -- Verdict -----------------------------------------------------------------------------------


def test_verdict_repr_and_decision() -> None:
    verdict = Verdict(False, "rebinding", "why")
    assert verdict.decision == "deny"
    assert "deny" in repr(verdict)
    assert "rebinding" in repr(verdict)
    assert Verdict(True, "x").decision == "allow"
    assert Verdict(True, "x").reason == ""
