"""`corral run -- true` stays lean: a heavy import on the hot path costs every run
milliseconds (bench/run_latency.py measures it; this test keeps it from creeping back)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# Each of these costs 1-15 ms to import here; none is needed to run a command
# with the default policy and no network.
HEAVY: tuple[str, ...] = (
    "re",
    "typing",
    "dataclasses",
    "json",
    "subprocess",
    "tempfile",
    "argparse",
    "enum",
    "signal",
    "tomllib",
    "hashlib",
    "shutil",
    "contextlib",
    "functools",  # (and collections, operator, reprlib with it: 5 ms)
    "corral.net",
)
try:  # built with a C compiler: ctypes' C module (about 1 ms) and the socket module
    import corral._sys  # noqa: F401  # (a quarter of one) stay off the path too

    HEAVY += ("_ctypes", "_socket")
except ImportError:
    pass

PROBE = """
import sys
from corral import cli
code = cli.main(["run", "-q", "--", "true"])
print(code, " ".join(m for m in {heavy!r} if m in sys.modules))
"""


def test_default_run_imports_nothing_heavy(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-P", "-c", PROBE.format(heavy=HEAVY)],  # (-P: no import from cwd)
        cwd=tmp_path,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},  # not the user's own
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.split() == ["0"], out.stdout + out.stderr


ASKING = ("corral.net.asking", "corral.net.approvals", "corral.prompt", "termios", "asyncio")
PROBE_NET = """
import sys
from corral import cli
code = cli.main(["run", "-q", "--policy", {policy!r}, "--", "true"])
print(code, " ".join(m for m in {asking!r} if m in sys.modules))
"""


def test_approvals_load_only_for_a_policy_that_asks(tmp_path: Path) -> None:
    """A networked run pays for approvals only when its policy has an ask rule, and
    then only for a light module (~1.5 ms) in corral's own process."""
    net = '[network]\nmode = "proxy"\nallow = ["127.0.0.1:9"]\n'
    ask = '\n[[network.rules]]\nhost = "127.0.0.1:9"\naction = "ask"\n'
    found = []
    for name, text in (("plain", net), ("asks", net + ask)):
        policy = tmp_path / f"{name}.toml"
        policy.write_text(text)
        out = subprocess.run(
            [sys.executable, "-P", "-c", PROBE_NET.format(policy=str(policy), asking=ASKING)],
            cwd=tmp_path,
            env={
                **os.environ,
                "XDG_STATE_HOME": str(tmp_path / "state"),
                "CORRAL_CONTROL_DIR": str(tmp_path / "ctl"),
            },
            stdin=subprocess.DEVNULL,  # no terminal: no prompt, the control socket only
            capture_output=True,
            text=True,
            timeout=60,
        )
        found.append(out.stdout.split())
    assert found[0] == ["0"], found
    # the control directory's check, and the answerer that says what is held (without
    # a terminal, one line each): the proxy's side (asyncio) is the worker's
    assert found[1] == ["0", "corral.net.asking", "corral.prompt"], found
