"""One JSON line per request or tunnel, and a per-run tally of denials."""

from __future__ import annotations

import os
import time

from corral.runlog import dumps, iso, state_dir


def default_path() -> str:
    return os.path.join(state_dir(), "net.jsonl")


class Audit:
    def __init__(self, path: str | None) -> None:
        self.path = path
        self.fd = -1
        if path:
            os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.denied: dict[str, int] = {}  # "host:port" -> count
        self.requests = 0

    def record(self, entry: dict[str, object]) -> None:
        self.requests += 1
        if entry.get("decision") == "deny":
            key = f"{entry.get('host')}:{entry.get('port')}"
            self.denied[key] = self.denied.get(key, 0) + 1
        if self.fd >= 0:
            line = {"time": iso(time.time()), **entry}
            # one write with O_APPEND: lines from concurrent proxies never interleave
            os.write(self.fd, (dumps(line) + "\n").encode("utf-8", "backslashreplace"))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def summary_line(denied: dict[str, int]) -> str:
    """``denied 3 requests: evil.example:443 (2), 10.0.0.1:80``"""
    total = sum(denied.values())
    parts = [f"{dest} ({n})" if n > 1 else dest for dest, n in sorted(denied.items())]
    return f"network: denied {total} request{'s' if total != 1 else ''}: {', '.join(parts)}"
