"""The relay: the sandbox's first process when its network goes through corral.

It runs *inside* the sandbox (``python -I -S relay.py --door PATH --http PORT
--socks PORT -- COMMAND...``), using only the standard library because the
sandbox sees no site-packages.  It binds the HTTP-proxy and SOCKS5 ports on
the sandbox's own loopback, then starts the command.  Because the sockets
listen before the command exists, the command's first connection waits in the
backlog instead of being refused (a race that fails a peer's first requests).

Each accepted connection is paired with a new connection to the door, a unix
socket leading to the proxy on the host, and bytes are pumped both ways
unchanged; the proxy tells HTTP from SOCKS5 by the first byte.  If the door
is gone (the proxy died), the client's connection is closed: no network.

The relay exits with the command's exit status.
"""

import os
import signal
import socket
import struct
import sys
import threading

CHUNK = 256 * 1024
SO_ORIGINAL_DST = 80  # netfilter: where a redirected connection was going
TRANSPARENT = b"\xfe"  # door preamble: a captured connection, "ADDRESS PORT\n" follows
DNS = b"\xfd"  # door preamble: one DNS query, 2-byte length + packet


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


def original_destination(client: socket.socket) -> tuple[str, int]:
    """Where a connection redirected by the sandbox's nftables rules was headed."""
    if client.family == socket.AF_INET6:
        raw = client.getsockopt(socket.IPPROTO_IPV6, SO_ORIGINAL_DST, 28)
        port = struct.unpack("!H", raw[2:4])[0]
        return socket.inet_ntop(socket.AF_INET6, raw[8:24]), port
    raw = client.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port = struct.unpack("!H", raw[2:4])[0]
    return socket.inet_ntop(socket.AF_INET, raw[4:8]), port


def serve(client: socket.socket, door: str, transparent: bool = False) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(door)
        if transparent:
            address, port = original_destination(client)
            upstream.sendall(TRANSPARENT + f"{address} {port}\n".encode())
    except OSError:
        client.close()  # fail closed: no proxy, no network
        upstream.close()
        return
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def accept_loop(listener: socket.socket, door: str, transparent: bool = False) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            continue
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve, args=(client, door, transparent), daemon=True).start()


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
    sockets = []
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            sock = socket.socket(family, kind)
        except OSError:
            continue
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            continue  # e.g. no IPv6 in this namespace
        if kind == socket.SOCK_STREAM:
            sock.listen(1024)
        sockets.append(sock)
    if not sockets:
        raise SystemExit(f"corral-relay: cannot listen on loopback port {port}")
    return sockets


def parse(argv: list[str]) -> tuple[str, dict[str, int], list[str]]:
    door, ports = "", {}
    i = 0
    while i < len(argv) and argv[i] != "--":
        if argv[i] == "--door":
            door = argv[i + 1]
        elif argv[i] in ("--http", "--socks", "--transparent", "--dns"):
            ports[argv[i][2:]] = int(argv[i + 1])
        else:
            raise SystemExit(f"corral-relay: unknown argument {argv[i]!r}")
        i += 2
    command = argv[i + 1 :]
    if not door or not ports or not command:
        raise SystemExit(
            "usage: relay.py --door PATH --http PORT --socks PORT "
            "[--transparent PORT --dns PORT] -- COMMAND..."
        )
    return door, ports, command


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


def main(argv: list[str]) -> None:
    one_line_errors("corral-relay")
    door, ports, command = parse(argv)
    proxies = [sock for k in ("http", "socks") if k in ports for sock in listen(ports[k])]
    captured = listen(ports["transparent"]) if "transparent" in ports else []
    resolvers = listen(ports["dns"], socket.SOCK_DGRAM) if "dns" in ports else []
    listeners = proxies + captured + resolvers
    pid = os.fork()
    if pid == 0:
        for sock in listeners:
            sock.close()
        for ignored in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; commands don't
            signal.signal(ignored, signal.SIG_DFL)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            sys.stderr.write(cannot_run(command[0], exc, os.environ.get("PATH", "")))
            os._exit(127 if isinstance(exc, FileNotFoundError) else 126)
    for sock in proxies:
        threading.Thread(target=accept_loop, args=(sock, door), daemon=True).start()
    for sock in captured:
        threading.Thread(target=accept_loop, args=(sock, door, True), daemon=True).start()
    for sock in resolvers:
        threading.Thread(target=dns_loop, args=(sock, door), daemon=True).start()
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
