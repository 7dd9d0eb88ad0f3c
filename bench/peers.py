"""corral next to the peers: Anthropic's sandbox-runtime (``srt``) and OpenAI's
Codex CLI (``codex sandbox``), each set up like corral's default policy.

Run from the repository root::

    python -m bench.peers [--quick] [--install]

``--install`` (``python -m bench --with-peers``) puts the peers' npm packages in
``~/.cache/corral-bench/peers`` and, as root, installs what srt needs (socat,
ripgrep) with apt-get.  Nothing is installed otherwise, and the tests never do.

Each tool gets the same two configurations: the workspace (the current
directory) writable and no network; and the same plus one allowed origin,
``127.0.0.1:PORT``.  Before timing anything, each tool must show it confines:
a write outside the workspace, a direct TCP connection to a host listener, a
read of a planted ``~/.ssh`` key, and a forbidden loopback port through its
proxy are all checked on the host.  The results are reported, not assumed.

All three tools are timed in one interleaved loop (the order rotates each
round), so a noisy stretch on the machine lands on all of them.  Every network
target is on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import Row, median

CACHE = Path(os.environ.get("CORRAL_BENCH_CACHE", str(Path.home() / ".cache" / "corral-bench")))
PEERS_DIR = CACHE / "peers"
PACKAGES = ("@anthropic-ai/sandbox-runtime", "@openai/codex")
# Not part of the requested equivalence (workspace writable, no network, one
# allowed host): reported beside it because the tools' defaults differ here.
SSH_CHECK = "~/.ssh key unreadable (each tool's defaults; outside the equivalence)"
HTTP_SCRIPT = (
    'curl -sS --noproxy "" -x "${HTTP_PROXY:-$http_proxy}" -o /dev/null '
    '-w "%{http_code} %{time_total}" --max-time 10 '
)


def _run(argv: list[str], timeout: float = 600, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kw)  # type: ignore[call-overload, no-any-return]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def install(log: Callable[[str], None]) -> dict[str, str]:
    """Install the peers and their system needs; return {package: why it failed}."""
    failed: dict[str, str] = {}
    missing = [p for p, b in (("socat", "socat"), ("ripgrep", "rg")) if not shutil.which(b)]
    if not shutil.which("npm"):
        missing.append("npm")
    if missing:
        if os.geteuid() != 0:
            failed["system"] = f"missing {', '.join(missing)} (install them, or run as root)"
        else:
            log(f"peers: apt-get install {' '.join(missing)}")
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            _run(["apt-get", "update", "-qq"], env=env)
            out = _run(["apt-get", "install", "-y", "-qq", *missing], env=env)
            if out.returncode != 0:
                failed["system"] = f"apt-get install {' '.join(missing)}: {_last_line(out.stderr)}"
    if not shutil.which("npm"):
        for pkg in PACKAGES:
            failed[pkg] = "npm is not installed"
        return failed
    PEERS_DIR.mkdir(parents=True, exist_ok=True)
    bins = {"@anthropic-ai/sandbox-runtime": "srt", "@openai/codex": "codex"}
    todo = [p for p in PACKAGES if not (PEERS_DIR / "node_modules" / ".bin" / bins[p]).exists()]
    if todo:
        log(f"peers: npm install {' '.join(todo)} into {PEERS_DIR}")
        out = _run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(PEERS_DIR), *todo])
        if out.returncode != 0:
            for pkg in todo:
                failed[pkg] = f"npm install failed: {_last_line(out.stderr)}"
    return failed


@dataclass
class Tool:
    name: str
    version: str = ""
    error: str = ""  # why it cannot run here; empty when it can
    checks: dict[str, str] = field(default_factory=dict)  # check -> "yes" / "NO: ..."
    samples: dict[str, list[float]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)

    def argv(self, script: str, allow: int | None) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return {}


class Corral(Tool):
    def __init__(self, corral: str) -> None:
        super().__init__("corral")
        self.corral = corral
        out = _run([corral, "--version"], timeout=30)
        self.version = out.stdout.strip() or _last_line(out.stderr)

    def argv(self, script: str, allow: int | None) -> list[str]:
        net = ["--allow", f"127.0.0.1:{allow}"] if allow else []
        return [self.corral, "run", "-q", *net, "--", "sh", "-c", script]


class Srt(Tool):
    def __init__(self, scratch: Path) -> None:
        super().__init__("srt (sandbox-runtime)")
        self.bin = PEERS_DIR / "node_modules" / ".bin" / "srt"
        self.scratch = scratch
        self.settings: dict[int | None, Path] = {}
        if not self.bin.exists():
            self.error = f"not installed in {PEERS_DIR} (run with --with-peers)"
            return
        self.version = _last_line(_run([str(self.bin), "--version"], timeout=60).stdout)

    def settings_for(self, allow: int | None) -> Path:
        if allow not in self.settings:
            path = self.scratch / f"srt-{allow or 'none'}.json"
            cfg = {
                "filesystem": {"denyRead": [], "allowWrite": ["."], "denyWrite": []},
                "network": {
                    "allowedDomains": [f"127.0.0.1:{allow}"] if allow else [],
                    "deniedDomains": [],
                },
            }
            path.write_text(json.dumps(cfg))
            self.settings[allow] = path
        return self.settings[allow]

    def argv(self, script: str, allow: int | None) -> list[str]:
        # -c: srt takes the command as one shell string, so no option of the
        # sandboxed command can be mistaken for one of srt's.
        return [str(self.bin), "--settings", str(self.settings_for(allow)), "-c", script]


CODEX_TARGETS = {
    "x86_64": ("x86_64-unknown-linux-musl", "@openai/codex-linux-x64"),
    "aarch64": ("aarch64-unknown-linux-musl", "@openai/codex-linux-arm64"),
}


def codex_native(modules: Path = PEERS_DIR / "node_modules") -> Path | None:
    """The platform binary inside @openai/codex's npm package, which its bin/codex.js
    (a Node script: Node's own start-up on every call) finds and execs.  The
    platform package holds it under vendor/TRIPLE/bin/codex; older releases kept
    it in @openai/codex/vendor."""
    import platform

    target = CODEX_TARGETS.get(platform.machine())
    if target is None:
        return None
    triple, package = target
    for root in (modules / package, modules / "@openai" / "codex"):
        binary = root / "vendor" / triple / "bin" / "codex"
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    return None


class Codex(Tool):
    def __init__(self, scratch: Path) -> None:
        super().__init__("codex sandbox")
        self.scratch = scratch
        self.allow: int | None = None
        if not (PEERS_DIR / "node_modules" / ".bin" / "codex").exists():
            self.error = f"not installed in {PEERS_DIR} (run with --with-peers)"
            return
        native = codex_native()
        if native is None:
            self.error = "the platform binary is not in the npm package (not timed via Node)"
            return
        self.bin = native  # timed directly: the npm wrapper adds a Node start per call
        self.version = _last_line(_run([str(self.bin), "--version"], timeout=60).stdout)
        self.version += f" (native binary {native.relative_to(PEERS_DIR)})"

    def home_for(self, allow: int | None) -> Path:
        home = self.scratch / f"codex-home-{allow or 'none'}"
        if not home.exists():
            home.mkdir()
            # A permission profile: :workspace (workspace writable, network off);
            # for the allow case, network through Codex's managed proxy with one
            # allowed host.  Codex's proxy matches hosts, not host:port.
            lines = ['default_permissions = "bench"']  # top-level keys before any table
            if allow:
                lines += ["", "[features]", "network_proxy = true"]
            lines += ["", "[permissions.bench]", 'extends = ":workspace"']
            if allow:
                lines += ["", "[permissions.bench.network]", "enabled = true"]
                lines += ["", "[permissions.bench.network.domains]", '"127.0.0.1" = "allow"']
            (home / "config.toml").write_text("\n".join(lines) + "\n")
        return home

    def argv(self, script: str, allow: int | None) -> list[str]:
        return [
            "env",
            f"CODEX_HOME={self.home_for(allow)}",
            "CODEX_MANAGED_BY_NPM=1",  # what the npm wrapper sets before it execs the binary
            str(self.bin),
            "sandbox",
            "--",
            "sh",
            "-c",
            script,
        ]


class Origin:
    """An HTTP origin on 127.0.0.1 that counts requests by path.

    It answers every GET with the same 3-byte body and parses no more than the
    request line: a bench measures what a sandbox and its proxy add to a GET,
    so the origin itself should take next to nothing.  (``http.server`` took
    about 0.5 ms a request here, parsing headers through ``email``: a third of
    the first GET through a new door.)  No request has a body.
    """

    ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n"

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        pending = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in pending:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    pending += data
                head, _, pending = pending.partition(b"\r\n\r\n")
                parts = head.split(b"\r\n", 1)[0].split()
                self.hits.append(parts[1].decode("latin-1") if len(parts) > 1 else "")
                conn.sendall(self.ANSWER)

    def close(self) -> None:
        self.listener.close()


class Bench:
    def __init__(self, tools: list[Tool], base: Path) -> None:
        self.tools = tools
        self.base = base
        self.ws = base / "workspace"
        self.home = base / "home"
        self.outside = base / "outside"
        for d in (self.ws, self.home, self.outside):
            d.mkdir()
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "XDG_STATE_HOME": str(base / "state"),
        }
        self.ok, self.bad = Origin(), Origin()

    def close(self) -> None:
        self.ok.close()
        self.bad.close()

    def run(
        self, tool: Tool, script: str, allow: int | None = None, timeout: float = 60
    ) -> tuple[float, subprocess.CompletedProcess[str]]:
        t = time.perf_counter()
        out = subprocess.run(
            tool.argv(script, allow),
            cwd=self.ws,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        return (time.perf_counter() - t) * 1000, out

    def verify(self, tool: Tool) -> None:
        """Confinement checks, decided on the host."""
        try:
            _, first = self.run(tool, "true")
        except (OSError, subprocess.TimeoutExpired) as exc:
            tool.error = f"cannot start: {exc}"
            return
        if first.returncode != 0:
            tool.error = f"`true` exited {first.returncode}: {_last_line(first.stderr)}"
            return
        tag = tool.name.split()[0]
        inside, escaped = self.ws / f"in-{tag}.txt", self.outside / f"escaped-{tag}.txt"
        self.run(tool, f"echo in > {inside.name}; echo out > {shlex.quote(str(escaped))}")
        if not inside.exists():
            tool.checks["workspace writable"] = "NO: the write inside the workspace failed"
        else:
            tool.checks["workspace writable"] = "yes"
        tool.checks["write outside the workspace blocked"] = (
            "NO: the file landed on the host" if escaped.exists() else "yes"
        )
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listener.settimeout(0.3)
        port = listener.getsockname()[1]
        self.run(
            tool,
            f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2)\"",
        )
        try:
            listener.accept()[0].close()
            tool.checks["direct TCP to a host port blocked"] = "NO: the host listener was reached"
        except TimeoutError:
            tool.checks["direct TCP to a host port blocked"] = "yes"
        finally:
            listener.close()
        key = self.home / ".ssh" / "id_ed25519"
        key.parent.mkdir(exist_ok=True)
        key.write_text("CANARY-KEY\n")
        _, out = self.run(tool, f"cat {shlex.quote(str(key))}")
        tool.checks[SSH_CHECK] = "NO: the key was printed" if "CANARY-KEY" in out.stdout else "yes"
        before_ok, before_bad = len(self.ok.hits), len(self.bad.hits)
        _, out = self.run(
            tool,
            f"{HTTP_SCRIPT} http://127.0.0.1:{self.ok.port}/verify; echo; "
            f"{HTTP_SCRIPT} http://127.0.0.1:{self.bad.port}/forbidden",
            allow=self.ok.port,
        )
        reached_ok = len(self.ok.hits) > before_ok
        tool.checks["allowed origin reached through the proxy"] = (
            "yes" if reached_ok else f"NO: {_last_line(out.stdout + out.stderr)}"
        )
        tool.checks["forbidden loopback port refused by the proxy"] = (
            "NO: the forbidden origin was reached" if len(self.bad.hits) > before_bad else "yes"
        )

    def measure(self, tool: Tool, what: str, burst: int, record: bool = True) -> None:
        """One timed sample of ``what`` for ``tool``; a failure is recorded, not fatal."""
        try:
            if what == "true":
                ms, out = self.run(tool, "true")
                ok = out.returncode == 0
            elif what == "burst":
                start = time.perf_counter()
                failed = None
                for _ in range(burst):
                    _, out = self.run(tool, "true")
                    if out.returncode != 0 and failed is None:
                        failed = out  # the one to report, not the last run
                ms = (time.perf_counter() - start) * 1000
                ok = failed is None
                out = failed or out
            else:
                ms, out = self.run(
                    tool, f"{HTTP_SCRIPT} http://127.0.0.1:{self.ok.port}/bench", self.ok.port
                )
                words = out.stdout.split()
                ok = len(words) == 2 and words[0] == "200"
                if ok and record:
                    tool.samples.setdefault("http_request", []).append(float(words[1]) * 1000)
        except (OSError, subprocess.TimeoutExpired) as exc:
            tool.failures.setdefault(what, str(exc))
            return
        if not ok:
            tool.failures.setdefault(
                what, f"exit {out.returncode}: {_last_line(out.stderr or out.stdout)}"
            )
            return
        if record:
            tool.samples.setdefault(what, []).append(ms)


def measure_rows(quick: bool, corral: str, log: Callable[[str], None]) -> tuple[list[Row], str]:
    """All peer rows and the confinement report, from one interleaved run."""
    rounds = {"true": 10, "burst": 2, "http": 5} if quick else {"true": 40, "burst": 5, "http": 20}
    burst = 50
    # Not under /tmp: the sandboxes replace /tmp, and codex keeps the helper it
    # re-executes inside the sandbox under CODEX_HOME.
    (CACHE / "scratch").mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="run-", dir=CACHE / "scratch"))
    try:
        tools: list[Tool] = [Corral(corral), Srt(base), Codex(base)]
        bench = Bench(tools, base)
        try:
            for tool in tools:
                if not tool.error:
                    log(f"peers: checking that {tool.name} confines")
                    bench.verify(tool)
            live = [t for t in tools if not t.error]
            for what in ("true", "burst", "http"):
                warm = 0 if what == "burst" else 1  # one unrecorded round: caches, JIT, pages
                for k in range(warm + rounds[what]):
                    shift = k % len(live) if live else 0
                    for tool in live[shift:] + live[:shift]:
                        bench.measure(tool, what, burst, record=k >= warm)
                log(f"peers: {what} done")
        finally:
            bench.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return _rows(tools, burst), _report(tools)


def _rows(tools: list[Tool], burst: int) -> list[Row]:
    out: list[Row] = []
    corral = tools[0].name
    titles = {
        "true": "peers: sandboxed `true`",
        "burst": f"peers: {burst} sequential sandboxed `true`",
        "http": "peers: sandboxed curl, one GET via the tool's proxy to 127.0.0.1 (whole command)",
        "http_request": "peers: that GET alone (curl time_total, via the tool's proxy)",
    }
    for key, title in titles.items():
        for tool in tools:
            values = tool.samples.get(key, [])
            fail_key = "http" if key == "http_request" else key
            if tool.error:
                note = tool.error
            elif not values:
                note = tool.failures.get(fail_key, "no sample")
            else:
                note = f"{len(values)} samples"
                if tool.failures.get(fail_key):
                    note += f"; failed once: {tool.failures[fail_key]}"
            # A failed proxy check concerns the network rows; the others, every row.
            unconfined = [
                c
                for c, v in tool.checks.items()
                if v.startswith("NO")
                and c != SSH_CHECK
                and (key.startswith("http") or "proxy" not in c)
            ]
            if unconfined and not tool.error:
                note += "; does NOT pass: " + ", ".join(unconfined)
            base = corral if tool.name != corral else ""
            out.append(Row(title, tool.name, median(values), "ms", base, note))
    return out


def _report(tools: list[Tool]) -> str:
    checks: list[str] = []
    for tool in tools:
        for c in tool.checks:
            if c not in checks:
                checks.append(c)
    lines = [
        "Confinement checked on the host before timing (same configurations as the rows):",
        "",
        "| check | " + " | ".join(t.name for t in tools) + " |",
        "|---|" + "---|" * len(tools),
    ]
    for c in checks:
        cells = [t.checks.get(c, t.error or "—").replace("|", "\\|") for t in tools]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines += ["", "Versions: " + "; ".join(f"{t.name} {t.version or '?'}" for t in tools)]
    lines += [
        "",
        "Configurations: corral `run` defaults (+ `--allow 127.0.0.1:PORT`); srt settings "
        '`{"filesystem": {"allowWrite": ["."]}, "network": {"allowedDomains": []}}` '
        '(+ `"127.0.0.1:PORT"`); codex permission profile `extends = ":workspace"` '
        '(+ `[features] network_proxy = true`, `network.enabled = true`, domain `"127.0.0.1"` '
        "allowed: Codex's proxy matches the host, not the port).",
    ]
    return "\n".join(lines) + "\n"


def rows(quick: bool, with_peers: bool = False) -> tuple[list[Row], str]:
    from bench.run_latency import default_corral

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    failed = install(log) if with_peers else {}
    if not with_peers:
        note = "not measured: run `python -m bench --with-peers` to install and measure the peers"
        return [Row("peers", "srt, codex sandbox", None, "ms", note=note)], ""
    result, report = measure_rows(quick, os.path.abspath(default_corral()), log)
    if failed:
        report += "\nInstall problems: " + "; ".join(f"{k}: {v}" for k, v in failed.items()) + "\n"
    return result, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (about a minute)")
    parser.add_argument("--install", action="store_true", help="install the peers if missing")
    args = parser.parse_args(argv)
    from bench.common import table

    if args.install:
        result, report = rows(args.quick, with_peers=True)
    else:  # measure whatever is already installed; a missing peer says so in its cells
        from bench.run_latency import default_corral

        result, report = measure_rows(
            args.quick, os.path.abspath(default_corral()), lambda m: print(m, file=sys.stderr)
        )
    print("\n".join(table(result)))
    print()
    print(report, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
