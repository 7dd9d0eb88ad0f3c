"""corral's own processes inside a sandbox (relay, container boot step, agent) turn an
unexpected exception into one line on stderr (or one frame), never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import corral

SRC = Path(corral.__file__).resolve().parent


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=30
    )


def test_relay_thread_and_main_errors_are_one_line() -> None:
    code = (
        f"import sys, threading; sys.path.insert(0, {str(SRC / 'net')!r})\n"
        "import relay; relay.one_line_errors('corral-relay')\n"
        "t = threading.Thread(target=lambda: 1 / 0); t.start(); t.join()\n"
        "print('still serving', flush=True)\n"
        "raise KeyError('boom')\n"
    )
    r = _run(code)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert lines == [
        "corral-relay: internal error: ZeroDivisionError: division by zero",
        "corral-relay: internal error: KeyError: 'boom'",
    ]
    assert r.stdout == "still serving\n"  # the twin: a thread's error does not end it


def test_boot_error_is_one_line() -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(SRC / 'container')!r})\n"
        "import boot; boot.main(['/nonexistent-env-file', '-', '-', '-', '--', 'true'])\n"
    )
    r = _run(code)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("corral boot: internal error: FileNotFoundError")
