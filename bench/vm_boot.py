"""The microvm tier: boot-to-``true`` against a raw QEMU boot, warm exec, QEMU's RSS.

Run from the repository root (after ``python -m corral.vm.setup``)::

    python -m bench.vm_boot [--runs 10]      # or: python -m bench --only microvm

* ``corral run --tier microvm -q -- true``: the whole run (corral's start, the plan,
  QEMU in its bubblewrap sandbox, the guest's init mounting the host's view
  over 9p, the command, the report), against raw QEMU (no sandbox, no runner)
  booting the same kernel and initramfs to power-off, two ways: the init powers
  off as its first act (``corral.mode=off``: the kernel alone), or once the
  guest is up, its drivers loaded and its control port found
  (``corral.mode=probe``).  Same machine type, accelerator and guest RAM.
  Interleaved, one of each per round.  Goal: at most 1.2x the booted raw.
* The same ``corral run`` restoring the machine's saved state (the warm start,
  :mod:`corral.vm.snapshot`), against raw QEMU restoring the same state file
  (no sandbox, no runner) with a request that powers the guest off; and
  ``CORRAL_VM_WARM=0`` for the boot.
* Time to a ready ``Sandbox(tier="microvm")``: constructed, its VM started, the
  agent up and a first ``exec(["true"])`` done; booted and restored,
  interleaved, at least 10 of each.  Goal: 300 ms.
* Warm ``Sandbox(tier="microvm").exec(["true"])``: the VM started and the agent
  up; the median of many, in a booted and in a restored VM.  Goal: at most 5 ms.
* QEMU's resident memory of an idle ``Sandbox`` with 256 MiB of guest RAM
  (the agent running, sampled two seconds after the last exec), booted and
  restored.  Goal: at most
  150 MiB.  Also its anonymous part (the file part is the kernel QEMU keeps
  mapped, shared through the page cache by every VM on the host).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench.common import Row, median

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.vm.run import VmPlan

GOAL_RATIO = 1.2
GOAL_RSS_MIB = 150


def _assets() -> tuple[str, str, str, str] | str:
    """(qemu, vmlinux, initrd, accel) or why the VM cannot run here."""
    from corral.errors import CorralError
    from corral.vm import initramfs, probe, run, setup

    try:
        assets = setup.require()
    except CorralError as exc:
        return exc.message
    qemu_path = run.find_program("qemu-system-x86_64")
    busybox = initramfs.find_busybox()
    if qemu_path is None or busybox is None:
        return "QEMU or a static busybox is missing"
    initrd = initramfs.cached(assets, busybox, setup.cache_dir())
    decision = probe.decide(qemu_path, assets, initrd, setup.cache_dir())
    return qemu_path, assets.vmlinux, initrd, decision.accel


def raw_argv(qemu_path: str, vmlinux: str, initrd: str, accel: str, mode: str) -> list[str]:
    """QEMU alone, no sandbox: ``mode`` off (the init powers off first thing) or
    probe (it loads the drivers, finds its control port, then powers off)."""
    from corral.vm import qemu

    machine = qemu.Machine(
        accel=accel,
        cpus=1,
        memory_mib=qemu.GUEST_MEMORY_DEFAULT,
        cmdline=qemu.kernel_cmdline(qemu.host_facts().tsc_khz, mode=mode, accel=accel),
        qemu=qemu_path,
        kernel=vmlinux,
        initrd=initrd,
    )
    argv = qemu.qemu_argv(machine)
    if mode == "probe":  # a control port that swallows the init's "ready"
        argv += ["-device", "virtio-serial-device", "-chardev", "file,id=ctl,path=/dev/null"]
        argv += ["-device", "virtserialport,chardev=ctl,name=corral.ctl,nr=1"]
    return argv


def _runner(args: list[str]) -> list[str]:
    return [sys.executable, "-P", "-m", "corral", "run", "--tier", "microvm", "-q", *args]


def _run_env(**extra: str) -> dict[str, str]:
    """The environment of a timed ``corral run``: the corral this benchmark imported
    first on its path.  Each run starts in its workspace, where a relative
    PYTHONPATH (``PYTHONPATH=src`` in a worktree) names nothing, and the run would
    time whichever corral the venv has installed instead."""
    import corral

    src = os.path.dirname(os.path.dirname(os.path.abspath(corral.__file__)))
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, **extra, "PYTHONPATH": src + (os.pathsep + path if path else "")}


COLD_ENV = _run_env(CORRAL_VM_WARM="0")  # corral boots, as before the warm start


class Times:
    """Wall-clock milliseconds of each run that finished, and how many did not."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.failed = 0  # runs that failed or did not finish within two minutes

    def measure(
        self, argv: list[str], cwd: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        t = time.perf_counter()
        try:
            subprocess.run(
                argv,
                cwd=cwd,
                env=env if env is not None else _run_env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                check=True,
                timeout=120,
            )
        except (subprocess.TimeoutExpired, subprocess.CalledProcessError):
            self.failed += 1
            return
        self.wall.append((time.perf_counter() - t) * 1000)

    def add(self, seconds: float) -> None:
        self.wall.append(seconds * 1000)


def raw_restore(qemu_path: str, vmlinux: str, initrd: str, ws: str) -> tuple[list[str], int] | str:
    """Raw QEMU (no sandbox, no runner) restoring corral's saved state of the
    machine ``corral run -- true`` in ``ws`` uses; its guest is sent a request
    that powers it off.  (argv, state fd) or why not."""
    from corral.vm import qemu

    plan = _vm_plan(ws)
    warm = plan.warm()
    if not warm.restore or plan.machine is None:
        return f"no saved state to restore ({warm.why})"
    fd = os.open(warm.path, os.O_RDONLY)
    argv = qemu.qemu_argv(plan.machine)
    argv = [a.replace("/vm/vmlinux", vmlinux).replace("/vm/initrd", initrd) for a in argv]
    # the exports straight from the host (the workspace, the home layer), not QEMU's view
    argv = [a.replace("path=/guest/", "path=/").replace("path=/guest,", "path=/,") for a in argv]
    return [*argv, "-incoming", f"fd:{fd}"], fd


def _vm_plan(ws: str) -> VmPlan:
    """The VM plan of ``corral run --tier microvm -- true`` in ``ws`` (the tier's, the
    home layer's export included: the machine whose state that run saved)."""
    from corral import policy as pol
    from corral.tiers import get

    plan = get("microvm").plan(pol.load(ws), ["true"])
    vm: VmPlan = plan.strategy.vm  # type: ignore[attr-defined]
    return vm


def measure_raw_restore(argv: list[str], fd: int, plan_fds: dict[int, str], times: Times) -> None:
    """One raw restore: the ports and the monitor socket pairs on the numbers the
    argv names, the state on ``fd``; done when QEMU has exited."""
    import socket

    from corral.launch import move_fds_into_place

    null = os.open(os.devnull, os.O_RDWR)
    ours, wanted = {}, {0: null, 1: null, 2: null, fd: fd}
    for number, what in plan_fds.items():
        if what not in ("status", "seccomp", "empty", "state"):
            ours[what], theirs = socket.socketpair()
            wanted[number] = theirs.detach()
    os.lseek(fd, 0, os.SEEK_SET)  # QEMU reads it through the shared offset
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            move_fds_into_place(wanted)
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    for number, mine in wanted.items():
        if number > 2 and number != fd:
            os.close(mine)
    os.close(null)
    ours["corral.ctl"].sendall(b"1\npoweroff -f\n")  # the request (one line): power off
    _, status = os.waitpid(pid, 0)
    if status == 0:
        times.add(time.perf_counter() - t)
    else:
        times.failed += 1
    for sock in ours.values():
        sock.close()


def boot_times(runs: int, ws: str) -> tuple[dict[str, Times], str]:
    """Interleaved, one of each per round: raw boots to power-off (at once, and with
    the drivers loaded), raw restores of the saved state, corral run booting
    (warm start off) and corral run restoring."""
    times = {k: Times() for k in (RAW_OFF, RAW_BOOTED, RAW_RESTORE, OURS_COLD, OURS)}
    found = _assets()
    if isinstance(found, str):
        return times, found
    Times().measure(_runner(["--", "true"]), ws)  # saves the state the warm runs restore
    restore = raw_restore(*found[:3], ws)
    for _ in range(runs):
        times[RAW_OFF].measure(raw_argv(*found, mode="off"))
        times[RAW_BOOTED].measure(raw_argv(*found, mode="probe"))
        if not isinstance(restore, str):
            measure_raw_restore(*restore, _plan_fds(ws), times[RAW_RESTORE])
        times[OURS_COLD].measure(_runner(["--", "true"]), ws, COLD_ENV)
        times[OURS].measure(_runner(["--", "true"]), ws)
    why = restore if isinstance(restore, str) else ""
    return times, f"accelerator {found[3]}" + (f"; {why}" if why else "")


def _plan_fds(ws: str) -> dict[int, str]:
    return _vm_plan(ws).fds


def start_times(ws: str, rounds: int) -> tuple[Times, Times, str]:
    """Time to a ready Sandbox (constructed, its VM started, its agent up and a first
    exec(["true"]) done), booted and restored, interleaved."""
    from corral import policy as pol
    from corral.errors import CorralError
    from corral.sandbox import Sandbox

    cold, warm = Times(), Times()
    for n in range(rounds * 2):
        restore = n % 2 == 1
        if restore:
            os.environ.pop("CORRAL_VM_WARM", None)
        else:
            os.environ["CORRAL_VM_WARM"] = "0"
        try:
            t = time.perf_counter()
            with Sandbox(pol.load(ws), tier="microvm", log=False) as sb:
                if sb.exec(["true"]).exit_code != 0:
                    return cold, warm, "the first exec failed"
                (warm if restore else cold).add(time.perf_counter() - t)
        except CorralError as exc:
            return cold, warm, exc.message
        finally:
            os.environ.pop("CORRAL_VM_WARM", None)
    return cold, warm, ""


def _status(pid: int) -> dict[str, int]:
    found = {}
    with open(f"/proc/{pid}/status", encoding="utf-8") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                found[key] = int(value.split()[0]) // 1024
    return found


# What an exec of /usr/bin/true costs the emulated CPU itself: a Python loop in the
# guest that spawns it with its output on pipes and waits, as the agent does, with
# no agent, no request and no host round trip.  The warm exec row cannot go below it.
FLOOR_CODE = """
import os, statistics, sys, time
took = []
for _ in range(int(sys.argv[1])):
    start = time.monotonic()
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    acts = [(os.POSIX_SPAWN_DUP2, w1, 1), (os.POSIX_SPAWN_DUP2, w2, 2)]
    pid = os.posix_spawn("/usr/bin/true", ["true"], {}, file_actions=acts, setsid=True)
    os.close(w1)
    os.close(w2)
    os.read(r1, 64)
    os.read(r2, 64)
    os.close(r1)
    os.close(r2)
    os.waitpid(pid, 0)
    took.append((time.monotonic() - start) * 1000)
print(statistics.median(took))
"""


def guest_floor(sb: object, execs: int) -> float | None:
    """FLOOR_CODE's median in ms, run inside the Sandbox ``sb`` (None: no python3 there)."""
    result = sb.exec(["python3", "-c", FLOOR_CODE, str(execs)])  # type: ignore[attr-defined]
    try:
        return float(result.stdout)
    except ValueError:
        return None


def sandbox_figures(
    ws: str, execs: int, restore: bool
) -> tuple[list[float], dict[str, int], str, float | None]:
    """Warm exec times (ms), the idle QEMU's memory and the guest's own floor for an
    exec (:func:`guest_floor`) of one Sandbox with 256 MiB, booted (``restore``
    False) or restored from its saved state."""
    from corral import policy as pol
    from corral.errors import CorralError
    from corral.sandbox import Sandbox

    policy = pol.load(ws)
    policy.limits.memory = 256 << 20
    if restore:  # a state of this machine to restore
        with Sandbox(policy, tier="microvm", log=False) as first:
            first.exec(["true"])
    else:
        os.environ["CORRAL_VM_WARM"] = "0"
    try:
        sb = Sandbox(policy, tier="microvm", log=False)
    except CorralError as exc:
        return [], {}, exc.message, None
    try:
        if sb.exec(["true"]).exit_code != 0:  # starts the VM
            return [], {}, "the first exec failed", None
        times = []
        for _ in range(execs):
            t = time.perf_counter()
            sb.exec(["true"])
            times.append((time.perf_counter() - t) * 1000)
        time.sleep(2)
        out = subprocess.run(
            ["pgrep", "-f", f"^/usr/bin/qemu-system-x86_64 -name corral-vm-{os.getpid()}-"],
            capture_output=True,
            text=True,
        ).stdout.split()
        rss = _status(max(int(p) for p in out)) if out else {}  # QEMU: the newest of the three
        floor = guest_floor(sb, execs)  # (after the RSS: a Python start grows the guest's)
        return times, rss, "" if rss else "QEMU not found", floor
    finally:
        sb.close()
        os.environ.pop("CORRAL_VM_WARM", None)


RAW_OFF = "raw QEMU, same kernel and initramfs, init powers off at once"
RAW_BOOTED = "raw QEMU, same kernel and initramfs, drivers loaded, then power-off"
RAW_RESTORE = "raw QEMU restoring the same saved state, its guest told to power off"
OURS_COLD = "corral run --tier microvm -q -- true, booting (CORRAL_VM_WARM=0)"
OURS = "corral run --tier microvm -q -- true, warm start (the saved state restored)"
READY_COLD = 'Sandbox(tier="microvm") to a first exec(["true"]) done, booting'
READY = 'Sandbox(tier="microvm") to a first exec(["true"]) done, warm start'
WARM = 'Sandbox(tier="microvm").exec(["true"]), warm'
FLOOR = "the guest's floor: posix_spawn of /usr/bin/true + waitpid in a Python loop inside"
FLOOR_NOTE = "no agent, no request, no host round trip: what the emulated CPU needs"


def rows(quick: bool, runs: int | None = None) -> list[Row]:
    rounds = runs or (3 if quick else 10)
    ws = tempfile.mkdtemp(prefix="corral-vm-bench-", dir=os.path.expanduser("~"))
    try:
        boots, note = boot_times(rounds, ws)
        cold, warm, why = (
            start_times(ws, max(rounds, 10))
            if boots[OURS].wall
            else (
                Times(),
                Times(),
                note,
            )
        )
        execs = 20 if quick else 100
        booted = sandbox_figures(ws, execs, False) if not why else ([], {}, why, None)
        restored = sandbox_figures(ws, execs, True) if not why else ([], {}, why, None)
    finally:
        shutil.rmtree(ws, ignore_errors=True)
    boot = "microvm boot"
    found = [
        Row(boot, RAW_OFF, median(boots[RAW_OFF].wall), "ms", note=note),
        Row(boot, RAW_BOOTED, median(boots[RAW_BOOTED].wall), "ms", RAW_OFF, note),
        Row(boot, OURS_COLD, median(boots[OURS_COLD].wall), "ms", RAW_OFF, f"{note}; goal 1.2x"),
        Row(boot, RAW_RESTORE, median(boots[RAW_RESTORE].wall), "ms", RAW_OFF, note),
        Row(boot, OURS, median(boots[OURS].wall), "ms", RAW_RESTORE, note),
        Row("microvm start", READY_COLD, median(cold.wall), "ms", note=why or note),
        Row("microvm start", READY, median(warm.wall), "ms", READY_COLD, why or "goal 300 ms"),
    ]
    for how, (times, rss, why_vm, floor) in (("booted", booted), ("restored", restored)):
        label = f"{WARM}, VM {how}"
        found.append(Row("microvm exec", label, median(times), "ms", note=why_vm or "goal 5 ms"))
        found.append(
            Row("microvm exec", f"{FLOOR}, VM {how}", floor, "ms", note=why_vm or FLOOR_NOTE)
        )
        for key, what in (("VmRSS", "QEMU RSS"), ("RssAnon", "of which anonymous")):
            label = f"{what}, idle Sandbox, 256 MiB guest, VM {how}"
            value = rss.get(key)
            found.append(Row("microvm memory", label, value, "MiB", note=why_vm or "goal 150 MiB"))
    failed = {k: t.failed for k, t in {**boots, READY_COLD: cold, READY: warm}.items() if t.failed}
    if failed:
        found[0].note += f"; runs that failed or hung, left out: {failed}"
    return found


def main(argv: list[str] | None = None) -> int:
    from bench.common import table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args(argv)
    print("\n".join(table(rows(False, args.runs))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
