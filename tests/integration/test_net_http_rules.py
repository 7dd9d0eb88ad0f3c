"""Method and path rules, the git preset and credentials that never enter the
sandbox, on every tier with a network, as root and as a user.

Real clients inside (curl, Python requests and httpx, git), real origins on
127.0.0.1 outside: an echo origin that reflects the request headers it got
into its response headers and keeps what it saw, and ``git http-backend``.
Evidence is taken outside: what reached each origin, the audit log, the run
log, and a dump of everything the sandbox could see.
"""

from __future__ import annotations

import base64
import gzip
import http.server
import json
import os
import ssl
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Corral

CURL = "curl -sS --noproxy '' --max-time 10 -x \"$HTTP_PROXY\""
REAL = "sk-real-7c1e0d2f9a8b4c3d"  # what the sandbox must never see
REAL_FILE = "file-real-31f4a7c2b9e8d605"
FILLER = b"0123456789abcdef" * (150 * 1024 // 16)  # a body longer than corral reads whole


class Echo:
    """Reflects each request's headers as ``x-echo-<name>`` response headers and,
    as JSON, in its body (as httpbin's /headers does), and keeps (method,
    target, headers) of everything that reached it; HTTPS with ``tls`` (a server
    context).  A target holding ``/gzip`` gets that body gzip-compressed, asked
    or not; ``/big`` gets it between 300 kB of filler, chunked in odd sizes (the
    echo straddles chunks); ``/br`` claims a brotli body."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        echo = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _body(self) -> bytes | None:
                """The whole request body; None when it never ended (cut off)."""
                if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                    length = int(self.headers.get("Content-Length") or 0)
                    data = self.rfile.read(length)
                    return data if len(data) == length else None
                data = b""
                while True:
                    line = self.rfile.readline()
                    if not line.endswith(b"\r\n"):
                        return None
                    size = int(line.split(b";")[0], 16)
                    chunk = self.rfile.read(size + 2)
                    if len(chunk) != size + 2:
                        return None
                    if size == 0:
                        return data
                    data += chunk[:-2]

            def _reply(self) -> None:
                body_in = self._body()
                if body_in is None:  # an incomplete request is no request
                    self.close_connection = True
                    return
                headers = {k.lower(): v for k, v in self.headers.items()}
                echo.seen.append((self.command, self.path, headers))
                body = b"echo %d\n%s\n" % (len(body_in), json.dumps(headers).encode())
                self.send_response(200)
                for name, value in self.headers.items():
                    self.send_header("X-Echo-" + name, value)
                if "/gzip" in self.path:
                    body = gzip.compress(body)
                    self.send_header("Content-Encoding", "gzip")
                elif "/br" in self.path:
                    self.send_header("Content-Encoding", "br")
                elif "/big" in self.path:
                    self._chunked(FILLER + body + FILLER)
                    return
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _chunked(self, body: bytes) -> None:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for at in range(0, len(body), 997):
                    piece = body[at : at + 997]
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.write(b"0\r\n\r\n")

            do_GET = do_POST = do_PUT = do_DELETE = _reply

        self.server = serve(Handler, tls)
        self.port = self.server.server_address[1]

    def methods(self) -> list[tuple[str, str]]:
        return [(m, t) for m, t, _ in self.seen]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(
    handler: type[http.server.BaseHTTPRequestHandler], tls: ssl.SSLContext | None
) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def echoes() -> Iterator[tuple[Echo, Echo]]:
    one, two = Echo(), Echo()
    try:
        yield one, two
    finally:
        one.close()
        two.close()


def write_policy(ws: Path, c: Corral, text: str) -> None:
    (ws / "corral.toml").write_text('[network]\nmode = "proxy"\n' + text)
    c.chown(ws)


def net_log(c: Corral) -> list[dict[str, object]]:
    path = c.state / "corral" / "net.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


# -- methods and paths ----------------------------------------------------------------------------

CLIENTS = """
import os, sys
proxy = os.environ["HTTP_PROXY"]
base = sys.argv[1]
import requests
s = requests.Session(); s.trust_env = False; s.proxies = {"http": proxy}
get, delete = s.get(base + "/api/items"), s.delete(base + "/api/items")
print("requests", get.status_code, delete.status_code)
import httpx
with httpx.Client(proxies=proxy, trust_env=False) as h:
    get, delete = h.get(base + "/api/items"), h.delete(base + "/api/items")
    print("httpx", get.status_code, delete.status_code)
"""


def test_get_allowed_delete_denied_on_the_same_host(
    tsandbox: tuple[Corral, Path], echoes: tuple[Echo, Echo]
) -> None:
    c, ws = tsandbox
    api, _ = echoes
    write_policy(
        ws,
        c,
        f"""allow = ["127.0.0.1:{api.port}"]

[[network.rules]]
host = "127.0.0.1:{api.port}"
methods = ["GET"]
paths = ["/api/**"]
action = "allow"

[[network.rules]]
host = "127.0.0.1:{api.port}"
paths = ["/api/admin/**"]
action = "deny"
""",
    )
    (ws / "clients.py").write_text(CLIENTS)
    url = f"http://127.0.0.1:{api.port}"
    r = c.sh(
        ws,
        f"""
        {CURL} -o /dev/null -w 'get=%{{http_code}}\\n' {url}/api/items
        {CURL} -X DELETE -w '\\ndelete=%{{http_code}}\\n' {url}/api/items
        {CURL} -o /dev/null -w 'other=%{{http_code}}\\n' {url}/other
        {CURL} -o /dev/null -w 'admin=%{{http_code}}\\n' {url}/api//admin/keys
        {CURL} -o /dev/null -w 'dots=%{{http_code}}\\n' {url}/api/x/..%2Fadmin/keys
        {CURL} -o /dev/null -w 'semicolon=%{{http_code}}\\n' '{url}/api/admin;x/keys'
        python3 clients.py {url}
        """,
    )
    out = r.stdout.decode()
    assert "get=200" in out and "delete=403" in out, (out, r.stderr)
    assert "other=403" in out and "admin=403" in out and "semicolon=403" in out
    assert "dots=403" in out
    assert "requests 200 403" in out and "httpx 200 403" in out
    body = json.loads(next(x for x in out.splitlines() if x.startswith("{")))
    assert body["rule"] == "network.rules" and "DELETE /api/items" in body["reason"]
    # evidence outside: only the GETs reached the origin
    assert api.methods() == [("GET", "/api/items")] * 3
    decided = {(e["method"], e["rule"]) for e in net_log(c) if e["decision"] == "deny"}
    assert ("DELETE", "network.rules") in decided and ("GET", "network.rules") in decided
    assert ("GET", "network.rules[2]") in decided  # //admin is /api/admin/keys
    assert ("GET", "bad-path") in decided  # ; and the ..%2F walk


def test_body_limit_and_ask(tsandbox: tuple[Corral, Path], echoes: tuple[Echo, Echo]) -> None:
    c, ws = tsandbox
    api, _ = echoes
    write_policy(
        ws,
        c,
        f"""allow = ["127.0.0.1:{api.port}"]
ask_timeout = "1s"

[[network.rules]]
host = "127.0.0.1:{api.port}"
methods = ["POST"]
paths = ["/upload"]
max_body = "1K"
action = "allow"

[[network.rules]]
host = "127.0.0.1:{api.port}"
methods = ["PUT"]
action = "ask"
""",
    )
    (ws / "small").write_bytes(b"s" * 1000)
    (ws / "big").write_bytes(b"b" * 5000)
    url = f"http://127.0.0.1:{api.port}"
    r = c.sh(
        ws,
        f"""
        {CURL} -o /dev/null -w 'small=%{{http_code}}\\n' --data-binary @small {url}/upload
        {CURL} -o /dev/null -w 'big=%{{http_code}}\\n' --data-binary @big {url}/upload
        {CURL} -o /dev/null -w 'chunked=%{{http_code}}\\n' -H 'Transfer-Encoding: chunked' \\
            --data-binary @big {url}/upload
        {CURL} -w '\\nput=%{{http_code}}\\n' -X PUT {url}/thing
        """,
    )
    out = r.stdout.decode()
    assert "small=200" in out and "big=413" in out, (out, r.stderr)
    assert "chunked=200" not in out  # cut off: 413, or the connection closed under curl
    # an ask: held for a person's answer, and with nobody answering, denied
    assert "put=403" in out and '"rule":"network.rules[2]"' in out
    assert "ask: no answer within 1s" in out
    # the origin got the small body only: never the big one, whole or cut off
    assert api.methods() == [("POST", "/upload")]
    assert api.seen[0][2]["content-length"] == "1000"
    lines = net_log(c)
    assert {(e["status"], e["rule"]) for e in lines if e["decision"] == "deny"} >= {
        (413, "network.rules[1]"),
        (403, "network.rules[2]"),
    }


# -- git -----------------------------------------------------------------------------------------


class GitOrigin:
    """``git http-backend`` as CGI behind a small threaded server on 127.0.0.1."""

    def __init__(self, root: Path, tls: ssl.SSLContext | None = None) -> None:
        self.root = root
        bare = root / "repo.git"
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
        seed = root / "seed"
        git = ["git", "-C", str(seed), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run(["git", "init", "-q", "-b", "main", str(seed)], check=True)
        (seed / "README").write_text("hello from the origin\n")
        subprocess.run([*git, "add", "README"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", "first"], check=True)
        subprocess.run([*git, "push", "-q", str(bare), "main"], check=True)
        self.bare = bare
        origin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    data = b""
                    while size := int(self.rfile.readline().split(b";")[0], 16):
                        data += self.rfile.read(size)
                        self.rfile.readline()
                    self.rfile.readline()
                    return data
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _cgi(self) -> None:
                path, _, query = self.path.partition("?")
                env = {
                    "PATH": "/usr/bin:/bin",
                    "GIT_PROJECT_ROOT": str(origin.root),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "REMOTE_USER": "tester",  # turns receive-pack (push) on
                    "REMOTE_ADDR": "127.0.0.1",
                    "REQUEST_METHOD": self.command,
                    "PATH_INFO": path,
                    "QUERY_STRING": query,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
                    "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                    "GIT_CONFIG_NOSYSTEM": "1",
                    "HOME": str(origin.root),
                }
                out = subprocess.run(
                    ["git", "http-backend"], input=self._body(), env=env, capture_output=True
                ).stdout
                head, _, body = out.partition(b"\r\n\r\n")
                status = 200
                headers = []
                for line in head.split(b"\r\n"):
                    name, _, value = line.decode("latin-1").partition(":")
                    if name.lower() == "status":
                        status = int(value.split()[0])
                    elif name:
                        headers.append((name, value.strip()))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _cgi

        self.server = serve(Handler, tls)
        self.port = self.server.server_address[1]

    def head(self) -> str:
        out = subprocess.run(
            ["git", "-C", str(self.bare), "rev-parse", "main"], capture_output=True, text=True
        )
        return out.stdout.strip()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def git_origin(tmp_path: Path) -> Iterator[GitOrigin]:
    origin = GitOrigin(tmp_path)
    try:
        yield origin
    finally:
        origin.close()


# git's libcurl honours NO_PROXY, which keeps 127.0.0.1 local inside the sandbox
GIT = "env -u NO_PROXY -u no_proxy git -c user.name=t -c user.email=t@t"


@pytest.mark.parametrize("mode", ["read", "write"])
def test_git_preset_clone_works_push_needs_write(
    tsandbox: tuple[Corral, Path], git_origin: GitOrigin, mode: str
) -> None:
    c, ws = tsandbox
    port = git_origin.port
    write_policy(
        ws,
        c,
        f'allow = ["127.0.0.1:{port}"]\n\n[[network.rules]]\nhost = "127.0.0.1:{port}"\n'
        f'git = "{mode}"\n',
    )
    url = f"http://127.0.0.1:{port}/repo.git"
    # a clone made outside, to push from
    subprocess.run(["git", "clone", "-q", url, str(ws / "ready")], check=True)
    c.chown(ws)
    clone = f"{GIT} clone -q {url} clone && cat clone/README"
    before = git_origin.head()
    r = c.sh(
        ws,
        f"""
        {clone}
        cd ready && {GIT} commit -q --allow-empty -m second
        {GIT} push -q origin main; echo push=$?
        {CURL} -o /dev/null -w 'browse=%{{http_code}}\\n' {url}/HEAD
        """,
    )
    out, err = r.stdout.decode(), r.stderr.decode()
    assert "hello from the origin" in out, (out, err)  # clone (or fetch) works either way
    assert "browse=403" in out  # the dumb protocol (and anything else) is not git's preset
    if mode == "read":
        assert "push=0" not in out
        # what git shows its user: the refusal's text, as a "remote:" line
        assert "remote: corral: denied by the sandbox's policy" in err, err
        assert git_origin.head() == before
    else:
        assert "push=0" in out, err
        assert git_origin.head() != before


# -- credentials ---------------------------------------------------------------------------------

# Inside: use the placeholders with real clients, then write out everything the
# sandbox can see: its environment, /proc (its own and every other process it
# can read), every readable file under the workspace and home, and what the
# clients got back.  The test searches that dump (and the logs) from outside.
SEE_ALL = r"""
import base64, os, sys
port = sys.argv[1]
base = f"http://127.0.0.1:{port}"
proxy = os.environ["HTTP_PROXY"]
key, tok = os.environ["API_KEY"], os.environ["FILE_TOKEN"]
dump = open("seen.dump", "wb")
def see(data):
    dump.write(data if isinstance(data, bytes) else str(data).encode("utf-8", "replace"))
    dump.write(b"\n")
import requests, httpx
s = requests.Session(); s.trust_env = False; s.proxies = {"http": proxy}
r = s.get(f"{base}/requests?key={key}", headers={"X-Api-Key": key}, auth=("user", key))
see(r.status_code); see(r.headers); see(r.text)
with httpx.Client(proxies=proxy, trust_env=False) as h:
    r = h.get(f"{base}/httpx/{key}", headers={"Authorization": f"Bearer {key}"})
    see(r.status_code); see(r.headers); see(r.text)
see(dict(os.environ)); see(sys.argv)
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for name in ("environ", "cmdline"):
            try:
                see(open(f"/proc/{pid}/{name}", "rb").read())
            except OSError:
                pass
denied = []
for top in (os.getcwd(), os.environ["HOME"]):
    for root, dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(root, name)
            if name == "seen.dump":
                continue
            try:
                see(open(path, "rb").read())
            except OSError:
                denied.append(os.path.relpath(path, top))
print("unreadable:", sorted(denied))
print("placeholders:", key[:22], tok[:25])
"""


def test_credentials_never_enter_the_sandbox(
    tsandbox: tuple[Corral, Path], echoes: tuple[Echo, Echo]
) -> None:
    c, ws = tsandbox
    api, _ = echoes
    tokens = ws / ".tokens"
    tokens.mkdir()
    (tokens / "file-token").write_text(REAL_FILE + "\n")
    write_policy(
        ws,
        c,
        f"""allow = ["127.0.0.1:{api.port}"]

[secrets.API_KEY]
from = "env:CORRAL_TEST_REAL_KEY"
hosts = ["127.0.0.1:{api.port}"]

[secrets.FILE_TOKEN]
from = "file:.tokens/file-token"
hosts = ["127.0.0.1:{api.port}"]
header = "X-File-Token"
format = "Token {{value}}"
""",
    )
    (ws / "see_all.py").write_text(SEE_ALL)
    c.chown(ws)
    r = c.run(
        ["run", "-q", "--", "python3", "see_all.py", str(api.port)],
        cwd=ws,
        env={"CORRAL_TEST_REAL_KEY": REAL},
    )
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == 0, (out, err)
    assert "placeholders: corral-secret-API_KEY- corral-secret-FILE_TOKEN-" in out
    assert ".tokens/file-token" in out  # the secret's file is masked inside
    seen = (ws / "seen.dump").read_bytes()
    assert b"corral-secret-API_KEY-" in seen  # the dump did see the placeholders ...
    for real in (REAL, REAL_FILE):  # ... and never a real value
        encoded = real.encode()
        assert encoded not in seen and encoded not in r.stdout and encoded not in r.stderr
        assert base64.b64encode(b"user:" + encoded) not in seen
    # the origin got the real values, in every place they were used (evidence outside)
    (_, t1, h1), (_, t2, h2) = api.seen
    assert t1 == f"/requests?key={REAL}" and h1["x-api-key"] == REAL
    assert h1["authorization"] == "Basic " + base64.b64encode(f"user:{REAL}".encode()).decode()
    assert t2 == f"/httpx/{REAL}" and h2["authorization"] == f"Bearer {REAL}"
    assert h1["x-file-token"] == h2["x-file-token"] == f"Token {REAL_FILE}"
    # the echoed headers came back with placeholders (checked above: no value in the dump)
    assert b"x-echo-x-api-key" in seen.lower()
    # the logs name the secrets, never a value
    lines = [e for e in net_log(c) if e.get("secrets")]
    assert {tuple(e["secrets"]) for e in lines} == {("API_KEY", "FILE_TOKEN")}  # type: ignore[arg-type]
    for log in (c.state / "corral").glob("*.jsonl"):
        text = log.read_bytes()
        assert REAL.encode() not in text and REAL_FILE.encode() not in text, log
    listed = c.run(["log", "--net"], cwd=ws)
    assert REAL.encode() not in listed.stdout and REAL_FILE.encode() not in listed.stdout


def test_placeholder_to_another_host_is_denied(
    tsandbox: tuple[Corral, Path], echoes: tuple[Echo, Echo]
) -> None:
    c, ws = tsandbox
    api, other = echoes
    write_policy(
        ws,
        c,
        f"""allow = ["127.0.0.1:{api.port}", "127.0.0.1:{other.port}"]

[secrets.API_KEY]
from = "env:CORRAL_TEST_REAL_KEY"
hosts = ["127.0.0.1:{api.port}"]
""",
    )
    r = c.run(
        [
            "run",
            "-q",
            "--",
            "sh",
            "-c",
            f"""
            {CURL} -w '\\nother-header=%{{http_code}}\\n' -H "X-Key: $API_KEY" \\
                http://127.0.0.1:{other.port}/x
            {CURL} -o /dev/null -w 'other-query=%{{http_code}}\\n' \\
                "http://127.0.0.1:{other.port}/x?k=$API_KEY"
            {CURL} -o /dev/null -w 'other-basic=%{{http_code}}\\n' -u "me:$API_KEY" \\
                http://127.0.0.1:{other.port}/x
            {CURL} -o /dev/null -w 'right=%{{http_code}}\\n' -u "me:$API_KEY" \\
                http://127.0.0.1:{api.port}/x
            {CURL} -o /dev/null -w 'plain=%{{http_code}}\\n' http://127.0.0.1:{other.port}/x
            """,
        ],
        cwd=ws,
        env={"CORRAL_TEST_REAL_KEY": REAL},
    )
    out = r.stdout.decode()
    for case in ("other-header", "other-query", "other-basic"):
        assert f"{case}=403" in out, (out, r.stderr)
    assert "right=200" in out and "plain=200" in out  # twins: right host, no placeholder
    assert "secret-wrong-host" in out and "API_KEY" in out
    assert other.methods() == [("GET", "/x")]  # only the request without a placeholder
    wrong = [e for e in net_log(c) if e["rule"] == "secret-wrong-host"]
    assert len(wrong) == 3 and all(e["secrets"] == ["API_KEY"] for e in wrong)
    assert REAL.encode() not in (c.state / "corral" / "net.jsonl").read_bytes()


# -- bad input -----------------------------------------------------------------------------------


RULE = '[[network.rules]]\nhost = "a.test"\n'
SECRET = '[secrets.K]\nhosts = ["a.test"]\n'


@pytest.mark.parametrize(
    ("policy", "code", "says"),
    [
        (RULE + 'verb = "GET"\n', 2, "network.rules[1].verb: unknown key"),
        (RULE + 'action = "allow"\npaths = ["/a[b]"]\n', 2, "rules[1].paths: bad path glob"),
        (SECRET + 'from = "env:K"\nscope = 1\n', 2, "secrets.K.scope: unknown key"),
        (SECRET + 'from = "env:CORRAL_TEST_UNSET"\n', 122, "CORRAL_TEST_UNSET is not set"),
        (SECRET + 'from = "file:no-such-file"\n', 122, "secret K: cannot read"),
    ],
)
def test_bad_input_is_one_line_and_nothing_starts(
    sandbox: tuple[Corral, Path], policy: str, code: int, says: str
) -> None:
    c, ws = sandbox
    write_policy(ws, c, 'allow = ["a.test"]\n\n' + policy)
    r = c.run(["run", "-q", "--", "touch", "started"], cwd=ws)
    err = r.stderr.decode()
    assert r.returncode == code, err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err, err
    assert not (ws / "started").exists()
    assert not list((c.state / "corral").glob("runs.jsonl"))  # no run was recorded


# -- the same over HTTPS, through corral's TLS interception ----------------------------------------


class Https:
    """An origin CA (the policy's ``[tls] upstream_ca``) and server contexts for
    names pinned to 127.0.0.1; files the unprivileged user can read."""

    NAMES = ("api.test", "other.test", "git.test", "127.0.0.1")

    def __init__(self, c: Corral) -> None:
        from tests import tls_origin

        make_ca = tls_origin.OriginCA
        directory = c.base / "origin-ca"
        self.ca = make_ca(directory)
        cert, key = self.ca.server_files(self.NAMES)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(str(cert), str(key))
        os.chmod(directory, 0o755)
        os.chmod(self.ca.cert_path, 0o644)

    def policy(self, ports: list[int]) -> str:
        allow = ["api.test", "other.test", "git.test", *(f"127.0.0.1:{p}" for p in ports)]
        pins = ", ".join(f'"{n}" = "127.0.0.1"' for n in self.NAMES[:3])
        return (
            f"allow = {json.dumps(allow)}\nhosts = {{ {pins} }}\n\n"
            f'[tls]\nupstream_ca = "{self.ca.cert_path}"\n'
        )


HTTPS_CLIENTS = r"""
import base64, os, sys
base, other = sys.argv[1], sys.argv[2]
key = os.environ["API_KEY"]
out = open("seen.dump", "ab")
def see(*items):
    for item in items:
        out.write(str(item).encode("utf-8", "replace") + b"\n")
import requests
r = requests.get(f"{base}/api/requests", auth=("user", key))
see(r.status_code, r.headers, r.text)
print("requests", r.status_code, requests.delete(f"{base}/api/requests").status_code)
r = requests.get(f"{other}/x", headers={"X-Key": key})
print("requests-other", r.status_code, r.json()["rule"])
import httpx
r = httpx.get(f"{base}/api/httpx?key={key}", headers={"Authorization": f"Bearer {key}"})
see(r.status_code, r.headers, r.text)
print("httpx", r.status_code)
see(dict(os.environ), open("/proc/self/environ", "rb").read())
"""


def assert_bodies_hid_the_value(seen: bytes, big: bytes, said: bytes) -> None:
    """The bodies echoed the headers too (gzip-compressed unasked, and chunked
    across pieces of a long body): the placeholder came back, the value never."""
    assert big.startswith(FILLER) and big.endswith(FILLER)  # the rest passed as it was
    for body in (seen, big):
        assert b'"x-key": "corral-secret-API_KEY-' in body
    assert REAL.encode() not in seen + big + said


def assert_echoes_audited(lines: list[dict[str, object]]) -> None:
    """The audit names the secret whose echo a body had, and the body it refused."""
    hidden = {e["path"] for e in lines if e.get("echoes_hidden") == ["API_KEY"]}
    assert {"/api/gzip", "/api/big"} <= hidden, lines
    assert any(e["rule"] == "secret-echo" and e["status"] == 403 for e in lines)


def test_https_rules_and_credentials(
    tsandbox: tuple[Corral, Path],
) -> None:
    c, ws = tsandbox
    https = Https(c)
    api, other = Echo(https.context), Echo(https.context)
    try:
        write_policy(
            ws,
            c,
            https.policy([api.port, other.port])
            + f"""inspect = ["other.test"]

[[network.rules]]
host = "api.test:{api.port}"
methods = ["GET"]
paths = ["/api/**"]
action = "allow"

[secrets.API_KEY]
from = "env:CORRAL_TEST_REAL_KEY"
hosts = ["api.test"]
""",
        )
        (ws / "clients.py").write_text(HTTPS_CLIENTS)
        c.chown(ws)
        base, elsewhere = f"https://api.test:{api.port}", f"https://other.test:{other.port}"
        curl = "curl -sS --max-time 20"
        r = c.run(
            [
                "run",
                "-q",
                "--",
                "sh",
                "-c",
                f"""
                {curl} -D - -H "X-Key: $API_KEY" {base}/api/curl >> seen.dump
                {curl} -o /dev/null -w 'delete=%{{http_code}}\\n' -X DELETE {base}/api/curl
                {curl} -o /dev/null -w 'path=%{{http_code}}\\n' {base}/admin
                {curl} -o /dev/null -w 'other=%{{http_code}}\\n' "{elsewhere}/x?k=$API_KEY"
                {curl} -o /dev/null -w 'other-plain=%{{http_code}}\\n' {elsewhere}/x
                {curl} --compressed -H "X-Key: $API_KEY" {base}/api/gzip >> seen.dump
                {curl} -o big.body -w 'big=%{{http_code}}\\n' -H "X-Key: $API_KEY" {base}/api/big
                {curl} -o /dev/null -w 'br=%{{http_code}}\\n' {base}/api/br
                python3 clients.py {base} {elsewhere}
                """,
            ],
            cwd=ws,
            env={"CORRAL_TEST_REAL_KEY": REAL},
        )
        out, err = r.stdout.decode(), r.stderr.decode()
        for line in ("delete=403", "path=403", "other=403", "other-plain=200", "big=200"):
            assert line in out, (line, out, err)
        assert "br=403" in out  # a body corral cannot read for an echo is not passed on
        assert "requests 200 403" in out and "httpx 200" in out
        assert "requests-other 403 secret-wrong-host" in out
        seen = (ws / "seen.dump").read_bytes()
        assert b"corral-secret-API_KEY-" in seen and b"x-echo-x-key" in seen.lower()
        assert_bodies_hid_the_value(seen, (ws / "big.body").read_bytes(), r.stdout + r.stderr)
        assert base64.b64encode(f"user:{REAL}".encode()) not in seen
        # what the origins got, from outside: real values at api.test, nothing at other.test
        targets = {t: h for _, t, h in api.seen}
        assert targets["/api/curl"]["x-key"] == REAL
        assert targets["/api/requests"]["authorization"] == (
            "Basic " + base64.b64encode(f"user:{REAL}".encode()).decode()
        )
        assert targets[f"/api/httpx?key={REAL}"]["authorization"] == f"Bearer {REAL}"
        # a response it can check, whole: asked for plain (curl asked for gzip)
        assert targets["/api/gzip"]["x-key"] == REAL
        assert targets["/api/gzip"]["accept-encoding"] == "identity"
        assert sorted(m for m, _, _ in api.seen) == ["GET"] * 6
        assert other.methods() == [("GET", "/x")]
        lines = [e for e in net_log(c) if e.get("scheme") == "https"]
        assert any(e["rule"] == "secret-wrong-host" and e["secrets"] == ["API_KEY"] for e in lines)
        assert_echoes_audited(lines)
        assert REAL.encode() not in (c.state / "corral" / "net.jsonl").read_bytes()
    finally:
        api.close()
        other.close()


def test_git_over_https_clone_works_push_is_refused(
    tsandbox: tuple[Corral, Path], tmp_path: Path
) -> None:
    c, ws = tsandbox
    https = Https(c)
    origin = GitOrigin(tmp_path, https.context)
    try:
        port = origin.port
        write_policy(
            ws,
            c,
            https.policy([port]) + '\n[[network.rules]]\nhost = "git.test"\ngit = "read"\n',
        )
        url = f"https://git.test:{port}/repo.git"
        # a clone made outside, to push from
        subprocess.run(["git", "clone", "-q", str(origin.bare), str(ws / "ready")], check=True)
        subprocess.run(["git", "-C", str(ws / "ready"), "remote", "set-url", "origin", url])
        c.chown(ws)
        clone = f"git clone -q {url} clone && cat clone/README"
        before = origin.head()
        r = c.sh(
            ws,
            f"""
            {clone}
            cd ready && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m two
            git push -q origin main; echo push=$?
            """,
        )
        out, err = r.stdout.decode(), r.stderr.decode()
        assert "hello from the origin" in out, (out, err)
        assert "push=0" not in out
        assert "remote: corral: denied by the sandbox's policy" in err, err
        # named as a push, not as the GET of /info/refs that clone is allowed
        assert 'git push to git.test: no rule allows it (git = "read" allows' in err, err
        assert origin.head() == before
        assert any(e.get("scheme") == "https" and e["decision"] == "allow" for e in net_log(c))
    finally:
        origin.close()


@pytest.mark.parametrize("named", ["link", "dirlink/token"])
def test_a_secret_file_reached_through_a_link_is_masked_and_the_run_starts(
    tsandbox: tuple[Corral, Path], named: str
) -> None:
    """``from = "file:link"`` (a link to the token, or a path through a linked
    directory): every run failed to start, bwrap mounting the mask twice or the
    linked directory read as changed during setup (found by attacking the proxy).
    Now it runs, the token unreadable by every name; a file beside it reads (the twin)."""
    c, ws = tsandbox
    (ws / "real").mkdir()
    (ws / "real" / "token").write_text("tok-" + uuid.uuid4().hex + "\n")
    (ws / "real" / "notes").write_text("readable\n")
    (ws / "link").symlink_to("real/token")
    (ws / "dirlink").symlink_to("real")
    write_policy(ws, c, f'[secrets.TOK]\nfrom = "file:{named}"\nhosts = ["127.0.0.1:9"]\n')
    c.chown(ws)
    script = "cat real/notes; for f in real/token link dirlink/token; do cat $f || echo no-$f; done"
    r = c.run(["run", "-q", "--", "sh", "-c", script], cwd=ws)
    assert r.returncode == 0, r
    out = r.stdout.decode()
    assert out.startswith("readable\n") and "tok-" not in out, out
    assert out.count("no-") == 3, out
