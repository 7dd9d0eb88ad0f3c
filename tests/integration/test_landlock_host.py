"""The host's processes and terminals on the landlock tier, which has no pid
namespace and no devpts of its own (found by attacking corral):

- another terminal of the user's (a pty the run does not have) cannot be opened:
  a grant on all of /dev/pts let a command read the keys typed there; the twin:
  the run's own terminal reopens by name (``/dev/stdout``);
- a host process of the same uid cannot be pinned to a CPU or reniced (the
  kernel lets any process of a uid do it); the twin: the sandbox's own child
  and threads can be.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Corral

pytestmark = pytest.mark.tiers("landlock", why="a tier without a pid namespace or devpts")


def out(r: subprocess.CompletedProcess[bytes]) -> str:
    return (r.stdout + r.stderr).decode(errors="replace")


TERMINALS = """
import os, sys
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR | os.O_NOCTTY))
        print(path, "open")
    except OSError as exc:
        print(path, "errno", exc.errno)
with open("/dev/stdout", "w") as fh:  # the run's own terminal, reopened by its name
    fh.write("own terminal: written\\n")
"""


def test_another_terminal_is_out_of_reach_and_the_runs_own_is_not(
    tsandbox: tuple[Corral, Path],
) -> None:
    c, ws = tsandbox
    (ws / "terminals.py").write_text(TERMINALS)
    other_master, other = os.openpty()  # "the user's other terminal"
    own_master, own = os.openpty()  # the run's: its stdin, stdout and stderr
    for fd in (other, own):
        os.fchown(fd, c.uid, c.gid)
    other_name = os.ttyname(other)
    try:
        proc = subprocess.Popen(
            c.argv(["run", "-q", "--", "python3", "terminals.py", other_name]),
            cwd=ws,
            env=c.env(),
            stdin=own,
            stdout=own,
            stderr=own,
            start_new_session=True,
        )
        os.close(own)
        assert proc.wait(timeout=60) == 0
        shown = b""
        while b"own terminal" not in shown or not shown.endswith(b"\n"):
            shown += os.read(own_master, 4096)
    finally:
        for fd in (other_master, other, own_master):
            os.close(fd)
    text = shown.decode(errors="replace")
    assert f"{other_name} errno 13" in text, text  # EACCES: another pty of the user's
    assert "own terminal: written" in text, text  # the twin


PRIORITIES = """
import os, sys, threading
victim = int(sys.argv[1])
def attempt(what, action):
    try:
        action()
        print(what, "ok")
    except OSError as exc:
        print(what, "errno", exc.errno)
attempt("host-affinity", lambda: os.sched_setaffinity(victim, {0}))
attempt("host-nice", lambda: os.setpriority(os.PRIO_PROCESS, victim, 19))
attempt("host-idle", lambda: os.sched_setscheduler(victim, os.SCHED_IDLE, os.sched_param(0)))
child = os.fork()
if child == 0:
    os.execvp("sleep", ["sleep", "30"])
attempt("own-child-affinity", lambda: os.sched_setaffinity(child, {0}))
attempt("own-child-nice", lambda: os.setpriority(os.PRIO_PROCESS, child, 5))
def pin():
    attempt("own-thread-affinity", lambda: os.sched_setaffinity(threading.get_native_id(), {0}))
t = threading.Thread(target=pin)
t.start()
t.join()
os.kill(child, 9)
os.waitpid(child, 0)
"""


def test_a_host_process_cannot_be_pinned_or_reniced_and_the_sandboxs_own_can(
    tsandbox: tuple[Corral, Path],
) -> None:
    c, ws = tsandbox
    (ws / "priorities.py").write_text(PRIORITIES)
    victim = subprocess.Popen(
        c.python_argv(["-c", "import time; time.sleep(60)"]), env=c.env()
    )  # a host process of the same uid
    try:
        before = os.sched_getaffinity(victim.pid), os.getpriority(os.PRIO_PROCESS, victim.pid)
        r = c.run(["run", "-q", "--", "python3", "priorities.py", str(victim.pid)], cwd=ws)
        after = os.sched_getaffinity(victim.pid), os.getpriority(os.PRIO_PROCESS, victim.pid)
    finally:
        victim.kill()
        victim.wait()
    text = out(r)
    for what in ("host-affinity", "host-nice", "host-idle"):
        assert f"{what} errno 1" in text, text  # EPERM
    assert after == before
    for what in ("own-child-affinity", "own-child-nice", "own-thread-affinity"):
        assert f"{what} ok" in text, text  # the twins
    assert r.returncode == 0, text


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
