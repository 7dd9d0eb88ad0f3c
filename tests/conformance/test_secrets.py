"""Secret reads.  Evidence: a canary planted on the host, absent from everything
the sandbox printed; the allow twin reads a plain file beside it and its canary
does come out."""

# Probe programs are embedded one statement per line; wrapping them hurts more than long lines.
# ruff: noqa: E501

from __future__ import annotations

import os
import time

import pytest

from .conftest import Box, host_user_file, wait_for

SECRET_FILES = [
    ".ssh/id_ed25519",
    ".aws/credentials",
    ".config/gcloud/application_default_credentials.json",
    ".netrc",
    ".git-credentials",
    ".docker/config.json",
    ".kube/config",
    ".config/gh/hosts.yml",
    ".npmrc",
    ".pypirc",
    ".bash_history",
    ".gemini/oauth_creds.json",
    ".config/github-copilot/apps.json",
    ".cache/huggingface/token",
    ".dockercfg",
    ".config/solana/id.json",
    ".pulumi/credentials.json",
]


def _read_both(box: Box, secret: str, plain: str, *flags: str) -> tuple[str, str]:
    canary, twin = f"SECRET-{box.token}", f"PLAIN-{box.token}"
    if not box.c.has("host-root") and not plain.startswith((str(box.ws), ".")) and "/" in plain:
        # containers: the image is the root, so host files outside the workspace are
        # absent, the plain one beside the secret too; the twin reads a workspace file
        host_user_file(box, box.ws / "plain-twin.txt", f"{twin}\n")
        plain = "plain-twin.txt"
    r = box.py(
        f"attempt('attack', lambda: read({secret!r}))\n"
        f"attempt('list', lambda: sorted(os.listdir(os.path.dirname({secret!r}) or '.')))\n"
        f"attempt('twin', lambda: read({plain!r}))",
        *flags,
    )
    assert twin in r.out, r  # twin: the plain file beside it is readable
    return canary, r.out + r.err


@pytest.mark.parametrize("rel", SECRET_FILES)
def test_secret_file(box: Box, rel: str) -> None:
    secret = host_user_file(box, box.home / rel, f"SECRET-{box.token}\n", 0o600)
    plain = host_user_file(box, box.home / "notes.txt", f"PLAIN-{box.token}\n")
    canary, seen = _read_both(box, str(secret), str(plain))
    assert canary not in seen


def test_dotenv_in_workspace(box: Box) -> None:
    host_user_file(box, box.ws / ".env", f"API_KEY=SECRET-{box.token}\n", 0o600)
    host_user_file(box, box.ws / ".env.example", f"API_KEY=PLAIN-{box.token}\n")
    canary, seen = _read_both(box, ".env", ".env.example")
    assert canary not in seen


def test_read_deny_path(box: Box) -> None:
    secret = host_user_file(box, box.home / "work-secrets" / "token", f"SECRET-{box.token}\n")
    plain = host_user_file(box, box.home / "work" / "readme", f"PLAIN-{box.token}\n")
    canary, seen = _read_both(
        box, str(secret), str(plain), "--read-deny", str(box.home / "work-secrets") + "/"
    )
    assert canary not in seen


def test_secret_created_after_launch(box: Box) -> None:
    """A key written on the host while the sandbox runs stays invisible to it."""
    go = box.ws / "go"
    proc = box.popen(
        "while not os.path.exists('go'):\n    time.sleep(0.02)\n"
        f"attempt('attack', lambda: read({str(box.home / '.aws' / 'credentials')!r}))\n"
        "attempt('twin', lambda: read('go'))"
    )
    # The sandbox is up once the probe has started polling; give it a moment.
    time.sleep(0.5)
    host_user_file(box, box.home / ".aws" / "credentials", f"SECRET-{box.token}\n", 0o600)
    staged = box.ws / "go.staged"
    host_user_file(box, staged, f"PLAIN-{box.token}\n")
    os.rename(staged, go)  # appears whole: the probe must not read it half-written
    out, err = proc.communicate(timeout=30)
    seen = (out + err).decode(errors="replace")
    assert f"PLAIN-{box.token}" in seen, seen  # twin: a file created mid-run in the workspace
    assert f"SECRET-{box.token}" not in seen, seen


def test_launcher_environment(box: Box) -> None:
    """Variables of the launching shell do not reach the command unless passed by name."""
    env = {"AWS_SECRET_ACCESS_KEY": f"SECRET-{box.token}", "BUILD_ID": f"PLAIN-{box.token}"}
    r = box.py(
        "print(dict(os.environ))\n"
        "attempt('environ', lambda: open('/proc/self/environ', 'rb').read().decode())",
        "--env",
        "BUILD_ID",
        env=env,
    )
    assert f"PLAIN-{box.token}" in r.out, r  # twin: the named variable is passed
    assert f"SECRET-{box.token}" not in r.out + r.err, r


def test_shadow_file(box: Box) -> None:
    try:
        with open("/etc/shadow") as fh:
            first = fh.readline().strip()
    except OSError as exc:
        pytest.skip(f"N.A.: the host's /etc/shadow is unreadable to the test: {exc}")
    r = box.py(
        "attempt('attack', lambda: read('/etc/shadow'))\nattempt('twin', lambda: read('/etc/passwd'))"
    )
    assert "root:x:0:0" in r.out, r  # twin: /etc/passwd beside it is readable
    assert first not in r.out + r.err, r


def test_corral_own_logs(box: Box) -> None:
    """corral's activity log (which names past commands) is not readable from inside."""
    canary = f"SECRET-{box.token}"
    first = box.c.run(["run", "-q", "--", "true", canary], cwd=box.ws)
    assert first.returncode == 0, first
    log = box.c.state / "corral" / "runs.jsonl"
    assert wait_for(lambda: log.exists() and canary in log.read_text(), 5)
    host_user_file(box, box.ws / "twin.txt", f"PLAIN-{box.token}")
    r = box.py(
        f"attempt('attack', lambda: read({str(log)!r}))\n"
        f"attempt('list', lambda: os.listdir({str(log.parent)!r}))\n"
        "attempt('twin', lambda: read('twin.txt'))",
    )
    assert f"PLAIN-{box.token}" in r.out, r
    assert canary not in r.out + r.err, r
