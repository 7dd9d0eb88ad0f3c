"""What killed runs leave, swept where a batch starts (corral.batch.sweep): a Ray
actor killed with its batch's driver takes its warm sandbox's guardian with it,
and the sandbox's cgroup, live-run marker and scratch directory stayed."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from corral import batch, cgroups


def _cgroup_parent() -> Path:
    for parent in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        if (parent / "cgroup.procs").exists() and os.access(parent, os.W_OK):
            return parent
    pytest.skip("making a cgroup needs root or a delegated cgroup, which this host lacks")


def test_an_empty_run_cgroup_is_swept_and_a_busy_or_new_one_is_not() -> None:
    parent = _cgroup_parent()
    tag = uuid.uuid4().hex[:8]
    empty, busy = parent / f"corral-sweep-{tag}-empty", parent / f"corral-sweep-{tag}-busy"
    empty.mkdir()
    busy.mkdir()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (busy / "cgroup.procs").write_text(str(sleeper.pid))
        cgroups.sweep_stale(now=time.time())
        assert empty.exists() and busy.exists()  # both new: a run may be starting
        cgroups.sweep_stale(now=time.time() + 2 * cgroups.STALE_AFTER)
        assert not empty.exists()
        assert busy.exists()  # the twin: a process is in it
    finally:
        sleeper.kill()
        sleeper.wait()
        for _ in range(100):  # the killed process leaves the cgroup as it is reaped
            try:
                busy.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)
        if empty.exists():
            empty.rmdir()


def test_warm_scratch_of_a_process_that_is_gone_is_swept() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    base = tempfile.gettempdir()
    dead = Path(tempfile.mkdtemp(prefix=f"{batch.WARM_SCRATCH}{gone.pid}-", dir=base))
    mine = Path(tempfile.mkdtemp(prefix=f"{batch.WARM_SCRATCH}{os.getpid()}-", dir=base))
    (dead / "net-0.jsonl").write_text("{}\n")
    try:
        batch.sweep()
        assert not dead.exists()
        assert mine.exists()  # the twin: its process lives
    finally:
        mine.rmdir()
