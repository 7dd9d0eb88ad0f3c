"""Long-lived sandboxes for agent frameworks: set up once, then exec many times.

    with Sandbox() as sb:                       # policy from the workspace's corral.toml
        r = sb.exec("pytest -q", timeout=120, on_stdout=print)
        server = sb.spawn("python3 -m http.server 8000")
        sb.files.write("notes.txt", "hello")
        server.kill()

A :class:`Sandbox` is one sandbox of the policy's tier (today: namespace) whose
first process is corral's agent (:mod:`corral.agent`).  Commands and file
operations are requests to that agent over a socket pair, so each ``exec``
costs a fork and an exec inside the already-built sandbox, and the file API
meets exactly the mounts a command would.  The policy, limits and network
door are the same as ``corral run``'s.

The API is thread-safe: one reader thread dispatches the agent's frames to
the callers waiting for them.
"""

from __future__ import annotations

import array
import collections
import concurrent.futures
import json
import os
import queue
import select
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from corral.errors import EXIT_TIMEOUT, CorralError

HEADER = struct.Struct("!II")
SPAWN_WAIT = 30.0  # seconds for the agent to report a started command's pid
HISTORY = 100  # commands the activity log's record of a sandbox keeps (the last ones)
# What the host takes from the agent's channel, which a command may write on (a
# microVM guest's root takes it over: found by attacking corral, a "done" frame
# announcing 4 GiB was read whole): a frame's JSON header and its payload, each
# bounded by what the agent sends for the request pending under the frame's id
# (files.read's content, files.list's entries), else by the largest other frame
# the agent sends (64 KiB of output, a short reply); past those the channel is
# malformed and the sandbox stopped.  And the error lines kept.
MAX_HEADER = 1 << 20
MAX_OUT_FRAME = 1 << 16
FRAME_BOUNDS = {  # the op of a pending request: (header, payload) of its reply
    "read": (MAX_HEADER, 256 << 20),  # (corral.agent.MAX_READ)
    "list": ((16 << 20) + MAX_HEADER, MAX_OUT_FRAME),  # (corral.agent.MAX_LISTING)
}
MAX_ERRORS = 100
# seconds past a command's timeout before exec gives up on the agent (one a command
# stopped: in a microVM's guest a command of its uid can signal it)
AGENT_GRACE = 30.0

TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio

    from corral.net.asking import AskInfo
    from corral.net.door import Door
    from corral.placement import Placement
    from corral.policy import Policy
    from corral.report import Denial
    from corral.tiers.base import Plan, Tier

T = TypeVar("T")


class SandboxError(CorralError):
    """Base of the errors the Python API raises."""


class SandboxClosed(SandboxError):
    def __init__(self) -> None:
        super().__init__("the sandbox is closed")


class CwdOutsideSandbox(SandboxError):
    pass


class PathDenied(SandboxError, PermissionError):
    """The policy forbids this file operation (read-deny, write-deny, read-only)."""


class _Malformed(ValueError):
    """A frame the agent cannot have sent: the channel is not the agent's alone."""


class CallbackError(SandboxError):
    """An ``on_stdout``/``on_stderr``/exit callback raised.  The command was killed
    (nobody was taking its output any more, as when a pipeline's reader exits);
    ``result`` holds what it did until then and ``__cause__`` the callback's error."""

    def __init__(self, result: ExecResult, error: BaseException) -> None:
        super().__init__(f"a callback raised {type(error).__name__}: {error}")
        self.result = result


def _frame(header: dict[str, object], payload: bytes = b"") -> bytes:
    data = json.dumps(header, separators=(",", ":")).encode()
    return HEADER.pack(len(data), len(payload)) + data + payload


class _Waiter:
    """Where the reader thread puts a file operation's reply: a queue (a blocked
    caller) or an event loop's future (AsyncSandbox)."""

    def put(self, item: tuple[dict[str, object], bytes]) -> None:
        raise NotImplementedError


class ExecResult:
    __slots__ = ("duration", "exit_code", "stderr", "stdout", "timed_out", "truncated")

    def __init__(self) -> None:
        self.exit_code = -1
        self.stdout = b""
        self.stderr = b""
        self.timed_out = False
        self.truncated = False
        self.duration = 0.0

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    def __repr__(self) -> str:
        return (
            f"ExecResult(exit_code={self.exit_code}, timed_out={self.timed_out}, "
            f"truncated={self.truncated}, duration={self.duration:.3f})"
        )


class Process:
    """A command started with :meth:`Sandbox.spawn`: running in the background."""

    def __init__(
        self,
        sandbox: Sandbox,
        ident: int,
        argv: list[str],
        on_stdout: Callable[[bytes], None] | None,
        on_stderr: Callable[[bytes], None] | None,
        limit: int | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.id = ident
        self.argv = argv
        # bytes of output kept (the agent's limit, kept here too: a command that took
        # the agent's channel would send past it)
        self._limit = limit
        self._kept = 0
        self._truncated = False
        self.pid = 0  # inside the sandbox's pid namespace
        self.result = ExecResult()
        self._started = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._out = bytearray()
        self._err = bytearray()
        self._read_out = 0
        self._read_err = 0
        self._on = {1: on_stdout, 2: on_stderr}
        self._began = time.monotonic()
        self._exit_callbacks: list[Callable[[ExecResult], None]] = []
        self._start_callbacks: list[Callable[[], None]] = []
        self.error: BaseException | None = None  # the first callback error, if any
        self._noted = False  # counted in the sandbox's activity record

    def _call(self, callback: Callable[..., None], arg: object) -> None:
        """Run a caller's callback on the reader thread; its error must not kill the
        thread (every later exec would hang) but reach the caller of wait()."""
        try:
            callback(arg)
        except Exception as exc:
            if self.error is None:
                self.error = exc
                self._on = {1: None, 2: None}
                if self.running:
                    try:
                        self.kill()
                    except (SandboxError, OSError):
                        pass

    # -- called by the reader thread
    def _event(self, header: dict[str, object], payload: bytes) -> None:
        ev = header.get("ev")
        if ev == "started":
            self.pid = int(str(header["pid"]))
            self._started.set()
            self._notify_started()
        elif ev == "out":
            which = int(str(header["fd"]))
            payload = self._within_limit(payload)
            if not payload:
                return
            with self._lock:
                (self._out if which == 1 else self._err).extend(payload)
            callback = self._on.get(which)
            if callback is not None:
                self._call(callback, payload)
        elif ev == "exit":
            r = self.result
            r.exit_code = int(str(header["code"]))
            r.timed_out = bool(header.get("timed_out"))
            r.truncated = bool(header.get("truncated")) or self._truncated
            r.duration = time.monotonic() - self._began
            with self._lock:
                r.stdout, r.stderr = bytes(self._out), bytes(self._err)
                callbacks = list(self._exit_callbacks)
            self.sandbox._note(self)  # counted before anyone hears it ended
            self._started.set()
            self._done.set()
            self._notify_started()
            for notify in callbacks:
                self._call(notify, r)

    def _within_limit(self, payload: bytes) -> bytes:
        """What of ``payload`` the output limit leaves room for."""
        if not self._limit:
            return payload
        room = max(0, self._limit - self._kept)
        if len(payload) > room:
            payload = payload[:room]
            self._truncated = True
        self._kept += len(payload)
        return payload

    def _notify_started(self) -> None:
        with self._lock:
            waiting, self._start_callbacks = self._start_callbacks, []
        for notify in waiting:
            notify()

    def add_start_callback(self, callback: Callable[[], None]) -> None:
        """Called once the process has its pid, or has ended without one (at once if
        either happened already); on the sandbox's reader thread."""
        with self._lock:
            if not self._started.is_set():
                self._start_callbacks.append(callback)
                return
        callback()

    def add_exit_callback(self, callback: Callable[[ExecResult], None]) -> None:
        """Called with the result once the process ends (at once if it already has)."""
        with self._lock:
            if not self._done.is_set():
                self._exit_callbacks.append(callback)
                return
        self._call(callback, self.result)

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    @property
    def returncode(self) -> int | None:
        return self.result.exit_code if self._done.is_set() else None

    def wait(self, timeout: float | None = None) -> ExecResult:
        """The result once the process ends; CallbackError if a callback raised."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"process {self.id} still running after {timeout}s")
        return self.outcome()

    def outcome(self) -> ExecResult:
        """The result of an ended process, or its callback's error raised."""
        if self.error is not None:
            raise CallbackError(self.result, self.error) from self.error
        return self.result

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the process and its whole group."""
        if self.running:
            self.sandbox._send({"op": "kill", "id": self.id, "signal": int(sig)})

    def write_stdin(self, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else data
        self.sandbox._send({"op": "stdin", "id": self.id}, raw)

    def close_stdin(self) -> None:
        self.sandbox._send({"op": "close_stdin", "id": self.id})

    @property
    def unread(self) -> bool:
        """Whether output arrived that :meth:`read_output` has not returned yet."""
        with self._lock:
            return len(self._out) > self._read_out or len(self._err) > self._read_err

    def read_output(self, discard: bool = False) -> tuple[bytes, bytes]:
        """What arrived on stdout and stderr since the last call.  ``discard``: and
        let it go, kept neither here nor in :attr:`result` (a reader that follows a
        long-lived command keeps only what it has not read yet)."""
        with self._lock:
            out, err = bytes(self._out[self._read_out :]), bytes(self._err[self._read_err :])
            if discard:
                del self._out[:], self._err[:]
                self._read_out = self._read_err = 0
                if self._done.is_set():
                    self.result.stdout = self.result.stderr = b""
            else:
                self._read_out, self._read_err = len(self._out), len(self._err)
        return out, err

    def __repr__(self) -> str:
        state = "running" if self.running else f"exit {self.result.exit_code}"
        return f"Process(id={self.id}, pid={self.pid}, {state}, argv={self.argv!r})"


class Files:
    """File operations inside the sandbox, under its policy (paths: workspace-relative)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sb = sandbox

    def read(self, path: str) -> bytes:
        return self.sb._file("read", path)[1]

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read(path).decode(encoding)

    def write(self, path: str, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else data
        self.sb._file("write", path, raw, writing=True)

    def list(self, path: str = ".") -> list[dict[str, object]]:
        entries = self.sb._file("list", path)[0].get("entries", [])
        return list(entries) if isinstance(entries, list) else []

    def exists(self, path: str) -> bool:
        return bool(self.sb._file("exists", path)[0].get("exists"))

    def remove(self, path: str) -> None:
        self.sb._file("remove", path, writing=True)

    def mkdir(self, path: str, exist_ok: bool = True) -> None:
        self.sb._file("mkdir", path, writing=True, extra={"exist_ok": exist_ok})


def _load_named(path: str, workspace: str | None) -> Policy:
    """``Sandbox("dir")`` is that workspace (with its corral.toml, if any);
    ``Sandbox("corral.toml")`` that policy file, as ``corral run --policy``."""
    from corral import policy as pol
    from corral.errors import PolicyError

    if os.path.isdir(path):
        if workspace is not None:
            raise PolicyError(f"Sandbox: {path} is a directory, and workspace= names another")
        return pol.load(path)
    if os.path.isfile(path):
        return pol.load(workspace, path)
    raise PolicyError(f"Sandbox: {path}: no such workspace directory or policy file")


MAX_TIMEOUT = 10.0**7  # seconds (115 days): beyond it, a clock's arithmetic overflows


def check_timeout(value: object) -> float | None:
    """A command's timeout as given to exec or spawn: None, or seconds from 0 (none)
    up to MAX_TIMEOUT.  A negative one shut the agent's channel for good (the host
    waited a time below zero and took the agent for hung), NaN and an integer past
    a float's range likewise: ValueError, naming the value."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"timeout must be a number of seconds, not {type(value).__name__}")
    try:
        seconds = float(value)
    except OverflowError:
        seconds = float("inf")
    if not 0 <= seconds <= MAX_TIMEOUT:  # (NaN fails it too)
        raise ValueError(
            f"timeout must be 0 (none) to {MAX_TIMEOUT:.0f} seconds, not {value!r}"[:120]
        )
    return seconds


def _policy_for(
    policy: object,
    workspace: str | None,
    tier: str,
    image: str | None,
    oci_runtime: str | None,
    engine: str | None,
) -> Policy:
    """The policy a Sandbox runs: ``policy`` as given (a Policy, a workspace
    directory, a policy file, or None: the workspace's), checked as a file would
    be, bounded, with the tier and [container] keys given in code."""
    from corral import policy as pol
    from corral.policy import Policy

    if policy is None:
        policy = pol.load(workspace)
    elif isinstance(policy, str | os.PathLike):
        policy = _load_named(os.fspath(policy), workspace)
    if not isinstance(policy, Policy):
        raise TypeError(
            "policy must be a corral.policy.Policy (Policy.load(...)), "
            "a workspace directory or a policy file"
        )
    # built or changed in code: the checks a policy file gets (allow without a
    # network mode is an error, not a sandbox quietly without network)
    pol.check_network(policy, python=True)
    if not policy.limits.defaults:  # built by hand, not by Policy.load: bound it too
        from corral import bounds

        policy.limits.defaults = bounds.defaults_for(bounds.host_facts())
    if tier != "auto":
        policy.tier = tier
    from corral.policy import _expect_engine, _expect_image, _expect_runtime

    try:
        if image is not None:
            policy.container.image = _expect_image(image)
        if oci_runtime is not None:
            policy.container.runtime = _expect_runtime(oci_runtime)
        if engine is not None:
            policy.container.engine = _expect_engine(engine)
    except ValueError as exc:
        raise SandboxError(str(exc)) from None
    return policy


class Sandbox:
    def __init__(
        self,
        policy: object = None,
        tier: str = "auto",
        workspace: str | None = None,
        *,
        image: str | None = None,
        oci_runtime: str | None = None,
        engine: str | None = None,
        log: str | bool | None = None,
        kind: str = "sandbox",
        on_ask: Callable[[AskInfo], object] | None = None,
        placement: Placement | None = None,
        net_log: str | None = None,
        _ask_loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """``placement``: where the sandbox runs and how its agent is reached
        (:mod:`corral.placement`; default: this machine over a socket pair).
        ``net_log``: the proxy's audit log (default: corral's net.jsonl).

        ``image``, ``oci_runtime`` and ``engine`` set the policy's [container] keys
        (the container and gvisor tiers).  ``log``: the activity log that gets one
        record when the sandbox closes (default: corral's, as for ``corral run``;
        False: none); ``kind`` is what that record calls it.

        ``on_ask``: answers the requests an ask rule holds (see
        :mod:`corral.net.approvals`): called with an :class:`AskInfo` (``host``,
        ``port``, ``method``, ``path``, ``rule``, ``reason``, ``id``), sync or async,
        on a thread of its own; returns ``Decision.once()``,
        ``Decision.allow_for("10m")``, ``Decision.deny()`` (or True, False, a
        duration).  Without it, held requests wait for ``corral approve`` until
        ``[network] ask_timeout``."""
        from corral import launch, tiers

        self.policy = policy = _policy_for(policy, workspace, tier, image, oci_runtime, engine)
        if isinstance(log, str) or net_log:  # (made now, and masked: see keep_out)
            from corral import runlog

            try:
                runlog.keep_out(
                    policy.filesystem.read_deny, log, net_log, writable=policy.writable_paths()
                )
            except OSError as exc:
                why = (
                    f"{exc.filename} as a log: {exc.strerror}"
                    if exc.filename
                    else f"the log: {exc}"
                )
                raise SandboxError(f"cannot write {why}") from None
        if placement is None:
            from corral.placement import Local

            placement = Local()
        self.placement = placement
        self.tier, _ = tiers.select(policy.tier, policy)
        if not self.tier.strategy.confines:
            raise SandboxError(f"a long-lived sandbox needs a real tier, not {self.tier.name}")
        self.run_id = launch.new_run_id()
        self._net_log, self._on_ask, self._ask_loop = net_log, on_ask, _ask_loop
        self._log = log
        self._kind = kind
        self._init_state()
        self._door: Door | None = None
        self._open_door()
        if self._lazy:
            return
        try:
            self._start()
        except BaseException:
            if self._door is not None:
                self._door.close()
            raise

    def _open_door(self) -> None:
        """The sandbox's door (None without a network), and its answerer if asks
        are answered in this process."""
        from corral.net.door import open_door

        self._door = door = open_door(
            self.policy,
            self.run_id,
            self._net_log,
            transport=self.tier.door_transport,
            answerer=self._on_ask is not None,
        )
        if self._on_ask is not None and door is not None and door.ask_sock is not None:
            from corral.net.approvals import CallbackAnswerer

            CallbackAnswerer(door.ask_sock, self._on_ask, self._ask_loop, self.errors.append)

    def _init_state(self) -> None:
        """What a sandbox keeps from its start to its close (no process started)."""
        self._closed = False
        # what closing found: quarantined and restored paths, refused writes, hosts
        # the proxy refused (corral.report.Denial: str() is the line corral prints)
        self.denials: list[Denial] = []
        # writable places as the sandbox sees them (files.write makes parents there)
        self._roots = [os.path.realpath(p) for p in self.policy.writable_paths()]
        self._began = time.time()
        self._execs = 0  # commands run, for the activity log; the last few kept
        self._history: collections.deque[dict[str, object]] = collections.deque(maxlen=HISTORY)
        # unexpected errors inside corral's own parts (the agent), one line each
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._next_id = 0
        self._waiting: dict[int, queue.Queue[tuple[dict[str, object], bytes]] | _Waiter] = {}
        self._bounds: dict[int, tuple[int, int]] = {}  # pending file requests' replies'
        self._procs: dict[int, Process] = {}
        self.files = Files(self)
        # A container starts on first use and again after it died; the lock makes
        # concurrent first calls share one start.  Other tiers start here, as before.
        self._lazy = self.tier.strategy.lazy
        self._start_lock = threading.Lock()
        self._stderr_r = -1  # the running instance's stderr (-1: none to discard)
        self._alive = False
        self._instance = 0  # starts so far
        self._guarded = False  # the agent made itself undumpable (its ready frame)

    def _ensure(self) -> None:
        """Start the sandbox if it is not running (first use, or it died)."""
        if not self._lazy or self._alive:
            if self._closed:
                raise SandboxClosed()
            if not self._alive and self._instance:  # (a tier that cannot start again)
                raise SandboxError("the sandbox is gone: its agent's channel ended")
            return
        with self._start_lock:
            if self._closed:
                raise SandboxClosed()
            if self._alive:
                return
            if self._instance:
                self._discard()  # what is left of the one that died
            self._start()

    @property
    def notes(self) -> list[str]:
        """What the plan decided beyond the policy (hard links made read-only, a
        default limit not enforced here), once the sandbox has started."""
        plan = getattr(self, "plan", None)
        return list(plan.notes) if plan is not None else []

    @property
    def starts(self) -> int:
        """How many times the sandbox was started (a container restarts if it dies)."""
        return self._instance

    def _discard(self) -> None:
        """Remove a dead instance: its engine client, container, files and guardian
        (nothing when the last start failed: that cleaned up after itself)."""
        if self._stderr_r < 0:
            return
        self.denials += self._started.stop()
        if self._started.care.guardian is not None:
            self._started.care.guardian.reap()
        self._sock.close()
        os.close(self._stderr_r)
        self._stderr_r = -1

    # -- life cycle ----------------------------------------------------------------

    def _start(self) -> None:
        """Start the agent; plan again if a host path changed under the setup
        (a unix socket removed, another run's door among them: see
        cli.SETUP_ATTEMPTS).  A door takes its listeners once, so a sandbox with
        a network gets a new door for the next attempt.  Five attempts, where
        corral run has three: a Sandbox's setup is longer (a fork, then the
        namespace, then bwrap)."""
        from corral import fsplan
        from corral.errors import SetupRaced
        from corral.failures import raced

        attempts = 5
        froze = False
        try:
            for attempt in range(1, attempts + 1):
                try:
                    return self._start_once()
                except SetupRaced:  # the launcher saw a bind source change before bwrap ran
                    if attempt == attempts:
                        raise
                except SandboxError as exc:
                    if attempt == attempts or not raced(str(exc).split(": ", 1)[-1].splitlines()):
                        raise
                # The next attempt plans with the host's sockets as this one saw them, as
                # corral run's does: those gone since lose their masks at launch, and one
                # bound meanwhile came after the start began, as no plan masks.  Read
                # afresh, a host whose sockets churn would race every attempt.
                if not fsplan.host_sockets_frozen():
                    fsplan.freeze_host_sockets()
                    froze = True
                if self._door is not None:
                    self._door.close()
                    self._open_door()
        finally:
            if froze:
                fsplan.thaw_host_sockets()

    def _start_once(self) -> None:
        from corral import launch
        from corral.fsplan import Mount
        from corral.tiers.base import SANDBOX_AGENT

        ours, theirs = self.placement.channel()
        self._sock = ours
        agent = os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent.py")
        command = self.tier.agent_command()
        agent_bind = Mount("ro-bind", SANDBOX_AGENT, agent, "the sandbox's agent")
        plan = self.tier.plan(
            self.policy,
            command,
            door=self._door.address if self._door else None,
            extra=[agent_bind],
            net=self._door.extras if self._door else None,
            # read again for each start: a new token
            host=self.tier.gather(self.policy, agent=True),
        )
        self.plan = plan
        err_r, err_w = os.pipe()
        try:
            self._started = launch.start(
                plan, self.run_id, {0: theirs.fileno(), 1: theirs.fileno(), 2: err_w}
            )
        except BaseException:
            ours.close()
            os.close(err_r)
            raise
        finally:
            theirs.close()
            os.close(err_w)
        self._stderr_r = err_r
        try:
            self._started.wait_started()
            header, _ = self._recv()
            if header.get("ev") != "ready":
                raise SandboxError(f"unexpected first message from the agent: {header}"[:500])
            # no command can write into the agent (reset relies on it)
            self._guarded = bool(header.get("guarded"))
        except (SandboxError, OSError, EOFError, ValueError) as exc:
            detail = self._drain_stderr()
            self._started.stop()  # kills, removes the container and the scratch files
            ours.close()
            os.close(err_r)
            self._stderr_r = -1  # nothing left to discard
            raise SandboxError(f"the sandbox did not start: {detail or exc}") from None
        self._instance += 1
        self._alive = True
        self._reader = threading.Thread(
            target=self._read_loop, args=(ours,), daemon=True, name=f"corral-{self.run_id}"
        )
        self._reader.start()

    def _drain_stderr(self) -> str:
        # what the sandbox's launcher says as it ends may come just after the
        # channel closed (a VM's runner reports why QEMU ended): wait a moment
        select.select([self._stderr_r], [], [], 2.0)
        os.set_blocking(self._stderr_r, False)
        try:
            return os.read(self._stderr_r, 65536).decode("utf-8", "replace").strip()
        except (BlockingIOError, OSError):
            return ""

    def close(self, settle: float = 0.0) -> None:
        """Kill everything inside, remove the sandbox, its door and cgroup.
        ``settle``: wait up to this many seconds for the guardian to finish what
        was left to it (the cgroup of a sandbox still exiting): for a process
        about to be killed with its children (a Ray actor's worker)."""
        with self._start_lock, self._lock:
            if self._closed:
                return
            self._closed = True
        if self._lazy and not self._instance:  # never started: nothing but the door
            if self._door is not None:
                self._door.close()
            return
        try:
            self._raw_send({"op": "shutdown"})
        except OSError:
            pass
        if self.tier.strategy.close_grace:
            # the agent's exit may end the sandbox by itself (a container's --rm)
            self._wait_client(self.tier.strategy.close_grace)
        self._sock.close()
        ended = self._stderr_r < 0  # the last start failed and cleaned up after itself
        if not ended:
            os.close(self._stderr_r)
            self._stderr_r = -1
        for proc in list(self._procs.values()):
            if proc.running:  # killed with the sandbox: its time so far, its output
                proc.result.exit_code = 128 + signal.SIGKILL
                proc.result.duration = time.monotonic() - proc._began
                with proc._lock:
                    proc.result.stdout, proc.result.stderr = bytes(proc._out), bytes(proc._err)
                proc._done.set()
                self._note(proc)
        refused: list[dict[str, object]] = []
        if self._door is not None:
            refused = self._door.close()
        if not ended:
            self.denials += self._started.stop()
            if self._started.care.guardian is not None:
                self._started.care.guardian.reap(settle)
        from corral import report

        self.denials += report.network(refused, self.policy)
        self._write_record()

    def _note(self, proc: Process) -> None:
        """One ended command, for the activity log (on the reader thread)."""
        if proc._noted:
            return
        proc._noted = True
        self._execs += 1
        r = proc.result
        self._history.append(
            {"argv": proc.argv[:20], "exit": r.exit_code, "duration": round(r.duration, 4)}
        )

    def _write_record(self) -> None:
        """The sandbox's one record in the activity log: what ``corral run`` writes,
        with the commands it ran (how many, and the last HISTORY of them)."""
        if self._log is False:
            return
        from corral import bounds, report, runlog

        record: dict[str, object] = {
            "run_id": self.run_id,
            "kind": self._kind,
            "start": runlog.iso(self._began),
            "end": runlog.iso(time.time()),
            "tier": self.plan.tier,
            "policy_digest": runlog.digest(self.policy.to_dict()),
            "policy_file": self.policy.source,
            "workspace": self.policy.workspace,
            "network": self.policy.network.mode,
            "bounds": bounds.record(self.plan),
            "duration": round(time.time() - self._began, 4),
            "execs": self._execs,
            "commands": list(self._history),
            "starts": self._instance,
            "denials": [d.recorded() for d in report.bounded(self.denials) if d.refused],
            "errors": list(self.errors),
        }
        if self.plan.notes:
            record["notes"] = self.plan.notes
        if self._door is not None:
            record["proxy_errors"] = self._door.errors
        try:
            runlog.append(record, self._log if isinstance(self._log, str) else None)
        except OSError as exc:
            self.errors.append(f"could not write the activity log: {exc}")

    def _wait_client(self, seconds: float) -> None:
        """Let the engine's client exit on its own (it removes the container)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(self._started.pid, os.WNOHANG)
            except ChildProcessError:
                return
            if pid:
                self._started.pid = -1
                return
            time.sleep(0.01)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed:
                self.close()
        except Exception:
            pass

    # -- the wire ------------------------------------------------------------------

    def _ready(self) -> bool:
        """Started and not known dead: a request needs no start first."""
        return not self._closed and (not self._lazy or self._alive)

    def _send_now(self, header: dict[str, object], payload: bytes = b"") -> bytes | None:
        """Send a frame only as far as that cannot block (an event loop's thread):
        None if nothing was sent (the caller sends it the blocking way elsewhere);
        else what the socket did not take, b"" when all went.  With a rest, the
        send lock stays held: :meth:`_send_rest` sends it and releases the lock."""
        if not self._ready() or not self._lock.acquire(blocking=False):
            return None
        try:
            if self._closed:
                raise SandboxClosed()
            frame = _frame(header, payload)
            sent = self._sock.send(frame, socket.MSG_DONTWAIT)
        except BlockingIOError:
            self._lock.release()
            return None
        except BaseException:
            self._lock.release()
            raise
        if sent == len(frame):
            self._lock.release()
            return b""
        return frame[sent:]  # frames must not interleave: the lock stays taken

    def _send_rest(self, rest: bytes) -> None:
        """The end of a frame :meth:`_send_now` began; releases the send lock."""
        try:
            self._sock.sendall(rest)
        finally:
            self._lock.release()

    def _raw_send(
        self, header: dict[str, object], payload: bytes = b"", fds: Sequence[int] = ()
    ) -> None:
        frame = _frame(header, payload)
        if not fds:
            self._sock.sendall(frame)
            return
        # the descriptors ride on the frame's first bytes: the agent receives them
        # before it reads the request that names them
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        sent = self._sock.sendmsg([frame], rights)
        if sent < len(frame):
            self._sock.sendall(frame[sent:])

    def _send(
        self, header: dict[str, object], payload: bytes = b"", fds: Sequence[int] = ()
    ) -> None:
        self._ensure()
        with self._lock:
            if self._closed:
                raise SandboxClosed()
            self._raw_send(header, payload, fds)

    def _recv(self, sock: socket.socket | None = None) -> tuple[dict[str, object], bytes]:
        """One frame; _Malformed for one the agent cannot have sent, before more of it
        than the bounds is read."""
        sock = sock or self._sock
        head = self._recv_exact(HEADER.size, sock)
        size, payload_size = HEADER.unpack(head)
        pending = list(self._bounds.values()) if self._bounds else ()  # (a copy: callers add)
        if size > MAX_HEADER and size > max((h for h, _ in pending), default=0):
            raise _Malformed(f"a header of {size} bytes")
        try:
            header = json.loads(self._recv_exact(size, sock))
        except (ValueError, RecursionError) as exc:
            raise _Malformed(f"a header that is not JSON ({type(exc).__name__})") from None
        if not isinstance(header, dict):
            raise _Malformed(f"a header that is a JSON {type(header).__name__}")
        bounds = self._bounds.get(_ident(header)) if pending else None
        if bounds is None:
            bounds = (MAX_HEADER, MAX_OUT_FRAME)
        if size > bounds[0] or payload_size > bounds[1]:
            what = f"{header.get('ev')} frame of {size} + {payload_size} bytes"
            raise _Malformed(f"a {what}, more than the agent sends there")
        payload = self._recv_exact(payload_size, sock) if payload_size else b""
        return header, payload

    def _recv_exact(self, n: int, sock: socket.socket) -> bytes:
        data = bytearray()
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return bytes(data)

    def _read_loop(self, sock: socket.socket) -> None:
        while True:
            try:
                header, payload = self._recv(sock)
                ident = _ident(header)
            except _Malformed as exc:
                # not the agent's words: nothing more on this channel is believed, and
                # the next call starts a fresh sandbox (this one is stopped then)
                self._error(f"the agent's channel carried a malformed frame ({exc}); stopped")
                break
            except (EOFError, OSError):
                break
            if header.get("ev") == "error":  # the agent caught something unexpected
                self._error(str(header.get("message", "")))
                continue
            proc = self._procs.get(ident)
            if proc is not None:
                try:
                    proc._event(header, payload)
                except Exception as exc:  # a malformed frame: this thread must live on
                    self._error(f"reader: {type(exc).__name__}: {exc}")
                if header.get("ev") == "exit":
                    self._procs.pop(ident, None)
                continue
            waiter = self._waiting.pop(ident, None)
            self._bounds.pop(ident, None)
            if waiter is not None:
                waiter.put((header, payload))
        # the agent is gone: nobody will answer the callers still waiting, and the
        # next call starts a fresh sandbox (lazy tiers)
        if sock is self._sock:
            self._alive = False
        for waiter in list(self._waiting.values()):
            waiter.put(({"ev": "done", "error": "the sandbox is gone", "errno": 0}, b""))
        for proc in list(self._procs.values()):
            proc._event({"ev": "exit", "code": 128 + signal.SIGKILL}, b"")

    def _error(self, line: str) -> None:
        """One line in ``errors``; past MAX_ERRORS only the last says how many more."""
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(line[:1000])
        elif len(self.errors) == MAX_ERRORS:
            self.errors.append("more errors (not kept)")

    def _new_id(self) -> int:
        with self._lock:
            self._next_id += 1
            return self._next_id

    # -- commands ------------------------------------------------------------------

    def _argv(self, command: str | list[str]) -> list[str]:
        if isinstance(command, str):
            return ["/bin/sh", "-c", command]
        if not command:
            raise ValueError("an empty command")
        return [str(a) for a in command]

    def _cwd(self, cwd: str | None) -> str:
        if cwd is None:
            return self.plan.cwd
        full = cwd if os.path.isabs(cwd) else os.path.join(self.policy.workspace, cwd)
        full = os.path.normpath(full)
        roots = self.policy.writable_paths()
        if not any(full == r or full.startswith(r.rstrip("/") + "/") for r in roots):
            raise CwdOutsideSandbox(
                f"cwd {cwd} is outside the sandbox's writable paths ({', '.join(roots)})"
            )
        return full

    def _env(self, env: dict[str, str] | list[str] | None) -> dict[str, str]:
        base = dict(self.plan.env)
        if isinstance(env, list):  # names: values from this process's environment
            base.update({k: os.environ[k] for k in env if k in os.environ})
        elif env:
            base.update(env)
        return base

    def spawn(
        self,
        command: str | list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | list[str] | None = None,
        timeout: float | None = None,
        stdin: bool = True,
        on_stdout: Callable[[bytes], None] | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
        pass_fds: Sequence[int] = (),
        output_limit: int | None = None,
    ) -> Process:
        """Start ``command`` in the background and return its handle, once it has a
        pid (a command that could not start has ended already: see ``returncode``).

        The command gets stdin, stdout and stderr and nothing else of this process,
        unless ``pass_fds`` names descriptors (above 2) to hand it at the same
        numbers: copies are sent to the sandbox, the caller's own stay as they are.
        ``output_limit``: bytes of output kept, below the policy's ``limits.output``.
        """
        proc = self._launch(
            command, cwd, env, timeout, stdin, on_stdout, on_stderr, pass_fds, output_limit
        )
        if not proc._started.wait(SPAWN_WAIT):
            raise SandboxError(f"the sandbox did not start {proc.argv[0]} in {SPAWN_WAIT:g}s")
        return proc

    def _launch(
        self,
        command: str | list[str],
        cwd: str | None,
        env: dict[str, str] | list[str] | None,
        timeout: float | None,
        stdin: bool,
        on_stdout: Callable[[bytes], None] | None,
        on_stderr: Callable[[bytes], None] | None,
        pass_fds: Sequence[int] = (),
        output_limit: int | None = None,
    ) -> Process:
        """Ask the agent to start ``command``; do not wait for its pid."""
        self._ensure()
        proc, header, fds = self._prepare(
            command, cwd, env, timeout, stdin, on_stdout, on_stderr, pass_fds, output_limit
        )
        self._send(header, fds=fds)
        return proc

    def _prepare(
        self,
        command: str | list[str],
        cwd: str | None,
        env: dict[str, str] | list[str] | None,
        timeout: float | None,
        stdin: bool,
        on_stdout: Callable[[bytes], None] | None,
        on_stderr: Callable[[bytes], None] | None,
        pass_fds: Sequence[int] = (),
        output_limit: int | None = None,
    ) -> tuple[Process, dict[str, object], tuple[int, ...]]:
        """The exec request for a started sandbox, its Process registered; not sent."""
        limit = self.policy.limits.output
        if output_limit is not None and (not limit or output_limit < limit):
            limit = max(1, output_limit)  # (0 would be no limit)
        fds = self._check_pass_fds(pass_fds)
        timeout = check_timeout(timeout)
        argv = self._argv(command)
        header: dict[str, object] = {
            "op": "exec",
            "argv": argv,
            "cwd": self._cwd(cwd),
            "env": self._env(env),
            # the policy's timeout bounds each command unless the call says otherwise
            "timeout": self.policy.limits.timeout if timeout is None else timeout,
            "stdin": stdin,
            "output_limit": limit,
            "fds": list(fds),
        }
        ident = header["id"] = self._new_id()
        proc = Process(self, ident, argv, on_stdout, on_stderr, limit)
        self._procs[ident] = proc
        return proc, header, fds

    def _check_pass_fds(self, pass_fds: Sequence[int]) -> tuple[int, ...]:
        fds = tuple(sorted(set(pass_fds)))
        if not fds:
            return fds
        if not self.tier.strategy.agent_fds:
            raise SandboxError(
                f"pass_fds is not available on the {self.tier.name} tier: its agent is "
                "reached through pipes that cannot carry descriptors"
            )
        if len(fds) > 64:
            raise SandboxError("pass_fds: at most 64 descriptors per command")
        for fd in fds:
            if not isinstance(fd, int) or fd < 3:
                raise SandboxError(f"pass_fds: {fd!r} is not a descriptor number above 2")
            from corral.launch import unpassable

            try:
                why = unpassable(fd)
            except OSError:
                raise SandboxError(f"pass_fds: {fd} is not an open descriptor") from None
            if why is not None:
                raise SandboxError(f"pass_fds: {fd} {why}")
        return fds

    def exec(
        self,
        command: str | list[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | list[str] | None = None,
        stdin: bytes | str | None = None,
        on_stdout: Callable[[bytes], None] | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
        pass_fds: Sequence[int] = (),
    ) -> ExecResult:
        """Run ``command`` to the end: exit code, output, timed_out, truncated, duration.

        A timeout kills the command's whole process group and keeps the output
        so far; the sandbox itself lives on.  ``pass_fds``: as for :meth:`spawn`.
        """
        proc = self.begin(command, timeout, cwd, env, stdin, on_stdout, on_stderr, pass_fds)
        try:
            return self._waited(proc, timeout)
        except BaseException:  # interrupted (Ctrl-C): the command does not go on alone
            _kill_quietly(proc)
            raise

    def _waited(self, proc: Process, timeout: float | None) -> ExecResult:
        limit = self.policy.limits.timeout if timeout is None else timeout
        if not limit:
            return proc.wait()
        try:
            return proc.wait(limit + AGENT_GRACE)
        except TimeoutError:
            self._unresponsive(f"the agent did not end a command {AGENT_GRACE:g}s past its timeout")
        proc._done.wait()  # the reader ends every command once the channel is shut
        proc.result.exit_code, proc.result.timed_out = EXIT_TIMEOUT, True
        return proc.outcome()

    def _unresponsive(self, why: str) -> None:
        """Give up on this instance: its channel is shut (every caller waiting is
        answered, the reader ends) and the next call starts a fresh one."""
        self._error(f"{why}; stopped")
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def begin(
        self,
        command: str | list[str],
        timeout: float | None,
        cwd: str | None,
        env: dict[str, str] | list[str] | None,
        stdin: bytes | str | None,
        on_stdout: Callable[[bytes], None] | None,
        on_stderr: Callable[[bytes], None] | None,
        pass_fds: Sequence[int] = (),
    ) -> Process:
        """What exec does before it waits: start, and hand over the whole stdin."""
        proc = self._launch(
            command, cwd, env, timeout, stdin is not None, on_stdout, on_stderr, pass_fds
        )
        if stdin is not None:
            proc.write_stdin(stdin)
            proc.close_stdin()
        return proc

    def exec_alone(
        self,
        command: str | list[str],
        *,
        cwd: str | None = None,
        on_output: Callable[[bytes], None] | None = None,
    ) -> ExecResult:
        """:meth:`exec` for a sandbox that runs one job at a time (corral batch
        --reuse), which it leaves as :meth:`reset` would: when the command exits,
        every other process in the sandbox is killed (a one-shot run's sandbox
        ends with its command, and a background child holding the output open
        cannot keep the job waiting), and the private /tmp, /var/tmp and
        /dev/shm are emptied before the result comes back.  Its stderr is its
        stdout (one stream, in the order written: ``on_output`` and the result's
        ``stdout``).  SandboxError on a tier that cannot be reset."""
        scrub = self._reset_request()
        proc, header, fds = self._prepare(command, cwd, None, None, False, on_output, None)
        header.update(scrub, alone=True, merge=True)
        self._send(header, fds=fds)
        result = proc.wait()
        if self._door is not None:  # what the job left held is denied as it ends, not
            try:  # only when the next begins: approved between jobs, it went out
                self._door.forget_grants()
            except (OSError, RuntimeError):
                pass  # (the next job's reset refuses with the reason)
        return result

    def _reset_request(self) -> dict[str, object]:
        """What the agent removes in a reset, once the commands still running are
        killed and the proxy has dropped the grants asks left: the tier's
        directories, and every System V object (a tier that can be reset has an
        IPC namespace of its own).  SandboxError on a tier that cannot be reset
        (``Tier.reset_dirs``)."""
        self._ensure()
        dirs = self.tier.reset_dirs(self.plan)
        if dirs is None:
            raise SandboxError(f"a {self.tier.name} sandbox cannot be reset between jobs")
        if not self._guarded:  # a command could have written itself into the agent
            raise SandboxError(
                "this sandbox cannot be reset: its agent could not make itself undumpable"
            )
        for proc in self.processes():
            proc.kill()
        if self._door is not None:  # an answer given to one job is not the next's
            try:
                self._door.forget_grants()
            except (OSError, RuntimeError) as exc:
                raise SandboxError(
                    f"this sandbox cannot be reset: its proxy did not drop the grants ({exc})"
                ) from None
        return {"empty": dirs, "ipc": True}

    def reset(self) -> dict[str, int]:
        """Give this sandbox back as it started, for the next job: every process
        left in it is killed (a command's background children too) and its
        private /tmp, /var/tmp and /dev/shm are emptied.  The workspace and the
        home layer stay (they persist between runs anyway), and so do the door
        and its proxy, which drops the grants answers to asks left.  Returns
        ``{"killed": N, "removed": N}``.  Raises SandboxError on a tier that
        cannot do it (see ``Tier.reset_dirs``)."""
        header, _ = self._file("reset", "/", extra=self._reset_request())
        return {
            "killed": int(str(header.get("killed", 0))),
            "removed": int(str(header.get("removed", 0))),
        }

    def processes(self) -> list[Process]:
        """The commands still running."""
        return [p for p in list(self._procs.values()) if p.running]

    # -- files -----------------------------------------------------------------------

    def _file(
        self,
        op: str,
        path: str,
        payload: bytes = b"",
        writing: bool = False,
        extra: dict[str, object] | None = None,
    ) -> tuple[dict[str, object], bytes]:
        self._ensure()
        waiter: queue.Queue[tuple[dict[str, object], bytes]] = queue.Queue()
        header = self._file_request(op, path, writing, extra, waiter)
        try:
            self._send(header, payload)
        except BaseException:
            self._waiting.pop(int(str(header["id"])), None)
            self._bounds.pop(int(str(header["id"])), None)
            raise
        return self._file_result(path, *waiter.get())

    def _file_request(
        self,
        op: str,
        path: str,
        writing: bool,
        extra: dict[str, object] | None,
        waiter: queue.Queue[tuple[dict[str, object], bytes]] | _Waiter,
    ) -> dict[str, object]:
        """The request for a file operation, its waiter registered; not sent."""
        full = os.path.normpath(
            path if os.path.isabs(path) else os.path.join(self.policy.workspace, path)
        )
        header: dict[str, object] = {"op": op, "path": full, **(extra or {})}
        if writing:
            # write-deny paths mounts cannot cover (missing ones), or a tier without
            # mounts cannot cover at all (landlock restores them only after the run)
            for guarded in (*self.plan.quarantine, *self.plan.restore):
                if full == guarded or full.startswith(guarded + "/"):
                    raise PathDenied(f"{path}: write-deny by policy")
            # the writable place it is in: where missing parent directories may be
            # made (the agent makes them without following a symlink)
            roots = [r for r in self._roots if full.startswith(r.rstrip("/") + "/")]
            if roots:
                header["root"] = max(roots, key=len)
        ident = header["id"] = self._new_id()
        if op in FRAME_BOUNDS:
            self._bounds[ident] = FRAME_BOUNDS[op]
        self._waiting[ident] = waiter
        return header

    def _file_result(
        self, path: str, header: dict[str, object], data: bytes
    ) -> tuple[dict[str, object], bytes]:
        if "error" in header:
            code = int(str(header.get("errno") or 0))
            message = f"{path}: {header['error']}"
            if code in (1, 13, 30):  # EPERM, EACCES, EROFS: the policy said no
                raise PathDenied(message)
            if code == 2:
                raise FileNotFoundError(code, message)
            if code == 0 and self._closed:
                raise SandboxClosed()
            raise OSError(code, message)
        return header, data

    # -- for a model's system prompt -------------------------------------------------

    def describe(self) -> str:
        net = self.policy.network
        lines = [
            f"Commands run in a corral sandbox (tier: {self.tier.name}).",
            f"Writable: {', '.join(self.policy.writable_paths())} and a private /tmp; "
            "everything else is read-only, and credentials such as ~/.ssh and ~/.aws "
            "are unreadable.",
        ]
        plan = getattr(self, "plan", None)  # a container is planned on first use
        if plan is not None and plan.home is not None:
            kept = "kept for this workspace" if plan.home.mode == "persist" else "fresh each time"
            lines.append(
                f"$HOME is writable and {kept} (caches, tool settings); the real home "
                "stays read-only."
            )
        if net.mode == "proxy":
            allowed = ", ".join(net.allow) or "nothing"
            lines.append(
                f"Network: only through corral's proxy; allowed: {allowed}"
                + (f"; denied: {', '.join(net.deny)}" if net.deny else "")
                + "."
            )
        else:
            lines.append("Network: none.")
        if net.rules:
            lines.append(
                "Some hosts allow only certain HTTP methods and paths; a refused request "
                "gets a 403 whose body says which rule refused it."
            )
        for name, secret in sorted(self.policy.secrets.items()):
            lines.append(
                f"${name} is a stand-in for a credential: use it as the real one in requests "
                f"to {', '.join(secret.hosts)} (corral's proxy puts the real value in; "
                "it is refused on its way anywhere else)."
                + (f" The {secret.header} header is set for you there." if secret.header else "")
            )
        lim = self.policy.limits
        if lim.timeout:
            lines.append(f"Each command is stopped after {lim.timeout:g}s.")
        return "\n".join(lines)


def _kill_quietly(proc: Process) -> None:
    """Kill ``proc``'s group if it still runs; a sandbox already gone has nothing left."""
    try:
        proc.kill()
    except (OSError, CorralError):
        pass


def _ident(header: dict[str, object]) -> int:
    """The request a frame answers (0: none)."""
    try:
        return int(str(header.get("id", 0)))
    except ValueError:
        raise _Malformed(f"an id that is not a number: {str(header.get('id'))[:50]!r}") from None


class _FutureWaiter(_Waiter):
    """A file operation's reply, handed to an event loop's future."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[tuple[dict[str, object], bytes]] = loop.create_future()

    def put(self, item: tuple[dict[str, object], bytes]) -> None:  # the reader thread
        try:
            self.loop.call_soon_threadsafe(self._settle, item)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def _settle(self, item: tuple[dict[str, object], bytes]) -> None:
        if not self.future.done():
            self.future.set_result(item)


class AsyncSandbox:
    """The surface of :class:`Sandbox`, awaited, never blocking the event loop::

        async with AsyncSandbox(policy) as sb:
            r = await sb.exec("make")
            await sb.files.write("notes.txt", "hello")

    bubblewrap is tied to the thread that starts it (it sets PR_SET_PDEATHSIG,
    which fires when that *thread* exits), so each AsyncSandbox has one thread
    of its own, alive as long as the sandbox, that creates, starts and closes
    it; a short-lived worker thread would take the sandbox down with it.  A
    request (exec, spawn, a file operation, kill, stdin) is sent from the
    loop's thread when the socket takes it at once, else by that thread; its
    answer arrives through the sandbox's reader thread as a future's result.
    So a warm ``exec`` costs no thread switch.
    """

    def __init__(
        self,
        policy: object = None,
        tier: str = "auto",
        workspace: str | None = None,
        **options: object,
    ) -> None:
        """As :class:`Sandbox` (``image``, ``oci_runtime``, ``engine``, ``log``,
        ``kind``, ``on_ask``); nothing starts until ``start()`` or ``async with``.
        ``on_ask`` may be sync or async: an async one runs on this event loop, a
        sync one in its executor, so it never blocks the loop."""
        self._args = (policy, tier, workspace)
        self._options = options
        self._sb: Sandbox | None = None
        self._owner: concurrent.futures.ThreadPoolExecutor | None = None
        self.files = AsyncFiles(self)

    # -- the owner thread ---------------------------------------------------------------

    async def _on_owner(self, call: Callable[[], T], must_run: bool = False) -> T:
        """Run ``call`` on this sandbox's own thread (see the class docstring).
        ``must_run``: a cancelled caller must not cancel it (it releases a lock)."""
        import asyncio

        if self._owner is None:
            self._owner = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="corral-async-sandbox"
            )
        done = asyncio.get_running_loop().run_in_executor(self._owner, call)
        return await (asyncio.shield(done) if must_run else done)

    async def _send(self, header: dict[str, object], payload: bytes = b"") -> None:
        """One frame: from here if that cannot block, else from the owner thread
        (which also starts a container that is not running)."""
        sb = self.sync
        rest = sb._send_now(header, payload)
        if rest is None:
            await self._on_owner(lambda: sb._send(header, payload))
        elif rest:  # the frame's end, and the send lock with it
            await self._on_owner(lambda: sb._send_rest(rest), must_run=True)

    async def _ensure(self) -> Sandbox:
        sb = self.sync
        if not sb._ready():
            await self._on_owner(sb._ensure)
        return sb

    # -- life cycle ---------------------------------------------------------------------

    @property
    def sync(self) -> Sandbox:
        """The :class:`Sandbox` underneath (its blocking methods block)."""
        if self._sb is None:
            raise SandboxClosed()
        return self._sb

    async def start(self) -> AsyncSandbox:
        if self._sb is None:
            import asyncio

            args, options = self._args, dict(self._options)
            if options.get("on_ask") is not None:  # answered on this loop
                options["_ask_loop"] = asyncio.get_running_loop()
            self._sb = await self._on_owner(lambda: Sandbox(*args, **options))  # type: ignore[arg-type]
        return self

    async def __aenter__(self) -> AsyncSandbox:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, settle: float = 0.0) -> None:
        """Kill everything inside, remove the sandbox, its door and cgroup
        (``settle``: as for :meth:`Sandbox.close`)."""
        if self._sb is not None:
            sb = self._sb
            await self._on_owner(lambda: sb.close(settle))
        if self._owner is not None:
            self._owner.shutdown(wait=False)
            self._owner = None

    # -- what Sandbox says about itself --------------------------------------------------

    @property
    def policy(self) -> Policy:
        return self.sync.policy

    @property
    def tier(self) -> Tier:
        return self.sync.tier

    @property
    def run_id(self) -> str:
        return self.sync.run_id

    @property
    def plan(self) -> Plan:
        return self.sync.plan

    @property
    def notes(self) -> list[str]:
        return self.sync.notes

    @property
    def denials(self) -> list[Denial]:
        return self.sync.denials

    @property
    def errors(self) -> list[str]:
        return self.sync.errors

    @property
    def starts(self) -> int:
        return self.sync.starts

    def describe(self) -> str:
        return self.sync.describe()

    def processes(self) -> list[AsyncProcess]:
        return [AsyncProcess(self, p) for p in self.sync.processes()]

    # -- commands -----------------------------------------------------------------------

    async def _begin(
        self,
        command: str | list[str],
        timeout: float | None,
        cwd: str | None,
        env: dict[str, str] | list[str] | None,
        stdin: bytes | str | None,
        on_stdout: Callable[[bytes], None] | None,
        on_stderr: Callable[[bytes], None] | None,
        pass_fds: Sequence[int],
    ) -> Process:
        sb = self.sync
        if not sb._ready():
            await self._on_owner(sb._ensure)
        if pass_fds:  # descriptors ride on a blocking sendmsg
            return await self._on_owner(
                lambda: sb.begin(command, timeout, cwd, env, stdin, on_stdout, on_stderr, pass_fds)
            )
        wants = stdin is not None
        proc, header, _ = sb._prepare(command, cwd, env, timeout, wants, on_stdout, on_stderr)
        try:
            await self._send(header)
        except BaseException:
            sb._procs.pop(proc.id, None)
            raise
        if stdin is not None:
            raw = stdin.encode() if isinstance(stdin, str) else stdin
            await self._send({"op": "stdin", "id": proc.id}, raw)
            await self._send({"op": "close_stdin", "id": proc.id})
        return proc

    async def exec(
        self,
        command: str | list[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | list[str] | None = None,
        stdin: bytes | str | None = None,
        on_stdout: Callable[[bytes], None] | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
        pass_fds: Sequence[int] = (),
    ) -> ExecResult:
        """As :meth:`Sandbox.exec`, awaited.  Cancelled (``wait_for``, a task's
        cancel), it kills the command's process group before it raises: an agent
        framework's stopped tool call leaves nothing running."""
        import asyncio

        proc = await self._begin(command, timeout, cwd, env, stdin, on_stdout, on_stderr, pass_fds)
        try:
            return await self._waited(proc, timeout)
        except BaseException:
            if proc.running:
                kill = {"op": "kill", "id": proc.id, "signal": int(signal.SIGKILL)}
                try:  # (shielded: a second cancel does not stop the kill on its way)
                    await asyncio.shield(self._send(kill))
                except (Exception, asyncio.CancelledError):
                    pass
            raise

    async def _waited(self, proc: Process, timeout: float | None) -> ExecResult:
        sb = self.sync
        limit = sb.policy.limits.timeout if timeout is None else timeout
        if not limit:
            return await self.wait(proc)
        try:
            return await self.wait(proc, limit + AGENT_GRACE)
        except TimeoutError:
            sb._unresponsive(f"the agent did not end a command {AGENT_GRACE:g}s past its timeout")
        await self.wait(proc)  # the reader ends every command once the channel is shut
        proc.result.exit_code, proc.result.timed_out = EXIT_TIMEOUT, True
        return proc.outcome()

    async def exec_alone(
        self,
        command: str | list[str],
        *,
        cwd: str | None = None,
        on_output: Callable[[bytes], None] | None = None,
    ) -> ExecResult:
        """As :meth:`Sandbox.exec_alone`, awaited (on a thread of the loop's
        executor: the event loop never waits on it)."""
        import asyncio

        sb = self.sync
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            None, lambda: sb.exec_alone(command, cwd=cwd, on_output=on_output)
        )

    async def reset(self) -> dict[str, int]:
        """As :meth:`Sandbox.reset`, awaited (on the loop's executor)."""
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(None, self.sync.reset)

    async def spawn(
        self,
        command: str | list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | list[str] | None = None,
        timeout: float | None = None,
        stdin: bool = True,
        on_stdout: Callable[[bytes], None] | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
        pass_fds: Sequence[int] = (),
        output_limit: int | None = None,
    ) -> AsyncProcess:
        """As :meth:`Sandbox.spawn`: returns once the command has its pid."""
        import asyncio

        sb = await self._ensure()
        asked = (command, cwd, env, timeout, stdin, on_stdout, on_stderr)
        if pass_fds:
            fds = tuple(pass_fds)
            proc = await self._on_owner(lambda: sb._launch(*asked, fds, output_limit))
        else:
            proc, header, _ = sb._prepare(*asked, (), output_limit)
            try:
                await self._send(header)
            except BaseException:
                sb._procs.pop(proc.id, None)
                raise
        loop = asyncio.get_running_loop()
        started: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not started.done():
                started.set_result(None)

        def on_start() -> None:  # on the sandbox's reader thread
            loop.call_soon_threadsafe(settle)

        proc.add_start_callback(on_start)
        try:
            await asyncio.wait_for(started, SPAWN_WAIT)
        except TimeoutError:
            raise SandboxError(
                f"the sandbox did not start {proc.argv[0]} in {SPAWN_WAIT:g}s"
            ) from None
        return AsyncProcess(self, proc)

    async def wait(self, proc: Process | AsyncProcess, timeout: float | None = None) -> ExecResult:
        """The result once ``proc`` ends (CallbackError if a callback raised)."""
        import asyncio

        target = proc.proc if isinstance(proc, AsyncProcess) else proc
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ExecResult] = loop.create_future()

        def settle(result: ExecResult) -> None:
            if not future.done():
                future.set_result(result)

        def done(result: ExecResult) -> None:  # on the sandbox's reader thread
            loop.call_soon_threadsafe(settle, result)

        target.add_exit_callback(done)
        if timeout is None:
            await future
        else:
            try:
                await asyncio.wait_for(future, timeout)
            except TimeoutError:
                raise TimeoutError(f"process {target.id} still running after {timeout}s") from None
        return target.outcome()

    # -- files (kept for callers of the first AsyncSandbox; see .files) -----------------------

    async def read(self, path: str) -> bytes:
        return await self.files.read(path)

    async def write(self, path: str, data: bytes | str) -> None:
        await self.files.write(path, data)

    async def list(self, path: str = ".") -> list[dict[str, object]]:
        return await self.files.list(path)

    async def _file(
        self,
        op: str,
        path: str,
        payload: bytes = b"",
        writing: bool = False,
        extra: dict[str, object] | None = None,
    ) -> tuple[dict[str, object], bytes]:
        import asyncio

        sb = await self._ensure()
        waiter = _FutureWaiter(asyncio.get_running_loop())
        header = sb._file_request(op, path, writing, extra, waiter)
        try:
            await self._send(header, payload)
        except BaseException:
            sb._waiting.pop(int(str(header["id"])), None)
            sb._bounds.pop(int(str(header["id"])), None)
            raise
        return sb._file_result(path, *await waiter.future)


class AsyncFiles:
    """:class:`Files`, awaited: the same operations, under the same policy."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self.sb = sandbox

    async def read(self, path: str) -> bytes:
        return (await self.sb._file("read", path))[1]

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read(path)).decode(encoding)

    async def write(self, path: str, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else data
        await self.sb._file("write", path, raw, writing=True)

    async def list(self, path: str = ".") -> list[dict[str, object]]:
        entries = (await self.sb._file("list", path))[0].get("entries", [])
        return list(entries) if isinstance(entries, list) else []

    async def exists(self, path: str) -> bool:
        return bool((await self.sb._file("exists", path))[0].get("exists"))

    async def remove(self, path: str) -> None:
        await self.sb._file("remove", path, writing=True)

    async def mkdir(self, path: str, exist_ok: bool = True) -> None:
        await self.sb._file("mkdir", path, writing=True, extra={"exist_ok": exist_ok})


class AsyncProcess:
    """A command started with :meth:`AsyncSandbox.spawn`: :class:`Process`'s surface,
    with waiting, signals and stdin awaited."""

    def __init__(self, sandbox: AsyncSandbox, proc: Process) -> None:
        self.sandbox = sandbox
        self.proc = proc  # the Process underneath

    @property
    def id(self) -> int:
        return self.proc.id

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def argv(self) -> list[str]:
        return self.proc.argv

    @property
    def result(self) -> ExecResult:
        return self.proc.result

    @property
    def running(self) -> bool:
        return self.proc.running

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    @property
    def error(self) -> BaseException | None:
        return self.proc.error

    @property
    def unread(self) -> bool:
        return self.proc.unread

    def read_output(self, discard: bool = False) -> tuple[bytes, bytes]:
        return self.proc.read_output(discard)

    def add_exit_callback(self, callback: Callable[[ExecResult], None]) -> None:
        self.proc.add_exit_callback(callback)

    def outcome(self) -> ExecResult:
        return self.proc.outcome()

    async def wait(self, timeout: float | None = None) -> ExecResult:
        return await self.sandbox.wait(self.proc, timeout)

    async def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.running:
            await self.sandbox._send({"op": "kill", "id": self.proc.id, "signal": int(sig)})

    async def write_stdin(self, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else data
        await self.sandbox._send({"op": "stdin", "id": self.proc.id}, raw)

    async def close_stdin(self) -> None:
        await self.sandbox._send({"op": "close_stdin", "id": self.proc.id})

    def __repr__(self) -> str:
        return f"Async{self.proc!r}"
