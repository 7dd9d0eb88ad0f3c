"""srt's settings JSON -> corral policy (corral.srt_settings), without launching anything.

Each accepted srt key is shown to land where it means the same thing; each key
corral cannot give as srt does is shown to be refused by name, one line, exit 2.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from corral import cli, policy, srt_settings
from corral.errors import EXIT_USAGE, PolicyError
from corral.net.rules import HostRules
from corral.srt_settings import Translation

BASE: dict[str, object] = {
    "network": {"allowedDomains": [], "deniedDomains": []},
    "filesystem": {"denyRead": [], "allowWrite": ["."], "denyWrite": []},
}


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace as cwd, and a home that is not the real one."""
    work = tmp_path / "ws"
    work.mkdir()
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(work)
    return work


def settings(**sections: dict[str, object]) -> dict[str, object]:
    """BASE with some sections' keys replaced or added (``top`` for top-level keys)."""
    out: dict[str, object] = {k: dict(v) for k, v in BASE.items()}  # type: ignore[call-overload]
    for name, keys in sections.items():
        if name == "top":
            out.update(keys)
        else:
            target = out.setdefault(name, {})
            assert isinstance(target, dict)
            target.update(keys)
    return out


def translate(data: object, ws: Path) -> Translation:
    return srt_settings.translate(data, "s.json", str(ws), os.environ["HOME"])


def refused(data: object, ws: Path) -> str:
    with pytest.raises(PolicyError) as info:
        translate(data, ws)
    assert info.value.code == EXIT_USAGE
    message = info.value.message
    assert "\n" not in message and message.startswith("s.json")
    return message


# -- filesystem ------------------------------------------------------------------------


def test_filesystem_lists_map_onto_corral_fields(ws: Path) -> None:
    tr = translate(
        settings(
            filesystem={
                "denyRead": ["~/.ssh", "secrets/**", "/etc/app/key", "~"],
                "allowWrite": [".", "/tmp", "~/.cache/**"],
                "denyWrite": [".env", "config/production.json"],
            }
        ),
        ws,
    )
    assert tr.read_deny == ["~/.ssh", "secrets/", "/etc/app/key", "~"]
    assert tr.writable == ["/tmp", "~/.cache"]  # "." is the workspace: writable anyway
    assert tr.write_deny[:2] == [".env", "config/production.json"]


def test_srt_default_protections_corral_lacks_are_added_once(ws: Path) -> None:
    """srt's built-in write protection, where corral's defaults lack it (git's and
    ripgrep's files a clone brings), is added to a translated policy, once."""
    assert srt_settings.protected_by_default(".claude/commands/")  # in corral's .claude/
    assert srt_settings.protected_by_default(".mcp.json")
    assert not srt_settings.protected_by_default("src/main.py")  # the twin
    extra = [p for p in srt_settings.SRT_PROTECTED if not srt_settings.protected_by_default(p)]
    assert extra == [".gitconfig", ".gitmodules", ".ripgreprc"]
    tr = translate(settings(filesystem={"denyWrite": [".gitmodules"]}), ws)
    assert tr.write_deny == [".gitmodules", ".gitconfig", ".ripgreprc"]
    assert any("srt protects by default" in note for note in tr.notes)


def test_tilde_and_relative_paths_keep_srt_meaning(ws: Path) -> None:
    # srt expands only "~" and "~/": "~backup" is a name relative to the cwd
    tr = translate(settings(filesystem={"denyRead": ["~backup", "./a/../b", "x/"]}), ws)
    assert tr.read_deny == ["./~backup", "./a/../b", "x/"]
    pol = policy.Policy(str(ws))
    srt_settings.apply(tr, pol)
    paths = pol.read_deny_paths()
    assert str(ws / "~backup") in paths and str(ws / "b") in paths and str(ws / "x") + "/" in paths


@pytest.mark.parametrize("key", ["denyRead", "allowWrite", "denyWrite"])
@pytest.mark.parametrize("entry", ["src/*.ts", "**/.env", "file?.txt", "a/[ab]", "x/**/**"])
def test_globs_are_refused_by_name(ws: Path, key: str, entry: str) -> None:
    allow = [".", entry] if key == "allowWrite" else ["."]
    data = settings(filesystem={key: [entry] if key != "allowWrite" else allow})
    message = refused(data, ws)
    index = 1 if key == "allowWrite" else 0
    assert f"filesystem.{key}[{index}]: {entry!r}: corral has no glob patterns" in message


def test_empty_path_is_refused(ws: Path) -> None:
    assert "filesystem.denyRead[0]: '': not a path" in refused(
        settings(filesystem={"denyRead": [""]}), ws
    )


def test_workspace_must_be_writable_in_srt_too(ws: Path) -> None:
    message = refused(settings(filesystem={"allowWrite": ["/var/empty-x"]}), ws)
    assert f"filesystem.allowWrite: does not include the workspace {ws}" in message
    assert 'add "."' in message
    # twins: the workspace itself, by any spelling, or a directory above it
    for spelling in (".", str(ws), "./", "..", "~/../ws"):
        translate(settings(filesystem={"allowWrite": [spelling]}), ws)


def test_settings_without_filesystem_still_check_the_workspace(ws: Path) -> None:
    message = refused({"network": {"allowedDomains": [], "deniedDomains": []}}, ws)
    assert "filesystem.allowWrite: does not include the workspace" in message


def test_deny_write_above_a_writable_path_is_refused(ws: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "build").mkdir(parents=True)
    data = settings(filesystem={"allowWrite": [".", str(out / "build")], "denyWrite": [str(out)]})
    message = refused(data, ws)
    assert f"filesystem.denyWrite[0]: {str(out)!r} lies above the writable {out / 'build'}" in (
        message
    )
    # twins: inside or equal to a writable path, corral's ro-bind covers what is below
    (ws / "src").mkdir()
    translate(settings(filesystem={"allowWrite": [".", "src"], "denyWrite": ["."]}), ws)
    translate(settings(filesystem={"allowWrite": [".", "src"], "denyWrite": ["src"]}), ws)
    translate(settings(filesystem={"denyWrite": ["/etc"]}), ws)  # outside: read-only anyway


# -- network ---------------------------------------------------------------------------


def test_allowed_domains_mean_proxy_and_empty_means_no_network(ws: Path) -> None:
    tr = translate(settings(network={"allowedDomains": ["github.com"]}), ws)
    assert (tr.mode, tr.allow, tr.deny) == ("proxy", ["github.com"], [])
    tr = translate(settings(network={"deniedDomains": ["evil.example.com"]}), ws)
    assert (tr.mode, tr.allow, tr.deny) == ("none", [], ["evil.example.com"])


# (srt entry, host, port, allowed?) -- what srt's matcher decides, checked on corral's rules
MATCHES = [
    ("*.example.com", "a.example.com", 443, True),
    ("*.example.com", "a.b.example.com", 80, True),
    ("*.example.com", "example.com", 443, False),  # srt's *.x is strict: never the apex
    ("*.example.com", "badexample.com", 443, False),
    ("example.com", "EXAMPLE.com", 443, True),
    ("example.com", "a.example.com", 443, False),
    ("api.example.com:443", "api.example.com", 443, True),
    ("api.example.com:443", "api.example.com", 80, False),
    ("*.example.com:8443", "a.example.com", 8443, True),
    ("*.example.com:8443", "a.example.com", 443, False),
    ("127.0.0.1:8080", "127.0.0.1", 8080, True),
    ("127.0.0.1:8080", "127.0.0.1", 8081, False),
    ("[::1]:9000", "::1", 9000, True),
    ("[::1]", "::1", 1, True),
    ("[::1]", "::2", 1, False),
]


@pytest.mark.parametrize(("entry", "host", "port", "allowed"), MATCHES)
def test_domain_patterns_match_what_srt_matches(
    ws: Path, entry: str, host: str, port: int, allowed: bool
) -> None:
    tr = translate(settings(network={"allowedDomains": [entry]}), ws)
    assert HostRules.parse(tr.allow, tr.deny).check(host, port).allowed is allowed


def test_denied_domains_win_and_take_star(ws: Path) -> None:
    data = settings(
        network={"allowedDomains": ["*.example.com"], "deniedDomains": ["bad.example.com", "*:22"]}
    )
    tr = translate(data, ws)
    rules = HostRules.parse(tr.allow, tr.deny)
    assert not rules.check("bad.example.com", 443).allowed
    assert not rules.check("ok.example.com", 22).allowed
    assert rules.check("ok.example.com", 443).allowed  # the twin


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("localhost", "resolve to loopback: allow the address"),
        ("*", "not other wildcards"),
        ("*.com", "two labels at least"),
        ("a.*.example.com", "not other wildcards"),
        ("intranet", "a domain with a dot"),
        ("example.com.", "a domain with a dot"),
        ("https://example.com", "not a URL or path"),
        ("example.com/path", "not a URL or path"),
        ("10.0.0.0/8", "not a URL or path"),
        ("::1", "bad port or IPv6 address"),
        ("example.com:0443", "bad port"),
        ("example.com:70000", "bad port"),
        ("example.com:1-9", "bad port"),
        (" example.com", "would match no host"),
        ("exa_mple!.com", "bad host name"),
    ],
)
def test_allowed_domains_srt_or_corral_cannot_read_are_refused(
    ws: Path, entry: str, why: str
) -> None:
    message = refused(settings(network={"allowedDomains": ["ok.example.com", entry]}), ws)
    assert message.startswith("s.json: network.allowedDomains[1]: ")
    assert why in message


def test_wrong_types_name_the_key(ws: Path) -> None:
    assert "network.allowedDomains: expected a list of strings" in refused(
        settings(network={"allowedDomains": "github.com"}), ws
    )
    assert "filesystem.denyRead: expected a list of strings" in refused(
        settings(filesystem={"denyRead": [1]}), ws
    )
    assert "network: expected an object" in refused({"network": []}, ws)
    assert "(top level): expected an object" in refused([], ws)
    assert "network.strictAllowlist: expected true or false" in refused(
        settings(network={"strictAllowlist": "yes"}), ws
    )
    assert "credentials.files[0]: expected an object" in refused(
        settings(top={"credentials": {"files": ["~/.tok"]}}), ws
    )


def test_unknown_keys_are_refused_with_a_hint(ws: Path) -> None:
    assert "network.allowedDomain: unknown key (did you mean allowedDomains?)" in refused(
        settings(network={"allowedDomain": ["x.org"]}), ws
    )
    message = refused(settings(top={"sandbox": {}}), ws)
    assert "s.json: sandbox: unknown key (srt 0.0.78 has network, filesystem" in message
    assert "filesystem.writable: unknown key" in refused(
        settings(filesystem={"writable": ["."]}), ws
    )


# -- keys corral cannot give as srt does -------------------------------------------------

# (key path, a value corral refuses, the value that asks for nothing and is accepted)
NOT_HONOURED: list[tuple[str, object, object]] = [
    ("network.deniedDomainReasons", {"x.org": "no"}, {}),
    ("network.deniedResolvedAddresses", ["10.0.0.0/8"], []),
    ("network.allowUnixSockets", ["/var/run/docker.sock"], []),
    ("network.allowAllUnixSockets", True, False),
    ("network.allowLocalBinding", True, False),
    ("network.allowMachLookup", ["com.apple.x"], []),
    ("network.httpProxyPort", 3128, None),
    ("network.socksProxyPort", 1080, None),
    ("network.mitmProxy", {"socketPath": "/s", "domains": ["x.org"]}, None),
    ("network.filterRequest", "f", None),
    ("network.tlsTerminate", {}, None),
    ("network.parentProxy", {"http": "http://p:3128"}, None),
    ("filesystem.disabled", True, False),
    ("filesystem.allowRead", ["."], []),
    ("filesystem.allowGitConfig", True, False),
    ("credentials.envVars", [{"name": "TOKEN", "mode": "deny"}], []),
    ("credentials.allowPlaintextInject", True, False),
    ("credentials.awsPairs", [{"accessKeyIdVar": "A", "secretAccessKeyVar": "B"}], []),
    ("credentials.sigv4", {"streaming": "deny"}, {}),
    ("ignoreViolations", {"*": ["/x"]}, {}),
    ("enableWeakerNestedSandbox", True, False),
    ("enableWeakerNetworkIsolation", True, False),
    ("allowAppleEvents", True, False),
    ("mandatoryDenySearchDepth", 3, None),
    ("git", {"safeDirectories": ["/repo"]}, {"safeDirectories": []}),
    ("ripgrep", {"command": "rg"}, None),
    ("seccomp", {"applyPath": "/x"}, None),
    ("bwrapPath", "/usr/bin/bwrap", None),
    ("socatPath", "/usr/bin/socat", None),
    ("javaAgentJarPath", "/x.jar", None),
    ("windows", {}, None),
]


def with_key(path: str, value: object) -> dict[str, object]:
    section, _, name = path.rpartition(".")
    return settings(**{section or "top": {name: value}})


@pytest.mark.parametrize(("path", "bad", "inert"), NOT_HONOURED)
def test_keys_corral_cannot_honour_are_refused_by_name(
    ws: Path, path: str, bad: object, inert: object
) -> None:
    message = refused(with_key(path, bad), ws)
    assert message.startswith(f"s.json: {path}: not supported: "), message
    if inert is not None:  # the twin: asking for nothing more is accepted
        tr = translate(with_key(path, inert), ws)
        assert tr.writable == [] and tr.read_deny == []


@pytest.mark.parametrize("value", [True, False])
def test_keys_corral_gives_identically_are_accepted(ws: Path, value: bool) -> None:
    translate(with_key("network.strictAllowlist", value), ws)
    translate(with_key("allowPty", value), ws)


def test_credential_files_with_deny_are_read_deny(ws: Path) -> None:
    files = [{"path": "~/.config/tok", "mode": "deny"}, {"path": "keys/**", "mode": "deny"}]
    tr = translate(settings(top={"credentials": {"files": files}}), ws)
    assert tr.read_deny == ["~/.config/tok", "keys/"]
    mask = [{"path": "~/.tok", "mode": "mask"}]
    assert "credentials.files[0].mode: 'mask': only \"deny\"" in refused(
        settings(top={"credentials": {"files": mask}}), ws
    )
    extract = [{"path": "~/.tok", "mode": "deny", "extract": "(x)"}]
    assert "credentials.files[0].extract: not supported" in refused(
        settings(top={"credentials": {"files": extract}}), ws
    )


# -- files, TOML, round trip --------------------------------------------------------------


def write(tmp_path: Path, data: object, name: str = "s.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data, encoding="utf-8")
    return path


def test_bad_json_names_file_line_and_column(ws: Path, tmp_path: Path) -> None:
    path = write(tmp_path, '{\n  "network": {,}\n}')
    with pytest.raises(PolicyError) as info:
        srt_settings.read(str(path))
    assert info.value.message.startswith(f"{path}:2:15: invalid JSON: ")
    (tmp_path / "latin1.json").write_bytes(b'{"x": "\xff"}')
    with pytest.raises(PolicyError, match="not UTF-8"):
        srt_settings.read(str(tmp_path / "latin1.json"))
    with pytest.raises(PolicyError, match="cannot read settings file"):
        srt_settings.read(str(tmp_path / "missing.json"))


ODD = 'dir with "quotes" \\ back\tslash \x7f and ünïcode'


def test_import_toml_loads_back_to_the_same_policy(ws: Path, tmp_path: Path) -> None:
    (ws / "build").mkdir()
    data = settings(
        network={
            "allowedDomains": ["github.com", "*.npmjs.org", "127.0.0.1:8080", "[::1]:9000"],
            "deniedDomains": ["evil.github.com", "*:22"],
        },
        filesystem={
            "denyRead": ["~/.ssh", "secrets/**", ODD],
            "allowWrite": [".", "build"],
            "denyWrite": [".env", ODD],
        },
        top={"credentials": {"files": [{"path": "~/.config/tok", "mode": "deny"}]}},
    )
    path = write(tmp_path, data)
    text = srt_settings.import_toml(str(path))
    assert text.startswith("# corral policy from srt settings")
    toml = tmp_path / "corral.toml"
    toml.write_text(text, encoding="utf-8")
    from_toml = policy.load(str(ws), str(toml))
    from_json = srt_settings.load(str(path))
    assert from_toml.to_dict() == from_json.to_dict()
    assert from_json.source == str(path) and from_json.network.mode == "proxy"
    assert ODD in from_json.filesystem.read_deny


def test_import_toml_of_an_offline_policy_loads_back(ws: Path, tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    toml = tmp_path / "corral.toml"
    toml.write_text(srt_settings.import_toml(str(path)), encoding="utf-8")
    assert policy.load(str(ws), str(toml)).to_dict() == srt_settings.load(str(path)).to_dict()


# -- the command line -------------------------------------------------------------------


def test_cli_policy_import_prints_toml(
    ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, settings(network={"allowedDomains": ["pypi.org"]}))
    assert cli.main(["policy", "import", str(path)]) == 0
    out, err = capsys.readouterr()
    assert 'allow = [\n  "pypi.org",\n]' in out and err == ""


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["policy"], "usage: corral policy import"),
        (["policy", "export", "x"], "usage: corral policy import"),
        (["policy", "import"], "usage: corral policy import"),
        (["policy", "import", "a.json", "b.json"], "usage: corral policy import"),
    ],
)
def test_cli_policy_usage_errors(
    ws: Path, args: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(args) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err


def test_cli_settings_and_policy_together_is_an_error(
    ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, BASE)
    code = cli.main(["run", "--settings", str(path), "--policy", "x.toml", "--", "true"])
    assert code == EXIT_USAGE
    assert capsys.readouterr().err == (
        "corral: --settings and --policy both give the policy: pass one of them\n"
    )


def test_cli_settings_combine_with_flags(ws: Path, tmp_path: Path) -> None:
    path = write(tmp_path, settings(network={"deniedDomains": ["bad.example.com"]}))
    (ws / "corral.toml").write_text("[limits]\ntimeout = 5\n")  # replaced, as by --policy
    pol = cli.build_policy({"settings": str(path), "allow": ["*.example.com"], "timeout": "9s"})
    assert pol.network.mode == "proxy" and pol.network.allow == ["*.example.com"]
    assert pol.network.deny == ["bad.example.com"] and pol.limits.timeout == 9.0
    assert pol.source == str(path)


def test_cli_bad_settings_is_one_line_exit_2(
    ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, settings(network={"mitmProxy": {"socketPath": "/s", "domains": []}}))
    assert cli.main(["run", "--settings", str(path), "--", "true"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err == f"corral: {path}: network.mitmProxy: not supported: " + (
        "corral's proxy connects to destinations itself; it routes nothing through another\n"
    )


def test_cli_empty_settings_name_is_not_ignored(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", "--settings=", "--", "true"]) == EXIT_USAGE
    assert (
        capsys.readouterr().err
        == "corral: : cannot read settings file: No such file or directory\n"
    )
