"""The agent runtime's cost per tool call, model time excluded.

Run from the repository root::

    python -m bench.runtime_overhead [--calls 1000]

A scripted brain answers every turn at once with one ``run_command("true")``
call; the time from its reply leaving the brain to the tool's result coming
back to it (the next turn) is what the runtime adds to a model's latency: the
argument check, the call in the long-lived sandbox, the activity log's two
lines, the history.  Next to it, in the same interleaved run, a bare
``AsyncSandbox.exec("true")`` on a sandbox of its own: the difference is the
runtime's own share.  Goal: p50 ≤ 3 ms per tool call.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

from corral.brain import Brain, Reply, ToolCall

TYPE_CHECKING = False
if TYPE_CHECKING:
    from bench.common import Row

GOAL_MS = 3.0
JSON = dict[str, object]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class TimingBrain(Brain):
    """Asks for ``true`` ``calls`` times, then finishes; keeps each round trip."""

    def __init__(self, calls: int) -> None:
        self.left = calls
        self.sent = 0.0
        self.gaps: list[float] = []  # ms from a reply to the next turn

    async def turn(self, messages: list[JSON], tools: list[JSON]) -> Reply:
        now = time.perf_counter()
        if self.sent:
            self.gaps.append((now - self.sent) * 1000)
        if self.left == 0:
            self.sent = 0.0
            return Reply("done")
        self.left -= 1
        reply = Reply(None, [ToolCall(f"c{self.left}", "run_command", '{"command": "true"}')])
        self.sent = time.perf_counter()
        return reply


async def measure(calls: int, rounds: int = 10) -> tuple[list[float], list[float]]:
    """Per-tool-call round trips through the runtime, and bare execs, interleaved
    in ``rounds`` blocks."""
    from corral import policy as pol
    from corral.runtime import Event, Runtime
    from corral.sandbox import AsyncSandbox

    through: list[float] = []
    bare: list[float] = []
    with tempfile.TemporaryDirectory(prefix="corral-rt-") as base:
        ws = os.path.join(base, "ws")
        os.mkdir(ws)
        policy = pol.load(ws)
        per = max(1, calls // rounds)
        brain = TimingBrain(0)
        rt = Runtime(brain, policy, directory=os.path.join(base, "agent"), max_turns=per + 1)
        async with rt, AsyncSandbox(pol.load(ws), log=False) as sb:
            for _ in range(20):  # warm up both paths
                await sb.exec("true")
            brain.left = 20
            await rt.fire(Event("task", "warm up"))
            for _ in range(rounds):
                brain.left, brain.gaps = per, []
                answer = await rt.fire(Event("task", "run true"))
                assert answer.finish == "stop", answer
                through += brain.gaps
                for _ in range(per):
                    t = time.perf_counter()
                    r = await sb.exec("true")
                    bare.append((time.perf_counter() - t) * 1000)
                    assert r.exit_code == 0
    return through, bare


def rows(quick: bool) -> list[Row]:
    from bench.common import Row

    try:
        through, bare = asyncio.run(measure(200 if quick else 1000))
    except Exception as exc:  # the sandbox could not start here: say why in the row
        return [Row("runtime", "tool call through the runtime", None, "ms", note=str(exc))]
    base = 'bare AsyncSandbox.exec("true")'
    note = f"{len(through)} calls, p99 {percentile(through, 0.99):.2f} ms; goal p50 ≤ {GOAL_MS} ms"
    return [
        Row("runtime", base, percentile(bare, 0.5), "ms", note=f"{len(bare)} calls"),
        Row("runtime", 'tool call run_command("true") through the runtime',
            percentile(through, 0.5), "ms", base,
            note),
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    through, bare = asyncio.run(measure(args.calls))
    t50, t99 = percentile(through, 0.5), percentile(through, 0.99)
    b50, b99 = percentile(bare, 0.5), percentile(bare, 0.99)
    print(
        f"machine: {os.uname().sysname} {os.uname().release} · nproc {os.cpu_count()} · "
        f"Python {sys.version.split()[0]}"
    )
    print()
    print("| variant | calls | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|")
    variant = 'tool call `run_command("true")` through the runtime'
    print(f"| {variant} | {len(through)} | {t50:.2f} | {t99:.2f} |")
    print(f'| bare `AsyncSandbox.exec("true")` | {len(bare)} | {b50:.2f} | {b99:.2f} |')
    print()
    print(
        f"the runtime's own share at p50: {t50 - b50:.2f} ms; "
        f"goal p50 ≤ {GOAL_MS} ms per tool call: {'MET' if t50 <= GOAL_MS else 'NOT MET'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
