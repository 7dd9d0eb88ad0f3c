"""``corral rules list|check|hash|pull``: guardrail files and the request rules,
seen from the command line (corral.net.guardrails, corral.net.httprules).

Exit codes: 0 done (``check``: the request would be allowed); 1 ``check``: it
would be denied or asked about, ``pull``: refused (a hand-edited file, a
source that cannot be fetched); 2 bad command line, policy or guardrail file.
A module of its own so that ``corral run`` never loads it."""

from __future__ import annotations

import os

from corral.errors import CorralError, PolicyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ssl

    from corral.net.guardrails import Guardrail
    from corral.policy import Policy

EXIT_REFUSED_HERE = 1  # check: denied or ask; pull: refused
INDEX_LIMIT = 1 << 20  # an index or a guardrail file larger than 1 MiB is refused
FETCH_TIMEOUT = 30.0


class Refused(CorralError):
    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_REFUSED_HERE)


def run(command: str, opts: dict[str, object], rest: list[str]) -> int:
    from corral.net.guardrails import GuardrailError

    try:
        return _run(command, opts, rest)
    except GuardrailError as exc:  # a malformed or unreadable guardrail: FILE:LINE: what
        raise PolicyError(str(exc)) from None


def _run(command: str, opts: dict[str, object], rest: list[str]) -> int:
    if command == "list":
        return cmd_list(opts, rest)
    if command == "check":
        return cmd_check(opts, rest)
    if command == "hash":
        return cmd_hash(rest)
    return cmd_pull(opts, rest)


def _policy(opts: dict[str, object]) -> Policy:
    from corral import policy as pol

    workspace, path = opts.get("workspace"), opts.get("policy")
    policy = pol.load(str(workspace) if workspace else None, str(path) if path else None)
    pol.check_network(policy)
    return policy


def _dirs(opts: dict[str, object], policy: Policy | None) -> list[str]:
    given = opts.get("dir")
    if isinstance(given, list) and given:
        return [os.path.abspath(d) for d in given]
    return list(policy.guardrails.dirs) if policy is not None else []


# -- list ----------------------------------------------------------------------------


def cmd_list(opts: dict[str, object], rest: list[str]) -> int:
    from corral.net import guardrails

    if rest:
        raise CorralError("usage: corral rules list [--dir DIR]... [--policy FILE]")
    policy = _policy(opts) if not opts.get("dir") else None
    dirs = _dirs(opts, policy)
    if not dirs:
        raise CorralError("no guardrail directories: set [guardrails] dirs or pass --dir DIR")
    table = policy.guardrails.tiers if policy is not None else guardrails.DEFAULT_TIER_ACTIONS
    rows = [("FILE", "TITLE", "TIER", "VERSION", "HASH", "ENFORCES")]
    for directory in dirs:
        for path in guardrails.files_in(directory):
            g = guardrails.read(path)
            rows.append(
                (path, g.title, g.tier or "null", g.version or "-", g.state, _enforces(g, table))
            )
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        cells = [cell.ljust(w) for cell, w in zip(row[:5], widths, strict=True)]
        print("  ".join([*cells, row[5]]))
    return 0


def _enforces(g: Guardrail, table: dict[str, str]) -> str:
    unknown = f" (inert keys: {', '.join(g.unknown)})" if g.unknown else ""
    if not g.enforcing:
        return "not enforcing" + unknown
    parts = [
        g.effective_action(table),
        ",".join(g.methods) if g.methods else "any method",
        ",".join(g.hosts),
        ",".join(g.paths) if g.paths else "any path",
    ]
    return " ".join(parts) + unknown


# -- check ---------------------------------------------------------------------------


def cmd_check(opts: dict[str, object], rest: list[str]) -> int:
    """Which rule decides METHOD URL, and why; nothing is sent, nothing resolved
    but the names ``[network] hosts`` pins."""
    if len(rest) != 2:
        raise CorralError("usage: corral rules check [--policy FILE] METHOD URL")
    method, url = rest
    from corral.net.hooks import Destination, Request, chain_for
    from corral.net.names import BadName

    scheme, host, port, target = _split_url(url)
    policy = _policy(opts)
    if policy.network.mode != "proxy":
        print('decision: deny\nrule: no-network\nreason: network mode is "none"')
        return EXIT_REFUSED_HERE
    chain = chain_for(policy)
    try:
        dest = Destination("check", scheme, host, port)
    except BadName as exc:
        raise CorralError(f"{url}: {exc}") from None
    dest.method, dest.path = method.upper(), target
    verdict = chain.connect(dest)
    pinned = policy.network.hosts.get(dest.host) or (dest.host if _is_address(dest.host) else "")
    if verdict.allowed and pinned:
        verdict = chain.resolved(dest, pinned)
    request = Request(method.upper(), target, [], 0)
    if verdict.allowed and chain.sees_requests:
        verdict = chain.request(dest, request) or verdict
    print(f"decision: {verdict.decision}")
    print(f"rule: {verdict.rule}")
    if verdict.reason:
        print(f"reason: {verdict.reason}")
    if verdict.ask:
        print("ask: a person decides; with nobody to answer, the request is denied")
    guard = request.audit.get("guardrail")
    if isinstance(guard, dict):
        print(
            f"guardrail: {guard['title']} ({guard['file']}; risk {guard['tier'] or 'null'}, "
            f"version {guard['version'] or '-'}, sha256 {guard['hash']}, {guard['hash_state']})"
        )
    if scheme == "https":
        inspected = chain.needs_inspection(dest.host, dest.port)
        print(f"intercepted: {'yes' if inspected else 'no (an opaque tunnel)'}")
    if not pinned and chain.connect(dest).allowed:
        print("note: a name's resolved address is checked when the proxy resolves it")
    if verdict.rule == "default":
        _note_rules_open_nothing(policy, dest.host, dest.port)
    return 0 if verdict.allowed else EXIT_REFUSED_HERE


def _note_rules_open_nothing(policy: Policy, host: str, port: int) -> None:
    """A host refused by the allow list that request rules name: the usual slip is
    expecting the rules to let it through."""
    from corral.net.httprules import HttpRules

    named = HttpRules.from_entries(policy.network.rules).for_host(host, port)
    names = sorted({rule.name for rule in named})
    if names:
        verb = "names" if len(names) == 1 else "name"
        print(
            f"note: {', '.join(names)} {verb} this host, but rules only narrow what "
            "[network] allow lets through: add it there too"
        )


def _is_address(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _split_url(url: str) -> tuple[str, str, int, str]:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise CorralError(f"{url}: not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CorralError(f"{url}: expected an http:// or https:// URL")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80), target


# -- hash ----------------------------------------------------------------------------


def cmd_hash(rest: list[str]) -> int:
    if not rest:
        raise CorralError("usage: corral rules hash FILE...")
    from corral.net import guardrails

    for path in rest:
        text = _read_text(path)
        try:
            updated = guardrails.with_hash(text, path)
        except guardrails.GuardrailError as exc:
            raise PolicyError(str(exc)) from None
        if updated != text:
            _write(path, updated)
        print(f"{path}: content_hash {guardrails.parse(updated, path).hash}")
    return 0


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise CorralError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise PolicyError(f"{path}: not UTF-8") from None


def _write(path: str, text: str) -> None:
    """Replace ``path`` whole (a temporary file renamed over it), keeping its mode."""
    directory = os.path.dirname(os.path.abspath(path))
    temp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode("utf-8"))
        os.replace(temp, path)
    except OSError as exc:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise CorralError(f"{path}: cannot write: {exc.strerror}") from None


# -- pull ----------------------------------------------------------------------------


def cmd_pull(opts: dict[str, object], rest: list[str]) -> int:
    """Copy guardrails from SRC (a directory, or an HTTPS index) into the first
    guardrail directory (or --dir), each with its content_hash marker."""
    if len(rest) != 1:
        raise CorralError("usage: corral rules pull [--dir DIR] [--force] [--ca FILE] SRC")
    from corral.net import guardrails

    source = rest[0]
    dirs = _dirs(opts, None if opts.get("dir") else _policy(opts))
    if not dirs:
        raise CorralError("no guardrail directory to pull into: set [guardrails] dirs or --dir")
    target = dirs[0]
    if source.startswith("https://"):
        fetched = _fetch_index(source, opts.get("ca"))
    elif "://" in source:
        raise CorralError(f"{source}: only a directory or an https:// index can be pulled")
    else:
        fetched = [(os.path.basename(p), _read_text(p)) for p in guardrails.files_in(source)]
    if not fetched:
        print(f"nothing to pull: {source} has no guardrail files")
        return 0
    planned: list[tuple[str, str, str]] = []  # (path, text, what)
    refused: list[str] = []
    for name, text in fetched:
        try:
            rendered = guardrails.with_hash(text, f"{source.rstrip('/')}/{name}")
        except guardrails.GuardrailError as exc:
            raise PolicyError(str(exc)) from None
        path = os.path.join(target, name)
        what = _existing(path, rendered, refused)
        planned.append((path, rendered, what))
    if refused and not opts.get("force"):
        raise Refused(
            "rules pull: refused to overwrite files edited by hand (the body no longer "
            "matches its content_hash, or there is none; --force overwrites): " + ", ".join(refused)
        )
    os.makedirs(target, exist_ok=True)
    for path, rendered, what in planned:
        if what != "unchanged":
            _write(path, rendered)
        print(f"{what}: {path}")
    return 0


def _existing(path: str, rendered: str, refused: list[str]) -> str:
    """What pulling over ``path`` does: new, updated, unchanged; a local file
    edited by hand (or never written by pull, or unreadable) lands in ``refused``."""
    from corral.net import guardrails

    try:
        with open(path, "rb") as fh:
            current = fh.read().decode("utf-8")
    except FileNotFoundError:
        return "new"
    except (OSError, UnicodeDecodeError):
        refused.append(path)
        return "updated"
    if current == rendered:
        return "unchanged"
    try:
        local = guardrails.parse(current, path)
    except guardrails.GuardrailError:
        refused.append(path)
        return "updated"
    if local.state != "clean":
        refused.append(path)
    return "updated"


def _fetch_index(url: str, ca: object) -> list[tuple[str, str]]:
    """An HTTPS index: a JSON array of file URLs (absolute, or relative to the
    index), each an https:// URL whose last segment is a ``NAME.md``."""
    import json
    from urllib.parse import unquote, urljoin, urlsplit

    context = _tls_context(ca)
    try:
        entries = json.loads(_get(url, context))
    except ValueError:
        raise Refused(f"{url}: the index is not JSON (expected an array of file URLs)") from None
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise Refused(f"{url}: the index must be a JSON array of file URLs")
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for entry in entries:
        file_url = urljoin(url, entry)
        name = unquote(urlsplit(file_url).path.rpartition("/")[2])
        if not file_url.startswith("https://"):
            raise Refused(f"{url}: {entry}: only https:// files are pulled")
        if not name.endswith(".md") or name.startswith(".") or "/" in name or "\\" in name:
            raise Refused(f"{url}: {entry}: not a NAME.md file")
        if name in seen:
            raise Refused(f"{url}: {name} is listed twice")
        seen.add(name)
        try:
            out.append((name, _get(file_url, context).decode("utf-8")))
        except UnicodeDecodeError:
            raise PolicyError(f"{file_url}: not UTF-8") from None
    return out


def _tls_context(ca: object) -> ssl.SSLContext:
    import ssl

    context = ssl.create_default_context()  # the host's trust store, names checked
    if isinstance(ca, str):
        try:
            context.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise CorralError(f"--ca {ca}: cannot load: {exc}") from None
    return context


def _https_redirects() -> type:
    import urllib.request

    class HttpsRedirects(urllib.request.HTTPRedirectHandler):
        """Follows redirects to https:// only: an index must not be downgraded."""

        def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
            if not newurl.startswith("https://"):
                raise Refused(f"{req.full_url}: redirected to {newurl}: only https:// is followed")
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    return HttpsRedirects


def _get(url: str, context: ssl.SSLContext) -> bytes:
    import urllib.error
    import urllib.request

    handler = urllib.request.HTTPSHandler(context=context)
    opener = urllib.request.build_opener(handler, _https_redirects())
    try:
        with opener.open(url, timeout=FETCH_TIMEOUT) as response:
            data: bytes = response.read(INDEX_LIMIT + 1)
    except urllib.error.HTTPError as exc:
        raise Refused(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Refused(f"{url}: cannot fetch: {reason}") from None
    if len(data) > INDEX_LIMIT:
        raise Refused(f"{url}: larger than {INDEX_LIMIT >> 20} MiB")
    return data
