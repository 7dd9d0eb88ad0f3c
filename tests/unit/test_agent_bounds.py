"""The agent runtime's activity log, bounded, each with its twin (the normal
thing still works): what one record holds, the log's rotation, a failed write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral import runlog
from corral.runtime import (
    LOG_ITEMS,
    LOG_TEXT,
    ActivityLog,
    bounded,
    summary,
)

JSON = dict[str, object]


def tool_answer(text: str) -> JSON:
    return {"role": "tool", "tool_call_id": "c", "content": text}


def call_message(arguments: str) -> JSON:
    fn = {"name": "write_file", "arguments": arguments}
    return {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": fn}]}


def size(history: list[list[JSON]]) -> int:
    return sum(len(json.dumps(m, ensure_ascii=False)) for msgs in history for m in msgs)


def test_summary() -> None:
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
