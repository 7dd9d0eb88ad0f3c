"""corral's words for what could not start: a command (127, 126) and a sandbox
bwrap could not set up (125).  Pure functions of the failure's text; a module
of its own so that a run that starts never loads it."""

from __future__ import annotations

import os


def cannot_run(
    name: str, enoent: bool, strerror: str, path: str, exists: bool | None, by_policy: bool = False
) -> str:
    """corral's one line for a command that could not be started (127 if ``enoent``,
    else 126).  ``exists``: whether a path-like ``name`` is there (None: unknown);
    ``by_policy``: the policy set PATH.  The sandbox-side helpers (relay, agent,
    container boot, shell) say the same."""
    if not enoent:
        return f"corral: cannot run {name}: {strerror}"
    if "/" not in name:
        whose = ", set by the policy" if by_policy else ""
        return f"corral: {name}: command not found in the sandbox (PATH={path}{whose})"
    if exists:
        return f"corral: {name}: the interpreter its #! line names is not in the sandbox"
    if exists is None:
        return f"corral: {name}: no such file in the sandbox (or its #! interpreter is missing)"
    return f"corral: {name}: no such file in the sandbox"


# bwrap's own words for a failed setup -> corral's (the first that matches wins)
_BWRAP_SAYS = (
    ("Can't chdir to ", "cannot enter the working directory {path} inside the sandbox: {why}"),
    # host paths that changed between the plan and bwrap's mounts (a socket that went)
    ("Can't find source path ", "{path} went away while the sandbox was set up ({why})"),
    ("Can't create file at ", "{path} changed while the sandbox was set up ({why})"),
    ("Can't mkdir parents for ", "{path} went away while the sandbox was set up ({why})"),
    ("Can't bind mount /oldroot/ on /newroot/", "a host mount changed during setup ({rest})"),
    ("Creating new namespace failed", "user namespaces are not available here ({rest}); "),
    ("No permissions to creat", "user namespaces are not available here ({rest}); "),
    ("setting up uid map", "user namespaces are not available here (uid map: {rest}); "),
)


# bwrap's words for a host path that changed under it: planning again fixes them
_RACES = (
    "Can't find source path ",
    "Can't create file at ",
    "Can't mkdir parents for ",
    "Can't bind mount /bindfile",  # a mask's empty file over a socket that went meanwhile
    # a host mount (a container's overlay being removed) went during the read-only
    # remount of everything under /: seen in CI beside podman's cleanup
    "Can't bind mount /oldroot/ on /newroot/: Unable to apply mount flags: remount",
)


def raced(lines: list[str]) -> bool:
    """Did bwrap fail because a host path changed while it set the sandbox up?"""
    return any(line.removeprefix("bwrap: ").startswith(_RACES) for line in lines)


def setup_failure(tier: str, lines: list[str]) -> str:
    """One corral line for bwrap's setup error lines (``bwrap: ...``)."""
    said = [line.removeprefix("bwrap: ") for line in lines]
    for line in said:
        for prefix, text in _BWRAP_SAYS:
            if line.startswith(prefix):
                rest = line[len(prefix) :].strip(": ")
                path, _, why = rest.rpartition(": ")
                message = text.format(rest=rest, path=path or rest, why=why)
                if message.endswith("; "):
                    message += "see corral doctor, or try --tier landlock"
                elif "changed" in text or "went away" in text:
                    message += "; run again"
                return f"the {tier} sandbox could not be set up: {message}"
    return f"the {tier} sandbox could not be set up: bwrap: {'; '.join(said) or 'no reason given'}"


def execvp_failure(line: str, path: str, by_policy: bool = False) -> tuple[str, int] | None:
    """bwrap's ``execvp NAME: REASON`` as corral's line and exit code, or None."""
    rest = line.removeprefix("bwrap: ").removeprefix("execvp ")
    name, sep, strerror = rest.rpartition(": ")
    if not line.startswith("bwrap: execvp ") or not sep:
        return None
    enoent = strerror == os.strerror(2)
    return cannot_run(name, enoent, strerror, path, None, by_policy), 127 if enoent else 126
