"""The relay: the first process of a container sandbox whose network goes through corral.

The namespace tier needs no relay (corral makes that sandbox's network
namespace itself and hands its sockets to the proxy, see netns.py); a
container's namespace belongs to its engine, so this relay runs *inside* it
(``python -I -S relay.py --door PATH --http PORT --socks PORT [--dns PORT]
[--service ADDRESS:PORT ...] -- COMMAND...``), using only the standard library
because the sandbox sees no site-packages.  It binds its ports on the
sandbox's own loopback, then starts the command.  Because the sockets listen
before the command exists, the command's first connection waits in the
backlog instead of being refused (a race that fails a peer's first requests).

Each accepted connection is paired with a new connection to the door, a unix
socket leading to the proxy on the host, with one frame byte first (see
proxy.py): a proxy connection (HTTP or SOCKS5, told apart by the proxy), a
connection to a host service at its own address (``--service``: the proxy
decides it as a CONNECT to that address, and answers one byte once connected),
or a DNS query (``--dns``, UDP).  Bytes are then pumped both ways unchanged.
If the door is gone (the proxy died), or a host service is refused or down,
the client's connection is reset: no network.

The relay exits with the command's exit status.
"""

import os
import signal
import socket
import struct
import sys
import threading

CHUNK = 256 * 1024
PLAIN = b"\xfb"  # door frame: a proxy connection follows
SERVICE = b"\xfc"  # door frame: "ADDRESS PORT\n", then a connection to that host service
SERVICE_OK = b"\x00"  # the proxy's first byte back on a SERVICE connection: it is connected
DNS = b"\xfd"  # door frame: one DNS query, 2-byte length + packet


def pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def reset(client: socket.socket) -> None:
    """End a client's connection with a reset: a refused or unreachable service reads
    as a failure to the client, not as an empty reply."""
    try:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    client.close()


def serve(client: socket.socket, door: str, frame: bytes) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(door)
        upstream.sendall(frame)
        # a host service: the proxy says it is connected, or closes (refused, down)
        if frame[:1] == SERVICE and upstream.recv(1) != SERVICE_OK:
            raise ConnectionRefusedError
    except OSError:
        reset(client)  # fail closed: no proxy, no network
        upstream.close()
        return
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def accept_loop(listener: socket.socket, door: str, frame: bytes) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            continue
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve, args=(client, door, frame), daemon=True).start()


def dns_loop(sock: socket.socket, door: str) -> None:
    """Each query goes to the proxy through the door; its answer comes back."""
    while True:
        try:
            packet, peer = sock.recvfrom(4096)
        except OSError:
            continue
        threading.Thread(target=dns_one, args=(sock, door, packet, peer), daemon=True).start()


def dns_one(sock: socket.socket, door: str, packet: bytes, peer: tuple[str, int]) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.settimeout(10)
        upstream.connect(door)
        upstream.sendall(DNS + struct.pack("!H", len(packet)) + packet)
        head = upstream.recv(2, socket.MSG_WAITALL)
        reply = upstream.recv(struct.unpack("!H", head)[0], socket.MSG_WAITALL)
        sock.sendto(reply, peer)
    except (OSError, struct.error):
        pass  # no answer: the resolver times out, as with no network
    finally:
        upstream.close()


def listen(port: int, kind: int = socket.SOCK_STREAM) -> list[socket.socket]:
    """``port`` on both loopback addresses (IPv6 only where the sandbox has it)."""
    sockets = [s for host in ("127.0.0.1", "::1") if (s := bind(host, port, kind)) is not None]
    if not sockets:
        raise SystemExit(f"corral-relay: cannot listen on loopback port {port}")
    return sockets


def bind(host: str, port: int, kind: int = socket.SOCK_STREAM) -> socket.socket | None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.socket(family, kind)
    except OSError:
        return None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        return None  # e.g. no IPv6 in this namespace
    if kind == socket.SOCK_STREAM:
        sock.listen(1024)
    return sock


def parse(argv: list[str]) -> tuple[str, dict[str, int], list[tuple[str, int]], list[str]]:
    door, ports, services, i = options(argv)
    command = argv[i + 1 :]
    if not door or not ports or not command:
        raise SystemExit(
            "usage: relay.py --door PATH --http PORT --socks PORT "
            "[--dns PORT] [--service ADDRESS:PORT ...] -- COMMAND..."
        )
    return door, ports, services, command


def options(argv: list[str]) -> tuple[str, dict[str, int], list[tuple[str, int]], int]:
    """The door, the ports and the host services ``argv`` names before ``--``, and
    the index of that ``--`` (or the end)."""
    door, ports, services = "", {}, []
    i = 0
    while i < len(argv) and argv[i] != "--":
        if i + 1 >= len(argv):
            raise SystemExit(f"corral-relay: {argv[i]} needs a value")
        if argv[i] == "--door":
            door = argv[i + 1]
        elif argv[i] in ("--http", "--socks", "--dns"):
            ports[argv[i][2:]] = int(argv[i + 1])
        elif argv[i] == "--service":
            host, _, port = argv[i + 1].rpartition(":")
            services.append((host.strip("[]"), int(port)))
        else:
            raise SystemExit(f"corral-relay: unknown argument {argv[i]!r}")
        i += 2
    return door, ports, services, i


def cannot_run(name: str, exc: OSError, path: str) -> str:
    """corral's line for a command that could not start (as corral.failures.cannot_run;
    this file runs inside the sandbox and imports nothing of corral)."""
    if not isinstance(exc, FileNotFoundError):
        return f"corral: cannot run {name}: {exc.strerror}\n"
    if "/" not in name:
        return f"corral: {name}: command not found in the sandbox (PATH={path})\n"
    if os.path.exists(name):
        return f"corral: {name}: the interpreter its #! line names is not in the sandbox\n"
    return f"corral: {name}: no such file in the sandbox\n"


def one_line_errors(who: str) -> None:
    """An unexpected error in corral's own code inside the sandbox reaches the
    command's stderr as one line, never as a traceback."""

    def say(kind: type[BaseException], value: BaseException) -> None:
        try:
            sys.stderr.write(f"{who}: internal error: {kind.__name__}: {value}\n")
        except (OSError, ValueError):
            pass

    sys.excepthook = lambda kind, value, _tb: say(kind, value)
    threading.excepthook = lambda args: say(args.exc_type, args.exc_value or args.exc_type())


class Listeners:
    """The relay's sockets, bound (before the command exists: its first connection
    waits in the backlog), then served by threads of :meth:`serve`."""

    def __init__(self, door: str, ports: dict[str, int], services: list[tuple[str, int]]) -> None:
        self.door = door
        self.proxies = [s for k in ("http", "socks") if k in ports for s in listen(ports[k])]
        self.resolvers = listen(ports["dns"], socket.SOCK_DGRAM) if "dns" in ports else []
        self.served = [(s, host, port) for host, port in services if (s := bind(host, port))]

    def sockets(self) -> list[socket.socket]:
        return self.proxies + self.resolvers + [sock for sock, _, _ in self.served]

    def serve(self) -> None:
        for sock in self.proxies:
            threading.Thread(target=accept_loop, args=(sock, self.door, PLAIN), daemon=True).start()
        for sock, host, port in self.served:
            frame = SERVICE + f"{host} {port}\n".encode()
            threading.Thread(target=accept_loop, args=(sock, self.door, frame), daemon=True).start()
        for sock in self.resolvers:
            threading.Thread(target=dns_loop, args=(sock, self.door), daemon=True).start()


def main(argv: list[str]) -> None:
    one_line_errors("corral-relay")
    door, ports, services, command = parse(argv)
    listeners = Listeners(door, ports, services)
    pid = os.fork()
    if pid == 0:
        for sock in listeners.sockets():
            sock.close()
        for ignored in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; commands don't
            signal.signal(ignored, signal.SIG_DFL)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            sys.stderr.write(cannot_run(command[0], exc, os.environ.get("PATH", "")))
            os._exit(127 if isinstance(exc, FileNotFoundError) else 126)
    listeners.serve()
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):  # die the same way, so the exit code says 128+N
        signum = os.WTERMSIG(status)
        if signum not in (signal.SIGKILL, signal.SIGSTOP):  # those have no handler to reset
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main(sys.argv[1:])
