"""Credentials that never enter the sandbox (corral.net.secrets), pure: the hook's
decisions, rewrites and response hiding, and reading the sources."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import cast

import pytest

from corral.errors import EXIT_REFUSED, CorralError, PolicyError
from corral.net.hooks import (
    BodyFilter,
    Chain,
    Destination,
    Hook,
    HostRulesHook,
    Request,
    Response,
)
from corral.net.rules import HostRules
from corral.net.secrets import SecretsHook, new_placeholder, read_value
from corral.policy import Policy, Secret

REAL = b"sk-real-9f8e7d6c5b4a"
OTHER_REAL = b"other-real-value"
# what every request to a host of the secrets asks for: a body the proxy can check, whole
WHOLE = (b"accept-encoding", b"identity")
BASE64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def make_policy(tmp_path: Path) -> Policy:
    policy = Policy(str(tmp_path))
    policy.network.mode = "proxy"
    policy.secrets = {
        "API_KEY": Secret("API_KEY", "env:CORRAL_TEST_REAL", ["api.test"]),
        "BEARER": Secret(
            "BEARER", "file:token.txt", ["bearer.test:443"], "authorization", "Bearer {value}"
        ),
    }
    (tmp_path / "token.txt").write_bytes(OTHER_REAL + b"\n")
    return policy


@pytest.fixture
def hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SecretsHook:
    monkeypatch.setenv("CORRAL_TEST_REAL", REAL.decode())
    h = SecretsHook(make_policy(tmp_path))
    h.open()
    return h


def placeholder(h: SecretsHook, name: str) -> str:
    return h.sandbox_env()[name]


def exchange(
    h: SecretsHook,
    host: str,
    target: str,
    headers: list[tuple[bytes, bytes]] | None = None,
    port: int = 443,
) -> tuple[bool | None, Request, Destination]:
    """on_request, then (if not denied) rewrite, as the proxy does."""
    chain = Chain([HostRulesHook(HostRules.parse(["*"], [])), h])
    dest = Destination("run", "https", host, port)
    req = Request("GET", target, list(headers or []), 0)
    verdict = chain.request(dest, req)
    if verdict is None or verdict.allowed:
        chain.rewrite(dest, req)
    return (None if verdict is None else verdict.allowed), req, dest


def test_placeholders_are_per_run_with_128_random_bits(hook: SecretsHook, tmp_path: Path) -> None:
    first = placeholder(hook, "API_KEY")
    assert first.startswith("corral-secret-API_KEY-") and len(first.rsplit("-", 1)[1]) == 32
    hook.open()  # a new run
    assert placeholder(hook, "API_KEY") != first
    assert REAL.decode() not in str(hook.sandbox_env())
    assert new_placeholder("X") != new_placeholder("X")


def test_values_swapped_in_headers_path_and_query_for_the_right_host(hook: SecretsHook) -> None:
    ph = placeholder(hook, "API_KEY")
    verdict, req, _ = exchange(
        hook, "api.test", f"/v1/{ph}/x?key={ph}&b=1", [(b"x-api-key", ph.encode())]
    )
    assert verdict is None  # the secrets hook has no say in allowing
    assert req.target == f"/v1/{REAL.decode()}/x?key={REAL.decode()}&b=1"
    assert req.headers == [(b"x-api-key", REAL), WHOLE]
    assert req.audit == {"secrets": ["API_KEY"]}


def test_basic_auth_credentials_are_swapped_inside_the_base64(hook: SecretsHook) -> None:
    ph = placeholder(hook, "API_KEY")
    basic = b"Basic " + base64.b64encode(f"user:{ph}".encode())
    _, req, _ = exchange(hook, "api.test", "/", [(b"authorization", basic)])
    assert req.headers == [(b"authorization", b"Basic " + base64.b64encode(b"user:" + REAL)), WHOLE]
    assert req.audit == {"secrets": ["API_KEY"]}


def test_header_is_set_on_every_request_to_its_hosts(hook: SecretsHook) -> None:
    _, req, _ = exchange(hook, "bearer.test", "/", [(b"authorization", b"Bearer stolen")])
    assert req.headers == [(b"authorization", b"Bearer " + OTHER_REAL), WHOLE]
    assert req.audit == {"secrets": ["BEARER"]}
    _, other, _ = exchange(hook, "bearer.test", "/", [], port=8443)  # not its port
    # (no header set; asked for plain, as on every port of its name: echoes are hidden there)
    assert other.headers == [WHOLE] and other.audit == {}


@pytest.mark.parametrize(
    "where",
    ["header", "path", "query", "encoded-path", "basic"],
)
def test_placeholder_to_another_host_is_denied_wherever_it_is(
    hook: SecretsHook, where: str
) -> None:
    ph = placeholder(hook, "API_KEY")
    encoded = "".join(f"%{b:02X}" for b in ph.encode())
    target, headers = "/", []
    if where == "header":
        headers = [(b"x-api-key", ph.encode())]
    elif where == "path":
        target = f"/{ph}"
    elif where == "query":
        target = f"/x?k={ph}"
    elif where == "encoded-path":
        target = f"/{encoded}"
    else:
        headers = [(b"authorization", b"Basic " + base64.b64encode(f"u:{ph}".encode()))]
    allowed, req, _ = exchange(hook, "evil.test", target, headers)
    assert allowed is False
    assert req.audit == {"secrets": ["API_KEY"]}  # the audit line names the secret
    assert REAL not in req.target.encode() and all(REAL not in v for _, v in req.headers)
    # the twin: the same request to the secret's own host goes through
    assert exchange(hook, "api.test", target, headers)[0] is None


def test_wrong_host_verdict_names_the_secret_not_the_value(hook: SecretsHook) -> None:
    ph = placeholder(hook, "API_KEY")
    chain = Chain([HostRulesHook(HostRules.parse(["*"], [])), hook])
    dest = Destination("run", "http", "evil.test", 80)
    verdict = chain.request(dest, Request("GET", f"/?k={ph}", [], 0))
    assert verdict is not None and verdict.rule == "secret-wrong-host"
    assert "API_KEY" in verdict.reason and REAL.decode() not in verdict.reason


def test_echoed_values_come_back_as_placeholders(hook: SecretsHook) -> None:
    ph = placeholder(hook, "API_KEY")
    chain = Chain([hook])
    dest = Destination("run", "https", "api.test", 443)
    req = Request("GET", "/", [(b"x-key", ph.encode())], 0)
    assert chain.request(dest, req) is None  # it carries the secret: its echo is hidden
    echo = b"Basic " + base64.b64encode(b"u:" + REAL)
    response = Response(
        200, [(b"x-echo", b"key=" + REAL), (b"x-basic", echo), (b"location", b"/a?k=" + REAL)]
    )
    chain.response(dest, req, response)
    values = dict(response.headers)
    assert values[b"x-echo"] == b"key=" + ph.encode()
    assert base64.b64decode(values[b"x-basic"].split()[1]) == b"u:" + ph.encode()
    assert values[b"location"] == b"/a?k=" + ph.encode()
    # a host no secret goes to: nothing of one can come back, nothing is scanned
    elsewhere = Destination("run", "https", "other.test", 443)
    plain = Request("GET", "/", [], 0)
    assert chain.request(elsewhere, plain) is None
    untouched = Response(200, [(b"x-echo", b"key=" + REAL)])
    chain.response(elsewhere, plain, untouched)
    assert untouched.headers == [(b"x-echo", b"key=" + REAL)]


def test_value_needing_escapes_is_percent_encoded_in_a_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_TEST_REAL", "a b&c")
    h = SecretsHook(make_policy(tmp_path))
    h.open()
    _, req, _ = exchange(h, "api.test", f"/?k={placeholder(h, 'API_KEY')}")
    assert req.target == "/?k=a%20b%26c"


def test_no_placeholder_no_work(hook: SecretsHook) -> None:
    allowed, req, _ = exchange(hook, "evil.test", "/plain?x=%41", [(b"accept", b"*/*")])
    assert allowed is None and req.audit == {} and req.target == "/plain?x=%41"


def test_hook_asks_to_inspect_each_secret_host(hook: SecretsHook) -> None:
    assert hook.inspects() == [
        ("api.test", "secrets.API_KEY.hosts"),
        ("bearer.test:443", "secrets.BEARER.hosts"),
    ]


def test_loaded_secrets_never_show_their_value(hook: SecretsHook) -> None:
    assert REAL.decode() not in repr(hook.secrets) and "API_KEY" in repr(hook.secrets)


# -- reading the sources ------------------------------------------------------------------------


def refused(secret: Secret, policy: Policy) -> str:
    with pytest.raises(CorralError) as info:
        read_value(secret, policy)
    assert info.value.code == EXIT_REFUSED
    assert secret.name in info.value.message
    return info.value.message


def test_missing_env_source_refuses_naming_the_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CORRAL_TEST_ABSENT", raising=False)
    message = refused(Secret("K", "env:CORRAL_TEST_ABSENT", ["a.test"]), Policy(str(tmp_path)))
    assert "CORRAL_TEST_ABSENT is not set" in message


def test_unreadable_empty_or_unfit_sources_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = Policy(str(tmp_path))
    assert "cannot read" in refused(Secret("K", "file:nope.txt", ["a.test"]), policy)
    (tmp_path / "empty.txt").write_bytes(b"\n")
    assert "is empty" in refused(Secret("K", "file:empty.txt", ["a.test"]), policy)
    monkeypatch.setenv("CORRAL_TEST_EMPTY", "")
    assert "is empty" in refused(Secret("K", "env:CORRAL_TEST_EMPTY", ["a.test"]), policy)
    (tmp_path / "two.txt").write_bytes(b"line1\nline2")
    message = refused(Secret("K", "file:two.txt", ["a.test"]), policy)
    assert "control character" in message and "line1" not in message
    if os.geteuid() != 0:  # root reads anything
        (tmp_path / "locked.txt").write_bytes(b"x")
        os.chmod(tmp_path / "locked.txt", 0)
        assert "Permission denied" in refused(Secret("K", "file:locked.txt", ["a.test"]), policy)


def test_file_source_loses_one_trailing_newline_only(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_bytes(b"tok en\r\n")
    assert read_value(Secret("K", "file:t.txt", ["a.test"]), Policy(str(tmp_path))) == b"tok en"


def test_open_checks_the_policy_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_TEST_REAL", REAL.decode())
    policy = make_policy(tmp_path)
    policy.env.pass_names.append("CORRAL_TEST_REAL")  # the real value would be inside
    with pytest.raises(PolicyError, match="CORRAL_TEST_REAL is passed into the sandbox"):
        SecretsHook(policy).open()


# -- the per-destination fast path --------------------------------------------------------------

PLACES = ["header", "path", "query", "encoded-path", "encoded-query", "basic", "BASIC", "many"]


def carrying(ph: str, where: str) -> tuple[str, list[tuple[bytes, bytes]]]:
    """A target and headers with the placeholder in one place."""
    encoded = "".join(f"%{b:02X}" for b in ph.encode())
    basic = base64.b64encode(f"u:{ph}".encode())
    return {
        "header": ("/", [(b"x-api-key", ph.encode())]),
        "path": (f"/{ph}", []),
        "query": (f"/x?k={ph}", []),
        "encoded-path": (f"/{encoded}", []),
        "encoded-query": (f"/x?k={encoded}", []),
        "basic": ("/", [(b"authorization", b"Basic " + basic)]),
        "BASIC": ("/", [(b"authorization", b"BASIC " + basic)]),  # the scheme in any case
        "many": ("/", [(b"accept", b"*/*"), (b"cookie", f"a=1; k={ph}".encode())]),
    }[where]


@pytest.mark.parametrize("where", PLACES)
def test_wrong_host_is_denied_every_time_and_its_twin_allowed_every_time(
    hook: SecretsHook, where: str
) -> None:
    target, headers = carrying(placeholder(hook, "API_KEY"), where)
    for _ in range(3):  # the first time worked out, then from the cache
        allowed, req, _ = exchange(hook, "evil.test", target, headers)
        assert allowed is False and req.audit == {"secrets": ["API_KEY"]}
        allowed, req, _ = exchange(hook, "api.test", target, headers)  # its own host
        assert allowed is None and req.audit == {"secrets": ["API_KEY"]}
        assert placeholder(hook, "API_KEY") not in req.target or where.startswith("encoded")
        if where in ("header", "many", "basic", "BASIC"):
            sent = b"".join(v for _, v in req.headers)
            assert REAL in sent or REAL in base64.b64decode(sent.split(b" ")[-1])


def test_cached_rewrites_are_per_destination(hook: SecretsHook) -> None:
    ph = placeholder(hook, "API_KEY").encode()
    headers = [(b"x-api-key", ph), (b"authorization", b"Bearer mine")]
    for _ in range(2):
        _, req, _ = exchange(hook, "api.test", "/", headers)
        assert req.headers == [(b"x-api-key", REAL), (b"authorization", b"Bearer mine"), WHOLE]
        _, req, _ = exchange(hook, "bearer.test", "/", headers)  # API_KEY may not go there
        assert req.audit == {"secrets": ["API_KEY", "BEARER"]}
        _, req, _ = exchange(hook, "bearer.test", "/", headers[1:])  # BEARER's header set
        assert req.headers == [(b"authorization", b"Bearer " + OTHER_REAL), WHOLE]
    # what rewrite wrote in a cached list is copied, never shared with a request
    _, first, _ = exchange(hook, "api.test", "/", headers)
    first.headers.append((b"x-later", b"1"))
    _, second, _ = exchange(hook, "api.test", "/", headers)
    assert (b"x-later", b"1") not in second.headers


def test_headers_changed_by_an_earlier_rewrite_are_the_ones_rewritten(hook: SecretsHook) -> None:
    ph = placeholder(hook, "API_KEY").encode()

    class AddsKey(Hook):
        name = "adds"

        def rewrite(self, dest: Destination, request: Request) -> None:
            request.headers.append((b"x-added", ph))

    chain = Chain([HostRulesHook(HostRules.parse(["*"], [])), AddsKey(), hook])
    for _ in range(2):
        dest = Destination("run", "https", "api.test", 443)
        req = Request("GET", "/", [(b"x-api-key", ph)], 0)
        assert chain.request(dest, req) is None
        chain.rewrite(dest, req)
        assert req.headers == [(b"x-api-key", REAL), (b"x-added", REAL), WHOLE]
        assert req.unchecked  # AddsKey does not check what it writes: the proxy does


def test_headers_too_long_to_keep_are_still_decided(hook: SecretsHook) -> None:
    ph = placeholder(hook, "API_KEY").encode()
    big = [(b"x-pad", b"p" * 5000), (b"x-api-key", ph)]
    allowed, _, _ = exchange(hook, "evil.test", "/", big)
    assert allowed is False
    _, req, _ = exchange(hook, "api.test", "/", big)
    assert req.headers[-2:] == [(b"x-api-key", REAL), WHOLE]
    assert all(sum(len(v) for _, v in key[3]) < 5000 for key in hook._headers)


def test_what_the_hook_writes_needs_no_check_of_its_own(hook: SecretsHook) -> None:
    """SecretsHook.writes_checked: what it writes is what the proxy's check would pass."""
    from corral.net import http1

    ph = placeholder(hook, "API_KEY")
    chain = Chain([HostRulesHook(HostRules.parse(["*"], [])), hook])
    for host in ("api.test", "bearer.test"):
        for where in PLACES:
            target, headers = carrying(ph, where)
            dest = Destination("run", "https", host, 443)
            req = Request("GET", target, [(b"content-length", b"0"), *headers], 0)
            chain.request(dest, req)
            chain.rewrite(dest, req)
            assert not req.unchecked
            assert sorted(http1.refit(req.headers, req.headers, 502)) == sorted(req.headers)
            assert http1.check_target(req.target.encode("latin-1"), 502)


def test_a_secret_that_cannot_go_in_a_header_refuses_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_TEST_REAL", REAL.decode())
    for header, fmt in (
        ("content-length", "{value}"),
        ("x-a b", "{value}"),
        ("x-k", "a\r\n{value}"),
    ):
        policy = Policy(str(tmp_path))
        policy.network.mode = "proxy"
        policy.secrets = {"K": Secret("K", "env:CORRAL_TEST_REAL", ["api.test"], header, fmt)}
        with pytest.raises(CorralError, match="secret K"):
            SecretsHook(policy).open()
    policy.secrets = {"K": Secret("K", "env:CORRAL_TEST_REAL", ["api.test"], "x-k", "T {value}")}
    SecretsHook(policy).open()  # the twin: a fit header and format


def test_an_echo_in_basic_credentials_of_any_case_is_hidden(hook: SecretsHook) -> None:
    ph = placeholder(hook, "API_KEY")
    chain = Chain([hook])
    dest = Destination("run", "https", "api.test", 443)
    req = Request("GET", "/", [(b"x-key", ph.encode())], 0)
    chain.request(dest, req)
    for scheme in (b"Basic", b"BASIC", b"bAsIc"):
        echo = scheme + b" " + base64.b64encode(b"u:" + REAL)
        response = Response(200, [(b"x-basic", echo), (b"x-plain", b"nothing")])
        chain.response(dest, req, response)
        assert base64.b64decode(response.headers[0][1].split()[1]) == b"u:" + ph.encode()
        assert response.headers[1] == (b"x-plain", b"nothing")  # the twin: left as it was
        assert not response.unchecked


def test_a_host_with_no_secret_is_still_looked_at(hook: SecretsHook) -> None:
    assert hook.sees_requests_to("anything.test", 443)


def test_only_the_hosts_a_value_goes_to_are_rewritten_and_their_responses_read(
    hook: SecretsHook,
) -> None:
    chain = Chain([HostRulesHook(HostRules.parse(["*"], [])), hook])
    elsewhere = chain.plan("anything.test", 443)  # decided (a placeholder may not go there)...
    assert elsewhere.on_request and not elsewhere.rewrite and not elsewhere.on_response
    verdict, _, _ = exchange(
        hook, "anything.test", "/", [(b"x-key", placeholder(hook, "API_KEY").encode())]
    )
    assert verdict is False  # ... and a placeholder sent there is still refused
    there = chain.plan("api.test", 443)  # the twin: a host of the value
    assert there.on_request and there.rewrite and there.on_response


def test_the_shortest_echoes_are_still_hidden(hook: SecretsHook) -> None:
    """Headers too short to hold a value are not scanned; the shortest that can
    (the bare value, the bare value in Basic credentials) are hidden."""
    ph = placeholder(hook, "API_KEY")
    chain = Chain([hook])
    dest = Destination("run", "https", "api.test", 443)
    req = Request("GET", "/", [(b"x-key", ph.encode())], 0)
    chain.request(dest, req)
    bare_basic = b"Basic " + base64.b64encode(REAL)
    response = Response(200, [(b"x-echo", REAL)])
    chain.response(dest, req, response)
    assert response.headers == [(b"x-echo", ph.encode())]
    response = Response(200, [(b"x-basic", bare_basic)])
    chain.response(dest, req, response)
    assert base64.b64decode(response.headers[0][1].split()[1]) == ph.encode()
    short = [(b"x-almost", REAL[:-1]), (b"content-length", b"2")]  # the twin: one byte short
    response = Response(200, list(short))
    chain.response(dest, req, response)
    assert response.headers == short


def test_a_rewrite_after_another_request_uses_its_own_headers(hook: SecretsHook) -> None:
    """rewrite reuses what on_request found only for the very same request: one held
    by an ask while another came through is rewritten from its own headers."""
    ph = placeholder(hook, "API_KEY")
    dest = Destination("run", "https", "api.test", 443)
    first = Request("GET", "/", [(b"x-key", ph.encode())], 0)
    second = Request("GET", "/", [(b"x-other", ph.encode())], 0)
    hook.on_request(dest, first)
    hook.on_request(dest, second)
    hook.rewrite(dest, first)
    hook.rewrite(dest, second)
    assert first.headers == [(b"x-key", REAL), WHOLE]
    assert second.headers == [(b"x-other", REAL), WHOLE]


def hidden(h: SecretsHook, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Response headers from api.test after a request that carried API_KEY."""
    chain = Chain([h])
    dest = Destination("run", "https", "api.test", 443)
    req = Request("GET", "/", [(b"x-key", placeholder(h, "API_KEY").encode())], 0)
    chain.request(dest, req)
    response = Response(200, list(headers))
    chain.response(dest, req, response)
    return response.headers


def test_echoes_in_any_url_spelling_are_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_TEST_REAL", "a key/with+signs")
    h = SecretsHook(make_policy(tmp_path))
    h.open()
    ph = placeholder(h, "API_KEY").encode()
    for spelled in (b"a+key%2fwith%2Bsigns", b"a%20key/with%2bsigns", b"a%2520key%252Fwith+signs"):
        assert hidden(h, [(b"location", b"/x?k=" + spelled + b"&n=1")]) == [
            (b"location", b"/x?k=" + ph + b"&n=1")
        ]
    # the twin: a different value in the same spellings is left as it was
    other = [(b"location", b"/x?k=a+key%2fwith%2Bsign"), (b"link", b"</a%20b>")]
    assert hidden(h, other) == other


def test_base64_cut_short_is_replaced_whole(hook: SecretsHook) -> None:
    """Base64 that holds most of the value but not all of it cannot be rewritten
    to hold the placeholder: the run becomes the placeholder."""
    ph = placeholder(hook, "API_KEY").encode()
    cut = base64.b64encode(b"ke=" + REAL)[:-4]  # all but the value's last two bytes
    assert REAL[:-2] in base64.b64decode(cut)
    assert hidden(hook, [(b"x-token", b"t=" + cut + b"; x")]) == [(b"x-token", b"t=" + ph + b"; x")]
    whole = base64.b64encode(b"ke=" + REAL)  # the twin: whole, it is rewritten
    assert hidden(hook, [(b"x-token", whole)]) == [(b"x-token", base64.b64encode(b"ke=" + ph))]


def echoed_from(
    h: SecretsHook, host: str, port: int, body: bytes, scheme: str = "https"
) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """A response from (host, port) echoing ``body`` in a header and as its body, as
    the client gets it (after a request that carried nothing)."""
    chain = Chain([h])
    dest = Destination("run", scheme, host, port)
    req = Request("GET", "/", [], 0)
    chain.request(dest, req)
    response = Response(200, [(b"x-echo", body)])
    assert chain.response(dest, req, response) is None
    out = b"".join(f.feed(body) + f.end() for f in response.filters) if response.filters else body
    return response.headers, out


def test_two_secret_hosts_pinned_to_one_address_hide_each_others_echo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """api.test and bearer.test (each the host of one secret) pinned to one gateway:
    the value sent to bearer.test came back by api.test, which hid only its own
    (found by attacking the proxy).  Every name pinned there hides every secret's
    echo, a secret host's own name included; the twins, an unruled name pinned
    there and bearer.test itself, hid it before too.  Unpinned, a secret's host is
    a server of its own, hiding only its own value."""
    monkeypatch.setenv("CORRAL_TEST_REAL", REAL.decode())
    policy = make_policy(tmp_path)
    policy.network.hosts = {
        "api.test": "127.0.0.1",
        "bearer.test": "127.0.0.1",
        "alias.test": "127.0.0.1",
    }
    h = SecretsHook(policy)
    h.open()
    ph, other_ph = placeholder(h, "API_KEY").encode(), placeholder(h, "BEARER").encode()
    echo = b"k=" + REAL + b" o=" + OTHER_REAL + b" b=" + base64.b64encode(OTHER_REAL)
    want = b"k=" + ph + b" o=" + other_ph + b" b=" + base64.b64encode(other_ph)
    for host in ("api.test", "bearer.test", "alias.test"):
        assert echoed_from(h, host, 443, echo) == ([(b"x-echo", want)], want), host
    alone = SecretsHook(make_policy(tmp_path))
    alone.open()
    _, body = echoed_from(alone, "api.test", 443, b"o=" + OTHER_REAL)
    assert body == b"o=" + OTHER_REAL


def test_a_secret_hosts_echo_is_hidden_on_every_port_of_its_name(hook: SecretsHook) -> None:
    """BEARER goes to bearer.test:443 only, API_KEY to api.test over HTTPS only: an
    origin keeps what was sent to one port and names it on another, plain HTTP
    too, and a response from bearer.test:8080 carried the value in clear (found
    by attacking the proxy).  Every port of a secret's host name is read (and
    intercepted) and hides its echo; the twins, the port the value goes to and
    the address, hid it before too.  A name no secret's host entry names
    hides nothing (no value goes there, and it shares no pin)."""
    ph, other_ph = placeholder(hook, "API_KEY").encode(), placeholder(hook, "BEARER").encode()
    for host, port, scheme, value, hidden_as in (
        ("bearer.test", 8080, "http", OTHER_REAL, other_ph),
        ("bearer.test", 8443, "https", OTHER_REAL, other_ph),
        ("api.test", 80, "http", REAL, ph),
        ("bearer.test", 443, "https", OTHER_REAL, other_ph),
        ("127.0.0.1", 8080, "http", OTHER_REAL, other_ph),
    ):
        echo = b"v=" + value + b" b=" + base64.b64encode(value)
        want = b"v=" + hidden_as + b" b=" + base64.b64encode(hidden_as)
        got = echoed_from(hook, host, port, echo, scheme)
        assert got == ([(b"x-echo", want)], want), (host, port)
        assert hook.needs_inspection(host, port), (host, port)
    assert echoed_from(hook, "elsewhere.test", 8080, REAL, "http")[1] == REAL
    assert not hook.needs_inspection("elsewhere.test", 8080)


def test_a_secret_goes_over_plain_http_only_where_its_hosts_name_a_port(
    hook: SecretsHook, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "api.test" means its HTTPS: a sandbox asking for http://api.test:80 must not
    have the key sent in clear text.  Twins: the same request over HTTPS, and
    plain HTTP where the entry names a port ("bearer.test:443")."""
    ph = placeholder(hook, "API_KEY")
    chain = Chain([HostRulesHook(HostRules.parse(["*"], [])), hook])
    plain = Destination("run", "http", "api.test", 80)
    req = Request("GET", f"/?k={ph}", [(b"x-api-key", ph.encode())], 0)
    verdict = chain.request(plain, req)
    assert verdict is not None and not verdict.allowed and verdict.rule == "secret-plain-http"
    assert "API_KEY goes to api.test over HTTPS only" in verdict.reason
    _, over_tls, _ = exchange(hook, "api.test", "/", [(b"x-api-key", ph.encode())])
    assert over_tls.headers == [(b"x-api-key", REAL), WHOLE]
    named = Destination("run", "http", "bearer.test", 443)
    req = Request("GET", "/", [], 0)
    assert chain.request(named, req) is None
    chain.rewrite(named, req)
    assert req.headers == [(b"authorization", b"Bearer " + OTHER_REAL), WHOLE]
    # a header to set goes over HTTPS only too, for an entry without a port
    policy = make_policy(tmp_path)
    policy.secrets["BEARER"].hosts = ["bearer.test"]
    portless = SecretsHook(policy)
    portless.open()
    both = Chain([HostRulesHook(HostRules.parse(["*"], [])), portless])
    req = Request("GET", "/", [], 0)
    assert both.request(Destination("run", "http", "bearer.test", 80), req) is None
    both.rewrite(Destination("run", "http", "bearer.test", 80), req)
    assert req.headers == [WHOLE] and req.audit == {}  # (asked for plain: read for echoes)
    req = Request("GET", "/", [], 0)
    both.request(Destination("run", "https", "bearer.test", 443), req)
    both.rewrite(Destination("run", "https", "bearer.test", 443), req)
    assert req.headers == [(b"authorization", b"Bearer " + OTHER_REAL), WHOLE]


# -- response bodies ---------------------------------------------------------------------


def body_through(
    hook: SecretsHook,
    body: bytes,
    pieces: list[int],
    headers: list[tuple[bytes, bytes]] | None = None,
) -> tuple[bytes, Response, Request]:
    """A response from api.test (a host of API_KEY) whose body arrives cut at
    ``pieces``, through the filters the hook puts on it."""
    chain = Chain([hook])
    dest = Destination("run", "https", "api.test", 443)
    req = Request("GET", "/", [], 0)
    chain.request(dest, req)
    response = Response(200, list(headers or []))
    assert chain.response(dest, req, response) is None
    out, at = b"", 0
    for cut in [*pieces, len(body)]:
        for f in response.filters:
            out += f.feed(body[at:cut])
        at = cut
    return out + b"".join(f.end() for f in response.filters), response, req


def test_an_echo_in_a_body_comes_back_as_the_placeholder_wherever_the_body_is_cut(
    hook: SecretsHook,
) -> None:
    """The value as it is, percent-encoded and inside base64, in a body that
    arrives in pieces cut at every place (the echo straddles two of them)."""
    ph = placeholder(hook, "API_KEY").encode()
    spelled = b"".join(b"%%%02x" % b for b in REAL)
    body = b'{"headers": {"x-key": "%s"}, "url": "/?k=%s", "t": "%s"} ' % (
        REAL,
        spelled,
        base64.b64encode(b"u:" + REAL),
    )
    run = body.index(b'"t": "') + 6  # where the base64 starts
    for cut in range(1, len(body)):
        out, _, req = body_through(hook, body, [cut])
        assert REAL not in out and spelled not in out, cut
        assert out.count(ph) >= 2 and req.audit["echoes_hidden"] == ["API_KEY"], cut
        encoded = out.split(b'"t": "')[1][:-3]
        for offset in range(4):  # no decoding of what came out holds the value
            part = bytes(c for c in encoded[offset:] if c in BASE64_ALPHABET)
            part = part[: len(part) // 4 * 4]
            assert REAL not in base64.b64decode(part), cut
        if not run < cut < len(body) - 3:  # a run cut in two comes out garbled, not re-encoded
            assert base64.b64decode(encoded) == b"u:" + ph, cut
    # the twin: a body without the value passes as it was, with nothing in the audit
    plain = b"x" * 300 + REAL[:-1] + b"y" * 300
    out, _, req = body_through(hook, plain, [7, 150, 500])
    assert out == plain and "echoes_hidden" not in req.audit


def test_a_compressed_body_is_read_and_goes_on_plain(hook: SecretsHook) -> None:
    """The request asked for a plain body; an origin that compresses anyway has it
    decompressed (gzip, zlib and raw deflate) and checked; one in an encoding
    corral cannot read is refused rather than passed on unread."""
    import gzip
    import zlib

    ph = placeholder(hook, "API_KEY").encode()
    body = b"token " + REAL + b" end" * 50
    raw = zlib.compressobj(wbits=-15)
    for coding, packed in (
        (b"gzip", gzip.compress(body)),
        (b"deflate", zlib.compress(body)),
        (b"deflate", raw.compress(body) + raw.flush()),
    ):
        out, response, _ = body_through(hook, packed, [3, 20], [(b"content-encoding", coding)])
        assert out == body.replace(REAL, ph)
        assert b"content-encoding" not in dict(response.headers)
    chain = Chain([hook])
    dest = Destination("run", "https", "api.test", 443)
    req = Request("GET", "/", [], 0)
    chain.request(dest, req)
    refused = chain.response(dest, req, Response(200, [(b"content-encoding", b"br")]))
    assert refused is not None and not refused.allowed and refused.rule == "secret-echo"
    assert "encoded as br" in refused.reason
    twice = chain.response(dest, req, Response(200, [(b"content-encoding", b"gzip, gzip")]))
    assert twice is not None and twice.rule == "secret-echo"  # not read as one gzip
    # the twin: identity is no encoding; a host no secret goes to gets no filter
    assert chain.response(dest, req, Response(200, [(b"content-encoding", b"identity")])) is None
    elsewhere = Response(200, [(b"content-encoding", b"br")])
    other = Destination("run", "https", "other.test", 443)
    assert chain.response(other, Request("GET", "/", [], 0), elsewhere) is None
    assert elsewhere.filters == []


def test_a_body_cut_short_or_corrupt_is_an_error_not_a_pass(hook: SecretsHook) -> None:
    import gzip

    from corral.net.http1 import HttpError

    packed = gzip.compress(b"token " + REAL)
    with pytest.raises(HttpError):
        body_through(hook, packed[:-10], [], [(b"content-encoding", b"gzip")])
    with pytest.raises(HttpError):
        body_through(hook, packed[:12] + b"\0" * 20, [], [(b"content-encoding", b"gzip")])


class _SlowClient:
    """A client that reads only when the proxy waits for it (drain): what the
    proxy's connection holds is what it wrote since its last wait."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.buffered = 0
        self.most = 0  # the most held at once
        self.transport = self

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def write(self, data: bytes) -> None:
        self.data += data
        self.buffered += len(data)
        self.most = max(self.most, self.buffered)

    async def drain(self) -> None:
        self.buffered = 0


def _copied_gzip(hook: SecretsHook, body: bytes, pieces: int) -> tuple[_SlowClient, bytes]:
    """``body`` gzip-compressed by api.test unasked, chunked upstream in ``pieces``
    chunks, copied to the client as the proxy copies it (http1.copy_filtered);
    the client, and the body it read (de-chunked)."""
    import gzip

    from corral.net import aio, http1

    packed = gzip.compress(body, 9)
    step = -(-len(packed) // pieces)
    upstream = b"".join(
        b"%x\r\n%b\r\n" % (len(part), part)
        for part in (packed[at : at + step] for at in range(0, len(packed), step))
    )
    chain = Chain([hook])
    dest = Destination("run", "https", "api.test", 443)
    req = Request("GET", "/", [], 0)
    chain.request(dest, req)
    response = Response(200, [(b"content-encoding", b"gzip")])
    assert chain.response(dest, req, response) is None
    client = _SlowClient()

    async def copy() -> None:
        reader = aio.StreamReader(limit=http1.MAX_HEAD)
        reader.feed_data(upstream + b"0\r\n\r\n")
        reader.feed_eof()
        writer = cast(aio.StreamWriter, client)
        head = b"HTTP/1.1 200 OK"
        await http1.copy_filtered(reader, writer, "chunked", 0, head, [], response.filters, True)

    aio.run(copy())
    out, rest = bytearray(), bytes(client.data).split(b"\r\n\r\n", 1)[1]
    while not rest.startswith(b"0\r\n"):
        size, rest = rest.split(b"\r\n", 1)
        out += rest[: int(size, 16)]
        rest = rest[int(size, 16) + 2 :]
    return client, bytes(out)


def test_a_gzip_bomb_is_inflated_in_steps_the_client_drains(hook: SecretsHook) -> None:
    """24 MiB of zeros in 24 kB of gzip: inflated up to 64 MiB per piece read and
    written to the client at once, a connection whose client read nothing held it
    all (six held 385 MiB: found by attacking the proxy).  The filter gives what a
    piece inflates to in steps of INFLATE_STEP and the copy waits for the client
    between them: a connection holds at most a write buffer and a step.  The
    twins: the echo after the bomb, and a plain-sized body with an echo across a
    step's end, still come back with the placeholder."""
    from corral.net import http1
    from corral.net.secrets import INFLATE_STEP

    ph = placeholder(hook, "API_KEY").encode()
    bomb = bytes(24 << 20) + b"token " + REAL
    client, out = _copied_gzip(hook, bomb, 1)
    assert out == bomb.replace(REAL, ph)
    assert client.most <= http1.CHUNK + INFLATE_STEP + 64, client.most
    body = b"".join(b"line %d of a log\n" % i for i in range(150_000))  # ~3 MB, 1 MB a step
    at = INFLATE_STEP - 7  # the value cut by the first step's end
    body = body[:at] + REAL + body[at:]
    client, out = _copied_gzip(hook, body, 3)
    assert out == body.replace(REAL, ph)
    assert client.most <= http1.CHUNK + INFLATE_STEP + 64, client.most
    small = b"token " + REAL + b" end"  # (short: streamed too, a step is the whole of it)
    assert _copied_gzip(hook, small, 1)[1] == small.replace(REAL, ph)
    # by the filter's own API: never more than a step at a time
    import gzip

    echo_filter = _stream_filter(hook, [(b"content-encoding", b"gzip")])
    steps = [echo_filter.feed(gzip.compress(bytes(8 << 20)))]
    while echo_filter.pending():
        steps.append(echo_filter.feed(b""))
    steps.append(echo_filter.end())
    assert max(map(len, steps)) <= INFLATE_STEP + hook.for_host("api.test", 443).echo_window
    assert sum(map(len, steps)) == 8 << 20 and len(steps) >= 8


# a value whose base64 holds '/' and '+' at every offset (found by attacking the proxy)
SLASHED = b"sk-proj-Zq9?xY3>wT8~kL2?mN5>pR7~vB4?cD6>"


def _leaked(out: bytes, value: bytes) -> bool:
    """Whether ``out`` holds most of ``value`` in base64 a lenient client decodes:
    JSON and percent escapes read, white space skipped, at any alignment."""
    import json
    import urllib.parse

    text = out.decode("latin-1")
    try:
        text = json.dumps(json.loads(text), ensure_ascii=False)  # (its escapes read)
    except ValueError:
        pass
    text = urllib.parse.unquote(text.replace("\\n", "").replace("\\/", "/"))
    flat = "".join(c for c in text if c.isalnum() or c in "+/-_").encode()
    for shift in range(4):
        part = flat[shift:][: (len(flat) - shift) // 4 * 4]
        for alphabet in (b"+/", b"-_"):
            decoded = base64.b64decode(part, altchars=alphabet)
            if value[2:-2] in decoded:
                return True
    return value[2:-2] in out


def _json_escaped(value: bytes) -> list[tuple[str, bytes]]:
    """Documents holding ``value`` in base64, JSON-escaped as servers write them,
    at each offset: wrapped at 60 and 76 with escaped line breaks (GitHub's
    contents API, and Python's encodebytes in json.dumps), '/' escaped as PHP's
    json_encode writes it and as \\u002f, and both."""
    import json

    out = []
    for pad in range(4):
        doc = json.dumps({"x-key": "x" * pad + value.decode(), "n": pad}).encode()
        flat = base64.b64encode(doc).decode()
        at60 = "\n".join(flat[i : i + 60] for i in range(0, len(flat), 60))
        out += [
            ("json \\n 60", json.dumps({"content": at60 + "\n"}).encode()),
            ("json \\n 76", json.dumps({"content": base64.encodebytes(doc).decode()}).encode()),
            ("php \\/", json.dumps({"token": flat}).encode().replace(b"/", b"\\/")),
            ("\\u002f", json.dumps({"token": flat}).encode().replace(b"/", b"\\u002f")),
            ("both", json.dumps({"c": at60}).encode().replace(b"/", b"\\/")),
        ]
    return out


def test_base64_under_a_second_encoding_is_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Base64 of the value JSON-escaped (line breaks as the two characters \\n, as
    GitHub's contents API wraps it; '/' as \\/, as PHP writes it) reached the
    client whole: the escapes cut the value's encoding (found by attacking the
    proxy).  They are read as what they stand for, in every cut of the body
    into two pieces; whole, the document decodes to the placeholder.  The twins:
    the same base64 wrapped by real line breaks and on one line, hidden before
    too, and escaped base64 holding no value, which goes on as it came."""
    import json

    monkeypatch.setenv("CORRAL_TEST_REAL", SLASHED.decode())
    h = SecretsHook(make_policy(tmp_path))
    h.open()
    ph = placeholder(h, "API_KEY").encode()
    for name, body in _json_escaped(SLASHED):
        out = body_through(h, body, [])[0]
        assert not _leaked(out, SLASHED), (name, out)
        content = next(iter(json.loads(out).values()))  # whole: it decodes, to the placeholder
        assert ph in base64.b64decode(content.replace("\n", "")), (name, out)
        for cut in range(len(body)):  # wherever a piece ends
            assert not _leaked(body_through(h, body, [cut])[0], SLASHED), (name, cut)
    doc = b'{"x-key": "' + SLASHED + b'"}'
    for twin in (base64.encodebytes(doc), base64.b64encode(doc)):
        assert not _leaked(body_through(h, twin, [])[0], SLASHED)
    for name, body in _json_escaped(b"nothing secret here, not at all/+?>~"):
        assert body_through(h, body, [len(body) // 2])[0] == body, name


def test_base64_percent_encoded_in_a_header_is_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A redirect whose query holds base64 of the value percent-encoded ('+' '/'
    '=' as %2B %2F %3D: OAuth's state, a "return to") kept the value (found by
    attacking the proxy).  It is hidden as the base64 itself would be: the query
    decodes to the placeholder.  The twins: the base64 unencoded, hidden before
    too, and percent-encoded base64 of another value, left as it was."""
    import urllib.parse

    monkeypatch.setenv("CORRAL_TEST_REAL", SLASHED.decode())
    h = SecretsHook(make_policy(tmp_path))
    h.open()
    ph = placeholder(h, "API_KEY").encode()
    for pad in range(3):
        state = base64.b64encode(b'{"key": "' + b"x" * pad + SLASHED + b'"}')
        for spelled in (urllib.parse.quote(state, safe="").encode(), state):
            location = b"https://app.test/cb?state=" + spelled + b"&n=1"
            ((_, got),) = hidden(h, [(b"location", location)])
            query = urllib.parse.parse_qs(got.decode().partition("?")[2])
            back = base64.b64decode(query["state"][0])
            assert SLASHED not in back and ph in back, (pad, got)
    other = urllib.parse.quote(base64.b64encode(b"x" * 40 + b"/+?>~" * 8), safe="").encode()
    assert hidden(h, [(b"location", b"/cb?state=" + other)]) == [
        (b"location", b"/cb?state=" + other)
    ]


def _stream_filter(
    hook: SecretsHook, headers: list[tuple[bytes, bytes]] | None = None
) -> BodyFilter:
    """The filter a response body from the secret's host streams through."""
    chain = Chain([hook])
    dest = Destination("run", "https", "api.test", 443)
    req = Request("GET", "/", [], 0)
    chain.request(dest, req)
    response = Response(200, list(headers or []))
    chain.response(dest, req, response)
    (echo_filter,) = response.filters
    return echo_filter


def test_an_event_that_ends_like_the_start_of_wrapped_base64_is_not_held(
    hook: SecretsHook,
) -> None:
    """A tail cut by white space may be wrapped base64 going on in the next piece,
    and waits for it; but a blank line ends any wrapped block (and a server-sent
    event): an event whose last character could start the value's base64 was
    held until the next event.  The twin: one ending in a single line break is
    held, for the next piece may go on with the core."""
    echo_filter = _stream_filter(hook)
    core = hook.secrets[0].cores[0]
    event = b"data: " + core[:3] + b"\n\n"
    assert echo_filter.feed(event) == event
    assert echo_filter.feed(b"data: " + core[:3] + b"\n") == b"data: "
    assert echo_filter.feed(b"ok\n\n") == core[:3] + b"\nok\n\n"


def test_a_widely_wrapped_echo_cut_between_pieces_is_hidden(hook: SecretsHook) -> None:
    """Base64 of the value in groups of two, each on a line indented by 30 spaces
    (YAML), streamed in two pieces: where the cut fell in the core's first part,
    the tail held back was too short to show it was one, and the value went out
    whole (found by attacking the proxy).  At every cut the client gets what one
    piece gives: the core hidden.  The twin: a stream of the same shape that
    holds no core goes on as it comes."""
    import base64

    encoded = base64.b64encode(b"user:" + REAL)
    indent = b"\n" + b" " * 30
    wrapped = indent.join(encoded[i : i + 2] for i in range(0, len(encoded), 2))
    body = b"key:" + indent + wrapped + b"\nend\n"
    whole = _stream_filter(hook)
    expected = whole.feed(body) + whole.end()
    assert placeholder(hook, "API_KEY").encode() in expected
    block = expected.translate(None, b" \n")
    assert not any(REAL in base64.b64decode(block[i:] + b"===", altchars=None) for i in range(8))
    for cut in range(1, len(body)):
        echo_filter = _stream_filter(hook)
        out = echo_filter.feed(body[:cut]) + echo_filter.feed(body[cut:]) + echo_filter.end()
        assert out == expected, cut
    plain = b"key:" + indent + indent.join([b"no", b"ne"]) + b"\n"
    assert _stream_filter(hook).feed(plain) == plain


def test_a_stream_goes_on_as_it_comes_but_for_what_could_start_an_echo(
    hook: SecretsHook,
) -> None:
    """Server-sent events from an API: each piece goes on at once; only a tail that
    could be the start of an echo (the value, an escape of it, its base64) waits
    for the next piece, which shows it was one (hidden) or was not (sent as is)."""
    ph = placeholder(hook, "API_KEY").encode()
    echo_filter = _stream_filter(hook)
    events = [b'data: {"token": "Hel"}\n\n', b'data: {"token": "lo"}\n\n']
    assert [echo_filter.feed(e) for e in events] == events  # nothing held
    assert echo_filter.feed(b"data: key " + REAL[:5]) == b"data: key "  # "sk-re" held
    assert echo_filter.feed(REAL[5:] + b"\n\n") == ph + b"\n\n"
    assert echo_filter.feed(b"data: sk-r") == b"data: "  # could start one ...
    assert echo_filter.feed(b"ed\n\n") == b"sk-red\n\n"  # ... and was not
    assert echo_filter.feed(b"q=%73%6B") == b"q="  # the value percent-encoded, cut short
    assert echo_filter.end() == b"%73%6B"


def _respelled(ph: str) -> list[tuple[str, list[tuple[bytes, bytes]]]]:
    """A placeholder as an origin still reads it: each spelling got through to
    another host (found by attacking the proxy)."""
    once = "".join(f"%{b:02X}" for b in ph.encode())
    creds = base64.b64encode(f"u:{ph}".encode())
    return [
        ("/", [(b"x-api-key", ph.upper().encode())]),
        (f"/x?k={ph.upper()}", []),
        ("/", [(b"x-api-key", once.encode())]),
        (f"/x?k={once.replace('%', '%25')}", []),  # encoded twice
        ("/", [(b"authorization", b"Basic " + creds.rstrip(b"="))]),
        ("/", [(b"authorization", b"Basic\t" + creds)]),
        ("/", [(b"authorization", b"Basic " + base64.urlsafe_b64encode(f"u:{ph}?>".encode()))]),
    ]


def test_a_placeholder_respelled_for_another_host_is_denied(hook: SecretsHook) -> None:
    ph = placeholder(hook, "API_KEY")
    for target, headers in _respelled(ph):
        allowed, req, _ = exchange(hook, "evil.test", target, headers)
        assert allowed is False, (target, headers)
        assert req.audit == {"secrets": ["API_KEY"]}
        # the twin: the same request to the secret's own host goes through
        assert exchange(hook, "api.test", target, headers)[0] is None, (target, headers)
    plain = exchange(hook, "evil.test", "/x?k=corral-secret-elsewhere%41", [])  # no placeholder
    assert plain[0] is None
