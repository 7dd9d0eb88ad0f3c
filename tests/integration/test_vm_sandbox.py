"""``Sandbox(tier="microvm")`` on a real guest: one VM per sandbox with corral's agent
inside, started on first use, started again after it died, gone after close().

In-process as root, like the other Sandbox API tests.  The first call boots the
guest and starts the agent's Python (5 to 10 s under TCG).
"""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT_BASE, pids_matching, wait_for
from test_network import Origin
from test_vm import WHY_NOT

from corral import policy as pol
from corral.sandbox import AsyncSandbox, PathDenied, Sandbox
from corral.vm import guest

if WHY_NOT:
    pytest.skip(f"microvm cannot run here: {WHY_NOT}", allow_module_level=True)

SECRET = "vm-sandbox-secret-5d2e"


def how_it_started(sb: Sandbox) -> str:
    """The VM's start line in the tier's description: restored or booted, and why."""
    return "\n".join(sb.plan.strategy.describe())


def our_qemus() -> list[int]:
    """QEMU processes of sandboxes this test process started (named after its pid)."""
    return pids_matching(f"qemu-system-x86_64 -name corral-vm-{os.getpid()}-")


def huge_pages_off(pid: int) -> bool:
    """Whether the process has transparent huge pages turned off (PR_SET_THP_DISABLE)."""
    with open(f"/proc/{pid}/status", encoding="utf-8") as fh:
        return any(line.split() == ["THP_enabled:", "0"] for line in fh)


@pytest.fixture
def home_ws(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    base = ROOT_BASE / ("vmapi-" + uuid.uuid4().hex[:10])
    home, ws, state = base / "home", base / "ws", base / "state"
    for d in (home, ws, state):
        d.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    # one cache for the session: the initramfs built and the accelerator probed once
    monkeypatch.setenv("XDG_CACHE_HOME", str(ROOT_BASE / "vm-cache-api"))
    try:
        yield home, ws
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def test_exec_spawn_files_and_close(home_ws: tuple[Path, Path]) -> None:
    home, ws = home_ws
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_rsa").write_text(SECRET)
    sb = Sandbox(pol.load(str(ws)), tier="microvm", log=False)
    try:
        assert sb.starts == 0 and not our_qemus()  # lazy: nothing booted yet
        r = sb.exec("cat; echo out; echo err >&2; exit 3", stdin="in\n")
        assert (r.exit_code, r.stdout, r.stderr) == (3, b"in\nout\n", b"err\n")
        assert sb.starts == 1 and our_qemus()
        assert all(huge_pages_off(pid) for pid in our_qemus())  # RSS: touched pages only
        assert sb.exec(["no-such-command"]).exit_code == 127
        assert sb.exec("uname -r").stdout.decode().strip() != os.uname().release  # own kernel
        proc = sb.spawn("echo started; sleep 100")
        assert wait_for(lambda: proc.read_output()[0] == b"started\n", 30)
        proc.kill(signal.SIGKILL)
        assert proc.wait(timeout=30).exit_code == 128 + signal.SIGKILL
        sb.files.write("sub/notes.txt", "hello")  # parents made in the workspace
        assert (ws / "sub" / "notes.txt").read_text() == "hello"  # landed on the host
        assert sb.files.read_text("sub/notes.txt") == "hello"
        assert [e["name"] for e in sb.files.list("sub")] == ["notes.txt"]
        assert sb.files.exists("sub/notes.txt") and not sb.files.exists("nope")
        with pytest.raises(PathDenied):
            sb.files.read(str(home / ".ssh" / "id_rsa"))  # the deny...
        with pytest.raises(PathDenied):
            sb.files.write("/etc/corral-vm-test", "x")
        assert not Path("/etc/corral-vm-test").exists()
        r = sb.exec(f"cat {home}/.ssh/id_rsa || echo refused")
        assert SECRET.encode() not in r.stdout and b"refused" in r.stdout
        assert "tier: microvm" in sb.describe()
    finally:
        sb.close()
    assert wait_for(lambda: not our_qemus(), 10)  # close() removed the VM


def _tool(path: Path, says: str) -> None:
    path.write_text(f"#!/bin/sh\necho {says}\n")
    path.chmod(0o755)


def test_commands_are_found_on_path_as_a_shell_would(
    home_ws: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guest's agent remembers, for PATH_MEMORY seconds (60; 2 here), that a
    directory of the read-only root lacked a name (each lookup there is a round trip
    to QEMU): a tool the command makes in a writable directory in front is found at
    once, and one the host adds to a read-only directory in front once the memory
    has gone."""
    monkeypatch.setattr(guest, "PATH_MEMORY", 2.0)
    home, ws = home_ws
    tools, front = home.parent / "tools", home.parent / "front"
    tools.mkdir()
    front.mkdir()
    _tool(tools / "hello", "tools")
    policy = pol.load(str(ws))
    policy.env.set_values["PATH"] = f"{ws}/bin:{front}:{tools}:/usr/bin:/bin"
    with Sandbox(policy, tier="microvm", log=False) as sb:
        assert sb.exec(["hello"]).stdout == b"tools\n"
        made = (
            "mkdir bin && printf '#!/bin/sh\\necho workspace\\n' > bin/hello && chmod +x bin/hello"
        )
        assert sb.exec(made).exit_code == 0
        assert sb.exec(["hello"]).stdout == b"workspace\n"  # in front, writable: found at once
        own_path = {"PATH": f"{tools}:/usr/bin:/bin"}  # the command's own PATH is the one
        assert sb.exec(["hello"], env=own_path).stdout == b"tools\n"
        assert sb.exec("rm bin/hello").exit_code == 0
        assert sb.exec(["hello"]).stdout == b"tools\n"
        _tool(front / "hello", "front")  # the host's change, in a read-only directory
        started = time.monotonic()
        assert wait_for(lambda: sb.exec(["hello"]).stdout == b"front\n", 10)
        assert time.monotonic() - started < 4
        assert sb.exec(["no-such-tool"]).exit_code == 127


@pytest.mark.slow
def test_a_dead_vm_is_started_again_on_the_next_call(home_ws: tuple[Path, Path]) -> None:
    _, ws = home_ws
    with Sandbox(pol.load(str(ws)), tier="microvm", log=False) as sb:
        assert sb.exec("echo one > one.txt").exit_code == 0
        for pid in our_qemus():
            try:
                os.kill(pid, signal.SIGKILL)  # the VM dies from outside
            except ProcessLookupError:
                pass  # bubblewrap and QEMU go together
        assert wait_for(lambda: not our_qemus(), 10)
        assert wait_for(lambda: not sb._alive, 10)  # its agent's channel ended
        r = sb.exec("cat one.txt")  # a fresh VM, the same workspace
        assert (r.exit_code, r.stdout) == (0, b"one\n")
        assert sb.starts == 2
    assert wait_for(lambda: not our_qemus(), 10)


@pytest.mark.slow
def test_a_sandbox_starts_from_the_saved_state_with_the_same_decision(
    home_ws: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    home, ws = home_ws
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_rsa").write_text(SECRET)
    with Sandbox(pol.load(str(ws)), tier="microvm", log=False) as first:  # fills the cache
        assert first.exec("true").exit_code == 0
    own = ws.parent / "own-cache" / "corral" / "vm"
    own.mkdir(parents=True)
    for entry in (ROOT_BASE / "vm-cache-api" / "corral" / "vm").glob("*"):
        if entry.name.startswith(("initramfs-", "accel-")) and ".tmp" not in entry.name:
            (own / entry.name).write_bytes(entry.read_bytes())
    monkeypatch.setenv("XDG_CACHE_HOME", str(ws.parent / "own-cache"))  # no state yet
    with Sandbox(pol.load(str(ws)), tier="microvm", log=False) as saving:
        assert saving.exec("true").exit_code == 0
        assert "start: cold boot: no saved state" in how_it_started(saving)  # and saved it
    assert len(list(own.glob("state-*"))) == 1
    with Sandbox(pol.load(str(ws)), tier="microvm", log=False) as sb:
        r = sb.exec(f"echo landed > landed.txt; cat {home}/.ssh/id_rsa || echo refused")
        assert "start: warm start: restore" in how_it_started(sb)
        assert SECRET.encode() not in r.stdout and b"refused" in r.stdout
        assert (ws / "landed.txt").read_text() == "landed\n"  # the twin: writes land
        assert sb.files.read_text("landed.txt") == "landed\n"
    assert wait_for(lambda: not our_qemus(), 10)


def test_the_agent_started_before_the_state_runs_as_any_command_would(
    home_ws: tuple[Path, Path],
) -> None:
    """A Sandbox's machine starts its agent in the init, before the state is saved:
    it must end up where the init puts any command (the caller's ids, no other
    group, only the run's environment, the run's directory, the pids cgroup)
    and see the same decision: the secret refused, the workspace written."""
    home, ws = home_ws
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_rsa").write_text(SECRET)
    policy = pol.load(str(ws))
    policy.limits.pids = 77
    policy.env.set_values["ONLY_THIS"] = "x\ny"
    with Sandbox(policy, tier="microvm", log=False) as sb:
        r = sb.exec(
            "id -u; id -g; id -G; pwd; env | grep -c -v -e '^[A-Za-z_][A-Za-z0-9_]*=' -e '^y$';"
            " printenv ONLY_THIS; cat /proc/self/cgroup; cat /sys/fs/cgroup/corral/pids.max;"
            f" echo landed > landed.txt; cat {home}/.ssh/id_rsa || echo refused"
        )
        assert "agent: corral's, started by the guest's init" in how_it_started(sb)
        assert "LD_LIBRARY_PATH" not in sb.exec("env").stdout.decode()
    lines = r.stdout.decode().splitlines()
    ids = str(os.getuid()), str(os.getgid()), str(os.getgid())
    assert lines[:5] == [*ids, str(ws), "0"], r.stdout
    assert lines[5:9] == ["x", "y", "0::/corral", "77"], r.stdout
    assert SECRET.encode() not in r.stdout and lines[-1] == "refused"
    assert (ws / "landed.txt").read_text() == "landed\n"  # the twin: writes land
    assert wait_for(lambda: not our_qemus(), 10)


def test_with_a_network_the_waiting_agent_serves_the_relay_itself(
    home_ws: tuple[Path, Path],
) -> None:
    """A Sandbox with a network restores a machine whose agent waited since the
    boot: after the go line it is the guest's relay too (the door, the proxy
    ports, the resolver, host services at their own address), so no Python
    starts after the restore.  The origin allowed is reached through the proxy
    and at its own address; the port next to it is refused both ways."""
    _, ws = home_ws
    ok, other = Origin(), Origin()
    policy = pol.load(str(ws))
    policy.network.mode = "proxy"
    policy.network.allow = [f"127.0.0.1:{ok.port}"]
    direct = "curl -sS --noproxy '*' --max-time 20"
    proxied = "curl -sS --noproxy '' --max-time 20"
    try:
        for _ in range(2):  # the first boots and saves this machine; the second restores
            with Sandbox(policy, tier="microvm", log=False) as sb:
                r = sb.exec(
                    f"{proxied} http://127.0.0.1:{ok.port}/via-proxy; echo; "
                    f"{direct} http://127.0.0.1:{ok.port}/direct; echo; "
                    f"{proxied} http://127.0.0.1:{other.port}/denied; echo; "
                    f"{direct} http://127.0.0.1:{other.port}/denied || echo direct=refused"
                )
                started = how_it_started(sb)
    finally:
        ok.close()
        other.close()
    out = r.stdout.decode()
    assert "agent: corral's, started by the guest's init" in started, started
    assert "warm start: restore" in started, started
    assert out.count("hello from origin") == 2, out  # both ways in, for the allowed port
    assert [path for _, path in ok.hits][-2:] == ["/via-proxy", "/direct"]
    assert '"decision":"deny"' in out.replace(" ", "") and "direct=refused" in out, out
    assert other.hits == []
    assert wait_for(lambda: not our_qemus(), 10)


# The guest's root takes the agent's end of its channel (fd 1 of the agent, which
# spawned this command, taken with pidfd_getfd) and writes its own frames there
# while the agent is quiet; the agent's own frames follow once this command ends.
INJECT = """
import ctypes, json, os, struct, sys, time
def frame(header, payload=b""):
    data = json.dumps(header).encode()
    return struct.pack("!II", len(data), len(payload)) + data + payload
if sys.argv[1] == "out":  # frames of output for a command of the host's, past its limit
    data = frame({"ev": "out", "id": int(sys.argv[2]), "fd": 1}, b"x" * 60000) * int(sys.argv[3])
elif sys.argv[1] == "deep":  # nested deeper than Python's JSON parser goes
    data = struct.pack("!II", 100000, 0) + b"[" * 100000
else:
    data = bytes.fromhex(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
channel = libc.syscall(438, os.pidfd_open(os.getppid()), 1, 0)  # pidfd_getfd(2)
if channel < 0:
    sys.exit(f"pidfd_getfd: {os.strerror(ctypes.get_errno())}")
view = memoryview(data)
while view:
    view = view[os.write(channel, view):]
"""


def raw_frame(
    header: bytes, payload: bytes = b"", size: int | None = None, announce: int | None = None
) -> str:
    length = len(header) if size is None else size
    sent = len(payload) if announce is None else announce
    return (struct.pack("!II", length, sent) + header + payload).hex()


# Frames the guest's root forges onto the agent's channel, each of which must end
# that VM as malformed.  The default run tries the last (the newest finding); the
# others boot a VM each (some 15 s here) and are marked slow.
FORGED = {
    "not-an-object": ["raw", raw_frame(b"[]")],
    "no-number": ["raw", raw_frame(b'{"ev":"done","id":"x"}')],
    "deep": ["deep"],
    "2GiB-header": ["raw", raw_frame(b"{", size=1 << 31)],
    # a reply to no request, announcing 4 GiB (once read whole: 8 GiB held)
    "4GiB-reply": ["raw", raw_frame(b'{"ev":"done","id":99999}', announce=0xFFFFFFFF)],
}


def _forging_sandbox(ws: Path) -> Sandbox:
    if os.geteuid() != 0:
        pytest.skip("taking the agent's channel needs the guest's root (corral run as root)")
    (ws / "inject.py").write_text(INJECT)
    policy = pol.load(str(ws))
    policy.limits.output = 1 << 20
    return Sandbox(policy, tier="microvm", log=False)


def _forged_frames_end_the_vm(sb: Sandbox, frames: list[list[str]]) -> None:
    for bad in frames:
        errors = len(sb.errors)
        inject = sb.spawn(["python3", "inject.py", *bad])
        assert inject.wait(timeout=60).exit_code == 128 + signal.SIGKILL  # its VM ended
        assert len(sb.errors) == errors + 1 and "malformed" in sb.errors[-1], sb.errors
        assert sb.exec("echo after").stdout == b"after\n"  # a fresh VM


def test_frames_the_guests_root_forges_cannot_hang_crash_or_flood_the_host(
    home_ws: tuple[Path, Path],
) -> None:
    """Whatever bytes reach the agent's channel, the host's reader neither dies (every
    later call hung) nor waits for a frame it will not hold, and keeps no more of a
    command's output than the policy's limit: a malformed frame ends that VM, one
    line in ``errors``, and the next call starts a fresh one.  Twins: the command's
    own output arrives, and the sandbox goes on."""
    with _forging_sandbox(home_ws[1]) as sb:
        proc = sb.spawn("echo mine; sleep 100")
        assert wait_for(lambda: proc.read_output()[0] == b"mine\n", 30)
        flood = sb.exec(["python3", "inject.py", "out", str(proc.id), "40"])
        assert flood.exit_code == 0, flood
        proc.kill()
        r = proc.wait(timeout=30)
        assert r.stdout.startswith(b"mine\n") and len(r.stdout) <= 1 << 20 and r.truncated
        _forged_frames_end_the_vm(sb, [FORGED["4GiB-reply"]])
    assert wait_for(lambda: not our_qemus(), 10)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in FORGED if n != "4GiB-reply"])
def test_every_malformed_frame_ends_only_its_vm(home_ws: tuple[Path, Path], name: str) -> None:
    with _forging_sandbox(home_ws[1]) as sb:
        _forged_frames_end_the_vm(sb, [FORGED[name]])
    assert wait_for(lambda: not our_qemus(), 10)


# The guest's root writes a frame onto the stdout port (a node it makes in /dev):
# on a Sandbox's machine that port is nobody's (the agent's stdout is its channel).
ON_STDOUT_PORT = """
import glob, json, os, struct, sys, time
header = json.dumps({"ev": "out", "id": int(sys.argv[1]), "fd": 1}).encode()
frame = struct.pack("!II", len(header), 6) + header + b"FORGED"
for d in glob.glob("/sys/class/virtio-ports/*"):
    if open(d + "/name").read().strip() == "corral.stdout":
        major, minor = map(int, open(d + "/dev").read().split(":"))
        os.mknod("/dev/corral-stdout", 0o20600, os.makedev(major, minor))
        os.write(os.open("/dev/corral-stdout", os.O_WRONLY), frame)
        time.sleep(2)  # long enough for the host to relay it, were it relayed
        sys.exit(0)
sys.exit("no stdout port")
"""


def test_the_unused_stdout_port_does_not_reach_the_agents_channel(
    home_ws: tuple[Path, Path],
) -> None:
    """The runner read the stdout port into the Sandbox's socket, the agent's
    channel, beside QEMU's own writes of the agent's frames: what the guest's
    root wrote there was taken as the agent's words (or split one of its
    frames).  Twin: the command's own output arrives."""
    if os.geteuid() != 0:
        pytest.skip("writing on a port needs the guest's root (corral run as root)")
    _, ws = home_ws
    (ws / "port.py").write_text(ON_STDOUT_PORT)
    with Sandbox(pol.load(str(ws)), tier="microvm", log=False) as sb:
        proc = sb.spawn("echo mine; sleep 100")
        assert wait_for(lambda: proc.read_output()[0] == b"mine\n", 30)
        r = sb.exec(["python3", "port.py", str(proc.id)])
        assert r.exit_code == 0, r
        proc.kill()
        assert proc.wait(timeout=30).stdout == b"mine\n" and not sb.errors


@pytest.mark.slow  # (some 20 s: its VM waits out a timeout)
def test_a_stopped_agent_does_not_hold_exec_past_its_timeout(
    home_ws: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a guest the agent is not its pid namespace's init: a command of its uid
    can stop it (SIGSTOP), and the agent's own watchdog stops with it.  exec()
    then waited for ever; past its timeout and a grace it gives up on that VM
    (timed out, one line in ``errors``), and the next call starts a fresh one.
    Twin: a command within its timeout ends as it should."""
    import corral.sandbox

    monkeypatch.setattr(corral.sandbox, "AGENT_GRACE", 3.0)
    _, ws = home_ws
    with Sandbox(pol.load(str(ws)), tier="microvm", log=False) as sb:
        assert sb.exec("echo within", timeout=30).stdout == b"within\n"
        r = sb.exec("kill -STOP $PPID; sleep 1", timeout=2)
        assert (r.exit_code, r.timed_out) == (124, True)
        assert len(sb.errors) == 1 and "did not end" in sb.errors[0], sb.errors
        assert sb.exec("echo after", timeout=30).stdout == b"after\n" and sb.starts == 2
    assert wait_for(lambda: not our_qemus(), 10)

    async def stopped_from_a_loop() -> None:  # AsyncSandbox.exec gives up the same way
        async with AsyncSandbox(pol.load(str(ws)), tier="microvm", log=False) as sb:
            r = await sb.exec("kill -STOP $PPID; sleep 1", timeout=2)
            assert (r.exit_code, r.timed_out) == (124, True) and len(sb.errors) == 1
            assert (await sb.exec("echo after", timeout=30)).stdout == b"after\n"

    asyncio.run(asyncio.wait_for(stopped_from_a_loop(), 120))
    assert wait_for(lambda: not our_qemus(), 10)
