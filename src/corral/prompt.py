"""``corral run``'s answerer: a one-line prompt on the terminal for each held request.

The proxy (a worker process that never touches the terminal) sends each ask
over a socket pair to the ``corral run`` process, which owns the terminal and
already waits on the sandbox's output in one poll loop (:func:`corral.launch.run`);
this class is driven from that loop.  While a prompt is up:

* the terminal is in cbreak mode (one key answers: ``y`` once, ``f`` for
  :data:`~corral.net.approvals.DEFAULT_GRANT`, ``n`` deny) and other keys are
  swallowed; its previous mode comes back as soon as the prompt ends.  When
  keys are already waiting (a line half typed for the command), the terminal
  is not taken at all: one line names the ``corral approve`` command instead;
* the sandbox's output to the terminal is held back (not lost) so that it
  cannot scribble over the prompt; output to files and pipes is not held.

The prompt starts on a line of its own and is replaced by a one-line result,
so a command's partial line is never erased.  A request answered elsewhere
(``corral approve``) or timed out withdraws its prompt.  Later asks queue.
"""

from __future__ import annotations

import json
import os
import select

from corral.net.asking import DEFAULT_GRANT, AskInfo, Decision, format_seconds

TYPE_CHECKING = False
if TYPE_CHECKING:
    import _socket as socket
    from typing import Any

KEYS = {b"y": "once", b"o": "once", b"f": "for", b"n": "deny", b"d": "deny"}


class TerminalPrompt:
    def __init__(
        self,
        channel: socket.socket,
        tty_in: int = 0,
        tty_out: int = 2,
        grant: float = DEFAULT_GRANT,
        interactive: bool = True,
    ) -> None:
        """``interactive`` False: no terminal to prompt on (stdin or stderr is not
        one); each held request is one line on ``tty_out`` naming the commands that
        answer it, so a run that waits says why and how to go on."""
        self.interactive = interactive
        self.channel = channel
        channel.setblocking(False)
        self.fd = channel.fileno()
        self.tty_in = tty_in
        self.tty_out = tty_out
        self.grant = grant
        self.queue: list[AskInfo] = []
        self.current: AskInfo | None = None
        self._partial = b""
        self._saved: list[Any] | None = None
        self._poller: select.poll | None = None
        self._held: list[tuple[int, bytes]] = []
        self._ttys: dict[int, bool] = {}

    def attach(self, poller: select.poll) -> None:
        self._poller = poller
        poller.register(self.fd, select.POLLIN)

    def fds(self) -> tuple[int, ...]:
        return (self.fd, self.tty_in) if self.current is not None else (self.fd,)

    # -- the sandbox's output while a prompt is up ------------------------------------------

    def holds(self, target: int) -> bool:
        """Should output to ``target`` wait (a prompt is up on the same terminal)?"""
        if self.current is None and not self._held:
            return False
        if target not in self._ttys:
            self._ttys[target] = os.isatty(target)
        return self._ttys[target]

    def hold(self, target: int, data: bytes) -> None:
        self._held.append((target, data))

    def _release(self) -> None:
        held, self._held = self._held, []
        for target, data in held:
            _write(target, data)

    # -- events -------------------------------------------------------------------------------

    def on_ready(self, fd: int) -> None:
        if fd == self.fd:
            self._read_channel()
        elif fd == self.tty_in and self.current is not None:
            self._read_key()

    def _read_channel(self) -> None:
        try:
            data = self.channel.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the proxy ended
            if self._poller is not None:
                self._poller.unregister(self.fd)
            self._end("the run's proxy ended")
            return
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            if message.get("op") == "ask":
                self.queue.append(AskInfo(message))
            elif message.get("op") == "gone":
                self._gone(str(message.get("id")))
        if self.current is None:
            self._next()

    def _gone(self, ask_id: str) -> None:
        self.queue = [a for a in self.queue if a.id != ask_id]
        if self.current is not None and self.current.id == ask_id:
            self._end("answered elsewhere, or no answer in time")

    def _read_key(self) -> None:
        try:
            data = os.read(self.tty_in, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the terminal went away: leave the answer to the timeout
            self._end("no terminal")
            return
        for i in range(len(data)):
            choice = KEYS.get(data[i : i + 1].lower())
            if choice is not None:
                self._answer(choice)
                return

    def _answer(self, choice: str) -> None:
        assert self.current is not None
        if choice == "once":
            decision, said = Decision.once(), "allowed once"
        elif choice == "for":
            decision = Decision(True, self.grant)
            said = f"allowed for {format_seconds(self.grant)} (this method and path)"
        else:
            decision, said = Decision.deny(), "denied"
        message = decision.message(self.current.id, "terminal")
        try:
            self.channel.setblocking(True)
            self.channel.sendall((json.dumps(message) + "\n").encode())
        except OSError:
            said = "not answered: the run's proxy ended"
        finally:
            self.channel.setblocking(False)
        self._end(said)

    # -- the prompt line ------------------------------------------------------------------------

    def _next(self) -> None:
        while self.queue:
            ask = self.queue.pop(0)
            if not self.interactive:
                _write(self.tty_out, _held_line(ask, "").encode("utf-8", "replace"))
                continue
            self._cbreak()
            if not self._typed_ahead():
                self.current = ask
                break
            # keys are waiting already (a line being typed, or lines the command
            # has not read yet): they are the command's, so the terminal is not
            # taken; the answer comes from another terminal
            self._restore()
            line = "\r\n" + _held_line(ask, "you are typing, so ").replace("\n", "\r\n")
            _write(self.tty_out, line.encode("utf-8", "replace"))
        if self.current is None:
            self._release()
            return
        if self._poller is not None:
            self._poller.register(self.tty_in, select.POLLIN)
        grant = format_seconds(self.grant)
        _write(
            self.tty_out,
            f"\r\ncorral: {_what(self.current)}: allow? "
            f"[y] once  [f] for {grant}  [n] deny ".encode("utf-8", "replace"),
        )

    def _end(self, said: str) -> None:
        if self.current is None:
            return
        what = _what(self.current)
        self.current = None
        if self._poller is not None:
            try:
                self._poller.unregister(self.tty_in)
            except KeyError:
                pass
        self._restore()
        _write(self.tty_out, f"\r\x1b[Kcorral: {what}: {said}\r\n".encode("utf-8", "replace"))
        self._next()

    def _cbreak(self) -> None:
        import termios

        try:
            saved = termios.tcgetattr(self.tty_in)
        except termios.error:
            return
        mode = list(saved)
        lflag = mode[3]
        assert isinstance(lflag, int)
        mode[3] = lflag & ~(termios.ICANON | termios.ECHO)
        cc = list(mode[6])
        cc[termios.VMIN], cc[termios.VTIME] = 1, 0
        mode[6] = cc
        try:
            termios.tcsetattr(self.tty_in, termios.TCSANOW, mode)
        except termios.error:
            return
        self._saved = saved

    def _typed_ahead(self) -> bool:
        """Does the terminal hold input nobody has read?  (Checked once out of
        canonical mode: in it, a line still being typed is not counted.)"""
        import fcntl
        import termios

        try:
            raw = fcntl.ioctl(self.tty_in, termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return False
        return int.from_bytes(raw, "little") > 0

    def _restore(self) -> None:
        if self._saved is None:
            return
        import termios

        try:
            termios.tcsetattr(self.tty_in, termios.TCSANOW, self._saved)
        except termios.error:
            pass
        self._saved = None

    def close(self) -> None:
        """The run ended: the terminal's mode back, held output out."""
        if self.current is not None:
            self.queue.clear()
            self._end("the run ended")
        self._restore()
        self._release()


def _held_line(ask: AskInfo, why: str) -> str:
    return (
        f"corral: {_what(ask)}: held; {why}answer with corral approve {ask.id} "
        f"(or corral deny {ask.id}; corral pending lists what waits)\n"
    )


def _what(ask: AskInfo) -> str:
    """The held request as the person deciding reads it: plain text only (the
    method and path are the sandbox's; a control in them could redraw the line)."""
    from corral.errors import plain
    from corral.net.asking import cut, served_as

    where = f"{ask.host}:{ask.port}{ask.target}"  # (as sent: its query too)
    also = f", also served as {served_as(ask.also)}" if ask.also else ""
    # a guardrail's reason names what a person decides on: its title, risk tier, version
    _, marked, guarded = str(ask.reason or "").partition("needs approval: ")
    rule = f"{ask.rule}: {cut(guarded, 120)}" if marked and guarded else ask.rule
    return plain(f"{ask.method} {cut(where, 200)} ({rule}{also})")


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [])
            continue
        except OSError:
            return
        view = view[n:]
