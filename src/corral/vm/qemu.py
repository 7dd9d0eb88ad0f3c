"""QEMU's command line and the sandbox QEMU itself runs in (pure builders).

:func:`qemu_argv` is the ``-M microvm`` machine: no firmware option ROMs, no
legacy devices the guest does not use, the kernel booted through its PVH entry
with the initramfs, one virtio-serial device whose ports carry the command's
stdin, stdout and stderr (separately), the control channel and, with a network,
the door (:mod:`corral.vm.mux`); one virtio-9p device per export
(:mod:`corral.vm.guest`).  No network device at all: the guest's only way out
is the door port, which only corral's process on the host reads.  Every
chardev is a socket the runner made and passed in (``fd=N``): nothing is
created on the host's filesystem.

:func:`sandbox_argv` is bubblewrap around QEMU: every namespace, no
capabilities, corral's syscall deny list, its parent's death kills it, and a
root holding only what QEMU needs (``/usr`` and the merged-/usr links, a
minimal ``/dev``, the kernel and initramfs) plus the guest's view under
:data:`corral.vm.guest.VIEW`.  QEMU applies its own seccomp sandbox too.

Host facts (the TSC frequency, the top-level symlinks) come in as arguments;
:func:`host_facts` reads them.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from corral.fsplan import Mount
    from corral.vm.guest import Export

KERNEL = "/vm/vmlinux"  # where QEMU's sandbox holds the kernel and initramfs
INITRD = "/vm/initrd"
PORTS = ("corral.ctl", "corral.stdin", "corral.stdout", "corral.stderr", "corral.door")
# x-option-roms: no firmware ROMs to load; pit/pic: the guest uses the local APIC
# timer and the IOAPIC; the RTC stays (the guest's wall clock at boot).
MACHINE = "microvm,x-option-roms=off,pit=off,pic=off,rtc=on"
SANDBOX = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"
TOP_LEVEL = ("bin", "lib", "lib32", "lib64", "libx32", "sbin")


class HostFacts:
    """What the builders need to know about this host."""

    __slots__ = ("tsc_khz", "usr_links")

    def __init__(self, tsc_khz: int, usr_links: Mapping[str, str]) -> None:
        self.tsc_khz = tsc_khz  # 0 when unknown
        self.usr_links = dict(usr_links)  # /bin -> usr/bin and the like


def tsc_khz_from_cpuinfo(text: str) -> int:
    """The TSC frequency in kHz, from /proc/cpuinfo's first ``cpu MHz`` (0 if absent).

    Under TCG the guest's TSC is the host's counter, and with KVM QEMU gives the
    guest the host's frequency: the guest must not calibrate it against timers
    that TCG emulates slowly (some boots hang there)."""
    if " constant_tsc" not in text:
        return 0  # a TSC that changes speed has no one frequency to give
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "cpu MHz":
            try:
                return int(float(value) * 1000)
            except ValueError:
                return 0
    return 0


def host_facts() -> HostFacts:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            tsc = tsc_khz_from_cpuinfo(fh.read(65536))
    except OSError:
        tsc = 0
    links = {}
    for name in TOP_LEVEL:
        try:
            links["/" + name] = os.readlink("/" + name)
        except OSError:
            continue
    return HostFacts(tsc, links)


MiB = 1 << 20
# TCG's translated-code cache, MiB.  QEMU's default (1 GiB) is filled by the guest
# kernel's boot and a Python start and never given back.  Measured here with an idle
# Sandbox of 256 MiB (RSS; warm exec p50; corral run -- true): 1024: 321 MiB, 71 ms,
# 2.0 s; 64: 273 MiB, 40 ms, 2.1 s; 32: 236 MiB, 42 ms, 2.1 s; 16: 217 MiB, 109 ms,
# 2.5 s (a full cache is flushed and code translated again).
TCG_CODE_MIB = 32
GUEST_MEMORY_DEFAULT = 1024  # MiB, when the policy sets no memory bound (see size())
GUEST_MEMORY_MIN = 128  # MiB: the Debian kernel, the init and a Python need about 100


def size(memory: float | None, source: str, cpus: float | None, host_cpus: int) -> tuple[int, int]:
    """(vCPUs, guest RAM in MiB) from the policy's memory and cpus bounds.

    The guest's RAM is its memory bound: what the command can use, less the guest
    kernel's share.  A bound the policy *sets* is used as it is; this host's
    default (half its RAM) is capped at :data:`GUEST_MEMORY_DEFAULT`: QEMU's
    footprint grows with what the guest touches, and the guest kernel's page
    tables for memory it never uses cost host memory too.  cpus: the bound
    rounded up to whole vCPUs, at most the host's; one when unbounded."""
    if memory is None:
        mib = GUEST_MEMORY_DEFAULT
    else:
        mib = int(memory) // MiB
        if source != "set":
            mib = min(mib, GUEST_MEMORY_DEFAULT)
    if mib < GUEST_MEMORY_MIN:
        from corral.errors import RefusedError

        raise RefusedError(f"microvm: memory {mib} MiB is below the guest's {GUEST_MEMORY_MIN} MiB")
    vcpus = 1 if cpus is None else max(1, min(host_cpus, -int(-cpus // 1)))
    return vcpus, mib


def kernel_cmdline(
    tsc_khz: int,
    mode: str = "run",
    console: bool = False,
    saved: bool = False,
    accel: str = "tcg",
) -> str:
    """The guest kernel's command line.  ``mode``: run, probe or off (see the init).
    ``saved``: the machine's state is saved and restored (corral.vm.snapshot).
    ``accel``: what runs the guest's code (kvm or tcg)."""
    # init_on_alloc=0, mitigations=off: about 10% less boot CPU under TCG; they
    # guard the guest kernel from the guest's own processes, and the guest runs
    # one sandbox (the boundary is the VM).  A machine whose state is saved zeroes
    # what its kernel allocates all the same: the virtio-serial driver fills each
    # port's receive queue (1024 entries under virtio-mmio) with a 4 KiB buffer
    # per entry at boot, ~20 MiB that hold nothing but the slab's free-list word,
    # and a state's zero pages are neither written nor, when restored, made
    # resident: an idle restored Sandbox of 256 MiB has 143 MiB of QEMU RSS
    # instead of 163.  (Its boot takes ~9% longer, and only the boot that saves
    # the state is one; init_on_free=1 zeroed about as much, but it zeroes all of
    # the guest's free RAM at boot: a booted VM then held all its RAM.)
    # lockdown=confidentiality: the guest's root loads no unsigned module and reads
    # no kernel memory (/dev/mem, kprobes, BPF); and this kernel (6.1) then makes
    # no tracefs, whose ~8,000 event files cost 9 MiB of the guest's memory (QEMU's
    # RSS) and ~0.1 s of its boot.  The modules keep Debian's signatures for it
    # (their check costs less than that).
    parts = ["console=ttyS0" if console else "quiet", "panic=-1", "no_timer_check"]
    parts += [f"init_on_alloc={int(saved)}", "mitigations=off", "lockdown=confidentiality"]
    if accel == "tcg":
        # norandmaps: no address-space randomisation for the guest's processes.
        # TCG keys the code it has translated by the *virtual* address too (QEMU
        # 7.2), so a program and the libraries mapped somewhere new at each exec
        # are translated afresh each time: measured in the guest, an exec of
        # /usr/bin/true took 24 ms with it and 8 ms without (a static binary 2.5
        # ms either way).  The guest's processes are all the sandbox's own and
        # the boundary is the VM: ASLR there guards a sandbox from itself.  Under
        # KVM the guest's code runs natively, and keeps its randomisation.
        parts.append("norandmaps")
    if tsc_khz:
        parts += [f"tsc_early_khz={tsc_khz}", "tsc=reliable"]
    parts.append(f"corral.mode={mode}")
    return " ".join(parts)


class Machine:
    """One guest: its accelerator, size, boot files and devices."""

    __slots__ = (
        "accel",
        "cmdline",
        "console",
        "cpus",
        "exports",
        "initrd",
        "kernel",
        "memory_mib",
        "monitor",
        "name",
        "ports",
        "qemu",
    )

    def __init__(
        self,
        *,
        accel: str,
        cpus: int,
        memory_mib: int,
        cmdline: str,
        ports: Sequence[tuple[str, int]] = (),
        exports: Sequence[Export] = (),
        name: str = "corral-vm",
        qemu: str = "qemu-system-x86_64",
        kernel: str = KERNEL,
        initrd: str = INITRD,
        console: bool = False,
        monitor: int | None = None,
    ) -> None:
        self.accel = accel  # "kvm" or "tcg"
        self.cpus = cpus
        self.memory_mib = memory_mib
        self.cmdline = cmdline
        self.ports = list(ports)  # (port name, the fd of the socket QEMU gets)
        self.exports = list(exports)
        self.name = name
        self.qemu = qemu
        self.kernel = kernel
        self.initrd = initrd
        self.console = console  # the guest's serial console on QEMU's stderr (debugging)
        # the fd of QEMU's QMP monitor (a socket): how a guest's state is saved
        self.monitor = monitor


def qemu_argv(m: Machine) -> list[str]:
    argv = [
        m.qemu,
        "-name",
        m.name,
        "-M",
        MACHINE + (",isa-serial=on" if m.console else ",isa-serial=off"),
        "-accel",
        m.accel if m.accel == "kvm" else f"tcg,tb-size={TCG_CODE_MIB}",
        "-cpu",
        "host" if m.accel == "kvm" else "max",
        "-smp",
        str(m.cpus),
        "-m",
        f"{m.memory_mib}M",
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-monitor",
        "none",
        "-serial",
        "stdio" if m.console else "none",
        "-no-reboot",
        "-sandbox",
        SANDBOX,
        "-kernel",
        m.kernel,
        "-initrd",
        m.initrd,
        "-append",
        m.cmdline,
    ]
    if m.ports:
        argv += ["-device", "virtio-serial-device,max_ports=8"]
    for n, (port, fd) in enumerate(m.ports, start=1):
        argv += ["-chardev", f"socket,id=p{n},fd={fd}"]
        argv += ["-device", f"virtserialport,chardev=p{n},name={port},nr={n}"]
    if m.monitor is not None:
        argv += ["-chardev", f"socket,id=qmp,fd={m.monitor}", "-mon", "chardev=qmp,mode=control"]
    for n, share in enumerate(m.exports):
        options = f"local,id=fs{n},path={share.source},security_model=none,multidevs=remap"
        if not share.writable:
            options += ",readonly=on"
        argv += [
            "-fsdev",
            options,
            "-device",
            f"virtio-9p-device,fsdev=fs{n},mount_tag={share.tag}",
        ]
    return argv


def own_root(facts: HostFacts, kernel: str, initrd: str, kvm: bool) -> list[str]:
    """bwrap arguments for what QEMU itself sees outside the guest's view."""
    args = ["--ro-bind", "/usr", "/usr"]
    for link, target in sorted(facts.usr_links.items()):
        args += ["--symlink", target, link]
    args += ["--dev", "/dev", "--proc", "/proc"]
    if kvm:
        args += ["--dev-bind", "/dev/kvm", "/dev/kvm"]
    args += ["--ro-bind", kernel, KERNEL, "--ro-bind", initrd, INITRD]
    return args


HARDENING = (
    "--unshare-user",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-net",  # QEMU has no use for a network: the door is a socket pair
    "--unshare-cgroup",
    "--disable-userns",
    "--die-with-parent",  # corral killed -> QEMU killed
    "--new-session",
    "--cap-drop",
    "ALL",
    "--hostname",
    "corral-vm",
    "--clearenv",
)


def sandbox_argv(
    bwrap: str,
    own: Sequence[str],
    view: Sequence[str],
    status_fd: int,
    seccomp_fd: int,
    qemu: Sequence[str],
) -> list[str]:
    """bwrap ``own`` root, the guest's ``view`` (from namespace.mount_args), then QEMU.
    ``status_fd``: bwrap names the sandbox's pid 1 there (the runner stops the VM
    by killing it: the pid namespace takes QEMU along)."""
    return [
        bwrap,
        *HARDENING,
        "--json-status-fd",
        str(status_fd),
        "--seccomp",
        str(seccomp_fd),
        *own,
        *view,
        "--",
        *qemu,
    ]


def describe_view(mounts: Sequence[Mount]) -> list[str]:
    return [f"  {m!r}" for m in mounts]
