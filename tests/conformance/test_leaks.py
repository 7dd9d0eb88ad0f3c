"""Information leaks: host processes, hostname, network interfaces, environment
values on the host's command lines, the kernel log."""

# Probe programs are embedded one statement per line; wrapping them hurts more than long lines.
# ruff: noqa: E501

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest

from .conftest import Box


def test_host_processes_invisible(box: Box, request: pytest.FixtureRequest) -> None:
    if not box.has("pidns"):
        box.documented_gap(request, "host processes are visible")
    marker = f"{5000 + int(box.token[:4], 16) % 1000}.{int(box.token[4:], 16) % 10**6:06d}"
    host = subprocess.Popen(["sleep", marker], start_new_session=True)
    try:
        r = box.py(
            "import subprocess\n"
            f"own = subprocess.Popen(['sleep', '{marker}1'])\n"
            "def scan():\n"
            "    cmds = []\n"
            "    for p in os.listdir('/proc'):\n"
            "        if p.isdigit():\n"
            "            try:\n"
            "                cmds.append(open(f'/proc/{p}/cmdline', 'rb').read().replace(b'\\0', b' ').decode())\n"
            "            except OSError:\n"
            "                pass\n"
            "    return cmds\n"
            "for _ in range(100):  # until its own child has exec'd\n"
            "    cmds = scan()\n"
            f"    if any('{marker}1' in c for c in cmds):\n"
            "        break\n"
            "    time.sleep(0.02)\n"
            "print('seen=' + repr(cmds))\n"
            f"print('twin=' + str(any('{marker}1' in c for c in cmds)))\n"
            "own.kill()\n"
        )
        assert r.got.get("twin") == "True", r  # twin: its own processes are listed
        assert f"sleep {marker} " not in r.got.get("seen", "") + " ", r
        assert f"'sleep {marker}'" not in r.out, r
    finally:
        host.kill()
        host.wait()


def test_hostname(box: Box, request: pytest.FixtureRequest) -> None:
    if not box.has("uts"):
        box.documented_gap(request, "the hostname and the network stack are shared")
    r = box.py(
        "print('name=' + socket.gethostname())\nprint('twin=' + str(len(os.uname().nodename) > 0))"
    )
    assert r.got.get("twin") == "True", r
    assert r.got.get("name") != socket.gethostname(), r


def test_network_interfaces(box: Box, request: pytest.FixtureRequest) -> None:
    host = {}
    for name in os.listdir("/sys/class/net"):
        if name != "lo":
            try:
                with open(f"/sys/class/net/{name}/address") as fh:
                    host[name] = fh.read().strip()
            except OSError:
                host[name] = ""
    if not host:
        pytest.skip("N.A.: the host has no interface but lo")
    r = box.py(
        "print('dev=' + repr(read('/proc/net/dev')))\n"
        "attempt('sys', lambda: sorted(os.listdir('/sys/class/net')))\n"
        "for n in sorted(os.listdir('/sys/class/net')) if os.path.isdir('/sys/class/net') else []:\n"
        "    attempt('mac_' + n, lambda: read(f'/sys/class/net/{n}/address').strip())\n"
    )
    assert " lo:" in r.got.get("dev", ""), r  # twin: a loopback is there
    if not box.has("netns"):
        box.documented_gap(request, "the hostname and the network stack are shared")
    for name in host:
        assert f"{name}:" not in r.got.get("dev", ""), (name, r)
    for name, mac in host.items():
        assert f"'{name}'" not in r.got.get("sys", ""), (name, r)
        assert not mac or mac == "00:00:00:00:00:00" or mac not in r.out, (name, mac, r)


def test_env_values_not_on_host_command_lines(box: Box) -> None:
    """A value passed into the sandbox never shows in any host process's argv."""
    secret = f"SECRET-{box.token}"
    argv = box.c.argv(["run", "-q", "--env", "API_TOKEN", "--", "python3", "waiter.py"])
    (box.ws / "waiter.py").write_text(
        "import os, time\n"
        "while not os.path.exists('go'):\n    time.sleep(0.02)\n"
        "print('twin=' + os.environ.get('API_TOKEN', 'missing'), flush=True)\n"
    )
    box.own(box.ws / "waiter.py")
    run = subprocess.Popen(
        argv,
        cwd=box.ws,
        env=box.c.env({"API_TOKEN": secret}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        seen: list[str] = []
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # sample every command line while it runs
            for pid in os.listdir("/proc"):
                if pid.isdigit() and int(pid) != os.getpid():
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as fh:
                            line = fh.read()
                    except OSError:
                        continue
                    if secret.encode() in line:
                        seen.append(line.decode(errors="replace"))
            time.sleep(0.05)
        (box.ws / "go").write_text("")
        out, err = run.communicate(timeout=30)
    finally:
        run.kill()
    assert f"twin={secret}" in out.decode(), (out, err)  # twin: the value is inside
    assert seen == [], seen


def test_kernel_log(box: Box) -> None:
    canary = f"corral-conformance-{box.token}"
    try:
        with open("/dev/kmsg", "w") as fh:
            fh.write(f"<6>{canary}\n")
    except OSError as exc:
        pytest.skip(f"N.A.: cannot write a canary to the host's kernel log: {exc}")
    r = box.py(
        "import subprocess\n"
        "p = subprocess.run(['dmesg'], capture_output=True, text=True)\n"
        "print('dmesg=' + str(p.returncode)); print(p.stdout[-20000:])\n"
        "attempt('kmsg', lambda: os.read(os.open('/dev/kmsg', os.O_RDONLY | os.O_NONBLOCK), 8192))\n"
        "attempt('syslog', c(libc.klogctl, 3, ctypes.create_string_buffer(4096), 4096))\n"
        "attempt('twin', lambda: read('/proc/version')[:5])\n"
    )
    assert r.got.get("twin") == "ok:Linux", r
    assert canary not in r.out + r.err, r


# ctypes, as no module of the standard library speaks System V shared memory
SYSV = (
    "import ctypes, ctypes.util\n"
    "libc = ctypes.CDLL(ctypes.util.find_library('c'), use_errno=True)\n"
    "libc.shmat.restype = ctypes.c_void_p\n"
)


def test_system_v_shared_memory(box: Box) -> None:
    """A host process's System V segment, found by its key: without an IPC
    namespace of its own (or a refusal) the sandbox reads and writes it, and a
    segment it makes outlives the run.  The twin: a shared anonymous mapping."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    key = 0x7E570000 + int(box.token[:4], 16)
    shmid = libc.shmget(key, 4096, 0o1000 | 0o666)  # IPC_CREAT
    assert shmid >= 0, ctypes.get_errno()
    address = libc.shmat(shmid, None, 0)
    ctypes.memmove(address, b"HOSTDATA", 8)
    try:
        r = box.py(
            SYSV + f"shmid = libc.shmget({key}, 0, 0)\n"
            "if shmid < 0: print('attack=err:' + errno.errorcode.get(ctypes.get_errno(), '?'))\n"
            "else:\n"
            "    at = libc.shmat(shmid, None, 0)\n"
            "    print('attack=ok:' + ctypes.string_at(at, 8).decode(errors='replace'))\n"
            "    ctypes.memmove(at, b'SANDBOX!', 8)\n"
            f"made = libc.shmget({key + 1}, 4096, 0o1000 | 0o600)\n"
            "print('made=' + str(made))\n"
            "import mmap\n"
            "m = mmap.mmap(-1, 4096); m[:4] = b'anon'; print('twin=' + m[:4].decode())\n"
        )
        assert r.got.get("twin") == "anon", r
        assert r.got.get("attack", "").startswith("err:"), r
        assert ctypes.string_at(address, 8) == b"HOSTDATA"
        assert libc.shmget(key + 1, 0, 0) < 0, "a segment made in the sandbox outlived the run"
    finally:
        libc.shmdt(ctypes.c_void_p(address))
        for segment in (shmid, libc.shmget(key + 1, 0, 0)):
            if segment >= 0:
                libc.shmctl(segment, 0, None)  # IPC_RMID


MQUEUE = (
    "import ctypes, ctypes.util\n"
    "libc = ctypes.CDLL(ctypes.util.find_library('c'), use_errno=True)\n"
    "def gone(name):\n"
    "    if libc.mq_unlink(name) < 0: return 'err:' + errno.errorcode.get(ctypes.get_errno(), '?')\n"
    "    return 'ok'\n"
)


def test_posix_message_queues(box: Box) -> None:
    """A host process's POSIX message queue, found by name: without an IPC namespace
    of its own (or a refusal) the sandbox unlinked it, and a queue it made
    outlived the run.  The twin: a pipe passes a message inside."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    host_name = f"/corral-conformance-{box.token}".encode()
    made_name = f"/corral-conformance-made-{box.token}".encode()
    queue = libc.mq_open(host_name, os.O_CREAT | os.O_RDWR, 0o666, None)
    assert queue >= 0, ctypes.get_errno()
    try:
        r = box.py(
            MQUEUE
            + f"print('attack=' + gone({host_name!r}))\n"
            + f"made = libc.mq_open({made_name!r}, os.O_CREAT | os.O_RDWR, 0o600, None)\n"
            "print('made=' + str(made))\n"
            "a, b = os.pipe(); os.write(b, b'pipe'); print('twin=' + os.read(a, 4).decode())\n"
        )
        assert r.got.get("twin") == "pipe", r
        assert r.got.get("attack", "").startswith("err:"), r
        still = libc.mq_open(host_name, os.O_RDWR, 0, None)  # evidence: the host's is there
        assert still >= 0, "the host's queue was unlinked from the sandbox"
        libc.mq_close(still)
        assert libc.mq_unlink(made_name) < 0, "a queue made in the sandbox outlived the run"
    finally:
        libc.mq_close(queue)
        libc.mq_unlink(host_name)
        libc.mq_unlink(made_name)
