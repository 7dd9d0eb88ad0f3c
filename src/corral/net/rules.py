"""Host, port and address rules of ``[network] allow`` / ``deny``: pure matching.

Entry syntax (allow and deny alike):

* ``example.org`` -- that host, any port; ``example.org:443`` -- that port only
* ``*.example.org`` -- any subdomain (``a.example.org``, ``a.b.example.org``) but
  **not** the apex ``example.org``: list both when both are meant
* ``1.2.3.4``, ``[::1]``, ``::1`` -- an address; ``10.0.0.0/8``, ``fd00::/8`` -- a
  network; each optionally with ``:port`` (IPv6 with a port needs brackets)
* ``*`` -- anything; ports may be ranges: ``example.org:8000-8999``

Deny wins over allow.  Anything not allowed is denied.  After an allowed *name*
resolves, an address that is loopback, private, link-local, CGNAT, unspecified
or a cloud metadata endpoint is refused unless an address or network rule
allows it explicitly (DNS rebinding: a public name must not become a door into
the host's own network).
"""

from __future__ import annotations

from corral.net import ip
from corral.net.ip import IP, Net
from corral.net.names import BadName, normalize

# Cloud metadata endpoints that are not all in private ranges (Azure's is public).
METADATA = frozenset(
    ip.address(a)
    for a in (
        "169.254.169.254",
        "169.254.170.2",
        "168.63.129.16",
        "100.100.100.200",
        "fd00:ec2::254",
    )
)
CGNAT = ip.network("100.64.0.0/10")


class Verdict:
    """A decision: allow, deny, or ask (a person decides; see :mod:`corral.net.hooks`).

    An ask is never ``allowed``: code that knows nothing of asking denies it."""

    __slots__ = ("address", "allowed", "ask", "detail", "reason", "rule")

    def __init__(
        self,
        allowed: bool,
        rule: str,
        reason: str = "",
        address: str = "",
        ask: bool = False,
        detail: dict[str, object] | None = None,
    ) -> None:
        self.allowed = allowed and not ask
        self.rule = rule  # the entry that decided, or "default" / "rebinding"
        self.reason = reason
        self.address = address  # the resolved address decided on, if that decided
        self.ask = ask
        # extra fields for the audit line when this verdict is the one reported
        # (a guardrail's title, version and hash); never secret values
        self.detail = detail

    @property
    def decision(self) -> str:
        if self.ask:
            return "ask"
        return "allow" if self.allowed else "deny"

    def __repr__(self) -> str:
        return f"Verdict({self.decision}, rule={self.rule!r}, reason={self.reason!r})"


class Rule:
    """One parsed entry."""

    __slots__ = ("host", "network", "ports", "text", "wildcard")

    def __init__(self, text: str) -> None:
        self.text = text
        self.host: str | None = None  # exact name
        self.wildcard: str | None = None  # suffix for *.name, "" for *
        self.network: Net | None = None
        self.ports: tuple[int, int] | None = None
        _parse_into(self, text.strip())

    def matches_port(self, port: int) -> bool:
        return self.ports is None or self.ports[0] <= port <= self.ports[1]

    def matches_name(self, host: str, port: int) -> bool:
        if not self.matches_port(port):
            return False
        if self.wildcard is not None:
            return self.wildcard == "" or host.endswith("." + self.wildcard)
        return self.host is not None and host == self.host

    def overlaps(self, other: Rule) -> bool:
        """Is there a (host, port) both entries match?  A name and an address never
        overlap: the proxy matches names and addresses separately."""
        if not _ports_meet(self.ports, other.ports):
            return False
        if self.wildcard == "" or other.wildcard == "":
            return True
        if self.network is not None or other.network is not None:
            return (
                self.network is not None
                and other.network is not None
                and self.network.version == other.network.version
                and self.network.overlaps(other.network)
            )
        return _names_meet(self, other) or _names_meet(other, self)

    def matches_address(self, addr: IP, port: int) -> bool:
        if not self.matches_port(port):
            return False
        addr = ip.unmapped(addr)
        if self.wildcard == "":
            return True
        return (
            self.network is not None
            and addr.version == self.network.version
            and (addr in self.network)
        )


def _ports_meet(a: tuple[int, int] | None, b: tuple[int, int] | None) -> bool:
    return a is None or b is None or (a[0] <= b[1] and b[0] <= a[1])


def _names_meet(a: Rule, b: Rule) -> bool:
    """Does some name match both (``a`` an exact name or a suffix, ``b`` either)?"""
    if a.host is not None:
        if b.host is not None:
            return a.host == b.host
        return b.wildcard is not None and a.host.endswith("." + b.wildcard)
    if a.wildcard is not None and b.wildcard is not None:
        return a.wildcard == b.wildcard or a.wildcard.endswith("." + b.wildcard)
    return False


def _parse_ports(text: str, entry: str) -> tuple[int, int]:
    low, dash, high = text.partition("-")
    if not _digits(low) or (dash and not _digits(high)):
        raise ValueError(f"bad port in {entry!r}")
    lo, hi = int(low), int(high or low)
    if not 1 <= lo <= hi <= 65535:
        raise ValueError(f"port out of range in {entry!r}")
    return lo, hi


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _parse_into(rule: Rule, entry: str) -> None:
    if not entry:
        raise ValueError("empty network rule")
    scheme, sep, rest = entry.partition("://")
    if sep and scheme.isalpha():  # a URL pasted from a browser or an error message
        hostport = rest.split("/")[0].split("?")[0].rpartition("@")[2]
        raise ValueError(f"{entry!r} is a URL: write its host, {hostport!r} (or with a port)")
    host = entry
    if entry.startswith("["):  # [v6] or [v6]:port
        close = entry.find("]")
        if close < 0:
            raise ValueError(f"unclosed [ in {entry!r}")
        host, rest = entry[1:close], entry[close + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"bad network rule {entry!r}")
            rule.ports = _parse_ports(rest[1:], entry)
    elif entry.count(":") == 1:  # name:port or v4:port (bare IPv6 has several colons)
        host, port = entry.split(":")
        rule.ports = _parse_ports(port, entry)
    if host == "*":
        rule.wildcard = ""
        return
    if "/" in host or _is_ip(host) or ("%" in host and host.count(":") > 1):
        try:  # (a zone, fe80::1%eth0, is no address a rule can name)
            rule.network = ip.network(host, strict=False)
        except ValueError:
            raise ValueError(f"bad address or network in {entry!r}") from None
        return
    wildcard = host.strip(" \t").startswith("*.")
    try:
        name = normalize_host(host.strip(" \t")[2:] if wildcard else host)
    except BadName as exc:
        what = "wildcard" if wildcard else "host name"
        raise ValueError(f"bad {what} in {entry!r}: {exc.reason}") from None
    if wildcard:
        if _is_ip(name):
            raise ValueError(f"bad wildcard in {entry!r}: use *.example.org")
        rule.wildcard = name
        return
    if _is_ip(name):  # e.g. full-width digits: an address after all
        rule.network = ip.network(name)
        return
    rule.host = name


def _is_ip(text: str) -> bool:
    return ip.is_address(text)


def normalize_host(host: str) -> str:
    """The one spelling of a host (see :mod:`corral.net.names`); raises BadName."""
    return normalize(host)


def is_internal(addr: IP) -> bool:
    """Addresses a public name must not resolve to without an explicit rule."""
    return ip.is_internal(addr, METADATA, CGNAT)


class HostRules:
    """The compiled allow and deny lists."""

    def __init__(self, allow: list[Rule], deny: list[Rule]) -> None:
        self.allow = allow
        self.deny = deny

    @classmethod
    def parse(cls, allow: list[str], deny: list[str]) -> HostRules:
        return cls([Rule(a) for a in allow], [Rule(d) for d in deny])

    def check(self, host: str, port: int) -> Verdict:
        """Decide on a destination before any DNS.  ``host`` is normally normalized
        already (the proxy's Destination does it); doing it again is a cache hit."""
        try:
            host = normalize(host)
        except BadName as exc:
            return Verdict(False, "bad-name", exc.reason)
        literal = _literal(host)
        if literal is not None:
            for rule in self.deny:
                if rule.matches_address(literal, port):
                    return Verdict(False, rule.text, "denied by rule")
            for rule in self.allow:
                if rule.matches_address(literal, port):
                    return Verdict(True, rule.text)
            return Verdict(False, "default", "address not in the allow list")
        name = host
        for rule in self.deny:
            if rule.matches_name(name, port):
                return Verdict(False, rule.text, "denied by rule")
        for rule in self.allow:
            if rule.matches_name(name, port):
                return Verdict(True, rule.text)
        return Verdict(False, "default", "host not in the allow list")

    def check_name_any_port(self, host: str) -> Verdict:
        """May the name be used at all?  (DNS has no port: a rule for any port counts,
        a deny counts only when it covers every port.)"""
        try:
            name = normalize(host)
        except BadName as exc:
            return Verdict(False, "bad-name", exc.reason)
        for rule in self.deny:
            if rule.ports is None and rule.matches_name(name, 0):
                return Verdict(False, rule.text, "denied by rule")
        for rule in self.allow:
            if rule.matches_name(name, rule.ports[0] if rule.ports else 0):
                return Verdict(True, rule.text)
        return Verdict(False, "default", "host not in the allow list")

    def check_resolved(self, host: str, port: int, address: str) -> Verdict:
        """Decide on one address an allowed name resolved to."""
        addr = ip.unmapped(ip.address(address.split("%", 1)[0]))
        for rule in self.deny:
            if rule.network is not None and rule.matches_address(addr, port):
                return Verdict(
                    False, rule.text, f"{host} resolved to a denied address {addr}", str(addr)
                )
        for rule in self.allow:  # an address the policy names: allowed as named
            if rule.network is not None and rule.matches_address(addr, port):
                return Verdict(True, rule.text)
        if not is_internal(addr):
            return Verdict(True, "resolved")
        return Verdict(
            False,
            "rebinding",
            f"{host} resolved to internal address {addr}; allow {addr} explicitly to permit it",
            str(addr),
        )


def _literal(host: str) -> IP | None:
    text = host.strip("[]").split("%", 1)[0]
    try:
        return ip.unmapped(ip.address(text))
    except ValueError:
        return None
