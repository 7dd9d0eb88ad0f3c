"""`corral run -- true` stays lean: a heavy import on the hot path costs every run
milliseconds (bench/run_latency.py measures it; this test keeps it from creeping back)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# Each of these costs 1-15 ms to import here; none is needed to run a command
# with the default policy and no network.
HEAVY = (
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
    "corral.net",
)

PROBE = """
import sys
from corral import cli
code = cli.main(["run", "-q", "--", "true"])
print(code, " ".join(m for m in {heavy!r} if m in sys.modules))
"""


def test_default_run_imports_nothing_heavy(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY)],
        cwd=tmp_path,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},  # not the user's own
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.split() == ["0"], out.stdout + out.stderr
