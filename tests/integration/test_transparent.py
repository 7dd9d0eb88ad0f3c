"""Transparent mode (root): tools that ignore proxy variables still go only through corral."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import Corral
from test_network import Origin, net_log, origins  # noqa: F401  (fixture)

NAME = "origin.corral.test"
WILD = "wild.corral.test"


def policy(ws: Path, port: int, c: Corral) -> Path:
    path = ws / "corral.toml"
    path.write_text(
        "[network]\n"
        'mode = "proxy"\n'
        "transparent = true\n"
        f'allow = ["{NAME}:{port}", "127.0.0.1:{port}", "*.{WILD}:{port}"]\n'
        f'hosts = {{ "{NAME}" = "127.0.0.1", "good.{WILD}" = "127.0.0.1" }}\n'
    )
    c.chown(path)
    return path


PROBE = """
import socket, sys
port = int(sys.argv[1])
def get(host, send_host):
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(f"GET /raw HTTP/1.0\\r\\nHost: {send_host}\\r\\n\\r\\n".encode())
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    return data
print("raw", b"hello from origin" in get("origin.corral.test", "origin.corral.test"))
print("fronted", b"hello from origin" in get("origin.corral.test", "evil.example"))
try:
    socket.getaddrinfo("evil.corral.test", 80)
    print("evil-dns RESOLVED")
except socket.gaierror:
    print("evil-dns nxdomain")
try:
    print("literal", b"HTTP/1.1 200" in get("192.0.2.1", "192.0.2.1"))
except OSError:
    print("literal False")
# named from Host alone (not a stand-in address): the name decided is the name dialled;
# a NUL once passed "*.wild.corral.test" and the resolver dialled "localhost"
nul = get("192.0.2.1", "localhost\\x00.wild.corral.test")
print("nul-host", b"hello from origin" in nul, nul.split(b"\\r\\n")[0].decode())
print("good-host", b"hello from origin" in get("192.0.2.1", "good.wild.corral.test"))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(b"x", ("192.0.2.1", 9999))
    print("udp SENT")
except OSError:
    print("udp blocked")
"""


def test_transparent_capture(sandbox: tuple[Corral, Path], origins: tuple[Origin, Origin]) -> None:  # noqa: F811
    c, ws = sandbox
    ok, _ = origins
    policy(ws, ok.port, c)
    if c.who == "user":
        r = c.sh(ws, "true")
        assert r.returncode == 122 and b"transparent mode needs root" in r.stderr
        return
    if shutil.which("nft") is None:
        pytest.fail("nft is missing: .ci/run installs nftables")
    (ws / "probe.py").write_text(PROBE)
    node = (
        f'node -e \'fetch("http://{NAME}:{ok.port}/node").then(r => r.text())'
        '.then(t => console.log("node", t.trim()))\''
        if shutil.which("node")
        else "echo node hello from origin"
    )
    # No proxy variables at all: only the capture can carry these requests.
    r = c.sh(
        ws,
        f"""
        unset http_proxy HTTP_PROXY https_proxy HTTPS_PROXY ALL_PROXY all_proxy SOCKS_PROXY
        {node}
        python3 probe.py {ok.port}
    """,
    )
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr
    assert "node hello from origin" in out  # allow twins
    assert "raw True" in out
    assert "fronted False" in out  # Host differs from the name the address stands for
    assert "evil-dns nxdomain" in out
    assert "literal False" in out
    assert "nul-host False HTTP/1.1 400 Bad Request" in out
    assert "good-host True" in out  # its twin: the rule's own name, pinned
    assert "udp blocked" in out
    paths = {p for _, p in ok.hits}
    assert "/raw" in paths and ("/node" in paths or not shutil.which("node"))
    # raw and good-host arrived; the fronted one and the NUL one never did
    assert len(ok.hits) == (3 if shutil.which("node") else 2)
    log = net_log(c)
    rules = {(e["scheme"], e["decision"], e["rule"]) for e in log}
    assert ("dns", "deny", "default") in rules
    assert ("transparent", "deny", "name-mismatch") in rules
    assert any(
        e["scheme"] == "transparent"
        and e["host"] == "192.0.2.1"
        and e["decision"] == "deny"
        and e["address"] is None
        for e in log
    )


def test_transparent_explain_shows_the_rules(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    policy(ws, 1234, c)
    r = c.run(["run", "--explain", "--", "true"], cwd=ws)
    if c.who == "user":  # refused with the reason, never silently run without capture
        assert r.returncode == 122 and b"needs root" in r.stderr
        return
    text = r.stdout.decode()
    assert "--unshare-net" not in text  # corral makes the namespace itself
    assert "  capture 127.0.0.1:15001" in text and "  dns 127.0.0.1:53/udp" in text
    assert "nftables: every TCP connection to capture, every DNS query to dns" in text
