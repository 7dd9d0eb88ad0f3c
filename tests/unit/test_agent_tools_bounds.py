"""The tools' bounds on what a model or a command can make them hold: refusal marks a
command printed (kept few, counted) and JSON arguments nested too deep (a tool
error, not a crash).  Each with its twin."""

from __future__ import annotations

import pytest

from corral.tools import TOOLS, ToolError, check_arguments, denial_summary, scan_denials


def test_refusal_marks_kept_few_and_counted() -> None:
    mark = '{"decision":"deny","host":"evil.test","port":443,"rule":"r","reason":"' + "y" * 900
    found, count = scan_denials({"stdout": "\n".join([mark + '"}'] * 50_000), "stderr": ""})
    assert count == 50_000 and len(found) == 5 and all(len(f) <= 300 for f in found)
    from corral.tools import Outcome

    text = denial_summary(Outcome(denials=found, denied=count))
    assert text.endswith("[corral: 49995 more refusal lines in the output]") and len(text) < 2000
    one = "denied by the sandbox's policy: evil.test"
    assert scan_denials({"stdout": one, "stderr": ""}) == ([one], 1)  # the twin


def test_deep_json_arguments_are_a_tool_error() -> None:
    deep = '{"command": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(ToolError, match="run_command: arguments nest too deeply"):
        check_arguments(TOOLS["run_command"], deep)
    nested = '{"command": "echo", "cwd": null}'
    assert check_arguments(TOOLS["run_command"], nested) == {"command": "echo", "cwd": None}
