"""The decision chain of the proxy: small hooks, composed, deny wins.

The proxy core never grows per rule type.  A rule type is a :class:`Hook`
subclass built from the policy by :func:`hooks_for`; the proxy only ever
talks to the :class:`Chain` of them.

Destinations (every request, tunnel and SOCKS connection)
    ``on_connect`` before DNS, ``on_resolved`` per address after it.  Each
    returns a :class:`~corral.net.rules.Verdict` or ``None`` (no opinion).
    Composition (:func:`combine`): any deny denies (the first is reported);
    else any ask asks; else any allow allows; else deny.

Which destinations are intercepted (TLS inspection)
    A hook that must see inside HTTPS to do its job (credentials, methods and
    paths, body limits, guardrails) lists the host patterns it needs in
    :meth:`Hook.inspects`, each with the policy key that asked for it:
    ``[("api.github.com", "secrets.GH.hosts"), ("*.example.org",
    "network.rules[2].host")]``.  Patterns use ``[network] allow`` syntax
    (:class:`corral.net.rules.Rule`: names, ``*.suffix``, ``:port``,
    addresses).  :meth:`Chain.needs_inspection` ORs :meth:`Hook.needs_inspection`
    over the hooks (by default: one of its patterns matches), minus ``[tls]
    passthrough``, cached per (host, port).  A CONNECT (or SOCKS5, or
    transparent) connection to such a destination is terminated with a leaf
    certificate from corral's CA (:mod:`corral.net.tls`); every other one stays
    an opaque tunnel.  A pattern both in ``passthrough`` and in some
    ``inspects()`` is a policy error naming both keys
    (:func:`passthrough_conflict`).  Hook constructors therefore run at policy
    load time: parse the policy there and do no I/O (read secret sources in
    :meth:`Hook.open`).

Requests (plain HTTP and intercepted HTTPS alike)
    Every HTTP request goes through the same three steps, on a
    :class:`Request` (method, origin-form target, headers, body length) and a
    per-request :class:`Destination` whose ``scheme`` is ``"http"`` or
    ``"https"``:

    1. ``on_request(dest, request)``: decide, without changing anything.
       Verdicts combine as above.  An ask holds the request (nothing goes
       upstream) until :class:`Asker` answers allow or deny.
    2. ``rewrite(dest, request)``: only once the request is allowed, in chain
       order; may edit ``request.target`` and ``request.headers`` in place
       (swap a placeholder for a real credential, add a header).  Not
       ``host``, ``content-length`` or ``transfer-encoding``: the proxy writes
       ``Host`` from the decided destination and keeps the body's own framing
       whatever a hook wrote.  What a hook writes is checked as a client's
       request is (a CR/LF or other control byte in a value, a malformed name
       or target: the request is refused, 502, ``rule: rewrite``).
    3. ``on_response(dest, request, response)``: each response head (interim
       1xx ones included) before the client sees it; may edit
       ``response.headers`` in place and replace ``response.reason`` (replace an
       echoed real value by its placeholder; framing stays the origin's).  A
       deny here replaces the response with a 403 and drops the upstream
       connection.  A hook that must see the body appends a :class:`BodyFilter`
       to ``response.filters``: the body then streams through each filter in
       turn and goes to the client re-framed (a body of at most ``WHOLE``
       bytes with a fresh Content-Length, read whole; a longer one chunked,
       or until the connection closes for an HTTP/1.0 client).

    Which hooks see a request is worked out once per destination: the chain
    asks each hook :meth:`Hook.sees_requests_to` on the first request to a
    (host, port) and calls only those that said yes for every later one (a
    rule for one host costs nothing on requests to any other); of those, it
    asks :meth:`Hook.rewrites_for` and :meth:`Hook.sees_responses_from` whether
    their rewrite and on_response have anything to do there (a secret's
    hook decides every request, but rewrites and reads the responses of only
    the hosts its value may go to).  When no hook looks at a destination's
    responses, the proxy passes them on as it does without hooks.

    A keep-alive client sends the same request again and again: when every hook
    that decides or rewrites requests to a destination is
    :attr:`Hook.replayable` (its work depends on nothing but the request), the
    chain keeps what they made of a request (verdict, audit fields, body limit,
    rewritten headers and target) and replays it for a request identical to it
    (destination, method, target, headers, announced body length), without
    calling them.  Asks, and requests decided with a body read for them, are
    never replayed.

    What a hook wrote is checked on every request (``request.unchecked`` and
    ``response.unchecked``, set by the chain, tell the proxy to), unless every
    hook that ran vouches for what it writes (:attr:`Hook.writes_checked`):
    such a hook writes only bytes it checked once, when the run started.

    The body is streamed, never handed to hooks whole: ``request.body_length``
    is the announced length (``None``: chunked, unknown until it ends).  A hook
    bounds it with ``request.limit_body(n, rule)`` (the smallest wins): a longer
    Content-Length gets 413 before anything is sent upstream, and a chunked
    body that grows past it is cut off (the upstream connection is closed, so
    the origin never sees a complete request) with a 413 to the client.
    ``request.audit`` holds extra fields for this request's audit line
    (``{"secrets": ["GH"]}``: names, never values); a deciding verdict's
    ``detail`` is merged into it too.  A WebSocket upgrade is one request like
    any other; after the origin's 101, bytes pass raw both ways, unhooked.

Run start
    :meth:`Hook.open` runs once in corral's own process before the proxy
    workers fork (read a secret's source there; raise a
    :class:`~corral.errors.CorralError` to refuse the run) and
    :meth:`Hook.sandbox_env` names variables the sandbox gets (a per-run
    placeholder).  Hooks are then copied into each worker by ``fork``.  The
    door builds the chain in corral's process only when
    ``corral.net.door._hooks_act_here(policy)`` says so (host rules alone are
    built in the proxy, off the run's path): a rule type that intercepts, or
    whose hooks need ``open``/``sandbox_env``, adds its policy key there.
"""

from __future__ import annotations

from corral.net.names import normalize
from corral.net.rules import HostRules, Rule, Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

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
        # "http", "https" (a request inside intercepted TLS), "connect", "socks5",
        # "transparent" or "dns"
        self.scheme = scheme
        self.host = normalize(host)
        self.port = port
        self.method = ""
        self.path = ""

    def for_request(self, scheme: str, method: str, path: str) -> Destination:
        """The same (already normalized) destination, for one request inside it."""
        dest = Destination.__new__(Destination)
        dest.run_id, dest.scheme, dest.host, dest.port = self.run_id, scheme, self.host, self.port
        dest.method, dest.path = method, path
        return dest


class Request:
    """One HTTP request as hooks see it.

    ``target`` is origin-form (``/path?query``), one character per byte
    (latin-1: lossless; ``target.encode("latin-1")`` gives the bytes back).
    ``headers`` are (lower-case name, value) byte pairs, hop-by-hop ones
    already removed; a list hooks may edit in place in ``rewrite``."""

    __slots__ = (
        "audit",
        "body",
        "body_length",
        "body_limit",
        "body_rule",
        "headers",
        "method",
        "plan",
        "replay",
        "target",
        "unchecked",
        "wants_body",
    )

    def __init__(
        self,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body_length: int | None,
    ) -> None:
        self.method = method
        self.target = target
        self.headers = headers
        self.body_length = body_length  # 0: no body; None: chunked
        self.body_limit: int | None = None  # set by hooks (limit_body); the smallest wins
        self.body_rule = ""  # the rule that set it, for the audit line of a 413
        self.audit: dict[str, object] = {}
        # must the proxy check headers and target before sending them?  (False only
        # once Chain.rewrite ran hooks that all vouch for what they write)
        self.unchecked = True
        self.plan: _Plan | None = None  # the chain's, for this request's destination
        self.replay: _Replay | None = None  # the chain's record of this decision, if kept
        # A hook that cannot decide without the body (a form's _method) denies and
        # asks for it (want_body); the proxy then reads a body of at most that many
        # bytes into ``body`` and asks the hooks again.  Where it cannot, the
        # denial stands.
        self.body: bytes | None = None
        self.wants_body = 0

    def get(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def want_body(self, most: int) -> None:
        """Ask the proxy for this request's body (at most ``most`` bytes, announced
        by a Content-Length) and for a second decision with it in ``body``."""
        self.wants_body = max(self.wants_body, most)

    def limit_body(self, limit: int, rule: str) -> None:
        if self.body_limit is None or limit < self.body_limit:
            self.body_limit = limit
            self.body_rule = rule


class Response:
    """A response head as hooks see it: status, reason phrase and (lower-case name,
    value) pairs, hop-by-hop ones removed; ``headers`` may be edited in place and
    ``reason`` replaced (an origin may write anything there).  An interim (1xx)
    head is one too: hooks see each before the final one.  ``filters``: what
    the body passes through on its way to the client (see :class:`BodyFilter`)."""

    __slots__ = ("filters", "headers", "length", "reason", "status", "unchecked")

    def __init__(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        reason: bytes = b"",
        length: int | None = None,
    ) -> None:
        self.status = status
        self.headers = headers
        self.reason = reason
        self.length = length  # the body's length, when the framing says it (else None)
        self.unchecked = True  # as Request.unchecked, set by Chain.response
        self.filters: list[BodyFilter] = []


class BodyFilter:
    """A response body rewritten as it streams (one per response).  :meth:`feed`
    gets each piece as it arrives and returns what may go on now (it may hold
    some back, e.g. what could be the start of a match); :meth:`end` returns
    what it still holds once the body is complete.  Either may raise
    :class:`corral.net.http1.HttpError` (a body it cannot read): the client's
    connection is then cut, as for an origin that breaks off.

    A filter whose output may be many times its input (``grows``: a body it
    decompresses) returns it in bounded steps: while :meth:`pending` says more
    is ready, the copy calls ``feed(b"")`` for the next, waiting for the client
    to drain between steps.  Such a body is never read whole (its size is not
    known from the compressed one's)."""

    grows = False

    def feed(self, data: bytes) -> bytes:
        return data

    def pending(self) -> bool:
        """Whether ``feed(b"")`` would give more of what is already fed."""
        return False

    def end(self) -> bytes:
        return b""


class Hook:
    name = "hook"
    # True when on_connect depends only on (host, port), and on_resolved only on
    # (host, port, address): the chain may cache both
    connect_by_host_port = False
    # True when rewrite and on_response write only bytes this hook checked once
    # (at policy load or in open): header names that are lower-case tokens and
    # none of host, content-length, transfer-encoding; values without a control
    # byte; a target edited only by putting unreserved characters and %XX
    # escapes in place of unreserved ones.  The proxy then sends what it wrote
    # as it is; a hook that leaves this False is checked on every request.
    writes_checked = False
    # True when on_request and rewrite depend only on the destination and the
    # request's method, target, headers and announced body length: never on the
    # time, the body, earlier requests or anything else that changes during a run.
    # When every hook that decides or rewrites requests to a destination says so,
    # the chain replays what they did to a request identical to one they handled
    # before (a keep-alive client repeats itself) instead of calling them again.
    replayable = False

    def sees_requests_to(self, host: str, port: int) -> bool:
        """Might on_request, rewrite or on_response do anything for a request to
        (normalized host, port)?  Asked once per destination: False and the chain
        never calls them for requests there."""
        return True

    def rewrites_for(self, host: str, port: int) -> bool:
        """Of a destination this hook sees requests to: might rewrite change one?"""
        return True

    def sees_responses_from(self, host: str, port: int) -> bool:
        """Of a destination this hook sees requests to: might on_response do anything?"""
        return True

    def inspects(self) -> list[tuple[str, str]]:
        """Host patterns whose HTTPS this hook must see, each with the policy key
        that names it (for error messages)."""
        return []

    def needs_inspection(self, host: str, port: int) -> bool:
        """Must a connection to (normalized host, port) be intercepted for this hook?"""
        return any(_matches(rule, host, port) for rule in self._inspected())

    def _inspected(self) -> list[Rule]:
        rules: list[Rule] | None = self.__dict__.get("_inspected_rules")
        if rules is None:
            rules = self.__dict__["_inspected_rules"] = [Rule(p) for p, _ in self.inspects()]
        return rules

    def open(self) -> None:
        """Once per run, in corral's process, before the proxy workers fork."""

    def sandbox_env(self) -> dict[str, str]:
        """Variables the sandbox gets for this hook (after :meth:`open`)."""
        return {}

    def on_connect(self, dest: Destination) -> Verdict | None:
        """Before any DNS lookup, for every request, tunnel and SOCKS connection."""
        return None

    def on_resolved(self, dest: Destination, address: str) -> Verdict | None:
        """For each address the destination resolved to, before connecting."""
        return None

    def on_request(self, dest: Destination, request: Request) -> Verdict | None:
        """Decide one HTTP request (plain, or inside intercepted TLS); change nothing."""
        return None

    def rewrite(self, dest: Destination, request: Request) -> None:
        """Edit an allowed request in place before it goes upstream."""

    def on_response(
        self, dest: Destination, request: Request, response: Response
    ) -> Verdict | None:
        """See (and edit in place) a response head before the client does."""
        return None

    def on_dns(self, run_id: str, name: str) -> Verdict | None:
        """Transparent mode: may ``name`` resolve at all (on some port)?"""
        return None


class Asker:
    """Answers an ``ask`` verdict (held request, or a CONNECT when ``request`` is
    None).  This default answers no: nobody is there to ask.  A run whose policy
    can ask gets :class:`corral.net.approvals.Hub` instead."""

    async def ask(self, dest: Destination, request: Request | None, verdict: Verdict) -> Verdict:
        return Verdict(False, verdict.rule, "approval needed, and nobody can answer here")


class HostRulesHook(Hook):
    """``[network] allow`` / ``deny`` by host, port and address, with rebinding checks."""

    name = "hosts"
    connect_by_host_port = True

    def __init__(self, rules: HostRules, pins: dict[str, str] | None = None) -> None:
        self.rules = rules
        # [network] hosts: a name pinned to an address says what it is, as an allow of
        # the address would, without opening the address itself to the sandbox (where
        # requests to it would not be held to the name's rules and secrets)
        self.pins = {normalize(k): normalize(v) for k, v in (pins or {}).items()}

    def on_connect(self, dest: Destination) -> Verdict | None:
        return self.rules.check(dest.host, dest.port)

    def on_resolved(self, dest: Destination, address: str) -> Verdict | None:
        verdict = self.rules.check_resolved(dest.host, dest.port, address)
        if verdict.rule == "rebinding" and self.pins.get(dest.host) == normalize(address):
            return Verdict(True, f"hosts.{dest.host}")  # (a deny of the address still wins)
        return verdict

    def on_dns(self, run_id: str, name: str) -> Verdict | None:
        return self.rules.check_name_any_port(name)


class InspectHook(Hook):
    """``[tls] inspect``: hosts intercepted with no other rule, so that every
    request's method and path reach the audit log (and the chain's other hooks)."""

    name = "inspect"
    connect_by_host_port = True

    def __init__(self, patterns: list[str]) -> None:
        self.patterns = patterns

    def inspects(self) -> list[tuple[str, str]]:
        return [(p, "tls.inspect") for p in self.patterns]


def combine(verdicts: Iterable[Verdict | None]) -> Verdict:
    found = strongest(verdicts)
    return found or Verdict(False, "default", "no rule allows this destination")


def strongest(verdicts: Iterable[Verdict | None]) -> Verdict | None:
    """Deny over ask over allow; None when nobody had an opinion."""
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
    return ask or allowed


def _overrides(hook: Hook, method: str) -> bool:
    return getattr(type(hook), method) is not getattr(Hook, method)


class Chain:
    CACHE_SIZE = 4096
    REPLAYS = 256  # requests whose handling is kept for replay (_Replay.MOST_BYTES each)

    def __init__(self, hooks: list[Hook], passthrough: list[str] | None = None) -> None:
        self.hooks = hooks
        self.passthrough = [Rule(p) for p in passthrough or []]
        self._cacheable = all(h.connect_by_host_port for h in hooks)
        self._cache: dict[tuple[str, int], Verdict] = {}
        self._resolved_cache: dict[tuple[str, int, str], Verdict] = {}
        self._inspect_cache: dict[tuple[str, int], bool] = {}
        # only hooks that look at requests are called for each one
        self._on_request = [h for h in hooks if _overrides(h, "on_request")]
        self._rewrite = [h for h in hooks if _overrides(h, "rewrite")]
        self._on_response = [h for h in hooks if _overrides(h, "on_response")]
        self._inspecting = [h for h in hooks if h.inspects() or _overrides(h, "needs_inspection")]
        self._plans: dict[tuple[str, int], _Plan] = {}
        self._replays: dict[tuple[object, ...], _Replay] = {}
        # does any hook look at requests?  (if not, none is built: the plain HTTP
        # keep-alive path stays as fast as with host rules alone)
        self.sees_requests = bool(self._on_request or self._rewrite or self._on_response)

    @property
    def pure_connect(self) -> bool:
        """Does every hook's connect decision depend on the host and port alone
        (so asking one changes nothing but the chain's cache)?"""
        return self._cacheable

    @property
    def may_inspect(self) -> bool:
        """Can any destination of this run be intercepted (so the sandbox needs the CA)?"""
        return bool(self._inspecting)

    def needs_inspection(self, host: str, port: int) -> bool:
        """Must a connection to the (normalized) host and port be intercepted?"""
        if not self._inspecting:
            return False
        key = (host, port)
        found = self._inspect_cache.get(key)
        if found is None:
            if len(self._inspect_cache) >= self.CACHE_SIZE:
                self._inspect_cache.clear()
            found = not any(_matches(r, host, port) for r in self.passthrough) and any(
                h.needs_inspection(host, port) for h in self._inspecting
            )
            self._inspect_cache[key] = found
        return found

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

    def plan(self, host: str, port: int) -> _Plan:
        """The request hooks that see requests to (normalized host, port)."""
        key = (host, port)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= self.CACHE_SIZE:
                self._plans.clear()
            rewriting = [h for h in self._rewrite if h.sees_requests_to(host, port)]
            responding = [h for h in self._on_response if h.sees_requests_to(host, port)]
            plan = self._plans[key] = _Plan(
                [h for h in self._on_request if h.sees_requests_to(host, port)],
                [h for h in rewriting if h.rewrites_for(host, port)],
                [h for h in responding if h.sees_responses_from(host, port)],
            )
        return plan

    def request(self, dest: Destination, request: Request) -> Verdict | None:
        """The request hooks' decision, or None when none of them had an opinion."""
        plan = self._plans.get((dest.host, dest.port)) or self.plan(dest.host, dest.port)
        request.plan = plan  # for rewrite and response: the same destination
        if not plan.replayable or request.body is not None:  # (a body read to decide)
            return _decide(plan, dest, request)
        key = (
            dest.host,
            dest.port,
            dest.scheme,
            dest.method,
            dest.path,
            request.method,
            request.target,
            request.body_length,
            tuple(request.headers),  # (the exact headers: a hit is this very request)
        )
        kept = self._replays.get(key)
        if kept is not None:
            request.replay = kept
            return kept.replay(request)
        verdict = _decide(plan, dest, request)
        # (an ask is asked again; a request that wants its body read is decided with it;
        # what a client makes us keep is bounded)
        asks = verdict is not None and verdict.ask
        if not asks and not request.wants_body and _Replay.fits(request):
            if len(self._replays) >= self.REPLAYS:
                self._replays.clear()
            request.replay = self._replays[key] = _Replay(verdict, request)
        return verdict

    def rewrite(self, dest: Destination, request: Request) -> None:
        plan = request.plan or self.plan(dest.host, dest.port)
        kept = request.replay
        if kept is not None and kept.headers is not None:
            request.headers, request.target = list(kept.headers), kept.target
        else:
            for rewrite in plan.rewrite:
                rewrite(dest, request)
            if kept is not None:
                kept.rewritten(request)
        request.unchecked = plan.rewrite_unchecked

    def response(self, dest: Destination, request: Request, response: Response) -> Verdict | None:
        plan = request.plan or self.plan(dest.host, dest.port)
        response.unchecked = plan.response_unchecked
        if len(plan.on_response) == 1:  # (the usual: one hook reads responses there)
            return plan.on_response[0](dest, request, response)
        allowed: Verdict | None = None
        ask: Verdict | None = None
        for on_response in plan.on_response:  # (as in request)
            verdict = on_response(dest, request, response)
            if verdict is None:
                continue
            if verdict.ask:
                ask = ask or verdict
            elif not verdict.allowed:
                return verdict
            else:
                allowed = allowed or verdict
        return ask or allowed

    def open(self) -> None:
        for hook in self.hooks:
            hook.open()

    def sandbox_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for hook in self.hooks:
            env.update(hook.sandbox_env())
        return env


# What a header costs in memory besides its bytes (a tuple and two bytes objects):
# a cache bounded by bytes alone held gigabytes of requests with thousands of empty
# headers (found by attacking the proxy)
HEADER_COST = 128


def kept_size(headers: list[tuple[bytes, bytes]]) -> int:
    """What keeping ``headers`` costs, in bytes: what bounds a cache of them."""
    return sum(len(k) + len(v) for k, v in headers) + HEADER_COST * len(headers)


def _decide(plan: _Plan, dest: Destination, request: Request) -> Verdict | None:
    """The deciding hooks' verdicts combined (deny wins: the hooks after a deny are
    not asked, the generator stopping there), None when none had an opinion.  (A
    keep-alive client's repeated request is replayed instead: see Chain.request.)"""
    return strongest(on_request(dest, request) for on_request in plan.on_request)


class _Replay:
    """What the hooks made of one request (all of them :attr:`Hook.replayable`):
    its verdict, what they put in its audit line and its body limit, and once it
    was allowed and rewritten, its headers and target after the rewrite."""

    __slots__ = ("audit", "body_limit", "body_rule", "headers", "target", "verdict")
    MOST_BYTES = 8192  # the largest request kept (its target and kept_size of its headers)

    def __init__(self, verdict: Verdict | None, request: Request) -> None:
        self.verdict = verdict
        self.audit = dict(request.audit)  # (the request's own goes on to the response hooks)
        self.body_limit, self.body_rule = request.body_limit, request.body_rule
        self.headers: tuple[tuple[bytes, bytes], ...] | None = None  # (not rewritten yet)
        self.target = ""

    @classmethod
    def fits(cls, request: Request) -> bool:
        return len(request.target) + kept_size(request.headers) <= cls.MOST_BYTES

    def replay(self, request: Request) -> Verdict | None:
        if self.audit:
            request.audit = dict(self.audit)
        request.body_limit, request.body_rule = self.body_limit, self.body_rule
        return self.verdict

    def rewritten(self, request: Request) -> None:
        self.headers, self.target = tuple(request.headers), request.target


class _Plan:
    """What the chain calls for each request to one destination: bound methods of
    the hooks that see requests there, in chain order, and whether what they do
    may be replayed (:attr:`Hook.replayable`)."""

    __slots__ = (
        "on_request",
        "on_response",
        "replayable",
        "response_unchecked",
        "rewrite",
        "rewrite_unchecked",
    )

    def __init__(self, deciding: list[Hook], rewriting: list[Hook], responding: list[Hook]) -> None:
        self.on_request = [h.on_request for h in deciding]
        self.rewrite = [h.rewrite for h in rewriting]
        self.on_response = [h.on_response for h in responding]
        # must the proxy check what these hooks write?  (see Hook.writes_checked)
        self.rewrite_unchecked = not all(h.writes_checked for h in rewriting)
        self.response_unchecked = not all(h.writes_checked for h in responding)
        doing = (*deciding, *rewriting)
        self.replayable = bool(doing) and all(h.replayable for h in doing)


def _matches(rule: Rule, host: str, port: int) -> bool:
    """Does an allow-syntax pattern cover a normalized host (a name or an address)?"""
    if rule.matches_name(host, port):
        return True
    if rule.network is None and rule.wildcard != "":
        return False
    from corral.net import ip

    try:
        address = ip.address(host)
    except ValueError:
        return False
    return rule.matches_address(address, port)


def passthrough_conflict(passthrough: list[str], hooks: list[Hook]) -> str | None:
    """A policy error naming both keys when a host is passed through (``[tls]
    passthrough``) and also needs interception for some hook; else None."""
    for entry in passthrough:
        through = Rule(entry)
        for hook in hooks:
            for pattern, key in hook.inspects():
                if through.overlaps(Rule(pattern)):
                    return (
                        f"tls.passthrough: {entry!r} is never intercepted, but {key} "
                        f"({pattern!r}) needs to see inside its HTTPS: remove one of them"
                    )
    return None


def hooks_for(policy: Policy) -> list[Hook]:
    """The hooks a policy asks for, in chain order (no I/O: see :meth:`Hook.open`).
    A new rule type adds its hooks here."""
    net = policy.network
    hooks: list[Hook] = [HostRulesHook(HostRules.parse(net.allow, net.deny), net.hosts)]
    if policy.tls.inspect:
        hooks.append(InspectHook(policy.tls.inspect))
    if net.rules:
        from corral.net.httprules import HttpRulesHook

        hooks.append(HttpRulesHook.from_policy(net.rules))
    if policy.guardrails.dirs:
        from corral.net.guardrails import GuardrailHook
        from corral.policy import check_guardrails

        hooks.append(GuardrailHook(check_guardrails(policy), policy.guardrails.tiers))
    if policy.secrets:
        from corral.net.secrets import SecretsHook

        hooks.append(SecretsHook(policy))
    return hooks


def chain_for(policy: Policy) -> Chain:
    """The chain of :func:`hooks_for`, with ``[tls] passthrough`` applied."""
    return Chain(hooks_for(policy), policy.tls.passthrough)
