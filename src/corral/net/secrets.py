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
* a response header that echoes the value reaches the client with the
  placeholder instead.

What the proxy does not see: request and response *bodies* (a body that
carries the value is not rewritten, either way) and anything inside a tunnel
it does not intercept.  Audit lines name the secrets a request carried, never
a value.

The values are read in corral's own process when the run starts (from its
environment or a file; a file source is also masked inside the sandbox), and
the proxy workers forked from it inherit them: nothing crosses the door.
"""

from __future__ import annotations

import base64
import binascii
import os

from corral.errors import RefusedError
from corral.net.hooks import Hook
from corral.net.rules import Rule, Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from corral.net.hooks import Destination, Request
    from corral.net.http1 import Message
    from corral.policy import Policy, Secret

PREFIX = b"corral-secret-"
MAX_VALUE = 8 * 1024  # a credential, not a document; it has to fit in a header
WRONG_HOST = "secret-wrong-host"
# bytes a value keeps when it goes into a path or a query; the rest is percent-encoded
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


class Loaded:
    """One secret with its real value, in the proxy only.  Its repr never shows
    the value (an exception or a debugger printing it must not leak it)."""

    __slots__ = ("encoded", "header", "header_value", "hosts", "name", "placeholder", "value")

    def __init__(self, secret: Secret, value: bytes) -> None:
        self.name = secret.name
        self.placeholder = secret.placeholder.encode()
        self.value = value
        self.encoded = _percent_encode(value)  # the form that goes into a path or query
        self.hosts = [Rule(h) for h in secret.hosts]
        self.header = secret.header.encode()
        self.header_value = secret.format.encode().replace(b"{value}", value)

    def allowed_to(self, host: str, port: int) -> bool:
        return any(rule.matches(host, port) for rule in self.hosts)

    def __repr__(self) -> str:
        return f"<secret {self.name}>"


def _percent_encode(value: bytes) -> bytes:
    return b"".join(bytes([b]) if b in _UNRESERVED else b"%%%02X" % b for b in value)


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


def _decoded_target(target: bytes) -> bytes:
    """The target with percent-escapes decoded (leniently: only to look for
    placeholders, never to send)."""
    if b"%" not in target:
        return target
    out = bytearray()
    parts = target.split(b"%")
    out += parts[0]
    for part in parts[1:]:
        try:
            out.append(int(part[:2], 16))
            out += part[2:]
        except ValueError:
            out += b"%" + part
    return bytes(out)


def _basic(value: bytes) -> bytes | None:
    """The decoded credentials of ``Basic <base64>``, or None."""
    scheme, _, token = value.partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        return base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None


class SecretsHook(Hook):
    name = "secrets"
    connect_by_host_port = True

    def __init__(self, secrets: list[Loaded]) -> None:
        self.secrets = secrets
        self._by_host: dict[tuple[str, int], list[Loaded]] = {}

    @classmethod
    def from_policy(cls, policy: Policy) -> SecretsHook:
        """Read every value now; the first one missing refuses the run."""
        return cls([Loaded(s, read_value(s, policy)) for s in policy.secrets.values()])

    def for_host(self, host: str, port: int) -> list[Loaded]:
        key = (host, port)
        found = self._by_host.get(key)
        if found is None:
            if len(self._by_host) >= 4096:
                self._by_host.clear()
            found = self._by_host[key] = [s for s in self.secrets if s.allowed_to(host, port)]
        return found

    def intercept(self, dest: Destination) -> bool:
        return bool(self.for_host(dest.host, dest.port))

    def on_request(self, request: Request) -> Verdict | None:
        dest = request.dest
        mine = self.for_host(dest.host, dest.port)
        carried = self._carried(request) if self._may_carry(request) else []
        wrong = [s for s in carried if s not in mine]
        if wrong:
            request.secrets = sorted({s.name for s in carried})
            names = ", ".join(s.name for s in wrong)
            return Verdict(False, WRONG_HOST, f"secret {names} may not be sent to {dest.host}")
        used = [s for s in mine if s in carried or s.header]
        if not used:
            return None
        for secret in carried:
            _put_in(request, secret)
        for secret in mine:
            if secret.header:
                head = request.head
                head.headers = [(k, v) for k, v in head.headers if k != secret.header]
                head.headers.append((secret.header, secret.header_value))
        request.secrets = [s.name for s in used]
        request.responses.append(_hider(used))
        return None

    @staticmethod
    def _may_carry(request: Request) -> bool:
        """Cheap: could any placeholder be in this request at all?"""
        if PREFIX in request.target or b"%" in request.target:
            return True
        for key, value in request.head.headers:
            if PREFIX in value or (key == b"authorization" and value[:6].lower() == b"basic "):
                return True
        return False

    def _carried(self, request: Request) -> list[Loaded]:
        """The secrets whose placeholder the request carries, anywhere we look."""
        seen = [_decoded_target(request.target)]
        for key, value in request.head.headers:
            seen.append(value)
            if key == b"authorization":
                decoded = _basic(value)
                if decoded is not None:
                    seen.append(decoded)
        if not any(PREFIX in part for part in seen):
            return []
        return [s for s in self.secrets if any(s.placeholder in part for part in seen)]


def _put_in(request: Request, secret: Loaded) -> None:
    """Replace the placeholder with the value in the target and the headers."""
    request.target = request.target.replace(secret.placeholder, secret.encoded)
    headers = []
    for key, value in request.head.headers:
        if secret.placeholder in value:
            value = value.replace(secret.placeholder, secret.value)
        elif key == b"authorization":
            decoded = _basic(value)
            if decoded is not None and secret.placeholder in decoded:
                credentials = decoded.replace(secret.placeholder, secret.value)
                value = b"Basic " + base64.b64encode(credentials)
        headers.append((key, value))
    request.head.headers = headers


def _hider(used: list[Loaded]) -> Callable[[Message], None]:
    """A response-head rewrite: the values this request carried become placeholders."""
    pairs = []
    for secret in used:
        pairs.append((secret.value, secret.placeholder))
        if secret.encoded != secret.value:
            pairs.append((secret.encoded, secret.placeholder))

    def hide(response: Message) -> None:
        headers = []
        for key, value in response.headers:
            for real, placeholder in pairs:
                if real in value:
                    value = value.replace(real, placeholder)
            decoded = _basic(value) if value[:6].lower() == b"basic " else None
            if decoded is not None and any(real in decoded for real, _ in pairs):
                for real, placeholder in pairs:
                    decoded = decoded.replace(real, placeholder)
                value = b"Basic " + base64.b64encode(decoded)
            headers.append((key, value))
        response.headers = headers

    return hide
