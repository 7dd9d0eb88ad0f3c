"""What corral's faces hand on of what a command made: text a client can encode,
lines a terminal shows as text, records a viewer cannot be steered by, sizes of
the workspace's own files only (each found by attacking corral; the twin of each
is the ordinary value passing as it was)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from corral import agentcli, batch, runlog, srt_settings, tools
from corral.errors import PolicyError


def test_a_name_that_is_no_utf8_becomes_text_a_client_can_encode() -> None:
    made = os.fsdecode(b"bad\xffname")  # a file name a command made, as files.list reads it
    value = {"entries": [{"name": made}, {"name": "ok.txt"}], made: 1}
    clean = tools._text_only(value)
    json.dumps(clean).encode("utf-8")  # (raised UnicodeEncodeError: the server died)
    assert clean == {"entries": [{"name": "bad\\xffname"}, {"name": "ok.txt"}], "bad\\xffname": 1}
    assert tools._text_only(["é", 3, None]) == ["é", 3, None]  # the twin: as it was


def test_an_agent_log_line_shows_a_commands_controls_as_text() -> None:
    record: dict[str, object] = {
        "t": "12:00:00",
        "kind": "tool",
        "name": "run_command",
        "arguments": {},
        "error": "denied by the sandbox's policy\x1b]52;c;Y3VybA==\x07\x1b[2K\u202e",
    }
    line = agentcli.line_of(record)
    assert line.isprintable() and "\\x1b]52;c;Y3VybA==\\x07" in line and "\\u202e" in line
    twin = agentcli.line_of({"t": "12:00:01", "kind": "tool", "name": "x", "exit_code": 0})
    assert twin.startswith("12:00:01  tool   x ") and twin.isprintable()


@pytest.mark.parametrize("text", ["a\x9b2J", "rtl\u202eexe.txt", "sep\u2028x", "\U000e0001tag"])
def test_a_record_spells_what_a_viewer_acts_on_as_escapes(text: str) -> None:
    """--report json went to the terminal with C1's CSI and a right-to-left override raw."""
    written = runlog.dumps({"path": text})
    assert written.isascii() and written.isprintable()
    assert json.loads(written) == {"path": text}
    assert runlog.dumps("café ü") == '"café ü"'  # the twin: letters stay letters


def test_an_artifact_behind_a_link_has_no_size(tmp_path: Path) -> None:
    """A job made a directory on the way a link to a host place: the size of a host
    file came back in the results."""
    ws, host = tmp_path / "ws", tmp_path / "host"
    ws.mkdir()
    host.mkdir()
    (host / "id_ed25519").write_bytes(b"k" * 12345)
    (ws / "d1").symlink_to(host)
    (ws / "out.txt").write_bytes(b"x" * 7)
    job = {
        "id": "j",
        "workspace": str(ws),
        "artifacts": ["d1/id_ed25519", "out.txt", "../host/id_ed25519"],
    }
    assert batch._artifacts(job) == [
        {"path": "d1/id_ed25519", "bytes": None},
        {"path": "out.txt", "bytes": 7},  # the twin: the workspace's own file
        {"path": "../host/id_ed25519", "bytes": None},
    ]


def test_a_settings_path_corral_cannot_follow_is_a_policy_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``allowWrite: ["/proc/1/root/etc"]`` as a user: "internal error" (123)."""
    real = os.path.realpath

    def refusing(path: str, *a: object, **k: object) -> str:
        if path.startswith("/proc/1/root"):
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(os.path, "realpath", refusing)
    data = {"filesystem": {"allowWrite": [".", "/proc/1/root/etc"]}}
    with pytest.raises(PolicyError, match="/proc/1/root/etc: Permission denied"):
        srt_settings.translate(data, "s.json", str(tmp_path), str(tmp_path))
    ok = srt_settings.translate(
        {"filesystem": {"allowWrite": ["."]}}, "s.json", str(tmp_path), str(tmp_path)
    )
    assert ok is not None  # the twin
