"""Filesystem confinement on real bwrap: every deny has an allow twin in the same run."""

from __future__ import annotations

import os
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import Corral, is_gvisor, sees_host_root

# Secrets under the home directory that the default policy must hide.
SECRET_FILES = [
    ".ssh/id_ed25519",
    ".aws/credentials",
    ".azure/accessTokens.json",
    ".config/gcloud/credentials.db",
    ".gnupg/private-keys-v1.d/key.key",
    ".netrc",
    ".git-credentials",
    ".docker/config.json",
    ".kube/config",
    ".config/gh/hosts.yml",
    ".npmrc",
    ".pypirc",
    ".password-store/bank.gpg",
]


def sh(
    c: Corral, ws: Path, script: str, *flags: str, **kw: object
) -> subprocess.CompletedProcess[bytes]:
    return c.run(["run", "-q", *flags, "--", "sh", "-c", script], cwd=ws, **kw)  # type: ignore[arg-type]


def test_workspace_is_writable_and_outside_is_not(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    outside = c.base / "outside"
    outside.mkdir()
    c.chown(outside)
    r = sh(
        c,
        ws,
        f"""
        echo ok > inside.txt && echo inside=ok
        echo x > {outside}/abs.txt 2>/dev/null && echo abs=WROTE || echo abs=denied
        echo x > ../outside/dotdot.txt 2>/dev/null && echo dotdot=WROTE || echo dotdot=denied
        echo x > /etc/corral-test 2>/dev/null && echo etc=WROTE || echo etc=denied
        echo x > {c.home}/home.txt 2>/dev/null && echo home=WROTE || echo home=denied
        echo x > $HOME/home.txt && echo layer=ok
        echo x > ${{TMPDIR:-/tmp}}/scratch && echo tmp=ok
        echo x > /tmp/scratch-{ws.parent.name} 2>/dev/null \
            && echo hosttmp=WROTE || echo hosttmp=denied
    """,
    )
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr
    # $HOME is the workspace's home layer (corral.home), not the real home
    assert "inside=ok" in out and "tmp=ok" in out and "layer=ok" in out
    for key in ("abs", "dotdot", "etc"):
        assert f"{key}=denied" in out, out
    # containers: the home's path holds the layer itself (the host home is absent)
    assert ("home=denied" in out) == sees_host_root(c), out
    assert (ws / "inside.txt").read_text() == "ok\n"
    assert list(outside.iterdir()) == []
    assert not Path("/etc/corral-test").exists()
    assert not (c.home / "home.txt").exists()
    # the private /tmp (or, without one, the private TMPDIR) did not reach the host
    assert not Path(f"/tmp/scratch-{ws.parent.name}").exists()
    assert ("hosttmp=WROTE" in out) == c.has("private-tmp"), out


@pytest.mark.slow  # (20 s across the tiers; corral.trees' depth is unit-tested too)
def test_a_scratch_nested_deeper_than_a_recursion_is_removed(
    tsandbox: tuple[Corral, Path],
) -> None:
    """A run nested its TMPDIR 3,000 directories deep (1,500 here): removing the scratch ended
    in RecursionError, exit 123, no record of the run and the scratch left on
    the host (found by attacking corral).  Now the command's exit passes through
    and the run is logged; the twin is a shallow one, the same way."""
    c, ws = tsandbox
    for depth in (1500, 10):  # (1,500: past the recursion limit, within PATH_MAX)
        mark = f"mark-{depth}-{os.getpid()}-{time.monotonic_ns()}"
        script = (
            f'cd "${{TMPDIR:-/tmp}}" && touch {mark} && i=0 && while [ $i -lt {depth} ]; do '
            "mkdir d && cd d || exit 9; i=$((i+1)); done; echo x > f"
        )
        r = sh(c, ws, script, timeout=300)
        assert r.returncode == 0, r.stderr.decode()[-500:]
        assert not list(Path("/tmp").glob(f"corral-scratch-*/{mark}"))  # (this run's scratch)
        log = c.run(["log", "--json", "-n", "1"], cwd=ws).stdout.decode()
        assert '"exit": 0' in log and "mkdir d" in log, log[-500:]


def test_symlink_out_of_workspace_is_read_only(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    outside = c.base / "outside"
    outside.mkdir()
    (outside / "target.txt").write_text("original\n")
    c.chown(outside)
    os.symlink(outside, ws / "link_dir")
    os.symlink(outside / "target.txt", ws / "link_file")
    os.symlink(ws / "real.txt", ws / "link_inside")
    c.chown(ws)
    r = sh(
        c,
        ws,
        """
        echo evil > link_dir/new.txt 2>/dev/null && echo dir=WROTE || echo dir=denied
        echo evil > link_file 2>/dev/null && echo file=WROTE || echo file=denied
        echo good > link_inside && echo inside=ok
        cat link_file
    """,
    )
    out = r.stdout.decode()
    assert "dir=denied" in out and "file=denied" in out and "inside=ok" in out, out
    if sees_host_root(c):
        assert "original" in out  # reading through the link is allowed
    else:  # containers: the link's target is not in the image at all
        assert "original" not in out
    assert (outside / "target.txt").read_text() == "original\n"
    assert not (outside / "new.txt").exists()
    assert (ws / "real.txt").read_text() == "good\n"


def test_hard_link_to_outside_file_is_refused(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    outside = c.base / "outside"
    outside.mkdir()
    (outside / "target.txt").write_text("original\n")
    (ws / "a.txt").write_text("a\n")
    c.chown(outside, ws)
    r = sh(
        c,
        ws,
        f"""
        ln {outside}/target.txt hl.txt 2>/dev/null && echo out=LINKED || echo out=denied
        ln a.txt b.txt && echo in=ok
    """,
    )
    out = r.stdout.decode()
    assert "out=denied" in out and "in=ok" in out, out
    assert not (ws / "hl.txt").exists()
    assert (ws / "b.txt").read_text() == "a\n"
    assert (outside / "target.txt").read_text() == "original\n"


def test_default_secrets_are_unreadable(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    for rel in SECRET_FILES:
        p = c.home / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"CANARY-{rel}\n")
    (c.home / "notes.txt").write_text("public-notes\n")
    (c.home / ".config" / "app.conf").write_text("public-config\n")
    c.chown(c.home)
    # the real home's own paths: $HOME inside is the home layer (tests/integration/test_home.py)
    home = c.home
    script = "; ".join(f"cat {home}/{rel} 2>&1" for rel in SECRET_FILES)
    script += f"; echo LS:$(ls -A {home}/.ssh {home}/.aws 2>/dev/null):LS"
    script += f"; cat {home}/notes.txt {home}/.config/app.conf"
    r = c.sh(ws, script)
    out = r.stdout.decode()
    assert "CANARY" not in out, out
    if c.has("mounts"):
        assert "LS::LS" in out  # not even the names of keys
    else:  # Landlock cannot withhold listing (see corral.landlock): names, no contents
        assert "Permission denied" in out, out
    if sees_host_root(c):
        assert "public-notes" in out and "public-config" in out  # allow twin
    else:  # containers: the host home is absent, not masked; the allow twin is the workspace
        assert "public-notes" not in out
        (ws / "notes.txt").write_text("ws-notes\n")
        c.chown(ws / "notes.txt")
        assert b"ws-notes" in c.sh(ws, "cat notes.txt").stdout


def test_a_masked_secret_in_the_home_snapshot_cannot_be_opened_up(
    tsandbox: tuple[Corral, Path],
) -> None:
    """The home is snapshotted (some default secrets are missing); a secret in it
    is an empty mode-000 entry: the command can neither chmod, replace nor remove
    it.  Twin: a public sibling in the same snapshot reads fine."""
    c, ws = tsandbox
    if not (c.has("mounts") and sees_host_root(c)):
        pytest.skip(f"{c.tier}: no home snapshot (the host home is not mounted)")
    (c.home / ".ssh").mkdir(exist_ok=True)
    (c.home / ".ssh" / "id_rsa").write_text("CANARY-ssh\n")
    (c.home / ".netrc").write_text("CANARY-netrc\n")
    (c.home / "notes.txt").write_text("public-notes\n")
    c.chown(c.home)
    h = c.home
    r = c.sh(
        ws,
        f"chmod 755 {h}/.ssh || echo chmod-dir=refused; "
        f"chmod 644 {h}/.netrc || echo chmod-file=refused; "
        f"rmdir {h}/.ssh || echo rmdir=refused; "
        f"echo x > {h}/.netrc || echo write=refused; "
        f"mv {h}/.netrc {h}/n2 || echo mv=refused; "
        f"cat {h}/.netrc {h}/.ssh/id_rsa; ls -A {h}/.ssh; cat {h}/notes.txt",
    )
    out = r.stdout.decode()
    assert "CANARY" not in out, r
    for what in ("chmod-dir", "chmod-file", "rmdir", "write", "mv"):
        assert f"{what}=refused" in out, r
    assert "public-notes" in out, r  # twin
    assert (c.home / ".netrc").read_text() == "CANARY-netrc\n"  # the host's copy untouched


def test_a_masked_directory_outside_a_snapshot_cannot_be_opened_up(
    tsandbox: tuple[Corral, Path],
) -> None:
    """A secret directory in the workspace (no snapshot there: the workspace is
    writable) is masked by an empty mode-000 mount of its own: the command, which
    owns it, can neither chmod it open nor fill it.  Twin: a sibling directory
    takes the same chmod and a file."""
    c, ws = tsandbox
    (ws / "vault").mkdir()
    (ws / "vault" / "key").write_text("CANARY-vault\n")
    (ws / "open").mkdir()
    c.chown(ws)
    r = c.sh(
        ws,
        "chmod 755 vault 2>/dev/null && echo chmod=DONE || echo chmod=refused; "
        "echo x > vault/new 2>/dev/null && echo write=DONE || echo write=refused; "
        "cat vault/key 2>/dev/null; "
        "echo x > open/new && echo twin=ok; chmod 700 open && echo chmod-twin=ok",
        "--read-deny",
        str(ws / "vault") + "/",
    )
    out = r.stdout.decode()
    assert "CANARY" not in out, r  # (the container engines' tmpfs copies what is under it)
    assert "twin=ok" in out, r
    assert (ws / "vault" / "key").read_text() == "CANARY-vault\n"
    assert "chmod-twin=ok" in out, r
    if c.tier is None or c.tier.id != "gvisor":  # (gVisor's read-only tmpfs takes a chmod)
        assert "chmod=refused" in out, r  # (landlock: corral's supervisor withholds secrets)
    if not c.has("mounts"):
        return  # landlock withholds reading only: writing there is documented
    assert "write=refused" in out, r
    assert not (ws / "vault" / "new").exists()


def test_secret_created_after_launch_stays_hidden(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    (c.home / "notes.txt").write_text("public-notes\n")
    c.chown(c.home)
    proc = c.popen(
        [
            "run",
            "-q",
            "--",
            "sh",
            "-c",
            f"cat {c.home}/notes.txt; while [ ! -e ready ]; do sleep 0.05; done; "
            f"cat {c.home}/.aws/credentials {c.home}/.ssh/id_rsa 2>&1; ls {c.home}; echo done",
        ],
        cwd=ws,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    time.sleep(0.5)  # the sandbox is up and reading notes
    (c.home / ".aws").mkdir()
    (c.home / ".aws" / "credentials").write_text("CANARY-late-aws\n")
    (c.home / ".ssh").mkdir()
    (c.home / ".ssh" / "id_rsa").write_text("CANARY-late-ssh\n")
    (ws / "ready").write_text("")
    out, err = proc.communicate(timeout=30)
    text = out.decode()
    assert proc.returncode == 0, err
    assert "done" in text  # allow twin
    assert ("public-notes" in text) == sees_host_root(c)  # containers: no host home at all
    assert "CANARY" not in text, text


def test_nested_repo_hooks_and_config_are_read_only(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    for repo in (ws, ws / "vendor" / "lib"):
        (repo / ".git" / "hooks").mkdir(parents=True)
        (repo / ".git" / "config").write_text("[core]\n")
        (repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (ws / ".vscode").mkdir()
    (ws / ".vscode" / "settings.json").write_text("{}\n")
    (ws / "corral.toml").write_text("[limits]\ntimeout = 30\n")
    c.chown(ws)
    r = sh(
        c,
        ws,
        """
        for f in .git/hooks/pre-commit vendor/lib/.git/hooks/post-checkout .vscode/tasks.json; do
            echo 'touch /pwned' > $f 2>/dev/null && echo "$f=WROTE" || echo "$f=denied"
        done
        for f in .git/config vendor/lib/.git/config corral.toml; do
            echo '[evil]' >> $f 2>/dev/null && echo "$f=WROTE" || echo "$f=denied"
        done
        cat .git/config corral.toml >/dev/null && echo read=ok
        echo ref > .git/HEAD && echo githead=ok
        echo code > vendor/lib/main.c && echo code=ok
    """,
    )
    out = r.stdout.decode()
    if c.has("mounts"):
        assert "WROTE" not in out, out
    else:  # written during the run, put back after it and reported
        for path in (".git/hooks", "vendor/lib/.git/config", "corral.toml"):
            assert f"{ws / path} (write-deny) was changed" in r.stderr.decode(), r.stderr
    assert "read=ok" in out and "githead=ok" in out and "code=ok" in out, out
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()
    assert not (ws / "vendor" / "lib" / ".git" / "hooks" / "post-checkout").exists()
    assert not (ws / ".vscode" / "tasks.json").exists()
    assert (ws / "vendor" / "lib" / ".git" / "config").read_text() == "[core]\n"
    assert (ws / ".git" / "config").read_text() == "[core]\n"
    assert (ws / "corral.toml").read_text() == "[limits]\ntimeout = 30\n"
    assert (ws / "vendor" / "lib" / "main.c").read_text() == "code\n"


def test_what_the_real_homes_dotfile_links_lead_to_is_write_deny(
    tsandbox: tuple[Corral, Path],
) -> None:
    """The finding: a dotfiles repository as the workspace, linked into the real home
    (GNU stow: ``~/.gitconfig -> ../ws/git/.gitconfig``; ``~/.config/nvim`` to a
    directory of it; ``~/.bashrc`` to a file it does not have yet).  A run set
    ``core.fsmonitor`` there and the user's next ``git status`` anywhere ran it.
    Now those targets cannot be changed (mount tiers: the write fails; landlock:
    put back after the run and reported), a new file in the linked directory is
    refused too, and the missing one is quarantined.  Twins in the same run: the
    file beside ``.gitconfig`` and the workspace's other files are written, and
    links out of the workspace, to it or to a directory holding it change nothing."""
    c, ws = tsandbox
    gitconfig = "[user]\n\tname = V\n"
    (ws / "git").mkdir()
    (ws / "git" / ".gitconfig").write_text(gitconfig)
    (ws / "git" / "README").write_text("mine\n")
    (ws / "nvim").mkdir()
    (ws / "nvim" / "init.lua").write_text("-- mine\n")
    c.chown(ws)
    other = c.base / "other"
    other.mkdir()
    (other / "vimrc").write_text("set nu\n")
    (c.home / ".gitconfig").symlink_to("../ws/git/.gitconfig")
    (c.home / ".bashrc").symlink_to("../ws/bashrc")
    (c.home / ".config").mkdir()
    (c.home / ".config" / "nvim").symlink_to(ws / "nvim")
    (c.home / ".vimrc").symlink_to(other / "vimrc")  # read-only already
    (c.home / ".projects").symlink_to(c.base)  # holds the workspace: a note
    (c.home / ".config" / "proj").symlink_to(ws)  # the workspace itself: a note
    (c.home / ".ssh").mkdir()  # stow links ssh's config file by file
    (c.home / ".ssh" / "config").symlink_to(ws / "ssh_config")
    (ws / "ssh_config").write_text("Host *\n")
    c.chown(ws)
    c.chown(c.home)
    r = sh(
        c,
        ws,
        """
        printf '[core]\\n\\tfsmonitor = "touch /pwned; false"\\n' >> git/.gitconfig 2>/dev/null \\
            && echo gitconfig=WROTE || echo gitconfig=denied
        echo 'os.execute("touch /pwned")' >> nvim/init.lua 2>/dev/null \\
            && echo init=WROTE || echo init=denied
        echo 'os.execute("touch /pwned")' > nvim/plugin.lua 2>/dev/null \\
            && echo plugin=WROTE || echo plugin=denied
        echo 'ProxyCommand touch /pwned' >> ssh_config 2>/dev/null \\
            && echo ssh=WROTE || echo ssh=denied
        echo 'touch /pwned' > bashrc && echo bashrc=made
        echo more >> git/README && echo sibling=ok
        echo code > main.c && echo code=ok
    """,
    )
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == 0, err
    if c.has("mounts"):
        assert "WROTE" not in out and out.count("=denied") == 4, out
    else:  # written during the run, put back after it and reported
        for path in (ws / "git" / ".gitconfig", ws / "nvim"):
            assert f"{path} (write-deny) was changed" in err, err
        # (what a link in ~/.ssh leads to is the secret itself: read-deny, put back too)
        assert f"{ws / 'ssh_config'} (read-deny) was changed" in err, err
    assert (ws / "git" / ".gitconfig").read_text() == gitconfig
    assert sorted(os.listdir(ws / "nvim")) == ["init.lua"]
    assert (ws / "nvim" / "init.lua").read_text() == "-- mine\n"
    assert (ws / "ssh_config").read_text() == "Host *\n"
    assert "bashrc=made" in out and not (ws / "bashrc").exists(), out
    assert f"{ws / 'bashrc'} (write-deny) was created" in err, err
    # the twins
    assert "sibling=ok" in out and "code=ok" in out, out
    assert (ws / "git" / "README").read_text() == "mine\nmore\n"
    assert (ws / "main.c").read_text() == "code\n"
    assert (other / "vimrc").read_text() == "set nu\n"


def _host_git_status(repo: Path, home: Path) -> None:
    """The host's real git in ``repo`` (HOME: ``home``), as the user runs it later."""
    done = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", str(repo), "status", "--short"],
        capture_output=True,
        env={**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")},
    )
    assert done.returncode == 0, done.stderr


def test_the_git_config_a_repository_includes_is_write_deny(
    tsandbox: tuple[Corral, Path],
) -> None:
    """The finding: ``.git/config`` includes ``../.gitconfig`` (the usual way to share
    a repository's config), an ordinary file of the work tree; the run set
    ``core.fsmonitor`` there and the host's next ``git status`` ran it.  Now it
    cannot be changed (mount tiers: the write fails; landlock: put back after the
    run and reported), nor can the file it includes in turn, and one it names but
    which is missing is quarantined; the host's git then runs nothing.  Twin: a
    file beside them is written."""
    c, ws = tsandbox
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    with open(ws / ".git" / "config", "a") as config:  # git config include.path ../.gitconfig
        config.write("[include]\n\tpath = ../.gitconfig\n")
    shared = "[include]\n\tpath = team.cfg\n\tpath = local.cfg\n"
    (ws / ".gitconfig").write_text(shared)
    (ws / "team.cfg").write_text("[alias]\n\tst = status\n")
    c.chown(ws)
    r = sh(
        c,
        ws,
        f"""
        printf '[core]\\n\\tfsmonitor = "touch {ws}/fsmonitor-ran; false"\\n' > fsm
        cat fsm >> .gitconfig 2>/dev/null && echo gitconfig=WROTE || echo gitconfig=denied
        cat fsm >> team.cfg 2>/dev/null && echo team=WROTE || echo team=denied
        cat fsm > local.cfg && echo local=made
        echo more > notes.txt && echo sibling=ok
    """,
    )
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == 0, err
    if c.has("mounts"):
        assert "gitconfig=denied" in out and "team=denied" in out, out
    else:  # written during the run, put back after it and reported
        for name in (".gitconfig", "team.cfg"):
            assert f"{ws / name} (write-deny) was changed" in err, err
    assert (ws / ".gitconfig").read_text() == shared
    assert (ws / "team.cfg").read_text() == "[alias]\n\tst = status\n"
    assert "local=made" in out and not (ws / "local.cfg").exists(), out
    assert str(ws / "local.cfg") in err, err
    _host_git_status(ws, c.home)
    assert not (ws / "fsmonitor-ran").exists()
    # the twin
    assert "sibling=ok" in out and (ws / "notes.txt").read_text() == "more\n"


def test_what_the_real_homes_git_config_includes_is_write_deny(
    tsandbox: tuple[Corral, Path],
) -> None:
    """The finding: a dotfiles workspace whose file the real ``~/.gitconfig`` names
    in ``[include] path`` (and ``~/.config/git/config`` in ``includeIf``), not a
    link; and a systemd user unit linked into it (``systemctl --user link``): the
    run set ``core.fsmonitor`` and an ``ExecStartPost`` there, which the host ran
    later.  Now they cannot be changed (landlock: put back and reported), and the
    host's ``git status`` in another repository runs nothing.  Twin: the file
    beside them is written."""
    c, ws = tsandbox
    common = "[user]\n\tname = me\n"
    unit = "[Service]\nExecStart=/bin/true\n"
    (ws / "gitconfig-common").write_text(common)
    (ws / "gitconfig-xdg").write_text(common)
    (ws / "my.service").write_text(unit)
    (ws / "README").write_text("mine\n")
    (c.home / ".gitconfig").write_text(f"[include]\n\tpath = {ws}/gitconfig-common\n")
    (c.home / ".config" / "git").mkdir(parents=True)
    (c.home / ".config" / "git" / "config").write_text(
        f'[includeIf "gitdir:/"]\n\tpath = {ws}/gitconfig-xdg\n'
    )
    (c.home / ".config" / "systemd" / "user").mkdir(parents=True)
    (c.home / ".config" / "systemd" / "user" / "my.service").symlink_to(ws / "my.service")
    c.chown(ws)
    c.chown(c.home)
    r = sh(
        c,
        ws,
        f"""
        printf '[core]\\n\\tfsmonitor = "touch {ws}/fsmonitor-ran; false"\\n' > fsm
        cat fsm >> gitconfig-common 2>/dev/null && echo common=WROTE || echo common=denied
        cat fsm >> gitconfig-xdg 2>/dev/null && echo xdg=WROTE || echo xdg=denied
        echo 'ExecStartPost=/bin/sh -c "touch /pwned"' >> my.service 2>/dev/null \\
            && echo unit=WROTE || echo unit=denied
        echo more >> README && echo sibling=ok
    """,
    )
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == 0, err
    if c.has("mounts"):
        assert "WROTE" not in out and out.count("=denied") == 3, out
    else:  # written during the run, put back after it and reported
        for name in ("gitconfig-common", "gitconfig-xdg", "my.service"):
            assert f"{ws / name} (write-deny) was changed" in err, err
    assert (ws / "gitconfig-common").read_text() == common
    assert (ws / "gitconfig-xdg").read_text() == common
    assert (ws / "my.service").read_text() == unit
    repo = c.base / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    _host_git_status(repo, c.home)
    assert not (ws / "fsmonitor-ran").exists()
    # the twin
    assert "sibling=ok" in out and (ws / "README").read_text() == "mine\nmore\n"


def test_missing_write_deny_path_is_quarantined(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    r = c.sh(ws, "mkdir .vscode && echo '{}' > .vscode/tasks.json && mkdir src && echo x > src/a")
    assert r.returncode == 0, r.stderr
    assert not (ws / ".vscode").exists()
    assert (ws / "src" / "a").read_text() == "x\n"  # allow twin
    assert b"corral: denied write:" in r.stderr and b".vscode" in r.stderr
    moved = list((c.state / "corral" / "quarantine").rglob("tasks.json"))
    assert len(moved) == 1


def test_protected_names_in_subdirectories_are_write_deny(
    tsandbox: tuple[Corral, Path],
) -> None:
    """A monorepo: an editor or agent tool started in ``pkg/a`` runs the tasks, hooks
    and MCP servers ``pkg/a/.vscode`` and ``pkg/a/.claude`` set up, outside any
    sandbox.  Only the workspace root's were protected; now every directory the
    walk reaches: existing ones cannot be changed (mount tiers: the write fails;
    landlock: restored after the run and reported).  New ones in a subdirectory
    stay (a clone or a project template brings its own), but a new corral.toml
    there is quarantined.  Twins: the code and docs beside them are written."""
    c, ws = tsandbox
    a, b = ws / "pkg" / "a", ws / "pkg" / "b"
    tasks = '{"tasks": []}\n'
    (a / ".vscode").mkdir(parents=True)
    (a / ".vscode" / "tasks.json").write_text(tasks)
    (a / ".claude").mkdir()
    (a / ".claude" / "settings.json").write_text("{}\n")
    (a / "src").mkdir()
    b.mkdir()
    c.chown(ws)
    r = sh(
        c,
        ws,
        """
        for f in pkg/a/.vscode/tasks.json pkg/a/.claude/settings.json; do
            echo '{"hooks": "touch /pwned"}' > $f 2>/dev/null && echo "$f=WROTE" || echo "$f=denied"
        done
        echo '{"mcpServers": {"x": {"command": "sh"}}}' > pkg/b/.mcp.json && echo mcp=made
        mkdir pkg/b/.cursor && echo '{}' > pkg/b/.cursor/mcp.json && echo cursor=made
        echo '[filesystem]' > pkg/b/corral.toml && echo policy=made
        echo code > pkg/a/src/x.py && echo code=ok
        echo docs > pkg/b/README.md && echo docs=ok
    """,
    )
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == 0, err
    if c.has("mounts"):
        assert "WROTE" not in out and out.count("=denied") == 2, out
    else:  # written during the run, put back after it and reported
        for path in (a / ".vscode", a / ".claude"):
            assert f"{path} (write-deny) was changed" in err, err
    assert (a / ".vscode" / "tasks.json").read_text() == tasks
    assert (a / ".claude" / "settings.json").read_text() == "{}\n"
    assert "mcp=made" in out and "cursor=made" in out and "policy=made" in out, out
    assert (b / ".mcp.json").exists() and (b / ".cursor" / "mcp.json").exists()
    assert not (b / "corral.toml").exists() and f"{b / 'corral.toml'}" in err, err
    # the twins
    assert "code=ok" in out and "docs=ok" in out, out
    assert (a / "src" / "x.py").read_text() == "code\n"
    assert (b / "README.md").read_text() == "docs\n"


REPO_SKELETON = """
mkdir -p {0}/.git/hooks {0}/.git/objects {0}/.git/refs/heads
echo 'ref: refs/heads/main' > {0}/.git/HEAD
echo '#!/bin/sh' > {0}/.git/hooks/pre-commit.sample
"""


def test_a_repository_made_in_the_run_cannot_run_code_on_the_host(
    tsandbox: tuple[Corral, Path],
) -> None:
    """A repository the command makes (no git needed inside: the files git reads)
    keeps no hook and no config key that runs code; the host's real git then
    commits in it and nothing of the sandbox's runs.  Twin: a repository with
    the config a clone writes keeps it, and the host's git uses its remote."""
    c, ws = tsandbox
    script = (
        REPO_SKELETON.format("evil")
        + REPO_SKELETON.format("good")
        + f"""
    printf '#!/bin/sh\\ntouch {ws}/hook-ran\\n' > evil/.git/hooks/pre-commit
    chmod +x evil/.git/hooks/pre-commit
    printf '[core]\\n\\tbare = false\\n\\tfsmonitor = "touch {ws}/fsmonitor-ran"\\n' \
        > evil/.git/config
    printf '[core]\\n\\tbare = false\\n[remote "origin"]\\n\\turl = https://127.0.0.1/x.git\\n' \
        > good/.git/config
    """
    )
    r = c.sh(ws, script)
    assert r.returncode == 0, r.stderr
    err = r.stderr.decode()
    assert "evil/.git/hooks/pre-commit (a git hook, in a repository made during the run)" in err
    assert "evil/.git/config (git config sets core.fsmonitor" in err
    assert "good/" not in err
    assert sorted(p.name for p in (ws / "evil" / ".git" / "hooks").iterdir()) == [
        "pre-commit.sample"
    ]
    assert not (ws / "evil" / ".git" / "config").exists()
    git = ["git", "-c", "safe.directory=*", "-c", "user.name=t", "-c", "user.email=t@127.0.0.1"]
    done = subprocess.run(
        [*git, "-C", str(ws / "evil"), "commit", "-q", "--allow-empty", "-m", "x"],
        capture_output=True,
    )
    assert done.returncode == 0, done.stderr
    assert not (ws / "hook-ran").exists() and not (ws / "fsmonitor-ran").exists()
    remote = subprocess.run(
        [*git, "-C", str(ws / "good"), "remote", "get-url", "origin"], capture_output=True
    )
    assert remote.stdout == b"https://127.0.0.1/x.git\n", remote.stderr


def test_a_writable_paths_repository_is_protected_as_the_workspaces(
    tsandbox: tuple[Corral, Path],
) -> None:
    """``[filesystem] writable`` names a repository outside the workspace: it is a
    workspace root too.  Its git config and hooks cannot be changed (mount tiers:
    the write fails; landlock: restored after the run and reported), a
    ``corral.toml`` or ``.envrc`` made at its top and the hook and fsmonitor of
    a repository made in it are quarantined and reported; the host's git then
    commits there and nothing of the sandbox's runs.  Only the workspace was
    walked before: the run planted both and corral said nothing.  Twins: an
    ordinary file in the writable path and in the workspace are written."""
    c, ws = tsandbox
    extra = c.base / "extra"
    for sub in ("hooks", "objects", "refs/heads"):
        (extra / ".git" / sub).mkdir(parents=True)
    (extra / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (extra / ".git" / "config").write_text("[core]\n\tbare = false\n")
    (ws / "corral.toml").write_text(f'[filesystem]\nwritable = ["{extra}"]\n')
    c.chown(extra, ws)
    script = (
        REPO_SKELETON.format(f"{extra}/made")
        + f"""
    cd {extra}
    printf '#!/bin/sh\\ntouch {extra}/hook-ran\\n' > .git/hooks/pre-commit 2>/dev/null \
        && echo hook=WROTE || echo hook=denied
    chmod +x .git/hooks/pre-commit 2>/dev/null
    printf '[core]\\n\\tfsmonitor = "touch {extra}/fsmonitor-ran"\\n' >> .git/config \
        2>/dev/null && echo config=WROTE || echo config=denied
    echo '[filesystem]' > corral.toml && echo policy=made
    echo 'touch {extra}/envrc-ran' > .envrc && echo envrc=made
    printf '#!/bin/sh\\ntouch {extra}/made-hook-ran\\n' > made/.git/hooks/pre-commit
    chmod +x made/.git/hooks/pre-commit
    printf '[core]\\n\\tfsmonitor = "touch {extra}/made-ran"\\n' > made/.git/config
    echo notes > notes.txt && echo extra=ok
    echo notes > {ws}/notes.txt && echo ws=ok
    """
    )
    r = c.sh(ws, script)
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == 0, err
    if c.has("mounts"):
        assert "hook=denied" in out and "config=denied" in out, out
    else:  # written during the run, put back after it and reported
        for path in (".git/hooks", ".git/config"):
            assert f"{extra / path} (write-deny) was changed" in err, err
    assert not (extra / ".git" / "hooks" / "pre-commit").exists()
    assert (extra / ".git" / "config").read_text() == "[core]\n\tbare = false\n"
    assert "policy=made" in out and "envrc=made" in out, out
    for made in ("corral.toml", ".envrc"):
        assert not (extra / made).exists() and str(extra / made) in err, err
    assert "made/.git/hooks/pre-commit (a git hook, in a repository made during the run)" in err
    assert "made/.git/config (git config sets core.fsmonitor" in err, err
    assert not (extra / "made" / ".git" / "hooks" / "pre-commit").exists()
    assert not (extra / "made" / ".git" / "config").exists()
    git = ["git", "-c", "safe.directory=*", "-c", "user.name=t", "-c", "user.email=t@127.0.0.1"]
    for repo in (extra, extra / "made"):
        done = subprocess.run(
            [*git, "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "x"],
            capture_output=True,
        )
        assert done.returncode == 0, done.stderr
    ran = [p.name for p in extra.iterdir() if p.name.endswith("-ran")]
    assert ran == [], ran
    # the twins
    assert "extra=ok" in out and "ws=ok" in out, out
    assert (extra / "notes.txt").read_text() == "notes\n"
    assert (ws / "notes.txt").read_text() == "notes\n"


def test_a_writable_root_inside_another_is_protected_at_its_top(
    tsandbox: tuple[Corral, Path],
) -> None:
    """``writable = [P, P/proj]``: the finding was that ``P/proj``, walked from
    ``P``, lost the protections of a root's top, though ``writable = [P/proj]``
    alone had them: the ``.mcp.json`` and ``.envrc`` the run made there stayed.
    Now they are quarantined and reported.  Twin: an ordinary file beside them is
    written."""
    c, ws = tsandbox
    outer = c.base / "P"
    (outer / "proj").mkdir(parents=True)
    (ws / "corral.toml").write_text(f'[filesystem]\nwritable = ["{outer}", "{outer}/proj"]\n')
    c.chown(outer, ws)
    r = sh(
        c,
        ws,
        f"""
        cd {outer}/proj
        echo '{{}}' > .mcp.json && echo 'touch /pwned' > .envrc && echo made=ok
        echo code > main.c && echo code=ok
    """,
    )
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == 0, err
    assert "made=ok" in out, out
    for name in (".mcp.json", ".envrc"):
        assert not (outer / "proj" / name).exists(), name
        assert str(outer / "proj" / name) in err, err
    # the twin
    assert "code=ok" in out and (outer / "proj" / "main.c").read_text() == "code\n"


def test_fifos_where_git_keeps_files_do_not_hold_corral(tsandbox: tuple[Corral, Path]) -> None:
    """FIFOs made where git keeps files (a .git, a config) would hold corral's read
    for ever, after this run and at the launch of every later one.  Twin: the
    next run in the workspace starts and its command runs."""
    c, ws = tsandbox
    r = c.run(
        ["run", "-q", "--", "sh", "-c", "mkdir -p n/.git m && mkfifo n/.git/config m/.git"],
        cwd=ws,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    if not is_gvisor(c):  # (gVisor keeps a FIFO made in a bound directory to itself)
        assert b"n/.git/config (a git config that is not a plain text" in r.stderr, r.stderr
    (ws / "p").mkdir()
    os.mkfifo(ws / "p" / ".git")  # one a run left (or the user made): read at launch
    c.chown(ws)
    again = c.run(["run", "-q", "--", "echo", "next=ok"], cwd=ws, timeout=30)
    assert again.stdout == b"next=ok\n", again.stderr


def test_a_fifo_where_corral_protects_a_path_never_holds_a_run(
    tsandbox: tuple[Corral, Path],
) -> None:
    """A FIFO at a write-deny path (.envrc): gVisor's gofer opened it and waited
    for ever, and the stuck container outlived corral.  gVisor now refuses at
    once, naming it; the other tiers keep it protected.  Twin: without the FIFO,
    the same run starts."""
    c, ws = tsandbox
    os.mkfifo(ws / ".envrc")
    c.chown(ws)
    r = c.run(["run", "-q", "--", "sh", "-c", "rm -f .envrc; echo ran"], cwd=ws, timeout=60)
    if is_gvisor(c):
        assert r.returncode == 122, r.stderr
        assert f"{ws}/.envrc (write-deny): it is a FIFO".encode() in r.stderr, r.stderr
        assert b"ran" not in r.stdout
    else:
        assert r.stdout == b"ran\n", r.stderr
    assert stat.S_ISFIFO(os.lstat(ws / ".envrc").st_mode)  # not removed from inside
    os.unlink(ws / ".envrc")
    again = c.run(["run", "-q", "--", "echo", "next=ok"], cwd=ws, timeout=60)
    assert again.stdout == b"next=ok\n", again.stderr


def test_quarantine_never_follows_a_symlink_the_run_made(tsandbox: tuple[Corral, Path]) -> None:
    """A repository known at launch has no hooks directory (quarantined if made).
    The command moves the repository away and puts a symlink to another
    repository outside the workspace in its place: corral moves the symlink, and
    the other repository's own hooks stay.  Twin: a .vscode made in the same run
    is quarantined as usual."""
    c, ws = tsandbox
    other = c.base / "other" / ".git" / "hooks"
    other.mkdir(parents=True)
    (other / "pre-commit").write_text("#!/bin/sh\n")
    (ws / "sub" / ".git").mkdir(parents=True)
    (ws / "sub" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    c.chown(ws, c.base / "other")
    r = c.sh(ws, f"mv sub sub-old && ln -s {c.base / 'other'} sub && mkdir .vscode")
    assert r.returncode == 0, r.stderr
    assert (other / "pre-commit").read_text() == "#!/bin/sh\n"
    assert not os.path.lexists(ws / "sub")
    err = r.stderr.decode()
    assert f"{ws}/sub (a symlink on the way to {ws}/sub/.git/hooks, write-deny)" in err, err
    assert not (ws / ".vscode").exists() and f"{ws}/.vscode (write-deny)" in err, err


def test_workspace_secret_files_are_masked(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    (ws / ".env").write_text("CANARY-dotenv\n")
    (ws / "svc").mkdir()
    (ws / "svc" / ".env.production").write_text("CANARY-prod\n")
    (ws / ".env.example").write_text("EXAMPLE=1\n")
    c.chown(ws)
    r = c.sh(ws, "cat .env svc/.env.production .env.example 2>&1")
    out = r.stdout.decode()
    assert "CANARY" not in out
    assert "EXAMPLE=1" in out
    assert (ws / ".env").read_text() == "CANARY-dotenv\n"  # untouched on the host


def test_a_workspace_secret_renamed_or_linked_never_reaches_a_later_run(
    tsandbox: tuple[Corral, Path],
) -> None:
    """Landlock keeps a ``.env`` unreadable in its run but cannot stop a rename or a
    link: ``mv .env notes.txt`` once left it readable to the next run.  Mount tiers
    refuse that, but a mask moves with a directory renamed above it: ``mv conf
    conf2`` once left ``conf2/keys`` readable to the next run, and let a run swap
    the write-deny ``conf/prod.yaml`` for its own.  Landlock undoes all of it,
    mount tiers move what was carried back.  No later run reads a copy, and each
    protected path is back where it was, with its content."""
    c, ws = tsandbox
    (ws / ".env").write_text("CANARY-dotenv\n")
    (ws / ".env.local").write_text("CANARY-local\n")
    (ws / "private").mkdir()
    (ws / "private" / "key").write_text("CANARY-key\n")
    (ws / "ok.txt").write_text("plain\n")
    (ws / "conf" / "keys").mkdir(parents=True)
    (ws / "conf" / "keys" / "k").write_text("CANARY-nested\n")
    (ws / "conf" / "prod.yaml").write_text("mode: safe\n")
    (ws / "corral.toml").write_text(
        '[filesystem]\nread_deny = ["private", "conf/keys"]\nwrite_deny = ["conf/prod.yaml"]\n'
    )
    c.chown(ws)
    first = c.sh(
        ws,
        """
        mkdir -p hide
        mv .env hide/notes.txt; ln private/key keylink; mv private pub
        echo more >> hide/notes.txt; echo more >> pub/key; echo wiped > .env.local
        mv conf conf2 && mkdir conf && echo "mode: evil" > conf/prod.yaml
        mv ok.txt ok2.txt && ln ok2.txt ok3.txt && echo twins-made
        true
    """,
    )
    assert b"twins-made" in first.stdout, first.stderr
    later = c.sh(
        ws, "cat hide/notes.txt keylink pub/key .env private/key conf2/keys/k ok2.txt ok3.txt 2>&1"
    )
    assert b"CANARY" not in later.stdout, later.stdout
    assert later.stdout.count(b"plain") == 2  # the twins: ordinary files keep new names
    assert (ws / ".env").read_text() == "CANARY-dotenv\n"
    assert (ws / ".env.local").read_text() == "CANARY-local\n"  # rewritten: put back
    assert (ws / "private" / "key").read_text() == "CANARY-key\n"
    assert (ws / "conf" / "keys" / "k").read_text() == "CANARY-nested\n"
    assert (ws / "conf" / "prod.yaml").read_text() == "mode: safe\n"
    holders = {
        str(f.relative_to(ws))
        for f in ws.rglob("*")
        if f.is_file() and not f.is_symlink() and b"CANARY" in f.read_bytes()
    }
    assert holders == {".env", ".env.local", "private/key", "conf/keys/k"}  # and no other
    if c.tier is not None and c.tier.tier == "landlock":  # the undo is said after the run
        err = first.stderr.decode()
        assert "(read-deny) was moved or linked to" in err and "keylink" in err, err


def _uv_env(uv: str, env: Path, wheels: Path, cache: Path, link_mode: str) -> Path:
    """An environment made by real uv from a local wheel; its ``tinypkg/__init__.py``."""
    run = {**os.environ, "UV_CACHE_DIR": str(cache), "UV_OFFLINE": "1", "UV_LINK_MODE": link_mode}
    python = str(env / "bin" / "python")
    venv = [uv, "venv", "-q", "--python", "/usr/bin/python3", str(env)]
    subprocess.run(venv, env=run, check=True)
    install = ["pip", "install", "-q", "--python", python, "--no-index", "--find-links"]
    subprocess.run([uv, *install, str(wheels), "tinypkg"], env=run, check=True)
    (module,) = env.glob("lib/python3*/site-packages/tinypkg/__init__.py")
    return module


def test_a_uv_environment_linked_to_its_cache_stays_unwritten(
    tsandbox: tuple[Corral, Path],
) -> None:
    """uv links every file of a package from its cache (its default on Linux): a
    run that wrote into one once changed the cached copy, and with it every
    environment uv makes from it later, on the host.  Its twin, made with
    UV_LINK_MODE=copy, stays writable; both stay importable."""
    import shutil
    import sys

    from test_tls import tiny_wheel

    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not os.path.exists(uv):
        pytest.skip("uv is not installed: pip install -e '.[dev]' installs it")
    c, ws = tsandbox
    wheels = c.base / "wheels"
    wheels.mkdir()
    tiny_wheel(wheels)
    cache = c.base / "uv-cache"  # beside the workspace: the same filesystem
    linked = _uv_env(uv, ws / ".venv", wheels, cache, "hardlink")
    copied = _uv_env(uv, ws / "venv", wheels, cache, "copy")
    assert os.stat(linked).st_nlink == 2 and os.stat(copied).st_nlink == 1
    (ws / "src").mkdir()  # (landlock: new files go where a directory was at launch)
    c.chown(ws)
    r = c.sh(
        ws,
        """
        for f in .venv/lib/python3*/site-packages/tinypkg/__init__.py; do
            echo "VALUE = 'poisoned'" >> "$f"; echo linked=$?; cat "$f"
        done
        for f in venv/lib/python3*/site-packages/tinypkg/__init__.py; do
            echo "VALUE = 'changed'" >> "$f"; echo copied=$?
        done
        echo new > src/new.txt && echo workspace=ok
    """,
    )
    out = r.stdout.decode()
    assert "linked=0" not in out and "copied=0" in out and "workspace=ok" in out, out
    assert "VALUE = 'tiny'" in out  # still read (and importable)
    cached = [p for p in cache.rglob("__init__.py") if os.stat(p).st_ino == os.stat(linked).st_ino]
    assert cached and cached[0].read_text() == "VALUE = 'tiny'\n"  # the cache is untouched
    assert "changed" in copied.read_text()


def test_a_policy_file_a_run_plants_in_a_subdirectory_is_never_loaded(
    tsandbox: tuple[Corral, Path],
) -> None:
    """``corral run`` started in a directory loads its ``corral.toml``.  Only the
    workspace root's was protected: a run could plant ``sub/corral.toml`` (say,
    ``defaults = false``, unmasking every secret) for a later run started in
    ``sub``, or rewrite one already there.  Now every policy file the walk finds
    is write-deny, and one made during the run is quarantined after it.  The
    twin: the same file written by the user is what a run in ``sub`` loads."""
    c, ws = tsandbox
    planted = '[env]\nset = { PLANTED = "by-the-run" }\n'
    (ws / "sub" / "deep").mkdir(parents=True)
    (ws / "sub" / "deep" / "corral.toml").write_text('[env]\nset = { OWN = "the-users" }\n')
    c.chown(ws)
    first = c.sh(
        ws,
        f"""
        printf '{planted}' > sub/corral.toml && echo planted
        printf '{planted}' >> sub/deep/corral.toml || echo existing=refused
        true
    """,
    )
    assert b"planted" in first.stdout, first.stderr
    assert not (ws / "sub" / "corral.toml").exists()
    assert "PLANTED" not in (ws / "sub" / "deep" / "corral.toml").read_text()
    assert b"a policy file, made during the run" in first.stderr
    later = c.sh(ws / "sub", "echo planted=$PLANTED")
    assert later.stdout.strip() == b"planted=", later.stderr
    (ws / "sub" / "corral.toml").write_text(planted)  # the user's own, from the host
    c.chown(ws / "sub" / "corral.toml")
    own = c.sh(ws / "sub", "echo planted=$PLANTED")
    assert own.stdout.strip() == b"planted=by-the-run", own.stderr
    deep = c.sh(ws / "sub" / "deep", "echo own=$OWN")
    assert deep.stdout.strip() == b"own=the-users", deep.stderr


def test_corral_state_is_hidden(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    (c.state / "other.txt").write_text("public-state\n")
    c.chown(c.state)
    first = c.sh(ws, "echo first-run")
    assert first.returncode == 0
    assert b"first-run" in (c.state / "corral" / "runs.jsonl").read_bytes()
    r = c.sh(ws, f"cat {c.state}/corral/runs.jsonl 2>&1; cat {c.state}/other.txt")
    assert b"first-run" not in r.stdout  # the log of other runs is not readable
    assert (b"public-state" in r.stdout) == sees_host_root(c)  # containers: not there at all


def test_proc_and_dev_are_private(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    r = sh(
        c,
        ws,
        """
        ls /dev | tr '\\n' ' '; echo
        head -c 4 /dev/urandom | wc -c
        cat /dev/sda 2>/dev/null && echo sda=READ || echo sda=denied
        head -c 1 /dev/kvm 2>/dev/null; [ $? -eq 0 ] && echo kvm=OPENED || echo kvm=denied
        echo x > /dev/null && echo null=ok
    """,
    )
    out = r.stdout.decode()
    assert "sda=denied" in out and "kvm=denied" in out and "null=ok" in out, out
    assert "4" in out.splitlines()[1]  # allow twin: /dev/urandom works
    if c.has("own-dev"):
        assert "sda " not in out.splitlines()[0] and "kvm" not in out.splitlines()[0]


def test_concurrent_runs_share_nothing(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    results: list[subprocess.CompletedProcess[bytes]] = []

    def one(i: int) -> None:
        results.append(
            c.sh(
                ws,
                f"t=${{TMPDIR:-/tmp}}; echo {i} > $t/mine; sleep 0.2; cat $t/mine; "
                f"echo {i} > out{i}",
            )
        )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert sorted(int(r.stdout.split()[0]) for r in results) == [0, 1, 2, 3]
    assert all((ws / f"out{i}").exists() for i in range(4))


def test_modes_and_owners_outside_cannot_change(tsandbox: tuple[Corral, Path]) -> None:
    """Read-only means metadata too: a file the caller owns outside the workspace
    keeps its mode and owner (Landlock does not govern chmod: on that tier corral's
    supervisor refuses it outside the writable places, and seccomp refuses chown)."""
    c, ws = tsandbox
    target = c.home / "notes.txt"
    target.write_text("mine\n")
    os.chmod(target, 0o600)
    c.chown(c.home)
    r = sh(
        c,
        ws,
        f"""
        chmod 666 {target} 2>/dev/null && echo chmod=CHANGED || echo chmod=denied
        chown {c.uid} {target} 2>/dev/null && echo chown=CHANGED || echo chown=denied
        cat {target} && echo inside > mine.txt && echo write=ok
    """,
    )
    out = r.stdout.decode()
    assert "chmod=denied" in out and "chown=denied" in out, out
    if sees_host_root(c):
        assert "mine" in out and "write=ok" in out, out  # allow twins: reading, workspace writes
    else:  # containers: the host home is absent (not only read-only); the workspace works
        assert "mine" not in out
        assert c.sh(ws, "echo inside > mine.txt && echo write=ok").stdout == b"write=ok\n"
    assert os.stat(target).st_mode & 0o777 == 0o600


def test_a_writable_home_is_refused_like_a_workspace_there(tsandbox: tuple[Corral, Path]) -> None:
    """`--writable ~` let a run plant files that run later outside the sandbox
    (~/.aws/config's credential_process, a systemd unit), though the home is
    refused as a workspace (found by attacking corral): exit 2, one line, and
    nothing planted.  The twin: a writable directory elsewhere works."""
    c, ws = tsandbox
    for refused in (c.home, c.home / ".config"):
        r = sh(c, ws, f"echo planted > {c.home}/.planted", "--writable", str(refused))
        assert r.returncode == 2 and b"filesystem.writable" in r.stderr, r.stderr
        assert not (c.home / ".planted").exists()
    data = c.base / "data"
    data.mkdir()
    c.chown(data)
    r = sh(c, ws, f"echo ok > {data}/out", "--writable", str(data))
    assert r.returncode == 0 and (data / "out").read_text() == "ok\n", r.stderr


def test_a_pattern_where_corral_takes_paths_is_refused(tsandbox: tuple[Corral, Path]) -> None:
    """read_deny = ["*.pem"] was taken as a file named *.pem: every .pem stayed
    readable and nothing was said (found by attacking corral).  Now exit 2 with
    the key named; the twin: the file named by its path is denied."""
    c, ws = tsandbox
    (ws / "key.pem").write_text("PRIVATE")
    c.chown(ws / "key.pem")
    for flag in ("--read-deny", "--write-deny"):
        r = sh(c, ws, "cat key.pem", flag, "*.pem")
        assert r.returncode == 2 and b"is a pattern, and corral takes paths" in r.stderr
    r = sh(c, ws, "cat key.pem || echo denied", "--read-deny", str(ws / "key.pem"))
    assert b"PRIVATE" not in r.stdout and b"denied" in r.stdout, r.stderr


def test_a_relative_flag_is_the_shells_directory_not_the_workspace(
    tsandbox: tuple[Corral, Path],
) -> None:
    """`cd sub; corral run --workspace .. --read-deny ./secret.txt` denied
    ../secret.txt, and sub/secret.txt stayed readable (found by attacking
    corral).  The twin: without --workspace, the same spelling as before."""
    c, ws = tsandbox
    sub = ws / "sub"
    sub.mkdir()
    (sub / "secret.txt").write_text("SUB-SECRET")
    c.chown(sub, sub / "secret.txt")
    for extra in (["--workspace", str(ws)], []):
        r = c.run(
            ["run", "-q", *extra, "--read-deny", "./secret.txt", "--", "sh", "-c",
             "cat secret.txt || echo denied"],
            cwd=sub,
        )  # fmt: skip
        assert b"SUB-SECRET" not in r.stdout and b"denied" in r.stdout, (extra, r.stderr)
