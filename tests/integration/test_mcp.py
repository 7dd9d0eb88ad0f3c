"""`corral mcp` driven by a real MCP client from the same SDK, over stdio."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from conftest import ROOT_BASE

mcp = pytest.importorskip("mcp", reason="the mcp SDK is part of the dev extra")
from mcp import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402


@pytest.fixture
def ws() -> Iterator[Path]:
    base = ROOT_BASE / ("mcp-" + uuid.uuid4().hex[:10])
    (base / "ws").mkdir(parents=True)
    (base / "home").mkdir()
    try:
        yield base / "ws"
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def payload(result: object) -> object:
    content = result.content  # type: ignore[attr-defined]
    structured = getattr(result, "structured_content", None) or getattr(
        result, "structuredContent", None
    )
    if structured is not None:
        return structured.get("result", structured)
    text = content[0].text if content else ""
    try:
        return json.loads(text)
    except ValueError:
        return text


def server(ws: Path) -> StdioServerParameters:
    """`corral mcp --workspace ws` as a client starts it, with a home of its own."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-P", "-m", "corral", "mcp", "--workspace", str(ws)],
        env={
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(ws.parent / "home"),
            "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
            "XDG_STATE_HOME": str(ws.parent / "home"),
        },
    )


def test_mcp_tools_over_stdio(ws: Path) -> None:
    (ws / ".git" / "hooks").mkdir(parents=True)
    params = server(ws)

    async def go() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            names = {t.name for t in (await s.list_tools()).tools}
            assert {
                "run_command",
                "start_process",
                "process_output",
                "stop_process",
                "list_processes",
                "read_file",
                "write_file",
                "list_files",
                "write_stdin",
                "describe_sandbox",
            } <= names
            r = payload(await s.call_tool("run_command", {"command": "echo hi; exit 4"}))
            assert isinstance(r, dict) and r["exit_code"] == 4 and r["stdout"] == "hi\n"
            assert payload(await s.call_tool("write_file", {"path": "a.txt", "content": "x"}))
            assert payload(await s.call_tool("read_file", {"path": "a.txt"})) == "x"
            denied = await s.call_tool(
                "write_file", {"path": ".git/hooks/pre-commit", "content": "evil"}
            )
            assert denied.is_error if hasattr(denied, "is_error") else denied.isError  # type: ignore[attr-defined]  # mcp < 2
            started = payload(await s.call_tool("start_process", {"command": "sleep 30"}))
            assert isinstance(started, dict)
            running = payload(await s.call_tool("list_processes", {}))
            assert isinstance(running, list) and len(running) == 1
            stopped = payload(await s.call_tool("stop_process", {"id": started["id"]}))
            assert isinstance(stopped, dict) and stopped["exit_code"] == 137
            text = payload(await s.call_tool("describe_sandbox", {}))
            assert "corral sandbox" in str(text)

    anyio.run(go)
    assert (ws / "a.txt").read_text() == "x"
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()
    assert os.listdir(ws / ".git" / "hooks") == []


def test_mcp_applies_the_run_options_and_is_recorded(ws: Path) -> None:
    src = str(Path(__file__).resolve().parents[2] / "src")
    state = ws.parent / "state"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-P", "-m", "corral", "mcp", "--workspace", str(ws), "--timeout", "1", "-q"],
        env={
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(ws.parent / "home"),
            "PYTHONPATH": src,
            "XDG_STATE_HOME": str(state),
        },
    )

    async def go() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            slow = payload(await s.call_tool("run_command", {"command": "sleep 5"}))
            assert isinstance(slow, dict) and slow["timed_out"] and slow["exit_code"] == 124
            quick = payload(await s.call_tool("run_command", {"command": "echo ok"}))
            assert isinstance(quick, dict) and quick["stdout"] == "ok\n"  # the allow twin
            missing = payload(await s.call_tool("run_command", {"command": "no-such-cmd"}))
            assert isinstance(missing, dict) and missing["exit_code"] == 127
            text = payload(await s.call_tool("describe_sandbox", {}))
            assert "Each command is stopped after 1s." in str(text)

    anyio.run(go)
    (record,) = [json.loads(x) for x in (state / "corral" / "runs.jsonl").read_text().splitlines()]
    assert record["kind"] == "mcp" and record["execs"] == 3
    assert [c["exit"] for c in record["commands"]] == [124, 0, 127]


def test_a_server_started_in_the_root_directory_is_told_about_workspace(ws: Path) -> None:
    """MCP clients often start servers in / (found by trying corral as a new user):
    the refusal says what to give; the twin: with --workspace it serves."""
    import subprocess

    env = {**os.environ, "HOME": str(ws.parent / "home"), "XDG_STATE_HOME": str(ws.parent)}
    command = [sys.executable, "-P", "-m", "corral", "mcp"]
    done = subprocess.run(command, cwd="/", env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().endswith("give the server --workspace DIR"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1

    async def listed() -> list[str]:
        server = StdioServerParameters(
            command=sys.executable,
            args=["-P", "-m", "corral", "mcp", "--workspace", str(ws)],
            env=env,
            cwd="/",
        )
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return [t.name for t in (await session.list_tools()).tools]

    assert "run_command" in anyio.run(listed)


def test_what_a_command_makes_cannot_kill_or_swell_the_server(ws: Path) -> None:
    """A file name that is no UTF-8 made `list_files` kill the server (the SDK could
    not encode the answer), and `read_file` of a big file held 40 times its size
    (found by attacking corral mcp).  The name comes back escaped, the read cut to
    the tools' answer bound; the twins: the server goes on, a small file is whole."""
    params = server(ws)

    async def go() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            made = (
                "touch \"$(printf 'bad\\377name')\"; head -c 3000000 /dev/zero | tr '\\0' x > big"
            )
            assert payload(await s.call_tool("run_command", {"command": made}))
            with anyio.fail_after(30):
                listed = payload(await s.call_tool("list_files", {"path": "."}))
            assert isinstance(listed, list)
            assert "bad\\xffname" in [e["name"] for e in listed]
            with anyio.fail_after(60):
                big = payload(await s.call_tool("read_file", {"path": "big"}))
            assert isinstance(big, str) and len(big) < (1 << 20) + 200
            assert big.endswith("[corral: the file is 3000000 bytes; its middle was left out]")
            r = payload(await s.call_tool("run_command", {"command": "echo alive"}))
            assert isinstance(r, dict) and r["stdout"] == "alive\n"
            assert payload(await s.call_tool("write_file", {"path": "s", "content": "small"}))
            assert payload(await s.call_tool("read_file", {"path": "s"})) == "small"

    anyio.run(go)
