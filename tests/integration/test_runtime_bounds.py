"""The agent runtime's bounds with real parts (a namespace sandbox for every tool
call, the scripted brain in-process), each found by attacking it and each with
its twin: a command's timeout, deep JSON in a call's arguments."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, cast

import pytest
import test_runtime
from test_runtime import run_one, tool_records, turn

from corral import policy as pol
from corral import tools
from corral.brain import Reply, ScriptedBrain, ToolCall

JSON = dict[str, object]
api_ws = test_runtime.api_ws  # (the fixture: a workspace and state of its own, as root)


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
            assert time.monotonic() - began < 3
            # the twins: a shorter timeout is the model's to give; a quick command ends
            short = await box.call("run_command", {"command": "sleep 5", "timeout": 0.2})
            assert short.error and short.error.startswith("timed out after 0.2")
            quick = await box.call("run_command", {"command": "echo hi", "timeout": asked})
            assert quick.error is None and cast(dict[str, Any], quick.value)["stdout"] == "hi\n"

    asyncio.run(go())
