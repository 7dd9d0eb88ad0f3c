"""``corral mcp``: one sandbox behind MCP tools, over stdio (the official ``mcp`` SDK).

The server holds one long-lived :class:`~corral.sandbox.AsyncSandbox` under the
policy it was given; every tool call runs inside it, under that policy: the
file tools included, so a read-deny or write-deny rule holds for them too.
The tools are :mod:`corral.tools`' registry, the same the agent runtime uses.
A refused file operation, a denied request or a closed sandbox comes back as a
tool error with corral's reason.
"""

from __future__ import annotations

from typing import Any

from corral.sandbox import AsyncSandbox
from corral.tools import Toolbox


def build(sb: AsyncSandbox) -> Any:
    """A low-level MCP server whose tools (the registry's) act on ``sb``."""
    import mcp_types as types
    from mcp.server.lowlevel import Server

    box = Toolbox(sb)
    listed = [
        types.Tool(name=t.name, description=t.description, input_schema=t.parameters)
        for t in box.available()
    ]

    async def list_tools(ctx: object, params: object) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: object, params: types.CallToolRequestParams) -> types.CallToolResult:
        outcome = await box.call(params.name, params.arguments or {})
        text = types.TextContent(type="text", text=outcome.text())
        if outcome.value is None:  # nothing ran, or it failed: the reason only
            return types.CallToolResult(content=[text], is_error=outcome.error is not None)
        # a command that ran keeps its result even when corral refused or stopped it
        return types.CallToolResult(
            content=[text],
            structured_content={"result": outcome.value},
            is_error=outcome.error is not None,
        )

    return Server(
        "corral",
        instructions=sb.describe(),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve(sb: AsyncSandbox) -> None:
    from mcp.server.stdio import stdio_server

    server = build(sb)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())
