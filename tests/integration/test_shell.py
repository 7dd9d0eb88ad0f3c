"""`corral shell` through a real pseudo-terminal: window size, job control, exit code.
On every tier: on the container tiers the shell's terminal is made inside the
container (corral.shell.TTY_RELAY), as on microvm (tested in test_vm.py)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import time
import uuid
from pathlib import Path

from conftest import Corral, pids_matching, wait_for


def read_until(fd: int, needle: bytes, timeout: float = 15) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    while needle not in data and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.1)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
    return data


def test_shell_through_a_pty(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 31, 101, 0, 0))
    os.chown(os.ttyname(slave), c.uid, c.gid)

    def own_terminal() -> None:  # as in a real terminal: corral's ctty, so it gets SIGWINCH
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        c.argv(["shell", "-q", "--", "sh", "-i"]),
        cwd=ws,
        env=c.env(),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        preexec_fn=own_terminal,
    )
    os.close(slave)
    try:
        prompt = read_until(master, b"$ " if c.who == "user" else b"# ")
        # type only once the shell listens (busybox's ash, in the test image, then
        # asks the terminal where its cursor is)
        assert prompt.rstrip(b"\x1b[6n").endswith((b"$ ", b"# ")), prompt
        os.write(master, b"echo A$((6*7))B; stty size; tty; echo x > made-in-shell\n")
        out = read_until(master, b"101")
        assert b"A42B" in out, out  # the shell runs and answers
        assert b"31 101" in out, out  # the window size passed through
        read_until(master, b"$ " if c.who == "user" else b"# ")
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        out = b""
        for _ in range(20):  # SIGWINCH reaches corral, which resizes the sandbox's terminal
            time.sleep(0.25)
            os.write(master, b"stty size\n")
            out += read_until(master, b"$ " if c.who == "user" else b"# ", 2)
            if b"40 120" in out:
                break
        assert b"40 120" in out, out  # a resize while running reaches the shell
        os.write(master, b"exit 3\n")
        assert proc.wait(timeout=20) == 3  # the shell's exit code is corral's
    finally:
        proc.kill()
        os.close(master)
    assert (ws / "made-in-shell").read_text() == "x\n"


def test_what_is_typed_while_the_sandbox_starts_reaches_the_shell(
    tsandbox: tuple[Corral, Path],
) -> None:
    """Keys typed before the shell is up are kept, not flushed when corral makes
    its terminal raw (tty.setraw's default drops them)."""
    c, ws = tsandbox
    master, slave = pty.openpty()
    os.chown(os.ttyname(slave), c.uid, c.gid)

    def own_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        c.argv(["shell", "-q", "--", "sh", "-i"]), cwd=ws, env=c.env(),
        stdin=slave, stdout=slave, stderr=slave, preexec_fn=own_terminal,
    )  # fmt: skip
    os.close(slave)
    try:
        os.write(master, b"echo typed-$((40+2)); exit 5\n")  # at once, no prompt yet
        assert b"typed-42" in read_until(master, b"typed-42", 60)
        assert proc.wait(timeout=30) == 5
    finally:
        proc.kill()
        os.close(master)


def test_shell_that_cannot_start_is_one_line(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    r = c.run(["shell", "-q", "--", "no-such-shell"], cwd=ws, input=b"")
    text = r.stdout + r.stderr  # the pty carries the shim's words to our stdout
    assert r.returncode == 127, text
    assert b"corral: no-such-shell: command not found in the sandbox" in text
    assert b"Traceback" not in text
    ok = c.run(["shell", "-q", "--", "sh", "-c", "echo started"], cwd=ws, input=b"")
    assert ok.returncode == 0 and b"started" in ok.stdout + ok.stderr  # the twin


def test_shell_is_recorded_and_speaks_corrals_words(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    r = c.run(["shell", "-q", "--", "sh", "-c", "echo in-shell; exit 3"], cwd=ws, input=b"")
    assert r.returncode == 3 and b"in-shell" in r.stdout
    missing = c.run(["shell", "-q", "--", "no-such-shell"], cwd=ws, input=b"")
    assert missing.returncode == 127
    assert b"corral: no-such-shell: command not found in the sandbox (PATH=" in missing.stdout
    records = [json.loads(x) for x in c.run(["log", "--json"], cwd=ws).stdout.splitlines()]
    assert [(x["kind"], x["argv"], x["exit"]) for x in records] == [
        ("shell", ["sh", "-c", "echo in-shell; exit 3"], 3),
        ("shell", ["no-such-shell"], 127),
    ]
    assert "[shell] sh -c echo in-shell; exit 3" in c.run(["log"], cwd=ws).stdout.decode()
    assert all(isinstance(x["duration"], float) and x["duration"] > 0 for x in records)
    # what the shell's end finds is told after it, as for corral run
    made = c.run(["shell", "-q", "--", "sh", "-c", "mkdir .idea"], cwd=ws, input=b"")
    assert made.returncode == 0
    assert f"corral: denied write: {ws / '.idea'} (write-deny) was created".encode() in made.stderr
    assert not (ws / ".idea").exists()


def interactive_shell(c: Corral) -> list[str]:
    """bash where the host's programs are the sandbox's (its line editor resets
    the terminal as it starts); the test image's busybox sh on the container tiers."""
    return ["bash", "--norc", "-i"] if c.has("host-root") else ["sh", "-i"]


def test_a_shell_whose_input_ends_ends_as_with_its_input_from_a_file(
    tsandbox: tuple[Corral, Path],
) -> None:
    """Input piped to corral shell, without ``exit``: the shell ends when it does,
    with its last command's exit code, as ``bash </dev/null`` would.  (A single ^D
    sent as the input ended came before the line editor read: a NUL to it.)"""
    c, ws = tsandbox
    argv = ["shell", "-q", "--", *interactive_shell(c)]
    piped = c.run(argv, cwd=ws, input=b"echo piped$((1+1))\n", timeout=30)
    assert piped.returncode == 0, piped.stdout + piped.stderr
    assert b"piped2" in piped.stdout
    assert c.run(argv, cwd=ws, input=b"", timeout=30).returncode == 0  # as </dev/null
    last = c.run(argv, cwd=ws, input=b"echo a; sleep 1\nfalse", timeout=30)
    assert last.returncode == 1, last.stdout  # the last line, unended, runs too
    ended = c.run(argv, cwd=ws, input=b"echo piped; exit 5\n", timeout=30)
    assert ended.returncode == 5, ended.stdout  # the twin: an exit of its own


def on_a_terminal(c: Corral, ws: Path, marker: str) -> tuple[subprocess.Popen[bytes], int, int]:
    """corral shell on a pty of ours, its controlling terminal (a SIGHUP comes when
    the pty's master is closed), once the shell has started ``sleep MARKER`` in
    the background; the process, the master, and a slave fd kept open."""
    master, slave = pty.openpty()
    os.chown(os.ttyname(slave), c.uid, c.gid)

    def own_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        c.argv(["shell", "-q", "--", *interactive_shell(c)]), cwd=ws, env=c.env(),
        stdin=slave, stdout=slave, stderr=slave, preexec_fn=own_terminal,
    )  # fmt: skip
    os.write(master, f"sleep {marker} & echo up-$((6*7))\n".encode())
    assert b"up-42" in read_until(master, b"up-42", 60)
    return proc, master, slave


def test_a_signal_to_corral_shell_kills_the_sandbox_and_is_recorded(
    tsandbox: tuple[Corral, Path],
) -> None:
    """SIGTERM to corral shell, as to corral run: the sandbox killed, corral's
    terminal out of raw mode, one closing line, the record and the exit code 143."""
    c, ws = tsandbox
    marker = f"44{uuid.uuid4().int % 1000:03d}"
    proc, master, slave = on_a_terminal(c, ws, marker)
    try:
        assert pids_matching(f"sleep {marker}")
        assert termios.tcgetattr(slave)[3] & termios.ICANON == 0  # corral made it raw
        os.kill(proc.pid, signal.SIGTERM)
        said = read_until(master, b"killed the sandbox\r\n")
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM
        assert wait_for(lambda: not pids_matching(f"sleep {marker}"), 10)
        said += read_until(master, b"never", 0.5)
        assert said.count(b"corral: ") == 1, said
        assert b"corral: received signal 15; killed the sandbox\r\n" in said
        assert termios.tcgetattr(slave)[3] & termios.ICANON  # raw mode undone
    finally:
        proc.kill()
        os.close(master)
        os.close(slave)
    record = json.loads(c.run(["log", "--json"], cwd=ws).stdout.splitlines()[-1])
    assert (record["kind"], record["exit"]) == ("shell", 128 + signal.SIGTERM)


def test_closing_corral_shells_terminal_kills_the_sandbox_and_is_recorded(
    tsandbox: tuple[Corral, Path],
) -> None:
    """The terminal closed under corral shell (SIGHUP): the sandbox killed, the
    record written with 129, corral's own exit code 129.  The twin first: a shell
    that exits on its own is recorded with its code and no closing line."""
    c, ws = tsandbox
    marker = f"45{uuid.uuid4().int % 1000:03d}"
    proc, master, slave = on_a_terminal(c, ws, marker)
    try:
        os.write(master, b"kill %1; exit 5\n")
        assert proc.wait(timeout=20) == 5
        said = read_until(master, b"never", 0.5)
        assert b"corral: " not in said, said
        assert termios.tcgetattr(slave)[3] & termios.ICANON  # raw mode undone
    finally:
        proc.kill()
        os.close(master)
        os.close(slave)
    marker = f"46{uuid.uuid4().int % 1000:03d}"
    proc, master, slave = on_a_terminal(c, ws, marker)
    try:
        os.close(slave)
        os.close(master)  # the terminal is gone: its session leader, corral, gets SIGHUP
        assert proc.wait(timeout=20) == 128 + signal.SIGHUP
        assert wait_for(lambda: not pids_matching(f"sleep {marker}"), 10)
    finally:
        proc.kill()
    records = [json.loads(x) for x in c.run(["log", "--json"], cwd=ws).stdout.splitlines()]
    assert [(x["kind"], x["exit"]) for x in records[-2:]] == [
        ("shell", 5),
        ("shell", 128 + signal.SIGHUP),
    ]


def test_a_policy_timeout_is_said_not_to_apply_to_a_shell(tsandbox: tuple[Corral, Path]) -> None:
    """`--timeout` is refused by corral shell; a policy file's [limits] timeout (the
    file is corral run's too) is not applied either, and that is said once on
    stderr and in the shell's record, not passed over in silence."""
    c, ws = tsandbox
    (ws / "corral.toml").write_text('[limits]\ntimeout = "1s"\n')
    c.chown(ws / "corral.toml")
    script = ["sh", "-c", "sleep 2; echo past-the-timeout"]
    r = c.run(["shell", "--", *script], cwd=ws, input=b"", timeout=60)
    assert r.returncode == 0 and b"past-the-timeout" in r.stdout, r
    said = b"corral: note: the policy's [limits] timeout (1s) does not apply to corral shell"
    assert r.stderr.count(said) == 1, r
    record = json.loads(c.run(["log", "--json"], cwd=ws).stdout.splitlines()[-1])
    assert record["kind"] == "shell" and record["bounds"]["timeout"]["enforced"] is False
    explained = c.run(["shell", "--explain"], cwd=ws)
    assert b"NOT enforced: an interactive shell ends when you leave it" in explained.stdout
    # twins: corral run applies the same policy's timeout; without one, no word
    assert c.run(["run", "-q", "--", *script], cwd=ws).returncode == 124
    (ws / "corral.toml").unlink()
    r = c.run(["shell", "--", "true"], cwd=ws, input=b"", timeout=60)
    assert r.returncode == 0 and b"does not apply" not in r.stderr, r
