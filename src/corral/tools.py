"""The tools a model may call, each defined once: a name, a description, a JSON
schema for its arguments and an async implementation over one
:class:`~corral.sandbox.AsyncSandbox`.  ``corral mcp`` serves them
(:mod:`corral.mcp_server`) and so does corral's own agent runtime
(:mod:`corral.runtime`); neither writes a tool of its own.

A call that goes wrong (unknown tool, bad arguments, a path the policy refuses,
a closed sandbox, a network request corral's proxy refused) comes back as a
:class:`ToolError` whose message is corral's reason: a caller turns it into a
tool error for the model, never into a crash.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from corral.memory import Memory
from corral.sandbox import AsyncProcess, AsyncSandbox, ExecResult, PathDenied, SandboxError

JSON = dict[str, object]
T = TypeVar("T")


class ToolError(Exception):
    """A tool call that could not be done; ``str()`` is the reason for the model.
    ``denials``: what corral's policy refused on the way (one line each)."""

    def __init__(self, reason: str, denials: list[str] | None = None) -> None:
        super().__init__(reason)
        self.denials = denials or []


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: JSON  # a JSON schema, type "object"
    run: Callable[[Toolbox, JSON], Awaitable[object]]
    needs_memory: bool = False  # the agent runtime's own: offered where a memory index is

    def schema(self) -> JSON:
        """As OpenAI-compatible chat completions take it (``tools=[...]``)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass
class Outcome:
    """What one call gave: ``value`` (JSON-able) or ``error``; ``denials`` either way."""

    value: object = None
    error: str | None = None
    denials: list[str] = field(default_factory=list)
    exit_code: int | None = None
    denied: int = 0  # refusal marks in a command's output; ``denials`` holds the first few

    def text(self) -> str:
        """The result as the model reads it."""
        if self.error is not None:
            return f"error: {self.error}"
        if isinstance(self.value, str):
            return self.value
        return json.dumps(self.value, ensure_ascii=False)


# Background processes a toolbox keeps at once, and the output each keeps on the host
# until it is read: what a caller can make the host hold stays bounded (a hostile
# client's many processes, each writing the policy's whole output limit, held
# gigabytes in `corral mcp`: found by attacking it)
MAX_BACKGROUND = 16
BACKGROUND_OUTPUT = 8 << 20


class Toolbox:
    """The tools' state on one sandbox: its background processes, by id."""

    def __init__(
        self, sb: AsyncSandbox, memory: Memory | None = None, command_timeout: float | None = None
    ) -> None:
        """``command_timeout``: seconds for a command that names none (None: the
        policy's limit only)."""
        self.sb = sb
        self.memory = memory
        self.command_timeout = command_timeout
        self.processes: dict[int, AsyncProcess] = {}

    def available(self) -> list[Tool]:
        """The tools this toolbox offers: all of them where it has a memory index."""
        return [t for t in TOOLS.values() if self.memory is not None or not t.needs_memory]

    async def call(self, name: str, arguments: object) -> Outcome:
        """Run tool ``name``; every failure is an :class:`Outcome` with ``error`` set."""
        tool = TOOLS.get(name)
        try:
            if tool is None or tool not in self.available():
                names = ", ".join(t.name for t in self.available())
                raise ToolError(f"unknown tool {name!r} (tools: {names})")
            args = check_arguments(tool, arguments)
            value = await tool.run(self, args)
        except ToolError as exc:
            return Outcome(error=str(exc), denials=exc.denials)
        except PathDenied as exc:
            reason = f"denied by the sandbox's policy: {exc}"
            return Outcome(error=reason, denials=[reason])
        except (SandboxError, OSError, TimeoutError, ValueError) as exc:
            return Outcome(error=_text_only(str(exc) or type(exc).__name__))
        outcome = Outcome(value=_text_only(value))
        if isinstance(value, dict) and isinstance(value.get("exit_code"), int):
            outcome.exit_code = int(str(value["exit_code"]))
            outcome.denials, outcome.denied = scan_denials(value)
            if outcome.denials:  # the command ran, but corral refused what it asked for
                outcome.error = denial_summary(outcome) + "\n" + json.dumps(value)
            elif value.get("timed_out"):
                capped = f" ({value['timeout_capped']})" if value.get("timeout_capped") else ""
                outcome.error = (
                    f"timed out after {value.get('duration')}s{capped}: corral stopped the "
                    "command and everything it started\n" + json.dumps(value)
                )
        return outcome

    def forget_read(self) -> None:
        """Let go of the processes that ended and whose output was read to its end."""
        for ident, proc in list(self.processes.items()):
            if not proc.running and not proc.unread:
                del self.processes[ident]

    def find(self, ident: int) -> AsyncProcess:
        try:
            return self.processes[ident]
        except KeyError:
            raise ToolError(f"no background process with id {ident}") from None


# -- arguments --------------------------------------------------------------------------

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def check_arguments(tool: Tool, arguments: object) -> JSON:
    """``arguments`` (a dict, or the JSON text of one) checked against the tool's
    schema: required keys present, no unknown keys, each value of its type."""
    if isinstance(arguments, str):
        text = arguments
        try:
            arguments = json.loads(text or "{}")
        except ValueError:
            raise ToolError(f"{tool.name}: arguments are not JSON: {text[:80]!r}") from None
        except RecursionError:  # the model's text, not the model server's fault
            raise ToolError(f"{tool.name}: arguments nest too deeply") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ToolError(f"{tool.name}: arguments must be a JSON object")
    props = tool.parameters.get("properties", {})
    assert isinstance(props, dict)
    required = tool.parameters.get("required", [])
    assert isinstance(required, list)
    missing = [k for k in required if k not in arguments]
    if missing:
        raise ToolError(f"{tool.name}: missing argument {', '.join(missing)}")
    for key, value in arguments.items():
        spec = props.get(key)
        if not isinstance(spec, dict):
            raise ToolError(f"{tool.name}: unknown argument {key!r}")
        kind = spec["type"]
        kinds = [str(k) for k in kind] if isinstance(kind, list) else [str(kind)]
        # bool is an int to Python; not to a JSON schema
        ok = any(
            isinstance(value, _TYPES[k]) and not (k != "boolean" and isinstance(value, bool))
            for k in kinds
        )
        if not ok:
            raise ToolError(f"{tool.name}: {key} must be {' or '.join(kinds)}")
    return arguments


def _schema(required: list[str], **props: tuple[str | list[str], str]) -> JSON:
    return {
        "type": "object",
        "properties": {k: {"type": t, "description": d} for k, (t, d) in props.items()},
        "required": required,
        "additionalProperties": False,
    }


# -- results ----------------------------------------------------------------------------


# The most of a stream a tool answers with (its start and its end, with a line
# saying how much is left out between): an answer is text a model reads, and a
# command's whole output limit as text, escaped for JSON twice (MCP's text and
# structured content), held a hostile client's server at 30 times the output
# (found by attacking corral mcp)
TOOL_OUTPUT = 1 << 20


def exec_result(r: ExecResult) -> JSON:
    stdout, cut_out = _answer_text(r.stdout)
    stderr, cut_err = _answer_text(r.stderr)
    return {
        "exit_code": r.exit_code,
        "stdout": stdout,
        "stderr": stderr,
        "timed_out": r.timed_out,
        "truncated": r.truncated or cut_out or cut_err,
        "duration": round(r.duration, 4),
    }


def _text_only(value: T) -> T:
    """``value`` with every string made valid text: a name a command made inside (a
    file name not in UTF-8, read as surrogate escapes) could not be encoded by
    the MCP SDK or an HTTP client, and a `list_files` of it killed the server
    (found by attacking corral mcp).  The bytes that were no text read as \\xNN."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raw = value.encode("utf-8", "surrogateescape")
            return raw.decode("utf-8", "backslashreplace")  # type: ignore[return-value]
        return value
    if isinstance(value, list):
        return [_text_only(v) for v in value]  # type: ignore[return-value]
    if isinstance(value, dict):
        return {_text_only(k): _text_only(v) for k, v in value.items()}  # type: ignore[return-value]
    return value


def _answer_text(data: bytes) -> tuple[str, bool]:
    """A stream as the text of an answer, and whether part of it was left out."""
    if len(data) <= TOOL_OUTPUT:
        return data.decode("utf-8", "replace"), False
    half = TOOL_OUTPUT // 2
    gap = b"\n[corral: %d bytes of output left out here]\n" % (len(data) - 2 * half)
    return (data[:half] + gap + data[-half:]).decode("utf-8", "replace"), True


# the marks of a refusal by corral's proxy in a command's output: its JSON record
# and its one line for plain clients (corral.net.proxy._send_denial)
_DENY_MARKS = ('"decision":"deny"', '"decision": "deny"', "denied by the sandbox's policy")


# The refusal lines kept per call, and each one's length: the marks are text a
# command printed, so it can print a million of them (902,000 forged "denials",
# each copied into the log three times, made 6.5 MB of log per call: found by
# attacking the agent runtime); a count says how many there were
DENIAL_LINES = 5
DENIAL_LINE_CHARS = 300


def proxy_denials(result: JSON) -> list[str]:
    """corral's refusals that a command printed (a denied host, a refused
    request): the first DENIAL_LINES of them."""
    return scan_denials(result)[0]


def scan_denials(result: JSON) -> tuple[list[str], int]:
    """The first DENIAL_LINES refusal lines in a command's output (each cut to
    DENIAL_LINE_CHARS), and how many there were.  corral's proxy tells the
    sandbox its refusals only when the sandbox closes, so during a run the
    command's output is what there is to read; it is the command's to forge."""
    found: list[str] = []
    count = 0
    for stream in ("stdout", "stderr"):
        text = result.get(stream)
        if not isinstance(text, str):
            continue
        for line in text.splitlines():
            if any(mark in line for mark in _DENY_MARKS):
                count += 1
                if len(found) < DENIAL_LINES:
                    found.append(_denial_line(line)[:DENIAL_LINE_CHARS])
    return found, count


def denial_summary(outcome: Outcome) -> str:
    """The refusals of one call in a few lines: the first ones and a count."""
    more = outcome.denied - len(outcome.denials)
    tail = [f"[corral: {more} more refusal lines in the output]"] if more > 0 else []
    return "; ".join([*outcome.denials, *tail])


def _denial_line(line: str) -> str:
    start = line.find("{")
    if start >= 0:
        try:  # the record may have more output after it (curl -w, say)
            record, _ = json.JSONDecoder().raw_decode(line[start:])
        except ValueError:
            return line.strip()
        if isinstance(record, dict) and record.get("decision") == "deny":
            where = f"{record.get('host')}:{record.get('port')}"
            rule, reason = record.get("rule"), record.get("reason")
            return f"denied by the sandbox's policy ({rule}): {where}: {reason}"
    return line.strip()


# -- the tools --------------------------------------------------------------------------


def _opt_str(a: JSON, key: str) -> str | None:
    v = a.get(key)
    return v if isinstance(v, str) else None


async def _run_command(box: Toolbox, a: JSON) -> object:
    timeout = _call_timeout(box, a.get("timeout"))
    r = await box.sb.exec(
        str(a["command"]), timeout=timeout, cwd=_opt_str(a, "cwd"), stdin=_opt_str(a, "stdin")
    )
    value = exec_result(r)
    asked = a.get("timeout")
    if r.timed_out and isinstance(asked, int | float) and timeout and asked > timeout:
        # said, or the caller takes its own timeout for the one that fired
        value["timeout_capped"] = f"asked for {asked:g}s; capped at {timeout:g}s"
    return value


def _call_timeout(box: Toolbox, asked: object) -> float | None:
    """The timeout a tool call gets: what it asked for (checked: ValueError; 0 is
    "the default"), else the toolbox's; never past the policy's, which the
    operator set for every command the caller (a model, an MCP client) runs, nor,
    where the policy sets none, past the toolbox's: 0 or 1e7 lifted the agent
    runtime's 300 s cap and a command held its loop for as long as it liked
    (found by attacking the agent runtime)."""
    from corral.sandbox import check_timeout

    own = check_timeout(asked) if isinstance(asked, int | float) else None
    own = own or box.command_timeout
    limit = box.sb.policy.limits.timeout or box.command_timeout
    if limit and (not own or own > limit):
        return limit
    return own


async def _start_process(box: Toolbox, a: JSON) -> object:
    box.forget_read()
    if len(box.processes) >= MAX_BACKGROUND:
        raise ToolError(
            f"{MAX_BACKGROUND} background processes are kept already: stop one "
            "(stop_process), or read to its end the output of one that ended (process_output)"
        )
    proc = await box.sb.spawn(
        str(a["command"]), cwd=_opt_str(a, "cwd"), output_limit=BACKGROUND_OUTPUT
    )
    box.processes[proc.id] = proc
    return {"id": proc.id, "command": a["command"]}


async def _process_output(box: Toolbox, a: JSON) -> object:
    ident = int(str(a["id"]))
    proc = box.find(ident)
    out, err = proc.read_output(discard=True)  # (read once: not kept on the host)
    return {
        "id": ident,
        "running": proc.running,
        "exit_code": proc.returncode,
        "stdout": out.decode("utf-8", "replace"),
        "stderr": err.decode("utf-8", "replace"),
    }


async def _write_stdin(box: Toolbox, a: JSON) -> object:
    proc = box.find(int(str(a["id"])))
    await proc.write_stdin(str(a["text"]))
    if a.get("close"):
        await proc.close_stdin()
    return "ok"


async def _stop_process(box: Toolbox, a: JSON) -> object:
    ident = int(str(a["id"]))
    proc = box.find(ident)
    await proc.kill()
    result = exec_result(await proc.wait(10))
    box.processes.pop(ident, None)  # (its output goes with this answer)
    return result


async def _list_processes(box: Toolbox, a: JSON) -> object:
    return [{"id": p.id, "pid": p.pid, "argv": p.argv} for p in box.sb.processes()]


async def _read_file(box: Toolbox, a: JSON) -> object:
    data = await box.sb.files.read(str(a["path"]))
    text, cut = _answer_text(data)  # (a 64 MiB file held a server at 2.5 GB)
    if cut:
        text += f"\n[corral: the file is {len(data)} bytes; its middle was left out]"
    return text


async def _write_file(box: Toolbox, a: JSON) -> object:
    content = str(a["content"])
    await box.sb.files.write(str(a["path"]), content)
    return f"wrote {len(content.encode())} bytes to {a['path']}"


async def _list_files(box: Toolbox, a: JSON) -> object:
    return await box.sb.files.list(str(a.get("path", ".")))


async def _describe(box: Toolbox, a: JSON) -> object:
    return box.sb.describe()


async def _read_memory(box: Toolbox, a: JSON) -> object:
    assert box.memory is not None
    return box.memory.read(_opt_str(a, "file"))


_PATH = ("string", "path relative to the workspace (or absolute)")
_ID = ("integer", "the id start_process returned")

TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool(
            "run_command",
            "Run a shell command in the sandbox and wait for it to end.",
            _schema(
                ["command"],
                command=("string", "a shell command line (sh -c)"),
                timeout=(["number", "null"], "seconds before it is stopped"),
                cwd=(["string", "null"], "directory to run in"),
                stdin=(["string", "null"], "text for its standard input"),
            ),
            _run_command,
        ),
        Tool(
            "start_process",
            "Start a command in the background; returns its id.",
            _schema(
                ["command"],
                command=("string", "a shell command line"),
                cwd=(["string", "null"], "directory to run in"),
            ),
            _start_process,
        ),
        Tool(
            "process_output",
            "New output of a background process, and whether it still runs.",
            _schema(["id"], id=_ID),
            _process_output,
        ),
        Tool(
            "write_stdin",
            "Write text to a background process's standard input.",
            _schema(
                ["id", "text"],
                id=_ID,
                text=("string", "what to write"),
                close=("boolean", "close its standard input afterwards"),
            ),
            _write_stdin,
        ),
        Tool(
            "stop_process",
            "Stop a background process and everything it started.",
            _schema(["id"], id=_ID),
            _stop_process,
        ),
        Tool(
            "list_processes",
            "Background processes that are still running.",
            _schema([]),
            _list_processes,
        ),
        Tool(
            "read_file",
            "Read a text file (path relative to the workspace).",
            _schema(["path"], path=_PATH),
            _read_file,
        ),
        Tool(
            "write_file",
            "Write a text file (path relative to the workspace).",
            _schema(["path", "content"], path=_PATH, content=("string", "the whole new text")),
            _write_file,
        ),
        Tool(
            "list_files",
            "List a directory (path relative to the workspace).",
            _schema([], path=_PATH),
            _list_files,
        ),
        Tool(
            "describe_sandbox",
            "What this sandbox allows: tier, writable paths, network.",
            _schema([]),
            _describe,
        ),
        Tool(
            "read_memory",
            "The agent's memory index (MEMORY.md), or one memory file it lists.",
            _schema([], file=(["string", "null"], "agent/NAME.md or user/NAME.md")),
            _read_memory,
            needs_memory=True,
        ),
    )
}
