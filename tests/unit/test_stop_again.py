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
from tests.procs import alive

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


# Stands in for bwrap: reports a child in a session of its own on the status pipe
# (fd 3), as bwrap does its sandbox's init, then waits; the child holds stdout.
FAKE_BWRAP = (
    'setsid sh -c "echo \\$\\$ > root.pid; exec sleep 30" & '
    "while [ ! -s root.pid ]; do sleep 0.01; done; "
    'printf "{ \\"child-pid\\": %s }\\n" "$(cat root.pid)" >&3; wait'
)


def test_a_stop_also_kills_the_child_bwrap_reported(tmp_path: Path) -> None:
    """Killing bwrap's process group does not reach its child, in a session of its
    own: once that child set its parent-death signal too late (or a command
    undid it), it outlived the run.  The stop kills the reported child too;
    the twin: a run with no status pipe stops as before."""
    policy = Policy(str(tmp_path))
    policy.limits.timeout = 0.5
    tier = get("none")
    plan = tier.plan(policy, ["sh", "-c", FAKE_BWRAP], host=tier.gather(policy))
    plan.fds = {**plan.fds, 3: "status"}
    plan.cwd = str(tmp_path)
    null = os.open(os.devnull, os.O_RDWR)
    try:
        started = time.monotonic()
        result = launch.run(plan, "root-kill", out_fd=null, err_fd=null, in_fd=null)
        took = time.monotonic() - started
    finally:
        os.close(null)
    root = int((tmp_path / "root.pid").read_text())
    assert result.timed_out and took < 1.5, took  # not STOP_AGAIN's, nor the grace's
    deadline = time.monotonic() + 2
    while alive(root) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not alive(root)
    result, took = _run(tmp_path, "while :; do sleep 0.05; done")
    assert result.timed_out and took < 0.7, took
