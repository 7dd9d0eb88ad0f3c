"""The agent runtime's brain: what answers each turn with text or tool calls.

:class:`ChatBrain` speaks OpenAI-compatible chat completions over ``httpx``;
it runs on the host, in the runtime's process, so the key it sends never
enters the sandbox (only tools run there).  :class:`ScriptedBrain` replays a
list of turns, for tests and demos.
"""

from __future__ import annotations

import asyncio
import json
import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from corral.errors import CorralError

JSON = dict[str, object]


class BrainError(CorralError):
    """The model could not be asked or answered something unusable; one line."""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it (checked when the tool runs)


@dataclass
class Reply:
    """One model turn."""

    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    usage: JSON = field(default_factory=dict)

    def message(self) -> JSON:
        """The assistant message that goes back into the history."""
        msg: JSON = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.tool_calls
            ]
        return msg


class Brain:
    """What the runtime asks: one turn, given the messages so far and the tools."""

    async def turn(self, messages: list[JSON], tools: list[JSON]) -> Reply:
        raise NotImplementedError

    async def close(self) -> None:
        pass


def parse_reply(data: object) -> Reply:
    """A chat-completions response body (decoded JSON) as a :class:`Reply`;
    BrainError if it is not one."""
    try:
        assert isinstance(data, dict)
        choice = data["choices"][0]
        message = choice["message"]
        assert isinstance(message, dict)
        content = message.get("content")
        assert content is None or isinstance(content, str)
        calls = []
        for n, raw in enumerate(message.get("tool_calls") or []):
            fn = raw["function"]
            args = fn.get("arguments", "{}")
            if not isinstance(args, str):  # some servers send the object itself
                args = json.dumps(args)
            calls.append(ToolCall(str(raw.get("id") or f"call_{n}"), str(fn["name"]), args))
        usage = data.get("usage") or {}
        assert isinstance(usage, dict)
        finish = choice.get("finish_reason") or ("tool_calls" if calls else "stop")
        return Reply(content, calls, str(finish), usage)
    except (AssertionError, KeyError, IndexError, TypeError, AttributeError):
        text = json.dumps(data)[:200] if not isinstance(data, bytes) else repr(data[:200])
        raise BrainError(f"malformed model response: {text}") from None


# A model's answer, bounded: at most MAX_RESPONSE bytes of body once decoded
# (gzip is read a bounded piece at a time), and all of it within DEADLINE seconds.
# An endless answer held the host at 1.5 GB, an 815 KB gzip bomb at 3.3 GB, and
# a byte every 10 s kept a turn going past the 120 s timeout (found by attacking
# the agent runtime).
MAX_RESPONSE = 16 << 20
DEADLINE = 300.0


class ChatBrain(Brain):
    """An OpenAI-compatible ``/chat/completions`` endpoint."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 120.0,
        extra: JSON | None = None,
        max_response: int = MAX_RESPONSE,
        deadline: float = DEADLINE,
    ) -> None:
        """``timeout``: for each step (connect, each read); ``deadline``: for the
        whole request, answer included; ``max_response``: bytes of decoded body."""
        import httpx

        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.max_response = max_response
        self.deadline = deadline
        # identity: a compressed body is decoded here, bounded, but need not be
        headers = {"Accept-Encoding": "identity"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.extra = extra or {}
        # trust_env=False: the runtime's own requests do not go through whatever
        # proxy the host's environment names
        self.client = httpx.AsyncClient(headers=headers, timeout=timeout, trust_env=False)

    async def turn(self, messages: list[JSON], tools: list[JSON]) -> Reply:
        import httpx

        body: JSON = {"model": self.model, "messages": messages, **self.extra}
        if tools:
            body["tools"] = tools
        try:
            status, raw = await asyncio.wait_for(self._post(body), self.deadline)
        except TimeoutError:
            raise BrainError(
                f"model server {self.url} did not answer within {self.deadline:g}s"
            ) from None
        except httpx.HTTPError as exc:
            why = str(exc) or type(exc).__name__
            raise BrainError(f"model server {self.url} unreachable: {why}") from None
        text = raw.decode("utf-8", "replace")
        if status != 200:
            line = text.strip().replace("\n", " ")[:200]
            raise BrainError(f"model server {self.url} answered {status}: {line}")
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            raise BrainError(f"malformed model response (not JSON): {text[:200]!r}") from None
        return parse_reply(data)

    async def _post(self, body: JSON) -> tuple[int, bytes]:
        """POST ``body``; the status and the decoded body, at most max_response bytes
        of it (past that: BrainError; an error status's first 4 KiB only)."""
        async with self.client.stream("POST", self.url, json=body) as resp:
            cap = self.max_response if resp.status_code == 200 else 4096
            inflate = _inflater(resp.headers.get("content-encoding", ""), self.url)
            got = bytearray()
            async for chunk in resp.aiter_raw():
                room = cap - len(got)
                # max_length: a bomb's chunk never grows past the room left (+1 to see it)
                part = inflate.decompress(chunk, room + 1) if inflate else chunk
                if len(part) > room:
                    if resp.status_code != 200:
                        got += part[:room]
                        break
                    raise BrainError(
                        f"model server {self.url} answered more than {cap} bytes: not read"
                    )
                got += part
            return resp.status_code, bytes(got)

    async def close(self) -> None:
        await self.client.aclose()


def _inflater(encoding: str, url: str) -> zlib._Decompress | None:
    """A decoder for a body's Content-Encoding (none for identity)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompressobj()
    raise BrainError(f"model server {url} answered in an encoding corral does not read: {encoding}")


Turn = Reply | Callable[[list[JSON]], Reply]


class ScriptedBrain(Brain):
    """Replays ``turns`` in order (a Reply, or a function of the messages that
    returns one); past the end it answers "done"."""

    def __init__(self, turns: Sequence[Turn]) -> None:
        self.turns = list(turns)
        self.seen: list[list[JSON]] = []  # the messages of each turn asked

    async def turn(self, messages: list[JSON], tools: list[JSON]) -> Reply:
        self.seen.append(list(messages))
        if not self.turns:
            return Reply("done")
        step = self.turns.pop(0)
        return step(messages) if callable(step) else step


def call(name: str, ident: str = "", **arguments: object) -> ToolCall:
    """A tool call for a scripted turn."""
    return ToolCall(ident or f"call_{name}_{os.urandom(3).hex()}", name, json.dumps(arguments))


@dataclass
class BrainConfig:
    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None

    @classmethod
    def load(
        cls, path: str | None, base_url: str | None, model: str | None, env: dict[str, str]
    ) -> BrainConfig:
        """Flags first, then the environment (CORRAL_AGENT_BASE_URL, CORRAL_AGENT_MODEL,
        CORRAL_AGENT_API_KEY, or the OPENAI_ ones), then the agent's config.toml
        (base_url, model; never the key, which stays in the environment)."""
        file: JSON = {}
        if path and os.path.exists(path):
            import tomllib

            try:
                with open(path, "rb") as fh:
                    file = tomllib.load(fh)
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise BrainError(f"{path}: {exc}") from None

        def pick(flag: str | None, names: tuple[str, ...], key: str) -> str | None:
            found = flag or next((env[n] for n in names if env.get(n)), None)
            if found is None and isinstance(file.get(key), str):
                found = str(file[key])
            return found

        return cls(
            pick(base_url, ("CORRAL_AGENT_BASE_URL", "OPENAI_BASE_URL"), "base_url"),
            pick(model, ("CORRAL_AGENT_MODEL", "OPENAI_MODEL"), "model"),
            next((env[n] for n in KEY_VARIABLES if env.get(n)), None),
        )

    def brain(self) -> ChatBrain:
        if not self.base_url:
            raise BrainError(
                "no model server: give --base-url, or set CORRAL_AGENT_BASE_URL "
                "(or base_url in the agent's config.toml)"
            )
        if not self.model:
            raise BrainError("no model: give --model, or set CORRAL_AGENT_MODEL")
        return ChatBrain(self.base_url, self.model, self.api_key)


# where the key may come from; the runtime keeps these names out of the sandbox
KEY_VARIABLES = ("CORRAL_AGENT_API_KEY", "OPENAI_API_KEY")
