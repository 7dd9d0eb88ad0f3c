"""The decision chain of the proxy: small hooks, composed, deny wins.

The proxy core never grows per rule type.  A rule is a :class:`Hook` with a few
callbacks; each returns a :class:`~corral.net.rules.Verdict` to take part in
the decision or ``None`` to stay out of it.  Composition: any deny denies (the
first one is reported); otherwise any ask asks; otherwise any allow allows;
otherwise deny.

The seam for rules that look inside requests (methods and paths, credentials):

* :meth:`Hook.intercept`: this hook must see the HTTP requests sent to a
  destination.  A tunnel to it (CONNECT, SOCKS5, a captured connection) is then
  intercepted (TLS terminated, each request read) or refused: the proxy marks a
  destination whose requests it will show the chain with
  ``Destination.inspected``, and :meth:`Chain.connect` refuses any other
  destination a hook wants to see inside.  Plain HTTP forwarding is inspected
  by nature.
* :meth:`Hook.on_request` gets a :class:`Request`: the head, the target to
  send, and what a hook may ask of the rest of the exchange (a body limit,
  rewrites of the response head, the credentials it put in for the audit line).
"""

from __future__ import annotations

from corral.net.names import normalize
from corral.net.rules import HostRules, Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from corral.net.http1 import Message
    from corral.policy import Policy


class Destination:
    """Where a sandboxed client wants to go, and how it asked.

    ``host`` is normalized here, once (:func:`corral.net.names.normalize`):
    every hook, the pinned-hosts lookup, the resolver and the connect see this
    one string and never the client's spelling.  A host that cannot be one
    destination raises :class:`~corral.net.names.BadName`, so no Destination
    with such a host exists."""

    __slots__ = ("host", "inspected", "method", "path", "port", "run_id", "scheme")

    def __init__(self, run_id: str, scheme: str, host: str, port: int) -> None:
        self.run_id = run_id
        self.scheme = scheme  # "http", "connect", "socks5", "transparent" or "dns"
        self.host = normalize(host)
        self.port = port
        self.method = ""
        self.path = ""
        # every request to this destination goes through Chain.request: plain HTTP
        # forwarding always; a tunnel only when the proxy intercepts it
        self.inspected = scheme == "http"


class Request:
    """One HTTP request on its way to an origin, as request hooks see it: a
    plain-HTTP request, or one read inside an intercepted tunnel.

    Hooks may rewrite ``head.headers`` (names lower-case) and ``target`` (the
    origin-form ``/path?query`` that is sent) in place: what they leave is what
    the origin gets.  ``dest.path`` keeps what the client sent, for the audit.
    """

    __slots__ = ("body_limit", "body_rule", "dest", "head", "responses", "secrets", "target")

    def __init__(self, dest: Destination, head: Message, target: bytes) -> None:
        self.dest = dest
        self.head = head
        self.target = target
        self.body_limit: int | None = None  # most request-body bytes the origin may get
        self.body_rule = ""  # the rule that set body_limit (named when it is exceeded)
        self.secrets: list[str] = []  # credentials this request carries: names, for the audit
        # called with each response head before the client sees it (may rewrite headers)
        self.responses: list[Callable[[Message], None]] = []

    def limit_body(self, size: int, rule: str) -> None:
        """A hook's limit; the smallest one applies (a proxy enforces it while
        streaming: a longer body is cut off upstream and refused with 413)."""
        if self.body_limit is None or size < self.body_limit:
            self.body_limit = size
            self.body_rule = rule


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

    def intercept(self, dest: Destination) -> bool:
        """True: this hook must see every request to ``dest`` (by host and port
        only, so the chain may cache it)."""
        return False

    def on_request(self, request: Request) -> Verdict | None:
        """For each HTTP request the proxy can read (method and path are visible)."""
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
    ask: Verdict | None = None
    for verdict in verdicts:
        if verdict is None:
            continue
        if verdict.ask:
            ask = ask or verdict
        elif not verdict.allowed:
            return verdict
        else:
            allowed = allowed or verdict
    return ask or allowed or Verdict(False, "default", "no rule allows this destination")


class Chain:
    CACHE_SIZE = 4096

    def __init__(self, hooks: list[Hook]) -> None:
        self.hooks = hooks
        self._cacheable = all(h.connect_by_host_port for h in hooks)
        self._cache: dict[tuple[str, int], Verdict] = {}
        self._resolved_cache: dict[tuple[str, int, str], Verdict] = {}
        # only hooks that look inside requests take part in intercept() and request()
        self._inside = [
            h
            for h in hooks
            if type(h).on_request is not Hook.on_request or type(h).intercept is not Hook.intercept
        ]
        self._intercept_cache: dict[tuple[str, int], bool] = {}

    def connect(self, dest: Destination) -> Verdict:
        if not self._cacheable:
            verdict = combine([h.on_connect(dest) for h in self.hooks])
        else:
            key = (dest.host, dest.port)
            cached = self._cache.get(key)
            if cached is None:  # keep-alive clients ask the same question thousands of times
                if len(self._cache) >= self.CACHE_SIZE:
                    self._cache.clear()
                cached = self._cache[key] = combine([h.on_connect(dest) for h in self.hooks])
            verdict = cached
        if verdict.allowed and not dest.inspected and self.intercept(dest):
            # a rule needs to see inside, and this connection would be opaque
            return Verdict(
                False, "needs-inspection", "a rule for this host needs to see its requests"
            )
        return verdict

    def intercept(self, dest: Destination) -> bool:
        """Whether some hook must see the requests sent to ``dest``."""
        if not self._inside:
            return False
        key = (dest.host, dest.port)
        wanted = self._intercept_cache.get(key)
        if wanted is None:
            if len(self._intercept_cache) >= self.CACHE_SIZE:
                self._intercept_cache.clear()
            wanted = self._intercept_cache[key] = any(h.intercept(dest) for h in self._inside)
        return wanted

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

    def request(self, request: Request) -> Verdict | None:
        """The request hooks' decision (None: none of them had a say).  Hooks run
        in order, each seeing what the ones before it rewrote."""
        if not self._inside:
            return None
        verdicts = [h.on_request(request) for h in self._inside]
        if all(v is None for v in verdicts):
            return None
        return combine(verdicts)


def chain_for(policy: Policy) -> Chain:
    """The hooks a policy asks for: host rules, then ``[[network.rules]]`` (methods
    and paths), then ``[secrets]`` (whose real values are read here, in corral's
    own process: the proxy workers forked from it inherit them)."""
    net = policy.network
    hooks: list[Hook] = [HostRulesHook(HostRules.parse(net.allow, net.deny))]
    if net.rules:
        from corral.net.httprules import HttpRulesHook

        hooks.append(HttpRulesHook.from_policy(net.rules))
    if policy.secrets:
        from corral.net.secrets import SecretsHook

        hooks.append(SecretsHook.from_policy(policy))
    return Chain(hooks)
