"""``corral run --settings`` with srt's settings JSON, on real bwrap, as root and as a user.

Evidence is taken outside the sandbox: the file a command wrote is read on the
host, an origin counts what reached it, and a refused settings file leaves no
trace of a run (no marker file, no activity log line).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Corral
from test_network import CURL, HTTP_PROXY, Origin

TIER = ("--tier", "namespace")


def settings_file(c: Corral, data: object, name: str = "srt.json") -> Path:
    """A settings file outside the workspace, readable by the user under test."""
    path = c.base / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    path.chmod(0o644)
    return path


def run(c: Corral, ws: Path, settings: Path, script: str) -> tuple[int, str, str]:
    r = c.run(["run", "-q", *TIER, "--settings", str(settings), "--", "sh", "-c", script], cwd=ws)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def test_settings_allow_write_lands_and_deny_read_is_refused(
    sandbox: tuple[Corral, Path],
) -> None:
    c, ws = sandbox
    extra, other = c.base / "extra", c.base / "other"
    for d in (extra, other):
        d.mkdir()
    (ws / "private.txt").write_text("s3cret\n")
    (ws / "public.txt").write_text("hello\n")
    if c.who == "user":
        c.chown(extra, other, ws)
    path = settings_file(
        c,
        {
            "network": {"allowedDomains": [], "deniedDomains": []},
            "filesystem": {
                "denyRead": ["private.txt"],
                "allowWrite": [".", str(extra)],
                "denyWrite": [],
            },
        },
    )
    code, out, err = run(
        c,
        ws,
        path,
        f"""
        echo landed > {extra}/out.txt && echo write=ok
        echo no > {other}/out.txt 2>/dev/null || echo other=refused
        cat private.txt 2>/dev/null || echo read=refused
        cat public.txt
        """,
    )
    assert code == 0, err
    assert out.split() == ["write=ok", "other=refused", "read=refused", "hello"]
    assert (extra / "out.txt").read_text() == "landed\n"  # seen from the host
    assert not (other / "out.txt").exists()
    assert "s3cret" not in out


@pytest.fixture
def origins() -> Iterator[tuple[Origin, Origin]]:
    allowed, forbidden = Origin(), Origin()
    try:
        yield allowed, forbidden
    finally:
        allowed.close()
        forbidden.close()


def test_settings_allowed_domains_reach_only_that_origin(
    sandbox: tuple[Corral, Path], origins: tuple[Origin, Origin]
) -> None:
    c, ws = sandbox
    ok, bad = origins
    path = settings_file(
        c,
        {
            "network": {"allowedDomains": [f"127.0.0.1:{ok.port}"], "deniedDomains": []},
            "filesystem": {"denyRead": [], "allowWrite": ["."], "denyWrite": []},
        },
    )
    code, out, err = run(
        c,
        ws,
        path,
        f"""
        {CURL} {HTTP_PROXY} http://127.0.0.1:{ok.port}/hello
        {CURL} {HTTP_PROXY} -o /dev/null -w '%{{http_code}}\\n' http://127.0.0.1:{bad.port}/no
        """,
    )
    assert code == 0, err
    assert out.splitlines() == ["hello from origin", "403"]
    assert ok.hits == [("GET", "/hello")]  # the allow twin
    assert bad.hits == []  # nothing reached the other port


BAD = {
    "unknown key": (
        {"network": {"allowedDomains": []}, "filesystem": {"allowWrite": ["."]}, "sandbox": 1},
        "sandbox: unknown key",
    ),
    "key corral cannot honour": (
        {
            "network": {"allowUnixSockets": ["/run/docker.sock"]},
            "filesystem": {"allowWrite": ["."]},
        },
        "network.allowUnixSockets: not supported: ",
    ),
    "wrong type": (
        {"network": {"allowedDomains": "127.0.0.1"}, "filesystem": {"allowWrite": ["."]}},
        "network.allowedDomains: expected a list of strings",
    ),
    "broken JSON": ('{"filesystem": {"allowWrite": ["."]}', ":1:37: invalid JSON: "),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_settings_are_one_line_exit_2_and_start_nothing(
    sandbox: tuple[Corral, Path], case: str
) -> None:
    c, ws = sandbox
    data, fragment = BAD[case]
    path = settings_file(c, data)
    code, out, err = run(c, ws, path, "touch started")
    assert code == 2
    assert err.startswith(f"corral: {path}") and fragment in err
    assert err.count("\n") == 1 and "Traceback" not in err and out == ""
    assert not (ws / "started").exists()
    assert not (c.state / "corral" / "runs.jsonl").exists()  # no run was recorded
    # the twin: the same command under a good settings file runs
    good = settings_file(c, {"filesystem": {"allowWrite": ["."]}}, "good.json")
    code, _, err = run(c, ws, good, "touch started")
    assert code == 0, err
    assert (ws / "started").exists()
