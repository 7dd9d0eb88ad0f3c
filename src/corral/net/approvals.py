"""Approvals: who answers an ``ask`` verdict, and the grants their answers leave.

An ask (a ``[[network.rules]]`` entry with ``action = "ask"``, or any hook's
ask verdict) holds its request in the proxy until someone answers, for at most
``[network] ask_timeout`` seconds; no answer is a deny.  The proxy's
:class:`Hub` (the run's :class:`~corral.net.hooks.Asker`) lives in its one
worker (a run that may ask has one, so that its pending asks and grants are in
one place) and takes answers from two places:

* the *local answerer*, over a socket pair to the process that started the
  run: the terminal prompt of ``corral run`` (:mod:`corral.prompt`) or a
  ``Sandbox(on_ask=...)`` callback.  Each held request is sent there as one
  ``ask`` message, and a ``gone`` message withdraws it once answered.
* the *control socket*, ``<control dir>/<run id>.sock``, for ``corral
  pending``, ``corral approve`` and ``corral deny``.  The control directory is
  per user, mode 0700 and checked on every use (owner, mode, not a symlink);
  the hub also checks each peer's uid (``SO_PEERCRED``: only its own user) and
  that the peer shares its mount namespace (a process inside a sandbox never
  does; the landlock tier's cannot make unix sockets at all).

Messages are JSON lines.  ``{"op": "list"}`` answers ``{"pending": [...]}``;
``{"op": "answer", "id": ..., "allow": true, "for": 600, "path": "/x/**"}``
answers ``{"ok": true}`` or ``{"error": "..."}``; ``{"op": "forget"}`` drops
every grant (``Sandbox.reset`` between jobs) and answers ``{"ok": true,
"forgot": N}``.

An answer "for" a duration leaves a :class:`Grant`: the same host, port and
method, and the same path (the query aside) or a path glob given with the
answer (:class:`corral.net.httprules.PathGlob` syntax).  A grant answers the
run's later matching asks at once, and any held one it covers; it expires
after its duration and never outlives the run (it lives in the run's proxy).
Every ask, answer, grant and expiry is one audit line (``event``).

What the ``corral run`` process and the CLI need (the control directory,
:class:`Decision`, :class:`AskInfo`, the control client) is in the light
:mod:`corral.net.asking`; this module runs in the proxy (on
:mod:`corral.net.aio`), and in a ``Sandbox`` with ``on_ask`` (its
:class:`CallbackAnswerer`, on asyncio).
"""

from __future__ import annotations

import _socket as socket
import os
import struct
import time

from corral.net import aio
from corral.net.asking import DEFAULT_GRANT as DEFAULT_GRANT
from corral.net.asking import DEFAULT_TIMEOUT as DEFAULT_TIMEOUT
from corral.net.asking import MAX_LINE, _dump, _load, format_seconds, socket_path
from corral.net.asking import AskInfo as AskInfo
from corral.net.asking import Decision as Decision
from corral.net.asking import check_glob as check_glob
from corral.net.asking import control_dir as control_dir
from corral.net.asking import list_pending as list_pending
from corral.net.asking import send_answer as send_answer
from corral.net.hooks import Asker
from corral.net.rules import Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    import concurrent.futures
    from collections.abc import Awaitable, Callable

    from corral.net.audit import Audit
    from corral.net.hooks import Destination, Request
    from corral.net.httprules import PathGlob, Query

# -- grants ---------------------------------------------------------------------------------


class Grant:
    __slots__ = ("expires", "glob", "host", "id", "method", "path", "port", "rule")

    def __init__(
        self,
        grant_id: str,
        host: str,
        port: int,
        method: str,
        path: str,
        glob: PathGlob | None,
        expires: float,
        rule: str,
    ) -> None:
        self.id = grant_id
        self.host, self.port, self.method = host, port, method
        self.path = path  # the exact path it covers when there is no glob
        self.glob = glob
        self.expires = expires  # loop time
        self.rule = rule

    def covers(self, host: str, port: int, method: str, path: str, query: Query | None) -> bool:
        if (host, port) != (self.host, self.port) or not grant_method_covers(self.method, method):
            return False
        if self.glob is not None:
            return self.glob.matches(path, query)
        return path == self.path

    def scope(self) -> str:
        return f"{self.method} {self.host}:{self.port}{self.glob.text if self.glob else self.path}"


def grant_method_covers(granted: str, method: str) -> bool:
    """Whether a grant for ``granted`` covers ``method`` (both upper-case).

    A HEAD is served with the GET handler (see :func:`corral.net.httprules.alternates`),
    so the rules decide it as a GET too; here a HEAD stands for that GET, which
    the person answering a held HEAD is shown (``also``): a grant for GET covers
    HEAD (a GET without the body: nothing the GET grant did not allow), and a
    grant for HEAD covers HEAD, served as a GET and all, but never a GET (whose
    response body nobody approved).  Every other method covers only itself."""
    return granted == method or (granted == "GET" and method == "HEAD")


def request_key(dest: Destination, request: Request | None) -> tuple[str, str, Query | None]:
    """(method, normalized path, query) of a held request; a CONNECT has no path."""
    if request is None:
        return "CONNECT", "", None
    from corral.net.httprules import BadPath, normalize_target

    try:
        path, query = normalize_target(request.target.encode("latin-1"))
    except BadPath:  # never grantable: compared as written, it matches no other path
        path, query = request.target, None
    return request.method.upper(), path, query


def alternate_keys(
    request: Request | None, head: bool = True
) -> list[tuple[str, str, Query | None]]:
    """The (method, path, query) an origin may serve a request as besides its request
    line (override headers, routing headers, ``_method`` in the query or a body
    read to decide): a grant covers the request only if it covers each of them
    too, or a grant for ``GET /x`` let ``GET /x`` with X-HTTP-Method-Override:
    DELETE through.  ``head=False``: without the GET each HEAD is served as too
    (shown to the person, but covered with the HEAD: see :func:`grant_method_covers`)."""
    if request is None:
        return []
    from corral.net.httprules import (
        BadPath,
        alternates,
        form_methods,
        normalize_target,
        served_as,
    )

    pairs = alternates(request.method, request.target, request.headers, head)
    if request.body is not None and request.method.upper() == "POST":
        pairs += [(m, request.target) for m in served_as(form_methods(request.body), head)]
    keys = []
    for method, target in dict.fromkeys(pairs):
        try:
            path, query = normalize_target(target.encode("latin-1", "replace"))
        except BadPath:
            path, query = target, None
        keys.append((method.upper(), path, query))
    return keys


# -- the hub --------------------------------------------------------------------------------


Key = tuple[str, str, "Query | None"]  # (method, normalized path, query)


class _Held:
    __slots__ = ("also", "dest", "future", "info", "method", "path", "query", "since")

    def __init__(
        self,
        info: dict[str, object],
        dest: Destination,
        key: Key,
        also: list[Key],
        future: aio.Future,
    ) -> None:
        self.info = info
        self.dest = dest
        self.method, self.path, self.query = key
        self.also = also  # what a grant must cover besides the request line
        self.future = future
        self.since = time.monotonic()


RESET_BY = "reset: its job ended"  # who denied the asks a job left held (forget_grants)


class Hub(Asker):
    """The run's :class:`~corral.net.hooks.Asker`: holds asks, takes answers, keeps grants."""

    def __init__(self, audit: Audit, run_id: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.audit = audit
        self.run_id = run_id
        self.timeout = timeout
        self.pending: dict[str, _Held] = {}
        self.grants: list[Grant] = []
        self._local: aio.StreamWriter | None = None
        self._servers: list[aio.AbstractServer] = []
        self._tasks: set[aio.Task] = set()
        self.control_path = ""

    # -- answerers -----------------------------------------------------------------------

    async def attach_local(self, sock: socket.socket) -> None:
        """The local answerer (corral run's terminal, a Sandbox's on_ask) at the
        other end of ``sock``: it gets every ask, and its answers are read here."""
        reader, writer = await aio.open_unix_connection(sock=sock, limit=MAX_LINE)
        self._local = writer
        task = aio.get_running_loop().create_task(self._read_local(reader))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read_local(self, reader: aio.StreamReader) -> None:
        while True:
            try:
                line = await reader.readline()
            except (ValueError, ConnectionError):
                break
            if not line:
                break
            message = _load(line)
            if message is not None and message.get("op") == "answer":
                self.answer_message(message, "")
        self._local = None

    async def serve_control(self, directory: str) -> None:
        """Listen on ``<directory>/<run id>.sock`` for corral pending/approve/deny."""
        path = socket_path(directory, self.run_id)
        server = await aio.start_unix_server(self._control_client, path=path, limit=MAX_LINE)
        os.chmod(path, 0o600)
        self.control_path = path
        self._servers.append(server)

    def close(self) -> None:
        for server in self._servers:
            server.close()
        if self.control_path:
            try:
                os.unlink(self.control_path)
            except FileNotFoundError:
                pass
            self.control_path = ""

    async def _control_client(self, reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
        try:
            line = await aio.wait_for(reader.readline(), 10)
            refusal = peer_refusal(writer.get_extra_info("socket"))
            if refusal:  # said after the request is read: the client sees it, not EPIPE
                self._event({"event": "control-refused", "reason": refusal})
                writer.write(_dump({"error": refusal}))
                await writer.drain()
                return
            message = _load(line) or {}
            op = message.get("op")
            if op == "list":
                reply: dict[str, object] = {"pending": self.listing()}
            elif op == "answer":
                problem = self.answer_message(message, "control")
                reply = {"error": problem} if problem else {"ok": True}
            elif op == "forget":
                reply = {"ok": True, "forgot": self.forget_grants()}
            else:
                reply = {"error": "unknown request"}
            writer.write(_dump(reply))
            await writer.drain()
        except (OSError, ValueError, TimeoutError):
            pass
        finally:
            writer.close()

    def listing(self) -> list[dict[str, object]]:
        now = time.monotonic()
        return [{**held.info, "age": round(now - held.since, 1)} for held in self.pending.values()]

    def _tell_local(self, message: dict[str, object]) -> None:
        if self._local is not None and not self._local.is_closing():
            self._local.write(_dump(message))

    # -- asking ----------------------------------------------------------------------------

    async def ask(self, dest: Destination, request: Request | None, verdict: Verdict) -> Verdict:
        key = request_key(dest, request)
        method, path, _ = key
        loop = aio.get_running_loop()
        also = alternate_keys(request)  # what the person is shown
        needed = alternate_keys(request, head=False) if also else also  # what grants cover
        grant = self._covering(dest, key, needed, loop.time())
        base = {
            "host": dest.host,
            "port": dest.port,
            "method": method,
            "path": path,
            "rule": verdict.rule,
        }
        if also:  # what the person is asked about, besides the request line
            base["also"] = [f"{m} {p}" for m, p, _ in also]
        if request is not None and request.target != path:  # as sent (query, escapes)
            base["target"] = request.target
        if grant is not None:
            self._event({"event": "ask", **base, "answer": "grant", "grant": grant.id})
            return Verdict(True, verdict.rule, f"ask: allowed by grant {grant.id}")
        ask_id = os.urandom(4).hex()
        info: dict[str, object] = {
            "id": ask_id,
            "run": self.run_id,
            **base,
            "reason": verdict.reason,
            "since": time.time(),
        }
        held = _Held(info, dest, key, needed, loop.create_future())
        self.pending[ask_id] = held
        self._event({"event": "ask", "ask_id": ask_id, **base, "reason": verdict.reason})
        self._tell_local({"op": "ask", **info})
        try:
            async with aio.timeout(self.timeout):
                decision, by = await held.future
        except TimeoutError:
            decision, by = Decision.deny(), "timeout"
        finally:
            self.pending.pop(ask_id, None)
            self._tell_local({"op": "gone", "id": ask_id})
        if by == "timeout":
            self._event({"event": "answer", "ask_id": ask_id, **base, "answer": "timeout"})
            return Verdict(False, verdict.rule, f"ask: no answer within {self.timeout:g}s")
        if not decision.allow:
            return Verdict(False, verdict.rule, f"ask: denied ({by})")
        if decision.seconds is None:
            return Verdict(True, verdict.rule, f"ask: allowed once ({by})")
        return Verdict(
            True, verdict.rule, f"ask: allowed for {format_seconds(decision.seconds)} ({by})"
        )

    def answer_message(self, message: dict[str, object], by: str) -> str | None:
        """Settle a held ask from an answer message; an error text, or None."""
        ask_id = str(message.get("id", ""))
        seconds = message.get("for")
        path = message.get("path")
        who = message.get("by")
        if isinstance(who, str) and who:  # the answerer's own name for itself
            by = (f"{by}: {who}" if by else who)[:80]
        by = by or "local"
        try:
            if seconds is not None and (
                isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0
            ):
                raise ValueError(f"bad duration {seconds!r}")
            if path is not None:
                path = check_glob(str(path))
            decision = Decision(bool(message.get("allow")), seconds, path)
        except ValueError as exc:
            return str(exc)
        return self.answer(ask_id, decision, by)

    def answer(self, ask_id: str, decision: Decision, by: str) -> str | None:
        held = self.pending.get(ask_id)
        if held is None or held.future.done():
            return f"no request {ask_id!r} is waiting in run {self.run_id}"
        answer = "deny" if not decision.allow else "once" if decision.seconds is None else "for"
        self._event(
            {
                "event": "answer",
                "ask_id": ask_id,
                "host": held.dest.host,
                "port": held.dest.port,
                "method": held.method,
                "path": held.path,
                "rule": held.info["rule"],
                "answer": answer,
                "for": decision.seconds,
                "by": by,
            }
        )
        held.future.set_result((decision, by))
        if decision.seconds is not None:
            self._add_grant(held, decision, by)
        return None

    # -- grants ------------------------------------------------------------------------------

    def _add_grant(self, held: _Held, decision: Decision, by: str) -> None:
        from corral.net.httprules import PathGlob

        assert decision.seconds is not None
        loop = aio.get_running_loop()
        grant = Grant(
            os.urandom(4).hex(),
            held.dest.host,
            held.dest.port,
            held.method,
            held.path,
            PathGlob(decision.path) if decision.path else None,
            loop.time() + decision.seconds,
            str(held.info["rule"]),
        )
        self.grants.append(grant)
        self._event(
            {
                "event": "grant",
                "grant": grant.id,
                "scope": grant.scope(),
                "for": decision.seconds,
                "rule": grant.rule,
                "by": by,
            }
        )
        loop.call_later(decision.seconds, self._expire, grant)
        # the other asks held at the same time that the grants now cover are answered,
        # by the test a request arriving now meets (a grant for POST /x released a
        # held POST /x carrying X-HTTP-Method-Override: DELETE, found by attacking
        # the proxy: the request line alone was looked at)
        now = loop.time()
        for other_id, other in list(self.pending.items()):
            if other.future.done():
                continue
            key = (other.method, other.path, other.query)
            if self._covering(other.dest, key, other.also, now) is not None:
                self._event({"event": "answer", "ask_id": other_id, "answer": "grant"})
                other.future.set_result((Decision.once(), f"grant {grant.id}"))

    def _covering(self, dest: Destination, key: Key, also: list[Key], now: float) -> Grant | None:
        """The grant that answers a request (``key``, its request line) at once, or
        None: one covers the request line and each of ``also`` (what else it may
        be served as, :func:`alternate_keys` with ``head=False``) is covered by a
        grant too.  The one test for a request arriving and one held."""
        method, path, query = key
        grant = self._grant_for(dest.host, dest.port, method, path, query, now)
        if grant is None:
            return None
        for m, p, q in also:
            if self._grant_for(dest.host, dest.port, m, p, q, now) is None:
                return None  # (it covers the request line, not all it may be served as)
        return grant

    def _grant_for(
        self, host: str, port: int, method: str, path: str, query: Query | None, now: float
    ) -> Grant | None:
        for grant in self.grants:
            if grant.expires > now and grant.covers(host, port, method, path, query):
                return grant
        return None

    def forget_grants(self) -> int:
        """Drop every grant and deny every held request (a sandbox reset between
        jobs: one job's answers must not answer the next job's asks, and a request
        its job left held must not go out, approved, while the next job runs:
        found by attacking warm sandboxes); how many grants there were."""
        gone, self.grants = self.grants, []
        for grant in gone:
            self._event({"event": "grant-revoked", "grant": grant.id, "scope": grant.scope()})
        for ask_id in list(self.pending):
            self.answer(ask_id, Decision.deny(), RESET_BY)
        return len(gone)

    def _expire(self, grant: Grant) -> None:
        if grant in self.grants:
            self.grants.remove(grant)
            self._event({"event": "grant-expired", "grant": grant.id, "scope": grant.scope()})

    def _event(self, fields: dict[str, object]) -> None:
        # decision "ask": never tallied as a denial (the request's own line is)
        self.audit.record({"run_id": self.run_id, "decision": "ask", **fields})
        try:
            self.audit.flush()  # answers are rare and a person may be reading the log
        except OSError:
            pass


def peer_refusal(sock: socket.socket | None) -> str:
    """Why a control socket's peer may not answer ("" if it may): another user,
    or a process in another mount namespace (inside a sandbox)."""
    if sock is None:
        return "refused: no peer credentials"
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return "refused: no peer credentials"
    pid, uid, _gid = struct.unpack("3i", raw)
    if uid != os.geteuid():
        return f"refused: uid {uid} may not answer the requests of uid {os.geteuid()}"
    try:
        theirs = os.readlink(f"/proc/{pid}/ns/mnt")
        ours = os.readlink("/proc/self/ns/mnt")
    except OSError:
        return "refused: cannot tell where the peer runs"
    if theirs != ours:
        return "refused: the peer runs in another mount namespace (a sandbox)"
    return ""


# -- the Python answerer (Sandbox(on_ask=...)) ----------------------------------------------------


async def _awaited(value: Awaitable[object]) -> object:
    return await value


class CallbackAnswerer:
    """A Sandbox's ``on_ask`` function as the run's local answerer.

    A thread reads the asks; each is answered by a call of ``fn(AskInfo)``,
    which returns a :class:`Decision` (or what :meth:`Decision.read` takes).
    Without ``loop`` (a :class:`~corral.sandbox.Sandbox`), each call runs on a
    thread of its own (an async function there on its own event loop).  With
    ``loop`` (an :class:`~corral.sandbox.AsyncSandbox`), an async function runs
    on that loop and a plain one in the loop's executor, so neither blocks it;
    an ask withdrawn (timed out, answered elsewhere) cancels its coroutine.
    An exception in ``fn`` denies, and ``on_error`` gets one line."""

    def __init__(
        self,
        channel: socket.socket,
        fn: Callable[[AskInfo], object],
        loop: asyncio.AbstractEventLoop | None = None,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        import threading

        self.channel = channel
        self.fn = fn
        self.loop = loop
        self.on_error = on_error
        self._send_lock = threading.Lock()
        self._running: dict[str, concurrent.futures.Future[None]] = {}
        self.thread = threading.Thread(target=self._read, name="corral-on-ask", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        partial = b""
        while True:
            try:
                data = self.channel.recv(65536)
            except OSError:
                break
            if not data:
                break
            lines = (partial + data).split(b"\n")
            partial = lines.pop()
            for line in lines:
                message = _load(line)
                if message is None:
                    continue
                if message.get("op") == "ask":
                    self._start(AskInfo(message))
                elif message.get("op") == "gone":
                    running = self._running.pop(str(message.get("id")), None)
                    if running is not None:
                        running.cancel()

    def _start(self, info: AskInfo) -> None:
        import asyncio
        import threading

        if self.loop is None:
            threading.Thread(target=self._call_here, args=(info,), daemon=True).start()
            return
        try:
            self._running[info.id] = asyncio.run_coroutine_threadsafe(
                self._call_on_loop(info), self.loop
            )
        except RuntimeError:  # the loop is closed: nobody can answer
            self._send(info.id, Decision.deny())

    def _call_here(self, info: AskInfo) -> None:
        import asyncio
        import inspect

        try:
            result = self.fn(info)
            if inspect.isawaitable(result):
                result = asyncio.run(_awaited(result))
            decision = Decision.read(result)
        except Exception as exc:
            decision = self._failed(exc)
        self._send(info.id, decision)

    async def _call_on_loop(self, info: AskInfo) -> None:
        import asyncio
        import inspect

        try:
            if inspect.iscoroutinefunction(self.fn):
                result = await self.fn(info)
            else:
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(None, self.fn, info)
                if inspect.isawaitable(result):
                    result = await result
            decision = Decision.read(result)
        except Exception as exc:
            decision = self._failed(exc)
        self._running.pop(info.id, None)
        self._send(info.id, decision)

    def _failed(self, exc: BaseException) -> Decision:
        if self.on_error is not None:
            self.on_error(f"on_ask: {type(exc).__name__}: {exc} (the request was denied)")
        return Decision.deny()

    def _send(self, ask_id: str, decision: Decision) -> None:
        with self._send_lock:
            try:
                self.channel.sendall(_dump(decision.message(ask_id, "on_ask")))
            except OSError:
                pass  # the run ended
