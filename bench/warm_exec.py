"""Warm ``Sandbox.exec("true")`` against a fresh ``corral run -- true`` per call.

Run from the repository root::

    python -m bench.warm_exec [--calls 1000]

Both are measured in one interleaved loop (warm call, cold call, warm, ...), so
machine noise lands on both.  Prints p50 and p99 of each, their ratio, and the
goal check (warm p50 ≤ 3 ms).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from bench.common import Row

GOAL_MS = 3.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(calls: int, cold_every: int) -> tuple[list[float], list[float]]:
    """Warm and cold milliseconds from one interleaved loop."""
    from corral import policy as pol
    from corral.sandbox import Sandbox

    corral = os.path.join(os.path.dirname(sys.executable), "corral")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    warm: list[float] = []
    cold: list[float] = []
    with tempfile.TemporaryDirectory(prefix="corral-warm-") as ws:
        os.chdir(ws)
        with Sandbox(pol.load(ws)) as sb:
            for _ in range(20):  # warm up both paths
                sb.exec(["true"])
            subprocess.run([corral, "run", "-q", "--", "true"], env=env, check=True)
            for i in range(calls):
                t = time.perf_counter()
                result = sb.exec(["true"])
                warm.append((time.perf_counter() - t) * 1000)
                assert result.exit_code == 0
                if i % cold_every == 0:
                    t = time.perf_counter()
                    subprocess.run([corral, "run", "-q", "--", "true"], env=env, check=True)
                    cold.append((time.perf_counter() - t) * 1000)
    return warm, cold


def rows(quick: bool) -> list[Row]:
    """Warm ``Sandbox.exec`` against a fresh ``corral run``, from one interleaved loop."""
    from bench.common import Row

    old_cwd = os.getcwd()
    try:
        warm, cold = measure(200 if quick else 1000, 5)
    except Exception as exc:  # the sandbox could not start here: say why in the row
        return [Row("warm exec", "warm Sandbox.exec(['true'])", None, "ms", note=str(exc))]
    finally:
        os.chdir(old_cwd)
    fresh = "fresh corral run -q -- true"
    return [
        Row("warm exec", fresh, percentile(cold, 0.5), "ms", note=f"{len(cold)} calls"),
        Row("warm exec", "warm Sandbox.exec(['true'])", percentile(warm, 0.5), "ms", fresh,
            f"{len(warm)} calls, p99 {percentile(warm, 0.99):.2f} ms"),
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument(
        "--cold-every",
        type=int,
        default=5,
        help="one cold `corral run` per this many warm calls (default 5)",
    )
    args = parser.parse_args()
    warm, cold = measure(args.calls, args.cold_every)
    w50, w99 = percentile(warm, 0.5), percentile(warm, 0.99)
    c50, c99 = percentile(cold, 0.5), percentile(cold, 0.99)
    print(
        f"machine: {os.uname().sysname} {os.uname().release} · nproc {os.cpu_count()} · "
        f"Python {sys.version.split()[0]}"
    )
    print()
    print("| variant | calls | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|")
    print(f"| warm `Sandbox.exec(['true'])` | {len(warm)} | {w50:.2f} | {w99:.2f} |")
    print(f"| fresh `corral run -q -- true` | {len(cold)} | {c50:.2f} | {c99:.2f} |")
    print()
    print(
        f"warm is {c50 / w50:.1f}x faster at p50; "
        f"goal warm p50 ≤ {GOAL_MS} ms: {'MET' if w50 <= GOAL_MS else 'NOT MET'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
