"""corral's own agent runtime: events in, a model decides, every tool call runs
in one long-lived corral sandbox.

    rt = Runtime(ChatBrain(url, model, key), policy, directory="~/.local/state/corral/agents/a")
    await rt.start()
    answer = await rt.fire(Event("task", "make the tests pass"))
    await rt.stop()

Listeners (:class:`Timer`, :class:`StdinLines`, :class:`FileWatch`,
:class:`Webhook`) feed an asyncio queue; the route loop takes one event at a
time: model turn (system prompt with the sandbox's ``describe()``, the recent
history, the tools' schemas) → each tool call run in the sandbox → results
back to the model → again, until it answers without tool calls or
``max_turns``.  A tool that fails, times out or is refused is a tool error
with corral's reason for the model; a model that cannot be asked ends that
event with an error in the log, and the loop waits for the next one.

The runtime and its brain run on the host: the model's key never enters the
sandbox.  Named differently from :mod:`corral.agent`, the process inside it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from corral import runlog
from corral.brain import KEY_VARIABLES, Brain, BrainError, Reply
from corral.errors import CorralError
from corral.memory import Memory
from corral.sandbox import AsyncSandbox
from corral.tools import TOOLS, Toolbox

JSON = dict[str, object]
MAX_TURNS = 10
COMMAND_TIMEOUT = 300.0  # seconds for a command the model gave no timeout (the loop never hangs)
HISTORY_EVENTS = 5  # the events whose messages the model sees again
# What one request to the model carries, bounded: a reply's tool calls past
# MAX_CALLS are not run (each is answered with a tool error saying so), a tool's
# answer keeps its first and last TOOL_ANSWER/2 characters, and the history is cut
# to HISTORY_BYTES (the oldest tool answers and arguments shortened first, then
# the oldest events dropped).  80 calls in one reply, each printing 1 MiB, held
# the host at 1.84 GB (found by attacking the agent runtime).
MAX_CALLS = 16
TOOL_ANSWER = 128 << 10
HISTORY_BYTES = 2 << 20
SHORT = 200  # what is left of a shortened message (its start)

SYSTEM = (
    "You are an agent run by corral. You act only through the tools you are given; "
    "every tool runs inside a corral sandbox, never on the host. A tool that is refused "
    "answers with corral's reason: do not retry what the policy forbids. When the task "
    "is done, answer with a short final message and no tool calls."
)


@dataclass
class Event:
    """Something that wakes the agent: ``kind`` (task, timer, stdin, file,
    webhook) and the text the model reads."""

    kind: str
    text: str
    data: JSON = field(default_factory=dict)


@dataclass
class Answer:
    """How an event ended: ``finish`` is "stop" (the model answered), "max_turns"
    or "error" (``error`` says what)."""

    text: str
    finish: str
    turns: int
    error: str | None = None


# What one log record holds: each string cut to LOG_TEXT characters, each list to
# LOG_ITEMS items (a command's output went into the log three times per call, and
# 20 calls made 130 MB of it: found by attacking the agent runtime); past LOG_BYTES
# the log is renamed activity.jsonl.1 (the one before is dropped) and begun again
LOG_TEXT = 2000
LOG_ITEMS = 20
LOG_BYTES = 64 << 20


class ActivityLog:
    """One JSON line per step (wake, model, tool, answer, error, ask, start,
    stop), written and flushed as it happens: ``<directory>/activity.jsonl``."""

    def __init__(self, path: Path, max_bytes: int = LOG_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.failed = False  # a write failed already (said once on stderr)
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600))
        except OSError as exc:
            raise CorralError(f"the agent's log {path}: {exc.strerror or exc}") from None

    def write(self, kind: str, **fields: object) -> None:
        """Append one record, bounded; a write that fails (a full disk) is said once
        on stderr and the runtime goes on: it killed the route loop, and
        ``corral agent run`` waited for ever (found by attacking it)."""
        record = {"t": runlog.iso(time.time()), "kind": kind, **fields}
        try:
            self._rotate()
            runlog.append(bounded(record), str(self.path))  # type: ignore[arg-type]
        except OSError as exc:
            if not self.failed:
                self.failed = True
                why = exc.strerror or str(exc)
                sys.stderr.write(f"corral: agent: cannot write its log {self.path}: {why}\n")

    def _rotate(self) -> None:
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            return
        if size >= self.max_bytes:
            os.replace(self.path, f"{self.path}.1")


def bounded(value: object, depth: int = 0) -> object:
    """``value`` with every string cut to LOG_TEXT and every list to LOG_ITEMS
    (each cut says how much went), nested at most 6 deep."""
    if isinstance(value, str):
        if len(value) <= LOG_TEXT:
            return value
        return value[:LOG_TEXT] + f"...[corral: {len(value) - LOG_TEXT} more characters]"
    if depth >= 6 and isinstance(value, list | tuple | dict):
        return bounded(str(value)[: LOG_TEXT + 1], depth)
    if isinstance(value, list | tuple):
        items = [bounded(v, depth + 1) for v in value[:LOG_ITEMS]]
        if len(value) > LOG_ITEMS:
            items.append(f"[corral: {len(value) - LOG_ITEMS} more items]")
        return items
    if isinstance(value, dict):
        return {str(k)[:LOG_TEXT]: bounded(v, depth + 1) for k, v in value.items()}
    return value


# a listener runs as a task of its own while the runtime runs: it calls rt.fire()
Listener = Callable[["Runtime"], Awaitable[None]]


class Runtime:
    def __init__(
        self,
        brain: Brain,
        policy: object = None,
        *,
        directory: str | os.PathLike[str],
        max_turns: int = MAX_TURNS,
        max_calls: int = MAX_CALLS,
        history_bytes: int = HISTORY_BYTES,
        on_ask: Callable[[object], object] | None = None,
        listeners: Sequence[Listener] = (),
        **sandbox: object,
    ) -> None:
        """``policy``: as :class:`~corral.sandbox.AsyncSandbox` takes it (None: the
        workspace's); ``sandbox``: its other keywords (tier, workspace, image...).
        ``on_ask``: answers the network requests an ask rule holds (None: deny).
        ``directory``: the agent's own (its activity log), on the host."""
        self.brain = brain
        self.directory = Path(directory).expanduser()
        self.log = ActivityLog(self.directory / "activity.jsonl")
        self.max_turns = max_turns
        self.max_calls = max_calls
        self.history_bytes = history_bytes
        self.listeners = list(listeners)
        self._on_ask = on_ask
        self._policy = policy
        self._sandbox_options = sandbox
        self.sb: AsyncSandbox | None = None
        self.box: Toolbox | None = None
        self.queue: asyncio.Queue[tuple[Event, asyncio.Future[Answer]]] = asyncio.Queue()
        self.history: list[list[JSON]] = []  # the messages of each recent event
        self._tasks: list[asyncio.Task[None]] = []
        # an event is being handled; events handled so far (a file watcher takes in
        # the changes made meanwhile silently: they are the agent's own)
        self.busy = False
        self.handled = 0
        self.memory = Memory(self.directory / "memory")
        self.tools = [t.schema() for t in TOOLS.values()]  # all: this toolbox has a memory

    # -- life cycle -------------------------------------------------------------------

    async def start(self) -> Runtime:
        """Open the sandbox, then start the route loop and the listeners."""
        from corral import policy as pol

        policy = self._policy
        if policy is None:
            workspace = self._sandbox_options.get("workspace")
            policy = pol.load(str(workspace) if workspace else None)
        _keep_key_out(policy)
        keep_dir_out(policy, self.directory)
        try:
            made = self.memory.ensure()
        except OSError as exc:
            raise CorralError(f"the agent's memory {self.memory.dir}: {exc.strerror}") from None
        options = dict(self._sandbox_options)
        options.pop("workspace", None)  # the policy has it now
        self.sb = AsyncSandbox(policy, on_ask=self._ask, kind="agent", **options)  # type: ignore[arg-type]
        try:
            await self.sb.start()
        except BaseException as exc:
            self.log.write("error", where="start", message=_line(exc))
            raise
        self.box = Toolbox(self.sb, self.memory, COMMAND_TIMEOUT)
        self.log.write("start", tier=self.sb.tier.name, run_id=self.sb.run_id)
        if made:
            self.log.write("memory", created=str(self.memory.index))
        self._tasks = [asyncio.create_task(self._route())]
        self._tasks += [asyncio.create_task(self._listen(lis)) for lis in self.listeners]
        return self

    async def stop(self) -> None:
        """Stop the listeners and the loop, close the sandbox and the brain."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks = []
        while not self.queue.empty():  # events nobody will answer now
            _, future = self.queue.get_nowait()
            if not future.done():
                future.cancel()
        await self.brain.close()
        if self.sb is not None:
            await self.sb.close()
            denials = [d.text for d in self.sb.denials if d.text]
            self.log.write("stop", denials=denials)
            self.sb = None

    async def __aenter__(self) -> Runtime:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def fire(self, event: Event) -> asyncio.Future[Answer]:
        """Queue ``event``; the future holds its :class:`Answer`."""
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self.queue.put_nowait((event, future))
        return future

    # -- the route loop ---------------------------------------------------------------

    async def _route(self) -> None:
        while True:
            event, future = await self.queue.get()
            self.busy = True
            answer = Answer("", "error", 0, "the runtime stopped")
            try:
                answer = await self.handle(event)
            except Exception as exc:  # a bug of ours: logged, and the loop goes on
                answer = Answer("", "error", 0, _line(exc))
                self.log.write("error", where="route", message=_line(exc))
            finally:
                # always resolved: whoever waits for this event (corral agent run) must
                # not wait for ever, whatever went wrong (cancelled: stop() runs)
                self.busy = False
                self.handled += 1
                if not future.done():
                    future.set_result(answer)

    async def _listen(self, listener: Listener) -> None:
        try:
            await listener(self)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.write("error", where="listener", message=_line(exc))

    def system_prompt(self) -> str:
        assert self.sb is not None
        return f"{SYSTEM}\n\n{self.sb.describe()}"

    async def handle(self, event: Event) -> Answer:
        """One event, to the end: turns of the model and its tool calls."""
        self.log.write("wake", event=event.kind, text=event.text, data=event.data)
        mine: list[JSON] = [{"role": "user", "content": f"[{event.kind}] {event.text}"}]
        self.history.append(mine)
        del self.history[:-HISTORY_EVENTS]
        system: JSON = {"role": "system", "content": self.system_prompt()}
        for turn in range(1, self.max_turns + 1):
            bound_history(self.history, self.history_bytes)
            messages = [system, *(m for msgs in self.history for m in msgs)]
            began = time.monotonic()
            try:
                reply = await self.brain.turn(messages, self.tools)
            except BrainError as exc:
                self.log.write("error", where="model", turn=turn, message=exc.message)
                return self._answer(Answer("", "error", turn, exc.message))
            self._log_reply(turn, reply, time.monotonic() - began)
            mine.append(reply.message())
            if not reply.tool_calls:
                return self._answer(Answer(reply.content or "", "stop", turn))
            for n, tool_call in enumerate(reply.tool_calls):
                if n < self.max_calls:
                    mine.append(
                        await self._run_tool(tool_call.id, tool_call.name, tool_call.arguments)
                    )
                else:  # every call gets an answer (the chat API wants one per id)
                    mine.append(self._not_run(tool_call.id, len(reply.tool_calls)))
            if len(reply.tool_calls) > self.max_calls:
                self.log.write(
                    "error", where="max_calls", turn=turn, calls=len(reply.tool_calls),
                    message=f"{len(reply.tool_calls) - self.max_calls} tool calls not run",
                )  # fmt: skip
        message = f"stopped after max_turns={self.max_turns} turns without a final answer"
        self.log.write("error", where="max_turns", message=message)
        return self._answer(Answer("", "max_turns", self.max_turns, message))

    async def _run_tool(self, ident: str, name: str, arguments: str) -> JSON:
        assert self.box is not None
        began = time.monotonic()
        outcome = await self.box.call(name, arguments)
        self.log.write(
            "tool",
            id=ident,
            name=name,
            arguments=arguments,
            exit_code=outcome.exit_code,
            seconds=round(time.monotonic() - began, 4),
            # its first lines: the whole answer (the command's output) goes to the
            # model, not into the log
            error=None if outcome.error is None else summary(outcome.error),
            denials=outcome.denials,
            denied=outcome.denied,
        )
        return {"role": "tool", "tool_call_id": ident, "content": cut(outcome.text(), TOOL_ANSWER)}

    def _not_run(self, ident: str, calls: int) -> JSON:
        text = (
            f"error: not run: corral runs at most {self.max_calls} tool calls of one reply "
            f"and this one had {calls}; ask for the rest in the next turn"
        )
        return {"role": "tool", "tool_call_id": ident, "content": text}

    def _log_reply(self, turn: int, reply: Reply, seconds: float) -> None:
        self.log.write(
            "model",
            turn=turn,
            content=reply.content,
            tool_calls=[
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls
            ],
            finish_reason=reply.finish_reason,
            usage=reply.usage,
            seconds=round(seconds, 4),
        )

    def _answer(self, answer: Answer) -> Answer:
        self.log.write(
            "answer", finish=answer.finish, turns=answer.turns, text=answer.text, error=answer.error
        )
        return answer

    # -- network asks -----------------------------------------------------------------

    async def _ask(self, info: object) -> object:
        """A request an ask rule holds: the runtime's callback decides; none: deny."""
        from corral.net.asking import Decision

        where = (
            f"{getattr(info, 'method', '')} {getattr(info, 'host', '')}:{getattr(info, 'port', '')}"
        )
        if self._on_ask is None:
            self.log.write("ask", request=where, decision="deny", why="no approval callback")
            return Decision.deny()
        try:
            result = self._on_ask(info)
            if asyncio.iscoroutine(result):
                result = await result
            decision = Decision.read(result)
        except Exception as exc:
            self.log.write("ask", request=where, decision="deny", why=_line(exc))
            return Decision.deny()
        self.log.write("ask", request=where, decision="allow" if decision.allow else "deny")
        return decision


def summary(text: str, lines: int = 5, width: int = 200) -> str:
    """The first ``lines`` lines of ``text``, each cut to ``width``, and a count of the rest."""
    parts = text.split("\n", lines)
    shown = [p[:width] + ("..." if len(p) > width else "") for p in parts[:lines]]
    if len(parts) > lines:
        shown.append(f"[corral: {parts[lines].count(chr(10)) + 1} more lines]")
    return "\n".join(shown)


def cut(text: str, limit: int) -> str:
    """``text``, or its first and last ``limit // 2`` characters with a line
    saying how many were left out between."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return (
        f"{text[:half]}\n[corral: {len(text) - 2 * half} characters left out here]\n{text[-half:]}"
    )


def _size(message: JSON) -> int:
    """At least the bytes ``message`` takes in a request (escaped to ASCII, each
    character is at least as long as in UTF-8)."""
    return len(json.dumps(message))


def bound_history(history: list[list[JSON]], limit: int) -> None:
    """Cut the messages of ``history`` (the recent events', oldest first; the last
    is the current one) to ``limit`` bytes of JSON: the oldest tool answers
    and tool-call arguments are shortened first, then old events dropped."""
    total = sum(_size(m) for msgs in history for m in msgs)
    for message in (m for msgs in history for m in msgs):
        if total <= limit:
            return
        before = _size(message)
        _shorten(message)
        total -= before - _size(message)
    while total > limit and len(history) > 1:  # shortened all, still over: drop the oldest
        total -= sum(_size(m) for m in history.pop(0))


def _shorten(message: JSON) -> None:
    """A message of the history made short: the start of its text, and a note."""

    def short(text: object) -> object:
        if not isinstance(text, str) or len(text) <= SHORT:
            return text
        return f"{text[:SHORT]}...[corral: {len(text) - SHORT} characters left out of the history]"

    if message.get("role") in ("tool", "assistant"):
        message["content"] = short(message.get("content"))
    calls = message.get("tool_calls")
    for tool_call in calls if isinstance(calls, list) else []:
        fn = tool_call.get("function") if isinstance(tool_call, dict) else None
        if isinstance(fn, dict) and len(str(fn.get("arguments"))) > SHORT:
            # still JSON: a server may parse the arguments of the history's calls
            left = f"{len(str(fn.get('arguments')))} characters left out of the history"
            fn["arguments"] = json.dumps({"corral": left})


def _keep_key_out(policy: object) -> None:
    """The model's key is the runtime's, never the sandbox's: a policy that would
    pass its variable into the sandbox is refused."""
    env = getattr(policy, "env", None)
    names = [*getattr(env, "pass_names", []), *getattr(env, "set_values", {})]
    leaked = [n for n in KEY_VARIABLES if n in names]
    if leaked:
        raise CorralError(
            f"the policy passes {', '.join(leaked)} into the sandbox; the agent runtime keeps "
            "the model's key on the host: remove it from [env] pass"
        )


def keep_dir_out(policy: object, directory: str | os.PathLike[str]) -> None:
    """The agent's own directory (its config with the model's address, its memory,
    its activity log) must be out of the sandbox's reach: inside a writable place
    the sandbox could link its memory to a host file the runtime then reads, point
    the next run's model (and key) at another server, or turn the log into a link
    to anywhere.  Refused, as is a directory holding a writable place."""
    paths = getattr(policy, "writable_paths", None)
    if paths is None:
        return
    mine = os.path.realpath(os.path.expanduser(os.fspath(directory)))
    for place in paths():
        real = os.path.realpath(place)
        if _within(mine, real) or _within(real, mine):
            raise CorralError(
                f"the agent's directory {mine} overlaps the sandbox's writable place {real}: "
                "the sandbox could rewrite its config, memory and log; "
                "choose a directory outside it (--dir)"
            )


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _line(exc: BaseException) -> str:
    text = str(getattr(exc, "message", "") or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# -- listeners ------------------------------------------------------------------------


class Timer:
    """An event every ``interval`` seconds; a tick whose last event is still
    queued or being handled is skipped (ticks queued without bound behind a slow
    event: found by attacking the agent runtime)."""

    def __init__(self, interval: float, text: str = "timer tick") -> None:
        self.interval = interval
        self.text = text
        self.skipped = 0

    async def __call__(self, rt: Runtime) -> None:
        n = 0
        pending: asyncio.Future[Answer] | None = None
        while True:
            await asyncio.sleep(self.interval)
            n += 1
            if pending is not None and not pending.done():
                self.skipped += 1
                continue
            pending = rt.fire(Event("timer", self.text, {"n": n}))


class StdinLines:
    """An event per non-empty line read from ``fd`` (standard input by default);
    it stops listening at end of file."""

    def __init__(self, fd: int = 0) -> None:
        self.fd = fd

    async def __call__(self, rt: Runtime) -> None:
        import stat

        pipe = os.fdopen(os.dup(self.fd), "rb", buffering=0)
        if stat.S_ISREG(os.fstat(pipe.fileno()).st_mode):  # a file never blocks: read it now
            with pipe:
                for line in pipe.read().decode("utf-8", "replace").splitlines():
                    if line.strip():
                        rt.fire(Event("stdin", line.strip()))
            return
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), pipe
        )
        try:
            while line := await reader.readline():
                text = line.decode("utf-8", "replace").strip()
                if text:
                    rt.fire(Event("stdin", text))
        finally:
            transport.close()


class FileWatch:
    """An event when files under ``root`` (the workspace by default) change,
    looked at every ``interval`` seconds.  Changes made while the runtime
    handles an event are its own tools' (or come with them): they are taken in
    silently, so an agent does not wake itself."""

    SKIP = frozenset({".git", "node_modules", ".venv", "venv", "__pycache__", ".tox"})
    # entries (files and directories) looked at per scan, and how deep: a tree 1,100
    # deep stopped the watcher (RecursionError), and 300,000 empty directories, not
    # counted, made a 1 s scan take 13-58 s (found by attacking the agent runtime)
    LIMIT = 20_000
    DEPTH = 32

    def __init__(self, root: str | None = None, interval: float = 1.0) -> None:
        self.root = root
        self.interval = interval

    def scan(self, root: str) -> dict[str, tuple[int, int]]:
        """Files under ``root`` by relative path: (mtime, size); at most LIMIT
        entries looked at, DEPTH directories deep, iteratively."""
        seen: dict[str, tuple[int, int]] = {}
        entries = 0
        stack: list[tuple[str, int]] = [(root, 0)]
        while stack:
            top, depth = stack.pop()
            try:
                with os.scandir(top) as listing:
                    found = list(itertools.islice(listing, self.LIMIT - entries))
            except OSError:
                continue
            entries += len(found)
            for entry in found:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name not in self.SKIP and depth + 1 < self.DEPTH:
                            stack.append((entry.path, depth + 1))
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                seen[os.path.relpath(entry.path, root)] = (st.st_mtime_ns, st.st_size)
            if entries >= self.LIMIT:
                break
        return seen

    async def __call__(self, rt: Runtime) -> None:
        assert rt.sb is not None
        root = self.root or rt.sb.policy.workspace
        loop = asyncio.get_running_loop()
        # counted before the baseline scan, as in the loop: an event handled while it
        # ran may have written after the scan passed by (its write is not news)
        handled = rt.handled
        before = await loop.run_in_executor(None, self.scan, root)
        while True:
            await asyncio.sleep(self.interval)
            # counted before the scan: an event handled while it ran may have written
            # after it passed by, so the next scan is the first to see that write
            # and must be a baseline too
            at_start, busy_at_start = rt.handled, rt.busy
            now = await loop.run_in_executor(None, self.scan, root)
            changed = sorted(p for p, v in now.items() if before.get(p) != v)
            removed = sorted(p for p in before if p not in now)
            quiet = busy_at_start or rt.busy or rt.handled != handled or not rt.queue.empty()
            before, handled = now, at_start
            if (changed or removed) and not quiet:
                shown = ", ".join([*changed, *(f"{p} (removed)" for p in removed)][:20])
                rt.fire(
                    Event(
                        "file", f"files changed: {shown}", {"changed": changed, "removed": removed}
                    )
                )


class Webhook:
    """An event per POST to ``http://127.0.0.1:PORT/`` that carries
    ``Authorization: Bearer TOKEN``; the body (JSON ``{"text": ...}`` or plain
    text, at most 64 KiB) is the event's text.  Loopback only."""

    MAX_BODY = 64 * 1024

    def __init__(self, token: str, port: int = 0, host: str = "127.0.0.1") -> None:
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise CorralError(f"the webhook listens on loopback only, not {host}")
        if len(token) < 16:
            raise CorralError("the webhook's token must be at least 16 characters")
        self.token = token
        self.host = host
        self.port = port
        self.bound = asyncio.Event()  # set once self.port is the real port

    async def __call__(self, rt: Runtime) -> None:
        server = await asyncio.start_server(
            lambda r, w: self._serve(rt, r, w), self.host, self.port
        )
        self.port = server.sockets[0].getsockname()[1]
        self.bound.set()
        async with server:
            await server.serve_forever()

    async def _serve(
        self, rt: Runtime, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            status, text = await asyncio.wait_for(self._request(rt, reader), 10)
        except (TimeoutError, ValueError, asyncio.LimitOverrunError, asyncio.IncompleteReadError,
                ConnectionError):  # fmt: skip
            status, text = 400, "bad request"
        body = (text + "\n").encode()
        writer.write(
            f"HTTP/1.1 {status} {_STATUS[status]}\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        try:
            await writer.drain()
            writer.close()
        except ConnectionError:
            pass

    async def _request(self, rt: Runtime, reader: asyncio.StreamReader) -> tuple[int, str]:
        import hmac
        import json

        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > 16 * 1024:
            return 400, "header too large"
        lines = head.decode("latin-1").split("\r\n")
        method = lines[0].split(" ", 1)[0]
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        given = headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
            return 401, "unauthorized"
        if method != "POST":
            return 405, "POST only"
        size = int(headers.get("content-length", "0"))
        if size < 0 or size > self.MAX_BODY:
            return 413, "body too large"
        raw = (await reader.readexactly(size)).decode("utf-8", "replace")
        text = raw
        if headers.get("content-type", "").startswith("application/json"):
            data = json.loads(raw)
            text = str(data.get("text", "")) if isinstance(data, dict) else ""
        if not text.strip():
            return 400, "empty event"
        rt.fire(Event("webhook", text.strip()))
        return 202, "queued"


_STATUS = {
    202: "Accepted",
    400: "Bad Request",
    401: "Unauthorized",
    405: "Method Not Allowed",
    413: "Content Too Large",
}
