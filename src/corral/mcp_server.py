"""``corral mcp``: one sandbox behind MCP tools, over stdio (the official ``mcp`` SDK).

The server starts one long-lived :class:`~corral.sandbox.Sandbox` under the
policy it was given; every tool call runs inside it, under that policy: the
file tools included, so a read-deny or write-deny rule holds for them too.
A refused file operation or a closed sandbox comes back as a tool error.
"""

import anyio

from corral.sandbox import ExecResult, Process, Sandbox

# Note: no `from __future__ import annotations` here; the SDK reads the tool
# signatures at runtime to build their JSON schemas.


def _result(r: ExecResult) -> dict[str, object]:
    return {
        "exit_code": r.exit_code,
        "stdout": r.stdout.decode("utf-8", "replace"),
        "stderr": r.stderr.decode("utf-8", "replace"),
        "timed_out": r.timed_out,
        "truncated": r.truncated,
        "duration": round(r.duration, 4),
    }


def build(sb: Sandbox) -> object:
    """An MCPServer whose tools act on ``sb``."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(
        name="corral",
        instructions=sb.describe(),
    )
    processes: dict[int, Process] = {}

    @server.tool(description="Run a shell command in the sandbox and wait for it to end.")
    async def run_command(
        command: str,
        timeout: float | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
    ) -> dict[str, object]:
        result = await anyio.to_thread.run_sync(
            lambda: sb.exec(command, timeout=timeout, cwd=cwd, stdin=stdin)
        )
        return _result(result)

    @server.tool(description="Start a command in the background; returns its id.")
    def start_process(command: str, cwd: str | None = None) -> dict[str, object]:
        proc = sb.spawn(command, cwd=cwd)
        processes[proc.id] = proc
        return {"id": proc.id, "command": command}

    @server.tool(description="New output of a background process, and whether it still runs.")
    def process_output(id: int) -> dict[str, object]:
        proc = _find(processes, id)
        out, err = proc.read_output()
        return {
            "id": id,
            "running": proc.running,
            "exit_code": proc.returncode,
            "stdout": out.decode("utf-8", "replace"),
            "stderr": err.decode("utf-8", "replace"),
        }

    @server.tool(description="Write text to a background process's standard input.")
    def write_stdin(id: int, text: str, close: bool = False) -> str:
        proc = _find(processes, id)
        proc.write_stdin(text)
        if close:
            proc.close_stdin()
        return "ok"

    @server.tool(description="Stop a background process and everything it started.")
    async def stop_process(id: int) -> dict[str, object]:
        proc = _find(processes, id)
        proc.kill()
        result = await anyio.to_thread.run_sync(lambda: proc.wait(10))
        return _result(result)

    @server.tool(description="Background processes that are still running.")
    def list_processes() -> list[dict[str, object]]:
        return [{"id": p.id, "pid": p.pid, "argv": p.argv} for p in sb.processes()]

    @server.tool(description="Read a text file (path relative to the workspace).")
    async def read_file(path: str) -> str:
        data = await anyio.to_thread.run_sync(sb.files.read, path)
        return data.decode("utf-8", "replace")

    @server.tool(description="Write a text file (path relative to the workspace).")
    async def write_file(path: str, content: str) -> str:
        await anyio.to_thread.run_sync(sb.files.write, path, content)
        return f"wrote {len(content.encode())} bytes to {path}"

    @server.tool(description="List a directory (path relative to the workspace).")
    async def list_files(path: str = ".") -> list[dict[str, object]]:
        return await anyio.to_thread.run_sync(sb.files.list, path)

    @server.tool(description="What this sandbox allows: tier, writable paths, network.")
    def describe_sandbox() -> str:
        return sb.describe()

    return server


def _find(processes: dict[int, Process], ident: int) -> Process:
    try:
        return processes[ident]
    except KeyError:
        raise ValueError(f"no background process with id {ident}") from None


def serve(sb: Sandbox) -> None:
    server = build(sb)
    server.run("stdio")  # type: ignore[attr-defined]
