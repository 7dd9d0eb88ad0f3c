"""The door: one unix socket per run, served by a proxy process forked for it.

The parent (corral) binds and listens on the socket *before* forking, so the
door accepts connections from the moment the sandbox starts.  The proxy
process holds the read end of a "life" pipe: when corral closes it (the run
ended) or dies (the kernel closes it), the proxy writes its tally of denials
back, removes the socket and its directory, and exits.  So the door never
outlives the run, and if the proxy dies first, the socket has no listener and
the sandbox simply has no network.

A proxy process never writes to the terminal it inherited (it is the user's):
its stderr is /dev/null, and an unexpected exception becomes one line in the
audit log and a count that :meth:`Door.close` returns to the run record.
The tally pipe carries tab-separated lines: ``deny HOST:PORT N`` per denied
destination, ``errors N`` and, for a worker that failed outright,
``crash TEXT``.
"""

from __future__ import annotations

import os
import socket

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.fsplan import Mount
    from corral.net.ca import CA
    from corral.net.trust import NetExtras
    from corral.policy import Policy

# Where the door and the relay appear inside a sandbox (a private tmpfs).
SANDBOX_DOOR = "/run/corral/door.sock"
SANDBOX_RELAY = "/run/corral/relay.py"
HTTP_PORT = 3128
SOCKS_PORT = 1080


def relay_script() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "relay.py")


def relay_argv(python: list[str]) -> list[str]:
    """The relay as the sandbox's first process (``python`` as the sandbox sees it);
    the command follows after ``--``."""
    return [
        *python,
        "-I",
        "-S",
        SANDBOX_RELAY,
        "--door",
        SANDBOX_DOOR,
        "--http",
        str(HTTP_PORT),
        "--socks",
        str(SOCKS_PORT),
    ]


def door_mounts(door: str) -> list[Mount]:
    """Binds a mount-namespace tier adds: the door's socket and the relay script."""
    from corral.fsplan import Mount

    return [
        Mount("ro-bind", SANDBOX_DOOR, door, "the one way out: corral's proxy"),
        Mount("ro-bind", SANDBOX_RELAY, relay_script(), "relay to the door"),
    ]


def proxy_env(http_port: int = HTTP_PORT, socks_port: int = SOCKS_PORT) -> dict[str, str]:
    """What tools read to find a proxy: the relay inside the sandbox, or the
    door's own TCP port (one port speaks both HTTP and SOCKS5)."""
    http = f"http://127.0.0.1:{http_port}"
    socks = f"socks5h://127.0.0.1:{socks_port}"
    env = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY"):
        env[name] = env[name.lower()] = http
    env["ALL_PROXY"] = env["all_proxy"] = socks
    env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
    for name in (
        "npm_config_proxy",
        "npm_config_https_proxy",
        "YARN_HTTP_PROXY",
        "YARN_HTTPS_PROXY",
        "PIP_PROXY",
    ):
        env[name] = http
    return env


def open_door(
    policy: Policy, run_id: str, audit_path: str | None = None, transport: str = "unix"
) -> Door | None:
    """The run's door if its network goes through the proxy, else None.
    ``audit_path`` defaults to the XDG state directory's net.jsonl; ``transport``
    "tcp" adds a loopback port for tiers that cannot reach a unix socket."""
    if policy.network.mode != "proxy":
        return None
    if audit_path is None:
        from corral.net.audit import default_path

        audit_path = default_path()
    door = Door(policy, run_id, audit_path, tcp=transport == "tcp")
    door.open()
    return door


class Door:
    def __init__(
        self,
        policy: Policy,
        run_id: str,
        audit_path: str | None,
        workers: int = 0,
        tcp: bool = False,
    ) -> None:
        self.policy = policy
        self.tcp = tcp
        self.tcp_port = 0
        # Several processes accept on the one socket (more CPU for a busy sandbox);
        # transparent mode keeps one, as its stand-in addresses live in memory.
        self.workers = workers or (1 if policy.network.transparent else 2)
        self.run_id = run_id
        self.audit_path = audit_path
        self.dir = _private_dir("corral-door-")
        self.path = os.path.join(self.dir, "door.sock")
        self.pids: list[int] = []
        self.errors = 0  # the proxy's own unexpected exceptions, known after close()
        self.crashes: list[str] = []  # one line per worker that failed outright
        self._life_w = -1
        self._tally_r = -1
        self.ca: CA | None = None  # corral's CA, when this run can intercept TLS
        self.extras: NetExtras | None = None  # what the sandbox gets beside the address

    def open(self) -> None:
        try:
            chain = self._prepare()
        except BaseException:
            self.remove_files()
            raise
        self._start(chain)

    def _prepare(self) -> object:
        """The chain, the hooks' start and, if this run can intercept TLS, its CA
        and bundle: all before forking, so a bad rule or CA fails here."""
        from corral.net.hooks import chain_for
        from corral.net.trust import NetExtras

        chain = chain_for(self.policy)
        chain.open()
        self.extras = NetExtras(env=chain.sandbox_env())
        if chain.may_inspect:
            self.ca = _open_ca(self.policy)
            from corral.net import trust

            found = trust.system_bundles()
            self.extras.ca_bundle = trust.write_bundle(self.dir, self.ca.cert_pem, found)
            self.extras.system_bundles = found
        return chain

    def _start(self, chain: object) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.path)
        sock.listen(1024)
        socks = [sock]
        if self.tcp:
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            tcp.bind(("127.0.0.1", 0))  # a fresh port per run, loopback only
            tcp.listen(1024)
            self.tcp_port = tcp.getsockname()[1]
            socks.append(tcp)
        life_r, life_w = os.pipe()
        tally_r, tally_w = os.pipe()
        for _ in range(self.workers):
            pid = os.fork()
            if pid == 0:  # a proxy process
                code = 0
                try:
                    quiet_stderr()
                    os.close(life_w)
                    os.close(tally_r)
                    if _first_use(socks, life_r, self.ca is not None):
                        _serve(chain, socks, self.run_id, self.audit_path, life_r, tally_w, self)
                    else:
                        self.remove_files()  # the run ended without using the network
                except BaseException as exc:  # the top-level guard: a line, never a traceback
                    code = 1
                    _report_crash(tally_w, exc)
                finally:
                    os._exit(code)
            self.pids.append(pid)
        with open(os.path.join(self.dir, "proxy.pid"), "w", encoding="utf-8") as fh:
            fh.write("".join(f"{pid}\n" for pid in self.pids))  # for operators (and tests)
        for listener in socks:
            listener.close()
        os.close(life_r)
        os.close(tally_w)
        self._life_w, self._tally_r = life_w, tally_r

    @property
    def address(self) -> str:
        """What a tier's plan() takes: the socket's path, or 127.0.0.1:PORT."""
        return f"127.0.0.1:{self.tcp_port}" if self.tcp else self.path

    def close(self) -> dict[str, int]:
        """Stop the proxy; return {"host:port": denied count} and set ``errors``.
        Idempotent."""
        tally: dict[str, int] = {}
        if self._life_w >= 0:
            os.close(self._life_w)
            self._life_w = -1
            data = b""
            while chunk := os.read(self._tally_r, 65536):
                data += chunk
            os.close(self._tally_r)
            self._tally_r = -1
            tally = self._read_tally(data.decode("utf-8", "replace"))
            for pid in self.pids:
                os.waitpid(pid, 0)
        self.remove_files()
        return tally

    def _read_tally(self, text: str) -> dict[str, int]:
        tally: dict[str, int] = {}
        for line in text.splitlines():
            kind, _, rest = line.partition("\t")
            if kind == "deny":
                dest, _, count = rest.rpartition("\t")
                if dest and count.isdigit():
                    tally[dest] = tally.get(dest, 0) + int(count)
            elif kind == "errors" and rest.isdigit():
                self.errors += int(rest)
            elif kind == "crash":
                self.errors += 1
                self.crashes.append(rest)
        return tally

    def remove_files(self) -> None:
        from corral.net.trust import BUNDLE_NAME

        for name in (
            self.path,
            os.path.join(self.dir, "proxy.pid"),
            os.path.join(self.dir, BUNDLE_NAME),
        ):
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass
        try:
            os.rmdir(self.dir)
        except FileNotFoundError:
            pass


def _open_ca(policy: Policy) -> CA:
    """This run's CA (PolicyError naming the key when the user's own cannot be
    used), after checking the ``upstream_ca`` files the workers will load."""
    from corral.errors import PolicyError
    from corral.net.ca import ca_for
    from corral.net.trust import check_upstream_ca
    from corral.runlog import state_dir

    problem = check_upstream_ca(policy.tls.upstream_ca)
    if problem:
        raise PolicyError(problem)
    return ca_for(policy.tls, state_dir())


def _private_dir(prefix: str) -> str:
    """A fresh mode-0700 directory in the temporary area; tempfile costs ~7 ms to
    import on every networked run, and this is all of it that is needed."""
    base = os.environ.get("TMPDIR") or "/tmp"
    if not os.path.isabs(base):
        base = "/tmp"
    for _ in range(100):
        path = os.path.join(base, prefix + os.urandom(6).hex())
        try:
            os.mkdir(path, 0o700)  # fails if it exists: nobody can plant it for us
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"cannot create a private directory in {base}")


def _first_use(socks: list[socket.socket], life_r: int, tls: bool = False) -> bool:
    """Wait until a connection arrives (True) or the run ends (False).

    The proxy's imports (asyncio, uvloop, the proxy itself) take tens of
    milliseconds; they start at once on a thread, overlapping the sandbox's own
    start, but a run that ends without touching the network does not wait for
    them: the worker just exits."""
    import select
    import threading

    warm = threading.Thread(target=_import_proxy, args=(tls,), daemon=True)
    warm.start()
    while True:
        try:
            ready = select.select([*(s.fileno() for s in socks), life_r], [], [])[0]
        except InterruptedError:
            continue
        if life_r in ready:
            return False
        warm.join()
        return True


def _import_proxy(tls: bool = False) -> None:
    try:
        import asyncio  # noqa: F401

        import corral.net.audit
        import corral.net.proxy

        if tls:  # TLS inspection: leaf certificates need cryptography (some 60 ms)
            import cryptography.x509  # noqa: F401

            import corral.net.tls  # noqa: F401
        import uvloop  # type: ignore[import-not-found, unused-ignore]  # noqa: F401
    except Exception:  # the serving path imports again and reports for real
        pass


def _serve(
    chain: object,
    socks: list[socket.socket],
    run_id: str,
    audit_path: str | None,
    life_r: int,
    tally_w: int,
    door: Door,
) -> None:
    import asyncio
    import signal

    from corral.net.audit import Audit, guard_process
    from corral.net.hooks import Chain
    from corral.net.proxy import Proxy

    assert isinstance(chain, Chain)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # corral decides when the proxy stops
    audit = Audit(audit_path)
    guard_process(audit, run_id)

    async def main() -> None:
        tls = None
        if door.ca is not None:
            from corral.net.tls import Interceptor

            tls = Interceptor(door.ca, door.policy.tls.upstream_ca)
        proxy = Proxy(chain, audit, door.policy.network.hosts, tls=tls)
        proxy.guard(run_id)
        # The relay's internal frames only on the unix door, and only for a
        # transparent run: that door is reachable from this run's sandbox alone
        # (its directory is private), and only a transparent relay sends them.
        # The TCP port of the landlock tier, which any local process can reach,
        # never takes them.
        internal = door.policy.network.transparent
        servers = [await proxy.serve_unix(socks[0], run_id, internal)]
        servers += [await proxy.serve_sock(s, run_id) for s in socks[1:]]
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def life_ended() -> None:
            if not done.done():
                done.set_result(None)

        loop.add_reader(life_r, life_ended)
        await done
        for server in servers:
            server.close()

    from corral.net.proxy import run_loop

    try:
        run_loop(main())
    finally:
        door.remove_files()
        report = "".join(f"deny\t{dest}\t{n}\n" for dest, n in audit.denied.items())
        report += f"errors\t{audit.errors}\n"
        try:
            os.write(tally_w, report.encode())
        except OSError:
            pass
        audit.close()


def quiet_stderr() -> None:
    """A proxy worker's stderr is the user's terminal: point it at /dev/null.
    What would have been printed goes to the audit log instead (guard_process)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


def _report_crash(tally_w: int, exc: BaseException) -> None:
    from corral.net.audit import describe

    line = describe("proxy worker", exc).replace("\t", " ")
    try:
        os.write(tally_w, f"crash\t{line}\n".encode("utf-8", "replace"))
    except OSError:
        pass
