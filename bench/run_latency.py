"""How long ``corral run -- true`` takes, next to what it is built from.

Run from the repository root::

    python -m bench.run_latency [--runs N] [--warmup N] [--corral PATH] [--python PATH]

Every variant runs once per round, in the same order (A, B, C, A, B, C, ...), so a
noisy moment on the machine lands on all of them alike and the ratios stay
meaningful even when the absolute numbers drift.  Each process is started with
``os.posix_spawn`` and reaped with ``os.waitpid``; the clock
(``time.perf_counter_ns``) covers exactly that, nothing the benchmark prepares
beforehand (such as the file descriptors a raw bwrap line needs).

Afterwards it measures the import time of corral's modules with
``python -X importtime`` and prints where it goes.  The report is printed and
written to ``bench/results/run_latency.md``.  This is a benchmark, not a test:
the exit status is 0 whether or not the goal is met.
"""

from __future__ import annotations

import argparse
import fcntl
import gc
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import write_result

TYPE_CHECKING = False
if TYPE_CHECKING:
    from bench.common import Row

GOAL_MS = 20.0
IMPORT_RUNS = 10
CORRAL_MODULES = (
    "corral.cli",
    "corral.policy",
    "corral.launch",
    "corral.tiers.namespace",
    "corral.fsplan",
    "corral.seccomp",
    "corral.runlog",
    "corral.cgroups",
)
IMPORT_STATEMENT = "import " + ", ".join(CORRAL_MODULES)
RESULTS = Path(__file__).resolve().parent / "results" / "run_latency.md"

# Descriptors handed to children are first parked at or above this number so
# that the dup2 calls putting them in place (3, 4, 5, ...) cannot clobber one
# another.
HIGH_FD = 100

# bwrap options whose value is a file descriptor the caller must supply, and
# what the benchmark puts there: "seccomp" is a pipe holding the compiled filter,
# "sink" is /dev/null for writing, "empty" is /dev/null for reading.
FD_OPTIONS = {
    "--seccomp": "seccomp",
    "--add-seccomp-fd": "seccomp",
    "--json-status-fd": "sink",
    "--info-fd": "sink",
    "--ro-bind-data": "empty",
    "--bind-data": "empty",
    "--file": "empty",
}

# The environment corral gives the sandboxed command; the raw bwrap rows use it
# too, since corral execs bwrap with exactly such a small environment.
SANDBOX_ENV_NAMES = ("PATH", "HOME", "LANG", "TERM")

SECCOMP_PROGRAM = (
    "import sys\n"
    "from corral import seccomp\n"
    "sys.stdout.buffer.write("
    "seccomp.compile_filter(seccomp.default_deny_rules(), seccomp.native_arch()))\n"
)

IMPORTTIME_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S.*?)\s*$")


class BenchError(Exception):
    """The benchmark cannot run here; the message says why."""


@dataclass
class Variant:
    """One command line timed in every round."""

    name: str
    argv: list[str]
    env: dict[str, str]
    fds: dict[int, str] = field(default_factory=dict)  # child fd -> "seccomp"|"sink"|"empty"
    samples_ns: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # "round N: exit C: stderr"

    def p50_ms(self) -> float:
        return statistics.median(self.samples_ns) / 1e6


class Spawner:
    """Starts variants with posix_spawn, giving each run fresh descriptors."""

    def __init__(self, seccomp_program: bytes, stderr_path: str) -> None:
        self.seccomp_program = seccomp_program
        self.devnull = _high(os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC))
        # Children's stderr goes to a file, emptied before each run (outside the
        # clock), so a failure can say why.  ``true`` writes nothing, so this
        # costs the timed runs nothing.
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        self.stderr = _high(os.open(stderr_path, flags, 0o600))

    def close(self) -> None:
        os.close(self.devnull)
        os.close(self.stderr)

    def last_stderr(self) -> str:
        os.lseek(self.stderr, 0, os.SEEK_SET)
        return os.read(self.stderr, 4096).decode("utf-8", "replace").strip()

    def _open_fds(self, variant: Variant) -> list[tuple[int, int]]:
        """Fresh (source, target) pairs for the variant's extra descriptors."""
        pairs = []
        for target, kind in variant.fds.items():
            if target >= HIGH_FD:
                raise BenchError(f"fd {target} is too high for this benchmark (max {HIGH_FD - 1})")
            if kind == "seccomp":
                rfd, wfd = os.pipe()
                os.write(wfd, self.seccomp_program)  # a few KiB: fits the pipe buffer
                os.close(wfd)
                source = rfd
            elif kind == "sink":
                source = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            else:
                source = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            pairs.append((_high(source), target))
        return pairs

    def run(self, variant: Variant) -> tuple[int, int]:
        """Run once; return (exit code, wall time in ns of spawn + wait)."""
        pairs = self._open_fds(variant)
        os.ftruncate(self.stderr, 0)
        os.lseek(self.stderr, 0, os.SEEK_SET)
        actions: list[tuple[int, int, int]] = [
            (os.POSIX_SPAWN_DUP2, self.devnull, 0),
            (os.POSIX_SPAWN_DUP2, self.devnull, 1),
            (os.POSIX_SPAWN_DUP2, self.stderr, 2),
        ]
        actions += [(os.POSIX_SPAWN_DUP2, source, target) for source, target in pairs]
        try:
            start = time.perf_counter_ns()
            pid = os.posix_spawn(variant.argv[0], variant.argv, variant.env, file_actions=actions)
            _, status = os.waitpid(pid, 0)
            elapsed = time.perf_counter_ns() - start
        finally:
            for source, _target in pairs:
                os.close(source)
        return os.waitstatus_to_exitcode(status), elapsed


def _high(fd: int) -> int:
    """Move ``fd`` to a number >= HIGH_FD (close-on-exec) and return it."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, HIGH_FD)
    os.close(fd)
    return moved


def _which(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise BenchError(f"{name} not found on PATH")
    return os.path.abspath(found)


def default_corral() -> str:
    beside = Path(sys.executable).parent / "corral"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("corral")
    if found:
        return found
    repo_venv = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "corral"
    return str(repo_venv)


def interpreter_of(script: str) -> str:
    """The Python that runs a console script, from its ``#!`` line."""
    try:
        with open(script, "rb") as fh:
            first = fh.readline(512).decode("utf-8", "replace")
    except OSError as exc:
        raise BenchError(f"cannot read {script}: {exc.strerror}") from None
    if first.startswith("#!"):
        words = first[2:].split()
        if words and os.path.basename(words[0]) == "env" and len(words) > 1:
            return _which(words[-1])
        if words and "python" in os.path.basename(words[0]):
            return words[0]
    return sys.executable


def bench_env(state_dir: str, pycache_dir: str) -> dict[str, str]:
    """The caller's environment, with corral's log kept out of the way and bytecode cached.

    ``PYTHONDONTWRITEBYTECODE`` is dropped and ``PYTHONPYCACHEPREFIX`` points into
    the benchmark's temporary directory, so after the warm-up every Python in the
    benchmark loads cached bytecode, as it does for an installed corral, without
    writing anything into the source tree.
    """
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = pycache_dir
    env["XDG_STATE_HOME"] = state_dir
    return env


def sandbox_env() -> dict[str, str]:
    env = {name: os.environ[name] for name in SANDBOX_ENV_NAMES if name in os.environ}
    env["CORRAL_SANDBOX"] = "1"
    return env


def explain_argv(corral: str, env: dict[str, str]) -> list[str]:
    """The bwrap argv corral would run for ``true`` in the current directory."""
    out = subprocess.run(
        [corral, "run", "--explain", "-q", "--", "true"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        raise BenchError(f"corral run --explain failed ({out.returncode}): {out.stderr.strip()}")
    for line in out.stdout.splitlines():
        if line.startswith("argv: "):
            # corral prints the argv joined by spaces: fine for the temporary
            # workspace and ordinary home directories, wrong for paths with spaces.
            return line[len("argv: ") :].split(" ")
    raise BenchError("corral run --explain printed no 'argv: ' line")


def fds_of(argv: list[str]) -> dict[int, str]:
    """Which descriptors a bwrap argv expects, and what kind each is."""
    fds: dict[int, str] = {}
    for i, arg in enumerate(argv[:-1]):
        if arg == "--":
            break
        kind = FD_OPTIONS.get(arg)
        if kind is not None:
            fds[int(argv[i + 1])] = kind
    return fds


def compile_seccomp(python: str, env: dict[str, str]) -> bytes:
    """corral's default filter, compiled by the same corral the CLI runs."""
    out = subprocess.run([python, "-c", SECCOMP_PROGRAM], capture_output=True, env=env, check=False)
    if out.returncode != 0 or not out.stdout:
        raise BenchError(f"compiling the seccomp filter failed: {out.stderr.decode().strip()}")
    return out.stdout


BASELINE_ROW = "baseline: corral run -q -- true"


def build_variants(
    corral: str, python: str, env: dict[str, str], baseline: str | None = None
) -> tuple[list[Variant], bytes]:
    bwrap_argv = explain_argv(corral, env)
    bwrap_argv[0] = _which(bwrap_argv[0]) if "/" not in bwrap_argv[0] else bwrap_argv[0]
    if bwrap_argv[-2:] != ["--", "true"]:
        raise BenchError(f"unexpected bwrap argv ending: {bwrap_argv[-2:]}")
    sandbox = sandbox_env()
    variants = [
        Variant("corral run -q -- true", [corral, "run", "-q", "--", "true"], env),
        Variant("sh -c true", [_which("sh"), "-c", "true"], env),
        Variant("raw bwrap (same mounts)", bwrap_argv, sandbox, fds_of(bwrap_argv)),
        Variant("raw bwrap minimal", [bwrap_argv[0], "--ro-bind", "/", "/", "true"], sandbox),
        Variant("python -S -c pass", [python, "-S", "-c", "pass"], env),
        Variant("python -c pass", [python, "-c", "pass"], env),
        Variant("python -c 'import corral.…'", [python, "-c", IMPORT_STATEMENT], env),
    ]
    if landlock_available(python, env):
        argv = [corral, "run", "-q", "--tier", "landlock", "--", "true"]
        variants.insert(1, Variant(LANDLOCK_ROW, argv, env))
    if baseline:  # another corral (say, a checkout of main), timed in the same rounds
        variants.insert(1, Variant(BASELINE_ROW, [baseline, "run", "-q", "--", "true"], env))
    if "PYTHONDONTWRITEBYTECODE" in os.environ or "PYTHONPYCACHEPREFIX" in os.environ:
        as_is = dict(os.environ, XDG_STATE_HOME=env["XDG_STATE_HOME"])
        name = "corral run -q -- true (inherited env)"
        variants.append(Variant(name, [corral, "run", "-q", "--", "true"], as_is))
    return variants, compile_seccomp(python, env)


CONTAINER_TIERS = ("container", "gvisor")
TEST_IMAGE = "localhost/corral-test:latest"  # what `python -m corral.container.image` builds


def tier_variants(corral: str, env: dict[str, str]) -> list[Variant]:
    """One ``corral run --tier T -q -- true`` per tier ``corral doctor`` says runs here.

    The container tiers need an image: ``$CORRAL_IMAGE``, else the test image if
    it exists; without one they are left out (the table says so)."""
    from bench.common import available_tiers

    image = os.environ.get("CORRAL_IMAGE") or (TEST_IMAGE if _image_exists(TEST_IMAGE) else "")
    variants = []
    for t in available_tiers(corral):
        extra = []
        if t in CONTAINER_TIERS:
            if not image:
                continue
            extra = ["--image", image]
        argv = [corral, "run", "--tier", t, *extra, "-q", "--", "true"]
        variants.append(Variant(f"corral run --tier {t} -q -- true", argv, env))
    return variants


def _image_exists(ref: str) -> bool:
    podman = shutil.which("podman")
    if podman is None:
        return False
    out = subprocess.run([podman, "image", "exists", ref], capture_output=True, check=False)
    return out.returncode == 0


LANDLOCK_ROW = "corral run -q --tier landlock -- true"
LANDLOCK_GOAL = 1.5  # times (sh -c true + python start-up), from issue 5


def landlock_available(python: str, env: dict[str, str]) -> bool:
    probe = "from corral.tiers.landlock import LandlockTier as T; print(T().health().available)"
    out = subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True)
    return out.stdout.strip() == "True"


def landlock_verdict(variants: list[Variant]) -> list[str]:
    by_name = {v.name: v for v in variants}
    if LANDLOCK_ROW not in by_name:
        return ["landlock tier: not available here, not measured"]
    floor = by_name["sh -c true"].p50_ms() + by_name["python -c pass"].p50_ms()
    p50 = by_name[LANDLOCK_ROW].p50_ms()
    namespace = variants[0].p50_ms()
    verdict = "MET" if p50 <= LANDLOCK_GOAL * floor else "NOT MET"
    return [
        f"landlock p50 = {p50:.2f} ms = {p50 / floor:.2f}x (sh -c true + python -c pass = "
        f"{floor:.2f} ms; goal ≤ {LANDLOCK_GOAL}x): {verdict}; namespace tier {namespace:.2f} ms "
        f"(landlock/namespace = {p50 / namespace:.2f}x)"
    ]


def baseline_verdict(variants: list[Variant], baseline: str | None) -> list[str]:
    by_name = {v.name: v for v in variants}
    if baseline is None or BASELINE_ROW not in by_name:
        return []
    new, old = variants[0].p50_ms(), by_name[BASELINE_ROW].p50_ms()
    return [
        f"against the baseline `{baseline}`: p50 {new:.2f} ms vs {old:.2f} ms "
        f"({new - old:+.2f} ms, {new / old:.3f}x)",
        "",
    ]


def check_variants(spawner: Spawner, variants: list[Variant]) -> None:
    """Run each once and stop early if any fails."""
    for variant in variants:
        code, _ = spawner.run(variant)
        if code != 0:
            err = spawner.last_stderr() or "no stderr"
            raise BenchError(f"{variant.name} exited {code}: {err}")


def time_rounds(spawner: Spawner, variants: list[Variant], runs: int, warmup: int) -> None:
    """Run the rounds; a failed run is recorded and left out, not fatal.

    Other processes may change the host while the benchmark runs (a path the
    explained bwrap line binds may vanish, say); one such run should not throw
    away the rest.  Too many failures do stop it.
    """
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for round_no in range(warmup + runs):
            for variant in variants:
                code, elapsed = spawner.run(variant)
                if code != 0:
                    err = spawner.last_stderr() or "no stderr"
                    variant.failures.append(f"round {round_no}: exit {code}: {err}")
                    if len(variant.failures) > max(3, runs // 10):
                        raise BenchError(f"{variant.name} keeps failing: {variant.failures[-1]}")
                elif round_no >= warmup:
                    variant.samples_ns.append(elapsed)
    finally:
        if gc_was_enabled:
            gc.enable()


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.2f}"


def latency_table(variants: list[Variant]) -> list[str]:
    by_name = {v.name: v for v in variants}
    sh = by_name["sh -c true"].p50_ms()
    raw = by_name["raw bwrap (same mounts)"].p50_ms()
    lines = [
        "| variant | p50 ms | p90 ms | mean ms "
        "| p50 / sh -c true | p50 / raw bwrap (same mounts) | failed runs |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for v in variants:
        samples = v.samples_ns
        p90 = statistics.quantiles(samples, n=10, method="inclusive")[8]
        p50 = v.p50_ms()
        lines.append(
            f"| `{v.name}` | {p50:.2f} | {_ms(p90)} | {_ms(statistics.fmean(samples))} "
            f"| {p50 / sh:.2f}x | {p50 / raw:.2f}x | {len(v.failures)} |"
        )
    for v in variants:
        if v.failures:
            lines.append("")
            lines.append(f"first failure of `{v.name}` (left out): {v.failures[0]}")
    return lines


def machine_line(python: str, bwrap: str) -> str:
    u = os.uname()
    from bench.common import cpu_model

    cpu = cpu_model()
    nproc = len(os.sched_getaffinity(0))
    pyver = subprocess.run(
        [python, "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    bwver = subprocess.run([bwrap, "--version"], capture_output=True, text=True, check=False)
    return (
        f"machine: {u.sysname} {u.release} · {cpu} · nproc {nproc} · "
        f"Python {pyver or '?'} (corral's interpreter) · {bwver.stdout.strip() or 'bwrap ?'}"
    )


# --- import time ----------------------------------------------------------------


@dataclass
class ImportLine:
    name: str
    depth: int
    self_us: int
    cumulative_us: int
    chain: str = ""  # who imported it first, outermost first


def parse_importtime(stderr: str) -> list[ImportLine]:
    """The imports done by the ``-c`` statement, i.e. those after interpreter start-up.

    ``-X importtime`` prints a module when its import finishes, so children come
    before their parent and start-up ends with the top-level ``site`` line.
    """
    lines = []
    for raw in stderr.splitlines():
        m = IMPORTTIME_LINE.match(raw)
        if m:
            depth = len(m.group(3)) // 2
            lines.append(ImportLine(m.group(4), depth, int(m.group(1)), int(m.group(2))))
    site_at = [i for i, line in enumerate(lines) if line.depth == 0 and line.name == "site"]
    if site_at:
        lines = lines[site_at[-1] + 1 :]
    for i, line in enumerate(lines):
        parents = []
        want = line.depth - 1
        for later in lines[i + 1 :]:
            if want < 0:
                break
            if later.depth == want:
                parents.append(later.name)
                want -= 1
        line.chain = " > ".join(reversed(parents))
    return lines


def startup_us(stderr: str) -> int:
    for raw in stderr.splitlines():
        m = IMPORTTIME_LINE.match(raw)
        if m and m.group(3) == "" and m.group(4) == "site":
            return int(m.group(2))
    return 0


def import_report(python: str, env: dict[str, str], runs: int) -> list[str]:
    argv = [python, "-X", "importtime", "-c", IMPORT_STATEMENT]
    subprocess.run(argv, capture_output=True, env=env, check=False)  # warm the bytecode cache
    parsed: list[list[ImportLine]] = []
    startups: list[int] = []
    for _ in range(runs):
        out = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if out.returncode != 0:
            raise BenchError(f"{' '.join(argv)} failed: {out.stderr.strip()[-500:]}")
        parsed.append(parse_importtime(out.stderr))
        startups.append(startup_us(out.stderr))

    first = parsed[0]
    selfs: dict[str, list[int]] = {line.name: [] for line in first}
    cums: dict[str, list[int]] = {line.name: [] for line in first}
    for run in parsed:
        for line in run:
            if line.name in selfs:
                selfs[line.name].append(line.self_us)
                cums[line.name].append(line.cumulative_us)
    totals = [sum(line.cumulative_us for line in run if line.depth == 0) for run in parsed]

    def med(values: list[int]) -> int:
        return round(statistics.median(values))

    out_lines = [
        f'## Import time: `python -X importtime -c "{IMPORT_STATEMENT}"`',
        "",
        f"Median of {runs} runs (µs; `-X importtime` itself inflates the numbers somewhat). "
        f"The statement's imports total **{med(totals) / 1000:.1f} ms**; interpreter "
        f"start-up imports (`site`) take {med(startups) / 1000:.1f} ms before that.",
        "",
        "corral modules, in import order (cumulative includes what a module imported first):",
        "",
        "| module | self µs | cumulative µs | imported by |",
        "|---|---:|---:|---|",
    ]
    for line in first:
        if line.name == "corral" or line.name.startswith("corral."):
            out_lines.append(
                f"| `{line.name}` | {med(selfs[line.name])} | {med(cums[line.name])} "
                f"| {line.chain or '(the statement)'} |"
            )
    out_lines += [
        "",
        "Top 10 modules by self time (the ones worth trimming or deferring):",
        "",
        "| module | self µs | cumulative µs | imported by |",
        "|---|---:|---:|---|",
    ]
    ranked = sorted(first, key=lambda line: med(selfs[line.name]), reverse=True)[:10]
    for line in ranked:
        out_lines.append(
            f"| `{line.name}` | {med(selfs[line.name])} | {med(cums[line.name])} "
            f"| {line.chain or '(the statement)'} |"
        )
    return out_lines


# --- rows for `python -m bench` ---------------------------------------------------


def rows(quick: bool) -> list[Row]:
    """corral per tier, sh and raw bwrap, timed in one interleaved run."""
    from bench.common import Row

    runs, warmup = (30, 5) if quick else (200, 20)
    bench = "run latency"
    base = tempfile.mkdtemp(prefix="corral-bench-")
    old_cwd = os.getcwd()
    try:
        corral = os.path.abspath(default_corral())
        python = interpreter_of(corral)
        workspace, state, pycache = (
            os.path.join(base, d) for d in ("workspace", "state", "pycache")
        )
        for d in (workspace, state, pycache):
            os.mkdir(d)
        env = bench_env(state, pycache)
        os.chdir(workspace)
        variants, program = build_variants(corral, python, env)
        keep = {"sh -c true", "raw bwrap (same mounts)", "python -c pass"}
        variants = [v for v in variants if v.name in keep] + tier_variants(corral, env)
        spawner = Spawner(program, os.path.join(base, "stderr"))
        try:
            check_variants(spawner, variants)
            time_rounds(spawner, variants, runs, warmup)
        finally:
            spawner.close()
    except BenchError as exc:
        return [Row(bench, "corral run -q -- true", None, "ms", note=str(exc))]
    finally:
        os.chdir(old_cwd)
        shutil.rmtree(base, ignore_errors=True)
    out = []
    for v in variants:
        tiered = v.name.startswith("corral run --tier")
        note = f"{len(v.samples_ns)} runs" + (f", {len(v.failures)} failed" if v.failures else "")
        out.append(
            Row(bench, v.name, v.p50_ms(), "ms", "raw bwrap (same mounts)" if tiered else "", note)
        )
    return out


# --- main -----------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run_latency",
        description="Median wall time of `corral run -- true` next to sh and raw bwrap.",
    )
    parser.add_argument("--runs", type=int, default=200, help="timed rounds (default 200)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed rounds first (default 20)")
    parser.add_argument("--corral", default=None, help="the corral executable to time")
    parser.add_argument(
        "--python", default=None, help="corral's interpreter (default: from its #! line)"
    )
    parser.add_argument(
        "--baseline",
        default=None,
        help="another corral executable to time side by side (e.g. one installed from main)",
    )
    args = parser.parse_args(argv)
    if args.runs < 2 or args.warmup < 0:
        parser.error("--runs must be at least 2 and --warmup at least 0")
    return args


def report(args: argparse.Namespace, base: str) -> str:
    corral = os.path.abspath(args.corral or default_corral())
    if not os.access(corral, os.X_OK):
        raise BenchError(f"corral executable not found: {corral}")
    python = args.python or interpreter_of(corral)
    workspace = os.path.join(base, "workspace")
    state = os.path.join(base, "state")
    pycache = os.path.join(base, "pycache")
    for d in (workspace, state, pycache):
        os.mkdir(d)
    env = bench_env(state, pycache)

    old_cwd = os.getcwd()
    os.chdir(workspace)  # the sandbox's workspace: corral binds the cwd writable
    try:
        baseline = os.path.abspath(args.baseline) if args.baseline else None
        variants, program = build_variants(corral, python, env, baseline)
        spawner = Spawner(program, os.path.join(base, "stderr"))
        try:
            check_variants(spawner, variants)
            started = time.monotonic()
            time_rounds(spawner, variants, args.runs, args.warmup)
            took = time.monotonic() - started
        finally:
            spawner.close()
        imports = import_report(python, env, IMPORT_RUNS)
    finally:
        os.chdir(old_cwd)

    corral_p50 = variants[0].p50_ms()
    verdict = "MET" if corral_p50 <= GOAL_MS else "NOT MET"
    bytecode = (
        "cached (PYTHONDONTWRITEBYTECODE dropped, PYTHONPYCACHEPREFIX in a temp dir)"
        if "PYTHONDONTWRITEBYTECODE" in os.environ
        else "cached (PYTHONPYCACHEPREFIX in a temp dir)"
    )
    lines = [
        "# corral run latency",
        "",
        machine_line(python, next(v for v in variants if v.name == "raw bwrap minimal").argv[0]),
        "",
        f"{args.runs} interleaved rounds after {args.warmup} warm-up rounds "
        f"({took:.1f} s); cwd is an empty temporary workspace; bytecode {bytecode}; "
        f"corral: `{corral}`.",
        "",
        *latency_table(variants),
        "",
        f"corral run -- true p50 = {corral_p50:.2f} ms (goal ≤ {GOAL_MS:g} ms): {verdict}",
        "",
        *baseline_verdict(variants, baseline),
        *landlock_verdict(variants),
        "",
        *imports,
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = tempfile.mkdtemp(prefix="corral-bench-")
    try:
        text = report(args, base)
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(text, end="")
    write_result(RESULTS, text)
    print(f"(written to {RESULTS})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
