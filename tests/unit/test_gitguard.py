"""corral.gitguard: what in a repository made during a run would run code on the
host, found on real directories (no sandbox: the walk and the decisions)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from corral import defaults, fsplan, gitguard
from corral import launch as launch_mod

INIT_CONFIG = """[core]
\trepositoryformatversion = 0
\tfilemode = true
\tbare = false
\tlogallrefupdates = true
"""
CLONE_CONFIG = (
    INIT_CONFIG
    + """[remote "origin"]
\turl = https://127.0.0.1/x.git
\tfetch = +refs/heads/*:refs/remotes/origin/*
[branch "main"]
\tremote = origin
\tmerge = refs/heads/main
[user]
\tname = agent
\temail = agent@127.0.0.1
"""
)


@pytest.mark.parametrize("text", [INIT_CONFIG, CLONE_CONFIG, "", "# nothing\n; at all\n"])
def test_configs_git_writes_itself_are_safe(text: str) -> None:
    assert gitguard.unsafe_config_key(text) is None


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[core]\n\tfsmonitor = touch x\n", "core.fsmonitor"),
        ("[Core]\n\tFsMonitor = touch x\n", "core.fsmonitor"),
        ("[core]\n\tpager = sh -c x\n", "core.pager"),
        ("[core]\n\thooksPath = h\n", "core.hookspath"),
        ('[alias]\n\tst = "!sh -c x"\n', "alias.st"),
        ('[remote "o"]\n\turl = x\n\tuploadpack = sh -c x\n', "remote.*.uploadpack"),
        ("[remote.o]\n\treceivepack = x\n", "remote.*.receivepack"),
        ('[filter "lfs"]\n\tclean = x\n', "filter.*.clean"),
        ("[include]\n\tpath = ../elsewhere\n", "include.path"),
        ("[core]\n\tsshCommand = x\n", "core.sshcommand"),
        ("bare = true\n", ".bare"),  # a key before any section
        ("[core]\n\tbare = false \\\n\t\tmore\n", "a continued value"),
    ],
)
def test_any_other_key_is_unsafe(text: str, key: str) -> None:
    assert gitguard.unsafe_config_key(text) == key


def test_a_key_on_its_section_line_is_read_as_git_reads_it() -> None:
    assert gitguard.unsafe_config_key("[core] fsmonitor = x\n") == "core.fsmonitor"
    assert gitguard.unsafe_config_key("[core\n\tbare = true\n") == "[core"  # unclosed


def test_one_reader_for_git_config() -> None:
    """What the launch walk (core.hooksPath) and the look after the run both read."""
    text = '[Core] hooksPath = "h" # moved\n[remote "o"]\n\tURL = x\n[init]\ntemplateDir=~/t\n'
    assert list(fsplan.git_config(text)) == [
        ("core", "hookspath", "h"),
        ("remote.*", "url", "x"),
        ("init", "templatedir", "~/t"),
    ]


def make_repo(path: Path, config: str = INIT_CONFIG) -> Path:
    git = path / ".git"
    (git / "hooks").mkdir(parents=True)
    (git / "hooks" / "pre-commit.sample").write_text("#!/bin/sh\n")
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "config").write_text(config)
    return git


def findings(ws: Path, known: fsplan.Repositories) -> list[tuple[str, str]]:
    scan = fsplan.created_repositories(str(ws), known)
    return [] if scan is None else gitguard.findings(str(ws), scan, known.known)


def launch(ws: Path) -> fsplan.Repositories:
    cutoff = fsplan.walk_started()
    return fsplan.Repositories(fsplan.scan_workspace(str(ws)), cutoff)


def test_nothing_new_costs_one_walk_and_finds_nothing(tmp_path: Path) -> None:
    old = make_repo(tmp_path / "old")
    known = launch(tmp_path)
    (old / "hooks" / "pre-commit").write_text("#!/bin/sh\n")  # (read-only in a run)
    assert fsplan.created_repositories(str(tmp_path), known) is None


def test_a_new_repository_loses_its_hooks_and_an_unsafe_config(tmp_path: Path) -> None:
    known = launch(tmp_path)
    evil = make_repo(tmp_path / "evil", "[core]\n\tfsmonitor = touch x\n")
    (evil / "hooks" / "post-checkout").write_text("#!/bin/sh\n")
    good = make_repo(tmp_path / "good", CLONE_CONFIG)
    found = dict(findings(tmp_path, known))
    assert found == {
        str(evil / "hooks" / "post-checkout"): "a git hook",
        str(evil / "config"): "git config sets core.fsmonitor",
    }
    assert str(good / "config") not in found  # the allow twin: a clone's config stays


def test_a_walk_ended_by_its_bound_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run can make enough files to end the walk before its repository: the walk
    comes back incomplete, so corral says what it did not check."""
    known = launch(tmp_path)
    monkeypatch.setattr(defaults, "SCAN_MAX_ENTRIES", 50)
    (tmp_path / "aaa").mkdir()
    for n in range(60):
        (tmp_path / "aaa" / str(n)).touch()
    make_repo(tmp_path / "zzz")
    scan = fsplan.created_repositories(str(tmp_path), known)
    assert scan is not None and not scan.complete
    plan = SimpleNamespace(repositories=known, policy=SimpleNamespace(workspace=str(tmp_path)))
    said = launch_mod.created_repositories(plan, "run1")  # type: ignore[arg-type]
    assert [d.kind for d in said] == ["bound"]
    assert "stopped after 50 entries" in said[0].text and "not checked" in said[0].text


def test_a_repository_made_in_a_writable_path_is_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walk after the run starts from every root the launch walked: a repository
    made in a writable path outside the workspace loses its hook and unsafe config,
    and a corral.toml made in its subdirectory goes (quarantined and reported).
    Twin: one made outside every root is no finding."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws, extra, outside = tmp_path / "ws", tmp_path / "extra", tmp_path / "outside"
    for d in (ws, extra, outside):
        d.mkdir()
    known = fsplan.Repositories(fsplan.scan_workspace([str(ws), str(extra)]), fsplan.walk_started())
    assert known.roots == (str(ws), str(extra))
    evil = make_repo(extra / "evil", "[core]\n\tfsmonitor = touch x\n")
    (evil / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
    (extra / "pkg").mkdir()
    (extra / "pkg" / "corral.toml").write_text("[filesystem]\ndefaults = false\n")
    make_repo(outside / "other", "[core]\n\tfsmonitor = touch x\n")
    plan = SimpleNamespace(repositories=known, policy=SimpleNamespace(workspace=str(ws)))
    said = launch_mod.created_repositories(plan, "run1")  # type: ignore[arg-type]
    assert sorted(str(d.fields["path"]) for d in said) == [
        str(evil / "config"),
        str(evil / "hooks" / "pre-commit"),
        str(extra / "pkg" / "corral.toml"),
    ]
    assert not (extra / "pkg" / "corral.toml").exists()
    assert not (evil / "config").exists() and not (evil / "hooks" / "pre-commit").exists()
    assert (outside / "other" / ".git" / "config").exists()


def test_a_replaced_git_dir_counts_as_new(tmp_path: Path) -> None:
    make_repo(tmp_path)
    known = launch(tmp_path)
    os.rename(tmp_path / ".git", tmp_path / ".git-old")  # its read-only mounts go with it
    git = make_repo(tmp_path)
    (git / "hooks" / "pre-push").write_text("#!/bin/sh\n")
    assert [p for p, _ in findings(tmp_path, known)] == [str(git / "hooks" / "pre-push")]


def test_git_entries_leading_out_of_the_workspace(tmp_path: Path) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    make_repo(outside)
    kept = make_repo(ws / "kept")
    known = launch(ws)
    (ws / "a").mkdir()
    (ws / "a" / ".git").symlink_to(outside / ".git")
    (ws / "b").mkdir()
    (ws / "b" / ".git").write_text(f"gitdir: {outside / '.git'}\n")
    (ws / "c").mkdir()
    (ws / "c" / ".git").write_text(f"gitdir: {kept}\n")  # a repository known at launch
    (ws / "link").symlink_to(outside)  # a path inside that leads out
    (ws / "d").mkdir()
    (ws / "d" / ".git").write_text(f"gitdir: {ws / 'link' / '.git'}\n")
    (outside / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\n")  # the user's own
    found = sorted(p for p, _ in findings(ws, known))
    assert found == [str(ws / n / ".git") for n in ("a", "b", "d")]
    assert (outside / ".git" / "config").exists()  # nothing outside is ever a finding


def test_a_new_worktree_of_a_known_repository(tmp_path: Path) -> None:
    git = make_repo(tmp_path)
    known = launch(tmp_path)
    tree = git / "worktrees" / "feature"
    tree.mkdir(parents=True)
    (tree / "commondir").write_text("../..\n")  # the known git dir: kept
    (tree / "HEAD").write_text("ref: refs/heads/feature\n")
    assert findings(tmp_path, known) == []
    (tree / "config.worktree").write_text("[core]\n\tfsmonitor = x\n")
    other = tree.parent / "other"
    other.mkdir()
    (other / "commondir").write_text("../../../elsewhere\n")
    assert sorted(p for p, _ in findings(tmp_path, known)) == sorted(
        [str(other / "commondir"), str(tree / "config.worktree")]
    )


def test_fifos_and_devices_are_never_read(tmp_path: Path) -> None:
    """A FIFO where git keeps a file would hold any open() for reading for ever:
    the walk at launch and the look after the run both pass it by, and after the
    run it is quarantined as a config or a .git entry git cannot read plainly."""
    (tmp_path / "old" / ".git").mkdir(parents=True)
    os.mkfifo(tmp_path / "old" / ".git" / "config")  # made by an earlier run
    (tmp_path / "pipe").mkdir()
    os.mkfifo(tmp_path / "pipe" / ".git")
    known = launch(tmp_path)  # returns at all
    assert fsplan.read_small(str(tmp_path / "pipe" / ".git")) is None
    evil = tmp_path / "new" / ".git"
    evil.mkdir(parents=True)
    os.mkfifo(evil / "config")
    (tmp_path / "dev").mkdir()
    os.symlink("/dev/zero", tmp_path / "dev" / ".git")
    assert dict(findings(tmp_path, known)) == {
        str(evil / "config"): "a git config that is not a plain text file",
        str(tmp_path / "dev" / ".git"): "a .git entry leading out of the workspace",
    }


def test_quarantine_moves_findings_out_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = tmp_path / "ws"
    ws.mkdir()
    known = launch(ws)
    evil = make_repo(ws / "evil", "[core]\n\tpager = x\n")
    said = gitguard.quarantine(findings(ws, known), "run1")
    assert not (evil / "config").exists() and (evil / "HEAD").exists()
    (denial,) = said
    assert denial.fields["rule"] == "new-repository"
    assert "git config sets core.pager" in denial.text
    assert denial.to_dict()["reason"] == "git config sets core.pager"  # --report json says why
    moved = Path(str(denial.fields["moved_to"]))
    assert moved.read_text() == "[core]\n\tpager = x\n"


def test_the_launch_walk_protects_gitfile_targets_and_worktrees(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    sep = make_repo(ws / "sep")  # a --separate-git-dir repository
    (ws / "tree").mkdir()
    (ws / "tree" / ".git").write_text("gitdir: ../sep/.git\n")
    wt = sep / "worktrees" / "w"
    wt.mkdir(parents=True)
    scan = fsplan.scan_workspace(str(ws))
    assert scan.git_dirs.count(str(sep)) == 1  # found as .git and through the file
    assert str(wt) in scan.git_dirs
    assert scan.git_files == [str(ws / "tree" / ".git")]


def test_the_walk_after_the_run_lists_only_what_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Directories untouched since the launch walk are not listed again (their
    change time says so); a repository made in a deep directory, and one made
    where a touch then set the modification time back, are still found."""
    for n in range(20):
        (tmp_path / f"d{n}" / "sub").mkdir(parents=True)
    monkeypatch.setattr(fsplan, "CTIME_MARGIN_NS", 0)
    time.sleep(0.05)  # older than the cutoff of the walk below
    known = launch(tmp_path)
    listed: list[str] = []
    real_scandir = os.scandir

    def counting(path: str) -> object:
        listed.append(str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", counting)
    assert fsplan.created_repositories(str(tmp_path), known) is None
    assert listed == []  # nothing changed: nothing listed
    deep = make_repo(tmp_path / "d3" / "sub" / "new")
    (deep / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
    forged = tmp_path / "d9"
    before = os.stat(forged)
    evil = make_repo(forged)
    (evil / "hooks" / "post-merge").write_text("#!/bin/sh\n")
    os.utime(forged, ns=(before.st_atime_ns, before.st_mtime_ns))  # a touch, set back
    found = sorted(p for p, _ in findings(tmp_path, known))
    assert found == sorted([str(deep / "hooks" / "pre-commit"), str(evil / "hooks" / "post-merge")])
    assert str(tmp_path / "d0") not in listed and str(tmp_path / "d3" / "sub") in listed


def test_a_directory_changed_just_before_launch_is_listed_again(tmp_path: Path) -> None:
    """Within the margin a file system's coarse clock may not show a change made in
    the same tick: such a directory is listed after the run whatever its time."""
    known = launch(tmp_path)  # tmp_path was made just now: within the margin
    evil = make_repo(tmp_path)
    (evil / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
    assert [p for p, _ in findings(tmp_path, known)] == [str(evil / "hooks" / "pre-commit")]


def test_a_known_gitfile_is_read_only_for_the_run(tmp_path: Path) -> None:
    """Rewritten in place (no directory changes), it could send git to a repository
    the run made anywhere: it is write-protected like a git dir's config."""
    from corral.fsplan import plan_filesystem
    from corral.policy import Policy

    real = tmp_path / "real"
    make_repo(real)
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / ".git").write_text("gitdir: ../real/.git\n")
    plan = plan_filesystem(Policy(str(tmp_path)), mounts=False)
    assert str(tmp_path / "tree" / ".git") in plan.write_protect


def test_a_hook_git_copied_from_the_users_template_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Gerrit user's template has a real commit-msg hook, which git copies into
    every repository it makes: that one is the user's own and stays.  The same
    name with other bytes is the command's, and goes."""
    home = tmp_path / "home"
    template = home / "tmpl"
    (template / "hooks").mkdir(parents=True)
    (template / "hooks" / "commit-msg").write_bytes(b"#!/bin/sh\n# Change-Id\n\xff\n")
    (home / ".gitconfig").write_text('[init]\n\ttemplateDir = "~/tmpl"\n')
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("GIT_TEMPLATE_DIR", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    assert str(template) in gitguard.template_dirs()
    ws = tmp_path / "ws"
    ws.mkdir()
    known = launch(ws)
    kept = make_repo(ws / "cloned")
    (kept / "hooks" / "commit-msg").write_bytes(b"#!/bin/sh\n# Change-Id\n\xff\n")
    forged = make_repo(ws / "forged")
    (forged / "hooks" / "commit-msg").write_bytes(b"#!/bin/sh\n# Change-Id\n\xfe\n")
    assert [p for p, _ in findings(ws, known)] == [str(forged / "hooks" / "commit-msg")]
    # a template in the workspace (the run could write it) vouches for nothing
    (home / ".gitconfig").write_text(f"[init]\n\ttemplateDir = {ws / 'tmpl'}\n")
    (ws / "tmpl" / "hooks").mkdir(parents=True)
    (ws / "tmpl" / "hooks" / "commit-msg").write_bytes(b"#!/bin/sh\n# Change-Id\n\xfe\n")
    assert str(forged / "hooks" / "commit-msg") in [p for p, _ in findings(ws, known)]
