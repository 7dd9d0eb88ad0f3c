"""Escapes found from outside (issue 11), each with its allow twin, on every tier:
descriptors inherited from the caller, kernel tunables and host facts under
/proc and /sys, hard links planted in the workspace, traces left by undo."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import Corral, sees_host_root

# --- 1. descriptors --------------------------------------------------------------

# Runs inside: for each (directory fd, socket fd) pair named on the command line,
# create a file through the directory and send bytes on the socket.  TAG keeps a
# twin's evidence apart from the deny case's.
FD_PROBE = r"""
import os, sys
tag = sys.argv[1]
for pair in sys.argv[2:]:
    d, s = (int(n) for n in pair.split(","))
    try:
        os.close(os.open(f"{tag}-{d}", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=d))
        print(f"dir{d}=ok")
    except OSError as e:
        print(f"dir{d}=err:{e.errno}")
    try:
        os.write(s, f"{tag}-{s};".encode())
        print(f"sock{s}=ok")
    except OSError as e:
        print(f"sock{s}=err:{e.errno}")
"""

# low numbers (right above stdio, where bwrap's own status fd would go) and high ones
FD_PAIRS = [(3, 4), (40, 41)]


class Held:
    """A host directory and a connected socket the caller holds at chosen numbers."""

    def __init__(self, outside: Path, numbers: tuple[int, int]) -> None:
        self.outside = outside
        self.numbers = numbers
        # parked high in this process: the child moves them to their numbers
        self.dir_fd = fcntl.fcntl(
            os.open(outside, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC),
            fcntl.F_DUPFD_CLOEXEC,
            200,
        )
        ours, theirs = socket.socketpair()
        self.peer = ours
        self.seen = b""
        self.sock_fd = fcntl.fcntl(theirs.fileno(), fcntl.F_DUPFD_CLOEXEC, 200)
        theirs.close()

    def place(self) -> None:
        """In the child, before exec: the two descriptors at their numbers."""
        d, s = self.numbers
        os.dup2(self.dir_fd, d)
        os.dup2(self.sock_fd, s)

    def arrived(self) -> bytes:
        """Everything the sandbox managed to send through the socket so far."""
        self.peer.setblocking(False)
        try:
            while chunk := self.peer.recv(65536):
                self.seen += chunk
        except BlockingIOError:
            pass
        return self.seen

    def close(self) -> None:
        os.close(self.dir_fd)
        os.close(self.sock_fd)
        self.peer.close()


@contextmanager
def held(c: Corral, numbers: tuple[int, int]) -> Iterator[Held]:
    outside = c.base / f"outside-{uuid.uuid4().hex[:6]}"
    outside.mkdir()
    c.chown(outside)  # writable by the user under test: a denial is corral's doing
    h = Held(outside, numbers)
    try:
        yield h
    finally:
        h.close()


def run_holding(
    c: Corral, ws: Path, h: Held, args: list[str], timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    """``corral ARGS`` started by a program holding ``h``'s descriptors."""
    return subprocess.run(
        c.argv(args),
        cwd=ws,
        env=c.env(),
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
        close_fds=False,  # the caller's other descriptors come along too, as in real life
        preexec_fn=h.place,
    )


def probe(c: Corral, ws: Path) -> str:
    path = ws / "fdprobe.py"
    path.write_text(FD_PROBE)
    c.chown(path)
    return path.name


def lines(out: bytes) -> dict[str, str]:
    found = {}
    for line in out.decode(errors="replace").splitlines():
        name, eq, value = line.partition("=")
        if eq:
            found[name] = value
    return found


def assert_nothing_crossed(h: Held, out: bytes, tag: str) -> None:
    d, s = h.numbers
    got = lines(out)
    assert got.get(f"dir{d}") == f"err:{errno.EBADF}", out  # the probe ran; no such fd
    assert got.get(f"sock{s}") == f"err:{errno.EBADF}", out
    assert not (h.outside / f"{tag}-{d}").exists()  # nothing made outside through it
    assert f"{tag}-".encode() not in h.arrived()  # and nothing reached the host's socket


def assert_passed(c: Corral, h: Held, out: bytes, tag: str) -> None:
    """The socket asked for crossed; the directory, never passable, did not."""
    d, s = h.numbers
    got = lines(out)
    assert got.get(f"sock{s}") == "ok", out
    assert f"{tag}-{s};".encode() in h.arrived()
    assert got.get(f"dir{d}") == f"err:{errno.EBADF}", out
    assert not (h.outside / f"{tag}-{d}").exists()


def refuses_pass_fd(c: Corral) -> bool:
    """gVisor has no --preserve-fds: --pass-fd is refused there, with its reason."""
    return c.tier is not None and c.tier.id == "gvisor"


@pytest.mark.parametrize("numbers", FD_PAIRS, ids=["fds-3-4", "fds-40-41"])
def test_run_inherits_no_descriptor(
    tsandbox: tuple[Corral, Path], numbers: tuple[int, int]
) -> None:
    c, ws = tsandbox
    name = probe(c, ws)
    pair = f"{numbers[0]},{numbers[1]}"
    with held(c, numbers) as h:
        r = run_holding(c, ws, h, ["run", "-q", "--", "python3", name, "leak", pair])
        assert r.returncode == 0, r
        assert_nothing_crossed(h, r.stdout, "leak")
    with held(c, numbers) as h:  # allow twin: asked for by flag, the socket crosses
        flags = ["--pass-fd", str(numbers[1])]
        r = run_holding(c, ws, h, ["run", "-q", *flags, "--", "python3", name, "pass", pair])
        if refuses_pass_fd(c):
            assert r.returncode == 122 and b"cannot pass a descriptor" in r.stderr, r
            assert h.arrived() == b""
            return
        assert r.returncode == 0, r
        assert_passed(c, h, r.stdout, "pass")


def test_run_with_the_network_inherits_no_descriptor(tsandbox: tuple[Corral, Path]) -> None:
    """The relay sits between the sandbox's start and the command: nothing of the
    caller's, and none of the relay's own sockets, reaches the command."""
    c, ws = tsandbox
    name = probe(c, ws)
    numbers = (40, 41)
    with held(c, numbers) as h:
        r = run_holding(
            c, ws, h, ["run", "-q", "--allow", "127.0.0.1", "--", "python3", name, "leak", "40,41"]
        )
        assert r.returncode == 0, r
        assert_nothing_crossed(h, r.stdout, "leak")
    listing = c.sh(ws, "ls /proc/self/fd/ | sort -n | tr '\\n' ' '", "--allow", "127.0.0.1")
    assert listing.returncode == 0, listing
    # ls holds one descriptor of its own (the directory it lists): the fourth
    assert listing.stdout.split() == [b"0", b"1", b"2", b"3"], listing


def test_run_with_limits_inherits_no_descriptor(tsandbox: tuple[Corral, Path]) -> None:
    """With a cgroup to join the launcher forks instead of posix_spawn: that path
    closes by listing too (and so does the landlock tier's reaper path)."""
    c, ws = tsandbox
    name = probe(c, ws)
    with held(c, (40, 41)) as h:
        r = run_holding(
            c, ws, h, ["run", "-q", "--pids", "300", "--", "python3", name, "leak", "40,41"]
        )
        if r.returncode == 122 and b"limit" in r.stderr:
            pytest.skip(f"this host refuses the limit here: {r.stderr.decode().strip()}")
        assert r.returncode == 0, r
        assert_nothing_crossed(h, r.stdout, "leak")
    with held(c, (40, 41)) as h:  # twin
        flags = ["--pids", "300", "--pass-fd", "41"]
        r = run_holding(c, ws, h, ["run", "-q", *flags, "--", "python3", name, "pass", "40,41"])
        if refuses_pass_fd(c):
            assert r.returncode == 122, r
            return
        assert r.returncode == 0, r
        assert_passed(c, h, r.stdout, "pass")


def test_tier_none_inherits_no_descriptor(sandbox: tuple[Corral, Path]) -> None:
    """Even unconfined, a run hands over stdio only unless asked (the launcher's rule)."""
    c, ws = sandbox
    name = probe(c, ws)
    with held(c, (40, 41)) as h:
        r = run_holding(
            c, ws, h, ["run", "-q", "--tier", "none", "--", "python3", name, "leak", "40,41"]
        )
        assert r.returncode == 0, r
        got = lines(r.stdout)
        assert got["dir40"] == got["sock41"] == f"err:{errno.EBADF}", r
        assert h.arrived() == b""
    with held(c, (40, 41)) as h:  # twin
        flags = ["--tier", "none", "--pass-fd", "40", "--pass-fd", "41"]
        r = run_holding(c, ws, h, ["run", "-q", *flags, "--", "python3", name, "pass", "40,41"])
        assert r.returncode == 0, r
        assert lines(r.stdout)["sock41"] == "ok" and b"pass-41;" in h.arrived(), r


def test_run_pass_fd_is_checked(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    for bad, words in (("2", b"above 2"), ("x", b"above 2"), ("77", b"not an open descriptor")):
        r = c.run(["run", "-q", "--pass-fd", bad, "--", "true"], cwd=ws)
        assert r.returncode == 2 and words in r.stderr, r
    assert c.run(["run", "-q", "--", "true"], cwd=ws).returncode == 0  # twin


def host_file(c: Corral) -> Path:
    """A file outside the workspace the user under test may write: a write that
    does not happen is corral's doing."""
    outside = c.base / f"outside-{uuid.uuid4().hex[:6]}"
    outside.mkdir()
    (outside / "input.txt").write_text("ORIGINAL\n")
    c.chown(outside)
    return outside / "input.txt"


# Reopened through its magic link, a descriptor is a new open of the host's inode,
# with any mode the user may have: stdin redirected from a file was written.
REOPEN = "echo TAMPERED > /proc/self/fd/{n}; cat <&{n}"


def run_from(
    c: Corral, ws: Path, path: Path, args: list[str], fd: int = 0
) -> subprocess.CompletedProcess[bytes]:
    """``corral ARGS`` with ``path`` open read-only at ``fd`` (0: ``corral ... < path``)."""
    opened = os.open(path, os.O_RDONLY)
    try:
        return subprocess.run(
            c.argv(args),
            cwd=ws,
            env=c.env(),
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=60,
            close_fds=False,  # only ``fd`` is inheritable: os.open's are not
            preexec_fn=lambda: os.dup2(opened, fd),
        )
    finally:
        os.close(opened)


def test_run_stdin_from_a_file_cannot_write_it(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    path = host_file(c)
    r = run_from(c, ws, path, ["run", "-q", "--", "sh", "-c", REOPEN.format(n=0)])
    assert path.read_text() == "ORIGINAL\n", r
    assert b"ORIGINAL" in r.stdout, r  # twin: the command still reads the file on stdin
    path.write_bytes(b"x" * 1_000_000)  # a large one arrives whole (the pipe is refilled)
    r = run_from(c, ws, path, ["run", "-q", "--", "wc", "-c"])
    assert r.returncode == 0 and r.stdout.strip() == b"1000000", r
    r = run_from(c, ws, path, ["run", "-q", "--", "head", "-c", "3"])  # or read in part
    assert r.returncode == 0 and r.stdout == b"xxx", r


def test_run_pass_fd_refuses_a_file_or_directory(tsandbox: tuple[Corral, Path]) -> None:
    """A passed regular file or directory is refused in one line (exit 2): through
    it the command reached the host's inode, or tree, past the sandbox's mounts."""
    c, ws = tsandbox
    path = host_file(c)
    argv = ["run", "-q", "--pass-fd", "3", "--", "sh", "-c", REOPEN.format(n=3)]
    for what, words in (
        (path, b"--pass-fd 3 is a file on the host"),
        (path.parent, b"--pass-fd 3 is a directory"),
    ):
        r = run_from(c, ws, what, argv, fd=3)
        assert r.returncode == 2 and words in r.stderr, r
        assert len(r.stderr.splitlines()) == 1, r
    assert path.read_text() == "ORIGINAL\n"
    # twin: a pipe crosses, and reads as before
    r = c.run(["run", "-q", "--", "sh", "-c", "cat <&0"], cwd=ws, input=b"piped\n")
    assert r.returncode == 0 and r.stdout == b"piped\n", r


@pytest.mark.tiers(
    "namespace", "landlock", "container", why="--pass-fd is refused with podman and runsc"
)
@pytest.mark.parametrize("numbers", FD_PAIRS, ids=["fds-3-4", "fds-40-41"])
def test_shell_inherits_no_descriptor(
    tsandbox: tuple[Corral, Path], numbers: tuple[int, int]
) -> None:
    c, ws = tsandbox
    name = probe(c, ws)
    pair = f"{numbers[0]},{numbers[1]}"
    with held(c, numbers) as h:
        r = run_holding(c, ws, h, ["shell", "-q", "--", "python3", name, "leak", pair])
        assert r.returncode == 0, r
        assert_nothing_crossed(h, r.stdout, "leak")
    with held(c, numbers) as h:
        flags = ["--pass-fd", str(numbers[1])]
        r = run_holding(c, ws, h, ["shell", "-q", *flags, "--", "python3", name, "pass", pair])
        assert r.returncode == 0, r
        assert_passed(c, h, r.stdout, "pass")


# The Sandbox API, run by a program of the user under test: every exec gets stdin,
# stdout and stderr only; pass_fds hands a descriptor to one exec.
SANDBOX_SCRIPT = r"""
import json, os, sys
from corral import policy
from corral.sandbox import Sandbox, SandboxError
api, pair = json.loads(sys.argv[1]), sys.argv[2]
d, s = (int(n) for n in pair.split(","))
flags = {fd: os.get_inheritable(fd) for fd in (d, s)}
with Sandbox(policy.load(os.getcwd()), **api) as sb:
    r = sb.exec(["python3", "fdprobe.py", "leak", pair])
    print("deny:" + r.stdout.decode().replace("\n", " "), flush=True)
    try:
        r = sb.exec(["python3", "fdprobe.py", "pass", pair], pass_fds=(s,))
        print("pass:" + r.stdout.decode().replace("\n", " "), flush=True)
    except SandboxError as exc:
        print("refused:" + str(exc), flush=True)
    try:
        sb.exec(["python3", "fdprobe.py", "pass", pair], pass_fds=(d, s))
        print("dir:passed", flush=True)
    except SandboxError as exc:
        print("dir:" + str(exc), flush=True)
    r = sb.exec(["sh", "-c", "ls /proc/self/fd/ | sort -n | tr '\n' ' '"])
    print("listing:" + r.stdout.decode(), flush=True)
print("flags-kept=" + str(flags == {fd: os.get_inheritable(fd) for fd in (d, s)}))
"""


@pytest.mark.parametrize("numbers", FD_PAIRS, ids=["fds-3-4", "fds-40-41"])
def test_sandbox_exec_inherits_no_descriptor(
    tsandbox: tuple[Corral, Path], numbers: tuple[int, int]
) -> None:
    c, ws = tsandbox
    assert c.tier is not None
    probe(c, ws)
    script = ws.parent / "api.py"
    script.write_text(SANDBOX_SCRIPT)
    os.chmod(script, 0o644)
    pair = f"{numbers[0]},{numbers[1]}"
    argv = c.python_argv([str(script), json.dumps(c.tier.api), pair])
    with held(c, numbers) as h:
        r = subprocess.run(
            argv,
            cwd=ws,
            env=c.env(),
            capture_output=True,
            timeout=120,
            close_fds=False,
            preexec_fn=h.place,
        )
        assert r.returncode == 0, r
        out = {
            line.split(":", 1)[0]: line.split(":", 1)[1]
            for line in r.stdout.decode().splitlines()
            if ":" in line
        }
        assert "deny" in out, r
        assert_nothing_crossed(h, out["deny"].replace(" ", "\n").encode(), "leak")
        # the agent's channel to the host and everything else of corral's stays out
        assert out["listing"].split() == ["0", "1", "2", "3"], r
        assert b"flags-kept=True" in r.stdout, r  # the caller's own descriptors untouched
        if c.tier.id in ("container", "gvisor"):  # its agent is behind the engine's pipes
            assert "cannot carry descriptors" in out.get("refused", ""), r
            assert h.arrived() == b""
        else:  # allow twin
            assert_passed(c, h, out["pass"].replace(" ", "\n").encode(), "pass")
            assert f"pass_fds: {numbers[0]} is a directory" in out["dir"], r
        assert not (h.outside / f"pass-{numbers[0]}").exists()


@pytest.mark.tiers("namespace", why="corral mcp runs one Sandbox: the tier changes nothing here")
def test_mcp_inherits_no_descriptor(tsandbox: tuple[Corral, Path]) -> None:
    """`corral mcp` started by a client holding descriptors: its tools' commands
    see none of them (the SDK is installed for the test interpreter only: root)."""
    c, ws = tsandbox
    if c.who != "root":
        pytest.skip("the mcp SDK is installed for the test interpreter only, not the user's")
    pytest.importorskip("mcp", reason="the mcp SDK is part of the dev extra")
    name = probe(c, ws)
    with held(c, (40, 41)) as h:
        server = subprocess.Popen(
            c.argv(["mcp", "--tier", "namespace", "--workspace", str(ws)]),
            cwd=ws,
            env=c.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=False,
            preexec_fn=h.place,
        )
        try:
            result = mcp_call(server, "run_command", {"command": f"python3 {name} leak 40,41"})
        finally:
            server.kill()
            server.wait()
        assert_nothing_crossed(h, str(result.get("stdout", "")).encode(), "leak")
        assert "dir40=err" in str(result.get("stdout")), result  # twin: the tool ran


def mcp_call(server: subprocess.Popen[bytes], tool: str, args: dict[str, object]) -> dict[str, Any]:
    """initialize, then one tools/call, over newline-delimited JSON-RPC."""
    assert server.stdin is not None and server.stdout is not None

    def send(message: dict[str, object]) -> None:
        assert server.stdin is not None
        server.stdin.write(json.dumps(message).encode() + b"\n")
        server.stdin.flush()

    def reply(ident: int) -> dict[str, Any]:
        assert server.stdout is not None
        while True:
            line = server.stdout.readline()
            assert line, "the MCP server closed its output"
            message = json.loads(line)
            if message.get("id") == ident:
                return dict(message)

    send(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "corral-tests", "version": "1"},
            },
        }
    )
    assert "result" in reply(1)
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    call = {"name": tool, "arguments": args}
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
    answer = reply(2)["result"]
    structured = answer.get("structuredContent")
    if structured is not None:
        return dict(structured.get("result", structured))
    return dict(json.loads(answer["content"][0]["text"]))


# --- 2. kernel state under /proc and /sys ---------------------------------------------

# Runs inside: opens for writing (never writes) the tunables a root sandbox must not
# change, then every file under /proc (but the process directories) and /sys.
KERNEL_PROBE = r"""
import os, stat
NAMED = (
    "/proc/sys/kernel/core_pattern",
    "/proc/sys/vm/drop_caches",
    "/proc/sys/net/ipv4/ip_forward",
    "/proc/sys/fs/binfmt_misc/register",
    "/proc/sysrq-trigger",
)
def try_write(path):
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        return f"err:{e.errno}"
    is_null = os.path.samefile(f"/proc/self/fd/{fd}", "/dev/null")
    os.close(fd)
    return "null" if is_null else "ok"
for path in NAMED:
    print(f"named {path}={try_write(path)}")
try:
    with open("/proc/sys/kernel/core_pattern") as fh:
        print("read core_pattern=" + fh.read().strip())
except OSError as e:
    print(f"read core_pattern=err:{e.errno}")
checked = 0
for top in ("/proc", "/sys"):
    for root, dirs, files in os.walk(top):
        if root == "/proc":
            dirs[:] = [d for d in dirs if not d.isdigit() and d not in ("self", "thread-self")]
        for name in files:
            path = os.path.join(root, name)
            try:
                if not stat.S_ISREG(os.lstat(path).st_mode):
                    continue
            except OSError:
                continue
            checked += 1
            if try_write(path) == "ok":
                print(f"writable {path}=ok")
print(f"checked={checked}")
"""


def test_kernel_state_is_read_only(tsandbox: tuple[Corral, Path]) -> None:
    """Nothing under /proc or /sys that holds kernel-wide state opens for writing,
    started by root (whose uid owns those files) or by a user; opened, never written."""
    c, ws = tsandbox
    script = ws / "kernel.py"
    script.write_text(KERNEL_PROBE)
    c.chown(script)
    r = c.run(["run", "-q", "--", "python3", script.name], cwd=ws, timeout=180)
    assert r.returncode == 0, r
    got = lines(r.stdout)
    for key, value in got.items():
        if key.startswith("named "):
            assert value.startswith("err:"), (key, value)  # refused (or absent)
    with open("/proc/sys/kernel/core_pattern") as fh:  # twin: reading still works
        host_pattern = fh.read().strip()
    if c.tier is not None and c.tier.id != "gvisor":  # gVisor answers from its own kernel
        assert got["read core_pattern"] == host_pattern, r
    # the walk really ran over both trees (gVisor's are its own, and small)
    assert int(got["checked"]) > (20 if c.tier is not None and c.tier.id == "gvisor" else 1000), r
    writable = [k.removeprefix("writable ") for k in got if k.startswith("writable ")]
    # PSI files take a trigger per open file (gone when it closes), for every user
    writable = [p for p in writable if not p.startswith("/proc/pressure/")]
    if c.tier is not None and c.tier.id == "gvisor":
        # gVisor's /proc/sys is its own kernel's, emulated in the sandbox: writable
        # there, never the host's (the named host tunables above were refused)
        writable = [p for p in writable if not p.startswith("/proc/sys/")]
    assert writable == [], writable
    assert c.sh(ws, "echo ok > allowed").returncode == 0  # twin: the workspace is writable
    assert (ws / "allowed").read_text() == "ok\n"


# Runs inside: every name under /sys (no symlink followed) and the contents of the
# files that carry an interface's identity.
SYSFS_PROBE = r"""
import os
names, texts = set(), []
for root, dirs, files in os.walk("/sys"):
    names.update(dirs)
    names.update(files)
    for name in files:
        if name in ("address", "perm_addr", "uevent", "broadcast", "ifalias", "phys_port_name"):
            try:
                with open(os.path.join(root, name), errors="replace") as fh:
                    texts.append(fh.read(4096))
            except OSError:
                pass
print("names=" + " ".join(sorted(names)))
print("texts=" + " | ".join(t.replace("\n", " ") for t in texts))
"""


def host_interfaces() -> dict[str, str]:
    found = {}
    for name in os.listdir("/sys/class/net"):
        try:
            with open(f"/sys/class/net/{name}/address") as fh:
                found[name] = fh.read().strip()
        except OSError:
            found[name] = ""
    return found


@pytest.mark.tiers(
    "namespace", "container", "gvisor", why="the landlock tier shares the host's network"
)
def test_sysfs_shows_no_host_interface(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    host = host_interfaces()
    assert host, "the host lists no interface at all"
    script = ws / "sysfs.py"
    script.write_text(SYSFS_PROBE)
    c.chown(script)
    r = c.run(["run", "-q", "--", "python3", script.name], cwd=ws, timeout=180)
    assert r.returncode == 0, r
    got = lines(r.stdout)
    names = set(got["names"].split())
    assert "devices" in names and "class" in names, r  # twin: /sys is there and walked
    texts = got["texts"]
    for name, mac in host.items():
        if name == "lo" and c.tier is not None and c.tier.id != "namespace":
            continue  # a container's sysfs shows its own loopback, not the host's
        assert name not in names, (name, r)
        assert f"INTERFACE={name} " not in texts + " ", (name, r)
        if mac and mac != "00:00:00:00:00:00":
            assert mac not in texts, (name, mac, r)
    assert c.sh(ws, "cat /proc/net/dev | grep -q ' lo:'").returncode == 0  # its own loopback


# --- 3. hard links planted in the workspace --------------------------------------------


def plant(c: Corral, ws: Path) -> tuple[Path, Path]:
    """A file outside the workspace (the user's own, so only corral stops a write) with a
    hard link to it in the workspace, and a pair of links that both live inside."""
    outside = c.base / "outside-hl"
    outside.mkdir()
    target = outside / "target.txt"
    target.write_text("orig\n")
    os.link(target, ws / "planted.txt")
    (ws / "sub").mkdir()
    (ws / "sub" / "a.txt").write_text("a\n")
    os.link(ws / "sub" / "a.txt", ws / "sub" / "a2.txt")
    c.chown(outside, ws)
    return target, ws / "planted.txt"


def test_planted_hard_link_is_read_only(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    target, planted = plant(c, ws)
    r = c.run(
        [
            "run",
            "--",
            "sh",
            "-c",
            "echo pwned >> planted.txt; echo pwned > planted.txt; echo twin >> sub/a2.txt",
        ],
        cwd=ws,
    )
    assert target.read_text() == "orig\n", r  # the file outside is unchanged
    assert planted.read_text() == "orig\n"
    assert (ws / "sub" / "a.txt").read_text() == "a\ntwin\n", r  # twin: links inside work
    assert b"hard links" in r.stderr and str(planted).encode() in r.stderr, r  # reported
    records = [
        json.loads(line) for line in (c.state / "corral" / "runs.jsonl").read_text().splitlines()
    ]
    assert any(str(planted) in note for note in records[-1].get("notes", [])), records[-1]
    assert str(ws / "sub" / "a2.txt") not in " ".join(records[-1].get("notes", []))


def test_hard_link_to_a_secret_is_unreadable(tsandbox: tuple[Corral, Path]) -> None:
    """A key linked into the workspace is masked like the key itself; a link to a
    plain file outside stays readable (and read-only)."""
    c, ws = tsandbox
    (c.home / ".ssh").mkdir()
    key = c.home / ".ssh" / "id_ed25519"
    key.write_text("SECRET-KEY\n")
    os.link(key, ws / "key-link")
    target, _planted = plant(c, ws)
    c.chown(c.home / ".ssh", ws)
    r = c.sh(ws, "cat key-link; echo; cat planted.txt")
    assert b"SECRET-KEY" not in r.stdout + r.stderr, r
    assert b"orig" in r.stdout, r  # the twin: the other link is readable
    assert key.read_text() == "SECRET-KEY\n" and target.read_text() == "orig\n"


def test_hard_links_refused_by_policy(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    target, planted = plant(c, ws)
    (ws / "corral.toml").write_text('[filesystem]\nhardlinks = "refuse"\n')
    c.chown(ws / "corral.toml")
    r = c.run(["run", "-q", "--", "sh", "-c", "echo pwned >> planted.txt"], cwd=ws)
    assert r.returncode == 122, r
    assert str(planted).encode() in r.stderr and b'hardlinks = "refuse"' in r.stderr, r
    assert b"Traceback" not in r.stderr
    assert target.read_text() == "orig\n"
    planted.unlink()  # twin: without the link that leads outside, it runs
    r = c.run(["run", "-q", "--", "sh", "-c", "echo twin >> sub/a2.txt"], cwd=ws)
    assert r.returncode == 0, r
    assert (ws / "sub" / "a.txt").read_text() == "a\ntwin\n"


def test_cannot_create_a_hard_link_to_outside(tsandbox: tuple[Corral, Path]) -> None:
    """EXDEV across mounts (namespace, containers), Landlock's refer rules (landlock);
    the user owns the file, so the kernel's protected_hardlinks would not stop it."""
    c, ws = tsandbox
    outside = c.base / "outside-ln"
    outside.mkdir()
    target = outside / "target.txt"
    target.write_text("orig\n")
    (ws / "mine.txt").write_text("mine\n")
    c.chown(outside, ws)
    code = (
        "import os\n"
        f"for src, dst in (({str(target)!r}, 'hl.txt'), ('mine.txt', 'mine2.txt')):\n"
        "    try:\n"
        "        os.link(src, dst)\n"
        "        print(dst + '=ok')\n"
        "    except OSError as e:\n"
        "        print(dst + '=err:' + str(e.errno))\n"
        "open('mine2.txt', 'a').write('twin\\n')\n"
    )
    r = c.run(["run", "-q", "--", "python3", "-c", code], cwd=ws)
    assert r.returncode == 0, r
    got = lines(r.stdout)
    assert got["hl.txt"].startswith("err:"), r
    assert os.stat(target).st_nlink == 1 and target.read_text() == "orig\n"
    assert not (ws / "hl.txt").exists()
    if c.has("host-root"):  # the file exists there: refused for crossing, not for absence
        assert got["hl.txt"] == f"err:{errno.EXDEV}", r
    assert got["mine2.txt"] == "ok", r  # twin: a link inside the workspace works
    assert (ws / "mine.txt").read_text() == "mine\ntwin\n"


# --- 4. undo that leaves no trace ------------------------------------------------------

OLD_NS = 1_000_000_000_123_456_789  # 2001, with nanoseconds that must survive
PARENT_NS = 1_500_000_000_000_000_000  # whole seconds: busybox touch -d


def test_write_protected_files_keep_content_mode_and_times(tsandbox: tuple[Corral, Path]) -> None:
    """The command changes .git/config (content, mode by recreating it, times) and
    touches a hook; afterwards both are exactly as before, to the nanosecond, on every
    tier (read-only mounts refuse; landlock restores), and the directory holding them
    keeps the times the command gave it (the undo leaves no trace there)."""
    c, ws = tsandbox
    hooks = ws / ".git" / "hooks"
    hooks.mkdir(parents=True)
    config, hook = ws / ".git" / "config", hooks / "pre-commit"
    config.write_text("[core]\n\tbare = false\n")
    hook.write_text("#!/bin/sh\n")
    os.chmod(config, 0o600)
    os.chmod(hook, 0o750)
    (ws / "work.txt").write_text("w\n")
    c.chown(ws)
    for path in (config, hook, hooks):
        os.utime(path, ns=(OLD_NS, OLD_NS))
    before = {
        p: (p.read_bytes() if p.is_file() else b"", os.lstat(p)) for p in (config, hook, hooks)
    }
    script = (
        "rm -f .git/config; printf 'evil\\n' > .git/config; "
        "echo evil >> .git/config; "
        "touch .git/hooks/pre-commit; touch -d @1600000000 .git/hooks/pre-commit; "
        "touch .git/hooks; echo twin >> work.txt; "
        f"touch -d @{PARENT_NS // 10**9} .git"
    )
    r = c.sh(ws, script)
    for path, (data, st) in before.items():
        now = os.lstat(path)
        assert (path.read_bytes() if path.is_file() else b"") == data, (path, r)
        assert stat_mode(now) == stat_mode(st), (path, oct(now.st_mode), r)
        assert now.st_mtime_ns == st.st_mtime_ns == OLD_NS, (path, now.st_mtime_ns, r)
    assert (ws / "work.txt").read_text() == "w\ntwin\n", r  # twin: the workspace is writable
    assert os.stat(ws / ".git").st_mtime_ns == PARENT_NS, r  # the command's own change stays
    if not c.has("mounts"):
        assert b"restored from the snapshot" in r.stderr, r


def stat_mode(st: os.stat_result) -> int:
    return st.st_mode & 0o7777


def test_untouched_write_protected_files_are_left_alone(tsandbox: tuple[Corral, Path]) -> None:
    """Allow twin of the above: reading them changes nothing and reports nothing."""
    c, ws = tsandbox
    (ws / ".git" / "hooks").mkdir(parents=True)
    config = ws / ".git" / "config"
    config.write_text("[core]\n")
    c.chown(ws)
    os.utime(config, ns=(OLD_NS, OLD_NS))
    r = c.sh(ws, "cat .git/config >/dev/null && ls .git/hooks")
    assert r.returncode == 0, r
    assert os.stat(config).st_mtime_ns == OLD_NS
    assert b"denied write" not in r.stderr, r


# --- set-ID programs left behind ---------------------------------------------------

# Runs inside: every way a file gets a mode, with and without set-ID bits.
# what the probes below print of each attempt: WHAT=ok, or WHAT=err:ERRNO
ATTEMPT = r"""
def attempt(what, act):
    try:
        act()
        print(what + "=ok")
    except OSError as e:
        print(f"{what}=err:{e.errno}")
"""
SET_ID_PROBE = (
    ATTEMPT
    + r"""
import os
open("prog", "w").close()
attempt("chmod-suid", lambda: os.chmod("prog", 0o4755))
attempt("chmod-sgid", lambda: os.chmod("prog", 0o2755))
fd = os.open("prog", os.O_RDONLY)
attempt("fchmod-suid", lambda: os.fchmod(fd, 0o6711))
attempt("create-suid", lambda: os.close(os.open("made", os.O_WRONLY | os.O_CREAT, 0o4755)))
attempt("mknod-suid", lambda: os.mknod("node", 0o104755))
attempt("create-plain", lambda: os.close(os.open("plain", os.O_WRONLY | os.O_CREAT, 0o755)))
attempt("chmod-plain", lambda: os.chmod("prog", 0o755))
"""
)


def set_id_files(ws: Path) -> dict[str, str]:
    return {
        str(p.relative_to(ws)): oct(p.lstat().st_mode)
        for p in ws.rglob("*")
        if p.lstat().st_mode & 0o6000
    }


def test_no_set_id_program_outlives_the_run(tsandbox: tuple[Corral, Path]) -> None:
    """A set-user-ID program the run leaves in the workspace runs later, outside the
    sandbox, as its owner: a root shell for whoever reaches it when corral ran as
    root.  Every tier but gVisor once let one through (chmod, or a file created
    with that mode; landlock by creation only).  Twin: plain modes still apply
    (on landlock through corral's supervisor, which allows them in the workspace)."""
    c, ws = tsandbox
    r = c.run(["run", "-q", "--", "python3", "-c", SET_ID_PROBE], cwd=ws)
    out = r.stdout.decode()
    assert r.returncode == 0, r
    for what in ("chmod-suid", "chmod-sgid", "fchmod-suid", "create-suid", "mknod-suid"):
        assert f"{what}=err:{errno.EPERM}" in out, (what, out)
    assert set_id_files(ws) == {}
    assert not (ws / "made").exists() and not (ws / "node").exists()
    assert "create-plain=ok" in out and (ws / "plain").stat().st_mode & 0o777 == 0o755, out
    assert "chmod-plain=ok" in out and (ws / "prog").stat().st_mode & 0o7777 == 0o755, out


# --- corral's own lines: no terminal control from the sandbox -----------------------


def test_names_the_run_chose_cannot_drive_the_terminal(tsandbox: tuple[Corral, Path]) -> None:
    """corral names what it quarantined after the run: a hook named with an escape
    sequence and a line break once reached the terminal raw, so a command could
    erase, recolour or forge corral's own report.  Twin: a plain name is shown as
    it is, non-ASCII letters included."""
    c, ws = tsandbox
    evil = "pre-commit\x1b[2K\x1b[1A\nforged: all good\u202e"
    name = evil.encode("unicode_escape").decode()  # printf's escapes make it inside
    script = (  # a repository made by hand: its hook names are the attack
        "mkdir -p made/.git/hooks made/.git/objects made/.git/refs && "
        "echo 'ref: refs/heads/main' > made/.git/HEAD && "
        f"printf '#!/bin/sh\\n' > \"made/.git/hooks/$(printf '{name}')\" && "
        "printf '#!/bin/sh\\n' > made/.git/hooks/post-merge-é"
    )
    r = c.run(["run", "-q", "--", "sh", "-c", script], cwd=ws)
    err = r.stderr.decode()
    assert r.returncode == 0, r
    assert "\x1b" not in err and "\u202e" not in err, err
    assert "\nforged" not in err and "forged: all good" in err, err  # shown, on no line of its own
    assert "made/.git/hooks/pre-commit\\x1b[2K\\x1b[1A\\x0aforged" in err, err
    assert "made/.git/hooks/post-merge-é" in err, err  # the twin


# --- agent tools' project settings: run later, unsandboxed, by the tool -------------


def test_agent_tool_settings_cannot_be_planted(tsandbox: tuple[Corral, Path]) -> None:
    """A hook in .claude/settings.json, a server in .mcp.json or .cursor/mcp.json runs
    on the host the next time that agent tool starts in this directory, outside
    the sandbox (srt protects these by default; corral's defaults once did not).
    Twin: the project's own files (CLAUDE.md, src/) are written as ever."""
    c, ws = tsandbox
    (ws / ".claude").mkdir()
    settings = ws / ".claude" / "settings.json"
    settings.write_text('{"permissions": {}}\n')
    c.chown(ws)
    hook = (
        '{"hooks": {"SessionStart": [{"hooks": [{"type": "command", "command": "touch /pwn"}]}]}}'
    )
    script = f"""
        echo '{hook}' > .claude/settings.json 2>/dev/null || echo settings=denied
        mkdir -p .cursor && echo '{{}}' > .cursor/mcp.json
        echo '{{"mcpServers": {{"x": {{"command": "sh"}}}}}}' > .mcp.json
        echo '# notes' >> CLAUDE.md && mkdir -p src && echo x > src/a && echo twin=ok
    """
    r = c.run(["run", "-q", "--", "sh", "-c", script], cwd=ws)
    assert r.returncode == 0, r
    assert settings.read_text() == '{"permissions": {}}\n'  # refused, or put back after
    assert not (ws / ".mcp.json").exists() and not (ws / ".cursor").exists()  # quarantined
    err = r.stderr.decode()
    assert ".mcp.json" in err and ".cursor" in err, err
    if c.has("mounts"):
        assert "settings=denied" in r.stdout.decode(), r
    assert "twin=ok" in r.stdout.decode() and (ws / "CLAUDE.md").read_text() == "# notes\n"
    assert (ws / "src" / "a").read_text() == "x\n"


# --- extended attributes: an ACL is a mode ------------------------------------------

ACL_PROBE = r"""
import os, struct, sys
target = sys.argv[1]
ent = lambda tag, perm, uid=0xFFFFFFFF: struct.pack("<HHI", tag, perm, uid)
# USER_OBJ rw, a named user (nobody) rw, GROUP_OBJ -, MASK rw, OTHER r: world-readable
acl = struct.pack("<I", 2) + ent(1, 6) + ent(2, 6, 65534) + ent(4, 0) + ent(0x10, 6) + ent(0x20, 4)
for what, act in (
    ("acl", lambda: os.setxattr(target, "system.posix_acl_access", acl)),
    ("xattr", lambda: os.setxattr(target, "user.planted", b"x")),
):
    try:
        act()
        print(what + "=ok")
    except OSError as e:
        print(f"{what}=err:{e.errno}")
print("read=" + open(target).read().strip())
"""


def test_an_acl_cannot_open_up_a_file_outside_the_workspace(
    tsandbox: tuple[Corral, Path],
) -> None:
    """Landlock governs neither modes nor extended attributes, and a POSIX ACL is an
    extended attribute that sets a file's mode: on the landlock tier a command once
    made the user's private file outside the workspace world-readable (600 -> 664)
    and readable by another user.  Twin: the file still reads."""
    c, ws = tsandbox
    outside = c.base / "outside-acl"
    outside.mkdir()
    private = outside / "private.txt"
    private.write_text("mine\n")
    private.chmod(0o600)
    c.chown(outside, ws)
    r = c.run(["run", "-q", "--", "python3", "-c", ACL_PROBE, str(private)], cwd=ws)
    out = r.stdout.decode()
    assert private.stat().st_mode & 0o777 == 0o600, out
    assert os.listxattr(private) == [], out
    assert "acl=err:" in out and "xattr=err:" in out, r
    if c.has("host-root"):  # (containers: the file outside is not there at all)
        assert "read=mine" in out, r


# --- inode flags and attributes: ioctls Landlock does not govern --------------------

# Runs inside: sets inode flags (FS_IOC_SETFLAGS), the generation number
# (FS_IOC_SETVERSION), extended flags (FS_IOC_FSSETXATTR) and, since Linux 6.17,
# the same by path (file_setattr) on the file named, opened read-only: the kernel
# asks only for ownership, not for a writable descriptor.
INODE_FLAGS_PROBE = (
    ATTEMPT
    + r"""
import ctypes, errno, fcntl, os, struct, sys
target = sys.argv[1]
NODUMP, XFLAG_NOATIME = 0x40, 0x40
fd = os.open(target, os.O_RDONLY)
flags = struct.unpack("<q", fcntl.ioctl(fd, 0x80086601, bytes(8)))[0]  # FS_IOC_GETFLAGS
print(f"getflags={flags:#x}")
attempt("setflags", lambda: fcntl.ioctl(fd, 0x40086602, struct.pack("<q", flags | NODUMP)))
attempt("setversion", lambda: fcntl.ioctl(fd, 0x40087602, struct.pack("<q", 4242)))
attempt("ext4-setversion", lambda: fcntl.ioctl(fd, 0x40086604, struct.pack("<q", 4343)))
xattr = bytearray(fcntl.ioctl(fd, 0x801C581F, bytes(28)))  # FS_IOC_FSGETXATTR
xattr[0:4] = struct.pack("<I", struct.unpack("<I", xattr[0:4])[0] | XFLAG_NOATIME)
attempt("fssetxattr", lambda: fcntl.ioctl(fd, 0x401C5820, bytes(xattr)))
libc = ctypes.CDLL(None, use_errno=True)
attr = ctypes.create_string_buffer(struct.pack("<QIIII", XFLAG_NOATIME, 0, 0, 0, 0))
def file_setattr():  # file_setattr(AT_FDCWD, path, attr, size, 0)
    if libc.syscall(469, -100, target.encode(), attr, ctypes.c_size_t(24), 0) < 0:
        raise OSError(ctypes.get_errno(), "file_setattr")
attempt("file_setattr", file_setattr)
print("read=" + open(target).read().strip())
"""
)


def inode_state(path: Path) -> tuple[int, int]:
    """(inode flags, generation number) of ``path``, read on the host."""
    import struct

    fd = os.open(path, os.O_RDONLY)
    try:
        flags = fcntl.ioctl(fd, 0x80086601, bytes(8))  # FS_IOC_GETFLAGS
        version = fcntl.ioctl(fd, 0x80087601, bytes(8))  # FS_IOC_GETVERSION
    finally:
        os.close(fd)
    return struct.unpack("<q", flags)[0], struct.unpack("<q", version)[0]


def test_inode_flags_outside_the_workspace_cannot_be_set(tsandbox: tuple[Corral, Path]) -> None:
    """Landlock governs device ioctls only, and setting a file's inode flags,
    extended flags or generation number asks the kernel for ownership, not for a
    writable descriptor: on the landlock tier a command once marked the user's
    files outside the workspace nodump (skipped by backups), noatime and sync,
    and changed their generation (NFS handles), through a read-only open.
    Twin: the flags still read, and (namespace) they can be set in the workspace."""
    c, ws = tsandbox
    outside = c.base / "outside-flags"
    outside.mkdir()
    private = outside / "mine.txt"
    private.write_text("mine\n")
    c.chown(outside, ws)
    before = inode_state(private)
    r = c.run(["run", "-q", "--", "python3", "-c", INODE_FLAGS_PROBE, str(private)], cwd=ws)
    out = lines(r.stdout)
    assert inode_state(private) == before, r
    if not c.has("host-root"):
        return  # (containers: the file outside is not there at all)
    assert r.returncode == 0, r
    for what in ("setflags", "setversion", "ext4-setversion", "fssetxattr"):
        assert out[what].startswith("err:"), (what, r)
    assert out["file_setattr"].startswith("err:"), r
    assert out["read"] == "mine" and "getflags" in out, r  # twin: reading is not touched
    if c.has("mounts"):  # twin: in the workspace the owner still sets them
        (ws / "own.txt").write_text("own\n")
        c.chown(ws / "own.txt")
        plain = inode_state(ws / "own.txt")
        r = c.run(["run", "-q", "--", "python3", "-c", INODE_FLAGS_PROBE, "own.txt"], cwd=ws)
        out = lines(r.stdout)
        assert out["setflags"] == "ok" and out["fssetxattr"] == "ok", r
        assert inode_state(ws / "own.txt") != plain, r


# --- a protected file carried off by a renamed directory -------------------------


def test_a_policy_file_carried_off_cannot_be_replaced(tsandbox: tuple[Corral, Path]) -> None:
    """``mv sub sub2`` carries ``sub/corral.toml`` (read-only) away with its directory;
    the run then makes ``sub/corral.toml`` with ``defaults = false`` for a later run
    started in ``sub``.  The check for new policy files went by path: it took the
    user's own file at ``sub2/`` for the new one and quarantined it, the search
    for the carried file then found nothing to move back, and the planted file
    stayed where the next run loads it (namespace and container tiers).  Those
    tiers now refuse the rename itself (``sub`` holds a protected path: it is a
    mount); landlock moves the file back.  Twin: the rest of the rename stays."""
    c, ws = tsandbox
    (ws / "sub").mkdir()
    (ws / "sub" / "corral.toml").write_text("[filesystem]\n")
    (ws / "sub" / "notes.txt").write_text("notes\n")
    c.chown(ws)
    script = "mv sub sub2 && mkdir sub && echo 'defaults = false' > sub/corral.toml && echo made"
    r = c.sh(ws, script)
    if c.has("mounts"):
        assert b"Device or resource busy" in r.stderr and b"made" not in r.stdout, r
        assert (ws / "sub" / "corral.toml").read_text() == "[filesystem]\n", r
        r = c.sh(ws, "mv sub/notes.txt notes.txt && cat notes.txt")  # the twin: files move
        assert r.stdout == b"notes\n", r
        return
    assert b"made" in r.stdout, r
    assert (ws / "sub" / "corral.toml").read_text() == "[filesystem]\n", r
    assert b"denied write" in r.stderr and b"sub/corral.toml" in r.stderr, r
    assert (ws / "sub2" / "notes.txt").read_text() == "notes\n", r  # twin


def test_moving_back_never_goes_through_a_link_the_run_left(tsandbox: tuple[Corral, Path]) -> None:
    """``mv sub sub2 && ln -s /elsewhere sub``: after the run corral moves the
    carried ``sub/.env`` back and first clears what the run made at its old place,
    which it looked for through the run's symlink: a ``.env`` in the directory
    the link named, outside the workspace, went to the quarantine (as root: any
    directory on the host).  Twin: the carried files come back, the rest of the
    rename stays.  The tiers with mounts now refuse the rename (``sub`` holds
    protected paths), so there the run cannot leave a link in its place."""
    c, ws = tsandbox
    victim = c.base / "outside-victim"
    victim.mkdir()
    (victim / ".env").write_text("PROD=1\n")
    (victim / "corral.toml").write_text("# theirs\n")
    (ws / "sub").mkdir()
    (ws / "sub" / ".env").write_text("A=1\n")
    (ws / "sub" / "corral.toml").write_text("[filesystem]\n")
    (ws / "sub" / "notes.txt").write_text("notes\n")
    c.chown(victim, ws)
    r = c.sh(ws, f"mv sub sub2 && ln -s {victim} sub && echo made")
    if c.has("mounts"):
        assert b"Device or resource busy" in r.stderr and b"made" not in r.stdout, r
        assert not (ws / "sub").is_symlink() and (ws / "sub" / ".env").read_text() == "A=1\n"
        assert sorted(p.name for p in victim.iterdir()) == [".env", "corral.toml"], r
        r = c.sh(ws, "mv sub/notes.txt notes.txt && cat notes.txt")  # the twin: files move
        assert r.stdout == b"notes\n", r
        return
    assert b"made" in r.stdout, r
    assert (victim / ".env").read_text() == "PROD=1\n", r  # nothing taken from outside
    assert (victim / "corral.toml").read_text() == "# theirs\n", r
    assert sorted(p.name for p in victim.iterdir()) == [".env", "corral.toml"], r
    # landlock restores from its snapshot, never through a link
    assert b"was replaced; not restored" in r.stderr, r


# --- hard links between files of the workspace -------------------------------------


def linked_pair(c: Corral, ws: Path, protected: Path, link: Path) -> None:
    """``link`` a hard link to ``protected``, and a plain pair of links (sub/a.txt,
    a2.txt) beside them, all inside the workspace and owned by the user."""
    (ws / "sub").mkdir(exist_ok=True)
    os.link(protected, link)
    (ws / "sub" / "a.txt").write_text("a\n")
    os.link(ws / "sub" / "a.txt", ws / "a2.txt")
    c.chown(ws)


def test_a_hard_link_to_a_protected_file_is_read_only(tsandbox: tuple[Corral, Path]) -> None:
    """One run makes ``sub/.claude/settings.json`` (a new one in a subdirectory stays)
    and a hard link to it; in the next, ``.claude`` is read-only but the link was
    not: a hook written through it ran, unsandboxed, when the agent tool started
    in ``sub`` (a landlock run can link ``corral.toml`` itself the same way).
    Links whose names the walk all found inside were taken as harmless.  Twin: a
    plain pair of links is written as ever."""
    c, ws = tsandbox
    (ws / "sub" / ".claude").mkdir(parents=True)
    settings = ws / "sub" / ".claude" / "settings.json"
    settings.write_text('{"permissions": {}}\n')
    linked_pair(c, ws, settings, ws / "notes.json")
    hook = '{"hooks": {"SessionStart": [{"hooks": [{"command": "touch /pwn"}]}]}}'
    r = c.sh(ws, f"echo '{hook}' > notes.json; echo twin >> a2.txt")
    assert settings.read_text() == '{"permissions": {}}\n', r
    assert (ws / "sub" / "a.txt").read_text() == "a\ntwin\n", r


def test_a_hard_link_to_a_workspace_secret_is_unreadable(tsandbox: tuple[Corral, Path]) -> None:
    """``.env`` is masked; a hard link to it elsewhere in the workspace was not (only
    links to files outside were compared with the secrets), on every tier.  Twin:
    a plain pair of links reads."""
    c, ws = tsandbox
    env = ws / ".env"
    env.write_text("KEY=topsecret\n")
    linked_pair(c, ws, env, ws / "sub" / "notes.txt")
    r = c.sh(ws, "cat sub/notes.txt; cat .env; cat a2.txt")
    assert b"topsecret" not in r.stdout + r.stderr, r
    assert r.stdout == b"a\n", r  # the twin
    assert env.read_text() == "KEY=topsecret\n"


def test_a_bind_source_swapped_for_a_link_brings_nothing_of_the_host_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bwrap binds a protected directory (sub/.vscode) by name when it mounts, some
    time after corral planned it; another run in the same workspace can rename
    sub's contents about in between (a sandbox may rename the parent of its own
    mounts).  Swapped for a relative link to a masked directory outside, bwrap
    bound the real directory over its mask: the secret read inside (/etc over
    the masked /etc/shadow, as root, the same way).  Now the
    source is a descriptor opened with no link followed, and the plan is made
    again.  Twin: unswapped, the directory is there, read-only."""
    from corral import Sandbox, launch
    from corral import policy as pol

    ws = tmp_path / "ws"
    vault = ws / "vault"  # in the workspace, where the sandbox's view has it (masked)
    protected = ws / "sub" / ".vscode"
    protected.mkdir(parents=True)
    (protected / "settings.json").write_text("{}\n")
    vault.mkdir()
    canary = "CANARY-" + uuid.uuid4().hex
    (vault / "key").write_text(canary + "\n")
    policy = pol.load(str(ws))
    policy.filesystem.read_deny.append(str(vault))
    read = f"cat sub/.vscode/settings.json sub/.vscode/key {vault}/key; echo x > sub/.vscode/new"

    with Sandbox(policy, tier="namespace", log=False) as sb:  # the twin: nothing swapped
        r = sb.exec(read)
    assert r.stdout.startswith(b"{}\n") and canary.encode() not in r.stdout, (r, r.stdout, r.stderr)
    assert b"Read-only file system" in r.stderr and not (protected / "new").exists(), (r, r.stderr)

    start = launch.start

    def swapped_first(*args: Any, **kw: Any) -> Any:
        if not protected.is_symlink():  # after the plan, before bwrap mounts
            protected.rename(protected.with_name("real"))
            protected.symlink_to("../vault")
        return start(*args, **kw)

    monkeypatch.setattr(launch, "start", swapped_first)
    with Sandbox(policy, tier="namespace", log=False) as sb:
        r = sb.exec(read)
    assert canary.encode() not in r.stdout + r.stderr, (r, r.stdout, r.stderr)
    assert (vault / "key").read_text() == canary + "\n"


# --- two runs at once: a secret's directory renamed while another run is set up ----

# Sandbox A's side of the race: rename the secret's directory away and back for a
# while (each line: what a rename said).
RENAMER = """
import os, sys, time
end = time.monotonic() + float(sys.argv[1])
said = set()
while time.monotonic() < end:
    for a, b in (("apps/web", "apps/x"), ("apps/x", "apps/web")):
        try:
            os.rename(a, b)
            said.add("renamed")
        except OSError as e:
            said.add(os.strerror(e.errno))
print(sorted(said))
"""


@pytest.mark.tiers(
    "namespace",
    "container",
    "gvisor",
    why="Landlock cannot make a directory a mount: a landlock sandbox can still rename "
    "a secret's directory (README, What it does not do)",
)
@pytest.mark.slow  # (27 s across its cases: the default run stays under CI's bound)
def test_a_secrets_directory_cannot_be_renamed_while_another_run_starts(
    tsandbox: tuple[Corral, Path],
) -> None:
    """A mask is placed by name.  Sandbox A renamed apps/web (holding the masked
    apps/web/.env) away and back in a loop; a run B set up meanwhile masked .env
    where its plan saw it, and found the secret under the other name, unmasked.
    Now every directory between the workspace and a protected path is a mount in
    every sandbox, so A's renames fail (EBUSY) and B's mask always lands.  Twins:
    a directory holding no protected path still renames, and a file moved out of a
    pinned directory arrives (``mv`` copies across the mount)."""
    c, ws = tsandbox
    web = ws / "apps" / "web"
    web.mkdir(parents=True)
    (ws / "apps" / "plain").mkdir()
    canary = "CANARY-" + uuid.uuid4().hex
    (web / ".env").write_text(f"KEY={canary}\n")
    (web / "page.txt").write_text("page\n")
    (ws / "renamer.py").write_text(RENAMER)
    c.chown(ws / "apps", ws / "renamer.py")
    a = subprocess.Popen(
        c.argv(["run", "-q", "--", "python3", "renamer.py", "6"]),
        cwd=ws,
        env=c.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        seen = b""
        for _ in range(4):  # run B, set up while A renames
            r = c.sh(ws, "cat apps/web/.env apps/x/.env 2>&1; true")
            seen += r.stdout + r.stderr
    finally:
        out, err = a.communicate(timeout=60)
    assert canary.encode() not in seen, seen
    assert b"Device or resource busy" in out and b"renamed" not in out, (out, err)
    assert (web / ".env").read_text() == f"KEY={canary}\n"
    r = c.sh(ws, "mv apps/plain apps/plain2 && mv apps/web/page.txt . && cat page.txt")
    assert r.returncode == 0 and r.stdout == b"page\n", r  # the twins
    assert (ws / "apps" / "plain2").is_dir() and not (web / "page.txt").exists()


# Runs inside: open pid 1's memory for writing (bwrap's init, the command's uid),
# then the command's own memory for reading (the twin: its own process is its own).
INIT_MEMORY_PROBE = r"""
import os
for path, flags in (("/proc/1/mem", os.O_RDWR), ("/proc/1/task/1/mem", os.O_RDWR),
                    ("/proc/self/mem", os.O_RDONLY)):
    try:
        os.close(os.open(path, flags))
        print(f"{path}=ok")
    except OSError as e:
        print(f"{path}=err:{e.errno}")
"""


@pytest.mark.tiers("namespace", why="pid 1 inside is bwrap's init on the namespace tier alone")
def test_the_sandboxs_init_memory_cannot_be_written(tsandbox: tuple[Corral, Path]) -> None:
    """bwrap's init runs as the command's uid: a command that wrote its memory
    turned off its parent-death signal, and the sandbox outlived a kill -9 of
    corral (as a user, with no cgroup to end it).  Its memory is out of reach;
    the twin: the command's own memory opens."""
    c, ws = tsandbox
    script = ws / "initmem.py"
    script.write_text(INIT_MEMORY_PROBE)
    c.chown(script)
    r = c.run(["run", "-q", "--", "python3", script.name], cwd=ws)
    assert r.returncode == 0, r
    got = lines(r.stdout)
    assert got["/proc/1/mem"].startswith("err:"), r
    assert got["/proc/1/task/1/mem"].startswith("err:"), r
    assert got["/proc/self/mem"] == "ok", r


# Runs inside: put a link to a host file where corral's logs will be, and a record
# of its own in the log the run was given.
LOG_PLANT = """
mkdir -p .state/corral 2>/dev/null; ln -s {victim} .state/corral/runs.jsonl 2>/dev/null
echo '{{"run_id": "forged"}}' >> given.jsonl 2>/dev/null
echo mine > mine.txt
"""


# Runs inside: a log's directory renamed away and a symlink to a host directory left
# in its place (the landlock tier lets a run rename what it can write).
LOG_DIR_SWAP = "mv logs logs.old 2>/dev/null && ln -s {outside} logs; echo mine > mine.txt"


@pytest.mark.tiers(
    "namespace",
    "landlock",
    why="the container tiers refuse a state directory in the workspace (its home layer "
    "would be a bind source the run could swap), which this case needs",
)
def test_the_logs_are_out_of_the_sandboxs_reach(tsandbox: tuple[Corral, Path]) -> None:
    """Found by attacking the faces from outside: with XDG_STATE_HOME in the
    workspace and corral's state directory not made yet, the plan left it
    unmasked ("only the sandbox could create it"), but corral makes it during the
    run: a link planted there had the record appended to a host file; a log
    named by --log in the workspace took records the command wrote; and on the
    landlock tier a run renamed a named log's directory and left a symlink to a
    host directory there.  The state directory is made and masked (refused on
    landlock, where nothing could hold it in place), a named log is made and
    masked, and no log is opened through a link or a directory that changed.
    The twin: the command writes its workspace, and each log gets corral's
    record alone."""
    c, ws = tsandbox
    landlock = c.tier is not None and c.tier.id == "landlock"
    victim = ws.parent / "victim-rc"
    victim.write_text("# rc\n")
    outside = ws.parent / "outside-dir"
    outside.mkdir()
    (ws / "logs").mkdir()
    c.chown(ws, outside)
    state = ws / ".state"
    r = c.run(
        ["run", "-q", "--log", str(ws / "given.jsonl"), "--", "sh", "-c",
         LOG_PLANT.format(victim=victim)],
        cwd=ws,
        env={"XDG_STATE_HOME": str(state)},
    )  # fmt: skip
    if landlock:
        assert r.returncode == 2 and b"state directory" in r.stderr, r
        r = c.run(["run", "-q", "--log", str(ws / "given.jsonl"), "--", "sh", "-c",
                   LOG_PLANT.format(victim=victim)], cwd=ws)  # fmt: skip
    assert r.returncode == 0, r
    assert victim.read_text() == "# rc\n"
    assert (ws / "mine.txt").read_text() == "mine\n"
    given = [json.loads(x) for x in (ws / "given.jsonl").read_text().splitlines()]
    assert len(given) == 1 and given[0]["run_id"] != "forged", given
    swap = LOG_DIR_SWAP.format(outside=outside)
    r = c.run(["run", "-q", "--log", str(ws / "logs" / "l.jsonl"), "--", "sh", "-c", swap], cwd=ws)
    assert r.returncode == 0, r
    assert list(outside.iterdir()) == []  # no record, no directory made through the link
    if not landlock:
        r = c.sh(
            ws, "true", env={"XDG_STATE_HOME": str(state)}
        )  # the default log, by the state dir
        assert r.returncode == 0, r
        runs = state / "corral" / "runs.jsonl"
        assert not runs.is_symlink() and len(runs.read_text().splitlines()) == 1


def test_a_dotenv_that_is_a_link_is_unreadable_by_every_name(tsandbox: tuple[Corral, Path]) -> None:
    """``.env -> config/dev-values``: landlock, which denies by name, left the
    target readable (found by attacking corral); masked at what it leads to on
    every tier now.  The twin: a plain file beside it reads."""
    c, ws = tsandbox
    (ws / "config").mkdir()
    (ws / "config" / "dev-values").write_text("TOKEN=FAKE-SECRET\n")
    (ws / "config" / "notes").write_text("readable\n")
    (ws / ".env").symlink_to("config/dev-values")
    c.chown(ws)
    r = c.sh(ws, "cat config/notes; cat .env; cat config/dev-values; true")
    assert r.returncode == 0, r
    assert r.stdout == b"readable\n" and b"FAKE-SECRET" not in r.stderr, r


def test_a_dotenv_link_a_run_planted_does_not_stop_the_next_runs(
    tsandbox: tuple[Corral, Path],
) -> None:
    """A run planted ``.env -> .git/config``: the mask on the link and the
    write-deny bind both landed on .git/config, and every later namespace run
    failed to start (found by attacking corral).  The twin: the first run."""
    c, ws = tsandbox
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    c.chown(ws)
    first = c.sh(ws, "ln -s .git/config .env && echo planted")
    assert first.returncode == 0 and first.stdout == b"planted\n", first
    again = c.sh(ws, "echo next")
    assert again.returncode == 0 and again.stdout == b"next\n", again


# --- what corral runs on the host, planted where the sandbox can write -----------------


def test_a_run_never_starts_what_an_earlier_run_could_have_planted(
    tsandbox: tuple[Corral, Path],
) -> None:
    """A run wrote a wrapper bwrap (or podman) into the workspace's .venv/bin, on
    PATH in an activated venv, and the next run started it on the host; so did
    a module beside `python -m corral` run in the workspace, which imports from
    the current directory (found by attacking corral).  Both are refused with
    one line, exit 122, before anything starts; the twins, the same PATH without
    that entry and `python -P -m corral`, run."""
    c, ws = tsandbox
    bin_dir = ws / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    marker = c.base / "ran-on-the-host"
    for name in ("bwrap", "podman", "qemu-system-x86_64"):
        wrapper = bin_dir / name
        wrapper.write_text(f'#!/bin/sh\ntouch {marker}\nexec /usr/bin/{name} "$@"\n')
        wrapper.chmod(0o755)
    c.chown(ws / ".venv", bin_dir, *bin_dir.iterdir())
    planted = {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"}
    r = c.run(["run", "-q", "--", "true"], cwd=ws, env=planted)
    assert not marker.exists(), r.stderr.decode()
    if c.has("mounts"):  # (landlock starts no host program of PATH's: it runs)
        assert r.returncode == 122, r.stderr.decode()
        assert "lies where the sandbox can write" in r.stderr.decode()
    assert c.run(["run", "-q", "--", "true"], cwd=ws).returncode == 0  # the twin
    argv = c.python_argv(
        ["-m", "corral", "run", "-q", *(c.tier.flags if c.tier else []), "--", "true"]
    )
    r = subprocess.run(argv, cwd=ws, env=c.env(), capture_output=True, timeout=60)
    assert r.returncode == 122, r.stderr.decode()
    assert "a directory on its import path, " in r.stderr.decode()


PRELOAD_C = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    int fd = open(HOST_MARKER, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { write(fd, "host\n", 5); close(fd); }
    fd = open(INSIDE_MARKER, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { write(fd, "inside\n", 7); close(fd); }
}
"""


def test_the_loaders_variables_reach_the_command_never_bwrap(
    tsandbox: tuple[Corral, Path],
) -> None:
    """bwrap was started with the sandbox's environment, so an LD_PRELOAD the
    policy passed made it load, on the host, a library a run had built in the
    workspace (found by attacking corral).  The library's constructor marks a
    file only the host can write: never made; the twin: it is loaded by the
    command inside (it marks the workspace) on the tiers that run the host's
    programs."""
    c, ws = tsandbox
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc here to build the library (apt-get install gcc)")
    host_marker, inside_marker = c.base / "host-marker", ws / "inside-marker"
    source = ws / "mark.c"
    source.write_text(PRELOAD_C)
    library = ws / "libmark.so"
    subprocess.run(
        [gcc, "-shared", "-fPIC", f'-DHOST_MARKER="{host_marker}"',
         f'-DINSIDE_MARKER="{inside_marker}"', "-o", str(library), str(source)],
        check=True,
    )  # fmt: skip
    c.chown(source, library)
    r = c.run(["run", "-q", "--env", f"LD_PRELOAD={library}", "--", "true"], cwd=ws)
    assert r.returncode == 0, r.stderr.decode()
    assert not host_marker.exists()
    if c.has("mounts") and sees_host_root(c):
        assert inside_marker.read_text().startswith("inside"), r.stderr.decode()
