"""The first corral process inside a container (after the engine's init).

Runs inside (``python -I -S boot.py ENV_FILE REPORT_FILE KEEP CHECKS -- COMMAND...``),
standard library only.  It gives the command its environment from ENV_FILE
(``NAME=VALUE`` entries each ended by a NUL, bound in read-only), so no value
ever appears in an argv or in the engine's record of the container
(``inspect``), then runs it and waits.
When the command ends it writes which cgroup limits were hit (read from the
container's own cgroup files) to REPORT_FILE, for corral to report, and exits
as the command did.  The report is advisory: the command could write it too.
REPORT_FILE ``-`` means no report (gVisor shows no cgroup files inside).
KEEP names the descriptors above 2 the user asked to pass (``40,41``), or ``-``:
every other descriptor is closed before the command starts.
CHECKS (or ``-``) names the mounts whose source lies in a writable path, one a line
(``TYPE DEV INO MTIME CTIME DEST``, ``-`` for a field not compared): each must be
a mount point at DEST holding the file corral found there, or nothing runs.  The
engine resolves a bind's source on the host and its target inside, following
symlinks on both sides, some time after corral looked: another run in the same
workspace could swap a protected directory for a symlink in between and have a
host path (say /etc/shadow's directory) bound in.
"""

import os
import signal
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return ""


def _counter(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def limits_hit(base: str = "/sys/fs/cgroup") -> list[str]:
    hit = []
    v2_mem = _read(f"{base}/memory.events")
    v1_fail = _read(f"{base}/memory/memory.failcnt").strip()
    if (
        _counter(v2_mem, "oom_kill")
        or _counter(v2_mem, "max")
        or _counter(_read(f"{base}/memory/memory.oom_control"), "oom_kill")
        or (v1_fail.isdigit() and int(v1_fail) > 0)
    ):
        hit.append("memory")
    if _counter(_read(f"{base}/pids.events"), "max") or _counter(
        _read(f"{base}/pids/pids.events"), "max"
    ):
        hit.append("pids")
    return hit


def _one_line(kind: type[BaseException], value: BaseException, _tb: object) -> None:
    """An unexpected error here reaches the command's stderr as one line, no traceback."""
    sys.stderr.write(f"corral boot: internal error: {kind.__name__}: {value}\n")


def cannot_run(name: str, exc: OSError, path: str) -> str:
    """corral's line for a command that could not start (as corral.failures.cannot_run;
    this file runs inside the sandbox and imports nothing of corral)."""
    if not isinstance(exc, FileNotFoundError):
        return f"corral: cannot run {name}: {exc.strerror}\n"
    if "/" not in name:
        return f"corral: {name}: command not found in the sandbox (PATH={path})\n"
    if os.path.exists(name):
        return f"corral: {name}: the interpreter its #! line names is not in the sandbox\n"
    return f"corral: {name}: no such file in the sandbox\n"


def close_others(keep: set[int]) -> None:
    """Close every descriptor above 2 not in ``keep`` (the engine's fillers below a
    passed one, anything its init left open)."""
    try:
        found = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        found = list(range(3, 65536))
    for fd in found:
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _unescape(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mount_points(mountinfo: str = "/proc/self/mountinfo") -> set[str]:
    return {
        _unescape(line.split()[4]) for line in _read(mountinfo).splitlines() if line.count(" ") >= 4
    }


def _identity(st: os.stat_result) -> list[str]:
    fmt = st.st_mode & 0o170000
    return [str(v) for v in (fmt, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)]


def changed_mounts(checks: str, points: set[str]) -> list[str]:
    """The CHECKS entries that are not mounted at their target, or not the file
    corral found there (an unreadable CHECKS file counts as all of them changed)."""
    changed = []
    text = _read(checks)
    if not text:
        return [checks]
    for line in text.splitlines():
        fields = line.split(" ", 5)
        if len(fields) != 6:
            return [checks]
        dest = fields[5]
        try:
            found = _identity(os.lstat(dest))
        except OSError:
            changed.append(dest)
            continue
        same = all(want in ("-", got) for want, got in zip(fields[:5], found, strict=True))
        if dest not in points or not same:
            changed.append(dest)
    return changed


def main(argv: list[str]) -> None:
    sys.excepthook = _one_line
    env_file, report, keep, checks = argv[0], argv[1], argv[2], argv[3]
    sep, command = argv[4], argv[5:]
    if sep != "--" or not command:
        sys.stderr.write("corral boot: usage: boot.py ENV REPORT KEEP CHECKS -- COMMAND...\n")
        os._exit(125)
    close_others({int(n) for n in keep.split(",") if n.isdigit()})
    changed = [] if checks == "-" else changed_mounts(checks, mount_points())
    if changed:
        sys.stderr.write(
            f"corral: {changed[0]} changed while the container was set up (another run "
            "in this workspace may be swapping it for a link); nothing was run\n"
        )
        os._exit(125)
    with open(env_file, "rb") as raw:
        entries = [e.decode("utf-8", "surrogateescape") for e in raw.read().split(b"\0") if e]
    env = dict(e.split("=", 1) for e in entries if "=" in e)
    pid = os.fork()
    if pid == 0:
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        try:  # at the memory limit, the OOM killer takes the command before this reporter
            with open("/proc/self/oom_score_adj", "w") as adj:
                adj.write("1000")
        except OSError:
            pass
        try:
            os.execvpe(command[0], command, env)
        except OSError as exc:
            sys.stderr.write(cannot_run(command[0], exc, env.get("PATH", "")))
            os._exit(127 if isinstance(exc, FileNotFoundError) else 126)

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(pid, signum)
        except OSError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    # Reap every child, not only ours: when the engine's init is not used
    # (gVisor), this is the container's pid 1 and orphans are reparented here.
    while True:
        try:
            done, status = os.wait()
        except InterruptedError:
            continue
        except ChildProcessError:
            status = 0
            break
        if done == pid:
            break
    hit = limits_hit()
    if hit and report != "-":
        try:
            with open(report, "w", encoding="utf-8") as fh:
                fh.write("\n".join(hit) + "\n")
        except OSError:
            pass
    if os.WIFSIGNALED(status):  # die the same way, so the exit code says 128+N
        signum = os.WTERMSIG(status)
        if signum not in (signal.SIGKILL, signal.SIGSTOP):  # those cannot be handled anyway
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main(sys.argv[1:])
