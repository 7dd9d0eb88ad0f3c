"""corral's own exit codes and the one exception type that carries them.

The command's exit code passes through unchanged and a signal becomes 128+N, so
corral's own codes sit where ordinary programs rarely land and never on 126/127
(the shell's "cannot execute" and "not found").
"""

from __future__ import annotations

EXIT_USAGE = 2  # bad flag, bad policy file (the issue fixes this one at 2)
EXIT_REFUSED = 122  # the tier, or a limit, cannot be enforced on this host
EXIT_INTERNAL = 123  # a bug in corral: please report it
EXIT_TIMEOUT = 124  # the wall-clock timeout fired (same code as coreutils timeout)
EXIT_SETUP = 125  # the sandbox could not be set up (same code as docker/podman)

EXIT_CODES: dict[int, str] = {
    EXIT_USAGE: "bad command line or bad policy file",
    EXIT_REFUSED: "refused: the tier or a requested limit is not available on this host",
    EXIT_INTERNAL: "internal error in corral",
    EXIT_TIMEOUT: "the command hit its wall-clock timeout and was killed with its whole tree",
    EXIT_SETUP: "the sandbox could not be set up",
}


class CorralError(Exception):
    """An error a person can act on: one line of text and an exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class PolicyError(CorralError):
    """A policy file or flag is wrong; the message names file, line and key."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


class RefusedError(CorralError):
    """The requested protection cannot be given here; never silently weakened."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_REFUSED)


class SetupError(CorralError):
    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_SETUP)


class SetupRaced(SetupError):
    """A host path changed between the plan and the sandbox's mounts (a unix
    socket another program removed, say).  The command never started, so the
    caller may plan again and retry."""


def plain(text: str) -> str:
    """Text the sandbox chose (a path, a name) as it may appear in one of corral's
    lines: every character a terminal could act on (escape sequences, line
    breaks, invisible format characters such as a right-to-left override) as a
    backslash escape, so a command can neither erase, recolour nor forge what
    corral says.  Everything else (non-ASCII letters included) as it is."""
    if text.isprintable():  # the common case, checked in C
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def visible(text: str) -> str:
    """:func:`plain` for a whole message, whose own line breaks stay."""
    if text.isprintable():
        return text
    return "\n".join(plain(line) for line in text.split("\n"))


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
