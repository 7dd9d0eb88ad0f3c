"""Shared pieces of the conformance matrix: the tier fixtures and a probe runner.

The tier and user fixtures are the integration suite's own (``tests/integration/
conftest.py``), loaded under another module name so that both directories can
have a ``conftest.py`` without one shadowing the other.  Every case here runs on
every tier case ``tests/tiers.py`` finds available, as root and as the
unprivileged user, exactly like the integration tests.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

_IT = Path(__file__).resolve().parent.parent / "integration" / "conftest.py"
_spec = importlib.util.spec_from_file_location("corral_integration_fixtures", _IT)
assert _spec is not None and _spec.loader is not None
_fixtures = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _fixtures
_spec.loader.exec_module(_fixtures)

if TYPE_CHECKING:
    # The same module, as mypy sees it (pyproject.toml puts tests/integration on mypy_path).
    from conftest import Corral
else:
    Corral = _fixtures.Corral
tsandbox = _fixtures.tsandbox


@pytest.fixture(params=_fixtures.TIER_CASES, ids=[c.id for c in _fixtures.TIER_CASES])
def tier(request: pytest.FixtureRequest) -> object:
    """Every available tier case, gVisor's included, in the default run: the
    security matrix is not thinned for time (the behaviour tests' gVisor cases
    are marked slow in tests/integration/conftest.py)."""
    return _fixtures.select_case(request)


who = _fixtures.who
wait_for = _fixtures.wait_for
pids_matching = _fixtures.pids_matching

# Helpers every probe starts with.  A probe prints one ``name=result`` line per
# attempt; the test reads them, but decides on evidence it gathers on the host.
PRELUDE = r'''
import errno, os, socket, sys, time
def _why(e):
    code = getattr(e, "errno", None)
    return errno.errorcode.get(code, str(code)) if code else type(e).__name__
def attempt(name, fn):
    try:
        r = fn()
        print(f"{name}=ok" + ("" if r is None else f":{r}"), flush=True)
    except Exception as e:
        print(f"{name}=err:{_why(e)}", flush=True)
def write(path, text="attack"):
    with open(path, "w") as f:
        f.write(text)
def read(path):
    with open(path, errors="replace") as f:
        return f.read()
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def c(fn, *args):
    """A libc call as an attempt: a negative return raises OSError with its errno."""
    def call():
        if fn(*args) < 0:
            raise OSError(ctypes.get_errno(), fn.__name__)
    return call
'''


class Result:
    """What one sandboxed probe run left: exit code, output, and its ``name=`` lines."""

    def __init__(self, proc: subprocess.CompletedProcess[bytes]) -> None:
        self.code = proc.returncode
        self.out = proc.stdout.decode(errors="replace")
        self.err = proc.stderr.decode(errors="replace")
        self.got: dict[str, str] = {}
        for line in self.out.splitlines():
            m = re.match(r"^([A-Za-z0-9_.-]+)=(.*)$", line)
            if m:
                self.got.setdefault(m.group(1), m.group(2))

    def ok(self, name: str) -> bool:
        return self.got.get(name, "").startswith("ok")

    def denied(self, name: str) -> bool:
        """The probe reached the attempt and it failed (an absent line is not a denial)."""
        return self.got.get(name, "").startswith("err:")

    def __repr__(self) -> str:
        return f"exit {self.code}\nstdout: {self.out[-2000:]}\nstderr: {self.err[-2000:]}"


class Box:
    """One sandbox under test: the runner, its workspace, and host-only places."""

    def __init__(self, c: Corral, ws: Path) -> None:
        self.c = c
        self.ws = ws
        self.home: Path = c.home
        self.tier = c.tier.id if c.tier is not None else "?"
        self.who: str = c.who
        self.token = uuid.uuid4().hex[:12]  # a canary no other run can contain
        # A host directory the user may write to, outside the workspace: an
        # escape would land here, where the test looks for it.
        self.outside = c.base / "outside"
        self.outside.mkdir()
        c.chown(self.outside)

    def own(self, *paths: Path) -> None:
        self.c.chown(*paths)

    def has(self, prop: str) -> bool:
        """Whether the tier isolates this way (tests/tiers.py, NAMESPACED)."""
        return bool(self.c.has(prop))

    def documented_gap(self, request: pytest.FixtureRequest, words: str) -> None:
        """Mark a known limitation this tier documents: a strict xfail quoting it.

        ``words`` picks the tier's own sentence (its DIFFERENCES, printed by
        ``corral doctor``), so the reason is the documentation, not a paraphrase.
        """
        reason = documented(self.c.tier.tier if self.c.tier else "", words)
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))

    def py(
        self,
        code: str,
        *flags: str,
        env: dict[str, str] | None = None,
        timeout: float = 60,
        stdin: int | None = None,
    ) -> Result:
        """``corral run -q FLAGS -- python3 probe.py`` in the workspace."""
        probe = self.ws / f"probe-{uuid.uuid4().hex[:6]}.py"
        probe.write_text(PRELUDE + code)
        self.own(probe)
        argv = self.c.argv(["run", "-q", *flags, "--", "python3", probe.name])
        proc = subprocess.run(
            argv,
            cwd=self.ws,
            env=self.c.env(env),
            capture_output=True,
            timeout=timeout,
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
        )
        probe.unlink(missing_ok=True)
        return Result(proc)

    def popen(self, code: str, *flags: str) -> subprocess.Popen[bytes]:
        probe = self.ws / f"probe-{uuid.uuid4().hex[:6]}.py"
        probe.write_text(PRELUDE + code)
        self.own(probe)
        argv = self.c.argv(["run", "-q", *flags, "--", "python3", probe.name])
        return subprocess.Popen(
            argv,
            cwd=self.ws,
            env=self.c.env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def limited(self, code: str, *flags: str, timeout: float = 60) -> Result:
        """A run with cgroup limits; N.A. where this host refuses them for this user."""
        r = self.py(code, *flags, timeout=timeout)
        if r.code == 122 and "limit" in r.err:
            pytest.skip(f"N.A.: {r.err.strip().splitlines()[-1]}")
        return r


@pytest.fixture
def box(tsandbox: tuple[Corral, Path]) -> Iterator[Box]:
    c, ws = tsandbox
    yield Box(c, ws)


def host_user_file(box: Box, path: Path, text: str, mode: int = 0o644) -> Path:
    """A file on the host, owned by the user under test (its parents too)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)
    top = path
    while top.parent not in (box.c.base, box.ws, box.home, box.outside) and top.parent != top:
        top = top.parent
    box.own(top)
    return path


def documented(tier: str, words: str) -> str:
    """The tier's documented difference containing ``words``, as an xfail reason."""
    try:
        module = __import__(f"corral.tiers.{tier}", fromlist=["DIFFERENCES"])
        notes: tuple[str, ...] = getattr(module, "DIFFERENCES", ())
    except ImportError:
        notes = ()
    for note in notes:
        if words in note:
            return f"documented ({tier} tier, corral doctor): {note}"
    raise AssertionError(f"tier {tier} documents nothing about {words!r}: not a known limitation")


def require(tool: str) -> str:
    found = shutil.which(tool)
    if not found:
        pytest.skip(f"N.A.: {tool} is not installed on the host")
    return found


class Origin:
    """An HTTP server on 127.0.0.1 that records every request reaching it."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.hits: list[str] = []
        origin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                origin.hits.append(self.path)
                body = b"hello from origin\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        # a short poll interval: shutdown() waits for it, once per test
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def origins() -> Iterator[tuple[Origin, Origin]]:
    """An allowed and a forbidden origin, both on the host's loopback."""
    ok, bad = Origin(), Origin()
    try:
        yield ok, bad
    finally:
        ok.close()
        bad.close()


class Listener:
    """A raw TCP or UDP listener that counts what reaches it (IPv4 or IPv6 loopback)."""

    def __init__(self, family: int, kind: int, host: str, port: int = 0) -> None:
        import socket
        import threading

        self.sock = socket.socket(family, kind)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.port: int = self.sock.getsockname()[1]
        self.hits: list[bytes] = []
        self.sock.settimeout(0.05)
        if kind == socket.SOCK_STREAM:
            self.sock.listen(8)
        self._stop = False
        self._kind = kind
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import socket

        while not self._stop:
            try:
                if self._kind == socket.SOCK_STREAM:
                    conn, _ = self.sock.accept()
                    conn.settimeout(1)
                    try:
                        self.hits.append(conn.recv(100) or b"<connect>")
                    except OSError:
                        self.hits.append(b"<connect>")
                    conn.close()
                else:
                    self.hits.append(self.sock.recv(512))
            except (TimeoutError, OSError):
                continue

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.sock.close()
