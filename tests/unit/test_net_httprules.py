"""Method and path rules (corral.net.httprules): path normalization, glob semantics,
decisions (deny wins, ask, default deny, body limits) and the git preset, pure."""

from __future__ import annotations

import pytest

from corral.net.hooks import Chain, Destination, HostRulesHook, Request
from corral.net.httprules import (
    ASK_REASON,
    BadPath,
    HttpRules,
    HttpRulesHook,
    PathGlob,
    normalize_target,
    readings,
    slash_kept,
)
from corral.net.rules import HostRules, Verdict

# -- normalization ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "path"),
    [
        (b"/", "/"),
        (b"/a/b", "/a/b"),
        (b"/a/b/", "/a/b/"),  # a trailing slash is part of the path
        (b"//a///b", "/a/b"),  # empty segments merge, as nginx and most routers do
        (b"/a%2Fb", "/a/b"),
        (b"/%41pi", "/Api"),
        (b"/caf%C3%A9", "/caf\u00e9"),
        (b"/a%20b", "/a b"),
        (b"*", "*"),
    ],
)
def test_paths_are_decoded_once_and_normalized(target: bytes, path: str) -> None:
    assert normalize_target(target)[0] == path


@pytest.mark.parametrize(
    ("target", "why"),
    [
        (b"/a%2", "malformed percent-escape"),
        (b"/a%zz", "malformed percent-escape"),
        (b"/a%252Fb", "double-encoded"),  # %25 2F: a server that decodes twice sees a /
        (b"/%ff", "not UTF-8"),
        (b"/a%00b", "control character"),
        (b"/a%0Ab", "control character"),
        (b"/a%5Cb", "backslash"),
        (b"/a\\b", "backslash"),
        (b"/admin;x=1/secret", "';'"),  # Tomcat reads /admin/secret
        (b"/public/..;/admin", "';'"),
        (b"/a%3Bb", "';'"),
        (b"/a#frag", "fragment"),
        # the origin gets the target as sent, and not every one resolves dot segments
        (b"/a/../b", "'..' segment"),
        (b"/a/./b", "'..' segment"),
        (b"/../../etc/passwd", "'..' segment"),
        (b"/a/b/..", "'..' segment"),
        (b"/a/.", "'..' segment"),
        (b"/public/..%2Fadmin", "'..' segment"),  # %2F is a / ...
        (b"/public/%2e%2e/admin", "'..' segment"),  # ... and %2e a .
        (b"/public/.%2E/admin", "'..' segment"),
        (b"a/b", "does not start with /"),
        (b"/x?a=%zz", "malformed percent-escape in the query"),
    ],
)
def test_ambiguous_targets_are_refused(target: bytes, why: str) -> None:
    with pytest.raises(BadPath, match=why):
        normalize_target(target)


def test_query_is_split_into_decoded_parameters() -> None:
    assert normalize_target(b"/x") == ("/x", None)
    assert normalize_target(b"/x?") == ("/x", [])
    assert normalize_target(b"/x?a=1&b&c=%26") == ("/x", [("a", "1"), ("b", None), ("c", "&")])


@pytest.mark.parametrize(
    ("target", "kept"),
    [
        (b"/a/b", None),
        (b"/a%20b/c", None),
        (b"/p/group%2Fproject", "/p/group%2Fproject"),
        (b"/p/group%2fproject/", "/p/group%2Fproject/"),
        (b"/p/%67roup%2F%70roject?x=%2F", "/p/group%2Fproject"),
        (b"//p//a%2F", "/p/a%2F"),
    ],
)
def test_slash_kept_reads_an_encoded_slash_as_part_of_its_segment(
    target: bytes, kept: str | None
) -> None:
    assert slash_kept(target) == kept


def test_a_deny_matches_an_encoded_slash_either_way_an_allow_only_decoded() -> None:
    entries: list[dict[str, object]] = [
        {"host": "api.test", "paths": ["/p/**"], "action": "allow"},
        {"host": "api.test", "paths": ["/p/*"], "methods": ["DELETE"], "action": "deny"},
        {"host": "api.test", "paths": ["/p/*/x"], "methods": ["PUT"], "action": "ask"},
        {"host": "api.test", "paths": ["/q/*"], "action": "allow"},
    ]
    rules = HttpRules.from_entries(entries)

    def verdict(method: str, target: bytes) -> tuple[bool, bool, str]:
        found, _ = rules.decide("api.test", 443, method, target)
        assert found is not None
        return found.allowed, found.ask, found.rule

    assert verdict("DELETE", b"/p/a%2Fb") == (False, False, "network.rules[2]")
    assert verdict("DELETE", b"/p/a/b") == (True, False, "network.rules[1]")
    assert verdict("PUT", b"/p/a%2Fb/x") == (False, True, "network.rules[3]")
    assert verdict("GET", b"/q/a%2Fb") == (False, False, "network.rules")  # decoded: 2 segments
    # a deny or ask holds in any case and with or without a trailing slash ...
    assert verdict("DELETE", b"/P/a/") == (False, False, "network.rules[2]")
    assert verdict("PUT", b"/p/A%2fB/X/") == (False, True, "network.rules[3]")
    # ... an allow only as written
    assert verdict("GET", b"/Q/a") == (False, False, "network.rules")
    assert verdict("GET", b"/q/a/") == (False, False, "network.rules")
    assert verdict("GET", b"/q/a") == (True, False, "network.rules[4]")


def test_readings_are_the_paths_a_lenient_router_may_route() -> None:
    assert readings(b"/", "/") == ("/",)
    assert readings(b"/a/b", "/a/b") == ("/a/b", "/a/b/")
    assert readings(b"/a/b/", "/a/b/") == ("/a/b/", "/a/b")
    assert readings(b"/p/g%2Fx/", "/p/g/x/") == ("/p/g/x/", "/p/g/x", "/p/g%2Fx", "/p/g%2Fx/")
    # Rails' (.:format): the last segment without its one suffix
    assert readings(b"/a/b.json", "/a/b.json") == ("/a/b.json", "/a/b.json/", "/a/b", "/a/b/")
    assert readings(b"/a/b.c.d/", "/a/b.c.d/") == ("/a/b.c.d/", "/a/b.c.d", "/a/b.c", "/a/b.c/")
    assert readings(b"/a.b/c", "/a.b/c") == ("/a.b/c", "/a.b/c/")  # not in the last segment
    assert readings(b"/a/.json", "/a/.json") == ("/a/.json", "/a/.json/")  # no name before it
    assert readings(b"/a/b.", "/a/b.") == ("/a/b.", "/a/b./")  # no format after it


# -- globs --------------------------------------------------------------------------------------


def match(glob: str, target: bytes) -> bool:
    path, query = normalize_target(target)
    return PathGlob(glob).matches(path, query)


@pytest.mark.parametrize(
    ("glob", "target", "expected"),
    [
        ("/api/*", b"/api/users", True),
        ("/api/*", b"/api/users/1", False),  # * stays within a segment
        ("/api/*", b"/api/a%2Fb", False),  # ... an encoded / included
        ("/api/*", b"/api/", True),  # * matches an empty segment
        ("/api/*", b"/api", False),
        ("/api/**", b"/api", True),  # ** matches no segment at all
        ("/api/**", b"/api/", True),
        ("/api/**", b"/api/v1/users/7", True),
        ("/api/**", b"/apix", False),
        ("/api/**", b"/api/.hidden", True),  # a segment that only starts with a dot
        ("/api/*", b"/api/...", True),
        ("/**/info/refs", b"/info/refs", True),
        ("/**/info/refs", b"/o/r.git/info/refs", True),
        ("/**/info/refs", b"/o/r.git/info/refsx", False),
        ("/a/**/z", b"/a/z", True),
        ("/a/**/z", b"/a/b/c/z", True),
        ("/a/**/z", b"/a/b/c/zz", False),
        ("/v*/users", b"/v2/users", True),
        ("/v*/users", b"/v2/x/users", False),
        ("/a", b"/a/", False),  # a trailing slash is significant
        ("/a/", b"/a/", True),
        ("/a/b", b"//a//b", True),
        ("/files/a b", b"/files/a%20b", True),  # globs are written decoded
        ("/x", b"/x?anything=1", True),  # no ? in the glob: any query
        ("/x?service=git-upload-pack", b"/x?service=git-upload-pack", True),
        ("/x?service=git-upload-pack", b"/x?service=git-receive-pack", False),
        ("/x?service=git-upload-pack", b"/x", False),
        ("/x?service=git-upload-pack", b"/x?service=git-upload-pack&service=x", False),
        ("/x?service=git-upload-pack", b"/x?service%3Dgit-upload-pack", False),  # one key
        ("/x?service=git-upload-pack", b"/x?service=git%2Dupload-pack", True),  # decoded
        ("/x?a=*&b", b"/x?a=anything&b", True),
        ("/x?a=*&b", b"/x?a=1&b=2", False),  # b has no value in the glob
        ("/*", b"/", True),
        ("/", b"/", True),
        ("/**", b"/any/thing", True),
    ],
)
def test_glob_semantics(glob: str, target: bytes, expected: bool) -> None:
    assert match(glob, target) is expected


@pytest.mark.parametrize(
    ("glob", "why"),
    [
        ("api/*", "must start with /"),
        ("/a//b", "empty segment"),
        ("/a/../b", "'.' and '..'"),
        ("/a**", "whole segment"),
        ("/***", "whole segment"),
        ("/[ab]", "'\\[' is not allowed"),
        ("/{a,b}", "is not allowed"),
        ("/a%20b", "'%' is not allowed"),
        ("/a;b", "is not allowed"),
        ("/a\\b", "is not allowed"),
        ("/x?", "nothing after"),
        ("/x?a=**", "no meaning in a query"),
    ],
)
def test_bad_globs_are_refused_with_the_reason(glob: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        PathGlob(glob)


# -- decisions ----------------------------------------------------------------------------------

ENTRIES: list[dict[str, object]] = [
    {"host": "api.test", "methods": ["GET", "HEAD"], "paths": ["/v1/**"], "action": "allow"},
    {"host": "api.test", "methods": ["POST"], "paths": ["/v1/upload"], "action": "allow",
     "max_body": 100},
    {"host": "api.test", "methods": ["POST"], "paths": ["/v1/**"], "action": "allow",
     "max_body": 50},
    {"host": "api.test", "paths": ["/v1/admin/**"], "action": "deny"},
    {"host": "api.test", "methods": ["PUT"], "action": "ask"},
    {"host": "*.git.test", "git": "read"},
    {"host": "push.git.test", "git": "write"},
]  # fmt: skip


def decide(
    method: str, target: bytes, host: str = "api.test", port: int = 443
) -> tuple[bool, str, str, int | None]:
    verdict, limit = HttpRules.from_entries(ENTRIES).decide(host, port, method, target)
    assert verdict is not None
    return verdict.allowed, verdict.rule, verdict.reason, limit.max_body if limit else None


def test_allowed_method_and_path_and_its_deny_twin() -> None:
    assert decide("GET", b"/v1/users")[:2] == (True, "network.rules[1]")
    allowed, rule, reason, _ = decide("DELETE", b"/v1/users")
    assert not allowed and rule == "network.rules" and "DELETE /v1/users" in reason


def test_a_host_with_rules_denies_what_no_rule_matches() -> None:
    assert decide("GET", b"/v2/users")[:2] == (False, "network.rules")


def test_deny_wins_over_a_matching_allow() -> None:
    assert decide("GET", b"/v1/admin/keys")[:2] == (False, "network.rules[4]")
    assert decide("GET", b"/v1/x/../admin/keys")[:2] == (False, "bad-path")
    assert decide("GET", b"//v1//admin//keys")[:2] == (False, "network.rules[4]")


def test_methods_are_compared_case_insensitively() -> None:
    assert decide("get", b"/v1/users")[0] is True
    assert decide("delete", b"/v1/users")[0] is False


def test_ask_is_a_structured_verdict_denied_until_an_approver_exists() -> None:
    verdict, _ = HttpRules.from_entries(ENTRIES).decide("api.test", 443, "PUT", b"/v1/x")
    assert verdict is not None
    assert not verdict.allowed and verdict.ask and verdict.reason == ASK_REASON
    assert verdict.rule == "network.rules[5]"
    # deny still wins over ask
    verdict, _ = HttpRules.from_entries(ENTRIES).decide("api.test", 443, "PUT", b"/v1/admin/x")
    assert verdict is not None and not verdict.ask and verdict.rule == "network.rules[4]"


def test_the_smallest_body_limit_of_the_matching_allows_applies() -> None:
    assert decide("POST", b"/v1/upload") == (True, "network.rules[2]", "", 50)
    assert decide("POST", b"/v1/other")[3] == 50
    assert decide("GET", b"/v1/upload")[3] is None


def test_ambiguous_path_to_a_ruled_host_is_denied() -> None:
    allowed, rule, reason, _ = decide("GET", b"/v1/admin;x/keys")
    assert not allowed and rule == "bad-path" and "';'" in reason


def test_hosts_without_rules_are_not_decided() -> None:
    rules = HttpRules.from_entries(ENTRIES)
    assert rules.decide("other.test", 443, "DELETE", b"/anything") == (None, None)
    assert rules.decide("git.test", 443, "GET", b"/") == (None, None)  # *. is not the apex


def test_git_read_preset_allows_clone_and_fetch_only() -> None:
    host = "code.git.test"
    assert decide("GET", b"/o/r.git/info/refs?service=git-upload-pack", host)[0]
    assert decide("POST", b"/o/r.git/git-upload-pack", host)[0]
    assert decide("GET", b"/o/r/info/refs?service=git-upload-pack", host)[0]
    assert not decide("GET", b"/o/r.git/info/refs?service=git-receive-pack", host)[0]
    assert not decide("POST", b"/o/r.git/git-receive-pack", host)[0]
    assert not decide("GET", b"/o/r.git/info/refs", host)[0]  # the dumb protocol
    assert not decide("GET", b"/o/r.git/HEAD", host)[0]
    assert decide("GET", b"/o/r.git/info/refs?service=git-upload-pack", host)[1] == (
        "network.rules[6] (git read)"
    )
    # a refused push says so: its path alone reads as clone's /info/refs
    for method, target in (
        ("GET", b"/o/r.git/info/refs?service=git-receive-pack"),
        ("POST", b"/o/r.git/git-receive-pack"),
    ):
        reason = decide(method, target, host)[2]
        assert reason.startswith("git push to code.git.test: no rule allows it (git = "), reason
    assert decide("GET", b"/o/r.git/HEAD", host)[2].startswith("no rule for code.git.test allows")


def test_git_write_preset_allows_push_too() -> None:
    host = "push.git.test"
    assert decide("GET", b"/r.git/info/refs?service=git-receive-pack", host)[0]
    assert decide("POST", b"/r.git/git-receive-pack", host)[0]
    assert decide("POST", b"/r.git/git-upload-pack", host)[0]


# -- the hook in a chain ------------------------------------------------------------------------


def chain() -> Chain:
    return Chain([HostRulesHook(HostRules.parse(["*"], [])), HttpRulesHook.from_policy(ENTRIES)])


def request(method: str, target: str, host: str = "api.test") -> tuple[Destination, Request]:
    dest = Destination("run", "http", host, 80)
    dest.method, dest.path = method, target
    return dest, Request(method, target, [], 0)


def test_hook_sets_the_body_limit_and_names_its_rule() -> None:
    dest, req = request("POST", "/v1/upload")
    verdict = chain().request(dest, req)
    assert verdict is not None and verdict.allowed
    assert (req.body_limit, req.body_rule) == (50, "network.rules[3]")


def test_ruled_hosts_are_inspected_and_others_are_not() -> None:
    c = chain()
    assert c.needs_inspection("api.test", 443)
    assert c.needs_inspection("code.git.test", 443)
    assert not c.needs_inspection("other.test", 443)
    assert not c.needs_inspection("git.test", 443)


def test_hook_names_each_entry_for_passthrough_errors() -> None:
    hook = HttpRulesHook.from_policy(ENTRIES)
    assert hook.inspects()[0] == ("api.test", "network.rules[1].host")
    assert hook.inspects()[5] == ("*.git.test", "network.rules[6].host")


# -- the per-destination fast path --------------------------------------------------------------


def test_a_cached_decision_is_the_same_and_its_twins_are_not_mixed_up() -> None:
    c = chain()
    for _ in range(2):  # the second time from the cache
        dest, req = request("GET", "/v1/users")
        verdict = c.request(dest, req)
        assert verdict is not None and verdict.allowed and verdict.rule == "network.rules[1]"
        dest, req = request("DELETE", "/v1/users")  # same target, other method: denied
        verdict = c.request(dest, req)
        assert verdict is not None and not verdict.allowed and verdict.rule == "network.rules"
        dest, req = request("GET", "/v1/admin/keys")
        verdict = c.request(dest, req)
        assert verdict is not None and not verdict.allowed and verdict.rule == "network.rules[4]"
        dest, req = request("DELETE", "/v1/users", host="other.test")  # no entry: no say
        assert c.request(dest, req) is None


def test_the_same_target_is_decided_per_port() -> None:
    entries: list[dict[str, object]] = [{"host": "api.test:443", "action": "deny"}]
    c = Chain([HostRulesHook(HostRules.parse(["*"], [])), HttpRulesHook.from_policy(entries)])
    denied = c.request(Destination("run", "https", "api.test", 443), Request("GET", "/", [], 0))
    assert denied is not None and not denied.allowed
    other = Destination("run", "https", "api.test", 8443)  # the twin: not that port
    assert c.request(other, Request("GET", "/", [], 0)) is None


def test_a_long_target_is_decided_without_being_kept() -> None:
    c = chain()
    hook = c.hooks[1]
    assert isinstance(hook, HttpRulesHook)
    verdict = c.request(*request("GET", "/v1/" + "a" * 5000))
    assert verdict is not None and verdict.allowed
    verdict = c.request(*request("GET", "/v1/admin/" + "a" * 5000))
    assert verdict is not None and not verdict.allowed and verdict.rule == "network.rules[4]"
    assert all(len(key[3]) < 5000 for key in hook.rules.decided)


def test_the_chain_asks_only_hooks_that_see_a_destination() -> None:
    hook = HttpRulesHook.from_policy(ENTRIES)
    assert hook.sees_requests_to("api.test", 443) and not hook.sees_requests_to("other.test", 443)
    c = chain()
    assert c.plan("api.test", 80).on_request and not c.plan("other.test", 80).on_request


def test_several_globs_of_one_entry_match_as_one_pattern_and_each_alone() -> None:
    entries: list[dict[str, object]] = [
        {"host": "a.test", "paths": ["/one/*", "/two/**", "/x*y"], "action": "allow"},
        {"host": "b.test", "paths": ["/q?k=*", "/plain/**"], "action": "allow"},  # one query
    ]
    rules = HttpRules.from_entries(entries)
    assert rules.rules[0].path_match is not None and rules.rules[1].path_match is None

    def allowed(host: str, target: bytes) -> bool | None:
        verdict, _ = rules.decide(host, 443, "GET", target)
        return None if verdict is None else verdict.allowed

    for target in (b"/one/a", b"/two", b"/two/a/b", b"/xany-thingy"):
        assert allowed("a.test", target) is True
    for target in (b"/one/a/b", b"/one", b"/twofold", b"/x/y", b"/xy/"):  # the deny twins
        assert allowed("a.test", target) is False
    assert allowed("b.test", b"/q?k=v") is True and allowed("b.test", b"/plain/x?any=1") is True
    assert allowed("b.test", b"/q?j=v") is False and allowed("b.test", b"/q") is False


def test_an_ask_still_looks_at_what_a_request_may_be_served_as() -> None:
    """Deny /admin/**, deny DELETE, ask for the rest: GET /x carrying X-Original-URL:
    /admin/delete or X-HTTP-Method-Override: DELETE was held as a plain GET /x
    (the ask returned before the alternates were looked at), and a person who
    approved it let a denied path or method through (found by attacking the
    approvals).  Denied, deny winning; the twin: GET /x alone is asked."""
    entries: list[dict[str, object]] = [
        {"host": "api.test", "paths": ["/admin/**"], "action": "deny"},
        {"host": "api.test", "methods": ["DELETE"], "action": "deny"},
        {"host": "api.test", "paths": ["/**"], "action": "ask"},
    ]
    chain = Chain([HostRulesHook(HostRules.parse(["*"], [])), HttpRulesHook.from_policy(entries)])
    dest = Destination("run", "https", "api.test", 443)
    for header in ((b"x-original-url", b"/admin/delete"), (b"x-http-method-override", b"DELETE")):
        verdict = chain.request(dest, Request("GET", "/x", [header], 0))
        assert verdict is not None and not verdict.allowed and not verdict.ask, header
    asked = chain.request(dest, Request("GET", "/x", [], 0))
    assert asked is not None and asked.ask
    query = chain.request(dest, Request("GET", "/x?_method=DELETE", [], 0))
    assert query is not None and not query.allowed and not query.ask


def test_override_headers_are_read_as_cgi_servers_read_their_names() -> None:
    """CGI and WSGI servers read X_HTTP_Method_Override as X-HTTP-Method-Override
    (both become HTTP_X_HTTP_METHOD_OVERRIDE): the underscore spellings got past a
    deny (found by attacking the fixes).  Denied; the twin: a header of its own
    with an underscore, and nothing else, is allowed."""
    entries: list[dict[str, object]] = [
        {"host": "api.test", "paths": ["/admin/**"], "action": "deny"},
        {"host": "api.test", "methods": ["DELETE"], "action": "deny"},
        {"host": "api.test", "action": "allow"},
    ]
    chain = Chain([HostRulesHook(HostRules.parse(["*"], [])), HttpRulesHook.from_policy(entries)])
    dest = Destination("run", "https", "api.test", 443)
    for header in (
        (b"x_http_method_override", b"DELETE"),
        (b"x-http-method_override", b"DELETE"),
        (b"x_original_url", b"/admin/delete"),
    ):
        verdict = chain.request(dest, Request("POST", "/x", [header], 0))
        assert verdict is not None and not verdict.allowed, header
    fine = chain.request(dest, Request("POST", "/x", [(b"x_trace_id", b"1")], 0))
    assert fine is not None and fine.allowed


def test_a_head_passes_only_where_a_get_would_pass_too() -> None:
    """A HEAD is served with the GET handler (Werkzeug, Starlette, Express, Rails,
    Django), so a deny or ask of GET that HEAD passed let the GET's side effects
    run (found by attacking the proxy).  A HEAD is decided as a GET too: denied
    where GET is denied or not allowed (a rule allowing HEAD alone no longer
    lets it through), asked where GET asks, also when an override header or
    ``_method`` names HEAD.  Twins: where GET and HEAD are allowed, HEAD passes;
    where GET is allowed but HEAD is not, HEAD is still denied."""
    entries: list[dict[str, object]] = [
        {"host": "api.test", "methods": ["GET", "HEAD", "POST"], "paths": ["/v1/**"],
         "action": "allow"},
        {"host": "api.test", "methods": ["GET"], "paths": ["/v1/admin/**"], "action": "deny"},
        {"host": "api.test", "methods": ["GET"], "paths": ["/v1/review/**"], "action": "ask"},
        {"host": "api.test", "methods": ["HEAD"], "paths": ["/head-only/**"], "action": "allow"},
        {"host": "api.test", "methods": ["GET"], "paths": ["/get-only/**"], "action": "allow"},
    ]  # fmt: skip
    chain = Chain([HostRulesHook(HostRules.parse(["*"], [])), HttpRulesHook.from_policy(entries)])
    dest = Destination("run", "https", "api.test", 443)

    def verdict(method: str, target: str, headers: list[tuple[bytes, bytes]] | None = None) -> str:
        found = chain.request(dest, Request(method, target, headers or [], 0))
        assert found is not None
        return found.decision

    assert verdict("HEAD", "/v1/admin/reset") == "deny"
    assert verdict("head", "/v1/admin/reset") == "deny"
    assert verdict("HEAD", "/v1/review/x") == "ask"
    assert verdict("HEAD", "/head-only/x") == "deny"  # GET is not allowed there
    override = [(b"x-http-method-override", b"HEAD")]
    assert verdict("POST", "/v1/admin/reset", override) == "deny"
    assert verdict("POST", "/v1/admin/reset?_method=HEAD") == "deny"
    assert verdict("HEAD", "/v1/x", [(b"x-original-url", b"/v1/admin/reset")]) == "deny"
    assert verdict("HEAD", "/v1/users") == "allow"  # the twins
    assert verdict("POST", "/v1/users", override) == "allow"
    assert verdict("HEAD", "/get-only/x") == "deny"  # as before: no rule allows HEAD
    assert verdict("GET", "/get-only/x") == "allow"


GIT_POST = [(b"content-type", b"application/x-git-upload-pack-request")]


def git_request(target: str, headers: list[tuple[bytes, bytes]]) -> Verdict | None:
    dest = Destination("run", "https", "code.git.test", 443)
    return chain().request(dest, Request("POST", target, headers, 100))


def test_a_git_preset_passes_a_fetch_only_as_git_sends_it() -> None:
    """A forge's API on the git host: a POST whose path merely ends in
    git-upload-pack (Gitea's create-a-file endpoint, a commit) was let through
    by `git = "read"` with the token (found by attacking the proxy)."""
    fetch = git_request("/o/r.git/git-upload-pack", GIT_POST)  # the allow twin
    assert fetch is not None and fetch.allowed
    json_body = [(b"content-type", b"application/json")]
    for target, headers in (
        ("/api/v1/repos/o/r/contents/git-upload-pack", json_body),
        ("/api/v1/repos/o/r/contents/git-upload-pack", []),
        ("/api/v4/projects/o%2Fr/repository/files/src%2Fgit-upload-pack", GIT_POST),
        ("/api/v4/projects/7/repository/files/git-upload-pack?branch=main", GIT_POST),
    ):
        verdict = git_request(target, headers)
        assert verdict is not None and not verdict.allowed, target
    refused = git_request("/api/v1/repos/o/r/contents/git-upload-pack", json_body)
    assert refused is not None and "git's content type" in refused.reason


def test_a_rule_of_the_users_own_allows_beyond_the_preset() -> None:
    entries: list[dict[str, object]] = [
        {"host": "code.git.test", "git": "read"},
        {"host": "code.git.test", "methods": ["POST"], "paths": ["/api/**"], "action": "allow"},
    ]
    rules = HttpRulesHook.from_policy(entries)
    c = Chain([HostRulesHook(HostRules.parse(["*"], [])), rules])
    dest = Destination("run", "https", "code.git.test", 443)
    json_body = [(b"content-type", b"application/json")]
    api = c.request(
        dest, Request("POST", "/api/v1/repos/o/r/contents/git-upload-pack", json_body, 0)
    )
    assert api is not None and api.allowed and api.rule == "network.rules[2]"
    other = c.request(dest, Request("POST", "/o/r/contents/git-upload-pack", json_body, 0))
    assert other is not None and not other.allowed
