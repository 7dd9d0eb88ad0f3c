"""One JSON line per request or tunnel, and a per-run tally of denials.

Lines are buffered and written in batches (every 50 ms, at 64 KiB, and on
close): one ``write`` per request was a third of the proxy's CPU.  Each batch
is one ``write`` with O_APPEND, so lines from concurrent proxies never
interleave.  At most the last 50 ms of lines are lost if the proxy is killed.
"""

from __future__ import annotations

import os
import time

from corral.runlog import iso, state_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

FLUSH_BYTES = 64 * 1024
FLUSH_SECONDS = 0.05


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
        self.errors = 0  # unexpected exceptions inside the proxy (bugs), each one line here
        self.requests = 0
        self._buffer: list[bytes] = []
        self._size = 0
        self._first = 0.0  # when the oldest buffered line was added
        self._encode = _encoder()
        self._stamp = (0, "")  # (whole second, its ISO text) reused within a second

    def record(self, entry: dict[str, object]) -> None:
        self.requests += 1
        if entry.get("decision") == "deny":
            key = f"{entry.get('host')}:{entry.get('port')}"
            self.denied[key] = self.denied.get(key, 0) + 1
        if self.fd < 0:
            return
        now = time.time()
        line = self._encode({"time": self._time(now), **entry}) + "\n"
        data = line.encode("utf-8", "backslashreplace")
        if not self._buffer:
            self._first = now
        self._buffer.append(data)
        self._size += len(data)
        if self._size >= FLUSH_BYTES or now - self._first >= FLUSH_SECONDS:
            self.flush()

    def internal_error(self, run_id: str, where: str, exc: BaseException | None) -> None:
        """One line for an exception nothing expected, written at once, and counted:
        a worker's terminal is the user's, so a traceback must never go there."""
        self.errors += 1
        self.record(
            {
                "run_id": run_id,
                "decision": "error",
                "rule": "internal",
                "reason": describe(where, exc),
            }
        )
        try:
            self.flush()
        except OSError:
            pass

    def _time(self, now: float) -> str:
        second = int(now)
        if self._stamp[0] != second:
            self._stamp = (second, iso(second)[:-5])
        return f"{self._stamp[1]}.{int(now % 1 * 1000):03d}Z"

    def flush(self) -> None:
        if self._buffer and self.fd >= 0:
            os.write(self.fd, b"".join(self._buffer))
        self._buffer.clear()
        self._size = 0

    def close(self) -> None:
        self.flush()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _encoder() -> Callable[[dict[str, object]], str]:
    """Compact JSON by json's own C encoder, without importing the json package
    (its decoder compiles regular expressions: ~2.5 ms on every proxy's start,
    which the first request through a new door waits for)."""
    try:
        from _json import encode_basestring, make_encoder

        encode = make_encoder(
            None, _unserializable, encode_basestring, None, ":", ",", False, False, True
        )
        encode({}, 0)  # the signature json.encoder uses; anything else falls back below
        return lambda entry: "".join(encode(entry, 0))
    except (ImportError, TypeError):
        import json

        return json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _unserializable(value: object) -> object:
    raise TypeError(f"{type(value).__name__} is not JSON")


def describe(where: str, exc: BaseException | None) -> str:
    """``where: Type: message (file.py:123)`` on one line, from the innermost frame."""
    if exc is None:
        return where.replace("\n", " ")
    tb = exc.__traceback__
    place = ""
    while tb is not None:
        place = f" ({os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno})"
        tb = tb.tb_next
    return f"{where}: {type(exc).__name__}: {exc}{place}".replace("\n", " ")


NO_NETWORK = "no-network"  # the rule an audit line names for a lookup in a run without one


def record_lookups(path: str | None, run_id: str, lookups: list[tuple[str, str]]) -> dict[str, int]:
    """Audit the lookups a sandbox without a network made (each one refused by its
    resolver); returns them as a tally, {"name:53": count}, like the proxy's."""
    from corral.net.names import BadName, normalize, printable

    audit = Audit(path or default_path())
    try:
        for name, qtype in lookups:
            try:
                host = normalize(name)
            except BadName:
                host = printable(name)
            audit.record(
                {
                    "run_id": run_id,
                    "scheme": "dns",
                    "method": qtype,
                    "path": None,
                    "host": host,
                    "port": 53,
                    "address": None,
                    "decision": "deny",
                    "rule": NO_NETWORK,
                    "reason": "the sandbox has no network (network mode none)",
                    "status": 3,  # NXDOMAIN
                    "bytes_up": 0,
                    "bytes_down": 0,
                    "duration": 0.0,
                }
            )
    finally:
        audit.close()
    return dict(audit.denied)


def summary_line(denied: dict[str, int]) -> str:
    """``denied 3 requests: evil.example:443 (2), 10.0.0.1:80``"""
    total = sum(denied.values())
    parts = [f"{dest} ({n})" if n > 1 else dest for dest, n in sorted(denied.items())]
    return f"network: denied {total} request{'s' if total != 1 else ''}: {', '.join(parts)}"


def guard_process(audit: Audit, run_id: str) -> None:
    """In a proxy process: what Python would print to stderr for an exception in a
    thread or in a finalizer becomes one counted audit line instead."""
    import sys
    import threading

    def unraisable(info: sys.UnraisableHookArgs) -> None:
        audit.internal_error(run_id, str(info.err_msg or "unraisable"), info.exc_value)

    def in_thread(args: threading.ExceptHookArgs) -> None:
        audit.internal_error(run_id, "thread", args.exc_value)

    sys.unraisablehook = unraisable
    threading.excepthook = in_thread
