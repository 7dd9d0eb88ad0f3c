"""A test CA and HTTPS origins on loopback for the TLS inspection tests.

The origin speaks HTTP/1.1 with keep-alive over TLS (or plain) and answers:

* ``/echo...``: JSON of the method, target and headers it received, and the
  certificate chain it served (so a test can tell its own TLS from corral's);
* ``/bytes/N``: N bytes, with a Content-Length;
* ``/count`` (any method with a body): how many body bytes arrived, from a
  Content-Length or a chunked body;
* ``/ws``: a WebSocket-style upgrade (101), then every byte echoed back;
  offered h2c among the upgrades, it picks h2c (as an HTTP/2 server would),
  and ``/ws/h2c`` answers any upgrade with h2c;
* ``/simple/...`` and ``/files/...``: a package index from a directory.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import socket
import ssl
import threading
from pathlib import Path
from typing import TypedDict

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from corral.net import aio

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.net.proxy import Proxy

ORIGIN_NAMES = ("origin.test", "other.test", "127.0.0.1", "::1")


class OriginCA:
    """A CA the tests' origins use, written as PEM files into ``directory``."""

    def __init__(self, directory: Path, name: str = "corral test origin CA") -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(True, False, False, False, False, True, True, False, False),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        directory.mkdir(parents=True, exist_ok=True)
        self.cert_path = directory / "test-ca.pem"
        self.key_path = directory / "test-ca.key"
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self.key_path.write_bytes(
            self.key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        os.chmod(self.cert_path, 0o644)
        os.chmod(self.key_path, 0o600)

    def server_files(
        self, names: tuple[str, ...] = ORIGIN_NAMES, tag: str = "origin"
    ) -> tuple[Path, Path]:
        """A server certificate for ``names`` signed by this CA: (cert, key) paths."""
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = []
        for name in names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                sans.append(x509.DNSName(name))
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"test {tag}")]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        cert_path = self.directory / f"{tag}.pem"
        key_path = self.directory / f"{tag}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return cert_path, key_path


class Arrived(TypedDict):
    """A request the origin received (``Origin.requests``)."""

    method: str
    target: str
    headers: list[tuple[str, ...]]
    body_bytes: int


class Origin:
    """An HTTP/1.1 origin on 127.0.0.1 (and ::1 when ``v6``), TLS when given a
    certificate; threads, one per connection; ``close()`` stops it."""

    def __init__(
        self,
        cert: tuple[Path, Path] | None = None,
        v6: bool = False,
        index: Path | None = None,
    ) -> None:
        self.context: ssl.SSLContext | None = None
        if cert is not None:
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(str(cert[0]), str(cert[1]))
            self.context.set_alpn_protocols(["http/1.1"])
            self.served_cert = Path(cert[0]).read_text()
        self.index = index
        self.requests: list[Arrived] = []  # what arrived, for assertions
        self.alpn: list[str | None] = []
        family = socket.AF_INET6 if v6 else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("::1" if v6 else "127.0.0.1", 0))
        self.sock.listen(64)
        self.port: int = self.sock.getsockname()[1]
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self.context is not None:
                conn = self.context.wrap_socket(conn, server_side=True)
                self.alpn.append(conn.selected_alpn_protocol())
            reader = _Reader(conn)
            while self._one(conn, reader):
                pass
        except (OSError, ssl.SSLError, ValueError):
            pass
        finally:
            conn.close()

    def _one(self, conn: socket.socket, reader: _Reader) -> bool:
        head = reader.until(b"\r\n\r\n")
        if not head:
            return False
        lines = head[:-4].decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = [tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:] if line]
        lower = {k.lower(): v for k, v in headers}
        body = b""
        if "content-length" in lower:
            body = reader.exactly(int(lower["content-length"]))
        elif lower.get("transfer-encoding", "").lower() == "chunked":
            body = reader.chunked()
        record: Arrived = {
            "method": method,
            "target": target,
            "headers": headers,
            "body_bytes": len(body),
        }
        self.requests.append(record)
        close = lower.get("connection", "").lower() == "close"
        offered = [t.strip().lower() for t in lower.get("upgrade", "").split(",")]
        if target.startswith("/ws") and ("websocket" in offered or "h2c" in offered):
            picked = "h2c" if "h2c" in offered or target == "/ws/h2c" else "websocket"
            conn.sendall(
                f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: {picked}\r\n".encode()
                + b"Connection: Upgrade\r\nSec-WebSocket-Accept: test\r\n\r\n"
                + reader.rest()
            )
            while data := conn.recv(65536):
                conn.sendall(data)
            return False
        status, ctype, payload = self._answer(method, target, record)
        extra = "Connection: close\r\n" if close else ""
        conn.sendall(
            f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(payload)}\r\n"
            f"X-Origin-Echo: {lower.get('x-echo-me', '')}\r\n{extra}\r\n".encode("latin-1")
            + payload
        )
        return not close

    def _answer(self, method: str, target: str, record: Arrived) -> tuple[str, str, bytes]:
        if target.startswith("/bytes/"):
            return "200 OK", "application/octet-stream", b"b" * int(target.split("/")[2])
        if target.startswith("/count"):
            return "200 OK", "text/plain", str(record["body_bytes"]).encode()
        if self.index is not None and (target.startswith("/simple") or target.startswith("/files")):
            return self._index(target)
        served = getattr(self, "served_cert", "")
        answer = {**record, "served_cert": served}
        return "200 OK", "application/json", json.dumps(answer).encode()

    def _index(self, target: str) -> tuple[str, str, bytes]:
        """A PEP 503 simple index over the wheels in ``index``."""
        assert self.index is not None
        parts = [p for p in target.split("?")[0].split("/") if p]
        wheels = sorted(p.name for p in self.index.glob("*.whl"))
        if parts[0] == "files" and len(parts) == 2 and parts[1] in wheels:
            return "200 OK", "application/octet-stream", (self.index / parts[1]).read_bytes()
        if parts[0] == "simple" and len(parts) == 2:
            project = parts[1].lower().replace("_", "-")
            links = [
                f'<a href="/files/{w}">{w}</a>'
                for w in wheels
                if w.split("-")[0].lower().replace("_", "-") == project
            ]
            if links:
                return (
                    "200 OK",
                    "text/html",
                    ("<html><body>" + "".join(links) + "</body></html>").encode(),
                )
        return "404 Not Found", "text/plain", b"not here"


class _Reader:
    """Buffered reads from a socket: a head, an exact length, a chunked body."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buffer = b""

    def _more(self) -> bool:
        data = self.conn.recv(65536)
        self.buffer += data
        return bool(data)

    def until(self, mark: bytes) -> bytes:
        while mark not in self.buffer:
            if not self._more():
                return b""
        cut = self.buffer.index(mark) + len(mark)
        out, self.buffer = self.buffer[:cut], self.buffer[cut:]
        return out

    def exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            if not self._more():
                raise ValueError("short body")
        out, self.buffer = self.buffer[:size], self.buffer[size:]
        return out

    def chunked(self) -> bytes:
        body = b""
        while True:
            size = int(self.until(b"\r\n")[:-2].split(b";")[0], 16)
            if size == 0:
                self.until(b"\r\n")
                return body
            body += self.exactly(size)
            self.exactly(2)

    def rest(self) -> bytes:
        out, self.buffer = self.buffer, b""
        return out


# A Node HTTPS GET through HTTPS_PROXY with CONNECT, as proxy agents do it; the
# TLS verification is Node's own, with NODE_EXTRA_CA_CERTS.
NODE_CONNECT_CLIENT = r"""
const http = require('http'), tls = require('tls');
const target = new URL(process.argv[process.argv.length - 1]);
const proxy = new URL(process.env.HTTPS_PROXY);
const req = http.request({host: proxy.hostname, port: proxy.port, method: 'CONNECT',
                          path: `${target.hostname}:${target.port}`});
req.on('connect', (res, socket) => {
  if (res.statusCode !== 200) { console.error('CONNECT', res.statusCode); process.exit(2); }
  const conn = tls.connect({socket, servername: target.hostname}, () => {
    conn.write(`GET ${target.pathname} HTTP/1.1\r\nHost: ${target.host}\r\n` +
               'Connection: close\r\n\r\n');
  });
  let data = '';
  conn.on('data', d => data += d);
  conn.on('end', () => { process.stdout.write(data.split('\r\n\r\n').slice(1).join('\r\n\r\n')); });
  conn.on('error', e => { console.error(e.message); process.exit(3); });
});
req.end();
"""


class ProxyThread:
    """A real proxy serving a loopback port on its own event loop, in a thread: what
    the harnesses of the proxy's unit tests drive with real clients."""

    def __init__(self, proxy: Proxy, run_id: str) -> None:
        from corral.net.proxy import run_loop

        self.port = 0
        self._loop: aio.AbstractEventLoop | None = None
        ready = threading.Event()

        async def main() -> None:
            self._loop = aio.get_running_loop()
            self._stop = aio.Event()
            server = await proxy.serve_tcp("127.0.0.1", 0, run_id)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            await self._stop.wait()
            server.close()

        self._thread = threading.Thread(target=run_loop, args=(main(),), daemon=True)
        self._thread.start()
        assert ready.wait(10)

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)
