"""The ``corral`` command line: a thin face over policy, tiers and the launcher.

The argument parser is a small table-driven one rather than argparse: argparse
and its imports cost about 8 ms, a third of the budget of ``corral run -- true``.
"""

from __future__ import annotations

import os
import sys

from corral.errors import EXIT_INTERNAL, EXIT_USAGE, CorralError, SetupRaced

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from corral.launch import RunResult
    from corral.net.door import Door
    from corral.net.trust import NetExtras
    from corral.policy import Policy
    from corral.report import Denial
    from corral.tiers.base import Plan, Tier

# option -> (attribute, kind, metavar, help).  kind: "flag" takes no value, "list"
# repeats, "value" takes one.  The usage text is generated from these tables
# (corral.usage), so what --help says and what is parsed cannot drift apart.
Options = dict[str, tuple[str, str, str, str]]

RUN_OPTIONS: Options = {
    "--tier": (
        "tier",
        "value",
        "NAME",
        "auto (default: strongest available) or one of {tiers}",
    ),
    "--engine": (
        "engine",
        "value",
        "NAME",
        "container tier: podman or docker (default: $CORRAL_ENGINE, else the first found)",
    ),
    "--oci-runtime": (
        "oci_runtime",
        "value",
        "NAME",
        "container tier: runc (default), runsc (gVisor) or crun",
    ),
    "--image": (
        "image",
        "value",
        "REF",
        "container tier: the image (default: [container] image, $CORRAL_IMAGE)",
    ),
    "--policy": (
        "policy",
        "value",
        "FILE",
        "policy file (default: corral.toml in the workspace, if any)",
    ),
    "--policy-sha256": (
        "policy_sha256",
        "value",
        "HEX",
        "run only if the policy file still holds what has this SHA-256 (corral batch pins so)",
    ),
    "--settings": (
        "settings",
        "value",
        "FILE",
        "srt's settings JSON as the policy file (not with --policy)",
    ),
    "--workspace": ("workspace", "value", "DIR", "the writable workspace (default: cwd)"),
    "--timeout": (
        "timeout",
        "value",
        "DURATION",
        "wall-clock limit, e.g. 30s, 5m; kills the whole process tree",
    ),
    "--memory": ("memory", "value", "SIZE", "memory limit, e.g. 512M (default: half the RAM)"),
    "--pids": ("pids", "value", "N", "process (task) limit (default: 4096)"),
    "--cpus": ("cpus", "value", "N", "CPU limit, e.g. 1.5"),
    "--tmp": (
        "tmp",
        "value",
        "SIZE",
        "size of the private /tmp and of /var/tmp (default: RAM/4, 512M-4G)",
    ),
    "--shm": (
        "shm",
        "value",
        "SIZE",
        "size of the private /dev/shm (default: RAM/16, 64M-1G); "
        "{unbounded} take none: no bound at all",
    ),
    "--output-limit": (
        "output",
        "value",
        "SIZE",
        "bytes of stdout+stderr kept (default 64M); the rest is dropped",
    ),
    "--writable": ("writable", "list", "PATH", "another writable path (repeatable)"),
    "--home": (
        "home",
        "value",
        "MODE",
        "where writes under ~ go: persist (default: a per-workspace home layer, kept), "
        "ephemeral (a fresh one per run) or read-only",
    ),
    "--read-deny": ("read_deny", "list", "PATH", "another unreadable path (repeatable)"),
    "--write-deny": (
        "write_deny",
        "list",
        "PATH",
        "another read-only path inside a writable one (repeatable)",
    ),
    "--env": (
        "env",
        "list",
        "NAME[=VALUE]",
        "pass this variable from the environment, or set it to VALUE (repeatable); a value "
        "given here is in corral's own command line: pass secrets by NAME",
    ),
    "--pass-fd": (
        "pass_fd",
        "list",
        "N",
        "hand this open descriptor (above 2) to the command at the same number "
        "(repeatable); no other descriptor but 0, 1, 2 crosses",
    ),
    "--network": (
        "network",
        "value",
        "MODE",
        "none (default: no network) or proxy (only through corral's proxy)",
    ),
    "--allow": (
        "allow",
        "list",
        "HOST",
        "allow a destination through the proxy; implies --network proxy "
        "(example.org, *.example.org, host:443, 10.0.0.0/8, [::1]:8080)",
    ),
    "--deny": ("deny", "list", "HOST", "deny a destination (deny wins over allow)"),
    "--net-log": (
        "net_log",
        "value",
        "FILE",
        "network audit log (default: $XDG_STATE_HOME/corral/net.jsonl)",
    ),
    "--transparent": (
        "transparent",
        "flag",
        "",
        "(root) capture all TCP and DNS, for tools that ignore proxy variables",
    ),
    "--log": (
        "log",
        "value",
        "FILE",
        "activity log (default: $XDG_STATE_HOME/corral/runs.jsonl)",
    ),
    "--report": (
        "report",
        "value",
        "json|FILE",
        "every denial of the run as JSON: json prints it as the last line on stderr "
        "(in place of corral's closing lines), FILE writes it there",
    ),
    "--explain": (
        "explain",
        "flag",
        "",
        "print the plan (mounts, network rules, syscall rules, limits) and run nothing",
    ),
    "-q": ("quiet", "flag", "", "no informational lines on stderr (warnings still print)"),
    "--quiet": ("quiet", "flag", "", ""),
}

# Run options that mean nothing for another command: an error naming why, never
# silently ignored.
NOT_FOR_SHELL = {
    "--timeout": "an interactive shell ends when you leave it (it has no wall-clock limit)",
    "--output-limit": "a shell's output goes straight to your terminal",
}
NOT_FOR_MCP = {
    "--explain": "the server speaks MCP on stdout; corral run --explain with the same "
    "options prints the plan",
    "--pass-fd": "it is for corral run and corral shell",
    "--report": "the server's denials are in the activity log (corral log --json)",
}
SHELL_OPTIONS: Options = {k: v for k, v in RUN_OPTIONS.items() if k not in NOT_FOR_SHELL}
MCP_OPTIONS: Options = {k: v for k, v in RUN_OPTIONS.items() if k not in NOT_FOR_MCP}
_AGENT_OWN: Options = {
    "--task": ("task", "value", "TEXT", "run: the task to do; the answer is printed"),
    "--model": ("model", "value", "M", "the model's name (default: $CORRAL_AGENT_MODEL)"),
    "--base-url": (
        "base_url",
        "value",
        "URL",
        "an OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1 (default: "
        "$CORRAL_AGENT_BASE_URL); the key is read from $CORRAL_AGENT_API_KEY or "
        "$OPENAI_API_KEY and never enters the sandbox",
    ),
    "--dir": (
        "dir",
        "value",
        "DIR",
        "the agent's directory: its activity log and config.toml "
        "(default: $XDG_STATE_HOME/corral/agents/default)",
    ),
    "--max-turns": ("max_turns", "value", "N", "model turns per event at most (default 10)"),
    "--every": ("every", "value", "DURATION", "serve: an event this often (e.g. 30s, 5m)"),
    "--stdin": ("stdin", "flag", "", "serve: an event per line on standard input"),
    "--watch": ("watch", "flag", "", "serve: an event when files in the workspace change"),
    "--webhook": (
        "webhook",
        "value",
        "PORT",
        "serve: an event per POST to http://127.0.0.1:PORT/ with Authorization: Bearer "
        "TOKEN ($CORRAL_AGENT_WEBHOOK_TOKEN, else made and kept in DIR/webhook.token)",
    ),
}
AGENT_OPTIONS: Options = {**MCP_OPTIONS, **_AGENT_OWN}
AGENT_LOG_OPTIONS: Options = {
    "--dir": _AGENT_OWN["--dir"],
    "-n": ("n", "value", "N", "how many records (default 50; 0: all)"),
    "--json": ("json", "flag", "", "the raw JSON lines"),
}
POLICY_IMPORT_OPTIONS: Options = {
    "--workspace": (
        "workspace",
        "value",
        "DIR",
        "where relative paths in the settings point (default: cwd)",
    ),
}
HOME_OPTIONS: Options = {
    "--workspace": ("workspace", "value", "DIR", "the workspace (default: cwd)"),
    "--container": ("container", "flag", "", "path, put: the container tiers' layer"),
    "--all": ("all", "flag", "", "clean: every workspace's layer"),
    "--gone": ("gone", "flag", "", "clean: the layers of workspaces that no longer exist"),
}
RULES_OPTIONS: Options = {
    "--policy": ("policy", "value", "FILE", "policy file (default: the workspace's corral.toml)"),
    "--workspace": ("workspace", "value", "DIR", "the workspace (default: cwd)"),
    "--dir": (
        "dir",
        "list",
        "DIR",
        "list, pull: this guardrail directory instead of [guardrails] dirs (repeatable)",
    ),
    "--force": ("force", "flag", "", "pull: overwrite files edited by hand"),
    "--ca": ("ca", "value", "FILE", "pull: also trust this CA file for an https:// index"),
}
DOCTOR_OPTIONS: Options = {
    "--json": ("json", "flag", "", "the report as JSON"),
    "--probe": ("probe", "flag", "", "start a tiny sandbox per tier to prove it works"),
}
LOG_OPTIONS: Options = {
    "-n": ("n", "value", "N", "how many records (default 20; 0: none)"),
    "--json": ("json", "flag", "", "the raw JSON lines"),
    "--run": ("run", "value", "ID", "only the run whose id starts with ID"),
    "--workspace": ("workspace", "value", "DIR", "only the runs in workspace DIR (. for here)"),
    "--log": (
        "log",
        "value",
        "FILE",
        "activity log (default: $XDG_STATE_HOME/corral/runs.jsonl)",
    ),
    "--net": ("net", "flag", "", "the proxy's decisions (the network audit log) instead"),
    "--net-log": (
        "net_log",
        "value",
        "FILE",
        "with --net: the audit log (default: $XDG_STATE_HOME/corral/net.jsonl)",
    ),
    "--host": ("host", "value", "H", "with --net: only this host"),
    "--decision": ("decision", "value", "D", "with --net: only allow, deny, ask or error"),
}
SERVE_OPTIONS: Options = {
    "--listen": (
        "listen",
        "value",
        "HOST:PORT",
        "TCP address to serve (default 127.0.0.1:3128 unless --door is given)",
    ),
    "--door": ("door", "value", "PATH", "a unix socket to serve as well (or instead)"),
    "--policy": ("policy", "value", "FILE", "policy file for the network rules"),
    "--workspace": ("workspace", "value", "DIR", "where the policy file is looked for"),
    "--allow": ("allow", "list", "HOST", "allow a destination (repeatable)"),
    "--deny": ("deny", "list", "HOST", "deny a destination (deny wins over allow)"),
    "--net-log": (
        "net_log",
        "value",
        "FILE",
        "audit log (default: $XDG_STATE_HOME/corral/net.jsonl)",
    ),
    "--workers": ("workers", "value", "N", "proxy processes (default: up to 4)"),
    "-q": ("quiet", "flag", "", "no line on stderr saying where it listens"),
}

PENDING_OPTIONS: Options = {
    "--json": ("json", "flag", "", "one JSON object per held request"),
}
APPROVE_OPTIONS: Options = {
    "--for": (
        "for_",
        "value",
        "DURATION",
        "also allow the run's later requests of the same host, method and path for "
        "this long (a grant, e.g. 10m); without it, this request only",
    ),
    "--path": (
        "path",
        "value",
        "GLOB",
        "with --for: the grant covers this path glob instead of the same path "
        "(the syntax of [[network.rules]] paths, e.g. /repos/**)",
    ),
}
DENY_OPTIONS: Options = {}
BATCH_OPTIONS: Options = {
    "--out": (
        "out",
        "value",
        "FILE",
        "results as JSON lines keyed by id (required); given "
        "again, the jobs it holds are skipped (resume)",
    ),
    "-j": ("jobs", "value", "N", "jobs at once (default: the CPUs here; on Ray: all)"),
    "--jobs": ("jobs", "value", "N", ""),
    "--ray": (
        "ray",
        "value",
        "ADDRESS",
        "place the jobs on this Ray cluster (host:port, "
        "or auto); each node builds its jobs' sandboxes with its own corral",
    ),
    "--retries": (
        "retries",
        "value",
        "N",
        "further attempts of a job whose machine failed "
        "(default 2; a failed command is never retried)",
    ),
    "--reuse": (
        "reuse",
        "flag",
        "",
        "jobs with the same options share warm sandboxes, each reset after every "
        "job (its leftover processes killed, its private /tmp emptied): an exec "
        "per job, not a sandbox; namespace tier (others run a sandbox per job)",
    ),
    "--output-bytes": (
        "output_bytes",
        "value",
        "N",
        "the output each result keeps (default 65536)",
    ),
    "--log": (
        "log",
        "value",
        "FILE",
        "every job's run records, merged (default: the activity log)",
    ),
    "--net-log": (
        "net_log",
        "value",
        "FILE",
        "every job's network audit lines, merged (default: net.jsonl)",
    ),
}

K8S_OPTIONS: Options = {
    "--policy": ("policy", "value", "FILE", "the policy file (its TOML goes into a ConfigMap)"),
    "--image": (
        "image",
        "value",
        "REF",
        "the sandbox's image (default: the policy's [container] image)",
    ),
    "--proxy-image": (
        "proxy_image",
        "value",
        "REF",
        "the proxy's image: one with corral installed (needed when the policy has a network)",
    ),
    "--namespace": ("namespace", "value", "NS", "put every namespaced object in NS"),
    "--name": ("name", "value", "NAME", "prefix of the objects' names (default: corral)"),
    "--gvisor": ("gvisor", "flag", "", "run the sandbox under gVisor (a RuntimeClass gvisor)"),
    "--template": (
        "template",
        "flag",
        "",
        "an agent-sandbox SandboxTemplate instead of a Pod",
    ),
    "--sandbox": ("sandbox", "flag", "", "an agent-sandbox Sandbox instead of a Pod"),
    "--workspace-claim": (
        "workspace_claim",
        "value",
        "PVC",
        "the workspace from this PersistentVolumeClaim (default: an emptyDir)",
    ),
    "--seccomp-profile": (
        "seccomp_profile",
        "flag",
        "",
        "print only the seccomp profile (JSON) for the nodes' kubelet seccomp directory",
    ),
}

# command -> (what follows its name, what it does, its options)
COMMANDS: dict[str, tuple[str, str, Options]] = {
    "run": ("[OPTIONS] [--] COMMAND [ARG...]", "run a command in a sandbox", RUN_OPTIONS),
    "shell": (
        "[OPTIONS] [-- SHELL...]",
        "an interactive shell in a sandbox (a pty)",
        SHELL_OPTIONS,
    ),
    "mcp": ("[OPTIONS]", "an MCP server (stdio) on one sandbox", MCP_OPTIONS),
    "agent": (
        "run --task TEXT|serve|log [OPTIONS]",
        "corral's own agent: a model whose every tool call runs in one sandbox",
        AGENT_OPTIONS,
    ),
    "doctor": ("[OPTIONS]", "which tiers can run here, and why not", DOCTOR_OPTIONS),
    "log": ("[OPTIONS]", "the last runs; with --net, the proxy's decisions", LOG_OPTIONS),
    "policy": (
        "import [OPTIONS] FILE.json",
        "srt's settings JSON as corral.toml, on stdout",
        POLICY_IMPORT_OPTIONS,
    ),
    "home": (
        "path|list|clean|put FILE [OPTIONS]",
        "the per-workspace home layers (where writes under ~ go); put: stdin to ~/FILE there",
        HOME_OPTIONS,
    ),
    "rules": (
        "list|check METHOD URL|hash FILE...|pull SRC [OPTIONS]",
        "guardrail files and request rules: list them, explain a decision, hash, pull",
        RULES_OPTIONS,
    ),
    "proxy": (
        "serve [OPTIONS]",
        "corral's proxy alone (HTTP, SOCKS5), for programs outside a sandbox",
        SERVE_OPTIONS,
    ),
    "pending": (
        "[OPTIONS]",
        "the requests your runs hold for an answer (ask rules)",
        PENDING_OPTIONS,
    ),
    "approve": ("[OPTIONS] ID", "allow a held request (see corral pending)", APPROVE_OPTIONS),
    "deny": ("ID", "refuse a held request (see corral pending)", DENY_OPTIONS),
    "batch": (
        "JOBS.jsonl --out RESULTS.jsonl [OPTIONS]",
        "many jobs, each a corral run, here or on a Ray cluster",
        BATCH_OPTIONS,
    ),
    "k8s": (
        "render --policy FILE [OPTIONS]",
        "Kubernetes manifests (JSON) for a sandbox pod and its governing proxy",
        K8S_OPTIONS,
    ),
}


class HelpRequested(Exception):
    """``-h``/``--help`` among a command's options: print its help, exit 0."""


def parse(
    args: list[str],
    table: Options,
    positional: bool,
    command: str = "",
    refused: dict[str, str] | None = None,
) -> tuple[dict[str, object], list[str]]:
    """Options from ``table`` until ``--`` or the first non-option (if ``positional``).
    ``refused``: options of other commands that this one rejects, with the reason."""
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
        if name in ("-h", "--help") and name not in table:
            raise HelpRequested(command)
        if name not in table:
            where = f"corral {command}" if command else "corral"
            if refused and name in refused:
                raise CorralError(f"{name} does not apply to {where}: {refused[name]}")
            raise CorralError(f"unknown option {name} for {where} (see {where} --help)")
        attr, kind = table[name][:2]
        if kind == "flag":
            if eq:
                raise CorralError(f"option {name} takes no value")
            opts[attr] = True
            i += 1
            continue
        if eq:
            value = inline
            i += 1
        elif i + 1 < len(args) and args[i + 1] != "--":
            value = args[i + 1]
            i += 2
        else:  # (`--allow -- cmd`: the value forgotten, not a host named "--")
            raise CorralError(f"option {name} needs a value")
        if kind == "list":
            existing = opts.setdefault(attr, [])
            assert isinstance(existing, list)
            existing.append(value)
        else:
            opts[attr] = value
    return opts, []


def build_policy(opts: dict[str, object]) -> Policy:
    """The policy a command runs under: the file's (or the workspace's, or srt's
    settings), then each flag given on the command line over it."""
    from corral import policy as pol

    workspace = opts.get("workspace")
    policy_path = opts.get("policy")
    pinned = str(opts["policy_sha256"]) if opts.get("policy_sha256") else None
    if "settings" in opts:  # even --settings= : a file named, however badly, is never ignored
        policy = _settings_policy(str(opts["settings"]), "policy" in opts, workspace, pinned)
    else:
        if pinned and not policy_path:
            raise CorralError("--policy-sha256: only with --policy FILE or --settings FILE")
        policy = pol.load(
            str(workspace) if workspace else None,
            str(policy_path) if policy_path else None,
            sha256=pinned,
        )
    _limit_flags(policy, opts)
    _filesystem_flags(policy, opts)
    _env_flags(policy, opts)
    _container_flags(policy, opts)
    _network_flags(policy, opts)
    pol.check_network(policy)
    report = _report_file(opts)
    if opts.get("log") or opts.get("net_log") or report:
        from corral import runlog
        from corral.errors import PolicyError

        try:  # (a report file too: the run must not plant a link or a FIFO there)
            runlog.keep_out(
                policy.filesystem.read_deny,
                opts.get("log"),
                opts.get("net_log"),
                report,
                writable=policy.writable_paths(),
            )
        except OSError as exc:  # (ELOOP: a symlink there; logs are plain files only)
            why = f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc)
            raise PolicyError(f"cannot write a log or report file {why}") from None
    return policy


def _report_file(opts: dict[str, object]) -> str | None:
    """``--report FILE``'s file (None for ``--report json`` or no report)."""
    target = opts.get("report")
    return target if isinstance(target, str) and target not in ("", "json") else None


def _limit_flags(policy: Policy, opts: dict[str, object]) -> None:
    from corral import policy as pol

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


def _filesystem_flags(policy: Policy, opts: dict[str, object]) -> None:
    from corral import policy as pol

    if "home" in opts:
        try:
            policy.filesystem.home = pol._expect_home(opts["home"])
        except ValueError as exc:
            raise CorralError(f"--home: {exc}") from None
    here = os.getcwd()
    for attr in ("writable", "read_deny", "write_deny"):
        extra = opts.get(attr)
        if isinstance(extra, list):  # (a relative flag is the shell's: its directory's,
            # not the workspace's, which --workspace may name elsewhere)
            extra = [p if p.startswith(("/", "~")) else os.path.join(here, p) for p in extra]
            getattr(policy.filesystem, attr).extend(extra)


def _env_flags(policy: Policy, opts: dict[str, object]) -> None:
    from corral import policy as pol

    envs = opts.get("env")
    if not isinstance(envs, list):
        return
    for item in envs:
        name, eq, value = item.partition("=")  # NAME passes it, NAME=VALUE sets it
        try:
            pol.check_env_name(name)
        except ValueError as exc:
            raise CorralError(f"--env: {exc}") from None
        if eq:
            policy.env.set_values[name] = value
        else:
            policy.env.pass_names.append(name)


def _container_flags(policy: Policy, opts: dict[str, object]) -> None:
    from corral import policy as pol

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


def _network_flags(policy: Policy, opts: dict[str, object]) -> None:
    from corral import policy as pol

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
        for flag in ("allow", "transparent"):
            if opts["network"] != "proxy" and opts.get(flag):
                raise CorralError(f"--{flag} has no effect with --network none: leave one out")


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


def refuse_unpassable(passed: tuple[int, ...], tier: Tier) -> None:
    """A passed directory or host file is refused on a sandbox tier (see
    corral.launch.unpassable); tier none confines nothing, so it keeps them."""
    if not passed or not tier.strategy.confines:
        return
    from corral.launch import unpassable

    for number in passed:
        why = unpassable(number)
        if why is not None:
            raise CorralError(f"--pass-fd {number} {why}")


def _settings_policy(path: str, with_policy: bool, workspace: object, pinned: str | None) -> Policy:
    """srt's settings JSON in place of a policy file; flags still apply on top."""
    if with_policy:
        raise CorralError("--settings and --policy both give the policy: pass one of them")
    from corral import srt_settings

    return srt_settings.load(path, str(workspace) if workspace else None, pinned)


# A run whose setup raced a host change (a unix socket removed between the plan
# and bwrap's mounts; busy machines have many) is planned again: its command
# never started, so nothing is repeated.  The host's socket list is the one
# read for the first plan (this process may since have entered the sandbox's
# network namespace, where /proc/net/unix lists none of the host's); the door and
# that namespace are the first attempt's (corral.netns.enter).
SETUP_ATTEMPTS = 3


def cmd_run(args: list[str]) -> int:
    import gc

    # One run, then exit: the cyclic collector only costs here (a pass over the
    # modules just imported is a millisecond a run).  Proxy workers turn it back on.
    gc.disable()
    opts, command = parse(args, RUN_OPTIONS, positional=True, command="run")
    if not command:
        raise CorralError("nothing to run: corral run [OPTIONS] -- COMMAND [ARG...]")
    passed = pass_fds(opts)
    policy = build_policy(opts)
    from corral import launch, tiers

    tier, _health = tiers.select(policy.tier, policy)
    refuse_unused_flags(opts, tier)
    refuse_unpassable(passed, tier)
    run_id = launch.new_run_id()
    if opts.get("explain"):
        return _explain(tier, policy, command, passed)
    tier.strategy.ahead(policy)
    # One door for every attempt: its proxy, forked on the host side by the
    # first, holds the listeners of the namespace this process entered.
    door = (
        _open_door(opts, policy, run_id, tier.door_transport, answerer=True, start=False)
        if tier.strategy.confines
        else None
    )
    try:
        return planned_again(
            lambda attempt: _run_plan(
                opts, policy, tier.name, command, run_id, door, passed, attempt
            )
        )
    finally:
        if door is not None:
            door.close()


CONTAINER_FLAGS = (("engine", "--engine"), ("oci_runtime", "--oci-runtime"), ("image", "--image"))


def refuse_unused_flags(opts: dict[str, object], tier: Tier) -> None:
    """A container flag given with a tier that has no container is a mistake to say,
    not an option to drop (the policy file's [container] stays config for later)."""
    if tier.uses_container:
        return
    for key, flag in CONTAINER_FLAGS:
        if key in opts:
            raise CorralError(
                f"{flag} is for the container tiers (--tier container or gvisor), "
                f"not the {tier.name} tier"
            )


def planned_again(attempt: Callable[[int], int]) -> int:
    """``attempt(1)``, and again (2, 3) while its setup raced a host change."""
    for number in range(1, SETUP_ATTEMPTS):
        try:
            return attempt(number)
        except SetupRaced:
            from corral import fsplan

            fsplan.freeze_host_sockets()
    return attempt(SETUP_ATTEMPTS)


def _explain(
    tier: Tier,
    policy: Policy,
    command: list[str],
    passed: tuple[int, ...],
    adjust: Callable[[Plan], object] | None = None,
) -> int:
    """Print the plan; ``adjust``: what the command changes in it (corral shell's
    timeout, not enforced) before it is described."""
    door_path = None
    net = None
    if policy.network.mode == "proxy":
        door_path = "127.0.0.1:3128" if tier.door_transport == "tcp" else "/DOOR"
        net = _explained_extras(policy)
    from corral.errors import visible

    host = tier.gather(policy)
    plan = tier.plan(policy, command, door_path, pass_fds=passed, net=net, host=host)
    if adjust is not None:
        adjust(plan)
    print(visible(plan.describe()))  # (names the sandbox chose: terminal controls escaped)
    return 0


def _explained_extras(policy: Policy) -> NetExtras | None:
    """What --explain shows of a run that can intercept TLS: the CA bundle (named
    /DOOR/ca-bundle.pem, as the door is /DOOR) and the system paths it covers."""
    from corral.net.hooks import chain_for
    from corral.net.trust import BUNDLE_NAME, NetExtras, system_bundles

    if not chain_for(policy).may_inspect:
        return None
    return NetExtras(f"/DOOR/{BUNDLE_NAME}", system_bundles())


class _ShellResult:
    """What a shell's end tells, in RunResult's terms (no timeout, no output bound)."""

    def __init__(self, code: int, duration: float, signum: int | None = None) -> None:
        self.exit_code = code
        self.duration = duration
        self.timed_out = False
        self.truncated = False
        self.output_bytes = 0
        self.limits_hit: list[str] = []
        self.signal = signum  # a signal corral received, which killed the sandbox


def _open_door(
    opts: dict[str, object],
    policy: Policy,
    run_id: str,
    transport: str,
    answerer: bool = False,
    start: bool = True,
) -> Door | None:
    if policy.network.mode != "proxy":
        return None  # and corral.net stays unimported: it costs milliseconds
    from corral.net.door import may_ask, open_door

    net_log = opts.get("net_log")
    # answerer: corral run prompts on its terminal (stdin and stderr); without
    # one it says on stderr what is held and how to answer (corral approve /
    # deny, the control socket), and an unanswered ask times out
    answerer = answerer and may_ask(policy)
    return open_door(policy, run_id, str(net_log) if net_log else None, transport, answerer, start)


def _record(plan: Plan, run_id: str, kind: str, argv: list[str]) -> dict[str, object]:
    """The activity log's record of a run, as far as it is known before it starts."""
    import time

    from corral import bounds, runlog

    policy = plan.policy
    record: dict[str, object] = {
        "run_id": run_id,
        "kind": kind,
        "start": runlog.iso(time.time()),
        "tier": plan.tier,
        "policy_digest": runlog.digest(policy.to_dict()),
        "policy_file": policy.source,
        "workspace": policy.workspace,
        "argv": argv,
        "network": policy.network.mode,
        "bounds": bounds.record(plan),  # each limit: value, source, enforced
    }
    if plan.notes:  # what the plan decided beyond the policy (hard links made read-only...)
        record["notes"] = plan.notes
    return record


def plan_with_door(
    tier: Tier, policy: Policy, argv: list[str], door: Door | None, passed: tuple[int, ...]
) -> Plan:
    """The tier's plan for ``argv`` behind ``door`` (None: no network)."""
    return tier.plan(
        policy,
        argv,
        door=door.address if door else None,
        pass_fds=passed,
        net=door.extras if door else None,
        host=tier.gather(policy),  # the host, read once: plan() reads nothing
    )


def _run_plan(
    opts: dict[str, object],
    policy: Policy,
    tier_name: str,
    command: list[str],
    run_id: str,
    door: Door | None,
    passed: tuple[int, ...] = (),
    attempt: int = 1,
) -> int:
    from corral import bounds, launch, tiers

    tier = tiers.get(tier_name)
    plan = plan_with_door(tier, policy, command, door, passed)
    quiet = bool(opts.get("quiet"))
    if attempt == 1:  # said once, not again for a run planned again
        _say_plan(plan, policy.tier == "auto", quiet)
        if not quiet:
            for note in _host_notes(command, policy):
                _err(f"corral: note: {note}")
    record = _record(plan, run_id, "run", command)
    if passed:
        record["pass_fds"] = list(passed)
    asks = None
    if door is not None and door.ask_sock is not None:
        from corral.prompt import TerminalPrompt

        asks = TerminalPrompt(door.ask_sock, interactive=os.isatty(0) and os.isatty(2))
    try:
        # the proxy forks as the launch begins: by the run's guardian if it has
        # one, else by this process (see Door.open and launch.Companion)
        result = launch.run(plan, run_id, asks=asks, companion=door)
    except SetupRaced as exc:
        if attempt == SETUP_ATTEMPTS:
            _failed(opts, record, exc)
        raise
    except CorralError as exc:
        _failed(opts, record, exc)
        raise
    late = bounds.skipped_at_setup(plan)  # a default's cgroup could not be set up
    if late:
        record["bounds"] = bounds.record(plan)
        if not quiet:
            _err(f"corral: note: {late}")
    return _finish(opts, plan, record, result.exit_code, result.denials, door, result)


LOOPBACK_SPELLINGS = ("127.0.0.1:", "localhost:", "[::1]:")


def _host_notes(command: list[str], policy: Policy) -> list[str]:
    """Host paths under /tmp and host services on loopback the command names, which
    the sandbox will not see (its /tmp and its loopback are its own); each with
    the flag that gives it.  Looked for only when an argument could name one."""
    notes = []
    if any(a.startswith(("/tmp/", "/var/tmp/"), a.find("/")) for a in command):
        from corral.fsplan import host_tmp_args

        notes += host_tmp_args(command, policy.writable_paths())
    if any(s in a for a in command for s in LOOPBACK_SPELLINGS):
        from corral.netns import host_loopback_args, listening

        allow = policy.network.allow if policy.network.mode == "proxy" else []
        notes += host_loopback_args(
            command, listening, lambda flag: flag in allow or flag.rsplit(":", 1)[0] in allow
        )
    return notes


def _say_plan(plan: Plan, auto: bool, quiet: bool) -> None:
    """The plan's warning, the tier auto chose, and its notes, on stderr."""
    from corral.errors import plain

    if plan.strategy.warning:
        _err(plan.strategy.warning)
    elif auto and not quiet:
        _err(f"corral: tier {plan.tier} (auto: strongest available here)")
    for note in plan.notes:
        if not quiet:  # (one line each: a path in it may hold a line break)
            _err(f"corral: note: {plain(note)}")


def _failed(opts: dict[str, object], record: dict[str, object], exc: CorralError) -> None:
    """A run that could not start: its record, and its report if one was asked for."""
    import time

    from corral import runlog

    record.update(end=runlog.iso(time.time()), exit=exc.code, error=exc.message)
    _log(record, opts.get("log"))
    target = str(opts.get("report") or "")
    if target:
        doc = {"run_id": record["run_id"], "tier": record["tier"], "exit": exc.code}
        if target == "json":  # the report stays the last line: say the error first
            _err(f"corral: {exc.message}")
            exc.message = ""
        _write_report(target, {**doc, "error": record["error"], "denials": []})


def _finish(
    opts: dict[str, object],
    plan: Plan,
    record: dict[str, object],
    code: int,
    found: list[Denial],
    door: Door | None,
    result: RunResult | _ShellResult,
) -> int:
    """After the sandbox is gone: gather every denial, log the run, tell the user."""
    import time

    from corral import bounds, runlog

    denials = list(found)
    refused = door.close() if door is not None else []
    if door is not None:
        record["proxy_errors"] = door.errors  # details: net.jsonl, decision "error"
    elif getattr(result, "lookups", None):  # looked up in a sandbox without a network
        from corral.net.audit import record_lookups

        net_log = opts.get("net_log")
        lookups = getattr(result, "lookups")  # noqa: B009  (RunResult only)
        refused = record_lookups(str(net_log) if net_log else None, str(record["run_id"]), lookups)
    target = str(opts.get("report") or "")
    limited = result.limits_hit or result.timed_out or result.truncated
    # defaults this host does not enforce were said before the run; only the
    # report lists them again
    unbounded = bool(target) and bool(bounds.unenforced(plan))
    if refused or limited or unbounded or plan.hardlinks:  # corral.report only for news
        from corral import report

        denials += report.network(refused, plan.policy)
        denials += report.limits(
            plan, result.limits_hit, result.timed_out, result.truncated, result.output_bytes
        )
        denials += report.hardlinks(plan.hardlinks)
    if len(denials) > 100:  # (report.LISTED: no import for the usual run)
        from corral.report import bounded

        denials = bounded(denials)
    record.update(
        end=runlog.iso(time.time()),
        exit=code,
        duration=round(result.duration, 4),
        timed_out=result.timed_out,
        truncated=result.truncated,
        output_bytes=result.output_bytes,
        limits_hit=result.limits_hit,
        denials=[d.recorded() for d in denials if d.refused],
    )
    _log(record, opts.get("log"))
    if target:
        from corral.report import document

        _write_report(target, document(str(record["run_id"]), plan.tier, code, denials))
    if target != "json":
        for line in closing_lines(denials, plan.policy, result.signal):
            _err(f"corral: {line}")
    return code


def closing_lines(denials: list[Denial], policy: Policy, signum: int | None) -> list[str]:
    """What corral says on stderr after a run: limits, files, then one line for the
    network, then a signal it acted on."""
    lines = [d.text for d in denials if d.kind == "limit" and d.text]
    said = ("file", "unreachable", "unproxied", "bound", "more")
    lines += [d.text for d in denials if d.kind in said and d.text]
    if any(d.kind == "network" for d in denials):
        from corral.report import blocked_line

        lines.append(blocked_line(denials, policy))
    if signum is not None:
        lines.append(f"received signal {signum}; killed the sandbox")
    return lines


def _write_report(target: str, doc: dict[str, object]) -> None:
    """``--report json``: the last line on stderr; ``--report FILE``: that file."""
    from corral.runlog import dumps

    text = dumps(doc) + "\n"
    if target == "json":
        sys.stderr.write(text)
        sys.stderr.flush()
        return
    from corral.runlog import write_whole

    try:  # on a log's terms: the sandbox may have had the run's time to plant something
        write_whole(target, text.encode("utf-8", "backslashreplace"))
    except OSError as exc:
        _err(f"corral: warning: could not write the report to {target}: {exc.strerror or exc}")


def _log(record: dict[str, object], path: object) -> None:
    from corral import runlog

    try:
        runlog.append(record, str(path) if path else None)
    except OSError as exc:
        _err(f"corral: warning: could not write the activity log: {exc}")


def _err(line: str) -> None:
    from corral.errors import visible

    try:
        sys.stderr.write(visible(line) + "\n")
        sys.stderr.flush()
    except OSError as exc:
        if not _hung_up(exc):
            raise


def _hung_up(exc: OSError) -> bool:
    """Whether a write failed because our terminal is gone (closed: EIO, and corral
    had a SIGHUP): nobody is left to read it, and corral ends as it would."""
    import errno

    return exc.errno == errno.EIO


def _command(name: str) -> Callable[[list[str]], int]:
    """``run`` is here; every other command's code is in corral.commands, loaded
    only when one of them runs."""
    if name == "run":
        return cmd_run
    import gc

    gc.enable()  # the entry script turned it off for `run`; these may live long
    from corral import commands

    found: Callable[[list[str]], int] = getattr(commands, "cmd_" + name)
    return found


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        if not args or args[0] in ("-h", "--help"):
            from corral.usage import help_text

            sys.stdout.write(help_text())
            return 0 if args else EXIT_USAGE
        if args[0] == "help":
            topic = args[1] if len(args) > 1 else None
            if topic is not None and topic not in COMMANDS:
                raise CorralError(f"no help for {topic!r}: commands are {', '.join(COMMANDS)}")
            from corral.usage import help_text

            sys.stdout.write(help_text(topic))
            return 0
        if args[0] == "--version":
            from corral import __version__

            print(f"corral {__version__}")
            return 0
        if args[0] not in COMMANDS:
            raise CorralError(
                f"unknown command {args[0]!r} ({', '.join(COMMANDS)}; see corral --help)"
            )
        try:
            return _command(args[0])(args[1:])
        except HelpRequested:
            from corral.usage import help_text

            sys.stdout.write(help_text(args[0]))
            return 0
    except CorralError as exc:
        if exc.message:  # empty: said already (before a --report json line)
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
    except OSError as exc:
        if not _hung_up(exc):
            raise
    os._exit(code)


if __name__ == "__main__":
    entry()
