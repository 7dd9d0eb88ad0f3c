"""The agent's kept threads (``corral.agent.Workers``): a task gets a thread of its
own at once, a thread that finished is reused, an idle one ends, and a task's
error is reported to the host, not lost."""

from __future__ import annotations

import threading
import time

import pytest

from corral import agent


def _threads_of(workers: agent.Workers) -> set[int]:
    seen: set[int] = set()
    for _ in range(5):
        workers.run(lambda: seen.add(threading.get_ident())).wait(5)
    return seen


def _threads_back_to(count: int) -> bool:
    """Whether this process is down to ``count`` threads within 5 s (idle ones end)."""
    deadline = time.monotonic() + 5
    while threading.active_count() > count and time.monotonic() < deadline:
        time.sleep(0.01)
    return threading.active_count() == count


def test_a_finished_thread_takes_the_next_task() -> None:
    workers = agent.Workers()
    assert len(_threads_of(workers)) == 1


def test_tasks_that_block_each_get_a_thread_of_their_own() -> None:
    """An exec's waiter waits for its pumps: a task must never queue behind one
    that blocks, or the exec would hang."""
    workers = agent.Workers()
    release = threading.Event()
    blocked = [workers.run(release.wait) for _ in range(4)]
    later = workers.run(lambda: None)
    assert later.wait(5)  # ran although four threads are held
    assert not any(b.is_set() for b in blocked)
    release.set()
    assert all(b.wait(5) for b in blocked)
    assert len(_threads_of(workers)) >= 1


def test_threads_started_ahead_take_the_first_tasks_without_a_new_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A microVM's agent starts its threads before its state is saved: the first
    exec after a restore (two pumps and a waiter, blocked together) starts none."""
    monkeypatch.setattr(agent.Workers, "IDLE", 0.5)  # (and then they end: none left behind)
    workers = agent.Workers()
    before = threading.active_count()
    workers.prestart(3)
    assert threading.active_count() == before + 3
    release = threading.Event()
    held = [workers.run(release.wait) for _ in range(3)]
    assert threading.active_count() == before + 3  # the three waiting ones took them
    assert not any(h.is_set() for h in held)
    release.set()
    assert all(h.wait(5) for h in held)
    assert _threads_back_to(before)


def test_an_idle_thread_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent.Workers, "IDLE", 0.05)
    workers = agent.Workers()
    before = threading.active_count()
    release = threading.Event()
    held = [workers.run(release.wait) for _ in range(3)]
    assert threading.active_count() == before + 3
    release.set()
    assert all(h.wait(5) for h in held)
    assert _threads_back_to(before)
    assert workers.run(lambda: None).wait(5)  # and a new task still runs


def test_a_task_that_fails_is_reported_and_its_thread_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[dict[str, object]] = []
    monkeypatch.setattr(agent, "send", lambda header, payload=b"": sent.append(header))
    workers = agent.Workers()

    def fail() -> None:
        raise ValueError("broken")

    assert workers.run(fail).wait(5)
    assert sent == [{"ev": "error", "message": "agent: ValueError: broken"}]
    assert len(_threads_of(workers)) == 1
