"""The proxy worker's rehearsal: one exchange it plays to itself, inside itself."""

from __future__ import annotations

import os

import pytest

from corral.net import aio, rehearsal
from corral.net.hooks import Chain, Destination, Hook, HostRulesHook
from corral.net.rules import HostRules, Verdict


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_the_rehearsal_is_answered_by_its_stand_in() -> None:
    answer = rehearsal.rehearse()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nok\n")


def test_the_rehearsal_leaves_no_descriptor_open() -> None:
    rehearsal.rehearse(1)  # (imports and the first loop's lazy parts, once)
    before = open_fds()
    assert rehearsal.rehearse(3)
    assert open_fds() <= before  # (another test's descriptor may close meanwhile)


def test_its_proxy_goes_nowhere_but_its_stand_in() -> None:
    """Its chain allows only its own made-up host: a request for any other is
    refused by the proxy itself, and no stand-in origin is ever started."""
    elsewhere = b"GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n"
    refused = aio.run(rehearsal._play(elsewhere))
    assert refused.startswith(b"HTTP/1.1 403 ")
    allowed = aio.run(rehearsal._play())  # the twin: its own host, same proxy setup
    assert allowed.startswith(b"HTTP/1.1 200 ")


def test_a_failed_rehearsal_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(request: bytes = b"") -> bytes:
        raise OSError("no socket pairs today")

    monkeypatch.setattr(rehearsal, "_play", broken)
    assert rehearsal.rehearse() == b""


class Counting(Hook):
    """A hook that remembers being asked (so asking it is not free)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def on_connect(self, dest: Destination) -> Verdict | None:
        self.asked.append(dest.host)
        return None


def test_only_a_chain_whose_answers_are_pure_is_asked_ahead() -> None:
    hosts = HostRulesHook(HostRules.parse(["127.0.0.1:8080"], []))
    pure = Chain([hosts])
    rehearsal.ask_once(pure)
    assert pure.connect(Destination("r", "http", "127.0.0.1", 8080)).allowed  # (unchanged)
    assert not pure.connect(Destination("r", "http", rehearsal.HOST, 80)).allowed
    counting = Counting()
    rehearsal.ask_once(Chain([hosts, counting]))
    assert counting.asked == []
