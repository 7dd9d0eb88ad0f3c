"""Putting descriptors at the numbers a child needs (corral.launch.dup_moves):
the pure plan of dup2 calls, checked on a model of a descriptor table, and the
real thing in a forked child."""

from __future__ import annotations

import os
import random

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
