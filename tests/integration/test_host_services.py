"""Allowed host services at their own address, the sandbox's resolver, and the door's end.

Real corral runs on every tier that applies, as root and as the user; real
clients (curl, Python's urllib and bare sockets) inside; real origins on
127.0.0.1 and ::1 outside that count what reached them.  Every name used is
refused or pinned by the policy: nothing is ever resolved outside the machine.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT_BASE, Corral, is_gvisor, pids_matching, wait_for
from test_network import Origin, net_log, origins  # noqa: F401  (fixture)

from tests.procs import alive
from tests.tiers import TierCase

BLOCKED = "blocked.corral.test"  # never allowed: its lookup must be refused and recorded
PINNED = "service.corral.test"  # allowed and pinned to 127.0.0.1: answered, never sent to DNS

URLLIB = """
import sys, urllib.request
try:
    print("urllib", urllib.request.urlopen(sys.argv[1], timeout=10).read().decode().strip())
except OSError as exc:
    print("urllib failed", type(exc).__name__)
"""

RAW = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(b"GET /raw HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n")
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    print("raw", b"hello from origin" in data)
except OSError as exc:
    print("raw failed", type(exc).__name__)
"""


def script(ws: Path, c: Corral, name: str, text: str) -> str:
    (ws / name).write_text(text)
    c.chown(ws / name)
    return name


def own_address(c: Corral) -> bool:
    """Tiers with a network namespace serve allowed host services at their own address;
    landlock shares the host's stack and sends them through the proxy instead."""
    return c.has("netns")


def test_allowed_host_service_is_reached_at_its_own_address(
    tsandbox: tuple[Corral, Path],
    origins: tuple[Origin, Origin],  # noqa: F811
) -> None:
    c, ws = tsandbox
    ok, bad = origins
    raw = script(ws, c, "raw.py", RAW)
    lib = script(ws, c, "lib.py", URLLIB)
    r = c.sh(
        ws,
        f"""
        curl -fsS --max-time 10 http://127.0.0.1:{ok.port}/curl || echo curl=failed
        python3 {lib} http://127.0.0.1:{ok.port}/urllib
        python3 {raw} 127.0.0.1 {ok.port}
        curl -fsS --max-time 10 http://127.0.0.1:{bad.port}/other || echo other=failed
        python3 {raw} 127.0.0.1 {bad.port}
        """,
        "--allow",
        f"127.0.0.1:{ok.port}",
    )
    out = r.stdout.decode()
    assert bad.hits == [], out  # the deny twin: a second host port is not reached
    assert "other=failed" in out and "raw failed" in out
    # proxy-aware clients reach it everywhere (at its own address, or through the proxy)
    assert "curl=failed" not in out and "urllib hello from origin" in out, (out, r.stderr)
    log = [e for e in net_log(c) if e["port"] == ok.port]
    assert log and all(e["decision"] == "allow" for e in log)
    if own_address(c):
        # ... and so does a client that ignores proxy variables; each connection is
        # decided by the proxy and audited like any request
        assert "raw True" in out
        assert {p for _, p in ok.hits} == {"/curl", "/urllib", "/raw"}
        assert {e["scheme"] for e in log} == {"service"}
        assert all(e["rule"] == f"127.0.0.1:{ok.port}" for e in log)
    else:  # landlock: only through the proxy (NO_PROXY leaves 127.0.0.1 out)
        assert {p for _, p in ok.hits} == {"/curl", "/urllib"}
        assert {e["scheme"] for e in log} == {"http"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_allowed_service_with_nothing_listening_fails_and_is_named(
    tsandbox: tuple[Corral, Path],
    origins: tuple[Origin, Origin],  # noqa: F811
) -> None:
    """Allowed, but nothing listens on the host: the client sees a failed connection
    (a reset at its own address, a 502 through the proxy), never an empty reply,
    and corral names the destination and the cause after the run.  The twin: the
    allowed service that does listen is reached in the same run."""
    c, ws = tsandbox
    ok, _ = origins
    down = _free_port()
    r = c.sh(
        ws,
        f"""
        curl -fsS --max-time 10 http://127.0.0.1:{down}/ ; echo "down=$?"
        curl -fsS --max-time 10 http://127.0.0.1:{ok.port}/up
        """,
        "--allow",
        f"127.0.0.1:{down}",
        "--allow",
        f"127.0.0.1:{ok.port}",
    )
    out, err = r.stdout.decode(), r.stderr.decode()
    assert "hello from origin" in out and ok.hits == [("GET", "/up")], (out, err)
    # at its own address the reset may land before curl has checked its connect
    # (then it says 7, "couldn't connect") or after (56); either is a failed
    # connection, never 52, an empty reply
    codes = ("down=7", "down=56") if own_address(c) else ("down=22",)
    assert any(code in out for code in codes), (out, err)
    expected = f"corral: unreachable: 127.0.0.1:{down} (allowed by 127.0.0.1:{down}, but "
    assert expected in err and "Connection refused" in err, err
    assert "blocked:" not in err  # nothing was refused


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


class Origin6(Origin):
    """The same origin on [::1]."""

    def __init__(self) -> None:
        class Server(http.server.ThreadingHTTPServer):
            address_family = socket.AF_INET6

        self.hits: list[tuple[str, str]] = []
        hits = self.hits

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                hits.append((self.command, self.path))
                body = b"hello from origin\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = Server(("::1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def origin6() -> Iterator[Origin6]:
    if not _ipv6_loopback():
        pytest.skip("this host has no IPv6 loopback")
    origin = Origin6()
    try:
        yield origin
    finally:
        origin.close()


@pytest.mark.tiers("namespace", "container", "gvisor", why="a namespace to serve [::1] in")
def test_an_ipv6_host_service_is_reached_at_its_own_address(
    tsandbox: tuple[Corral, Path], origin6: Origin6
) -> None:
    c, ws = tsandbox
    raw = script(ws, c, "raw.py", RAW)
    r = c.sh(
        ws,
        f"python3 {raw} ::1 {origin6.port}; python3 {raw} 127.0.0.1 {origin6.port}",
        "--allow",
        f"[::1]:{origin6.port}",
    )
    out = r.stdout.decode()
    # at [::1] only: the same port on 127.0.0.1 is not the allowed service (twin)
    assert out.splitlines() == ["raw True", "raw failed ConnectionRefusedError"], (out, r.stderr)
    assert origin6.hits == [("GET", "/raw")]
    (line,) = [e for e in net_log(c) if e["scheme"] == "service"]
    assert line["host"] == "::1" and line["decision"] == "allow"


@pytest.mark.tiers("namespace", "container", "gvisor", why="a loopback of its own to bind")
def test_other_loopback_traffic_stays_local(
    tsandbox: tuple[Corral, Path],
    origins: tuple[Origin, Origin],  # noqa: F811
) -> None:
    """A server the command starts on its own loopback is reached without the proxy,
    proxy variables set and all, next to an allowed host service in the same run."""
    c, ws = tsandbox
    ok, _ = origins
    server = script(
        ws,
        c,
        "server.py",
        "import http.server, sys\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.send_header('Content-Length', '7')\n"
        "        self.end_headers(); self.wfile.write(b'inside\\n')\n"
        "    def log_message(self, *a): pass\n"
        "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n",
    )
    inner = ok.port + 1 if ok.port < 65535 else ok.port - 1  # free inside: its own loopback
    r = c.sh(
        ws,
        f"""
        python3 {server} {inner} & pid=$!
        for i in $(seq 100); do
            curl -s http://127.0.0.1:{inner}/ >/dev/null && break; sleep 0.05
        done
        curl -sS --max-time 10 http://127.0.0.1:{inner}/local
        curl -sS --max-time 10 http://127.0.0.1:{ok.port}/host
        kill $pid
        """,
        "--allow",
        f"127.0.0.1:{ok.port}",
    )
    out = r.stdout.decode()
    assert out.split() == ["inside", "hello", "from", "origin"], (out, r.stderr)
    assert ok.hits == [("GET", "/host")]
    ports = {e["port"] for e in net_log(c)}
    assert inner not in ports and ok.port in ports  # the local one never met the proxy


def _policy(ws: Path, c: Corral, allow: list[str]) -> None:
    path = ws / "corral.toml"
    path.write_text(
        "[network]\n"
        'mode = "proxy"\n'
        f"allow = {json.dumps(allow)}\n"
        f'hosts = {{ "{PINNED}" = "127.0.0.1" }}\n'
    )
    c.chown(path)


LOOKUP = f"""
import socket
for name in ("{BLOCKED}", "{PINNED}"):
    try:
        print(name, sorted({{a[4][0] for a in socket.getaddrinfo(name, 80, socket.AF_INET)}}))
    except socket.gaierror as exc:
        print(name, "refused", exc.errno == socket.EAI_NONAME)
"""


@pytest.mark.tiers("namespace", "container", "gvisor", why="a resolver inside the sandbox")
def test_a_refused_lookup_is_recorded_and_an_allowed_name_resolves(
    tsandbox: tuple[Corral, Path],
    origins: tuple[Origin, Origin],  # noqa: F811
) -> None:
    c, ws = tsandbox
    ok, _ = origins
    _policy(ws, c, [PINNED, f"127.0.0.1:{ok.port}"])
    lookup = script(ws, c, "lookup.py", LOOKUP)
    r = c.sh(ws, f"python3 {lookup}; curl -sS --max-time 10 http://{PINNED}:{ok.port}/named")
    out = r.stdout.decode()
    assert f"{BLOCKED} refused True" in out, (out, r.stderr)  # NXDOMAIN, not a timeout
    assert f"{PINNED} ['127.0.0.1']" in out  # the allow twin: answered from the policy
    assert "hello from origin" in out  # and usable through the proxy
    log = net_log(c)
    assert not [e for e in log if e["decision"] == "error"], log  # no bug inside the proxy
    dns = [e for e in log if e["scheme"] == "dns"]
    refused = [e for e in dns if e["host"] == BLOCKED]
    assert refused and all(e["decision"] == "deny" for e in refused)
    assert {e["rule"] for e in refused} == {"default"}
    assert all(e["reason"] == "host not in the allow list" for e in refused)
    assert {e["method"] for e in refused} == {"A"}
    answered = [e for e in dns if e["host"] == PINNED]
    assert answered and {(e["decision"], e["rule"], e["address"]) for e in answered} == {
        ("allow", PINNED, "127.0.0.1")
    }


@pytest.mark.tiers("namespace", why="a resolver in a sandbox without a network")
def test_a_lookup_without_a_network_is_refused_recorded_and_reported(
    tsandbox: tuple[Corral, Path],
) -> None:
    c, ws = tsandbox
    r = c.sh(ws, f"curl -sS --max-time 10 https://{BLOCKED}/ ; echo curl=$?")
    err = r.stderr.decode()
    assert "curl=6" in r.stdout.decode() and "Could not resolve host" in err, err
    lines = [e for e in net_log(c) if e["host"] == BLOCKED]
    assert lines and {(e["scheme"], e["decision"], e["rule"]) for e in lines} == {
        ("dns", "deny", "no-network")
    }
    assert all("no network" in e["reason"] for e in lines)
    assert f"blocked: {BLOCKED} (2 lookups; no network" in err  # the run's summary names it
    twin = c.sh(ws, "curl -sS --max-time 10 http://127.0.0.1:9/ ; echo curl=$?")  # no lookup
    assert "curl=7" in twin.stdout.decode()  # refused at once, and nothing recorded
    assert len([e for e in net_log(c) if e["scheme"] == "dns"]) == len(lines)


def _proxy_pids(tmp: Path) -> list[int]:
    return [int(p) for f in tmp.glob("corral-door-*/proxy.pid") for p in f.read_text().split()]


def _run_in_own_tmp(
    c: Corral, ws: Path, argv: list[str], out: int = subprocess.PIPE
) -> tuple[subprocess.Popen[bytes], Path]:
    """``corral ARGV`` started with a TMPDIR of its own beside the workspace (where
    its door is: other runs on the machine have doors too), and that directory."""
    tmp = ws.parent / "tmp"
    tmp.mkdir()
    c.chown(tmp)
    proc = c.popen(argv, cwd=ws, env={"TMPDIR": str(tmp)}, stdout=out, stderr=out)
    return proc, tmp


KILLED = """
import socket, sys, time
port = int(sys.argv[1])
def attempt(what, fn):
    t = time.monotonic()
    try:
        fn()
        print(what, "ok", round(time.monotonic() - t, 3))
    except OSError as exc:
        print(what, type(exc).__name__, round(time.monotonic() - t, 3))
def get(host, p):
    s = socket.create_connection((host, p), timeout=10)
    s.settimeout(10)
    s.sendall(b"GET /killed HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n")
    if not s.recv(100):
        raise ConnectionResetError("closed")
attempt("service", lambda: get("127.0.0.1", port))
attempt("proxy", lambda: get("127.0.0.1", 3128))
attempt("lookup", lambda: socket.getaddrinfo("{name}", 80))
""".replace("{name}", BLOCKED)


@pytest.mark.tiers("namespace", why="the listeners the proxy holds")
def test_proxy_killed_means_no_network_at_once(
    tsandbox: tuple[Corral, Path],
    origins: tuple[Origin, Origin],  # noqa: F811
) -> None:
    c, ws = tsandbox
    ok, _ = origins
    killed = script(ws, c, "killed.py", KILLED)
    proc, tmp = _run_in_own_tmp(
        c, ws,
        ["run", "-q", "--allow", f"127.0.0.1:{ok.port}", "--", "sh", "-c",
         f"python3 {killed} {ok.port} > before.txt; touch ready; "
         f"while [ ! -e go ]; do sleep 0.05; done; python3 {killed} {ok.port}"],
    )  # fmt: skip
    try:
        assert wait_for(lambda: (ws / "ready").exists(), 30)
        pids = _proxy_pids(tmp)
        assert pids
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        (ws / "go").write_text("")
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    before = (ws / "before.txt").read_text()
    assert "service ok" in before and "proxy ok" in before  # the twin: all served before
    after = {line.split()[0]: line.split()[1:] for line in out.decode().splitlines()}
    for what in ("service", "proxy"):
        kind, seconds = after[what]
        assert kind == "ConnectionRefusedError" and float(seconds) < 0.5, out
    assert after["lookup"][0] == "gaierror" and float(after["lookup"][1]) < 1.0, out
    assert proc.returncode == 0  # nothing else changed
    assert ok.hits == [("GET", "/killed")]  # the service, before (the proxy answered 400)


@pytest.mark.tiers("namespace", "landlock", why="the proxy's workers, forked on the host")
@pytest.mark.parametrize("used", [False, True])
def test_the_proxy_workers_end_with_the_run(
    tsandbox: tuple[Corral, Path],
    origins: tuple[Origin, Origin],  # noqa: F811
    used: bool,
) -> None:
    """A run that never used its network has its proxy workers killed as it ends
    (before they are told the run is over: none wakes for nothing); one that used
    it waits for their tally, which its summary shows.  Either way none is left."""
    c, ws = tsandbox
    ok, _ = origins
    use = f"curl -s -o /dev/null http://{BLOCKED}/; " if used else ""
    proc, tmp = _run_in_own_tmp(
        c, ws,
        ["run", "--allow", f"127.0.0.1:{ok.port}", "--", "sh", "-c",
         f"{use}touch ready; while [ ! -e go ]; do sleep 0.05; done"],
    )  # fmt: skip
    try:
        assert wait_for(lambda: (ws / "ready").exists(), 30)
        pids = _proxy_pids(tmp)
        assert pids and all(map(alive, pids))
        (ws / "go").write_text("")
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert wait_for(lambda: not any(map(alive, pids)), 10), pids
    assert (BLOCKED in err.decode()) == used, err  # the tally of a run that used it
    assert not list(tmp.glob("corral-door-*"))


def _netns_holders(inode: str) -> list[int]:
    holders = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/net") == inode:
                    holders.append(int(entry))
            except OSError:
                pass
    return holders


@pytest.mark.parametrize("network", ["offline", "proxy"])
def test_nothing_left_when_corral_is_killed(
    tsandbox: tuple[Corral, Path],
    origins: tuple[Origin, Origin],  # noqa: F811
    network: str,
) -> None:
    """corral SIGKILLed mid-run: no process of the run, no door (socket, file,
    directory) and, where corral made one, no network namespace is left."""
    c, ws = tsandbox
    ok, _ = origins
    if network == "offline" and c.tier is not None and c.tier.id != "namespace":
        pytest.skip(f"nothing network-related to leave without a network ({c.tier.id})")
    allow = ["--allow", f"127.0.0.1:{ok.port}"] if network == "proxy" else []
    proc, tmp = _run_in_own_tmp(
        c, ws,
        ["run", "-q", *allow, "--", "sh", "-c",
         "readlink /proc/self/ns/net > netns.txt; sleep 60 & sleep 60"],
        subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert wait_for(lambda: (ws / "netns.txt").exists() and (ws / "netns.txt").read_text(), 60)
        inode = (ws / "netns.txt").read_text().strip()
        assert inode.startswith("net:[")
        own = inode != os.readlink("/proc/self/ns/net")  # landlock shares the host's
        assert own == c.has("netns")
        own = own and not is_gvisor(c)  # gVisor's namespace is inside its own kernel
        if own:
            assert _netns_holders(inode)  # the sandbox (and corral itself) live in it
        if network == "proxy":
            assert _proxy_pids(tmp)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    if own:  # no process in the namespace (so no namespace: the proxy's sockets went too)
        assert wait_for(lambda: not _netns_holders(inode), 30), _netns_holders(inode)
    assert wait_for(lambda: not list(tmp.glob("corral-door-*")), 10)  # no socket, no file
    if allow:  # every process of the run carries the port: corral's, the proxy's, the relay
        assert wait_for(lambda: not pids_matching(f"127.0.0.1:{ok.port}"), 30)
    with open("/proc/net/unix", encoding="utf-8") as fh:
        assert str(tmp) not in fh.read()  # no bound socket left in the door's place
    twin = c.sh(ws, "echo alive", *allow)  # the next run starts as ever
    assert twin.stdout == b"alive\n"


@pytest.mark.tiers("namespace", "container", "gvisor", why="a namespace to serve it in")
def test_a_long_lived_sandbox_reaches_the_service_and_records_lookups(
    tier: TierCase,
    origins: tuple[Origin, Origin],  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sandbox() launches through a fork (not corral run's own process): the same
    namespace, listeners and resolver, and the same audit."""
    if os.geteuid() != 0:
        pytest.skip("the API runs in this process: the root variant needs root")
    from corral import policy as pol
    from corral.sandbox import Sandbox

    ok, bad = origins
    base = ROOT_BASE / ("hs-" + uuid.uuid4().hex[:10])
    ws, state = base / "ws", base / "state"
    for d in (ws, state):
        d.mkdir(parents=True)
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    try:
        policy = pol.load(str(ws))
        policy.network.mode = "proxy"
        policy.network.allow = [f"127.0.0.1:{ok.port}"]
        with Sandbox(policy, **tier.api) as box:
            own = box.exec(f"curl -fsS --noproxy '*' --max-time 10 http://127.0.0.1:{ok.port}/own")
            other = box.exec(f"curl -fsS --noproxy '*' --max-time 10 http://127.0.0.1:{bad.port}/")
            lookup = box.exec(
                f"python3 -c \"import socket; socket.getaddrinfo('{BLOCKED}', 80)\"", timeout=20
            )
        assert own.stdout == b"hello from origin\n", own.stderr
        assert other.exit_code != 0 and bad.hits == []  # the deny twin
        assert lookup.exit_code != 0 and b"gaierror" in lookup.stderr
        lines = [json.loads(x) for x in (state / "corral" / "net.jsonl").read_text().splitlines()]
        assert ("service", "allow", ok.port) in {
            (e["scheme"], e["decision"], e["port"]) for e in lines
        }
        assert any(e["host"] == BLOCKED and e["decision"] == "deny" for e in lines)
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.tiers("namespace", why="a host service at its own address needs the sandbox's netns")
def test_pip_reaches_an_allowed_local_index_by_localhost(
    tsandbox: tuple[Corral, Path], tmp_path: Path
) -> None:
    """Found by trying corral as a new user: with --allow 127.0.0.1:PORT, curl and
    urllib reached http://localhost:PORT, but pip went to the proxy (PIP_PROXY
    overrides NO_PROXY) and was refused as localhost; the hints then sent the user
    round in circles.  pip now keeps loopback local like the rest.  The twin: an
    index that is not allowed stays out of reach."""
    from test_tls import tiny_wheel

    c, ws = tsandbox
    simple = tmp_path / "simple" / "tinypkg"
    simple.mkdir(parents=True)
    wheel = tiny_wheel(simple)
    (simple / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    pip = (
        "PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 python3 -m pip download "
        f"-q --retries 0 --timeout 5 --no-deps --no-cache-dir -d dl "
        f"--index-url http://localhost:{port}/simple/ tinypkg"
    )
    try:
        r = c.sh(ws, f"{pip} && ls dl", "--allow", f"127.0.0.1:{port}")
        assert r.returncode == 0 and wheel.name in r.stdout.decode(), r
        denied = c.sh(ws, f"{pip} 2>/dev/null || echo refused")
        assert denied.stdout.decode().strip() == "refused"
    finally:
        server.shutdown()
        server.server_close()


def test_a_host_service_named_but_not_allowed_gets_a_note(
    tsandbox: tuple[Corral, Path],
    origins: tuple[Origin, Origin],  # noqa: F811
) -> None:
    """Found by trying corral as a new user: a command aimed at a host service on
    loopback met the sandbox's own, and nothing said why.  The twin: allowed, the
    same command reaches it and no note is said."""
    c, ws = tsandbox
    ok, _ = origins
    url = f"http://127.0.0.1:{ok.port}/named"
    r = c.run(["run", "--", "curl", "-sS", "--max-time", "5", url], cwd=ws)
    note = f"corral: note: 127.0.0.1:{ok.port}: the sandbox has a loopback of its own; "
    assert note + f"--allow 127.0.0.1:{ok.port} reaches" in r.stderr.decode(), r.stderr
    assert ok.hits == []
    allowed = c.run(["run", "--allow", f"127.0.0.1:{ok.port}", "--", "curl", "-sS", url], cwd=ws)
    assert b"hello from origin" in allowed.stdout and note.encode() not in allowed.stderr
