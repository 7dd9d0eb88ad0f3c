"""What every benchmark hands to ``python -m bench``: rows of medians.

A benchmark module exposes ``rows(quick: bool) -> list[Row]``.  Each row is one
median from one interleaved run; ``base`` names the row (same ``bench``) it is
compared with, measured side by side in that same run, so the ratio holds up
even when the machine's speed drifts between runs.  A row that could not be
measured has ``value`` None and says why in ``note``.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Row:
    bench: str  # the comparison this row belongs to, e.g. "run latency"
    variant: str  # what was measured, e.g. "corral run -q -- true (namespace)"
    value: float | None  # the median; None when it could not be measured
    unit: str  # "ms", "req/s", "MB/s", ...
    base: str = ""  # the variant in the same bench this one is compared with
    note: str = ""  # why value is None, or a short remark
    lower_is_better: bool = True


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def ratio(row: Row, rows: list[Row]) -> str:
    if not row.base or row.value is None:
        return ""
    base = next((r for r in rows if r.bench == row.bench and r.variant == row.base), None)
    if base is None or base.value is None or base.value == 0:
        return ""
    return f"{row.value / base.value:.2f}x"


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit in ("ms", "µs", "s") and value < 10:
        return f"{value:.2f} {unit}"
    if value >= 1000:
        return f"{value:,.0f} {unit}"
    return f"{value:.1f} {unit}"


def table(rows: list[Row]) -> list[str]:
    lines = [
        "| benchmark | variant | median | ratio | relative to | note |",
        "|---|---|---:|---:|---|---|",
    ]
    for row in rows:
        r = ratio(row, rows)
        note = row.note.replace("|", "\\|").replace("\n", " ")
        lines.append(
            f"| {row.bench} | {row.variant} | {fmt(row.value, row.unit)} | {r} "
            f"| {row.base if r else ''} | {note} |"
        )
    return lines


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown cpu"


def machine_line() -> str:
    cpu = cpu_model()
    try:
        distro = platform.freedesktop_os_release().get("PRETTY_NAME", "?")
    except OSError:
        distro = "?"
    return (
        f"machine: {cpu} · {len(os.sched_getaffinity(0))} cores · "
        f"kernel {os.uname().release} · {distro} · Python {platform.python_version()} · "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )


def available_tiers(corral: str) -> list[str]:
    """Tiers ``corral doctor --json`` reports as available here, ``none`` left out."""
    import json

    out = subprocess.run([corral, "doctor", "--json"], capture_output=True, text=True, check=False)
    try:
        tiers = json.loads(out.stdout)["tiers"]
    except (ValueError, KeyError):
        return []
    return [t["name"] for t in tiers if t.get("available") and t["name"] != "none"]


def write_result(path: Path, text: str) -> None:
    """A results file replaced whole (written beside, then renamed): an
    interrupted run never leaves half a table."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(".md.tmp")
    part.write_text(text, encoding="utf-8")
    os.replace(part, path)
