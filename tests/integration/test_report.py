"""What a run was refused, told after it: the "blocked" line, --report, refused writes.

Real CLI on every tier, as root and as an unprivileged user; origins on 127.0.0.1
count what reached them, so a denial is checked from outside as well.
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import Corral
from test_network import CURL, HTTP_PROXY, Origin, origins  # noqa: F401  (fixture)


def last_json(stderr: bytes) -> dict[str, Any]:  # the --report json document
    doc: dict[str, Any] = json.loads(stderr.decode().strip().splitlines()[-1])
    return doc


def corral_lines(stderr: bytes) -> list[str]:
    return [x for x in stderr.decode().splitlines() if x.startswith("corral: ")]


def test_blocked_line_names_host_rule_and_flag(
    tsandbox: tuple[Corral, Path],
    origins: tuple[Origin, Origin],  # noqa: F811
) -> None:
    c, ws = tsandbox
    ok, bad = origins
    script = f"""
        {CURL} {HTTP_PROXY} http://127.0.0.1:{bad.port}/a
        {CURL} {HTTP_PROXY} http://127.0.0.1:{bad.port}/b
        {CURL} {HTTP_PROXY} -p http://blocked.test:443/ || true
        {CURL} {HTTP_PROXY} http://127.0.0.1:{ok.port}/ok
    """
    r = c.sh(ws, script, "--allow", f"127.0.0.1:{ok.port}")
    assert b"hello from origin" in r.stdout  # the allow twin, same run and policy
    assert ok.hits == [("GET", "/ok")] and bad.hits == []
    blocked = [x for x in corral_lines(r.stderr) if x.startswith("corral: blocked: ")]
    assert len(blocked) == 1, r.stderr  # one line for every refused destination
    line = blocked[0]
    assert (
        f"127.0.0.1:{bad.port} (2 requests; rule default: address not in the allow list; "
        f"allow with --allow 127.0.0.1:{bad.port})"
    ) in line
    assert (
        "blocked.test:443 (rule default: host not in the allow list; "
        "allow with --allow blocked.test:443)"
    ) in line
    # the flag it names does what it says
    flag = f"127.0.0.1:{bad.port}"
    again = c.sh(ws, f"{CURL} {HTTP_PROXY} http://{flag}/now", "--allow", flag)
    assert b"hello from origin" in again.stdout and bad.hits == [("GET", "/now")]
    assert not [x for x in corral_lines(again.stderr) if "blocked" in x]


def test_rebinding_refusal_gives_its_reason_and_the_address_flag(
    tsandbox: tuple[Corral, Path],
    origins: tuple[Origin, Origin],  # noqa: F811
) -> None:
    """An allowed name that resolves to a loopback address is refused by the
    rebinding guard, with its reason and the --allow of the address; allowed so,
    it passes.  A name pinned to that address in [network] hosts passes without
    (the pin says what the name is, and the address stays closed to the sandbox)."""
    c, ws = tsandbox
    ok, _ = origins
    (ws / "corral.toml").write_text(
        f'[network]\nmode = "proxy"\nallow = ["localhost:{ok.port}", "svc.test:{ok.port}"]\n'
        'hosts = { "svc.test" = "127.0.0.1" }\n'
    )
    c.chown(ws)
    url = f"http://localhost:{ok.port}/resolved"
    denied = c.sh(ws, f"{CURL} {HTTP_PROXY} {url}")
    assert json.loads(denied.stdout)["rule"] == "rebinding" and ok.hits == []
    line = next(x for x in corral_lines(denied.stderr) if x.startswith("corral: blocked: "))
    assert f"localhost:{ok.port} (rule rebinding: localhost resolved to internal address " in line
    assert line.endswith((f"--allow 127.0.0.1:{ok.port})", f"--allow [::1]:{ok.port})"))
    allowed = c.sh(ws, f"{CURL} {HTTP_PROXY} {url}", "--allow", f"127.0.0.1:{ok.port}")
    assert b"hello from origin" in allowed.stdout and ok.hits == [("GET", "/resolved")]
    assert not [x for x in corral_lines(allowed.stderr) if "blocked" in x]
    pinned = c.sh(ws, f"{CURL} {HTTP_PROXY} http://svc.test:{ok.port}/pinned")
    assert b"hello from origin" in pinned.stdout and ok.hits[-1] == ("GET", "/pinned")
    direct = c.sh(ws, f"{CURL} {HTTP_PROXY} http://127.0.0.1:{ok.port}/direct")
    assert json.loads(direct.stdout)["rule"] == "default" and len(ok.hits) == 2


def test_report_json_lists_every_denial_as_data(
    tsandbox: tuple[Corral, Path],
    origins: tuple[Origin, Origin],  # noqa: F811
) -> None:
    c, ws = tsandbox
    ok, bad = origins
    script = f"""
        {CURL} {HTTP_PROXY} http://127.0.0.1:{bad.port}/x
        {CURL} {HTTP_PROXY} http://127.0.0.1:{ok.port}/y
        mkdir .vscode && echo '{{}}' > .vscode/settings.json
        exit 3
    """
    r = c.sh(ws, script, "--allow", f"127.0.0.1:{ok.port}", "--report", "json")
    assert r.returncode == 3 and b"hello from origin" in r.stdout
    doc = last_json(r.stderr)
    assert doc["exit"] == 3 and isinstance(doc["run_id"], str) and doc["tier"]
    denials = doc["denials"]
    assert isinstance(denials, list)
    net = [d for d in denials if d["kind"] == "network"]
    assert net == [
        {
            "kind": "network",
            "host": "127.0.0.1",
            "port": bad.port,
            "lookup": False,
            "rule": "default",
            "reason": "address not in the allow list",
            "address": None,
            "count": 1,
            "allow_with": f"--allow 127.0.0.1:{bad.port}",
        }
    ]
    moved = [d for d in denials if d["kind"] == "file"]
    assert [(d["path"], d["action"], d["rule"]) for d in moved] == [
        (str(ws / ".vscode"), "quarantined", "write-deny")
    ]
    assert not (ws / ".vscode").exists()
    # --report json replaces corral's closing lines: the JSON is the last word
    assert not [x for x in corral_lines(r.stderr) if "blocked" in x or "denied write" in x]
    # the run record keeps the same denials, each with corral's line for it
    record = json.loads(c.run(["log", "--json", "-n", "1"], cwd=ws).stdout)
    kept = [{k: v for k, v in d.items() if k != "line"} for d in record["denials"]]
    assert kept == [*moved, *net] or kept == [*net, *moved]
    lines = sorted(d["line"] for d in record["denials"])
    assert lines[0].startswith("blocked: ") and lines[1].startswith("denied write: "), lines


def test_report_file_and_limits(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    target = c.state / "report.json"
    r = c.sh(
        ws,
        "head -c 5000 /dev/zero; sleep 5",
        "--timeout",
        "1",
        "--output-limit",
        "1K",
        "--report",
        str(target),
    )
    assert r.returncode == 124
    doc = json.loads(target.read_text())
    limits = {d["name"]: d for d in doc["denials"] if d["kind"] == "limit"}
    assert limits["timeout"]["value"] == 1.0
    assert limits["output"]["value"] == 1024 and limits["output"]["bytes"] >= 5000
    # with a file, the closing lines still go to the person watching
    assert b"corral: timed out after 1s" in r.stderr
    assert b"corral: output truncated: kept 1024 of 50" in r.stderr
    quiet = c.sh(ws, "true", "--report", str(target))  # the allow twin: nothing refused
    assert quiet.returncode == 0
    assert [d for d in json.loads(target.read_text())["denials"] if d["kind"] != "bound"] == []


@pytest.mark.parametrize("plant", ["ln -s {victim} report.json", "mkfifo report.json"])
def test_a_report_file_the_run_replaced_is_not_written_through(
    tsandbox: tuple[Corral, Path], plant: str
) -> None:
    """--report FILE in the workspace is made and masked before the run, and
    written after it on a log's terms: a link the run left there is not followed
    (the file it points to outside stays as it was), a FIFO does not hang corral."""
    c, ws = tsandbox
    victim = c.state / "victim.conf"
    victim.write_text("precious\n")
    (ws / "report.json").unlink(missing_ok=True)
    twin = c.sh(ws, "true", "--report", "report.json")  # the allow twin: a plain report
    assert twin.returncode == 0 and json.loads((ws / "report.json").read_text())["exit"] == 0
    script = f"rm -f report.json; {plant.format(victim=victim)}; true"
    r = c.sh(ws, script, "--report", "report.json")
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "precious\n"
    kind = (ws / "report.json").lstat().st_mode
    if stat.S_ISREG(kind):  # the mask held inside: the report is there, whole
        assert json.loads((ws / "report.json").read_text())["exit"] == 0
    else:  # replaced (a tier that restores after the run): refused, and said
        assert b"could not write the report to report.json" in r.stderr


# What git does to write .git/config: a lock file beside it, renamed over it.
LOCK_WRITE = """
import os
fd = os.open(".git/config.lock", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
os.write(fd, b"[user]\\n\\tname = x\\n")
os.close(fd)
try:
    os.rename(".git/config.lock", ".git/config")
except OSError as exc:
    print("refused:", exc.strerror)
    os.unlink(".git/config.lock")
"""


@pytest.mark.tiers(
    "namespace",
    "container",
    "gvisor",
    why="tiers that mount .git/config read-only (landlock restores it after the run instead)",
)
def test_git_config_write_refused_is_named(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    git = shutil.which("git")
    if git is not None:
        subprocess.run([git, "init", "-q", str(ws)], check=True)
    else:  # enough of a repository for corral to protect it
        (ws / ".git" / "hooks").mkdir(parents=True)
        (ws / ".git" / "config").write_text("[core]\n\tbare = false\n")
    (ws / "w.py").write_text(LOCK_WRITE)
    c.chown(ws)
    before = (ws / ".git" / "config").read_bytes()
    r = c.run(["run", "-q", "--report", "json", "--", "python3", "w.py"], cwd=ws)
    assert r.stdout == b"refused: Device or resource busy\n", r
    assert (ws / ".git" / "config").read_bytes() == before
    assert not (ws / ".git" / "config.lock").exists()
    denials = last_json(r.stderr)["denials"]
    assert isinstance(denials, list)
    refused = [d for d in denials if d.get("action") == "refused"]
    assert refused == [
        {
            "kind": "file",
            "path": str(ws / ".git" / "config"),
            "rule": "write-deny",
            "action": "refused",
            "lock": str(ws / ".git" / "config.lock"),
            "count": 1,
        }
    ]
    said = c.run(["run", "-q", "--", "python3", "w.py"], cwd=ws)  # in words, no --report
    line = f"corral: denied write: {ws / '.git' / 'config'} (write-deny, read-only in the sandbox)"
    assert line.encode() in said.stderr and b"a write through config.lock refused" in said.stderr
    if git is not None and c.has("host-root"):  # git itself, as a user meets it
        real = c.sh(ws, "git config user.name x; git config --get core.bare")
        assert b"could not write config file .git/config: Device or resource busy" in real.stderr
        assert real.stdout == b"false\n"  # reading works
        assert line.encode() in real.stderr


def test_an_unprotected_git_write_is_not_a_denial(tsandbox: tuple[Corral, Path]) -> None:
    """The allow twin of the refused write: a lock renamed over a writable file."""
    c, ws = tsandbox
    (ws / ".git").mkdir()
    (ws / ".git" / "config").write_text("[core]\n")
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    c.chown(ws)
    script = "echo new > .git/HEAD.lock && mv .git/HEAD.lock .git/HEAD && cat .git/HEAD"
    r = c.sh(ws, script, "--report", "json")
    assert r.returncode == 0 and r.stdout.startswith(b"new")
    assert [d for d in last_json(r.stderr)["denials"] if d["kind"] == "file"] == []


# Runs inside an existing repository: a directory the run fills with a config that
# runs code (core.fsmonitor) and a hook, and .git/commondir naming it, so that git
# on the host would read them there.
COMMONDIR_REDIRECT = """
mkdir -p evil/hooks && cp -r .git/objects .git/refs evil/
printf '[core]\\n\\tfsmonitor = "touch PWNED; false"\\n' > evil/config
printf '#!/bin/sh\\ntouch PWNED\\n' > evil/hooks/pre-commit && chmod +x evil/hooks/pre-commit
echo ../evil > .git/commondir
"""


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed on this machine")
def test_a_commondir_planted_in_an_existing_repository_is_quarantined(
    tsandbox: tuple[Corral, Path],
) -> None:
    """.git/commondir makes git take its config and hooks from the directory it
    names: planted in a repository that existed at launch, the next `git status`
    on the host ran the run's code.  It is quarantined and named after the run
    (or refused at once where it exists already); the twin: a commit inside
    works, and git on the host afterwards runs nothing of the run's."""
    c, ws = tsandbox
    inside = ["git", "-c", "user.email=a@b", "-c", "user.name=a"]
    git = [*inside, "-c", "safe.directory=*"]  # (on the host: the workspace may be a user's)
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    subprocess.run([*git, "-C", str(ws), "commit", "-q", "--allow-empty", "-m", "0"], check=True)
    c.chown(ws)
    commit = " ".join(inside) + " commit -q --allow-empty -m 1 && "  # the twin, first
    r = c.sh(ws, commit + COMMONDIR_REDIRECT)
    assert r.returncode == 0, r
    assert b"commondir" in r.stderr, r  # named after the run
    assert not (ws / ".git" / "commondir").exists()
    common = subprocess.run(
        [*git, "-C", str(ws), "rev-parse", "--git-common-dir"], capture_output=True, text=True
    )
    assert common.stdout.strip() == ".git", common
    subprocess.run([*git, "-C", str(ws), "status", "-s"], capture_output=True, check=True)
    subprocess.run([*git, "-C", str(ws), "commit", "-q", "--allow-empty", "-m", "2"], check=True)
    assert not (ws / "PWNED").exists()
    log = subprocess.run([*git, "-C", str(ws), "log", "--format=%s"], capture_output=True)
    assert log.stdout.split() == [b"2", b"1", b"0"]  # the commit made inside is kept


# Runs inside: a repository made where git looks before the workspace's .git, in
# two ways git takes and the walk did not: a subdirectory that is itself a git dir
# (HEAD, objects/, refs/ and a config running code), and a .git file whose path
# runs over two lines.
GIT_DIR_ELSEWHERE = """
mkdir -p src/objects src/refs/heads && echo 'ref: refs/heads/main' > src/HEAD
printf '[core]\\n\\tbare = false\\n\\tworktree = .\\n' > src/config
printf '\\tfsmonitor = "touch ../PWNED; false"\\n' >> src/config
mkdir -p sub "two
lines/objects" "two
lines/refs/heads"
echo 'ref: refs/heads/main' > "two
lines/HEAD"
printf '[core]\\n\\tfsmonitor = "touch ../PWNED; false"\\n' > "two
lines/config"
printf 'gitdir: ../two\\nlines\\n' > sub/.git
"""


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed on this machine")
def test_a_git_dir_by_another_name_made_in_the_run_is_quarantined(
    tsandbox: tuple[Corral, Path],
) -> None:
    """git takes a directory holding HEAD, objects/ and refs/ for a repository, and a
    .git file's path up to its last line break: a run made both, each with a
    config that runs code, and `git status` there on the host ran it (found by
    attacking corral from outside: the walk looked for .git entries and read a
    gitdir line only).  Their configs are quarantined and named; git on the host
    runs nothing of the run's.  The twin: the files the run wrote beside them stay."""
    c, ws = tsandbox
    (ws / "src").mkdir()
    (ws / "src" / "main.py").write_text("print('hi')\n")
    c.chown(ws)
    r = c.sh(ws, GIT_DIR_ELSEWHERE + "echo kept > src/notes.txt")
    assert r.returncode == 0, r
    assert b"src/config" in r.stderr and b"lines/config" in r.stderr, r
    assert not (ws / "src" / "config").exists() and not (ws / "two\nlines" / "config").exists()
    for where in ("src", "sub"):
        subprocess.run(
            ["git", "-c", "safe.directory=*", "-C", str(ws / where), "status"],
            capture_output=True,
            timeout=30,
        )
    assert not (ws / "PWNED").exists()
    assert (ws / "src" / "notes.txt").read_text() == "kept\n"
    assert (ws / "src" / "main.py").read_text() == "print('hi')\n"


@pytest.mark.tiers(
    "namespace",
    why="the container tiers name themselves in their own /etc/hosts, landlock keeps the host's",
)
def test_the_sandboxs_own_hostname_is_no_blocked_host(tsandbox: tuple[Corral, Path]) -> None:
    """Python's getfqdn (and `hostname -f`, Java's getLocalHost) look the sandbox's
    hostname up: it used to be refused and reported, "allow with --allow corral".
    It is loopback now, with or without a network; the twin: another name is
    still refused and named."""
    c, ws = tsandbox
    script = (
        "python3 -c 'import socket; n = socket.gethostname(); "
        "print(n, socket.getfqdn(), socket.gethostbyname(n))'; "
        "python3 -c 'import socket; socket.gethostbyname(\"blocked.test\")' || echo refused"
    )
    for flags in ((), ("--allow", "127.0.0.1:9")):
        r = c.sh(ws, script, *flags)
        assert r.stdout.decode().split() == ["corral", "corral", "127.0.0.1", "refused"], r
        (blocked,) = [x for x in corral_lines(r.stderr) if x.startswith("corral: blocked: ")]
        assert "blocked.test" in blocked and "corral" not in blocked.removeprefix("corral: ")
        assert "arpa" not in blocked


def test_a_name_looked_up_but_never_asked_of_the_proxy_is_told(
    sandbox: tuple[Corral, Path],
    origins: tuple[Origin, Origin],  # noqa: F811
) -> None:
    """Node's fetch ignores HTTP_PROXY: it looks the name up (the pin answers), then
    connects directly and fails with nothing from corral.  Now a note names the
    host and --transparent.  The twin: curl through the proxy, same policy."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed (.ci/run installs nodejs)")
    c, ws = sandbox
    ok, _ = origins
    (ws / "corral.toml").write_text(
        f'[network]\nmode = "proxy"\nallow = ["api.test:{ok.port}"]\n'
        'hosts = { "api.test" = "127.0.0.1" }\n'
    )
    c.chown(ws)
    url = f"http://api.test:{ok.port}/node"
    fetch = (
        f'node -e \'fetch("{url}").then(r => console.log(r.status), () => console.log("failed"))\''
    )
    r = c.sh(ws, fetch)
    assert r.stdout.decode().split() == ["failed"] and ok.hits == []
    assert (
        "corral: note: api.test was looked up but never asked of the proxy: a tool that "
        "ignores HTTP_PROXY (Node's fetch) connects directly"
    ) in r.stderr.decode(), r.stderr
    twin = c.sh(ws, f"{CURL} {HTTP_PROXY} http://api.test:{ok.port}/curl")
    assert b"hello from origin" in twin.stdout and ok.hits == [("GET", "/curl")]
    assert b"never asked" not in twin.stderr
