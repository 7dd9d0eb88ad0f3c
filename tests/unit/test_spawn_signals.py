"""A signal sent as a sandbox is forked is not lost (launch.spawn_held).

A forked child keeps its parent's Python handlers until it resets them; corral's
would note a forwarded SIGTERM in the child's copy of its list, and the signal
was gone (a landlock reaper then never swept its command: about 1 in 100
SIGTERMs sent to corral as it launched).  spawn_held blocks the signals across
the fork, so one sent meanwhile waits until the child has its defaults."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral import launch
from corral.policy import Policy
from corral.tiers import get
from corral.tiers.base import Plan
from corral.tiers.none import Direct


class _SignalledFork(Direct):
    """Forks as the landlock tier does; with ``signal_first``, the child is sent
    SIGTERM before it resets its handlers (the race, made certain) and runs
    Python a while, where a handler of its parent's would run."""

    def __init__(self, signal_first: bool) -> None:
        self.signal_first = signal_first

    def spawn(
        self, plan: Plan, child_fds: dict[int, int], procs_files: list[str], entered: bool
    ) -> int:
        pid = os.fork()
        if pid:
            return pid
        try:
            if self.signal_first:
                os.kill(os.getpid(), signal.SIGTERM)  # as if corral forwarded one now
            sum(range(100_000))  # bytecode: any pending Python handler runs here
            launch.child_session([])
            os.execvp(plan.argv[0], plan.argv)
        finally:
            os._exit(125)


@pytest.fixture
def handler_like_corrals() -> Iterator[list[int]]:
    """A SIGTERM handler that notes the signal, as corral run's does."""
    received: list[int] = []
    old = signal.signal(signal.SIGTERM, lambda signum, _frame: received.append(signum))
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, old)


def _plan(tmp_path: Path, argv: list[str]) -> Plan:
    policy = Policy(str(tmp_path))
    tier = get("none")
    return tier.plan(policy, argv, host=tier.gather(policy))


def _wait(pid: int, seconds: float = 5.0) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("the child ran on: the SIGTERM sent as it was forked was lost")


def test_a_sigterm_sent_as_the_sandbox_is_forked_ends_it(
    tmp_path: Path, handler_like_corrals: list[int]
) -> None:
    """The child, sent SIGTERM before it reset corral's handler, dies of it once it
    has its defaults, instead of running the command (sleep 30) as if never told;
    the twin, sent nothing, runs its command."""
    plan = _plan(tmp_path, ["sleep", "30"])
    plan.strategy = _SignalledFork(signal_first=True)
    status = _wait(launch.spawn_held(plan, {}, [], False))
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
    assert handler_like_corrals == []  # it was the child's: corral's own never saw it

    plan = _plan(tmp_path, ["true"])
    plan.strategy = _SignalledFork(signal_first=False)
    status = _wait(launch.spawn_held(plan, {}, [], False))
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def _blocked_in_child(tmp_path: Path) -> set[int]:
    """The signals blocked in a command Direct's spawn starts, as its /proc status
    says."""
    plan = _plan(tmp_path, ["grep", "^SigBlk", "/proc/self/status"])
    plan.strategy = Direct()
    out_r, out_w = os.pipe()
    try:
        pid = launch.spawn_held(plan, {1: out_w}, [], False)
        os.close(out_w)
        out_w = -1
        text = b""
        while chunk := os.read(out_r, 4096):
            text += chunk
        assert os.WIFEXITED(_wait(pid)), text
    finally:
        os.close(out_r)
        if out_w >= 0:
            os.close(out_w)
    mask = int(text.split()[1], 16)
    return {sig for sig in range(1, 65) if mask & (1 << (sig - 1))}


def test_the_command_gets_the_held_signals_unblocked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocked for the fork, the signals are let go before the command runs, by the
    fork path and by posix_spawn alike, and corral's own mask is as it was."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    # Direct's spawn changes directory first: a fork
    assert _blocked_in_child(tmp_path).isdisjoint(launch.RESET_SIGNALS)
    spawned: list[int] = []
    real_spawn = launch._spawn

    def spawn(plan: Plan, child_fds: dict[int, int], env: dict[str, str]) -> int:
        spawned.append(1)
        return real_spawn(plan, child_fds, env)

    monkeypatch.setattr(launch, "_spawn", spawn)
    monkeypatch.setattr(
        Direct,
        "spawn",
        lambda self, plan, fds, procs, entered: launch.spawn_process(plan, fds, [], chdir=False),
    )
    assert _blocked_in_child(tmp_path).isdisjoint(launch.RESET_SIGNALS)
    assert spawned == [1]  # (that was posix_spawn)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, ()) == before


# Run in a process of its own (the signal's default action ends it): an Aftercare
# for a plan with a scratch directory, sent SIGTERM while it makes that directory.
SIGNALLED_SETUP = """
import os, signal, sys
from corral import launch
from corral.policy import Policy
from corral.tiers import get

policy = Policy(sys.argv[1])
tier = get("none")
plan = tier.plan(policy, ["true"], host=tier.gather(policy))
plan.scratch = sys.argv[2]
made = launch.prepare_scratch

def prepare(plan):
    made(plan)
    os.kill(os.getpid(), signal.SIGTERM)  # as if sent to corral as it starts
    print("held", flush=True)  # (not reached without the hold)

launch.prepare_scratch = prepare
launch.Aftercare(plan, "signalled")
print("not reached", flush=True)
"""


def test_a_sigterm_during_the_aftercares_setup_leaves_nothing(tmp_path: Path) -> None:
    """corral signalled between making what a run must undo and forking the guardian
    that undoes it if corral dies: the signal waits for the guardian, corral
    then dies of it, and the guardian removes the scratch directory; the twin,
    unsignalled, sets up to the end."""
    import subprocess
    import sys

    scratch = tmp_path / "scratch"
    run = subprocess.run(
        [sys.executable, "-c", SIGNALLED_SETUP, str(tmp_path), str(scratch)],
        capture_output=True,
        timeout=30,
    )
    assert run.returncode == -signal.SIGTERM and run.stdout == b"held\n", run
    deadline = time.monotonic() + 5
    while scratch.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not scratch.exists()  # the guardian's work

    plain = SIGNALLED_SETUP.replace("os.kill(os.getpid(), signal.SIGTERM)", "pass")
    run = subprocess.run(
        [sys.executable, "-c", plain, str(tmp_path), str(scratch)], capture_output=True, timeout=30
    )
    assert run.returncode == 0 and run.stdout == b"held\nnot reached\n", run


UNDO_SETUP = """
import os, sys
from corral import launch
from corral.policy import Policy
from corral.tiers import get

policy = Policy(sys.argv[1])
tier = get("none")
plan = tier.plan(policy, ["true"], host=tier.gather(policy))
plan.scratch = sys.argv[2]

def broken(plan, run_id):
    raise RuntimeError("a step broke")

if sys.argv[3] == "broken":
    launch.created_repositories = broken
care = launch.Aftercare(plan, "undo")
try:
    care.finish()
except RuntimeError as exc:
    print("raised:", exc, flush=True)
print("scratch left:", os.path.exists(sys.argv[2]), flush=True)
"""


def test_a_step_of_the_undo_that_breaks_leaves_the_others_done(tmp_path: Path) -> None:
    """The restore once broke on a tree a run made, and the undo ended there: the
    steps after it (quarantine, the scratch directory, the run's marker) never
    ran (found by attacking corral).  Now each step runs whatever one before it
    raised, and the first error is raised once all have.  The twin: with no step
    broken, nothing is raised and the scratch directory is gone alike."""
    import subprocess
    import sys

    for how, said in (("broken", b"raised: a step broke\n"), ("fine", b"")):
        scratch = tmp_path / how
        run = subprocess.run(
            [sys.executable, "-c", UNDO_SETUP, str(tmp_path), str(scratch), how],
            capture_output=True,
            timeout=30,
        )
        assert run.stdout == said + b"scratch left: False\n", run
