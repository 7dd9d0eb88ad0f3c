"""Resources: fork bomb, memory, a RAM-backed disk, output flood, wall clock,
processes left behind.  Each is bounded twice: by the limit under test and by a
timeout, so a tier that fails the case still cannot hurt the host.

Limits need cgroups; where this host refuses them for the user under test
(exit 122, "cannot enforce ..."), the case is N.A. with corral's own reason.
"""

# Probe programs are embedded one statement per line; wrapping them hurts more than long lines.
# ruff: noqa: E501

from __future__ import annotations

import time

import pytest

from .conftest import Box, pids_matching, wait_for


def _marker(box: Box) -> str:
    # `sleep` takes it as a number of seconds: long enough to outlive the test.
    return f"{4000 + int(box.token[:4], 16) % 1000}.{int(box.token[4:], 16) % 10**6:06d}"


def test_fork_bomb(box: Box) -> None:
    marker = _marker(box)
    r = box.limited(
        "n = 0\n"
        "for i in range(400):\n"
        "    try:\n"
        f"        os.posix_spawn('/bin/sleep', ['sleep', {marker!r}], os.environ)\n"
        "        n += 1\n"
        "    except OSError:\n"
        "        break\n"
        "    if n == 10:\n"
        "        print('twin=ok', flush=True)\n"
        "print(f'spawned={n}', flush=True)\n",
        "--pids",
        "64",
        "--timeout",
        "20",
        timeout=40,
    )
    assert r.got.get("twin") == "ok", r  # twin: ten processes are fine under the same limit
    assert int(r.got.get("spawned", "400")) < 64, r
    # evidence: nothing of it is left on the host once corral has returned
    assert wait_for(lambda: not pids_matching(f"sleep {marker}"), 5), r


_CHILD = (
    "import subprocess, sys\n"
    "def child(code):\n"
    "    p = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)\n"
    "    return f'{p.returncode}:{p.stdout.strip()}'\n"
)


def test_memory_limit(box: Box) -> None:
    r = box.limited(
        _CHILD + "print('twin=' + child(\"b = bytearray(16 << 20); print('ok')\"), flush=True)\n"
        "print('attack=' + child(\"b = bytearray(512 << 20); print('ALLOCATED')\"), flush=True)\n",
        "--memory",
        "64M",
        "--timeout",
        "30",
    )
    assert r.got.get("twin") == "0:ok", r
    assert "ALLOCATED" not in r.out, r
    # containers: the engine enforces the limit; when the kill takes the whole
    # container (gVisor always), nothing inside is left to report it: exit 137
    whole = not box.has("host-root") and r.code == 137
    assert "limit hit: memory" in r.err or r.got.get("attack", "").startswith("-9") or whole, r


def test_ram_disk_fill(box: Box) -> None:
    """The private /tmp is RAM: filling it must run into the memory limit, not the host's RAM."""
    if not box.has("private-tmp"):
        pytest.skip("N.A.: no RAM-backed /tmp on this tier (/tmp is off limits; TMPDIR is on disk)")
    write = (
        "import os\n"
        "f = open('/tmp/fill', 'wb'); chunk = b'x' * (1 << 20); n = 0\n"
        "try:\n"
        "    for _ in range({mb}):\n"
        "        f.write(chunk); f.flush(); n += 1\n"
        "finally:\n"
        "    print(n)\n"
    )
    r = box.limited(
        _CHILD + f"print('twin=' + child({write.format(mb=8)!r}), flush=True)\n"
        "os.unlink('/tmp/fill')\n"
        f"print('attack=' + child({write.format(mb=256)!r}), flush=True)\n",
        "--memory",
        "64M",
        "--timeout",
        "30",
    )
    assert r.got.get("twin") == "0:8", r
    # The tmpfs pages stay charged to the sandbox after the writer dies, so the
    # limit may take the whole run down: either way the 256 MB never landed.
    assert r.got.get("attack") != "0:256", r
    # containers: the kill takes the whole container, the reporter inside too: exit 137
    assert "limit hit: memory" in r.err or (not box.has("host-root") and r.code == 137), r


def test_output_flood(box: Box) -> None:
    t0 = time.monotonic()
    r = box.py(
        "print('twin=first line', flush=True)\n"
        "line = 'y' * 1023 + '\\n'\n"
        "for _ in range(50 * 1024):\n"
        "    sys.stdout.write(line)\n",  # 50 MB
        "--output-limit",
        "1M",
        "--timeout",
        "60",
        timeout=90,
    )
    assert r.got.get("twin") == "first line", r  # twin: output before the limit is kept
    assert len(r.out) <= (1 << 20) + 4096, len(r.out)  # evidence: what the host received
    assert time.monotonic() - t0 < 60


def test_wall_clock_timeout(box: Box) -> None:
    t0 = time.monotonic()
    r = box.py(
        "print('twin=started', flush=True)\ntime.sleep(60)\nprint('attack=OUTLIVED')",
        "--timeout",
        "3",  # the clock starts with the launch: gVisor's start alone took 1 s under load
        timeout=30,
    )
    took = time.monotonic() - t0
    assert r.got.get("twin") == "started", r
    assert "OUTLIVED" not in r.out and took < 15, (took, r)
    assert r.code != 0, r


def test_leftover_processes(box: Box) -> None:
    """A daemon that double-forks into its own session does not outlive the run."""
    marker = _marker(box)
    r = box.py(
        "import subprocess\n"
        f"subprocess.Popen(['setsid', 'sh', '-c', 'sleep {marker} &'], start_new_session=True)\n"
        "time.sleep(0.3)\n"
        "print('twin=' + subprocess.run(['echo', 'fg'], capture_output=True, text=True).stdout.strip())\n"
    )
    assert r.got.get("twin") == "fg", r
    assert wait_for(lambda: not pids_matching(f"sleep {marker}"), 5), r
