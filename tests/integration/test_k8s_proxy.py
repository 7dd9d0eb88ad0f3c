"""The proxy Deployment that ``corral k8s render`` writes runs the real ``corral
proxy serve``: its command, with the pod's paths mapped to a temporary directory
and its listen address to loopback, serves the ConfigMap's policy here, allowing
what the policy allows and denying the rest.  (No cluster: the pod is not run.)"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Corral, wait_for
from test_network import Origin

from corral import k8s
from corral import policy as policy_mod


@pytest.fixture
def origins() -> Iterator[tuple[Origin, Origin]]:
    allowed, forbidden = Origin(), Origin()
    try:
        yield allowed, forbidden
    finally:
        allowed.close()
        forbidden.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _here(command: list[str], root: Path, port: int) -> list[str]:
    """The pod's command with its paths under ``root`` and its address on loopback."""
    out = []
    for arg in command:
        if arg.startswith("/"):
            arg = str(root) + arg
        elif arg == f"0.0.0.0:{k8s.PROXY_PORT}":
            arg = f"127.0.0.1:{port}"
        out.append(arg)
    return out


def test_rendered_proxy_serves_the_policy(
    sandbox: tuple[Corral, Path], origins: tuple[Origin, Origin]
) -> None:
    c, ws = sandbox
    ok, bad = origins
    text = f'[network]\nmode = "proxy"\nallow = ["127.0.0.1:{ok.port}"]\n'
    (ws / "corral.toml").write_text(text)
    policy = policy_mod.load(str(ws), str(ws / "corral.toml"))
    objects = k8s.render(policy, text, k8s.Options(image="i", proxy_image="p"))
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (config,) = [o for o in objects if o["kind"] == "ConfigMap" and "policy" in str(o["metadata"])]
    box = deployment["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index]
    # the pod's volumes, here: the ConfigMap's file and the state emptyDir
    root = c.base / "pod"
    (root / k8s.POLICY_DIR.lstrip("/")).mkdir(parents=True)
    (root / k8s.PROXY_STATE.lstrip("/")).mkdir(parents=True)
    for key, value in config["data"].items():  # type: ignore[attr-defined]
        (root / k8s.POLICY_DIR.lstrip("/") / key).write_text(value)
    c.chown(root)
    port = _free_port()
    command = _here(box["command"], root, port)
    assert command[:3] == ["corral", "proxy", "serve"]
    proc = c.popen(command[1:], cwd=ws, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: _listening(port), 10)
        got = subprocess.run(
            [
                "curl",
                "-sS",
                "--noproxy",
                "",
                "-x",
                f"http://127.0.0.1:{port}",
                f"http://127.0.0.1:{ok.port}/k8s",
                f"http://127.0.0.1:{bad.port}/k8s",
            ],
            capture_output=True,
        )
        assert b"hello from origin" in got.stdout and b'"decision":"deny"' in got.stdout
        assert ok.hits == [("GET", "/k8s")] and bad.hits == []
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    # the audit log lands on the state volume, as --net-log says
    log = root / k8s.PROXY_STATE.lstrip("/") / "net.jsonl"
    decisions = sorted(json.loads(line)["decision"] for line in log.read_text().splitlines())
    assert decisions == ["allow", "deny"]
