"""The launcher runs any plan through its LaunchStrategy, and asks no tier's name.

A tier of the test's own (not in corral's registry) whose strategy records
what the launcher asks of it shows the contract a new tier (the microVM) relies
on: spawn, stop on the timeout, exit_code, limits_hit, cleanup with ``clean``,
the guardian when corral is killed.  The process it starts is a real
``sh``; nothing is sandboxed (the strategy is a plain process, as tier none).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from corral import launch
from corral.errors import EXIT_TIMEOUT
from corral.policy import Policy
from corral.tiers.base import LaunchStrategy, Plan

SRC = Path(__file__).resolve().parents[2] / "src" / "corral"


class Recording(LaunchStrategy):
    """A plain process whose every call is written down."""

    def __init__(self, marker: str = "") -> None:
        self.calls: list[str] = []
        self.marker = marker  # a file cleanup() writes (the guardian's is another process)

    def spawn(
        self, plan: Plan, child_fds: dict[int, int], procs_files: list[str], entered: bool
    ) -> int:
        self.calls.append(f"spawn entered={entered}")
        return launch.spawn_process(plan, child_fds, procs_files)

    def stop(self, plan: Plan, pid: int) -> None:
        self.calls.append("stop")
        super().stop(plan, pid)

    def exit_code(self, plan: Plan, code: int) -> int:
        self.calls.append(f"exit_code {code}")
        return code + 1 if code == 41 else code  # where a guest's own code would come from

    def limits_hit(self, plan: Plan) -> list[str]:
        self.calls.append("limits_hit")
        return ["memory"]

    def needs_guardian(self) -> bool:
        return bool(self.marker)

    def cleanup(self, plan: Plan, clean: bool, pid: int = 0) -> None:
        self.calls.append(f"cleanup clean={clean}")
        if self.marker:
            with open(self.marker, "a", encoding="utf-8") as fh:
                fh.write(f"cleanup clean={clean}\n")


def plan_for(ws: Path, script: str, strategy: LaunchStrategy, timeout: float | None = None) -> Plan:
    policy = Policy(str(ws))
    policy.limits.timeout = timeout
    plan = Plan("recording", policy)
    plan.argv = ["/bin/sh", "-c", script]
    plan.env = {"PATH": "/usr/bin:/bin"}
    plan.cwd = str(ws)
    plan.strategy = strategy
    return plan


def test_a_run_goes_through_the_strategy(tmp_path: Path) -> None:
    strategy = Recording()
    out_r, out_w = os.pipe()
    try:
        result = launch.run(plan_for(tmp_path, "echo hi; exit 41", strategy), "t1", out_fd=out_w)
        os.close(out_w)
        assert os.read(out_r, 100) == b"hi\n"
    finally:
        os.close(out_r)
    assert result.exit_code == 42  # the strategy's exit_code() has the last word
    assert "memory" in result.limits_hit
    assert strategy.calls == [
        "spawn entered=True",  # corral run: enter() ran in this process first
        "exit_code 41",
        "limits_hit",
        "cleanup clean=True",  # ended on its own: nothing to remove by force
    ]


def test_a_timeout_stops_through_the_strategy(tmp_path: Path) -> None:
    strategy = Recording()
    result = launch.run(plan_for(tmp_path, "sleep 30", strategy, timeout=0.3), "t2")
    assert result.timed_out and result.exit_code == EXIT_TIMEOUT
    assert "stop" in strategy.calls
    assert "cleanup clean=False" in strategy.calls  # killed: remove what is left by force
    # allow twin: the same plan without the timeout ends on its own, cleanly
    calm = Recording()
    assert launch.run(plan_for(tmp_path, "true", calm, timeout=30), "t3").exit_code == 0
    assert "stop" not in calm.calls and "cleanup clean=True" in calm.calls


def test_start_and_stop_for_a_long_lived_sandbox(tmp_path: Path) -> None:
    strategy = Recording()
    r, w = os.pipe()
    started = launch.start(plan_for(tmp_path, "echo up; sleep 30", strategy), "t4", {1: w})
    os.close(w)
    try:
        assert os.read(r, 10) == b"up\n"
    finally:
        os.close(r)
    started.stop()
    assert strategy.calls == ["spawn entered=False", "stop", "cleanup clean=False"]


def test_the_guardian_cleans_up_through_the_strategy(tmp_path: Path) -> None:
    """corral killed mid-run: its guardian calls cleanup() (clean=False)."""
    marker = tmp_path / "cleaned"
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_strategy import Recording, plan_for\n"
        "from pathlib import Path\n"
        "from corral import launch\n"
        f"launch.run(plan_for(Path({str(tmp_path)!r}), 'echo up; exec sleep 3', "
        f"Recording({str(marker)!r})), 't5')\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    # (the file exists from its open() on: wait for the whole line)
    while not (marker.exists() and marker.read_text().endswith("\n")):
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert marker.read_text() == "cleanup clean=False\n"
    # allow twin: a run left to finish cleans up once, itself, cleanly
    calm = tmp_path / "calm"
    launch.run(plan_for(tmp_path, "true", Recording(str(calm))), "t6")
    assert calm.read_text() == "cleanup clean=True\n"


# What callers may not do: ask which tier they run (they ask its strategy).
NAME_CHECK = re.compile(
    r"""(==|!=|\bin)\s*\(?\s*["'](none|namespace|landlock|container|gvisor|microvm|firecracker)["']"""
    r"""|\btier\.name\s*(==|!=|in\b)|isinstance\([^)]*Tier\b"""
)


def test_launcher_cli_and_sandbox_never_test_a_tier_name() -> None:
    for name in ("launch.py", "cli.py", "shell.py", "mcp_server.py", "sandbox.py"):
        for number, line in enumerate((SRC / name).read_text().splitlines(), 1):
            assert not NAME_CHECK.search(line), f"{name}:{number}: {line.strip()}"
