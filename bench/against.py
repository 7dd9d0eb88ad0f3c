"""This checkout's corral against an earlier revision's, side by side in one run.

Run from the repository root::

    python -m bench.against REV [--runs N] [--calls N] [--user NAME]

``REV`` is any git revision (``main``, ``HEAD~3``, a commit).  Its ``src/corral``
is exported with ``git archive`` into a temporary directory; both corrals then
run the same way (``python -c 'from corral.cli import entry; entry()'`` with
``PYTHONPATH`` pointing at each tree) and with cached bytecode, so the only
difference measured is the code.

Rows, each pair interleaved (A, B, A, B, ...):

- ``corral run -q -- true``, as the caller and, with ``--user``, as that
  unprivileged user (through ``setpriv``; the trees are copied where it can
  read them); once started the same way for both trees (``python -c``), once
  through each tree's own ``scripts/corral`` (what an installed ``corral``
  runs, and so what a user waits for) when both have one;
- a warm ``Sandbox.exec(["true"])``: one worker process per tree holds a
  Sandbox and runs batches of calls in turn; the same awaited on an
  ``AsyncSandbox``.

This is how a change shows it costs nothing per run ("no slower than today").
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from bench.common import Row

REPO = Path(__file__).resolve().parent.parent
ENTRY = "from corral.cli import entry; entry()"
# A worker holding one Sandbox: reads a count per line, runs that many warm
# execs, answers with their durations in microseconds.
WORKER = """\
import os, sys, time
from corral import policy as pol
from corral.sandbox import Sandbox
ws = sys.argv[1]
os.chdir(ws)
with Sandbox(pol.load(ws)) as sb:
    for _ in range(20):
        sb.exec(["true"])
    print("ready", flush=True)
    for line in sys.stdin:
        times = []
        for _ in range(int(line)):
            t = time.perf_counter_ns()
            assert sb.exec(["true"]).exit_code == 0
            times.append((time.perf_counter_ns() - t) // 1000)
        print(" ".join(map(str, times)), flush=True)
"""


# The same through AsyncSandbox: each call awaited on an event loop.
ASYNC_WORKER = """\
import asyncio, os, sys, time
from corral import policy as pol
from corral.sandbox import AsyncSandbox
ws = sys.argv[1]
os.chdir(ws)
async def main():
    async with AsyncSandbox(pol.load(ws)) as sb:
        for _ in range(20):
            await sb.exec(["true"])
        print("ready", flush=True)
        for line in sys.stdin:  # between batches only: the loop has nothing else to do
            times = []
            for _ in range(int(line)):
                t = time.perf_counter_ns()
                assert (await sb.exec(["true"])).exit_code == 0
                times.append((time.perf_counter_ns() - t) // 1000)
            print(" ".join(map(str, times)), flush=True)
asyncio.run(main())
"""


class Tree:
    """One corral source tree and how to run it."""

    def __init__(self, label: str, src: str, python: str) -> None:
        self.label = label
        self.src = src  # the directory holding corral/
        self.python = python
        # what `corral` on PATH runs: the tree's own entry script, if it has one
        script = os.path.join(os.path.dirname(src), "scripts", "corral")
        self.script = script if os.path.exists(script) else None

    def entry(self, how: str) -> list[str]:
        """How to start this tree's CLI: ``-c`` (the same line for every tree) or
        ``script`` (the entry script it ships, as an installed ``corral`` runs)."""
        if how == "script" and self.script is not None:
            return [self.python, self.script]
        return [self.python, "-P", "-c", ENTRY]  # (-P: not importing from the workspace)

    def env(self, base: dict[str, str]) -> dict[str, str]:
        return {**base, "PYTHONPATH": self.src}


def export(rev: str, into: str) -> str:
    """``src/corral`` at ``rev``, unpacked under ``into``; returns the src directory."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "src/corral", "scripts"],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise SystemExit(f"bench: git archive {rev}: {archive.stderr.decode().strip()}")
    os.makedirs(into, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
    return os.path.join(into, "src")


def base_env(state: str, pycache: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE",)}
    env.update(XDG_STATE_HOME=state, PYTHONPYCACHEPREFIX=pycache)
    return env


def time_once(argv: list[str], env: dict[str, str], cwd: str) -> int:
    t = time.perf_counter_ns()
    done = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, check=False)
    took = time.perf_counter_ns() - t
    if done.returncode != 0:
        raise SystemExit(f"bench: {' '.join(argv[:3])}... exited {done.returncode}")
    return took


def cold(
    trees: list[Tree], env: dict[str, str], ws: str, runs: int, prefix: list[str], how: str
) -> list[list[int]]:
    """``corral run -q -- true`` for each tree, interleaved; ns per run."""
    argvs = [[*prefix, *t.entry(how), "run", "-q", "--", "true"] for t in trees]
    envs = [t.env(env) for t in trees]
    samples: list[list[int]] = [[] for _ in trees]
    for i in range(runs + 10):
        if i == 10:
            # a home layer seeded less than a second ago is seeded again (its
            # manifest distrusts stamps that recent: corral.homeseed.RECENT_NS);
            # the runs measured are those of a workspace used before
            time.sleep(1.1)
        for k in range(len(trees)) if i % 2 else reversed(range(len(trees))):
            took = time_once(argvs[k], envs[k], ws)
            if i >= 10:  # the first rounds warm the bytecode cache and page cache
                samples[k].append(took)
    return samples


def warm(
    trees: list[Tree], env: dict[str, str], ws: str, calls: int, worker: str = WORKER
) -> list[list[int]]:
    """Warm execs per tree, in alternating batches of 20; µs per call."""
    workers = [
        subprocess.Popen(
            [t.python, "-P", "-c", worker, ws],
            env=t.env(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for t in trees
    ]
    samples: list[list[int]] = [[] for _ in trees]
    try:
        for w in workers:
            assert w.stdout is not None and w.stdout.readline().strip() == "ready"
        for batch in range(max(1, calls // 20)):
            order = range(len(workers)) if batch % 2 else reversed(range(len(workers)))
            for k in order:
                w = workers[k]
                assert w.stdin is not None and w.stdout is not None
                w.stdin.write("20\n")
                w.stdin.flush()
                samples[k] += [int(x) for x in w.stdout.readline().split()]
    finally:
        for w in workers:
            if w.stdin is not None:
                w.stdin.close()
            w.wait(timeout=30)
    return samples


def _user_trees(trees: list[Tree], base: str, user: str) -> tuple[list[Tree], list[str]]:
    """Copies the user can read, run by the system Python, and the setpriv prefix."""
    import pwd

    info = pwd.getpwnam(user)
    python = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
    copies = []
    for i, t in enumerate(trees):
        dest = os.path.join(base, f"user-{i}", "src")
        shutil.copytree(t.src, dest, ignore=shutil.ignore_patterns("__pycache__"))
        if t.script is not None:
            os.makedirs(os.path.join(base, f"user-{i}", "scripts"))
            shutil.copy(t.script, os.path.join(base, f"user-{i}", "scripts", "corral"))
        os.chmod(os.path.join(base, f"user-{i}"), 0o755)
        copies.append(Tree(t.label, dest, python))
    prefix = ["setpriv", f"--reuid={info.pw_uid}", f"--regid={info.pw_gid}", "--clear-groups", "--"]
    return copies, prefix


def measure(rev: str, runs: int, calls: int, user: str | None) -> list[Row]:
    from bench.common import Row

    base = tempfile.mkdtemp(prefix="corral-against-")
    os.chmod(base, 0o755)
    rows: list[Row] = []
    try:
        ws, state, pycache = (os.path.join(base, d) for d in ("ws", "state", "pycache"))
        for d in (ws, state, pycache):
            os.mkdir(d)
            os.chmod(d, 0o777)
        os.chmod(ws, 0o1777)
        trees = [
            Tree("this checkout", str(REPO / "src"), sys.executable),
            Tree(rev, export(rev, os.path.join(base, "rev")), sys.executable),
        ]
        env = base_env(state, pycache)
        cases: list[tuple[str, list[Tree], list[str]]] = [(f"as uid {os.getuid()}", trees, [])]
        if user:
            user_trees, prefix = _user_trees(trees, base, user)
            cases.append((f"as {user}", user_trees, prefix))
        for n, (who, case_trees, prefix) in enumerate(cases):
            # each user writes its own log and bytecode (a cache root made would be
            # read-only to the user, who would then compile corral on every run)
            own = {}
            for var, name in (("XDG_STATE_HOME", "state"), ("PYTHONPYCACHEPREFIX", "pycache")):
                own[var] = os.path.join(base, f"{name}-{n}")
                os.mkdir(own[var])
                os.chmod(own[var], 0o1777)
            hows = ["-c"] + (["script"] if all(t.script for t in case_trees) else [])
            for how in hows:
                got = cold(case_trees, {**env, **own}, ws, runs, prefix, how)
                by = "python -c" if how == "-c" else "scripts/corral"
                name = f"corral run -q -- true, {who}, via {by}"
                for t, s in zip(case_trees, got, strict=True):
                    rows.append(Row(f"against {rev}", f"{name} ({t.label})",
                                    statistics.median(s) / 1e6, "ms",
                                    f"{name} ({rev})" if t.label != rev else "",
                                    f"{len(s)} runs"))  # fmt: skip
        for name, worker in (
            ("warm Sandbox.exec(['true'])", WORKER),
            ("warm await AsyncSandbox.exec(['true'])", ASYNC_WORKER),
        ):
            got = warm(trees, env, ws, calls, worker)
            for t, s in zip(trees, got, strict=True):
                rows.append(Row(f"against {rev}", f"{name} ({t.label})",
                                statistics.median(s) / 1e3, "ms",
                                f"{name} ({rev})" if t.label != rev else "",
                                f"{len(s)} calls"))  # fmt: skip
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return rows


def rows(quick: bool, rev: str) -> list[Row]:
    """For ``python -m bench --against REV``: as root and, if it exists, as corral-test."""
    import pwd

    try:
        pwd.getpwnam("corral-test")
        user: str | None = "corral-test" if os.geteuid() == 0 else None
    except KeyError:
        user = None
    try:
        return measure(rev, 40 if quick else 150, 400 if quick else 2000, user)
    except (SystemExit, OSError, subprocess.SubprocessError) as exc:
        from bench.common import Row

        return [Row(f"against {rev}", "corral run -q -- true", None, "ms", note=str(exc))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.against", description=__doc__)
    parser.add_argument("rev", help="the git revision to compare with (e.g. main, HEAD~1)")
    parser.add_argument("--runs", type=int, default=100, help="cold runs per tree (default 100)")
    parser.add_argument("--calls", type=int, default=1000, help="warm calls per tree")
    parser.add_argument("--user", default=None, help="also time cold runs as this user")
    args = parser.parse_args(argv)
    from bench.common import machine_line, table

    rows = measure(args.rev, args.runs, args.calls, args.user)
    print(machine_line())
    print()
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
