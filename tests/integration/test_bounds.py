"""Every run is bounded by default (issue 11, point 8): processes, memory and the private
scratch filesystems, on every tier, as root and as an unprivileged user.

Where this host cannot enforce a default for the user under test (memory and pids
as a user on this hybrid cgroup v1/v2 host), the run goes on and says so in one
line; these tests then assert that line instead of running the attack.  Each
deny test has its allow twin under the same policy.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
from conftest import Corral, is_gvisor, pids_matching, wait_for

from corral import bounds

DEFAULTS = bounds.defaults_for(bounds.host_facts())
NOTICE = b"corral: note: the default memory ("


def run(
    c: Corral, ws: Path, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    return c.run(["run", *args], cwd=ws, timeout=timeout)


def py(c: Corral, ws: Path, code: str, *flags: str) -> subprocess.CompletedProcess[bytes]:
    """python3 from the sandbox's PATH (the venv may live in the private /tmp)."""
    return run(c, ws, "-q", *flags, "--", "python3", "-c", code)


def defaults_enforced(c: Corral, ws: Path) -> bool:
    """Whether memory and pids defaults hold here for this user: the notice says not."""
    r = run(c, ws, "--", "true")
    assert r.returncode == 0, r.stderr
    if NOTICE not in r.stderr:
        return True
    notes = [
        line for line in r.stderr.splitlines() if line.startswith(b"corral: note: the default")
    ]
    assert len(notes) == 1, r.stderr  # one line per run
    assert b"memory (" in notes[0] and b"pids (4096)" in notes[0]
    assert b"not enforced for this user here" in notes[0]
    return False


def last_record(c: Corral) -> dict[str, object]:
    lines = (c.state / "corral" / "runs.jsonl").read_text().splitlines()
    record: dict[str, object] = json.loads(lines[-1])
    return record


# -- processes -----------------------------------------------------------------------------

BOMB = """
import os, sys
n = 0
try:
    for _ in range(6000):
        os.posix_spawnp('sleep', ['sleep', sys.argv[1]], os.environ)
        n += 1
except OSError as exc:
    print('stopped', exc.errno, flush=True)
print('spawned', n, flush=True)
"""


@pytest.mark.tiers(
    "namespace",
    why="the default pids limit is one cgroup setting on every tier, some 13 s a bomb; "
    "the conformance matrix forks one on each tier",
)
def test_fork_bomb_stops_at_the_default_pids(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    # allow twin: a -j64 build's worth of processes at once, under the defaults
    build = "for i in $(seq 64); do (sleep 0.3; echo built) & done; wait"
    ok = run(c, ws, "-q", "--", "sh", "-c", build)
    assert ok.returncode == 0 and ok.stdout.count(b"built") == 64, ok.stderr
    if not defaults_enforced(c, ws):
        # a fork bomb would not be bounded here: the notice above is what is promised
        assert last_record(c)["bounds"]["pids"] == {  # type: ignore[index]
            "value": 4096,
            "source": "default",
            "enforced": False,
        }
        return
    marker = f"{3000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6:06d}"
    r = run(c, ws, "--timeout", "90", "--", "python3", "-c", BOMB, marker, timeout=180)
    out = r.stdout.decode()
    if is_gvisor(c):
        # the pids cgroup counts gVisor's own host threads (about nine per process):
        # it stops the whole sandbox well before 4096 processes
        assert r.returncode != 0 or int(out.split("spawned ")[1].split()[0]) < 4096, r
    else:
        spawned = int(out.split("spawned ")[1].split()[0])
        assert "stopped 11" in out  # EAGAIN: the limit, not the loop's end
        assert 4000 < spawned < 4096, out  # the default, less corral's own few processes
        assert b"limit hit: pids" in r.stderr
        assert r.returncode == 0, r.stderr
    assert wait_for(lambda: not pids_matching(f"sleep {marker}"), 30), "processes left behind"
    assert last_record(c)["bounds"]["pids"]["enforced"] is True  # type: ignore[index]


# -- memory ----------------------------------------------------------------------------------


def _limits_seen_from_the_host(c: Corral, marker: str) -> tuple[int, int]:
    """(memory bytes, pids) of the cgroup the sandboxed ``sleep marker`` runs in."""
    if c.tier is not None and c.tier.tier == "container":
        names = subprocess.run(
            ["podman", "ps", "--filter", "label=corral=1", "--format", "{{.Names}}"],
            capture_output=True,
            text=True,
        ).stdout.split()
        for name in names:
            out = subprocess.run(
                ["podman", "inspect", "--format", "{{json .Config.Cmd}} "
                 "{{.HostConfig.Memory}} {{.HostConfig.PidsLimit}}", name],
                capture_output=True, text=True,
            ).stdout  # fmt: skip
            if marker in out:
                memory, pids = out.split()[-2:]
                return int(memory), int(pids)
        raise AssertionError(f"no container runs sleep {marker}")
    # not the sh or corral that name it; sh may not have started it yet
    assert wait_for(lambda: bool(pids_matching(f"^sleep {marker}")), 10)
    pid = pids_matching(f"^sleep {marker}")[0]
    paths = dict(line.split(":")[1:] for line in Path(f"/proc/{pid}/cgroup").read_text().split())
    memory = Path(f"/sys/fs/cgroup/memory{paths['memory']}/memory.limit_in_bytes").read_text()
    pids = Path(f"/sys/fs/cgroup/pids{paths['pids']}/pids.max").read_text()
    return int(memory), int(pids)


def test_default_memory_and_pids_are_in_force(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    if not defaults_enforced(c, ws):
        record = last_record(c)["bounds"]
        assert record["memory"] == {  # type: ignore[index]
            "value": DEFAULTS["memory"],
            "source": "default",
            "enforced": False,
        }
        # the report lists the bounds not in force (said once, before the run)
        reported = run(c, ws, "-q", "--report", "json", "--", "true")
        doc = json.loads(reported.stderr.decode().strip().splitlines()[-1])
        bounds = {d["name"] for d in doc["denials"] if d["kind"] == "bound"}
        assert {"memory", "pids"} <= bounds, doc
        # allow twin: lifted on purpose, nothing to say
        lifted = run(c, ws, "--memory", "none", "--pids", "none", "--", "true")
        assert lifted.returncode == 0 and lifted.stderr == b""
        return
    marker = f"{2000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6:06d}"
    proc = c.popen(
        ["run", "-q", "--", "sh", "-c", f"echo up; sleep {marker}"],
        cwd=ws,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        memory, pids = _limits_seen_from_the_host(c, marker)
    finally:
        proc.kill()
        proc.wait()
    assert memory == DEFAULTS["memory"] and pids == DEFAULTS["pids"]
    # allow twin: an ordinary allocation runs under the default
    ok = py(c, ws, "b = bytearray(256 << 20); print('allocated', len(b) >> 20)")
    assert ok.returncode == 0 and ok.stdout == b"allocated 256\n", ok.stderr


def test_policy_memory_overrides_the_default(tsandbox: tuple[Corral, Path]) -> None:
    """The kill itself, with a small limit from the policy file (the default's value is a
    unit test: tests/unit/test_bounds.py); a flag's none lifts it again."""
    c, ws = tsandbox
    (ws / "corral.toml").write_text('[limits]\nmemory = "64M"\n')
    c.chown(ws)
    big = py(c, ws, "b = bytearray(300 << 20); print('allocated')")
    if c.who == "user" and big.returncode == 122:  # a limit that was set: refused, not ignored
        assert b"cannot enforce the memory limit" in big.stderr
        lifted = py(c, ws, "print('ran')", "--memory", "none")
        assert lifted.returncode == 0 and lifted.stdout == b"ran\n"  # allow twin
        return
    assert big.returncode == 137 and b"allocated" not in big.stdout, big.stderr
    small = py(c, ws, "b = bytearray(8 << 20); print('allocated')")
    assert small.returncode == 0 and small.stdout == b"allocated\n"  # allow twin
    lifted = py(c, ws, "b = bytearray(300 << 20); print('allocated')", "--memory", "none")
    assert lifted.returncode == 0 and lifted.stdout == b"allocated\n"  # none: no bound


# -- scratch space -----------------------------------------------------------------------------

SIZES = """
import os
for path in ('/tmp', '/var/tmp', '/run', '/dev/shm'):
    st = os.statvfs(path)
    print(path, st.f_blocks * st.f_frsize)
"""

FILL = """
import errno, os, sys
def fill(path, mb):
    try:
        with open(path, 'wb') as f:
            for _ in range(mb):
                f.write(b'x' * (1 << 20))
                f.flush()
        return 'ok'
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    finally:
        if os.path.exists(path):
            os.unlink(path)
for where, within, past in (('/tmp', 8, 32), ('/var/tmp', 8, 32), ('/dev/shm', 4, 16)):
    print(where, fill(where + '/f', within), fill(where + '/f', past))
"""


def _sizes(out: bytes) -> dict[str, int]:
    return {path: int(size) for path, size in (line.split() for line in out.decode().splitlines())}


@pytest.mark.tiers("namespace", "container", "gvisor", why="no private /tmp or /dev/shm")
def test_scratch_filesystems_have_the_default_sizes(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    r = py(c, ws, SIZES)
    assert r.returncode == 0, r.stderr
    assert _sizes(r.stdout) == {
        "/tmp": DEFAULTS["tmp"],
        "/var/tmp": DEFAULTS["tmp"],
        "/run": bounds.RUN_SIZE,
        "/dev/shm": DEFAULTS["shm"],
    }
    # allow twin: none lifts them (the kernel's or runtime's own size, larger than ours)
    lifted = _sizes(py(c, ws, SIZES, "--tmp", "none", "--shm", "none").stdout)
    assert lifted["/tmp"] > DEFAULTS["tmp"] and lifted["/var/tmp"] > DEFAULTS["tmp"]
    assert lifted["/dev/shm"] > DEFAULTS["shm"] or lifted["/dev/shm"] == 0  # 0: gVisor, none


@pytest.mark.tiers("namespace", "container", "gvisor", why="no private /tmp or /dev/shm")
def test_writing_past_the_scratch_size_is_enospc(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    expected = b"/tmp ok ENOSPC\n/var/tmp ok ENOSPC\n/dev/shm ok ENOSPC\n"
    flags = py(c, ws, FILL, "--tmp", "16M", "--shm", "8M")
    assert flags.returncode == 0 and flags.stdout == expected, flags.stderr
    (ws / "corral.toml").write_text('[limits]\ntmp = "16M"\nshm = "8M"\n')
    c.chown(ws)
    policy = py(c, ws, FILL)
    assert policy.returncode == 0 and policy.stdout == expected, policy.stderr
    # allow twin: the flag's none lifts the policy's sizes
    lifted = py(c, ws, FILL, "--tmp", "none", "--shm", "none")
    assert lifted.stdout == b"/tmp ok ok\n/var/tmp ok ok\n/dev/shm ok ok\n", lifted.stderr


@pytest.mark.tiers("landlock", why="the tier without a private /tmp")
def test_landlock_scratch_is_on_disk_and_a_set_tmp_is_refused(
    tsandbox: tuple[Corral, Path],
) -> None:
    c, ws = tsandbox
    refused = run(c, ws, "-q", "--tmp", "1G", "--", "true")
    assert refused.returncode == 122 and refused.stderr.count(b"\n") == 1
    assert b"cannot enforce the tmp limit on the landlock tier" in refused.stderr
    # allow twin: the default run has a private TMPDIR it can write 32 MiB into
    r = run(c, ws, "-q", "--", "sh", "-c", 'head -c 33554432 /dev/zero > "$TMPDIR/f" && echo ok')
    assert r.returncode == 0 and r.stdout == b"ok\n", r.stderr
    explain = run(c, ws, "--explain", "--", "true").stdout.decode()
    assert "bounded only by that filesystem's free space" in explain


# -- what corral says about them ----------------------------------------------------------------


def test_explain_and_doctor_state_the_defaults(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    explain = run(c, ws, "--explain", "--", "true")
    assert explain.returncode == 0, explain.stderr
    text = explain.stdout.decode()
    mem = bounds.size_text(DEFAULTS["memory"])
    line = next(x for x in text.splitlines() if x.strip().startswith("memory "))
    assert f" {mem} " in line and "(default)" in line
    enforced = defaults_enforced(c, ws)
    assert ("NOT enforced" not in line) == enforced, line
    assert "pids     4096     (default)" in text
    doctor = c.run(["doctor"], cwd=ws)
    assert doctor.returncode == 0
    out = doctor.stdout.decode()
    assert "defaults (this host: " in out
    mem_line = next(x for x in out.splitlines() if x.startswith(f"  memory  {mem} "))
    assert ("NOT enforced for this user" not in mem_line) == enforced, mem_line
    data = json.loads(c.run(["doctor", "--json"], cwd=ws).stdout)
    assert data["defaults"]["pids"]["value"] == 4096
    assert data["defaults"]["tmp"]["value"] == DEFAULTS["tmp"]


def test_quiet_silences_the_notice(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    loud = run(c, ws, "--", "true")
    quiet = run(c, ws, "-q", "--", "true")
    assert loud.returncode == quiet.returncode == 0
    assert quiet.stderr == b""  # -q: no tier line, no notice
    assert loud.stderr.count(NOTICE) == (0 if defaults_enforced(c, ws) else 1)


# -- the Python API ------------------------------------------------------------------------------


@pytest.mark.tiers("namespace", "container", "gvisor", why="no private /tmp or /dev/shm")
def test_sandbox_api_gets_the_defaults(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    assert c.tier is not None  # tsandbox: always a tier case
    code = f"""
import os, sys
from corral import policy as pol
from corral.policy import Policy
from corral.sandbox import Sandbox
for p in (pol.load({str(ws)!r}), Policy({str(ws)!r})):  # loaded, or built by hand
    with Sandbox(p, **{c.tier.api!r}) as sb:
        r = sb.exec(["python3", "-c", {SIZES!r}])
        print(r.stdout.decode().split()[1], sb.plan.bounds["memory"].enforced, flush=True)
"""
    python = c.argv([])[:-2]  # [setpriv ...] python, without "-m corral"
    r = subprocess.run([*python, "-c", code], cwd=ws, env=c.env(), capture_output=True, timeout=180)
    assert r.returncode == 0, r.stderr
    enforced = "True" if c.who == "root" else "False"
    assert r.stdout.decode().split("\n")[:2] == [f"{DEFAULTS['tmp']} {enforced}"] * 2


def test_shell_is_bounded_the_same_way(tsandbox: tuple[Corral, Path]) -> None:
    c, ws = tsandbox
    r = c.run(["shell", "--", "python3", "-c", SIZES], cwd=ws, input=b"")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count(NOTICE) == (0 if defaults_enforced(c, ws) else 1)
    if c.has("private-tmp"):
        assert _sizes(r.stdout.replace(b"\r", b""))["/tmp"] == DEFAULTS["tmp"]
    quiet = c.run(["shell", "-q", "--", "true"], cwd=ws, input=b"")
    assert quiet.returncode == 0 and quiet.stderr == b""  # allow twin: -q, nothing said
