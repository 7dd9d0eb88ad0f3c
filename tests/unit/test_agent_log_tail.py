"""`corral agent log -n N` reads only the end of the agent's activity log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from corral import agentcli, runlog


def test_agent_log_reads_only_its_tail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "activity.jsonl"
    with open(path, "w") as fh:
        fh.write("x" * (2 << 20) + "\n")  # an old line the tail never reads
        for n in range(100):
            fh.write(
                json.dumps({"t": "T", "kind": "wake", "event": "task", "text": f"n{n}"}) + "\n"
            )
    got = runlog.tail(str(path), 3, block=4096)
    assert [r["text"] for r in got] == ["n97", "n98", "n99"]

    def whole(path: str | None = None) -> Any:
        raise AssertionError("read the whole log")

    with monkeypatch.context() as m:
        m.setattr(runlog, "read", whole)
        agentcli.show_log({"dir": str(tmp_path), "n": "2"})
    assert capsys.readouterr().out.splitlines()[-1].endswith("wake   task: n99")
    # the twin: all of it, with -n 0 (a record at a time); a short log's tail is all of it
    path.write_text("".join(json.dumps({"kind": "wake", "text": f"m{n}"}) + "\n" for n in range(5)))
    agentcli.show_log({"dir": str(tmp_path), "n": "0"})
    assert capsys.readouterr().out.count("\n") == 5
    assert [r["text"] for r in runlog.tail(str(path), 10)] == [f"m{n}" for n in range(5)]
