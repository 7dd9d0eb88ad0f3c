"""The warm start's pure parts and its cache files: the key, the decision, a state
written whole or not at all, the guest's reseed program.  Nothing boots here;
tests/integration/test_vm.py restores real guests."""

from __future__ import annotations

import os
import platform
import struct
import subprocess
from pathlib import Path

import pytest

from corral import fsplan
from corral.policy import Policy
from corral.vm import guest, initramfs, probe, qemu, setup, snapshot
from corral.vm import run as vmrun


def argv_for(**change: object) -> list[str]:
    options: dict[str, object] = {
        "accel": "tcg",
        "cpus": 1,
        "memory_mib": 256,
        "cmdline": "quiet corral.mode=run",
        "ports": [("corral.ctl", 5), ("corral.stdin", 6)],
        "exports": guest.exports(["/ws"]),
        "name": "corral-vm-1-a",
        "monitor": 9,
    }
    options.update(change)
    return qemu.qemu_argv(qemu.Machine(**options))  # type: ignore[arg-type]


INPUTS = ["/usr/bin/qemu:1:2:3", "/k/vmlinux:4:5:6", "/c/initramfs-ab.cpio:7:8:9"]


def test_the_key_ignores_what_differs_per_start_and_never_reaches_the_guest() -> None:
    key = snapshot.state_key(argv_for(), INPUTS)
    same = [
        argv_for(name="corral-vm-2-b"),
        argv_for(ports=[("corral.ctl", 11), ("corral.stdin", 12)], monitor=13),
        argv_for(exports=guest.exports(["/home/someone/other"])),
        [*argv_for(), "-incoming", "fd:4"],
    ]
    for argv in same:
        assert snapshot.state_key(argv, INPUTS) == key


def test_the_key_follows_everything_that_shapes_the_guest() -> None:
    key = snapshot.state_key(argv_for(), INPUTS)
    different = [
        snapshot.state_key(argv_for(memory_mib=512), INPUTS),
        snapshot.state_key(argv_for(cpus=2), INPUTS),
        snapshot.state_key(argv_for(cmdline="quiet tsc_early_khz=1 corral.mode=run"), INPUTS),
        snapshot.state_key(argv_for(exports=guest.exports(["/ws", "/tmp/x"])), INPUTS),
        snapshot.state_key(argv_for(ports=[("corral.ctl", 5)]), INPUTS),
        snapshot.state_key(argv_for(accel="kvm"), INPUTS),
        snapshot.state_key(argv_for(), [*INPUTS[:2], "/c/initramfs-cd.cpio:7:8:9"]),
        snapshot.state_key(argv_for(), ["/usr/bin/qemu:1:2:4", *INPUTS[1:]]),  # QEMU upgraded
    ]
    assert key not in different and len(set(different)) == len(different)


def test_stable_argv_blanks_descriptors_and_paths_only() -> None:
    argv = ["q", "-name", "n", "-chardev", "socket,id=p1,fd=5", "-fsdev", "local,path=/g/ws,x=1"]
    assert snapshot.stable_argv([*argv, "-incoming", "fd:3"]) == [
        "q",
        "-chardev",
        "socket,id=p1,fd=*",
        "-fsdev",
        "local,path=*,x=1",
    ]


def test_a_start_restores_only_a_state_this_cache_has(tmp_path: Path) -> None:
    cache = str(tmp_path)
    first = snapshot.decide(cache, "k1", console=False, environ={})
    assert not first.restore and first.save and "this boot saves one" in first.why
    Path(snapshot.state_path(cache, "k1")).write_bytes(b"state")
    again = snapshot.decide(cache, "k1", console=False, environ={})
    assert again.restore and not again.save and again.describe().startswith("warm start")
    off = snapshot.decide(cache, "k1", console=False, environ={snapshot.OFF: "0"})
    assert not off.restore and not off.save and "CORRAL_VM_WARM=0" in off.describe()
    console = snapshot.decide(cache, "k1", console=True, environ={})
    assert not console.restore and not console.save and "console" in console.why


def test_a_state_gets_its_name_only_once_complete(tmp_path: Path) -> None:
    cache = str(tmp_path / "vm")
    fd = snapshot.new_file(cache)
    os.write(fd, b"half a state")
    assert os.listdir(cache) == []  # unnamed while QEMU writes it
    os.close(fd)  # the writer died: nothing is left
    assert os.listdir(cache) == []
    fd = snapshot.new_file(cache)
    os.write(fd, b"a whole state")
    path = snapshot.state_path(cache, "k")
    snapshot.commit(fd, path)
    assert os.listdir(cache) == ["state-k"] and Path(path).read_bytes() == b"a whole state"
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    fd = snapshot.new_file(cache)  # another start saved the same machine meanwhile
    os.write(fd, b"the same state")
    snapshot.commit(fd, path)
    assert Path(path).read_bytes() == b"a whole state"


def test_only_the_most_recently_used_states_are_kept(tmp_path: Path) -> None:
    for n in range(snapshot.KEEP + 2):
        path = tmp_path / f"state-{n}"
        path.write_bytes(b"s")
        os.utime(path, (1000 + n, 1000 + n))
    (tmp_path / "initramfs-x.cpio").write_bytes(b"other")
    fd = snapshot.open_state(str(tmp_path / "state-0"))  # used now: the newest
    assert fd is not None
    os.close(fd)
    snapshot.prune(str(tmp_path), snapshot.KEEP)
    left = sorted(os.listdir(tmp_path))
    assert left == ["initramfs-x.cpio", "state-0", "state-3", "state-4", "state-5"]


def test_a_state_that_did_not_restore_is_removed_but_not_a_newer_one(tmp_path: Path) -> None:
    path = tmp_path / "state-k"
    path.write_bytes(b"bad")
    fd = os.open(path, os.O_RDONLY)
    snapshot.discard(str(path), fd)
    assert not path.exists()
    path.write_bytes(b"old")
    fd2 = os.open(path, os.O_RDONLY)
    os.unlink(path)
    path.write_bytes(b"newer")  # saved by another start meanwhile
    snapshot.discard(str(path), fd2)
    assert path.read_bytes() == b"newer"
    os.close(fd)
    os.close(fd2)


def fake_host(tmp_path: Path, facts: qemu.HostFacts) -> vmrun.VmHost:
    """A host with QEMU and a kernel set up, as the plans below are built for."""
    return vmrun.VmHost(
        setup.Assets("/fake/kernel-6.1", "6.1.0-test", ["virtio_mmio"]),
        "/usr/bin/qemu-system-x86_64",
        "/usr/bin/bwrap",
        "/fake/initramfs.cpio",
        probe.Decision("tcg", "TCG: as the test says"),
        facts,
        cache=str(tmp_path / "cache"),
        state_inputs=INPUTS,
    )


def test_the_plan_can_restore_and_save_with_its_own_descriptors(tmp_path: Path) -> None:
    policy = Policy(str(tmp_path))
    policy.limits.defaults = {"memory": 8 << 30, "pids": 4096}
    host = fake_host(tmp_path, qemu.HostFacts(2_000_000, {"/bin": "usr/bin"}))
    fs = fsplan.plan_filesystem(policy)
    plan = vmrun.build(policy, ["true"], host, fs)
    monitor = next(n for n, what in plan.fds.items() if what == vmrun.MONITOR)
    state = next(n for n, what in plan.fds.items() if what == "state")
    assert f"socket,id=qmp,fd={monitor}" in plan.argv
    assert plan.restore_args == ["-incoming", f"fd:{state}"]
    assert "-incoming" not in plan.argv  # only a restore adds it
    assert plan.machine is not None
    assert plan.warm_key == snapshot.state_key(qemu.qemu_argv(plan.machine), INPUTS)
    assert plan.warm().save and "start: cold boot: no saved state" in plan.describe()
    policy.limits.memory = 256 << 20
    smaller = vmrun.build(policy, ["true"], host, fsplan.plan_filesystem(policy))
    assert smaller.warm_key != plan.warm_key


def test_a_machine_that_is_saved_boots_zeroing_what_its_kernel_allocates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its state then holds no page the guest only allocated (virtio-serial's receive
    buffers: ~20 MiB); a boot that is never saved does not pay for the zeroing."""
    assert "init_on_alloc=1" in qemu.kernel_cmdline(0, saved=True).split()
    assert "init_on_alloc=0" in qemu.kernel_cmdline(0).split()
    policy = Policy(str(tmp_path))
    host = fake_host(tmp_path, qemu.HostFacts(0, {}))
    monkeypatch.delenv(snapshot.OFF, raising=False)
    for console, zeroed in ((False, True), (True, False)):
        plan = vmrun.build(policy, ["true"], host, fsplan.plan_filesystem(policy), console=console)
        assert plan.machine is not None
        assert f"init_on_alloc={int(zeroed)}" in plan.machine.cmdline.split()
    monkeypatch.setenv(snapshot.OFF, "0")
    plan = vmrun.build(policy, ["true"], host, fsplan.plan_filesystem(policy))
    assert plan.machine is not None and "init_on_alloc=0" in plan.machine.cmdline.split()
    assert not snapshot.enabled(False, {snapshot.OFF: "0"}) and snapshot.enabled(False, {})


def test_a_restored_guest_is_told_fresh_randomness_and_the_time_first() -> None:
    launch = guest.Launch(["true"], {}, "/ws", 0, 0, None, False)
    shares = guest.exports(["/ws"])
    request = guest.request(shares, [], launch, (b"\x01\xfe" * 16, 1_700_000_000.7))
    first = request.decode().splitlines()[0]
    assert first == f"fresh {'01fe' * 16} 1700000000"
    assert not guest.request(shares, [], launch).startswith(b"fresh")  # a boot needs none


def test_the_reseed_program_is_a_minimal_static_elf() -> None:
    elf = initramfs.reseed_program()
    assert elf[:4] == b"\x7fELF" and elf[4] == 2  # 64-bit
    e_type, machine, _, entry, phoff = struct.unpack("<HHIQQ", elf[16:40])
    assert (e_type, machine, phoff) == (2, 0x3E, 64)
    kind, flags, offset, vaddr, _, filesz, memsz, _ = struct.unpack("<IIQQQQQQ", elf[64:120])
    assert (kind, flags, offset, filesz, memsz) == (1, 5, 0, len(elf), len(elf))  # R+X, all of it
    assert entry == vaddr + 120 and elf.endswith(b"/dev/urandom\0")


needs_x86 = pytest.mark.skipif(
    platform.machine() != "x86_64" or not hasattr(os, "setresuid"),
    reason="the reseed program is x86-64 Linux code",
)


@needs_x86
@pytest.mark.skipif(os.geteuid() != 0, reason="reseeding needs root (as the guest's init is)")
def test_the_reseed_program_reseeds_as_root_and_is_refused_otherwise() -> None:
    import shutil
    import tempfile

    where = tempfile.mkdtemp(prefix="corral-reseed-")  # a directory the user can enter
    try:
        os.chmod(where, 0o755)
        program = Path(where) / "reseed"
        program.write_bytes(initramfs.reseed_program())
        program.chmod(0o755)
        assert subprocess.run([str(program)]).returncode == 0  # reseeded (root, as the init)
        nobody = subprocess.run([str(program)], user=65534, group=65534, extra_groups=[])
        assert nobody.returncode == 1  # EPERM: the kernel refuses a user
    finally:
        shutil.rmtree(where)


@needs_x86
@pytest.mark.skipif(os.geteuid() != 0, reason="reseeding needs root (as the guest's init is)")
def test_the_reseed_program_sets_the_clock_it_is_given_and_nothing_else(tmp_path: Path) -> None:
    # The host's clock must not move: a seccomp filter answers clock_settime with
    # EDOM (33) in the child, so an exit status of 33 proves the program made that
    # call, after the reseed (which must have succeeded to get there).
    import errno

    from corral import confine, seccomp

    program = tmp_path / "reseed"
    program.write_bytes(initramfs.reseed_program())
    program.chmod(0o755)
    rule = seccomp.SyscallRule(name="clock_settime", errno=errno.EDOM, why="the test's clock")
    deny = seccomp.compile_filter([rule], seccomp.native_arch(), notify=False)

    def run(*args: str) -> int:
        def fence() -> None:
            confine.install_seccomp(deny)

        return subprocess.run([str(program), *args], preexec_fn=fence).returncode

    assert run("1800000000") == errno.EDOM  # reseeded, then the clock asked to be set
    assert run() == 0  # no time given: reseeded only (a booted guest's request)
    assert run("18e8") == errno.EINVAL  # not a number: the clock is left alone


@needs_x86
def test_the_module_loader_names_the_first_file_it_could_not_load(tmp_path: Path) -> None:
    # Loading succeeds only in the guest (tests/integration/test_vm.py boots with it);
    # here nothing can load: a missing file, and /dev/null, which the kernel refuses to
    # read as a module (not a regular file) before anything else.
    program = tmp_path / "loadmods"
    program.write_bytes(initramfs.loadmods_program())
    program.chmod(0o755)
    assert subprocess.run([str(program)]).returncode == 0  # nothing asked, nothing failed
    assert subprocess.run([str(program), str(tmp_path / "none.ko")]).returncode == 1
    assert subprocess.run([str(program), "/dev/null", "/dev/zero"]).returncode == 1


def test_qemus_parent_turns_huge_pages_off_for_what_it_executes() -> None:
    """The runner's fork calls it before exec: QEMU (and bwrap) inherit it, so a
    guest's RAM is resident only where the guest has touched it, page by page."""
    prctl = vmrun._prctl()
    assert prctl is not None
    pid = os.fork()
    if pid == 0:
        try:
            vmrun._no_huge_pages(prctl)
            os.execv("/bin/grep", ["grep", "-qx", r"THP_enabled:\s*0", "/proc/self/status"])
        finally:
            os._exit(127)
    assert os.waitpid(pid, 0)[1] == 0
    assert prctl(42, 0, 0, 0, 0) == 0  # PR_GET_THP_DISABLE: this process is untouched


def _record(flags: int, address: int, block: bytes | None, payload: bytes) -> bytes:
    """One RAM record as QEMU writes it: naming its block, or continuing (None)."""
    if block is None:
        return (address | flags | snapshot.RAM_CONTINUE).to_bytes(8, "big") + payload
    return (address | flags).to_bytes(8, "big") + bytes([len(block)]) + block + payload


def _stream(devices: bytes) -> bytes:
    """A state as QEMU 7.2 saves a microvm: configuration, the RAM's start (its
    blocks), a part and an end of page records, then the devices."""
    page, zero = snapshot.RAM_PAGE, snapshot.RAM_ZERO
    eos = snapshot.RAM_EOS.to_bytes(8, "big")
    ram, bios = snapshot.GUEST_RAM, b"pc.bios"
    sizes = (5 * 4096 | snapshot.RAM_MEM_SIZE).to_bytes(8, "big")
    sizes += bytes([len(ram)]) + ram + (4 * 4096).to_bytes(8, "big")
    sizes += bytes([len(bios)]) + bios + (4096).to_bytes(8, "big")
    part = b"".join(
        [
            _record(page, 0, ram, b"\x11" * 4096),
            _record(zero, 4096, None, b"\0"),  # left out
            _record(page, 8192, None, b"\x22" * 4096),  # now names its block
            _record(zero, 0, bios, b"\0"),  # another block's zero page stays
        ]
    )
    end = _record(zero, 12288, ram, b"\x05") + _record(zero, 4096, None, b"\0")
    return b"".join(
        [
            snapshot.STREAM_HEADER + b"\x07" + (7).to_bytes(4, "big") + b"microvm",
            b"\x01" + (2).to_bytes(4, "big") + b"\x03ram" + (0).to_bytes(4, "big"),
            (4).to_bytes(4, "big") + sizes + eos + b"\x7e" + (2).to_bytes(4, "big"),
            b"\x02" + (2).to_bytes(4, "big") + part + eos + b"\x7e" + (2).to_bytes(4, "big"),
            b"\x03" + (2).to_bytes(4, "big") + end + eos + b"\x7e" + (2).to_bytes(4, "big"),
            devices,
        ]
    )


def _load(stream: bytes) -> tuple[dict[tuple[bytes, int], bytes], bytes]:
    """What a restore makes of ``stream`` on zeroed RAM: each page that is not
    zero, and the bytes after the RAM's end section (a reader written apart from
    the one under test, for the test's own streams)."""
    at = len(snapshot.STREAM_HEADER) + 1 + 4 + 7
    memory: dict[tuple[bytes, int], bytes] = {}
    block = b""
    while True:
        kind = stream[at]
        at += 5
        if kind == 1:
            at += 1 + stream[at] + 8
        while True:
            word = int.from_bytes(stream[at : at + 8], "big")
            at += 8
            flags, address = word & 4095, word & ~4095
            if flags == snapshot.RAM_EOS:
                break
            if flags & snapshot.RAM_MEM_SIZE:
                left = address
                while left:
                    at += 1 + stream[at]
                    left -= int.from_bytes(stream[at : at + 8], "big")
                    at += 8
                continue
            if not flags & snapshot.RAM_CONTINUE:
                block = stream[at + 1 : at + 1 + stream[at]]
                at += 1 + stream[at]
            size = 4096 if flags & snapshot.RAM_PAGE else 1
            page = stream[at : at + size] * (4096 if size == 1 else 1)
            at += size
            memory[(block, address)] = page
        at += 5  # the footer
        if kind == 3:
            break
    return {k: v for k, v in memory.items() if v.strip(b"\0")}, stream[at:]


def test_a_state_is_kept_without_the_guest_rams_zero_pages() -> None:
    """A restore reads each zero page QEMU recorded, and without huge pages every
    read of untouched RAM is a fault: left out, the guest's RAM comes out the same."""
    import io

    devices = b"\x04devices as they are\x00\x1f{json}"
    saved = _stream(devices)
    out = io.BytesIO()
    assert snapshot.strip_zero_pages(io.BytesIO(saved), out) == 2
    stripped = out.getvalue()
    assert len(stripped) < len(saved) and stripped.endswith(devices)
    assert _load(stripped) == _load(saved)
    assert (snapshot.GUEST_RAM, 8192) in _load(stripped)[0]
    again = io.BytesIO()
    assert snapshot.strip_zero_pages(io.BytesIO(stripped), again) == 0
    assert again.getvalue() == stripped


def test_a_stream_it_does_not_know_is_kept_as_it_is(tmp_path: Path) -> None:
    import io

    saved = _stream(b"\x04")
    for bad in (
        b"QEVM\x00\x00\x00\x04" + saved[8:],  # another stream version
        saved.replace(b"\x03ram", b"\x03rom"),  # another section first
        saved[:200],  # cut short
    ):
        with pytest.raises(snapshot.StreamError):
            snapshot.strip_zero_pages(io.BytesIO(bad), io.BytesIO())
    fd = snapshot.new_file(str(tmp_path))
    os.write(fd, saved[:200])
    assert snapshot.without_zero_pages(fd, str(tmp_path)) == fd
    os.close(fd)
    fd = snapshot.new_file(str(tmp_path))
    os.write(fd, saved)
    out = snapshot.without_zero_pages(fd, str(tmp_path))
    assert out != fd and os.pread(out, len(saved), 0) != saved
    os.close(out)
