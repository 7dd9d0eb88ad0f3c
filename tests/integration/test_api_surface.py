"""The Python API: one activity record per sandbox, files.write's parents, corral's
words from the agent, AsyncSandbox's surface and an event loop that never blocks.

Each test runs a script as the user under test (root, and the unprivileged user
through setpriv) on every tier it applies to."""

from __future__ import annotations

import inspect
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import Corral

from corral.errors import PolicyError
from corral.policy import Policy
from corral.sandbox import (
    AsyncFiles,
    AsyncProcess,
    AsyncSandbox,
    Files,
    Process,
    Sandbox,
)


def script(
    c: Corral, ws: Path, code: str, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``code`` in this user's Python, with ``ws`` and the tier's Sandbox keywords."""
    api = c.tier.api if c.tier is not None else {}
    head = f"import json, os, sys\nWS = {str(ws)!r}\nAPI = {api!r}\nos.chdir(WS)\n"
    python = c.argv([])[:-2]  # [setpriv ...] python, without "-m corral"
    return subprocess.run(
        [*python, "-c", head + code],
        cwd=ws,
        env=c.env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def records(c: Corral, ws: Path) -> list[dict[str, Any]]:  # runs.jsonl, as JSON
    out = c.run(["log", "--json", "-n", "0"], cwd=ws)
    assert out.returncode == 0
    path = c.state / "corral" / "runs.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_sandbox_is_one_record_with_its_commands(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    r = script(
        c,
        ws,
        """
from corral import policy as pol
from corral.sandbox import Sandbox
with Sandbox(pol.load(WS), **API) as sb:
    print(sb.exec("exit 3").exit_code, sb.exec(["no-such-command"]).exit_code, flush=True)
    sb.exec(["true"])
    print(sb.run_id)
with Sandbox(pol.load(WS), log=False, **API) as quiet:  # the twin: asked not to record
    quiet.exec(["true"])
""",
    )
    assert r.returncode == 0, r.stderr
    codes, run_id = r.stdout.split("\n")[:2]
    assert codes == "3 127"
    found = records(c, ws)
    assert len(found) == 1, found
    rec = found[0]
    assert rec["run_id"] == run_id and rec["kind"] == "sandbox" and rec["execs"] == 3
    assert rec["commands"] == [
        {
            "argv": ["/bin/sh", "-c", "exit 3"],
            "exit": 3,
            "duration": rec["commands"][0]["duration"],
        },
        {"argv": ["no-such-command"], "exit": 127, "duration": rec["commands"][1]["duration"]},
        {"argv": ["true"], "exit": 0, "duration": rec["commands"][2]["duration"]},
    ]
    for key in ("start", "end", "tier", "policy_digest", "workspace", "bounds", "denials"):
        assert key in rec, key
    text = c.run(["log", "-n", "1"], cwd=ws).stdout.decode()
    assert "[sandbox: 3 command(s)]" in text


def test_async_sandbox_is_recorded_too(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    r = script(
        c,
        ws,
        """
import asyncio
from corral import policy as pol
from corral.sandbox import AsyncSandbox
async def go():
    async with AsyncSandbox(pol.load(WS), **API) as sb:
        await sb.exec(["true"])
        p = await sb.spawn(["sleep", "30"])
        await p.kill()
        print((await p.wait()).exit_code)
asyncio.run(go())
""",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "137"
    (rec,) = records(c, ws)
    assert rec["kind"] == "sandbox" and rec["execs"] == 2


def test_files_write_makes_parents_only_inside_and_never_through_a_link(
    tsandbox: tuple[Corral, Path],
) -> None:
    c, ws = tsandbox
    outside = c.base / "outside"
    outside.mkdir()
    (ws / "sub").mkdir()
    (ws / "out").symlink_to(outside)  # a link out of the workspace
    (ws / "in").symlink_to(ws / "sub")  # a link within it
    c.chown(ws, outside)
    r = script(
        c,
        ws,
        """
from corral import policy as pol
from corral.sandbox import Sandbox, PathDenied
with Sandbox(pol.load(WS), **API) as sb:
    sb.files.write("a/b/c.txt", "deep")
    sb.files.write("sub/new/x.txt", "ok")
    print(sb.files.read_text("a/b/c.txt"), sb.files.exists("sub/new"), flush=True)
    for path in ("out/new/x.txt", "in/fresh/x.txt", "/etc/corral-made/x.txt"):
        try:
            sb.files.write(path, "no")
            print(path, "written")
        except (PathDenied, FileNotFoundError) as exc:
            print(path, type(exc).__name__)
""",
    )
    assert r.returncode == 0, r.stderr
    said = r.stdout.splitlines()
    assert said[0] == "deep True"
    assert (ws / "a" / "b" / "c.txt").read_text() == "deep"  # the allow twin, seen outside
    assert (ws / "sub" / "new" / "x.txt").read_text() == "ok"
    assert said[1] == "out/new/x.txt PathDenied" and not (outside / "new").exists()
    assert said[2] == "in/fresh/x.txt PathDenied" and not (ws / "sub" / "fresh").exists()
    assert said[3] in (
        "/etc/corral-made/x.txt FileNotFoundError",
        "/etc/corral-made/x.txt PathDenied",
    )
    assert not Path("/etc/corral-made").exists()


def test_the_agent_speaks_corrals_words(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    (ws / "corral.toml").write_text('[limits]\ntimeout = "1s"\n')
    c.chown(ws)
    r = script(
        c,
        ws,
        """
from corral import policy as pol
from corral.sandbox import Sandbox
with Sandbox(pol.load(WS), **API) as sb:
    for argv, cwd in ((["no-such-command"], None), (["pwd"], "no-such-dir"), (["pwd"], None)):
        res = sb.exec(argv, cwd=cwd)
        print(res.exit_code, res.stderr.decode().strip() or res.stdout.decode().strip())
    slow = sb.exec(["sleep", "5"])  # the policy's timeout bounds each command
    print(slow.exit_code, slow.timed_out, sb.exec(["sleep", "5"], timeout=0.2).timed_out)
""",
    )
    assert r.returncode == 0, r.stderr
    missing, no_cwd, ok, slow = r.stdout.splitlines()
    assert missing.startswith("127 corral: no-such-command: command not found in the sandbox")
    gone = f"{ws}/no-such-dir: No such file or directory"
    assert no_cwd == f"126 corral: cannot enter the working directory {gone}"
    assert ok == f"0 {ws}"  # the allow twin
    assert slow == "124 True True"


def test_allow_without_a_network_mode_is_refused_from_python(tmp_path: Path) -> None:
    policy = Policy(str(tmp_path))
    policy.network.allow = ["pypi.org"]
    with pytest.raises(PolicyError, match="has no effect with mode"):
        Sandbox(policy, tier="none")  # refused before any tier is even chosen


def test_async_sandbox_has_the_sync_surface() -> None:
    def public(cls: type) -> set[str]:
        return {n for n in dir(cls) if not n.startswith("_")}

    assert public(Sandbox) - {"begin"} <= public(AsyncSandbox)
    instance_attrs = {"policy", "tier", "run_id", "plan", "denials", "errors", "files", "notes"}
    assert instance_attrs <= public(AsyncSandbox) | {"files"}
    for name in ("exec", "spawn", "close", "start", "wait", "read", "write", "list"):
        assert inspect.iscoroutinefunction(getattr(AsyncSandbox, name)), name
    assert public(Files) - {"sb"} <= public(AsyncFiles)
    for name in public(Files) - {"sb"}:
        assert inspect.iscoroutinefunction(getattr(AsyncFiles, name)), name
    assert public(Process) - {"sandbox", "add_start_callback"} <= public(AsyncProcess)
    for name in ("wait", "kill", "write_stdin", "close_stdin"):
        assert inspect.iscoroutinefunction(getattr(AsyncProcess, name)), name


# Two detectors on the loop's thread.  Deterministic: every primitive that waits
# (a blocking send or receive, a queue or event wait, waitpid, sleep, starting or
# closing a Sandbox) is wrapped to note a call made from the loop's thread.  Timed,
# as a backstop: asyncio's debug mode logs any callback longer than 0.25 s (wall
# clock: lower would report a busy machine, not corral).  The twin at the end
# blocks on purpose and must be caught by both.
LOOP_WATCH = """
import asyncio, logging, os, queue, socket, sys, threading, time
from corral import policy as pol
from corral.sandbox import AsyncSandbox, Sandbox
loop_thread = threading.get_ident()
seen = []
def can_wait(name, args):
    if name in ("sendall", "sendmsg", "recv"):  # asyncio's own sockets never block
        return args[0].getblocking()
    if name == "wait":  # Thread.start waits a moment for the new thread: not ours
        return sys._getframe(2).f_code.co_name != "start"
    return True
def watched(owner, name):
    real = getattr(owner, name)
    def call(*args, **kw):
        if threading.get_ident() == loop_thread and can_wait(name, args):
            seen.append(name)
        return real(*args, **kw)
    setattr(owner, name, call)
for owner, name in (
    (socket.socket, "sendall"), (socket.socket, "sendmsg"), (socket.socket, "recv"),
    (queue.Queue, "get"), (threading.Event, "wait"), (os, "waitpid"), (time, "sleep"),
    (Sandbox, "__init__"), (Sandbox, "close"), (Sandbox, "_start"), (Sandbox, "_ensure"),
):
    watched(owner, name)
slow = []
class Catch(logging.Handler):
    def emit(self, record):
        if "Executing" in record.getMessage():
            slow.append(record.getMessage()[:200])
logging.getLogger("asyncio").addHandler(Catch())
logging.getLogger("asyncio").setLevel(logging.WARNING)
policy = pol.load(WS)  # reading the policy file is the caller's business, not the loop's
async def go():
    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = 0.25
    async with AsyncSandbox(policy, **API) as sb:
        rs = await asyncio.gather(*(sb.exec(["echo", str(i)]) for i in range(20)))
        assert [r.stdout for r in rs] == [f"{i}\\n".encode() for i in range(20)]
        big = await sb.exec(["wc", "-c"], stdin=b"x" * (4 << 20))
        assert big.stdout.split()[0] == str(4 << 20).encode(), big
        p = await sb.spawn(["cat"])
        await p.write_stdin("hello")
        await p.close_stdin()
        assert (await p.wait()).stdout == b"hello"
        await sb.files.mkdir("d")
        await sb.files.write("d/e/f.txt", "x" * 100000)
        assert len(await sb.files.read("d/e/f.txt")) == 100000
        assert await sb.files.exists("d/e") and await sb.files.list("d")
        await sb.files.remove("d/e/f.txt")
        assert sb.processes() == [] and sb.describe()
    print("quiet", sorted(set(seen)), len(slow), slow)
    seen.clear()
    slow.clear()
    time.sleep(0.3)  # the twin: a blocking call on the loop is seen
    await asyncio.sleep(0)
    print("caught", seen, len(slow) > 0)
asyncio.run(go())
"""


def test_async_sandbox_never_blocks_the_event_loop(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    r = script(c, ws, LOOP_WATCH)
    assert r.returncode == 0, r.stderr
    quiet, caught = r.stdout.splitlines()[-2:]
    assert quiet == "quiet [] 0 []", r.stdout
    assert caught == "caught ['sleep'] True"


def test_large_replies_arrive_whole(tsandbox: tuple[Corral, Path]) -> None:
    """The agent's frames are written whole: gVisor's pipes take part of a large
    write, and a file read of 100 KB used to hang there."""
    c, ws = tsandbox
    r = script(
        c,
        ws,
        """
from corral import policy as pol
from corral.sandbox import Sandbox
with Sandbox(pol.load(WS), **API) as sb:
    sb.files.write("big.bin", bytes(range(256)) * 12000)
    data = sb.files.read("big.bin")
    out = sb.exec(["cat", "big.bin"]).stdout
    print(len(data), data == bytes(range(256)) * 12000, out == data)
""",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:3] == ["3072000", "True", "True"]


@pytest.mark.tiers("namespace", "landlock", why="the socket's send path; containers use the same")
def test_a_cancelled_large_write_leaves_the_sandbox_usable(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    r = script(
        c,
        ws,
        """
import asyncio
from corral import policy as pol
from corral.sandbox import AsyncSandbox
async def go():
    async with AsyncSandbox(pol.load(WS), **API) as sb:
        slow = await sb.spawn(["sh", "-c", "sleep 1; cat > /dev/null"])  # reads late
        try:  # far more than a socket buffer: sent in parts, cancelled on the way
            await asyncio.wait_for(slow.write_stdin(b"x" * (32 << 20)), 0.2)
        except asyncio.TimeoutError:
            pass
        r = await asyncio.wait_for(sb.exec(["echo", "still-usable"]), 30)
        print(r.stdout.decode().strip())
        await slow.kill()
asyncio.run(go())
""",
        timeout=90,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "still-usable"


def test_a_cancelled_or_interrupted_exec_kills_its_command(tsandbox: tuple[Corral, Path]) -> None:
    """An agent framework cancels a tool call (``wait_for``, a stop button) or the
    user presses Ctrl-C: the command was left running inside (found by trying
    corral as a new user).  Its process group is killed before the exec raises;
    the twins: an exec let finish returns its result, and the sandbox goes on."""
    c, ws = tsandbox
    r = script(
        c,
        ws,
        """
import asyncio, signal
from corral import policy as pol
from corral.sandbox import AsyncSandbox, Sandbox
PROBE = "pgrep -f '^sleep 30017$' >/dev/null && echo alive || echo none"  # (landlock: the
# host's processes are visible too: only this command's marker counts)
def alive(sb):
    return sb.exec(PROBE).stdout.decode().strip()
async def go():
    async with AsyncSandbox(pol.load(WS), **API) as sb:
        try:
            await asyncio.wait_for(sb.exec("sleep 30017 & sleep 30017"), 0.5)
        except asyncio.TimeoutError:
            pass
        await asyncio.sleep(0.5)
        left = (await sb.exec(PROBE)).stdout
        done = await sb.exec("sleep 0.2; echo done")
        print("async", left.decode().strip(), done.stdout.decode().strip())
asyncio.run(go())
def interrupt(*_):
    raise KeyboardInterrupt
with Sandbox(pol.load(WS), **API) as sb:
    signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        sb.exec("sleep 30017 & sleep 30017")
    except KeyboardInterrupt:
        pass
    import time; time.sleep(0.5)
    print("sync", alive(sb), sb.exec("echo done").stdout.decode().strip())
""",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["async none done", "sync none done"], r.stdout
