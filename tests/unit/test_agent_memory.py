"""The agent's memory index: made once, entries added and updated by the API
without touching the lines a person wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.memory import HEADING, TEMPLATE, Entry, Memory, parse_line


def test_made_once_with_its_folders(tmp_path: Path) -> None:
    mem = Memory(tmp_path / "memory")
    assert mem.ensure() is True
    assert (tmp_path / "memory" / "agent").is_dir() and (tmp_path / "memory" / "user").is_dir()
    text = mem.text()
    assert text == TEMPLATE and text.startswith("# Agent memory\n") and HEADING in text
    mem.index.write_text(text + "- a line of my own\n")
    assert mem.ensure() is False  # the second start leaves it alone
    assert mem.text().endswith("- a line of my own\n")
    assert mem.entries() == []


def test_add_and_update_keep_hand_edits(tmp_path: Path) -> None:
    mem = Memory(tmp_path)
    mem.ensure()
    mem.put("agent/deploys.md", "Deploys need a tag", "push a v* tag", text="details\n")
    assert (tmp_path / "agent" / "deploys.md").read_text() == "details\n"
    # a person edits: a note above the list, a hand-written entry, a section below
    text = (
        mem.text().replace(HEADING, "Kept by hand: read me first.\n\n" + HEADING)
        + "- [Lunch](user/lunch.md) — vegetarian\nfree text in the list\n\n## Notes\n\nmine\n"
    )
    mem.index.write_text(text)
    mem.put("agent/deploys.md", "Deploys need a signed tag", "git tag -s v*")
    mem.put("user/tz.md", "Time zone", "Europe/Paris")
    after = mem.text().splitlines()
    assert after == [
        *text.splitlines()[
            : text.splitlines().index("- [Deploys need a tag](agent/deploys.md) — push a v* tag")
        ],
        "- [Deploys need a signed tag](agent/deploys.md) — git tag -s v*",
        "- [Lunch](user/lunch.md) — vegetarian",
        "- [Time zone](user/tz.md) — Europe/Paris",
        "free text in the list",
        "",
        "## Notes",
        "",
        "mine",
    ]
    assert "Kept by hand: read me first." in after
    assert mem.entries() == [
        Entry("agent/deploys.md", "Deploys need a signed tag", "git tag -s v*"),
        Entry("user/lunch.md", "Lunch", "vegetarian"),
        Entry("user/tz.md", "Time zone", "Europe/Paris"),
    ]
    assert mem.read("agent/deploys.md") == "details\n"


def test_a_removed_heading_gets_a_new_list(tmp_path: Path) -> None:
    mem = Memory(tmp_path)
    mem.ensure()
    mem.index.write_text("# My notes\n\nnothing else\n")
    mem.put("user/a.md", "A", "b")
    assert mem.text() == f"# My notes\n\nnothing else\n\n{HEADING}\n\n- [A](user/a.md) — b\n"


@pytest.mark.parametrize(
    "file, title, hook",
    [
        ("notes.md", "t", "h"),
        ("agent/../../x.md", "t", "h"),
        ("/etc/agent/x.md", "t", "h"),
        ("agent/x.txt", "t", "h"),
        ("agent/x.md", "two\nlines", "h"),
        ("agent/x.md", "t", ""),
    ],
)
def test_bad_entries_are_refused(tmp_path: Path, file: str, title: str, hook: str) -> None:
    mem = Memory(tmp_path)
    mem.ensure()
    before = mem.text()
    with pytest.raises(ValueError, match="memory"):
        mem.put(file, title, hook)
    assert mem.text() == before


def test_parse_line() -> None:
    assert parse_line("- [T](agent/a.md) — hook") == Entry("agent/a.md", "T", "hook")
    assert parse_line("- [T](agent/a.md) - hook") == Entry("agent/a.md", "T", "hook")
    assert parse_line("- plain item") is None and parse_line("text") is None
