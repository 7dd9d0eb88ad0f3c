"""The activity log: one JSON line per run under the XDG state directory.

Writing is on the hot path, so the encoder here is a small one of our own
(``json`` pulls in ``re``); reading (``corral log``) uses the standard module.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence


def state_dir() -> str:
    """corral's state directory: ``$XDG_STATE_HOME/corral``, normalized, or under
    ``~/.local/state`` when that is unset or relative (the XDG rule: a relative
    one is ignored; landlock's split went on forever on one)."""
    base = os.environ.get("XDG_STATE_HOME") or ""
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(os.path.normpath(base), "corral")


def cache_dir() -> str:
    """corral's cache (the microVM's kernels, images and saved states live in its
    ``vm``): here, beside the state directory, so a plan's masks find it without
    importing the microVM package."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "corral")


def default_path() -> str:
    return os.path.join(state_dir(), "runs.jsonl")


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def _string(text: str) -> str:
    out = text.replace("\\", "\\\\").replace('"', '\\"')
    if out.isascii() and out.isprintable():  # the common case, checked in C
        return f'"{out}"'
    if not out.isprintable():
        # as \uXXXX: every character a terminal or viewer acts on (controls, C1's CSI,
        # a right-to-left override, a line separator), and lone surrogates; this is
        # written to a terminal too (--report json: found by attacking corral)
        out = "".join(c if c.isprintable() else _u_escape(ord(c)) for c in out)
    return f'"{out}"'


def _u_escape(code: int) -> str:
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # (JSON spells one beyond the BMP as its UTF-16 pair)
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def dumps(value: object) -> str:
    """JSON for str, int, float, bool, None, list/tuple and dict with str keys."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else "null"
    if isinstance(value, list | tuple):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_string(str(k))}:{dumps(v)}" for k, v in value.items()) + "}"
    return _string(str(value))


def digest(value: object) -> str:
    """sha256 of the canonical JSON of ``value`` (the policy), short form."""
    try:  # the builtin module is much cheaper to import than hashlib
        from _sha256 import sha256  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        from hashlib import sha256
    return str(sha256(dumps(value).encode()).hexdigest()[:16])


_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


# log path -> the real path of its directory when the run began (keep_out): a run
# that can rename directories (landlock) swapped one above a log for a symlink,
# and the record went where that led
_pinned: dict[str, str] = {}


def open_log(path: str) -> int:
    """A log file opened to append, made (with its directory) if missing.  Never
    through a symlink, and only a plain file of one link: a run that left one of
    those where a log was had corral append its records to a file outside (a
    shell's rc file, where a record's argv ran).  OSError says which."""
    pinned = _pinned.get(os.path.abspath(path))
    if pinned is not None and os.path.realpath(os.path.dirname(os.path.abspath(path))) != pinned:
        raise OSError(f"a directory on the way to {path} changed during the run: not written")
    try:
        fd = os.open(path, _APPEND, 0o600)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        fd = os.open(path, _APPEND, 0o600)
    st = os.fstat(fd)
    if not (st.st_mode & 0o170000 == 0o100000 and st.st_nlink == 1):  # (stat.S_ISREG)
        os.close(fd)
        raise OSError(f"{path} is not a plain file of one link: not written")
    return fd


def write_whole(path: str, data: bytes) -> None:
    """A file the caller named (``--report FILE``) replaced by ``data``, on a log's
    terms (:func:`open_log`): never through a symlink, never a FIFO or a device,
    only a plain file of one link, not in a directory changed during the run."""
    fd = open_log(path)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, data)  # (appended: at the start of the emptied file)
    finally:
        os.close(fd)


def link_in(directory: str, places: list[str]) -> bool:
    """Whether a directory on the way to ``directory`` (itself included) is a symlink
    that lies in one of ``places`` (real paths ending in "/"): the sandbox's to
    make; an operator's link above them (/home -> /data/home) is not."""
    while directory not in ("/", ""):
        parent = os.path.dirname(directory)
        holder = os.path.realpath(parent).rstrip("/") + "/"
        if os.path.islink(directory) and any(holder.startswith(p) for p in places):
            return True
        directory = parent
    return False


def keep_out(read_deny: list[str], *paths: object, writable: Sequence[str] = ()) -> None:
    """Logs the caller named (--log, --net-log, Sandbox(log=...)): made now and
    added to ``read_deny`` (the policy's), so that the sandbox can neither plant a
    link there nor write records of its own into one inside its workspace.
    OSError from open_log for one that cannot be a log, and for one reached
    through a symlink inside a ``writable`` place (an earlier run may have left
    it: on landlock one swapped a log's directory, and the next run wrote there)."""
    places = [os.path.realpath(w).rstrip("/") + "/" for w in writable]
    for path in paths:
        if isinstance(path, str) and path:
            full = os.path.abspath(path)
            if link_in(os.path.dirname(full), places):
                raise OSError(f"{full}: a directory on its way is a symlink in a writable place")
            os.close(open_log(full))
            _pinned[full] = os.path.realpath(os.path.dirname(full))
            if full not in read_deny:
                read_deny.append(full)


def append(record: dict[str, object], path: str | None = None) -> None:
    target = path or default_path()
    line = (dumps(record) + "\n").encode("utf-8", "backslashreplace")
    fd = open_log(target)
    try:
        os.write(fd, line)  # one write with O_APPEND: concurrent runs do not interleave
    finally:
        os.close(fd)


def read(path: str | None = None) -> Iterator[dict[str, object]]:
    import json

    try:
        with open(path or default_path(), encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict):
                    yield record
    except FileNotFoundError:
        return


def tail(path: str, count: int, block: int = 1 << 16) -> list[dict[str, object]]:
    """The last ``count`` records of the log at ``path``, read from its end a
    block at a time: a big log (an agent's, after days) is not read whole."""
    import json

    data, end = b"", 0
    try:
        with open(path, "rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            while end > 0 and data.count(b"\n") <= count:
                start = max(0, end - block)
                fh.seek(start)
                data = fh.read(end - start) + data
                end = start
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    if end > 0:
        lines = lines[1:]  # the first may be the end of a line before
    records: list[dict[str, object]] = []
    for line in lines:
        try:
            record = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records[-count:]
