"""The run's companion (the CLI's proxy) is forked by the run's guardian: the
fork then costs corral's own process nothing.  Real forks, no sandbox."""

from __future__ import annotations

import os

from corral.launch import _Guardian


def _read_all(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 256):
        data += chunk
    os.close(fd)
    return data


def test_the_guardian_forks_the_companion_first_and_it_stays_in_our_session() -> None:
    told_r, told_w = os.pipe()

    def fork_companion() -> None:  # what Door.fork does, in miniature
        if os.fork() == 0:
            os.write(told_w, f"{os.getppid()} {os.getsid(0)}".encode())
            os._exit(0)

    cleaned: list[int] = []
    guardian = _Guardian(cleaned.append, first=fork_companion)
    os.close(told_w)
    parent, session = (int(x) for x in _read_all(told_r).split())
    assert parent == guardian.pid  # not us: our process paid for one fork only
    assert session == os.getsid(0)  # forked before the guardian's setsid
    guardian.release()
    os.waitpid(guardian.pid, 0)
    assert cleaned == []  # released: nothing for it to undo (and never in our memory)


def test_without_first_the_guardian_is_as_before() -> None:
    guardian = _Guardian(lambda _pid: None)
    guardian.release()
    _, status = os.waitpid(guardian.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
