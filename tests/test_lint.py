"""ruff and mypy are part of the test run, so a red lint fails CI like a red test."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (pip install -e '.[dev]')")
    return found


@pytest.mark.parametrize(
    "args",
    [["check", "src", "tests", "bench"], ["format", "--check", "src", "tests", "bench"]],
    ids=["ruff-check", "ruff-format"],
)
def test_ruff(args: list[str]) -> None:
    out = subprocess.run([_tool("ruff"), *args], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict() -> None:
    out = subprocess.run(
        [_tool("mypy"), "src", "tests", "bench"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
