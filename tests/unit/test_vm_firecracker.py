"""The firecracker tier's pure builders and its refusal (nothing starts Firecracker)."""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path

import pytest

from corral.vm import firecracker as fc


def test_machine_config_has_every_section_firecracker_reads() -> None:
    net = fc.guest_network(3)
    config = fc.machine_config(
        vcpus=2,
        memory_mib=512,
        drives=[
            fc.Drive("rootfs", fc.JAIL_ROOTFS, read_only=True, root=True),
            fc.Drive("ws", "ws.ext4", False),
        ],
        boot=fc.boot_args(["init=/sbin/corral-init"], net),
        initrd="initrd.cpio",
        net=net,
    )
    assert json.loads(json.dumps(config)) == config  # plain JSON
    assert config["boot-source"] == {
        "kernel_image_path": fc.JAIL_KERNEL,
        "boot_args": "console=ttyS0 reboot=k panic=1 pci=off quiet init=/sbin/corral-init "
        f"ip={net.guest_ip}::{net.host_ip}:255.255.255.252::eth0:off",
        "initrd_path": "initrd.cpio",
    }
    assert config["drives"] == [
        {
            "drive_id": "rootfs",
            "path_on_host": "rootfs.ext4",
            "is_root_device": True,
            "is_read_only": True,
        },
        {
            "drive_id": "ws",
            "path_on_host": "ws.ext4",
            "is_root_device": False,
            "is_read_only": False,
        },
    ]
    assert config["machine-config"] == {"vcpu_count": 2, "mem_size_mib": 512, "smt": False}
    assert config["vsock"] == {"guest_cid": 3, "uds_path": fc.JAIL_VSOCK}
    assert config["network-interfaces"] == [
        {"iface_id": "eth0", "host_dev_name": "corral-fc3", "guest_mac": net.guest_mac}
    ]


def test_machine_config_refuses_what_firecracker_would() -> None:
    root = [fc.Drive("rootfs", "r", root=True)]
    with pytest.raises(ValueError, match="1 to 32"):
        fc.machine_config(vcpus=0, memory_mib=256, drives=root, boot="")
    with pytest.raises(ValueError, match="128 MiB"):
        fc.machine_config(vcpus=1, memory_mib=64, drives=root, boot="")
    with pytest.raises(ValueError, match="exactly one"):
        fc.machine_config(vcpus=1, memory_mib=256, drives=[], boot="")
    bare = fc.machine_config(vcpus=1, memory_mib=256, drives=root, boot="", vsock=None)
    assert bare["network-interfaces"] == [] and "vsock" not in bare  # no network at all


def test_each_guest_gets_its_own_link_local_slash_30() -> None:
    nets = [fc.guest_network(i) for i in range(3)]
    for net in nets:
        sub = ipaddress.ip_network(f"{net.host_ip}/{net.prefix}", strict=False)
        assert ipaddress.ip_address(net.guest_ip) in sub and sub.is_link_local
        assert net.netmask == "255.255.255.252" and sub.num_addresses == 4
        first = int(net.guest_mac.split(":")[0], 16)
        assert first & 1 == 0 and first & 2 == 2  # unicast, locally administered
    assert len({n.host_ip for n in nets}) == 3 and len({n.tap for n in nets}) == 3
    with pytest.raises(ValueError, match="out of range"):
        fc.guest_network(64)


def test_jailer_argv() -> None:
    argv = fc.jailer_argv(
        jailer="/usr/bin/jailer",
        firecracker="/usr/bin/firecracker",
        vm_id="corral-1a2b",
        uid=1000,
        gid=1000,
        chroot_base="/srv/jail",
        netns="/run/netns/corral-1a2b",
        cgroups=fc.cgroup_limits(512 << 20, 1.5, 256),
    )
    assert argv == [
        "/usr/bin/jailer", "--id", "corral-1a2b", "--exec-file", "/usr/bin/firecracker",
        "--uid", "1000", "--gid", "1000", "--chroot-base-dir", "/srv/jail",
        "--cgroup-version", "2", "--new-pid-ns",
        "--cgroup", "cpu.max=150000 100000", "--cgroup", f"memory.max={512 << 20}",
        "--cgroup", "pids.max=256", "--netns", "/run/netns/corral-1a2b",
        "--", "--config-file", "config.json", "--no-api",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="jail id"):
        fc.jailer_argv(jailer="j", firecracker="f", vm_id="../x", uid=0, gid=0, chroot_base="/j")


def test_the_tap_reaches_only_the_proxy_port() -> None:
    net = fc.guest_network(0)
    rules = fc.nft_ruleset(net, 3128)
    lines = [line.strip() for line in rules.splitlines()]
    accept = f'iifname "{net.tap}" ip daddr {net.host_ip} tcp dport 3128 accept'
    assert accept in lines
    assert lines.index(accept) < lines.index(f'iifname "{net.tap}" drop')  # then nothing else
    assert "type filter hook forward priority 0; policy drop;" in lines  # never routed on
    assert f'oifname "{net.tap}" drop' in lines
    with pytest.raises(ValueError):
        fc.nft_ruleset(net, 0)


def test_health_names_every_missing_piece(tmp_path: Path) -> None:
    health = fc.health(None, str(tmp_path / "nope.ext4"), (False, "TCG: no /dev/kvm"), path="")
    assert not health.available
    for piece in (
        "a KVM that boots guests (TCG: no /dev/kvm)",
        "the firecracker binary on PATH",
        "the jailer binary on PATH",
        "an operator-supplied guest kernel (none configured)",
        f"the guest root filesystem {tmp_path / 'nope.ext4'} (not found)",
    ):
        assert piece in health.reason


def test_health_with_everything_in_place(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("firecracker", "jailer"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        os.chmod(bin_dir / name, 0o755)
    kernel, rootfs = tmp_path / "vmlinux", tmp_path / "rootfs.ext4"
    kernel.write_bytes(b"k")
    rootfs.write_bytes(b"r")
    health = fc.health(str(kernel), str(rootfs), (True, "KVM"), path=str(bin_dir))
    assert health.available, health.reason
    missing_kvm = fc.health(str(kernel), str(rootfs), (False, "TCG"), path=str(bin_dir))
    assert (
        not missing_kvm.available
        and missing_kvm.reason == "firecracker needs a KVM that boots guests (TCG)"
    )
