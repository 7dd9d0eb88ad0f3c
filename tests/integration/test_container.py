"""The container tier's own behaviour on real podman: env values never in
``inspect``, one container per long-lived sandbox (lazy, shared by concurrent
first calls, restarted when it dies, removed on close), and nothing left after
a run or after corral is SIGKILLed.  Runs as root (rootless podman: see tiers.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Corral, pids_matching, wait_for

from tests.tiers import CASES, TEST_IMAGE, TierCase, available

CONTAINER_CASES = [c for c in available() if c.tier == "container"]
pytestmark = [
    pytest.mark.skipif(not CONTAINER_CASES, reason="no container engine/runtime here"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the container cases run as root"),
]


@pytest.fixture(params=CONTAINER_CASES, ids=[c.id for c in CONTAINER_CASES])
def case(request: pytest.FixtureRequest) -> TierCase:
    c: TierCase = request.param
    return c


@pytest.fixture
def root_sandbox(case: TierCase) -> Iterator[tuple[Corral, Path]]:
    from conftest import _sandbox

    yield from _sandbox("root", case)


def runtime(case: TierCase) -> str:
    return case.flags[case.flags.index("--oci-runtime") + 1]


def corral_containers(workspace: object = None) -> set[str]:
    out = subprocess.run(
        [
            "podman",
            "ps",
            "-a",
            "--filter",
            f"label=corral.workspace={workspace}" if workspace else "label=corral=1",
            "--format",
            "{{.Names}}",
        ],
        capture_output=True,
        text=True,
    )
    return set(out.stdout.split())


def test_env_values_not_in_inspect(root_sandbox: tuple[Corral, Path]) -> None:
    c, ws = root_sandbox
    canary = "CANARY-" + uuid.uuid4().hex
    before = corral_containers(ws)
    proc = c.popen(
        ["run", "-q", "--env", "PASSME", "--", "sh", "-c", "echo $PASSME; sleep 30"],
        cwd=ws,
        env={"PASSME": canary},
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip().decode() == canary  # allow twin: it arrived
        (name,) = corral_containers(ws) - before
        inspect = subprocess.run(["podman", "inspect", name], capture_output=True, text=True)
        assert inspect.returncode == 0 and name in inspect.stdout
        assert canary not in inspect.stdout
        assert '"PASSME=' not in inspect.stdout  # the engine holds no env for it at all
    finally:
        proc.kill()
        proc.wait()
    assert wait_for(lambda: not (corral_containers(ws) - before), 10)


def test_a_missing_image_is_named_in_corrals_words(
    root_sandbox: tuple[Corral, Path], case: TierCase
) -> None:
    c, ws = root_sandbox
    flags = [f for f in case.flags if f != TEST_IMAGE and f != "--image"]
    missing = "localhost/corral-no-such-image:latest"
    r = c.run(["run", "-q", *flags, "--image", missing, "--", "true"], cwd=ws)
    assert r.returncode == 125
    assert f"corral: image {missing} is not in podman's store" in r.stderr.decode()
    # twin: the image exists and the command's own 125 passes through, unexplained
    r = c.run(["run", "-q", *flags, "--image", TEST_IMAGE, "--", "sh", "-c", "exit 125"], cwd=ws)
    assert r.returncode == 125 and "not in podman's store" not in r.stderr.decode()


def own_scratch(ws: Path) -> set[Path]:
    """This test's runs' private directories (their env file names its base, where
    HOME is): tests in other files run containers at the same time, with
    directories of their own."""
    found = set()
    for d in Path("/tmp").glob("corral-ctr-*"):
        try:
            if f"{ws.parent}/" in (d / "env").read_text(errors="replace"):
                found.add(d)
        except OSError:
            pass  # gone meanwhile, or not yet written
    return found


def test_nothing_left_after_a_run_or_a_sigkill(root_sandbox: tuple[Corral, Path]) -> None:
    c, ws = root_sandbox
    before = corral_containers(ws)
    ok = c.sh(ws, "echo done")
    assert ok.returncode == 0 and ok.stdout == b"done\n"  # allow twin
    assert corral_containers(ws) - before == set()
    assert own_scratch(ws) == set()  # its private files are gone
    marker = f"34{uuid.uuid4().int % 1000:03d}"
    proc = c.popen(
        ["run", "-q", "--", "sh", "-c", f"sleep {marker} & echo up; wait"],
        cwd=ws,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"up\n"
    assert corral_containers(ws) - before
    assert own_scratch(ws)  # what must go: the check below sees this run's directory
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert wait_for(lambda: not (corral_containers(ws) - before), 15), corral_containers(ws)
    assert wait_for(lambda: not pids_matching(f"sleep {marker}"), 5)
    assert wait_for(lambda: not own_scratch(ws), 5)


def _engine_client(parent: int, within: float = 30) -> int | None:
    """corral's child that runs the container (the engine's `run` client), caught
    as soon as it is exec'd: polled in a tight loop, before it makes the container."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as fh:
                children = [int(p) for p in fh.read().split()]
        except OSError:
            return None
        for pid in children:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if b"\0run\0--rm\0--name\0corral-" in fh.read():
                        return pid
            except OSError:
                continue
        time.sleep(0.002)
    return None


@pytest.mark.slow  # (12 s of waiting out the guardian, per runtime)
def test_a_container_made_after_corral_was_killed_is_removed_too(
    root_sandbox: tuple[Corral, Path],
) -> None:
    """corral SIGKILLed while its engine client had not yet made the container
    (paused here, as a slow engine is): the guardian removed nothing, the client
    then made it, and it ran on with the workspace writable after the checks
    (found by attacking corral).  Now the guardian ends the client and removes
    again.  The twin: a run left alone ends and leaves nothing either."""
    c, ws = root_sandbox
    before = corral_containers(ws)
    ok = c.sh(ws, "echo done")
    assert ok.returncode == 0 and ok.stdout == b"done\n"
    proc = c.popen(["run", "-q", "--", "sleep", "1000"], cwd=ws)
    client = _engine_client(proc.pid)
    assert client is not None
    os.kill(client, signal.SIGSTOP)  # (before it has made the container)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        time.sleep(3)  # the guardian's first removal done, its wait for the client not
    finally:
        try:
            os.kill(client, signal.SIGCONT)  # (a client left alive makes it now)
        except OSError:
            pass
    time.sleep(8)
    left = corral_containers(ws) - before
    for name in left:  # (not this test's to leave, whatever it shows)
        subprocess.run(["podman", "rm", "-f", name], capture_output=True)
    assert not left


@pytest.fixture
def policy(
    root_sandbox: tuple[Corral, Path], case: TierCase, monkeypatch: pytest.MonkeyPatch
) -> Iterator[object]:
    from corral.policy import Policy

    c, ws = root_sandbox
    monkeypatch.setenv("XDG_STATE_HOME", str(c.state))  # its home layer: not in root's own
    p = Policy(str(ws))
    p.container.runtime = runtime(case)
    p.container.image = TEST_IMAGE
    yield p


def test_sandbox_is_lazy_shared_restarted_and_removed(policy: object) -> None:
    from corral import Sandbox

    ws = getattr(policy, "workspace")  # noqa: B009  (policy: object, for the fixture's sake)
    before = corral_containers(ws)
    sb = Sandbox(policy, tier="container")
    try:
        assert sb.starts == 0 and corral_containers(ws) == before  # lazy: nothing yet
        results: list[int] = []

        def call(i: int) -> None:
            results.append(sb.exec(f"echo {i}").exit_code)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [0] * 20
        assert sb.starts == 1  # 20 concurrent first calls, one container
        mine = corral_containers(ws) - before
        assert len(mine) == 1
        # killed from outside while in use: the next call notices and starts afresh
        subprocess.run(["podman", "rm", "--force", "--time=0", *mine], capture_output=True)
        assert wait_for(lambda: not sb._alive, 10)
        again = sb.exec("echo again")
        assert again.exit_code == 0 and again.stdout == b"again\n"
        assert sb.starts == 2
        assert len(corral_containers(ws) - before) == 1
    finally:
        sb.close()
    assert wait_for(lambda: corral_containers(ws) - before == set(), 10)


def test_tiers_cases_are_listed() -> None:
    assert {c.id for c in CASES} >= {"container", "gvisor"}


RUNSC = ["podman", "--cgroup-manager=cgroupfs", "--runtime=/usr/bin/runsc"]


def _left_then_cleaned(fifo: Path, stuck: bool) -> None:
    """Start a container (``stuck``: with a mount over the FIFO), kill its client,
    run corral's cleanup, and check nothing of it is left."""
    from corral.container import leftovers
    from corral.tiers.container import EngineLaunch

    name = f"corral-leftover-{uuid.uuid4().hex[:8]}"
    mounts = ["--mount", f"type=bind,src={fifo},dst={fifo},ro"] if stuck else []
    run = [*RUNSC, "run", "--rm", "--name", name, "--network=none", *mounts]
    client = subprocess.Popen(
        [*run, TEST_IMAGE, "sleep", "600"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    up = "runsc-gofer" if stuck else "sleep 600"
    assert wait_for(lambda: pids_matching(f"conmon .*{name}") and pids_matching(up), 30)
    client.kill()
    client.wait()
    ids, pids, _ = leftovers.find(name)
    assert ids and pids
    remove = [*RUNSC, "rm", "--force", "--ignore", "--time=0", name]
    EngineLaunch(dict(os.environ), "", remove).cleanup(None, clean=False)  # type: ignore[arg-type]
    assert wait_for(lambda: not leftovers.find(name)[1], 10), name
    assert wait_for(lambda: not any(pids_matching(i) for i in ids), 10)
    state = [e for e in os.listdir("/var/run/runsc") if any(e.startswith(i) for i in ids)]
    assert not state, state


@pytest.mark.slow
@pytest.mark.skipif(not any(runtime(c) == "runsc" for c in CONTAINER_CASES), reason="no runsc here")
def test_a_runtime_hung_before_the_start_leaves_nothing(tmp_path: Path) -> None:
    """A container whose runtime hangs in ``runsc create`` (its gofer waiting on a
    FIFO mounted over: made by hand, corral refuses such a plan) survives
    ``podman rm --force``: conmon, runsc, the gofer and the sandbox kept running
    with runsc's lock held.  corral's cleanup ends them.  Twin: the same cleanup
    of a container that started normally leaves nothing either."""
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    _left_then_cleaned(fifo, stuck=True)
    _left_then_cleaned(fifo, stuck=False)


def _swap_for_link(path: Path, target: Path) -> None:
    """What another run in the same workspace can do at any moment: put a symlink
    where a protected directory was (renameat2 RENAME_EXCHANGE does it atomically)."""
    path.rename(path.with_name(path.name + "-real"))
    path.symlink_to(target)


def test_a_bind_source_swapped_for_a_link_binds_nothing_of_the_host(
    root_sandbox: tuple[Corral, Path], policy: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine binds a protected directory (here .vscode below the workspace's
    root) some time after corral planned it, resolving the source on the host and
    the target inside, through symlinks.  Swapped for a link to a host directory
    in between (by a concurrent run), that directory was bound in, readable by the
    container's root: /etc or ~/.ssh, which the container never shows otherwise.
    Twin: unswapped, the directory is there, read-only, and the host's is not."""
    from corral import Sandbox, launch
    from corral.sandbox import SandboxError

    c, ws = root_sandbox
    outside = c.base / f"outside-{uuid.uuid4().hex[:6]}"
    outside.mkdir()
    canary = "CANARY-" + uuid.uuid4().hex
    (outside / "key").write_text(canary + "\n")
    protected = ws / "sub" / ".vscode"
    protected.mkdir(parents=True)
    (protected / "settings.json").write_text("{}\n")
    read = f"cat sub/.vscode/settings.json sub/.vscode/key {outside}/key; echo x > sub/.vscode/new"

    sb = Sandbox(policy, tier="container")  # twin first: nothing swapped
    try:
        r = sb.exec(read)
    finally:
        sb.close()
    assert r.stdout.startswith(b"{}\n") and canary.encode() not in r.stdout, r
    assert b"Read-only file system" in r.stderr and not (protected / "new").exists(), r

    start = launch.start

    def swapped_first(*args: Any, **kw: Any) -> Any:
        _swap_for_link(protected, outside)  # after the plan, before the engine binds
        return start(*args, **kw)

    monkeypatch.setattr(launch, "start", swapped_first)
    sb = Sandbox(policy, tier="container")
    try:
        with pytest.raises(SandboxError) as raised:
            r = sb.exec(read)
            assert canary.encode() not in r.stdout + r.stderr, r  # (the old behaviour)
    finally:
        sb.close()
    assert "changed while the container was set up" in str(raised.value)
    assert canary not in str(raised.value)
