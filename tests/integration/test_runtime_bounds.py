"""The agent runtime's bounds with real parts (a namespace sandbox for every tool
call, the scripted brain in-process), each found by attacking it and each with
its twin: tool calls per reply, what a tool answers and the history carries,
what the log holds of a command's output, a command's timeout, a full disk
under the log, deep JSON in a call's arguments."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import test_runtime
from test_runtime import log_of, run_one, tool_records, turn

from corral import policy as pol
from corral import tools
from corral.brain import Reply, ScriptedBrain, ToolCall, call
from corral.runtime import TOOL_ANSWER, Event, Runtime

JSON = dict[str, object]
api_ws = test_runtime.api_ws  # (the fixture: a workspace and state of its own, as root)


def test_tool_calls_past_the_cap_are_tool_errors(api_ws: Path) -> None:
    many = [call("run_command", f"c{n}", command=f"echo {n} >> ran.txt") for n in range(5)]
    brain = ScriptedBrain([turn(*many), turn(*many[:2]), Reply("ok")])
    answer, _ = run_one(brain, pol.load(str(api_ws)), api_ws, "x", tier="namespace", max_calls=2)
    assert answer.finish == "stop"
    # 2 of the first reply's 5 ran, then both of the second's (the twin: at the cap, all run)
    assert (api_ws / "ran.txt").read_text() == "0\n1\n0\n1\n"
    answers = [m for m in brain.seen[1] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in answers] == ["c0", "c1", "c2", "c3", "c4"]
    assert all(str(m["content"]).startswith('{"exit_code": 0') for m in answers[:2])
    assert answers[4]["content"] == (
        "error: not run: corral runs at most 2 tool calls of one reply and this one had 5; "
        "ask for the rest in the next turn"
    )
    errors = [r for r in log_of(api_ws) if r["kind"] == "error"]
    assert [(r["where"], r["calls"]) for r in errors] == [("max_calls", 5)]


def test_tool_answers_and_the_history_are_bounded(api_ws: Path) -> None:
    big = call("run_command", command="head -c 600000 /dev/zero | tr '\\0' a")
    limit = 300_000
    sizes: list[int] = []
    newest: list[str] = []

    def measure(then: Reply) -> Callable[[list[JSON]], Reply]:
        def step(messages: list[JSON]) -> Reply:  # what this request carries, as it is sent
            history = messages[1:]  # (after the system prompt)
            sent = (json.dumps(m, ensure_ascii=False, separators=(",", ":")) for m in history)
            sizes.append(sum(len(text.encode()) for text in sent))
            newest.append(str(history[-1]["content"]))
            return then

        return step

    brain = ScriptedBrain([turn(big), *(measure(r) for r in (turn(big), turn(big), Reply("ok")))])
    answer, _ = run_one(
        brain, pol.load(str(api_ws)), api_ws, "x", tier="namespace", history_bytes=limit
    )
    assert answer.finish == "stop" and len(sizes) == 3
    assert all(size <= limit for size in sizes)
    for last in newest:  # the newest answer: its start and end
        assert len(last) <= TOOL_ANSWER + 100 and "characters left out here" in last
        assert last.startswith('{"exit_code": 0, "stdout": "aaaa')
    older = [str(m["content"]) for m in brain.seen[-1] if m["role"] == "tool"][:-1]
    assert "left out of the history" in older[0]  # the oldest shortened first


def test_a_small_answer_reaches_the_model_whole(api_ws: Path) -> None:
    brain = ScriptedBrain([turn(call("run_command", command="seq 1 5000")), Reply("ok")])
    run_one(brain, pol.load(str(api_ws)), api_ws, "x", tier="namespace")
    last = json.loads(str(brain.seen[-1][-1]["content"]))
    assert last["stdout"] == "".join(f"{n}\n" for n in range(1, 5001))


def test_forged_refusals_leave_a_bounded_log(api_ws: Path) -> None:
    line = '{"decision":"deny","host":"h","port":1,"rule":"r","reason":"' + "z" * 100 + '"}'
    forge = call("run_command", command=f"yes '{line}' | head -n 5000")
    brain = ScriptedBrain([turn(forge), Reply("ok")])
    run_one(brain, pol.load(str(api_ws)), api_ws, "x", tier="namespace")
    record = tool_records(api_ws)[0]
    assert record["denied"] == 5000 and len(record["denials"]) == tools.DENIAL_LINES
    log = api_ws.parent / "agent" / "activity.jsonl"
    assert log.stat().st_size < 40_000  # (850 KB of output; the log had it three times)
    told = str(brain.seen[-1][-1]["content"])  # the model is told the count, and the output
    assert told.startswith("error: denied by the sandbox's policy (r): h:1: ")
    assert "[corral: 4995 more refusal lines in the output]" in told
    # the twin: one refusal is said whole
    brain = ScriptedBrain([turn(call("run_command", command=f"echo '{line}'")), Reply("ok")])
    run_one(brain, pol.load(str(api_ws)), api_ws, "x", tier="namespace")
    record = tool_records(api_ws)[-1]
    assert record["denied"] == 1 and record["denials"] == [
        "denied by the sandbox's policy (r): h:1: " + "z" * 100
    ]


def test_deep_json_arguments_are_a_tool_error_not_the_models(api_ws: Path) -> None:
    deep = '{"command": ' + "[" * 50_000 + "]" * 50_000 + "}"
    brain = ScriptedBrain([turn(ToolCall("c", "run_command", deep)), Reply("ok")])
    answer, _ = run_one(brain, pol.load(str(api_ws)), api_ws, "x", tier="namespace")
    assert answer.finish == "stop"  # the event went on: the model heard why
    assert tool_records(api_ws)[0]["error"] == "run_command: arguments nest too deeply"


@pytest.mark.parametrize("asked", [0, 1e7])
def test_a_models_timeout_cannot_lift_the_runtimes_cap(api_ws: Path, asked: float) -> None:
    async def go() -> None:
        from corral.sandbox import AsyncSandbox

        async with AsyncSandbox(pol.load(str(api_ws)), tier="namespace") as sb:
            box = tools.Toolbox(sb, None, command_timeout=0.5)
            began = time.monotonic()
            out = await box.call("run_command", {"command": "sleep 5", "timeout": asked})
            assert out.error and out.error.startswith("timed out after 0.5")
            if asked:  # said: a caller took its own timeout for the one that fired
                assert f"(asked for {asked:g}s; capped at 0.5s)" in out.error, out.error
            assert time.monotonic() - began < 3
            # the twins: a shorter timeout is the model's to give; a quick command ends
            short = await box.call("run_command", {"command": "sleep 5", "timeout": 0.2})
            assert short.error and short.error.startswith("timed out after 0.2")
            quick = await box.call("run_command", {"command": "echo hi", "timeout": asked})
            assert quick.error is None and cast(dict[str, Any], quick.value)["stdout"] == "hi\n"

    asyncio.run(go())


def test_a_full_disk_under_the_log_does_not_stop_the_runtime(
    api_ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = api_ws.parent / "agent"
    directory.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(directory)], check=True)
    brain = ScriptedBrain([turn(call("run_command", command="echo hi")), Reply("ok")])

    async def go() -> list[str]:
        rt = Runtime(brain, pol.load(str(api_ws)), directory=directory, tier="namespace")
        async with rt:
            first = await asyncio.wait_for(rt.fire(Event("task", "before")), 30)  # the twin
            fill(directory / "filler", 65536)  # the disk fills up
            fill(directory / "activity.jsonl", 64)  # and the log's last page
            second = await asyncio.wait_for(rt.fire(Event("task", "after")), 30)
            return [first.text, second.text]

    try:
        assert asyncio.run(go()) == ["ok", "done"]
    finally:
        subprocess.run(["umount", str(directory)], check=False)
    err = capsys.readouterr().err
    assert err.count("corral: agent: cannot write its log") == 1
    assert "No space left on device" in err


def fill(path: Path, piece: int) -> None:
    """Append to ``path`` until its filesystem is full."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\n" * piece):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
