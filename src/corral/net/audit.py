"""One JSON line per request or tunnel, and a per-run tally of denials.

The tally keeps what a person needs to act on a denial, not just a count: per
destination, the rule that decided, its reason, whether it was a name lookup,
and the address an allowed name resolved to (the rebinding guard's refusals).
It also keeps what the policy allowed but could not be reached (a host service
with nothing listening, an upstream whose certificate failed): the client saw
only a reset or a 502, and corral says why after the run.

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
# Bounds on what one run can make corral keep: a command in a loop of refused
# requests would otherwise fill the user's disk through this log, and the
# proxy's memory through the tally (one entry per distinct destination).
# Beyond them requests are counted, and the log says so.
RUN_MAX_BYTES = 256 << 20
# A log that grew past this is moved aside (to NAME.1, replacing the one there) by
# the next run that opens it: every run is bounded, and so is the log of all runs.
KEEP_BYTES = 256 << 20
TALLY_MAX = 10_000
# Names a run's resolver answered and hosts it asked the proxy for, kept to tell a
# tool that ignores the proxy variables (it looks a name up, then connects
# directly, which the sandbox cannot): see :func:`usage_lines`
LOOKED_MAX = 64
ASKED_MAX = 256
OTHERS = "(others)"  # the tally's host for destinations beyond TALLY_MAX


def default_path() -> str:
    return os.path.join(state_dir(), "net.jsonl")


class Audit:
    def __init__(self, path: str | None) -> None:
        self.path = path
        self.fd = -1
        if path:
            from corral.runlog import open_log

            self.fd = open_log(path)  # (no link followed: see open_log)
            if os.fstat(self.fd).st_size > KEEP_BYTES:
                self.fd = _moved_aside(path, self.fd)
        self.denied: dict[DenyKey, int] = {}  # (host, port, rule, reason, ...) -> count
        self.looked_up: dict[str, str] = {}  # name the resolver answered -> an address
        self.asked: set[str] = set()  # hosts asked of the proxy (connections, requests)
        self.errors = 0  # unexpected exceptions inside the proxy (bugs), each one line here
        self.requests = 0
        self._buffer: list[bytes] = []
        self._size = 0
        self._first = 0.0  # when the oldest buffered line was added
        self._encode = _encoder()
        self._stamp = (0, "")  # (whole second, its ISO text) reused within a second
        self._written: dict[object, int] = {}  # run id -> bytes of its lines so far
        self.unwritten: dict[object, int] = {}  # run id -> lines beyond RUN_MAX_BYTES

    def record(self, entry: dict[str, object]) -> None:
        self.requests += 1
        host = entry.get("host")
        if isinstance(host, str):
            self._usage(host, entry)
        if entry.get("decision") == "deny" or entry.get("status") == UNREACHABLE:
            key = deny_key(entry)
            if key not in self.denied and len(self.denied) >= TALLY_MAX:
                key = (OTHERS, 0, "", "more destinations than corral tallies", key[4], "")
            self.denied[key] = self.denied.get(key, 0) + 1
        if self.fd < 0:
            return
        run = entry.get("run_id")
        if run in self.unwritten:
            self.unwritten[run] += 1
            return
        now = time.time()
        line = self._encode({"time": self._time(now), **entry}) + "\n"
        data = line.encode("utf-8", "backslashreplace")
        written = self._written.get(run, 0) + len(data)
        self._written[run] = written
        if written > RUN_MAX_BYTES:
            self.unwritten[run] = 1
            data = self._note(run, now, f"this run's lines passed {RUN_MAX_BYTES >> 20} MiB")
        if not self._buffer:
            self._first = now
        self._buffer.append(data)
        self._size += len(data)
        # a refusal is written at once: whoever reads the log after the command
        # ended (corral batch --reuse, a person) finds it there
        if (
            self._size >= FLUSH_BYTES
            or now - self._first >= FLUSH_SECONDS
            or entry.get("decision") == "deny"
        ):
            self.flush()

    def _usage(self, host: str, entry: dict[str, object]) -> None:
        if entry.get("scheme") != "dns":
            if len(self.asked) < ASKED_MAX:
                self.asked.add(host)
            return
        answered = entry.get("decision") == "allow" and entry.get("address")
        if answered and len(self.looked_up) < LOOKED_MAX:
            self.looked_up.setdefault(host, str(entry["address"]).split(",")[0])

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

    def _note(self, run: object, now: float, what: str) -> bytes:
        entry = {"time": self._time(now), "run_id": run, "decision": "note"}
        entry.update(rule="audit-limit", reason=f"{what}; later requests are counted, not written")
        return (self._encode(entry) + "\n").encode("utf-8", "backslashreplace")

    def flush(self) -> None:
        if self._buffer and self.fd >= 0:
            os.write(self.fd, b"".join(self._buffer))
        self._buffer.clear()
        self._size = 0

    def close(self) -> None:
        for run, count in self.unwritten.items():
            if self.fd >= 0:
                self._buffer.append(self._note(run, time.time(), f"{count} requests not written"))
        self.unwritten.clear()
        self.flush()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _moved_aside(path: str, fd: int) -> int:
    """A fresh log at ``path``, the full one kept as ``path``.1."""
    from corral.runlog import open_log

    try:
        if not os.path.samestat(os.stat(path), os.fstat(fd)):
            return fd  # (another run moved it first: this one is fresh)
        os.replace(path, path + ".1")
    except OSError:
        return fd  # (it cannot be: go on writing)
    os.close(fd)
    return open_log(path)


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


UNREACHABLE = 502  # the status of an allowed destination the proxy could not reach

# host, port (0: none), rule, reason, kind ("dns" a refused lookup, "down" allowed
# but unreachable, "" a refused request), address
DenyKey = tuple[str, int, str, str, str, str]


def deny_key(entry: dict[str, object]) -> DenyKey:
    """What one denied request is tallied under (an audit entry's fields)."""
    port = entry.get("port")
    return (
        str(entry.get("host") or ""),
        port if isinstance(port, int) else 0,
        str(entry.get("rule") or ""),
        str(entry.get("reason") or ""),
        _kind(entry),
        str(entry.get("address") or ""),
    )


def _kind(entry: dict[str, object]) -> str:
    if entry.get("decision") != "deny":
        return "down"
    return "dns" if entry.get("scheme") == "dns" else ""


def _field(text: str) -> str:
    return text.replace("\t", " ").replace("\n", " ").replace("\r", " ")


def tally_lines(denied: dict[DenyKey, int]) -> str:
    """``deny HOST PORT RULE REASON KIND ADDRESS N`` lines, tab-separated, for the
    door's tally pipe (one field never holds a tab or a newline)."""
    return "".join(
        "deny\t" + "\t".join(_field(str(v)) for v in key) + f"\t{n}\n" for key, n in denied.items()
    )


def usage_lines(audit: Audit) -> str:
    """``looked NAME ADDRESS`` and ``asked HOST`` lines for the tally pipe: every
    worker answers lookups and connections of its own, so only corral, adding
    them up, can tell a name looked up that no worker was asked for."""
    looked = "".join(f"looked\t{_field(h)}\t{_field(a)}\n" for h, a in audit.looked_up.items())
    return looked + "".join(f"asked\t{_field(h)}\n" for h in audit.asked)


def unproxied_entries(looked: dict[str, str], asked: set[str]) -> list[dict[str, object]]:
    """Names the run looked up (allowed, answered) but never asked the proxy for:
    as report entries (``unproxied``), which corral.report says after the run."""
    return [
        {"host": h, "address": a, "unproxied": True, "count": 1}
        for h, a in looked.items()
        if h not in asked
    ]


def read_tally_line(rest: str) -> tuple[DenyKey, int] | None:
    """The inverse of one :func:`tally_lines` line (after ``deny\t``); None if malformed."""
    fields = rest.split("\t")
    if len(fields) != 7 or not fields[1].isdigit() or not fields[6].isdigit():
        return None
    host, port, rule, reason, kind, address, count = fields
    return (host, int(port), rule, reason, kind, address), int(count)


def denial_entries(denied: dict[DenyKey, int]) -> list[dict[str, object]]:
    """The tally as one dict per refused (or unreachable) destination; corral.report
    reads these."""
    return [
        {
            "host": host,
            "port": port or None,
            "rule": rule,
            "reason": reason or None,
            "lookup": kind == "dns",
            "unreachable": kind == "down",
            "address": address or None,
            "count": n,
        }
        for (host, port, rule, reason, kind, address), n in denied.items()
    ]


NO_NETWORK = "no-network"  # the rule an audit line names for a lookup in a run without one


def record_lookups(
    path: str | None, run_id: str, lookups: list[tuple[str, str]]
) -> list[dict[str, object]]:
    """Audit the lookups a sandbox without a network made (each one refused by its
    resolver); returns them as the proxy's denials are (:func:`denial_entries`)."""
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
    return denial_entries(audit.denied)


def guard_process(audit: Audit, run_id: str) -> None:
    """In a proxy process: what Python would print to stderr for an exception in a
    thread or in a finalizer becomes one counted audit line instead.  The proxy's
    own threads (corral.net.aio's executor) are ``_thread``'s, whose uncaught
    exceptions go to ``sys.unraisablehook``; ``threading``'s hook is set only if
    something already imported it (importing it costs the proxy ~4 ms: functools)."""
    import sys

    def unraisable(info: sys.UnraisableHookArgs) -> None:
        audit.internal_error(run_id, str(info.err_msg or "unraisable"), info.exc_value)

    sys.unraisablehook = unraisable
    threading = sys.modules.get("threading")
    if threading is not None:

        def in_thread(args: object) -> None:
            audit.internal_error(run_id, "thread", getattr(args, "exc_value", None))

        threading.excepthook = in_thread  # type: ignore[attr-defined]
