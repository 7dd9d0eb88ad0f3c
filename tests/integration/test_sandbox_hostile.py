"""A Sandbox driven by a caller that may be hostile (an MCP client, a model's tool
calls) or by commands that set traps for the next call: each case, found by
attacking the Python API and MCP faces from outside, once left the sandbox hung
or shut, and each has its twin showing the sandbox still serves."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from conftest import ROOT_BASE

from corral import policy as pol
from corral.sandbox import Sandbox, SandboxError
from tests.tiers import TierCase


@pytest.fixture
def sb(monkeypatch: pytest.MonkeyPatch, tier: TierCase) -> Iterator[Sandbox]:
    base = ROOT_BASE / ("hostile-" + uuid.uuid4().hex[:10])
    home, ws, state = base / "home", base / "ws", base / "state"
    for d in (home, ws, state):
        d.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    box = Sandbox(pol.load(str(ws)), **tier.api)
    try:
        yield box
    finally:
        box.close()
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def _serves(sb: Sandbox) -> None:
    assert sb.exec("echo still").stdout == b"still\n"


def test_files_read_takes_regular_files_only(sb: Sandbox) -> None:
    """A FIFO a command left held files.read forever, /dev/zero filled the agent's
    memory: both are refused with a reason; the twin, a file, reads."""
    sb.exec("mkfifo pipe.json && echo data > plain.txt")
    for path in ("pipe.json", "/dev/zero"):
        with pytest.raises((OSError, SandboxError)):
            sb.files.read(path)
    assert sb.files.read("plain.txt") == b"data\n"
    _serves(sb)


def test_a_nul_byte_in_a_path_or_argv_is_an_error_not_a_hang(sb: Sandbox) -> None:
    """A NUL in a file path left the call without a reply for good; in argv, env or
    cwd each call leaked the agent's descriptors until it could run nothing.
    Each is an error (126 for a command); the twin: the sandbox serves after
    hundreds of them."""
    with pytest.raises((OSError, SandboxError, ValueError)):
        sb.files.read("x\x00y")
    for _ in range(300):
        r = sb.exec(["echo", "a\x00b"])
        assert r.exit_code == 126, r
    assert b"NUL" in r.stderr or b"null" in r.stderr.lower(), r.stderr
    _serves(sb)


def test_a_timeout_below_zero_or_not_a_number_is_refused(sb: Sandbox) -> None:
    """A timeout of -31 made the host wait a time below zero, take the agent for
    hung and shut its channel: every later call failed.  ValueError at once; the
    twins: a timeout that stops a command, and the sandbox serving after."""
    for bad in (-31, float("nan"), float("inf"), 10**400):
        with pytest.raises(ValueError):
            sb.exec("true", timeout=bad)
    assert sb.exec("sleep 5", timeout=0.3).timed_out
    _serves(sb)


def test_stdin_a_command_does_not_read_holds_nothing_else(sb: Sandbox) -> None:
    """More stdin than a pipe holds, for a command that never reads it, blocked the
    agent's request loop: exec, files and kill all waited for that command.
    The twin: other calls are served meanwhile, and the kill ends it."""
    proc = sb.spawn("sleep 30")
    started = threading.Event()

    def flood() -> None:
        started.set()
        try:
            proc.write_stdin(b"x" * (1 << 20))
        except (OSError, SandboxError):
            pass

    writer = threading.Thread(target=flood, daemon=True)
    writer.start()
    started.wait()
    time.sleep(0.3)
    began = time.monotonic()
    _serves(sb)
    assert sb.files.exists("/tmp") is not None
    assert time.monotonic() - began < 5
    proc.kill()
    assert proc.wait(timeout=10).exit_code != 0


@pytest.mark.slow
def test_a_reset_empties_what_a_command_made_hard_to_remove(sb: Sandbox) -> None:
    """A directory a job made unwritable (chmod 0500) kept its contents for the next
    job, and one 1,100 levels deep made the reset fail for good (its exit never
    reached the host).  Both go; the twin: the next job runs in an empty /tmp."""
    try:
        sb.reset()
    except SandboxError as exc:
        pytest.skip(f"N.A.: {exc}")
    r = sb.exec_alone(
        "mkdir -p /tmp/keep && echo secret > /tmp/keep/f && chmod 0500 /tmp/keep; "
        "cd /tmp && for i in $(seq 1100); do mkdir a && cd a || break; done; echo made"
    )
    assert r.stdout.endswith(b"made\n"), r
    r = sb.exec_alone("ls -A /tmp")
    assert r.exit_code == 0 and r.stdout == b"", r


@pytest.mark.tiers(
    "namespace",
    "landlock",
    why="a container sandbox is never reset for another job: what one command changes "
    "reaches the next, as its files do",
)
def test_a_command_cannot_change_the_agents_limits_or_scheduling(sb: Sandbox) -> None:
    """The agent is pid 1, of the command's uid: a job set its limits (prlimit
    --pid 1), niceness and CPUs, and every later command of a reused sandbox
    inherited them (a file size limit of 10 bytes, nice 19, one CPU).  Refused;
    the twin: a command sets its own, and the next one starts with the agent's."""
    before = sb.exec("ulimit -f; ulimit -u; nice").stdout
    r = sb.exec(
        "prlimit --pid 1 --fsize=10:10 && echo limits; renice -n 19 -p 1 >/dev/null && echo nice; "
        "taskset -p 1 1 >/dev/null && echo cpus; ulimit -f 10 && ulimit -f"
    )
    assert r.stdout == b"10\n", r  # (its own: the twin)
    assert sb.exec("ulimit -f; ulimit -u; nice").stdout == before


def test_a_listing_too_large_for_one_frame_is_an_error(sb: Sandbox) -> None:
    """A directory of 45,000 long names made files.list's reply a 69 MB frame: the
    host took it for a malformed one, stopped the sandbox, and the next call hung
    (found by attacking the fixes).  EFBIG past 16 MiB; the twin: the sandbox
    serves after, and a small directory lists."""
    sb.exec(
        "python3 -c \"import os; os.mkdir('big'); "
        "[open('big/' + 'a' * 240 + '%08d' % i, 'w').close() for i in range(11000)]\""
    )
    with pytest.raises((OSError, SandboxError)):
        sb.files.list("big")
    sb.exec("mkdir -p small && touch small/one")
    assert [e["name"] for e in sb.files.list("small")] == ["one"]
    _serves(sb)
