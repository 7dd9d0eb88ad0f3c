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
import os

from corral.errors import RefusedError
from corral.net.hooks import Hook
from corral.net.httprules import covers
from corral.net.rules import Rule, Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.net.hooks import Destination, Request, Response
    from corral.policy import Policy, Secret

PREFIX = b"corral-secret-"
PREFIX_TEXT = PREFIX.decode()
MAX_VALUE = 8 * 1024  # a credential, not a document; it has to fit in a header
WRONG_HOST = "secret-wrong-host"
# bytes a value keeps when it goes into a path or a query; the rest is percent-encoded
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def new_placeholder(name: str) -> str:
    """What the sandbox holds under ``name``: 128 random bits, new for each run."""
    return f"corral-secret-{name}-{os.urandom(16).hex()}"


class Loaded:
    """One secret with its real value, in corral's process and the proxy only.
    Its repr never shows the value (an exception or a debugger printing it must
    not leak it)."""

    __slots__ = ("encoded", "header", "header_value", "hosts", "name", "placeholder", "value")

    def __init__(self, secret: Secret, value: bytes, placeholder: str) -> None:
        self.name = secret.name
        self.placeholder = placeholder.encode()
        self.value = value
        self.encoded = _percent_encode(value)  # the form that goes into a path or query
        self.hosts = [Rule(h) for h in secret.hosts]
        self.header = secret.header.encode()
        self.header_value = secret.format.encode().replace(b"{value}", value)

    def allowed_to(self, host: str, port: int) -> bool:
        return any(covers(rule, host, port) for rule in self.hosts)

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
    """The decoded credentials of ``Basic <base64>``, or None."""
    scheme, _, token = value.partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        return base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None


class SecretsHook(Hook):
    """``[secrets]`` in the chain: refuses a placeholder bound for the wrong host
    (on_request), puts the real values in (rewrite), hides echoed values
    (on_response)."""

    name = "secrets"
    connect_by_host_port = True

    def __init__(self, policy: Policy) -> None:
        self.policy = policy  # nothing is read here: see open()
        self.secrets: list[Loaded] = []
        self._by_host: dict[tuple[str, int], _HostPlan] = {}

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
        self._by_host.clear()

    def sandbox_env(self) -> dict[str, str]:
        return {s.name: s.placeholder.decode() for s in self.secrets}

    def for_host(self, host: str, port: int) -> _HostPlan:
        key = (host, port)
        found = self._by_host.get(key)
        if found is None:
            if len(self._by_host) >= 4096:
                self._by_host.clear()
            found = self._by_host[key] = _HostPlan(
                [s for s in self.secrets if s.allowed_to(host, port)]
            )
        return found

    def on_request(self, dest: Destination, request: Request) -> Verdict | None:
        plan = self._by_host.get((dest.host, dest.port)) or self.for_host(dest.host, dest.port)
        carried = self._carried(request)
        if not carried:  # the usual case
            if plan.header_names:
                request.audit["secrets"] = plan.header_names
            return None
        wrong = [s for s in carried if id(s) not in plan.ids]
        names = [s.name for s in carried]
        if plan.header_names:
            names = sorted({*names, *plan.header_names})
        request.audit["secrets"] = names
        if not wrong:
            return None
        shown = ", ".join(s.name for s in wrong)
        return Verdict(False, WRONG_HOST, f"secret {shown} may not be sent to {dest.host}")

    def rewrite(self, dest: Destination, request: Request) -> None:
        if "secrets" not in request.audit:
            return  # on_request found nothing to put in
        plan = self.for_host(dest.host, dest.port)
        if PREFIX_TEXT in request.target:
            target = request.target.encode("latin-1")
            for secret in plan.mine:
                target = target.replace(secret.placeholder, secret.encoded)
            request.target = target.decode("latin-1")
        keys = plan.header_keys  # set on every request, whatever the client sent
        headers = [
            (k, _swap(k, v, plan.mine) if PREFIX in v or k == b"authorization" else v)
            for k, v in request.headers
            if k not in keys
        ]
        headers += plan.header_pairs
        request.headers[:] = headers

    def on_response(self, dest: Destination, request: Request, response: Response) -> None:
        if "secrets" not in request.audit:
            return  # no value went out with this request: none can come back
        pairs = self.for_host(dest.host, dest.port).pairs
        blob = b"\n".join(v for _, v in response.headers)  # one scan in C for the usual case
        if b"asic " in blob or any(real in blob for real, _ in pairs):
            response.headers[:] = [(k, _hide(v, pairs)) for k, v in response.headers]

    def _carried(self, request: Request) -> list[Loaded]:
        """The secrets whose placeholder the request carries anywhere we look:
        the target (percent-decoded too), header values, Basic credentials."""
        seen: list[bytes] = []
        if PREFIX_TEXT in request.target or "%" in request.target:
            target = request.target.encode("latin-1")
            seen += (target, _decoded(target))
        blob = b"\n".join([v for _, v in request.headers])  # one scan in C, usually all
        if PREFIX in blob:
            seen.append(blob)
        if b"asic " in blob:  # Basic credentials hide a placeholder in base64
            for key, value in request.headers:
                if key == b"authorization":
                    decoded = _basic(value)
                    if decoded is not None:
                        seen.append(decoded)
        found = []
        for part in seen:
            if PREFIX in part:
                for secret in self.secrets:
                    if secret.placeholder in part and secret not in found:
                        found.append(secret)
        return found


class _HostPlan:
    """What a destination's requests need of the secrets, worked out once per host."""

    __slots__ = ("header_keys", "header_names", "header_pairs", "ids", "mine", "pairs")

    def __init__(self, mine: list[Loaded]) -> None:
        self.mine = mine  # the secrets that may go there
        self.ids = frozenset(id(s) for s in mine)
        with_header = [s for s in mine if s.header]
        self.header_names = sorted({s.name for s in with_header})
        self.header_keys = frozenset(s.header for s in with_header)
        self.header_pairs = [(s.header, s.header_value) for s in with_header]
        # (real form, placeholder): what an echo in a response is turned back into
        self.pairs = [(s.value, s.placeholder) for s in mine]
        self.pairs += [(s.encoded, s.placeholder) for s in mine if s.encoded != s.value]


def _swap(key: bytes, value: bytes, secrets: list[Loaded]) -> bytes:
    """A header value with the placeholders of ``secrets`` replaced by their values."""
    for secret in secrets:
        if secret.placeholder in value:
            value = value.replace(secret.placeholder, secret.value)
    if key == b"authorization":
        decoded = _basic(value)
        if decoded is not None and PREFIX in decoded:
            for secret in secrets:
                decoded = decoded.replace(secret.placeholder, secret.value)
            value = b"Basic " + base64.b64encode(decoded)
    return value


def _hide(value: bytes, pairs: list[tuple[bytes, bytes]]) -> bytes:
    """A response header value with any real value (raw, as it went into a path, or
    inside Basic credentials) replaced by its placeholder."""
    for real, placeholder in pairs:
        if real in value:
            value = value.replace(real, placeholder)
    if value[:1] in (b"B", b"b"):
        decoded = _basic(value)
        if decoded is not None and any(real in decoded for real, _ in pairs):
            for real, placeholder in pairs:
                decoded = decoded.replace(real, placeholder)
            value = b"Basic " + base64.b64encode(decoded)
    return value
