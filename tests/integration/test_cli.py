"""The CLI end to end: policy files, the activity log, doctor, pipes and setup failures."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import Corral


def test_policy_file_in_workspace_applies(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    (ws / "corral.toml").write_text(
        '[env]\npass = ["KEEP"]\nset = { FIXED = "from-policy" }\n'
        '[limits]\ntimeout = "1s"\noutput = "10B"\n'
    )
    c.chown(ws)
    r = c.sh(ws, "echo $KEEP $FIXED", env={"KEEP": "kept", "DROP": "dropped"})
    assert r.stdout == b"kept from-"  # output bound of 10 bytes from the policy
    assert b"output truncated" in r.stderr
    slow = c.sh(ws, "sleep 5")
    assert slow.returncode == 124  # timeout from the policy
    flag = c.sh(ws, "sleep 0.1; echo done", "--timeout", "10", "--output-limit", "1M")
    assert flag.returncode == 0 and flag.stdout == b"done\n"  # flags override the file


def test_bad_policy_file_names_file_line_and_key(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    (ws / "corral.toml").write_text('[limits]\ntimeout = "10s"\nmemory = "lots"\n')
    c.chown(ws)
    r = c.sh(ws, "echo never")
    assert r.returncode == 2
    assert r.stdout == b""
    line = r.stderr.decode()
    assert line.count("\n") == 1 and "Traceback" not in line
    assert f"{ws / 'corral.toml'}:3: limits.memory" in line
    (ws / "corral.toml").write_text("[limits]\ntimeuot = 3\n")
    r = c.sh(ws, "echo never")
    assert r.returncode == 2 and b":2: limits.timeuot: unknown key" in r.stderr
    other = ws / "other.toml"
    other.write_text('[network]\nmode = "none"\n')
    c.chown(other)
    ok = c.run(["run", "-q", "--policy", str(other), "--", "echo", "fine"], cwd=ws)
    assert ok.returncode == 0 and ok.stdout == b"fine\n"  # allow twin: a good file runs


def test_activity_log(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    c.sh(ws, "exit 4")
    c.sh(ws, "sleep 3", "--timeout", "0.5")
    r = c.run(["log", "--json"], cwd=ws)
    records = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(records) == 2
    first, second = records
    for key in (
        "run_id",
        "start",
        "end",
        "tier",
        "policy_digest",
        "argv",
        "exit",
        "duration",
        "limits_hit",
        "denials",
    ):
        assert key in first, key
    assert first["exit"] == 4 and first["tier"] == "namespace"
    assert first["argv"] == ["sh", "-c", "exit 4"]
    assert second["exit"] == 124 and "timeout" in second["limits_hit"]
    text = c.run(["log", "-n", "1"], cwd=ws).stdout.decode()
    assert text.count("\n") == 1 and "exit 124" in text and "limits: timeout" in text
    custom = c.state / "custom.jsonl"
    c.run(["run", "-q", "--log", str(custom), "--", "true"], cwd=ws)
    assert json.loads(custom.read_text())["exit"] == 0


def test_doctor_lists_every_tier(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    r = c.run(["doctor", "--json", "--probe"], cwd=ws)
    report = json.loads(r.stdout)
    names = {t["name"]: t for t in report["tiers"]}
    for name in (
        "namespace",
        "landlock",
        "container",
        "gvisor",
        "microvm",
        "firecracker",
        "seatbelt",
        "none",
    ):
        assert name in names and names[name]["reason"]
    assert names["namespace"]["available"] is True
    assert names["seatbelt"]["available"] is False and "macOS" in names["seatbelt"]["reason"]
    assert report["auto"] == "namespace"
    text = c.run(["doctor"], cwd=ws).stdout.decode()
    assert "namespace" in text and "auto -> namespace" in text


def test_pipeline_reader_exit_stops_the_command(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    proc = subprocess.Popen(
        c.argv(["run", "-q", "--timeout", "20", "--", "yes"]),
        cwd=ws,
        env=c.env(),
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stdout.read(4) == b"y\ny\n"
    proc.stdout.close()
    assert proc.wait(timeout=10) == 128 + 13  # SIGPIPE, as in a shell pipeline


def test_setup_failure_is_reported_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sandbox that cannot be built is exit 125 with bwrap's reason, never the
    command's exit code; its allow twin is the same plan without the broken mount."""
    from corral import launch, policy

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # not root's own
    from corral.errors import EXIT_SETUP, SetupError
    from corral.tiers.namespace import NamespaceTier

    pol = policy.load(str(tmp_path))
    good = NamespaceTier().plan(pol, ["true"])
    assert launch.run(good, launch.new_run_id()).exit_code == 0
    bad = NamespaceTier().plan(pol, ["true"])
    at = bad.argv.index("--chdir")
    bad.argv[at:at] = ["--ro-bind", str(tmp_path / "no-such-source"), "/mnt/x"]
    try:
        launch.run(bad, launch.new_run_id(), err_fd=os.open(os.devnull, os.O_WRONLY))
    except SetupError as exc:
        assert exc.code == EXIT_SETUP
        assert "no-such-source" in exc.message
    else:
        raise AssertionError("a broken sandbox ran")


def test_the_home_directory_is_refused_as_the_workspace(sandbox: tuple[Corral, Path]) -> None:
    """Run from ~ (an agent started there), the workspace would be the home
    directory, and a command could leave ~/.local/bin or a systemd unit to run
    later outside the sandbox.  The twin: a project directory works."""
    c, ws = sandbox
    script = "mkdir -p ~/.local/bin && touch ~/.local/bin/evil; echo ran"
    r = c.run(["run", "-q", "--", "sh", "-c", script], cwd=c.home)
    err = r.stderr.decode()
    assert r.returncode == 2 and err.count("\n") == 1, err
    assert "cannot be your home directory" in err and "project directory" in err, err
    assert not (c.home / ".local").exists() and r.stdout == b""
    ok = c.run(["run", "-q", "--", "sh", "-c", "echo ran"], cwd=ws)
    assert ok.returncode == 0 and ok.stdout == b"ran\n", ok.stderr


def test_explain_shows_names_the_sandbox_chose_escaped(sandbox: tuple[Corral, Path]) -> None:
    """--explain lists masked files by name: a name an earlier run chose, with
    terminal controls in it, cleared the screen and forged a line of corral's
    (found by attacking corral); shown escaped now, like every after-run line."""
    c, ws = sandbox
    forged = ".env.\x1b[1A\x1b[2Kcorral: all clear"
    for name in (".env.local", forged):
        (ws / name).write_text("KEY=1\n")
        c.chown(ws / name)
    r = c.run(["run", "--explain", "--", "true"], cwd=ws)
    assert r.returncode == 0, r
    out = r.stdout.decode()
    assert str(ws / ".env.local") in out  # the twin: a plain name, as it is
    assert "\x1b" not in out and ".env.\\x1b[1A\\x1b[2Kcorral: all clear" in out
