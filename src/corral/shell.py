"""``corral shell``: an interactive shell in a sandbox, on a terminal of its own.

corral allocates a pseudo-terminal, hands its slave side to the sandbox and
relays between it and the caller's terminal (put in raw mode), passing window
size changes through.  The sandbox's shell gets the pty as its controlling
terminal, so job control works; the caller's own terminal is never inside, so TIOCSTI-style
injection into it is impossible.

Where no pty of corral's can be the shell's terminal (a microVM's guest has its
own kernel; a container's engine client stands between), the sandbox makes one
(``LaunchStrategy.own_terminal``): the command is :data:`TTY_RELAY`, and corral
sends it its input framed on a pipe, with the window size (:func:`_run_relayed`).
"""

from __future__ import annotations

import os
import select
import signal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from corral.report import Denial
    from corral.tiers.base import Plan

# Runs inside: a session of its own (bwrap's --new-session made its parent the
# leader), then the pty as controlling terminal, then the shell.
CTTY_SHIM = (
    "import fcntl, os, sys, termios\n"
    "try:\n"
    "    os.setsid()\n"
    "    fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
    "    os.execvp(sys.argv[1], sys.argv[1:])\n"
    "except FileNotFoundError:\n"
    "    name, path = sys.argv[1], os.environ.get('PATH', '')\n"
    "    why = f'command not found in the sandbox (PATH={path})'\n"
    "    if '/' in name:\n"
    "        why = 'no such file in the sandbox'\n"
    "    sys.stderr.write(f'corral: {name}: {why}\\n')\n"
    "    os._exit(127)\n"
    "except OSError as exc:\n"
    "    sys.stderr.write(f'corral: cannot run {sys.argv[1]}: {exc.strerror}\\n')\n"
    "    os._exit(126)\n"
)


# For a sandbox that makes the shell's terminal itself (own_terminal: a microVM's
# guest, whose streams are virtio ports; a container behind its engine's pipes).
# Inside: a pty, the shell on it as above, and this relay between the pty and the
# streams.  What comes in is framed (by _Relay, below): b"d" + length + bytes for
# the terminal, b"w" + length + a struct winsize for a size (the first frame,
# awaited before the shell starts, then each change).  The exit code is the
# shell's (128+N for a signal).  (Its own copy of the framing and of CTTY_SHIM's
# words: it runs inside, where corral is not importable.)
TTY_RELAY = r"""
import fcntl, os, select, signal, struct, sys, termios, time

# the end of corral's input: ^D now and again while the shell lives, every other
# one after a ^U (see corral.shell's EOT_AGAIN)
EOT_AGAIN = 0.5

def out(fd, data):
    while data:
        data = data[os.write(fd, data):]

def eot(fd, n):
    try:  # (never waiting: a terminal whose input is full takes none)
        if select.select([], [fd], [], 0)[1]:
            os.write(fd, b"\x15\x04" if n and n % 2 == 0 else b"\x04")
    except OSError:  # nobody holds the terminal any more
        pass

def feed(buf):
    # the complete frames in buf, applied; what is left of a frame still coming
    while len(buf) >= 5 and len(buf) >= 5 + int.from_bytes(buf[1:5], "big"):
        end = 5 + int.from_bytes(buf[1:5], "big")
        if buf[:1] == b"d":
            out(master, buf[5:end])
        elif buf[:1] == b"w":
            fcntl.ioctl(master, termios.TIOCSWINSZ, buf[5:end])
        buf = buf[end:]
    return buf

master, slave = os.openpty()
fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
buf = b""
while len(buf) < 5 or len(buf) < 5 + int.from_bytes(buf[1:5], "big"):
    if not select.select([0], [], [], 5)[0]:
        break  # no size: 24x80
    chunk = os.read(0, 65536)
    if not chunk:
        break
    buf += chunk
buf = feed(buf)  # the size (before the shell can ask), and what was typed ahead
# the shell's end wakes the loop: not every kernel ends a read of the pty then
# (gVisor's does not; Linux's says EIO once no process holds the terminal)
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.signal(signal.SIGCHLD, lambda *_: None)
signal.set_wakeup_fd(wake_w)
pid = os.fork()
if pid == 0:
    try:
        os.close(master)
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
        for fd in (0, 1, 2):
            os.dup2(slave, fd)
        os.close(slave)
        os.execvp(sys.argv[1], sys.argv[1:])
    except FileNotFoundError:
        name, path = sys.argv[1], os.environ.get("PATH", "")
        why = f"command not found in the sandbox (PATH={path})"
        if "/" in name:
            why = "no such file in the sandbox"
        out(2, f"corral: {name}: {why}\n".encode())
        os._exit(127)
    except OSError as exc:
        out(2, f"corral: cannot run {sys.argv[1]}: {exc.strerror}\n".encode())
        os._exit(126)
    os._exit(126)
os.close(slave)
reading, status, eot_at, eots = True, None, None, 0
while status is None:
    wait = None if eot_at is None else max(0.0, eot_at - time.monotonic())
    ready = select.select([master, wake_r] + [0] * reading, [], [], wait)[0]
    if eot_at is not None and time.monotonic() >= eot_at:
        eot(master, eots)
        eot_at, eots = time.monotonic() + EOT_AGAIN, eots + 1
    if wake_r in ready:
        os.read(wake_r, 512)
        done, got = os.waitpid(pid, os.WNOHANG)
        status = got if done else None
    if master in ready:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: no process holds the terminal any more
            data = b""
        out(1, data)
        if not data and status is None:
            status = os.waitpid(pid, 0)[1]
    if reading and 0 in ready:
        chunk = os.read(0, 65536)
        buf = feed(buf + chunk)
        if not chunk:  # corral's input ended: end of file for the shell, as ^Ds
            reading = False
            eot_at = time.monotonic()
os.set_blocking(master, False)
try:  # what the shell wrote last
    while data := os.read(master, 65536):
        out(1, data)
except OSError:
    pass
code = os.waitstatus_to_exitcode(status)
sys.exit(128 - code if code < 0 else code)
"""


def frame(kind: bytes, body: bytes) -> bytes:
    """One frame of TTY_RELAY's input: b"d" (terminal bytes) or b"w" (a winsize)."""
    return kind + len(body).to_bytes(4, "big") + body


def command(shell: list[str], python: list[str] | None = None) -> list[str]:
    """``python``: how the tier starts a Python inside (Tier.python_argv())."""
    if python is None:
        from corral.tiers.namespace import inside_python

        python = [inside_python()]
    return [*python, "-I", "-S", "-c", CTTY_SHIM, *shell]


def relayed(shell: list[str], python: list[str]) -> list[str]:
    """The command of a shell behind TTY_RELAY (a sandbox with its own kernel)."""
    return [*python, "-I", "-S", "-c", TTY_RELAY, *shell]


def copy_winsize(src: int, dst: int) -> None:
    import fcntl
    import termios

    try:
        size = fcntl.ioctl(src, termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(dst, termios.TIOCSWINSZ, size)
    except OSError:
        pass


# When our input ends, the shell's does: a ^D (end of file at a line's start) at
# once and again every EOT_AGAIN seconds while the shell lives.  One that arrives
# while no line editor reads (bash starting, a command running: the terminal in
# canonical mode then) is read later as a NUL, not as an end, and a line editor
# may put that in its line (busybox's does), where a ^D is no end: every other
# ^D from the third on comes after a ^U, which empties the line (not each: on an
# empty line, readline answers a ^U with a bell).  (TTY_RELAY has its own copy.)
EOT_AGAIN = 0.5


def run(plan: Plan, run_id: str) -> tuple[int, list[Denial], int | None]:
    """Run ``plan`` on a new pty wired to our stdin/stdout; returns the exit code,
    what the run's end found (quarantined and restored paths, refused writes) and
    the signal corral received and acted on, or None.

    As for ``corral run``, a signal of FORWARDED_SIGNALS to corral (SIGTERM;
    SIGHUP: its terminal was closed; SIGINT) kills the sandbox; the exit code is
    then 128+N.  When our input ends, the shell's does: it ends as with its input
    from a file (see EOT_AGAIN)."""
    signals = _Signals()
    try:
        if plan.strategy.own_terminal:
            code, found = _run_relayed(plan, run_id, signals)
        else:
            code, found = _run_pty(plan, run_id, signals)
    finally:
        signals.close()
    if signals.received:
        return 128 + signals.received[0], found, signals.received[0]
    return code, found, None


class _Typed:
    """Our input, to the shell's terminal (``master``); once it ends, the shell's
    end of input as ^Ds, one at once and again every EOT_AGAIN seconds."""

    def __init__(self, master: int, interactive: bool) -> None:
        self.master, self.interactive = master, interactive
        self.open = True
        self.last = b"\n"  # the last byte typed: a line's end, so far
        self.eot_at: float | None = None  # once our input has ended: the next ^D's time
        self.eots = 0

    def due(self) -> float | None:
        """Seconds until the next ^D is due (None: our input goes on)."""
        import time

        return None if self.eot_at is None else max(0.0, self.eot_at - time.monotonic())

    def tick(self) -> None:
        """The ^D that is due, if one is."""
        import time

        if self.eot_at is not None and time.monotonic() >= self.eot_at:
            _eot(self.master, self.eots)
            self.eot_at, self.eots = time.monotonic() + EOT_AGAIN, self.eots + 1

    def read(self) -> None:
        """What our input has (stdin readable) into the shell's terminal."""
        import time

        try:
            data = os.read(0, 65536)
        except OSError:  # EIO: our terminal hung up (its SIGHUP follows)
            data = b""
        if data:
            os.write(self.master, data)
            self.last = data[-1:]
            return
        self.open = False  # the end of our input: the shell's, as ^Ds
        if not self.interactive and self.last not in (b"\n", b"\r"):
            os.write(self.master, b"\n")  # a file's last line, unended, runs
        self.eot_at = time.monotonic()


def _run_pty(plan: Plan, run_id: str, signals: _Signals) -> tuple[int, list[Denial]]:
    """``run`` on a pty of ours, the slave side the sandbox's terminal."""
    from corral import launch

    master, slave = os.openpty()
    interactive = os.isatty(0)
    if interactive:
        copy_winsize(0, master)
    try:
        started = launch.start(plan, run_id, {0: slave, 1: slave, 2: slave})
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    saved = _raw_stdin()
    previous = signal.signal(signal.SIGWINCH, lambda *_: copy_winsize(0, master))
    text = ""
    code: int | None = None
    # a plan with a "status" pipe (bwrap) reports the exit code there; one without
    # is watched through a pidfd of the launched process
    ended = started.status_r if started.status_r >= 0 else os.pidfd_open(started.pid)
    held = _Held()
    typed = _Typed(master, interactive)
    try:
        while not signals.received:
            wait, due = held.wait(), typed.due()
            if due is not None:
                wait = due if wait is None else min(wait, due)
            watch = [master, ended, signals.wake_r] + ([0] if typed.open else [])
            ready = select.select(watch, [], [], wait)[0]
            if signals.received:
                break
            if held.wait() == 0.0:
                held.release()  # held for PATIENCE: not bwrap's
            typed.tick()
            if signals.wake_r in ready:
                os.read(signals.wake_r, 512)
            if ended in ready and ended != started.status_r:
                held.release()
                _drain(master)
                code = os.waitstatus_to_exitcode(os.waitpid(started.pid, 0)[1])
                code = 128 - code if code < 0 else code
                break
            if ended in ready:
                chunk = os.read(started.status_r, 65536)
                text += chunk.decode("utf-8", "replace")
                if '"exit-code"' in text:
                    held.release()  # the command ran: what it printed is its own
                if not chunk or '"exit-code"' in text:
                    held.take(_drain(master, held.holding))
                    break
            if master in ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every slave fd is closed, the shell is gone
                    data = b""
                if data:
                    held.take(data)
            if typed.open and 0 in ready:
                typed.read()
    finally:
        signal.signal(signal.SIGWINCH, previous)
        _restore(saved)
        os.close(master)
        if ended != started.status_r:
            os.close(ended)
        found = started.stop()
    if signals.received:  # the sandbox was killed: its end tells nothing more
        held.data = b""
        return 125, found
    if code is None:
        from corral.launch import _status_value

        code = _status_value(text, "exit-code")
    if code is None and held.data:
        held.refuse(plan.tier)  # the sandbox was never set up: bwrap said why
    held.release()
    return 125 if code is None else plan.strategy.exit_code(plan, code), found


def _run_relayed(plan: Plan, run_id: str, signals: _Signals) -> tuple[int, list[Denial]]:
    """``run`` for a sandbox that makes its own terminal (TTY_RELAY inside): our
    input goes in framed on a pipe, our window size first and again at each
    SIGWINCH; its terminal's output comes back on another."""
    from corral import launch

    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    try:
        # the shell's stderr is its terminal's (on out_w); what reaches stderr here is
        # the launcher's own (the engine's, the guest runner's): ours, as for corral run
        started = launch.start(plan, run_id, {0: in_r, 1: out_w, 2: 2})
    except BaseException:
        for fd in (in_w, out_r):
            os.close(fd)
        raise
    finally:
        os.close(in_r)
        os.close(out_w)
    saved = _raw_stdin()
    ended = started.status_r if started.status_r >= 0 else os.pidfd_open(started.pid)
    relay = _Relay(in_w, out_r, ended, signals=signals)
    previous = signal.signal(signal.SIGWINCH, lambda *_: relay.resized.append(True))
    code = 125
    try:
        relay.run()
        if not signals.received:
            code = os.waitstatus_to_exitcode(os.waitpid(started.pid, 0)[1])
            code = 128 - code if code < 0 else code
    finally:
        signal.signal(signal.SIGWINCH, previous)
        _restore(saved)
        relay.close()
        if ended != started.status_r:
            os.close(ended)
        found = started.stop()
    return plan.strategy.exit_code(plan, code), found


class _Signals:
    """corral's FORWARDED_SIGNALS while a shell runs, noted in ``received`` for
    the loop, which then ends and the sandbox is killed; any signal with a
    handler of ours (SIGWINCH too) wakes the loop through ``wake_r``.  With
    ``install`` False, only the wake pipe (a relay run by a test)."""

    def __init__(self, install: bool = True) -> None:
        self.received: list[int] = []
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.previous: dict[int, Any] = {}
        self.installed = install
        if install:
            from corral.launch import FORWARDED_SIGNALS

            self.old_wakeup = signal.set_wakeup_fd(self.wake_w)
            self.previous = {sig: signal.signal(sig, self._note) for sig in FORWARDED_SIGNALS}

    def _note(self, signum: int, _frame: object) -> None:
        self.received.append(signum)

    def close(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        if self.installed:
            signal.set_wakeup_fd(self.old_wakeup)
        os.close(self.wake_r)
        os.close(self.wake_w)


def _eot(master: int, n: int) -> None:
    """The ``n``-th end of input (from 0) to the shell's terminal: ^D, ^D, ^U ^D,
    ^D, ^U ^D...; nothing if its input is full (never waiting)."""
    try:
        if select.select([], [master], [], 0)[1]:
            os.write(master, b"\x15\x04" if n and n % 2 == 0 else b"\x04")
    except OSError:  # nobody holds the terminal any more
        pass


def _restore(saved: list[Any] | None) -> None:
    """Our terminal as it was (its settings from _raw_stdin), if it is still there."""
    import termios

    if saved is not None:
        try:
            termios.tcsetattr(0, termios.TCSADRAIN, saved)
        except termios.error:  # hung up (SIGHUP): nothing left to restore
            pass


def _raw_stdin() -> list[Any] | None:
    """Our terminal made raw (the sandbox's terminal echoes and edits: ours passes
    keys); its settings to restore, or None when stdin is no terminal.  TCSANOW,
    not tty's TCSAFLUSH: what was typed while the sandbox started is kept."""
    import termios
    import tty

    if not os.isatty(0):
        return None
    saved: list[Any] = termios.tcgetattr(0)
    tty.setraw(0, termios.TCSANOW)
    return saved


class _Relay:
    """Our side of TTY_RELAY: stdin framed into the sandbox, a size at each
    resize (a signal wakes the loop through ``wake_r``), its output to our stdout,
    until ``ended`` (the launched process's pidfd or status pipe) is readable,
    or a signal of FORWARDED_SIGNALS was received (``signals``)."""

    def __init__(
        self,
        in_w: int,
        out_r: int,
        ended: int,
        src: int = 0,
        dst: int = 1,
        signals: _Signals | None = None,
    ) -> None:
        self.in_w, self.out_r, self.ended = in_w, out_r, ended
        self.src, self.dst = src, dst  # our terminal (or whatever stdin and stdout are)
        self.own_signals = signals is None  # a wake pipe of its own, closed with it
        self.signals = _Signals(install=False) if signals is None else signals
        self.wake_r, self.wake_w = self.signals.wake_r, self.signals.wake_w
        self.resized: list[bool] = [True]  # the size goes first

    def run(self) -> None:
        reading, output, last = True, True, b"\n"
        while not self.signals.received:
            if self.resized and self.in_w >= 0:
                self.resized.clear()
                _send(self.in_w, frame(b"w", _size(self.src)))
            watch = [self.ended, self.wake_r] + [self.out_r] * output + [self.src] * reading
            ready = select.select(watch, [], [])[0]
            if self.signals.received:
                return  # (the sandbox is killed: what it still says is left unread)
            if self.wake_r in ready:
                os.read(self.wake_r, 512)
            if self.out_r in ready:
                data = os.read(self.out_r, 65536)
                output = bool(data)
                _send(self.dst, data)
            if reading and self.src in ready:
                try:
                    data = os.read(self.src, 65536)
                except OSError:  # EIO: a terminal whose other side is gone
                    data = b""
                reading = bool(data)
                if data:
                    _send(self.in_w, frame(b"d", data))
                    last = data[-1:]
                else:  # the end of our input: the sandbox's, and the relay gives ^Ds
                    if last not in (b"\n", b"\r") and not os.isatty(self.src):
                        _send(self.in_w, frame(b"d", b"\n"))  # a file's last line runs
                    os.close(self.in_w)
                    self.in_w = -1
            if self.ended in ready:
                self._drain()
                return

    def _drain(self) -> None:
        os.set_blocking(self.out_r, False)
        try:
            while data := os.read(self.out_r, 65536):
                _send(self.dst, data)
        except OSError:
            pass

    def close(self) -> None:
        for fd in (self.in_w, self.out_r):
            if fd >= 0:
                os.close(fd)
        if self.own_signals:
            self.signals.close()


def _size(fd: int) -> bytes:
    """``fd``'s window size (a struct winsize), or 24x80 when it is no terminal."""
    import fcntl
    import struct
    import termios

    try:
        return fcntl.ioctl(fd, termios.TIOCGWINSZ, bytes(8))
    except OSError:
        return struct.pack("HHHH", 24, 80, 0, 0)


def _send(fd: int, data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError:  # the sandbox is gone: its end is what the loop waits for
        pass


class _Held:
    """The pty's first output, held back while it may be bubblewrap's own error
    (``bwrap: ...``, written to the pty before the shell existed): if the run then
    ends without the command's exit code, it becomes one corral line (and a run
    planned again when a host path changed during setup) instead of bwrap's
    words on the user's terminal.  Anything else, or a second of waiting,
    releases it."""

    PREFIX = b"bwrap: "
    PATIENCE = 1.0  # seconds output that looks like bwrap's is held, at most

    def __init__(self) -> None:
        self.data = b""
        self.holding = True
        self.since = 0.0

    def take(self, data: bytes) -> None:
        if not self.holding:
            _out(data)
            return
        import time

        self.since = self.since or time.monotonic()
        self.data += data
        if not self.data.startswith(self.PREFIX[: len(self.data)]):
            self.release()

    def wait(self) -> float | None:
        """How long select may wait before the held output is released."""
        if not (self.holding and self.data):
            return None
        import time

        return max(0.0, self.since + self.PATIENCE - time.monotonic())

    def release(self) -> None:
        self.holding = False
        if self.data:
            _out(self.data)
            self.data = b""

    def refuse(self, tier: str) -> None:
        from corral.errors import SetupError, SetupRaced
        from corral.failures import raced, setup_failure

        text = self.data.decode("utf-8", "replace").replace("\r", "")
        tool = [line for line in text.splitlines() if line.startswith("bwrap: ")]
        if not tool:
            return
        self.data = b""
        error = setup_failure(tier, tool)
        raise SetupRaced(error) if raced(tool) else SetupError(error)


def _drain(master: int, keep: bool = False) -> bytes:
    """What is left to read on the pty: written out, or returned with ``keep``."""
    os.set_blocking(master, False)
    kept = b""
    try:
        while data := os.read(master, 65536):
            if keep:
                kept += data
            else:
                _out(data)
    except OSError:
        pass
    return kept


def _out(data: bytes) -> None:
    """To our stdout, all of it; nothing once our terminal has hung up (EIO: its
    SIGHUP ends the shell)."""
    import errno

    view = memoryview(data)
    try:
        while view:
            view = view[os.write(1, view) :]
    except OSError as exc:
        if exc.errno != errno.EIO:
            raise
