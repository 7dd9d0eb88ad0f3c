"""TLS inspection with the real ``Proxy`` in-process (its own thread and event
loop, uvloop when installed), real clients (curl; Python requests and httpx on
the system Python) and real HTTPS origins on 127.0.0.1 and ::1 whose CA is the
proxy's ``upstream_ca``.

Evidence is taken on the origin side (what arrived, and with which headers)
and from the audit log; each deny has an allow twin under the same proxy.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.errors import PolicyError
from corral.net import ca as calib
from corral.net import trust
from corral.net.audit import Audit
from corral.net.hooks import (
    Asker,
    Chain,
    Destination,
    Hook,
    HostRulesHook,
    InspectHook,
    Request,
    Response,
)
from corral.net.proxy import Proxy
from corral.net.rules import HostRules, Verdict
from corral.net.tls import Interceptor
from corral.net.trust import UpstreamTrust
from tests.tls_origin import NODE_CONNECT_CLIENT, Origin, OriginCA, ProxyThread

SYSTEM_PYTHON = "/usr/bin/python3"
CURL = ["curl", "-sS", "--max-time", "10"]


class DenyPath(Hook):
    """The deny twin's stub: denies one path prefix, limits bodies, rewrites."""

    name = "deny-path"

    def __init__(self, prefix: str = "/secret", limit: int | None = None) -> None:
        self.prefix = prefix
        self.limit = limit

    def on_request(self, dest: Destination, request: Request) -> Verdict | None:
        if self.limit is not None:
            request.limit_body(self.limit, "stub-limit")
        if request.target.startswith(self.prefix):
            return Verdict(False, "stub", f"{self.prefix} is off limits")
        if request.target.startswith("/ask"):
            return Verdict(False, "stub-ask", "a person decides", ask=True)
        return None

    def rewrite(self, dest: Destination, request: Request) -> None:
        request.headers.append((b"x-added-by-hook", dest.scheme.encode()))

    def on_response(
        self, dest: Destination, request: Request, response: Response
    ) -> Verdict | None:
        response.headers = [
            (k, b"[hidden]" if k == b"x-origin-echo" else v) for k, v in response.headers
        ]
        return None


class Careless(Hook):
    """A rule that writes what it must not: framing, CR/LF, a bad target."""

    name = "careless"

    def rewrite(self, dest: Destination, request: Request) -> None:
        request.headers.append((b"content-length", b"5"))  # the body is 1000 bytes
        if request.target.startswith("/inject"):
            request.headers.append((b"x-value", b"a\r\nx-smuggled: yes"))
        if request.target.startswith("/target"):
            request.target = "/a b"


class Yes(Asker):
    async def ask(self, dest: Destination, request: Request | None, verdict: Verdict) -> Verdict:
        return Verdict(True, verdict.rule, "a person said yes")


class Harness:
    """Origins, a corral CA and bundle, and a proxy thread serving 127.0.0.1:PORT."""

    def __init__(self, tmp: Path, hooks: list[Hook], passthrough: list[str], asker: Asker | None):
        self.tmp = tmp
        self.test_ca = OriginCA(tmp / "origin-ca")
        self.origin = Origin(self.test_ca.server_files())
        self.origin6 = Origin(self.test_ca.server_files(tag="origin6"), v6=True)
        stranger = OriginCA(tmp / "stranger-ca", "a CA nobody trusts")
        self.untrusted = Origin(stranger.server_files(tag="untrusted"))
        self.ca = calib.create("corral test CA", 1, "ephemeral")
        self.bundle = trust.write_bundle(str(tmp), self.ca.cert_pem, trust.system_bundles())
        allow = ["origin.test", "other.test", "127.0.0.1", "[::1]"]
        chain = Chain([HostRulesHook(HostRules.parse(allow, [])), *hooks], passthrough)
        self.audit_path = tmp / "net.jsonl"
        self.audit = Audit(str(self.audit_path))
        upstream = UpstreamTrust([self.test_ca.cert_path.read_text()], None)
        self.interceptor = Interceptor(self.ca, upstream)
        pinned = {"origin.test": "127.0.0.1", "other.test": "127.0.0.1"}
        self.proxy = Proxy(chain, self.audit, pinned, tls=self.interceptor, asker=asker)
        self.served = ProxyThread(self.proxy, "run-tls")
        self.port = self.served.port
        self.proxy_url = f"http://127.0.0.1:{self.port}"

    def url(self, path: str, host: str = "origin.test", origin: Origin | None = None) -> str:
        return f"https://{host}:{(origin or self.origin).port}{path}"

    def lines(self) -> list[dict[str, object]]:
        time.sleep(0.15)  # the audit writes in batches within 50 ms
        if not self.audit_path.exists():
            return []
        return [json.loads(x) for x in self.audit_path.read_text().splitlines()]

    def close(self) -> None:
        self.served.stop()
        for origin in (self.origin, self.origin6, self.untrusted):
            origin.close()


@pytest.fixture
def harness(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Harness]:
    marker = request.node.get_closest_marker("hooks")
    hooks: list[Hook] = [InspectHook(["origin.test", "[::1]"]), DenyPath()]
    passthrough: list[str] = []
    asker = None
    if marker is not None:
        hooks = marker.kwargs.get("hooks", hooks)
        passthrough = marker.kwargs.get("passthrough", [])
        asker = marker.kwargs.get("asker")
    h = Harness(tmp_path, hooks, passthrough, asker)
    try:
        yield h
    finally:
        h.close()


def curl(h: Harness, *args: str, cacert: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CURL, "--cacert", cacert or h.bundle, "-x", h.proxy_url, *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def status(out: subprocess.CompletedProcess[str]) -> int:
    """The final response's status in ``curl -D -`` output (after CONNECT's 200)."""
    lines = [x for x in out.stdout.splitlines() if x.startswith("HTTP/1.1 ")]
    return int(lines[-1].split()[1]) if lines else 0


# -- leaf certificates and the CA ---------------------------------------------------------


def test_leaf_for_a_new_host_within_15ms_and_cached_within_0_2ms() -> None:
    interceptor = Interceptor(calib.create("timing CA", 1, "ephemeral"), UpstreamTrust([], None))
    interceptor.server_context("warm.test")  # the worker's leaf key is made once
    fresh = []
    for n in range(20):
        t0 = time.perf_counter()
        interceptor.server_context(f"host{n}.example.org")
        fresh.append(time.perf_counter() - t0)
    cached = []
    for _ in range(200):
        t0 = time.perf_counter()
        interceptor.server_context("host3.example.org")
        cached.append(time.perf_counter() - t0)
    fresh.sort()
    cached.sort()
    assert fresh[len(fresh) // 2] < 0.015, fresh
    assert cached[len(cached) // 2] < 0.0002, cached


def test_leaf_names_the_host_and_chains_to_the_ca() -> None:
    from cryptography import x509

    ca = calib.create("chain CA", 1, "ephemeral")
    issuer = calib.Issuer(ca)
    for host, kind in (("api.example.org", x509.DNSName), ("127.0.0.1", x509.IPAddress)):
        pem, renew = issuer.leaf(host)
        leaf = x509.load_pem_x509_certificate(pem)
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert [str(v) for v in san.get_values_for_type(kind)] == [host]
        assert leaf.issuer == ca.cert.subject
        leaf.verify_directly_issued_by(ca.cert)
        assert renew < calib.not_after(leaf)  # made again before it expires


def test_user_ca_is_made_once_0600_and_shared_by_concurrent_runs(tmp_path: Path) -> None:
    state = tmp_path / "state"
    found: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: found.append(calib.user_ca(str(state)).cert_pem))
        for _ in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(found)) == 1  # one CA, whoever came first
    path = state / trust.USER_CA
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # nothing left aside
    assert calib.user_ca(str(state)).cert_pem == found[0]  # the next run reads it


def test_own_ca_is_checked_and_errors_name_the_key(tmp_path: Path) -> None:
    own = OriginCA(tmp_path / "own")
    ca = calib.load_own(str(own.cert_path), str(own.key_path))
    assert ca.origin == "own"
    other = OriginCA(tmp_path / "other")
    leaf_cert, leaf_key = own.server_files(tag="leaf")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cases = [
        ((own.cert_path, other.key_path), r"tls\.ca_key: .* is not the key of tls\.ca_cert"),
        ((leaf_cert, leaf_key), r"tls\.ca_cert: .* is not a CA certificate"),
        ((garbage, own.key_path), r"tls\.ca_cert: .* holds no PEM certificate"),
        ((own.cert_path, garbage), r"tls\.ca_key: .* holds no PEM private key"),
        ((own.cert_path, tmp_path / "missing.key"), r"tls\.ca_key: cannot read"),
    ]
    for (cert, key), message in cases:
        with pytest.raises(PolicyError, match=message):
            calib.load_own(str(cert), str(key))


def test_bundle_is_the_system_bundle_plus_the_ca_and_no_key(tmp_path: Path) -> None:
    ca = calib.create("bundle CA", 1, "ephemeral")
    found = trust.system_bundles()
    path = Path(trust.write_bundle(str(tmp_path), ca.cert_pem, found))
    data = path.read_bytes()
    assert data.endswith(ca.cert_pem) and b"PRIVATE KEY" not in data
    if found:
        assert data.startswith(Path(found[0]).read_bytes()[:200])
    assert path.stat().st_mode & 0o777 == 0o644
    context = ssl.create_default_context(cafile=str(path))  # it parses as a CA file
    assert context.cert_store_stats()["x509_ca"] >= 1


def test_a_bundle_the_caller_names_joins_corrals_certificates_only(tmp_path: Path) -> None:
    """A company's CA named by the caller's SSL_CERT_FILE is in the run's bundle, so
    hosts signed by it still verify inside; a key in that file never is."""
    ca = calib.create("bundle CA", 1, "ephemeral")
    company = calib.create("a company's CA", 1, "ephemeral")
    named = tmp_path / "corp.pem"
    named.write_bytes(b"# a comment\n" + company.key_pem + company.cert_pem + b"trailing\n")
    out = tmp_path / "out"
    out.mkdir()
    found = trust.system_bundles()
    data = Path(trust.write_bundle(str(out), ca.cert_pem, found, (str(named),))).read_bytes()
    assert company.cert_pem.strip() in data and data.endswith(ca.cert_pem)
    assert b"PRIVATE KEY" not in data and b"trailing" not in data
    # the twin: named files that are not bundles add nothing, and the run goes on
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    other = tmp_path / "other"
    other.mkdir()
    plain = trust.write_bundle(str(other), ca.cert_pem, found, (str(fifo), "/nonexistent"))
    assert Path(plain).read_bytes().count(b"BEGIN CERTIFICATE") == data.count(
        b"BEGIN CERTIFICATE"
    ) - company.cert_pem.count(b"BEGIN CERTIFICATE")


def test_a_named_bundle_the_sandbox_could_plant_or_a_masked_one_adds_nothing(
    tmp_path: Path,
) -> None:
    """Found by attacking corral: a bundle in the workspace, linked by the sandbox to
    a masked file or to corral's audit log, carried them into the next run's
    bundle, text between the markers included.  Only certificates that parse are
    written, and only from files outside the places named."""
    ca = calib.create("bundle CA", 1, "ephemeral")
    company = calib.create("a company's CA", 1, "ephemeral")
    workspace, secret, outside = tmp_path / "ws", tmp_path / "secret", tmp_path / "etc"
    for d in (workspace, secret, outside):
        d.mkdir()
    fake = trust.PEM_BEGIN + b"\ndb_password=hunter2\n" + trust.PEM_END + b"\n"
    (secret / "client.pem").write_bytes(company.cert_pem + fake)
    (workspace / "ca.pem").symlink_to(secret / "client.pem")  # planted by a sandbox
    (outside / "corp.pem").write_bytes(fake + company.cert_pem)
    bounds = (str(workspace), str(secret))
    named = (str(workspace / "ca.pem"), str(secret / "client.pem"), str(outside / "corp.pem"))
    out = tmp_path / "out"
    out.mkdir()
    data = Path(trust.write_bundle(str(out), ca.cert_pem, (), named, bounds)).read_bytes()
    assert b"hunter2" not in data  # not a certificate: dropped
    # the one from outside the bounds (the twin) joins; the planted link and the
    # masked file add nothing (else the company's certificate would be there twice)
    assert data.count(company.cert_pem.strip()) == 1 and data.endswith(ca.cert_pem)


def test_with_inspection_passed_bundle_variables_name_corrals_and_set_ones_win() -> None:
    extras = trust.NetExtras("/door/ca-bundle.pem", (), {"API_KEY": "placeholder"})
    env = {
        "SSL_CERT_FILE": "/tmp/corp.pem",  # passed in from the caller (defaults.CA_ENV)
        "NPM_CONFIG_CAFILE": "/etc/corp.pem",  # passed, not one corral sets by default
        "SSL_CERT_DIR": "/etc/ssl/certs",  # a directory: left as it is
        "CURL_CA_BUNDLE": "/mine.pem",  # set by the policy: it wins
        "API_KEY": "real",
    }
    got = trust.sandbox_env(extras, env, trust.INSIDE_BUNDLE, keep={"CURL_CA_BUNDLE": "/mine.pem"})
    assert got["SSL_CERT_FILE"] == got["NPM_CONFIG_CAFILE"] == trust.INSIDE_BUNDLE
    assert got["REQUESTS_CA_BUNDLE"] == trust.INSIDE_BUNDLE
    assert got["SSL_CERT_DIR"] == "/etc/ssl/certs" and got["CURL_CA_BUNDLE"] == "/mine.pem"
    assert got["API_KEY"] == "placeholder"
    # the twin: a run that does not inspect leaves every passed value alone
    assert trust.sandbox_env(trust.NetExtras(), env, trust.INSIDE_BUNDLE) == env


# -- real clients through interception -----------------------------------------------------


def test_curl_through_interception_and_its_deny_twin(harness: Harness) -> None:
    h = harness
    ok = curl(h, "-H", "X-Echo-Me: value", "-D", "-", h.url("/echo/public"))
    assert ok.returncode == 0, ok.stderr
    head, _, body = ok.stdout.rpartition("\n\n")
    seen = json.loads(body)
    assert seen["target"] == "/echo/public"
    assert ["x-added-by-hook", "https"] in seen["headers"]  # the rewrite reached the origin
    assert "x-origin-echo: [hidden]" in head.lower()  # a response hook edited the head
    denied = curl(h, "-D", "-", h.url("/secret/file"))
    assert denied.returncode == 0
    assert status(denied) == 403
    verdict = json.loads(denied.stdout.rpartition("\n\n")[2])
    assert verdict["rule"] == "stub" and verdict["decision"] == "deny"
    assert [r["target"] for r in h.origin.requests] == ["/echo/public"]  # nothing else arrived
    lines = [x for x in h.lines() if x["scheme"] == "https"]
    assert [(x["path"], x["decision"], x["status"]) for x in lines] == [
        ("/echo/public", "allow", 200),
        ("/secret/file", "deny", 403),
    ]


@pytest.mark.parametrize("client", ["requests", "httpx"])
def test_python_clients_through_interception(harness: Harness, client: str) -> None:
    h = harness
    if client == "requests":
        code = "import requests,sys; r=requests.get(sys.argv[1]); print(r.status_code, r.text)"
    else:
        code = "import httpx,sys; r=httpx.get(sys.argv[1]); print(r.status_code, r.text)"
    env = {
        "PATH": "/usr/bin:/bin",
        "HTTPS_PROXY": h.proxy_url,
        **trust.trust_env(h.bundle),
    }
    for path, status in (("/echo/one", "200"), ("/secret/two", "403")):
        out = subprocess.run(
            [SYSTEM_PYTHON, "-c", code, h.url(path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split()[0] == status
    assert [r["target"] for r in h.origin.requests] == ["/echo/one"]


def test_the_client_sees_corrals_leaf_not_the_origins(harness: Harness) -> None:
    h = harness
    # with only the origin's CA, curl cannot verify what corral presents...
    alone = curl(h, h.url("/echo"), cacert=str(h.test_ca.cert_path))
    assert alone.returncode != 0 and h.origin.requests == []
    # ...and with the bundle it can, and the chain it verified is corral's
    ok = curl(h, "-w", "%{certs}", h.url("/echo"))
    assert ok.returncode == 0
    assert "corral test CA" in ok.stdout


@pytest.mark.hooks(
    hooks=[InspectHook(["*.test"]), DenyPath()],
    passthrough=["other.test"],
)
def test_passthrough_and_unnamed_hosts_stay_opaque_tunnels(harness: Harness) -> None:
    h = harness
    # other.test is passed through: the client speaks TLS with the origin itself
    opaque = curl(
        h,
        "-w",
        "%{certs}",
        h.url("/echo/opaque", host="other.test"),
        cacert=str(h.test_ca.cert_path),
    )
    assert opaque.returncode == 0, opaque.stderr
    assert "corral test CA" not in opaque.stdout and "corral test origin CA" in opaque.stdout
    # and its deny hook never sees inside: /secret through the tunnel reaches the origin
    through = curl(h, h.url("/secret/x", host="other.test"), cacert=str(h.test_ca.cert_path))
    assert through.returncode == 0 and "/secret/x" in through.stdout
    # the twin: origin.test matches *.test and is intercepted
    inspected = curl(h, "-D", "-", h.url("/secret/x"))
    assert status(inspected) == 403
    schemes = [(x["scheme"], x["host"]) for x in h.lines()]
    assert ("connect", "other.test") in schemes and ("https", "origin.test") in schemes


def test_keepalive_chunked_and_large_streamed_bodies(harness: Harness, tmp_path: Path) -> None:
    h = harness
    big = 64 * 1024 * 1024
    out = curl(
        h,
        *("-o", "/dev/null") * 3,
        "-w",
        "%{http_code} %{size_download} %{num_connects}\n",
        h.url("/bytes/10"),
        h.url(f"/bytes/{big}"),
        h.url("/bytes/20"),
    )
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    assert rows == [
        ["200", "10", "1"],
        ["200", str(big), "0"],
        ["200", "20", "0"],
    ]  # one connection
    assert h.origin.alpn == ["http/1.1"]  # and one upstream connection for the three
    upload = tmp_path / "upload.bin"
    upload.write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    chunked = curl(
        h, "-H", "Transfer-Encoding: chunked", "--data-binary", f"@{upload}", h.url("/count")
    )
    assert chunked.stdout == str(upload.stat().st_size), chunked.stderr
    sized = curl(h, "--data-binary", f"@{upload}", h.url("/count"))
    assert sized.stdout == str(upload.stat().st_size)


@pytest.mark.hooks(hooks=[InspectHook(["origin.test"]), DenyPath(limit=1000)])
def test_body_limit_refuses_before_sending_and_cuts_chunked(harness: Harness) -> None:
    h = harness
    small = curl(h, "--data-binary", "x" * 1000, h.url("/count"))
    assert small.stdout == "1000"  # the allow twin: at the limit
    sized = curl(h, "-D", "-", "--data-binary", "x" * 1001, h.url("/count"))
    assert status(sized) == 413 and "stub-limit" in sized.stdout
    chunked = curl(
        h,
        "-D",
        "-",
        "-H",
        "Transfer-Encoding: chunked",
        "--data-binary",
        "y" * 5000,
        h.url("/count"),
    )
    assert status(chunked) == 413
    assert [r["body_bytes"] for r in h.origin.requests] == [1000]  # neither larger one arrived
    assert {(x["status"], x["rule"]) for x in h.lines() if x["status"] == 413} == {
        (413, "stub-limit")
    }


def test_websocket_upgrade_then_raw_bytes_both_ways(harness: Harness) -> None:
    h = harness
    sock = socket.create_connection(("127.0.0.1", h.port), timeout=10)
    sock.sendall(f"CONNECT origin.test:{h.origin.port} HTTP/1.1\r\n\r\n".encode())
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    context = ssl.create_default_context(cafile=h.bundle)
    tls = context.wrap_socket(sock, server_hostname="origin.test")
    tls.sendall(
        b"GET /ws HTTP/1.1\r\nHost: origin.test\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGVzdA==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += tls.recv(4096)
    assert head.startswith(b"HTTP/1.1 101") and b"upgrade: websocket" in head.lower()
    for payload in (b"\x81\x05hello", os.urandom(200_000)):
        tls.sendall(payload)
        echoed = b""
        while len(echoed) < len(payload):
            echoed += tls.recv(65536)
        assert echoed == payload
    tls.close()
    assert any(x["status"] == 101 and x["path"] == "/ws" for x in h.lines())


def _upgrade(h: Harness, target: str, offer: str) -> tuple[bytes, ssl.SSLSocket]:
    """An upgrade asked for through interception: the response head and the socket."""
    sock = socket.create_connection(("127.0.0.1", h.port), timeout=10)
    sock.sendall(f"CONNECT origin.test:{h.origin.port} HTTP/1.1\r\n\r\n".encode())
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    tls = ssl.create_default_context(cafile=h.bundle).wrap_socket(
        sock, server_hostname="origin.test"
    )
    tls.sendall(
        f"GET {target} HTTP/1.1\r\nHost: origin.test\r\nUpgrade: {offer}\r\n".encode()
        + b"Connection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n"
        + b"Sec-WebSocket-Key: dGVzdA==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    head = b""
    while b"\r\n\r\n" not in head and (data := tls.recv(4096)):
        head += data
    return head, tls


def test_no_upgrade_but_websocket_reaches_the_origin(harness: Harness) -> None:
    """h2c smuggled beside websocket would turn the connection into HTTP/2 that no
    rule sees: only the websocket token is passed on, and a 101 to anything else
    is refused.  Twin: the websocket upgrade itself goes through."""
    h = harness
    for offer in ("h2c, websocket", "websocket, h2c"):
        head, tls = _upgrade(h, "/ws", offer)
        tls.close()
        assert head.startswith(b"HTTP/1.1 101") and b"upgrade: websocket" in head.lower(), head
    offers = [{k.lower(): v for k, v in r["headers"]}.get("upgrade") for r in h.origin.requests]
    assert offers == ["websocket", "websocket"]
    head, tls = _upgrade(h, "/ws/h2c", "websocket")  # an origin that switches anyway
    tls.close()
    assert head.startswith(b"HTTP/1.1 502"), head
    assert any(x["status"] == 502 and x["path"] == "/ws/h2c" for x in h.lines())
    for offer in ("h2c", "websocketx", "not-websocket"):  # nothing else is an upgrade at all
        head, tls = _upgrade(h, "/echo", offer)
        tls.close()
        assert head.startswith(b"HTTP/1.1 200"), head
        assert "upgrade" not in {k.lower() for k, _ in h.origin.requests[-1]["headers"]}


@pytest.mark.hooks(hooks=[InspectHook(["origin.test", "127.0.0.1"]), DenyPath()])
def test_untrusted_origin_is_a_502_with_a_reason_and_an_audit_line(harness: Harness) -> None:
    h = harness
    refused = curl(h, "-D", "-", h.url("/echo", host="127.0.0.1", origin=h.untrusted))
    assert status(refused) == 502, refused.stdout
    body = json.loads(refused.stdout.rpartition("\n\n")[2])
    assert body["rule"] == "upstream-tls" and "not trusted" in body["reason"]
    assert h.untrusted.requests == []  # nothing was sent to it
    line = [x for x in h.lines() if x["status"] == 502][-1]
    assert line["rule"] == "upstream-tls" and line["decision"] == "deny"
    # the twin: the same address with a certificate from the trusted CA
    good = curl(h, h.url("/echo/ok", host="127.0.0.1"))
    assert good.returncode == 0 and json.loads(good.stdout)["target"] == "/echo/ok"


def test_ipv6_origin_socks5_and_plain_http_through_a_tunnel(harness: Harness) -> None:
    h = harness
    v6 = curl(h, h.url("/echo/v6", host="[::1]", origin=h.origin6))
    assert v6.returncode == 0 and json.loads(v6.stdout)["target"] == "/echo/v6", v6.stderr
    socks = subprocess.run(
        [
            *CURL,
            "--cacert",
            h.bundle,
            "--socks5-hostname",
            f"127.0.0.1:{h.port}",
            h.url("/secret/s"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert json.loads(socks.stdout)["rule"] == "stub"  # SOCKS5 is inspected as well
    plain_origin = Origin()
    try:
        h.proxy.chain = Chain(
            [
                HostRulesHook(HostRules.parse(["127.0.0.1"], [])),
                InspectHook(["127.0.0.1"]),
                DenyPath(),
            ]
        )
        tunnel = subprocess.run(
            [
                *CURL,
                "-p",
                "-x",
                h.proxy_url,
                f"http://127.0.0.1:{plain_origin.port}/secret/p",
                f"http://127.0.0.1:{plain_origin.port}/echo/p",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert '"rule":"stub"' in tunnel.stdout.replace(" ", "")
        assert [r["target"] for r in plain_origin.requests] == ["/echo/p"]
    finally:
        plain_origin.close()


@pytest.mark.hooks(hooks=[InspectHook(["origin.test"]), DenyPath()])
def test_ask_without_anyone_to_answer_is_a_deny(harness: Harness) -> None:
    h = harness
    out = curl(h, "-D", "-", h.url("/ask/x"))
    assert status(out) == 403 and "nobody can answer" in out.stdout
    assert h.origin.requests == []


@pytest.mark.hooks(hooks=[InspectHook(["origin.test"]), DenyPath()], asker=Yes())
def test_ask_answered_yes_goes_through(harness: Harness) -> None:
    h = harness
    out = curl(h, h.url("/ask/x"))
    assert json.loads(out.stdout)["target"] == "/ask/x"


def test_a_stream_that_is_neither_tls_nor_http_is_refused(harness: Harness) -> None:
    h = harness
    sock = socket.create_connection(("127.0.0.1", h.port), timeout=10)
    sock.sendall(f"CONNECT origin.test:{h.origin.port} HTTP/1.1\r\n\r\n".encode())
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    sock.sendall(b"\x00\x01binary protocol")
    assert sock.recv(4096) == b""  # closed
    sock.close()
    line = [x for x in h.lines() if x["rule"] == "inspect"][-1]
    assert line["decision"] == "deny" and "neither TLS nor HTTP" in str(line["reason"])
    assert h.origin.requests == []


def test_a_client_that_refuses_corrals_certificate_is_audited(harness: Harness) -> None:
    h = harness
    out = curl(h, h.url("/echo"), cacert=str(h.test_ca.cert_path))
    assert out.returncode != 0
    line = [x for x in h.lines() if x["scheme"] == "connect"][-1]
    assert "TLS handshake with the client failed" in str(line["reason"])


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_https_through_a_connect_tunnel_trusts_extra_ca(harness: Harness) -> None:
    h = harness
    script = NODE_CONNECT_CLIENT
    env = {"PATH": "/usr/bin:/bin", "HTTPS_PROXY": h.proxy_url, "NODE_EXTRA_CA_CERTS": h.bundle}
    out = subprocess.run(
        ["node", "-e", script, h.url("/echo/node")],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["target"] == "/echo/node"


@pytest.mark.hooks(hooks=[InspectHook(["origin.test"]), Careless()])
def test_what_a_rule_writes_is_checked_like_a_client(harness: Harness) -> None:
    h = harness
    body = "x" * 1000
    ok = curl(h, "--data-binary", body, h.url("/count"))
    assert ok.stdout == "1000"  # the body's own framing won over the rule's Content-Length
    for path in ("/inject", "/target"):
        bad = curl(h, "-D", "-", "--data-binary", body, h.url(path))
        assert status(bad) == 502 and '"rule":"rewrite"' in bad.stdout.replace(" ", "")
    assert [r["target"] for r in h.origin.requests] == ["/count"]  # nothing smuggled out


def test_an_idle_upstream_serves_the_runs_next_connection_then_expires(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.net import proxy

    h = harness
    for _ in range(3):  # three client connections, one after the other
        assert json.loads(curl(h, h.url("/echo/again")).stdout)["target"] == "/echo/again"
    assert h.origin.alpn == ["http/1.1"]  # one TLS connection to the origin for all three
    monkeypatch.setattr(proxy, "PARK_IDLE", 0.05)
    time.sleep(0.1)
    assert curl(h, h.url("/echo/later")).returncode == 0
    assert len(h.origin.alpn) == 2  # kept no longer than PARK_IDLE: a new one


def test_tls_files_are_read_once_plain_files_only(tmp_path: Path) -> None:
    """What the proxy trusts upstream is read before the sandbox starts (a file
    the sandbox rewrote later was trusted); a FIFO there is refused, never
    waited on (it hung every run); SSL_CERT_FILE is read with them."""
    from corral.errors import PolicyError
    from corral.net.trust import upstream_trust
    from corral.policy import Policy, check_tls

    ca = calib.create("upstream test CA", 1, "ephemeral")
    good = tmp_path / "good.pem"
    good.write_bytes(ca.cert_pem)
    fifo = tmp_path / "fifo.pem"
    os.mkfifo(fifo)
    read = upstream_trust([str(good)], {"SSL_CERT_FILE": str(good)})
    assert read.extra == [ca.cert_pem.decode()] and read.store == ca.cert_pem.decode()
    good.write_bytes(b"rewritten later\n")  # (what a worker would have read then)
    assert read.extra == [ca.cert_pem.decode()]
    assert upstream_trust([], {}).store is None  # the host's own store
    with pytest.raises(PolicyError, match="no PEM CA certificate"):
        upstream_trust([str(fifo)], {})
    policy = Policy(str(tmp_path))
    policy.tls.upstream_ca = [str(fifo)]
    with pytest.raises(PolicyError, match="is not a plain file"):
        check_tls(policy)
    policy.tls.upstream_ca = [str(tmp_path / "good.pem")]  # the twin: a plain file passes
    check_tls(policy)
    # an SSL_CERT_FILE where the sandbox can write is not trusted for origins: a
    # run rewrote a company bundle kept in the workspace (found by attacking corral)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "corp.pem").write_bytes(ca.cert_pem)
    with pytest.raises(PolicyError, match=r"SSL_CERT_FILE: cannot use .* lies where the sandbox"):
        upstream_trust([], {"SSL_CERT_FILE": str(ws / "corp.pem")}, (str(ws),))
    outside = upstream_trust([], {"SSL_CERT_FILE": str(ws / "corp.pem")}, (str(tmp_path / "x"),))
    assert outside.store == ca.cert_pem.decode()


def test_ssl_cert_dir_where_the_sandbox_can_write_is_refused(tmp_path: Path) -> None:
    """OpenSSL reads SSL_CERT_DIR when it verifies, not when the proxy starts: a
    CA the sandbox put there during the run was trusted (found by attacking
    corral).  The directory, or an entry leading into a writable place, is
    refused; one outside them is used as it is (the twin)."""
    from corral.errors import PolicyError
    from corral.net.trust import upstream_trust

    ws, certs = tmp_path / "ws", tmp_path / "certs"
    ws.mkdir()
    certs.mkdir()
    (certs / "corp.pem").write_text("a company CA\n")
    bounds = (str(ws),)
    assert upstream_trust([], {"SSL_CERT_DIR": str(certs)}, bounds).store is None
    for refused in (ws / "certs", ws / "not-made-yet"):
        if refused.name == "certs":
            refused.mkdir()
        with pytest.raises(PolicyError, match=r"SSL_CERT_DIR: cannot use .* lies where"):
            upstream_trust([], {"SSL_CERT_DIR": f"{certs}:{refused}"}, bounds)
    (ws / "theirs.pem").write_text("the sandbox's CA\n")
    (certs / "1234abcd.0").symlink_to(ws / "theirs.pem")
    with pytest.raises(PolicyError, match=r"theirs.pem lies where the sandbox can write"):
        upstream_trust([], {"SSL_CERT_DIR": str(certs)}, bounds)
    # with SSL_CERT_FILE, OpenSSL never reads the directory: nothing to refuse
    (certs / "bundle.pem").write_bytes(calib.create("upstream test CA", 1, "ephemeral").cert_pem)
    env = {"SSL_CERT_FILE": str(certs / "bundle.pem"), "SSL_CERT_DIR": str(certs)}
    assert upstream_trust([], env, bounds).store
