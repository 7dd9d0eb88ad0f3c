"""Method and path rules per host (``[[network.rules]]``): pure matching.

An entry names a ``host`` (the syntax of ``[network] allow``: a name,
``*.name``, an address or network, optionally ``:port``), optionally
``methods`` and ``paths`` (no key: any), an optional ``max_body``, and an
``action``: ``allow``, ``deny`` or ``ask``.  Or it is a git preset:
``git = "read"`` allows clone and fetch over smart HTTP, ``"write"`` push too.

For a request to a host that some entry names:

* every entry whose host, method and path match is found; a ``deny`` among
  them decides (deny wins), else an ``ask``, else an ``allow``;
* a request that no entry matches is denied: a host with rules has no
  default allow;
* ``max_body`` of the matching ``allow`` entries bounds the request body (the
  smallest applies), enforced while the body streams.

Entries narrow; they never open a host: it must be reachable through
``[network] allow`` as before.  A host no entry names is not affected.

**Paths.**  A glob is matched against the request's path after it is
decoded and normalized once, as an origin would before routing:

* percent-escapes are decoded once (``%2F`` is a ``/``, ``%41`` an ``A``);
  a malformed escape, a path that is not UTF-8, a control character, a
  backslash, a ``;`` (path parameters: servers disagree on them) or an escape
  that decodes to another escape (``%252F``: double decoding) make the
  request ambiguous, and an ambiguous request to a ruled host is denied;
* a ``.`` or ``..`` segment, however spelled (``%2e%2e``, ``..%2F``), makes the
  request ambiguous too: the origin gets the target as sent, and some resolve
  it while others route on it as it is (``/secret/../public`` is under
  ``/secret`` for Node, Express, Starlette and Werkzeug, not for nginx);
* empty segments (``//``) are dropped, so ``//a//b`` is ``/a/b``; a trailing
  ``/`` is kept (``/a`` and ``/a/`` differ);
* origins route one path in several ways: ``%2F`` is a ``/`` to nginx but a
  character of its segment to GitLab, Rails, Express and Go's ServeMux
  (``/projects/group%2Fproject`` is one project); Express, Rails and Spring 5
  route ``/a/`` as ``/a``; Rails ``/a.json`` (any ``.format``) as ``/a``;
  Express and ASP.NET ``/A`` as ``/a``.  An ``allow``
  is matched against the decoded path as it is; a ``deny`` or ``ask`` against
  every such reading, in any case (``*`` matches a kept ``%2F``), so that no
  spelling an origin routes to a denied handler slips past it;
* ``*`` matches any characters within one segment (not ``/``), ``**`` as a
  whole segment matches any number of segments, none included: ``/api/**``
  matches ``/api``, ``/api/`` and ``/api/v1/x``; ``/**/info/refs`` matches
  ``/info/refs`` and ``/a/b.git/info/refs``.  Nothing else is a wildcard;
  ``[``, ``]``, ``{``, ``}``, ``%``, ``\\``, ``;`` and ``#`` are refused in a
  glob so that no pattern means something other than it reads.
* Without a ``?``, a glob ignores the query.  With one (``/x?service=git-upload-pack``)
  the request's query must have the same parameters in the same order, each
  key and value decoded once and matched with ``*`` as any characters.

Methods are compared case-insensitively (an origin that reads ``delete`` as
``DELETE`` must not slip past a rule for ``DELETE``).  A HEAD is decided as a
GET too (most frameworks serve it with the GET handler): it passes only where
both would (see :func:`alternates`).
"""

from __future__ import annotations

import operator
import re

from corral.net.hooks import Hook, strongest
from corral.net.rules import Rule, Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from corral.net.hooks import Destination, Request

ACTIONS = ("allow", "deny", "ask")
GIT_MODES = ("read", "write")
KEYS = ("host", "methods", "paths", "max_body", "action", "git")
# What each git preset allows: smart HTTP only (the dumb protocol reads files
# such as /objects/... and /HEAD that no preset can tell from anything else).
# A path alone is not enough: a forge that serves its API on the same host took
# ``POST /api/v1/repos/o/r/contents/git-upload-pack`` (Gitea: create a file, a
# commit) as a fetch (found by attacking the proxy).  So a preset's POST passes
# only as git sends it (:meth:`HttpRule.as_git_sends`): no query, no escaped
# slash in the path, and git's own content type, which no forge's API parses
# into the parameters it needs.
GIT_READ = (
    ("GET", "/**/info/refs?service=git-upload-pack"),
    ("POST", "/**/git-upload-pack"),
)
GIT_WRITE = (
    ("GET", "/**/info/refs?service=git-receive-pack"),
    ("POST", "/**/git-receive-pack"),
)
GIT_CONTENT = {  # the POST's last path segment -> the only content type it may carry
    "git-upload-pack": b"application/x-git-upload-pack-request",
    "git-receive-pack": b"application/x-git-receive-pack-request",
}
GIT_PUSH_HINT = 'git = "read" allows clone and fetch; git = "write" allows push too'
ASK_REASON = "a rule asks a person to approve this request"  # see corral.net.approvals

_HEX = frozenset(b"0123456789abcdefABCDEF")
# bytes a path may hold and still be its own normal form (no %, \\, ;, #, controls)
_SAFE_PATH = b"".join(bytes([b]) for b in range(0x21, 0x7F) if chr(b) not in "%\\;#?")
_GLOB_REFUSED = "[]{}%\\;#"


class BadPath(ValueError):
    """A request target that cannot be read one way only; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


Query = list[tuple[str, str | None]]


def _unquote(raw: bytes, what: str) -> str:
    """Decode percent-escapes once, strictly."""
    if b"%" not in raw:
        data = raw
    else:
        out = bytearray()
        i = 0
        while i < len(raw):
            byte = raw[i]
            if byte == 0x25:  # %
                pair = raw[i + 1 : i + 3]
                if len(pair) != 2 or not _HEX.issuperset(pair):
                    raise BadPath(f"malformed percent-escape in the {what}")
                out.append(int(pair, 16))
                i += 3
            else:
                out.append(byte)
                i += 1
        data = bytes(out)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadPath(f"the {what} is not UTF-8") from None
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise BadPath(f"control character in the {what}")
    return text


def _is_escape(text: str, at: int) -> bool:
    pair = text[at + 1 : at + 3].encode("ascii", "replace")
    return len(pair) == 2 and _HEX.issuperset(pair)


def normalize_target(target: bytes) -> tuple[str, Query | None]:
    """An origin-form target -> (normalized decoded path, query parameters or None).

    Raises :class:`BadPath` where origins could read the target differently."""
    raw_path, sep, raw_query = target.partition(b"?")
    if _plain_path(raw_path):  # the usual case: nothing to decode or resolve
        try:
            return raw_path.decode("ascii"), _query(raw_query) if sep else None
        except UnicodeDecodeError:
            pass  # the long way says why
    if b"#" in target:
        raise BadPath("a fragment (#) in the request target")
    if raw_path == b"*":  # OPTIONS *: the server as a whole
        return "*", None
    if not raw_path.startswith(b"/"):
        raise BadPath("the request path does not start with /")
    text = _unquote(raw_path, "path")
    if "\\" in text:
        raise BadPath("a backslash in the path (some servers read it as /)")
    if ";" in text:
        raise BadPath("a ';' in the path (path parameters are read differently by servers)")
    if "%" in text and any(_is_escape(text, i) for i, c in enumerate(text) if c == "%"):
        raise BadPath("a double-encoded path (an escape that decodes to another escape)")
    parts = text.split("/")
    if "." in parts or ".." in parts:
        # The origin gets the target as sent: Node, Express, Starlette and Werkzeug
        # route /secret/../public under /secret, nginx under /public.  No one reading.
        raise BadPath("a '.' or '..' segment in the path (origins resolve them differently)")
    query = _query(raw_query) if sep else None
    return _merged(parts), query


def _merged(parts: list[str]) -> str:
    """Segments joined without the empty ones; a trailing slash kept."""
    segments = [part for part in parts if part]
    path = "/" + "/".join(segments)
    if segments and parts[-1] == "":
        path += "/"  # a trailing slash is part of the path
    return path


def readings(target: bytes, path: str) -> tuple[str, ...]:
    """Every path a lenient router may take ``target`` for, ``path`` (its
    normalized path) first: with ``%2F`` kept in its segment (:func:`slash_kept`),
    each without and with a trailing slash (Express, Rails and Spring 5 route
    ``/a/`` as ``/a``), and each without a ``.format`` suffix of its last segment
    (:func:`without_format`: Rails routes ``/merge.json`` as ``/merge``).  A deny
    or ask matches any of them, in any case (Express and ASP.NET route ``/A`` as
    ``/a``); an allow only ``path``, as it is."""
    kept = slash_kept(target) if b"%" in target else None
    found = [path]
    for reading in (path, kept):
        if reading is not None and reading != "/":
            bare = reading.rstrip("/")
            found += [bare, bare + "/"]
            stem = without_format(bare)
            if stem is not None:
                found += [stem, stem + "/"]
    return tuple(dict.fromkeys(found))


def without_format(path: str) -> str | None:
    """``path`` without the ``.format`` suffix of its last segment, or None when it
    has none: Rails makes every route ``path(.:format)``, so ``PUT
    /pulls/1/merge.json`` runs the merge action.  The format is what Rails'
    ``:format`` matches: one or more characters, none a ``.`` or ``/`` (only the
    last suffix: ``a.b.c`` is ``a.b``), after a segment that is not empty."""
    stem, dot, ext = path.rpartition(".")
    if not dot or not ext or "/" in ext or not stem or stem.endswith("/"):
        return None
    return stem


def slash_kept(target: bytes) -> str | None:
    """The path as origins that keep ``%2F`` inside its segment read it (GitLab,
    Rails, Express, Go's ServeMux: ``/projects/group%2Fproject`` is one project),
    when the target has one; the escape stays as ``%2F``, which no glob holds and
    ``*`` matches.  Call after :func:`normalize_target` accepted ``target``."""
    raw_path = target.partition(b"?")[0]
    if b"%2f" not in raw_path.lower():
        return None
    pieces = raw_path.replace(b"%2f", b"%2F").split(b"%2F")
    return _merged("%2F".join(_unquote(piece, "path") for piece in pieces).split("/"))


def _plain_path(raw: bytes) -> bool:
    """A path that normalizing would leave as it is: starts with /, no escapes,
    no empty, ``.`` or ``..`` segments, none of the refused characters."""
    return (
        raw.startswith(b"/")
        and not raw.translate(None, _SAFE_PATH)
        and b"//" not in raw
        and b"/." not in raw
    )


def _query(raw: bytes) -> Query:
    if not raw:
        return []
    params: Query = []
    for item in raw.split(b"&"):
        key, eq, value = item.partition(b"=")
        params.append((_unquote(key, "query"), _unquote(value, "query") if eq else None))
    return params


class PathGlob:
    """One entry of ``paths``: a path glob and, after ``?``, query parameters."""

    __slots__ = ("path", "query", "text")

    def __init__(self, text: str, fold: bool = False) -> None:
        """``fold``: match the path in any case (a deny's glob: see :func:`readings`)."""
        self.text = text
        path_text, sep, query_text = text.partition("?")
        self.path = re.compile(_path_regex(path_text, text), re.IGNORECASE if fold else 0)
        self.query: list[tuple[re.Pattern[str], re.Pattern[str] | None]] | None = None
        if sep:
            if not query_text:
                raise ValueError(f"bad path glob {text!r}: nothing after '?'")
            self.query = [_param_regex(p, text) for p in query_text.split("&")]

    def matches(self, path: str, query: Query | None) -> bool:
        if self.path.fullmatch(path) is None:
            return False
        if self.query is None:
            return True
        if query is None or len(query) != len(self.query):
            return False
        for (key, value), (key_re, value_re) in zip(query, self.query, strict=True):
            if key_re.fullmatch(key) is None:
                return False
            if (value is None) != (value_re is None):
                return False
            if value is not None and value_re is not None and value_re.fullmatch(value) is None:
                return False
        return True


def _check_glob_chars(part: str, text: str) -> None:
    for char in part:
        if char in _GLOB_REFUSED or ord(char) < 0x20 or ord(char) == 0x7F:
            shown = repr(char) if char.isprintable() else f"U+{ord(char):04X}"
            raise ValueError(
                f"bad path glob {text!r}: {shown} is not allowed "
                "(write paths decoded; only * and ** are wildcards)"
            )


def _path_regex(glob: str, text: str) -> str:
    if not glob.startswith("/"):
        raise ValueError(f"bad path glob {text!r}: must start with /")
    _check_glob_chars(glob, text)
    segments = glob[1:].split("/")
    out = ""
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "" and not last:
            raise ValueError(f"bad path glob {text!r}: empty segment (//)")
        if segment in (".", ".."):
            raise ValueError(f"bad path glob {text!r}: '.' and '..' segments never match")
        if segment == "**":
            # any number of whole segments, none included
            out += "(?:/.*)?" if last else "(?:/[^/]+)*"
            continue
        if "**" in segment:
            raise ValueError(f"bad path glob {text!r}: ** must be a whole segment")
        out += "/" + _star_regex(segment, "[^/]*")
    return out or "/"


def _star_regex(part: str, star: str) -> str:
    return star.join(re.escape(piece) for piece in part.split("*"))


def _param_regex(param: str, text: str) -> tuple[re.Pattern[str], re.Pattern[str] | None]:
    _check_glob_chars(param, text)
    if "**" in param:
        raise ValueError(f"bad path glob {text!r}: ** has no meaning in a query")
    key, eq, value = param.partition("=")
    key_re = re.compile(_star_regex(key, ".*"))
    return key_re, re.compile(_star_regex(value, ".*")) if eq else None


def covers(rule: Rule, host: str, port: int) -> bool:
    """Does an entry in ``[network] allow`` syntax cover a normalized host (a name
    or an address) on ``port``?"""
    if rule.matches_name(host, port):
        return True
    from corral.net import ip

    try:
        address = ip.address(host)
    except ValueError:
        return False
    return rule.matches_address(address, port)


class HttpRule:
    """One compiled entry (a git preset compiles to several, each with the entry's name)."""

    __slots__ = ("action", "git", "host", "max_body", "methods", "name", "path_match", "paths")

    def __init__(
        self,
        name: str,
        host: Rule,
        action: str,
        methods: frozenset[str] | None,
        paths: list[PathGlob],
        max_body: int | None = None,
        git: bool = False,
    ) -> None:
        self.name = name
        self.host = host
        self.action = action
        self.git = git  # a git preset's: see as_git_sends
        self.methods = methods  # None: any method
        fold = action != "allow"  # a deny or ask holds in any case (see readings)
        self.paths = [PathGlob(g.text, fold) for g in paths] if fold else paths  # empty: any
        self.max_body = max_body
        # globs without a query, all in one pattern: one match per request, not one each
        self.path_match = None
        if paths and all(glob.query is None for glob in paths):
            joined = "|".join(f"(?:{glob.path.pattern})" for glob in paths)
            self.path_match = re.compile(joined, re.IGNORECASE if fold else 0).fullmatch

    def matches(self, method: str, path: str, query: Query | None) -> bool:
        if self.methods is not None and method not in self.methods:
            return False
        return self.matches_path(path, query)

    def matches_path(self, path: str, query: Query | None) -> bool:
        if not self.paths:
            return True
        if self.path_match is not None:
            return self.path_match(path) is not None
        return any(glob.matches(path, query) for glob in self.paths)

    def as_git_sends(self, method: str, raw_path: bytes, query: Query | None) -> bool:
        """A git preset's POST: no query and no escaped slash, as git sends it (its
        content type is checked per request: :func:`git_content_refusal`)."""
        if not self.git or method != "POST":
            return True
        return query is None and b"%2f" not in raw_path.lower()


def compile_entry(index: int, entry: dict[str, object]) -> list[HttpRule]:
    """A validated entry (see :func:`corral.policy._expect_http_rules`) -> rules.
    ``index`` is 1-based, as a person counts the ``[[network.rules]]`` blocks."""
    host_text = entry["host"]
    assert isinstance(host_text, str)
    host = Rule(host_text)
    git = entry.get("git")
    if isinstance(git, str):
        name = f"network.rules[{index}] (git {git})"
        pairs = GIT_READ + (GIT_WRITE if git == "write" else ())
        return [
            HttpRule(name, host, "allow", frozenset({method}), [PathGlob(path)], git=True)
            for method, path in pairs
        ]
    methods = entry.get("methods")
    paths = entry.get("paths")
    max_body = entry.get("max_body")
    action = entry.get("action")
    assert isinstance(action, str)
    return [
        HttpRule(
            f"network.rules[{index}]",
            host,
            action,
            frozenset(methods) if isinstance(methods, list) else None,
            [PathGlob(p) for p in paths] if isinstance(paths, list) else [],
            max_body if isinstance(max_body, int) else None,
        )
    ]


Decision = tuple[Verdict, "HttpRule | None"]  # the verdict, and the allow whose max_body applies
# A target longer than this is decided afresh each time: the cache holds at most
# CACHE_SIZE of them, so what a client can make the proxy keep stays small.
CACHED_TARGET = 2048


class HttpRules:
    """All entries, with the ones that apply to each (host, port) found once, and
    the decisions made, by (host, port, method, target) as the client sent them:
    keep-alive clients ask about the same URLs over and over, and a hit costs
    one dict lookup."""

    CACHE_SIZE = 4096

    def __init__(self, rules: list[HttpRule]) -> None:
        self.rules = rules
        self.git_names = frozenset(r.name for r in rules if r.git)  # (allowed by a preset)
        self._by_host: dict[tuple[str, int], RuledHost] = {}
        self.decided: dict[tuple[str, int, str, str], Decision] = {}

    @classmethod
    def from_entries(cls, entries: list[dict[str, object]]) -> HttpRules:
        rules: list[HttpRule] = []
        for index, entry in enumerate(entries, 1):
            rules += compile_entry(index, entry)
        return cls(rules)

    def host(self, host: str, port: int) -> RuledHost:
        """The entries that name (normalized host, port), worked out on its first request."""
        key = (host, port)
        found = self._by_host.get(key)
        if found is None:
            if len(self._by_host) >= self.CACHE_SIZE:
                self._by_host.clear()
            found = self._by_host[key] = RuledHost(
                host, [r for r in self.rules if covers(r.host, host, port)]
            )
        return found

    def for_host(self, host: str, port: int) -> list[HttpRule]:
        return self.host(host, port).rules

    def decide(
        self, host: str, port: int, method: str, target: bytes
    ) -> tuple[Verdict | None, HttpRule | None]:
        """(verdict, the allow rule whose max_body applies); (None, None) when no
        entry names the host."""
        ruled = self.host(host, port)
        if not ruled.rules:
            return None, None
        return self.decision(ruled, port, method, target.decode("latin-1"))

    def decision(self, ruled: RuledHost, port: int, method: str, target: str) -> Decision:
        """``target``: origin-form, one character per byte (Request.target)."""
        key = (ruled.host, port, method, target)
        found = self.decided.get(key)
        if found is None:
            found = ruled.decide(method.upper(), target)
            if len(target) <= CACHED_TARGET:
                if len(self.decided) >= self.CACHE_SIZE:
                    self.decided.clear()
                self.decided[key] = found
        return found


class RuledHost:
    """The entries that name one (host, port), by method."""

    __slots__ = ("by_method", "host", "rules")

    def __init__(self, host: str, rules: list[HttpRule]) -> None:
        self.host = host
        self.rules = rules
        self.by_method: dict[str, list[HttpRule]] = {}  # upper-case method -> its entries

    def _for_method(self, method: str) -> list[HttpRule]:
        found = self.by_method.get(method)
        if found is None:
            if len(self.by_method) >= 64:  # any token is a method: a client may make up many
                self.by_method.clear()
            found = self.by_method[method] = [
                r for r in self.rules if r.methods is None or method in r.methods
            ]
        return found

    def decide(self, method: str, target: str) -> Decision:
        """Deny wins, then ask, then allow; no entry matching denies.  A deny or ask
        matches the path as any lenient router reads it (:func:`readings`)."""
        raw = target.encode("latin-1")
        try:
            path, query = normalize_target(raw)
        except BadPath as exc:
            return Verdict(False, "bad-path", exc.reason), None
        lenient = readings(raw, path)
        allow: HttpRule | None = None
        ask: HttpRule | None = None
        limit: HttpRule | None = None
        limit_size = 0
        for rule in self._for_method(method):
            if rule.action == "allow":
                if not rule.matches_path(path, query):
                    continue
                if not rule.as_git_sends(method, raw.partition(b"?")[0], query):
                    continue
            elif not any(rule.matches_path(reading, query) for reading in lenient):
                continue
            if rule.action == "deny":
                return Verdict(False, rule.name, f"{method} {path} is denied"), None
            if rule.action == "ask":
                ask = ask or rule
                continue
            if allow is None or (allow.git and not rule.git):  # a rule of the user's first
                allow = rule
            if rule.max_body is not None and (limit is None or rule.max_body < limit_size):
                limit, limit_size = rule, rule.max_body
        if ask is not None:
            return Verdict(False, ask.name, ASK_REASON, ask=True), None
        if allow is not None:
            return Verdict(True, allow.name), limit
        why = f"no rule for {self.host} allows {method} {path}"
        if "git-receive-pack" in target:  # the path alone reads as clone's /info/refs
            why = f"git push to {self.host}: no rule allows it ({GIT_PUSH_HINT})"
        return Verdict(False, "network.rules", why), None


class HttpRulesHook(Hook):
    """``[[network.rules]]`` in the chain: decides each request to a ruled host
    (and asks for the HTTPS of every ruled host to be intercepted)."""

    name = "rules"
    connect_by_host_port = True
    replayable = True  # (a body read for a _method field is never replayed)

    def __init__(self, rules: HttpRules, patterns: list[tuple[str, str]]) -> None:
        self.rules = rules
        self.patterns = patterns

    @classmethod
    def from_policy(cls, entries: list[dict[str, object]]) -> HttpRulesHook:
        patterns = [(str(e["host"]), f"network.rules[{i}].host") for i, e in enumerate(entries, 1)]
        return cls(HttpRules.from_entries(entries), patterns)

    def inspects(self) -> list[tuple[str, str]]:
        return self.patterns

    def sees_requests_to(self, host: str, port: int) -> bool:
        return bool(self.rules.host(host, port).rules)  # a host no entry names: no say

    def on_request(self, dest: Destination, request: Request) -> Verdict | None:
        rules = self.rules
        # (the lookups of HttpRules.decide, inlined: this runs for every request)
        found = rules.decided.get((dest.host, dest.port, request.method, request.target))
        if found is None:
            ruled = rules.host(dest.host, dest.port)
            if not ruled.rules:
                return None
            found = rules.decision(ruled, dest.port, request.method, request.target)
        verdict, limit = found
        if limit is not None and limit.max_body is not None:
            request.limit_body(limit.max_body, limit.name)
        if verdict.allowed and verdict.rule in rules.git_names and request.method == "POST":
            verdict = git_content_refusal(request) or verdict
        if not verdict.allowed and not verdict.ask:
            return verdict  # (an ask still looks at the alternates: a deny there wins)
        if (
            ALTERNATE_HEADERS.isdisjoint(map(_name, spelled_as_servers_read(request.headers)))
            and not ("?" in request.target and _may_name_method(request.target))
            and not is_head(request.method)
        ):
            if request.body_length != 0 and is_post(request.method):
                return _strongest(verdict, _form_override(rules, dest, request))
            return verdict  # (no override, not a HEAD: the usual case, looked at in C)
        ruled = rules.host(dest.host, dest.port)
        for method, target in alternates(request.method, request.target, request.headers):
            other, _ = rules.decision(ruled, dest.port, method, target)
            verdict = _strongest(verdict, other)
        if request.body_length != 0 and is_post(request.method):
            verdict = _strongest(verdict, _form_override(rules, dest, request))
        return verdict


def git_content_refusal(request: Request) -> Verdict | None:
    """A POST a git preset allowed by its path, refused unless it carries the
    content type git sends with it (see GIT_CONTENT)."""
    service = request.target.partition("?")[0].rpartition("/")[2]
    wanted = GIT_CONTENT.get(service)
    got = request.get(b"content-type")
    if wanted is not None and got is not None and got.strip().lower() == wanted:
        return None
    kind = (wanted or b"").decode()
    why = f"a git preset allows POST {service} only with git's content type ({kind})"
    return Verdict(False, "network.rules", why)


def _strongest(verdict: Verdict, other: Verdict | None) -> Verdict:
    """Of two decisions on one request, the one that stands (the chain's rule: a
    deny, else an ask, else the first)."""
    return strongest((verdict, other)) or verdict


# Headers with which Google's APIs, Express's method-override, Rack and Symfony take
# a POST for another method: a request carrying one is decided as that method too.
METHOD_OVERRIDES = frozenset({b"x-http-method-override", b"x-http-method", b"x-method-override"})
# Headers with which IIS's URL Rewrite, Symfony and Zend route a request to another
# path than its request line names (a GET /public/x served as /admin/delete).
PATH_OVERRIDES = frozenset({b"x-original-url", b"x-rewrite-url"})
ALTERNATE_HEADERS = METHOD_OVERRIDES | PATH_OVERRIDES
_name = operator.itemgetter(0)


def is_head(method: str) -> bool:
    """A HEAD, in any case (servers upper-case the method before routing)."""
    return len(method) == 4 and method.upper() == "HEAD"


def served_as(methods: list[str], head: bool = True) -> list[str]:
    """``methods``, each followed by GET where it is a HEAD (see :func:`alternates`);
    ``head=False``: as they are."""
    if not head or not any(map(is_head, methods)):
        return methods
    return [m for method in methods for m in ((method, "GET") if is_head(method) else (method,))]


def alternates(
    method: str, target: str, headers: list[tuple[bytes, bytes]], head: bool = True
) -> list[tuple[str, str]]:
    """Each (method, target) an origin may serve this request as, besides its own:
    the methods its override headers or a ``_method`` query parameter name, the
    paths its routing headers name, and each such method on each such path.  A
    rule that denies any of them denies the request; a path that is not
    origin-form matches no allow rule.

    A HEAD (on the request line or named by an override) is served as a GET too:
    Werkzeug (Flask), Starlette, Express, Rails and Django run the GET handler for
    it, side effects and all, and only drop the body, so a deny of ``GET
    /admin/**`` was passed by ``HEAD /admin/reset`` (found by attacking the
    proxy).  A HEAD therefore passes only where a GET would pass too (deny wins,
    an ask stands), and where HEAD itself would: a host whose rules allow GET but
    not HEAD still denies it, one whose rules allow HEAD but deny (or do not
    allow) GET denies it now.  ``head=False`` leaves that GET out (the
    approvals: a grant for HEAD stands for it, see
    :func:`corral.net.approvals.grant_method_covers`)."""
    in_query = query_methods(target) if "?" in target and _may_name_method(target) else []
    headers = spelled_as_servers_read(headers)
    if ALTERNATE_HEADERS.isdisjoint(map(_name, headers)) and not in_query:
        # (the usual case, looked at in C: this runs for every request)
        return [("GET", target)] if head and is_head(method) else []
    methods = served_as([method, *_overrides(headers), *in_query], head)
    targets = [target] + [
        value.decode("latin-1").strip() for name, value in headers if name in PATH_OVERRIDES
    ]
    pairs = [(m, t) for m in methods for t in targets if (m, t) != (method, target)]
    return list(dict.fromkeys(pairs))


# What Rack's MethodOverride, Symfony (Laravel) and Express's method-override take
# from a ``_method`` parameter (Rack: a POST's form body; Symfony: the body, else the
# query; Laravel: a JSON body too; Express: the query, when configured so).
OVERRIDE_PARAMETER = "_method"
FORM_OVERRIDABLE = ("GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS", "LINK", "UNLINK")
_PARAMETER_MARKERS = (b"x-www-form-urlencoded", b"multipart/", b"/json", b"+json")


def _is_override(name: str) -> bool:
    """Whether a parameter name is ``_method`` as some server reads it: Rack drops
    brackets around a name (``[_method]``), PHP reads ``.`` and a space as ``_``."""
    plain = name.replace("[", "").replace("]", "").replace(".", "_").replace(" ", "_")
    return plain.strip().lower() == OVERRIDE_PARAMETER


def _named(value: str) -> list[str]:
    """The methods a value names, upper-cased: each between commas (Express's
    method-override takes the first of a list)."""
    return [m.strip().upper() for m in value.split(",") if m.strip()]


def _may_name_method(target: str) -> bool:
    """Whether a target's query could hold ``_method`` in some spelling (any letter
    of it may be percent-encoded: servers decode parameter names)."""
    query = target.partition("?")[2].lower()
    return "method" in query or "%" in query


def query_methods(target: str) -> list[str]:
    """The methods ``_method`` parameters in a target's query name, upper-cased."""
    from urllib.parse import parse_qsl

    query = target.partition("?")[2].partition("#")[0]
    pairs = parse_qsl(query, keep_blank_values=True, encoding="latin-1")
    return [m for name, value in pairs if _is_override(name) for m in _named(value)]


def is_post(method: str) -> bool:
    """A POST, in any case (Symfony, so Laravel, upper-cases the method before it
    looks for a ``_method``)."""
    return method == "POST" or (len(method) == 4 and method.upper() == "POST")


def _form_body(request: Request) -> bool:
    """Whether a request has a body a server may read parameters from: url-encoded,
    any ``multipart/`` type (Rack parses ``multipart/mixed`` and ``/related`` as it
    does ``multipart/form-data``), JSON as Laravel's ``isJson()`` reads it (``/json``
    or ``+json`` anywhere in the header: ``text/json``, ``application/json5``,
    ``application/vnd.api+json``), any of a list of types, or of no declared type,
    an empty one included (Rack parses those as forms)."""
    if request.body_length == 0:
        return False
    kind = request.get(b"content-type")
    if kind is None or not kind.strip():
        return True
    # (anywhere in the header: servers cut a type at ";", "," or, as PHP does, a
    # space, so "application/x-www-form-urlencoded x" is a form there; found by
    # attacking the proxy)
    kind = kind.lower()
    return any(marker in kind for marker in _PARAMETER_MARKERS)


FORM_READ = 1 << 20  # the longest body read for its _method (by its Content-Length)


def form_override(
    request: Request, dest: Destination, decide: Callable[[str], Verdict | None]
) -> tuple[str, Verdict] | None:
    """A POST whose body may name another method (``_method``: Rails serves ``POST
    /posts/1`` with ``_method=delete`` as a DELETE), decided by a hook as each
    method that body could name: ``decide(method)`` is the hook's verdict on
    ``request.target`` as that method (None: no opinion).  The rules and the
    guardrails both decide so (:class:`HttpRulesHook`,
    :class:`corral.net.guardrails.GuardrailHook`).

    With the body read (``request.body``): the strictest verdict (a deny, else an
    ask) of the methods it names, and that method.  Before that, where ``decide``
    denies or asks for some method a body could name: a deny while the body is
    asked for (a Content-Length up to FORM_READ: ``request.want_body``; the proxy
    then asks the hooks again, and never replays a decision made with a body),
    else a deny saying why.  None when there is nothing to decide: not a POST
    with a form or JSON body, or every method it names (could name) is allowed."""
    if not is_post(request.method) or not _form_body(request):
        return None
    if request.body is not None:
        found: tuple[str, Verdict] | None = None
        for method in served_as(form_methods(request.body)):
            other = decide(method)
            if other is None or other.allowed:
                continue
            if not other.ask:
                return method, other  # (a deny: nothing is stricter)
            found = found or (method, other)
        return found
    for method in FORM_OVERRIDABLE:
        other = decide(method)
        if other is None or other.allowed:
            continue
        length = request.body_length
        if length is not None and 0 < length <= FORM_READ:
            request.want_body(length)
            why = "the body is read for a _method field before the request is decided"
            return method, Verdict(False, other.rule, why)
        return method, Verdict(
            False,
            other.rule,
            "a POST's form or JSON body may name another method in a _method field, which "
            f"Rails, Rack, Symfony and Laravel serve as that method, and {method} "
            f"{dest.path or '/'} on {dest.host} is not allowed ({other.reason or other.rule}); "
            f"corral reads such a body only with a Content-Length of at most {FORM_READ} bytes",
        )
    return None


def _form_override(rules: HttpRules, dest: Destination, request: Request) -> Verdict | None:
    """:func:`form_override` with the rules of ``dest``'s host deciding."""
    ruled = rules.host(dest.host, dest.port)
    target = request.target

    def decide(method: str) -> Verdict:
        return rules.decision(ruled, dest.port, method, target)[0]

    found = form_override(request, dest, decide)
    return found[1] if found is not None else None


_MULTIPART_NAMES = re.compile(
    rb"content-disposition:[^\r\n]*?\bname\s*=\s*"
    rb"(?:\"([^\"\r\n]*)\"|'([^'\r\n]*)'|([^;\s]+))"  # quoted either way, or bare
    rb"[^\r\n]*\r?\n(?:[^\r\n]+\r?\n)*\r?\n([^\r\n]*)",  # the part's headers; its first line
    re.IGNORECASE,
)


def form_methods(body: bytes) -> list[str]:
    """The methods a body's ``_method`` fields name, upper-cased, read every way a
    server might whatever the declared type: url-encoded (names and values
    percent-decoded), multipart parts so named, a JSON object's key."""
    from urllib.parse import parse_qsl

    text = body.decode("latin-1")
    pairs = parse_qsl(text, keep_blank_values=True, encoding="latin-1")
    found = [m for name, value in pairs if _is_override(name) for m in _named(value)]
    for double, single, bare, value in _MULTIPART_NAMES.findall(body):
        if _is_override((double or single or bare).decode("latin-1")):
            found += _named(value.decode("latin-1"))
    if text.lstrip().startswith("{"):
        found += _json_methods(body)
    return found


def _json_methods(body: bytes) -> list[str]:
    """A JSON object's ``_method`` (Laravel reads a JSON body as its parameters)."""
    import json

    try:
        data = json.loads(body)
    except ValueError:
        return []
    if not isinstance(data, dict):
        return []
    return [m for k, v in data.items() if _is_override(k) and isinstance(v, str) for m in _named(v)]


def spelled_as_servers_read(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Headers with each name's ``_`` read as ``-``, where any name has one: CGI and
    WSGI servers (and frameworks on them) make both HTTP_X_HTTP_METHOD_OVERRIDE,
    so X_HTTP_Method_Override: DELETE was served as a DELETE past a deny.  The
    headers themselves go on as sent; only what the rules look at is read so."""
    if b"_" not in b"\n".join(map(_name, headers)):  # (in C: this runs for every request)
        return headers
    return [(k.replace(b"_", b"-"), v) for k, v in headers]


def overrides(headers: list[tuple[bytes, bytes]]) -> list[str]:
    """The methods a request's override headers name, upper-cased."""
    return _overrides(spelled_as_servers_read(headers))


def _overrides(headers: list[tuple[bytes, bytes]]) -> list[str]:
    """overrides() of headers spelled as servers read them already."""
    if METHOD_OVERRIDES.isdisjoint(map(_name, headers)):
        return []  # (the usual case, looked at in C: this runs for every request)
    return [
        m
        for name, value in headers
        if name in METHOD_OVERRIDES
        for m in _named(value.decode("latin-1"))
    ]
