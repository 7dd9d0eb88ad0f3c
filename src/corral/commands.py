"""Every ``corral`` command but ``run``: shell, mcp, agent, doctor, log, proxy,
policy, home, rules, pending, approve, deny, batch and k8s.

:mod:`corral.cli` parses and dispatches; ``run`` and what it shares with
``shell`` and ``mcp`` (the policy from flags, the door, the closing lines) live
there, on the hot path.  These are imported only when one of them is asked
for, so ``corral run`` never loads their code.
"""

from __future__ import annotations

import os
import sys

from corral.cli import (
    APPROVE_OPTIONS,
    BATCH_OPTIONS,
    COMMANDS,
    DENY_OPTIONS,
    DOCTOR_OPTIONS,
    HOME_OPTIONS,
    K8S_OPTIONS,
    LOG_OPTIONS,
    MCP_OPTIONS,
    NOT_FOR_MCP,
    NOT_FOR_SHELL,
    PENDING_OPTIONS,
    POLICY_IMPORT_OPTIONS,
    RULES_OPTIONS,
    SERVE_OPTIONS,
    SETUP_ATTEMPTS,
    SHELL_OPTIONS,
    HelpRequested,
    _err,
    _explain,
    _failed,
    _finish,
    _open_door,
    _record,
    _ShellResult,
    build_policy,
    parse,
    pass_fds,
    plan_with_door,
    planned_again,
    refuse_unpassable,
    refuse_unused_flags,
)
from corral.errors import CorralError, PolicyError, SetupRaced, plain

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket

    from corral.net.ca import CA
    from corral.net.door import Door
    from corral.net.hooks import Chain
    from corral.net.trust import UpstreamTrust
    from corral.policy import Policy
    from corral.tiers.base import Health, Plan, Tier


# exit codes of commands that answer (usage text); CorralError carries them
EXIT_NOT_WAITING = 1


def cmd_policy(args: list[str]) -> int:
    """``corral policy import FILE.json``: srt's settings as corral.toml on stdout."""
    if args[:1] in (["-h"], ["--help"]):
        raise HelpRequested("policy")
    if not args or args[0] != "import":
        raise CorralError("usage: corral policy import [--workspace DIR] FILE.json")
    opts, files = parse(args[1:], POLICY_IMPORT_OPTIONS, positional=True, command="policy import")
    if len(files) != 1:
        raise CorralError("usage: corral policy import [--workspace DIR] FILE.json")
    from corral import srt_settings

    workspace = opts.get("workspace")
    sys.stdout.write(srt_settings.import_toml(files[0], str(workspace) if workspace else None))
    return 0


def cmd_home(args: list[str]) -> int:
    """``corral home path|list|clean``: the home layers (corral.home)."""
    usage = (
        "usage: corral home path|list|clean|put FILE [--workspace DIR | --gone | --all] "
        "[--container]"
    )
    if args[:1] in (["-h"], ["--help"]):
        raise HelpRequested("home")
    if not args or args[0] not in ("path", "list", "clean", "put"):
        raise CorralError(usage)
    named = args[1:2] if args[0] == "put" and args[1:2] and not args[1].startswith("-") else []
    opts, rest = parse(
        args[1 + len(named) :], HOME_OPTIONS, positional=False, command=f"home {args[0]}"
    )
    if rest or (args[0] == "put" and not named):
        raise CorralError(usage)
    from corral import home, homeseed

    which = [o for o in ("workspace", "all", "gone") if o in opts]
    if len(which) > 1 or (args[0] != "clean" and which[:1] in (["all"], ["gone"])):
        raise CorralError("--all and --gone are for corral home clean, instead of --workspace")
    if opts.get("container") and args[0] not in ("path", "put"):
        raise CorralError("--container is for corral home path and put")
    workspace = os.path.realpath(str(opts.get("workspace") or os.getcwd()))
    if args[0] in ("path", "put"):  # a layer no run could use: refused, as corral run is
        from corral.policy import check_workspace, home_dirs

        check_workspace(workspace, home_dirs())
    layer = home.layer_path(workspace, "container" if opts.get("container") else "host")
    if args[0] == "path":
        print(layer)
        return 0
    if args[0] == "put":
        try:
            home.put(layer, named[0], sys.stdin.buffer.read())
        except (OSError, home.HomeError) as exc:
            raise CorralError(str(exc)) from None
        return 0
    if args[0] == "list":
        for path in homeseed.all_layers():
            owner = homeseed.manifest_workspace(path + ".seed") or "?"
            print(f"{path}  {homeseed.size_of(path) >> 10} KiB  workspace {owner}")
        return 0
    if opts.get("all"):
        found, what = homeseed.all_layers(), "any workspace"
    elif opts.get("gone"):
        found, what = homeseed.gone_layers(), "a workspace that is gone"
    else:
        found, what = homeseed.layers_of(workspace), workspace
    left = []
    for path in found:
        if home.remove(path):
            print(f"removed {path}")
        else:
            left.append(path)
    if left:  # (never "removed" for a layer a run made hard to remove: it kept its plants)
        raise CorralError(f"could not remove all of {', '.join(left)}: look at what is left", 1)
    if not found:
        _err(f"corral: no home layer for {what}")
    return 0


def cmd_rules(args: list[str]) -> int:
    """``corral rules list|check|hash|pull``: corral.rulescli."""
    if args[:1] in (["-h"], ["--help"]):
        raise HelpRequested("rules")
    if not args or args[0] not in ("list", "check", "hash", "pull"):
        raise CorralError("usage: " + "corral rules " + COMMANDS["rules"][0])
    command, rest = args[0], args[1:]
    opts: dict[str, object] = {}
    positional: list[str] = []
    while rest:  # options may come before or after the arguments
        found, rest = parse(rest, RULES_OPTIONS, positional=True, command=f"rules {command}")
        for key, value in found.items():
            if isinstance(value, list):
                existing = opts.setdefault(key, [])
                assert isinstance(existing, list)
                existing.extend(value)
            else:
                opts[key] = value
        if rest:
            positional.append(rest[0])
            rest = rest[1:]
    from corral import rulescli

    return rulescli.run(command, opts, positional)


def cmd_shell(args: list[str]) -> int:
    """An interactive shell in a sandbox: the run options, then optionally -- SHELL."""
    opts, shell = parse(args, SHELL_OPTIONS, True, command="shell", refused=NOT_FOR_SHELL)
    passed = pass_fds(opts)
    policy = build_policy(opts)
    from corral import launch, tiers

    tier, _health = tiers.select(policy.tier, policy)
    refuse_unused_flags(opts, tier)
    if not tier.strategy.confines:
        raise CorralError(f"corral shell needs a sandbox tier, not {tier.name}")
    refuse_unpassable(passed, tier)
    if tier.strategy.shell:
        from corral.errors import RefusedError

        raise RefusedError(tier.strategy.shell)
    argv = shell or [os.environ.get("SHELL") or "/bin/sh", "-i"]
    shell_argv = tier.strategy.shell_command(argv, tier.python_argv())
    if opts.get("explain"):
        return _explain(tier, policy, shell_argv, passed, shell_timeout)
    run_id = launch.new_run_id()

    def attempt(number: int) -> int:
        # a door per attempt: a raced one's proxy took that attempt's listeners
        door = _open_door(opts, policy, run_id, tier.door_transport)
        try:
            return _shell_once(opts, policy, tier, argv, shell_argv, passed, run_id, door, number)
        finally:
            if door is not None:
                door.close()

    return planned_again(attempt)


def shell_timeout(plan: Plan) -> str:
    """A policy's ``[limits] timeout`` is not applied to a shell, as ``--timeout``
    is refused there: an interactive session ends when its user leaves it, and
    one killed mid-command by a wall clock loses what was typed.  The policy
    file is shared by corral run, shell and mcp, so its value is no mistake to
    refuse (as ``[container]`` stays config for other tiers): the plan's bound
    is marked not enforced (the activity log and --explain say so) and the
    line to say once on stderr is returned ("" without a timeout)."""
    timeout = plan.policy.limits.timeout
    if not timeout:
        return ""
    from corral.bounds import value_text

    why = "an interactive shell ends when you leave it"
    bound = plan.bounds.get("timeout")
    if bound is not None:
        bound.enforced, bound.how = False, why
    return (
        f"the policy's [limits] timeout ({value_text('timeout', timeout)}) does not apply "
        f"to corral shell: {why} (corral run applies it)"
    )


def _shell_once(
    opts: dict[str, object],
    policy: Policy,
    tier: Tier,
    argv: list[str],
    shell_argv: list[str],
    passed: tuple[int, ...],
    run_id: str,
    door: Door | None,
    attempt: int,
) -> int:
    from corral import shell as pty_shell

    plan = plan_with_door(tier, policy, shell_argv, door, passed)
    if not opts.get("quiet") and attempt == 1:
        _err(f"corral: shell in a {tier.name} sandbox; workspace {policy.workspace}")
        from corral.bounds import notice

        if notice(plan):  # the defaults this host cannot enforce for this user
            _err(f"corral: note: {notice(plan)}")
    unapplied = shell_timeout(plan)
    if unapplied and not opts.get("quiet") and attempt == 1:
        _err(f"corral: note: {unapplied}")
    record = _record(plan, run_id, "shell", argv)
    import time

    began = time.monotonic()
    try:
        code, found, signum = pty_shell.run(plan, run_id)
    except CorralError as exc:
        if not (isinstance(exc, SetupRaced) and attempt < SETUP_ATTEMPTS):
            _failed(opts, record, exc)  # a run planned again is recorded once, by its last
        raise
    ended = _ShellResult(code, time.monotonic() - began, signum)
    return _finish(opts, plan, record, code, found, door, ended)


def cmd_mcp(args: list[str]) -> int:
    """An MCP server on stdio whose tools act on one long-lived sandbox."""
    opts, _ = parse(args, MCP_OPTIONS, False, command="mcp", refused=NOT_FOR_MCP)
    try:
        policy = build_policy(opts)
    except PolicyError as exc:
        if opts.get("workspace") or "the workspace cannot be" not in exc.message:
            raise
        # MCP clients often start their servers in / or the home directory
        raise PolicyError(f"{exc.message}; give the server --workspace DIR") from None
    try:
        import mcp.server.lowlevel  # noqa: F401  (the SDK, checked before a sandbox starts)

        from corral import mcp_server
    except ImportError:
        from corral.errors import RefusedError

        raise RefusedError("corral mcp needs the mcp package: pip install 'corral[mcp]'") from None
    import anyio

    from corral.sandbox import AsyncSandbox

    # stdout carries the protocol: nothing else may be printed there; stderr is
    # the server's log, where the tier line and notes go as for corral run
    log = opts.get("log")
    sb = AsyncSandbox(policy, log=str(log) if log else None, kind="mcp")

    async def main() -> None:
        async with sb:
            if not opts.get("quiet"):
                _err(
                    f"corral: mcp server on a {sb.tier.name} sandbox; workspace {policy.workspace}"
                )
                for note in sb.notes:
                    _err(f"corral: note: {plain(note)}")
            await mcp_server.serve(sb)

    anyio.run(main)
    for denial in sb.denials:
        if denial.text:
            _err(f"corral: {denial.text}")
    return 0


def cmd_agent(args: list[str]) -> int:
    """``corral agent run|serve|log`` (corral.agentcli)."""
    from corral import agentcli

    return agentcli.main(args)


def cmd_batch(args: list[str]) -> int:
    # options before or after the jobs file
    opts, rest = parse(args, BATCH_OPTIONS, positional=True, command="batch")
    if rest:
        more, extra = parse(rest[1:], BATCH_OPTIONS, positional=True, command="batch")
        opts.update(more)
        rest = rest[:1] + extra
    if len(rest) != 1:
        raise CorralError("usage: corral batch " + COMMANDS["batch"][0])
    from corral import batch

    return batch.main(opts, rest[0])


def cmd_doctor(args: list[str]) -> int:
    opts, _ = parse(args, DOCTOR_OPTIONS, positional=False, command="doctor")
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
    from corral.homeseed import report

    home_report = report()
    from corral import placement

    places = [(n, *placement.get(n).health()) for n in placement.names()]
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
                    "home": home_report,
                    "placements": [
                        {"name": n, "available": ok, "reason": why} for n, ok, why in places
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
        differences = health.details.get("differences")
        if health.available and isinstance(differences, list):
            print(f"{'':<{width}}  compared with namespace:")
            for line in differences:
                print(f"{'':<{width}}    - {line}")
    print(f"auto -> {auto or 'nothing (corral run will refuse)'}")
    print("placements (where a sandbox runs, apart from how it is isolated):")
    for name, ok, why in places:
        print(f"  {name:<{width}}  {'available' if ok else 'unavailable':<11}  {why}")
    from corral.bounds import report_lines

    for line in report_lines(defaults):
        print(line)
    print(f"home layers ({home_report.pop('layers')}; corral home list):")
    for kind, text in home_report.items():
        print(f"  {kind}: {text}")
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

    for tier, health in rows:
        found = tier.limits_engine() if health.available else None
        if found is not None:
            return host_report(*found)
    return host_report("", None)


def cmd_log(args: list[str]) -> int:
    opts, _ = parse(args, LOG_OPTIONS, positional=False, command="log")
    from corral import runlog

    try:
        count = int(str(opts.get("n", 20)))
    except ValueError:
        count = -1
    if count < 0:
        raise CorralError("-n needs a whole number, 0 or more")
    if opts.get("net"):
        if "log" in opts:
            raise CorralError("--log is the activity log; with --net, name the audit log --net-log")
        return _log_net(opts, count)
    for name in ("net_log", "host", "decision"):
        if name in opts:
            flag = "--" + name.replace("_", "-")
            raise CorralError(f"{flag} filters the network audit log: use it with --net")
    run = str(opts.get("run") or "")
    workspace = os.path.realpath(str(opts["workspace"])) if opts.get("workspace") else None
    records = [
        r
        for r in runlog.read(str(opts["log"]) if opts.get("log") else None)
        if str(r.get("run_id", "")).startswith(run)
        and (workspace is None or r.get("workspace") == workspace)
    ]
    records = records[-count:] if count else []
    if opts.get("json"):
        return _print_json_lines(records)
    if not records and count:  # (a new user saw nothing at all, and wondered)
        where = str(opts["log"]) if opts.get("log") else runlog.default_path()
        there = f" in workspace {workspace}" if workspace else ""
        _err(f"corral: no run{' ' + run if run else ''}{there} recorded in {where}")
    for r in records:
        command = _shown_command(r)
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
        start, run_id, tier = (
            str(r.get(k) if r.get(k) is not None else "?") for k in ("start", "run_id", "tier")
        )
        line = f"{start}  {run_id}  {tier:<9}  {_outcome(r):<8}  {dur:>8}  {command[:80]}{extra}"
        print(plain(line))  # an agent's command may hold terminal controls
        if run and isinstance(denials, list):  # one run asked for: what it refused, too
            for d in denials:
                said = d.get("line") if isinstance(d, dict) else None
                print("    " + plain(str(said) if said else json_line(d)))
    return 0


def json_line(value: object) -> str:
    import json

    return json.dumps(value, sort_keys=True)


def _outcome(r: dict[str, object]) -> str:
    """``exit N`` for a run; a long-lived sandbox (many commands, each with its own
    code) is ``closed``, or ``open`` while it runs or if its process died."""
    if r.get("exit") is not None:
        return f"exit {r['exit']}"
    if r.get("kind") == "sandbox":
        return "closed" if r.get("end") else "open"
    return "exit ?"


def _shown_command(r: dict[str, object]) -> str:
    """A record's command for ``corral log``: the argv, or what a sandbox ran."""
    argv = r.get("argv")
    command = " ".join(str(a) for a in argv) if isinstance(argv, list) else ""
    kind = r.get("kind")
    if kind in ("sandbox", "mcp"):
        execs = r.get("execs")
        return f"[{kind}: {execs if isinstance(execs, int) else 0} command(s)]"
    if kind == "shell":
        return f"[shell] {command}"
    return command


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
    if decision not in (None, "allow", "deny", "ask", "error"):
        raise CorralError("--decision: expected allow, deny, ask or error")
    import heapq

    wanted = (
        (str(r.get("time", "")), n, r)
        for n, r in enumerate(runlog.read(path))
        if (not opts.get("run") or str(r.get("run_id", "")).startswith(str(opts["run"])))
        and (not opts.get("host") or r.get("host") == opts["host"])
        and (decision is None or r.get("decision") == decision)
    )
    # each proxy worker writes its own batches: the last by the time of each request,
    # holding no more than those (a sandbox can write hundreds of MB of lines: 455 MB
    # of memory for a 60 MB log once, found by attacking corral)
    records = [r for _, _, r in sorted(heapq.nlargest(count, wanted, key=lambda t: t[:2]))]
    if opts.get("json"):
        return _print_json_lines(records)
    for r in records:
        what = f"{r.get('method') or ''} {r.get('path') or ''}".strip() or str(r.get("scheme"))
        if r.get("event"):  # an approval's line (corral.net.approvals)
            what = f"{r['event']} {r.get('answer') or r.get('scope') or what}"
        if r.get("decision") == "note":  # the log's own (its bound, corral.net.audit)
            print(plain(f"{r.get('time', '?')}  {r.get('run_id', '?')}  note   {r.get('reason')}"))
            continue
        # (no host: refused before it named one, a malformed request)
        where = f"{r.get('host')}:{r.get('port')}" if r.get("host") else "-"
        line = (  # the host, method and path are the sandbox's: plain text only
            f"{r.get('time', '?')}  {r.get('run_id', '?')}  {r.get('decision', '?'):<5}  "
            f"{where}  {what[:60]}  rule={r.get('rule')}  "
            f"status={r.get('status')}  up={r.get('bytes_up')} down={r.get('bytes_down')}"
        )
        print(plain(line))
    return 0


def _control_dir() -> str:
    from corral.errors import RefusedError
    from corral.net.asking import control_dir

    try:
        return control_dir()
    except FileNotFoundError:
        return ""  # no run of this user has ever asked
    except OSError as exc:
        raise RefusedError(f"approvals: {exc.strerror or exc}") from None


def cmd_pending(args: list[str]) -> int:
    opts, _ = parse(args, PENDING_OPTIONS, positional=False, command="pending")
    from corral.net.asking import list_pending

    directory = _control_dir()
    try:
        held = list_pending(directory) if directory else []
    except PermissionError as exc:
        raise CorralError(str(exc), EXIT_NOT_WAITING) from None
    if opts.get("json"):
        from corral.runlog import dumps

        for item in held:
            print(dumps(item))
        return 0
    if not held:
        _err("corral: no request is waiting for an answer")
        return 0
    from corral.net.asking import cut, served_as

    print(f"{'ID':<9} {'RUN':<19} {'AGE':>5}  {'METHOD':<7} {'HOST':<24} {'TARGET':<28} RULE")
    for item in held:
        host = f"{item.get('host')}:{item.get('port')}"
        age = f"{float(item.get('age', 0) or 0):.0f}s"  # type: ignore[arg-type]
        target = str(item.get("target") or item.get("path"))  # as sent: its query too
        line = (  # the method and target are the sandbox's: plain text only
            f"{item.get('id')!s:<9} {item.get('run')!s:<19} {age:>5}  {item.get('method')!s:<7} "
            f"{host:<24} {cut(target, 100):<28} {item.get('rule')}"
        )
        also = item.get("also")
        if isinstance(also, list) and also:  # served as these too (override headers...)
            line += f"  (also served as: {served_as([str(a) for a in also])})"
        print(plain(line))
    return 0


def cmd_approve(args: list[str]) -> int:
    opts, rest = parse(args, APPROVE_OPTIONS, positional=True, command="approve")
    from corral.net.asking import Decision, check_glob

    seconds = None
    path = None
    if "for_" in opts:
        from corral.policy import parse_duration

        try:
            seconds = parse_duration(opts["for_"])
        except ValueError as exc:
            raise CorralError(f"--for: {exc}") from None
    if "path" in opts:
        if seconds is None:
            raise CorralError("--path: only with --for (a grant's scope)")
        try:
            path = check_glob(str(opts["path"]))
        except ValueError as exc:
            raise CorralError(f"--path: {exc}") from None
    return _answer("approve", rest, Decision(True, seconds, path))


def cmd_deny(args: list[str]) -> int:
    _, rest = parse(args, DENY_OPTIONS, positional=True, command="deny")
    from corral.net.asking import Decision

    return _answer("deny", rest, Decision.deny())


def _answer(command: str, rest: list[str], decision: object) -> int:
    from corral.net.asking import Decision, send_answer

    assert isinstance(decision, Decision)
    if len(rest) != 1:
        raise CorralError(f"usage: corral {command} {COMMANDS[command][0]} (see corral pending)")
    directory = _control_dir()
    problem = (
        send_answer(directory, rest[0], decision, f"corral {command}")
        if directory
        else f"no request {rest[0]!r} is waiting (see corral pending)"
    )
    if problem:
        raise CorralError(problem, EXIT_NOT_WAITING)
    print(f"{'approved' if decision.allow else 'denied'} {plain(rest[0])}")
    return 0


def cmd_proxy(args: list[str]) -> int:
    if args[:1] in (["-h"], ["--help"]):
        raise HelpRequested("proxy")
    if not args or args[0] != "serve":
        raise CorralError("usage: corral proxy serve [--listen HOST:PORT] [--door PATH] ...")
    opts, _ = parse(args[1:], SERVE_OPTIONS, positional=False, command="proxy serve")
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
    per_worker: list[socket.socket] = []  # one TCP listener each (SO_REUSEPORT)
    if listen:
        per_worker = _listeners(listen, workers)
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
    if not opts.get("quiet"):
        _err(f"corral: proxy on {where} (HTTP and SOCKS5), {workers} worker(s), run id {run_id}")
    audit_path = str(opts["net_log"]) if opts.get("net_log") else default_path()
    life_r, life_w = os.pipe()
    children = []
    for index in range(1, workers):
        pid = os.fork()
        if pid == 0:
            os.close(life_w)
            code = 0
            try:
                quiet_stderr()  # the first worker speaks for all of them
                own = _own_listener(per_worker, index)
                _proxy_worker(policy, chain, own + sockets, run_id, audit_path, life_r, ca)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        children.append(pid)
    os.close(life_r)
    try:
        own = _own_listener(per_worker, 0)
        _proxy_worker(policy, chain, own + sockets, run_id, audit_path, None, ca)
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


def cmd_k8s(args: list[str]) -> int:
    """``corral k8s render``: the policy as Kubernetes objects, JSON on stdout (corral.k8s)."""
    usage = "usage: corral k8s " + COMMANDS["k8s"][0]
    if args[:1] in (["-h"], ["--help"]):
        raise HelpRequested("k8s")
    if not args or args[0] != "render":
        raise CorralError(usage)
    opts, rest = parse(args[1:], K8S_OPTIONS, positional=False, command="k8s render")
    if rest:
        raise CorralError(usage)
    import json

    from corral import k8s

    if opts.get("seccomp_profile"):
        sys.stdout.write(json.dumps(k8s.seccomp_profile(bool(opts.get("gvisor"))), indent=2) + "\n")
        return 0
    if not opts.get("policy"):
        raise CorralError("k8s render needs --policy FILE")
    if opts.get("template") and opts.get("sandbox"):
        raise CorralError("--template and --sandbox: give one of them")
    from corral import policy as policy_mod

    path = os.path.abspath(str(opts["policy"]))
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise CorralError(f"--policy {opts['policy']}: {exc.strerror}") from None
    policy = policy_mod.load(os.path.dirname(path), path)
    policy_mod.check_network(policy)
    kind = "template" if opts.get("template") else "sandbox" if opts.get("sandbox") else "pod"
    options = k8s.Options(
        image=str(opts.get("image") or policy.container.image),
        proxy_image=str(opts.get("proxy_image") or ""),
        name=str(opts.get("name") or "corral"),
        namespace=str(opts.get("namespace") or ""),
        gvisor=bool(opts.get("gvisor")),
        kind=kind,
        workspace_claim=str(opts.get("workspace_claim") or ""),
    )
    k8s.check_names(options)
    objects = k8s.render(policy, text, options)
    sys.stdout.write(json.dumps(k8s.as_list(objects), indent=2) + "\n")
    return 0


def _serve_ca(policy: Policy) -> tuple[CA, UpstreamTrust] | None:
    """``proxy serve``'s CA when its policy intercepts (its clients must trust the
    certificate file named on stderr), and what it trusts upstream; else None."""
    from corral.net.hooks import chain_for

    if not chain_for(policy).may_inspect:
        return None
    if policy.tls.ca == "ephemeral" and not policy.tls.ca_cert:
        raise CorralError(
            'tls.ca = "ephemeral" is for runs: a served proxy\'s clients must trust a CA '
            "they can find (the user's CA, or ca_cert / ca_key)"
        )
    from corral.net.door import _open_ca

    ca, trust = _open_ca(policy)
    if ca.origin == "user":
        from corral.net.ca import user_ca_cert
        from corral.runlog import state_dir

        shown = user_ca_cert(state_dir())
    else:
        shown = policy.tls.ca_cert
    _err(f"corral: TLS inspection on: clients must trust {shown}")
    return ca, trust


def _listeners(listen: str, count: int) -> list[socket.socket]:
    """``count`` TCP sockets listening on ``listen`` together (SO_REUSEPORT): the
    kernel spreads connections over the workers, where one shared socket lets
    whichever worker wakes first take a whole burst."""
    import socket

    host, _, port_text = listen.rpartition(":")
    address = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    made: list[socket.socket] = []
    try:
        port = int(port_text)
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            made.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((address, port))
            port = sock.getsockname()[1]  # port 0: the others join the one the first got
            sock.listen(1024)
    except (OSError, ValueError) as exc:
        for sock in made:
            sock.close()
        raise CorralError(f"--listen {listen}: {exc}") from None
    return made


def _own_listener(per_worker: list[socket.socket], index: int) -> list[socket.socket]:
    """Worker ``index``'s TCP listener (the others' closed in this process)."""
    for i, sock in enumerate(per_worker):
        if i != index:
            sock.close()
    return per_worker[index : index + 1]


def _proxy_worker(
    policy: Policy,
    chain: Chain,
    sockets: list[socket.socket],
    run_id: str,
    audit_path: str,
    life_r: int | None,
    ca: tuple[CA, UpstreamTrust] | None = None,
) -> None:
    """One proxy process serving pre-bound sockets until a signal (or, for the extra
    workers, until the first worker closes the life pipe)."""
    import signal
    import socket

    from corral.net import aio
    from corral.net.audit import Audit, guard_process
    from corral.net.proxy import Proxy, run_loop

    audit = Audit(audit_path)
    guard_process(audit, run_id)

    async def serve() -> None:
        tls = None
        if ca is not None:
            from corral.net.tls import Interceptor

            tls = Interceptor(*ca)
        proxy = Proxy(chain, audit, policy.network.hosts, tls=tls)
        proxy.guard(run_id)  # an unexpected exception: one audit line, not a traceback
        for sock in sockets:
            if sock.family == socket.AF_UNIX:
                await proxy.serve_unix(sock, run_id)  # a relay's frames too (a door)
            else:
                await proxy.serve_sock(sock, run_id)
        stop = aio.Event()
        loop = aio.get_running_loop()
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
