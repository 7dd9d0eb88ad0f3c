"""Tests for corral.runlog: the small JSON encoder, append() and read()."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral import runlog

LONE_SURROGATES = os.fsdecode(b"caf\xe9 \xff\xfe/bin")

VALUES: list[object] = [
    None,
    True,
    False,
    0,
    -17,
    2**70,
    1.5,
    -0.0,
    1e300,
    1e-7,
    "",
    "plain",
    'quote " and backslash \\ and both \\"',
    "control \x00 \x01 \x08 \t \n \r \x1b \x1f \x7f end",
    "unicode: é ü 漢字 🐍 \u2028 \u2029 \ufeff",
    LONE_SURROGATES,
    "\udc80",
    "\udcff\udc80",
    [],
    {},
    [1, [2, [3, [4, []]]], {"k": None}],
    {"nested": {"list": [{"a": "b\n"}, "c\\d"], "t": (1, "two")}, "": "empty key"},
    {"argv": ["sh", "-c", 'echo "$HOME" \\n'], "exit": 0, "denials": []},
]


@pytest.mark.parametrize("value", VALUES)
def test_dumps_round_trips(value: object) -> None:
    text = runlog.dumps(value)
    expected = json.loads(json.dumps(value))  # tuples become lists
    assert json.loads(text) == expected
    assert "\n" not in text
    text.encode("utf-8")  # surrogates are escaped, so this never raises


def test_dumps_non_finite_floats_are_null() -> None:
    assert runlog.dumps([float("nan"), float("inf"), -float("inf")]) == "[null,null,null]"


def test_dumps_other_types_and_keys() -> None:
    assert json.loads(runlog.dumps({1: Path("/x"), "s": {3}})) == {"1": "/x", "s": "{3}"}


def test_dumps_surrogates_survive() -> None:
    decoded = json.loads(runlog.dumps({"path": LONE_SURROGATES}))
    assert decoded["path"] == LONE_SURROGATES
    assert os.fsencode(decoded["path"]) == b"caf\xe9 \xff\xfe/bin"


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.usefixtures("umask_022")
def test_append_creates_private_dir_and_file(tmp_path: Path) -> None:
    target = tmp_path / "state" / "corral" / "runs.jsonl"
    runlog.append({"run_id": "a", "exit": 0}, str(target))
    runlog.append({"run_id": "b", "argv": ["x\ny"]}, str(target))
    assert stat.S_IMODE(os.stat(target.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    lines = target.read_bytes().split(b"\n")
    assert lines[-1] == b""
    assert [json.loads(line) for line in lines[:-1]] == [
        {"run_id": "a", "exit": 0},
        {"run_id": "b", "argv": ["x\ny"]},
    ]
    assert [r["run_id"] for r in runlog.read(str(target))] == ["a", "b"]


def test_default_path_follows_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert runlog.state_dir() == str(tmp_path / "xdg" / "corral")
    runlog.append({"n": 1})
    assert list(runlog.read()) == [{"n": 1}]
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert runlog.default_path() == str(
        tmp_path / "home" / ".local" / "state" / "corral" / "runs.jsonl"
    )


def test_read_skips_garbage(tmp_path: Path) -> None:
    log = tmp_path / "runs.jsonl"
    log.write_text(
        '{"run_id": "one"}\n'
        "not json at all\n"
        "\n"
        '{"run_id": "truncat\n'
        "[1, 2, 3]\n"
        '"a string"\n'
        '{"run_id": "two", "argv": ["\\udc80"]}\n'
    )
    records = list(runlog.read(str(log)))
    assert [r["run_id"] for r in records] == ["one", "two"]


def test_read_missing_file_is_empty(tmp_path: Path) -> None:
    assert list(runlog.read(str(tmp_path / "none.jsonl"))) == []


def test_read_skips_invalid_utf8(tmp_path: Path) -> None:
    log = tmp_path / "runs.jsonl"
    log.write_bytes(b'{"run_id": "one"}\n\xff\xfe broken \xc3\n{"run_id": "two"}\n')
    assert [r["run_id"] for r in runlog.read(str(log))] == ["one", "two"]


def test_digest_is_stable_and_short() -> None:
    a = {"workspace": "/w", "limits": {"memory": 1}, "env": ["A"]}
    b = {"workspace": "/w", "limits": {"memory": 1}, "env": ["A"]}
    d = runlog.digest(a)
    assert d == runlog.digest(b)
    assert len(d) == 16
    assert all(c in "0123456789abcdef" for c in d)
    assert runlog.digest({**a, "workspace": "/v"}) != d
    assert runlog.digest(LONE_SURROGATES) == runlog.digest(LONE_SURROGATES)


def test_iso_format() -> None:
    assert runlog.iso(0.0) == "1970-01-01T00:00:00.000Z"
    assert runlog.iso(86400 + 1.25) == "1970-01-02T00:00:01.250Z"


def test_a_log_is_never_written_through_a_link(tmp_path: Path) -> None:
    """A record appended through a symlink (or to a hard link) a run left where a log
    was landed in a file outside: refused, nothing written there; the twin, a
    plain log, takes the record."""
    outside = tmp_path / "outside"
    outside.write_text("# mine\n")
    (tmp_path / "linked.jsonl").symlink_to(outside)
    os.link(outside, tmp_path / "hard.jsonl")
    for name in ("linked.jsonl", "hard.jsonl"):
        with pytest.raises(OSError):
            runlog.append({"run_id": "x"}, str(tmp_path / name))
    assert outside.read_text() == "# mine\n"
    runlog.append({"run_id": "x"}, str(tmp_path / "plain.jsonl"))
    assert (tmp_path / "plain.jsonl").read_text() == '{"run_id":"x"}\n'


def test_a_relative_xdg_state_home_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    """The XDG rule: a relative XDG_STATE_HOME is ignored (landlock's split looped
    forever on one); the twin: an absolute one, normalized, is used."""
    monkeypatch.setenv("HOME", "/home/someone")
    monkeypatch.setenv("XDG_STATE_HOME", ".st")
    assert runlog.state_dir() == "/home/someone/.local/state/corral"
    monkeypatch.setenv("XDG_STATE_HOME", "/var//st/")
    assert runlog.state_dir() == "/var/st/corral"


def test_a_log_reached_through_a_symlink_in_a_writable_place_is_refused(tmp_path: Path) -> None:
    """An earlier landlock run swapped a log's directory for a symlink, and the next
    run's keep_out pinned the swapped one: refused; the twins: an operator's link
    above the writable place, and a plain directory, are fine."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (ws / "real").mkdir(parents=True)
    outside.mkdir()
    (ws / "logs").symlink_to(outside)
    (tmp_path / "wslink").symlink_to(ws)
    deny: list[str] = []
    with pytest.raises(OSError, match="symlink in a writable place"):
        runlog.keep_out(deny, str(ws / "logs" / "run.jsonl"), writable=[str(ws)])
    assert list(outside.iterdir()) == []
    runlog.keep_out(deny, str(tmp_path / "wslink" / "real" / "a.jsonl"), writable=[str(ws)])
    runlog.keep_out(deny, str(ws / "real" / "b.jsonl"), writable=[str(ws)])
    assert len(deny) == 2
