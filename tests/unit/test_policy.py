"""Tests for corral.policy: defaults, the TOML loader, its errors and the value parsers."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from homes import one_home  # noqa: F401  (fixture)

from corral import defaults, policy, policyfile
from corral.errors import EXIT_USAGE, PolicyError
from corral.policy import Policy

FULL_POLICY = """\
# a complete corral.toml
tier = "namespace"

[filesystem]
writable = ["build", "~/cache"]
read_deny = ["secrets/", "~/private.txt"]
write_deny = ["Makefile"]
defaults = false

[env]
pass = ["CI", "GOPATH"]

[env.set]
GREETING = "hello"

[limits]
timeout = "5m"
memory = "512M"
pids = 64
cpus = 1.5
output = "1M"

[network]
mode = "proxy"
allow = ["pypi.org"]
deny = ["example.com"]
"""


def write(tmp_path: Path, text: str, name: str = "corral.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load_error(path: Path, workspace: Path) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        policyfile.load_file(str(path), Policy(str(workspace)))
    return info.value


# -- defaults -----------------------------------------------------------------


def test_defaults_workspace_is_realpath_of_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.chdir(link)
    pol = policy.load()
    assert pol.workspace == os.path.realpath(real)
    assert pol.tier == "auto"
    assert pol.network.mode == "none"
    assert pol.network.allow == [] and pol.network.deny == []
    assert pol.limits.output == defaults.OUTPUT_LIMIT
    assert pol.limits.timeout is None and pol.limits.memory is None
    assert pol.limits.pids is None and pol.limits.cpus is None
    assert pol.source is None
    assert pol.filesystem.use_defaults is True
    assert pol.env.pass_names == [] and pol.env.set_values == {}


def test_explicit_workspace_is_resolved(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    pol = policy.load(str(tmp_path / "ws" / ".." / "ws"))
    assert pol.workspace == os.path.realpath(tmp_path / "ws")


def test_workspace_root_is_refused() -> None:
    with pytest.raises(PolicyError) as info:
        policy.load("/")
    assert info.value.code == EXIT_USAGE
    assert "/" in info.value.message


@pytest.mark.parametrize(
    ("ws", "homes", "says"),
    [
        ("/home/alice", ["/home/alice"], "cannot be your home directory (/home/alice)"),
        ("/home", ["/home/alice"], "a directory holding your home /home/alice (/home)"),
        ("/root", ["/home/alice", "/root"], "your home directory (/root)"),
    ],
)
def test_a_home_directory_or_one_holding_it_is_no_workspace(
    ws: str, homes: list[str], says: str
) -> None:
    with pytest.raises(PolicyError) as info:
        policy.check_workspace(ws, homes)
    assert says in info.value.message and "project directory" in info.value.message


@pytest.mark.parametrize(
    ("ws", "homes"),
    [
        ("/home/alice/project", ["/home/alice"]),  # the twin: a project inside home
        ("/home/alicebob", ["/home/alice"]),  # a name that only starts the same
        ("/srv/work", ["/"]),  # a user whose home is /: only / itself is refused
    ],
)
def test_a_project_directory_is_a_workspace(ws: str, homes: list[str]) -> None:
    policy.check_workspace(ws, homes)


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/home/alice", "filesystem.writable /home/alice cannot be your home directory"),
        ("/home", "a directory holding your home /home/alice"),
        ("/home/alice/.config", "/home/alice/.config is read by programs that run later"),
        ("/home/alice/.config/systemd/user", "/home/alice/.config is read by"),
        ("/home/alice/.local", "/home/alice/.local/bin is read by"),
        ("/home/alice/.bashrc", "/home/alice/.bashrc is read by"),
    ],
)
def test_a_writable_path_that_runs_later_is_refused(path: str, says: str) -> None:
    """`--writable ~` (or srt's allowWrite ["~"]) let a run plant ~/.aws/config's
    credential_process, ~/.local/bin/git and a systemd unit, though the same
    directory is refused as a workspace (found by attacking corral)."""
    with pytest.raises(PolicyError, match=re.escape(says)):
        policy.check_writable(path, ["/home/alice"])


@pytest.mark.parametrize(
    "path",
    ["/home/alice/.cache/pip", "/home/alice/datasets", "/srv/data", "/home/alice/.local/share/x"],
)
def test_a_writable_path_elsewhere_is_accepted(path: str) -> None:
    policy.check_writable(path, ["/home/alice"])  # the twin


def test_a_policy_made_in_code_on_the_home_directory_is_refused_at_planning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral import fsplan

    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(PolicyError, match="your home directory"):
        fsplan.plan_filesystem(policy.Policy(str(tmp_path)))
    (tmp_path / "proj").mkdir()
    assert fsplan.plan_filesystem(policy.Policy(str(tmp_path / "proj")), mounts=False)


def test_workspace_corral_toml_is_found(tmp_path: Path) -> None:
    write(tmp_path, 'tier = "none"\n')
    pol = policy.load(str(tmp_path))
    assert pol.tier == "none"
    assert pol.source == str(tmp_path / "corral.toml")


@pytest.mark.usefixtures("one_home")
def test_full_policy_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path.parent / f"{tmp_path.name}-home"  # beside the workspace: not in it
    monkeypatch.setenv("HOME", str(home))
    path = write(tmp_path, FULL_POLICY)
    pol = policy.load(str(tmp_path), str(path))
    assert pol.tier == "namespace"
    assert pol.source == str(path)
    assert pol.filesystem.writable == ["build", "~/cache"]
    assert pol.filesystem.read_deny == ["secrets/", "~/private.txt"]
    assert pol.filesystem.write_deny == ["Makefile"]
    assert pol.filesystem.use_defaults is False
    assert pol.env.pass_names == ["CI", "GOPATH"]
    assert pol.env.set_values == {"GREETING": "hello"}
    assert pol.limits.timeout == 300.0
    assert pol.limits.memory == 512 << 20
    assert pol.limits.pids == 64
    assert pol.limits.cpus == 1.5
    assert pol.limits.output == 1 << 20
    assert pol.network.mode == "proxy"
    assert pol.network.allow == ["pypi.org"]
    assert pol.network.deny == ["example.com"]
    assert pol.writable_paths() == [
        str(tmp_path),
        str(tmp_path / "build"),
        str(home / "cache"),
    ]
    assert pol.read_deny_paths() == [
        str(tmp_path / "secrets") + "/",
        str(home / "private.txt"),
    ]
    canonical = pol.to_dict()
    env = canonical["env"]
    assert isinstance(env, dict)
    assert env["set"] == ["GREETING"]  # names only: values never reach the digest or --explain
    assert "hello" not in repr(canonical)


# -- error paths: file, line and dotted key -------------------------------------

ERROR_CASES = [
    # (toml text, line, dotted key, a fragment of the reason)
    ('tier = "none"\ncolour = "red"\n', 2, "colour", "unknown key"),
    ('[limits]\nmemory = "1G"\nspeed = 3\n', 3, "limits.speed", "unknown key"),
    ("\n[filesytem]\nwritable = []\n", 2, "filesytem", "unknown section"),
    ('[filesystem]\nwritable = "build"\n', 2, "filesystem.writable", "list of strings"),
    ("[filesystem]\nread_deny = [1, 2]\n", 2, "filesystem.read_deny", "list of strings"),
    ('[network]\nallow = "x"\n', 2, "network.allow", "list of strings"),
    ("[filesystem]\n\ndefaults = 1\n", 3, "filesystem.defaults", "true or false"),
    ("tier = 5\n", 1, "tier", "string"),
    ('[limits]\nmemory = "12Q"\n', 2, "limits.memory", "bad size"),
    ('[limits]\nmemory = "-1M"\n', 2, "limits.memory", "bad size"),
    ('[limits]\n# comment\noutput = "abc"\n', 3, "limits.output", "bad size"),
    ('[limits]\ntimeout = "10x"\n', 2, "limits.timeout", "bad duration"),
    ("[limits]\ntimeout = 0\n", 2, "limits.timeout", "more than zero"),
    ('[limits]\npids = "many"\n', 2, "limits.pids", "bad pids"),
    ("[limits]\ncpus = 0\n", 2, "limits.cpus", "between"),
    ('[network]\nmode = "open"\n', 2, "network.mode", "mode must be one of"),
    ('[env]\npass = ["A=B"]\n', 2, "env.pass", "bad environment variable name"),
    ("[env]\nset = 3\n", 2, "env.set", "table"),
    ('[limits] # the limits\nmemory = "1Z"\n', 2, "limits.memory", "bad size"),
    ('[network]\nhosts = { "a\\u0000b.test" = "127.0.0.1" }\n', 2, "network.hosts", "control"),
    ('[network]\nhosts = { "a..test" = "127.0.0.1" }\n', 2, "network.hosts", "empty label"),
    ('[network]\nhosts = { "a.test" = "nowhere" }\n', 2, "network.hosts", "not an IP"),
]


@pytest.mark.parametrize(("text", "line", "dotted", "reason"), ERROR_CASES)
def test_error_names_file_line_and_key(
    tmp_path: Path, text: str, line: int, dotted: str, reason: str
) -> None:
    path = write(tmp_path, text)
    err = load_error(path, tmp_path)
    assert err.code == EXIT_USAGE
    assert f"{path}:{line}: {dotted}:" in err.message
    assert reason in err.message
    assert "\n" not in err.message


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("[limits\nmemory = 1\n", 1),
        ('tier = "none"\ntier = "auto"\n', 2),
        ('\n\ntier = "unterminated\n', 3),
        ("[limits]\nmemory = ", 2),  # tomllib: "at end of document"
    ],
)
def test_invalid_toml_names_file_and_line(tmp_path: Path, text: str, line: int) -> None:
    path = write(tmp_path, text)
    err = load_error(path, tmp_path)
    assert err.code == EXIT_USAGE
    assert err.message.startswith(f"{path}:{line}: invalid TOML: "), err.message
    assert "\n" not in err.message


@pytest.mark.parametrize(
    ("text", "line", "dotted", "fragment"),
    [
        ("[limits]\nmemory = 512\n", 2, "limits.memory", "512 has no unit: write 512M"),
        ('[limits]\n\ntmp = "2048"\n', 3, "limits.tmp", "2048 has no unit"),
        ("[limits]\noutput = 10\n", 2, "limits.output", "or 10B for bytes"),
        ('[limits]\nmemory = "512K"\n', 2, "limits.memory", "too small: at least 16M"),
        ('[limits]\nshm = "10K"\n', 2, "limits.shm", "too small: at least 1M"),
        ('tier = "namespce"\n', 1, "tier", "unknown tier 'namespce' (known: auto, "),
        ('# a comment\ntier = ""\n', 2, "tier", "unknown tier ''"),
    ],
)
def test_sizes_need_a_unit_and_tiers_a_known_name(
    tmp_path: Path, text: str, line: int, dotted: str, fragment: str
) -> None:
    err = load_error(write(tmp_path, text), tmp_path)
    assert err.code == EXIT_USAGE
    assert f":{line}: {dotted}: " in err.message and fragment in err.message, err.message


@pytest.mark.parametrize(
    "text",
    [
        '[limits]\nmemory = "512M"\ntmp = "2G"\noutput = "10B"\nshm = "64M"\n',
        'tier = "namespace"\n',
        'tier = "auto"\n',
    ],
)
def test_sizes_with_units_and_known_tiers_load(tmp_path: Path, text: str) -> None:
    pol = policy.load(str(tmp_path), str(write(tmp_path, text)))  # the allow twin
    assert pol.source is not None


def test_not_utf8_and_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(b'tier = "\xff"\n')
    assert load_error(path, tmp_path).message == f"{path}: policy file is not UTF-8"
    missing = tmp_path / "missing.toml"
    assert str(missing) in load_error(missing, tmp_path).message


def test_explicit_policy_error_from_load(tmp_path: Path) -> None:
    path = write(tmp_path, "[limits]\nmemory = 'lots'\n", "p.toml")
    with pytest.raises(PolicyError) as info:
        policy.load(str(tmp_path), str(path))
    assert f"{path}:2: limits.memory" in info.value.message


@pytest.mark.parametrize(
    ("text", "line", "dotted"),
    [
        ("[env]\npass = []\n\n[env.set]\nA = 1\n", 4, "env.set"),  # the table's header
        ('tier = "none"\nlimits.memory = "12Q"\n', 2, "limits.memory"),
        ("[filesystem.extra]\nx = 1\n", 1, "filesystem.extra"),
    ],
)
def test_error_line_for_subtables_and_dotted_keys(
    tmp_path: Path, text: str, line: int, dotted: str
) -> None:
    path = write(tmp_path, text)
    assert f"{path}:{line}: {dotted}" in load_error(path, tmp_path).message


# -- value parsers ---------------------------------------------------------------

M = 1 << 20


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("512M", 512 * M),
        ("512m", 512 * M),
        ("512MB", 512 * M),
        ("512MiB", 512 * M),
        ("1.5G", 3 << 29),
        ("100k", 100 << 10),
        ("2T", 2 << 40),
        ("4096b", 4096),
        ("4096B", 4096),
        (" 64M ", 64 * M),
        ("0", 0),
        (0, 0),
    ],
)
def test_parse_size_good(value: object, expected: int) -> None:
    assert policy.parse_size(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "12Q",
        "-1M",
        "abc",
        "",
        "M",
        "1kk",
        "nan",
        "1..5M",
        True,
        1.5,
        None,
        ["1M"],
        "4096",
        4096,
        "1.5",
    ],
)
def test_parse_size_bad(value: object) -> None:
    with pytest.raises(ValueError):
        policy.parse_size(value)


@pytest.mark.parametrize("value", ["inf", "1e400", 10**400])
def test_parse_size_overflow_is_value_error(value: object) -> None:
    with pytest.raises(ValueError):
        policy.parse_size(value)


@pytest.mark.parametrize("parser", [policy.parse_duration, policy.parse_cpus])
def test_huge_integer_is_value_error(parser: object) -> None:
    assert callable(parser)
    with pytest.raises(ValueError):
        parser(10**400)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("30", 30.0),
        ("30s", 30.0),
        ("500ms", 0.5),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1.5m", 90.0),
        (" 2S ", 2.0),
        (30, 30.0),
        (0.25, 0.25),
    ],
)
def test_parse_duration_good(value: object, expected: float) -> None:
    assert policy.parse_duration(value) == pytest.approx(expected)


@pytest.mark.parametrize(
    "value",
    ["", "s", "10x", "10d", "-5s", "0", "0ms", "abc", "inf", "nan", "5hs", True, None, [1]],
)
def test_parse_duration_bad(value: object) -> None:
    with pytest.raises(ValueError):
        policy.parse_duration(value)


@pytest.mark.parametrize(
    ("value", "expected"), [("1.5", 1.5), (2, 2.0), (0.5, 0.5), ("0.01", 0.01), (4096, 4096.0)]
)
def test_parse_cpus_good(value: object, expected: float) -> None:
    assert policy.parse_cpus(value) == expected


@pytest.mark.parametrize("value", ["0", 0, -1, "lots", 5000, "nan", "inf", True, None])
def test_parse_cpus_bad(value: object) -> None:
    with pytest.raises(ValueError):
        policy.parse_cpus(value)


@pytest.mark.parametrize(("value", "expected"), [("1", 1), (64, 64), (" 8 ", 8)])
def test_parse_pids_good(value: object, expected: int) -> None:
    assert policy.parse_pids(value) == expected


@pytest.mark.parametrize("value", ["0", 0, -3, "1.5", 1.5, "many", "", True, None])
def test_parse_pids_bad(value: object) -> None:
    with pytest.raises(ValueError):
        policy.parse_pids(value)


@pytest.mark.parametrize("name", ["", "A=B", "A\0B", 5, None])
def test_check_env_name_bad(name: object) -> None:
    with pytest.raises(ValueError):
        policy.check_env_name(name)


# -- derived views -----------------------------------------------------------------


def test_expand(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    pol = Policy(str(tmp_path / "ws"))
    assert pol.home() == str(home)
    assert pol.expand("~") == str(home)
    assert pol.expand("~/.ssh") == str(home / ".ssh")
    assert pol.expand("~/a/../b") == str(home / "b")
    assert pol.expand("build") == str(tmp_path / "ws" / "build")
    assert pol.expand("./build/") == str(tmp_path / "ws" / "build")
    assert pol.expand("../sibling") == str(tmp_path / "sibling")
    assert pol.expand("/etc//passwd") == "/etc/passwd"


@pytest.mark.usefixtures("one_home")
def test_read_deny_paths_keep_trailing_slash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    pol = Policy(str(tmp_path / "ws"))
    pol.filesystem.read_deny = ["secrets/", "key.pem", "/"]
    paths = pol.read_deny_paths()
    assert str(home / ".ssh") + "/" in paths
    assert str(home / ".netrc") in paths
    assert "/etc/shadow" in pol.read_deny_if_present()
    assert str(tmp_path / "ws" / "secrets") + "/" in paths
    assert str(tmp_path / "ws" / "key.pem") in paths
    assert "/" in paths  # never "//"
    assert len(paths) == len(defaults.READ_DENY_HOME) + 3
    pol.filesystem.use_defaults = False
    assert pol.read_deny_paths() == [
        str(tmp_path / "ws" / "secrets") + "/",
        str(tmp_path / "ws" / "key.pem"),
        "/",
    ]
    pol.tls.ca_key = str(tmp_path / "ca" / "key.pem")  # the user's own CA: defaults or not
    assert pol.read_deny_paths()[-1] == str(tmp_path / "ca" / "key.pem")


def test_write_deny_patterns_default(tmp_path: Path) -> None:
    pol = Policy(str(tmp_path))
    patterns = pol.write_deny_patterns()
    assert defaults.POLICY_FILENAME in patterns
    assert ".vscode/" in patterns
    assert ".envrc" in patterns
    pol.filesystem.write_deny = ["Makefile"]
    assert pol.write_deny_patterns()[-1] == "Makefile"


def test_write_deny_patterns_protect_policy_file_in_workspace(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    path = write(tmp_path / "conf", 'tier = "none"\n', "agent.toml")
    pol = policy.load(str(tmp_path), str(path))
    assert os.path.join("conf", "agent.toml") in pol.write_deny_patterns()


def test_write_deny_patterns_policy_file_outside_workspace(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    path = write(tmp_path, 'tier = "none"\n', "outside.toml")
    pol = policy.load(str(tmp_path / "ws"), str(path))
    patterns = pol.write_deny_patterns()
    assert defaults.POLICY_FILENAME in patterns
    assert not any("outside.toml" in p for p in patterns)


def test_write_deny_keeps_corral_toml_with_policy_in_workspace(tmp_path: Path) -> None:
    path = write(tmp_path, 'tier = "none"\n', "agent.toml")
    pol = policy.load(str(tmp_path), str(path))
    patterns = pol.write_deny_patterns()
    assert "agent.toml" in patterns
    assert defaults.POLICY_FILENAME in patterns


def test_write_deny_policy_file_via_symlinked_workspace(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    path = write(real, 'tier = "none"\n', "agent.toml")
    pol = policy.load(str(link), str(link / path.name))
    assert "agent.toml" in pol.write_deny_patterns()


def test_pinned_hosts_are_keyed_by_the_one_spelling(tmp_path: Path) -> None:
    """However a pinned name is written, the proxy finds it under its normalized form."""
    full_width = "".join(chr(ord(c) + 0xFEE0) for c in "PINNED")
    path = write(
        tmp_path,
        "[network]\n"
        f'hosts = {{ "{full_width}\u3002test." = "127.0.0.1", "Other.Test" = "0:0::1" }}\n',
    )
    pol = policy.load(str(tmp_path), str(path))
    assert pol.network.hosts == {"pinned.test": "127.0.0.1", "other.test": "::1"}


def test_hardlinks_key(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    pol = policy.load(str(ws), str(write(tmp_path, '[filesystem]\nhardlinks = "refuse"\n')))
    assert pol.filesystem.hardlinks == "refuse"
    assert pol.to_dict()["filesystem"]["hardlinks"] == "refuse"  # type: ignore[index]
    default = policy.load(str(ws))
    assert default.filesystem.hardlinks == "read-only"
    assert "hardlinks" not in default.to_dict()["filesystem"]  # type: ignore[operator]
    err = load_error(write(tmp_path, '[filesystem]\nhardlinks = "readonly"\n'), ws)
    assert "filesystem.hardlinks" in err.message and "hardlinks must be" in err.message
    err = load_error(write(tmp_path, "[filesystem]\nhardlinks = true\n"), ws)
    assert "filesystem.hardlinks" in err.message and "expected a string" in err.message


# -- a policy built or changed in code gets the file's checks -------------------------


def test_allow_without_a_network_mode_is_an_error_in_code_too(tmp_path: Path) -> None:
    pol = Policy(str(tmp_path))
    pol.network.allow = ["pypi.org"]
    with pytest.raises(PolicyError) as info:
        policy.check_network(pol, python=True)
    assert 'set policy.network.mode = "proxy"' in info.value.message
    pol.network.mode = "proxy"
    policy.check_network(pol, python=True)  # the allow twin
    pol.network.allow = ["http://pypi.org/simple"]
    with pytest.raises(PolicyError, match=r"^policy\.network\.allow: "):
        policy.check_network(pol, python=True)
    pol.network.allow, pol.network.mode = [], "open"
    with pytest.raises(PolicyError, match=r"network\.mode must be one of"):
        policy.check_network(pol, python=True)
    pol.network.mode, pol.network.transparent = "none", True
    with pytest.raises(PolicyError, match=r"network\.transparent has no effect"):
        policy.check_network(pol, python=True)


def test_home_paths_are_masked_in_every_home_of_the_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run with another HOME (a Ray node, a service), corral masked $HOME's secrets
    and left the account's own readable."""
    import pwd

    own = os.path.realpath(pwd.getpwuid(os.geteuid()).pw_dir)
    monkeypatch.setenv("HOME", str(tmp_path))
    paths = Policy(str(tmp_path / "ws")).read_deny_paths()
    assert f"{tmp_path}/.ssh/" in paths and f"{own}/.ssh/" in paths
    monkeypatch.setenv("HOME", own)  # the twin: one home, each path once
    assert Policy(str(tmp_path / "ws")).read_deny_paths().count(f"{own}/.ssh/") == 1


def test_explain_lists_the_network_rules(tmp_path: Path) -> None:
    from corral.tiers.base import network_lines

    pol = Policy(str(tmp_path))
    assert network_lines(pol) == [
        "network: none (the sandbox's own loopback only; allow a host with --allow)"
    ]
    pol.network.mode = "proxy"
    pol.network.allow = ["pypi.org", "*.pythonhosted.org"]
    pol.network.deny = ["*.internal.test"]
    pol.network.hosts = {"mirror.test": "10.0.0.5"}
    lines = network_lines(pol)
    assert lines[0].startswith("network: proxy (")
    assert "  allow: pypi.org, *.pythonhosted.org" in lines
    assert "  deny: *.internal.test" in lines
    assert "  pinned: mirror.test = 10.0.0.5 (no DNS)" in lines
    assert any("rebinding" in line or "private" in line for line in lines)
    assert not any("intercepted" in line for line in lines)  # nothing governed: no TLS


def test_explain_shows_what_the_proxy_governs_and_never_a_secrets_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.tiers.base import network_lines

    monkeypatch.setenv("MY_KEY", "sk-real-value")
    (tmp_path / "corral.toml").write_text(
        '[network]\nmode = "proxy"\nallow = ["api.test", "git.test"]\n'
        '[[network.rules]]\nhost = "api.test"\nmethods = ["GET"]\npaths = ["/v1/**"]\n'
        'action = "allow"\n'
        '[[network.rules]]\nhost = "api.test"\nmethods = ["DELETE"]\naction = "ask"\n'
        '[[network.rules]]\nhost = "git.test"\ngit = "read"\n'
        '[secrets.API_KEY]\nfrom = "env:MY_KEY"\nhosts = ["api.test"]\n'
        'header = "Authorization"\nformat = "Bearer {value}"\n'
        '[tls]\npassthrough = ["db.test"]\n'
    )
    lines = network_lines(policy.load(str(tmp_path)))
    assert "  rule network.rules[1]: allow: host api.test; methods GET; paths /v1/**" in lines
    assert "  rule network.rules[2]: ask: host api.test; methods DELETE" in lines
    assert "  rule network.rules[3]: allow: host git.test; git read" in lines
    assert "  asks wait at most 30s for corral approve / deny" in lines
    assert (
        "  secret API_KEY: $API_KEY holds a placeholder; the proxy puts the value from "
        "env:MY_KEY into authorization: Bearer {value} on requests to api.test only"
    ) in lines
    assert "  tls passthrough (never intercepted): db.test" in lines
    assert any("intercepted with corral's CA" in line for line in lines)
    assert "sk-real-value" not in "\n".join(lines)


def test_a_sandbox_takes_a_workspace_directory_or_a_policy_file(tmp_path: Path) -> None:
    from corral.sandbox import _load_named

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "corral.toml").write_text("[limits]\npids = 77\n")
    other = tmp_path / "other.toml"
    other.write_text("[limits]\npids = 88\n")
    by_dir = _load_named(str(ws), None)
    assert (by_dir.workspace, by_dir.limits.pids) == (str(ws), 77)  # its corral.toml too
    by_file = _load_named(str(other), str(ws))
    assert (by_file.workspace, by_file.limits.pids) == (str(ws), 88)
    with pytest.raises(PolicyError, match="no such workspace directory or policy file"):
        _load_named(str(tmp_path / "missing"), None)
    with pytest.raises(PolicyError, match="workspace= names another"):
        _load_named(str(ws), str(tmp_path))
