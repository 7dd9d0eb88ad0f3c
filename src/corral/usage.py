"""``corral --help`` and ``corral COMMAND --help``, generated from the option tables
in :mod:`corral.cli` (what is parsed is what is documented).  A module of its
own so that ``corral run`` never loads it."""

from __future__ import annotations

from corral import tiers
from corral.cli import COMMANDS, Options
from corral.errors import EXIT_CODES


def wrap(text: str, width: int, indent: str) -> list[str]:
    """Greedy word wrap (textwrap would import re)."""
    lines: list[str] = []
    line = ""
    for word in text.split():
        if line and len(indent) + len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line] if line else lines


# The limits that take "none" (no bound), as the command's own table has them
_UNBOUNDED = ("--timeout", "--memory", "--pids", "--cpus", "--tmp", "--shm")


def _unbounded(table: Options) -> str:
    names = [n for n in _UNBOUNDED if n in table]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def options_text(table: Options) -> str:
    """One entry per attribute (aliases together), help wrapped under 88 columns."""
    seen: dict[str, list[str]] = {}
    for name, (attr, *_rest) in table.items():
        seen.setdefault(attr, []).append(name)
    out = []
    for names in seen.values():
        documented = [n for n in names if table[n][3]] or names
        _, kind, metavar, help_ = table[documented[0]]
        help_ = help_.replace("{tiers}", ", ".join(tiers.names()))  # (the registry's order)
        help_ = help_.replace("{unbounded}", _unbounded(table))
        head = "  " + ", ".join(names) + (f" {metavar}" if kind != "flag" else "")
        body = wrap(help_, 88, " " * 24)
        if len(head) < 22 and body:
            out.append(f"{head:<24}{body[0]}")
            body = body[1:]
        else:
            out.append(head)
        out.extend(" " * 24 + line for line in body)
    return "\n".join(out) + "\n"


def help_text(command: str | None = None) -> str:
    """``corral --help`` (every command), or one command's usage and options."""
    if command is None:
        width = max(len(f"corral {n} {u}") for n, (u, _, _) in COMMANDS.items())
        lines = [
            f"{'usage:' if i == 0 else '      '} {f'corral {n} {u}':<{width}}  {what}"
            for i, (n, (u, what, _)) in enumerate(COMMANDS.items())
        ]
        lines.append("       corral --version")
        lines.append("\ncorral COMMAND --help (or corral help COMMAND) lists its options.")
        return "\n".join(lines) + "\n\n" + _exit_codes()
    usage, what, table = COMMANDS[command]
    text = f"usage: corral {command} {usage}\n\n{what}\n\noptions:\n" + options_text(table)
    text += f"{'  -h, --help':<24}this text\n"
    if command in ("run", "shell", "mcp"):
        text += "\n" + _exit_codes()
    elif command in ("pending", "approve", "deny"):
        text += "\n" + _ANSWER_NOTES
    elif command == "batch":
        text += "\n" + _BATCH_NOTES
    elif command == "agent":
        text += "\n" + _AGENT_NOTES
    elif command == "k8s":
        text += "\n" + _K8S_NOTES
    return text


_ANSWER_NOTES = """\
A request is held when an ask rule decides it ([[network.rules]] action "ask"),
for at most [network] ask_timeout (default 30s); then it is denied.  These
commands reach only your own runs, through a socket in /tmp/corral-UID (mode
0700; $CORRAL_CONTROL_DIR instead, if set).

exit codes:
    0  done
    1  no such request is waiting (answered, timed out, or never was), or refused
    2  bad command line
  122  the control directory is not yours alone
"""


_BATCH_NOTES = """\
A job line: {"id": "j1", "command": ["pytest", "-q"] or "a shell string",
"workspace": DIR, "policy": FILE, "timeout": "10m", "memory", "pids", "cpus",
"env": [NAMES], "files": [PATHS copied in], "artifacts": [PATHS reported]}.
A result line: id, exit (the command's code, or corral run's), output (bounded),
duration, denials, artifacts, attempts, node; error when the job could not run.

exit codes:
    0  every job ran and exited 0
    1  some job failed or could not run (see its result)
    2  bad command line
  122  --ray: the ray package is missing or the cluster cannot be reached
"""


_AGENT_NOTES = """\
corral agent run does one task and prints the model's answer; corral agent serve
waits for events (--every, --stdin) until SIGINT or SIGTERM; corral agent log shows
the agent's activity log (DIR/activity.jsonl).  The model is asked from this
process, on the host: only its tool calls run in the sandbox, so its key never
enters it.

exit codes (corral agent run):
    0  the model answered
    1  the model did not finish within --max-turns
    2  bad command line, or no model server / model given
    3  the model server could not be used: unreachable, an error status, a
       malformed response
  122  refused: the tier or a requested limit is not available on this host
  125  the sandbox could not be set up
"""


_K8S_NOTES = """\
Prints one JSON List for kubectl apply -f: the sandbox (a Pod, or agent-sandbox's
SandboxTemplate or Sandbox), the governing proxy (Deployment, Service, the policy
in a ConfigMap, [secrets] from the Secret NAME-secrets), NetworkPolicies that let
the sandbox reach the proxy alone, and corral's seccomp profile, which each node
needs in its kubelet seccomp directory (--seccomp-profile prints it).  Nothing is
applied; see the README's Kubernetes section.

exit codes:
    0  printed
    2  bad command line or policy file; --image or --proxy-image missing
  122  refused: the policy asks for what a pod cannot honour (e.g. tier landlock,
       namespace or microvm; network.transparent)
"""


def _exit_codes() -> str:
    return "exit codes: the command's own code; 128+N if it died of signal N; and\n" + "".join(
        f"  {code:>3}  {text}\n" for code, text in EXIT_CODES.items()
    )
