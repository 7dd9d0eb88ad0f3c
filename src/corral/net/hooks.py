"""The decision chain of the proxy: small hooks, composed, deny wins.

The proxy core never grows per rule type.  A rule is a :class:`Hook` with up to
three callbacks; each returns a :class:`~corral.net.rules.Verdict` to take part
in the decision or ``None`` to stay out of it.  Composition: any deny denies
(the first one is reported); otherwise any allow allows; otherwise deny.
"""

from __future__ import annotations

from corral.net.names import normalize
from corral.net.rules import HostRules, Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.net.http1 import Message
    from corral.policy import Policy


class Destination:
    """Where a sandboxed client wants to go, and how it asked.

    ``host`` is normalized here, once (:func:`corral.net.names.normalize`):
    every hook, the pinned-hosts lookup, the resolver and the connect see this
    one string and never the client's spelling.  A host that cannot be one
    destination raises :class:`~corral.net.names.BadName`, so no Destination
    with such a host exists."""

    __slots__ = ("host", "method", "path", "port", "run_id", "scheme")

    def __init__(self, run_id: str, scheme: str, host: str, port: int) -> None:
        self.run_id = run_id
        self.scheme = scheme  # "http", "connect", "socks5", "transparent" or "dns"
        self.host = normalize(host)
        self.port = port
        self.method = ""
        self.path = ""


class Hook:
    name = "hook"
    # True when on_connect depends only on (host, port), and on_resolved only on
    # (host, port, address): the chain may cache both
    connect_by_host_port = False

    def on_connect(self, dest: Destination) -> Verdict | None:
        """Before any DNS lookup, for every request, tunnel and SOCKS connection."""
        return None

    def on_resolved(self, dest: Destination, address: str) -> Verdict | None:
        """For each address the destination resolved to, before connecting."""
        return None

    def on_request(self, dest: Destination, request: Message) -> Verdict | None:
        """For each plain-HTTP request (method and path are visible)."""
        return None

    def on_dns(self, run_id: str, name: str) -> Verdict | None:
        """Transparent mode: may ``name`` resolve at all (on some port)?"""
        return None


class HostRulesHook(Hook):
    """``[network] allow`` / ``deny`` by host, port and address, with rebinding checks."""

    name = "hosts"
    connect_by_host_port = True

    def __init__(self, rules: HostRules) -> None:
        self.rules = rules

    def on_connect(self, dest: Destination) -> Verdict | None:
        return self.rules.check(dest.host, dest.port)

    def on_resolved(self, dest: Destination, address: str) -> Verdict | None:
        return self.rules.check_resolved(dest.host, dest.port, address)

    def on_dns(self, run_id: str, name: str) -> Verdict | None:
        return self.rules.check_name_any_port(name)


def combine(verdicts: list[Verdict | None]) -> Verdict:
    allowed: Verdict | None = None
    for verdict in verdicts:
        if verdict is None:
            continue
        if not verdict.allowed:
            return verdict
        allowed = allowed or verdict
    return allowed or Verdict(False, "default", "no rule allows this destination")


class Chain:
    CACHE_SIZE = 4096

    def __init__(self, hooks: list[Hook]) -> None:
        self.hooks = hooks
        self._cacheable = all(h.connect_by_host_port for h in hooks)
        self._cache: dict[tuple[str, int], Verdict] = {}
        self._resolved_cache: dict[tuple[str, int, str], Verdict] = {}

    def connect(self, dest: Destination) -> Verdict:
        if not self._cacheable:
            return combine([h.on_connect(dest) for h in self.hooks])
        key = (dest.host, dest.port)
        verdict = self._cache.get(key)
        if verdict is None:  # keep-alive clients ask the same question thousands of times
            if len(self._cache) >= self.CACHE_SIZE:
                self._cache.clear()
            verdict = self._cache[key] = combine([h.on_connect(dest) for h in self.hooks])
        return verdict

    def resolved(self, dest: Destination, address: str) -> Verdict:
        key = (dest.host, dest.port, address)
        if self._cacheable:
            cached = self._resolved_cache.get(key)
            if cached is not None:
                return cached
        verdicts = [h.on_resolved(dest, address) for h in self.hooks]
        verdict = (
            Verdict(True, "resolved") if all(v is None for v in verdicts) else combine(verdicts)
        )
        if self._cacheable:
            if len(self._resolved_cache) >= self.CACHE_SIZE:
                self._resolved_cache.clear()
            self._resolved_cache[key] = verdict
        return verdict

    def dns(self, run_id: str, name: str) -> Verdict:
        return combine([h.on_dns(run_id, name) for h in self.hooks])

    def request(self, dest: Destination, request: Message) -> Verdict | None:
        verdicts = [h.on_request(dest, request) for h in self.hooks]
        if all(v is None for v in verdicts):
            return None
        return combine(verdicts)


def chain_for(policy: Policy) -> Chain:
    """The hooks a policy's ``[network]`` section asks for (today: host rules)."""
    net = policy.network
    return Chain([HostRulesHook(HostRules.parse(net.allow, net.deny))])
