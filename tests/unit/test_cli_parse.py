"""Tests for the corral command line: the option parser and main()'s errors and exit codes.

Nothing here launches a sandbox: every run either fails before launching or uses --explain.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from corral import cli, commands, tiers
from corral.errors import EXIT_REFUSED, EXIT_USAGE, CorralError
from corral.tiers.base import Health, Tier
from corral.tiers.namespace import NamespaceTier


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A clean workspace as cwd, and a home and state dir that are not the real ones."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("CORRAL_DEBUG", raising=False)
    monkeypatch.chdir(ws)
    return ws


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_error_line(err: str, fragment: str = "") -> None:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("corral: ")
    assert "Traceback" not in err
    assert fragment in lines[0]


# -- parse() --------------------------------------------------------------------------


def test_parse_values_flags_and_repeats() -> None:
    opts, command = cli.parse(
        [
            "--tier",
            "none",
            "--memory=1G",
            "--writable",
            "a",
            "--writable=b=c",
            "-q",
            "--explain",
            "--env",
            "CI",
            "--",
            "cmd",
            "--tier",
        ],
        cli.RUN_OPTIONS,
        positional=True,
    )
    assert opts == {
        "tier": "none",
        "memory": "1G",
        "writable": ["a", "b=c"],
        "quiet": True,
        "explain": True,
        "env": ["CI"],
    }
    assert command == ["cmd", "--tier"]


def test_parse_stops_at_first_positional() -> None:
    opts, command = cli.parse(["--timeout", "5s", "ls", "-la", "--", "x"], cli.RUN_OPTIONS, True)
    assert opts == {"timeout": "5s"}
    assert command == ["ls", "-la", "--", "x"]
    _, command = cli.parse(["-", "rest"], cli.RUN_OPTIONS, True)
    assert command == ["-", "rest"]


def test_parse_value_may_look_like_an_option() -> None:
    opts, command = cli.parse(["--log", "--explain", "true"], cli.RUN_OPTIONS, True)
    assert opts == {"log": "--explain"}
    assert command == ["true"]


def test_parse_empty_and_last_value_wins() -> None:
    assert cli.parse([], cli.RUN_OPTIONS, True) == ({}, [])
    assert cli.parse(["--"], cli.RUN_OPTIONS, True) == ({}, [])
    opts, _ = cli.parse(["--tier", "a", "--tier=b", "--tier="], cli.RUN_OPTIONS, True)
    assert opts == {"tier": ""}


def test_a_value_may_start_with_a_dash_but_is_not_the_separator() -> None:
    opts, command = cli.parse(["--env", "-x", "--allow=--", "--", "true"], cli.RUN_OPTIONS, True)
    assert (opts["env"], opts["allow"], command) == (["-x"], ["--"], ["true"])


@pytest.mark.parametrize(
    ("args", "positional", "fragment"),
    [
        (["--nope"], True, "unknown option --nope"),
        (["--nope=1"], True, "unknown option --nope"),
        (["-x"], True, "unknown option -x"),
        (["--tier"], True, "needs a value"),
        (["--quiet", "--memory"], True, "needs a value"),
        (["--allow", "--", "true"], True, "needs a value"),  # forgotten, not a host "--"
        (["--explain=yes"], True, "takes no value"),
        (["stray"], False, "unexpected argument"),
    ],
)
def test_parse_errors(args: list[str], positional: bool, fragment: str) -> None:
    with pytest.raises(CorralError) as info:
        cli.parse(args, cli.RUN_OPTIONS, positional)
    assert info.value.code == EXIT_USAGE
    assert fragment in info.value.message


# -- main(): usage errors are one line and exit 2 -------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["frobnicate"], "unknown command"),
        (["run", "--bogus", "--", "true"], "unknown option --bogus"),
        (["run"], "nothing to run"),
        (["run", "--quiet", "--"], "nothing to run"),
        (["run", "--memory", "lots", "--", "true"], "--memory"),
        (["run", "--memory=12Q", "true"], "bad size"),
        (["run", "--timeout", "0", "--", "true"], "--timeout"),
        (["run", "--cpus", "many", "--", "true"], "--cpus"),
        (["run", "--pids", "-1", "--", "true"], "--pids"),
        (["run", "--output-limit", "x", "--", "true"], "--output-limit"),
        (["run", "--env", "=B", "--", "true"], "--env"),
        (["run", "--env", "A\0=B", "--", "true"], "--env"),
        (["run", "--tier", "nosuchtier", "--", "true"], "unknown tier 'nosuchtier'"),
        (["run", "--workspace", "/", "--", "true"], "workspace cannot be /"),
        (["run", "--workspace", os.path.expanduser("~"), "--", "true"], "your home directory"),
        # a layer no run could use (found by trying corral as a new user: put in ~ said 0)
        (["home", "path", "--workspace", os.path.expanduser("~")], "your home directory"),
        (["home", "put", ".npmrc", "--workspace", "/"], "workspace cannot be /"),
        (["run", "--tier"], "needs a value"),
        (["doctor", "extra"], "unexpected argument"),
        (["doctor", "--tier", "x"], "unknown option"),
        (["log", "-n", "many"], "-n needs a whole number"),
        # flags against flags: the flags named, not a policy file's key
        (["run", "--allow", "a.test", "--network", "none", "--", "true"], "--allow has no"),
        (["run", "--transparent", "--network", "none", "--", "true"], "--transparent has no"),
    ],
)
def test_main_usage_errors(
    args: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(args, capsys)
    assert code == EXIT_USAGE
    assert out == ""
    assert_one_error_line(err, fragment)


@pytest.mark.parametrize(
    "text",
    ["[limits\n", "[limits]\nmemory = 'lots'\n", "colour = 1\n", "[nope]\n"],
)
def test_main_bad_policy_file(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text(text)
    code, _, err = run_main(["run", "--policy", str(broken), "--", "true"], capsys)
    assert code == EXIT_USAGE
    assert_one_error_line(err, str(broken))


def test_main_bad_workspace_corral_toml(isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (isolated / "corral.toml").write_text("[limits]\ncpus = 0\n")
    code, _, err = run_main(["run", "--", "true"], capsys)
    assert code == EXIT_USAGE
    assert_one_error_line(err, "corral.toml:2: limits.cpus")


@pytest.mark.parametrize("flag", ["--memory", "--output-limit"])
def test_main_infinite_size_is_usage_error(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["run", flag, "inf", "--", "true"], capsys)
    assert code == EXIT_USAGE
    assert_one_error_line(err, flag)


def test_main_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--help"], ["-h"], ["help"]):
        code, out, err = run_main(args, capsys)
        assert code == 0
        assert out.startswith("usage: corral run")
        assert err == ""
    code, out, _ = run_main([], capsys)
    assert code == EXIT_USAGE
    assert out.startswith("usage:")
    code, out, _ = run_main(["--version"], capsys)
    assert code == 0
    assert out.startswith("corral ")


def test_main_planned_tier_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(["run", "--tier", "firecracker", "--", "true"], capsys)
    assert code == EXIT_REFUSED == 122
    assert out == ""
    assert_one_error_line(err, "tier firecracker is not available")


def test_main_auto_refuses_without_a_tier(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from corral.tiers.landlock import LandlockTier

    monkeypatch.setattr(NamespaceTier, "health", lambda self, probe=False: Health(False, "nope"))
    monkeypatch.setattr(LandlockTier, "health", lambda self, probe=False: Health(False, "nope"))
    code, _, err = run_main(["run", "--", "true"], capsys)
    assert code == EXIT_REFUSED
    assert_one_error_line(err, "no sandbox tier is available")


@pytest.mark.parametrize("tier", ["auto", "namespace", "landlock", "none"])
def test_explain_prints_plan_and_runs_nothing(
    tier: str,
    isolated: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(NamespaceTier, "health", lambda self, probe=False: Health(True, "test"))
    marker = isolated / "marker"
    code, out, err = run_main(
        ["run", "--tier", tier, "--explain", "--", "touch", str(marker)], capsys
    )
    assert code == 0
    assert err == ""
    expected = "namespace" if tier == "auto" else tier
    assert out.startswith(f"tier: {expected}\n")
    assert f"workspace: {isolated}" in out
    assert "argv: " in out
    assert str(marker) in out
    assert not marker.exists()
    assert not (tmp_path / "state").exists()  # not even a log entry


# -- doctor ------------------------------------------------------------------------------


def test_doctor_json_lists_every_tier(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(["doctor", "--json"], capsys)
    assert code == 0
    assert err == ""
    data = json.loads(out)
    assert [t["name"] for t in data["tiers"]] == list(tiers.REGISTRY)
    for row in data["tiers"]:
        assert isinstance(row["available"], bool)
        assert isinstance(row["reason"], str) and row["reason"]
        assert isinstance(row["summary"], str)
    by_name = {t["name"]: t for t in data["tiers"]}
    assert by_name["none"]["available"] is True
    assert by_name["firecracker"]["available"] is False
    from corral.tiers.landlock import abi_version

    assert by_name["landlock"]["available"] is (abi_version() >= 6)
    assert by_name["landlock"]["abi"] == abi_version()
    assert data["auto"] in (None, *tiers.AUTO_ORDER)
    if data["auto"]:
        assert by_name[data["auto"]]["available"] is True


def test_doctor_text_lists_every_tier(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(["doctor"], capsys)
    assert code == 0
    assert err == ""
    tier_part, _, defaults = out.partition("\ndefaults (this host: ")
    # placements (where a sandbox runs) come after the tiers, apart from them
    tier_part, _, places = tier_part.partition("\nplacements (")
    assert [line.split()[0] for line in places.splitlines()[1:]] == ["local", "ray", "kubernetes"]
    defaults, _, home = defaults.partition("\nhome layers (")
    assert "namespace, landlock, microvm: $HOME is the workspace's home layer" in home
    home, _, tls_line = home.rstrip("\n").rpartition("\n")
    lines = [line for line in tier_part.splitlines() if not line.startswith(" ")]
    assert len(lines) == len(tiers.REGISTRY) + 1
    for name, line in zip(tiers.REGISTRY, lines, strict=False):
        assert line.split()[0] == name
        assert line.split()[1] in ("available", "unavailable")
    assert lines[-1].startswith("auto -> ")
    # then the default limits, and whether they hold here (tests/unit/test_bounds.py)
    assert [line.split()[0] for line in defaults.splitlines()[1:] if line[2] != " "] == [
        "memory",
        "pids",
        "tmp",
        "shm",
        "run",
    ]
    from corral.tiers.landlock import abi_version

    if abi_version() >= 6:  # what the landlock tier does not hide is said plainly
        assert "compared with namespace:" in out and "host processes are visible" in out
    # last, TLS inspection: the package it needs and where the user's CA is
    assert tls_line.startswith("tls inspection: ")


def test_doctor_survives_a_broken_health_check(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(self: NamespaceTier, probe: bool = False) -> Health:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(NamespaceTier, "health", boom)
    code, out, _ = run_main(["doctor", "--json"], capsys)
    assert code == 0
    row = next(t for t in json.loads(out)["tiers"] if t["name"] == "namespace")
    assert row["available"] is False
    assert "kaboom" in row["reason"]


def test_mcp_without_the_sdk_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import sys

    for name in ("mcp", "mcp.server", "mcp.server.mcpserver"):
        monkeypatch.setitem(sys.modules, name, None)
    (tmp_path / "ws").mkdir(exist_ok=True)
    monkeypatch.chdir(tmp_path / "ws")  # not tmp_path: it holds this test's $HOME
    assert cli.main(["mcp"]) == 122
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'corral[mcp]'" in err


def test_broken_pipe_ends_like_a_pipeline(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`corral doctor --json | head`: the reader left; exit 141 without an error line."""

    def closed_reader(args: list[str]) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(commands, "cmd_doctor", closed_reader)
    monkeypatch.setattr(os, "dup2", lambda *a: None)  # keep pytest's own stdout
    code, _, err = run_main(["doctor", "--json"], capsys)
    assert code == 141 and err == ""
    code, out, err = run_main(["--version"], capsys)  # allow twin: a reader that stays
    assert code == 0 and out.startswith("corral ")


# -- help from the option tables; options that do not apply ---------------------------


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_command_has_help_listing_every_option_it_parses(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    usage, _, table = cli.COMMANDS[command]
    prefix = {"policy": ["policy"], "proxy": ["proxy"]}.get(command, [command])
    for args in ([*prefix, "--help"], [*prefix, "-h"], ["help", command]):
        code, out, err = run_main(args, capsys)
        assert (code, err) == (0, ""), args
        assert out.startswith(f"usage: corral {command} {usage}\n"), out
        for option in table:  # generated from the table: nothing parsed goes unlisted
            assert f"  {option}" in out or f", {option}" in out, (command, option)
    if command in ("policy", "proxy"):  # the subcommand's own --help too
        sub = ["import"] if command == "policy" else ["serve"]
        code, out, _ = run_main([command, *sub, "--help"], capsys)
        assert code == 0 and out.startswith(f"usage: corral {command} ")


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_help_names_only_options_the_command_takes(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`corral shell --help` said --timeout takes none, and shell refuses --timeout
    (found by trying corral as a new user); -h's line sat two columns off."""
    _, _, table = cli.COMMANDS[command]
    code, out, _ = run_main(["help", command], capsys)
    assert code == 0
    text = " ".join(out.split())  # (unwrapped)
    said = re.search(r"((?:--[a-z-]+(?:, | and )?)+) take none", text)
    if said is not None:
        assert all(name in table for name in re.findall(r"--[a-z-]+", said.group(1))), said
    options = [line for line in out.splitlines() if line.startswith("  -")]
    helps = [line for line in options if line.startswith("  -h, --help")]
    assert helps and helps[0][24:] == "this text", helps


def test_help_names_every_tier_the_registry_knows(capsys: pytest.CaptureFixture[str]) -> None:
    from corral import tiers

    for command, (_, _, table) in cli.COMMANDS.items():
        if "--tier" not in table:
            continue
        _, out, _ = run_main([command, "--help"], capsys)
        listed = " ".join(out.split())  # (the wrapped lines joined)
        assert "{tiers}" not in listed
        for name in tiers.names():
            assert name in listed, (command, name)


def test_top_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_main(["--help"], capsys)
    for command, (usage, what, _) in cli.COMMANDS.items():
        assert f"corral {command} {usage}" in out and what in out
    assert "125  the sandbox could not be set up" in out
    code, _, err = run_main(["help", "nosuch"], capsys)
    assert code == EXIT_USAGE
    assert_one_error_line(err, "no help for 'nosuch'")


def test_help_after_the_command_is_the_commands_own() -> None:
    opts, command = cli.parse(["-q", "ls", "--help"], cli.RUN_OPTIONS, True, "run")
    assert opts == {"quiet": True} and command == ["ls", "--help"]
    _, command = cli.parse(["--", "--help"], cli.RUN_OPTIONS, True, "run")
    assert command == ["--help"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["shell", "--timeout", "5"], "--timeout does not apply to corral shell"),
        (["shell", "--output-limit=1M"], "--output-limit does not apply to corral shell"),
        (["mcp", "--explain"], "--explain does not apply to corral mcp"),
        (["mcp", "--pass-fd", "3"], "--pass-fd does not apply to corral mcp"),
        (["mcp", "--report", "json"], "--report does not apply to corral mcp"),
        (["doctor", "--allow", "x"], "unknown option --allow for corral doctor"),
        (["log", "--host", "x"], "--host filters the network audit log: use it with --net"),
        (["log", "--decision", "deny"], "--decision filters the network audit log"),
        (["log", "--net-log", "f"], "--net-log filters the network audit log"),
        (["log", "--net", "--log", "f"], "--log is the activity log; with --net"),
        (["proxy", "serve", "--tier", "x"], "unknown option --tier for corral proxy serve"),
        (["policy", "import", "--allow", "x", "f.json"], "unknown option --allow"),
    ],
)
def test_options_that_do_not_apply_are_errors(
    args: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(args, capsys)
    assert (code, out) == (EXIT_USAGE, "")
    assert_one_error_line(err, fragment)


def test_the_same_options_apply_where_they_mean_something() -> None:
    # the allow twins of the refusals above: each parses for the command it belongs to
    assert cli.parse(["--explain"], cli.SHELL_OPTIONS, True, "shell")[0] == {"explain": True}
    assert cli.parse(["--timeout", "5"], cli.MCP_OPTIONS, False, "mcp")[0] == {"timeout": "5"}
    opts, _ = cli.parse(["--report", "json", "--timeout", "5"], cli.RUN_OPTIONS, True, "run")
    assert opts == {"report": "json", "timeout": "5"}


def test_shell_explain_prints_the_plan(isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(["shell", "--tier", "none", "--explain", "--", "sh"], capsys)
    # tier none is refused for a shell before any plan: the refusal is the answer
    assert code == EXIT_USAGE
    code, out, err = run_main(["shell", "--tier", "landlock", "--explain", "--", "sh"], capsys)
    assert (code, err) == (0, "")
    assert out.startswith("tier: landlock\n") and "TIOCSCTTY" in out  # the pty shim, not run


def test_env_name_passes_and_name_value_sets(isolated: Path) -> None:
    pol = cli.build_policy({"env": ["KEEP", "GIVEN=a=b", "EMPTY="]})
    assert pol.env.pass_names == ["KEEP"]
    assert pol.env.set_values == {"GIVEN": "a=b", "EMPTY": ""}
    assert "a=b" not in json.dumps(pol.to_dict())  # values stay out of digests and --explain


def test_commands_but_run_turn_the_collector_back_on() -> None:
    """The entry script turns the cyclic collector off for `corral run` (one short
    process); every other command may live long (shell, mcp, proxy) and gets it back."""
    import gc

    was = gc.isenabled()
    try:
        gc.disable()
        assert cli._command("run") is cli.cmd_run and not gc.isenabled()
        assert cli._command("doctor") is commands.cmd_doctor and gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def test_container_flags_with_a_tier_without_a_container_are_refused() -> None:
    """--image, --engine and --oci-runtime say something only to the container
    tiers: given to another, the mistake is said, not dropped; the twin: the
    container tiers take them."""
    from corral.cli import refuse_unused_flags
    from corral.errors import CorralError
    from corral.tiers.container import ContainerTier, GVisorTier
    from corral.tiers.landlock import LandlockTier
    from corral.tiers.namespace import NamespaceTier

    tier: Tier
    for flag, key in (
        ("--image", "image"),
        ("--engine", "engine"),
        ("--oci-runtime", "oci_runtime"),
    ):
        for tier in (NamespaceTier(), LandlockTier()):
            with pytest.raises(CorralError, match=f"{flag} is for the container tiers"):
                refuse_unused_flags({key: "x"}, tier)
        for tier in (ContainerTier(), GVisorTier()):
            refuse_unused_flags({key: "x"}, tier)
    refuse_unused_flags({"memory": "1G"}, NamespaceTier())  # other flags: any tier
