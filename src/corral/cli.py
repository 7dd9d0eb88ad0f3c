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
    import socket

    from corral.launch import RunResult
    from corral.net.ca import CA
    from corral.net.door import Door
    from corral.net.hooks import Chain
    from corral.net.trust import NetExtras
    from corral.policy import Policy
    from corral.tiers.base import Health, Tier

USAGE = """\
usage: corral run [OPTIONS] [--] COMMAND [ARG...]   run a command in a sandbox
       corral shell [OPTIONS] [-- SHELL...]         an interactive shell in a sandbox (a pty)
       corral mcp [OPTIONS]                         an MCP server (stdio) on one sandbox
       corral doctor [--json] [--probe]             which tiers can run here, and why not
       corral log [-n N] [--json] [--log FILE]      the last runs
       corral log --net [--run ID] [--host H] [--decision allow|deny|error]
       corral policy import [--workspace DIR] FILE.json   srt settings as corral.toml
       corral proxy serve [--policy FILE] [--listen HOST:PORT] [--door PATH]
                          [--allow HOST...] [--workers N]
       corral --version

run options:
  --tier NAME          auto (default: strongest available), namespace, landlock, none, ...
  --engine NAME        container tier: podman or docker (default: $CORRAL_ENGINE, else
                       the first of podman, docker found)
  --oci-runtime NAME   container tier: runc (default), runsc (gVisor) or crun
  --image REF          container tier: the image (default: [container] image, $CORRAL_IMAGE)
  --policy FILE        policy file (default: corral.toml in the workspace, if any)
  --settings FILE      srt's settings JSON as the policy file (not with --policy)
  --workspace DIR      the writable workspace (default: current directory)
  --timeout DURATION   wall-clock limit, e.g. 30s, 5m; kills the whole process tree
  --memory SIZE        memory limit, e.g. 512M (default: half the RAM)
  --pids N             process (task) limit (default: 4096)
  --cpus N             CPU limit, e.g. 1.5
  --tmp SIZE           size of the private /tmp and of /var/tmp (default: RAM/4, 512M-4G)
  --shm SIZE           size of the private /dev/shm (default: RAM/16, 64M-1G)
                       each of these six takes none: no bound, not even the default
  --output-limit SIZE  bytes of stdout+stderr kept (default 64M); the rest is dropped
  --writable PATH      another writable path (repeatable)
  --read-deny PATH     another unreadable path (repeatable)
  --write-deny PATH    another read-only path inside a writable one (repeatable)
  --env NAME           pass this variable from the environment (repeatable)
  --pass-fd N          hand this open descriptor (above 2) to the command at the same
                       number (repeatable); no other descriptor but 0, 1, 2 crosses
  --network MODE       none (default: no network) or proxy (only through corral's proxy)
  --allow HOST         allow a destination through the proxy; implies --network proxy
                       (example.org, *.example.org, host:443, 10.0.0.0/8, [::1]:8080)
  --deny HOST          deny a destination (deny wins over allow)
  --net-log FILE       network audit log (default: $XDG_STATE_HOME/corral/net.jsonl)
  --transparent        (root) capture all TCP and DNS, for tools that ignore proxy variables
  --log FILE           activity log (default: $XDG_STATE_HOME/corral/runs.jsonl)
  --explain            print the plan (mounts, syscall rules, limits) and do not run
  -q, --quiet          no informational lines on stderr (warnings still print)

exit codes: the command's own code; 128+N if it died of signal N; and
""" + "".join(f"  {code}  {text}\n" for code, text in EXIT_CODES.items())

# option -> (attribute, kind); kind "flag" takes no value, "list" repeats.
RUN_OPTIONS: dict[str, tuple[str, str]] = {
    "--tier": ("tier", "value"),
    "--engine": ("engine", "value"),
    "--oci-runtime": ("oci_runtime", "value"),
    "--image": ("image", "value"),
    "--policy": ("policy", "value"),
    "--settings": ("settings", "value"),
    "--workspace": ("workspace", "value"),
    "--timeout": ("timeout", "value"),
    "--memory": ("memory", "value"),
    "--pids": ("pids", "value"),
    "--cpus": ("cpus", "value"),
    "--tmp": ("tmp", "value"),
    "--shm": ("shm", "value"),
    "--output-limit": ("output", "value"),
    "--writable": ("writable", "list"),
    "--read-deny": ("read_deny", "list"),
    "--write-deny": ("write_deny", "list"),
    "--env": ("env", "list"),
    "--pass-fd": ("pass_fd", "list"),
    "--allow": ("allow", "list"),
    "--deny": ("deny", "list"),
    "--network": ("network", "value"),
    "--net-log": ("net_log", "value"),
    "--transparent": ("transparent", "flag"),
    "--log": ("log", "value"),
    "--explain": ("explain", "flag"),
    "-q": ("quiet", "flag"),
    "--quiet": ("quiet", "flag"),
}
POLICY_IMPORT_OPTIONS = {"--workspace": ("workspace", "value")}
DOCTOR_OPTIONS = {"--json": ("json", "flag"), "--probe": ("probe", "flag")}
LOG_OPTIONS = {
    "--json": ("json", "flag"),
    "-n": ("n", "value"),
    "--log": ("log", "value"),
    "--net": ("net", "flag"),
    "--net-log": ("net_log", "value"),
    "--run": ("run", "value"),
    "--host": ("host", "value"),
    "--decision": ("decision", "value"),
}
SERVE_OPTIONS = {
    "--workers": ("workers", "value"),
    "--policy": ("policy", "value"),
    "--workspace": ("workspace", "value"),
    "--listen": ("listen", "value"),
    "--door": ("door", "value"),
    "--allow": ("allow", "list"),
    "--deny": ("deny", "list"),
    "--net-log": ("net_log", "value"),
    "-q": ("quiet", "flag"),
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
    if "settings" in opts:  # even --settings= : a file named, however badly, is never ignored
        policy = _settings_policy(str(opts["settings"]), "policy" in opts, workspace)
    else:
        policy = pol.load(
            str(workspace) if workspace else None, str(policy_path) if policy_path else None
        )
    flag_parsers = {
        "timeout": pol.parse_duration,
        "memory": pol.parse_memory,
        "pids": pol.parse_pids,
        "cpus": pol.parse_cpus,
        "tmp": pol.parse_scratch,
        "shm": pol.parse_scratch,
    }
    for attr, parser in flag_parsers.items():
        if attr in opts:
            try:
                policy.limits.assign(attr, opts[attr], parser)
            except ValueError as exc:
                raise CorralError(f"--{attr}: {exc}") from None
    if "output" in opts:
        try:
            policy.limits.output = pol.parse_size(opts["output"])
        except ValueError as exc:
            raise CorralError(f"--output-limit: {exc}") from None
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
    for attr, flag, parse_value in (
        ("engine", "--engine", pol._expect_engine),
        ("oci_runtime", "--oci-runtime", pol._expect_runtime),
        ("image", "--image", pol._expect_image),
    ):
        if attr in opts:
            try:
                value = parse_value(opts[attr])
            except ValueError as exc:
                raise CorralError(f"{flag}: {exc}") from None
            setattr(policy.container, "runtime" if attr == "oci_runtime" else attr, value)
    for attr in ("allow", "deny"):
        extra = opts.get(attr)
        if isinstance(extra, list):
            getattr(policy.network, attr).extend(extra)
    if opts.get("transparent"):
        policy.network.transparent = True
    if opts.get("allow") or policy.network.transparent:
        policy.network.mode = "proxy"
    if "network" in opts:
        if opts["network"] not in pol.NETWORK_MODES:
            raise CorralError(f"--network: expected one of {', '.join(pol.NETWORK_MODES)}")
        policy.network.mode = str(opts["network"])
    pol.check_network(policy)
    return policy


def pass_fds(opts: dict[str, object]) -> tuple[int, ...]:
    """The descriptors ``--pass-fd`` asks for: numbers above 2, open in this process."""
    values = opts.get("pass_fd")
    found: set[int] = set()
    for value in values if isinstance(values, list) else []:
        if not value.isdigit() or int(value) < 3:
            raise CorralError(
                f"--pass-fd {value}: expected a descriptor number above 2 (0, 1, 2 always pass)"
            )
        try:
            os.fstat(int(value))
        except OSError:
            raise CorralError(f"--pass-fd {value}: not an open descriptor") from None
        found.add(int(value))
    return tuple(sorted(found))


def _settings_policy(path: str, with_policy: bool, workspace: object) -> Policy:
    """srt's settings JSON in place of a policy file; flags still apply on top."""
    if with_policy:
        raise CorralError("--settings and --policy both give the policy: pass one of them")
    from corral import srt_settings

    return srt_settings.load(path, str(workspace) if workspace else None)


def cmd_policy(args: list[str]) -> int:
    """``corral policy import FILE.json``: srt's settings as corral.toml on stdout."""
    if not args or args[0] != "import":
        raise CorralError("usage: corral policy import [--workspace DIR] FILE.json")
    opts, files = parse(args[1:], POLICY_IMPORT_OPTIONS, positional=True)
    if len(files) != 1:
        raise CorralError("usage: corral policy import [--workspace DIR] FILE.json")
    from corral import srt_settings

    workspace = opts.get("workspace")
    sys.stdout.write(srt_settings.import_toml(files[0], str(workspace) if workspace else None))
    return 0


def cmd_run(args: list[str]) -> int:
    opts, command = parse(args, RUN_OPTIONS, positional=True)
    if not command:
        raise CorralError("nothing to run: corral run [OPTIONS] -- COMMAND [ARG...]")
    passed = pass_fds(opts)
    policy = build_policy(opts)
    from corral import launch, tiers

    tier, _health = tiers.select(policy.tier, policy)
    run_id = launch.new_run_id()
    if opts.get("explain"):
        door_path = None
        net = None
        if policy.network.mode == "proxy":
            door_path = "127.0.0.1:3128" if tier.door_transport == "tcp" else "/DOOR"
            net = _explained_extras(policy)
        print(tier.plan(policy, command, door=door_path, pass_fds=passed, net=net).describe())
        return 0
    door = _open_door(opts, policy, run_id, tier.door_transport) if tier.name != "none" else None
    try:
        return _run_plan(opts, policy, tier.name, command, run_id, door, passed)
    finally:
        if door is not None:
            door.close()


def _explained_extras(policy: Policy) -> NetExtras | None:
    """What --explain shows of a run that can intercept TLS: the CA bundle (named
    /DOOR/ca-bundle.pem, as the door is /DOOR) and the system paths it covers."""
    from corral.net.hooks import chain_for
    from corral.net.trust import BUNDLE_NAME, NetExtras, system_bundles

    if not chain_for(policy).may_inspect:
        return None
    return NetExtras(f"/DOOR/{BUNDLE_NAME}", system_bundles())


def cmd_shell(args: list[str]) -> int:
    """An interactive shell in a sandbox: the run options, then optionally -- SHELL."""
    opts, shell = parse(args, RUN_OPTIONS, positional=True)
    passed = pass_fds(opts)
    policy = build_policy(opts)
    from corral import launch, tiers
    from corral import shell as pty_shell

    tier, _health = tiers.select(policy.tier, policy)
    if tier.name == "none":
        raise CorralError("corral shell needs a sandbox tier, not none")
    if tier.name in ("container", "gvisor"):
        from corral.errors import RefusedError

        raise RefusedError(
            f"corral shell is not built for the {tier.name} tier yet "
            "(use corral run, or the Python API's Sandbox)"
        )
    run_id = launch.new_run_id()
    door = _open_door(opts, policy, run_id, tier.door_transport)
    try:
        argv = shell or [os.environ.get("SHELL") or "/bin/sh", "-i"]
        shell_argv = pty_shell.command(argv, tier.python_argv())
        plan = tier.plan(
            policy,
            shell_argv,
            door=door.address if door else None,
            pass_fds=passed,
            net=door.extras if door else None,
        )
        if not opts.get("quiet"):
            _err(f"corral: shell in a {tier.name} sandbox; workspace {policy.workspace}")
            from corral.bounds import notice

            if notice(plan):  # the defaults this host cannot enforce for this user
                _err(f"corral: note: {notice(plan)}")
        return pty_shell.run(plan, run_id)
    finally:
        if door is not None:
            door.close()


def cmd_mcp(args: list[str]) -> int:
    """An MCP server on stdio whose tools act on one long-lived sandbox."""
    opts, _ = parse(args, RUN_OPTIONS, positional=False)
    if opts.get("pass_fd"):
        raise CorralError("--pass-fd is for corral run and corral shell, not mcp")
    policy = build_policy(opts)
    try:
        import mcp.server.mcpserver  # noqa: F401  (the SDK, checked before a sandbox starts)

        from corral import mcp_server
    except ImportError:
        from corral.errors import RefusedError

        raise RefusedError("corral mcp needs the mcp package: pip install 'corral[mcp]'") from None
    from corral.sandbox import Sandbox

    # stdout carries the protocol: nothing else may be printed there
    with Sandbox(policy) as sb:
        mcp_server.serve(sb)
    return 0


def _open_door(opts: dict[str, object], policy: Policy, run_id: str, transport: str) -> Door | None:
    if policy.network.mode != "proxy":
        return None  # and corral.net stays unimported: it costs milliseconds
    from corral.net.door import open_door

    net_log = opts.get("net_log")
    return open_door(policy, run_id, str(net_log) if net_log else None, transport)


def _run_plan(
    opts: dict[str, object],
    policy: Policy,
    tier_name: str,
    command: list[str],
    run_id: str,
    door: Door | None,
    passed: tuple[int, ...] = (),
) -> int:
    import time

    from corral import bounds, launch, runlog, tiers

    plan = tiers.get(tier_name).plan(
        policy,
        command,
        door=door.address if door else None,
        pass_fds=passed,
        net=door.extras if door else None,
    )
    quiet = bool(opts.get("quiet"))
    if plan.warning:
        _err(plan.warning)
    elif policy.tier == "auto" and not quiet:
        _err(f"corral: tier {tier_name} (auto: strongest available here)")
    for note in plan.notes:
        if not quiet:
            _err(f"corral: note: {note}")
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
        "network": policy.network.mode,
        "bounds": bounds.record(plan),  # each limit: value, source, enforced
    }
    if plan.notes:  # what the plan decided beyond the policy (hard links made read-only...)
        record["notes"] = plan.notes
    if passed:
        record["pass_fds"] = list(passed)
    try:
        result = launch.run(plan, run_id)
    except CorralError as exc:
        record.update(end=runlog.iso(time.time()), exit=exc.code, error=exc.message)
        _log(record, log_path)
        raise
    late = bounds.skipped_at_setup(plan)  # a default's cgroup could not be set up
    if late:
        record["bounds"] = bounds.record(plan)
        if not quiet:
            _err(f"corral: note: {late}")
    if door is not None:
        from corral.net.audit import summary_line

        tally = door.close()
        if tally:
            result.denials.append(summary_line(tally))
        record["proxy_errors"] = door.errors  # details: net.jsonl, decision "error"
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
        _err(f"corral: {denial}")
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
    defaults = _defaults_report(rows)
    if opts.get("json"):
        import json

        print(
            json.dumps(
                {
                    "auto": auto,
                    "tiers": [
                        {"name": t.name, "summary": t.summary, **h.to_dict()} for t, h in rows
                    ],
                    "defaults": defaults,
                },
                indent=2,
            )
        )
        return 0
    width = max(len(t.name) for t, _ in rows)
    for tier, health in rows:
        state = "available" if health.available else "unavailable"
        print(f"{tier.name:<{width}}  {state:<11}  {health.reason}")
        differences = health.details.get("differences")
        if health.available and isinstance(differences, list):
            print(f"{'':<{width}}  compared with namespace:")
            for line in differences:
                print(f"{'':<{width}}    - {line}")
    print(f"auto -> {auto or 'nothing (corral run will refuse)'}")
    from corral.bounds import report_lines

    for line in report_lines(defaults):
        print(line)
    print(_tls_line())
    return 0


def _tls_line() -> str:
    """TLS inspection: the package it needs, and the user's CA."""
    import importlib.metadata

    from corral.net.trust import USER_CA
    from corral.runlog import state_dir

    try:
        version = importlib.metadata.version("cryptography")
    except importlib.metadata.PackageNotFoundError:
        return "tls inspection: unavailable (the cryptography package is not installed)"
    path = os.path.join(state_dir(), USER_CA)
    where = path if os.path.exists(path) else f"{path} (made on first use)"
    return f"tls inspection: cryptography {version}; corral's CA {where}"


def _defaults_report(rows: list[tuple[Tier, Health]]) -> dict[str, dict[str, object]]:
    """The default limits, and whether each tier enforces them here for this user."""
    from corral.bounds import host_report

    engine = problem = None
    if any(t.name == "container" and h.available for t, h in rows):
        from corral.container.engine import find, limits_problem

        eng, _ = find()
        if eng is not None:
            engine, problem = eng.name, limits_problem(eng, ["memory", "pids"])
    return host_report(engine or "", problem)


def cmd_log(args: list[str]) -> int:
    opts, _ = parse(args, LOG_OPTIONS, positional=False)
    from corral import runlog

    try:
        count = int(str(opts.get("n", 20)))
    except ValueError:
        count = -1
    if count < 0:
        raise CorralError("-n needs a whole number, 0 or more")
    if opts.get("net"):
        return _log_net(opts, count)
    records = list(runlog.read(str(opts["log"]) if opts.get("log") else None))
    records = records[-count:] if count else []
    if opts.get("json"):
        return _print_json_lines(records)
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
        if r.get("proxy_errors"):
            extra += f"  proxy errors: {r['proxy_errors']} (corral log --net --decision error)"
        duration = r.get("duration")
        dur = f"{duration:.3f}s" if isinstance(duration, int | float) else "-"
        start, run_id, tier, code = (
            str(r.get(k) if r.get(k) is not None else "?")
            for k in ("start", "run_id", "tier", "exit")
        )
        print(f"{start}  {run_id}  {tier:<9}  exit {code:<3}  {dur:>8}  {command[:80]}{extra}")
    return 0


def _print_json_lines(records: list[dict[str, object]]) -> int:
    import json

    for record in records:
        print(json.dumps(record))
    return 0


def _log_net(opts: dict[str, object], count: int) -> int:
    from corral import runlog
    from corral.net.audit import default_path

    path = str(opts["net_log"]) if opts.get("net_log") else default_path()
    decision = opts.get("decision")
    if decision not in (None, "allow", "deny", "error"):
        raise CorralError("--decision: expected allow, deny or error")
    records = [
        r
        for r in runlog.read(path)
        if (not opts.get("run") or str(r.get("run_id", "")).startswith(str(opts["run"])))
        and (not opts.get("host") or r.get("host") == opts["host"])
        and (decision is None or r.get("decision") == decision)
    ]
    # each proxy worker writes its own batches: order by the time of each request
    records.sort(key=lambda r: str(r.get("time", "")))
    records = records[-count:] if count else []
    if opts.get("json"):
        return _print_json_lines(records)
    for r in records:
        what = f"{r.get('method') or ''} {r.get('path') or ''}".strip() or str(r.get("scheme"))
        print(
            f"{r.get('time', '?')}  {r.get('run_id', '?')}  {r.get('decision', '?'):<5}  "
            f"{r.get('host')}:{r.get('port')}  {what[:60]}  rule={r.get('rule')}  "
            f"status={r.get('status')}  up={r.get('bytes_up')} down={r.get('bytes_down')}"
        )
    return 0


def cmd_proxy(args: list[str]) -> int:
    if not args or args[0] != "serve":
        raise CorralError("usage: corral proxy serve [--listen HOST:PORT] [--door PATH] ...")
    opts, _ = parse(args[1:], SERVE_OPTIONS, positional=False)
    policy = build_policy({**opts, "network": "proxy"})
    import signal
    import socket

    def stop_early(signum: int, _frame: object) -> None:
        raise SystemExit(0)  # a stop before the event loop runs is still a clean stop

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop_early)

    from corral.launch import new_run_id
    from corral.net.audit import default_path
    from corral.net.door import quiet_stderr

    run_id = "serve-" + new_run_id()
    try:
        workers = int(str(opts.get("workers") or min(4, os.cpu_count() or 1)))
    except ValueError:
        raise CorralError("--workers needs a whole number") from None
    ca = _serve_ca(policy)  # before forking: every worker signs with it
    listen = str(opts.get("listen") or ("" if opts.get("door") else "127.0.0.1:3128"))
    sockets: list[socket.socket] = []
    if listen:
        host, _, port = listen.rpartition(":")
        try:
            tcp = socket.create_server(
                (host.strip("[]") or "127.0.0.1", int(port)), backlog=1024, reuse_port=False
            )
        except (OSError, ValueError) as exc:
            raise CorralError(f"--listen {listen}: {exc}") from None
        sockets.append(tcp)
    door = str(opts["door"]) if opts.get("door") else None
    if door:
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            unix.bind(door)
        except OSError as exc:
            raise CorralError(f"--door {door}: {exc.strerror}") from None
        unix.listen(1024)
        sockets.append(unix)
    from corral.net.hooks import chain_for

    chain = chain_for(policy)
    chain.open()  # secrets are read here, once: a missing one stops before any worker
    where = " and ".join(x for x in (listen, door) if x)
    _err(f"corral: proxy on {where} (HTTP and SOCKS5), {workers} worker(s), run id {run_id}")
    audit_path = str(opts["net_log"]) if opts.get("net_log") else default_path()
    life_r, life_w = os.pipe()
    children = []
    for _ in range(workers - 1):
        pid = os.fork()
        if pid == 0:
            os.close(life_w)
            code = 0
            try:
                quiet_stderr()  # the first worker speaks for all of them
                _proxy_worker(policy, chain, sockets, run_id, audit_path, life_r, ca)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        children.append(pid)
    os.close(life_r)
    try:
        _proxy_worker(policy, chain, sockets, run_id, audit_path, None, ca)
    finally:
        os.close(life_w)  # the other workers see end-of-file and stop
        for pid in children:
            os.waitpid(pid, 0)
        if door:
            try:
                os.unlink(door)
            except OSError:
                pass
    return 0


def _serve_ca(policy: Policy) -> CA | None:
    """``proxy serve``'s CA when its policy intercepts (its clients must trust the
    certificate file named on stderr), else None."""
    from corral.net.hooks import chain_for

    if not chain_for(policy).may_inspect:
        return None
    if policy.tls.ca == "ephemeral" and not policy.tls.ca_cert:
        raise CorralError(
            'tls.ca = "ephemeral" is for runs: a served proxy\'s clients must trust a CA '
            "they can find (the user's CA, or ca_cert / ca_key)"
        )
    from corral.net.door import _open_ca

    ca = _open_ca(policy)
    if ca.origin == "user":
        from corral.net.ca import user_ca_cert
        from corral.runlog import state_dir

        shown = user_ca_cert(state_dir())
    else:
        shown = policy.tls.ca_cert
    _err(f"corral: TLS inspection on: clients must trust {shown}")
    return ca


def _proxy_worker(
    policy: Policy,
    chain: Chain,
    sockets: list[socket.socket],
    run_id: str,
    audit_path: str,
    life_r: int | None,
    ca: CA | None = None,
) -> None:
    """One proxy process serving pre-bound sockets until a signal (or, for the extra
    workers, until the first worker closes the life pipe)."""
    import asyncio
    import signal
    import socket

    from corral.net.audit import Audit, guard_process
    from corral.net.proxy import Proxy, run_loop

    audit = Audit(audit_path)
    guard_process(audit, run_id)

    async def serve() -> None:
        tls = None
        if ca is not None:
            from corral.net.tls import Interceptor

            tls = Interceptor(ca, policy.tls.upstream_ca)
        proxy = Proxy(chain, audit, policy.network.hosts, tls=tls)
        proxy.guard(run_id)  # an unexpected exception: one audit line, not a traceback
        for sock in sockets:
            if sock.family == socket.AF_UNIX:
                # a relay's internal frames only where a transparent relay can be
                await proxy.serve_unix(sock, run_id, policy.network.transparent)
            else:
                await proxy.serve_sock(sock, run_id)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        if life_r is None:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
        else:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the first worker decides
            loop.add_reader(life_r, stop.set)
        await stop.wait()

    try:
        run_loop(serve())
    finally:
        audit.close()


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
        commands = {
            "run": cmd_run,
            "shell": cmd_shell,
            "mcp": cmd_mcp,
            "doctor": cmd_doctor,
            "log": cmd_log,
            "proxy": cmd_proxy,
            "policy": cmd_policy,
        }
        if args[0] not in commands:
            raise CorralError(
                f"unknown command {args[0]!r} (run, doctor, log, proxy, policy; see corral --help)"
            )
        return commands[args[0]](args[1:])
    except CorralError as exc:
        _err(f"corral: {exc.message}")
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # our reader went away (`corral doctor --json | head`): end as a pipeline would
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # nothing more to flush at exit
        except OSError:
            pass
        return 128 + 13  # SIGPIPE
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
