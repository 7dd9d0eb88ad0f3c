"""The door: where a run's sandbox meets its proxy, a process forked for it.

How the sandbox reaches the proxy depends on the tier (``transport``):

* "netns" (the namespace tier): corral makes the sandbox's network namespace
  itself and creates its listening sockets in it (:mod:`corral.netns`);
  they are handed to the proxy over ``handoff.sock`` in the door's private
  directory.  The proxy holds the only copies, so if it dies they close and
  every connection inside is refused at once.
* "unix" (the container tiers): a unix socket bound into the sandbox at
  ``/run/corral/door.sock``, reached through corral's relay inside.
* "tcp" (landlock, seatbelt): a fresh loopback port.

The parent (corral) binds the socket *before* forking, so connections wait in
its backlog from the moment the sandbox starts.  One proxy process is forked
when the door opens; it imports the proxy (tens of milliseconds, overlapping
the sandbox's own start), and says ``used`` on the tally pipe when the first
connection or query arrives.  A run that ends before anything
arrived has nothing to report, so :meth:`Door.close` ends its proxy at once
(SIGKILL, reaped later) instead of waiting for imports or an exit it does not
need; otherwise it waits for every worker's tally.  Once ready (and, for
netns, handed its listeners), the first worker forks its siblings, which
share every socket and stop when it does (a pipe between them), so killing
the first worker is killing the proxy.  The siblings wait, idle, until the
first connection or query arrives: a run that never uses its network does
not pay for their servers.

Each worker holds the read end of a "life" pipe: when corral closes it (the
run ended) or dies (the kernel closes it), the worker writes its tally of
denials back, removes the door's files, and exits.  So the door never
outlives the run.

A proxy process never writes to the terminal it inherited (it is the user's):
its stderr is /dev/null, and an unexpected exception becomes one line in the
audit log and a count that :meth:`Door.close` returns to the run record.
The tally pipe carries tab-separated lines: ``used`` once, then ``deny HOST
PORT RULE REASON LOOKUP ADDRESS N`` per denied destination and reason
(:func:`corral.net.audit.tally_lines`), ``errors N`` and, for a worker that
failed outright, ``crash TEXT``.
"""

from __future__ import annotations

import os

try:  # the C module: `signal` itself imports enum (~2 ms on every networked run)
    import _signal as signal  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - other Pythons
    import signal  # type: ignore[no-redef, unused-ignore]

TYPE_CHECKING = False
if TYPE_CHECKING:
    import _socket as socket
    from collections.abc import Callable, Sequence

    from corral.fsplan import Mount
    from corral.net import aio
    from corral.net.approvals import Hub
    from corral.net.audit import Audit, DenyKey
    from corral.net.ca import CA
    from corral.net.hooks import Chain
    from corral.net.proxy import Proxy
    from corral.net.tls import Interceptor
    from corral.net.trust import NetExtras, UpstreamTrust
    from corral.netns import Listener
    from corral.policy import Policy

# Where the door and the relay appear inside a container sandbox (a private tmpfs).
SANDBOX_DOOR = "/run/corral/door.sock"
SANDBOX_RELAY = "/run/corral/relay.py"
HTTP_PORT = 3128
SOCKS_PORT = 1080
SOCKS_ENV = "SOCKS_PROXY"  # the SOCKS5 door's address inside (ALL_PROXY is HTTP: proxy_env)
DNS_PORT = 53
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
SIBLINGS_AFTER = 0.02  # seconds after the first connection the idle siblings start serving
# At the run's end, how long a worker waits for connections still ending (their
# clients are gone) before it stops, cutting off the rest unrecorded.
SETTLE_WITHIN = 1.0
USED = b"used\n"


def relay_script() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "relay.py")


def relay_argv(python: list[str], services: Sequence[tuple[str, int]] = ()) -> list[str]:
    """The relay as the sandbox's first process (``python`` as the sandbox sees it),
    with a resolver and ``services`` (host services at their own address); the
    command follows after ``--``."""
    argv = [
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
        "--dns",
        str(DNS_PORT),
    ]
    for host, port in services:
        argv += ["--service", f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    return argv


def door_mounts(door: str) -> list[Mount]:
    """Binds a mount-namespace tier adds: the door's socket and the relay script."""
    from corral.fsplan import Mount

    return [
        Mount("ro-bind", SANDBOX_DOOR, door, "the one way out: corral's proxy"),
        Mount("ro-bind", SANDBOX_RELAY, relay_script(), "relay to the door"),
    ]


def proxy_env(
    http_port: int = HTTP_PORT, socks_port: int = SOCKS_PORT, through_proxy: tuple[str, ...] = ()
) -> dict[str, str]:
    """What tools read to find a proxy: the sandbox's own proxy ports, or the door's
    TCP port (one port speaks both HTTP and SOCKS5).  ``NO_PROXY`` keeps loopback
    local, except the hosts in ``through_proxy`` (allowed host services that
    are reached only through the proxy, as on the landlock tier).

    ``ALL_PROXY`` names the HTTP proxy too: httpx (under the openai and
    anthropic SDKs) builds a transport for every proxy variable when a client
    is made, and a ``socks5h://`` one fails there without the optional
    ``socksio`` package.  The SOCKS5 door is ``SOCKS_PROXY``, for tools
    pointed at it by hand (``curl -x "$SOCKS_PROXY"``)."""
    http = f"http://127.0.0.1:{http_port}"
    env = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = http
    env[SOCKS_ENV] = f"socks5h://127.0.0.1:{socks_port}"
    local = ",".join(h for h in LOOPBACK_NAMES if h not in through_proxy)
    env["NO_PROXY"] = env["no_proxy"] = local
    for name in (
        "npm_config_proxy",
        "npm_config_https_proxy",
        "YARN_HTTP_PROXY",
        "YARN_HTTPS_PROXY",
    ):  # (not PIP_PROXY: pip's --proxy overrides NO_PROXY, and loopback went to the proxy)
        env[name] = http
    return env


def _out_of_bounds(policy: Policy) -> tuple[str, ...]:
    """Where a CA bundle the caller's variables name is not read from: what the
    sandbox can write (it could have linked or filled it), what the policy keeps
    unreadable, and corral's own state and cache (trust.write_bundle)."""
    from corral import runlog

    places = [*policy.writable_paths(), *policy.read_deny_paths()]
    places += [runlog.state_dir(), runlog.cache_dir()]
    return tuple(os.path.realpath(p.rstrip("/") or "/") for p in places)


def may_ask(policy: Policy) -> bool:
    """Can this policy's rules hold a request for a person's answer?  A rule type
    whose hooks can ask adds its policy key here (see :mod:`corral.net.approvals`)."""
    if any(entry.get("action") == "ask" for entry in policy.network.rules):
        return True
    guard = policy.guardrails
    if not guard.dirs:
        return False
    if guard.files is None:  # not read yet (check_guardrails): it may ask
        return True
    return any(g.enforcing and g.effective_action(guard.tiers) == "ask" for g in guard.files)


def open_door(
    policy: Policy,
    run_id: str,
    audit_path: str | None = None,
    transport: str = "unix",
    answerer: bool = False,
    start: bool = True,
) -> Door | None:
    """The run's door if its network goes through the proxy, else None.
    ``audit_path`` defaults to the XDG state directory's net.jsonl; ``transport``:
    "netns", "unix" or "tcp" (see the module's docstring); ``answerer``: the
    caller answers asks itself over :attr:`Door.ask_sock` (a terminal prompt,
    an ``on_ask`` function), besides the control socket; ``start``: fork its
    proxy now (else :meth:`Door.start`)."""
    if policy.network.mode != "proxy":
        return None
    if audit_path is None:
        # not corral.net.audit.default_path: importing the audit (json) costs the
        # launcher milliseconds; the proxy imports it off the critical path
        from corral.runlog import state_dir

        audit_path = os.path.join(state_dir(), "net.jsonl")
    door = Door(policy, run_id, audit_path, transport=transport, answerer=answerer)
    door.open(start)
    return door


class Door:
    def __init__(
        self,
        policy: Policy,
        run_id: str,
        audit_path: str | None,
        workers: int = 0,
        transport: str = "unix",
        answerer: bool = False,
    ) -> None:
        if transport not in ("netns", "unix", "tcp"):
            raise ValueError(f"unknown door transport {transport!r}")
        self.policy = policy
        self.transport = transport
        self.tcp_port = 0
        # Asks: the held requests and grants of a run live in its proxy's memory
        # (corral.net.approvals), reached through the control socket.
        self.asks = may_ask(policy)
        self.answerer = answerer and self.asks
        self.control_dir = ""  # where the run's control socket is, when it may ask
        self.ask_sock: socket.socket | None = None  # the local answerer's end
        self._hub_sock: socket.socket | None = None  # the proxy's end
        # Several processes accept on the same sockets (more CPU for a busy sandbox);
        # transparent mode and asks keep one, as their state lives in memory.
        self.workers = workers or (1 if policy.network.transparent or self.asks else 2)
        self.run_id = run_id
        self.audit_path = audit_path
        self.dir = _private_dir("corral-door-")
        name = "handoff.sock" if transport == "netns" else "door.sock"
        self.path = os.path.join(self.dir, name)
        self.pids: list[int] = []
        self.errors = 0  # the proxy's own unexpected exceptions, known after close()
        self.crashes: list[str] = []  # one line per worker that failed outright
        self._looked: dict[str, str] = {}  # the workers' usage lines (audit.usage_lines)
        self._asked: set[str] = set()
        self._life_r = self._life_w = -1  # the proxy watches for its end: the run's
        self._tally_r = self._tally_w = -1  # the proxy's report, read by close()
        self._started = False
        # what sandbox_ended() found of a proxy that was used: its workers' pids and
        # what its tally pipe held then (close reads the rest)
        self._ending: tuple[list[int], bytes] | None = None
        self._fds: list[int] = []  # bound, not yet handed to a proxy
        self.ca: CA | None = None  # corral's CA, when this run can intercept TLS
        self.trust: UpstreamTrust | None = None  # ... and what it trusts upstream
        self.extras: NetExtras | None = None  # what the sandbox gets beside the address
        self.chain: Chain | None = None  # built (and its hooks opened) here, when they act here

    def open(self, start: bool = True) -> None:
        """Prepare the door and bind its socket; then (``start``) fork its proxy.
        A caller that still has planning to do starts it later (:meth:`start`):
        every page corral's process writes after the fork is copied, so the later
        the fork, the less of the run pays for it."""
        if _hooks_act_here(self.policy):
            try:
                self._prepare()
            except BaseException:
                self.remove_files()
                raise
        if self.asks:
            self._prepare_asks()
        self._fds = self._bind()
        # made now, so that whoever forks the proxy (corral or its guardian) has them
        self._life_r, self._life_w = os.pipe()
        self._tally_r, self._tally_w = os.pipe()
        if start:
            self.start()

    def start(self) -> None:
        """Fork the proxy (once); connections wait in the socket's backlog till then."""
        self.fork()
        self.forked()

    def fork(self) -> None:
        """Fork the proxy, in corral's process or in the run's guardian (see
        corral.launch.Companion).  Each worker writes its pid to proxy.pid (the
        first worker first), which :meth:`close` reads.  A fork that fails
        leaves a crash line for :meth:`close`."""
        if not self._fds:
            return
        try:
            pid = os.fork()
        except OSError as exc:
            _report_crash(self._tally_w, exc)
            return
        if pid == 0:  # the proxy
            code = 0
            try:
                _note_pids(self.dir, [os.getpid()])
                if self.ask_sock is not None:
                    self.ask_sock.close()  # the answerer's end: its EOF must reach us
                hub = [self._hub_sock.fileno()] if self._hub_sock is not None else []
                _close_inherited({*self._fds, self._life_r, self._tally_w, *hub})
                _worker(self, self._fds, self._life_r, self._tally_w)
            except BaseException as exc:  # the top-level guard: a line, never a traceback
                code = 1
                _report_crash(self._tally_w, exc)
            finally:
                _let_go(self._tally_w)
                self.remove_files()  # whatever happened (corral killed early too)
                os._exit(code)
        self.pids.append(pid)  # of use in corral's process; the guardian's copy goes

    def forked(self) -> None:
        """In corral's process, once :meth:`fork` ran (here or in the guardian):
        drop what only the proxy holds, so its end reaches us as end of file."""
        if not self._fds:
            return
        for fd in (*self._fds, self._life_r, self._tally_w):
            os.close(fd)
        self._fds = []
        self._life_r = self._tally_w = -1
        if self._hub_sock is not None:
            self._hub_sock.close()
            self._hub_sock = None
        self._started = True

    def _prepare_asks(self) -> None:
        """The control directory (checked: this user's alone) and, for a local
        answerer, its socket pair to the proxy."""
        from corral.errors import RefusedError
        from corral.net.asking import control_dir

        try:
            self.control_dir = control_dir(create=True)
        except OSError as exc:
            self.remove_files()
            reason = exc.strerror if exc.strerror else str(exc)
            raise RefusedError(
                f"approvals: {reason} (set CORRAL_CONTROL_DIR to a directory of your own)"
            ) from None
        if self.answerer:
            import socket

            self.ask_sock, self._hub_sock = socket.socketpair()

    def _prepare(self) -> None:
        """The hooks' start and, if this run can intercept TLS, its CA and bundle:
        in corral's process, before the proxy forks, so a bad CA or a missing
        secret refuses the run with one line (the workers build their own chain)."""
        from corral.net.hooks import chain_for
        from corral.net.trust import NetExtras

        chain = self.chain = chain_for(self.policy)
        chain.open()  # the workers get this chain, opened, by fork
        self.extras = NetExtras(env=chain.sandbox_env())
        if chain.may_inspect:
            self.ca, self.trust = _open_ca(self.policy)
            from corral.net import trust

            found = trust.system_bundles()
            named = tuple(dict.fromkeys(trust.bundle_variables(os.environ).values()))
            bundle = trust.write_bundle(
                self.dir, self.ca.cert_pem, found, named, _out_of_bounds(self.policy)
            )
            self.extras.ca_bundle = bundle
            self.extras.system_bundles = found

    def _bind(self) -> list[int]:
        """The listening sockets the proxy inherits, as bare descriptors (made with
        the C module: `socket` costs milliseconds)."""
        import _socket

        if self.transport == "netns":
            handoff = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
            handoff.bind(self.path)
            handoff.listen(4)
            return [handoff.detach()]
        if self.transport == "tcp":
            tcp = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
            tcp.bind(("127.0.0.1", 0))  # a fresh port per run, loopback only
            tcp.listen(1024)
            self.tcp_port = tcp.getsockname()[1]
            return [tcp.detach()]
        unix = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        unix.bind(self.path)
        unix.listen(1024)
        return [unix.detach()]

    @property
    def address(self) -> str:
        """What a tier's plan() takes: 127.0.0.1:PORT (tcp), else the socket's path
        (the door, or for netns the handoff socket the launcher hands listeners to)."""
        return f"127.0.0.1:{self.tcp_port}" if self.transport == "tcp" else self.path

    def sandbox_ended(self) -> None:
        """The run's sandbox is gone: let the proxy begin to stop while corral
        cleans up (its tally is read by :meth:`close`).  A proxy that was used
        is told by the end of its life pipe and finishes its audit lines; one
        that never was is killed first, so none of its workers wakes for nothing
        (measured: 0.45 ms of corral's own on this 2-core host)."""
        if self._life_w < 0:
            return
        self._ending = (self._proxy_pids(), _read_now(self._tally_r)) if self._started else None
        if self._ending is not None and not (USED in self._ending[1] or _ended(self._ending[1])):
            for pid in self._ending[0]:
                _abandon(pid)  # nothing arrived, so nothing was decided: no tally to wait for
            self._ending = None
        os.close(self._life_w)
        self._life_w = -1

    def close(self) -> list[dict[str, object]]:
        """Stop the proxy; return what it denied, one dict per destination and reason
        (host, port, rule, reason, lookup, address, count), and set ``errors``.
        Idempotent: a second call returns nothing."""
        tally: dict[DenyKey, int] = {}
        for fd in (*self._fds, self._life_r, self._tally_w):  # never started
            if fd >= 0:
                os.close(fd)
        self._fds = []
        self._life_r = self._tally_w = -1
        self.sandbox_ended()  # (if the run did not say so already)
        if self._ending is not None:
            pids, data = self._ending
            self._ending = None
            while chunk := os.read(self._tally_r, 65536):
                data += chunk  # end of file: every worker has let go of it
            tally = self._read_tally(data.decode("utf-8", "replace"))
            _reap(pids)
        if self._tally_r >= 0:
            os.close(self._tally_r)
            self._tally_r = -1
        self.remove_files()
        if self.ask_sock is not None:
            import socket

            try:  # wakes an answerer's thread blocked on it
                self.ask_sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.ask_sock.close()
            self.ask_sock = None
        unproxied = [h for h in self._looked if h not in self._asked]
        if not tally and not unproxied:
            return []
        from corral.net.audit import denial_entries, unproxied_entries

        return denial_entries(tally) + unproxied_entries(self._looked, self._asked)

    def forget_grants(self) -> None:
        """Drop the grants of this run's asks (a reset between jobs).  A proxy
        that is gone holds none (and the sandbox has no network); one that does
        not answer raises OSError, one that refuses RuntimeError."""
        if not self.control_dir or not self._started:
            return
        from corral.net.asking import forget_grants

        try:
            forget_grants(self.control_dir, self.run_id)
        except (FileNotFoundError, ConnectionRefusedError):
            pass

    def _proxy_pids(self) -> list[int]:
        """The workers' pids, the first worker's first: proxy.pid, written by
        whichever process forked each (corral, its guardian, the first worker)."""
        try:
            with open(os.path.join(self.dir, "proxy.pid"), encoding="utf-8") as fh:
                found = [int(p) for p in fh.read().split() if p.isdigit()]
        except OSError:
            found = []
        return found or self.pids

    def _read_tally(self, text: str) -> dict[DenyKey, int]:
        from corral.net.audit import read_tally_line

        tally: dict[DenyKey, int] = {}
        for line in text.splitlines():
            kind, _, rest = line.partition("\t")
            if kind == "deny":
                parsed = read_tally_line(rest)
                if parsed is not None:  # every worker tallies its own: add them up
                    key, count = parsed
                    tally[key] = tally.get(key, 0) + count
            elif kind == "errors" and rest.isdigit():
                self.errors += int(rest)
            elif kind == "crash":
                self.errors += 1
                self.crashes.append(rest)
            elif kind == "looked":
                name, _, address = rest.partition("\t")
                self._looked.setdefault(name, address)
            elif kind == "asked":
                self._asked.add(rest)
        return tally

    def remove_files(self) -> None:
        """The door's private directory and what it holds (sockets, pid file,
        trust bundle), and the run's control socket."""
        try:
            names = [os.path.join(self.dir, name) for name in os.listdir(self.dir)]
        except FileNotFoundError:
            names = []
        if self.control_dir:  # the proxy removes it too, unless it was killed
            names.append(os.path.join(self.control_dir, f"{self.run_id}.sock"))
        for name in names:
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass
        try:
            os.rmdir(self.dir)
        except FileNotFoundError:
            pass


def _close_inherited(keep: set[int]) -> None:
    """In a new proxy: close what corral's process held besides ``keep`` and the
    standard streams (the guardian's pipe, the sandbox's cgroup files...): a
    proxy holding a pipe would keep its reader waiting for an end of file."""
    try:
        found = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in found:
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


_UNREAPED: list[int] = []  # ended workers not yet waited for (reaped on the next close)


def _note_pids(directory: str, pids: list[int]) -> None:
    """Add worker pids to the door's proxy.pid (for close(), operators and tests)."""
    try:
        with open(os.path.join(directory, "proxy.pid"), "a", encoding="utf-8") as fh:
            fh.write("".join(f"{pid}\n" for pid in pids))
    except OSError:
        pass


def _reap(pids: list[int]) -> None:
    """Wait for those of ``pids`` that are our children (a proxy the guardian
    forked is the guardian's: its end of the tally pipe is all we wait for)."""
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _abandon(pid: int) -> None:
    """SIGKILL a worker and reap it later (it, and any it forked, stop with it)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    _UNREAPED.append(pid)
    for old in list(_UNREAPED):
        try:
            done, _ = os.waitpid(old, os.WNOHANG)
        except ChildProcessError:
            done = old
        if done:
            _UNREAPED.remove(old)


def _read_now(fd: int) -> bytes:
    """What the pipe holds now, without waiting."""
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
    except BlockingIOError:
        pass
    os.set_blocking(fd, True)
    return data


def _ended(data: bytes) -> bool:
    """The worker already failed outright (its crash line is in)."""
    return b"crash\t" in data


def _hooks_act_here(policy: Policy) -> bool:
    """Does this policy have hooks that act in corral's own process (TLS
    interception's CA and bundle, a secret's source)?  Host rules alone do not:
    their chain is built in the proxy, off the run's path.  A policy key whose
    hooks need :meth:`corral.net.hooks.Hook.open` or ``sandbox_env`` adds itself here."""
    return bool(
        policy.tls.inspect or policy.secrets or policy.network.rules or policy.guardrails.dirs
    )


def _open_ca(policy: Policy) -> tuple[CA, UpstreamTrust]:
    """This run's CA (PolicyError naming the key when the user's own cannot be
    used), and what its workers trust upstream, read now (corral.net.trust)."""
    from corral.net.ca import ca_for
    from corral.net.trust import upstream_trust
    from corral.runlog import state_dir

    trust = upstream_trust(policy.tls.upstream_ca, out_of_bounds=_out_of_bounds(policy))
    return ca_for(policy.tls, state_dir()), trust


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


# -- the proxy process ------------------------------------------------------------------------


def _worker(door: Door, fds: list[int], life_r: int, tally_w: int) -> None:
    """The first proxy worker: fork the spare workers, import, take the
    listeners, serve until the run ends (waking the spares on first use)."""
    spares = _Spares(door, fds, life_r, tally_w)  # first: while our pages are corral's
    try:
        listeners = _become_proxy(door, fds[0], life_r)
        if listeners is None:  # the run ended before its sandbox started
            door.remove_files()
            return
        chain = door.chain or _chain(door)
        _serve(door, chain, listeners, [life_r], tally_w, lambda: spares.wake(listeners))
    finally:
        spares.stop()


def _become_proxy(
    door: Door, first_fd: int, life_r: int
) -> list[tuple[Listener, socket.socket]] | None:
    """A forked process's setup as a proxy worker; then its listeners (the
    handoff's, for netns; None if the run ended first)."""
    _settle(door.ca is not None)
    import _socket

    first = _socket.socket(fileno=first_fd)
    if door.transport != "netns":
        from corral.netns import Listener

        return [(Listener("door", door.transport, 0), first)]
    got = _await_handoff(first, life_r)
    # One handoff per door: with the listening socket closed, nobody else can
    # hand listeners over.  The path stays until the run ends: the sandbox's
    # plan may already cover it (a host socket outside its private /tmp).
    first.close()
    return got


def _settle(tls: bool = False) -> None:
    """What every worker does first: its own collector, quiet stderr, signals
    left to corral, and the proxy's imports."""
    import gc

    # `corral run` turns the collector off for itself; a proxy lives as long as its
    # run, so it collects.  What was inherited is frozen first: never scanned, so
    # its pages are not copied on write and each pass stays short.
    gc.freeze()
    gc.enable()
    quiet_stderr()
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # corral decides when the proxy stops
    _warm(tls)
    from corral.net.rehearsal import rehearse

    rehearse()  # the first request's page copies and cold code, paid while idle


def _chain(door: Door) -> Chain:
    from corral.net.hooks import chain_for

    return chain_for(door.policy)


class _Spares:
    """Workers beyond the first (``door.workers - 1``), forked before the first
    worker does anything: they share only corral's pages, import nothing, and
    wait until the first connection or query arrives (a run that never uses its
    network pays for the forks alone).  Woken, each gets the listeners over a
    socket pair (SCM_RIGHTS, as the handoff) and serves them too.  Each also
    watches a pipe from the first worker: killing the first worker stops them all."""

    def __init__(self, door: Door, fds: list[int], life_r: int, tally_w: int) -> None:
        self.pids: list[int] = []
        self.channels: list[socket.socket] = []
        self.alive_w = -1
        if door.workers < 2:
            return
        import _socket

        alive_r, self.alive_w = os.pipe()
        for _ in range(door.workers - 1):
            ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
            pid = os.fork()
            if pid == 0:
                ours.close()
                os.close(self.alive_w)
                _spare(door, fds, theirs, [life_r, alive_r], tally_w)  # never returns
            theirs.close()
            self.pids.append(pid)
            self.channels.append(ours)
        os.close(alive_r)
        _note_pids(door.dir, self.pids)

    def wake(self, listeners: list[tuple[Listener, socket.socket]]) -> None:
        from corral.netns import send_listeners

        ended = any(sock.fileno() < 0 for _, sock in listeners)  # closed: the run is over
        for channel in self.channels:
            try:
                if not ended:  # an ended run's spares see their channel close, and stop
                    send_listeners(channel, listeners)
            except OSError:
                pass  # that spare is gone already (the run ended first): nothing to wake
            channel.close()
        self.channels = []

    def stop(self) -> None:
        for channel in self.channels:
            channel.close()
        if self.alive_w >= 0:
            os.close(self.alive_w)  # they stop too
        for pid in self.pids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def _spare(
    door: Door, fds: list[int], channel: socket.socket, stop_on: list[int], tally_w: int
) -> None:
    """A spare worker: wait to be woken with the listeners, then serve them."""
    code = 0
    try:
        for fd in fds:  # the first worker's: the handoff (netns) or the door itself
            os.close(fd)
        listeners = _woken(channel, stop_on)
        channel.close()
        if listeners:
            _settle(door.ca is not None)
            _serve(door, door.chain or _chain(door), listeners, stop_on, tally_w)
    except BaseException as exc:
        code = 1
        _report_crash(tally_w, exc)
    finally:
        _let_go(tally_w)
        os._exit(code)


def _woken(
    channel: socket.socket, stop_on: list[int]
) -> list[tuple[Listener, socket.socket]] | None:
    """The listeners the first worker sends, or None when a ``stop_on`` pipe
    ends (or the first worker goes) first."""
    import select

    from corral.netns import read_listeners

    while True:
        try:
            ready = select.select([channel.fileno(), *stop_on], [], [])[0]
        except InterruptedError:
            continue
        if channel.fileno() not in ready:
            return None
        try:
            return read_listeners(channel) or None
        except (OSError, ValueError):
            return None


def _warm(tls: bool = False) -> None:
    """The proxy's imports, done at once (a millisecond or two: corral.net.aio, not
    asyncio, so the proxy is ready before the sandbox's command starts)."""
    import corral.net.audit
    import corral.net.proxy

    if tls:  # TLS inspection: leaf certificates need cryptography (some 60 ms)
        import cryptography.x509  # noqa: F401

        import corral.net.aiotls
        import corral.net.tls  # noqa: F401


def _warm_guard() -> None:
    """The rebinding guard's tables (ipaddress, some milliseconds to import): loaded
    while the proxy is idle, before a name's first resolved address needs them."""
    import ipaddress  # noqa: F401


def _await_handoff(
    handoff: socket.socket, life_r: int
) -> list[tuple[Listener, socket.socket]] | None:
    """The listeners the launcher's child made in the sandbox's namespace, or None
    if the run ended first."""
    import select

    from corral.netns import receive

    while True:
        try:
            ready = select.select([handoff.fileno(), life_r], [], [])[0]
        except InterruptedError:
            continue
        if life_r in ready:
            return None
        return receive(handoff)


def _serve(
    door: Door,
    chain: Chain,
    listeners: list[tuple[Listener, socket.socket]],
    stop_on: list[int],
    tally_w: int,
    on_first_use: Callable[[], None] | None = None,
) -> None:
    """Serve ``listeners`` until any of ``stop_on`` (pipes) ends; ``on_first_use``
    is called after the first connection or query is taken."""
    from corral.net import aio
    from corral.net.audit import Audit, guard_process
    from corral.net.proxy import Proxy, run_loop
    from corral.net.rehearsal import ask_once

    run_id = door.run_id
    audit = Audit(door.audit_path)
    guard_process(audit, run_id)
    ask_once(chain)

    async def main() -> None:
        loop = aio.get_running_loop()
        net = door.policy.network
        tls, hub = await _interceptor_and_hub(door, audit)
        proxy = Proxy(chain, audit, net.hosts, stand_ins=net.transparent, tls=tls, asker=hub)
        proxy.guard(run_id)

        later: list[aio.Handle] = []

        def first_use() -> None:
            _say(tally_w, USED)  # corral waits for this run's tally
            if on_first_use is not None:  # once the first request is served: not on its way
                later.append(loop.call_later(SIBLINGS_AFTER, on_first_use))
            later.append(loop.call_later(SIBLINGS_AFTER, _warm_guard))

        proxy.on_first_use = first_use
        proxy.live = lambda: not _ended_now(stop_on)
        servers = [await _serve_one(proxy, run_id, lis, sock) for lis, sock in listeners]
        done = loop.create_future()

        def ended() -> None:
            if not done.done():
                done.set_result(None)

        for fd in stop_on:
            loop.add_reader(fd, ended)
        await done
        for handle in later:  # a run that ended within SIBLINGS_AFTER wakes no spare
            handle.cancel()
        for server in servers:
            server.close()
        await proxy.settle(SETTLE_WITHIN)  # the last connections' audit lines
        if hub is not None:
            hub.close()

    try:
        run_loop(main())
    finally:
        from corral.net.audit import tally_lines, usage_lines

        report = tally_lines(audit.denied) + usage_lines(audit) + f"errors\t{audit.errors}\n"
        try:
            os.write(tally_w, report.encode())
        except OSError:
            pass
        audit.close()  # every line written before corral returns (corral log --net)
        _let_go(tally_w)
        door.remove_files()


async def _interceptor_and_hub(door: Door, audit: Audit) -> tuple[Interceptor | None, Hub | None]:
    """A worker's TLS interception (when the run's CA is open) and its approvals
    hub (when the rules can ask), each serving already."""
    tls = None
    if door.ca is not None:
        from corral.net.tls import Interceptor

        assert door.trust is not None  # (read with the CA)
        tls = Interceptor(door.ca, door.trust)
    hub = None
    if door.asks:
        from corral.net.approvals import Hub

        hub = Hub(audit, door.run_id, door.policy.network.ask_timeout)
        await hub.serve_control(door.control_dir)
        if door._hub_sock is not None:
            await hub.attach_local(door._hub_sock)
    return tls, hub


async def _serve_one(
    proxy: Proxy, run_id: str, listener: Listener, sock: socket.socket
) -> aio.Server | aio.BaseTransport:
    """Start serving one socket as its kind says; returns what close() stops."""
    kind = listener.kind
    if kind == "door":  # the relay's unix door (its frames too), or landlock's TCP port
        if listener.host == "unix":
            return await proxy.serve_unix(sock, run_id)
        return await proxy.serve_tcp_door(sock, run_id)
    if kind == "proxy":
        return await proxy.serve_sock(sock, run_id)
    if kind == "service":
        return await proxy.serve_service(sock, run_id, listener.host, listener.port)
    if kind == "dns":
        return await proxy.serve_dns(sock, run_id)
    if kind == "capture":
        return await proxy.serve_capture(sock, run_id)
    sock.close()  # nothing this proxy knows: never served
    raise ValueError(f"unknown listener kind {kind!r}")


def _ended_now(pipes: list[int]) -> bool:
    """Has any of ``pipes`` ended (corral closed the run's life pipe, or the first
    worker died)?  Asked per connection, so none is served after that, even in
    the loop turn that also carries the news."""
    import select

    poller = select.poll()
    for fd in pipes:
        poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _say(tally_w: int, line: bytes) -> None:
    try:
        os.write(tally_w, line)
    except OSError:
        pass


def quiet_stderr() -> None:
    """A proxy worker's stderr is the user's terminal: point it at /dev/null.
    What would have been printed goes to the audit log instead (guard_process)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


def _let_go(tally_w: int) -> None:
    """Close this worker's end of the tally pipe now: corral reads it to its end,
    which an exit would bring only after freeing the process's memory (~1 ms
    here).  /dev/null takes its number, so a line written later (a crash) goes
    nowhere rather than into a file opened since."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return  # (the exit closes it)
    os.dup2(null, tally_w)
    os.close(null)


def _report_crash(tally_w: int, exc: BaseException) -> None:
    from corral.net.audit import describe

    line = describe("proxy worker", exc).replace("\t", " ")
    try:
        os.write(tally_w, f"crash\t{line}\n".encode("utf-8", "replace"))
    except OSError:
        pass
