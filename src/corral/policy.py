"""The one policy model every tier reads, loaded and validated at the edge.

A policy comes from built-in defaults, then a TOML file (``corral.toml`` in the
workspace or ``--policy FILE``), then command-line flags.  Tiers never look at
TOML or flags: they receive a validated :class:`Policy`.

This module sits on the CLI's hot path, so it avoids ``dataclasses``,
``typing`` and ``re`` at import time (each costs milliseconds); ``tomllib`` is
imported only when a policy file exists.
"""

from __future__ import annotations

import os

from corral import defaults
from corral.errors import PolicyError
from corral.paths import inside

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from corral.net.guardrails import Guardrail

NETWORK_MODES = ("none", "proxy")
ASK_TIMEOUT = 30.0  # [network] ask_timeout's default, in seconds
ASK_TIMEOUT_MAX = 3600.0


class FilesystemPolicy:
    __slots__ = ("hardlinks", "home", "read_deny", "use_defaults", "writable", "write_deny")

    def __init__(self) -> None:
        self.writable: list[str] = []  # beyond the workspace
        self.read_deny: list[str] = []  # added to the defaults
        self.write_deny: list[str] = []  # added to the defaults
        self.use_defaults = True  # the built-in secret and write-deny lists
        # hard-linked files in the workspace: "read-only" for the run, or "refuse" to run
        self.hardlinks = defaults.HARDLINK_POLICIES[0]
        # where the command's writes under ~ go: "persist" (a per-workspace home layer
        # kept between runs), "ephemeral" (a fresh one per run) or "read-only" (none)
        self.home = defaults.HOME_MODES[0]


class EnvPolicy:
    __slots__ = ("pass_names", "set_values")

    def __init__(self) -> None:
        self.pass_names: list[str] = []  # names copied from the launcher's environment
        self.set_values: dict[str, str] = {}  # fixed values from the policy itself


class Limits:
    """What bounds a run.  Each of ``timeout memory pids cpus tmp shm`` is, in order:
    a value the policy or a flag set; lifted (``"none"``: no bound, in ``lifted``);
    or this host's default (``defaults``, from :func:`corral.bounds.defaults_for`,
    filled where the policy is loaded: :func:`load` and ``Sandbox``).  :meth:`get`
    answers which applies; tiers read only that."""

    __slots__ = (
        "cpus",
        "defaults",
        "lifted",
        "memory",
        "output",
        "pids",
        "shm",
        "timeout",
        "tmp",
    )

    def __init__(self) -> None:
        self.timeout: float | None = None  # seconds of wall clock
        self.memory: int | None = None  # bytes
        self.pids: int | None = None
        self.cpus: float | None = None
        self.tmp: int | None = None  # bytes: each of the private /tmp and /var/tmp
        self.shm: int | None = None  # bytes: the private /dev/shm
        self.output: int = defaults.OUTPUT_LIMIT  # bytes of stdout+stderr kept
        self.lifted: set[str] = set()  # names set to "none"
        self.defaults: dict[str, int] = {}  # this host's defaults, by name

    def get(self, name: str) -> float | None:
        """The bound that applies: set, else none if lifted, else the default."""
        value: float | None = getattr(self, name)
        if value is not None or name in self.lifted:
            return value
        return self.defaults.get(name)

    def source(self, name: str) -> str:
        """``set``, ``none`` (lifted), ``default`` or ``""`` (no bound at all)."""
        if getattr(self, name) is not None:
            return "set"
        if name in self.lifted:
            return "none"
        return "default" if name in self.defaults else ""

    def lift(self, name: str) -> None:
        setattr(self, name, None)
        self.lifted.add(name)

    def assign(self, name: str, raw: object, parse: Callable[[object], object]) -> None:
        """Set ``name`` from a policy or flag value; ``"none"`` lifts it."""
        if isinstance(raw, str) and raw.strip().lower() == "none":
            self.lift(name)
            return
        setattr(self, name, parse(raw))
        self.lifted.discard(name)


class NetworkPolicy:
    __slots__ = ("allow", "ask_timeout", "deny", "hosts", "mode", "rules", "transparent")

    def __init__(self) -> None:
        self.mode = "none"
        self.allow: list[str] = []
        self.deny: list[str] = []
        self.transparent = False  # capture all TCP/DNS, not only proxy-aware tools (root)
        self.hosts: dict[str, str] = {}  # name -> address, used by the proxy instead of DNS
        # [[network.rules]]: methods and paths per host, each entry validated and
        # normalized (see corral.net.httprules); compiled by the proxy
        self.rules: list[dict[str, object]] = []
        # how long an ask holds its request for a person's answer (then: deny)
        self.ask_timeout = ASK_TIMEOUT


class Secret:
    """``[secrets.NAME]``: where the real value is read from (``env:VAR`` or
    ``file:PATH``; the value itself is read only by the proxy's side, at the
    start of a run, and never kept here), the hosts it may be sent to, and an
    optional header to set on every request to them.  The placeholder the
    sandbox holds under ``NAME`` is made per run (:mod:`corral.net.secrets`)."""

    __slots__ = ("format", "header", "hosts", "name", "source")

    def __init__(
        self, name: str, source: str, hosts: list[str], header: str = "", format: str = ""
    ) -> None:
        self.name = name
        self.source = source
        self.hosts = hosts
        self.header = header  # lower-case header name, or "" for none
        self.format = format or "{value}"

    @property
    def kind(self) -> str:
        """``env`` or ``file``."""
        return self.source.partition(":")[0]

    @property
    def ref(self) -> str:
        """The variable's name or the file's path, as written."""
        return self.source.partition(":")[2]

    def __repr__(self) -> str:
        return f"Secret({self.name!r}, from={self.source!r}, hosts={self.hosts!r})"


TLS_CA_CHOICES = ("user", "ephemeral")


class TlsPolicy:
    """``[tls]``: the CA that signs intercepted connections, and which hosts are
    never (``passthrough``) or always (``inspect``) intercepted."""

    __slots__ = ("ca", "ca_cert", "ca_key", "inspect", "passthrough", "upstream_ca")

    def __init__(self) -> None:
        self.ca = "user"  # one CA per user in corral's state directory; or "ephemeral"
        self.ca_cert = ""  # the user's own CA (with ca_key); absolute once loaded
        self.ca_key = ""
        self.upstream_ca: list[str] = []  # CA files trusted upstream besides the host's
        self.passthrough: list[str] = []  # host patterns never intercepted
        self.inspect: list[str] = []  # host patterns intercepted for the audit log alone

    def is_default(self) -> bool:
        return not (
            self.ca != "user"
            or self.ca_cert
            or self.ca_key
            or self.upstream_ca
            or self.passthrough
            or self.inspect
        )


class GuardrailsPolicy:
    """``[guardrails]``: directories of guardrail files (corral.net.guardrails)
    and the action each risk tier gets."""

    __slots__ = ("dirs", "files", "tiers")

    def __init__(self) -> None:
        self.dirs: list[str] = []  # absolute once loaded
        # tier (lower case, "null" for none) -> log, allow, ask or deny
        self.tiers: dict[str, str] = dict(GUARDRAIL_TIER_ACTIONS)
        self.files: list[Guardrail] | None = None  # parsed once: check_guardrails


# the defaults of [guardrails.tiers] (corral.net.guardrails.DEFAULT_TIER_ACTIONS
# says why; kept equal there, here without importing it)
GUARDRAIL_TIER_ACTIONS = {
    "low": "log",
    "medium": "log",
    "high": "ask",
    "critical": "deny",
    "null": "ask",
}


class ContainerPolicy:
    """The container tier's choices; empty means "detect" (engine) or "not set" (image)."""

    __slots__ = ("engine", "image", "runtime")

    def __init__(self) -> None:
        self.engine = ""  # podman or docker; "" = $CORRAL_ENGINE, else the first found
        self.runtime = ""  # OCI runtime (runc, runsc, crun); "" = $CORRAL_OCI_RUNTIME or runc
        self.image = ""  # "" = $CORRAL_IMAGE; refused when still empty


class Policy:
    """Everything a tier needs to know, with paths already absolute."""

    __slots__ = (
        "container",
        "env",
        "filesystem",
        "guardrails",
        "limits",
        "network",
        "secrets",
        "source",
        "tier",
        "tls",
        "workspace",
    )

    def __init__(self, workspace: str) -> None:
        self.workspace = workspace
        self.tier = "auto"
        self.source: str | None = None  # the policy file, if one was read
        self.filesystem = FilesystemPolicy()
        self.env = EnvPolicy()
        self.limits = Limits()
        self.network = NetworkPolicy()
        self.container = ContainerPolicy()
        self.tls = TlsPolicy()
        self.secrets: dict[str, Secret] = {}  # [secrets.NAME], by NAME
        self.guardrails = GuardrailsPolicy()

    @classmethod
    def load(
        cls, path: str | None = None, workspace: str | None = None, sha256: str | None = None
    ) -> Policy:
        """Defaults, then ``path`` (or the workspace's corral.toml if there is one);
        ``sha256``: what ``path`` must hold (then loaded even if a run could have
        written it: you vouch for that content)."""
        return load(workspace, path, sha256)

    # -- derived views -------------------------------------------------------

    def home(self) -> str:
        return os.path.expanduser("~")

    def expand(self, path: str) -> str:
        """Make a policy path absolute: ``~`` is the user's home, relative is the workspace."""
        if path.startswith("~"):
            path = os.path.expanduser(path)
        if not os.path.isabs(path):
            path = os.path.join(self.workspace, path)
        return os.path.normpath(path)

    def writable_paths(self) -> list[str]:
        return [self.workspace, *(self.expand(p) for p in self.filesystem.writable)]

    def homes(self) -> list[str]:
        """The user's homes: $HOME and the password database's (see home_dirs)."""
        return home_dirs()

    def read_deny_paths(self) -> list[str]:
        """Absolute read-deny paths; entries ending in ``/`` stay marked as directories."""
        items = list(defaults.READ_DENY_HOME) if self.filesystem.use_defaults else []
        items += self.filesystem.read_deny
        # a secret's file is the real value: never readable inside, defaults or not
        items += [s.ref for s in self.secrets.values() if s.kind == "file"]
        if self.tls.ca_key:  # the user's own CA: with its key, any certificate it signs
            items.append(self.tls.ca_key)
        return _expand_keep_slash(self, items)

    def read_deny_if_present(self) -> list[str]:
        """Built-in read-deny paths that are masked only when they exist at launch."""
        items = list(defaults.READ_DENY_IF_PRESENT) if self.filesystem.use_defaults else []
        return _expand_keep_slash(self, items)

    def read_deny_from_env(self, environ: Mapping[str, str]) -> list[tuple[str, str]]:
        """(variable, absolute path) for the built-in secrets ``environ`` (the
        launcher's) moves out of ~ (defaults.READ_DENY_ENV): with GNUPGHOME or
        KUBECONFIG set, ~/.gnupg is not where the keys are (found by attacking
        corral).  Directories end in ``/``; relative values are skipped (relative
        to a directory corral does not know).  None when the defaults are off."""
        if not self.filesystem.use_defaults:
            return []
        found: list[tuple[str, str]] = []
        config = environ.get("XDG_CONFIG_HOME", "")
        if os.path.isabs(config):
            lists = (*defaults.READ_DENY_HOME, *defaults.READ_DENY_IF_PRESENT)
            moved = [e[len("~/.config/") :] for e in lists if e.startswith("~/.config/")]
            found += [("XDG_CONFIG_HOME", os.path.join(config, rel)) for rel in moved]
        for name, rels in defaults.READ_DENY_ENV.items():
            raw = environ.get(name, "")
            for value in raw.split(":") if name == "KUBECONFIG" else [raw]:
                if not os.path.isabs(value):
                    continue
                value = os.path.normpath(value)
                for rel in rels:
                    path = value + rel if rel in ("", "/") else os.path.join(value, rel)
                    found.append((name, path if path != "//" else "/"))
        return found

    def write_deny_patterns(self) -> list[str]:
        """Write-deny names relative to every repository/workspace root, plus absolutes."""
        items = list(defaults.WRITE_DENY_WORKSPACE) if self.filesystem.use_defaults else []
        # The policy must never be editable by what it confines, defaults or not:
        # the workspace's corral.toml is what the next plain `corral run` loads.
        items.append(defaults.POLICY_FILENAME)
        if self.source and inside(self.source, self.workspace):
            items.append(os.path.relpath(self.source, self.workspace))
        items += self.filesystem.write_deny
        # guardrail files are policy too: what the next run enforces
        items += [d.rstrip("/") + "/" for d in self.guardrails.dirs]
        # and so are the [tls] files: what the proxy trusts upstream, and the CA
        # certificate clients are told to trust (the key is masked: read_deny_paths)
        items += [p for p in (self.tls.ca_cert, *self.tls.upstream_ca) if p]
        return items

    def to_dict(self) -> dict[str, object]:
        """A canonical view, used for the digest in the activity log and for ``--explain``."""
        lim = self.limits
        out: dict[str, object] = {
            "workspace": self.workspace,
            "tier": self.tier,
            "filesystem": {
                "writable": list(self.filesystem.writable),
                "read_deny": list(self.filesystem.read_deny),
                "write_deny": list(self.filesystem.write_deny),
                "defaults": self.filesystem.use_defaults,
            },
            "env": {"pass": list(self.env.pass_names), "set": sorted(self.env.set_values)},
            "limits": _limits_dict(lim),
            "network": {
                "mode": self.network.mode,
                "allow": list(self.network.allow),
                "deny": list(self.network.deny),
                "transparent": self.network.transparent,
                "hosts": dict(sorted(self.network.hosts.items())),
            },
        }
        fs = out["filesystem"]
        assert isinstance(fs, dict)
        if self.filesystem.hardlinks != defaults.HARDLINK_POLICIES[0]:  # as for container
            fs["hardlinks"] = self.filesystem.hardlinks
        if self.filesystem.home != defaults.HOME_MODES[0]:  # digests of older runs stay equal
            fs["home"] = self.filesystem.home
        box = self.container
        if box.engine or box.runtime or box.image:  # absent: digests of older runs stay equal
            out["container"] = {"engine": box.engine, "runtime": box.runtime, "image": box.image}
        tls = self.tls
        if not tls.is_default():  # as for container
            out["tls"] = {
                "ca": tls.ca,
                "ca_cert": tls.ca_cert,
                "ca_key": tls.ca_key,
                "upstream_ca": list(tls.upstream_ca),
                "passthrough": list(tls.passthrough),
                "inspect": list(tls.inspect),
            }
        net = out["network"]
        assert isinstance(net, dict)
        if self.network.rules:  # as for container
            net["rules"] = [dict(entry) for entry in self.network.rules]
        if self.network.ask_timeout != ASK_TIMEOUT:  # as for container
            net["ask_timeout"] = self.network.ask_timeout
        if self.secrets:  # where each comes from and where it may go: never a value
            out["secrets"] = {
                name: {
                    "from": s.source,
                    "hosts": list(s.hosts),
                    "header": s.header,
                    "format": s.format,
                }
                for name, s in sorted(self.secrets.items())
            }
        guard = self.guardrails
        if guard.dirs:  # as for container
            view: dict[str, object] = {"dirs": list(guard.dirs), "tiers": dict(guard.tiers)}
            if guard.files is not None:  # what was enforced, in the run log's digest too
                view["files"] = {g.path: g.hash for g in guard.files}
            out["guardrails"] = view
        return out


def _limits_dict(lim: Limits) -> dict[str, object]:
    out: dict[str, object] = {
        "timeout": lim.timeout,
        "memory": lim.memory,
        "pids": lim.pids,
        "cpus": lim.cpus,
        "output": lim.output,
    }
    # only when used: the digests of policies that never name them stay as they were
    for name in ("tmp", "shm"):
        if getattr(lim, name) is not None:
            out[name] = getattr(lim, name)
    if lim.lifted:
        out["none"] = sorted(lim.lifted)
    return out


def _expand_keep_slash(policy: Policy, items: Iterable[str]) -> list[str]:
    """Absolute paths; a ``~/`` item once for each of the user's homes: $HOME and
    the password database's, when they differ (a corral run with another HOME,
    as a Ray node or a service may start it, left the account's real ~/.ssh
    and shell history readable: found by attacking corral)."""
    out = []
    home = os.path.expanduser("~").rstrip("/")  # once: the defaults hold some sixty ~ paths
    homes = [home, *(h for h in home_dirs() if h != os.path.realpath(home))]
    for item in items:
        if item.startswith("~/"):
            fulls = [os.path.normpath(h + item[1:]) for h in homes]
        else:
            fulls = [policy.expand(item)]
        out += [f + "/" if item.endswith("/") and f != "/" else f for f in fulls]
    return out


# -- value parsers (shared by the TOML loader and the flags) -------------------

_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_TIME_UNITS = {"": 1.0, "s": 1.0, "ms": 0.001, "m": 60.0, "h": 3600.0}


def parse_size(value: object) -> int:
    """``512M``, ``1.5G``, ``100k``, ``4096B``: binary multiples; raises ValueError.

    A number needs its unit (``B`` for bytes): ``memory = 512`` could mean bytes or
    megabytes, and guessing either way gives a limit nobody asked for.  Only 0
    stands alone."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 512M")
    if isinstance(value, int):
        if not 0 <= value < 2**63:
            raise ValueError(f"bad size {value!r}: out of range")
        number, unit, bare = float(value), "", True
    elif isinstance(value, str):
        text = value.strip().lower()
        stripped = text.removesuffix("ib").removesuffix("b")
        digits = stripped.rstrip("kmgt")
        unit = stripped[len(digits) :]
        bare = stripped == text and not unit
        try:
            number = float(digits)
        except ValueError:
            raise ValueError(f"bad size {value!r}: use a number with K, M, G or T") from None
    else:
        raise ValueError("expected a size such as 512M")
    if unit not in _SIZE_UNITS or not 0 <= number < 2**63 / _SIZE_UNITS[unit]:
        raise ValueError(f"bad size {value!r}: use a number with K, M, G or T")
    if bare and number != 0:
        shown = str(value).strip()
        raise ValueError(
            f"size {shown} has no unit: write {shown}M for megabytes, or {shown}B for bytes"
        )
    return int(number * _SIZE_UNITS[unit])


def parse_duration(value: object) -> float:
    """``30``, ``30s``, ``500ms``, ``5m``, ``1h`` → seconds; raises ValueError."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            raise ValueError(f"bad duration {value!r}: out of range") from None
    elif isinstance(value, str):
        text = value.strip().lower()
        digits = text.rstrip("smh")
        unit = text[len(digits) :]
        if unit not in _TIME_UNITS:
            raise ValueError(f"bad duration {value!r}: use s, ms, m or h")
        try:
            seconds = float(digits) * _TIME_UNITS[unit]
        except ValueError:
            raise ValueError(f"bad duration {value!r}: use s, ms, m or h") from None
    else:
        raise ValueError("expected a duration such as 30s")
    if not 0 < seconds < 10**9:
        raise ValueError(f"bad duration {value!r}: must be more than zero")
    return seconds


def _expect_ask_timeout(value: object) -> float:
    seconds = parse_duration(value)
    if seconds > ASK_TIMEOUT_MAX:
        raise ValueError(f"bad duration {value!r}: at most 1h (a client would give up first)")
    return seconds


def parse_cpus(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError("expected a number of CPUs such as 1.5")
    try:
        cpus = float(value)
    except (ValueError, OverflowError):
        raise ValueError(f"bad cpus {value!r}: expected a number such as 1.5") from None
    if not 0.01 <= cpus <= 4096:
        raise ValueError(f"bad cpus {value!r}: must be between 0.01 and 4096")
    return cpus


MIN_MEMORY = 16 << 20  # below this not even the sandbox's own start-up fits
MIN_SCRATCH = 1 << 20  # a tmpfs of size 0 would be unbounded, not empty


def parse_memory(value: object) -> int:
    size = parse_size(value)
    if size < MIN_MEMORY:
        raise ValueError(f"memory {value!r} is too small: at least 16M, or none")
    return size


def parse_scratch(value: object) -> int:
    """The size of a private tmpfs (``tmp``, ``shm``)."""
    size = parse_size(value)
    if size < MIN_SCRATCH:
        raise ValueError(f"size {value!r} is too small: at least 1M, or none")
    return size


def parse_pids(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("expected a whole number of processes")
    try:
        pids = int(value)
    except ValueError:
        raise ValueError(f"bad pids {value!r}: expected a whole number") from None
    if pids < 1:
        raise ValueError("pids must be at least 1")
    return pids


def check_env_name(name: object) -> str:
    if not isinstance(name, str) or not name or "=" in name or "\0" in name:
        raise ValueError(f"bad environment variable name {name!r}")
    return name


# -- the TOML loader -------------------------------------------------------------


def _expect_str(v: object) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected a string, got {type(v).__name__}")
    return v


def _expect_str_list(v: object) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ValueError("expected a list of strings")
    return list(v)


class EntryError(ValueError):
    """A problem with one key of a table inside a list or a named table
    (``[[network.rules]]``, ``[secrets.NAME]``): ``key`` is "" for the table itself."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def _expect_http_rule(entry: object) -> dict[str, object]:
    """One ``[[network.rules]]`` table -> its normalized form; EntryError names the key."""
    if not isinstance(entry, dict):
        raise EntryError("", "expected a table: [[network.rules]] with host = ... below it")
    from corral.net import httprules

    for key in entry:
        if key not in httprules.KEYS:
            raise EntryError(key, f"unknown key (known here: {', '.join(httprules.KEYS)})")
    if "host" not in entry:
        raise EntryError("", 'missing host = "..." (the syntax of [network] allow)')
    out: dict[str, object] = {"host": _entry_value("host", entry["host"], _expect_rule)}
    if "git" in entry:
        git = _entry_value("git", entry["git"], _expect_str)
        if git not in httprules.GIT_MODES:
            raise EntryError("git", f'git must be "read" or "write"; got {git!r}')
        for key in ("methods", "paths", "action", "max_body"):
            if key in entry:
                raise EntryError(key, "cannot be combined with git (the preset names them)")
        out["git"] = git
        return out
    if "action" not in entry:
        raise EntryError("", 'missing action = "allow", "deny" or "ask"')
    action = _entry_value("action", entry["action"], _expect_str)
    if action not in httprules.ACTIONS:
        raise EntryError("action", f'action must be "allow", "deny" or "ask"; got {action!r}')
    if "methods" in entry:
        out["methods"] = _entry_value("methods", entry["methods"], _expect_methods)
    if "paths" in entry:
        try:
            paths = _expect_str_list(entry["paths"])
            for glob in paths:
                httprules.PathGlob(glob)  # ValueError names the glob
        except ValueError as exc:
            raise EntryError("paths", str(exc)) from None
        if not paths:
            raise EntryError("paths", "an empty list matches nothing: leave paths out for any")
        out["paths"] = paths
    if "max_body" in entry:
        if action == "deny":
            raise EntryError("max_body", "a deny has no body to bound: use it with allow or ask")
        out["max_body"] = _entry_value("max_body", entry["max_body"], parse_size)
    out["action"] = action
    return out


def _entry_value(key: str, raw: object, parse: Callable[[object], object]) -> object:
    try:
        return parse(raw)
    except ValueError as exc:
        raise EntryError(key, str(exc)) from None


def _expect_rule(v: object) -> str:
    text = _expect_str(v)
    from corral.net.rules import Rule

    Rule(text)  # ValueError names the entry
    return text


def _expect_methods(v: object) -> list[str]:
    methods = _expect_str_list(v)
    if not methods:
        raise ValueError("an empty list matches nothing: leave methods out for any")
    for method in methods:
        if not method or not all(
            c.isascii() and (c.isalnum() or c in "!#$%&'*+-.^_`|~") for c in method
        ):
            raise ValueError(f"not an HTTP method: {method!r}")
    return [m.upper() for m in methods]


SECRET_KEYS = ("from", "hosts", "header", "format")
# variables corral sets inside the sandbox itself: a secret may not take their names
RESERVED_ENV = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
    "PIP_PROXY",
    "SOCKS_PROXY",
)


def check_secrets(policy: Policy) -> None:
    """Secrets make sense with the rest of the policy: the proxy is on, and no real
    value could reach the sandbox through ``[env]``.  PolicyError otherwise."""
    if not policy.secrets:
        return
    where = f"{policy.source}: " if policy.source else ""
    if policy.network.mode != "proxy":
        raise PolicyError(
            f'{where}[secrets] need the proxy: set [network] mode = "proxy" (and allow the hosts)'
        )
    passed = {*defaults.BASE_ENV, *policy.env.pass_names}
    for name, secret in sorted(policy.secrets.items()):
        if name in passed or name in policy.env.set_values:
            raise PolicyError(
                f"{where}secrets.{name}: {name} is also given to the sandbox by [env] or --env"
            )
        if secret.kind == "env" and secret.ref in passed:
            raise PolicyError(
                f"{where}secrets.{name}: its source {secret.ref} is passed into the sandbox "
                "([env] pass, --env or a base variable): the real value would be inside"
            )


def _expect_home(v: object) -> str:
    choice = _expect_str(v)
    if choice not in defaults.HOME_MODES:
        allowed = ", ".join(f'"{c}"' for c in defaults.HOME_MODES)
        raise ValueError(f"home must be one of {allowed}; got {choice!r}")
    return choice


ENGINES = ("podman", "docker")
OCI_RUNTIMES = ("runc", "runsc", "crun")


def _expect_choice(v: object, what: str, choices: tuple[str, ...]) -> str:
    """A string that must be one of ``choices``; the error names ``what`` and them all."""
    name = _expect_str(v)
    if name not in choices:
        raise ValueError(f"{what} must be one of {', '.join(choices)}; got {name!r}")
    return name


def _expect_engine(v: object) -> str:
    return _expect_choice(v, "engine", ENGINES)


def _expect_runtime(v: object) -> str:
    return _expect_choice(v, "runtime", OCI_RUNTIMES)


def _expect_image(v: object) -> str:
    name = _expect_str(v).strip()
    # an image reference, never an engine option smuggled in as one
    if not name or name.startswith("-") or any(c.isspace() for c in name):
        raise ValueError(f"not an image reference: {v!r}")
    return name


GUARDRAIL_ACTIONS = ("log", "allow", "ask", "deny")


def check_network(policy: Policy, python: bool = False) -> None:
    """Network rules parse, and make sense together; PolicyError otherwise.

    ``python``: the policy was built or changed in code (``Sandbox``), so the
    message names the attribute rather than the file's key."""
    check_tls(policy)
    check_secrets(policy)
    check_guardrails(policy)
    net = policy.network
    if net.mode not in NETWORK_MODES:
        raise PolicyError(
            f"network.mode must be one of {', '.join(NETWORK_MODES)}; got {net.mode!r}"
        )
    if net.ask_timeout != ASK_TIMEOUT:  # set in code perhaps: checked as the file's key is
        try:
            net.ask_timeout = _expect_ask_timeout(net.ask_timeout)
        except ValueError as exc:
            where = "policy.network.ask_timeout" if python else "network.ask_timeout"
            raise PolicyError(f"{where}: {exc}") from None
    if net.allow or net.deny:
        from corral.net.rules import Rule

        for key in ("allow", "deny"):
            for entry in getattr(net, key):
                try:
                    Rule(entry)
                except (ValueError, TypeError) as exc:
                    if python:
                        where = f"policy.network.{key}"
                    elif policy.source:
                        where = f"{policy.source}: network.{key}"
                    else:
                        where = f"--{key}"
                    raise PolicyError(f"{where}: {exc}") from None
    if net.mode == "proxy":
        return
    fix = 'policy.network.mode = "proxy"' if python else '[network] mode = "proxy"'
    for key, value in (("allow", net.allow), ("transparent", net.transparent)):
        if value:
            raise PolicyError(f'network.{key} has no effect with mode = "none": set {fix}')


def check_tls(policy: Policy) -> None:
    """``[tls]`` keys make sense together and name readable files; PolicyError
    naming the key otherwise.  (The CA's content is checked when a run opens its
    door: parsing it needs the ``cryptography`` package, kept off this path.)"""
    tls = policy.tls
    if tls.is_default():
        return
    where = f"{policy.source}: tls" if policy.source else "tls"
    if bool(tls.ca_cert) != bool(tls.ca_key):
        have, need = ("ca_cert", "ca_key") if tls.ca_cert else ("ca_key", "ca_cert")
        raise PolicyError(f"{where}.{need}: needed with tls.{have} (the CA's certificate and key)")
    if tls.ca_cert and tls.ca == "ephemeral":
        raise PolicyError(f'{where}.ca_cert: cannot be used with ca = "ephemeral"')
    for key, path in (
        ("ca_cert", tls.ca_cert),
        ("ca_key", tls.ca_key),
        *(("upstream_ca", p) for p in tls.upstream_ca),
    ):
        if path:
            _check_tls_file(f"{where}.{key}", path)
    if tls.passthrough:
        from corral.net.hooks import hooks_for, passthrough_conflict

        conflict = passthrough_conflict(tls.passthrough, hooks_for(policy))
        if conflict:
            raise PolicyError(f"{policy.source}: {conflict}" if policy.source else conflict)


def _check_tls_file(key: str, path: str) -> None:
    """A ``[tls]`` file is policy too (what the proxy trusts, or signs with): read
    as a policy file is (a plain file; a FIFO is never waited on), and refused if
    a sandboxed run could have written it (corral.liveruns): one rewritten with
    the sandbox's own CA made the proxy trust an origin it refused (found by
    attacking corral).  PolicyError naming ``key`` otherwise."""
    from corral import liveruns

    try:
        _, changed = read_plain(path)
    except OSError as exc:
        raise PolicyError(f"{key}: cannot read {path}: {exc.strerror}") from None
    except ValueError:
        raise PolicyError(f"{key}: {path} is not a plain file") from None
    planted = liveruns.planted_by(path, changed)
    if planted is not None:
        raise PolicyError(f"{key}: " + liveruns.refusal(path, *planted, True, pinned=False))


def check_guardrails(policy: Policy) -> list[Guardrail]:
    """The guardrail files of ``[guardrails] dirs``, read and parsed once (a
    malformed one is a PolicyError naming its file and line)."""
    guard = policy.guardrails
    if guard.files is None:
        if not guard.dirs:
            guard.files = []
            return guard.files
        from corral.net.guardrails import GuardrailError, load_dirs

        try:
            guard.files = load_dirs(guard.dirs)
        except GuardrailError as exc:
            raise PolicyError(f"guardrails: {exc}") from None
    return guard.files


def find_policy_file(workspace: str) -> str | None:
    candidate = os.path.join(workspace, defaults.POLICY_FILENAME)
    return candidate if os.path.isfile(candidate) else None


def check_found(path: str, named: bool = False, read: int | None = None) -> None:
    """A policy file: PolicyError if a run in progress, or one that has ended,
    could have written it (corral.liveruns).  ``named``: the caller named it, and
    may pin what it holds instead (a file named in a script written before an
    agent rewrote it was loaded as it found it: found by attacking corral).
    ``read``: the change time of what the caller read (see read_policy)."""
    from corral import liveruns

    planted = liveruns.planted_by(path, read)
    if planted is not None:
        raise PolicyError(liveruns.refusal(path, *planted, named=named))


def read_policy(path: str, what: str = "policy file") -> tuple[bytes, int]:
    """A policy (or settings) file's bytes and the change time of the file they
    came from, read once through one descriptor: what is checked is what is used.
    A plain file only (a FIFO is refused, never waited on)."""
    try:
        return read_plain(path)
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read {what}: {exc.strerror}") from None
    except ValueError:
        raise PolicyError(f"{path}: the {what} is not a plain file") from None


def read_plain(path: str) -> tuple[bytes, int]:
    """A plain file's bytes and its change time, through one descriptor; OSError,
    or ValueError for anything but a plain file (never waited on)."""
    import stat

    if path == os.devnull:  # no policy at all (corral batch pins a job that has none so)
        return b"", 0
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(path)
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks), st.st_ctime_ns


def unchecked_place(path: str) -> str | None:
    """Why a policy file corral found itself (``path``, in a real directory) may be
    one a sandboxed run planted where corral's check after the run did not see it,
    or None.  A run's new ``corral.toml`` files are quarantined by that check,
    which walks its workspace at most SCAN_MAX_DEPTH deep and never into
    SCAN_SKIP_DIRS (``node_modules``, ``.venv``...): a later run started there
    would load one silently.  So said here: a policy file inside a skipped
    directory, or below the nearest enclosing repository or workspace (a
    directory holding a ``.git`` or a ``corral.toml``, or one corral has kept a
    home layer for) up to, not including, the home directory.  A few stats per
    directory above, paid only by a run that has a policy file."""
    directory = os.path.dirname(path)
    homes = home_dirs()
    root = ""
    above = directory
    while True:
        parent = os.path.dirname(above)
        if parent == above or parent in homes:
            break
        above = parent
        if _is_root(above):
            root = above
            break
    below = os.path.relpath(directory, root) if root else directory
    skipped = [part for part in below.split("/") if part in defaults.SCAN_SKIP_DIRS]
    keep = "if it is yours, name it with --policy to load it without this line"
    if skipped:
        return (
            f"policy file {path} is inside {skipped[0]}/, where corral's check after a "
            f"run does not look: a sandboxed run could have written it; {keep}"
        )
    if root:
        return (
            f"policy file {path} is below {root}, another project or workspace root: "
            f"a sandboxed run there could have written it; {keep}"
        )
    return None


def _is_root(directory: str) -> bool:
    """A repository's top, a directory with its own policy, or a corral workspace."""
    for name in (".git", defaults.POLICY_FILENAME):
        if os.path.lexists(os.path.join(directory, name)):
            return True
    from corral import home

    return any(os.path.isdir(home.layer_path(directory, kind)) for kind in ("host", "container"))


# home_dirs' last answer, by what it depends on: a run asks twice (the policy's
# load and the filesystem plan), and each password database lookup reads files
_homes: tuple[tuple[str, int], list[str]] | None = None


def home_dirs() -> list[str]:
    """The launching user's home directories, real paths: $HOME and the
    password database's entry (either may be what a tool writes to)."""
    global _homes
    key = (os.environ.get("HOME", ""), os.geteuid())
    if _homes is not None and _homes[0] == key:
        return list(_homes[1])
    import pwd

    found = [key[0]]
    try:
        found.append(pwd.getpwuid(key[1]).pw_dir)
    except KeyError:
        pass
    homes = sorted({os.path.realpath(h) for h in found if h.startswith("/")})
    _homes = (key, homes)
    return list(homes)


def check_workspace(ws: str, homes: list[str]) -> None:
    """Refuse a workspace (a real path) that would make the disk, or a home
    directory, writable: a command there could write a shell's startup files,
    ``~/.local/bin`` or an autostart or systemd unit, which run later outside
    the sandbox, and no list of protected paths covers every such file.  Pure."""
    if ws == "/":
        raise PolicyError("the workspace cannot be / (it would make the whole disk writable)")
    for home in homes:
        if home == "/" or not (ws == home or home.startswith(ws.rstrip("/") + "/")):
            continue
        what = "your home directory" if ws == home else f"a directory holding your home {home}"
        raise PolicyError(
            f"the workspace cannot be {what} ({ws}): a command could write files that "
            "run later outside the sandbox (shell startup files, ~/.local/bin, autostart "
            "and systemd units); run corral in a project directory"
        )


# Under a home, what runs later outside the sandbox: a writable path that is one
# of these, lies in one, or holds one is refused as a workspace there would be
# (--writable ~ let a run plant ~/.aws/config's credential_process and a unit
# under ~/.config/systemd; found by attacking corral).
RUNS_LATER = (
    ".config",
    ".local/bin",
    ".local/share/applications",
    ".cargo/bin",
    ".ssh",
    ".aws",
    ".gitconfig",
    *defaults.SHELL_STARTUP,
)


def check_no_patterns(policy: Policy) -> None:
    """Refuse a pattern where corral takes paths: ``read_deny = ["*.pem"]`` was
    taken as a file named ``*.pem`` and protected nothing, with no word said
    (found by attacking corral; srt's settings refused it already).  Pure."""
    fs = policy.filesystem
    for key, paths in (("read_deny", fs.read_deny), ("write_deny", fs.write_deny)):
        for path in paths:
            if any(c in path for c in "*?["):
                raise PolicyError(
                    f"filesystem.{key}: {path!r} is a pattern, and corral takes paths: "
                    "name each file, or the directory that holds them"
                )
    for path in fs.writable:
        if any(c in path for c in "*?["):
            raise PolicyError(f"filesystem.writable: {path!r} is a pattern; name a directory")


def check_writable(path: str, homes: list[str]) -> None:
    """Refuse a writable path (a real path, not the workspace) that the workspace
    rule refuses, or that is, holds or lies in a place under a home whose files
    run later outside the sandbox (RUNS_LATER).  Pure."""
    try:
        check_workspace(path, homes)
    except PolicyError as exc:
        said = str(exc).replace("the workspace", f"filesystem.writable {path}", 1)
        raise PolicyError(said) from None
    for home in homes:
        for name in RUNS_LATER:
            place = os.path.join(home, name)
            if path == place or path.startswith(place + "/") or place.startswith(path + "/"):
                raise PolicyError(
                    f"filesystem.writable cannot name {path}: {place} is read by programs "
                    "that run later outside the sandbox (give the command a copy in the "
                    "workspace, or use its home layer: $HOME inside)"
                )


def load(
    workspace: str | None = None, path: str | None = None, sha256: str | None = None
) -> Policy:
    """Defaults, then ``path`` (or the workspace's corral.toml if present);
    ``sha256``: the content ``path`` must hold (corral batch pins each job's)."""
    ws = os.path.realpath(workspace or os.getcwd())
    check_workspace(ws, home_dirs())
    policy = Policy(ws)
    from corral import bounds

    policy.limits.defaults = bounds.defaults_for(bounds.host_facts())
    chosen = path if path is not None else find_policy_file(ws)
    raw = b""
    if chosen is not None:
        raw, changed = read_policy(chosen)
        if sha256 is None:  # (pinned: its content was vouched for)
            check_found(chosen, named=path is not None, read=changed)
    if chosen is not None and path is None:
        notice = unchecked_place(chosen)
        if notice:
            import sys

            sys.stderr.write(f"corral: warning: {notice}\n")
            sys.stderr.flush()
    if chosen is not None:
        from corral.policyfile import load_file

        load_file(chosen, policy, sha256, raw)
        if policy.network.mode == "none" and policy.network.allow:
            raise PolicyError(
                f'{chosen}: network.allow has no effect with mode = "none": '
                'set [network] mode = "proxy"'
            )
        check_tls(policy)
        check_guardrails(policy)
    return policy
