"""The sandbox's network namespace, made by corral itself (the namespace tier).

With a network, the launcher's child creates a new network namespace before
bubblewrap starts (as root: a network namespace; otherwise a user namespace
mapping only the caller's own uid and gid, and a network namespace owned by
it), brings its loopback up and creates the sandbox's listening sockets in it:

* ``127.0.0.1:3128`` and ``127.0.0.1:1080`` (and ``[::1]``): the proxy, HTTP and
  SOCKS5 on either port (it tells them apart by the first byte);
* ``127.0.0.1:53`` and ``[::1]:53`` (UDP): a resolver answering from the policy;
  ``/etc/resolv.conf`` inside names it;
* one listener per allowed host service at its own address and port (an allow
  rule naming one loopback address and a port, e.g. ``127.0.0.1:8080``);
* in transparent mode, the capture port nftables redirects every outgoing TCP
  connection to.

The sockets are handed to the proxy over a unix socket in the door's private
directory (SCM_RIGHTS) and closed here: the proxy holds the only copies, so if
it dies they close with it and every connection is refused at once.  A
listening socket keeps the namespace it was made in, so the proxy accepts
from the host side with no process inside.  bubblewrap then runs without
``--unshare-net`` and its own user namespace nests inside ours: the sandbox has
no capability over this namespace (it cannot bring loopback down, add an
address or change the rules).  The namespace lives as long as the sandbox's
processes and the proxy's sockets; nothing to clean up.

:func:`plan_for` is pure (the plan's part); :func:`enter` runs in the launcher's
child; :func:`receive` in the proxy.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import _socket
    import types
    from collections.abc import Callable, Collection

    from corral.policy import Policy

HTTP_PORT = 3128
SOCKS_PORT = 1080
DNS_PORT = 53
CAPTURE_PORT = 15001
LOOPBACKS = ("127.0.0.1", "::1")
# A port range in an allow rule becomes one listener per port, up to this many in all.
MAX_SERVICE_PORTS = 64
MAX_LISTENERS = 250  # below SCM_MAX_FD (253): one message carries them all
RESOLV_CONF = "resolv.conf"  # beside this file: "nameserver 127.0.0.1"

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
RTM_NEWLINK = 16
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
IFF_UP = 0x1


class Listener:
    """One socket the sandbox's namespace gets.  ``kind``: "proxy" (HTTP and
    SOCKS5), "service" (a host service at its own address), "dns" (UDP) or
    "capture" (transparent mode's redirected connections)."""

    __slots__ = ("host", "kind", "port")

    def __init__(self, kind: str, host: str, port: int) -> None:
        self.kind = kind
        self.host = host
        self.port = port

    @property
    def datagram(self) -> bool:
        return self.kind == "dns"

    def __str__(self) -> str:
        where = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.kind} {where}:{self.port}{'/udp' if self.datagram else ''}"

    def __repr__(self) -> str:
        return f"Listener({self.kind!r}, {self.host!r}, {self.port})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Listener) and (self.kind, self.host, self.port) == (
            other.kind,
            other.host,
            other.port,
        )

    def __hash__(self) -> int:
        return hash((self.kind, self.host, self.port))


class NetPlan:
    """What the launcher sets up: the listeners, where to hand them over (the
    door's handoff socket; None: the launcher keeps them, a run without a
    network) and, in transparent mode, the nftables rules."""

    __slots__ = ("handoff", "listeners", "rules")

    def __init__(
        self, handoff: str | None, listeners: list[Listener], rules: str | None = None
    ) -> None:
        self.handoff = handoff
        self.listeners = listeners
        self.rules = rules

    def describe(self) -> list[str]:
        held = "the proxy" if self.handoff else "corral, refusing and recording every lookup"
        lines = [f"network namespace (made by corral; its sockets are held by {held}):"]
        lines += [f"  {listener}" for listener in self.listeners]
        if self.rules is not None:
            lines.append("  nftables: every TCP connection to capture, every DNS query to dns")
        return lines


def loopback_services(allow: list[str], deny: list[str]) -> tuple[list[tuple[str, int]], list[str]]:
    """The host services the sandbox reaches at their own address: every (address,
    port) an allow rule names with one loopback address and a port (or a small
    range) that the rules as a whole allow.  Also notes for loopback rules that
    cannot be served so, for the user to act on.  Pure."""
    from corral.net.rules import HostRules

    rules = HostRules.parse(allow, deny)
    reserved = {(h, p) for h in LOOPBACKS for p in (HTTP_PORT, SOCKS_PORT)}
    found: list[tuple[str, int]] = []
    notes: list[str] = []
    for rule in rules.allow:
        net = rule.network
        if net is None or not net.network_address.is_loopback:
            continue
        if net.num_addresses != 1 or rule.ports is None:
            notes.append(
                f"network rule {rule.text}: host services are reached at their own address "
                "only for one loopback address with a port (e.g. 127.0.0.1:8080); "
                "otherwise only through the proxy"
            )
            continue
        host = str(net.network_address)
        low, high = rule.ports
        if len(found) + high - low + 1 > MAX_SERVICE_PORTS:
            notes.append(
                f"network rule {rule.text}: more than {MAX_SERVICE_PORTS} host ports in all; "
                "these are reached only through the proxy"
            )
            continue
        for port in range(low, high + 1):
            if (host, port) in reserved:
                notes.append(
                    f"network rule {rule.text}: {host}:{port} is the sandbox's own proxy port; "
                    "that host service is reached only through the proxy"
                )
            elif (host, port) not in found and rules.check(host, port).allowed:
                found.append((host, port))
    return found, notes


_LOOPBACK_SPELLINGS = (("127.0.0.1", "127.0.0.1"), ("localhost", "127.0.0.1"), ("[::1]", "[::1]"))


def host_loopback_args(
    command: list[str], served: Callable[[str, int], bool], allowed: Callable[[str], bool]
) -> list[str]:
    """The host services the command names on loopback (``--index-url
    http://127.0.0.1:8765/simple``) that the sandbox will not reach: it has a
    loopback of its own.  Only those ``served`` on the host (address, port) and
    not ``allowed`` (the flag's text): for each, a note with the --allow that
    reaches it (found by trying corral as a new user: pip retried five times
    against the sandbox's own loopback, and nothing said why).  Pure."""
    notes: list[str] = []
    for arg in command:
        for spelled, address in _LOOPBACK_SPELLINGS:
            at = arg.find(spelled + ":")
            if at < 0 or (at and arg[at - 1] not in "/=@ "):
                continue
            digits = ""
            for char in arg[at + len(spelled) + 1 :]:
                if not char.isdigit():
                    break
                digits += char
            if not digits or int(digits) > 65535:
                continue
            flag = f"{address}:{int(digits)}"
            note = (
                f"{spelled}:{digits}: the sandbox has a loopback of its own; --allow {flag} "
                "reaches the service on the host"
            )
            if served(address.strip("[]"), int(digits)) and not allowed(flag) and note not in notes:
                notes.append(note)
    return notes


def listening(address: str, port: int) -> bool:
    """Does a host process listen on TCP ``address``:``port``?  (A connect that is
    refused says no; the host fact behind :func:`host_loopback_args`.)"""
    import _socket

    family = _socket.AF_INET6 if ":" in address else _socket.AF_INET
    sock = _socket.socket(family, _socket.SOCK_STREAM)
    sock.settimeout(0.2)
    try:
        return sock.connect_ex((address, port)) == 0
    except OSError:
        return False
    finally:
        sock.close()


def plan_for(policy: Policy, handoff: str) -> tuple[NetPlan, list[str]]:
    """The namespace a networked run gets, and notes for the user.  Pure."""
    net = policy.network
    listeners = [Listener("proxy", h, p) for p in (HTTP_PORT, SOCKS_PORT) for h in LOOPBACKS]
    listeners += [Listener("dns", h, DNS_PORT) for h in LOOPBACKS]
    services, notes = loopback_services(net.allow, net.deny)
    listeners += [Listener("service", h, p) for h, p in services]
    rules = None
    if net.transparent:
        from corral.net import transparent

        listeners += [Listener("capture", h, CAPTURE_PORT) for h in LOOPBACKS]
        rules = transparent.ruleset(CAPTURE_PORT, DNS_PORT)
    return NetPlan(handoff, listeners, rules), notes


def offline_plan() -> NetPlan:
    """A run without a network: loopback only, and a resolver the launcher itself
    serves, so the names a command tried to look up can be reported.  Pure."""
    return NetPlan(None, [Listener("dns", h, DNS_PORT) for h in LOOPBACKS])


def resolv_conf() -> str:
    """The file bound over the sandbox's /etc/resolv.conf."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), RESOLV_CONF)


def resolv_target(host: tuple[str, bool] | None, private: Collection[str]) -> str | None:
    """Where to bind :func:`resolv_conf`: over the host's ``/etc/resolv.conf``
    (``host``: its path with symlinks resolved, and whether that file exists).
    A symlink is followed to its target, which bwrap can create when it lies in
    one of the sandbox's ``private`` tmpfs directories (systemd-resolved's is
    under /run); with no file to bind over, nothing is bound, and programs fall
    back to a resolver on loopback, which is ours anyway.  Pure."""
    if host is None:
        return None
    real, exists = host
    if exists or any(real.startswith(d.rstrip("/") + "/") for d in private):
        return real
    return None


# -- the launcher's child ---------------------------------------------------------------


# The process that entered a namespace with enter(), and the handoff it used
# (None: a run without a network).  A run planned again after a setup race
# (corral.cli) is already inside; the proxy holding its listeners was forked
# before, on the host side, and must stay the one that serves it: a proxy forked
# from inside would reach only the sandbox's loopback.
_entered: tuple[int, str | None] | None = None


def enter(plan: NetPlan) -> list[tuple[Listener, int]]:
    """Before bubblewrap starts, in the process that will start it: a new network
    namespace with loopback up and the plan's listeners, handed to the proxy
    (or, without a handoff, returned as descriptors the caller serves and
    closes).  A second call in the same process stays in the namespace it made
    (see ``_entered``).  Raises OSError."""
    global _entered
    if _entered is not None and _entered[0] == os.getpid():
        return _enter_again(plan, _entered[1])
    if not _enter_ahead():
        _new_namespace()
        _loopback_up()
    _entered = (os.getpid(), plan.handoff)
    if plan.rules is not None:
        from corral.net import transparent

        transparent.capture(plan.rules)
    if plan.handoff is None:
        return _listen_fds(plan)
    made = _listen_all(plan)
    try:
        _hand_over(plan.handoff, made)
    finally:
        for _, sock in made:  # the proxy has its copies; ours must not reach bwrap
            sock.close()
    return []


# Whether make_ahead() started a namespace for this process; whether a fork waits
# for make_ahead's thread (registered once).
_ahead = False
_fork_waits = False


def make_ahead() -> None:
    """For ``corral run``, once it knows the sandbox gets a namespace of corral's:
    start making it now, on a thread of corral's C module, beside the planning
    that follows (the kernel's half millisecond or more then costs the run
    nothing).  A user other than root gets the user namespace that owns it made
    there too (by a child the thread clones: corral._sys), so this process
    changes namespaces only in :func:`enter`, and what it forks before (the
    guardian, the proxy) stays in the host's.  Whatever fails is left for
    :func:`enter`, which does it the usual way and says why if that fails too."""
    global _ahead, _fork_waits
    c = _c_module()
    if c is None or _ahead or _entered is not None:
        return
    try:
        if os.geteuid() != 0:
            c.netns_ahead(CLONE_NEWUSER | CLONE_NEWNET, os.geteuid(), os.getegid())
        else:
            c.netns_ahead(CLONE_NEWNET)
    except OSError:
        return
    if not _fork_waits:
        # no fork while the thread runs (its child would inherit a lock the thread
        # might hold): the guardian and the proxy fork once it is done
        os.register_at_fork(before=c.netns_join)
        _fork_waits = True
    _ahead = True


def _enter_ahead() -> bool:
    """Move into the namespace make_ahead() started (and its user namespace, for a
    user other than root), loopback up: True; False when none was started or it
    could not be made or entered."""
    global _ahead
    if not _ahead:
        return False
    _ahead = False
    c = _c_module()
    assert c is not None
    try:
        return bool(c.netns_enter())
    except OSError:
        return False


def _enter_again(plan: NetPlan, handoff: str | None) -> list[tuple[Listener, int]]:
    """enter() in a process already inside: with the same handoff the proxy has
    the listeners already; without a network the resolver's sockets (closed with
    the last attempt) are made again here."""
    if plan.handoff != handoff:
        raise OSError("this process is already in another sandbox's network namespace")
    return [] if handoff is not None else _listen_fds(plan)


def _listen_fds(plan: NetPlan) -> list[tuple[Listener, int]]:
    """A run without a network's listeners (its resolver's, datagram sockets) as
    descriptors: made by corral's C module when it was built, so that a run
    loads the socket module only once a command looks a name up."""
    c = _c_module()
    if c is None:
        return [(listener, sock.detach()) for listener, sock in _listen_all(plan)]
    made: list[tuple[Listener, int]] = []
    try:
        for listener in plan.listeners[:MAX_LISTENERS]:
            assert listener.datagram, listener  # (offline_plan's: the resolver's only)
            try:
                made.append((listener, c.udp_bind(listener.host, listener.port)))
            except OSError as exc:
                if ":" in listener.host and exc.errno in (97, 99):  # no IPv6 here
                    continue
                raise OSError(exc.errno, f"cannot listen on {listener}: {exc.strerror}") from None
    except BaseException:
        for _, fd in made:
            os.close(fd)
        raise
    return made


def _listen_all(plan: NetPlan) -> list[tuple[Listener, _socket.socket]]:
    """The plan's listeners, bound in this process's namespace (all or none)."""
    made: list[tuple[Listener, _socket.socket]] = []
    try:
        for listener in plan.listeners[:MAX_LISTENERS]:
            sock = _listen(listener)
            if sock is not None:
                made.append((listener, sock))
    except BaseException:
        for _, sock in made:
            sock.close()
        raise
    return made


def _new_namespace() -> None:
    if os.geteuid() == 0 and _unshare(CLONE_NEWNET) == 0:
        return  # owned by the host's user namespace: only root outside can change it
    _user_namespace(CLONE_NEWNET)


def _user_namespace(also: int = 0) -> None:
    """A user namespace of this process's own (and ``also``'s namespaces, owned by
    it), mapping only its uid and gid, each to itself: bubblewrap (unprivileged
    in it) maps them on unchanged, and the command sees what it sees without a
    network.  Raises OSError."""
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWUSER | also
    if _unshare(flags) != 0:
        err = _unshare_errno(flags)
        if err:
            what = "a network" if also else "a user"
            raise OSError(err, f"cannot create {what} namespace: {os.strerror(err)}")
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{uid} {uid} 1\n"),
        ("gid_map", f"{gid} {gid} 1\n"),
    ):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def _unshare(flags: int) -> int:
    """unshare(2): os.unshare from Python 3.12, else corral's C module, else
    libc's through ctypes' C module (its import costs about a millisecond on
    every run).  0 or -1."""
    call = _os_unshare()
    if call is not None:
        try:
            call(flags)
        except OSError:
            return -1
        return 0
    import _ctypes

    unshare = _ctypes.dlsym(_ctypes.dlopen(None), "unshare")  # type: ignore[arg-type]
    return 0 if _ctypes.call_function(unshare, (flags,)) == 0 else -1


def _os_unshare() -> Callable[[int], None] | None:
    """An unshare that raises OSError with errno: os's or corral._sys's, if any."""
    call: Callable[[int], None] | None = getattr(os, "unshare", None)
    if call is None:
        c = _c_module()
        return None if c is None else c.unshare
    return call


def _c_module() -> types.ModuleType | None:
    """corral's C module (corral._sys), or None where it was built without a C
    compiler: then these calls go through ctypes' C module and the socket module."""
    try:
        from corral import _sys
    except ImportError:
        return None
    return _sys


def _unshare_errno(flags: int) -> int:
    """Why unshare(flags) fails: it is tried again through a function that keeps errno
    (0 if it succeeds this time, which leaves the process where it wanted to be)."""
    call = _os_unshare()
    if call is not None:
        try:
            call(flags)
        except OSError as exc:
            return exc.errno or 0
        return 0
    import _ctypes

    class Int(_ctypes._SimpleCData):  # type: ignore[type-arg]  # (generic in the stubs only)
        _type_ = "i"

    class Function(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = Int

    class Libc:
        _handle = _ctypes.dlopen(None, 0)  # type: ignore[arg-type]  # this process: libc

    if Function(("unshare", Libc()))(flags) == 0:  # type: ignore[arg-type]
        return 0
    return int(_ctypes.get_errno())


# RTM_NEWLINK for interface 1 (a new namespace's lo) with IFF_UP set: nlmsghdr
# (length, type, flags REQUEST|ACK, seq, pid) and ifinfomsg (family, type, index,
# flags, change).  Netlink rather than an ioctl: no fcntl module to load per run.
_LO_UP = (
    (32).to_bytes(4, sys.byteorder)
    + RTM_NEWLINK.to_bytes(2, sys.byteorder)
    + (NLM_F_REQUEST | NLM_F_ACK).to_bytes(2, sys.byteorder)
    + bytes(8)
    + bytes(4)
    + (1).to_bytes(4, sys.byteorder)
    + IFF_UP.to_bytes(4, sys.byteorder)
    + IFF_UP.to_bytes(4, sys.byteorder)
)


def _loopback_up() -> None:
    c = _c_module()
    if c is not None:
        c.loopback_up()
        return
    import _socket  # not `socket`: its enum classes cost milliseconds per run

    sock = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_RAW | _socket.SOCK_CLOEXEC, 0)
    try:
        sock.send(_LO_UP)
        reply = sock.recv(1024)  # the ack: an nlmsgerr whose error is 0, or -errno
    finally:
        sock.close()
    error = -int.from_bytes(reply[16:20], sys.byteorder, signed=True) if len(reply) >= 20 else 0
    if error:
        raise OSError(error, f"cannot bring loopback up: {os.strerror(error)}")


def _listen(listener: Listener) -> _socket.socket | None:
    """A bound (and, for TCP, listening) socket; None for IPv6 on a host without it."""
    import _socket

    v6 = ":" in listener.host
    family = _socket.AF_INET6 if v6 else _socket.AF_INET
    kind = _socket.SOCK_DGRAM if listener.datagram else _socket.SOCK_STREAM
    try:
        sock = _socket.socket(family, kind | _socket.SOCK_CLOEXEC)
    except OSError:
        if v6:
            return None
        raise
    try:
        if v6:
            sock.setsockopt(_socket.IPPROTO_IPV6, _socket.IPV6_V6ONLY, 1)
        sock.bind((listener.host, listener.port))
        if not listener.datagram:
            sock.listen(1024)
    except OSError as exc:
        sock.close()
        if v6 and exc.errno in (97, 99):  # EAFNOSUPPORT, EADDRNOTAVAIL: no IPv6 here
            return None
        raise OSError(exc.errno, f"cannot listen on {listener}: {exc.strerror}") from None
    return sock


def _hand_over(path: str, made: list[tuple[Listener, _socket.socket]]) -> None:
    """Send the listeners to the proxy.  If it is gone, they close with our copies:
    the sandbox runs with no network, as when the proxy dies later."""
    import _socket

    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
    try:
        conn.connect(path)
        send_listeners(conn, made)
    except OSError:
        pass
    finally:
        conn.close()


def send_listeners(conn: _socket.socket, made: list[tuple[Listener, _socket.socket]]) -> None:
    """Listeners over a connected SEQPACKET socket: one message, a line per
    listener and its descriptor (SCM_RIGHTS)."""
    import _socket

    header = "".join(f"{listener.kind} {listener.host} {listener.port}\n" for listener, _ in made)
    rights = b"".join(sock.fileno().to_bytes(4, sys.byteorder) for _, sock in made)
    conn.sendmsg([header.encode()], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])


class Resolver:
    """The resolver of a sandbox without a network, served by the launcher itself:
    every query is answered NXDOMAIN at once (as today's "Could not resolve
    host") and remembered, for the audit log and the run's report."""

    LIMIT = 1000  # lookups remembered per run; beyond, only counted

    def __init__(self, held: list[tuple[Listener, int]]) -> None:
        # each descriptor's socket object, made when a lookup first comes to it
        self.sockets: dict[int, _socket.socket | None] = {fd: None for _, fd in held}
        self.refused: list[tuple[str, str]] = []  # (name as asked, record type)
        self.dropped = 0

    def fds(self) -> list[int]:
        return list(self.sockets)

    def answer(self, fd: int) -> None:
        sock = self.sockets[fd]
        if sock is None:
            import _socket

            sock = self.sockets[fd] = _socket.socket(fileno=fd)
        try:
            packet, peer = sock.recvfrom(4096)
        except OSError:
            return
        from corral.net import dns  # only once a command looks a name up

        query = dns.parse_query(packet)
        if query is None:
            reply = dns.error_reply(packet, dns.RCODE_FORMERR)
        elif dns.own_name(query):
            reply = dns.answer(query, list(dns.OWN_ADDRESSES))
        else:
            reply = dns.answer(query, None, dns.RCODE_NXDOMAIN)
            if len(self.refused) < self.LIMIT:
                self.refused.append((query.name, dns.type_name(query.qtype)))
            else:
                self.dropped += 1
        try:
            sock.sendto(reply, peer)
        except OSError:
            pass

    def close(self) -> None:
        for fd, sock in self.sockets.items():
            if sock is not None:
                sock.close()
            else:
                os.close(fd)
        self.sockets = {}


# -- the proxy ------------------------------------------------------------------------------


def receive(handoff: _socket.socket) -> list[tuple[Listener, _socket.socket]]:
    """In the proxy: accept the launcher's one handoff and take its listeners."""
    import _socket

    fd, _ = handoff._accept()  # type: ignore[attr-defined]
    conn = _socket.socket(fileno=fd)
    try:
        return read_listeners(conn)
    finally:
        conn.close()


def read_listeners(conn: _socket.socket) -> list[tuple[Listener, _socket.socket]]:
    """What :func:`send_listeners` sent (ValueError when names and descriptors
    do not pair up: then none is kept)."""
    import _socket
    import struct

    data, ancillary, _flags, _ = conn.recvmsg(65536, _socket.CMSG_SPACE(MAX_LISTENERS * 4))
    fds: list[int] = []
    for level, what, payload in ancillary:
        if level == _socket.SOL_SOCKET and what == _socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds += struct.unpack(f"{usable // 4}i", payload[:usable])
    lines = data.decode("ascii", "replace").splitlines()
    if len(lines) != len(fds):
        for fd in fds:
            os.close(fd)
        raise ValueError(f"handoff: {len(lines)} listeners named, {len(fds)} received")
    out = []
    for line, fd in zip(lines, fds, strict=True):
        kind, host, port_text = line.split(" ")
        out.append((Listener(kind, host, int(port_text)), _socket.socket(fileno=fd)))
    return out
