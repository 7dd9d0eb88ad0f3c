"""Approvals without a sandbox: decisions, grants, the hub's answers, timeout and
expiry, its control socket, the terminal prompt on a pty pair, ask_timeout."""

from __future__ import annotations

import fcntl
import json
import os
import select
import socket
import stat
import termios
import time
from pathlib import Path
from typing import Any

import pytest

from corral import policy as pol
from corral.errors import PolicyError
from corral.net import aio
from corral.net.approvals import (
    AskInfo,
    Decision,
    Grant,
    Hub,
    control_dir,
    list_pending,
    send_answer,
)
from corral.net.asking import format_seconds
from corral.net.audit import Audit
from corral.net.door import may_ask
from corral.net.hooks import Destination, Request
from corral.net.httprules import PathGlob
from corral.net.rules import Verdict
from corral.prompt import TerminalPrompt

ASK = Verdict(False, "network.rules[1]", "a rule asks", ask=True)


class Recorder(Audit):
    def __init__(self) -> None:
        super().__init__(None)
        self.lines: list[dict[str, object]] = []

    def record(self, entry: dict[str, object]) -> None:
        self.lines.append(entry)

    def events(self, kind: str) -> list[dict[str, object]]:
        return [e for e in self.lines if e.get("event") == kind]


def dest() -> Destination:
    return Destination("run1", "https", "api.test", 443)


def req(method: str = "GET", target: str = "/repos/a") -> Request:
    return Request(method, target, [], 0)


def test_decisions_read() -> None:
    assert Decision.read(True).allow and Decision.read(True).seconds is None
    assert not Decision.read(False).allow and not Decision.read(None).allow
    assert not Decision.read("deny").allow and Decision.read("once").allow
    assert Decision.read("10m").seconds == 600 and Decision.read(30).seconds == 30
    assert Decision.allow_for("1h", "/x/**").path == "/x/**"
    assert repr(Decision.allow_for(90)) == "Decision.allow_for(90, path=None)"
    assert Decision(False, 10, "/x").seconds is None  # a deny grants nothing
    for bad in ("soon", object(), -1):
        with pytest.raises(ValueError):
            Decision.read(bad)
    assert [format_seconds(s) for s in (600, 3600, 45, 0.5)] == ["10m", "1h", "45s", "0.5s"]


def test_grant_scope() -> None:
    exact = Grant("g", "api.test", 443, "GET", "/repos/a", None, 1e9, "r")
    assert exact.covers("api.test", 443, "GET", "/repos/a", [("page", "2")])  # query aside
    assert not exact.covers("api.test", 443, "GET", "/repos/b", None)
    assert not exact.covers("api.test", 443, "POST", "/repos/a", None)
    assert not exact.covers("api.test", 8443, "GET", "/repos/a", None)
    assert not exact.covers("other.test", 443, "GET", "/repos/a", None)
    wide = Grant("g", "api.test", 443, "GET", "/repos/a", PathGlob("/repos/**"), 1e9, "r")
    assert wide.covers("api.test", 443, "GET", "/repos/b/c", None)
    assert not wide.covers("api.test", 443, "GET", "/users", None)
    assert wide.scope() == "GET api.test:443/repos/**"


async def _held(hub: Hub, count: int = 1) -> list[str]:
    for _ in range(200):
        if len(hub.pending) >= count:
            return list(hub.pending)
        await aio.sleep(0.005)
    raise AssertionError("nothing held")


def test_hub_allow_deny_and_timeout() -> None:
    async def main() -> None:
        audit = Recorder()
        hub = Hub(audit, "run1", timeout=5)
        task = aio.ensure_future(hub.ask(dest(), req(), ASK))
        (ask_id,) = await _held(hub)
        assert hub.listing()[0]["path"] == "/repos/a"
        assert hub.answer(ask_id, Decision.once(), "test") is None
        allowed = await task
        assert allowed.allowed and allowed.rule == "network.rules[1]"
        assert hub.answer(ask_id, Decision.once(), "test")  # answered already: an error text

        task = aio.ensure_future(hub.ask(dest(), req(), ASK))
        (ask_id,) = await _held(hub)
        hub.answer(ask_id, Decision.deny(), "test")
        denied = await task
        assert not denied.allowed and denied.reason == "ask: denied (test)"

        hub.timeout = 0.05
        late = await hub.ask(dest(), req(), ASK)
        assert not late.allowed and late.reason == "ask: no answer within 0.05s"
        assert not hub.pending
        answers = [e["answer"] for e in audit.events("answer")]
        assert answers == ["once", "deny", "timeout"]
        assert len(audit.events("ask")) == 3
        assert all(e["decision"] == "ask" for e in audit.lines)  # never tallied as denials

    aio.run(main())


def test_hub_grants_cover_expire_and_answer_held_twins() -> None:
    async def main() -> None:
        audit = Recorder()
        hub = Hub(audit, "run1", timeout=5)
        first = aio.ensure_future(hub.ask(dest(), req(), ASK))
        twin = aio.ensure_future(hub.ask(dest(), req(target="/repos/a?x=1"), ASK))
        other = aio.ensure_future(hub.ask(dest(), req("DELETE"), ASK))
        ids = await _held(hub, 3)
        hub.answer(ids[0], Decision(True, 0.2), "test")
        assert (await first).allowed and (await twin).allowed  # the grant answered the twin
        assert not other.done()  # another method: still held
        again = await hub.ask(dest(), req(), ASK)  # answered at once, nobody asked
        assert again.allowed and "grant" in again.reason
        hub.answer(next(iter(hub.pending)), Decision.deny(), "test")
        assert not (await other).allowed
        await aio.sleep(0.3)
        assert audit.events("grant-expired") and not hub.grants
        hub.timeout = 0.05
        assert not (await hub.ask(dest(), req(), ASK)).allowed  # expired: asked again

    aio.run(main())


def test_a_grant_covers_a_request_only_as_all_it_may_be_served_as() -> None:
    """A grant for GET /x let GET /x with X-HTTP-Method-Override: DELETE (or
    ?_method=DELETE) through at once (found by attacking the approvals): a request
    an origin may serve as another method or path is covered only if every one
    of those is, and the person is shown them.  The twin: the same request with
    no override is answered by the grant."""

    async def main() -> None:
        hub = Hub(Recorder(), "run1", timeout=5)
        first = aio.ensure_future(hub.ask(dest(), req(target="/x"), ASK))
        (ask_id,) = await _held(hub)
        hub.answer(ask_id, Decision(True, 60), "test")
        assert (await first).allowed
        plain = await hub.ask(dest(), req(target="/x"), ASK)
        assert plain.allowed and "grant" in plain.reason
        override = Request("GET", "/x", [(b"x-http-method-override", b"DELETE")], 0)
        for held_req in (override, req(target="/x?_method=DELETE")):
            task = aio.ensure_future(hub.ask(dest(), held_req, ASK))
            (ask_id,) = await _held(hub)
            assert hub.listing()[0]["also"] == ["DELETE /x"]
            hub.answer(ask_id, Decision.deny(), "test")
            assert not (await task).allowed

    aio.run(main())


def test_a_grant_for_head_covers_head_and_one_for_get_covers_both() -> None:
    """A HEAD is served with the GET handler (Werkzeug, Starlette, Express, Rails,
    Django), so the rules decide it as a GET too (found by attacking the proxy):
    the person asked about a HEAD is shown that GET.  A grant for HEAD answers
    later HEADs (what was approved, GET handler and all) but never a GET, whose
    body nobody approved; a grant for GET answers a HEAD at once (a GET without
    its body), and a POST whose override names HEAD only with a POST grant too."""

    get_grant = Grant("g", "api.test", 443, "GET", "/x", None, 1e9, "r")
    head_grant = Grant("g", "api.test", 443, "HEAD", "/x", None, 1e9, "r")
    assert get_grant.covers("api.test", 443, "HEAD", "/x", None)
    assert head_grant.covers("api.test", 443, "HEAD", "/x", None)
    assert not head_grant.covers("api.test", 443, "GET", "/x", None)
    assert not get_grant.covers("api.test", 443, "POST", "/x", None)

    async def main() -> None:
        hub = Hub(Recorder(), "run1", timeout=5)
        first = aio.ensure_future(hub.ask(dest(), req("HEAD", "/x"), ASK))
        (ask_id,) = await _held(hub)
        assert hub.listing()[0]["method"] == "HEAD" and hub.listing()[0]["also"] == ["GET /x"]
        hub.answer(ask_id, Decision(True, 60), "test")
        assert (await first).allowed
        again = await hub.ask(dest(), req("head", "/x"), ASK)
        assert again.allowed and "grant" in again.reason
        get = aio.ensure_future(hub.ask(dest(), req("GET", "/x"), ASK))
        (ask_id,) = await _held(hub)  # not covered by the grant for HEAD: held
        hub.answer(ask_id, Decision(True, 60), "test")
        assert (await get).allowed
        head = await hub.ask(dest(), req("HEAD", "/x?page=2"), ASK)
        assert head.allowed and "grant" in head.reason
        get = aio.ensure_future(hub.ask(dest(), req("GET", "/z"), ASK))
        (ask_id,) = await _held(hub)
        hub.answer(ask_id, Decision(True, 60), "test")
        assert (await get).allowed
        head = await hub.ask(dest(), req("HEAD", "/z"), ASK)  # the grant for GET /z
        assert head.allowed and "grant" in head.reason
        override = Request("POST", "/x", [(b"x-http-method-override", b"HEAD")], 0)
        task = aio.ensure_future(hub.ask(dest(), override, ASK))
        (ask_id,) = await _held(hub)  # POST /x is not granted
        assert hub.listing()[0]["also"] == ["HEAD /x", "GET /x"]
        hub.answer(ask_id, Decision.deny(), "test")
        assert not (await task).allowed

    aio.run(main())


def test_a_grant_releases_a_held_request_only_as_it_answers_a_new_one() -> None:
    """Held: B, ``POST /v1/items`` carrying X-HTTP-Method-Override: DELETE, then A,
    a plain ``POST /v1/items``.  Approving A for a duration released B too, and
    the origin ran a DELETE nobody approved (found by attacking the proxy): a
    new grant looked at the request line of the held requests only, while a
    request arriving after it must have everything it may be served as covered.
    B stays held.  Twins: once DELETE /v1/items is granted too, the same held B
    is released by the grant for A; a held HEAD /y by a grant for GET /y."""

    async def main() -> None:
        hub = Hub(Recorder(), "run1", timeout=5)
        override = [(b"x-http-method-override", b"DELETE")]
        b = aio.ensure_future(hub.ask(dest(), Request("POST", "/v1/items", override, 0), ASK))
        (b_id,) = await _held(hub)
        assert hub.listing()[0]["also"] == ["DELETE /v1/items"]
        a = aio.ensure_future(hub.ask(dest(), req("POST", "/v1/items"), ASK))
        a_id = next(i for i in await _held(hub, 2) if i != b_id)
        assert hub.answer(a_id, Decision(True, 600), "test") is None
        assert (await a).allowed
        await aio.sleep(0.01)
        assert not b.done() and list(hub.pending) == [b_id]  # B: still held
        hub.answer(b_id, Decision.deny(), "test")
        assert not (await b).allowed

        hub = Hub(Recorder(), "run1", timeout=5)  # twins
        delete = aio.ensure_future(hub.ask(dest(), req("DELETE", "/v1/items"), ASK))
        (ask_id,) = await _held(hub)
        hub.answer(ask_id, Decision(True, 600), "test")
        assert (await delete).allowed
        b = aio.ensure_future(hub.ask(dest(), Request("POST", "/v1/items", override, 0), ASK))
        (b_id,) = await _held(hub)
        a = aio.ensure_future(hub.ask(dest(), req("POST", "/v1/items"), ASK))
        head = aio.ensure_future(hub.ask(dest(), req("HEAD", "/y"), ASK))
        get = aio.ensure_future(hub.ask(dest(), req("GET", "/y"), ASK))
        held = await _held(hub, 4)
        a_id, head_id, get_id = held[1:]
        hub.answer(a_id, Decision(True, 600), "test")
        assert (await a).allowed
        released = await b
        assert released.allowed and "grant" in released.reason
        assert not head.done()
        hub.answer(get_id, Decision(True, 600), "test")
        assert (await get).allowed
        released = await head
        assert released.allowed and "grant" in released.reason
        assert not hub.pending and head_id not in hub.pending

    aio.run(main())


def test_hub_connect_asks_have_no_path() -> None:
    async def main() -> None:
        hub = Hub(Recorder(), "run1", timeout=5)
        task = aio.ensure_future(hub.ask(dest(), None, ASK))
        (ask_id,) = await _held(hub)
        assert hub.listing()[0]["method"] == "CONNECT" and hub.listing()[0]["path"] == ""
        hub.answer(ask_id, Decision.once(), "t")
        assert (await task).allowed

    aio.run(main())


def test_control_socket_list_answer_and_bad_answers(tmp_path: Path) -> None:
    ctl = tmp_path / "ctl"
    ctl.mkdir(mode=0o700)

    async def main() -> None:
        hub = Hub(Recorder(), "run1", timeout=5)
        await hub.serve_control(str(ctl))
        assert stat.S_IMODE(os.stat(hub.control_path).st_mode) == 0o600
        task = aio.ensure_future(hub.ask(dest(), req(), ASK))
        await _held(hub)
        loop = aio.get_running_loop()
        held = await loop.run_in_executor(None, list_pending, str(ctl))
        assert [(h["run"], h["method"], h["path"]) for h in held] == [("run1", "GET", "/repos/a")]
        ask_id = str(held[0]["id"])
        bad = hub.answer_message({"op": "answer", "id": ask_id, "allow": True, "for": -1}, "t")
        assert bad and "bad duration" in bad
        bad = hub.answer_message(
            {"op": "answer", "id": ask_id, "allow": True, "for": 5, "path": "x"}, "t"
        )
        assert bad and "bad path glob" in bad
        missing = await loop.run_in_executor(
            None, send_answer, str(ctl), "nope", Decision.once(), "t"
        )
        assert missing and "no request 'nope'" in missing
        sent = await loop.run_in_executor(None, send_answer, str(ctl), ask_id, Decision.once(), "t")
        assert sent is None and (await task).allowed
        hub.close()
        assert not os.listdir(ctl)

    aio.run(main())


def test_control_dir_is_ours_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = tmp_path / "made"
    monkeypatch.setenv("CORRAL_CONTROL_DIR", str(made))
    assert control_dir(create=True) == str(made)
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    os.chmod(made, 0o755)  # others can look in: refused, never "fixed" silently
    with pytest.raises(PermissionError, match="not a directory of this user's alone"):
        control_dir()
    link = tmp_path / "link"
    os.chmod(made, 0o700)
    link.symlink_to(made)
    monkeypatch.setenv("CORRAL_CONTROL_DIR", str(link))
    with pytest.raises(PermissionError):
        control_dir()


def test_ask_timeout_in_the_policy(tmp_path: Path) -> None:
    def load(text: str) -> pol.Policy:
        (tmp_path / "corral.toml").write_text('[network]\nmode = "proxy"\n' + text)
        return pol.load(str(tmp_path))

    assert load("").network.ask_timeout == 30
    assert load('ask_timeout = "5s"\n').network.ask_timeout == 5
    assert "ask_timeout" not in load("").to_dict()["network"]  # type: ignore[operator]
    for bad, said in (
        ('"soon"', "bad duration"),
        ("0", "more than zero"),
        ('"2h"', "at most 1h"),
        ("true", "expected a duration"),
    ):
        with pytest.raises(PolicyError, match=said) as exc:
            load(f"ask_timeout = {bad}\n")
        assert "corral.toml:3: network.ask_timeout" in str(exc.value)


def test_ask_timeout_set_in_code_is_checked(tmp_path: Path) -> None:
    policy = pol.Policy(str(tmp_path))
    policy.network.ask_timeout = "2m"  # type: ignore[assignment]
    pol.check_network(policy, python=True)
    assert policy.network.ask_timeout == 120
    policy.network.ask_timeout = -1
    with pytest.raises(PolicyError, match=r"policy\.network\.ask_timeout: bad duration"):
        pol.check_network(policy, python=True)


def test_may_ask(tmp_path: Path) -> None:
    policy = pol.Policy(str(tmp_path))
    assert not may_ask(policy)
    policy.network.rules = [pol._expect_http_rule({"host": "a.test", "action": "ask"})]
    assert may_ask(policy)
    # guardrails: only those whose tier (or own action) asks
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "low.md").write_text("---\nrisk_tier: LOW\nhosts: [a.test]\n---\nbody\n")
    policy = pol.Policy(str(tmp_path))
    policy.guardrails.dirs = [str(guard)]
    assert may_ask(policy)  # not read yet: it may
    pol.check_guardrails(policy)
    assert not may_ask(policy)
    (guard / "high.md").write_text("---\nrisk_tier: HIGH\nhosts: [a.test]\n---\nbody\n")
    policy.guardrails.files = None
    pol.check_guardrails(policy)
    assert may_ask(policy)


# -- the terminal prompt, on a pty pair ----------------------------------------------------


def _read_until(fd: int, needle: bytes) -> bytes:
    seen = b""
    while needle not in seen:
        assert select.select([fd], [], [], 20)[0], seen  # (a loaded machine)
        seen += os.read(fd, 4096)
    return seen


def _ask(hub_end: socket.socket, ask_id: str, path: str) -> None:
    info = {"op": "ask", "id": ask_id, "run": "r", "host": "api.test", "port": 443}
    info |= {"method": "GET", "path": path, "rule": "network.rules[1]", "reason": "x"}
    hub_end.sendall(json.dumps(info).encode() + b"\n")


def test_terminal_prompt_keys_hold_output_and_restore_the_mode() -> None:
    master, slave = os.openpty()
    ours, hub_end = socket.socketpair()
    before = termios.tcgetattr(slave)
    prompt = TerminalPrompt(ours, tty_in=slave, tty_out=slave)
    try:
        _ask(hub_end, "a1", "/one")
        prompt.on_ready(prompt.fd)
        shown = _read_until(master, b"[n] deny ")
        assert b"corral: GET api.test:443/one (network.rules[1]): allow?" in shown
        assert termios.tcgetattr(slave)[3] & termios.ICANON == 0  # one key answers
        assert prompt.holds(slave) and prompt.fds() == (prompt.fd, slave)
        prompt.hold(slave, b"command output\n")  # waits for the prompt to end
        os.write(master, b"x")  # not an answer: ignored
        prompt.on_ready(slave)
        assert prompt.current is not None
        os.write(master, b"f")
        prompt.on_ready(slave)
        answer = json.loads(hub_end.recv(4096))
        assert answer == {
            "op": "answer",
            "id": "a1",
            "allow": True,
            "for": 600.0,
            "path": None,
            "by": "terminal",
        }
        after = _read_until(master, b"command output")
        assert b"allowed for 10m (this method and path)" in after
        assert termios.tcgetattr(slave) == before  # the mode is back
        # a second ask, withdrawn (answered elsewhere): the prompt goes, nothing sent
        _ask(hub_end, "a2", "/two")
        prompt.on_ready(prompt.fd)
        _read_until(master, b"[n] deny ")
        hub_end.sendall(b'{"op":"gone","id":"a2"}\n')
        prompt.on_ready(prompt.fd)
        assert b"answered elsewhere" in _read_until(master, b"in time")
        assert prompt.current is None and termios.tcgetattr(slave) == before
        # a third, denied with n
        _ask(hub_end, "a3", "/three")
        prompt.on_ready(prompt.fd)
        _read_until(master, b"[n] deny ")
        os.write(master, b"n")
        prompt.on_ready(slave)
        assert json.loads(hub_end.recv(4096))["allow"] is False
    finally:
        prompt.close()
        for fd in (master, slave):
            os.close(fd)
        ours.close()
        hub_end.close()


def test_without_a_terminal_each_held_request_is_one_line_naming_the_answers() -> None:
    """No terminal to prompt on: the run used to wait in silence.  Each held request
    is now a line naming corral approve / deny; nothing is answered for the user."""
    read_end, write_end = os.pipe()
    ours, hub_end = socket.socketpair()
    prompt = TerminalPrompt(ours, tty_in=-1, tty_out=write_end, interactive=False)
    try:
        _ask(hub_end, "b1", "/one")
        _ask(hub_end, "b2", "/two")
        prompt.on_ready(prompt.fd)
        said = os.read(read_end, 4096).decode()
        assert said.splitlines() == [
            f"corral: GET api.test:443{path} (network.rules[1]): held; answer with corral "
            f"approve {i} (or corral deny {i}; corral pending lists what waits)"
            for i, path in (("b1", "/one"), ("b2", "/two"))
        ]
        assert prompt.current is None and prompt.fds() == (prompt.fd,)
        hub_end.setblocking(False)
        with pytest.raises(BlockingIOError):  # the twin: no answer was sent
            hub_end.recv(4096)
    finally:
        prompt.close()
        for fd in (read_end, write_end):
            os.close(fd)
        ours.close()
        hub_end.close()


def test_a_guardrails_ask_shows_its_title_and_risk_tier() -> None:
    from corral.prompt import _what

    base = {"id": "x", "run": "r", "host": "api.test", "port": 443, "method": "POST", "path": "/d"}
    guarded = AskInfo(
        {
            **base,
            "rule": "guardrail deploy.md",
            "reason": "ask: POST /d needs approval: Deploys need a person (risk HIGH, version 2)",
        }
    )
    assert _what(guarded) == (
        "POST api.test:443/d (guardrail deploy.md: Deploys need a person (risk HIGH, version 2))"
    )
    # the twin: a rule's ask keeps its rule's name alone
    ruled = AskInfo({**base, "rule": "network.rules[2]", "reason": "a rule asks a person"})
    assert _what(ruled) == "POST api.test:443/d (network.rules[2])"


def test_ask_info_reads_what_the_hub_sends() -> None:
    info = AskInfo({"id": "x", "run": "r", "host": "h", "port": 1, "method": "GET", "path": "/"})
    assert (info.id, info.run_id, info.host, info.port) == ("x", "r", "h", 1)
    assert "GET h:1/" in repr(info)


def _wait_typed(tty: int, count: int, mode: list[Any]) -> None:
    """Until ``count`` typed bytes wait on ``tty`` (counted outside canonical
    mode, where an unfinished line shows), then the mode as it was."""
    raw = list(mode)
    raw[3] = mode[3] & ~termios.ICANON
    deadline = time.monotonic() + 20
    try:
        termios.tcsetattr(tty, termios.TCSANOW, raw)
        while int.from_bytes(fcntl.ioctl(tty, termios.FIONREAD, b"\0" * 4), "little") < count:
            assert time.monotonic() < deadline, "the typed bytes never arrived"
            time.sleep(0.01)
    finally:
        termios.tcsetattr(tty, termios.TCSANOW, mode)


def test_terminal_prompt_leaves_a_half_typed_line_alone() -> None:
    master, slave = os.openpty()
    ours, hub_end = socket.socketpair()
    before = termios.tcgetattr(slave)
    prompt = TerminalPrompt(ours, tty_in=slave, tty_out=slave)
    try:
        os.write(master, b"ls -l")  # typed for the command, Enter not pressed yet
        # a pty hands bytes to its other side a moment later (a kernel work item)
        _wait_typed(slave, 5, before)
        _ask(hub_end, "a1", "/one")
        prompt.on_ready(prompt.fd)
        said = _read_until(master, b"lists what waits)")
        assert b"you are typing, so answer with corral approve a1" in said
        assert prompt.current is None and prompt.fds() == (prompt.fd,)
        assert termios.tcgetattr(slave) == before
        os.write(master, b"\n")
        # the command gets every byte of its line (the mode switch that looked at
        # it may hand it over in two reads, as a pasted line can come)
        got = b""
        while not got.endswith(b"\n"):
            assert select.select([slave], [], [], 5)[0]
            got += os.read(slave, 100)
        assert got == b"ls -l\n"
    finally:
        prompt.close()
        for fd in (master, slave):
            os.close(fd)
        ours.close()
        hub_end.close()
