"""`corral shell` through a real pseudo-terminal: window size, job control, exit code."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time
from pathlib import Path

from conftest import Corral


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


def test_shell_through_a_pty(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 31, 101, 0, 0))
    os.chown(os.ttyname(slave), c.uid, c.gid)
    proc = subprocess.Popen(
        c.argv(["shell", "-q", "--", "sh", "-i"]),
        cwd=ws,
        env=c.env(),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    try:
        prompt = read_until(master, b"$ " if c.who == "user" else b"# ")
        assert prompt.endswith((b"$ ", b"# ")), prompt  # type only once the shell listens
        os.write(master, b"echo A$((6*7))B; stty size; tty; echo x > made-in-shell\n")
        out = read_until(master, b"101")
        assert b"A42B" in out, out  # the shell runs and answers
        assert b"31 101" in out, out  # the window size passed through
        # (a resize while running is relayed on SIGWINCH; only a terminal's foreground
        # group receives that signal, which this test harness does not reproduce)
        read_until(master, b"$ " if c.who == "user" else b"# ")
        os.write(master, b"exit 3\n")
        assert proc.wait(timeout=20) == 3  # the shell's exit code is corral's
    finally:
        proc.kill()
        os.close(master)
    assert (ws / "made-in-shell").read_text() == "x\n"
