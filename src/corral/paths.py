"""Path tests shared across the planners (pure, no imports: on every run's path)."""

from __future__ import annotations


def inside(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or lies under it, by name (both normalized:
    ``/ws2`` is not inside ``/ws``)."""
    return path == root or path.startswith(root.rstrip("/") + "/")
