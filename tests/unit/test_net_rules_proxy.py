"""Rules in the real proxy, in-process (no sandbox): a proxy that cannot intercept
TLS (``corral proxy serve``) refuses an opaque tunnel to a host whose requests a
rule must see, and still tunnels to every other host."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from test_net_proxy_unit import RUN_ID, Origin, read_response, run

from corral.net import guardrails as gr
from corral.net.audit import Audit
from corral.net.hooks import Asker, Chain, Destination, Hook, HostRulesHook, Request
from corral.net.httprules import HttpRulesHook
from corral.net.proxy import Proxy
from corral.net.rules import HostRules, Verdict


def test_opaque_tunnel_to_a_ruled_host_is_refused_and_others_pass(tmp_path: Path) -> None:
    async def go() -> None:
        from corral.net import aio

        ruled, free = await Origin().start(), await Origin().start()
        entries: list[dict[str, object]] = [
            {"host": f"127.0.0.1:{ruled.port}", "methods": ["GET"], "action": "allow"}
        ]
        chain = Chain(
            [HostRulesHook(HostRules.parse(["127.0.0.1"], [])), HttpRulesHook.from_policy(entries)]
        )
        audit = Audit(str(tmp_path / "net.jsonl"))
        server = await Proxy(chain, audit).serve_tcp("127.0.0.1", 0, RUN_ID)
        port = server.sockets[0].getsockname()[1]
        try:
            for origin, expected in ((ruled, 403), (free, 200)):
                reader, writer = await aio.open_connection("127.0.0.1", port)
                writer.write(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % origin.port)
                line = await reader.readuntil(b"\r\n")
                assert int(line.split()[1]) == expected, line
                if expected == 200:
                    await reader.readuntil(b"\r\n")
                    writer.write(b"DELETE /x HTTP/1.1\r\nHost: o\r\n\r\n")
                    assert (await read_response(reader)).status == 200
                writer.close()
            assert ruled.requests == [] and [r.method for r in free.requests] == [b"DELETE"]
        finally:
            server.close()
            ruled.close()
            free.close()
            audit.close()

    run(go)


class RuledWorld:
    """An origin, and a plain proxy whose ``[[network.rules]]`` name it (``{port}``)."""

    def __init__(self, origin: Origin, port: int, audit_path: Path) -> None:
        self.origin = origin
        self.port = port
        self.audit_path = audit_path

    def url(self, target: str) -> bytes:
        return f"http://127.0.0.1:{self.origin.port}{target}".encode()

    async def send(self, method: bytes, target: str) -> bytes:
        """One request on a fresh connection; everything the proxy answered."""
        from corral.net import aio

        reader, writer = await aio.open_connection("127.0.0.1", self.port)
        writer.write(method + b" " + self.url(target) + b" HTTP/1.1\r\nConnection: close\r\n\r\n")
        answer = await reader.read()
        writer.close()
        return answer

    def audit(self) -> list[dict[str, Any]]:
        if not self.audit_path.exists():
            return []
        return [json.loads(x) for x in self.audit_path.read_text().splitlines()]


@asynccontextmanager
async def ruled(tmp_path: Path, entries: list[dict[str, object]]) -> AsyncIterator[RuledWorld]:
    origin = await Origin().start()
    entries = [{**e, "host": str(e["host"]).format(port=origin.port)} for e in entries]
    async with _world(tmp_path, origin, HttpRulesHook.from_policy(entries)) as world:
        yield world


@asynccontextmanager
async def _world(
    tmp_path: Path, origin: Origin, hook: Hook, asker: Asker | None = None
) -> AsyncIterator[RuledWorld]:
    """A plain proxy for 127.0.0.1 with ``hook`` in its chain, in front of ``origin``
    (closed with it)."""
    chain = Chain([HostRulesHook(HostRules.parse(["127.0.0.1"], [])), hook])
    audit = Audit(str(tmp_path / "net.jsonl"))
    server = await Proxy(chain, audit, asker=asker).serve_tcp("127.0.0.1", 0, RUN_ID)
    try:
        yield RuledWorld(origin, server.sockets[0].getsockname()[1], tmp_path / "net.jsonl")
    finally:
        server.close()
        origin.close()
        audit.close()


PUBLIC_NOT_SECRET: list[dict[str, object]] = [
    {"host": "127.0.0.1:{port}", "paths": ["/public/**"], "action": "allow"},
    {"host": "127.0.0.1:{port}", "paths": ["/public/secret/**"], "action": "deny"},
]


@pytest.mark.parametrize(
    "target",
    [
        "/secret/../public/x",  # a router matching /secret/ on the path as sent serves it
        "/public/secret/%2e%2e/x",
        "/secret%2F..%2Fpublic/x",
        "/public/secret/x/../../y",
        "/public/./secret/x",
    ],
)
def test_a_dot_segment_to_a_ruled_host_never_reaches_the_origin(
    tmp_path: Path, target: str
) -> None:
    """The rules used to decide on the path with dot segments resolved, but the
    origin got the target as sent: Node, Express, uvicorn/Starlette and Werkzeug
    route ``/secret/../public/x`` under ``/secret``.  Twin: the plain path passes."""

    async def go() -> None:
        async with ruled(tmp_path, PUBLIC_NOT_SECRET) as w:
            answer = await w.send(b"GET", target)
            assert answer.startswith(b"HTTP/1.1 403"), answer
            assert b'"rule":"bad-path"' in answer.replace(b" ", b"")
            twin = await w.send(b"GET", "/public/x")
            assert twin.startswith(b"HTTP/1.1 200"), twin
            assert w.origin.paths == ["/public/x"]

    run(go)


class _Stdlib(http.server.BaseHTTPRequestHandler):
    """An origin as Python's http.server makes them: keep-alive, and a GET handler
    that never reads a body (SimpleHTTPRequestHandler's do_GET does the same)."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, str | None]]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self, body_read: bool) -> None:
        if body_read:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append((self.command, self.path, self.headers.get("Host")))
        body = f"{self.command} {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(body_read=False)

    def do_POST(self) -> None:
        self._answer(body_read=True)


def test_content_on_a_get_is_the_origins_last_request(tmp_path: Path) -> None:
    """A GET's content reached an origin whose GET handler ignores it, on a kept-alive
    connection: the origin read it as the next request, one no rule decided (here a
    GET of /secret for another virtual host).  Twins: the GET itself, a POST with the
    same body, and the client's next request on the same connection all pass."""
    seen: list[tuple[str, str, str | None]] = []
    handler = type("Handler", (_Stdlib,), {"seen": seen})
    origin = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=origin.serve_forever, daemon=True).start()
    port = origin.server_address[1]
    entries: list[dict[str, object]] = [
        {"host": f"127.0.0.1:{port}", "methods": ["GET", "POST"], "paths": ["/public/**"],
         "action": "allow"},
    ]  # fmt: skip
    inner = b"GET /secret HTTP/1.1\r\nHost: other.test\r\n\r\n"

    def carrying(method: bytes) -> bytes:
        return b"%s http://127.0.0.1:%d/public/x HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (
            method,
            port,
            len(inner),
            inner,
        )

    async def go() -> None:
        from corral.net import aio

        chain = Chain(
            [HostRulesHook(HostRules.parse(["127.0.0.1"], [])), HttpRulesHook.from_policy(entries)]
        )
        audit = Audit(str(tmp_path / "net.jsonl"))
        server = await Proxy(chain, audit).serve_tcp("127.0.0.1", 0, RUN_ID)
        try:
            reader, writer = await aio.open_connection(
                "127.0.0.1", server.sockets[0].getsockname()[1]
            )
            for raw in (carrying(b"GET"), carrying(b"POST"), carrying(b"GET")):
                writer.write(raw)
                assert (await read_response(reader)).status == 200
            await aio.sleep(0.3)  # time for a smuggled request to be served
            writer.close()
        finally:
            server.close()
            audit.close()

    try:
        run(go)
    finally:
        origin.shutdown()
        origin.server_close()
    assert seen == [
        ("GET", "/public/x", f"127.0.0.1:{port}"),
        ("POST", "/public/x", f"127.0.0.1:{port}"),
        ("GET", "/public/x", f"127.0.0.1:{port}"),
    ]


PROJECTS_NOT_DELETED: list[dict[str, object]] = [
    {"host": "127.0.0.1:{port}", "action": "allow"},
    {"host": "127.0.0.1:{port}", "methods": ["DELETE"], "paths": ["/api/projects/*"],
     "action": "deny"},
]  # fmt: skip


def test_an_encoded_slash_cannot_split_a_segment_a_deny_names(tmp_path: Path) -> None:
    """GitLab, Rails, Express and Go's ServeMux keep ``%2F`` inside its segment
    (GitLab's project id is ``group%2Fproject``), but the rules read it as ``/``
    only: ``DELETE /api/projects/group%2Fproject`` was two segments to them, missed
    the deny for ``/api/projects/*`` and deleted the project.  Twins: the same
    DELETE elsewhere, and a GET of the project, pass; so does the plain id."""

    async def go() -> None:
        async with ruled(tmp_path, PROJECTS_NOT_DELETED) as w:
            for target in ("/api/projects/group%2Fproject", "/api/projects/group%2fproject"):
                answer = await w.send(b"DELETE", target)
                assert answer.startswith(b"HTTP/1.1 403"), answer
            assert (await w.send(b"DELETE", "/api/projects/7")).startswith(b"HTTP/1.1 403")
            for method, target in (
                (b"DELETE", "/api/other/group%2Fproject"),
                (b"GET", "/api/projects/group%2Fproject"),
            ):
                answer = await w.send(method, target)
                assert answer.startswith(b"HTTP/1.1 200"), answer
            assert w.origin.paths == ["/api/other/group%2Fproject", "/api/projects/group%2Fproject"]

    run(go)


@pytest.mark.parametrize(
    "target",
    [
        "/api/projects/7/",  # Express, Rails, Spring 5: the route of /api/projects/7
        "/API/Projects/7",  # Express, ASP.NET: case-insensitive routes
        "/api/projects/group%2FPROJECT/",
    ],
)
def test_a_deny_holds_for_the_spellings_lenient_routers_accept(tmp_path: Path, target: str) -> None:
    """A deny of ``/api/projects/*`` missed ``/api/projects/7/`` (a trailing slash
    counted) and ``/API/Projects/7`` (globs are case-sensitive), which Express routes
    (case-insensitive, slash optional by default) to the very handler denied.
    Twins: the same target with GET, and DELETE elsewhere, pass."""

    async def go() -> None:
        async with ruled(tmp_path, PROJECTS_NOT_DELETED) as w:
            answer = await w.send(b"DELETE", target)
            assert answer.startswith(b"HTTP/1.1 403"), answer
            assert (await w.send(b"GET", target)).startswith(b"HTTP/1.1 200")
            assert (await w.send(b"DELETE", "/api/other/7/")).startswith(b"HTTP/1.1 200")
            assert w.origin.paths == [target, "/api/other/7/"]

    run(go)


MERGE_DENIED: list[dict[str, object]] = [
    {"host": "127.0.0.1:{port}", "methods": ["PUT"], "paths": ["/repos/*/*/pulls/*/merge"],
     "action": "deny"},
    {"host": "127.0.0.1:{port}", "paths": ["/x"], "action": "allow"},
    {"host": "127.0.0.1:{port}", "paths": ["/repos/**"], "action": "allow"},
]  # fmt: skip


@pytest.mark.parametrize(
    "target",
    [
        "/repos/o/r/pulls/1/merge.json",  # Rails: every route is path(.:format)
        "/repos/o/r/pulls/1/merge.xml/",
        "/repos/o/r/pulls/1/MERGE.Json",
    ],
)
def test_a_deny_holds_for_the_path_with_a_format_suffix(tmp_path: Path, target: str) -> None:
    """Rails routes ``PUT .../merge.json`` to the merge action (``(.:format)`` is
    optional on every route): a deny of ``PUT /repos/*/*/pulls/*/merge`` let it
    through (found by attacking the proxy).  Denied; the twins: a GET of it, a
    PUT of another segment with a format, and of the pull itself, pass; an allow
    of ``/x`` lets ``/x`` through and not ``/x.json`` (no rule allows it)."""

    async def go() -> None:
        async with ruled(tmp_path, MERGE_DENIED) as w:
            assert (await w.send(b"PUT", target)).startswith(b"HTTP/1.1 403")
            assert w.origin.requests == []
            for method, allowed in (
                (b"GET", target),
                (b"PUT", "/repos/o/r/pulls/1/merged.json"),
                (b"PUT", "/repos/o/r/pulls/1.json"),
                (b"GET", "/x"),
            ):
                answer = await w.send(method, allowed)
                assert answer.startswith(b"HTTP/1.1 200"), (method, allowed, answer)
            assert (await w.send(b"GET", "/x.json")).startswith(b"HTTP/1.1 403")
            assert w.origin.paths == [
                target,
                "/repos/o/r/pulls/1/merged.json",
                "/repos/o/r/pulls/1.json",
                "/x",
            ]

    run(go)


@pytest.mark.parametrize("header", [b"X-Original-URL", b"X-Rewrite-URL"])
def test_a_routing_header_is_decided_as_the_path_it_names(tmp_path: Path, header: bytes) -> None:
    """IIS's URL Rewrite, Symfony and Zend serve ``GET /public/x`` carrying
    ``X-Original-URL: /public/secret/k`` as that path, which a deny of
    /public/secret/** never saw; a value that is no path matches no allow rule.
    Twins: the plain GET, and a routing header naming an allowed path, pass."""

    async def go() -> None:
        from corral.net import aio

        async with ruled(tmp_path, PUBLIC_NOT_SECRET) as w:

            async def get(extra: bytes) -> bytes:
                reader, writer = await aio.open_connection("127.0.0.1", w.port)
                writer.write(
                    b"GET "
                    + w.url("/public/x")
                    + b" HTTP/1.1\r\nConnection: close\r\n"
                    + extra
                    + b"\r\n"
                )
                answer = await reader.read()
                writer.close()
                return answer

            for value in (b"/public/secret/k", b"/public/x/../secret/k", b"http://a/b"):
                denied = await get(header + b": " + value + b"\r\n")
                assert denied.startswith(b"HTTP/1.1 403"), (value, denied)
            assert (await get(b"")).startswith(b"HTTP/1.1 200")
            assert (await get(header + b": /public/y\r\n")).startswith(b"HTTP/1.1 200")
            assert w.origin.paths == ["/public/x", "/public/x"]

    run(go)


NO_DELETE: list[dict[str, object]] = [
    {"host": "127.0.0.1:{port}", "action": "allow"},
    {"host": "127.0.0.1:{port}", "methods": ["DELETE"], "action": "deny"},
]


@pytest.mark.parametrize(
    "header", [b"X-HTTP-Method-Override", b"X-HTTP-Method", b"X-Method-Override"]
)
def test_a_method_override_header_is_decided_as_that_method(tmp_path: Path, header: bytes) -> None:
    """Google's APIs, Express's method-override, Rack and Symfony serve a POST with
    ``X-HTTP-Method-Override: DELETE`` as a DELETE, which a deny of DELETE never
    saw.  Twins: the plain POST, and an override to an allowed method, pass."""

    async def go() -> None:
        from corral.net import aio

        async with ruled(tmp_path, NO_DELETE) as w:

            async def post(extra: bytes) -> bytes:
                reader, writer = await aio.open_connection("127.0.0.1", w.port)
                writer.write(
                    b"POST " + w.url("/items/7") + b" HTTP/1.1\r\nConnection: close\r\n"
                    b"Content-Length: 0\r\n" + extra + b"\r\n"
                )
                answer = await reader.read()
                writer.close()
                return answer

            denied = await post(header + b": delete\r\n")
            assert denied.startswith(b"HTTP/1.1 403"), denied
            assert (await post(b"")).startswith(b"HTTP/1.1 200")
            assert (await post(header + b": PATCH\r\n")).startswith(b"HTTP/1.1 200")
            assert [r.method for r in w.origin.requests] == [b"POST", b"POST"]

    run(go)


POST_NOT_DELETE: list[dict[str, object]] = [
    {"host": "127.0.0.1:{port}", "methods": ["GET", "POST"], "paths": ["/items/**"],
     "action": "allow"},
    {"host": "127.0.0.1:{port}", "methods": ["DELETE"], "paths": ["/items/**"], "action": "deny"},
]  # fmt: skip
FORM = b"application/x-www-form-urlencoded"
MULTIPART = b"multipart/form-data; boundary=XyZ"


def _multipart(name: bytes, value: bytes) -> bytes:
    return (
        b'--XyZ\r\nContent-Disposition: form-data; name="title"\r\n\r\nhello\r\n'
        b'--XyZ\r\nContent-Disposition: form-data; name="' + name + b'"\r\n'
        b"Content-Type: text/plain\r\n\r\n" + value + b"\r\n--XyZ--\r\n"
    )


async def _post(
    w: RuledWorld, target: str, body: bytes, kind: bytes | None, extra: bytes = b""
) -> tuple[int, bytes]:
    """A POST with ``body`` (typed ``kind``); its status and what the proxy answered
    first (a 100 Continue, for a client that waits for one)."""
    from corral.net import aio

    reader, writer = await aio.open_connection("127.0.0.1", w.port)
    typed = b"Content-Type: " + kind + b"\r\n" if kind is not None else b""
    head = b"POST " + w.url(target) + b" HTTP/1.1\r\nConnection: close\r\n" + typed + extra
    if b"chunked" in extra:
        writer.write(head + b"\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    elif b"100-continue" in extra:  # the body only once the proxy says to go on
        writer.write(head + b"Content-Length: %d\r\n\r\n" % len(body))
        first = await reader.readuntil(b"\r\n\r\n")
        writer.write(body)
        answer = await reader.read()
        writer.close()
        return int(answer.split(b" ", 2)[1]), first
    else:
        writer.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    answer = await reader.read()
    writer.close()
    return int(answer.split(b" ", 2)[1]), answer[:40]


@pytest.mark.parametrize(
    ("target", "body", "kind"),
    [
        pytest.param("/items/1?_method=DELETE", b"", None, id="query"),
        pytest.param("/items/1?%5Fmethod=delete", b"", None, id="query-encoded"),
        pytest.param("/items/1", b"a=1&_method=delete", FORM, id="form"),
        pytest.param("/items/1", b"%5Fmethod=%44ELETE", FORM, id="form-encoded"),
        pytest.param("/items/1", b"_method=DELETE", None, id="untyped"),
        pytest.param("/items/1", _multipart(b"_method", b"DELETE"), MULTIPART, id="multipart"),
        # variants found by attacking the first fix: how Rack, PHP and Laravel read them
        pytest.param("/items/1", b"[_method]=DELETE", FORM, id="bracketed"),
        pytest.param("/items/1", b"_method]=DELETE", FORM, id="half-bracketed"),
        pytest.param("/items/1", b".method=DELETE", FORM, id="php-dot"),
        pytest.param("/items/1?.method=DELETE", b"", None, id="query-php-dot"),
        pytest.param("/items/1", b"_method=DELETE", FORM + b", text/plain", id="type-list"),
        pytest.param("/items/1", b"_method=DELETE", FORM + b";charset=utf-8", id="charset"),
        pytest.param("/items/1", b"_method=DELETE", b"", id="empty-type"),
        # PHP cuts a type at a space too (found by attacking the proxy)
        pytest.param("/items/1", b"_method=DELETE", FORM + b" x", id="php-space"),
        pytest.param(
            "/items/1",
            _multipart(b"_method", b"DELETE").replace(b'"_method"', b"'_method'"),
            MULTIPART,
            id="multipart-single-quotes",
        ),
        pytest.param("/items/1", b'{"_method": "DELETE"}', b"application/json", id="json"),
        # types Laravel reads as JSON (isJson: "/json" or "+json" anywhere in the
        # header) and Rack parses as forms (multipart/mixed, /related), found unread
        pytest.param("/items/1", b'{"_method": "DELETE"}', b"text/json", id="text-json"),
        pytest.param("/items/1", b'{"_method": "DELETE"}', b"application/json5", id="json5"),
        pytest.param(
            "/items/1",
            b'{"_method": "DELETE"}',
            b"application/vnd.api+json; charset=utf-8",
            id="vnd-json",
        ),
        pytest.param(
            "/items/1",
            _multipart(b"_method", b"DELETE"),
            b"multipart/mixed; boundary=XyZ",
            id="multipart-mixed",
        ),
        pytest.param(
            "/items/1",
            _multipart(b"_method", b"DELETE"),
            b"Multipart/Related; boundary=XyZ",
            id="multipart-related",
        ),
    ],
)
def test_a_post_that_names_a_denied_method_in_method_is_denied(
    tmp_path: Path, target: str, body: bytes, kind: bytes | None
) -> None:
    """Rails (Rack's MethodOverride), Symfony and Express serve a POST whose
    ``_method`` parameter (form body; query for Symfony and Express) names another
    method as that method: with POST allowed and DELETE denied, such a POST was a
    DELETE (found by attacking the proxy).  The form body is read (Content-Length
    up to 1 MiB) and decided as each method it names.  Twins: the same POSTs
    without the field reach the origin, body intact."""

    async def go() -> None:
        async with ruled(tmp_path, POST_NOT_DELETE) as w:
            status, _ = await _post(w, target, body, kind)
            assert status == 403
            assert w.origin.requests == []
            plain_target = target.split("?")[0]
            plain_body = body.replace(b"_method", b"title2").replace(b"%5Fmethod", b"title3")
            plain_body = plain_body.replace(b".method", b"title4")
            status, _ = await _post(w, plain_target, plain_body, kind)
            assert status == 200
            assert [(r.method, r.body) for r in w.origin.requests] == [(b"POST", plain_body)]

    run(go)


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        pytest.param(b"_method=DELETE", b"text/plain", id="text"),
        pytest.param(b"\x89PNG\r\n_method=DELETE", b"image/png", id="png"),
        pytest.param(b'{"_method": "DELETE"}', b"text/plain; x=json", id="text-json-word"),
    ],
)
def test_a_body_of_a_type_no_server_reads_parameters_from_passes_untouched(
    tmp_path: Path, body: bytes, kind: bytes
) -> None:
    """The twins of the types read for ``_method``: Rack, Symfony and Laravel take
    no parameters from a text/plain or image/png body, whatever it says, so it
    is not read: it streams to the origin as sent, under the policy that denies
    DELETE, and under a guardrail that does."""

    async def go() -> None:
        async with ruled(tmp_path, POST_NOT_DELETE) as w:
            assert (await _post(w, "/items/1", body, kind))[0] == 200
            assert [(r.method, r.body) for r in w.origin.requests] == [(b"POST", body)]
        async with guarded(tmp_path / "g", "CRITICAL") as w:
            assert (await _post(w, "/v1/customers/7", body, kind))[0] == 200
            assert [(r.method, r.body) for r in w.origin.requests] == [(b"POST", body)]

    (tmp_path / "g").mkdir()
    run(go)


def test_a_guardrail_reads_the_types_laravel_and_rack_read_parameters_from(
    tmp_path: Path,
) -> None:
    """A text/json or multipart/mixed POST saying ``_method=DELETE`` is a DELETE
    to Laravel and Rack: denied under a CRITICAL guardrail on DELETE too."""

    async def go() -> None:
        async with guarded(tmp_path, "CRITICAL") as w:
            for body, kind in (
                (b'{"_method": "DELETE"}', b"text/json"),
                (_multipart(b"_method", b"DELETE"), b"multipart/mixed; boundary=XyZ"),
            ):
                assert (await _post(w, "/v1/customers/7", body, kind))[0] == 403, kind
            assert w.origin.requests == []

    run(go)


def test_a_post_decided_by_its_body_is_decided_again_for_the_next_body(tmp_path: Path) -> None:
    """The chain replays its decision for a request identical to an earlier one
    (same head): never one made with a body it read.  A POST whose form names GET
    is allowed; the next, byte for byte the same head with a body of the same
    length naming DELETE, is denied; its twin after it passes again."""

    async def go() -> None:
        async with ruled(tmp_path, POST_NOT_DELETE) as w:
            allowed, denied = b"_method=GET&x=1", b"_method=DELETE!"
            assert len(allowed) == len(denied)
            assert (await _post(w, "/items/1", allowed, FORM))[0] == 200
            assert (await _post(w, "/items/1", denied, FORM))[0] == 403
            assert (await _post(w, "/items/1", allowed, FORM))[0] == 200
            assert [r.body for r in w.origin.requests] == [allowed, allowed]

    run(go)


def test_a_form_body_corral_cannot_read_first_is_denied_where_it_matters(tmp_path: Path) -> None:
    """A chunked form or JSON POST cannot be read before it is decided: denied on a
    path where its _method could name a denied method, with the reason; the
    twins: a chunked upload of another type passes (no parameters), and a client
    that waits for 100 Continue gets one from the proxy, then its form is read
    and decided."""

    async def go() -> None:
        async with ruled(tmp_path, POST_NOT_DELETE) as w:
            chunked = b"Transfer-Encoding: chunked\r\n"
            status, _ = await _post(w, "/items/1", b"a=1", FORM, chunked)
            assert status == 403
            status, _ = await _post(w, "/items/1", b'{"a": 1}', b"application/json", chunked)
            assert status == 403  # JSON too: Laravel reads its _method
            status, _ = await _post(w, "/items/1", b"\x89PNG", b"image/png", chunked)
            assert status == 200  # an upload of no parameters streams as ever
            expect = b"Expect: 100-continue\r\n"
            status, first = await _post(w, "/items/1", b"_method=DELETE", FORM, expect)
            assert first.startswith(b"HTTP/1.1 100") and status == 403
            status, first = await _post(w, "/items/1", b"a=2", FORM, expect)
            assert first.startswith(b"HTTP/1.1 100") and status == 200
            sent = [(r.body, r.header(b"expect")) for r in w.origin.requests]
            assert sent == [(b"\x89PNG", None), (b"a=2", None)]
            refused = [
                json.loads(line)
                for line in w.audit_path.read_text().splitlines()
                if json.loads(line)["decision"] == "deny"
            ]
            assert "_method" in refused[0]["reason"], refused

    run(go)


def test_an_override_header_naming_a_list_is_decided_as_each(tmp_path: Path) -> None:
    """Express's method-override takes the first of a comma list: an override
    header "DELETE, GET" was read as one unknown method and passed (found by
    attacking the first fix).  Each method of the list is decided; the twin, a
    list of allowed methods, passes."""

    async def go() -> None:
        async with ruled(tmp_path, POST_NOT_DELETE) as w:
            for value, expected in ((b"DELETE, GET", 403), (b"delete,x", 403), (b"GET, POST", 200)):
                extra = b"X-HTTP-Method-Override: " + value + b"\r\n"
                status, _ = await _post(w, "/items/1", b'{"a": 1}', b"text/plain", extra)
                assert status == expected, value
            assert len(w.origin.requests) == 1

    run(go)


def test_a_body_read_to_decide_that_never_comes_whole_is_audited(tmp_path: Path) -> None:
    """A form POST whose body is read before deciding, and whose client closes
    before the Content-Length is reached, left no audit line (found by attacking
    the first fix).  It is refused with one, rule malformed; the twin, the whole
    body, is decided and passes."""

    async def go() -> None:
        from corral.net import aio

        async with ruled(tmp_path, POST_NOT_DELETE) as w:
            reader, writer = await aio.open_connection("127.0.0.1", w.port)
            writer.write(
                b"POST " + w.url("/items/1") + b" HTTP/1.1\r\nContent-Type: " + FORM
                + b"\r\nContent-Length: 100\r\n\r\ntitle=only-part"
            )  # fmt: skip
            writer.write_eof()
            assert await reader.read() == b""
            writer.close()
            status, _ = await _post(w, "/items/1", b"title=whole", FORM)
            assert status == 200
            lines = [json.loads(x) for x in w.audit_path.read_text().splitlines()]
            assert (lines[0]["decision"], lines[0]["rule"]) == ("deny", "malformed")
            assert len(w.origin.requests) == 1

    run(go)


ADMIN_GET_DENIED: list[dict[str, object]] = [
    {"host": "127.0.0.1:{port}", "action": "allow"},
    {"host": "127.0.0.1:{port}", "methods": ["GET"], "paths": ["/admin/**"], "action": "deny"},
]


def test_a_head_is_decided_as_the_get_origins_serve_it_as(tmp_path: Path) -> None:
    """Werkzeug (Flask), Starlette, Express, Rails and Django serve a HEAD with the
    GET handler, side effects and all: with GET /admin/** denied, ``HEAD
    /admin/reset`` got a 200 and the origin's reset ran (found by attacking the
    proxy).  Denied, in any case and as a POST whose form's ``_method`` names
    HEAD, and the origin never sees it.  Twins: a HEAD and a GET of an allowed
    path pass, and so does the POST without the field."""

    async def go() -> None:
        async with ruled(tmp_path, ADMIN_GET_DENIED) as w:
            assert (await w.send(b"GET", "/admin/reset")).startswith(b"HTTP/1.1 403")
            for method in (b"HEAD", b"head"):
                denied = await w.send(method, "/admin/reset")
                assert denied.startswith(b"HTTP/1.1 403"), (method, denied)
            assert (await _post(w, "/admin/reset", b"_method=head", FORM))[0] == 403
            assert w.origin.requests == []
            assert (await w.send(b"HEAD", "/public/x")).startswith(b"HTTP/1.1 200")
            assert (await w.send(b"GET", "/public/x")).startswith(b"HTTP/1.1 200")
            assert (await _post(w, "/admin/reset", b"title=head", FORM))[0] == 200
            assert [(r.method, r.target) for r in w.origin.requests] == [
                (b"HEAD", b"/public/x"),
                (b"GET", b"/public/x"),
                (b"POST", b"/admin/reset"),
            ]
            refused = [e for e in w.audit() if e.get("decision") == "deny"]
            assert [e.get("method") for e in refused] == ["GET", "HEAD", "head", "POST"]

    run(go)


CUSTOMERS = """\
---
title: Deleting customer data
risk_tier: {tier}
hosts: [127.0.0.1:{port}]
methods: [DELETE]
paths: [/v1/customers/**]
---
# Never delete customers
"""


class Asked(Asker):
    """Answers no, and keeps what it was asked (rule, method the request names)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def ask(self, dest: Destination, request: Request | None, verdict: Verdict) -> Verdict:
        self.asked.append(verdict.rule)
        return Verdict(False, verdict.rule, "a person said no")


@asynccontextmanager
async def guarded(
    tmp_path: Path, tier: str, asker: Asker | None = None
) -> AsyncIterator[RuledWorld]:
    """An origin and a plain proxy whose one guardrail (no ``[[network.rules]]``)
    is on DELETE /v1/customers/** there, at ``tier``."""
    origin = await Origin().start()
    text = CUSTOMERS.format(tier=tier, port=origin.port)
    guard = gr.parse(text, str(tmp_path / "customers.md"))
    hook = gr.GuardrailHook([guard], dict(gr.DEFAULT_TIER_ACTIONS))
    async with _world(tmp_path, origin, hook, asker) as world:
        yield world


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        pytest.param(b"_method=DELETE", FORM, id="form"),
        pytest.param(b"_method=DELETE", None, id="untyped"),
        pytest.param(b'{"_method": "DELETE"}', b"application/json", id="json"),
        pytest.param(_multipart(b"_method", b"DELETE"), MULTIPART, id="multipart"),
        pytest.param(b"_method=PATCH,DELETE", FORM, id="list"),
    ],
)
def test_a_guardrail_holds_for_a_post_whose_body_names_its_method(
    tmp_path: Path, body: bytes, kind: bytes | None
) -> None:
    """A CRITICAL guardrail on DELETE /v1/customers/** denied a DELETE, an override
    header and ``?_method=DELETE``, but a POST whose form or JSON body says
    ``_method=DELETE`` passed and Rails, Rack, Symfony and Laravel ran the DELETE
    (found by attacking the proxy: the guardrails never read the body the rules
    read).  Denied by the guardrail, which its audit line names.  Twins: the
    same POST without the field, and naming PATCH, reach the origin, body intact."""

    async def go() -> None:
        async with guarded(tmp_path, "CRITICAL") as w:
            status, _ = await _post(w, "/v1/customers/7", body, kind)
            assert status == 403
            assert w.origin.requests == []
            plain = body.replace(b"_method", b"title2")
            patch = body.replace(b"PATCH,DELETE", b"PATCH").replace(b"DELETE", b"PATCH")
            for allowed in (plain, patch):
                status, _ = await _post(w, "/v1/customers/7", allowed, kind)
                assert status == 200, allowed
            assert [(r.method, r.body) for r in w.origin.requests] == [
                (b"POST", plain),
                (b"POST", patch),
            ]
            denied = [e for e in w.audit() if e.get("decision") == "deny"]
            assert len(denied) == 1, denied
            assert denied[0]["rule"] == "guardrail customers.md"
            reason = denied[0]["reason"]
            assert "DELETE /v1/customers/7 is denied by Deleting customer data" in reason
            assert denied[0]["guardrail"]["tier"] == "CRITICAL"

    run(go)


def test_a_guardrail_that_asks_is_asked_for_a_post_whose_body_names_its_method(
    tmp_path: Path,
) -> None:
    """A HIGH guardrail (ask) on DELETE /v1/customers/** was never asked about a
    POST with ``_method=DELETE`` in its form: it passed.  The person is asked
    (and says no: 403).  Twin: the POST without the field passes, unasked."""

    async def go() -> None:
        asker = Asked()
        async with guarded(tmp_path, "HIGH", asker) as w:
            status, _ = await _post(w, "/v1/customers/7", b"_method=delete", FORM)
            assert status == 403
            assert asker.asked == ["guardrail customers.md"]
            status, _ = await _post(w, "/v1/customers/7", b"title=delete", FORM)
            assert status == 200
            assert asker.asked == ["guardrail customers.md"]
            assert [r.body for r in w.origin.requests] == [b"title=delete"]

    run(go)


def test_a_guardrail_denies_a_form_it_cannot_read_first_and_never_replays(
    tmp_path: Path,
) -> None:
    """Where a guardrail would deny a method a POST's body could name, a body that
    cannot be read before deciding (chunked, or longer than 1 MiB) is denied,
    with the reason; a decision made with a body read is never replayed for the
    next request of the same head.  Twins: a chunked upload of another type,
    and the same head with a body naming no guarded method, pass."""

    async def go() -> None:
        from corral.net import aio

        async with guarded(tmp_path, "CRITICAL") as w:
            chunked = b"Transfer-Encoding: chunked\r\n"
            assert (await _post(w, "/v1/customers/7", b"a=1", FORM, chunked))[0] == 403
            assert (await _post(w, "/v1/customers/7", b"\x89PNG", b"image/png", chunked))[0] == 200
            reader, writer = await aio.open_connection("127.0.0.1", w.port)
            writer.write(
                b"POST " + w.url("/v1/customers/7") + b" HTTP/1.1\r\nContent-Type: " + FORM
                + b"\r\nContent-Length: %d\r\n\r\n" % (2 << 20)
            )  # fmt: skip
            answer = await reader.read()
            writer.close()
            assert answer.startswith(b"HTTP/1.1 403"), answer
            allowed, denied = b"_method=GET&x=1", b"_method=DELETE&"
            assert len(allowed) == len(denied)
            assert (await _post(w, "/v1/customers/7", allowed, FORM))[0] == 200
            assert (await _post(w, "/v1/customers/7", denied, FORM))[0] == 403
            assert (await _post(w, "/v1/customers/7", allowed, FORM))[0] == 200
            assert [r.body for r in w.origin.requests] == [b"\x89PNG", allowed, allowed]
            refused = [e for e in w.audit() if e.get("decision") == "deny"]
            assert [e["rule"] for e in refused] == ["guardrail customers.md"] * 3
            assert "_method" in refused[0]["reason"] and "_method" in refused[1]["reason"]
            assert all(e["guardrail"]["tier"] == "CRITICAL" for e in refused)

    run(go)
