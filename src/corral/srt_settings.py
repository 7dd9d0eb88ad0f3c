"""Settings JSON of srt (Anthropic's sandbox-runtime) as a corral policy.

``corral run --settings FILE.json`` and ``corral policy import FILE.json`` read
the file srt reads with ``srt --settings``.  Its filesystem and network keys
become corral's ``[filesystem]`` and ``[network]`` fields; every other key is
either one corral gives exactly as srt does on Linux (accepted) or an error that
names it and says why.  Nothing is dropped without a word, and no setting makes
corral weaker than its own defaults.  Where the two tools' defaults differ
(either way), corral's stay and ``policy import`` says so in comments.

The mapping was checked against the schema of srt 0.0.78.  It is pure apart
from resolving symlinks in the two checks that compare paths; nothing here is
on the hot path (``json`` is imported only when a settings file is given).
"""

from __future__ import annotations

import os

from corral import defaults
from corral.errors import PolicyError
from corral.paths import inside

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from corral.policy import Policy

SRT_VERSION = "0.0.78"

# What srt's own write protection covers in the directory it runs in (besides
# .git/hooks and .git/config, which corral protects in every repository).  The
# ones corral's defaults lack are added to write_deny, so a translated policy
# is never more writable than srt's.
SRT_PROTECTED = (
    ".gitconfig",
    ".gitmodules",
    ".bashrc",
    ".bash_profile",
    ".zshrc",
    ".zprofile",
    ".profile",
    ".ripgreprc",
    ".mcp.json",
    ".vscode/",
    ".idea/",
    ".claude/commands/",
    ".claude/agents/",
)


def protected_by_default(path: str) -> bool:
    """Whether corral's own defaults write-protect ``path`` (a name relative to the
    workspace), itself or as part of a protected directory."""
    return any(
        path == entry or (entry.endswith("/") and path.startswith(entry))
        for entry in defaults.WRITE_DENY_WORKSPACE
    )


# Where srt's defaults and corral's differ whatever the file says; printed by
# `corral policy import` above the TOML.
DEFAULT_DIFFERENCES = (
    "reads: srt lets the command read everything not in denyRead; corral also hides "
    "its built-in secrets (~/.ssh, ~/.aws, tokens, .env files in the workspace...): kept",
    "writes: srt also lets the command write ~/.npm/_logs and ~/.claude/debug; corral "
    "does not. A /tmp not in allowWrite is corral's private scratch space (srt: the "
    "host's, read-only)",
    "names: corral also refuses a name that resolves to a private or CGNAT address "
    "unless that address is allowed; srt also refuses the host's own public addresses, "
    "corral does not",
    "unix sockets: srt on Linux refuses to create any; corral lets the command use "
    "its own and hides the host's",
    "protected names (.bashrc, .mcp.json, .vscode...): srt finds them in subdirectories "
    "3 levels deep; corral in every directory its workspace walk reaches (6 levels), "
    "with .git hooks and config in every repository",
)

_GLOB_CHARS = frozenset("*?[]")

# JSON shapes, named as the error messages say them.
_BOOL = "true or false"
_STRINGS = "a list of strings"
_OBJECT = "an object"
_NUMBER = "a whole number"
_STRING = "a string"
_LIST = "a list"
_ANY = ""


def _shape_ok(value: object, shape: str) -> bool:
    if shape == _BOOL:
        return isinstance(value, bool)
    if shape == _STRINGS:
        return isinstance(value, list) and all(isinstance(x, str) for x in value)
    if shape == _LIST:
        return isinstance(value, list)
    if shape == _OBJECT:
        return isinstance(value, dict)
    if shape == _NUMBER:
        return isinstance(value, int) and not isinstance(value, bool)
    if shape == _STRING:
        return isinstance(value, str)
    return True


def _never(_value: object) -> bool:
    return False


def _false(value: object) -> bool:
    return value is False


def _empty(value: object) -> bool:
    return value == [] or value == {}


def _anything(_value: object) -> bool:
    return True


_HELPER = "configures srt's own helper programs; corral does not use them"
_MACOS = "a macOS setting of srt; corral runs on Linux"

# Keys that are not path or domain lists: (shape, which values corral accepts,
# why any other value is refused).  An accepted value is one that asks for no
# more than corral does anyway, in the same way srt does it on Linux.
_OTHER_KEYS: dict[str, tuple[str, Callable[[object], bool], str]] = {
    "network.strictAllowlist": (
        _BOOL,
        _anything,  # corral never asks anyone: an unlisted host is denied, as in srt's CLI
        "",
    ),
    "network.deniedDomainReasons": (
        _OBJECT,
        _empty,
        "corral's denials carry their own rule and reason; it has no reason text per entry",
    ),
    "network.deniedResolvedAddresses": (
        _STRINGS,
        _empty,
        "corral has no list of addresses a name may not resolve to; a [network] deny "
        "of those networks in a corral.toml also blocks them by address",
    ),
    "network.allowUnixSockets": (
        _STRINGS,
        _empty,
        "corral hides the host's unix sockets and cannot let some through",
    ),
    "network.allowAllUnixSockets": (
        _BOOL,
        _false,
        "corral hides the host's unix sockets and cannot open them all",
    ),
    "network.allowLocalBinding": (
        _BOOL,
        _false,
        "corral's sandbox listens only on its own loopback, which the host cannot reach",
    ),
    "network.allowMachLookup": (_STRINGS, _empty, _MACOS),
    "network.httpProxyPort": (
        _NUMBER,
        _never,
        "corral filters through its own proxy, never an external one",
    ),
    "network.socksProxyPort": (
        _NUMBER,
        _never,
        "corral filters through its own proxy, never an external one",
    ),
    "network.mitmProxy": (
        _OBJECT,
        _never,
        "corral's proxy connects to destinations itself; it routes nothing through another",
    ),
    "network.filterRequest": (_ANY, _never, "corral has no per-request filter callback"),
    "network.tlsTerminate": (
        _OBJECT,
        _never,
        "corral does not terminate TLS; it decides HTTPS on host and port",
    ),
    "network.parentProxy": (
        _OBJECT,
        _never,
        "corral's proxy connects directly; it has no upstream proxy",
    ),
    "filesystem.disabled": (
        _BOOL,
        _false,
        "corral cannot turn its filesystem protection off",
    ),
    "filesystem.allowRead": (
        _STRINGS,
        _empty,
        "corral cannot make a path readable inside an unreadable one",
    ),
    "filesystem.allowGitConfig": (
        _BOOL,
        _false,
        "corral keeps .git/config read-only: git runs what it names outside the sandbox",
    ),
    "credentials.envVars": (
        _LIST,
        _empty,
        "corral has no per-variable deny or masking; it withholds the launcher's "
        "environment but for PATH HOME LANG TERM TZ USER and the names a policy lists",
    ),
    "credentials.allowPlaintextInject": (_BOOL, _false, "corral has no credential masking"),
    "credentials.awsPairs": (_LIST, _empty, "corral has no credential masking"),
    "credentials.sigv4": (_OBJECT, _empty, "corral has no credential masking"),
    "ignoreViolations": (
        _OBJECT,
        _empty,
        "corral reports every denial; it has no list of violations to keep quiet",
    ),
    "enableWeakerNestedSandbox": (_BOOL, _false, "corral has no weaker mode"),
    "enableWeakerNetworkIsolation": (_BOOL, _false, _MACOS),
    "allowAppleEvents": (_BOOL, _false, _MACOS),
    # srt applies it on macOS only; on Linux ptys work in srt's sandbox and corral's
    "allowPty": (_BOOL, _anything, ""),
    "mandatoryDenySearchDepth": (
        _NUMBER,
        _never,
        "corral has no such setting: it protects .git in repositories and srt's other "
        "protected names in every directory its workspace walk reaches (6 levels)",
    ),
    "git": (
        _OBJECT,
        lambda v: v == {} or v == {"safeDirectories": []},
        "corral sets no git configuration (safe.directory) inside the sandbox",
    ),
    "ripgrep": (_OBJECT, _never, _HELPER),
    "seccomp": (_OBJECT, _never, _HELPER),
    "bwrapPath": (_STRING, _never, _HELPER),
    "socatPath": (_STRING, _never, _HELPER),
    "javaAgentJarPath": (_STRING, _never, _HELPER),
    "windows": (_OBJECT, _never, "Windows settings of srt; corral runs on Linux"),
}


def _schema() -> dict[str, tuple[str, ...]]:
    """Every key of srt's schema, by section ("" = top level), for "unknown key"."""
    sections: dict[str, tuple[str, ...]] = {
        "": ("network", "filesystem", "credentials"),
        "network": ("allowedDomains", "deniedDomains"),
        "filesystem": ("denyRead", "allowWrite", "denyWrite"),
        "credentials": ("files",),
    }
    for dotted in _OTHER_KEYS:
        section, _, name = dotted.rpartition(".")
        sections[section] += (name,)
    return sections


_SECTIONS = _schema()


class Translation:
    """The corral policy fields a settings file sets, and what to tell the reader."""

    __slots__ = ("allow", "deny", "mode", "notes", "read_deny", "writable", "write_deny")

    def __init__(self) -> None:
        self.writable: list[str] = []
        self.read_deny: list[str] = []
        self.write_deny: list[str] = []
        self.mode = "none"
        self.allow: list[str] = []
        self.deny: list[str] = []
        self.notes: list[str] = []  # comments for `policy import`, beyond DEFAULT_DIFFERENCES


class _Reader:
    """Walks one settings object; every error names the file and the key path."""

    def __init__(self, source: str, workspace: str, home: str) -> None:
        self.source = source
        self.workspace = workspace
        self.home = home
        self.out = Translation()

    def fail(self, key: str, why: str) -> PolicyError:
        return PolicyError(f"{self.source}: {key}: {why}")

    def section(self, key: str, value: object) -> dict[str, object]:
        """An object whose keys srt knows; its keys checked against srt's schema."""
        if not isinstance(value, dict):
            raise self.fail(key or "(top level)", f"expected {_OBJECT}")
        known = _SECTIONS[key]
        for name in value:
            if name not in known:
                raise self.fail(_join(key, name), _unknown(name, known))
        return value

    def other(self, key: str, value: object) -> None:
        shape, accepts, why = _OTHER_KEYS[key]
        if shape and not _shape_ok(value, shape):
            raise self.fail(key, f"expected {shape}")
        if not accepts(value):
            raise self.fail(key, f"not supported: {why}")

    def strings(self, key: str, value: object) -> list[str]:
        if not _shape_ok(value, _STRINGS):
            raise self.fail(key, f"expected {_STRINGS}")
        assert isinstance(value, list)
        return value

    # -- filesystem --------------------------------------------------------------

    def path(self, key: str, entry: str, directory: bool) -> str:
        """An srt path as corral spells it (``~`` and relative paths keep their meaning)."""
        if not entry or "\0" in entry:
            raise self.fail(key, f"{entry!r}: not a path")
        text = entry
        if text.endswith("/**"):  # srt: the directory and everything in it
            text = text[:-3] or "/"
            if directory and not text.endswith("/"):
                text += "/"
        if _GLOB_CHARS & set(text):
            raise self.fail(
                key,
                f"{entry!r}: corral has no glob patterns (srt on Linux expands them "
                "once, at launch): list the paths",
            )
        if text.startswith("~") and text != "~" and not text.startswith("~/"):
            text = "./" + text  # srt expands only ~ and ~/: "~name" is a relative name
        return text

    def absolute(self, path: str) -> str:
        """Where corral will put ``path``: ``~`` is home, relative is the workspace."""
        if path == "~" or path.startswith("~/"):
            path = self.home + path[1:]
        try:
            return os.path.realpath(os.path.join(self.workspace, path))
        except OSError as exc:  # (/proc/1/root: a link this user may not follow)
            raise self.fail("filesystem", f"{path}: {exc.strerror or exc}") from None

    def filesystem(self, value: object) -> None:
        fs = self.section("filesystem", value)
        out = self.out
        lists = {"denyRead": out.read_deny, "allowWrite": out.writable, "denyWrite": out.write_deny}
        for name, item in fs.items():
            key = f"filesystem.{name}"
            if name not in lists:
                self.other(key, item)
                continue
            for i, entry in enumerate(self.strings(key, item)):
                lists[name].append(self.path(f"{key}[{i}]", entry, name != "allowWrite"))
        self.check_writable()
        # "." is the workspace, which corral makes writable anyway (listing it binds it twice)
        out.writable = [p for p in out.writable if os.path.normpath(p) != "."]
        extra = [p for p in SRT_PROTECTED if not protected_by_default(p)]
        out.write_deny += [p for p in extra if p not in out.write_deny]
        if extra:
            out.notes.append(
                "write_deny ends with what srt protects by default and corral's defaults "
                f"do not: {' '.join(extra)}"
            )

    def check_writable(self) -> None:
        """Refuse what corral would leave more writable than srt does."""
        roots = [self.absolute(p) for p in self.out.writable]
        if not any(inside(self.workspace, root) for root in roots):
            raise self.fail(
                "filesystem.allowWrite",
                f"does not include the workspace {self.workspace}, which corral always "
                'makes writable: add "." (or run in a directory it lists)',
            )
        roots.append(self.workspace)
        for i, path in enumerate(self.out.write_deny):
            denied = self.absolute(path)
            # corral makes read-only what lies inside a writable path, and with it
            # any writable path further down; srt also a writable path below a
            # denied one outside every writable path, which corral cannot do
            below = [r for r in roots if r != denied and inside(r, denied)]
            if below and not any(inside(denied, r) for r in roots):
                raise self.fail(
                    f"filesystem.denyWrite[{i}]",
                    f"{path!r} lies above the writable {below[0]}, which srt makes "
                    "read-only and corral cannot from outside it: leave that out of allowWrite",
                )

    # -- network -------------------------------------------------------------------

    def network(self, value: object) -> None:
        net = self.section("network", value)
        out = self.out
        for name, item in net.items():
            key = f"network.{name}"
            if name == "allowedDomains":
                entries = enumerate(self.strings(key, item))
                out.allow = [self.domain(f"{key}[{i}]", e, False) for i, e in entries]
            elif name == "deniedDomains":
                entries = enumerate(self.strings(key, item))
                out.deny = [self.domain(f"{key}[{i}]", e, True) for i, e in entries]
            else:
                self.other(key, item)
        out.mode = "proxy" if out.allow else "none"

    def domain(self, key: str, entry: str, denied: bool) -> str:
        """An srt domain pattern as a corral rule that matches the same destinations.

        srt's ``*.example.com`` matches subdomains at any depth and not the apex,
        exactly as corral's does; ``host:443`` restricts the port in both; an
        address matches that address, and lets a name resolve to it, in both.
        """
        if "/" in entry:
            raise self.fail(key, f"{entry!r}: srt takes a host name or address, not a URL or path")
        host = _srt_host(entry)
        if host is None:
            raise self.fail(key, f"{entry!r}: bad port or IPv6 address (write [::1]:443)")
        if not (denied and host == "*"):
            why = _srt_refuses(host)
            if why:
                raise self.fail(key, f"{entry!r}: {why}")
        from corral.net.rules import Rule

        try:
            Rule(entry)
        except ValueError as exc:
            raise self.fail(key, str(exc)) from None
        return entry

    # -- the rest ------------------------------------------------------------------

    def credentials(self, value: object) -> None:
        creds = self.section("credentials", value)
        for name, item in creds.items():
            if name != "files":
                self.other(f"credentials.{name}", item)
                continue
            if not isinstance(item, list):
                raise self.fail("credentials.files", f"expected {_LIST}")
            for i, entry in enumerate(item):
                self.credential_file(f"credentials.files[{i}]", entry)

    def credential_file(self, key: str, entry: object) -> None:
        """``mode: "deny"`` makes a file unreadable, as read_deny does; masking is refused."""
        if not isinstance(entry, dict):
            raise self.fail(key, f"expected {_OBJECT}")
        for name in entry:
            if name not in ("path", "mode"):
                raise self.fail(f"{key}.{name}", "not supported: corral has no credential masking")
        path, mode = entry.get("path"), entry.get("mode")
        if not isinstance(path, str):
            raise self.fail(f"{key}.path", f"expected {_STRING}")
        if mode != "deny":
            raise self.fail(
                f"{key}.mode",
                f'{mode!r}: only "deny" (unreadable) is supported; corral has no masking',
            )
        self.out.read_deny.append(self.path(f"{key}.path", path, True))


def _join(section: str, name: str) -> str:
    return f"{section}.{name}" if section else name


def _unknown(name: str, known: tuple[str, ...]) -> str:
    import difflib

    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]}?" if close else f"srt {SRT_VERSION} has {', '.join(known)}"
    return f"unknown key ({hint})"


def _srt_host(entry: str) -> str | None:
    """The host of ``host``, ``host:443``, ``[v6]`` or ``[v6]:443``; None where srt
    would not read the entry (an unbracketed IPv6 address, a port it does not take)."""
    if entry.startswith("["):
        close = entry.find("]")
        rest = entry[close + 1 :]
        if close < 0 or (rest and not (rest.startswith(":") and _srt_port(rest[1:]))):
            return None
        return entry[1:close]
    if entry.count(":") > 1:
        return None
    host, colon, port = entry.partition(":")
    return None if colon and not _srt_port(port) else host


def _srt_port(text: str) -> bool:
    """srt takes 1-65535 written without leading zeros."""
    return text.isascii() and text.isdigit() and text[0] != "0" and int(text) <= 65535


def _srt_refuses(host: str) -> str:
    """Why srt's schema (or corral, for ``localhost``) rejects a host pattern; "" if fine."""
    import ipaddress

    try:
        if ipaddress.ip_address(host).version == 6:
            return ""
    except ValueError:
        pass
    if not host or any(c.isspace() for c in host):
        return "srt would match no host with it"
    if host == "localhost":
        # srt lets "localhost" resolve to loopback; corral refuses names that do
        return "corral refuses names that resolve to loopback: allow the address (127.0.0.1:PORT)"
    if "*" in host:
        base = host[2:]
        if not host.startswith("*.") or "*" in base or "." not in base:
            return "srt takes *.example.com (two labels at least after *.), not other wildcards"
    if "." not in host or host.startswith(".") or host.endswith("."):
        return "srt takes a domain with a dot, *.domain or an address"
    return ""


# -- entry points -------------------------------------------------------------------


def translate(data: object, source: str, workspace: str, home: str) -> Translation:
    """A parsed settings file -> corral's fields; PolicyError (one line, exit 2) otherwise.

    ``workspace`` (a real path) and ``home`` are where relative and ``~`` paths lead.
    """
    reader = _Reader(source, workspace, home)
    top = reader.section("", data)
    handlers = {
        "network": reader.network,
        "filesystem": reader.filesystem,
        "credentials": reader.credentials,
    }
    for name, value in top.items():
        if name in handlers:
            handlers[name](value)
        else:
            reader.other(name, value)
    if "filesystem" not in top:
        reader.filesystem({})  # the workspace check and srt's protections still apply
    return reader.out


def apply(tr: Translation, policy: Policy) -> None:
    """Set ``policy``'s filesystem and network fields from a translation."""
    fs, net = policy.filesystem, policy.network
    fs.writable = list(tr.writable)
    fs.read_deny = list(tr.read_deny)
    fs.write_deny = list(tr.write_deny)
    net.mode, net.allow, net.deny = tr.mode, list(tr.allow), list(tr.deny)


def read(path: str, sha256: str | None = None, raw: bytes | None = None) -> object:
    """The JSON in ``path``; PolicyError names the file and, for bad JSON, the place.
    ``sha256``: what the file must hold (read once: what is checked is what is used);
    ``raw``: its bytes, read already (corral.policy.read_policy)."""
    import json

    if raw is None:
        from corral.policy import read_policy

        raw, _ = read_policy(path, "settings file")
    if sha256 is not None:
        import hashlib

        if hashlib.sha256(raw).hexdigest() != sha256.lower():
            raise PolicyError(f"{path}: the settings file does not hold what was pinned; not run")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise PolicyError(f"{path}: settings file is not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise PolicyError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    except RecursionError:
        raise PolicyError(f"{path}: invalid JSON: nested too deeply") from None


def _workspace(workspace: str | None) -> str:
    from corral.policy import check_workspace, home_dirs

    ws = os.path.realpath(workspace or os.getcwd())
    check_workspace(ws, home_dirs())
    return ws


def load(path: str, workspace: str | None = None, sha256: str | None = None) -> Policy:
    """corral's defaults plus the settings in ``path`` (srt's JSON), for ``workspace``
    (``sha256``: what the file must hold; without it, a file a sandboxed run could
    have rewritten is refused, as a policy file is)."""
    from corral.policy import Policy, check_found, read_policy

    ws = _workspace(workspace)
    raw, changed = read_policy(path, "settings file")
    if sha256 is None:
        check_found(path, named=True, read=changed)
    tr = translate(read(path, sha256, raw), path, ws, os.path.expanduser("~"))
    policy = Policy(ws)
    policy.source = os.path.realpath(path)  # write-protected when inside the workspace
    apply(tr, policy)
    return policy


def import_toml(path: str, workspace: str | None = None) -> str:
    """The corral.toml equivalent of the settings in ``path``, with comments."""
    ws = _workspace(workspace)
    return to_toml(translate(read(path), path, ws, os.path.expanduser("~")), path)


def to_toml(tr: Translation, source: str) -> str:
    lines = [
        f"# corral policy from srt settings {_comment(source)} (srt {SRT_VERSION}),",
        "# by `corral policy import`. Where srt and corral differ:",
        *(f"#   - {note}" for note in (*DEFAULT_DIFFERENCES, *tr.notes)),
        "",
        "[filesystem]",
        f"writable = {_toml_list(tr.writable)}",
        f"read_deny = {_toml_list(tr.read_deny)}",
        f"write_deny = {_toml_list(tr.write_deny)}",
        "",
        "[network]",
        f"mode = {_toml_str(tr.mode)}",
    ]
    if tr.allow:
        lines.append(f"allow = {_toml_list(tr.allow)}")
    if tr.deny:
        lines.append(f"deny = {_toml_list(tr.deny)}")
    return "\n".join(lines) + "\n"


def _comment(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)


def _toml_str(text: str) -> str:
    out = ['"']
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif c < " " or c == "\x7f":
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def _toml_list(items: list[str]) -> str:
    if not items:
        return "[]"
    return "[\n" + "".join(f"  {_toml_str(item)},\n" for item in items) + "]"
