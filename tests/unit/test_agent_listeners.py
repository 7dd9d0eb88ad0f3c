"""The agent runtime's listeners, bounded: the file watcher's walk (iterative, a
depth bound, directories counted toward its limit) and the timer's ticks (one
queued or being handled at a time).  Each with its twin."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from corral.brain import ScriptedBrain
from corral.runtime import Event, FileWatch, Runtime, Timer


def test_file_watch_walks_a_deep_tree_without_recursion(tmp_path: Path) -> None:
    made = [tmp_path]
    for _ in range(1100):
        made.append(made[-1] / "d")
        made[-1].mkdir()
    (made[-1] / "bottom.txt").write_text("x")
    (tmp_path / "top.txt").write_text("x")
    (tmp_path / "d" / "d" / "near.txt").write_text("x")
    try:
        seen = FileWatch().scan(str(tmp_path))  # the 1,100 levels raised RecursionError
    finally:  # removed here, bottom up: pytest's cleanup recurses as deep
        (made[-1] / "bottom.txt").unlink()
        for directory in reversed(made[1:]):
            if directory.name == "d" and directory == made[2]:
                (directory / "near.txt").unlink()
            directory.rmdir()
    assert "top.txt" in seen and not any(p.endswith("bottom.txt") for p in seen)
    assert "d/d/near.txt" in seen  # the twin: what is not too deep is seen


def test_file_watch_counts_directories_toward_its_limit(tmp_path: Path) -> None:
    for n in range(300):
        (tmp_path / f"empty{n:03d}").mkdir()
    (tmp_path / "zz.txt").write_text("x")
    watch = FileWatch()
    watch.LIMIT = 100
    looked: list[str] = []
    real = os.scandir

    def counting(path: Any) -> Any:
        looked.append(str(path))
        return real(path)

    os.scandir, saved = counting, os.scandir  # type: ignore[assignment]
    try:
        watch.scan(str(tmp_path))
    finally:
        os.scandir = saved
    assert len(looked) == 1  # the first 100 entries used the budget: no directory entered
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f.txt").write_text("x")
    assert {"zz.txt", "sub/f.txt"} <= set(FileWatch().scan(str(tmp_path)))  # the twin


def test_timer_skips_ticks_while_its_event_waits(tmp_path: Path) -> None:
    async def go() -> tuple[int, int, int]:
        rt = Runtime(
            ScriptedBrain([]), directory=tmp_path / "agent"
        )  # not started: nothing handled
        timer = Timer(0.01)
        task = asyncio.create_task(timer(rt))
        await asyncio.sleep(0.3)
        queued = rt.queue.qsize()
        # the twin: once its event is answered, the next tick fires again
        _, future = rt.queue.get_nowait()
        future.set_result(None)  # type: ignore[arg-type]
        await asyncio.sleep(0.1)
        task.cancel()
        return queued, rt.queue.qsize(), timer.skipped

    queued, after, skipped = asyncio.run(go())
    assert queued == 1 and after == 1 and skipped > 5


def test_events_fired_by_hand_still_queue(tmp_path: Path) -> None:
    async def go() -> int:
        rt = Runtime(ScriptedBrain([]), directory=tmp_path / "agent")
        for n in range(3):
            rt.fire(Event("task", f"t{n}"))
        return rt.queue.qsize()

    assert asyncio.run(go()) == 3
