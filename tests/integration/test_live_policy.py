"""A policy file a sandboxed run could have written is never loaded silently:
refused while that run lives (corral.liveruns), said on stderr when it lies
where corral's check after a run does not look (policy.unchecked_place)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path

from conftest import Corral, wait_for

POLICY = '[network]\nmode = "none"\n'
PLANT = f"printf '{POLICY}' > corral.toml"


def _long_run(c: Corral, ws: Path, script: str) -> subprocess.Popen[bytes]:
    """``corral run`` of ``script`` then a long sleep, until ``ws/ready`` exists."""
    proc = c.popen(
        ["run", "-q", "--", "sh", "-c", f"{script}; touch ready; sleep 60"],
        cwd=ws,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert wait_for((ws / "ready").exists, timeout=30), proc.stderr
    return proc


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


def _explain(c: Corral, ws: Path) -> subprocess.CompletedProcess[bytes]:
    return c.run(["run", "--explain", "--", "true"], cwd=ws)


def test_a_policy_file_a_live_run_wrote_is_refused(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    policy = os.path.realpath(ws / "corral.toml")
    proc = _long_run(c, ws, PLANT)
    try:
        out = c.sh(ws, "echo ran")
        assert out.returncode == 2, out
        err = out.stderr.decode()
        assert out.stdout == b"" and err.count("\n") == 1, err
        assert policy in err and f"pid {proc.pid}" in err and "--policy" in err, err
        # named, it is refused as well; pinned by the user after review, it loads
        named = c.run(["run", "-q", "--policy", policy, "--", "true"], cwd=ws)
        assert named.returncode == 2 and "--policy-sha256 HEX" in named.stderr.decode(), named
        digest = hashlib.sha256(Path(policy).read_bytes()).hexdigest()
        pin = ["--policy", policy, "--policy-sha256", digest]
        pinned = c.run(["run", "-q", *pin, "--", "true"], cwd=ws)
        assert pinned.returncode == 0, pinned
    finally:
        _end(proc)
    assert not (ws / "corral.toml").exists()  # the run's end quarantined it
    # the same file made by the user once the run is over loads as usual
    time.sleep(0.02)  # past the run's end on the file system's clock
    (ws / "corral.toml").write_text(POLICY)
    c.chown(ws / "corral.toml")
    shown = _explain(c, ws)
    assert shown.returncode == 0, shown
    assert f"policy file: {policy}" in shown.stdout.decode()


def test_a_policy_file_from_before_a_live_run_loads(sandbox: tuple[Corral, Path]) -> None:
    c, ws = sandbox
    (ws / "corral.toml").write_text(POLICY)
    c.chown(ws / "corral.toml")
    proc = _long_run(c, ws, "true")
    try:
        shown = _explain(c, ws)
        assert shown.returncode == 0, shown
        assert f"policy file: {os.path.realpath(ws / 'corral.toml')}" in shown.stdout.decode()
        assert b"corral:" not in shown.stderr, shown.stderr
    finally:
        _end(proc)


def test_a_policy_file_an_ended_run_left_where_its_check_did_not_look_is_refused(
    sandbox: tuple[Corral, Path],
) -> None:
    """The check after a run never enters node_modules (nor goes past its bounds):
    the run's corral.toml there stays, and is refused by a later run (the journal
    of ended runs); one the user writes there afterwards loads."""
    c, ws = sandbox
    made = c.sh(ws, f"mkdir -p node_modules/p node_modules/q && cd node_modules/p && {PLANT}")
    assert made.returncode == 0, made
    planted = os.path.realpath(ws / "node_modules/p/corral.toml")
    assert os.path.exists(planted)  # not quarantined
    out = c.sh(ws / "node_modules/p", "echo ran")
    assert out.returncode == 2 and out.stdout == b"", out
    err = out.stderr.decode()
    assert err.count("\n") == 1 and planted in err and f"`touch {planted}`" in err, err
    time.sleep(0.02)  # past the run's end on the file system's clock
    (ws / "node_modules/q/corral.toml").write_text(POLICY)
    c.chown(ws / "node_modules/q/corral.toml")
    out = c.sh(ws / "node_modules/q", "echo ran")
    assert out.returncode == 0 and out.stdout == b"ran\n", out


def test_a_policy_file_the_check_after_a_run_missed_is_said(
    sandbox: tuple[Corral, Path],
) -> None:
    c, ws = sandbox
    deep, skipped = "a/b/c/d/e/f/g", "node_modules/pkg"
    made = c.sh(
        ws, f"mkdir -p {deep} {skipped} && for d in {deep} {skipped}; do (cd $d && {PLANT}); done"
    )
    assert made.returncode == 0, made
    time.sleep(0.02)
    for where in (deep, skipped):
        os.utime(ws / where / "corral.toml")  # reviewed and touched: not refused
    for where in (deep, skipped):
        out = c.sh(ws / where, "echo ran")
        assert out.returncode == 0 and out.stdout == b"ran\n", out
        err = out.stderr.decode()
        policy = os.path.realpath(ws / where / "corral.toml")
        assert f"corral: warning: policy file {policy} is " in err, (where, err)
    # the workspace's own policy file, at its top: nothing to say
    (ws / "corral.toml").write_text(POLICY)
    c.chown(ws / "corral.toml")
    out = c.sh(ws, "echo ran")
    assert out.returncode == 0 and b"warning" not in out.stderr, out


def test_a_named_policy_file_a_run_rewrote_is_refused_until_pinned(
    tsandbox: tuple[Corral, Path],
) -> None:
    """A run under one named policy file rewrote another one beside it (a CI
    script names both): the next run naming the rewritten file loaded it, and
    wrote where the agent had put (found by attacking corral).  Now a named file
    is checked as a found one is; pinning what it holds vouches for it."""
    c, ws = tsandbox
    for name in ("a.toml", "b.toml"):
        (ws / name).write_text(POLICY)
        c.chown(ws / name)
    time.sleep(0.02)  # past the file system clock's tick
    untouched = c.run(["run", "-q", "--policy", "a.toml", "--", "echo", "ran"], cwd=ws)
    assert untouched.returncode == 0 and untouched.stdout == b"ran\n", untouched  # the twin
    wrote = c.run(
        ["run", "-q", "--policy", "a.toml", "--", "sh", "-c", "echo '# widened' >> b.toml"],
        cwd=ws,
    )
    assert wrote.returncode == 0, wrote
    refused = c.run(["run", "-q", "--policy", "b.toml", "--", "echo", "ran"], cwd=ws)
    assert refused.returncode == 2 and refused.stdout == b"", refused
    err = refused.stderr.decode()
    assert err.count("\n") == 1 and "b.toml" in err and "--policy-sha256 HEX" in err, err
    digest = hashlib.sha256((ws / "b.toml").read_bytes()).hexdigest()
    pinned = c.run(
        ["run", "-q", "--policy", "b.toml", "--policy-sha256", digest, "--", "echo", "ran"],
        cwd=ws,
    )
    assert pinned.returncode == 0 and pinned.stdout == b"ran\n", pinned


def test_a_policy_file_a_run_left_in_its_home_layer_is_refused(
    sandbox: tuple[Corral, Path],
) -> None:
    """The home layer is a place a run writes too: a policy file it left there
    and the user named later was loaded (found by attacking corral).  The twin:
    one the user wrote there after the run loads."""
    c, ws = sandbox
    layer = c.run(["home", "path"], cwd=ws).stdout.decode().strip()
    wrote = c.sh(ws, f"printf '{POLICY}' > \"$HOME/ci.toml\"")
    assert wrote.returncode == 0, wrote
    refused = c.run(["run", "-q", "--policy", f"{layer}/ci.toml", "--", "true"], cwd=ws)
    assert refused.returncode == 2 and "ci.toml" in refused.stderr.decode(), refused
    time.sleep(0.02)  # past the run's end on the file system's clock
    (Path(layer) / "mine.toml").write_text(POLICY)
    c.chown(Path(layer) / "mine.toml")
    mine = c.run(["run", "-q", "--policy", f"{layer}/mine.toml", "--", "true"], cwd=ws)
    assert mine.returncode == 0, mine
