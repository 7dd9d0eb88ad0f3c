"""Reading a policy file: the TOML's keys (``SCHEMA``), what each accepts, and
errors that name the file, the line and the key.

:mod:`corral.policy` holds the model, its checks and the value parsers the flags
share; this module is loaded only when a run has a policy file, so a run with
none does not pay for reading one.
"""

from __future__ import annotations

import os

from corral import defaults
from corral.errors import PolicyError
from corral.paths import inside
from corral.policy import (
    GUARDRAIL_ACTIONS,
    GUARDRAIL_TIER_ACTIONS,
    NETWORK_MODES,
    RESERVED_ENV,
    SECRET_KEYS,
    TLS_CA_CHOICES,
    EntryError,
    Policy,
    Secret,
    _entry_value,
    _expect_ask_timeout,
    _expect_choice,
    _expect_engine,
    _expect_home,
    _expect_http_rule,
    _expect_image,
    _expect_rule,
    _expect_runtime,
    _expect_str,
    _expect_str_list,
    check_env_name,
    parse_cpus,
    parse_duration,
    parse_memory,
    parse_pids,
    parse_scratch,
    parse_size,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


def _expect_bool(v: object) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"expected true or false, got {type(v).__name__}")
    return v


def _expect_tier(v: object) -> str:
    from corral.tiers import REGISTRY  # the one table of tier names (imports no tier)

    name = _expect_str(v)
    if name != "auto" and name not in REGISTRY:
        raise ValueError(f"unknown tier {name!r} (known: auto, {', '.join(REGISTRY)})")
    return name


def _expect_env_names(v: object) -> list[str]:
    return [check_env_name(x) for x in _expect_str_list(v)]


def _expect_env_map(v: object) -> dict[str, str]:
    if not isinstance(v, dict):
        raise ValueError('expected a table of NAME = "value"')
    out = {}
    for k, val in v.items():
        check_env_name(k)
        if not isinstance(val, str):
            raise ValueError(f"value of {k} must be a string")
        out[k] = val
    return out


def _expect_rules(v: object) -> list[str]:
    entries = _expect_str_list(v)
    if entries:
        from corral.net.rules import Rule

        for entry in entries:
            Rule(entry)  # ValueError names the entry
    return entries


def _expect_hosts(v: object) -> dict[str, str]:
    if not isinstance(v, dict):
        raise ValueError('expected a table of "name" = "address"')
    import ipaddress

    from corral.net.names import BadName, normalize

    out = {}
    for name, address in v.items():
        if not isinstance(address, str):
            raise ValueError(f"address of {name} must be a string")
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise ValueError(f"{name} = {address!r}: not an IP address") from None
        try:  # the spelling the proxy looks up: any other spelling finds it too
            out[normalize(name)] = str(ipaddress.ip_address(address))
        except BadName as exc:
            raise ValueError(f"{name!r}: {exc.reason}") from None
    return out


def _is_identifier(name: str) -> bool:
    """``[A-Za-z_][A-Za-z0-9_]*``: a name that is an environment variable everywhere
    and survives a URL or a header unescaped (it is part of the placeholder)."""
    return (
        bool(name)
        and name.isascii()
        and not name[0].isdigit()
        and all(c.isalnum() or c == "_" for c in name)
    )


def _expect_secret(name: str, table: object) -> Secret:
    """One ``[secrets.NAME]`` table; EntryError names the key."""
    if not _is_identifier(name):
        raise EntryError("", f"{name!r} is not a variable name (letters, digits and _)")
    if name in defaults.BASE_ENV or name in RESERVED_ENV or name.startswith("CORRAL_"):
        raise EntryError("", f"{name} is a variable corral sets inside the sandbox")
    if not isinstance(table, dict):
        raise EntryError("", f'expected a table: [secrets.{name}] with from = "env:VAR"')
    for key in table:
        if key not in SECRET_KEYS:
            raise EntryError(key, f"unknown key (known here: {', '.join(SECRET_KEYS)})")
    for key in ("from", "hosts"):
        if key not in table:
            raise EntryError("", f"missing {key}")
    source = _entry_value("from", table["from"], _expect_source)
    hosts = _entry_value("hosts", table["hosts"], _expect_str_list)
    assert isinstance(source, str) and isinstance(hosts, list)
    if not hosts:
        raise EntryError("hosts", "an empty list: name the hosts the secret may be sent to")
    for host in hosts:
        _entry_value("hosts", host, _expect_rule)
    header = (
        str(_entry_value("header", table["header"], _expect_header)) if "header" in table else ""
    )
    fmt = ""
    if "format" in table:
        if not header:
            raise EntryError("format", "format needs header = ... (the header it fills in)")
        fmt = str(_entry_value("format", table["format"], _expect_format))
    return Secret(name, source, hosts, header, fmt)


def _expect_source(v: object) -> str:
    text = _expect_str(v)
    kind, sep, ref = text.partition(":")
    if kind == "env" and sep and _is_identifier(ref):
        return text
    if kind == "file" and sep and ref.strip() and "\0" not in ref:
        return text
    raise ValueError(f'from must be "env:VARIABLE" or "file:PATH"; got {text!r}')


def _expect_header(v: object) -> str:
    name = _expect_str(v)
    from corral.net import http1

    if not name or name.encode("utf-8", "replace").translate(None, http1.TOKEN_BYTES):
        raise ValueError(f"not a header name: {name!r}")
    if name.lower().encode() in http1.HOP_BY_HOP | http1.FRAMING | {b"transfer-encoding"}:
        raise ValueError(f"{name} frames or routes the request: corral does not let it be set")
    return name.lower()


def _expect_format(v: object) -> str:
    text = _expect_str(v)
    if "{value}" not in text:
        raise ValueError('format must contain {value}, e.g. "Bearer {value}"')
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise ValueError("control character in format")
    return text


def _expect_mode(v: object) -> str:
    return _expect_choice(v, "mode", NETWORK_MODES)


def _expect_hardlinks(v: object) -> str:
    choice = _expect_str(v)
    if choice not in defaults.HARDLINK_POLICIES:
        allowed = " or ".join(f'"{c}"' for c in defaults.HARDLINK_POLICIES)
        raise ValueError(f"hardlinks must be {allowed}; got {choice!r}")
    return choice


def _expect_ca_choice(v: object) -> str:
    choice = _expect_str(v)
    if choice not in TLS_CA_CHOICES:
        allowed = " or ".join(f'"{c}"' for c in TLS_CA_CHOICES)
        raise ValueError(f"ca must be {allowed} (or set ca_cert and ca_key); got {choice!r}")
    return choice


def _expect_file(v: object) -> str:
    path = _expect_str(v)
    if not path.strip() or "\0" in path:
        raise ValueError(f"not a file path: {v!r}")
    return path


def _expect_files(v: object) -> list[str]:
    """One path or a list of them."""
    return [_expect_file(x) for x in ([v] if isinstance(v, str) else _expect_str_list(v))]


def _tls_path(attr: str) -> Callable[[Policy, object], None]:
    """A [tls] file, made absolute (``~`` and relative to the workspace) when set."""

    def apply(policy: Policy, raw: object) -> None:
        if attr == "upstream_ca":
            policy.tls.upstream_ca = [policy.expand(p) for p in _expect_files(raw)]
        else:
            setattr(policy.tls, attr, policy.expand(_expect_file(raw)))

    return apply


def _limit(name: str, parse: Callable[[object], object]) -> Callable[[Policy, object], None]:
    def apply(policy: Policy, raw: object) -> None:
        policy.limits.assign(name, raw, parse)

    return apply


def _set(attr_path: str, parse: Callable[[object], object]) -> Callable[[Policy, object], None]:
    section, _, attr = attr_path.rpartition(".")

    def apply(policy: Policy, raw: object) -> None:
        target: object = getattr(policy, section) if section else policy
        setattr(target, attr, parse(raw))

    return apply


def _expect_dirs(v: object) -> list[str]:
    dirs = _expect_str_list(v)
    if any(not d for d in dirs):
        raise ValueError("an empty directory name")
    return dirs


def _guardrail_dirs(policy: Policy, raw: object) -> None:
    dirs = [policy.expand(d) for d in _expect_dirs(raw)]
    for path in dirs:
        # guardrail directories are write-denied inside: the workspace cannot be one
        if inside(policy.workspace, path):
            raise ValueError(f"{path} is the workspace or holds it: give guardrails a directory")
    policy.guardrails.dirs = dirs
    policy.guardrails.files = None


def _expect_tier_actions(v: object) -> dict[str, str]:
    """``{ high = "deny", null = "log" }``: tier words (any case) -> actions.
    An EntryError names the tier word that is wrong."""
    if not isinstance(v, dict):
        raise ValueError('expected a table of tier = "action" (low, medium, high, critical, null)')
    out: dict[str, str] = {}
    for word, action in v.items():
        tier = word.lower()
        if tier not in GUARDRAIL_TIER_ACTIONS:
            raise EntryError(
                word, f"unknown tier {word!r} (known: low, medium, high, critical, null)"
            )
        if not isinstance(action, str) or action.lower() not in GUARDRAIL_ACTIONS:
            raise EntryError(word, f"expected log, allow, ask or deny; got {action!r}")
        out[tier] = action.lower()
    return out


def _guardrail_tiers(policy: Policy, raw: object) -> None:
    policy.guardrails.tiers.update(_expect_tier_actions(raw))


# TOML key -> how to parse it and where it lands.  An unknown key is an error.
SCHEMA: dict[str, dict[str, Callable[[Policy, object], None]]] = {
    "": {"tier": _set("tier", _expect_tier)},
    "filesystem": {
        "writable": _set("filesystem.writable", _expect_str_list),
        "read_deny": _set("filesystem.read_deny", _expect_str_list),
        "write_deny": _set("filesystem.write_deny", _expect_str_list),
        "defaults": _set("filesystem.use_defaults", _expect_bool),
        "hardlinks": _set("filesystem.hardlinks", _expect_hardlinks),
        "home": _set("filesystem.home", _expect_home),
    },
    "env": {
        "pass": _set("env.pass_names", _expect_env_names),
        "set": _set("env.set_values", _expect_env_map),
    },
    "limits": {
        # each of these takes "none" too: no bound, not even this host's default
        "timeout": _limit("timeout", parse_duration),
        "memory": _limit("memory", parse_memory),
        "pids": _limit("pids", parse_pids),
        "cpus": _limit("cpus", parse_cpus),
        "tmp": _limit("tmp", parse_scratch),
        "shm": _limit("shm", parse_scratch),
        "output": _set("limits.output", parse_size),
    },
    "network": {
        "mode": _set("network.mode", _expect_mode),
        "allow": _set("network.allow", _expect_rules),
        "deny": _set("network.deny", _expect_rules),
        "transparent": _set("network.transparent", _expect_bool),
        "hosts": _set("network.hosts", _expect_hosts),
        "ask_timeout": _set("network.ask_timeout", _expect_ask_timeout),
    },
    "tls": {
        "ca": _set("tls.ca", _expect_ca_choice),
        "ca_cert": _tls_path("ca_cert"),
        "ca_key": _tls_path("ca_key"),
        "upstream_ca": _tls_path("upstream_ca"),
        "passthrough": _set("tls.passthrough", _expect_rules),
        "inspect": _set("tls.inspect", _expect_rules),
    },
    "guardrails": {"dirs": _guardrail_dirs, "tiers": _guardrail_tiers},
    "container": {
        "engine": _set("container.engine", _expect_engine),
        "runtime": _set("container.runtime", _expect_runtime),
        "image": _set("container.image", _expect_image),
    },
}


def _dotted(text: str) -> str:
    """``[ env . "set" ]`` or ``limits . memory`` -> ``env.set`` / ``limits.memory``."""
    return ".".join(part.strip().strip("\"'") for part in text.split("."))


def _key_line(lines: list[str], section: str, key: str) -> int:
    """The 1-based line where ``section.key`` is set (0 if not found).

    tomllib reports no positions for values, so we find the line ourselves,
    following table headers (``[env.set]``) and dotted keys (``limits.memory =``);
    this only has to be good enough to point a person at the right place.
    """
    target = f"{section}.{key}" if section and key else section or key
    header = ""
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if line.startswith("[") and not line.startswith("[["):
            header = _dotted(line.strip("[] \t"))
            if header == target or header.startswith(target + "."):
                return number
            continue
        if "=" not in line:
            continue
        name = _dotted(line.split("=", 1)[0])
        full = f"{header}.{name}" if header else name
        if full == target or full.startswith(target + "."):
            return number
    return 0


def where_set(path: str, section: str, key: str, value: str) -> str:
    """``FILE:LINE: section.key`` when the policy file at ``path`` sets that key to
    a list naming ``value`` (a check made after loading names the place), else ""."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, ValueError):
        return ""
    if value not in text:
        return ""  # (given by a flag, not by the file)
    line = _key_line(text.splitlines(), section, key)
    return f"{path}:{line}: {section}.{key}" if line else f"{path}: {section}.{key}"


def load_file(
    path: str, policy: Policy, sha256: str | None = None, raw: bytes | None = None
) -> None:
    """Apply a TOML policy file on top of ``policy``; PolicyError names file, line, key.
    ``sha256``: what the file must hold (read once: what is checked is what is used);
    ``raw``: its bytes, read already (corral.policy.read_policy)."""
    import tomllib

    if raw is None:
        from corral.policy import read_policy

        raw, _ = read_policy(path)
    if sha256 is not None:
        import hashlib

        if hashlib.sha256(raw).hexdigest() != sha256.lower():
            raise PolicyError(
                f"{path}: the policy file changed since it was pinned (a job may have "
                "rewritten it); not run"
            )
    try:
        text = raw.decode("utf-8")
        data = tomllib.loads(text)
    except UnicodeDecodeError:
        raise PolicyError(f"{path}: policy file is not UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        last = max(1, text.count("\n") + (0 if text.endswith("\n") else 1))
        raise PolicyError(_toml_error(path, str(exc), last)) from None
    lines = text.splitlines()
    policy.source = os.path.realpath(path)

    def where(section: str, key: str) -> str:
        line = _key_line(lines, section, key)
        dotted = f"{section}.{key}" if section and key else section or key
        return f"{path}:{line}: {dotted}" if line else f"{path}: {dotted}"

    for top_key, value in data.items():
        if top_key == "secrets" and isinstance(value, dict):
            _load_secrets(policy, value, lines, path)
        elif isinstance(value, dict):
            if top_key not in SCHEMA or not top_key:
                known = ", ".join(f"[{s}]" for s in (*SCHEMA, "secrets.NAME") if s)
                raise PolicyError(f"{where(top_key, '')}: unknown section (known: {known})")
            fields = SCHEMA[top_key]
            for key, item in value.items():
                if top_key == "network" and key == "rules":
                    _load_http_rules(policy, item, lines, path, where)
                else:
                    _apply_one(policy, fields, top_key, key, item, where)
        else:
            _apply_one(policy, SCHEMA[""], "", top_key, value, where)


def _toml_error(path: str, message: str, last_line: int) -> str:
    """``FILE:LINE: invalid TOML: what (column N)`` from tomllib's "... (at line L,
    column C)" or "... (at end of document)"; it has no position attributes
    before Python 3.14."""
    if message.endswith(" (at end of document)"):
        return f"{path}:{last_line}: invalid TOML: {message[: -len(' (at end of document)')]}"
    text, sep, where = message.rpartition(" (at line ")
    line, _, column = where.rstrip(")").partition(", column ")
    if not sep or not line.isdigit():
        return f"{path}: invalid TOML: {message}"
    at = f" (column {column})" if column.isdigit() else ""
    return f"{path}:{line}: invalid TOML: {text}{at}"


def _load_http_rules(
    policy: Policy, value: object, lines: list[str], path: str, where: Callable[[str, str], str]
) -> None:
    if not isinstance(value, list):
        raise PolicyError(f"{where('network', 'rules')}: expected [[network.rules]] tables")
    rules = []
    for index, entry in enumerate(value, 1):
        try:
            rules.append(_expect_http_rule(entry))
        except EntryError as exc:
            line = _entry_line(lines, "network.rules", index, exc.key) or _key_line(
                lines, "network", "rules"
            )
            dotted = f"network.rules[{index}]" + (f".{exc.key}" if exc.key else "")
            at = f"{path}:{line}" if line else path
            raise PolicyError(f"{at}: {dotted}: {exc}") from None
    policy.network.rules = rules


def _load_secrets(policy: Policy, value: dict[str, object], lines: list[str], path: str) -> None:
    for name, table in value.items():
        try:
            policy.secrets[name] = _expect_secret(name, table)
        except EntryError as exc:
            line = _key_line(lines, f"secrets.{name}", exc.key)
            dotted = f"secrets.{name}" + (f".{exc.key}" if exc.key else "")
            at = f"{path}:{line}" if line else path
            raise PolicyError(f"{at}: {dotted}: {exc}") from None


def _entry_line(lines: list[str], table: str, index: int, key: str) -> int:
    """The line of ``key`` in the ``index``-th ``[[table]]`` block (or of its
    header when the key is not written there); 0 when there are no such blocks."""
    seen = 0
    start = 0
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if line.startswith("["):
            if start:
                break  # the block ended
            if line.startswith("[[") and _dotted(line.strip("[] \t")) == table:
                seen += 1
                if seen == index:
                    start = number
            continue
        if start and key and "=" in line and _dotted(line.split("=", 1)[0]) == key:
            return number
    return start


def _apply_one(
    policy: Policy,
    fields: dict[str, Callable[[Policy, object], None]],
    section: str,
    key: str,
    value: object,
    where: Callable[[str, str], str],
) -> None:
    if key not in fields:
        known = ", ".join(fields)
        raise PolicyError(f"{where(section, key)}: unknown key (known here: {known})")
    try:
        fields[key](policy, value)
    except EntryError as exc:  # one key of a table value: point at its own line
        dotted = f"{section}.{key}" if section else key
        at = where(dotted, exc.key).rsplit(": ", 1)[0]  # FILE:LINE, or FILE if not found
        if not at.rpartition(":")[2].isdigit():
            at = where(section, key).rsplit(": ", 1)[0]  # an inline table: its key's line
        raise PolicyError(f"{at}: {dotted}.{exc.key}: {exc}") from None
    except ValueError as exc:
        raise PolicyError(f"{where(section, key)}: {exc}") from None
