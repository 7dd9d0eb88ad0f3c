"""What ``[[network.rules]]`` and ``[secrets]`` cost in corral's proxy.

Run from the repository root::

    python -m bench.rules_cost [--duration S] [--rounds N] [--connections N]

Keep-alive requests/s through one proxy worker (a process of its own, as in a
run), 32 connections, small GETs to an origin on 127.0.0.1, side by side:

* plain HTTP: host rules only, then with a method/path rule pair (allow GET
  ``/api/**``, deny ``/api/admin/**``) and a secret whose placeholder each
  request carries in a header and whose ``header`` the proxy sets;
* HTTPS through corral's interception: ``[tls] inspect`` alone (interception,
  no rule), then the same rules and secret (which need interception anyway).

The variants run in interleaved rounds (a slow stretch of the machine hits them
alike); the median of the rounds is reported with the ratio, and the best
round's CPU per request (on a shared machine the least disturbed one).  The
client is one process of raw asyncio protocols that counts fixed-size
responses, so it costs the proxy as little as it can.

``--instructions`` counts the same in-process exchanges' instructions with
valgrind: a figure that does not move with the machine's load.

``--in-process`` measures the hooks alone: one process drives the real
``Proxy.exchange`` over in-memory streams (no sockets, no TLS, an upstream
that answers at once), interleaved rounds, CPU µs per exchange; the difference
between variants is what the hooks cost per request, with little of the noise
of sockets and other processes.  ``--distinct`` gives every request its own
URL there (no decision is ever reused).

A benchmark, not a test: exit 0 either way.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

HOST = "api.test"
TARGET = "/api/items"
BODY = b"ok"


# -- the origin --------------------------------------------------------------------------------


class _OriginProtocol(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        count = self.buffer.count(b"\r\n\r\n")
        if count:
            self.buffer = self.buffer[self.buffer.rfind(b"\r\n\r\n") + 4 :]
            reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
            self.transport.write(reply * count)  # type: ignore[attr-defined]


def _origin(port_plain: int, port_tls: int, cert: str, key: str) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(_OriginProtocol, "127.0.0.1", port_plain)
        await loop.create_server(_OriginProtocol, "127.0.0.1", port_tls, ssl=context)
        await asyncio.Event().wait()

    _run(main())


def _run(main: object) -> None:
    try:
        import uvloop  # type: ignore[import-not-found, unused-ignore]

        uvloop.run(main)  # type: ignore[arg-type]
    except ImportError:
        asyncio.run(main)  # type: ignore[arg-type]


# -- the proxy ---------------------------------------------------------------------------------


def _policy(variant: str, origin_ca: str) -> object:
    from corral.policy import Policy, Secret

    policy = Policy(tempfile.gettempdir())
    policy.network.mode = "proxy"
    policy.network.allow = [HOST, "127.0.0.1"]
    policy.network.hosts = {HOST: "127.0.0.1"}
    policy.tls.upstream_ca = [origin_ca]
    policy.tls.ca = "ephemeral"
    if variant.startswith("tls"):
        policy.tls.inspect = [HOST]
    if variant.endswith(("rules", "only", "elsewhere")):
        policy.network.rules = [
            {"host": HOST, "methods": ["GET"], "paths": ["/api/**"], "action": "allow"},
            {"host": HOST, "paths": ["/api/admin/**"], "action": "deny"},
        ]
    if variant.endswith(("rules", "elsewhere")):
        # ports named: plain HTTP too (a bare name is HTTPS only); "elsewhere": the
        # secrets go to another host, as an API key does while a tool fetches packages
        target = "other.test" if variant.endswith("elsewhere") else HOST
        hosts = [f"{target}:1-65535"]
        policy.secrets = {
            "KEY": Secret("KEY", "env:BENCH_REAL_KEY", hosts),
            "TOKEN": Secret(
                "TOKEN", "env:BENCH_REAL_KEY", hosts, "authorization", "Bearer {value}"
            ),
        }
    return policy


def _proxy(variant: str, port: int, origin_ca: str, out: str) -> None:
    """One proxy worker, as a run's door forks it; writes the placeholder and
    the CA's certificate for the client to ``out``."""
    os.environ["BENCH_REAL_KEY"] = "sk-bench-" + "x" * 40
    from corral.net.audit import Audit
    from corral.net.ca import ca_for
    from corral.net.hooks import chain_for
    from corral.net.proxy import Proxy
    from corral.net.tls import Interceptor
    from corral.net.trust import UpstreamTrust

    policy = _policy(variant, origin_ca)
    chain = chain_for(policy)  # type: ignore[arg-type]
    chain.open()
    ca = ca_for(policy.tls, tempfile.gettempdir())  # type: ignore[attr-defined]
    placeholder = chain.sandbox_env().get("KEY", "none")
    if variant.endswith("elsewhere"):  # a request that carries no key, to a host that gets none
        placeholder = "none"
    Path(out).write_bytes(placeholder.encode() + b"\n" + ca.cert_pem)

    from corral.net import aio

    async def main() -> None:  # on the proxy's own event loop, as in a run
        tls = Interceptor(ca, UpstreamTrust([Path(origin_ca).read_text()], None))
        proxy = Proxy(chain, Audit(None), policy.network.hosts, tls=tls)  # type: ignore[attr-defined]
        await proxy.serve_tcp("127.0.0.1", port, "bench")
        await aio.Event().wait()

    aio.run(main())


# -- the client --------------------------------------------------------------------------------


class _Client(asyncio.Protocol):
    """Sends one request, waits for one whole response, repeats; counts them."""

    def __init__(self, request: bytes, counter: list[int], deadline: float) -> None:
        self.request = request
        self.counter = counter
        self.deadline = deadline
        self.buffer = b""
        self.need = 0
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.tunnel = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.tunnel:  # the CONNECT reply
            self.tunnel = False
            if not self.ready.done():
                self.ready.set_result(data)
            return
        self.buffer += data
        while True:
            if not self.need:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = self.buffer[:end].lower()
                at = head.find(b"content-length:")
                length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
                self.need = end + 4 + length
            if len(self.buffer) < self.need:
                return
            self.buffer = self.buffer[self.need :]
            self.need = 0
            self.counter[0] += 1
            if time.monotonic() < self.deadline and self.transport is not None:
                self.transport.write(self.request)
            elif self.transport is not None:
                self.transport.close()
                return


async def _load(
    proxy: int, origin: int, tls: bool, placeholder: str, ca_pem: bytes, conns: int, seconds: float
) -> int:
    loop = asyncio.get_running_loop()
    counter = [0]
    deadline = time.monotonic() + seconds
    context = None
    if tls:
        context = ssl.create_default_context(cadata=ca_pem.decode())
        target = TARGET.encode()
    else:
        target = f"http://{HOST}:{origin}{TARGET}".encode()
    request = b"GET %s HTTP/1.1\r\nHost: %s:%d\r\nX-Key: %s\r\n\r\n" % (
        target,
        HOST.encode(),
        origin,
        placeholder.encode(),
    )

    async def one() -> None:
        transport, client = await loop.create_connection(
            lambda: _Client(request, counter, deadline), "127.0.0.1", proxy
        )
        if tls:
            assert context is not None
            client.tunnel = True
            transport.write(b"CONNECT %s:%d HTTP/1.1\r\n\r\n" % (HOST.encode(), origin))
            await client.ready
            wrapped = await loop.start_tls(transport, client, context, server_hostname=HOST)
            assert wrapped is not None
            transport = client.transport = wrapped
        transport.write(request)

    await asyncio.gather(*(one() for _ in range(conns)))
    await asyncio.sleep(max(0.0, deadline - time.monotonic()) + 0.2)
    return counter[0]


def _client(args: tuple[int, int, bool, str, bytes, int, float], queue: object) -> None:
    count = asyncio.run(_load(*args))
    queue.put(count)  # type: ignore[attr-defined]


# -- the run -----------------------------------------------------------------------------------

VARIANTS = (
    ("plain", "http", "host rules only"),
    ("plain-rules-only", "http", "+ method/path rules"),
    ("plain-rules", "http", "+ method/path rules and secrets"),
    ("tls-inspect", "https", "interception alone ([tls] inspect)"),
    ("tls-rules-only", "https", "+ method/path rules"),
    ("tls-rules", "https", "+ method/path rules and secrets"),
    ("tls-rules-elsewhere", "https", "+ method/path rules, secrets for another host"),
)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _origin_files(directory: Path) -> tuple[str, str, str]:
    """A throwaway CA and a certificate for HOST signed by it: (CA, cert, key) paths."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)  # noqa: UP017 (cryptography 38 too)

    def issue(
        subject: str,
        key: ec.EllipticCurvePrivateKey,
        signer: ec.EllipticCurvePrivateKey,
        issuer: str,
        ca: bool,
    ) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(HOST)]), critical=False
            )
        return builder.sign(signer, hashes.SHA256())

    ca_key, leaf_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    ca = issue("bench origin CA", ca_key, ca_key, "bench origin CA", True)
    leaf = issue(HOST, leaf_key, ca_key, "bench origin CA", False)
    pem = serialization.Encoding.PEM
    paths = (directory / "ca.pem", directory / "leaf.pem", directory / "leaf.key")
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(leaf.public_bytes(pem))
    paths[2].write_bytes(
        leaf_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(paths[0]), str(paths[1]), str(paths[2])


def measure(
    duration: float, rounds: int, conns: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    ctx = multiprocessing.get_context("fork")
    results: dict[str, list[float]] = {v: [] for v, _, _ in VARIANTS}
    cpu: dict[str, list[float]] = {v: [] for v, _, _ in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="corral-bench-rules-") as tmp:
        origin_ca, cert, key = _origin_files(Path(tmp))
        plain_port, tls_port = _free_port(), _free_port()
        origin = ctx.Process(target=_origin, args=(plain_port, tls_port, cert, key), daemon=True)
        origin.start()
        proxies = {}
        for variant, _, _ in VARIANTS:
            port = _free_port()
            out = os.path.join(tmp, variant + ".out")
            proc = ctx.Process(target=_proxy, args=(variant, port, origin_ca, out), daemon=True)
            proc.start()
            proxies[variant] = (proc, port, out)
        time.sleep(1.5)
        try:
            for round_no in range(rounds):
                order = VARIANTS[round_no % 2 :] + VARIANTS[: round_no % 2]
                for variant, scheme, _ in order:
                    _, port, out = proxies[variant]
                    placeholder, _, ca_pem = Path(out).read_bytes().partition(b"\n")
                    tls = scheme == "https"
                    queue = ctx.Queue()
                    args = (
                        port,
                        tls_port if tls else plain_port,
                        tls,
                        placeholder.decode(),
                        ca_pem,
                        conns,
                        duration,
                    )
                    pid = proxies[variant][0].pid
                    assert pid is not None
                    before = _cpu_ns(pid)
                    client = ctx.Process(target=_client, args=(args, queue))
                    client.start()
                    count = queue.get(timeout=duration + 30)
                    client.join()
                    results[variant].append(count / duration)
                    spent = _cpu_ns(pid) - before
                    cpu[variant].append(spent / max(count, 1) / 1000)
        finally:
            for proc, _, _ in proxies.values():
                proc.kill()
            origin.kill()
    return results, cpu


def _cpu_ns(pid: int) -> int:
    """Nanoseconds the process has run on a CPU (its own time, whatever else runs)."""
    with open(f"/proc/{pid}/schedstat", encoding="ascii") as fh:
        return int(fh.read().split()[0])


# -- in-process: the hooks alone ---------------------------------------------------------------


class _Sink:
    """A StreamWriter that keeps nothing (what the proxy writes to it is counted)."""

    class _Transport:
        def get_write_buffer_size(self) -> int:
            return 0

    transport = _Transport()

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        pass


async def _exchanges(
    variants: list[str], rounds: int, count: int, distinct: bool
) -> dict[str, list[float]]:
    """CPU µs per Proxy.exchange for each variant, ``rounds`` interleaved rounds."""
    from corral.net import aio, http1
    from corral.net.audit import Audit
    from corral.net.hooks import Destination, chain_for
    from corral.net.proxy import Proxy, Upstream
    from corral.net.rules import Verdict

    os.environ["BENCH_REAL_KEY"] = "sk-bench-" + "x" * 40
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
    setups = {}
    for variant in variants:
        policy = _policy(variant, os.devnull)
        chain = chain_for(policy)  # type: ignore[arg-type]
        chain.open()
        placeholder = chain.sandbox_env().get("KEY", "none").encode()
        if variant.endswith("elsewhere"):
            placeholder = b"none"
        request = http1.parse_request(
            b"GET %s HTTP/1.1\r\nHost: %s:443\r\nX-Key: %s"
            % (TARGET.encode(), HOST.encode(), placeholder)
        )
        upstream = Upstream(HOST, 443, "127.0.0.1", Verdict(True, "bench"))
        upstream.reader, upstream.writer = aio.StreamReader(), _Sink()  # type: ignore[assignment]
        proxy = Proxy(chain, Audit(None), {}, tls=None)
        setups[variant] = (proxy, request, Destination("bench", "connect", HOST, 443), upstream)
    client, sink = aio.StreamReader(), _Sink()
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    for round_no in range(rounds):
        for variant in variants if round_no % 2 == 0 else variants[::-1]:
            proxy, request, conn, upstream = setups[variant]
            start = time.process_time()
            for i in range(count):
                assert upstream.reader is not None
                upstream.reader.feed_data(answer)
                target = (
                    b"%s/%d" % (TARGET.encode(), round_no * count + i)
                    if distinct
                    else TARGET.encode()
                )
                dest = conn.for_request("https", "GET", target.decode())
                await proxy.exchange(client, sink, dest, request, target, upstream)  # type: ignore[arg-type]
            cpu[variant].append((time.process_time() - start) / count * 1e6)
    return cpu


def in_process(args: argparse.Namespace) -> str:
    variants = [v for v, _, _ in VARIANTS if v.startswith("tls")]
    from corral.net import aio

    cpu = aio.run(_exchanges(variants, args.rounds, args.count, args.distinct))
    base = statistics.median(cpu[variants[0]])
    lines = [
        f"In-process `Proxy.exchange` ({args.rounds} interleaved rounds of {args.count}"
        + (", every request its own URL" if args.distinct else "")
        + "): CPU µs per exchange, median (best round); the hooks' cost is the difference.",
        "",
        "| variant | CPU µs/exchange | best round | hooks' µs/request |",
        "|---|---:|---:|---:|",
    ]
    for variant, _, label in VARIANTS:
        if variant in cpu:
            med, best = statistics.median(cpu[variant]), min(cpu[variant])
            lines.append(f"| {label} | {med:.2f} | {best:.2f} | {med - base:+.2f} |")
    return "\n".join(lines) + "\n"


def instructions(args: argparse.Namespace) -> str:
    """Instructions per in-process exchange, counted by valgrind (callgrind): the
    same for every run, whatever else the machine does, so a change of a few
    hundred instructions shows where CPU time on a shared machine cannot.  Each
    variant runs in its own process at two counts; the difference over the
    difference in count is one exchange's share (start-up cancels out)."""
    import shutil
    import subprocess

    if shutil.which("valgrind") is None:
        return "valgrind is not installed (apt-get install valgrind): no instruction counts\n"
    per: dict[str, float] = {}
    counts = (1000, 3000)
    # bytecode first: a first process that compiles what a change left stale pays
    # for it in one count and not the other (an exchange read 77,000 instructions
    # for 160,000 so)
    root = Path(__file__).resolve().parent.parent
    compile_all = [sys.executable, "-m", "compileall", "-q", "src", "bench"]
    subprocess.run(compile_all, cwd=root, check=False)
    for variant, _, _ in VARIANTS:
        if not variant.startswith("tls"):
            continue
        totals = []
        for count in counts:
            code = (
                "import sys; from bench.rules_cost import _exchanges; from corral.net import aio; "
                f"aio.run(_exchanges([{variant!r}], 1, {count}, {args.distinct}))"
            )
            valgrind = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
            done = subprocess.run(
                [*valgrind, sys.executable, "-c", code],
                env={**os.environ, "PYTHONHASHSEED": "0"},  # (hashing alike in every run)
                capture_output=True,
                text=True,
                check=True,
                cwd=Path(__file__).resolve().parent.parent,
            )
            line = next(x for x in done.stderr.splitlines() if "Collected" in x)
            totals.append(int(line.split()[-1]))
        per[variant] = (totals[1] - totals[0]) / (counts[1] - counts[0])
    base = per["tls-inspect"]
    lines = [
        "Instructions per in-process `Proxy.exchange` (valgrind --tool=callgrind; "
        f"{counts[1]} and {counts[0]} exchanges, the difference over {counts[1] - counts[0]}):",
        "",
        "| variant | instructions/exchange | vs. interception alone | hooks' instructions |",
        "|---|---:|---:|---:|",
    ]
    for variant, _, label in VARIANTS:
        if variant in per:
            n = per[variant]
            lines.append(f"| {label} | {n:,.0f} | {n / base:.3f} | {n - base:+,.0f} |")
    return "\n".join(lines) + "\n"


def report(
    results: dict[str, list[float]], cpu: dict[str, list[float]], args: argparse.Namespace
) -> str:
    med = {k: statistics.median(v) for k, v in results.items()}
    per = {k: statistics.median(v) for k, v in cpu.items()}
    best = {k: min(v) for k, v in cpu.items()}
    # each round's CPU against its own baseline's (run next to it), median over rounds:
    # a slow stretch of a shared machine then weighs on both sides of one ratio
    paired = {
        k: statistics.median(a / b for a, b in zip(v, cpu[_base(k)], strict=True))
        for k, v in cpu.items()
    }
    lines = [
        "# Rules and credentials: cost in the proxy",
        "",
        f"`python -m bench.rules_cost --duration {args.duration:g} --rounds {args.rounds} "
        f"--connections {args.connections}`; one proxy worker, {args.connections} keep-alive "
        f"connections, small GETs; median of {args.rounds} interleaved rounds "
        f"({os.cpu_count()} CPUs, Python {sys.version.split()[0]}).  CPU per request is the "
        "proxy process's own time on a CPU (schedstat) over the requests it served: what a "
        "rule costs, whatever else the machine runs; requests/s depends on that too.",
        "",
        "| variant | requests/s | CPU µs/request | requests/s vs. baseline | CPU vs. baseline "
        "| CPU vs. baseline, paired by round | CPU µs, best round | best vs. baseline |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for variant, scheme, label in VARIANTS:
        base = _base(variant)
        if variant == base:
            rate = cost = pair = low = "baseline"
        else:
            rate = f"{med[variant] / med[base]:.3f}"
            cost = f"{per[variant] / per[base]:.3f}"
            pair = f"{paired[variant]:.3f}"
            low = f"{best[variant] / best[base]:.3f}"
        lines.append(
            f"| {scheme}: {label} | {med[variant]:.0f} | {per[variant]:.1f} | {rate} | {cost} "
            f"| {pair} | {best[variant]:.1f} | {low} |"
        )
    return "\n".join(lines) + "\n"


def _base(variant: str) -> str:
    """The variant a variant is compared with: host rules alone, or interception alone."""
    return "tls-inspect" if variant.startswith("tls") else "plain"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rules_cost")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--in-process", action="store_true", help="the hooks alone (see above)")
    parser.add_argument("--count", type=int, default=5000, help="exchanges per in-process round")
    parser.add_argument("--distinct", action="store_true", help="in-process: a new URL each time")
    parser.add_argument(
        "--instructions", action="store_true", help="in-process, counted by valgrind (see above)"
    )
    args = parser.parse_args(argv)
    if args.instructions:
        print(instructions(args))
        return 0
    if args.in_process:
        print(in_process(args))
        return 0
    results, cpu = measure(args.duration, args.rounds, args.connections)
    text = report(results, cpu, args)
    print(text)
    out = Path(__file__).resolve().parent / "results" / "rules_cost.md"
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
