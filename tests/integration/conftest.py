"""Fixtures that drive the real ``corral`` CLI, as root and as an unprivileged user.

Everything a test creates lives under one directory outside /tmp: the sandbox
replaces /tmp with a private tmpfs, so a fake home under /tmp would be hidden
for the wrong reason and a deny test could pass without corral doing anything.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

import corral
from tests.tiers import TierCase, available

TEST_USER = "corral-test"
ROOT_BASE = Path("/var/lib/corral-tests")
SRC = Path(corral.__file__).resolve().parent.parent  # the directory holding `corral/`


def _ensure_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(TEST_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TEST_USER],
            check=True,
        )
        return pwd.getpwnam(TEST_USER)


class Corral:
    """Runs ``python -m corral`` as a given user with a controlled environment."""

    def __init__(
        self, who: str, base: Path, home: Path, state: Path, tier: TierCase | None = None
    ) -> None:
        self.who = who
        self.tier = tier
        self.base = base
        self.home = home
        self.state = state
        if who == "user":
            info = _ensure_user()
            self.uid, self.gid = info.pw_uid, info.pw_gid
            # The user cannot read root's interpreter or checkout: give it a copy of
            # the source and the system Python.
            self.python = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
            self.pythonpath = str(base / "src")
            shutil.copytree(SRC / "corral", base / "src" / "corral")
        else:
            self.uid, self.gid = os.getuid(), os.getgid()
            self.python = sys.executable
            self.pythonpath = str(SRC)

    def has(self, prop: str) -> bool:
        """Whether the tier under test isolates this way (tests/tiers.py: NAMESPACED)."""
        return self.tier is None or prop in self.tier.props

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "PYTHONPATH": self.pythonpath,
            "XDG_STATE_HOME": str(self.state),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        if extra:
            env.update(extra)
        return env

    def argv(self, args: list[str]) -> list[str]:
        if self.tier is not None and args[:1] in (["run"], ["shell"]) and "--tier" not in args:
            args = [args[0], *self.tier.flags, *args[1:]]
        return self.python_argv(["-P", "-m", "corral", *args])

    def python_argv(self, args: list[str]) -> list[str]:
        """This user's Python (with corral importable) and ``args``, as that user."""
        cmd = [self.python, *args]
        if self.who == "user":
            return [
                "setpriv",
                f"--reuid={self.uid}",
                f"--regid={self.gid}",
                "--clear-groups",
                "--",
                *cmd,
            ]
        return cmd

    def run(
        self,
        args: list[str],
        cwd: Path,
        env: dict[str, str] | None = None,
        timeout: float = 60,
        input: bytes | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            self.argv(args),
            cwd=cwd,
            env=self.env(env),
            capture_output=True,
            timeout=timeout,
            input=input,
        )

    def sh(
        self, ws: Path, script: str, *flags: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        """``corral run -q FLAGS -- sh -c SCRIPT`` in ``ws``."""
        return self.run(["run", "-q", *flags, "--", "sh", "-c", script], cwd=ws, env=env)

    def popen(
        self, args: list[str], cwd: Path, env: dict[str, str] | None = None, **kw: object
    ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.argv(args), cwd=cwd, env=self.env(env), **kw)  # type: ignore[call-overload, no-any-return]

    def chown(self, *paths: Path) -> None:
        for p in paths:
            for root, dirs, files in os.walk(p):
                for name in [*dirs, *files]:
                    os.lchown(os.path.join(root, name), self.uid, self.gid)
            os.lchown(p, self.uid, self.gid)


def sees_host_root(c: Corral) -> bool:
    """False on the container tiers: the image replaces the host's ``/``, so host
    files outside the workspace are absent there (public ones included), not masked."""
    return c.has("host-root")


def is_gvisor(c: Corral) -> bool:
    return c.tier is not None and c.tier.id == "gvisor"


USERS = ["root", "user"]


@pytest.fixture(params=USERS)
def who(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if os.geteuid() != 0:
        if name == "root":
            pytest.skip("the root variant needs the tests to run as root")
    elif name == "user" and not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) is needed to run as an unprivileged user")
    return name


TIER_CASES = available()
# gVisor's cases of the behaviour tests are marked slow (each run starts a
# container under ptrace: seconds); the conformance matrix keeps them in the
# default run (tests/conformance/conftest.py), and `-m slow` runs these too.
SLOW_CASES = frozenset({"gvisor"})
TIER_PARAMS = [
    pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.id in SLOW_CASES else [])
    for c in TIER_CASES
]


@pytest.fixture(params=TIER_PARAMS)
def tier(request: pytest.FixtureRequest) -> TierCase:
    """Each tier this machine can run; tests that only make sense on some tiers
    mark themselves ``@pytest.mark.tiers("namespace", ...)``."""
    return select_case(request)


def select_case(request: pytest.FixtureRequest) -> TierCase:
    """The tier case of a ``tier`` fixture's request, skipped where the test's
    ``tiers`` marker leaves it out."""
    case: TierCase = request.param
    marker = request.node.get_closest_marker("tiers")
    if marker is not None and case.id not in marker.args:
        pytest.skip(f"{marker.kwargs.get('why', 'not a property of this tier')} ({case.id})")
    return case


@pytest.fixture
def tsandbox(who: str, tier: TierCase) -> Iterator[tuple[Corral, Path]]:
    """Like ``sandbox`` but once per available tier: ``corral run`` gets the tier's flags."""
    if who == "user":
        from tests.tiers import user_refusal

        info = _ensure_user()
        why = user_refusal(tier, info.pw_name, info.pw_uid)
        if why:
            pytest.skip(f"{tier.id} as an unprivileged user: {why}")
    yield from _sandbox(who, tier)


@pytest.fixture
def sandbox(who: str) -> Iterator[tuple[Corral, Path]]:
    """A Corral runner and a fresh workspace, both owned by the user under test."""
    yield from _sandbox(who, None)


def _sandbox(who: str, tier: TierCase | None) -> Generator[tuple[Corral, Path], None, None]:
    if os.geteuid() == 0:
        ROOT_BASE.mkdir(parents=True, exist_ok=True)
        os.chmod(ROOT_BASE, 0o755)
        base = ROOT_BASE / uuid.uuid4().hex[:12]
    else:
        base = Path(os.environ.get("CORRAL_TEST_BASE", str(Path.home()))) / (
            ".corral-tests-" + uuid.uuid4().hex[:12]
        )
    base.mkdir(parents=True)
    os.chmod(base, 0o755)
    home, state, ws = base / "home", base / "state", base / "ws"
    for d in (home, state, ws):
        d.mkdir()
    runner = Corral(who, base, home, state, tier)
    if who == "user":
        runner.chown(home, state, ws)
    try:
        yield runner, ws
        _no_proxy_errors(state)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _no_proxy_errors(state: Path) -> None:
    """Every test is also a check that the proxy met no bug: an exception inside
    it is an audit line with decision "error" (the user sees only a count)."""
    log = state / "corral" / "net.jsonl"
    if log.exists():
        errors = [line for line in log.read_text().splitlines() if '"decision":"error"' in line]
        assert not errors, f"the proxy logged internal errors: {errors}"


def wait_for(predicate: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return True
        time.sleep(0.02)
    return False


def pids_matching(pattern: str, env: str = "") -> list[int]:
    """Processes whose command line matches ``pattern``; with ``env``
    (``NAME=VALUE``), only those whose environment holds it: other tests and
    other users' runs share this machine."""
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    pids = [int(p) for p in out.stdout.split()]
    return [p for p in pids if not env or env.encode() in _environ(p)]


def _environ(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return fh.read().split(b"\0")
    except OSError:
        return []
