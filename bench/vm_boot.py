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
* Warm ``Sandbox(tier="microvm").exec(["true"])``: the VM booted and the agent
  up; the median of many.  Goal: at most 5 ms.
* QEMU's resident memory of an idle ``Sandbox`` with 256 MiB of guest RAM
  (the agent running, sampled two seconds after a first exec).  Goal: at most
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
        cmdline=qemu.kernel_cmdline(qemu.host_facts().tsc_khz, mode=mode),
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
    return [sys.executable, "-m", "corral", "run", "--tier", "microvm", "-q", *args]


class Times:
    """Wall-clock milliseconds of each run that finished, and how many did not."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.failed = 0  # runs that failed or did not finish within two minutes

    def measure(self, argv: list[str], cwd: str | None = None) -> None:
        t = time.perf_counter()
        try:
            subprocess.run(
                argv,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                check=True,
                timeout=120,
            )
        except (subprocess.TimeoutExpired, subprocess.CalledProcessError):
            self.failed += 1
            return
        self.wall.append((time.perf_counter() - t) * 1000)


def boot_times(runs: int, ws: str) -> tuple[Times, Times, Times, str]:
    """Interleaved: raw boot to power-off, raw boot with the drivers loaded, ours."""
    ours, bare, booted = Times(), Times(), Times()
    found = _assets()
    if isinstance(found, str):
        return ours, bare, booted, found
    for _ in range(runs):
        bare.measure(raw_argv(*found, mode="off"))
        booted.measure(raw_argv(*found, mode="probe"))
        ours.measure(_runner(["--", "true"]), ws)
    return ours, bare, booted, f"accelerator {found[3]}"


def _status(pid: int) -> dict[str, int]:
    found = {}
    with open(f"/proc/{pid}/status", encoding="utf-8") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                found[key] = int(value.split()[0]) // 1024
    return found


def sandbox_figures(ws: str, execs: int) -> tuple[list[float], dict[str, int], str]:
    """Warm exec times (ms) and the idle QEMU's memory of one Sandbox with 256 MiB."""
    from corral import policy as pol
    from corral.errors import CorralError
    from corral.sandbox import Sandbox

    policy = pol.load(ws)
    policy.limits.memory = 256 << 20
    try:
        sb = Sandbox(policy, tier="microvm", log=False)
    except CorralError as exc:
        return [], {}, exc.message
    try:
        if sb.exec(["true"]).exit_code != 0:  # boots the VM
            return [], {}, "the first exec failed"
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
        return times, rss, "" if rss else "QEMU not found"
    finally:
        sb.close()


RAW_OFF = "raw QEMU, same kernel and initramfs, init powers off at once"
RAW_BOOTED = "raw QEMU, same kernel and initramfs, drivers loaded, then power-off"
OURS = "corral run --tier microvm -q -- true"


WARM = 'Sandbox(tier="microvm").exec(["true"]), warm'


def rows(quick: bool) -> list[Row]:
    ws = tempfile.mkdtemp(prefix="corral-vm-bench-", dir=os.path.expanduser("~"))
    try:
        ours, bare, booted, note = boot_times(3 if quick else 10, ws)
        times, rss, why = sandbox_figures(ws, 20 if quick else 100) if ours.wall else ([], {}, note)
    finally:
        shutil.rmtree(ws, ignore_errors=True)
    found = [
        Row("microvm boot", RAW_OFF, median(bare.wall), "ms", note=note),
        Row("microvm boot", RAW_BOOTED, median(booted.wall), "ms", RAW_OFF, note),
        Row("microvm boot", OURS, median(ours.wall), "ms", RAW_OFF, f"{note}; goal 1.2x"),
        Row("microvm exec", WARM, median(times), "ms", note=why or f"{note}; goal 5 ms"),
    ]
    for key, label in (
        ("VmRSS", "QEMU RSS, idle Sandbox, 256 MiB guest"),
        ("RssAnon", "of which anonymous"),
    ):
        value = rss.get(key)
        found.append(Row("microvm memory", label, value, "MiB", note=why or "goal 150 MiB"))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args(argv)
    ws = tempfile.mkdtemp(prefix="corral-vm-bench-", dir=os.path.expanduser("~"))
    try:
        ours, bare, booted, note = boot_times(args.runs, ws)
        if not ours.wall:
            print(f"not measured: {note}")
            return 0
        print(f"{note}; {args.runs} interleaved rounds, wall-clock medians")
        failed = {"bare": bare.failed, "booted": booted.failed, "ours": ours.failed}
        if any(failed.values()):
            print(f"runs that failed or hung (left out): {failed}")
        b_off, b_up, r = (median(t.wall) or 1.0 for t in (bare, booted, ours))
        print(f"{RAW_OFF}: {b_off:.0f} ms")
        print(f"{RAW_BOOTED}: {b_up:.0f} ms")
        ratios = f"{r / b_off:.2f}x the raw to power-off; {r / b_up:.2f}x the booted"
        print(f"{OURS}: {r:.0f} ms ({ratios})")
        times, rss, why = sandbox_figures(ws, 100)
        if why:
            print(f"Sandbox not measured: {why}")
        else:
            print(f"{WARM}: p50 {median(times):.1f} ms, min {min(times):.1f} ms (goal 5 ms)")
            print(
                f"QEMU RSS, idle Sandbox, 256 MiB guest: {rss['VmRSS']} MiB "
                f"(anonymous {rss['RssAnon']}, file {rss['RssFile']}; goal {GOAL_RSS_MIB} MiB)"
            )
    finally:
        shutil.rmtree(ws, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
