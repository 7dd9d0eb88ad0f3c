"""The container tier against the engine it drives, side by side.

Run from the repository root, as root, with the test image built
(``python -m corral.container.image``)::

    python -m bench.container_exec [--rounds 20] [--image localhost/corral-test:latest]

One-shot: ``corral run --tier container -- true`` against ``podman run --rm``
with the same image and the same flags (corral's envelope, minus corral's
boot step).  Long-lived: ``Sandbox.exec(["true"])`` on one container against
``runc exec`` and ``podman exec`` into that same container.  Each round runs
every variant once, interleaved, so machine noise lands on all of them.
Prints a markdown table of medians and the ratios against the goals
(one-shot ≤ 1.1x podman run; long-lived exec ≤ 1.1x raw runc exec).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench.common import Row

IMAGE = "localhost/corral-test:latest"


def timed(fn: object) -> float:
    t = time.perf_counter()
    fn()  # type: ignore[operator]
    return (time.perf_counter() - t) * 1000


def run_quiet(argv: list[str], env: dict[str, str] | None = None) -> None:
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)


def measure(rounds: int, image: str, runtime: str) -> dict[str, float]:
    """Median milliseconds per variant, all measured in the same interleaved rounds:
    corral (one-shot), podman (plain run), sb (warm Sandbox.exec), runc, pexec."""
    from corral import launch
    from corral.policy import Policy
    from corral.sandbox import Sandbox
    from corral.tiers.container import ContainerTier, EngineLaunch

    corral = os.path.join(os.path.dirname(sys.executable), "corral")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    times: dict[str, list[float]] = {k: [] for k in ("corral", "podman", "sb", "runc", "pexec")}
    old_cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="corral-bench-", dir="/var/tmp") as ws:
        os.chdir(ws)
        policy = Policy(ws)
        policy.container.image = image
        policy.container.runtime = runtime
        # the same envelope, the command `true` without corral's boot step
        plan = ContainerTier().plan(policy, ["true"])
        assert isinstance(plan.strategy, EngineLaunch)
        engine_env = plan.strategy.env
        cut = plan.argv.index("--")
        raw = [a for a in plan.argv[: cut + 2] if a not in ("--interactive", "--tty")]
        raw += ["true"]
        name_at = raw.index("--name") + 1
        one_shot = [corral, "run", "-q", "--tier", "container", "--oci-runtime", runtime]
        one_shot += ["--image", image, "--", "true"]
        launch.prepare_scratch(plan)
        try:
            with Sandbox(policy, tier="container") as sb:
                sb.exec(["true"])
                name = sb.plan.argv[sb.plan.argv.index("--name") + 1]
                cid = subprocess.run(
                    ["podman", "inspect", "--format", "{{.Id}}", name],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.strip()
                runc_exec = ["runc", "--root", "/run/runc", "exec", cid, "true"]
                have_runc = runtime == "runc" and os.path.isdir(f"/run/runc/{cid}")
                for i in range(rounds + 2):  # two warm-up rounds, not counted
                    raw[name_at] = f"corral-bench-{os.getpid()}-{i}"
                    sample = {
                        "corral": timed(lambda: run_quiet(one_shot, env)),
                        "podman": timed(lambda: run_quiet(raw, engine_env)),
                        "sb": timed(lambda: sb.exec(["true"])),
                        "pexec": timed(lambda: run_quiet(["podman", "exec", name, "true"])),
                    }
                    if have_runc:
                        sample["runc"] = timed(lambda: run_quiet(runc_exec))
                    if i >= 2:
                        for key, value in sample.items():
                            times[key].append(value)
        finally:
            launch.remove_scratch(plan)
            os.chdir(old_cwd)
    return {k: statistics.median(v) for k, v in times.items() if v}


def rows(quick: bool) -> list[Row]:
    """For ``python -m bench``: the one-shot and the long-lived comparisons."""
    try:
        med = measure(5 if quick else 20, os.environ.get("CORRAL_IMAGE", IMAGE), "runc")
    except Exception as exc:  # no podman, no image: the table says why
        return [Row("container exec", "corral container tier", None, "ms", note=str(exc)[:200])]
    one, many = "container one-shot `true`", "container long-lived exec `true`"
    base = "runc exec" if "runc" in med else "podman exec"
    plain = "podman run --rm (same image and flags)"
    out = [
        Row(one, plain, med["podman"], "ms"),
        Row(one, "corral run --tier container", med["corral"], "ms", plain, "goal 1.1x"),
    ]
    if "runc" in med:
        out.append(Row(many, "runc exec", med["runc"], "ms"))
    out.append(Row(many, "podman exec", med["pexec"], "ms", base if base != "podman exec" else ""))
    out.append(Row(many, "Sandbox.exec (agent inside)", med["sb"], "ms", base, "goal 1.1x"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--image", default=IMAGE)
    parser.add_argument("--runtime", default="runc")
    args = parser.parse_args(argv)
    med = measure(args.rounds, args.image, args.runtime)
    print(
        f"machine: {os.uname().sysname} {os.uname().release} · nproc {os.cpu_count()} · "
        f"runtime {args.runtime} · {args.rounds} interleaved rounds"
    )
    print()
    print("| variant | median ms | ratio |")
    print("|---|---:|---:|")
    print(f"| `podman run --rm` (same image and flags) `true` | {med['podman']:.1f} | 1.00 |")
    ratio_one = med["corral"] / med["podman"]
    print(f"| `corral run --tier container -- true` | {med['corral']:.1f} | {ratio_one:.2f} |")
    base = med.get("runc", med["pexec"])
    if "runc" in med:
        print(f"| `runc exec` into the sandbox's container | {med['runc']:.1f} | 1.00 |")
    print(f"| `podman exec` into it | {med['pexec']:.1f} | {med['pexec'] / base:.2f} |")
    print(f"| `Sandbox.exec(['true'])` (agent inside) | {med['sb']:.2f} | {med['sb'] / base:.3f} |")
    print()
    print(f"one-shot goal ≤ 1.1x podman run: {'MET' if ratio_one <= 1.1 else 'NOT MET'}")
    print(f"long-lived goal ≤ 1.1x raw exec: {'MET' if med['sb'] <= 1.1 * base else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
