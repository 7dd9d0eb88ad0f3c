"""Every benchmark corral has, in one run and one table.

Run from the repository root::

    python -m bench [--quick] [--with-peers] [--only NAME,...] [--against REV]

Benchmarks (each a module in bench/ with ``rows(quick)``; see bench/common.py):
``run_latency`` (``corral run -- true`` on every tier ``corral doctor`` reports
available, next to sh and raw bwrap), ``network`` (a run with a network next
to one without, and the first GET through a new door), ``warm_exec``
(``Sandbox.exec`` against a
fresh ``corral run``), ``runtime`` (a tool call through corral's agent runtime,
model time excluded, next to a bare ``AsyncSandbox.exec``), ``proxy`` (corral's
proxy next to squid and a direct connection, and the door's added latency),
``tls`` (TLS inspection next to squid with ssl-bump and mitmdump, and the
plain proxy next to ``main``), ``container_exec`` (when
bench/container_exec.py exists in this checkout), ``microvm`` (bench/vm_boot.py:
``corral run --tier microvm -- true`` next to raw QEMU booting the same kernel
and initramfs, warm ``Sandbox.exec`` in a VM, an idle VM's QEMU RSS), ``batch``
(bench/batch.py: ``corral batch`` of 1,000 ``true`` jobs next to ``xargs -P``, and
``corral batch --ray`` on a local 3-node Ray cluster next to plain Ray tasks) and
``peers`` (srt and codex sandbox; installed and measured only with
``--with-peers``).  ``--against REV`` adds ``against`` (bench/against.py): this
checkout's ``corral run -- true`` (as root and, when the user exists, as
``corral-test``) and warm ``Sandbox.exec`` next to the same from a git revision, interleaved.

Each comparison is measured side by side in one interleaved run, so machine
noise lands on both sides of a ratio.  The table of medians and ratios is
printed and written to bench/results/latest.md with a machine line on top.
``--quick`` takes a few minutes; the full run about 15.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import Row, machine_line, table, write_result

RESULTS = Path(__file__).resolve().parent / "results" / "latest.md"
NAMES = (
    "run_latency",
    "network",
    "warm_exec",
    "runtime",
    "proxy",
    "tls",
    "container_exec",
    "microvm",
    "batch",
    "peers",
)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def container_exec(quick: bool) -> tuple[list[Row], str]:
    """bench/container_exec.py, written on another branch: rows() if it has one, else its main()."""
    try:
        module = importlib.import_module("bench.container_exec")
    except ImportError:
        note = "bench/container_exec.py is not in this checkout (container tier not merged)"
        return [Row("container exec", "corral container tier", None, "ms", note=note)], ""
    rows_fn: Callable[[bool], list[Row]] | None = getattr(module, "rows", None)
    if rows_fn is not None:
        return rows_fn(quick), ""
    # Only a main(): run it as its own process and keep its report verbatim.
    out = subprocess.run(
        [sys.executable, "-m", "bench.container_exec"],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
        cwd=Path(__file__).resolve().parent.parent,
    )
    lines = (out.stdout or out.stderr).strip()
    status = "its own report below" if out.returncode == 0 else f"exit {out.returncode}"
    row = Row("container exec", "python -m bench.container_exec", None, "ms", note=status)
    return [row], f"## container exec (`python -m bench.container_exec`)\n\n{lines}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer rounds: a few minutes")
    parser.add_argument(
        "--with-peers",
        action="store_true",
        help="install srt and codex (npm, into ~/.cache/corral-bench/peers) and measure them",
    )
    parser.add_argument("--only", default="", help=f"comma-separated subset of {', '.join(NAMES)}")
    parser.add_argument(
        "--against", default="", help="also compare with this git revision (bench/against.py)"
    )
    args = parser.parse_args(argv)
    chosen = [n.strip() for n in args.only.split(",") if n.strip()] or list(NAMES)
    if args.against and "against" not in chosen:
        chosen.append("against")
    unknown = [n for n in chosen if n not in (*NAMES, "against")]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)} (known: {', '.join(NAMES)})")
    started = time.monotonic()
    rows: list[Row] = []
    extra: list[str] = []
    for name in chosen:
        _log(f"bench: {name} ...")
        t0 = time.monotonic()
        if name == "run_latency":
            from bench import run_latency

            rows += run_latency.rows(args.quick)
        elif name == "network":
            from bench import network

            rows += network.rows(args.quick)
        elif name == "warm_exec":
            from bench import warm_exec

            rows += warm_exec.rows(args.quick)
        elif name == "runtime":
            from bench import runtime_overhead

            rows += runtime_overhead.rows(args.quick)
        elif name == "proxy":
            from bench import proxy_throughput

            rows += proxy_throughput.rows(args.quick)
        elif name == "tls":
            from bench import tls_throughput

            rows += tls_throughput.rows(args.quick)
        elif name == "microvm":
            from bench import vm_boot

            rows += vm_boot.rows(args.quick)
        elif name == "batch":
            from bench import batch

            rows += batch.rows(args.quick)
        elif name == "against":
            from bench import against

            if not args.against:
                parser.error("--only against needs --against REV")
            rows += against.rows(args.quick, args.against)
        elif name == "container_exec":
            found, report = container_exec(args.quick)
            rows += found
            extra += [report] if report else []
        else:
            from bench import peers

            found, report = peers.rows(args.quick, with_peers=args.with_peers)
            rows += found
            extra += [f"## Peers\n\n{report}"] if report else []
        _log(f"bench: {name} took {time.monotonic() - t0:.0f} s")
    mode = "quick" if args.quick else "full"
    text = "\n".join(
        [
            "# corral benchmarks",
            "",
            machine_line(),
            "",
            f"`python -m bench{' --quick' if args.quick else ''}"
            f"{' --with-peers' if args.with_peers else ''}"
            f"{' --against ' + args.against if args.against else ''}` ({mode} mode, "
            f"{time.monotonic() - started:.0f} s). Medians; each ratio is against the row "
            "named in *relative to*, measured in the same interleaved run "
            "(ms: lower is better; req/s, tunnels/s, MB/s: higher is better).",
            "",
            *table(rows),
            "",
            *extra,
        ]
    )
    text = text.rstrip("\n") + "\n"
    print(text, end="")
    write_result(RESULTS, text)
    _log(f"(written to {RESULTS})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
