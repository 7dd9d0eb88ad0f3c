"""Compile syscall deny rules into a classic-BPF seccomp program.

This module is pure: it only builds bytes.  Installing the program is the
launcher's job (``bwrap --seccomp FD`` or ``seccomp(SECCOMP_SET_MODE_FILTER)``).

Program shape::

    A = seccomp_data.arch;  if A != AUDIT_ARCH(arch): KILL_PROCESS
    A = seccomp_data.nr
    (x86_64 only) if A & X32_BIT: KILL_PROCESS
    for each syscall with rules:
        if A != nr: skip this block
        rule 1: test conditions -> ERRNO(e1), on failure fall to rule 2
        ...
        ALLOW                      # the syscall matched but no rule did
    ALLOW

Only LD|W|ABS, JEQ/JSET/JA and RET are emitted.  Besides keeping the
program trivially auditable, that is exactly the subset the kernel's
seccomp action cache can emulate, so syscalls without rules get cached as
"always allow" and skip the filter on the hot path (Linux >= 5.11).
"""

from __future__ import annotations

import errno as _errno
import os

# ``dataclasses``, ``typing`` and ``platform`` cost ~15 ms to import and this
# module is on the hot path of every run, so the classes below are written out.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Literal

    Op = Literal["eq", "ne", "bits_set", "not_in"]

__all__ = [
    "SUPPORTED_ARCHES",
    "ArgCond",
    "SyscallRule",
    "compile_filter",
    "default_deny_rules",
    "native_arch",
    "syscall_number",
]

SUPPORTED_ARCHES: tuple[str, ...] = ("x86_64", "aarch64")

# --- classic BPF / seccomp constants (linux/filter.h, linux/seccomp.h) ------

_BPF_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
_BPF_JMP_JA = 0x05 | 0x00  # BPF_JMP | BPF_JA
_BPF_JMP_JEQ_K = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K
_BPF_JMP_JSET_K = 0x05 | 0x40 | 0x00  # BPF_JMP | BPF_JSET | BPF_K
_BPF_RET_K = 0x06 | 0x00  # BPF_RET | BPF_K

_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_USER_NOTIF = 0x7FC00000  # ask the filter's listener (a supervisor) to decide
_RET_ALLOW = 0x7FFF0000

# The kernel refuses longer programs (BPF_MAXINSNS).
_MAX_INSNS = 4096
# jt/jf are u8 offsets.
_MAX_COND_JUMP = 255
# The kernel clamps SECCOMP_RET_DATA to MAX_ERRNO; reject rather than clamp
# so a rule never returns something other than what it says.
_MAX_ERRNO = 4095

# struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; }
_OFF_NR = 0
_OFF_ARCH = 4
_OFF_ARGS = 16

_AUDIT_ARCH: dict[str, int] = {
    "x86_64": 0xC000003E,  # EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
    "aarch64": 0xC00000B7,  # EM_AARCH64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
}

# x32 syscalls enter the x86_64 table with this bit set and share the
# AUDIT_ARCH of x86_64, so an arch check alone would let them bypass every
# per-number rule below.
_X32_SYSCALL_BIT = 0x40000000

# sock_filter is packed in host byte order (_sock_filter); both supported arches
# are little-endian, so the layout is fixed regardless of where we compile.

# --- syscall tables -----------------------------------------------------------
# Taken from linux-libc-dev 6.1 headers: asm/unistd_64.h for x86_64 and
# asm-generic/unistd.h (as configured by arm64: 64-bit, RENAMEAT, NEW_STAT,
# SYS_CLONE3) for aarch64.  A name in one table but not the other is a
# syscall that really does not exist on that arch (legacy calls like "open"
# were never given an asm-generic number).

_X86_64: dict[str, int] = {
    "read": 0, "write": 1, "open": 2, "close": 3, "stat": 4, "fstat": 5, "lstat": 6,
    "poll": 7, "lseek": 8, "mmap": 9, "mprotect": 10, "munmap": 11, "brk": 12,
    "rt_sigaction": 13, "rt_sigprocmask": 14, "rt_sigreturn": 15, "ioctl": 16,
    "pread64": 17, "pwrite64": 18, "readv": 19, "writev": 20, "access": 21, "pipe": 22,
    "select": 23, "sched_yield": 24, "mremap": 25, "madvise": 28, "dup": 32, "dup2": 33,
    "nanosleep": 35, "getpid": 39, "socket": 41, "connect": 42, "accept": 43,
    "sendto": 44, "recvfrom": 45, "sendmsg": 46, "recvmsg": 47, "shutdown": 48,
    "bind": 49, "listen": 50, "getsockname": 51, "getpeername": 52, "socketpair": 53,
    "setsockopt": 54, "getsockopt": 55, "clone": 56, "fork": 57, "vfork": 58,
    "execve": 59, "exit": 60, "wait4": 61, "kill": 62, "uname": 63, "fcntl": 72,
    "flock": 73, "fsync": 74, "fdatasync": 75, "truncate": 76, "ftruncate": 77,
    "getcwd": 79, "chdir": 80, "fchdir": 81, "rename": 82, "mkdir": 83, "rmdir": 84,
    "creat": 85, "link": 86, "unlink": 87, "symlink": 88, "readlink": 89, "chmod": 90, "fchmod": 91,
    "chown": 92, "fchown": 93, "lchown": 94, "umask": 95, "gettimeofday": 96,
    "getrusage": 98, "sysinfo": 99, "ptrace": 101, "getuid": 102, "syslog": 103,
    "getgid": 104, "geteuid": 107, "getegid": 108, "getppid": 110, "sigaltstack": 131,
    "mknod": 133, "uselib": 134, "personality": 135, "vhangup": 153, "pivot_root": 155,
    "prctl": 157,
    "arch_prctl": 158, "adjtimex": 159, "chroot": 161, "acct": 163, "settimeofday": 164,
    "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169,
    "sethostname": 170, "setdomainname": 171, "iopl": 172, "ioperm": 173,
    "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197,
    "lremovexattr": 198, "fremovexattr": 199,
    "init_module": 175, "delete_module": 176, "quotactl": 179, "gettid": 186,
    "futex": 202, "sched_getaffinity": 204, "lookup_dcookie": 212, "getdents64": 217,
    "set_tid_address": 218, "clock_settime": 227, "clock_gettime": 228,
    "clock_getres": 229, "clock_nanosleep": 230, "exit_group": 231, "epoll_wait": 232,
    "epoll_ctl": 233, "tgkill": 234, "kexec_load": 246, "waitid": 247, "add_key": 248,
    "request_key": 249, "keyctl": 250, "openat": 257, "mkdirat": 258, "mknodat": 259,
    "fchownat": 260,
    "newfstatat": 262, "unlinkat": 263, "renameat": 264, "linkat": 265,
    "symlinkat": 266, "readlinkat": 267, "fchmodat": 268, "faccessat": 269,
    "pselect6": 270, "ppoll": 271, "unshare": 272, "set_robust_list": 273,
    "get_robust_list": 274, "epoll_pwait": 281, "timerfd_create": 283, "accept4": 288,
    "signalfd4": 289, "eventfd2": 290, "epoll_create1": 291, "dup3": 292, "pipe2": 293,
    "perf_event_open": 298, "fanotify_init": 300, "fanotify_mark": 301,
    "prlimit64": 302, "name_to_handle_at": 303, "open_by_handle_at": 304,
    "clock_adjtime": 305, "setns": 308, "process_vm_readv": 310,
    "process_vm_writev": 311, "kcmp": 312, "finit_module": 313, "renameat2": 316,
    "seccomp": 317, "getrandom": 318, "memfd_create": 319, "kexec_file_load": 320,
    "bpf": 321, "execveat": 322, "userfaultfd": 323, "statx": 332, "rseq": 334,
    "pidfd_send_signal": 424, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_open": 434, "clone3": 435,
    "openat2": 437, "pidfd_getfd": 438, "faccessat2": 439, "mount_setattr": 442,
    "quotactl_fd": 443, "landlock_create_ruleset": 444, "landlock_add_rule": 445,
    "landlock_restrict_self": 446, "fchmodat2": 452, "setxattrat": 463, "removexattrat": 466,
    "file_setattr": 469,
    "shmget": 29, "shmat": 30, "shmctl": 31, "semget": 64, "semop": 65, "semctl": 66,
    "shmdt": 67, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "semtimedop": 220,
    "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243,
    "mq_notify": 244, "mq_getsetattr": 245, "sched_setaffinity": 203,
    "sched_setscheduler": 144, "sched_setparam": 142, "sched_setattr": 314,
    "setpriority": 141, "ioprio_set": 251,
}  # fmt: skip

_AARCH64: dict[str, int] = {
    "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14, "lremovexattr": 15,
    "fremovexattr": 16, "getcwd": 17, "lookup_dcookie": 18, "eventfd2": 19, "epoll_create1": 20,
    "epoll_ctl": 21, "epoll_pwait": 22, "dup": 23, "dup3": 24, "fcntl": 25, "ioctl": 29,
    "flock": 32, "mknodat": 33, "mkdirat": 34, "unlinkat": 35, "symlinkat": 36, "linkat": 37,
    "renameat": 38, "umount2": 39, "mount": 40, "pivot_root": 41, "truncate": 45,
    "ftruncate": 46, "faccessat": 48, "chdir": 49, "fchdir": 50, "chroot": 51,
    "fchmod": 52, "fchmodat": 53, "fchownat": 54, "fchown": 55, "openat": 56,
    "close": 57, "vhangup": 58, "pipe2": 59, "quotactl": 60, "getdents64": 61,
    "lseek": 62, "read": 63, "write": 64, "readv": 65, "writev": 66, "pread64": 67,
    "pwrite64": 68, "pselect6": 72, "ppoll": 73, "signalfd4": 74, "readlinkat": 78,
    "newfstatat": 79, "fstat": 80, "fsync": 82, "fdatasync": 83, "timerfd_create": 85,
    "acct": 89, "personality": 92, "exit": 93, "exit_group": 94, "waitid": 95,
    "set_tid_address": 96, "unshare": 97, "futex": 98, "set_robust_list": 99,
    "get_robust_list": 100, "nanosleep": 101, "kexec_load": 104, "init_module": 105,
    "delete_module": 106, "clock_settime": 112, "clock_gettime": 113,
    "clock_getres": 114, "clock_nanosleep": 115, "syslog": 116, "ptrace": 117,
    "sched_getaffinity": 123, "sched_yield": 124, "kill": 129, "tgkill": 131,
    "sigaltstack": 132, "rt_sigaction": 134, "rt_sigprocmask": 135, "rt_sigreturn": 139,
    "reboot": 142, "uname": 160, "sethostname": 161, "setdomainname": 162,
    "getrusage": 165, "umask": 166, "prctl": 167, "gettimeofday": 169,
    "settimeofday": 170, "adjtimex": 171, "getpid": 172, "getppid": 173, "getuid": 174,
    "geteuid": 175, "getgid": 176, "getegid": 177, "gettid": 178, "sysinfo": 179,
    "socket": 198, "socketpair": 199, "bind": 200, "listen": 201, "accept": 202,
    "connect": 203, "getsockname": 204, "getpeername": 205, "sendto": 206,
    "recvfrom": 207, "setsockopt": 208, "getsockopt": 209, "shutdown": 210,
    "sendmsg": 211, "recvmsg": 212, "brk": 214, "munmap": 215, "mremap": 216,
    "add_key": 217, "request_key": 218, "keyctl": 219, "clone": 220, "execve": 221,
    "mmap": 222, "swapon": 224, "swapoff": 225, "mprotect": 226, "madvise": 233,
    "perf_event_open": 241, "accept4": 242, "wait4": 260, "prlimit64": 261,
    "fanotify_init": 262, "fanotify_mark": 263, "name_to_handle_at": 264,
    "open_by_handle_at": 265, "clock_adjtime": 266, "setns": 268,
    "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "finit_module": 273,
    "renameat2": 276, "seccomp": 277, "getrandom": 278, "memfd_create": 279, "bpf": 280,
    "execveat": 281, "userfaultfd": 282, "statx": 291, "rseq": 293,
    "kexec_file_load": 294, "pidfd_send_signal": 424, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "pidfd_open": 434, "clone3": 435, "openat2": 437, "pidfd_getfd": 438,
    "faccessat2": 439, "mount_setattr": 442, "quotactl_fd": 443,
    "landlock_create_ruleset": 444, "landlock_add_rule": 445,
    "landlock_restrict_self": 446, "fchmodat2": 452, "setxattrat": 463,
    "removexattrat": 466, "file_setattr": 469,
    "msgget": 186, "msgctl": 187, "msgrcv": 188, "msgsnd": 189, "semget": 190,
    "semctl": 191, "semtimedop": 192, "semop": 193, "shmget": 194, "shmctl": 195,
    "shmat": 196, "shmdt": 197, "mq_open": 180, "mq_unlink": 181, "mq_timedsend": 182,
    "mq_timedreceive": 183, "mq_notify": 184, "mq_getsetattr": 185,
    "sched_setaffinity": 122, "sched_setscheduler": 119, "sched_setparam": 118,
    "sched_setattr": 274, "setpriority": 140, "ioprio_set": 30,
}  # fmt: skip

_TABLES: dict[str, dict[str, int]] = {"x86_64": _X86_64, "aarch64": _AARCH64}
_KNOWN_NAMES: frozenset[str] = frozenset(_X86_64) | frozenset(_AARCH64)

_ARCH_ALIASES: dict[str, str] = {
    "x86_64": "x86_64",
    "amd64": "x86_64",
    "aarch64": "aarch64",
    "arm64": "aarch64",
}

# --- public data model --------------------------------------------------------

_OPS = ("eq", "ne", "bits_set", "not_in")


def _check_u32(value: int, what: str) -> None:
    # Negative values are accepted for C `int` parameters (e.g. -1) and are
    # compared as their two's-complement low word; anything wider than 32
    # bits would be silently truncated by the comparison, so reject it.
    if not -(2**31) <= value <= 0xFFFFFFFF:
        raise ValueError(f"{what}={value:#x} does not fit in 32 bits")


class ArgCond:
    """A test on the LOW 32 bits of syscall argument ``index`` (0..5).

    Only the low word is compared, on purpose: the kernel truncates
    ``int``/``unsigned int`` parameters (socket domain, ioctl cmd,
    personality) to 32 bits, so a full 64-bit compare could be dodged by
    setting high bits the kernel then ignores.  For ``unsigned long`` flag
    words (clone/unshare) every namespace bit lives in the low word, so a
    ``bits_set`` test there is exact too.

    ops: ``eq`` arg == value; ``ne`` arg != value; ``bits_set``
    (arg & value) != 0; ``not_in`` arg not in values.
    """

    __slots__ = ("index", "op", "value", "values")

    def __init__(self, index: int, op: Op, value: int = 0, values: tuple[int, ...] = ()) -> None:
        self.index = index
        self.op = op
        self.value = value
        self.values = tuple(values)
        self._validate()

    def _key(self) -> tuple[int, str, int, tuple[int, ...]]:
        return (self.index, self.op, self.value, self.values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ArgCond) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"ArgCond(index={self.index}, op={self.op!r}, value={self.value}, values={self.values})"
        )

    def _validate(self) -> None:
        if not 0 <= self.index <= 5:
            raise ValueError(f"argument index {self.index} out of range 0..5")
        if self.op not in _OPS:
            raise ValueError(f"unknown condition op {self.op!r}")
        if self.op == "not_in":
            # A stray `value` here is almost certainly a mistake for `values`.
            if not self.values or self.value != 0:
                raise ValueError("not_in needs a non-empty `values` and no `value`")
            for v in self.values:
                _check_u32(v, "values[]")
        else:
            if self.values:
                raise ValueError(f"{self.op} takes `value`, not `values`")
            _check_u32(self.value, "value")
            if self.op == "bits_set" and self.value & 0xFFFFFFFF == 0:
                raise ValueError("bits_set with an empty mask can never match")


class SyscallRule:
    """Return ``-errno`` from syscall ``name`` when every condition holds.

    ``notify``: hand the call to the filter's listener instead (a supervisor that
    decides and answers); ``errno`` is then the answer of a program compiled
    without a listener (``compile_filter(..., notify=False)``)."""

    __slots__ = ("errno", "name", "notify", "when", "why")

    def __init__(
        self,
        name: str,
        errno: int,
        when: tuple[ArgCond, ...] = (),
        why: str = "",
        notify: bool = False,
    ) -> None:
        self.name = name
        self.errno = errno
        self.when = tuple(when)
        self.why = why
        self.notify = notify
        self._validate()

    def _key(self) -> tuple[str, int, tuple[ArgCond, ...], str, bool]:
        return (self.name, self.errno, self.when, self.why, self.notify)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SyscallRule) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        notify = ", notify=True" if self.notify else ""
        return f"SyscallRule({self.name!r}, errno={self.errno}, when={self.when!r}{notify})"

    def describe(self) -> str:
        """``socket(domain not in AF_UNIX, AF_INET, AF_INET6) -> EAFNOSUPPORT``: the
        call, its conditions with arguments and constants named, and the errno."""
        call = self.name
        if self.when:
            call += "(" + " and ".join(_describe_cond(self.name, c) for c in self.when) + ")"
        err = _errno.errorcode.get(self.errno, str(self.errno))
        return f"{call} -> supervisor (else {err})" if self.notify else f"{call} -> {err}"

    def _validate(self) -> None:
        if not 0 <= self.errno <= _MAX_ERRNO:
            raise ValueError(f"errno {self.errno} out of range 0..{_MAX_ERRNO}")


# --- arch / syscall lookup ----------------------------------------------------


def native_arch(machine: str | None = None) -> str:
    """Return the running (or given) machine's arch in SUPPORTED_ARCHES spelling."""
    machine = (os.uname().machine if machine is None else machine).lower()
    arch = _ARCH_ALIASES.get(machine)
    if arch is None:
        raise ValueError(f"unsupported machine {machine!r} for seccomp filters")
    return arch


def _table(arch: str) -> dict[str, int]:
    table = _TABLES.get(arch)
    if table is None:
        raise ValueError(f"unsupported arch {arch!r}; expected one of {SUPPORTED_ARCHES}")
    return table


def syscall_number(name: str, arch: str) -> int | None:
    """Number of ``name`` on ``arch``, or None if the arch lacks that syscall.

    Raises ValueError for an unsupported arch or a name absent from every
    table, so a typo is never mistaken for "not on this arch".
    """
    table = _table(arch)
    if name not in _KNOWN_NAMES:
        raise ValueError(f"unknown syscall name {name!r}")
    return table.get(name)


# --- code generation ----------------------------------------------------------

# (code, jt, jf, k).  _FAIL in jt/jf means "jump to the next rule" and is
# resolved once the rule's length is known.
_Insn = tuple[int, int, int, int]
_FAIL = -1


def _stmt(code: int, k: int) -> _Insn:
    return (code, 0, 0, k)


def _jump(code: int, k: int, jt: int, jf: int) -> _Insn:
    return (code, jt, jf, k)


def _u32(value: int) -> int:
    return value & 0xFFFFFFFF


def _rule_code(rule: SyscallRule, notify: bool) -> list[_Insn]:
    code: list[_Insn] = []
    loaded: int | None = None  # which arg is in A; unknown at rule entry
    for cond in rule.when:
        if loaded != cond.index:
            code.append(_stmt(_BPF_LD_W_ABS, _OFF_ARGS + 8 * cond.index))
            loaded = cond.index
        if cond.op == "eq":
            code.append(_jump(_BPF_JMP_JEQ_K, _u32(cond.value), 0, _FAIL))
        elif cond.op == "ne":
            code.append(_jump(_BPF_JMP_JEQ_K, _u32(cond.value), _FAIL, 0))
        elif cond.op == "bits_set":
            code.append(_jump(_BPF_JMP_JSET_K, _u32(cond.value), 0, _FAIL))
        else:  # not_in: any hit means the condition fails
            for v in cond.values:
                code.append(_jump(_BPF_JMP_JEQ_K, _u32(v), _FAIL, 0))
    ret = _RET_USER_NOTIF if notify and rule.notify else _RET_ERRNO | rule.errno
    code.append(_stmt(_BPF_RET_K, ret))

    # Every _FAIL lands just past this rule's RET, i.e. at index len(code).
    end = len(code)
    resolved: list[_Insn] = []
    for pc, (op, jt, jf, k) in enumerate(code):
        dist = end - pc - 1
        if (jt == _FAIL or jf == _FAIL) and dist > _MAX_COND_JUMP:
            raise ValueError(f"rule for {rule.name!r} is too long for a conditional jump")
        resolved.append((op, dist if jt == _FAIL else jt, dist if jf == _FAIL else jf, k))
    return resolved


def _syscall_block(nr: int, rules: Sequence[SyscallRule], notify: bool) -> list[_Insn]:
    body: list[_Insn] = []
    for rule in rules:
        body.extend(_rule_code(rule, notify))
        if not rule.when:
            break  # unconditional: later rules for this syscall are unreachable
    else:
        # The syscall matched but no rule did; A now holds an argument, not
        # nr, so we cannot fall into later blocks and must decide here.
        body.append(_stmt(_BPF_RET_K, _RET_ALLOW))

    if len(body) <= _MAX_COND_JUMP:
        return [_jump(_BPF_JMP_JEQ_K, nr, 0, len(body)), *body]
    # Too far for jf: hop over a JA, whose 32-bit k can skip the whole body.
    return [_jump(_BPF_JMP_JEQ_K, nr, 1, 0), _stmt(_BPF_JMP_JA, len(body)), *body]


def compile_filter(rules: Sequence[SyscallRule], arch: str, notify: bool = True) -> bytes:
    """Compile ``rules`` into a seccomp BPF program for ``arch``.

    Rules are grouped per syscall and tried in their given order; the first
    match wins, so a conditional errno rule listed before a ``notify`` rule for
    the same call (the set-ID refusals before chmod's supervisor) still answers
    by itself.  Rules naming a syscall the arch lacks are skipped, but a
    name in no table raises ValueError so a typo cannot drop a rule.
    ``notify=False``: ``notify`` rules answer their errno (for a process that
    cannot have a listener, whose calls would otherwise fail with ENOSYS).
    """
    table = _table(arch)
    grouped: dict[int, list[SyscallRule]] = {}
    for rule in rules:
        if rule.name not in _KNOWN_NAMES:
            raise ValueError(f"unknown syscall name {rule.name!r} in seccomp rule")
        nr = table.get(rule.name)
        if nr is None:
            continue
        grouped.setdefault(nr, []).append(rule)

    prog: list[_Insn] = [
        _stmt(_BPF_LD_W_ABS, _OFF_ARCH),
        _jump(_BPF_JMP_JEQ_K, _AUDIT_ARCH[arch], 1, 0),
        # A foreign ABI (i386/arm32 compat) would index a different table.
        _stmt(_BPF_RET_K, _RET_KILL_PROCESS),
        _stmt(_BPF_LD_W_ABS, _OFF_NR),
    ]
    if arch == "x86_64":
        prog += [
            _jump(_BPF_JMP_JSET_K, _X32_SYSCALL_BIT, 0, 1),
            _stmt(_BPF_RET_K, _RET_KILL_PROCESS),
        ]
    # Argument-checked syscalls (ioctl, socket, clone...) run the filter on
    # every call, while the kernel's action cache short-circuits the rest, so
    # test the argument-checked ones first.  sorted() is stable: deterministic.
    ordered = sorted(grouped.items(), key=lambda item: all(not r.when for r in item[1]))
    for nr, group in ordered:
        prog += _syscall_block(nr, group, notify)
    prog.append(_stmt(_BPF_RET_K, _RET_ALLOW))

    if len(prog) > _MAX_INSNS:
        raise ValueError(f"seccomp program has {len(prog)} instructions; limit is {_MAX_INSNS}")
    return b"".join(_sock_filter(*insn) for insn in prog)


def _sock_filter(code: int, jt: int, jf: int, k: int) -> bytes:
    """One ``struct sock_filter`` (u16 code, u8 jt, u8 jf, u32 k), little-endian as
    on every arch corral knows; without the struct module (its import costs a run
    about 0.2 ms)."""
    return code.to_bytes(2, "little") + bytes((jt, jf)) + k.to_bytes(4, "little")


# --- default policy -----------------------------------------------------------

_CLONE_NEWUSER = 0x10000000
_CLOCK_REALTIME = 0
_AF_UNIX = 1
_AF_INET = 2
_AF_INET6 = 10
_TIOCSTI = 0x5412
_SET_ID_BITS = 0o6000  # S_ISUID | S_ISGID
_O_CREAT = 0o100  # x86_64 and the asm-generic arches (aarch64)
_O_TMPFILE_BIT = 0o20000000  # __O_TMPFILE: O_TMPFILE is this | O_DIRECTORY
_TIOCLINUX = 0x541C
# <sys/personality.h>: PER_LINUX, PER_LINUX32, UNAME26, PER_LINUX32|UNAME26,
# and 0xffffffff which only queries.  Everything else toggles behaviour that
# helps exploits (ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, MMAP_PAGE_ZERO, ...).
_SAFE_PERSONALITIES = (0x0, 0x0008, 0x20000, 0x20008, 0xFFFFFFFF)


# How --explain names the arguments rules test and the constants they compare with.
_ARG_NAMES = {
    "clone": ("flags",),
    "unshare": ("flags",),
    "clock_adjtime": ("clock",),
    "personality": ("persona",),
    "socket": ("domain", "type", "protocol"),
    "socketpair": ("domain",),
    "ioctl": ("fd", "request"),
    "chmod": ("path", "mode"),
    "fchmod": ("fd", "mode"),
    "fchmodat": ("dirfd", "path", "mode"),
    "fchmodat2": ("dirfd", "path", "mode"),
    "creat": ("path", "mode"),
    "mknod": ("path", "mode"),
    "mknodat": ("dirfd", "path", "mode"),
    "open": ("path", "oflag", "mode"),
    "openat": ("dirfd", "path", "oflag", "mode"),
}
_NAMESPACE_FLAGS = {
    0x00020000: "CLONE_NEWNS",
    0x02000000: "CLONE_NEWCGROUP",
    0x04000000: "CLONE_NEWUTS",
    0x08000000: "CLONE_NEWIPC",
    _CLONE_NEWUSER: "CLONE_NEWUSER",
    0x20000000: "CLONE_NEWPID",
    0x40000000: "CLONE_NEWNET",
}
_CONSTANTS: dict[str, dict[int, str]] = {
    "flags": _NAMESPACE_FLAGS,
    "clock": {_CLOCK_REALTIME: "CLOCK_REALTIME"},
    "persona": {
        0x0: "PER_LINUX",
        0x0008: "PER_LINUX32",
        0x20000: "UNAME26",
        0x20008: "PER_LINUX32|UNAME26",
        0xFFFFFFFF: "0xffffffff (query)",
    },
    "domain": {_AF_UNIX: "AF_UNIX", _AF_INET: "AF_INET", _AF_INET6: "AF_INET6"},
    "protocol": {0: "0 (default)", 6: "IPPROTO_TCP"},
    "request": {_TIOCSTI: "TIOCSTI", _TIOCLINUX: "TIOCLINUX"},
    "mode": {0o4000: "S_ISUID", 0o2000: "S_ISGID"},
    "oflag": {_O_CREAT: "O_CREAT", _O_TMPFILE_BIT: "O_TMPFILE"},
}


def _describe_cond(call: str, cond: ArgCond) -> str:
    names = _ARG_NAMES.get(call, ())
    arg = names[cond.index] if cond.index < len(names) else f"arg{cond.index}"
    known = _CONSTANTS.get(arg, {})

    def show(value: int) -> str:
        return known.get(value, f"{value:#x}")

    if cond.op == "not_in":
        return f"{arg} not in {', '.join(show(v) for v in cond.values)}"
    if cond.op == "bits_set":
        if arg == "type" and cond.value == 0xE:  # SOCK_DGRAM, SOCK_RAW, ... (STREAM is 1)
            return "type is not SOCK_STREAM"
        if cond.value in known:
            return f"{arg} has {known[cond.value]}"
        bits = [name for bit, name in known.items() if cond.value & bit == bit and bit]
        if bits and sum(b for b in known if cond.value & b == b and b) == cond.value:
            return f"{arg} has any of {', '.join(bits)}"
        return f"{arg} has any bit of {cond.value:#x}"
    return f"{arg} {'==' if cond.op == 'eq' else '!='} {show(cond.value)}"


def _deny(name: str, why: str, err: int = _errno.EPERM) -> SyscallRule:
    return SyscallRule(name=name, errno=err, why=why)


def _set_id_rules() -> tuple[SyscallRule, ...]:
    """No file gets a set-user-ID or set-group-ID bit.  What the sandbox writes
    outlives it: a set-ID program left in the workspace runs later outside it,
    as its owner (root, when corral ran as root) for whoever runs it.  Every way
    a mode is set is covered: chmod and its fd and at forms, a file created with
    that mode (open, openat, creat; O_TMPFILE too) or made by mknod.  openat2
    passes its mode in a struct seccomp cannot read: ENOSYS, and callers fall
    back to openat, which is filtered."""
    why = "set-ID bits: the program would run as its owner outside the sandbox"
    bits = ArgCond
    rules = [
        SyscallRule(name, _errno.EPERM, (bits(index, "bits_set", _SET_ID_BITS),), why)
        for name, index in (
            ("chmod", 1),
            ("fchmod", 1),
            ("fchmodat", 2),
            ("fchmodat2", 2),
            ("creat", 1),
            ("mknod", 1),
            ("mknodat", 2),
        )
    ]
    for name, flags in (("open", 1), ("openat", 2)):
        for creating in (_O_CREAT, _O_TMPFILE_BIT):
            when = (bits(flags, "bits_set", creating), bits(flags + 1, "bits_set", _SET_ID_BITS))
            rules.append(SyscallRule(name, _errno.EPERM, when, why))
    rules.append(_deny("openat2", "its mode is in a struct seccomp cannot read", _errno.ENOSYS))
    return tuple(rules)


def default_deny_rules() -> tuple[SyscallRule, ...]:
    """The baseline policy: block kernel surfaces an agent never needs, in groups
    (the order is the rules' order, which compile_filter keeps per syscall)."""
    return (
        *_process_rules(),
        *_kernel_rules(),
        *_mount_rules(),
        *_namespace_rules(),
        *_clock_rules(),
        *_socket_rules(),
        *_set_id_rules(),
        *_terminal_rules(),
    )


def _process_rules() -> tuple[SyscallRule, ...]:
    """Reaching into other processes."""
    return (
        _deny("ptrace", "inspect or control other processes"),
        _deny("process_vm_readv", "read another process's memory"),
        _deny("process_vm_writev", "write another process's memory"),
        _deny("pidfd_getfd", "steal file descriptors from another process"),
    )


_PRIO_USER = 2
_IOPRIO_WHO_USER = 3


def other_process_rules() -> tuple[SyscallRule, ...]:
    """Another process's limits and scheduling, which the kernel lets any process of
    the same uid set: on the landlock tier (no pid namespace) a command set a host
    process's resource limits (prlimit --pid); on the namespace tier pid 1 is the
    sandbox's own init or a Sandbox's agent, whose limits, niceness and CPUs every
    later command of a reused sandbox inherited.  A process's own (pid 0) stay
    free, and so do its threads' scheduling (pthread_setaffinity_np names a
    thread's id), but for pid 1's.  (Not in default_deny_rules: the container
    tiers, whose sandboxes are never reused, keep their filters within what
    gVisor compiles.)"""
    eperm = _errno.EPERM
    rules = [
        SyscallRule(
            "prlimit64",
            eperm,
            (ArgCond(0, "ne", 0), ArgCond(2, "ne", 0)),
            "set another process's resource limits",
        ),
        SyscallRule(
            "setpriority", eperm, (ArgCond(0, "eq", _PRIO_USER),), "renice every process of a user"
        ),
        SyscallRule(
            "ioprio_set",
            eperm,
            (ArgCond(0, "eq", _IOPRIO_WHO_USER),),
            "set the I/O priority of every process of a user",
        ),
    ]
    why = "the scheduling of pid 1 (the sandbox's init, or a Sandbox's agent)"
    rules += [
        SyscallRule(n, eperm, (ArgCond(1, "eq", 1),), why) for n in ("setpriority", "ioprio_set")
    ]
    rules += [
        SyscallRule(n, eperm, (ArgCond(0, "eq", 1),), why)
        for n in ("sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr")
    ]
    return tuple(rules)


def _kernel_rules() -> tuple[SyscallRule, ...]:
    """Kernel interfaces an agent never needs: big, exploit-prone, or host-wide."""
    return (
        # Large, exploit-prone kernel interfaces.
        _deny("io_uring_setup", "io_uring: frequent kernel exploit vector"),
        _deny("io_uring_enter", "io_uring: frequent kernel exploit vector"),
        _deny("io_uring_register", "io_uring: frequent kernel exploit vector"),
        _deny("bpf", "load eBPF programs into the kernel"),
        _deny("perf_event_open", "perf events: kernel attack surface and info leaks"),
        _deny("userfaultfd", "lets exploits stall page faults to win kernel races"),
        # Kernel keyrings are not namespaced.
        _deny("keyctl", "kernel keyring is shared with the host user"),
        _deny("add_key", "kernel keyring is shared with the host user"),
        _deny("request_key", "kernel keyring is shared with the host user"),
        # Host-wide administration.
        _deny("kexec_load", "replace the running kernel"),
        _deny("kexec_file_load", "replace the running kernel"),
        _deny("init_module", "load kernel modules"),
        _deny("finit_module", "load kernel modules"),
        _deny("delete_module", "unload kernel modules"),
        _deny("reboot", "reboot the host"),
        _deny("acct", "toggle host process accounting"),
        _deny("swapon", "change host swap"),
        _deny("swapoff", "change host swap"),
        _deny("syslog", "kernel log leaks addresses and host activity"),
        _deny("quotactl", "manipulate filesystem quotas"),
        _deny("quotactl_fd", "manipulate filesystem quotas"),
        _deny("iopl", "raw I/O port access"),
        _deny("ioperm", "raw I/O port access"),
        _deny("fanotify_init", "filesystem-wide event monitoring"),
        _deny("lookup_dcookie", "profiling interface that resolves kernel dcookies"),
        _deny("uselib", "obsolete a.out loader"),
        _deny("vhangup", "hang up the controlling terminal"),
    )


def _mount_rules() -> tuple[SyscallRule, ...]:
    """The sandbox's file system layout is fixed by the launcher."""
    return (
        # Filesystem layout is fixed by the launcher.
        _deny("mount", "change the sandbox's mounts"),
        _deny("umount2", "uncover paths hidden by sandbox mounts"),
        _deny("pivot_root", "change the sandbox's root"),
        _deny("move_mount", "change the sandbox's mounts"),
        _deny("open_tree", "clone mount trees"),
        _deny("fsopen", "create new filesystem instances"),
        _deny("fsconfig", "configure new filesystem instances"),
        _deny("fsmount", "mount new filesystem instances"),
        _deny("fspick", "reconfigure existing mounts"),
        _deny("mount_setattr", "change mount flags such as read-only"),
        _deny("name_to_handle_at", "file handles can escape the mount view"),
        _deny("open_by_handle_at", "opens files outside the mount view by handle"),
    )


def _namespace_rules() -> tuple[SyscallRule, ...]:
    """Other namespaces, and new user namespaces."""
    eperm = _errno.EPERM
    return (
        # Namespaces: a fresh user namespace grants capabilities that unlock
        # far more kernel code; setns would join namespaces outside the box.
        _deny("setns", "join another namespace"),
        SyscallRule(
            "clone",
            eperm,
            (ArgCond(0, "bits_set", _CLONE_NEWUSER),),
            "create a user namespace",
        ),
        SyscallRule(
            "unshare",
            eperm,
            (ArgCond(0, "bits_set", _CLONE_NEWUSER),),
            "create a user namespace",
        ),
        # clone3 passes flags in a struct seccomp cannot read; ENOSYS makes
        # glibc and other runtimes fall back to clone(), which we can filter.
        _deny("clone3", "flags unreadable by seccomp; callers fall back to clone", _errno.ENOSYS),
    )


def _clock_rules() -> tuple[SyscallRule, ...]:
    """The host's clocks, and personality flags that weaken mitigations.

    settimeofday and clock_settime are denied outright.  clock_adjtime is denied
    only for clocks other than CLOCK_REALTIME, because glibc implements
    adjtimex()/ntp_gettime() as clock_adjtime(CLOCK_REALTIME) for plain reads;
    changing the realtime clock still needs CAP_SYS_TIME, while dynamic (PTP)
    clocks are gated only by file permissions.  adjtimex itself is allowed for
    the same reason: it is realtime-only and cap-checked."""
    eperm = _errno.EPERM
    return (
        _deny("settimeofday", "set the host clock"),
        _deny("clock_settime", "set the host clock or a PTP clock"),
        SyscallRule(
            "clock_adjtime",
            eperm,
            (ArgCond(0, "ne", _CLOCK_REALTIME),),
            "adjust non-realtime (e.g. PTP) clocks; realtime reads stay allowed",
        ),
        SyscallRule(
            "personality",
            eperm,
            (ArgCond(0, "not_in", values=_SAFE_PERSONALITIES),),
            "personality flags like ADDR_NO_RANDOMIZE weaken exploit mitigations",
        ),
    )


def _socket_rules() -> tuple[SyscallRule, ...]:
    """Socket families."""
    return (
        # Networking: only local and IP sockets; netlink, packet, etc. expose
        # host network configuration and large, bug-prone protocol code.
        SyscallRule(
            "socket",
            _errno.EAFNOSUPPORT,
            (ArgCond(0, "not_in", values=(_AF_UNIX, _AF_INET, _AF_INET6)),),
            "only AF_UNIX, AF_INET and AF_INET6 sockets",
        ),
        SyscallRule(
            "socketpair",
            _errno.EAFNOSUPPORT,
            (ArgCond(0, "ne", _AF_UNIX),),
            "only AF_UNIX socket pairs",
        ),
    )


def _terminal_rules() -> tuple[SyscallRule, ...]:
    """Terminal injection."""
    eperm = _errno.EPERM
    return (
        # Terminal injection: push keystrokes into a tty shared with the host.
        SyscallRule(
            "ioctl",
            eperm,
            (ArgCond(1, "eq", _TIOCSTI),),
            "TIOCSTI injects input into the controlling terminal",
        ),
        SyscallRule(
            "ioctl",
            eperm,
            (ArgCond(1, "eq", _TIOCLINUX),),
            "TIOCLINUX can inject input via the console selection buffer",
        ),
    )
