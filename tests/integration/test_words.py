"""Every message in corral's words: help, options that do not apply, a command that
cannot start, a policy that hides it, a working directory that cannot be entered,
policy file errors, --explain.  Real CLI, as root and as an unprivileged user."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SRC, Corral

from corral.cli import COMMANDS
from tests.tiers import absent, available


def lines(stderr: bytes) -> list[str]:
    return stderr.decode().splitlines()


def test_every_command_has_help_and_refuses_what_does_not_apply(
    sandbox: tuple[Corral, Path],
) -> None:
    c, ws = sandbox
    for command, (usage, _, _) in COMMANDS.items():
        r = c.run([command, "--help"], cwd=ws)
        assert (r.returncode, r.stderr) == (0, b""), (command, r)
        assert r.stdout.decode().startswith(f"usage: corral {command} {usage}\n")
    for args, said in (
        (["shell", "--timeout", "5"], "--timeout does not apply to corral shell: an interactive"),
        (["mcp", "--explain"], "--explain does not apply to corral mcp: the server speaks MCP"),
        (["log", "--host", "x"], "--host filters the network audit log: use it with --net"),
    ):
        r = c.run(args, cwd=ws)
        assert r.returncode == 2 and r.stdout == b""
        (line,) = lines(r.stderr)
        assert line.startswith(f"corral: {said}"), line
    # the allow twin: a command's own --help after -- is the command's
    r = c.run(["run", "-q", "--", "sh", "-c", 'echo "$1"', "sh", "--help"], cwd=ws)
    assert (r.returncode, r.stdout) == (0, b"--help\n")


def test_command_not_found_in_corrals_words(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    for net in ([], ["--allow", "127.0.0.1:9"]):  # straight, and through the network relay
        r = c.run(["run", "-q", *net, "--", "no-such-command", "x"], cwd=ws)
        assert r.returncode == 127, r
        said = lines(r.stderr)
        assert len(said) == 1, said
        assert said[0].startswith(
            "corral: no-such-command: command not found in the sandbox (PATH="
        )
        missing = c.run(["run", "-q", *net, "--", "./no-such-file"], cwd=ws)
        assert missing.returncode == 127
        (line,) = lines(missing.stderr)
        assert line.startswith("corral: ./no-such-file: no such file in the sandbox"), line
        (ws / "plain.txt").write_text("not a program\n")
        c.chown(ws)
        denied = c.run(["run", "-q", *net, "--", "./plain.txt"], cwd=ws)
        assert denied.returncode == 126
        assert lines(denied.stderr) == ["corral: cannot run ./plain.txt: Permission denied"]
        ok = c.run(["run", "-q", *net, "--", "sh", "-c", "echo found"], cwd=ws)
        assert (ok.returncode, ok.stdout) == (0, b"found\n")  # the allow twin


def test_a_policy_path_that_hides_the_command(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    (ws / "corral.toml").write_text('[env]\nset = { PATH = "/nonexistent" }\n')
    c.chown(ws)
    r = c.run(["run", "-q", "--", "sh", "-c", "true"], cwd=ws)
    assert r.returncode == 127
    (line,) = lines(r.stderr)
    assert line.startswith("corral: sh: command not found in the sandbox (PATH=/nonexistent")
    if c.tier is not None and c.tier.id in ("namespace", "landlock"):
        assert line.endswith("(PATH=/nonexistent, set by the policy)")
    ok = c.run(["run", "-q", "--", "/bin/sh", "-c", "echo $PATH"], cwd=ws)
    assert (ok.returncode, ok.stdout) == (0, b"/nonexistent\n")  # the allow twin


@pytest.mark.tiers("namespace", why="bwrap enters the working directory inside its mounts")
def test_a_working_directory_that_cannot_be_entered(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    private = ws / "private"
    private.mkdir()
    c.chown(ws)
    r = c.run(["run", "-q", "--read-deny", f"{private}/", "--", "pwd"], cwd=private)
    assert r.returncode == 125 and r.stdout == b""
    assert lines(r.stderr) == [
        f"corral: the namespace sandbox could not be set up: cannot enter the working "
        f"directory {private} inside the sandbox: Permission denied"
    ]
    ok = c.run(["run", "-q", "--read-deny", f"{private}/", "--", "pwd"], cwd=ws)
    assert (ok.returncode, ok.stdout) == (0, f"{ws}\n".encode())  # the allow twin


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[limits]\nmemory = 512\n", ":2: limits.memory: size 512 has no unit: write 512M"),
        ('[limits]\nmemory = "512K"\n', ":2: limits.memory: memory '512K' is too small"),
        ('[limits]\ntimeout = "1m"\n[network\n', ":3: invalid TOML: "),
        ('\n\ntier = "namspace"\n', ":3: tier: unknown tier 'namspace' (known: auto, "),
    ],
)
def test_policy_file_errors_name_file_line_and_key(
    sandbox: tuple[Corral, Path], text: str, expected: str
) -> None:
    c, ws = sandbox
    (ws / "corral.toml").write_text(text)
    c.chown(ws)
    r = c.run(["run", "-q", "--", "true"], cwd=ws)
    assert r.returncode == 2 and r.stdout == b""
    (line,) = lines(r.stderr)
    assert line.startswith(f"corral: {ws / 'corral.toml'}{expected}"), line
    (ws / "corral.toml").write_text('tier = "auto"\n[limits]\noutput = "1M"\ntmp = "64M"\n')
    assert c.run(["run", "-q", "--", "true"], cwd=ws).returncode == 0  # the allow twin


def test_explain_lists_network_and_syscall_rules(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    r = c.run(
        ["run", "--allow", "pypi.org", "--deny", "*.bad.test", "--explain", "--", "true"], cwd=ws
    )
    assert r.returncode == 0, r
    out = r.stdout.decode()
    assert "network: proxy (" in out and "  allow: pypi.org\n" in out
    assert "  deny: *.bad.test\n" in out
    assert "ArgCond" not in out and " when (" not in out
    assert "socket(domain not in AF_UNIX, AF_INET, AF_INET6) -> EAFNOSUPPORT" in out
    if c.tier is not None and c.tier.id != "gvisor":
        assert "clone(flags has CLONE_NEWUSER) -> EPERM" in out
    offline = c.run(["run", "--explain", "--", "true"], cwd=ws).stdout.decode()
    assert "network: none (" in offline


def test_env_certificates_pass_registries_when_named_values_set(
    tsandbox: tuple[Corral, Path],
) -> None:
    c, ws = tsandbox
    host = {
        "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
        "NODE_EXTRA_CA_CERTS": "/etc/corp-ca.pem",
        "PIP_INDEX_URL": "https://user:registry-token-1@pypi.test/simple",
        "NPM_CONFIG_REGISTRY": "https://npm.test/:_authToken=registry-token-2",
    }
    show = 'echo "$SSL_CERT_FILE|$NODE_EXTRA_CA_CERTS|$PIP_INDEX_URL|$NPM_CONFIG_REGISTRY|$GIVEN"'
    r = c.sh(ws, show, env=host)
    assert r.stdout == b"/etc/ssl/certs/ca-certificates.crt|/etc/corp-ca.pem|||\n"
    named = c.sh(ws, show, "--env", "PIP_INDEX_URL", "--env", "GIVEN=set-value-42", env=host)
    assert named.stdout == (
        b"/etc/ssl/certs/ca-certificates.crt|/etc/corp-ca.pem|"
        b"https://user:registry-token-1@pypi.test/simple||set-value-42\n"
    )
    # a value set on the command line reaches the environment, never an argv inside
    # (with its own pid namespace: every process in the sandbox; on landlock, which
    # shows the host's processes and corral's own command line with them: the command)
    procs = "/proc/[0-9]*/cmdline" if c.has("pidns") else "/proc/self/cmdline /proc/$$/cmdline"
    argv = c.sh(ws, f"cat {procs} | tr '\\0' ' '", "--env", "GIVEN=set-value-42", env=host)
    assert argv.returncode == 0 and b"set-value-42" not in argv.stdout
    assert b"sh -c" in argv.stdout or b"sh\x00-c" in argv.stdout or b"cat" in argv.stdout


def test_configs_with_tokens_are_unreadable(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    if not c.has("host-root"):
        pytest.skip("the container tiers do not see the host's home at all")
    home = c.home
    (home / ".npmrc").write_text("//registry.npmjs.org/:_authToken=npm-secret\n")
    for conf in (home / ".pip" / "pip.conf", home / ".config" / "pip" / "pip.conf"):
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text("[global]\nindex-url = https://u:pip-secret@pypi.test/\n")
    (home / ".gitconfig").write_text("[user]\n\tname = readable\n")
    c.chown(home)
    r = c.sh(
        ws,
        "cat ~/.npmrc ~/.pip/pip.conf ~/.config/pip/pip.conf 2>/dev/null; cat ~/.gitconfig",
    )
    assert b"secret" not in r.stdout
    assert b"name = readable" in r.stdout  # the allow twin: other dotfiles read fine


def test_report_json_for_a_run_that_could_not_start(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    private = ws / "private"
    private.mkdir()
    c.chown(ws)
    r = c.run(
        [
            "run",
            "-q",
            "--tier",
            "namespace",
            "--read-deny",
            f"{private}/",
            "--report",
            "json",
            "--",
            "true",
        ],
        cwd=private,
    )
    assert r.returncode == 125
    doc = json.loads(lines(r.stderr)[-1])
    assert doc["exit"] == 125 and doc["denials"] == []
    assert "cannot enter the working directory" in doc["error"]


@pytest.mark.skipif(
    "landlock" not in {c.id for c in available()},
    reason=f"the landlock tier cannot run here: {absent().get('landlock', '')}",
)
def test_corrals_words_when_corral_itself_is_out_of_the_commands_reach(tmp_path: Path) -> None:
    """A checkout under /tmp (out of a landlock sandbox's reach): a missing
    command is still said in corral's words with 127, not a silent 125."""
    shutil.copytree(SRC / "corral", tmp_path / "src" / "corral")
    ws = tmp_path / "ws"
    ws.mkdir()
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "PYTHONPATH": str(tmp_path / "src"),
        "PYTHONDONTWRITEBYTECODE": "1",  # nothing compiled ahead: every import reads source
    }
    argv = [sys.executable, "-P", "-m", "corral", "run", "--tier", "landlock", "-q", "--"]
    r = subprocess.run([*argv, "no-such-command"], cwd=ws, env=env, capture_output=True)
    assert r.returncode == 127 and b"corral: no-such-command" in r.stderr, r
    ok = subprocess.run([*argv, "sh", "-c", "echo ran"], cwd=ws, env=env, capture_output=True)
    assert ok.returncode == 0 and ok.stdout == b"ran\n", ok  # allow twin
