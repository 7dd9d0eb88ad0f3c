"""corral's proxy next to squid and a direct connection, on loopback.

Run from the repository root::

    python -m bench.proxy_throughput [--duration S] [--rounds N] [--quick]

What it measures (all on 127.0.0.1; origin: a private nginx serving a 1 KB and
a 10 MB file):

1. keep-alive requests/s: 1 KB responses over 32 keep-alive connections.  ``wrk``
   drives it; through a proxy a small Lua script makes wrk send absolute-form
   requests (``GET http://127.0.0.1:ORIGIN/1k HTTP/1.1``) to the proxy port.
2. new CONNECT tunnels/s: 32 concurrent clients, each opening a connection to
   the proxy, ``CONNECT``, one small GET through the tunnel, close.  Direct:
   a new connection and one GET.  A load generator in this file (epoll, one
   process per CPU) drives it.
3. MB/s (10**6 bytes) of 10 MB bodies, each through a new CONNECT tunnel, for
   the same duration: one client, and four in parallel.
4. latency of one small GET on a keep-alive connection (500 per loop), from
   inside a ``corral run`` sandbox through the proxy (the listener it holds in
   the sandbox's namespace), next to the
   same loop on the host against the origin, ``corral proxy serve`` and squid.

The three contenders (direct, squid, corral) are measured in interleaved
rounds (each round runs every variant of every row once, in rotating order),
so a slow stretch of the machine hits them alike.  squid and nginx are private
instances with config files in a temporary directory; every server is started
in its own process group and killed with it at the end.  The report is printed
and written to ``bench/results/proxy.md``.  This is a benchmark, not a test:
the exit status is 0 whether or not a goal is met.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import multiprocessing
import os
import platform
import pwd
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import write_result

TYPE_CHECKING = False
if TYPE_CHECKING:
    from bench.common import Row as BenchRow

RESULTS = Path(__file__).resolve().parent / "results" / "proxy.md"
SMALL = 1024
BIG = 10 * 1000 * 1000
CONCURRENCY = 32
LAT_REQUESTS = 500
LAT_WARMUP = 50
GOAL_RATIO = 1.0  # corral / squid, rows 1-3
GOAL_ADDED_MS = 0.5  # p50 through the door minus p50 direct
# What the issue measured on this machine, printed for orientation only.
REFERENCE = {
    "keepalive": (55_009.0, 12_720.0),
    "tunnels": (9_061.0, 4_069.0),
    "bulk": (1_309.0, 714.0),
}
MARK = "BENCHJSON "
WRK_LUA = """\
-- written by bench/proxy_throughput.py
local target = os.getenv("BENCH_TARGET")
local host = os.getenv("BENCH_HOST")
if target ~= nil and target ~= "" then
  wrk.path = target
end
if host ~= nil and host ~= "" then
  wrk.headers["Host"] = host
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '%s{"requests": %d, "duration_us": %d, "bytes": %d, "connect": %d, "read": %d, ' ..
    '"write": %d, "status": %d, "timeout": %d, "p50_us": %d, "p99_us": %d}\\n',
    "MARK", summary.requests, summary.duration, summary.bytes, e.connect, e.read,
    e.write, e.status, e.timeout, latency:percentile(50), latency:percentile(99)))
end
""".replace('"MARK"', repr(MARK).replace("'", '"'))

# The latency loop: stdlib only, because it also runs inside the sandbox.
# argv: host port target host-header count warmup; prints one line of µs.
LAT_SCRIPT = """\
import socket, sys, time
host, port, target, hosthdr, n, warm = sys.argv[1:7]
n, warm = int(n), int(warm)
s = socket.create_connection((host, int(port)))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
req = ("GET %s HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n" % (target, hosthdr)).encode()
out = []
clock = time.perf_counter_ns
for i in range(warm + n):
    t0 = clock()
    s.sendall(req)
    buf = s.recv(65536)
    while b"\\r\\n\\r\\n" not in buf:
        more = s.recv(65536)
        if not more:
            raise SystemExit("connection closed")
        buf += more
    head, _, body = buf.partition(b"\\r\\n\\r\\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit("bad response: %r" % head[:200])
    length = 0
    for line in head.split(b"\\r\\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        more = s.recv(65536)
        if not more:
            raise SystemExit("connection closed in the body")
        body += more
    t1 = clock()
    if i >= warm:
        out.append((t1 - t0) // 1000)
print(" ".join(map(str, out)))
"""

ORIGIN_FALLBACK = """\
import asyncio, sys
port, small, big = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
bodies = {b"/1k": b"x" * small, b"/10m": b"y" * big}
async def handle(r, w):
    try:
        while True:
            head = await r.readuntil(b"\\r\\n\\r\\n")
            path = head.split(b" ", 2)[1]
            body = bodies.get(path)
            close = b"connection: close" in head.lower()
            if body is None:
                w.write(b"HTTP/1.1 404 Not Found\\r\\ncontent-length: 0\\r\\n\\r\\n")
            else:
                w.write(b"HTTP/1.1 200 OK\\r\\ncontent-length: %d\\r\\n\\r\\n" % len(body))
                w.write(body)
            await w.drain()
            if close:
                break
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        w.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""


class BenchError(Exception):
    """The benchmark cannot run here; the message says why."""


# -- processes ------------------------------------------------------------------


class Service:
    """A server in its own process group, stopped with the whole group."""

    def __init__(self, name: str, argv: list[str], log: str, env: dict[str, str] | None = None):
        self.name = name
        self.argv = argv
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        LIVE.append(self)

    def wait_port(self, port: int, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"{self.name} exited ({self.proc.returncode}): {self.tail()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise BenchError(f"{self.name} does not listen on {port}: {self.tail()}")

    def tail(self) -> str:
        try:
            with open(self.log, "rb") as fh:
                return fh.read()[-800:].decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        """CPU time of the group leader's threads so far (schedstat: nanoseconds)."""
        total = 0
        try:
            tasks = os.listdir(f"/proc/{self.proc.pid}/task")
        except OSError:
            return 0.0
        for tid in tasks:
            try:
                with open(f"/proc/{self.proc.pid}/task/{tid}/schedstat", encoding="ascii") as fh:
                    total += int(fh.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
        return total / 1e9

    def stop(self) -> None:
        pgid = self.proc.pid
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                self.proc.poll()
                if not _group_alive(pgid):
                    break
                time.sleep(0.05)
            else:
                continue
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2)
        if self in LIVE:
            LIVE.remove(self)


LIVE: list[Service] = []


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie group leader still counts for killpg; look for a living member.
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                rest = fh.read().rpartition(")")[2].split()
        except OSError:
            continue
        if len(rest) > 2 and int(rest[2]) == pgid and rest[0] != "Z":
            return True
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sbin(name: str) -> str | None:
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/local/sbin"
    return shutil.which(name, path=path)


def ensure_tools(names: dict[str, str]) -> None:
    """Install the Debian packages of missing tools ({tool: package}) with apt-get.

    A temporary ``policy-rc.d`` keeps the packages' system services from being
    started by the install (it is removed again if this created it).
    """
    missing = sorted({pkg for tool, pkg in names.items() if _sbin(tool) is None})
    if not missing:
        return
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        print(f"bench: missing {' '.join(missing)} (not root or no apt-get)", file=sys.stderr)
        return
    print(f"bench: installing {' '.join(missing)} with apt-get", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    policy = Path("/usr/sbin/policy-rc.d")
    made_policy = False
    try:
        if not policy.exists():
            policy.write_text("#!/bin/sh\nexit 101\n", encoding="ascii")
            policy.chmod(0o755)
            made_policy = True
        cmd = [apt, "install", "-y", "-q", "--no-install-recommends", *missing]
        if subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL).returncode != 0:
            subprocess.run([apt, "update", "-q"], env=env, stdout=subprocess.DEVNULL)
            subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL)
    finally:
        if made_policy:
            policy.unlink(missing_ok=True)


# -- servers --------------------------------------------------------------------


@dataclass
class Servers:
    tmp: str
    origin_port: int = 0
    origin_kind: str = ""
    squid_port: int = 0
    corral_port: int = 0
    corral_log: str = ""
    squid_log: str = ""
    squid: Service | None = None
    corral: Service | None = None


def start_origin(srv: Servers, origin: str = "nginx") -> None:
    www = os.path.join(srv.tmp, "www")
    os.makedirs(www, mode=0o755)
    with open(os.path.join(www, "1k"), "wb") as fh:
        fh.write(b"x" * SMALL)
    with open(os.path.join(www, "10m"), "wb") as fh:
        block = bytes(range(256)) * 4096
        left = BIG
        while left:
            left -= fh.write(block[: min(left, len(block))])
    port = free_port()
    nginx = _sbin("nginx") if origin == "nginx" else None
    if nginx is not None:
        conf_dir = os.path.join(srv.tmp, "nginx")
        os.makedirs(conf_dir, mode=0o755)
        conf = os.path.join(conf_dir, "nginx.conf")
        temps = "".join(
            f"    {kind}_temp_path {conf_dir}/{kind};\n"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        user = "user root root;\n" if os.geteuid() == 0 else ""
        with open(conf, "w", encoding="ascii") as fh:
            fh.write(
                f"{user}daemon off;\nmaster_process on;\nworker_processes 1;\n"
                f"pid {conf_dir}/nginx.pid;\nerror_log {conf_dir}/error.log warn;\n"
                "events { worker_connections 4096; multi_accept on; }\n"
                "http {\n"
                "    access_log off;\n    sendfile on;\n    tcp_nopush on;\n"
                "    tcp_nodelay on;\n    keepalive_requests 100000000;\n"
                "    keepalive_timeout 300s;\n    default_type application/octet-stream;\n"
                f"{temps}"
                f"    server {{\n        listen 127.0.0.1:{port} backlog=4096;\n"
                f"        root {www};\n    }}\n}}\n"
            )
        log = os.path.join(conf_dir, "stdout.log")
        argv = [nginx, "-p", conf_dir, "-e", f"{conf_dir}/error.log", "-c", conf]
        try:
            svc = Service("nginx", argv, log)
            svc.wait_port(port)
            srv.origin_port, srv.origin_kind = port, "nginx " + _nginx_version(nginx)
            return
        except (BenchError, OSError) as exc:
            print(f"bench: nginx cannot run ({exc}); using a Python origin", file=sys.stderr)
            if LIVE and LIVE[-1].name == "nginx":
                LIVE[-1].stop()
            port = free_port()
    argv = [sys.executable, "-c", ORIGIN_FALLBACK, str(port), str(SMALL), str(BIG)]
    svc = Service("python origin", argv, os.path.join(srv.tmp, "origin.log"))
    svc.wait_port(port)
    srv.origin_port, srv.origin_kind = port, "Python asyncio (fallback)"


def _nginx_version(nginx: str) -> str:
    out = subprocess.run([nginx, "-v"], capture_output=True, text=True).stderr
    return out.strip().rpartition("/")[2] or "?"


def start_squid(srv: Servers) -> None:
    squid = _sbin("squid")
    if squid is None:
        raise BenchError("squid is not installed (Debian package squid)")
    sq = os.path.join(srv.tmp, "squid")
    os.makedirs(sq, mode=0o755)
    port = free_port()
    srv.squid_log = os.path.join(sq, "access.log")
    conf = os.path.join(sq, "squid.conf")
    with open(conf, "w", encoding="ascii") as fh:
        fh.write(
            f"http_port 127.0.0.1:{port}\n"
            "workers 1\n"
            "acl bench_clients src 127.0.0.1/32\n"
            "http_access allow bench_clients\n"
            "http_access deny all\n"
            "cache deny all\n"
            "cache_mem 0 MB\n"
            f"access_log stdio:{srv.squid_log}\n"
            f"cache_log {sq}/cache.log\n"
            "cache_store_log none\n"
            "logfile_rotate 0\n"
            f"pid_filename {sq}/squid.pid\n"
            f"coredump_dir {sq}\n"
            "visible_hostname corral-bench\n"
            "shutdown_lifetime 0 seconds\n"
            "max_filedescriptors 16384\n"
            "dns_nameservers 127.0.0.1\n"
            "icp_port 0\nhtcp_port 0\nsnmp_port 0\n"
        )
    if os.geteuid() == 0:  # squid drops root for cache_effective_user ("proxy" on Debian)
        for user in ("proxy", "nobody"):
            try:
                pw = pwd.getpwnam(user)
            except KeyError:
                continue
            os.chown(sq, pw.pw_uid, pw.pw_gid)
            with open(conf, "a", encoding="ascii") as fh:
                fh.write(f"cache_effective_user {user}\n")
            break
    svc = Service("squid", [squid, "-N", "-f", conf], os.path.join(srv.tmp, "squid.out"))
    svc.wait_port(port)
    srv.squid_port, srv.squid = port, svc


def start_corral(srv: Servers, corral: str) -> None:
    port = free_port()
    srv.corral_log = os.path.join(srv.tmp, "corral-net.jsonl")
    argv = [
        corral, "proxy", "serve",
        "--listen", f"127.0.0.1:{port}",
        "--allow", f"127.0.0.1:{srv.origin_port}",
        "--net-log", srv.corral_log,
    ]  # fmt: skip
    svc = Service("corral proxy serve", argv, os.path.join(srv.tmp, "corral.out"))
    svc.wait_port(port)
    srv.corral_port, srv.corral = port, svc


def check_small(srv: Servers, proxy_port: int | None) -> None:
    """One absolute-form (or, direct, origin-form) GET: the setup works."""
    port = proxy_port or srv.origin_port
    target = f"http://127.0.0.1:{srv.origin_port}/1k" if proxy_port else "/1k"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(
            f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{srv.origin_port}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200") or len(body) != SMALL:
        raise BenchError(f"GET {target} via port {port}: {head[:300]!r}, {len(body)} bytes")


# -- load generators --------------------------------------------------------------


@dataclass
class LoadJob:
    mode: str  # "keepalive" | "tunnel" | "new"
    port: int  # where to connect
    origin: int
    via_proxy: bool
    conns: int
    start_at: float  # time.monotonic() (system-wide on Linux)
    duration: float


@dataclass
class _Conn:
    sock: socket.socket
    state: int  # 0 connecting, 1 waiting for the CONNECT reply, 2 reading the response
    buf: bytearray = field(default_factory=bytearray)
    need: int = -1


def _load_worker(job: LoadJob) -> tuple[int, int, str]:
    """Drive ``job.conns`` connections with epoll; (completed, errors, first error)."""
    addr = ("127.0.0.1", job.port)
    origin = f"127.0.0.1:{job.origin}"
    connect_req = f"CONNECT {origin} HTTP/1.1\r\nHost: {origin}\r\n\r\n".encode()
    target = f"http://{origin}/1k" if job.mode == "keepalive" and job.via_proxy else "/1k"
    get_req = f"GET {target} HTTP/1.1\r\nHost: {origin}\r\n\r\n".encode()
    ep = select.epoll()
    conns: dict[int, _Conn] = {}
    done = errors = 0
    first_error = ""
    end = job.start_at + job.duration

    def fail(c: _Conn | None, why: str) -> None:
        nonlocal errors, first_error
        errors += 1
        first_error = first_error or why
        if c is not None:
            close(c)
        if errors > 1000 and errors > done:
            raise RuntimeError(f"too many errors: {first_error}")
        open_one()

    def close(c: _Conn) -> None:
        fd = c.sock.fileno()
        conns.pop(fd, None)
        with contextlib.suppress(OSError):
            ep.unregister(fd)
        c.sock.close()

    def send(c: _Conn, data: bytes) -> bool:
        try:
            sent = c.sock.send(data)
        except OSError as exc:
            fail(c, f"send: {exc}")
            return False
        if sent != len(data):
            fail(c, "short send")
            return False
        return True

    def connected(c: _Conn) -> None:
        if job.mode == "tunnel" and job.via_proxy:
            if send(c, connect_req):
                c.state = 1
                ep.modify(c.sock.fileno(), select.EPOLLIN)
        elif send(c, get_req):
            c.state = 2
            ep.modify(c.sock.fileno(), select.EPOLLIN)

    def open_one() -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c = _Conn(s, 0)
        fd = s.fileno()
        conns[fd] = c
        err = s.connect_ex(addr)
        ep.register(fd, select.EPOLLOUT)
        if err == 0:
            connected(c)
        elif err != errno.EINPROGRESS:
            fail(c, f"connect: {os.strerror(err)}")

    while time.monotonic() < job.start_at:
        time.sleep(min(0.01, max(0.0, job.start_at - time.monotonic())))
    for _ in range(job.conns):
        open_one()
    while True:
        now = time.monotonic()
        if now >= end:
            break
        for fd, _ev in ep.poll(min(0.05, end - now)):
            c = conns.get(fd)
            if c is None:
                continue
            if c.state == 0:
                err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    fail(c, f"connect: {os.strerror(err)}")
                else:
                    connected(c)
                continue
            try:
                data = c.sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError as exc:
                fail(c, f"recv: {exc}")
                continue
            if not data:
                fail(c, f"closed by peer in state {c.state} after {len(c.buf)} bytes")
                continue
            c.buf += data
            if c.state == 1:
                if b"\r\n\r\n" not in c.buf:
                    continue
                if not c.buf.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
                    fail(c, f"CONNECT answered {bytes(c.buf[:100])!r}")
                    continue
                c.buf.clear()
                if send(c, get_req):
                    c.state = 2
                continue
            if c.need < 0:
                head_end = c.buf.find(b"\r\n\r\n")
                if head_end < 0:
                    continue
                head = bytes(c.buf[:head_end]).lower()
                if not head.startswith(b"http/1.1 200"):
                    fail(c, f"response {head[:100]!r}")
                    continue
                match = re.search(rb"\r\ncontent-length:\s*(\d+)", head)
                if match is None:
                    fail(c, "no content-length")
                    continue
                c.need = head_end + 4 + int(match.group(1))
            if len(c.buf) < c.need:
                continue
            if time.monotonic() < end:
                done += 1
            c.buf.clear()
            c.need = -1
            if job.mode == "keepalive":
                send(c, get_req)
            else:
                close(c)
                open_one()
    for c in list(conns.values()):
        close(c)
    ep.close()
    return done, errors, first_error


def _worker_init() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's clean-up handler
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


def run_load(
    mode: str, port: int, origin: int, via_proxy: bool, duration: float, procs: int
) -> tuple[float, int, str]:
    """Completed operations per second, errors, first error."""
    ctx = multiprocessing.get_context("fork")
    per = [CONCURRENCY // procs + (1 if i < CONCURRENCY % procs else 0) for i in range(procs)]
    start_at = time.monotonic() + 0.2
    jobs = [LoadJob(mode, port, origin, via_proxy, n, start_at, duration) for n in per]
    pool = ctx.Pool(procs, initializer=_worker_init)
    finished = False
    try:
        results = pool.map(_load_worker, jobs)
        finished = True
    finally:
        if finished:
            pool.close()
        else:
            pool.terminate()
        pool.join()
    done = sum(r[0] for r in results)
    errors = sum(r[1] for r in results)
    first = next((r[2] for r in results if r[2]), "")
    return done / duration, errors, first


@dataclass
class BulkJob:
    port: int
    origin: int
    via_proxy: bool
    start_at: float
    duration: float


def _read_head(s: socket.socket) -> tuple[bytes, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise OSError("closed before the end of a head")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


def _bulk_worker(job: BulkJob) -> tuple[int, float]:
    """Fetch /10m, each through a new tunnel, until the time is up.

    Returns (bytes received, when the last body was complete); a body that
    started in time is finished and counted.
    """
    origin = f"127.0.0.1:{job.origin}"
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    total = 0
    while time.monotonic() < job.start_at:
        time.sleep(0.001)
    end = job.start_at + job.duration
    while not total or time.monotonic() < end:
        with socket.create_connection(("127.0.0.1", job.port)) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if job.via_proxy:
                s.sendall(f"CONNECT {origin} HTTP/1.1\r\nHost: {origin}\r\n\r\n".encode())
                head, rest = _read_head(s)
                if not head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")) or rest:
                    raise OSError(f"CONNECT answered {head[:100]!r}")
            s.sendall(f"GET /10m HTTP/1.1\r\nHost: {origin}\r\nConnection: close\r\n\r\n".encode())
            head, rest = _read_head(s)
            match = re.search(rb"\r\ncontent-length:\s*(\d+)", head.lower())
            if not head.startswith(b"HTTP/1.1 200") or match is None:
                raise OSError(f"GET /10m answered {head[:100]!r}")
            length = int(match.group(1))
            got = len(rest)
            while got < length:
                n = s.recv_into(view)
                if not n:
                    raise OSError(f"body ended after {got} of {length} bytes")
                got += n
            total += got
    return total, time.monotonic()


def run_bulk(
    port: int, origin: int, via_proxy: bool, procs: int, duration: float
) -> tuple[float, float]:
    """(MB/s, MB) over ``procs`` clients fetching 10 MB bodies for ``duration`` (MB: 10**6)."""
    ctx = multiprocessing.get_context("fork")
    start_at = time.monotonic() + 0.2
    jobs = [BulkJob(port, origin, via_proxy, start_at, duration) for _ in range(procs)]
    pool = ctx.Pool(procs, initializer=_worker_init)
    finished = False
    try:
        results = pool.map(_bulk_worker, jobs)
        finished = True
    finally:
        if finished:
            pool.close()
        else:
            pool.terminate()
        pool.join()
    elapsed = max(r[1] for r in results) - start_at
    total = sum(r[0] for r in results) / 1e6
    return total / elapsed, total


def run_wrk(
    wrk: str, lua: str, port: int, target: str, host: str, duration: float, threads: int
) -> dict[str, int]:
    env = {**os.environ, "BENCH_TARGET": target, "BENCH_HOST": host}
    argv = [
        wrk, "-t", str(threads), "-c", str(CONCURRENCY), "-d", f"{max(1, round(duration))}s",
        "-s", lua, f"http://127.0.0.1:{port}/1k",
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=duration + 60)
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            result: dict[str, int] = json.loads(line[len(MARK) :])
            return result
    raise BenchError(f"wrk failed ({proc.returncode}): {proc.stdout[-500:]} {proc.stderr[-500:]}")


def count_lines(path: str) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


# -- the rounds -------------------------------------------------------------------

VARIANTS = ("direct", "squid", "corral")


@dataclass
class Cell:
    values: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""
    cpu_us_per_op: list[float] = field(default_factory=list)  # proxy CPU per operation
    logged: list[float] = field(default_factory=list)  # proxy log lines / operations

    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")


@dataclass
class Row:
    key: str
    title: str
    unit: str
    cells: dict[str, Cell] = field(default_factory=lambda: {v: Cell() for v in VARIANTS})


@dataclass
class Latency:
    samples: dict[str, list[int]] = field(default_factory=dict)
    round_p50: dict[str, list[float]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)


def rotated(items: tuple[str, ...], k: int) -> list[str]:
    k %= len(items)
    return list(items[k:] + items[:k])


class Bench:
    def __init__(self, args: argparse.Namespace, srv: Servers) -> None:
        self.args = args
        self.srv = srv
        self.procs = max(1, min(os.cpu_count() or 1, 4))
        self.rows = [
            Row("keepalive", f"1. keep-alive GET 1 KB, {CONCURRENCY} conns", "req/s"),
            Row("tunnels", f"2. new CONNECT tunnel + 1 GET, {CONCURRENCY} clients", "tunnels/s"),
            Row("bulk", "3a. 10 MB bodies via CONNECT, 1 client", "MB/s"),
            Row("bulk4", "3b. 10 MB bodies via CONNECT, 4 clients", "MB/s"),
        ]
        self.latency = Latency()
        self.wrk = _sbin("wrk") if args.loadgen == "wrk" else None
        self.lua = os.path.join(srv.tmp, "proxy_absolute.lua")
        with open(self.lua, "w", encoding="ascii") as fh:
            fh.write(WRK_LUA)

    def port_of(self, variant: str) -> int:
        return {
            "direct": self.srv.origin_port,
            "squid": self.srv.squid_port,
            "corral": self.srv.corral_port,
        }[variant]

    def service_of(self, variant: str) -> Service | None:
        return {"squid": self.srv.squid, "corral": self.srv.corral}.get(variant)

    def log_of(self, variant: str) -> str:
        return {"squid": self.srv.squid_log, "corral": self.srv.corral_log}.get(variant, "")

    def measure(self, row: Row, variant: str, duration: float, record: bool = True) -> None:
        port = self.port_of(variant)
        if not port:  # squid could not run here
            return
        via = variant != "direct"
        origin = self.srv.origin_port
        svc = self.service_of(variant)
        log = self.log_of(variant)
        cpu0 = svc.cpu_seconds() if svc else 0.0
        lines0 = count_lines(log) if log else 0
        cell = row.cells[variant]
        ops = 0.0
        try:
            if row.key == "keepalive":
                if self.wrk is not None:
                    target = f"http://127.0.0.1:{origin}/1k" if via else ""
                    res = run_wrk(
                        self.wrk, self.lua, port, target, f"127.0.0.1:{origin}",
                        duration, self.args.wrk_threads,
                    )  # fmt: skip
                    errs = sum(res[k] for k in ("connect", "read", "write", "status", "timeout"))
                    value = res["requests"] / (res["duration_us"] / 1e6)
                    ops = res["requests"]
                    if res["requests"] and res["bytes"] / res["requests"] < SMALL:
                        errs += 1
                        cell.first_error = cell.first_error or "responses shorter than 1 KB"
                    if errs:
                        cell.first_error = cell.first_error or f"wrk errors: {res}"
                else:
                    value, errs, first = run_load(
                        "keepalive", port, origin, via, duration, self.procs
                    )
                    ops = value * duration
                    cell.first_error = cell.first_error or first
            elif row.key == "tunnels":
                mode = "tunnel" if via else "new"
                value, errs, first = run_load(mode, port, origin, via, duration, self.procs)
                ops = value * duration
                cell.first_error = cell.first_error or first
            else:
                procs = 1 if row.key == "bulk" else 4
                value, ops = run_bulk(port, origin, via, procs, duration)  # ops: MB
                errs = 0
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            cell.errors += 1
            cell.first_error = cell.first_error or f"{type(exc).__name__}: {exc}"
            return
        if not record:
            return
        cell.values.append(value)
        cell.errors += errs
        if svc is not None and ops:
            cell.cpu_us_per_op.append((svc.cpu_seconds() - cpu0) * 1e6 / ops)
        if log and ops and row.key in ("keepalive", "tunnels"):
            if variant == "squid":
                time.sleep(0.2)  # squid's stdio log is buffered
            cell.logged.append((count_lines(log) - lines0) / ops)

    def latency_round(self, k: int, corral: str, python: str) -> None:
        origin = self.srv.origin_port
        absolute = f"http://127.0.0.1:{origin}/1k"
        host = f"127.0.0.1:{origin}"
        n, warm = str(self.args.lat_requests), str(LAT_WARMUP)
        ws = os.path.join(self.srv.tmp, "workspace")
        os.makedirs(ws, exist_ok=True)
        state = os.path.join(self.srv.tmp, "state")
        variants = {
            "host → origin (direct)": [python, "-c", LAT_SCRIPT, "127.0.0.1", str(origin),
                                       "/1k", host, n, warm],
            "host → squid": [python, "-c", LAT_SCRIPT, "127.0.0.1", str(self.srv.squid_port),
                             absolute, host, n, warm],
            "host → corral proxy serve": [python, "-c", LAT_SCRIPT, "127.0.0.1",
                                          str(self.srv.corral_port), absolute, host, n, warm],
            "sandbox → proxy (per-run)": [
                corral, "run", "-q", "--allow", host,
                "--net-log", os.path.join(self.srv.tmp, "door-net.jsonl"),
                "--log", os.path.join(self.srv.tmp, "runs.jsonl"),
                "--", "python3", "-c", LAT_SCRIPT, "127.0.0.1", "3128", absolute, host, n, warm,
            ],
        }  # fmt: skip
        env = {**os.environ, "XDG_STATE_HOME": state}
        if not self.srv.squid_port:
            del variants["host → squid"]
        for name in rotated(tuple(variants), k):
            if name in self.latency.failures:
                continue
            try:
                proc = subprocess.run(
                    variants[name], capture_output=True, text=True, cwd=ws, env=env, timeout=120
                )
            except subprocess.TimeoutExpired:
                self.latency.failures[name] = "timed out"
                continue
            try:
                values = [int(x) for x in proc.stdout.split()]
            except ValueError:
                values = []
            if proc.returncode != 0 or len(values) != self.args.lat_requests:
                why = (proc.stderr or proc.stdout).strip()[-300:]
                self.latency.failures[name] = f"exit {proc.returncode}: {why}"
                continue
            self.latency.samples.setdefault(name, []).extend(values)
            self.latency.round_p50.setdefault(name, []).append(statistics.median(values))

    def run(self, corral: str, python: str) -> None:
        warm = min(1.0, self.args.duration)
        for row in self.rows[:2]:  # one short unrecorded pass: connections, caches, code paths
            for variant in VARIANTS:
                self.measure(row, variant, warm, record=False)
        for k in range(self.args.rounds):
            print(f"bench: round {k + 1}/{self.args.rounds}", file=sys.stderr)
            for row in self.rows:
                for variant in rotated(VARIANTS, k):
                    self.measure(row, variant, self.args.duration)
            self.latency_round(k, corral, python)


# -- profile (optional) ----------------------------------------------------------------


def _frame(raw: str) -> tuple[str, str]:
    """py-spy's ``func (/path/file.py:line)`` -> (``func (file.py)``, path)."""
    name, _, where = raw.partition(" (")
    path = where.rpartition(":")[0]
    return f"{name} ({os.path.basename(path)})", path


def summarize_profile(path: str, top: int) -> list[str]:
    """Self and inclusive shares of the busiest functions in a py-spy raw file."""
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not count.isdigit():
                continue
            n = int(count)
            total += n
            frames = [_frame(f)[0] for f in stack.split(";") if f]
            if not frames:
                continue
            own[frames[-1]] = own.get(frames[-1], 0) + n
            for name in set(frames):
                incl[name] = incl.get(name, 0) + n
    if not total:
        return ["(no samples)"]
    skip = ("<module>", "entry (", "main (cli", "cmd_proxy", "run (runners", "Runner.run",
            "run_until_complete", "run_forever", "_run_once", "Handle._run")  # fmt: skip
    busiest = [k for k, _ in sorted(incl.items(), key=lambda kv: -kv[1])]
    busiest = [k for k in busiest if not any(part in k for part in skip)][:top]
    lines = [f"{total} samples.", "", "| function | self % | inclusive % |", "|---|---:|---:|"]
    for name in sorted(own, key=lambda k: -own[k])[:top]:
        lines.append(
            f"| `{name}` | {100 * own[name] / total:.1f} | {100 * incl[name] / total:.1f} |"
        )
    lines += ["", "| function (by inclusive share) | inclusive % |", "|---|---:|"]
    lines += [f"| `{name}` | {100 * incl[name] / total:.1f} |" for name in busiest]
    return lines


def profile_section(bench: Bench, py_spy: str) -> str:
    """Run rows 1, 2 and 3a once more for corral with py-spy attached to its proxy."""
    svc = bench.srv.corral
    if svc is None:
        return ""
    if shutil.which(py_spy) is None:
        return f"\n(no profile: {py_spy} not found; `pip install py-spy`)\n"
    out = [
        "",
        "## Where corral's proxy spends its time (py-spy)",
        "",
        "Each row run once more, corral only, with `py-spy record --rate 250 --format raw` "
        "attached to `corral proxy serve` (not timed). A frame's self share includes the "
        "system calls it makes (socket send and receive, the audit log's write).",
    ]
    seconds = max(2.0, bench.args.duration)
    for row in bench.rows[:3]:
        raw = os.path.join(bench.srv.tmp, f"profile-{row.key}.txt")
        spy = subprocess.Popen(
            [py_spy, "record", "--rate", "250", "--format", "raw", "--output", raw,
             "--pid", str(svc.proc.pid), "--duration", str(round(seconds + 1))],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        try:
            time.sleep(0.5)  # attached
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                bench.measure(row, "corral", seconds, record=False)
            spy.wait(timeout=seconds + 30)
        finally:
            if spy.poll() is None:
                os.killpg(spy.pid, signal.SIGKILL)
                spy.wait()
        out += ["", f"### {row.title}", ""]
        if os.path.exists(raw):
            out += summarize_profile(raw, 12)
        else:
            out.append(f"(py-spy wrote nothing; exit {spy.returncode})")
    out.append("")
    return "\n".join(out)


# -- report ------------------------------------------------------------------------


def machine_line(srv: Servers) -> str:
    cpu = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    squid = _sbin("squid")
    squid_v = ""
    if squid:
        out = subprocess.run([squid, "-v"], capture_output=True, text=True).stdout
        squid_v = out.split("Version", 1)[-1].splitlines()[0].strip() if "Version" in out else "?"
    wrk = _sbin("wrk")
    wrk_v = ""
    if wrk:
        done = subprocess.run([wrk, "-v"], capture_output=True, text=True)
        words = (done.stdout + done.stderr).split()
        wrk_v = words[1] if len(words) > 1 else "?"
    return (
        f"machine: {platform.system()} {platform.release()} · {cpu} · nproc {os.cpu_count()} · "
        f"Python {platform.python_version()} · squid {squid_v or 'missing'} · "
        f"origin {srv.origin_kind} · wrk {wrk_v or 'missing (Python load generator)'}"
    )


def _fmt(value: float) -> str:
    if value != value:  # NaN: no measurement
        return "—"
    return f"{value:,.0f}"


def _ratio(a: float, b: float) -> str:
    if a != a or b != b or not b:
        return "—"
    return f"{a / b:.2f}x"


def _pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    idx = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return float(ordered[idx])


def report(bench: Bench, args: argparse.Namespace, started: float) -> str:
    srv = bench.srv
    out = ["# corral proxy throughput", "", machine_line(srv), ""]
    gen = (
        f"wrk, {args.wrk_threads} thread(s), Lua script for the absolute-form path"
        if bench.wrk
        else f"Python epoll load generator, {bench.procs} processes"
    )
    out.append(
        f"{args.rounds} interleaved round(s), {args.duration:g} s per cell, median over "
        f"rounds; {time.monotonic() - started:.0f} s in all. Row 1: {gen}; row 2: Python "
        f"epoll load generator, {bench.procs} processes; row 3: Python clients, a new "
        "tunnel per 10 MB body (MB = 10⁶ bytes). "
        "corral: `corral proxy serve` (TCP listener, audit log to a file); squid: private "
        "instance, `cache deny all`, access log to a file, `workers 1`."
    )
    out += [
        "",
        "| row | unit | direct | squid | corral | corral/squid | corral/direct | goal | status |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in bench.rows:
        med = {v: row.cells[v].median() for v in VARIANTS}
        corral, squid = med["corral"], med["squid"]
        if corral == corral and squid == squid and squid:
            status = "MET" if corral / squid >= GOAL_RATIO else "NOT MET"
        else:
            status = "no data"
        out.append(
            f"| {row.title} | {row.unit} | {_fmt(med['direct'])} | "
            f"{_fmt(squid)} | {_fmt(corral)} | {_ratio(corral, squid)} | "
            f"{_ratio(corral, med['direct'])} | ≥ {GOAL_RATIO:.1f}x squid | {status} |"
        )
    lat = bench.latency.samples
    direct_name, door_name = "host → origin (direct)", "sandbox → proxy (per-run)"
    serve_name, squid_name = "host → corral proxy serve", "host → squid"
    p50 = {name: _pct(values, 0.5) for name, values in lat.items()}
    added = p50.get(door_name, float("nan")) - p50.get(direct_name, float("nan"))
    met = added / 1000 <= GOAL_ADDED_MS
    status = "no data" if added != added else ("MET" if met else "NOT MET")
    door_ms = "—" if added != added else f"{added / 1000:.3f}"
    squid_added = p50.get(squid_name, float("nan")) - p50.get(direct_name, float("nan"))
    squid_ms = "—" if squid_added != squid_added else f"{squid_added / 1000:.3f}"
    out.append(
        f"| 4. added p50 latency of one small GET via the door | ms | 0 | {squid_ms} | "
        f"{door_ms} | — | — | ≤ {GOAL_ADDED_MS} ms | {status} |"
    )
    out += [
        "",
        "Reference from the issue (same machine): squid "
        + " / ".join(f"{REFERENCE[k][1]:,.0f}" for k in ("keepalive", "tunnels", "bulk"))
        + ", direct "
        + " / ".join(f"{REFERENCE[k][0]:,.0f}" for k in ("keepalive", "tunnels", "bulk"))
        + " (rows 1 / 2 / 3a). Row 4's squid column is host → squid, for scale.",
        "",
        "## Per round, and proxy CPU per operation",
        "",
        "| row | variant | per round | errors | proxy CPU µs per op (request, tunnel, MB) "
        "| log lines per op |",
        "|---|---|---|---:|---:|---:|",
    ]
    for row in bench.rows:
        for v in VARIANTS:
            cell = row.cells[v]
            rounds = ", ".join(_fmt(x) for x in cell.values) or "—"
            cpu = f"{statistics.median(cell.cpu_us_per_op):.1f}" if cell.cpu_us_per_op else "—"
            logged = f"{statistics.median(cell.logged):.3f}" if cell.logged else "—"
            out.append(f"| {row.title} | {v} | {rounds} | {cell.errors} | {cpu} | {logged} |")
    errors = [
        f"- {row.title}, {v}: {row.cells[v].first_error}"
        for row in bench.rows
        for v in VARIANTS
        if row.cells[v].first_error
    ]
    if errors:
        out += ["", "First error per cell:", "", *errors]
    out += [
        "",
        f"## Latency of one small GET on a keep-alive connection "
        f"({args.lat_requests} per loop after {LAT_WARMUP} warm-up, "
        f"{args.rounds} round(s))",
        "",
        "| path | p50 µs | p99 µs | mean µs | added p50 vs direct µs | p50 per round µs |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name in (direct_name, squid_name, serve_name, door_name):
        values = lat.get(name)
        if not values:
            failure = bench.latency.failures.get(name, "")
            out.append(f"| {name} | — | — | — | — | {failure} |")
            continue
        extra = p50[name] - p50.get(direct_name, float("nan"))
        per_round = ", ".join(f"{x:.0f}" for x in bench.latency.round_p50.get(name, []))
        out.append(
            f"| {name} | {p50[name]:.0f} | {_pct(values, 0.99):.0f} | "
            f"{statistics.fmean(values):.0f} | {extra:+.0f} | {per_round} |"
        )
    if serve_name in p50 and door_name in p50 and direct_name in p50:
        out += [
            "",
            f"Split of the door's added p50: proxy {p50[serve_name] - p50[direct_name]:.0f} µs "
            f"(`corral proxy serve` minus direct), the sandbox's side "
            f"{p50[door_name] - p50[serve_name]:.0f} µs (sandbox minus `corral proxy serve`: "
            "the per-run proxy's two workers and the namespace's loopback).",
        ]
    out.append("")
    return "\n".join(out)


# -- main -------------------------------------------------------------------------


def default_corral() -> str:
    beside = Path(sys.executable).parent / "corral"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("corral") or str(
        Path(__file__).resolve().parent.parent / ".venv" / "bin" / "corral"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.proxy_throughput", description=__doc__)
    p.add_argument("--duration", type=float, default=None, help="seconds per cell (default 5)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3)")
    p.add_argument("--quick", action="store_true", help="1 round of 2 s cells (~1 minute)")
    p.add_argument("--lat-requests", type=int, default=LAT_REQUESTS)
    p.add_argument("--wrk-threads", type=int, default=1)
    p.add_argument("--corral", default=default_corral())
    p.add_argument(
        "--python",
        default=shutil.which("python3") or sys.executable,
        help="interpreter of the host latency loops (the sandbox runs python3)",
    )
    p.add_argument("--no-install", action="store_true", help="do not apt-get missing tools")
    p.add_argument(
        "--profile",
        metavar="PY_SPY",
        nargs="?",
        const=shutil.which("py-spy") or "py-spy",
        default=None,
        help="afterwards, profile corral's proxy per row with this py-spy binary",
    )
    p.add_argument(
        "--loadgen",
        choices=("wrk", "python"),
        default="wrk",
        help="row 1's load generator (python: the epoll one of row 2; used when wrk is missing)",
    )
    p.add_argument(
        "--origin",
        choices=("nginx", "python"),
        default="nginx",
        help="origin server (python: a small asyncio one; used when nginx cannot run)",
    )
    args = p.parse_args(argv)
    if args.duration is None:
        args.duration = 2.0 if args.quick else 5.0
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    return args


def _on_signal(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def services() -> Iterator[None]:
    old: dict[signal.Signals, Callable[[int, object], None] | int | None] = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        old[sig] = signal.signal(sig, _on_signal)  # type: ignore[assignment]
    try:
        yield
    finally:
        started = list(LIVE)
        for svc in reversed(started):
            svc.stop()
        left = [svc.name for svc in started if _group_alive(svc.proc.pid)]
        if left:
            print(f"bench: still running after kill: {', '.join(left)}", file=sys.stderr)
        for sig, handler in old.items():
            signal.signal(sig, handler)


def measure(args: argparse.Namespace) -> tuple[Bench, str]:
    """Start the servers, run every row, stop them; the bench and its report."""
    if not args.no_install:
        ensure_tools({"squid": "squid", "wrk": "wrk", "nginx": "nginx-light"})
    started = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="corral-proxy-bench-")
    os.chmod(tmp, 0o755)  # nginx's and squid's workers run as other users when we are root
    try:
        with services():
            srv = Servers(tmp)
            start_origin(srv, args.origin)
            try:
                start_squid(srv)
            except (BenchError, OSError) as exc:
                print(f"bench: squid cannot run, its column stays empty: {exc}", file=sys.stderr)
                srv.squid_port = 0
            start_corral(srv, args.corral)
            for port in (None, srv.squid_port, srv.corral_port):
                if port != 0:
                    check_small(srv, port)
            bench = Bench(args, srv)
            bench.run(args.corral, args.python)
            text = report(bench, args, started)
            if args.profile:
                text += profile_section(bench, args.profile)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return bench, text


def rows(quick: bool) -> list[BenchRow]:
    """Throughput of corral's proxy next to squid and direct, and the door's added latency."""
    from bench.common import Row as BenchRow

    args = parse_args(["--quick"] if quick else [])
    try:
        bench, _text = measure(args)
    except (BenchError, OSError) as exc:
        return [BenchRow("proxy", "corral proxy serve", None, "req/s", note=str(exc))]
    out: list[BenchRow] = []
    names = {"direct": "direct to origin", "squid": "squid", "corral": "corral proxy serve"}
    for row in bench.rows:
        title = f"proxy: {row.title.split('. ', 1)[-1]}"
        for v in VARIANTS:
            cell = row.cells[v]
            value = cell.median() if cell.values else None
            note = cell.first_error if value is None or cell.errors else ""
            base = "squid" if v == "corral" else ("direct to origin" if v == "squid" else "")
            out.append(BenchRow(title, names[v], value, row.unit, base, note[:200], False))
    lat = bench.latency.samples
    direct = _pct(lat.get("host → origin (direct)", []), 0.5)
    for name in ("host → squid", "host → corral proxy serve", "sandbox → proxy (per-run)"):
        p50 = _pct(lat.get(name, []), 0.5)
        value = None if p50 != p50 or direct != direct else (p50 - direct) / 1000
        note = bench.latency.failures.get(name, "")
        out.append(BenchRow("proxy: added p50 latency, one small GET", name, value, "ms", "", note))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        _bench, text = measure(args)
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 0
    except KeyboardInterrupt:
        print("bench: interrupted; servers stopped", file=sys.stderr)
        return 130
    print(text, end="")
    write_result(RESULTS, text)
    print(f"(written to {RESULTS})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
