"""The microVM building blocks: boot-to-``true`` against a raw QEMU boot, and QEMU's RSS.

Run from the repository root (after ``python -m corral.vm.setup``)::

    python -m bench.vm_boot [--runs 10]

* ``python -m corral.vm.run -q -- true``: the whole run (runner start, the plan,
  QEMU in its bubblewrap sandbox, the guest's init mounting the host's view
  over 9p, the command, the report), against raw QEMU booting the same kernel
  and initramfs straight to power-off (``corral.mode=off``: the init powers off
  as its first act), with the same machine type, accelerator and guest RAM.
  Interleaved, one of each per round.  Goal: at most 1.2x.
* QEMU's resident memory with 256 MiB of guest RAM, idle: the command is
  ``sleep``, sampled two seconds after it started.  Goal: at most 150 MiB.
  Also its anonymous part (the file part is the kernel QEMU keeps mapped,
  shared through the page cache by every VM on the host).
"""

from __future__ import annotations

import argparse
import os
import resource
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


def raw_argv(qemu_path: str, vmlinux: str, initrd: str, accel: str) -> list[str]:
    from corral.vm import qemu

    machine = qemu.Machine(
        accel=accel,
        cpus=1,
        memory_mib=qemu.GUEST_MEMORY_DEFAULT,
        cmdline=qemu.kernel_cmdline(qemu.host_facts().tsc_khz, mode="off"),
        qemu=qemu_path,
        kernel=vmlinux,
        initrd=initrd,
    )
    return qemu.qemu_argv(machine)


def _runner(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "corral.vm.run", "-q", *args]


class Times:
    """Wall-clock and CPU milliseconds (the CPU time of the process and everything
    it waited for: under TCG, a busy host stretches the wall clock, not the CPU)."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def measure(self, argv: list[str], cwd: str | None = None) -> None:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(
            argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True
        )
        self.wall.append((time.perf_counter() - t) * 1000)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        used = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        self.cpu.append(used * 1000)


def boot_times(runs: int, ws: str) -> tuple[Times, Times, str]:
    ours, base = Times(), Times()
    found = _assets()
    if isinstance(found, str):
        return ours, base, found
    raw = raw_argv(*found)
    for _ in range(runs):
        base.measure(raw)
        ours.measure(_runner(["--", "true"]), ws)
    return ours, base, f"accelerator {found[3]}"


def _status(pid: int) -> dict[str, int]:
    found = {}
    with open(f"/proc/{pid}/status", encoding="utf-8") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                found[key] = int(value.split()[0]) // 1024
    return found


def idle_rss(ws: str) -> tuple[dict[str, int], str]:
    started = os.path.join(ws, "started")
    proc = subprocess.Popen(
        _runner(["--memory", "256M", "--", "sh", "-c", "touch started; exec sleep 60"]),
        cwd=ws,
        stdin=subprocess.DEVNULL,
    )
    name = f"corral-vm-{proc.pid}-"  # the runner names its VM after its pid
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(started) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2)
        out = subprocess.run(
            ["pgrep", "-f", f"^/usr/bin/qemu-system-x86_64 -name {name}"],
            capture_output=True,
            text=True,
        ).stdout.split()
        if not out:
            return {}, "QEMU not found"
        return _status(int(out[0])), ""
    finally:
        proc.terminate()
        proc.wait()


def rows(quick: bool) -> list[Row]:
    ws = tempfile.mkdtemp(prefix="corral-vm-bench-", dir=os.path.expanduser("~"))
    try:
        ours, base, note = boot_times(3 if quick else 10, ws)
        rss, why = idle_rss(ws) if ours.wall else ({}, note)
    finally:
        shutil.rmtree(ws, ignore_errors=True)
    raw = "raw QEMU, same kernel and initramfs, to power-off"
    run = "python -m corral.vm.run -q -- true"
    found = [
        Row("microvm boot", raw, median(base.wall), "ms", note=note),
        Row("microvm boot", run, median(ours.wall), "ms", raw, note),
        Row("microvm boot, CPU time", raw, median(base.cpu), "ms", note=note),
        Row("microvm boot, CPU time", run, median(ours.cpu), "ms", raw, note),
    ]
    for key, label in (
        ("VmRSS", "QEMU RSS, idle, 256 MiB guest"),
        ("RssAnon", "of which anonymous"),
    ):
        value = rss.get(key)
        found.append(Row("microvm memory", label, value, "MiB", note=why))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args(argv)
    ws = tempfile.mkdtemp(prefix="corral-vm-bench-", dir=os.path.expanduser("~"))
    try:
        ours, base, note = boot_times(args.runs, ws)
        if not ours.wall:
            print(f"not measured: {note}")
            return 0
        print(f"{note}; {args.runs} rounds, medians (wall clock / CPU time)")
        for label, times in (("raw QEMU boot to power-off", base), ("corral.vm.run -- true", ours)):
            print(
                f"{label:28} {median(times.wall) or 0:6.0f} ms / {median(times.cpu) or 0:6.0f} ms"
            )
        for kind in ("wall", "cpu"):
            r = median(getattr(ours, kind)) or 0.0
            b = median(getattr(base, kind)) or 1.0
            print(f"ratio ({kind}): {r / b:.2f}x (goal {GOAL_RATIO}x)")
        rss, why = idle_rss(ws)
        if why:
            print(f"RSS not measured: {why}")
        else:
            print(
                f"QEMU RSS idle, 256 MiB guest: {rss['VmRSS']} MiB "
                f"(anonymous {rss['RssAnon']}, file {rss['RssFile']}; goal {GOAL_RSS_MIB} MiB)"
            )
    finally:
        shutil.rmtree(ws, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
