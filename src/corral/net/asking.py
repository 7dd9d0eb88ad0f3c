"""What answering an ask needs outside the proxy, light enough for the
``corral run`` process: the per-user control directory, :class:`Decision`,
:class:`AskInfo`, and the control client of ``corral pending`` / ``approve`` /
``deny``.  The proxy's side (the hub, grants, the peer check) is
:mod:`corral.net.approvals`, which needs asyncio."""

from __future__ import annotations

import os
import socket
import time

DEFAULT_TIMEOUT = 30.0
DEFAULT_GRANT = 600.0  # what the terminal prompt's "for" grants
MAX_LINE = 64 * 1024


# -- the control directory ------------------------------------------------------------------


def control_dir(create: bool = False) -> str:
    """This user's control directory, ``/tmp/corral-<uid>`` (``$CORRAL_CONTROL_DIR``
    if set).  Not ``$XDG_RUNTIME_DIR``: the namespace tier shows the host's ``/run``
    inside, read-only, and a socket on a read-only mount can still be connected
    to; every tier's ``/tmp`` is its own.  Raises OSError if it is not ours alone."""
    path = os.environ.get("CORRAL_CONTROL_DIR") or f"/tmp/corral-{os.geteuid()}"
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    st = os.lstat(path)
    import stat

    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise PermissionError(
            f"{path} is not a directory of this user's alone (mode 0700): refusing to use it"
        )
    return path


def socket_path(directory: str, run_id: str) -> str:
    return os.path.join(directory, f"{run_id}.sock")


# -- answers --------------------------------------------------------------------------------


class Decision:
    """An answer to an ask: allow once, allow for ``seconds`` (a grant, for the same
    path or ``path``, a glob), or deny."""

    __slots__ = ("allow", "path", "seconds")

    def __init__(self, allow: bool, seconds: float | None = None, path: str | None = None) -> None:
        self.allow = allow
        self.seconds = seconds if allow else None
        self.path = path if allow else None

    @classmethod
    def once(cls) -> Decision:
        return cls(True)

    @classmethod
    def deny(cls) -> Decision:
        return cls(False)

    @classmethod
    def allow_for(cls, duration: float | str, path: str | None = None) -> Decision:
        """``duration``: seconds, or ``"10m"`` (policy duration syntax)."""
        from corral.policy import parse_duration

        return cls(True, parse_duration(duration), path)

    @classmethod
    def read(cls, value: object) -> Decision:
        """What an ``on_ask`` function returned: a Decision, ``True`` (once),
        ``False`` or ``None`` (deny), ``"once"``, ``"deny"``, or a duration
        (``"10m"``, seconds) to allow for.  ValueError otherwise."""
        if isinstance(value, Decision):
            return value
        if value is True or value == "once" or value == "allow":
            return cls.once()
        if value is False or value is None or value == "deny":
            return cls.deny()
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            return cls.allow_for(value)
        raise ValueError(f"on_ask returned {type(value).__name__}, not a decision")

    def message(self, ask_id: str, by: str) -> dict[str, object]:
        return {
            "op": "answer",
            "id": ask_id,
            "allow": self.allow,
            "for": self.seconds,
            "path": self.path,
            "by": by,
        }

    def __repr__(self) -> str:
        if not self.allow:
            return "Decision.deny()"
        if self.seconds is None:
            return "Decision.once()"
        return f"Decision.allow_for({self.seconds:g}, path={self.path!r})"


class AskInfo:
    """A held request as an answerer sees it."""

    __slots__ = (
        "also",
        "host",
        "id",
        "method",
        "path",
        "port",
        "reason",
        "rule",
        "run_id",
        "since",
        "target",
    )

    def __init__(self, data: dict[str, object]) -> None:
        self.id = str(data.get("id", ""))
        self.run_id = str(data.get("run", ""))
        self.host = str(data.get("host", ""))
        port = data.get("port")
        self.port = port if isinstance(port, int) else 0
        self.method = str(data.get("method", ""))
        self.path = str(data.get("path", ""))
        self.rule = str(data.get("rule", ""))
        self.reason = str(data.get("reason", ""))
        # the target as the client sent it (its query, escapes as written): what
        # the origin gets, where ``path`` is the decoded path grants match
        self.target = str(data.get("target", "") or self.path)
        # what an origin may serve it as besides (override headers, _method): a
        # person approving GET /x must see that it is also DELETE /x
        also = data.get("also")
        self.also = [str(a) for a in also] if isinstance(also, list) else []
        since = data.get("since")
        self.since = float(since) if isinstance(since, int | float) else time.time()

    def __repr__(self) -> str:
        return f"<ask {self.id}: {self.method} {self.host}:{self.port}{self.path} ({self.rule})>"


def cut(text: str, most: int) -> str:
    """``text``, or its first ``most`` characters and an ellipsis: a cut is shown."""
    return text if len(text) <= most else text[: most - 1] + "…"


def served_as(also: list[str], most: int = 4) -> str:
    """What a held request is also served as, for a person to read: the first
    ``most`` in full (each cut at 60 characters, shown), then how many more and
    each method among them, so that no method an origin would run goes unseen
    (a fifth override header named DELETE, and the screen showed four)."""
    shown = [cut(a, 60) for a in also[:most]]
    rest = also[most:]
    if rest:
        methods = ", ".join(sorted({a.split(" ", 1)[0] for a in rest}))
        shown.append(f"and {len(rest)} more ({methods}; corral pending --json lists them)")
    return ", ".join(shown)


def check_glob(text: str) -> str:
    """A grant's path glob, checked (ValueError naming what is wrong)."""
    from corral.net.httprules import PathGlob

    PathGlob(text)
    return text


def format_seconds(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def _dump(message: dict[str, object]) -> bytes:
    import json  # here: its decoder compiles regular expressions on import

    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def _load(line: bytes) -> dict[str, object] | None:
    import json

    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# -- the control client (corral pending / approve / deny) ---------------------------------------


def _talk(path: str, message: dict[str, object]) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(path)
        sock.sendall(_dump(message))
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return _load(data) or {"error": "no answer from the run's proxy"}


def run_sockets(directory: str) -> list[str]:
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    return [os.path.join(directory, n) for n in names if n.endswith(".sock")]


def list_pending(directory: str) -> list[dict[str, object]]:
    """Every held request of this user's runs, oldest first."""
    found: list[dict[str, object]] = []
    for path in run_sockets(directory):
        try:
            reply = _talk(path, {"op": "list"})
        except OSError:
            continue  # a run that just ended
        if "error" in reply:
            raise PermissionError(str(reply["error"]))
        pending = reply.get("pending")
        if isinstance(pending, list):
            found += [p for p in pending if isinstance(p, dict)]
    found.sort(key=_age, reverse=True)
    return found


def _age(item: dict[str, object]) -> float:
    age = item.get("age")
    return float(age) if isinstance(age, int | float) else 0.0


def forget_grants(directory: str, run_id: str) -> int:
    """Drop every grant of one run (OSError: its proxy cannot be reached;
    RuntimeError: it refused)."""
    reply = _talk(socket_path(directory, run_id), {"op": "forget"})
    forgot = reply.get("forgot")
    if not reply.get("ok") or not isinstance(forgot, int):
        raise RuntimeError(str(reply.get("error", "no answer from the run's proxy")))
    return forgot


def send_answer(directory: str, ask_id: str, decision: Decision, by: str) -> str | None:
    """Answer a held request in whichever run holds it; an error text, or None."""
    problem = f"no request {ask_id!r} is waiting (see corral pending)"
    for path in run_sockets(directory):
        try:
            reply = _talk(path, decision.message(ask_id, by))
        except OSError:
            continue
        if reply.get("ok"):
            return None
        error = str(reply.get("error", ""))
        if error.startswith("refused") or error.startswith("bad duration"):
            return error
    return problem
