"""Privilege: setuid, capabilities, nested namespaces, mounts, ptrace, signals to
host processes, terminal injection, raw devices, kernel attack surface.

Where the effect of an attack can be seen from the host (a host process still
alive, keystrokes on the host's side of a terminal, a file a setuid helper would
write) the test looks there; for refused syscalls the evidence is a canary the
probe prints only if the call succeeded.
"""

# Probe programs are embedded one statement per line; wrapping them hurts more than long lines.
# ruff: noqa: E501

from __future__ import annotations

import os
import pty
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import Box, pids_matching


def test_setuid_binary(box: Box) -> None:
    if box.who == "root":
        pytest.skip("N.A.: the caller is already uid 0; capabilities are checked separately")
    # A setuid-root copy of `id`, in a directory only this test uses: with no
    # new privileges, exec must not raise the effective uid.
    helper = box.c.base / "suid-id"
    shutil.copy("/usr/bin/id", helper)
    os.chown(helper, 0, 0)
    os.chmod(helper, 0o4755)
    r = box.py(
        f"import subprocess\nprint('attack=' + subprocess.run([{str(helper)!r}], capture_output=True, text=True).stdout)\n"
        "print('twin=' + subprocess.run(['id', '-u'], capture_output=True, text=True).stdout)"
    )
    assert r.got.get("twin", "").strip() == str(box.c.uid), r  # twin: exec works
    assert "uid=" in r.got.get("attack", ""), r
    assert "euid=0" not in r.out and "uid=0(" not in r.out, r


def test_set_id_program_left_behind(box: Box) -> None:
    # What the run writes outlives it: a set-user-ID program left in the workspace
    # would run later, outside, as its owner (root when corral ran as root).
    r = box.py(
        "write('prog', '')\n"
        "attempt('chmod_suid', lambda: os.chmod('prog', 0o4755))\n"
        "attempt('chmod_sgid', lambda: os.chmod('prog', 0o2755))\n"
        "attempt('create_suid', lambda: os.close(os.open('made', os.O_WRONLY | os.O_CREAT, 0o4755)))\n"
        "attempt('mknod_suid', lambda: os.mknod('node', 0o104755))\n"
        "attempt('twin', lambda: os.close(os.open('plain', os.O_WRONLY | os.O_CREAT, 0o755)))"
    )
    for name in ("chmod_suid", "chmod_sgid", "create_suid", "mknod_suid"):
        assert r.denied(name), (name, r)
    assert r.got.get("twin") == "ok" and (box.ws / "plain").stat().st_mode & 0o111, r
    left = [p.name for p in box.ws.rglob("*") if p.lstat().st_mode & 0o6000]
    assert left == [], r


def test_capabilities_and_no_new_privs(box: Box) -> None:
    r = box.py(
        "st = dict(l.split(':', 1) for l in read('/proc/self/status').splitlines())\n"
        "for k in ('CapEff', 'CapPrm', 'CapBnd', 'CapAmb', 'NoNewPrivs'):\n"
        "    print(k + '=' + st.get(k, 'absent').strip())\n"
        "print('uid=' + str(os.getuid()))"
    )
    assert r.got.get("uid") == str(box.c.uid), r  # twin: runs as the caller
    gvisor = box.tier == "gvisor"  # its /proc/self/status has no CapAmb or NoNewPrivs line
    for key in ("CapEff", "CapPrm") if gvisor else ("CapEff", "CapPrm", "CapAmb"):
        assert r.got.get(key) == "0000000000000000", r
    if box.has("mounts") or box.who == "root":
        # An ordinary user cannot empty its bounding set without a user namespace;
        # with no_new_privs, exec never grants capabilities anyway.
        assert r.got.get("CapBnd") == "0000000000000000", r
    if not gvisor:  # (runsc is given no-new-privileges; its /proc does not show it)
        assert r.got.get("NoNewPrivs") == "1", r


def test_nested_user_namespace(box: Box) -> None:
    r = box.py(
        "import subprocess\n"
        "p = subprocess.run(['unshare', '-Ur', 'id', '-u'], capture_output=True, text=True)\n"
        "print('attack=' + ('ESCALATED' if p.stdout.strip() == '0' and p.returncode == 0 else 'refused'))\n"
        "attempt('unshare_call', c(libc.unshare, 0x10000000))\n"
        "p = subprocess.run(['sh', '-c', 'echo twin-$$'], capture_output=True, text=True)\n"
        "print('twin=' + p.stdout.strip())"
    )
    assert r.got.get("twin", "").startswith("twin-"), r  # twin: ordinary processes start
    assert r.got.get("attack") == "refused" and r.denied("unshare_call"), r


def test_mount_syscall(box: Box) -> None:
    (box.ws / "mnt").mkdir()
    box.own(box.ws / "mnt")
    r = box.py(
        "attempt('tmpfs', c(libc.mount, b'none', b'mnt', b'tmpfs', 0, None))\n"
        # MS_REMOUNT | MS_BIND without MS_RDONLY: make the read-only root writable
        "attempt('remount_rw', c(libc.mount, b'none', b'/', None, 0x20 | 0x1000, None))\n"
        "attempt('twin', lambda: os.mkdir('mnt/sub'))"
    )
    assert (box.ws / "mnt" / "sub").is_dir(), r  # twin: the directory itself is writable
    assert r.denied("tmpfs") and r.denied("remount_rw"), r


def test_ptrace(box: Box) -> None:
    r = box.py(
        "import signal\n"
        "pid = os.fork()\n"
        "if pid == 0:\n    time.sleep(5); os._exit(0)\n"
        "attempt('attack', c(libc.ptrace, 16, pid, 0, 0))\n"  # PTRACE_ATTACH
        "attempt('vm_read', lambda: open(f'/proc/{pid}/mem', 'rb').read(1))\n"
        "os.kill(pid, signal.SIGKILL)\n"
        "print('twin=' + str(os.waitpid(pid, 0)[1]))"
    )
    assert r.got.get("twin") == "9", r  # twin: it can signal and reap its own child
    assert r.denied("attack"), r


def test_kill_host_process(box: Box) -> None:
    marker = f"{3000 + int(box.token[:4], 16) % 1000}.{int(box.token[4:], 16) % 10**6:06d}"
    victim = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={box.c.uid}",
            f"--regid={box.c.gid}",
            "--clear-groups",
            "sleep",
            marker,
        ],
        start_new_session=True,
    )
    try:
        r = box.py(
            "import signal, subprocess\n"
            f"attempt('attack', lambda: os.kill({victim.pid}, signal.SIGKILL))\n"
            "p = subprocess.run(['pkill', '-9', '-f', 'sleep " + marker + "'])\n"
            "print('pkill=' + str(p.returncode))\n"
            "own = subprocess.Popen(['sleep', '30'])\n"
            "os.kill(own.pid, signal.SIGKILL)\n"
            "print('twin=' + str(own.wait()))"
        )
        assert r.got.get("twin") == "-9", r  # twin: its own process can be killed
        assert victim.poll() is None, r  # evidence: the host process is alive
        assert pids_matching(f"sleep {marker}"), r
    finally:
        victim.kill()
        victim.wait()


def test_tiocsti_injection(box: Box) -> None:
    master, slave = pty.openpty()
    os.chmod(os.ttyname(slave), 0o666)
    try:
        r = box.py(
            "import fcntl, termios\n"
            "attempt('attack', lambda: fcntl.ioctl(0, termios.TIOCSTI, b'Z'))\n"
            "attempt('twin', lambda: fcntl.ioctl(0, termios.TCGETS, bytes(64)) and None)",
            stdin=slave,
        )
        assert r.ok("twin"), r  # twin: the terminal is usable
        os.set_blocking(master, False)
        try:
            typed = os.read(master, 100)
        except (BlockingIOError, OSError):
            typed = b""
        assert b"Z" not in typed, (typed, r)  # evidence: nothing queued on the host's tty
    finally:
        os.close(master)
        os.close(slave)


def _host_block_device() -> str | None:
    for name in sorted(os.listdir("/sys/block")):
        if not name.startswith(("loop", "ram", "zram")) and os.path.exists(f"/dev/{name}"):
            return f"/dev/{name}"
    return None


def test_raw_devices(box: Box) -> None:
    disk = _host_block_device() or "/dev/sda"
    devices = ["/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", disk]
    r = box.py(
        f"for i, d in enumerate({devices!r}):\n"
        "    attempt(f'open{i}', lambda: os.close(os.open(d, os.O_RDONLY)))\n"
        "attempt('mknod', lambda: os.mknod('blk', 0o600 | 0o060000, os.makedev(8, 0)))\n"
        "attempt('twin_null', lambda: write('/dev/null', 'x'))\n"
        "attempt('twin_random', lambda: len(open('/dev/urandom', 'rb').read(16)))"
    )
    assert r.ok("twin_null") and r.got.get("twin_random") == "ok:16", r
    for i in range(len(devices)):
        assert r.denied(f"open{i}"), (devices[i], r)
    assert r.denied("mknod") and not (box.ws / "blk").exists(), r


def test_kernel_attack_surface(box: Box) -> None:
    """Syscalls with a history of kernel exploits are refused outright."""
    r = box.py(
        "def sc(*a):\n"
        "    return c(libc.syscall, *a)\n"
        "attempt('bpf', sc(321, 0, 0, 0))\n"
        "attempt('perf_event_open', sc(298, 0, 0, -1, -1, 0))\n"
        "attempt('io_uring_setup', sc(425, 1, 0))\n"
        "attempt('userfaultfd', sc(323, 0))\n"
        "attempt('keyctl', sc(250, 0, 0, 0, 0, 0))\n"
        "attempt('kexec_load', sc(246, 0, 0, 0, 0))\n"
        "attempt('init_module', sc(175, 0, 0, 0))\n"
        "attempt('twin_getpid', sc(39))"
    )
    if os.uname().machine != "x86_64":
        pytest.skip("N.A.: the probe uses x86_64 syscall numbers")
    assert r.ok("twin_getpid"), r
    for name in ("bpf", "perf_event_open", "io_uring_setup", "userfaultfd", "keyctl",
                 "kexec_load", "init_module"):  # fmt: skip
        assert r.denied(name), (name, r)


def test_another_processs_limits(box: Box) -> None:
    """A host process of the same uid had its resource limits set from the landlock
    tier (prlimit --pid; no pid namespace there): refused on every tier, the host
    process's limits unchanged.  The twin: the command's own limits are its to set."""
    import subprocess

    c = box.c  # a host process of the uid under test, which the kernel lets it reach
    as_user = ["setpriv", f"--reuid={c.uid}", f"--regid={c.gid}", "--clear-groups"]
    host = subprocess.Popen([*as_user, "sleep", "30"], start_new_session=True)
    try:
        before = Path(f"/proc/{host.pid}/limits").read_text()
        r = box.py(
            "import resource\n"
            f"attempt('attack', lambda: resource.prlimit({host.pid}, resource.RLIMIT_NOFILE, (5, 5)))\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))\n"
            "print('twin=' + str(resource.getrlimit(resource.RLIMIT_NOFILE)[0]))\n"
        )
        assert r.got.get("twin") == "100", r
        assert r.got.get("attack", "").startswith("err:"), r
        assert Path(f"/proc/{host.pid}/limits").read_text() == before
    finally:
        host.kill()
        host.wait()
