"""Many jobs of ``true``: ``corral batch`` against ``xargs -P``, and ``corral batch
--ray`` on a local 3-node Ray cluster against plain Ray tasks running ``true``
unsandboxed (goal: at most 1.3 times their wall time).

Run from the repository root::

    python -m bench.batch [--jobs 1000] [--no-ray]

Each pair is measured back to back in the same run (corral, then its baseline,
``--rounds`` times); the figure is the wall time of the whole batch, from the
command's start to its end (for Ray both sides join the cluster inside it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from bench.common import Row

ROOT = Path(__file__).resolve().parent.parent
GOAL = 1.3
CORRAL = [sys.executable, "-P", "-m", "corral"]
PLAIN_RAY = """
import subprocess, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
@ray.remote(num_cpus=1)
def job(i):
    return subprocess.run(["true"]).returncode
assert sum(ray.get([job.remote(i) for i in range(int(sys.argv[2]))])) == 0
"""


def _jobs_file(where: Path, count: int) -> Path:
    path = where / "jobs.jsonl"
    ws = where / "ws"
    ws.mkdir(exist_ok=True)
    with open(path, "w") as f:
        for i in range(count):
            f.write(json.dumps({"id": f"j{i}", "command": ["true"], "workspace": str(ws)}) + "\n")
    return path


def _timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    t = time.perf_counter()
    subprocess.run(
        argv, check=True, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=ROOT
    )
    return time.perf_counter() - t


def _corral_batch(where: Path, jobs: Path, *flags: str) -> float:
    out = where / "results.jsonl"
    out.unlink(missing_ok=True)  # a fresh batch each round, not a resume
    seconds = _timed(
        [
            *CORRAL,
            "batch",
            str(jobs),
            "--out",
            str(out),
            "--log",
            str(where / "runs.jsonl"),
            "--net-log",
            str(where / "net.jsonl"),
            *flags,
        ]
    )
    results = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(results) == len(jobs.read_text().splitlines())
    assert all(r["exit"] == 0 for r in results), [r for r in results if r["exit"] != 0][:1]
    return seconds


def local(count: int, rounds: int) -> tuple[list[float], list[float], list[float]]:
    cpus = str(os.cpu_count() or 1)
    ours, warm, xargs = [], [], []
    with tempfile.TemporaryDirectory(prefix="corral-bench-batch-", dir=str(Path.home())) as d:
        where = Path(d)
        jobs = _jobs_file(where, count)
        numbers = "\n".join(str(i) for i in range(count)) + "\n"
        (where / "numbers").write_text(numbers)
        for _ in range(rounds):
            ours.append(_corral_batch(where, jobs, "-j", cpus))
            warm.append(_corral_batch(where, jobs, "-j", cpus, "--reuse"))
            xargs.append(_timed(["sh", "-c", f"xargs -P {cpus} -n 1 true < {where}/numbers"]))
    return ours, warm, xargs


def ray(count: int, rounds: int) -> tuple[list[float], list[float], list[float]]:
    sys.path.insert(0, str(ROOT))
    from tests.raycluster import Cluster

    ours, warm, plain = [], [], []
    cluster = Cluster(workers=2, head_cpus=1, worker_cpus=1)  # 3 nodes, 1 CPU each
    try:
        with tempfile.TemporaryDirectory(prefix="corral-bench-ray-", dir=str(Path.home())) as d:
            where = Path(d)
            jobs = _jobs_file(where, count)
            for _ in range(rounds):
                ours.append(_corral_batch(where, jobs, "--ray", cluster.address))
                warm.append(_corral_batch(where, jobs, "--ray", cluster.address, "--reuse"))
                plain.append(
                    _timed(
                        [sys.executable, "-c", PLAIN_RAY, cluster.address, str(count)],
                        env=cluster.env,
                    )
                )
    finally:
        cluster.stop()
    return ours, warm, plain


def rows(quick: bool, count: int | None = None, with_ray: bool = True) -> list[Row]:
    from bench.common import Row, median

    count = count or (200 if quick else 1000)
    rounds = 1 if quick else 2
    out: list[Row] = []
    name = f"batch of {count} true (local)"
    ours, warm, xargs = local(count, rounds)
    cpus = os.cpu_count() or 1
    out.append(Row(name, f"xargs -P {cpus} true", median(xargs), "s"))
    for variant, got in (
        (f"corral batch -j {cpus}", ours),
        (f"corral batch -j {cpus} --reuse", warm),
    ):
        out.append(
            Row(
                name,
                variant,
                median(got),
                "s",
                base=f"xargs -P {cpus} true",
                note=f"{(median(got) or 0) / count * 1000:.1f} ms a job",
            )
        )
    name = f"batch of {count} true (Ray, 3 nodes)"
    try:
        import ray as _ray  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        with_ray = False
    if not with_ray:
        out.append(Row(name, "corral batch --ray", None, "s", note="ray not installed"))
        return out
    ours, warm, plain = ray(count, rounds)
    out.append(Row(name, "plain Ray tasks running true", median(plain), "s"))
    for variant, got in (("corral batch --ray", ours), ("corral batch --ray --reuse", warm)):
        goal = (median(got) or 0) / (median(plain) or 1)
        out.append(
            Row(
                name,
                variant,
                median(got),
                "s",
                base="plain Ray tasks running true",
                note=f"goal ≤ {GOAL}x: {'met' if goal <= GOAL else 'not met'}",
            )
        )
    return out


def main() -> int:
    from bench.common import table

    parser = argparse.ArgumentParser(prog="python -m bench.batch")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    print("\n".join(table(rows(False, args.jobs, not args.no_ray))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
