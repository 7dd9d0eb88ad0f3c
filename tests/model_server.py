"""An OpenAI-compatible chat-completions server on 127.0.0.1 that replays
scripted answers: for the agent runtime's tests, driven through the real
client (corral.brain.ChatBrain over httpx) or the real CLI.

Each scripted step is a JSON body (a dict, sent with status 200), raw bytes
(sent as they are, for a malformed answer), or ``(status, body)``.  Past the
end of the script the server answers ``"done"``.  Every request it got is
kept (``requests``: headers and decoded JSON body).
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Sequence

Step = dict[str, object] | bytes | tuple[int, object]


def completion(
    content: str | None = None,
    calls: Sequence[tuple[str, dict[str, object]]] = (),
    usage: dict[str, int] | None = None,
) -> dict[str, object]:
    """A chat-completions body: ``content`` and/or tool calls ``(name, arguments)``."""
    message: dict[str, object] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            for n, (name, args) in enumerate(calls)
        ]
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        ],
        "usage": usage or {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


class ModelServer:
    def __init__(self, script: Sequence[Step] = (), forever: Step | None = None) -> None:
        """``forever``: the answer to give every time once the script is done."""
        self.script = list(script)
        self.forever = forever
        self.requests: list[dict[str, object]] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(size)
                server.requests.append(
                    {
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": json.loads(raw),
                    }
                )
                status, body = server.next_answer()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def next_answer(self) -> tuple[int, bytes]:
        if self.script:
            step = self.script.pop(0)
        elif self.forever is not None:
            step = self.forever
        else:
            step = completion("done")
        status, body = step if isinstance(step, tuple) else (200, step)
        return status, body if isinstance(body, bytes) else json.dumps(body).encode()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
