"""A sandbox told to stop that is still there is told again (launch.STOP_AGAIN)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from corral import launch
from corral.policy import Policy
from corral.tiers import get
from corral.tiers.none import Direct

# the first SIGTERM is taken (and the trap dropped); the second ends it
STUBBORN = 'trap "trap - TERM" TERM; while :; do sleep 0.05; done'


class _GentleStop(Direct):
    """Stops as the landlock tier does: a SIGTERM the sandbox's process may take."""

    def stop(self, plan: object, pid: int) -> None:
        try:
            os.killpg(pid, signal.SIGTERM)
        except OSError:
            pass


def _run(tmp_path: Path, script: str) -> tuple[launch.RunResult, float]:
    policy = Policy(str(tmp_path))
    policy.limits.timeout = 0.3
    tier = get("none")
    plan = tier.plan(policy, ["sh", "-c", script], host=tier.gather(policy))
    plan.strategy = _GentleStop()
    null = os.open(os.devnull, os.O_RDWR)
    try:
        started = time.monotonic()
        result = launch.run(plan, "stop-again", out_fd=null, err_fd=null, in_fd=null)
        return result, time.monotonic() - started
    finally:
        os.close(null)


def test_a_sandbox_that_outlives_its_stop_is_stopped_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command that survives the timeout's stop ends at the next one, STOP_AGAIN
    later (a landlock reaper missed its SIGTERM once, and the run hung); the twin:
    one that does not survive ends at the first."""
    monkeypatch.setattr(launch, "STOP_AGAIN", 0.5)
    result, took = _run(tmp_path, STUBBORN)
    assert result.timed_out and 0.7 < took < 3.0, took
    result, took = _run(tmp_path, "while :; do sleep 0.05; done")
    assert result.timed_out and took < 0.7, took
