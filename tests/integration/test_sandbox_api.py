"""The long-lived Sandbox Python API on real bwrap: exec, spawn, files, limits, cleanup."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT_BASE, pids_matching, wait_for

from corral import ExecResult
from corral import policy as pol
from corral.sandbox import (
    AsyncSandbox,
    CallbackError,
    CwdOutsideSandbox,
    PathDenied,
    Sandbox,
    SandboxClosed,
)
from tests.tiers import TierCase


@pytest.fixture
def home_ws(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    base = ROOT_BASE / ("api-" + uuid.uuid4().hex[:10])
    home, ws, state = base / "home", base / "ws", base / "state"
    for d in (home, ws, state):
        d.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    try:
        yield home, ws
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def sb(home_ws: tuple[Path, Path], tier: TierCase) -> Iterator[Sandbox]:
    _, ws = home_ws
    box = Sandbox(pol.load(str(ws)), **tier.api)
    try:
        yield box
    finally:
        box.close()


def test_exec_results_and_streaming(sb: Sandbox) -> None:
    seen: list[bytes] = []
    r = sb.exec("echo out; echo err >&2; exit 3", on_stdout=seen.append)
    assert (r.exit_code, r.stdout, r.stderr) == (3, b"out\n", b"err\n")
    assert not r.timed_out and not r.truncated and r.duration > 0
    assert b"".join(seen) == b"out\n"
    assert sb.exec(["sh", "-c", "kill -TERM $$"]).exit_code == 128 + signal.SIGTERM
    assert sb.exec(["no-such-command"]).exit_code == 127
    assert sb.exec("cat", stdin="piped in").stdout == b"piped in"


def test_env_names_and_values(sb: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    canary = "CANARY-" + uuid.uuid4().hex
    monkeypatch.setenv("FROM_HOST", canary)
    monkeypatch.setenv("NOT_PASSED", "secret")
    r = sb.exec("echo $FROM_HOST $GIVEN $NOT_PASSED", env=["FROM_HOST"])
    assert r.stdout.split() == [canary.encode()]
    r = sb.exec("echo $GIVEN; cat /proc/self/cmdline", env={"GIVEN": canary})
    assert r.stdout.startswith(canary.encode()) and canary.encode() not in r.stdout[40:]


def test_a_command_is_found_on_the_path_its_env_gives(
    sb: Sandbox, home_ws: tuple[Path, Path]
) -> None:
    """exec(["ls"], env={"PATH": ...}) runs the ls that PATH finds first, as a
    shell or subprocess would; without it, the sandbox's own PATH finds /usr/bin's."""
    _, ws = home_ws
    made = "mkdir -p bin && printf '#!/bin/sh\\necho mine\\n' > bin/ls && chmod +x bin/ls"
    assert sb.exec(made).exit_code == 0
    assert sb.exec(["ls"], env={"PATH": f"{ws}/bin:/usr/bin:/bin"}).stdout == b"mine\n"
    assert sb.exec(["ls"]).stdout == b"bin\n"  # the twin: the real ls
    missing = sb.exec(["no-such-command"], env={"PATH": f"{ws}/bin"})
    assert missing.exit_code == 127 and f"PATH={ws}/bin".encode() in missing.stderr


def test_cwd_inside_only(sb: Sandbox, home_ws: tuple[Path, Path]) -> None:
    _, ws = home_ws
    (ws / "sub").mkdir()
    assert sb.exec("pwd", cwd="sub").stdout.decode().strip() == str(ws / "sub")
    with pytest.raises(CwdOutsideSandbox):
        sb.exec("pwd", cwd="/etc")
    with pytest.raises(CwdOutsideSandbox):
        sb.exec("pwd", cwd="../..")


def test_a_policy_file_the_sandbox_writes_is_refused_while_it_lives(
    home_ws: tuple[Path, Path], tier: TierCase
) -> None:
    """A long-lived Sandbox writes the corral.toml its workspace lacked: another
    run loading the workspace's policy meanwhile refuses it (once the sandbox is
    closed, the file is quarantined and one the user makes loads); one the user
    made before the sandbox opened loads while it lives."""
    from corral.errors import PolicyError

    _, ws = home_ws
    policy = os.path.realpath(ws / "corral.toml")
    with Sandbox(pol.load(str(ws)), **tier.api) as box:
        assert box.exec("printf '[filesystem]\\ndefaults = false\\n' > corral.toml").exit_code == 0
        with pytest.raises(PolicyError) as refused:
            pol.load(str(ws))
        assert policy in str(refused.value) and f"pid {os.getpid()}" in str(refused.value)
        with pytest.raises(PolicyError):  # named, checked just as well
            pol.load(str(ws), policy)
        digest = hashlib.sha256((ws / "corral.toml").read_bytes()).hexdigest()
        assert pol.load(str(ws), policy, digest).source == policy  # pinned after review
    assert not (ws / "corral.toml").exists()  # quarantined as the sandbox closed
    time.sleep(0.02)  # past the sandbox's end on the file system's clock
    (ws / "corral.toml").write_text("[filesystem]\ndefaults = false\n")
    assert pol.load(str(ws)).source == policy  # the user's, after: loaded
    with Sandbox(pol.load(str(ws)), **tier.api) as box:
        assert box.exec("true").exit_code == 0
        assert pol.load(str(ws)).source == policy  # the user's, from before: loaded


def test_timeout_kills_the_group_keeps_output_and_the_sandbox(sb: Sandbox) -> None:
    marker = f"34{uuid.uuid4().int % 1000:03d}"
    t0 = time.monotonic()
    r = sb.exec(f"echo partial; sleep {marker} & sleep {marker}; wait", timeout=0.5)
    assert r.timed_out and r.stdout == b"partial\n" and time.monotonic() - t0 < 5
    assert r.exit_code == 124  # the same code `corral run --timeout` exits with
    assert wait_for(lambda: not pids_matching(f"sleep {marker}"), 5)
    assert sb.exec("echo still here").stdout == b"still here\n"  # the sandbox survives


def test_spawn_handles(sb: Sandbox) -> None:
    proc = sb.spawn("read line; echo got:$line; sleep 30")
    proc.write_stdin("hello\n")
    seen = bytearray()

    def got() -> bool:
        seen.extend(proc.read_output()[0])  # incremental: only what is new each call
        return b"got:hello" in seen

    assert wait_for(got, 5)
    assert proc in sb.processes() and proc.pid > 0
    proc.kill()
    result = proc.wait(5)
    assert result.exit_code == 128 + signal.SIGKILL
    assert proc not in sb.processes()
    quiet = sb.spawn(["cat"])
    quiet.write_stdin(b"abc")
    quiet.close_stdin()
    assert quiet.wait(5).stdout == b"abc"


def test_spawn_returns_with_the_pid(sb: Sandbox) -> None:
    proc = sb.spawn("sleep 30")
    assert proc.pid > 0 and proc.running  # at once, not after the agent's next frame
    proc.kill()
    assert proc.wait(5).exit_code == 128 + signal.SIGKILL
    missing = sb.spawn(["no-such-command"])  # could not start: ended, with the shell's code
    assert missing.wait(5).exit_code == 127


class Boom(Exception):
    pass


def _raise(_data: object) -> None:
    raise Boom("callback failed")


@pytest.mark.parametrize("which", ["on_stdout", "on_stderr"])
def test_a_raising_callback_reaches_the_caller(sb: Sandbox, which: str) -> None:
    fd = "" if which == "on_stdout" else ">&2"
    t0 = time.monotonic()
    with pytest.raises(CallbackError) as caught:  # even with no timeout: never a hang
        sb.exec(f"echo first {fd}; sleep 30; echo never {fd}", **{which: _raise})  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 10  # the command was killed, not waited for
    assert isinstance(caught.value.__cause__, Boom)
    assert caught.value.result.exit_code == 128 + signal.SIGKILL
    assert b"never" not in caught.value.result.stdout + caught.value.result.stderr
    # the twin: the sandbox stays usable, callbacks that do not raise still stream
    seen: list[bytes] = []
    r = sb.exec(f"echo again {fd}", **{which: seen.append})  # type: ignore[arg-type]
    assert r.exit_code == 0 and b"".join(seen) == b"again\n"
    with pytest.raises(CallbackError):  # a timeout beside it changes nothing
        sb.exec(f"echo x {fd}; sleep 30", timeout=20, **{which: _raise})  # type: ignore[arg-type]
    assert sb.exec("echo ok").stdout == b"ok\n"


def test_a_raising_exit_callback_and_spawn(sb: Sandbox) -> None:
    proc = sb.spawn("echo done")
    proc.add_exit_callback(_raise)
    with pytest.raises(CallbackError):
        proc.wait(10)
    assert sb.exec("echo ok").stdout == b"ok\n"


def test_async_raising_callback(home_ws: tuple[Path, Path], tier: TierCase) -> None:
    import asyncio

    _, ws = home_ws

    async def go() -> None:
        async with AsyncSandbox(pol.load(str(ws)), **tier.api) as sb:
            with pytest.raises(CallbackError):
                await asyncio.wait_for(sb.exec("echo a; sleep 30", on_stdout=_raise), 15)
            r = await asyncio.wait_for(sb.exec("echo b"), 15)
            assert r.stdout == b"b\n"

    asyncio.run(go())


def test_agent_survives_a_bad_request(sb: Sandbox) -> None:
    sb._send({"op": "exec", "id": 10**9, "argv": None})  # not a list: the agent's bug path
    assert wait_for(lambda: bool(sb.errors), 10)
    assert sb.errors[0].startswith("agent: TypeError") and "Traceback" not in sb.errors[0]
    assert sb.exec("echo ok").stdout == b"ok\n"  # the twin: still serving
    with pytest.raises(ValueError):
        sb.exec([])


def test_fifty_concurrent_execs(sb: Sandbox) -> None:
    results: dict[int, bytes] = {}

    def one(i: int) -> None:
        results[i] = sb.exec(f"echo {i}; sleep 0.05; echo done{i} >&2").stdout

    threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {i: f"{i}\n".encode() for i in range(50)}


def test_files_obey_the_policy(sb: Sandbox, home_ws: tuple[Path, Path], tier: TierCase) -> None:
    home, ws = home_ws
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "config").write_text("[core]\n")
    (ws / ".env").write_text("CANARY-env\n")
    (ws / "sub").mkdir()
    # a fresh sandbox sees the repository it was started with
    with Sandbox(pol.load(str(ws)), **tier.api) as box:
        box.files.write("notes.txt", "hello")  # allow twins
        if "mounts" in tier.props:
            assert box.files.read_text("notes.txt") == "hello"
        else:  # documented: a new file beside a hidden .env cannot be read back (landlock)
            with pytest.raises(PathDenied):
                box.files.read_text("notes.txt")
        box.files.write("sub/notes.txt", "hello")
        assert box.files.read_text("sub/notes.txt") == "hello"
        assert box.files.exists("notes.txt") and not box.files.exists("nope.txt")
        box.files.mkdir("dir/sub")
        names = [e["name"] for e in box.files.list(".")]
        assert "notes.txt" in names and "dir" in names
        box.files.remove("notes.txt")
        assert not (ws / "notes.txt").exists()
        with pytest.raises(PathDenied):
            box.files.write(".git/hooks/pre-commit", "touch /pwned")
        with pytest.raises(PathDenied):
            box.files.write(".git/config", "[evil]")
        with pytest.raises(PathDenied):
            box.files.write(".vscode/tasks.json", "{}")  # missing write-deny path
        with pytest.raises(PathDenied):
            box.files.read(".env")
        # containers: the host is not in the image at all (absent, not read-only);
        # there the home's own path holds the home layer, so look beside it
        outside = home if "host-root" in tier.props else home.parent
        denied = PathDenied if "host-root" in tier.props else (PathDenied, FileNotFoundError)
        with pytest.raises(denied):
            box.files.write(str(outside / "outside.txt"), "x")
        os.symlink(outside, ws / "escape")
        with pytest.raises(denied):
            box.files.write("escape/through-link.txt", "x")
        with pytest.raises(FileNotFoundError):
            box.files.read("missing.txt")
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()
    assert (ws / ".git" / "config").read_text() == "[core]\n"
    assert not (home / "outside.txt").exists() and not (home / "through-link.txt").exists()


def test_closed_sandbox_and_nothing_left(home_ws: tuple[Path, Path], tier: TierCase) -> None:
    _, ws = home_ws
    marker = f"35{uuid.uuid4().int % 1000:03d}"
    box = Sandbox(pol.load(str(ws)), **tier.api)
    box.spawn(f"sleep {marker}")
    box.spawn(f"setsid sleep {marker}")
    if tier.id == "gvisor":  # its processes live in gVisor's kernel, not the host's
        before = corral_containers(ws)
        assert wait_for(lambda: len(box.processes()) == 2, 5)
        box.close()
        assert wait_for(lambda: not (corral_containers(ws) & before), 10)
        return
    assert wait_for(lambda: len(pids_matching(f"sleep {marker}")) >= 2, 5)
    box.close()
    assert wait_for(lambda: not pids_matching(f"sleep {marker}"), 5)
    assert not pids_matching(f"agent.py.*{box.run_id}")
    with pytest.raises(SandboxClosed):
        box.exec("true")
    with pytest.raises(SandboxClosed):
        box.files.read("x")
    box.close()  # idempotent


def test_network_door_is_shared_with_run(home_ws: tuple[Path, Path], tier: TierCase) -> None:
    _, ws = home_ws
    policy = pol.load(str(ws))
    policy.network.mode = "proxy"
    policy.network.allow = ["127.0.0.1:9"]
    with Sandbox(policy, **tier.api) as box:
        r = box.exec("echo $HTTPS_PROXY")
        assert r.stdout.startswith(b"http://127.0.0.1:"), r.stdout  # the relay or the door
        assert "127.0.0.1:9" in box.describe()
    policy.network.mode = "none"
    policy.network.allow = []
    with Sandbox(policy, **tier.api) as box:
        assert "Network: none." in box.describe()


def test_async_sandbox_fifty_concurrent(home_ws: tuple[Path, Path], tier: TierCase) -> None:
    import asyncio

    from corral import AsyncSandbox

    _, ws = home_ws

    async def go() -> None:
        async with AsyncSandbox(pol.load(str(ws)), **tier.api) as sb:
            results = await asyncio.gather(*(sb.exec(f"echo {i}; sleep 0.05") for i in range(50)))
            assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(50)]
            await sb.write("a.txt", "async")
            assert await sb.read("a.txt") == b"async"
            slow = await sb.exec("sleep 5", timeout=0.3)
            assert slow.timed_out
        with pytest.raises(SandboxClosed):
            await sb.exec("true")

    asyncio.run(go())


def corral_containers(workspace: object = None) -> set[str]:
    """Names of corral's containers (the evidence on gVisor, whose processes the
    host's ps cannot see)."""
    import shutil
    import subprocess

    if not shutil.which("podman"):
        return set()
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


def test_host_killed_leaves_nothing(home_ws: tuple[Path, Path], tier: TierCase) -> None:
    """The program holding a Sandbox is SIGKILLed: its sandbox, processes, cgroup go;
    a write-deny path the sandbox created is still quarantined."""
    import subprocess
    import sys

    _, ws = home_ws
    live = Path(os.environ["XDG_STATE_HOME"], "corral", "live")
    ended = live / "ended.jsonl"
    before = ended.read_text().count("\n") if ended.exists() else 0
    marker = f"36{uuid.uuid4().int % 1000:03d}"
    code = f"""
import sys, time
from corral import policy as pol
from corral.sandbox import Sandbox
p = pol.load({str(ws)!r}); p.limits.pids = {256 if tier.id == "gvisor" else 64}
sb = Sandbox(p, **{tier.api!r})
sb.exec("mkdir .vscode")
sb.spawn("sleep {marker}")
print("up", flush=True)
time.sleep(60)
"""
    from test_process import _corral_cgroups, cgroup_names

    cgroups_before = set(_corral_cgroups())

    def new_cgroups() -> set[str]:  # (gVisor's processes are not the host's to read)
        return {os.path.basename(d) for d in set(_corral_cgroups()) - cgroups_before}

    host = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, env={**os.environ}
    )
    assert host.stdout is not None
    assert host.stdout.readline() == b"up\n"
    if tier.id == "gvisor":  # its processes live in gVisor's kernel: watch the container
        mine = corral_containers(ws)
        assert mine
        mine_cgroups = new_cgroups()
        host.kill()
        host.wait()
        assert wait_for(lambda: not (corral_containers(ws) & mine), 15)
    else:
        assert wait_for(lambda: bool(pids_matching(f"sleep {marker}")), 5)
        mine_cgroups = cgroup_names(pids_matching(f"sleep {marker}"))
        host.kill()
        host.wait()
        assert wait_for(lambda: not pids_matching(f"sleep {marker}"), 5)
    assert wait_for(lambda: not (ws / ".vscode").exists(), 5)  # quarantined by the guardian
    # no longer live: removed too, and journaled as ended (by the guardian)
    assert wait_for(lambda: [p.name for p in live.iterdir()] == [ended.name], 5)
    assert ended.read_text().count("\n") == before + 1
    # (a user's runs have none here, and a container's are its engine's)
    assert mine_cgroups or os.geteuid() != 0 or tier.id not in ("namespace", "landlock")
    assert wait_for(lambda: not _corral_cgroups(mine_cgroups), 5)
    with Sandbox(pol.load(str(ws)), **tier.api) as box:  # allow twin: a closed sandbox works
        assert box.exec("echo ok").stdout == b"ok\n"


def test_exec_alone_ends_leftovers_and_empties_private_tmp_not_the_workspace(
    home_ws: tuple[Path, Path], tmp_path: Path
) -> None:
    """The reset between jobs (corral batch --reuse): what a job left running is
    killed when it ends, its private /tmp, /var/tmp and /dev/shm are emptied,
    and a workspace bound under /tmp keeps every file (a mount is never entered)."""
    ws = tmp_path / "deep" / "ws"  # pytest's tmp is under /tmp: bound inside /tmp
    ws.mkdir(parents=True)
    (ws / "kept.txt").write_text("mine\n")
    with Sandbox(pol.load(str(ws))) as box:
        leave = (
            "setsid sleep 300 </dev/null >/dev/null 2>&1 & sleep 301 & "
            "echo x > /tmp/left; mkdir -p /var/tmp/a/b /dev/shm/d; echo in > made.txt; echo ok"
        )
        began = time.monotonic()
        r = box.exec_alone(["sh", "-c", leave])
        assert (r.exit_code, r.stdout) == (0, b"ok\n")
        assert time.monotonic() - began < 5  # the background sleeps did not hold it
        after = box.exec(
            "ps -e -o comm | grep -c '^sleep' ; ls -A /var/tmp /dev/shm; ls /tmp; cat kept.txt"
        ).text
        count, rest = after.split("\n", 1)
        assert count == "0", after  # nothing the first job left is running
        assert "left" not in rest and "a\n" not in rest and "d\n" not in rest, after
        assert "mine" in rest  # the workspace, under /tmp, untouched
        # the allowed twin: what the job wrote in the workspace stays, and so does
        # the sandbox, ready for the next job
        assert (ws / "made.txt").read_text() == "in\n" and (ws / "kept.txt").exists()
        assert box.exec(["true"]).exit_code == 0
        box.exec("setsid sleep 302 </dev/null >/dev/null 2>&1 & touch /dev/shm/again")
        assert box.reset()["killed"] == 1  # the same, asked for on its own
        assert box.exec("ls -A /dev/shm; ps -e -o comm | grep -c '^sleep'").text == "0\n"


# A process whose main thread exits alone (pthread_exit) while another runs on: /proc
# shows it as a zombie ("Z"), and the reset took it for one and left it running.
GHOST = """
import ctypes, os, threading, time
if os.fork():
    os._exit(0)  # the job's own process ends; the ghost is its child
def haunt():
    while True:
        open("/tmp/ghost", "w").write(str(os.getpid()))
        time.sleep(0.05)
threading.Thread(target=haunt, daemon=True).start()
time.sleep(0.2)
ctypes.CDLL(None).pthread_exit(None)
"""


def test_a_process_whose_main_thread_exited_does_not_outlive_the_job(
    home_ws: tuple[Path, Path],
) -> None:
    _, ws = home_ws
    (ws / "ghost_bg.py").write_text(GHOST)

    def hung(*_: object) -> None:  # the ghost left running held the sandbox up
        raise TimeoutError("the sandbox hung with a job's process left in it")

    signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        _ghost_does_not_outlive_its_job(ws)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)


def _ghost_does_not_outlive_its_job(ws: Path) -> None:
    with Sandbox(pol.load(str(ws))) as box:
        # the twin first: within its job the ghost runs, shown as a zombie
        seen = box.exec_alone(
            "python3 ghost_bg.py; sleep 0.5; cut -d' ' -f3 /proc/$(cat /tmp/ghost)/stat; "
            "ps -e -o args | grep -c '[g]host_bg'"
        ).text
        assert seen.split() == ["Z", "1"], seen
        after = box.exec_alone("sleep 0.5; ls /tmp; ps -e -o args | grep -c '[g]host_bg'")
        assert after.text == "0\n", after.text  # gone, and its file with it


# A process that forks and exits in a loop: its pid changes faster than a listing
# of /proc can be acted on (each child notes its pid in the file it is given).
HOPPER = r"""
#include <fcntl.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    long last = 0;
    for (;;) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long ms = now.tv_sec * 1000 + now.tv_nsec / 1000000;
        if (ms - last >= 50) {
            last = ms;
            int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd >= 0) { dprintf(fd, "%d\n", getpid()); close(fd); }
        }
        if (fork() > 0) _exit(0);
    }
}
"""


def test_a_process_hopping_from_pid_to_pid_does_not_outlive_its_job(
    home_ws: tuple[Path, Path],
) -> None:
    """Found by attacking warm sandboxes: the reset listed /proc and killed what it
    listed, and a process forking and exiting in a loop was always one pid ahead;
    it ran on into the next job.  The twin: within its job, it hops."""
    import shutil
    import subprocess

    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed (.ci/run installs it)")
    _, ws = home_ws
    (ws / "hopper.c").write_text(HOPPER)
    subprocess.run(["gcc", "-O2", "-o", str(ws / "hopper"), str(ws / "hopper.c")], check=True)
    beats = " ".join(f"beat{i}" for i in range(6))
    with Sandbox(pol.load(str(ws))) as box:
        compare = f"cat {beats} > a 2>&1; sleep 0.5; cat {beats} > b 2>&1; cmp -s a b"
        hop = f"for b in {beats}; do ./hopper $b </dev/null >/dev/null 2>&1 & done"
        started = box.exec_alone(f"{hop}; sleep 0.3; {compare} || echo hopping")
        assert started.text == "hopping\n", started.text
        for _ in range(5):  # the job ends as they start: the reset meets them young
            box.exec_alone(hop)
            after = box.exec_alone(f"{compare} && echo still")
            assert after.text == "still\n", after.text  # none moved after the reset


def test_a_job_cannot_leave_files_in_dev_or_sys_for_the_next(home_ws: tuple[Path, Path]) -> None:
    """Found by attacking warm sandboxes: /dev and the tmpfs over the host's
    interfaces were writable and the reset does not empty them; a job pointed
    /dev/stderr at a file of its own, and the next job's errors went there.  Both
    are read-only now.  The twins: /dev/shm and a new pty work as ever."""
    _, ws = home_ws
    with Sandbox(pol.load(str(ws))) as box:
        plant = box.exec_alone(
            "ln -sf $PWD/caught /dev/stderr 2>&1; touch /sys/class/net/note 2>&1; "
            "echo x > /dev/shm/mine && cat /dev/shm/mine; "
            "python3 -c 'import os; os.openpty(); print(\"pty\")'"
        )
        assert plant.text.count("Read-only file system") == 2, plant.text
        assert plant.text.endswith("x\npty\n"), plant.text
        box.exec_alone("echo secret > /dev/stderr")
    assert not (ws / "caught").exists()


POSIX_QUEUE = (
    "import ctypes, os, sys; libc = ctypes.CDLL(None, use_errno=True); "
    "fd = libc.mq_open(b'/corral-left', os.O_RDWR | (os.O_CREAT if sys.argv[1] == 'make' else 0),"
    " 0o600, None); print('queue', 'found' if fd >= 0 else os.strerror(ctypes.get_errno()))"
)


def test_a_job_leaves_no_ipc_object_or_run_file_for_the_next(home_ws: tuple[Path, Path]) -> None:
    """System V segments, queues and semaphores, a POSIX message queue and a file
    in /run outlive their process; a reset removes them all, as a new sandbox
    would not have them.  The twin: within the job they exist and are found."""
    _, ws = home_ws
    (ws / "mq.py").write_text(POSIX_QUEUE)
    with Sandbox(pol.load(str(ws))) as box:
        first = box.exec_alone(
            "ipcmk -M 4096 -Q -S 1 >/dev/null && ipcs -m -q -s | grep -c '^0x'; "
            "python3 mq.py make; python3 mq.py open; mkdir -p /run/user/0; echo x > /run/left; "
            "echo y > /run/user/0/left; ls /run /dev/mqueue"
        ).text
        assert first.split("\n")[:3] == ["3", "queue found", "queue found"], first
        assert "left" in first and "corral-left" in first, first
        after = box.exec_alone(
            "ipcs -m -q -s | grep -c '^0x'; python3 mq.py open; ls -A /run /dev/mqueue"
        ).text
        assert after.split("\n")[:2] == ["0", "queue No such file or directory"], after
        assert "left" not in after and "user" not in after, after
        assert "corral" in after  # corral's own, read-only, stays (the agent is bound there)
        # the next job can make its own again
        assert box.exec_alone("ipcmk -Q >/dev/null && python3 mq.py make").text == "queue found\n"


def test_no_command_can_write_into_the_agent_or_replace_corrals_files(
    home_ws: tuple[Path, Path],
) -> None:
    """The agent is the sandbox's pid 1 (no bwrap init above it) and undumpable: a
    command (same uid) cannot open its memory to write itself in and outlive the
    reset.  /run/corral is a read-only mount: it cannot be renamed away and
    refilled.  The twins: a command opens its own memory, and the rest of /run
    is writable and renamable."""
    _, ws = home_ws
    probe = (
        "import sys\n"
        "def mem(pid):\n"
        "    try:\n"
        "        open(f'/proc/{pid}/mem', 'r+b', buffering=0).close(); return 'open'\n"
        "    except OSError as e:\n"
        "        return e.strerror\n"
        "argv = open('/proc/1/cmdline', 'rb').read().split(b'\\0')\n"
        "print(argv[-2].decode() if b'bwrap' not in argv[0] else 'bwrap')\n"
        "print(mem(1)); print(mem('self'))\n"
    )
    (ws / "probe.py").write_text(probe)
    with Sandbox(pol.load(str(ws))) as box:
        r = box.exec_alone(["python3", "probe.py"])
        assert r.text.split("\n")[:3] == ["/run/corral/agent.py", "Permission denied", "open"]
        moved = box.exec_alone(
            "mv /run/corral /run/gone 2>&1; touch /run/corral/x 2>&1; "
            "mkdir /run/mine && mv /run/mine /run/moved && echo renamed"
        ).text
        assert "Device or resource busy" in moved and "Read-only file system" in moved, moved
        assert moved.endswith("renamed\n"), moved
        # nor end it with a signal (as pid 1 it gets only those it handles; SIGINT
        # it ignores), while a command's own child still dies of one (the twin; in the
        # foreground, since a shell without job control may ignore SIGINT in a
        # background job before the signal arrives)
        killed = box.exec_alone("kill -INT 1; sh -c 'kill -INT $$; sleep 5'; echo $?")
        assert killed.text == "130\n", killed.text
        assert box.exec_alone(["true"]).exit_code == 0  # the agent still serves


def test_a_tier_without_its_own_pid_namespace_is_never_reset(home_ws: tuple[Path, Path]) -> None:
    """landlock's sandbox shares the host's processes: resetting it would mean
    killing what is not its own, so it is refused (its twin, namespace, above)."""
    from corral import tiers
    from corral.sandbox import SandboxError

    health = tiers.get("landlock").health()
    if not health.available:
        pytest.skip(f"landlock: {health.reason}")
    _, ws = home_ws
    with Sandbox(pol.load(str(ws)), tier="landlock") as box:
        assert box.exec(["true"]).exit_code == 0
        with pytest.raises(SandboxError, match="cannot be reset"):
            box.reset()
        with pytest.raises(SandboxError, match="cannot be reset"):
            box.exec_alone(["true"])


def test_async_exec_alone_and_reset(home_ws: tuple[Path, Path]) -> None:
    import asyncio

    _, ws = home_ws

    async def main() -> tuple[bytes, dict[str, int], str]:
        async with AsyncSandbox(pol.load(str(ws))) as box:
            r = await box.exec_alone("echo a; echo b >&2; touch /tmp/t")
            await box.exec("touch /dev/shm/u")
            gone = await box.reset()
            left = (await box.exec("ls -A /tmp /dev/shm")).text
            return r.stdout, gone, left

    out, gone, left = asyncio.run(main())
    assert out == b"a\nb\n"  # one stream, in order
    assert gone["removed"] == 1 and "t\n" not in left and "u" not in left, left


def test_a_command_the_close_killed_keeps_its_time_and_output(
    home_ws: tuple[Path, Path], tier: TierCase
) -> None:
    """An exec still running (in another thread) at close() was reported with
    duration 0.000 and no output (found by trying corral as a new user); the
    twin, one that finished first, keeps both as before."""
    _, ws = home_ws
    box = Sandbox(pol.load(str(ws)), **tier.api)
    done = box.exec("echo early")
    said = threading.Event()
    got: list[ExecResult] = []
    worker = threading.Thread(
        target=lambda: got.append(box.exec("echo hi; sleep 30", on_stdout=lambda _: said.set()))
    )
    worker.start()
    assert said.wait(30)
    time.sleep(0.5)
    box.close()
    worker.join(30)
    assert done.exit_code == 0 and done.stdout == b"early\n" and done.duration > 0
    (r,) = got
    assert r.exit_code == 128 + signal.SIGKILL and r.stdout == b"hi\n", r
    assert 0.4 < r.duration < 30
