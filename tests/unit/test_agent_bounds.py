"""The agent runtime's bounds on its pure parts, each with its twin (the normal
thing still works): the history's size, a tool answer's and a log record's,
the log's rotation and a failed write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral import runlog
from corral.runtime import (
    LOG_ITEMS,
    LOG_TEXT,
    ActivityLog,
    bound_history,
    bounded,
    cut,
    summary,
)

JSON = dict[str, object]


def tool_answer(text: str) -> JSON:
    return {"role": "tool", "tool_call_id": "c", "content": text}


def call_message(arguments: str) -> JSON:
    fn = {"name": "write_file", "arguments": arguments}
    return {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": fn}]}


def size(history: list[list[JSON]]) -> int:
    """The bytes these messages take in a request, as httpx sends them."""
    sent = (
        json.dumps(m, ensure_ascii=False, separators=(",", ":")) for msgs in history for m in msgs
    )
    return sum(len(text.encode()) for text in sent)


def test_history_is_cut_oldest_tool_answers_first() -> None:
    old: list[JSON] = [
        {"role": "user", "content": "[task] old"},
        call_message("{}"),
        tool_answer("a" * 50_000),
    ]
    now: list[JSON] = [
        {"role": "user", "content": "[task] now"},
        call_message(json.dumps({"content": "b" * 30_000})),
        tool_answer("c" * 30_000),
    ]
    history: list[list[JSON]] = [old, now]
    bound_history(history, 70_000)
    assert size(history) <= 70_000
    assert len(history) == 2  # shortening was enough: no event dropped
    assert str(old[2]["content"]).startswith("a" * 200 + "...[corral: 49800 characters left out")
    assert now[2]["content"] == "c" * 30_000  # the newest answer kept whole
    # a call's arguments shortened stay JSON
    bound_history(history, 10_000)
    args = now[1]["tool_calls"][0]["function"]["arguments"]  # type: ignore[index]
    assert json.loads(args) == {"corral": "30015 characters left out of the history"}


def test_history_drops_old_events_when_shortening_is_not_enough() -> None:
    history: list[list[JSON]] = [[{"role": "user", "content": "u" * 5000}] for _ in range(4)]
    bound_history(history, 12_000)
    assert len(history) == 2 and size(history) <= 12_000


def test_history_is_bounded_in_bytes_not_characters() -> None:
    history: list[list[JSON]] = [
        [{"role": "user", "content": "[task] x"}, tool_answer("é" * 40_000)],
        [{"role": "user", "content": "[task] y"}, tool_answer("€" * 40_000)],
    ]
    bound_history(history, 130_000)  # 200,000 bytes of UTF-8 in 80,000 characters
    assert size(history) <= 130_000


def test_a_small_history_is_left_as_it_is() -> None:
    history: list[list[JSON]] = [[{"role": "user", "content": "hi"}, tool_answer("x" * 1000)]]
    copy = json.loads(json.dumps(history))
    bound_history(history, 100_000)
    assert history == copy


def test_cut_and_summary() -> None:
    assert cut("short", 100) == "short"
    long = cut("a" * 100 + "b" * 100, 20)
    assert long == "a" * 10 + "\n[corral: 180 characters left out here]\n" + "b" * 10
    assert summary("one\ntwo") == "one\ntwo"
    text = "\n".join(f"line {n} " + "x" * 300 for n in range(1000))
    short = summary(text)
    lines = short.split("\n")
    assert len(lines) == 6 and lines[-1] == "[corral: 995 more lines]"
    assert all(len(line) <= 203 for line in lines)


def test_a_record_is_bounded() -> None:
    record = bounded({"error": "e" * 10_000, "denials": ["d"] * 1000, "n": 3, "ok": "fine"})
    assert isinstance(record, dict)
    assert len(record["error"]) < LOG_TEXT + 60 and record["error"].endswith(
        "8000 more characters]"
    )
    assert len(record["denials"]) == LOG_ITEMS + 1
    assert record["denials"][-1] == f"[corral: {1000 - LOG_ITEMS} more items]"
    assert (record["n"], record["ok"]) == (3, "fine")  # the twin: small values as they were
    deep: object = "x"
    for _ in range(50):
        deep = [deep]
    assert len(json.dumps(bounded(deep))) < LOG_TEXT + 200


def test_the_log_rotates_past_its_size(tmp_path: Path) -> None:
    log = ActivityLog(tmp_path / "activity.jsonl", max_bytes=10_000)
    for n in range(40):
        log.write("tool", n=n, error="x" * 1000)
    assert (tmp_path / "activity.jsonl").stat().st_size < 11_200
    assert (tmp_path / "activity.jsonl.1").stat().st_size < 11_200
    kept = list(runlog.read(str(tmp_path / "activity.jsonl")))
    assert kept[-1]["n"] == 39  # the newest are in the log itself


def test_a_failed_write_is_said_once_and_never_raised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "activity.jsonl"
    log = ActivityLog(path)
    log.write("start")  # the twin: written
    path.unlink()
    path.mkdir()  # now every write fails (as on a full disk)
    log.write("wake")
    log.write("answer")
    err = capsys.readouterr().err
    assert err.count("corral: agent: cannot write its log") == 1 and str(path) in err
