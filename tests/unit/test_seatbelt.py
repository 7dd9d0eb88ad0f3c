"""The Seatbelt profile builder, checked on its text (it cannot run on Linux)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from corral import seatbelt
from corral.policy import Policy
from corral.tiers.planned import SeatbeltTier


@pytest.fixture
def policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Policy:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    ws = tmp_path / "my project"
    ws.mkdir()
    return Policy(str(ws))


def test_deny_by_default_then_narrow_allows(policy: Policy) -> None:
    text = seatbelt.profile(policy)
    lines = text.splitlines()
    assert lines[:2] == ["(version 1)", "(deny default)"]
    # last match wins: each deny follows the allow it narrows
    assert text.index("(allow file-read*)") < text.index("(deny file-read*")
    assert text.index("(allow file-write*") < text.index("(deny file-write*")


def test_reads_hide_the_secrets(policy: Policy) -> None:
    text = seatbelt.profile(policy)
    home = str(Path(policy.home()))
    for secret in (".ssh", ".aws", ".gnupg", ".kube", ".docker"):
        assert f'(subpath "{home}/{secret}")' in text
    assert f'(literal "{home}/.netrc")' in text
    assert '(literal "/etc/shadow")' in text
    assert "\\.env" in text and "\\.env\\.example" in text  # .env denied, templates allowed


def test_writes_only_workspace_minus_write_deny(policy: Policy) -> None:
    text = seatbelt.profile(policy)
    write_allow = text[text.index("(allow file-write*") : text.index("(deny file-write*")]
    assert f'(subpath "{policy.workspace}")' in write_allow  # the space survives quoting
    assert '(subpath "/private/tmp")' in write_allow
    assert '(subpath "/")' not in write_allow
    deny = text[text.index("(deny file-write*") :]
    assert f'(literal "{policy.workspace}/corral.toml")' in deny
    assert f'(subpath "{policy.workspace}/.vscode")' in deny
    assert "\\.git/(modules/.*/)?(hooks|config|config\\.worktree|commondir)(/.*)?$" in deny


def test_network_only_to_the_proxy(policy: Policy) -> None:
    assert "(allow network" not in seatbelt.profile(policy)  # mode none: nothing
    policy.network.mode = "proxy"
    text = seatbelt.profile(policy, proxy_port=41234)
    allows = [line for line in text.splitlines() if line.startswith("(allow network")]
    assert allows == ['(allow network-outbound (remote tcp "localhost:41234"))']


def test_quoting_and_escaping() -> None:
    assert seatbelt.quote('a"b\\c') == '"a\\"b\\\\c"'
    assert seatbelt.regex_escape("/a.b/c+d") == "/a\\.b/c\\+d"
    assert seatbelt.path_filter("/x/dir/") == '(subpath "/x/dir")'
    assert seatbelt.path_filter("/x/file") == '(literal "/x/file")'


def test_tier_is_honest_off_macos(policy: Policy) -> None:
    tier = SeatbeltTier()
    health = tier.health()
    assert not health.available
    if sys.platform != "darwin":
        assert "macOS only" in health.reason
    plan = tier.plan(policy, ["true"])
    assert plan.argv[:2] == ["/usr/bin/sandbox-exec", "-p"] and plan.argv[-2:] == ["--", "true"]
    policy.network.mode = "proxy"
    proxied = tier.plan(policy, ["true"], door="127.0.0.1:41234")
    assert proxied.env["HTTPS_PROXY"] == "http://127.0.0.1:41234"
    assert '(allow network-outbound (remote tcp "localhost:41234"))' in proxied.argv[2]
    assert tier.door_transport == "tcp"
