"""Credentials that never enter the sandbox (``[secrets.NAME]``).

Inside, ``NAME`` holds a placeholder (``corral-secret-NAME-`` and 128 random
bits, new for each run).  The proxy, on the host, holds the real value:

* on a request to one of the secret's hosts it replaces the placeholder with
  the value wherever it appears in the request line's path and query and in
  header values, ``Authorization: Basic`` included (the placeholder can only
  be seen there after base64 decoding);
* with ``header``, it sets that header (``format``, e.g. ``Bearer {value}``)
  on every request to those hosts, whatever the client sent;
* a placeholder on its way to any other host, in any of those places (a
  percent-encoded one too), denies the request (``secret-wrong-host``);
* a response header (of an interim 1xx head too), reason phrase or body that
  echoes the value reaches the client with the placeholder instead: the value
  as it is, percent-encoded however an origin spells it, or inside base64 at
  any offset (:func:`_hide`), that base64 wrapped, JSON-escaped or
  percent-encoded too (:func:`_hide_wrapped`).  For the body to be read whole, a request to a
  secret's host asks for no compression and no range; a body compressed anyway
  is decompressed (gzip, deflate) or, in any other encoding, refused
  (``secret-echo``).  The body streams through :class:`_EchoFilter`, re-framed
  by the proxy (see corral.net.hooks.BodyFilter).

What the proxy does not see: request bodies (a placeholder in one is sent as
it is), the bytes of a WebSocket after its upgrade, and anything inside a
tunnel it does not intercept.  Audit lines name the secrets a request carried,
and those whose echo was hidden in a body (``echoes_hidden``), never a value.

The values are read in corral's own process when the run starts
(:meth:`SecretsHook.open`: from its environment or a file; a file source is
also masked inside the sandbox), and the proxy workers forked from it inherit
them: nothing crosses the door.  The placeholders are made there too, so each
run has its own, and reach the sandbox's environment through
:meth:`SecretsHook.sandbox_env`.
"""

from __future__ import annotations

import base64
import binascii
import operator
import os
import re
from itertools import chain

from corral.errors import RefusedError
from corral.net import http1
from corral.net.hooks import BodyFilter, Hook, kept_size
from corral.net.httprules import covers
from corral.net.names import is_address
from corral.net.rules import Rule, Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.net.hooks import Destination, Request, Response
    from corral.policy import Policy, Secret

PREFIX = b"corral-secret-"
PREFIX_TEXT = PREFIX.decode()
# the prefix in any case: an origin reads a placeholder upper-cased as well as
# lower-cased (the placeholder got through so, found by attacking the proxy)
_PREFIX_ANY = re.compile(re.escape(PREFIX_TEXT), re.IGNORECASE).search
UNESCAPE_DEPTH = 3  # percent-decodings tried in turn (%2563 is %63 is c)
MAX_VALUE = 8 * 1024  # a credential, not a document; it has to fit in a header
WRONG_HOST = "secret-wrong-host"
PLAIN_HTTP = "secret-plain-http"
ECHO = "secret-echo"  # a response body the proxy cannot check for an echo
# request headers that would make a response's body partial or encoded
_WHOLE = frozenset((b"accept-encoding", b"range", b"if-range"))
# a compressed body (its origin compressed it unasked) is decoded up to this
# much per piece read: more is a bomb, not an API's answer
MAX_INFLATED = 64 * 1024 * 1024
# ... and at most this much at a time: the copy waits for the client to drain
# between steps (BodyFilter.pending), so a connection holds a few steps at most
# whatever the compression ratio (64 MiB at once was held per connection, a few
# connections' worth outside the run's limits: found by attacking the proxy)
INFLATE_STEP = 4 * http1.CHUNK
# bytes a value keeps when it goes into a path or a query; the rest is percent-encoded
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# Headers costing more than this to keep (hooks.kept_size) are worked out afresh for
# each request: the cache holds at most HEADER_SETS sets, so what a client can make
# the proxy keep stays small.
CACHED_HEADERS = 4096
_NOTHING = re.compile("(?!)")  # matches nowhere: no secret read yet


def new_placeholder(name: str) -> str:
    """What the sandbox holds under ``name``: 128 random bits, new for each run."""
    return f"corral-secret-{name}-{os.urandom(16).hex()}"


class Loaded:
    """One secret with its real value, in corral's process and the proxy only.
    Its repr never shows the value (an exception or a debugger printing it must
    not leak it)."""

    __slots__ = (
        "_spelled",
        "_wrapped",
        "cores",
        "encoded",
        "header",
        "header_value",
        "hosts",
        "name",
        "placeholder",
        "stripped",
        "value",
    )

    def __init__(self, secret: Secret, value: bytes, placeholder: str) -> None:
        self.name = secret.name
        self.placeholder = placeholder.encode()
        self.value = value
        self.encoded = _percent_encode(value)  # the form that goes into a path or query
        self.hosts = [Rule(h) for h in secret.hosts]
        self.header = secret.header.encode()
        self.header_value = secret.format.encode().replace(b"{value}", value)
        self.cores = _base64_cores(value)
        self._spelled: re.Pattern[bytes] | None = None  # made where it is used: a worker
        self._wrapped: re.Pattern[bytes] | None = None
        self.stripped = _stripped_cores(self.cores)
        _check_fit(self)

    def spelled(self) -> re.Pattern[bytes]:
        """The value as URL encoders write it back (:func:`_spellings`)."""
        if self._spelled is None:
            self._spelled = _spellings(self.value)
        return self._spelled

    def wrapped(self) -> re.Pattern[bytes]:
        """The base64 cores with white space allowed between any two characters:
        MIME and PEM wrap base64 at 76 or 64 characters (LF, CRLF, a CR alone),
        YAML and folded headers indent the next line, and some print it in groups
        split by spaces or tabs; a break may fall inside the value's core.  The
        line breaks JSON-escaped too (GitHub's contents API), and '/' and '+'
        escaped as JSON writers (PHP's ``\\/``) and URL encoders write them (see
        _unescaped).  In bodies (see _EchoFilter) and response heads."""
        if self._wrapped is None:
            gap = rb"(?:[\t\n\r ]|\\[nrt]){0,%d}" % MAX_GAP
            cores = (gap.join(_spelled_char(c) for c in core) for core in self.cores)
            self._wrapped = re.compile(b"|".join(cores))
        return self._wrapped

    def allowed_to(self, host: str, port: int, plain: bool = False) -> bool:
        """Whether the value may go to (host, port); over plain HTTP (``plain``)
        only by an entry that names a port: "api.test" means its HTTPS, so a
        sandbox cannot have the key sent in clear text to http://api.test:80."""
        return any(
            covers(rule, host, port) and (not plain or rule.ports is not None)
            for rule in self.hosts
        )

    def names(self, host: str) -> bool:
        """Whether one of the secret's host entries names (normalized) ``host``, on
        any port: where its echo is hidden."""
        return any(_names(rule, host) for rule in self.hosts)

    def __repr__(self) -> str:
        return f"<secret {self.name}>"


def _check_fit(secret: Loaded) -> None:
    """What the hook will write, checked once (the proxy does not check it again on
    each request: SecretsHook.writes_checked).  The policy's loader checks the
    same; this holds for a Secret made any other way too."""
    value, header = secret.value, secret.header
    if not value or len(value.translate(None, http1.CONTROL_BYTES)) != len(value):
        raise RefusedError(f"secret {secret.name}: the value is empty or holds a control character")
    if not header:
        return
    if header.translate(None, http1.TOKEN_BYTES) or header != header.lower():
        raise RefusedError(f"secret {secret.name}: header {header!r} is not a lower-case name")
    if header in http1.HOP_BY_HOP | http1.FRAMING | {b"transfer-encoding"}:
        raise RefusedError(f"secret {secret.name}: header {header.decode()} frames the request")
    fill = secret.header_value
    if len(fill.translate(None, http1.CONTROL_BYTES)) != len(fill):
        raise RefusedError(f"secret {secret.name}: format holds a control character")


def _percent_encode(value: bytes) -> bytes:
    return b"".join(bytes([b]) if b in _UNRESERVED else b"%%%02X" % b for b in value)


def _spellings(value: bytes) -> re.Pattern[bytes]:
    """The value however an origin's URL encoder writes it back into a header (a
    redirect's Location, a Link): each byte as itself or %XX, the hex digits in
    either case, %25XX when encoded twice, a space also as '+'."""
    parts = []
    for byte in value:
        high, low = f"{byte:02X}"[0], f"{byte:02X}"[1]
        escape = f"%(?:25)?[{high}{high.lower()}][{low}{low.lower()}]"
        plus = r"|\+" if byte == 0x20 else ""
        parts.append(f"(?:{re.escape(chr(byte))}|{escape}{plus})")
    return re.compile("".join(parts).encode("latin-1"))


_URLSAFE = bytes.maketrans(b"+/", b"-_")
_STANDARD = bytes.maketrans(b"-_", b"+/")
_BASE64 = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_")
MIN_CORE = 8  # shorter base64 would turn up by chance in any cookie


def _base64_cores(value: bytes) -> list[bytes]:
    """What base64 of anything holding the value holds, wherever the value starts
    within a 3-byte group (Basic credentials, a JSON session cookie, a token): the
    characters that encode its own bytes only, in both alphabets."""
    cores = set()
    for offset in range(3):
        whole = value[offset : offset + (len(value) - offset) // 3 * 3]
        core = base64.b64encode(whole)
        if len(core) >= MIN_CORE:
            cores |= {core, core.translate(_URLSAFE)}
    return sorted(cores)


def read_value(secret: Secret, policy: Policy) -> bytes:
    """The real value, from the environment of corral's own process or a file.

    RefusedError (exit 122) names the secret and its source when it is missing,
    unreadable, empty or unfit for a header; the value is never in a message."""
    what = f"secret {secret.name}"
    if secret.kind == "env":
        raw = os.environb.get(secret.ref.encode())
        if raw is None:
            raise RefusedError(f"{what}: environment variable {secret.ref} is not set")
        source = f"environment variable {secret.ref}"
    else:
        path = policy.expand(secret.ref)
        try:
            with open(path, "rb") as fh:
                raw = fh.read(MAX_VALUE + 3)
        except OSError as exc:
            raise RefusedError(f"{what}: cannot read {path}: {exc.strerror}") from None
        source = path
        # a file written by an editor or `echo` ends in a newline: not part of a key
        raw = raw.removesuffix(b"\n").removesuffix(b"\r")
    if not raw:
        raise RefusedError(f"{what}: {source} is empty (corral never sends an empty key)")
    if len(raw) > MAX_VALUE:
        raise RefusedError(f"{what}: {source} holds more than {MAX_VALUE} bytes")
    if any(b < 0x20 or b == 0x7F for b in raw):
        raise RefusedError(
            f"{what}: {source} holds a control character or line break (it cannot go in a header)"
        )
    return raw


def _unescapings(text: str) -> str:
    """``text`` and its percent-decodings, each decoded again while that changes
    it (at most UNESCAPE_DEPTH), one per line: where to look for a placeholder."""
    out = [text]
    while "%" in out[-1] and len(out) <= UNESCAPE_DEPTH:
        decoded = _decoded(out[-1].encode("latin-1")).decode("latin-1")
        if decoded == out[-1]:
            break
        out.append(decoded)
    return "\n".join(out)


def _decoded(target: bytes) -> bytes:
    """The target with percent-escapes decoded (leniently: only to look for
    placeholders, never to send)."""
    if b"%" not in target:
        return target
    parts = target.split(b"%")
    out = bytearray(parts[0])
    for part in parts[1:]:
        try:
            out.append(int(part[:2], 16))
            out += part[2:]
        except ValueError:
            out += b"%" + part
    return bytes(out)


def _basic(value: bytes) -> bytes | None:
    """The decoded credentials of ``Basic <base64>`` (the scheme in any case, any
    blank after it, padding or not, either base64 alphabet: as lenient servers
    read them), or None."""
    scheme, _, token = value.strip().partition(b" ")
    if b"\t" in scheme:
        scheme, _, rest = scheme.partition(b"\t")
        token = rest + token
    if scheme.lower() != b"basic":
        return None
    token = token.strip()
    token += b"=" * (-len(token) % 4)
    try:
        if b"-" in token or b"_" in token:
            return base64.urlsafe_b64decode(token)
        return base64.b64decode(token, validate=True)
    except (binascii.Error, ValueError):
        return None


class SecretsHook(Hook):
    """``[secrets]`` in the chain: refuses a placeholder bound for the wrong host
    (on_request), puts the real values in (rewrite), hides echoed values in the
    response head and body (on_response).

    Every request to every host is looked at (a placeholder may be on its way
    anywhere).  What a set of headers holds, and what it becomes, is worked
    out once per destination (:meth:`_seen`); a request costs a lookup of its
    headers and two scans of its target."""

    name = "secrets"
    connect_by_host_port = True
    CACHE_SIZE = 4096
    HEADER_SETS = 256  # header sets kept with what they hold (kept_size at most CACHED_HEADERS)
    # what rewrite writes: the client's own (checked) values with placeholders
    # replaced by values without a control byte, Basic credentials re-encoded, the
    # header of a secret (its name and format checked in _check_fit); a target
    # with placeholders replaced by percent-encoded values; what on_response
    # writes: placeholders (unreserved characters only) in place of values in header
    # values and the reason phrase, and base64 re-encoded around them
    writes_checked = True
    replayable = True

    def __init__(self, policy: Policy) -> None:
        self.policy = policy  # nothing is read here: see open()
        self.secrets: list[Loaded] = []
        self._find = _NOTHING.findall  # every placeholder of this run in some text
        self._find_any_case = _NOTHING.findall  # ... in header names (lower-cased)
        self._by_lower: dict[str, str] = {}
        self._headers: dict[tuple[str, int, bool, tuple[tuple[bytes, bytes], ...]], _Seen] = {}
        self._by_host: dict[tuple[str, int, bool], _HostPlan] = {}
        # the request on_request last looked at, and what its headers hold: rewrite
        # of that same request (the usual next call) needs no second lookup
        self._last: tuple[Request | None, _Seen | None] = (None, None)

    def inspects(self) -> list[tuple[str, str]]:
        return [
            (host, f"secrets.{name}.hosts")
            for name, secret in self.policy.secrets.items()
            for host in secret.hosts
        ]

    def open(self) -> None:
        """Read every value and make this run's placeholders; the first source
        missing refuses the run, naming the secret."""
        from corral.policy import check_secrets

        check_secrets(self.policy)
        self.secrets = [
            Loaded(s, read_value(s, self.policy), new_placeholder(s.name))
            for s in self.policy.secrets.values()
        ]
        if self.secrets:  # one pattern (re factors out the common prefix), longest first
            texts = sorted((s.placeholder.decode() for s in self.secrets), key=len, reverse=True)
            pattern = "|".join(re.escape(t) for t in texts)
            self._find = re.compile(pattern).findall
            self._find_any_case = re.compile(pattern, re.IGNORECASE).findall
            self._by_lower = {t.lower(): t for t in texts}
        self._by_host.clear()
        self._headers.clear()

    def sandbox_env(self) -> dict[str, str]:
        return {s.name: s.placeholder.decode() for s in self.secrets}

    def needs_inspection(self, host: str, port: int) -> bool:
        """The secrets' hosts, and every destination that may be a secret host's
        server under another name: an address (allowed beside the name, or the one
        a pin gives it), and a name pinned (``[network] hosts``) to the address of a
        secret host's pin.  An origin keeps what it was sent and may name it on a
        later response, whichever way it is reached: those are read (HTTPS
        intercepted, plain HTTP request by request, anything else refused) for
        echoes to be hidden (:meth:`for_host`); an opaque tunnel there brought the
        value back (found by attacking the proxy).  ``[tls] passthrough`` still
        wins: an address passed through is the user's choice, unread."""
        # a secret's host name on any port: one server, which may name on one port
        # what was sent to another (found by attacking the proxy)
        return self._shared(host) or any(_names(rule, host) for rule in self._inspected())

    def _shared(self, host: str) -> bool:
        """Whether (normalized) ``host`` may be a secret host's server by another
        name, where every secret's echo is hidden."""
        if is_address(host):
            return True
        shared = self.__dict__.get("_shared_names")
        if shared is None:
            shared = self.__dict__["_shared_names"] = _names_sharing_a_pin(self.policy)
        return host in shared

    def sees_requests_to(self, host: str, port: int) -> bool:
        return bool(self.policy.secrets)  # any host: a placeholder must not go there

    def rewrites_for(self, host: str, port: int) -> bool:
        # (over HTTPS: plain HTTP takes fewer; where echoes are hidden, the response
        # is asked for whole and plain, for its body to be read: see _HostPlan.rewrite)
        return bool(self.for_host(host, port).hidden)

    def sees_responses_from(self, host: str, port: int) -> bool:
        return bool(self.for_host(host, port).hidden)  # no value goes there: none comes back

    def for_host(self, host: str, port: int, plain: bool = False) -> _HostPlan:
        """What requests to (host, port) need, over HTTPS or plain HTTP (``plain``)."""
        key = (host, port, plain)
        found = self._by_host.get(key)
        if found is None:
            if len(self._by_host) >= self.CACHE_SIZE:
                self._by_host.clear()
            mine = [s for s in self.secrets if s.allowed_to(host, port, plain)]
            https_only = [
                s.name for s in self.secrets if plain and s not in mine and s.allowed_to(host, port)
            ]
            # An address may be a secret host's server by another name (its address,
            # allowed beside its name): what every secret sent there could echo is
            # hidden in its responses, though none is sent to the address itself.  A
            # shared name hides every secret's echo even when it is some secret's host
            # itself: two secrets' hosts pinned to one gateway are one server, which
            # may name either value under either name (found by attacking the proxy)
            # ... and the port does not matter: a secret whose host entry names one port
            # (or HTTPS only) is hidden on every port of that name, plain HTTP too
            named = [s for s in self.secrets if s.names(host)]
            hidden = self.secrets if self._shared(host) else named
            found = self._by_host[key] = _HostPlan(mine, self.secrets, https_only, hidden)
        return found

    def on_request(self, dest: Destination, request: Request) -> Verdict | None:
        seen = self._seen(dest, request.headers)
        self._last = (request, seen)
        target = request.target
        if "%" in target or _PREFIX_ANY(target) or _PREFIX_ANY(request.method):
            in_target = self._in_target(target) + self._any_case(request.method)
            if in_target:
                names, verdict = seen.plan.carrying(dest.host, seen.found + in_target)
                request.audit["secrets"] = names
                return verdict
        if seen.names:  # the secrets carried, and those whose header is set
            request.audit["secrets"] = seen.names
        return seen.verdict

    def rewrite(self, dest: Destination, request: Request) -> None:
        last, seen = self._last
        if last is not request or seen is None:  # (an ask held it; others came between)
            seen = self._seen(dest, request.headers)
        if not seen.plan.hidden:
            return  # no value goes there (and a placeholder for there was refused)
        if PREFIX_TEXT in request.target:
            target = request.target.encode("latin-1")
            for secret in seen.plan.mine:
                target = target.replace(secret.placeholder, secret.encoded)
            request.target = target.decode("latin-1")
        if seen.rewritten is None:
            seen.rewritten = seen.plan.rewrite(request.headers)
        request.headers[:] = seen.rewritten

    def on_response(
        self, dest: Destination, request: Request, response: Response
    ) -> Verdict | None:
        # (over HTTPS or not: a value sent before over HTTPS can come back in clear)
        plan = self._by_host.get((dest.host, dest.port, False)) or self.for_host(
            dest.host, dest.port
        )
        if not plan.hidden:
            return None  # no value ever goes there: none can come back
        # (whether this request carried one does not matter: an origin keeps what an
        # earlier one sent, in a session, and may name it on any later response)
        if not 100 <= response.status < 200:  # (an interim head has no body)
            refused = _watch_body(dest, plan, request, response)
            if refused is not None:
                return refused
        if len(response.reason) >= plan.shortest:  # "401 bad key ..." echoes too
            response.reason = _hide_head(response.reason, plan.hidden)
        for name, value in response.headers:
            if len(value) >= plan.shortest or len(name) >= plan.shortest:
                break
        else:  # no name or value is long enough to hold an echo, in any spelling
            return None
        text = b"\n".join(chain.from_iterable(response.headers)).decode("latin-1")
        names = b"\n".join(k for k, _ in response.headers)
        if any(map(text.__contains__, plan.echoes)) or _names_echo(names, plan):
            # a header named after the value is no header a client needs: dropped
            response.headers[:] = [
                (k, _hide_head(v, plan.hidden))
                for k, v in response.headers
                if _hide(k, plan.hidden) == k and not _names_echo(k, plan)
            ]
        return None

    def _seen(self, dest: Destination, headers: list[tuple[bytes, bytes]]) -> _Seen:
        """What these very headers hold and become on their way to ``dest``, worked
        out once: a keep-alive client sends the same headers request after
        request, and hashing them is cheaper than the scans (the key is the
        headers themselves, so a hit is exact)."""
        plain = dest.scheme != "https"
        key = (dest.host, dest.port, plain, tuple(headers))
        seen = self._headers.get(key)
        if seen is None:
            plan = self._by_host.get((dest.host, dest.port, plain)) or self.for_host(
                dest.host, dest.port, plain
            )
            seen = _Seen(plan, dest.host, self._in_headers(headers))
            if kept_size(headers) <= CACHED_HEADERS:
                if len(self._headers) >= self.HEADER_SETS:
                    self._headers.clear()
                self._headers[key] = seen
        return seen

    def _in_headers(self, headers: list[tuple[bytes, bytes]]) -> tuple[str, ...]:
        """This run's placeholders in header values and names, Basic credentials
        included."""
        values = _values_text(headers)
        parts = [_unescapings(values) if "%" in values else values]
        parts.append(b"\n".join(k for k, _ in headers).decode("latin-1"))  # (lower-cased)
        for key, value in headers:
            if key in (b"authorization", b"proxy-authorization"):
                decoded = _basic(value)
                if decoded is not None:
                    parts.append(decoded.decode("latin-1"))
        # (no placeholder holds a newline: none is made of two parts joined here)
        return self._any_case("\n".join(parts))

    def _in_target(self, target: str) -> tuple[str, ...]:
        """This run's placeholders in a target, as it is and percent-decoded."""
        return self._any_case(_unescapings(target))

    def _any_case(self, text: str) -> tuple[str, ...]:
        """This run's placeholders in ``text``, in any case (each as it is made)."""
        return tuple(self._by_lower[f.lower()] for f in self._find_any_case(text))


def _names_sharing_a_pin(policy: Policy) -> frozenset[str]:
    """Names ``[network] hosts`` pins to a secret host's address: one it also pins a
    secret's host name to, or one a secret's host entry names itself (``hosts =
    ["127.0.0.1:8080"]``, found by attacking the proxy); normalized.  One server
    under two names, one of which gets the value."""
    from corral.net import ip
    from corral.net.names import normalize

    pins = {normalize(name): normalize(address) for name, address in policy.network.hosts.items()}
    rules = [Rule(h) for secret in policy.secrets.values() for h in secret.hosts]
    theirs = {address for name, address in pins.items() if any(_names(r, name) for r in rules)}
    for address in set(pins.values()) - theirs:
        try:
            parsed = ip.address(address)
        except ValueError:
            continue
        if any(r.network is not None and parsed in r.network for r in rules):
            theirs.add(address)
    return frozenset(name for name, address in pins.items() if address in theirs)


def _names(rule: Rule, name: str) -> bool:
    """Does an entry in ``[network] allow`` syntax name ``name``, on some port?"""
    if rule.wildcard is not None:
        return rule.wildcard == "" or name.endswith("." + rule.wildcard)
    return rule.host == name


class _Seen:
    """One set of request headers on its way to one destination: the placeholders
    in it, the audit line's ``secrets`` and the verdict for a request that
    carries no other, and what rewrite makes of it (None until it is allowed)."""

    __slots__ = ("found", "names", "plan", "rewritten", "verdict")

    def __init__(self, plan: _HostPlan, host: str, found: tuple[str, ...]) -> None:
        self.plan = plan
        self.found = found
        self.names, self.verdict = plan.carrying(host, found)
        self.rewritten: list[tuple[bytes, bytes]] | None = None


class _HostPlan:
    """What a destination's requests need of the secrets, worked out once per host."""

    __slots__ = (
        "allowed",
        "echo_openers",
        "echo_window",
        "echoes",
        "header_keys",
        "header_names",
        "header_pairs",
        "hidden",
        "https_only",
        "mine",
        "name_echoes",
        "names",
        "shortest",
        "shortest_value",
    )

    def __init__(
        self,
        mine: list[Loaded],
        all_secrets: list[Loaded],
        https_only: list[str] | None = None,
        hidden: list[Loaded] | None = None,
    ) -> None:
        self.mine = mine  # the secrets that may go there
        self.hidden = mine if hidden is None else hidden  # those whose echoes are hidden
        self.https_only = frozenset(https_only or ())  # names: there, but only over HTTPS
        self.allowed = frozenset(s.placeholder.decode() for s in mine)
        self.names = {s.placeholder.decode(): s.name for s in all_secrets}
        with_header = [s for s in mine if s.header]
        self.header_names = sorted({s.name for s in with_header})
        self.header_keys = frozenset(s.header for s in with_header)
        self.header_pairs = [(s.header, s.header_value) for s in with_header]
        # what a response header holding an echo holds (as text): the value, the
        # base64 of its bytes, or the escape that starts a percent-encoded byte
        # (" " as "+" too); _hide then finds each spelling
        hide = self.hidden
        echoes = {s.value for s in hide} | {c for s in hide for c in s.cores}
        self.shortest = min(map(len, echoes), default=1 << 62)  # no value: no echo
        # in a body (_EchoFilter): the shortest echo (the value as it is), and the
        # longest (each byte as %25XX, or a base64 core)
        self.shortest_value = min((len(s.value) for s in hide), default=1 << 62)
        self.echo_window = max(
            (max([5 * len(s.value), *map(len, s.cores)]) for s in hide), default=0
        )
        self.echo_openers = frozenset(
            {b"%"[0], b"+"[0]} | {s.value[0] for s in hide} | {c[0] for s in hide for c in s.cores}
        )
        self.name_echoes = sorted({e.lower() for e in echoes})
        if hide:
            echoes |= {b"%", b"+"} if any(b" " in s.value for s in hide) else {b"%"}
            echoes.add(b"\\")  # (base64 JSON-escaped: _hide_head)
        self.echoes = [e.decode("latin-1") for e in sorted(echoes)]

    def rewrite(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """Headers with this host's values in place of placeholders, and each
        secret's header set (whatever the client sent under that name).  The
        response must come whole and plain, for its body to be checked for an
        echo (:class:`_EchoFilter`): no compression asked for, and no range (two
        ranges could each carry part of a value)."""
        keys = self.header_keys
        kept = [
            (k, _swap(k, v, self.mine)) for k, v in headers if k not in keys and k not in _WHOLE
        ]
        return kept + self.header_pairs + [(b"accept-encoding", b"identity")]

    def carrying(self, host: str, found: tuple[str, ...]) -> tuple[list[str], Verdict | None]:
        """For the placeholders a request carries: the audit line's ``secrets``
        (those and the ones whose header is set), and a deny naming those that
        may not go to ``host`` (None: all may)."""
        names = sorted({*(self.names[p] for p in found), *self.header_names})
        wrong = sorted({self.names[p] for p in found if p not in self.allowed})
        if not wrong:
            return names, None
        if set(wrong) <= self.https_only:
            reason = (
                f"secret {', '.join(wrong)} goes to {host} over HTTPS only "
                "(a port in its hosts allows plain HTTP there)"
            )
            return names, Verdict(False, PLAIN_HTTP, reason)
        reason = f"secret {', '.join(wrong)} may not be sent to {host}"
        return names, Verdict(False, WRONG_HOST, reason)


def _values_text(headers: list[tuple[bytes, bytes]]) -> str:
    """Header values, one a line, as text (latin-1: one character per byte).  Text,
    because `in` on bytes first tries its operand as an int (an exception made
    and cleared each time): five times the cost of `in` on str."""
    return b"\n".join(map(_value, headers)).decode("latin-1")


_value = operator.itemgetter(1)


def _swap(key: bytes, value: bytes, secrets: list[Loaded]) -> bytes:
    """A header value with the placeholders of ``secrets`` replaced by their values."""
    for secret in secrets:
        value = value.replace(secret.placeholder, secret.value)
    if key == b"authorization":
        decoded = _basic(value)
        if decoded is not None and decoded.find(PREFIX) >= 0:
            for secret in secrets:
                decoded = decoded.replace(secret.placeholder, secret.value)
            value = b"Basic " + base64.b64encode(decoded)
    return value


def _names_echo(names: bytes, plan: _HostPlan) -> bool:
    """Header names (read lower-cased) hold a value or a base64 core, in any case:
    a name reaches the client lower-cased, the value's letters all but their case."""
    return any(map(names.__contains__, plan.name_echoes))


def _hide(value: bytes, secrets: list[Loaded]) -> bytes:
    """A response header value (or reason phrase) with each of the secrets' values
    replaced by its placeholder: as it is, percent-encoded in any way, and inside
    base64 (Basic credentials, a session cookie, a token)."""
    for secret in secrets:
        value = secret.spelled().sub(secret.placeholder, value)
        for core in secret.cores:
            for _ in range(value.count(core)):
                value = _hide_in_base64(value, value.find(core), core, secret)
    return value


def _hide_head(value: bytes, secrets: list[Loaded]) -> bytes:
    """:func:`_hide`, and base64 escaped (a redirect's query holding it
    percent-encoded, JSON in a header) or split by white space: as in bodies."""
    value = _hide(value, secrets)
    for secret in secrets:
        if secret.cores:
            value = _hide_wrapped(value, secret)
    return value


MAX_GAP = 32  # the most white space between two characters of wrapped base64
_SPACES = b"\t\n\r "
_BLANK_LINE = re.compile(rb"\n[\t ]*\n")
# base64 characters as a second encoding writes them: JSON ("\/" by PHP's
# json_encode, "\u002f"), a URL's query (percent-encoded); found by attacking the proxy
_ESCAPED = {
    ord("/"): (b"\\/", b"\\u002f", b"\\u002F", b"%2f", b"%2F"),
    ord("+"): (b"\\u002b", b"\\u002B", b"%2b", b"%2B"),
}
_ESCAPED_GAPS = (b"\\n", b"\\r", b"\\t")  # line breaks in a JSON string
_ALL_ESCAPES = (*_ESCAPED_GAPS, *_ESCAPED[ord("/")], *_ESCAPED[ord("+")], b"%3D", b"%3d")


def _spelled_char(char: int) -> bytes:
    """A pattern for one base64 character, as it is or escaped (_ESCAPED)."""
    spellings = [re.escape(bytes([char])), *map(re.escape, _ESCAPED.get(char, ()))]
    return spellings[0] if len(spellings) == 1 else b"(?:" + b"|".join(spellings) + b")"


# Bytes a wrapped or escaped core may hold beside its own characters, left out
# of both it and the text it is looked for in (_hide_wrapped): white space, the
# escapes' first bytes, and the letters of a JSON-escaped line break (the cores
# lose theirs too).  Then an escaped '/' or '+' is itself ("\\/"), or leaves
# "2F" ("%2F") or "u002f" ("\\u002f").
_MARKS = (b" ", b"\n", b"\r", b"\t", b"\\", b"%")
_STRIPPED = _SPACES + b"\\%nrt"
# ... and the rest folded to one case and one base64 alphabet, in the same pass: a
# hex digit's case no longer matters, and a core and its URL-safe twin are one
# (fewer scans; only to look: the pattern then finds the core exactly)
_FOLDED = bytes.maketrans(b"abcdefghijklmnopqrstuvwxyz-_", b"ABCDEFGHIJKLMNOPQRSTUVWXYZ+/")


def _stripped_cores(cores: list[bytes]) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """The cores as _hide_wrapped looks for them (_STRIPPED, _FOLDED): as they are,
    and with '/' and '+' as a percent-encoded or JSON \\u escape leaves them."""

    def spelled(slash: bytes, plus: bytes) -> set[bytes]:
        made = (core.replace(b"/", slash).replace(b"+", plus) for core in cores)
        return {core.translate(_FOLDED, _STRIPPED) for core in made}

    plain = spelled(b"/", b"+")
    return (
        sorted(plain),
        sorted(spelled(b"2F", b"2B") - plain),
        sorted(spelled(b"u002F", b"u002B") - plain),
    )


def _unescaped(text: bytes) -> bytes:
    """``text`` without white space and JSON-escaped line breaks, and with escaped
    base64 characters as themselves: a wrapped or escaped core is a core in
    this (leniently: only to look for one).  For a match or a piece's tail: a
    whole body is looked at through _stripped_cores, in one pass."""
    text = text.translate(None, _SPACES)
    if b"\\" in text:
        for gap in _ESCAPED_GAPS:
            if gap in text:  # (a scan costs less than a replace that finds nothing)
                text = text.replace(gap, b"")
    if b"\\" in text or b"%" in text:
        for char, spellings in _ESCAPED.items():
            for spelling in spellings:
                if spelling in text:
                    text = text.replace(spelling, bytes([char]))
    return text


def _unescaped_tail(tail: bytes) -> bytes:
    """The end of a piece as _unescaped reads it, an escape cut short at its very
    end left out (the next piece holds the rest of it)."""
    for mark in (b"\\", b"%"):
        at = tail.rfind(mark)
        if at >= 0 and len(tail) - at < 6:
            cut = tail[at:]
            if any(e.startswith(cut) and e != cut for e in _ALL_ESCAPES):
                tail = tail[:at]
    return _unescaped(tail)


def _hide_wrapped(value: bytes, secret: Loaded) -> bytes:
    """``value`` with each base64 core of the secret cut by white space (MIME, PEM,
    YAML, groups) hidden: the white space inside the core is dropped, joining
    what it split, and the joined run is hidden as an unbroken one is.  A byte
    or two of the value in a group before the core, before the break, stays
    there (as in a run cut short)."""
    if not any(map(value.__contains__, _MARKS)):
        return value  # (unbroken and unescaped, each core was hidden by _hide)
    # what white space, escapes and JSON-escaped breaks leave of a wrapped or escaped
    # core is in this (one pass; checked against as few cores as escapes are there)
    flat = value.translate(_FOLDED, _STRIPPED)
    plain, percent, unicode = secret.stripped
    if b"%" in value:
        plain = plain + percent
    if b"\\" in value:  # (one byte: a fast scan; a core is long: so are its)
        plain = plain + unicode
    if not any(map(flat.__contains__, plain)):
        return value
    pattern = secret.wrapped()
    for _ in range(len(value) // MIN_CORE + 1):  # each pass joins one match
        found = pattern.search(value)
        if found is None:
            break
        text = found.group()
        core = _unescaped(text)
        if core not in secret.cores:  # (cannot be: each escape stands for its character)
            value = value[: found.start()] + secret.placeholder + value[found.end() :]
            continue
        value = value[: found.start()] + core + value[found.end() :]
        value = _hide_in_base64(value, found.start(), core, secret, b"%" in text)
    return value


def _hide_in_base64(
    value: bytes, at: int, core: bytes, secret: Loaded, percent: bool = False
) -> bytes:
    """``value`` with the base64 run holding ``core`` at ``at`` decoded, the secret
    replaced by its placeholder and encoded again in the run's own alphabet; a run
    that does not hold the whole value (cut short) becomes the placeholder.  A run
    ``percent``-encoded (its core found escaped: _hide_wrapped) gets its '+', '/'
    and '=' percent-encoded again."""
    start, end = at, at + len(core)
    while start and value[start - 1] in _BASE64:
        start -= 1
    # the rest of an escape just before the run ("n" of a JSON "\\n") is not base64
    start = min(start + _escape_rest(value, start), at)
    start += (at - start) % 4  # a word glued before it is not part of its groups
    while end < len(value) and value[end] in _BASE64:
        end += 1
    body = value[start:end]
    body = body[: len(body) - (len(body) % 4 == 1)]  # a lone last character holds no byte
    pad = b"%3D" if percent and value[end : end + 3].upper() == b"%3D" else b"="
    padding = 0
    while padding < 2 and value[end + padding * len(pad) :][: len(pad)].upper() == pad:
        padding += 1
    padded = padding > 0 and start + len(body) == end
    stop = end + padding * len(pad) if padded else start + len(body)
    standard = body.translate(_STANDARD)
    decoded = base64.b64decode(standard + b"=" * (-len(standard) % 4))
    hidden = secret.spelled().sub(secret.placeholder, decoded)
    if hidden == decoded:
        return value[:start] + secret.placeholder + value[stop:]
    out = base64.b64encode(hidden)
    if standard != body:  # the URL-safe alphabet (a JWT, a signed cookie)
        out = out.translate(_URLSAFE)
        if not padded:
            out = out.rstrip(b"=")
    if percent:
        out = out.replace(b"+", b"%2B").replace(b"/", b"%2F").replace(b"=", b"%3D")
    return value[:start] + out + value[stop:]


def _escape_rest(value: bytes, start: int) -> int:
    """How many bytes from ``start`` are the rest of an escape (_ALL_ESCAPES) whose
    backslash or percent sign is just before it: 0 for none."""
    if not start or value[start - 1] not in _ESCAPE_MARKS:
        return 0
    for escape in _ALL_ESCAPES:
        if escape[0] == value[start - 1] and value.startswith(escape[1:], start):
            return len(escape) - 1
    return 0


# -- response bodies ---------------------------------------------------------------------


def _watch_body(
    dest: Destination, plan: _HostPlan, request: Request, response: Response
) -> Verdict | None:
    """Put an :class:`_EchoFilter` on the body of a response from a host of the
    secrets; refuse one compressed in a way it cannot read (the request asked
    for none: :meth:`_HostPlan.rewrite`)."""
    encodings = b""
    for k, v in response.headers:  # (one pass, no more: every response from the host)
        if k == b"content-encoding":
            encodings += b"," + v
    if not encodings and response.length is not None and response.length < plan.shortest_value:
        return None  # a plain body shorter than any value cannot hold one
    codings = _codings(encodings) if encodings else ()
    inflate = None
    if codings:
        if len(codings) > 1 or codings[0] not in (b"gzip", b"x-gzip", b"deflate"):
            named = b", ".join(codings).decode("latin-1")
            why = f"the response from {dest.host} is encoded as {named}: corral cannot check it"
            return Verdict(False, ECHO, why + " for an echo of a secret's value")
        inflate = _Inflate()
        response.headers[:] = [(k, v) for k, v in response.headers if k != b"content-encoding"]
    response.filters.append(_EchoFilter(plan, request.audit, inflate))
    return None


def _codings(encodings: bytes) -> tuple[bytes, ...]:
    """The content codings named (lower-case), identity left out, each as often as
    named: not http1.header_tokens, whose set would read "gzip, gzip" (a body
    compressed twice) as one gzip and pass on a body still compressed, unread."""
    named = (c.strip().lower() for c in encodings.split(b","))
    return tuple(c for c in named if c and c != b"identity")


class _Inflate:
    """gzip or zlib-wrapped deflate (told apart by their header), else raw deflate
    (what some servers send as "deflate"), at most INFLATE_STEP bytes a call: what
    a piece holds beyond that waits in ``tail`` for the next call (``feed(b"")``)."""

    def __init__(self) -> None:
        import zlib

        self._zlib = zlib
        self.stream = zlib.decompressobj(32 + zlib.MAX_WBITS)
        self.started = False  # some output came: the format is settled
        self.raw = False
        self.tail = b""  # compressed bytes not decoded yet (the step was full)
        self.made = 0  # bytes decoded from the piece last fed

    def feed(self, data: bytes) -> bytes:
        if data:
            self.made = 0  # (a piece comes once the last one's tail is decoded)
        data = self.tail + data if self.tail else data
        try:
            out = self.stream.decompress(data, INFLATE_STEP)
        except self._zlib.error:
            if self.started or self.raw:
                raise http1.HttpError(502, "a compressed response body is corrupt") from None
            self.raw = True  # no gzip or zlib header: raw deflate, from its first byte
            self.stream = self._zlib.decompressobj(-self._zlib.MAX_WBITS)
            return self.feed(data)
        self.started = self.started or bool(out)
        self.tail = self.stream.unconsumed_tail
        self.made += len(out)
        if self.made > MAX_INFLATED:
            raise http1.HttpError(502, "a compressed response body expands too far")
        return out

    def end(self) -> bytes:
        out = self.stream.flush()
        if not self.stream.eof and self.started:
            raise http1.HttpError(502, "a compressed response body ended early")
        return out


class _EchoFilter(BodyFilter):
    """A response body from a host of the secrets, each value it echoes replaced
    by its placeholder, as in headers (:func:`_hide`: as it is, percent-encoded,
    inside base64).  Only a tail that could be the start of an echo cut by the
    end of a piece is held back, until the next piece shows whether it is one:
    a stream (server-sent events from an API) reaches the client as it comes.
    The secrets it hid go in the audit line (``echoes_hidden``)."""

    def __init__(self, plan: _HostPlan, audit: dict[str, object], inflate: _Inflate | None) -> None:
        self.secrets = plan.hidden
        self.window = plan.echo_window  # no echo is longer (each byte as %25XX)
        self.shortest = plan.shortest_value  # no echo is shorter
        self.openers = plan.echo_openers  # the bytes an echo can start with
        self.audit = audit
        self.inflate = inflate
        self.grows = inflate is not None  # (see BodyFilter: then its output comes in steps)
        self.held = b""
        self.hidden: set[str] = set()

    def pending(self) -> bool:
        return self.inflate is not None and bool(self.inflate.tail)

    def feed(self, data: bytes) -> bytes:
        if self.inflate is not None:
            data = self.inflate.feed(data)
        data = self._hide(self.held + data)
        keep = self._open_tail(data)
        self.held = data[keep:]
        return data[:keep]

    def end(self) -> bytes:
        # (a caller that did not take every step gets the rest at once, bounded by
        # MAX_INFLATED: the proxy takes them, copy_filtered)
        out = b""
        while self.pending():
            out += self.feed(b"")
        data = self.held + (self.inflate.end() if self.inflate is not None else b"")
        self.held = b""
        out += self._hide(data)
        if self.hidden:
            self.audit["echoes_hidden"] = sorted(self.hidden)
        return out

    def _open_tail(self, data: bytes) -> int:
        """Where the longest tail of ``data`` that could be an echo cut short begins
        (``len(data)``: none could).  Whole echoes are hidden already."""
        openers = self.openers
        # (a wrapped core may stretch far beyond the window: up to MAX_GAP white
        # space between its characters; found by attacking the proxy)
        found = min((_wrapped_start(data, s) for s in self.secrets), default=len(data))
        for at in range(max(0, len(data) - self.window), found):
            if data[at] in openers:
                tail = data[at:]
                if any(_starts_echo(secret, tail) for secret in self.secrets):
                    return at
        return found

    def _hide(self, data: bytes) -> bytes:
        if len(data) < self.shortest:
            return data
        hidden = _hide(data, self.secrets)
        for secret in self.secrets:  # (the unbroken ones are hidden already)
            if secret.cores:
                hidden = _hide_wrapped(hidden, secret)
        if hidden != data:
            self.hidden |= {
                s.name
                for s in self.secrets
                if hidden.count(s.placeholder) > data.count(s.placeholder)
            }
        return hidden


def _wrapped_start(data: bytes, secret: Loaded) -> int:
    """Where the earliest tail of ``data`` that is one of the secret's base64 cores
    wrapped by white space and cut short begins (``len(data)``: none is).  Only
    the tail's last characters but white space can start one: fewer than a core
    holds, each at most MAX_GAP white space from the next, none across a blank
    line (see _starts_echo).  Escaped characters (_ESCAPED) count as theirs, and
    a JSON-escaped line break as white space (:func:`_escaped_start`)."""
    longest = max(map(len, secret.cores), default=0)
    at, gap = len(data), 0
    starts: list[int] = []
    while at and len(starts) < longest * _WIDEST:
        byte = data[at - 1]
        if byte in _SPACE_BYTES or (byte in _GAP_LETTERS and data[at - 2 : at - 1] == b"\\"):
            gap += 1
            if gap > MAX_GAP:
                break
            at -= 1 if byte in _SPACE_BYTES else 2
            continue
        if byte in _BASE64 or byte in _ESCAPE_MARKS:
            gap = 0
            starts.append(at - 1)
        else:
            break
        at -= 1
    if not starts:
        return len(data)
    if _ESCAPE_MARKS.intersection(data[starts[-1] :]):
        return _escaped_start(data, starts, secret)
    # the tail's characters but white space, once (the i-th of them is at starts[-1 - i]);
    # a core cut short starts at one holding its first character, fewer than it from the end
    flat = data[starts[-1] :].translate(None, _SPACES)
    view = memoryview(flat)
    earliest = len(flat)
    for core in secret.cores:
        at = flat.find(core[:1], max(0, len(flat) - len(core) + 1))
        while -1 < at < earliest:
            if view[at:] == memoryview(core)[: len(flat) - at]:  # (views: no copies)
                earliest = at
                break
            at = flat.find(core[:1], at + 1)
    if earliest == len(flat):
        return len(data)
    start = starts[-1 - earliest]
    tail = data[start:].replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return len(data) if _BLANK_LINE.search(tail) else start


_SPACE_BYTES = frozenset(_SPACES)
_ESCAPE_MARKS = frozenset(b"\\%")  # what starts an escaped base64 character
_GAP_LETTERS = frozenset(b"nrt")  # after a backslash: a JSON-escaped line break
_WIDEST = max(map(len, _ALL_ESCAPES))  # the most bytes one base64 character takes


def _escaped_start(data: bytes, starts: list[int], secret: Loaded) -> int:
    """_wrapped_start for a tail holding escapes: the earliest of ``starts`` (the
    tail's bytes but white space, last first) from which the tail, unescaped,
    is one of the secret's cores cut short.  Only bytes that can begin a core
    are tried (its first character, or an escape), each unescaping what follows:
    a few hundred bytes at most, only where an escape ends a piece."""
    firsts = {core[0] for core in secret.cores} | _ESCAPE_MARKS
    for start in reversed(starts):
        if data[start] not in firsts:
            continue
        flat = _unescaped_tail(data[start:])
        if flat and any(len(flat) < len(core) and core.startswith(flat) for core in secret.cores):
            tail = data[start:].replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            return len(data) if _BLANK_LINE.search(tail) else start
    return len(data)


def _starts_echo(secret: Loaded, tail: bytes) -> bool:
    """Whether ``tail`` is the start of an echo of ``secret`` cut short: the value
    in one of its spellings (:func:`_spellings`), or one of its base64 cores."""
    if any(len(tail) < len(core) and core.startswith(tail) for core in secret.cores):
        return True
    # a wrapped core (MIME, PEM, YAML) cut short; not across a blank line, which no
    # wrapped block holds and which ends a server-sent event (held, the event
    # would wait for the next one)
    flat = tail.translate(None, _SPACES)
    if (
        flat != tail
        and any(len(flat) < len(core) and core.startswith(flat) for core in secret.cores)
        and not _BLANK_LINE.search(tail.replace(b"\r\n", b"\n").replace(b"\r", b"\n"))
    ):
        return True
    at = 0
    for byte in secret.value:
        if at == len(tail):
            return True
        found = tail[at]
        if found == byte or (byte == 0x20 and found == 0x2B):  # (" " as "+")
            at += 1
            continue
        if found != 0x25:
            return False
        want, escape = b"%02X" % byte, tail[at + 1 : at + 5].upper()  # %XX or %25XX
        if len(escape) < 2:
            return want.startswith(escape) or b"25".startswith(escape)
        if escape[:2] == want:
            at += 3
        elif escape[:2] == b"25" and len(escape) < 4:
            return want.startswith(escape[2:])
        elif escape[:2] == b"25" and escape[2:4] == want:
            at += 5
        else:
            return False
    return False  # the whole value: an echo, not the start of one
