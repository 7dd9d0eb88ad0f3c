"""The ``corral`` command line: a thin face over policy, tiers and the launcher.

The argument parser is a small table-driven one rather than argparse: argparse
and its imports cost about 8 ms, a third of the budget of ``corral run -- true``.
"""

from __future__ import annotations

import os
import sys

from corral.errors import EXIT_CODES, EXIT_INTERNAL, EXIT_USAGE, CorralError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.launch import RunResult
    from corral.policy import Policy

USAGE = """\
usage: corral run [OPTIONS] [--] COMMAND [ARG...]   run a command in a sandbox
       corral doctor [--json] [--probe]             which tiers can run here, and why not
       corral log [-n N] [--json] [--log FILE]      the last runs
       corral --version

run options:
  --tier NAME          auto (default: strongest available), namespace, none, ...
  --policy FILE        policy file (default: corral.toml in the workspace, if any)
  --workspace DIR      the writable workspace (default: current directory)
  --timeout DURATION   wall-clock limit, e.g. 30s, 5m; kills the whole process tree
  --memory SIZE        memory limit, e.g. 512M
  --pids N             process limit
  --cpus N             CPU limit, e.g. 1.5
  --output-limit SIZE  bytes of stdout+stderr kept (default 64M); the rest is dropped
  --writable PATH      another writable path (repeatable)
  --read-deny PATH     another unreadable path (repeatable)
  --write-deny PATH    another read-only path inside a writable one (repeatable)
  --env NAME           pass this variable from the environment (repeatable)
  --log FILE           activity log (default: $XDG_STATE_HOME/corral/runs.jsonl)
  --explain            print the plan (mounts, syscall rules, limits) and do not run
  -q, --quiet          no informational lines on stderr (warnings still print)

exit codes: the command's own code; 128+N if it died of signal N; and
""" + "".join(f"  {code}  {text}\n" for code, text in EXIT_CODES.items())

# option -> (attribute, kind); kind "flag" takes no value, "list" repeats.
RUN_OPTIONS: dict[str, tuple[str, str]] = {
    "--tier": ("tier", "value"),
    "--policy": ("policy", "value"),
    "--workspace": ("workspace", "value"),
    "--timeout": ("timeout", "value"),
    "--memory": ("memory", "value"),
    "--pids": ("pids", "value"),
    "--cpus": ("cpus", "value"),
    "--output-limit": ("output", "value"),
    "--writable": ("writable", "list"),
    "--read-deny": ("read_deny", "list"),
    "--write-deny": ("write_deny", "list"),
    "--env": ("env", "list"),
    "--log": ("log", "value"),
    "--explain": ("explain", "flag"),
    "-q": ("quiet", "flag"),
    "--quiet": ("quiet", "flag"),
}
DOCTOR_OPTIONS = {"--json": ("json", "flag"), "--probe": ("probe", "flag")}
LOG_OPTIONS = {
    "--json": ("json", "flag"),
    "-n": ("n", "value"),
    "--log": ("log", "value"),
}


def parse(
    args: list[str], table: dict[str, tuple[str, str]], positional: bool
) -> tuple[dict[str, object], list[str]]:
    """Options from ``table`` until ``--`` or the first non-option (if ``positional``)."""
    opts: dict[str, object] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return opts, args[i + 1 :]
        if not arg.startswith("-") or arg == "-":
            if positional:
                return opts, args[i:]
            raise CorralError(f"unexpected argument {arg!r}")
        name, eq, inline = arg.partition("=")
        if name not in table:
            raise CorralError(f"unknown option {name} (see corral --help)")
        attr, kind = table[name]
        if kind == "flag":
            if eq:
                raise CorralError(f"option {name} takes no value")
            opts[attr] = True
            i += 1
            continue
        if eq:
            value = inline
            i += 1
        elif i + 1 < len(args):
            value = args[i + 1]
            i += 2
        else:
            raise CorralError(f"option {name} needs a value")
        if kind == "list":
            existing = opts.setdefault(attr, [])
            assert isinstance(existing, list)
            existing.append(value)
        else:
            opts[attr] = value
    return opts, []


def build_policy(opts: dict[str, object]) -> Policy:
    from corral import policy as pol

    workspace = opts.get("workspace")
    policy_path = opts.get("policy")
    policy = pol.load(
        str(workspace) if workspace else None, str(policy_path) if policy_path else None
    )
    flag_parsers = {
        "timeout": ("--timeout", pol.parse_duration),
        "memory": ("--memory", pol.parse_size),
        "pids": ("--pids", pol.parse_pids),
        "cpus": ("--cpus", pol.parse_cpus),
        "output": ("--output-limit", pol.parse_size),
    }
    for attr, (flag, parser) in flag_parsers.items():
        if attr in opts:
            try:
                setattr(policy.limits, attr, parser(opts[attr]))
            except ValueError as exc:
                raise CorralError(f"{flag}: {exc}") from None
    for attr in ("writable", "read_deny", "write_deny"):
        extra = opts.get(attr)
        if isinstance(extra, list):
            getattr(policy.filesystem, attr).extend(extra)
    envs = opts.get("env")
    if isinstance(envs, list):
        for name in envs:
            try:
                policy.env.pass_names.append(pol.check_env_name(name))
            except ValueError as exc:
                raise CorralError(f"--env: {exc}") from None
    if "tier" in opts:
        policy.tier = str(opts["tier"])
    return policy


def cmd_run(args: list[str]) -> int:
    opts, command = parse(args, RUN_OPTIONS, positional=True)
    if not command:
        raise CorralError("nothing to run: corral run [OPTIONS] -- COMMAND [ARG...]")
    policy = build_policy(opts)
    from corral import tiers

    tier, _health = tiers.select(policy.tier)
    plan = tier.plan(policy, command)
    if opts.get("explain"):
        print(plan.describe())
        return 0
    quiet = bool(opts.get("quiet"))
    if plan.warning:
        _err(plan.warning)
    elif policy.tier == "auto" and not quiet:
        _err(f"corral: tier {tier.name} (auto: strongest available here)")
    for note in plan.notes:
        if not quiet:
            _err(f"corral: note: {note}")

    import time

    from corral import launch, runlog

    run_id = launch.new_run_id()
    started = time.time()
    log_path = opts.get("log")
    record: dict[str, object] = {
        "run_id": run_id,
        "start": runlog.iso(started),
        "tier": plan.tier,
        "policy_digest": runlog.digest(policy.to_dict()),
        "policy_file": policy.source,
        "workspace": policy.workspace,
        "argv": command,
    }
    try:
        result = launch.run(plan, run_id)
    except CorralError as exc:
        record.update(end=runlog.iso(time.time()), exit=exc.code, error=exc.message)
        _log(record, log_path)
        raise
    record.update(
        end=runlog.iso(time.time()),
        exit=result.exit_code,
        duration=round(result.duration, 4),
        timed_out=result.timed_out,
        truncated=result.truncated,
        output_bytes=result.output_bytes,
        limits_hit=result.limits_hit,
        denials=result.denials,
    )
    _log(record, log_path)
    _report(result, policy)
    return result.exit_code


def _log(record: dict[str, object], path: object) -> None:
    from corral import runlog

    try:
        runlog.append(record, str(path) if path else None)
    except OSError as exc:
        _err(f"corral: warning: could not write the activity log: {exc}")


def _report(result: RunResult, policy: Policy) -> None:
    if result.timed_out:
        _err(f"corral: timed out after {policy.limits.timeout:g}s; killed the whole process tree")
    if result.truncated:
        _err(
            f"corral: output truncated: kept {policy.limits.output} of {result.output_bytes} bytes"
        )
    for hit in result.limits_hit:
        if hit != "timeout":
            _err(f"corral: limit hit: {hit}")
    for denial in result.denials:
        _err(f"corral: denied: {denial}")
    if result.signal is not None:
        _err(f"corral: received signal {result.signal}; killed the sandbox")


def cmd_doctor(args: list[str]) -> int:
    opts, _ = parse(args, DOCTOR_OPTIONS, positional=False)
    from corral import tiers

    rows = []
    for name in tiers.names():
        tier = tiers.get(name)
        try:
            health = tier.health(probe=bool(opts.get("probe")))
        except Exception as exc:  # one broken probe must not hide the other tiers
            from corral.tiers.base import Health

            health = Health(False, f"health check failed: {exc}")
        rows.append((tier, health))
    auto = next((t.name for t, h in rows if h.available and t.name in tiers.AUTO_ORDER), None)
    if opts.get("json"):
        import json

        print(
            json.dumps(
                {
                    "auto": auto,
                    "tiers": [
                        {"name": t.name, "summary": t.summary, **h.to_dict()} for t, h in rows
                    ],
                },
                indent=2,
            )
        )
        return 0
    width = max(len(t.name) for t, _ in rows)
    for tier, health in rows:
        state = "available" if health.available else "unavailable"
        print(f"{tier.name:<{width}}  {state:<11}  {health.reason}")
    print(f"auto -> {auto or 'nothing (corral run will refuse)'}")
    return 0


def cmd_log(args: list[str]) -> int:
    opts, _ = parse(args, LOG_OPTIONS, positional=False)
    from corral import runlog

    try:
        count = int(str(opts.get("n", 20)))
    except ValueError:
        count = -1
    if count < 0:
        raise CorralError("-n needs a whole number, 0 or more")
    records = list(runlog.read(str(opts["log"]) if opts.get("log") else None))
    records = records[-count:] if count else []
    if opts.get("json"):
        import json

        for record in records:
            print(json.dumps(record))
        return 0
    for r in records:
        argv = r.get("argv")
        command = " ".join(str(a) for a in argv) if isinstance(argv, list) else ""
        hits = r.get("limits_hit") or []
        extra = f"  limits: {','.join(map(str, hits))}" if isinstance(hits, list) and hits else ""
        denials = r.get("denials") or []
        if isinstance(denials, list) and denials:
            extra += f"  denials: {len(denials)}"
        if r.get("error"):
            extra += f"  error: {r['error']}"
        duration = r.get("duration")
        dur = f"{duration:.3f}s" if isinstance(duration, int | float) else "-"
        start, run_id, tier, code = (
            str(r.get(k) if r.get(k) is not None else "?")
            for k in ("start", "run_id", "tier", "exit")
        )
        print(f"{start}  {run_id}  {tier:<9}  exit {code:<3}  {dur:>8}  {command[:80]}{extra}")
    return 0


def _err(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        if not args or args[0] in ("-h", "--help", "help"):
            sys.stdout.write(USAGE)
            return 0 if args else EXIT_USAGE
        if args[0] == "--version":
            from corral import __version__

            print(f"corral {__version__}")
            return 0
        commands = {"run": cmd_run, "doctor": cmd_doctor, "log": cmd_log}
        if args[0] not in commands:
            raise CorralError(f"unknown command {args[0]!r} (run, doctor, log; see corral --help)")
        return commands[args[0]](args[1:])
    except CorralError as exc:
        _err(f"corral: {exc.message}")
        return exc.code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if os.environ.get("CORRAL_DEBUG"):
            raise
        _err(
            f"corral: internal error: {type(exc).__name__}: {exc} "
            "(set CORRAL_DEBUG=1 for a traceback)"
        )
        return EXIT_INTERNAL


def entry() -> None:
    code = main()
    # Skip interpreter teardown (module and GC finalisation, ~1-2 ms on every
    # run): nothing corral holds needs it once its streams are flushed.
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        pass
    os._exit(code)


if __name__ == "__main__":
    entry()
