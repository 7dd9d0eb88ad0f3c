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
import json
import os
import queue
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence

from corral.errors import CorralError

HEADER = struct.Struct("!II")
SANDBOX_AGENT = "/run/corral/agent.py"
SPAWN_WAIT = 30.0  # seconds for the agent to report a started command's pid


class SandboxError(CorralError):
    """Base of the errors the Python API raises."""


class SandboxClosed(SandboxError):
    def __init__(self) -> None:
        super().__init__("the sandbox is closed")


class CwdOutsideSandbox(SandboxError):
    pass


class PathDenied(SandboxError, PermissionError):
    """The policy forbids this file operation (read-deny, write-deny, read-only)."""


class CallbackError(SandboxError):
    """An ``on_stdout``/``on_stderr``/exit callback raised.  The command was killed
    (nobody was taking its output any more, as when a pipeline's reader exits);
    ``result`` holds what it did until then and ``__cause__`` the callback's error."""

    def __init__(self, result: ExecResult, error: BaseException) -> None:
        super().__init__(f"a callback raised {type(error).__name__}: {error}")
        self.result = result


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
    ) -> None:
        self.sandbox = sandbox
        self.id = ident
        self.argv = argv
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
        self.error: BaseException | None = None  # the first callback error, if any

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
        elif ev == "out":
            which = int(str(header["fd"]))
            with self._lock:
                (self._out if which == 1 else self._err).extend(payload)
            callback = self._on.get(which)
            if callback is not None:
                self._call(callback, payload)
        elif ev == "exit":
            r = self.result
            r.exit_code = int(str(header["code"]))
            r.timed_out = bool(header.get("timed_out"))
            r.truncated = bool(header.get("truncated"))
            r.duration = time.monotonic() - self._began
            with self._lock:
                r.stdout, r.stderr = bytes(self._out), bytes(self._err)
                callbacks = list(self._exit_callbacks)
            self._started.set()
            self._done.set()
            for notify in callbacks:
                self._call(notify, r)

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

    def read_output(self) -> tuple[bytes, bytes]:
        """What arrived on stdout and stderr since the last call."""
        with self._lock:
            out, err = bytes(self._out[self._read_out :]), bytes(self._err[self._read_err :])
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
    ) -> None:
        """``image``, ``oci_runtime`` and ``engine`` set the policy's [container] keys
        (the container and gvisor tiers)."""
        from corral import launch, tiers
        from corral import policy as pol
        from corral.policy import Policy

        if policy is None:
            policy = pol.load(workspace)
        if not isinstance(policy, Policy):
            raise TypeError("policy must be a corral.policy.Policy (Policy.load(...))")
        self.policy = policy
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
        self.tier, _ = tiers.select(policy.tier, policy)
        if self.tier.name == "none":
            raise SandboxError("a long-lived sandbox needs a real tier, not none")
        self.run_id = launch.new_run_id()
        from corral.net.door import open_door

        self._door = open_door(policy, self.run_id, transport=self.tier.door_transport)
        self._closed = False
        self.denials: list[str] = []  # what closing found undone (quarantine, restore)
        # unexpected errors inside corral's own parts (the agent), one line each
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._next_id = 0
        self._waiting: dict[int, queue.Queue[tuple[dict[str, object], bytes]]] = {}
        self._procs: dict[int, Process] = {}
        self.files = Files(self)
        # A container starts on first use and again after it died; the lock makes
        # concurrent first calls share one start.  Other tiers start here, as before.
        self._lazy = self.tier.name in ("container", "gvisor")
        self._start_lock = threading.Lock()
        self._alive = False
        self._instance = 0  # starts so far
        if self._lazy:
            return
        try:
            self._start()
        except BaseException:
            if self._door is not None:
                self._door.close()
            raise

    def _ensure(self) -> None:
        """Start the sandbox if it is not running (first use, or it died)."""
        if not self._lazy or self._alive:
            if self._closed:
                raise SandboxClosed()
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
    def starts(self) -> int:
        """How many times the sandbox was started (a container restarts if it dies)."""
        return self._instance

    def _discard(self) -> None:
        """Remove a dead instance: its engine client, container, files and guardian."""
        self.denials += self._started.stop()
        if self._started.care.guardian is not None:
            self._started.care.guardian.reap()
        self._sock.close()
        os.close(self._stderr_r)

    # -- life cycle ----------------------------------------------------------------

    def _start(self) -> None:
        from corral import launch
        from corral.fsplan import Mount

        ours, theirs = socket.socketpair()
        self._sock = ours
        agent = os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent.py")
        command = [*self.tier.python_argv(), "-I", "-S", SANDBOX_AGENT]
        agent_bind = Mount("ro-bind", SANDBOX_AGENT, agent, "the sandbox's agent")
        plan = self.tier.plan(
            self.policy,
            command,
            door=self._door.address if self._door else None,
            extra=[agent_bind],
            net=self._door.extras if self._door else None,
        )
        self.plan = plan
        err_r, err_w = os.pipe()
        try:
            self._started = launch.start(
                plan, self.run_id, {0: theirs.fileno(), 1: theirs.fileno(), 2: err_w}
            )
        finally:
            theirs.close()
            os.close(err_w)
        self._stderr_r = err_r
        try:
            self._started.wait_started()
            header, _ = self._recv()
            if header.get("ev") != "ready":
                raise SandboxError(f"unexpected first message from the agent: {header}")
        except (SandboxError, OSError, EOFError) as exc:
            detail = self._drain_stderr()
            self._started.stop()  # kills, removes the container and the scratch files
            ours.close()
            os.close(err_r)
            raise SandboxError(f"the sandbox did not start: {detail or exc}") from None
        self._instance += 1
        self._alive = True
        self._reader = threading.Thread(
            target=self._read_loop, args=(ours,), daemon=True, name=f"corral-{self.run_id}"
        )
        self._reader.start()

    def _drain_stderr(self) -> str:
        os.set_blocking(self._stderr_r, False)
        try:
            return os.read(self._stderr_r, 65536).decode("utf-8", "replace").strip()
        except (BlockingIOError, OSError):
            return ""

    def close(self) -> None:
        """Kill everything inside, remove the sandbox, its door and cgroup."""
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
        if self.plan.teardown:
            self._wait_client(2.0)  # the agent's exit ends the container; --rm removes it
        self._sock.close()
        os.close(self._stderr_r)
        for proc in list(self._procs.values()):
            if proc.running:
                proc.result.exit_code = 128 + signal.SIGKILL
                proc._done.set()
        if self._door is not None:
            self._door.close()
        self.denials = self._started.stop()
        if self._started.care.guardian is not None:
            self._started.care.guardian.reap()

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

    def _raw_send(
        self, header: dict[str, object], payload: bytes = b"", fds: Sequence[int] = ()
    ) -> None:
        data = json.dumps(header, separators=(",", ":")).encode()
        frame = HEADER.pack(len(data), len(payload)) + data + payload
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
        sock = sock or self._sock
        head = self._recv_exact(HEADER.size, sock)
        size, payload_size = HEADER.unpack(head)
        header = json.loads(self._recv_exact(size, sock))
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
            except (EOFError, OSError, ValueError):
                break
            if header.get("ev") == "error":  # the agent caught something unexpected
                self.errors.append(str(header.get("message", "")))
                continue
            ident = int(str(header.get("id", 0)))
            proc = self._procs.get(ident)
            if proc is not None:
                try:
                    proc._event(header, payload)
                except Exception as exc:  # a malformed frame: this thread must live on
                    self.errors.append(f"reader: {type(exc).__name__}: {exc}")
                if header.get("ev") == "exit":
                    self._procs.pop(ident, None)
                continue
            waiter = self._waiting.pop(ident, None)
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
    ) -> Process:
        """Start ``command`` in the background and return its handle, once it has a
        pid (a command that could not start has ended already: see ``returncode``).

        The command gets stdin, stdout and stderr and nothing else of this process,
        unless ``pass_fds`` names descriptors (above 2) to hand it at the same
        numbers: copies are sent to the sandbox, the caller's own stay as they are.
        """
        proc = self._launch(command, cwd, env, timeout, stdin, on_stdout, on_stderr, pass_fds)
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
    ) -> Process:
        """Ask the agent to start ``command``; do not wait for its pid."""
        fds = self._check_pass_fds(pass_fds)
        self._ensure()
        argv = self._argv(command)
        ident = self._new_id()
        proc = Process(self, ident, argv, on_stdout, on_stderr)
        self._procs[ident] = proc
        limit = self.policy.limits.output
        self._send(
            {
                "op": "exec",
                "id": ident,
                "argv": argv,
                "cwd": self._cwd(cwd),
                "env": self._env(env),
                "timeout": timeout,
                "stdin": stdin,
                "output_limit": limit,
                "fds": list(fds),
            },
            fds=fds,
        )
        return proc

    def _check_pass_fds(self, pass_fds: Sequence[int]) -> tuple[int, ...]:
        fds = tuple(sorted(set(pass_fds)))
        if not fds:
            return fds
        if self._lazy:
            raise SandboxError(
                f"pass_fds is not available on the {self.tier.name} tier: its agent is "
                "reached through the engine's pipes, which cannot carry descriptors"
            )
        if len(fds) > 64:
            raise SandboxError("pass_fds: at most 64 descriptors per command")
        for fd in fds:
            if not isinstance(fd, int) or fd < 3:
                raise SandboxError(f"pass_fds: {fd!r} is not a descriptor number above 2")
            try:
                os.fstat(fd)
            except OSError:
                raise SandboxError(f"pass_fds: {fd} is not an open descriptor") from None
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
        return self.begin(command, timeout, cwd, env, stdin, on_stdout, on_stderr, pass_fds).wait()

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
        full = os.path.normpath(
            path if os.path.isabs(path) else os.path.join(self.policy.workspace, path)
        )
        if writing:
            # write-deny paths mounts cannot cover (missing ones), or a tier without
            # mounts cannot cover at all (landlock restores them only after the run)
            for guarded in (*self.plan.quarantine, *self.plan.restore):
                if full == guarded or full.startswith(guarded + "/"):
                    raise PathDenied(f"{path}: write-deny by policy")
        ident = self._new_id()
        waiter: queue.Queue[tuple[dict[str, object], bytes]] = queue.Queue()
        self._waiting[ident] = waiter
        try:
            self._send({"op": op, "id": ident, "path": full, **(extra or {})}, payload)
        except BaseException:
            self._waiting.pop(ident, None)
            raise
        header, data = waiter.get()
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


class AsyncSandbox:
    """The same surface as :class:`Sandbox`, awaited::

        async with AsyncSandbox(policy) as sb:
            r = await sb.exec("make")

    Commands are awaited through the agent's events (no thread per call), so
    many can be in flight on one event loop.  File calls run in a worker thread.
    The sandbox is created on the event loop's own thread: bubblewrap is tied to
    the thread that starts it and would die with a short-lived worker thread.
    """

    def __init__(
        self,
        policy: object = None,
        tier: str = "auto",
        workspace: str | None = None,
        **container: str,
    ) -> None:
        self._args = (policy, tier, workspace)
        self._container = container  # image, oci_runtime, engine: as for Sandbox
        self._sb: Sandbox | None = None

    @property
    def sync(self) -> Sandbox:
        if self._sb is None:
            raise SandboxClosed()
        return self._sb

    async def start(self) -> AsyncSandbox:
        if self._sb is None:
            self._sb = Sandbox(*self._args, **self._container)
        return self

    async def __aenter__(self) -> AsyncSandbox:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._sb is not None:
            self._sb.close()

    async def wait(self, proc: Process) -> ExecResult:
        import asyncio

        loop = asyncio.get_running_loop()
        future: asyncio.Future[ExecResult] = loop.create_future()

        def settle(result: ExecResult) -> None:
            if not future.done():
                future.set_result(result)

        def done(result: ExecResult) -> None:  # on the sandbox's reader thread
            loop.call_soon_threadsafe(settle, result)

        proc.add_exit_callback(done)
        await future
        return proc.outcome()

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
        proc = self.sync.begin(command, timeout, cwd, env, stdin, on_stdout, on_stderr, pass_fds)
        return await self.wait(proc)

    def spawn(self, command: str | list[str], **kw: object) -> Process:
        return self.sync.spawn(command, **kw)  # type: ignore[arg-type]

    def processes(self) -> list[Process]:
        return self.sync.processes()

    def describe(self) -> str:
        return self.sync.describe()

    async def read(self, path: str) -> bytes:
        import asyncio

        return await asyncio.to_thread(self.sync.files.read, path)

    async def write(self, path: str, data: bytes | str) -> None:
        import asyncio

        await asyncio.to_thread(self.sync.files.write, path, data)

    async def list(self, path: str = ".") -> list[dict[str, object]]:
        import asyncio

        return await asyncio.to_thread(self.sync.files.list, path)
