"""``[[network.rules]]`` and ``[secrets.NAME]`` in the policy file: what they load
to, and one clear line (file, line, key) for each kind of mistake."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral import policy
from corral.errors import EXIT_USAGE, PolicyError
from corral.policy import Policy

GOOD = """\
[network]
mode = "proxy"
allow = ["api.test", "*.git.test"]

[[network.rules]]
host = "api.test"
methods = ["get", "HEAD"]
paths = ["/v1/**", "/status?verbose=*"]
action = "allow"

[[network.rules]]
host = "api.test"
methods = ["POST"]
paths = ["/v1/upload"]
max_body = "1M"
action = "allow"

[[network.rules]]
host = "*.git.test"
git = "read"

[secrets.API_KEY]
from = "env:REAL_API_KEY"
hosts = ["api.test"]

[secrets.GH]
from = "file:~/gh-token"
hosts = ["*.git.test:443"]
header = "Authorization"
format = "Bearer {value}"
"""


def load(tmp_path: Path, text: str) -> Policy:
    path = tmp_path / "corral.toml"
    path.write_text(text)
    return policy.load(str(tmp_path))


def error(tmp_path: Path, text: str) -> str:
    with pytest.raises(PolicyError) as info:
        load(tmp_path, text)
    assert info.value.code == EXIT_USAGE
    message = info.value.message
    assert "\n" not in message
    return message


def test_rules_and_secrets_load_normalized(tmp_path: Path) -> None:
    p = load(tmp_path, GOOD)
    assert p.network.rules == [
        {
            "host": "api.test",
            "methods": ["GET", "HEAD"],
            "paths": ["/v1/**", "/status?verbose=*"],
            "action": "allow",
        },
        {
            "host": "api.test",
            "methods": ["POST"],
            "paths": ["/v1/upload"],
            "max_body": 1 << 20,
            "action": "allow",
        },
        {"host": "*.git.test", "git": "read"},
    ]
    api, gh = p.secrets["API_KEY"], p.secrets["GH"]
    assert (api.kind, api.ref, api.hosts, api.header) == ("env", "REAL_API_KEY", ["api.test"], "")
    assert (gh.kind, gh.header, gh.format) == ("file", "authorization", "Bearer {value}")
    policy.check_network(p)


def test_a_secret_file_is_masked_inside_the_sandbox(tmp_path: Path) -> None:
    p = load(tmp_path, GOOD)
    assert os.path.expanduser("~/gh-token") in p.read_deny_paths()
    p.filesystem.use_defaults = False  # defaults off: the secret's file still is
    assert os.path.expanduser("~/gh-token") in p.read_deny_paths()


def test_the_digest_view_names_sources_never_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REAL_API_KEY", "sk-value-never-shown")
    view = load(tmp_path, GOOD).to_dict()
    api = {"from": "env:REAL_API_KEY", "hosts": ["api.test"], "header": "", "format": "{value}"}
    gh = {
        "from": "file:~/gh-token",
        "hosts": ["*.git.test:443"],
        "header": "authorization",
        "format": "Bearer {value}",
    }
    assert view["secrets"] == {"API_KEY": api, "GH": gh}
    assert "sk-value-never-shown" not in repr(view)
    network = view["network"]
    assert isinstance(network, dict) and len(network["rules"]) == 3
    plain = Policy(str(tmp_path)).to_dict()  # absent when unused: older digests stay equal
    assert "secrets" not in plain and "rules" not in plain["network"]  # type: ignore[operator]


RULE = '[network]\nmode = "proxy"\nallow = ["a.test"]\n\n[[network.rules]]\nhost = "a.test"\n'


@pytest.mark.parametrize(
    ("extra", "line", "where", "why"),
    [
        ('action = "allow"\nverb = "GET"\n', 8, "network.rules[1].verb", "unknown key"),
        ('action = "permit"\n', 7, "network.rules[1].action", 'must be "allow", "deny"'),
        ('paths = ["/x"]\n', 5, "network.rules[1]", "missing action"),
        ('action = "allow"\npaths = ["api/*"]\n', 8, "network.rules[1].paths", "start with /"),
        ('action = "allow"\npaths = ["/a[bc]"]\n', 8, "network.rules[1].paths", "not allowed"),
        ('action = "allow"\npaths = ["/a**"]\n', 8, "network.rules[1].paths", "whole segment"),
        ('action = "allow"\npaths = []\n', 8, "network.rules[1].paths", "matches nothing"),
        ('action = "allow"\nmethods = ["GE T"]\n', 8, "network.rules[1].methods", "not an HTTP"),
        ('action = "deny"\nmax_body = "1M"\n', 8, "network.rules[1].max_body", "no body"),
        ('action = "allow"\nmax_body = "lots"\n', 8, "network.rules[1].max_body", "bad size"),
        ('git = "push"\n', 7, "network.rules[1].git", '"read" or "write"'),
        ('git = "read"\naction = "deny"\n', 8, "network.rules[1].action", "combined with git"),
    ],
)
def test_bad_rules_name_file_line_and_key(
    tmp_path: Path, extra: str, line: int, where: str, why: str
) -> None:
    message = error(tmp_path, RULE + extra)
    assert message.startswith(f"{tmp_path / 'corral.toml'}:{line}: {where}: "), message
    assert why in message


def test_bad_host_in_the_second_block_points_there(tmp_path: Path) -> None:
    text = RULE + 'action = "allow"\n\n[[network.rules]]\nhost = "a b.test"\naction = "deny"\n'
    message = error(tmp_path, text)
    assert "corral.toml:10: network.rules[2].host: bad host name" in message


def test_missing_host(tmp_path: Path) -> None:
    text = '[network]\nmode = "proxy"\n\n[[network.rules]]\naction = "allow"\n'
    assert "corral.toml:4: network.rules[1]: missing host" in error(tmp_path, text)


SECRET = '[network]\nmode = "proxy"\n\n[secrets.KEY]\n'
BASE = 'from = "env:K"\nhosts = ["a.test"]\n'


@pytest.mark.parametrize(
    ("extra", "line", "where", "why"),
    [
        (BASE + 'scope = "x"\n', 7, "secrets.KEY.scope", "unknown"),
        ('hosts = ["a.test"]\n', 4, "secrets.KEY", "missing from"),
        ('from = "env:K"\n', 4, "secrets.KEY", "missing hosts"),
        ('from = "vault:K"\nhosts = ["a.test"]\n', 5, "secrets.KEY.from", '"env:VARIABLE"'),
        ('from = "env:1K"\nhosts = ["a.test"]\n', 5, "secrets.KEY.from", '"env:VARIABLE"'),
        ('from = "file:"\nhosts = ["a.test"]\n', 5, "secrets.KEY.from", '"file:PATH"'),
        ('from = "env:K"\nhosts = []\n', 6, "secrets.KEY.hosts", "empty list"),
        ('from = "env:K"\nhosts = ["a..test"]\n', 6, "secrets.KEY.hosts", "bad host name"),
        (BASE + 'header = "X Key"\n', 7, "secrets.KEY.header", "not a header"),
        (BASE + 'header = "Host"\n', 7, "secrets.KEY.header", "frames or routes"),
        (BASE + 'format = "B {value}"\n', 7, "secrets.KEY.format", "needs header"),
        (BASE + 'header = "A"\nformat = "B"\n', 8, "secrets.KEY.format", "{value}"),
    ],
)
def test_bad_secrets_name_file_line_and_key(
    tmp_path: Path, extra: str, line: int, where: str, why: str
) -> None:
    message = error(tmp_path, SECRET + extra)
    assert message.startswith(f"{tmp_path / 'corral.toml'}:{line}: {where}: "), message
    assert why in message


@pytest.mark.parametrize("name", ["HOME", "HTTP_PROXY", "CORRAL_SANDBOX", "a-b", "1X"])
def test_secret_names_that_cannot_be_variables_of_their_own(tmp_path: Path, name: str) -> None:
    text = f'[secrets."{name}"]\nfrom = "env:K"\nhosts = ["a.test"]\n'
    assert f"secrets.{name}: " in error(tmp_path, text)


def checked(tmp_path: Path, text: str) -> str:
    p = load(tmp_path, text)
    with pytest.raises(PolicyError) as info:
        policy.check_network(p)
    return info.value.message


def test_secrets_need_the_proxy(tmp_path: Path) -> None:
    text = '[secrets.KEY]\nfrom = "env:K"\nhosts = ["a.test"]\n'
    assert "[secrets] need the proxy" in checked(tmp_path, text)


def test_a_secret_source_passed_into_the_sandbox_is_refused(tmp_path: Path) -> None:
    base = '[network]\nmode = "proxy"\n[secrets.KEY]\nfrom = "env:REAL"\nhosts = ["a.test"]\n'
    assert "REAL is passed into the sandbox" in checked(tmp_path, base + '[env]\npass = ["REAL"]\n')
    assert "KEY is also given" in checked(tmp_path, base + '[env]\nset = { KEY = "x" }\n')
    p = load(tmp_path, base)
    p.env.pass_names.append("REAL")  # as --env REAL does, after the file
    with pytest.raises(PolicyError, match="the real value would be inside"):
        policy.check_network(p)
