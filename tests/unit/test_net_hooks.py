"""The hook seam: which destinations are intercepted, how verdicts combine, and the
passthrough check, with stub hooks (no proxy, no sockets)."""

from __future__ import annotations

import pytest

from corral.errors import PolicyError
from corral.net.hooks import (
    Chain,
    Destination,
    Hook,
    HostRulesHook,
    Request,
    Response,
    combine,
    hooks_for,
    passthrough_conflict,
)
from corral.net.rules import HostRules, Rule, Verdict
from corral.policy import Policy, check_tls


class Stub(Hook):
    """Needs inspection of its patterns, and denies one path."""

    name = "stub"

    def __init__(self, patterns: list[tuple[str, str]], deny_path: str = "/secret") -> None:
        self.patterns = patterns
        self.deny_path = deny_path
        self.rewritten = 0

    def inspects(self) -> list[tuple[str, str]]:
        return self.patterns

    def on_request(self, dest: Destination, request: Request) -> Verdict | None:
        if request.target.startswith(self.deny_path):
            return Verdict(False, "stub", "path denied")
        return Verdict(True, "stub")

    def rewrite(self, dest: Destination, request: Request) -> None:
        self.rewritten += 1
        request.headers.append((b"x-stub", b"1"))

    def on_response(self, dest: Destination, request: Request, response: Response) -> None:
        response.headers = [(k, v) for k, v in response.headers if k != b"x-drop"]


def _dest(host: str = "api.example.org", port: int = 443) -> Destination:
    return Destination("run", "https", host, port)


def test_inspection_follows_the_hooks_patterns_and_passthrough_wins() -> None:
    hooks: list[Hook] = [
        HostRulesHook(HostRules.parse(["*"], [])),
        Stub([("api.example.org", "x.hosts"), ("*.git.example:443", "y.hosts")]),
    ]
    chain = Chain(hooks, passthrough=["pinned.git.example"])
    assert chain.may_inspect
    assert chain.needs_inspection("api.example.org", 443)
    assert chain.needs_inspection("a.git.example", 443)
    assert not chain.needs_inspection("a.git.example", 8443)  # the pattern's port
    assert not chain.needs_inspection("git.example", 443)  # *.x is not x
    assert not chain.needs_inspection("pinned.git.example", 443)  # passed through
    assert not chain.needs_inspection("other.example", 443)


def test_addresses_are_inspected_by_address_patterns() -> None:
    chain = Chain([Stub([("127.0.0.1:8443", "k"), ("[::1]", "k")])])
    assert chain.needs_inspection("127.0.0.1", 8443)
    assert chain.needs_inspection("::1", 443)
    assert not chain.needs_inspection("127.0.0.1", 443)


def test_a_chain_without_inspecting_hooks_never_intercepts() -> None:
    chain = Chain([HostRulesHook(HostRules.parse(["*"], []))])
    assert not chain.may_inspect
    assert not chain.needs_inspection("api.example.org", 443)
    assert not chain.sees_requests


def test_request_hooks_decide_rewrite_and_see_responses() -> None:
    stub = Stub([("api.example.org", "k")])
    chain = Chain([HostRulesHook(HostRules.parse(["*"], [])), stub])
    assert chain.sees_requests
    denied = Request("GET", "/secret/x", [], 0)
    verdict = chain.request(_dest(), denied)
    assert verdict is not None and not verdict.allowed and verdict.rule == "stub"
    allowed = Request("GET", "/public", [(b"accept", b"*/*")], 0)
    verdict = chain.request(_dest(), allowed)
    assert verdict is not None and verdict.allowed
    chain.rewrite(_dest(), allowed)
    assert allowed.headers[-1] == (b"x-stub", b"1") and stub.rewritten == 1
    response = Response(200, [(b"x-drop", b"v"), (b"x-keep", b"w")])
    assert chain.response(_dest(), allowed, response) is None
    assert response.headers == [(b"x-keep", b"w")]


def test_no_request_hook_means_no_opinion() -> None:
    chain = Chain([HostRulesHook(HostRules.parse(["*"], []))])
    assert chain.request(_dest(), Request("GET", "/", [], 0)) is None


def test_deny_wins_over_ask_and_ask_over_allow() -> None:
    allow, ask, deny = Verdict(True, "a"), Verdict(False, "q", ask=True), Verdict(False, "d")
    assert combine([allow, ask, deny]) is deny
    assert combine([allow, ask]) is ask
    assert combine([None, allow]) is allow
    assert combine([None]).rule == "default" and not combine([None]).allowed
    assert ask.decision == "ask" and not ask.allowed
    assert not Verdict(True, "x", ask=True).allowed  # an ask never allows by itself


def test_body_limit_smallest_wins() -> None:
    request = Request("POST", "/", [], None)
    request.limit_body(1000, "a")
    request.limit_body(5000, "b")
    assert (request.body_limit, request.body_rule) == (1000, "a")


@pytest.mark.parametrize(
    ("through", "inspected", "conflict"),
    [
        ("api.example.org", "api.example.org", True),
        ("*.example.org", "api.example.org", True),
        ("api.example.org", "*.example.org", True),
        ("*.a.example.org", "*.example.org", True),
        ("*", "api.example.org", True),
        ("api.example.org:443", "api.example.org:8443", False),
        ("api.example.org:400-500", "api.example.org:443", True),
        ("example.org", "*.example.org", False),  # a wildcard is not its apex
        ("other.org", "api.example.org", False),
        ("10.0.0.0/8", "10.1.2.3", True),
        ("10.0.0.0/8", "api.example.org", False),
        ("[::1]", "127.0.0.1", False),
    ],
)
def test_passthrough_conflicts_with_a_stub_hook(
    through: str, inspected: str, conflict: bool
) -> None:
    hooks: list[Hook] = [Stub([(inspected, "secrets.GH.hosts")])]
    message = passthrough_conflict([through], hooks)
    assert (message is not None) is conflict
    assert Rule(through).overlaps(Rule(inspected)) is conflict
    assert Rule(inspected).overlaps(Rule(through)) is conflict
    if message:
        assert "tls.passthrough" in message and "secrets.GH.hosts" in message


def test_policy_load_refuses_passthrough_of_an_inspected_host(tmp_path: object) -> None:
    import pathlib

    assert isinstance(tmp_path, pathlib.Path)
    policy_file = tmp_path / "corral.toml"
    policy_file.write_text(
        '[network]\nmode = "proxy"\nallow = ["api.example.org"]\n'
        '[tls]\ninspect = ["api.example.org"]\npassthrough = ["*.example.org"]\n'
    )
    with pytest.raises(PolicyError, match=r"tls\.passthrough: '\*\.example\.org'.*tls\.inspect"):
        Policy.load(str(policy_file), str(tmp_path))


def test_hooks_for_adds_inspect_only_when_asked() -> None:
    policy = Policy("/ws")
    assert [h.name for h in hooks_for(policy)] == ["hosts"]
    policy.tls.inspect = ["api.example.org"]
    assert [h.name for h in hooks_for(policy)] == ["hosts", "inspect"]
    check_tls(policy)  # no passthrough: nothing to conflict with


class OneHost(Hook):
    """Sees requests to one host only, allows them, and counts its calls."""

    name = "one-host"
    writes_checked = True

    def __init__(self, host: str) -> None:
        self.host = host
        self.calls = 0

    def sees_requests_to(self, host: str, port: int) -> bool:
        return host == self.host

    def on_request(self, dest: Destination, request: Request) -> Verdict | None:
        self.calls += 1
        return Verdict(True, "one-host")

    def rewrite(self, dest: Destination, request: Request) -> None:
        self.calls += 1

    def on_response(self, dest: Destination, request: Request, response: Response) -> None:
        self.calls += 1


def test_a_hook_is_called_only_for_the_destinations_it_sees() -> None:
    hook = OneHost("api.example.org")
    chain = Chain([HostRulesHook(HostRules.parse(["*"], [])), hook])
    for _ in range(2):  # the plan is worked out once, then reused
        other = Request("GET", "/", [], 0)
        assert chain.request(_dest("other.example.org"), other) is None
        chain.rewrite(_dest("other.example.org"), other)
        assert chain.response(_dest("other.example.org"), other, Response(200, [])) is None
    assert hook.calls == 0
    mine = Request("GET", "/", [], 0)  # the twin: its own host
    verdict = chain.request(_dest(), mine)
    assert verdict is not None and verdict.allowed and verdict.rule == "one-host"
    chain.rewrite(_dest(), mine)
    chain.response(_dest(), mine, Response(200, []))
    assert hook.calls == 3


def test_deny_wins_over_ask_and_allow_across_request_and_response_hooks() -> None:
    class Says(Hook):
        def __init__(self, verdict: Verdict | None) -> None:
            self.verdict = verdict

        def on_request(self, dest: Destination, request: Request) -> Verdict | None:
            return self.verdict

        def on_response(
            self, dest: Destination, request: Request, response: Response
        ) -> Verdict | None:
            return self.verdict

    allow, ask, deny = Verdict(True, "a"), Verdict(False, "q", ask=True), Verdict(False, "d")
    for verdicts, strongest in (
        ([allow, ask, deny], deny),
        ([deny, allow], deny),
        ([allow, ask], ask),
        ([None, allow], allow),
        ([None, None], None),
    ):
        chain = Chain([Says(v) for v in verdicts])
        req = Request("GET", "/", [], 0)
        assert chain.request(_dest(), req) is strongest
        assert chain.response(_dest(), req, Response(200, [])) is strongest


def test_what_hooks_wrote_is_checked_unless_every_hook_that_ran_checks_its_own() -> None:
    checked = OneHost("api.example.org")
    chain = Chain([checked])
    req, response = Request("GET", "/", [], 0), Response(200, [])
    assert req.unchecked and response.unchecked  # made outside a chain: the proxy checks
    chain.request(_dest(), req)
    chain.rewrite(_dest(), req)
    chain.response(_dest(), req, response)
    assert not req.unchecked and not response.unchecked
    # the twin: one hook that does not vouch for its writes, and everything is checked
    chain = Chain([checked, Stub([("api.example.org", "k")])])
    req, response = Request("GET", "/public", [], 0), Response(200, [])
    chain.request(_dest(), req)
    chain.rewrite(_dest(), req)
    chain.response(_dest(), req, response)
    assert req.unchecked and response.unchecked
    # a destination where no hook rewrites: nothing written, nothing to check
    req = Request("GET", "/", [], 0)
    Chain([HostRulesHook(HostRules.parse(["*"], []))]).rewrite(_dest(), req)
    assert not req.unchecked


class Counted(Stub):
    """A replayable stub that counts its calls, sets an audit field and a body
    limit, and asks for one path."""

    replayable = True

    def __init__(self) -> None:
        super().__init__([("api.example.org", "k")])
        self.decided = 0

    def on_request(self, dest: Destination, request: Request) -> Verdict | None:
        self.decided += 1
        request.audit["stub"] = self.decided
        request.limit_body(100, "stub.limit")
        if request.target == "/ask":
            return Verdict(False, "stub", "ask", ask=True)
        return super().on_request(dest, request)


def _decided(chain: Chain, target: str, headers: list[tuple[bytes, bytes]]) -> Request:
    request = Request("GET", target, list(headers), 0)
    verdict = chain.request(_dest(), request)
    if verdict is not None and verdict.allowed:
        chain.rewrite(_dest(), request)
    return request


def test_an_identical_request_is_replayed_not_decided_again() -> None:
    """A keep-alive client repeats itself: the hooks' verdict, audit fields, body
    limit and rewrite of a request are kept and replayed for the same request
    (method, target, headers, body length, destination); twins: a request that
    differs in one header byte, or goes to another port, is decided anew."""
    stub = Counted()
    chain = Chain([HostRulesHook(HostRules.parse(["*"], [])), stub])
    headers = [(b"accept", b"*/*")]
    first = _decided(chain, "/public", headers)
    again = _decided(chain, "/public", headers)
    assert (stub.decided, stub.rewritten) == (1, 1)
    assert again.headers == first.headers == [*headers, (b"x-stub", b"1")]
    assert again.audit == first.audit == {"stub": 1}
    assert again.audit is not first.audit  # (the response hooks write in their own)
    assert (again.body_limit, again.body_rule) == (100, "stub.limit")
    _decided(chain, "/public", [(b"accept", b"*/+")])
    assert (stub.decided, stub.rewritten) == (2, 2)
    other_port = Request("GET", "/public", list(headers), 0)
    chain.request(Destination("run", "https", "api.example.org", 8443), other_port)
    assert stub.decided == 3
    for _ in range(2):  # a deny is replayed too
        verdict = chain.request(_dest(), Request("GET", "/secret", list(headers), 0))
        assert verdict is not None and not verdict.allowed and verdict.rule == "stub"
    assert stub.decided == 4


def test_an_ask_is_decided_every_time() -> None:
    """An ask goes to a person (or a grant that expires): never replayed."""
    stub = Counted()
    chain = Chain([HostRulesHook(HostRules.parse(["*"], [])), stub])
    for count in (1, 2):
        verdict = chain.request(_dest(), Request("GET", "/ask", [], 0))
        assert verdict is not None and verdict.ask and stub.decided == count


def test_a_hook_that_is_not_replayable_is_called_every_time() -> None:
    """One hook whose decision may change (the base default) and the destination's
    requests are all decided anew, even where the other hooks could be replayed."""
    stub, counted = Stub([("api.example.org", "k")]), Counted()
    chain = Chain([HostRulesHook(HostRules.parse(["*"], [])), counted, stub])
    for count in (1, 2):
        _decided(chain, "/public", [])
        assert (counted.decided, stub.rewritten) == (count, count)


def test_a_request_decided_with_its_body_is_not_replayed() -> None:
    """A hook that asked for the body decides with it: that decision holds for that
    body only, and is never replayed for another request with the same head."""
    stub = Counted()
    chain = Chain([HostRulesHook(HostRules.parse(["*"], [])), stub])
    for count in (1, 2):
        request = Request("POST", "/public", [], 4)
        request.body = b"body"
        chain.request(_dest(), request)
        assert stub.decided == count and request.replay is None
    wants = Request("POST", "/public", [], 4)
    wants.want_body(4)
    chain.request(_dest(), wants)
    assert wants.replay is None


def test_what_is_kept_for_replay_is_bounded() -> None:
    """A request too large to keep is decided every time; the kept ones are at most
    Chain.REPLAYS."""
    stub = Counted()
    chain = Chain([HostRulesHook(HostRules.parse(["*"], [])), stub])
    big = [(b"x-big", b"v" * 9000)]
    many = [(b"a", b"")] * 100  # few bytes, but each header a tuple kept (found by attacking)
    for count in (1, 2):
        _decided(chain, "/public", big)
        _decided(chain, "/public", many)
        assert stub.decided == 2 * count
    for n in range(Chain.REPLAYS + 5):
        _decided(chain, f"/p{n}", [])
    assert len(chain._replays) <= Chain.REPLAYS
