"""The agent's memory index: ``DIR/memory/MEMORY.md`` and two topic folders,
``agent/`` (what the agent learnt) and ``user/`` (what it was told about its
person).

The index is a Markdown file a person may edit: a title line, a short
description and a ``## Memories`` list, one line per memory file::

    - [Deploys need a tag](agent/deploys.md) — push a v* tag, never to main

:meth:`Memory.put` adds or updates one entry, changing only that line (or
adding one at the end of the list): every other line, hand-written ones
included, stays as it was.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

INDEX = "MEMORY.md"
TOPICS = ("agent", "user")
HEADING = "## Memories"
TEMPLATE = f"""# Agent memory

What this agent keeps between runs: one line per memory file, in agent/ (what it
learnt) and user/ (what it was told about its person). Edit freely: entries the
agent adds or updates change only their own line.

{HEADING}

"""


@dataclass(frozen=True)
class Entry:
    file: str  # relative to the memory directory: agent/x.md or user/x.md
    title: str
    hook: str  # one line: when this memory matters

    def line(self) -> str:
        return f"- [{self.title}]({self.file}) — {self.hook}"


class Memory:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.index = self.dir / INDEX

    def ensure(self) -> bool:
        """Create the folders and the index if missing; True if the index was made now."""
        for topic in TOPICS:
            (self.dir / topic).mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(self.index, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(TEMPLATE)
        return True

    def text(self) -> str:
        return self.index.read_text(encoding="utf-8")

    def entries(self) -> list[Entry]:
        found = []
        for line in self._section(self.text().splitlines())[1]:
            entry = parse_line(line)
            if entry is not None:
                found.append(entry)
        return found

    def put(self, file: str, title: str, hook: str, text: str | None = None) -> None:
        """Add the entry for ``file`` or update its line; with ``text``, write the
        memory file too.  ValueError for a file outside agent/ and user/, or a
        title or hook that is not one line."""
        entry = Entry(check_file(file), one_line(title, "title"), one_line(hook, "hook"))
        if text is not None:
            _write(self.dir / entry.file, text)
        lines = self.text().splitlines()
        start, section = self._section(lines)
        for n, line in enumerate(section, start):
            old = parse_line(line)
            if old is not None and old.file == entry.file:
                lines[n] = entry.line()
                break
        else:
            if start < 0:  # the heading was removed by hand: a new list at the end
                lines += ["", HEADING]
                start, section = len(lines), []
            items = [n for n, line in enumerate(section, start) if parse_line(line) is not None]
            lines.insert(
                items[-1] + 1 if items else _list_start(lines, start, section), entry.line()
            )
        _write(self.index, "\n".join(lines) + "\n")

    def read(self, file: str | None = None) -> str:
        """The index, or one memory file of it."""
        if file is None:
            return self.text()
        return (self.dir / check_file(file)).read_text(encoding="utf-8")

    @staticmethod
    def _section(lines: list[str]) -> tuple[int, list[str]]:
        """Where the Memories list's lines begin (-1: no heading), and those lines
        (up to the next heading)."""
        try:
            head = next(n for n, line in enumerate(lines) if line.strip() == HEADING)
        except StopIteration:
            return -1, []
        end = next((n for n in range(head + 1, len(lines)) if lines[n].startswith("#")), len(lines))
        return head + 1, lines[head + 1 : end]


def parse_line(line: str) -> Entry | None:
    """``- [title](file) — hook`` as an Entry; None for any other line."""
    if not line.startswith("- ["):
        return None
    close = line.find("](")
    end = line.find(")", close + 2)
    if close < 0 or end < 0:
        return None
    rest = line[end + 1 :].strip()
    hook = rest[1:].strip() if rest[:1] in ("—", "-", ":") else rest
    return Entry(line[close + 2 : end], line[3:close], hook)


def check_file(file: str) -> str:
    parts = Path(file).parts
    if (
        len(parts) < 2
        or parts[0] not in TOPICS
        or ".." in parts
        or Path(file).is_absolute()
        or not file.endswith(".md")
    ):
        raise ValueError(f"a memory file is agent/NAME.md or user/NAME.md, not {file!r}")
    return str(Path(*parts))


def one_line(text: str, what: str) -> str:
    text = text.strip()
    if not text or "\n" in text or "\r" in text:
        raise ValueError(f"a memory's {what} is one line of text")
    return text


def _list_start(lines: list[str], start: int, section: list[str]) -> int:
    """Where a first entry goes: after the section's hand-written lines, or after
    the blank line below the heading; a blank line is added where one is needed."""
    filled = [n for n, line in enumerate(section, start) if line.strip()]
    if filled:
        at = filled[-1] + 1
        lines.insert(at, "")
        return at + 1
    if not section:
        lines.insert(start, "")
    return start + 1


def _write(path: Path, text: str) -> None:
    """Whole or not at all: a temporary file beside it, renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
