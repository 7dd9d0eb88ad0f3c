"""The same policy as a macOS Seatbelt (``sandbox-exec``) profile: a pure text builder.

Deny by default; read everything except the read-deny paths; write only the
writable paths, minus the write-deny ones; network only to corral's proxy on
localhost.  Seatbelt rules are matched last-first, so each deny below follows
the allow it narrows.

Where the Linux tiers find nested repositories and ``.env`` files by walking
the workspace, Seatbelt can say it with path regexes, which also cover
repositories and files created after launch.
"""

from __future__ import annotations

from corral import defaults

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.policy import Policy


def quote(text: str) -> str:
    """An SBPL string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def regex_escape(text: str) -> str:
    special = set(".^$*+?()[]{}|\\")
    return "".join("\\" + c if c in special else c for c in text)


def path_filter(path: str) -> str:
    """``subpath`` for directories (trailing /), ``literal`` for files."""
    if path.endswith("/") and path != "/":
        return f"(subpath {quote(path.rstrip('/'))})"
    return f"(literal {quote(path)})"


def profile(policy: Policy, proxy_port: int | None = None) -> str:
    ws = policy.workspace
    ws_re = "^" + regex_escape(ws)
    lines = [
        "(version 1)",
        "(deny default)",
        ";; processes: run, fork, signal only inside this sandbox",
        "(allow process-exec process-fork)",
        "(allow signal (target same-sandbox))",
        "(allow sysctl-read)",
        '(allow mach-lookup (global-name "com.apple.system.logger"))',
        ";; reads: everything, minus the secrets",
        "(allow file-read*)",
    ]
    deny_read = [path_filter(p) for p in policy.read_deny_paths()]
    deny_read += [path_filter(p) for p in policy.read_deny_if_present()]
    names = "|".join(regex_escape(n) for n in defaults.READ_DENY_WORKSPACE_NAMES)
    deny_read.append(f'(regex #"{ws_re}/(.*/)?({names}|\\.env\\.[^/]*)$")')
    lines.append("(deny file-read*\n    " + "\n    ".join(deny_read) + ")")
    templates = "|".join(regex_escape(n) for n in defaults.ENV_TEMPLATES)
    lines.append(f'(allow file-read* (regex #"{ws_re}/(.*/)?({templates})$"))')
    lines.append(";; writes: the workspace, writable paths and scratch, minus write-deny paths")
    writable = [f"(subpath {quote(p)})" for p in policy.writable_paths()]
    writable += [
        '(subpath "/private/tmp")',
        '(subpath "/private/var/folders")',
        '(literal "/dev/null")',
        '(literal "/dev/tty")',
    ]
    lines.append("(allow file-write*\n    " + "\n    ".join(writable) + ")")
    deny_write = []
    for pattern in policy.write_deny_patterns():
        target = policy.expand(pattern)
        deny_write.append(path_filter(target + ("/" if pattern.endswith("/") else "")))
    git = "|".join(regex_escape(n.rstrip("/")) for n in defaults.GITDIR_WRITE_DENY)
    # every repository, nested or created later, and submodules under .git/modules
    deny_write.append(f'(regex #"{ws_re}/(.*/)?\\.git/(modules/.*/)?({git})(/.*)?$")')
    lines.append("(deny file-write*\n    " + "\n    ".join(deny_write) + ")")
    lines.append(";; network: only corral's proxy on this machine")
    if policy.network.mode == "proxy" and proxy_port is not None:
        lines.append(f'(allow network-outbound (remote tcp "localhost:{proxy_port}"))')
    else:
        lines.append(";; (no network at all)")
    return "\n".join(lines) + "\n"


def argv(policy: Policy, command: list[str], proxy_port: int | None = None) -> list[str]:
    return ["/usr/bin/sandbox-exec", "-p", profile(policy, proxy_port), "--", *command]
