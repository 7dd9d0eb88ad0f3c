"""The agent runtime's pure parts: the tool registry's schemas and argument
checks, corral's refusals found in a command's output, the chat-completions
answer parser, where the model's settings come from, the log's lines, and the
command line's one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from corral import agentcli, cli
from corral.brain import BrainConfig, BrainError, Reply, ToolCall, parse_reply
from corral.tools import TOOLS, Outcome, ToolError, check_arguments, proxy_denials


def test_every_tool_has_one_schema_of_type_object() -> None:
    assert list(TOOLS) == [
        "run_command",
        "start_process",
        "process_output",
        "write_stdin",
        "stop_process",
        "list_processes",
        "read_file",
        "write_file",
        "list_files",
        "describe_sandbox",
        "read_memory",
    ]
    assert [t.name for t in TOOLS.values() if t.needs_memory] == ["read_memory"]
    for tool in TOOLS.values():
        schema = tool.schema()
        assert schema["type"] == "function"
        fn = schema["function"]
        assert isinstance(fn, dict) and fn["name"] == tool.name and fn["description"]
        params = tool.parameters
        assert params["type"] == "object" and params["additionalProperties"] is False
        props = params["properties"]
        assert isinstance(props, dict)
        assert set(cast("list[str]", params["required"])) <= set(props)  # JSON schema


def test_arguments_checked_against_the_schema() -> None:
    run = TOOLS["run_command"]
    assert check_arguments(run, '{"command": "ls", "timeout": 2}') == {
        "command": "ls",
        "timeout": 2,
    }
    assert check_arguments(run, {"command": "ls", "cwd": None}) == {"command": "ls", "cwd": None}
    assert check_arguments(TOOLS["list_files"], "") == {}
    assert check_arguments(TOOLS["list_processes"], None) == {}
    bad = [
        (run, "{}", "run_command: missing argument command"),
        (run, '{"command": 1}', "run_command: command must be string"),
        (run, '{"command": "x", "timeout": "2"}', "run_command: timeout must be number or null"),
        (run, '{"command": "x", "shell": true}', "run_command: unknown argument 'shell'"),
        (run, "[1]", "run_command: arguments must be a JSON object"),
        (run, "{oops", "run_command: arguments are not JSON: '{oops'"),
        (TOOLS["stop_process"], '{"id": true}', "stop_process: id must be integer"),
        (TOOLS["stop_process"], '{"id": 1.5}', "stop_process: id must be integer"),
    ]
    for tool, args, message in bad:
        with pytest.raises(ToolError) as caught:
            check_arguments(tool, args)
        assert str(caught.value) == message


def test_proxy_refusals_in_output() -> None:
    line = '{"decision":"deny","rule":"network.allow","reason":"not in allow","host":"h","port":80}'
    assert proxy_denials({"stdout": f"{line} status=403", "stderr": ""}) == [
        "denied by the sandbox's policy (network.allow): h:80: not in allow"
    ]
    plain = "remote: corral: denied by the sandbox's policy (rules[0]): push refused"
    assert proxy_denials({"stdout": "", "stderr": plain}) == [plain]
    # the twin: ordinary output, a 403 of the origin's own, is no refusal of corral's
    assert proxy_denials({"stdout": '{"decision": "allow"} status=403', "stderr": "x"}) == []


def test_outcome_text() -> None:
    assert Outcome(value="plain").text() == "plain"
    assert Outcome(value={"a": 1}).text() == '{"a": 1}'
    assert Outcome(error="nope").text() == "error: nope"


def test_parse_reply() -> None:
    body = {
        "choices": [
            {
                "message": {
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "function": {"name": "read_file", "arguments": '{"path":"a"}'},
                        },
                        {"function": {"name": "list_files", "arguments": {"path": "."}}},
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"total_tokens": 3},
    }
    reply = parse_reply(body)
    assert reply == Reply(
        None,
        [
            ToolCall("c1", "read_file", '{"path":"a"}'),
            ToolCall("call_1", "list_files", '{"path": "."}'),
        ],
        "tool_calls",
        {"total_tokens": 3},
    )
    assert reply.message()["tool_calls"][1]["function"]["name"] == "list_files"  # type: ignore[index]
    assert parse_reply({"choices": [{"message": {"content": "hi"}}]}) == Reply("hi")
    bad: object
    for bad in ({}, {"choices": []}, {"choices": [{"message": {"content": 3}}]}, [1], "x"):
        with pytest.raises(BrainError, match=r"^malformed model response: "):
            parse_reply(bad)


def test_brain_config_flags_env_file(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text('base_url = "http://file/v1"\nmodel = "file-model"\napi_key = "not-read"\n')
    env = {"CORRAL_AGENT_MODEL": "env-model", "OPENAI_API_KEY": "k1"}
    got = BrainConfig.load(str(cfg), None, None, env)
    assert got == BrainConfig("http://file/v1", "env-model", "k1")
    got = BrainConfig.load(str(cfg), "http://flag/v1", "flag-model", {"CORRAL_AGENT_API_KEY": "k2"})
    assert got == BrainConfig("http://flag/v1", "flag-model", "k2")
    assert BrainConfig.load(str(tmp_path / "none.toml"), None, None, {}) == BrainConfig()
    with pytest.raises(BrainError, match="no model server"):
        BrainConfig().brain()
    cfg.write_text("base_url = \n")
    with pytest.raises(BrainError, match=r"config\.toml"):
        BrainConfig.load(str(cfg), None, None, {})


def test_log_lines() -> None:
    assert agentcli.line_of({"t": "T", "kind": "wake", "event": "task", "text": "a\nb"}) == (
        "T  wake   task: a\\nb"
    )
    tool = {"t": "T", "kind": "tool", "name": "run_command", "arguments": "{}", "exit_code": 0}
    assert agentcli.line_of({**tool, "seconds": 0.1}).endswith("run_command {} -> exit 0 (0.1s)")
    assert "-> error: nope" in agentcli.line_of({**tool, "error": "nope"})


@pytest.mark.parametrize(
    "args, message",
    [
        (["agent"], agentcli.USAGE),
        (["agent", "walk"], agentcli.USAGE),
        (["agent", "run"], "corral agent run needs --task TEXT"),
        (["agent", "run", "--task", "x", "--stdin"], "--stdin is for corral agent serve"),
        (["agent", "serve", "--task", "x"], "--task is for corral agent run"),
        (["agent", "log", "--task", "x"], "unknown option --task for corral agent log"),
        (["agent", "run", "--task", "x", "--max-turns", "0"], "--max-turns needs a whole number"),
        (["agent", "serve", "--every", "soon"], "--every: "),
    ],
)
def test_cli_one_line_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert cli.main([*args, "--dir", str(tmp_path)] if args[1:2] == ["log"] else args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"corral: {message}") and err.count("\n") == 1, err


def test_help_lists_the_agent_and_its_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["help", "agent"]) == 0
    text = capsys.readouterr().out
    assert "usage: corral agent run --task TEXT|serve|log" in text
    words = " ".join(text.split())
    assert "--base-url URL" in text and "never enters the sandbox" in words
    assert "    3  the model server could not be used" in text
