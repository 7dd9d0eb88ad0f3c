"""KVM or TCG: decided by booting the guest once, not by ``/dev/kvm`` existing.

A host can have ``/dev/kvm`` and still not boot a stock kernel with it (this
project's machine is itself a VM whose KVM is PVM, on which a Debian kernel
hangs before printing its first line).  So the first run boots the guest with
``-accel kvm`` and ``corral.mode=probe``: the init says ``ready`` on the control
port and powers off.  No ``ready`` within :data:`PROBE_TIMEOUT` seconds means
TCG.  The answer is cached under a key of the host kernel, the QEMU binary and
the guest kernel, so a change of any of them probes again.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import time

from corral.vm import qemu

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from corral.vm.setup import Assets

PROBE_TIMEOUT = 8.0  # a KVM boot to the init takes well under a second


class Decision:
    __slots__ = ("accel", "cached", "reason")

    def __init__(self, accel: str, reason: str, cached: bool = False) -> None:
        self.accel = accel  # "kvm" or "tcg"
        self.reason = reason  # one line: why this accelerator
        self.cached = cached


def kvm_problem(path: str = "/dev/kvm") -> str:
    """Why KVM cannot even be tried here ("" if it can)."""
    if not os.path.exists(path):
        return f"no {path}"
    if not os.access(path, os.R_OK | os.W_OK):
        return f"{path} is not readable and writable for this user"
    return ""


def kvm_note(modules: str = "/sys/module") -> str:
    """What is known about why KVM may not boot a stock guest kernel here."""
    if os.path.isdir(os.path.join(modules, "kvm_pvm")):
        return "this host's KVM is PVM (kvm_pvm), which boots only PVM-enabled guest kernels"
    return ""


def probe_key(qemu_path: str, assets: Assets) -> str:
    """What the probe's answer depends on: host kernel, QEMU binary, guest kernel."""
    st = os.stat(qemu_path)
    parts = [
        os.uname().release,
        os.uname().version,
        os.path.realpath(qemu_path),
        str(st.st_size),
        str(st.st_mtime_ns),
        assets.release,
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _read_cached(path: str) -> Decision | None:
    try:
        with open(path, encoding="utf-8") as fh:
            accel, _, reason = fh.read().partition("\n")
    except OSError:
        return None
    if accel not in ("kvm", "tcg"):
        return None
    return Decision(accel, reason.strip(), cached=True)


def _write_cached(path: str, decision: Decision) -> None:
    work = f"{path}.tmp{os.getpid()}"
    with open(work, "w", encoding="utf-8") as fh:
        fh.write(f"{decision.accel}\n{decision.reason}\n")
    os.rename(work, path)


def boot_probe(qemu_path: str, assets: Assets, initrd: str, timeout: float = PROBE_TIMEOUT) -> str:
    """Boot the guest with KVM; "" if its init answered, else what went wrong."""
    ours, theirs = socket.socketpair()
    machine = qemu.Machine(
        accel="kvm",
        cpus=1,
        memory_mib=256,
        cmdline=qemu.kernel_cmdline(0, mode="probe", accel="kvm"),
        ports=[("corral.ctl", theirs.fileno())],
        qemu=qemu_path,
        kernel=assets.vmlinux,
        initrd=initrd,
    )
    try:
        proc = subprocess.Popen(
            qemu.qemu_argv(machine),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=[theirs.fileno()],
            start_new_session=True,
        )
    except OSError as exc:
        return f"cannot start {qemu_path}: {exc.strerror}"
    theirs.close()
    ours.settimeout(timeout)
    started = time.monotonic()
    answer = b""
    try:
        while b"\n" not in answer:
            chunk = ours.recv(64)
            if not chunk:
                break
            answer += chunk
    except OSError:
        pass
    finally:
        proc.kill()
        _, err = proc.communicate()
        ours.close()
    if answer.startswith(b"ready"):
        return ""
    last = (err.decode(errors="replace").strip().splitlines() or [""])[-1]
    waited = time.monotonic() - started
    if last:
        return f"the guest kernel did not boot with KVM: {last}"
    return f"the guest kernel did not boot with KVM within {waited:.0f} s"


def decide(
    qemu_path: str,
    assets: Assets,
    initrd: str,
    cache: str,
    probe: bool = True,
    device: str = "/dev/kvm",
    booter: Callable[[str, Assets, str], str] | None = None,
) -> Decision:
    """KVM if it boots the guest here, else TCG; probed once per key, then cached.
    ``probe=False`` only reads the cache (``health`` without side effects);
    ``booter`` is :func:`boot_probe` unless a test gives its own."""
    problem = kvm_problem(device)
    if problem:
        return Decision("tcg", f"TCG: {problem}")
    path = os.path.join(cache, f"accel-{probe_key(qemu_path, assets)}")
    found = _read_cached(path)
    if found is not None or not probe:
        return found or Decision("tcg", "TCG until a boot probe shows KVM works (not probed yet)")
    failure = (booter or boot_probe)(qemu_path, assets, initrd)
    if failure:
        note = kvm_note()
        why = f"TCG: /dev/kvm exists but {failure}" + (f"; {note}" if note else "")
        decision = Decision("tcg", why)
    else:
        decision = Decision("kvm", "KVM: the boot probe reached the guest's init")
    os.makedirs(cache, mode=0o700, exist_ok=True)
    _write_cached(path, decision)
    return decision
