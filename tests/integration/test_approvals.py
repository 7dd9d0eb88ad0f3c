"""Asks answered by a person: the terminal prompt, corral pending/approve/deny,
Sandbox(on_ask=...), grants and the timeout, with a real proxy, real curl
inside, and a real origin on 127.0.0.1 that keeps what reached it.

Each test gets its own control directory (``CORRAL_CONTROL_DIR``) so that runs
of other tests on this machine never show up in its ``corral pending``.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import pty
import select
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Corral, wait_for

from corral import policy as pol
from corral.net.approvals import AskInfo, Decision
from corral.sandbox import AsyncSandbox, Sandbox
from tests.tiers import TierCase

CURL = "curl -sS --noproxy '' --max-time 30 -x \"$HTTP_PROXY\""


class Origin:
    """Answers 200 with the path to every GET, and keeps the paths that reached it."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        origin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                origin.seen.append(self.path)
                body = f"origin {self.path}\n".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def origin() -> Iterator[Origin]:
    server = Origin()
    try:
        yield server
    finally:
        server.close()


def policy_text(port: int, timeout: str = "20s") -> str:
    return f"""[network]
mode = "proxy"
allow = ["127.0.0.1:{port}"]
ask_timeout = "{timeout}"

[[network.rules]]
host = "127.0.0.1:{port}"
methods = ["GET"]
paths = ["/open/**"]
action = "allow"

[[network.rules]]
host = "127.0.0.1:{port}"
methods = ["GET"]
paths = ["/held/**"]
action = "ask"
"""


def setup(c: Corral, ws: Path, port: int, timeout: str = "20s") -> dict[str, str]:
    """The policy in the workspace; the env that gives this test its own control dir."""
    (ws / "corral.toml").write_text(policy_text(port, timeout))
    ctl = c.base / "ctl"
    ctl.mkdir(mode=0o700)
    os.chown(ctl, c.uid, c.gid)
    c.chown(ws)
    return {"CORRAL_CONTROL_DIR": str(ctl)}


def gets(origin: Origin, *paths: str) -> str:
    """A script: one curl per path, each printing ``path=STATUS`` (and any body)."""
    return "\n".join(f"{CURL} -w '\\n{p}=%{{http_code}}\\n' {origin.url(p)}" for p in paths)


def start(c: Corral, ws: Path, script: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``corral run`` without a terminal (stdin /dev/null, output to pipes)."""
    return c.popen(
        ["run", "-q", "--", "sh", "-c", script],
        ws,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def pending(c: Corral, ws: Path, env: dict[str, str]) -> list[dict[str, object]]:
    r = c.run(["pending", "--json"], ws, env=env)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.decode().splitlines()]


def next_pending(c: Corral, ws: Path, env: dict[str, str], path: str) -> dict[str, object]:
    found: list[dict[str, object]] = []

    def held() -> bool:
        found[:] = [p for p in pending(c, ws, env) if p["path"] == path]
        return bool(found)

    assert wait_for(held, 30), f"{path} never held"
    return found[0]


def finish(proc: subprocess.Popen[bytes]) -> tuple[str, str]:
    out, err = proc.communicate(timeout=60)
    return out.decode(), err.decode()


def audit(c: Corral) -> list[dict[str, object]]:
    path = c.state / "corral" / "net.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def events(c: Corral, kind: str) -> list[dict[str, object]]:
    return [e for e in audit(c) if e.get("event") == kind]


# -- corral pending / approve / deny ---------------------------------------------------------------


def test_approve_and_deny_from_another_process(
    tsandbox: tuple[Corral, Path], origin: Origin
) -> None:
    c, ws = tsandbox
    env = setup(c, ws, origin.port)
    proc = start(c, ws, gets(origin, "/open/x", "/held/one", "/held/two"), env)
    one = next_pending(c, ws, env, "/held/one")
    assert one["host"] == "127.0.0.1" and one["port"] == origin.port
    assert one["method"] == "GET" and one["rule"] == "network.rules[2]"
    assert str(one["run"]) and isinstance(one["age"], float)
    assert origin.seen == ["/open/x"]  # held: nothing went upstream yet
    r = c.run(["approve", str(one["id"])], ws, env=env)
    assert r.returncode == 0 and not r.stderr, r.stderr
    assert r.stdout.decode() == f"approved {one['id']}\n"
    two = next_pending(c, ws, env, "/held/two")
    assert c.run(["deny", str(two["id"])], ws, env=env).returncode == 0
    out, err = finish(proc)
    assert "/open/x=200" in out and "/held/one=200" in out, (out, err)
    assert "/held/two=403" in out and "ask: denied (control: corral deny)" in out
    assert "allow?" not in err  # no terminal: no prompt, but a line for each held one
    for held in (one, two):
        line = f"GET 127.0.0.1:{origin.port}{held['path']} (network.rules[2]): held; "
        assert line + f"answer with corral approve {held['id']} (or corral deny " in err, err
    assert "/open/x (" not in err  # the twin: an allowed request is not said
    assert origin.seen == ["/open/x", "/held/one"]
    # answered already: one line, exit 1
    again = c.run(["approve", str(one["id"])], ws, env=env)
    assert again.returncode == 1 and again.stderr.decode().count("\n") == 1
    assert "is waiting" in again.stderr.decode()
    answers = {(e["path"], e["answer"], e["by"]) for e in events(c, "answer")}
    assert answers == {
        ("/held/one", "once", "control: corral approve"),
        ("/held/two", "deny", "control: corral deny"),
    }
    assert {e["path"] for e in events(c, "ask")} == {"/held/one", "/held/two"}
    shown = c.run(["log", "--net", "-n", "50"], ws, env=env).stdout.decode()
    assert "answer once" in shown and "answer deny" in shown


def test_no_answer_is_a_deny(sandbox: tuple[Corral, Path], origin: Origin) -> None:
    c, ws = sandbox
    env = setup(c, ws, origin.port, timeout="1s")
    started = time.monotonic()
    out, err = finish(start(c, ws, gets(origin, "/held/late", "/open/fine"), env))
    assert "/held/late=403" in out and "ask: no answer within 1s" in out, (out, err)
    assert "/open/fine=200" in out  # the twin: the same run's allowed request passes
    assert origin.seen == ["/open/fine"]
    assert time.monotonic() - started < 15
    assert [e["answer"] for e in events(c, "answer")] == ["timeout"]
    denied = [e for e in audit(c) if e.get("decision") == "deny"]
    assert [(e["path"], e["status"]) for e in denied] == [("/held/late", 403)]


def test_a_grant_answers_the_same_request_only(
    sandbox: tuple[Corral, Path], origin: Origin
) -> None:
    c, ws = sandbox
    env = setup(c, ws, origin.port)
    script = gets(origin, "/held/a", "/held/a?page=2", "/held/b")
    proc = start(c, ws, script, env)
    first = next_pending(c, ws, env, "/held/a")
    assert c.run(["approve", "--for", "10m", str(first["id"])], ws, env=env).returncode == 0
    other = next_pending(c, ws, env, "/held/b")  # not covered: asked again
    assert c.run(["deny", str(other["id"])], ws, env=env).returncode == 0
    out, err = finish(proc)
    assert "/held/a=200" in out and "/held/a?page=2=200" in out, (out, err)
    assert "/held/b=403" in out
    assert origin.seen == ["/held/a", "/held/a?page=2"]
    asks = events(c, "ask")
    assert [(e["path"], e.get("answer")) for e in asks] == [
        ("/held/a", None),
        ("/held/a", "grant"),  # asked, answered by the grant: nobody was asked
        ("/held/b", None),
    ]
    (grant,) = events(c, "grant")
    assert grant["scope"] == f"GET 127.0.0.1:{origin.port}/held/a" and grant["for"] == 600


@pytest.mark.slow
def test_a_grant_expires(sandbox: tuple[Corral, Path], origin: Origin) -> None:
    c, ws = sandbox
    env = setup(c, ws, origin.port)
    script = gets(origin, "/held/x/1", "/held/x/2") + "\nsleep 3\n" + gets(origin, "/held/x/3")
    proc = start(c, ws, script, env)
    first = next_pending(c, ws, env, "/held/x/1")
    r = c.run(["approve", "--for", "2s", "--path", "/held/x/**", str(first["id"])], ws, env=env)
    assert r.returncode == 0, r.stderr
    late = next_pending(c, ws, env, "/held/x/3")  # after expiry: asked again
    assert c.run(["deny", str(late["id"])], ws, env=env).returncode == 0
    out, err = finish(proc)
    assert "/held/x/1=200" in out and "/held/x/2=200" in out, (out, err)
    assert "/held/x/3=403" in out
    assert origin.seen == ["/held/x/1", "/held/x/2"]
    (expired,) = events(c, "grant-expired")
    assert expired["scope"] == f"GET 127.0.0.1:{origin.port}/held/x/**"


def test_bad_answers_are_one_line(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    env = {"CORRAL_CONTROL_DIR": str(c.base / "none-yet")}
    for args, code, said in (
        (["approve"], 2, "usage: corral approve"),
        (["approve", "--for", "soon", "x"], 2, "--for: bad duration"),
        (["approve", "--for", "1m", "--path", "no-slash", "x"], 2, "--path: bad path glob"),
        (["approve", "--path", "/x", "x"], 2, "--path: only with --for"),
        (["approve", "feedbeef"], 1, "no request 'feedbeef' is waiting"),
        (["deny", "feedbeef"], 1, "no request 'feedbeef' is waiting"),
        (["pending", "--bogus"], 2, "unknown option --bogus"),
    ):
        r = c.run(args, ws, env=env)
        err = r.stderr.decode()
        assert r.returncode == code and said in err and err.count("\n") == 1, (args, err)
        assert "Traceback" not in err
    r = c.run(["pending"], ws, env=env)
    assert r.returncode == 0 and b"no request is waiting" in r.stderr


# -- who can reach the control socket -------------------------------------------------------------


def _talk(path: str, message: dict[str, object]) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(path)
        sock.sendall(json.dumps(message).encode() + b"\n")
        reply: dict[str, object] = json.loads(sock.makefile("rb").readline())
        return reply


def _as_user_connect(user: Corral, path: str) -> subprocess.CompletedProcess[bytes]:
    code = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_UNIX)\n"
        "try:\n s.connect(sys.argv[1]); print('connected')\n"
        "except OSError as e: print(type(e).__name__)\n"
    )
    return subprocess.run(user.python_argv(["-c", code, path]), capture_output=True, timeout=30)


def test_another_user_cannot_answer(tmp_path: Path, origin: Origin) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to run as two users")
    from conftest import _sandbox

    root_gen, user_gen = _sandbox("root", None), _sandbox("user", None)
    (root, root_ws), (user, user_ws) = next(root_gen), next(user_gen)
    try:
        root_env = setup(root, root_ws, origin.port)
        user_env = setup(user, user_ws, origin.port)
        # root's run: the user can neither list it nor reach its socket
        proc = start(root, root_ws, gets(origin, "/held/root"), root_env)
        held = next_pending(root, root_ws, root_env, "/held/root")
        sock = os.path.join(root_env["CORRAL_CONTROL_DIR"], f"{held['run']}.sock")
        assert _as_user_connect(user, sock).stdout.strip() == b"PermissionError"
        assert pending(user, user_ws, user_env) == []
        r = user.run(["approve", str(held["id"])], user_ws, env=user_env)
        assert r.returncode == 1 and b"is waiting" in r.stderr
        # the same user can (the twin)
        assert root.run(["approve", str(held["id"])], root_ws, env=root_env).returncode == 0
        out, _ = finish(proc)
        assert "/held/root=200" in out

        # the user's run: root reaches the socket (root passes any mode) and is refused
        # by the peer check; the user answers (the twin)
        proc = start(user, user_ws, gets(origin, "/held/user"), user_env)
        held = next_pending(user, user_ws, user_env, "/held/user")
        sock = os.path.join(user_env["CORRAL_CONTROL_DIR"], f"{held['run']}.sock")
        reply = _talk(sock, {"op": "answer", "id": held["id"], "allow": True})
        assert str(reply.get("error", "")).startswith("refused: uid 0 may not answer"), reply
        assert "pending" not in _talk(sock, {"op": "list"})
        r = root.run(["pending"], root_ws, env=user_env)  # root pointed at the user's dir
        assert r.returncode == 122 and b"not a directory of this user's alone" in r.stderr
        assert user.run(["deny", str(held["id"])], user_ws, env=user_env).returncode == 0
        out, _ = finish(proc)
        assert "/held/user=403" in out and "ask: denied (control: corral deny)" in out
        assert [e["reason"] for e in events(user, "control-refused")] == [
            reply["error"],
            f"refused: uid 0 may not answer the requests of uid {user.uid}",
        ]
    finally:
        for gen in (root_gen, user_gen):
            gen.close()


SELF_APPROVE = """
import glob, json, socket, sys
for path in glob.glob(sys.argv[1] + "/*.sock"):
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(3)
        s.connect(path)
        s.sendall(b'{"op":"list"}\\n')
        reply = json.loads(s.makefile("rb").readline())
        for held in reply.get("pending", []):
            s2 = socket.socket(socket.AF_UNIX)
            s2.connect(path)
            s2.sendall(json.dumps({"op": "answer", "id": held["id"], "allow": True}).encode()
                       + b"\\n")
            print("answered", s2.makefile("rb").readline())
        print("reply", reply)
    except OSError as exc:
        print("refused", type(exc).__name__)
print("tried")
"""


def test_the_sandbox_cannot_approve_itself(tsandbox: tuple[Corral, Path], origin: Origin) -> None:
    c, ws = tsandbox
    env = setup(c, ws, origin.port, timeout="4s")
    (ws / "approve.py").write_text(SELF_APPROVE)
    c.chown(ws)
    ctl = env["CORRAL_CONTROL_DIR"]
    script = f"""
    {CURL} -w '\\nheld=%{{http_code}}\\n' {origin.url("/held/self")} &
    sleep 1
    python3 approve.py {ctl} || echo no-python
    wait
    """
    out, err = finish(start(c, ws, script, env))
    assert "tried" in out or "no-python" in out, (out, err)
    # namespace: the socket is visible (read-only) and the peer check refuses it;
    # landlock: no unix socket can be made; containers: the directory is not there
    if "reply" in out:
        assert "refused: the peer runs in another mount namespace (a sandbox)" in out
        assert [e["reason"] for e in events(c, "control-refused")] == [
            "refused: the peer runs in another mount namespace (a sandbox)"
        ]
    assert "answered" not in out and "'pending'" not in out
    assert "held=403" in out and "no answer within 4s" in out
    assert origin.seen == []
    assert [e["answer"] for e in events(c, "answer")] == ["timeout"]


# -- the terminal prompt ------------------------------------------------------------------------


def run_on_pty(c: Corral, ws: Path, script: str, env: dict[str, str], keys: list[bytes]) -> str:
    """``corral run`` on a pseudo-terminal; each prompt gets the next key."""
    argv = c.argv(["run", "-q", "--", "sh", "-c", script])
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.chdir(ws)
        os.execvpe(argv[0], argv, c.env(env))
    seen = b""
    answered = 0
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if not ready:
                continue
            try:
                data = os.read(fd, 4096)
            except OSError:  # EIO: the child side closed
                break
            if not data:
                break
            seen += data
            if seen.count(b"[n] deny") > answered and answered < len(keys):
                os.write(fd, keys[answered])
                answered += 1
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, seen
    return seen.decode("utf-8", "replace").replace("\r\n", "\n")


def test_terminal_prompt_allows_and_denies(sandbox: tuple[Corral, Path], origin: Origin) -> None:
    c, ws = sandbox
    env = setup(c, ws, origin.port)
    script = gets(origin, "/held/yes", "/held/no", "/held/grant", "/held/grant")
    text = run_on_pty(c, ws, script, env, [b"y", b"n", b"f"])
    assert text.count("allow? [y] once  [f] for 10m  [n] deny") == 3, text
    prompt = f"corral: GET 127.0.0.1:{origin.port}/held/yes (network.rules[2]): allowed once"
    assert prompt in text
    assert "/held/yes=200" in text
    assert "/held/no=403" in text and "ask: denied (terminal)" in text
    assert "allowed for 10m (this method and path)" in text
    assert text.count("/held/grant=200") == 2  # the second one: by the grant, no prompt
    assert origin.seen == ["/held/yes", "/held/grant", "/held/grant"]
    assert [(e["path"], e["answer"], e["by"]) for e in events(c, "answer")] == [
        ("/held/yes", "once", "terminal"),
        ("/held/no", "deny", "terminal"),
        ("/held/grant", "for", "terminal"),
    ]
    # while the prompt was up, the answer by corral approve works too: covered by
    # the control socket tests; here, nothing is left waiting
    assert pending(c, ws, env) == []


def test_prompt_withdrawn_when_answered_elsewhere(
    sandbox: tuple[Corral, Path], origin: Origin
) -> None:
    c, ws = sandbox
    env = setup(c, ws, origin.port)
    answered: list[int] = []

    def approve_from_outside() -> None:
        held = next_pending(c, ws, env, "/held/elsewhere")
        answered.append(c.run(["approve", str(held["id"])], ws, env=env).returncode)

    helper = threading.Thread(target=approve_from_outside)
    helper.start()
    text = run_on_pty(c, ws, gets(origin, "/held/elsewhere"), env, [])
    helper.join()
    assert answered == [0]
    assert "allow? [y] once" in text and "answered elsewhere, or no answer in time" in text
    assert "/held/elsewhere=200" in text and origin.seen == ["/held/elsewhere"]


# -- Sandbox(on_ask=...) -------------------------------------------------------------------------


@pytest.fixture
def api_ws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("the in-process API tests run as root (tests/integration/test_sandbox_api.py)")
    from conftest import ROOT_BASE

    base = ROOT_BASE / ("ask-" + os.urandom(5).hex())
    ws = base / "ws"
    ws.mkdir(parents=True)
    (base / "home").mkdir()
    (base / "state").mkdir()
    (base / "ctl").mkdir(mode=0o700)
    monkeypatch.setenv("HOME", str(base / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(base / "state"))
    monkeypatch.setenv("CORRAL_CONTROL_DIR", str(base / "ctl"))
    try:
        yield ws
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def api_policy(ws: Path, origin: Origin) -> pol.Policy:
    """The policy of :func:`policy_text`, built in code as a Python caller would."""
    policy = pol.load(str(ws))
    net = policy.network
    net.mode = "proxy"
    net.allow = [f"127.0.0.1:{origin.port}"]
    net.ask_timeout = 20.0
    net.rules = [
        pol._expect_http_rule(
            {"host": f"127.0.0.1:{origin.port}", "methods": ["GET"], "paths": [p], "action": a}
        )
        for p, a in (("/open/**", "allow"), ("/held/**", "ask"))
    ]
    return policy


def test_sandbox_on_ask_sync(api_ws: Path, tier: TierCase, origin: Origin) -> None:
    policy = api_policy(api_ws, origin)
    asked: list[AskInfo] = []

    def on_ask(info: AskInfo) -> Decision:
        asked.append(info)
        return Decision.once() if info.path == "/held/yes" else Decision.deny()

    with Sandbox(policy, on_ask=on_ask, **tier.api) as sb:
        r = sb.exec(gets(origin, "/held/yes", "/held/no", "/open/x"))
    out = r.stdout.decode()
    assert "/held/yes=200" in out and "/held/no=403" in out and "/open/x=200" in out, out
    assert "ask: denied (on_ask)" in out
    assert origin.seen == ["/held/yes", "/open/x"]
    assert [(a.method, a.host, a.port, a.path, a.rule) for a in asked] == [
        ("GET", "127.0.0.1", origin.port, "/held/yes", "network.rules[2]"),
        ("GET", "127.0.0.1", origin.port, "/held/no", "network.rules[2]"),
    ]
    assert asked[0].reason and asked[0].id and asked[0].run_id == sb.run_id


def test_sandbox_on_ask_raising_denies(api_ws: Path, tier: TierCase, origin: Origin) -> None:
    policy = api_policy(api_ws, origin)

    def on_ask(info: AskInfo) -> object:
        if info.path == "/held/boom":
            raise RuntimeError("no opinion")
        return True

    with Sandbox(policy, on_ask=on_ask, **tier.api) as sb:
        r = sb.exec(gets(origin, "/held/boom", "/held/fine"))
        errors = list(sb.errors)
    out = r.stdout.decode()
    assert "/held/boom=403" in out and "/held/fine=200" in out, out
    assert errors == ["on_ask: RuntimeError: no opinion (the request was denied)"]
    assert origin.seen == ["/held/fine"]


def test_async_sandbox_on_ask(api_ws: Path, tier: TierCase, origin: Origin) -> None:
    policy = api_policy(api_ws, origin)
    asked: list[str] = []

    async def on_ask(info: AskInfo) -> object:
        asked.append(info.path)
        await asyncio.sleep(0.05)
        return "10m" if info.path == "/held/a" else False

    def slow_sync(info: AskInfo) -> object:
        time.sleep(0.5)  # a blocking function: must not block the loop
        return Decision.once()

    async def main() -> tuple[str, str, float]:
        async with AsyncSandbox(policy, on_ask=on_ask, **tier.api) as sb:
            r = await sb.exec(gets(origin, "/held/a", "/held/a", "/held/b"))
        async with AsyncSandbox(api_policy(api_ws, origin), on_ask=slow_sync, **tier.api) as sb:
            gap = 0.0

            async def tick() -> None:
                nonlocal gap
                last = time.monotonic()
                while True:
                    await asyncio.sleep(0.01)
                    now = time.monotonic()
                    gap, last = max(gap, now - last), now

            ticker = asyncio.get_running_loop().create_task(tick())
            r2 = await sb.exec(gets(origin, "/held/slow"))
            ticker.cancel()
        return r.stdout.decode(), r2.stdout.decode(), gap

    out, out2, gap = asyncio.run(main())
    assert out.count("/held/a=200") == 2 and "/held/b=403" in out, out
    assert asked == ["/held/a", "/held/b"]  # the second /held/a: by the grant
    assert "/held/slow=200" in out2
    assert gap < 0.3  # the loop kept running while the sync answer slept 0.5 s
    assert origin.seen == ["/held/a", "/held/a", "/held/slow"]


def test_sandbox_without_on_ask_waits_for_corral_approve(
    api_ws: Path, tier: TierCase, origin: Origin
) -> None:
    import sys

    def answer(command: str, path: str, *flags: str) -> None:
        found: list[dict[str, object]] = []

        def held() -> bool:
            r = subprocess.run(
                [sys.executable, "-P", "-m", "corral", "pending", "--json"], capture_output=True
            )
            found[:] = [json.loads(x) for x in r.stdout.decode().splitlines()]
            return any(f["path"] == path for f in found)

        assert wait_for(held, 30)
        ask_id = next(str(f["id"]) for f in found if f["path"] == path)
        done = subprocess.run([sys.executable, "-P", "-m", "corral", command, *flags, ask_id])
        assert done.returncode == 0

    with Sandbox(api_policy(api_ws, origin), **tier.api) as sb:
        proc = sb.spawn(gets(origin, "/held/one", "/held/two"))
        answer("approve", "/held/one")
        answer("deny", "/held/two")
        out = proc.wait(timeout=60).stdout.decode()
    assert "/held/one=200" in out and "/held/two=403" in out, out
    assert origin.seen == ["/held/one"]


def test_a_guardrail_ask_is_answered_too(sandbox: tuple[Corral, Path], origin: Origin) -> None:
    c, ws = sandbox
    env = setup(c, ws, origin.port)
    guard = c.base / "guardrails"
    guard.mkdir()
    (guard / "deploys.md").write_text(
        "---\ntitle: Deploys\nrisk_tier: HIGH\nversion: 1\n"
        f"hosts: [127.0.0.1:{origin.port}]\nmethods: [GET]\npaths: [/deploy/**]\n---\n"
        "# Deploys\n\nA person looks first.\n"
    )
    c.chown(guard)
    with (ws / "corral.toml").open("a") as fh:
        fh.write(
            f'\n[[network.rules]]\nhost = "127.0.0.1:{origin.port}"\npaths = ["/deploy/**"]\n'
            f'action = "allow"\n\n[guardrails]\ndirs = ["{guard}"]\n'
        )  # the rules allow it; the guardrail (HIGH: ask) holds it for an answer
    proc = start(c, ws, gets(origin, "/deploy/yes", "/deploy/no"), env)
    held = next_pending(c, ws, env, "/deploy/yes")
    assert held["rule"] == "guardrail deploys.md"
    assert c.run(["approve", str(held["id"])], ws, env=env).returncode == 0
    held = next_pending(c, ws, env, "/deploy/no")
    assert c.run(["deny", str(held["id"])], ws, env=env).returncode == 0
    out, err = finish(proc)
    assert "/deploy/yes=200" in out and "/deploy/no=403" in out, (out, err)
    assert origin.seen == ["/deploy/yes"]


@pytest.mark.tiers("namespace", why="only a namespace sandbox can be reset between jobs")
def test_a_request_its_job_left_held_is_denied_at_the_reset(
    api_ws: Path, tier: TierCase, origin: Origin
) -> None:
    """A job left a request held (its curl in the background) and ended; approved
    while the next job ran, it went out, tagged as that job's.  The reset now
    denies what its job left held.  The twin: the next job's own ask, approved,
    passes."""
    import threading

    release = threading.Event()
    asked: list[str] = []

    def on_ask(info: AskInfo) -> Decision:
        asked.append(info.path)
        release.wait(20)  # answered late: after the job that asked has ended
        return Decision.once()

    with Sandbox(api_policy(api_ws, origin), on_ask=on_ask, **tier.api) as sb:
        left = f"({CURL} {origin.url('/held/left')} >/dev/null 2>&1 &); sleep 1; echo ended"
        assert sb.exec_alone(left).stdout == b"ended\n"
        assert asked == ["/held/left"]  # it was held when its job ended
        release.set()
        twin = sb.exec_alone(gets(origin, "/held/next"))
    assert b"/held/next=200" in twin.stdout, twin.stdout
    assert origin.seen == ["/held/next"]  # the left one never went out


@pytest.mark.tiers("namespace", why="only a namespace sandbox can be reset between jobs")
def test_a_reset_drops_the_grants_one_job_was_given(
    api_ws: Path, tier: TierCase, origin: Origin
) -> None:
    """A grant lives in the run's proxy, which a warm sandbox keeps between jobs
    (corral batch --reuse): each job is asked afresh.  The twin: within a job the
    grant answers the same request at once."""
    asked: list[str] = []

    def on_ask(info: AskInfo) -> Decision:
        asked.append(info.path)
        return Decision.allow_for(600)

    with Sandbox(api_policy(api_ws, origin), on_ask=on_ask, **tier.api) as sb:
        jobs = [sb.exec_alone(gets(origin, "/held/a", "/held/a")) for _ in range(2)]
        sb.reset()
        jobs.append(sb.exec(gets(origin, "/held/a")))
    got = [job.stdout.decode().count("/held/a=200") for job in jobs]
    assert got == [2, 2, 1], [job.stdout for job in jobs]
    assert asked == ["/held/a"] * 3  # once per job: the second GET of a job used its grant
    assert origin.seen == ["/held/a"] * 5
