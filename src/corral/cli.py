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
    import socket

    from corral.launch import RunResult
    from corral.net.ca import CA
    from corral.net.door import Door
    from corral.net.hooks import Chain
    from corral.net.trust import NetExtras
    from corral.policy import Policy
    from corral.report import Denial
    from corral.tiers.base import Health, Plan, Tier

# option -> (attribute, kind, metavar, help).  kind: "flag" takes no value, "list"
# repeats, "value" takes one.  The usage text is generated from these tables
# (corral.usage), so what --help says and what is parsed cannot drift apart.
Options = dict[str, tuple[str, str, str, str]]

RUN_OPTIONS: Options = {
    "--tier": (
        "tier",
        "value",
        "NAME",
        "auto (default: strongest available), namespace, landlock, container, gvisor, none",
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
        "--timeout, --memory, --pids, --cpus, --tmp and --shm take none: no bound at all",
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
    "--container": ("container", "flag", "", "path: the container tiers' layer"),
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
    "--decision": ("decision", "value", "D", "with --net: only allow, deny or error"),
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
        "path|list|clean [OPTIONS]",
        "the per-workspace home layers (where writes under ~ go)",
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
# exit codes of commands that answer (usage text); CorralError carries them
EXIT_NOT_WAITING = 1


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
    if "home" in opts:
        try:
            policy.filesystem.home = pol._expect_home(opts["home"])
        except ValueError as exc:
            raise CorralError(f"--home: {exc}") from None
    for attr in ("writable", "read_deny", "write_deny"):
        extra = opts.get(attr)
        if isinstance(extra, list):
            getattr(policy.filesystem, attr).extend(extra)
    envs = opts.get("env")
    if isinstance(envs, list):
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
    usage = "usage: corral home path|list|clean [--workspace DIR | --gone | --all] [--container]"
    if args[:1] in (["-h"], ["--help"]):
        raise HelpRequested("home")
    if not args or args[0] not in ("path", "list", "clean"):
        raise CorralError(usage)
    opts, rest = parse(args[1:], HOME_OPTIONS, positional=False, command=f"home {args[0]}")
    if rest:
        raise CorralError(usage)
    from corral import home, homeseed

    which = [o for o in ("workspace", "all", "gone") if o in opts]
    if len(which) > 1 or (args[0] != "clean" and which[:1] in (["all"], ["gone"])):
        raise CorralError("--all and --gone are for corral home clean, instead of --workspace")
    if opts.get("container") and args[0] != "path":
        raise CorralError("--container is for corral home path")
    workspace = os.path.realpath(str(opts.get("workspace") or os.getcwd()))
    if args[0] == "path":
        print(home.layer_path(workspace, "container" if opts.get("container") else "host"))
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
    for path in found:
        home.remove(path)
        print(f"removed {path}")
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
    run_id = launch.new_run_id()
    if opts.get("explain"):
        return _explain(tier, policy, command, passed)
    # One door for every attempt: its proxy, forked on the host side by the
    # first, holds the listeners of the namespace this process entered.
    door = (
        _open_door(opts, policy, run_id, tier.door_transport, answerer=True, start=False)
        if tier.strategy.confines
        else None
    )
    try:
        for attempt in range(1, SETUP_ATTEMPTS + 1):
            try:
                return _run_plan(opts, policy, tier.name, command, run_id, door, passed, attempt)
            except SetupRaced:
                if attempt == SETUP_ATTEMPTS:
                    raise
                from corral import fsplan

                fsplan.freeze_host_sockets()
    finally:
        if door is not None:
            door.close()
    raise AssertionError("unreachable")  # pragma: no cover


def _explain(tier: Tier, policy: Policy, command: list[str], passed: tuple[int, ...]) -> int:
    door_path = None
    net = None
    if policy.network.mode == "proxy":
        door_path = "127.0.0.1:3128" if tier.door_transport == "tcp" else "/DOOR"
        net = _explained_extras(policy)
    host = tier.gather(policy)
    print(tier.plan(policy, command, door_path, pass_fds=passed, net=net, host=host).describe())
    return 0


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
    opts, shell = parse(args, SHELL_OPTIONS, True, command="shell", refused=NOT_FOR_SHELL)
    passed = pass_fds(opts)
    policy = build_policy(opts)
    from corral import launch, tiers
    from corral import shell as pty_shell

    tier, _health = tiers.select(policy.tier, policy)
    if not tier.strategy.confines:
        raise CorralError(f"corral shell needs a sandbox tier, not {tier.name}")
    if tier.strategy.shell:
        from corral.errors import RefusedError

        raise RefusedError(tier.strategy.shell)
    argv = shell or [os.environ.get("SHELL") or "/bin/sh", "-i"]
    shell_argv = pty_shell.command(argv, tier.python_argv())
    if opts.get("explain"):
        return _explain(tier, policy, shell_argv, passed)
    run_id = launch.new_run_id()
    door = _open_door(opts, policy, run_id, tier.door_transport)
    try:
        plan = tier.plan(
            policy,
            shell_argv,
            door=door.address if door else None,
            pass_fds=passed,
            net=door.extras if door else None,
            host=tier.gather(policy),
        )
        if not opts.get("quiet"):
            _err(f"corral: shell in a {tier.name} sandbox; workspace {policy.workspace}")
            from corral.bounds import notice

            if notice(plan):  # the defaults this host cannot enforce for this user
                _err(f"corral: note: {notice(plan)}")
        record = _record(plan, run_id, "shell", argv)
        import time

        began = time.monotonic()
        try:
            code, found = pty_shell.run(plan, run_id)
        except CorralError as exc:
            _failed(opts, record, exc)
            raise
        ended = _ShellResult(code, time.monotonic() - began)
        return _finish(opts, plan, record, code, found, door, ended)
    finally:
        if door is not None:
            door.close()


class _ShellResult:
    """What a shell's end tells, in RunResult's terms (no timeout, no output bound)."""

    def __init__(self, code: int, duration: float) -> None:
        self.exit_code = code
        self.duration = duration
        self.timed_out = False
        self.truncated = False
        self.output_bytes = 0
        self.limits_hit: list[str] = []
        self.signal: int | None = None


def cmd_mcp(args: list[str]) -> int:
    """An MCP server on stdio whose tools act on one long-lived sandbox."""
    opts, _ = parse(args, MCP_OPTIONS, False, command="mcp", refused=NOT_FOR_MCP)
    policy = build_policy(opts)
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
                    _err(f"corral: note: {note}")
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
    # one, asks wait for corral approve / deny (the control socket) or time out
    if answerer and may_ask(policy):
        answerer = os.isatty(0) and os.isatty(2)
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
    plan = tier.plan(
        policy,
        command,
        door=door.address if door else None,
        pass_fds=passed,
        net=door.extras if door else None,
        host=tier.gather(policy),  # the host, read once: plan() reads nothing
    )
    quiet = bool(opts.get("quiet"))
    if attempt == 1:  # said once, not again for a run planned again
        _say_plan(plan, policy.tier == "auto", quiet)
    record = _record(plan, run_id, "run", command)
    if passed:
        record["pass_fds"] = list(passed)
    asks = None
    if door is not None and door.ask_sock is not None:
        from corral.prompt import TerminalPrompt

        asks = TerminalPrompt(door.ask_sock)
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


def _say_plan(plan: Plan, auto: bool, quiet: bool) -> None:
    """The plan's warning, the tier auto chose, and its notes, on stderr."""
    if plan.strategy.warning:
        _err(plan.strategy.warning)
    elif auto and not quiet:
        _err(f"corral: tier {plan.tier} (auto: strongest available here)")
    for note in plan.notes:
        if not quiet:
            _err(f"corral: note: {note}")


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
    limited = result.limits_hit or result.timed_out or result.truncated or bounds.unenforced(plan)
    if refused or limited or plan.hardlinks:  # corral.report only when there is news
        from corral import report

        denials += report.network(refused, plan.policy)
        denials += report.limits(
            plan, result.limits_hit, result.timed_out, result.truncated, result.output_bytes
        )
        denials += report.hardlinks(plan.hardlinks)
    record.update(
        end=runlog.iso(time.time()),
        exit=code,
        duration=round(result.duration, 4),
        timed_out=result.timed_out,
        truncated=result.truncated,
        output_bytes=result.output_bytes,
        limits_hit=result.limits_hit,
        denials=[d.to_dict() for d in denials if d.refused],
    )
    _log(record, opts.get("log"))
    target = str(opts.get("report") or "")
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
    lines += [d.text for d in denials if d.kind == "file" and d.text]
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
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, text.encode("utf-8", "backslashreplace"))
        finally:
            os.close(fd)
    except OSError as exc:
        _err(f"corral: warning: could not write the report to {target}: {exc.strerror}")


def _log(record: dict[str, object], path: object) -> None:
    from corral import runlog

    try:
        runlog.append(record, str(path) if path else None)
    except OSError as exc:
        _err(f"corral: warning: could not write the activity log: {exc}")


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
    records = [
        r
        for r in runlog.read(str(opts["log"]) if opts.get("log") else None)
        if str(r.get("run_id", "")).startswith(run)
    ]
    records = records[-count:] if count else []
    if opts.get("json"):
        return _print_json_lines(records)
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
        start, run_id, tier, code = (
            str(r.get(k) if r.get(k) is not None else "?")
            for k in ("start", "run_id", "tier", "exit")
        )
        print(f"{start}  {run_id}  {tier:<9}  exit {code:<3}  {dur:>8}  {command[:80]}{extra}")
    return 0


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
        if r.get("event"):  # an approval's line (corral.net.approvals)
            what = f"{r['event']} {r.get('answer') or r.get('scope') or what}"
        print(
            f"{r.get('time', '?')}  {r.get('run_id', '?')}  {r.get('decision', '?'):<5}  "
            f"{r.get('host')}:{r.get('port')}  {what[:60]}  rule={r.get('rule')}  "
            f"status={r.get('status')}  up={r.get('bytes_up')} down={r.get('bytes_down')}"
        )
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
    print(f"{'ID':<9} {'RUN':<19} {'AGE':>5}  {'METHOD':<7} {'HOST':<24} {'PATH':<28} RULE")
    for item in held:
        host = f"{item.get('host')}:{item.get('port')}"
        age = f"{float(item.get('age', 0) or 0):.0f}s"  # type: ignore[arg-type]
        print(
            f"{item.get('id')!s:<9} {item.get('run')!s:<19} {age:>5}  {item.get('method')!s:<7} "
            f"{host:<24} {str(item.get('path'))[:60]:<28} {item.get('rule')}"
        )
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
    ca: CA | None = None,
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

            tls = Interceptor(ca, policy.tls.upstream_ca)
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


def _err(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


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
        commands = {
            "run": cmd_run,
            "shell": cmd_shell,
            "mcp": cmd_mcp,
            "agent": cmd_agent,
            "doctor": cmd_doctor,
            "log": cmd_log,
            "proxy": cmd_proxy,
            "policy": cmd_policy,
            "home": cmd_home,
            "rules": cmd_rules,
            "pending": cmd_pending,
            "approve": cmd_approve,
            "deny": cmd_deny,
            "batch": cmd_batch,
            "k8s": cmd_k8s,
        }
        if args[0] not in commands:
            raise CorralError(
                f"unknown command {args[0]!r} ({', '.join(COMMANDS)}; see corral --help)"
            )
        try:
            return commands[args[0]](args[1:])
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
    os._exit(code)


if __name__ == "__main__":
    entry()
