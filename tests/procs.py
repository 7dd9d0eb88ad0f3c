"""Looking at processes from a test."""

from __future__ import annotations


def alive(pid: int) -> bool:
    """Running (a zombie has let go of its sockets and files already)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
