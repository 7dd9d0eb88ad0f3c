"""The security conformance matrix: every attack case against every tier, as a table.

Run from the repository root::

    python -m bench.conformance [--junit FILE] [-- extra pytest args]

It runs ``pytest tests/conformance`` with a JUnit XML report (or reads one you
already have with ``--junit``) and prints cases by (tier, user) with PASS, FAIL,
N.A. (a skip: the case does not apply, with the reason) and GAP (a strict xfail:
a known limitation, with the reason).  Tiers this machine cannot run appear as
columns of N.A. with the tier's own reason.  The table is also written to
``bench/results/conformance.md``.  Exit status: pytest's, so a FAIL is visible.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import machine_line, write_result

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "conformance.md"
GROUPS = {
    "test_filesystem": "filesystem escapes",
    "test_secrets": "secret reads",
    "test_privilege": "privilege",
    "test_network": "network",
    "test_resources": "resources",
    "test_leaks": "information leaks",
}
USERS = ("root", "user")


@dataclass
class Outcome:
    state: str  # PASS, FAIL, N.A., GAP
    reason: str = ""
    seconds: float = 0.0


@dataclass
class Matrix:
    # (group, case) -> (tier, who) -> outcome
    cells: dict[tuple[str, str], dict[tuple[str, str], Outcome]] = field(default_factory=dict)
    tiers: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # per tier, summed test time


def case_of(classname: str, name: str) -> tuple[str, str, str, str] | None:
    """(group, case, who, tier) from a JUnit test case, or None for other tests.

    Test ids are ``test_x[WHO-TIER]`` or ``test_x[WHO-TIER-PARAM]``: the user
    and tier fixtures come first (tests/conformance/conftest.py).
    """
    module = classname.rsplit(".", 1)[-1]
    if module not in GROUPS or "[" not in name:
        return None
    func, _, ids = name.partition("[")
    parts = ids.rstrip("]").split("-", 2)
    if len(parts) < 2 or parts[0] not in USERS:
        return None
    case = func.removeprefix("test_")
    if len(parts) == 3:
        case = f"{case}[{parts[2]}]"
    return GROUPS[module], case, parts[0], parts[1]


def outcome_of(tc: ET.Element) -> Outcome:
    seconds = float(tc.get("time", "0") or 0)
    for child in tc:
        message = (child.get("message") or "").strip().splitlines()
        first = message[0] if message else ""
        if child.tag in ("failure", "error"):
            return Outcome("FAIL", first[:160], seconds)
        if child.tag == "skipped":
            if child.get("type") == "pytest.xfail":
                return Outcome("GAP", first.removeprefix("reason: ")[:500], seconds)
            text = first.removeprefix("N.A.: ")
            return Outcome("N.A.", text[:300], seconds)
    return Outcome("PASS", "", seconds)


def parse(junit: Path) -> Matrix:
    matrix = Matrix()
    for tc in ET.parse(junit).getroot().iter("testcase"):
        found = case_of(tc.get("classname", ""), tc.get("name", ""))
        if found is None:
            continue
        group, case, who, tier = found
        outcome = outcome_of(tc)
        matrix.cells.setdefault((group, case), {})[(tier, who)] = outcome
        if tier not in matrix.tiers:
            matrix.tiers.append(tier)
        matrix.seconds[tier] = matrix.seconds.get(tier, 0.0) + outcome.seconds
    return matrix


def absent_tiers() -> dict[str, str]:
    """Tier cases this machine cannot run, with each tier's reason (tests/tiers.py)."""
    sys.path.insert(0, str(ROOT))
    try:
        from tests.tiers import absent

        return absent()
    except Exception as exc:  # an import problem must not hide the matrix itself
        return {"?": f"cannot ask the tiers: {exc}"}
    finally:
        sys.path.pop(0)


SYMBOL = {"PASS": "PASS", "FAIL": "**FAIL**", "N.A.": "N.A.", "GAP": "GAP"}


def render(matrix: Matrix, absent: dict[str, str], took: float) -> str:
    columns = [(t, w) for t in matrix.tiers for w in USERS]
    head = ["group", "case", *[f"{t} ({w})" for t, w in columns], *absent]
    lines = [
        "# corral security conformance matrix",
        "",
        machine_line(),  # bench.common: the same line as the benchmarks
        "",
        f"`python -m pytest tests/conformance` ({took:.0f} s): each case is an attack "
        "decided by evidence gathered outside the sandbox, with an allow twin under the "
        "same policy. PASS: blocked, and the twin worked. FAIL: the attack got through "
        "or the twin failed. N.A.: the case does not apply (reason below). GAP: a "
        "known limitation, kept as a strict xfail (reason below).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    notes: dict[str, int] = {}

    def note(text: str) -> str:
        if text not in notes:
            notes[text] = len(notes) + 1
        return f"[{notes[text]}]"

    totals: dict[str, dict[str, int]] = {}
    for (group, case), row in sorted(
        matrix.cells.items(), key=lambda kv: (list(GROUPS.values()).index(kv[0][0]), kv[0][1])
    ):
        cells = []
        for col in columns:
            out = row.get(col)
            if out is None:
                cells.append("—")
                continue
            totals.setdefault(f"{col[0]} ({col[1]})", {}).setdefault(out.state, 0)
            totals[f"{col[0]} ({col[1]})"][out.state] += 1
            text = SYMBOL[out.state]
            if out.reason:
                text += " " + note(f"{out.state}: {out.reason}")
            cells.append(text)
        for tier, why in absent.items():
            cells.append("N.A. " + note(f"tier {tier} is not available here: {why}"))
        lines.append(f"| {group} | `{case}` | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"{len(matrix.cells)} cases. Per column:")
    lines.append("")
    for label, counts in totals.items():
        summary = ", ".join(f"{counts.get(s, 0)} {s}" for s in ("PASS", "FAIL", "N.A.", "GAP"))
        tier = label.split(" ", 1)[0]
        lines.append(f"- {label}: {summary} (tier total {matrix.seconds.get(tier, 0.0):.0f} s)")
    if notes:
        lines += ["", "Notes:", ""]
        lines += [f"{n}. {text}" for text, n in notes.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.conformance", description=__doc__)
    parser.add_argument("--junit", type=Path, help="render this JUnit XML instead of running")
    parser.add_argument("pytest_args", nargs="*", help="extra arguments for pytest (after --)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    code = 0
    with tempfile.TemporaryDirectory(prefix="corral-conformance-") as tmp:
        junit = args.junit
        if junit is None:
            junit = Path(tmp) / "junit.xml"
            cmd = [
                sys.executable,
                "-m",
                "pytest",
                "tests/conformance",
                "-q",
                "-p",
                "no:cacheprovider",
            ]
            proc = subprocess.run(
                [*cmd, f"--junitxml={junit}", "-o", "junit_family=xunit1", *args.pytest_args],
                cwd=ROOT,
                stdout=sys.stderr,  # pytest's progress goes to stderr; the table to stdout
                check=False,
            )
            code = proc.returncode
            if not junit.exists():
                print("conformance: pytest wrote no report", file=sys.stderr)
                return code or 1
        text = render(parse(junit), absent_tiers(), time.monotonic() - started)
    print(text, end="")
    write_result(RESULTS, text)
    print(f"(written to {RESULTS})", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
