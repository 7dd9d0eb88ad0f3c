"""corral's own agent runtime (corral.runtime) with real parts: a real sandbox
for every tool call, a real proxy and origins on 127.0.0.1 for the network, an
OpenAI-compatible model server on 127.0.0.1 driven through the real client
(corral.brain.ChatBrain) and through ``corral agent``, and the scripted brain
in-process.

The in-process tests run as root (as tests/integration/test_sandbox_api.py);
the CLI tests run as root and as the unprivileged user.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from conftest import ROOT_BASE, Corral
from test_approvals import Origin

from corral import policy as pol
from corral.brain import ChatBrain, Reply, ScriptedBrain, ToolCall, call
from corral.errors import CorralError
from corral.runtime import Answer, Event, FileWatch, Runtime, StdinLines, Timer, Webhook
from corral.tools import TOOLS
from tests.model_server import ModelServer, completion
from tests.tiers import TierCase

KEY = "sk-test-" + "k" * 24  # the model's key: it must reach the model server, never the sandbox


@pytest.fixture
def api_ws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("the in-process runtime tests run as root (the CLI tests run as the user)")
    base = ROOT_BASE / ("rt-" + uuid.uuid4().hex[:10])
    for d in ("ws", "home/.ssh", "state", "ctl"):
        (base / d).mkdir(parents=True, mode=0o700)
    (base / "home" / ".ssh" / "id_rsa").write_text("PRIVATE KEY\n")
    monkeypatch.setenv("HOME", str(base / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(base / "state"))
    monkeypatch.setenv("CORRAL_CONTROL_DIR", str(base / "ctl"))
    try:
        yield base / "ws"
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def origin() -> Iterator[Origin]:
    """An origin on 127.0.0.1 answering 200 with the path (and keeping the paths)."""
    server = Origin()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def model() -> Iterator[ModelServer]:
    server = ModelServer()
    try:
        yield server
    finally:
        server.close()


def log_of(ws: Path) -> list[dict[str, Any]]:  # activity.jsonl, as JSON
    path = ws.parent / "agent" / "activity.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def tool_records(ws: Path) -> list[dict[str, Any]]:
    return [r for r in log_of(ws) if r["kind"] == "tool"]


def run_one(
    brain: object, policy: pol.Policy, ws: Path, task: str, **kw: object
) -> tuple[Answer, Runtime]:
    async def go() -> tuple[Answer, Runtime]:
        rt = Runtime(brain, policy, directory=ws.parent / "agent", **kw)  # type: ignore[arg-type]
        async with rt:
            answer = await rt.fire(Event("task", task))
        return answer, rt

    return asyncio.run(go())


def turn(*calls: object, content: str | None = None) -> Reply:
    return Reply(content, list(calls), "tool_calls")  # type: ignore[arg-type]


# -- the loop -------------------------------------------------------------------------------------


def test_a_task_writes_a_file_and_runs_its_test(api_ws: Path, tier: TierCase) -> None:
    brain = ScriptedBrain(
        [
            turn(call("write_file", path="greet.txt", content="hello\n")),
            turn(
                call("write_file", path="check.sh", content='[ "$(cat greet.txt)" = hello ]\n'),
                call("run_command", command="sh check.sh && echo PASS"),
            ),
            Reply("greet.txt says hello; the check passes"),
        ]
    )
    answer, _ = run_one(brain, pol.load(str(api_ws)), api_ws, "write greet.txt", **tier.api)
    assert answer == Answer("greet.txt says hello; the check passes", "stop", 3)
    assert (api_ws / "greet.txt").read_text() == "hello\n"
    # the model saw the sandbox described, the tool schemas' results, and PASS
    system = brain.seen[0][0]
    assert system["role"] == "system" and "corral sandbox" in str(system["content"])
    last_tool = brain.seen[-1][-1]
    assert last_tool["role"] == "tool" and '"stdout": "PASS\\n"' in str(last_tool["content"])
    kinds = [r["kind"] for r in log_of(api_ws)]
    assert kinds == [
        "start",
        "memory",
        "wake",
        "model",
        "tool",
        "model",
        "tool",
        "tool",
        "model",
        "answer",
        "stop",
    ]
    run = tool_records(api_ws)[-1]
    assert run["name"] == "run_command" and run["exit_code"] == 0 and run["error"] is None
    assert isinstance(run["seconds"], float) and run["denials"] == []


def test_refusals_are_tool_errors_and_the_loop_goes_on(api_ws: Path, origin: Origin) -> None:
    other = Origin()  # a host the policy does not allow
    try:
        policy = pol.load(str(api_ws))
        policy.network.mode = "proxy"
        policy.network.allow = [f"127.0.0.1:{origin.port}"]
        curl = "curl -sS --noproxy '' --max-time 20 -x \"$HTTP_PROXY\" -w ' status=%{http_code}' "
        secret = str(Path(os.environ["HOME"]) / ".ssh" / "id_rsa")
        (api_ws / "notes.txt").write_text("mine\n")
        brain = ScriptedBrain(
            [
                turn(call("read_file", path=secret)),
                turn(call("read_file", path="notes.txt")),  # the allowed twin
                turn(call("run_command", command=curl + other.url("/denied"))),
                turn(call("run_command", command=curl + origin.url("/open"))),  # its twin
                Reply("done"),
            ]
        )
        answer, _ = run_one(brain, policy, api_ws, "look around", tier="namespace")
    finally:
        other.close()
    assert answer.finish == "stop" and answer.text == "done"
    ssh, notes, denied, allowed = tool_records(api_ws)
    assert str(ssh["error"]).startswith("denied by the sandbox's policy: ")
    assert ssh["denials"] == [ssh["error"]]
    assert notes["error"] is None and notes["denials"] == []
    assert denied["exit_code"] == 0 and denied["error"]
    (reason,) = denied["denials"]
    assert reason.startswith("denied by the sandbox's policy (") and f":{other.port}" in reason
    assert allowed["error"] is None and allowed["denials"] == []
    # what the model read back: corral's reason for the refusals, the data for the twins
    results = [m["content"] for m in brain.seen[-1] if m["role"] == "tool"]
    assert str(results[0]).startswith("error: denied by the sandbox's policy")
    assert results[1] == "mine\n"
    assert str(results[2]).startswith("error: denied by the sandbox's policy (")
    assert "status=200" in str(results[3]) and "origin /open" in str(results[3])
    assert other.seen == [] and origin.seen == ["/open"]


def test_bad_tool_calls_are_tool_errors(api_ws: Path) -> None:
    brain = ScriptedBrain(
        [
            Reply(None, [call("no_such_tool", x=1)], "tool_calls"),
            Reply(None, [call("run_command", cmd="ls")], "tool_calls"),
            Reply(None, [call("run_command", command=["ls"])], "tool_calls"),
            turn(call("process_output", id=99)),
            turn(call("run_command", command="sleep 5", timeout=0.3)),
            turn(call("run_command", command="exit 3")),  # the good twin: a result, not an error
            Reply("ok"),
        ]
    )
    brain.turns.insert(3, turn(ToolCall("call_raw", "write_file", "{not json")))
    answer, _ = run_one(brain, pol.load(str(api_ws)), api_ws, "bad calls", tier="namespace")
    assert answer.finish == "stop"
    errors = [r["error"] for r in tool_records(api_ws)]
    assert str(errors[0]).startswith("unknown tool 'no_such_tool' (tools: run_command,")
    assert errors[1:] == [
        "run_command: missing argument command",
        "run_command: command must be string",
        "write_file: arguments are not JSON: '{not json'",
        "no background process with id 99",
        errors[-2],
        None,
    ]
    assert str(errors[-2]).startswith("timed out after 0.3")
    assert "corral stopped the command and everything it started" in str(errors[-2])
    assert tool_records(api_ws)[-1]["exit_code"] == 3


def test_max_turns_stops_a_model_that_never_finishes(api_ws: Path) -> None:
    forever = [turn(call("run_command", command="true")) for _ in range(50)]
    brain = ScriptedBrain(forever)
    answer, _ = run_one(brain, pol.load(str(api_ws)), api_ws, "loop", tier="namespace", max_turns=3)
    assert answer.finish == "max_turns" and answer.turns == 3
    assert answer.error == "stopped after max_turns=3 turns without a final answer"
    records = log_of(api_ws)
    assert [r["kind"] for r in records].count("model") == 3
    assert {"kind": "error", "where": "max_turns", "message": answer.error}.items() <= records[
        -3
    ].items()
    assert len(brain.turns) == 47  # asked exactly three times


def test_history_and_listeners(api_ws: Path) -> None:
    """Two events through the queue: the timer's and a line on a pipe; the
    second event's turn sees the first one's messages."""
    read_fd, write_fd = os.pipe()
    brain = ScriptedBrain([Reply("first"), Reply("second")])

    async def go() -> list[str]:
        rt = Runtime(
            brain,
            pol.load(str(api_ws)),
            directory=api_ws.parent / "agent",
            tier="namespace",
            listeners=[Timer(0.2, "tick"), StdinLines(read_fd)],
        )
        async with rt:
            os.write(write_fd, b"a line from stdin\n\n")
            for _ in range(100):
                if len([r for r in log_of(api_ws) if r["kind"] == "answer"]) >= 2:
                    break
                await asyncio.sleep(0.05)
        return [str(r["text"]) for r in log_of(api_ws) if r["kind"] == "wake"]

    try:
        woke = asyncio.run(go())
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert set(woke[:2]) == {"tick", "a line from stdin"}
    second = brain.seen[1]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert log_of(api_ws)[-1]["kind"] == "stop"


# -- the real client against a model server on loopback -------------------------------------------


def test_chat_client_drives_the_loop_and_keeps_the_key_out(
    api_ws: Path, model: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # in the runtime's environment, on the host
    model.script = [
        completion(calls=[("write_file", {"path": "a.txt", "content": "x"})]),
        completion(calls=[("run_command", {"command": "env; cat a.txt"})]),
        completion("finished", usage={"prompt_tokens": 7, "completion_tokens": 2}),
    ]
    brain = ChatBrain(model.url, "test-model", KEY)
    answer, _ = run_one(brain, pol.load(str(api_ws)), api_ws, "write a.txt", tier="namespace")
    assert answer == Answer("finished", "stop", 3)
    first = model.requests[0]
    assert first["path"] == "/v1/chat/completions"
    assert first["headers"]["authorization"] == f"Bearer {KEY}"  # type: ignore[index]
    body = first["body"]
    assert body["model"] == "test-model"  # type: ignore[index]
    assert [t["function"]["name"] for t in body["tools"]] == list(TOOLS)  # type: ignore[index]
    assert "corral sandbox" in body["messages"][0]["content"]  # type: ignore[index]
    env_out = model.requests[2]["body"]["messages"][-1]["content"]  # type: ignore[index]
    assert "CORRAL_SANDBOX=1" in env_out and "x" in env_out  # the command ran inside
    assert KEY not in env_out and "OPENAI_API_KEY" not in env_out
    usage = [r["usage"] for r in log_of(api_ws) if r["kind"] == "model"]
    assert usage[-1] == {"prompt_tokens": 7, "completion_tokens": 2}


@pytest.mark.parametrize(
    "answer_with, error",
    [
        (b"this is not json", "malformed model response (not JSON): 'this is not json'"),
        ({"choices": []}, 'malformed model response: {"choices": []}'),
        ((500, {"error": "overloaded"}), 'answered 500: {"error": "overloaded"}'),
    ],
    ids=["not-json", "no-choices", "status-500"],
)
def test_a_bad_model_answer_ends_the_event_in_the_log(
    api_ws: Path, model: ModelServer, answer_with: object, error: str
) -> None:
    model.script = [completion(calls=[("run_command", {"command": "true"})]), answer_with]  # type: ignore[list-item]
    brain = ChatBrain(model.url, "m")
    answer, _ = run_one(brain, pol.load(str(api_ws)), api_ws, "x", tier="namespace")
    assert answer.finish == "error" and error in str(answer.error)
    err = [r for r in log_of(api_ws) if r["kind"] == "error"]
    assert len(err) == 1 and err[0]["where"] == "model" and error in str(err[0]["message"])
    assert tool_records(api_ws)[0]["exit_code"] == 0  # the good first turn ran


def test_an_unreachable_model_server(api_ws: Path, model: ModelServer) -> None:
    url = model.url
    model.close()
    answer, _ = run_one(ChatBrain(url, "m"), pol.load(str(api_ws)), api_ws, "x", tier="namespace")
    assert answer.finish == "error"
    assert str(answer.error).startswith(f"model server {url}/chat/completions unreachable: ")
    assert log_of(api_ws)[3]["where"] == "model"


def fetch_turns(url: str) -> list[Reply]:
    curl = "curl -sS --noproxy '' --max-time 20 -x \"$HTTP_PROXY\" -w ' status=%{http_code}' "
    return [turn(call("run_command", command=curl + url)), Reply("done")]


@pytest.mark.parametrize("decide", [None, True], ids=["no-callback-denies", "callback-allows"])
def test_network_asks_reach_the_approval_callback(
    api_ws: Path, origin: Origin, decide: bool | None
) -> None:
    policy = pol.load(str(api_ws))
    net = policy.network
    net.mode = "proxy"
    net.allow = [f"127.0.0.1:{origin.port}"]
    net.ask_timeout = 20.0
    net.rules = [
        pol._expect_http_rule(
            {"host": f"127.0.0.1:{origin.port}", "paths": ["/held/**"], "action": "ask"}
        )
    ]
    asked: list[object] = []

    def on_ask(info: object) -> bool:
        asked.append(info)
        return bool(decide)

    brain = ScriptedBrain(fetch_turns(origin.url("/held/x")))
    answer, _ = run_one(
        brain,
        policy,
        api_ws,
        "fetch",
        tier="namespace",
        on_ask=on_ask if decide is not None else None,
    )
    assert answer.text == "done"
    out = str(brain.seen[-1][-1]["content"])
    asks = [r for r in log_of(api_ws) if r["kind"] == "ask"]
    assert len(asks) == 1
    if decide:
        assert "status=200" in out and origin.seen == ["/held/x"] and len(asked) == 1
        assert asks[0]["decision"] == "allow"
    else:
        assert "status=403" in out and origin.seen == []
        assert asks[0]["decision"] == "deny" and asks[0]["why"] == "no approval callback"


def test_the_agents_own_directory_is_never_the_sandboxs(api_ws: Path) -> None:
    """Inside the workspace, the sandbox linked the memory to /etc/shadow (read on the
    host by read_memory), rewrote config.toml's base_url (the key went to another
    server) and swapped the directory for a link (the log went anywhere)."""
    policy = pol.load(str(api_ws))
    for inside in (api_ws / ".agent", api_ws.parent):  # in it, or holding it
        with pytest.raises(CorralError, match="overlaps the sandbox's writable place"):
            asyncio.run(Runtime(ScriptedBrain([]), policy, directory=inside).start())
    answer, _ = run_one(ScriptedBrain([Reply("ok")]), policy, api_ws, "x", tier="namespace")
    assert answer.text == "ok"  # the twin: beside the workspace (run_one's)


def test_the_key_is_never_passed_into_the_sandbox(api_ws: Path) -> None:
    policy = pol.load(str(api_ws))
    policy.env.pass_names.append("OPENAI_API_KEY")
    with pytest.raises(Exception, match="keeps the model's key on the host"):
        run_one(ScriptedBrain([]), policy, api_ws, "x", tier="namespace")


# -- one tool registry for both faces --------------------------------------------------------------


def test_mcp_serves_the_same_tools(api_ws: Path) -> None:
    mcp = pytest.importorskip("mcp", reason="the mcp SDK is part of the dev extra")
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.types import TextContent, Tool

    params = StdioServerParameters(
        command=sys.executable,
        args=["-P", "-m", "corral", "mcp", "-q", "--workspace", str(api_ws)],
        env={
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": os.environ["HOME"],
            "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
            "XDG_STATE_HOME": os.environ["XDG_STATE_HOME"],
        },
    )

    async def go() -> list[Tool]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            tools = (await s.list_tools()).tools
            bad = await s.call_tool("run_command", {"cmd": "x"})
            assert (
                bad.is_error
                and "missing argument command" in cast(TextContent, bad.content[0]).text
            )
            return list(tools)

    served = asyncio.run(go())
    assert mcp is not None
    # the runtime offers the same sandbox tools, and read_memory (its own index, on the host)
    schemas: list[dict[str, Any]] = Runtime(ScriptedBrain([]), directory=api_ws).tools  # JSON
    runtime_side = {t["function"]["name"]: t["function"] for t in schemas}
    assert [t.name for t in served] == [n for n in runtime_side if n != "read_memory"]
    assert list(runtime_side)[-1] == "read_memory"
    for t in served:
        fn = runtime_side[t.name]
        assert t.input_schema == fn["parameters"] and t.description == fn["description"]


# -- corral agent, as root and as the user ---------------------------------------------------------


def agent(
    c: Corral, ws: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return c.run(["agent", *args], cwd=ws, env=env, timeout=90)


def test_cli_agent_run_and_log(sandbox: tuple[Corral, Path], model: ModelServer) -> None:
    c, ws = sandbox
    model.script = [
        completion(calls=[("write_file", {"path": "out.txt", "content": "42\n"})]),
        completion(calls=[("run_command", {"command": "test $(cat out.txt) = 42 && echo PASS"})]),
        completion("wrote out.txt; PASS"),
    ]
    d = str(c.state / "corral" / "agents" / "default")  # the default: no --dir
    r = agent(
        c,
        ws,
        "run",
        "-q",
        "--tier",
        "namespace",
        "--task",
        "write out.txt",
        "--base-url",
        model.url,
        "--model",
        "m",
        "--dir",
        d,
        env={"CORRAL_AGENT_API_KEY": KEY},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"wrote out.txt; PASS\n" and r.stderr == b""
    assert (ws / "out.txt").read_text() == "42\n"
    assert model.requests[0]["headers"]["authorization"] == f"Bearer {KEY}"  # type: ignore[index]
    shown = agent(c, ws, "log", "--dir", d)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout.decode()
    for piece in (
        "wake",
        "task: write out.txt",
        "calls write_file",
        "run_command",
        "exit 0",
        "stop after 3 turns",
    ):
        assert piece in text, text
    raw = agent(c, ws, "log", "--dir", d, "--json", "-n", "2")
    assert [json.loads(x)["kind"] for x in raw.stdout.decode().splitlines()] == ["answer", "stop"]


@pytest.mark.parametrize(
    "case, code, line",
    [
        ("unreachable", 3, "corral: agent: model server http://127.0.0.1:"),
        ("malformed", 3, "corral: agent: malformed model response"),
        ("max-turns", 1, "corral: agent: stopped after max_turns=2 turns without a final answer"),
        ("no-model", 2, "corral: no model: give --model, or set CORRAL_AGENT_MODEL"),
        ("bad-turns", 2, "corral: --max-turns needs a whole number, 1 or more"),
        ("key-passed", 2, "corral: the policy passes OPENAI_API_KEY into the sandbox;"),
        ("dir-inside", 2, "corral: the agent's directory "),
    ],
    ids=[
        "unreachable",
        "malformed",
        "max-turns",
        "no-model",
        "bad-turns",
        "key-passed",
        "dir-inside",
    ],
)
def test_cli_agent_errors_are_one_line(
    sandbox: tuple[Corral, Path], model: ModelServer, case: str, code: int, line: str
) -> None:
    c, ws = sandbox
    args = ["run", "-q", "--tier", "namespace", "--task", "t", "--dir", str(c.state / "a")]
    args += ["--base-url", model.url, "--max-turns", "2"]
    if case != "no-model":
        args += ["--model", "m"]
    if case == "unreachable":
        model.close()
    elif case == "malformed":
        model.script = [b"<html>"]
    elif case == "max-turns":
        model.forever = completion(calls=[("run_command", {"command": "true"})])
    elif case == "bad-turns":
        args += ["--max-turns", "0"]
    elif case == "key-passed":
        args += ["--env", "OPENAI_API_KEY"]
    elif case == "dir-inside":  # the sandbox could plant its config, memory links, log
        args[args.index("--dir") + 1] = str(ws / ".agent")
    r = agent(c, ws, *args)
    err = r.stderr.decode()
    assert r.returncode == code and err.startswith(line) and err.count("\n") == 1, err
    assert r.stdout == b""


def test_cli_agent_serve_stops_cleanly(sandbox: tuple[Corral, Path], model: ModelServer) -> None:
    c, ws = sandbox
    d = c.state / "served"
    model.forever = completion("seen")
    proc = c.popen(
        [
            "agent",
            "serve",
            "--tier",
            "namespace",
            "--stdin",
            "--base-url",
            model.url,
            "--model",
            "m",
            "--dir",
            str(d),
        ],
        ws,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    proc.stdin.write(b"first line\n")
    proc.stdin.flush()
    log = d / "activity.jsonl"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if log.exists() and '"kind":"answer"' in log.read_text():
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    kinds = [json.loads(x)["kind"] for x in log.read_text().splitlines()]
    assert kinds == ["start", "memory", "wake", "model", "answer", "stop"]
    assert err.decode().splitlines()[-1] == "corral: agent stopped"
    assert b"Traceback" not in err


# -- the file watcher and the webhook -------------------------------------------------------------


class SlowFirstScan(FileWatch):
    """A watcher whose baseline scan takes long (a loaded machine, a big tree):
    the event is handled, and its file written, while that scan runs."""

    def __init__(self, interval: float) -> None:
        super().__init__(interval=interval)
        self.scans = 0

    def scan(self, root: str) -> dict[str, tuple[int, int]]:
        self.scans += 1
        if self.scans == 1:
            seen = super().scan(root)  # before the agent's write...
            time.sleep(1.5)  # ...which lands while this scan is still "running"
            return seen
        return super().scan(root)


@pytest.mark.parametrize("watch", [FileWatch, SlowFirstScan], ids=["scan", "slow-first-scan"])
def test_file_watch_wakes_on_host_changes_not_on_its_own_writes(
    api_ws: Path, watch: type[FileWatch]
) -> None:
    brain = ScriptedBrain(
        [turn(call("write_file", path="own.txt", content="mine")), Reply("wrote")]
    )

    async def go() -> None:
        rt = Runtime(
            brain,
            pol.load(str(api_ws)),
            directory=api_ws.parent / "agent",
            tier="namespace",
            listeners=[watch(interval=0.1)],
        )
        async with rt:
            assert (await rt.fire(Event("task", "write own.txt"))).text == "wrote"
            # a few scans (after the slow baseline): own.txt is the agent's own write
            await asyncio.sleep(0.5 if watch is FileWatch else 2.5)
            (api_ws / "host.txt").write_text("from the host")
            for _ in range(50):
                if len(brain.seen) == 3:
                    break
                await asyncio.sleep(0.1)

    asyncio.run(go())
    wakes = [r for r in log_of(api_ws) if r["kind"] == "wake"]
    assert [(w["event"], w["text"]) for w in wakes] == [
        ("task", "write own.txt"),
        ("file", "files changed: host.txt"),
    ]
    assert wakes[1]["data"] == {"changed": ["host.txt"], "removed": []}


def test_webhook_takes_events_with_the_token_only(api_ws: Path) -> None:
    import httpx

    token = "t" * 32
    hook = Webhook(token)
    brain = ScriptedBrain([Reply("got it")])

    async def go() -> list[int]:
        rt = Runtime(
            brain,
            pol.load(str(api_ws)),
            directory=api_ws.parent / "agent",
            tier="namespace",
            listeners=[hook],
        )
        async with rt:
            await asyncio.wait_for(hook.bound.wait(), 10)
            url = f"http://127.0.0.1:{hook.port}/"
            good = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(trust_env=False) as client:
                codes = [
                    (await client.post(url, json={"text": "no token"})).status_code,
                    (
                        await client.post(
                            url,
                            json={"text": "bad"},
                            headers={"Authorization": "Bearer " + "x" * 32},
                        )
                    ).status_code,
                    (await client.get(url, headers=good)).status_code,
                    (await client.post(url, json={"text": ""}, headers=good)).status_code,
                    (
                        await client.post(url, json={"text": "deploy done"}, headers=good)
                    ).status_code,
                ]
            for _ in range(50):
                if any(r["kind"] == "answer" for r in log_of(api_ws)):
                    break
                await asyncio.sleep(0.05)
        return codes

    assert asyncio.run(go()) == [401, 401, 405, 400, 202]
    wakes = [(r["event"], r["text"]) for r in log_of(api_ws) if r["kind"] == "wake"]
    assert wakes == [("webhook", "deploy done")]
    with pytest.raises(Exception, match="loopback only"):
        Webhook(token, host="0.0.0.0")


def test_memory_index_made_once_and_read_through_a_tool(api_ws: Path) -> None:
    from corral.memory import Memory

    agent_dir = api_ws.parent / "agent"
    brain = ScriptedBrain(
        [
            turn(call("read_memory")),
            turn(call("read_memory", file="agent/deploys.md")),
            turn(call("read_memory", file="../activity.jsonl")),  # outside: refused
            Reply("ok"),
        ]
    )

    async def go() -> None:
        rt = Runtime(brain, pol.load(str(api_ws)), directory=agent_dir, tier="namespace")
        async with rt:
            rt.memory.put("agent/deploys.md", "Deploys", "tag first", text="use v* tags\n")
            await rt.fire(Event("task", "what do you remember?"))
        async with Runtime(ScriptedBrain([]), pol.load(str(api_ws)), directory=agent_dir):
            pass  # a second start: the index is there already

    asyncio.run(go())
    results = [m["content"] for m in brain.seen[-1] if m["role"] == "tool"]
    assert "# Agent memory" in str(results[0])
    assert "- [Deploys](agent/deploys.md) — tag first" in str(results[0])
    assert results[1] == "use v* tags\n"
    assert str(results[2]).startswith("error: a memory file is agent/NAME.md or user/NAME.md")
    assert [r["kind"] for r in log_of(api_ws)].count("memory") == 1
    assert Memory(agent_dir / "memory").entries()[0].file == "agent/deploys.md"


def test_cli_agent_serve_webhook_and_watch(
    sandbox: tuple[Corral, Path], model: ModelServer
) -> None:
    """--webhook with the token corral made in the agent's directory (0600), and
    --watch: a file the host writes wakes the agent."""
    import httpx

    c, ws = sandbox
    d = c.state / "hooked"
    model.forever = completion("noted")
    port = free_port()
    proc = c.popen(
        ["agent", "serve", "--tier", "namespace", "--webhook", str(port), "--watch",
         "--base-url", model.url, "--model", "m", "--dir", str(d)],
        ws,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    log = d / "activity.jsonl"
    try:
        wait_for(lambda: log.exists() and '"kind":"start"' in log.read_text())
        token_file = d / "webhook.token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text().strip()
        url = f"http://127.0.0.1:{port}/"
        with httpx.Client(trust_env=False) as client:
            wait_for(lambda: _reachable(client, url))
            assert client.post(url, content="wrong").status_code == 401
            auth = {"Authorization": f"Bearer {token}"}
            assert client.post(url, content="build finished", headers=auth).status_code == 202
        wait_for(lambda: log.read_text().count('"kind":"answer"') == 1)
        time.sleep(1.5)  # a scan after the event: nothing of the host's changed yet
        (ws / "from-host.txt").write_text("hello")
        wait_for(lambda: log.read_text().count('"kind":"answer"') == 2)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    wakes = [json.loads(x) for x in log.read_text().splitlines() if '"kind":"wake"' in x]
    assert [(w["event"], w["text"]) for w in wakes] == [
        ("webhook", "build finished"),
        ("file", "files changed: from-host.txt"),
    ]


def _reachable(client: object, url: str) -> bool:
    import httpx

    try:
        client.get(url)  # type: ignore[attr-defined]
    except httpx.HTTPError:
        return False
    return True


def wait_for(check: object, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError("timed out waiting")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_background_output_kept_on_the_host_is_bounded(api_ws: Path) -> None:
    """A hostile client started background processes that each wrote the policy's
    whole output limit, and `corral mcp` held it all (gigabytes, never freed: found
    by attacking it).  Now a background process keeps at most BACKGROUND_OUTPUT
    bytes until read, output is let go once read, a process that ended and was
    read is forgotten, and at most MAX_BACKGROUND are kept: one more is a tool
    error.  The twins: the output read is the command's, in order, and stopping
    one makes room for another."""
    from corral import tools
    from corral.sandbox import AsyncSandbox

    async def go() -> None:
        async with AsyncSandbox(pol.load(str(api_ws)), tier="namespace") as sb:
            box = tools.Toolbox(sb)
            started = await box.call("start_process", {"command": "head -c 20000000 /dev/zero"})
            ident = cast(dict[str, Any], started.value)["id"]
            await box.processes[ident].wait(30)
            first = await box.call("process_output", {"id": ident})
            assert len(cast(dict[str, Any], first.value)["stdout"]) == tools.BACKGROUND_OUTPUT
            assert box.processes[ident].result.stdout == b""  # (let go once read)
            chatty = await box.call("start_process", {"command": "echo one; sleep 0.2; echo two"})
            chatty_id = cast(dict[str, Any], chatty.value)["id"]
            assert ident not in box.processes  # ended and read: forgotten
            await box.processes[chatty_id].wait(10)
            got = await box.call("process_output", {"id": chatty_id})
            assert cast(dict[str, Any], got.value)["stdout"] == "one\ntwo\n"
            for _ in range(tools.MAX_BACKGROUND):
                made = await box.call("start_process", {"command": "sleep 30"})
                assert made.error is None, made.error
            refused = await box.call("start_process", {"command": "sleep 30"})
            assert refused.error and "background processes are kept already" in refused.error
            any_id = next(iter(box.processes))
            stopped = await box.call("stop_process", {"id": any_id})
            assert stopped.error is None, stopped.error
            again = await box.call("start_process", {"command": "true"})
            assert again.error is None, again.error
            # a foreground command's answer: its start and end, the rest left out, said
            big = await box.call("run_command", {"command": "seq 1 400000"})
            value = cast(dict[str, Any], big.value)
            assert value["truncated"] and "bytes of output left out here" in value["stdout"]
            assert value["stdout"].startswith("1\n2\n") and value["stdout"].endswith("400000\n")
            assert len(value["stdout"]) < tools.TOOL_OUTPUT + 100
            small = await box.call("run_command", {"command": "seq 1 3"})
            assert cast(dict[str, Any], small.value)["stdout"] == "1\n2\n3\n"

    asyncio.run(go())
