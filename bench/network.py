"""What a network costs a run: ``corral run`` with and without one, and the first GET.

Run from the repository root::

    python -m bench.network [--quick]

Rows, all in one interleaved run (the order alternates each round, after
unrecorded warm-up rounds), against an HTTP origin on 127.0.0.1 in this
process (the same kind of origin ``bench.peers`` uses):

- ``corral run -q -- true``: no network (the baseline);
- ``corral run -q --allow 127.0.0.1:PORT -- true``: a network the command does
  not use (goal: at most 1.2 times the baseline);
- ``corral run -q --allow 127.0.0.1:PORT -- sh -c 'curl ...; curl ...'``: the
  whole command, and each GET's ``time_total`` as curl reports it: the first
  through the new door (goal: at most 2 ms), then a second one, a new
  connection to a proxy that has served once;
- the same first GET at the service's own address (``--noproxy '*'``: the
  listener corral made in the sandbox for the allowed host service);
- the same two GETs straight to the origin, no sandbox and no proxy: what
  curl and the origin take by themselves, so that what corral adds to the
  first GET reads off beside it.  The origin answers from the request line
  alone (``bench.peers.Origin``; until 2026-12-07 it was ``http.server``,
  which took about 0.5 ms more a GET here, in every row alike).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from bench.common import Row

BENCH = "network"
GOAL_RATIO = 1.2
GOAL_FIRST_GET_MS = 2.0
OFFLINE = "corral run -q -- true"
ALLOW = "corral run -q --allow 127.0.0.1:PORT -- true"
CURL = "corral run -q --allow 127.0.0.1:PORT -- two curl GETs via the proxy (whole command)"
OWN = "corral run -q --allow 127.0.0.1:PORT -- curl of the service at its own address"
FIRST = "first GET through a new door (curl time_total)"
SECOND = "second GET, a new connection, same run (curl time_total)"
OWN_FIRST = "first GET at the service's own address (curl time_total)"
DIRECT = "first GET straight to the origin, no sandbox or proxy (curl time_total)"
DIRECT_RUN = "two curl GETs straight to the origin (whole command, not reported)"
TIME_TOTAL = '-o /dev/null -w "%{time_total}\\n" --max-time 10'


def variants(corral: str, port: int) -> dict[str, list[str]]:
    url = f"http://127.0.0.1:{port}/bench"
    allow = ["--allow", f"127.0.0.1:{port}"]
    via_proxy = f'curl -sS --noproxy "" -x "$HTTP_PROXY" {TIME_TOTAL} {url}'
    own = f"curl -sS --noproxy '*' {TIME_TOTAL} {url}"
    direct = f"curl -sS --noproxy '*' {TIME_TOTAL} {url}"
    return {
        DIRECT_RUN: ["sh", "-c", f"{direct}; {direct}"],
        OFFLINE: [corral, "run", "-q", "--", "true"],
        ALLOW: [corral, "run", "-q", *allow, "--", "true"],
        CURL: [corral, "run", "-q", *allow, "--", "sh", "-c", f"{via_proxy}; {via_proxy}"],
        OWN: [corral, "run", "-q", *allow, "--", "sh", "-c", own],
    }


def measure(quick: bool) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Interleaved samples (ms) per row, and why a row failed (if one did)."""
    from bench.peers import Origin
    from bench.run_latency import bench_env, default_corral

    rounds, warmup = (15, 3) if quick else (60, 5)
    samples: dict[str, list[float]] = {}
    failures: dict[str, str] = {}
    base = tempfile.mkdtemp(prefix="corral-bench-net-")
    origin = Origin()
    try:
        workspace, state, pycache = (os.path.join(base, d) for d in ("ws", "state", "pycache"))
        for d in (workspace, state, pycache):
            os.mkdir(d)
        env = bench_env(state, pycache)
        runs = variants(os.path.abspath(default_corral()), origin.port)
        names = list(runs)
        for k in range(warmup + rounds):
            for name in names if k % 2 else reversed(names):
                started = time.perf_counter()
                out = subprocess.run(
                    runs[name], cwd=workspace, env=env, capture_output=True, text=True, check=False
                )
                took = (time.perf_counter() - started) * 1000
                if out.returncode != 0:
                    failures.setdefault(name, f"exit {out.returncode}: {out.stderr.strip()[-200:]}")
                    continue
                if k < warmup:
                    continue
                samples.setdefault(name, []).append(took)
                totals = [float(x) * 1000 for x in out.stdout.split()]
                if name == CURL and len(totals) == 2:
                    samples.setdefault(FIRST, []).append(totals[0])
                    samples.setdefault(SECOND, []).append(totals[1])
                elif name == OWN and len(totals) == 1:
                    samples.setdefault(OWN_FIRST, []).append(totals[0])
                elif name == DIRECT_RUN and len(totals) == 2:
                    samples.setdefault(DIRECT, []).append(totals[0])
    finally:
        origin.close()
        shutil.rmtree(base, ignore_errors=True)
    return samples, failures


def rows(quick: bool) -> list[Row]:
    from bench.common import Row, median

    samples, failures = measure(quick)

    def row(name: str, base: str = "", goal: str = "") -> Row:
        values = samples.get(name, [])
        note = f"{len(values)} runs" if values else failures.get(name, "no sample")
        if goal and values:
            note += f"; goal {goal}"
        return Row(BENCH, name, median(values), "ms", base, note)

    return [
        row(OFFLINE),
        row(ALLOW, OFFLINE, f"≤ {GOAL_RATIO}x"),
        row(CURL, OFFLINE),
        row(FIRST, goal=f"≤ {GOAL_FIRST_GET_MS:g} ms"),
        row(SECOND),
        row(OWN, OFFLINE),
        row(OWN_FIRST),
        row(DIRECT),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.network", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args(argv)
    from bench.common import machine_line, table

    found = rows(args.quick)
    print(machine_line())
    print()
    print("\n".join(table(found)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
