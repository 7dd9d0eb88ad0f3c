"""Guardrail files in a real run, on every tier with a network, as root and as a
user: curl inside, an HTTPS echo origin on 127.0.0.1 outside, the request
intercepted by the proxy; evidence from what reached the origin and the audit
log.  Bad guardrail input refuses the run before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Corral
from test_net_http_rules import Echo, Https, net_log, write_policy

CURL = "curl -sS --max-time 20 -o /dev/null"


def guardrail(tier: str, method: str, port: int, version: str) -> str:
    return (
        f"---\ntitle: {tier.title()} {method}s\nrisk_tier: {tier}\nversion: {version}\n"
        f"hosts: [127.0.0.1:{port}]\nmethods: [{method}]\npaths: [/api/**]\n---\n"
        f"# {method} on the API\n\nWhat a person should know before a {method}.\n"
    )


def test_guardrail_tiers_decide_intercepted_requests(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    https = Https(c)
    origin = Echo(https.context)
    try:
        port = origin.port
        guard = ws / "guardrails"
        guard.mkdir()
        (guard / "no_deletes.md").write_text(guardrail("CRITICAL", "DELETE", port, "3"))
        (guard / "reads.md").write_text(guardrail("low", "GET", port, "1.2"))
        (guard / "writes.md").write_text(guardrail("High", "PUT", port, "5"))
        write_policy(
            ws,
            c,
            'ask_timeout = "1s"\n'  # the ask: held for an answer nobody gives here
            + https.policy([port])
            + '\n[guardrails]\ndirs = ["guardrails"]\n',
        )
        hashed = c.run(["rules", "hash", "guardrails/reads.md"], cwd=ws)
        assert hashed.returncode == 0, hashed.stderr
        base = f"https://127.0.0.1:{port}"
        r = c.sh(
            ws,
            f"""
            {CURL} -w 'get=%{{http_code}}\\n' {base}/api/items
            {CURL} -w 'delete=%{{http_code}}\\n' -X DELETE {base}/api/items
            {CURL} -w 'put=%{{http_code}}\\n' -X PUT -d x {base}/api/items
            {CURL} -w 'other=%{{http_code}}\\n' -X DELETE {base}/elsewhere
            """,
        )
        out, err = r.stdout.decode(), r.stderr.decode()
        for line in ("get=200", "delete=403", "put=403", "other=200"):
            assert line in out, (line, out, err)
        # the origin saw the allowed twins only
        assert origin.methods() == [("GET", "/api/items"), ("DELETE", "/elsewhere")]
        lines = {(e["method"], e["path"]): e for e in net_log(c) if e.get("scheme") == "https"}
        deleted = lines[("DELETE", "/api/items")]
        assert deleted["decision"] == "deny" and deleted["rule"] == "guardrail no_deletes.md"
        assert deleted["guardrail"]["title"] == "Critical DELETEs"  # type: ignore[index]
        assert deleted["guardrail"]["tier"] == "CRITICAL"  # type: ignore[index]
        assert deleted["guardrail"]["version"] == "3"  # type: ignore[index]
        assert deleted["guardrail"]["hash_state"] == "unhashed"  # type: ignore[index]
        logged = lines[("GET", "/api/items")]
        assert logged["decision"] == "allow" and logged["status"] == 200
        assert logged["guardrail"] == {
            "file": str(guard / "reads.md"),
            "title": "Low GETs",
            "tier": "LOW",
            "version": "1.2",
            "hash": _hash_of(guard / "reads.md"),
            "hash_state": "clean",
            "action": "log",
        }
        asked = lines[("PUT", "/api/items")]
        assert asked["decision"] == "deny" and asked["rule"] == "guardrail writes.md"
        assert "ask: no answer within 1s" in str(asked["reason"])  # held, then denied
        assert asked["guardrail"]["action"] == "ask"  # type: ignore[index]
        assert "guardrail" not in lines[("DELETE", "/elsewhere")]
        assert "blocked: 127.0.0.1" in err and "guardrail no_deletes.md" in err
    finally:
        origin.close()


@pytest.mark.tiers("namespace", why="transparent mode needs the namespace tier")
def test_transparent_mode_enforces_guardrails(tsandbox: tuple[Corral, Path], who: str) -> None:
    c, ws = tsandbox
    if who != "root":
        pytest.skip("transparent mode needs root")
    https = Https(c)
    origin = Echo(https.context)
    try:
        port = origin.port
        guard = ws / "guardrails"
        guard.mkdir()
        text = guardrail("CRITICAL", "DELETE", port, "1").replace("127.0.0.1", "api.test")
        (guard / "no_deletes.md").write_text(text)
        write_policy(ws, c, https.policy([port]) + '\n[guardrails]\ndirs = ["guardrails"]\n')
        base = f"https://api.test:{port}"
        r = c.sh(
            ws,
            f"""
            {CURL} --noproxy '*' -w 'get=%{{http_code}}\\n' {base}/api/items
            {CURL} --noproxy '*' -w 'delete=%{{http_code}}\\n' -X DELETE {base}/api/items
            """,
            "--transparent",
        )
        out, err = r.stdout.decode(), r.stderr.decode()
        assert "get=200" in out and "delete=403" in out, (out, err)
        assert origin.methods() == [("GET", "/api/items")]
        denied = [e for e in net_log(c) if e.get("rule") == "guardrail no_deletes.md"]
        assert denied and denied[0]["guardrail"]["tier"] == "CRITICAL"  # type: ignore[index]
    finally:
        origin.close()


def test_guardrail_files_cannot_be_changed_from_inside(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    guard = ws / "guardrails"
    guard.mkdir()
    text = "---\nrisk_tier: critical\nhosts: [a.test]\nmethods: [DELETE]\n---\n# no\n"
    (guard / "no_deletes.md").write_text(text)
    policy = '[network]\nmode = "proxy"\nallow = ["a.test"]\n[guardrails]\ndirs = ["guardrails"]\n'
    (ws / "corral.toml").write_text(policy)
    c.chown(ws)
    r = c.sh(
        ws,
        """
        cat guardrails/no_deletes.md >/dev/null && echo read=ok
        echo 'risk_tier: low' >> guardrails/no_deletes.md 2>/dev/null && echo edit=WROTE
        rm -f guardrails/no_deletes.md 2>/dev/null && echo rm=WROTE
        echo '# x' > guardrails/new.md 2>/dev/null && echo new=WROTE
        echo code > main.c && echo code=ok
        """,
    )
    out = r.stdout.decode()
    if c.has("mounts"):
        assert "WROTE" not in out, out
    else:  # written during the run, put back after it and reported
        assert f"{guard} (write-deny) was changed" in r.stderr.decode(), r.stderr
    assert "read=ok" in out and "code=ok" in out, out  # the twins
    assert (guard / "no_deletes.md").read_text() == text
    assert not (guard / "new.md").exists()
    assert (ws / "main.c").read_text() == "code\n"


def _hash_of(path: Path) -> str:
    from corral.net.guardrails import parse

    return parse(path.read_text(), str(path)).hash


def test_bad_guardrail_input_refuses_the_run(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    guard = ws / "guardrails"
    guard.mkdir()
    (guard / "ok.md").write_text("---\nrisk_tier: low\nhosts: [a.test]\n---\n# fine\n")
    policy = '[network]\nmode = "proxy"\nallow = ["a.test"]\n[guardrails]\ndirs = ["guardrails"]\n'
    (ws / "corral.toml").write_text(policy)
    c.chown(ws)
    r = c.run(["run", "-q", "--", "touch", "started"], cwd=ws)
    assert r.returncode == 0 and (ws / "started").exists(), r.stderr  # the twin: it runs
    (ws / "started").unlink()
    (guard / "bad.md").write_text("---\ntitle: x\nrisk_tier: high\n  methods: [GET]\n---\n")
    c.chown(ws)
    r = c.run(["run", "-q", "--", "touch", "started"], cwd=ws)
    assert r.returncode == 2 and not (ws / "started").exists()
    assert r.stderr.decode() == (
        f"corral: guardrails: {guard}/bad.md:4: malformed front matter: "
        "nested values are not supported\n"
    )
    (guard / "bad.md").unlink()
    (ws / "corral.toml").write_text(policy + '[guardrails.tiers]\nhigh = "ask"\nsevere = "deny"\n')
    c.chown(ws)
    r = c.run(["run", "-q", "--", "touch", "started"], cwd=ws)
    assert r.returncode == 2 and not (ws / "started").exists()
    assert r.stderr.decode() == (
        f"corral: {ws}/corral.toml:8: guardrails.tiers.severe: unknown tier 'severe' "
        "(known: low, medium, high, critical, null)\n"
    )
