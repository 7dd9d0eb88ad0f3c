"""Putting descriptors at the numbers a child needs (corral.launch.dup_moves):
the pure plan of dup2 calls, checked on a model of a descriptor table, and the
real thing in a forked child."""

from __future__ import annotations

import os
import random
import socket
import stat
from pathlib import Path

import pytest

from corral.launch import dup_moves, move_fds_into_place


def apply(table: dict[int, str], moves: list[tuple[int, int]]) -> dict[int, str]:
    """dup2 on a model table: number -> what it refers to."""
    out = dict(table)
    for source, target in moves:
        out[target] = out[source]
    return out


@pytest.mark.parametrize(
    "wanted",
    [
        {0: 0, 1: 5, 2: 7},  # stdin passed through as itself
        {0: 3, 3: 0},  # a swap
        {0: 5, 5: 7, 7: 9, 9: 0},  # a cycle through the targets
        {3: 4, 4: 4, 5: 3},  # a source that is its own target beside others
        {0: 21, 1: 21, 2: 21},  # one source at several numbers
    ],
)
def test_every_target_ends_holding_its_sources_object(wanted: dict[int, int]) -> None:
    table = {n: f"file{n}" for n in {*wanted, *wanted.values(), 0, 1, 2}}
    moves, parked = dup_moves(wanted)
    after = apply(table, moves)
    assert all(after[t] == table[s] for t, s in wanted.items())
    assert not set(parked) & {*wanted, *wanted.values()}  # copies never land on one in use


def test_random_overlaps_always_come_out_right() -> None:
    rng = random.Random(7)
    for _ in range(500):
        numbers = list(range(12))
        targets = rng.sample(numbers, rng.randint(1, 8))
        wanted = {t: rng.choice(numbers) for t in targets}
        table = {n: f"file{n}" for n in numbers}
        after = apply(table, dup_moves(wanted)[0])
        assert all(after[t] == table[s] for t, s in wanted.items()), wanted


def test_a_forked_child_gets_exactly_the_descriptors_asked_for() -> None:
    """The real dup2s: a cycle through the targets, and nothing else crosses."""
    pipes = [os.pipe() for _ in range(3)]
    report_r, report_w = os.pipe()
    a, b, c = (r for r, _ in pipes)
    inode = {fd: os.fstat(fd).st_ino for fd in (a, b, c)}
    wanted = {a: b, b: c, c: a, 60: report_w}  # each pipe's read end moves to another's number
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            move_fds_into_place(wanted)
            line = ",".join(f"{n}:{os.fstat(n).st_ino}" for n in (a, b, c))
            line += ";" + ",".join(sorted(os.listdir("/proc/self/fd"), key=int))
            os.write(60, line.encode())
        finally:
            os._exit(0)
    os.close(report_w)
    _, status = os.waitpid(pid, 0)
    got = os.read(report_r, 4096).decode()
    for fd in (report_r, *(x for p in pipes for x in p)):
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    where, _, left = got.partition(";")
    assert dict(x.split(":") for x in where.split(",")) == {
        str(a): str(inode[b]),
        str(b): str(inode[c]),
        str(c): str(inode[a]),
    }
    # 0-2 stay, and the listing's own descriptor; nothing else crosses
    kept = {"0", "1", "2", str(a), str(b), str(c), "60"}
    listed = set(left.split(","))
    assert kept <= listed and len(listed - kept) <= 1, listed


# --- what may cross to a sandboxed command (corral.launch.unpassable, stdin_feed) ---


def test_a_directory_a_host_file_or_an_o_path_may_not_be_passed(tmp_path: Path) -> None:
    """Each is a way to the host's tree or inode past the sandbox's mounts."""
    from corral.launch import unpassable

    (tmp_path / "f").write_text("x")
    for path, flags, words in (
        (tmp_path, os.O_RDONLY | os.O_DIRECTORY, "is a directory"),
        (tmp_path / "f", os.O_RDONLY, "is a file on the host"),
        (tmp_path / "f", os.O_PATH, "is an O_PATH descriptor"),
        (tmp_path, os.O_PATH, "is an O_PATH descriptor"),
    ):
        fd = os.open(path, flags)
        try:
            why = unpassable(fd)
        finally:
            os.close(fd)
        assert why is not None and why.startswith(words), (path, flags, why)


def test_a_pipe_a_socket_a_device_or_a_memfd_may_be_passed() -> None:
    """The twin: nothing behind them but themselves."""
    from corral.launch import unpassable

    r, w = os.pipe()
    a, b = socket.socketpair()
    null = os.open(os.devnull, os.O_RDWR)
    mem = os.memfd_create("corral-test")  # a regular file with no name on the host
    try:
        assert [unpassable(fd) for fd in (r, w, a.fileno(), null, mem)] == [None] * 5
    finally:
        for fd in (r, w, null, mem):
            os.close(fd)
        a.close()
        b.close()


def test_stdin_from_a_file_becomes_a_pipe_and_the_usual_stdin_stays(tmp_path: Path) -> None:
    from corral.launch import stdin_feed

    (tmp_path / "f").write_text("x")
    r, w = os.pipe()
    null = os.open(os.devnull, os.O_RDONLY)
    assert stdin_feed(r) is None and stdin_feed(null) is None  # no work: passed as they are
    os.close(r)
    os.close(w)
    os.close(null)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    feed = stdin_feed(fd)
    assert feed is not None and feed[1] >= 0
    assert stat.S_ISFIFO(os.fstat(feed[0]).st_mode)  # the command's end: a pipe
    for n in (fd, *feed):
        os.close(n)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    feed = stdin_feed(fd)  # a directory: nothing to read, /dev/null instead of its tree
    assert feed is not None and feed[1] == -1
    assert os.path.samestat(os.fstat(feed[0]), os.stat(os.devnull))
    os.close(fd)
    os.close(feed[0])


def test_a_terminal_set_to_swallow_writes_is_a_reader_gone() -> None:
    """A command may set its terminal's line discipline to n_null during the run:
    corral's relay of its output then stops as for a closed pipe, not with an
    internal error; a terminal as it should be takes the bytes (the twin)."""
    import fcntl
    import struct
    import termios

    from corral.launch import _write_all

    master, slave = os.openpty()
    try:
        assert _write_all(slave, b"x") is True
        try:
            fcntl.ioctl(slave, termios.TIOCSETD, struct.pack("i", 27))
        except OSError:
            pytest.skip("n_null is not available on this kernel")
        assert _write_all(slave, b"x") is False
    finally:
        os.close(master)
        os.close(slave)
