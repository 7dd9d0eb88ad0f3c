"""What a sandbox gets from its door beyond the address: trust in corral's CA
(when this run can intercept TLS) and the variables hooks ask for.

The trust is a bundle: the host's system CA bundle followed by corral's CA
certificate, written next to the door for this run (certificates only, never
a key).  Inside, it is at :data:`INSIDE_BUNDLE` and the usual variables
(:data:`TRUST_VARIABLES`) name it; where a tier can mount (namespace,
container, gvisor), it also covers the distribution bundle paths
(:data:`SYSTEM_BUNDLES`), so tools that ignore the variables trust it too.  The
landlock tier cannot mount: there the variables name the host file, which the
tier grants read access to, and tools that read only the system bundle do not
trust corral's CA.

Pure, apart from :func:`system_bundles` and :func:`write_bundle` (host facts
and the one file), so tier plans stay unit-testable.
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from corral.fsplan import Mount

INSIDE_BUNDLE = "/run/corral/ca-bundle.pem"
# The user's CA (key and certificate, 0600) and its certificate alone (0644), under
# corral's state directory, which every tier masks (corral.net.ca makes them).
USER_CA = os.path.join("ca", "corral-ca.pem")
USER_CA_CERT = os.path.join("ca", "corral-ca.crt")
BUNDLE_NAME = "ca-bundle.pem"
PEM_MAX = 16 << 20  # a certificate file larger than this is no CA file
# Where distributions keep the bundle most TLS libraries read (OpenSSL's default
# file, Go, curl, Python's ssl, Node with --use-openssl-ca, rustls-native-certs).
SYSTEM_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Alpine, Arch, Gentoo
    "/etc/pki/tls/certs/ca-bundle.crt",  # Fedora, RHEL, CentOS
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",  # Fedora, RHEL (the real file)
    "/etc/ssl/ca-bundle.pem",  # openSUSE
    "/etc/ssl/cert.pem",  # Alpine, Arch, the BSDs' layout
)
# Caller's variables naming a directory of hashed certificates, not a bundle: passed
# as they are (OpenSSL reads SSL_CERT_FILE's bundle too).
CA_DIR_VARIABLES = ("SSL_CERT_DIR", "GIT_SSL_CAPATH")
HEX = frozenset("0123456789abcdef")
NAMED_BUNDLE_MAX = 8 << 20  # a system bundle is some 200 KB
PEM_BEGIN = b"-----BEGIN CERTIFICATE-----"
PEM_END = b"-----END CERTIFICATE-----"
TRUST_VARIABLES = (
    "SSL_CERT_FILE",  # OpenSSL, Python's ssl, Go, Ruby, rustls-native-certs
    "REQUESTS_CA_BUNDLE",  # Python requests
    "CURL_CA_BUNDLE",  # curl, and Python requests too
    "NODE_EXTRA_CA_CERTS",  # Node (added to its own roots)
    "PIP_CERT",  # pip
    "GIT_SSL_CAINFO",  # git over HTTPS
    "AWS_CA_BUNDLE",  # the AWS CLI and SDKs
)


class NetExtras:
    """Per run: the host path of the CA bundle (None: this run never intercepts),
    the system bundle paths that exist on the host, and hooks' variables."""

    __slots__ = ("ca_bundle", "env", "system_bundles")

    def __init__(
        self,
        ca_bundle: str | None = None,
        system_bundles: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.ca_bundle = ca_bundle
        self.system_bundles = system_bundles
        self.env = env or {}


def system_bundles(exists: Callable[[str], bool] = os.path.isfile) -> tuple[str, ...]:
    """The distribution bundle paths this host has (a host fact for the plans)."""
    return tuple(p for p in SYSTEM_BUNDLES if exists(p))


def bundle_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The CA bundle variables the sandbox would get from ``environ`` (passed by
    default: corral.defaults.CA_ENV) that name a file, not a directory."""
    from corral.defaults import CA_ENV

    return {
        name: environ[name]
        for name in CA_ENV
        if name not in CA_DIR_VARIABLES and environ.get(name, "").startswith("/")
    }


def write_bundle(
    directory: str,
    ca_pem: bytes,
    found: tuple[str, ...],
    named: tuple[str, ...] = (),
    out_of_bounds: tuple[str, ...] = (),
) -> str:
    """The host's system bundle (the first of ``found``), the certificates of the
    bundles ``named`` by the caller's variables (a company's CA: see
    :func:`sandbox_env`), then corral's CA, as a world-readable file in
    ``directory``; returns its path.  A named file that is, once opened, under
    one of ``out_of_bounds`` (what a sandbox can write, what the policy keeps
    unreadable, corral's own state) adds nothing.  The system part is copied
    inside the kernel (some 200 KB on every intercepting run)."""
    path = os.path.join(directory, BUNDLE_NAME)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        system, last = _copy_first(fd, found)
        tail = b"" if last == b"\n" else b"\n"
        for other in named:
            if system is None or not _same_file(other, system):
                tail += _certificates(other, out_of_bounds)
        note = b"# corral: the CA that signs intercepted connections\n"
        os.write(fd, tail + note + ca_pem)
    finally:
        os.close(fd)
    os.chmod(path, 0o644)  # whatever the umask: the sandbox reads it as the caller
    return path


def _copy_first(fd: int, found: tuple[str, ...]) -> tuple[str | None, bytes]:
    """Copy the first readable of ``found`` to ``fd``: its path and last byte."""
    for system in found:
        try:
            src = os.open(system, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            size = os.fstat(src).st_size
            copied = 0
            while copied < size:
                sent = os.sendfile(fd, src, copied, size - copied)
                if not sent:
                    break
                copied += sent
            return system, os.pread(src, 1, size - 1) if size else b"\n"
        finally:
            os.close(src)
    return None, b"\n"


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _certificates(path: str, out_of_bounds: tuple[str, ...] = ()) -> bytes:
    """The certificates of ``path``, each parsed and written anew, and nothing else:
    whatever else the file holds (a key, text between the markers) never
    reaches the sandbox.  Empty if it cannot be read, is not a regular file, or
    is, once opened (links followed), under one of ``out_of_bounds``: a sandbox
    linked a bundle in the workspace to a masked file and to corral's audit
    log, and read them in the next run's bundle (found by attacking corral).
    Read at most NAMED_BUNDLE_MAX bytes."""
    from corral.paths import inside

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        import stat

        real = os.readlink(f"/proc/self/fd/{fd}")  # what was opened, whatever the path
        if any(inside(real, root) for root in out_of_bounds):
            return b""
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device: nothing
            return b""
        data = os.read(fd, NAMED_BUNDLE_MAX)
    except OSError:
        return b""
    finally:
        os.close(fd)
    return _reencoded(data)


def _reencoded(data: bytes) -> bytes:
    """Each PEM block of ``data`` that parses as an X.509 certificate, re-encoded."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    out = []
    for piece in data.split(PEM_BEGIN)[1:]:
        end = piece.find(PEM_END)
        if end < 0:
            continue
        try:
            cert = x509.load_pem_x509_certificate(PEM_BEGIN + piece[: end + len(PEM_END)])
        except ValueError:
            continue
        out.append(cert.public_bytes(Encoding.PEM))
    return b"".join(out)


class UpstreamTrust:
    """What the proxy trusts for origins, read once in corral's process before
    the sandbox starts (the workers get it by fork): the ``[tls] upstream_ca``
    files' certificates, and those of an ``SSL_CERT_FILE`` corral was started
    with (which replaces the host's store, as OpenSSL has it).  Read later, in a
    worker, a file the sandbox could write was rewritten with its own CA during
    the run, and the proxy then trusted an origin it should refuse (found by
    attacking corral)."""

    __slots__ = ("extra", "store")

    def __init__(self, extra: list[str], store: str | None) -> None:
        self.extra = extra  # PEM text of each upstream_ca file
        self.store = store  # PEM text of SSL_CERT_FILE, or None: the host's own store


def read_pem(path: str, out_of_bounds: tuple[str, ...] = ()) -> str:
    """A certificate file's text: a plain file only (never waited on: a FIFO there
    hung every run), read once, and one no sandboxed run could have written: not
    under ``out_of_bounds`` once opened (links followed), nor changed in a run's
    writable places while it lived (corral.liveruns, on what was read).
    OSError or ValueError says why not."""
    from corral import liveruns
    from corral.paths import inside

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")  # what was opened, whatever the path
        if any(inside(real, root) for root in out_of_bounds):
            raise ValueError(f"{real} lies where the sandbox can write, or cannot read")
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a plain file")
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
            if sum(map(len, chunks)) > PEM_MAX:
                raise ValueError(f"larger than {PEM_MAX >> 20} MiB")
    finally:
        os.close(fd)
    planted = liveruns.planted_by(path, st.st_ctime_ns)
    if planted is not None:
        raise ValueError(liveruns.refusal(path, *planted, True, pinned=False))
    return b"".join(chunks).decode("ascii", "replace")


def upstream_trust(
    paths: list[str],
    environ: Mapping[str, str] | None = None,
    out_of_bounds: tuple[str, ...] = (),
) -> UpstreamTrust:
    """The origins' trust, read now; PolicyError naming the file that cannot be
    used.  ``out_of_bounds``: where an ``SSL_CERT_FILE`` is not taken from (what
    the sandbox can write: a run rewrote a company bundle kept in the workspace,
    and the next run's proxy trusted its origin; found by attacking corral)."""
    import ssl

    from corral.errors import PolicyError

    extra = []
    for path in paths:
        try:
            text = read_pem(path)
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=text)
        except (ssl.SSLError, OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            why = f"tls.upstream_ca: {path} holds no PEM CA certificate ({why})"
            raise PolicyError(why) from None
        extra.append(text)
    env = os.environ if environ is None else environ
    store = None
    if env.get("SSL_CERT_FILE"):
        try:
            store = read_pem(env["SSL_CERT_FILE"], out_of_bounds)
        except (OSError, ValueError) as exc:
            why = (
                f"SSL_CERT_FILE: cannot use {env['SSL_CERT_FILE']} to check origins: {exc} "
                "(keep it outside the workspace, or name it in [tls] upstream_ca)"
            )
            raise PolicyError(why) from None
    if store is None and env.get("SSL_CERT_DIR"):
        for directory in filter(None, env["SSL_CERT_DIR"].split(":")):
            refused = cert_dir_refusal(directory, out_of_bounds)
            if refused:
                raise PolicyError(
                    f"SSL_CERT_DIR: cannot use {directory} to check origins: {refused} (keep it "
                    "outside the workspace, or name its CA files in [tls] upstream_ca)"
                )
    return UpstreamTrust(extra, store)


def cert_dir_refusal(directory: str, out_of_bounds: tuple[str, ...]) -> str | None:
    """Why an ``SSL_CERT_DIR`` directory cannot be trusted for origins, or None.
    OpenSSL reads such a directory when it verifies a certificate, not when the
    proxy starts: a CA the sandbox put there during the run was trusted (found
    by attacking corral).  So the directory, and what each certificate entry
    leads to, must lie outside what the sandbox can write, and no run may have
    added to it.  (Only the host's own store, no SSL_CERT_FILE, reads it.)"""
    from corral import liveruns

    roots = frozenset(out_of_bounds)
    found = [os.path.realpath(directory)]
    try:
        changed: int | None = os.stat(directory).st_ctime_ns
        with os.scandir(directory) as entries:
            found += [_leads_to(e.path) for e in entries if _hashed_name(e.name)]
    except OSError:
        changed = None  # (missing: OpenSSL skips it; made later, it is under a root or not)
    for real in found:
        if _under(real, roots):
            return f"{real} lies where the sandbox can write, or cannot read"
    planted = liveruns.planted_by(directory, changed) if changed is not None else None
    if planted is not None:
        return liveruns.refusal(directory, *planted, True, pinned=False)
    return None


def _hashed_name(name: str) -> bool:
    """A name OpenSSL looks up in a certificate directory: HASH.N or HASH.rN."""
    head, dot, tail = name.partition(".")
    tail = tail[1:] if tail.startswith("r") else tail
    return len(head) == 8 and bool(dot) and tail.isdigit() and all(c in HEX for c in head)


def _leads_to(path: str) -> str:
    """What ``path`` names once every link is followed, resolved by the kernel
    (os.path.realpath took 24 ms for /etc/ssl/certs' 290 links); a dangling
    link's target, which could be made later, as realpath has it."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return os.path.realpath(path)
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def _under(path: str, roots: frozenset[str]) -> bool:
    """Is ``path`` one of ``roots`` or inside one (all of them resolved)?"""
    while path not in roots:
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent
    return True


def trust_env(bundle: str) -> dict[str, str]:
    return dict.fromkeys(TRUST_VARIABLES, bundle)


def trust_mounts(extras: NetExtras) -> list[Mount]:
    """Read-only binds of the bundle: at INSIDE_BUNDLE and over each system path."""
    from corral.fsplan import Mount

    if extras.ca_bundle is None:
        return []
    why = "corral's CA with the system's (TLS inspection)"
    return [
        Mount("ro-bind", dest, extras.ca_bundle, why)
        for dest in (INSIDE_BUNDLE, *extras.system_bundles)
    ]


def sandbox_env(
    extras: NetExtras | None, env: dict[str, str], bundle: str, keep: Iterable[str] = ()
) -> dict[str, str]:
    """A plan's environment with the trust variables and hooks' variables (which
    win over everything: a secret's placeholder must never give way to a real
    value passed in).

    With TLS inspection, every CA bundle variable names corral's bundle, also
    one passed in from the caller (corral.defaults.CA_ENV): that one's
    certificates are in the bundle (:func:`write_bundle`), and its own file
    would not trust corral's CA, so every inspected host would fail.  Only a
    value the policy sets itself (``keep``: ``[env]``, ``--env NAME=VALUE``)
    wins over corral's."""
    if extras is None:
        return env
    trust = {}
    if extras.ca_bundle is not None:
        trust = trust_env(bundle)
        trust.update((name, bundle) for name in bundle_variables(env))
    kept = {name: env[name] for name in keep if name in env}
    return {**env, **trust, **kept, **extras.env}
