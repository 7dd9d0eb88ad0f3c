"""TLS inspection through real sandboxes: every tier with a network, as root and
as an unprivileged user, with real clients inside (curl, Python requests and
httpx, pip against an index served over TLS, Node) and real HTTPS origins on
127.0.0.1 whose CA is the policy's ``[tls] upstream_ca``.

The sandbox is told nothing: it trusts corral's CA through the bundle and the
variables corral sets.  Evidence is taken outside: what each origin received,
the audit log, the files corral leaves.  Each deny has its allow twin.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Corral, sees_host_root
from test_network import net_log

from tests.tls_origin import NODE_CONNECT_CLIENT, Origin, OriginCA

CURL = "curl -sS --max-time 20"
# What the Python clients need, copied from the host's packages into the workspace:
# the container image has a Python but none of these.
PY_PACKAGES = (
    "requests",
    "urllib3",
    "idna",
    "chardet",
    "charset_normalizer",
    "certifi",
    "httpx",
    "httpcore",
    "h11",
    "anyio",
    "sniffio",
    "rfc3986",
    "pip",
)
DIST = Path("/usr/lib/python3/dist-packages")
# A test hook loaded into corral's own process (and so into its proxy workers)
# through sitecustomize: it denies one path prefix on every request it sees.
DENY_HOOK = """
import os
_prefix = os.environ.get("CORRAL_TEST_DENY_PATH")
if _prefix:
    import corral.net.hooks as _hooks
    from corral.net.rules import Verdict as _Verdict

    class _DenyPath(_hooks.Hook):
        name = "test-deny-path"

        def on_request(self, dest, request):
            if request.target.startswith(_prefix):
                return _Verdict(False, "test-deny-path", _prefix + " is off limits")
            return None

    _plain = _hooks.hooks_for
    _hooks.hooks_for = lambda policy: [*_plain(policy), _DenyPath()]
"""


class Setup:
    """Origins and the policy file of one test, in a directory the user can read."""

    def __init__(self, c: Corral, ws: Path) -> None:
        self.c = c
        self.ws = ws
        self.dir = c.base / "tls"
        self.ca = OriginCA(self.dir)
        os.chmod(self.dir, 0o755)
        index = self.dir / "index"
        index.mkdir()
        tiny_wheel(index)
        self.origin = Origin(self.ca.server_files(), index=index)
        self.other = Origin(self.ca.server_files(tag="other"))
        stranger = OriginCA(self.dir / "stranger", "a CA nobody trusts")
        self.untrusted = Origin(stranger.server_files(tag="untrusted"))
        for path in self.dir.rglob("*"):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        hooks = c.base / "hooks"
        hooks.mkdir()
        (hooks / "sitecustomize.py").write_text(DENY_HOOK)
        os.chmod(hooks, 0o755)
        os.chmod(hooks / "sitecustomize.py", 0o644)
        self.hooks = hooks

    def python_clients(self) -> str:
        """The host's Python clients copied into the workspace (24 MB: only for the
        test that runs them); the command prefix that finds them."""
        pylib = self.ws / "pylib"
        for name in PY_PACKAGES:
            if (DIST / name).is_dir():
                shutil.copytree(DIST / name, pylib / name, symlinks=True)
        self.c.chown(pylib)
        return "PYTHONPATH=$PWD/pylib python3"

    def policy(self, tls: str = "", inspect: tuple[str, ...] = ("origin.test", "bad.test")) -> None:
        ports = (self.origin.port, self.other.port, self.untrusted.port)
        allow = ["origin.test", "other.test", "bad.test", *(f"127.0.0.1:{p}" for p in ports)]
        path = self.ws / "corral.toml"
        path.write_text(
            "[network]\n"
            'mode = "proxy"\n'
            f"allow = {json.dumps(allow)}\n"
            'hosts = { "origin.test" = "127.0.0.1", "other.test" = "127.0.0.1", '
            '"bad.test" = "127.0.0.1" }\n'
            "[tls]\n"
            f"inspect = {json.dumps(list(inspect))}\n"
            f'upstream_ca = "{self.ca.cert_path}"\n' + tls
        )
        self.c.chown(path)

    def run(
        self, script: str, *flags: str, deny: str = "", env: dict[str, str] | None = None
    ) -> tuple[str, str, int]:
        extra = {"PYTHONPATH": f"{self.hooks}:{self.c.pythonpath}", **(env or {})}
        if deny:
            extra["CORRAL_TEST_DENY_PATH"] = deny
        r = self.c.run(["run", "-q", *flags, "--", "sh", "-c", script], cwd=self.ws, env=extra)
        return r.stdout.decode(), r.stderr.decode(), r.returncode

    def url(self, path: str, host: str = "origin.test", origin: Origin | None = None) -> str:
        return f"https://{host}:{(origin or self.origin).port}{path}"

    def close(self) -> None:
        for origin in (self.origin, self.other, self.untrusted):
            origin.close()


@pytest.fixture
def tls_setup(tsandbox: tuple[Corral, Path]) -> Iterator[Setup]:
    c, ws = tsandbox
    setup = Setup(c, ws)
    try:
        yield setup
    finally:
        setup.close()


def tiny_wheel(directory: Path) -> Path:
    """A one-module wheel, built by hand (a wheel is a zip with three metadata files)."""
    path = directory / "tinypkg-1.0-py3-none-any.whl"
    files = {
        "tinypkg/__init__.py": "VALUE = 'tiny'\n",
        "tinypkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: corral-tests\n"
            "Root-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(f"{name},,\n" for name in files) + "tinypkg-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
        wheel.writestr("tinypkg-1.0.dist-info/RECORD", record)
    return path


def python_get(module: str, call: str) -> str:
    """One line of Python: GET argv[1], print the module's first name and the status."""
    name = module.split(".")[0]
    status = 'getattr(r, "status_code", None) or r.status'
    return f'import {module},sys; r={call}(sys.argv[1]); print("{name}", {status})'


def https_lines(c: Corral) -> list[dict[str, object]]:
    return [e for e in net_log(c) if e.get("scheme") == "https"]


def test_clients_trust_corral_inside_and_the_deny_twin(tls_setup: Setup) -> None:
    s = tls_setup
    s.policy()
    py = s.python_clients()
    # httpx as it comes: it builds a transport for every proxy variable (ALL_PROXY too)
    script = f"""
        {CURL} {s.url("/echo/curl")}; echo
        {CURL} -o /dev/null -w 'secret=%{{http_code}}\\n' {s.url("/secret/curl")}
        {py} -c '{python_get("requests", "requests.get")}' {s.url("/echo/requests")}
        {py} -c '{python_get("httpx", "httpx.get")}' {s.url("/echo/httpx")}
        {py} -c '{python_get("urllib.request", "urllib.request.urlopen")}' {s.url("/echo/urllib")}
        PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 {py} -m pip download -q \
            --no-cache-dir --index-url {s.url("/simple")} -d ./pipout tinypkg \
            && ls pipout
        grep -c 'PRIVATE KEY' "$SSL_CERT_FILE" || true
    """
    out, err, code = s.run(script, deny="/secret")
    assert code == 0, err
    first = json.loads(out.splitlines()[0])
    assert first["target"] == "/echo/curl"
    # (on landlock too: its chmod of the copy is allowed in the workspace)
    expected = ["secret=403", "requests 200", "httpx 200", "urllib 200", "tinypkg-1.0-py3"]
    for line in expected:
        assert line in out, (line, out, err)
    assert out.strip().splitlines()[-1] == "0"  # the bundle inside holds no key
    seen = [r["target"] for r in s.origin.requests]
    assert "/secret/curl" not in seen  # denied inside HTTPS: it never left corral
    for target in ("/echo/curl", "/echo/requests", "/echo/httpx", "/echo/urllib"):
        assert target in seen
    assert any(t.startswith("/files/tinypkg") for t in seen)
    lines = https_lines(s.c)
    assert {"path": "/secret/curl", "decision": "deny", "rule": "test-deny-path"}.items() <= next(
        x for x in lines if x["path"] == "/secret/curl"
    ).items()
    assert any(x["path"] == "/echo/curl" and x["decision"] == "allow" for x in lines)


def test_a_ca_bundle_named_by_the_caller_joins_corrals(tls_setup: Setup) -> None:
    """A company's bundle named by the caller's variables (passed by default) used to
    win over corral's, so every inspected host failed verification (and under
    /tmp, private inside, it could not even be read).  Its certificates now join
    corral's bundle, which every such variable names: inspected hosts and hosts
    the company's CA signs both verify.  The twin: a CA named nowhere is not trusted."""
    s = tls_setup
    s.policy()
    corp = s.dir / "corp.pem"  # the user under test can read it
    corp.write_bytes(s.ca.cert_path.read_bytes())
    corp.chmod(0o644)
    names = ("SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE")
    script = f"""
        {CURL} {s.url("/echo/inspected")} && echo
        {CURL} {s.url("/echo/company", "other.test", s.other)} && echo
        {CURL} {s.url("/echo/stranger", "other.test", s.untrusted)} || echo stranger=refused
        python3 -c '{python_get("urllib.request", "urllib.request.urlopen")}' \
            {s.url("/echo/urllib")}
    """
    out, err, code = s.run(script, env=dict.fromkeys(names, str(corp)))
    assert code == 0, err
    answers = [json.loads(x)["target"] for x in out.splitlines() if x.startswith("{")]
    assert answers == ["/echo/inspected", "/echo/company"], (out, err)
    assert "stranger=refused" in out and "urllib 200" in out, (out, err)
    assert [r["target"] for r in s.other.requests] == ["/echo/company"]
    assert s.untrusted.requests == []


def test_other_hosts_stay_opaque_tunnels(tls_setup: Setup) -> None:
    s = tls_setup
    s.policy()
    ca = s.ca.cert_path
    script = f"""
        {CURL} --cacert {ca} {s.url("/echo/opaque", "other.test", s.other)} && echo
        {CURL} --cacert {ca} {s.url("/secret/opaque", "other.test", s.other)} && echo
        {CURL} --cacert {ca} {s.url("/echo/mitm")} || echo mitm=refused
    """
    if not sees_host_root(s.c):  # the container has no copy of the test CA: bind via ws
        shutil.copy(ca, s.ws / "test-ca.pem")
        s.c.chown(s.ws / "test-ca.pem")
        script = script.replace(str(ca), "test-ca.pem")
    out, err, code = s.run(script, deny="/secret")
    assert code == 0, err
    answers = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    # the client verified the origin's own certificate with the origin's CA alone:
    # nothing in between; and the deny hook never saw inside that tunnel
    assert [a["target"] for a in answers] == ["/echo/opaque", "/secret/opaque"]
    assert "mitm=refused" in out  # the twin: an inspected host shows corral's certificate
    assert [r["target"] for r in s.other.requests] == ["/echo/opaque", "/secret/opaque"]
    assert s.origin.requests == []
    tunnels = [e for e in net_log(s.c) if e["scheme"] == "connect" and e["host"] == "other.test"]
    assert len(tunnels) == 2 and all(e["decision"] == "allow" for e in tunnels)


def test_a_tunnel_whose_sni_asks_for_another_name_is_refused(tls_setup: Setup) -> None:
    """Domain fronting with a real curl: CONNECT to an allowed, opaque name while
    the ClientHello asks for another (on a CDN, the other site answers).  Fronting
    to an inspected name would also dodge its rules.  ``-k``: only corral refuses."""
    s = tls_setup
    s.policy()
    port = s.other.port
    via = f"--connect-to ::other.test:{port}"
    script = f"""
        {CURL} -k {via} https://evil.test:{port}/echo/fronted || echo fronted=refused
        {CURL} -k {via} https://origin.test:{port}/secret/fronted || echo inspected=refused
        {CURL} -k {via} https://other.test:{port}/echo/own && echo
    """
    out, err, code = s.run(script, deny="/secret")
    assert code == 0, err
    assert "fronted=refused" in out and "inspected=refused" in out
    assert [r["target"] for r in s.other.requests] == ["/echo/own"]  # the twin
    assert s.origin.requests == []
    lines = [e for e in net_log(s.c) if e["scheme"] == "connect"]
    assert [(e["host"], e["decision"], e["rule"]) for e in lines] == [
        ("other.test", "deny", "name-mismatch"),
        ("other.test", "deny", "name-mismatch"),
        ("other.test", "allow", lines[2]["rule"]),
    ]
    assert "asked for evil.test" in str(lines[0]["reason"])


def test_untrusted_origin_is_a_502_with_reason_and_audit(tls_setup: Setup) -> None:
    s = tls_setup
    s.policy()
    bad = s.url("/echo/bad", "bad.test", s.untrusted)
    script = f"""
        {CURL} -w '\\nstatus=%{{http_code}}\\n' {bad}
        {CURL} -o /dev/null -w 'good=%{{http_code}}\\n' {s.url("/echo/good")}
    """
    out, err, code = s.run(script)
    assert code == 0, err
    assert "status=502" in out and "good=200" in out, out
    body = json.loads(out.split("\nstatus=")[0].strip())
    assert body["rule"] == "upstream-tls" and "not trusted" in body["reason"]
    assert s.untrusted.requests == []  # never a silent pass
    line = next(x for x in https_lines(s.c) if x["host"] == "bad.test")
    assert line["status"] == 502 and line["decision"] == "deny" and line["rule"] == "upstream-tls"


def test_an_upstream_ca_file_in_the_workspace_is_not_the_sandboxs_to_change(
    tls_setup: Setup,
) -> None:
    """``[tls] upstream_ca`` in the workspace: a run copied its own CA over it and
    the proxy (reading it later, in a worker) trusted an origin it refused, in
    that run and every run after (found by attacking corral).  Now the file is
    read before the sandbox starts and write-protected like the policy; the
    origin the real CA vouches for stays reachable (the twin)."""
    s = tls_setup
    certs = s.ws / "certs"
    certs.mkdir()
    shutil.copy(s.ca.cert_path, certs / "registry.pem")
    shutil.copy(s.dir / "stranger" / "test-ca.pem", s.ws / "payload.pem")
    s.c.chown(s.ws)
    s.policy()
    policy = s.ws / "corral.toml"
    policy.write_text(policy.read_text().replace(str(s.ca.cert_path), "certs/registry.pem"))
    s.c.chown(policy)
    bad = s.url("/echo/bad", "bad.test", s.untrusted)
    probe = f"""
        {CURL} -o /dev/null -w 'bad=%{{http_code}}\n' {bad}
        {CURL} -o /dev/null -w 'good=%{{http_code}}\n' {s.url("/echo/good")}
    """
    out, err, code = s.run(f"cp payload.pem certs/registry.pem 2>/dev/null; {probe}")
    assert "bad=502" in out and "good=200" in out, (out, err, code)
    out, err, code = s.run(probe)  # the next run: the file as the user left it
    assert code == 0 and "bad=502" in out and "good=200" in out, (out, err, code)
    assert s.untrusted.requests == []
    assert (certs / "registry.pem").read_bytes() == s.ca.cert_path.read_bytes()


def test_ca_key_stays_outside_and_ephemeral_leaves_nothing(tls_setup: Setup) -> None:
    s = tls_setup
    s.policy()
    key_file = s.c.state / "corral" / "ca" / "corral-ca.pem"
    probe = f"cat {key_file} >/dev/null 2>&1 && echo key=READ || echo key=hidden; "
    out, err, code = s.run(probe + f"{CURL} -o /dev/null -w 'ok=%{{http_code}}' {s.url('/echo')}")
    assert code == 0, err
    assert "key=hidden" in out and "ok=200" in out, out
    assert key_file.exists() and key_file.stat().st_mode & 0o777 == 0o600
    assert key_file.stat().st_uid == s.c.uid
    # the twin: ca = "ephemeral" works the same and leaves no CA anywhere
    shutil.rmtree(s.c.state / "corral" / "ca")
    s.policy(tls='ca = "ephemeral"\n')
    tmp = s.c.base / "tmpdir"  # where corral makes the door (and the bundle beside it)
    tmp.mkdir()
    s.c.chown(tmp)
    url = s.url("/echo")
    out, err, code = s.run(
        f"{CURL} -o /dev/null -w 'ok=%{{http_code}}' {url}", env={"TMPDIR": str(tmp)}
    )
    assert code == 0 and "ok=200" in out, err
    assert not (s.c.state / "corral" / "ca").exists()
    assert list(tmp.iterdir()) == []  # the bundle went with the door; the key was never written


def test_the_users_own_ca_key_is_never_readable_inside(tls_setup: Setup) -> None:
    """[tls] ca_key names the user's own CA: with it the command could sign any
    certificate whatever trusts that CA accepts.  It stays unreadable, wherever it
    is (here in the workspace, visible on every tier); the twin: its certificate
    reads, and interception signs with that CA."""
    s = tls_setup
    own = OriginCA(s.ws / "myca", "the user's own CA")
    s.c.chown(s.ws)
    s.policy(tls=f'ca_cert = "{own.cert_path}"\nca_key = "{own.key_path}"\n')
    probe = f"grep -c 'PRIVATE KEY' {own.key_path} 2>/dev/null || echo key=hidden; "
    probe += f"grep -c CERTIFICATE {own.cert_path}; "
    out, err, code = s.run(probe + f"{CURL} -o /dev/null -w 'ok=%{{http_code}}' {s.url('/echo')}")
    assert code == 0, err
    assert "key=hidden" in out and "ok=200" in out, (out, err)
    assert out.split()[1] == "2", out  # the certificate reads (its BEGIN and END lines)
    assert b"PRIVATE KEY" in own.key_path.read_bytes()  # untouched on the host


def test_system_bundle_paths_trust_corral_where_the_tier_can_mount(tls_setup: Setup) -> None:
    s = tls_setup
    s.policy()
    system = "/etc/ssl/certs/ca-certificates.crt"
    script = (
        "env -u SSL_CERT_FILE -u CURL_CA_BUNDLE "
        f"{CURL} --cacert {system} -o /dev/null -w 'code=%{{http_code}}' {s.url('/echo')} "
        "|| echo code=untrusted"
    )
    out, err, _ = s.run(script)
    if s.c.tier is not None and s.c.tier.id == "landlock":
        assert "code=untrusted" in out  # no mounts there: only the variables (documented)
    else:
        assert "code=200" in out, (out, err)
    # the allow twin everywhere: the variables alone
    out, err, _ = s.run(f"{CURL} -o /dev/null -w 'code=%{{http_code}}' {s.url('/echo')}")
    assert "code=200" in out, err


@pytest.mark.tiers("namespace", "landlock", why="node is a host program, not in the test image")
def test_node_trusts_corral_through_extra_ca_certs(tls_setup: Setup) -> None:
    s = tls_setup
    s.policy()
    if not shutil.which("node"):
        pytest.skip("node is not installed on this host")
    (s.ws / "client.js").write_text(NODE_CONNECT_CLIENT)
    s.c.chown(s.ws / "client.js")
    out, err, code = s.run(
        f"node client.js {s.url('/echo/node')}; echo; node client.js {s.url('/secret/node')}",
        deny="/secret",
    )
    assert code == 0, err
    answers = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert answers[0]["target"] == "/echo/node" and answers[1]["rule"] == "test-deny-path"
    assert "/secret/node" not in [r["target"] for r in s.origin.requests]


@pytest.mark.tiers("namespace", why="transparent mode needs the namespace tier")
def test_transparent_mode_intercepts_by_sni(tls_setup: Setup, who: str) -> None:
    s = tls_setup
    if who != "root":
        pytest.skip("transparent mode needs root")
    if not shutil.which("node"):
        pytest.skip("node is not installed on this host")
    s.policy()
    fetch = (
        "node -e 'fetch(process.argv[1]).then(r => r.text()).then(t => console.log(t))"
        '.catch(e => console.log("fetch failed", e.cause && e.cause.code))\''
    )
    script = f"""
        {fetch} {s.url("/echo/fetch")}
        {fetch} {s.url("/secret/fetch")}
        {CURL} --noproxy '*' -o /dev/null -w 'curl=%{{http_code}}\\n' {s.url("/echo/curl")}
    """
    out, err, code = s.run(script, "--transparent", deny="/secret")
    assert code == 0, err
    answers = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert answers[0]["target"] == "/echo/fetch", out
    assert answers[1]["rule"] == "test-deny-path"
    assert "curl=200" in out
    assert {x["scheme"] for x in https_lines(s.c)} == {"https"}
    assert [r["target"] for r in s.origin.requests] == ["/echo/fetch", "/echo/curl"]


BAD_TLS = [
    ('[tls]\nca = "bogus"\n', "tls.ca: ca must be"),
    ("[tls]\nfrobnicate = true\n", "tls.frobnicate: unknown key"),
    ('[tls]\nca_cert = "ca.pem"\n', "tls.ca_key: needed with tls.ca_cert"),
    ('[tls]\nca_cert = "ca.pem"\nca_key = "missing.key"\n', "tls.ca_key: cannot read"),
    ('[tls]\nupstream_ca = ["missing.pem"]\n', "tls.upstream_ca: cannot read"),
    ('[tls]\npassthrough = ["bad host name!"]\n', "tls.passthrough"),
    (
        '[tls]\ninspect = ["*.example.org"]\npassthrough = ["api.example.org"]\n',
        "tls.passthrough: 'api.example.org' is never intercepted, but tls.inspect",
    ),
    ('[tls]\ninspect = ["example.org"]\nca_cert = "leaf.pem"\nca_key = "leaf.key"\n', "not a CA"),
    ('[tls]\ninspect = ["example.org"]\nupstream_ca = "garbage.pem"\n', "holds no PEM CA"),
]


@pytest.mark.parametrize(("policy", "message"), BAD_TLS, ids=[m.split(":")[0] for _, m in BAD_TLS])
def test_bad_tls_input_is_one_line_and_exit_2(
    sandbox: tuple[Corral, Path], policy: str, message: str
) -> None:
    c, ws = sandbox
    ca = OriginCA(ws / "certs")
    shutil.copy(ca.cert_path, ws / "ca.pem")
    leaf, leaf_key = ca.server_files(tag="leaf")
    shutil.copy(leaf, ws / "leaf.pem")
    shutil.copy(leaf_key, ws / "leaf.key")
    (ws / "garbage.pem").write_text("not a certificate\n")
    (ws / "corral.toml").write_text('[network]\nmode = "proxy"\nallow = ["example.org"]\n' + policy)
    c.chown(ws)
    r = c.run(["run", "-q", "--", "sh", "-c", "touch started"], cwd=ws)
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert not (ws / "started").exists()  # nothing ran


@pytest.mark.tiers("namespace", why="one tier is enough for the Python API's plumbing")
def test_python_sandbox_trusts_corral_too(
    tls_setup: Setup, who: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = tls_setup
    if who != "root":
        pytest.skip("the Python API runs in this (root) test process")
    s.policy()
    monkeypatch.setenv("XDG_STATE_HOME", str(s.c.state))  # the CA goes there, not to root's
    from corral import Policy, Sandbox

    with Sandbox(Policy.load(workspace=str(s.ws)), tier="namespace") as sb:
        ok = sb.exec(["curl", "-sS", "--max-time", "20", s.url("/echo/api")])
        bad = sb.exec(["curl", "-sS", "--max-time", "20", s.url("/echo", "bad.test", s.untrusted)])
    assert ok.exit_code == 0, ok.stderr
    assert json.loads(ok.stdout)["target"] == "/echo/api"
    assert json.loads(bad.stdout)["rule"] == "upstream-tls"  # the deny twin
    assert (s.c.state / "corral" / "ca" / "corral-ca.pem").exists()
