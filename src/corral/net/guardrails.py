"""Guardrail files: Markdown with a front-matter fence, a risk tier, and rules.

A guardrail is a ``.md`` file.  Its first line may open a fence (``---``)
that the next ``---`` line closes; between them, one ``key: value`` per line:

* ``title`` -- else the body's first ``# `` heading, else the file name
  (``deploy_checklist.md`` -> ``Deploy Checklist``);
* ``risk_tier`` -- LOW, MEDIUM, HIGH or CRITICAL in any case; anything else,
  or nothing, is *null* (never guessed);
* ``version`` -- free text;
* ``content_hash`` -- the marker ``corral rules hash`` / ``pull`` writes: the
  hash of the body when the file was written (see :func:`body_hash`);
* the enforcing keys: ``hosts`` (the syntax of ``[network] allow``),
  ``methods``, ``paths`` (the globs of ``[[network.rules]]``), ``action``
  (``allow`` = ``log``, ``ask``, ``deny``) and ``max_body``.  A file without
  ``hosts`` enforces nothing; ``methods``/``paths``/``action``/``max_body``
  without ``hosts`` is an error (a rule that could never fire).

Every other key is inert: kept and listed, never an error.  The front matter
is a deliberately small, strict subset of YAML (no PyYAML: corral does not
depend on it, and a full YAML reader would accept far more than a guardrail
needs): ``key: value``; a value may be quoted (``"..."`` or ``'...'``, no
escapes), an inline list ``[a, b]`` (items hold no commas), or empty with
``- item`` lines below it; blank lines and lines starting with ``#`` are
skipped, and so is a trailing `` # comment``; a fence line may end in white
space.  Anything else (YAML's anchors, aliases, tags, block values) is an
error naming the file and line.

The body is everything after the closing fence, or the whole file trimmed
when there is no fence.  Its hash is the sha256, in lower-case hex, of the
UTF-8 bytes of the body with CR LF turned into LF and leading and trailing
spaces, tabs, CRs and LFs removed: adding a fence, a final newline or CR LF
line ends does not change it; any other edit does.
"""

from __future__ import annotations

import os

from corral.net.hooks import Hook
from corral.net.httprules import (
    CACHED_TARGET,
    BadPath,
    PathGlob,
    alternates,
    covers,
    form_override,
    is_post,
    normalize_target,
    readings,
)
from corral.net.rules import Rule, Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.net.hooks import Destination, Request
    from corral.net.httprules import Query

TIERS = ("LOW", "MEDIUM", "HIGH", "CRITICAL")
ACTIONS = ("log", "allow", "ask", "deny")  # allow and log are one: allowed, and audited
STRICTNESS = {"log": 0, "allow": 0, "ask": 1, "deny": 2}
# tier (lower case; "null" for none) -> action, unless [guardrails.tiers] says otherwise.
# A guardrail whose risk nobody stated is not assumed harmless: a person decides.
DEFAULT_TIER_ACTIONS = {
    "low": "log",
    "medium": "log",
    "high": "ask",
    "critical": "deny",
    "null": "ask",
}
KNOWN_KEYS = (
    "title",
    "risk_tier",
    "version",
    "content_hash",
    "hosts",
    "methods",
    "paths",
    "action",
    "max_body",
)
ENFORCING = ("hosts", "methods", "paths", "action", "max_body")
LIST_KEYS = ("hosts", "methods", "paths")
_TRIM = " \t\r\n"
_KEY_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_KEY_CHARS = _KEY_START | frozenset("0123456789.-")
_HEX = frozenset("0123456789abcdef")
MARKER = "content_hash"


class GuardrailError(ValueError):
    """A malformed guardrail file: ``str()`` is ``FILE:LINE: what`` (one line)."""


def body_hash(body: str) -> str:
    """The hash of a body, as defined in this module's docstring."""
    canonical = body.replace("\r\n", "\n").strip(_TRIM)
    try:  # the builtin module: hashlib loads OpenSSL (some 2.5 ms on a run's path)
        from _sha256 import sha256  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        try:
            from _sha2 import sha256  # type: ignore[import-not-found, no-redef, unused-ignore]
        except ImportError:
            from hashlib import sha256  # type: ignore[assignment, unused-ignore]
    digest: str = sha256(canonical.encode("utf-8")).hexdigest()
    return digest


def _is_key(text: str) -> bool:
    return bool(text) and text[0] in _KEY_START and _KEY_CHARS.issuperset(text)


def title_from_file_name(name: str) -> str:
    """``deploy_checklist.md`` -> ``Deploy Checklist``; ``postgres-migration`` too."""
    stem = os.path.basename(name)
    if stem.lower().endswith(".md"):
        stem = stem[:-3]
    words = stem.replace("_", " ").replace("-", " ").split()
    return " ".join(w[:1].upper() + w[1:] for w in words) or stem


def _split(text: str) -> tuple[list[str] | None, int, str]:
    """(front-matter lines or None, the closing fence's index, body)."""
    lines = text.split("\n")
    # (trailing white space on a fence line still makes a fence, as YAML tools read
    # it: "--- " read as body made an enforcing file enforce nothing, silently)
    if lines[0].rstrip() != "---":
        return None, -1, text.strip(_TRIM)
    for index in range(1, len(lines)):
        if lines[index].rstrip() == "---":
            return lines[1:index], index, "\n".join(lines[index + 1 :])
    raise ValueError("1: malformed front matter: the fence opened here is never closed (---)")


# What starts a YAML anchor, alias, tag, block scalar or flow mapping: not in this
# subset.  An error, not a value: "&t CRITICAL" read as a tier word was null (ask,
# where the author meant deny).
_YAML_ONLY = tuple("&*!|>%@`{")


def _uncommented(value: str) -> str:
    """A value without a trailing YAML comment (" # ..."): "CRITICAL  # never" was
    read whole, an unknown tier, null: ask where the author meant deny.  A value
    that is only a comment is empty ("paths:   # the globs", a list follows)."""
    if value[:1] == "#":
        return ""
    if value[:1] in ("'", '"'):
        end = value.find(value[0], 1)
    elif value[:1] == "[":
        end = _list_end(value)  # not rfind: the comment may hold a "]" ("[network]")
    else:
        for at in range(1, len(value)):
            if value[at] == "#" and value[at - 1] in " \t":
                return value[:at].rstrip()
        return value
    if end > 0 and value[end + 1 :].strip().startswith("#"):
        return value[: end + 1]
    return value


def _list_end(value: str) -> int:
    """The index of the "]" that closes the flow list ``value`` opens (quotes
    respected), or -1."""
    quote = ""
    for at in range(1, len(value)):
        char = value[at]
        if quote:
            quote = "" if char == quote else quote
        elif char in ("'", '"'):
            quote = char
        elif char == "]":
            return at
    return -1


def _unquote(raw: str, line: int) -> str:
    value = _uncommented(raw.strip())
    if value[:1] in ("'", '"'):
        if len(value) < 2 or value[-1] != value[0]:
            raise ValueError(f"{line}: malformed front matter: unclosed quote")
        return value[1:-1]
    if value.startswith(_YAML_ONLY):
        raise ValueError(
            f"{line}: malformed front matter: YAML anchors, aliases, tags and block values "
            "are not supported (quote the value)"
        )
    return value


def _inline_list(raw: str, line: int) -> list[str]:
    inner = raw.strip()[1:-1].strip()
    if not inner:
        return []
    items = [_unquote(item, line) for item in inner.split(",")]
    if any(not item for item in items):
        raise ValueError(f"{line}: malformed front matter: an empty item in [...]")
    return items


Value = str | list[str]


def parse_front_matter(lines: list[str]) -> dict[str, tuple[int, Value]]:
    """Fence lines -> {key: (line number in the file, value)}; ValueError("LINE: why")."""
    found: dict[str, tuple[int, Value]] = {}
    open_list: str | None = None  # the key whose "- item" lines may follow
    for offset, raw in enumerate(lines):
        number = offset + 2  # the fence is line 1
        line = raw.rstrip("\r")
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("- ") or stripped == "-":
            if open_list is None:
                raise ValueError(f"{number}: malformed front matter: a list item with no key")
            item = _unquote(stripped[1:], number)
            if not item:
                raise ValueError(f"{number}: malformed front matter: an empty list item")
            value = found[open_list][1]
            assert isinstance(value, list)
            value.append(item)
            continue
        if line[:1] in (" ", "\t"):
            raise ValueError(f"{number}: malformed front matter: nested values are not supported")
        key, colon, rest = line.partition(":")
        if not colon or not _is_key(key):
            raise ValueError(f"{number}: malformed front matter: expected 'key: value'")
        if rest[:1] not in ("", " ", "\t"):
            raise ValueError(f"{number}: malformed front matter: a space must follow '{key}:'")
        if key in found:
            raise ValueError(f"{number}: malformed front matter: {key} is set twice")
        rest = _uncommented(rest.strip())
        open_list = None
        if not rest:
            found[key] = (number, [])
            open_list = key
        elif rest.startswith("["):
            if not rest.endswith("]"):
                raise ValueError(f"{number}: malformed front matter: unclosed [")
            found[key] = (number, _inline_list(rest, number))
        else:
            found[key] = (number, _unquote(rest, number))
    return found


class Guardrail:
    """One parsed file.  ``hash`` is its body's hash now; ``content_hash`` the
    marker it carries (None: unhashed)."""

    __slots__ = (
        "action",
        "body",
        "content_hash",
        "hash",
        "hosts",
        "lines",
        "max_body",
        "methods",
        "path",
        "paths",
        "tier",
        "title",
        "unknown",
        "version",
    )

    def __init__(self, path: str) -> None:
        self.path = path
        self.title = ""
        self.tier: str | None = None
        self.version: str | None = None
        self.content_hash: str | None = None
        self.body = ""
        self.hash = ""
        self.unknown: list[str] = []
        self.hosts: list[str] = []
        self.methods: list[str] | None = None
        self.paths: list[str] = []
        self.action: str | None = None  # the file's own, if it names one
        self.max_body: int | None = None
        self.lines: dict[str, int] = {}  # key -> line, for messages

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def enforcing(self) -> bool:
        return bool(self.hosts)

    @property
    def state(self) -> str:
        """``clean`` (the body matches its marker), ``edited`` or ``unhashed``."""
        if self.content_hash is None:
            return "unhashed"
        return "clean" if self.content_hash == self.hash else "edited"

    def effective_action(self, table: dict[str, str]) -> str:
        """The tier's action, or the file's own ``action`` when that is stricter:
        a file can tighten what its tier gives, never loosen it."""
        tiered = table[(self.tier or "null").lower()]
        own = self.action
        return own if own is not None and STRICTNESS[own] > STRICTNESS[tiered] else tiered

    def audit_fields(self, action: str) -> dict[str, object]:
        return {
            "file": self.path,
            "title": self.title,
            "tier": self.tier,
            "version": self.version,
            "hash": self.hash,
            "hash_state": self.state,
            "action": action,
        }


def parse(text: str, path: str) -> Guardrail:
    """A guardrail file's text -> Guardrail; GuardrailError names ``path`` and line."""
    try:
        return _parse(text.removeprefix("\ufeff"), path)
    except ValueError as exc:
        raise GuardrailError(f"{path}:{exc}") from None


def _parse(text: str, path: str) -> Guardrail:
    fence, _, body = _split(text)
    g = Guardrail(path)
    g.body = body
    g.hash = body_hash(body)
    keys = parse_front_matter(fence) if fence is not None else {}
    g.lines = {k: line for k, (line, _) in keys.items()}
    g.unknown = [k for k in keys if k not in KNOWN_KEYS]
    # (risk_tier is never an error: anything but a tier word is null)
    for key in ("title", "version", "content_hash", "action", "max_body"):
        if key in keys and isinstance(keys[key][1], list) and keys[key][1]:
            raise ValueError(f"{keys[key][0]}: {key}: expected one value, not a list")
    g.title = _text(keys, "title") or _heading(body) or title_from_file_name(path)
    tier = _text(keys, "risk_tier").upper()
    g.tier = tier if tier in TIERS else None
    g.version = _text(keys, "version") or None
    marker = _text(keys, MARKER).lower()
    if marker:
        if len(marker) != 64 or not _HEX.issuperset(marker):
            raise ValueError(f"{keys[MARKER][0]}: {MARKER}: expected 64 hex digits (a sha256)")
        g.content_hash = marker
    _enforcing(g, keys)
    return g


def _text(keys: dict[str, tuple[int, Value]], key: str) -> str:
    value = keys.get(key, (0, ""))[1]
    return value.strip() if isinstance(value, str) else ""


def _heading(body: str) -> str:
    for line in body.split("\n"):
        line = line.rstrip("\r")
        text = line.lstrip(" ")
        if text.startswith("# ") and len(line) - len(text) <= 3:  # Markdown: up to 3 spaces
            return text[2:].strip()
    return ""


def _enforcing(g: Guardrail, keys: dict[str, tuple[int, Value]]) -> None:
    """Validate the enforcing keys, each error naming its line."""
    from corral.policy import _expect_methods, parse_size

    named = [k for k in ENFORCING if k in keys]
    if named and "hosts" not in keys:
        line = keys[named[0]][0]
        raise ValueError(f"{line}: {named[0]}: needs hosts (the rule would never apply)")
    for key in named:
        line, raw = keys[key]
        value = [raw] if key in LIST_KEYS and isinstance(raw, str) else raw
        try:
            if key in LIST_KEYS and not value:
                raise ValueError("an empty list matches nothing")
            if key == "hosts":
                assert isinstance(value, list)
                for host in value:
                    Rule(host)  # ValueError names the entry
                g.hosts = value
            elif key == "methods":
                g.methods = _expect_methods(value)
            elif key == "paths":
                assert isinstance(value, list)
                for glob in value:
                    PathGlob(glob)
                g.paths = value
            elif key == "action":
                action = str(value).strip().lower()
                if action not in ACTIONS:
                    raise ValueError(f"expected log, allow, ask or deny; got {value!r}")
                g.action = action
            else:
                g.max_body = parse_size(value)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{line}: {key}: {exc}") from None


def read(path: str) -> Guardrail:
    """Read and parse one file; GuardrailError on any problem (one line)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise GuardrailError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise GuardrailError(f"{path}: not UTF-8") from None
    return parse(text, path)


def files_in(directory: str) -> list[str]:
    """The ``.md`` files directly in ``directory``, sorted; GuardrailError if unreadable."""
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        raise GuardrailError(f"{directory}: cannot list guardrails: {exc.strerror}") from None
    return [
        os.path.join(directory, n)
        for n in names
        if n.endswith(".md")
        and not n.startswith(".")
        and os.path.isfile(os.path.join(directory, n))
    ]


def load_dirs(dirs: list[str]) -> list[Guardrail]:
    return [read(path) for directory in dirs for path in files_in(directory)]


def with_hash(text: str, path: str) -> str:
    """The file's text with its ``content_hash`` marker set to its body's hash:
    the last line inside the existing fence (an older marker removed), or a new
    fence holding only the marker.  Never a second fence; the body is untouched,
    so its hash is the same afterwards."""
    g = parse(text, path)
    bom = "\ufeff" if text.startswith("\ufeff") else ""
    text = text.removeprefix("\ufeff")
    fence, close, _ = _split(text)
    if fence is None:
        return f"{bom}---\n{MARKER}: {g.hash}\n---\n{text}"
    lines = text.split("\n")
    end = "\r" if lines[close].endswith("\r") else ""
    head = [line for line in lines[1:close] if not _is_marker(line)]
    return bom + "\n".join([lines[0], *head, f"{MARKER}: {g.hash}{end}", *lines[close:]])


def _is_marker(line: str) -> bool:
    key, colon, _ = line.partition(":")
    return bool(colon) and key == MARKER


# -- enforcing: the chain's hook -------------------------------------------------------


class Compiled:
    """One enforcing guardrail, ready to match requests."""

    __slots__ = ("action", "guardrail", "hosts", "methods", "paths", "rule")

    def __init__(self, g: Guardrail, table: dict[str, str]) -> None:
        self.guardrail = g
        self.hosts = [Rule(h) for h in g.hosts]
        self.methods = frozenset(g.methods) if g.methods is not None else None
        self.paths = [PathGlob(p, fold=True) for p in g.paths]  # restricts: any case
        self.action = g.effective_action(table)
        self.rule = f"guardrail {g.name}"

    def matches(self, method: str, path: str, query: Query | None) -> bool:
        if self.methods is not None and method not in self.methods:
            return False
        return not self.paths or any(glob.matches(path, query) for glob in self.paths)

    def verdict(self, method: str, path: str) -> Verdict:
        g = self.guardrail
        what = f"{g.title} (risk {g.tier or 'null'}" + (
            f", version {g.version})" if g.version else ")"
        )
        if self.action == "deny":
            return Verdict(False, self.rule, f"{method} {path} is denied by {what}")
        if self.action == "ask":
            return Verdict(
                False, self.rule, f"ask: {method} {path} needs approval: {what}", ask=True
            )
        return Verdict(True, self.rule, f"logged: {what}")


class GuardrailHook(Hook):
    """Guardrails in the chain, beside ``[[network.rules]]`` (deny wins across
    both).  Unlike those rules, a guardrail does not make its hosts deny what it
    does not match: a request no guardrail matches gets no opinion here.  A
    request is guarded as each method and path it may be served as, a POST's
    form or JSON ``_method`` included (read as the rules read it:
    :func:`corral.net.httprules.form_override`)."""

    name = "guardrails"
    connect_by_host_port = True
    replayable = True
    CACHE_SIZE = 4096

    def __init__(self, guardrails: list[Guardrail], table: dict[str, str]) -> None:
        self.compiled = [Compiled(g, table) for g in guardrails if g.enforcing]
        self._by_host: dict[tuple[str, int], list[Compiled]] = {}
        # (host, port, method, target as sent) -> what decide() said: keep-alive
        # clients ask about the same URLs over and over
        self._decided: dict[tuple[str, int, str, str], Decided | None] = {}

    def inspects(self) -> list[tuple[str, str]]:
        return [
            (h, f"guardrail {c.guardrail.path}") for c in self.compiled for h in c.guardrail.hosts
        ]

    def for_host(self, host: str, port: int) -> list[Compiled]:
        key = (host, port)
        found = self._by_host.get(key)
        if found is None:
            if len(self._by_host) >= self.CACHE_SIZE:
                self._by_host.clear()
            found = self._by_host[key] = [
                c for c in self.compiled if any(covers(r, host, port) for r in c.hosts)
            ]
        return found

    def sees_requests_to(self, host: str, port: int) -> bool:
        return bool(self.for_host(host, port))  # a host no guardrail names: no say

    def decide(
        self, host: str, port: int, method: str, target: bytes
    ) -> tuple[Verdict, Compiled | None] | None:
        """(verdict, the deciding guardrail) or None when no guardrail applies.
        The strictest matching guardrail decides (deny, then ask, then log)."""
        ruled = self.for_host(host, port)
        if not ruled:
            return None
        try:
            path, query = normalize_target(target)
        except BadPath as exc:
            return Verdict(False, "bad-path", exc.reason), None
        method = method.upper()
        # every guardrail restricts: it holds for every path an origin may read
        lenient = readings(target, path)
        chosen: Compiled | None = None
        for c in ruled:
            hit = any(c.matches(method, reading, query) for reading in lenient)
            if hit and (chosen is None or STRICTNESS[c.action] > STRICTNESS[chosen.action]):
                chosen = c
        if chosen is None:
            return None
        return chosen.verdict(method, path), chosen

    def on_request(self, dest: Destination, request: Request) -> Verdict | None:
        found = self._cached(dest, request.method, request.target)
        # a POST served as the method it names, a path served as the one a routing
        # header names
        for method, target in alternates(request.method, request.target, request.headers):
            other = self._cached(dest, method, target)
            if _strictness(other) > _strictness(found):
                found = other
        if request.body_length != 0 and _strictness(found) < DENIED and is_post(request.method):
            # a POST served as the method its form or JSON body names in _method
            other = self._form_override(dest, request)
            if _strictness(other) > _strictness(found):
                found = other
        if found is None:
            return None
        verdict, chosen, fields = found
        if chosen is not None:
            # in the request's audit line whichever verdict is reported (another
            # hook's allow, or the Asker's answer to this one's ask)
            request.audit["guardrail"] = fields
            limit = chosen.guardrail.max_body
            if verdict.allowed and limit is not None:
                request.limit_body(limit, chosen.rule)
        return verdict

    def _form_override(self, dest: Destination, request: Request) -> Decided | None:
        """:func:`corral.net.httprules.form_override` with the guardrails deciding:
        the guardrail that denies or asks for a method the body names (or could,
        before it is read) decides, and is audited."""
        target = request.target

        def decide(method: str) -> Verdict | None:
            found = self._cached(dest, method, target)
            return found[0] if found is not None else None

        over = form_override(request, dest, decide)
        if over is None:
            return None
        method, verdict = over
        decided = self._cached(dest, method, target)
        assert decided is not None  # (decide found a verdict for it)
        return verdict, decided[1], decided[2]

    def _cached(self, dest: Destination, method: str, target: str) -> Decided | None:
        key = (dest.host, dest.port, method, target)
        if key in self._decided:
            return self._decided[key]
        found = self._decided_now(*key)
        if len(target) <= CACHED_TARGET:  # (what a client makes us keep: bounded)
            if len(self._decided) >= self.CACHE_SIZE:
                self._decided.clear()
            self._decided[key] = found
        return found

    def _decided_now(self, host: str, port: int, method: str, target: str) -> Decided | None:
        found = self.decide(host, port, method, target.encode("latin-1"))
        if found is None:
            return None
        verdict, chosen = found
        fields = chosen.guardrail.audit_fields(chosen.action) if chosen is not None else {}
        return verdict, chosen, fields


DENIED = 3  # the strictness of a deny


def _strictness(found: Decided | None) -> int:
    """No opinion, allow (log), ask, deny: 0 to 3."""
    if found is None:
        return 0
    verdict = found[0]
    return 2 if verdict.ask else 1 if verdict.allowed else DENIED


# what GuardrailHook.on_request needs of a decision: the verdict, the deciding
# guardrail and its audit fields (made once: the same for every such request)
Decided = tuple[Verdict, Compiled | None, dict[str, object]]
