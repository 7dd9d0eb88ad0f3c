"""A real value echoed back by its own host never reaches the client: the real
``Proxy`` in a thread with ``[secrets]``, curl as the client and a scripted
origin on 127.0.0.1 that echoes the value it received in the places a response
head can hold it.  Evidence is what curl printed (every head it saw, interim
ones included) and what reached the origin (the real value: the twin)."""

from __future__ import annotations

import base64
import json
import re
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote, unquote

import pytest

from corral.net.audit import Audit
from corral.net.hooks import Chain, HostRulesHook
from corral.net.proxy import Proxy
from corral.net.rules import HostRules
from corral.net.secrets import SecretsHook
from corral.policy import Policy, Secret
from tests.tls_origin import ProxyThread

# '/', '+', '=' and '~' are written differently by each URL encoder
REAL = "sk/real+key=9f8e~7d6c5b4a"
CURL = ["curl", "-sS", "--max-time", "10", "-D", "-", "-o", "/dev/null"]

Script = Callable[[str, dict[str, str]], bytes]
CLOSE = b"<close>"  # at the end of a script's reply: the origin closes after it


class Origin:
    """Answers each request with what ``script`` makes of its target and headers,
    keeping (target, headers) of everything that arrived."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port: int = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")  # (requests without a body)
                # (blank lines before a request line are skipped, as RFC 9112 lets servers)
                lines = head.decode("latin-1").lstrip("\r\n").split("\r\n")
                target = lines[0].split(" ")[1]
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                self.seen.append((target, headers))
                reply = self.script(target, headers)
                conn.sendall(reply.removesuffix(CLOSE))
                if reply.endswith(CLOSE):  # a body that runs until the connection closes
                    return

    def close(self) -> None:
        self.sock.close()


class Harness:
    """The origin (the secret's host) and a second one, a proxy for both whose
    secret K may go to the first only."""

    def __init__(
        self, tmp: Path, script: Script, monkeypatch: pytest.MonkeyPatch, real: str = REAL
    ) -> None:
        self.origin, self.other = Origin(script), Origin(script)
        monkeypatch.setenv("CORRAL_TEST_ECHO_REAL", real)
        policy = Policy(str(tmp))
        policy.network.mode = "proxy"
        policy.secrets = {
            "K": Secret("K", "env:CORRAL_TEST_ECHO_REAL", [f"127.0.0.1:{self.origin.port}"])
        }
        hook = SecretsHook(policy)
        hook.open()
        self.placeholder = hook.sandbox_env()["K"]
        chain = Chain([HostRulesHook(HostRules.parse(["127.0.0.1"], [])), hook])
        self.audit = Audit(str(tmp / "net.jsonl"))
        self.proxy = Proxy(chain, self.audit)
        self.served = ProxyThread(self.proxy, "run-echo")
        self.port = self.served.port

    def curl(self, path: str, *args: str, origin: Origin | None = None) -> str:
        """Every response head curl saw for ``path`` (interim ones too)."""
        url = f"http://127.0.0.1:{(origin or self.origin).port}{path}"
        out = subprocess.run(
            [*CURL, "-x", f"http://127.0.0.1:{self.port}", *args, url],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    def close(self) -> None:
        self.served.stop()
        self.origin.close()
        self.other.close()
        self.audit.close()


def harness_for(
    script: Script, real: str = REAL
) -> Callable[[Path, pytest.MonkeyPatch], Iterator[Harness]]:
    def make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
        h = Harness(tmp_path, script, monkeypatch, real)
        try:
            yield h
        finally:
            h.close()

    return make


def assert_no_real_form(text: str) -> None:
    """Neither the value nor any of its encodings a client could undo."""
    assert REAL not in text
    assert quote(REAL, safe="").lower() not in text.lower()


def ok(extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\n{extra}Content-Length: 2\r\n\r\nok".encode("latin-1")


# -- interim responses and the status line ------------------------------------------------------


def interim(target: str, headers: dict[str, str]) -> bytes:
    """The value the request carried, echoed where the final head's hiding never looked."""
    key = headers.get("x-key", "")
    if target == "/early":  # 103 Early Hints (a Link header naming the request's query)
        early = f"HTTP/1.1 103 Early Hints\r\nLink: </style.css?k={key}>\r\n\r\n"
        return early.encode("latin-1") + ok()
    if target == "/version":  # bytes of its own where the version goes
        return f"HTTP/1.{key} 200 OK\r\nContent-Length: 2\r\n\r\nok".encode("latin-1")
    if target == "/reason":  # a reason phrase that names what was wrong
        return f"HTTP/1.1 401 bad key {key}\r\nContent-Length: 2\r\n\r\nno".encode("latin-1")
    if target == "/name":  # a header named after it (percent-encoded: a valid name)
        return ok(f"X-Seen: 1\r\n{quote(key, safe='')}: 1\r\n")
    return ok(f"X-Seen: {key}\r\n")


interim_harness = pytest.fixture(harness_for(interim))


def test_interim_heads_and_reason_phrases_hide_the_value(interim_harness: Harness) -> None:
    h = interim_harness
    for path, status in (("/early", "200"), ("/reason", "401"), ("/final", "200")):
        heads = h.curl(path, "-H", f"X-Key: {h.placeholder}")
        assert_no_real_form(heads)
        assert h.placeholder in heads, heads  # the echo is there, as the placeholder
        final = [line for line in heads.splitlines() if line.startswith("HTTP/")][-1]
        assert final.startswith("HTTP/1.1 " + status), heads
    # the twin: the origin got the real value each time, and the 103 reached the client
    assert [seen["x-key"] for _, seen in h.origin.seen] == [REAL] * 3
    assert "HTTP/1.1 103" in h.curl("/early", "-H", f"X-Key: {h.placeholder}")


# a value with capitals: a header's name reaches the client lower-cased (the proxy
# reads names so), and an echo there once passed, the value's letters all but
# their case (a hex token: all of it)
MIXED = "Sk-Live-4F9aB7cD2eQxZ"


def named(target: str, headers: dict[str, str]) -> bytes:
    key = headers.get("x-key", "")
    if target == "/name":  # the value as a header's name, as it came
        return ok(f"X-Seen: 1\r\n{key}: 1\r\n")
    if target == "/name-b64":
        return ok(f"X-Seen: 1\r\nX-{b64(key.encode()).rstrip('=')}: 1\r\n")
    return ok(f"X-Seen: 1\r\nX-{key[:6]}: 1\r\n")  # the twin: a few letters of it


named_harness = pytest.fixture(harness_for(named, MIXED))


def test_an_echo_as_a_header_name_is_dropped_whatever_its_case(named_harness: Harness) -> None:
    h = named_harness
    for path in ("/name", "/name-b64"):
        heads = h.curl(path, "-H", f"X-Key: {h.placeholder}")
        assert heads.startswith("HTTP/1.1 200"), heads
        assert MIXED.lower() not in heads.lower(), heads
        assert b64(MIXED.encode()).rstrip("=").lower()[:16] not in heads.lower(), heads
        assert "x-seen: 1" in heads.lower()  # the rest of the head passes
    twin = h.curl("/twin", "-H", f"X-Key: {h.placeholder}")
    assert "x-sk-liv: 1" in twin.lower(), twin  # too short to be an echo: kept
    assert [seen["x-key"] for _, seen in h.origin.seen] == [MIXED] * 3


def test_a_status_line_with_bytes_of_its_own_for_a_version_is_refused(
    interim_harness: Harness,
) -> None:
    """The response's version went to the client as the origin wrote it (found by
    attacking the proxy: "HTTP/1.<the key> 200"): only HTTP/1.0 and HTTP/1.1
    pass, anything else is a 502; the twin: a plain head passes."""
    h = interim_harness
    heads = h.curl("/version", "-H", f"X-Key: {h.placeholder}")
    assert heads.startswith("HTTP/1.1 502"), heads
    assert_no_real_form(heads)
    assert h.curl("/plain", "-H", f"X-Key: {h.placeholder}").startswith("HTTP/1.1 200")


def test_placeholder_for_another_host_is_still_denied(interim_harness: Harness) -> None:
    h = interim_harness
    heads = h.curl("/early", "-H", f"X-Key: {h.placeholder}", origin=h.other)
    assert heads.startswith("HTTP/1.1 403") and h.other.seen == []


@pytest.mark.parametrize("where", ["header-name", "method"])
def test_a_placeholder_as_a_header_name_or_method_to_another_host_is_denied(
    interim_harness: Harness, where: str
) -> None:
    """A placeholder went to another host as a header's name or as the method (found
    by attacking the proxy; worthless there, but the rule is that none goes
    elsewhere).  Denied as in a value; the twin: the same request with a name
    and method of its own reaches the other host."""
    h = interim_harness
    sent = ["-H", f"{h.placeholder}: 1"] if where == "header-name" else ["-X", h.placeholder]
    heads = h.curl("/x", *sent, origin=h.other)
    assert heads.startswith("HTTP/1.1 403") and h.other.seen == []
    twin = ["-H", "X-Name: 1"] if where == "header-name" else ["-X", "PATCH"]
    assert h.curl("/x", *twin, origin=h.other).startswith("HTTP/1.1 200")
    assert len(h.other.seen) == 1


# -- the value in other encodings ----------------------------------------------------------------


def b64(data: bytes, urlsafe: bool = False) -> str:
    return (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(data).decode()


def encoded(target: str, headers: dict[str, str]) -> bytes:
    """The value the request carried, as origins write it back: in a redirect encoded
    by their own URL encoder, in Basic credentials inside another header, base64
    inside a session cookie (urlsafe, unpadded, signed) or at an odd offset."""
    key = headers.get("x-key", "")
    raw = key.encode("latin-1")
    session = b64(json.dumps({"api_key": key}).encode(), urlsafe=True).rstrip("=")
    echo = {
        "/lower": f"Location: /next?k={quote(key, safe='').lower()}",
        "/partial": f"Location: /next?k={quote(key, safe='/')}",
        "/double": f"Location: /next?k={quote(quote(key, safe=''), safe='')}",
        "/basic-inside": f'X-Seen: auth="Basic {b64(b"user:" + raw)}", ok',
        "/cookie": f"Set-Cookie: session={session}.ZmFrZS1zaWc; Path=/",
        "/offset": f"X-Token: {b64(b'v1:' + raw + b':x')}",
    }.get(target, "X-Nothing: 1")
    return ok(f"{echo}\r\nX-Plain: {b64(b'hello there, nothing secret')}\r\n")


encoded_harness = pytest.fixture(harness_for(encoded))
ENCODED = ["/lower", "/partial", "/double", "/basic-inside", "/cookie", "/offset"]


def decoded_forms(text: str) -> list[bytes]:
    """What a client could make of ``text``: percent-decoded (twice), and every run
    of base64 characters decoded at each offset, in both alphabets."""
    forms = [unquote(unquote(text)).encode("latin-1")]
    for run in re.findall(r"[A-Za-z0-9+/_-]{4,}", text):
        standard = run.replace("-", "+").replace("_", "/")
        for offset in range(4):
            part = standard[offset:]
            part = part[: len(part) - (len(part) % 4 == 1)]
            forms.append(base64.b64decode(part + "=" * (-len(part) % 4)))
    return forms


@pytest.mark.parametrize("path", ENCODED)
def test_an_echo_in_another_encoding_is_hidden(encoded_harness: Harness, path: str) -> None:
    h = encoded_harness
    heads = h.curl(path, "-H", f"X-Key: {h.placeholder}")
    assert_no_real_form(heads)
    assert all(REAL.encode() not in form for form in decoded_forms(heads)), heads
    # the twin: the origin got the real value, the client the placeholder in its place
    assert h.origin.seen[-1][1]["x-key"] == REAL
    assert any(h.placeholder.encode() in form for form in decoded_forms(heads)), heads
    assert f"x-plain: {b64(b'hello there, nothing secret')}" in heads  # left as it was


# -- an origin that remembers --------------------------------------------------------------------


def remembering() -> Script:
    """An origin that keeps the last key it was sent and names it on every later
    response (a session, a "current key" header), asked for it or not."""
    kept = {"key": ""}

    def script(target: str, headers: dict[str, str]) -> bytes:
        kept["key"] = headers.get("x-key", kept["key"])
        return ok(f"X-Current-Key: {kept['key']}\r\n")

    return script


def test_an_echo_on_a_later_request_that_carried_nothing_is_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, remembering(), monkeypatch)
    try:
        first = h.curl("/login", "-H", f"X-Key: {h.placeholder}")
        later = h.curl("/whoami")  # no placeholder, no secret header: nothing went out
        for heads in (first, later):
            assert_no_real_form(heads)
            assert f"x-current-key: {h.placeholder}" in heads, heads
        # the twin: the origin got the real value once, and nothing the second time
        assert [seen.get("x-key") for _, seen in h.origin.seen] == [REAL, None]
    finally:
        h.close()


def test_a_header_named_after_the_value_is_dropped(interim_harness: Harness) -> None:
    h = interim_harness
    heads = h.curl("/name", "-H", f"X-Key: {h.placeholder}")
    assert_no_real_form(heads)
    # the twin: the rest of the response arrives, and the origin got the real value
    assert heads.startswith("HTTP/1.1 200") and "x-seen: 1" in heads, heads
    assert h.origin.seen[-1][1]["x-key"] == REAL


# -- bodies ---------------------------------------------------------------------------------------

FILLER = "0123456789abcdef" * (20 * 1024)  # 320 kB: longer than the proxy reads whole


def bodies(target: str, headers: dict[str, str]) -> bytes:
    """The value the request carried, echoed in a body framed each way HTTP/1.1 can."""
    key = headers.get("x-key", "none")
    body = f"before {key} after"
    if target.startswith("/big"):
        body = FILLER + body + FILLER
    if target == "/chunked":  # the value cut across chunks
        half = len(body) // 2
        pieces = [body[:half], body[half:]]
        chunks = "".join(f"{len(p):x}\r\n{p}\r\n" for p in pieces) + "0\r\n\r\n"
        return f"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{chunks}".encode()
    if target.startswith("/wrapped"):  # base64 wrapped as MIME does, CRLF in chunks too
        return wrapped(key, chunked=target == "/wrapped-chunked")
    if target == "/broken":  # a long chunk, then a chunk size no parser takes
        head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        return f"{head}{len(FILLER):x}\r\n{FILLER}\r\nzz\r\n".encode() + CLOSE
    if target == "/close":  # no length: the body ends when the origin closes
        return f"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{body}".encode() + CLOSE
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode()


WRAPPED_PLAIN = b"nothing secret here, " * 5  # the twin: a block holding no value


def wrapped(key: str, chunked: bool) -> bytes:
    """The value at every offset of base64 wrapped at 76 characters (a line break
    falls inside its encoding in most), one block per offset, and a block that
    holds no value; chunked: in chunks of 7 bytes (a CRLF split across two)."""
    blocks = [base64.encodebytes(b"x" * pad + key.encode() + b" end") for pad in range(60)]
    # LF, CRLF, a CR alone, an indented (YAML, folded) next line, groups of 8 split
    # by spaces and by tabs: a way of wrapping for each sixth of the offsets
    ways: list[Callable[[bytes], bytes]] = [
        lambda b: b,
        lambda b: b.replace(b"\n", b"\r\n"),
        lambda b: b.replace(b"\n", b"\r"),
        lambda b: b.replace(b"\n", b"\n    "),
        lambda b: b" ".join(b.replace(b"\n", b"")[i : i + 8] for i in range(0, len(b), 8)),
        lambda b: b"\t".join(b.replace(b"\n", b"")[i : i + 8] for i in range(0, len(b), 8)),
    ]
    blocks = [ways[i // 10](b) for i, b in enumerate(blocks)]
    body = b"\n".join([*blocks, base64.encodebytes(WRAPPED_PLAIN).replace(b"\n", b"\r\n")])
    if not chunked:
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    pieces = [body[i : i + 7] for i in range(0, len(body), 7)]
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks


bodies_harness = pytest.fixture(harness_for(bodies))


def fetched(h: Harness, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["curl", "-sS", "--max-time", "10", "-x", f"http://127.0.0.1:{h.port}", *args],
        capture_output=True,
        timeout=30,
    )


@pytest.mark.parametrize("path", ["/small", "/big", "/chunked", "/close"])
@pytest.mark.parametrize("http", ["--http1.1", "--http1.0"])
def test_an_echo_in_a_body_is_hidden_however_it_is_framed(
    bodies_harness: Harness, path: str, http: str
) -> None:
    """A body from the secret's host goes to the client re-framed, the value
    replaced: whole with a new Content-Length up to 256 kB, else chunked (HTTP/1.1)
    or until the connection closes (HTTP/1.0).  The twin: the rest of the body
    arrives byte for byte, and the origin got the real value."""
    h = bodies_harness
    url = f"http://127.0.0.1:{h.origin.port}{path}"
    got = fetched(h, http, "-D", "-", "-H", f"X-Key: {h.placeholder}", url)
    assert got.returncode == 0, got.stderr
    head, _, body = got.stdout.decode().partition("\r\n\r\n")
    expected = f"before {h.placeholder} after"
    if path.startswith("/big"):
        expected = FILLER + expected + FILLER
    assert body == expected
    assert h.origin.seen[-1][1]["x-key"] == REAL
    head = head.lower()
    if path == "/small":
        assert f"content-length: {len(expected)}" in head
    elif http == "--http1.1":
        assert "transfer-encoding: chunked" in head and "content-length" not in head
    else:
        assert "connection: close" in head and "content-length" not in head


def _decoded_blocks(body: bytes) -> list[bytes]:
    """Each base64 block of a body decoded as a lenient client would (white space
    skipped; the groups a rejoined line left unaligned decoded where they are)."""
    found = []
    for block in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        flat = block.translate(None, b" \t\r\n")
        for piece in flat.split(b"="):
            for shift in range(4):
                part = piece[shift:][: (len(piece) - shift) // 4 * 4]
                try:
                    found.append(base64.b64decode(part, validate=True))
                except ValueError:
                    pass
    return found


@pytest.mark.parametrize("path", ["/wrapped", "/wrapped-chunked"])
def test_an_echo_in_wrapped_base64_is_hidden(bodies_harness: Harness, path: str) -> None:
    """MIME and PEM wrap base64 at 76 or 64 characters: a line break inside the
    value's encoding cut it in two, and the value reached the client in 33 of 61
    positions (found by attacking the proxy; then CR-only breaks, indented next
    lines and groups split by spaces or tabs, by attacking that fix).  At every
    offset, whole or streamed in chunks that split a CRLF, no block decodes to
    the value; the twin: a block that holds none arrives as sent, and the origin
    got the real value."""
    h = bodies_harness
    got = fetched(h, "-H", f"X-Key: {h.placeholder}", f"http://127.0.0.1:{h.origin.port}{path}")
    assert got.returncode == 0, got.stderr
    decoded = _decoded_blocks(got.stdout)
    assert decoded, got.stdout[:200]
    assert not any(REAL.encode() in d for d in decoded)
    assert not any(REAL.encode()[2:-2] in d for d in decoded)  # nor most of it
    assert base64.encodebytes(WRAPPED_PLAIN).replace(b"\n", b"\r\n") in got.stdout
    assert h.origin.seen[-1][1]["x-key"] == REAL


def test_a_connection_stays_usable_after_a_filtered_body(bodies_harness: Harness) -> None:
    """Keep-alive: three responses on one client connection, each re-framed, then a
    HEAD (no body, nothing to filter: the origin's own length stands)."""
    h = bodies_harness
    base = f"http://127.0.0.1:{h.origin.port}"
    got = fetched(
        h, "-H", f"X-Key: {h.placeholder}", f"{base}/small", f"{base}/big", f"{base}/chunked"
    )
    assert got.returncode == 0, got.stderr
    out = got.stdout.decode()
    assert REAL not in out and out.count(h.placeholder) == 3, out[:200]
    assert (
        "Re-using existing connection"
        in fetched(h, "-v", f"{base}/small", f"{base}/small").stderr.decode()
    )
    head = fetched(h, "-I", f"{base}/small").stdout.decode().lower()
    assert "content-length: 17" in head  # "before none after"


def test_a_body_that_breaks_off_cuts_the_connection(bodies_harness: Harness) -> None:
    """Once a filtered body's head is out, an origin that breaks off (a malformed
    chunk) ends the client's connection mid-body: no second response (a 502)
    follows the first.  The twin: the body up to the break arrived."""
    h = bodies_harness
    got = fetched(h, f"http://127.0.0.1:{h.origin.port}/broken")
    assert got.returncode != 0  # curl: the transfer ended early
    with socket.create_connection(("127.0.0.1", h.port), timeout=10) as client:
        client.sendall(f"GET http://127.0.0.1:{h.origin.port}/broken HTTP/1.1\r\n\r\n".encode())
        raw = b""
        while data := client.recv(65536):
            raw += data
    assert raw.startswith(b"HTTP/1.1 200") and raw.count(b"HTTP/1.1") == 1, raw[-300:]
    assert FILLER[:1000].encode() in raw and not raw.endswith(b"0\r\n\r\n")


# -- the same server under its address ----------------------------------------------------------


def keeper() -> Script:
    """An origin that keeps what /store carried in X-Key and shows it on /fetch."""
    kept: list[str] = []

    def script(target: str, headers: dict[str, str]) -> bytes:
        if target == "/store":
            kept.append(headers.get("x-key", ""))
            return ok()
        body = f"kept {kept[-1] if kept else ''}"
        head = f"HTTP/1.1 200 OK\r\nX-Kept: {body}\r\nContent-Length: {len(body)}\r\n\r\n"
        return (head + body).encode()

    return script


def _through(port: int, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CURL[:-2], "-o", "-", "-x", f"http://127.0.0.1:{port}", *args, url],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_an_echo_from_the_secret_hosts_server_under_its_address_is_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A secret for name.test, pinned to 127.0.0.1, whose address is allowed too: the
    origin kept the value sent by name and showed it to a request by address,
    which no echo hiding looked at (found by attacking the proxy: the rebinding
    guard had the user allow the address).  Every secret's echo is hidden in a
    response from an address; the twin: by name it is hidden too, and the
    origin got the real value."""
    origin = Origin(keeper())
    monkeypatch.setenv("CORRAL_TEST_ECHO_REAL", REAL)
    policy = Policy(str(tmp_path))
    policy.network.mode = "proxy"
    name = f"name.test:{origin.port}"
    policy.secrets = {"K": Secret("K", "env:CORRAL_TEST_ECHO_REAL", [name])}
    hook = SecretsHook(policy)
    hook.open()
    placeholder = hook.sandbox_env()["K"]
    pins = {"name.test": "127.0.0.1"}
    rules = HostRules.parse([name, f"127.0.0.1:{origin.port}"], [])
    audit = Audit(str(tmp_path / "net.jsonl"))
    served = ProxyThread(Proxy(Chain([HostRulesHook(rules, pins), hook]), audit, pinned=pins), "r")
    try:
        stored = _through(served.port, f"http://{name}/store", "-H", f"X-Key: {placeholder}")
        assert stored.returncode == 0 and origin.seen[-1][1]["x-key"] == REAL, stored
        for host in (f"127.0.0.1:{origin.port}", name):
            got = _through(served.port, f"http://{host}/fetch")
            assert got.returncode == 0, got.stderr
            assert_no_real_form(got.stdout)
            assert f"x-kept: kept {placeholder}".lower() in got.stdout.lower(), got.stdout
            assert got.stdout.endswith(f"kept {placeholder}"), got.stdout
    finally:
        served.stop()
        origin.close()
        audit.close()


def _address_world(
    tmp_path: Path, origin: Origin, passthrough: list[str]
) -> tuple[ProxyThread, Audit, str, str]:
    """A proxy that can intercept, a secret for name.test pinned to 127.0.0.1 (and
    alias.test pinned there too), the address allowed as well; the proxy, its
    audit, the placeholder and name.test:PORT."""
    from corral.net import ca as calib
    from corral.net.tls import Interceptor
    from corral.net.trust import UpstreamTrust

    policy = Policy(str(tmp_path))
    policy.network.mode = "proxy"
    name = f"name.test:{origin.port}"
    pins = {"name.test": "127.0.0.1", "alias.test": "127.0.0.1"}
    policy.network.hosts = pins
    policy.secrets = {"K": Secret("K", "env:CORRAL_TEST_ECHO_REAL", [name])}
    hook = SecretsHook(policy)
    hook.open()
    allowed = [name, f"alias.test:{origin.port}", f"127.0.0.1:{origin.port}"]
    chain = Chain([HostRulesHook(HostRules.parse(allowed, []), pins), hook], passthrough)
    audit = Audit(str(tmp_path / "net.jsonl"))
    interceptor = Interceptor(
        calib.create("corral test CA", 1, "ephemeral"), UpstreamTrust([], None)
    )
    proxy = Proxy(chain, audit, pinned=pins, tls=interceptor)
    return ProxyThread(proxy, "r"), audit, hook.sandbox_env()["K"], name


def _raw_through_connect(proxy_port: int, origin_port: int, data: bytes) -> bytes:
    """``data`` sent in a CONNECT tunnel to 127.0.0.1:ORIGIN; what comes back."""
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=10) as client:
        client.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % origin_port)
        answer = client.recv(4096)
        if not answer.startswith(b"HTTP/1.1 200"):
            return answer
        client.sendall(data)
        got = b""
        while b"kept" not in got and (more := client.recv(65536)):  # (or closed)
            got += more
        return got


@pytest.mark.parametrize(
    "how",
    [
        pytest.param(["-p"], id="connect-tunnel"),
        pytest.param(["--socks5", "{proxy}"], id="socks5"),
        pytest.param([], id="alias-name"),
    ],
)
def test_an_echo_through_a_tunnel_to_the_secret_hosts_address_is_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: list[str]
) -> None:
    """The value sent by name, read back by the server's address through a CONNECT
    tunnel or SOCKS5, or by another name pinned to the same address, came back
    in clear: the address was not intercepted, so its plain HTTP went through
    unread (found by attacking the proxy).  With a secret in the run, a tunnel
    to an address, or to a name sharing a secret host's pin, is read like the
    secret's host (HTTPS intercepted, plain HTTP request by request).  The twin:
    each request reached the origin and got its answer, the placeholder in
    place of the value."""
    origin = Origin(keeper())
    monkeypatch.setenv("CORRAL_TEST_ECHO_REAL", REAL)
    served, audit, placeholder, name = _address_world(tmp_path, origin, [])
    try:
        stored = _through(served.port, f"http://{name}/store", "-H", f"X-Key: {placeholder}")
        assert stored.returncode == 0 and origin.seen[-1][1]["x-key"] == REAL, stored
        host = f"alias.test:{origin.port}" if not how else f"127.0.0.1:{origin.port}"
        args = [a.replace("{proxy}", f"127.0.0.1:{served.port}") for a in how]
        if "--socks5" in args:
            got = subprocess.run(
                [*CURL[:-2], "-o", "-", *args, f"http://{host}/fetch"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        else:
            got = _through(served.port, f"http://{host}/fetch", *args)
        assert got.returncode == 0, got.stderr
        assert_no_real_form(got.stdout)
        assert got.stdout.endswith(f"kept {placeholder}"), got.stdout
    finally:
        served.stop()
        origin.close()
        audit.close()


def test_a_name_pinned_to_a_secret_hosts_address_is_read_like_it(tmp_path: Path) -> None:
    """A secret whose host is an address (``hosts = ["127.0.0.1:8080"]``) and a name
    ``[network] hosts`` pins to that address: the value sent to the address came
    back in clear by the name (found by attacking the proxy).  Such a name, and
    one pinned to where a secret's host name is pinned, is read like the secret's
    host (intercepted, echoes hidden).  The twins: a name pinned elsewhere is not."""
    policy = Policy(str(tmp_path))
    policy.network.mode = "proxy"
    policy.network.hosts = {
        "localhost": "127.0.0.1",
        "api.test": "127.0.0.2",
        "alias.test": "127.0.0.2",
        "other.test": "127.0.0.3",
    }
    policy.secrets = {
        "A": Secret("A", "env:X", ["127.0.0.1:8080"]),
        "B": Secret("B", "env:X", ["api.test"]),
    }
    hook = SecretsHook(policy)
    for name in ("localhost", "alias.test", "api.test", "127.0.0.9"):
        assert hook.needs_inspection(name, 8080), name
    assert not hook.needs_inspection("other.test", 8080)
    assert not hook.needs_inspection("elsewhere.test", 443)


def test_other_bytes_to_an_address_are_refused_unless_passed_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What is neither TLS nor HTTP cannot be read for an echo: with a secret in the
    run, a tunnel to an address carrying it is refused (an origin that skips a
    leading blank line, as RFC 9112 lets it, would answer the HTTP behind one).
    The twin: with the address in ``[tls] passthrough`` (the user's choice, for a
    database say) the same bytes pass, unread."""
    origin = Origin(keeper())
    monkeypatch.setenv("CORRAL_TEST_ECHO_REAL", REAL)
    hidden = b"\r\nGET /fetch HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    for passthrough, answered in (([], False), ([f"127.0.0.1:{origin.port}"], True)):
        served, audit, _, _ = _address_world(tmp_path, origin, passthrough)
        try:
            got = _raw_through_connect(served.port, origin.port, hidden)
            assert (b"kept" in got) == answered, (passthrough, got[:200])
        finally:
            served.stop()
            audit.close()
    origin.close()


def test_a_pinned_name_passes_the_rebinding_guard_without_its_address(tmp_path: Path) -> None:
    """[network] hosts pins localhost to 127.0.0.1: the name reaches the origin with
    only the name allowed, and the address itself stays refused, so no request
    to it escapes the name's rules and secrets.  The twin: unpinned, the name's
    loopback address is refused by the rebinding guard, as before."""
    origin = Origin(lambda target, headers: ok())
    name = f"localhost:{origin.port}"
    audit = Audit(str(tmp_path / "net.jsonl"))
    try:
        for pins, by_name in (({"localhost": "127.0.0.1"}, "200"), ({}, "403")):
            chain = Chain([HostRulesHook(HostRules.parse([name], []), pins)])
            served = ProxyThread(Proxy(chain, audit, pinned=pins), "r")
            try:
                for url, status in ((f"http://{name}/", by_name),
                                    (f"http://127.0.0.1:{origin.port}/", "403")):  # fmt: skip
                    got = _through(served.port, url, "-w", "%{http_code}")
                    assert got.stdout.endswith(status), (pins, url, got)
            finally:
                served.stop()
    finally:
        origin.close()
        audit.close()
