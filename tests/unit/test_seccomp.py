"""Tests for corral.seccomp.

Most tests run the compiled program through a small classic-BPF interpreter
below, so they need no kernel support.  One test installs the default filter
in a forked child to confirm the real kernel agrees with the interpreter.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import signal
import socket
import struct
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from corral import seccomp
from corral.seccomp import (
    SUPPORTED_ARCHES,
    ArgCond,
    SyscallRule,
    compile_filter,
    default_deny_rules,
    native_arch,
    syscall_number,
)

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
AUDIT_ARCH_I386 = 0x40000003
AUDIT_ARCH_ARM = 0x40000028

RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000

SIGCHLD = 17
CLONE_VM = 0x00000100
CLONE_FS = 0x00000200
CLONE_FILES = 0x00000400
CLONE_SIGHAND = 0x00000800
CLONE_VFORK = 0x00004000
CLONE_THREAD = 0x00010000
CLONE_NEWNS = 0x00020000
CLONE_SYSVSEM = 0x00040000
CLONE_SETTLS = 0x00080000
CLONE_PARENT_SETTID = 0x00100000
CLONE_CHILD_CLEARTID = 0x00200000
CLONE_NEWUSER = 0x10000000
THREAD_FLAGS = (
    CLONE_VM
    | CLONE_FS
    | CLONE_FILES
    | CLONE_SIGHAND
    | CLONE_THREAD
    | CLONE_SYSVSEM
    | CLONE_SETTLS
    | CLONE_PARENT_SETTID
    | CLONE_CHILD_CLEARTID
)

AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET = 1, 2, 10, 16, 17
TCGETS, TIOCSTI, TIOCLINUX = 0x5401, 0x5412, 0x541C
ADDR_NO_RANDOMIZE = 0x0040000
AT_FDCWD = 0xFFFFFF9C
O_WRONLY, O_CREAT, O_TMPFILE = 0o1, 0o100, 0o20200000
S_IFREG = 0o100000

# The brief's minimum deny list; default_deny_rules() must cover all of it.
REQUIRED_DENIED = {
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl", "add_key",
    "request_key", "bpf", "perf_event_open", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "mount", "umount2", "pivot_root",
    "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr", "userfaultfd", "setns", "name_to_handle_at", "open_by_handle_at",
    "acct", "swapon", "swapoff", "reboot", "syslog", "quotactl", "quotactl_fd", "iopl",
    "ioperm", "fanotify_init", "lookup_dcookie", "uselib", "vhangup", "settimeofday",
    "clock_settime", "clock_adjtime", "personality", "clone", "unshare", "clone3",
    "socket", "socketpair", "ioctl",
}  # fmt: skip


# --- a tiny classic-BPF interpreter (only what seccomp.py emits) ---------------

LD_W_ABS = 0x20
JMP_JA = 0x05
JMP_JEQ_K = 0x15
JMP_JGT_K = 0x25
JMP_JGE_K = 0x35
JMP_JSET_K = 0x45
ALU_AND_K = 0x54
RET_K = 0x06

SECCOMP_DATA = struct.Struct("<iIQ6Q")


def decode(prog: bytes) -> list[tuple[int, int, int, int]]:
    assert len(prog) % 8 == 0
    return [struct.unpack_from("<HBBI", prog, off) for off in range(0, len(prog), 8)]


def check_program(prog: bytes) -> None:
    """The static checks the kernel applies before accepting a filter."""
    insns = decode(prog)
    assert 0 < len(insns) <= 4096
    assert insns[-1][0] == RET_K, "last instruction must be a return"
    for pc, (code, jt, jf, k) in enumerate(insns):
        if code == LD_W_ABS:
            assert k % 4 == 0 and k < SECCOMP_DATA.size, f"bad load offset {k} at {pc}"
        elif code == JMP_JA:
            assert pc + 1 + k < len(insns), f"JA out of range at {pc}"
        elif code in (JMP_JEQ_K, JMP_JGT_K, JMP_JGE_K, JMP_JSET_K):
            assert pc + 1 + max(jt, jf) < len(insns), f"jump out of range at {pc}"
        else:
            assert code in (RET_K, ALU_AND_K), f"unexpected opcode {code:#x} at {pc}"


def run(prog: bytes, nr: int, arch: int, args: Sequence[int] = ()) -> int:
    """Run ``prog`` on a synthetic seccomp_data and return the action word."""
    full_args = [a & 0xFFFFFFFFFFFFFFFF for a in args] + [0] * (6 - len(args))
    data = SECCOMP_DATA.pack(
        struct.unpack("<i", struct.pack("<I", nr & 0xFFFFFFFF))[0], arch, 0, *full_args
    )
    insns = decode(prog)
    acc = 0
    pc = 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == LD_W_ABS:
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == ALU_AND_K:
            acc &= k
        elif code == JMP_JA:
            pc += k
        elif code == JMP_JEQ_K:
            pc += jt if acc == k else jf
        elif code == JMP_JGT_K:
            pc += jt if acc > k else jf
        elif code == JMP_JGE_K:
            pc += jt if acc >= k else jf
        elif code == JMP_JSET_K:
            pc += jt if acc & k else jf
        elif code == RET_K:
            return int(k)
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


def call(arch: str, name: str, *args: int, rules: Sequence[SyscallRule] | None = None) -> int:
    prog = compile_filter(default_deny_rules() if rules is None else rules, arch)
    nr = syscall_number(name, arch)
    assert nr is not None, f"{name} does not exist on {arch}"
    return run(prog, nr, AUDIT_ARCH[arch], args)


def err(e: int) -> int:
    return RET_ERRNO | e


def satisfying_args(rule: SyscallRule) -> list[int]:
    """Arguments for which every condition of ``rule`` holds."""
    args = [0] * 6
    for cond in rule.when:
        if cond.op in ("eq", "bits_set"):
            args[cond.index] = cond.value
        elif cond.op == "ne":
            args[cond.index] = cond.value ^ 1
        else:
            args[cond.index] = next(v for v in range(1 << 20) if v not in cond.values)
    return args


arches = pytest.mark.parametrize("arch", SUPPORTED_ARCHES)


# --- program structure ---------------------------------------------------------


@arches
def test_default_program_is_well_formed_and_small(arch: str) -> None:
    prog = compile_filter(default_deny_rules(), arch)
    check_program(prog)
    assert len(prog) // 8 < 4096


@arches
def test_compile_is_deterministic(arch: str) -> None:
    assert compile_filter(default_deny_rules(), arch) == compile_filter(default_deny_rules(), arch)


def test_empty_rules_still_check_arch() -> None:
    prog = compile_filter([], "aarch64")
    check_program(prog)
    assert run(prog, 0, AUDIT_ARCH["aarch64"]) == RET_ALLOW
    assert run(prog, 0, AUDIT_ARCH_ARM) == RET_KILL_PROCESS


# --- arch and ABI gate ---------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "foreign"),
    [
        (arch, foreign)
        for arch in AUDIT_ARCH
        for foreign in (AUDIT_ARCH_I386, AUDIT_ARCH_ARM, *AUDIT_ARCH.values(), 0)
        if foreign != AUDIT_ARCH[arch]
    ],
)
def test_wrong_arch_kills(arch: str, foreign: int) -> None:
    prog = compile_filter(default_deny_rules(), arch)
    read_nr = syscall_number("read", arch)
    assert read_nr is not None
    assert run(prog, read_nr, foreign) == RET_KILL_PROCESS


@pytest.mark.parametrize("name", ["read", "ptrace", "getpid", "socket"])
def test_x32_syscalls_kill(name: str) -> None:
    prog = compile_filter(default_deny_rules(), "x86_64")
    nr = syscall_number(name, "x86_64")
    assert nr is not None
    assert run(prog, 0x40000000 | nr, AUDIT_ARCH["x86_64"], [AF_NETLINK]) == RET_KILL_PROCESS


# --- default deny list ---------------------------------------------------------


def test_default_rules_cover_required_names() -> None:
    names = {r.name for r in default_deny_rules()}
    assert names >= REQUIRED_DENIED
    assert "adjtimex" not in names  # deliberately allowed, see default_deny_rules()


def test_every_default_rule_explains_itself() -> None:
    for rule in default_deny_rules():
        assert rule.why.strip(), rule.name


@pytest.mark.parametrize(
    ("arch", "rule"),
    [
        pytest.param(arch, rule, id=f"{arch}-{rule.name}")
        for arch in AUDIT_ARCH
        for rule in default_deny_rules()
        if syscall_number(rule.name, arch) is not None  # e.g. no iopl on aarch64
    ],
)
def test_each_default_rule_denies(arch: str, rule: SyscallRule) -> None:
    assert call(arch, rule.name, *satisfying_args(rule)) == err(rule.errno)


@arches
def test_arch_specific_syscalls(arch: str) -> None:
    # iopl/ioperm/uselib are x86-only; their rules must be skipped, not fail.
    for name in ("iopl", "ioperm", "uselib"):
        if arch == "aarch64":
            assert syscall_number(name, arch) is None
        else:
            assert call(arch, name) == err(errno.EPERM)


@arches
@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        ("ptrace", (0,), errno.EPERM),
        ("clone3", (0, 88), errno.ENOSYS),
        ("clone", (CLONE_NEWUSER | SIGCHLD,), errno.EPERM),
        ("clone", (CLONE_NEWUSER | CLONE_NEWNS,), errno.EPERM),
        ("unshare", (CLONE_NEWUSER,), errno.EPERM),
        ("socket", (AF_NETLINK, 3, 0), errno.EAFNOSUPPORT),
        ("socket", (AF_PACKET, 3, 0), errno.EAFNOSUPPORT),
        ("socketpair", (AF_INET, 1, 0), errno.EAFNOSUPPORT),
        ("ioctl", (0, TIOCSTI, 0), errno.EPERM),
        ("ioctl", (0, TIOCLINUX, 0), errno.EPERM),
        ("personality", (ADDR_NO_RANDOMIZE,), errno.EPERM),
        ("clock_adjtime", (1,), errno.EPERM),  # CLOCK_MONOTONIC
        ("clock_adjtime", (0xFFFFFFFB,), errno.EPERM),  # a dynamic (fd) clock id
        ("mount", (), errno.EPERM),
        ("bpf", (), errno.EPERM),
        # no set-user-ID or set-group-ID bit on any file, however the mode is set
        ("fchmodat", (AT_FDCWD, 0, 0o4755), errno.EPERM),
        ("fchmodat", (AT_FDCWD, 0, 0o2755), errno.EPERM),
        ("fchmodat2", (AT_FDCWD, 0, 0o6755, 0), errno.EPERM),
        ("fchmod", (3, 0o4711), errno.EPERM),
        ("openat", (AT_FDCWD, 0, O_WRONLY | O_CREAT, 0o4755), errno.EPERM),
        ("openat", (AT_FDCWD, 0, O_WRONLY | O_TMPFILE, 0o2700), errno.EPERM),
        ("mknodat", (AT_FDCWD, 0, S_IFREG | 0o4755, 0), errno.EPERM),
        ("openat2", (AT_FDCWD, 0, 0, 24), errno.ENOSYS),
    ],
)
def test_denied_calls(arch: str, name: str, args: tuple[int, ...], expected: int) -> None:
    assert call(arch, name, *args) == err(expected)


@arches
@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("read", (0, 0, 4096)),
        ("write", (1, 0, 10)),
        ("openat", (0xFFFFFF9C, 0, 0)),
        ("execve", ()),
        ("clone", (SIGCHLD,)),
        ("clone", (CLONE_VM | CLONE_VFORK | SIGCHLD,)),
        ("clone", (THREAD_FLAGS,)),
        ("unshare", (CLONE_NEWNS,)),
        ("socket", (AF_INET, 1, 0)),
        ("socket", (AF_INET6, 2, 0)),
        ("socket", (AF_UNIX, 1, 0)),
        ("socketpair", (AF_UNIX, 1, 0)),
        ("ioctl", (0, TCGETS, 0)),
        ("personality", (0xFFFFFFFF,)),
        ("personality", (0,)),
        ("personality", (0x0008,)),
        ("clock_adjtime", (0,)),  # glibc's adjtimex()/ntp_gettime() read path
        ("adjtimex", ()),
        ("getpid", ()),
        ("exit_group", (0,)),
        ("fchmodat", (AT_FDCWD, 0, 0o755)),
        ("fchmodat", (AT_FDCWD, 0, 0o1777)),  # the sticky bit gives nobody an identity
        ("fchmod", (3, 0o644)),
        ("openat", (AT_FDCWD, 0, O_WRONLY | O_CREAT, 0o755)),
        ("openat", (AT_FDCWD, 0, O_WRONLY, 0o4755)),  # no O_CREAT: the mode is ignored
        ("mknodat", (AT_FDCWD, 0, S_IFREG | 0o644, 0)),
    ],
)
def test_allow_twins(arch: str, name: str, args: tuple[int, ...]) -> None:
    assert call(arch, name, *args) == RET_ALLOW


@arches
@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        # The kernel truncates these to 32 bits, so high garbage must not
        # turn a denied call into an allowed one ...
        ("ioctl", (0, 0xDEAD0000_00005412, 0), err(errno.EPERM)),
        ("socket", (0xFFFFFFFF_00000010, 3, 0), err(errno.EAFNOSUPPORT)),
        ("clone", (0x00000001_00000000 | CLONE_NEWUSER,), err(errno.EPERM)),
        ("unshare", (0xFFFFFFFF_00000000 | CLONE_NEWUSER,), err(errno.EPERM)),
        ("fchmodat", (AT_FDCWD, 0, 0xFFFF0000_00000000 | 0o4755), err(errno.EPERM)),
        # ... nor an allowed call into a denied one.
        ("ioctl", (0, 0x00000001_00005401, 0), RET_ALLOW),
        ("socket", (0x00000001_00000002, 1, 0), RET_ALLOW),
        ("clone", (0xFFFFFFFF_00000000 | SIGCHLD,), RET_ALLOW),
        ("personality", (0xFFFFFFFF_00000000,), RET_ALLOW),
    ],
)
def test_high_argument_bits_are_ignored(
    arch: str, name: str, args: tuple[int, ...], expected: int
) -> None:
    assert call(arch, name, *args) == expected


@arches
def test_unlisted_syscalls_allowed(arch: str) -> None:
    prog = compile_filter(default_deny_rules(), arch)
    listed = {syscall_number(r.name, arch) for r in default_deny_rules()} - {None}
    for nr in range(0, 500):
        if nr not in listed:
            assert run(prog, nr, AUDIT_ARCH[arch], [AF_NETLINK, TIOCSTI]) == RET_ALLOW, nr


# --- rule semantics with custom rules ------------------------------------------


def test_first_matching_rule_wins() -> None:
    rules = [
        SyscallRule("ioctl", errno.EPERM, (ArgCond(1, "eq", 7),)),
        SyscallRule("ioctl", errno.EACCES, (ArgCond(1, "eq", 7),)),
        SyscallRule("ioctl", errno.EINVAL, (ArgCond(1, "eq", 8),)),
    ]
    assert call("x86_64", "ioctl", 0, 7, rules=rules) == err(errno.EPERM)
    assert call("x86_64", "ioctl", 0, 8, rules=rules) == err(errno.EINVAL)
    assert call("x86_64", "ioctl", 0, 9, rules=rules) == RET_ALLOW


def test_unconditional_rule_shadows_later_ones() -> None:
    rules = [
        SyscallRule("kcmp", errno.EPERM),
        SyscallRule("kcmp", errno.EACCES, (ArgCond(0, "eq", 1),)),
    ]
    assert call("aarch64", "kcmp", 1, rules=rules) == err(errno.EPERM)
    check_program(compile_filter(rules, "aarch64"))


def test_conditions_are_anded() -> None:
    rules = [
        SyscallRule(
            "prctl",
            errno.EPERM,
            (ArgCond(0, "eq", 4), ArgCond(1, "ne", 0), ArgCond(0, "bits_set", 0x4)),
        )
    ]
    assert call("x86_64", "prctl", 4, 1, rules=rules) == err(errno.EPERM)
    assert call("x86_64", "prctl", 4, 0, rules=rules) == RET_ALLOW
    assert call("x86_64", "prctl", 5, 1, rules=rules) == RET_ALLOW


def test_negative_values_compare_as_low_word() -> None:
    rules = [SyscallRule("kill", errno.EPERM, (ArgCond(0, "eq", -1),))]
    assert call("x86_64", "kill", 0xFFFFFFFF, rules=rules) == err(errno.EPERM)
    assert call("x86_64", "kill", -1, rules=rules) == err(errno.EPERM)
    assert call("x86_64", "kill", 1, rules=rules) == RET_ALLOW


RET_USER_NOTIF = 0x7FC00000


@arches
def test_notify_rule_asks_the_listener_after_earlier_refusals(arch: str) -> None:
    """chmod's supervisor is asked only once the set-ID refusal before it has not
    answered: the default rules' order decides, as for any rule."""
    from corral.tiers.landlock import extra_seccomp_rules

    rules = (*default_deny_rules(), *extra_seccomp_rules())
    for name, mode_at in (("chmod", 1), ("fchmod", 1), ("fchmodat", 2), ("fchmodat2", 2)):
        if syscall_number(name, arch) is None:
            continue  # chmod: x86_64 only
        plain = [0] * 4
        plain[mode_at] = 0o644
        setid = list(plain)
        setid[mode_at] = 0o4755
        assert call(arch, name, *plain, rules=rules) == RET_USER_NOTIF, name
        assert call(arch, name, *setid, rules=rules) == err(errno.EPERM), name
    for name in ("fchown", "fchownat"):  # owners stay refused outright
        assert call(arch, name, 0, 0, 0, rules=rules) == err(errno.EPERM), name


@arches
def test_notify_rule_without_a_listener_answers_its_errno(arch: str) -> None:
    rules = [
        SyscallRule("fchmod", errno.EPERM, (ArgCond(1, "bits_set", 0o6000),)),
        SyscallRule("fchmod", errno.EACCES, (), "supervised", notify=True),
    ]
    prog = compile_filter(rules, arch, notify=False)
    check_program(prog)
    nr = syscall_number("fchmod", arch)
    assert nr is not None
    assert run(prog, nr, AUDIT_ARCH[arch], [3, 0o644]) == err(errno.EACCES)
    assert run(prog, nr, AUDIT_ARCH[arch], [3, 0o4644]) == err(errno.EPERM)
    assert call(arch, "fchmod", 3, 0o644, rules=rules) == RET_USER_NOTIF


def test_notify_rule_says_so() -> None:
    rule = SyscallRule("fchmod", errno.EPERM, (), "why", notify=True)
    assert rule.describe() == "fchmod -> supervisor (else EPERM)"
    assert rule != SyscallRule("fchmod", errno.EPERM, (), "why")
    assert "notify=True" in repr(rule)


def test_zero_errno_fakes_success() -> None:
    rules = [SyscallRule("sched_yield", 0)]
    assert call("aarch64", "sched_yield", rules=rules) == RET_ERRNO


def test_long_syscall_block_uses_ja() -> None:
    # 200 rules x 3 instructions overflow the 8-bit jf of the block's JEQ.
    rules = [SyscallRule("ioctl", 1 + i, (ArgCond(1, "eq", 1000 + i),)) for i in range(200)]
    rules.append(SyscallRule("ptrace", errno.EPERM))
    prog = compile_filter(rules, "x86_64")
    check_program(prog)
    assert any(code == JMP_JA for code, *_ in decode(prog))
    assert call("x86_64", "ioctl", 0, 1000, rules=rules) == err(1)
    assert call("x86_64", "ioctl", 0, 1199, rules=rules) == err(200)
    assert call("x86_64", "ioctl", 0, 999, rules=rules) == RET_ALLOW
    assert call("x86_64", "ptrace", rules=rules) == err(errno.EPERM)
    assert call("x86_64", "read", rules=rules) == RET_ALLOW


def test_no_conditional_jump_exceeds_255() -> None:
    for arch in SUPPORTED_ARCHES:
        for _code, jt, jf, _k in decode(compile_filter(default_deny_rules(), arch)):
            assert jt <= 255 and jf <= 255


def test_rule_too_long_for_conditional_jump_raises() -> None:
    rule = SyscallRule("socket", errno.EPERM, (ArgCond(0, "not_in", values=tuple(range(300))),))
    with pytest.raises(ValueError, match="too long"):
        compile_filter([rule], "x86_64")


def test_program_over_4096_instructions_raises() -> None:
    rules = [SyscallRule("ioctl", 1, (ArgCond(1, "eq", i),)) for i in range(1400)]
    with pytest.raises(ValueError, match="4096"):
        compile_filter(rules, "x86_64")


# --- names, arches, validation -------------------------------------------------


def test_unknown_syscall_name_raises() -> None:
    with pytest.raises(ValueError, match="ptrce"):
        compile_filter([SyscallRule("ptrce", errno.EPERM)], "x86_64")
    with pytest.raises(ValueError):
        syscall_number("ptrce", "x86_64")


def test_syscall_missing_on_arch_is_skipped() -> None:
    # "open" is a real syscall, just not on aarch64: skipped, not an error.
    rule = SyscallRule("open", errno.EPERM)
    assert syscall_number("open", "aarch64") is None
    assert compile_filter([rule], "aarch64") == compile_filter([], "aarch64")
    assert call("x86_64", "open", rules=[rule]) == err(errno.EPERM)


def test_syscall_number_spot_checks() -> None:
    assert syscall_number("openat", "x86_64") == 257
    assert syscall_number("openat", "aarch64") == 56
    assert syscall_number("ptrace", "x86_64") == 101
    assert syscall_number("ptrace", "aarch64") == 117
    assert syscall_number("clone3", "aarch64") == 435
    with pytest.raises(ValueError):
        syscall_number("read", "riscv64")


def test_unsupported_arch_raises() -> None:
    with pytest.raises(ValueError):
        compile_filter([], "i386")


@pytest.mark.parametrize(
    ("machine", "expected"),
    [("x86_64", "x86_64"), ("AMD64", "x86_64"), ("aarch64", "aarch64"), ("arm64", "aarch64")],
)
def test_native_arch_normalises(machine: str, expected: str) -> None:
    assert native_arch(machine) == expected


@pytest.mark.parametrize("machine", ["riscv64", "i686", "armv7l", ""])
def test_native_arch_rejects_others(machine: str) -> None:
    with pytest.raises(ValueError):
        native_arch(machine)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"index": 6, "op": "eq"},
        {"index": -1, "op": "eq"},
        {"index": 0, "op": "lt"},
        {"index": 0, "op": "eq", "value": 1 << 32},
        {"index": 0, "op": "eq", "values": (1,)},
        {"index": 0, "op": "not_in"},
        {"index": 0, "op": "not_in", "value": 3, "values": (1,)},
        {"index": 0, "op": "not_in", "values": (1 << 33,)},
        {"index": 0, "op": "bits_set", "value": 0},
    ],
)
def test_bad_conditions_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ArgCond(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad_errno", [-1, 4096, 0x10000])
def test_bad_errno_rejected(bad_errno: int) -> None:
    with pytest.raises(ValueError):
        SyscallRule("ptrace", bad_errno)


# --- syscall tables against this machine's kernel headers ----------------------

# Syscalls newer than the linux-libc-dev this machine has (same number everywhere).
# fchmodat2: Linux 6.6; setxattrat, removexattrat: 6.13; file_setattr: 6.17
NEWER_THAN_DEBIAN_12 = {
    "fchmodat2": 452,
    "setxattrat": 463,
    "removexattrat": 466,
    "file_setattr": 469,
}
X86_64_HEADER = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
GENERIC_HEADER = Path("/usr/include/asm-generic/unistd.h")


def _header_numbers(path: Path) -> dict[str, int]:
    text = path.read_text()
    nums: dict[str, int] = {}
    for name, num in re.findall(r"#define __NR_(\w+)\s+(\d+)\b", text):
        nums.setdefault(name, int(num))
    # asm-generic spells some 64-bit numbers through __NR3264_* aliases; the
    # first alias block in the file is the 64-bit one.
    generic = dict(re.findall(r"#define __NR3264_(\w+)\s+(\d+)\b", text))
    for name, base in re.findall(r"#define __NR_(\w+)\s+__NR3264_(\w+)\b", text):
        if base in generic:  # __NR3264_stat is only provided by some arches
            nums.setdefault(name, int(generic[base]))
    return nums


@pytest.mark.parametrize(
    ("arch", "header"), [("x86_64", X86_64_HEADER), ("aarch64", GENERIC_HEADER)]
)
def test_tables_match_kernel_headers(arch: str, header: Path) -> None:
    if not header.exists():
        pytest.skip(f"{header} not installed (linux-libc-dev)")
    nums = _header_numbers(header)
    table = seccomp._TABLES[arch]
    for name, num in table.items():
        if name in NEWER_THAN_DEBIAN_12 and name not in nums:
            continue  # the installed headers predate it (Linux 6.1)
        assert nums.get(name) == num, f"{arch} {name}: table {num}, header {nums.get(name)}"
    for name in seccomp._KNOWN_NAMES - table.keys():
        assert name not in nums, f"{name} exists on {arch} but the table lacks it"


# --- the real kernel ------------------------------------------------------------

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SKIP_EXIT = 77


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _install_filter(libc: ctypes.CDLL, prog: bytes) -> None:
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = SockFprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    libc.unshare.argtypes = [ctypes.c_int]
    libc.syscall.argtypes = [ctypes.c_long]
    libc.syscall.restype = ctypes.c_long
    return libc


def _default_checks(libc: ctypes.CDLL) -> list[str]:
    """Runs in the filtered child; returns a list of failures."""
    failures: list[str] = []
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()
        failures.append("socket(AF_NETLINK) succeeded")
    except OSError as exc:
        if exc.errno != errno.EAFNOSUPPORT:
            failures.append(f"socket(AF_NETLINK) gave {exc!r}")
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
    except OSError as exc:
        failures.append(f"socket(AF_INET) failed: {exc!r}")

    ctypes.set_errno(0)
    if libc.unshare(CLONE_NEWUSER) != -1 or ctypes.get_errno() != errno.EPERM:
        failures.append(f"unshare(CLONE_NEWUSER) errno={ctypes.get_errno()}")
    if os.getpid() <= 0:
        failures.append("getpid failed")

    # glibc's pthread_create tries clone3 first; ENOSYS must make it fall
    # back to clone() without CLONE_NEWUSER, which the filter allows.
    ran: list[bool] = []
    t = threading.Thread(target=lambda: ran.append(True))
    t.start()
    t.join()
    if ran != [True]:
        failures.append("thread did not run")

    pid = os.fork()
    if pid == 0:
        os._exit(0)
    if os.waitpid(pid, 0)[1] != 0:
        failures.append("fork() child did not exit cleanly")
    failures += _set_id_checks()
    return failures


def _set_id_checks() -> list[str]:
    """No set-ID bit reaches a file; plain modes still do (the twins)."""
    import tempfile

    failures = []
    where = tempfile.mkdtemp()
    path = os.path.join(where, "f")
    denied: list[tuple[str, Callable[[], None]]] = [
        ("chmod u+s", lambda: os.chmod(path, 0o4755)),
        ("chmod g+s", lambda: os.chmod(path, 0o2755)),
        ("create u+s", lambda: os.close(os.open(path + "2", os.O_WRONLY | os.O_CREAT, 0o4755))),
    ]
    allowed: list[tuple[str, Callable[[], None]]] = [("chmod 755", lambda: os.chmod(path, 0o755))]
    allowed.append(("create 755", lambda: os.close(os.open(path + "3", os.O_CREAT, 0o755))))
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
    for what, act in denied:
        try:
            act()
            failures.append(f"{what} succeeded")
        except PermissionError:
            pass
    for what, act in allowed:
        try:
            act()
        except OSError as exc:
            failures.append(f"{what} failed: {exc!r}")
    modes = [os.stat(os.path.join(where, n)).st_mode for n in os.listdir(where)]
    if any(m & 0o6000 for m in modes) or os.path.exists(path + "2"):
        failures.append(f"a set-ID file was made: {[oct(m) for m in modes]}")
    return failures


def _run_filtered(checks: Callable[[ctypes.CDLL], list[str]]) -> tuple[int, str]:
    """Fork, install the default filter in the child, run ``checks`` there.

    Returns the child's wait status and its report.  The filter only ever
    exists in the child, so the test process and host are unaffected.
    """
    try:
        arch = native_arch()
    except ValueError:
        pytest.skip("unsupported machine")
    prog = compile_filter(default_deny_rules(), arch)

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            os.close(read_fd)
            libc = _libc()
            try:
                _install_filter(libc, prog)
            except OSError as exc:
                os.write(write_fd, f"cannot install filter: {exc!r}".encode())
                code = SKIP_EXIT
            else:
                failures = checks(libc)
                os.write(write_fd, "\n".join(failures).encode())
                code = 1 if failures else 0
        except BaseException as exc:
            os.write(write_fd, f"child crashed: {exc!r}".encode())
        finally:
            os._exit(code)

    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        report = f.read().decode()
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == SKIP_EXIT:
        pytest.skip(report)
    return status, report


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux-only")


@linux_only
def test_default_filter_on_real_kernel() -> None:
    status, report = _run_filtered(_default_checks)
    assert os.WIFEXITED(status), f"child died with status {status:#x}: {report}"
    assert os.WEXITSTATUS(status) == 0, report


def _call_x32_getpid(libc: ctypes.CDLL) -> list[str]:
    libc.syscall(0x40000000 | 39)
    return ["x32 getpid returned instead of killing the process"]


@linux_only
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x32 exists only on x86_64")
def test_x32_syscall_is_killed_on_real_kernel() -> None:
    status, report = _run_filtered(_call_x32_getpid)
    assert os.WIFSIGNALED(status), f"child was not killed: {report}"
    assert os.WTERMSIG(status) == signal.SIGSYS


def test_rules_describe_themselves_readably() -> None:
    from corral.tiers.container import gvisor_namespace_rules
    from corral.tiers.landlock import extra_seccomp_rules

    said = {r.describe() for r in (*default_deny_rules(), *extra_seccomp_rules())}
    for text in (
        "ptrace -> EPERM",
        "clone3 -> ENOSYS",
        "clone(flags has CLONE_NEWUSER) -> EPERM",
        "clock_adjtime(clock != CLOCK_REALTIME) -> EPERM",
        "socket(domain not in AF_UNIX, AF_INET, AF_INET6) -> EAFNOSUPPORT",
        "socketpair(domain != AF_UNIX) -> EAFNOSUPPORT",
        "ioctl(request == TIOCSTI) -> EPERM",
        "fchmodat(mode has any of S_ISUID, S_ISGID) -> EPERM",
        "openat(oflag has O_CREAT and mode has any of S_ISUID, S_ISGID) -> EPERM",
        "openat2 -> ENOSYS",
        "socket(domain == AF_INET and type is not SOCK_STREAM) -> EACCES",
    ):
        assert text in said, text
    personality = next(t for t in said if t.startswith("personality("))
    assert "PER_LINUX32" in personality and "ArgCond" not in personality
    gvisor = gvisor_namespace_rules()[0].describe()
    assert gvisor.startswith("unshare(flags has any of CLONE_NEWNS, ") and "CLONE_NEWNET" in gvisor
    odd = SyscallRule("ioctl", 1, (ArgCond(2, "bits_set", 0x3),), "test")
    assert odd.describe() == "ioctl(arg2 has any bit of 0x3) -> EPERM"
