"""The landlock tier's reaper: whatever the command left behind goes with it."""

from __future__ import annotations

import os
import time

from corral import confine
from tests.procs import alive


def test_every_descendant_is_killed_and_the_sweep_ends() -> None:
    """A subreaper with a child, a grandchild and an orphan reparented to it: the
    sweep kills them all and returns (it used to wait for any child to end when
    a pass saw none, which a live child no list showed yet would never do).  The
    twin: with no children at all it returns at once."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the reaper
        code = 1
        try:
            confine._prctl(confine._PR_SET_CHILD_SUBREAPER, 1, "subreaper")
            child = os.fork()
            if child == 0:
                if os.fork() == 0:  # a grandchild, left running
                    time.sleep(60)
                    os._exit(0)
                if os.fork() == 0:  # an orphan: its parent exits, the reaper adopts it
                    if os.fork() == 0:
                        time.sleep(60)
                        os._exit(0)
                    os._exit(0)
                time.sleep(60)
                os._exit(0)
            time.sleep(0.3)
            os.write(ready_w, b"%d\n" % child)
            confine.kill_descendants()
            try:
                os.waitpid(-1, os.WNOHANG)
                os._exit(3)  # a child of the reaper's is left
            except ChildProcessError:
                pass
            started = time.monotonic()
            confine.kill_descendants()  # the twin: nothing left
            code = 0 if time.monotonic() - started < 0.1 else 2
        finally:
            os._exit(code)
    os.close(ready_w)
    child = int(os.read(ready_r, 32))
    os.close(ready_r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not alive(child)
