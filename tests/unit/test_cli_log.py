"""Tests for `corral log` on hand-written activity logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral import cli, runlog

RECORDS: list[dict[str, object]] = [
    {
        "run_id": f"r{i}",
        "start": f"2024-01-01T00:00:0{i}.000Z",
        "tier": "namespace",
        "exit": i,
        "duration": 0.25,
        "argv": ["echo", str(i)],
    }
    for i in range(5)
]


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "runs.jsonl"
    for record in RECORDS:
        runlog.append(record, str(path))
    return path


def test_log_text_last_n(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["log", "--log", str(log), "-n", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert "r3" in lines[0] and "echo 3" in lines[0] and "0.250s" in lines[0]
    assert "r4" in lines[1]


def test_an_empty_log_says_so(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["log", "--log", str(log.parent / "none.jsonl")]) == 0
    out, err = capsys.readouterr()
    assert out == "" and err == f"corral: no run recorded in {log.parent / 'none.jsonl'}\n"
    assert cli.main(["log", "--log", str(log), "--run", "r4"]) == 0  # the twin
    out, err = capsys.readouterr()
    assert "r4" in out and err == ""


def test_log_json(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["log", "--json", "--log", str(log)]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == RECORDS


def test_log_extras(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "runs.jsonl"
    runlog.append(
        {"run_id": "x", "limits_hit": ["memory"], "denials": ["a", "b"], "error": "boom"},
        str(path),
    )
    assert cli.main(["log", "--log", str(path)]) == 0
    line = capsys.readouterr().out.strip()
    assert "limits: memory" in line and "denials: 2" in line and "error: boom" in line


def test_log_shows_proxy_errors_only_when_there_were_some(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "runs.jsonl"
    runlog.append({"run_id": "quiet", "proxy_errors": 0}, str(path))
    runlog.append({"run_id": "noisy", "proxy_errors": 2}, str(path))
    assert cli.main(["log", "--log", str(path)]) == 0
    quiet, noisy = capsys.readouterr().out.splitlines()
    assert "proxy errors" not in quiet
    assert "proxy errors: 2 (corral log --net --decision error)" in noisy


def test_log_n_zero_prints_nothing(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["log", "--log", str(log), "-n", "0"]) == 0
    assert capsys.readouterr().out == ""


def test_log_tolerates_null_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text('{"run_id": "x", "tier": null, "exit": null}\n')
    assert cli.main(["log", "--log", str(path)]) == 0
    assert "x" in capsys.readouterr().out


def test_a_sandbox_is_closed_not_an_unknown_exit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A long-lived sandbox has no one exit code (each command had its own): it is
    shown as closed; a run without a code still shows exit ?."""
    path = tmp_path / "runs.jsonl"
    runlog.append({"run_id": "s", "kind": "sandbox", "end": "2024-01-01T00:00:01Z"}, str(path))
    runlog.append({"run_id": "o", "kind": "sandbox"}, str(path))
    runlog.append({"run_id": "r", "kind": "run"}, str(path))
    assert cli.main(["log", "--log", str(path)]) == 0
    sandbox, still, run = capsys.readouterr().out.splitlines()
    assert "closed" in sandbox and "exit" not in sandbox
    assert "open" in still
    assert "exit ?" in run


def test_one_run_asked_for_shows_what_it_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`corral log --run ID` printed the summary alone; what was refused needed --json
    (found by trying corral as a new user).  Each refusal's line is recorded with it;
    the twin: the list of every run stays one line a run."""
    from corral import report
    from corral.policy import Policy

    policy = Policy(str(tmp_path))
    policy.network.mode = "proxy"
    entry = {"host": "evil\x1b[2J.test", "port": 443, "rule": "default", "reason": "not allowed"}
    (refused,) = report.network([entry], policy)
    path = tmp_path / "runs.jsonl"
    runlog.append({"run_id": "aaa1", "exit": 6, "denials": [refused.recorded()]}, str(path))
    runlog.append(
        {"run_id": "bbb2", "exit": 0, "denials": [{"kind": "file", "path": "/x"}]}, str(path)
    )
    assert cli.main(["log", "--log", str(path), "--run", "aaa"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "aaa1" in lines[0] and "denials: 1" in lines[0]
    assert lines[1] == (
        "    blocked: evil\\x1b[2J.test:443 (rule default: not allowed; "
        "allow with --allow evil\\x1b[2J.test:443)"
    )
    assert cli.main(["log", "--log", str(path), "--run", "bbb"]) == 0  # an older record
    assert capsys.readouterr().out.splitlines()[1] == '    {"kind": "file", "path": "/x"}'
    assert cli.main(["log", "--log", str(path)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_log_of_one_workspace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A new user with several projects could not tell whose runs were whose."""
    path = tmp_path / "runs.jsonl"
    here, there = tmp_path / "here", tmp_path / "there"
    for i, ws in enumerate((here, there, here)):
        ws.mkdir(exist_ok=True)
        runlog.append({**RECORDS[i], "workspace": str(ws)}, str(path))
    assert cli.main(["log", "--log", str(path), "--workspace", str(here)]) == 0
    shown = [line.split()[1] for line in capsys.readouterr().out.splitlines()]
    assert shown == ["r0", "r2"]
    assert cli.main(["log", "--log", str(path), "--workspace", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert out.out == "" and f"no run in workspace {tmp_path} recorded" in out.err


def test_the_net_log_is_read_holding_only_the_lines_shown_and_moved_aside_when_big(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sandbox flooding refused lookups grew net.jsonl without end, and `corral
    log --net` held every line in memory to print 20 (455 MB for a 60 MB log;
    found by attacking corral).  The last N by time are kept as the log is read,
    in time order (two workers' batches interleave), and a log past KEEP_BYTES is
    moved aside by the next run that opens it.  The twin: a small log stays."""
    from corral.net import audit

    path = tmp_path / "net.jsonl"
    times = [5, 1, 4, 2, 3, 9, 7]  # (as two workers' batches land)
    for t in times:
        line: dict[str, object] = {
            "time": f"2024-01-01T00:00:0{t}Z",
            "run_id": "r",
            "decision": "deny",
            "host": f"h{t}",
        }
        runlog.append(line, str(path))
    assert cli.main(["log", "--net", "--net-log", str(path), "-n", "3", "--json"]) == 0
    shown = [json.loads(x)["host"] for x in capsys.readouterr().out.splitlines()]
    assert shown == ["h5", "h7", "h9"]
    size = path.stat().st_size
    monkeypatch.setattr(audit, "KEEP_BYTES", size + 1)
    audit.Audit(str(path)).close()  # the twin: under the bound, kept
    assert path.stat().st_size == size and not Path(f"{path}.1").exists()
    monkeypatch.setattr(audit, "KEEP_BYTES", size - 1)
    audit.Audit(str(path)).close()
    assert Path(f"{path}.1").stat().st_size == size and path.stat().st_size == 0
