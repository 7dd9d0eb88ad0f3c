"""The ``firecracker`` tier's building blocks: pure builders and an honest health().

Nothing here starts Firecracker: on a host that has it, the tier boots an
operator-supplied kernel and root filesystem under the ``jailer`` (chroot, its
own uid and gid, cgroup limits, a new pid namespace, a network namespace).

* :func:`machine_config`: the ``--config-file`` JSON (boot source, drives,
  machine config, vsock, network interface);
* :func:`jailer_argv`: the jailer's command line;
* :func:`guest_network`, :func:`nft_ruleset`: the egress design.  The guest's
  only interface is a tap device in the jail's network namespace, addressed as a
  /30 (two usable addresses: the host end and the guest); the host end is
  governed by a default-deny nftables table that accepts exactly one thing from
  the tap: TCP to the host end's proxy port, where corral's door listens.  No
  forwarding, no other port, no other protocol.  (The alternative, no network
  device at all and the door over vsock, needs a relay in the guest that speaks
  vsock: :mod:`corral.vm.mux` over a vsock stream would do.)
* :func:`health`: refuses with every missing piece named.
"""

from __future__ import annotations

import ipaddress
import os

from corral.tiers.base import Health

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

JAIL_KERNEL = "vmlinux"  # paths inside the jail's chroot: the operator's files are linked there
JAIL_ROOTFS = "rootfs.ext4"
JAIL_VSOCK = "v.sock"
GUEST_CID = 3  # the first context id a guest may have (0-2 are reserved)
LINK_NET = "169.254.200.0/24"  # link-local: /30 slices for tap devices, never routed


class Drive:
    __slots__ = ("drive_id", "path", "read_only", "root")

    def __init__(
        self, drive_id: str, path: str, read_only: bool = True, root: bool = False
    ) -> None:
        self.drive_id = drive_id
        self.path = path  # inside the jail
        self.read_only = read_only
        self.root = root


class GuestNetwork:
    """One tap device and its /30: the host end, the guest, the mask, a MAC."""

    __slots__ = ("guest_ip", "guest_mac", "host_ip", "netmask", "prefix", "tap")

    def __init__(self, tap: str, host_ip: str, guest_ip: str, netmask: str, prefix: int, mac: str):
        self.tap = tap
        self.host_ip = host_ip
        self.guest_ip = guest_ip
        self.netmask = netmask
        self.prefix = prefix
        self.guest_mac = mac

    def kernel_ip_arg(self) -> str:
        """The guest kernel's ``ip=`` argument: static address, no gateway beyond the
        host end, no autoconfiguration."""
        return f"ip={self.guest_ip}::{self.host_ip}:{self.netmask}::eth0:off"


def guest_network(index: int, base: str = LINK_NET) -> GuestNetwork:
    """The ``index``-th /30 of ``base``: .1 the host end, .2 the guest."""
    net = ipaddress.IPv4Network(base)
    slices = list(net.subnets(new_prefix=30))
    if not 0 <= index < len(slices):
        raise ValueError(f"{base} has {len(slices)} /30 slices; index {index} is out of range")
    sub = slices[index]
    host, guest = list(sub.hosts())
    # a locally administered unicast MAC that names the slice
    mac = "06:00:" + ":".join(f"{b:02x}" for b in guest.packed)
    return GuestNetwork(f"corral-fc{index}", str(host), str(guest), str(sub.netmask), 30, mac)


def boot_args(extra: Sequence[str] = (), net: GuestNetwork | None = None) -> str:
    args = ["console=ttyS0", "reboot=k", "panic=1", "pci=off", "quiet", *extra]
    if net is not None:
        args.append(net.kernel_ip_arg())
    return " ".join(args)


def machine_config(
    *,
    vcpus: int,
    memory_mib: int,
    drives: Sequence[Drive],
    boot: str,
    kernel: str = JAIL_KERNEL,
    initrd: str | None = None,
    net: GuestNetwork | None = None,
    vsock: str | None = JAIL_VSOCK,
) -> dict[str, object]:
    """Firecracker's ``--config-file`` document."""
    if not 1 <= vcpus <= 32:
        raise ValueError("Firecracker takes 1 to 32 vCPUs")
    if memory_mib < 128:
        raise ValueError("the guest needs at least 128 MiB")
    if sum(d.root for d in drives) != 1:
        raise ValueError("exactly one drive must be the root device")
    source: dict[str, object] = {"kernel_image_path": kernel, "boot_args": boot}
    if initrd:
        source["initrd_path"] = initrd
    config: dict[str, object] = {
        "boot-source": source,
        "drives": [
            {
                "drive_id": d.drive_id,
                "path_on_host": d.path,
                "is_root_device": d.root,
                "is_read_only": d.read_only,
            }
            for d in drives
        ],
        "machine-config": {"vcpu_count": vcpus, "mem_size_mib": memory_mib, "smt": False},
        "network-interfaces": [],
    }
    if net is not None:
        config["network-interfaces"] = [
            {"iface_id": "eth0", "host_dev_name": net.tap, "guest_mac": net.guest_mac}
        ]
    if vsock:
        config["vsock"] = {"guest_cid": GUEST_CID, "uds_path": vsock}
    return config


def jailer_argv(
    *,
    jailer: str,
    firecracker: str,
    vm_id: str,
    uid: int,
    gid: int,
    chroot_base: str,
    netns: str | None = None,
    cgroups: Mapping[str, str] | None = None,
    config: str = "config.json",
) -> list[str]:
    """The jailer's command line; Firecracker's own flags follow ``--`` (the config
    file is inside the chroot, and no API socket is opened)."""
    if not vm_id.replace("-", "").isalnum() or len(vm_id) > 64:
        raise ValueError("a jail id is 1 to 64 letters, digits and hyphens")
    argv = [
        jailer,
        "--id",
        vm_id,
        "--exec-file",
        firecracker,
        "--uid",
        str(uid),
        "--gid",
        str(gid),
        "--chroot-base-dir",
        chroot_base,
        "--cgroup-version",
        "2",
        "--new-pid-ns",
    ]
    for key, value in sorted((cgroups or {}).items()):
        argv += ["--cgroup", f"{key}={value}"]
    if netns:
        argv += ["--netns", netns]
    return [*argv, "--", "--config-file", config, "--no-api"]


def cgroup_limits(memory: int | None, cpus: float | None, pids: int | None) -> dict[str, str]:
    """cgroup v2 files for the jail, from corral's limits (bytes, CPUs, tasks)."""
    found = {}
    if memory is not None:
        found["memory.max"] = str(int(memory))
    if cpus is not None:
        period = 100000
        found["cpu.max"] = f"{int(cpus * period)} {period}"
    if pids is not None:
        found["pids.max"] = str(int(pids))
    return found


def nft_ruleset(net: GuestNetwork, proxy_port: int, table: str = "corral_fc") -> str:
    """Default deny for everything the tap sends, except TCP to the proxy on the
    host end.  Loaded in the jail's network namespace (``nft -f -``)."""
    if not 0 < proxy_port < 65536:
        raise ValueError("the proxy port must be 1 to 65535")
    return "\n".join(
        [
            f"table inet {table} {{",
            "  chain input {",
            "    type filter hook input priority 0; policy accept;",
            f'    iifname "{net.tap}" ip daddr {net.host_ip} tcp dport {proxy_port} accept',
            f'    iifname "{net.tap}" ct state established,related accept',
            f'    iifname "{net.tap}" drop',
            "  }",
            "  chain forward {",
            "    type filter hook forward priority 0; policy drop;",
            "  }",
            "  chain output {",
            "    type filter hook output priority 0; policy accept;",
            f'    oifname "{net.tap}" ct state established,related accept',
            f'    oifname "{net.tap}" drop',
            "  }",
            "}",
            "",
        ]
    )


def _on_path(name: str, path: str) -> str | None:
    for d in path.split(":"):
        if os.path.isabs(d) and os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    return None


def health(
    kernel: str | None,
    rootfs: str | None,
    kvm_boots: tuple[bool, str],
    path: str | None = None,
) -> Health:
    """Available only with everything; otherwise every missing piece, named.

    ``kvm_boots``: whether this host's KVM was shown to boot a guest, and how
    (the microvm tier's boot probe answers it); ``kernel``, ``rootfs``: the
    operator's files (corral does not make a Firecracker rootfs)."""
    search = path if path is not None else os.environ.get("PATH", "")
    missing = []
    ok, how = kvm_boots
    if not ok:
        missing.append(f"a KVM that boots guests ({how})")
    found = {name: _on_path(name, search) for name in ("firecracker", "jailer")}
    missing += [f"the {name} binary on PATH" for name, where in found.items() if where is None]
    for what, file in (("kernel", kernel), ("root filesystem", rootfs)):
        if not file:
            missing.append(f"an operator-supplied guest {what} (none configured)")
        elif not os.path.isfile(file):
            missing.append(f"the guest {what} {file} (not found)")
    details: dict[str, object] = {k: v or "" for k, v in found.items()}
    if missing:
        return Health(False, "firecracker needs " + "; ".join(missing), details)
    return Health(
        True, f"firecracker at {found['firecracker']}, jailer at {found['jailer']}", details
    )
