"""The door's tally pipe, read by the launcher when a run ends (pure parsing)."""

from __future__ import annotations

from corral.net.audit import describe, summary_line
from corral.net.door import Door


def read(text: str) -> tuple[dict[str, int], Door]:
    door = Door.__new__(Door)  # only the reader's state; no sockets, no processes
    door.errors = 0
    door.crashes = []
    return door._read_tally(text), door


def test_denials_from_every_worker_add_up() -> None:
    tally, door = read("deny\tevil.test:443\t2\nerrors\t0\ndeny\tevil.test:443\t1\nerrors\t0\n")
    assert tally == {"evil.test:443": 3}
    assert door.errors == 0 and door.crashes == []


def test_errors_and_crashes_are_counted() -> None:
    tally, door = read("errors\t2\ncrash\tproxy worker: OSError: no space (audit.py:40)\n")
    assert tally == {}
    assert door.errors == 3
    assert door.crashes == ["proxy worker: OSError: no space (audit.py:40)"]


def test_an_escaped_bad_name_stays_one_line_and_printable() -> None:
    tally, _ = read("deny\tevil.test\\x00.wild.test:1080\t1\nnot a line\n")
    assert tally == {"evil.test\\x00.wild.test:1080": 1}
    assert summary_line(tally).isprintable()


def test_describe_is_one_line_with_the_innermost_frame() -> None:
    def inner() -> None:
        raise ValueError("two\nlines")

    try:
        inner()
    except ValueError as exc:
        text = describe("connection", exc)
    assert text.startswith("connection: ValueError: two lines (test_net_door_tally.py:")
    assert "\n" not in text
